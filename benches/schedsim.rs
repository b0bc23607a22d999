//! `schedsim`: how long a cold build of a project's graph would take on N
//! workers (issue "layers run on a Remote Execution engine", item 5).
//!
//! ```text
//! charly -C PROJECT graph --format json > graph.json
//! charly -C EXAMPLE box build --all --summary-json run.json     # a real run
//! cargo run --release -p charly-suite --bin schedsim -- graph.json run.json 1 4 16 64
//! ```
//!
//! Every node of `graph.json` costs its duration in `run.json` when the run
//! recorded the same node id; otherwise the median of the recorded nodes of
//! its kind (`layer`, `builder-stage`, …) that ran, and 0 for kinds the run
//! has none of that ran (nodes a build does not execute: sources, images
//! assembled in milliseconds). The output says how many nodes were costed
//! each way. The schedule is list scheduling by longest remaining path
//! (a node's own duration plus the longest chain below it), the classic
//! HLFET heuristic: with unbounded workers it finishes at the critical path,
//! with one at the sum of all work. The rows are what a scheduler that
//! keeps `N` actions in flight (`--remote-jobs N`) could achieve if the
//! engine had `N` workers and moving inputs cost nothing.

use std::collections::{BTreeMap, BinaryHeap};

/// A graph to schedule: per node its cost and the nodes it needs.
#[derive(Debug, Default)]
struct Graph {
    ids: Vec<String>,
    cost_ms: Vec<u64>,
    deps: Vec<Vec<usize>>,
}

/// Per node, its cost plus the longest chain of costs of the nodes that
/// need it (its "bottom level").
fn bottom_levels(g: &Graph) -> Result<Vec<u64>, String> {
    let n = g.ids.len();
    let mut users = vec![Vec::new(); n];
    let mut pending = vec![0usize; n];
    for (i, ds) in g.deps.iter().enumerate() {
        for &d in ds {
            users[d].push(i);
        }
    }
    // Reverse topological order: nodes nobody needs first.
    for (i, us) in users.iter().enumerate() {
        pending[i] = us.len();
    }
    let mut ready: Vec<usize> = (0..n).filter(|&i| pending[i] == 0).collect();
    let mut level = vec![0u64; n];
    let mut seen = 0;
    while let Some(i) = ready.pop() {
        seen += 1;
        let below = users[i].iter().map(|&u| level[u]).max().unwrap_or(0);
        level[i] = g.cost_ms[i] + below;
        for &d in &g.deps[i] {
            pending[d] -= 1;
            if pending[d] == 0 {
                ready.push(d);
            }
        }
    }
    if seen != n {
        return Err("the graph has a cycle".into());
    }
    Ok(level)
}

/// The makespan of list-scheduling `g` on `workers` workers.
fn schedule(g: &Graph, workers: usize) -> Result<u64, String> {
    let n = g.ids.len();
    let level = bottom_levels(g)?;
    let mut users = vec![Vec::new(); n];
    let mut missing: Vec<usize> = g.deps.iter().map(Vec::len).collect();
    for (i, ds) in g.deps.iter().enumerate() {
        for &d in ds {
            users[d].push(i);
        }
    }
    // Ready nodes, longest remaining path first (ties: lowest index).
    let mut ready: BinaryHeap<(u64, std::cmp::Reverse<usize>)> = (0..n)
        .filter(|&i| missing[i] == 0)
        .map(|i| (level[i], std::cmp::Reverse(i)))
        .collect();
    // Running nodes by finish time.
    let mut running: BinaryHeap<std::cmp::Reverse<(u64, usize)>> = BinaryHeap::new();
    let (mut now, mut done) = (0u64, 0usize);
    while done < n {
        while running.len() < workers.max(1) {
            let Some((_, std::cmp::Reverse(i))) = ready.pop() else {
                break;
            };
            running.push(std::cmp::Reverse((now + g.cost_ms[i], i)));
        }
        let Some(std::cmp::Reverse((t, i))) = running.pop() else {
            return Err("nothing runs and nothing is ready: a cycle".into());
        };
        now = t;
        done += 1;
        for &u in &users[i] {
            missing[u] -= 1;
            if missing[u] == 0 {
                ready.push((level[u], std::cmp::Reverse(u)));
            }
        }
    }
    Ok(now)
}

fn median(v: &mut [u64]) -> u64 {
    v.sort_unstable();
    if v.is_empty() { 0 } else { v[v.len() / 2] }
}

/// Reads the graph and costs it from the run (module docs); returns the
/// graph and, per way of costing, how many nodes were costed so.
fn load(
    graph: &serde_json::Value,
    run: &serde_json::Value,
) -> Result<(Graph, BTreeMap<String, usize>), String> {
    let nodes = graph["nodes"]
        .as_array()
        .ok_or("the graph JSON has no `nodes` (charly graph --format json)")?;
    let ran = run["nodes"]
        .as_array()
        .ok_or("the run JSON has no `nodes` (box build --summary-json)")?;
    let mut recorded: BTreeMap<&str, u64> = BTreeMap::new();
    let mut by_kind: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for r in ran {
        if r["state"] != "ran" {
            continue;
        }
        let (Some(id), Some(kind), Some(ms)) = (
            r["id"].as_str(),
            r["kind"].as_str(),
            r["duration_ms"].as_u64(),
        ) else {
            continue;
        };
        recorded.insert(id, ms);
        by_kind.entry(kind).or_default().push(ms);
    }
    let medians: BTreeMap<&str, u64> = by_kind
        .into_iter()
        .map(|(k, mut v)| (k, median(&mut v)))
        .collect();
    let index: BTreeMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .filter_map(|(i, n)| Some((n["id"].as_str()?, i)))
        .collect();
    let mut g = Graph::default();
    let mut how = BTreeMap::new();
    for n in nodes {
        let id = n["id"].as_str().ok_or("a node without an id")?;
        let kind = n["kind"].as_str().unwrap_or("");
        let (cost, way) = match (recorded.get(id), medians.get(kind)) {
            (Some(&ms), _) => (ms, "recorded".to_string()),
            (None, Some(&ms)) => (ms, format!("median of the run's {kind} nodes")),
            (None, None) => (0, format!("{kind}: none ran in the run, 0 ms")),
        };
        *how.entry(way).or_insert(0) += 1;
        let mut deps = Vec::new();
        for d in n["deps"].as_array().into_iter().flatten() {
            let d = d.as_str().ok_or("a dependency that is not an id")?;
            deps.push(
                *index
                    .get(d)
                    .ok_or_else(|| format!("{id} needs {d}, which the graph does not have"))?,
            );
        }
        g.ids.push(id.to_string());
        g.cost_ms.push(cost);
        g.deps.push(deps);
    }
    Ok((g, how))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 2 || args.iter().any(|a| a == "-h" || a == "--help") {
        eprintln!("usage: schedsim GRAPH.json RUN.json [WORKERS…] (see benches/schedsim.rs)");
        std::process::exit(2);
    }
    let read = |p: &str| -> serde_json::Value {
        let text = std::fs::read(p).unwrap_or_else(|e| {
            eprintln!("schedsim: {p}: {e}");
            std::process::exit(1)
        });
        serde_json::from_slice(&text).unwrap_or_else(|e| {
            eprintln!("schedsim: {p}: {e}");
            std::process::exit(1)
        })
    };
    let workers: Vec<usize> = if args.len() > 2 {
        args[2..]
            .iter()
            .map(|w| {
                w.parse().unwrap_or_else(|_| {
                    eprintln!("schedsim: `{w}` is not a number of workers");
                    std::process::exit(2)
                })
            })
            .collect()
    } else {
        vec![1, 4, 16, 64]
    };
    let (g, how) = load(&read(&args[0]), &read(&args[1])).unwrap_or_else(|e| {
        eprintln!("schedsim: {e}");
        std::process::exit(1)
    });
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for id in &g.ids {
        let kind = id.split(':').next().unwrap_or("");
        *kinds.entry(kind.to_string()).or_insert(0) += 1;
    }
    println!("nodes: {} ({kinds:?})", g.ids.len());
    for (way, count) in &how {
        println!("  costed by {way}: {count}");
    }
    let work: u64 = g.cost_ms.iter().sum();
    let critical = bottom_levels(&g)
        .unwrap_or_else(|e| {
            eprintln!("schedsim: {e}");
            std::process::exit(1)
        })
        .into_iter()
        .max()
        .unwrap_or(0);
    println!(
        "work {:.1} s, critical path {:.1} s (no schedule is shorter)",
        work as f64 / 1000.0,
        critical as f64 / 1000.0
    );
    println!("workers  makespan   speedup vs 1");
    for w in workers {
        let t = schedule(&g, w).unwrap_or_else(|e| {
            eprintln!("schedsim: {e}");
            std::process::exit(1)
        });
        println!(
            "{w:>7}  {:>7.1} s  {:>6.2}x",
            t as f64 / 1000.0,
            work as f64 / t.max(1) as f64
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// a → b → c (a chain of 10 + 20 + 30) beside four independent nodes
    /// of 15 each, all needing a.
    fn graph() -> Graph {
        let mut g = Graph::default();
        let mut add = |id: &str, ms: u64, deps: Vec<usize>| {
            g.ids.push(id.into());
            g.cost_ms.push(ms);
            g.deps.push(deps);
        };
        add("a", 10, vec![]);
        add("b", 20, vec![0]);
        add("c", 30, vec![1]);
        for i in 0..4 {
            add(&format!("x{i}"), 15, vec![0]);
        }
        g
    }

    #[test]
    fn one_worker_takes_all_the_work_and_many_the_critical_path() {
        let g = graph();
        assert_eq!(schedule(&g, 1).unwrap(), 10 + 20 + 30 + 4 * 15);
        assert_eq!(schedule(&g, 64).unwrap(), 60);
        assert_eq!(bottom_levels(&g).unwrap()[0], 60);
    }

    /// Two workers: the chain first (longest path), the four short nodes on
    /// the other worker (10 + 4 × 15 = 70) — never the chain last.
    #[test]
    fn the_longest_remaining_path_goes_first() {
        assert_eq!(schedule(&graph(), 2).unwrap(), 70);
    }

    #[test]
    fn costs_come_from_the_run_or_the_median_of_its_kind() {
        let graph = serde_json::json!({"nodes": [
            {"id": "layer:a/x", "kind": "layer", "deps": []},
            {"id": "layer:b/y", "kind": "layer", "deps": ["layer:a/x"]},
            {"id": "image:b", "kind": "image", "deps": ["layer:b/y"]},
        ]});
        let run = serde_json::json!({"nodes": [
            {"id": "layer:a/x", "kind": "layer", "state": "ran", "duration_ms": 7},
            {"id": "layer:q/z", "kind": "layer", "state": "ran", "duration_ms": 100},
            {"id": "layer:q/w", "kind": "layer", "state": "cached", "duration_ms": 1},
        ]});
        let (g, how) = load(&graph, &run).unwrap();
        assert_eq!(g.cost_ms, vec![7, 100, 0]);
        assert_eq!(g.deps, vec![vec![], vec![0], vec![1]]);
        assert_eq!(how.values().sum::<usize>(), 3);
        assert_eq!(how["recorded"], 1);
        let bad = serde_json::json!({"nodes": [{"id": "a", "kind": "layer", "deps": ["gone"]}]});
        assert!(load(&bad, &run).unwrap_err().contains("gone"));
    }

    #[test]
    fn a_cycle_is_refused() {
        let mut g = graph();
        g.deps[0].push(2);
        assert!(schedule(&g, 2).is_err());
    }
}
