//! What a command needs to start a run: the store, the remote cache, the
//! runner (podman, or a Remote Execution API engine over it), jobs, the
//! stat-cache hasher and the [`engine`] over an opened project.
//!
//! Depends on no command module: commands call in, never the other way.

use crate::{Cli, output, project};
use anyhow::Context;
use charly_cache::RemoteCache;
use charly_cache::{Remote, RemoteConfig, Store};
use charly_engine::api::Engine;
use charly_engine::graph::GraphOptions;
use charly_engine::hash::FileHasher;
use charly_engine::reapi::GrpcCache;
use charly_engine::runners::Runner;
use charly_engine::runners::podman::{PodmanOptions, PodmanRunner};
use charly_engine::runners::remote::{RemoteOptions, RemoteRunner};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Options shared by commands that run the graph.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// Nodes to run at once (default: the number of cores; at most 256).
    #[arg(short = 'j', long = "jobs", value_name = "N", env = "CHARLY_JOBS")]
    pub jobs: Option<usize>,
    /// Write a JSON summary (every node with kind, key, state, duration; totals) to FILE.
    #[arg(long, value_name = "FILE")]
    pub summary_json: Option<PathBuf>,
    /// Write a Chrome trace (open in Perfetto or chrome://tracing) to FILE.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Print nothing but errors (no progress, no summary line).
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// How progress is shown on stderr: `tty` (spinners with each running
    /// node's last log lines, a bar weighted by expected work), `plain`
    /// (a line per node start and end: CI logs), `quiet`, or `auto` (`tty`
    /// on a terminal, else `plain`).
    #[arg(
        long,
        value_name = "MODE",
        value_enum,
        default_value_t,
        env = "CHARLY_PROGRESS"
    )]
    pub progress: crate::progress::ProgressMode,
    /// With `--all`: go on with the boxes that resolve when others do not
    /// (each dropped box is still named, with its first error). Without it,
    /// an enabled box that does not resolve stops the run with exit 1.
    #[arg(long, short = 'k')]
    pub keep_going: bool,
}

impl RunArgs {
    /// The progress display for running `graph` (`silent`: none, e.g. when
    /// stdout carries the result or nothing runs).
    pub fn progress_for(
        &self,
        graph: &charly_engine::graph::Graph,
        store: &Store,
        silent: bool,
        explain: bool,
    ) -> crate::progress::Progress {
        crate::progress::Progress::new(
            graph,
            store,
            self.progress.resolve(self.quiet || silent),
            // Reasons of every node: for the summary's JSON and for
            // explanations after the run.
            self.summary_json.is_some() || explain,
        )
    }
}

/// Which graph a command that plans without building shows or pulls:
/// `graph`, `cache pull`.
#[derive(clap::Args, Debug, Clone)]
pub struct PlannedGraph {
    /// The `box generate` graph (build directories) instead of `box
    /// build`'s (images).
    #[arg(long)]
    pub generate: bool,
    /// Runner whose image keys to use (keys of built nodes include it).
    #[arg(long, default_value = "podman", value_parser = clap::builder::PossibleValuesParser::new(RUNNERS))]
    pub runner: String,
    #[command(flatten)]
    pub dev_local_pkg: DevLocalPkg,
}

/// `--dev-local-pkg[=BOOL]`, for every command whose graph it changes.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct DevLocalPkg {
    /// Local packages from local source: built from the candy's directory
    /// and COPYed in (a missing source is an error), instead of the
    /// format's release download. `=false` turns off a settings default
    /// (docs/format.md, "Settings").
    #[arg(
        id = "dev_local_pkg",
        long = "dev-local-pkg",
        env = "CHARLY_DEV_LOCAL_PKG",
        value_name = "BOOL",
        num_args = 0..=1,
        require_equals = true,
        default_value = "false",
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub on: bool,
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
    /// mounted read-only over the system bundle of every build step, except
    /// in builds that install `ca-certificates` themselves (dpkg could not
    /// replace a mounted file). With --remote-exec it travels in the input
    /// root of actions that carry their image's files
    /// (--remote-stage-rootfs) or run with the engine's own tools.
    #[arg(long, value_name = "FILE", env = "CHARLY_CA_BUNDLE")]
    pub ca_bundle: Option<PathBuf>,
    /// Never pull: an external base image (`base: docker.io/…`) that podman
    /// does not have is an error. Without it, such an image is pulled once,
    /// when its base node first runs.
    #[arg(long, env = "CHARLY_OFFLINE")]
    pub offline: bool,
    #[command(flatten)]
    pub remote_exec: RemoteExecArgs,
}

/// Options of remote execution.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct RemoteExecArgs {
    /// Run command nodes (builder stages and local-package builds) on a
    /// Remote Execution API v2 engine (Buildbarn, BuildBuddy, NativeLink,
    /// EngFlow, BuildGrid, buildbox-casd): `grpc://HOST:PORT[/INSTANCE]`, or
    /// `grpcs://…` for TLS. A bearer token is sent from $CHARLY_REMOTE_TOKEN
    /// or the file named by $CHARLY_REMOTE_TOKEN_FILE. Results are verified
    /// digest by digest, then stored locally like local results. Image
    /// builds and rootfs bootstraps stay local; builder stages run in their
    /// builder image (the `container-image` property, or
    /// --remote-stage-rootfs) and stay local with --remote-no-image-property
    /// alone.
    #[arg(long, value_name = "URL", env = "CHARLY_REMOTE_EXEC")]
    pub remote_exec: Option<String>,
    /// At most N actions on the engine at once.
    #[arg(long, value_name = "N", default_value_t = 8, requires = "remote_exec")]
    pub remote_jobs: usize,
    /// Run a node locally when the engine is unreachable or refuses it
    /// (never when its command fails remotely).
    #[arg(long, requires = "remote_exec")]
    pub remote_fallback: bool,
    /// Do not send the `container-image=docker://<build image>` platform
    /// property (for engines that run commands with their own tools instead
    /// of pulling the image, e.g. buildbox-run with bubblewrap and no registry).
    #[arg(long, requires = "remote_exec")]
    pub remote_no_image_property: bool,
    /// Send builder stages and local-package builds with their image's
    /// root filesystem as the action's input root instead of naming the
    /// image: for engines that only sandbox commands (buildbox-run with
    /// bubblewrap) and must not bind host directories over it. The image's
    /// files are uploaded once per engine.
    #[arg(long, requires = "remote_exec")]
    pub remote_stage_rootfs: bool,
    /// Build box layers on the engine too: each runs in its parent's root
    /// filesystem, applied from the parent's stored layers (no parent image
    /// needed here), and comes back as exactly what it changed, with the
    /// owners its steps gave (fakeroot in glibc images, `COPY --chown`,
    /// `ADD`, a `RUN` as another user). A layer the engine cannot carry
    /// (`VOLUME`, `STOPSIGNAL`, `HEALTHCHECK`, `ADD` of a URL) is refused
    /// naming why; `--remote-fallback` builds it locally instead.
    #[arg(long, requires = "remote_exec")]
    pub remote_layers: bool,
    /// An extra platform property of every action, `KEY=VALUE`
    /// (repeatable): what the engine needs to run them, e.g. `network=on`
    /// for buildbox-run or `dockerNetwork=bridge` for BuildBuddy. Part of
    /// each action's digest.
    #[arg(long, value_name = "KEY=VALUE", value_parser = parse_property, requires = "remote_exec")]
    pub remote_platform: Vec<(String, String)>,
    /// Timeout of one remote action, in seconds.
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 3600,
        requires = "remote_exec"
    )]
    pub remote_timeout: u64,
}

fn parse_property(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("`{s}` is not KEY=VALUE")),
    }
}

/// The runner: remote over `local` when `--remote-exec` is given. With
/// `--remote-fallback`, an unreachable engine means a local run with a note.
pub fn remote_exec_runner<'a>(
    a: &RemoteExecArgs,
    ca_bundle: Option<&Path>,
    local: &'a dyn Runner,
    arch: &str,
) -> anyhow::Result<Option<RemoteRunner<'a>>> {
    let Some(url) = &a.remote_exec else {
        return Ok(None);
    };
    if a.remote_jobs == 0 {
        anyhow::bail!("--remote-jobs must be at least 1");
    }
    let opts = RemoteOptions {
        jobs: a.remote_jobs,
        fallback: a.remote_fallback,
        image_property: !a.remote_no_image_property,
        stage_rootfs: a.remote_stage_rootfs,
        platform: a.remote_platform.iter().cloned().collect(),
        isa: charly_engine::runners::remote::isa_of(arch).to_string(),
        timeout: Some(Duration::from_secs(a.remote_timeout.max(1))),
        ca_bundle: ca_bundle.map(Path::to_path_buf),
        layers: a.remote_layers,
    };
    match RemoteRunner::connect(url, local, opts) {
        Ok(r) => Ok(Some(r)),
        Err(e) if a.remote_fallback => {
            output::note(&format!(
                "{}; running every node locally (--remote-fallback)",
                e.message
            ));
            Ok(None)
        }
        Err(e) => Err(anyhow::anyhow!(e.message)).context("--remote-exec"),
    }
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
        offline: a.offline,
    })?)
}

/// The file hasher with the store's stat cache.
pub fn stat_cache(store: &Store) -> FileHasher {
    // Its JSON predecessor, left by charly before the binary cache.
    let _ = std::fs::remove_file(store.dir().join("statcache.json"));
    FileHasher::with_cache_file(store.dir().join("statcache.bin"))
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
            plugins: o.plugin_build.clone(),
            dev_local_pkg,
            runner: name,
            arch: host_arch(),
        },
        remote,
        own_inputs: o.own_inputs.clone(),
    }
}

/// The graph of `names` keyed as `runner` would build it, run nothing
/// (`graph`, `cache pull`): the build goal, or the generate goal.
pub(crate) fn planned_graph(
    o: &project::Opened,
    store: &Store,
    which: &PlannedGraph,
    names: &[String],
) -> anyhow::Result<charly_engine::graph::Graph> {
    let hasher = stat_cache(store);
    let using = Using::Named(&which.runner);
    let engine = engine(o, store, using, &hasher, which.dev_local_pkg.on, None);
    let goal = if which.generate {
        charly_engine::graph::Goal::Generate
    } else {
        charly_engine::graph::Goal::Build
    };
    let g = engine.graph(&goal, names)?;
    let _ = hasher.save();
    Ok(g)
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

/// Nodes to run at once: `-j`, else the number of cores; at most
/// [`MAX_JOBS`](charly_engine::sched::MAX_JOBS) (said once when more is asked).
pub fn jobs(a: &RunArgs) -> usize {
    let max = charly_engine::sched::MAX_JOBS;
    let asked = a
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
    if asked > max {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            crate::output::note(&format!("-j {asked}: running at most {max} nodes at once"))
        });
    }
    asked.clamp(1, max)
}

/// The host architecture as OCI names it.
pub fn host_arch() -> String {
    match std::env::consts::ARCH {
        "x86_64" => "amd64".into(),
        "aarch64" => "arm64".into(),
        other => other.into(),
    }
}
