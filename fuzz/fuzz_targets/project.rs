//! Shared by the loader fuzz targets: a scratch project on disk and the
//! calls `charly validate` makes on it.
//!
//! The loader reads files, not strings (discovery, `build.yml` lookup, the
//! root namespace): a target that only fed the YAML parser would have missed
//! the root-file panic of issue 18. So each input is written into a real
//! directory and goes through `load::load`, `resolve::resolve` and
//! `validate::validate_candies`, exactly as the CLI does.
//!
//! One directory per process (under `$TMPDIR`), rewritten for every input:
//! creating a fresh temp dir per run would cost more than the load itself.

// Each target uses part of this module.
#![allow(dead_code)]

use charly_rules::load::{self, LoadOptions};
use charly_rules::{resolve, validate};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// A root `charly.yml` that loads cleanly (for targets that fuzz another file).
pub const ROOT: &[u8] =
    b"version: 2026.160.1301\ndiscover: [box, candy]\ndefaults:\n  build: [rpm]\n";

/// A candy the fuzzed box can name.
pub const CANDY: &[u8] = b"candy:\n  version: 1.0.0\n  package: [curl]\n  port: [8080, \"https+insecure:3000\"]\n";

fn scratch() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("charly-fuzz-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("scratch dir");
        d
    })
}

/// Writes `files` (project-relative path, bytes) into the scratch project,
/// removing whatever the previous input left, then loads, resolves and
/// validates it. Every result is fine; only a panic (or abort, timeout, OOM)
/// is a finding.
pub fn check(files: &[(&str, &[u8])]) {
    let root = scratch();
    for sub in ["charly.yml", "build.yml", "charly", "box", "candy"] {
        let p = root.join(sub);
        if p.is_dir() {
            let _ = std::fs::remove_dir_all(&p);
        } else {
            let _ = std::fs::remove_file(&p);
        }
    }
    for (rel, bytes) in files {
        let p = root.join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).expect("mkdir");
        }
        std::fs::write(&p, bytes).expect("write");
    }
    let Ok(project) = load::load(root, &LoadOptions::default()) else {
        return;
    };
    // What the rest of the tool may rely on after any load.
    let _ = project.root_ns();
    let resolution = resolve::resolve(&project);
    let _ = validate::validate_candies(&project);
    for r in resolution.boxes.values() {
        if let Err(errs) = r {
            for e in errs {
                let _ = e.one_line(&project.sources);
            }
        }
    }
    for d in project.diags.iter() {
        let _ = d.one_line(&project.sources);
        // Rendered as the CLI renders it: a report that cannot be printed
        // (a column past what the renderer pads, issue 43) is a finding.
        let mut out = String::new();
        let _ = miette::GraphicalReportHandler::new_themed(
            miette::GraphicalTheme::unicode_nocolor(),
        )
        .with_context_lines(1)
        .render_report(&mut out, d.to_report(&project.sources).as_ref());
    }
}
