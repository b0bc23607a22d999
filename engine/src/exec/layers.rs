//! Building a box's layers and assembling its image: a box image is a
//! chain of layer nodes (what the chain is: `graph::layers`), assembled,
//! never built whole.
//!
//! Building a layer ([`work_layer`]): the parent is made present in the
//! runner (loaded from the store when it is not there), the layer's context
//! is put together in a scratch directory (candy directory, staged files,
//! builder artifacts, local packages, root filesystem), and the runner
//! builds it squashed onto the parent and exports only the new layer blob
//! and the configuration after it. The record's `meta` ([`LayerMeta`])
//! carries the whole chain up to it, so one record describes the image it
//! tops.
//!
//! An image node ([`work_image`]) assembles config and manifest from its
//! top layer's record ([`crate::oci::assemble`]): no runner call. Its
//! record names every chain blob as an output, so GC roots and remote
//! caches keep and move the layers with it (stored once: blobs are content
//! addressed). It is loaded into the runner when it is assembled, and
//! later only when something needs it there ([`ensure_image`]): a no-op
//! build calls no runner at all.

use super::{Ctx, ExecError, Out, Outputs, read_node};
use crate::graph::layers::{artifact_path, render};
use crate::graph::{Graph, Work};
use crate::id::NodeId;
use crate::key::NodeKind;
use crate::outputs::{self, ImageMeta, LayerDesc, LayerMeta};
use crate::runners::LayerRequest;
use charly_cache::{BlobDigest, Output, Record};
use charly_rules::emit::Staged;
use charly_rules::emit::containerfile::{LAYER_DIR, LayerText};
use charly_rules::naming;
use charly_rules::resolve::{BaseRef, ResolvedBox};
use petgraph::stable_graph::NodeIndex;
use std::collections::BTreeMap;
use std::path::Path;
fn io(what: impl std::fmt::Display) -> impl Fn(std::io::Error) -> ExecError {
    move |e| ExecError::Io(format!("{what}: {e}"))
}

/// The runner's tag of the image a layer (base, root filesystem) tops,
/// named by its content — its chain's digests and its configuration — not
/// by its key: two stores may hold different bytes under one key (a
/// bootstrap is not reproducible), and charly processes with different
/// stores share one podman storage.
pub fn content_tag(chain: &[LayerDesc], config: &serde_json::Value) -> String {
    let mut h = blake3::Hasher::new();
    for l in chain {
        h.update(l.digest.as_bytes());
        h.update(b"\0");
        h.update(l.diff_id.as_bytes());
        h.update(b"\n");
    }
    h.update(config.to_string().as_bytes());
    format!("localhost/charly-layer:{}", &h.finalize().to_hex()[..32])
}

/// The runner's content tag of an assembled image (its id is its config's
/// digest), beside the box's own tag, which another store's build of the
/// same box may take over.
fn image_content_tag(id: &str) -> String {
    let hex = id.trim_start_matches("sha256:");
    format!("localhost/charly-image:{}", &hex[..32.min(hex.len())])
}

/// The chain, configuration and runner tag of the image a layer, base or
/// image node's record describes.
fn chain_of(rec: &Record) -> LayerMeta {
    if NodeKind::of_record(rec) == Some(NodeKind::Image) {
        let m: ImageMeta = outputs::read_meta(&rec.meta);
        LayerMeta {
            tag: m.tag,
            ..m.layers
        }
    } else {
        outputs::read_meta(&rec.meta)
    }
}

fn missing(node: &str, output: &str) -> ExecError {
    ExecError::MissingOutput {
        node: node.into(),
        output: output.into(),
    }
}

/// Writes the image a layer, base or image record describes into the OCI
/// layout at `dir` under `reference`, blobs from the store.
fn write_layout(
    ctx: &Ctx<'_>,
    node: &str,
    meta: &LayerMeta,
    image: &crate::oci::Assembled,
    dir: &Path,
    reference: &str,
    standins: bool,
) -> Result<crate::oci::Exported, ExecError> {
    let fetch = |l: &LayerDesc, dest: &Path| -> Result<bool, crate::oci::OciError> {
        if standins {
            std::fs::write(dest, b"").map_err(|e| crate::oci::OciError::Io(e.to_string()))?;
            return Ok(false);
        }
        let d: BlobDigest = l
            .blob
            .parse()
            .map_err(|e| crate::oci::OciError::Format(format!("{}: {e}", l.digest)))?;
        match ctx.store.copy_blob_to(&d, dest) {
            Ok(true) => Ok(true),
            Ok(false) => Err(crate::oci::OciError::Io(format!(
                "layer {} of {node} is missing from the store",
                l.digest
            ))),
            Err(e) => Err(crate::oci::OciError::Io(e.to_string())),
        }
    };
    crate::oci::write_image(dir, reference, image, &meta.chain, &fetch).map_err(|e| match e {
        crate::oci::OciError::Io(m) if m.contains("missing from the store") => {
            missing(node, outputs::LAYER)
        }
        e => ExecError::Io(format!("{node}: {e}")),
    })
}

/// Loads the image described by `meta` into the runner as `tag`.
fn load(ctx: &Ctx<'_>, node: &str, meta: &LayerMeta, tag: &str) -> Result<String, ExecError> {
    let image = crate::oci::assemble(&meta.chain, &meta.config, &BTreeMap::new(), None, &ctx.arch)
        .map_err(|e| ExecError::Io(format!("{node}: {e}")))?;
    load_assembled(ctx, node, meta, &image, &[tag.to_string()], false)
}

fn load_assembled(
    ctx: &Ctx<'_>,
    node: &str,
    meta: &LayerMeta,
    image: &crate::oci::Assembled,
    tags: &[String],
    standins: bool,
) -> Result<String, ExecError> {
    // podman names an image loaded from a layout after the layout's path,
    // which must therefore be a valid image name: a per-call directory in
    // the store's scratch directory when its path is one, else in a scratch
    // directory of this user's under the first temp directory whose path
    // is. Either way the next charly removes what a killed one left.
    let store_scratch = ctx.store.scratch_dir().to_path_buf();
    let mut scratch = None;
    let base = if name_safe(&store_scratch) {
        store_scratch
    } else {
        let uid = rustix::process::geteuid().as_raw();
        let found = [
            std::env::temp_dir(),
            std::path::PathBuf::from("/var/tmp"),
            std::path::PathBuf::from("/tmp"),
        ]
        .into_iter()
        .filter(|d| name_safe(d))
        .find_map(|d| charly_cache::Scratch::open(&d.join(format!("charly-scratch-{uid}"))).ok())
        .ok_or_else(|| {
            ExecError::Io("no directory with a lowercase path to load images from".into())
        })?;
        scratch.insert(found).dir().to_path_buf()
    };
    let dir = base.join(format!(
        "load-{}-{}",
        &image.digest().as_str()[7..19],
        unique_suffix()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let res = (|| {
        write_layout(ctx, node, meta, image, &dir, "charly", standins)?;
        Ok(ctx.runner(node)?.load_layout(&dir, "charly", tags)?)
    })();
    let _ = std::fs::remove_dir_all(&dir);
    drop(scratch);
    res
}

/// `<pid>-<n>`: unique among this host's processes and among the calls of
/// this one (two nodes, or two engines in one process, may load or build the
/// same content at once).
fn unique_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Whether every component of an absolute path is a valid image-name
/// component (`[a-z0-9]+` joined by `.`, `_`, `__` or dashes).
fn name_safe(p: &Path) -> bool {
    let Ok(p) = std::fs::canonicalize(p) else {
        return false;
    };
    p.components().skip(1).all(|c| {
        let s = c.as_os_str().to_string_lossy();
        let b = s.as_bytes();
        let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
        !b.is_empty()
            && alnum(b[0])
            && alnum(b[b.len() - 1])
            && b.iter()
                .all(|c| alnum(*c) || matches!(c, b'.' | b'_' | b'-'))
            && !s.contains("..")
            && !s.contains("___")
            && !s.contains("._")
            && !s.contains("_.")
    })
}

/// Makes the image that the layer, base or image node `i` tops present in
/// the runner (loading it from the store when the runner lacks it) and
/// returns its tag there. A box image also gets the box's reference,
/// taken from whatever image had it.
pub fn ensure_image(ctx: &Ctx<'_>, graph: &Graph, i: NodeIndex) -> Result<String, ExecError> {
    present_image(ctx, graph, i, true).map(|t| t.unwrap_or_default())
}

/// After a build: box image node `i`'s reference names the image of the
/// key just reported. When the runner has that image, the reference is
/// moved onto it if it names another (an image built before a revert);
/// when it lacks it, it is loaded from the store if `load`, or if the
/// reference names another image (never left stale). Returns the image's
/// tag in the runner, or `None` when it was left in the store only.
pub fn name_image(
    ctx: &Ctx<'_>,
    graph: &Graph,
    i: NodeIndex,
    load: bool,
) -> Result<Option<String>, ExecError> {
    present_image(ctx, graph, i, load)
}

fn present_image(
    ctx: &Ctx<'_>,
    graph: &Graph,
    i: NodeIndex,
    load_missing: bool,
) -> Result<Option<String>, ExecError> {
    let n = &graph.g[i];
    read_node(ctx, graph, i, |rec| {
        let meta = chain_of(rec);
        let runner = ctx.runner(&n.id)?;
        if n.kind == NodeKind::Image {
            let image = crate::oci::Assembled {
                config: record_bytes(ctx, &n.id, rec, outputs::CONFIG)?,
                manifest: record_bytes(ctx, &n.id, rec, outputs::MANIFEST)?,
            };
            let tag = image_content_tag(image.id().as_str());
            // Both names must be there, and the box's must name this image:
            // it may have been removed while the content tag kept the image
            // (`podman rmi REF` only untags an image that has another name),
            // or name the image of other keys (built before a revert).
            if !runner.has_image(&tag) {
                let stale = !meta.tag.is_empty() && runner.has_image(&meta.tag);
                if !load_missing && !stale {
                    return Ok(None);
                }
                load_assembled(
                    ctx,
                    &n.id,
                    &meta,
                    &image,
                    &[meta.tag.clone(), tag.clone()],
                    false,
                )?;
            } else if !meta.tag.is_empty() {
                match (runner.image_id(&tag), runner.image_id(&meta.tag)) {
                    // The reference names another image: moved onto this one.
                    (Some(id), named) if named.as_deref() != Some(id.as_str()) => {
                        runner.tag_image(&tag, std::slice::from_ref(&meta.tag))?;
                    }
                    // A runner that cannot tell ids: the reference is made
                    // when it is missing.
                    (None, _) if !runner.has_image(&meta.tag) => {
                        load_assembled(
                            ctx,
                            &n.id,
                            &meta,
                            &image,
                            &[meta.tag.clone(), tag.clone()],
                            false,
                        )?;
                    }
                    _ => {}
                }
            }
            return Ok(Some(tag));
        }
        let tag = match &n.nid {
            NodeId::Base { reference } => reference.clone(),
            _ => content_tag(&meta.chain, &meta.config),
        };
        if !runner.has_image(&tag) {
            if !load_missing {
                return Ok(None);
            }
            load(ctx, &n.id, &meta, &tag)?;
        }
        Ok(Some(tag))
    })
}

/// Whether box image node `i`'s image says what to run (a `Cmd` or an
/// `Entrypoint` in its configuration); `podman run IMAGE` fails without.
pub fn image_has_command(ctx: &Ctx<'_>, graph: &Graph, i: NodeIndex) -> Result<bool, ExecError> {
    let n = &graph.g[i];
    read_node(ctx, graph, i, |rec| {
        let config = record_bytes(ctx, &n.id, rec, outputs::CONFIG)?;
        let v: serde_json::Value = serde_json::from_slice(&config).unwrap_or_default();
        let set = |k: &str| v["config"][k].as_array().is_some_and(|a| !a.is_empty());
        Ok(set("Cmd") || set("Entrypoint"))
    })
}

fn record_bytes(ctx: &Ctx<'_>, node: &str, rec: &Record, name: &str) -> Result<Vec<u8>, ExecError> {
    let o = rec.outputs.get(name).ok_or_else(|| missing(node, name))?;
    ctx.store
        .get_blob(&o.digest)?
        .map(Vec::from)
        .ok_or_else(|| missing(node, name))
}

/// Stores a runner's layer file and describes it with its store digest.
fn store_layer(
    ctx: &Ctx<'_>,
    f: &crate::runners::LayerFile,
) -> Result<(LayerDesc, Output), ExecError> {
    let (digest, size) = ctx.store.put_blob_file(&f.path)?;
    let mut desc = f.desc.clone();
    desc.blob = digest.to_hex();
    desc.size = size;
    Ok((
        desc,
        Output {
            digest,
            size,
            mode: 0o644,
        },
    ))
}

fn rbox<'a>(ctx: &Ctx<'a>, name: &str) -> Result<&'a ResolvedBox, ExecError> {
    ctx.resolution
        .get(name)
        .ok_or_else(|| ExecError::Io(format!("box {name} does not resolve")))
}

/// Takes an external base image into the store, layer by layer.
pub fn work_base(
    ctx: &Ctx<'_>,
    node: &str,
    reference: &str,
    scratch: &Path,
    out: &mut Outputs,
) -> Result<(), ExecError> {
    let img = ctx.runner(node)?.export_layers(reference, scratch)?;
    let mut chain = Vec::new();
    for (n, f) in img.layers.iter().enumerate() {
        let (desc, o) = store_layer(ctx, f)?;
        out.files.insert(outputs::chain_layer(n), Out::Stored(o));
        chain.push(desc);
    }
    out.meta = outputs::write_meta(&LayerMeta {
        chain,
        config: img.config,
        tag: reference.to_string(),
    });
    Ok(())
}

/// Stores a bootstrapped root filesystem (a tar, gzip-compressed or not)
/// as the first layer of its chain.
pub fn store_rootfs(ctx: &Ctx<'_>, tar: &Path, out: &mut Outputs) -> Result<(), ExecError> {
    let digest = crate::oci::sha256_file(tar).map_err(io(tar.display()))?;
    let gz = {
        use std::io::Read;
        let mut magic = [0u8; 2];
        let mut f = std::fs::File::open(tar).map_err(io(tar.display()))?;
        f.read_exact(&mut magic).is_ok() && magic == [0x1f, 0x8b]
    };
    let (diff_id, media_type) = if gz {
        let f = std::fs::File::open(tar).map_err(io(tar.display()))?;
        let d = flate2::read::MultiGzDecoder::new(std::io::BufReader::new(f));
        let diff_id = crate::oci::sha256_reader(d).map_err(io(tar.display()))?;
        (diff_id.as_str().to_string(), crate::oci::LAYER_GZIP)
    } else {
        (digest.as_str().to_string(), crate::oci::LAYER_TAR)
    };
    let (desc, o) = store_layer(
        ctx,
        &crate::runners::LayerFile {
            path: tar.to_path_buf(),
            desc: LayerDesc {
                digest: digest.as_str().to_string(),
                diff_id,
                size: 0,
                media_type: media_type.into(),
                blob: String::new(),
            },
        },
    )?;
    out.files.insert(outputs::ROOTFS_TAR.into(), Out::Stored(o));
    out.meta = outputs::write_meta(&LayerMeta {
        chain: vec![desc],
        config: serde_json::json!({}),
        tag: String::new(),
    });
    Ok(())
}

/// Builds one layer on its parent (see the module docs).
pub fn work_layer(
    ctx: &Ctx<'_>,
    graph: &Graph,
    i: NodeIndex,
    scratch: &Path,
    log: crate::runners::LogSink<'_>,
    out: &mut Outputs,
) -> Result<(), ExecError> {
    let n = &graph.g[i];
    let (NodeId::Layer { box_name, slot }, Work::Layer { steps, parent }) = (&n.nid, &n.work)
    else {
        return Ok(());
    };
    let b = rbox(ctx, box_name)?;
    let Some(text) = render(ctx.project, b, slot, steps.as_ref(), &ctx.emit)? else {
        return Err(ExecError::Io(format!("{}: the layer is empty", n.id)));
    };
    let runner = ctx.runner(&n.id)?;
    let parent_index = match parent {
        Some(pid) => Some(
            graph
                .index(pid)
                .ok_or_else(|| ExecError::Io(format!("{pid} is not in the graph")))?,
        ),
        None => None,
    };
    let below = match parent_index {
        Some(pi) => read_node(ctx, graph, pi, |rec| Ok(chain_of(rec)))?,
        None => LayerMeta::default(),
    };
    // The parent: present in the runner, or as its blobs for a runner that
    // builds layers from them (loaded only if it falls back to a local
    // build).
    let mut parent_blobs = Vec::new();
    let parent_tag = match parent_index {
        Some(pi) if !runner.layers_from_blobs() => Some(ensure_image(ctx, graph, pi)?),
        Some(_) => {
            let dir = scratch.join("parent");
            std::fs::create_dir_all(&dir).map_err(io(dir.display()))?;
            for (k, l) in below.chain.iter().enumerate() {
                let dest = dir.join(format!("{k}.tar"));
                let d: BlobDigest = l
                    .blob
                    .parse()
                    .map_err(|e| ExecError::Io(format!("{}: {e}", l.digest)))?;
                if !ctx.store.copy_blob_to(&d, &dest)? {
                    return Err(missing(&n.id, outputs::LAYER));
                }
                parent_blobs.push(dest);
            }
            None
        }
        None => None,
    };
    let load_parent = || -> Result<Option<String>, crate::runners::RunError> {
        match parent_index {
            Some(pi) => ensure_image(ctx, graph, pi)
                .map(Some)
                .map_err(|e| crate::runners::RunError::new(e.to_string())),
            None => Ok(None),
        }
    };
    // Other images the layer reads (inline builders' images).
    for d in graph.deps(i) {
        if graph.g[d].kind == NodeKind::Image && Some(&graph.g[d].nid) != parent.as_ref() {
            ensure_image(ctx, graph, d)?;
        }
    }
    let context = scratch.join("context");
    write_context(ctx, graph, i, &text, &context)?;
    let cf = scratch.join("Containerfile");
    std::fs::write(&cf, &text.containerfile).map_err(io(cf.display()))?;
    let key = n.key.to_hex();
    // Built under a name of this run; named by its content once exported.
    let build_tag = format!(
        "localhost/charly-build:{}-{}",
        &key[..32.min(key.len())],
        unique_suffix()
    );
    let mut build_args = BTreeMap::new();
    build_args.insert("TARGETARCH".to_string(), ctx.arch.clone());
    let res = runner.build_layer(&LayerRequest {
        log,
        node: n.id.clone(),
        key,
        context,
        containerfile: cf,
        parent: parent_tag,
        parent_layers: below.chain.clone(),
        parent_blobs,
        parent_config: below.config.clone(),
        load_parent: crate::runners::ParentLoader::new(&load_parent),
        tag: build_tag.clone(),
        build_args,
        out: scratch.join("out"),
    });
    let res = res.map_err(|e| locate_failure(ctx, &text, e))?;
    let mut chain = below.chain;
    if let Some(f) = &res.layer {
        let (desc, o) = store_layer(ctx, f)?;
        out.files.insert(outputs::LAYER.into(), Out::Stored(o));
        chain.push(desc);
    }
    let tag = content_tag(&chain, &res.config);
    if res.in_runner {
        runner.rename_image(&build_tag, &tag)?;
    }
    out.meta = outputs::write_meta(&LayerMeta {
        chain,
        config: res.config,
        tag,
    });
    Ok(())
}

/// A failed layer build, pointed at the candy file: the instruction the
/// builder names, the part of the candy that wrote it.
fn locate_failure(ctx: &Ctx<'_>, text: &LayerText, e: crate::runners::RunError) -> ExecError {
    let at = e
        .step
        .and_then(|(stage, step)| {
            charly_rules::origin::instruction_offset(&text.containerfile, stage, step)
        })
        .and_then(|o| text.origin_at(o))
        .and_then(|o| charly_rules::origin::locate(ctx.project, o, &e.output));
    match at {
        Some(at) => ExecError::Located(Box::new((at, e))),
        None => ExecError::Run(e),
    }
}

/// Puts together a layer's build context: candy directories, staged
/// files, builder artifacts, local packages, the root filesystem.
fn write_context(
    ctx: &Ctx<'_>,
    graph: &Graph,
    i: NodeIndex,
    text: &LayerText,
    dir: &Path,
) -> Result<(), ExecError> {
    std::fs::create_dir_all(dir).map_err(io(dir.display()))?;
    let root = charly_files::fsroot::Root::open(dir).map_err(io(dir.display()))?;
    let prepare = |rel: &str| root.prepare(Path::new(rel)).map_err(io(rel));
    for (rel, src) in &text.dirs {
        crate::generate::copy_dir(src, &prepare(rel)?).map_err(io(src.display()))?;
    }
    for (rel, staged) in &text.files {
        let dest = prepare(rel)?;
        match staged {
            Staged::Bytes(b) => std::fs::write(&dest, b).map_err(io(rel))?,
            Staged::CopyOf(src) => {
                std::fs::copy(src, &dest).map_err(io(src.display()))?;
            }
        }
    }
    for d in graph.deps(i) {
        let dn = &graph.g[d];
        let copy = |name: &str, rel: String| -> Result<(), ExecError> {
            let dest = prepare(&rel)?;
            read_node(ctx, graph, d, |rec| {
                let o = rec.outputs.get(name).ok_or_else(|| missing(&dn.id, name))?;
                if ctx.store.copy_output_to(o, &dest)? {
                    Ok(())
                } else {
                    Err(missing(&dn.id, name))
                }
            })
        };
        match &dn.nid {
            NodeId::BuilderStage { candy, builder, .. } => {
                let stage = naming::stage_name(&ctx.project.candies[candy].name, builder);
                copy(outputs::ARTIFACT_TAR, artifact_path(&stage))?;
            }
            NodeId::LocalPkg { candy, .. } => {
                let rel = format!("{LAYER_DIR}/_localpkg/{}", ctx.project.candies[candy].name);
                read_node(ctx, graph, d, |rec| {
                    for (name, o) in &rec.outputs {
                        if let Some(file) = outputs::pkg_name(name)
                            && !ctx
                                .store
                                .copy_output_to(o, &prepare(&format!("{rel}/{file}"))?)?
                        {
                            return Err(missing(&dn.id, name));
                        }
                    }
                    Ok(())
                })?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// Assembles a box image from its top layer and loads it into the runner.
pub fn work_image(
    ctx: &Ctx<'_>,
    graph: &Graph,
    i: NodeIndex,
    out: &mut Outputs,
) -> Result<(), ExecError> {
    let n = &graph.g[i];
    let NodeId::Image { box_name } = &n.nid else {
        return Ok(());
    };
    let b = rbox(ctx, box_name)?;
    let top = graph
        .deps(i)
        .into_iter()
        .find(|d| {
            matches!(
                graph.g[*d].kind,
                NodeKind::Layer | NodeKind::Image | NodeKind::Base
            )
        })
        .ok_or_else(|| ExecError::Io(format!("{}: no layers", n.id)))?;
    let meta = read_node(ctx, graph, top, |rec| {
        let m = chain_of(rec);
        // Every chain blob must still be there: a damaged one reruns its layer.
        for l in &m.chain {
            let d: BlobDigest = l
                .blob
                .parse()
                .map_err(|_| missing(&graph.g[top].id, &l.digest))?;
            if !ctx.store.has_blob(&d) {
                return Err(missing(&graph.g[top].id, &l.digest));
            }
        }
        Ok(m)
    })?;
    let mut facts = charly_rules::emit::containerfile::image_facts(ctx.project, b, &ctx.emit);
    facts
        .labels
        .insert("ai.opencharly.node-key".into(), n.key.to_hex());
    let image = crate::oci::assemble(
        &meta.chain,
        &meta.config,
        &facts.labels,
        facts.user.as_deref(),
        &ctx.arch,
    )
    .map_err(|e| ExecError::Io(format!("{}: {e}", n.id)))?;
    let tag = naming::box_image_ref(ctx.resolution, box_name);
    out.files
        .insert(outputs::CONFIG.into(), Out::Bytes(image.config.clone()));
    out.files
        .insert(outputs::MANIFEST.into(), Out::Bytes(image.manifest.clone()));
    for (k, l) in meta.chain.iter().enumerate() {
        let digest: BlobDigest = l.blob.parse().map_err(|_| missing(&n.id, &l.digest))?;
        out.files.insert(
            outputs::chain_layer(k),
            Out::Stored(Output {
                digest,
                size: l.size,
                mode: 0o644,
            }),
        );
    }
    // Assembled: the user's runner gets it now (they asked for a build).
    // When the runner has the top layer's image, it has every layer blob:
    // the layout gets empty stand-ins and only the config is new to it.
    if let Some(runner) = ctx.runner {
        let top = content_tag(&meta.chain, &meta.config);
        let has_layers = runner.has_image(&top);
        let tags = [tag.clone(), image_content_tag(image.id().as_str())];
        load_assembled(ctx, &n.id, &meta, &image, &tags, has_layers)?;
    }
    out.meta = outputs::write_meta(&ImageMeta {
        id: image.id().as_str().to_string(),
        tag: tag.clone(),
        base: match &b.base {
            BaseRef::External(x) => x.clone(),
            BaseRef::Box(p) => naming::box_image_ref(ctx.resolution, p),
            BaseRef::Bootstrap { builder, .. } => format!("builder:{builder}"),
        },
        manifest: image.digest().as_str().to_string(),
        layers: LayerMeta {
            chain: meta.chain,
            config: meta.config,
            tag,
        },
    });
    Ok(())
}

/// Writes a built box's image into the OCI layout at `dir` as `reference`.
pub fn export_image(
    ctx: &Ctx<'_>,
    graph: &Graph,
    i: NodeIndex,
    dir: &Path,
    reference: &str,
) -> Result<crate::oci::Exported, ExecError> {
    let n = &graph.g[i];
    read_node(ctx, graph, i, |rec| {
        let m: ImageMeta = outputs::read_meta(&rec.meta);
        let image = crate::oci::Assembled {
            config: record_bytes(ctx, &n.id, rec, outputs::CONFIG)?,
            manifest: record_bytes(ctx, &n.id, rec, outputs::MANIFEST)?,
        };
        write_layout(ctx, &n.id, &m.layers, &image, dir, reference, false)
    })
}

/// Pushes a built box's image to a registry as `tag` (layers the registry
/// has are skipped); returns the bytes sent.
pub fn push_image(
    ctx: &Ctx<'_>,
    graph: &Graph,
    i: NodeIndex,
    remote: &charly_cache::Remote,
    tag: &str,
) -> Result<u64, ExecError> {
    let n = &graph.g[i];
    read_node(ctx, graph, i, |rec| {
        let m: ImageMeta = outputs::read_meta(&rec.meta);
        let config = record_bytes(ctx, &n.id, rec, outputs::CONFIG)?;
        let manifest = record_bytes(ctx, &n.id, rec, outputs::MANIFEST)?;
        let mut layers = Vec::new();
        for l in &m.layers.chain {
            let d: BlobDigest = l.blob.parse().map_err(|_| missing(&n.id, &l.digest))?;
            layers.push((d, l.digest.clone(), l.size));
        }
        Ok(remote.push_image(
            ctx.store,
            tag,
            &charly_cache::ImageUpload {
                layers,
                config: &config,
                manifest: &manifest,
            },
        )?)
    })
}

/// The digests of box image node `i`'s image: its configuration's (the
/// image id podman shows) and its manifest's (what a registry serves it
/// by, and `podman inspect`'s `Digest` of the image charly loaded).
pub fn image_digests(
    ctx: &Ctx<'_>,
    graph: &Graph,
    i: NodeIndex,
) -> Result<(String, String), ExecError> {
    let n = &graph.g[i];
    read_node(ctx, graph, i, |rec| {
        let image = crate::oci::Assembled {
            config: record_bytes(ctx, &n.id, rec, outputs::CONFIG)?,
            manifest: record_bytes(ctx, &n.id, rec, outputs::MANIFEST)?,
        };
        Ok((
            image.id().as_str().to_string(),
            image.digest().as_str().to_string(),
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::name_safe;
    use std::path::Path;

    #[test]
    fn load_directories_must_be_valid_image_names() {
        let t = tempfile::Builder::new()
            .prefix("charly-ok-")
            .tempdir_in("/tmp")
            .expect("tmp");
        let ok = name_safe(t.path());
        let lower = t
            .path()
            .to_string_lossy()
            .bytes()
            .all(|c| !c.is_ascii_uppercase());
        assert_eq!(ok, lower, "{}", t.path().display());
        let bad = tempfile::Builder::new()
            .prefix(".Hidden")
            .tempdir_in("/tmp")
            .expect("tmp");
        assert!(!name_safe(bad.path()));
        assert!(!name_safe(Path::new("/no/such/dir")));
    }
}
