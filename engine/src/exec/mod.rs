//! Executing one node: the memoization protocol and each kind's work.
//!
//! Protocol: look up the key; on a hit the node is cached (an image is also
//! restored into the runner from its stored archive when the runner lost
//! it). On a miss, take the key's lock, look again, run, put every output
//! blob (durable), then commit the record naming them — so a record is never
//! visible before its outputs, and a killed process leaves no half record.
//!
//! A stored output that fails verification when it is read (the store then
//! quarantines it) or a record that does not decode (the store drops it) is
//! a miss, not a failure: whoever needed the output runs its node again —
//! its own dependencies are read the same way — and continues
//! ([`read_node`]). The store notes the damage once; nothing fails.
//!
//! With a remote cache ([`charly_cache::RemoteCache`]), a local miss asks
//! the remote while holding the key's lock: a remote hit arrives verified
//! and committed to the local store and the node is `pulled`, never run. A
//! node that ran is queued for upload once its record is committed.

pub mod layers;

pub use crate::ctx::{Ctx, ExecError};
use crate::generate::KEY_MARKER;
use crate::graph::{Graph, Node, Work};
use crate::id::NodeId;
use crate::key::NodeKind;
use crate::outputs::{self, ContainerfileMeta};
use crate::runners::{LocalPkgRequest, LogSink, RootfsRequest, StageRequest};
use charly_cache::{NodeKey, Output, Record, Store};
use charly_rules::emit::containerfile::{
    Fragment, assemble, fragment_is_last, render_candy_fragment,
};
use charly_rules::emit::{EmitOptions, Staged};
use charly_rules::naming;
use charly_rules::resolve::ResolvedBox;
use petgraph::stable_graph::NodeIndex;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// How a node got its result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Done {
    /// It ran.
    Ran,
    /// The local store had it.
    Cached,
    /// The remote cache had it (now also in the local store).
    Pulled,
}

fn io(what: impl std::fmt::Display) -> impl Fn(std::io::Error) -> ExecError {
    move |e| ExecError::Io(format!("{what}: {e}"))
}

/// Renders the fragment of the candy at `index` of box `box_name`.
pub fn fragment(
    ctx: &Ctx<'_>,
    box_name: &str,
    candy: &str,
    index: usize,
    steps: &crate::graph::FragmentSteps,
) -> Result<Fragment, ExecError> {
    let b = rbox(ctx, box_name)?;
    let steps = steps.get(ctx.project, b, candy)?;
    Ok(render_candy_fragment(
        ctx.project,
        b,
        candy,
        &steps,
        fragment_is_last(ctx.project, b, index),
        &ctx.emit,
    )?)
}

/// Whether each of `nodes` has its result in the store: known present
/// from the last run, or found there (the store asked about all of them
/// at once: [`Store::has_records`]).
///
/// `seen` is shared by the lookups that run together ([`charly_cache::SeenBlobs`]).
pub fn are_cached(ctx: &Ctx<'_>, nodes: &[&Node], seen: &charly_cache::SeenBlobs) -> Vec<bool> {
    let present: Vec<bool> = nodes
        .iter()
        .map(|n| ctx.present.is_some_and(|p| p.contains(&n.key)))
        .collect();
    let ask: Vec<charly_cache::NodeKey> = nodes
        .iter()
        .zip(&present)
        .filter(|(_, known)| !**known)
        .map(|(n, _)| n.key)
        .collect();
    let mut found = ctx.store.has_records(&ask, seen).into_iter();
    present
        .into_iter()
        .map(|known| known || found.next().unwrap_or(false))
        .collect()
}

/// Runs a node if needed, and says whether it ran or where its result came
/// from. `started` is called once, just before the node's work begins (never
/// for a cache hit or a pull), with a function that says why it runs
/// ([`crate::why::reason`], asked only by whoever wants to know): the
/// scheduler reports progress through it.
pub fn execute(
    ctx: &Ctx<'_>,
    graph: &Graph,
    i: NodeIndex,
    started: impl FnOnce(&dyn Fn() -> String),
) -> Result<Done, ExecError> {
    execute_as(ctx, graph, i, started, true)
}

/// [`execute`]; `trust_present: false` looks the record up even when the
/// run was told it is present (a reader that just failed to find it).
fn execute_as(
    ctx: &Ctx<'_>,
    graph: &Graph,
    i: NodeIndex,
    started: impl FnOnce(&dyn Fn() -> String),
    trust_present: bool,
) -> Result<Done, ExecError> {
    let n = &graph.g[i];
    if trust_present && ctx.present.is_some_and(|p| p.contains(&n.key)) {
        return Ok(Done::Cached);
    }
    if n.kind == NodeKind::Source {
        // Sources are recorded (inputs only) so `explain` can name the file
        // that changed; a new source key counts as "ran" (it was hashed anew).
        // They carry no outputs, so the remote never sees them.
        if ctx.store.has_record(&n.key)? {
            return Ok(Done::Cached);
        }
        ctx.store.put_record(&n.key, &source_record(n))?;
        return Ok(Done::Ran);
    }
    // A cached image is not loaded into the runner here: whatever needs
    // it there loads it (layers::ensure_image), so a no-op build
    // calls no runner.
    if ctx.store.has_record(&n.key)? {
        return Ok(Done::Cached);
    }
    // Two processes may both compute an in-process node (milliseconds, the
    // same bytes; the first record wins): only work that takes a runner is
    // worth a lock file per key.
    let _lock = if n.kind.in_process() {
        None
    } else {
        let lock = ctx.store.lock_key(&n.key)?;
        if ctx.store.has_record(&n.key)? {
            return Ok(Done::Cached);
        }
        Some(lock)
    };
    if let Some(remote) = ctx.remote
        && remote.fetch(ctx.store, &n.key)?.is_some()
    {
        return Ok(Done::Pulled);
    }
    started(&|| crate::why::reason(ctx.store, graph, i));
    let t = Instant::now();
    let log = NodeLog::new(ctx.store.dir(), &n.key.to_hex());
    let outputs = match work(ctx, graph, i, &log) {
        Ok(o) => {
            log.discard();
            o
        }
        Err(e) => return Err(log.keep(e)),
    };
    let mut rec_outputs = BTreeMap::new();
    let keep = outputs.keep;
    let outputs_cleanup = outputs.cleanup;
    for (name, o) in outputs.files {
        let (digest, size) = match o {
            Out::Bytes(b) => {
                let d = if n.kind.in_process() {
                    ctx.store.put_derived_blob(&b)?
                } else {
                    ctx.store.put_blob(&b)?
                };
                (d, b.len() as u64)
            }
            Out::File(p) => ctx.store.put_blob_file(&p)?,
            Out::Stored(o) => (o.digest, o.size),
        };
        rec_outputs.insert(
            name,
            Output {
                digest,
                size,
                mode: 0o644,
            },
        );
    }
    drop(keep);
    for d in &outputs_cleanup {
        remove_runner_scratch(d);
    }
    let rec = Record {
        node_id: n.id.clone(),
        kind: n.kind.as_str().to_string(),
        outputs: rec_outputs,
        duration_ms: t.elapsed().as_millis() as u64,
        producer: if matches!(
            n.kind,
            NodeKind::Layer
                | NodeKind::Base
                | NodeKind::BuilderStage
                | NodeKind::LocalPkg
                | NodeKind::Rootfs
        ) {
            ctx.runner_name.clone()
        } else {
            "charly".to_string()
        },
        key_inputs: n.inputs_json(),
        created_unix: now_unix(),
        meta: outputs.meta,
    };
    ctx.store.put_record(&n.key, &rec)?;
    if let Some(remote) = ctx.remote {
        remote.push(ctx.store, &n.key);
    }
    Ok(Done::Ran)
}

fn source_record(n: &Node) -> Record {
    Record {
        node_id: n.id.clone(),
        kind: n.kind.as_str().to_string(),
        outputs: BTreeMap::new(),
        duration_ms: 0,
        producer: "charly".into(),
        key_inputs: n.inputs_json(),
        created_unix: now_unix(),
        meta: serde_json::Value::Null,
    }
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Reads what `read` needs from the record of node `i` (a dependency, or a
/// goal whose outputs are written out). When the record is gone or an
/// output it names fails verification on the way (the store quarantines
/// it, so the record becomes a miss), `read` reports
/// [`ExecError::MissingOutput`]; the node then runs again (through
/// [`execute`], under its key lock, so concurrent readers share one rerun)
/// and `read` is retried on the fresh record.
pub fn read_node<T>(
    ctx: &Ctx<'_>,
    graph: &Graph,
    i: NodeIndex,
    read: impl Fn(&Record) -> Result<T, ExecError>,
) -> Result<T, ExecError> {
    read_node_by(ctx, graph, i, Store::get_record, read)
}

/// [`read_node`] with the record fetched by `fetch`: [`Store::read_record`]
/// for a reader that gets every blob it uses itself (and reports a missing
/// one as [`ExecError::MissingOutput`]) and needs no key inputs.
fn read_node_by<T>(
    ctx: &Ctx<'_>,
    graph: &Graph,
    i: NodeIndex,
    fetch: impl Fn(&Store, &NodeKey) -> Result<Option<Record>, charly_cache::CacheError>,
    read: impl Fn(&Record) -> Result<T, ExecError>,
) -> Result<T, ExecError> {
    let n = &graph.g[i];
    // Each failed read quarantines the blob it failed on, and a rerun only
    // restores blobs that are absent, so several damaged outputs take one
    // rerun each: bounded by the number of outputs.
    let mut reruns = 0usize;
    loop {
        let t = crate::timings::phase("read: record");
        let rec = fetch(ctx.store, &n.key)?;
        drop(t);
        let (err, outputs) = match rec {
            Some(rec) => match read(&rec) {
                Err(e @ ExecError::MissingOutput { .. }) => (e, rec.outputs.len()),
                r => return r,
            },
            None => (
                ExecError::MissingOutput {
                    node: n.id.clone(),
                    output: "record".into(),
                },
                0,
            ),
        };
        if reruns > outputs {
            return Err(err);
        }
        reruns += 1;
        execute_as(ctx, graph, i, |_| {}, false)?;
    }
}

/// Removes a scratch directory a runner left (an image archive's), but only
/// one charly made: a real directory (not a symlink) named `charly-…`
/// directly in the system temp directory. Anything else is left alone.
fn remove_runner_scratch(d: &Path) {
    let tmp = std::env::temp_dir();
    let ours = d
        .parent()
        .is_some_and(|p| std::fs::canonicalize(p).ok() == std::fs::canonicalize(&tmp).ok())
        && d.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("charly-"))
        && std::fs::symlink_metadata(d).is_ok_and(|m| m.is_dir());
    if ours {
        let _ = std::fs::remove_dir_all(d);
    }
}

/// A node's outputs before they are stored.
#[derive(Default)]
pub struct Outputs {
    /// Named outputs.
    pub files: BTreeMap<String, Out>,
    /// Free-form facts (image id…).
    pub meta: serde_json::Value,
    /// Scratch directories holding `Out::File`s until they are stored.
    pub keep: Vec<tempfile::TempDir>,
    /// Directories a runner left behind, removed once stored.
    pub cleanup: Vec<PathBuf>,
}

/// One output.
pub enum Out {
    /// In memory.
    Bytes(Vec<u8>),
    /// A file on disk (streamed into the store).
    File(PathBuf),
    /// A blob already in the store (a layer, shared by the images using it).
    Stored(Output),
}

fn rbox<'a>(ctx: &Ctx<'a>, name: &str) -> Result<&'a ResolvedBox, ExecError> {
    ctx.resolution
        .get(name)
        .ok_or_else(|| ExecError::Io(format!("box {name} does not resolve")))
}

/// Reads a stored output of the node `dep` from its record.
fn record_output(
    ctx: &Ctx<'_>,
    dep: &Node,
    rec: &Record,
    name: &str,
) -> Result<Vec<u8>, ExecError> {
    let out = rec
        .outputs
        .get(name)
        .ok_or_else(|| ExecError::MissingOutput {
            node: dep.id.clone(),
            output: name.into(),
        })?;
    ctx.store
        .get_blob(&out.digest)?
        .map(Vec::from)
        .ok_or_else(|| ExecError::MissingOutput {
            node: dep.id.clone(),
            output: name.into(),
        })
}

/// Emitter options for a box (artifact tars when its stages are prebuilt).
pub fn emit_options(ctx: &Ctx<'_>, b: &ResolvedBox, prebuilt: bool) -> EmitOptions {
    let mut o = ctx.emit.clone();
    if prebuilt {
        for stage in crate::graph::layers::prebuilt_stages(ctx.project, b) {
            o.artifacts.insert(
                stage.clone(),
                format!("{}/_artifacts/{stage}.tar", naming::build_dir(&b.name)),
            );
        }
    }
    o
}

/// A running node's whole log: `<store>/logs/<key>.log`, written line by
/// line as the runner reports them (made at the first line). Kept when the
/// node fails (the error names it: errors show only the last lines),
/// removed when it succeeds.
struct NodeLog {
    path: PathBuf,
    file: std::sync::Mutex<Option<std::io::LineWriter<std::fs::File>>>,
}

impl NodeLog {
    fn new(store: &Path, key: &str) -> NodeLog {
        NodeLog {
            path: store.join("logs").join(format!("{key}.log")),
            file: std::sync::Mutex::new(None),
        }
    }

    fn line(&self, l: &str) {
        use std::io::Write;
        let Ok(mut f) = self.file.lock() else { return };
        if f.is_none() {
            let made = self
                .path
                .parent()
                .map_or(Ok(()), std::fs::create_dir_all)
                .and_then(|()| std::fs::File::create(&self.path));
            match made {
                Ok(file) => *f = Some(std::io::LineWriter::new(file)),
                // A log that cannot be written costs the log, not the build.
                Err(_) => return,
            }
        }
        if let Some(w) = f.as_mut() {
            let _ = writeln!(w, "{l}");
        }
    }

    fn written(&self) -> bool {
        self.file.lock().is_ok_and(|f| f.is_some())
    }

    fn discard(&self) {
        if self.written() {
            let _ = std::fs::remove_file(&self.path);
        }
    }

    /// `e`, naming the log when the node wrote one.
    fn keep(&self, e: ExecError) -> ExecError {
        if self.written() {
            ExecError::Logged(Box::new(e), self.path.clone())
        } else {
            e
        }
    }
}

fn work(ctx: &Ctx<'_>, graph: &Graph, i: NodeIndex, file: &NodeLog) -> Result<Outputs, ExecError> {
    let n = &graph.g[i];
    let mut out = Outputs::default();
    let log_line = |l: &str| {
        file.line(l);
        if let Some(o) = ctx.obs {
            o.log(&n.id, l)
        }
    };
    let log = LogSink::new(&log_line);
    match (&n.nid, &n.work) {
        (NodeId::Source(_), _) => {}
        (NodeId::Fragment { box_name, candy }, Work::Fragment { index, steps }) => {
            let f = fragment(ctx, box_name, candy, *index, steps)?;
            out.files
                .insert(outputs::TEXT.into(), Out::Bytes(f.text.into_bytes()));
            for (path, bytes) in f.files {
                out.files.insert(outputs::file(&path), Out::Bytes(bytes));
            }
        }
        (NodeId::Containerfile { box_name, prebuilt }, _) => {
            work_containerfile(ctx, graph, box_name, *prebuilt, &mut out)?
        }
        (
            NodeId::BuilderStage {
                candy,
                builder,
                image_box,
                ..
            },
            Work::BuilderStage { user, for_box },
        ) => {
            let b = rbox(ctx, for_box)?;
            ensure_dep_images(ctx, graph, i)?;
            let req = crate::stage::stage_request(
                ctx,
                b,
                candy,
                builder,
                image_box,
                user,
                &n.id,
                &n.key.to_hex(),
            )?;
            let scratch = scratch_dir(ctx, &n.key.to_hex())?;
            let tar = scratch.path().join(outputs::ARTIFACT_TAR);
            ctx.runner(&n.id)?.build_stage(&StageRequest {
                out: tar.clone(),
                log,
                ..req
            })?;
            out.files
                .insert(outputs::ARTIFACT_TAR.into(), Out::File(tar));
            out.keep.push(scratch);
        }
        (NodeId::LocalPkg { candy, format, .. }, Work::LocalPkg { for_box }) => {
            let b = rbox(ctx, for_box)?;
            ensure_dep_images(ctx, graph, i)?;
            work_local_pkg(ctx, n, b, candy, format, log, &mut out)?
        }
        (NodeId::Rootfs { box_name }, Work::Rootfs { builder }) => {
            let b = rbox(ctx, box_name)?;
            let req = crate::stage::rootfs_request(ctx, b, builder, &n.id, &n.key.to_hex())?;
            let scratch = scratch_dir(ctx, &n.key.to_hex())?;
            let req = RootfsRequest {
                out: scratch.path().join(outputs::ROOTFS_TAR),
                log,
                ..req
            };
            ctx.runner(&n.id)?.build_rootfs(&req)?;
            layers::store_rootfs(ctx, &req.out, &mut out)?;
            out.keep.push(scratch);
        }
        (NodeId::Image { .. }, _) => layers::work_image(ctx, graph, i, &mut out)?,
        (NodeId::Layer { .. }, _) => {
            let scratch = scratch_dir(ctx, &n.key.to_hex())?;
            layers::work_layer(ctx, graph, i, scratch.path(), log, &mut out)?;
            out.keep.push(scratch);
        }
        (NodeId::Base { reference }, _) => {
            let scratch = scratch_dir(ctx, &n.key.to_hex())?;
            layers::work_base(ctx, &n.id, reference, scratch.path(), &mut out)?;
            out.keep.push(scratch);
        }
        (NodeId::Plan { box_name, target }, _) => {
            let b = rbox(ctx, box_name)?;
            let ctxh = charly_rules::plan::HostContext {
                target: *target,
                ..Default::default()
            };
            let plan = charly_rules::plan::build_merged_plan(ctx.project, b, &ctxh, &[])?;
            let json =
                serde_json::to_vec_pretty(&plan).map_err(|e| ExecError::Io(e.to_string()))?;
            out.files.insert("plan.json".into(), Out::Bytes(json));
        }
        _ => {
            return Err(ExecError::Io(format!(
                "{}: its work does not fit its id",
                n.id
            )));
        }
    }
    Ok(out)
}

/// A box's build directory: its fragments (read from the store) assembled.
fn work_containerfile(
    ctx: &Ctx<'_>,
    graph: &Graph,
    box_name: &str,
    prebuilt: bool,
    out: &mut Outputs,
) -> Result<(), ExecError> {
    let b = rbox(ctx, box_name)?;
    let opts = emit_options(ctx, b, prebuilt);
    let mut fragments = Vec::new();
    for k in &b.candies {
        let Some(fi) = graph.index(&NodeId::fragment(box_name, k)) else {
            continue;
        };
        let fnode = &graph.g[fi];
        // Every output of the fragment is read here, each blob fetched
        // (and a missing one a miss): no key inputs, no blob lookups up
        // front.
        let (text, files) = read_node_by(ctx, graph, fi, Store::read_record, |rec| {
            let text = String::from_utf8_lossy(&record_output(ctx, fnode, rec, outputs::TEXT)?)
                .into_owned();
            let mut files = BTreeMap::new();
            for name in rec.outputs.keys() {
                if let Some(path) = outputs::file_path(name) {
                    files.insert(path.to_string(), record_output(ctx, fnode, rec, name)?);
                }
            }
            Ok((text, files))
        })?;
        fragments.push(Fragment {
            candy: k.clone(),
            text,
            files,
        });
    }
    let d = assemble(ctx.project, b, &fragments, &opts)?;
    out.files.insert(
        outputs::file(&format!("{}/Containerfile", d.dir)),
        Out::Bytes(d.containerfile.into_bytes()),
    );
    for (path, staged) in d.files {
        let bytes = match staged {
            Staged::Bytes(b) => b,
            Staged::CopyOf(src) => std::fs::read(&src).map_err(io(src.display()))?,
        };
        out.files.insert(outputs::file(&path), Out::Bytes(bytes));
    }
    out.meta = outputs::write_meta(&ContainerfileMeta {
        dir: d.dir.clone(),
        layers: d.layers.keys().cloned().collect(),
    });
    Ok(())
}

/// A local package built by the runner for box `b`'s distro: every
/// package file it made.
fn work_local_pkg(
    ctx: &Ctx<'_>,
    n: &Node,
    b: &ResolvedBox,
    candy: &str,
    format: &str,
    log: LogSink<'_>,
    out: &mut Outputs,
) -> Result<(), ExecError> {
    let req = crate::stage::local_pkg_request(ctx, b, candy, format, &n.id, &n.key.to_hex())?;
    let scratch = scratch_dir(ctx, &n.key.to_hex())?;
    let req = LocalPkgRequest {
        out: scratch.path().join("pkgs"),
        log,
        ..req
    };
    std::fs::create_dir_all(&req.out).map_err(io("pkgs dir"))?;
    ctx.runner(&n.id)?.build_local_pkg(&req)?;
    let mut entries: Vec<PathBuf> = std::fs::read_dir(&req.out)
        .map_err(io(req.out.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    entries.sort();
    if entries.is_empty() {
        return Err(ExecError::Io(format!(
            "{}: the build produced no {} package",
            n.id, req.glob
        )));
    }
    for p in entries {
        let name = p
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        out.files.insert(
            outputs::pkg(&name),
            Out::Bytes(std::fs::read(&p).map_err(io(p.display()))?),
        );
    }
    Ok(())
}

/// The images node `i` runs in, present in the runner.
fn ensure_dep_images(ctx: &Ctx<'_>, graph: &Graph, i: NodeIndex) -> Result<(), ExecError> {
    for d in graph.deps(i) {
        if graph.g[d].kind == NodeKind::Image {
            layers::ensure_image(ctx, graph, d)?;
        }
    }
    Ok(())
}

/// A scratch directory for a node run (inside the store's filesystem, so
/// blobs move without crossing devices; in the process's own scratch
/// directory, so a kill leaves nothing behind for long).
fn scratch_dir(ctx: &Ctx<'_>, key: &str) -> Result<tempfile::TempDir, ExecError> {
    let base = ctx.store.scratch_dir();
    tempfile::Builder::new()
        .prefix(&format!("{}-", &key[..12.min(key.len())]))
        .tempdir_in(base)
        .map_err(io("scratch dir"))
}

/// Writes the build directory of the Containerfile node `i` under `root`
/// from the store (skipped when the directory already holds this key).
/// Returns the directory, project-relative. An output that fails
/// verification makes the node run again ([`read_node`]).
pub fn materialize(
    ctx: &Ctx<'_>,
    graph: &Graph,
    i: NodeIndex,
    root: &Path,
) -> Result<String, ExecError> {
    materialize_locked(ctx, graph, i, root).map(|(dir, _lock)| dir)
}

/// Removes the temp files killed writers left in the shared parts of an
/// output root: the layer copies and the root itself (ignore files); once
/// per command, before its build directories are written.
pub fn sweep_shared(root: &Path) {
    if let Ok(froot) = charly_files::fsroot::Root::create(root) {
        let _ = froot.sweep_temps(Path::new(naming::LAYERS_DIR), true);
        let _ = froot.sweep_temps(Path::new(""), false);
    }
}

/// The lock file of a box's build directory: `.build/.locks/<box>` for
/// `.build/<box>` (outside the directory, so pruning never meets it).
fn box_lock_rel(dir: &str) -> Result<PathBuf, ExecError> {
    let rel = Path::new(dir);
    charly_files::fsroot::check_rel(rel).map_err(io("build directory"))?;
    let name = rel.file_name().unwrap_or_default();
    let parent = rel.parent().unwrap_or(Path::new(""));
    Ok(parent.join(".locks").join(name))
}

/// [`materialize`], returning the lock of the box's directory: concurrent
/// charly processes (and boxes) writing or building the same directory wait
/// for each other instead of failing, and podman reads a directory nobody
/// is rewriting while the lock is held. Temp files a killed writer left in
/// the box's directory are removed when it is rewritten.
pub fn materialize_locked(
    ctx: &Ctx<'_>,
    graph: &Graph,
    i: NodeIndex,
    root: &Path,
) -> Result<(String, std::fs::File), ExecError> {
    let cf = &graph.g[i];
    // A build directory that is as the record says needs none of its
    // blobs; one that is not gets each from the store.
    read_node_by(ctx, graph, i, Store::read_record, |rec| {
        materialize_record(ctx, cf, rec, root)
    })
}

fn materialize_record(
    ctx: &Ctx<'_>,
    cf: &Node,
    rec: &Record,
    root: &Path,
) -> Result<(String, std::fs::File), ExecError> {
    let meta: ContainerfileMeta = outputs::read_meta(&rec.meta);
    let dir = meta.dir;
    let lock_rel = box_lock_rel(&dir)?;
    let froot = charly_files::fsroot::Root::create(root).map_err(io(root.display()))?;
    let lock = froot
        .lock(&lock_rel, || {
            eprintln!(
                "charly: waiting for another charly on {}",
                root.join(&dir).display()
            );
        })
        .map_err(io(lock_rel.display()))?;
    let t = crate::timings::phase("write: verify");
    let marker_rel = Path::new(&dir).join(KEY_MARKER);
    let marker = root.join(&marker_rel);
    let key = cf.key.to_hex();
    // The marker alone is not trusted: every file must still hold what the
    // record says (a hand edit of a generated file is undone). A file
    // that does is not fetched from the store nor written again: an edit
    // to one candy changes a file or two of each box it is in.
    //
    // A directory that verifies is not searched for temp files: the marker
    // goes before a rewrite starts and comes back as its last rename, so a
    // writer killed in between leaves no marker, and its directory is
    // rewritten (its temp files pruned) on the next run. (Searching cost
    // ~half of writing 1,000 build directories that were all in place.)
    let containerfile = format!("{dir}/Containerfile");
    let files: Vec<(&str, &Output)> = rec
        .outputs
        .iter()
        .filter_map(|(name, o)| outputs::file_path(name).map(|path| (path, o)))
        .collect();
    let holds = |p: &Path, o: &Output| {
        ctx.hasher
            .regular_file(p)
            .is_ok_and(|f| f.is_some_and(|(size, d)| size == o.size && d == o.digest))
    };
    // Each file is checked once: the answers decide whether the directory
    // is in place, and otherwise which files the rewrite keeps.
    let held: Vec<bool> = files
        .iter()
        .map(|(path, o)| holds(&root.join(path), o))
        .collect();
    if std::fs::read_to_string(&marker).is_ok_and(|k| k.trim() == key)
        && root.join(&containerfile).is_file()
        && held.iter().all(|h| *h)
    {
        return Ok((dir, lock));
    }
    // Kept through the rewrite: files in place as regular files under real
    // directories (one reached through a symlink would be pruned away with
    // the link).
    let base = root.join(&dir);
    let mut real_dirs: HashMap<PathBuf, bool> = HashMap::new();
    let mut no_links = |p: &Path| {
        p.ancestors().skip(1).take_while(|a| *a != base).all(|a| {
            *real_dirs
                .entry(a.to_path_buf())
                .or_insert_with(|| std::fs::symlink_metadata(a).is_ok_and(|m| m.is_dir()))
        })
    };
    let in_place: BTreeSet<String> = files
        .iter()
        .zip(&held)
        .filter(|((path, _), held)| **held && *path != containerfile && no_links(&root.join(path)))
        .map(|((path, _), _)| path.to_string())
        .collect();
    drop(t);
    // Temp files of killed writers in the box's directory go with the
    // rewrite's prune (the shared ones: [`sweep_shared`]); live writers
    // keep theirs.
    froot.remove(&marker_rel).map_err(io(marker.display()))?;
    let mut d = charly_rules::emit::BuildDir {
        dir: dir.clone(),
        ..Default::default()
    };
    for (name, o) in &rec.outputs {
        let Some(path) = outputs::file_path(name) else {
            continue;
        };
        if in_place.contains(path) {
            continue;
        }
        let bytes = ctx
            .store
            .get_blob(&o.digest)?
            .ok_or_else(|| ExecError::MissingOutput {
                node: cf.id.clone(),
                output: name.clone(),
            })?;
        if path == containerfile {
            d.containerfile = String::from_utf8_lossy(&bytes).into_owned();
        } else {
            d.files
                .insert(path.to_string(), Staged::Bytes(bytes.into_vec()));
        }
    }
    // Candy directories outside the project are copied in fresh.
    {
        for l in &meta.layers {
            let name = naming::layer_candy(l);
            if let Some(c) = ctx
                .project
                .candies
                .values()
                .find(|c| c.name == name && c.rel_dir.is_none())
            {
                d.layers.insert(l.to_string(), c.dir.clone());
            }
        }
    }
    crate::generate::write_keeping(root, &d, &in_place)
        .map_err(|e| ExecError::Io(e.to_string()))?;
    froot
        .write_output_if_changed(&marker_rel, key.as_bytes())
        .map_err(io(marker.display()))?;
    Ok((dir, lock))
}
