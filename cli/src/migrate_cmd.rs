//! `charly migrate --to 2026.174 DIR`: a classic project as node-form files.
//!
//! The conversion is `charly_rules::migrate` (pure); this writes. Without
//! `--write` the project is copied to a sibling directory (`DIR-2026.174`,
//! or `--out`), which must not exist yet, and the migrated files are
//! written there; with `--write` they replace the input files in place.
//! Every path written is proven inside the output root first.
//!
//! `--write` never loses a byte: every file it would replace must be a
//! regular file (a symlink or anything else stops it before any change);
//! the originals are copied to `.build/migrate-backup/<time>/` first (the
//! path is printed); every new file is staged next to its target and
//! synced, and only when all of them are staged are they renamed into
//! place. A file already in the node form is left as it is, with a note.

use crate::output;
use charly_files::fsroot::{Root, check_rel};
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
    refuse_links(&a.dir)?;
    // Files already in the node form are not classic fields: said, then
    // left as they are (see `charly_rules::migrate`), never a refusal.
    let p = load::load(
        &a.dir,
        &LoadOptions {
            allow_unknown_fields: true,
            ..LoadOptions::default()
        },
    )?;
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
    for (rel, why) in &m.skipped {
        output::note(&format!("{rel} left as it is: {why}"));
    }
    if !a.write {
        copy_tree(&a.dir, &out)?;
    }
    let root = Root::open(&out)?;
    let written = if a.write {
        write_in_place(&root, &m.files)?
    } else {
        let mut written = 0;
        for (rel, text) in &m.files {
            if root.write_if_changed(Path::new(rel), text.as_bytes())? {
                written += 1;
            }
        }
        written
    };
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

/// The project's YAML files must be regular files: a symlink (or a fifo,
/// a device) is neither read nor rewritten the same way as the files
/// around it, so a migration would leave it behind in the old form.
fn refuse_links(dir: &Path) -> anyhow::Result<()> {
    let mut odd = Vec::new();
    let walk = walkdir::WalkDir::new(dir).follow_links(false).into_iter();
    for e in walk.filter_entry(|e| {
        e.depth() == 0 || !matches!(e.file_name().to_str(), Some(".build" | ".git"))
    }) {
        let e = e?;
        let name = e.file_name().to_string_lossy();
        let t = e.file_type();
        if !t.is_dir() && !t.is_file() && (name.ends_with(".yml") || name.ends_with(".yaml")) {
            let rel = e.path().strip_prefix(dir).unwrap_or(e.path());
            odd.push(format!(
                "{} ({})",
                rel.display(),
                if t.is_symlink() {
                    "a symlink"
                } else {
                    "not a regular file"
                }
            ));
        }
    }
    if !odd.is_empty() {
        anyhow::bail!(
            "migrate reads and rewrites regular files only, and these are not (replace each by \
             a copy of what it points to, or remove it); nothing was changed: {}",
            odd.join(", ")
        );
    }
    Ok(())
}

/// File type bits of `st_mode` (POSIX).
const S_IFMT: u32 = 0o170_000;
const S_IFREG: u32 = 0o100_000;
const S_IFLNK: u32 = 0o120_000;
const S_IFDIR: u32 = 0o040_000;

/// `--write`: replaces the project's files with `files` all together or
/// not at all (see the module doc); returns how many changed.
fn write_in_place(root: &Root, files: &[(String, String)]) -> anyhow::Result<usize> {
    // What each file holds now; anything but a regular file stops it.
    let mut changed = Vec::new();
    let mut refused = Vec::new();
    let unchanged = |e: std::io::Error| anyhow::anyhow!("{e}; nothing was changed");
    for (rel, text) in files {
        let path = Path::new(rel);
        match root.lstat(path).map_err(unchanged)? {
            None => changed.push((rel, text, None, 0o644)),
            Some(st) if st.st_mode & S_IFMT == S_IFREG => {
                let old = root.read(path).map_err(unchanged)?.unwrap_or_default();
                if old != text.as_bytes() {
                    changed.push((rel, text, Some(old), st.st_mode & 0o7777));
                }
            }
            Some(st) => refused.push(format!(
                "{rel} ({})",
                match st.st_mode & S_IFMT {
                    S_IFLNK => "a symlink",
                    S_IFDIR => "a directory",
                    _ => "not a regular file",
                }
            )),
        }
    }
    if !refused.is_empty() {
        anyhow::bail!(
            "--write replaces regular files only; nothing was changed. Not regular: {}",
            refused.join(", ")
        );
    }
    if changed.is_empty() {
        return Ok(0);
    }
    // The originals first, where the build directory keeps its own.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let backup = PathBuf::from(format!(
        ".build/migrate-backup/{}.{:09}",
        now.as_secs(),
        now.subsec_nanos()
    ));
    for (rel, _, old, mode) in &changed {
        if let Some(old) = old {
            root.write_atomic(&backup.join(rel), old, *mode, None, true)
                .map_err(|e| anyhow::anyhow!("backing up {rel}: {e}; nothing was changed"))?;
        }
    }
    let staged = changed
        .iter()
        .map(|(rel, text, _, mode)| {
            root.stage(Path::new(rel), text.as_bytes(), *mode)
                .map_err(|e| anyhow::anyhow!("{e}; nothing was changed"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    for s in staged {
        s.commit()?;
    }
    if changed.iter().any(|c| c.2.is_some()) {
        output::note(&format!(
            "the files it replaced are kept in {}",
            root.path().join(&backup).display()
        ));
    }
    Ok(changed.len())
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
