//! The image podman runs is the one charly built (issue 44, item 1): after
//! an edit, a build, a revert and a build that finds everything cached,
//! the box's reference names the reverted image, and `check` tests that
//! image. Real podman, isolated storage, the busybox fixture.

use assert_cmd::Command;
use std::path::PathBuf;

struct World {
    _t: tempfile::TempDir,
    project: PathBuf,
    cache: PathBuf,
    podman: charly_testutil::Podman,
}

/// The motd candy with `X` set to `value` in the environment and a check
/// that the image has that value.
fn motd(value: &str) -> String {
    format!(
        "candy:\n    version: 1.0.1\n    name: motd\n    env:\n        X: {value}\n    \
         eval:\n        - id: x-value\n          command: echo $X\n          stdout:\n              \
         - contains: {value}\n"
    )
}

impl World {
    fn new() -> World {
        let t = tempfile::tempdir().expect("tmp");
        let project = t.path().join("project");
        charly_testutil::copy_project(&charly_testutil::busybox_fixture(), &project);
        let podman = charly_testutil::Podman::new(&t.path().join("podman"));
        podman.import_busybox(t.path(), "localhost/charly-test-busybox:1");
        World {
            project,
            cache: t.path().join("cache"),
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

    fn set(&self, value: &str) {
        std::fs::write(self.project.join("candy/motd/charly.yml"), motd(value)).expect("candy");
    }

    fn build(&self, extra: &[&str]) -> String {
        let out = self
            .cmd()
            .args(["box", "build", "tiny", "--podman-root"])
            .arg(&self.podman.dir)
            .args(extra)
            .output()
            .expect("build");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{err}");
        err
    }

    fn x(&self) -> String {
        let out = self
            .podman
            .run(&["run", "--rm", "localhost/tiny:1.2.3", "sh", "-c", "echo $X"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

#[test]
fn after_a_revert_the_box_reference_names_the_reverted_image() {
    if !charly_testutil::podman_available() {
        return;
    }
    let w = World::new();
    w.set("v1");
    w.build(&[]);
    assert_eq!(w.x(), "v1");
    w.set("v2");
    w.build(&[]);
    assert_eq!(w.x(), "v2");
    // Back to v1: every node is cached, and the reference moves back.
    w.set("v1");
    let said = w.build(&[]);
    assert!(said.contains(" 0 ran"), "all cached: {said}");
    assert_eq!(
        w.x(),
        "v1",
        "podman runs the image of the keys just reported"
    );
    // The same with the journal off and with --load.
    w.set("v2");
    w.build(&["--no-journal"]);
    w.set("v1");
    w.build(&["--no-journal", "--load"]);
    assert_eq!(w.x(), "v1");
    // `check` tests the reverted image (its check wants v1).
    w.set("v2");
    w.build(&[]);
    w.set("v1");
    let out = w
        .cmd()
        .args(["check", "tiny", "--podman-root"])
        .arg(&w.podman.dir)
        .output()
        .expect("check");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(w.x(), "v1");
}

mod registry;

/// Issue 44, item 6: `--metadata-file` gives each box's digests, which
/// podman (the loaded image) and the registry (the pushed one) agree with;
/// a push prints `REF@sha256:…`.
#[test]
fn metadata_names_digests_that_podman_and_the_registry_agree_with() {
    if !charly_testutil::podman_available() {
        return;
    }
    let Some(reg) = registry::Registry::start() else {
        return;
    };
    let w = World::new();
    w.set("v1");
    let meta = w._t.path().join("meta.json");
    let pushed = format!("127.0.0.1:{}/charly/tiny:t1", reg.port);
    let out = w
        .cmd()
        .args(["box", "push", "tiny", &pushed, "--podman-root"])
        .arg(&w.podman.dir)
        .arg("--metadata-file")
        .arg(&meta)
        .output()
        .expect("push");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let printed = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&meta).expect("metadata")).expect("json");
    let tiny = &m["boxes"]["tiny"];
    let manifest = tiny["manifest_digest"].as_str().expect("manifest digest");
    let config = tiny["config_digest"].as_str().expect("config digest");
    assert_eq!(printed, format!("{pushed}@{manifest}"));
    assert_eq!(tiny["pushed"], printed.as_str());
    assert_eq!(tiny["image"], "localhost/tiny:1.2.3");
    // The registry serves that manifest.
    let out = std::process::Command::new("skopeo")
        .args(["inspect", "--raw", "--tls-verify=false"])
        .arg(format!("docker://{pushed}"))
        .output()
        .expect("skopeo");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        format!(
            "sha256:{}",
            <sha2::Sha256 as sha2::Digest>::digest(&out.stdout)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        ),
        manifest
    );
    // podman has the image (a build leaves it named) with that id.
    w.build(&["--metadata-file", meta.to_str().expect("utf8")]);
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&meta).expect("metadata")).expect("json");
    assert_eq!(m["boxes"]["tiny"]["in_podman"], true);
    assert_eq!(m["boxes"]["tiny"]["config_digest"], config);
    let out = w.podman.run(&[
        "image",
        "inspect",
        "--format",
        "{{.Id}} {{.Digest}}",
        "localhost/tiny:1.2.3",
    ]);
    let said = String::from_utf8_lossy(&out.stdout);
    let mut parts = said.split_whitespace();
    assert_eq!(
        parts.next().map(|id| format!("sha256:{id}")).as_deref(),
        Some(config)
    );
    assert_eq!(parts.next(), Some(manifest), "{said}");
}

/// Issue 44, item 11: `cache gc --podman` removes charly's own names from
/// podman's storage; the box's reference stays and runs, and the next
/// build brings back what it needs.
#[test]
fn cache_gc_podman_prunes_charlys_names_and_keeps_the_boxes() {
    if !charly_testutil::podman_available() {
        return;
    }
    let w = World::new();
    w.set("v1");
    w.build(&[]);
    let charly_names = || {
        let out = w
            .podman
            .run(&["images", "--format", "{{.Repository}}:{{.Tag}}"]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| {
                [
                    "localhost/charly-layer:",
                    "localhost/charly-image:",
                    "localhost/charly-build:",
                ]
                .iter()
                .any(|p| l.starts_with(p))
            })
            .map(String::from)
            .collect::<Vec<_>>()
    };
    assert!(!charly_names().is_empty(), "a build leaves content tags");
    let out = w
        .cmd()
        .args(["cache", "gc", "--podman", "--podman-root"])
        .arg(&w.podman.dir)
        .output()
        .expect("gc");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(charly_names(), Vec::<String>::new());
    assert_eq!(w.x(), "v1", "the box's reference still runs");
    w.set("v2");
    w.build(&[]);
    assert_eq!(w.x(), "v2");
}
