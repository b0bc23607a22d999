//! `--remote grpc://…`: a REAPI engine's CAS and ActionCache as the shared
//! cache, end to end through the `charly` binary, against a real
//! buildbox-casd on 127.0.0.1 (started per test, stopped by PID).
//!
//! Store A builds the graph fixture (fake runner) and pushes every node; a
//! fresh store B gets every node from the engine without reaching the
//! runner, byte-identical. A blob truncated in the engine's storage is a
//! reported miss and the node is rebuilt, never stored; an unreachable
//! engine costs hits, not the build, unless `--remote-required`.

#[path = "../../engine/tests/common_reapi/mod.rs"]
mod common_reapi;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use charly_cache::{NodeKey, Store};

fn project(dest: &Path) -> PathBuf {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/graph");
    for e in walkdir::WalkDir::new(&src) {
        let e = e.expect("walk");
        let rel = e.path().strip_prefix(&src).expect("rel");
        if rel.starts_with(".build") {
            continue;
        }
        let t = dest.join(rel);
        if e.file_type().is_dir() {
            std::fs::create_dir_all(&t).expect("mkdir");
        } else if e.file_type().is_file() {
            std::fs::copy(e.path(), &t).expect("copy");
        }
    }
    dest.to_path_buf()
}

struct Machine {
    root: PathBuf,
    store: PathBuf,
    log: PathBuf,
}

impl Machine {
    fn new(t: &Path, name: &str) -> Machine {
        Machine {
            root: project(&t.join(name).join("project")),
            store: t.join(name).join("store"),
            log: t.join(name).join("runner.log"),
        }
    }

    fn build(&self, remote: &str, extra: &[&str]) -> (Output, serde_json::Value) {
        let summary = self.store.with_extension("summary.json");
        let _ = std::fs::remove_file(&summary);
        let out = Command::new(assert_cmd::cargo::cargo_bin("charly"))
            .env("NO_COLOR", "1")
            .env("CHARLY_CACHE_DIR", &self.store)
            .env("CHARLY_FAKE_LOG", &self.log)
            .env_remove("CHARLY_REMOTE")
            .env_remove("CHARLY_REMOTE_READ_ONLY")
            .env_remove("CHARLY_REMOTE_REQUIRED")
            .env_remove("CHARLY_REMOTE_TOKEN")
            .arg("-C")
            .arg(&self.root)
            .args(["--remote", remote])
            .args([
                "box", "build", "left", "right", "--runner", "fake", "-j", "2",
            ])
            .args(extra)
            .arg("--summary-json")
            .arg(&summary)
            .output()
            .expect("run charly");
        let s = std::fs::read(&summary)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(serde_json::Value::Null);
        (out, s)
    }

    fn builds(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.starts_with("restore "))
            .map(str::to_string)
            .collect()
    }
}

fn show(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Non-source nodes: id -> (key, state).
fn nodes(s: &serde_json::Value) -> BTreeMap<String, (String, String)> {
    s["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter(|n| n["kind"] != "source")
        .map(|n| {
            (
                n["id"].as_str().expect("id").to_string(),
                (
                    n["key"].as_str().expect("key").to_string(),
                    n["state"].as_str().expect("state").to_string(),
                ),
            )
        })
        .collect()
}

/// A record's outputs: name -> bytes.
fn outputs(store: &Path, key: &str) -> BTreeMap<String, Vec<u8>> {
    let s = Store::open(store).expect("store");
    let k: NodeKey = key.parse().expect("key");
    let rec = s.get_record(&k).expect("read").expect("record");
    rec.outputs
        .iter()
        .map(|(n, o)| {
            (
                n.clone(),
                s.get_blob(&o.digest).expect("blob").expect("present"),
            )
        })
        .collect()
}

#[test]
fn a_fresh_store_gets_every_node_from_the_engine_byte_identical() {
    if !common_reapi::available() {
        return;
    }
    let casd = common_reapi::start(1);
    let url = casd.url.clone();
    let t = tempfile::tempdir().expect("tmp");
    let a = Machine::new(t.path(), "a");
    let b = Machine::new(t.path(), "b");

    let (out, sa) = a.build(&url, &[]);
    assert!(out.status.success(), "{}", show(&out));
    let na = nodes(&sa);
    assert!(na.len() >= 10, "{na:?}");
    assert!(na.values().all(|(_, s)| s == "ran"), "{na:?}");
    let ra = &sa["remote"];
    assert_eq!(ra["pushed"], na.len() as u64, "{ra}");
    assert_eq!(ra["push_failures"], 0, "{ra}");
    assert!(ra["bytes_up"].as_u64().unwrap_or(0) > 0, "{ra}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&format!("remote {url}")),
        "{}",
        show(&out)
    );

    let (out, sb) = b.build(&url, &[]);
    assert!(out.status.success(), "{}", show(&out));
    let nb = nodes(&sb);
    assert_eq!(
        na.iter().map(|(id, (k, _))| (id, k)).collect::<Vec<_>>(),
        nb.iter().map(|(id, (k, _))| (id, k)).collect::<Vec<_>>(),
    );
    assert!(nb.values().all(|(_, s)| s == "pulled"), "{nb:?}");
    assert!(
        b.builds().is_empty(),
        "B reached the runner: {:?}",
        b.builds()
    );
    let rb = &sb["remote"];
    assert_eq!(rb["hits"], nb.len() as u64, "{rb}");
    assert_eq!(rb["corrupt"], 0, "{rb}");
    assert_eq!(rb["pushed"], 0, "pulled records are not pushed back: {rb}");
    for (id, (key, _)) in &na {
        assert_eq!(outputs(&a.store, key), outputs(&b.store, key), "{id}");
    }

    // A's second run: all local, nothing asked of the engine.
    let (out, s2) = a.build(&url, &[]);
    assert!(out.status.success(), "{}", show(&out));
    assert!(nodes(&s2).values().all(|(_, s)| s == "cached"));
    assert_eq!(s2["remote"]["hits"], 0);
    assert_eq!(s2["remote"]["misses"], 0);
}

#[test]
fn a_truncated_blob_is_refused_and_the_node_rebuilt() {
    if !common_reapi::available() {
        return;
    }
    let casd = common_reapi::start(1);
    let t = tempfile::tempdir().expect("tmp");
    let a = Machine::new(t.path(), "a");
    let (out, sa) = a.build(&casd.url, &[]);
    assert!(out.status.success(), "{}", show(&out));

    // The largest output of any node, found by content in casd's storage.
    let (victim, bytes) = nodes(&sa)
        .iter()
        .flat_map(|(id, (key, _))| {
            outputs(&a.store, key)
                .into_values()
                .map(move |b| (id.clone(), b))
        })
        .max_by_key(|(_, b)| b.len())
        .expect("an output");
    assert!(bytes.len() > 16, "{victim}: {} bytes", bytes.len());
    let mut hit = 0;
    for e in walkdir::WalkDir::new(&casd.dir).into_iter().flatten() {
        if e.file_type().is_file() && std::fs::read(e.path()).is_ok_and(|b| b == bytes) {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(e.path())
                .expect("open");
            f.set_len(bytes.len() as u64 / 2).expect("truncate");
            hit += 1;
        }
    }
    assert!(hit > 0, "{victim}'s output not found in casd's storage");

    let b = Machine::new(t.path(), "b");
    let (out, sb) = b.build(&casd.url, &[]);
    assert!(out.status.success(), "{}", show(&out));
    let nb = nodes(&sb);
    let rb = &sb["remote"];
    // buildbox-casd notices the short file itself (NOT_FOUND); an engine
    // that served it would fail charly's digest check: a refusal either way.
    assert!(rb["corrupt"].as_u64().unwrap_or(0) >= 1, "{rb}");
    assert!(rb["misses"].as_u64().unwrap_or(0) >= 1, "{rb}");
    assert!(
        rb["errors"].to_string().contains("refused, nothing used"),
        "{rb}"
    );
    // The rebuilt record went back up and repaired the entry.
    assert!(rb["pushed"].as_u64().unwrap_or(0) >= 1, "{rb}");
    assert_eq!(nb[&victim].1, "ran", "{victim} rebuilt: {nb:?}");
    // What B stored for it is its own build, identical to A's.
    let key = &nb[&victim].0;
    assert_eq!(outputs(&b.store, key), outputs(&a.store, key));
}

#[test]
fn an_unreachable_engine_costs_hits_not_the_build_unless_required() {
    let port = common_reapi::free_port();
    let url = format!("grpc://127.0.0.1:{port}");
    let t = tempfile::tempdir().expect("tmp");
    let a = Machine::new(t.path(), "a");
    let (out, s) = a.build(&url, &[]);
    assert!(out.status.success(), "{}", show(&out));
    assert_eq!(s["remote"]["unavailable"], true, "{}", s["remote"]);
    assert!(nodes(&s).values().all(|(_, st)| st == "ran"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("unreachable"), "{stderr}");

    let b = Machine::new(t.path(), "b");
    let (out, _) = b.build(&url, &["--remote-required"]);
    assert!(!out.status.success(), "{}", show(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("unreachable") && stderr.contains(&url),
        "{stderr}"
    );
    assert!(b.builds().is_empty(), "nothing built: {:?}", b.builds());
}
