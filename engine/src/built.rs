//! What `box build` left in the store for a box, for deploys: builder
//! artifact tars and built local packages, looked up by the node keys of
//! the box's build graph (the keys the build stored them under). Nothing
//! is built here: a missing output is an error that says which build
//! makes it. The engine opens one (`Engine::built`).

use crate::graph::Graph;
use crate::id::NodeId;
use crate::outputs;
use charly_cache::Store;

/// A box's stored build outputs.
pub struct Built<'a> {
    store: &'a Store,
    graph: Graph,
    box_name: String,
}

impl<'a> Built<'a> {
    /// The outputs of `graph` (box `box_name`'s build graph) in `store`.
    pub(crate) fn new(store: &'a Store, graph: Graph, box_name: &str) -> Self {
        Built {
            store,
            graph,
            box_name: box_name.into(),
        }
    }

    /// The artifact tar of `candy`'s builder stage with `builder`.
    pub fn builder_tar(&self, candy: &str, builder: &str) -> Result<Vec<u8>, String> {
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

    /// The package files (name, bytes) of `candy`'s local `format` package:
    /// the one built in the box's base image.
    pub fn local_packages(
        &self,
        candy: &str,
        format: &str,
    ) -> Result<Vec<(String, Vec<u8>)>, String> {
        let what = format!("local {format} package of {candy}");
        let v = self
            .output(
                &what,
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
