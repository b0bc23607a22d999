//! charly-cli: the `charly` command line (a library so that its tests can
//! build the binary with the `testing` feature; `src/main.rs` only calls
//! [`main`]).
//!
//! Thin by design: it parses arguments (clap), calls into `charly-engine` /
//! `charly-rules`, and prints. stdout carries data only (lists, JSON,
//! Containerfiles); everything meant for people goes to stderr. Exit codes:
//! 0 success, 1 a user or configuration error, 2 a usage error, 3 drift
//! (`bundle status`), 101 an internal error (a bug). The crates below it:
//! `docs/architecture.md`.
//!
//! Commands: `box_cmd` (`box list|plan|generate|build|push`), `engine_cmd`
//! (what runs or inspects the graph: generate, build, graph, explain),
//! `candy_cmd`, `check_cmd` (check beds), `bundle_cmd` (deploys),
//! `cache_cmd` (the store and remotes), `validate_cmd`, `init_cmd` (`init`
//! and `candy new`), `migrate_cmd`.
//!
//! Around them: `project` opens the project (and refuses what cannot be
//! used), `session` the store, runner and remotes of a run, `settings` the
//! settings files' flag defaults, `plugins` the plugins one command needs,
//! `journaled` the no-op journal of print-only commands, `progress`
//! progress on stderr, `report` summary lines and reports, `output`
//! printing for people and programs.

mod box_cmd;
mod bundle_cmd;
mod cache_cmd;
mod candy_cmd;
mod check_cmd;
mod engine_cmd;
mod init_cmd;
mod journaled;
mod migrate_cmd;
mod output;
mod plugins;
mod progress;
mod project;
mod report;
mod session;
mod settings;
mod validate_cmd;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// The shared cache, explained once (in `charly --help`).
const REMOTE_HELP: &str = "\
Shared cache (--remote URL, or CHARLY_REMOTE): consulted after the local store and fed with
new results. An OCI registry repository: oci://HOST[:PORT]/REPO (HTTPS; plain HTTP for
127.0.0.1/localhost), or http://…/https://…; credentials from CHARLY_REMOTE_TOKEN (a bearer
token), or CHARLY_REMOTE_USER with CHARLY_REMOTE_PASSWORD (basic auth, also exchanged for a
token by GHCR/GitLab/Harbor-style registries); none means anonymous. Or the CAS and
ActionCache of a Remote Execution API v2 engine (Buildbarn, BuildBuddy, NativeLink,
buildbox-casd): grpc://HOST:PORT[/INSTANCE], grpcs://… for TLS, bearer token from
CHARLY_REMOTE_TOKEN or the file named by CHARLY_REMOTE_TOKEN_FILE. Remote failures are
reported, never fatal, unless --remote-required.

Defaults for --dev-local-pkg, --ca-bundle, -j, --remote and --progress can be set in
.charly/settings.yml (the project) and ~/.config/charly/settings.yml (you); see
docs/format.md.";

/// charly builds container boxes from YAML candies, with a content-addressed
/// build graph: only what changed is rebuilt, and it can say why.
#[derive(Parser, Debug)]
#[command(
    name = "charly",
    version,
    about,
    long_about = None,
    propagate_version = true,
    after_long_help = REMOTE_HELP
)]
pub struct Cli {
    /// Project directory (default: the nearest directory upwards with a charly.yml).
    #[arg(
        short = 'C',
        long = "dir",
        global = true,
        env = "CHARLY_PROJECT_DIR",
        value_name = "DIR"
    )]
    pub dir: Option<PathBuf>,

    /// The store (default: $CHARLY_CACHE_DIR, else $XDG_CACHE_HOME/charly).
    #[arg(
        long = "cache-dir",
        global = true,
        env = "CHARLY_CACHE_DIR",
        value_name = "DIR"
    )]
    pub cache_dir: Option<PathBuf>,

    /// Where an import lives offline: `--import cachyos=image/cachyos`, or a repo
    /// identity: `--import github.com/org/repo=../repo` (also spelled
    /// `--import-repo`; a box repository's `@github.com/org/repo/candy/x:tag`
    /// references then resolve to DIR's candies). Repeatable.
    #[arg(long = "import", visible_alias = "import-repo", global = true, value_name = "NS=DIR", value_parser = parse_import)]
    pub imports: Vec<(String, PathBuf)>,

    /// A shared cache: `oci://HOST[:PORT]/REPO` (an OCI registry) or
    /// `grpc[s]://HOST:PORT[/INSTANCE]` (a REAPI engine); see `charly --help`.
    #[arg(
        long = "remote",
        global = true,
        env = "CHARLY_REMOTE",
        value_name = "URL",
        help_heading = "Shared cache"
    )]
    pub remote: Option<String>,

    /// Read from the remote cache, never write to it (for untrusted jobs,
    /// e.g. pull requests).
    #[arg(
        long = "remote-read-only",
        global = true,
        env = "CHARLY_REMOTE_READ_ONLY",
        help_heading = "Shared cache"
    )]
    pub remote_read_only: bool,

    /// Fail when the remote cache cannot be reached or an upload fails
    /// (corrupt remote data is still only a miss, and is rebuilt).
    #[arg(
        long = "remote-required",
        global = true,
        env = "CHARLY_REMOTE_REQUIRED",
        help_heading = "Shared cache"
    )]
    pub remote_required: bool,

    /// Fields charly does not know are warnings (ignored) instead of errors:
    /// for a project written for a newer charly. `=false` turns off a
    /// settings default (`allow_unknown_fields: true` in
    /// .charly/settings.yml).
    #[arg(
        id = "allow_unknown_fields",
        long = "allow-unknown-fields",
        global = true,
        env = "CHARLY_ALLOW_UNKNOWN_FIELDS",
        value_name = "BOOL",
        num_args = 0..=1,
        require_equals = true,
        default_value = "false",
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub allow_unknown_fields: bool,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Top-level commands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create a new project, ready to build: a root charly.yml, a Debian base
    /// box made with debootstrap, a box `app` and a candy `hello`.
    Init(init_cmd::InitArgs),
    /// Check the whole project: every file, candy, box and template. Exit 1 on errors.
    Validate(validate_cmd::Args),
    /// Boxes: list, plan, generate, build.
    #[command(subcommand, name = "box")]
    Box(box_cmd::BoxCommand),
    /// Candies: list, new.
    #[command(subcommand)]
    Candy(candy_cmd::CandyCommand),
    /// Print the build graph (nodes with kind, key prefix, cache state).
    Graph(engine_cmd::GraphArgs),
    /// Say why a node would rebuild (the exact inputs that changed), or that it is cached.
    Explain(engine_cmd::ExplainArgs),
    /// Build disposable beds of boxes and run their candies' and their own
    /// `eval:` checks (build-scope); exit 1 when any fails.
    ///
    /// Each box is built as `box build --dev-local-pkg` would (local packages
    /// always from local source; a missing source is an error), reusing every
    /// stored builder artifact and image. A container is started from the
    /// image as the box user, with the box's init when it has services, and
    /// the checks run in candy order, then the box's own: `file`, `command`,
    /// `package`, `service`, `addr`. Deploy-scope checks and subjects that
    /// need a deployment (`http`, `mcp`, `k8s`, …) are listed as skipped with
    /// the reason. Checks are not build inputs: editing one never rebuilds an
    /// image. A bed whose image and checks are unchanged since an all-pass
    /// run is reported as cached without a container (`--force` reruns).
    Check(check_cmd::CheckArgs),
    /// Deploy a box's candies to a target from the store, and undo it:
    /// add, del, status (drift), list.
    #[command(subcommand)]
    Bundle(bundle_cmd::BundleCommand),
    /// The local store: stats, gc, verify; push to and pull from the remote cache.
    #[command(subcommand)]
    Cache(cache_cmd::CacheCommand),
    /// Convert a classic (2026.160) project to the node form (`--to 2026.174`):
    /// into a new sibling directory `DIR-2026.174` (or `--out`), or in place
    /// with `--write`. What the node form cannot express is a warning at its
    /// file:line:col.
    Migrate(migrate_cmd::MigrateArgs),
}

fn parse_import(s: &str) -> Result<(String, PathBuf), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("expected NS=DIR, got `{s}`"))?;
    if k.is_empty() || v.is_empty() {
        return Err(format!("expected NS=DIR, got `{s}`"));
    }
    Ok((k.to_string(), PathBuf::from(v)))
}

/// An error that has already been reported to the user; exit with code 1.
#[derive(Debug)]
pub struct Reported;

impl std::fmt::Display for Reported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("errors were reported")
    }
}

impl std::error::Error for Reported {}

/// Whether an error is a write to a closed pipe.
fn broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .map(std::io::Error::kind)
            .or_else(|| {
                c.downcast_ref::<serde_json::Error>()
                    .and_then(serde_json::Error::io_error_kind)
            })
            == Some(std::io::ErrorKind::BrokenPipe)
    })
}

/// Parses the command line with the settings files' defaults
/// ([`settings`]): the project is the one `-C` names or the one around the
/// current directory.
fn parse() -> anyhow::Result<Cli> {
    use clap::{CommandFactory, FromArgMatches};
    let root = match Cli::try_parse() {
        Ok(pre) => project::root(&pre).ok(),
        Err(_) => std::env::current_dir()
            .ok()
            .and_then(|d| charly_rules::load::locate(&d).ok()),
    };
    let defaults = settings::defaults(root.as_deref())?;
    let matches = settings::apply(Cli::command(), &defaults).get_matches();
    Ok(Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit()))
}

/// Parses the command line, runs the command, and says how to exit.
pub fn main() -> ExitCode {
    output::install_hooks();
    let cli = match parse() {
        Ok(c) => c,
        Err(e) => {
            output::error(&format!("{e:#}"));
            return ExitCode::from(1);
        }
    };
    let total = charly_engine::timings::phase("command (all of it)");
    let result = match &cli.command {
        Command::Init(a) => init_cmd::init(a),
        Command::Validate(a) => validate_cmd::run(&cli, a),
        Command::Box(c) => box_cmd::run(&cli, c),
        Command::Candy(c) => candy_cmd::run(&cli, c),
        Command::Graph(a) => engine_cmd::graph(&cli, a),
        Command::Explain(a) => engine_cmd::explain(&cli, a),
        Command::Cache(c) => cache_cmd::run(&cli, c),
        Command::Bundle(c) => bundle_cmd::run(&cli, c),
        Command::Check(a) => check_cmd::run(&cli, a),
        Command::Migrate(a) => migrate_cmd::run(a),
    };
    drop(total);
    if let Some(t) = charly_engine::timings::report() {
        eprint!("{t}");
    }
    match result {
        Ok(code) => code,
        Err(e) if e.is::<Reported>() => ExitCode::from(1),
        // `charly graph | head`: the reader left; nothing is wrong.
        Err(e) if broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            output::error(&format!("{e:#}"));
            ExitCode::from(1)
        }
    }
}
