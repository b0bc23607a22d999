//! File digests with a stat cache.
//!
//! Source nodes hash every input file (blake3 of the content). Re-hashing an
//! unchanged project on every run would dominate a no-op build, so a stat
//! cache maps (absolute path, size, mtime, inode) → digest: an unchanged stat
//! is trusted, a changed one re-hashes. The cache is a small file in the
//! store directory; it never enters a key (keys use project-relative paths
//! and contents only), so moving the project or touching mtimes changes no
//! key — it only costs a re-hash.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// A file's identity as the stat cache sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Stat {
    size: u64,
    mtime_ns: i128,
    ino: u64,
}

#[derive(Serialize, Deserialize)]
struct Entry {
    path: PathBuf,
    stat: Stat,
    digest: String,
}

/// Hashes files, remembering digests by stat.
#[derive(Default)]
pub struct FileHasher {
    map: Mutex<HashMap<PathBuf, (Stat, String)>>,
    file: Option<PathBuf>,
    dirty: std::sync::atomic::AtomicBool,
    hashed: std::sync::atomic::AtomicU64,
}

impl FileHasher {
    /// A hasher without a persistent cache.
    pub fn in_memory() -> Self {
        Self::default()
    }

    /// A hasher whose cache lives in `file` (loaded now, saved by [`FileHasher::save`]).
    pub fn with_cache_file(file: PathBuf) -> Self {
        let mut map = HashMap::new();
        if let Ok(bytes) = std::fs::read(&file)
            && let Ok(entries) = serde_json::from_slice::<Vec<Entry>>(&bytes)
        {
            for e in entries {
                map.insert(e.path, (e.stat, e.digest));
            }
        }
        FileHasher {
            map: Mutex::new(map),
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
        let meta = std::fs::metadata(path)?;
        let stat = Stat {
            size: meta.len(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
            ino: meta.ino(),
        };
        if let Ok(m) = self.map.lock()
            && let Some((s, d)) = m.get(path)
            && *s == stat
        {
            return Ok(d.clone());
        }
        let digest = hash_file(path, meta.len())?;
        self.hashed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Ok(mut m) = self.map.lock() {
            m.insert(path.to_path_buf(), (stat, digest.clone()));
        }
        self.dirty.store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(digest)
    }

    /// Writes the cache back when anything changed (atomically).
    pub fn save(&self) -> std::io::Result<()> {
        let Some(file) = &self.file else {
            return Ok(());
        };
        if !self.dirty.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(());
        }
        let entries: Vec<Entry> = match self.map.lock() {
            Ok(m) => m
                .iter()
                .filter(|(p, _)| p.exists())
                .map(|(p, (s, d))| Entry {
                    path: p.clone(),
                    stat: *s,
                    digest: d.clone(),
                })
                .collect(),
            Err(_) => return Ok(()),
        };
        let bytes = serde_json::to_vec(&entries).map_err(std::io::Error::other)?;
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let tmp = file.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(tmp, file)
    }
}

/// blake3 of a file: memory-mapped and multi-threaded for large files.
pub fn hash_file(path: &Path, size: u64) -> std::io::Result<String> {
    let mut h = blake3::Hasher::new();
    if size >= 1 << 20 {
        h.update_mmap_rayon(path)?;
    } else {
        let mut f = std::fs::File::open(path)?;
        let mut buf = Vec::with_capacity(size as usize);
        f.read_to_end(&mut buf)?;
        h.update(&buf);
    }
    Ok(h.finalize().to_hex().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unchanged_stat_is_trusted_and_changes_rehash() {
        let t = tempfile::tempdir().expect("tmp");
        let f = t.path().join("a");
        std::fs::write(&f, b"one").expect("write");
        let h = FileHasher::with_cache_file(t.path().join("stat.json"));
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
        let h2 = FileHasher::with_cache_file(t.path().join("stat.json"));
        assert_eq!(h2.digest(&f).expect("cached"), d1);
        assert_eq!(h2.hashed_count(), 0);
        // Changing the content (and so the stat) re-hashes.
        std::fs::write(&f, b"two!").expect("write");
        let d2 = h2.digest(&f).expect("changed");
        assert_eq!(d2, blake3::hash(b"two!").to_hex().to_string());
        assert_eq!(h2.hashed_count(), 1);
    }

    #[test]
    fn large_files_hash_like_small_ones() {
        let t = tempfile::tempdir().expect("tmp");
        let f = t.path().join("big");
        let data: Vec<u8> = (0..(3u32 << 20)).map(|i| (i % 251) as u8).collect();
        std::fs::write(&f, &data).expect("write");
        assert_eq!(
            hash_file(&f, data.len() as u64).expect("hash"),
            blake3::hash(&data).to_hex().to_string()
        );
    }
}
