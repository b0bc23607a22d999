//! The output directory under concurrency and crashes (issue 18, findings
//! 5 and 9): two `box generate` processes writing the same project both
//! succeed and leave exactly what one run leaves; temp files a killed
//! writer left in the output directory are removed by the next run, while
//! a live writer's (its lock held) are kept.

use charly_testutil as project_copy;
use project_copy::{example, hold_lock, tree};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn charly(project: &Path, cache: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(assert_cmd::cargo::cargo_bin("charly"));
    c.env("NO_COLOR", "1")
        .env("CHARLY_CACHE_DIR", cache)
        .arg("-C")
        .arg(project)
        .args(args);
    c
}

fn ok(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what}: exit {:?}\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
}

const GEN: [&str; 6] = [
    "box",
    "generate",
    "--all",
    "-q",
    "--no-journal",
    "--dev-local-pkg",
];

/// A copy of the example generated once (`GEN`): its temp directory, the
/// store, the project and the `.build` tree that run left.
fn generated_example() -> (
    tempfile::TempDir,
    PathBuf,
    PathBuf,
    BTreeMap<String, String>,
) {
    let t = tempfile::tempdir().expect("tmp");
    let cache = t.path().join("cache");
    let project = project_copy::copy_project(&example(), &t.path().join("project"));
    ok(
        &charly(&project, &cache, &GEN).output().expect("run"),
        "first",
    );
    let reference = tree(&project.join(".build"));
    (t, cache, project, reference)
}

#[test]
fn two_concurrent_generates_both_succeed_and_agree_with_one_run() {
    let t = tempfile::tempdir().expect("tmp");
    let cache = t.path().join("cache");
    // One run alone: the reference.
    let single = project_copy::copy_project(&example(), &t.path().join("single"));
    ok(
        &charly(&single, &cache, &GEN).output().expect("run"),
        "single",
    );
    let reference = tree(&single.join(".build"));
    assert!(reference.keys().any(|k| k.ends_with("Containerfile")));
    let project = project_copy::copy_project(&example(), &t.path().join("project"));
    for round in 0..10 {
        let _ = std::fs::remove_dir_all(project.join(".build"));
        let a = charly(&project, &cache, &GEN).spawn().expect("spawn a");
        let b = charly(&project, &cache, &GEN).spawn().expect("spawn b");
        let (a, b) = (
            a.wait_with_output().expect("a"),
            b.wait_with_output().expect("b"),
        );
        ok(&a, &format!("round {round}, first"));
        ok(&b, &format!("round {round}, second"));
        assert_eq!(
            reference,
            tree(&project.join(".build")),
            "round {round}: the output differs from a single run"
        );
    }
}

#[test]
fn temp_files_of_killed_writers_are_removed_live_ones_kept() {
    let t = tempfile::tempdir().expect("tmp");
    let cache = t.path().join("cache");
    let project = project_copy::copy_project(&example(), &t.path().join("project"));
    let out = t.path().join("out");
    let args = [
        "box",
        "generate",
        "--all",
        "-q",
        "--dev-local-pkg",
        "--out",
        out.to_str().expect("utf8"),
    ];
    ok(
        &charly(&project, &cache, &args).output().expect("run"),
        "first",
    );
    let reference = tree(&out);
    // What a SIGKILLed writer leaves: its temp file beside the target
    // (today's locked `.charly-tmp-<pid>-<n>`, and the `.tmpXXXXXX` of
    // earlier versions), in a box's directory and in the output root. A
    // box's directory is rewritten with its key marker removed first (the
    // marker is the last file renamed in), so a kill leaves it without one.
    for b in ["hello", "base"] {
        std::fs::remove_file(out.join(".build").join(b).join(".charly-key")).expect("marker");
    }
    let dead = [
        out.join(".build/hello/.tmpAb12Cd"),
        out.join(".build/hello/.charly-tmp-999999-1"),
        out.join(".build/base/.charly-tmp-999999-2"),
        out.join(".charly-tmp-999999-3"),
    ];
    for d in &dead {
        std::fs::write(d, "half written").expect("leftover");
    }
    // Another program's temp file outside .build: it holds no lock charly
    // could test, so it is never charly's to remove.
    let foreign = out.join(".tmpXy12Zw");
    std::fs::write(&foreign, "someone else's").expect("foreign");
    // A live writer: another process holds the lock of its temp file.
    let live = out.join(".build/hello/.charly-tmp-1-7");
    std::fs::write(&live, "being written").expect("live");
    let mut holder = hold_lock(&live);
    let rerun = charly(&project, &cache, &args).output().expect("rerun");
    let still_live = live.exists();
    let _ = holder.kill();
    let _ = holder.wait();
    ok(&rerun, "rerun");
    for d in &dead {
        assert!(!d.exists(), "{} was left behind", d.display());
    }
    assert!(still_live, "a live writer's temp file was removed");
    std::fs::remove_file(&live).expect("rm live");
    assert!(foreign.exists(), "another program's temp file was removed");
    std::fs::remove_file(&foreign).expect("rm foreign");
    assert_eq!(
        reference,
        tree(&out),
        "the rerun leaves what the first run left"
    );
}

/// A rewrite that fails partway leaves its directory without a key marker,
/// so the next run does not trust what is there: it rewrites it whole.
#[test]
fn a_failed_rewrite_leaves_no_marker_and_the_next_run_repairs_it() {
    let (_t, cache, project, reference) = generated_example();
    let dir = project.join(".build/hello");
    let marker = dir.join(".charly-key");
    assert!(marker.is_file(), "a written directory has its marker");
    // A hand edit makes the directory fail verification; a non-empty
    // directory where the Containerfile goes makes its rewrite fail.
    let staged = walkdir::WalkDir::new(&dir)
        .into_iter()
        .filter_map(Result::ok)
        .find(|e| e.file_type().is_file() && e.path().parent() != Some(dir.as_path()))
        .expect("a staged file below the box directory");
    std::fs::write(staged.path(), "edited by hand").expect("edit");
    std::fs::remove_file(dir.join("Containerfile")).expect("rm");
    std::fs::create_dir_all(dir.join("Containerfile/blocker")).expect("block");
    let failed = charly(&project, &cache, &GEN).output().expect("rerun");
    assert!(!failed.status.success(), "the rewrite must fail");
    assert!(
        !marker.exists(),
        "a failed rewrite left a marker: the next run would trust a half-written directory"
    );
    std::fs::remove_dir_all(dir.join("Containerfile")).expect("unblock");
    ok(
        &charly(&project, &cache, &GEN).output().expect("run"),
        "repair",
    );
    assert_eq!(
        reference,
        tree(&project.join(".build")),
        "the repair restores it"
    );
}

/// A rewrite leaves the files that still hold what the record says, and
/// restores the rest. A file is in place only as a regular file under real
/// directories: a subdirectory replaced by a symlink to an identical copy
/// is a directory again after the run (the prune unlinks the link, so the
/// files behind it must be written anew).
#[test]
fn a_rewrite_restores_edits_and_replaces_a_symlinked_subdirectory() {
    let (_t, cache, project, reference) = generated_example();
    let sub = project.join(".build/hello/_inline/hello-tools");
    assert!(sub.is_dir(), "the example stages files below _inline");
    let copy = project.join("stash");
    std::fs::create_dir_all(&copy).expect("copy dir");
    for e in std::fs::read_dir(&sub).expect("list") {
        let e = e.expect("entry");
        std::fs::copy(e.path(), copy.join(e.file_name())).expect("copy");
    }
    std::fs::remove_dir_all(&sub).expect("rm");
    std::os::unix::fs::symlink(&copy, &sub).expect("ln");
    let cf = project.join(".build/hello/Containerfile");
    let mut text = std::fs::read_to_string(&cf).expect("read");
    text.push_str("# edited by hand\n");
    std::fs::write(&cf, text).expect("edit");
    ok(
        &charly(&project, &cache, &GEN).output().expect("run"),
        "rerun",
    );
    assert!(
        std::fs::symlink_metadata(&sub).expect("stat").is_dir(),
        "the symlink was not replaced by a directory"
    );
    assert_eq!(
        reference,
        tree(&project.join(".build")),
        "the rerun restores it"
    );
}

/// The output root's own checks: a box directory that is a symlink out of
/// the project is refused, nothing outside changes.
#[test]
fn a_build_dir_symlinked_out_of_the_project_is_refused() {
    let t = tempfile::tempdir().expect("tmp");
    let cache = t.path().join("cache");
    let project = project_copy::copy_project(&example(), &t.path().join("project"));
    let outside = t.path().join("outside");
    std::fs::create_dir_all(&outside).expect("outside");
    std::fs::write(outside.join("precious"), "keep\n").expect("sentinel");
    std::fs::create_dir_all(project.join(".build")).expect("build");
    std::os::unix::fs::symlink(&outside, project.join(".build/hello")).expect("ln");
    let before = tree(&outside);
    let out = charly(
        &project,
        &cache,
        &[
            "box",
            "generate",
            "hello",
            "--no-journal",
            "--dev-local-pkg",
        ],
    )
    .output()
    .expect("run");
    assert!(!out.status.success(), "must be refused");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(".build/hello"), "{stderr}");
    assert_eq!(before, tree(&outside), "nothing outside changed: {stderr}");
}
