//! The build graph: nodes, edges and keys for a goal over some boxes.
//!
//! Nodes are identified by a [`NodeId`] (its text: `fragment:jupyter/direnv`,
//! `containerfile:jupyter`, `image:fedora`, `builder-stage:cowsay/npm@node-builder`),
//! so a node shared by several boxes (a source, a builder stage, a base
//! image) appears once: diamonds run once. Edges point from a dependency to
//! its dependant. Keys are computed in topological order, sources first (in
//! parallel: they hash files), each node's key including its dependencies'
//! keys, so a change propagates exactly to what is downstream of it. What
//! else enters each kind of node's key is in [`inputs`].

pub mod inputs;
pub mod layers;
pub mod own;

use crate::hash::FileHasher;
use crate::id::{LayerSlot, NodeId, SourceId};
use crate::key::{KeyInputs, NodeKind};
use charly_cache::NodeKey;
use charly_rules::load::Project;
use charly_rules::plan::{CompileContext, HostContext, InstallStep, Target, compile_candy_steps};
use charly_rules::resolve::{BaseRef, Resolution, ResolvedBox, User};
use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use rayon::prelude::*;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// What the graph is built for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Goal {
    /// Build directories (`box generate`).
    Generate,
    /// Images (`box build`).
    Build,
    /// InstallPlans for a target.
    Plan(Target),
}

/// Options that enter keys.
#[derive(Clone, Debug, Default)]
pub struct GraphOptions {
    /// Build local packages from local source.
    pub dev_local_pkg: bool,
    /// The runner's name (images built by different runners never mix).
    pub runner: String,
    /// Target architecture for builds (`amd64`).
    pub arch: String,
    /// What plugins contribute to images (their fragments, and who they
    /// are, which enters the keys of the candies that use them).
    pub plugins: PluginBuild,
}

impl GraphOptions {
    /// The options of a build by the runner named `runner` for `arch`,
    /// with no plugins and no `--dev-local-pkg`.
    pub fn new(runner: impl Into<String>, arch: impl Into<String>) -> GraphOptions {
        GraphOptions {
            dev_local_pkg: false,
            runner: runner.into(),
            arch: arch.into(),
            plugins: PluginBuild::default(),
        }
    }
}

/// The build leg of plugins, as the plugin host answered it before the
/// graph is built (cached by the host, so a no-op starts no plugin).
#[derive(Clone, Debug, Default)]
pub struct PluginBuild {
    /// `(candy key, task index)` → the fragment its plugin emitted.
    pub fragments: BTreeMap<(String, usize), String>,
    /// Words whose plugin emits nothing at build (deploy-only steps).
    pub deploy_only: std::collections::BTreeSet<String>,
    /// Word → the plugin's identity (its executable's digest and its
    /// Describe reply's), a key input of every candy using the word.
    pub ids: BTreeMap<String, String>,
}

/// What a node needs to run beyond its id: the [`NodeId`] says what the
/// node is (its box, candy, builder, format, target, reference), this only
/// what the id does not carry.
#[derive(Clone, Debug)]
pub enum Work {
    /// Nothing: the id is all (sources, build directories, images, plans,
    /// external bases).
    Id,
    /// A fragment.
    Fragment {
        /// Position in the box.
        index: usize,
        /// The candy's plan's steps (target oci, home resolved), shared
        /// with every box that compiles the candy alike; released once the
        /// graph is keyed.
        steps: FragmentSteps,
    },
    /// A builder stage.
    BuilderStage {
        /// The account the artifact is made for (the id names it only
        /// when it is not the default one).
        user: User,
        /// A box that uses it (for its distro/vocabulary).
        for_box: String,
    },
    /// A local package.
    LocalPkg {
        /// Box whose distro builds it.
        for_box: String,
    },
    /// A bootstrapped root filesystem.
    Rootfs {
        /// Builder type.
        builder: String,
    },
    /// A layer of a box image (its id names the box whose facts it renders
    /// with: the first of the boxes sharing it).
    Layer {
        /// A candy layer's plan steps (target oci, home resolved), shared.
        steps: Option<OciSteps>,
        /// The image below (`None`: scratch).
        parent: Option<NodeId>,
    },
}

/// One node.
#[derive(Clone, Debug)]
pub struct Node {
    /// What the node is.
    pub nid: NodeId,
    /// `nid` as text (its `Display`): the stable id keys, records and
    /// reports carry, and the graph's sort order; kept because it is read
    /// on every comparison.
    pub id: String,
    /// Kind.
    pub kind: NodeKind,
    /// Key inputs (filled when the graph is finished), kept packed
    /// ([`KeyInputs::pack`]): they are read only for records and
    /// explanations, and the maps of short strings (or their JSON text)
    /// were the largest part of a large graph's memory ([`Node::inputs`]
    /// reads them back).
    inputs: Box<[u8]>,
    /// The key.
    pub key: NodeKey,
    /// What running it means.
    pub work: Work,
}

impl Node {
    /// The node's key inputs (a node's kind alone before its key is
    /// computed).
    pub fn inputs(&self) -> KeyInputs {
        KeyInputs::unpack(&self.inputs).unwrap_or_else(|| KeyInputs::new(self.kind))
    }

    /// The key inputs as the JSON value records carry.
    pub fn inputs_json(&self) -> serde_json::Value {
        serde_json::to_value(self.inputs()).unwrap_or_default()
    }
}

/// Errors building a graph.
#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    /// A box does not resolve.
    #[error("box `{0}` does not resolve (see `charly validate`)")]
    Unresolved(String),
    /// No such box.
    #[error("no box named `{0}`")]
    UnknownBox(String),
    /// A plan failed to compile.
    #[error(transparent)]
    Plan(#[from] charly_rules::plan::PlanError),
    /// A dependency cycle.
    #[error("dependency cycle: {0}")]
    Cycle(String),
    /// A key input could not be encoded.
    #[error("cannot encode {what} as a key input: {message}")]
    Canonical {
        /// The input.
        what: String,
        /// Why.
        message: String,
    },
    /// Hashing an input failed.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
}

/// The graph.
pub struct Graph {
    /// Nodes and dependency edges (dep → dependant).
    pub g: StableDiGraph<Node, ()>,
    /// Node index by id.
    pub by_id: BTreeMap<NodeId, NodeIndex>,
    /// The goal nodes (what was asked for), in request order.
    pub goals: Vec<NodeIndex>,
    /// Ids of layers merged into a sibling box's identical layer → that node.
    pub aliases: BTreeMap<NodeId, NodeIndex>,
    /// How many nodes took their own key inputs from the store
    /// ([`own`]) instead of computing them.
    pub own_inputs_reused: usize,
}

impl Graph {
    /// A node by id text (as typed in a query).
    pub fn node(&self, id: &str) -> Option<&Node> {
        self.find(id).map(|i| &self.g[i])
    }

    /// The node id a dependency of node `i` is named by in its key inputs
    /// (a layer names its parent by role, [`PARENT_DEP`]).
    pub fn dep_id(&self, i: NodeIndex, name: &str) -> String {
        match &self.g[i].work {
            Work::Layer {
                parent: Some(p), ..
            } if name == PARENT_DEP => self
                .index(p)
                .map_or_else(|| name.to_string(), |j| self.g[j].id.clone()),
            _ => name.to_string(),
        }
    }

    /// The index of a node by id text (merged layers' ids included): the
    /// text is read as a [`NodeId`], never matched as text.
    pub fn find(&self, id: &str) -> Option<NodeIndex> {
        self.index(&id.parse().ok()?)
    }

    /// The index of a node (a merged layer's id gives the layer it was
    /// merged into).
    pub fn index(&self, id: &NodeId) -> Option<NodeIndex> {
        self.by_id.get(id).or_else(|| self.aliases.get(id)).copied()
    }

    /// The ids a node is known by, as records name them: its own and the
    /// merged layers'.
    pub fn ids_of(&self, i: NodeIndex) -> Vec<String> {
        let mut v = vec![self.g[i].id.clone()];
        v.extend(
            self.aliases
                .iter()
                .filter(|(_, j)| **j == i)
                .map(|(id, _)| id.to_string()),
        );
        v
    }

    /// The nodes the image (or layer) `i` is made of: every layer, base,
    /// root filesystem and parent image below it, nearest first.
    pub fn image_parts(&self, i: NodeIndex) -> Vec<NodeIndex> {
        let mut out = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        let mut stack = vec![i];
        while let Some(j) = stack.pop() {
            for d in self.deps(j) {
                if matches!(
                    self.g[d].kind,
                    NodeKind::Layer | NodeKind::Image | NodeKind::Base | NodeKind::Rootfs
                ) && seen.insert(d)
                {
                    out.push(d);
                    stack.push(d);
                }
            }
        }
        out
    }

    /// Every node goal `g` depends on, transitively, and `g` itself.
    pub fn closure(&self, g: NodeIndex) -> Vec<NodeIndex> {
        let mut seen = std::collections::HashSet::from([g]);
        let mut stack = vec![g];
        while let Some(j) = stack.pop() {
            for d in self.g.neighbors_directed(j, petgraph::Direction::Incoming) {
                if seen.insert(d) {
                    stack.push(d);
                }
            }
        }
        let mut out: Vec<NodeIndex> = seen.into_iter().collect();
        out.sort_unstable();
        out
    }

    /// For every node some goal image is made of (and the goal images
    /// themselves): the requested boxes whose image contains it, sorted.
    pub fn boxes_by_part(&self) -> BTreeMap<NodeIndex, Vec<String>> {
        let mut out: BTreeMap<NodeIndex, Vec<String>> = BTreeMap::new();
        for g in &self.goals {
            let NodeId::Image { box_name } = &self.g[*g].nid else {
                continue;
            };
            for part in std::iter::once(*g).chain(self.image_parts(*g)) {
                out.entry(part).or_default().push(box_name.clone());
            }
        }
        for boxes in out.values_mut() {
            boxes.sort();
            boxes.dedup();
        }
        out
    }

    /// A node.
    pub fn get(&self, id: &NodeId) -> Option<&Node> {
        self.index(id).map(|i| &self.g[i])
    }

    /// Dependencies of a node, sorted by id.
    pub fn deps(&self, i: NodeIndex) -> Vec<NodeIndex> {
        let mut v: Vec<NodeIndex> = self
            .g
            .neighbors_directed(i, petgraph::Direction::Incoming)
            .collect();
        v.sort_by(|a, b| self.g[*a].id.cmp(&self.g[*b].id));
        v
    }

    /// Each node's position among all nodes sorted by id text (by index).
    fn id_ranks(&self) -> Vec<u32> {
        let bound = petgraph::visit::NodeIndexable::node_bound(&self.g);
        let mut rank = vec![u32::MAX; bound];
        let mut all: Vec<NodeIndex> = self.g.node_indices().collect();
        all.sort_unstable_by(|a, b| self.g[*a].id.cmp(&self.g[*b].id));
        for (r, i) in all.into_iter().enumerate() {
            rank[i.index()] = r as u32;
        }
        rank
    }

    /// Nodes in a deterministic topological order, or the whole cycle.
    pub fn topo(&self) -> Result<Vec<NodeIndex>, GraphError> {
        // Kahn with an id-ordered ready set: the same graph, the same
        // order. In-degrees by index and ids borrowed: the graph is keyed
        // and scheduled by this order, 38,000 nodes at 10,000 candies.
        let mut indeg = vec![0usize; petgraph::visit::NodeIndexable::node_bound(&self.g)];
        for i in self.g.node_indices() {
            indeg[i.index()] = self
                .g
                .neighbors_directed(i, petgraph::Direction::Incoming)
                .count();
        }
        // Each node's rank in id order: the ready set compares numbers,
        // not ids (which share long prefixes).
        let rank = self.id_ranks();
        // A min-heap (ids are unique: the order is total).
        use std::cmp::Reverse;
        let mut ready: std::collections::BinaryHeap<Reverse<(u32, NodeIndex)>> = self
            .g
            .node_indices()
            .filter(|i| indeg[i.index()] == 0)
            .map(|i| Reverse((rank[i.index()], i)))
            .collect();
        let mut out = Vec::with_capacity(self.g.node_count());
        while let Some(Reverse((_, i))) = ready.pop() {
            out.push(i);
            for n in self.g.neighbors_directed(i, petgraph::Direction::Outgoing) {
                let d = &mut indeg[n.index()];
                *d -= 1;
                if *d == 0 {
                    ready.push(Reverse((rank[n.index()], n)));
                }
            }
        }
        if out.len() < self.g.node_count() {
            // Some nodes never became ready: name a cycle.
            let sccs = petgraph::algo::tarjan_scc(&self.g);
            if let Some(c) = sccs.iter().find(|c| c.len() > 1) {
                let mut ids: Vec<&str> = c.iter().map(|i| self.g[*i].id.as_str()).collect();
                ids.sort_unstable();
                return Err(GraphError::Cycle(ids.join(" → ")));
            }
        }
        Ok(out)
    }
}

/// Builds graphs for a loaded, resolved project.
pub struct Builder<'a> {
    p: &'a Project,
    r: &'a Resolution,
    opts: GraphOptions,
    graph: Graph,
    /// Per box: its candies' oci plans' steps (computed once).
    plans: BTreeMap<String, Vec<OciSteps>>,
    /// Compiled candies by what compiling them reads: boxes that agree
    /// on it share one compiled candy instead of a copy each.
    compiled: OciMemo,
    /// The emitter options layers and images are keyed with (every box's
    /// image reference: made once, when the first layer or image is keyed).
    emit: std::sync::OnceLock<charly_rules::emit::EmitOptions>,
    /// Vocabulary entries' digests, computed once ([`inputs::VocabDigests`]).
    vocab_digests: inputs::VocabDigests,
    /// Where own key inputs are kept between runs, and what it kept
    /// ([`own`]).
    own: Option<(own::OwnFile, own::Kept)>,
}

/// What box `b`'s local packages are built in: its parent box (qualified),
/// its external base reference, or (a bootstrapped box) the box itself.
/// The distro and release a package is built for, so part of the local
/// package's identity and key: boxes on other bases get packages of their
/// own.
pub(crate) fn local_pkg_image(b: &ResolvedBox) -> &str {
    match &b.base {
        BaseRef::Box(parent) => parent,
        BaseRef::External(reference) => reference,
        BaseRef::Bootstrap { .. } => &b.name,
    }
}

pub(crate) fn add_node(graph: &mut Graph, nid: NodeId, work: Work) -> NodeIndex {
    // One search of the index, found or not.
    let slot = match graph.by_id.entry(nid) {
        std::collections::btree_map::Entry::Occupied(e) => return *e.get(),
        std::collections::btree_map::Entry::Vacant(v) => v,
    };
    let nid = slot.key().clone();
    let i = graph.g.add_node(Node {
        id: nid.to_string(),
        kind: nid.kind(),
        nid,
        inputs: Box::default(),
        key: NodeKey::from_bytes([0; 32]),
        work,
    });
    slot.insert(i);
    i
}

impl<'a> Builder<'a> {
    /// A builder.
    pub fn new(p: &'a Project, r: &'a Resolution, opts: GraphOptions) -> Self {
        Builder {
            p,
            r,
            opts,
            graph: Graph {
                g: StableDiGraph::new(),
                by_id: BTreeMap::new(),
                goals: Vec::new(),
                aliases: BTreeMap::new(),
                own_inputs_reused: 0,
            },
            plans: BTreeMap::new(),
            compiled: OciMemo::default(),
            emit: std::sync::OnceLock::new(),
            vocab_digests: Default::default(),
            own: None,
        }
    }

    /// Takes nodes' own key inputs from `file` where it keeps them for
    /// this project state and these options, and keeps there those it
    /// computes ([`own`]).
    pub fn with_own_inputs(mut self, file: Option<&own::OwnFile>) -> Self {
        self.own = file.map(|f| (f.clone(), f.read(&self.opts)));
        self
    }

    /// The own key inputs kept for node `id`.
    fn kept(&self, id: &str) -> Option<&[u8]> {
        self.own.as_ref()?.1.get(id)
    }

    /// Whether adding `goal` for box `name` compiles its candies' plans:
    /// images' layers carry them; a build directory's fragments only
    /// while their own inputs are not kept; a deploy plan never.
    pub fn needs_plans(&self, goal: &Goal, name: &str) -> bool {
        match goal {
            Goal::Build => true,
            Goal::Generate => self.r.get(name).is_none_or(|b| !self.fragments_kept(b)),
            Goal::Plan(_) => false,
        }
    }

    /// Whether the own key inputs of every fragment of box `b` are kept.
    fn fragments_kept(&self, b: &ResolvedBox) -> bool {
        self.own.is_some()
            && b.candies.iter().all(|k| {
                self.kept(&NodeId::fragment(&b.name, k).to_string())
                    .is_some()
            })
    }

    /// The emitter options of this run (as `Engine::ctx` gives nodes).
    fn emit(&self) -> &charly_rules::emit::EmitOptions {
        self.emit
            .get_or_init(|| layers::base_emit_options(self.r, &self.opts))
    }

    fn rbox(&self, name: &str) -> Result<&'a ResolvedBox, GraphError> {
        match self.r.boxes.get(name) {
            Some(Ok(b)) => Ok(b),
            Some(Err(_)) => Err(GraphError::Unresolved(name.into())),
            None => Err(GraphError::UnknownBox(name.into())),
        }
    }

    fn edge(&mut self, dep: NodeIndex, node: NodeIndex) {
        if !self.graph.g.contains_edge(dep, node) {
            self.graph.g.add_edge(dep, node, ());
        }
    }

    /// Adds the goal for a box.
    pub fn add(&mut self, goal: &Goal, box_name: &str) -> Result<NodeIndex, GraphError> {
        let i = match goal {
            Goal::Generate => self.containerfile(box_name, false)?,
            Goal::Build => self.image(box_name)?,
            Goal::Plan(t) => self.plan_node(box_name, *t)?,
        };
        if !self.graph.goals.contains(&i) {
            self.graph.goals.push(i);
        }
        Ok(i)
    }

    /// Finishes: computes every key.
    pub fn finish(mut self, hasher: &FileHasher) -> Result<Graph, GraphError> {
        // All nodes are in: the storage grew by doubling, and up to half of
        // it is spare (~10 MB at 10,000 candies × 1,000 boxes, for the rest
        // of the run).
        self.graph.g.shrink_to_fit();
        self.compute_keys(hasher)?;
        self.merge_layers();
        // Keyed: the fragments' steps go (see [`FragmentSteps`]) with the
        // memos that shared them, freed on both cores before the run
        // starts: freed in the background, they could still be alive when
        // the run's first allocations come, and add to the peak.
        let mut released: Vec<OciSteps> = Vec::new();
        for n in self.graph.g.node_weights_mut() {
            if let Work::Fragment { steps, .. } = &mut n.work {
                released.extend(steps.0.take());
            }
        }
        let memos = (
            std::mem::take(&mut self.compiled),
            std::mem::take(&mut self.plans),
        );
        rayon::join(move || drop(released), move || drop(memos));
        Ok(self.graph)
    }

    /// Sibling boxes' identical layers (same key: same parent, text and
    /// inputs) become one node, named after the smallest id; the others'
    /// ids become aliases of it.
    fn merge_layers(&mut self) {
        let mut by_key: BTreeMap<NodeKey, Vec<NodeIndex>> = BTreeMap::new();
        for i in self.graph.g.node_indices() {
            if self.graph.g[i].kind == NodeKind::Layer {
                by_key.entry(self.graph.g[i].key).or_default().push(i);
            }
        }
        for (_, mut group) in by_key {
            if group.len() < 2 {
                continue;
            }
            group.sort_by(|a, b| self.graph.g[*a].id.cmp(&self.graph.g[*b].id));
            let keep = group[0];
            for other in group.into_iter().skip(1) {
                let next: Vec<NodeIndex> = self
                    .graph
                    .g
                    .neighbors_directed(other, petgraph::Direction::Outgoing)
                    .collect();
                for n in next {
                    self.edge(keep, n);
                }
                let Some(gone) = self.graph.g.remove_node(other) else {
                    continue;
                };
                self.graph.by_id.remove(&gone.nid);
                for j in self.graph.aliases.values_mut() {
                    if *j == other {
                        *j = keep;
                    }
                }
                self.graph.aliases.insert(gone.nid, keep);
            }
        }
    }

    fn source_candy(&mut self, key: &str) -> NodeIndex {
        add_node(
            &mut self.graph,
            NodeId::Source(SourceId::Candy(key.into())),
            Work::Id,
        )
    }

    fn source_box(&mut self, name: &str) -> NodeIndex {
        add_node(
            &mut self.graph,
            NodeId::Source(SourceId::Box(name.into())),
            Work::Id,
        )
    }

    fn oci_plans(&mut self, b: &ResolvedBox) -> Result<Vec<OciSteps>, GraphError> {
        if let Some(p) = self.plans.get(&b.name) {
            return Ok(p.clone());
        }
        let mut plans = Vec::with_capacity(b.candies.len());
        for k in &b.candies {
            let at = (k.clone(), CompileContext::of(b, k));
            let steps = match self.compiled.get(&at) {
                Some(s) => s.clone(),
                None => {
                    let s = compile_oci_steps(self.p, &at.1, k)?;
                    self.compiled.insert(at, s.clone());
                    s
                }
            };
            plans.push(steps);
        }
        self.plans.insert(b.name.clone(), plans.clone());
        Ok(plans)
    }

    /// Compiles the plans of the named boxes (each candy once per
    /// [`CompileContext`], in parallel; adding nodes then finds them). A
    /// box whose plans do not compile is left to [`Builder::add`], which
    /// reports it.
    pub fn prepare_plans(&mut self, names: &[String]) {
        let p = self.p;
        let todo: Vec<&ResolvedBox> = names
            .iter()
            .filter_map(|n| self.r.get(n))
            .filter(|b| !self.plans.contains_key(&b.name))
            .collect();
        // Every box's candies, each by what compiling it reads.
        let wanted: Vec<Vec<(String, CompileContext)>> = todo
            .par_iter()
            .map(|b| {
                b.candies
                    .iter()
                    .map(|k| (k.clone(), CompileContext::of(b, k)))
                    .collect()
            })
            .collect();
        let mut distinct: Vec<&(String, CompileContext)> = Vec::new();
        {
            let mut seen = std::collections::HashSet::new();
            for w in wanted.iter().flatten() {
                if !self.compiled.contains_key(w) && seen.insert(w) {
                    distinct.push(w);
                }
            }
        }
        let done: Vec<(&(String, CompileContext), Option<OciSteps>)> = distinct
            .par_iter()
            .map(|w| (*w, compile_oci_steps(p, &w.1, &w.0).ok()))
            .collect();
        let mut failed = std::collections::HashSet::new();
        for (w, s) in done {
            match s {
                Some(s) => {
                    self.compiled.insert(w.clone(), s);
                }
                None => {
                    failed.insert(w);
                }
            }
        }
        for (b, w) in todo.iter().zip(&wanted) {
            if w.iter().any(|x| failed.contains(x)) {
                continue;
            }
            let plans = w.iter().map(|x| self.compiled[x].clone()).collect();
            self.plans.insert(b.name.clone(), plans);
        }
    }

    fn containerfile(&mut self, name: &str, prebuilt: bool) -> Result<NodeIndex, GraphError> {
        let id = NodeId::containerfile(name, prebuilt);
        if let Some(i) = self.graph.index(&id) {
            return Ok(i);
        }
        let b = self.rbox(name)?;
        let node = add_node(&mut self.graph, id, Work::Id);
        let sb = self.source_box(name);
        self.edge(sb, node);
        // Fragments whose own inputs are kept need no steps to be keyed
        // (one that runs compiles its candy then: FragmentSteps::get).
        let plans = match self.fragments_kept(b) {
            true => None,
            false => Some(self.oci_plans(b)?),
        };
        for (i, k) in b.candies.iter().enumerate() {
            let sc = self.source_candy(k);
            self.edge(sc, node);
            let f = add_node(
                &mut self.graph,
                NodeId::fragment(name, k),
                Work::Fragment {
                    index: i,
                    steps: FragmentSteps(plans.as_ref().map(|p| p[i].clone())),
                },
            );
            self.edge(sc, f);
            self.edge(f, node);
        }
        if let BaseRef::Box(parent) = &b.base {
            let pc = self.containerfile(parent, prebuilt)?;
            self.edge(pc, node);
        }
        Ok(node)
    }

    fn image(&mut self, name: &str) -> Result<NodeIndex, GraphError> {
        let id = NodeId::image(name);
        if let Some(i) = self.graph.index(&id) {
            return Ok(i);
        }
        let b = self.rbox(name)?;
        let node = add_node(&mut self.graph, id, Work::Id);
        let top = self.layer_chain(b)?;
        self.edge(top, node);
        // The box file (labels, user): `explain` names it when it changed.
        let sb = self.source_box(name);
        self.edge(sb, node);
        Ok(node)
    }

    /// A box's layer chain, bottom up: its base (the parent box's image,
    /// an external image's layers, or a bootstrapped root filesystem),
    /// the setup layer (not on a box base), one layer per candy in the
    /// box's order, the init layer when its services need one. Returns the
    /// top; every layer depends on the one below and on what its text
    /// reads (the candy's sources, builder artifacts, local packages, the
    /// root filesystem).
    fn layer_chain(&mut self, b: &'a ResolvedBox) -> Result<NodeIndex, GraphError> {
        let name = b.name.as_str();
        let (mut below, mut below_id) = match &b.base {
            BaseRef::Box(parent) => {
                let i = self.image(parent)?;
                (Some(i), Some(NodeId::image(parent)))
            }
            BaseRef::External(x) => {
                let id = NodeId::Base {
                    reference: x.clone(),
                };
                let i = add_node(&mut self.graph, id.clone(), Work::Id);
                (Some(i), Some(id))
            }
            BaseRef::Bootstrap { builder, .. } => {
                // The root filesystem is the chain's first layer.
                let id = NodeId::Rootfs {
                    box_name: name.into(),
                };
                let i = add_node(
                    &mut self.graph,
                    id.clone(),
                    Work::Rootfs {
                        builder: builder.clone(),
                    },
                );
                (Some(i), Some(id))
            }
        };
        let mut push = |this: &mut Self, slot: LayerSlot, steps: Option<OciSteps>| {
            let id = NodeId::layer(name, slot);
            let i = add_node(
                &mut this.graph,
                id.clone(),
                Work::Layer {
                    steps,
                    parent: below_id.clone(),
                },
            );
            if let Some(p) = below {
                this.edge(p, i);
            }
            below = Some(i);
            below_id = Some(id);
            i
        };
        if !matches!(b.base, BaseRef::Box(_)) {
            push(self, LayerSlot::Setup, None);
        }
        let plans = self.oci_plans(b)?;
        let vocab = &self.p.ns(b.ns).vocab;
        for (ci, k) in b.candies.iter().enumerate() {
            let layer = push(self, LayerSlot::Candy(k.clone()), Some(plans[ci].clone()));
            let sc = self.source_candy(k);
            self.edge(sc, layer);
            // Builder stages run once per key in their builder box's image;
            // inline builders run inside the layer build, in that image.
            for u in b.builders.iter().filter(|u| u.candies.contains(k)) {
                let Some(def) = vocab.builder.get(&u.builder) else {
                    continue;
                };
                let Some(img) = &u.image else { continue };
                if def.inline || def.stage_template.is_none() {
                    let bi = self.image(img)?;
                    self.edge(bi, layer);
                    continue;
                }
                let st = self.builder_stage(k, &u.builder, img, &b.user, name)?;
                self.edge(st, layer);
            }
            if self.opts.dev_local_pkg {
                for s in plans[ci].iter() {
                    if let charly_rules::plan::StepData::LocalPkgInstall(l) = &s.data {
                        let lp = self.local_pkg(b, k, &l.format)?;
                        self.edge(lp, layer);
                    }
                }
            }
        }
        if layers::has_init(self.p, b) {
            push(self, LayerSlot::Init, None);
        }
        below.ok_or_else(|| GraphError::Canonical {
            what: format!("the image of box {name}"),
            message: "it has no base and no layers".into(),
        })
    }

    fn local_pkg(
        &mut self,
        b: &ResolvedBox,
        k: &str,
        format: &str,
    ) -> Result<NodeIndex, GraphError> {
        let lp = add_node(
            &mut self.graph,
            NodeId::local_pkg(k, format, local_pkg_image(b)),
            Work::LocalPkg {
                for_box: b.name.clone(),
            },
        );
        // Not the whole candy: a package is made of its source directory
        // (this source node), its recipe (key inputs: the candy's
        // `localpkg:` entry and the format's `local_pkg`) and the image it
        // is built in. An edit elsewhere in the candy leaves it as it is.
        let ls = add_node(
            &mut self.graph,
            NodeId::Source(SourceId::LocalPkg {
                candy: k.into(),
                format: format.into(),
            }),
            Work::Id,
        );
        self.edge(ls, lp);
        if let BaseRef::Box(parent) = &b.base {
            let pi = self.image(parent)?;
            self.edge(pi, lp);
        }
        Ok(lp)
    }

    fn builder_stage(
        &mut self,
        candy: &str,
        builder: &str,
        image_box: &str,
        user: &User,
        for_box: &str,
    ) -> Result<NodeIndex, GraphError> {
        let id = NodeId::builder_stage(candy, builder, image_box, user);
        if let Some(i) = self.graph.index(&id) {
            return Ok(i);
        }
        let node = add_node(
            &mut self.graph,
            id,
            Work::BuilderStage {
                user: user.clone(),
                for_box: for_box.into(),
            },
        );
        let sc = self.source_candy(candy);
        self.edge(sc, node);
        let bi = self.image(image_box)?;
        self.edge(bi, node);
        Ok(node)
    }

    fn plan_node(&mut self, name: &str, target: Target) -> Result<NodeIndex, GraphError> {
        let b = self.rbox(name)?;
        let node = add_node(
            &mut self.graph,
            NodeId::Plan {
                box_name: name.into(),
                target,
            },
            Work::Id,
        );
        for k in &b.candies {
            let sc = self.source_candy(k);
            self.edge(sc, node);
        }
        let sb = self.source_box(name);
        self.edge(sb, node);
        Ok(node)
    }

    fn compute_keys(&mut self, hasher: &FileHasher) -> Result<(), GraphError> {
        let order = self.graph.topo()?;
        // Sources first, in parallel: they read and hash files.
        let sources: Vec<(NodeIndex, SourceId)> = order
            .iter()
            .filter_map(|i| match &self.graph.g[*i].nid {
                NodeId::Source(s) => Some((*i, s.clone())),
                _ => None,
            })
            .collect();
        let p = self.p;
        let _t = crate::timings::phase("graph: source keys");
        let computed: Vec<(NodeIndex, Result<KeyInputs, GraphError>)> = sources
            .par_iter()
            .map(|(i, id)| (*i, inputs::source_inputs(p, id, hasher)))
            .collect();
        let mut keyed = Vec::with_capacity(computed.len());
        for (i, inputs) in computed {
            let inputs = inputs?;
            self.graph.g[i].key = inputs.key();
            keyed.push((i, inputs));
        }
        self.keep_inputs(keyed);
        drop(_t);
        let _t = crate::timings::phase("graph: other keys");
        // A node's key chains its own inputs to its dependencies' keys.
        // Nodes go level by level (a level's dependencies all in the
        // levels below, sources at 0), so each node of a level is keyed
        // in parallel: own inputs, chaining, key and packing. (Chained in
        // topological order on one thread, keying 38,000 nodes kept the
        // main thread busy ~110 ms.)
        let mut level = vec![0usize; petgraph::visit::NodeIndexable::node_bound(&self.graph.g)];
        for &i in &order {
            if self.graph.g[i].kind != NodeKind::Source {
                level[i.index()] = 1 + self
                    .graph
                    .g
                    .neighbors_directed(i, petgraph::Direction::Incoming)
                    .map(|d| level[d.index()])
                    .max()
                    .unwrap_or(0);
            }
        }
        // Each node, with where its steps are when it is a fragment whose
        // own inputs are not kept; by level, in topological order within
        // one.
        let mut others: Vec<(NodeIndex, Option<(usize, usize)>)> = order
            .iter()
            .filter(|i| self.graph.g[**i].kind != NodeKind::Source)
            .map(|&i| {
                let steps = self.fragment_steps(i);
                let steps = steps.filter(|_| self.kept(&self.graph.g[i].id).is_none());
                (i, steps.map(inputs::steps_addr))
            })
            .collect();
        others.sort_by_key(|(i, _)| level[i.index()]);
        // Keyed in batches of one level. Only one batch's inputs are alive
        // at a time (all of them at once were the run's memory peak: ~80
        // MB at 10,000 candies × 1,000 boxes).
        //
        // Fragments that share their steps (boxes that compile a candy
        // alike) share the steps' canonical JSON: made when the first of
        // them is keyed, dropped after the last.
        let mut remaining: HashMap<(usize, usize), usize> = HashMap::new();
        for at in others.iter().filter_map(|(_, at)| *at) {
            *remaining.entry(at).or_default() += 1;
        }
        let mut shared: HashMap<(usize, usize), Result<String, GraphError>> = HashMap::new();
        // Own inputs computed where the store keeps them (to add there).
        let mut fresh: Vec<(String, Box<[u8]>)> = Vec::new();
        let mut reused = 0;
        let batches = others
            .chunk_by(|a, b| level[a.0.index()] == level[b.0.index()])
            .flat_map(|l| l.chunks(KEY_BATCH));
        for batch in batches {
            let mut needed: HashMap<(usize, usize), NodeIndex> = HashMap::new();
            for (i, at) in batch {
                if let Some(at) = at
                    && !shared.contains_key(at)
                {
                    needed.insert(*at, *i);
                }
            }
            let made: Vec<_> = needed
                .into_par_iter()
                .filter_map(|(at, i)| Some((at, self.fragment_steps(i)?)))
                .map(|(at, steps)| (at, inputs::canonical("the candy's plan", steps)))
                .collect();
            shared.extend(made);
            let this = &*self;
            let keyed: Vec<Result<Keyed, GraphError>> = batch
                .par_iter()
                .map(|(i, at)| {
                    let i = *i;
                    if let Some(own) = this.kept_inputs(i) {
                        return Ok((i, this.chain(i, own, false), true));
                    }
                    let inputs = match at.map(|at| &shared[&at]) {
                        None => this.inputs_of(i, hasher, None),
                        Some(Ok(json)) => this.inputs_of(i, hasher, Some(json)),
                        // The same error for each fragment sharing the steps.
                        Some(Err(GraphError::Canonical { what, message })) => {
                            Err(GraphError::Canonical {
                                what: what.clone(),
                                message: message.clone(),
                            })
                        }
                        Some(Err(e)) => Err(GraphError::Canonical {
                            what: "the candy's plan".into(),
                            message: e.to_string(),
                        }),
                    }?;
                    Ok((i, this.chain(i, inputs, true), false))
                })
                .collect();
            for k in keyed {
                let (i, c, reused_own) = k?;
                reused += usize::from(reused_own);
                let n = &mut self.graph.g[i];
                n.key = c.key;
                n.inputs = c.packed;
                if let Some(own) = c.own {
                    fresh.push((n.id.clone(), own));
                }
            }
            for at in batch.iter().filter_map(|(_, at)| *at) {
                if let Some(n) = remaining.get_mut(&at) {
                    *n -= 1;
                    if *n == 0 {
                        shared.remove(&at);
                    }
                }
            }
        }
        self.graph.own_inputs_reused = reused;
        if let Some((file, kept)) = &self.own
            && !fresh.is_empty()
        {
            // A file that cannot be written only costs the next run the
            // inputs it would have kept.
            let _ = file.save(&self.opts, kept, fresh);
        }
        Ok(())
    }

    /// Node `i`'s own key inputs as the store keeps them, when it does
    /// (for a node of the kind, read back whole).
    fn kept_inputs(&self, i: NodeIndex) -> Option<KeyInputs> {
        let n = &self.graph.g[i];
        if !own::keeps(n.kind) {
            return None;
        }
        KeyInputs::unpack(self.kept(&n.id)?).filter(|k| k.kind == Some(n.kind))
    }

    /// Node `i` keyed from its own inputs: the dependencies' keys (keyed by
    /// now) chained in. Also gives its own inputs packed, for the store to
    /// keep, when they are `fresh` (not read from it) and of a kind the
    /// store keeps ([`own::keeps`]).
    fn chain(&self, i: NodeIndex, mut inputs: KeyInputs, fresh: bool) -> Chained {
        let g = &self.graph.g;
        let own = (fresh && self.own.is_some() && own::keeps(g[i].kind)).then(|| inputs.pack());
        // The one own input that is another node's key: a builder stage's
        // image (a dependency, so keyed by now).
        if let NodeId::BuilderStage { image_box, .. } = &g[i].nid
            && let Some(bi) = self.graph.index(&NodeId::image(image_box))
        {
            inputs.builder_image = Some(g[bi].key.to_hex());
        }
        // A layer names the layer below it by role, not by id: the id
        // names a box, and siblings' layers must key alike.
        let parent = match &g[i].work {
            Work::Layer { parent, .. } => parent.as_ref(),
            _ => None,
        };
        for d in g.neighbors_directed(i, petgraph::Direction::Incoming) {
            let dn = &g[d];
            if parent == Some(&dn.nid) {
                inputs.dep(PARENT_DEP, &dn.key);
            } else {
                inputs.dep(dn.id.clone(), &dn.key);
            }
        }
        Chained {
            key: inputs.key(),
            packed: inputs.pack(),
            own,
        }
    }

    /// The steps of node `i` when it is a fragment.
    fn fragment_steps(&self, i: NodeIndex) -> Option<&[InstallStep]> {
        match &self.graph.g[i].work {
            Work::Fragment { steps, .. } => steps.held(),
            _ => None,
        }
    }

    /// Gives each node its key inputs, packed (in parallel).
    fn keep_inputs(&mut self, keyed: Vec<(NodeIndex, KeyInputs)>) {
        let packed: Vec<(NodeIndex, Box<[u8]>)> = keyed
            .into_par_iter()
            .map(|(i, inputs)| (i, inputs.pack()))
            .collect();
        for (i, p) in packed {
            self.graph.g[i].inputs = p;
        }
    }
}

/// A candy's plan's steps for the oci target, home resolved (the steps of
/// [`charly_rules::plan::build_deploy_plan`] with the default host context
/// after [`charly_rules::plan::InstallPlan::resolve_home`]), shared by
/// every box whose [`CompileContext`] for the candy is the same.
pub type OciSteps = Arc<Vec<InstallStep>>;

/// A fragment's compiled steps. Keys read them while the graph is built;
/// [`Builder::finish`] then releases them: held through the run, they were
/// ~40 MB at 10,000 candies × 1,000 boxes, for the few fragments that run.
/// A fragment that runs compiles its candy again ([`FragmentSteps::get`]):
/// compiling is pure, so it gets the steps its key was computed from.
#[derive(Clone, Debug)]
pub struct FragmentSteps(Option<OciSteps>);

impl FragmentSteps {
    /// The steps of candy `candy` in box `b`: held, or compiled again.
    pub fn get(
        &self,
        p: &Project,
        b: &ResolvedBox,
        candy: &str,
    ) -> Result<OciSteps, charly_rules::plan::PlanError> {
        match &self.0 {
            Some(s) => Ok(s.clone()),
            None => compile_oci_steps(p, &CompileContext::of(b, candy), candy),
        }
    }

    /// Whether the graph still holds the steps (until it is keyed).
    pub fn is_held(&self) -> bool {
        self.0.is_some()
    }

    /// The steps while the graph holds them (until it is keyed).
    fn held(&self) -> Option<&[InstallStep]> {
        self.0.as_deref().map(Vec::as_slice)
    }
}

/// Compiled candies by (candy key, context).
type OciMemo = std::collections::HashMap<(String, CompileContext), OciSteps>;

/// Candy `key` compiled in context `cx` for the oci target, home resolved.
fn compile_oci_steps(
    p: &Project,
    cx: &CompileContext,
    key: &str,
) -> Result<OciSteps, charly_rules::plan::PlanError> {
    let mut steps = compile_candy_steps(p, cx, key, &HostContext::default())?;
    for s in &mut steps {
        s.resolve_home(&cx.user.home);
    }
    // Kept for the whole run, one per candy and context: without the
    // growth's spare room (InstallStep is ~400 bytes).
    steps.shrink_to_fit();
    Ok(Arc::new(steps))
}

/// A node keyed ([`Builder::chain`]).
struct Chained {
    key: NodeKey,
    /// Its key inputs, packed.
    packed: Box<[u8]>,
    /// Its own inputs, packed, for the store to keep.
    own: Option<Box<[u8]>>,
}

/// A node keyed, and whether its own inputs were kept.
type Keyed = (NodeIndex, Chained, bool);

/// How many nodes are keyed together ([`Builder::compute_keys`]): enough to
/// keep both cores busy, few enough that their key inputs stay small.
const KEY_BATCH: usize = 2048;

/// How a layer's key inputs name the layer below it.
pub const PARENT_DEP: &str = "parent";

/// The image reference of a box (see [`charly_rules::naming::box_image_ref`]).
pub use charly_rules::naming::box_image_ref as image_ref;

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(names: &[&str], edges: &[(usize, usize)]) -> (Graph, Vec<NodeIndex>) {
        let mut g = Graph {
            g: StableDiGraph::new(),
            by_id: BTreeMap::new(),
            goals: Vec::new(),
            aliases: BTreeMap::new(),
            own_inputs_reused: 0,
        };
        let ix: Vec<NodeIndex> = names
            .iter()
            .map(|n| add_node(&mut g, NodeId::Source(SourceId::Box((*n).into())), Work::Id))
            .collect();
        for (a, b) in edges {
            g.g.add_edge(ix[*a], ix[*b], ());
        }
        (g, ix)
    }

    fn ids(g: &Graph, order: &[NodeIndex]) -> Vec<String> {
        order.iter().map(|i| g.g[*i].id.clone()).collect()
    }

    /// Dependencies first; among nodes ready together, id order, whatever
    /// order they were added in.
    #[test]
    fn topo_is_dependencies_first_then_id_order() {
        let (g, _) = graph(&["d", "b", "c", "a"], &[(0, 3), (2, 1)]);
        let order = g.topo().expect("no cycle");
        let (a, b, c, d) = (
            NodeId::Source(SourceId::Box("a".into())).to_string(),
            NodeId::Source(SourceId::Box("b".into())).to_string(),
            NodeId::Source(SourceId::Box("c".into())).to_string(),
            NodeId::Source(SourceId::Box("d".into())).to_string(),
        );
        assert_eq!(ids(&g, &order), [c, b, d, a]);
    }

    /// The order does not depend on the id index: without one, or with one
    /// that misnames a node, nodes are ranked by their ids.
    #[test]
    fn topo_order_is_the_same_without_the_id_index() {
        let (mut g, ix) = graph(
            &["d", "b", "c", "a", "e", "f"],
            &[(0, 3), (2, 1), (4, 5), (5, 3)],
        );
        let want = ids(&g, &g.topo().expect("no cycle"));
        let full = g.by_id.clone();
        g.by_id.clear();
        assert_eq!(ids(&g, &g.topo().expect("no cycle")), want);
        // Two ids swapped: the index names every node, wrongly.
        g.by_id = full.clone();
        let (first, second) = (g.g[ix[0]].nid.clone(), g.g[ix[1]].nid.clone());
        g.by_id.insert(first, ix[1]);
        g.by_id.insert(second, ix[0]);
        assert_eq!(ids(&g, &g.topo().expect("no cycle")), want);
        // One node missing from it.
        g.by_id = full;
        g.by_id.remove(&g.g[ix[2]].nid.clone());
        assert_eq!(ids(&g, &g.topo().expect("no cycle")), want);
    }

    /// A cycle is named by its members, sorted; the nodes outside it do not
    /// hide it.
    #[test]
    fn topo_names_a_cycle() {
        let (g, _) = graph(&["x", "y", "z", "free"], &[(0, 1), (1, 2), (2, 0)]);
        match g.topo() {
            Err(GraphError::Cycle(c)) => {
                assert_eq!(c.matches(" → ").count(), 2, "{c}");
                for n in ["x", "y", "z"] {
                    assert!(c.contains(n), "{c}");
                }
                assert!(!c.contains("free"), "{c}");
            }
            other => panic!("{other:?}"),
        }
    }
}
