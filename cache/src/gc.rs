//! Garbage collection: least-recently-used eviction down to a byte budget.
//!
//! The budget counts compressed blob bytes (what the store costs on disk;
//! the index is small next to it). Eviction order:
//!
//! 1. blobs no record references, oldest access first. Blobs accessed within
//!    [`PENDING_GRACE_SECS`] are skipped: a build stores its outputs before
//!    it records them, and a GC running alongside must not pull them away;
//! 2. records that are not GC roots, oldest access first, each taking along
//!    the blobs no remaining record references.
//!
//! Roots, their records and every blob those records reference are never
//! removed, even if that leaves the store over budget (the report says so).
//! Selection, index deletion and file deletion happen inside one write
//! transaction, which is what makes GC safe against concurrent `put_blob` and
//! `put_record` (both check the filesystem inside their own transactions).
//! Afterwards GC also removes temp files of dead processes and unused key
//! lock files.

use std::collections::HashMap;
use std::fs;
use std::io;

use rusqlite::OptionalExtension;

use crate::error::IoContext;
use crate::lock::{remove_file_if_exists, remove_if_unheld, stale_session_entries};
use crate::store::{delete_record, from_sql_int, to_sql_int};
use crate::{BlobDigest, CacheError, Store};

/// Unreferenced blobs accessed this recently are presumed to belong to a
/// build in progress and are not collected.
pub const PENDING_GRACE_SECS: u64 = 15 * 60;

/// What a GC run did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct GcReport {
    /// Compressed blob bytes before the run.
    pub bytes_before: u64,
    /// Compressed blob bytes after the run.
    pub bytes_after: u64,
    /// Records evicted.
    pub records_removed: u64,
    /// Blobs deleted.
    pub blobs_removed: u64,
    /// Whether the store is now within the budget (roots can prevent it).
    pub within_budget: bool,
    /// Temp files of dead processes and unused lock files removed.
    pub stale_files_removed: u64,
}

impl Store {
    /// Evicts least-recently-used entries until blobs take at most
    /// `max_bytes` on disk; see the module docs for the order.
    pub fn gc(&self, max_bytes: u64) -> Result<GcReport, CacheError> {
        self.flush()?;
        self.bump_epoch()?;
        let grace_cutoff = self.now().saturating_sub(PENDING_GRACE_SECS);
        let mut report = self.with_conn(|c| {
            let tx = self.begin_write(c)?;
            let mut report = GcReport::default();
            let before: i64 =
                tx.query_row("SELECT COALESCE(SUM(csize), 0) FROM blobs", [], |r| {
                    r.get(0)
                })?;
            let mut total = from_sql_int(before);
            report.bytes_before = total;
            let mut doomed: Vec<BlobDigest> = Vec::new();

            // How many records reference each blob, counted once (the
            // index holds no digest → records lookup: every new record
            // would pay a random page write per output for it).
            let mut refs: HashMap<String, u64> = HashMap::new();
            if total > max_bytes {
                let mut st =
                    tx.prepare("SELECT digest, COUNT(*) FROM record_blobs GROUP BY digest")?;
                let rows =
                    st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
                for row in rows {
                    let (hex, n) = row?;
                    refs.insert(hex, from_sql_int(n));
                }
                let unreferenced: Vec<(String, i64)> = {
                    let mut st = tx.prepare(
                        "SELECT digest, csize FROM blobs
                         WHERE last_access < ?1
                         ORDER BY last_access, digest",
                    )?;
                    let rows =
                        st.query_map([to_sql_int(grace_cutoff)], |r| Ok((r.get(0)?, r.get(1)?)))?;
                    let rows: Vec<(String, i64)> = rows.collect::<Result<_, _>>()?;
                    rows.into_iter()
                        .filter(|(hex, _)| !refs.contains_key(hex))
                        .collect()
                };
                for (hex, csize) in unreferenced {
                    if total <= max_bytes {
                        break;
                    }
                    tx.execute("DELETE FROM blobs WHERE digest = ?1", [&hex])?;
                    doomed.push(hex.parse()?);
                    total = total.saturating_sub(from_sql_int(csize));
                }
            }

            if total > max_bytes {
                let candidates: Vec<String> = {
                    let mut st = tx.prepare(
                        "SELECT r.key FROM records r
                         LEFT JOIN record_access a ON a.key = r.key
                         WHERE r.key NOT IN (SELECT key FROM roots)
                         ORDER BY COALESCE(a.last_access, 0), r.key",
                    )?;
                    let rows = st.query_map([], |r| r.get(0))?;
                    rows.collect::<Result<_, _>>()?
                };
                for key in candidates {
                    if total <= max_bytes {
                        break;
                    }
                    let digests: Vec<String> = {
                        let mut st =
                            tx.prepare_cached("SELECT digest FROM record_blobs WHERE key = ?1")?;
                        let rows = st.query_map([&key], |r| r.get(0))?;
                        rows.collect::<Result<_, _>>()?
                    };
                    delete_record(&tx, &key)?;
                    report.records_removed += 1;
                    for hex in digests {
                        // The last reference gone (a record names a blob once).
                        let left = refs.get_mut(&hex).map(|n| {
                            *n = n.saturating_sub(1);
                            *n
                        });
                        if left.is_some_and(|n| n > 0) {
                            continue;
                        }
                        let csize: Option<i64> = tx
                            .prepare_cached("SELECT csize FROM blobs WHERE digest = ?1")?
                            .query_row([&hex], |r| r.get(0))
                            .optional()?;
                        tx.execute("DELETE FROM blobs WHERE digest = ?1", [&hex])?;
                        doomed.push(hex.parse()?);
                        total = total.saturating_sub(csize.map(from_sql_int).unwrap_or(0));
                    }
                }
            }

            // Access rows of records that are gone: a lookup's access is
            // written after the lookup, maybe after another process's GC
            // removed its record.
            tx.execute(
                "DELETE FROM record_access WHERE key NOT IN (SELECT key FROM records)",
                [],
            )?;

            // Files go while the transaction still holds the write lock, so
            // no put can observe "row present, file gone" in between. If we
            // die midway the rows come back without files; readers treat
            // that as a miss and verify repairs it.
            for d in &doomed {
                remove_file_if_exists(&self.blob_path(d))?;
            }
            tx.commit()?;
            report.blobs_removed = doomed.len() as u64;
            report.bytes_after = total;
            report.within_budget = total <= max_bytes;
            Ok(report)
        })?;

        let stale = stale_session_entries(&self.tmp_dir, &self.session, true)?;
        report.stale_files_removed += stale.len() as u64;
        report.stale_files_removed += self.remove_unused_key_locks()?;
        Ok(report)
    }

    fn remove_unused_key_locks(&self) -> Result<u64, CacheError> {
        let mut removed = 0;
        let entries = match fs::read_dir(&self.locks_dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e).at("listing", &self.locks_dir),
        };
        for entry in entries {
            let path = entry.at("listing", &self.locks_dir)?.path();
            if remove_if_unheld(&path)? {
                removed += 1;
            }
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use crate::store::ACCESS_RESOLUTION_SECS;
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;
    use crate::store::Clock;
    use crate::{NodeKey, Output, Record};

    fn store_with_clock(dir: &std::path::Path) -> Store {
        let mut s = Store::open(dir).expect("open");
        s.clock = Clock::Manual(AtomicU64::new(1_000_000));
        s
    }

    fn advance(s: &Store, secs: u64) {
        match &s.clock {
            Clock::Manual(t) => {
                t.fetch_add(secs, Ordering::SeqCst);
            }
            Clock::System => panic!("test store must use a manual clock"),
        }
    }

    /// Incompressible-ish content of `len` bytes unique to `seed`.
    fn content(seed: u64, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len);
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        while out.len() < len {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            out.extend_from_slice(&x.to_le_bytes());
        }
        out.truncate(len);
        out
    }

    fn key(n: u8) -> NodeKey {
        NodeKey::from_bytes([n; 32])
    }

    fn record_with(store: &Store, node: &str, blobs: &[&[u8]]) -> Record {
        let mut outputs = BTreeMap::new();
        for (i, b) in blobs.iter().enumerate() {
            let digest = store.put_blob(b).expect("put blob");
            outputs.insert(
                format!("out{i}"),
                Output {
                    digest,
                    size: b.len() as u64,
                    mode: 0o644,
                },
            );
        }
        Record {
            node_id: node.into(),
            kind: "test".into(),
            outputs,
            duration_ms: 1,
            producer: "fake".into(),
            key_inputs: serde_json::json!({}),
            created_unix: 0,
            meta: serde_json::Value::Null,
        }
    }

    fn csize(store: &Store, d: &BlobDigest) -> u64 {
        fs::metadata(store.blob_path(d)).expect("blob file").len()
    }

    #[test]
    fn gc_evicts_lru_records_keeps_roots_and_unreferenced_go_first() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let s = store_with_clock(tmp.path());
        let blob = |n| content(n, 20_000);

        // t0: rooted record A, records B and C, a loose blob L.
        let rec_a = record_with(&s, "a", &[&blob(1)]);
        assert!(s.put_record(&key(1), &rec_a).expect("put a"));
        s.set_root("box:a", &key(1)).expect("root");
        advance(&s, 100);
        let rec_b = record_with(&s, "b", &[&blob(2)]);
        assert!(s.put_record(&key(2), &rec_b).expect("put b"));
        advance(&s, 100);
        let rec_c = record_with(&s, "c", &[&blob(3)]);
        assert!(s.put_record(&key(3), &rec_c).expect("put c"));
        advance(&s, 100);
        let loose = s.put_blob(&blob(4)).expect("loose blob");
        // Everything is past the pending grace period from here on.
        advance(&s, PENDING_GRACE_SECS + 100);
        // B is used again: C is now the least recently used record, and
        // A (oldest of all) is rooted.
        assert!(s.get_record(&key(2)).expect("get b").is_some());

        let d = |r: &Record| r.outputs["out0"].digest;
        let total = s.stats().expect("stats").compressed_bytes;
        assert_eq!(
            total,
            csize(&s, &d(&rec_a))
                + csize(&s, &d(&rec_b))
                + csize(&s, &d(&rec_c))
                + csize(&s, &loose)
        );

        // Budget that needs exactly the loose blob gone.
        let report = s.gc(total - csize(&s, &loose)).expect("gc");
        assert_eq!(report.blobs_removed, 1, "{report:?}");
        assert_eq!(report.records_removed, 0, "{report:?}");
        assert!(report.within_budget);
        assert!(!s.has_blob(&loose));
        assert!(s.get_record(&key(3)).expect("get c").is_some());
        advance(&s, 100);

        // A budget of one byte evicts every unrooted record, keeps A.
        let report = s.gc(1).expect("gc");
        assert_eq!(report.records_removed, 2, "{report:?}");
        assert!(!report.within_budget, "root A cannot be collected");
        assert_eq!(report.bytes_after, csize(&s, &d(&rec_a)));
        assert!(s.get_record(&key(1)).expect("get a").is_some());
        assert!(s.get_blob(&d(&rec_a)).expect("blob a").is_some());
        assert!(s.get_record(&key(2)).expect("get b").is_none());
        assert!(!s.has_blob(&d(&rec_b)) && !s.has_blob(&d(&rec_c)));

        // Removing the root makes A collectable.
        s.remove_root("box:a").expect("unroot");
        let report = s.gc(0).expect("gc");
        assert_eq!(report.records_removed, 1);
        assert!(report.within_budget);
        let stats = s.stats().expect("stats");
        assert_eq!(
            (stats.records, stats.blobs, stats.compressed_bytes),
            (0, 0, 0)
        );
        assert!(s.verify(false).expect("verify").is_clean());
    }

    #[test]
    fn gc_evicts_in_lru_order_and_stops_at_budget() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let s = store_with_clock(tmp.path());
        let mut recs = Vec::new();
        for n in 0..5u8 {
            let r = record_with(&s, &format!("n{n}"), &[&content(u64::from(n) + 10, 10_000)]);
            assert!(s.put_record(&key(n), &r).expect("put"));
            recs.push(r);
            advance(&s, 100);
        }
        advance(&s, PENDING_GRACE_SECS);
        // Access order now: 3, 1 (oldest to newest among touched); 0, 2, 4 untouched.
        assert!(s.get_record(&key(3)).expect("get").is_some());
        advance(&s, 100);
        assert!(s.get_record(&key(1)).expect("get").is_some());
        // LRU order is therefore 0, 2, 4, 3, 1. Keep room for two records.
        let sizes: Vec<u64> = recs
            .iter()
            .map(|r| csize(&s, &r.outputs["out0"].digest))
            .collect();
        let report = s.gc(sizes[3] + sizes[1]).expect("gc");
        assert_eq!(report.records_removed, 3, "{report:?}");
        assert!(report.within_budget);
        for (n, kept) in [(0, false), (1, true), (2, false), (3, true), (4, false)] {
            assert_eq!(
                s.get_record(&key(n)).expect("get").is_some(),
                kept,
                "record {n}"
            );
        }
    }

    #[test]
    fn shared_blobs_survive_until_last_reference_goes_and_pending_blobs_are_kept() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let s = store_with_clock(tmp.path());
        let shared = content(99, 30_000);
        let r1 = record_with(&s, "one", &[&shared]);
        let r2 = record_with(&s, "two", &[&shared, &content(98, 100)]);
        assert!(s.put_record(&key(1), &r1).expect("put"));
        advance(&s, 10);
        assert!(s.put_record(&key(2), &r2).expect("put"));
        s.set_root("keep", &key(2)).expect("root");
        advance(&s, PENDING_GRACE_SECS + 1);
        // A blob stored just now, not yet recorded: within the grace period.
        let pending = s.put_blob(&content(97, 50_000)).expect("pending");

        let report = s.gc(0).expect("gc");
        assert_eq!(report.records_removed, 1);
        assert!(s.has_blob(&pending), "pending blob collected");
        let shared_digest = r1.outputs["out0"].digest;
        assert!(
            s.has_blob(&shared_digest),
            "blob of rooted record collected"
        );
        assert!(s.get_record(&key(2)).expect("get").is_some());

        advance(&s, PENDING_GRACE_SECS + 1);
        let report = s.gc(0).expect("gc");
        assert_eq!(report.blobs_removed, 1);
        assert!(!s.has_blob(&pending));
    }

    #[test]
    fn no_op_lookups_batch_access_time_writes() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let s = store_with_clock(tmp.path());
        let r = record_with(&s, "n", &[b"x"]);
        let n = 3000u32;
        for i in 0..n {
            let mut k = [0u8; 32];
            k[..4].copy_from_slice(&i.to_le_bytes());
            assert!(s.put_record(&NodeKey::from_bytes(k), &r).expect("put"));
        }
        advance(&s, 3600);
        let before = s.touch_flushes.load(Ordering::Relaxed);
        for i in 0..n {
            let mut k = [0u8; 32];
            k[..4].copy_from_slice(&i.to_le_bytes());
            assert!(
                s.get_record(&NodeKey::from_bytes(k))
                    .expect("get")
                    .is_some()
            );
        }
        let flushes = s.touch_flushes.load(Ordering::Relaxed) - before;
        let expected = u64::from(n) / crate::store::TOUCH_BATCH as u64;
        assert_eq!(flushes, expected, "one write per batch, not per lookup");
        s.flush().expect("flush");
        let range = || -> (u64, u64) {
            s.with_conn(|c| {
                Ok(c.query_row(
                    "SELECT MIN(last_access), MAX(last_access) FROM record_access",
                    [],
                    |r| Ok((from_sql_int(r.get(0)?), from_sql_int(r.get(1)?))),
                )?)
            })
            .expect("query")
        };
        // The batched times did land in the index.
        let read_at = s.now();
        assert_eq!(range(), (read_at, read_at));
        // Looked up again within the resolution: nothing is written.
        advance(&s, ACCESS_RESOLUTION_SECS - 1);
        for i in 0..n {
            let mut k = [0u8; 32];
            k[..4].copy_from_slice(&i.to_le_bytes());
            assert!(s.has_record(&NodeKey::from_bytes(k)).expect("has"));
        }
        s.flush().expect("flush");
        assert_eq!(range(), (read_at, read_at));
        // Once the resolution has passed, the next lookups count.
        advance(&s, 1);
        assert!(s.has_record(&NodeKey::from_bytes([0; 32])).expect("has"));
        s.flush().expect("flush");
        assert_eq!(range(), (read_at, s.now()));
    }

    /// A blob read again within the resolution writes nothing (a cached
    /// rebuild a second later must leave the index's files as they were:
    /// a replay of `box build` checks them); after it, the read counts.
    #[test]
    fn blob_reads_within_the_resolution_write_nothing() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let s = store_with_clock(tmp.path());
        let d = s.put_blob(b"manifest").expect("put");
        let blob_access = || -> u64 {
            s.with_conn(|c| {
                Ok(c.query_row(
                    "SELECT last_access FROM blobs WHERE digest = ?1",
                    [d.to_hex()],
                    |r| Ok(from_sql_int(r.get(0)?)),
                )?)
            })
            .expect("query")
        };
        let written = blob_access();
        advance(&s, 1);
        assert!(s.get_blob(&d).expect("get").is_some());
        s.flush().expect("flush");
        assert_eq!(blob_access(), written, "a read a second later wrote");
        advance(&s, ACCESS_RESOLUTION_SECS);
        assert!(s.get_blob(&d).expect("get").is_some());
        s.flush().expect("flush");
        assert_eq!(blob_access(), s.now());
    }

    #[test]
    fn gc_drops_access_rows_whose_record_is_gone() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let s = store_with_clock(tmp.path());
        let k = NodeKey::from_bytes([7; 32]);
        assert!(
            s.put_record(&k, &record_with(&s, "n", &[b"x"]))
                .expect("put")
        );
        // Looked up, then removed by another process before the access
        // was written.
        assert!(s.has_record(&k).expect("has"));
        s.with_conn(|c| crate::store::delete_record(c, &k.to_hex()))
            .expect("delete");
        s.flush().expect("flush");
        let rows = || -> i64 {
            s.with_conn(
                |c| Ok(c.query_row("SELECT COUNT(*) FROM record_access", [], |r| r.get(0))?),
            )
            .expect("count")
        };
        assert_eq!(rows(), 1, "the late access wrote a row");
        s.gc(u64::MAX).expect("gc");
        assert_eq!(rows(), 0);
    }
}
