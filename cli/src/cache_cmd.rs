//! `charly cache stats|gc|verify|push|pull`.

use crate::project::{self, Unresolved, select};
use crate::session::{StoreNotes, open_remote, open_store, planned_graph, stat_cache};
use crate::{Cli, output};
use anyhow::Context;
use charly_cache::human_bytes as human;
use charly_cache::{PullOutcome, Remote, RemoteStats, Store};
use charly_engine::key::NodeKind;
use rayon::prelude::*;
use serde::Serialize;
use std::io::Write;
use std::process::ExitCode;

/// `cache gc --podman`: prunes charly's images from podman's storage,
/// saying what it removed (nothing without `--podman`).
fn prune_podman(
    store: &Store,
    podman: bool,
    root: &Option<std::path::PathBuf>,
) -> anyhow::Result<(usize, usize)> {
    if !podman {
        return Ok((0, 0));
    }
    let runner = charly_engine::runners::podman::PodmanRunner::new(
        charly_engine::runners::podman::PodmanOptions {
            root: root.clone(),
            conf_dir: store.dir().to_path_buf(),
            ca_bundle: None,
            offline: true,
            jobs: 1,
        },
    )?;
    let (names, images) = runner.prune_charly_images()?;
    output::note(&format!(
        "podman: removed {names} charly names and {images} images only they named"
    ));
    Ok((names, images))
}

/// Cache subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum CacheCommand {
    /// Records, blobs, bytes on disk, roots; with --remote also the remote
    /// repository (reachable, records it holds).
    Stats {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Upload every local record (with its blobs) that the remote cache
    /// (--remote) lacks. Source records are not pushed. Exit 1 if any upload fails.
    Push {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Fetch the records of a project's graph from the remote cache
    /// (--remote) into the local store, verified, without building anything.
    Pull(PullArgs),
    /// Remove least-recently-used entries down to a size budget (roots are
    /// kept); with --podman, charly's own images from podman's storage.
    Gc {
        /// Budget, e.g. `10G`, `500M`, `0` (everything but roots).
        #[arg(long, value_name = "SIZE", value_parser = parse_size, required_unless_present = "podman")]
        max_size: Option<u64>,
        /// Also remove charly's own names from podman's storage (the
        /// `localhost/charly-layer:…` and `charly-image:…` tags that speed up
        /// the next build) and the images nothing else names; box
        /// references stay. The next build loads what it needs from the store.
        #[arg(long)]
        podman: bool,
        /// The podman storage (as `box build --podman-root`).
        #[arg(long, value_name = "DIR", env = "CHARLY_PODMAN_ROOT")]
        podman_root: Option<std::path::PathBuf>,
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

/// Arguments of `cache pull`.
#[derive(clap::Args, Debug)]
pub struct PullArgs {
    /// Boxes whose nodes to pull (default with --all: every enabled box).
    #[arg(value_name = "BOX")]
    pub boxes: Vec<String>,
    /// Every enabled box that resolves.
    #[arg(long)]
    pub all: bool,
    #[command(flatten)]
    pub graph: crate::session::PlannedGraph,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// What `cache pull` did.
#[derive(Debug, Default, Serialize)]
struct PullReport {
    /// Nodes asked for (sources excluded).
    nodes: usize,
    /// In the local store already.
    local: usize,
    /// Fetched, verified, stored.
    pulled: usize,
    /// The remote had none.
    missing: usize,
    /// Refused: the remote's data failed verification.
    corrupt: usize,
    /// The remote could not be asked.
    failed: usize,
    /// Remote figures (bytes down…, messages).
    remote: RemoteStats,
}

/// `cache stats --json` with a remote.
#[derive(Serialize)]
struct StatsWithRemote<'a> {
    #[serde(flatten)]
    local: &'a charly_cache::Stats,
    remote: &'a RemoteSummary,
}

/// The remote part of `cache stats`.
#[derive(Serialize)]
struct RemoteSummary {
    url: String,
    read_only: bool,
    reachable: bool,
    /// Action records in the repository (`k-<key>` tags).
    records: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

fn need_remote(cli: &Cli) -> anyhow::Result<Remote> {
    open_remote(cli)?
        .context("no remote cache: pass --remote oci://HOST[:PORT]/REPO or set CHARLY_REMOTE")
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

/// Runs a cache subcommand.
pub fn run(cli: &Cli, c: &CacheCommand) -> anyhow::Result<ExitCode> {
    let store = open_store(cli)?;
    let _notes = StoreNotes(&store);
    match c {
        CacheCommand::Stats { json } => stats(cli, &store, *json),
        CacheCommand::Push { json } => push(cli, &store, *json),
        CacheCommand::Pull(a) => pull(cli, &store, a),
        CacheCommand::Gc {
            max_size: None,
            podman,
            podman_root,
            json,
        } => {
            let (names, images) = prune_podman(&store, *podman, podman_root)?;
            if *json {
                output::json(&serde_json::json!({"podman_names_removed": names,
                    "podman_images_removed": images}))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        CacheCommand::Gc {
            max_size: Some(max_size),
            podman,
            podman_root,
            json,
        } => gc(&store, *max_size, *podman, podman_root, *json),
        CacheCommand::Verify { repair, json } => verify(&store, *repair, *json),
    }
}

/// `cache stats`: the store's, and the remote's when one is configured.
fn stats(cli: &Cli, store: &Store, json: bool) -> anyhow::Result<ExitCode> {
    let s = store.stats()?;
    let remote = open_remote(cli)?.map(|r| match r.count_records() {
        Ok(n) => RemoteSummary {
            url: r.url().to_string(),
            read_only: r.is_read_only(),
            reachable: true,
            records: Some(n),
            error: None,
        },
        Err(e) => RemoteSummary {
            url: r.url().to_string(),
            read_only: r.is_read_only(),
            reachable: false,
            records: None,
            error: Some(e.to_string()),
        },
    });
    if json {
        match &remote {
            Some(remote) => output::json(&StatsWithRemote { local: &s, remote })?,
            None => output::json(&s)?,
        }
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
        if let Some(r) = &remote {
            writeln!(
                out,
                "remote       {}{}",
                r.url,
                if r.read_only { " (read-only)" } else { "" }
            )?;
            match (&r.records, &r.error) {
                (Some(n), _) => writeln!(out, "  records    {n}")?,
                (None, Some(e)) => writeln!(out, "  unreachable: {e}")?,
                (None, None) => {}
            }
        }
    }
    if remote.as_ref().is_some_and(|r| !r.reachable) && cli.remote_required {
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// `cache push`: every record but sources' to the remote.
fn push(cli: &Cli, store: &Store, json: bool) -> anyhow::Result<ExitCode> {
    let remote = need_remote(cli)?;
    if remote.is_read_only() {
        anyhow::bail!("--remote-read-only: `cache push` would write to the remote");
    }
    let report = remote.push_all(store, &|_, rec| {
        NodeKind::of_record(rec) != Some(NodeKind::Source)
    })?;
    let stats = remote.stats();
    if json {
        output::json(&serde_json::json!({
            "url": remote.url(),
            "pushed": report.pushed,
            "already_present": report.already_present,
            "skipped": report.skipped,
            "bytes_up": report.bytes_up,
            "failures": report.failures.iter().map(|(k, m)| serde_json::json!({"key": k.to_hex(), "error": m})).collect::<Vec<_>>(),
            "errors": stats.errors,
        }))?;
    } else {
        writeln!(
            std::io::stdout().lock(),
            "{}: pushed {} records ({}), {} already there, {} skipped, {} failed",
            remote.url(),
            report.pushed,
            human(report.bytes_up),
            report.already_present,
            report.skipped,
            report.failures.len()
        )?;
        for e in &stats.errors {
            output::error(&format!("remote: {e}"));
        }
    }
    if !report.ok() {
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// `cache gc --max-size`: the store within its budget (and podman's names
/// and images with `--podman`).
fn gc(
    store: &Store,
    max_size: u64,
    podman: bool,
    podman_root: &Option<std::path::PathBuf>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let (names, images) = prune_podman(store, podman, podman_root)?;
    let r = store.gc(max_size)?;
    // The stat cache forgets files that no longer exist.
    if let Err(e) = stat_cache(store).prune() {
        output::note(&format!("could not prune the stat cache: {e}"));
    }
    if json {
        let mut v = serde_json::to_value(&r)?;
        if podman && let Some(m) = v.as_object_mut() {
            m.insert("podman_names_removed".into(), names.into());
            m.insert("podman_images_removed".into(), images.into());
        }
        output::json(&v)?;
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
    Ok(ExitCode::SUCCESS)
}

/// `cache verify [--repair]`.
fn verify(store: &Store, repair: bool, json: bool) -> anyhow::Result<ExitCode> {
    let r = store.verify(repair)?;
    if json {
        output::json(&r)?;
    } else {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{} blobs checked", r.blobs_checked)?;
        if !r.stale_temp_files.is_empty() {
            // Not a problem: leftovers of killed processes, removed.
            writeln!(
                out,
                "removed {} temp files of dead processes",
                r.stale_temp_files.len()
            )?;
        }
        for (what, n) in [
            ("corrupt blobs", r.corrupt_blobs.len()),
            ("blobs missing from the index", r.unindexed_blobs.len()),
            ("indexed blobs missing on disk", r.missing_blobs.len()),
            ("records with missing blobs", r.broken_records.len()),
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
    if !r.is_clean() && !repair {
        output::error("the store has problems; run `charly cache verify --repair`");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// `cache pull`: every non-source node of the graph, fetched in parallel.
fn pull(cli: &Cli, store: &Store, a: &PullArgs) -> anyhow::Result<ExitCode> {
    let remote = need_remote(cli)?;
    let mut o = project::open(cli)?;
    let names = select(&o, &a.boxes, a.all, Unresolved::Warn)?;
    crate::plugins::prepare_build(&mut o, store.dir(), &names)?;
    let g = planned_graph(&o, store, &a.graph, &names)?;
    let keys: Vec<_> =
        g.g.node_indices()
            .map(|i| &g.g[i])
            .filter(|n| n.kind != NodeKind::Source)
            .map(|n| n.key)
            .collect();
    let outcomes: Vec<Result<PullOutcome, charly_cache::CacheError>> = keys
        .par_iter()
        .map(|k| remote.pull_record(store, k))
        .collect();
    let _ = store.flush();
    let mut r = PullReport {
        nodes: keys.len(),
        ..PullReport::default()
    };
    for o in outcomes {
        match o? {
            PullOutcome::Local(_) => r.local += 1,
            PullOutcome::Pulled(_) => r.pulled += 1,
            PullOutcome::Miss => r.missing += 1,
            PullOutcome::Corrupt(_) => r.corrupt += 1,
            PullOutcome::Failed(_) => r.failed += 1,
        }
    }
    r.remote = remote.stats();
    if a.json {
        output::json(&r)?;
    } else {
        writeln!(
            std::io::stdout().lock(),
            "{}: {} nodes: {} pulled ({}), {} local already, {} not in the remote, {} corrupt, {} failed",
            remote.url(),
            r.nodes,
            r.pulled,
            human(r.remote.bytes_down),
            r.local,
            r.missing,
            r.corrupt,
            r.failed
        )?;
        for e in &r.remote.errors {
            output::note(&format!("remote: {e}"));
        }
    }
    Ok(if r.failed > 0 && cli.remote_required {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
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
