//! The build graph: nodes, edges and keys for a goal over some boxes.
//!
//! Nodes are identified by a stable id (`fragment:jupyter/direnv`,
//! `containerfile:jupyter`, `image:fedora`, `builder-stage:cowsay/npm@node-builder`),
//! so a node shared by several boxes (a source, a builder stage, a base
//! image) appears once: diamonds run once. Edges point from a dependency to
//! its dependant. Keys are computed in topological order, sources first (in
//! parallel: they hash files), each node's key including its dependencies'
//! keys, so a change propagates exactly to what is downstream of it.

use crate::hash::FileHasher;
use crate::key::{KeyInputs, NodeKind};
use charly_cache::NodeKey;
use charly_rules::emit::containerfile::{default_image_ref, fragment_is_last};
use charly_rules::load::{CandyEntry, Project};
use charly_rules::plan::{HostContext, InstallPlan, Target, build_box_plans, build_merged_plan};
use charly_rules::resolve::{BaseRef, Resolution, ResolvedBox, User, effective_distro};
use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use rayon::prelude::*;
use std::collections::BTreeMap;
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
}

/// What a node does when it runs.
#[derive(Clone, Debug)]
pub enum Work {
    /// Nothing: a source is its hash.
    Source,
    /// Render one candy's fragment.
    Fragment {
        /// Box.
        box_name: String,
        /// Candy key.
        candy: String,
        /// Position in the box.
        index: usize,
        /// The candy's plan (target oci, home resolved).
        plan: Arc<InstallPlan>,
    },
    /// Assemble a box's build directory.
    Containerfile {
        /// Box.
        box_name: String,
        /// Builder stages come as prebuilt artifact tars (for `box build`)
        /// rather than as stages in the Containerfile.
        prebuilt: bool,
    },
    /// Run a builder stage.
    BuilderStage {
        /// Candy key.
        candy: String,
        /// Builder type.
        builder: String,
        /// Builder box (qualified).
        image_box: String,
        /// User the artifact is made for.
        user: User,
        /// A box that uses it (for its distro/vocabulary).
        for_box: String,
    },
    /// Build a local package.
    LocalPkg {
        /// Candy key.
        candy: String,
        /// Format.
        format: String,
        /// Box whose distro builds it.
        for_box: String,
    },
    /// Bootstrap a root filesystem.
    Rootfs {
        /// Box.
        box_name: String,
        /// Builder type.
        builder: String,
    },
    /// Build a box image.
    Image {
        /// Box.
        box_name: String,
    },
    /// Compile a plan.
    Plan {
        /// Box.
        box_name: String,
        /// Target.
        target: Target,
    },
}

/// One node.
#[derive(Clone, Debug)]
pub struct Node {
    /// Stable id.
    pub id: String,
    /// Kind.
    pub kind: NodeKind,
    /// Key inputs (filled by [`Graph::compute_keys`]).
    pub inputs: KeyInputs,
    /// The key.
    pub key: NodeKey,
    /// What running it means.
    pub work: Work,
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
    pub by_id: BTreeMap<String, NodeIndex>,
    /// The goal nodes (what was asked for), in request order.
    pub goals: Vec<NodeIndex>,
}

impl Graph {
    /// A node by id.
    pub fn node(&self, id: &str) -> Option<&Node> {
        self.by_id.get(id).map(|i| &self.g[*i])
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

    /// Nodes in a deterministic topological order, or the whole cycle.
    pub fn topo(&self) -> Result<Vec<NodeIndex>, GraphError> {
        let sccs = petgraph::algo::tarjan_scc(&self.g);
        if let Some(c) = sccs.iter().find(|c| c.len() > 1) {
            let mut ids: Vec<&str> = c.iter().map(|i| self.g[*i].id.as_str()).collect();
            ids.sort_unstable();
            return Err(GraphError::Cycle(ids.join(" → ")));
        }
        // Kahn with an id-ordered ready set: the same graph, the same order.
        let mut indeg: BTreeMap<NodeIndex, usize> = self
            .g
            .node_indices()
            .map(|i| {
                (
                    i,
                    self.g
                        .neighbors_directed(i, petgraph::Direction::Incoming)
                        .count(),
                )
            })
            .collect();
        let mut ready: std::collections::BTreeSet<(String, NodeIndex)> = indeg
            .iter()
            .filter(|(_, d)| **d == 0)
            .map(|(i, _)| (self.g[*i].id.clone(), *i))
            .collect();
        let mut out = Vec::with_capacity(indeg.len());
        while let Some((id, i)) = ready.pop_first() {
            let _ = id;
            out.push(i);
            for n in self.g.neighbors_directed(i, petgraph::Direction::Outgoing) {
                if let Some(d) = indeg.get_mut(&n) {
                    *d -= 1;
                    if *d == 0 {
                        ready.insert((self.g[n].id.clone(), n));
                    }
                }
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
    /// Per box: its candies' oci plans (computed once).
    plans: BTreeMap<String, Vec<Arc<InstallPlan>>>,
}

fn add_node(graph: &mut Graph, id: String, kind: NodeKind, work: Work) -> NodeIndex {
    if let Some(i) = graph.by_id.get(&id) {
        return *i;
    }
    let i = graph.g.add_node(Node {
        id: id.clone(),
        kind,
        inputs: KeyInputs::new(kind),
        key: NodeKey::from_bytes([0; 32]),
        work,
    });
    graph.by_id.insert(id, i);
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
            },
            plans: BTreeMap::new(),
        }
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
        self.compute_keys(hasher)?;
        Ok(self.graph)
    }

    fn source_candy(&mut self, key: &str) -> NodeIndex {
        add_node(
            &mut self.graph,
            format!("source:candy/{key}"),
            NodeKind::Source,
            Work::Source,
        )
    }

    fn source_box(&mut self, name: &str) -> NodeIndex {
        add_node(
            &mut self.graph,
            format!("source:box/{name}"),
            NodeKind::Source,
            Work::Source,
        )
    }

    fn oci_plans(&mut self, b: &ResolvedBox) -> Result<Vec<Arc<InstallPlan>>, GraphError> {
        if let Some(p) = self.plans.get(&b.name) {
            return Ok(p.clone());
        }
        let mut plans = build_box_plans(self.p, b, &HostContext::default())?;
        for pl in &mut plans {
            pl.resolve_home(&b.user.home);
        }
        let plans: Vec<Arc<InstallPlan>> = plans.into_iter().map(Arc::new).collect();
        self.plans.insert(b.name.clone(), plans.clone());
        Ok(plans)
    }

    fn containerfile(&mut self, name: &str, prebuilt: bool) -> Result<NodeIndex, GraphError> {
        let id = if prebuilt {
            format!("containerfile:{name}+artifacts")
        } else {
            format!("containerfile:{name}")
        };
        if let Some(i) = self.graph.by_id.get(&id) {
            return Ok(*i);
        }
        let b = self.rbox(name)?;
        let node = add_node(
            &mut self.graph,
            id,
            NodeKind::Containerfile,
            Work::Containerfile {
                box_name: name.into(),
                prebuilt,
            },
        );
        let sb = self.source_box(name);
        self.edge(sb, node);
        let plans = self.oci_plans(b)?;
        for (i, k) in b.candies.iter().enumerate() {
            let sc = self.source_candy(k);
            self.edge(sc, node);
            let f = add_node(
                &mut self.graph,
                format!("fragment:{name}/{k}"),
                NodeKind::Fragment,
                Work::Fragment {
                    box_name: name.into(),
                    candy: k.clone(),
                    index: i,
                    plan: plans[i].clone(),
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
        let id = format!("image:{name}");
        if let Some(i) = self.graph.by_id.get(&id) {
            return Ok(*i);
        }
        let b = self.rbox(name)?;
        let node = add_node(
            &mut self.graph,
            id,
            NodeKind::Image,
            Work::Image {
                box_name: name.into(),
            },
        );
        let cf = self.containerfile(name, true)?;
        self.edge(cf, node);
        match &b.base {
            BaseRef::Box(parent) => {
                let pi = self.image(parent)?;
                self.edge(pi, node);
            }
            BaseRef::Bootstrap { builder, .. } => {
                let r = add_node(
                    &mut self.graph,
                    format!("rootfs:{name}"),
                    NodeKind::Rootfs,
                    Work::Rootfs {
                        box_name: name.into(),
                        builder: builder.clone(),
                    },
                );
                self.edge(r, node);
            }
            BaseRef::External(_) => {}
        }
        // Builder stages run once per key in their builder box's image.
        for u in &b.builders {
            let vocab = &self.p.ns(b.ns).vocab;
            let Some(def) = vocab.builder.get(&u.builder) else {
                continue;
            };
            let Some(img) = &u.image else { continue };
            if def.inline || def.stage_template.is_none() {
                // Inline builders run inside the box build, in the builder image.
                let bi = self.image(img)?;
                self.edge(bi, node);
                continue;
            }
            for k in &u.candies {
                let st = self.builder_stage(k, &u.builder, img, &b.user, name)?;
                self.edge(st, node);
            }
        }
        if self.opts.dev_local_pkg {
            for (i, k) in b.candies.iter().enumerate() {
                let plans = self.oci_plans(b)?;
                for s in &plans[i].steps {
                    if let charly_rules::plan::StepData::LocalPkgInstall(l) = &s.data {
                        let lp = add_node(
                            &mut self.graph,
                            format!("local-pkg:{k}/{}", l.format),
                            NodeKind::LocalPkg,
                            Work::LocalPkg {
                                candy: k.clone(),
                                format: l.format.clone(),
                                for_box: name.into(),
                            },
                        );
                        let sc = self.source_candy(k);
                        self.edge(sc, lp);
                        let ls = add_node(
                            &mut self.graph,
                            format!("source:localpkg/{k}/{}", l.format),
                            NodeKind::Source,
                            Work::Source,
                        );
                        self.edge(ls, lp);
                        // Built in the box's base image (the distro it installs into).
                        if let BaseRef::Box(parent) = &b.base {
                            let pi = self.image(parent)?;
                            self.edge(pi, lp);
                        }
                        self.edge(lp, node);
                    }
                }
            }
        }
        Ok(node)
    }

    fn builder_stage(
        &mut self,
        candy: &str,
        builder: &str,
        image_box: &str,
        user: &User,
        for_box: &str,
    ) -> Result<NodeIndex, GraphError> {
        let mut id = format!("builder-stage:{candy}/{builder}@{image_box}");
        if user.uid != 1000 || user.home != "/home/user" {
            id.push_str(&format!("~{}:{}:{}", user.uid, user.gid, user.home));
        }
        if let Some(i) = self.graph.by_id.get(&id) {
            return Ok(*i);
        }
        let node = add_node(
            &mut self.graph,
            id,
            NodeKind::BuilderStage,
            Work::BuilderStage {
                candy: candy.into(),
                builder: builder.into(),
                image_box: image_box.into(),
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
            format!("plan:{name}@{}", target.as_str()),
            NodeKind::Plan,
            Work::Plan {
                box_name: name.into(),
                target,
            },
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
        let sources: Vec<(NodeIndex, String)> = order
            .iter()
            .filter(|i| self.graph.g[**i].kind == NodeKind::Source)
            .map(|i| (*i, self.graph.g[*i].id.clone()))
            .collect();
        let p = self.p;
        let r = self.r;
        let computed: Vec<(NodeIndex, Result<KeyInputs, GraphError>)> = sources
            .par_iter()
            .map(|(i, id)| (*i, source_inputs(p, r, id, hasher)))
            .collect();
        for (i, inputs) in computed {
            let inputs = inputs?;
            let n = &mut self.graph.g[i];
            n.key = inputs.key();
            n.inputs = inputs;
        }
        for i in order {
            if self.graph.g[i].kind == NodeKind::Source {
                continue;
            }
            let mut inputs = self.inputs_of(i)?;
            for d in self.graph.deps(i) {
                let dn = &self.graph.g[d];
                inputs.dep(dn.id.clone(), &dn.key);
            }
            let n = &mut self.graph.g[i];
            n.key = inputs.key();
            n.inputs = inputs;
        }
        Ok(())
    }

    /// Non-dependency inputs of a node.
    fn inputs_of(&self, i: NodeIndex) -> Result<KeyInputs, GraphError> {
        let n = &self.graph.g[i];
        let mut k = KeyInputs::new(n.kind);
        match &n.work {
            Work::Source => {}
            Work::Fragment {
                box_name,
                candy,
                index,
                plan,
            } => {
                let b = self.rbox(box_name)?;
                k.text("plan", &canonical(&**plan));
                user_values(&mut k, &b.user);
                k.value("formats", b.formats.join(","));
                k.value("tags", b.tags.join(","));
                k.value("last", fragment_is_last(self.p, b, *index).to_string());
                k.value("dev-local-pkg", self.opts.dev_local_pkg.to_string());
                let c = &self.p.candies[candy];
                for (name, v) in c.def.var.iter() {
                    k.value(format!("var:{}", name.value), v.value.clone());
                }
                vocab_texts(&mut k, self.p, b, Some(c));
            }
            Work::Containerfile { box_name, prebuilt } => {
                let b = self.rbox(box_name)?;
                k.text("facts", &canonical(b));
                k.value("prebuilt-artifacts", prebuilt.to_string());
                vocab_texts(&mut k, self.p, b, None);
                k.base = Some(b.root_image.clone());
                if let BaseRef::Box(parent) = &b.base {
                    k.value("base-ref", image_ref(self.r, parent));
                }
                for u in &b.builders {
                    if let Some(img) = &u.image {
                        k.value(format!("builder-ref:{}", u.builder), image_ref(self.r, img));
                    }
                }
                k.value("dev-local-pkg", self.opts.dev_local_pkg.to_string());
            }
            Work::BuilderStage {
                candy,
                builder,
                image_box,
                user,
                for_box,
            } => {
                let b = self.rbox(for_box)?;
                let vocab = &self.p.ns(b.ns).vocab;
                if let Some(def) = vocab.builder.get(builder) {
                    k.text(format!("builder/{builder}"), &canonical(def));
                }
                user_values(&mut k, user);
                k.value("builder", builder.clone());
                k.value("candy", candy.clone());
                k.value("runner", self.opts.runner.clone());
                if let Some(bi) = self.graph.by_id.get(&format!("image:{image_box}")) {
                    k.builder_image = Some(self.graph.g[*bi].key.to_hex());
                }
            }
            Work::LocalPkg {
                candy,
                format,
                for_box,
            } => {
                let b = self.rbox(for_box)?;
                let vocab = &self.p.ns(b.ns).vocab;
                if let Some(d) = b
                    .distro_def
                    .as_deref()
                    .and_then(|d| effective_distro(vocab, d))
                    && let Some(f) = d.format.get(format)
                {
                    k.text(
                        format!("format/{format}/local_pkg"),
                        &canonical(&f.local_pkg),
                    );
                }
                k.value("format", format.clone());
                k.value("candy", candy.clone());
                k.value("runner", self.opts.runner.clone());
                k.value("distro", b.tags.join(","));
            }
            Work::Rootfs { box_name, builder } => {
                let b = self.rbox(box_name)?;
                let vocab = &self.p.ns(b.ns).vocab;
                if let Some(d) = b
                    .distro_def
                    .as_deref()
                    .and_then(|d| effective_distro(vocab, d))
                {
                    k.text("distro", &canonical(&d));
                }
                k.value("builder", builder.clone());
                k.value("tags", b.tags.join(","));
                k.value("runner", self.opts.runner.clone());
                k.value("arch", self.opts.arch.clone());
            }
            Work::Image { box_name } => {
                let b = self.rbox(box_name)?;
                k.base = Some(b.root_image.clone());
                k.value("tag", image_ref(self.r, box_name));
                k.value("runner", self.opts.runner.clone());
                k.value("arch", self.opts.arch.clone());
            }
            Work::Plan { box_name, target } => {
                let b = self.rbox(box_name)?;
                let plan = build_merged_plan(
                    self.p,
                    b,
                    &HostContext {
                        target: *target,
                        ..HostContext::default()
                    },
                    &[],
                )?;
                k.text("plan", &canonical(&plan));
                k.value("target", target.as_str());
            }
        }
        Ok(k)
    }
}

/// The image reference of a box.
pub fn image_ref(r: &Resolution, name: &str) -> String {
    let version = r.get(name).map(|b| b.version.clone()).unwrap_or_default();
    default_image_ref(name, &version)
}

fn user_values(k: &mut KeyInputs, u: &User) {
    k.value("user", format!("{}:{}:{}:{}", u.name, u.uid, u.gid, u.home));
}

/// Vocabulary entries a box (or one of its candies) renders with.
fn vocab_texts(k: &mut KeyInputs, p: &Project, b: &ResolvedBox, candy: Option<&CandyEntry>) {
    let vocab = &p.ns(b.ns).vocab;
    if let Some(d) = b
        .distro_def
        .as_deref()
        .and_then(|d| effective_distro(vocab, d))
    {
        k.text(
            format!("vocab:distro/{}", b.distro_def.as_deref().unwrap_or("")),
            &canonical(&d),
        );
    }
    for u in &b.builders {
        if candy.is_none_or(|c| u.candies.contains(&c.key))
            && let Some(def) = vocab.builder.get(&u.builder)
        {
            k.text(format!("vocab:builder/{}", u.builder), &canonical(def));
        }
    }
    let services = match candy {
        Some(c) => !c.def.service.is_empty(),
        None => b
            .candies
            .iter()
            .any(|c| !p.candies[c].def.service.is_empty()),
    };
    if services {
        for (name, init) in &vocab.init {
            k.text(format!("vocab:init/{name}"), &canonical(init));
        }
    }
}

/// Canonical JSON (struct fields in declaration order, maps sorted).
pub fn canonical<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .and_then(|v| serde_json::to_string(&v))
        .unwrap_or_default()
}

/// Key inputs of a source node.
fn source_inputs(
    p: &Project,
    r: &Resolution,
    id: &str,
    hasher: &FileHasher,
) -> Result<KeyInputs, GraphError> {
    let mut k = KeyInputs::new(NodeKind::Source);
    if let Some(candy) = id.strip_prefix("source:candy/") {
        let c = &p.candies[candy];
        let prefix = c
            .rel_dir
            .clone()
            .unwrap_or_else(|| format!("_layers/{}", c.name));
        let def_file = p.sources.get(c.file);
        for f in &c.files {
            let path = c.dir.join(f);
            // The definition file is keyed without its checks (already in
            // memory; checks are not build inputs).
            let d = match def_file.filter(|s| s.path == path) {
                Some(src) => definition_digest(&src.text, &[&c.def.eval]),
                None => hasher.digest(&path).map_err(|source| GraphError::Io {
                    path: format!("{prefix}/{f}"),
                    source,
                })?,
            };
            k.files.insert(format!("{prefix}/{f}"), d);
        }
    } else if let Some(rest) = id.strip_prefix("source:localpkg/") {
        let (candy, fmt) = rest.rsplit_once('/').unwrap_or((rest, ""));
        if let Some((dir, files)) = p
            .candies
            .get(candy)
            .and_then(|c| c.localpkg_sources.get(fmt))
        {
            let prefix = charly_rules::load::relative(dir, &p.root);
            for f in files {
                let d = hasher
                    .digest(&dir.join(f))
                    .map_err(|source| GraphError::Io {
                        path: format!("{prefix}/{f}"),
                        source,
                    })?;
                k.files.insert(format!("{prefix}/{f}"), d);
            }
        }
    } else if let Some(name) = id.strip_prefix("source:box/") {
        let _ = r;
        // Look the box up by its namespace prefix and short name (a scan of
        // every box here made the graph quadratic in the number of boxes).
        for n in &p.namespaces {
            let short = if n.path.is_empty() {
                Some(name)
            } else {
                name.strip_prefix(n.path.as_str())
                    .and_then(|s| s.strip_prefix('.'))
            };
            if let Some(b) = short.and_then(|s| n.boxes.get(s))
                && n.qualify(&b.name) == name
                && let Some(src) = p.sources.get(b.file)
            {
                k.files.insert(
                    src.rel.clone(),
                    definition_digest(&src.text, &[&b.def.eval, &b.def.deploy_eval]),
                );
            }
        }
    }
    Ok(k)
}

/// The key digest of a definition file's text, its check sections left out.
fn definition_digest(text: &str, checks: &[&Option<charly_rules::yaml::Yaml>]) -> String {
    let sections: Vec<&charly_rules::yaml::Node> = checks
        .iter()
        .filter_map(|c| c.as_ref().map(|y| &y.0))
        .collect();
    let text = charly_rules::check::without_checks(text, &sections);
    blake3::hash(text.as_bytes()).to_hex().to_string()
}
