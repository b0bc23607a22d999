//! Consecutive steps of one (scope, venue) in one round trip.
//!
//! A target reached over SSH pays a channel, a privilege switch and a
//! shell start per command, and a step makes several: it asks the host
//! what is there (the packages installed, the unit's state, the
//! capabilities a file has, which directories exist), records the undo
//! that follows from the answer, makes the change, and checks it. So a
//! run of steps that are commands with a verifiable outcome — `cmd`
//! tasks, package installs, packaged services enabled, `mkdir`, `link`,
//! `setcap` — of one (scope, venue) (see `InstallPlan::steps_by_venue`)
//! goes in two round trips, whatever its length:
//!
//! 1. **probe**: one script asks every question of every step, each
//!    answer between markers carrying a nonce the commands cannot know;
//! 2. **intent**: from the answers, each step is recorded `incomplete`
//!    with its undo (tagged with its reverse ops, as a step alone would
//!    record it) — all of them before anything changes;
//! 3. **run**: one script runs each step's commands as they would run
//!    alone, then what checks it (the package list after an install), and
//!    a marker with its exit status; the first that fails stops the script;
//! 4. **finish**: each step that reported is finished as its marker says
//!    (a package missing after its install fails its step); after a
//!    failure the steps not attempted are forgotten and the walk stops,
//!    naming the failed step, as it does for one step.
//!
//! A step whose answer asks for more than a command can do (a link over a
//! regular file, which needs a backup; a missing package manager, which
//! fails the step with its own message) ends the batch before it: it runs
//! alone, as does a batch's first step when nothing can join it.

use super::apply::{
    cmd_command, cmd_note, install_command, packages_done, packages_intent, realize_service,
    service_commands, service_undo, setcap_commands, setcap_undo, stop, uninstall_of,
};
use super::{
    Artifacts, Options, Report, StepCx, StepReport, TargetUser, WalkError, head, is_unit_file,
    reload_undo, title,
};
use crate::host::{Cmd, FileAttrs, Host, Login, PathKind, parent, parse_stat_output, stat_script};
use crate::ledger::{BundleRecord, Fact, Ledger, StepState, Undo};
use crate::{pkg, shellops};
use charly_rules::plan::{
    InstallPlan, InstallStep, OpStep, Phase, ReverseKind, Scope, StepData, SystemPackages, Venue,
};
use charly_rules::sh;
use std::collections::{BTreeMap, BTreeSet};

/// What a batch walks with (the walker's own state).
pub(super) struct Walk<'a> {
    /// The bundle.
    pub record: &'a BundleRecord,
    /// The home-resolved plan.
    pub plan: &'a InstallPlan,
    /// Why each step is skipped (None: it runs).
    pub skip: &'a [Option<String>],
    /// The account the plan is applied for.
    pub user: &'a TargetUser,
    /// The bin dirs recorded so far.
    pub bin_dirs: &'a [String],
    /// The walk's options.
    pub o: &'a Options,
    /// Where copied files come from.
    pub arts: &'a dyn Artifacts,
}

/// A step a batch can carry.
#[derive(Clone)]
enum Item<'a> {
    Cmd(&'a OpStep),
    Packages(&'a SystemPackages),
    Service {
        unit: &'a str,
        enable: bool,
    },
    Mkdir {
        path: &'a str,
        mode: u32,
    },
    Link {
        path: &'a str,
        target: &'a str,
    },
    Setcap {
        path: &'a str,
        caps: Option<&'a str>,
    },
    /// A file written (`write`, `copy`, a snippet file).
    File {
        path: &'a str,
        data: Vec<u8>,
        mode: u32,
    },
    /// A generated unit written, then enabled (or started).
    Unit {
        path: &'a str,
        data: Vec<u8>,
        unit: &'a str,
        enable: bool,
    },
}

/// The largest file a batch carries in its script (and backs up from its
/// probe): a batch script is one argument, which Linux caps at 128 KiB.
const INLINE_MAX: usize = 48 * 1024;

/// What a batch's script may grow to (estimated before anything runs).
const SCRIPT_BUDGET: usize = 96 * 1024;

impl Item<'_> {
    /// What the step does, for a message about it.
    fn what(&self) -> String {
        match self {
            Item::Cmd(_) => "command".to_string(),
            Item::Packages(_) => "package install".to_string(),
            Item::Service { unit, .. } => format!("enable {unit}"),
            Item::Mkdir { path, .. } => format!("mkdir {path}"),
            Item::Link { path, .. } => format!("link {path}"),
            Item::Setcap { .. } => "setcap".to_string(),
            Item::File { path, .. } => format!("write {path}"),
            Item::Unit { path, unit, .. } => format!("write {path} and enable {unit}"),
        }
    }

    /// About how much of the batch script it takes.
    fn size(&self) -> usize {
        match self {
            Item::Cmd(op) => {
                1024 + op.value.len()
                    + op.env
                        .iter()
                        .chain(&op.vars)
                        .map(|(k, v)| k.len() + v.len() + 4)
                        .sum::<usize>()
            }
            Item::File { data, .. } | Item::Unit { data, .. } => 1024 + data.len() * 4 / 3,
            _ => 1024,
        }
    }
}

fn parse_mode(m: &str, default: u32) -> u32 {
    u32::from_str_radix(m.trim_start_matches("0o"), 8).unwrap_or(default) & 0o7777
}

/// The batchable form of a step that runs, if it has one.
fn item<'a>(s: &'a InstallStep, skip: &Option<String>, arts: &dyn Artifacts) -> Option<Item<'a>> {
    if skip.is_some() || s.venue != Venue::HostNative {
        return None;
    }
    let small = |d: Vec<u8>| (d.len() <= INLINE_MAX).then_some(d);
    Some(match &s.data {
        StepData::File(f) => {
            let data = match (f.verb.as_str(), &f.content, &f.source) {
                ("write", Some(c), _) => c.clone().into_bytes(),
                // A copy the candy cannot give fails alone, saying why.
                ("copy", _, Some(src)) => arts.candy_file(&s.candy, src).ok()?,
                _ => return None,
            };
            let default = if f.verb == "copy" { 0o755 } else { 0o644 };
            Item::File {
                path: &f.path,
                data: small(data)?,
                mode: parse_mode(&f.mode, default),
            }
        }
        StepData::ShellSnippet(sn) if !sn.managed_block => Item::File {
            path: &sn.destination,
            data: small(sn.text.clone().into_bytes())?,
            mode: 0o644,
        },
        StepData::ServiceCustom(c) => Item::Unit {
            path: c.path.as_deref()?,
            data: small(c.text.clone().into_bytes())?,
            unit: &c.unit,
            enable: c.enable,
        },
        StepData::Op(op) => match op.verb.as_str() {
            "cmd" => Item::Cmd(op),
            "mkdir" => Item::Mkdir {
                path: &op.value,
                mode: op.mode.as_deref().map_or(0o755, |m| parse_mode(m, 0o755)),
            },
            "link" => Item::Link {
                path: &op.value,
                target: op.target.as_deref()?,
            },
            // setcap runs as root whoever the task names.
            "setcap" if s.scope == Scope::System => Item::Setcap {
                path: &op.value,
                caps: op.caps.as_deref(),
            },
            _ => return None,
        },
        StepData::SystemPackages(p)
            if s.phase != Some(Phase::Prepare) && !p.packages.is_empty() =>
        {
            Item::Packages(p)
        }
        StepData::ServicePackaged(p) => Item::Service {
            unit: &p.unit,
            enable: p.enable,
        },
        _ => return None,
    })
}

/// A marker line printed before (`probe`, `verify`) or after (`end` with
/// the exit status) a step's part of a script; the nonce keeps output of
/// the commands from passing for one.
fn marker(nonce: &str, what: &str, seq: u32, rc: bool) -> String {
    if rc {
        format!("printf '\\n@@charly-%s end %s %s\\n' {nonce} {seq} \"$__rc\"")
    } else {
        format!("printf '\\n@@charly-%s {what} %s\\n' {nonce} {seq}")
    }
}

/// The output of a script of marked parts: the text of each `(part, seq)`
/// section, and the exit status each `end` marker reported.
#[derive(Debug, Default, PartialEq)]
struct Sections {
    text: BTreeMap<(String, u32), String>,
    /// The status of each step's last `end` marker.
    rc: BTreeMap<u32, i32>,
    /// The status each section ended with.
    part_rc: BTreeMap<(String, u32), i32>,
}

impl Sections {
    /// The text of part `part` of step `seq`, when it ended with status 0.
    fn ok(&self, part: &str, seq: u32) -> Option<&str> {
        let k = (part.to_string(), seq);
        (self.part_rc.get(&k) == Some(&0))
            .then(|| self.text.get(&k).map(String::as_str))
            .flatten()
    }
}

fn sections(stdout: &str, nonce: &str) -> Sections {
    let prefix = format!("@@charly-{nonce} ");
    let mut out = Sections::default();
    let mut open: Option<(String, u32)> = None;
    for line in stdout.split('\n') {
        if let Some(rest) = line.strip_prefix(&prefix) {
            let w: Vec<&str> = rest.split_whitespace().collect();
            match w.as_slice() {
                ["end", seq, rc] => {
                    if let (Ok(seq), Ok(rc)) = (seq.parse(), rc.parse()) {
                        out.rc.insert(seq, rc);
                        if let Some(k) = open.take().filter(|k| k.1 == seq) {
                            out.part_rc.insert(k, rc);
                        }
                    }
                    open = None;
                }
                [part, seq] => {
                    open = seq.parse().ok().map(|s| (part.to_string(), s));
                    if let Some(k) = &open {
                        out.text.insert(k.clone(), String::new());
                    }
                }
                _ => {}
            }
            continue;
        }
        if let Some(k) = &open
            && let Some(t) = out.text.get_mut(k)
        {
            t.push_str(line);
            t.push('\n');
        }
    }
    out
}

/// A command as a batch runs it: its own environment and program, without
/// the privilege switch (the batch makes it once for all).
fn inner(c: &Cmd, login: &Login, rooted: bool) -> String {
    let mut c = c.clone();
    c.privileged = false;
    c.as_user = None;
    sh::join_min(&c.argv_for(login, rooted))
}

/// The directories from `/` down to `dir` (not `/`).
fn chain(dir: &str) -> Vec<String> {
    let mut v = Vec::new();
    let mut cur = Some(dir.trim_end_matches('/'));
    while let Some(d) = cur {
        if d.is_empty() || d == "/" {
            break;
        }
        v.push(d.to_string());
        cur = parent(d);
    }
    v.reverse();
    v
}

/// What a step of a batch asks before anything changes: the parts of its
/// probe (each answered in its own section).
fn probe_of(
    host: &dyn Host,
    w: &Walk<'_>,
    s: &InstallStep,
    it: &Item<'_>,
) -> Vec<(&'static str, Cmd)> {
    let sys = s.scope == Scope::System;
    // A path and the directories above it, stat'ed; a regular file there
    // read (for its backup).
    let file = |path: &str| {
        let mut paths = parent(path).map(chain).unwrap_or_default();
        paths.push(path.to_string());
        let real: Vec<String> = paths.iter().map(|d| host.real(d)).collect();
        vec![
            ("probe", Cmd::sh(stat_script(&real, false))),
            (
                "content",
                Cmd::sh(shellops::read_inline_script(
                    &host.real(path),
                    INLINE_MAX as u64,
                )),
            ),
        ]
    };
    match it {
        Item::Cmd(_) => Vec::new(),
        Item::Packages(p) => {
            let Some(list) = pkg::list_all_script(&p.format) else {
                return Vec::new();
            };
            let tools: Vec<String> = pkg::tools(&p.format)
                .iter()
                .map(|t| format!("command -v {t} >/dev/null 2>&1 || echo '@missing {t}'"))
                .collect();
            vec![("probe", Cmd::sh(format!("{}\n{list}", tools.join("\n"))))]
        }
        Item::Service { unit, enable } => {
            vec![("probe", service_commands(unit, sys, *enable, w.user).1)]
        }
        Item::Mkdir { path, .. } => {
            let real: Vec<String> = chain(path).iter().map(|d| host.real(d)).collect();
            vec![("probe", Cmd::sh(stat_script(&real, false)))]
        }
        Item::Link { path, .. } => {
            let mut paths = parent(path).map(chain).unwrap_or_default();
            paths.push(path.to_string());
            let real: Vec<String> = paths.iter().map(|d| host.real(d)).collect();
            vec![("probe", Cmd::sh(stat_script(&real, false)))]
        }
        Item::Setcap { path, caps } => {
            vec![("probe", setcap_commands(&host.real(path), *caps).1)]
        }
        Item::File { path, .. } => file(path),
        Item::Unit {
            path, unit, enable, ..
        } => {
            let mut v = file(path);
            v.push(("state", service_commands(unit, sys, *enable, w.user).1));
            v
        }
    }
}

/// What was at a file's path before: nothing, a link, or a regular file
/// (content, mode, owner).
enum Prior {
    Absent,
    Link(String),
    File(Vec<u8>, u32, u32, u32),
}

/// The directories to make and what is at `path`, from a file probe's
/// answers; None when the batch cannot do it (a directory there, a file
/// too large to back up here, a parent that is not a directory).
fn file_prior(
    path: &str,
    probe: &str,
    content: Option<&str>,
    sys: bool,
    home: &str,
) -> Option<(Vec<(String, bool)>, Prior)> {
    use base64::Engine as _;
    let c = parent(path).map(chain).unwrap_or_default();
    let st = parse_stat_output(probe, c.len() + 1).ok()?;
    let dirs = missing_dirs(&c, &st[..c.len()], sys, home)?;
    let prior = match st[c.len()].as_ref() {
        None => Prior::Absent,
        Some(x) => match &x.kind {
            PathKind::Symlink { target } => Prior::Link(target.clone()),
            PathKind::File { .. } => {
                let text = content?.trim();
                if text == "@too-big" {
                    return None;
                }
                let data = base64::engine::general_purpose::STANDARD
                    .decode(text)
                    .ok()?;
                Prior::File(data, x.mode, x.uid, x.gid)
            }
            _ => return None,
        },
    };
    Some((dirs, prior))
}

/// What the steps of a batch before the one being prepared will have
/// made by the time it runs (its probe ran before all of them).
#[derive(Default)]
struct Made {
    /// Directories.
    dirs: BTreeSet<String>,
    /// Files and links.
    paths: BTreeSet<String>,
}

impl Made {
    /// `dirs` without those made before; None when `path` (the step's
    /// own file or link) was made before (what is there then is not what
    /// the probe saw: the step runs alone).
    fn fresh(&self, path: Option<&str>, dirs: Vec<(String, bool)>) -> Option<Vec<(String, bool)>> {
        if path.is_some_and(|p| self.paths.contains(p) || self.dirs.contains(p)) {
            return None;
        }
        Some(
            dirs.into_iter()
                .filter(|(d, _)| !self.dirs.contains(d))
                .collect(),
        )
    }
}

/// A step of the batch whose intent is recorded.
struct Ready<'a> {
    seq: u32,
    step: &'a InstallStep,
    item: Item<'a>,
    /// Its commands, in order (all must succeed).
    run: Vec<Cmd>,
    /// What checks it after (the package list).
    verify: Option<Cmd>,
    /// What it does, for people.
    actions: Vec<String>,
    /// Facts known before it runs (left when it succeeds).
    facts: Vec<Fact>,
    /// The reverse ops its recorded undo carries out.
    realized: BTreeSet<usize>,
    /// Packages: the new ones and the list before the batch.
    pkgs: Option<(Vec<String>, BTreeSet<String>)>,
}

/// The directories of `paths` (a [`chain`], stat'ed) that are missing, with
/// the privilege each is made with; None when one is not a directory or
/// needs another privilege than the batch runs with.
fn missing_dirs(
    chain: &[String],
    stats: &[Option<crate::host::Stat>],
    sys: bool,
    home: &str,
) -> Option<Vec<(String, bool)>> {
    let mut out = Vec::new();
    for (d, st) in chain.iter().zip(stats) {
        match st.as_ref().map(|s| &s.kind) {
            Some(PathKind::Dir | PathKind::Symlink { .. }) => {}
            Some(_) => return None,
            None => {
                // As a step alone makes them: the user's own below the home.
                let p = sys || !d.starts_with(home);
                if p != sys {
                    return None;
                }
                out.push((d.clone(), p));
            }
        }
    }
    Some(out)
}

/// What a probe's answers say a step will do, decided before anything is
/// recorded.
enum Decided {
    Cmd,
    /// The packages installed before.
    Packages(BTreeSet<String>),
    /// The unit's state before.
    Service(String),
    /// Directories to make (each with its privilege).
    Dirs(Vec<(String, bool)>),
    /// Directories to make, the link's target before.
    Link(Vec<(String, bool)>, Option<String>),
    /// The file's capabilities before.
    Setcap(String),
    /// Directories to make, what was at the path.
    File(Vec<(String, bool)>, Prior),
    /// Directories to make, what was at the path, the unit's state before.
    Unit(Vec<(String, bool)>, Prior, String),
}

/// Decides what step `seq` will do from its probe's answers, and notes in
/// `made` what it makes for the steps after it; None when the answers ask
/// for more than the batch can do.
fn decide(
    it: &Item<'_>,
    answers: &Sections,
    seq: u32,
    sys: bool,
    home: &str,
    made: &mut Made,
) -> Option<Decided> {
    let probe = answers.ok("probe", seq);
    let decided = match it {
        Item::Cmd(_) => Some(Decided::Cmd),
        Item::Packages(p) => probe.and_then(|t| {
            if t.lines().any(|l| l.starts_with("@missing ")) {
                return None;
            }
            pkg::parse_installed(&p.format, t)
                .ok()
                .map(Decided::Packages)
        }),
        Item::Service { .. } => probe.map(|t| Decided::Service(t.to_string())),
        Item::Mkdir { path, .. } => probe.and_then(|t| {
            let c = chain(path);
            let st = parse_stat_output(t, c.len()).ok()?;
            let dirs = missing_dirs(&c, &st, sys, home)?;
            made.fresh(None, dirs).map(Decided::Dirs)
        }),
        Item::Link { path, .. } => probe.and_then(|t| {
            let c = parent(path).map(chain).unwrap_or_default();
            let st = parse_stat_output(t, c.len() + 1).ok()?;
            let dirs = made.fresh(Some(path), missing_dirs(&c, &st[..c.len()], sys, home)?)?;
            match st[c.len()].as_ref().map(|x| &x.kind) {
                None => Some(Decided::Link(dirs, None)),
                Some(PathKind::Symlink { target }) => {
                    Some(Decided::Link(dirs, Some(target.clone())))
                }
                // A file needs a backup, a directory is an error: alone.
                Some(_) => None,
            }
        }),
        Item::Setcap { path, .. } => probe
            .filter(|_| !made.paths.contains(*path))
            .map(|t| Decided::Setcap(t.to_string())),
        Item::File { path, .. } => probe.and_then(|t| {
            let (dirs, prior) = file_prior(path, t, answers.ok("content", seq), sys, home)?;
            Some(Decided::File(made.fresh(Some(path), dirs)?, prior))
        }),
        Item::Unit { path, .. } => probe.and_then(|t| {
            let (dirs, prior) = file_prior(path, t, answers.ok("content", seq), sys, home)?;
            let state = answers.ok("state", seq)?;
            Some(Decided::Unit(
                made.fresh(Some(path), dirs)?,
                prior,
                state.to_string(),
            ))
        }),
    };
    // What this step makes, for the steps after it.
    match (it, &decided) {
        (Item::Mkdir { path, .. }, Some(Decided::Dirs(dirs))) => {
            made.dirs.extend(dirs.iter().map(|d| d.0.clone()));
            made.dirs.insert(path.to_string());
        }
        (Item::Link { path, .. }, Some(Decided::Link(dirs, _)))
        | (Item::File { path, .. }, Some(Decided::File(dirs, _)))
        | (Item::Unit { path, .. }, Some(Decided::Unit(dirs, _, _))) => {
            made.dirs.extend(dirs.iter().map(|d| d.0.clone()));
            made.paths.insert(path.to_string());
        }
        _ => {}
    }
    decided
}

/// Whom a step's files belong to.
struct Owner<'a> {
    user: &'a TargetUser,
    /// A system step.
    sys: bool,
    /// The target is a directory tree (no systemd to reload).
    rooted: bool,
}

impl Owner<'_> {
    /// Attributes of a path made with `mode`, as root or as the user.
    fn attrs(&self, mode: u32, privileged: bool) -> FileAttrs {
        self.user.attrs(mode, privileged)
    }

    /// The directories a step makes on the way (each recorded first);
    /// `last` is the step's own directory and its mode.
    fn mkdirs(
        &self,
        cx: &mut StepCx<'_>,
        dirs: &[(String, bool)],
        last: Option<(&str, u32)>,
    ) -> Result<Vec<Cmd>, String> {
        let mut cmds = Vec::new();
        for (d, p) in dirs {
            cx.undo_incidental(
                &Undo::RemoveDir {
                    path: d.clone(),
                    privileged: *p,
                },
                &[],
            )?;
            let mode = match last {
                Some((l, m)) if l == d => m,
                _ => 0o755,
            };
            cx.actions.push(format!("mkdir {d}"));
            cmds.push(Cmd::sh(shellops::mkdir_script(
                &cx.host.real(d),
                &self.attrs(mode, *p),
            )));
        }
        Ok(cmds)
    }

    /// A file written as `put_file` writes it: its parents, a reload after
    /// a unit file goes, what was there put back by the undo.
    fn put(
        &self,
        cx: &mut StepCx<'_>,
        path: &str,
        data: &[u8],
        mode: u32,
        dirs: &[(String, bool)],
        prior: &Prior,
    ) -> Result<(Vec<Cmd>, Fact), String> {
        let sys = self.sys;
        let mut cmds = self.mkdirs(cx, dirs, None)?;
        if !self.rooted && is_unit_file(path) {
            cx.undo_incidental(&reload_undo(sys, self.user), &[])?;
        }
        match prior {
            Prior::Absent => cx.undo(
                &Undo::RemovePath {
                    path: path.into(),
                    privileged: sys,
                },
                &[],
            )?,
            Prior::Link(t) => cx.undo(
                &Undo::RestoreSymlink {
                    path: path.into(),
                    target: t.clone(),
                    privileged: sys,
                },
                &[],
            )?,
            Prior::File(old, m, u, g) => {
                let sha = crate::host::sha256_hex(old);
                cx.undo(
                    &Undo::RestoreFile {
                        path: path.into(),
                        sha256: sha.clone(),
                        mode: *m,
                        uid: *u,
                        gid: *g,
                        privileged: sys,
                    },
                    &[(sha, old.clone())],
                )?;
            }
        }
        cx.actions.push(format!(
            "write {path} ({} bytes, mode {mode:04o})",
            data.len()
        ));
        cmds.push(Cmd::sh(shellops::write_inline_script(
            &cx.host.real(path),
            data,
            &self.attrs(mode, sys),
        )));
        let fact = Fact::File {
            path: path.into(),
            sha256: crate::host::sha256_hex(data),
            mode,
        };
        Ok((cmds, fact))
    }
}

/// What a step's recorded intent runs and leaves.
#[derive(Default)]
struct Intent {
    run: Vec<Cmd>,
    verify: Option<Cmd>,
    facts: Vec<Fact>,
    pkgs: Option<(Vec<String>, BTreeSet<String>)>,
}

/// Records the undo of what `decided` says the step does, and gives its
/// commands.
fn record_intent(
    cx: &mut StepCx<'_>,
    o: &Owner<'_>,
    w: &Walk<'_>,
    s: &InstallStep,
    it: &Item<'_>,
    decided: Decided,
) -> Result<Intent, String> {
    let (sys, user) = (o.sys, o.user);
    let mut i = Intent::default();
    match (it, decided) {
        (Item::Cmd(op), _) => {
            cx.undo_incidental(&cmd_note(s), &[])?;
            i.run.push(cmd_command(op, sys, user, w.bin_dirs));
        }
        (Item::Packages(p), Decided::Packages(before)) => {
            cx.realize(|r| r.kind == ReverseKind::PackageRemove);
            let new = packages_intent(cx, &p.format, &p.packages, &before, uninstall_of(s))?;
            i.run.push(Cmd::sh(install_command(p)));
            i.verify = pkg::list_all_script(&p.format).map(Cmd::sh);
            i.pkgs = Some((new, before));
        }
        (Item::Service { unit, enable }, Decided::Service(prior)) => {
            realize_service(cx, unit);
            cx.undo(&service_undo(&prior, unit, sys, *enable, user), &[])?;
            i.run.push(service_commands(unit, sys, *enable, user).0);
        }
        (Item::Mkdir { path, mode }, Decided::Dirs(dirs)) => {
            i.run.extend(o.mkdirs(cx, &dirs, Some((path, *mode)))?);
            i.facts.push(Fact::Dir {
                path: path.to_string(),
            });
        }
        (Item::Link { path, target }, Decided::Link(dirs, prior)) => {
            i.run.extend(o.mkdirs(cx, &dirs, None)?);
            let real = cx.host.real(path);
            let undo = match &prior {
                None => Undo::RemovePath {
                    path: path.to_string(),
                    privileged: sys,
                },
                Some(t) => Undo::RestoreSymlink {
                    path: path.to_string(),
                    target: t.clone(),
                    privileged: sys,
                },
            };
            cx.undo(&undo, &[])?;
            if prior.is_some() {
                i.run
                    .push(Cmd::sh(format!("rm -f -- {}", sh::quote_min(&real))));
            }
            i.run.push(Cmd::sh(shellops::symlink_script(
                &real,
                target,
                &o.attrs(0o777, sys),
            )));
            cx.actions.push(format!("link {path} -> {target}"));
            i.facts.push(Fact::Symlink {
                path: path.to_string(),
                target: target.to_string(),
            });
        }
        (Item::Setcap { path, caps }, Decided::Setcap(before)) => {
            cx.realize(|r| r.kind == ReverseKind::RestoreCaps);
            let real = cx.host.real(path);
            cx.undo(&setcap_undo(&before, path, &real), &[])?;
            i.run.push(setcap_commands(&real, *caps).0);
        }
        (Item::File { path, data, mode }, Decided::File(dirs, prior)) => {
            let (cmds, fact) = o.put(cx, path, data, *mode, &dirs, &prior)?;
            i.run.extend(cmds);
            i.facts.push(fact);
        }
        (
            Item::Unit {
                path,
                data,
                unit,
                enable,
            },
            Decided::Unit(dirs, prior, state),
        ) => {
            let (cmds, fact) = o.put(cx, path, data, 0o644, &dirs, &prior)?;
            i.run.extend(cmds);
            i.facts.push(fact);
            realize_service(cx, unit);
            cx.undo(&service_undo(&state, unit, sys, *enable, user), &[])?;
            i.run.push(service_commands(unit, sys, *enable, user).0);
        }
        _ => return Err("the batch's answer does not fit the step".into()),
    }
    Ok(i)
}

/// Records a step's intent from its probe's answers and returns it ready
/// to run; None (and nothing recorded) when the answers ask for more than
/// the batch can do.
#[allow(clippy::too_many_arguments)]
fn prepare<'a>(
    host: &mut dyn Host,
    ledger: &mut Ledger,
    w: &Walk<'a>,
    seq: u32,
    s: &'a InstallStep,
    it: Item<'a>,
    answers: &Sections,
    login: &Login,
    made: &mut Made,
) -> Result<Option<Ready<'a>>, WalkError> {
    let rooted = host.root().is_some();
    let sys = s.scope == Scope::System;
    let user = w.user;
    let Some(decided) = decide(&it, answers, seq, sys, &user.home, made) else {
        return Ok(None);
    };
    ledger.begin_step(&w.record.name, seq, &head(s), StepState::Incomplete, None)?;
    let mut planned = BTreeSet::new();
    let mut cx = StepCx::new(
        host,
        Some(&mut *ledger),
        &w.record.name,
        seq,
        user,
        w.o,
        rooted,
        &mut planned,
        s.reverse.clone(),
    );
    let owner = Owner { user, sys, rooted };
    let res = record_intent(&mut cx, &owner, w, s, &it, decided);
    let StepCx {
        realized,
        mut actions,
        ..
    } = cx;
    let intent = match res {
        Ok(i) => i,
        Err(e) => {
            // Recording the intent failed: the step fails before the batch
            // runs.
            ledger.finish_step(&w.record.name, seq, StepState::Failed, Some(&e), &[])?;
            return Err(WalkError::Setup(format!("step {seq} ({}): {e}", title(s))));
        }
    };
    actions.extend(intent.run.iter().map(|c| {
        let mut c = c.clone();
        c.privileged = sys;
        if !sys {
            c.as_user = Some(user.name.clone());
        }
        c.display(login, rooted)
    }));
    Ok(Some(Ready {
        seq,
        step: s,
        item: it,
        run: intent.run,
        verify: intent.verify,
        actions,
        facts: intent.facts,
        realized,
        pkgs: intent.pkgs,
    }))
}

/// A nonce for one batch's markers.
fn nonce(salt: usize) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let seed = format!("{} {} {salt}", std::process::id(), now.as_nanos());
    crate::host::sha256_hex(seed.as_bytes())[..20].to_string()
}

/// The batch command (its privilege is the batch's scope's).
fn batch_cmd(script: String, sys: bool, user: &TargetUser, w: &Walk<'_>, n: usize) -> Cmd {
    let mut c = Cmd::sh(script);
    c.privileged = sys;
    if !sys {
        c.as_user = Some(user.name.clone());
    }
    c.timeout = Some(w.o.timeout.saturating_mul(n.max(1) as u32));
    c
}

/// Walks the batch that starts at step `i`, if one does (see the module
/// docs); returns how many steps it carried (0: none, the walker runs
/// step `i` alone).
pub(super) fn walk(
    host: &mut dyn Host,
    ledger: &mut Ledger,
    w: &Walk<'_>,
    i: usize,
    progress: &mut dyn FnMut(&StepReport),
    report: &mut Report,
) -> Result<usize, WalkError> {
    let rooted = host.root().is_some();
    let Some(first) = w.plan.steps.get(i) else {
        return Ok(0);
    };
    let (cands, worth) = batchable(w, i, first);
    if !worth || rooted {
        return Ok(0);
    }
    let login = host.login()?;
    let sys = first.scope == Scope::System;
    let nonce = nonce(i);
    // 1. Every question in one round trip (a host that cannot answer
    // leaves each step to run alone, and fail there if it must).
    let probe = probe_script(host, w, &cands, &nonce, &login, rooted);
    let answers = if probe.is_empty() {
        Sections::default()
    } else {
        match host.run(&batch_cmd(probe, sys, w.user, w, cands.len())) {
            Ok(out) => sections(&out.stdout_str(), &nonce),
            Err(_) => return Ok(0),
        }
    };
    // 2. Every intent recorded before anything changes.
    let mut ready: Vec<Ready<'_>> = Vec::new();
    let mut made = Made::default();
    for (seq, s, it) in cands {
        match prepare(host, ledger, w, seq, s, it, &answers, &login, &mut made)? {
            Some(r) => ready.push(r),
            None => break,
        }
    }
    if ready.is_empty() {
        return Ok(0);
    }
    // 3. One script: each step's commands, its check, its marker; the
    // first failure stops it.
    let script = batch_script(&ready, &nonce, &login, rooted);
    let (first_seq, last_seq) = (ready[0].seq, ready[ready.len() - 1].seq);
    let carried = ready.len();
    let out = host.run(&batch_cmd(script, sys, w.user, w, carried));
    // 4. Each step as its marker says.
    let (done, status, tail) = match &out {
        Ok(o) => (sections(&o.stdout_str(), &nonce), o.status, o.stderr_tail()),
        Err(e) => (Sections::default(), -1, e.to_string()),
    };
    let with_tail = |m: String| {
        if tail.is_empty() {
            m
        } else {
            format!("{m}: {tail}")
        }
    };
    let mut before_next: Option<BTreeSet<String>> = None;
    for (k, r) in ready.iter().enumerate() {
        let h = head(r.step);
        let mut actions = r.actions.clone();
        actions.push(format!("(steps {first_seq}–{last_seq} in one round trip)"));
        let what = r.item.what();
        let mut facts = r.facts.clone();
        let ended: Result<(), String> = match (&out, done.rc.get(&r.seq)) {
            (Err(e), _) => Err(if k == 0 {
                e.to_string()
            } else {
                format!(
                    "the batch of steps {first_seq}–{last_seq} broke off ({e}) before this step reported; what it may have done is undone by `bundle del`"
                )
            }),
            (Ok(_), Some(0)) => batch_step_done(
                host,
                ledger,
                w,
                r,
                &done,
                &mut before_next,
                &mut facts,
                &mut actions,
            ),
            (Ok(_), Some(rc)) => Err(with_tail(format!("{what}: exit {rc}"))),
            (Ok(_), None) => Err(with_tail(format!(
                "the batch ended (exit {status}) before this step reported"
            ))),
        };
        let failed = ended.err();
        match &failed {
            None => {
                ledger.finish_step(&w.record.name, r.seq, StepState::Complete, None, &facts)?;
                if let Some(hook) = &w.o.on_change {
                    hook(r.seq);
                }
            }
            Some(m) => {
                ledger.finish_step(&w.record.name, r.seq, StepState::Failed, Some(m), &[])?;
            }
        }
        let state = if failed.is_some() {
            "failed"
        } else {
            "complete"
        };
        let rep = StepReport::of(r.seq, &h, state, failed.clone(), actions);
        progress(&rep);
        report.steps.push(rep);
        if let Some(message) = failed {
            if out.is_ok() {
                // The script stopped here: the steps after were not attempted.
                ledger.clear_steps_from(&w.record.name, r.seq + 1)?;
            } else {
                // Which steps ran is not known: each keeps its undo and says so.
                for later in &ready[k + 1..] {
                    ledger.finish_step(
                        &w.record.name,
                        later.seq,
                        StepState::Failed,
                        Some(&format!(
                            "the batch of steps {first_seq}–{last_seq} broke off before this step reported; what it may have done is undone by `bundle del`"
                        )),
                        &[],
                    )?;
                }
            }
            return Err(stop(
                Some(ledger),
                w.record,
                w.plan,
                r.seq,
                h.title,
                message,
            )?);
        }
    }
    Ok(carried)
}

/// The steps from `i` on that one batch can carry: of `first`'s scope and
/// venue, within the script budget, nothing but commands after a step
/// whose effects are not known in advance; and whether they are worth a
/// batch (one step alone is when it costs more than two round trips by
/// itself).
#[allow(clippy::type_complexity)]
fn batchable<'a>(
    w: &Walk<'a>,
    i: usize,
    first: &InstallStep,
) -> (Vec<(u32, &'a InstallStep, Item<'a>)>, bool) {
    let mut budget = SCRIPT_BUDGET;
    let mut opaque = false;
    let cands: Vec<(u32, &InstallStep, Item<'_>)> = w.plan.steps[i..]
        .iter()
        .zip(&w.skip[i..])
        .enumerate()
        .map_while(|(k, (s, sk))| {
            let it = item(s, sk, w.arts)?;
            // After a step whose effects are not known in advance (a
            // command, a package install), what the probe said of the
            // host may no longer hold: only commands may follow it.
            if opaque && !matches!(it, Item::Cmd(_)) {
                return None;
            }
            opaque |= matches!(it, Item::Cmd(_) | Item::Packages(_));
            budget = budget.checked_sub(it.size())?;
            ((s.scope, s.venue) == (first.scope, first.venue)).then_some(((i + k) as u32, s, it))
        })
        .collect();
    // One step alone is worth a batch when it costs more than two round
    // trips by itself.
    let worth = match cands.as_slice() {
        [] => false,
        [(_, _, it)] => !matches!(
            it,
            Item::Cmd(_) | Item::Setcap { .. } | Item::Service { .. }
        ),
        _ => true,
    };
    (cands, worth)
}

/// A step the batch's marker says succeeded: its packages accounted for
/// (what the install brought in, read off the package list after it, the
/// list after the step before it being its "before"), its reverse ops
/// checked, its facts and actions added.
#[allow(clippy::too_many_arguments)]
fn batch_step_done(
    host: &mut dyn Host,
    ledger: &mut Ledger,
    w: &Walk<'_>,
    r: &Ready<'_>,
    done: &Sections,
    before_next: &mut Option<BTreeSet<String>>,
    facts: &mut Vec<Fact>,
    actions: &mut Vec<String>,
) -> Result<(), String> {
    let rooted = host.root().is_some();
    let mut planned = BTreeSet::new();
    let mut cx = StepCx::new(
        host,
        Some(ledger),
        &w.record.name,
        r.seq,
        w.user,
        w.o,
        rooted,
        &mut planned,
        r.step.reverse.clone(),
    );
    cx.realized = r.realized.clone();
    let res = (|| {
        if let (Item::Packages(p), Some((new, batch_before))) = (&r.item, &r.pkgs) {
            let text = done
                .text
                .get(&("verify".to_string(), r.seq))
                .cloned()
                .unwrap_or_default();
            let after = pkg::parse_installed(&p.format, &text).map_err(|e| {
                format!("unexpected output from the {} package list: {e}", p.format)
            })?;
            cx.realize(|o| o.kind == ReverseKind::PackageRemove);
            let before = before_next.clone().unwrap_or_else(|| batch_before.clone());
            packages_done(&mut cx, &p.format, &p.packages, new, &before, &after)?;
            *before_next = Some(after);
        }
        cx.account_for_reverse_ops()
    })();
    facts.append(&mut cx.facts);
    actions.append(&mut cx.actions);
    res
}

/// The probe of a batch: every question its steps ask the host, each
/// between its markers.
fn probe_script(
    host: &dyn Host,
    w: &Walk<'_>,
    cands: &[(u32, &InstallStep, Item<'_>)],
    nonce: &str,
    login: &Login,
    rooted: bool,
) -> String {
    let mut probe = String::new();
    for (seq, s, it) in cands {
        for (part, c) in probe_of(host, w, s, it) {
            probe.push_str(&format!(
                "{}\n{} </dev/null; __rc=$?\n{}\n",
                marker(nonce, part, *seq, false),
                inner(&c, login, rooted),
                marker(nonce, "", *seq, true)
            ));
        }
    }
    probe
}

/// The script of a batch: each step's commands, its check and its marker;
/// the first failure stops it.
fn batch_script(ready: &[Ready<'_>], nonce: &str, login: &Login, rooted: bool) -> String {
    let mut script = String::new();
    for r in ready {
        let cmds: Vec<String> = r
            .run
            .iter()
            .map(|c| format!("{} </dev/null", inner(c, login, rooted)))
            .collect();
        script.push_str(&format!("{}; __rc=$?\n", cmds.join(" && ")));
        if let Some(v) = &r.verify {
            script.push_str(&format!(
                "if [ \"$__rc\" -eq 0 ]; then {}; {} </dev/null || __rc=$?; fi\n",
                marker(nonce, "verify", r.seq, false),
                inner(v, login, rooted)
            ));
        }
        script.push_str(&format!(
            "{}; [ \"$__rc\" -eq 0 ] || exit \"$__rc\"\n",
            marker(nonce, "", r.seq, true)
        ));
    }
    script
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_markers_with_the_nonce_count() {
        let out = "hello\n@@charly-abc probe 3\nii jq\n@@charly-xyz end 3 1\nx\n\n@@charly-abc end 3 0\n\
                   no newline@@charly-abc end 9 0\n@@charly-abc end 4 2\n";
        let s = sections(out, "abc");
        assert_eq!(s.rc.into_iter().collect::<Vec<_>>(), vec![(3, 0), (4, 2)]);
        assert_eq!(
            s.text.get(&("probe".to_string(), 3)).map(String::as_str),
            Some("ii jq\n@@charly-xyz end 3 1\nx\n\n"),
            "another nonce is output like any other"
        );
    }

    #[test]
    fn directory_chains_and_what_a_batch_may_create() {
        assert_eq!(chain("/opt/a/b/"), ["/opt", "/opt/a", "/opt/a/b"]);
        assert!(chain("/").is_empty());
        let dir = Some(crate::host::Stat {
            kind: PathKind::Dir,
            mode: 0o755,
            uid: 0,
            gid: 0,
        });
        let file = Some(crate::host::Stat {
            kind: PathKind::File { sha256: None },
            mode: 0o644,
            uid: 0,
            gid: 0,
        });
        let c = chain("/home/u/.local/bin");
        // As the user: the home's own directories only.
        assert_eq!(
            missing_dirs(
                &c,
                &[dir.clone(), dir.clone(), None, None],
                false,
                "/home/u"
            ),
            Some(vec![
                ("/home/u/.local".to_string(), false),
                ("/home/u/.local/bin".to_string(), false)
            ])
        );
        assert_eq!(
            missing_dirs(&c, &[None, None, None, None], false, "/home/u"),
            None,
            "/home would be root's"
        );
        assert_eq!(
            missing_dirs(&c, &[None, None, None, None], true, "/home/u").map(|v| v.len()),
            Some(4),
            "as root, all of them"
        );
        assert_eq!(
            missing_dirs(&c, &[dir.clone(), dir, file, None], false, "/home/u"),
            None,
            "a file on the way"
        );
    }
}
