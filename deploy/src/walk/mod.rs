//! The walker: applies a merged InstallPlan to a [`Host`], step by step,
//! recording in the [`Ledger`] before every change; undoes a bundle LIFO;
//! reports drift.
//!
//! **Per step:** gate and target checks decide whether it runs (a skipped
//! step is recorded with its reason). A running step is recorded
//! `incomplete` (committed) first; each change it makes is preceded by the
//! committed undo operation for it — the exact, observed form of the
//! step's own reverse op that names the change, tagged with it (see
//! `reverse`: the IR's reverse ops are the undo); at the end it becomes
//! `complete` with the facts it left (for drift), or `failed` — and the
//! walk stops, naming the step and every step not attempted.
//!
//! **What runs where.** Files, directories, links, env.d files and managed
//! blocks go through the host's file operations. Builder steps are never
//! rebuilt: the artifact tar from the store (see [`Artifacts`]) has its
//! box-home prefix rewritten to the target home and owners to the target
//! user, then is extracted. Commands, packages and services need a real
//! machine: on a rooted host (`--root DIR`) they are skipped with a reason,
//! because they would touch the real system outside the root.
//!
//! **Layout.** This module holds the walk's options, errors, reports and the
//! per-step context every change goes through; `apply` applies a plan's
//! steps, `undo` reverses a bundle (`bundle del`), `drift` compares
//! (`bundle status`), `managed` edits managed blocks and writes env hooks.
//! The public items are re-exported here (`charly_deploy::walk::apply`, …).

mod apply;
mod aur;
mod batch;
mod download;
mod drift;
mod managed;
mod plugin;
mod repo;
mod reverse;
mod undo;

pub use apply::{ReapplyReport, apply, reapply, retarget_artifact};
pub use drift::{Drift, drift};
pub use managed::{find_block, rc_file, strip_block};
pub use plugin::{PluginCall, PluginSteps, parse_deploy_reply};
pub use reverse::{incidental, kind_name, realizes, undo_of, vacuous};
pub use undo::{DelOptions, UndoReport, forget, remove, remove_with};

use crate::host::{Cmd, FileAttrs, Host, HostError, PathKind, parent, sha256_hex};
use crate::ledger::{Fact, Ledger, LedgerError, StepHead, Undo};
use charly_rules::plan::{
    Gates, InstallPlan, InstallStep, Phase, ReverseKind, ReverseOp, StepData, Target,
};
use charly_rules::sh;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// Takes the lock of the target `record` is on ([`Ledger::lock_host`]);
/// while another charly holds it, `waiting` is told (what, why) once and
/// this one waits.
fn lock_target(
    ledger: &Ledger,
    record: &crate::ledger::BundleRecord,
    waiting: &mut dyn FnMut(String, String),
) -> Result<crate::ledger::HostLock, LedgerError> {
    let host = record.connection.host_key();
    ledger.lock_host(&host, &mut || {
        waiting(
            format!("target {host}"),
            "another charly process is changing it; waiting for it to finish".into(),
        )
    })
}

/// Where builder artifacts, local packages and copied files come from.
pub trait Artifacts {
    /// The builder step's artifact tar (entries relative to `/`, under the box home).
    fn builder_tar(&self, candy: &str, builder: &str) -> Result<Vec<u8>, String>;
    /// Built local packages (`name`, bytes).
    fn local_packages(&self, candy: &str, format: &str) -> Result<Vec<(String, Vec<u8>)>, String>;
    /// A file of the candy directory (`copy:` sources).
    fn candy_file(&self, candy: &str, rel: &str) -> Result<Vec<u8>, String>;
}

/// The account a plan is applied for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TargetUser {
    /// Name.
    pub name: String,
    /// Uid.
    pub uid: u32,
    /// Gid.
    pub gid: u32,
    /// Home directory (target path).
    pub home: String,
    /// Login shell.
    pub shell: String,
}

impl TargetUser {
    /// Attributes of a path made with `mode`: root's when `privileged`,
    /// else this user's.
    pub(crate) fn attrs(&self, mode: u32, privileged: bool) -> FileAttrs {
        FileAttrs {
            mode,
            owner: Some(if privileged {
                (0, 0)
            } else {
                (self.uid, self.gid)
            }),
            privileged,
        }
    }
}

/// Called with a step's seq each time that step changed the target (its
/// intent is already in the ledger): an observer of the walk's progress
/// inside a step. Crash tests block there and kill the process.
pub type ChangeHook = std::sync::Arc<dyn Fn(u32) + Send + Sync>;

/// Options of a walk.
#[derive(Clone)]
pub struct Options {
    /// Open gates.
    pub gates: Gates,
    /// Print what would run; touch nothing, record nothing.
    pub dry_run: bool,
    /// Per-command time limit.
    pub timeout: Duration,
    /// Where the plan goes (`local` or `vm`; `pod` and `k8s` walk their
    /// rendered files like `local`).
    pub target: Target,
    /// The box user's home, which builder artifacts were made under.
    pub box_home: String,
    /// Told about every change a step makes (not in dry runs).
    pub on_change: Option<ChangeHook>,
    /// Run consecutive steps of one (scope, venue) that are commands with
    /// a checkable outcome in two round trips per run (see `batch`; for
    /// targets reached over SSH).
    pub batch_commands: bool,
    /// What executes plugin steps; `None`: they are skipped, saying why.
    pub plugins: Option<std::sync::Arc<dyn PluginSteps>>,
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("gates", &self.gates)
            .field("dry_run", &self.dry_run)
            .field("timeout", &self.timeout)
            .field("target", &self.target)
            .field("box_home", &self.box_home)
            .field("on_change", &self.on_change.as_ref().map(|_| "hook"))
            .field("batch_commands", &self.batch_commands)
            .field("plugins", &self.plugins.as_ref().map(|_| "plugin host"))
            .finish()
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            gates: Gates::default(),
            dry_run: false,
            timeout: Duration::from_secs(1800),
            target: Target::Local,
            box_home: "/home/user".into(),
            on_change: None,
            batch_commands: false,
            plugins: None,
        }
    }
}

/// A walk failure.
#[derive(Debug, thiserror::Error)]
pub enum WalkError {
    /// The ledger failed (nothing further was attempted).
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// The host failed before any step.
    #[error(transparent)]
    Host(#[from] HostError),
    /// A step failed; the rest were not attempted.
    #[error("step {seq} ({title}) failed: {message}{}", not_attempted_text(.not_attempted))]
    Step {
        /// Its seq.
        seq: u32,
        /// Its title.
        title: String,
        /// Why.
        message: String,
        /// Titles of the steps not attempted.
        not_attempted: Vec<String>,
    },
    /// Something else that stops the walk before it starts.
    #[error("{0}")]
    Setup(String),
}

fn not_attempted_text(v: &[String]) -> String {
    if v.is_empty() {
        String::new()
    } else {
        format!("\nnot attempted ({}):\n  {}", v.len(), v.join("\n  "))
    }
}

/// One step of a report.
#[derive(Clone, Debug, Serialize)]
pub struct StepReport {
    /// Position.
    pub seq: u32,
    /// Candy.
    pub candy: String,
    /// Kind.
    pub kind: String,
    /// Scope.
    pub scope: String,
    /// One line.
    pub title: String,
    /// `complete`, `skipped`, `failed`, or `would-run` (dry run).
    pub state: String,
    /// Skip reason or error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// What was (or would be) done.
    pub actions: Vec<String>,
}

impl StepReport {
    /// This walk waits for another charly on the same target.
    fn waiting(title: String, note: String) -> Self {
        StepReport {
            seq: 0,
            candy: String::new(),
            kind: String::new(),
            scope: String::new(),
            title,
            state: "waiting".into(),
            note: Some(note),
            actions: Vec::new(),
        }
    }

    /// The report of step `seq`.
    fn of(seq: u32, h: &StepHead, state: &str, note: Option<String>, actions: Vec<String>) -> Self {
        StepReport {
            seq,
            candy: h.candy.clone(),
            kind: h.kind.clone(),
            scope: h.scope.clone(),
            title: h.title.clone(),
            state: state.into(),
            note,
            actions,
        }
    }
}

/// What `apply` did.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Bundle.
    pub bundle: String,
    /// Host.
    pub host: String,
    /// User.
    pub user: TargetUser,
    /// Dry run.
    pub dry_run: bool,
    /// Steps.
    pub steps: Vec<StepReport>,
}

/// A step's one-line title.
pub fn title(s: &InstallStep) -> String {
    let what = match &s.data {
        StepData::SystemPackages(p) => format!(
            "{} packages {}",
            s.phase.map_or("", |p| match p {
                Phase::Prepare => "prepare",
                Phase::Install => "install",
                Phase::Cleanup => "cleanup",
            }),
            p.packages.join(" ")
        ),
        StepData::Builder(b) => format!("{} builder artifact", b.builder),
        StepData::Op(o) => format!("{} {}", o.verb, o.value.lines().next().unwrap_or("")),
        StepData::File(f) => format!("{} {}", f.verb, f.path),
        StepData::ServicePackaged(p) => format!("service {}", p.unit),
        StepData::ServiceCustom(c) => format!("service {}", c.unit),
        StepData::ShellHook(h) => format!("env {}", h.env_file),
        StepData::ShellSnippet(s) => format!("{} snippet {}", s.shell, s.destination),
        StepData::RepoChange(r) => format!("{} repositories", r.format),
        StepData::ApkInstall(_) => "android packages".into(),
        StepData::LocalPkgInstall(l) => format!("local {} package from {}", l.format, l.source),
        StepData::Reboot(_) => "reboot".into(),
        StepData::External(_) => "external step".into(),
    };
    format!("{}: {} {}", s.candy, s.kind, what.trim())
}

fn head(s: &InstallStep) -> StepHead {
    StepHead {
        candy: s.candy.clone(),
        kind: s.kind.as_str(),
        scope: enum_str(&s.scope),
        title: title(s),
        step: serde_json::to_value(s).unwrap_or(serde_json::Value::Null),
    }
}

fn enum_str<T: Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default()
}

/// Resolves the target user: the rooted host's `/etc/passwd` (falling back
/// to the plan's user and `/home/<name>`), else `getent passwd` on the host.
pub fn resolve_user(
    host: &mut dyn Host,
    name: &str,
    plan: &InstallPlan,
) -> Result<TargetUser, WalkError> {
    let parse = |line: &str| -> Option<TargetUser> {
        let f: Vec<&str> = line.trim_end().split(':').collect();
        if f.len() < 7 || f[0] != name || !f[5].starts_with('/') {
            return None;
        }
        Some(TargetUser {
            name: f[0].into(),
            uid: f[2].parse().ok()?,
            gid: f[3].parse().ok()?,
            home: f[5].into(),
            shell: f[6].into(),
        })
    };
    if host.root().is_some() {
        if let Some(text) = host.read_file("/etc/passwd", false)? {
            let text = String::from_utf8_lossy(&text);
            if let Some(u) = text.lines().find_map(parse) {
                return Ok(u);
            }
        }
        let meta = |k: &str| plan.meta.get(k).and_then(|v| v.parse().ok());
        return Ok(TargetUser {
            name: name.into(),
            uid: meta("uid").unwrap_or(1000),
            gid: meta("gid").unwrap_or(1000),
            home: if name == "root" {
                "/root".into()
            } else {
                format!("/home/{name}")
            },
            shell: "/bin/bash".into(),
        });
    }
    let mut c = Cmd::sh(format!("getent passwd {}", sh::quote_min(name)));
    c.timeout = Some(Duration::from_secs(60));
    let out = host.run(&c)?;
    if out.status == 2 {
        return Err(WalkError::Setup(format!(
            "{}: there is no user `{name}` (create it, or pass --user)",
            host.describe()
        )));
    }
    let text = out.stdout_str();
    if !out.ok() {
        return Err(WalkError::Setup(format!(
            "{}: `getent passwd {name}` failed (exit {}): {}",
            host.describe(),
            out.status,
            out.stderr_tail()
        )));
    }
    text.lines().find_map(parse).ok_or_else(|| {
        WalkError::Host(HostError::Garbage {
            host: host.describe(),
            what: format!("getent passwd {name}"),
            output: crate::host::shorten(&text, 200),
        })
    })
}

/// The per-step context: every change goes through here so the undo
/// operation is committed first.
struct StepCx<'a> {
    host: &'a mut dyn Host,
    ledger: Option<&'a mut Ledger>,
    bundle: &'a str,
    seq: u32,
    user: &'a TargetUser,
    facts: Vec<Fact>,
    actions: Vec<String>,
    on_change: Option<ChangeHook>,
    timeout: Duration,
    rooted: bool,
    box_home: String,
    planned_dirs: &'a mut BTreeSet<String>,
    plugins: Option<std::sync::Arc<dyn PluginSteps>>,
    /// The step's reverse ops (home resolved): what its undo carries out.
    reverse: Vec<ReverseOp>,
    /// The ops (indices into `reverse`) the undo operations recorded now
    /// carry out, unless a path or marker names others (see [`Self::undo`]).
    realizing: Vec<usize>,
    /// The ops some recorded undo operation carries out.
    realized: BTreeSet<usize>,
}

type R<T> = Result<T, String>;

impl<'a> StepCx<'a> {
    /// The context of step `seq` (a dry run has no ledger).
    #[allow(clippy::too_many_arguments)]
    fn new(
        host: &'a mut dyn Host,
        ledger: Option<&'a mut Ledger>,
        bundle: &'a str,
        seq: u32,
        user: &'a TargetUser,
        o: &Options,
        rooted: bool,
        planned_dirs: &'a mut BTreeSet<String>,
        reverse: Vec<ReverseOp>,
    ) -> Self {
        StepCx {
            on_change: ledger.as_ref().and(o.on_change.clone()),
            host,
            ledger,
            bundle,
            seq,
            user,
            facts: Vec::new(),
            actions: Vec::new(),
            timeout: o.timeout,
            rooted,
            box_home: o.box_home.clone(),
            planned_dirs,
            plugins: o.plugins.clone(),
            reverse,
            realizing: Vec::new(),
            realized: BTreeSet::new(),
        }
    }
}

impl StepCx<'_> {
    fn dry(&self) -> bool {
        self.ledger.is_none()
    }

    /// Records `op` as the undo of the change about to be made, tagged with
    /// the reverse ops of the step it carries out: those that name its
    /// subject (a file's path, a block's marker), else the ones the step
    /// is carrying out now ([`Self::realize`]).
    fn undo(&mut self, op: &Undo, blobs: &[(String, Vec<u8>)]) -> R<()> {
        let named = self.naming(op);
        let idx = if named.is_empty() {
            self.realizing.clone()
        } else {
            named
        };
        let ops: Vec<ReverseOp> = idx
            .iter()
            .filter_map(|i| self.reverse.get(*i).cloned())
            .collect();
        debug_assert!(
            ops.iter().all(|r| reverse::realizes(r, op)),
            "step {}: {op:?} does not carry out {ops:?}",
            self.seq
        );
        self.undo_for(op, &ops, blobs)?;
        self.realized.extend(idx);
        Ok(())
    }

    /// Records `op` as something the step does on the way (no reverse op
    /// names it: a parent directory, a reload after files go).
    fn undo_incidental(&mut self, op: &Undo, blobs: &[(String, Vec<u8>)]) -> R<()> {
        self.undo_for(op, &[], blobs)
    }

    /// Records `op`, carrying out `realizes`.
    fn undo_for(
        &mut self,
        op: &Undo,
        realizes: &[ReverseOp],
        blobs: &[(String, Vec<u8>)],
    ) -> R<()> {
        if let Some(l) = self.ledger.as_deref_mut() {
            l.add_undo(self.bundle, self.seq, op, realizes, blobs)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// The undo operations recorded from now on carry out the step's
    /// reverse ops that `pick` accepts (until the next call).
    fn realize(&mut self, pick: impl Fn(&ReverseOp) -> bool) {
        self.realizing = (0..self.reverse.len())
            .filter(|i| pick(&self.reverse[*i]))
            .collect();
    }

    /// The step's reverse ops that name the subject of `op` (a file by its
    /// path, a managed block by its marker), when `op` is of their kind.
    fn naming(&self, op: &Undo) -> Vec<usize> {
        (0..self.reverse.len())
            .filter(|i| {
                let r = &self.reverse[*i];
                let targets_path = |p: &str| r.targets.iter().any(|t| t == p);
                match op {
                    Undo::RemovePath { path, .. }
                    | Undo::RestoreFile { path, .. }
                    | Undo::RestoreSymlink { path, .. } => {
                        matches!(
                            r.kind,
                            ReverseKind::RmFileSystem
                                | ReverseKind::RmFileUser
                                | ReverseKind::RemoveEnvdFile
                                | ReverseKind::ServiceRemove
                        ) && targets_path(path)
                    }
                    Undo::RemoveBlock { marker, .. } | Undo::RestoreBlock { marker, .. } => {
                        r.kind == ReverseKind::RemoveManagedBlock
                            && r.extra.get("marker") == Some(marker)
                    }
                    _ => false,
                }
            })
            .collect()
    }

    /// After the step succeeded: a reverse op no record carries out (and
    /// that the host has no reason to skip, see [`reverse::vacuous`]) gets
    /// a note saying so, so `del` and the ledger show every op of the step.
    fn account_for_reverse_ops(&mut self) -> R<()> {
        if self.dry() {
            return Ok(());
        }
        for i in 0..self.reverse.len() {
            let r = self.reverse[i].clone();
            if self.realized.contains(&i) || reverse::vacuous(&r, self.rooted).is_some() {
                continue;
            }
            let text = format!(
                "reverse op `{}` ({}): the deploy made no change it undoes",
                reverse::kind_name(r.kind),
                r.targets.join(", ")
            );
            self.undo_for(&Undo::Note { text }, std::slice::from_ref(&r), &[])?;
            self.realized.insert(i);
        }
        Ok(())
    }

    /// After a change: tell the observer.
    fn changed(&mut self) {
        if let Some(hook) = &self.on_change {
            hook(self.seq);
        }
    }

    fn attrs(&self, mode: u32, privileged: bool) -> FileAttrs {
        self.user.attrs(mode, privileged)
    }

    /// Creates missing directories down to `dir` (each recorded first).
    fn ensure_dir(&mut self, dir: &str, mode: u32, privileged: bool) -> R<()> {
        let mut chain = Vec::new();
        let mut cur = Some(dir.trim_end_matches('/'));
        while let Some(d) = cur {
            if d.is_empty() || d == "/" {
                break;
            }
            chain.push(d.to_string());
            cur = parent(d);
        }
        chain.reverse();
        let stats = self.host.stat(&chain, false).map_err(|e| e.to_string())?;
        for (d, st) in chain.iter().zip(stats) {
            match st {
                Some(s) if s.kind == PathKind::Dir => continue,
                Some(s) if matches!(s.kind, PathKind::Symlink { .. }) => continue,
                Some(_) => return Err(format!("{d} exists and is not a directory")),
                None => {}
            }
            // Parents we create for the user's files belong to the user,
            // except above the home.
            let p = privileged || !d.starts_with(&self.user.home);
            if self.dry() {
                // A dry run remembers what it would already have created.
                if self.planned_dirs.insert(d.clone()) {
                    self.actions.push(format!("mkdir {d}"));
                }
                continue;
            }
            self.actions.push(format!("mkdir {d}"));
            self.undo_incidental(
                &Undo::RemoveDir {
                    path: d.clone(),
                    privileged: p,
                },
                &[],
            )?;
            let m = if d == dir { mode } else { 0o755 };
            let a = self.attrs(m, p);
            self.host.mkdir(d, &a).map_err(|e| e.to_string())?;
            self.changed();
        }
        if !self.dry() {
            self.facts.push(Fact::Dir { path: dir.into() });
        }
        Ok(())
    }

    /// Records how to undo replacing whatever is at `path`.
    fn record_replace(&mut self, path: &str, privileged: bool) -> R<()> {
        let st = self
            .host
            .stat(&[path.to_string()], false)
            .map_err(|e| e.to_string())?
            .pop()
            .flatten();
        let op = match st.as_ref().map(|s| &s.kind) {
            None => Undo::RemovePath {
                path: path.into(),
                privileged,
            },
            Some(PathKind::File { .. }) => {
                let old = self
                    .host
                    .read_file(path, privileged)
                    .map_err(|e| e.to_string())?
                    .unwrap_or_default();
                let sha = sha256_hex(&old);
                let s = st
                    .as_ref()
                    .map(|s| (s.mode, s.uid, s.gid))
                    .unwrap_or_default();
                let op = Undo::RestoreFile {
                    path: path.into(),
                    sha256: sha.clone(),
                    mode: s.0,
                    uid: s.1,
                    gid: s.2,
                    privileged,
                };
                return self.undo(&op, &[(sha, old)]);
            }
            Some(PathKind::Symlink { target }) => Undo::RestoreSymlink {
                path: path.into(),
                target: target.clone(),
                privileged,
            },
            Some(_) => return Err(format!("{path} exists and is not a file")),
        };
        self.undo(&op, &[])
    }

    fn put_file(&mut self, path: &str, data: &[u8], mode: u32, privileged: bool) -> R<()> {
        if let Some(p) = parent(path) {
            self.ensure_dir(p, 0o755, privileged)?;
            if !self.dry() {
                self.facts.pop(); // the parent is not a fact of its own
            }
        }
        self.actions.push(format!(
            "write {path} ({} bytes, mode {mode:04o})",
            data.len()
        ));
        if self.dry() {
            return Ok(());
        }
        if !self.rooted && is_unit_file(path) {
            // Recorded before the file's own undo, so `del` reloads systemd
            // after the unit (or quadlet) file is gone.
            self.undo_incidental(&reload_undo(privileged, self.user), &[])?;
        }
        self.record_replace(path, privileged)?;
        let a = self.attrs(mode, privileged);
        self.host
            .write_file(path, data, &a)
            .map_err(|e| e.to_string())?;
        self.facts.push(Fact::File {
            path: path.into(),
            sha256: sha256_hex(data),
            mode,
        });
        self.changed();
        Ok(())
    }

    fn put_symlink(&mut self, path: &str, target: &str, privileged: bool) -> R<()> {
        if let Some(p) = parent(path) {
            self.ensure_dir(p, 0o755, privileged)?;
            if !self.dry() {
                self.facts.pop();
            }
        }
        self.actions.push(format!("link {path} -> {target}"));
        if self.dry() {
            return Ok(());
        }
        self.record_replace(path, privileged)?;
        self.host
            .remove(path, privileged)
            .map_err(|e| e.to_string())?;
        let a = self.attrs(0o777, privileged);
        self.host
            .symlink(path, target, &a)
            .map_err(|e| e.to_string())?;
        self.facts.push(Fact::Symlink {
            path: path.into(),
            target: target.into(),
        });
        self.changed();
        Ok(())
    }

    fn run(&mut self, mut cmd: Cmd, what: &str) -> R<String> {
        if cmd.timeout.is_none() {
            cmd.timeout = Some(self.timeout);
        }
        let login = self.host.login().map_err(|e| e.to_string())?;
        self.actions.push(cmd.display(&login, self.rooted));
        if self.dry() {
            return Ok(String::new());
        }
        let out = self.host.run(&cmd).map_err(|e| e.to_string())?;
        if !out.ok() {
            return Err(format!(
                "{what}: exit {}{}",
                out.status,
                match out.stderr_tail() {
                    s if s.is_empty() => String::new(),
                    s => format!(": {s}"),
                }
            ));
        }
        Ok(out.stdout_str())
    }
}

/// Reloading systemd (the user's for a user unit) once a unit file is
/// gone; a failure is a warning.
fn reload_undo(privileged: bool, user: &TargetUser) -> Undo {
    let user_flag = if privileged { "" } else { " --user" };
    let mut env = BTreeMap::new();
    if !privileged {
        env.insert(
            "XDG_RUNTIME_DIR".to_string(),
            format!("/run/user/{}", user.uid),
        );
    }
    Undo::Run {
        what: format!("systemctl{user_flag} daemon-reload"),
        script: format!("systemctl{user_flag} daemon-reload"),
        privileged,
        as_user: (!privileged).then(|| user.name.clone()),
        env,
        ignore_failure: true,
    }
}

/// A systemd unit or quadlet file (systemd must reload after it goes).
fn is_unit_file(path: &str) -> bool {
    ["/systemd/system/", "/systemd/user/", "/containers/systemd/"]
        .iter()
        .any(|d| path.contains(d))
}
