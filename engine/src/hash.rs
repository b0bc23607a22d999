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
//! the stat, as in the no-op journal ([`crate::journal`]).
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
fn ns(secs: i64, nsecs: i64) -> i64 {
    secs.saturating_mul(1_000_000_000).saturating_add(nsecs)
}

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[derive(Serialize, Deserialize)]
struct Entry {
    path: PathBuf,
    stat: Stat,
    digest: String,
}

/// An [`Entry`] borrowed from the map, for saving (the same encoding).
#[derive(Serialize)]
struct EntryRef<'a> {
    path: &'a Path,
    stat: Stat,
    digest: String,
}

/// [`CacheFile`] borrowing its entries (the same encoding).
#[derive(Serialize)]
struct CacheFileRef<'a> {
    pruned_len: u64,
    entries: Vec<EntryRef<'a>>,
}

/// The cache file: its entries, and how many were left after the last
/// prune (entries of deleted files are dropped when the cache has grown to
/// twice that, not on every save: a save after an edit should not stat
/// every file ever hashed).
#[derive(Serialize, Deserialize)]
struct CacheFile {
    pruned_len: u64,
    entries: Vec<Entry>,
}

/// A cache this small is never pruned on save (only by [`FileHasher::prune`]).
const PRUNE_FLOOR: u64 = 4096;

/// The cache's map: a path's bytes (hashed in one go: `Path`'s own `Hash`
/// goes component by component, which was most of the cost of loading the
/// cache) → its stat and digest. Byte equality is at least as strict as
/// `Path`'s, so a path spelled differently only misses (and re-hashes).
///
/// Kept compact (the digest as its 32 bytes, not hex): at 10,000 candies
/// the cache holds ~100,000 entries for the whole run.
type Map = HashMap<Box<[u8]>, (Stat, BlobDigest)>;

fn key_of(path: &Path) -> &[u8] {
    path.as_os_str().as_bytes()
}

fn path_of(key: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(key))
}

/// Hashes files, remembering digests by stat.
pub struct FileHasher {
    map: Mutex<Map>,
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
            map: Mutex::default(),
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
        let mut map = Map::new();
        let mut pruned_len = 0;
        // A file in an older format is not read: the cache starts empty.
        if let Ok(bytes) = std::fs::read(&file)
            && let Ok(f) = postcard::from_bytes::<CacheFile>(&bytes)
        {
            pruned_len = f.pruned_len;
            map.reserve(f.entries.len());
            for e in f.entries {
                // An entry whose digest does not parse is left out (its file
                // is hashed again).
                if let Ok(d) = e.digest.parse::<BlobDigest>() {
                    map.insert(e.path.into_os_string().into_vec().into(), (e.stat, d));
                }
            }
        }
        FileHasher {
            map: Mutex::new(map),
            file: Some(file),
            pruned_len: pruned_len.into(),
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
        let stat = Stat::of(&meta);
        if let Ok(m) = self.map.lock()
            && let Some((s, d)) = m.get(key_of(path))
            && *s == stat
        {
            return Ok(d.to_hex());
        }
        let digest = hash_file(path, meta.len())?;
        self.hashed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Ok(mut m) = self.map.lock() {
            // A racy stat is not remembered: the file is hashed again next
            // time (an old entry for it must not survive either).
            let changed = if stat.is_racy(now, self.racy_ns) {
                m.remove(key_of(path)).is_some()
            } else {
                m.insert(key_of(path).into(), (stat, digest));
                true
            };
            if changed {
                self.dirty.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        Ok(digest.to_hex())
    }

    /// Drops the entries of files that no longer exist (a stat each) and
    /// saves the cache (`charly cache gc`).
    pub fn prune(&self) -> std::io::Result<usize> {
        let removed = match self.map.lock() {
            Ok(mut m) => {
                let gone: Vec<Box<[u8]>> = m
                    .par_iter()
                    .filter(|(p, _)| !path_of(p).exists())
                    .map(|(p, _)| p.clone())
                    .collect();
                for p in &gone {
                    m.remove(p);
                }
                self.pruned_len
                    .store(m.len() as u64, std::sync::atomic::Ordering::Relaxed);
                gone.len()
            }
            Err(_) => 0,
        };
        self.dirty.store(true, std::sync::atomic::Ordering::Relaxed);
        self.save()?;
        Ok(removed)
    }

    /// Writes the cache back when anything changed (atomically).
    pub fn save(&self) -> std::io::Result<()> {
        let Some(file) = &self.file else {
            return Ok(());
        };
        if !self.dirty.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(());
        }
        let _t = crate::timings::phase("stat cache: save");
        let pruned_len = self.pruned_len.load(std::sync::atomic::Ordering::Relaxed);
        let bytes = match self.map.lock() {
            Ok(m) => {
                // Entries of deleted files are dropped (a stat each, in
                // parallel) once the cache has doubled since the last time.
                let prune = m.len() as u64 > 2 * pruned_len.max(PRUNE_FLOOR);
                let entries: Vec<EntryRef> = m
                    .par_iter()
                    .filter(|(p, _)| !prune || path_of(p).exists())
                    .map(|(p, (s, d))| EntryRef {
                        path: path_of(p),
                        stat: *s,
                        digest: d.to_hex(),
                    })
                    .collect();
                let pruned_len = if prune {
                    entries.len() as u64
                } else {
                    pruned_len
                };
                self.pruned_len
                    .store(pruned_len, std::sync::atomic::Ordering::Relaxed);
                postcard::to_stdvec(&CacheFileRef {
                    pruned_len,
                    entries,
                })
                .map_err(std::io::Error::other)?
            }
            Err(_) => return Ok(()),
        };
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let tmp = file.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(tmp, file)?;
        // Saved: a later save in the same run writes only what changed since.
        self.dirty
            .store(false, std::sync::atomic::Ordering::Relaxed);
        Ok(())
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
        let mut h = FileHasher::with_cache_file(cache);
        h.racy_ns = 0;
        assert_eq!(h.digest(&a).expect("a"), planted);
        assert_eq!(h.hashed_count(), 0);
        assert_eq!(
            h.digest(&b).expect("b"),
            blake3::hash(b"two").to_hex().to_string()
        );
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
        let len = |c: &Path| {
            postcard::from_bytes::<CacheFile>(&std::fs::read(c).expect("read"))
                .expect("decode")
                .entries
                .len()
        };
        assert_eq!(len(&cache), 2, "the save kept b's entry");
        let h = FileHasher::with_cache_file(cache.clone());
        assert_eq!(h.prune().expect("prune"), 1);
        assert_eq!(len(&cache), 1);
        let f: CacheFile =
            postcard::from_bytes(&std::fs::read(&cache).expect("read")).expect("decode");
        assert_eq!(f.pruned_len, 1);
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
