//! Undoing a bundle (`bundle del`): its recorded undo operations, last
//! first, each removed from the ledger once carried out so an interrupted
//! `del` resumes where it stopped.
//!
//! **Sharing.** Bundles on one target (one machine, or one root on it:
//! [`Connection::host_key`](crate::ledger::Connection::host_key)) can change
//! the same thing: a file both write, a managed block both add, a service
//! both enable, a package both need, a directory both put files in. Each
//! undo operation puts back what was there before *its* change, and the
//! ledger orders every operation of every bundle (`at`), so each thing has
//! a chain of changes, first one first. Deleting a bundle takes its links
//! out of those chains:
//!
//! * another bundle changed the thing later: this bundle's undo goes to
//!   that bundle, in place of its own (which would put back what this one
//!   left); the target does not change, and that bundle's `del` puts back
//!   what was there before either;
//! * this bundle changed it last: its undo runs, putting back what the
//!   bundle before it left (or what was there before any, when it was the
//!   only one), under the rule for files changed since the deploy (kept
//!   unless `--force`);
//! * a package goes by need: when another bundle's step needs one of the
//!   packages an undo would remove, the whole removal is handed to it;
//! * a directory another bundle still has something in (or needs itself)
//!   is kept and remembered; the `del` after which no bundle needs it
//!   removes it (if empty).
//!
//! So the last `del` on a target leaves it as it was before the first
//! `add`, whatever the order of the `add`s and `del`s. The caller holds the
//! target's lock ([`Ledger::lock_host`]): no other bundle on the target
//! changes while the chains are read and changed.

use super::drift::sweep;
use super::managed::{find_block, replace_block, strip_block};
use super::{R, WalkError};
use crate::host::{Cmd, FileAttrs, Host, HostError, PathKind, sha256_hex};
use crate::ledger::{BundleRecord, BundleState, Fact, Ledger, LedgerError, StepRecord, Undo};
use crate::pkg;
use charly_rules::plan::{ReverseKind, ReverseOp, Scope};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// One undo operation's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct UndoReport {
    /// Step.
    pub seq: u32,
    /// What.
    pub what: String,
    /// `done`, `warning`, `handed-over`, `kept`, `waiting` (for another
    /// charly on the same target), `not-undone` (`--forget`).
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

/// Takes the lock of `rec`'s target, saying through `progress` when this
/// `del` waits for another charly.
fn lock_target(
    ledger: &Ledger,
    rec: &BundleRecord,
    progress: &mut dyn FnMut(&UndoReport),
) -> Result<crate::ledger::HostLock, LedgerError> {
    super::lock_target(ledger, rec, &mut |what, note| {
        progress(&UndoReport {
            seq: 0,
            what,
            state: "waiting".into(),
            note: Some(note),
        })
    })
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
    let found = || -> Result<BundleRecord, WalkError> {
        Ok(ledger
            .get(name)?
            .ok_or_else(|| LedgerError::NotFound(name.into()))?)
    };
    let rec = found()?;
    let _target = if dry_run {
        None
    } else {
        Some(lock_target(ledger, &rec, progress)?)
    };
    // Read again under the lock: another `del` may have taken it meanwhile.
    let rec = if dry_run { rec } else { found()? };
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
    let mut out = undo_from(
        host,
        ledger,
        &rec,
        0,
        opts,
        &format!("charly bundle del {name}"),
        progress,
    )?;
    if !dry_run {
        ledger.remove(name)?;
        out.extend(remove_pending_dirs(
            host,
            ledger,
            &rec.connection.host_key(),
            progress,
        )?);
    }
    Ok(out)
}

/// `bundle del --forget`: forgets a bundle whose target cannot be reached
/// (its root deleted, its machine gone) without undoing anything; returns
/// one report per undo operation that was not carried out.
pub fn forget(
    ledger: &mut Ledger,
    name: &str,
    progress: &mut dyn FnMut(&UndoReport),
) -> Result<Vec<UndoReport>, WalkError> {
    let rec = ledger
        .get(name)?
        .ok_or_else(|| LedgerError::NotFound(name.into()))?;
    let _target = lock_target(ledger, &rec, progress)?;
    let _lock = ledger.lock(name)?;
    let mut out = Vec::new();
    let steps = ledger.steps(name)?;
    for s in steps.iter().rev() {
        for (_, u) in s.undo.iter().rev() {
            let r = UndoReport {
                seq: s.seq,
                what: u.describe(),
                state: "not-undone".into(),
                note: None,
            };
            progress(&r);
            out.push(r);
        }
    }
    ledger.remove(name)?;
    Ok(out)
}

/// Carries out the undo operations of bundle `rec`'s steps from `from`
/// on, last first, each deleted from the ledger once done (`resume` is
/// the command that goes on after a failure). The caller holds the
/// bundle's and the target's locks.
pub(super) fn undo_from(
    host: &mut dyn Host,
    ledger: &mut Ledger,
    rec: &BundleRecord,
    from: u32,
    opts: &DelOptions,
    resume: &str,
    progress: &mut dyn FnMut(&UndoReport),
) -> Result<Vec<UndoReport>, WalkError> {
    let name = rec.name.as_str();
    let dry_run = opts.dry_run;
    let steps = ledger.steps(name)?;
    let mut ops: Vec<(u32, u32, i64, Undo, Vec<ReverseOp>)> = steps
        .iter()
        .filter(|s| s.seq >= from)
        .flat_map(|s| {
            s.undo.iter().map(move |(i, u)| {
                let at = s.at.get(i).copied().unwrap_or(0);
                let realizes = s.realizes.get(i).cloned().unwrap_or_default();
                (s.seq, *i, at, u.clone(), realizes)
            })
        })
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
    let host_key = rec.connection.host_key();
    let mut others = Others::read(ledger, rec)?;
    let mut out = Vec::new();
    for (seq, idx, at, op, realizes) in ops {
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
        let mine = Mine {
            name,
            host_key: &host_key,
            user: &rec.user,
            at,
            realizes: &realizes,
        };
        let res = match share(ledger, &mine, &mut others, op) {
            Err(e) => Err(e),
            Ok(Shared::Handed(state, note)) => {
                ledger.done_undo(name, seq, idx)?;
                let r = UndoReport {
                    seq,
                    what,
                    state: state.into(),
                    note: Some(note),
                };
                progress(&r);
                out.push(r);
                continue;
            }
            Ok(Shared::Mine(op, shared)) => {
                let mut kept = Vec::new();
                let done = undo_one(host, ledger, name, &op, &cx, &mut |dir, privileged| {
                    // A directory another bundle still has things in: the
                    // `del` that leaves it unneeded removes it.
                    if others.any() {
                        kept.push((dir.to_string(), privileged));
                        true
                    } else {
                        false
                    }
                });
                for (dir, privileged) in &kept {
                    ledger.add_pending_dir(&host_key, dir, *privileged)?;
                }
                done.map(|w| match (shared, w) {
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

/// After a bundle is gone: removes the directories bundles on `host_key`
/// left because another one still needed them, when none does any more
/// (deepest first, each only if empty). With no bundle left on the target,
/// one that is still not empty holds someone else's files: it is kept,
/// said, and forgotten.
fn remove_pending_dirs(
    host: &mut dyn Host,
    ledger: &mut Ledger,
    host_key: &str,
    progress: &mut dyn FnMut(&UndoReport),
) -> Result<Vec<UndoReport>, WalkError> {
    let pending = ledger.pending_dirs(host_key)?;
    if pending.is_empty() {
        return Ok(Vec::new());
    }
    let others = Others::on_host(ledger, host_key, None)?;
    let mut out = Vec::new();
    for (dir, privileged) in pending {
        if others.needs_dir(&dir).is_some() {
            continue;
        }
        let what = format!("remove directory {dir} (if empty)");
        let report = match host.remove(&dir, privileged) {
            Ok(true) => {
                ledger.drop_pending_dir(host_key, &dir)?;
                Some(("done", None))
            }
            Ok(false) if !others.any() => {
                ledger.drop_pending_dir(host_key, &dir)?;
                Some((
                    "warning",
                    Some(format!("{dir} is not empty; left in place")),
                ))
            }
            // Something another bundle's `del` will take out first.
            Ok(false) => None,
            Err(e) => Some(("warning", Some(e.to_string()))),
        };
        if let Some((state, note)) = report {
            let r = UndoReport {
                seq: 0,
                what,
                state: state.into(),
                note,
            };
            progress(&r);
            out.push(r);
        }
    }
    Ok(out)
}

/// Something on a target one undo operation puts back.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Thing {
    /// A file or symlink (or an artifact's entry).
    Path(String),
    /// A managed block in a file.
    Block(String, String),
    /// A systemd unit's enablement (a user unit is the user's).
    Service(String, Option<String>),
    /// A file's capabilities.
    Caps(String),
}

/// What an undo operation (of a bundle for `user`, carrying out
/// `realizes`) puts back.
fn things(op: &Undo, realizes: &[ReverseOp], user: &str) -> Vec<Thing> {
    match op {
        Undo::RemovePath { path, .. }
        | Undo::RestoreFile { path, .. }
        | Undo::RestoreSymlink { path, .. } => vec![Thing::Path(path.clone())],
        Undo::RemoveTree { paths, .. } => paths.iter().cloned().map(Thing::Path).collect(),
        Undo::RemoveBlock { file, marker, .. } | Undo::RestoreBlock { file, marker, .. } => {
            vec![Thing::Block(file.clone(), marker.clone())]
        }
        Undo::Run { .. } | Undo::Note { .. } => realizes
            .iter()
            .flat_map(|r| {
                let of_user = (r.scope == Scope::User).then(|| user.to_string());
                r.targets.iter().filter_map(move |t| match r.kind {
                    ReverseKind::ServiceDisable | ReverseKind::RestoreEnabled => {
                        Some(Thing::Service(t.clone(), of_user.clone()))
                    }
                    ReverseKind::RestoreCaps => Some(Thing::Caps(t.clone())),
                    _ => None,
                })
            })
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect(),
        Undo::RemoveDir { .. } | Undo::RemovePackages { .. } => Vec::new(),
    }
}

/// The other bundles on a target, with what they changed and need.
struct Others {
    list: Vec<Other>,
    /// Each undo operation of theirs by the thing it puts back.
    ops: HashMap<Thing, Vec<TheirOp>>,
    /// Every path their facts and undo operations name.
    paths: BTreeMap<String, usize>,
}

/// One of another bundle's undo operations on a thing.
#[derive(Clone, Copy, Debug)]
struct TheirOp {
    /// When it was recorded.
    at: i64,
    /// The bundle (index in [`Others::list`]).
    bundle: usize,
    /// Its step.
    seq: u32,
    /// Its place in the step.
    idx: u32,
    /// It puts back other things too (an artifact's entries).
    several: bool,
}

/// Another bundle on the same target, with its steps as recorded.
struct Other {
    name: String,
    user: String,
    steps: Vec<StepRecord>,
}

impl Others {
    /// The bundles on `rec`'s target other than `rec`.
    fn read(ledger: &Ledger, rec: &BundleRecord) -> Result<Others, LedgerError> {
        Others::on_host(ledger, &rec.connection.host_key(), Some(&rec.name))
    }

    /// The bundles on `host_key` but `except`.
    fn on_host(
        ledger: &Ledger,
        host_key: &str,
        except: Option<&str>,
    ) -> Result<Others, LedgerError> {
        let list = ledger
            .list()?
            .into_iter()
            .filter(|o| Some(o.name.as_str()) != except && o.connection.host_key() == host_key)
            .map(|o| {
                ledger.steps(&o.name).map(|steps| Other {
                    name: o.name,
                    user: o.user,
                    steps,
                })
            })
            .collect::<Result<_, _>>()?;
        let mut o = Others {
            list,
            ops: HashMap::new(),
            paths: BTreeMap::new(),
        };
        o.index();
        Ok(o)
    }

    fn any(&self) -> bool {
        !self.list.is_empty()
    }

    fn index(&mut self) {
        self.ops.clear();
        self.paths.clear();
        for (b, o) in self.list.iter().enumerate() {
            for s in &o.steps {
                for (idx, u) in &s.undo {
                    let realizes = s.realizes.get(idx).map(Vec::as_slice).unwrap_or(&[]);
                    let ts = things(u, realizes, &o.user);
                    let at = s.at.get(idx).copied().unwrap_or(0);
                    for t in &ts {
                        if let Thing::Path(p) = t {
                            self.paths.insert(p.clone(), b);
                        }
                        self.ops.entry(t.clone()).or_default().push(TheirOp {
                            at,
                            bundle: b,
                            seq: s.seq,
                            idx: *idx,
                            several: ts.len() > 1,
                        });
                    }
                    if let Undo::RemoveDir { path, .. } = u {
                        self.paths.insert(path.clone(), b);
                    }
                }
                for f in &s.facts {
                    match f {
                        Fact::File { path, .. }
                        | Fact::Symlink { path, .. }
                        | Fact::Dir { path } => {
                            self.paths.insert(path.clone(), b);
                        }
                        Fact::Block { file, .. } => {
                            self.paths.insert(file.clone(), b);
                        }
                        Fact::Packages { .. } => {}
                    }
                }
            }
        }
    }

    /// Reads bundle `b`'s steps again (an operation was handed to it).
    fn refresh(&mut self, ledger: &Ledger, b: usize) -> Result<(), LedgerError> {
        self.list[b].steps = ledger.steps(&self.list[b].name)?;
        self.index();
        Ok(())
    }

    /// The first change of `t` by another bundle after `at`.
    fn next_after(&self, t: &Thing, at: i64) -> Option<TheirOp> {
        self.ops
            .get(t)?
            .iter()
            .filter(|o| o.at > at)
            .min_by_key(|o| o.at)
            .copied()
    }

    /// Whether another bundle changed `t` (at any time).
    fn changed(&self, t: &Thing) -> Option<&str> {
        self.ops
            .get(t)
            .and_then(|v| v.first())
            .map(|o| self.list[o.bundle].name.as_str())
    }

    /// A bundle that needs directory `dir`: it is one of its paths, or
    /// something of it lies below.
    fn needs_dir(&self, dir: &str) -> Option<&str> {
        let d = dir.trim_end_matches('/');
        if let Some(b) = self.paths.get(d) {
            return Some(self.list[*b].name.as_str());
        }
        let below = format!("{d}/");
        self.paths
            .range(below.clone()..)
            .next()
            .filter(|(p, _)| p.starts_with(&below))
            .map(|(_, b)| self.list[*b].name.as_str())
    }

    /// The bundle and step that still need one of `packages` (of `format`,
    /// under package root `root`), per package.
    fn package_holders(
        &self,
        format: &str,
        root: &Option<String>,
        packages: &[String],
    ) -> BTreeMap<(usize, u32), Vec<String>> {
        let mut held: BTreeMap<(usize, u32), Vec<String>> = BTreeMap::new();
        for p in packages {
            let holder = self.list.iter().enumerate().find_map(|(i, o)| {
                o.steps.iter().find_map(|s| {
                    s.facts
                        .iter()
                        .any(|f| {
                            matches!(f, Fact::Packages { format: f2, packages: ps, root: r2 }
                                if f2 == format && r2 == root && ps.contains(p))
                        })
                        .then_some((i, s.seq))
                })
            });
            if let Some(at) = holder {
                held.entry(at).or_default().push(p.clone());
            }
        }
        held
    }
}

/// The bundle being undone, for one of its operations.
struct Mine<'a> {
    name: &'a str,
    /// Its target ([`crate::ledger::Connection::host_key`]).
    host_key: &'a str,
    user: &'a str,
    /// When the operation was recorded.
    at: i64,
    /// The reverse ops it carries out.
    realizes: &'a [ReverseOp],
}

/// An undo operation after checking what other bundles on the target
/// still need.
enum Shared {
    /// Carry it out (what others need taken out of it; why, if so).
    Mine(Undo, Option<String>),
    /// Nothing to do on the target: handed over or kept (the report's
    /// state, why).
    Handed(&'static str, String),
}

/// Takes out of `op` what other bundles on the target changed after this
/// one or still need, and hands it over to them in the ledger (see the
/// module's doc).
fn share(ledger: &mut Ledger, me: &Mine<'_>, others: &mut Others, op: Undo) -> R<Shared> {
    if !others.any() {
        return Ok(Shared::Mine(op, None));
    }
    match op {
        Undo::RemovePackages {
            format,
            packages,
            command,
            root,
        } => {
            let held = others.package_holders(&format, &root, &packages);
            // One step's packages go together: they include the
            // dependencies the install pulled in, and removing one of
            // those would take a package the other bundle needs with it.
            // So when any is still needed, all of them are handed over.
            let Some(((b, seq), _)) = held.iter().next() else {
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
            let (b, seq) = (*b, *seq);
            let to = others.list[b].name.clone();
            let handed = Undo::RemovePackages {
                format: format.clone(),
                command: pkg::remove_script(&format, &packages, root.as_deref()),
                packages: packages.clone(),
                root: root.clone(),
            };
            ledger
                .hand_over(me.name, &to, seq, &[], &handed, me.at)
                .map_err(ledger_err)?;
            others.refresh(ledger, b).map_err(ledger_err)?;
            let needed: Vec<String> = held.values().flatten().cloned().collect();
            Ok(Shared::Handed(
                "handed-over",
                format!(
                    "kept {} (bundle {to} still needs {})",
                    packages.join(" "),
                    needed.join(" ")
                ),
            ))
        }
        Undo::RemoveDir {
            ref path,
            privileged,
        } => match others.needs_dir(path) {
            Some(who) => {
                ledger
                    .add_pending_dir(me.host_key, path, privileged)
                    .map_err(ledger_err)?;
                Ok(Shared::Handed(
                    "kept",
                    format!("bundle {who} still needs it; removed when no bundle does"),
                ))
            }
            None => Ok(Shared::Mine(op, None)),
        },
        Undo::RemoveTree { paths, privileged } => share_tree(ledger, me, others, paths, privileged),
        op => share_one(ledger, me, others, op),
    }
}

/// [`share`] for an artifact's entries: those another bundle changed
/// after this one go to it, one operation per step of theirs, in the
/// place of theirs; the rest stays this bundle's.
fn share_tree(
    ledger: &mut Ledger,
    me: &Mine<'_>,
    others: &mut Others,
    paths: Vec<String>,
    privileged: bool,
) -> R<Shared> {
    // Entries another bundle changed after this one go to it, one
    // operation per step of theirs, in the place of theirs.
    let mut handed: BTreeMap<(usize, u32), (Vec<u32>, Vec<String>)> = BTreeMap::new();
    let mut rest = Vec::new();
    for p in paths {
        match others.next_after(&Thing::Path(p.clone()), me.at) {
            Some(o) if !o.several => {
                let e = handed.entry((o.bundle, o.seq)).or_default();
                e.0.push(o.idx);
                e.1.push(p);
            }
            // Superseded by another bundle's own removal of it.
            Some(_) => {}
            None => rest.push(p),
        }
    }
    let mut to_whom = BTreeSet::new();
    for ((b, seq), (mut replace, mine)) in handed {
        replace.sort_unstable();
        replace.dedup();
        let to = others.list[b].name.clone();
        let op = Undo::RemoveTree {
            paths: mine,
            privileged,
        };
        ledger
            .hand_over(me.name, &to, seq, &replace, &op, me.at)
            .map_err(ledger_err)?;
        others.refresh(ledger, b).map_err(ledger_err)?;
        to_whom.insert(to);
    }
    let note = (!to_whom.is_empty()).then(|| {
        format!(
            "entries changed later by bundle {} left to it",
            to_whom.into_iter().collect::<Vec<_>>().join(", ")
        )
    });
    if rest.is_empty() {
        return Ok(Shared::Handed(
            "handed-over",
            note.unwrap_or_else(|| "nothing left to remove".into()),
        ));
    }
    Ok(Shared::Mine(
        Undo::RemoveTree {
            paths: rest,
            privileged,
        },
        note,
    ))
}

/// [`share`] for an operation on one thing (a file, a block, a service,
/// capabilities): handed to the bundle that changed it next, kept when
/// that bundle's own operation takes it out with more, else this
/// bundle's.
fn share_one(ledger: &mut Ledger, me: &Mine<'_>, others: &mut Others, op: Undo) -> R<Shared> {
    let ts = things(&op, me.realizes, me.user);
    let [t] = ts.as_slice() else {
        return Ok(Shared::Mine(op, None));
    };
    match others.next_after(t, me.at) {
        Some(o) if !o.several => {
            let to = others.list[o.bundle].name.clone();
            ledger
                .hand_over(me.name, &to, o.seq, &[o.idx], &op, me.at)
                .map_err(ledger_err)?;
            others.refresh(ledger, o.bundle).map_err(ledger_err)?;
            Ok(Shared::Handed(
                "handed-over",
                format!(
                    "bundle {to} changed it after this one: left as it is, and its \
                     `del` now puts back what was there before this one"
                ),
            ))
        }
        Some(o) => Ok(Shared::Handed(
            "kept",
            format!(
                "bundle {} changed it after this one and removes it",
                others.list[o.bundle].name
            ),
        )),
        None => {
            let note = others.changed(t).map(|who| {
                format!("bundle {who} changed it before this one: what it left is put back")
            });
            Ok(Shared::Mine(op, note))
        }
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
        let now = host.read_file(path, privileged).map_err(host_err)?;
        Ok(now.is_some_and(|d| sha256_hex(&d) != *want))
    }
}

/// Carries out one undo operation. A directory that is not empty is
/// offered to `keep` (true: another bundle still has things in it, and it
/// is kept for later without a warning).
fn undo_one(
    host: &mut dyn Host,
    ledger: &Ledger,
    name: &str,
    op: &Undo,
    cx: &UndoCx<'_>,
    keep: &mut dyn FnMut(&str, bool) -> bool,
) -> R<Option<String>> {
    let e = host_err;
    match op {
        Undo::RemovePath { path, privileged } => remove_path(host, cx, path, *privileged),
        Undo::RemoveDir { path, privileged } => {
            if host.remove(path, *privileged).map_err(e)? || keep(path, *privileged) {
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
        } => restore_file(
            host,
            ledger,
            name,
            cx,
            path,
            sha256,
            &FileAttrs {
                mode: *mode,
                owner: Some((*uid, *gid)),
                privileged: *privileged,
            },
        ),
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
                if !host.remove(p, *privileged).map_err(e)? && !keep(p, *privileged) {
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
        } => edit_block(host, file, *privileged, &mut |text| {
            find_block(text, marker)?;
            let mut rest = strip_block(text, marker);
            if *added_newline && rest.ends_with('\n') {
                rest.pop();
            }
            Some(if rest.is_empty() && *created_file {
                BlockEdit::Remove
            } else {
                BlockEdit::Write(rest)
            })
        }),
        Undo::RestoreBlock {
            file,
            marker,
            body,
            privileged,
        } => edit_block(host, file, *privileged, &mut |text| {
            find_block(text, marker)?;
            Some(BlockEdit::Write(replace_block(text, marker, body)))
        }),
        Undo::RemovePackages {
            format,
            packages,
            command,
            root,
        } => remove_packages(host, format, packages, command, root.as_deref()),
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

/// A host's error as the walk reports it.
fn host_err(x: HostError) -> String {
    x.to_string()
}

/// The ledger's error as the walk reports it.
fn ledger_err(x: LedgerError) -> String {
    x.to_string()
}

/// Removes a file or link the deploy made, unless it became a directory or
/// (a file) was changed since the deploy.
fn remove_path(
    host: &mut dyn Host,
    cx: &UndoCx<'_>,
    path: &str,
    privileged: bool,
) -> R<Option<String>> {
    let e = host_err;
    let st = host
        .stat(&[path.to_string()], false)
        .map_err(e)?
        .pop()
        .flatten()
        .map(|s| s.kind);
    if matches!(st, Some(PathKind::Dir)) {
        return Ok(Some(format!("{path} is now a directory; left alone")));
    }
    if matches!(st, Some(PathKind::File { .. })) && cx.keeps(host, path, privileged)? {
        return Ok(Some(format!(
            "{path} was changed since the deploy; kept as it is now: it is yours \
             (remove it by hand if you do not want it; a `del --force` removes such \
             files with the bundle)"
        )));
    }
    host.remove(path, privileged).map_err(e)?;
    Ok(None)
}

/// Puts back the file the deploy replaced (its backup in the ledger),
/// unless it was changed since the deploy.
fn restore_file(
    host: &mut dyn Host,
    ledger: &Ledger,
    name: &str,
    cx: &UndoCx<'_>,
    path: &str,
    sha256: &str,
    attrs: &FileAttrs,
) -> R<Option<String>> {
    let e = host_err;
    if cx.keeps(host, path, attrs.privileged)? {
        return Ok(Some(format!(
            "{path} was changed since the deploy; kept as it is now: it is yours \
             (what the deploy replaced is not put back; a `del --force` puts it back \
             over such changes)"
        )));
    }
    let data = ledger
        .blob(name, sha256)
        .map_err(ledger_err)?
        .ok_or_else(|| format!("the backup of {path} is missing from the ledger"))?;
    host.write_file(path, &data, attrs).map_err(e)?;
    Ok(None)
}

/// Removes those of `packages` still installed: with the recorded
/// `command` when all are, else with a command for the rest.
fn remove_packages(
    host: &mut dyn Host,
    format: &str,
    packages: &[String],
    command: &str,
    root: Option<&str>,
) -> R<Option<String>> {
    let e = host_err;
    let q = pkg::query_script(format, packages, root)
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
        command.to_string()
    } else {
        pkg::remove_script(format, &present, root)
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

/// What becomes of a file a managed block is taken out of.
enum BlockEdit {
    /// It keeps this text (every byte but charly's block).
    Write(String),
    /// Nothing is left and charly created it: it goes.
    Remove,
}

/// Edits the managed blocks of `file` with `edit` (None: nothing to do),
/// keeping its mode and owner.
fn edit_block(
    host: &mut dyn Host,
    file: &str,
    privileged: bool,
    edit: &mut dyn FnMut(&str) -> Option<BlockEdit>,
) -> R<Option<String>> {
    let e = host_err;
    let Some(old) = host.read_file(file, privileged).map_err(e)? else {
        return Ok(Some(format!("{file} is gone")));
    };
    let text = String::from_utf8(old).map_err(|_| format!("{file} is not UTF-8"))?;
    match edit(&text) {
        None => Ok(None),
        Some(BlockEdit::Remove) => {
            host.remove(file, privileged).map_err(e)?;
            Ok(None)
        }
        Some(BlockEdit::Write(rest)) => {
            let st = host
                .stat(&[file.to_string()], false)
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
                    privileged,
                },
            )
            .map_err(e)?;
            Ok(None)
        }
    }
}
