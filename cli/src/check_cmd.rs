//! `charly check`: build disposable beds of boxes and run their `eval:` checks.

use crate::journaled::JournalArgs;
use crate::project::{self, Unresolved, select_warning};
use crate::report::{report_failed, report_remote_unless_quiet, write_junit, write_summary_json};
use crate::session::{
    RunArgs, RunnerArgs, StoreNotes, Using, engine, host_arch, jobs, open_remote_cache, open_store,
    podman_runner, remote_exec_runner, stat_cache,
};
use crate::{Cli, output};
use charly_engine::beds::BedOptions;
use charly_engine::check::{BedReport, Outcome, box_checks};
use charly_engine::graph::Goal;
use charly_engine::journal::Scope;
use charly_engine::pure::Printed;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `charly check`.
#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    /// Boxes to check.
    #[arg(value_name = "BOX")]
    pub boxes: Vec<String>,
    /// Check every enabled box that resolves.
    #[arg(long)]
    pub all: bool,
    /// Keep the bed containers (named `charly-bed-<box>-<key>`) for inspection.
    #[arg(long)]
    pub keep: bool,
    /// Rerun beds whose last result was all-pass and whose box and checks are unchanged.
    #[arg(long)]
    pub force: bool,
    /// Print the results as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Write JUnit XML to FILE.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    #[command(flatten)]
    pub run: RunArgs,
    #[command(flatten)]
    pub runner: RunnerArgs,
    #[command(flatten)]
    pub journal: JournalArgs,
}

/// Why `check` has no journal, if it has none: files a replay would not
/// write, containers it must start or keep, remote traffic.
fn journal_off(cli: &Cli, a: &CheckArgs) -> Option<&'static str> {
    if a.journal.no_journal {
        Some("--no-journal")
    } else if a.force {
        Some("--force")
    } else if a.keep {
        Some("--keep")
    } else if a.junit.is_some() || a.run.summary_json.is_some() {
        Some("a report file: a replay would not write it")
    } else if a.runner.remote_exec.remote_exec.is_some() {
        Some("--remote-exec")
    } else if cli.remote.as_deref().is_some_and(|r| !r.is_empty()) {
        Some("a remote cache: a replay would skip its traffic")
    } else {
        None
    }
}

/// Runs `charly check`: replayed from the no-op journal when the project,
/// the binary and the store's epoch are unchanged since a run whose beds
/// were all unchanged since an all-pass run (it started no container and
/// printed what a replay prints), else checked.
pub fn run(cli: &Cli, a: &CheckArgs) -> anyhow::Result<ExitCode> {
    let off = journal_off(cli, a);
    let root = project::root(cli)?;
    let journal = match off {
        Some(_) => None,
        None => {
            let mut boxes = a.boxes.clone();
            boxes.sort();
            crate::journaled::journal_for(
                cli,
                &root,
                serde_json::json!({
                    "command": "check",
                    "boxes": boxes,
                    "all": a.all,
                    "keep_going": a.run.keep_going,
                    "json": a.json,
                    "runner": a.runner.runner,
                    "podman_root": a.runner.podman_root,
                    "ca_bundle": a.runner.ca_bundle,
                    "offline": a.runner.offline,
                }),
            )
        }
    };
    crate::journaled::print_with(journal.as_ref(), a.journal, off, |scope| {
        check_full(cli, a, scope)
    })
}

fn check_full(cli: &Cli, a: &CheckArgs, scope: &Scope) -> anyhow::Result<Printed> {
    let mut o = project::open(cli)?;
    let (names, said) = select_warning(&o, &a.boxes, a.all, Unresolved::unless(a.run.keep_going))?;
    let store = open_store(cli)?;
    let uses_plugins = crate::plugins::prepare_build(&mut o, store.dir(), &names)?;
    let mut printed = Printed {
        covered: scope.covers_project(&o.project) && !uses_plugins,
        said,
        // Cached beds and images: the index as this run left it.
        uses_store: true,
        ..Printed::default()
    };
    // Every check definition must parse before anything is built.
    let mut diags = Vec::new();
    let mut beds_checks = Vec::new();
    for n in &names {
        let b = project::resolved(&o, n)?;
        beds_checks.push((b, box_checks(&o.project, b, &mut diags)));
    }
    if diags.iter().any(charly_rules::Diagnostic::is_error) {
        output::diagnostics(diags.iter(), &o.project.sources);
        return Err(crate::Reported.into());
    }
    output::diagnostics(diags.iter(), &o.project.sources);
    // Warnings about check definitions are printed by a full run only.
    printed.covered &= diags.is_empty();

    let _notes = StoreNotes(&store);
    let hasher = stat_cache(&store);
    let jobs = jobs(&a.run);
    let podman = podman_runner(&a.runner, &store, jobs)?;
    let remote_exec = remote_exec_runner(
        &a.runner.remote_exec,
        a.runner.ca_bundle.as_deref(),
        &podman,
        &host_arch(),
    )?;
    // Beds share the remote cache like builds do (CI's main use of it).
    let remote = open_remote_cache(cli)?;
    let runner: &dyn charly_engine::runners::Runner = match &remote_exec {
        Some(r) => r,
        None => &podman,
    };
    // Beds always build local packages from local source.
    let engine = engine(
        &o,
        &store,
        Using::Runner(runner),
        &hasher,
        true,
        remote.as_deref(),
    );
    let graph = engine.graph(&Goal::Build, &names)?;
    let progress = a.run.progress_for(&graph, &store, false, false);
    let summary = engine.run(&graph, &o.project.root, jobs, false, &progress);
    progress.finish();
    report_remote_unless_quiet(&summary, a.run.quiet);
    if let Some(p) = &a.run.summary_json {
        write_summary_json(p, &summary)?;
    }
    if !summary.ok() {
        report_failed(&summary);
        printed.failed = true;
        return Ok(printed);
    }

    let reports = engine.run_beds(
        &podman,
        &graph,
        beds_checks,
        BedOptions {
            jobs,
            keep: a.keep,
            force: a.force,
        },
    )?;

    if let Some(p) = &a.junit {
        write_junit(p, &reports)?;
    }
    // Only a run that started no container printed what the next run
    // prints (a bed that ran is reported cached from now on).
    printed.covered &= reports.iter().all(|r| r.cached || r.checks.is_empty());
    if a.json {
        let counted: Vec<CountedReport<'_>> = reports.iter().map(CountedReport::new).collect();
        output::json_to(&mut printed.stdout, &counted)?;
    } else {
        printed.notes.extend(bed_lines(&reports));
    }
    printed.failed = !reports.iter().all(BedReport::ok);
    Ok(printed)
}

/// The text report of the beds: one line per check (failures with what was
/// expected and what was found), then each bed's counts.
fn bed_lines(reports: &[BedReport]) -> Vec<String> {
    let mut err = Vec::new();
    for r in reports {
        if let Some(e) = &r.error {
            err.push(format!("{}: ERROR {e}", r.box_name));
            continue;
        }
        for c in &r.checks {
            let tag = match c.outcome {
                Outcome::Pass => "pass",
                Outcome::Fail => "FAIL",
                Outcome::Skip => "skip",
            };
            let mut line = format!("{tag}  {}  {} ({})", r.box_name, c.id, c.owner);
            match c.outcome {
                Outcome::Skip => line.push_str(&format!(": {}", c.reason.as_deref().unwrap_or(""))),
                Outcome::Fail => line.push_str(&format!(
                    ": {}\n        expected: {}\n        actual:   {}",
                    c.reason.as_deref().unwrap_or(""),
                    c.expected.as_deref().unwrap_or(""),
                    c.actual.as_deref().unwrap_or("")
                )),
                Outcome::Pass => {}
            }
            err.push(line);
        }
        if r.checks.is_empty() {
            err.push(format!("{}: no checks (no container started)", r.box_name));
            continue;
        }
        let (p, f, s) = r.counts();
        err.push(format!(
            "{}: {p} passed, {f} failed, {s} skipped{}",
            r.box_name,
            if r.cached {
                " (cached: unchanged since an all-pass run)"
            } else {
                ""
            }
        ));
    }
    err
}

/// A bed's report as `--json` prints it: the report with its counts, so a
/// skipped check (deploy scope, a plugin word charly cannot run, …) is
/// counted, not only listed.
#[derive(serde::Serialize)]
struct CountedReport<'a> {
    #[serde(flatten)]
    report: &'a BedReport,
    passed: usize,
    failed: usize,
    skipped: usize,
}

impl<'a> CountedReport<'a> {
    fn new(report: &'a BedReport) -> Self {
        let (passed, failed, skipped) = report.counts();
        CountedReport {
            report,
            passed,
            failed,
            skipped,
        }
    }
}
