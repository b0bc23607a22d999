//! Projects for tests: the bundled example, the fixtures and the corpus,
//! private copies of them (builds write `.build/` into the project, and
//! tests run in parallel), and snapshots of a tree.

use charly_rules::load::{self, LoadOptions, Project};
use charly_rules::resolve::{self, Resolution};
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

/// A private copy of a project with its own store (`<tmp>/project`,
/// `<tmp>/store`, the store not made), and the charly binary that runs on
/// them: the setup of every test that runs charly against a project.
pub struct Sandbox {
    tmp: tempfile::TempDir,
    bin: PathBuf,
    /// The project's copy.
    pub project: PathBuf,
    /// The store (`CHARLY_CACHE_DIR`).
    pub store: PathBuf,
}

impl Sandbox {
    /// Copies `src`; `bin` is the charly binary (from the test crate:
    /// `assert_cmd::cargo::cargo_bin("charly")`).
    pub fn new(bin: impl Into<PathBuf>, src: &Path) -> Sandbox {
        let tmp = tempfile::tempdir().expect("tmp");
        let project = copy_project(src, &tmp.path().join("project"));
        let store = tmp.path().join("store");
        Sandbox {
            tmp,
            bin: bin.into(),
            project,
            store,
        }
    }

    /// The temp directory holding project and store, for the test's own
    /// files.
    pub fn dir(&self) -> &Path {
        self.tmp.path()
    }

    /// `charly -C <project> ARGS` with this store, no colour, the journal's
    /// racy window off (files written moments ago are trusted by stat; see
    /// cli/tests/journal.rs) and none of the caller's journal or remote
    /// settings.
    pub fn command(&self, args: &[&str]) -> std::process::Command {
        let mut c = std::process::Command::new(&self.bin);
        c.env("NO_COLOR", "1")
            .env("CHARLY_CACHE_DIR", &self.store)
            .env("CHARLY_JOURNAL_RACY_MS", "0")
            .env_remove("CHARLY_NO_JOURNAL")
            .env_remove("CHARLY_REMOTE")
            .arg("-C")
            .arg(&self.project)
            .args(args);
        c
    }

    /// Runs [`Sandbox::command`] and insists it succeeds.
    pub fn ok(&self, args: &[&str]) -> std::process::Output {
        let out = self.command(args).output().expect("charly runs");
        assert!(
            out.status.success(),
            "charly {args:?} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }
}

/// The bundled example project.
pub fn example() -> PathBuf {
    crate::workspace().join("examples/hello")
}

/// The build-graph test fixture.
pub fn graph_fixture() -> PathBuf {
    crate::workspace().join("tests/fixtures/graph")
}

/// The busybox fixture (builds with podman from a local rootfs).
pub fn busybox_fixture() -> PathBuf {
    crate::workspace().join("tests/fixtures/busybox")
}

/// The unmodified corpus (2026.160 era), next to the workspace.
pub fn corpus() -> PathBuf {
    crate::workspace().join("../shared/corpus/overthink")
}

/// The same corpus in the node form of schema 2026.174 (its root
/// `charly.yml`, the vocabulary in `charly/charly.yml`, the candies, and
/// the box repositories `box/debian` and `box/ubuntu`).
pub fn corpus_174() -> PathBuf {
    crate::workspace().join("../shared/corpus/overthink-2026.174")
}

/// The corpus benchmarks read: `CHARLY_BENCH_CORPUS`, else [`corpus`].
pub fn bench_corpus() -> PathBuf {
    std::env::var_os("CHARLY_BENCH_CORPUS").map_or_else(corpus, PathBuf::from)
}

/// A project loaded and resolved (panics on a load error).
pub fn open(dir: &Path) -> (Project, Resolution) {
    let p = load::load(dir, &LoadOptions::default())
        .unwrap_or_else(|e| panic!("{} loads: {e:?}", dir.display()));
    let r = resolve::resolve(&p);
    (p, r)
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

/// Every path under `root` (absolute) with its contents (files) or kind,
/// its mode and its owner: what a deploy test compares before a deploy
/// and after its undo.
pub fn tree_with_modes(root: &Path) -> std::collections::BTreeMap<String, String> {
    use std::os::unix::fs::MetadataExt;
    walkdir::WalkDir::new(root)
        .sort_by_file_name()
        .into_iter()
        .map(|e| {
            let e = e.expect("walk");
            let md = e.path().symlink_metadata().expect("meta");
            let what = if md.is_file() {
                format!("{:?}", std::fs::read(e.path()).expect("read"))
            } else {
                format!("{:?}", md.file_type())
            };
            (
                e.path().display().to_string(),
                format!("{what} {:o} {}", md.mode(), md.uid()),
            )
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
