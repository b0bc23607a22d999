//! `--remote-exec`: command nodes run on a Remote Execution API v2 engine.

use anyhow::Context;
use charly_engine::runners::Runner;
use charly_engine::runners::remote::{Place, RemoteOptions, RemoteRunner, RemoteStats};
use charly_engine::sched::Summary;
use std::time::Duration;

/// Options of remote execution.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct RemoteExecArgs {
    /// Run command nodes (builder stages and local-package builds) on a
    /// Remote Execution API v2 engine (Buildbarn, BuildBuddy, NativeLink,
    /// EngFlow, BuildGrid, buildbox-casd): `grpc://HOST:PORT[/INSTANCE]`, or
    /// `grpcs://…` for TLS. A bearer token is sent from $CHARLY_REMOTE_TOKEN
    /// or the file named by $CHARLY_REMOTE_TOKEN_FILE. Results are verified
    /// digest by digest, then stored locally like local results. Image
    /// builds and rootfs bootstraps stay local; builder stages run in their
    /// builder image (the `container-image` property, or
    /// --remote-stage-rootfs) and stay local with --remote-no-image-property
    /// alone.
    #[arg(long, value_name = "URL", env = "CHARLY_REMOTE_EXEC")]
    pub remote_exec: Option<String>,
    /// At most N actions on the engine at once.
    #[arg(long, value_name = "N", default_value_t = 8, requires = "remote_exec")]
    pub remote_jobs: usize,
    /// Run a node locally when the engine is unreachable or refuses it
    /// (never when its command fails remotely).
    #[arg(long, requires = "remote_exec")]
    pub remote_fallback: bool,
    /// Do not send the `container-image=docker://<build image>` platform
    /// property (for engines that run commands with their own tools instead
    /// of pulling the image, e.g. buildbox-run with bubblewrap and no registry).
    #[arg(long, requires = "remote_exec")]
    pub remote_no_image_property: bool,
    /// Send builder stages with the builder image's root filesystem as the
    /// action's input root instead of naming the image: for engines that
    /// only sandbox commands (buildbox-run with bubblewrap) and must not
    /// bind host directories over it. The image's files are uploaded once
    /// per engine.
    #[arg(long, requires = "remote_exec")]
    pub remote_stage_rootfs: bool,
    /// An extra platform property of every action, `KEY=VALUE`
    /// (repeatable): what the engine needs to run them, e.g. `network=on`
    /// for buildbox-run or `dockerNetwork=bridge` for BuildBuddy. Part of
    /// each action's digest.
    #[arg(long, value_name = "KEY=VALUE", value_parser = parse_property, requires = "remote_exec")]
    pub remote_platform: Vec<(String, String)>,
    /// Timeout of one remote action, in seconds.
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 3600,
        requires = "remote_exec"
    )]
    pub remote_timeout: u64,
}

fn parse_property(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("`{s}` is not KEY=VALUE")),
    }
}

/// The runner: remote over `local` when `--remote-exec` is given. With
/// `--remote-fallback`, an unreachable engine means a local run with a note.
pub fn wrap<'a>(
    a: &RemoteExecArgs,
    local: &'a dyn Runner,
    arch: &str,
) -> anyhow::Result<Option<RemoteRunner<'a>>> {
    let Some(url) = &a.remote_exec else {
        return Ok(None);
    };
    if a.remote_jobs == 0 {
        anyhow::bail!("--remote-jobs must be at least 1");
    }
    let opts = RemoteOptions {
        jobs: a.remote_jobs,
        fallback: a.remote_fallback,
        image_property: !a.remote_no_image_property,
        stage_rootfs: a.remote_stage_rootfs,
        platform: a.remote_platform.iter().cloned().collect(),
        isa: charly_engine::runners::remote::isa_of(arch).to_string(),
        timeout: Some(Duration::from_secs(a.remote_timeout.max(1))),
    };
    match RemoteRunner::connect(url, local, opts) {
        Ok(r) => Ok(Some(r)),
        Err(e) if a.remote_fallback => {
            crate::output::note(&format!(
                "{}; running every node locally (--remote-fallback)",
                e.message
            ));
            Ok(None)
        }
        Err(e) => Err(anyhow::anyhow!(e.message)).context("--remote-exec"),
    }
}

fn place_str(p: &Place) -> &'static str {
    match p {
        Place::Remote => "remote",
        Place::RemoteCached => "remote-cached",
        Place::LocalFallback => "local-fallback",
        Place::Local => "local",
    }
}

/// The summary JSON with `remote` (per node: where it ran, action digest,
/// bytes) and the trace with `where` in each event's args.
pub fn write_reports(
    run: &crate::engine_cmd::RunArgs,
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

/// `remote: N executed, N from the engine's action cache, N local fallback`.
pub fn line(stats: &RemoteStats) -> String {
    let count = |p: Place| stats.values().filter(|r| r.place == p).count();
    format!(
        "remote: {} executed, {} from the engine's action cache, {} local fallback",
        count(Place::Remote),
        count(Place::RemoteCached),
        count(Place::LocalFallback)
    )
}
