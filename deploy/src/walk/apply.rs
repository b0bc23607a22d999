//! Applying a plan: which steps run on this target, and what each kind of
//! step does to the host (files, commands, services, packages, reboots,
//! builder artifacts), every change through the step context so its undo
//! is committed first.

use super::download::{download_kind, download_step};
use super::drift::sweep;
use super::managed::{hook_step, snippet_step};
use super::undo::UndoReport;
use super::{
    Artifacts, Options, R, Report, StepCx, StepReport, TargetUser, WalkError, enum_str, head, title,
};
use crate::host::{Cmd, FileAttrs, Host, PathKind, base_env, parent, sha256_hex};
use crate::ledger::{BundleRecord, BundleState, Fact, Ledger, StepState, Undo};
use crate::pkg;
use charly_rules::plan::{
    BuilderStep, FileStep, InstallPlan, InstallStep, OpStep, Phase, ReverseKind, Scope, StepData,
    Target, Venue,
};
use charly_rules::sh;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

fn parse_mode(s: &str, default: u32) -> u32 {
    u32::from_str_radix(s.trim_start_matches("0o"), 8).unwrap_or(default) & 0o7777
}
/// Why a step does not run on this target, if it does not.
fn skip_reason(s: &InstallStep, o: &Options, rooted: bool, user: &TargetUser) -> Option<String> {
    if s.venue == Venue::Skip {
        return Some(format!("not applied on target {}", o.target.as_str()));
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
        StepData::SystemPackages(p) if s.phase == Some(Phase::Prepare) => {
            super::repo::unsupported(&p.format, &p.repos)
        }
        StepData::LocalPkgInstall(l) if rooted => {
            rooted_msg(&format!("installing {} packages", l.format))
        }
        StepData::Op(op) if rooted && matches!(op.verb.as_str(), "cmd" | "setcap") => {
            rooted_msg(&format!("`{}`", op.verb))
        }
        StepData::Op(op) if rooted && op.verb == "download" && download_kind(op) == "sh" => {
            rooted_msg("a downloaded installer script")
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
        StepData::RepoChange(_) if rooted => rooted_msg("repository changes"),
        StepData::RepoChange(r) => super::repo::unsupported(&r.format, &r.repos),
        StepData::ApkInstall(_) => Some("android packages apply to android targets only".into()),
        StepData::Reboot(_) if o.target == Target::Local || rooted => {
            Some("warning: this candy asks for a reboot; the local target never reboots".into())
        }
        StepData::External(_) if rooted => rooted_msg("plugin steps"),
        StepData::External(e) if o.plugins.is_none() => Some(format!(
            "plugin `{}` is not served on this walk (no plugin host)",
            e.data["word"].as_str().unwrap_or("?")
        )),
        StepData::Builder(b) if b.builder == "aur" && rooted => {
            rooted_msg("installing aur packages")
        }
        StepData::Builder(b) if s.scope == Scope::System && b.builder != "aur" => Some(format!(
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

/// A task's environment: the step's (see [`step_env`]) with the candy's
/// `var:` values under the task's own `env:`.
pub(super) fn op_env(
    user: &TargetUser,
    bin_dirs: &[String],
    op: &OpStep,
) -> BTreeMap<String, String> {
    let mut extra = op.vars.clone();
    extra.extend(op.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    step_env(user, bin_dirs, &extra)
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
    let (plan, skip) = for_user(plan, user, o, rooted);
    // Privilege and package manager: checked once up front, naming the
    // steps that need them.
    check_privilege(host, &plan, &skip, rooted, dry)?;
    super::aur::refuse_without_pacman(host, &plan, &skip)?;
    let _lock = match ledger.as_deref_mut() {
        Some(l) if !dry => {
            let target = super::lock_target(l, record, &mut |title, note| {
                progress(&StepReport::waiting(title, note))
            })?;
            let lock = l.lock(&record.name)?;
            l.create(record)?;
            Some((target, lock))
        }
        _ => None,
    };
    walk_steps(
        host, ledger, record, &plan, &skip, user, arts, o, progress, 0,
    )
}

/// The plan with the user's home in place of the home token, and why each
/// step is skipped (None: it runs).
fn for_user(
    plan: &InstallPlan,
    user: &TargetUser,
    o: &Options,
    rooted: bool,
) -> (InstallPlan, Vec<Option<String>>) {
    let mut plan = plan.clone();
    plan.resolve_home(&user.home);
    let skip = plan
        .steps
        .iter()
        .map(|s| skip_reason(s, o, rooted, user))
        .collect();
    (plan, skip)
}

/// What `bundle apply` did.
#[derive(Clone, Debug, Serialize)]
pub struct ReapplyReport {
    /// The first step that was not kept (the plan length when all were).
    pub from: u32,
    /// What was undone (steps from `from` on, last first).
    pub undone: Vec<UndoReport>,
    /// The walk of the steps from `from` on.
    pub applied: Report,
}

/// Converges bundle `record.name` to `plan` (`bundle apply`): the steps
/// before the first one that changed in the plan, drifted on disk, or did
/// not complete are kept; from there on, what the recorded steps did is
/// undone and the plan's steps are applied, under the same ledger rules as
/// `bundle add`. A file changed since the deploy that this would write over
/// stops it first, named, unless `force` (as `del` keeps such files).
/// `record` carries the new plan and deploy id.
#[allow(clippy::too_many_arguments)]
pub fn reapply(
    host: &mut dyn Host,
    ledger: &mut Ledger,
    record: &BundleRecord,
    plan: &InstallPlan,
    user: &TargetUser,
    arts: &dyn Artifacts,
    o: &Options,
    progress: &mut dyn FnMut(&StepReport),
    undo_progress: &mut dyn FnMut(&UndoReport),
    force: bool,
) -> Result<ReapplyReport, WalkError> {
    let name = record.name.as_str();
    let rooted = host.root().is_some();
    let (plan, skip) = for_user(plan, user, o, rooted);
    let _target = (!o.dry_run)
        .then(|| {
            super::lock_target(ledger, record, &mut |title, note| {
                progress(&StepReport::waiting(title, note))
            })
        })
        .transpose()?;
    let _lock = (!o.dry_run).then(|| ledger.lock(name)).transpose()?;
    let steps = ledger.steps(name)?;
    let drift = super::drift(host, ledger, name, None)?;
    let drifted: BTreeSet<u32> = drift.iter().filter_map(|d| d.seq).collect();
    let from = (0..plan.steps.len().max(steps.len()))
        .find(|&i| {
            let (Some(now), Some(was)) = (
                plan.steps.get(i),
                steps.iter().find(|s| s.seq as usize == i),
            ) else {
                return true;
            };
            // Applied then and now, or skipped then and now.
            let kept_state = matches!(
                (&skip[i], was.state),
                (None, StepState::Complete) | (Some(_), StepState::Skipped)
            );
            !kept_state
                || drifted.contains(&(i as u32))
                || serde_json::to_value(now).ok().as_ref() != Some(&was.step)
        })
        .unwrap_or(plan.steps.len());
    let from_seq = from as u32;
    // Files changed since the deploy are the user's, as for `del`: the
    // walk would write over them, so without `force` it stops first,
    // naming them.
    let changed: Vec<String> = drift
        .iter()
        .filter(|d| {
            d.kind == "disk"
                && d.seq.is_some_and(|q| q >= from_seq)
                && matches!(
                    d.detail.as_str(),
                    "content changed" | "managed block edited" | "no longer a regular file"
                )
        })
        .map(|d| format!("{} ({})", d.subject, d.detail))
        .collect();
    if !force && !changed.is_empty() {
        return Err(WalkError::Setup(format!(
            "bundle {name}: {} changed since the deploy and would be written over:\n  {}\n\
             (`charly bundle apply {name} --force` puts back what the plan says; your changes \
             are then lost)",
            if changed.len() == 1 {
                "this file was"
            } else {
                "these files were"
            },
            changed.join("\n  ")
        )));
    }
    let opts = super::undo::DelOptions {
        dry_run: o.dry_run,
        force: true,
    };
    check_privilege(host, &plan, &skip, rooted, o.dry_run)?;
    super::aur::refuse_without_pacman(host, &plan, &skip)?;
    if !o.dry_run {
        ledger.set_state(name, BundleState::Applying, None)?;
    }
    let undone = super::undo::undo_from(
        host,
        ledger,
        record,
        from_seq,
        &opts,
        &format!("charly bundle apply {name}"),
        undo_progress,
    )?;
    if !o.dry_run {
        ledger.clear_steps_from(name, from_seq)?;
        ledger.update_plan(name, &record.deploy_id, &record.plan)?;
    }
    let led = (!o.dry_run).then_some(&mut *ledger);
    let applied = walk_steps(
        host, led, record, &plan, &skip, user, arts, o, progress, from,
    )?;
    Ok(ReapplyReport {
        from: from_seq,
        undone,
        applied,
    })
}

/// Whether the login may do what the walk needs: checked once up front,
/// naming the steps that need root.
fn check_privilege(
    host: &mut dyn Host,
    plan: &InstallPlan,
    skip: &[Option<String>],
    rooted: bool,
    dry: bool,
) -> Result<(), WalkError> {
    let login = host.login()?;
    if !rooted && login.uid != 0 && !dry {
        let needs: Vec<String> = plan
            .steps
            .iter()
            .zip(skip)
            .filter(|(s, k)| k.is_none() && s.scope == Scope::System)
            .map(|(s, _)| title(s))
            .collect();
        if !needs.is_empty() {
            let out = host.run(
                &Cmd::sh("true")
                    .privileged(true)
                    .timeout(Duration::from_secs(60)),
            )?;
            if !out.ok() && login.sudo_password.is_some() {
                return Err(WalkError::Setup(format!(
                    "{}: sudo did not accept the password given for {} ({}), and these steps need root:\n  {}",
                    host.describe(),
                    login.name,
                    out.stderr_tail().replace('\n', "; "),
                    needs.join("\n  ")
                )));
            }
            if !out.ok() {
                return Err(WalkError::Setup(format!(
                    "{}: `sudo -n` needs a password for {}, and these steps need root:\n  {}\n(give it with --ask-become-pass or CHARLY_SUDO_PASSWORD_FILE, allow passwordless sudo, or log in as root)",
                    host.describe(),
                    login.name,
                    needs.join("\n  ")
                )));
            }
        }
    }
    Ok(())
}

/// Walks the plan's steps from `from` on (the record exists and is
/// locked, or this is a dry run), recording each as it goes.
#[allow(clippy::too_many_arguments)]
fn walk_steps(
    host: &mut dyn Host,
    mut ledger: Option<&mut Ledger>,
    record: &BundleRecord,
    plan: &InstallPlan,
    skip: &[Option<String>],
    user: &TargetUser,
    arts: &dyn Artifacts,
    o: &Options,
    progress: &mut dyn FnMut(&StepReport),
    from: usize,
) -> Result<Report, WalkError> {
    let rooted = host.root().is_some();
    let dry = o.dry_run || ledger.is_none();
    if !dry {
        // A killed earlier walk's temp files in the directories this one writes.
        let _ = sweep(host, &[], Some(plan));
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
    let mut next = from;
    while next < plan.steps.len() {
        let i = next;
        next += 1;
        let s = &plan.steps[i];
        let seq = i as u32;
        let h = head(s);
        if !dry && o.batch_commands {
            let led = ledger
                .as_deref_mut()
                .ok_or_else(|| WalkError::Setup("a batch of steps needs the ledger".into()))?;
            let cx = super::batch::Walk {
                record,
                plan,
                skip,
                user,
                bin_dirs: &bin_dirs,
                o,
                arts,
            };
            let carried = super::batch::walk(host, led, &cx, i, progress, &mut report)?;
            if carried > 0 {
                next = i + carried;
                continue;
            }
        }
        if let Some(reason) = &skip[i] {
            if let Some(l) = ledger.as_deref_mut().filter(|_| !dry) {
                l.begin_step(&record.name, seq, &h, StepState::Skipped, Some(reason))?;
            }
            let r = StepReport::of(seq, &h, "skipped", Some(reason.clone()), Vec::new());
            progress(&r);
            report.steps.push(r);
            continue;
        }
        let led = if dry { None } else { ledger.as_deref_mut() };
        let mut led = led;
        if let Some(l) = led.as_deref_mut() {
            l.begin_step(&record.name, seq, &h, StepState::Incomplete, None)?;
        }
        let mut cx = StepCx::new(
            &mut *host,
            led,
            &record.name,
            seq,
            user,
            o,
            rooted,
            &mut planned_dirs,
            s.reverse.clone(),
        );
        let res =
            apply_step(&mut cx, s, arts, &mut bin_dirs).and_then(|()| cx.account_for_reverse_ops());
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
        let r = StepReport::of(seq, &h, state, res.as_ref().err().cloned(), actions);
        progress(&r);
        report.steps.push(r);
        if let Err(message) = res {
            let led = ledger.as_deref_mut().filter(|_| !dry);
            return Err(stop(led, record, plan, seq, h.title, message)?);
        }
    }
    if let Some(l) = ledger.filter(|_| !dry) {
        l.set_state(&record.name, BundleState::Applied, None)?;
    }
    Ok(report)
}

/// The walk stops at step `seq`, which failed: the bundle is marked
/// failed (when recorded) and the error names the steps not attempted.
pub(super) fn stop(
    ledger: Option<&mut Ledger>,
    record: &BundleRecord,
    plan: &InstallPlan,
    seq: u32,
    title_: String,
    message: String,
) -> Result<WalkError, WalkError> {
    let i = seq as usize;
    let not_attempted: Vec<String> = plan.steps[i + 1..]
        .iter()
        .enumerate()
        .map(|(j, s)| format!("{} {}", i + 1 + j, title(s)))
        .collect();
    if let Some(l) = ledger {
        let err = format!("step {seq} ({title_}) failed: {message}");
        l.set_state(&record.name, BundleState::Failed, Some(&err))?;
    }
    Ok(WalkError::Step {
        seq,
        title: title_,
        message,
        not_attempted,
    })
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
        StepData::Builder(b) if b.builder == "aur" => super::aur::aur_step(cx, s, b, arts),
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
        StepData::SystemPackages(p) if s.phase == Some(Phase::Prepare) => {
            super::repo::repo_step(cx, &p.format, &p.repos, &p.copr, &p.modules)
        }
        StepData::RepoChange(r) => super::repo::repo_step(cx, &r.format, &r.repos, &r.copr, &[]),
        StepData::SystemPackages(p) => {
            cx.realize(|r| r.kind == ReverseKind::PackageRemove);
            packages(
                cx,
                &p.format,
                &p.packages,
                &install_command(p),
                uninstall_of(s),
            )
        }
        StepData::LocalPkgInstall(l) => local_pkg_step(cx, s, l, arts),
        StepData::Reboot(_) => reboot_step(cx),
        StepData::External(e) => super::plugin::plugin_step(cx, s, e),
        _ => Err(format!("{} steps are not applied to hosts", s.kind)),
    }
}

/// The host install command of a packages step: the format's rendered
/// `phase.install.host`, else the package manager's own.
pub(super) fn install_command(p: &charly_rules::plan::SystemPackages) -> String {
    p.host_cmd.clone().unwrap_or_else(|| {
        let list = p
            .packages
            .iter()
            .map(|x| sh::quote_min(x))
            .collect::<Vec<_>>()
            .join(" ");
        match p.format.as_str() {
            "deb" => format!("DEBIAN_FRONTEND=noninteractive apt-get install -y -- {list}"),
            "rpm" => format!("dnf install -y {list}"),
            _ => format!("pacman -S --needed --noconfirm {list}"),
        }
    })
}

/// The rendered uninstall command of a step's package-remove op.
pub(super) fn uninstall_of(s: &InstallStep) -> Option<String> {
    s.reverse
        .iter()
        .find(|r| r.kind == ReverseKind::PackageRemove)
        .and_then(|r| r.uninstall_cmd.clone())
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
        "setcap" => setcap_step(cx, op),
        "download" => download_step(cx, s, op, bin_dirs),
        // As in the image (`# build: … (handled by builder stage)`): the
        // builders' artifacts are the candy's builder steps.
        "build" => {
            cx.actions.push(format!(
                "build: {} (applied by the candy's builder steps)",
                op.value
            ));
            Ok(())
        }
        "cmd" => {
            let c = cmd_command(op, sys, cx.user, bin_dirs);
            if !cx.dry() {
                cx.undo(&cmd_note(s), &[])?;
            }
            cx.run(c, "command")?;
            cx.changed();
            Ok(())
        }
        v => Err(format!("`{v}` is not supported on host targets")),
    }
}
/// The command a `cmd` task runs: the architecture preamble, `set -e`,
/// its body; as root for system scope, else as the user.
pub(super) fn cmd_command(op: &OpStep, sys: bool, user: &TargetUser, bin_dirs: &[String]) -> Cmd {
    let mut c = Cmd::sh(format!("{}set -e\n{}", sh::ARCH_PREAMBLE, op.value));
    c.env = op_env(user, bin_dirs, op);
    c.privileged = sys;
    if !sys {
        c.as_user = Some(user.name.clone());
    }
    c
}

/// What `del` says about a `cmd` task: it is not undone.
pub(super) fn cmd_note(s: &InstallStep) -> Undo {
    Undo::Note {
        text: format!(
            "`{}` ran a command; what it changed is not undone",
            title(s)
        ),
    }
}

fn service_enable(cx: &mut StepCx<'_>, unit: &str, sys: bool, enable: bool) -> R<()> {
    let (c, q) = service_commands(unit, sys, enable, cx.user);
    realize_service(cx, unit);
    if !cx.dry() {
        // What the unit was before, so the undo restores exactly that: a
        // unit the host had enabled (a packaged service) stays enabled.
        let prior = cx.run(q, &format!("read the state of {unit}"))?;
        let undo = service_undo(&prior, unit, sys, enable, cx.user);
        cx.undo(&undo, &[])?;
    }
    cx.run(c, &format!("enable {unit}"))?;
    cx.changed();
    Ok(())
}

/// The undo records from now on carry out the service ops naming `unit`.
pub(super) fn realize_service(cx: &mut StepCx<'_>, unit: &str) {
    cx.realize(|r| {
        matches!(
            r.kind,
            ReverseKind::ServiceDisable | ReverseKind::RestoreEnabled
        ) && r.targets.iter().any(|t| t == unit)
    });
}

/// The command that enables (`enable --now`) or starts `unit`, and the
/// query of its state before (`"<is-enabled> <is-active>"`), as root for a
/// system unit, else as the user with the user's systemd.
pub(super) fn service_commands(
    unit: &str,
    sys: bool,
    enable: bool,
    user: &TargetUser,
) -> (Cmd, Cmd) {
    let user_flag = if sys { "" } else { " --user" };
    let u = sh::quote_min(unit);
    let mut c = Cmd::sh(format!(
        "systemctl{user_flag} daemon-reload && systemctl{user_flag} {} {u}",
        if enable { "enable --now" } else { "start" }
    ));
    c.privileged = sys;
    if !sys {
        c.as_user = Some(user.name.clone());
        c.env
            .insert("XDG_RUNTIME_DIR".into(), format!("/run/user/{}", user.uid));
    }
    let mut q = Cmd::sh(format!(
        "e=$(systemctl{user_flag} is-enabled {u} 2>/dev/null); \
         a=$(systemctl{user_flag} is-active {u} 2>/dev/null); echo \"$e $a\""
    ));
    q.privileged = c.privileged;
    q.as_user = c.as_user.clone();
    q.env = c.env.clone();
    (c, q)
}

/// The undo of enabling (or starting) `unit`, from what its state query
/// printed before: back to exactly that state.
pub(super) fn service_undo(
    prior: &str,
    unit: &str,
    sys: bool,
    enable: bool,
    user: &TargetUser,
) -> Undo {
    let (c, _) = service_commands(unit, sys, enable, user);
    let user_flag = if sys { "" } else { " --user" };
    match PriorState::parse(prior).undo(enable) {
        Some((what, verb)) => Undo::Run {
            what: format!("{what} {unit}"),
            script: format!("systemctl{user_flag} {verb} {}", sh::quote_min(unit)),
            privileged: sys,
            as_user: (!sys).then(|| user.name.clone()),
            env: c.env,
            ignore_failure: true,
        },
        None => Undo::Note {
            text: format!(
                "{unit} was already {} before the deploy; left as it was",
                if enable {
                    "enabled and running"
                } else {
                    "running"
                }
            ),
        },
    }
}

/// A unit's state before a step enabled or started it (`systemctl
/// is-enabled` and `is-active`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PriorState {
    enabled: bool,
    active: bool,
}

impl PriorState {
    /// From `"<is-enabled> <is-active>"` (either word may be missing: a
    /// unit systemd does not know is neither).
    fn parse(out: &str) -> PriorState {
        let mut w = out.split_whitespace();
        let enabled = w.next().unwrap_or_default();
        let active = w.next().unwrap_or_default();
        PriorState {
            // `enabled-runtime` is gone after a reboot: the deploy's
            // `enable` made it persistent, which the undo takes back.
            enabled: enabled == "enabled",
            active: active == "active" || active == "reloading" || active == "activating",
        }
    }

    /// What undoes `enable --now` (or `start`) from this state: (what,
    /// systemctl verb), or None when the unit was already as the step
    /// leaves it.
    fn undo(self, enable: bool) -> Option<(&'static str, &'static str)> {
        match (enable, self.enabled, self.active) {
            (true, true, true) | (false, _, true) => None,
            // A started unit (generated, e.g. by quadlet) cannot be
            // disabled, only stopped.
            (true, true, false) | (false, _, false) => Some(("stop", "stop")),
            (true, false, true) => Some(("disable", "disable")),
            (true, false, false) => Some(("disable", "disable --now")),
        }
    }
}

/// `setcap:` on a host: the file's capabilities before are read first
/// (`getcap`), so the undo puts back exactly those (or removes them).
fn setcap_step(cx: &mut StepCx<'_>, op: &OpStep) -> R<()> {
    cx.realize(|r| r.kind == ReverseKind::RestoreCaps);
    let (set, get) = setcap_commands(&cx.host.real(&op.value), op.caps.as_deref());
    if !cx.dry() {
        let before = cx.run(get, &format!("read the capabilities of {}", op.value))?;
        let undo = setcap_undo(&before, &op.value, &cx.host.real(&op.value));
        cx.undo(&undo, &[])?;
    }
    cx.run(set, "setcap")?;
    cx.changed();
    Ok(())
}

/// The `setcap` (or `setcap -r`, without caps) of file `real` (a host
/// path), and the `getcap` that reads its capabilities before; as root.
pub(super) fn setcap_commands(real: &str, caps: Option<&str>) -> (Cmd, Cmd) {
    let path = sh::quote_min(real);
    let set = match caps.map(str::trim).filter(|c| !c.is_empty()) {
        Some(caps) => format!("setcap {} {path}", sh::quote_min(caps)),
        None => format!("setcap -r {path}"),
    };
    (
        Cmd::sh(set).privileged(true),
        Cmd::sh(format!("getcap {path}")).privileged(true),
    )
}

/// The undo of a `setcap` on `path` (host path `real`), from what `getcap`
/// printed before: exactly those capabilities, or none.
pub(super) fn setcap_undo(before: &str, path: &str, real: &str) -> Undo {
    let q = sh::quote_min(real);
    let restore = match prior_caps(before) {
        Some(p) => format!("setcap {} {q}", sh::quote_min(&p)),
        None => format!("setcap -r {q} 2>/dev/null || true"),
    };
    Undo::root_run(format!("capabilities of {path}"), restore)
}

/// The capabilities in `getcap FILE`'s output (`FILE caps`, or older
/// `FILE = caps`); None when the file has none.
fn prior_caps(out: &str) -> Option<String> {
    let line = out.lines().find(|l| !l.trim().is_empty())?;
    let (_, caps) = line.trim().split_once(char::is_whitespace)?;
    let caps = caps.trim().trim_start_matches('=').trim();
    (!caps.is_empty()).then(|| caps.to_string())
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
pub(super) fn packages(
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
    // Everything installed now (which of `pkgs` are new, and what the
    // install adds beyond them: their dependencies go with them on `del`).
    let before_all = installed_all(cx, format)?;
    let new = packages_intent(cx, format, pkgs, &before_all, uninstall)?;
    let mut c = Cmd::sh(install.to_string());
    c.privileged = true;
    cx.run(c, "package install")?;
    cx.changed();
    if !cx.dry() {
        let after_all = installed_all(cx, format)?;
        packages_done(cx, format, pkgs, &new, &before_all, &after_all)?;
    }
    Ok(())
}

/// Before a package install: records the removal of the packages of
/// `pkgs` that are not in `before_all` (with the plan's `uninstall` command
/// when that is all of them), or a note that all were there; returns the
/// new ones.
pub(super) fn packages_intent(
    cx: &mut StepCx<'_>,
    format: &str,
    pkgs: &[String],
    before_all: &BTreeSet<String>,
    uninstall: Option<String>,
) -> R<Vec<String>> {
    let new: Vec<String> = pkgs
        .iter()
        .filter(|p| !before_all.contains(*p))
        .cloned()
        .collect();
    if !cx.dry() && new.is_empty() {
        cx.undo(
            &Undo::Note {
                text: format!(
                    "{format} packages {} were already installed when this bundle was applied",
                    pkgs.join(" ")
                ),
            },
            &[],
        )?;
    }
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
    Ok(new)
}

/// After a package install: every one of `pkgs` must be in `after_all`;
/// what else is new since `before_all` came with them and is removed with
/// them (recorded now: it is known only after the install); the packages
/// are a fact of the step.
pub(super) fn packages_done(
    cx: &mut StepCx<'_>,
    format: &str,
    pkgs: &[String],
    new: &[String],
    before_all: &BTreeSet<String>,
    after_all: &BTreeSet<String>,
) -> R<()> {
    let missing: Vec<&String> = pkgs.iter().filter(|p| !after_all.contains(*p)).collect();
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
    let deps: Vec<String> = after_all
        .iter()
        .filter(|p| !before_all.contains(*p) && !pkgs.contains(p))
        .cloned()
        .collect();
    if !deps.is_empty() {
        // One removal of the packages and their dependencies, replayed
        // before the first record, which then finds nothing left to remove.
        let all: Vec<String> = new.iter().chain(&deps).cloned().collect();
        cx.actions.push(format!(
            "dependencies installed with them: {}",
            deps.join(" ")
        ));
        cx.undo(
            &Undo::RemovePackages {
                format: format.into(),
                command: pkg::remove_script(format, &all, None),
                packages: all,
                root: None,
            },
            &[],
        )?;
    }
    cx.facts.push(Fact::Packages {
        format: format.into(),
        packages: pkgs.to_vec(),
        root: None,
    });
    Ok(())
}

/// Every package installed on the host (empty in a dry run).
fn installed_all(cx: &mut StepCx<'_>, format: &str) -> R<BTreeSet<String>> {
    if cx.dry() {
        return Ok(BTreeSet::new());
    }
    let script =
        pkg::list_all_script(format).ok_or_else(|| format!("unknown package format {format}"))?;
    let out = cx
        .host
        .run(&Cmd::sh(script).timeout(cx.timeout))
        .map_err(|e| e.to_string())?;
    if !out.ok() {
        return Err(format!(
            "listing the installed {format} packages: exit {}: {}",
            out.status,
            out.stderr_tail()
        ));
    }
    pkg::parse_installed(format, &out.stdout_str())
        .map_err(|e| format!("unexpected output from the {format} package list: {e}"))
}

fn local_pkg_step(
    cx: &mut StepCx<'_>,
    s: &InstallStep,
    l: &charly_rules::plan::LocalPkgStep,
    arts: &dyn Artifacts,
) -> R<()> {
    // The format's probe gates the install: a host that cannot install
    // the format is refused before anything is staged.
    if let Some(probe) = l.probe.as_deref().filter(|p| !p.trim().is_empty()) {
        cx.run(Cmd::sh(probe.to_string()), "probe").map_err(|e| {
            format!(
                "{} cannot install {} packages (the format's probe `{}` failed): {e}",
                cx.host.describe(),
                l.format,
                probe.trim()
            )
        })?;
    }
    cx.realize(|r| r.kind == ReverseKind::PackageRemove);
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
    let install = local_pkg_install(l, &cx.host.real(&dir))?;
    let res = packages(cx, &l.format, &names, &install, None);
    if !cx.dry() {
        for (n, _) in &files {
            let _ = cx.host.remove(&format!("{dir}/{n}"), true);
        }
        let _ = cx.host.remove(&dir, true);
    }
    res
}

/// The command that installs a local package step's staged packages in
/// `dir`: the format's `install_template` (as in the Containerfile, with
/// the staging directory for `.StageDir` and the step's glob for `.Glob`),
/// else the format's built-in install.
fn local_pkg_install(l: &charly_rules::plan::LocalPkgStep, dir: &str) -> R<String> {
    let glob = if l.glob.is_empty() {
        format!("*.{}", l.format)
    } else {
        l.glob.clone()
    };
    match l.install_template.as_deref() {
        Some(t) => charly_rules::template::render(
            &format!("format/{}/local_pkg.install_template", l.format),
            t,
            // Quoted for the shell when it needs to be; the glob stays a
            // glob, as in the Containerfile.
            &serde_json::json!({"StageDir": sh::quote_min(dir), "Glob": glob}),
        )
        .map(|s| s.trim().to_string())
        .map_err(|e| e.to_string()),
        None => Ok(pkg::install_files_script(&l.format, dir, &glob, None)),
    }
}

/// Rewrites an artifact tar made for the box user (home `from`) for the
/// target user: paths under `from` move to the target home, owners become
/// the target user's.
pub fn retarget_artifact(
    tar: &[u8],
    from_home: &str,
    user: &TargetUser,
) -> R<Vec<charly_files::artifact::Entry>> {
    let entries = charly_files::artifact::read_tar(tar, "")
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
    // The artifact's files are what the builder installed: removing them
    // carries out every reverse op of the step (its files, the npm
    // packages or pixi environment they are).
    cx.realize(|_| true);
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
            (Some(PathKind::Dir), charly_files::artifact::Kind::Dir) => {}
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
    charly_files::artifact::write_tar(tmp.path(), entries.clone(), None)
        .map_err(|e| e.to_string())?;
    let bytes = std::fs::read(tmp.path()).map_err(|e| e.to_string())?;
    cx.host
        .extract_tar(&bytes, false)
        .map_err(|e| e.to_string())?;
    for (p, e) in paths.iter().zip(&entries) {
        cx.facts.push(match &e.kind {
            charly_files::artifact::Kind::Dir => Fact::Dir { path: p.clone() },
            charly_files::artifact::Kind::Symlink(t) => Fact::Symlink {
                path: p.clone(),
                target: t.clone(),
            },
            charly_files::artifact::Kind::File(d) => Fact::File {
                path: p.clone(),
                sha256: sha256_hex(d),
                mode: e.mode & 0o7777,
            },
        });
    }
    cx.changed();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn getcap_output_in_both_spellings() {
        assert_eq!(
            prior_caps("/usr/bin/ping cap_net_raw=ep\n").as_deref(),
            Some("cap_net_raw=ep")
        );
        assert_eq!(
            prior_caps("/usr/bin/ping = cap_net_raw+ep\n").as_deref(),
            Some("cap_net_raw+ep")
        );
        assert_eq!(prior_caps(""), None);
        assert_eq!(prior_caps("/usr/bin/ping\n"), None);
    }

    #[test]
    fn artifact_is_retargeted() {
        let t = tempfile::tempdir().expect("tmp");
        let p = t.path().join("a.tar");
        charly_files::artifact::write_tar(
            &p,
            vec![
                charly_files::artifact::Entry {
                    path: "home/user/.npm-global".into(),
                    kind: charly_files::artifact::Kind::Dir,
                    mode: 0o755,
                    uid: 1000,
                    gid: 1000,
                },
                charly_files::artifact::Entry {
                    path: "home/user/.npm-global/x".into(),
                    kind: charly_files::artifact::Kind::File(b"x".to_vec()),
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
