//! The filesystem walks of loading: the discovery walk and the directory
//! listings it gives, candy directories' small manifests, local package
//! sources, links out of a copied tree.

use super::*;

/// Resolves each `localpkg:` source: an absolute path, else under the candy
/// directory, else under the project directory, else the first match
/// walking up from the project (at most 64 levels).
pub(super) fn find_localpkg_sources(
    def: &Candy,
    candy_dir: &Path,
    root: &Path,
) -> BTreeMap<String, (PathBuf, BTreeSet<String>)> {
    let mut out = BTreeMap::new();
    let Some(map) = &def.localpkg else { return out };
    for (fmt, rel) in map.value.0.iter() {
        let rel = Path::new(&rel.value);
        let mut candidates: Vec<PathBuf> = Vec::new();
        if rel.is_absolute() {
            candidates.push(rel.to_path_buf());
        } else {
            candidates.push(candy_dir.join(rel));
            let mut cur = Some(root);
            let mut depth = 0;
            while let Some(d) = cur {
                candidates.push(d.join(rel));
                depth += 1;
                if depth > 64 {
                    break;
                }
                cur = d.parent();
            }
        }
        if let Some(dir) = candidates.into_iter().find(|d| d.is_dir()) {
            let files = list_files(&dir);
            out.insert(fmt.value.clone(), (dir, files));
        }
    }
    out
}

/// Reads top-level `*.json` / `*.toml` files of at most 64 KiB.
pub(super) fn read_small_manifests(
    dir: &Path,
    files: &BTreeSet<String>,
) -> BTreeMap<String, String> {
    files
        .iter()
        .filter(|f| !f.contains('/') && (f.ends_with(".json") || f.ends_with(".toml")))
        .filter_map(|f| {
            let p = dir.join(f);
            let meta = std::fs::metadata(&p).ok()?;
            if meta.len() > 64 * 1024 {
                return None;
            }
            Some((f.clone(), std::fs::read_to_string(p).ok()?))
        })
        .collect()
}

/// The manifests named `manifest` under `dir` (sorted, skipping `.git` and
/// `.build`), and the [`list_files`] of their directories taken from the
/// same walk instead of walking each directory again. `dirs` may answer the
/// walk's listings ([`crate::walk`]).
pub(super) fn discover_walk(
    dir: &Path,
    manifest: &str,
    dirs: Option<&dyn crate::walk::DirCache>,
) -> (Vec<PathBuf>, HashMap<PathBuf, BTreeSet<String>>) {
    let skipped_build = std::sync::Mutex::new(Vec::new());
    let all = crate::walk::walk(dir, dirs, &|path, _| match path.file_name() {
        Some(n) if n == ".build" => {
            if let Ok(mut s) = skipped_build.lock() {
                s.push(path.to_path_buf());
            }
            false
        }
        Some(n) => n != ".git",
        None => true,
    });
    let skipped_build = skipped_build.into_inner().unwrap_or_default();
    let manifests: Vec<PathBuf> = all
        .iter()
        .filter(|e| e.kind == Kind::File && e.path.file_name().is_some_and(|n| n == manifest))
        .map(|e| e.path.clone())
        .collect();
    let listings = listings_from_walk(&all, &manifests, &skipped_build);
    (manifests, listings)
}

/// [`list_files`] of each manifest's directory, from a walk that already
/// saw everything under them: `all`, every entry of a [`crate::walk::walk`]
/// that left out `.git` and `.build` (those in `skipped_build`). A directory
/// with a `.build` somewhere below it is not answered (`list_files` does not
/// skip `.build`): it is listed on its own.
pub(super) fn listings_from_walk(
    all: &[crate::walk::WalkEntry],
    manifests: &[PathBuf],
    skipped_build: &[PathBuf],
) -> HashMap<PathBuf, BTreeSet<String>> {
    let at: HashMap<&Path, usize> = all
        .iter()
        .enumerate()
        .filter(|(_, e)| e.kind == Kind::Dir)
        .map(|(i, e)| (e.path.as_path(), i))
        .collect();
    // Directories with their own `charly.yml` (a nested candy: not listed).
    let nested: std::collections::HashSet<&Path> = all
        .iter()
        .filter(|e| {
            e.path.file_name().is_some_and(|n| n == "charly.yml")
                && (e.kind == Kind::File || (e.kind == Kind::Symlink && e.path.is_file()))
        })
        .filter_map(|e| e.path.parent())
        .collect();
    let mut out = HashMap::new();
    for m in manifests {
        let Some(d) = m.parent() else { continue };
        let Some(&i) = at.get(d) else { continue };
        if skipped_build.iter().any(|b| b.starts_with(d)) {
            continue;
        }
        let depth = all[i].depth;
        let mut files = BTreeSet::new();
        let mut j = i + 1;
        while j < all.len() && all[j].depth > depth {
            let e = &all[j];
            if e.kind == Kind::Dir {
                if nested.contains(e.path.as_path()) {
                    // Skip the nested candy's whole tree.
                    let nd = e.depth;
                    j += 1;
                    while j < all.len() && all[j].depth > nd {
                        j += 1;
                    }
                    continue;
                }
            } else if let Ok(r) = e.path.strip_prefix(d) {
                files.insert(unix(r));
            }
            j += 1;
        }
        out.insert(d.to_path_buf(), files);
    }
    out
}

/// The files `copy:` tasks of `def` name (a file, or every file under a
/// directory) that are symlinks leading outside every one of `roots` (or
/// nowhere). One `lstat` per copied file; a link is resolved only then.
pub(super) fn copied_links_out(
    def: &crate::model::Candy,
    dir: &Path,
    files: &BTreeSet<String>,
    roots: &[&Path],
) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for t in &def.task {
        let Some(src) = t.copy.as_ref().map(|s| s.value.trim_start_matches("./")) else {
            continue;
        };
        let under = format!("{}/", src.trim_end_matches('/'));
        for f in files
            .iter()
            .filter(|f| f.as_str() == src || f.starts_with(&under))
        {
            let p = dir.join(f);
            if !std::fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_symlink()) {
                continue;
            }
            let inside = std::fs::canonicalize(&p).is_ok_and(|real| {
                roots
                    .iter()
                    .any(|r| std::fs::canonicalize(r).is_ok_and(|r| real.starts_with(r)))
            });
            if !inside {
                out.insert(f.clone());
            }
        }
    }
    out
}

/// Lists the files under a candy directory (relative, sorted), skipping
/// `.git` and nested candies (directories with their own `charly.yml`).
pub(super) fn list_files(dir: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let walker = walkdir::WalkDir::new(dir)
        .sort_by_file_name()
        .into_iter()
        .filter_entry(|e| {
            if e.depth() == 0 {
                return true;
            }
            if e.file_name() == ".git" {
                return false;
            }
            !(e.file_type().is_dir() && e.path().join("charly.yml").is_file())
        });
    for e in walker.flatten() {
        if e.depth() == 0 || e.file_type().is_dir() {
            continue;
        }
        if let Ok(r) = e.path().strip_prefix(dir) {
            out.insert(unix(r));
        }
    }
    out
}

/// A path with `/` separators.
pub fn unix(p: &Path) -> String {
    p.components()
        .map(|c| c.as_os_str().to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The listings the discovery walk gives are what [`list_files`] gives
    /// each directory: nested candies, `.git`, `.build`, symlinks.
    #[test]
    fn listings_from_the_discovery_walk_are_list_files() {
        let tmp = tempfile::tempdir().expect("tmp");
        let d = tmp.path().join("candy");
        let w = |rel: &str| {
            let p = d.join(rel);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(p, "x").expect("write");
        };
        for f in [
            "a/charly.yml",
            "a/files/x.conf",
            "a/files/deep/y",
            "a/.git/config",
            "a/.gitignore",
            "a/nested/charly.yml",
            "a/nested/files/z",
            "a/nested/more/charly.yml",
            "a/dirnamed/charly.yml/inner",
            "b/charly.yml",
            "b/.build/out",
            "b/kept",
            "c/charly.yml",
            "c/sub/.build",
            "c/sub/f",
            "e/charly.yml",
            "e/linked/data",
        ] {
            w(f);
        }
        std::os::unix::fs::symlink(d.join("a/files"), d.join("c/dirlink")).expect("symlink");
        std::fs::create_dir_all(d.join("e/viasym")).expect("mkdir");
        std::os::unix::fs::symlink(d.join("e/charly.yml"), d.join("e/viasym/charly.yml"))
            .expect("symlink");
        std::fs::write(d.join("e/viasym/hidden"), "x").expect("write");
        std::os::unix::fs::symlink(d.join("nowhere"), d.join("e/dangling")).expect("symlink");
        let (manifests, listings) = discover_walk(&d, "charly.yml", None);
        assert!(manifests.len() >= 5, "{manifests:?}");
        let mut answered = 0;
        for m in &manifests {
            let dir = m.parent().expect("dir");
            if let Some(files) = listings.get(dir) {
                answered += 1;
                assert_eq!(files, &list_files(dir), "{}", dir.display());
            }
        }
        // b has a .build below it: listed on its own.
        assert!(!listings.contains_key(&d.join("b")));
        assert!(answered >= 4, "{answered}");
        // The root of the walk as a candy directory too.
        w("charly.yml");
        let (_, listings) = discover_walk(&d, "charly.yml", None);
        assert!(!listings.contains_key(&d), "a .build below the root");
    }
}
