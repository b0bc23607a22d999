//! Defaults for charly's own flags, from settings files (not part of the
//! project format): `<project>/.charly/settings.yml`, then the user's
//! `$XDG_CONFIG_HOME/charly/settings.yml` (`~/.config/…`). A flag on the
//! command line wins over its environment variable, which wins over the
//! project's setting, which wins over the user's:
//!
//! ```yaml
//! dev_local_pkg: true          # --dev-local-pkg (turn off: --dev-local-pkg=false)
//! ca_bundle: /etc/ssl/certs/ca-certificates.crt   # --ca-bundle (relative: to this file's directory)
//! jobs: 4                      # -j
//! remote: oci://127.0.0.1:5000/charly/cache       # --remote
//! progress: plain              # --progress
//! allow_unknown_fields: true   # --allow-unknown-fields
//! ```
//!
//! A setting becomes the default value of every flag of that name, in
//! every subcommand that has it; `--help` shows it as the default.

use charly_rules::source::FileId;
use charly_rules::yaml::{Spanned, from_node, parse_stream};
use std::path::{Path, PathBuf};

/// The settings file inside a project.
pub const PROJECT_FILE: &str = ".charly/settings.yml";

/// One settings file.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename = "settings", default)]
pub struct Settings {
    /// `--dev-local-pkg`.
    pub dev_local_pkg: Option<Spanned<bool>>,
    /// `--ca-bundle`.
    pub ca_bundle: Option<Spanned<String>>,
    /// `-j`.
    pub jobs: Option<Spanned<u32>>,
    /// `--remote`.
    pub remote: Option<Spanned<String>>,
    /// `--progress`.
    pub progress: Option<Spanned<String>>,
    /// `--allow-unknown-fields`.
    pub allow_unknown_fields: Option<Spanned<bool>>,
}

impl Settings {
    /// Reads `file` (absent: no settings).
    pub fn read(file: &Path) -> anyhow::Result<Settings> {
        let text = match std::fs::read_to_string(file) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Settings::default()),
            Err(e) => anyhow::bail!("{}: {e}", file.display()),
        };
        let bad = |m: String, line: u32, col: u32| {
            anyhow::anyhow!("{}:{line}:{col}: {m}", file.display())
        };
        let diag = |d: charly_rules::Diagnostic| {
            let s = d.span.unwrap_or_default();
            bad(d.message, s.line, s.col)
        };
        let docs = parse_stream(FileId(0), &text).map_err(diag)?;
        let Some(doc) = docs.first() else {
            return Ok(Settings::default());
        };
        let mut warnings = Vec::new();
        let s: Settings = from_node(doc, &mut warnings).map_err(diag)?;
        // A misspelt setting would be silently ignored: refuse it.
        if let Some(mut w) = warnings.into_iter().next() {
            w.message = format!(
                "{}; the known settings are dev_local_pkg, ca_bundle, jobs, remote, progress, \
                 allow_unknown_fields",
                w.message.trim_end_matches("; it is ignored")
            );
            return Err(diag(w));
        }
        if let Some(p) = &s.progress
            && !matches!(p.value.as_str(), "auto" | "tty" | "plain" | "quiet")
        {
            return Err(bad(
                format!(
                    "progress `{}` is not one of auto, tty, plain, quiet",
                    p.value
                ),
                p.span.line,
                p.span.col,
            ));
        }
        Ok(s)
    }

    /// `(flag id, default value)` of every setting; `dir`: the directory
    /// relative paths are taken from.
    fn defaults(&self, dir: &Path) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if let Some(v) = &self.dev_local_pkg {
            out.push(("dev_local_pkg", v.value.to_string()));
        }
        if let Some(v) = &self.ca_bundle {
            out.push(("ca_bundle", dir.join(&v.value).display().to_string()));
        }
        if let Some(v) = &self.jobs {
            out.push(("jobs", v.value.to_string()));
        }
        if let Some(v) = &self.remote {
            out.push(("remote", v.value.clone()));
        }
        if let Some(v) = &self.progress {
            out.push(("progress", v.value.clone()));
        }
        if let Some(v) = &self.allow_unknown_fields {
            out.push(("allow_unknown_fields", v.value.to_string()));
        }
        out
    }
}

/// The user's settings file.
pub fn user_file() -> Option<PathBuf> {
    std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
        .map(|d| d.join("charly").join("settings.yml"))
}

/// The defaults of the user's settings, then the project's (at `root`,
/// when there is one) over them.
pub fn defaults(root: Option<&Path>) -> anyhow::Result<Vec<(&'static str, String)>> {
    let mut all: Vec<(&'static str, String)> = Vec::new();
    let files = user_file()
        .into_iter()
        .chain(root.map(|r| r.join(PROJECT_FILE)));
    for f in files {
        let dir = f.parent().map(Path::to_path_buf).unwrap_or_default();
        for (k, v) in Settings::read(&f)?.defaults(&dir) {
            all.retain(|(k2, _)| *k2 != k);
            all.push((k, v));
        }
    }
    Ok(all)
}

/// `cmd` with `defaults` as the default values of the flags they name, in
/// it and every subcommand.
pub fn apply(cmd: clap::Command, defaults: &[(&'static str, String)]) -> clap::Command {
    let cmd = cmd.mut_args(|a| {
        match defaults.iter().find(|(k, _)| a.get_id().as_str() == *k) {
            // clap keeps default values for the life of the program.
            Some((_, v)) => a.default_value(&*Box::leak(v.clone().into_boxed_str())),
            None => a,
        }
    });
    let names: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect();
    names
        .into_iter()
        .fold(cmd, |cmd, n| cmd.mut_subcommand(n, |s| apply(s, defaults)))
}
