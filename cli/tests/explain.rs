//! `explain` as a user reads it (issue 44, item 10): it compares with
//! what the last build used (after a revert, the reverted state), shows
//! the lines of a written file that changed, and lists the nodes a short
//! name matches instead of guessing one.

use assert_cmd::Command;
use std::path::PathBuf;

struct World {
    _t: tempfile::TempDir,
    project: PathBuf,
    cache: PathBuf,
}

impl World {
    fn new() -> World {
        let t = tempfile::tempdir().expect("tmp");
        let project = t.path().join("project");
        charly_testutil::copy_project(&charly_testutil::example(), &project);
        World {
            cache: t.path().join("cache"),
            _t: t,
            project,
        }
    }

    fn run(&self, args: &[&str]) -> (bool, String) {
        let out = Command::cargo_bin("charly")
            .expect("binary")
            .env("NO_COLOR", "1")
            .env("CHARLY_CACHE_DIR", &self.cache)
            .arg("-C")
            .arg(&self.project)
            .args(args)
            .output()
            .expect("run");
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }

    fn build(&self) {
        let (ok, said) = self.run(&[
            "box",
            "build",
            "hello",
            "--runner",
            "fake",
            "--dev-local-pkg",
            "-q",
        ]);
        assert!(ok, "{said}");
    }

    fn explain(&self, node: &str) -> String {
        let (ok, said) = self.run(&["explain", node, "--runner", "fake", "--dev-local-pkg"]);
        assert!(ok, "{said}");
        said
    }

    fn edit(&self, rel: &str, from: &str, to: &str) {
        let p = self.project.join(rel);
        let text = std::fs::read_to_string(&p).expect("read");
        assert!(text.contains(from), "{rel} has {from:?}");
        std::fs::write(&p, text.replacen(from, to, 1)).expect("write");
    }
}

const TOOLS: &str = "candy/hello-tools/charly.yml";

#[test]
fn explain_compares_with_what_the_last_build_used() {
    let w = World::new();
    w.build();
    w.edit(TOOLS, "hello from charly", "v2");
    w.build();
    // Reverted: everything cached, nothing to explain.
    w.edit(TOOLS, "v2", "hello from charly");
    w.build();
    assert!(w.explain("layer:hello/hello-tools").contains("cached"));
    // Another edit: only that one is the change, not the v2 → v1 revert.
    w.edit(TOOLS, "Welcome to the hello box.", "Welcome, reverted box.");
    let said = w.explain("layer:hello/hello-tools");
    assert!(said.contains("would rebuild"), "{said}");
    assert!(
        !said.contains("v2"),
        "compared with the reverted state: {said}"
    );
    // The written file's lines, not digests of staging names.
    assert!(said.contains("- Welcome to the hello box."), "{said}");
    assert!(said.contains("+ Welcome, reverted box."), "{said}");
}

#[test]
fn a_short_name_that_several_nodes_have_is_listed_not_guessed() {
    let w = World::new();
    let (ok, said) = w.run(&[
        "explain",
        "hello-tools",
        "--runner",
        "fake",
        "--dev-local-pkg",
    ]);
    assert!(!ok, "{said}");
    assert!(said.contains("matches several nodes"), "{said}");
    for id in [
        "fragment:hello/hello-tools",
        "layer:hello/hello-tools",
        "source:candy/hello-tools",
    ] {
        assert!(said.contains(id), "{id}: {said}");
    }
}
