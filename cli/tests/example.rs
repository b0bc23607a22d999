//! The bundled example (`examples/hello`) built for real with podman, in
//! isolated podman storage and a fresh store: a Debian bookworm base made
//! offline with debootstrap, apt packages, an npm builder stage whose
//! artifact is reused, a local .deb, files, env, labels. Then: a no-op
//! build, an edit of the npm candy, an unrelated edit, a second box using
//! the same builder candy, and a restore after `podman rmi -a`. Layers:
//! node-builder and hello share their base and `nodejs` layers (one node,
//! one run, one blob), the store holds about the distinct layer bytes, and a
//! no-op build calls podman zero times (a counting wrapper on PATH).
//!
//! Needs podman, debootstrap and network access to the Debian mirror and
//! the npm registry (`.ci/install` installs the tools). Behind an
//! intercepting proxy the host's CA bundle is passed with `--ca-bundle`.

mod registry;
use charly_testutil as project_copy;
use project_copy::{copy_project, example};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

struct Env {
    _tmp: tempfile::TempDir,
    project: PathBuf,
    store: PathBuf,
    podman_root: PathBuf,
    summaries: PathBuf,
}

impl Env {
    fn charly(&self, args: &[&str]) -> Output {
        self.charly_cmd(&self.project, &self.store, args)
            .output()
            .expect("charly runs")
    }

    /// A charly command on the shared podman storage, with a given project
    /// checkout and store.
    fn charly_cmd(&self, project: &Path, store: &Path, args: &[&str]) -> Command {
        let mut c = Command::new(assert_cmd::cargo::cargo_bin("charly"));
        c.env("NO_COLOR", "1")
            .env("CHARLY_CACHE_DIR", store)
            .env("CHARLY_PODMAN_ROOT", &self.podman_root)
            .arg("-C")
            .arg(project)
            .args(args);
        let ca = Path::new("/etc/ssl/certs/ca-certificates.crt");
        if ca.is_file() {
            c.env("CHARLY_CA_BUNDLE", ca);
        }
        c
    }

    fn build(&self, name: &str, boxes: &[&str]) -> serde_json::Value {
        self.build_with(name, boxes, &["-q"]).0
    }

    /// A build with extra flags; its summary and stderr.
    fn build_with(
        &self,
        name: &str,
        boxes: &[&str],
        extra: &[&str],
    ) -> (serde_json::Value, String) {
        let summary = self.summaries.join(format!("{name}.json"));
        let mut args = vec![
            "box",
            "build",
            "--dev-local-pkg",
            "--summary-json",
            summary.to_str().expect("utf8"),
        ];
        args.extend(extra);
        args.extend(boxes);
        let t = Instant::now();
        let out = self.charly(&args);
        eprintln!("[example] {name}: {} ms", t.elapsed().as_millis());
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            out.status.success(),
            "{name}: build failed:\n{}{err}",
            String::from_utf8_lossy(&out.stdout),
        );
        let s = serde_json::from_slice(&std::fs::read(&summary).expect("summary")).expect("json");
        (s, err)
    }

    fn podman(&self) -> Command {
        let mut c = Command::new("podman");
        c.env("CONTAINERS_CONF", self.store.join("podman/containers.conf"))
            .arg("--root")
            .arg(self.podman_root.join("storage"))
            .arg("--runroot")
            .arg(self.podman_root.join("run"));
        c
    }

    fn sh(&self, script: &str) -> String {
        let out = self
            .podman()
            .args([
                "run",
                "--rm",
                "localhost/hello:2026.12.1",
                "bash",
                "-c",
                script,
            ])
            .output()
            .expect("podman run");
        assert!(
            out.status.success(),
            "{script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

fn states(s: &serde_json::Value) -> Vec<(String, String)> {
    s["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| {
            (
                n["id"].as_str().unwrap_or("").to_string(),
                n["state"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

fn ran(s: &serde_json::Value) -> Vec<String> {
    states(s)
        .into_iter()
        .filter(|(_, st)| st == "ran")
        .map(|(id, _)| id)
        .filter(|id| !id.starts_with("source:"))
        .collect()
}

/// Nodes that ran and make something (images, layers, stages, packages,
/// root filesystems), sorted.
fn built(s: &serde_json::Value) -> Vec<String> {
    let mut v: Vec<String> = ran(s)
        .into_iter()
        .filter(|id| {
            [
                "image:",
                "layer:",
                "builder-stage:",
                "local-pkg:",
                "rootfs:",
            ]
            .iter()
            .any(|p| id.starts_with(p))
        })
        .collect();
    v.sort();
    v
}

#[test]
fn example_builds_for_real_and_rebuilds_only_what_changed() {
    if !charly_testutil::podman_available() {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let env = Env {
        project: tmp.path().join("hello"),
        store: tmp.path().join("store"),
        podman_root: tmp.path().join("podman"),
        summaries: tmp.path().to_path_buf(),
        _tmp: tmp,
    };
    copy_project(&example(), &env.project);

    // Cold build, while another charly process on the same host (another
    // checkout and its own store, as a second CI job would have, so no lock
    // keeps them apart; the same podman storage) builds a different box
    // that also installs Debian packages: both `apt-get` RUNs overlap, and
    // neither may die on apt's cache lock. The other process's stderr is a
    // pipe, as in CI: its progress comes as plain lines while nodes run.
    let other = env.summaries.join("other.json");
    let other_project = copy_project(&example(), &env.summaries.join("hello-2"));
    let other_child = env
        .charly_cmd(
            &other_project,
            &env.summaries.join("store-2"),
            &[
                "box",
                "build",
                "--dev-local-pkg",
                "--summary-json",
                other.to_str().expect("utf8"),
                "node-builder",
            ],
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("second charly");
    let mut other_child = other_child;
    let other_err = other_child.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        std::io::BufReader::new(other_err)
            .lines()
            .map_while(Result::ok)
            .map(|l| (Instant::now(), l))
            .collect::<Vec<_>>()
    });
    let cold = env.build("cold", &["hello"]);
    assert_eq!(cold["totals"]["failed"], 0);
    let status = other_child.wait().expect("second charly");
    let ended = Instant::now();
    let lines = reader.join().expect("reader");
    let text: Vec<&str> = lines.iter().map(|(_, l)| l.as_str()).collect();
    assert!(
        status.success(),
        "the concurrent build of node-builder failed:\n{}",
        text.join("\n")
    );
    // Plain progress: a start and an end line per node that ran, printed
    // as it happened (the first well before the process ended).
    let first_start = lines
        .iter()
        .find(|(_, l)| l.contains("] start  rootfs:base (never built)"))
        .unwrap_or_else(|| panic!("no start line: {text:?}"));
    assert!(
        ended.duration_since(first_start.0).as_secs() >= 5,
        "progress came only at the end: {text:?}"
    );
    for id in [
        "rootfs:base",
        "layer:node-builder/nodejs",
        "image:node-builder",
    ] {
        assert!(
            text.iter()
                .any(|l| l.contains(&format!("] done   {id} in "))),
            "{id}: {text:?}"
        );
    }
    let mut slots: Vec<String> = std::fs::read_dir(env.podman_root.join("charly-cache-slots"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    slots.sort();
    // More than slot-0 means two builds with cache mounts overlapped.
    eprintln!("[example] apt cache slots taken: {slots:?}");
    let other: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&other).expect("summary")).expect("json");
    assert!(
        ran(&other).contains(&"image:node-builder".to_string()),
        "the second process built node-builder itself: {:?}",
        ran(&other)
    );
    for id in [
        "rootfs:base",
        "image:base",
        "image:node-builder",
        "builder-stage:cowsay/npm@node-builder",
        "local-pkg:hello-deb/deb@base",
        "image:hello",
    ] {
        assert!(
            ran(&cold).contains(&id.to_string()),
            "{id} ran in the cold build: {:?}",
            ran(&cold)
        );
    }

    // Every node that ran says why, in the summary.
    for n in cold["nodes"].as_array().expect("nodes") {
        if n["state"] == "ran" && n["kind"] != "source" {
            assert_eq!(n["reason"], "never built", "{n}");
        }
    }

    // node-builder (base + nodejs) and hello (base + nodejs + …) share the
    // nodejs layer: one node, run once.
    let nodejs: Vec<&serde_json::Value> = cold["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter(|n| n["kind"] == "layer" && n["candy"] == "nodejs")
        .collect();
    assert_eq!(nodejs.len(), 1, "one nodejs layer node: {nodejs:?}");
    assert_eq!(nodejs[0]["state"], "ran");

    // What the candies say is in the image.
    assert_eq!(env.sh("jq --version"), "jq-1.6", "apt package");
    assert_eq!(
        env.sh("command -v cowsay"),
        "/home/user/.npm-global/bin/cowsay",
        "npm artifact on PATH"
    );
    assert!(
        env.sh("cowsay moo").contains("< moo >"),
        "npm CLI runs as the box user"
    );
    assert_eq!(env.sh("id -un"), "user");
    assert_eq!(env.sh("hello-charly"), "hello from a local .deb");
    assert_eq!(
        env.sh("dpkg-query -W -f='${Status}' hello-charly"),
        "install ok installed"
    );
    assert_eq!(env.sh("stat -c '%a %U' /opt/hello/motd.txt"), "644 root");
    assert_eq!(
        env.sh("stat -c '%a %U' ~/.config/hello/settings.json"),
        "600 user"
    );
    assert_eq!(
        env.sh("readlink /usr/local/bin/hello-motd"),
        "/opt/hello/motd.txt"
    );
    assert_eq!(
        env.sh("cat /opt/hello/jq-version.txt"),
        "jq-1.6",
        "root cmd ran after the apt install"
    );
    assert_eq!(env.sh("echo $HELLO_GREETING"), "hello from charly");
    assert_eq!(
        env.sh("bash -lc 'echo $HELLO_SHELL'"),
        "bash",
        "login shell snippet"
    );
    assert_eq!(
        env.sh("bash -lc 'command -v cowsay'"),
        "/home/user/.npm-global/bin/cowsay",
        "PATH in login shells too"
    );
    assert!(
        env.sh("cat /etc/supervisord.conf")
            .contains("[program:greeter]")
    );
    let inspect = env
        .podman()
        .args(["image", "inspect", "localhost/hello:2026.12.1"])
        .output()
        .expect("inspect");
    let v: serde_json::Value = serde_json::from_slice(&inspect.stdout).expect("json");
    let labels = &v[0]["Config"]["Labels"];
    assert_eq!(labels["ai.opencharly.box"], "hello");
    assert_eq!(labels["ai.opencharly.platform.distro"], "debian");
    assert!(
        labels["ai.opencharly.node-key"]
            .as_str()
            .is_some_and(|k| k.len() == 64)
    );

    // No-op: nothing rebuilt, and podman is not called at all (a wrapper
    // first on PATH counts its invocations).
    let wrap = env.summaries.join("podman-wrapper");
    std::fs::create_dir_all(&wrap).expect("mkdir");
    let count = env.summaries.join("podman-calls");
    let real = String::from_utf8_lossy(
        &Command::new("sh")
            .args(["-c", "command -v podman"])
            .output()
            .expect("which")
            .stdout,
    )
    .trim()
    .to_string();
    std::fs::write(
        wrap.join("podman"),
        format!(
            "#!/bin/sh\necho \"$*\" >> '{}'\nexec '{real}' \"$@\"\n",
            count.display()
        ),
    )
    .expect("wrapper");
    std::fs::set_permissions(
        wrap.join("podman"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let path = format!(
        "{}:{}",
        wrap.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let noop_summary = env.summaries.join("noop.json");
    let noop = |what: &str| -> (serde_json::Value, String, u128) {
        let _ = std::fs::remove_file(&count);
        let t = Instant::now();
        let out = env
            .charly_cmd(
                &env.project,
                &env.store,
                &[
                    "box",
                    "build",
                    "--dev-local-pkg",
                    "-q",
                    "--summary-json",
                    noop_summary.to_str().expect("utf8"),
                    "hello",
                    "node-builder",
                ],
            )
            .env("PATH", &path)
            .output()
            .expect("charly");
        let ms = t.elapsed().as_millis();
        assert!(
            out.status.success(),
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let s: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&noop_summary).expect("summary")).expect("json");
        assert!(ran(&s).is_empty(), "{what}: {:?}", ran(&s));
        (s, std::fs::read_to_string(&count).unwrap_or_default(), ms)
    };
    // The second process above built node-builder in the same podman
    // storage and named its own image: this build, with every node
    // cached, names this store's image again (issue 44) — a listing and a
    // tag, nothing built or loaded.
    let (first, calls, _) = noop("first no-op");
    for call in calls.lines() {
        let verb = call
            .split_whitespace()
            .find(|w| !w.starts_with('-') && !w.starts_with('/'));
        assert!(
            matches!(verb, Some("images" | "tag")),
            "a cached build only checks and fixes names: {calls}"
        );
    }
    // The same command again: the journal replays it, podman is not
    // called at all.
    let (_, calls, noop_ms) = noop("no-op");
    assert_eq!(calls, "", "a no-op build calls podman zero times");
    eprintln!("[example] charly no-op build: {noop_ms} ms, 0 podman calls");
    assert!(noop_ms < 5_000, "no-op took {noop_ms} ms");
    // Both boxes requested: the shared layer is one node naming both (the
    // full run's summary: a replay reports keys only).
    let nodejs: Vec<&serde_json::Value> = first["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter(|n| n["kind"] == "layer" && n["candy"] == "nodejs")
        .collect();
    assert_eq!(nodejs.len(), 1, "{nodejs:?}");
    assert_eq!(
        nodejs[0]["boxes"],
        serde_json::json!(["hello", "node-builder"])
    );

    // The example's .charly/settings.yml sets dev_local_pkg: without the
    // flag, graph, explain and a deploy's dry run see what the build built.
    let out = env.charly(&["graph", "hello", "--format", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let g: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let not_cached: Vec<&serde_json::Value> = g["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter(|n| n["state"] != "cached")
        .collect();
    assert!(not_cached.is_empty(), "{not_cached:?}");
    let out = env.charly(&["explain", "image:base"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("image:base: cached"),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let dry_root = env.summaries.join("dry-root");
    std::fs::create_dir_all(&dry_root).expect("mkdir");
    let out = env.charly(&[
        "bundle",
        "add",
        "dry",
        "hello",
        "--target",
        "local",
        "--root",
        dry_root.to_str().expect("utf8"),
        "--dry-run",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The store holds each distinct layer once: its bytes are at most 1.1 ×
    // the distinct layer blobs of the three images (plus the npm artifact,
    // the .deb and the records, all small).
    let layout = env.summaries.join("all-oci");
    let out = env.charly(&[
        "box",
        "build",
        "--dev-local-pkg",
        "-q",
        "--output",
        &format!("oci:{}", layout.display()),
        "base",
        "node-builder",
        "hello",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).expect("index"))
            .expect("json");
    let mut distinct = std::collections::BTreeMap::new();
    for m in index["manifests"].as_array().expect("manifests") {
        let hex = m["digest"]
            .as_str()
            .expect("digest")
            .trim_start_matches("sha256:");
        let man: serde_json::Value = serde_json::from_slice(
            &std::fs::read(layout.join("blobs/sha256").join(hex)).expect("manifest"),
        )
        .expect("json");
        for l in man["layers"].as_array().expect("layers") {
            distinct.insert(
                l["digest"].as_str().expect("digest").to_string(),
                l["size"].as_u64().expect("size"),
            );
        }
    }
    let layer_bytes: u64 = distinct.values().sum();
    let store_bytes: u64 = walkdir::WalkDir::new(env.store.join("blobs"))
        .into_iter()
        .flatten()
        .filter(|e| e.file_type().is_file())
        .map(|e| e.metadata().map(|m| m.len()).unwrap_or(0))
        .sum();
    eprintln!(
        "[example] store blobs {store_bytes} bytes, {} distinct layers {layer_bytes} bytes, ratio {:.3}",
        distinct.len(),
        store_bytes as f64 / layer_bytes as f64
    );
    assert!(
        (store_bytes as f64) <= 1.1 * layer_bytes as f64,
        "store {store_bytes} > 1.1 × layers {layer_bytes}"
    );

    // Check beds: every check of the example passes in a bed of the box,
    // which reuses the stored builder artifact and image (nothing rebuilt).
    let junit = env.summaries.join("junit.xml");
    let check_summary = env.summaries.join("check.json");
    let out = env.charly(&[
        "check",
        "--all",
        "--json",
        "-q",
        "--junit",
        junit.to_str().expect("utf8"),
        "--summary-json",
        check_summary.to_str().expect("utf8"),
    ]);
    assert!(
        out.status.success(),
        "check failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&check_summary).expect("summary")).expect("json");
    assert!(ran(&summary).is_empty(), "{:?}", ran(&summary));
    assert!(
        states(&summary).contains(&(
            "builder-stage:cowsay/npm@node-builder".to_string(),
            "cached".to_string()
        )),
        "{:?}",
        states(&summary)
    );
    let reports: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let hello = reports
        .as_array()
        .expect("reports")
        .iter()
        .find(|r| r["box_name"] == "hello")
        .expect("hello's bed");
    let checks = hello["checks"].as_array().expect("checks");
    let outcome = |id: &str| {
        checks
            .iter()
            .find(|c| c["id"] == id)
            .map(|c| c["outcome"].as_str().unwrap_or("").to_string())
    };
    for id in [
        "motd",
        "jq-works",
        "jq-package",
        "greeter-running",
        "greeter-port",
        "greeter-answers",
        "cowsay-moos",
        "hello-charly-package",
        "node-version",
    ] {
        assert_eq!(outcome(id).as_deref(), Some("pass"), "{id}: {checks:?}");
    }
    assert_eq!(outcome("greeter-from-outside").as_deref(), Some("skip"));
    let xml = std::fs::read_to_string(&junit).expect("junit");
    assert!(xml.contains("<testsuite") && xml.contains("greeter-from-outside"));
    // Unchanged box and checks, all passed last time: cached, no container.
    let out = env.charly(&["check", "hello", "--json", "-q"]);
    assert!(out.status.success());
    let again: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(again[0]["cached"], true);
    // Unchanged again: replayed from the journal (a run that started no
    // container is recorded), and no run of it starts podman at all (the
    // counting wrapper): beds answered from the store need no image.
    let mut replayed = None;
    for _ in 0..3 {
        let _ = std::fs::remove_file(&count);
        let out = env
            .charly_cmd(
                &env.project,
                &env.store,
                &["check", "hello", "--json", "-q", "--explain"],
            )
            .env("PATH", &path)
            .output()
            .expect("charly");
        assert!(out.status.success());
        let calls = std::fs::read_to_string(&count).unwrap_or_default();
        assert_eq!(calls, "", "an unchanged check calls podman zero times");
        if String::from_utf8_lossy(&out.stderr).contains("journal: replayed from the journal") {
            replayed = Some(out.stdout);
            break;
        }
    }
    let replayed = replayed.expect("an unchanged check is replayed");
    let fresh = env.charly(&["check", "hello", "--json", "-q", "--no-journal"]);
    assert_eq!(
        replayed, fresh.stdout,
        "the replay prints what a fresh check prints"
    );
    // A deliberately wrong check fails, showing expected vs actual; editing
    // a check rebuilds nothing.
    let tools = env.project.join("candy/hello-tools/charly.yml");
    let original = std::fs::read_to_string(&tools).expect("read");
    std::fs::write(
        &tools,
        original.replace("- Welcome to the hello box", "- Goodbye from the hello box"),
    )
    .expect("edit");
    let out = env.charly(&[
        "check",
        "hello",
        "-q",
        "--summary-json",
        check_summary.to_str().expect("utf8"),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("FAIL  hello  motd")
            && err.contains("expected: contains \"Goodbye from the hello box\"")
            && err.contains("actual:   Welcome to the hello box."),
        "{err}"
    );
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&check_summary).expect("summary")).expect("json");
    assert!(ran(&summary).is_empty(), "{:?}", ran(&summary));
    std::fs::write(&tools, original).expect("restore");
    // A bed always builds local packages from local source: without it,
    // a hard error, never a release download.
    let pkg = env.project.join("candy/hello-deb/pkg");
    let moved = env.project.join("pkg-moved-away");
    std::fs::rename(&pkg, &moved).expect("move");
    let out = env.charly(&["check", "hello", "-q"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("no directory `pkg` was found"), "{err}");
    std::fs::rename(&moved, &pkg).expect("move back");

    // Edit the npm candy's package.json: only its stage and the box rebuild.
    let pj = env.project.join("candy/cowsay/package.json");
    let text = std::fs::read_to_string(&pj).expect("read");
    std::fs::write(
        &pj,
        text.replace("\"cowsay\": \"1.6.0\"", "\"cowsay\": \"1.5.0\""),
    )
    .expect("edit");
    let edited = env.build("npm-edit", &["hello"]);
    assert_eq!(
        built(&edited),
        vec![
            "builder-stage:cowsay/npm@node-builder".to_string(),
            "image:hello".to_string(),
            "layer:hello#init".to_string(),
            "layer:hello/cowsay".to_string(),
            "layer:hello/hello-deb".to_string(),
        ],
        "the stage, cowsay's layer and the layers above it"
    );

    // An unrelated candy edit: the npm stage stays cached.
    let tools = env.project.join("candy/hello-tools/charly.yml");
    let text = std::fs::read_to_string(&tools).expect("read");
    std::fs::write(
        &tools,
        text.replace("Welcome to the hello box.", "Welcome, again."),
    )
    .expect("edit");
    let (unrelated, err) = env.build_with(
        "unrelated-edit",
        &["hello"],
        &["--explain", "--progress", "plain"],
    );
    // The reason names the edited file, before the layer runs (explained
    // against the records the run replaces) and in the summary.
    let changed = "file candy/hello-tools/charly.yml changed";
    let explained = err.find(changed).unwrap_or_else(|| panic!("{err}"));
    let started = err
        .find("] start  layer:hello/hello-tools (file candy/hello-tools/charly.yml changed")
        .unwrap_or_else(|| panic!("{err}"));
    assert!(explained < started, "{err}");
    let tools_node = unrelated["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .find(|n| n["id"] == "layer:hello/hello-tools")
        .expect("node");
    assert!(
        tools_node["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with(changed)),
        "{tools_node}"
    );
    let mut above: Vec<String> = [
        "image:hello",
        "layer:hello#init",
        "layer:hello/cowsay",
        "layer:hello/greeter",
        "layer:hello/hello-deb",
        "layer:hello/hello-tools",
        "layer:hello/supervisord",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    above.sort();
    assert_eq!(
        built(&unrelated),
        above,
        "the npm stage and the layers below hello-tools stay cached"
    );

    // A package that does not exist: the error names the candy, the
    // package and its place in the candy file, and shows the command's own
    // last lines without podman's cache chatter.
    let edited = std::fs::read_to_string(&tools).expect("read");
    std::fs::write(&tools, edited.replace("- jq\n", "- jqq-does-not-exist\n")).expect("edit");
    let line = edited
        .lines()
        .position(|l| l.trim() == "- jq")
        .expect("jq line")
        + 1;
    let out = env.charly(&[
        "box",
        "build",
        "hello",
        "--dev-local-pkg",
        "--progress",
        "plain",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "error: layer:hello/hello-tools failed: candy `hello-tools`, package `jqq-does-not-exist` at candy/hello-tools/charly.yml:{line}:11: podman build failed at step"
        )),
        "{err}"
    );
    assert!(
        err.contains("  | E: Unable to locate package jqq-does-not-exist"),
        "{err}"
    );
    assert!(
        !err.contains("Using cache") && !err.contains("--> "),
        "{err}"
    );
    std::fs::write(&tools, edited).expect("restore");

    // A second box using the same builder candy reuses the stored artifact.
    let b2 = env.project.join("box/hello2/charly.yml");
    std::fs::create_dir_all(b2.parent().expect("dir")).expect("mkdir");
    std::fs::write(
        &b2,
        "box:\n    name: hello2\n    version: 2026.12.1\n    base: base\n    candy: [cowsay]\n",
    )
    .expect("write");
    let second = env.build("second-box", &["hello2"]);
    let st = states(&second);
    assert!(
        st.contains(&(
            "builder-stage:cowsay/npm@node-builder".to_string(),
            "cached".to_string()
        )),
        "{st:?}"
    );
    assert_eq!(
        built(&second),
        vec![
            "image:hello2".to_string(),
            "layer:hello2/cowsay".to_string()
        ],
        "hello2 shares base and nodejs with the others"
    );

    // Lose podman's images, keep the store: `--load` puts the assembled
    // image back, no RUN step runs.
    let out = env
        .podman()
        .args(["rmi", "-a", "-f"])
        .output()
        .expect("rmi");
    assert!(out.status.success());
    let restored_json = env.summaries.join("restore.json");
    let out = env.charly(&[
        "box",
        "build",
        "--dev-local-pkg",
        "-q",
        "--load",
        "--summary-json",
        restored_json.to_str().expect("utf8"),
        "hello",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let restored: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&restored_json).expect("summary")).expect("json");
    assert!(ran(&restored).is_empty(), "{:?}", ran(&restored));
    assert_eq!(
        env.sh("cowsay -f tux restored | head -n 2 | tail -n 1"),
        "< restored >"
    );

    // OCI layout output: skopeo, umoci and podman accept it.
    // podman names an oci: image after its path, which must be lowercase.
    let layout = std::env::temp_dir().join(format!("charly-example-oci-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&layout);
    let out = env.charly(&[
        "box",
        "build",
        "hello",
        "--dev-local-pkg",
        "-q",
        "--output",
        &format!("oci:{}", layout.display()),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let oci_ref = format!("oci:{}:hello-2026.12.1", layout.display());
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), oci_ref);
    let st = Command::new("skopeo")
        .args([
            "copy",
            "--quiet",
            &oci_ref,
            &format!("dir:{}", env.summaries.join("skopeo-dir").display()),
        ])
        .status()
        .expect("skopeo");
    assert!(st.success(), "skopeo copy");
    let st = Command::new("umoci")
        .args([
            "unpack",
            "--image",
            &format!("{}:hello-2026.12.1", layout.display()),
        ])
        .arg(env.summaries.join("bundle"))
        .status()
        .expect("umoci");
    assert!(
        st.success(),
        "umoci unpack (it checks every layer against its diff_id)"
    );
    assert!(
        env.summaries
            .join("bundle/rootfs/usr/bin/hello-charly")
            .is_file()
    );
    let out = env
        .podman()
        .args(["pull", "-q", &oci_ref])
        .output()
        .expect("pull");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let out = env
        .podman()
        .args(["run", "--rm", &id, "hello-charly"])
        .output()
        .expect("run");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "hello from a local .deb"
    );
    let _ = std::fs::remove_dir_all(&layout);

    init_project_builds_and_checks_on_a_fresh_store(&env);
    fresh_machine_pulls_every_layer_but_the_edited_one(&env);
}

/// `charly init DIR && charly -C DIR box build --all` on a fresh store (the
/// same podman storage): the new project builds as written, and its
/// candy's check passes in a bed.
fn init_project_builds_and_checks_on_a_fresh_store(env: &Env) {
    let dir = env.summaries.join("init-project");
    let store = env.summaries.join("init-store");
    let out = env
        .charly_cmd(&env.summaries, &store, &["init"])
        .arg(&dir)
        .output()
        .expect("init");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let t = Instant::now();
    let out = env
        .charly_cmd(
            &dir,
            &store,
            &["box", "build", "--all", "--progress", "plain"],
        )
        .output()
        .expect("build");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    eprintln!(
        "[example] init project cold build: {} ms",
        t.elapsed().as_millis()
    );
    assert!(err.contains("] done   image:app in "), "{err}");
    let out = env
        .charly_cmd(&dir, &store, &["check", "--all", "--json", "-q"])
        .output()
        .expect("check");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let reports: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let app = reports
        .as_array()
        .expect("reports")
        .iter()
        .find(|r| r["box_name"] == "app")
        .expect("app's bed");
    assert!(
        app["checks"]
            .as_array()
            .expect("checks")
            .iter()
            .any(|c| c["id"] == "hello-readme" && c["outcome"] == "pass"),
        "{app}"
    );
}

/// Store A (this test's) pushes to a registry; the last candy of hello is
/// edited; store B with a fresh podman storage and the same registry builds
/// hello: only the edited candy's layer (and the init layer above it) runs,
/// every other layer is pulled, and the image runs.
fn fresh_machine_pulls_every_layer_but_the_edited_one(env: &Env) {
    let Some(reg) = registry::Registry::start() else {
        return;
    };
    let url = reg.url("charly/fresh");
    let out = env.charly(&["--remote", &url, "cache", "push"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let deb = env.project.join("candy/hello-deb/charly.yml");
    let text = std::fs::read_to_string(&deb).expect("read");
    std::fs::write(
        &deb,
        text.replace(
            "    localpkg:",
            "    env:\n        HELLO_EDITED: \"yes\"\n    localpkg:",
        ),
    )
    .expect("edit");
    let b_store = env.summaries.join("store-b");
    let b_podman = env.summaries.join("podman-b");
    let summary = env.summaries.join("fresh-b.json");
    let t = Instant::now();
    let out = Command::new(assert_cmd::cargo::cargo_bin("charly"))
        .env("NO_COLOR", "1")
        .env("CHARLY_CACHE_DIR", &b_store)
        .env("CHARLY_PODMAN_ROOT", &b_podman)
        .env("CHARLY_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
        .arg("-C")
        .arg(&env.project)
        .args([
            "--remote",
            &url,
            "box",
            "build",
            "--dev-local-pkg",
            "-q",
            "--summary-json",
        ])
        .arg(&summary)
        .arg("hello")
        .output()
        .expect("charly");
    let ms = t.elapsed().as_millis();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&summary).expect("summary")).expect("json");
    eprintln!("[example] fresh machine after one edit: {ms} ms");
    let mut layers_ran: Vec<String> = states(&s)
        .into_iter()
        .filter(|(id, st)| id.starts_with("layer:") && st == "ran")
        .map(|(id, _)| id)
        .collect();
    layers_ran.sort();
    assert_eq!(
        layers_ran,
        vec![
            "layer:hello#init".to_string(),
            "layer:hello/hello-deb".to_string()
        ],
        "the edited candy's layer and the init layer above it"
    );
    for (id, st) in states(&s) {
        if id.starts_with("layer:") && !layers_ran.contains(&id) {
            assert_eq!(st, "pulled", "{id}");
        }
        // Its local package is made of its source and recipe, which the
        // edit did not touch: pulled, not rebuilt (issue 46, item 4).
        if id.starts_with("local-pkg:") {
            assert_eq!(st, "pulled", "{id}");
        }
    }
    let out = Command::new("podman")
        .env("CONTAINERS_CONF", b_store.join("podman/containers.conf"))
        .arg("--root")
        .arg(b_podman.join("storage"))
        .arg("--runroot")
        .arg(b_podman.join("run"))
        .args([
            "run",
            "--rm",
            "localhost/hello:2026.12.1",
            "sh",
            "-c",
            "hello-charly; echo $HELLO_EDITED",
        ])
        .output()
        .expect("podman run");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "hello from a local .deb\nyes",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // `box push`: a real image in the registry; a fresh storage pulls and runs it.
    let pushed = format!("127.0.0.1:{}/charly/pushed:v1", reg.port);
    let out = env.charly(&["box", "push", "hello", &pushed, "--dev-local-pkg", "-q"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.trim().starts_with(&format!("{pushed}@sha256:")),
        "the pushed reference with its digest: {said}"
    );
    let out = Command::new("skopeo")
        .args(["inspect", "--tls-verify=false"])
        .arg(format!("docker://{pushed}"))
        .output()
        .expect("skopeo");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let inspected: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(inspected["Labels"]["ai.opencharly.box"], "hello");
    let c_podman = env.summaries.join("podman-c");
    let podman_c = || {
        let mut c = Command::new("podman");
        c.env("CONTAINERS_CONF", b_store.join("podman/containers.conf"))
            .arg("--root")
            .arg(c_podman.join("storage"))
            .arg("--runroot")
            .arg(c_podman.join("run"));
        c
    };
    let out = podman_c()
        .args(["pull", "-q", "--tls-verify=false", &pushed])
        .output()
        .expect("pull");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = podman_c()
        .args(["run", "--rm", &pushed, "hello-charly"])
        .output()
        .expect("run");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "hello from a local .deb",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A box on an external base (the image just pushed) on a fresh podman
    // storage: with --offline a clear refusal, without it pulled once.
    let ext = env.summaries.join("ext-project");
    for (rel, text) in [
        (
            "charly.yml",
            "version: 2026.160.1301\ndiscover: [box, candy]\ndefaults:\n    distro: [debian:12, debian]\n    build: [deb]\n".to_string(),
        ),
        (
            "box/ext/charly.yml",
            format!("box:\n    name: ext\n    version: 1.0.0\n    base: {pushed}\n    candy: [note]\n"),
        ),
        (
            "candy/note/charly.yml",
            "candy:\n    version: 1.0.0\n    task:\n        - write: /etc/note\n          user: root\n          content: on an external base\n".to_string(),
        ),
    ] {
        let p = ext.join(rel);
        std::fs::create_dir_all(p.parent().expect("dir")).expect("mkdir");
        std::fs::write(p, text).expect("write");
    }
    let d_store = env.summaries.join("store-d");
    let d_podman = env.summaries.join("podman-d");
    let build_ext = |extra: &[&str]| {
        let mut args = vec!["box", "build", "ext", "--progress", "plain"];
        args.extend(extra);
        env.charly_cmd(&ext, &d_store, &args)
            .env("CHARLY_PODMAN_ROOT", &d_podman)
            .output()
            .expect("charly")
    };
    let out = build_ext(&["--offline"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "the base image {pushed} is not in podman's storage and --offline forbids pulling it"
        )),
        "{err}"
    );
    let out = build_ext(&[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(&format!("] done   base:{pushed} in ")),
        "{err}"
    );

    // The example on the REAPI engine CI has (buildbox-casd + buildbox-run,
    // bubblewrap, nothing of the host bound in) with README's flags: after
    // an edit of the npm candy and of the local package's source, the npm
    // stage and the package run on the engine — in their images' files,
    // the stage's chown of its home left to the artifact's owner, the proxy
    // CA carried in (issue 46) — as do the layers above them, and the box
    // runs.
    if !charly_testutil::casd::available() {
        return;
    }
    let casd = charly_testutil::casd::start_with(2, &[]);
    let pj = env.project.join("candy/cowsay/package.json");
    let text = std::fs::read_to_string(&pj).expect("read");
    std::fs::write(
        &pj,
        text.replacen('{', "{\n  \"description\": \"built remotely\",", 1),
    )
    .expect("edit");
    let tool = env.project.join("candy/hello-deb/pkg/usr/bin/hello-charly");
    let text = std::fs::read_to_string(&tool).expect("read");
    std::fs::write(&tool, format!("{text}# built on the engine\n")).expect("edit");
    let (remote, _) = env.build_with(
        "remote-exec",
        &["hello"],
        &[
            "-q",
            "--remote-exec",
            &casd.url,
            "--remote-stage-rootfs",
            "--remote-platform",
            "network=on",
            "--remote-layers",
        ],
    );
    let place = |id: &str| {
        remote["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .find(|n| n["id"] == id)
            .unwrap_or_else(|| panic!("{id} in {remote}"))["remote"]["place"]
            .as_str()
            .map(str::to_string)
    };
    assert_eq!(
        place("builder-stage:cowsay/npm@node-builder").as_deref(),
        Some("remote")
    );
    assert_eq!(
        place("local-pkg:hello-deb/deb@base").as_deref(),
        Some("remote")
    );
    // The layers above the edits ran on the engine too (--remote-layers),
    // each on its parent's stored layers.
    for id in [
        "layer:hello/cowsay",
        "layer:hello/hello-deb",
        "layer:hello#init",
    ] {
        assert_eq!(place(id).as_deref(), Some("remote"), "{id}");
    }
    assert_eq!(env.sh("cowsay remote | grep -c remote"), "1");
    assert_eq!(
        env.sh("tail -n 1 /usr/bin/hello-charly"),
        "# built on the engine"
    );
}
