//! The scheduler: runs the graph's nodes in dependency order on a thread
//! pool, memoized by the store.
//!
//! A node is ready when all its dependencies are done. Up to `jobs` ready
//! nodes run at once. Each node first looks for a record under its key (a hit
//! is `cached` and never reaches the runner); a miss takes the key's
//! cross-process lock, looks again (another process may have just built it),
//! runs, stores its outputs, then commits the record. At the first failure no
//! new node starts; running ones finish; everything left is reported as not
//! attempted, by name. `dry_run` computes states without running anything.

use crate::exec::{self, Ctx};
use crate::graph::Graph;
use petgraph::Direction;
use petgraph::stable_graph::NodeIndex;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub use crate::report::{NodeReport, Observer, Quiet, State};

/// Counts per state.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Totals {
    /// Nodes.
    pub nodes: usize,
    /// Ran.
    pub ran: usize,
    /// Cached (local store).
    pub cached: usize,
    /// Pulled from the remote cache.
    pub pulled: usize,
    /// Failed.
    pub failed: usize,
    /// Not attempted.
    pub not_attempted: usize,
    /// Would run (dry run).
    pub would_run: usize,
    /// Wall time of the whole schedule.
    pub wall_ms: u64,
}

/// The result of a schedule.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// Every node, in topological order.
    pub nodes: Vec<NodeReport>,
    /// Each node's index in the graph that ran, beside `nodes`: what links
    /// a report to its node without going through its text id. Empty for a
    /// run the journal answered, and shorter than `nodes` when reports of
    /// nodes outside the graph were appended after the run
    /// (the reports of boxes carried over from the last run): `index[i]`
    /// is `nodes[i]`'s for every `i` it has.
    #[serde(skip)]
    pub index: Vec<NodeIndex>,
    /// Counts.
    pub totals: Totals,
    /// What the remote cache did (when there is one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote: Option<charly_cache::RemoteReport>,
    /// The run's critical path and how much of its work overlapped (when
    /// something ran).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub critical: Option<Critical>,
}

/// The chain of dependent nodes that took longest, and the parallelism of
/// the run: no number of workers makes a run shorter than its critical
/// path, and `work / wall` says how many nodes ran at once on average.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Critical {
    /// The nodes that ran on the longest chain, first to last (cached
    /// nodes on it took no time and are left out).
    pub path: Vec<String>,
    /// Their durations added up.
    pub path_ms: u64,
    /// Every node that ran (or failed), durations added up.
    pub work_ms: u64,
}

impl Critical {
    /// The longest chain through `graph` by the durations of the nodes
    /// that ran in `s` (a summary of a run of `graph`), `order` being the
    /// graph's topological order; `None` when nothing ran.
    pub fn of(graph: &Graph, order: &[NodeIndex], s: &Summary) -> Option<Critical> {
        let mut costs = vec![0u64; petgraph::visit::NodeIndexable::node_bound(&graph.g)];
        for (r, i) in s.nodes.iter().zip(&s.index) {
            if matches!(r.state, State::Ran | State::Failed)
                && let Some(c) = costs.get_mut(i.index())
            {
                *c = r.duration_us;
            }
        }
        let cost = |i: NodeIndex| -> u64 { costs.get(i.index()).copied().unwrap_or(0) };
        let work_us: u64 = order.iter().map(|&i| cost(i)).sum();
        if work_us == 0 {
            return None;
        }
        // finish[i]: the longest chain ending at i; from[i]: its previous node.
        let mut finish: std::collections::HashMap<NodeIndex, (u64, Option<NodeIndex>)> =
            std::collections::HashMap::with_capacity(order.len());
        let mut end = (0u64, None);
        for &i in order {
            let best = graph
                .g
                .neighbors_directed(i, Direction::Incoming)
                .filter_map(|d| finish.get(&d).map(|(f, _)| (*f, d)))
                .max_by_key(|(f, d)| (*f, std::cmp::Reverse(graph.g[*d].id.clone())));
            let f = cost(i) + best.map_or(0, |(f, _)| f);
            finish.insert(i, (f, best.map(|(_, d)| d)));
            if f > end.0 {
                end = (f, Some(i));
            }
        }
        let mut path = Vec::new();
        let mut at = end.1;
        while let Some(i) = at {
            if cost(i) > 0 {
                path.push(graph.g[i].id.clone());
            }
            at = finish.get(&i).and_then(|(_, from)| *from);
        }
        path.reverse();
        Some(Critical {
            path,
            path_ms: end.0 / 1000,
            work_ms: work_us / 1000,
        })
    }
}

impl Summary {
    /// Whether nothing failed (with `--remote-required`, also nothing
    /// remote: a failed upload or an unreachable remote fails the build).
    pub fn ok(&self) -> bool {
        self.totals.failed == 0
            && self.totals.not_attempted == 0
            && !self
                .remote
                .as_ref()
                .is_some_and(|r| r.required && r.has_failures())
    }

    /// The summary of a run answered by the no-op journal
    /// ([`crate::journal`]): every node cached under its recorded key.
    pub fn replayed(o: &crate::journal::Outcome, wall_ms: u64) -> Summary {
        let nodes: Vec<NodeReport> = o
            .nodes
            .iter()
            .map(|(id, kind, key)| NodeReport::cached(id.clone(), *kind, *key))
            .collect();
        Summary {
            totals: Totals {
                nodes: nodes.len(),
                cached: nodes.len(),
                wall_ms,
                ..Totals::default()
            },
            nodes,
            index: Vec::new(),
            remote: None,
            critical: None,
        }
    }

    /// The journal outcome of this (successful) run, with what it printed.
    pub fn outcome(&self, stdout: Vec<String>) -> crate::journal::Outcome {
        crate::journal::Outcome {
            nodes: self
                .nodes
                .iter()
                .map(|n| (n.id.clone(), n.kind, n.key))
                .collect(),
            stdout,
            ..crate::journal::Outcome::default()
        }
    }

    /// The report of a node.
    pub fn get(&self, id: &str) -> Option<&NodeReport> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// Chrome trace-event JSON (opens in Perfetto / chrome://tracing).
    pub fn chrome_trace(&self) -> serde_json::Value {
        let events: Vec<serde_json::Value> = self
            .nodes
            .iter()
            .filter(|n| {
                matches!(
                    n.state,
                    State::Ran | State::Cached | State::Pulled | State::Failed
                )
            })
            .map(|n| {
                serde_json::json!({
                    "name": n.id,
                    "cat": n.kind.as_str(),
                    "ph": "X",
                    "ts": n.start_us,
                    "dur": n.duration_us.max(1),
                    "pid": 1,
                    "tid": n.thread,
                    "args": {"state": n.state, "key": n.key},
                })
            })
            .collect();
        serde_json::json!({ "traceEvents": events, "displayTimeUnit": "ms" })
    }
}

/// Nodes whose records the store is asked about together.
const LOOKUP_CHUNK: usize = 256;

/// The most nodes run at once, whatever `jobs` asks: each is a thread
/// that mostly waits (on podman, a remote); past this many they only cost
/// memory and start-up time (`-j 100000` used to start 100,000 threads).
pub const MAX_JOBS: usize = 256;

/// Runs the graph, telling `ctx.obs` (if any) what happens, at most `jobs`
/// (and [`MAX_JOBS`]) nodes at once.
pub fn run(graph: &Graph, ctx: &Ctx<'_>, jobs: usize, dry_run: bool) -> Summary {
    let obs: &dyn Observer = ctx.obs.unwrap_or(&Quiet);
    let t0 = Instant::now();
    let order = graph.topo().unwrap_or_default();
    let mut reports = Reports::new(&order);
    if dry_run {
        let in_store = in_store(graph, ctx, &order, None);
        for i in &order {
            let n = &graph.g[*i];
            let cached = deps_cached(graph, *i, &reports) && in_store[i.index()];
            let r = NodeReport {
                state: if cached {
                    State::Cached
                } else {
                    State::WouldRun
                },
                ..NodeReport::cached(n.id.clone(), n.kind, n.key)
            };
            obs.finished(&r);
            reports.insert(*i, r);
        }
        return summarize(reports, t0.elapsed());
    }

    // More threads than nodes would only wait.
    let jobs = jobs.clamp(1, MAX_JOBS).min(order.len().max(1));
    let pool = match rayon::ThreadPoolBuilder::new().num_threads(jobs).build() {
        Ok(p) => p,
        Err(e) => {
            let why = format!("cannot start worker threads: {e}");
            return summarize(all_failed(graph, &order, &why), t0.elapsed());
        }
    };
    let mut waiting: BTreeMap<NodeIndex, usize> = order
        .iter()
        .map(|i| {
            (
                *i,
                graph.g.neighbors_directed(*i, Direction::Incoming).count(),
            )
        })
        .collect();
    // Ready nodes in id order, so runs are reproducible.
    let mut ready: std::collections::BTreeSet<(String, NodeIndex)> = waiting
        .iter()
        .filter(|(_, d)| **d == 0)
        .map(|(i, _)| (graph.g[*i].id.clone(), *i))
        .collect();
    // A node found in the store is reported the moment it is ready, on
    // this thread: at tens of thousands of cached nodes the round trip
    // through a worker (a task, a channel, two thread wake-ups) cost more
    // than the lookup. A lookup that fails or misses leaves the node to a
    // worker, which looks again and reports what it finds.
    let cached = in_store(graph, ctx, &order, Some(&pool));
    let (tx, rx) = mpsc::channel::<(NodeIndex, NodeReport)>();
    let mut running = 0usize;
    let mut failed = false;
    pool.in_place_scope(|s| {
        loop {
            while !failed && running < jobs {
                let Some((_, i)) = ready.pop_first() else {
                    break;
                };
                if cached[i.index()] {
                    let n = &graph.g[i];
                    let mut r = NodeReport::cached(n.id.clone(), n.kind, n.key);
                    r.start_us = t0.elapsed().as_micros() as u64;
                    obs.finished(&r);
                    release(graph, i, &mut waiting, &mut ready);
                    reports.insert(i, r);
                    continue;
                }
                running += 1;
                let tx = tx.clone();
                s.spawn(move |_| {
                    let _ = tx.send((i, run_node(graph, ctx, i, obs, t0)));
                });
            }
            if running == 0 {
                break;
            }
            let Ok((i, r)) = rx.recv() else { break };
            running -= 1;
            obs.finished(&r);
            if r.state == State::Failed {
                failed = true;
            } else {
                release(graph, i, &mut waiting, &mut ready);
            }
            reports.insert(i, r);
        }
    });
    for i in &order {
        if reports.get(*i).is_some() {
            continue;
        }
        let n = &graph.g[*i];
        reports.insert(
            *i,
            NodeReport {
                state: State::NotAttempted,
                ..NodeReport::cached(n.id.clone(), n.kind, n.key)
            },
        );
    }
    let mut summary = summarize(reports, t0.elapsed());
    summary.critical = Critical::of(graph, &order, &summary);
    summary
}

/// Which of `order`'s nodes have a record in the store under their key
/// (by node index): a node whose record is there is cached whenever its
/// turn comes (its key names everything it depends on). The lookups run in
/// parallel up front, in chunks the store answers in one read transaction
/// each.
fn in_store(
    graph: &Graph,
    ctx: &Ctx<'_>,
    order: &[NodeIndex],
    pool: Option<&rayon::ThreadPool>,
) -> Vec<bool> {
    use rayon::prelude::*;
    let seen = charly_cache::SeenBlobs::default();
    let look = || -> Vec<(usize, bool)> {
        order
            .par_chunks(LOOKUP_CHUNK)
            .flat_map_iter(|chunk| {
                let nodes: Vec<&crate::graph::Node> = chunk.iter().map(|i| &graph.g[*i]).collect();
                let hits = exec::are_cached(ctx, &nodes, &seen);
                chunk.iter().map(|i| i.index()).zip(hits)
            })
            .collect()
    };
    let found = match pool {
        Some(pool) => pool.install(look),
        None => look(),
    };
    let mut cached = vec![false; order.iter().map(|i| i.index() + 1).max().unwrap_or(0)];
    for (i, hit) in found {
        cached[i] = hit;
    }
    cached
}

/// Every node of `order` failed for `why` (the run could not start).
fn all_failed(graph: &Graph, order: &[NodeIndex], why: &str) -> Reports {
    let mut reports = Reports::new(order);
    for i in order {
        let n = &graph.g[*i];
        reports.insert(
            *i,
            NodeReport {
                state: State::Failed,
                error: Some(why.to_string()),
                ..NodeReport::cached(n.id.clone(), n.kind, n.key)
            },
        );
    }
    reports
}

/// Runs node `i` on a worker and reports it (`t0`: when the run began).
fn run_node(
    graph: &Graph,
    ctx: &Ctx<'_>,
    i: NodeIndex,
    obs: &dyn Observer,
    t0: Instant,
) -> NodeReport {
    let n = &graph.g[i];
    let start = t0.elapsed();
    let thread = rayon::current_thread_index().unwrap_or(0);
    let t = Instant::now();
    let mut reason = None;
    let started = |why: &dyn Fn() -> String| {
        let why = if obs.wants_reason(n.kind) {
            why()
        } else {
            String::new()
        };
        obs.started(&n.id, n.kind, &why);
        reason = Some(why).filter(|w| !w.is_empty());
    };
    let (state, error) = match exec::execute(ctx, graph, i, started) {
        Ok(exec::Done::Ran) => (State::Ran, None),
        Ok(exec::Done::Cached) => (State::Cached, None),
        Ok(exec::Done::Pulled) => (State::Pulled, None),
        Err(e) => (State::Failed, Some(e.to_string())),
    };
    NodeReport {
        id: n.id.clone(),
        kind: n.kind,
        key: n.key,
        state,
        duration_ms: t.elapsed().as_millis() as u64,
        duration_us: t.elapsed().as_micros() as u64,
        candy: None,
        boxes: Vec::new(),
        reason,
        error,
        start_us: start.as_micros() as u64,
        thread,
    }
}

/// The reports of a run, each in its node's place in the run's order, so
/// that the summary's list is this one's storage (at 38,000 nodes a map of
/// reports beside the list it became was the run's memory peak).
struct Reports {
    /// The run's order.
    order: Vec<NodeIndex>,
    /// A node's place in the order, by node index.
    place: Vec<u32>,
    /// The reports, in order.
    at: Vec<Option<NodeReport>>,
}

impl Reports {
    fn new(order: &[NodeIndex]) -> Reports {
        let mut place = vec![u32::MAX; order.iter().map(|i| i.index() + 1).max().unwrap_or(0)];
        for (k, i) in order.iter().enumerate() {
            place[i.index()] = k as u32;
        }
        Reports {
            order: order.to_vec(),
            place,
            at: std::iter::repeat_with(|| None).take(order.len()).collect(),
        }
    }

    /// Records node `i`'s report (a node outside the order has none).
    fn insert(&mut self, i: NodeIndex, r: NodeReport) {
        if let Some(&k) = self.place.get(i.index())
            && let Some(slot) = self.at.get_mut(k as usize)
        {
            *slot = Some(r);
        }
    }

    fn get(&self, i: NodeIndex) -> Option<&NodeReport> {
        let k = *self.place.get(i.index())?;
        self.at.get(k as usize)?.as_ref()
    }
}

/// Node `i` is done: its dependents that wait for nothing else are ready.
fn release(
    graph: &Graph,
    i: NodeIndex,
    waiting: &mut BTreeMap<NodeIndex, usize>,
    ready: &mut std::collections::BTreeSet<(String, NodeIndex)>,
) {
    for n in graph.g.neighbors_directed(i, Direction::Outgoing) {
        if let Some(d) = waiting.get_mut(&n) {
            *d -= 1;
            if *d == 0 {
                ready.insert((graph.g[n].id.clone(), n));
            }
        }
    }
}

fn deps_cached(graph: &Graph, i: NodeIndex, reports: &Reports) -> bool {
    graph
        .g
        .neighbors_directed(i, Direction::Incoming)
        .all(|d| reports.get(d).is_some_and(|r| r.state == State::Cached))
}

fn summarize(reports: Reports, wall: Duration) -> Summary {
    let mut t = Totals::default();
    for r in reports.at.iter().flatten() {
        match r.state {
            State::Ran => t.ran += 1,
            State::Cached => t.cached += 1,
            State::Pulled => t.pulled += 1,
            State::Failed => t.failed += 1,
            State::NotAttempted => t.not_attempted += 1,
            State::WouldRun => t.would_run += 1,
        }
    }
    let index: Vec<NodeIndex> = reports
        .order
        .iter()
        .zip(&reports.at)
        .filter(|(_, r)| r.is_some())
        .map(|(i, _)| *i)
        .collect();
    // Collected in place: the list reuses the reports' storage (`flatten`
    // does not collect in place; `filter_map` does).
    #[allow(clippy::filter_map_identity)]
    let nodes: Vec<NodeReport> = reports.at.into_iter().filter_map(|r| r).collect();
    t.nodes = nodes.len();
    t.wall_ms = wall.as_millis() as u64;
    Summary {
        nodes,
        index,
        totals: t,
        remote: None,
        critical: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::NodeKind;

    fn report(id: &str, state: State) -> NodeReport {
        NodeReport {
            state,
            ..NodeReport::cached(
                id.into(),
                NodeKind::Source,
                charly_cache::NodeKey::from_bytes([0; 32]),
            )
        }
    }

    /// Reports come out in the run's order whatever order they came in;
    /// a node outside the order is not reported; the summary's list is
    /// the reports' own storage.
    #[test]
    fn reports_are_summarized_in_order_in_place() {
        let order: Vec<NodeIndex> = [3, 0, 2].into_iter().map(NodeIndex::new).collect();
        let mut r = Reports::new(&order);
        r.insert(NodeIndex::new(2), report("c", State::Ran));
        r.insert(NodeIndex::new(1), report("outside", State::Ran));
        r.insert(NodeIndex::new(7), report("beyond", State::Ran));
        r.insert(NodeIndex::new(3), report("a", State::Cached));
        assert!(r.get(NodeIndex::new(0)).is_none());
        assert_eq!(r.get(NodeIndex::new(3)).map(|r| r.id.as_str()), Some("a"));
        r.insert(NodeIndex::new(0), report("b", State::Failed));
        let storage = r.at.as_ptr() as usize;
        let s = summarize(r, Duration::ZERO);
        let ids: Vec<&str> = s.nodes.iter().map(|n| n.id.as_str()).collect();
        assert_eq!(ids, ["a", "b", "c"]);
        assert_eq!(s.index, order);
        assert_eq!(
            (
                s.totals.nodes,
                s.totals.cached,
                s.totals.failed,
                s.totals.ran
            ),
            (3, 1, 1, 1)
        );
        assert_eq!(s.nodes.as_ptr() as usize, storage);
    }

    /// A diamond with a slow branch: the critical path takes it, leaves
    /// cached nodes out, and the work is every node that ran.
    #[test]
    fn the_critical_path_is_the_longest_chain_of_nodes_that_ran() {
        use crate::graph::{Graph, Work, add_node};
        use crate::id::NodeId;
        let mut g = Graph {
            g: Default::default(),
            by_id: Default::default(),
            goals: Vec::new(),
            aliases: Default::default(),
            own_inputs_reused: 0,
        };
        let n = |g: &mut Graph, name: &str| add_node(g, NodeId::image(name), Work::Id);
        let (a, b, c, cached, d) = (
            n(&mut g, "a"),
            n(&mut g, "b"),
            n(&mut g, "c"),
            n(&mut g, "cached"),
            n(&mut g, "d"),
        );
        for (x, y) in [(a, b), (a, c), (b, d), (c, cached), (cached, d)] {
            g.g.add_edge(x, y, ());
        }
        let ran = |i: NodeIndex, ms: u64| NodeReport {
            duration_us: ms * 1000,
            ..report(&g.g[i].id, State::Ran)
        };
        let nodes = vec![
            ran(a, 10),
            ran(b, 5),
            ran(c, 20),
            report(&g.g[cached].id, State::Cached),
            ran(d, 1),
        ];
        let order = [a, b, c, cached, d];
        let summary = |nodes: Vec<NodeReport>| Summary {
            nodes,
            index: order.to_vec(),
            totals: Totals::default(),
            remote: None,
            critical: None,
        };
        let got = Critical::of(&g, &order, &summary(nodes)).expect("something ran");
        assert_eq!(got.path, ["image:a", "image:c", "image:d"]);
        assert_eq!((got.path_ms, got.work_ms), (31, 36));
        // Nothing ran: no critical path.
        let idle: Vec<NodeReport> = order
            .iter()
            .map(|&i| report(&g.g[i].id, State::Cached))
            .collect();
        assert_eq!(Critical::of(&g, &order, &summary(idle)), None);
    }
}
