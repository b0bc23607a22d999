//! What a run reports: the summary line, failed and not-attempted nodes,
//! what the remote cache and remote execution did (stderr), and the report
//! files (`--summary-json`, `--trace`, `--junit`).
//!
//! Depends on no command module: commands call in, never the other way.

use crate::output;
use crate::session::RunArgs;
use anyhow::Context;
use charly_engine::check::{BedReport, junit};
use charly_engine::runners::remote::{Place, RemoteStats};
use charly_engine::sched::{State, Summary};
use std::path::Path;

/// `<verb>: N nodes, N ran, N cached[, N pulled], N failed[…] in N ms`.
pub fn summary_line(verb: &str, s: &Summary) -> String {
    let t = &s.totals;
    let mut line = format!(
        "{verb}: {} nodes, {} ran, {} cached",
        t.nodes, t.ran, t.cached
    );
    if s.remote.is_some() {
        line.push_str(&format!(", {} pulled", t.pulled));
    }
    line.push_str(&format!(", {} failed", t.failed));
    if t.not_attempted > 0 {
        line.push_str(&format!(", {} not attempted", t.not_attempted));
    }
    if t.would_run > 0 {
        line.push_str(&format!(", {} would run", t.would_run));
    }
    line.push_str(&format!(" in {} ms", t.wall_ms));
    line
}

/// `critical path: N nodes, S s (a → b → … → z); work S s in S s wall,
/// F× parallel[, S s of it on the engine]`, when something ran: no number
/// of workers makes the run shorter than its critical path, and the factor
/// says how many nodes ran at once on average.
pub fn critical_line(s: &Summary, remote: Option<&RemoteStats>) -> Option<String> {
    let c = s.critical.as_ref()?;
    let secs = |ms: u64| format!("{:.1} s", ms as f64 / 1000.0);
    let path = if c.path.len() > 6 {
        format!(
            "{} → … → {}",
            c.path[..3].join(" → "),
            c.path[c.path.len() - 2..].join(" → ")
        )
    } else {
        c.path.join(" → ")
    };
    let wall = s.totals.wall_ms.max(1);
    let mut line = format!(
        "critical path: {} node{}, {} ({path}); work {} in {} wall, {:.1}× parallel",
        c.path.len(),
        if c.path.len() == 1 { "" } else { "s" },
        secs(c.path_ms),
        secs(c.work_ms),
        secs(wall),
        c.work_ms as f64 / wall as f64
    );
    if let Some(stats) = remote {
        let on_engine: u64 = s
            .nodes
            .iter()
            .filter(|n| n.state == State::Ran)
            .filter(|n| {
                stats
                    .get(&n.id)
                    .is_some_and(|r| matches!(r.place, Place::Remote | Place::RemoteCached))
            })
            .map(|n| n.duration_ms)
            .sum();
        line.push_str(&format!(", {} of it on the engine", secs(on_engine)));
    }
    Some(line)
}

/// Names every failed node with its error, on stderr.
pub fn report_failed(summary: &Summary) {
    for n in &summary.nodes {
        if n.state == State::Failed {
            output::error(&format!(
                "{} failed: {}",
                n.id,
                n.error.as_deref().unwrap_or("")
            ));
        }
    }
}

/// [`report_failed`], then the nodes a failure left not attempted.
pub fn report_failures(summary: &Summary) {
    report_failed(summary);
    let not: Vec<&str> = summary
        .nodes
        .iter()
        .filter(|n| n.state == State::NotAttempted)
        .map(|n| n.id.as_str())
        .collect();
    if !not.is_empty() {
        output::error(&format!(
            "not attempted ({}): {}",
            not.len(),
            not.join(", ")
        ));
    }
}

/// [`report_remote`], except that `-q` silences it unless the remote had problems.
pub fn report_remote_unless_quiet(summary: &Summary, quiet: bool) {
    if !quiet
        || summary
            .remote
            .as_ref()
            .is_some_and(|r| !r.stats.errors.is_empty())
    {
        report_remote(summary);
    }
}

/// Prints what the remote did, and its problems, on stderr.
pub fn report_remote(summary: &Summary) {
    let Some(r) = &summary.remote else { return };
    output::note(&r.line());
    for e in &r.stats.errors {
        if r.required && r.has_failures() {
            output::error(&format!("remote: {e}"));
        } else {
            output::note(&format!("remote: {e}"));
        }
    }
}

/// `remote: N executed, N from the engine's action cache, N local fallback`.
pub fn remote_exec_line(stats: &RemoteStats) -> String {
    let count = |p: Place| stats.values().filter(|r| r.place == p).count();
    format!(
        "remote: {} executed, {} from the engine's action cache, {} local fallback",
        count(Place::Remote),
        count(Place::RemoteCached),
        count(Place::LocalFallback)
    )
}

/// Writes the summary JSON to `p`.
pub fn write_summary_json(p: &Path, summary: &Summary) -> anyhow::Result<()> {
    std::fs::write(p, serde_json::to_vec_pretty(summary)?)
        .with_context(|| format!("writing {}", p.display()))
}

/// Writes `--summary-json` and `--trace`, when asked for.
pub fn write_reports(run: &RunArgs, summary: &Summary) -> anyhow::Result<()> {
    if let Some(p) = &run.summary_json {
        write_summary_json(p, summary)?;
    }
    if let Some(p) = &run.trace {
        std::fs::write(p, serde_json::to_vec(&summary.chrome_trace())?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

fn place_str(p: &Place) -> &'static str {
    match p {
        Place::Remote => "remote",
        Place::RemoteCached => "remote-cached",
        Place::LocalFallback => "local-fallback",
        Place::Local => "local",
    }
}

/// [`write_reports`] of a run with remote execution: the summary JSON with
/// `remote` (per node: where it ran, action digest, bytes) and the trace
/// with `where` in each event's args.
pub fn write_remote_exec_reports(
    run: &RunArgs,
    summary: &Summary,
    stats: &RemoteStats,
) -> anyhow::Result<()> {
    if let Some(p) = &run.summary_json {
        let mut v = serde_json::to_value(summary)?;
        if let Some(nodes) = v.get_mut("nodes").and_then(|n| n.as_array_mut()) {
            for n in nodes {
                let id = n
                    .get("id")
                    .and_then(|i| i.as_str())
                    .unwrap_or_default()
                    .to_string();
                if let Some(r) = stats.get(&id) {
                    n["remote"] = serde_json::to_value(r)?;
                }
            }
        }
        std::fs::write(p, serde_json::to_vec_pretty(&v)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &run.trace {
        let mut t = summary.chrome_trace();
        if let Some(events) = t.get_mut("traceEvents").and_then(|e| e.as_array_mut()) {
            for e in events {
                let id = e
                    .get("name")
                    .and_then(|i| i.as_str())
                    .unwrap_or_default()
                    .to_string();
                if let Some(r) = stats.get(&id) {
                    e["args"]["where"] = place_str(&r.place).into();
                    e["args"]["action"] = r.action_digest.clone().into();
                }
            }
        }
        std::fs::write(p, serde_json::to_vec(&t)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

/// Writes the JUnit XML of `charly check` to `p`.
pub fn write_junit(p: &Path, reports: &[BedReport]) -> anyhow::Result<()> {
    std::fs::write(p, junit(reports)).with_context(|| format!("writing {}", p.display()))
}
