//! The engine's entry points used by the CLI: build a graph for a goal,
//! run it, write build directories, explain a node.

use crate::exec::{self, Ctx};
use crate::graph::{Builder, Goal, Graph, GraphError, GraphOptions};
use crate::hash::FileHasher;
use crate::id::NodeId;
use crate::key::Change;
use crate::runners::Runner;
use crate::sched::{self, Observer, State, Summary};
use charly_cache::Store;
use charly_rules::load::Project;
use charly_rules::naming;
use charly_rules::resolve::Resolution;
use petgraph::graph::NodeIndex;
use rayon::prelude::*;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// Errors of the entry points.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Building the graph failed.
    #[error(transparent)]
    Graph(#[from] GraphError),
    /// The store failed.
    #[error("store: {0}")]
    Cache(#[from] charly_cache::CacheError),
    /// Writing outputs failed.
    #[error(transparent)]
    Exec(#[from] exec::ExecError),
    /// No node matches.
    #[error("no node `{0}` (see `charly graph --format json` for node ids)")]
    UnknownNode(String),
    /// The request cannot be done as asked.
    #[error("{0}")]
    Request(String),
    /// Several nodes match.
    #[error("`{0}` matches several nodes; name one of them: {1}")]
    Ambiguous(String, String),
}

/// A run of the engine.
pub struct Engine<'a> {
    /// The project.
    pub project: &'a Project,
    /// Its resolution.
    pub resolution: &'a Resolution,
    /// The store.
    pub store: &'a Store,
    /// What runs command nodes; `None` for commands that only plan, write
    /// build directories or explain (a node that needs a runner then fails
    /// with [`exec::ExecError::NoRunner`]).
    pub runner: Option<&'a dyn Runner>,
    /// File hasher (stat cache).
    pub hasher: &'a FileHasher,
    /// What enters keys besides the project: `--dev-local-pkg`, the runner's
    /// name, the target architecture.
    pub opts: GraphOptions,
    /// A shared cache behind the local store (`--remote`), or `None`.
    pub remote: Option<&'a dyn charly_cache::RemoteCache>,
    /// Where nodes' own key inputs are kept between runs
    /// ([`crate::graph::own`]), or `None` to compute them all.
    pub own_inputs: Option<crate::graph::own::OwnFile>,
}

/// A box image present in the runner after a build.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamedImage {
    /// The box.
    pub box_name: String,
    /// Its content tag in the runner.
    pub tag: String,
    /// Its configuration says what to run (`Cmd` or `Entrypoint`).
    pub has_command: bool,
}

impl<'a> Engine<'a> {
    /// Builds the graph for a goal over boxes.
    pub fn graph(&self, goal: &Goal, boxes: &[String]) -> Result<Graph, EngineError> {
        self.graph_goals(&[(goal.clone(), boxes.to_vec())])
    }

    /// What `box build` stored for `box_name` (its build graph's keys;
    /// nothing runs): `self.opts` must match the build that filled the
    /// store (runner name, arch, `--dev-local-pkg`).
    pub fn built(&self, box_name: &str) -> Result<crate::built::Built<'a>, EngineError> {
        let g = self.graph(&Goal::Build, &[box_name.to_string()])?;
        Ok(crate::built::Built::new(self.store, g, box_name))
    }

    /// One graph for several goals (shared nodes appear once).
    pub fn graph_goals(&self, goals: &[(Goal, Vec<String>)]) -> Result<Graph, EngineError> {
        let mut b = Builder::new(self.project, self.resolution, self.opts.clone())
            .with_own_inputs(self.own_inputs.as_ref());
        {
            let _t = crate::timings::phase("graph: nodes");
            let named: Vec<String> = goals
                .iter()
                .flat_map(|(goal, boxes)| boxes.iter().filter(|n| b.needs_plans(goal, n)))
                .cloned()
                .collect();
            b.prepare_plans(&named);
            for (goal, boxes) in goals {
                for name in boxes {
                    b.add(goal, name)?;
                }
            }
        }
        let _t = crate::timings::phase("graph: keys");
        Ok(b.finish(self.hasher)?)
    }

    /// The execution context writing build directories under `out_root`.
    pub fn ctx(&self, out_root: &Path) -> Ctx<'a> {
        Ctx {
            project: self.project,
            resolution: self.resolution,
            store: self.store,
            runner: self.runner,
            runner_name: self.opts.runner.clone(),
            out_root: out_root.to_path_buf(),
            emit: crate::graph::layers::base_emit_options(self.resolution, &self.opts),
            arch: self.opts.arch.clone(),
            remote: self.remote,
            obs: None,
            hasher: self.hasher,
            present: None,
        }
    }

    /// Runs a graph. With a remote, waits for the uploads the run queued
    /// and puts the remote's figures in the summary (a dry run only looks
    /// at the local store and leaves the remote alone).
    pub fn run(
        &self,
        graph: &Graph,
        out_root: &Path,
        jobs: usize,
        dry_run: bool,
        obs: &dyn Observer,
    ) -> Summary {
        self.run_with_memo(graph, out_root, jobs, dry_run, obs, None)
    }

    /// [`Engine::run`], trusting what the last run of the same command
    /// recorded ([`crate::journal::Memo`]): nodes whose keys it left in the
    /// store are cached without a lookup.
    pub fn run_with_memo(
        &self,
        graph: &Graph,
        out_root: &Path,
        jobs: usize,
        dry_run: bool,
        obs: &dyn Observer,
        memo: Option<&crate::journal::Memo>,
    ) -> Summary {
        let ctx = Ctx {
            obs: Some(obs),
            present: memo.map(crate::journal::Memo::present_keys),
            ..self.ctx(out_root)
        };
        let mut s = {
            let _t = crate::timings::phase("run");
            sched::run(graph, &ctx, jobs, dry_run)
        };
        describe_layers(graph, &mut s);
        if !dry_run {
            self.root_images(graph, &s);
        }
        let _ = self.hasher.save();
        let t = crate::timings::phase("store: flush");
        let _ = self.store.flush();
        drop(t);
        if let Some(r) = self.remote
            && !dry_run
        {
            let t = std::time::Instant::now();
            s.remote = Some(r.finish());
            s.totals.wall_ms += t.elapsed().as_millis() as u64;
        }
        s
    }

    /// Makes each built goal image a GC root (`box:<name>`), and every
    /// record of its chain below it (`box:<name>#<n>`: layers, base, root
    /// filesystem, parent images): GC keeps the newest build of every box
    /// whole, so a build after a GC still finds its layers cached. Roots of
    /// an older, longer chain are dropped.
    fn root_images(&self, graph: &Graph, s: &Summary) {
        let old = self.store.roots().unwrap_or_default();
        let had: std::collections::HashMap<&str, &charly_cache::NodeKey> =
            old.iter().map(|(n, k)| (n.as_str(), k)).collect();
        // A root that already names the key is left alone: a build that
        // found everything cached writes nothing to the index (a write of
        // the same row would still change the index's files, which a
        // replay of the build checks).
        let set_root = |name: String, key: &charly_cache::NodeKey| {
            if had.get(name.as_str()) != Some(&key) {
                let _ = self.store.set_root(&name, key);
            }
        };
        for i in &graph.goals {
            let n = &graph.g[*i];
            let NodeId::Image { box_name } = &n.nid else {
                continue;
            };
            let built = s
                .get(&n.id)
                .is_some_and(|r| !matches!(r.state, State::Failed | State::NotAttempted));
            if !built {
                continue;
            }
            set_root(format!("box:{box_name}"), &n.key);
            let chain: Vec<_> = graph
                .image_parts(*i)
                .into_iter()
                .map(|j| graph.g[j].key)
                .collect();
            let prefix = format!("box:{box_name}#");
            for (k, key) in chain.iter().enumerate() {
                set_root(format!("{prefix}{k}"), key);
            }
            for (name, _) in &old {
                let stale = name
                    .strip_prefix(&prefix)
                    .and_then(|k| k.parse::<usize>().ok())
                    .is_some_and(|k| k >= chain.len());
                if stale {
                    let _ = self.store.remove_root(name);
                }
            }
        }
    }

    /// Writes the build directories of the goal Containerfile nodes under
    /// `out_root` (from the store; unchanged directories are skipped).
    /// With `self_contained`, the candy directories they copy from are
    /// copied too, so `out_root` is a complete build context.
    pub fn write_build_dirs(
        &self,
        graph: &Graph,
        out_root: &Path,
        self_contained: bool,
    ) -> Result<Vec<PathBuf>, EngineError> {
        self.write_build_dirs_with_memo(graph, out_root, self_contained, None)
    }

    /// [`Engine::write_build_dirs`], leaving alone each box directory the
    /// last run of the same command wrote for the same key and nobody
    /// touched since ([`crate::journal::Memo::dir_unchanged`]).
    pub fn write_build_dirs_with_memo(
        &self,
        graph: &Graph,
        out_root: &Path,
        self_contained: bool,
        memo: Option<&crate::journal::Memo>,
    ) -> Result<Vec<PathBuf>, EngineError> {
        self.write_build_dirs_keeping(graph, out_root, self_contained, memo)
            .map(|(written, _)| written)
    }

    /// [`Engine::write_build_dirs_with_memo`], also returning the box
    /// directories the memo showed untouched (left as they were, not
    /// rewritten): the journal's record takes their fingerprints from the
    /// memo instead of walking them again.
    pub fn write_build_dirs_keeping(
        &self,
        graph: &Graph,
        out_root: &Path,
        self_contained: bool,
        memo: Option<&crate::journal::Memo>,
    ) -> Result<(Vec<PathBuf>, Vec<PathBuf>), EngineError> {
        let _t = crate::timings::phase("write build dirs");
        let ctx = self.ctx(out_root);
        exec::sweep_shared(out_root);
        // Staged outside candies are shared by every box: a box directory
        // is only left alone when they are as the last run left them too.
        let memo = memo.filter(|m| m.dir_unchanged(&out_root.join(naming::LAYERS_DIR)));
        // Each box's directory is its own (and locked while written): they
        // are written in parallel, and listed in goal order.
        let dirs: Vec<(NodeIndex, String, bool)> = graph
            .goals
            .par_iter()
            .filter_map(|i| {
                let n = &graph.g[*i];
                let NodeId::Containerfile { box_name, .. } = &n.nid else {
                    return None;
                };
                let dir = naming::build_dir(box_name);
                let kept = memo.is_some_and(|m| {
                    m.key_was(&n.id, &n.key) && m.dir_unchanged(&out_root.join(&dir))
                });
                Some(if kept {
                    Ok((*i, dir, true))
                } else {
                    exec::materialize(&ctx, graph, *i, out_root).map(|d| (*i, d, false))
                })
            })
            .collect::<Result<_, _>>()?;
        let mut written = Vec::new();
        let mut kept_dirs = Vec::new();
        for (i, dir, kept) in dirs {
            if kept {
                kept_dirs.push(out_root.join(&dir));
            }
            written.push(out_root.join(&dir).join("Containerfile"));
            if self_contained && out_root != self.project.root {
                for (src, rel) in self.context_candies(&graph.g[i]) {
                    crate::generate::copy_dir(src, &out_root.join(rel))
                        .map_err(|e| exec::ExecError::Io(format!("{rel}: {e}")))?;
                }
            }
        }
        if out_root == self.project.root {
            crate::generate::write_ignore_files(self.project)
                .map_err(|e| exec::ExecError::Io(e.to_string()))?;
        }
        let _ = self.hasher.save();
        Ok((written, kept_dirs))
    }

    /// The candy directories (source, relative path) a self-contained
    /// build context of a Containerfile node carries.
    fn context_candies(&self, n: &crate::graph::Node) -> Vec<(&'a Path, &'a str)> {
        let NodeId::Containerfile { box_name, .. } = &n.nid else {
            return Vec::new();
        };
        self.box_context_candies(box_name)
    }

    /// [`Engine::context_candies`] of box `box_name`.
    fn box_context_candies(&self, box_name: &str) -> Vec<(&'a Path, &'a str)> {
        let Some(b) = self.resolution.get(box_name) else {
            return Vec::new();
        };
        b.candies
            .iter()
            .filter_map(|k| {
                let c = &self.project.candies[k];
                c.rel_dir.as_deref().map(|rel| (c.dir.as_path(), rel))
            })
            .collect()
    }

    /// Where [`Engine::write_build_dirs`] with `self_contained` copies the
    /// candy directories of the boxes `names` under `out_root` (for the
    /// no-op journal's outputs).
    pub fn box_context_candy_dirs(&self, names: &[&str], out_root: &Path) -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = names
            .iter()
            .flat_map(|n| self.box_context_candies(n))
            .map(|(_, rel)| crate::journal::normalize(&out_root.join(rel)))
            .collect();
        dirs.sort();
        dirs.dedup();
        dirs
    }

    /// Writes a built box's image into the OCI layout at `dir` as
    /// `reference` (from the store: its layers and assembled config).
    pub fn export_oci(
        &self,
        graph: &Graph,
        box_name: &str,
        dir: &Path,
        reference: &str,
    ) -> Result<crate::oci::Exported, EngineError> {
        let ctx = self.ctx(&self.project.root);
        let i = crate::graph::layers::image_node(graph, box_name)
            .ok_or_else(|| EngineError::UnknownNode(format!("image:{box_name}")))?;
        Ok(crate::exec::layers::export_image(
            &ctx, graph, i, dir, reference,
        )?)
    }

    /// Pushes a built box's image to `remote`'s repository as `tag`; returns
    /// the bytes sent.
    pub fn push_image(
        &self,
        graph: &Graph,
        box_name: &str,
        remote: &charly_cache::Remote,
        tag: &str,
    ) -> Result<u64, EngineError> {
        let ctx = self.ctx(&self.project.root);
        let i = crate::graph::layers::image_node(graph, box_name)
            .ok_or_else(|| EngineError::UnknownNode(format!("image:{box_name}")))?;
        Ok(crate::exec::layers::push_image(
            &ctx, graph, i, remote, tag,
        )?)
    }

    /// The configuration and manifest digests of `box_name`'s built image
    /// (`sha256:…` each; see [`crate::exec::layers::image_digests`]).
    pub fn image_digests(
        &self,
        graph: &Graph,
        box_name: &str,
    ) -> Result<(String, String), EngineError> {
        let ctx = self.ctx(&self.project.root);
        let i = crate::graph::layers::image_node(graph, box_name)
            .ok_or_else(|| EngineError::UnknownNode(format!("image:{box_name}")))?;
        Ok(crate::exec::layers::image_digests(&ctx, graph, i)?)
    }

    /// Makes the built images of `boxes` present in the runner (loading
    /// them from the store where it lacks them); returns their tags.
    pub fn ensure_images(
        &self,
        graph: &Graph,
        boxes: &[String],
    ) -> Result<Vec<String>, EngineError> {
        let ctx = self.ctx(&self.project.root);
        let mut tags = Vec::new();
        for b in boxes {
            let i = crate::graph::layers::image_node(graph, b)
                .ok_or_else(|| EngineError::UnknownNode(format!("image:{b}")))?;
            tags.push(crate::exec::layers::ensure_image(&ctx, graph, i)?);
        }
        Ok(tags)
    }

    /// After a build of `boxes`: each box's reference names the image of
    /// the keys just reported (see [`crate::exec::layers::name_image`]; `load`
    /// loads images the runner lacks). Returns the boxes whose image is in
    /// the runner now.
    pub fn name_images(
        &self,
        graph: &Graph,
        boxes: &[String],
        load: bool,
    ) -> Result<Vec<NamedImage>, EngineError> {
        let ctx = self.ctx(&self.project.root);
        let mut present = Vec::new();
        for b in boxes {
            let i = crate::graph::layers::image_node(graph, b)
                .ok_or_else(|| EngineError::UnknownNode(format!("image:{b}")))?;
            if let Some(tag) = crate::exec::layers::name_image(&ctx, graph, i, load)? {
                present.push(NamedImage {
                    box_name: b.clone(),
                    tag,
                    has_command: crate::exec::layers::image_has_command(&ctx, graph, i)?,
                });
            }
        }
        Ok(present)
    }

    /// For a fragment whose plan changed: which lines of its text did,
    /// against the text its last record stored.
    fn fragment_change(
        &self,
        graph: &Graph,
        i: petgraph::stable_graph::NodeIndex,
        last: &charly_cache::Record,
    ) -> Option<Change> {
        let (NodeId::Fragment { box_name, candy }, crate::graph::Work::Fragment { index, steps }) =
            (&graph.g[i].nid, &graph.g[i].work)
        else {
            return None;
        };
        let old = last.outputs.get(crate::outputs::TEXT)?;
        let old = self.store.get_blob(&old.digest).ok()??;
        let old = String::from_utf8_lossy(&old).into_owned();
        let new = exec::fragment(
            &self.ctx(&self.project.root),
            box_name,
            candy,
            *index,
            steps,
        )
        .ok()?
        .text;
        (old != new).then(|| Change::Text {
            name: "fragment text".into(),
            old: Some(crate::key::text_digest(&old)),
            new: Some(crate::key::text_digest(&new)),
            lines: crate::key::line_diff(&old, &new),
        })
    }

    /// Explains a node: why it would rebuild, or that it is cached.
    pub fn explain(&self, graph: &Graph, query: &str) -> Result<Explanation, EngineError> {
        let id = find_node(graph, query)?;
        Ok(self.explain_id(graph, &id, 0))
    }

    fn explain_id(&self, graph: &Graph, id: &str, depth: usize) -> Explanation {
        let Some(n) = graph.node(id) else {
            return Explanation::never_built(id, String::new());
        };
        let key = n.key.to_hex();
        if let Ok(Some(rec)) = self.store.get_record(&n.key) {
            return Explanation {
                id: id.into(),
                key,
                status: Status::Cached,
                recorded_unix: Some(rec.created_unix),
                changes: Vec::new(),
                causes: Vec::new(),
            };
        }
        let Some(i) = graph.find(id) else {
            return Explanation::never_built(id, key);
        };
        let (recorded, changes) = match crate::why::since_in_use(self.store, graph, i) {
            crate::why::Since::NeverBuilt => return Explanation::never_built(id, key),
            crate::why::Since::Changed {
                recorded_unix,
                mut changes,
                last,
            } => {
                changes.extend(self.fragment_change(graph, i, &last));
                (recorded_unix, changes)
            }
        };
        let mut causes = Vec::new();
        if depth < 8 {
            for c in &changes {
                if let Change::Dep {
                    id: dep,
                    new: Some(_),
                    ..
                } = c
                {
                    causes.push(self.explain_id(graph, dep, depth + 1));
                }
            }
        }
        Explanation {
            id: id.into(),
            key,
            status: Status::WouldRebuild,
            recorded_unix: Some(recorded),
            changes,
            causes,
        }
    }
}

/// Names, in a summary, the candy of each layer and the requested boxes
/// whose images contain each layer, base and image.
fn describe_layers(graph: &Graph, s: &mut Summary) {
    let boxes = graph.boxes_by_part();
    for (r, &i) in s.nodes.iter_mut().zip(&s.index) {
        if let Some(b) = boxes.get(&i) {
            r.boxes = b.clone();
        }
        if let NodeId::Layer {
            slot: crate::id::LayerSlot::Candy(candy),
            ..
        } = &graph.g[i].nid
        {
            r.candy = Some(candy.clone());
        }
    }
}

/// Where a node stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// Its current key has a record.
    Cached,
    /// It would rebuild; `changes` says why.
    WouldRebuild,
    /// It was never built.
    NeverBuilt,
}

/// `charly explain` output.
#[derive(Clone, Debug, Serialize)]
pub struct Explanation {
    /// Node id.
    pub id: String,
    /// Current key.
    pub key: String,
    /// Status.
    pub status: Status,
    /// When the record (current, or last for a rebuild) was made.
    pub recorded_unix: Option<u64>,
    /// What changed since the last build.
    pub changes: Vec<Change>,
    /// Why changed dependencies changed.
    pub causes: Vec<Explanation>,
}

impl Explanation {
    /// A node with no record at all.
    fn never_built(id: &str, key: String) -> Explanation {
        Explanation {
            id: id.into(),
            key,
            status: Status::NeverBuilt,
            recorded_unix: None,
            changes: Vec::new(),
            causes: Vec::new(),
        }
    }

    /// Lines for people.
    pub fn lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        self.render(0, &mut out);
        out
    }

    fn render(&self, indent: usize, out: &mut Vec<String>) {
        let pad = "  ".repeat(indent);
        match self.status {
            Status::Cached => out.push(format!(
                "{pad}{}: cached, recorded at {} (key {})",
                self.id,
                self.recorded_unix.map(format_time).unwrap_or_default(),
                &self.key[..12.min(self.key.len())]
            )),
            Status::NeverBuilt => out.push(format!(
                "{pad}{}: never built (no earlier record of this node)",
                self.id
            )),
            Status::WouldRebuild => {
                out.push(format!(
                    "{pad}{}: would rebuild; since its last build ({}):",
                    self.id,
                    self.recorded_unix.map(format_time).unwrap_or_default()
                ));
                for c in &self.changes {
                    out.push(format!("{pad}  - {c}"));
                }
                for cause in &self.causes {
                    cause.render(indent + 2, out);
                }
            }
        }
    }
}

/// `YYYY-MM-DD HH:MM:SS UTC` from unix seconds.
pub fn format_time(secs: u64) -> String {
    let days = secs / 86_400;
    let rem = secs % 86_400;
    // Civil from days (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Finds a node by its id (a merged layer's id gives the layer it was
/// merged into), or by a name it is made of ([`NodeId::parts`]: `hello`
/// names the nodes of box or candy `hello`) when exactly one node has it;
/// never by a piece of text.
pub fn find_node(graph: &Graph, query: &str) -> Result<String, EngineError> {
    if let Ok(id) = query.parse::<NodeId>()
        && let Some(i) = graph.index(&id)
    {
        return Ok(graph.g[i].id.clone());
    }
    let mut hits: Vec<&str> = graph
        .g
        .node_weights()
        .filter(|n| n.nid.parts().contains(&query))
        .map(|n| n.id.as_str())
        .collect();
    hits.sort_unstable();
    match hits.as_slice() {
        [one] => Ok((*one).to_string()),
        [] => Err(EngineError::UnknownNode(query.into())),
        // A name that several nodes have (`hello`: the box's image, its
        // layers, the candy's source…) is not guessed: every one is
        // listed, to be named in full.
        many => {
            let mut list: Vec<&str> = many.iter().take(20).copied().collect();
            if many.len() > list.len() {
                list.push("…");
            }
            Err(EngineError::Ambiguous(query.into(), list.join(", ")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_format() {
        assert_eq!(format_time(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(format_time(1_796_212_800), "2026-12-02 12:00:00 UTC");
    }
}
