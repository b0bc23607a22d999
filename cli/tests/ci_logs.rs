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

/// The summary names the run's critical path (issue 46, item 5): a chain
/// of nodes each depending on the one before (through cached nodes at
/// most), no longer than the run's work; stderr says it with the
/// parallelism; a run where nothing ran has none.
#[test]
fn the_summary_names_the_critical_path_and_the_parallelism() {
    let (t, project, cache) = setup();
    let summary = t.path().join("summary.json");
    let out = charly(&project, &cache)
        .args(["box", "build", "--all", "--runner", "fake", "-j", "4"])
        .arg("--summary-json")
        .arg(&summary)
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    let s: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&summary).expect("summary")).expect("json");
    let c = &s["critical"];
    let path: Vec<&str> = c["path"]
        .as_array()
        .expect("a critical path")
        .iter()
        .map(|v| v.as_str().expect("id"))
        .collect();
    assert!(path.len() >= 2, "{path:?}");
    assert!(c["path_ms"].as_u64() <= c["work_ms"].as_u64(), "{c}");
    assert!(
        err.contains(&format!("critical path: {} nodes", path.len())) && err.contains("× parallel"),
        "{err}"
    );
    // Each node depends on the one before it, directly or through nodes
    // that took no time (the graph's edges, from `charly graph`).
    let g = charly(&project, &cache)
        .args(["graph", "--format", "json", "--runner", "fake"])
        .output()
        .expect("graph");
    let g: serde_json::Value = serde_json::from_slice(&g.stdout).expect("graph json");
    let deps: std::collections::HashMap<&str, Vec<&str>> = g["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| {
            (
                n["id"].as_str().expect("id"),
                n["deps"]
                    .as_array()
                    .expect("deps")
                    .iter()
                    .map(|d| d.as_str().expect("dep"))
                    .collect(),
            )
        })
        .collect();
    let reaches = |from: &str, to: &str| {
        let mut stack = vec![to];
        let mut seen = std::collections::HashSet::new();
        while let Some(x) = stack.pop() {
            if x == from {
                return true;
            }
            if seen.insert(x) {
                stack.extend(deps.get(x).into_iter().flatten().copied());
            }
        }
        false
    };
    for w in path.windows(2) {
        assert!(reaches(w[0], w[1]), "{} does not lead to {}", w[0], w[1]);
    }
    // A no-op: nothing ran, no critical path.
    let out = charly(&project, &cache)
        .args(["box", "build", "--all", "--runner", "fake"])
        .arg("--summary-json")
        .arg(&summary)
        .output()
        .expect("runs");
    assert!(out.status.success());
    assert!(!String::from_utf8_lossy(&out.stderr).contains("critical path"));
}
