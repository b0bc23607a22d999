//! `charly bundle add|del|status|list`: deploy a box's candies to a target
//! from the store, undo it, compare, list. The deploy logic (plans per
//! target, target identity, reaching a recorded host, the walk) is in
//! `charly_deploy::{bundle, walk}`; this module parses, opens, and prints.

use crate::session::host_arch;
use crate::{Cli, output, project};
use anyhow::Context;
use charly_deploy::bundle::{self, EmitSpec};
use charly_deploy::host::Host;
use charly_deploy::ledger::{BundleRecord, BundleState, Connection, Ledger};
use charly_deploy::local::LocalHost;
use charly_deploy::session;
use charly_deploy::ssh::{SshHost, SshTarget};
use charly_deploy::walk;
use charly_rules::plan::{Gates, Target};
use clap::{Subcommand, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;

const LEDGER_HELP: &str = "The ledger (what each bundle did, for `del` and `status`) is the SQLite \
database <cache-dir>/deploy/ledger.sqlite in the charly store (--cache-dir, $CHARLY_CACHE_DIR, \
else $XDG_CACHE_HOME/charly); a bundle remembers its target (and --root), so `del` and `status` \
need only its name.";

/// A bundle name from the command line: one identifier rule
/// ([`charly_rules::names::bundle`]), so a name never becomes a path.
fn bundle_name(s: &str) -> Result<String, String> {
    charly_rules::names::bundle(s)
        .map(|()| s.to_string())
        .map_err(|why| format!("bundle name `{}` {why}", s.escape_debug()))
}

/// `charly bundle …`
#[derive(Subcommand, Debug)]
#[command(after_long_help = LEDGER_HELP)]
pub enum BundleCommand {
    /// Apply a box's candies to a target as bundle NAME, from artifacts in the
    /// store (run `charly box build BOX` first; nothing is rebuilt on the target).
    #[command(after_long_help = LEDGER_HELP)]
    Add(Box<AddArgs>),
    /// Undo everything bundle NAME did (last change first) and forget it.
    /// An interrupted add or del is cleaned up too; a failed del resumes.
    #[command(after_long_help = LEDGER_HELP)]
    Del {
        /// Bundle name.
        #[arg(value_parser = bundle_name)]
        name: String,
        /// Print what would be undone; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Also remove files changed since the deploy (and put back what
        /// the deploy overwrote even where it was changed since); without
        /// it such files are kept and named.
        #[arg(long)]
        force: bool,
        /// Forget the bundle without undoing anything: for a bundle whose
        /// target is gone (its --root deleted, its machine destroyed).
        /// Every change that is not undone is listed.
        #[arg(long, conflicts_with_all = ["force", "dry_run"])]
        forget: bool,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        become_pass: BecomeArgs,
    },
    /// Converge bundle NAME to the plan its box makes now: the steps
    /// before the first one that changed, drifted on disk or did not
    /// complete are kept; from there on what the bundle did is undone and
    /// the plan applied, under the same ledger rules as `add` (the gates,
    /// runner and user it was added with). `status` is clean afterwards.
    #[command(after_long_help = LEDGER_HELP)]
    Apply {
        /// Bundle name.
        #[arg(value_parser = bundle_name)]
        name: String,
        /// Print what would be undone and applied; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Also write over files changed since the deploy (without it, such
        /// files stop the apply and are named, as `del` keeps them).
        #[arg(long)]
        force: bool,
        /// Per-command time limit in seconds.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        become_pass: BecomeArgs,
    },
    /// Compare bundle NAME three ways: the ledger (interrupted or failed
    /// steps), the disk (files changed behind charly's back) and the
    /// configuration (the box's plan changed since it was deployed).
    /// Exit 0 when clean, 3 when anything differs.
    #[command(after_long_help = LEDGER_HELP)]
    Status {
        /// Bundle name.
        #[arg(value_parser = bundle_name)]
        name: String,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        become_pass: BecomeArgs,
    },
    /// List bundles with box, target and state.
    #[command(after_long_help = LEDGER_HELP)]
    List {
        /// Print the list as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Where a bundle goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TargetArg {
    /// This machine (or a directory with --root).
    Local,
    /// A machine over SSH (--host).
    Vm,
    /// A podman quadlet unit running the box image.
    Pod,
    /// A Kubernetes kustomize tree running the box image.
    K8s,
}

/// How a login that is not root gets root: `sudo -n` unless a password
/// is given, which is then checked once before the first step and handed
/// to every privileged command on its stdin (never on a command line,
/// never logged).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct BecomeArgs {
    /// Ask for the login's sudo password on the terminal (no echo).
    #[arg(long)]
    pub ask_become_pass: bool,
    /// Read the login's sudo password from FILE (its first line).
    #[arg(long, value_name = "FILE", env = "CHARLY_SUDO_PASSWORD_FILE")]
    pub become_pass_file: Option<PathBuf>,
}

impl BecomeArgs {
    /// Gives `host` the password, if one was asked for.
    fn apply(&self, host: &mut dyn Host) -> anyhow::Result<()> {
        let pw = match (&self.become_pass_file, self.ask_become_pass) {
            (Some(_), true) => {
                anyhow::bail!("--ask-become-pass and --become-pass-file: give one")
            }
            (Some(f), false) => {
                let text = std::fs::read_to_string(f)
                    .with_context(|| format!("sudo password file {}", f.display()))?;
                text.lines().next().unwrap_or_default().to_string()
            }
            (None, true) => {
                let login = host.login()?;
                rpassword::prompt_password(format!(
                    "sudo password for {} on {}: ",
                    login.name,
                    host.describe()
                ))
                .context("reading the sudo password from the terminal")?
            }
            (None, false) => return Ok(()),
        };
        let secret = charly_deploy::host::Secret::new(&pw).map_err(anyhow::Error::msg)?;
        if !charly_deploy::host::give_sudo_password(host, secret)? {
            output::note(&format!(
                "{}: sudo needs no password here (or the login is root); the password is not used",
                host.describe()
            ));
        }
        Ok(())
    }
}

/// Arguments of `bundle add`.
#[derive(clap::Args, Debug)]
pub struct AddArgs {
    /// Bundle name (unique in the ledger): a letter or digit, then letters,
    /// digits, `.`, `_` and `-`.
    #[arg(value_parser = bundle_name)]
    pub name: String,
    /// Box whose candies to apply.
    #[arg(value_name = "BOX")]
    pub box_name: String,
    /// Target kind.
    #[arg(long, value_enum)]
    pub target: TargetArg,
    /// Local target rooted at DIR: every target path lands below DIR, and
    /// commands, packages and services (which would touch the real system)
    /// are skipped with a reason.
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// vm: the machine to log in to, USER@HOST[:PORT] (port 22 by default).
    /// One SSH connection carries every step; system-scope steps run under
    /// sudo unless USER is root (`sudo -n`, or with the password of
    /// --ask-become-pass / --become-pass-file).
    #[arg(long, value_name = "USER@HOST[:PORT]")]
    pub host: Option<String>,
    /// vm: private key file (ed25519 or another OpenSSH key, unencrypted).
    #[arg(long, value_name = "FILE")]
    pub identity: Option<PathBuf>,
    /// vm: known_hosts file that must list the host's key (`[HOST]:PORT` for
    /// ports other than 22). An unknown or changed key is refused, with its
    /// SHA256 fingerprint; nothing is ever trusted blindly.
    #[arg(long, value_name = "FILE")]
    pub known_hosts: Option<PathBuf>,
    /// pod: install the quadlet unit system-wide (/etc/containers/systemd,
    /// under --root when given) instead of for the user
    /// (~/.config/containers/systemd).
    #[arg(long)]
    pub system: bool,
    /// k8s: directory of the kustomize tree (default
    /// <project>/.build/k8s/<NAME>).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// pod, k8s: image to run (default localhost/<box>:<version>).
    #[arg(long, value_name = "REF")]
    pub image: Option<String>,
    /// vm: how long to wait for a machine that is still booting: for SSH
    /// to answer, then (local and vm) for cloud-init to finish and the
    /// package manager's lock to be free, before the first step. 0 waits
    /// for nothing.
    #[arg(long, value_name = "SECS", default_value_t = 120)]
    pub wait: u64,
    /// Also deploy CANDY (a candy of the project the box lacks), after the
    /// box's own; the deploy id names it. Repeatable. On a host the
    /// candies are applied there; for a pod, charly builds an overlay
    /// image (the box's image plus a layer per added candy, tagged
    /// localhost/<box>-add-<deploy id>:<version>) and the pod runs it.
    #[arg(long = "add", value_name = "CANDY")]
    pub add: Vec<String>,
    /// pod with --add: keep the overlay image at `bundle del` (by default
    /// it is removed with the bundle).
    #[arg(long)]
    pub keep_image: bool,
    #[command(flatten)]
    pub become_pass: BecomeArgs,
    /// The user whose home and profile receive user-scope steps (default: the box's user).
    #[arg(long, value_name = "NAME")]
    pub user: Option<String>,
    /// Allow steps that add package repositories.
    #[arg(long)]
    pub allow_repo_changes: bool,
    /// Allow commands run as root.
    #[arg(long)]
    pub allow_root_tasks: bool,
    /// Enable and start services.
    #[arg(long)]
    pub with_services: bool,
    /// Open every gate (all three above).
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// Print exactly what would run; touch nothing, record nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub dev_local_pkg: crate::session::DevLocalPkg,
    /// The runner whose builds fed the store (their keys include it), and
    /// which builds a pod's overlay image.
    #[command(flatten)]
    pub runner: crate::session::RunnerArgs,
    /// Per-command time limit in seconds.
    #[arg(long, default_value_t = 1800, value_name = "SECS")]
    pub timeout: u64,
}

/// Runs a bundle command.
pub fn run(cli: &Cli, c: &BundleCommand) -> anyhow::Result<ExitCode> {
    match c {
        BundleCommand::Add(a) => add(cli, a),
        BundleCommand::Del {
            name,
            forget: true,
            json,
            ..
        } => forget(cli, name, *json),
        BundleCommand::Del {
            name,
            dry_run,
            force,
            json,
            become_pass,
            ..
        } => del(
            cli,
            name,
            &walk::DelOptions {
                dry_run: *dry_run,
                force: *force,
            },
            *json,
            become_pass,
        ),
        BundleCommand::Apply {
            name,
            dry_run,
            force,
            timeout,
            json,
            become_pass,
        } => reapply(cli, name, *dry_run, *force, *timeout, *json, become_pass),
        BundleCommand::Status {
            name,
            json,
            become_pass,
        } => status(cli, name, *json, become_pass),
        BundleCommand::List { json } => list(cli, *json),
    }
}

fn open_ledger(cli: &Cli) -> anyhow::Result<(charly_cache::Store, Ledger)> {
    let store = crate::session::open_store(cli)?;
    let ledger = Ledger::open(&store.dir().join("deploy"))?;
    Ok((store, ledger))
}

fn add(cli: &Cli, a: &AddArgs) -> anyhow::Result<ExitCode> {
    let target = match a.target {
        TargetArg::Local => Target::Local,
        TargetArg::Vm => Target::Vm,
        TargetArg::Pod => Target::Pod,
        TargetArg::K8s => Target::K8s,
    };
    let ssh = check_add_flags(a, target)?;
    let mut o = project::open(cli)?;
    let add = added_keys(&o.project, &a.add)?;
    let (store, mut ledger) = open_ledger(cli)?;
    // Plugin steps: their plugins' contracts decide how the plan compiles,
    // and the walk asks them to execute.
    let plugins =
        crate::plugins::host_for(&mut o, store.dir(), std::slice::from_ref(&a.box_name), &add)?;
    let b = crate::project::resolved(&o, &a.box_name)?;
    let hasher = crate::session::stat_cache(&store);
    let mut host = open_host(a, ssh.as_ref())?;
    a.become_pass.apply(host.as_mut())?;
    let emit = EmitSpec {
        system: a.system,
        out: None,
        image: a.image.clone(),
    };
    // A pod with --add runs an overlay image: the box's image plus the
    // added candies' layers (built, or found in the store, now).
    let overlay = if target == Target::Pod && !add.is_empty() {
        Some(session::Overlay {
            image: build_overlay(&o, &a.box_name, &add, a, &store, &hasher)?,
            keep_image: a.keep_image,
            podman_root: a.runner.podman_root.clone(),
        })
    } else {
        None
    };
    let gates = if a.yes {
        Gates::all()
    } else {
        Gates {
            allow_repo_changes: a.allow_repo_changes,
            allow_root_tasks: a.allow_root_tasks,
            with_services: a.with_services,
        }
    };
    let request = session::AddRequest {
        name: a.name.clone(),
        box_name: a.box_name.clone(),
        target,
        add,
        user: a.user.clone(),
        gates,
        dry_run: a.dry_run,
        timeout: std::time::Duration::from_secs(a.timeout.max(1)),
        emit,
        k8s_out: a.out.clone(),
        build: session::BuildSettings {
            dev_local_pkg: a.dev_local_pkg.on,
            runner: a.runner.runner.clone(),
            arch: host_arch(),
        },
        overlay,
    };
    let connection = match &ssh {
        Some(t) => Connection::Ssh(t.clone()),
        None => Connection::Local {
            root: host.root().map(String::from),
        },
    };
    let sources = session::Sources {
        project: &o.project,
        resolution: &o.resolution,
        store: &store,
        hasher: &hasher,
    };
    let plugins = plugins.map(|h| h as std::sync::Arc<dyn walk::PluginSteps>);
    let mut prepared =
        session::prepare_add(sources, b, &request, host.as_mut(), connection, plugins)?;
    prepared.opts.on_change = test_hooks::block_at_step();
    if !a.dry_run && ledger.get(&a.name)?.is_some() {
        anyhow::bail!(
            "bundle `{}` already exists (see `charly bundle status {0}`; `charly bundle del {0}` removes it)",
            a.name
        );
    }
    let json = a.json;
    let mut progress = |r: &walk::StepReport| {
        if json {
            return;
        }
        let mark = match r.state.as_str() {
            "complete" => "done",
            "would-run" => "would run",
            s => s,
        };
        progress_line(r.seq, mark, &r.title, r.note.as_deref());
        if r.state == "would-run" {
            for a in &r.actions {
                output::note(&format!("        {a}"));
            }
        }
    };
    // A machine's own first boot (cloud-init, unattended upgrades) holds
    // the package manager: wait for it before the first step.
    if !a.dry_run
        && a.wait > 0
        && matches!(target, Target::Local | Target::Vm)
        && host.root().is_none()
    {
        bundle::preflight(
            host.as_mut(),
            std::time::Duration::from_secs(a.wait),
            bundle::PACKAGE_LOCKS,
        )?;
    }
    let led = if a.dry_run { None } else { Some(&mut ledger) };
    let res = walk::apply(
        host.as_mut(),
        led,
        &prepared.record,
        &prepared.plan,
        &prepared.user,
        prepared.arts.as_ref(),
        &prepared.opts,
        &mut progress,
    );
    report_added(a, res)
}

/// Checks `add`'s flags against each other and the target; the SSH target
/// of `--target vm`.
fn check_add_flags(a: &AddArgs, target: Target) -> anyhow::Result<Option<SshTarget>> {
    let ssh = if target == Target::Vm {
        if a.root.is_some() {
            anyhow::bail!("--root is for --target local and pod");
        }
        let (Some(h), Some(id), Some(kh)) = (&a.host, &a.identity, &a.known_hosts) else {
            anyhow::bail!(
                "--target vm needs --host USER@HOST[:PORT], --identity FILE (private key) and --known-hosts FILE (the host's key must be in it)"
            );
        };
        Some(
            SshTarget::parse(h, &std::path::absolute(id)?, &std::path::absolute(kh)?)
                .map_err(anyhow::Error::msg)?,
        )
    } else {
        if a.host.is_some() || a.identity.is_some() || a.known_hosts.is_some() {
            anyhow::bail!("--host, --identity and --known-hosts are for --target vm");
        }
        None
    };
    if a.system && target != Target::Pod {
        anyhow::bail!("--system is for --target pod");
    }
    if a.out.is_some() && target != Target::K8s {
        anyhow::bail!("--out is for --target k8s");
    }
    if a.image.is_some() && !matches!(target, Target::Pod | Target::K8s) {
        anyhow::bail!("--image is for --target pod and k8s");
    }
    if a.root.is_some() && target == Target::K8s {
        anyhow::bail!(
            "--root is for --target local and pod (k8s writes under the project or --out)"
        );
    }
    if !a.add.is_empty() && target == Target::K8s {
        anyhow::bail!(
            "--add is for --target local, vm and pod (a k8s deploy runs the box's image as \
             pushed, which lacks the added candies)"
        );
    }
    if a.keep_image && (target != Target::Pod || a.add.is_empty()) {
        anyhow::bail!("--keep-image is for --target pod with --add (the overlay image)");
    }
    if !a.add.is_empty() && a.image.is_some() {
        anyhow::bail!("--image and --add: the pod runs the overlay image --add builds");
    }
    if let Some(r) = &a.root
        && std::fs::canonicalize(r).is_ok_and(|c| c == std::path::Path::new("/"))
    {
        anyhow::bail!(
            "--root {} is / itself: a rooted deploy there would change the real system; \
             leave --root out to deploy to this machine (commands, packages and services then run too)",
            r.display()
        );
    }
    Ok(ssh)
}

/// The host `add` deploys to: over SSH, a directory tree (`--root`, or its
/// preview for a dry run), or this machine.
fn open_host(a: &AddArgs, ssh: Option<&SshTarget>) -> anyhow::Result<Box<dyn Host>> {
    Ok(match (ssh, &a.root) {
        (Some(t), _) => Box::new(SshHost::connect_waiting(
            t,
            std::time::Duration::from_secs(30),
            std::time::Duration::from_secs(a.wait),
            &mut |m| output::note(m),
        )?),
        // A dry run into a directory that does not exist yet previews it
        // as empty (and creates nothing).
        (None, Some(r)) if a.dry_run => {
            Box::new(LocalHost::preview(r).with_context(|| format!("--root {}", r.display()))?)
        }
        (None, Some(r)) => {
            Box::new(LocalHost::rooted(r).with_context(|| format!("--root {}", r.display()))?)
        }
        (None, None) => Box::new(LocalHost::new()),
    })
}

/// Tells how `add`'s walk ended.
fn report_added(
    a: &AddArgs,
    res: Result<walk::Report, walk::WalkError>,
) -> anyhow::Result<ExitCode> {
    let json = a.json;
    match res {
        Ok(report) => {
            if json {
                output::json(&report)?;
            } else if a.dry_run {
                output::note(&format!("dry run: nothing was changed on {}", report.host));
            } else {
                let done = report
                    .steps
                    .iter()
                    .filter(|s| s.state == "complete")
                    .count();
                let skipped = report.steps.len() - done;
                output::note(&format!(
                    "bundle {} applied to {}: {done} steps done, {skipped} skipped",
                    a.name, report.host
                ));
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            output::error(&e.to_string());
            if !a.dry_run {
                output::note(&format!(
                    "the ledger keeps what was done: `charly bundle status {0}`, `charly bundle del {0}`",
                    a.name
                ));
            }
            Err(crate::Reported.into())
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn reapply(
    cli: &Cli,
    name: &str,
    dry_run: bool,
    force: bool,
    timeout: u64,
    json: bool,
    become_pass: &BecomeArgs,
) -> anyhow::Result<ExitCode> {
    let (store, mut ledger) = open_ledger(cli)?;
    let rec = ledger
        .get(name)?
        .ok_or_else(|| anyhow::anyhow!("no bundle named `{name}` (see `charly bundle list`)"))?;
    let mut o = project::open(cli)?;
    let added: Vec<String> = rec
        .plan
        .get("add_candies")
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .unwrap_or_default();
    let plugins = crate::plugins::host_for(
        &mut o,
        store.dir(),
        std::slice::from_ref(&rec.box_name),
        &added,
    )?;
    let b = crate::project::resolved(&o, &rec.box_name)?;
    let hasher = crate::session::stat_cache(&store);
    let mut host = bundle::host_for(&rec.connection)?;
    become_pass.apply(host.as_mut())?;
    let sources = session::Sources {
        project: &o.project,
        resolution: &o.resolution,
        store: &store,
        hasher: &hasher,
    };
    let prepared = session::prepare_reapply(
        sources,
        b,
        &rec,
        &session::ReapplyRequest {
            arch: host_arch(),
            dry_run,
            timeout: std::time::Duration::from_secs(timeout.max(1)),
        },
        host.as_mut(),
        plugins.map(|h| h as std::sync::Arc<dyn walk::PluginSteps>),
    )?;
    let mut progress = |r: &walk::StepReport| {
        if !json {
            progress_line(r.seq, &r.state, &r.title, r.note.as_deref());
        }
    };
    let mut undo_progress = |r: &walk::UndoReport| {
        if !json {
            progress_line(
                r.seq,
                &format!("undo {}", r.state),
                &r.what,
                r.note.as_deref(),
            );
        }
    };
    match walk::reapply(
        host.as_mut(),
        &mut ledger,
        &prepared.record,
        &prepared.plan,
        &prepared.user,
        prepared.arts.as_ref(),
        &prepared.opts,
        &mut progress,
        &mut undo_progress,
        force,
    ) {
        Ok(r) => {
            if json {
                output::json(&r)?;
            } else {
                let redone = r.applied.steps.len();
                let kept = r.from;
                output::note(&format!(
                    "bundle {name} {}: {kept} steps kept, {} changes undone, {redone} steps applied{}",
                    if dry_run {
                        "would converge"
                    } else {
                        "converged"
                    },
                    r.undone.len(),
                    if dry_run {
                        " (dry run: nothing changed)"
                    } else {
                        ""
                    }
                ));
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            output::error(&e.to_string());
            Err(crate::Reported.into())
        }
    }
}

/// One progress line of a walk or an undo: `[seq] state what (note)`.
fn progress_line(seq: u32, state: &str, what: &str, note: Option<&str>) {
    let note = note.map(|n| format!(" ({n})")).unwrap_or_default();
    output::note(&format!("[{seq:>3}] {state:<9} {what}{note}"));
}

/// The candy keys `--add` names (each must be a candy of the project).
fn added_keys(p: &charly_rules::load::Project, refs: &[String]) -> anyhow::Result<Vec<String>> {
    let mut keys = Vec::new();
    for r in refs {
        let k = p.candy_key(r).map_err(anyhow::Error::msg)?;
        if !p.candies.contains_key(&k) {
            let hint = charly_rules::diag::nearest(&k, p.candies.keys().map(String::as_str))
                .map(|n| format!(" (did you mean `{n}`?)"))
                .unwrap_or_default();
            anyhow::bail!("--add {r}: no candy `{k}` in this project{hint}");
        }
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    Ok(keys)
}

/// Builds the overlay image of a pod deploy with `--add`: box `box_name`
/// as the base of a box made of the added candies, built like any box
/// (layers the store has are reused) and loaded into podman. Returns its
/// reference, `localhost/<box>-add-<deploy id>:<version>`: the same list on
/// the same box always names the same image.
fn build_overlay(
    o: &project::Opened,
    box_name: &str,
    add: &[String],
    a: &AddArgs,
    store: &charly_cache::Store,
    hasher: &charly_engine::hash::FileHasher,
) -> anyhow::Result<String> {
    let b = crate::project::resolved(o, box_name)?;
    let (project, resolution, qualified) =
        bundle::overlay_project(&o.project, b, add).map_err(|why| {
            anyhow::anyhow!("the overlay of {box_name} with {}: {why}", add.join(", "))
        })?;
    let reference = charly_rules::naming::box_image_ref(&resolution, &qualified);
    if a.dry_run {
        output::note(&format!("would build the overlay image {reference}"));
        return Ok(reference);
    }
    let over = project::Opened {
        project,
        resolution,
        plugin_build: o.plugin_build.clone(),
        // Not the project the store's own inputs are kept for.
        own_inputs: None,
    };
    let jobs = 2;
    let runner = crate::session::make_runner(&a.runner, store, jobs)?;
    let engine = crate::session::engine(
        &over,
        store,
        crate::session::Using::Runner(runner.as_ref()),
        hasher,
        a.dev_local_pkg.on,
        None,
    );
    let graph = engine.graph(
        &charly_engine::graph::Goal::Build,
        std::slice::from_ref(&qualified),
    )?;
    let summary = engine.run(
        &graph,
        &over.project.root,
        jobs,
        false,
        &charly_engine::sched::Quiet,
    );
    if !summary.ok() {
        let failed: Vec<String> = summary
            .nodes
            .iter()
            .filter_map(|n| n.error.as_ref().map(|e| format!("{}: {e}", n.id)))
            .collect();
        anyhow::bail!(
            "building the overlay image {reference}: {}",
            failed.join("; ")
        );
    }
    engine.ensure_images(&graph, std::slice::from_ref(&qualified))?;
    if !a.json {
        output::note(&format!(
            "overlay image {reference} ({} nodes built)",
            summary.totals.ran
        ));
    }
    Ok(reference)
}

/// After `del`: removes the overlay image a pod deploy with `--add` built,
/// unless it was added with `--keep-image`. A failure is said, not fatal
/// (the bundle is gone either way).
fn remove_overlay(rec: &charly_deploy::ledger::BundleRecord, store: &charly_cache::Store) {
    let Some(reference) = rec.options.get("overlay_image").and_then(|v| v.as_str()) else {
        return;
    };
    if rec.options.get("keep_image").and_then(|v| v.as_bool()) == Some(true) {
        output::note(&format!(
            "kept the overlay image {reference} (--keep-image)"
        ));
        return;
    }
    let root: Option<std::path::PathBuf> = rec
        .options
        .get("podman_root")
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .flatten();
    let podman = charly_engine::runners::podman::PodmanRunner::new(
        charly_engine::runners::podman::PodmanOptions {
            root,
            conf_dir: store.dir().to_path_buf(),
            ca_bundle: None,
            offline: true,
            jobs: 1,
        },
    );
    let out = podman.map_err(|e| e.to_string()).and_then(|p| {
        p.cmd()
            .args(["rmi", "--ignore", reference])
            .output()
            .map_err(|e| e.to_string())
    });
    match out {
        Ok(o) if o.status.success() => {
            output::note(&format!("removed the overlay image {reference}"))
        }
        Ok(o) => output::note(&format!(
            "could not remove the overlay image {reference}: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => output::note(&format!(
            "could not remove the overlay image {reference}: {e}"
        )),
    }
}

fn del(
    cli: &Cli,
    name: &str,
    opts: &walk::DelOptions,
    json: bool,
    become_pass: &BecomeArgs,
) -> anyhow::Result<ExitCode> {
    let dry_run = opts.dry_run;
    let (store, mut ledger) = open_ledger(cli)?;
    let rec = ledger
        .get(name)?
        .ok_or_else(|| anyhow::anyhow!("no bundle named `{name}` (see `charly bundle list`)"))?;
    let mut host = bundle::host_for(&rec.connection).map_err(|e| {
        anyhow::anyhow!(
            "{e}\nthe target of bundle {name} cannot be reached; if it is gone for good, \
             `charly bundle del {name} --forget` forgets the bundle without undoing anything"
        )
    })?;
    become_pass.apply(host.as_mut())?;
    let mut progress = |r: &walk::UndoReport| {
        if !json {
            progress_line(r.seq, &r.state, &r.what, r.note.as_deref());
        }
    };
    match walk::remove_with(host.as_mut(), &mut ledger, name, opts, &mut progress) {
        Ok(reports) => {
            if json {
                output::json(
                    &serde_json::json!({"bundle": name, "dry_run": dry_run, "undone": reports}),
                )?;
            } else if !dry_run {
                output::note(&format!(
                    "bundle {name} removed ({} changes undone)",
                    reports.len()
                ));
            }
            if !dry_run {
                remove_overlay(&rec, &store);
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            output::error(&e.to_string());
            Err(crate::Reported.into())
        }
    }
}

/// `bundle del NAME --forget`: the record goes, the target is not touched.
fn forget(cli: &Cli, name: &str, json: bool) -> anyhow::Result<ExitCode> {
    let (_store, mut ledger) = open_ledger(cli)?;
    let rec = ledger
        .get(name)?
        .ok_or_else(|| anyhow::anyhow!("no bundle named `{name}` (see `charly bundle list`)"))?;
    let mut progress = |r: &walk::UndoReport| {
        if !json {
            progress_line(r.seq, &r.state, &r.what, r.note.as_deref());
        }
    };
    let reports = walk::forget(&mut ledger, name, &mut progress)?;
    if json {
        output::json(&serde_json::json!({"bundle": name, "forgotten": true,
            "not_undone": reports}))?;
    } else {
        output::note(&format!(
            "bundle {name} forgotten: {} changes on {} not undone",
            reports.len(),
            rec.target_key
        ));
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether a bundle's target can be reached now, and why not: a local
/// root must still be a directory; an SSH host must accept a TCP
/// connection within two seconds.
fn reachable(conn: &Connection) -> Result<(), String> {
    match conn {
        Connection::Local { root: None } => Ok(()),
        Connection::Local { root: Some(r) } => {
            if std::path::Path::new(r).is_dir() {
                Ok(())
            } else {
                Err(format!("its root {r} is gone"))
            }
        }
        Connection::Ssh(t) => {
            use std::net::ToSocketAddrs;
            let addrs = (t.host.as_str(), t.port)
                .to_socket_addrs()
                .map_err(|e| format!("{}: {e}", t.host))?;
            for a in addrs {
                if std::net::TcpStream::connect_timeout(&a, std::time::Duration::from_secs(2))
                    .is_ok()
                {
                    return Ok(());
                }
            }
            Err(format!("{}:{} does not answer", t.host, t.port))
        }
        Connection::Other(_) => Err(format!(
            "a `{}` connection this version cannot reach",
            conn.kind().unwrap_or("unknown")
        )),
    }
}

fn status(cli: &Cli, name: &str, json: bool, become_pass: &BecomeArgs) -> anyhow::Result<ExitCode> {
    let (_store, ledger) = open_ledger(cli)?;
    let rec = ledger
        .get(name)?
        .ok_or_else(|| anyhow::anyhow!("no bundle named `{name}` (see `charly bundle list`)"))?;
    let mut host = bundle::host_for(&rec.connection)?;
    become_pass.apply(host.as_mut())?;
    // Config drift needs the project: the one here, else the one the
    // bundle was added from; without it only ledger and disk are compared,
    // and the report says why.
    let remembered = rec
        .options
        .get("project")
        .and_then(|p| p.as_str())
        .map(std::path::PathBuf::from);
    let opened = match (cli.dir.is_some(), project::open(cli), remembered) {
        (false, Err(_), Some(dir)) if dir.join("charly.yml").is_file() => {
            project::open_at(cli, dir)
        }
        (_, opened, _) => opened,
    };
    let current = match opened {
        Err(_) => Err("no project here, and the bundle's project is gone".to_string()),
        Ok(o) => match crate::project::resolved(&o, &rec.box_name) {
            Err(e) => Err(format!("box {} does not resolve: {e}", rec.box_name)),
            Ok(b) => bundle::host_os(host.as_mut())
                .and_then(|os| bundle::current_plan(&o.project, b, &rec, os.as_ref()))
                .map_err(|e| format!("its plan does not compile: {e}")),
        },
    };
    let (current, not_compared) = match current {
        Ok(p) => (Some(p), None),
        Err(why) => (None, Some(why)),
    };
    let mut drift = walk::drift(host.as_mut(), &ledger, name, current.as_ref())?;
    let running = matches!(rec.state, BundleState::Applying | BundleState::Removing)
        && ledger.is_locked(name);
    if !running && matches!(rec.state, BundleState::Applying | BundleState::Removing) {
        drift.insert(
            0,
            walk::Drift {
                kind: "ledger".into(),
                seq: None,
                subject: format!("bundle {name}"),
                detail: format!(
                    "interrupted while {} (no charly process holds it)",
                    if rec.state == BundleState::Applying {
                        "applying"
                    } else {
                        "removing"
                    }
                ),
            },
        );
    }
    let state = serde_json::to_value(rec.state)?;
    if json {
        output::json(&serde_json::json!({
            "bundle": name, "box": rec.box_name, "target": rec.target_key,
            "state": state, "running": running, "clean": drift.is_empty(),
            "config_compared": current.is_some(), "config_not_compared_because": not_compared,
            "drift": drift,
        }))?;
    } else {
        output::note(&format!(
            "bundle {name}: box {} on {} ({}){}",
            rec.box_name,
            rec.target_key,
            state.as_str().unwrap_or(""),
            if running { ", being changed now" } else { "" }
        ));
        match (&not_compared, drift.is_empty()) {
            (None, true) => output::note("  clean: disk and configuration match the ledger"),
            (Some(why), true) => output::note(&format!(
                "  clean: the disk matches the ledger (configuration not compared: {why})"
            )),
            (Some(why), false) => {
                output::note(&format!("  (configuration not compared: {why})"));
            }
            (None, false) => {}
        }
        for d in &drift {
            let seq = d.seq.map(|s| format!("[{s}] ")).unwrap_or_default();
            output::note(&format!("  {:<6} {seq}{}: {}", d.kind, d.subject, d.detail));
        }
    }
    Ok(if drift.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(3)
    })
}

fn list(cli: &Cli, json: bool) -> anyhow::Result<ExitCode> {
    let (_store, ledger) = open_ledger(cli)?;
    let all = ledger.list()?;
    // Each target is asked once, all at once (an SSH host that does not
    // answer costs its timeout, not one per bundle).
    let targets: std::collections::BTreeMap<String, &Connection> = all
        .iter()
        .map(|r| (r.connection.host_key(), &r.connection))
        .collect();
    let reach: std::collections::BTreeMap<String, Result<(), String>> = std::thread::scope(|s| {
        let running: Vec<_> = targets
            .iter()
            .map(|(k, c)| (k.clone(), s.spawn(move || reachable(c))))
            .collect();
        running
            .into_iter()
            .map(|(k, h)| (k, h.join().unwrap_or_else(|_| Err("unknown".into()))))
            .collect()
    });
    let why_not = |r: &BundleRecord| {
        reach
            .get(&r.connection.host_key())
            .and_then(|x| x.as_ref().err())
            .cloned()
    };
    if json {
        let v: Vec<serde_json::Value> = all
            .iter()
            .map(|r| {
                serde_json::json!({"name": r.name, "box": r.box_name, "target": r.target,
                "target_key": r.target_key, "user": r.user, "state": r.state,
                "deploy_id": r.deploy_id, "updated_unix": r.updated_unix,
                "reachable": why_not(r).is_none(), "unreachable_because": why_not(r)})
            })
            .collect();
        output::json(&v)?;
    } else {
        for r in &all {
            println!(
                "{}\t{}\t{}\t{}{}",
                r.name,
                r.box_name,
                r.target_key,
                serde_json::to_value(r.state)?.as_str().unwrap_or(""),
                why_not(r)
                    .map(|w| format!(
                        "\tunreachable: {w} (`charly bundle del {} --forget`)",
                        r.name
                    ))
                    .unwrap_or_default()
            );
        }
        if all.is_empty() {
            output::note("no bundles");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Hooks only test builds have (the `testing` feature).
mod test_hooks {
    use charly_deploy::walk::ChangeHook;

    /// `CHARLY_TEST_BLOCK_AT_STEP=SEQ`: block forever right after step
    /// SEQ's first change (crash tests kill the process there).
    #[cfg(feature = "testing")]
    pub fn block_at_step() -> Option<ChangeHook> {
        const VAR: &str = "CHARLY_TEST_BLOCK_AT_STEP";
        let at: u32 = std::env::var(VAR).ok()?.parse().ok()?;
        Some(std::sync::Arc::new(move |seq| {
            if seq == at {
                eprintln!("charly: {VAR}: blocking in step {seq}");
                loop {
                    std::thread::sleep(std::time::Duration::from_secs(3600));
                }
            }
        }))
    }

    /// No hooks in a release build.
    #[cfg(not(feature = "testing"))]
    pub fn block_at_step() -> Option<ChangeHook> {
        None
    }
}
