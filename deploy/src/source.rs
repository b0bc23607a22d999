//! Artifacts for deploys from the store: builder-stage artifact tars and
//! built local packages are looked up by the node keys of the box's build
//! graph (the same keys `charly box build` stored them under). Nothing is
//! built here: a missing artifact is an error that says which build makes it.

use crate::walk::Artifacts;
use charly_cache::Store;
use charly_engine::graph::{Builder, Goal, Graph, GraphOptions};
use charly_engine::hash::FileHasher;
use charly_engine::id::NodeId;
use charly_engine::outputs;
use charly_rules::load::Project;
use charly_rules::resolve::Resolution;

/// The store as an [`Artifacts`] source for one box.
pub struct StoreArtifacts<'a> {
    project: &'a Project,
    store: &'a Store,
    graph: Graph,
    box_name: String,
}

impl<'a> StoreArtifacts<'a> {
    /// Builds the box's build graph (keys only; nothing runs). `opts` must
    /// match the build that filled the store (runner name, arch, dev-local-pkg).
    pub fn new(
        project: &'a Project,
        resolution: &'a Resolution,
        store: &'a Store,
        hasher: &FileHasher,
        opts: GraphOptions,
        box_name: &str,
    ) -> Result<Self, String> {
        let mut b = Builder::new(project, resolution, opts);
        b.add(&Goal::Build, box_name).map_err(|e| e.to_string())?;
        let graph = b.finish(hasher).map_err(|e| e.to_string())?;
        Ok(StoreArtifacts {
            project,
            store,
            graph,
            box_name: box_name.into(),
        })
    }

    /// The outputs named by `pick` of the first node (in id order) that
    /// `which` accepts; `what` names it in errors.
    fn output(
        &self,
        what: &str,
        which: &dyn Fn(&NodeId) -> bool,
        pick: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<(String, Vec<u8>)>, String> {
        let node = self
            .graph
            .by_id
            .values()
            .map(|i| &self.graph.g[*i])
            .find(|n| which(&n.nid))
            .ok_or_else(|| format!("the build graph of box {} has no {what}", self.box_name))?;
        let missing = || {
            format!(
                "{} is not in the store (key {}); run `charly box build {}` first",
                node.id,
                &node.key.to_hex()[..12],
                self.box_name
            )
        };
        let rec = self
            .store
            .get_record(&node.key)
            .map_err(|e| e.to_string())?
            .ok_or_else(missing)?;
        let mut out = Vec::new();
        for (name, o) in &rec.outputs {
            if !pick(name) {
                continue;
            }
            let data = self
                .store
                .get_blob(&o.digest)
                .map_err(|e| e.to_string())?
                .ok_or_else(missing)?;
            out.push((name.clone(), data.into_vec()));
        }
        Ok(out)
    }
}

impl Artifacts for StoreArtifacts<'_> {
    fn builder_tar(&self, candy: &str, builder: &str) -> Result<Vec<u8>, String> {
        let what = format!("builder stage of {candy} with {builder}");
        let mut v = self.output(
            &what,
            &|id| {
                matches!(id, NodeId::BuilderStage { candy: c, builder: b, .. }
                    if c == candy && b == builder)
            },
            &|n| n == outputs::ARTIFACT_TAR,
        )?;
        v.pop()
            .map(|(_, d)| d)
            .ok_or_else(|| format!("the {what} recorded no {}", outputs::ARTIFACT_TAR))
    }

    fn local_packages(&self, candy: &str, format: &str) -> Result<Vec<(String, Vec<u8>)>, String> {
        let what = format!("local {format} package of {candy}");
        let v = self
            .output(
                &what,
                // The box's graph holds one: the one built in its base image.
                &|id| {
                    matches!(id, NodeId::LocalPkg { candy: c, format: f, .. }
                        if c == candy && f == format)
                },
                &|n| outputs::pkg_name(n).is_some(),
            )
            .map_err(|e| format!("{e} (with --dev-local-pkg)"))?;
        Ok(v.into_iter()
            .filter_map(|(n, d)| Some((outputs::pkg_name(&n)?.to_string(), d)))
            .collect())
    }

    fn candy_file(&self, candy: &str, rel: &str) -> Result<Vec<u8>, String> {
        let c = self
            .project
            .candies
            .get(candy)
            .ok_or_else(|| format!("unknown candy {candy}"))?;
        // Inside the candy directory only: no absolute path, no `..`, no
        // symlink leading out of it (charly_files::fsroot).
        let p = c.dir.join(rel);
        charly_files::fsroot::Root::open(&c.dir)
            .and_then(|r| r.read(std::path::Path::new(rel)))
            .map_err(|e| format!("{}: {e}", p.display()))?
            .ok_or_else(|| format!("{}: no such file", p.display()))
    }
}
