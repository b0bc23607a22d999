//! The shared remote cache end to end, through the `charly` binary and a
//! real Docker Distribution registry (Debian's `docker-registry`, started on
//! a free 127.0.0.1 port by each test and stopped by PID).
//!
//! Store A builds the graph fixture (fake runner: builder stages, images)
//! and pushes; a fresh store B with the same remote gets every node from
//! the registry without reaching the runner, with outputs byte-identical to
//! A's. A blob corrupted in the registry's storage is a reported miss and
//! the node is rebuilt; a registry killed mid-build costs hits, never the
//! build.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

mod machine;
use charly_testutil as project_copy;
mod registry;
use machine::{Machine, nodes, outputs, show};
use registry::Registry;

fn tree(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    walkdir::WalkDir::new(dir)
        .into_iter()
        .flatten()
        .filter(|e| e.file_type().is_file())
        .map(|e| {
            (
                e.path()
                    .strip_prefix(dir)
                    .expect("rel")
                    .display()
                    .to_string(),
                std::fs::read(e.path()).expect("read"),
            )
        })
        .collect()
}

#[test]
fn a_fresh_store_gets_every_node_from_the_remote_byte_identical() {
    let Some(reg) = Registry::start() else { return };
    let url = reg.url("charly/e2e");
    let t = tempfile::tempdir().expect("tmp");
    let a = Machine::new(t.path(), "a");
    let b = Machine::new(t.path(), "b");

    let (out, sa) = a.build(Some(&url), &[]);
    assert!(out.status.success(), "{}", show(&out));
    let na = nodes(&sa);
    assert!(na.len() >= 10, "{na:?}");
    assert!(na.values().all(|(_, s)| s == "ran"), "{na:?}");
    let ra = &sa["remote"];
    assert_eq!(ra["pushed"], na.len() as u64, "{ra}");
    assert_eq!(ra["push_failures"], 0, "{ra}");
    assert!(ra["bytes_up"].as_u64().unwrap_or(0) > 0, "{ra}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("remote {url}")), "{stderr}");
    assert!(!a.builds().is_empty());

    let (out, sb) = b.build(Some(&url), &[]);
    assert!(out.status.success(), "{}", show(&out));
    let nb = nodes(&sb);
    assert_eq!(
        na.iter().map(|(id, (k, _))| (id, k)).collect::<Vec<_>>(),
        nb.iter().map(|(id, (k, _))| (id, k)).collect::<Vec<_>>(),
        "the same graph on both machines"
    );
    assert!(nb.values().all(|(_, s)| s == "pulled"), "{nb:?}");
    assert_eq!(sb["totals"]["pulled"], nb.len() as u64);
    assert!(
        b.builds().is_empty(),
        "store B reached the runner: {:?}",
        b.builds()
    );
    let rb = &sb["remote"];
    assert_eq!(rb["hits"], nb.len() as u64, "{rb}");
    assert_eq!(rb["misses"], 0, "{rb}");
    assert_eq!(rb["corrupt"], 0, "{rb}");
    assert!(rb["bytes_down"].as_u64().unwrap_or(0) > 0, "{rb}");
    assert_eq!(
        rb["pushed"], 0,
        "pulled records are never pushed back: {rb}"
    );
    for (id, (key, _)) in &na {
        let oa = outputs(&a.store, key);
        assert!(
            !oa.is_empty() || id.starts_with("plan:"),
            "{id} has outputs"
        );
        assert_eq!(oa, outputs(&b.store, key), "{id}: outputs differ");
    }

    // The generate graph (build directories) too: written files identical.
    for m in [&a, &b] {
        let out = m
            .cmd(Some(&url))
            .args(["box", "generate", "--all", "--out"])
            .arg(m.root.with_file_name("gen"))
            .output()
            .expect("generate");
        assert!(out.status.success(), "{}", show(&out));
    }
    let ga = tree(&a.root.with_file_name("gen"));
    assert!(ga.keys().any(|k| k.ends_with("Containerfile")), "{ga:?}");
    assert_eq!(ga, tree(&b.root.with_file_name("gen")));

    // The remote holds the records; a second B build is all local.
    let out = b
        .cmd(Some(&url))
        .args(["cache", "stats", "--json"])
        .output()
        .expect("stats");
    assert!(out.status.success(), "{}", show(&out));
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(st["remote"]["reachable"], true, "{st}");
    assert!(
        st["remote"]["records"].as_u64().unwrap_or(0) >= na.len() as u64,
        "{st}"
    );
    let (out, s2) = b.build(Some(&url), &[]);
    assert!(out.status.success(), "{}", show(&out));
    assert!(nodes(&s2).values().all(|(_, s)| s == "cached"), "{s2}");
    assert_eq!(s2["remote"]["hits"], 0);
}

#[test]
fn a_corrupt_registry_blob_is_a_reported_miss_and_the_node_rebuilds() {
    let Some(reg) = Registry::start() else { return };
    let url = reg.url("charly/corrupt");
    let t = tempfile::tempdir().expect("tmp");
    let a = Machine::new(t.path(), "a");
    let b = Machine::new(t.path(), "b");
    let (out, sa) = a.build(Some(&url), &[]);
    assert!(out.status.success(), "{}", show(&out));
    let na = nodes(&sa);

    // Corrupt, in place and keeping its size, the registry's copy of the
    // layer blob of `left`'s own first candy (the fake runner's layers are
    // unique per node).
    let id = "layer:left/a-npm";
    let (key, _) = &na[id];
    let layer = outputs(&a.store, key).remove("layer").expect("layer");
    let file = reg
        .blob_files()
        .into_iter()
        .find(|p| std::fs::read(p).is_ok_and(|b| b == layer))
        .expect("the layer blob in the registry's storage");
    let mut bad = layer.clone();
    bad[0] ^= 0xff;
    std::fs::write(&file, &bad).expect("corrupt");

    let (out, sb) = b.build(Some(&url), &[]);
    assert!(out.status.success(), "{}", show(&out));
    let nb = nodes(&sb);
    assert_eq!(nb[id].1, "ran", "{nb:?}");
    assert_eq!(b.builds(), vec![format!("layer {id}")]);
    // Everything else came from the registry (the image names the layer
    // too; B has it now, so it may be assembled again locally instead).
    assert!(
        nb.iter()
            .filter(|(n, _)| *n != id && *n != "image:left")
            .all(|(_, (_, s))| s == "pulled"),
        "{nb:?}"
    );
    let rb = &sb["remote"];
    assert_eq!(rb["corrupt"], 1, "{rb}");
    let errors = rb["errors"].to_string();
    assert!(errors.contains("refused"), "{errors}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("1 corrupt (refused)"), "{stderr}");
    // The rebuilt result is A's, not the registry's garbage.
    assert_eq!(outputs(&b.store, key)["layer"], layer);
    // B's push replaced the registry's corrupt copy (issue 43), under a
    // digest of its own (a registry never overwrites a blob it has): a
    // third machine pulls everything, nothing is refused.
    let c = Machine::new(t.path(), "c");
    let (out, sc) = c.build(Some(&url), &[]);
    assert!(out.status.success(), "{}", show(&out));
    assert_eq!(sc["remote"]["corrupt"], 0, "{}", sc["remote"]);
    assert!(c.builds().is_empty(), "{:?}", c.builds());
    assert_eq!(outputs(&c.store, key)["layer"], layer);
}

#[test]
fn a_registry_killed_mid_build_costs_hits_not_the_build() {
    let Some(mut reg) = Registry::start() else {
        return;
    };
    let url = reg.url("charly/killed");
    let t = tempfile::tempdir().expect("tmp");
    let a = Machine::new(t.path(), "a");
    let summary = t.path().join("a.json");
    let child = a
        .cmd(Some(&url))
        .args([
            "box", "build", "left", "right", "--runner", "fake", "-j", "2",
        ])
        .arg("--summary-json")
        .arg(&summary)
        .env("CHARLY_FAKE_DELAY_MS", "300")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // Kill the registry once the first command node has run (its upload
    // is queued; the nodes after it have the registry gone).
    let t0 = Instant::now();
    while a.builds().is_empty() && t0.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!a.builds().is_empty(), "the build never reached the runner");
    reg.stop();
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success(), "{}", show(&out));
    let s: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&summary).expect("summary")).expect("json");
    let n = nodes(&s);
    assert!(n.values().all(|(_, st)| st == "ran"), "{n:?}");
    let r = &s["remote"];
    assert!(
        r["push_failures"].as_u64().unwrap_or(0) > 0 || r["unavailable"] == true,
        "{r}"
    );
    assert!(!r["errors"].as_array().expect("errors").is_empty(), "{r}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("remote: "), "{stderr}");

    // With --remote-required, an unreachable remote fails at once, clearly.
    let b = Machine::new(t.path(), "b");
    let (out, _) = b.build(Some(&url), &["--remote-required"]);
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--remote-required"), "{stderr}");
    assert!(b.builds().is_empty());
}

#[test]
fn read_only_never_writes_and_cache_push_pull_move_records() {
    let Some(reg) = Registry::start() else { return };
    let url = reg.url("charly/pushpull");
    let t = tempfile::tempdir().expect("tmp");
    let a = Machine::new(t.path(), "a");

    // A read-only build uploads nothing.
    let (out, sa) = a.build(Some(&url), &["--remote-read-only"]);
    assert!(out.status.success(), "{}", show(&out));
    assert_eq!(sa["remote"]["read_only"], true);
    assert_eq!(sa["remote"]["pushed"], 0);
    assert_eq!(sa["remote"]["bytes_up"], 0);
    let records = |m: &Machine| -> u64 {
        let out = m
            .cmd(Some(&url))
            .args(["cache", "stats", "--json"])
            .output()
            .expect("stats");
        assert!(out.status.success(), "{}", show(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        v["remote"]["records"].as_u64().expect("records")
    };
    assert_eq!(records(&a), 0);
    let out = a
        .cmd(Some(&url))
        .args(["--remote-read-only", "cache", "push"])
        .output()
        .expect("push");
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));

    // `cache push` uploads what the read-only build made.
    let out = a
        .cmd(Some(&url))
        .args(["cache", "push", "--json"])
        .output()
        .expect("push");
    assert!(out.status.success(), "{}", show(&out));
    let p: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let n = nodes(&sa).len() as u64;
    assert_eq!(p["pushed"], n, "{p}");
    assert_eq!(records(&a), n);

    // `cache pull` fills a fresh store; a build without the remote is then
    // all cached.
    let c = Machine::new(t.path(), "c");
    let out = c
        .cmd(Some(&url))
        .args([
            "cache", "pull", "left", "right", "--runner", "fake", "--json",
        ])
        .output()
        .expect("pull");
    assert!(out.status.success(), "{}", show(&out));
    let p: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(p["pulled"], n, "{p}");
    let (out, sc) = c.build(None, &[]);
    assert!(out.status.success(), "{}", show(&out));
    assert!(nodes(&sc).values().all(|(_, s)| s == "cached"), "{sc}");
    assert!(c.builds().is_empty(), "{:?}", c.builds());
}
