//! Commands that run or inspect the build graph: `box generate`, `box
//! build`, `graph`, `explain`. What they start a run with is
//! [`crate::session`]; what they report, [`crate::report`].

use crate::project::{self, Unresolved, select, select_warning};
use crate::report::{
    critical_line, remote_exec_line, report_failures, report_remote, report_remote_unless_quiet,
    summary_line, write_remote_exec_reports, write_reports,
};
use crate::session::{
    RUNNERS, RunArgs, RunnerArgs, StoreNotes, Using, engine, host_arch, jobs, make_runner,
    open_remote_cache, open_store, planned_graph, remote_exec_runner, stat_cache,
};
use crate::{Cli, output};
use anyhow::Context;
use charly_cache::Store;
use charly_engine::build::{BuildReport, BuildRequest};
use charly_engine::graph::Goal;
use charly_engine::id::NodeId;
use charly_engine::journal::{Journal, Scope};
use charly_engine::pure::Printed;
use charly_engine::runners::Runner;
use charly_engine::sched::{State, Summary};
use charly_rules::naming;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// Arguments of `box generate`.
#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    /// Boxes to generate (default with `--all`: every enabled box that resolves).
    #[arg(value_name = "BOX")]
    pub boxes: Vec<String>,
    /// Generate every enabled box.
    #[arg(long)]
    pub all: bool,
    /// Write a self-contained build context to DIR (its `.build/<box>/` plus
    /// the candy directories the Containerfiles copy from) instead of the project.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub dev_local_pkg: crate::session::DevLocalPkg,
    /// Print the Containerfile of the one named box on stdout; write nothing.
    #[arg(long)]
    pub stdout: bool,
    /// Always load the project and look up every node. By default a run
    /// whose inputs (every file and directory of the project, by stat), outputs,
    /// store and charly binary are unchanged since the last identical run
    /// replays that run's result without loading anything (the no-op
    /// journal, kept in the store).
    #[arg(long, env = "CHARLY_NO_JOURNAL")]
    pub no_journal: bool,
    /// Say why the last run was not replayed (the first input or output
    /// that changed, a new binary, a store deletion, …) and, after the run,
    /// why each node that ran did (what changed since its last build).
    #[arg(long)]
    pub explain: bool,
    #[command(flatten)]
    pub run: RunArgs,
}

/// Arguments of `box build`.
#[derive(clap::Args, Debug)]
pub struct BuildArgs {
    /// Boxes to build (their bases and builder boxes are built first).
    #[arg(value_name = "BOX")]
    pub boxes: Vec<String>,
    /// Build every enabled box that resolves.
    #[arg(long)]
    pub all: bool,
    /// Compute every key and print, per node, `cached` or `would run`; run nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Say whether the run was replayed from the no-op journal (or why
    /// not); after a run, explain every node that ran (what changed since
    /// its last build).
    #[arg(long)]
    pub explain: bool,
    /// Always load the project and look up every node. By default a build
    /// whose inputs (every file and directory of the project, by stat),
    /// store and charly binary are unchanged since the last identical
    /// successful build reports that build's result without loading
    /// anything (every node is still in the store; nothing runs).
    #[arg(long, env = "CHARLY_NO_JOURNAL")]
    pub no_journal: bool,
    #[command(flatten)]
    pub dev_local_pkg: crate::session::DevLocalPkg,
    /// Make the built images present in podman even when nothing was
    /// assembled (after `podman system prune`, or on a machine whose store
    /// came from a cache). Images assembled by this build are loaded
    /// anyway; check beds, builder stages and deploys load what they need.
    #[arg(long)]
    pub load: bool,
    /// Also write the built images to an OCI image layout: `--output oci:DIR`
    /// (each box under the reference `<box>-<version>`).
    #[arg(long, value_name = "oci:DIR", value_parser = parse_output)]
    pub output: Option<PathBuf>,
    /// Write what the build made as JSON to FILE, for the next step of a
    /// pipeline: per box its reference, the image node's key, its
    /// configuration digest (the image id podman shows), its manifest
    /// digest (the `Digest` podman and a registry show), whether podman has
    /// it, and with `--push` the pushed `REF@sha256:…`.
    #[arg(long, value_name = "FILE")]
    pub metadata_file: Option<PathBuf>,
    /// Push the built image to a registry: `--push [oci://]HOST[:PORT]/REPO[:TAG]`
    /// (TAG defaults to the box's version). Layers the registry has are not
    /// sent again. One box only.
    #[arg(long, value_name = "REF")]
    pub push: Option<String>,
    #[command(flatten)]
    pub run: RunArgs,
    #[command(flatten)]
    pub runner: RunnerArgs,
}

fn parse_output(s: &str) -> Result<PathBuf, String> {
    match s.strip_prefix("oci:") {
        Some(d) if !d.is_empty() => Ok(PathBuf::from(d)),
        _ => Err(format!("expected oci:DIR, got `{s}`")),
    }
}

/// Arguments of `graph`.
#[derive(clap::Args, Debug)]
pub struct GraphArgs {
    /// Boxes (default: every enabled box that resolves).
    #[arg(value_name = "BOX")]
    pub boxes: Vec<String>,
    /// Output format.
    #[arg(long, default_value = "dot", value_parser = ["dot", "json"])]
    pub format: String,
    #[command(flatten)]
    pub graph: crate::session::PlannedGraph,
    #[command(flatten)]
    pub journal: crate::journaled::JournalArgs,
}

/// Arguments of `explain`.
#[derive(clap::Args, Debug)]
pub struct ExplainArgs {
    /// Node id (`fragment:jupyter/direnv`, `image:fedora`), or a box, candy,
    /// builder or image name that only one node is made of.
    #[arg(value_name = "NODE")]
    pub node: String,
    /// Print the explanation as JSON.
    #[arg(long)]
    pub json: bool,
    /// Runner whose builds to explain (keys of built nodes include it).
    #[arg(long, default_value = "podman", value_parser = clap::builder::PossibleValuesParser::new(RUNNERS))]
    pub runner: String,
    #[command(flatten)]
    pub dev_local_pkg: crate::session::DevLocalPkg,
}

/// The runner `generate` keys with (it runs none, and none of its nodes'
/// keys name a runner).
const GENERATE_RUNNER: &str = "podman";

/// The no-op journal of this `box generate`, when one applies: no
/// `--stdout`, no remote cache (whose traffic a replay would skip), a known
/// store, no `--no-journal`. With `--out DIR` the directory is an output
/// (never an input, even inside the project).
fn generate_journal(cli: &Cli, a: &GenerateArgs, root: &Path) -> Option<(Journal, Scope)> {
    if a.no_journal || a.stdout || cli.remote.as_deref().is_some_and(|r| !r.is_empty()) {
        return None;
    }
    let store_dir = cli.cache_dir.clone().or_else(Store::default_dir)?;
    let imports: Vec<PathBuf> = cli.imports.iter().map(|(_, d)| d.clone()).collect();
    let mut scope = Scope::project(root, &imports, &store_dir);
    if let Some(out) = &a.out {
        scope.skip.push(charly_engine::journal::normalize(out));
    }
    let mut boxes = a.boxes.clone();
    boxes.sort();
    let command = serde_json::json!({
        "command": "box generate",
        "version": env!("CARGO_PKG_VERSION"),
        "root": scope.roots[0],
        // The printed paths are spelled from these.
        "dir": cli.dir,
        "cwd": std::env::current_dir().ok(),
        "imports": cli.imports,
        "boxes": boxes,
        "all": a.all,
        "keep_going": a.run.keep_going,
        "dev_local_pkg": a.dev_local_pkg.on,
        "out": a.out.as_deref().map(charly_engine::journal::normalize),
    })
    .to_string();
    Some((crate::journaled::open_journal(&store_dir, &command), scope))
}

/// Why [`generate_journal`] gave none.
fn journal_off_reason(cli: &Cli, a: &GenerateArgs) -> &'static str {
    if a.no_journal {
        "--no-journal"
    } else if a.stdout {
        "--stdout"
    } else if cli.remote.as_deref().is_some_and(|r| !r.is_empty()) {
        "a remote cache: a replay would skip its traffic"
    } else {
        "no store directory"
    }
}

/// Prints what a replayed run printed the first time (its reports,
/// warnings and stdout); returns its summary, the last line left to the
/// caller.
fn replay(
    run: &RunArgs,
    outcome: &charly_engine::journal::Outcome,
    started: Instant,
) -> anyhow::Result<Summary> {
    let summary = Summary::replayed(outcome, started.elapsed().as_millis() as u64);
    write_reports(run, &summary)?;
    for w in &outcome.warnings {
        output::note(w);
    }
    let mut stdout = std::io::stdout().lock();
    for line in &outcome.stdout {
        writeln!(stdout, "{line}")?;
    }
    Ok(summary)
}

/// Prints what a replayed `box generate` printed the first time.
fn replay_generate(
    a: &GenerateArgs,
    outcome: &charly_engine::journal::Outcome,
    started: Instant,
) -> anyhow::Result<ExitCode> {
    let summary = replay(&a.run, outcome, started)?;
    if !a.run.quiet {
        output::note(&format!(
            "{} (nothing changed since the last run)",
            summary_line("generate", &summary)
        ));
    }
    Ok(ExitCode::SUCCESS)
}

/// A scoped thread's result; its panic goes on in this thread.
fn join<T>(h: std::thread::ScopedJoinHandle<'_, T>) -> T {
    h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
}

/// `box generate` on the engine.
pub fn generate(cli: &Cli, a: &GenerateArgs) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    let root = project::root(cli)?;
    let journal = generate_journal(cli, a, &root);
    let seed = match check_generate_journal(cli, a, journal.as_ref().map(|(j, _)| j)) {
        Checked::Run(seed) => seed,
        Checked::Replay(outcome) => return replay_generate(a, &outcome, started),
    };
    let Opening {
        mut recorder,
        project: o,
        store: opened,
        mut memo,
    } = open_in_parallel(cli, a, root, &journal, seed);
    let mut o = o?;
    let t = charly_engine::timings::phase("select");
    let (names, warnings) =
        select_warning(&o, &a.boxes, a.all, Unresolved::unless(a.run.keep_going))?;
    drop(t);
    if a.stdout && names.len() != 1 {
        anyhow::bail!("--stdout prints one Containerfile; name exactly one box");
    }
    let (store, hasher) = opened?;
    let uses_plugins = crate::plugins::prepare_build(&mut o, store.dir(), &names)?;
    if let Some(rec) = &mut recorder {
        // A plugin's executable lives outside the project: the journal
        // would not see it change, so such a run is not replayed (nor are
        // its boxes carried over).
        if !rec.covers_project(&o.project) || uses_plugins {
            rec.spoil();
        }
    }
    let _notes = StoreNotes(&store);
    let remote = open_remote_cache(cli)?;
    let engine = engine(
        &o,
        &store,
        Using::Named(GENERATE_RUNNER),
        &hasher,
        a.dev_local_pkg.on,
        remote.as_deref(),
    );
    let out_root = a.out.clone().unwrap_or_else(|| o.project.root.clone());
    // Boxes whose inputs did not change since the last run are carried over
    // from its journal, not derived again (charly_engine::carry).
    let carry = plan_carry(
        a,
        &engine,
        &names,
        &out_root,
        recorder.as_ref(),
        memo.as_deref_mut(),
    );
    let graph = engine.graph(&Goal::Generate, &carry.derive)?;
    let t = charly_engine::timings::phase("progress");
    let progress = a.run.progress_for(&graph, &store, a.stdout, a.explain);
    drop(t);
    let mut summary = engine.run_with_memo(
        &graph,
        &out_root,
        jobs(&a.run),
        false,
        &progress,
        memo.as_deref(),
    );
    progress.finish();
    carry.add_carried(&mut summary, memo.as_deref());
    // The boxes' journal entries, for a run that records one.
    let boxes = if journal.is_some() && recorder.is_some() {
        carry.entries(&summary, &graph, memo.as_deref())
    } else {
        Vec::new()
    };
    write_reports(&a.run, &summary)?;
    if a.explain {
        explain_ran(&summary);
    }
    if !summary.ok() {
        report_failures(&summary);
        report_remote(&summary);
        return Ok(ExitCode::from(1));
    }
    if a.stdout {
        let bytes = containerfile_of(&engine, &graph, &store, &out_root, &names[0])?;
        std::io::stdout().lock().write_all(&bytes)?;
        return Ok(ExitCode::SUCCESS);
    }
    let ignore = o.project.root.join(".containerignore");
    let had_ignore = ignore.exists();
    let (_, mut kept) =
        engine.write_build_dirs_keeping(&graph, &out_root, a.out.is_some(), memo.as_deref())?;
    // Every selected box's Containerfile, derived or carried, in selection
    // order (what write_build_dirs_keeping lists for the boxes it wrote).
    let written: Vec<PathBuf> = names
        .iter()
        .map(|n| out_root.join(naming::build_dir(n)).join("Containerfile"))
        .collect();
    kept.extend(
        carry
            .carried
            .iter()
            .map(|n| out_root.join(naming::build_dir(n))),
    );
    let lines = print_written(&a.run, &written, &summary, !had_ignore && ignore.exists())?;
    // The candy directories a self-contained context carries (outputs).
    let context = match (&journal, &a.out) {
        (Some(_), Some(_)) => {
            let all: Vec<&str> = names.iter().map(String::as_str).collect();
            engine.box_context_candy_dirs(&all, &out_root)
        }
        _ => Vec::new(),
    };
    drop(progress);
    drop(engine);
    drop(_notes);
    // The store closes (access times written, its WAL checkpointed: a few
    // ms of I/O) while the journal is written.
    std::thread::scope(|s| {
        s.spawn(move || drop(store));
        let (Some((j, _)), Some(rec)) = (journal, recorder) else {
            return;
        };
        let mut outcome = summary.outcome(lines);
        outcome.warnings = warnings;
        outcome.boxes = boxes;
        let written = Written {
            out_root: &out_root,
            containerfiles: &written,
            context,
            kept: &kept,
        };
        record_generate(&j, rec, written, outcome, memo.as_deref());
    });
    // The graph, the project, the summary, the last run's memo and the
    // stat cache are trees of many small allocations that only the
    // process's exit needs to free (0.3 s at 10,000 candies): left to it.
    // Nothing in them holds a file or a lock (the stat cache was saved).
    std::mem::forget(graph);
    std::mem::forget(o);
    std::mem::forget(summary);
    std::mem::forget(memo);
    std::mem::forget(hasher);
    Ok(ExitCode::SUCCESS)
}

/// Prints the Containerfiles `generate` wrote, one path per line (the
/// lines the journal replays), then, unless quiet, the summary; says so
/// when it wrote the ignore files for the first time.
fn print_written(
    run: &RunArgs,
    written: &[PathBuf],
    summary: &Summary,
    wrote_ignore: bool,
) -> anyhow::Result<Vec<String>> {
    if wrote_ignore && !run.quiet {
        output::note(
            "wrote .containerignore and .dockerignore: podman and docker read them when they build \
             .build/<box>/Containerfile with the project as context (commit them or ignore them)",
        );
    }
    let lines: Vec<String> = written.iter().map(|p| p.display().to_string()).collect();
    let mut stdout = std::io::stdout().lock();
    for line in &lines {
        writeln!(stdout, "{line}")?;
    }
    if !run.quiet {
        output::note(&summary_line("generate", summary));
    }
    report_remote_unless_quiet(summary, run.quiet);
    Ok(lines)
}

/// The boxes `generate` carries over from the last run unchanged, and
/// those it derives again (said with `--explain`).
fn plan_carry(
    a: &GenerateArgs,
    engine: &charly_engine::api::Engine<'_>,
    names: &[String],
    out_root: &Path,
    recorder: Option<&charly_engine::journal::Recorder>,
    memo: Option<&mut charly_engine::journal::Memo>,
) -> charly_engine::carry::Carry {
    let context_dirs = |n: &str| {
        if a.out.is_some() {
            engine.box_context_candy_dirs(&[n], out_root)
        } else {
            Vec::new()
        }
    };
    let carry = charly_engine::carry::plan(
        memo.as_deref(),
        recorder,
        engine.project,
        engine.resolution,
        names,
        out_root,
        &context_dirs,
    );
    // From here on this run writes build directories: answers taken
    // ahead would be stale.
    if let Some(m) = memo {
        m.forget_ahead();
    }
    if a.explain && !carry.carried.is_empty() {
        output::note(&format!(
            "explain: {} of {} boxes unchanged since the last run (inputs, resolution and build \
             directory as it left them): carried over, not derived again",
            carry.carried.len(),
            names.len()
        ));
    }
    carry
}

/// What `generate` opens before it plans, and how far each part got.
struct Opening {
    /// The journal's fingerprint of the inputs (when a journal is kept).
    recorder: Option<charly_engine::journal::Recorder>,
    project: anyhow::Result<project::Opened>,
    store: anyhow::Result<(Store, charly_engine::hash::FileHasher)>,
    /// The last run's memo, indexed (when the journal had one).
    memo: Option<Box<charly_engine::journal::Memo>>,
}

/// Opens what `generate` needs at once: the project loads on this thread
/// while others fingerprint the inputs (from a start taken before
/// anything is read), open the store and index the last run's memo: none
/// needs another's result.
fn open_in_parallel(
    cli: &Cli,
    a: &GenerateArgs,
    root: PathBuf,
    journal: &Option<(Journal, Scope)>,
    seed: Option<charly_engine::journal::MemoSeed>,
) -> Opening {
    let started = journal.as_ref().map(|(j, _)| j.start());
    // The build directories the carry-over asks about are checked once the
    // inputs are walked: the rest of the load and the resolution leave a
    // core idle (checked from the start, they slowed the load down as much
    // as they saved). The project root is where the outputs go without
    // --out: a guess that misses only costs the check later.
    let out_guess = a.out.clone().unwrap_or_else(|| root.clone());
    let (walked, on_walked) = std::sync::mpsc::channel::<()>();
    let (recorder, project, store, memo) = std::thread::scope(|s| {
        let memo = s.spawn(move || {
            let mut m = seed.map(|s| Box::new(s.build()));
            if let Some(m) = m.as_deref_mut()
                && on_walked.recv().is_ok()
            {
                charly_engine::carry::check_ahead(m, &out_guess);
            }
            m
        });
        let journal = &journal;
        let walk = s.spawn(move || {
            let t = charly_engine::timings::phase("journal: begin");
            let rec = journal.as_ref().zip(started).map(|((j, scope), st)| {
                j.fingerprint_inputs(st, &scope.roots, &scope.files, &scope.skip)
            });
            drop(t);
            let _ = walked.send(());
            rec
        });
        let store = s.spawn(|| {
            let t = charly_engine::timings::phase("store: open");
            let store = open_store(cli)?;
            drop(t);
            let hasher = stat_cache(&store);
            anyhow::Ok((store, hasher))
        });
        let o = project::open_at(cli, root);
        (join(walk), o, join(store), join(memo))
    });
    Opening {
        recorder,
        project,
        store,
        memo,
    }
}

/// What `generate`'s journal says.
enum Checked {
    /// Nothing changed: the outcome to replay.
    Replay(charly_engine::journal::Outcome),
    /// Run, reusing what the last run left (if anything).
    Run(Option<charly_engine::journal::MemoSeed>),
}

/// Checks `generate`'s journal (why it is not replayed, or not used, is
/// noted under `--explain`).
fn check_generate_journal(cli: &Cli, a: &GenerateArgs, journal: Option<&Journal>) -> Checked {
    let _t = charly_engine::timings::phase("journal: check");
    match journal {
        Some(j) => match j.check_or_seed() {
            Ok(outcome) => Checked::Replay(outcome),
            Err((miss, m)) => {
                if a.explain {
                    let memo_note = if m.is_some() {
                        "; what it left is reused"
                    } else {
                        ""
                    };
                    output::note(&format!("journal: not replayed: {miss}{memo_note}"));
                }
                Checked::Run(m)
            }
        },
        None => {
            if a.explain {
                let why = journal_off_reason(cli, a);
                output::note(&format!("journal: not used ({why})"));
            }
            Checked::Run(None)
        }
    }
}

/// `--explain`: why each node ran. Sources are hashed, not run: the files
/// that changed in them are named in their dependents' reasons.
fn explain_ran(summary: &charly_engine::sched::Summary) {
    let ran = summary
        .nodes
        .iter()
        .filter(|n| n.state == State::Ran && n.kind != charly_engine::key::NodeKind::Source);
    for n in ran {
        let why = n
            .reason
            .as_deref()
            .unwrap_or("(no earlier record to compare)");
        output::note(&format!("explain: {} ran: {why}", n.id));
    }
}

/// The Containerfile of `box_name`'s build directory node, read like any
/// output (one that fails verification is rebuilt).
fn containerfile_of(
    engine: &charly_engine::api::Engine<'_>,
    graph: &charly_engine::graph::Graph,
    store: &charly_cache::Store,
    out_root: &Path,
    box_name: &str,
) -> anyhow::Result<charly_cache::BlobBuf> {
    let i = graph
        .index(&NodeId::containerfile(box_name, false))
        .context("no Containerfile node")?;
    let ctx = engine.ctx(out_root);
    let bytes = charly_engine::exec::read_node(&ctx, graph, i, |rec| {
        let missing = || charly_engine::exec::ExecError::MissingOutput {
            node: graph.g[i].id.clone(),
            output: "Containerfile".into(),
        };
        let (_, o) = rec
            .outputs
            .iter()
            .find(|(k, _)| k.ends_with("/Containerfile"))
            .ok_or_else(missing)?;
        store.get_blob(&o.digest)?.ok_or_else(missing)
    })?;
    Ok(bytes)
}

/// What a `generate` run wrote, for its journal entry.
struct Written<'a> {
    out_root: &'a Path,
    /// Every selected box's Containerfile.
    containerfiles: &'a [PathBuf],
    /// The candy directories a self-contained context carries.
    context: Vec<PathBuf>,
    /// The build directories it kept as they were.
    kept: &'a [PathBuf],
}

/// Records `generate`'s journal entry (a failure to is only noted).
fn record_generate(
    j: &Journal,
    rec: charly_engine::journal::Recorder,
    w: Written<'_>,
    outcome: charly_engine::journal::Outcome,
    memo: Option<&charly_engine::journal::Memo>,
) {
    let _t = charly_engine::timings::phase("journal: record");
    let (mut outputs, skip) =
        charly_engine::generate::journal_outputs(w.out_root, w.containerfiles);
    outputs.extend(w.context);
    let kept: Vec<PathBuf> = w
        .kept
        .iter()
        .map(|d| charly_engine::journal::normalize(d))
        .collect();
    let reuse = memo.map(|m| (m, kept.as_slice()));
    if let Err(e) = j.record_reusing(rec, &outputs, &skip, outcome, reuse) {
        output::note(&format!("could not write the no-op journal: {e}"));
    }
}

/// Why `box build` has no journal, if it has none: what a replay would
/// skip besides the graph (a push, an export, loading images into podman,
/// remote traffic), or a report a replay cannot give.
fn build_journal_off(cli: &Cli, a: &BuildArgs) -> Option<&'static str> {
    if a.no_journal {
        Some("--no-journal")
    } else if a.push.is_some() {
        Some("--push")
    } else if a.output.is_some() {
        Some("--output")
    } else if a.load {
        Some("--load")
    } else if a.metadata_file.is_some() {
        Some("--metadata-file")
    } else if a.runner.remote_exec.remote_exec.is_some() {
        Some("--remote-exec")
    } else if cli.remote.as_deref().is_some_and(|r| !r.is_empty()) {
        Some("a remote cache: a replay would skip its traffic")
    } else if a.dry_run && (a.run.summary_json.is_some() || a.run.trace.is_some()) {
        Some("--dry-run with a report: a replay reports every node as cached")
    } else {
        None
    }
}

/// The no-op journal of this `box build` (see [`build_journal_off`]).
fn build_journal(cli: &Cli, a: &BuildArgs, root: &Path) -> Option<(Journal, Scope)> {
    if build_journal_off(cli, a).is_some() {
        return None;
    }
    let mut boxes = a.boxes.clone();
    boxes.sort();
    let command = serde_json::json!({
        "command": "box build",
        "boxes": boxes,
        "all": a.all,
        "keep_going": a.run.keep_going,
        "dry_run": a.dry_run,
        "dev_local_pkg": a.dev_local_pkg.on,
        "runner": a.runner.runner,
        "podman_root": a.runner.podman_root,
        "ca_bundle": a.runner.ca_bundle,
        "offline": a.runner.offline,
    });
    crate::journaled::journal_for(cli, root, command)
}

/// `box build`: replayed from the no-op journal when nothing changed since
/// the last identical successful build (every node it reported is still in
/// the store: the epoch says nothing was deleted), else built.
pub fn build(cli: &Cli, a: &BuildArgs) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    let root = project::root(cli)?;
    let journal = build_journal(cli, a, &root);
    let miss = match &journal {
        Some((j, _)) => {
            let t = charly_engine::timings::phase("journal: check");
            match j.check().and_then(|o| j.check_store(&o).map(|()| o)) {
                Ok(outcome) => {
                    drop(t);
                    if a.explain {
                        output::note(&crate::journaled::explain_line(
                            &charly_engine::pure::Replay::Replayed,
                            "",
                        ));
                    }
                    return replay_build(a, &outcome, started);
                }
                Err(m) => charly_engine::pure::Replay::Missed(m),
            }
        }
        None => charly_engine::pure::Replay::Off,
    };
    if a.explain {
        output::note(&crate::journaled::explain_line(
            &miss,
            build_journal_off(cli, a).unwrap_or("no store directory"),
        ));
    }
    let Some((j, scope)) = &journal else {
        return Ok(build_full(cli, a, None)?.0);
    };
    let st = j.start();
    let (rec, done) = std::thread::scope(|s| {
        let walk = s.spawn(|| {
            let _t = charly_engine::timings::phase("journal: begin");
            j.fingerprint_inputs(st, &scope.roots, &scope.files, &scope.skip)
        });
        let done = build_full(cli, a, Some(scope));
        (join(walk), done)
    });
    let (code, outcome) = done?;
    if let Some((outcome, covered)) = outcome {
        let mut rec = rec;
        if !covered {
            rec.spoil();
        }
        let _t = charly_engine::timings::phase("journal: record");
        // Every node it reported is in the index as the run left it.
        if let Err(e) = j.record(rec, &j.store_index(), &[], outcome) {
            output::note(&format!("could not write the no-op journal: {e}"));
        }
    }
    Ok(code)
}

/// Prints what a replayed `box build` printed the first time.
fn replay_build(
    a: &BuildArgs,
    outcome: &charly_engine::journal::Outcome,
    started: Instant,
) -> anyhow::Result<ExitCode> {
    let summary = replay(&a.run, outcome, started)?;
    if !a.run.quiet {
        // A dry run's line counts what would run; a build's, now, nothing.
        let line = match outcome.notes.first() {
            Some(l) if a.dry_run => l.clone(),
            _ => summary_line("build", &summary),
        };
        output::note(&format!("{line} (nothing changed since the last run)"));
        for n in outcome.notes.iter().skip(1) {
            output::note(n);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `box build` in full; on success, the journal outcome of the run and
/// whether everything it read lies inside `scope`.
fn build_full(
    cli: &Cli,
    a: &BuildArgs,
    scope: Option<&Scope>,
) -> anyhow::Result<(ExitCode, Option<(charly_engine::journal::Outcome, bool)>)> {
    let mut o = project::open(cli)?;
    let (names, said) = select_warning(&o, &a.boxes, a.all, Unresolved::unless(a.run.keep_going))?;
    let store = open_store(cli)?;
    let uses_plugins = crate::plugins::prepare_build(&mut o, store.dir(), &names)?;
    let covered = scope.is_some_and(|s| s.covers_project(&o.project)) && !uses_plugins;
    let _notes = StoreNotes(&store);
    let hasher = stat_cache(&store);
    let j = jobs(&a.run);
    let runner = make_runner(&a.runner, &store, j)?;
    let remote_exec = remote_exec_runner(
        &a.runner.remote_exec,
        a.runner.ca_bundle.as_deref(),
        runner.as_ref(),
        &host_arch(),
    )?;
    let runner: &dyn Runner = match &remote_exec {
        Some(r) => r,
        None => runner.as_ref(),
    };
    let remote = open_remote_cache(cli)?;
    let engine = engine(
        &o,
        &store,
        Using::Runner(runner),
        &hasher,
        a.dev_local_pkg.on,
        remote.as_deref(),
    );
    let graph = engine.graph(&Goal::Build, &names)?;
    let mut progress = a.run.progress_for(&graph, &store, a.dry_run, false);
    if a.explain && !a.dry_run {
        progress = progress.explaining(engine.why_each_runs(&graph)?);
    }
    let request = BuildRequest {
        boxes: names.clone(),
        jobs: j,
        dry_run: a.dry_run,
        load: a.load,
        push: a.push.clone(),
        export_to: a.output.clone(),
        metadata: a.metadata_file.is_some(),
    };
    let built = engine.build(&graph, &request, &progress);
    progress.finish();
    let mut built = built?;
    let summary = &built.summary;
    let exec_stats = remote_exec.as_ref().map(|r| r.stats());
    match &exec_stats {
        Some(stats) => {
            write_remote_exec_reports(&a.run, summary, stats)?;
            if !a.run.quiet && !a.dry_run {
                output::note(&remote_exec_line(stats));
            }
        }
        None => write_reports(&a.run, summary)?,
    }
    // Not a replayed note: it is about this run's work.
    let critical = critical_line(summary, exec_stats.as_ref()).filter(|_| !a.run.quiet);
    let lines = if a.dry_run {
        print_dry_run(summary)?
    } else {
        Vec::new()
    };
    if !summary.ok() {
        report_failures(summary);
        output::note(&summary_line("build", summary));
        if let Some(c) = &critical {
            output::note(c);
        }
        report_remote(summary);
        return Ok((ExitCode::from(1), None));
    }
    engine.deliver(&graph, &request, &mut built)?;
    print_made(&built, a)?;
    let (summary, in_runner) = (&built.summary, &built.in_runner);
    // What a replay prints again after stdout (unless quiet).
    let mut notes = vec![summary_line(
        if a.dry_run { "dry run" } else { "build" },
        summary,
    )];
    if !a.dry_run && a.runner.runner == "podman" {
        notes.extend(run_hint(&o, &store, &names, in_runner, a));
    }
    if !a.run.quiet {
        for (i, n) in notes.iter().enumerate() {
            output::note(n);
            if i == 0
                && let Some(c) = &critical
            {
                output::note(c);
            }
        }
    }
    report_remote_unless_quiet(summary, a.run.quiet);
    let mut outcome = summary.outcome(lines);
    outcome.warnings = said;
    outcome.notes = notes;
    // Every node a replay reports: those a dry run found missing must
    // still be missing.
    outcome.absent = summary
        .nodes
        .iter()
        .filter(|n| n.state != State::Cached && a.dry_run)
        .map(|n| (n.id.clone(), n.key.to_hex()))
        .collect();
    Ok((ExitCode::SUCCESS, Some((outcome, covered))))
}

/// `--dry-run`: one line per node, cached or would run (printed, and
/// returned for the journal).
fn print_dry_run(summary: &charly_engine::sched::Summary) -> anyhow::Result<Vec<String>> {
    let mut out = std::io::stdout().lock();
    let mut lines = Vec::new();
    for n in &summary.nodes {
        let state = match n.state {
            State::Cached => "cached",
            _ => "would run",
        };
        let line = format!(
            "{state:<10} {:<14} {}  {}",
            n.kind.as_str(),
            n.key.short(12),
            n.id
        );
        writeln!(out, "{line}")?;
        lines.push(line);
    }
    Ok(lines)
}

/// Prints what the build made beyond its nodes: where `--push` put the
/// image (stdout, and a note), the `--output` layout's images (stdout);
/// writes `--metadata-file`.
fn print_made(built: &BuildReport, a: &BuildArgs) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    if let Some(p) = &built.pushed {
        writeln!(out, "{}", p.at)?;
        if !a.run.quiet {
            output::note(&format!(
                "pushed {} to {}:{} ({} sent)",
                p.box_name,
                p.url,
                p.tag,
                charly_cache::human_bytes(p.sent)
            ));
        }
    }
    if let (Some(file), Some(meta)) = (&a.metadata_file, &built.metadata) {
        let mut text = Vec::new();
        output::json_to(&mut text, meta)?;
        std::fs::write(file, text)
            .with_context(|| format!("--metadata-file {}", file.display()))?;
    }
    for e in &built.exported {
        writeln!(out, "oci:{}:{}", e.dir.display(), e.reference)?;
    }
    Ok(())
}

/// How to run the top built box with podman: podman ran with settings
/// charly wrote for this host (runc, ulimits), without which `podman run`
/// may fail (`error setting rlimit`); or how to load an image that came
/// from a cache.
fn run_hint(
    o: &project::Opened,
    store: &charly_cache::Store,
    names: &[String],
    in_runner: &[charly_engine::api::NamedImage],
    a: &BuildArgs,
) -> Option<String> {
    let conf = store.dir().join("podman").join("containers.conf");
    // The first box no other requested box is built on.
    let top = names.iter().find(|n| {
        !names.iter().any(|m| {
            o.resolution
                .get(m)
                .is_some_and(|b| b.base_chain.contains(n))
        })
    })?;
    let Some(img) = in_runner.iter().find(|i| i.box_name == *top) else {
        return Some(format!(
            "{top}'s image is in charly's store, not in podman (it came from a cache): \
             `charly box build {top} --load` loads it"
        ));
    };
    let storage = a.runner.podman_root.as_ref().map_or(String::new(), |r| {
        format!(
            " --root {} --runroot {}",
            r.join("storage").display(),
            r.join("run").display()
        )
    });
    let env = if std::env::var_os("CONTAINERS_CONF").is_none() && conf.is_file() {
        format!("CONTAINERS_CONF={} ", conf.display())
    } else {
        String::new()
    };
    // An image that says nothing to run gets a shell.
    Some(format!(
        "run it: {env}podman{storage} run --rm -it {}{}",
        charly_rules::naming::box_image_ref(&o.resolution, top),
        if img.has_command { "" } else { " sh" }
    ))
}

fn state_of(store: &Store, n: &charly_engine::graph::Node) -> &'static str {
    match store.get_record(&n.key) {
        Ok(Some(_)) => "cached",
        _ => "would-run",
    }
}

/// `graph`: through the journal (the store's state of each node is part of
/// what it prints: a node reported `would-run` must still have no record
/// for a replay).
pub fn graph(cli: &Cli, a: &GraphArgs) -> anyhow::Result<ExitCode> {
    let command = serde_json::json!({
        "command": "graph",
        "boxes": a.boxes,
        "format": a.format,
        "generate": a.graph.generate,
        "runner": a.graph.runner,
        "dev_local_pkg": a.graph.dev_local_pkg.on,
    });
    crate::journaled::print(cli, a.journal, command, |scope| graph_full(cli, scope, a))
}

fn graph_full(cli: &Cli, scope: &Scope, a: &GraphArgs) -> anyhow::Result<Printed> {
    let mut o = project::open(cli)?;
    let (names, said) = select_warning(&o, &a.boxes, a.boxes.is_empty(), Unresolved::Warn)?;
    let store = open_store(cli)?;
    let uses_plugins = crate::plugins::prepare_build(&mut o, store.dir(), &names)?;
    let mut printed = Printed {
        // A plugin's executable lives outside the project.
        covered: scope.covers_project(&o.project) && !uses_plugins,
        said,
        ..Printed::default()
    };
    let g = planned_graph(&o, &store, &a.graph, &names)?;
    let order = g.topo()?;
    let states: std::collections::HashMap<_, &str> = order
        .iter()
        .map(|i| (*i, state_of(&store, &g.g[*i])))
        .collect();
    printed.absent = order
        .iter()
        .filter(|i| states[*i] != "cached")
        .map(|i| (g.g[*i].id.clone(), g.g[*i].key.to_hex()))
        .collect();
    let out = &mut printed.stdout;
    if a.format == "json" {
        let nodes: Vec<serde_json::Value> = order
            .iter()
            .map(|i| {
                let n = &g.g[*i];
                serde_json::json!({
                    "id": n.id,
                    "kind": n.kind.as_str(),
                    "key": n.key.to_hex(),
                    "key_prefix": n.key.short(12),
                    "state": states[i],
                    "deps": g.deps(*i).iter().map(|d| g.g[*d].id.clone()).collect::<Vec<_>>(),
                })
            })
            .collect();
        output::json_to(out, &serde_json::json!({"nodes": nodes}))?;
    } else {
        writeln!(out, "digraph charly {{")?;
        writeln!(out, "  rankdir=LR;")?;
        for i in &order {
            let n = &g.g[*i];
            let style = if states[i] == "cached" {
                "solid"
            } else {
                "dashed"
            };
            writeln!(
                out,
                "  \"{}\" [label=\"{}\\n{}\", shape={}, style={style}];",
                n.id,
                n.id,
                n.key.short(12),
                shape(n.kind)
            )?;
        }
        for i in &order {
            for d in g.deps(*i) {
                writeln!(out, "  \"{}\" -> \"{}\";", g.g[d].id, g.g[*i].id)?;
            }
        }
        writeln!(out, "}}")?;
    }
    Ok(printed)
}

fn shape(k: charly_engine::key::NodeKind) -> &'static str {
    use charly_engine::key::NodeKind as K;
    match k {
        K::Source => "note",
        K::Fragment => "box",
        K::Containerfile => "folder",
        K::BuilderStage | K::LocalPkg | K::Rootfs => "component",
        K::Image => "box3d",
        K::Layer => "cds",
        K::Base => "cylinder",
        K::Plan => "tab",
    }
}

/// `explain`.
pub fn explain(cli: &Cli, a: &ExplainArgs) -> anyhow::Result<ExitCode> {
    let mut o = project::open(cli)?;
    let names = select(&o, &[], true, Unresolved::Ignore)?;
    let store = open_store(cli)?;
    crate::plugins::prepare_build(&mut o, store.dir(), &names)?;
    let hasher = stat_cache(&store);
    let engine = engine(
        &o,
        &store,
        Using::Named(&a.runner),
        &hasher,
        a.dev_local_pkg.on,
        None,
    );
    // One graph with every node: build directories and images of all boxes.
    let g = engine.graph_goals(&[(Goal::Generate, names.clone()), (Goal::Build, names)])?;
    let e = engine.explain(&g, &a.node)?;
    let _ = hasher.save();
    if a.json {
        output::json(&e)?;
    } else {
        let mut out = std::io::stdout().lock();
        for l in e.lines() {
            writeln!(out, "{l}")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
