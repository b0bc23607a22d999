//! Bundles as `charly bundle` deploys them: the plan a target walks (the
//! box's merged plan, or for pod and k8s the files they render, as
//! ledgered file steps), the identity a target is recorded under, and how
//! to reach a recorded bundle's host again.
//!
//! The CLI parses arguments, opens the project, the store and the ledger,
//! and prints; what a bundle *is* lives here, next to the walker and the
//! ledger that records it.

use crate::host::{Host, HostError};
use crate::ledger::{BundleRecord, Connection};
use crate::local::LocalHost;
use crate::ssh::SshHost;
use crate::walk::{Artifacts, TargetUser};
use charly_rules::emit::EmitError;
use charly_rules::emit::kustomize::{KustomizeOptions, render_kustomize};
use charly_rules::emit::quadlet::{QuadletOptions, USER_UNIT_DIR, render_quadlet};
use charly_rules::load::Project;
use charly_rules::plan::{
    FileStep, Gate, Gates, HostContext, HostMismatch, HostOs, InstallPlan, InstallStep, PlanError,
    Scope, ServicePackagedStep, StepData, StepKind, Target, Venue, for_host,
};
use charly_rules::resolve::ResolvedBox;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::Duration;

/// How long connecting to a recorded SSH host may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a bundle's plan or host is not available.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// The box's plan does not compile.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The quadlet unit or kustomize tree does not render.
    #[error(transparent)]
    Emit(#[from] EmitError),
    /// The host cannot be opened or asked.
    #[error(transparent)]
    Host(#[from] HostError),
    /// The record's `emit` options do not parse.
    #[error(transparent)]
    Options(#[from] serde_json::Error),
    /// A recorded connection of a kind this version cannot reach.
    #[error("cannot reach a target of kind {0:?} (not implemented yet)")]
    Unreachable(Option<String>),
    /// The machine is not ready for a deploy.
    #[error("{host} is not ready: {message}")]
    Preflight {
        /// The host.
        host: String,
        /// Why.
        message: String,
    },
    /// The box is made for another distro than the host runs.
    #[error(transparent)]
    Distro(#[from] HostMismatch),
    /// A local file cannot be read.
    #[error("{path}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// How a pod or k8s bundle was asked for (kept in the record's options as
/// `emit`, so `status` can render the same files again for configuration
/// drift).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmitSpec {
    /// pod: the quadlet unit is system-wide (else the user's).
    #[serde(default)]
    pub system: bool,
    /// k8s: the directory of the kustomize tree (absolute).
    #[serde(default)]
    pub out: Option<String>,
    /// pod, k8s: the image to run (default: the box's own).
    #[serde(default)]
    pub image: Option<String>,
}

impl EmitSpec {
    /// The spec recorded for bundle `rec` (the default when none was).
    pub fn recorded(rec: &BundleRecord) -> Result<EmitSpec, BundleError> {
        Ok(rec
            .options
            .get("emit")
            .cloned()
            .map(serde_json::from_value)
            .transpose()?
            .unwrap_or_default())
    }
}

/// The options a bundle record keeps: the gates it was applied with, how
/// the artifacts it used were built, and its [`EmitSpec`].
pub fn record_options(
    gates: Gates,
    dev_local_pkg: bool,
    runner: &str,
    emit: &EmitSpec,
) -> serde_json::Value {
    serde_json::json!({"gates": gates, "dev_local_pkg": dev_local_pkg,
        "runner": runner, "emit": emit})
}

/// The box's merged InstallPlan for `target`.
pub fn merged_plan(
    project: &Project,
    b: &ResolvedBox,
    target: Target,
) -> Result<InstallPlan, BundleError> {
    let ctx = HostContext {
        target,
        ..HostContext::default()
    };
    Ok(charly_rules::plan::build_merged_plan(
        project,
        b,
        &ctx,
        &[],
    )?)
}

/// What the host runs, from its `/etc/os-release` (else
/// `/usr/lib/os-release`); None when it does not say (a fresh `--root`
/// tree).
pub fn host_os(host: &mut dyn Host) -> Result<Option<HostOs>, BundleError> {
    for f in ["/etc/os-release", "/usr/lib/os-release"] {
        if let Some(text) = host.read_file(f, false)? {
            return Ok(HostOs::parse(&String::from_utf8_lossy(&text)));
        }
    }
    Ok(None)
}

/// The merged plan a host target walks: compiled for the distro the host
/// runs ([`charly_rules::plan::for_host`]: a box for another distro is
/// refused, naming both, unless its candies have sections for the host's),
/// or for the box's own when the host does not say.
pub fn host_plan(
    project: &Project,
    b: &ResolvedBox,
    target: Target,
    add: &[String],
    os: Option<&HostOs>,
) -> Result<InstallPlan, BundleError> {
    let hb = match os {
        Some(os) => for_host(project, b, add, os)?,
        None => b.clone(),
    };
    let ctx = HostContext {
        target,
        distro: (hb.distro_def != b.distro_def)
            .then(|| hb.distro_def.clone())
            .flatten(),
        ..HostContext::default()
    };
    Ok(charly_rules::plan::build_merged_plan(
        project, &hb, &ctx, add,
    )?)
}

/// The candies a bundle's recorded plan added to its box (`--add`).
pub fn added_candies(rec: &BundleRecord) -> Vec<String> {
    rec.plan
        .get("add_candies")
        .cloned()
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_default()
}

fn install_step(candy: &str, scope: Scope, gate: Gate, data: StepData) -> InstallStep {
    InstallStep {
        candy: candy.into(),
        kind: match &data {
            StepData::ServicePackaged(_) => StepKind::ServicePackaged,
            _ => StepKind::File,
        },
        scope,
        venue: Venue::HostNative,
        gate,
        phase: None,
        reverse: Vec::new(),
        data,
    }
}

fn write_step(candy: &str, scope: Scope, path: String, text: String) -> InstallStep {
    install_step(
        candy,
        scope,
        Gate::None,
        StepData::File(FileStep {
            verb: "write".into(),
            path,
            content: Some(text),
            source: None,
            mode: "0644".into(),
            user: String::new(),
            task: 0,
        }),
    )
}

/// The plan a pod or k8s bundle walks: the rendered quadlet unit (plus
/// starting its service, behind --with-services) or the kustomize tree,
/// as file-write steps, so the ledger records and `del` removes each file.
/// Other targets get the merged plan.
pub fn emitted_plan(
    project: &Project,
    b: &ResolvedBox,
    target: Target,
    e: &EmitSpec,
    home: &str,
) -> Result<InstallPlan, BundleError> {
    let mut plan = merged_plan(project, b, target)?;
    let candy = format!("(box {})", b.name);
    plan.steps = match target {
        Target::Pod => {
            let q = render_quadlet(
                project,
                b,
                &plan,
                &QuadletOptions {
                    image: e.image.clone(),
                    ..QuadletOptions::default()
                },
            )?;
            let (scope, dir) = if e.system {
                (Scope::System, "/etc/containers/systemd".to_string())
            } else {
                (
                    Scope::User,
                    format!("{}/{USER_UNIT_DIR}", home.trim_end_matches('/')),
                )
            };
            vec![
                write_step(&candy, scope, format!("{dir}/{}", q.file_name), q.text),
                install_step(
                    &candy,
                    scope,
                    Gate::WithServices,
                    StepData::ServicePackaged(ServicePackagedStep {
                        name: q.container_name.clone(),
                        unit: q.service.clone(),
                        // Quadlet services are generated: started, not enabled
                        // (the unit's [Install] section covers boot).
                        enable: false,
                    }),
                ),
            ]
        }
        Target::K8s => {
            let t = render_kustomize(
                project,
                b,
                &plan,
                &KustomizeOptions {
                    image: e.image.clone(),
                    ..KustomizeOptions::default()
                },
            )?;
            let out = e.out.clone().unwrap_or_default();
            t.files
                .into_iter()
                .map(|(rel, text)| {
                    write_step(
                        &candy,
                        Scope::User,
                        format!("{}/{rel}", out.trim_end_matches('/')),
                        text,
                    )
                })
                .collect()
        }
        _ => return Ok(plan),
    };
    Ok(plan)
}

/// The plan bundle `rec` (of box `b`) would walk now, from the current project.
pub fn current_plan(
    project: &Project,
    b: &ResolvedBox,
    rec: &BundleRecord,
    os: Option<&HostOs>,
) -> Result<InstallPlan, BundleError> {
    let emit = EmitSpec::recorded(rec)?;
    match rec.target {
        Target::Pod | Target::K8s => emitted_plan(project, b, rec.target, &emit, &rec.home),
        Target::Vm => host_plan(project, b, Target::Vm, &added_candies(rec), os),
        _ => host_plan(project, b, Target::Local, &added_candies(rec), os),
    }
}

/// The identity of a target, recorded with each bundle: a target takes a
/// deploy id once (the ledger refuses the same plan twice there). `vm:`
/// the SSH login, `k8s:` the tree's directory, else the target's name and
/// the local root.
pub fn target_key(target: Target, connection: &Connection, emit: &EmitSpec) -> String {
    match (target, connection) {
        (Target::Vm, Connection::Ssh(t)) => format!("vm:{}@{}:{}", t.user, t.host, t.port),
        (Target::Vm, _) => String::new(),
        (Target::K8s, _) => format!("k8s:{}", emit.out.clone().unwrap_or_default()),
        (_, Connection::Local { root: Some(r) }) => format!("{}:local:{r}", target.as_str()),
        (_, _) => format!("{}:local:/", target.as_str()),
    }
}

/// The package managers' lock files a preflight waits for: dpkg's (held
/// with fcntl locks, seen in /proc/locks) and pacman's (the file is the
/// lock).
pub const PACKAGE_LOCKS: &[&str] = &[
    "/var/lib/dpkg/lock-frontend",
    "/var/lib/dpkg/lock",
    "/var/lib/pacman/db.lck",
];

/// Before the first step on a fresh machine: waits (at most `wait`) for
/// cloud-init to finish and for the package manager locks in `locks` to
/// be free, so a deploy does not race the machine's own first boot. A lock
/// still held at the end is an error naming it.
pub fn preflight(host: &mut dyn Host, wait: Duration, locks: &[&str]) -> Result<(), BundleError> {
    let secs = wait.as_secs().max(1);
    let files = locks
        .iter()
        .map(|f| charly_rules::sh::quote_min(f))
        .collect::<Vec<_>>()
        .join(" ");
    let script = format!(
        r#"end=$(( $(date +%s) + {secs} ))
if command -v cloud-init >/dev/null 2>&1; then
  timeout {secs} cloud-init status --wait >/dev/null 2>&1 || true
fi
held() {{
  [ -e "$1" ] || return 1
  case "$1" in *.lck) return 0 ;; esac
  [ -r /proc/locks ] || return 1
  ino=$(stat -c %i "$1" 2>/dev/null) || return 1
  grep -q ":$ino " /proc/locks
}}
for f in {files}; do
  while held "$f"; do
    if [ "$(date +%s)" -ge "$end" ]; then
      echo "$f is still locked after {secs} s (another package manager is running)" >&2
      exit 75
    fi
    sleep 1
  done
done"#
    );
    let out = host.run(&crate::host::Cmd::sh(script).timeout(wait + Duration::from_secs(30)))?;
    if out.ok() {
        Ok(())
    } else {
        Err(BundleError::Preflight {
            host: host.describe(),
            message: out.stderr_tail(),
        })
    }
}

/// Opens the host a bundle was recorded with.
pub fn host_for(conn: &Connection) -> Result<Box<dyn Host>, BundleError> {
    match conn {
        Connection::Local { root } => Ok(match root {
            Some(r) => Box::new(LocalHost::rooted(Path::new(r))?),
            None => Box::new(LocalHost::new()),
        }),
        Connection::Ssh(t) => Ok(Box::new(SshHost::connect(t, CONNECT_TIMEOUT)?)),
        Connection::Other(_) => Err(BundleError::Unreachable(conn.kind().map(String::from))),
    }
}

/// The account a k8s tree is written for: whoever owns the project
/// directory (the login's name, the directory's uid and gid), with the
/// project directory as its home.
pub fn project_user(host: &mut dyn Host, project_root: &Path) -> Result<TargetUser, BundleError> {
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata(project_root).map_err(|source| BundleError::Io {
        path: project_root.display().to_string(),
        source,
    })?;
    let login = host.login()?;
    Ok(TargetUser {
        name: login.name,
        uid: md.uid(),
        gid: md.gid(),
        home: project_root.display().to_string(),
        shell: "/bin/sh".into(),
    })
}

/// Artifacts for plans that only write rendered files (pod, k8s).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoArtifacts;

impl Artifacts for NoArtifacts {
    fn builder_tar(&self, candy: &str, builder: &str) -> Result<Vec<u8>, String> {
        Err(format!("{candy}: no {builder} artifact for this target"))
    }
    fn local_packages(&self, candy: &str, _: &str) -> Result<Vec<(String, Vec<u8>)>, String> {
        Err(format!("{candy}: no local packages for this target"))
    }
    fn candy_file(&self, candy: &str, rel: &str) -> Result<Vec<u8>, String> {
        Err(format!("{candy}: no file {rel} for this target"))
    }
}

/// A pod bundle's overlay box: box `b` with the `add` candies on top, as
/// a box of `project` named `<b>-add-<deploy id>` (its own image, built
/// like any box). Returns the project with it, its resolution and the new
/// box's qualified name; an overlay that does not resolve is an error
/// naming each reason.
pub fn overlay_project(
    project: &Project,
    b: &ResolvedBox,
    add: &[String],
) -> Result<(Project, charly_rules::resolve::Resolution, String), String> {
    let short = b.name.rsplit('.').next().unwrap_or(&b.name);
    let name = format!(
        "{short}-add-{}",
        charly_rules::plan::deploy_id(&b.name, &[], add)
    );
    let mut project = project.clone();
    let ns = &mut project.namespaces[b.ns.0];
    let span = b.span;
    let spanned = |v: &str| charly_rules::yaml::Spanned {
        span,
        value: v.to_string(),
    };
    let def = charly_rules::model::BoxDef {
        name: Some(spanned(&name)),
        version: Some(spanned(&b.version)),
        base: Some(spanned(short)),
        candy: add.iter().map(|k| spanned(k)).collect(),
        ..charly_rules::model::BoxDef::default()
    };
    let qualified = ns.qualify(&name);
    ns.boxes.insert(
        name.clone(),
        charly_rules::load::BoxEntry {
            name,
            ns: b.ns,
            file: span.file,
            span,
            def,
        },
    );
    let resolution = charly_rules::resolve::resolve(&project);
    if let Some(Err(e)) = resolution.boxes.get(&qualified) {
        let why: Vec<String> = e.iter().map(|d| d.message.clone()).collect();
        return Err(why.join("; "));
    }
    Ok((project, resolution, qualified))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ssh::SshTarget;
    use charly_rules::load::{self, LoadOptions};
    use charly_rules::resolve;

    fn ssh() -> SshTarget {
        SshTarget {
            user: "al".into(),
            host: "10.0.0.2".into(),
            port: 2222,
            identity: "/k/id".into(),
            known_hosts: "/k/kh".into(),
        }
    }

    /// Keys are stored and compared with those of earlier bundles: they
    /// must not change.
    #[test]
    fn target_keys_are_stable() {
        let none = EmitSpec::default();
        let local = Connection::Local { root: None };
        let rooted = Connection::Local {
            root: Some("/srv/r".into()),
        };
        let k8s = EmitSpec {
            out: Some("/p/.build/k8s/b".into()),
            ..EmitSpec::default()
        };
        let key = target_key;
        assert_eq!(key(Target::Local, &local, &none), "local:local:/");
        assert_eq!(key(Target::Local, &rooted, &none), "local:local:/srv/r");
        assert_eq!(key(Target::Pod, &local, &none), "pod:local:/");
        assert_eq!(key(Target::Pod, &rooted, &none), "pod:local:/srv/r");
        assert_eq!(key(Target::K8s, &local, &k8s), "k8s:/p/.build/k8s/b");
        assert_eq!(
            key(Target::Vm, &Connection::Ssh(ssh()), &none),
            "vm:al@10.0.0.2:2222"
        );
    }

    #[test]
    fn recorded_options_keep_their_shape() {
        let emit = EmitSpec {
            system: true,
            out: None,
            image: Some("localhost/b:1".into()),
        };
        let v = record_options(Gates::all(), false, "podman", &emit);
        assert_eq!(
            v.to_string(),
            r#"{"dev_local_pkg":false,"emit":{"image":"localhost/b:1","out":null,"system":true},"gates":{"allow_repo_changes":true,"allow_root_tasks":true,"with_services":true},"runner":"podman"}"#
        );
    }

    #[test]
    fn unknown_connections_are_refused_by_kind() {
        let e = host_for(&Connection::Other(serde_json::json!({"kind": "moon"})))
            .err()
            .expect("refused");
        assert_eq!(
            e.to_string(),
            r#"cannot reach a target of kind Some("moon") (not implemented yet)"#
        );
        let e = host_for(&Connection::Other(serde_json::json!({})))
            .err()
            .expect("refused");
        assert_eq!(
            e.to_string(),
            "cannot reach a target of kind None (not implemented yet)"
        );
    }

    #[test]
    fn pod_and_k8s_plans_write_rendered_files() {
        let p = load::load(&charly_testutil::example(), &LoadOptions::default()).expect("loads");
        let r = resolve::resolve(&p);
        let b = r.get("hello").expect("hello");
        let pod = emitted_plan(&p, b, Target::Pod, &EmitSpec::default(), "/home/al/").expect("pod");
        assert_eq!(pod.steps.len(), 2);
        assert_eq!(pod.steps[0].candy, "(box hello)");
        assert!(matches!(&pod.steps[0].data,
            StepData::File(f) if f.path.starts_with("/home/al/.config/containers/systemd/")));
        assert_eq!(pod.steps[0].scope, Scope::User);
        assert_eq!(pod.steps[1].gate, Gate::WithServices);
        let sys = EmitSpec {
            system: true,
            ..EmitSpec::default()
        };
        let pod = emitted_plan(&p, b, Target::Pod, &sys, "/home/al").expect("pod");
        assert!(matches!(&pod.steps[0].data,
            StepData::File(f) if f.path.starts_with("/etc/containers/systemd/")));
        let k8s = EmitSpec {
            out: Some("/p/k/".into()),
            ..EmitSpec::default()
        };
        let tree = emitted_plan(&p, b, Target::K8s, &k8s, "/p").expect("k8s");
        assert!(!tree.steps.is_empty());
        assert!(tree.steps.iter().all(|s| matches!(&s.data,
            StepData::File(f) if f.path.starts_with("/p/k/") && !f.path.starts_with("/p/k//"))));
        // Other targets walk the merged plan; `current_plan` picks by the record's target.
        let local = emitted_plan(&p, b, Target::Local, &k8s, "/p").expect("local");
        assert_eq!(local, merged_plan(&p, b, Target::Local).expect("merged"));
    }
}
