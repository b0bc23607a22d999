//! `bundle status`: three-way drift between the ledger (interrupted or
//! failed steps), the disk (what changed behind charly's back) and the
//! configuration (the plan the box makes now); and the sweep of temp files
//! a killed walk left.

use super::managed::find_block;
use super::{WalkError, title};
use crate::host::{Cmd, Host, PathKind, parent, sha256_hex};
use crate::ledger::{BundleRecord, Fact, Ledger, LedgerError, StepRecord, StepState};
use crate::pkg;
use charly_rules::plan::InstallPlan;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// One drift finding.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Drift {
    /// `disk` (changed behind our back), `config` (you changed what you
    /// want), or `ledger` (an interrupted or failed step).
    pub kind: String,
    /// Step.
    pub seq: Option<u32>,
    /// What.
    pub subject: String,
    /// Detail.
    pub detail: String,
}

/// The directories a bundle wrote into (parents of every path its undo
/// operations and facts name): where a killed writer's temp files can be.
fn touched_dirs(steps: &[crate::ledger::StepRecord], plan: Option<&InstallPlan>) -> Vec<String> {
    fn collect(v: &serde_json::Value, out: &mut BTreeSet<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, x) in m {
                    match (k.as_str(), x) {
                        ("path" | "file", serde_json::Value::String(p)) => {
                            if let Some(d) = parent(p) {
                                out.insert(d.to_string());
                            }
                        }
                        _ => collect(x, out),
                    }
                }
            }
            serde_json::Value::Array(a) => {
                for x in a {
                    if let serde_json::Value::String(p) = x
                        && p.starts_with('/')
                    {
                        if let Some(d) = parent(p) {
                            out.insert(d.to_string());
                        }
                    } else {
                        collect(x, out);
                    }
                }
            }
            _ => {}
        }
    }
    let mut out = BTreeSet::new();
    for s in steps {
        for (_, u) in &s.undo {
            if let Ok(v) = serde_json::to_value(u) {
                collect(&v, &mut out);
            }
        }
        for f in &s.facts {
            if let Ok(v) = serde_json::to_value(f) {
                collect(&v, &mut out);
            }
        }
    }
    if let Some(p) = plan {
        for s in &p.steps {
            if let Ok(v) = serde_json::to_value(&s.data) {
                collect(&v, &mut out);
            }
        }
    }
    out.into_iter().filter(|d| d.starts_with('/')).collect()
}

/// Sweeps a bundle's directories for dead writers' temp files; what could
/// not be removed becomes drift.
pub(super) fn sweep(
    host: &mut dyn Host,
    steps: &[crate::ledger::StepRecord],
    plan: Option<&InstallPlan>,
) -> Vec<Drift> {
    let dirs = touched_dirs(steps, plan);
    host.sweep_temps(&dirs)
        .into_iter()
        .map(|(path, why)| Drift {
            kind: "disk".into(),
            seq: None,
            subject: path,
            detail: format!("temp file a killed charly left, not removable: {why}"),
        })
        .collect()
}

/// `bundle status`: compares recorded vs disk, and recorded vs the current plan.
pub fn drift(
    host: &mut dyn Host,
    ledger: &Ledger,
    name: &str,
    current: Option<&InstallPlan>,
) -> Result<Vec<Drift>, WalkError> {
    let rec = ledger
        .get(name)?
        .ok_or_else(|| LedgerError::NotFound(name.into()))?;
    let steps = ledger.steps(name)?;
    let mut out = Vec::new();
    // Temp files of a killed `add`/`del` are removed; those that cannot be are drift.
    if !ledger.is_locked(name) {
        out.extend(sweep(host, &steps, None));
    }
    ledger_drift(&steps, &mut out);
    disk_drift(host, &steps, &mut out)?;
    if let Some(cur) = current {
        config_drift(&rec, &steps, cur, &mut out);
    }
    Ok(out)
}

/// Steps the ledger holds as incomplete (a killed deploy) or failed.
fn ledger_drift(steps: &[StepRecord], out: &mut Vec<Drift>) {
    for s in steps {
        match s.state {
            StepState::Incomplete => out.push(Drift {
                kind: "ledger".into(),
                seq: Some(s.seq),
                subject: s.title.clone(),
                detail: "incomplete: the deploy stopped inside this step (killed?); `charly bundle del` undoes what it did".into(),
            }),
            StepState::Failed => out.push(Drift {
                kind: "ledger".into(),
                seq: Some(s.seq),
                subject: s.title.clone(),
                detail: format!("failed: {}", s.note.clone().unwrap_or_default()),
            }),
            _ => {}
        }
    }
}

/// What is on disk against what each step recorded: files, links,
/// directories, managed blocks, packages.
fn disk_drift(
    host: &mut dyn Host,
    steps: &[StepRecord],
    out: &mut Vec<Drift>,
) -> Result<(), WalkError> {
    // Disk vs recorded: one stat round trip for every path fact.
    let mut paths = Vec::new();
    for s in steps {
        for f in &s.facts {
            match f {
                Fact::File { path, .. } | Fact::Symlink { path, .. } | Fact::Dir { path } => {
                    paths.push(path.clone());
                }
                _ => {}
            }
        }
    }
    let stats = host.stat(&paths, true)?;
    let by_path: BTreeMap<&str, Option<&crate::host::Stat>> = paths
        .iter()
        .map(String::as_str)
        .zip(stats.iter().map(Option::as_ref))
        .collect();
    for s in steps {
        for f in &s.facts {
            let d = |detail: String| Drift {
                kind: "disk".into(),
                seq: Some(s.seq),
                subject: f.subject(),
                detail,
            };
            match f {
                Fact::File { path, sha256, mode } => {
                    match by_path.get(path.as_str()).copied().flatten() {
                        None => out.push(d("deleted".into())),
                        Some(st) => match &st.kind {
                            PathKind::File { sha256: Some(h) } if h != sha256 => {
                                out.push(d("content changed".into()));
                            }
                            PathKind::File { .. } if st.mode != *mode => {
                                out.push(d(format!("mode {:04o}, deployed {mode:04o}", st.mode)));
                            }
                            PathKind::File { .. } => {}
                            _ => out.push(d("no longer a regular file".into())),
                        },
                    }
                }
                Fact::Symlink { path, target } => {
                    match by_path.get(path.as_str()).copied().flatten() {
                        Some(crate::host::Stat {
                            kind: PathKind::Symlink { target: t },
                            ..
                        }) if t == target => {}
                        None => out.push(d("deleted".into())),
                        _ => out.push(d(format!("no longer a link to {target}"))),
                    }
                }
                Fact::Dir { path } => {
                    if !matches!(
                        by_path
                            .get(path.as_str())
                            .copied()
                            .flatten()
                            .map(|s| &s.kind),
                        Some(PathKind::Dir)
                    ) {
                        out.push(d("directory missing".into()));
                    }
                }
                Fact::Block {
                    file,
                    marker,
                    sha256,
                } => {
                    let text = host
                        .read_file(file, false)?
                        .map(|b| String::from_utf8_lossy(&b).into_owned());
                    match text.as_deref().and_then(|t| find_block(t, marker)) {
                        None => out.push(d("managed block removed".into())),
                        Some(b) if sha256_hex(b.as_bytes()) != *sha256 => {
                            out.push(d("managed block edited".into()));
                        }
                        Some(_) => {}
                    }
                }
                Fact::Packages {
                    format,
                    packages,
                    root,
                } => {
                    if let Some(q) = pkg::query_script(format, packages, root.as_deref()) {
                        let o = host.run(&Cmd::sh(q))?;
                        match pkg::parse_installed(format, &o.stdout_str()) {
                            Ok(set) => {
                                let gone: Vec<&str> = packages
                                    .iter()
                                    .filter(|p| !set.contains(*p))
                                    .map(String::as_str)
                                    .collect();
                                if !gone.is_empty() {
                                    out.push(d(format!("no longer installed: {}", gone.join(" "))));
                                }
                            }
                            Err(e) => out.push(d(format!("cannot query: {e}"))),
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// The current plan against the one deployed: the deploy id, and each
/// step changed, new or gone.
fn config_drift(rec: &BundleRecord, steps: &[StepRecord], cur: &InstallPlan, out: &mut Vec<Drift>) {
    let mut cur = cur.clone();
    cur.resolve_home(&rec.home);
    if cur.deploy_id != rec.deploy_id {
        out.push(Drift {
            kind: "config".into(),
            seq: None,
            subject: format!("box {}", rec.box_name),
            detail: format!(
                "candies changed (deploy id {} now, {} deployed)",
                cur.deploy_id, rec.deploy_id
            ),
        });
    }
    let n = cur.steps.len().max(steps.len());
    for i in 0..n {
        let now = cur.steps.get(i);
        let was = steps.iter().find(|s| s.seq as usize == i);
        match (now, was) {
            (Some(a), Some(b)) => {
                let v = serde_json::to_value(a).unwrap_or_default();
                if v != b.step {
                    let mut changes = Vec::new();
                    json_diff("", &b.step, &v, &mut changes);
                    let more = changes.len().saturating_sub(3);
                    changes.truncate(3);
                    out.push(Drift {
                        kind: "config".into(),
                        seq: Some(i as u32),
                        subject: b.title.clone(),
                        detail: format!(
                            "changed in the plan: {}{}",
                            changes.join("; "),
                            if more > 0 {
                                format!(" (and {more} more)")
                            } else {
                                String::new()
                            }
                        ),
                    });
                }
            }
            (Some(a), None) => out.push(Drift {
                kind: "config".into(),
                seq: Some(i as u32),
                subject: title(a),
                detail: "new step, not deployed".into(),
            }),
            (None, Some(b)) => out.push(Drift {
                kind: "config".into(),
                seq: Some(i as u32),
                subject: b.title.clone(),
                detail: "no longer in the plan".into(),
            }),
            (None, None) => {}
        }
    }
}

/// What differs between a step as deployed (`was`) and as the plan says
/// now, field by field: `path: old → new`, values shortened.
fn json_diff(at: &str, was: &serde_json::Value, now: &serde_json::Value, out: &mut Vec<String>) {
    use serde_json::Value;
    let field = |k: &str| {
        if at.is_empty() {
            k.to_string()
        } else {
            format!("{at}.{k}")
        }
    };
    match (was, now) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                let null = Value::Null;
                json_diff(
                    &field(k),
                    a.get(k).unwrap_or(&null),
                    b.get(k).unwrap_or(&null),
                    out,
                );
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                json_diff(&format!("{at}[{i}]"), x, y, out);
            }
        }
        (a, b) if a != b => {
            let show = |v: &Value| {
                let s = v.to_string();
                if s.chars().count() > 60 {
                    format!("{}…", s.chars().take(59).collect::<String>())
                } else {
                    s
                }
            };
            out.push(format!(
                "{}: {} → {}",
                if at.is_empty() { "step" } else { at },
                show(a),
                show(b)
            ));
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::json_diff;

    #[test]
    fn step_diffs_name_the_fields() {
        let mut out = Vec::new();
        json_diff(
            "",
            &serde_json::json!({"path": "/a", "content": "x", "list": [1, 2]}),
            &serde_json::json!({"path": "/a", "content": "y", "list": [1, 3], "mode": "0600"}),
            &mut out,
        );
        assert_eq!(
            out,
            [
                r#"content: "x" → "y""#,
                "list[1]: 2 → 3",
                r#"mode: null → "0600""#
            ]
        );
    }
}
