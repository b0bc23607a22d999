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
