//! Behaviour of one store used from one process (possibly many threads).

mod common;

use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use charly_cache::{BlobDigest, CacheError, NodeKey, Output, Record, SeenBlobs, Store};
use common::{content, key, output, record, text};
use proptest::prelude::*;

fn blob_file(store: &Store, d: &BlobDigest) -> PathBuf {
    let hex = d.to_hex();
    store.dir().join("blobs").join(&hex[..2]).join(hex)
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(files_under(&p));
            } else {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// A reader that hands out at most `n` bytes per call.
struct Dribble<'a>(&'a [u8], usize);

impl Read for Dribble<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.0.len().min(self.1).min(buf.len());
        buf[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        Ok(n)
    }
}

#[test]
fn store_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Store>();
}

#[test]
fn blobs_round_trip_and_puts_are_idempotent() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = Store::open(tmp.path()).expect("open");
    // Empty, small, several streaming chunks long, and past the size from
    // which reads land in a huge-page mapping instead of a `Vec`.
    let huge = text(2, 9 * 1024 * 1024 + 5);
    for data in [
        Vec::new(),
        b"hello".to_vec(),
        text(1, 3 * 1024 * 1024 + 17),
        huge.clone(),
    ] {
        let d = store.put_blob(&data).expect("put");
        assert_eq!(d, BlobDigest::of(&data));
        assert!(store.has_blob(&d));
        assert_eq!(store.get_blob(&d).expect("get").as_deref(), Some(&data[..]));
        let on_disk = fs::read(blob_file(&store, &d)).expect("blob file");
        assert_eq!(
            zstd::decode_all(&on_disk[..]).expect("valid zstd"),
            data,
            "blobs are plain zstd frames"
        );
        assert_eq!(store.put_blob(&data).expect("put again"), d);
        assert_eq!(fs::read(blob_file(&store, &d)).expect("blob file"), on_disk);
    }
    let big = text(1, 3 * 1024 * 1024 + 17);
    let stats = store.stats().expect("stats");
    assert_eq!(stats.blobs, 4);
    assert_eq!(stats.logical_bytes, 5 + (big.len() + huge.len()) as u64);
    assert!(
        stats.compressed_bytes < stats.logical_bytes / 2,
        "{stats:?}"
    );
    assert!(!store.has_blob(&BlobDigest::of(b"never stored")));
    assert_eq!(
        store
            .get_blob(&BlobDigest::of(b"never stored"))
            .expect("get"),
        None
    );
}

#[test]
fn every_put_path_writes_identical_bytes() {
    let data = text(2, 2 * 1024 * 1024 + 333);
    let src_dir = tempfile::tempdir().expect("tempdir");
    let src = src_dir.path().join("input.tar");
    fs::write(&src, &data).expect("write input");

    let mut files = Vec::new();
    for how in 0..4 {
        let tmp = tempfile::tempdir().expect("tempdir");
        let store = Store::open(tmp.path()).expect("open");
        let (d, len) = match how {
            0 => (store.put_blob(&data).expect("put"), data.len() as u64),
            1 => store
                .put_blob_reader(Dribble(&data, 7919))
                .expect("put reader"),
            2 => (
                store.put_derived_blob(&data).expect("put derived"),
                data.len() as u64,
            ),
            _ => store.put_blob_file(&src).expect("put file"),
        };
        assert_eq!(d, BlobDigest::of(&data));
        assert_eq!(len, data.len() as u64);
        files.push(fs::read(blob_file(&store, &d)).expect("blob file"));
    }
    assert_eq!(
        files[0], files[1],
        "reader output differs from bytes output"
    );
    assert_eq!(
        files[0], files[2],
        "derived output differs from bytes output"
    );
    assert_eq!(files[0], files[3], "file output differs from bytes output");
}

#[test]
fn put_blob_file_reports_missing_source() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = Store::open(tmp.path()).expect("open");
    let err = store
        .put_blob_file(&tmp.path().join("nope"))
        .expect_err("missing file");
    assert!(matches!(err, CacheError::Io { .. }), "{err}");
}

/// Overwrites the blob file of `d` with `bytes`, bypassing the store.
fn tamper(store: &Store, d: &BlobDigest, f: impl FnOnce(&mut Vec<u8>)) {
    let path = blob_file(store, d);
    let mut bytes = fs::read(&path).expect("read blob");
    f(&mut bytes);
    fs::write(&path, bytes).expect("write blob");
}

#[test]
fn corrupt_blobs_are_quarantined_and_read_as_misses() {
    // Small reads decode into a `Vec`, large ones into a huge-page mapping.
    for len in [200_000, 5 * 1024 * 1024 + 3] {
        let tmp = tempfile::tempdir().expect("tempdir");
        let store = Store::open(tmp.path()).expect("open");
        let data = text(3, len);
        type Damage = fn(&mut Vec<u8>);
        let damages: [(&str, Damage); 5] = [
            // What a power loss can leave of an unsynced (derived) blob.
            ("emptied", |b| b.clear()),
            ("flipped byte", |b| {
                let mid = b.len() / 2;
                b[mid] ^= 0x40;
            }),
            ("truncated", |b| b.truncate(b.len() - 10)),
            ("not zstd", |b| *b = b"plain text".to_vec()),
            // A perfectly valid frame, of the wrong content: only the digest
            // check can catch this one.
            ("valid frame, wrong content", |b| {
                let mut other = zstd::decode_all(&b[..]).expect("decode");
                other[0] ^= 1;
                *b = zstd::encode_all(&other[..], 3).expect("encode");
            }),
        ];
        for (i, (what, damage)) in damages.into_iter().enumerate() {
            let d = store.put_blob(&data).expect("put");
            let rec = record(&store, &format!("n{i}"), &[&data]);
            assert!(store.put_record(&key(what), &rec).expect("put record"));
            tamper(&store, &d, damage);

            assert_eq!(
                store.get_blob(&d).expect("get"),
                None,
                "{what}: bad bytes served"
            );
            assert!(!store.has_blob(&d), "{what}: not quarantined");
            assert_eq!(
                store.stats().expect("stats").quarantined,
                i as u64 + 1,
                "{what}"
            );
            assert_eq!(
                store.get_record(&key(what)).expect("get record"),
                None,
                "{what}: record with a quarantined blob must be a miss"
            );
            let dest = tmp.path().join("out.bin");
            assert!(!store.copy_blob_to(&d, &dest).expect("copy"), "{what}");
        }
        // Storing the content again heals the store.
        let d = store.put_blob(&data).expect("put");
        assert_eq!(store.get_blob(&d).expect("get").as_deref(), Some(&data[..]));
    }
}

#[test]
fn copy_blob_to_is_verified_and_atomic() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = Store::open(tmp.path().join("store").as_path()).expect("open");
    let out_dir = tmp.path().join("out");
    fs::create_dir(&out_dir).expect("mkdir");
    let data = text(4, 2 * 1024 * 1024 + 5);
    let d = store.put_blob(&data).expect("put");

    let dest = out_dir.join("artifact.tar");
    assert!(store.copy_blob_to(&d, &dest).expect("copy"));
    assert_eq!(fs::read(&dest).expect("read"), data);

    let exe = out_dir.join("tool");
    let out = Output {
        digest: d,
        size: data.len() as u64,
        mode: 0o100_755,
    };
    assert!(store.copy_output_to(&out, &exe).expect("copy output"));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| fs::metadata(p).expect("meta").permissions().mode() & 0o7777;
        assert_eq!(mode(&dest), 0o644);
        assert_eq!(mode(&exe), 0o755);
    }

    // A miss leaves the destination alone.
    fs::write(&dest, b"previous").expect("write");
    assert!(
        !store
            .copy_blob_to(&BlobDigest::of(b"absent"), &dest)
            .expect("copy")
    );
    // So does a corrupt blob, and no temp file is left behind.
    tamper(&store, &d, |b| {
        let n = b.len() - 100;
        b[n] ^= 0xff;
    });
    assert!(!store.copy_blob_to(&d, &dest).expect("copy corrupt"));
    assert_eq!(fs::read(&dest).expect("read"), b"previous");
    let mut left: Vec<_> = files_under(&out_dir)
        .into_iter()
        .map(|p| p.file_name().expect("name").to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["artifact.tar", "tool"]);
}

#[test]
fn records_first_writer_wins_and_need_their_blobs() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = Store::open(tmp.path()).expect("open");
    let k = key("fragment:fedora/ripgrep");
    let mut rec = record(
        &store,
        "fragment:fedora/ripgrep",
        &[b"RUN dnf install ripgrep", b"x"],
    );
    rec.meta = serde_json::json!({ "image": "sha256:abc" });
    assert_eq!(store.get_record(&k).expect("get"), None);
    assert!(store.put_record(&k, &rec).expect("put"));
    assert_eq!(store.get_record(&k).expect("get"), Some(rec.clone()));

    let mut other = rec.clone();
    other.producer = "second writer".into();
    assert!(!store.put_record(&k, &other).expect("put again"));
    assert_eq!(
        store.get_record(&k).expect("get").expect("hit").producer,
        "fake"
    );
    assert_eq!(store.stats().expect("stats").records, 1);

    // Outputs must name stored blobs, with the right size.
    let mut missing = rec.clone();
    missing
        .outputs
        .insert("ghost".into(), output(BlobDigest::of(b"ghost"), 5));
    let err = store
        .put_record(&key("other"), &missing)
        .expect_err("missing blob");
    assert!(
        matches!(err, CacheError::MissingBlob { ref output, .. } if output == "ghost"),
        "{err}"
    );
    let mut wrong_size = rec.clone();
    wrong_size.outputs.get_mut("out0").expect("out0").size += 1;
    let err = store
        .put_record(&key("other"), &wrong_size)
        .expect_err("wrong size");
    assert!(
        matches!(err, CacheError::OutputSizeMismatch { .. }),
        "{err}"
    );
    assert_eq!(store.get_record(&key("other")).expect("get"), None);

    // A record whose blob vanished is a miss, and may be replaced.
    fs::remove_file(blob_file(&store, &rec.outputs["out1"].digest)).expect("rm");
    assert_eq!(store.get_record(&k).expect("get"), None);
    let again = record(
        &store,
        "fragment:fedora/ripgrep",
        &[b"RUN dnf install ripgrep", b"y"],
    );
    assert!(store.put_record(&k, &again).expect("replace broken"));
    assert_eq!(store.get_record(&k).expect("get"), Some(again));
}

/// The batch lookup answers as a lookup of each key does: present, never
/// stored, a blob gone, and a record whose outputs do not decode (dropped).
#[test]
fn has_records_answers_as_has_record_does() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = Store::open(tmp.path()).expect("open");
    let names = ["a", "b", "gone", "never", "damaged"];
    for n in ["a", "b", "gone", "damaged"] {
        let rec = record(&store, n, &[n.as_bytes(), b"shared"]);
        assert!(store.put_record(&key(n), &rec).expect("put"));
    }
    let gone = record(&store, "gone", &[b"gone", b"shared"]);
    fs::remove_file(blob_file(&store, &gone.outputs["out0"].digest)).expect("rm");
    let db = rusqlite::Connection::open(tmp.path().join("index.db")).expect("db");
    db.execute(
        "UPDATE records SET outputs = 'not json' WHERE key = ?1",
        [key("damaged").to_hex()],
    )
    .expect("damage");
    let keys: Vec<NodeKey> = names.iter().map(|n| key(n)).collect();
    assert_eq!(
        store.has_records(&keys, &SeenBlobs::default()),
        [true, true, false, false, false]
    );
    assert_eq!(
        store.stats().expect("stats").records,
        3,
        "the damaged one dropped"
    );
    let one_by_one: Vec<bool> = keys
        .iter()
        .map(|k| store.has_record(k).expect("has"))
        .collect();
    assert_eq!(store.has_records(&keys, &SeenBlobs::default()), one_by_one);
    // Repeated and empty batches.
    assert_eq!(
        store.has_records(&[keys[0], keys[3], keys[0]], &SeenBlobs::default()),
        [true, false, true]
    );
    assert!(store.has_records(&[], &SeenBlobs::default()).is_empty());
    // Lookups sharing `seen` look for each blob once: one removed after it
    // was seen still counts there (its reader meets the removal and runs
    // the node again); lookups that did not see it miss.
    let seen = SeenBlobs::default();
    assert_eq!(store.has_records(&keys[..1], &seen), [true]);
    let a = record(&store, "a", &[b"a", b"shared"]);
    fs::remove_file(blob_file(&store, &a.outputs["out0"].digest)).expect("rm");
    assert_eq!(store.has_records(&keys[..1], &seen), [true]);
    assert_eq!(
        store.has_records(&keys[..1], &SeenBlobs::default()),
        [false]
    );
}

#[test]
fn read_record_leaves_out_the_key_inputs_and_the_blob_lookups() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = Store::open(tmp.path()).expect("open");
    let k = key("containerfile:fedora");
    let mut rec = record(&store, "containerfile:fedora", &[b"FROM x", b"a file"]);
    rec.key_inputs = serde_json::json!({ "values": { "tags": "fedora" } });
    rec.meta = serde_json::json!({ "dir": ".build/fedora" });
    assert_eq!(store.read_record(&k).expect("read"), None);
    assert!(store.put_record(&k, &rec).expect("put"));
    let light = Record {
        key_inputs: serde_json::Value::Null,
        ..rec.clone()
    };
    assert_eq!(store.read_record(&k).expect("read"), Some(light.clone()));
    // A blob gone: a miss for get_record, the reader's business here (its
    // get_blob answers None).
    let gone = rec.outputs["out1"].digest;
    fs::remove_file(blob_file(&store, &gone)).expect("rm");
    assert_eq!(store.get_record(&k).expect("get"), None);
    assert_eq!(store.read_record(&k).expect("read"), Some(light));
    assert_eq!(store.get_blob(&gone).expect("get blob"), None);
}

/// A store in `dir` holding one record, closed again: its key and record.
fn one_record(dir: &Path) -> (NodeKey, Record) {
    let k = key("containerfile:fedora");
    let store = Store::open(dir).expect("open");
    let rec = record(&store, "containerfile:fedora", &[b"FROM x", b"a file"]);
    assert!(store.put_record(&k, &rec).expect("put"));
    (k, rec)
}

#[test]
fn opening_drops_the_digest_index_of_older_stores() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (k, rec) = one_record(tmp.path());
    let db = tmp.path().join("index.db");
    let indexes = || -> Vec<String> {
        let c = rusqlite::Connection::open(&db).expect("sqlite");
        let mut st = c
            .prepare(
                "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'record_blobs'",
            )
            .expect("prepare");
        st.query_map([], |r| r.get(0))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows")
    };
    // What a store made by an earlier charly has.
    rusqlite::Connection::open(&db)
        .expect("sqlite")
        .execute_batch("CREATE INDEX record_blobs_digest ON record_blobs (digest)")
        .expect("create index");
    assert!(indexes().contains(&"record_blobs_digest".to_string()));
    let store = Store::open(tmp.path()).expect("reopen");
    assert!(!indexes().contains(&"record_blobs_digest".to_string()));
    assert_eq!(store.get_record(&k).expect("get"), Some(rec));
}

/// The index of a store made by a charly of schema 1: each record's last
/// access in its row, indexed.
fn make_schema_1(db: &Path, last_access: i64) {
    rusqlite::Connection::open(db)
        .expect("sqlite")
        .execute_batch(&format!(
            "BEGIN;
             CREATE TABLE records_v1 (
                 key TEXT PRIMARY KEY, node_id TEXT NOT NULL, kind TEXT NOT NULL,
                 outputs TEXT NOT NULL, duration_ms INTEGER NOT NULL,
                 producer TEXT NOT NULL, key_inputs TEXT NOT NULL,
                 created_unix INTEGER NOT NULL, meta TEXT NOT NULL,
                 last_access INTEGER NOT NULL);
             INSERT INTO records_v1 SELECT key, node_id, kind, outputs, duration_ms,
                 producer, key_inputs, created_unix, meta, {last_access} FROM records;
             DROP TABLE records;
             ALTER TABLE records_v1 RENAME TO records;
             CREATE INDEX records_node_id ON records (node_id, created_unix);
             CREATE INDEX records_last_access ON records (last_access);
             DROP TABLE record_access;
             PRAGMA user_version = 1;
             COMMIT;"
        ))
        .expect("schema 1");
}

fn access_of(db: &Path, k: &NodeKey) -> Option<i64> {
    use rusqlite::OptionalExtension;
    rusqlite::Connection::open(db)
        .expect("sqlite")
        .query_row(
            "SELECT last_access FROM record_access WHERE key = ?1",
            [k.to_hex()],
            |r| r.get(0),
        )
        .optional()
        .expect("query")
}

#[test]
fn opening_a_schema_1_store_moves_access_times_out_of_the_records() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let db = tmp.path().join("index.db");
    let (k, rec) = one_record(tmp.path());
    make_schema_1(&db, 1000);
    let store = Store::open(tmp.path()).expect("reopen");
    let c = rusqlite::Connection::open(&db).expect("sqlite");
    let version: i64 = c
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .expect("version");
    assert_eq!(version, 2);
    let columns: Vec<String> = c
        .prepare("SELECT name FROM pragma_table_info('records')")
        .expect("prepare")
        .query_map([], |r| r.get(0))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    assert!(!columns.contains(&"last_access".to_string()), "{columns:?}");
    assert!(columns.contains(&"outputs".to_string()), "{columns:?}");
    // The access time came along, and the record is whole.
    assert_eq!(access_of(&db, &k), Some(1000));
    assert_eq!(store.get_record(&k).expect("get"), Some(rec.clone()));
    store.flush().expect("flush");
    assert!(access_of(&db, &k).expect("row") > 1000, "the read counts");

    // A record that lost its access row (edited by hand) is still found,
    // and the next access gives it one again.
    c.execute("DELETE FROM record_access", []).expect("delete");
    drop(store);
    let store = Store::open(tmp.path()).expect("reopen");
    assert!(store.has_record(&k).expect("has"));
    store.flush().expect("flush");
    assert!(access_of(&db, &k).is_some());
    assert_eq!(store.get_record(&k).expect("get"), Some(rec));
}

#[test]
fn last_record_for_returns_the_newest_build_of_a_node() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = Store::open(tmp.path()).expect("open");
    assert!(
        store
            .last_record_for("box:fedora")
            .expect("query")
            .is_none()
    );
    let mut newer = record(&store, "box:fedora", &[b"v2"]);
    newer.created_unix = 200;
    newer.key_inputs = serde_json::json!({ "template": "v2" });
    let mut older = record(&store, "box:fedora", &[b"v1"]);
    older.created_unix = 100;
    // Insert the newer one first: order is by creation time.
    assert!(store.put_record(&key("k2"), &newer).expect("put"));
    assert!(store.put_record(&key("k1"), &older).expect("put"));
    let unrelated = record(&store, "box:ubuntu", &[b"u"]);
    assert!(store.put_record(&key("k3"), &unrelated).expect("put"));

    let (k, rec) = store
        .last_record_for("box:fedora")
        .expect("query")
        .expect("found");
    assert_eq!(k, key("k2"));
    assert_eq!(rec.key_inputs, serde_json::json!({ "template": "v2" }));
    // Same creation second: the later insert wins.
    let mut same_time = record(&store, "box:fedora", &[b"v3"]);
    same_time.created_unix = 200;
    assert!(store.put_record(&key("k4"), &same_time).expect("put"));
    let (k, _) = store
        .last_record_for("box:fedora")
        .expect("q")
        .expect("found");
    assert_eq!(k, key("k4"));
}

#[test]
fn roots_are_listed_replaced_and_removed() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = Store::open(tmp.path()).expect("open");
    store.set_root("deploy:web", &key("a")).expect("root");
    store.set_root("box:fedora", &key("b")).expect("root");
    store.set_root("deploy:web", &key("c")).expect("replace");
    assert_eq!(
        store.roots().expect("roots"),
        vec![
            ("box:fedora".to_string(), key("b")),
            ("deploy:web".to_string(), key("c"))
        ]
    );
    store.remove_root("box:fedora").expect("remove");
    store.remove_root("never-set").expect("remove absent");
    assert_eq!(store.stats().expect("stats").roots, 1);
    assert!(matches!(
        store.set_root("", &key("a")),
        Err(CacheError::EmptyRootName)
    ));
}

#[test]
fn key_lock_serializes_threads() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = Store::open(tmp.path()).expect("open");
    let k = key("builder-stage:npm");
    let first_done = AtomicBool::new(false);
    let held = store.lock_key(&k).expect("lock");
    assert_eq!(held.key(), k);
    std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            let _second = store.lock_key(&k).expect("lock");
            first_done.load(Ordering::SeqCst)
        });
        std::thread::sleep(Duration::from_millis(200));
        first_done.store(true, Ordering::SeqCst);
        drop(held);
        assert!(
            waiter.join().expect("join"),
            "second locker got in before the first released"
        );
    });
    // A different key is not blocked by a held one.
    let _a = store.lock_key(&k).expect("lock");
    let _b = store.lock_key(&key("other")).expect("lock other");
}

#[test]
fn many_threads_share_one_store() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = Store::open(tmp.path()).expect("open");
    let threads = 8u64;
    let per = 40u64;
    let inserted = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (store, inserted) = (&store, &inserted);
            s.spawn(move || {
                for i in 0..per {
                    // Same content and same keys from every thread ...
                    let shared = content(i, 1000 + i as usize);
                    let rec = record(store, &format!("shared/{i}"), &[&shared]);
                    if store
                        .put_record(&key(&format!("shared/{i}")), &rec)
                        .expect("put")
                    {
                        inserted.fetch_add(1, Ordering::SeqCst);
                    }
                    // ... and some of each thread's own.
                    let own = content(1000 * (t + 1) + i, 5000);
                    let rec = record(store, &format!("own/{t}/{i}"), &[&own, &shared]);
                    assert!(
                        store
                            .put_record(&key(&format!("own/{t}/{i}")), &rec)
                            .expect("put")
                    );
                    assert_eq!(
                        store
                            .get_blob(&BlobDigest::of(&own))
                            .expect("get")
                            .map(Vec::from),
                        Some(own)
                    );
                }
            });
        }
    });
    assert_eq!(
        inserted.load(Ordering::SeqCst),
        per,
        "each shared record inserted once"
    );
    let stats = store.stats().expect("stats");
    assert_eq!(stats.records, per + threads * per);
    assert_eq!(stats.blobs, per + threads * per);
    let report = store.verify(false).expect("verify");
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.blobs_checked, per + threads * per);
    assert_eq!(report.orphan_blobs, 0);
}

#[test]
fn verify_finds_and_repairs_damage() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = Store::open(tmp.path()).expect("open");
    let good = record(&store, "good", &[&text(5, 10_000)]);
    assert!(store.put_record(&key("good"), &good).expect("put"));
    let victim = record(&store, "victim", &[&text(6, 10_000)]);
    assert!(store.put_record(&key("victim"), &victim).expect("put"));
    let gone = record(&store, "gone", &[&text(7, 10_000)]);
    assert!(store.put_record(&key("gone"), &gone).expect("put"));
    let orphan = store.put_blob(b"nobody records me").expect("put");
    let clean = store.verify(false).expect("verify");
    assert!(clean.is_clean(), "{clean:?}");
    assert_eq!((clean.blobs_checked, clean.orphan_blobs), (4, 1));

    // Damage: a flipped byte, a deleted blob, a stray file, a blob file the
    // index does not know, and what a killed writer leaves in tmp/.
    let victim_d = victim.outputs["out0"].digest;
    tamper(&store, &victim_d, |b| b[20] ^= 1);
    let gone_d = gone.outputs["out0"].digest;
    fs::remove_file(blob_file(&store, &gone_d)).expect("rm");
    let stray = tmp.path().join("blobs").join("zz-not-a-shard");
    fs::write(&stray, b"?").expect("stray");
    let foreign = text(8, 5000);
    let foreign_d = {
        let other = tempfile::tempdir().expect("tempdir");
        let other_store = Store::open(other.path()).expect("open");
        let d = other_store.put_blob(&foreign).expect("put");
        let target = blob_file(&store, &d);
        fs::create_dir_all(target.parent().expect("parent")).expect("mkdir");
        fs::copy(blob_file(&other_store, &d), &target).expect("copy");
        d
    };
    let dead = tmp.path().join("tmp").join("0123456789abcdef");
    fs::create_dir(&dead).expect("mkdir");
    fs::write(dead.join("blob-partial"), b"half a blob").expect("write");
    fs::write(tmp.path().join("tmp").join("0123456789abcdef.lock"), b"").expect("lock");

    let found = store.verify(false).expect("verify");
    assert!(!found.is_clean());
    assert_eq!(found.corrupt_blobs, vec![victim_d]);
    assert_eq!(found.missing_blobs, vec![gone_d]);
    assert_eq!(found.unindexed_blobs, vec![foreign_d]);
    let mut broken = found.broken_records.clone();
    broken.sort();
    let mut expected = vec![key("victim"), key("gone")];
    expected.sort();
    assert_eq!(broken, expected);
    assert_eq!(found.stray_files, vec![stray.clone()]);
    assert_eq!(
        found.stale_temp_files.len(),
        2,
        "{:?}",
        found.stale_temp_files
    );
    // Without repair nothing changed, except that a dead process's temp
    // files are gone: they are nobody's and never a problem.
    assert!(store.has_blob(&victim_d));
    assert!(!dead.exists());

    let repaired = store.verify(true).expect("repair");
    assert_eq!(repaired.broken_records.len(), 2);
    // A corrupt blob set aside by the repair is corrupt, not also missing.
    assert_eq!(repaired.corrupt_blobs, vec![victim_d]);
    assert_eq!(repaired.missing_blobs, vec![gone_d]);
    let after = store.verify(false).expect("verify");
    assert!(after.is_clean(), "{after:?}");
    assert!(!dead.exists() && !stray.exists());
    assert!(!store.has_blob(&victim_d));
    assert_eq!(store.stats().expect("stats").quarantined, 1);
    assert_eq!(store.get_record(&key("good")).expect("get"), Some(good));
    assert_eq!(store.get_record(&key("victim")).expect("get"), None);
    assert_eq!(
        store.get_blob(&foreign_d).expect("get").map(Vec::from),
        Some(foreign)
    );
    assert!(store.has_blob(&orphan));
}

/// Each kind of problem alone makes a report unclean (a clean verdict must
/// not hide one kind behind another); orphans and stale temp files alone
/// do not.
#[test]
fn any_one_problem_makes_a_report_unclean() {
    use charly_cache::VerifyReport;
    let p = std::path::PathBuf::from("x");
    let d = charly_cache::BlobDigest::of(b"x");
    let cases: Vec<(&str, VerifyReport)> = vec![
        (
            "corrupt blob",
            VerifyReport {
                corrupt_blobs: vec![d],
                ..Default::default()
            },
        ),
        (
            "unindexed blob",
            VerifyReport {
                unindexed_blobs: vec![d],
                ..Default::default()
            },
        ),
        (
            "missing blob",
            VerifyReport {
                missing_blobs: vec![d],
                ..Default::default()
            },
        ),
        (
            "broken record",
            VerifyReport {
                broken_records: vec![key("b")],
                ..Default::default()
            },
        ),
        (
            "stray file",
            VerifyReport {
                stray_files: vec![p.clone()],
                ..Default::default()
            },
        ),
        (
            "index problem",
            VerifyReport {
                index_problems: vec!["x".into()],
                ..Default::default()
            },
        ),
    ];
    for (what, r) in cases {
        assert!(!r.is_clean(), "{what} alone");
    }
    let fine = VerifyReport {
        orphan_blobs: 3,
        stale_temp_files: vec![p],
        ..Default::default()
    };
    assert!(fine.is_clean());
}

/// verify says whether it repaired; a store whose blob directory is gone
/// is checked (nothing to list), one whose blob directory is not a
/// directory is an error, not a clean report.
#[test]
fn verify_reports_what_it_could_not_read() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = Store::open(tmp.path()).expect("open");
    assert!(store.verify(true).expect("verify").repaired);
    assert!(!store.verify(false).expect("verify").repaired);

    fs::remove_dir_all(tmp.path().join("blobs")).expect("rm");
    let r = store
        .verify(false)
        .expect("no blob directory: nothing to list");
    assert_eq!(r.blobs_checked, 0);
    fs::write(tmp.path().join("blobs"), b"not a directory").expect("file");
    assert!(
        store.verify(false).is_err(),
        "an unreadable blob directory is an error"
    );
    fs::remove_file(tmp.path().join("blobs")).expect("rm");
}

/// Only blob files where blobs live count as blobs: a directory under
/// `blobs/` that is not a two-hex-digit shard, and a blob file in another
/// blob's shard, are strays (never read as blobs, removed by repair).
#[test]
fn misplaced_files_under_blobs_are_strays() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = Store::open(tmp.path()).expect("open");
    let d = store.put_blob(b"a blob in its place").expect("put");
    let hex = d.to_hex();
    let blobs = tmp.path().join("blobs");
    let other_shard = if &hex[..2] == "00" { "01" } else { "00" };
    let misplaced = blobs.join(other_shard).join(&hex);
    fs::create_dir_all(misplaced.parent().expect("parent")).expect("mkdir");
    fs::copy(blob_file(&store, &d), &misplaced).expect("copy");
    let mut strays = vec![misplaced];
    for name in ["zz", "abc", "a"] {
        let dir = blobs.join(name);
        fs::create_dir_all(&dir).expect("mkdir");
        strays.push(dir);
    }
    strays.sort();
    let r = store.verify(false).expect("verify");
    let mut found = r.stray_files.clone();
    found.sort();
    assert_eq!(found, strays, "{r:?}");
    assert_eq!(r.blobs_checked, 1, "only the blob in its place is read");
    assert!(!r.is_clean());
}

#[test]
fn dropping_a_store_leaves_no_temp_files() {
    let tmp = tempfile::tempdir().expect("tempdir");
    {
        let a = Store::open(tmp.path()).expect("open");
        let b = Store::open(tmp.path()).expect("open twice");
        a.put_blob(b"a").expect("put");
        b.put_blob(b"b").expect("put");
        // Each sees the other as alive.
        assert!(a.verify(false).expect("verify").is_clean());
    }
    assert!(files_under(&tmp.path().join("tmp")).is_empty());
    assert_eq!(
        fs::read_dir(tmp.path().join("tmp")).expect("ls").count(),
        0,
        "session dirs/locks left behind"
    );
}

#[test]
fn reopening_keeps_everything() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rec = {
        let store = Store::open(tmp.path()).expect("open");
        let rec = record(&store, "n", &[b"persist me"]);
        assert!(store.put_record(&key("n"), &rec).expect("put"));
        store.set_root("box:n", &key("n")).expect("root");
        rec
    };
    let store = Store::open(tmp.path()).expect("reopen");
    assert_eq!(store.get_record(&key("n")).expect("get"), Some(rec));
    assert_eq!(store.roots().expect("roots").len(), 1);
}

#[test]
fn hex_parse_rejects_garbage_and_keys_are_not_digests() {
    let k = key("x");
    let parsed: NodeKey = k.to_string().parse().expect("parse");
    assert_eq!(parsed, k);
    assert!("xyz".parse::<NodeKey>().is_err());
    assert_eq!(k.short(12).len(), 12);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn any_content_round_trips_via_every_path(
        // Up to a few 512 KiB frames, so frame edges are crossed.
        len in 0usize..1_700_000,
        seed in any::<u64>(),
        compressible in any::<bool>(),
        step in 1usize..700_000,
    ) {
        let data = if compressible { text(seed, len) } else { content(seed, len) };
        let tmp = tempfile::tempdir().expect("tempdir");
        let store = Store::open(tmp.path()).expect("open");
        let (d, len) = store.put_blob_reader(Dribble(&data, step)).expect("put");
        prop_assert_eq!(d, BlobDigest::of(&data));
        prop_assert_eq!(len, data.len() as u64);
        prop_assert_eq!(store.put_blob(&data).expect("put"), d);
        prop_assert_eq!(
            store.get_blob(&d).expect("get").map(Vec::from),
            Some(data.clone())
        );
        let dest = tmp.path().join("copy");
        prop_assert!(store.copy_blob_to(&d, &dest).expect("copy"));
        prop_assert_eq!(fs::read(&dest).expect("read"), data);
    }
}
