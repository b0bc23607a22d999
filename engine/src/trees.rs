//! The loader's parse cache, kept in the store: the YAML trees of every
//! manifest a project loaded, by the digest of the manifest's text
//! ([`charly_rules::yaml::cache`]), so the next run parses only the files
//! whose text changed.
//!
//! One file per project root (`<store>/trees/<id>.bin`), read whole when the
//! project loads and written again (a temp file, then a rename: concurrent
//! runs never see half a file) when the load parsed anything new. It then
//! holds what this load used, so the trees of deleted or edited files go.
//! The file names the charly binary and the tree format it was made under and
//! carries a digest of its body: a file from another binary, or truncated,
//! or damaged, is ignored (the project is parsed, and the file rewritten).
//! Whether the cache answers or not never changes what loads: a tree is the
//! parse of exactly the text with its digest.

use charly_rules::yaml::cache::{TREE_FORMAT, TreeCache, TreeKey};
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

const MAGIC: &[u8; 8] = b"chtrees\x01";

/// The parse cache of one project (see the module docs).
pub struct TreeFile {
    file: PathBuf,
    /// The binary and tree format the cache is valid for.
    context: [u8; 32],
    data: Vec<u8>,
    /// Key → (start, end) of its trees in `data`, and whether this load used them.
    index: HashMap<TreeKey, (usize, usize, usize)>,
    usage: Usage<(TreeKey, Vec<u8>)>,
}

/// What one load of a file kept in the store (parse cache, directory
/// listings) did with it: which of its entries it used (by slot) and which
/// it added. Saving writes back the used and the added ones, so entries no
/// load needs any more go.
#[derive(Debug, Default)]
pub(crate) struct Usage<A> {
    used: Vec<AtomicBool>,
    added: Mutex<Vec<A>>,
}

impl<A> Usage<A> {
    /// The usage of a file of `entries` entries, none used yet.
    pub(crate) fn new(entries: usize) -> Usage<A> {
        Usage {
            used: (0..entries).map(|_| AtomicBool::new(false)).collect(),
            added: Mutex::new(Vec::new()),
        }
    }

    /// How many entries this load added.
    #[cfg(test)]
    pub(crate) fn added(&self) -> usize {
        self.added.lock().map_or(0, |a| a.len())
    }

    /// Marks the entry in `slot` used.
    pub(crate) fn mark(&self, slot: usize) {
        self.used[slot].store(true, Ordering::Relaxed);
    }

    /// Whether the entry in `slot` was used.
    pub(crate) fn is_used(&self, slot: usize) -> bool {
        self.used[slot].load(Ordering::Relaxed)
    }

    /// Whether some entry was not used.
    pub(crate) fn any_unused(&self) -> bool {
        self.used.iter().any(|u| !u.load(Ordering::Relaxed))
    }

    /// Adds an entry.
    pub(crate) fn add(&self, a: A) {
        if let Ok(mut v) = self.added.lock() {
            v.push(a);
        }
    }

    /// Takes what was added (nothing after a panic while adding).
    pub(crate) fn take_added(&self) -> Vec<A> {
        self.added
            .lock()
            .map(|mut a| std::mem::take(&mut *a))
            .unwrap_or_default()
    }
}

impl std::fmt::Debug for TreeFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TreeFile")
            .field("file", &self.file)
            .field("entries", &self.index.len())
            .finish()
    }
}

/// What the trees of a cache file are valid for: this tree format and this
/// charly binary (a rebuilt binary may parse differently without a new
/// format number).
pub(crate) fn context() -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(&TREE_FORMAT.to_le_bytes());
    if let Some(m) = std::env::current_exe()
        .ok()
        .and_then(|p| std::fs::metadata(p).ok())
    {
        for v in [
            m.len(),
            m.mtime() as u64,
            m.mtime_nsec() as u64,
            m.ctime() as u64,
            m.ctime_nsec() as u64,
            m.ino(),
        ] {
            h.update(&v.to_le_bytes());
        }
    }
    *h.finalize().as_bytes()
}

impl TreeFile {
    /// The cache file of the project at `root` in the store at `store_dir`.
    pub fn path(store_dir: &Path, root: &Path) -> PathBuf {
        let id = blake3::hash(root.as_os_str().as_encoded_bytes()).to_hex();
        store_dir.join("trees").join(format!("{}.bin", &id[..32]))
    }

    /// Reads the cache of the project at `root` (empty when there is none
    /// or it cannot be used).
    pub fn open(store_dir: &Path, root: &Path) -> TreeFile {
        let _t = crate::timings::phase("parse cache: read");
        Self::read(Self::path(store_dir, root))
    }

    /// Reads the cache in `file` (empty when there is none or it cannot be used).
    pub fn read(file: PathBuf) -> TreeFile {
        let context = context();
        let mut t = TreeFile {
            file,
            context,
            data: Vec::new(),
            index: HashMap::new(),
            usage: Usage::new(0),
        };
        if let Ok(data) = std::fs::read(&t.file)
            && let Some(index) = parse_index(&data, &context)
        {
            t.usage = Usage::new(index.len());
            t.index = index;
            t.data = data;
        }
        t
    }

    /// Writes the cache back when this load parsed anything new: the trees
    /// it used and the ones it added. Only into an existing `store_dir`
    /// (a run never creates a store just for this).
    pub fn save(&self, store_dir: &Path) -> std::io::Result<()> {
        let added = self.usage.take_added();
        if added.is_empty() || !store_dir.is_dir() {
            return Ok(());
        }
        let _t = crate::timings::phase("parse cache: save");
        // Sorted by key: the same trees make the same file.
        let mut entries: Vec<(&TreeKey, &[u8])> = self
            .index
            .iter()
            .filter(|(_, (_, _, slot))| self.usage.is_used(*slot))
            .map(|(k, &(start, end, _))| (k, &self.data[start..end]))
            .chain(added.iter().map(|(k, b)| (k, b.as_slice())))
            .collect();
        entries.sort_by(|a, b| a.0.cmp(b.0));
        entries.dedup_by(|a, b| a.0 == b.0);
        let mut body = Vec::with_capacity(entries.iter().map(|e| 40 + e.1.len()).sum());
        for (key, bytes) in entries {
            put_entry(&mut body, key, bytes);
        }
        write_sealed(&self.file, store_dir, &[MAGIC, &self.context], &body)
    }
}

/// Writes `file` whole (under `store_dir` when it names no directory): the
/// `head` parts (a magic, a context), the digest of `body`, then `body`.
/// A temp file renamed over it: concurrent runs never see half a file.
pub(crate) fn write_sealed(
    file: &Path,
    store_dir: &Path,
    head: &[&[u8]],
    body: &[u8],
) -> std::io::Result<()> {
    let head_len: usize = head.iter().map(|h| h.len()).sum();
    let mut out = Vec::with_capacity(head_len + 32 + body.len());
    head.iter().for_each(|h| out.extend_from_slice(h));
    out.extend_from_slice(blake3::hash(body).as_bytes());
    out.extend_from_slice(body);
    let dir = file.parent().unwrap_or(store_dir);
    std::fs::create_dir_all(dir)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    std::io::Write::write_all(tmp.as_file_mut(), &out)?;
    tmp.persist(file).map_err(|e| e.error)?;
    Ok(())
}

/// Where the body of `data` starts, when `data` is a sound
/// [`write_sealed`] file of this `head`: it starts with `head`, and its
/// body has the digest that follows.
pub(crate) fn sealed_body_at(data: &[u8], head: &[&[u8]]) -> Option<usize> {
    let mut at = 0;
    for h in head {
        if data.get(at..at + h.len()) != Some(*h) {
            return None;
        }
        at += h.len();
    }
    let (digest, body) = (data.get(at..at + 32)?, data.get(at + 32..)?);
    (blake3::hash(body).as_bytes() == digest).then_some(at + 32)
}

fn put_entry(body: &mut Vec<u8>, key: &TreeKey, bytes: &[u8]) {
    body.extend_from_slice(key);
    body.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    body.extend_from_slice(bytes);
}

/// The entries of a cache file's bytes, when the whole file is sound and
/// made for `context`.
#[allow(clippy::type_complexity)]
fn parse_index(data: &[u8], context: &[u8; 32]) -> Option<HashMap<TreeKey, (usize, usize, usize)>> {
    let mut at = sealed_body_at(data, &[MAGIC, context])?;
    let mut index = HashMap::new();
    while at < data.len() {
        let key: TreeKey = data.get(at..at + 32)?.try_into().ok()?;
        let len = u64::from_le_bytes(data.get(at + 32..at + 40)?.try_into().ok()?);
        let start = at + 40;
        let end = start.checked_add(usize::try_from(len).ok()?)?;
        if end > data.len() {
            return None;
        }
        let slot = index.len();
        index.entry(key).or_insert((start, end, slot));
        at = end;
    }
    Some(index)
}

impl TreeCache for TreeFile {
    fn get(&self, key: &TreeKey) -> Option<&[u8]> {
        let &(start, end, slot) = self.index.get(key)?;
        self.usage.mark(slot);
        Some(&self.data[start..end])
    }

    fn put(&self, key: TreeKey, encoded: Vec<u8>) {
        self.usage.add((key, encoded));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use charly_rules::source::FileId;
    use charly_rules::yaml::cache::parse_cached;

    /// The magic, the context and the body's digest.
    const HEADER: usize = 8 + 32 + 32;

    const A: &str = "name: a\nlist: [1, 2]\n";
    const B: &str = "name: b\nmap: {x: \"y\"}\n";

    fn load(t: &TreeFile, texts: &[&str]) {
        for text in texts {
            parse_cached(Some(t), FileId(0), text).expect("parses");
        }
    }

    #[test]
    fn a_saved_cache_answers_the_next_load_and_keeps_what_it_used() {
        let dir = tempfile::tempdir().expect("tmp");
        let file = dir.path().join("trees").join("x.bin");
        let t = TreeFile::read(file.clone());
        assert!(t.index.is_empty());
        load(&t, &[A, B]);
        assert_eq!(t.usage.added(), 2);
        t.save(dir.path()).expect("save");

        let t = TreeFile::read(file.clone());
        assert_eq!(t.index.len(), 2);
        load(&t, &[A, B]);
        assert_eq!(t.usage.added(), 0, "both answered");
        // Nothing new: not written again.
        let before = std::fs::metadata(&file)
            .expect("meta")
            .modified()
            .expect("mtime");
        t.save(dir.path()).expect("save");
        assert_eq!(
            std::fs::metadata(&file)
                .expect("meta")
                .modified()
                .expect("mtime"),
            before
        );

        // B edited: its old trees go when the new ones are written.
        let t = TreeFile::read(file.clone());
        let b2 = "name: b2\n";
        load(&t, &[A, b2]);
        assert_eq!(t.usage.added(), 1);
        t.save(dir.path()).expect("save");
        let t = TreeFile::read(file);
        assert_eq!(t.index.len(), 2);
        assert!(t.get(&charly_rules::yaml::cache::key_of(B)).is_none());
    }

    #[test]
    fn a_damaged_or_foreign_cache_is_ignored() {
        let dir = tempfile::tempdir().expect("tmp");
        let file = dir.path().join("trees").join("x.bin");
        let t = TreeFile::read(file.clone());
        load(&t, &[A, B]);
        t.save(dir.path()).expect("save");
        let good = std::fs::read(&file).expect("read");
        assert_eq!(TreeFile::read(file.clone()).index.len(), 2);
        for cut in [0, 7, HEADER, HEADER + 10, good.len() - 1] {
            std::fs::write(&file, &good[..cut]).expect("write");
            assert!(
                TreeFile::read(file.clone()).index.is_empty(),
                "cut at {cut}"
            );
        }
        for at in [3, 20, 50, HEADER + 5, good.len() - 2] {
            let mut bad = good.clone();
            bad[at] ^= 0x40;
            std::fs::write(&file, &bad).expect("write");
            assert!(
                TreeFile::read(file.clone()).index.is_empty(),
                "flipped at {at}"
            );
        }
        // Another binary or tree format: a different context.
        let mut other = good.clone();
        other[8] ^= 1;
        std::fs::write(&file, &other).expect("write");
        assert!(TreeFile::read(file.clone()).index.is_empty());
        // Ignored, then rewritten by the next load.
        let t = TreeFile::read(file.clone());
        load(&t, &[A]);
        t.save(dir.path()).expect("save");
        assert_eq!(TreeFile::read(file).index.len(), 1);
    }

    #[test]
    fn no_store_no_file() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = dir.path().join("absent");
        let t = TreeFile::read(store.join("trees").join("x.bin"));
        load(&t, &[A]);
        t.save(&store).expect("save");
        assert!(!store.exists());
    }
}
