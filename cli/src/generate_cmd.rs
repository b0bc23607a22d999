//! `charly box generate`.

use crate::box_cmd::{GenerateArgs, resolved};
use crate::{Cli, output, project};
use charly_engine::generate;
use charly_rules::emit::EmitOptions;
use std::io::Write;
use std::process::ExitCode;

/// Runs the command.
pub fn run(cli: &Cli, a: &GenerateArgs) -> anyhow::Result<ExitCode> {
    let o = project::open(cli)?;
    let names: Vec<String> = if a.all {
        o.resolution
            .boxes
            .iter()
            .filter(|(_, b)| b.as_ref().is_ok_and(|b| b.enabled))
            .map(|(n, _)| n.clone())
            .collect()
    } else if a.boxes.is_empty() {
        anyhow::bail!("name the boxes to generate, or pass --all");
    } else {
        a.boxes.clone()
    };
    if a.stdout && names.len() != 1 {
        anyhow::bail!("--stdout prints one Containerfile; name exactly one box");
    }
    let opts = EmitOptions {
        dev_local_pkg: a.dev_local_pkg,
        image_refs: generate::image_refs(&o.resolution),
        ..EmitOptions::default()
    };
    let out_root = a.out.clone().unwrap_or_else(|| o.project.root.clone());
    let mut failed = Vec::new();
    let mut stdout = std::io::stdout().lock();
    for name in &names {
        let b = match resolved(&o, name) {
            Ok(b) => b,
            Err(e) => {
                if !e.is::<crate::Reported>() {
                    output::error(&format!("{e:#}"));
                }
                failed.push(name.clone());
                continue;
            }
        };
        match generate::render(&o.project, b, &opts) {
            Ok(d) if a.stdout => {
                stdout.write_all(d.containerfile.as_bytes())?;
            }
            Ok(d) => match generate::write(&out_root, &d) {
                Ok(paths) => {
                    if let Some(cf) = paths.first() {
                        writeln!(stdout, "{}", cf.display())?;
                    }
                }
                Err(e) => {
                    output::error(&format!("{name}: {e}"));
                    failed.push(name.clone());
                }
            },
            Err(e) => {
                output::error(&format!("{e}"));
                failed.push(name.clone());
            }
        }
    }
    if !a.stdout && a.out.is_none() {
        generate::write_ignore_files(&o.project)?;
    }
    if failed.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        output::error(&format!(
            "{} of {} boxes failed: {}",
            failed.len(),
            names.len(),
            failed.join(", ")
        ));
        Ok(ExitCode::from(1))
    }
}
