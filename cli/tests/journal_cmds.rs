//! The no-op journal of the commands besides `box generate`: `box plan`,
//! `box list`, `graph`, `validate` and `box build` (with and without
//! `--dry-run`) replay
//! an unchanged run's output byte for byte, say so with `--explain`, equal
//! a fresh `--no-journal` run, and never replay stale output after an edit
//! to a candy or box file, a build that added records, or a GC.
//!
//! `CHARLY_JOURNAL_RACY_MS=0`: files written moments ago are trusted by
//! stat (see cli/tests/journal.rs).

use charly_testutil::{Sandbox, graph_fixture};

struct Env(Sandbox);

impl std::ops::Deref for Env {
    type Target = Sandbox;
    fn deref(&self) -> &Sandbox {
        &self.0
    }
}

/// One run: stdout, stderr without the journal's own `--explain` line, and
/// that line.
#[derive(Debug)]
struct Run {
    stdout: Vec<u8>,
    stderr: String,
    journal: String,
}

const REPLAYED: &str = "journal: replayed from the journal";

impl Env {
    fn new() -> Env {
        Env(Sandbox::new(
            assert_cmd::cargo::cargo_bin("charly"),
            &graph_fixture(),
        ))
    }

    fn run(&self, args: &[&str]) -> Run {
        let out = self.command(args).output().expect("charly runs");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            out.status.success(),
            "charly {args:?} failed:\n{}{stderr}",
            String::from_utf8_lossy(&out.stdout)
        );
        let (journal, rest): (Vec<&str>, Vec<&str>) =
            stderr.lines().partition(|l| l.starts_with("journal: "));
        Run {
            stdout: out.stdout,
            stderr: rest.join("\n"),
            journal: journal.join("\n"),
        }
    }

    /// `args` with `--explain`.
    fn explained(&self, args: &[&str]) -> Run {
        let mut a = args.to_vec();
        a.push("--explain");
        self.run(&a)
    }

    /// Runs `args` until a run replays (at most twice more), then checks
    /// that the replay prints exactly what a fresh `--no-journal` run
    /// prints, stdout byte for byte and stderr line for line (summary
    /// lines of builds aside, which say that nothing changed).
    fn settle(&self, args: &[&str]) -> Run {
        let replay = (0..3)
            .map(|_| self.explained(args))
            .find(|r| r.journal.contains(REPLAYED))
            .unwrap_or_else(|| panic!("{args:?}: no run was replayed"));
        let mut a = args.to_vec();
        a.push("--no-journal");
        let fresh = self.explained(&a);
        assert_eq!(
            fresh.journal, "journal: not used (--no-journal)",
            "{args:?}"
        );
        assert_eq!(
            String::from_utf8_lossy(&replay.stdout),
            String::from_utf8_lossy(&fresh.stdout),
            "{args:?}: the replay differs from a fresh run"
        );
        assert_eq!(replay.stdout, fresh.stdout, "{args:?}: bytes");
        let strip = |s: &str| -> Vec<String> {
            s.lines()
                .map(|l| {
                    let l = l.replace(" (nothing changed since the last run)", "");
                    // Summary lines end with the run's wall time.
                    match l.rfind(" in ") {
                        Some(i) if l.ends_with(" ms") => l[..i].to_string(),
                        _ => l,
                    }
                })
                .collect()
        };
        assert_eq!(
            strip(&replay.stderr),
            strip(&fresh.stderr),
            "{args:?}: stderr"
        );
        // --no-journal leaves the journal alone.
        assert!(self.explained(args).journal.contains(REPLAYED), "{args:?}");
        replay
    }

    /// A run of `args` that must not be a replay; returns it and checks it
    /// equals a fresh `--no-journal` run.
    fn full(&self, args: &[&str], why: &str) -> Run {
        let run = self.explained(args);
        assert!(
            run.journal.starts_with("journal: not replayed: ") && run.journal.contains(why),
            "{args:?}: expected a miss naming `{why}`, got: {}",
            run.journal
        );
        let mut a = args.to_vec();
        a.push("--no-journal");
        assert_eq!(
            String::from_utf8_lossy(&run.stdout),
            String::from_utf8_lossy(&self.run(&a).stdout),
            "{args:?}"
        );
        run
    }

    fn edit(&self, rel: &str, from: &str, to: &str) {
        let p = self.project.join(rel);
        let s = std::fs::read_to_string(&p).expect("read");
        assert!(s.contains(from), "{rel}: {from}");
        std::fs::write(&p, s.replace(from, to)).expect("write");
    }
}

const PRINTING: &[&[&str]] = &[
    &["box", "plan", "left"],
    &["box", "plan", "left", "--json", "--target", "local"],
    &["box", "list"],
    &["box", "list", "--json"],
    &["candy", "list"],
    &["candy", "list", "--json"],
    &["graph"],
    &["graph", "--format", "json"],
    &["graph", "--generate", "left"],
    &["validate"],
    &["validate", "--json"],
];

#[test]
fn printing_commands_replay_what_a_fresh_run_prints() {
    let env = Env::new();
    for args in PRINTING {
        let first = env.explained(args);
        assert!(
            first.journal.contains("no journal entry for this command"),
            "{args:?}: {}",
            first.journal
        );
        assert!(
            !first.stdout.is_empty() || !first.stderr.is_empty(),
            "{args:?} prints"
        );
        env.settle(args);
    }
    // Each command line is its own entry: one replayed did not answer another.
    let json = env.explained(&["box", "plan", "left", "--json"]);
    assert!(
        json.journal.contains("no journal entry"),
        "{}",
        json.journal
    );
    let plain = env.settle(&["box", "plan", "left"]);
    assert_ne!(json.stdout, plain.stdout);
    // box list's count goes to stderr, replayed too.
    let list = env.settle(&["box", "list"]);
    assert!(list.stderr.contains("boxes,"), "{}", list.stderr);
}

#[test]
fn an_edit_to_a_candy_or_box_file_is_never_replayed_stale() {
    let env = Env::new();
    for args in PRINTING {
        env.settle(args);
    }
    let before: Vec<Vec<u8>> = PRINTING.iter().map(|a| env.run(a).stdout).collect();
    // A candy of `left`: its plan and every key above it change.
    env.edit(
        "candy/common2/charly.yml",
        "/etc/common2.conf",
        "/etc/common2-edited.conf",
    );
    for (args, old) in PRINTING.iter().zip(&before) {
        let run = env.full(args, "input changed");
        // The list and validate's report do not show an env value.
        if !args.contains(&"list") && args[0] != "validate" {
            assert_ne!(&run.stdout, old, "{args:?}: the edit shows");
        }
        env.settle(args);
    }
    // The box file: its version.
    let before_plan = env.run(&["box", "plan", "left"]).stdout;
    let p = env.project.join("box/left/charly.yml");
    let text = std::fs::read_to_string(&p).expect("read");
    std::fs::write(&p, text.replace("version: 1.0.0", "version: 1.0.10")).expect("write");
    let run = env.full(&["box", "plan", "left"], "box/left/charly.yml");
    assert_ne!(run.stdout, before_plan);
    assert!(String::from_utf8_lossy(&run.stdout).contains("1.0.10"));
    env.settle(&["box", "plan", "left"]);
    // A new file in a candy directory (its directory changed). `graph` is
    // settled first: its entry predates the box edit too, and a check
    // names whichever changed input it finds first.
    env.settle(&["graph"]);
    std::fs::write(env.project.join("candy/common2/extra.txt"), "x\n").expect("write");
    env.full(&["graph"], "candy/common2");
    env.settle(&["graph"]);
}

#[test]
fn graph_is_not_replayed_after_the_store_gained_or_lost_records() {
    let env = Env::new();
    // The keys of the fake runner's builds.
    let args: &[&str] = &["graph", "--format", "json", "--runner", "fake"];
    let states = |r: &Run| -> Vec<String> {
        let v: serde_json::Value = serde_json::from_slice(&r.stdout).expect("json");
        v["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .map(|n| n["state"].as_str().expect("state").to_string())
            .collect()
    };
    env.explained(args);
    let cold = env.settle(args);
    assert!(states(&cold).iter().all(|s| s == "would-run"));
    // A build adds every record (the epoch stays the same).
    env.run(&["box", "build", "--all", "--runner", "fake", "-q"]);
    let built = env.full(args, "the store has a record for");
    assert!(states(&built).iter().all(|s| s == "cached"), "{built:?}");
    env.settle(args);
    // A GC removes some.
    env.run(&["cache", "gc", "--max-size", "0"]);
    let gced = env.full(args, "the store deleted entries since");
    assert!(states(&gced).iter().any(|s| s == "would-run"));
    env.settle(args);
}

#[test]
fn box_build_replays_a_no_op_and_rebuilds_after_an_edit() {
    let env = Env::new();
    let fake_log = env.dir().join("fake.log");
    // Progress lines (one per node on a pipe) are for people, not replayed.
    let build: &[&str] = &[
        "box",
        "build",
        "--all",
        "--runner",
        "fake",
        "--progress",
        "quiet",
    ];
    let dry: &[&str] = &[
        "box",
        "build",
        "--all",
        "--runner",
        "fake",
        "--dry-run",
        "--progress",
        "quiet",
    ];
    // A dry run on an empty store: everything would run; replayed until a
    // build adds records.
    env.explained(dry);
    let cold = env.settle(dry);
    assert!(String::from_utf8_lossy(&cold.stdout).contains("would run"));
    let first = env.explained(build);
    assert!(
        first.journal.contains("no journal entry"),
        "{}",
        first.journal
    );
    assert!(
        first.stderr.contains(" ran") && !first.stderr.contains(" 0 ran"),
        "{}",
        first.stderr
    );
    let replay = env.settle(build);
    assert!(
        replay
            .stderr
            .contains("(nothing changed since the last run)"),
        "{}",
        replay.stderr
    );
    let warm = env.full(dry, "the store's index changed");
    assert!(!String::from_utf8_lossy(&warm.stdout).contains("would run"));
    env.settle(dry);
    // The replay ran nothing: the fake runner logs every call.
    let logged = |args: &[&str]| {
        let _ = std::fs::remove_file(&fake_log);
        let out = env
            .command(args)
            .env("CHARLY_FAKE_LOG", &fake_log)
            .output()
            .expect("charly runs");
        assert!(out.status.success());
        (
            String::from_utf8_lossy(&out.stderr).into_owned(),
            std::fs::read_to_string(&fake_log).unwrap_or_default(),
        )
    };
    // The fake runner's settings are part of the command in test builds.
    let (err, _) = logged(&[build, &["--explain"][..]].concat());
    assert!(err.contains("no journal entry"), "{err}");
    let (err, calls) = logged(&[build, &["--explain"][..]].concat());
    assert!(err.contains(REPLAYED), "{err}");
    assert_eq!(calls, "", "a replayed build runs nothing");
    // An edit: not replayed, the edited candy's nodes run.
    env.edit(
        "candy/common2/charly.yml",
        "COMMON2: \"yes\"",
        "COMMON2: \"edited\"",
    );
    let (err, calls) = logged(&[build, &["--explain"][..]].concat());
    assert!(
        err.contains("journal: not replayed: input changed"),
        "{err}"
    );
    assert!(calls.contains("left"), "{calls}");
    env.full(dry, "input changed");
    // A failing build is not recorded: the next run is not a replay.
    env.edit(
        "candy/common2/charly.yml",
        "COMMON2: \"edited\"",
        "COMMON2: \"again\"",
    );
    let out = env
        .command(&[build, &["-q"][..]].concat())
        .env("CHARLY_FAKE_FAIL", "layer:left/common2")
        .output()
        .expect("charly runs");
    assert_eq!(out.status.code(), Some(1));
    let out = env
        .command(&[build, &["--explain"][..]].concat())
        .env("CHARLY_FAKE_FAIL", "layer:left/common2")
        .output()
        .expect("charly runs");
    assert_eq!(out.status.code(), Some(1), "still fails, not replayed");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("journal: not replayed: no journal entry")
    );
}
