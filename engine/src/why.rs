//! Why a node runs: its key inputs against the last record of the same node
//! (any of its ids: a shared layer's last record may carry a sibling box's
//! id). `explain` renders it with causes; the scheduler reports it as each
//! node starts.

use crate::graph::Graph;
use crate::key::{Change, KeyInputs, diff};
use charly_cache::Store;
use petgraph::stable_graph::NodeIndex;

/// What the last build of a node was, against its key now.
#[derive(Clone, Debug)]
pub enum Since {
    /// No record of this node at all.
    NeverBuilt,
    /// The last record (its time) and what changed since.
    Changed {
        /// When it was recorded (seconds since the epoch).
        recorded_unix: u64,
        /// What changed.
        changes: Vec<Change>,
        /// That record (its outputs, for explanations that compare them).
        last: Box<charly_cache::Record>,
    },
}

/// The key inputs a record was made with (`None`: an older key schema's).
/// Decoded in place: a layer's inputs carry its whole text.
fn recorded_inputs(rec: &charly_cache::Record) -> Option<KeyInputs> {
    serde::Deserialize::deserialize(&rec.key_inputs).ok()
}

/// What changed for node `i` since its last record.
pub fn since_last(store: &Store, graph: &Graph, i: NodeIndex) -> Since {
    let last = graph
        .ids_of(i)
        .into_iter()
        .filter_map(|id| store.last_record_for(&id).ok().flatten())
        .max_by_key(|(_, r)| r.created_unix);
    since(graph, i, last.map(|(_, r)| r))
}

/// What changed for node `i` since the record the last build of a box
/// used for it (found from the box's GC root, `box:<name>`, through the
/// recorded dependencies): after a revert that found everything cached,
/// that is the reverted state, not the newer record the revert left
/// behind. A node no build root reaches falls back to [`since_last`].
pub fn since_in_use(store: &Store, graph: &Graph, i: NodeIndex) -> Since {
    match in_use(store, graph, i) {
        Some(rec) => since(graph, i, Some(rec)),
        None => since_last(store, graph, i),
    }
}

/// The record of node `i` that the last build of a box used: a walk from
/// each `box:<name>` root down the recorded dependencies.
fn in_use(store: &Store, graph: &Graph, i: NodeIndex) -> Option<charly_cache::Record> {
    let ids: Vec<String> = graph.ids_of(i);
    let roots = store.roots().ok()?;
    let mut seen = std::collections::HashSet::new();
    let mut queue: std::collections::VecDeque<charly_cache::NodeKey> = roots
        .into_iter()
        .filter(|(name, _)| name.starts_with("box:") && !name.contains('#'))
        .map(|(_, key)| key)
        .collect();
    while let Some(key) = queue.pop_front() {
        if !seen.insert(key) || seen.len() > 10_000 {
            continue;
        }
        let Ok(Some(rec)) = store.get_record(&key) else {
            continue;
        };
        if ids.contains(&rec.node_id) {
            return Some(rec);
        }
        if let Some(inputs) = recorded_inputs(&rec) {
            queue.extend(
                inputs
                    .deps
                    .values()
                    .filter_map(|k| k.parse::<charly_cache::NodeKey>().ok()),
            );
        }
    }
    None
}

/// What changed for node `i` since `last` (none: never built).
fn since(graph: &Graph, i: NodeIndex, last: Option<charly_cache::Record>) -> Since {
    let n = &graph.g[i];
    let Some(last) = last else {
        return Since::NeverBuilt;
    };
    let changes = match recorded_inputs(&last) {
        Some(old) => diff(&old, &n.inputs()),
        None => vec![Change::OlderSchema],
    };
    // Dependencies named by role become the node they are now.
    let changes = changes
        .into_iter()
        .map(|c| match c {
            Change::Dep { id, old, new } => Change::Dep {
                id: graph.dep_id(i, &id),
                old,
                new,
            },
            c => c,
        })
        .collect();
    Since::Changed {
        recorded_unix: last.created_unix,
        changes,
        last: Box::new(last),
    }
}

/// One line: why node `i` runs (`never built`, or its changes, inputs of
/// its own before rebuilt dependencies, at most three named). A rebuilt
/// source dependency is replaced by what changed in it (the file), read
/// from the source's record under its old key: by the time a node runs its
/// sources are already recorded anew.
pub fn reason(store: &Store, graph: &Graph, i: NodeIndex) -> String {
    match since_last(store, graph, i) {
        Since::NeverBuilt => "never built".into(),
        Since::Changed { changes, .. } if changes.is_empty() => {
            "its record is gone (collected or never committed)".into()
        }
        Since::Changed { changes, .. } => {
            // What the user edited first (the files of rebuilt sources),
            // then the node's own inputs, then rebuilt dependencies.
            let mut edited = Vec::new();
            let mut own = Vec::new();
            let mut deps = Vec::new();
            for c in changes {
                match source_changes(store, graph, &c) {
                    Some(s) => edited.extend(s),
                    None if matches!(c, Change::Dep { .. }) => deps.push(c),
                    None => own.push(c),
                }
            }
            let mut changes: Vec<Change> = edited.into_iter().chain(own).chain(deps).collect();
            changes.dedup();
            // One line each: a text change's diff lines are for `explain`.
            let mut parts: Vec<String> = changes
                .iter()
                .take(3)
                .map(|c| c.to_string().lines().next().unwrap_or("").to_string())
                .collect();
            if changes.len() > 3 {
                parts.push(format!("{} more", changes.len() - 3));
            }
            parts.join("; ")
        }
    }
}

/// What changed inside a rebuilt source dependency, when `c` is one.
fn source_changes(store: &Store, graph: &Graph, c: &Change) -> Option<Vec<Change>> {
    let Change::Dep {
        id,
        old: Some(old),
        new: Some(_),
    } = c
    else {
        return None;
    };
    let dep = graph.node(id)?;
    if dep.kind != crate::key::NodeKind::Source {
        return None;
    }
    let rec = store.get_record(&old.parse().ok()?).ok()??;
    let changes = diff(&recorded_inputs(&rec)?, &dep.inputs());
    (!changes.is_empty()).then_some(changes)
}
