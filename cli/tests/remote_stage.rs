//! `box build --remote-exec … --remote-stage-rootfs` through the `charly`
//! binary: a project whose box uses an artifact of a builder stage, built
//! with podman, the stage sent to a real REAPI engine (buildbox-casd +
//! buildbox-run, no host directories bound in) with the builder box's root
//! filesystem as its input root. The stage's record is byte for byte the
//! one a local podman run stores under the same key, the box built from it
//! has the artifact, and a second store gets the stage from the engine's
//! ActionCache. With `--remote-layers`, every box layer runs on the engine
//! too and holds what the local layer holds (paths, modes, owners, links),
//! and the image assembled from them runs.

use charly_testutil::casd as common_reapi;

mod machine;
use charly_testutil as project_copy;
use machine::{nodes, outputs, show, summary_json};

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BASE: &str = "localhost/charly-test-busybox:1";

/// A builder box `tools` that produces the `demo` builder, and a box `app`
/// whose candy `greet` triggers it (its `demo.json`).
fn project(root: &Path) {
    let w = |rel: &str, body: &str| charly_testutil::write(root, rel, body);
    w(
        "charly.yml",
        r#"version: 2026.160.1301
discover: [box, candy]
defaults:
    distro: [busybox]
    build: [none]
    builder:
        demo: tools
distro:
    busybox:
        base_user: {name: user, uid: 1000, gid: 1000, home: /home/user}
        format:
            none:
                install_template: |
                    RUN echo "packages:{{range .Packages}} {{.}}{{end}}"
builder:
    demo:
        detect_file: [demo.json]
        stage_template: |
            FROM {{.BuilderRef}} AS {{.StageName}}
            USER root
            WORKDIR /tmp/work
            COPY {{.CopySrc}}/demo.json /tmp/charly-demo/demo.json
            RUN mkdir -p {{.Home}}/.demo && cp /tmp/charly-demo/demo.json {{.Home}}/.demo/ && \
                echo "built with $(cat /etc/tools.conf)" > {{.Home}}/.demo/stamp
        copy_artifact:
            - src: '{{.Home}}/.demo'
              dst: '{{.Home}}/.demo'
              chown: true
"#,
    );
    w(
        "box/tools/charly.yml",
        &format!(
            "box:\n    name: tools\n    version: 1.0.0\n    base: {BASE}\n    candy: [toolconf]\n    produce: [demo]\n"
        ),
    );
    w(
        "candy/toolconf/charly.yml",
        "candy:\n    version: 1.0.0\n    name: toolconf\n    task:\n        - write: /etc/tools.conf\n          user: root\n          content: \"the tools box\\n\"\n",
    );
    w(
        "box/app/charly.yml",
        &format!("box:\n    name: app\n    version: 1.0.0\n    base: {BASE}\n    candy: [greet]\n"),
    );
    w(
        "candy/greet/charly.yml",
        "candy:\n    version: 1.0.0\n    name: greet\n",
    );
    w("candy/greet/demo.json", "{\"greeting\": \"hi\"}\n");
}

struct Env {
    dir: PathBuf,
    project: PathBuf,
}

impl Env {
    fn charly(&self, store: &str, args: &[&str]) -> (Output, serde_json::Value) {
        let summary = self.dir.join(format!("{store}.summary.json"));
        let _ = std::fs::remove_file(&summary);
        let out = Command::new(assert_cmd::cargo::cargo_bin("charly"))
            .env("NO_COLOR", "1")
            .env("CHARLY_CACHE_DIR", self.dir.join(store))
            .env("CHARLY_PODMAN_ROOT", self.dir.join("podman"))
            .env_remove("CHARLY_REMOTE")
            .env_remove("CHARLY_REMOTE_EXEC")
            .env_remove("CHARLY_CA_BUNDLE")
            .arg("-C")
            .arg(&self.project)
            .args(["box", "build", "app", "--summary-json"])
            .arg(&summary)
            .args(args)
            .output()
            .expect("run charly");
        (out, summary_json(&summary))
    }
}

/// The summary entry of the one builder-stage node.
fn stage(s: &serde_json::Value) -> serde_json::Value {
    let stages: Vec<&serde_json::Value> = s["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter(|n| n["kind"] == "builder-stage")
        .collect();
    assert_eq!(stages.len(), 1, "{s}");
    stages[0].clone()
}

#[test]
fn a_builder_stage_runs_on_the_engine_and_matches_a_local_build() {
    if !common_reapi::available() || !charly_testutil::podman_available() {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().to_path_buf();
    let env = Env {
        project: dir.join("project"),
        dir: dir.clone(),
    };
    project(&env.project);
    let podman = common_reapi::podman_with_image(&dir, BASE, &[]);

    // The reference: everything local.
    let (out, local) = env.charly("local", &[]);
    assert!(out.status.success(), "{}", show(&out));
    let local_stage = stage(&local);
    assert_eq!(local_stage["state"], "ran", "{local_stage}");

    // A fresh store, the stage on the engine; images stay local.
    let casd = common_reapi::start_with(2, &[]);
    let remote_args = [
        "--remote-exec",
        casd.url.as_str(),
        "--remote-no-image-property",
        "--remote-stage-rootfs",
    ];
    let (out, remote) = env.charly("remote", &remote_args);
    assert!(out.status.success(), "{}", show(&out));
    let remote_stage = stage(&remote);
    assert_eq!(remote_stage["state"], "ran", "{remote_stage}");
    assert_eq!(remote_stage["remote"]["place"], "remote", "{remote_stage}");
    assert_eq!(remote_stage["key"], local_stage["key"]);
    let key = local_stage["key"].as_str().expect("key");
    assert_eq!(
        outputs(&dir.join("remote"), key),
        outputs(&dir.join("local"), key),
        "the remote artifact differs from the local one"
    );
    let images: Vec<String> = nodes(&remote)
        .into_iter()
        .filter(|(id, _)| id.starts_with("layer:"))
        .map(|(id, _)| id)
        .collect();
    assert!(!images.is_empty(), "{remote}");
    for id in &images {
        let n = remote["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .find(|n| n["id"] == id.as_str())
            .expect("node");
        assert_eq!(n["remote"]["place"], "local", "{n}");
    }

    // The box got the artifact the engine built.
    let run = podman
        .cmd()
        .args([
            "run",
            "--rm",
            "localhost/app:1.0.0",
            "cat",
            "/home/user/.demo/stamp",
        ])
        .output()
        .expect("podman run");
    assert!(run.status.success(), "{}", show(&run));
    assert_eq!(
        String::from_utf8_lossy(&run.stdout),
        "built with the tools box\n"
    );

    // Another machine's store: the stage comes from the ActionCache.
    let (out, again) = env.charly("again", &remote_args);
    assert!(out.status.success(), "{}", show(&out));
    let again_stage = stage(&again);
    assert_eq!(
        again_stage["remote"]["place"], "remote-cached",
        "{again_stage}"
    );
    assert_eq!(
        again_stage["remote"]["action_digest"],
        remote_stage["remote"]["action_digest"]
    );
}

/// (path, kind, mode, uid, gid, link) of every entry of a layer blob in a
/// store's layout-free blob directory, found by its node's record.
fn layer_entries(store: &Path, key: &str) -> Vec<(String, char, u32, u64, u64, String)> {
    let files = outputs(store, key);
    let blob = files
        .iter()
        .find(|(name, _)| name.contains("layer"))
        .map(|(_, b)| b.clone());
    let Some(blob) = blob else {
        return Vec::new();
    };
    let mut ar = tar::Archive::new(flate2::read::MultiGzDecoder::new(blob.as_slice()));
    let mut out: Vec<_> = ar
        .entries()
        .expect("entries")
        .map(|e| {
            let e = e.expect("entry");
            let h = e.header();
            let kind = match h.entry_type() {
                tar::EntryType::Directory => 'd',
                tar::EntryType::Symlink => 'l',
                tar::EntryType::Regular => 'f',
                tar::EntryType::Link => 'h',
                _ => '?',
            };
            (
                e.path()
                    .expect("path")
                    .to_string_lossy()
                    .trim_start_matches("./")
                    .trim_end_matches('/')
                    .to_string(),
                kind,
                h.mode().expect("mode") & 0o7777,
                h.uid().expect("uid"),
                h.gid().expect("gid"),
                e.link_name()
                    .expect("link")
                    .map(|l| l.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            )
        })
        .collect();
    out.sort();
    out
}

#[test]
fn box_layers_run_on_the_engine_and_hold_what_a_local_build_holds() {
    if !common_reapi::available() || !charly_testutil::podman_available() {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().to_path_buf();
    let env = Env {
        project: dir.join("project"),
        dir: dir.clone(),
    };
    project(&env.project);
    let podman = common_reapi::podman_with_image(&dir, BASE, &[]);
    let (out, local) = env.charly("local", &[]);
    assert!(out.status.success(), "{}", show(&out));

    let casd = common_reapi::start_with(2, &[]);
    let remote_args = [
        "--remote-exec",
        casd.url.as_str(),
        "--remote-no-image-property",
        "--remote-stage-rootfs",
        "--remote-layers",
    ];
    // The local build's image is gone: what runs below is the engine's.
    let rmi = podman
        .cmd()
        .args(["rmi", "-f", "localhost/app:1.0.0"])
        .output()
        .expect("podman rmi");
    assert!(rmi.status.success(), "{}", show(&rmi));
    let (out, remote) = env.charly("remote", &remote_args);
    assert!(out.status.success(), "{}", show(&out));
    let layers = |s: &serde_json::Value| -> Vec<serde_json::Value> {
        s["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .filter(|n| n["kind"] == "layer")
            .cloned()
            .collect()
    };
    let built = layers(&remote);
    assert_eq!(built.len(), 3, "{remote}");
    for n in &built {
        assert_eq!(n["state"], "ran", "{n}");
        assert_eq!(
            n["remote"]["place"], "remote",
            "every layer ran on the engine: {n}"
        );
        let key = n["key"].as_str().expect("key");
        let (here, there) = (
            layer_entries(&dir.join("local"), key),
            layer_entries(&dir.join("remote"), key),
        );
        // podman's layer also holds the mount points its build made (empty
        // directories and files the base lacked); the rest is the same
        // paths, kinds, modes, owners and link targets.
        let stubs = [
            "dev",
            "proc",
            "sys",
            "run",
            "etc/hostname",
            "etc/hosts",
            "etc/resolv.conf",
        ];
        let here: Vec<_> = here
            .into_iter()
            .filter(|e| !stubs.contains(&e.0.as_str()))
            .collect();
        assert_eq!(here, there, "{}", n["id"]);
    }
    let greet = built
        .iter()
        .find(|n| n["id"] == "layer:app/greet")
        .expect("greet");
    let greet_entries = layer_entries(&dir.join("remote"), greet["key"].as_str().expect("key"));
    assert!(
        greet_entries.contains(&(
            "home/user/.demo/stamp".to_string(),
            'f',
            0o644,
            1000,
            1000,
            String::new()
        )),
        "the artifact keeps its owner: {greet_entries:?}"
    );

    // The image assembled from the engine's layers runs.
    let run = podman
        .cmd()
        .args([
            "run",
            "--rm",
            "localhost/app:1.0.0",
            "cat",
            "/home/user/.demo/stamp",
        ])
        .output()
        .expect("podman run");
    assert!(run.status.success(), "{}", show(&run));
    assert_eq!(
        String::from_utf8_lossy(&run.stdout),
        "built with the tools box\n"
    );

    // Another machine's store: every layer from the engine's ActionCache.
    let (out, again) = env.charly("again", &remote_args);
    assert!(out.status.success(), "{}", show(&out));
    for n in layers(&again) {
        assert_eq!(n["remote"]["place"], "remote-cached", "{n}");
    }
    let _ = local;
}
