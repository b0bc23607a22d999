//! `charly migrate --to 2026.174 DIR`: a classic project as node-form files.
//!
//! The conversion is `charly_rules::migrate` (pure); this writes. Without
//! `--write` the project is copied to a sibling directory (`DIR-2026.174`,
//! or `--out`), which must not exist yet, and the migrated files are
//! written there; with `--write` they replace the input files in place.
//! Every path written is proven inside the output root first.

use crate::output;
use charly_engine::fsroot::{Root, check_rel};
use charly_rules::load::{self, LoadOptions};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Arguments of `charly migrate`.
#[derive(clap::Args, Debug)]
pub struct MigrateArgs {
    /// The schema to migrate to (`2026.174`).
    #[arg(long = "to", value_name = "VERSION")]
    pub to: String,
    /// The classic project's directory.
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// Rewrite the project in place (the only way an existing file is overwritten).
    #[arg(long, conflicts_with = "out")]
    pub write: bool,
    /// Where to write the migrated copy (a new directory; default `DIR-<VERSION>` next to DIR).
    #[arg(long, value_name = "OUT")]
    pub out: Option<PathBuf>,
}

/// Runs `charly migrate`.
pub fn run(a: &MigrateArgs) -> anyhow::Result<ExitCode> {
    let out = if a.write {
        a.dir.clone()
    } else {
        let out = a.out.clone().unwrap_or_else(|| sibling(&a.dir, &a.to));
        let abs = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
        if abs(&out).starts_with(abs(&a.dir)) {
            anyhow::bail!(
                "{} is inside the project; the copy goes next to it",
                out.display()
            );
        }
        if out.exists() {
            anyhow::bail!(
                "{} exists; choose another --out, or rewrite in place with --write",
                out.display()
            );
        }
        out
    };
    let p = load::load(&a.dir, &LoadOptions::default())?;
    if p.diags.has_errors() {
        output::diagnostics(p.diags.errors(), &p.sources);
        output::note("the project has errors; fix them before migrating");
        return Err(crate::Reported.into());
    }
    let m = match charly_rules::migrate::to_nodeform(&p, &a.to) {
        Ok(m) => m,
        Err(d) => {
            output::diagnostics([&d], &p.sources);
            return Err(crate::Reported.into());
        }
    };
    output::diagnostics(m.warnings.iter(), &p.sources);
    // Every path must be a plain relative path before anything is written.
    for (rel, _) in &m.files {
        check_rel(Path::new(rel)).map_err(|e| anyhow::anyhow!("refusing to write {rel}: {e}"))?;
    }
    if !a.write {
        copy_tree(&a.dir, &out)?;
    }
    let root = Root::open(&out)?;
    let mut written = 0;
    for (rel, text) in &m.files {
        if root.write_if_changed(Path::new(rel), text.as_bytes())? {
            written += 1;
        }
    }
    for rel in &m.obsolete {
        output::note(&format!(
            "{rel} is not read by the 2026.174 form (its entries are in charly/charly.yml now); remove it when done"
        ));
    }
    output::note(&format!(
        "migrated to {} in {}: {} files ({written} written), {} warning{}",
        a.to,
        out.display(),
        m.files.len(),
        m.warnings.len(),
        if m.warnings.len() == 1 { "" } else { "s" }
    ));
    Ok(ExitCode::SUCCESS)
}

/// `DIR-<version>` next to DIR.
fn sibling(dir: &Path, to: &str) -> PathBuf {
    let abs = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
    let name = abs.file_name().map_or_else(
        || "project".to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    abs.with_file_name(format!("{name}-{to}"))
}

/// Copies a project into a new directory (not `.build`, not `.git`),
/// keeping modes and symlinks as they are.
fn copy_tree(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to)?;
    for e in walkdir::WalkDir::new(from).follow_links(false) {
        let e = e?;
        let rel = e.path().strip_prefix(from)?;
        if rel.starts_with(".build") || rel.starts_with(".git") || rel.as_os_str().is_empty() {
            continue;
        }
        let dest = to.join(rel);
        let t = e.file_type();
        if t.is_dir() {
            std::fs::create_dir_all(&dest)?;
        } else if t.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(e.path())?, &dest)?;
        } else if t.is_file() {
            std::fs::copy(e.path(), &dest)?;
        }
    }
    Ok(())
}
