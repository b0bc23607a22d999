//! `charly bundle` end to end on the example project, against a rooted
//! directory: kill -9 in the middle of a step, then `status` and `del`;
//! a failing step; `--help` says where the ledger lives.

use assert_cmd::Command;
use charly_testutil as project_copy;
use project_copy::example;
use std::path::PathBuf;
use std::time::{Duration, Instant};

struct World {
    _t: tempfile::TempDir,
    cache: PathBuf,
    root: PathBuf,
    project: PathBuf,
}

impl World {
    fn new() -> World {
        let t = tempfile::tempdir().expect("tmp");
        let cache = t.path().join("cache");
        let root = t.path().join("root");
        std::fs::create_dir_all(root.join("etc")).expect("root");
        std::fs::write(root.join("etc/hostname"), "target\n").expect("hostname");
        let project = t.path().join("project");
        project_copy::copy_project(&example(), &project);
        let w = World {
            _t: t,
            cache,
            root,
            project,
        };
        // The store, filled as `box build` fills it (fake runner: no podman).
        let out = w
            .cmd()
            .args([
                "box",
                "build",
                "hello",
                "--runner",
                "fake",
                "--dev-local-pkg",
                "-q",
            ])
            .output()
            .expect("build");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        w
    }

    fn cmd(&self) -> Command {
        let mut c = Command::cargo_bin("charly").expect("binary");
        c.env("NO_COLOR", "1")
            .env("CHARLY_CACHE_DIR", &self.cache)
            .env_remove("CHARLY_TEST_BLOCK_AT_STEP")
            .arg("-C")
            .arg(&self.project);
        c
    }

    fn add_args(&self, name: &str) -> Vec<String> {
        [
            "bundle",
            "add",
            name,
            "hello",
            "--target",
            "local",
            "--root",
            self.root.to_str().expect("utf8"),
            "--runner",
            "fake",
            "--dev-local-pkg",
            "--yes",
        ]
        .map(String::from)
        .to_vec()
    }
}

use charly_testutil::tree_with_modes as tree;

fn json(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
fn kill_9_mid_step_then_status_explains_and_del_cleans() {
    let w = World::new();
    let before = tree(&w.root);
    // Which step of the merged plan writes the motd (per-candy plans, concatenated).
    let out = w
        .cmd()
        .args(["box", "plan", "hello", "--target", "local", "--json"])
        .output()
        .expect("plan");
    let plan = json(&out);
    let steps: Vec<&serde_json::Value> = plan["plans"]
        .as_array()
        .expect("plans")
        .iter()
        .flat_map(|p| p["steps"].as_array().expect("steps").iter())
        .collect();
    let seq = steps
        .iter()
        .position(|s| s["path"] == "/opt/hello/motd.txt")
        .expect("motd step") as u64;

    let bin = assert_cmd::cargo::cargo_bin("charly");
    let mut child = std::process::Command::new(bin)
        .env("NO_COLOR", "1")
        .env("CHARLY_CACHE_DIR", &w.cache)
        .env("CHARLY_TEST_BLOCK_AT_STEP", seq.to_string())
        .arg("-C")
        .arg(&w.project)
        .args(w.add_args("k"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    let motd = w.root.join("opt/hello/motd.txt");
    let t = Instant::now();
    while !motd.exists() {
        assert!(t.elapsed() < Duration::from_secs(120), "the step never ran");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The step has made its change and blocks: SIGKILL, no chance to clean up.
    child.kill().expect("kill -9");
    let _ = child.wait();

    let out = w
        .cmd()
        .args(["bundle", "status", "k", "--json"])
        .output()
        .expect("status");
    assert_eq!(out.status.code(), Some(3), "drift → exit 3");
    let st = json(&out);
    assert_eq!(st["state"], "applying");
    assert_eq!(st["running"], false);
    let drift = st["drift"].as_array().expect("drift");
    assert!(
        drift.iter().any(|d| d["seq"].as_u64() == Some(seq)
            && d["detail"]
                .as_str()
                .is_some_and(|x| x.contains("incomplete"))
            && d["subject"].as_str().is_some_and(|x| x.contains("motd"))),
        "{st}"
    );
    assert!(drift.iter().any(|d| {
        d["detail"]
            .as_str()
            .is_some_and(|x| x.contains("interrupted"))
    }));
    let out = w
        .cmd()
        .args(["bundle", "list", "--json"])
        .output()
        .expect("list");
    let l = json(&out);
    assert_eq!(l[0]["name"], "k");
    assert_eq!(l[0]["state"], "applying");

    let out = w.cmd().args(["bundle", "del", "k"]).output().expect("del");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        tree(&w.root),
        before,
        "del reverses the completed steps and the incomplete one"
    );
    let out = w
        .cmd()
        .args(["bundle", "list", "--json"])
        .output()
        .expect("list");
    assert_eq!(json(&out), serde_json::json!([]));
}

#[test]
fn a_failing_step_stops_with_its_name_and_del_cleans() {
    let w = World::new();
    let before = tree(&w.root);
    // The npm builder artifact is gone from the store (its blob file
    // deleted behind the store's back): the npm step fails.
    let store = charly_cache::Store::open(&w.cache).expect("store");
    let (_, rec) = store
        .last_record_for("builder-stage:cowsay/npm@node-builder")
        .expect("read")
        .expect("the npm stage was built");
    for o in rec.outputs.values() {
        let hex = o.digest.to_hex();
        std::fs::remove_file(w.cache.join("blobs").join(&hex[..2]).join(&hex)).expect("rm blob");
    }
    drop(store);
    let out = w.cmd().args(w.add_args("f")).output().expect("add");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("npm builder artifact") && err.contains("failed"),
        "{err}"
    );
    assert!(err.contains("not attempted"), "{err}");
    let out = w
        .cmd()
        .args([
            "bundle", "add", "f2", "hello", "--target", "local", "--root",
        ])
        .arg(&w.root)
        .args(["--runner", "fake", "--dev-local-pkg"])
        .output()
        .expect("dup");
    assert_eq!(
        out.status.code(),
        Some(1),
        "same deploy on the same target refused"
    );
    let out = w
        .cmd()
        .args(["bundle", "status", "f", "--json"])
        .output()
        .expect("status");
    let st = json(&out);
    assert_eq!(st["state"], "failed");
    let out = w
        .cmd()
        .args(["bundle", "del", "f", "--json"])
        .output()
        .expect("del");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(tree(&w.root), before);
    let out = w
        .cmd()
        .args(["bundle", "status", "f"])
        .output()
        .expect("status");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no bundle named `f`"));
}

#[test]
fn help_says_where_the_ledger_lives() {
    let out = Command::cargo_bin("charly")
        .expect("bin")
        .args(["bundle", "add", "--help"])
        .output()
        .expect("help");
    let h = String::from_utf8_lossy(&out.stdout);
    assert!(
        h.contains("deploy/ledger.sqlite") && h.contains("--allow-root-tasks"),
        "{h}"
    );
}

/// Runs a validator from `.ci/install-validators` when its variable is set.
/// A real validator named by `var` (`.ci/install-validators` prints them);
/// under CI (or with CHARLY_REQUIRE_VALIDATORS=1) its absence is a failure.
fn validator(var: &str) -> Option<PathBuf> {
    let v = std::env::var_os(var).map(PathBuf::from);
    let required = charly_testutil::under_ci()
        || std::env::var("CHARLY_REQUIRE_VALIDATORS").as_deref() == Ok("1");
    assert!(
        v.is_some() || !required,
        "{var} is required (under CI, or with CHARLY_REQUIRE_VALIDATORS=1): run .ci/install-validators"
    );
    v
}

#[test]
fn pod_writes_the_quadlet_unit_and_del_removes_it() {
    let w = World::new();
    let before = tree(&w.root);
    let root = w.root.to_str().expect("utf8");
    let out = w
        .cmd()
        .args([
            "bundle", "add", "p", "hello", "--target", "pod", "--root", root, "--system", "--yes",
            "--json",
        ])
        .output()
        .expect("add");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rep = json(&out);
    let steps = rep["steps"].as_array().expect("steps");
    assert_eq!(steps[0]["state"], "complete");
    // Starting the service would touch the real system: skipped with a reason.
    assert_eq!(steps[1]["state"], "skipped");
    assert!(steps[1]["note"].as_str().unwrap_or("").contains("rooted"));
    let unit = w.root.join("etc/containers/systemd/charly-hello.container");
    let text = std::fs::read_to_string(&unit).expect("unit written");
    for line in [
        "[Container]",
        "Image=localhost/hello:2026.12.1",
        "ContainerName=charly-hello",
        "User=1000",
        "PublishPort=8080:8080",
        "Label=ai.opencharly.box=hello",
        "PodmanArgs=--entrypoint=supervisord",
        "Exec=-n -c /etc/supervisord.conf",
        "WantedBy=default.target",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
    }
    if let Some(q) = validator("CHARLY_QUADLET") {
        let dir = tempfile::tempdir().expect("tmp");
        let o = std::process::Command::new(q)
            .arg("-dryrun")
            .env("QUADLET_UNIT_DIRS", unit.parent().expect("dir"))
            .current_dir(dir.path())
            .output()
            .expect("quadlet");
        let units = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success() && units.contains("podman run"),
            "quadlet: {units}\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let out = w
        .cmd()
        .args(["bundle", "status", "p"])
        .output()
        .expect("status");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(&unit, "tampered\n").expect("tamper");
    let out = w
        .cmd()
        .args(["bundle", "status", "p", "--json"])
        .output()
        .expect("status");
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(json(&out)["drift"][0]["kind"], "disk");
    // The changed unit is only removed with --force (without, it is kept
    // and named: deploy/tests/deploy.rs).
    let out = w
        .cmd()
        .args(["bundle", "del", "p", "--force"])
        .output()
        .expect("del");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(tree(&w.root), before);
}

#[test]
fn k8s_writes_the_kustomize_tree_and_del_removes_it() {
    let w = World::new();
    let base = w.root.join("work");
    std::fs::create_dir(&base).expect("dir");
    let before = tree(&w.root);
    let out_dir = base.join("k8s/hello");
    let out = w
        .cmd()
        .args(["bundle", "add", "k", "hello", "--target", "k8s", "--out"])
        .arg(&out_dir)
        .output()
        .expect("add");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let files: Vec<String> = walkdir::WalkDir::new(&out_dir)
        .sort_by_file_name()
        .into_iter()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_file())
        .map(|e| {
            e.path()
                .strip_prefix(&out_dir)
                .expect("below")
                .display()
                .to_string()
        })
        .collect();
    assert_eq!(
        files,
        [
            "base/deployment.yaml",
            "base/kustomization.yaml",
            "base/service.yaml",
            "overlays/default/kustomization.yaml"
        ]
    );
    let dep = std::fs::read_to_string(out_dir.join("base/deployment.yaml")).expect("read");
    for want in [
        "kind: Deployment",
        "name: charly-hello",
        "image: \"localhost/hello:2026.12.1\"",
        "runAsUser: 1000",
        "containerPort: 8080",
    ] {
        assert!(dep.contains(want), "{want} missing:\n{dep}");
    }
    let k = std::fs::read_to_string(out_dir.join("base/kustomization.yaml")).expect("read");
    assert!(
        k.contains("- deployment.yaml") && k.contains("- service.yaml"),
        "{k}"
    );
    if let Some(kz) = validator("CHARLY_KUSTOMIZE") {
        let o = std::process::Command::new(kz)
            .arg("build")
            .arg(out_dir.join("overlays/default"))
            .output()
            .expect("kustomize");
        assert!(
            o.status.success(),
            "kustomize build: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let out = w
        .cmd()
        .args(["bundle", "status", "k"])
        .output()
        .expect("status");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // --root makes no sense for k8s: refused, clearly.
    let out = w
        .cmd()
        .args([
            "bundle", "add", "k2", "hello", "--target", "k8s", "--root", "/tmp",
        ])
        .output()
        .expect("add");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--root is for"));
    let out = w.cmd().args(["bundle", "del", "k"]).output().expect("del");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(tree(&w.root), before);
}

/// Small things a new user meets: a dry run into a directory that does not
/// exist yet previews it and creates nothing; `bundle status` outside the
/// project compares with the project the bundle was added from, and when
/// that is gone says that only the disk was compared, never that the
/// configuration matches.
#[test]
fn dry_run_into_a_new_root_and_status_outside_the_project() {
    let w = World::new();
    let fresh = w.root.join("new/deeper");
    let mut args = w.add_args("n");
    let at = args.iter().position(|a| a == "--root").expect("--root") + 1;
    args[at] = fresh.display().to_string();
    args.push("--dry-run".into());
    let out = w.cmd().args(&args).output().expect("add --dry-run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!w.root.join("new").exists(), "a dry run created the root");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("motd.txt"), "{said}");

    let out = w.cmd().args(w.add_args("s")).output().expect("add");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let elsewhere = tempfile::tempdir().expect("tmp");
    let status = || {
        let out = Command::cargo_bin("charly")
            .expect("binary")
            .env("NO_COLOR", "1")
            .env("CHARLY_CACHE_DIR", &w.cache)
            .env_remove("CHARLY_PROJECT_DIR")
            .current_dir(elsewhere.path())
            .args(["bundle", "status", "s"])
            .output()
            .expect("status");
        let said = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{said}");
        said
    };
    let said = status();
    assert!(
        said.contains("clean: disk and configuration match"),
        "{said}"
    );
    // The project moved away: only the disk is compared, and it says so.
    std::fs::rename(&w.project, w.project.with_extension("moved")).expect("move");
    let said = status();
    assert!(
        said.contains(
            "clean: the disk matches the ledger (configuration not compared: no project here"
        ),
        "{said}"
    );
    assert!(!said.contains("disk and configuration match"), "{said}");
    std::fs::rename(w.project.with_extension("moved"), &w.project).expect("back");
}

/// A target that runs another distro than the box is made for is refused
/// before any change, naming both and the candies that keep it from
/// installing there (the example's local .deb); `bundle list` stays empty.
#[test]
fn a_host_of_another_distro_is_refused_before_any_change() {
    let w = World::new();
    std::fs::write(
        w.root.join("etc/os-release"),
        "NAME=\"Fedora Linux\"\nID=fedora\nVERSION_ID=43\n",
    )
    .expect("os-release");
    let before = tree(&w.root);
    let out = w.cmd().args(w.add_args("f")).output().expect("add");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("made for debian (deb packages)")
            && said.contains("fedora 43 (rpm packages)")
            && said.contains("hello-deb"),
        "{said}"
    );
    assert_eq!(tree(&w.root), before, "nothing changed");
    let out = w
        .cmd()
        .args(["bundle", "list", "--json"])
        .output()
        .expect("list");
    assert_eq!(
        json(&out).as_array().map(Vec::len),
        Some(0),
        "no bundle recorded"
    );
}

/// `bundle add NAME BOX --add CANDY` deploys a candy the box lacks after the
/// box's own: its steps run, the deploy id names it (another than the box's
/// alone), `status` compares against the same plan, `del` undoes it all.
/// An unknown candy is refused with the nearest name; pods refuse `--add`.
#[test]
fn add_deploys_extra_candies_on_top_of_a_box() {
    let w = World::new();
    let before = tree(&w.root);
    let args = |name: &str, extra: &[&str]| {
        let mut a = w.add_args(name);
        let at = a.iter().position(|x| x == "hello").expect("box");
        a[at] = "base".into();
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let out = w
        .cmd()
        .args(args("x", &["--add", "hello-tols"]))
        .output()
        .expect("add");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("did you mean `hello-tools`"), "{said}");

    let out = w
        .cmd()
        .args(args("x", &["--add", "hello-tools", "--json"]))
        .output()
        .expect("add");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rep = json(&out);
    assert!(
        w.root.join("opt/hello/motd.txt").is_file(),
        "the added candy's file: {rep}"
    );
    let list = json(
        &w.cmd()
            .args(["bundle", "list", "--json"])
            .output()
            .expect("list"),
    );
    let id = list[0]["deploy_id"].as_str().expect("id").to_string();
    let plain = charly_rules::plan::deploy_id("base", &[], &[]);
    assert_ne!(id, plain, "the deploy id names the added candy");
    assert_eq!(
        id,
        charly_rules::plan::deploy_id("base", &[], &["hello-tools".into()])
    );
    let out = w
        .cmd()
        .args(["bundle", "status", "x"])
        .output()
        .expect("status");
    assert!(
        out.status.success(),
        "status compares against the plan with the added candy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = w.cmd().args(["bundle", "del", "x"]).output().expect("del");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(tree(&w.root), before);

    let out = w
        .cmd()
        .args([
            "bundle", "add", "p", "hello", "--target", "k8s", "--add", "jq",
        ])
        .output()
        .expect("k8s");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--add is for --target local, vm and pod"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `bundle apply` converges: a file changed behind charly's back is put
/// back (status 3, apply, status 0), and a changed candy is re-deployed
/// from its first changed step; `del` then leaves the target as it was.
#[test]
fn apply_converges_disk_and_configuration_drift() {
    let w = World::new();
    let before = tree(&w.root);
    let out = w.cmd().args(w.add_args("a")).output().expect("add");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let motd = w.root.join("opt/hello/motd.txt");
    let deployed = std::fs::read_to_string(&motd).expect("motd");
    let status = |w: &World| {
        let out = w
            .cmd()
            .args(["bundle", "status", "a"])
            .output()
            .expect("status");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let apply = |w: &World| {
        let out = w
            .cmd()
            .args(["bundle", "apply", "a"])
            .output()
            .expect("apply");
        let said = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{said}");
        said
    };

    std::fs::write(&motd, "tampered\n").expect("tamper");
    assert_eq!(status(&w).0, Some(3));
    // A changed file is the user's (as for `del`): apply stops, naming it,
    // and leaves it; --force writes over it.
    let out = w
        .cmd()
        .args(["bundle", "apply", "a"])
        .output()
        .expect("apply");
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("/opt/hello/motd.txt") && said.contains("--force"),
        "{said}"
    );
    assert_eq!(std::fs::read_to_string(&motd).expect("motd"), "tampered\n");
    let out = w
        .cmd()
        .args(["bundle", "apply", "a", "--force"])
        .output()
        .expect("apply");
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{said}");
    assert!(said.contains("converged"), "{said}");
    assert_eq!(std::fs::read_to_string(&motd).expect("motd"), deployed);
    let (code, said) = status(&w);
    assert_eq!(code, Some(0), "{said}");

    // The candy changes: the motd says something else now.
    let candy = w.project.join("candy/hello-tools/charly.yml");
    let text = std::fs::read_to_string(&candy).expect("candy");
    std::fs::write(
        &candy,
        text.replace(
            "Welcome to the hello box.",
            "Welcome back to the hello box.",
        ),
    )
    .expect("edit");
    let (code, said) = status(&w);
    assert_eq!(code, Some(3), "{said}");
    assert!(
        said.contains("Welcome back") && said.contains("Welcome to"),
        "config drift shows what changed: {said}"
    );
    apply(&w);
    assert_eq!(
        std::fs::read_to_string(&motd).expect("motd"),
        "Welcome back to the hello box.\n"
    );
    let (code, said) = status(&w);
    assert_eq!(code, Some(0), "{said}");

    let out = w.cmd().args(["bundle", "del", "a"]).output().expect("del");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(tree(&w.root), before);
}
