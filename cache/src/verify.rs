//! Verification and repair of a whole store.
//!
//! `verify` re-reads every blob (decompress + blake3, streaming), reconciles
//! the blob files with the index, checks that every record's blobs are intact,
//! removes temp files abandoned by dead processes and runs SQLite's
//! `quick_check`. With `repair` it fixes what it can without losing anything
//! valid: bad blobs are quarantined, records that lost a blob are deleted
//! (they were misses anyway), index rows are brought in line with the files,
//! stray files are removed, and an index SQLite finds damaged is moved aside
//! and rebuilt from the blobs (its records are dropped: they are a cache).
//! After a repair the store verifies clean. Blobs no record references are
//! only counted: a build may be about to record them, and GC reclaims them.
//!
//! Leftovers of dead processes are not a problem of the store: every opener
//! removes them (a process killed by SIGKILL cannot clean up after itself),
//! and so does `verify`, with or without `repair`, reporting what it removed.
//! Dead is told from live by the session lock, which the kernel releases
//! when a process dies: a live process's files are never touched.
//!
//! It is safe to run while other processes use the store: anything that looks
//! missing is re-checked against the filesystem before it is reported, so a
//! blob written after the scan started is not mistaken for damage.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs;
use std::io;
use std::path::PathBuf;

use rusqlite::{OptionalExtension, params};

use crate::blob::FileId;
use crate::error::IoContext;
use crate::frames::{Dest, ReadOutcome, read_blob};
use crate::lock::{remove_file_if_exists, stale_session_entries};
use crate::store::{delete_record, from_sql_int, is_damage, quick_check, to_sql_int};
use crate::{BlobDigest, CacheError, NodeKey, Output, Store};

/// What `verify` found (and, with repair, fixed).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct VerifyReport {
    /// Blob files read and hashed.
    pub blobs_checked: u64,
    /// Blobs whose content does not match their name or does not decode
    /// (repair: quarantined).
    pub corrupt_blobs: Vec<BlobDigest>,
    /// Blob files missing from the index or indexed with wrong sizes
    /// (repair: re-indexed).
    pub unindexed_blobs: Vec<BlobDigest>,
    /// Index rows whose blob file is gone (repair: rows removed).
    pub missing_blobs: Vec<BlobDigest>,
    /// Records that name an absent or corrupt blob, or do not decode
    /// (repair: deleted).
    pub broken_records: Vec<NodeKey>,
    /// Temp files and session locks left by dead processes: removed (by
    /// every run, with or without repair) and not a problem.
    pub stale_temp_files: Vec<PathBuf>,
    /// Entries under `blobs/` that are not named like blobs (repair: removed).
    pub stray_files: Vec<PathBuf>,
    /// Problems reported by SQLite's `quick_check` (repair: the index is moved
    /// aside and rebuilt from the blobs).
    pub index_problems: Vec<String>,
    /// Intact blobs no record references; not a problem (GC reclaims them).
    pub orphan_blobs: u64,
    /// Whether this run repaired what it found.
    pub repaired: bool,
}

impl VerifyReport {
    /// True if nothing is wrong (orphan blobs and removed leftovers of dead
    /// processes are not wrong).
    pub fn is_clean(&self) -> bool {
        self.corrupt_blobs.is_empty()
            && self.unindexed_blobs.is_empty()
            && self.missing_blobs.is_empty()
            && self.broken_records.is_empty()
            && self.stray_files.is_empty()
            && self.index_problems.is_empty()
    }
}

fn sorted_entries(dir: &std::path::Path) -> Result<Vec<fs::DirEntry>, CacheError> {
    let mut entries = match fs::read_dir(dir) {
        Ok(rd) => rd.collect::<Result<Vec<_>, _>>().at("listing", dir)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e).at("listing", dir),
    };
    entries.sort_by_key(|e| e.file_name());
    Ok(entries)
}

/// A blob's compressed and logical sizes.
type Sizes = (u64, u64);

impl Store {
    /// Checks the whole store; with `repair`, fixes what it finds (see the
    /// module docs). A second run after a repair reports clean unless
    /// something changed in between.
    pub fn verify(&self, repair: bool) -> Result<VerifyReport, CacheError> {
        self.flush()?;
        if repair {
            self.bump_epoch()?;
        }
        let mut report = VerifyReport {
            repaired: repair,
            ..VerifyReport::default()
        };

        report.stale_temp_files = stale_session_entries(&self.tmp_dir, &self.session, true)?;
        report.index_problems = match self.with_conn(|c| quick_check(c)) {
            Ok(problems) => problems,
            Err(e) if is_damage(&e) => vec![e.to_string()],
            Err(e) => return Err(e),
        };
        // A damaged index answers nothing reliably: with repair it is
        // replaced by an empty one the steps below fill from the blobs;
        // without, only the blob files are checked.
        let index_usable = report.index_problems.is_empty() || repair;
        if repair && !report.index_problems.is_empty() {
            self.replace_index(&report.index_problems[0])?;
        }

        // 1. Every blob file: name, content.
        let (good, corrupt) = self.verify_blob_files(&mut report, repair)?;
        if !index_usable {
            return Ok(report);
        }
        // 2. The blob index against the files.
        let unindexed = self.verify_blob_index(&mut report, &good, &corrupt)?;
        // 3. Records against the blobs.
        let broken_hex = self.verify_records(&mut report, &good, &corrupt)?;
        if repair {
            self.repair_index(&unindexed, &report.missing_blobs, &broken_hex)?;
        }
        Ok(report)
    }

    /// Every blob file: its name, its content; corrupt ones quarantined
    /// with `repair`, stray files reported (and removed with it). The
    /// verified blobs' sizes, and the corrupt ones.
    fn verify_blob_files(
        &self,
        report: &mut VerifyReport,
        repair: bool,
    ) -> Result<(HashMap<BlobDigest, Sizes>, HashSet<BlobDigest>), CacheError> {
        let mut good: HashMap<BlobDigest, (u64, u64)> = HashMap::new();
        let mut corrupt: HashSet<BlobDigest> = HashSet::new();
        for shard in sorted_entries(&self.blobs_dir)? {
            let shard_path = shard.path();
            let shard_name = shard.file_name().to_string_lossy().into_owned();
            let is_shard = shard.file_type().at("inspecting", &shard_path)?.is_dir()
                && shard_name.len() == 2
                && shard_name
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
            if !is_shard {
                self.stray(report, shard_path, repair)?;
                continue;
            }
            for entry in sorted_entries(&shard_path)? {
                let path = entry.path();
                let name = entry.file_name().to_string_lossy().into_owned();
                let digest = name
                    .parse::<BlobDigest>()
                    .ok()
                    .filter(|d| d.to_hex() == name && name.starts_with(&shard_name));
                let Some(d) = digest else {
                    self.stray(report, path, repair)?;
                    continue;
                };
                let file = match fs::File::open(&path) {
                    Ok(f) => f,
                    // Removed by a concurrent GC since we listed it.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e).at("opening blob", path),
                };
                let meta = file.metadata().at("inspecting blob", &path)?;
                let (csize, id) = (meta.len(), FileId::of(&meta));
                report.blobs_checked += 1;
                match read_blob(file, &d, Dest::Stream(&mut |_| Ok(())))
                    .at("reading blob", &path)?
                {
                    ReadOutcome::Verified(lsize) => {
                        good.insert(d, (csize, lsize));
                    }
                    ReadOutcome::Corrupt => {
                        corrupt.insert(d);
                        report.corrupt_blobs.push(d);
                        if repair {
                            self.quarantine(&d, id)?;
                        }
                    }
                }
            }
        }
        Ok((good, corrupt))
    }

    /// The blob index against the verified files: blobs it lacks (returned
    /// with their sizes, to index) and indexed blobs missing on disk.
    fn verify_blob_index(
        &self,
        report: &mut VerifyReport,
        good: &HashMap<BlobDigest, Sizes>,
        corrupt: &HashSet<BlobDigest>,
    ) -> Result<Vec<(BlobDigest, Sizes)>, CacheError> {
        let indexed: HashMap<BlobDigest, (u64, u64)> = self.with_conn(|c| {
            let mut st = c.prepare("SELECT digest, csize, lsize FROM blobs")?;
            let rows = st.query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    from_sql_int(r.get(1)?),
                    from_sql_int(r.get(2)?),
                ))
            })?;
            let mut map = HashMap::new();
            for row in rows {
                let (hex, csize, lsize) = row?;
                map.insert(hex.parse()?, (csize, lsize));
            }
            Ok(map)
        })?;
        let mut unindexed: Vec<(BlobDigest, (u64, u64))> = good
            .iter()
            .filter(|(d, sizes)| indexed.get(d) != Some(sizes))
            .map(|(d, sizes)| (*d, *sizes))
            .collect();
        unindexed.sort_unstable();
        report.unindexed_blobs = unindexed.iter().map(|(d, _)| *d).collect();
        let mut missing: Vec<BlobDigest> = indexed
            .keys()
            .filter(|d| !good.contains_key(d) && !corrupt.contains(d) && !self.has_blob(d))
            .copied()
            .collect();
        missing.sort_unstable();
        report.missing_blobs = missing;
        Ok(unindexed)
    }

    /// Records against the blobs: those whose outputs are not all intact
    /// (returned by key, to delete), and how many blobs no record uses.
    fn verify_records(
        &self,
        report: &mut VerifyReport,
        good: &HashMap<BlobDigest, Sizes>,
        corrupt: &HashSet<BlobDigest>,
    ) -> Result<Vec<String>, CacheError> {
        let records: Vec<(String, String)> = self.with_conn(|c| {
            let mut st = c.prepare("SELECT key, outputs FROM records ORDER BY key")?;
            let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
            Ok(rows.collect::<Result<_, _>>()?)
        })?;
        let mut broken_hex = Vec::new();
        let mut referenced: HashSet<BlobDigest> = HashSet::new();
        for (hex, outputs) in records {
            let intact = serde_json::from_str::<BTreeMap<String, Output>>(&outputs)
                .ok()
                .filter(|outs| {
                    outs.values().all(|o| {
                        good.contains_key(&o.digest)
                            || (!corrupt.contains(&o.digest) && self.has_blob(&o.digest))
                    })
                });
            match intact {
                Some(outs) => referenced.extend(outs.values().map(|o| o.digest)),
                None => {
                    // The key column is only ever written from a NodeKey.
                    if let Ok(k) = hex.parse() {
                        report.broken_records.push(k);
                    }
                    broken_hex.push(hex);
                }
            }
        }
        report.orphan_blobs = good.keys().filter(|d| !referenced.contains(d)).count() as u64;
        Ok(broken_hex)
    }

    /// Repairs the index: indexes `unindexed` blobs, drops rows of blobs
    /// `missing` on disk and records in `broken` — each re-checked under
    /// the write lock, so nothing a concurrent writer just installed goes.
    fn repair_index(
        &self,
        unindexed: &[(BlobDigest, Sizes)],
        missing: &[BlobDigest],
        broken: &[String],
    ) -> Result<(), CacheError> {
        let now = to_sql_int(self.now());
        self.with_conn(|c| {
            let tx = self.begin_write(c)?;
            for (d, (csize, lsize)) in unindexed {
                tx.execute(
                    "INSERT INTO blobs (digest, csize, lsize, last_access)
                     VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT (digest) DO UPDATE SET
                         csize = excluded.csize, lsize = excluded.lsize",
                    params![d.to_hex(), to_sql_int(*csize), to_sql_int(*lsize), now],
                )?;
            }
            for d in missing {
                // Re-checked under the write lock: never drop the row of
                // a blob that a concurrent writer just installed.
                if !self.has_blob(d) {
                    tx.execute("DELETE FROM blobs WHERE digest = ?1", [d.to_hex()])?;
                }
            }
            for hex in broken {
                // Re-checked too: a writer may have replaced the record.
                let outputs: Option<String> = tx
                    .query_row("SELECT outputs FROM records WHERE key = ?1", [hex], |r| {
                        r.get(0)
                    })
                    .optional()?;
                let now_intact = outputs
                    .and_then(|o| serde_json::from_str::<BTreeMap<String, Output>>(&o).ok())
                    .is_some_and(|outs| outs.values().all(|o| self.has_blob(&o.digest)));
                if !now_intact {
                    delete_record(&tx, hex)?;
                }
            }
            tx.commit()?;
            Ok(())
        })?;
        Ok(())
    }

    fn stray(
        &self,
        report: &mut VerifyReport,
        path: PathBuf,
        repair: bool,
    ) -> Result<(), CacheError> {
        if repair {
            if path.is_dir() {
                fs::remove_dir_all(&path).at("removing stray directory", &path)?;
            } else {
                remove_file_if_exists(&path)?;
            }
        }
        report.stray_files.push(path);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An index `verify` cannot open (here a directory where the file
    /// was; for a user, a store another user owns) is an error, never
    /// damage: with `--repair`, damage would move a healthy index aside and
    /// lose every record in it.
    #[test]
    fn an_index_that_cannot_be_opened_is_an_error_not_damage() {
        let tmp = tempfile::tempdir().expect("tmp");
        let store = Store::open(tmp.path()).expect("open");
        let db = tmp.path().join("index.db");
        let kept = tmp.path().join("index.db.kept");
        store.close_idle_connections();
        fs::rename(&db, &kept).expect("rename");
        fs::create_dir(&db).expect("mkdir");
        for repair in [false, true] {
            let err = store
                .verify(repair)
                .expect_err("an index that cannot be opened is an error");
            assert!(!is_damage(&err), "repair={repair}: {err}");
        }
        assert!(kept.is_file() && db.is_dir(), "nothing moved aside");
    }
}
