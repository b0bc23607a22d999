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
