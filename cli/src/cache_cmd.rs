//! `charly cache stats|gc|verify`.

use crate::engine_cmd::open_store;
use crate::{Cli, output};
use std::io::Write;
use std::process::ExitCode;

/// Cache subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum CacheCommand {
    /// Records, blobs, bytes on disk, roots.
    Stats {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove least-recently-used entries down to a size budget (roots are kept).
    Gc {
        /// Budget, e.g. `10G`, `500M`, `0` (everything but roots).
        #[arg(long, value_name = "SIZE", value_parser = parse_size)]
        max_size: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Re-hash every blob and check every record; `--repair` quarantines bad
    /// blobs, drops broken records and removes stale temp files.
    Verify {
        /// Fix what is found.
        #[arg(long)]
        repair: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Parses `10G`, `512M`, `64K`, `1000` (bytes).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                'B' => 1,
                _ => return Err(format!("unknown size unit in `{s}` (use K, M, G or T)")),
            };
            (&s[..i], m)
        }
        _ => (s, 1),
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a size like 10G"))?;
    if n < 0.0 {
        return Err("a size cannot be negative".into());
    }
    Ok((n * mult as f64) as u64)
}

fn human(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

/// Runs a cache subcommand.
pub fn run(cli: &Cli, c: &CacheCommand) -> anyhow::Result<ExitCode> {
    let store = open_store(cli)?;
    match c {
        CacheCommand::Stats { json } => {
            let s = store.stats()?;
            if *json {
                output::json(&s)?;
            } else {
                let mut out = std::io::stdout().lock();
                writeln!(out, "store        {}", store.dir().display())?;
                writeln!(out, "records      {}", s.records)?;
                writeln!(
                    out,
                    "blobs        {} ({} on disk, {} of content)",
                    s.blobs,
                    human(s.compressed_bytes),
                    human(s.logical_bytes)
                )?;
                writeln!(out, "index        {}", human(s.index_bytes))?;
                writeln!(out, "roots        {}", s.roots)?;
                writeln!(out, "quarantined  {}", s.quarantined)?;
            }
        }
        CacheCommand::Gc { max_size, json } => {
            let r = store.gc(*max_size)?;
            if *json {
                output::json(&r)?;
            } else {
                writeln!(
                    std::io::stdout().lock(),
                    "{} -> {}: removed {} records, {} blobs, {} stale files{}",
                    human(r.bytes_before),
                    human(r.bytes_after),
                    r.records_removed,
                    r.blobs_removed,
                    r.stale_files_removed,
                    if r.within_budget {
                        ""
                    } else {
                        " (roots alone exceed the budget)"
                    }
                )?;
            }
        }
        CacheCommand::Verify { repair, json } => {
            let r = store.verify(*repair)?;
            if *json {
                output::json(&r)?;
            } else {
                let mut out = std::io::stdout().lock();
                writeln!(out, "{} blobs checked", r.blobs_checked)?;
                for (what, n) in [
                    ("corrupt blobs", r.corrupt_blobs.len()),
                    ("blobs missing from the index", r.unindexed_blobs.len()),
                    ("indexed blobs missing on disk", r.missing_blobs.len()),
                    ("records with missing blobs", r.broken_records.len()),
                    ("stale temp files", r.stale_temp_files.len()),
                    ("stray files", r.stray_files.len()),
                    ("index problems", r.index_problems.len()),
                ] {
                    if n > 0 {
                        writeln!(
                            out,
                            "{what}: {n}{}",
                            if r.repaired { " (repaired)" } else { "" }
                        )?;
                    }
                }
                writeln!(
                    out,
                    "{}",
                    if r.is_clean() {
                        "clean"
                    } else if r.repaired {
                        "repaired"
                    } else {
                        "problems found"
                    }
                )?;
            }
            if !r.is_clean() && !*repair {
                output::error("the store has problems; run `charly cache verify --repair`");
                return Ok(ExitCode::from(1));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("10G"), Ok(10 << 30));
        assert_eq!(parse_size("512m"), Ok(512 << 20));
        assert_eq!(parse_size("1000"), Ok(1000));
        assert_eq!(parse_size("1.5K"), Ok(1536));
        assert!(parse_size("ten").is_err());
        assert!(parse_size("5Q").is_err());
    }
}
