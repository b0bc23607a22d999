//! The walker: applies a merged InstallPlan to a [`Host`], step by step,
//! recording in the [`Ledger`] before every change; undoes a bundle LIFO;
//! reports drift.
//!
//! **Per step:** gate and target checks decide whether it runs (a skipped
//! step is recorded with its reason). A running step is recorded
//! `incomplete` (committed) first; each change it makes is preceded by the
//! committed undo operation for it; at the end it becomes `complete` with
//! the facts it left (for drift), or `failed` — and the walk stops, naming
//! the step and every step not attempted.
//!
//! **What runs where.** Files, directories, links, env.d files and managed
//! blocks go through the host's file operations. Builder steps are never
//! rebuilt: the artifact tar from the store (see [`Artifacts`]) has its
//! box-home prefix rewritten to the target home and owners to the target
//! user, then is extracted. Commands, packages and services need a real
//! machine: on a rooted host (`--root DIR`) they are skipped with a reason,
//! because they would touch the real system outside the root.

use crate::host::{Cmd, FileAttrs, Host, HostError, PathKind, base_env, parent, sha256_hex, sq};
use crate::ledger::{
    BundleRecord, BundleState, Fact, Ledger, LedgerError, StepHead, StepState, Undo,
};
use crate::pkg;
use charly_rules::plan::{
    BuilderStep, FileStep, Gates, InstallPlan, InstallStep, OpStep, Phase, Scope, ShellHookStep,
    ShellSnippetStep, StepData, Venue,
};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

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
    /// `local` or `vm`.
    pub target: String,
    /// The box user's home, which builder artifacts were made under.
    pub box_home: String,
    /// Told about every change a step makes (not in dry runs).
    pub on_change: Option<ChangeHook>,
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
            .finish()
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            gates: Gates::default(),
            dry_run: false,
            timeout: Duration::from_secs(1800),
            target: "local".into(),
            box_home: "/home/user".into(),
            on_change: None,
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
    let mut c = Cmd::sh(format!("getent passwd {}", sq(name)));
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

/// The rc file a login shell reads.
pub fn rc_file(shell: &str, home: &str) -> String {
    let base = shell.rsplit('/').next().unwrap_or(shell);
    match base {
        "bash" => format!("{home}/.bashrc"),
        "zsh" => format!("{home}/.zshrc"),
        "fish" => format!("{home}/.config/fish/config.fish"),
        _ => format!("{home}/.profile"),
    }
}

fn block_markers(marker: &str) -> (String, String) {
    (
        format!("# >>> charly {marker} >>>"),
        format!("# <<< charly {marker} <<<"),
    )
}

/// The text of a managed block in `content`, if present.
pub fn find_block(content: &str, marker: &str) -> Option<String> {
    let (b, e) = block_markers(marker);
    let start = content.find(&format!("{b}\n"))?;
    let body_start = start + b.len() + 1;
    let end = content[body_start..].find(&e)? + body_start;
    Some(content[body_start..end].to_string())
}

/// `content` with the block removed (markers and body, one line each side).
pub fn strip_block(content: &str, marker: &str) -> String {
    let (b, e) = block_markers(marker);
    let Some(start) = content.find(&format!("{b}\n")) else {
        return content.to_string();
    };
    let Some(rel_end) = content[start..].find(&e) else {
        return content.to_string();
    };
    let mut end = start + rel_end + e.len();
    if content[end..].starts_with('\n') {
        end += 1;
    }
    format!("{}{}", &content[..start], &content[end..])
}

fn parse_mode(s: &str, default: u32) -> u32 {
    u32::from_str_radix(s.trim_start_matches("0o"), 8).unwrap_or(default) & 0o7777
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
}

type R<T> = Result<T, String>;

impl StepCx<'_> {
    fn dry(&self) -> bool {
        self.ledger.is_none()
    }

    fn undo(&mut self, op: &Undo, blobs: &[(String, Vec<u8>)]) -> R<()> {
        if let Some(l) = self.ledger.as_deref_mut() {
            l.add_undo(self.bundle, self.seq, op, blobs)
                .map_err(|e| e.to_string())?;
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
        FileAttrs {
            mode,
            owner: Some(if privileged {
                (0, 0)
            } else {
                (self.user.uid, self.user.gid)
            }),
            privileged,
        }
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
            self.undo(
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
            let user_flag = if privileged { "" } else { " --user" };
            let mut env = BTreeMap::new();
            if !privileged {
                env.insert(
                    "XDG_RUNTIME_DIR".to_string(),
                    format!("/run/user/{}", self.user.uid),
                );
            }
            self.undo(
                &Undo::Run {
                    what: format!("systemctl{user_flag} daemon-reload"),
                    script: format!("systemctl{user_flag} daemon-reload"),
                    privileged,
                    as_user: (!privileged).then(|| self.user.name.clone()),
                    env,
                    ignore_failure: true,
                },
                &[],
            )?;
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

    fn put_block(&mut self, file: &str, marker: &str, text: &str, privileged: bool) -> R<()> {
        if let Some(p) = parent(file) {
            self.ensure_dir(p, 0o755, privileged)?;
            if !self.dry() {
                self.facts.pop();
            }
        }
        let body = if text.ends_with('\n') {
            text.to_string()
        } else {
            format!("{text}\n")
        };
        self.actions
            .push(format!("managed block {marker} in {file}"));
        if self.dry() {
            return Ok(());
        }
        let st = self
            .host
            .stat(&[file.to_string()], false)
            .map_err(|e| e.to_string())?
            .pop()
            .flatten();
        let old = self
            .host
            .read_file(file, privileged)
            .map_err(|e| e.to_string())?;
        let created = old.is_none();
        let old = String::from_utf8(old.unwrap_or_default())
            .map_err(|_| format!("{file} is not UTF-8 text"))?;
        let base = strip_block(&old, marker);
        let added_newline = !base.is_empty() && !base.ends_with('\n');
        let (b, e) = block_markers(marker);
        let new = format!(
            "{base}{}{b}\n{body}{e}\n",
            if added_newline { "\n" } else { "" }
        );
        let had_block = find_block(&old, marker).is_some();
        if had_block {
            // An earlier block of ours (another bundle): restore the whole file.
            self.record_replace(file, privileged)?;
        } else {
            self.undo(
                &Undo::RemoveBlock {
                    file: file.into(),
                    marker: marker.into(),
                    added_newline,
                    created_file: created,
                    privileged,
                },
                &[],
            )?;
        }
        // An existing file keeps its mode and owner.
        let mut a = self.attrs(st.as_ref().map_or(0o644, |s| s.mode), privileged);
        if let Some(s) = &st {
            a.owner = Some((s.uid, s.gid));
        }
        self.host
            .write_file(file, new.as_bytes(), &a)
            .map_err(|e| e.to_string())?;
        self.facts.push(Fact::Block {
            file: file.into(),
            marker: marker.into(),
            sha256: sha256_hex(body.as_bytes()),
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

/// A systemd unit or quadlet file (systemd must reload after it goes).
fn is_unit_file(path: &str) -> bool {
    ["/systemd/system/", "/systemd/user/", "/containers/systemd/"]
        .iter()
        .any(|d| path.contains(d))
}

/// Why a step does not run on this target, if it does not.
fn skip_reason(s: &InstallStep, o: &Options, rooted: bool, user: &TargetUser) -> Option<String> {
    if s.venue == Venue::Skip {
        return Some(format!("not applied on target {}", o.target));
    }
    if !o.gates.allows(s.gate) {
        return Some(format!("needs --{} (or --yes)", enum_str(&s.gate)));
    }
    let rooted_msg = |what: &str| {
        Some(format!(
            "{what} on a rooted target (--root) would touch the real system; not applied"
        ))
    };
    match &s.data {
        StepData::SystemPackages(p) if rooted => rooted_msg(&format!("{} packages", p.format)),
        StepData::SystemPackages(p) if s.phase == Some(Phase::Prepare) && p.packages.is_empty() => {
            Some("repository preparation is not implemented for host targets yet".into())
        }
        StepData::SystemPackages(p) if s.phase == Some(Phase::Prepare) => {
            let _ = p;
            Some("repository preparation is not implemented for host targets yet".into())
        }
        StepData::LocalPkgInstall(l) if rooted => {
            rooted_msg(&format!("installing {} packages", l.format))
        }
        StepData::Op(op)
            if rooted && matches!(op.verb.as_str(), "cmd" | "download" | "setcap" | "build") =>
        {
            rooted_msg(&format!("`{}`", op.verb))
        }
        StepData::Op(op) if matches!(op.verb.as_str(), "download" | "setcap" | "build") => {
            Some(format!(
                "`{}` tasks are not implemented for host targets yet",
                op.verb
            ))
        }
        StepData::ServicePackaged(_) if rooted => rooted_msg("enabling services"),
        StepData::ServiceCustom(c) if c.path.is_none() => {
            Some(format!("{} programs run only inside containers", c.init))
        }
        StepData::ShellSnippet(sn)
            if sn.managed_block
                && !user.shell.ends_with(&format!("/{}", sn.shell))
                && sn.shell != "sh" =>
        {
            Some(format!(
                "{} snippet; the login shell of {} is {}",
                sn.shell, user.name, user.shell
            ))
        }
        StepData::RepoChange(_) => {
            Some("repository changes are not implemented for host targets yet".into())
        }
        StepData::ApkInstall(_) => Some("android packages apply to android targets only".into()),
        StepData::Reboot(_) if o.target == "local" || rooted => {
            Some("warning: this candy asks for a reboot; the local target never reboots".into())
        }
        StepData::External(_) => Some("external steps need their plugin".into()),
        StepData::Builder(b) if s.scope == Scope::System => Some(format!(
            "system-scope {} builder artifacts are not applied to hosts yet",
            b.builder
        )),
        _ => None,
    }
}

/// The environment commands of a step run with: PATH from the recorded bin
/// dirs (artifact PATH entries, shell-hook PATH) plus the base.
fn step_env(
    user: &TargetUser,
    bin_dirs: &[String],
    extra: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut env = base_env();
    let mut path: Vec<String> = bin_dirs.to_vec();
    path.push(crate::host::BASE_PATH.to_string());
    env.insert("PATH".into(), path.join(":"));
    env.insert("HOME".into(), user.home.clone());
    env.insert("USER".into(), user.name.clone());
    for (k, v) in extra {
        env.insert(k.clone(), v.replace("{{.Home}}", &user.home));
    }
    env
}

/// Applies a plan as bundle `name`. The bundle record must not exist.
#[allow(clippy::too_many_arguments)]
pub fn apply(
    host: &mut dyn Host,
    mut ledger: Option<&mut Ledger>,
    record: &BundleRecord,
    plan: &InstallPlan,
    user: &TargetUser,
    arts: &dyn Artifacts,
    o: &Options,
    progress: &mut dyn FnMut(&StepReport),
) -> Result<Report, WalkError> {
    let rooted = host.root().is_some();
    let dry = o.dry_run || ledger.is_none();
    let mut plan = plan.clone();
    plan.resolve_home(&user.home);
    let skip: Vec<Option<String>> = plan
        .steps
        .iter()
        .map(|s| skip_reason(s, o, rooted, user))
        .collect();
    // Privilege: checked once up front, naming the steps that need it.
    let login = host.login()?;
    if !rooted && login.uid != 0 && !dry {
        let needs: Vec<String> = plan
            .steps
            .iter()
            .zip(&skip)
            .filter(|(s, k)| k.is_none() && s.scope == Scope::System)
            .map(|(s, _)| title(s))
            .collect();
        if !needs.is_empty() {
            let out = host.run(
                &Cmd::sh("true")
                    .privileged(true)
                    .timeout(Duration::from_secs(60)),
            )?;
            if !out.ok() {
                return Err(WalkError::Setup(format!(
                    "{}: `sudo -n` needs a password for {}, and these steps need root:\n  {}\n(allow passwordless sudo, or log in as root)",
                    host.describe(),
                    login.name,
                    needs.join("\n  ")
                )));
            }
        }
    }
    let _lock = match ledger.as_deref_mut() {
        Some(l) if !dry => {
            let lock = l.lock(&record.name)?;
            l.create(record)?;
            Some(lock)
        }
        _ => None,
    };
    if !dry {
        // A killed earlier walk's temp files in the directories this one writes.
        let _ = sweep(host, &[], Some(&plan));
    }
    let mut report = Report {
        bundle: record.name.clone(),
        host: host.describe(),
        user: user.clone(),
        dry_run: dry,
        steps: Vec::new(),
    };
    // Bin dirs recorded so far (commands of later steps see them).
    let mut bin_dirs: Vec<String> = Vec::new();
    // Directories a dry run would have created so far.
    let mut planned_dirs: BTreeSet<String> = BTreeSet::new();
    for (i, s) in plan.steps.iter().enumerate() {
        let seq = i as u32;
        let h = head(s);
        if let Some(reason) = &skip[i] {
            if let Some(l) = ledger.as_deref_mut().filter(|_| !dry) {
                l.begin_step(&record.name, seq, &h, StepState::Skipped, Some(reason))?;
            }
            let r = StepReport {
                seq,
                candy: h.candy,
                kind: h.kind,
                scope: h.scope,
                title: h.title,
                state: "skipped".into(),
                note: Some(reason.clone()),
                actions: Vec::new(),
            };
            progress(&r);
            report.steps.push(r);
            continue;
        }
        let led = if dry { None } else { ledger.as_deref_mut() };
        let mut led = led;
        if let Some(l) = led.as_deref_mut() {
            l.begin_step(&record.name, seq, &h, StepState::Incomplete, None)?;
        }
        let mut cx = StepCx {
            host: &mut *host,
            ledger: led,
            bundle: &record.name,
            seq,
            user,
            facts: Vec::new(),
            actions: Vec::new(),
            on_change: if dry { None } else { o.on_change.clone() },
            timeout: o.timeout,
            rooted,
            box_home: o.box_home.clone(),
            planned_dirs: &mut planned_dirs,
        };
        let res = apply_step(&mut cx, s, arts, &mut bin_dirs);
        let StepCx { facts, actions, .. } = cx;
        let state = match &res {
            Ok(()) if dry => "would-run",
            Ok(()) => "complete",
            Err(_) => "failed",
        };
        if let Some(l) = ledger.as_deref_mut().filter(|_| !dry) {
            match &res {
                Ok(()) => l.finish_step(&record.name, seq, StepState::Complete, None, &facts)?,
                Err(e) => l.finish_step(&record.name, seq, StepState::Failed, Some(e), &facts)?,
            }
        }
        let r = StepReport {
            seq,
            candy: h.candy,
            kind: h.kind,
            scope: h.scope,
            title: h.title.clone(),
            state: state.into(),
            note: res.as_ref().err().cloned(),
            actions,
        };
        progress(&r);
        report.steps.push(r);
        if let Err(message) = res {
            let not_attempted: Vec<String> = plan.steps[i + 1..]
                .iter()
                .enumerate()
                .map(|(j, s)| format!("{} {}", i + 1 + j, title(s)))
                .collect();
            if let Some(l) = ledger.as_deref_mut().filter(|_| !dry) {
                let err = format!("step {seq} ({}) failed: {message}", h.title);
                l.set_state(&record.name, BundleState::Failed, Some(&err))?;
            }
            return Err(WalkError::Step {
                seq,
                title: h.title,
                message,
                not_attempted,
            });
        }
    }
    if let Some(l) = ledger.filter(|_| !dry) {
        l.set_state(&record.name, BundleState::Applied, None)?;
    }
    Ok(report)
}

fn apply_step(
    cx: &mut StepCx<'_>,
    s: &InstallStep,
    arts: &dyn Artifacts,
    bin_dirs: &mut Vec<String>,
) -> R<()> {
    let sys = s.scope == Scope::System;
    match &s.data {
        StepData::File(f) => file_step(cx, s, f, arts),
        StepData::Op(op) => op_step(cx, s, op, bin_dirs),
        StepData::ShellHook(h) => {
            bin_dirs.extend(h.path.iter().cloned());
            hook_step(cx, s, h)
        }
        StepData::ShellSnippet(sn) => snippet_step(cx, s, sn),
        StepData::Builder(b) => {
            bin_dirs.extend(b.path.iter().cloned());
            builder_step(cx, s, b, arts)
        }
        StepData::ServiceCustom(c) => {
            let Some(path) = &c.path else {
                return Err("no unit path".into());
            };
            cx.put_file(path, c.text.as_bytes(), 0o644, sys)?;
            if cx.rooted {
                cx.actions
                    .push("rooted target: unit written, not enabled".into());
                return Ok(());
            }
            service_enable(cx, &c.unit, sys, c.enable)
        }
        StepData::ServicePackaged(p) => service_enable(cx, &p.unit, sys, p.enable),
        StepData::SystemPackages(p) => {
            let install = p.host_cmd.clone().unwrap_or_else(|| {
                let list = p
                    .packages
                    .iter()
                    .map(|x| sq(x))
                    .collect::<Vec<_>>()
                    .join(" ");
                match p.format.as_str() {
                    "deb" => format!("DEBIAN_FRONTEND=noninteractive apt-get install -y -- {list}"),
                    "rpm" => format!("dnf install -y {list}"),
                    _ => format!("pacman -S --needed --noconfirm {list}"),
                }
            });
            let uninstall = s.reverse.first().and_then(|r| r.uninstall_cmd.clone());
            packages(cx, &p.format, &p.packages, &install, uninstall)
        }
        StepData::LocalPkgInstall(l) => local_pkg_step(cx, s, l, arts),
        StepData::Reboot(_) => reboot_step(cx),
        _ => Err(format!("{} steps are not applied to hosts", s.kind)),
    }
}

fn file_step(cx: &mut StepCx<'_>, s: &InstallStep, f: &FileStep, arts: &dyn Artifacts) -> R<()> {
    let sys = s.scope == Scope::System;
    let data = match (f.verb.as_str(), &f.content, &f.source) {
        ("write", Some(c), _) => c.clone().into_bytes(),
        ("copy", _, Some(src)) => arts.candy_file(&s.candy, src)?,
        _ => return Err(format!("`{}` without content or source", f.verb)),
    };
    let default = if f.verb == "copy" { 0o755 } else { 0o644 };
    cx.put_file(&f.path, &data, parse_mode(&f.mode, default), sys)
}

fn op_step(cx: &mut StepCx<'_>, s: &InstallStep, op: &OpStep, bin_dirs: &[String]) -> R<()> {
    let sys = s.scope == Scope::System;
    match op.verb.as_str() {
        "mkdir" => {
            let mode = op.mode.as_deref().map_or(0o755, |m| parse_mode(m, 0o755));
            cx.ensure_dir(&op.value, mode, sys)
        }
        "link" => {
            let target = op
                .target
                .as_deref()
                .ok_or("link without a target")?
                .to_string();
            cx.put_symlink(&op.value, &target, sys)
        }
        "cmd" => {
            let mut c = Cmd::sh(op.value.clone());
            c.env = step_env(cx.user, bin_dirs, &op.env);
            c.privileged = sys;
            if !sys {
                c.as_user = Some(cx.user.name.clone());
            }
            if !cx.dry() {
                cx.undo(
                    &Undo::Note {
                        text: format!(
                            "`{}` ran a command; what it changed is not undone",
                            title(s)
                        ),
                    },
                    &[],
                )?;
            }
            cx.run(c, "command")?;
            cx.changed();
            Ok(())
        }
        v => Err(format!("`{v}` is not supported on host targets")),
    }
}

fn env_file_text(h: &ShellHookStep) -> String {
    let mut t = String::from("# Written by charly; removed by `charly bundle del`.\n");
    for (k, v) in &h.env {
        t.push_str(&format!("export {k}={}\n", dq(v)));
    }
    for p in h.path.iter().rev() {
        t.push_str(&format!(
            "case \":$PATH:\" in *:{p}:*) ;; *) PATH={}:$PATH ;; esac\n",
            dq(p)
        ));
    }
    t.push_str("export PATH\n");
    t
}

fn dq(s: &str) -> String {
    format!(
        "\"{}\"",
        s.replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('`', "\\`")
            .replace('$', "\\$")
    )
}

fn hook_step(cx: &mut StepCx<'_>, s: &InstallStep, h: &ShellHookStep) -> R<()> {
    cx.put_file(&h.env_file, env_file_text(h).as_bytes(), 0o644, false)?;
    let rc = rc_file(&cx.user.shell, &cx.user.home);
    let line = if rc.ends_with(".fish") {
        format!(
            "test -r {f}; and bass source {f} 2>/dev/null; or true",
            f = sq(&h.env_file)
        )
    } else {
        format!("[ -r {f} ] && . {f}", f = sq(&h.env_file))
    };
    cx.put_block(&rc, &format!("charly-env:{}", s.candy), &line, false)
}

fn snippet_step(cx: &mut StepCx<'_>, s: &InstallStep, sn: &ShellSnippetStep) -> R<()> {
    let sys = s.scope == Scope::System;
    if sn.managed_block {
        cx.put_block(&sn.destination, &s.candy, &sn.text, sys)
    } else {
        cx.put_file(&sn.destination, sn.text.as_bytes(), 0o644, sys)
    }
}

fn service_enable(cx: &mut StepCx<'_>, unit: &str, sys: bool, enable: bool) -> R<()> {
    let user_flag = if sys { "" } else { " --user" };
    let u = sq(unit);
    let mut c = Cmd::sh(format!(
        "systemctl{user_flag} daemon-reload && systemctl{user_flag} {} {u}",
        if enable { "enable --now" } else { "start" }
    ));
    c.privileged = sys;
    if !sys {
        c.as_user = Some(cx.user.name.clone());
        c.env.insert(
            "XDG_RUNTIME_DIR".into(),
            format!("/run/user/{}", cx.user.uid),
        );
    }
    if !cx.dry() {
        cx.undo(
            &Undo::Run {
                what: format!("{} {unit}", if enable { "disable" } else { "stop" }),
                // A started (generated, e.g. quadlet) unit cannot be disabled.
                script: if enable {
                    format!("systemctl{user_flag} disable --now {u}")
                } else {
                    format!("systemctl{user_flag} stop {u}")
                },
                privileged: sys,
                as_user: (!sys).then(|| cx.user.name.clone()),
                env: c.env.clone(),
                ignore_failure: true,
            },
            &[],
        )?;
    }
    cx.run(c, &format!("enable {unit}"))?;
    cx.changed();
    Ok(())
}

/// Reboots the target and waits (up to the step timeout) until it answers
/// with a new boot_id; the connection is re-established.
fn reboot_step(cx: &mut StepCx<'_>) -> R<()> {
    const BOOT_ID: &str = "cat /proc/sys/kernel/random/boot_id";
    let minute = Duration::from_secs(60);
    let before = cx.run(Cmd::sh(BOOT_ID).timeout(minute), "read boot_id")?;
    let before = before.trim().to_string();
    let reboot = Cmd::sh("systemctl reboot || reboot")
        .privileged(true)
        .timeout(minute);
    let login = cx.host.login().map_err(|e| e.to_string())?;
    cx.actions.push(reboot.display(&login, cx.rooted));
    cx.actions
        .push("reconnect and wait for a new boot_id".into());
    if cx.dry() {
        return Ok(());
    }
    if before.is_empty() {
        return Err("the target has no /proc/sys/kernel/random/boot_id".into());
    }
    cx.undo(
        &Undo::Note {
            text: "a reboot cannot be undone".into(),
        },
        &[],
    )?;
    // The connection may drop while the command runs: an error is expected.
    match cx.host.run(&reboot) {
        Ok(out) if !out.ok() && out.status != 255 => {
            return Err(format!(
                "reboot: exit {}: {}",
                out.status,
                out.stderr_tail()
            ));
        }
        _ => {}
    }
    cx.changed();
    let deadline = std::time::Instant::now() + cx.timeout;
    let mut last = String::new();
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(format!(
                "no new boot within {} s (boot_id still {before}){}",
                cx.timeout.as_secs(),
                if last.is_empty() {
                    String::new()
                } else {
                    format!("; last error: {last}")
                }
            ));
        }
        if let Err(e) = cx.host.reconnect(left) {
            last = e.to_string();
            continue;
        }
        match cx.host.run(&Cmd::sh(BOOT_ID).timeout(minute)) {
            Ok(o) if o.ok() && !o.stdout_str().trim().is_empty() => {
                if o.stdout_str().trim() != before {
                    return Ok(());
                }
            }
            Ok(o) => last = format!("boot_id: exit {}", o.status),
            Err(e) => last = e.to_string(),
        }
    }
}

/// Installs packages; the undo removes only those that were not installed before.
fn packages(
    cx: &mut StepCx<'_>,
    format: &str,
    pkgs: &[String],
    install: &str,
    uninstall: Option<String>,
) -> R<()> {
    if pkgs.is_empty() {
        return Ok(());
    }
    for t in pkg::tools(format) {
        let found = cx
            .host
            .which(t, crate::host::BASE_PATH)
            .map_err(|e| e.to_string())?;
        if found.is_none() {
            return Err(format!(
                "`{t}` is not installed on {} (needed for {format} packages)",
                cx.host.describe()
            ));
        }
    }
    let before = installed(cx, format, pkgs)?;
    let new: Vec<String> = pkgs
        .iter()
        .filter(|p| !before.contains(*p))
        .cloned()
        .collect();
    if !cx.dry() && !new.is_empty() {
        let command = uninstall
            .filter(|_| new.len() == pkgs.len())
            .unwrap_or_else(|| pkg::remove_script(format, &new, None));
        cx.undo(
            &Undo::RemovePackages {
                format: format.into(),
                packages: new.clone(),
                command,
                root: None,
            },
            &[],
        )?;
    }
    let mut c = Cmd::sh(install.to_string());
    c.privileged = true;
    cx.run(c, "package install")?;
    cx.changed();
    if !cx.dry() {
        let after = installed(cx, format, pkgs)?;
        let missing: Vec<&String> = pkgs.iter().filter(|p| !after.contains(*p)).collect();
        if !missing.is_empty() {
            return Err(format!(
                "the install command succeeded but these packages are not installed: {}",
                missing
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(" ")
            ));
        }
        cx.facts.push(Fact::Packages {
            format: format.into(),
            packages: pkgs.to_vec(),
            root: None,
        });
    }
    Ok(())
}

fn installed(cx: &mut StepCx<'_>, format: &str, pkgs: &[String]) -> R<BTreeSet<String>> {
    if cx.dry() {
        return Ok(BTreeSet::new());
    }
    let script = pkg::query_script(format, pkgs, None)
        .ok_or_else(|| format!("unknown package format {format}"))?;
    let out = cx
        .host
        .run(&Cmd::sh(script).timeout(cx.timeout))
        .map_err(|e| e.to_string())?;
    pkg::parse_installed(format, &out.stdout_str())
        .map_err(|e| format!("unexpected output from the {format} package query: {e}"))
}

fn local_pkg_step(
    cx: &mut StepCx<'_>,
    s: &InstallStep,
    l: &charly_rules::plan::LocalPkgStep,
    arts: &dyn Artifacts,
) -> R<()> {
    let files = arts.local_packages(&s.candy, &l.format)?;
    let dir = format!("/tmp/charly-pkgs-{}-{}", cx.bundle, cx.seq);
    let mut names = Vec::new();
    if !cx.dry() {
        let _ = cx.host.remove(&dir, true);
        cx.host
            .mkdir(
                &dir,
                &FileAttrs {
                    mode: 0o755,
                    owner: None,
                    privileged: true,
                },
            )
            .map_err(|e| e.to_string())?;
    }
    cx.actions
        .push(format!("upload {} package(s) to {dir}", files.len()));
    for (n, data) in &files {
        let p = format!("{dir}/{n}");
        if !cx.dry() {
            cx.host
                .write_file(
                    &p,
                    data,
                    &FileAttrs {
                        mode: 0o644,
                        owner: None,
                        privileged: true,
                    },
                )
                .map_err(|e| e.to_string())?;
            let script = pkg::name_script(&l.format, &cx.host.real(&p))
                .ok_or_else(|| format!("unknown package format {}", l.format))?;
            let out = cx
                .host
                .run(&Cmd::sh(script).timeout(cx.timeout))
                .map_err(|e| e.to_string())?;
            let name = out.stdout_str().trim().to_string();
            if !out.ok() || !pkg::valid_name(&name) {
                return Err(format!(
                    "cannot read the package name of {n}: {}",
                    crate::host::shorten(&name, 100)
                ));
            }
            names.push(name);
        }
    }
    let glob = format!("*.{}", l.format);
    let install = pkg::install_files_script(&l.format, &cx.host.real(&dir), &glob, None);
    let res = packages(cx, &l.format, &names, &install, None);
    if !cx.dry() {
        for (n, _) in &files {
            let _ = cx.host.remove(&format!("{dir}/{n}"), true);
        }
        let _ = cx.host.remove(&dir, true);
    }
    res
}

/// Rewrites an artifact tar made for the box user (home `from`) for the
/// target user: paths under `from` move to the target home, owners become
/// the target user's.
pub fn retarget_artifact(
    tar: &[u8],
    from_home: &str,
    user: &TargetUser,
) -> R<Vec<charly_engine::artifact::Entry>> {
    let entries = charly_engine::artifact::read_tar(tar, "")
        .map_err(|e| format!("unreadable artifact tar: {e}"))?;
    if entries.is_empty() {
        return Err(format!(
            "the artifact tar ({} bytes) has no entries; is it a tar? (rebuild it with `charly box build`)",
            tar.len()
        ));
    }
    let from = from_home.trim_matches('/');
    let to = user.home.trim_matches('/');
    let mut out = Vec::with_capacity(entries.len());
    for mut e in entries {
        if e.path.split('/').any(|c| c == "..") {
            return Err(format!("artifact entry `{}` escapes the root", e.path));
        }
        if !from.is_empty() && from != to {
            if e.path == from {
                e.path = to.to_string();
            } else if let Some(rest) = e.path.strip_prefix(&format!("{from}/")) {
                e.path = format!("{to}/{rest}");
            }
        }
        e.uid = u64::from(user.uid);
        e.gid = u64::from(user.gid);
        out.push(e);
    }
    Ok(out)
}

fn builder_step(
    cx: &mut StepCx<'_>,
    s: &InstallStep,
    b: &BuilderStep,
    arts: &dyn Artifacts,
) -> R<()> {
    let tar = arts.builder_tar(&s.candy, &b.builder)?;
    let from = cx.box_home.clone();
    let entries = retarget_artifact(&tar, &from, cx.user)?;
    let paths: Vec<String> = entries.iter().map(|e| format!("/{}", e.path)).collect();
    cx.actions.push(format!(
        "extract {} {} artifact entries ({} bytes) into {}",
        entries.len(),
        b.builder,
        tar.len(),
        cx.user.home
    ));
    // Ancestors outside the tar (the home itself, usually present).
    let in_tar: BTreeSet<&str> = paths.iter().map(String::as_str).collect();
    let mut ancestors = BTreeSet::new();
    for p in &paths {
        let mut cur = parent(p);
        while let Some(d) = cur {
            if d == "/" || in_tar.contains(d) {
                break;
            }
            ancestors.insert(d.to_string());
            cur = parent(d);
        }
    }
    for a in ancestors
        .iter()
        .filter(|a| !ancestors.iter().any(|b| b.starts_with(&format!("{a}/"))))
    {
        cx.ensure_dir(a, 0o755, false)?;
        if !cx.dry() {
            cx.facts.pop();
        }
    }
    if cx.dry() {
        return Ok(());
    }
    let stats = cx.host.stat(&paths, false).map_err(|e| e.to_string())?;
    let mut created = Vec::new();
    for ((p, st), e) in paths.iter().zip(&stats).zip(&entries) {
        match (st.as_ref().map(|s| &s.kind), &e.kind) {
            (None, _) => created.push(p.clone()),
            (Some(PathKind::Dir), charly_engine::artifact::Kind::Dir) => {}
            (Some(PathKind::File { .. } | PathKind::Symlink { .. }), _) => {
                cx.record_replace(p, false)?;
            }
            (Some(k), _) => {
                return Err(format!(
                    "{p} exists as {k:?}, the artifact has another kind"
                ));
            }
        }
    }
    cx.undo(
        &Undo::RemoveTree {
            paths: created,
            privileged: false,
        },
        &[],
    )?;
    let tmp = tempfile::NamedTempFile::new().map_err(|e| e.to_string())?;
    charly_engine::artifact::write_tar(tmp.path(), entries.clone(), None)
        .map_err(|e| e.to_string())?;
    let bytes = std::fs::read(tmp.path()).map_err(|e| e.to_string())?;
    cx.host
        .extract_tar(&bytes, false)
        .map_err(|e| e.to_string())?;
    for (p, e) in paths.iter().zip(&entries) {
        cx.facts.push(match &e.kind {
            charly_engine::artifact::Kind::Dir => Fact::Dir { path: p.clone() },
            charly_engine::artifact::Kind::Symlink(t) => Fact::Symlink {
                path: p.clone(),
                target: t.clone(),
            },
            charly_engine::artifact::Kind::File(d) => Fact::File {
                path: p.clone(),
                sha256: sha256_hex(d),
                mode: e.mode & 0o7777,
            },
        });
    }
    cx.changed();
    Ok(())
}

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
/// as it succeeds (an interrupted `del` resumes), then the record.
pub fn remove(
    host: &mut dyn Host,
    ledger: &mut Ledger,
    name: &str,
    dry_run: bool,
    progress: &mut dyn FnMut(&UndoReport),
) -> Result<Vec<UndoReport>, WalkError> {
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
    let _ = rec;
    let steps = ledger.steps(name)?;
    if !dry_run {
        for d in sweep(host, &steps, None) {
            progress(&UndoReport {
                seq: 0,
                what: d.subject,
                state: "warning".into(),
                note: Some(d.detail),
            });
        }
    }
    let mut ops: Vec<(u32, u32, Undo)> = steps
        .iter()
        .flat_map(|s| s.undo.iter().map(move |(i, u)| (s.seq, *i, u.clone())))
        .collect();
    ops.sort_by_key(|o| std::cmp::Reverse((o.0, o.1)));
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
        let res = undo_one(host, ledger, name, &op);
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
                    message: format!("{e} (run `charly bundle del {name}` again to resume)"),
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
    if !dry_run {
        ledger.remove(name)?;
    }
    Ok(out)
}

fn undo_one(host: &mut dyn Host, ledger: &Ledger, name: &str, op: &Undo) -> R<Option<String>> {
    let e = |x: HostError| x.to_string();
    match op {
        Undo::RemovePath { path, privileged } => {
            let st = host
                .stat(std::slice::from_ref(path), false)
                .map_err(e)?
                .pop()
                .flatten();
            if matches!(st.map(|s| s.kind), Some(PathKind::Dir)) {
                return Ok(Some(format!("{path} is now a directory; left alone")));
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
fn sweep(
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
    for s in &steps {
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
    // Disk vs recorded: one stat round trip for every path fact.
    let mut paths = Vec::new();
    for s in &steps {
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
    for s in &steps {
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
    // Config vs recorded.
    if let Some(cur) = current {
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
                        out.push(Drift {
                            kind: "config".into(),
                            seq: Some(i as u32),
                            subject: b.title.clone(),
                            detail: format!("the plan now says: {}", title(a)),
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
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_round_trip() {
        let base = "a\nb";
        let (b, e) = block_markers("m");
        let with = format!("{base}\n{b}\nx=1\n{e}\n");
        assert_eq!(find_block(&with, "m").as_deref(), Some("x=1\n"));
        assert_eq!(strip_block(&with, "m"), "a\nb\n");
        assert_eq!(strip_block("plain\n", "m"), "plain\n");
        assert_eq!(rc_file("/bin/zsh", "/h"), "/h/.zshrc");
        assert_eq!(rc_file("/bin/dash", "/h"), "/h/.profile");
    }

    #[test]
    fn artifact_is_retargeted() {
        let t = tempfile::tempdir().expect("tmp");
        let p = t.path().join("a.tar");
        charly_engine::artifact::write_tar(
            &p,
            vec![
                charly_engine::artifact::Entry {
                    path: "home/user/.npm-global".into(),
                    kind: charly_engine::artifact::Kind::Dir,
                    mode: 0o755,
                    uid: 1000,
                    gid: 1000,
                },
                charly_engine::artifact::Entry {
                    path: "home/user/.npm-global/x".into(),
                    kind: charly_engine::artifact::Kind::File(b"x".to_vec()),
                    mode: 0o644,
                    uid: 1000,
                    gid: 1000,
                },
            ],
            None,
        )
        .expect("tar");
        let user = TargetUser {
            name: "al".into(),
            uid: 1001,
            gid: 1002,
            home: "/srv/al".into(),
            shell: "/bin/bash".into(),
        };
        let e = retarget_artifact(&std::fs::read(&p).expect("read"), "/home/user", &user)
            .expect("retarget");
        assert_eq!(e[1].path, "srv/al/.npm-global/x");
        assert_eq!((e[1].uid, e[1].gid), (1001, 1002));
    }
}
