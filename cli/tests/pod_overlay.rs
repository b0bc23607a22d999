//! A pod deploy with `--add` runs an overlay image: the box's image plus a
//! layer per added candy, built with real podman (isolated storage), with a
//! tag that names the box and the list; `bundle del` removes the image
//! unless `--keep-image`.

use assert_cmd::Command;
use std::path::PathBuf;

struct World {
    _t: tempfile::TempDir,
    project: PathBuf,
    cache: PathBuf,
    root: PathBuf,
    podman: charly_testutil::Podman,
}

impl World {
    fn new() -> World {
        let t = tempfile::tempdir().expect("tmp");
        let project = t.path().join("project");
        charly_testutil::copy_project(&charly_testutil::graph_fixture(), &project);
        let podman = charly_testutil::Podman::new(&t.path().join("podman"));
        podman.import_busybox(t.path(), "localhost/charly-test-busybox:1");
        let root = t.path().join("root");
        std::fs::create_dir_all(root.join("etc")).expect("root");
        World {
            project,
            cache: t.path().join("cache"),
            root,
            podman,
            _t: t,
        }
    }

    fn cmd(&self) -> Command {
        let mut c = Command::cargo_bin("charly").expect("binary");
        c.env("NO_COLOR", "1")
            .env("CHARLY_CACHE_DIR", &self.cache)
            .env("CONTAINERS_CONF", self.podman.dir.join("containers.conf"))
            .arg("-C")
            .arg(&self.project);
        c
    }

    fn add(&self, name: &str, extra: &[&str]) -> std::process::Output {
        let mut args = vec![
            "bundle",
            "add",
            name,
            "root",
            "--target",
            "pod",
            "--system",
            "--root",
            self.root.to_str().expect("utf8"),
            "--podman-root",
            self.podman.dir.to_str().expect("utf8"),
            "--add",
            "common2",
            "--yes",
        ];
        args.extend(extra);
        self.cmd().args(&args).output().expect("add")
    }

    fn image_exists(&self, reference: &str) -> bool {
        self.podman
            .run(&["image", "exists", reference])
            .status
            .success()
    }
}

fn ok(out: &std::process::Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    err
}

#[test]
fn a_pod_with_add_runs_an_overlay_image_that_del_removes() {
    if !charly_testutil::podman_available() {
        return;
    }
    let w = World::new();
    let said = ok(&w.add("p", &[]));
    let id = charly_rules::plan::deploy_id("root", &[], &["common2".to_string()]);
    let reference = format!("localhost/root-add-{id}:1.0.0");
    assert!(
        said.contains(&format!("overlay image {reference}")),
        "{said}"
    );
    let unit = std::fs::read_to_string(w.root.join("etc/containers/systemd/charly-root.container"))
        .expect("unit");
    assert!(
        unit.lines().any(|l| l == format!("Image={reference}")),
        "{unit}"
    );
    let out = w.podman.run(&[
        "run",
        "--rm",
        &reference,
        "cat",
        "/etc/common.conf",
        "/etc/common2.conf",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "common\ncommon2\n",
        "the box's candy and the added one"
    );
    let list = w
        .cmd()
        .args(["bundle", "list", "--json"])
        .output()
        .expect("list");
    let v: serde_json::Value = serde_json::from_slice(&list.stdout).expect("json");
    assert_eq!(
        v[0]["deploy_id"],
        id.as_str(),
        "the deploy id names the added candy"
    );

    let said = ok(&w.cmd().args(["bundle", "del", "p"]).output().expect("del"));
    assert!(said.contains("removed the overlay image"), "{said}");
    assert!(!w.image_exists(&reference));

    // With --keep-image the image outlives the bundle; the second build
    // reuses every layer the store has.
    ok(&w.add("q", &["--keep-image"]));
    let said = ok(&w.cmd().args(["bundle", "del", "q"]).output().expect("del"));
    assert!(said.contains("kept the overlay image"), "{said}");
    assert!(w.image_exists(&reference));
}

#[test]
fn add_is_refused_for_k8s_and_keep_image_needs_an_overlay() {
    let t = tempfile::tempdir().expect("tmp");
    let project = t.path().join("project");
    charly_testutil::copy_project(&charly_testutil::graph_fixture(), &project);
    let run = |args: &[&str]| {
        Command::cargo_bin("charly")
            .expect("binary")
            .env("CHARLY_CACHE_DIR", t.path().join("cache"))
            .arg("-C")
            .arg(&project)
            .args(args)
            .output()
            .expect("run")
    };
    let out = run(&[
        "bundle", "add", "k", "root", "--target", "k8s", "--add", "common2",
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--add is for --target local, vm and pod")
    );
    let out = run(&[
        "bundle",
        "add",
        "k",
        "root",
        "--target",
        "pod",
        "--keep-image",
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("--keep-image is for --target pod with --add")
    );
}
