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

/// Directories with at least this many entries have their subdirectories
/// listed side by side (a project's `candy/` holds thousands).
const SIDE_BY_SIDE: usize = 64;

/// An entry of a directory being walked: its path, its kind, whether it is
/// kept and, for a kept directory, its own listing (read ahead).
type Kid = (PathBuf, Kind, bool, Option<std::io::Result<Arc<[Entry]>>>);

/// A directory being walked: its depth, and its entries not yet walked.
struct Frame {
    depth: usize,
    kids: std::vec::IntoIter<Kid>,
}

fn frame(
    dir: &Path,
    depth: usize,
    entries: &[Entry],
    cache: Option<&dyn DirCache>,
    keep: &(dyn Fn(&Path, Kind) -> bool + Sync),
) -> Frame {
    use rayon::prelude::*;
    let one = |e: &Entry| {
        let path = dir.join(&e.name);
        let kept = keep(&path, e.kind);
        let listing = (kept && e.kind == Kind::Dir).then(|| list(cache, &path));
        (path, e.kind, kept, listing)
    };
    let kids: Vec<Kid> = if entries.len() >= SIDE_BY_SIDE {
        entries.par_iter().map(one).collect()
    } else {
        entries.iter().map(one).collect()
    };
    Frame {
        depth,
        kids: kids.into_iter(),
    }
}

/// Everything under `root`, root first (depth 0), depth first, each
/// directory's entries in name order, links not followed (a root that is a
/// link to a directory is walked). An entry `keep` refuses is left out with
/// everything under it. A directory that cannot be read yields itself and
/// nothing under it; a root that cannot be read yields nothing.
pub fn walk(
    root: &Path,
    cache: Option<&dyn DirCache>,
    keep: &(dyn Fn(&Path, Kind) -> bool + Sync),
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
    let mut stack: Vec<Frame> = Vec::new();
    if let Ok(l) = list(cache, root) {
        stack.push(frame(root, 0, &l, cache, keep));
    }
    while let Some(top) = stack.last_mut() {
        let Some((path, kind, kept, listing)) = top.kids.next() else {
            stack.pop();
            continue;
        };
        let depth = top.depth + 1;
        if !kept {
            continue;
        }
        let below = match listing {
            Some(Ok(l)) => Some(frame(&path, depth, &l, cache, keep)),
            _ => None,
        };
        out.push(WalkEntry { path, depth, kind });
        if let Some(f) = below {
            stack.push(f);
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
        // Enough entries to be listed side by side, with some below them.
        for i in 0..SIDE_BY_SIDE + 6 {
            let p = d.path().join(format!("many/d{i:03}/f"));
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            if i % 3 == 0 {
                std::fs::write(p, "f").expect("write");
            }
        }
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
        let keep = |p: &Path, _: Kind| p.file_name().is_none_or(|n| n != ".git");
        let got = walk(d.path(), None, &keep);
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
        let got = walk(d.path(), Some(&cache), &|_, _| true);
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
        let got = walk(d.path(), None, &|p, k| {
            !(k == Kind::Dir && p.ends_with("a"))
        });
        assert!(!got.iter().any(|e| e.path.starts_with(d.path().join("a"))));
        assert!(walk(&d.path().join("missing"), None, &|_, _| true).is_empty());
        // A file as root is itself.
        let f = walk(&d.path().join("c"), None, &|_, _| true);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].kind, Kind::File);
    }
}
