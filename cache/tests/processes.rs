//! Several OS processes on one store, and processes killed mid-write.
//!
//! The child processes are this test binary re-executed (`current_exe()`)
//! running only the ignored `child_entry` test, which reads its role from
//! environment variables.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use charly_cache::{BlobDigest, NodeKey, Record, Store};
use common::{content, key, output, text};

const ROLE: &str = "CHARLY_CACHE_TEST_ROLE";
const DIR: &str = "CHARLY_CACHE_TEST_DIR";
const ID: &str = "CHARLY_CACHE_TEST_ID";

fn spawn_child(role: &str, dir: &Path, id: u64, stdout: Stdio) -> Child {
    Command::new(std::env::current_exe().expect("current exe"))
        .args([
            "child_entry",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, role)
        .env(DIR, dir)
        .env(ID, id.to_string())
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn child")
}

/// The child side. Ignored so a normal run skips it; does nothing unless
/// started by one of the tests below.
#[test]
#[ignore = "helper process for the multi-process tests"]
fn child_entry() {
    let (Ok(role), Some(dir), Ok(id)) = (
        std::env::var(ROLE),
        std::env::var_os(DIR).map(PathBuf::from),
        std::env::var(ID),
    ) else {
        return;
    };
    let id: u64 = id.parse().expect("child id");
    match role.as_str() {
        "concurrent" => concurrent_child(&dir, id),
        "crash" => crash_child(&dir, id),
        other => panic!("unknown role {other}"),
    }
}

const SHARED: u64 = 30;
const LOCKED: u64 = 10;
const OWN: u64 = 25;

fn shared_blob(i: u64) -> Vec<u8> {
    text(i, 40_000 + i as usize * 997)
}

fn own_blob(child: u64, i: u64) -> Vec<u8> {
    content(child * 1_000_000 + i, 20_000 + i as usize)
}

fn make_record(node_id: &str, outputs: &[(&str, BlobDigest, usize)]) -> Record {
    Record {
        node_id: node_id.to_string(),
        kind: "test".into(),
        outputs: outputs
            .iter()
            .map(|(n, d, len)| (n.to_string(), output(*d, *len)))
            .collect(),
        duration_ms: 1,
        producer: "fake".into(),
        key_inputs: serde_json::json!({ "node": node_id }),
        created_unix: 1,
        meta: serde_json::json!({}),
    }
}

fn concurrent_child(dir: &Path, id: u64) {
    // Start together so the writes really overlap.
    let go = dir.join("go");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !go.exists() {
        assert!(Instant::now() < deadline, "never told to go");
        std::thread::sleep(Duration::from_millis(2));
    }
    let store = Store::open(&dir.join("store")).expect("open");
    let mut inserted_shared = 0u64;
    let mut built_locked = 0u64;
    for i in 0..SHARED.max(OWN).max(LOCKED) {
        if i < SHARED {
            let b = shared_blob(i);
            let d = store.put_blob(&b).expect("put shared blob");
            let rec = make_record(&format!("shared/{i}"), &[("main", d, b.len())]);
            if store
                .put_record(&key(&format!("shared/{i}")), &rec)
                .expect("put")
            {
                inserted_shared += 1;
            }
        }
        if i < OWN {
            let b = own_blob(id, i);
            let (d, len) = store.put_blob_reader(&b[..]).expect("put own blob");
            let s = shared_blob(i % SHARED);
            let sd = store.put_blob(&s).expect("put shared blob");
            let rec = make_record(
                &format!("own/{id}/{i}"),
                &[("main", d, len as usize), ("shared", sd, s.len())],
            );
            assert!(
                store
                    .put_record(&key(&format!("own/{id}/{i}")), &rec)
                    .expect("put")
            );
        }
        if i < LOCKED {
            // The engine's protocol: look up, lock, look up again, build.
            let k = key(&format!("locked/{i}"));
            if store.get_record(&k).expect("get").is_none() {
                let _lock = store.lock_key(&k).expect("lock");
                if store.get_record(&k).expect("get").is_none() {
                    built_locked += 1;
                    std::thread::sleep(Duration::from_millis(20));
                    let b = text(500 + i, 10_000);
                    let d = store.put_blob(&b).expect("put");
                    let rec = make_record(&format!("locked/{i}"), &[("main", d, b.len())]);
                    assert!(store.put_record(&k, &rec).expect("put"), "built twice");
                }
            }
        }
    }
    fs::write(
        dir.join(format!("result-{id}")),
        format!("{inserted_shared} {built_locked}"),
    )
    .expect("write result");
}

fn wait_ok(child: Child, what: &str) {
    let out = child.wait_with_output().expect("wait");
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn four_processes_share_one_store() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let children: Vec<Child> = (0..4)
        .map(|id| spawn_child("concurrent", tmp.path(), id, Stdio::null()))
        .collect();
    fs::write(tmp.path().join("go"), b"").expect("go");
    for (id, child) in children.into_iter().enumerate() {
        wait_ok(child, &format!("child {id}"));
    }

    let (mut inserted, mut built) = (0, 0);
    for id in 0..4 {
        let r = fs::read_to_string(tmp.path().join(format!("result-{id}"))).expect("result");
        let (a, b) = r.split_once(' ').expect("two numbers");
        inserted += a.parse::<u64>().expect("n");
        built += b.parse::<u64>().expect("n");
    }
    assert_eq!(
        inserted, SHARED,
        "every shared record inserted exactly once"
    );
    assert_eq!(built, LOCKED, "lock_key let a node be built twice");

    let store = Store::open(&tmp.path().join("store")).expect("open");
    let report = store.verify(false).expect("verify");
    assert!(report.is_clean(), "{report:?}");
    let stats = store.stats().expect("stats");
    assert_eq!(stats.records, SHARED + LOCKED + 4 * OWN);
    assert_eq!(stats.blobs, SHARED + LOCKED + 4 * OWN);
    assert_eq!(report.blobs_checked, stats.blobs);
    for i in 0..SHARED {
        let rec = store
            .get_record(&key(&format!("shared/{i}")))
            .expect("get")
            .expect("shared record present");
        let blob = store.get_blob(&rec.outputs["main"].digest).expect("get");
        assert_eq!(blob.map(Vec::from), Some(shared_blob(i)));
    }
    for id in 0..4 {
        for i in 0..OWN {
            let rec = store
                .get_record(&key(&format!("own/{id}/{i}")))
                .expect("get")
                .expect("own record present");
            assert_eq!(
                store
                    .get_blob(&rec.outputs["main"].digest)
                    .expect("get")
                    .map(Vec::from),
                Some(own_blob(id, i))
            );
        }
    }
}

// --- crash safety -------------------------------------------------------

/// Content of the main output of crash-test record `i`: every fifth one is
/// large, so a kill often lands in the middle of compressing or renaming.
/// Cut from one precomputed buffer so that making it costs next to nothing
/// and the child spends its time inside the store.
fn crash_blob(i: u64) -> Vec<u8> {
    static BASE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    let base = BASE.get_or_init(|| text(7, 1_700_000));
    let len = if i.is_multiple_of(5) {
        1_500_000 + (i as usize % 7) * 10_000
    } else {
        8_000 + (i as usize % 13) * 100
    };
    let off = (i as usize % 97) * 1000;
    let mut v = i.to_le_bytes().to_vec();
    v.extend_from_slice(&base[off..off + len]);
    v
}

fn crash_child(dir: &Path, id: u64) {
    let shared = text(u64::MAX, 4096);
    let _ = crash_blob(0);
    let store = Store::open(&dir.join("store")).expect("open");
    fs::write(dir.join(format!("started-{id}")), b"").expect("marker");
    for i in id * 100_000.. {
        let main = crash_blob(i);
        let d = if i.is_multiple_of(2) {
            store.put_blob(&main).expect("put")
        } else {
            store.put_blob_reader(&main[..]).expect("put reader").0
        };
        let sd = store.put_blob(&shared).expect("put shared");
        let mut rec = make_record(
            &format!("crash/{}", i % 50),
            &[("main", d, main.len()), ("shared", sd, shared.len())],
        );
        rec.meta = serde_json::json!({ "i": i });
        store
            .put_record(&key(&format!("crash/{i}")), &rec)
            .expect("put record");
        if i.is_multiple_of(10) {
            store
                .set_root(&format!("box:{}", i % 3), &key(&format!("crash/{i}")))
                .expect("root");
        }
        if i.is_multiple_of(25) {
            // Keep the store small and get killed inside GC now and then.
            store.gc(8 * 1024 * 1024).expect("gc");
        }
        if i.is_multiple_of(7) {
            let _ = store
                .get_record(&key(&format!("crash/{}", i - 1)))
                .expect("get");
        }
    }
}

/// Every path under a store's `tmp/` (files in session directories and the
/// entries of `tmp/` that are not directories).
fn tmp_entries(tmp: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    // Absent when a child was killed before it opened the store.
    let Ok(entries) = fs::read_dir(tmp) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(fs::read_dir(&p).expect("list").flatten().map(|f| f.path()));
        } else {
            out.push(p);
        }
    }
    out
}

/// Every record key in the index, read directly from SQLite.
fn all_record_keys(store_dir: &Path) -> Vec<NodeKey> {
    let conn = rusqlite::Connection::open(store_dir.join("index.db")).expect("open index");
    let mut st = conn.prepare("SELECT key FROM records").expect("prepare");
    st.query_map([], |r| r.get::<_, String>(0))
        .expect("query")
        .map(|k| k.expect("row").parse().expect("key hex"))
        .collect()
}

#[test]
fn processes_killed_mid_write_leave_a_usable_store() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store_dir = tmp.path().join("store");
    // (wait for the child to have opened the store?, then kill after ms)
    let moments: [(bool, u64); 16] = [
        (false, 0),
        (false, 5),
        (false, 30),
        (true, 0),
        (true, 1),
        (true, 2),
        (true, 3),
        (true, 5),
        (true, 8),
        (true, 12),
        (true, 20),
        (true, 33),
        (true, 60),
        (true, 110),
        (true, 200),
        (true, 400),
    ];
    let mut rounds_with_stale_files = 0;
    let mut rounds_with_partial_blobs = 0;
    let mut max_records = 0;
    for (round, (wait_for_start, delay_ms)) in moments.into_iter().enumerate() {
        let id = round as u64 + 1;
        let mut child = spawn_child("crash", tmp.path(), id, Stdio::null());
        if wait_for_start {
            let marker = tmp.path().join(format!("started-{id}"));
            let deadline = Instant::now() + Duration::from_secs(60);
            while !marker.exists() {
                if let Ok(Some(status)) = child.try_wait() {
                    let mut err = String::new();
                    if let Some(mut e) = child.stderr.take() {
                        let _ = std::io::Read::read_to_string(&mut e, &mut err);
                    }
                    panic!("crash child exited early: {status}\n{err}");
                }
                assert!(Instant::now() < deadline, "child never started");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        std::thread::sleep(Duration::from_millis(delay_ms));
        child.kill().expect("SIGKILL child");
        child.wait().expect("reap child");

        // What the dead child left in tmp/: its session lock, and partial
        // blobs in its session directory.
        let leftovers = tmp_entries(&store_dir.join("tmp"));
        if !leftovers.is_empty() {
            rounds_with_stale_files += 1;
        }
        if leftovers
            .iter()
            .any(|p| p.parent() != Some(&store_dir.join("tmp")))
        {
            rounds_with_partial_blobs += 1;
        }
        let store = Store::open(&store_dir).expect("open after crash");
        // The next opener removed them (only its own session is left), and
        // verify does not count leftovers of the dead as a problem.
        let own = tmp_entries(&store_dir.join("tmp"));
        assert!(
            own.len() <= 2 && !own.iter().any(|p| leftovers.contains(p)),
            "round {round}: dead session's files survived the next open: {own:?}"
        );
        let repair = store.verify(true).expect("verify --repair");
        assert!(repair.stale_temp_files.is_empty(), "{repair:?}");
        eprintln!("round {round}: {repair:?}");
        let after = store.verify(false).expect("verify");
        assert!(
            after.is_clean(),
            "round {round}: not clean after repair: {after:?}"
        );

        // Every record that exists is fully readable and has the right bytes.
        let keys = all_record_keys(&store_dir);
        max_records = max_records.max(keys.len());
        for k in keys {
            let rec = store
                .get_record(&k)
                .expect("get")
                .unwrap_or_else(|| panic!("round {round}: record {k} present but unreadable"));
            if rec.node_id.starts_with("parent/") {
                continue;
            }
            let i = rec.meta["i"].as_u64().expect("meta.i");
            assert_eq!(k, key(&format!("crash/{i}")));
            let main = store.get_blob(&rec.outputs["main"].digest).expect("get");
            assert_eq!(
                main.map(Vec::from),
                Some(crash_blob(i)),
                "round {round}: record {i} content"
            );
            assert!(
                store
                    .get_blob(&rec.outputs["shared"].digest)
                    .expect("get")
                    .is_some()
            );
        }
        // And the store keeps working for new writes.
        let mine = format!("parent/{round}");
        let b = text(round as u64, 1000);
        let d = store.put_blob(&b).expect("put");
        let rec = make_record(&mine, &[("main", d, b.len())]);
        assert!(store.put_record(&key(&mine), &rec).expect("put"));
        assert_eq!(store.get_record(&key(&mine)).expect("get"), Some(rec));
        let roots: BTreeMap<String, NodeKey> = store.roots().expect("roots").into_iter().collect();
        for (name, k) in roots {
            // Roots may point at records that were never committed (the
            // child died in between); that is allowed, but a committed one
            // must be readable.
            if let Some(rec) = store.get_record(&k).expect("get") {
                assert!(!rec.outputs.is_empty(), "root {name}");
            }
        }
    }
    assert!(max_records > 0, "the children never committed a record");
    assert!(
        rounds_with_stale_files > 0,
        "no round left a dead session behind: kills never hit a live store"
    );
    assert!(
        rounds_with_partial_blobs > 0,
        "no kill landed while a blob was being written"
    );
}
