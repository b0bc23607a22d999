//! The no-op journal end to end: `box generate --all` on a copy of the
//! corpus replays an unchanged run, and every kind of change (a candy file,
//! a new file, a hand-edited or deleted output, a GC, `--no-journal`) falls
//! back to the full run, whose result the replay must equal.
//!
//! The file system's timestamp granularity makes files written moments ago
//! untrustworthy by stat; the journal refuses to record over them for two
//! seconds. These tests set `CHARLY_JOURNAL_RACY_MS=0` rather than wait; the
//! window itself is unit-tested in `engine/src/journal.rs`.

use charly_testutil::{Sandbox, corpus};
use std::path::{Path, PathBuf};

struct Env {
    sb: Sandbox,
    runs: std::cell::Cell<u32>,
}

impl std::ops::Deref for Env {
    type Target = Sandbox;
    fn deref(&self) -> &Sandbox {
        &self.sb
    }
}

/// One run: whether it was replayed, its summary, its stdout.
struct Run {
    replayed: bool,
    summary: serde_json::Value,
    stdout: String,
}

impl Env {
    fn new() -> Env {
        Env {
            sb: Sandbox::new(assert_cmd::cargo::cargo_bin("charly"), &corpus()),
            runs: std::cell::Cell::new(0),
        }
    }

    fn generate(&self, extra: &[&str]) -> Run {
        let n = self.runs.get() + 1;
        self.runs.set(n);
        let summary = self.dir().join(format!("summary-{n}.json"));
        let mut args = vec![
            "box",
            "generate",
            "--all",
            // The corpus has boxes that do not resolve offline.
            "--keep-going",
            "--summary-json",
            summary.to_str().expect("utf8"),
        ];
        args.extend(extra);
        let out = self.ok(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        Run {
            replayed: stderr.contains("nothing changed since the last run"),
            summary: serde_json::from_slice(&std::fs::read(&summary).expect("summary"))
                .expect("json"),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        }
    }

    /// A run that must not be a replay (something changed).
    fn full(&self) -> Run {
        let run = self.generate(&[]);
        assert!(!run.replayed, "a run after a change was replayed");
        run
    }

    /// Runs until one is replayed (a run that rewrote the project's own
    /// directory is not recorded yet), then checks that the replay says
    /// exactly what a full run (`--no-journal`) says.
    fn settle(&self) {
        let mut replayed = false;
        for _ in 0..3 {
            if self.generate(&[]).replayed {
                replayed = true;
                break;
            }
        }
        assert!(replayed, "no run was replayed");
        let full = self.generate(&["--no-journal"]);
        assert!(!full.replayed);
        let replay = self.generate(&[]);
        assert!(replay.replayed, "--no-journal must leave the journal alone");
        assert_same(&full, &replay);
    }
}

fn nodes(s: &serde_json::Value) -> Vec<(String, String, String)> {
    let mut v: Vec<_> = s["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| {
            (
                n["id"].as_str().expect("id").to_string(),
                n["key"].as_str().expect("key").to_string(),
                n["state"].as_str().expect("state").to_string(),
            )
        })
        .collect();
    v.sort();
    v
}

fn ran(s: &serde_json::Value) -> Vec<String> {
    nodes(s)
        .into_iter()
        .filter(|n| n.2 == "ran")
        .map(|n| n.0)
        .collect()
}

/// The replay says exactly what the full no-op run said.
fn assert_same(full: &Run, replay: &Run) {
    assert!(
        ran(&full.summary).is_empty(),
        "the settling run was a no-op"
    );
    assert_eq!(nodes(&full.summary), nodes(&replay.summary));
    assert_eq!(full.stdout, replay.stdout);
    assert_eq!(
        replay.summary["totals"]["cached"],
        replay.summary["totals"]["nodes"]
    );
}

fn containerfiles(root: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut v: Vec<_> = walkdir::WalkDir::new(root.join(".build"))
        .into_iter()
        .flatten()
        .filter(|e| e.file_type().is_file())
        .map(|e| {
            (
                e.path().to_path_buf(),
                std::fs::read(e.path()).expect("read"),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn unchanged_runs_replay_and_every_change_falls_back() {
    let env = Env::new();
    let first = env.full();
    assert!(!ran(&first.summary).is_empty(), "cold run builds");
    env.settle();
    let tree = containerfiles(&env.project);

    // A candy file that fragments depend on.
    let cfg = env.project.join("candy/filebrowser/config.yaml");
    let mut text = std::fs::read_to_string(&cfg).expect("read");
    text.push_str("# edited\n");
    std::fs::write(&cfg, text).expect("write");
    let rebuilt = ran(&env.full().summary);
    assert!(
        rebuilt.iter().any(|id| id.contains("filebrowser")),
        "the edited candy's nodes rerun: {rebuilt:?}"
    );
    env.settle();

    // A new file in a candy directory.
    std::fs::write(env.project.join("candy/filebrowser/new.txt"), "x\n").expect("write");
    env.full();
    env.settle();
    let tree_after_edits = containerfiles(&env.project);
    assert_ne!(tree, tree_after_edits, "the edits changed generated files");

    // A hand-edited generated file is put back; so is a deleted one.
    let (cf, original) = tree_after_edits
        .iter()
        .find(|(p, _)| p.ends_with("Containerfile"))
        .expect("a Containerfile")
        .clone();
    std::fs::write(&cf, b"FROM scratch\n").expect("write");
    env.full();
    assert_eq!(std::fs::read(&cf).expect("read"), original);
    env.settle();
    std::fs::remove_file(&cf).expect("rm");
    env.full();
    assert_eq!(std::fs::read(&cf).expect("read"), original);
    env.settle();
    assert_eq!(containerfiles(&env.project), tree_after_edits);

    // A GC may have dropped records: not replayed.
    env.ok(&["cache", "gc", "--max-size", "1G"]);
    env.full();
    env.settle();

    // A different selection is a different command.
    let all = env.generate(&[]);
    assert!(all.replayed);
    let name = nodes(&all.summary)
        .into_iter()
        .find_map(|n| n.0.strip_prefix("containerfile:").map(str::to_string))
        .expect("a box");
    let out = env.ok(&["box", "generate", &name]);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("nothing changed since the last run"));
}

/// `--out DIR` replays too: the directory and the candy directories copied
/// into it are outputs (a hand edit there is undone), never inputs.
#[test]
fn a_self_contained_context_replays_and_is_repaired() {
    let env = Env::new();
    let out = env.dir().join("context");
    let out_s = out.to_str().expect("utf8").to_string();
    let args = ["--out", out_s.as_str()];
    let first = env.generate(&args);
    assert!(!first.replayed);
    let mut replayed = false;
    for _ in 0..3 {
        if env.generate(&args).replayed {
            replayed = true;
            break;
        }
    }
    assert!(replayed, "an unchanged --out run was not replayed");
    let tree = containerfiles(&out);
    // A copied candy file edited by hand: not replayed, put back.
    let copied = out.join("candy/filebrowser/config.yaml");
    let original = std::fs::read(&copied).expect("copied candy file");
    std::fs::write(&copied, "edited by hand\n").expect("edit");
    assert!(!env.generate(&args).replayed);
    assert_eq!(std::fs::read(&copied).expect("read"), original);
    assert_eq!(containerfiles(&out), tree);
    // The default output directory is another command.
    let default = env.generate(&[]);
    assert!(!default.replayed);
    // An input edit reaches the context.
    let cfg = env.project.join("candy/filebrowser/config.yaml");
    let mut text = std::fs::read_to_string(&cfg).expect("read");
    text.push_str("# edited\n");
    std::fs::write(&cfg, &text).expect("write");
    assert!(!env.generate(&args).replayed);
    assert_eq!(
        std::fs::read_to_string(&copied).expect("read"),
        text,
        "the context carries the edited file"
    );
}

/// `--explain` says why the journal did not replay and why each node ran.
#[test]
fn explain_says_why_the_journal_did_not_replay_and_why_nodes_ran() {
    let env = Env::new();
    env.full();
    env.settle();
    let cfg = env.project.join("candy/filebrowser/config.yaml");
    let mut text = std::fs::read_to_string(&cfg).expect("read");
    text.push_str("# edited\n");
    std::fs::write(&cfg, text).expect("write");
    let out = env.ok(&["box", "generate", "--all", "--keep-going", "--explain"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.lines()
            .any(|l| l.contains("journal: not replayed: input changed: ")
                && l.contains("filebrowser/config.yaml")),
        "{err}"
    );
    assert!(
        err.lines()
            .any(|l| l.contains("explain: ") && l.contains("filebrowser") && l.contains(" ran: ")),
        "{err}"
    );
    let off = env.ok(&[
        "box",
        "generate",
        "--all",
        "--keep-going",
        "--explain",
        "--no-journal",
    ]);
    assert!(
        String::from_utf8_lossy(&off.stderr).contains("journal: not used (--no-journal)"),
        "{}",
        String::from_utf8_lossy(&off.stderr)
    );
}
