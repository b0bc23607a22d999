//! `charly candy …`.

use crate::{Cli, output, project};
use charly_engine::journal::Scope;
use charly_engine::pure::Printed;
use serde::Serialize;
use std::io::Write;
use std::process::ExitCode;

/// Candy subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum CandyCommand {
    /// List every candy with its version, directory, requires and builders.
    List {
        /// Print a JSON array instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        journal: crate::journaled::JournalArgs,
    },
    /// Create `candy/NAME/charly.yml`: a skeleton with a package, a task
    /// and a check, to edit and add to a box's `candy:` list.
    New {
        /// The candy's name: lowercase letters and digits in words joined
        /// by `-` (`my-tools`).
        name: String,
    },
}

#[derive(Serialize)]
struct CandyRow {
    name: String,
    version: Option<String>,
    description: Option<String>,
    dir: String,
    require: Vec<String>,
    candy: Vec<String>,
    builders: Vec<String>,
    boxes: usize,
}

/// Runs a candy subcommand.
pub fn run(cli: &Cli, c: &CandyCommand) -> anyhow::Result<ExitCode> {
    match c {
        CandyCommand::List { json, journal } => crate::journaled::print(
            cli,
            *journal,
            serde_json::json!({"command": "candy list", "json": json}),
            |scope| list(cli, scope, *json),
        ),
        CandyCommand::New { name } => crate::init_cmd::new_candy(cli, name),
    }
}

/// `candy list`: what it prints, for the journal to record.
fn list(cli: &Cli, scope: &Scope, json: bool) -> anyhow::Result<Printed> {
    let o = project::open(cli)?;
    let mut printed = Printed {
        covered: scope.covers_project(&o.project),
        ..Printed::default()
    };
    let p = &o.project;
    let rows: Vec<CandyRow> = p
        .candies
        .values()
        .map(|c| {
            let vocab = &p.ns(c.ns).vocab;
            CandyRow {
                name: c.key.clone(),
                version: c.def.version.as_ref().map(|v| v.value.clone()),
                description: c.def.description.as_ref().and_then(|d| {
                    d.0.as_str()
                        .map(|s| s.lines().next().unwrap_or("").to_string())
                }),
                dir: c
                    .rel_dir
                    .clone()
                    .unwrap_or_else(|| c.dir.display().to_string()),
                require: c.def.require.iter().map(|r| r.value.clone()).collect(),
                candy: c.def.candy.iter().map(|r| r.value.clone()).collect(),
                builders: vocab
                    .builder
                    .iter()
                    .filter(|(_, b)| b.detect_file.iter().any(|f| c.has_file(f)))
                    .map(|(n, _)| n.clone())
                    .collect(),
                boxes: o.resolution.popularity.get(&c.key).copied().unwrap_or(0),
            }
        })
        .collect();
    if json {
        output::json_to(&mut printed.stdout, &rows)?;
    } else {
        let out = &mut printed.stdout;
        let width = rows.iter().map(|r| r.name.len()).max().unwrap_or(4);
        for r in &rows {
            writeln!(
                out,
                "{:width$}  {:<15} {}",
                r.name,
                r.version.as_deref().unwrap_or("-"),
                r.description.as_deref().unwrap_or("")
            )?;
        }
    }
    Ok(printed)
}
