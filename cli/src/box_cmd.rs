//! `charly box …`.

use crate::{Cli, output, project};
use charly_rules::resolve::BaseRef;
use serde::Serialize;
use std::io::Write;
use std::process::ExitCode;

/// Box subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum BoxCommand {
    /// List every box: base chain, distro, resolved candy order, or what stops it resolving.
    List {
        /// Print a JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// One row of `box list --json`.
#[derive(Serialize)]
pub struct BoxRow {
    /// Qualified name (`cachyos.cachyos` for imported boxes).
    pub name: String,
    /// The base as written: external image, box, or bootstrap.
    pub base: Option<String>,
    /// Internal bases, nearest first, ending with the external root image.
    pub base_chain: Vec<String>,
    /// Distro tags, most specific first (expanded through `inherits`).
    pub distro: Vec<String>,
    /// Package formats, primary first.
    pub formats: Vec<String>,
    /// Candies in install order (empty when unresolved).
    pub candies: Vec<String>,
    /// Candies already in the base image.
    pub provided: Vec<String>,
    /// Builder type → builder box, for builders this box's candies trigger.
    pub builders: std::collections::BTreeMap<String, Option<String>>,
    /// Effective version.
    pub version: Option<String>,
    /// Box user.
    pub user: Option<String>,
    /// Whether `--all` includes it.
    pub enabled: bool,
    /// `null`, or why the box does not resolve (each problem with file:line:col).
    pub error: Option<String>,
}

/// Runs a box subcommand.
pub fn run(cli: &Cli, c: &BoxCommand) -> anyhow::Result<ExitCode> {
    match c {
        BoxCommand::List { json } => list(cli, *json),
    }
}

fn list(cli: &Cli, json: bool) -> anyhow::Result<ExitCode> {
    let o = project::open(cli)?;
    let sources = &o.project.sources;
    let mut rows = Vec::new();
    for (name, r) in &o.resolution.boxes {
        let row = match r {
            Ok(b) => {
                let mut chain = b.base_chain.clone();
                chain.push(b.root_image.clone());
                BoxRow {
                    name: name.clone(),
                    base: Some(match &b.base {
                        BaseRef::External(x) | BaseRef::Box(x) => x.clone(),
                        BaseRef::Bootstrap { builder, .. } => format!("builder:{builder}"),
                    }),
                    base_chain: chain,
                    distro: b.tags.clone(),
                    formats: b.formats.clone(),
                    candies: b.candies.clone(),
                    provided: b.provided.clone(),
                    builders: b
                        .builders
                        .iter()
                        .map(|u| (u.builder.clone(), u.image.clone()))
                        .collect(),
                    version: Some(b.version.clone()),
                    user: Some(b.user.name.clone()),
                    enabled: b.enabled,
                    error: None,
                }
            }
            Err(errs) => {
                let def = find_def(&o.project, name);
                BoxRow {
                    name: name.clone(),
                    base: def
                        .and_then(|d| d.base.as_ref().or(d.from.as_ref()).map(|b| b.value.clone())),
                    base_chain: Vec::new(),
                    distro: def
                        .and_then(|d| d.distro.as_ref().map(|x| x.value.0.clone()))
                        .unwrap_or_default(),
                    formats: Vec::new(),
                    candies: Vec::new(),
                    provided: Vec::new(),
                    builders: Default::default(),
                    version: def.and_then(|d| d.version.as_ref().map(|v| v.value.clone())),
                    user: None,
                    enabled: def.and_then(|d| d.enabled).unwrap_or(true),
                    error: Some(
                        errs.iter()
                            .map(|d| d.one_line(sources))
                            .collect::<Vec<_>>()
                            .join("; "),
                    ),
                }
            }
        };
        rows.push(row);
    }
    if json {
        output::json(&rows)?;
    } else {
        let mut out = std::io::stdout().lock();
        let width = rows.iter().map(|r| r.name.len()).max().unwrap_or(4);
        for r in &rows {
            match &r.error {
                None => writeln!(
                    out,
                    "{:width$}  {:<28} {:<18} {}",
                    r.name,
                    r.base.as_deref().unwrap_or("-"),
                    r.distro.first().map_or("-", String::as_str),
                    r.candies.join(" "),
                )?,
                Some(e) => writeln!(out, "{:width$}  ERROR {e}", r.name)?,
            }
        }
        let ok = rows.iter().filter(|r| r.error.is_none()).count();
        output::note(&format!("{} boxes, {ok} resolve", rows.len()));
    }
    Ok(ExitCode::SUCCESS)
}

fn find_def<'a>(
    p: &'a charly_rules::load::Project,
    qualified: &str,
) -> Option<&'a charly_rules::model::BoxDef> {
    p.namespaces.iter().find_map(|n| {
        n.boxes
            .values()
            .find(|b| n.qualify(&b.name) == qualified)
            .map(|b| &b.def)
    })
}
