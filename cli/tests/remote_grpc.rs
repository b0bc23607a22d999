//! `--remote grpc://…`: a REAPI engine's CAS and ActionCache as the shared
//! cache, end to end through the `charly` binary, against a real
//! buildbox-casd on 127.0.0.1 (started per test, stopped by PID).
//!
//! Store A builds the graph fixture (fake runner) and pushes every node; a
//! fresh store B gets every node from the engine without reaching the
//! runner, byte-identical. A blob truncated in the engine's storage is a
//! reported miss and the node is rebuilt, never stored; an unreachable
//! engine costs hits, not the build, unless `--remote-required`.

use charly_testutil::casd as common_reapi;

mod machine;
use charly_testutil as project_copy;
use machine::{Machine, nodes, outputs, show};

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

    let (out, sa) = a.build(Some(&url), &[]);
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

    let (out, sb) = b.build(Some(&url), &[]);
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
    let (out, s2) = a.build(Some(&url), &[]);
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
    let (out, sa) = a.build(Some(&casd.url), &[]);
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
    let (out, sb) = b.build(Some(&casd.url), &[]);
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
    let port = charly_testutil::free_port();
    let url = format!("grpc://127.0.0.1:{port}");
    let t = tempfile::tempdir().expect("tmp");
    let a = Machine::new(t.path(), "a");
    let (out, s) = a.build(Some(&url), &[]);
    assert!(out.status.success(), "{}", show(&out));
    assert_eq!(s["remote"]["unavailable"], true, "{}", s["remote"]);
    assert!(nodes(&s).values().all(|(_, st)| st == "ran"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("unreachable"), "{stderr}");

    let b = Machine::new(t.path(), "b");
    let (out, _) = b.build(Some(&url), &["--remote-required"]);
    assert!(!out.status.success(), "{}", show(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("unreachable") && stderr.contains(&url),
        "{stderr}"
    );
    assert!(b.builds().is_empty(), "nothing built: {:?}", b.builds());
}
