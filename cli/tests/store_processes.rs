//! Several `charly` processes and one store: concurrent builds never do a
//! node twice or corrupt the store; a process killed with SIGKILL at any
//! point leaves a store that verifies (after repair) and keeps working.

use assert_cmd::Command;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/graph")
}

fn charly(store: &Path) -> std::process::Command {
    let mut c = std::process::Command::new(assert_cmd::cargo::cargo_bin("charly"));
    c.env("NO_COLOR", "1")
        .env("CHARLY_CACHE_DIR", store)
        .arg("-C")
        .arg(fixture());
    c
}

fn summary(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).expect("summary written")).expect("json")
}

#[test]
fn four_concurrent_builds_share_one_store_without_duplicate_work() {
    let t = tempfile::tempdir().expect("tmp");
    let store = t.path().join("store");
    let children: Vec<_> = (0..4)
        .map(|i| {
            charly(&store)
                .args([
                    "box",
                    "build",
                    "left",
                    "right",
                    "--runner",
                    "fake",
                    "-q",
                    "-j",
                    "2",
                    "--summary-json",
                ])
                .arg(t.path().join(format!("s{i}.json")))
                .env("CHARLY_FAKE_DELAY_MS", "150")
                .spawn()
                .expect("spawn")
        })
        .collect();
    for mut c in children {
        assert!(c.wait().expect("wait").success());
    }
    // Every non-source node ran exactly once across the four processes.
    let mut ran: std::collections::BTreeMap<String, usize> = Default::default();
    let mut all = std::collections::BTreeSet::new();
    for i in 0..4 {
        let s = summary(&t.path().join(format!("s{i}.json")));
        for n in s["nodes"].as_array().expect("nodes") {
            let id = n["id"].as_str().expect("id").to_string();
            if n["kind"] == "source" {
                continue;
            }
            all.insert(id.clone());
            assert!(n["state"] == "ran" || n["state"] == "cached", "{n}");
            if n["state"] == "ran" {
                *ran.entry(id).or_default() += 1;
            }
        }
    }
    for id in &all {
        assert_eq!(ran.get(id), Some(&1), "{id} ran {:?} times", ran.get(id));
    }
    let out = Command::new(assert_cmd::cargo::cargo_bin("charly"))
        .env("CHARLY_CACHE_DIR", &store)
        .args(["cache", "verify", "--json"])
        .output()
        .expect("verify");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn sigkill_at_any_point_leaves_a_usable_store() {
    let t = tempfile::tempdir().expect("tmp");
    let store = t.path().join("store");
    // Kill builds at different moments: before, during and after writes.
    for (round, after_ms) in [40u64, 120, 260, 420, 700, 20].into_iter().enumerate() {
        let mut child = charly(&store)
            .args([
                "box", "build", "left", "right", "--runner", "fake", "-q", "-j", "2",
            ])
            .env("CHARLY_FAKE_DELAY_MS", "60")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn");
        std::thread::sleep(Duration::from_millis(after_ms));
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();
        let repair = Command::new(assert_cmd::cargo::cargo_bin("charly"))
            .env("CHARLY_CACHE_DIR", &store)
            .args(["cache", "verify", "--repair", "--json"])
            .output()
            .expect("verify");
        assert!(
            repair.status.success(),
            "round {round}: {}",
            String::from_utf8_lossy(&repair.stdout)
        );
        let check = Command::new(assert_cmd::cargo::cargo_bin("charly"))
            .env("CHARLY_CACHE_DIR", &store)
            .args(["cache", "verify", "--json"])
            .output()
            .expect("verify");
        assert!(
            check.status.success(),
            "round {round}: not clean after repair: {}",
            String::from_utf8_lossy(&check.stdout)
        );
    }
    // The store still builds correctly, and then everything is cached.
    let s1 = t.path().join("final.json");
    let st = charly(&store)
        .args([
            "box",
            "build",
            "left",
            "right",
            "--runner",
            "fake",
            "-q",
            "--summary-json",
        ])
        .arg(&s1)
        .status()
        .expect("build");
    assert!(st.success());
    let s2 = t.path().join("again.json");
    let st = charly(&store)
        .args([
            "box",
            "build",
            "left",
            "right",
            "--runner",
            "fake",
            "-q",
            "--summary-json",
        ])
        .arg(&s2)
        .status()
        .expect("build");
    assert!(st.success());
    let again = summary(&s2);
    assert_eq!(again["totals"]["ran"], 0, "{again}");
}
