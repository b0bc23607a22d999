//! What a box's layers are: the chain's text and the emitter options it is
//! rendered with. A box's chain is its base (the parent box's image, an
//! external image taken into the store layer by layer, or nothing under a
//! bootstrapped root filesystem), a setup layer on non-box bases, one layer
//! per candy in the box's (global) order, and an init layer when its
//! services need one (`Builder::layer_chain`). Each layer's text is
//! rendered by [`layer_containerfile`] without the box's name in it, and
//! its key covers its parent's key by role (`parent`), so sibling boxes
//! with a common candy prefix get the same keys and the graph merges their
//! layers into one node: built once, stored once. Building them is
//! `exec::layers`.

use super::{Graph, GraphOptions, OciSteps};
use crate::id::LayerSlot;
use crate::id::NodeId;
use charly_rules::emit::EmitError;
use charly_rules::emit::EmitOptions;
use charly_rules::emit::containerfile::{LAYER_DIR, LayerPart, LayerText, layer_containerfile};
use charly_rules::load::Project;
use charly_rules::naming;
use charly_rules::resolve::{Resolution, ResolvedBox};
use petgraph::stable_graph::NodeIndex;

/// The emitter options of a box's layers: `base` (image references,
/// `--dev-local-pkg`) with builder stages as prebuilt artifact tars under
/// [`LAYER_DIR`].
pub fn emit_options(base: &EmitOptions, p: &Project, b: &ResolvedBox) -> EmitOptions {
    let mut o = base.clone();
    o.dir = Some(LAYER_DIR.to_string());
    for stage in prebuilt_stages(p, b) {
        o.artifacts.insert(stage.clone(), artifact_path(&stage));
    }
    o
}

/// The builder stages of a box that run as their own nodes (and reach its
/// image as artifact tars): every candy of a non-inline builder with a
/// stage template and a builder box.
pub fn prebuilt_stages(p: &Project, b: &ResolvedBox) -> Vec<String> {
    let vocab = &p.ns(b.ns).vocab;
    let mut out = Vec::new();
    for u in &b.builders {
        let Some(def) = vocab.builder.get(&u.builder) else {
            continue;
        };
        if def.inline || def.stage_template.is_none() || u.image.is_none() {
            continue;
        }
        for k in &u.candies {
            out.push(naming::stage_name(&p.candies[k].name, &u.builder));
        }
    }
    out
}

/// Where a builder stage's artifact tar sits in a layer's context.
pub(crate) fn artifact_path(stage: &str) -> String {
    format!("{LAYER_DIR}/_artifacts/{stage}.tar")
}

/// The emitter options of a run: every box's image reference,
/// `--dev-local-pkg` and the plugins' fragments (what `Engine::ctx` gives nodes, and what the graph
/// keys layers and images with).
pub fn base_emit_options(r: &Resolution, opts: &GraphOptions) -> EmitOptions {
    EmitOptions {
        dev_local_pkg: opts.dev_local_pkg,
        image_refs: naming::box_image_refs(r),
        plugin_fragments: opts.plugins.fragments.clone(),
        deploy_only_plugins: opts.plugins.deploy_only.clone(),
        ..EmitOptions::default()
    }
}

/// Renders layer `slot` of box `b` (a candy layer with its plan's
/// `steps`) with the run's options `base` (`None`: empty for this box).
pub fn render(
    p: &Project,
    b: &ResolvedBox,
    slot: &LayerSlot,
    steps: Option<&OciSteps>,
    base: &EmitOptions,
) -> Result<Option<LayerText>, EmitError> {
    let part = match (slot, steps) {
        (LayerSlot::Setup, _) => LayerPart::Setup,
        (LayerSlot::Init, _) => LayerPart::Init,
        (LayerSlot::Candy(key), Some(steps)) => LayerPart::Candy { key, steps },
        (LayerSlot::Candy(key), None) => {
            return Err(EmitError {
                box_name: b.name.clone(),
                message: format!("the layer of candy {key} has no plan"),
            });
        }
    };
    layer_containerfile(p, b, part, &emit_options(base, p, b))
}

/// Whether a box's chain ends with an init layer.
pub fn has_init(p: &Project, b: &ResolvedBox) -> bool {
    layer_containerfile(p, b, LayerPart::Init, &EmitOptions::default()).is_ok_and(|t| t.is_some())
}

/// The node id of a box's image (for callers that hold box names).
pub fn image_node(graph: &Graph, box_name: &str) -> Option<NodeIndex> {
    graph.index(&NodeId::image(box_name))
}
