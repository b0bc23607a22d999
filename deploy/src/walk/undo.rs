//! Undoing a bundle (`bundle del`): its recorded undo operations, last
//! first, each removed from the ledger once carried out so an interrupted
//! `del` resumes where it stopped.

use super::drift::sweep;
use super::managed::{find_block, strip_block};
use super::{R, WalkError};
use crate::host::{Cmd, FileAttrs, Host, HostError, PathKind, sha256_hex};
use crate::ledger::{BundleState, Fact, Ledger, LedgerError, StepRecord, Undo};
use crate::pkg;
use serde::Serialize;
use std::collections::BTreeMap;

/// One undo operation's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct UndoReport {
    /// Step.
    pub seq: u32,
    /// What.
    pub what: String,
    /// `done`, `warning`.
    pub state: String,
    /// Detail.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Undoes a bundle: its undo operations LIFO, each deleted from the ledger
/// as it succeeds (an interrupted `del` resumes), then the record. A file
/// changed since the deploy is kept ([`remove_with`] with `force` removes
/// it).
pub fn remove(
    host: &mut dyn Host,
    ledger: &mut Ledger,
    name: &str,
    dry_run: bool,
    progress: &mut dyn FnMut(&UndoReport),
) -> Result<Vec<UndoReport>, WalkError> {
    remove_with(
        host,
        ledger,
        name,
        &DelOptions {
            dry_run,
            force: false,
        },
        progress,
    )
}

/// How `bundle del` undoes.
#[derive(Clone, Copy, Debug, Default)]
pub struct DelOptions {
    /// Report what would be undone; change nothing.
    pub dry_run: bool,
    /// Also remove (or restore over) files changed since the deploy.
    pub force: bool,
}

/// [`remove`] with options.
pub fn remove_with(
    host: &mut dyn Host,
    ledger: &mut Ledger,
    name: &str,
    opts: &DelOptions,
    progress: &mut dyn FnMut(&UndoReport),
) -> Result<Vec<UndoReport>, WalkError> {
    let dry_run = opts.dry_run;
    let rec = ledger
        .get(name)?
        .ok_or_else(|| LedgerError::NotFound(name.into()))?;
    let _lock = if dry_run {
        None
    } else {
        Some(ledger.lock(name)?)
    };
    if !dry_run {
        ledger.set_state(name, BundleState::Removing, None)?;
    }
    if !dry_run {
        let steps = ledger.steps(name)?;
        for d in sweep(host, &steps, None) {
            progress(&UndoReport {
                seq: 0,
                what: d.subject,
                state: "warning".into(),
                note: Some(d.detail),
            });
        }
    }
    let out = undo_from(
        host,
        ledger,
        &rec.target_key,
        name,
        0,
        opts,
        &format!("charly bundle del {name}"),
        progress,
    )?;
    if !dry_run {
        ledger.remove(name)?;
    }
    Ok(out)
}

/// Carries out the undo operations of bundle `name`'s steps from `from`
/// on, last first, each deleted from the ledger once done (`resume` is
/// the command that goes on after a failure). The caller holds the lock.
#[allow(clippy::too_many_arguments)]
pub(super) fn undo_from(
    host: &mut dyn Host,
    ledger: &mut Ledger,
    target_key: &str,
    name: &str,
    from: u32,
    opts: &DelOptions,
    resume: &str,
    progress: &mut dyn FnMut(&UndoReport),
) -> Result<Vec<UndoReport>, WalkError> {
    let dry_run = opts.dry_run;
    let steps = ledger.steps(name)?;
    let mut ops: Vec<(u32, u32, Undo)> = steps
        .iter()
        .filter(|s| s.seq >= from)
        .flat_map(|s| s.undo.iter().map(move |(i, u)| (s.seq, *i, u.clone())))
        .collect();
    ops.sort_by_key(|o| std::cmp::Reverse((o.0, o.1)));
    // What the deploy left in each file it wrote (the last step's word).
    let left: BTreeMap<String, String> = steps
        .iter()
        .flat_map(|s| &s.facts)
        .filter_map(|f| match f {
            Fact::File { path, sha256, .. } => Some((path.clone(), sha256.clone())),
            _ => None,
        })
        .collect();
    let cx = UndoCx {
        left: &left,
        force: opts.force,
    };
    // The other bundles on the same target: what they still need is handed
    // over to them instead of undone.
    let mut others: Vec<Other> = ledger
        .list()?
        .into_iter()
        .filter(|o| o.name != name && o.target_key == target_key)
        .map(|o| {
            ledger.steps(&o.name).map(|steps| Other {
                name: o.name,
                steps,
            })
        })
        .collect::<Result<_, _>>()?;
    let mut out = Vec::new();
    for (seq, idx, op) in ops {
        let what = op.describe();
        if dry_run {
            let r = UndoReport {
                seq,
                what,
                state: "would-run".into(),
                note: None,
            };
            progress(&r);
            out.push(r);
            continue;
        }
        let res = match share(host, ledger, name, &mut others, &left, op) {
            Err(e) => Err(e),
            Ok(Shared::Handed(note)) => {
                ledger.done_undo(name, seq, idx)?;
                let r = UndoReport {
                    seq,
                    what,
                    state: "handed-over".into(),
                    note: Some(note),
                };
                progress(&r);
                out.push(r);
                continue;
            }
            Ok(Shared::Mine(op, shared)) => {
                undo_one(host, ledger, name, &op, &cx).map(|w| match (shared, w) {
                    (Some(n), Some(w)) => Some(format!("{n}; {w}")),
                    (n, w) => n.or(w),
                })
            }
        };
        let (state, note) = match res {
            Ok(None) => ("done", None),
            Ok(Some(w)) => ("warning", Some(w)),
            Err(e) => {
                let r = UndoReport {
                    seq,
                    what: what.clone(),
                    state: "failed".into(),
                    note: Some(e.clone()),
                };
                progress(&r);
                ledger.set_state(name, BundleState::Removing, Some(&e))?;
                return Err(WalkError::Step {
                    seq,
                    title: what,
                    message: format!("{e} (run `{resume}` again to resume)"),
                    not_attempted: Vec::new(),
                });
            }
        };
        ledger.done_undo(name, seq, idx)?;
        let r = UndoReport {
            seq,
            what,
            state: state.into(),
            note,
        };
        progress(&r);
        out.push(r);
    }
    Ok(out)
}

/// Another bundle on the same target, with its steps as recorded.
struct Other {
    name: String,
    steps: Vec<StepRecord>,
}

/// An undo operation after checking what other bundles on the target
/// still need.
enum Shared {
    /// Carry it out (what others need taken out of it; why, if so).
    Mine(Undo, Option<String>),
    /// All of it was handed over to another bundle (why).
    Handed(String),
}

/// Takes out of `op` what other bundles on the same target still need, and
/// hands it over to them in the ledger: packages another bundle installs
/// too are removed by whichever bundle goes last; a file another bundle
/// wrote last (its recorded content is what is there now) is left to it,
/// and its own undo of that file becomes this one's (so its `del` puts
/// back what was there before either, not what this bundle wrote).
fn share(
    host: &mut dyn Host,
    ledger: &mut Ledger,
    me: &str,
    others: &mut [Other],
    left: &BTreeMap<String, String>,
    op: Undo,
) -> R<Shared> {
    let lerr = |e: LedgerError| e.to_string();
    if others.is_empty() {
        return Ok(Shared::Mine(op, None));
    }
    match op {
        Undo::RemovePackages {
            format,
            packages,
            command,
            root,
        } => {
            // Package → (other bundle, its step) that still has it.
            let mut held: BTreeMap<(usize, u32), Vec<String>> = BTreeMap::new();
            for p in &packages {
                let holder = others.iter().enumerate().find_map(|(i, o)| {
                    o.steps.iter().find_map(|s| {
                        s.facts
                            .iter()
                            .any(|f| {
                                matches!(f, Fact::Packages { format: f2, packages: ps, root: r2 }
                                    if *f2 == format && *r2 == root && ps.contains(p))
                            })
                            .then_some((i, s.seq))
                    })
                });
                if let Some(at) = holder {
                    held.entry(at).or_default().push(p.clone());
                }
            }
            // One step's packages go together: they include the
            // dependencies the install pulled in, and removing one of
            // those would take a package the other bundle needs with it.
            // So when any is still needed, all of them are handed over.
            let Some(((i, seq), _)) = held.iter().next() else {
                return Ok(Shared::Mine(
                    Undo::RemovePackages {
                        format,
                        packages,
                        command,
                        root,
                    },
                    None,
                ));
            };
            let o = &others[*i];
            let handed = Undo::RemovePackages {
                format: format.clone(),
                command: pkg::remove_script(&format, &packages, root.as_deref()),
                packages: packages.clone(),
                root: root.clone(),
            };
            ledger
                .hand_over(me, &o.name, *seq, &[], &handed)
                .map_err(lerr)?;
            let needed: Vec<String> = held.values().flatten().cloned().collect();
            let note = format!(
                "kept {} (bundle {} still needs {})",
                packages.join(" "),
                o.name,
                needed.join(" ")
            );
            Ok(Shared::Handed(note))
        }
        Undo::RemovePath {
            ref path,
            privileged,
        }
        | Undo::RestoreFile {
            ref path,
            privileged,
            ..
        } => {
            // What this bundle left there (nothing recorded: not shared).
            let Some(mine) = left.get(path) else {
                return Ok(Shared::Mine(op, None));
            };
            // Only a regular file is shared (a link or a directory there is
            // the undo's own business).
            let is_file = host
                .stat(std::slice::from_ref(path), false)
                .map_err(|e| e.to_string())?
                .pop()
                .flatten()
                .is_some_and(|st| matches!(st.kind, PathKind::File { .. }));
            let now = if is_file {
                host.read_file(path, privileged)
                    .map_err(|e| e.to_string())?
                    .map(|d| sha256_hex(&d))
            } else {
                None
            };
            let Some(now) = now else {
                return Ok(Shared::Mine(op, None));
            };
            // The bundle that wrote it last: what is there now is what it
            // left, and its undo puts back what this bundle left.
            let holder = others.iter().enumerate().find_map(|(i, o)| {
                o.steps.iter().find_map(|s| {
                    let wrote_now = s.facts.iter().any(
                        |f| matches!(f, Fact::File { path: p, sha256, .. } if p == path && *sha256 == now),
                    );
                    let over_mine: Vec<u32> = s
                        .undo
                        .iter()
                        .filter(|(_, u)| {
                            matches!(u, Undo::RestoreFile { path: p, sha256, .. } if p == path && sha256 == mine)
                        })
                        .map(|(idx, _)| *idx)
                        .collect();
                    (wrote_now && !over_mine.is_empty()).then_some((i, s.seq, over_mine))
                })
            });
            let Some((i, seq, replace)) = holder else {
                return Ok(Shared::Mine(op, None));
            };
            let to = others[i].name.clone();
            ledger
                .hand_over(me, &to, seq, &replace, &op)
                .map_err(lerr)?;
            // Its steps changed: read them again for the next operation.
            others[i].steps = ledger.steps(&to).map_err(lerr)?;
            Ok(Shared::Handed(format!(
                "{path} was written last by bundle {to}: left to it (its `del` now puts back \
                 what this one would have)"
            )))
        }
        op => Ok(Shared::Mine(op, None)),
    }
}

/// What every undo operation of one `del` may consult.
struct UndoCx<'a> {
    /// sha256 of what the deploy left in each file it wrote.
    left: &'a BTreeMap<String, String>,
    /// Remove or restore over changed files too.
    force: bool,
}

impl UndoCx<'_> {
    /// Whether `path` must be kept: it was changed since the deploy wrote
    /// it, and `--force` was not given.
    fn keeps(&self, host: &mut dyn Host, path: &str, privileged: bool) -> R<bool> {
        let Some(want) = self.left.get(path).filter(|_| !self.force) else {
            return Ok(false);
        };
        let now = host
            .read_file(path, privileged)
            .map_err(|x| x.to_string())?;
        Ok(now.is_some_and(|d| sha256_hex(&d) != *want))
    }
}

fn undo_one(
    host: &mut dyn Host,
    ledger: &Ledger,
    name: &str,
    op: &Undo,
    cx: &UndoCx<'_>,
) -> R<Option<String>> {
    let e = |x: HostError| x.to_string();
    match op {
        Undo::RemovePath { path, privileged } => {
            let st = host
                .stat(std::slice::from_ref(path), false)
                .map_err(e)?
                .pop()
                .flatten()
                .map(|s| s.kind);
            if matches!(st, Some(PathKind::Dir)) {
                return Ok(Some(format!("{path} is now a directory; left alone")));
            }
            if matches!(st, Some(PathKind::File { .. })) && cx.keeps(host, path, *privileged)? {
                return Ok(Some(format!(
                    "{path} was changed since the deploy; kept as it is now \
                     (`bundle del --force` removes changed files)"
                )));
            }
            host.remove(path, *privileged).map_err(e)?;
            Ok(None)
        }
        Undo::RemoveDir { path, privileged } => {
            if host.remove(path, *privileged).map_err(e)? {
                Ok(None)
            } else {
                Ok(Some(format!("{path} is not empty; left in place")))
            }
        }
        Undo::RestoreFile {
            path,
            sha256,
            mode,
            uid,
            gid,
            privileged,
        } => {
            if cx.keeps(host, path, *privileged)? {
                return Ok(Some(format!(
                    "{path} was changed since the deploy; kept as it is now \
                     (`bundle del --force` puts back what was there before)"
                )));
            }
            let data = ledger
                .blob(name, sha256)
                .map_err(|x| x.to_string())?
                .ok_or_else(|| format!("the backup of {path} is missing from the ledger"))?;
            host.write_file(
                path,
                &data,
                &FileAttrs {
                    mode: *mode,
                    owner: Some((*uid, *gid)),
                    privileged: *privileged,
                },
            )
            .map_err(e)?;
            Ok(None)
        }
        Undo::RestoreSymlink {
            path,
            target,
            privileged,
        } => {
            host.remove(path, *privileged).map_err(e)?;
            host.symlink(
                path,
                target,
                &FileAttrs {
                    mode: 0o777,
                    owner: None,
                    privileged: *privileged,
                },
            )
            .map_err(e)?;
            Ok(None)
        }
        Undo::RemoveTree { paths, privileged } => {
            let mut left = 0;
            for p in paths.iter().rev() {
                if !host.remove(p, *privileged).map_err(e)? {
                    left += 1;
                }
            }
            Ok((left > 0).then(|| format!("{left} directories were not empty; left in place")))
        }
        Undo::RemoveBlock {
            file,
            marker,
            added_newline,
            created_file,
            privileged,
        } => {
            let Some(old) = host.read_file(file, *privileged).map_err(e)? else {
                return Ok(Some(format!("{file} is gone")));
            };
            let text = String::from_utf8(old).map_err(|_| format!("{file} is not UTF-8"))?;
            if find_block(&text, marker).is_none() {
                return Ok(None);
            }
            let mut rest = strip_block(&text, marker);
            if *added_newline && rest.ends_with('\n') {
                rest.pop();
            }
            if *created_file && rest.is_empty() {
                host.remove(file, *privileged).map_err(e)?;
                return Ok(None);
            }
            let st = host
                .stat(std::slice::from_ref(file), false)
                .map_err(e)?
                .pop()
                .flatten();
            let (mode, uid, gid) = st.map_or((0o644, 0, 0), |s| (s.mode, s.uid, s.gid));
            host.write_file(
                file,
                rest.as_bytes(),
                &FileAttrs {
                    mode,
                    owner: Some((uid, gid)),
                    privileged: *privileged,
                },
            )
            .map_err(e)?;
            Ok(None)
        }
        Undo::RemovePackages {
            format,
            packages,
            command,
            root,
        } => {
            let q = pkg::query_script(format, packages, root.as_deref())
                .ok_or_else(|| format!("unknown package format {format}"))?;
            let out = host.run(&Cmd::sh(q)).map_err(e)?;
            let still = pkg::parse_installed(format, &out.stdout_str())?;
            let present: Vec<String> = packages
                .iter()
                .filter(|p| still.contains(*p))
                .cloned()
                .collect();
            if present.is_empty() {
                return Ok(None);
            }
            let cmd = if present.len() == packages.len() {
                command.clone()
            } else {
                pkg::remove_script(format, &present, root.as_deref())
            };
            let out = host.run(&Cmd::sh(cmd).privileged(true)).map_err(e)?;
            if !out.ok() {
                return Err(format!(
                    "removing packages: exit {}: {}",
                    out.status,
                    out.stderr_tail()
                ));
            }
            Ok(None)
        }
        Undo::Run {
            what,
            script,
            privileged,
            as_user,
            env,
            ignore_failure,
        } => {
            let mut c = Cmd::sh(script.clone()).privileged(*privileged);
            c.as_user.clone_from(as_user);
            for (k, v) in env {
                c.env.insert(k.clone(), v.clone());
            }
            let out = host.run(&c).map_err(e)?;
            if out.ok() {
                Ok(None)
            } else if *ignore_failure {
                Ok(Some(format!("{what}: exit {} (ignored)", out.status)))
            } else {
                Err(format!(
                    "{what}: exit {}: {}",
                    out.status,
                    out.stderr_tail()
                ))
            }
        }
        Undo::Note { text } => Ok(Some(text.clone())),
    }
}
