//! [`RemoteRunner`]: runs command nodes on a REAPI engine.
//!
//! It wraps a local runner. Builder stages and local-package builds become
//! REAPI actions; image builds, image restores and rootfs bootstraps stay
//! with the local runner (see "What runs where" below). Because it is a
//! [`Runner`], the scheduler, the node keys and the local store's
//! memoization are the same as for a local run: a node whose key is in the
//! local store never reaches the engine, and what comes back from the engine
//! is verified, then stored locally exactly like a local result. The
//! runner's [`name`](Runner::name) is the local runner's, because a remote
//! result is byte-for-byte what the local runner would produce (the
//! end-to-end test checks that), so both share cache entries.
//!
//! ## The action of a local-package build
//!
//! * input root: the package source at `charly-src/`, an empty `out/`;
//! * command: `sh -c <rendered build_template>` (which reads `/src` and
//!   writes `/out`) after the source is copied to `/src` with a checkout's
//!   modes (0755 directories and executables, 0644 other files: REAPI
//!   carries only the executable bit, and engines stage files read-only or
//!   directories world-writable), working directory the root, environment
//!   `PATH=/usr/sbin:/usr/bin:/sbin:/bin` and `LC_ALL=C.UTF-8` (sorted);
//! * output: `out` (a directory);
//! * platform: `OSFamily=linux`, `ISA=x86-64`/`aarch64` and
//!   `container-image=docker://<the build image>`, the property engines that
//!   run actions in containers (Buildbarn, BuildBuddy, NativeLink, EngFlow)
//!   read (buildbox-casd reads it too and pulls the image from its
//!   registry). Where the engine only sandboxes commands with its own host
//!   tools (buildbox-run with bubblewrap and no registry, as in CI here),
//!   the property is not sent ([`RemoteOptions::image_property`] off,
//!   `--remote-no-image-property`): buildbox would otherwise fail the action
//!   trying to pull the image.
//!
//! With `--remote-stage-rootfs` ([`RemoteOptions::stage_rootfs`]), for an
//! engine that only sandboxes commands and has no tools of its own to lend
//! (bubblewrap with nothing bind-mounted: the action sees only its input
//! root, so not even `sh`), the build image's root filesystem is the input
//! root, as for a builder stage, with `src/` and `out/` in it; the
//! environment is then the image's, as `podman run` gives it, and no image
//! is named. The image's files cost one upload per engine (the CAS keeps
//! them once) and enter the action key, which the image reference already
//! does for the node key.
//!
//! Otherwise the image's files stay out of the input root: they would add
//! hundreds of megabytes (tens of thousands of blobs) to every action's
//! Merkle tree where an engine can bring the image itself. The image
//! reference already enters the node key, so its digest identifies the
//! toolchain; a container-based engine pulls it once and caches it.
//!
//! ## The action of a builder stage
//!
//! A stage is a one-stage Containerfile run against the builder image; its
//! instructions are interpreted into one shell script (see
//! [`charly_reapi::stage`]), which ends by writing a tar of every export path to
//! the output directory `charly-out/`. The artifact is then written from
//! those tars exactly as the podman runner writes it from `podman cp`, so
//! both are byte for byte the same (tested against podman).
//!
//! * input root: the COPY sources under `charly-ctx/` (only those, not the
//!   whole project), plus the builder image's root filesystem when it
//!   travels in the input root (below);
//! * command: `/bin/sh -c <script>`, environment the image's (`ENV` of the
//!   image config, with the default `PATH` when it has none), starting in
//!   the image's `WORKDIR` as its `USER`;
//! * output: `charly-out` (a directory);
//! * platform: `OSFamily`, `ISA`, and how the image is provided
//!   ([`StageMode`]): `container-image=docker://<builder image>` for engines
//!   that run actions in containers (the default; the image must be
//!   pullable by the engine), or, with [`RemoteOptions::stage_rootfs`]
//!   (`--remote-stage-rootfs`), the image's root filesystem as the input
//!   root itself, so the sandbox's `/` is the image. That is the only way an
//!   engine that merely sandboxes commands (buildbox-run with bubblewrap, as
//!   in CI here) can run a stage in its image. Unlike a local-package build,
//!   a stage's toolchain *is* the image (npm, pixi, makepkg), so host tools
//!   will not do. The cost is the image's files in every stage's input
//!   root: they are exported and hashed once per image per process, and
//!   the engine's CAS stores them once. With `--remote-no-image-property`
//!   and no `--remote-stage-rootfs`, stages stay local.
//!
//! Engine-specific needs go in [`RemoteOptions::platform`]
//! (`--remote-platform KEY=VALUE`), added to every action: buildbox-run
//! shares the host's network only with `network=on` (then the image needs
//! its own `/etc/resolv.conf`) and runs the action as another user with
//! `unixUID`/`unixGID`; BuildBuddy reads `dockerNetwork`, and so on.
//! `--ca-bundle` travels in the input root of actions whose input root is
//! their `/` (image files sent, or the engine's own tools), where a local
//! build would mount it; an image the engine provides trusts what it trusts.
//!
//! A stage whose Containerfile uses an instruction the interpreter does not
//! carry out (`ARG`, `ADD`, a second real stage, …) is never sent: it fails
//! naming the line, or runs locally with `--remote-fallback`.
//!
//! ## What runs where
//!
//! Image builds are podman's own work (layers, an image store); REAPI has no
//! notion of them, so they stay local. Rootfs bootstraps need root and the
//! network (debootstrap), which remote sandboxes deny. Builder stages and
//! local-package builds are commands over content-addressed inputs and are
//! sent to the engine.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use charly_reapi::action::{ActionError, ActionOutcome, RemoteCommand};
use charly_reapi::client::{Client, RemoteError};
use charly_reapi::stage::{self, StageMode, Step};
use charly_reapi::tree::InputRoot;

use super::{
    CA_ENV, CA_TARGET, ExportedImage, ImageConfig, LayerRequest, LayerResult, LocalPkgRequest,
    RootfsRequest, RunError, Runner, StageRequest,
};

/// Where a local package's source travels in its action's input root
/// (copied to `/src` with canonical modes before the build).
const PKG_SRC_STAGED: &str = "charly-src";

/// The first line of a local package's action: the source copied to `/src`
/// with a checkout's modes.
fn pkg_src_prep() -> String {
    format!(
        "mkdir -p /src && cp -R /{PKG_SRC_STAGED}/. /src/ && chmod -R u=rwX,go=rX /src || exit 70"
    )
}

/// A builder image as stage actions need it, made once per image.
struct BuilderImage {
    /// The input root to start from: its root filesystem, or empty.
    input: InputRoot,
    /// Its environment, user and working directory.
    cfg: ImageConfig,
    /// The root filesystem tar the input root's blobs are read from.
    _rootfs: Option<tempfile::TempPath>,
}

type BuilderBase = Arc<BuilderImage>;

/// Per builder image, the base made once (or why it could not be).
type BuilderCell = Arc<OnceLock<Result<BuilderBase, String>>>;

/// Settings of remote execution.
#[derive(Debug, Clone)]
pub struct RemoteOptions {
    /// At most this many actions in flight at once.
    pub jobs: usize,
    /// Run a node locally when the engine cannot be reached or refuses it
    /// (never when the command itself fails remotely).
    pub fallback: bool,
    /// Send `container-image=docker://<image>` as a platform property.
    pub image_property: bool,
    /// Send builder stages with the builder image's root filesystem as the
    /// input root (for engines that only sandbox commands).
    pub stage_rootfs: bool,
    /// Target ISA as REAPI names it (`x86-64`, `aarch64`).
    pub isa: String,
    /// Extra platform properties of every action (`--remote-platform`):
    /// what a particular engine needs, e.g. `network=on` for buildbox-run
    /// or `dockerNetwork=bridge` for BuildBuddy. They are part of the
    /// action, so of its ActionCache entry.
    pub platform: BTreeMap<String, String>,
    /// Per-action timeout.
    pub timeout: Option<Duration>,
    /// Send box layers to the engine (`--remote-layers`; see
    /// [`charly_reapi::layer`]): each runs in its parent's root filesystem,
    /// applied from the parent's stored layer blobs.
    pub layers: bool,
    /// `--ca-bundle`: carried into actions whose input root is their `/`
    /// (see [`RemoteRunner::add_ca`]).
    pub ca_bundle: Option<std::path::PathBuf>,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions {
            jobs: 8,
            fallback: false,
            image_property: true,
            stage_rootfs: false,
            platform: BTreeMap::new(),
            isa: isa_of(std::env::consts::ARCH).to_string(),
            timeout: Some(Duration::from_secs(3600)),
            ca_bundle: None,
            layers: false,
        }
    }
}

/// REAPI's ISA name for an architecture (Rust's or Docker's spelling).
pub fn isa_of(arch: &str) -> &str {
    match arch {
        "x86_64" | "amd64" => "x86-64",
        "aarch64" | "arm64" => "aarch64",
        other => other,
    }
}

/// Where a node ran.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Place {
    /// Executed on the engine.
    Remote,
    /// The engine's ActionCache had the result; nothing was executed.
    RemoteCached,
    /// Ran locally after the engine failed (`--remote-fallback`).
    LocalFallback,
    /// Ran locally (a kind that is not sent to the engine).
    Local,
}

/// What happened to one node.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RemoteNode {
    /// Where it ran.
    pub place: Place,
    /// `hash/size` of its action (empty for local kinds).
    pub action_digest: String,
    /// Wall time of the round trip (or the local run).
    pub ms: u64,
    /// Bytes uploaded to the engine.
    pub uploaded_bytes: u64,
    /// Bytes of outputs downloaded.
    pub downloaded_bytes: u64,
    /// Why it fell back to local, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback_reason: Option<String>,
}

/// Per-node record of a run, by node id.
pub type RemoteStats = BTreeMap<String, RemoteNode>;

/// A runner that executes command nodes on a REAPI engine (module docs).
pub struct RemoteRunner<'a> {
    client: Client,
    local: &'a dyn Runner,
    opts: RemoteOptions,
    in_flight: Mutex<usize>,
    cv: std::sync::Condvar,
    peak: AtomicUsize,
    stats: Mutex<RemoteStats>,
    builders: Mutex<BTreeMap<String, BuilderCell>>,
}

struct Slot<'r, 'a>(&'r RemoteRunner<'a>);
impl Drop for Slot<'_, '_> {
    fn drop(&mut self) {
        if let Ok(mut n) = self.0.in_flight.lock() {
            *n = n.saturating_sub(1);
        }
        self.0.cv.notify_one();
    }
}

impl<'a> RemoteRunner<'a> {
    /// Connects to the engine at `url`; `local` runs what is not sent.
    /// Fails when the engine is unreachable or cannot execute (unless
    /// `opts.fallback`, in which case the caller may run locally instead).
    pub fn connect(
        url: &str,
        local: &'a dyn Runner,
        opts: RemoteOptions,
    ) -> Result<Self, RemoteError> {
        let client = Client::connect(url)?;
        if !client.capabilities().exec_enabled {
            return Err(RemoteError::new(format!(
                "{} serves no Execution service (exec_enabled is false in its capabilities)",
                client.url().display()
            )));
        }
        Ok(Self::with_client(client, local, opts))
    }

    /// A runner over an existing client.
    pub fn with_client(client: Client, local: &'a dyn Runner, opts: RemoteOptions) -> Self {
        RemoteRunner {
            client,
            local,
            opts: RemoteOptions {
                jobs: opts.jobs.max(1),
                ..opts
            },
            in_flight: Mutex::new(0),
            cv: std::sync::Condvar::new(),
            peak: AtomicUsize::new(0),
            stats: Mutex::new(BTreeMap::new()),
            builders: Mutex::new(BTreeMap::new()),
        }
    }

    /// The client (capabilities, URL).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// What happened to each node so far.
    pub fn stats(&self) -> RemoteStats {
        self.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// The most actions that were in flight at once.
    pub fn peak_in_flight(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    fn slot(&self) -> Slot<'_, 'a> {
        let mut n = match self.in_flight.lock() {
            Ok(n) => n,
            Err(p) => p.into_inner(),
        };
        while *n >= self.opts.jobs {
            n = match self.cv.wait(n) {
                Ok(n) => n,
                Err(p) => p.into_inner(),
            };
        }
        *n += 1;
        self.peak.fetch_max(*n, Ordering::Relaxed);
        Slot(self)
    }

    fn record(&self, node: &str, r: RemoteNode) {
        if let Ok(mut s) = self.stats.lock() {
            s.insert(node.to_string(), r);
        }
    }

    fn local_kind<T>(
        &self,
        node: &str,
        f: impl FnOnce() -> Result<T, RunError>,
    ) -> Result<T, RunError> {
        self.run_locally(node, Place::Local, None, f)
    }

    /// Runs `f` locally, recording the node at `place` (with the action
    /// and the reason when it is a fallback).
    fn run_locally<T>(
        &self,
        node: &str,
        place: Place,
        fallback: Option<&ActionError>,
        f: impl FnOnce() -> Result<T, RunError>,
    ) -> Result<T, RunError> {
        let start = Instant::now();
        let r = f();
        self.record(
            node,
            RemoteNode {
                place,
                action_digest: fallback
                    .map(|e| e.action_digest.clone())
                    .unwrap_or_default(),
                ms: start.elapsed().as_millis() as u64,
                uploaded_bytes: 0,
                downloaded_bytes: 0,
                fallback_reason: fallback.map(|e| e.message.clone()),
            },
        );
        r
    }

    /// An action's platform: `OSFamily`, `ISA`, the image when it is named
    /// (`container-image=docker://…`), then `--remote-platform` entries,
    /// which win.
    fn platform(&self, image: Option<&str>) -> BTreeMap<String, String> {
        let mut platform = BTreeMap::new();
        platform.insert("OSFamily".to_string(), "linux".to_string());
        platform.insert("ISA".to_string(), self.opts.isa.clone());
        if let Some(image) = image {
            platform.insert("container-image".to_string(), format!("docker://{image}"));
        }
        platform.extend(self.opts.platform.clone());
        platform
    }

    /// The action of a local-package build (module docs).
    pub fn local_pkg_action(
        &self,
        req: &LocalPkgRequest,
    ) -> Result<(RemoteCommand, InputRoot), RemoteError> {
        let (mut input, mut env) = match self.stage_mode() {
            // The build image's files are the action's `/`, its
            // environment the action's, as `podman run` gives them.
            Some(StageMode::Rootfs) => {
                let base = self.builder_base(&req.image, StageMode::Rootfs)?;
                (base.input.clone(), stage::environment(&base.cfg.env))
            }
            _ => {
                let mut env = BTreeMap::new();
                env.insert(
                    "PATH".to_string(),
                    "/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
                );
                env.insert("LC_ALL".to_string(), "C.UTF-8".to_string());
                (InputRoot::new(self.client.digest_fn()), env)
            }
        };
        input.add_dir(PKG_SRC_STAGED, &req.source)?;
        input.add_empty_dir("out")?;
        let image = self.pkg_image_property(req);
        if image.is_none() {
            self.add_ca(&mut input, &mut env)?;
        }
        let platform = self.platform(image);
        // The engine stages files with its own modes (read-only, or
        // directories world-writable: dpkg-deb refuses those), and REAPI
        // carries only the executable bit: the source is copied to `/src`
        // with the modes a checkout has (0755 directories and executables,
        // 0644 other files), as podman's bind mount shows it.
        let script = format!("{}\n{}", pkg_src_prep(), req.script);
        let cmd = RemoteCommand {
            args: vec!["sh".into(), "-c".into(), script],
            env,
            workdir: String::new(),
            outputs: vec!["out/".into()],
            platform,
            timeout: self.opts.timeout,
        };
        Ok((cmd, input))
    }

    fn remote_local_pkg(&self, req: &LocalPkgRequest) -> Result<RemoteNode, ActionError> {
        let (cmd, input) = self.local_pkg_action(req).map_err(unsent)?;
        let (scratch, out) = self.execute(cmd, input)?;
        // Only the packages move on.
        copy_files(&scratch.path().join("out"), &req.out).map_err(|e| ActionError {
            message: e,
            action_digest: out.action_digest.clone(),
            engine_error: false,
        })?;
        Ok(node_of(out))
    }

    /// With `--ca-bundle`, an action whose input root is its `/` (the
    /// image's files, or the engine's own tools around an input root) gets
    /// the bundle at [`CA_TARGET`], over the image's own, and the
    /// variables that point commands at it ([`CA_ENV`]), as a local build
    /// does. An action run in an image the engine provides
    /// (`container-image`) cannot be given it: its input root is a working
    /// directory, not `/`.
    fn add_ca(
        &self,
        input: &mut InputRoot,
        env: &mut BTreeMap<String, String>,
    ) -> Result<(), RemoteError> {
        let Some(ca) = &self.opts.ca_bundle else {
            return Ok(());
        };
        let bytes = std::fs::read(ca)
            .map_err(|e| RemoteError::new(format!("CA bundle {}: {e}", ca.display())))?;
        input.add_bytes(CA_TARGET.trim_start_matches('/'), bytes, false)?;
        for k in CA_ENV {
            env.insert((*k).to_string(), CA_TARGET.to_string());
        }
        Ok(())
    }

    /// The image a local-package action names as `container-image`: only
    /// when it does not carry the image's files itself.
    fn pkg_image_property<'r>(&self, req: &'r LocalPkgRequest) -> Option<&'r str> {
        (self.opts.image_property && !self.opts.stage_rootfs).then_some(req.image.as_str())
    }

    /// How builder stages are sent, or `None` if they stay local.
    pub fn stage_mode(&self) -> Option<StageMode> {
        if self.opts.stage_rootfs {
            Some(StageMode::Rootfs)
        } else if self.opts.image_property {
            Some(StageMode::ImageProperty)
        } else {
            None
        }
    }

    /// The builder image's configuration and base input root, exported
    /// from the local runner once per image.
    fn builder_base(&self, image: &str, mode: StageMode) -> Result<BuilderBase, RemoteError> {
        let key = format!("{mode:?} {image}");
        let cell = match self.builders.lock() {
            Ok(mut m) => m.entry(key).or_default().clone(),
            Err(p) => p.into_inner().entry(key).or_default().clone(),
        };
        cell.get_or_init(|| {
            let mut input = InputRoot::new(self.client.digest_fn());
            let mut rootfs = None;
            let cfg = if mode == StageMode::Rootfs {
                let tmp = tempfile::Builder::new()
                    .prefix("charly-rootfs-")
                    .tempfile()
                    .map_err(|e| format!("scratch file: {e}"))?;
                let cfg = self
                    .local
                    .export_image(image, Some(tmp.path()))
                    .map_err(|e| e.to_string())?;
                input.add_tar("", tmp.path()).map_err(|e| e.message)?;
                // The blobs are read from the tar at upload time: it lives
                // as long as the runner.
                rootfs = Some(tmp.into_temp_path());
                cfg
            } else {
                self.local
                    .export_image(image, None)
                    .map_err(|e| e.to_string())?
            };
            Ok(Arc::new(BuilderImage {
                input,
                cfg,
                _rootfs: rootfs,
            }))
        })
        .clone()
        .map_err(|e| RemoteError::new(format!("builder image {image}: {e}")))
    }

    /// The action of a builder stage (see [`charly_reapi::stage`]).
    pub fn stage_action(
        &self,
        req: &StageRequest,
        mode: StageMode,
    ) -> Result<(RemoteCommand, InputRoot), RemoteError> {
        let parsed = stage::parse(&req.containerfile).map_err(|e| {
            RemoteError::new(format!("its Containerfile cannot run as an action: {e}"))
        })?;
        let base = self.builder_base(&req.builder_image, mode)?;
        let (root, cfg) = (&base.input, &base.cfg);
        // A stage starts where its image leaves off: its WORKDIR and USER.
        let mut steps = Vec::new();
        if !cfg.workdir.is_empty() {
            // A step word as reapi's parser writes it (quoted the same way).
            steps.push(Step::Workdir(charly_rules::sh::quote_min_pct(&cfg.workdir)));
        }
        if !cfg.user.is_empty() {
            steps.push(Step::User(cfg.user.clone()));
        }
        steps.extend(parsed.steps);
        let parsed = stage::Stage { steps, ..parsed };
        let mut input = root.clone();
        stage::add_sources(&parsed, &req.context, &mut input)?;
        let image = (mode == StageMode::ImageProperty).then_some(req.builder_image.as_str());
        let mut env = stage::environment(&cfg.env);
        if mode == StageMode::Rootfs {
            self.add_ca(&mut input, &mut env)?;
        }
        let platform = self.platform(image);
        let cmd = RemoteCommand {
            args: vec![
                "/bin/sh".into(),
                "-c".into(),
                stage::script(&parsed, &req.export),
            ],
            env,
            workdir: String::new(),
            outputs: vec![format!("{}/", stage::OUT_DIR)],
            platform,
            timeout: self.opts.timeout,
        };
        Ok((cmd, input))
    }

    fn remote_stage(&self, req: &StageRequest, mode: StageMode) -> Result<RemoteNode, ActionError> {
        let (cmd, input) = self.stage_action(req, mode).map_err(unsent)?;
        let (scratch, out) = self.execute(cmd, input)?;
        let bad = |message: String| ActionError {
            message,
            action_digest: out.action_digest.clone(),
            engine_error: false,
        };
        let mut files = Vec::new();
        for (i, src) in req.export.iter().enumerate() {
            let tar_path = scratch.path().join(stage::OUT_DIR).join(format!("{i}.tar"));
            let tar = std::fs::read(&tar_path)
                .map_err(|e| bad(format!("export of {src} missing from the outputs: {e}")))?;
            files.extend(
                charly_files::artifact::read_export(&tar, src)
                    .map_err(|e| bad(format!("reading the export of {src}: {e}")))?,
            );
        }
        charly_files::artifact::write_tar(&req.out, files, Some(req.owner))
            .map_err(|e| bad(format!("writing artifact: {e}")))?;
        Ok(node_of(out))
    }

    /// Runs an action (within the `--remote-jobs` bound); its outputs are
    /// in the returned scratch directory.
    fn execute(
        &self,
        cmd: RemoteCommand,
        input: InputRoot,
    ) -> Result<(tempfile::TempDir, ActionOutcome), ActionError> {
        let _slot = self.slot();
        let scratch = tempfile::Builder::new()
            .prefix("charly-remote-out-")
            .tempdir()
            .map_err(|e| ActionError {
                message: format!("scratch directory: {e}"),
                action_digest: String::new(),
                engine_error: false,
            })?;
        let out = cmd.run(&self.client, input, scratch.path(), false)?;
        Ok((scratch, out))
    }

    /// Runs `remote`; when the engine (not the command) fails and
    /// `--remote-fallback` is set, runs `local` instead. Records the node.
    fn remote_or_local(
        &self,
        node: &str,
        remote: impl FnOnce() -> Result<RemoteNode, ActionError>,
        local: impl FnOnce() -> Result<(), RunError>,
    ) -> Result<(), RunError> {
        match remote() {
            Ok(r) => {
                self.record(node, r);
                Ok(())
            }
            Err(e) if e.engine_error && self.opts.fallback => {
                self.run_locally(node, Place::LocalFallback, Some(&e), local)
            }
            Err(e) => Err(RunError::new(format!(
                "remote execution of {node} failed: {}",
                e.message
            ))),
        }
    }
}

impl RemoteRunner<'_> {
    /// A box layer as one action ([`charly_reapi::layer`]): what the
    /// engine cannot build faithfully is refused before anything is sent
    /// (an engine error, so `--remote-fallback` builds it locally).
    fn remote_layer(&self, req: &LayerRequest) -> Result<(LayerResult, RemoteNode), ActionError> {
        use charly_reapi::layer;
        let refuse = |why: String| {
            unsent(RemoteError::new(format!(
                "{} cannot build it: {why}",
                self.client.url().display()
            )))
        };
        let text = std::fs::read_to_string(&req.containerfile).map_err(|e| {
            unsent(RemoteError::new(format!(
                "{}: {e}",
                req.containerfile.display()
            )))
        })?;
        let parsed = stage::parse_layer(&text, &req.build_args).map_err(refuse)?;
        layer::check(&parsed).map_err(refuse)?;
        let parent = charly_reapi::tree::LayeredRoot::from_layers(
            self.client.digest_fn(),
            &req.parent_blobs,
        )
        .map_err(unsent)?;
        let base = RemoteCommand {
            env: stage::environment(&layer::config_env(&req.parent_config)),
            platform: self.platform(None),
            timeout: self.opts.timeout,
            ..RemoteCommand::default()
        };
        std::fs::create_dir_all(&req.out)
            .map_err(|e| unsent(RemoteError::new(format!("{}: {e}", req.out.display()))))?;
        let out = req.out.join("layer.tar.gz");
        let _slot = self.slot();
        let fakeroot = layer::Fakeroot::from_host();
        let job = layer::Job {
            stage: &parsed,
            parent: &parent,
            parent_config: &req.parent_config,
            context: &req.context,
            fakeroot: fakeroot.as_ref(),
        };
        let built = layer::build(&self.client, base, &job, &out)?;
        let result = LayerResult {
            layer: built.blob.map(|b| super::LayerFile {
                path: out,
                desc: super::LayerDesc {
                    digest: b.digest,
                    diff_id: b.diff_id,
                    size: b.size,
                    media_type: crate::oci::LAYER_GZIP.to_string(),
                    blob: String::new(),
                },
            }),
            config: built.config,
            in_runner: false,
        };
        Ok((result, node_of(built.outcome)))
    }
}

/// An engine pulls `container-image` from a registry: when the action named
/// an image only this machine has (`localhost/…`), the failure says so and
/// which flags fix it (`instead`: this node kind's way around it).
fn local_image_hint(mut e: RunError, image: Option<&str>, instead: &str) -> RunError {
    if let Some(image) = image.filter(|i| i.starts_with("localhost/")) {
        e.message.push_str(&format!(
            "\n  hint: the engine was asked to run it in docker://{image}, an image only this \
             machine has; {instead}, or --remote-fallback runs what the engine cannot here"
        ));
    }
    e
}

/// An action that could not be built, so was never sent: like an
/// unreachable engine, `--remote-fallback` runs the node locally.
fn unsent(e: RemoteError) -> ActionError {
    ActionError {
        message: e.message,
        action_digest: String::new(),
        engine_error: true,
    }
}

fn node_of(out: ActionOutcome) -> RemoteNode {
    RemoteNode {
        place: if out.cached {
            Place::RemoteCached
        } else {
            Place::Remote
        },
        action_digest: out.action_digest,
        ms: out.elapsed.as_millis() as u64,
        uploaded_bytes: out.uploaded_bytes,
        downloaded_bytes: out.downloaded_bytes,
        fallback_reason: None,
    }
}

fn copy_files(from: &Path, to: &Path) -> Result<(), String> {
    std::fs::create_dir_all(to).map_err(|e| format!("{}: {e}", to.display()))?;
    for e in std::fs::read_dir(from).map_err(|e| format!("{}: {e}", from.display()))? {
        let e = e.map_err(|e| format!("{}: {e}", from.display()))?;
        let dest = to.join(e.file_name());
        if e.path().is_dir() {
            copy_files(&e.path(), &dest)?;
        } else {
            std::fs::copy(e.path(), &dest).map_err(|x| format!("{}: {x}", dest.display()))?;
        }
    }
    Ok(())
}

impl Runner for RemoteRunner<'_> {
    fn name(&self) -> &str {
        self.local.name()
    }

    fn build_stage(&self, req: &StageRequest) -> Result<(), RunError> {
        match self.stage_mode() {
            Some(mode) => self
                .remote_or_local(
                    &req.node,
                    || self.remote_stage(req, mode),
                    || self.local.build_stage(req),
                )
                .map_err(|e| {
                    local_image_hint(
                        e,
                        (mode == StageMode::ImageProperty).then_some(req.builder_image.as_str()),
                        "--remote-stage-rootfs uploads the image's files instead",
                    )
                }),
            None => self.local_kind(&req.node, || self.local.build_stage(req)),
        }
    }

    fn build_layer(&self, req: &LayerRequest) -> Result<LayerResult, RunError> {
        let local = || {
            let parent = req.load_parent.tag(&req.parent)?;
            self.local.build_layer(&LayerRequest {
                parent,
                ..req.clone()
            })
        };
        if !self.opts.layers {
            return self.local_kind(&req.node, local);
        }
        match self.remote_layer(req) {
            Ok((res, node)) => {
                self.record(&req.node, node);
                Ok(res)
            }
            Err(e) if e.engine_error && self.opts.fallback => {
                self.run_locally(&req.node, Place::LocalFallback, Some(&e), local)
            }
            Err(e) => Err(RunError::new(format!(
                "remote execution of {} failed: {}",
                req.node, e.message
            ))),
        }
    }

    fn layers_from_blobs(&self) -> bool {
        self.opts.layers
    }

    fn export_layers(&self, reference: &str, out: &Path) -> Result<ExportedImage, RunError> {
        self.local.export_layers(reference, out)
    }

    fn load_layout(&self, dir: &Path, reference: &str, tag: &[String]) -> Result<String, RunError> {
        self.local.load_layout(dir, reference, tag)
    }

    fn rename_image(&self, from: &str, to: &str) -> Result<(), RunError> {
        self.local.rename_image(from, to)
    }

    fn has_image(&self, reference: &str) -> bool {
        self.local.has_image(reference)
    }

    fn image_id(&self, reference: &str) -> Option<String> {
        self.local.image_id(reference)
    }

    fn tag_image(&self, image: &str, tags: &[String]) -> Result<(), RunError> {
        self.local.tag_image(image, tags)
    }

    fn build_local_pkg(&self, req: &LocalPkgRequest) -> Result<(), RunError> {
        self.remote_or_local(
            &req.node,
            || self.remote_local_pkg(req),
            || self.local.build_local_pkg(req),
        )
        .map_err(|e| {
            local_image_hint(
                e,
                self.pkg_image_property(req),
                "--remote-stage-rootfs uploads the image's files instead, \
                 --remote-no-image-property builds it with the engine's own tools",
            )
        })
    }

    fn build_rootfs(&self, req: &RootfsRequest) -> Result<(), RunError> {
        self.local_kind(&req.node, || self.local.build_rootfs(req))
    }

    fn export_image(&self, image: &str, rootfs: Option<&Path>) -> Result<ImageConfig, RunError> {
        self.local.export_image(image, rootfs)
    }
}
