//! A private copy of a project for a test (builds write `.build/` into the
//! project, and tests run in parallel). Shared by the cli crate's tests
//! (`mod project_copy;`) and benches (`#[path]`).

#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// Copies the project at `from` to `to` (directories and regular files;
/// `.build` and `.git` are left behind). Returns `to`.
pub fn copy_project(from: &Path, to: &Path) -> PathBuf {
    for e in walkdir::WalkDir::new(from) {
        let e = e.unwrap_or_else(|e| panic!("walking {}: {e}", from.display()));
        let rel = e.path().strip_prefix(from).expect("inside the project");
        if rel.starts_with(".build") || rel.starts_with(".git") {
            continue;
        }
        let dest = to.join(rel);
        if e.file_type().is_dir() {
            std::fs::create_dir_all(&dest).expect("mkdir");
        } else if e.file_type().is_file() {
            std::fs::copy(e.path(), &dest).expect("copy");
        }
    }
    to.to_path_buf()
}

/// The bundled example project.
pub fn example() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/hello")
}

/// The build-graph test fixture.
pub fn graph_fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/graph")
}

/// Every path under `dir` (relative) with what it is: a file's contents, a
/// symlink's target, else its kind. Symlinks are never followed; the lock
/// files of `.build/.locks` are left out (they persist by design). Tests
/// compare it before and after a run to prove nothing changed.
pub fn tree(dir: &Path) -> std::collections::BTreeMap<String, String> {
    walkdir::WalkDir::new(dir)
        .follow_links(false)
        .sort_by_file_name()
        .into_iter()
        .map(|e| e.expect("walk"))
        .filter(|e| !e.path().components().any(|c| c.as_os_str() == ".locks"))
        .map(|e| {
            let rel = e
                .path()
                .strip_prefix(dir)
                .expect("inside")
                .display()
                .to_string();
            let t = e.file_type();
            let what = if t.is_file() {
                String::from_utf8_lossy(&std::fs::read(e.path()).expect("read")).into_owned()
            } else if t.is_symlink() {
                format!(
                    "-> {}",
                    std::fs::read_link(e.path()).expect("link").display()
                )
            } else {
                format!("{t:?}")
            };
            (rel, what)
        })
        .collect()
}

/// A live writer of a temp file, as another charly process would be: a
/// child holding `flock -x` on `path` until killed (returned once it holds
/// the lock).
pub fn hold_lock(path: &Path) -> std::process::Child {
    let holder = std::process::Command::new("flock")
        .args(["-x", "-o"])
        .arg(path)
        .args(["sleep", "60"])
        .spawn()
        .expect("flock");
    for _ in 0..100 {
        let f = std::fs::File::open(path).expect("open");
        if matches!(f.try_lock(), Err(std::fs::TryLockError::WouldBlock)) {
            break;
        }
        drop(f);
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    holder
}
