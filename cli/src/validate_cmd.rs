//! `charly validate`.

use crate::{Cli, output, project};
use charly_engine::journal::Scope;
use charly_engine::pure::Printed;
use charly_rules::Diagnostics;
use std::process::ExitCode;

/// Arguments of `charly validate`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print `{errors: [...], warnings: [...]}` on stdout instead of reports on stderr.
    #[arg(long)]
    pub json: bool,
    /// Warnings fail too (exit 1): for CI that wants a spotless project.
    #[arg(long)]
    pub strict: bool,
    #[command(flatten)]
    pub journal: crate::journaled::JournalArgs,
}

/// Collects every diagnostic of the project: loading, candies, boxes.
pub fn collect(o: &project::Opened) -> Diagnostics {
    let mut all = Diagnostics::new();
    all.extend(o.project.diags.iter().cloned());
    all.extend(charly_rules::validate::validate_candies(&o.project));
    all.extend(o.resolution.diags.iter().cloned());
    for r in o.resolution.boxes.values() {
        if let Err(errs) = r {
            all.extend(errs.iter().cloned());
        }
    }
    all.sort();
    all
}

/// Runs the command, through the no-op journal (a project without errors
/// whose files are unchanged prints the same report again; the rendering
/// depends on whether stderr takes color, so that is part of the command).
pub fn run(cli: &Cli, a: &Args) -> anyhow::Result<ExitCode> {
    let command = serde_json::json!({
        "command": "validate",
        "json": a.json,
        "strict": a.strict,
        "allow_unknown_fields": cli.allow_unknown_fields,
        "color": output::color(),
    });
    crate::journaled::print(cli, a.journal, command, |scope| full(cli, scope, a))
}

fn full(cli: &Cli, scope: &Scope, a: &Args) -> anyhow::Result<Printed> {
    let o = project::open_lenient(cli)?;
    let mut printed = Printed {
        covered: scope.covers_project(&o.project),
        ..Printed::default()
    };
    let all = collect(&o);
    let sources = &o.project.sources;
    if a.json {
        let errors: Vec<_> = all.errors().map(|d| d.to_json(sources)).collect();
        let warnings: Vec<_> = all.warnings().map(|d| d.to_json(sources)).collect();
        output::json_to(
            &mut printed.stdout,
            &serde_json::json!({ "errors": errors, "warnings": warnings }),
        )?;
    } else {
        printed.notes = output::rendered(all.iter(), sources);
        let (e, w) = (all.errors().count(), all.warnings().count());
        let boxes = o.resolution.boxes.len();
        let ok = o.resolution.boxes.values().filter(|r| r.is_ok()).count();
        printed.notes.push(format!(
            "{} candies, {boxes} boxes ({ok} resolve): {e} error{}, {w} warning{}",
            o.project.candies.len(),
            if e == 1 { "" } else { "s" },
            if w == 1 { "" } else { "s" },
        ));
    }
    printed.failed = all.has_errors() || (a.strict && all.warnings().next().is_some());
    Ok(printed)
}
