//! `--all` never drops a box silently: an enabled box that does not resolve
//! is named with its first error (file:line:col) and stops the run with
//! exit 1, unless `--keep-going`; a disabled one is left out quietly; a
//! project with no boxes says so.

use charly_testutil as project_copy;
use project_copy::{copy_project, graph_fixture};
use std::path::Path;
use std::process::Output;

fn charly(project: &Path, store: &Path, args: &[&str]) -> Output {
    std::process::Command::new(assert_cmd::cargo::cargo_bin("charly"))
        .env("NO_COLOR", "1")
        .env("CHARLY_CACHE_DIR", store)
        .arg("-C")
        .arg(project)
        .args(args)
        .output()
        .expect("charly runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The graph fixture plus a box whose candy does not exist.
fn with_broken_box(tmp: &Path, enabled: bool) -> std::path::PathBuf {
    let p = copy_project(&graph_fixture(), &tmp.join("p"));
    let dir = p.join("box/broken");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let enabled = if enabled { "" } else { "    enabled: false\n" };
    std::fs::write(
        dir.join("charly.yml"),
        format!(
            "box:\n    name: broken\n    version: 2026.1.1\n    base: docker.io/library/debian:12\n{enabled}    candy:\n        - no-such-candy\n"
        ),
    )
    .expect("write");
    p
}

#[test]
fn generate_all_names_an_unresolved_box_and_fails() {
    let tmp = tempfile::tempdir().expect("tmp");
    let p = with_broken_box(tmp.path(), true);
    let store = tmp.path().join("store");
    let out = charly(&p, &store, &["box", "generate", "--all", "-q"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("box `broken` does not resolve"), "{err}");
    assert!(
        err.contains("box/broken/charly.yml:"),
        "names file:line:col: {err}"
    );
    assert!(err.contains("--keep-going"), "says how to go on: {err}");
    assert!(!p.join(".build").exists(), "nothing generated on failure");

    // box build and check refuse the same way, before running anything.
    for cmd in [
        &["box", "build", "--all", "--runner", "fake", "-q"][..],
        &["check", "--all", "--runner", "fake", "-q"],
    ] {
        let out = charly(&p, &store, cmd);
        assert_eq!(out.status.code(), Some(1), "{cmd:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("box `broken` does not resolve"),
            "{cmd:?}: {}",
            stderr(&out)
        );
    }
}

#[test]
fn keep_going_generates_the_rest_and_still_names_the_dropped_box() {
    let tmp = tempfile::tempdir().expect("tmp");
    let p = with_broken_box(tmp.path(), true);
    let store = tmp.path().join("store");
    let out = charly(
        &p,
        &store,
        &["box", "generate", "--all", "--keep-going", "-q"],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("warning: box `broken` does not resolve"),
        "{err}"
    );
    let written = String::from_utf8_lossy(&out.stdout);
    assert!(
        written.contains("Containerfile"),
        "the others are written: {written}"
    );
    assert!(!p.join(".build/broken").exists());
}

#[test]
fn a_disabled_unresolved_box_is_left_out_quietly() {
    let tmp = tempfile::tempdir().expect("tmp");
    let p = with_broken_box(tmp.path(), false);
    let out = charly(
        &p,
        &tmp.path().join("store"),
        &["box", "generate", "--all", "-q"],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(!err.contains("broken"), "{err}");
}

#[test]
fn a_project_without_boxes_says_so() {
    let tmp = tempfile::tempdir().expect("tmp");
    let p = tmp.path().join("empty");
    std::fs::create_dir_all(&p).expect("mkdir");
    std::fs::write(p.join("charly.yml"), "version: 2026.160.1301\n").expect("write");
    let out = charly(&p, &tmp.path().join("store"), &["box", "generate", "--all"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("no boxes"), "{err}");
}

#[test]
fn a_replayed_keep_going_run_repeats_its_warnings_and_a_strict_run_still_fails() {
    let tmp = tempfile::tempdir().expect("tmp");
    let p = with_broken_box(tmp.path(), true);
    let store = tmp.path().join("store");
    let run = |args: &[&str]| {
        std::process::Command::new(assert_cmd::cargo::cargo_bin("charly"))
            .env("NO_COLOR", "1")
            .env("CHARLY_CACHE_DIR", &store)
            .env("CHARLY_JOURNAL_RACY_MS", "0")
            .arg("-C")
            .arg(&p)
            .args(args)
            .output()
            .expect("charly runs")
    };
    let keep = ["box", "generate", "--all", "--keep-going"];
    // Until a run is replayed (a run that wrote into the project is not
    // recorded over its own fresh outputs).
    let mut replayed = None;
    for _ in 0..4 {
        let out = run(&keep);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        if stderr(&out).contains("nothing changed since the last run") {
            replayed = Some(out);
            break;
        }
    }
    let out = replayed.expect("an unchanged --keep-going run is replayed");
    assert!(
        stderr(&out).contains("warning: box `broken` does not resolve"),
        "the replay repeats the warning: {}",
        stderr(&out)
    );
    // The journal answers only the same command: without --keep-going the
    // run is not replayed as a success.
    let out = run(&["box", "generate", "--all"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("box `broken` does not resolve"));
}
