//! A store damaged behind its back (issue 18, findings 7 and 8): a record
//! whose JSON no longer decodes, a blob that fails verification, an index
//! file SQLite cannot read. None of them may fail a caller: each is a miss,
//! noted once, and `verify --repair` always ends with a store that verifies
//! clean.

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use charly_cache::Store;
use common::{key, record, text};

fn blob_file(store: &Store, d: &charly_cache::BlobDigest) -> PathBuf {
    let hex = d.to_hex();
    store.dir().join("blobs").join(&hex[..2]).join(hex)
}

fn set_outputs_json(store_dir: &Path, json: &str) {
    let conn = rusqlite::Connection::open(store_dir.join("index.db")).expect("open index");
    let n = conn
        .execute("UPDATE records SET outputs = ?1", [json])
        .expect("update");
    assert!(n > 0);
}

#[test]
fn a_record_that_does_not_decode_is_a_noted_miss_and_can_be_recorded_again() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = Store::open(tmp.path()).expect("open");
    let rec = record(&store, "containerfile:x", &[&text(1, 5000)]);
    assert!(store.put_record(&key("x"), &rec).expect("put"));
    set_outputs_json(tmp.path(), "{\"file:x\": {\"digest\": 12");

    assert_eq!(store.get_record(&key("x")).expect("no error"), None);
    let notes = store.take_notes();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(notes[0].contains("did not decode"), "{notes:?}");
    // Dropped: a second lookup is a plain miss and says nothing more.
    assert_eq!(store.get_record(&key("x")).expect("get"), None);
    assert!(store.take_notes().is_empty());
    assert!(
        store
            .last_record_for("containerfile:x")
            .expect("last")
            .is_none()
    );
    // The rebuilt node records again.
    assert!(store.put_record(&key("x"), &rec).expect("put again"));
    assert_eq!(store.get_record(&key("x")).expect("get"), Some(rec));
    assert!(store.verify(false).expect("verify").is_clean());
}

#[test]
fn a_record_with_a_wrongly_typed_column_is_a_miss_too() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = Store::open(tmp.path()).expect("open");
    let rec = record(&store, "n", &[&text(2, 100)]);
    assert!(store.put_record(&key("n"), &rec).expect("put"));
    let conn = rusqlite::Connection::open(tmp.path().join("index.db")).expect("open index");
    conn.execute("UPDATE records SET duration_ms = x'00ff'", [])
        .expect("update");
    assert_eq!(store.get_record(&key("n")).expect("no error"), None);
    assert_eq!(store.take_notes().len(), 1);
    assert!(store.put_record(&key("n"), &rec).expect("put again"));
}

#[test]
fn a_corrupt_blob_is_noted_once() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = Store::open(tmp.path()).expect("open");
    let d = store.put_blob(&text(3, 50_000)).expect("put");
    let path = blob_file(&store, &d);
    let mut bytes = fs::read(&path).expect("read");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    fs::write(&path, bytes).expect("write");
    assert!(store.get_blob(&d).expect("get").is_none());
    assert!(store.get_blob(&d).expect("get").is_none());
    let notes = store.take_notes();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(notes[0].contains("failed verification"), "{notes:?}");
}

/// A store with enough records that its index spans many pages.
fn populated(dir: &Path) -> Vec<charly_cache::BlobDigest> {
    let store = Store::open(dir).expect("open");
    let mut blobs = Vec::new();
    for i in 0..300u64 {
        let rec = record(&store, &format!("node/{i}"), &[&text(i, 64)]);
        blobs.extend(rec.blob_digests());
        assert!(
            store
                .put_record(&key(&format!("node/{i}")), &rec)
                .expect("put")
        );
    }
    blobs
}

fn aside_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .expect("list")
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.starts_with("index.db.corrupt-") && !n.ends_with("-wal") && !n.ends_with("-shm")
            })
        })
        .collect();
    v.sort();
    v
}

fn garbage(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ 0xa5)
        .collect()
}

#[test]
fn every_kind_of_index_damage_is_recovered_and_repair_ends_clean() {
    type Damage = fn(&Path);
    let modes: [(&str, Damage, bool); 5] = [
        (
            "truncated to half",
            |db| {
                let len = fs::metadata(db).expect("meta").len();
                fs::OpenOptions::new()
                    .write(true)
                    .open(db)
                    .and_then(|f| f.set_len(len / 2))
                    .expect("truncate");
            },
            true,
        ),
        (
            "garbage first 100 bytes",
            |db| {
                let mut b = fs::read(db).expect("read");
                b[..100].copy_from_slice(&garbage(100, 1));
                fs::write(db, b).expect("write");
            },
            true,
        ),
        (
            "garbage pages in the middle",
            |db| {
                let mut b = fs::read(db).expect("read");
                let page = 4096;
                let pages = b.len() / page;
                assert!(pages >= 8, "index too small: {pages} pages");
                let from = pages / 3 * page;
                b[from..from + 3 * page].copy_from_slice(&garbage(3 * page, 7));
                fs::write(db, b).expect("write");
            },
            true,
        ),
        (
            "zero-length file",
            |db| fs::write(db, b"").expect("write"),
            false,
        ),
        (
            "garbage -wal",
            |db| {
                let wal = PathBuf::from(format!("{}-wal", db.display()));
                fs::write(wal, garbage(3 * 4096 + 32, 9)).expect("write wal");
            },
            false,
        ),
    ];
    for (name, damage, detectable) in modes {
        let tmp = tempfile::tempdir().expect("tempdir");
        let blobs = populated(tmp.path());
        damage(&tmp.path().join("index.db"));

        // Opening never fails on a damaged index: it is moved aside (with
        // its -wal and -shm) and an empty one started, with a note.
        let store = Store::open(tmp.path()).unwrap_or_else(|e| panic!("{name}: open: {e}"));
        let notes = store.take_notes();
        if detectable {
            assert_eq!(aside_files(tmp.path()).len(), 1, "{name}");
            assert_eq!(notes.len(), 1, "{name}: {notes:?}");
            assert!(notes[0].contains("moved it aside"), "{name}: {notes:?}");
        }
        // The store works: a record can be written and read back.
        let rec = record(&store, "after", &[b"after the damage"]);
        assert!(
            store.put_record(&key("after"), &rec).expect("put"),
            "{name}"
        );
        assert_eq!(store.get_record(&key("after")).expect("get"), Some(rec));

        let repaired = store
            .verify(true)
            .unwrap_or_else(|e| panic!("{name}: verify --repair: {e}"));
        let after = store.verify(false).expect("verify");
        assert!(
            after.is_clean(),
            "{name}: not clean after repair: {repaired:?}\n{after:?}"
        );
        // Every blob survived and is indexed again.
        for d in &blobs {
            assert!(
                store.get_blob(d).expect("get").is_some(),
                "{name}: lost blob {d}"
            );
        }
        drop(store);
        let again = Store::open(tmp.path()).expect("reopen");
        assert!(again.take_notes().is_empty(), "{name}: still damaged");
        assert!(again.verify(false).expect("verify").is_clean(), "{name}");
    }
}

/// The index is checked when it is not as charly last left it: not on a
/// reopen after a clean close, but after damage that even keeps the file's
/// size and mtime (its ctime moves).
#[test]
fn the_index_is_checked_only_when_it_changed_behind_charlys_back() {
    let tmp = tempfile::tempdir().expect("tempdir");
    populated(tmp.path());
    let store = Store::open(tmp.path()).expect("open");
    assert!(!store.index_was_checked(), "as the last process left it");
    drop(store);
    let db = tmp.path().join("index.db");
    let mtime = fs::metadata(&db).and_then(|m| m.modified()).expect("mtime");
    let mut b = fs::read(&db).expect("read");
    let page = 4096;
    let from = b.len() / page / 3 * page;
    b[from..from + 3 * page].copy_from_slice(&garbage(3 * page, 3));
    // Let the clock pass the kernel's timestamp tick: the ctime moves.
    std::thread::sleep(std::time::Duration::from_millis(20));
    fs::write(&db, b).expect("write");
    fs::OpenOptions::new()
        .write(true)
        .open(&db)
        .and_then(|f| f.set_modified(mtime))
        .expect("restore mtime");
    let store = Store::open(tmp.path()).expect("open");
    assert!(store.index_was_checked());
    let notes = store.take_notes();
    assert!(
        notes.iter().any(|n| n.contains("moved it aside")),
        "{notes:?}"
    );
}

#[test]
fn concurrent_openers_of_a_damaged_index_move_it_aside_once_and_keep_each_others_writes() {
    let tmp = tempfile::tempdir().expect("tempdir");
    populated(tmp.path());
    let db = tmp.path().join("index.db");
    let mut b = fs::read(&db).expect("read");
    b[..100].copy_from_slice(&garbage(100, 5));
    fs::write(&db, b).expect("write");

    std::thread::scope(|s| {
        for t in 0..6 {
            let dir = tmp.path();
            s.spawn(move || {
                let store = Store::open(dir).expect("open");
                let rec = record(&store, &format!("t{t}"), &[&text(1000 + t, 300)]);
                assert!(store.put_record(&key(&format!("t{t}")), &rec).expect("put"));
            });
        }
    });
    assert_eq!(
        aside_files(tmp.path()).len(),
        1,
        "moved aside more than once"
    );
    let store = Store::open(tmp.path()).expect("open");
    for t in 0..6 {
        assert!(
            store
                .get_record(&key(&format!("t{t}")))
                .expect("get")
                .is_some(),
            "thread {t}'s record was lost"
        );
    }
}

/// Damage found by `verify` itself, under a store that is open: a failing
/// `PRAGMA quick_check` (SQLite answers "not a database" or "malformed")
/// is reported as an index problem, not returned as an error, and
/// `verify --repair` replaces the index and ends clean.
#[test]
fn verify_reports_an_index_damaged_under_an_open_store_and_repairs_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let blobs = populated(tmp.path());
    let store = Store::open(tmp.path()).expect("open");
    assert!(!store.index_was_checked());
    let db = tmp.path().join("index.db");
    let mut b = fs::read(&db).expect("read");
    b[..100].copy_from_slice(&garbage(100, 5));
    let page = 4096;
    let from = b.len() / page / 3 * page;
    b[from..from + 3 * page].copy_from_slice(&garbage(3 * page, 11));
    fs::write(&db, b).expect("write");

    let report = store
        .verify(false)
        .expect("damage is a finding, not an error");
    assert!(!report.index_problems.is_empty(), "{report:?}");
    assert!(!report.is_clean());
    store.verify(true).expect("repair");
    assert!(store.verify(false).expect("verify").is_clean());
    for d in &blobs {
        assert!(store.get_blob(d).expect("get").is_some(), "lost blob {d}");
    }
}
