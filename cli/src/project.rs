//! Opening the project named by `-C` (or found upwards from the cwd).

use crate::{Cli, output};
use anyhow::Context;
use charly_rules::load::{self, LoadOptions, Project};
use charly_rules::resolve::{self, Resolution};

/// A loaded and resolved project.
pub struct Opened {
    /// The project.
    pub project: Project,
    /// Its resolution.
    pub resolution: Resolution,
}

/// Loads and resolves the project. Refused (the errors printed, exit 1)
/// when its root file cannot be used as a whole, or when a name or token
/// breaks the identifier rules ([`charly_rules::names`]): such a name could
/// become a path outside the project or an instruction the YAML never asked
/// for, so no command but `validate` uses the project at all.
pub fn open(cli: &Cli) -> anyhow::Result<Opened> {
    open_at(cli, root(cli)?)
}

/// Loads and resolves the project without refusing it: for `validate`,
/// which reports every diagnostic itself.
pub fn open_lenient(cli: &Cli) -> anyhow::Result<Opened> {
    load_at(cli, root(cli)?)
}

/// The project's root directory: `-C DIR`, or found upwards from the cwd.
pub fn root(cli: &Cli) -> anyhow::Result<std::path::PathBuf> {
    Ok(match &cli.dir {
        Some(d) => {
            if !d.join("charly.yml").is_file() {
                anyhow::bail!(
                    "{} has no charly.yml (give -C the directory that holds your project's charly.yml)",
                    d.display()
                );
            }
            d.clone()
        }
        None => {
            let cwd = std::env::current_dir().context("cannot read the current directory")?;
            load::locate(&cwd).with_context(|| {
                "not inside a charly project; run from a directory with a charly.yml or pass -C DIR"
            })?
        }
    })
}

/// Loads and resolves the project at `root`; refused as [`open`] says.
/// A root `charly.yml` or vocabulary file that cannot be used as a whole (not
/// YAML, not UTF-8, empty, not a project document) would otherwise mean "no
/// boxes" and a silent success.
pub fn open_at(cli: &Cli, root: std::path::PathBuf) -> anyhow::Result<Opened> {
    let o = load_at(cli, root)?;
    if o.project.root_unusable {
        output::diagnostics(o.project.diags.errors(), &o.project.sources);
        anyhow::bail!(
            "the project file cannot be used; fix the errors above (`charly validate` lists every problem)"
        );
    }
    let refused = charly_rules::names::check_project(&o.project);
    if !refused.is_empty() {
        output::diagnostics(refused.iter(), &o.project.sources);
        output::error(&format!(
            "the project has {} name{} charly refuses to use (see above); nothing was done",
            refused.len(),
            if refused.len() == 1 { "" } else { "s" }
        ));
        return Err(crate::Reported.into());
    }
    Ok(o)
}

fn load_at(cli: &Cli, root: std::path::PathBuf) -> anyhow::Result<Opened> {
    let opts = LoadOptions {
        imports: cli.imports.iter().cloned().collect(),
    };
    let project = load::load(&root, &opts)?;
    let resolution = resolve::resolve(&project);
    Ok(Opened {
        project,
        resolution,
    })
}
