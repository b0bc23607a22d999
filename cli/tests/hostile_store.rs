//! A store damaged behind charly's back never fails a build (issue 18,
//! findings 7, 8 and 9): a stored output that fails verification or a record
//! that no longer decodes is a miss — the node runs again in the same run and
//! everything after it is written — with one note on stderr; a damaged
//! `index.db` is moved aside and `cache verify --repair` always ends clean;
//! the leftovers of a process killed with SIGKILL are removed by the next run
//! and never make `cache verify` fail.

use charly_testutil::{Sandbox, graph_fixture};

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

struct Env(Sandbox);

impl std::ops::Deref for Env {
    type Target = Sandbox;
    fn deref(&self) -> &Sandbox {
        &self.0
    }
}

impl Env {
    fn new() -> Env {
        Env(Sandbox::new(
            assert_cmd::cargo::cargo_bin("charly"),
            &graph_fixture(),
        ))
    }

    /// The boxes' Containerfiles hold exactly `left` and `right`.
    fn has_containerfiles(&self, left: &[u8], right: &[u8]) {
        for (b, want) in [("left", left), ("right", right)] {
            let got = std::fs::read(self.containerfile(b)).expect("Containerfile");
            assert_eq!(got, want, "{b}");
        }
    }

    fn containerfile(&self, b: &str) -> PathBuf {
        self.project.join(".build").join(b).join("Containerfile")
    }

    fn blob_path(&self, content: &[u8]) -> PathBuf {
        let hex = blake3::hash(content).to_hex().to_string();
        self.store.join("blobs").join(&hex[..2]).join(&hex)
    }

    /// `cache verify` exits 0 and says the store is clean.
    fn verifies_clean(&self) {
        let out = self.ok(&["cache", "verify"]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.trim_end().ends_with("clean"), "{stdout}");
    }

    fn quarantined(&self) -> usize {
        std::fs::read_dir(self.store.join("quarantine"))
            .map(|d| d.count())
            .unwrap_or(0)
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn notes(out: &Output) -> Vec<String> {
    stderr(out)
        .lines()
        .filter(|l| l.starts_with("note: cache:"))
        .map(str::to_string)
        .collect()
}

fn flip_middle_byte(path: &Path) {
    let mut b = std::fs::read(path).expect("read blob");
    let mid = b.len() / 2;
    b[mid] ^= 0x5a;
    std::fs::write(path, b).expect("write blob");
}

fn state<'a>(summary: &'a serde_json::Value, id: &str) -> &'a str {
    summary["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .find(|n| n["id"] == id)
        .and_then(|n| n["state"].as_str())
        .unwrap_or_else(|| panic!("no node {id} in {summary}"))
}

const GENERATE: [&str; 4] = ["box", "generate", "--all", "-q"];

#[test]
fn a_corrupt_output_blob_is_rebuilt_in_the_same_run() {
    let env = Env::new();
    env.ok(&GENERATE);
    let left = std::fs::read(env.containerfile("left")).expect("left written");
    let right = std::fs::read(env.containerfile("right")).expect("right written");
    let blob = env.blob_path(&left);
    assert!(
        blob.is_file(),
        "the Containerfile is a blob at {}",
        blob.display()
    );
    flip_middle_byte(&blob);

    // With the output on disk intact, the journal replays: the blob is not
    // needed and nothing fails.
    env.ok(&GENERATE);
    assert_eq!(
        std::fs::read(env.containerfile("left")).expect("left"),
        left
    );

    // Without the build directories every output is read from the store:
    // the bad blob is a miss, its node runs again, every box is written.
    std::fs::remove_dir_all(env.project.join(".build")).expect("rm .build");
    let out = env.ok(&GENERATE);
    env.has_containerfiles(&left, &right);
    let found = notes(&out);
    assert_eq!(found.len(), 1, "one note, got:\n{}", stderr(&out));
    assert!(found[0].contains("failed verification"), "{found:?}");
    assert!(!stderr(&out).contains("error"), "{}", stderr(&out));
    // The node ran again: its output is back in the store, verified; the
    // bad copy is in quarantine.
    assert!(blob.is_file(), "the rebuilt output was stored again");
    assert_eq!(env.quarantined(), 1);
    env.verifies_clean();

    // Same without the journal, with the directories removed again: now
    // nothing is damaged and nothing is noted.
    std::fs::remove_dir_all(env.project.join(".build")).expect("rm .build");
    let out = env.ok(&["box", "generate", "--all", "-q", "--no-journal"]);
    assert!(notes(&out).is_empty(), "{}", stderr(&out));
    assert_eq!(
        std::fs::read(env.containerfile("left")).expect("left"),
        left
    );
}

/// Fragments, build directories and their files are written without fsync
/// (derived in process, milliseconds to redo): a power loss may leave any of
/// them empty. The next run must notice every one and write them again.
#[test]
fn empty_blobs_and_build_files_a_power_loss_left_are_rebuilt() {
    let env = Env::new();
    env.ok(&GENERATE);
    let left = std::fs::read(env.containerfile("left")).expect("left");
    let right = std::fs::read(env.containerfile("right")).expect("right");
    let mut emptied = 0;
    // Lock files (`.build/.locks`) are empty anyway.
    let files = |dir: PathBuf| {
        walkdir::WalkDir::new(dir)
            .into_iter()
            .filter_entry(|e| e.file_name() != ".locks")
            .map(|e| e.expect("walk"))
            .filter(|e| e.file_type().is_file())
    };
    for dir in [env.store.join("blobs"), env.project.join(".build")] {
        for e in files(dir) {
            std::fs::OpenOptions::new()
                .write(true)
                .open(e.path())
                .and_then(|f| f.set_len(0))
                .expect("truncate");
            emptied += 1;
        }
    }
    assert!(emptied > 4, "blobs and build files were written: {emptied}");
    let out = env.ok(&GENERATE);
    env.has_containerfiles(&left, &right);
    assert!(!notes(&out).is_empty(), "{}", stderr(&out));
    // Every build file is whole again, and so is the store.
    for e in files(env.project.join(".build")) {
        assert!(
            e.metadata().expect("stat").len() > 0,
            "{} still empty",
            e.path().display()
        );
    }
    env.verifies_clean();
}

#[test]
fn a_corrupt_fragment_blob_read_by_a_later_node_is_rebuilt() {
    let env = Env::new();
    let s1 = env.store.with_file_name("s1.json");
    env.ok(&["box", "generate", "--all", "-q", "--no-journal"]);
    // Damage every stored blob, and remove the Containerfiles' own: their
    // nodes run again and read the fragments, whose blobs are damaged too,
    // so the fragment nodes run again inside them.
    let left = std::fs::read(env.containerfile("left")).expect("left");
    let right = std::fs::read(env.containerfile("right")).expect("right");
    for e in walkdir::WalkDir::new(env.store.join("blobs")) {
        let e = e.expect("walk");
        if e.file_type().is_file() {
            flip_middle_byte(e.path());
        }
    }
    std::fs::remove_file(env.blob_path(&left)).expect("rm left blob");
    std::fs::remove_file(env.blob_path(&right)).expect("rm right blob");
    std::fs::remove_dir_all(env.project.join(".build")).expect("rm .build");
    let out = env.ok(&[
        "box",
        "generate",
        "--all",
        "-q",
        "--no-journal",
        "--summary-json",
        s1.to_str().expect("utf-8"),
    ]);
    env.has_containerfiles(&left, &right);
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&s1).expect("summary")).expect("json");
    assert_eq!(state(&summary, "containerfile:left"), "ran");
    assert!(!notes(&out).is_empty(), "{}", stderr(&out));
    env.verifies_clean();
}

#[test]
fn a_record_with_broken_outputs_json_is_a_miss_and_its_node_runs_again() {
    let env = Env::new();
    env.ok(&["box", "generate", "--all", "-q", "--no-journal"]);
    let left = std::fs::read(env.containerfile("left")).expect("left");
    {
        let conn = rusqlite::Connection::open(env.store.join("index.db")).expect("open the index");
        let n = conn
            .execute(
                "UPDATE records SET outputs = '{\"file:x\": [broken' WHERE node_id = ?1",
                ["containerfile:left"],
            )
            .expect("update");
        assert_eq!(n, 1);
    }
    let s = env.store.with_file_name("s.json");
    for round in 0..2 {
        let out = env.ok(&[
            "box",
            "generate",
            "--all",
            "-q",
            "--no-journal",
            "--summary-json",
            s.to_str().expect("utf-8"),
        ]);
        let summary: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&s).expect("summary")).expect("json");
        if round == 0 {
            assert_eq!(state(&summary, "containerfile:left"), "ran");
            let notes = notes(&out);
            assert_eq!(notes.len(), 1, "{}", stderr(&out));
            assert!(notes[0].contains("did not decode"), "{notes:?}");
        } else {
            // Recorded afresh: cached from now on, nothing noted.
            assert_eq!(state(&summary, "containerfile:left"), "cached");
            assert!(notes(&out).is_empty(), "{}", stderr(&out));
        }
        assert_eq!(
            std::fs::read(env.containerfile("left")).expect("left"),
            left
        );
        assert!(env.containerfile("right").is_file());
    }
    env.verifies_clean();
}

fn garbage(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed) ^ 0x3c)
        .collect()
}

#[test]
fn a_damaged_index_never_blocks_a_build_and_repair_ends_clean() {
    type Damage = fn(&Path);
    let modes: [(&str, Damage); 5] = [
        ("truncated to half", |db| {
            let len = std::fs::metadata(db).expect("meta").len();
            std::fs::OpenOptions::new()
                .write(true)
                .open(db)
                .and_then(|f| f.set_len(len / 2))
                .expect("truncate");
        }),
        ("garbage first 100 bytes", |db| {
            let mut b = std::fs::read(db).expect("read");
            b[..100].copy_from_slice(&garbage(100, 1));
            std::fs::write(db, b).expect("write");
        }),
        ("garbage pages in the middle", |db| {
            let mut b = std::fs::read(db).expect("read");
            let pages = b.len() / 4096;
            assert!(pages >= 4, "index of {pages} pages");
            let from = pages / 2 * 4096;
            let to = (from + 2 * 4096).min(b.len());
            b[from..to].copy_from_slice(&garbage(to - from, 2));
            std::fs::write(db, b).expect("write");
        }),
        ("zero-length file", |db| {
            std::fs::write(db, b"").expect("write");
        }),
        ("garbage -wal", |db| {
            let wal = PathBuf::from(format!("{}-wal", db.display()));
            std::fs::write(wal, garbage(2 * 4096 + 32, 3)).expect("write");
        }),
    ];
    for (name, damage) in modes {
        // `cache verify --repair` on the damaged index, then a clean verify.
        let env = Env::new();
        env.ok(&["box", "build", "--all", "--runner", "fake", "-q"]);
        damage(&env.store.join("index.db"));
        let repair = env
            .command(&["cache", "verify", "--repair"])
            .output()
            .expect("runs");
        assert!(
            repair.status.success(),
            "{name}: verify --repair failed:\n{}{}",
            String::from_utf8_lossy(&repair.stdout),
            stderr(&repair)
        );
        env.verifies_clean();
        // And a build right after the damage (no repair) succeeds.
        let env = Env::new();
        env.ok(&["box", "build", "--all", "--runner", "fake", "-q"]);
        damage(&env.store.join("index.db"));
        let out = env.ok(&["box", "build", "--all", "--runner", "fake", "-q"]);
        if name != "zero-length file" && name != "garbage -wal" {
            assert!(
                stderr(&out).contains("moved it aside"),
                "{name}: no note:\n{}",
                stderr(&out)
            );
        }
        env.ok(&["box", "generate", "--all", "-q", "--no-journal"]);
        assert!(env.containerfile("left").is_file(), "{name}");
        env.ok(&["cache", "verify", "--repair"]);
        env.verifies_clean();
    }
}

#[test]
fn a_sigkilled_process_leaves_nothing_that_fails_verify() {
    let env = Env::new();
    env.ok(&["box", "generate", "--all", "-q", "--no-journal"]);
    // A build whose fake runner takes long: killed while its session is live.
    let mut child = env
        .command(&["box", "build", "--all", "--runner", "fake", "-q", "-j", "1"])
        .env("CHARLY_FAKE_DELAY_MS", "3000")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    let tmp = env.store.join("tmp");
    let deadline = Instant::now() + Duration::from_secs(60);
    let lock_of_child = loop {
        let locks: Vec<PathBuf> = std::fs::read_dir(&tmp)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        if let Some(l) = locks
            .into_iter()
            .find(|p| p.extension().is_some_and(|e| e == "lock"))
        {
            break l;
        }
        assert!(
            Instant::now() < deadline,
            "the child never opened the store"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    // Let it get into a node's work (a builder stage's scratch directory
    // lives in the session's directory), then SIGKILL.
    let session = lock_of_child.with_extension("");
    while !std::fs::read_dir(&session)
        .map(|d| d.flatten().any(|e| e.path().is_dir()))
        .unwrap_or(false)
    {
        assert!(
            Instant::now() < deadline,
            "no scratch directory ever appeared in {}",
            session.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    assert!(
        lock_of_child.exists(),
        "the dead session's lock is left behind"
    );

    // verify (no repair) is clean and the dead session's files are gone.
    env.verifies_clean();
    assert!(!lock_of_child.exists());
    let left: Vec<PathBuf> = std::fs::read_dir(&tmp)
        .expect("tmp")
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert!(
        !env.store.join("work").exists(),
        "scratch directories outside the session"
    );
    // And the next build works.
    env.ok(&["box", "build", "--all", "--runner", "fake", "-q"]);
}

/// An image layout written for `podman load` when the store's path is not a
/// valid image name (as here: the sandbox's temp directory starts with a
/// dot) lives in a scratch directory of this user's under the system temp
/// directory. What a killed process left there is removed by the next one
/// that loads an image; a finished process leaves nothing.
#[test]
fn image_layouts_a_killed_process_left_in_the_temp_directory_are_removed() {
    let env = Sandbox::new(
        assert_cmd::cargo::cargo_bin("charly"),
        &charly_testutil::example(),
    );
    // A temp directory whose path is a valid image name, private to this test.
    let tmpdir = PathBuf::from(format!("/tmp/charly-test-layouts-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmpdir);
    std::fs::create_dir(&tmpdir).expect("temp dir");
    let uid = std::fs::metadata(&tmpdir)
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
        .expect("uid");
    let root = tmpdir.join(format!("charly-scratch-{uid}"));
    let build = |delay_ms: &str| {
        let mut c = env.command(&[
            "box",
            "build",
            "--all",
            "--runner",
            "fake",
            "-q",
            "-j",
            "1",
            "--no-journal",
        ]);
        c.env("TMPDIR", &tmpdir)
            .env("CHARLY_FAKE_DELAY_MS", delay_ms);
        c
    };
    // Every runner call is slow: killed while a layout waits to be loaded.
    let mut child = build("1500")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(120);
    let layout = loop {
        let found = std::fs::read_dir(&root)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().is_dir())
            .flat_map(|session| {
                std::fs::read_dir(session.path())
                    .into_iter()
                    .flatten()
                    .flatten()
            })
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("load-"))
            });
        if let Some(p) = found {
            break p;
        }
        if Instant::now() > deadline || child.try_wait().expect("poll").is_some() {
            let _ = child.kill();
            let _ = std::fs::remove_dir_all(&tmpdir);
            panic!("no image layout ever appeared under {}", root.display());
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    assert!(
        layout.exists(),
        "the killed process's layout is gone already"
    );
    // The next build finishes the work, loading images: the dead process's
    // scratch directory goes, and its own goes when it is done.
    let out = build("0").output().expect("rerun");
    let left: Vec<PathBuf> = std::fs::read_dir(&root)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    let _ = std::fs::remove_dir_all(&tmpdir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(left.is_empty(), "left in the temp directory: {left:?}");
}
