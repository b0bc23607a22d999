//! What `bundle add` and `bundle apply` do between the command line and
//! the walk: the plan each target gets, the account it runs as, where its
//! artifacts come from, the walk's options and the bundle's record
//! ([`prepare_add`], [`prepare_reapply`]). The CLI opens the project,
//! store, host and plugins, and prints; the walk itself is [`crate::walk`].

use crate::bundle::{self, BundleError, EmitSpec, NoArtifacts};
use crate::host::Host;
use crate::ledger::{BundleRecord, BundleState, Connection};
use crate::source::StoreArtifacts;
use crate::walk::{self, Artifacts, Options, PluginSteps, TargetUser};
use charly_cache::Store;
use charly_engine::graph::GraphOptions;
use charly_engine::hash::FileHasher;
use charly_rules::load::Project;
use charly_rules::plan::{Gates, InstallPlan, Target};
use charly_rules::resolve::{Resolution, ResolvedBox};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Why a deploy cannot start.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The plan, host or emitted files.
    #[error(transparent)]
    Bundle(#[from] BundleError),
    /// The walk's setup (the target's account).
    #[error(transparent)]
    Walk(#[from] walk::WalkError),
    /// What `box build` stored is missing or does not match.
    #[error("{0}")]
    Artifacts(String),
    /// A plan or record that does not serialize.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// A path that cannot be made absolute.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// The project and store a deploy reads.
#[derive(Clone, Copy)]
pub struct Sources<'a> {
    /// The project.
    pub project: &'a Project,
    /// Its resolution.
    pub resolution: &'a Resolution,
    /// The store `box build` filled.
    pub store: &'a Store,
    /// The stat cache.
    pub hasher: &'a FileHasher,
}

/// How the box's artifacts were built (they are looked up by the keys
/// this build gives them): `--dev-local-pkg`, the runner, the architecture.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildSettings {
    /// `--dev-local-pkg`.
    pub dev_local_pkg: bool,
    /// The runner's name.
    pub runner: String,
    /// The target architecture.
    pub arch: String,
}

impl BuildSettings {
    /// The settings bundle `rec` was added with (`podman` and no
    /// `--dev-local-pkg` when it does not say), for `arch`.
    pub fn recorded(rec: &BundleRecord, arch: &str) -> Self {
        let recorded = |k: &str| rec.options.get(k).cloned();
        BuildSettings {
            dev_local_pkg: recorded("dev_local_pkg")
                .and_then(|v| v.as_bool())
                .unwrap_or(false),
            runner: recorded("runner")
                .and_then(|v| v.as_str().map(String::from))
                .unwrap_or_else(|| "podman".into()),
            arch: arch.to_string(),
        }
    }
}

/// Where a host deploy's builder artifacts and local packages come from:
/// the store, by the keys `box build` gave them; pods and k8s need none.
pub fn artifacts<'a>(
    src: Sources<'a>,
    target: Target,
    build: &BuildSettings,
    box_name: &str,
) -> Result<Box<dyn Artifacts + 'a>, SessionError> {
    if matches!(target, Target::Pod | Target::K8s) {
        return Ok(Box::new(NoArtifacts));
    }
    let arts = StoreArtifacts::new(
        src.project,
        src.resolution,
        src.store,
        src.hasher,
        GraphOptions {
            plugins: Default::default(),
            dev_local_pkg: build.dev_local_pkg,
            runner: build.runner.clone(),
            arch: build.arch.clone(),
        },
        box_name,
    )
    .map_err(SessionError::Artifacts)?;
    Ok(Box::new(arts))
}

/// A pod's overlay image (`--add`) and what `del` does with it.
#[derive(Clone, Debug)]
pub struct Overlay {
    /// The image.
    pub image: String,
    /// `--keep-image`: `del` leaves it.
    pub keep_image: bool,
    /// The podman storage it was built into (`--podman-root`).
    pub podman_root: Option<PathBuf>,
}

/// `bundle add`, as asked.
#[derive(Clone, Debug)]
pub struct AddRequest {
    /// The bundle's name.
    pub name: String,
    /// The box.
    pub box_name: String,
    /// The target.
    pub target: Target,
    /// Candies added on top of the box (`--add`, as candy keys).
    pub add: Vec<String>,
    /// The account (default: the box's user).
    pub user: Option<String>,
    /// Open gates.
    pub gates: Gates,
    /// Change nothing.
    pub dry_run: bool,
    /// Per-command time limit.
    pub timeout: Duration,
    /// How pod and k8s files are rendered.
    pub emit: EmitSpec,
    /// k8s: where the kustomize tree goes (default: the project's
    /// `.build/k8s/<name>`).
    pub k8s_out: Option<PathBuf>,
    /// How the artifacts were built.
    pub build: BuildSettings,
    /// A pod's overlay image.
    pub overlay: Option<Overlay>,
}

/// A walk ready to start: what it applies, as whom, with which artifacts,
/// under which options, recorded as what.
pub struct Prepared<'a> {
    /// The plan.
    pub plan: InstallPlan,
    /// The account.
    pub user: TargetUser,
    /// Builder artifacts and local packages.
    pub arts: Box<dyn Artifacts + 'a>,
    /// The walk's options.
    pub opts: Options,
    /// The bundle's record.
    pub record: BundleRecord,
}

/// Everything `bundle add` needs before its walk, on `host` reached as
/// `connection`: the plan for the target (the host's plan with the store's
/// artifacts for a host; the emitted files for pods and k8s), checked
/// against the host's distro before any change.
pub fn prepare_add<'a>(
    src: Sources<'a>,
    b: &ResolvedBox,
    req: &AddRequest,
    host: &mut dyn Host,
    connection: Connection,
    plugins: Option<Arc<dyn PluginSteps>>,
) -> Result<Prepared<'a>, SessionError> {
    let mut emit = req.emit.clone();
    if let Some(o) = &req.overlay {
        emit.image = Some(o.image.clone());
    }
    let (plan, user) = add_plan(src.project, b, req, &mut emit, host)?;
    let arts = artifacts(src, req.target, &req.build, &req.box_name)?;
    let opts = Options {
        gates: req.gates,
        dry_run: req.dry_run,
        timeout: req.timeout,
        target: req.target,
        box_home: b.user.home.clone(),
        on_change: None,
        // Over SSH, consecutive commands go in one round trip.
        batch_commands: matches!(connection, Connection::Ssh(_)),
        plugins,
    };
    let record = BundleRecord {
        name: req.name.clone(),
        deploy_id: plan.deploy_id.clone(),
        box_name: req.box_name.clone(),
        target: req.target,
        target_key: bundle::target_key(req.target, &connection, &emit),
        connection,
        user: user.name.clone(),
        home: user.home.clone(),
        state: BundleState::Applying,
        plan: serde_json::to_value(&plan)?,
        options: add_options(req, &emit, src.project)?,
        created_unix: 0,
        updated_unix: 0,
        error: None,
    };
    Ok(Prepared {
        plan,
        user,
        arts,
        opts,
        record,
    })
}

/// The plan `add` walks and the account it runs as: the emitted plan for
/// k8s and pods, the host's plan for a host.
fn add_plan(
    project: &Project,
    b: &ResolvedBox,
    req: &AddRequest,
    emit: &mut EmitSpec,
    host: &mut dyn Host,
) -> Result<(InstallPlan, TargetUser), SessionError> {
    let target = req.target;
    if target == Target::K8s {
        let out = match &req.k8s_out {
            Some(d) => std::path::absolute(d)?,
            None => project.root.join(".build/k8s").join(&req.name),
        };
        // The tree belongs to whoever owns the project.
        let user = bundle::project_user(host, &project.root)?;
        emit.out = Some(out.display().to_string());
        let plan = bundle::emitted_plan(project, b, target, emit, &user.home)?;
        return Ok((plan, user));
    }
    // A host deploy installs with the host's package manager: a box for
    // another distro is refused here, before any change (pods run the
    // image, whatever the host runs).
    let base = if target == Target::Pod {
        bundle::merged_plan(project, b, target)?
    } else {
        let os = bundle::host_os(host)?;
        bundle::host_plan(project, b, target, &req.add, os.as_ref())?
    };
    let user_name = req.user.clone().unwrap_or_else(|| b.user.name.clone());
    let user = walk::resolve_user(host, &user_name, &base)?;
    if target != Target::Pod {
        return Ok((base, user));
    }
    let mut plan = bundle::emitted_plan(project, b, target, emit, &user.home)?;
    if !req.add.is_empty() {
        plan.deploy_id = charly_rules::plan::deploy_id(&b.name, &[], &req.add);
        plan.add_candies = req.add.clone();
    }
    Ok((plan, user))
}

/// The options a bundle's record keeps: its gates and build settings,
/// where the project is (so `status` can compare the plan from anywhere),
/// and a pod overlay's image.
fn add_options(
    req: &AddRequest,
    emit: &EmitSpec,
    project: &Project,
) -> Result<serde_json::Value, SessionError> {
    let mut o = bundle::record_options(req.gates, req.build.dev_local_pkg, &req.build.runner, emit);
    if let Some(map) = o.as_object_mut() {
        map.insert("project".into(), project.root.display().to_string().into());
        if let Some(ov) = &req.overlay {
            map.insert("overlay_image".into(), ov.image.clone().into());
            map.insert("keep_image".into(), ov.keep_image.into());
            map.insert("podman_root".into(), serde_json::to_value(&ov.podman_root)?);
        }
    }
    Ok(o)
}

/// `bundle apply`, as asked.
#[derive(Clone, Debug)]
pub struct ReapplyRequest {
    /// The target architecture (the artifacts' keys).
    pub arch: String,
    /// Change nothing.
    pub dry_run: bool,
    /// Per-command time limit.
    pub timeout: Duration,
}

/// Everything `bundle apply` needs before its walk: bundle `rec`'s plan as
/// the project now makes it for the host, with the gates and build
/// settings it was added with.
pub fn prepare_reapply<'a>(
    src: Sources<'a>,
    b: &ResolvedBox,
    rec: &BundleRecord,
    req: &ReapplyRequest,
    host: &mut dyn Host,
    plugins: Option<Arc<dyn PluginSteps>>,
) -> Result<Prepared<'a>, SessionError> {
    let os = bundle::host_os(host)?;
    let plan = bundle::current_plan(src.project, b, rec, os.as_ref())?;
    let user = walk::resolve_user(host, &rec.user, &plan)?;
    let gates: Gates = rec
        .options
        .get("gates")
        .cloned()
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_default();
    let arts = artifacts(
        src,
        rec.target,
        &BuildSettings::recorded(rec, &req.arch),
        &rec.box_name,
    )?;
    let opts = Options {
        gates,
        dry_run: req.dry_run,
        timeout: req.timeout,
        target: rec.target,
        box_home: b.user.home.clone(),
        on_change: None,
        batch_commands: matches!(rec.connection, Connection::Ssh(_)),
        plugins,
    };
    let record = BundleRecord {
        deploy_id: plan.deploy_id.clone(),
        plan: serde_json::to_value(&plan)?,
        ..rec.clone()
    };
    Ok(Prepared {
        plan,
        user,
        arts,
        opts,
        record,
    })
}
