//! File digests with a stat cache.
//!
//! Source nodes hash every input file (blake3 of the content). Re-hashing an
//! unchanged project on every run would dominate a no-op build, so a stat
//! cache maps (absolute path, size, mtime, ctime, inode) → digest: an
//! unchanged stat is trusted, a changed one re-hashes. The cache is a small
//! file in the store directory; it never enters a key (keys use
//! project-relative paths and contents only), so moving the project or
//! touching mtimes changes no key — it only costs a re-hash.
//!
//! mtime alone is not enough: it can be set back by anyone (`touch -d`,
//! `cp -p`, `tar x`, an editor restoring it), so a same-size edit with the old
//! mtime restored would keep a stale digest. ctime cannot be set from user
//! space and changes on every write and every mtime change, so it is part of
//! the stat, as in the no-op journal (`journal`).
//!
//! Timestamps are coarse (a kernel tick), so a file changed in the same tick
//! as it was hashed could keep its stat ("racy git"). Like the journal, the
//! cache does not trust a stat whose mtime or ctime is within
//! [`RACY_NS`] of the moment it was hashed: such a file is
//! hashed again next time, until its timestamps are old enough.

use charly_cache::BlobDigest;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Files modified this close (nanoseconds) to a fingerprint are not trusted
/// by stat alone: the stat cache rehashes them, the journal does not replay
/// over them.
pub const RACY_NS: i64 = 2_000_000_000;

/// A file's identity as the stat cache sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Stat {
    size: u64,
    // i64 (until 2262): postcard writes i64 and i128 alike (zigzag
    // varints), so the cache file reads the same either way, and an entry
    // takes 32 bytes instead of 48.
    mtime_ns: i64,
    ctime_ns: i64,
    ino: u64,
}

impl Stat {
    fn of(meta: &std::fs::Metadata) -> Stat {
        Stat {
            size: meta.len(),
            mtime_ns: ns(meta.mtime(), meta.mtime_nsec()),
            ctime_ns: ns(meta.ctime(), meta.ctime_nsec()),
            ino: meta.ino(),
        }
    }

    /// Whether the file changed within `racy_ns` before `now_ns`: too recent
    /// for its timestamps to tell a later same-tick change apart.
    fn is_racy(&self, now_ns: i64, racy_ns: i64) -> bool {
        self.mtime_ns.max(self.ctime_ns) > now_ns.saturating_sub(racy_ns)
    }
}

/// A timestamp in nanoseconds (saturating: a time set beyond what an i64
/// holds only loses precision; the ctime, which nobody can set, still
/// tells changes apart).
pub(crate) fn ns(secs: i64, nsecs: i64) -> i64 {
    secs.saturating_mul(1_000_000_000).saturating_add(nsecs)
}

pub(crate) fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

mod table;
use table::{Row, Table};

/// The cache file as earlier versions wrote it (postcard, digests as hex):
/// read once, when no file of the current layout is there.
#[derive(Serialize, Deserialize)]
struct CacheFile {
    pruned_len: u64,
    entries: Vec<Entry>,
}

#[derive(Serialize, Deserialize)]
struct Entry {
    path: PathBuf,
    stat: Stat,
    digest: String,
}

/// A cache this small is never pruned on save (only by [`FileHasher::prune`]).
const PRUNE_FLOOR: u64 = 4096;

/// What this run learnt on top of the file: a path's bytes → its stat and
/// digest, or `None` for an entry of the file that no longer holds.
/// Byte equality is at least as strict as `Path`'s, so a path spelled
/// differently only misses (and re-hashes).
type Overlay = HashMap<Box<[u8]>, Learnt>;

/// A file's stat and digest as this run found them, or `None`: the
/// file's entry no longer holds.
type Learnt = Option<(Stat, BlobDigest)>;

fn key_of(path: &Path) -> &[u8] {
    path.as_os_str().as_bytes()
}

fn path_of(key: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(key))
}

/// The table of an earlier version's file, converted.
fn convert(bytes: &[u8]) -> Option<Table> {
    let f = postcard::from_bytes::<CacheFile>(bytes).ok()?;
    // An entry whose digest does not parse is left out (its file is hashed
    // again).
    let mut rows: Vec<(Vec<u8>, Stat, BlobDigest)> = f
        .entries
        .into_iter()
        .filter_map(|e| {
            let d = e.digest.parse::<BlobDigest>().ok()?;
            Some((e.path.into_os_string().into_vec(), e.stat, d))
        })
        .collect();
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    rows.dedup_by(|a, b| a.0 == b.0);
    let rows: Vec<Row> = rows
        .iter()
        .map(|(p, s, d)| (p.as_slice(), *s, *d))
        .collect();
    Table::parse(Table::encode(&rows, f.pruned_len))
}

/// Hashes files, remembering digests by stat.
pub struct FileHasher {
    /// The cache file as loaded (never changed during a run).
    table: Table,
    overlay: Mutex<Overlay>,
    file: Option<PathBuf>,
    dirty: std::sync::atomic::AtomicBool,
    hashed: std::sync::atomic::AtomicU64,
    /// Entries after the last prune (see [`CacheFile`]).
    pruned_len: std::sync::atomic::AtomicU64,
    /// How recent a change must be for its stat not to be remembered
    /// ([`RACY_NS`]; tests shrink it instead of waiting).
    pub racy_ns: i64,
}

impl Default for FileHasher {
    fn default() -> Self {
        FileHasher {
            table: Table::default(),
            overlay: Mutex::default(),
            file: None,
            dirty: std::sync::atomic::AtomicBool::default(),
            hashed: std::sync::atomic::AtomicU64::default(),
            pruned_len: std::sync::atomic::AtomicU64::default(),
            racy_ns: RACY_NS,
        }
    }
}

impl FileHasher {
    /// A hasher without a persistent cache.
    pub fn in_memory() -> Self {
        Self::default()
    }

    /// A hasher whose cache lives in `file` (loaded now, saved by [`FileHasher::save`]).
    pub fn with_cache_file(file: PathBuf) -> Self {
        let _t = crate::timings::phase("stat cache: load");
        // A damaged file, or one in a format this version does not know,
        // is not used: the cache starts empty. One of the earlier layout is
        // converted, and saved in the current one.
        let (table, converted) = match std::fs::read(&file) {
            Ok(bytes) if Table::is_current(&bytes) => (Table::parse(bytes), false),
            Ok(bytes) => (convert(&bytes), true),
            Err(_) => (None, false),
        };
        let table = table.unwrap_or_default();
        FileHasher {
            pruned_len: table.pruned_len().into(),
            dirty: (converted && table.len() > 0).into(),
            table,
            file: Some(file),
            ..Self::default()
        }
    }

    /// How many files were actually read and hashed (not served by stat).
    pub fn hashed_count(&self) -> u64 {
        self.hashed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The blake3 hex digest of a file's content.
    pub fn digest(&self, path: &Path) -> std::io::Result<String> {
        let now = now_ns();
        let meta = std::fs::metadata(path)?;
        self.digest_of(path, &meta, now).map(|d| d.to_hex())
    }

    /// The size and digest of `path` when it is a regular file itself (not
    /// a symlink to one); `None` for anything else. One stat: verifying a
    /// build directory asks this of every file in it.
    pub fn regular_file(&self, path: &Path) -> std::io::Result<Option<(u64, BlobDigest)>> {
        let now = now_ns();
        let meta = std::fs::symlink_metadata(path)?;
        if !meta.is_file() {
            return Ok(None);
        }
        Ok(Some((meta.len(), self.digest_of(path, &meta, now)?)))
    }

    /// [`FileHasher::digest`] given the file's metadata, read at or after
    /// `now`.
    fn digest_of(
        &self,
        path: &Path,
        meta: &std::fs::Metadata,
        now: i64,
    ) -> std::io::Result<BlobDigest> {
        let stat = Stat::of(meta);
        let key = key_of(path);
        let known = match self.overlay.lock() {
            Ok(m) => match m.get(key) {
                Some(learnt) => *learnt,
                None => self.table.get(key),
            },
            Err(_) => None,
        };
        if let Some((s, d)) = known
            && s == stat
        {
            return Ok(d);
        }
        let digest = hash_file(path, meta.len())?;
        self.hashed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Ok(mut m) = self.overlay.lock() {
            // A racy stat is not remembered: the file is hashed again next
            // time (an old entry for it must not survive either).
            let changed = if stat.is_racy(now, self.racy_ns) {
                known.is_some() && {
                    m.insert(key.into(), None);
                    true
                }
            } else {
                m.insert(key.into(), Some((stat, digest)));
                true
            };
            if changed {
                self.dirty.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        Ok(digest)
    }

    /// Drops the entries of files that no longer exist (a stat each) and
    /// saves the cache (`charly cache gc`).
    pub fn prune(&self) -> std::io::Result<usize> {
        self.write(true)
    }

    /// Writes the cache back when anything changed (atomically).
    pub fn save(&self) -> std::io::Result<()> {
        if !self.dirty.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(());
        }
        self.write(false).map(drop)
    }

    /// Writes the file's entries with what this run learnt over them,
    /// dropping those of deleted files (a stat each, in parallel) when
    /// `prune` says so or the cache has doubled since the last prune.
    /// Returns how many were dropped.
    fn write(&self, prune: bool) -> std::io::Result<usize> {
        let Some(file) = &self.file else {
            return Ok(0);
        };
        let _t = crate::timings::phase("stat cache: save");
        let Ok(overlay) = self.overlay.lock() else {
            return Ok(0);
        };
        let mut learnt: Vec<(&[u8], &Learnt)> = overlay.iter().map(|(k, v)| (&**k, v)).collect();
        learnt.sort_unstable_by(|a, b| a.0.cmp(b.0));
        // Both lists are in path order: merged, what was learnt wins.
        let mut rows: Vec<Row> = Vec::with_capacity(self.table.len() + learnt.len());
        let mut old = self.table.rows().peekable();
        for (path, v) in learnt {
            while let Some(r) = old.next_if(|r| r.0 < path) {
                rows.push(r);
            }
            old.next_if(|r| r.0 == path);
            if let Some((s, d)) = v {
                rows.push((path, *s, *d));
            }
        }
        rows.extend(old);
        let pruned_len = self.pruned_len.load(std::sync::atomic::Ordering::Relaxed);
        let mut removed = 0;
        let pruned_len = if prune || rows.len() as u64 > 2 * pruned_len.max(PRUNE_FLOOR) {
            let exists: Vec<bool> = rows.par_iter().map(|r| path_of(r.0).exists()).collect();
            let mut keep = exists.into_iter();
            let before = rows.len();
            rows.retain(|_| keep.next().unwrap_or(false));
            removed = before - rows.len();
            rows.len() as u64
        } else {
            pruned_len
        };
        let bytes = Table::encode(&rows, pruned_len);
        drop(rows);
        drop(overlay);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let tmp = file.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(tmp, file)?;
        self.pruned_len
            .store(pruned_len, std::sync::atomic::Ordering::Relaxed);
        // Saved: a later save in the same run writes only if something
        // changed since.
        self.dirty
            .store(false, std::sync::atomic::Ordering::Relaxed);
        Ok(removed)
    }
}

/// blake3 of a file: memory-mapped and multi-threaded for large files.
pub fn hash_file(path: &Path, size: u64) -> std::io::Result<BlobDigest> {
    let mut h = blake3::Hasher::new();
    if size >= 1 << 20 {
        h.update_mmap_rayon(path)?;
    } else {
        let mut f = std::fs::File::open(path)?;
        let mut buf = Vec::with_capacity(size as usize);
        f.read_to_end(&mut buf)?;
        h.update(&buf);
    }
    Ok(BlobDigest::from_bytes(*h.finalize().as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `regular_file` answers for regular files only, with the digest
    /// `digest` gives, and from the stat cache the second time.
    #[test]
    fn regular_file_is_size_and_digest_of_regular_files_only() {
        let t = tempfile::tempdir().expect("tmp");
        let f = t.path().join("f");
        std::fs::write(&f, b"bytes").expect("write");
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&f, &link).expect("symlink");
        let mut h = FileHasher::in_memory();
        h.racy_ns = 0;
        let want = BlobDigest::from_bytes(*blake3::hash(b"bytes").as_bytes());
        assert_eq!(h.regular_file(&f).expect("f"), Some((5, want)));
        assert_eq!(h.regular_file(&f).expect("f"), Some((5, want)));
        assert_eq!(h.hashed_count(), 1, "the second answer came from the cache");
        assert_eq!(h.digest(&f).expect("f"), want.to_hex());
        assert_eq!(h.regular_file(&link).expect("link"), None);
        assert_eq!(h.regular_file(t.path()).expect("dir"), None);
        assert!(h.regular_file(&t.path().join("missing")).is_err());
    }

    /// A cache written when stats were kept as i128 (the encoding is the
    /// same) still serves its digests; a bad digest only drops its entry.
    #[test]
    fn a_cache_file_of_the_earlier_layout_still_serves() {
        #[derive(Serialize)]
        struct OldStat {
            size: u64,
            mtime_ns: i128,
            ctime_ns: i128,
            ino: u64,
        }
        #[derive(Serialize)]
        struct OldEntry {
            path: PathBuf,
            stat: OldStat,
            digest: String,
        }
        #[derive(Serialize)]
        struct OldFile {
            pruned_len: u64,
            entries: Vec<OldEntry>,
        }
        let t = tempfile::tempdir().expect("tmp");
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        std::fs::write(&a, b"one").expect("write");
        std::fs::write(&b, b"two").expect("write");
        let old = |p: &Path, digest: String| {
            let m = std::fs::metadata(p).expect("stat");
            OldEntry {
                path: p.to_path_buf(),
                stat: OldStat {
                    size: m.len(),
                    mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
                    ctime_ns: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
                    ino: m.ino(),
                },
                digest,
            }
        };
        // A made-up digest for `a`: served only if the entry was read.
        let planted = "ab".repeat(32);
        let file = OldFile {
            pruned_len: 0,
            entries: vec![old(&a, planted.clone()), old(&b, "not hex".into())],
        };
        let cache = t.path().join("stat.bin");
        std::fs::write(&cache, postcard::to_stdvec(&file).expect("encode")).expect("write");
        let mut h = FileHasher::with_cache_file(cache.clone());
        h.racy_ns = 0;
        assert_eq!(h.digest(&a).expect("a"), planted);
        assert_eq!(h.hashed_count(), 0);
        // Saved in the current layout even when nothing was hashed.
        h.save().expect("save");
        let table = Table::parse(std::fs::read(&cache).expect("read")).expect("current layout");
        assert_eq!(table.len(), 1, "the entry with a bad digest was left out");
        assert_eq!(
            h.digest(&b).expect("b"),
            blake3::hash(b"two").to_hex().to_string()
        );
        assert_eq!(h.hashed_count(), 1);
    }

    /// What a run learns is merged over the file in path order; an entry
    /// that no longer holds (a racy rewrite) leaves the file; a damaged
    /// file is not used.
    #[test]
    fn saves_merge_over_the_file_and_damage_starts_empty() {
        let t = tempfile::tempdir().expect("tmp");
        let cache = t.path().join("stat.bin");
        let names = ["c", "a", "b", "d"];
        for n in names {
            std::fs::write(t.path().join(n), n).expect("write");
        }
        let mut h = FileHasher::with_cache_file(cache.clone());
        h.racy_ns = 0;
        for n in ["c", "a"] {
            h.digest(&t.path().join(n)).expect("digest");
        }
        h.save().expect("save");
        let mut h = FileHasher::with_cache_file(cache.clone());
        h.racy_ns = 0;
        for n in ["d", "b", "a"] {
            h.digest(&t.path().join(n)).expect("digest");
        }
        assert_eq!(h.hashed_count(), 2, "a came from the file");
        // `c` rewritten just now: with the default window its stat is racy,
        // so its entry must go.
        std::fs::write(t.path().join("c"), "c2").expect("rewrite");
        h.racy_ns = RACY_NS;
        h.digest(&t.path().join("c")).expect("digest");
        h.save().expect("save");
        let rows: Vec<String> = Table::parse(std::fs::read(&cache).expect("read"))
            .expect("parses")
            .rows()
            .map(|(p, _, d)| {
                let name = path_of(p).file_name().expect("name").to_string_lossy();
                assert_eq!(d.to_hex(), blake3::hash(name.as_bytes()).to_hex().as_str());
                name.into_owned()
            })
            .collect();
        assert_eq!(rows, ["a", "b", "d"]);
        // One flipped byte: nothing is served from the file.
        let mut bytes = std::fs::read(&cache).expect("read");
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&cache, bytes).expect("write");
        let mut h = FileHasher::with_cache_file(cache);
        h.racy_ns = 0;
        h.digest(&t.path().join("a")).expect("digest");
        assert_eq!(h.hashed_count(), 1);
    }

    #[test]
    fn unchanged_stat_is_trusted_and_changes_rehash() {
        let t = tempfile::tempdir().expect("tmp");
        let f = t.path().join("a");
        std::fs::write(&f, b"one").expect("write");
        let mut h = FileHasher::with_cache_file(t.path().join("stat.bin"));
        h.racy_ns = 0;
        let d1 = h.digest(&f).expect("digest");
        assert_eq!(d1, blake3::hash(b"one").to_hex().to_string());
        assert_eq!(h.digest(&f).expect("again"), d1);
        assert_eq!(
            h.hashed_count(),
            1,
            "second lookup served by the stat cache"
        );
        h.save().expect("save");
        // A fresh hasher loads the cache and does not re-read the file.
        let mut h2 = FileHasher::with_cache_file(t.path().join("stat.bin"));
        h2.racy_ns = 0;
        assert_eq!(h2.digest(&f).expect("cached"), d1);
        assert_eq!(h2.hashed_count(), 0);
        // Changing the content (and so the stat) re-hashes.
        std::fs::write(&f, b"two!").expect("write");
        let d2 = h2.digest(&f).expect("changed");
        assert_eq!(d2, blake3::hash(b"two!").to_hex().to_string());
        assert_eq!(h2.hashed_count(), 1);
    }

    /// Saving does not stat every entry (a small cache keeps the entries of
    /// deleted files); `prune` drops them, and the file says how many were
    /// left.
    #[test]
    fn deleted_files_are_dropped_by_prune_not_by_every_save() {
        let t = tempfile::tempdir().expect("tmp");
        let cache = t.path().join("stat.bin");
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        std::fs::write(&a, b"a").expect("write");
        std::fs::write(&b, b"b").expect("write");
        let mut h = FileHasher::with_cache_file(cache.clone());
        h.racy_ns = 0;
        h.digest(&a).expect("a");
        h.digest(&b).expect("b");
        h.save().expect("save");
        std::fs::remove_file(&b).expect("rm");
        let mut h = FileHasher::with_cache_file(cache.clone());
        h.racy_ns = 0;
        std::fs::write(&a, b"a2").expect("edit");
        h.digest(&a).expect("a again");
        h.save().expect("save");
        let table = |c: &Path| Table::parse(std::fs::read(c).expect("read")).expect("parses");
        let len = |c: &Path| table(c).len();
        assert_eq!(len(&cache), 2, "the save kept b's entry");
        let h = FileHasher::with_cache_file(cache.clone());
        assert_eq!(h.prune().expect("prune"), 1);
        assert_eq!(len(&cache), 1);
        assert_eq!(table(&cache).pruned_len(), 1);
    }

    /// Finding 10 of issue 18: a same-size, same-inode edit with the old
    /// mtime restored must not keep the stale digest (ctime changed).
    #[test]
    fn same_size_edit_with_restored_mtime_rehashes() {
        let t = tempfile::tempdir().expect("tmp");
        let f = t.path().join("a");
        std::fs::write(&f, b"aaaa").expect("write");
        let old = std::fs::metadata(&f)
            .and_then(|m| m.modified())
            .expect("mtime");
        let ino = std::fs::metadata(&f).expect("meta").ino();
        let mut h = FileHasher::in_memory();
        h.racy_ns = 0;
        let d1 = h.digest(&f).expect("digest");
        assert_eq!(h.digest(&f).expect("again"), d1, "served by stat");
        assert_eq!(h.hashed_count(), 1);
        // Let the clock move past the kernel's timestamp tick.
        std::thread::sleep(std::time::Duration::from_millis(30));
        std::fs::write(&f, b"bbbb").expect("rewrite");
        std::fs::File::options()
            .write(true)
            .open(&f)
            .and_then(|file| file.set_modified(old))
            .expect("restore mtime");
        let m = std::fs::metadata(&f).expect("meta");
        assert_eq!((m.len(), m.ino(), m.modified().ok()), (4, ino, Some(old)));
        let d2 = h.digest(&f).expect("digest after edit");
        assert_eq!(d2, blake3::hash(b"bbbb").to_hex().to_string());
    }

    #[test]
    fn racy_stats_are_not_trusted() {
        let t = tempfile::tempdir().expect("tmp");
        let f = t.path().join("a");
        std::fs::write(&f, b"one").expect("write");
        // Default window: a file written just now is hashed every time.
        let h = FileHasher::in_memory();
        h.digest(&f).expect("digest");
        h.digest(&f).expect("again");
        assert_eq!(h.hashed_count(), 2);
    }

    #[test]
    fn large_files_hash_like_small_ones() {
        let t = tempfile::tempdir().expect("tmp");
        let f = t.path().join("big");
        let data: Vec<u8> = (0..(3u32 << 20)).map(|i| (i % 251) as u8).collect();
        std::fs::write(&f, &data).expect("write");
        assert_eq!(
            hash_file(&f, data.len() as u64).expect("hash").to_hex(),
            blake3::hash(&data).to_hex().to_string()
        );
    }
}
