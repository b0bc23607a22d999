//! Commands that run the build graph: `box generate`, `box build`, `graph`,
//! `explain`.

use crate::{Cli, output, project};
use anyhow::Context;
use charly_cache::RemoteCache;
use charly_cache::{Remote, RemoteConfig, Store};
use charly_engine::api::Engine;
use charly_engine::graph::{Goal, GraphOptions};
use charly_engine::hash::FileHasher;
use charly_engine::id::NodeId;
use charly_engine::journal::{Journal, Scope};
use charly_engine::outputs;
use charly_engine::reapi::GrpcCache;
use charly_engine::runners::Runner;
use charly_engine::runners::podman::{PodmanOptions, PodmanRunner};
use charly_engine::sched::{State, Summary};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// Options shared by commands that run the graph.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// Nodes to run at once (default: the number of cores).
    #[arg(short = 'j', long = "jobs", value_name = "N")]
    pub jobs: Option<usize>,
    /// Write a JSON summary (every node with kind, key, state, duration; totals) to FILE.
    #[arg(long, value_name = "FILE")]
    pub summary_json: Option<PathBuf>,
    /// Write a Chrome trace (open in Perfetto or chrome://tracing) to FILE.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// No progress bars.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// With `--all`: go on with the boxes that resolve when others do not
    /// (each dropped box is still named, with its first error). Without it,
    /// an enabled box that does not resolve stops the run with exit 1.
    #[arg(long, short = 'k')]
    pub keep_going: bool,
}

/// Options for builders (podman).
#[derive(clap::Args, Debug, Clone)]
pub struct RunnerArgs {
    /// What runs command nodes: `podman` (test builds also have `fake`, which records calls and builds nothing).
    #[arg(long, value_name = "RUNNER", default_value = "podman", value_parser = clap::builder::PossibleValuesParser::new(RUNNERS))]
    pub runner: String,
    /// Isolated podman storage under DIR (default: podman's own).
    #[arg(long, value_name = "DIR", env = "CHARLY_PODMAN_ROOT")]
    pub podman_root: Option<PathBuf>,
    /// A CA bundle builds trust for HTTPS (e.g. behind an intercepting proxy);
    /// mounted read-only into every build step.
    #[arg(long, value_name = "FILE", env = "CHARLY_CA_BUNDLE")]
    pub ca_bundle: Option<PathBuf>,
    #[command(flatten)]
    pub remote_exec: crate::remote_exec::RemoteExecArgs,
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
    /// After the run, explain every node that ran (what changed since its last build).
    #[arg(long)]
    pub explain: bool,
    /// Build local packages from local source (hard error when the source is missing).
    #[arg(long)]
    pub dev_local_pkg: bool,
    /// Also write the built images to an OCI image layout: `--output oci:DIR`
    /// (each box under the reference `<box>-<version>`).
    #[arg(long, value_name = "oci:DIR", value_parser = parse_output)]
    pub output: Option<PathBuf>,
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
    /// Graph for `generate` (build directories) instead of `build` (images).
    #[arg(long)]
    pub generate: bool,
    /// Runner whose image keys to show (keys of built nodes include it).
    #[arg(long, default_value = "podman", value_parser = clap::builder::PossibleValuesParser::new(RUNNERS))]
    pub runner: String,
}

/// Arguments of `explain`.
#[derive(clap::Args, Debug)]
pub struct ExplainArgs {
    /// Node id (`fragment:jupyter/direnv`, `image:fedora`) or a unique part of one.
    #[arg(value_name = "NODE")]
    pub node: String,
    /// Print the explanation as JSON.
    #[arg(long)]
    pub json: bool,
    /// Runner whose builds to explain (keys of built nodes include it).
    #[arg(long, default_value = "podman", value_parser = clap::builder::PossibleValuesParser::new(RUNNERS))]
    pub runner: String,
    /// Explain the `--dev-local-pkg` variant of the graph.
    #[arg(long)]
    pub dev_local_pkg: bool,
}

/// Opens the store (`--cache-dir`, `$CHARLY_CACHE_DIR`, or the XDG cache dir).
pub fn open_store(cli: &Cli) -> anyhow::Result<Store> {
    let dir = match &cli.cache_dir {
        Some(d) => d.clone(),
        None => Store::default_dir()
            .context("no cache directory: set --cache-dir or CHARLY_CACHE_DIR")?,
    };
    let store =
        Store::open(&dir).with_context(|| format!("opening the store at {}", dir.display()))?;
    // Damage found while opening (a damaged index moved aside) is said now.
    print_store_notes(&store);
    Ok(store)
}

fn print_store_notes(store: &Store) {
    for n in store.take_notes() {
        output::note(&format!("note: {n}"));
    }
}

/// Prints, once, what the store noted while a command used it (a blob that
/// failed verification and was quarantined, a damaged record dropped): on
/// drop, so on every return path. Declare it right after the store.
pub struct StoreNotes<'a>(pub &'a Store);

impl Drop for StoreNotes<'_> {
    fn drop(&mut self) {
        print_store_notes(self.0);
    }
}

/// The remote cache named by `--remote`/`CHARLY_REMOTE`, if any. With
/// `--remote-required` the registry is contacted once up front.
pub fn open_remote(cli: &Cli) -> anyhow::Result<Option<Remote>> {
    if let Some(url) = cli.remote.as_deref().filter(|u| is_grpc(u)) {
        anyhow::bail!(
            "{url}: `charly cache push|pull|stats` work with OCI registries; a grpc:// remote \
             serves `box build`, `box generate` and `check`"
        );
    }
    let Some(url) = cli.remote.as_deref().filter(|u| !u.is_empty()) else {
        if cli.remote_read_only || cli.remote_required {
            anyhow::bail!(
                "--remote-read-only and --remote-required need --remote (or CHARLY_REMOTE)"
            );
        }
        return Ok(None);
    };
    let mut cfg = RemoteConfig::new(url);
    cfg.read_only = cli.remote_read_only;
    cfg.required = cli.remote_required;
    let remote = Remote::open(cfg).with_context(|| format!("remote cache {url}"))?;
    if cli.remote_required {
        remote
            .check()
            .with_context(|| format!("remote cache {url} (--remote-required)"))?;
    }
    Ok(Some(remote))
}

fn is_grpc(url: &str) -> bool {
    url.starts_with("grpc://") || url.starts_with("grpcs://")
}

/// The shared cache of a run named by `--remote`/`CHARLY_REMOTE`: an OCI
/// registry (`oci://`, `http(s)://`) or a REAPI engine's CAS and
/// ActionCache (`grpc://`, `grpcs://`).
pub fn open_remote_cache(cli: &Cli) -> anyhow::Result<Option<Box<dyn RemoteCache>>> {
    if let Some(url) = cli.remote.as_deref().filter(|u| is_grpc(u)) {
        let c = GrpcCache::open(url, cli.remote_read_only, cli.remote_required)
            .map_err(|e| anyhow::anyhow!(e.message))
            .with_context(|| format!("remote cache {url}"))?;
        return Ok(Some(Box::new(c)));
    }
    Ok(open_remote(cli)?.map(|r| Box::new(r) as Box<dyn RemoteCache>))
}

/// [`report_remote`], except that `-q` silences it unless the remote had problems.
pub fn report_remote_unless_quiet(summary: &Summary, quiet: bool) {
    if !quiet
        || summary
            .remote
            .as_ref()
            .is_some_and(|r| !r.stats.errors.is_empty())
    {
        report_remote(summary);
    }
}

/// Prints what the remote did, and its problems, on stderr.
pub fn report_remote(summary: &Summary) {
    let Some(r) = &summary.remote else { return };
    output::note(&r.line());
    for e in &r.stats.errors {
        if r.required && r.has_failures() {
            output::error(&format!("remote: {e}"));
        } else {
            output::note(&format!("remote: {e}"));
        }
    }
}

/// The runner chosen on the command line.
pub fn make_runner(a: &RunnerArgs, store: &Store, jobs: usize) -> anyhow::Result<Box<dyn Runner>> {
    Ok(match a.runner.as_str() {
        #[cfg(feature = "testing")]
        "fake" => Box::new(charly_engine::runners::fake::FakeRunner::from_env()),
        _ => Box::new(podman_runner(a, store, jobs)?),
    })
}

/// The podman runner the flags describe, its config kept in the store.
pub fn podman_runner(a: &RunnerArgs, store: &Store, jobs: usize) -> anyhow::Result<PodmanRunner> {
    Ok(PodmanRunner::new(PodmanOptions {
        root: a.podman_root.clone(),
        conf_dir: store.dir().to_path_buf(),
        ca_bundle: a.ca_bundle.clone(),
        jobs,
    })?)
}

/// The file hasher with the store's stat cache.
pub fn stat_cache(store: &Store) -> FileHasher {
    FileHasher::with_cache_file(store.dir().join("statcache.json"))
}

/// The engine over an opened project.
pub(crate) fn engine<'a>(
    o: &'a project::Opened,
    store: &'a Store,
    runner: Using<'a>,
    hasher: &'a FileHasher,
    dev_local_pkg: bool,
    remote: Option<&'a dyn RemoteCache>,
) -> Engine<'a> {
    let (runner, name) = match runner {
        Using::Runner(r) => (Some(r), r.name().to_string()),
        Using::Named(n) => (None, n.to_string()),
    };
    Engine {
        project: &o.project,
        resolution: &o.resolution,
        store,
        runner,
        hasher,
        opts: GraphOptions {
            dev_local_pkg,
            runner: name,
            arch: host_arch(),
        },
        remote,
    }
}

/// What runs command nodes: a runner, or only a runner's name for commands
/// that plan, generate or explain (keys of built nodes carry the name).
#[derive(Clone, Copy)]
pub(crate) enum Using<'a> {
    /// Run with this runner.
    Runner(&'a dyn Runner),
    /// Run nothing; key as this runner would.
    Named(&'a str),
}

/// The runner names `--runner` takes (`fake` only in test builds).
pub(crate) const RUNNERS: &[&str] = &[
    "podman",
    #[cfg(feature = "testing")]
    "fake",
];

/// The runner `generate` keys with (it runs none, and none of its nodes'
/// keys name a runner).
const GENERATE_RUNNER: &str = "podman";

pub fn jobs(a: &RunArgs) -> usize {
    a.jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
        .max(1)
}

/// The host architecture as OCI names it.
pub fn host_arch() -> String {
    match std::env::consts::ARCH {
        "x86_64" => "amd64".into(),
        "aarch64" => "arm64".into(),
        other => other.into(),
    }
}

/// What to do with enabled boxes that do not resolve when `--all` selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unresolved {
    /// Name each with its first error and stop (exit 1).
    Fail,
    /// Name each with its first error and go on with the rest.
    Warn,
    /// Leave them out quietly (`explain`, which looks at one node).
    Ignore,
}

impl Unresolved {
    /// `Fail`, or `Warn` with `--keep-going`.
    pub fn unless(keep_going: bool) -> Self {
        if keep_going { Self::Warn } else { Self::Fail }
    }
}

/// Boxes named, or every enabled box with `--all`. A named box that does not
/// resolve is always an error. With `--all`, an enabled box that does not
/// resolve is never dropped silently: `policy` says whether it stops the run.
pub fn select(
    o: &project::Opened,
    names: &[String],
    all: bool,
    policy: Unresolved,
) -> anyhow::Result<Vec<String>> {
    select_warning(o, names, all, policy).map(|(names, _)| names)
}

/// [`select`], also returning the warnings it printed for boxes left out.
pub fn select_warning(
    o: &project::Opened,
    names: &[String],
    all: bool,
    policy: Unresolved,
) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    let mut warnings = Vec::new();
    if all || names.is_empty() {
        if !all && names.is_empty() {
            anyhow::bail!("name the boxes, or pass --all");
        }
        let mut chosen = Vec::new();
        let mut dropped = Vec::new();
        for (n, b) in &o.resolution.boxes {
            match b {
                Ok(b) if b.enabled => chosen.push(n.clone()),
                Ok(_) => {}
                Err(errs) => {
                    if crate::box_cmd::find_def(&o.project, n)
                        .is_some_and(|d| d.enabled == Some(false))
                    {
                        continue;
                    }
                    dropped.push((n, errs));
                }
            }
        }
        if policy != Unresolved::Ignore {
            for (n, errs) in &dropped {
                let first = errs
                    .iter()
                    .find(|d| d.is_error())
                    .or(errs.first())
                    .map(|d| d.one_line(&o.project.sources))
                    .unwrap_or_else(|| "no reason recorded".into());
                let line = format!("box `{n}` does not resolve: {first}");
                match policy {
                    Unresolved::Fail => output::error(&line),
                    _ => {
                        let w = format!("warning: {line} (left out)");
                        output::note(&w);
                        warnings.push(w);
                    }
                }
            }
            if policy == Unresolved::Fail && !dropped.is_empty() {
                anyhow::bail!(
                    "{} of {} enabled boxes do not resolve (`charly box list` says why; \
                     --keep-going builds the rest)",
                    dropped.len(),
                    dropped.len() + chosen.len()
                );
            }
        }
        if chosen.is_empty() {
            output::note("no boxes: the project defines no enabled box that resolves");
        }
        return Ok((chosen, warnings));
    }
    for n in names {
        crate::box_cmd::resolved(o, n)?;
    }
    Ok((names.to_vec(), warnings))
}

fn write_reports(run: &RunArgs, summary: &Summary) -> anyhow::Result<()> {
    if let Some(p) = &run.summary_json {
        std::fs::write(p, serde_json::to_vec_pretty(summary)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &run.trace {
        std::fs::write(p, serde_json::to_vec(&summary.chrome_trace())?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

fn report_failures(summary: &Summary) {
    for n in &summary.nodes {
        if n.state == State::Failed {
            output::error(&format!(
                "{} failed: {}",
                n.id,
                n.error.as_deref().unwrap_or("")
            ));
        }
    }
    let not: Vec<&str> = summary
        .nodes
        .iter()
        .filter(|n| n.state == State::NotAttempted)
        .map(|n| n.id.as_str())
        .collect();
    if !not.is_empty() {
        output::error(&format!(
            "not attempted ({}): {}",
            not.len(),
            not.join(", ")
        ));
    }
}

fn summary_line(verb: &str, s: &Summary) -> String {
    let t = &s.totals;
    let mut line = format!(
        "{verb}: {} nodes, {} ran, {} cached",
        t.nodes, t.ran, t.cached
    );
    if s.remote.is_some() {
        line.push_str(&format!(", {} pulled", t.pulled));
    }
    line.push_str(&format!(", {} failed", t.failed));
    if t.not_attempted > 0 {
        line.push_str(&format!(", {} not attempted", t.not_attempted));
    }
    if t.would_run > 0 {
        line.push_str(&format!(", {} would run", t.would_run));
    }
    line.push_str(&format!(" in {} ms", t.wall_ms));
    line
}

/// The no-op journal of this `box generate`, when one applies: the
/// default output directory, no `--stdout`, no remote cache (whose
/// traffic a replay would skip), a known store, no `--no-journal`.
fn generate_journal(
    cli: &Cli,
    a: &crate::box_cmd::GenerateArgs,
    root: &Path,
) -> Option<(Journal, Scope)> {
    if a.no_journal
        || a.out.is_some()
        || a.stdout
        || cli.remote.as_deref().is_some_and(|r| !r.is_empty())
    {
        return None;
    }
    let store_dir = cli.cache_dir.clone().or_else(Store::default_dir)?;
    let imports: Vec<PathBuf> = cli.imports.iter().map(|(_, d)| d.clone()).collect();
    let scope = Scope::project(root, &imports, &store_dir);
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
        "dev_local_pkg": a.dev_local_pkg,
    })
    .to_string();
    #[cfg_attr(not(feature = "testing"), allow(unused_mut))]
    let mut journal = Journal::new(&store_dir, &command);
    // Test hook (test builds only): how recent an input may be and still be
    // trusted by stat (tests shrink it instead of waiting out the clock).
    #[cfg(feature = "testing")]
    if let Some(ms) = std::env::var("CHARLY_JOURNAL_RACY_MS")
        .ok()
        .and_then(|v| v.parse::<i64>().ok())
    {
        journal.racy_ns = ms.saturating_mul(1_000_000);
    }
    Some((journal, scope))
}

/// Prints what a replayed `box generate` printed the first time.
fn replay_generate(
    a: &crate::box_cmd::GenerateArgs,
    outcome: &charly_engine::journal::Outcome,
    started: Instant,
) -> anyhow::Result<ExitCode> {
    let summary = Summary::replayed(outcome, started.elapsed().as_millis() as u64);
    write_reports(&a.run, &summary)?;
    for w in &outcome.warnings {
        output::note(w);
    }
    let mut stdout = std::io::stdout().lock();
    for line in &outcome.stdout {
        writeln!(stdout, "{line}")?;
    }
    if !a.run.quiet {
        output::note(&format!(
            "{} (nothing changed since the last run)",
            summary_line("generate", &summary)
        ));
    }
    Ok(ExitCode::SUCCESS)
}

/// `box generate` on the engine.
pub fn generate(cli: &Cli, a: &crate::box_cmd::GenerateArgs) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    let root = project::root(cli)?;
    let journal = generate_journal(cli, a, &root);
    if let Some((j, _)) = &journal
        && let Ok(outcome) = j.check()
    {
        return replay_generate(a, &outcome, started);
    }
    let recorder = journal
        .as_ref()
        .map(|(j, scope)| j.begin(&scope.roots, &scope.files, &scope.skip));
    let o = project::open_at(cli, root)?;
    let (names, warnings) =
        select_warning(&o, &a.boxes, a.all, Unresolved::unless(a.run.keep_going))?;
    if a.stdout && names.len() != 1 {
        anyhow::bail!("--stdout prints one Containerfile; name exactly one box");
    }
    let store = open_store(cli)?;
    let _notes = StoreNotes(&store);
    let hasher = stat_cache(&store);
    let remote = open_remote_cache(cli)?;
    let engine = engine(
        &o,
        &store,
        Using::Named(GENERATE_RUNNER),
        &hasher,
        a.dev_local_pkg,
        remote.as_deref(),
    );
    let graph = engine.graph(&Goal::Generate, &names)?;
    let progress = crate::progress::Progress::new(graph.g.node_count(), a.run.quiet || a.stdout);
    let out_root = a.out.clone().unwrap_or_else(|| o.project.root.clone());
    let summary = engine.run(&graph, &out_root, jobs(&a.run), false, &progress);
    progress.finish();
    write_reports(&a.run, &summary)?;
    if !summary.ok() {
        report_failures(&summary);
        report_remote(&summary);
        return Ok(ExitCode::from(1));
    }
    let mut stdout = std::io::stdout().lock();
    if a.stdout {
        let i = graph
            .index(&NodeId::containerfile(&names[0], false))
            .context("no Containerfile node")?;
        // Read like any output: one that fails verification is rebuilt.
        let ctx = engine.ctx(&out_root);
        let bytes = charly_engine::exec::read_node(&ctx, &graph, i, |rec| {
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
        stdout.write_all(&bytes)?;
        return Ok(ExitCode::SUCCESS);
    }
    let written = engine.write_build_dirs(&graph, &out_root, a.out.is_some())?;
    let lines: Vec<String> = written.iter().map(|p| p.display().to_string()).collect();
    for line in &lines {
        writeln!(stdout, "{line}")?;
    }
    if !a.run.quiet {
        output::note(&summary_line("generate", &summary));
    }
    report_remote_unless_quiet(&summary, a.run.quiet);
    if let (Some((j, _)), Some(mut rec)) = (journal, recorder) {
        if !rec.covers_project(&o.project) {
            rec.spoil();
        }
        let (outputs, skip) = charly_engine::generate::journal_outputs(&out_root, &written);
        let mut outcome = summary.outcome(lines);
        outcome.warnings = warnings;
        if let Err(e) = j.record(rec, &outputs, &skip, outcome) {
            output::note(&format!("could not write the no-op journal: {e}"));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `box build`.
pub fn build(cli: &Cli, a: &BuildArgs) -> anyhow::Result<ExitCode> {
    let o = project::open(cli)?;
    let names = select(&o, &a.boxes, a.all, Unresolved::unless(a.run.keep_going))?;
    let store = open_store(cli)?;
    let _notes = StoreNotes(&store);
    let hasher = stat_cache(&store);
    let j = jobs(&a.run);
    let runner = make_runner(&a.runner, &store, j)?;
    let remote_exec =
        crate::remote_exec::wrap(&a.runner.remote_exec, runner.as_ref(), &host_arch())?;
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
        a.dev_local_pkg,
        remote.as_deref(),
    );
    let graph = engine.graph(&Goal::Build, &names)?;
    let progress = crate::progress::Progress::new(graph.g.node_count(), a.run.quiet || a.dry_run);
    let summary = engine.run(&graph, &o.project.root, j, a.dry_run, &progress);
    progress.finish();
    match &remote_exec {
        Some(r) => {
            let stats = r.stats();
            crate::remote_exec::write_reports(&a.run, &summary, &stats)?;
            if !a.run.quiet && !a.dry_run {
                output::note(&crate::remote_exec::line(&stats));
            }
        }
        None => write_reports(&a.run, &summary)?,
    }
    if a.dry_run {
        let mut out = std::io::stdout().lock();
        for n in &summary.nodes {
            let state = match n.state {
                State::Cached => "cached",
                _ => "would run",
            };
            writeln!(
                out,
                "{state:<10} {:<14} {}  {}",
                n.kind.as_str(),
                &n.key[..12],
                n.id
            )?;
        }
    }
    if a.explain && !a.dry_run {
        for n in summary
            .nodes
            .iter()
            .filter(|n| n.state == State::Ran && n.kind != charly_engine::key::NodeKind::Source)
        {
            let e = engine.explain(&graph, &n.id)?;
            for l in e.lines() {
                output::note(&l);
            }
        }
    }
    if !summary.ok() {
        report_failures(&summary);
        output::note(&summary_line("build", &summary));
        report_remote(&summary);
        return Ok(ExitCode::from(1));
    }
    if let Some(dir) = &a.output
        && !a.dry_run
    {
        export_oci(&o, &graph, &store, &names, dir)?;
    }
    if !a.run.quiet {
        output::note(&summary_line(
            if a.dry_run { "dry run" } else { "build" },
            &summary,
        ));
    }
    report_remote_unless_quiet(&summary, a.run.quiet);
    Ok(ExitCode::SUCCESS)
}

/// Writes each built box's image into the OCI layout at `dir`.
fn export_oci(
    o: &project::Opened,
    graph: &charly_engine::graph::Graph,
    store: &Store,
    names: &[String],
    dir: &std::path::Path,
) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    for name in names {
        let n = graph.get(&NodeId::image(name)).context("image node")?;
        let rec = store.get_record(&n.key)?.context("image record")?;
        let archive = rec.outputs.get(outputs::ARCHIVE).with_context(|| {
            format!("{name}: the runner stored no image archive (a test runner writes none)")
        })?;
        let tmp = tempfile::tempdir()?;
        let path = tmp.path().join("image.tar");
        store.copy_blob_to(&archive.digest, &path)?;
        let version = o
            .resolution
            .get(name)
            .map(|b| b.version.clone())
            .unwrap_or_default();
        let reference = format!("{name}-{version}");
        let e = charly_engine::oci::export_archive(&path, dir, &reference)?;
        writeln!(out, "oci:{}:{}", e.dir.display(), e.reference)?;
    }
    Ok(())
}

fn state_of(store: &Store, n: &charly_engine::graph::Node) -> &'static str {
    match store.get_record(&n.key) {
        Ok(Some(_)) => "cached",
        _ => "would-run",
    }
}

/// `graph`.
pub fn graph(cli: &Cli, a: &GraphArgs) -> anyhow::Result<ExitCode> {
    let o = project::open(cli)?;
    let names = select(&o, &a.boxes, a.boxes.is_empty(), Unresolved::Warn)?;
    let store = open_store(cli)?;
    let hasher = stat_cache(&store);
    let engine = engine(&o, &store, Using::Named(&a.runner), &hasher, false, None);
    let goal = if a.generate {
        Goal::Generate
    } else {
        Goal::Build
    };
    let g = engine.graph(&goal, &names)?;
    let _ = hasher.save();
    let mut out = std::io::stdout().lock();
    let order = g.topo()?;
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
                    "state": state_of(&store, n),
                    "deps": g.deps(*i).iter().map(|d| g.g[*d].id.clone()).collect::<Vec<_>>(),
                })
            })
            .collect();
        serde_json::to_writer_pretty(&mut out, &serde_json::json!({"nodes": nodes}))?;
        writeln!(out)?;
    } else {
        writeln!(out, "digraph charly {{")?;
        writeln!(out, "  rankdir=LR;")?;
        for i in &order {
            let n = &g.g[*i];
            let style = if state_of(&store, n) == "cached" {
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
    Ok(ExitCode::SUCCESS)
}

fn shape(k: charly_engine::key::NodeKind) -> &'static str {
    use charly_engine::key::NodeKind as K;
    match k {
        K::Source => "note",
        K::Fragment => "box",
        K::Containerfile => "folder",
        K::BuilderStage | K::LocalPkg | K::Rootfs => "component",
        K::Image => "box3d",
        K::Plan => "tab",
    }
}

/// `explain`.
pub fn explain(cli: &Cli, a: &ExplainArgs) -> anyhow::Result<ExitCode> {
    let o = project::open(cli)?;
    let names = select(&o, &[], true, Unresolved::Ignore)?;
    let store = open_store(cli)?;
    let hasher = stat_cache(&store);
    let engine = engine(
        &o,
        &store,
        Using::Named(&a.runner),
        &hasher,
        a.dev_local_pkg,
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
