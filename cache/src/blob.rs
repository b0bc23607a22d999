//! Blob I/O: putting content into the store and verified reads out of it.
//!
//! Writing: content is hashed and encoded (see [`crate::frames`]) into a temp
//! file in this process's session directory (same filesystem as `blobs/`),
//! which is fsynced (not for [`Store::put_derived_blob`]). Then, inside an
//! index write transaction, the temp file is
//! renamed to `blobs/<2 hex>/<hex>` unless that already exists, and the blob's
//! index row is upserted; the shard directory is fsynced before `put_*`
//! returns. Renaming under the index lock makes "file present" and "row
//! present" change together as far as GC is concerned, which deletes both
//! inside its own transaction. An existing blob is never overwritten.
//!
//! Reading: decode and hash in one pass; bytes reach the caller (or the
//! destination file's final name) only after the digest matched. A mismatch
//! or an undecodable file moves the blob to `quarantine/` and the read is a
//! miss.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{OptionalExtension, params};
use tempfile::NamedTempFile;

use crate::error::IoContext;
use crate::frames::{BATCH, Dest, FrameWriter, ReadOutcome, read_blob, read_full};
use crate::store::{ACCESS_RESOLUTION_SECS, from_sql_int, to_sql_int};
use crate::{BlobDigest, CacheError, Output, Store};

fn fsync_dir(dir: &Path) -> Result<(), CacheError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .at("syncing directory", dir)
}

static QUARANTINE_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Identity of an open file, to make sure we quarantine the file we read and
/// not a good copy another process installed meanwhile.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileId(u64, u64);

impl FileId {
    pub(crate) fn of(m: &fs::Metadata) -> FileId {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            FileId(m.dev(), m.ino())
        }
        #[cfg(not(unix))]
        {
            let _ = m;
            FileId(0, 0)
        }
    }
}

/// Blob files up to this size (compressed) are read without the index:
/// [`Store::get_blob`].
const SMALL_BLOB_FILE: u64 = 64 * 1024;

impl Store {
    /// Path of a blob's file (which may or may not exist).
    pub(crate) fn blob_path(&self, d: &BlobDigest) -> PathBuf {
        let hex = d.to_hex();
        self.blobs_dir.join(&hex[..2]).join(hex)
    }

    /// Stores `bytes`; returns their digest. Idempotent.
    pub fn put_blob(&self, bytes: &[u8]) -> Result<BlobDigest, CacheError> {
        self.put_bytes(bytes, true)
    }

    /// Stores `bytes` that charly derived in process from a node's inputs (a
    /// Containerfile fragment, a build directory's files), without the fsyncs
    /// of [`Store::put_blob`]: writing thousands of small blobs cold was
    /// fsync latency, not work (1,000 candies × 100 boxes: 13 s → 2 s here).
    /// Nothing is lost by it: a blob a crash left short or empty fails
    /// verification when read, is quarantined, and its node runs again, in
    /// milliseconds. Outputs of runners, which are expensive to redo, go
    /// through [`Store::put_blob`].
    pub fn put_derived_blob(&self, bytes: &[u8]) -> Result<BlobDigest, CacheError> {
        self.put_bytes(bytes, false)
    }

    fn put_bytes(&self, bytes: &[u8], sync: bool) -> Result<BlobDigest, CacheError> {
        let d = BlobDigest::of(bytes);
        let len = bytes.len() as u64;
        // Common case: already stored, so nothing to compress; and when its
        // index row is right and was accessed moments ago, nothing to write
        // either (a rewritten build directory stores again the dozens of
        // files it shares with the last run: each was a write transaction).
        if self.has_blob(&d)
            && (self.indexed_recently(&d, len)? || self.commit_blob(&d, len, None, sync)?)
        {
            return Ok(d);
        }
        let mut tmp = self.new_temp()?;
        let path = tmp.path().to_path_buf();
        let mut w = FrameWriter::new(false);
        for batch in bytes.chunks(BATCH) {
            w.write(batch, tmp.as_file_mut(), &path)?;
        }
        w.finish(tmp.as_file_mut(), &path)?;
        if sync {
            tmp.as_file().sync_all().at("syncing", &path)?;
        }
        self.commit_blob(&d, len, Some(tmp), sync)?;
        Ok(d)
    }

    /// Stores the content of the file at `path`, streaming; returns its digest
    /// and logical size.
    pub fn put_blob_file(&self, path: &Path) -> Result<(BlobDigest, u64), CacheError> {
        let mut file = File::open(path).at("opening", path)?;
        self.put_stream(&mut file, |e| CacheError::Io {
            action: "reading",
            path: path.to_path_buf(),
            source: e,
        })
    }

    /// Stores everything `r` yields, streaming; returns its digest and
    /// logical size.
    pub fn put_blob_reader(&self, mut r: impl Read) -> Result<(BlobDigest, u64), CacheError> {
        self.put_stream(&mut r, CacheError::Input)
    }

    fn put_stream(
        &self,
        r: &mut dyn Read,
        read_err: impl Fn(io::Error) -> CacheError,
    ) -> Result<(BlobDigest, u64), CacheError> {
        let mut tmp = self.new_temp()?;
        let path = tmp.path().to_path_buf();
        let mut w = FrameWriter::new(true);
        let mut buf = vec![0u8; BATCH];
        loop {
            let n = read_full(r, &mut buf).map_err(&read_err)?;
            if n == 0 {
                break;
            }
            w.write(&buf[..n], tmp.as_file_mut(), &path)?;
        }
        let (d, len) = w.finish(tmp.as_file_mut(), &path)?;
        let d = d.expect("FrameWriter::new(true) computes the digest");
        tmp.as_file().sync_all().at("syncing", &path)?;
        self.commit_blob(&d, len, Some(tmp), true)?;
        Ok((d, len))
    }

    fn new_temp(&self) -> Result<NamedTempFile, CacheError> {
        tempfile::Builder::new()
            .prefix("blob-")
            .tempfile_in(self.session.dir())
            .at("creating temp file in", self.session.dir())
    }

    /// Installs a blob: in one index write transaction, renames `staged` into
    /// place if the blob file is absent, and upserts the blob's row. Returns
    /// false (doing nothing) if the file is absent and nothing is staged.
    /// `sync`: make a new directory entry durable before returning.
    fn commit_blob(
        &self,
        d: &BlobDigest,
        lsize: u64,
        staged: Option<NamedTempFile>,
        sync: bool,
    ) -> Result<bool, CacheError> {
        let path = self.blob_path(d);
        let shard = path.parent().unwrap_or(&self.blobs_dir).to_path_buf();
        if staged.is_some() && !shard.exists() {
            fs::create_dir_all(&shard).at("creating directory", &shard)?;
            if sync {
                fsync_dir(&self.blobs_dir)?;
            }
        }
        let now = self.now();
        let renamed = self.with_conn(|c| {
            let tx = self.begin_write(c)?;
            let mut renamed = false;
            let csize = match fs::metadata(&path) {
                Ok(m) => m.len(),
                Err(e) if e.kind() == io::ErrorKind::NotFound => match staged {
                    None => return Ok(None),
                    Some(tmp) => {
                        tmp.persist(&path)
                            .map_err(|e| e.error)
                            .at("installing blob", &path)?;
                        renamed = true;
                        fs::metadata(&path).at("inspecting blob", &path)?.len()
                    }
                },
                Err(e) => return Err(e).at("inspecting blob", &path),
            };
            tx.prepare_cached(
                "INSERT INTO blobs (digest, csize, lsize, last_access) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (digest) DO UPDATE SET
                     csize = excluded.csize, lsize = excluded.lsize,
                     last_access = MAX(last_access, excluded.last_access)",
            )?
            .execute(params![
                d.to_hex(),
                to_sql_int(csize),
                to_sql_int(lsize),
                to_sql_int(now)
            ])?;
            tx.commit()?;
            Ok(Some(renamed))
        })?;
        match renamed {
            None => Ok(false),
            Some(renamed) => {
                if renamed && sync {
                    // The record that will name this blob is committed later;
                    // make the directory entry durable before that.
                    fsync_dir(&shard)?;
                }
                Ok(true)
            }
        }
    }

    /// Whether the blob's file is present (without verifying it).
    pub fn has_blob(&self, d: &BlobDigest) -> bool {
        let Some(fd) = &self.blobs_fd else {
            return self.blob_path(d).exists();
        };
        // `ab/abcd…`: the layout of `blob_path`.
        let hex = d.to_hex();
        let rel = format!("{}/{hex}", &hex[..2]);
        rustix::fs::statat(fd, rel.as_str(), rustix::fs::AtFlags::empty()).is_ok()
    }

    /// The blobs whose files are in the blob directory of first byte
    /// `first` (`blobs/ab/`), by their names; `None` when it cannot be
    /// read (ask for each file instead).
    pub(crate) fn list_blob_dir(&self, first: u8) -> Option<std::collections::HashSet<BlobDigest>> {
        let dir = self.blobs_dir.join(format!("{first:02x}"));
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Some(std::collections::HashSet::new());
            }
            Err(_) => return None,
        };
        let mut out = std::collections::HashSet::new();
        for e in entries {
            let e = e.ok()?;
            if let Some(d) = e
                .file_name()
                .to_str()
                .and_then(crate::decode_exact_hex)
                .map(BlobDigest::from_bytes)
                && d.as_bytes()[0] == first
            {
                out.insert(d);
            }
        }
        Some(out)
    }

    /// The blob's content, verified. `Ok(None)` if absent, or if it failed
    /// verification (it is then quarantined).
    pub fn get_blob(&self, d: &BlobDigest) -> Result<Option<BlobBuf>, CacheError> {
        let Some((file, id, len)) = self.open_blob(d)? else {
            return Ok(None);
        };
        // A small file is read in one pass: its frame says the size, and
        // asking the index for it cost more than the read (a build
        // directory reads hundreds of small blobs).
        if len <= SMALL_BLOB_FILE {
            return self.get_blob_streaming(d, file, id);
        }
        // With the size known, decode straight into the result (frames in
        // parallel, no copy); otherwise, or if the index was wrong about the
        // size, take the streaming path before calling the blob corrupt.
        if let Some(size) = self.indexed_lsize(d)?.and_then(|n| usize::try_from(n).ok()) {
            let mut out = BlobBuf::zeroed(size);
            if let Ok(ReadOutcome::Verified(_)) = read_blob(file, d, Dest::Exact(&mut out)) {
                self.touch_blob(d)?;
                return Ok(Some(out));
            }
            let Some((file, id, _)) = self.open_blob(d)? else {
                return Ok(None);
            };
            return self.get_blob_streaming(d, file, id);
        }
        self.get_blob_streaming(d, file, id)
    }

    fn get_blob_streaming(
        &self,
        d: &BlobDigest,
        file: File,
        id: FileId,
    ) -> Result<Option<BlobBuf>, CacheError> {
        let mut out = Vec::new();
        let outcome = read_blob(
            file,
            d,
            Dest::Stream(&mut |chunk| {
                out.extend_from_slice(chunk);
                Ok(())
            }),
        );
        match outcome {
            Ok(ReadOutcome::Verified(_)) => {
                self.touch_blob(d)?;
                Ok(Some(out.into()))
            }
            _ => {
                self.quarantine(d, id)?;
                Ok(None)
            }
        }
    }

    /// Writes the blob's verified content to `dest` (atomically: temp file in
    /// the same directory, then rename), with mode 0644. `false` if the blob
    /// is absent or failed verification (then quarantined, `dest` untouched).
    pub fn copy_blob_to(&self, d: &BlobDigest, dest: &Path) -> Result<bool, CacheError> {
        self.copy_to(d, dest, 0o644)
    }

    /// Like [`Store::copy_blob_to`] for a record output, applying its `mode`.
    pub fn copy_output_to(&self, out: &Output, dest: &Path) -> Result<bool, CacheError> {
        self.copy_to(&out.digest, dest, out.mode & 0o7777)
    }

    fn copy_to(&self, d: &BlobDigest, dest: &Path, mode: u32) -> Result<bool, CacheError> {
        let Some((file, id, _)) = self.open_blob(d)? else {
            return Ok(false);
        };
        let parent = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let mut tmp = tempfile::Builder::new()
            .prefix(".charly-tmp-")
            .tempfile_in(parent)
            .at("creating temp file in", parent)?;
        let tmp_path = tmp.path().to_path_buf();
        let outcome = read_blob(file, d, Dest::Stream(&mut |chunk| tmp.write_all(chunk)))
            .at("writing", &tmp_path)?;
        match outcome {
            ReadOutcome::Verified(_) => {
                set_mode(tmp.as_file(), mode).at("setting mode of", &tmp_path)?;
                tmp.persist(dest)
                    .map_err(|e| e.error)
                    .at("renaming into place", dest)?;
                self.touch_blob(d)?;
                Ok(true)
            }
            ReadOutcome::Corrupt => {
                drop(tmp);
                self.quarantine(d, id)?;
                Ok(false)
            }
        }
    }

    /// Opens a blob file; `None` if it does not exist.
    /// The blob's file, its identity and its (compressed) length.
    fn open_blob(&self, d: &BlobDigest) -> Result<Option<(File, FileId, u64)>, CacheError> {
        let path = self.blob_path(d);
        match File::open(&path) {
            Ok(f) => {
                let meta = f.metadata().at("inspecting blob", &path)?;
                Ok(Some((f, FileId::of(&meta), meta.len())))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).at("opening blob", path),
        }
    }

    fn indexed_lsize(&self, d: &BlobDigest) -> Result<Option<u64>, CacheError> {
        self.with_conn(|c| {
            let v: Option<i64> = c
                .prepare_cached("SELECT lsize FROM blobs WHERE digest = ?1")?
                .query_row([d.to_hex()], |r| r.get(0))
                .optional()?;
            Ok(v.map(from_sql_int))
        })
    }

    /// Whether the blob's index row says `lsize` and an access within
    /// [`ACCESS_RESOLUTION_SECS`]: storing it again would change nothing
    /// (the access time is kept to that resolution, and GC spares even an
    /// unreferenced blob for far longer after it).
    fn indexed_recently(&self, d: &BlobDigest, lsize: u64) -> Result<bool, CacheError> {
        let now = self.now();
        self.with_conn(|c| {
            let row: Option<(i64, i64)> = c
                .prepare_cached("SELECT lsize, last_access FROM blobs WHERE digest = ?1")?
                .query_row([d.to_hex()], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?;
            Ok(row.is_some_and(|(l, at)| {
                from_sql_int(l) == lsize
                    && now < from_sql_int(at).saturating_add(ACCESS_RESOLUTION_SECS)
            }))
        })
    }

    fn touch_blob(&self, d: &BlobDigest) -> Result<(), CacheError> {
        let now = self.now();
        self.queue_touch(|t| {
            t.blobs.insert(*d, now);
        })
    }

    /// Moves a blob that failed verification (the file identified by `id`)
    /// to `quarantine/` and drops its index row. Records naming it become
    /// misses. Does nothing if the path meanwhile names another file.
    pub(crate) fn quarantine(&self, d: &BlobDigest, id: FileId) -> Result<(), CacheError> {
        self.bump_epoch()?;
        let path = self.blob_path(d);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|t| t.as_nanos())
            .unwrap_or(0);
        let n = QUARANTINE_COUNTER.fetch_add(1, Ordering::Relaxed);
        let target = self
            .quarantine_dir
            .join(format!("{d}.{nanos}.{}.{n}", std::process::id()));
        // Under the index write lock, like every install of a blob file, so
        // the check and the rename see the same file.
        let moved = self.with_conn(|c| {
            let tx = self.begin_write(c)?;
            let same = match fs::metadata(&path) {
                Ok(m) => FileId::of(&m) == id,
                Err(e) if e.kind() == io::ErrorKind::NotFound => false,
                Err(e) => return Err(e).at("inspecting blob", &path),
            };
            if same {
                fs::rename(&path, &target).at("quarantining", &path)?;
                tx.prepare_cached("DELETE FROM blobs WHERE digest = ?1")?
                    .execute([d.to_hex()])?;
            }
            tx.commit()?;
            Ok(same)
        })?;
        if moved {
            self.add_note(format!(
                "cache: blob {} failed verification; moved it to {} (what needs it is rebuilt)",
                &d.to_hex()[..12],
                target.display()
            ));
        }
        Ok(())
    }
}

#[cfg(unix)]
fn set_mode(f: &File, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    f.set_permissions(fs::Permissions::from_mode(mode))
}

#[cfg(not(unix))]
fn set_mode(_f: &File, _mode: u32) -> io::Result<()> {
    Ok(())
}

/// The content of a blob read from the store ([`Store::get_blob`]): derefs
/// to `[u8]`. Large blobs (4 MiB and up) are decoded into an anonymous
/// mapping advised for transparent huge pages, because faulting in a fresh
/// buffer 4 KiB at a time costs a third of a 64 MiB read; small ones are a
/// plain `Vec`.
pub struct BlobBuf(BufInner);

enum BufInner {
    Vec(Vec<u8>),
    Map(memmap2::MmapMut),
}

/// From this size on, [`BlobBuf`] uses a huge-page mapping.
const MAP_FROM: usize = 4 << 20;

impl BlobBuf {
    /// A zeroed buffer of `len` bytes to decode into.
    fn zeroed(len: usize) -> BlobBuf {
        if len >= MAP_FROM
            && let Ok(m) = memmap2::MmapMut::map_anon(len)
        {
            // Only advice: without huge pages the map still works.
            let _ = m.advise(memmap2::Advice::HugePage);
            return BlobBuf(BufInner::Map(m));
        }
        BlobBuf(BufInner::Vec(vec![0u8; len]))
    }

    /// The content as a `Vec` (copies a mapped buffer).
    pub fn into_vec(self) -> Vec<u8> {
        match self.0 {
            BufInner::Vec(v) => v,
            BufInner::Map(m) => m.to_vec(),
        }
    }
}

impl From<Vec<u8>> for BlobBuf {
    fn from(v: Vec<u8>) -> Self {
        BlobBuf(BufInner::Vec(v))
    }
}

impl From<BlobBuf> for Vec<u8> {
    fn from(b: BlobBuf) -> Self {
        b.into_vec()
    }
}

impl From<BlobBuf> for bytes::Bytes {
    fn from(b: BlobBuf) -> Self {
        match b.0 {
            BufInner::Vec(v) => v.into(),
            // No copy: the mapping moves into the `Bytes`.
            m @ BufInner::Map(_) => bytes::Bytes::from_owner(BlobBuf(m)),
        }
    }
}

impl std::ops::Deref for BlobBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            BufInner::Vec(v) => v,
            BufInner::Map(m) => m,
        }
    }
}

impl std::ops::DerefMut for BlobBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.0 {
            BufInner::Vec(v) => v,
            BufInner::Map(m) => m,
        }
    }
}

impl AsRef<[u8]> for BlobBuf {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl std::fmt::Debug for BlobBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BlobBuf({} bytes)", self.len())
    }
}

impl PartialEq for BlobBuf {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl PartialEq<[u8]> for BlobBuf {
    fn eq(&self, other: &[u8]) -> bool {
        **self == *other
    }
}

impl PartialEq<Vec<u8>> for BlobBuf {
    fn eq(&self, other: &Vec<u8>) -> bool {
        **self == other[..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quarantine_leaves_a_replaced_file_alone() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let store = Store::open(tmp.path()).expect("open");
        let d = store.put_blob(b"content").expect("put");
        let stale = FileId::of(&fs::metadata(store.blob_path(&d)).expect("meta"));
        // Another process replaces the file after we read it. (Moved aside,
        // not deleted, so the new file cannot reuse the inode number.)
        fs::rename(store.blob_path(&d), tmp.path().join("aside")).expect("mv");
        store.put_blob(b"content").expect("put again");
        store.quarantine(&d, stale).expect("quarantine");
        assert!(store.has_blob(&d), "good replacement was quarantined");
        assert_eq!(store.stats().expect("stats").quarantined, 0);

        let current = FileId::of(&fs::metadata(store.blob_path(&d)).expect("meta"));
        store.quarantine(&d, current).expect("quarantine");
        assert!(!store.has_blob(&d));
        assert_eq!(store.stats().expect("stats").quarantined, 1);
    }

    /// Storing a blob again writes its index row only when that row is
    /// wrong or its access time is older than the resolution.
    #[test]
    fn storing_a_blob_again_writes_only_what_would_change() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut store = Store::open(tmp.path()).expect("open");
        store.clock = crate::store::Clock::Manual(std::sync::atomic::AtomicU64::new(1_000_000));
        let at = |store: &Store, d: &BlobDigest| -> (i64, i64) {
            store
                .with_conn(|c| {
                    Ok(c.query_row(
                        "SELECT lsize, last_access FROM blobs WHERE digest = ?1",
                        [d.to_hex()],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )?)
                })
                .expect("row")
        };
        let advance = |store: &Store, secs: u64| match &store.clock {
            crate::store::Clock::Manual(t) => {
                t.fetch_add(secs, Ordering::SeqCst);
            }
            crate::store::Clock::System => unreachable!(),
        };
        let d = store.put_derived_blob(b"shared file").expect("put");
        assert_eq!(at(&store, &d), (11, 1_000_000));
        advance(&store, ACCESS_RESOLUTION_SECS - 1);
        store.put_derived_blob(b"shared file").expect("again");
        assert_eq!(
            at(&store, &d),
            (11, 1_000_000),
            "a recent access is not rewritten"
        );
        advance(&store, 1);
        store.put_derived_blob(b"shared file").expect("later");
        let later = 1_000_000 + i64::try_from(ACCESS_RESOLUTION_SECS).expect("small");
        assert_eq!(
            at(&store, &d),
            (11, later),
            "an old access is brought up to date"
        );
        // A wrong row is corrected, however recent.
        store
            .with_conn(|c| {
                c.execute("UPDATE blobs SET lsize = 3 WHERE digest = ?1", [d.to_hex()])?;
                Ok(())
            })
            .expect("damage");
        store.put_derived_blob(b"shared file").expect("repair");
        assert_eq!(at(&store, &d).0, 11);
    }
}
