//! The loader's directory listings, kept in the store
//! ([`charly_rules::walk::DirCache`]): a load of a project whose directories
//! did not change stats each directory instead of reading it.
//!
//! A directory's mtime changes whenever an entry is added, removed or
//! renamed in it (the journal relies on the same rule), and its ctime with
//! it. A listing is answered when the directory's device, inode, mtime and
//! ctime are those it had when it was listed; it is stat'ed before it is
//! read, so a change during the read leaves a stamp that no longer matches.
//! Timestamps are coarse, so a directory changed within
//! [`crate::hash::RACY_NS`] of the load is listed but not remembered (as
//! the stat cache does with files).
//!
//! One file per project root next to the parse cache
//! (`<store>/trees/<id>.dirs`): read whole when the project loads, written
//! again (a temp file, then a rename) when a listing was added or one was
//! not used, so it holds the directories the last load walked. A file of
//! another format, truncated or damaged, is ignored.

use crate::trees::Usage;
use charly_rules::walk::{DirCache, Entry, Kind, read_sorted};
use std::collections::HashMap;
use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const MAGIC: &[u8; 8] = b"chdirs\x00\x01";

/// What a directory was when it was listed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    mtime_ns: i64,
    ctime_ns: i64,
}

impl Stamp {
    fn of(m: &std::fs::Metadata) -> Stamp {
        use crate::hash::ns;
        Stamp {
            dev: m.dev(),
            ino: m.ino(),
            mtime_ns: ns(m.mtime(), m.mtime_nsec()),
            ctime_ns: ns(m.ctime(), m.ctime_nsec()),
        }
    }

    fn to_bytes(self) -> [u8; 32] {
        let mut b = [0u8; 32];
        b[..8].copy_from_slice(&self.dev.to_le_bytes());
        b[8..16].copy_from_slice(&self.ino.to_le_bytes());
        b[16..24].copy_from_slice(&self.mtime_ns.to_le_bytes());
        b[24..].copy_from_slice(&self.ctime_ns.to_le_bytes());
        b
    }

    fn from_bytes(b: &[u8]) -> Option<Stamp> {
        let word = |i: usize| -> Option<[u8; 8]> { b.get(i..i + 8)?.try_into().ok() };
        Some(Stamp {
            dev: u64::from_le_bytes(word(0)?),
            ino: u64::from_le_bytes(word(8)?),
            mtime_ns: i64::from_le_bytes(word(16)?),
            ctime_ns: i64::from_le_bytes(word(24)?),
        })
    }
}

fn kind_code(k: Kind) -> u8 {
    match k {
        Kind::Dir => 0,
        Kind::File => 1,
        Kind::Symlink => 2,
        Kind::Other => 3,
    }
}

fn kind_of(c: u8) -> Option<Kind> {
    Some(match c {
        0 => Kind::Dir,
        1 => Kind::File,
        2 => Kind::Symlink,
        3 => Kind::Other,
        _ => return None,
    })
}

/// A listing as the file keeps it: per entry its kind's code, its name and
/// a NUL (no file name holds one).
fn encode(l: &[Entry], out: &mut Vec<u8>) {
    for e in l {
        out.push(kind_code(e.kind));
        out.extend_from_slice(e.name.as_bytes());
        out.push(0);
    }
}

fn decode(mut b: &[u8]) -> Option<Vec<Entry>> {
    let mut out = Vec::new();
    while let Some((&code, rest)) = b.split_first() {
        let end = rest.iter().position(|&c| c == 0)?;
        out.push(Entry {
            kind: kind_of(code)?,
            name: OsString::from_vec(rest[..end].to_vec()),
        });
        b = &rest[end + 1..];
    }
    Some(out)
}

/// A directory read by this load: where, its stamp, its listing.
type Listed = (PathBuf, Stamp, Arc<[Entry]>);

/// The directory listings of one project (see the module docs).
pub struct DirFile {
    file: PathBuf,
    data: Vec<u8>,
    /// Directory → (stamp, its encoded listing's range in `data`, slot in `used`).
    known: HashMap<PathBuf, (Stamp, usize, usize, usize)>,
    /// Listings used, and read by this load to remember.
    usage: Usage<Listed>,
    /// A directory changed after this (unix ns) is not remembered.
    racy_after: i64,
}

impl std::fmt::Debug for DirFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirFile")
            .field("file", &self.file)
            .field("directories", &self.known.len())
            .finish()
    }
}

impl DirFile {
    /// The listings file of the project at `root` in the store at `store_dir`.
    pub fn path(store_dir: &Path, root: &Path) -> PathBuf {
        crate::trees::TreeFile::path(store_dir, root).with_extension("dirs")
    }

    /// Reads the listings of the project at `root` (none when there is no
    /// file or it cannot be used); directories changed within `racy_ns` of
    /// now ([`crate::hash::RACY_NS`]; tests shrink it) are not remembered.
    pub fn open(store_dir: &Path, root: &Path, racy_ns: i64) -> DirFile {
        let _t = crate::timings::phase("dir listings: read");
        Self::read(Self::path(store_dir, root), racy_ns)
    }

    /// Reads the listings in `file`; directories changed within `racy_ns`
    /// of now are not remembered.
    pub fn read(file: PathBuf, racy_ns: i64) -> DirFile {
        let racy_after = crate::hash::now_ns().saturating_sub(racy_ns);
        let data = std::fs::read(&file).unwrap_or_default();
        let (data, known) = match parse(&data) {
            Some(known) => (data, known),
            None => (Vec::new(), HashMap::new()),
        };
        DirFile {
            file,
            data,
            usage: Usage::new(known.len()),
            known,
            racy_after,
        }
    }

    /// Writes the listings back when this load read a directory to
    /// remember or left one unused (changed, or not walked): the ones it
    /// used and the ones it read. Only into an existing `store_dir`.
    pub fn save(&self, store_dir: &Path) -> std::io::Result<()> {
        let added = self.usage.take_added();
        let unused = self.usage.any_unused();
        if (added.is_empty() && !unused) || !store_dir.is_dir() {
            return Ok(());
        }
        let _t = crate::timings::phase("dir listings: save");
        let mut fresh = Vec::new();
        let fresh_at: Vec<(usize, usize)> = added
            .iter()
            .map(|(_, _, l)| {
                let start = fresh.len();
                encode(l, &mut fresh);
                (start, fresh.len())
            })
            .collect();
        // Sorted by path: the same listings make the same file.
        let mut all: Vec<(&Path, Stamp, &[u8])> = self
            .known
            .iter()
            .filter(|(_, (_, _, _, slot))| self.usage.is_used(*slot))
            .map(|(p, &(s, start, end, _))| (p.as_path(), s, &self.data[start..end]))
            .chain(
                added
                    .iter()
                    .zip(&fresh_at)
                    .map(|((p, s, _), &(start, end))| (p.as_path(), *s, &fresh[start..end])),
            )
            .collect();
        all.sort_by(|a, b| a.0.cmp(b.0));
        all.dedup_by(|a, b| a.0 == b.0);
        let mut body = Vec::new();
        for (path, stamp, listing) in all {
            let path = path.as_os_str().as_bytes();
            body.extend_from_slice(&(path.len() as u64).to_le_bytes());
            body.extend_from_slice(path);
            body.extend_from_slice(&stamp.to_bytes());
            body.extend_from_slice(&(listing.len() as u64).to_le_bytes());
            body.extend_from_slice(listing);
        }
        crate::trees::write_sealed(&self.file, store_dir, &[MAGIC], &body)
    }
}

/// The index of a file's bytes, when the whole file is sound: directory →
/// (stamp, range of its encoded listing, slot).
#[allow(clippy::type_complexity)]
fn parse(data: &[u8]) -> Option<HashMap<PathBuf, (Stamp, usize, usize, usize)>> {
    let len_at = |at: usize| -> Option<usize> {
        usize::try_from(u64::from_le_bytes(data.get(at..at + 8)?.try_into().ok()?)).ok()
    };
    let mut out = HashMap::new();
    let mut at = crate::trees::sealed_body_at(data, &[MAGIC])?;
    while at < data.len() {
        let path_end = (at + 8).checked_add(len_at(at)?)?;
        let path = data.get(at + 8..path_end)?;
        let stamp = Stamp::from_bytes(data.get(path_end..path_end + 32)?)?;
        let start = path_end + 32 + 8;
        let end = start.checked_add(len_at(path_end + 32)?)?;
        if end > data.len() {
            return None;
        }
        let slot = out.len();
        out.insert(
            PathBuf::from(OsString::from_vec(path.to_vec())),
            (stamp, start, end, slot),
        );
        at = end;
    }
    Some(out)
}

impl DirCache for DirFile {
    fn list(&self, dir: &Path) -> std::io::Result<Arc<[Entry]>> {
        // Stat'ed before it is read: a change during the read leaves a
        // stamp that does not match the next time.
        let stamp = Stamp::of(&std::fs::metadata(dir)?);
        if let Some(&(s, start, end, slot)) = self.known.get(dir)
            && s == stamp
            && let Some(l) = decode(&self.data[start..end])
        {
            self.usage.mark(slot);
            return Ok(Arc::from(l));
        }
        let l: Arc<[Entry]> = Arc::from(read_sorted(dir)?);
        if stamp.mtime_ns.max(stamp.ctime_ns) <= self.racy_after {
            self.usage.add((dir.to_path_buf(), stamp, l.clone()));
        }
        Ok(l)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(l: &[Entry]) -> Vec<String> {
        l.iter()
            .map(|e| format!("{}:{:?}", e.name.to_string_lossy(), e.kind))
            .collect()
    }

    /// Sets a directory's mtime into the past (its ctime stays now: the
    /// racy window is 0 in these tests, so only the stamp decides).
    fn age(dir: &Path) {
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        std::fs::File::open(dir)
            .expect("open")
            .set_modified(old)
            .expect("mtime");
    }

    #[test]
    fn a_remembered_listing_answers_until_its_directory_changes() {
        let store = tempfile::tempdir().expect("tmp");
        let file = store.path().join("trees").join("x.dirs");
        let proj = tempfile::tempdir().expect("tmp");
        let d = proj.path().join("d");
        std::fs::create_dir_all(d.join("sub")).expect("mkdir");
        std::fs::write(d.join("a"), "a").expect("write");
        age(&d);

        let f = DirFile::read(file.clone(), 0);
        assert!(f.known.is_empty());
        assert_eq!(names(&f.list(&d).expect("list")), ["a:File", "sub:Dir"]);
        assert_eq!(f.usage.added(), 1);
        f.save(store.path()).expect("save");

        // Read back: answered from the file, nothing read.
        let f = DirFile::read(file.clone(), 0);
        assert_eq!(f.known.len(), 1);
        assert_eq!(names(&f.list(&d).expect("list")), ["a:File", "sub:Dir"]);
        assert_eq!(f.usage.added(), 0);
        // Nothing read and everything used: not written again.
        let before = std::fs::metadata(&file).expect("m").modified().expect("t");
        f.save(store.path()).expect("save");
        assert_eq!(
            std::fs::metadata(&file).expect("m").modified().expect("t"),
            before
        );

        // A new entry changes the directory's stamp: read again.
        std::fs::write(d.join("b"), "b").expect("write");
        let f = DirFile::read(file.clone(), 0);
        assert_eq!(
            names(&f.list(&d).expect("list")),
            ["a:File", "b:File", "sub:Dir"]
        );
        assert_eq!(f.usage.added(), 1);
        // So does a removal, and a rename.
        f.save(store.path()).expect("save");
        std::fs::rename(d.join("a"), d.join("c")).expect("rename");
        let f = DirFile::read(file.clone(), 0);
        assert_eq!(
            names(&f.list(&d).expect("list")),
            ["b:File", "c:File", "sub:Dir"]
        );
        f.save(store.path()).expect("save");
        std::fs::remove_dir(d.join("sub")).expect("rmdir");
        let f = DirFile::read(file.clone(), 0);
        assert_eq!(names(&f.list(&d).expect("list")), ["b:File", "c:File"]);
    }

    #[test]
    fn a_stamp_that_matches_is_trusted_and_a_racy_directory_is_not_remembered() {
        let store = tempfile::tempdir().expect("tmp");
        let file = store.path().join("x.dirs");
        let proj = tempfile::tempdir().expect("tmp");
        let d = proj.path();
        std::fs::write(d.join("a"), "a").expect("write");

        // Changed just now: with the real window it is listed, not
        // remembered (and with nothing to remember, no file is written).
        let f = DirFile::read(file.clone(), crate::hash::RACY_NS);
        assert_eq!(names(&f.list(d).expect("list")), ["a:File"]);
        assert_eq!(f.usage.added(), 0, "racy: not remembered");
        f.save(store.path()).expect("save");
        assert!(!file.exists());

        // Remembered (no window), then the file's listing is planted: a
        // matching stamp answers with what was remembered, not the disk.
        let f = DirFile::read(file.clone(), 0);
        f.list(d).expect("list");
        f.save(store.path()).expect("save");
        let mut f = DirFile::read(file.clone(), 0);
        let start = f.data.len();
        encode(
            &[Entry {
                name: "planted".into(),
                kind: Kind::Other,
            }],
            &mut f.data,
        );
        let end = f.data.len();
        let entry = f.known.get_mut(d).expect("remembered");
        (entry.1, entry.2) = (start, end);
        assert_eq!(names(&f.list(d).expect("list")), ["planted:Other"]);
    }

    #[test]
    fn a_damaged_or_foreign_file_is_ignored_and_unused_directories_go() {
        let store = tempfile::tempdir().expect("tmp");
        let file = store.path().join("x.dirs");
        let proj = tempfile::tempdir().expect("tmp");
        let (a, b) = (proj.path().join("a"), proj.path().join("b"));
        for d in [&a, &b] {
            std::fs::create_dir(d).expect("mkdir");
            age(d);
        }
        let f = DirFile::read(file.clone(), 0);
        f.list(&a).expect("a");
        f.list(&b).expect("b");
        f.save(store.path()).expect("save");
        assert_eq!(DirFile::read(file.clone(), 0).known.len(), 2);

        // A load that walks only `a` keeps only `a`.
        let f = DirFile::read(file.clone(), 0);
        f.list(&a).expect("a");
        f.save(store.path()).expect("save");
        assert_eq!(DirFile::read(file.clone(), 0).known.len(), 1);

        // Damaged: one byte of the body flipped; truncated; another magic.
        let good = std::fs::read(&file).expect("read");
        let mut bad = good.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        for data in [bad, good[..good.len() - 1].to_vec(), {
            let mut m = good.clone();
            m[7] ^= 0xff;
            m
        }] {
            std::fs::write(&file, data).expect("write");
            assert!(DirFile::read(file.clone(), 0).known.is_empty());
        }
    }
}
