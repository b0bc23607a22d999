//! CI logs (issue 44, item 5), plain progress with the fake runner: a node
//! running longer than the heartbeat interval says so with the last line
//! its command printed; the start/done lines and the quick-node line add
//! up to the summary's count; a failed node's whole log is kept in the
//! store and its path printed.

use assert_cmd::Command;
use std::path::{Path, PathBuf};

fn charly(project: &Path, cache: &Path) -> Command {
    let mut c = Command::cargo_bin("charly").expect("binary");
    c.env("NO_COLOR", "1")
        .env("CHARLY_CACHE_DIR", cache)
        .env_remove("CHARLY_PROGRESS")
        .arg("-C")
        .arg(project);
    c
}

fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let t = tempfile::tempdir().expect("tmp");
    let project = t.path().join("project");
    charly_testutil::copy_project(&charly_testutil::example(), &project);
    let cache = t.path().join("cache");
    (t, project, cache)
}

#[test]
fn a_long_step_has_heartbeats_and_the_lines_add_up() {
    let (_t, project, cache) = setup();
    let out = charly(&project, &cache)
        .args([
            "box",
            "build",
            "base",
            "--runner",
            "fake",
            "--progress",
            "plain",
        ])
        .env("CHARLY_FAKE_DELAY_MS", "1600")
        .env("CHARLY_HEARTBEAT_SECS", "0.5")
        .output()
        .expect("build");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let beats: Vec<&str> = err.lines().filter(|l| l.contains("] ...    ")).collect();
    assert!(!beats.is_empty(), "heartbeats: {err}");
    assert!(
        beats
            .iter()
            .any(|l| l.contains("(running ") && l.contains(": fake runner: ")),
        "with the last line: {err}"
    );
    // done lines + the quick nodes = the summary's `ran`.
    let done = err
        .lines()
        .filter(|l| l.contains("] done   ") && !l.contains("quick node"))
        .count() as u64;
    let quick: u64 = err
        .lines()
        .find_map(|l| {
            l.split("] done   ")
                .nth(1)?
                .strip_suffix(')')?
                .split_once(" quick node")
        })
        .and_then(|(n, _)| n.trim().parse().ok())
        .unwrap_or(0);
    let ran: u64 = err
        .lines()
        .find_map(|l| {
            l.strip_prefix("build: ")?
                .split(", ")
                .nth(1)?
                .strip_suffix(" ran")?
                .parse()
                .ok()
        })
        .expect("summary line");
    assert_eq!(done + quick, ran, "{err}");
}

#[test]
fn a_failed_step_keeps_its_whole_log_and_names_it() {
    let (_t, project, cache) = setup();
    let out = charly(&project, &cache)
        .args([
            "box",
            "build",
            "base",
            "--runner",
            "fake",
            "--progress",
            "plain",
        ])
        .env("CHARLY_FAKE_FAIL", "layer:base#setup")
        .output()
        .expect("build");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    let path = err
        .lines()
        .find_map(|l| l.trim().strip_prefix("full log: "))
        .unwrap_or_else(|| panic!("no log path: {err}"));
    let log = std::fs::read_to_string(path).expect("the log file exists");
    assert!(log.contains("fake runner: layer layer:base#setup"), "{log}");
    assert!(
        Path::new(path).starts_with(&cache),
        "{path} is in the store"
    );
    // A node that succeeds leaves no log behind.
    let out = charly(&project, &cache)
        .args(["box", "build", "base", "--runner", "fake", "-q"])
        .output()
        .expect("build");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!Path::new(path).exists(), "the successful run removed it");
}
