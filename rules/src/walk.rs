//! The loader's directory walk, with its listings behind [`DirCache`]: a
//! cache may answer a directory that is as it was when it was last listed
//! (the engine keeps one in the store, `charly_engine::dirs`), so a load of an
//! unchanged project stats its directories instead of reading them.
//!
//! What a walk yields is the same with or without a cache: a cache answers
//! only with a listing of the directory as it is.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What a directory entry is, as its directory says (links not followed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A directory.
    Dir,
    /// A regular file.
    File,
    /// A symbolic link (to anything).
    Symlink,
    /// Anything else (a socket, a fifo, a device).
    Other,
}

impl Kind {
    /// The kind of a file type.
    pub fn of(t: std::fs::FileType) -> Kind {
        if t.is_symlink() {
            Kind::Symlink
        } else if t.is_dir() {
            Kind::Dir
        } else if t.is_file() {
            Kind::File
        } else {
            Kind::Other
        }
    }
}

/// One entry of a directory.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Entry {
    /// Its name.
    pub name: OsString,
    /// What it is.
    pub kind: Kind,
}

/// Lists directories; may answer from memory (see the module docs).
pub trait DirCache: Send + Sync {
    /// The entries of the directory `dir`, sorted by name: what
    /// [`read_sorted`] reads there now.
    fn list(&self, dir: &Path) -> std::io::Result<Arc<[Entry]>>;
}

/// The entries of the directory `dir`, sorted by name. An entry that
/// vanishes while it is read is left out.
pub fn read_sorted(dir: &Path) -> std::io::Result<Vec<Entry>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)?.flatten() {
        if let Ok(t) = e.file_type() {
            out.push(Entry {
                name: e.file_name(),
                kind: Kind::of(t),
            });
        }
    }
    out.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

fn list(cache: Option<&dyn DirCache>, dir: &Path) -> std::io::Result<Arc<[Entry]>> {
    match cache {
        Some(c) => c.list(dir),
        None => read_sorted(dir).map(Arc::from),
    }
}

/// One entry of a [`walk`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WalkEntry {
    /// Its path (`root` joined with the names down to it).
    pub path: PathBuf,
    /// 0 for the root, 1 for its entries, and so on.
    pub depth: usize,
    /// What it is; the root's kind follows a link.
    pub kind: Kind,
}

/// Everything under `root`, root first (depth 0), depth first, each
/// directory's entries in name order, links not followed (a root that is a
/// link to a directory is walked). An entry `keep` refuses is left out with
/// everything under it. A directory that cannot be read yields itself and
/// nothing under it; a root that cannot be read yields nothing.
pub fn walk(
    root: &Path,
    cache: Option<&dyn DirCache>,
    keep: &mut dyn FnMut(&Path, Kind) -> bool,
) -> Vec<WalkEntry> {
    let mut out = Vec::new();
    let Ok(meta) = std::fs::metadata(root) else {
        return out;
    };
    let kind = Kind::of(meta.file_type());
    if !keep(root, kind) {
        return out;
    }
    out.push(WalkEntry {
        path: root.to_path_buf(),
        depth: 0,
        kind,
    });
    if kind != Kind::Dir {
        return out;
    }
    // An explicit stack (not recursion): a hostile project may nest
    // directories deeper than a thread's stack.
    let mut stack: Vec<(PathBuf, usize, Arc<[Entry]>, usize)> = Vec::new();
    if let Ok(l) = list(cache, root) {
        stack.push((root.to_path_buf(), 0, l, 0));
    }
    while let Some((dir, depth, entries, next)) = stack.last_mut() {
        let Some(e) = entries.get(*next) else {
            stack.pop();
            continue;
        };
        *next += 1;
        let (path, depth, kind) = (dir.join(&e.name), *depth + 1, e.kind);
        if !keep(&path, kind) {
            continue;
        }
        let listing = (kind == Kind::Dir).then(|| list(cache, &path));
        out.push(WalkEntry {
            path: path.clone(),
            depth,
            kind,
        });
        if let Some(Ok(l)) = listing {
            stack.push((path, depth, l, 0));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn tree() -> tempfile::TempDir {
        let d = tempfile::tempdir().expect("tmp");
        for f in ["b/x", "a/z/1", "a/y", "c", "a/.git/HEAD"] {
            let p = d.path().join(f);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(p, f).expect("write");
        }
        std::os::unix::fs::symlink("b", d.path().join("l")).expect("link");
        d
    }

    fn names(root: &Path, w: &[WalkEntry]) -> Vec<String> {
        w.iter()
            .map(|e| {
                let r = e.path.strip_prefix(root).expect("under root");
                format!("{}{}:{:?}", "  ".repeat(e.depth), r.display(), e.kind)
            })
            .collect()
    }

    #[test]
    fn a_walk_is_walkdirs_sorted_walk() {
        let d = tree();
        let mut keep = |p: &Path, _: Kind| p.file_name().is_none_or(|n| n != ".git");
        let got = walk(d.path(), None, &mut keep);
        let want: Vec<WalkEntry> = walkdir::WalkDir::new(d.path())
            .sort_by_file_name()
            .into_iter()
            .filter_entry(|e| e.file_name() != ".git")
            .flatten()
            .map(|e| WalkEntry {
                path: e.path().to_path_buf(),
                depth: e.depth(),
                kind: Kind::of(e.file_type()),
            })
            .collect();
        assert_eq!(names(d.path(), &got), names(d.path(), &want));
        assert!(got.iter().any(|e| e.kind == Kind::Symlink), "{got:?}");
        // The link is not followed: nothing under `l`.
        let l = d.path().join("l");
        assert!(!got.iter().any(|e| e.path.starts_with(&l) && e.path != l));
    }

    /// A cache that answers from a fixed table and counts what it is asked.
    struct Fixed(Mutex<Vec<PathBuf>>, Arc<[Entry]>);
    impl DirCache for Fixed {
        fn list(&self, dir: &Path) -> std::io::Result<Arc<[Entry]>> {
            let mut asked = self.0.lock().expect("lock");
            asked.push(dir.to_path_buf());
            // Answers the root only; below, nothing.
            Ok(if asked.len() == 1 {
                self.1.clone()
            } else {
                Arc::from(Vec::new())
            })
        }
    }

    #[test]
    fn a_walk_takes_its_listings_from_the_cache() {
        let d = tree();
        let only = Arc::from(vec![Entry {
            name: "a".into(),
            kind: Kind::Dir,
        }]);
        let cache = Fixed(Mutex::new(Vec::new()), only);
        let got = walk(d.path(), Some(&cache), &mut |_, _| true);
        assert_eq!(
            names(d.path(), &got),
            [":Dir", "  a:Dir"],
            "the cache's word, not the disk's"
        );
        assert_eq!(
            *cache.0.lock().expect("lock"),
            [d.path().to_path_buf(), d.path().join("a")]
        );
    }

    #[test]
    fn refused_entries_and_unreadable_roots_yield_nothing_under_them() {
        let d = tree();
        let got = walk(d.path(), None, &mut |p, k| {
            !(k == Kind::Dir && p.ends_with("a"))
        });
        assert!(!got.iter().any(|e| e.path.starts_with(d.path().join("a"))));
        assert!(walk(&d.path().join("missing"), None, &mut |_, _| true).is_empty());
        // A file as root is itself.
        let f = walk(&d.path().join("c"), None, &mut |_, _| true);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].kind, Kind::File);
    }
}
