//! Printing for people (stderr) and for programs (stdout).
//!
//! Diagnostics render through miette: the source line, a caret under the
//! column, and the hint. Color follows `NO_COLOR` and whether stderr is a
//! terminal; everything reads the same without color.

use charly_rules::{Diagnostic, SourceMap};
use std::io::{IsTerminal, Write};

/// Whether to use color on stderr.
pub fn color() -> bool {
    std::env::var_os("NO_COLOR").is_none() && std::io::stderr().is_terminal()
}

/// Configures miette and turns panics into exit code 101 with a bug note.
pub fn install_hooks() {
    let color = color();
    let _ = miette::set_hook(Box::new(move |_| {
        Box::new(
            miette::MietteHandlerOpts::new()
                .color(color)
                .unicode(color)
                .context_lines(1)
                .build(),
        )
    }));
    std::panic::set_hook(Box::new(|info| {
        eprintln!("charly: internal error (this is a bug): {info}");
        std::process::exit(101);
    }));
}

/// Prints every diagnostic, errors last so they stay on screen.
pub fn diagnostics<'a>(ds: impl IntoIterator<Item = &'a Diagnostic>, sources: &SourceMap) {
    for r in rendered(ds, sources) {
        note(&r);
    }
}

/// Every diagnostic as [`diagnostics`] prints it, errors last.
pub fn rendered<'a>(
    ds: impl IntoIterator<Item = &'a Diagnostic>,
    sources: &SourceMap,
) -> Vec<String> {
    let mut all: Vec<&Diagnostic> = ds.into_iter().collect();
    all.sort_by_key(|d| d.is_error());
    all.into_iter()
        .map(|d| format!("{:?}", d.to_report(sources)))
        .collect()
}

/// A one-line error for people.
pub fn error(msg: &str) {
    let _ = writeln!(std::io::stderr(), "error: {msg}");
}

/// A one-line note for people.
pub fn note(msg: &str) {
    let _ = writeln!(std::io::stderr(), "{msg}");
}

/// Writes JSON to stdout (pretty, with a trailing newline).
pub fn json<T: serde::Serialize>(v: &T) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, v)?;
    writeln!(out)?;
    Ok(())
}

/// Writes JSON into `out` as [`json`] prints it.
pub fn json_to<T: serde::Serialize>(out: &mut Vec<u8>, v: &T) -> anyhow::Result<()> {
    serde_json::to_writer_pretty(&mut *out, v)?;
    writeln!(out)?;
    Ok(())
}
