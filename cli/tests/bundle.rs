//! `charly bundle` end to end on the example project, against a rooted
//! directory: kill -9 in the middle of a step, then `status` and `del`;
//! a failing step; `--help` says where the ledger lives.

use assert_cmd::Command;
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn example() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/hello")
}

struct World {
    _t: tempfile::TempDir,
    cache: PathBuf,
    root: PathBuf,
}

impl World {
    fn new() -> World {
        let t = tempfile::tempdir().expect("tmp");
        let cache = t.path().join("cache");
        let root = t.path().join("root");
        std::fs::create_dir_all(root.join("etc")).expect("root");
        std::fs::write(root.join("etc/hostname"), "target\n").expect("hostname");
        let w = World { _t: t, cache, root };
        // The store, filled as `box build` fills it (fake runner: no podman).
        let out = w
            .cmd()
            .args([
                "box",
                "build",
                "hello",
                "--runner",
                "fake",
                "--dev-local-pkg",
                "-q",
            ])
            .output()
            .expect("build");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        w
    }

    fn cmd(&self) -> Command {
        let mut c = Command::cargo_bin("charly").expect("binary");
        c.env("NO_COLOR", "1")
            .env("CHARLY_CACHE_DIR", &self.cache)
            .env_remove("CHARLY_TEST_BLOCK_AT_STEP")
            .arg("-C")
            .arg(example());
        c
    }

    fn add_args(&self, name: &str) -> Vec<String> {
        [
            "bundle",
            "add",
            name,
            "hello",
            "--target",
            "local",
            "--root",
            self.root.to_str().expect("utf8"),
            "--runner",
            "fake",
            "--dev-local-pkg",
            "--yes",
        ]
        .map(String::from)
        .to_vec()
    }
}

fn tree(root: &Path) -> BTreeMap<String, String> {
    walkdir::WalkDir::new(root)
        .sort_by_file_name()
        .into_iter()
        .map(|e| {
            let e = e.expect("walk");
            let md = e.path().symlink_metadata().expect("meta");
            let what = if md.is_file() {
                format!("{:?}", std::fs::read(e.path()).expect("read"))
            } else {
                format!("{:?}", md.file_type())
            };
            (
                e.path().display().to_string(),
                format!("{what} {:o} {}", md.mode(), md.uid()),
            )
        })
        .collect()
}

fn json(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
fn kill_9_mid_step_then_status_explains_and_del_cleans() {
    let w = World::new();
    let before = tree(&w.root);
    // Which step of the merged plan writes the motd (per-candy plans, concatenated).
    let out = w
        .cmd()
        .args(["box", "plan", "hello", "--target", "local", "--json"])
        .output()
        .expect("plan");
    let plan = json(&out);
    let steps: Vec<&serde_json::Value> = plan["plans"]
        .as_array()
        .expect("plans")
        .iter()
        .flat_map(|p| p["steps"].as_array().expect("steps").iter())
        .collect();
    let seq = steps
        .iter()
        .position(|s| s["path"] == "/opt/hello/motd.txt")
        .expect("motd step") as u64;

    let bin = assert_cmd::cargo::cargo_bin("charly");
    let mut child = std::process::Command::new(bin)
        .env("NO_COLOR", "1")
        .env("CHARLY_CACHE_DIR", &w.cache)
        .env("CHARLY_TEST_BLOCK_AT_STEP", seq.to_string())
        .arg("-C")
        .arg(example())
        .args(w.add_args("k"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    let motd = w.root.join("opt/hello/motd.txt");
    let t = Instant::now();
    while !motd.exists() {
        assert!(t.elapsed() < Duration::from_secs(120), "the step never ran");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The step has made its change and blocks: SIGKILL, no chance to clean up.
    child.kill().expect("kill -9");
    let _ = child.wait();

    let out = w
        .cmd()
        .args(["bundle", "status", "k", "--json"])
        .output()
        .expect("status");
    assert_eq!(out.status.code(), Some(3), "drift → exit 3");
    let st = json(&out);
    assert_eq!(st["state"], "applying");
    assert_eq!(st["running"], false);
    let drift = st["drift"].as_array().expect("drift");
    assert!(
        drift.iter().any(|d| d["seq"].as_u64() == Some(seq)
            && d["detail"]
                .as_str()
                .is_some_and(|x| x.contains("incomplete"))
            && d["subject"].as_str().is_some_and(|x| x.contains("motd"))),
        "{st}"
    );
    assert!(drift.iter().any(|d| {
        d["detail"]
            .as_str()
            .is_some_and(|x| x.contains("interrupted"))
    }));
    let out = w
        .cmd()
        .args(["bundle", "list", "--json"])
        .output()
        .expect("list");
    let l = json(&out);
    assert_eq!(l[0]["name"], "k");
    assert_eq!(l[0]["state"], "applying");

    let out = w.cmd().args(["bundle", "del", "k"]).output().expect("del");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        tree(&w.root),
        before,
        "del reverses the completed steps and the incomplete one"
    );
    let out = w
        .cmd()
        .args(["bundle", "list", "--json"])
        .output()
        .expect("list");
    assert_eq!(json(&out), serde_json::json!([]));
}

#[test]
fn a_failing_step_stops_with_its_name_and_del_cleans() {
    let w = World::new();
    let before = tree(&w.root);
    // The fake runner's builder artifact is not a tar: the npm step fails.
    let out = w.cmd().args(w.add_args("f")).output().expect("add");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("npm builder artifact") && err.contains("failed"),
        "{err}"
    );
    assert!(err.contains("not attempted"), "{err}");
    let out = w
        .cmd()
        .args([
            "bundle", "add", "f2", "hello", "--target", "local", "--root",
        ])
        .arg(&w.root)
        .args(["--runner", "fake", "--dev-local-pkg"])
        .output()
        .expect("dup");
    assert_eq!(
        out.status.code(),
        Some(1),
        "same deploy on the same target refused"
    );
    let out = w
        .cmd()
        .args(["bundle", "status", "f", "--json"])
        .output()
        .expect("status");
    let st = json(&out);
    assert_eq!(st["state"], "failed");
    let out = w
        .cmd()
        .args(["bundle", "del", "f", "--json"])
        .output()
        .expect("del");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(tree(&w.root), before);
    let out = w
        .cmd()
        .args(["bundle", "status", "f"])
        .output()
        .expect("status");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no bundle named `f`"));
}

#[test]
fn help_says_where_the_ledger_lives() {
    let out = Command::cargo_bin("charly")
        .expect("bin")
        .args(["bundle", "add", "--help"])
        .output()
        .expect("help");
    let h = String::from_utf8_lossy(&out.stdout);
    assert!(
        h.contains("deploy/ledger.sqlite") && h.contains("--allow-root-tasks"),
        "{h}"
    );
}
