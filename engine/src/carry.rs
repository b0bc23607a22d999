//! Boxes carried over from the last run: `box generate` after an edit
//! derives only the boxes whose inputs changed.
//!
//! The no-op journal replays a run only when nothing changed at all. When
//! something did, its [`Memo`] still holds, per box of the last run, the
//! digest of everything that box's output was derived from
//! ([`Recorder::box_digests`]) and the nodes it had. A box whose digest this
//! run computes the same, and whose build directory (and the shared staging
//! directory, and with `--out` the candy directories its context carries)
//! is exactly as the last run left it, gets the same keys and the same
//! files: its plans are not compiled, its keys not computed, its directory
//! not looked at again. Its nodes are carried into this run's summary and
//! journal as cached under their recorded keys, its outputs into the
//! journal from the memo.
//!
//! Everything else — a box without a trusted digest, a changed one, a box
//! the last run did not have, a touched build directory — is derived as in
//! a full run. The journal's own property test (cli/tests/incremental.rs)
//! holds the result to a run on an empty store, byte for byte and key for
//! key.

use crate::graph::Graph;
use crate::id::NodeId;
use crate::journal::{BoxDigest, BoxEntry, Memo, Recorder};
use crate::sched::{NodeReport, Summary};
use charly_rules::load::Project;
use charly_rules::naming;
use charly_rules::resolve::Resolution;
use rayon::prelude::*;
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// Which of the selected boxes this run derives and which it carries.
#[derive(Debug, Default)]
pub struct Carry {
    /// The selected boxes, in order.
    pub names: Vec<String>,
    /// This run's digest of each selected box (by position).
    pub digests: Vec<Option<BoxDigest>>,
    /// Boxes to derive (selection order).
    pub derive: Vec<String>,
    /// Boxes carried over from the last run (selection order).
    pub carried: Vec<String>,
}

/// Decides, for the boxes `names` written under `out_root`, which the last
/// run's `memo` still answers. Without a memo or a recorder (no journal,
/// plugins in use), every box is derived.
pub fn plan(
    memo: Option<&Memo>,
    rec: Option<&Recorder>,
    p: &Project,
    r: &Resolution,
    names: &[String],
    out_root: &Path,
    context_dirs: &dyn Fn(&str) -> Vec<std::path::PathBuf>,
) -> Carry {
    let _t = crate::timings::phase("carry: plan");
    let td = crate::timings::phase("carry: digests");
    let digests = rec.map_or_else(
        || vec![None; names.len()],
        |rec| rec.box_digests(p, r, names),
    );
    drop(td);
    let mut c = Carry {
        names: names.to_vec(),
        digests,
        ..Carry::default()
    };
    // The staged files outside candies are shared by every box.
    let shared_ok = memo.is_some_and(|m| m.dir_unchanged(&out_root.join(naming::LAYERS_DIR)));
    // Checking a build directory stats each of its files (3,000 `statx` at
    // 1,000 candies × 100 boxes): the boxes are checked in parallel.
    let unchanged: Vec<bool> = match memo.filter(|_| shared_ok) {
        None => vec![false; names.len()],
        Some(m) => {
            let context: Vec<Vec<std::path::PathBuf>> =
                names.iter().map(|n| context_dirs(n)).collect();
            names
                .par_iter()
                .zip(&c.digests)
                .zip(&context)
                .map(|((name, digest), dirs)| {
                    m.box_unchanged(name, digest.as_ref())
                        && m.dir_unchanged(&out_root.join(naming::build_dir(name)))
                        && dirs.iter().all(|d| m.dir_unchanged(d))
                })
                .collect()
        }
    };
    for (name, carried) in names.iter().zip(unchanged) {
        if carried {
            c.carried.push(name.clone());
        } else {
            c.derive.push(name.clone());
        }
    }
    c
}

/// Checks the output directories [`plan`] will ask about (the shared
/// staging directory and each of the last run's boxes' build directories
/// under `out_root`) ahead, beside other work ([`Memo::check_ahead`]).
pub fn check_ahead(memo: &mut Memo, out_root: &Path) {
    let mut dirs = vec![out_root.join(naming::LAYERS_DIR)];
    dirs.extend(
        memo.box_names()
            .map(|n| out_root.join(naming::build_dir(n))),
    );
    memo.check_ahead(dirs);
}

impl Carry {
    /// Adds the carried boxes' nodes to `summary`, cached under their
    /// recorded keys.
    pub fn add_carried(&self, summary: &mut Summary, memo: Option<&Memo>) {
        if let Some(m) = memo.filter(|_| !self.carried.is_empty()) {
            let have: HashSet<&str> = summary.nodes.iter().map(|n| n.id.as_str()).collect();
            let names: Vec<&str> = self.carried.iter().map(String::as_str).collect();
            let carried: Vec<NodeReport> = m
                .carry(&names, &have)
                .into_iter()
                .map(|(id, kind, key)| NodeReport::cached(id, kind, key))
                .collect();
            summary.totals.nodes += carried.len();
            summary.totals.cached += carried.len();
            summary.nodes.extend(carried);
        }
    }

    /// Every selected box's journal entry: its digest and its nodes as
    /// positions in `summary` (with the carried boxes' nodes added,
    /// [`Carry::add_carried`]). Only a run that records a journal needs
    /// them.
    pub fn entries(&self, summary: &Summary, graph: &Graph, memo: Option<&Memo>) -> Vec<BoxEntry> {
        let at: HashMap<&str, u32> = summary
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| u32::try_from(i).ok().map(|i| (n.id.as_str(), i)))
            .collect();
        let goals: HashMap<&str, petgraph::stable_graph::NodeIndex> = graph
            .goals
            .iter()
            .filter_map(|g| match &graph.g[*g].nid {
                NodeId::Containerfile { box_name, .. } => Some((box_name.as_str(), *g)),
                _ => None,
            })
            .collect();
        let carried: HashSet<&str> = self.carried.iter().map(String::as_str).collect();
        // Each box's closure on its own (1,000 boxes at 10,000 candies).
        self.names
            .par_iter()
            .zip(&self.digests)
            .map(|(name, digest)| {
                let ids: Vec<&str> = if carried.contains(name.as_str()) {
                    memo.map(|m| m.box_nodes(name).collect())
                        .unwrap_or_default()
                } else {
                    goals
                        .get(name.as_str())
                        .map(|g| {
                            graph
                                .closure(*g)
                                .into_iter()
                                .map(|i| graph.g[i].id.as_str())
                                .collect()
                        })
                        .unwrap_or_default()
                };
                let mut nodes: Vec<u32> = ids.iter().filter_map(|id| at.get(id).copied()).collect();
                nodes.sort_unstable();
                // A box whose nodes cannot all be named is not carried next
                // time (its digest is dropped).
                let complete = nodes.len() == ids.len() && !ids.is_empty();
                BoxEntry {
                    name: name.clone(),
                    digest: digest.filter(|_| complete),
                    nodes,
                }
            })
            .collect()
    }
}
