//! The no-op journal of the commands that only print (`box plan`, `box
//! list`, `candy list`, `graph`, `validate`): which journal a command line
//! has, and printing its answer ([`charly_engine::pure`] decides whether to
//! replay).

use crate::{Cli, output, project};
use charly_cache::Store;
use charly_engine::journal::{Journal, Scope};
use charly_engine::pure::{Answer, Printed, Replay};
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

/// `--no-journal` and `--explain` of a printing command.
#[derive(clap::Args, Debug, Clone, Copy, Default)]
pub struct JournalArgs {
    /// Always load the project. By default a run whose inputs (every file
    /// and directory of the project, by stat), store and charly binary are
    /// unchanged since the last identical run prints that run's output again
    /// without loading anything (the no-op journal, kept in the store).
    #[arg(long, env = "CHARLY_NO_JOURNAL")]
    pub no_journal: bool,
    /// Say on stderr whether the output was replayed from the journal, or
    /// why not (the first input that changed, a new binary, a store change, …).
    #[arg(long)]
    pub explain: bool,
}

/// The journal of `command` (the arguments that change its output) over
/// the project at `root`: none without a store directory. Every entry also
/// names the binary's version, the project root as given and resolved, the
/// working directory and the imports.
pub fn journal_for(cli: &Cli, root: &Path, command: serde_json::Value) -> Option<(Journal, Scope)> {
    let store_dir = cli.cache_dir.clone().or_else(Store::default_dir)?;
    let imports: Vec<std::path::PathBuf> = cli.imports.iter().map(|(_, d)| d.clone()).collect();
    let scope = Scope::project(root, &imports, &store_dir);
    // Test builds: the fake runner's and test hooks' settings change what
    // a run does.
    #[cfg(feature = "testing")]
    let hooks: std::collections::BTreeMap<String, String> = std::env::vars()
        .filter(|(k, _)| k.starts_with("CHARLY_FAKE_") || k.starts_with("CHARLY_TEST_"))
        .collect();
    #[cfg(not(feature = "testing"))]
    let hooks = ();
    let key = serde_json::json!({
        "command": command,
        "hooks": hooks,
        "version": env!("CARGO_PKG_VERSION"),
        "root": scope.roots[0],
        "dir": cli.dir,
        "cwd": std::env::current_dir().ok(),
        "imports": cli.imports,
    })
    .to_string();
    Some((open_journal(&store_dir, &key), scope))
}

/// The note `--explain` prints about the journal.
pub fn explain_line(replay: &Replay, off: &str) -> String {
    match replay {
        Replay::Replayed => {
            "journal: replayed from the journal (nothing changed since the last run)".into()
        }
        Replay::Missed(m) => format!("journal: not replayed: {m}"),
        Replay::Off => format!("journal: not used ({off})"),
    }
}

/// Runs a printing command through the journal: its output replayed when
/// nothing it depends on changed, else `full` run (and recorded). `command`
/// is every argument that changes the output.
pub fn print(
    cli: &Cli,
    j: JournalArgs,
    command: serde_json::Value,
    full: impl FnOnce(&Scope) -> anyhow::Result<Printed>,
) -> anyhow::Result<ExitCode> {
    let root = project::root(cli)?;
    let journal = if j.no_journal {
        None
    } else {
        journal_for(cli, &root, command)
    };
    print_with(journal.as_ref(), j, None, full)
}

/// [`print`] with the journal given: none when `off` says why not (or
/// there is no store directory).
pub fn print_with(
    journal: Option<&(Journal, Scope)>,
    j: JournalArgs,
    off: Option<&str>,
    full: impl FnOnce(&Scope) -> anyhow::Result<Printed>,
) -> anyhow::Result<ExitCode> {
    let Answer {
        stdout,
        notes,
        replay,
        failed,
    } = charly_engine::pure::run(journal.map(|(j, s)| (j, s)), full)?;
    if j.explain {
        let off = match off {
            Some(o) => o,
            None if j.no_journal => "--no-journal",
            None => "no store directory",
        };
        output::note(&explain_line(&replay, off));
    }
    let mut out = std::io::stdout().lock();
    out.write_all(&stdout)?;
    out.flush()?;
    for n in &notes {
        output::note(n);
    }
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// The journal of `key` in the store at `store_dir`.
pub(crate) fn open_journal(store_dir: &std::path::Path, key: &str) -> Journal {
    let mut journal = Journal::new(store_dir, key);
    if let Some(ns) = project::racy_ns_for_tests() {
        journal.racy_ns = ns;
    }
    journal
}
