//! No-op benchmarks over generated scale projects (`scalegen_lib.rs`).
//!
//! For each size (100×10 and 1,000×100; 10,000×1,000 with
//! `CHARLY_BENCH_HUGE=1`) the project is generated once into a temp dir and
//! built cold once into a fresh store (fake runner), outside the measurement.
//! Then, measured:
//!
//! * `noop-generate/SIZE`: the whole no-op `box generate --all` through the
//!   library, as the CLI does it: open the store and the stat cache, load,
//!   resolve, build the graph (plans, keys), run it (every node cached) and
//!   write the build directories (each already holds its key: checked only).
//! * `noop-journal/SIZE`: what the CLI's no-op actually costs: the no-op
//!   journal's check (stat every input and output, compare, replay) over
//!   the same project, recorded once after a full no-op run.
//! * `noop-build-dry-run/SIZE`: the same for `box build --all --dry-run`
//!   (`Goal::Build`, after one real build with the fake runner).
//! * `noop-phases/SIZE/*`: each phase of the no-op generate alone
//!   (open, load, resolve, graph, run, write), the others prepared outside;
//!   plus `plan-all-boxes` (plan compilation of every box) and
//!   `containerfile-cold-all-boxes` (rendering every box's Containerfile
//!   in memory, which is what a cold generate does per box; the memoized
//!   generate is `noop-generate`).
//! * `keys/*`: key computation for a graph of about 10,000 nodes
//!   (3,000×300): `graph` = `Engine::graph` (plans + stat-cached source
//!   digests + every key), `encode` = `KeyInputs::key()` of every node.
//!
//! Every measured no-op asserts that nothing ran.
//!
//! Hidden mode for `benches/compare.sh`: with `CHARLY_BENCH_HASH_DIR=DIR`
//! the binary hashes every file under DIR with `charly_engine::hash::hash_file`
//! (sequentially, and on one thread per core as the graph's source nodes
//! do), prints the throughput and exits without running criterion.
//!
//! ```sh
//! cargo bench -p charly-suite --bench noop
//! CHARLY_BENCH_HUGE=1 cargo bench -p charly-suite --bench noop -- noop-generate/10000
//! cargo bench -p charly-suite --bench noop -- --warm-up-time 1 --measurement-time 3   # CI smoke
//! ```

#[path = "scalegen_lib.rs"]
#[allow(dead_code)]
mod scalegen_lib;

use charly_engine::api::Engine;
use charly_engine::cache::Store;
use charly_engine::generate::{image_refs, render};
use charly_engine::graph::{Goal, Graph};
use charly_engine::hash::{FileHasher, hash_file};
use charly_engine::journal::{Journal, Scope};
use charly_engine::runners::Runner as _;
use charly_engine::runners::fake::FakeRunner;
use charly_engine::sched::{Quiet, Summary};
use charly_rules::emit::EmitOptions;
use charly_rules::load::{LoadOptions, Project, load};
use charly_rules::plan::{HostContext, build_merged_plan};
use charly_rules::resolve::ResolvedBox;
use charly_rules::resolve::{Resolution, resolve};
use criterion::{BenchmarkId, Criterion};
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A generated project with a warm store.
struct Fixture {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    store: PathBuf,
    label: String,
}

fn jobs() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

fn boxes_of(r: &Resolution) -> Vec<String> {
    r.boxes
        .iter()
        .filter(|(_, b)| b.as_ref().is_ok_and(|b| b.enabled))
        .map(|(n, _)| n.clone())
        .collect()
}

/// One whole `box generate --all` (or `box build --all [--dry-run]`) through
/// the library API, as the CLI runs it.
fn run_once(root: &Path, store_dir: &Path, goal: &Goal, dry_run: bool) -> Summary {
    let store = Store::open(store_dir).expect("store opens");
    let hasher = FileHasher::with_cache_file(store_dir.join("statcache.bin"));
    let p = load(root, &LoadOptions::default()).expect("generated project loads");
    let r = resolve(&p);
    let runner = FakeRunner::new();
    let engine = Engine {
        project: &p,
        resolution: &r,
        store: &store,
        runner: Some(&runner),
        hasher: &hasher,
        opts: charly_engine::graph::GraphOptions::new(runner.name(), "amd64"),
        remote: None,
        own_inputs: None,
    };
    let boxes = boxes_of(&r);
    let graph = engine.graph(goal, &boxes).expect("graph builds");
    let s = engine.run(&graph, &p.root, jobs(), dry_run, &Quiet);
    assert!(s.ok(), "run failed: {:?}", s.totals);
    if *goal == Goal::Generate {
        let written = engine
            .write_build_dirs(&graph, &p.root, false)
            .expect("build dirs");
        assert_eq!(written.len(), boxes.len());
    }
    s
}

fn fixture(candies: usize, boxes: usize) -> Fixture {
    let tmp = tempfile::Builder::new()
        .prefix("charly-noop-")
        .tempdir()
        .expect("temp dir");
    let root = tmp.path().join("project");
    let store = tmp.path().join("store");
    let t = Instant::now();
    let spec = scalegen_lib::Spec {
        candies,
        boxes,
        ninja: false,
    };
    let g = scalegen_lib::generate(&root, &spec).expect("generate the project");
    let t_gen = t.elapsed();

    // Every box resolves; the project has no errors.
    let p = load(&root, &LoadOptions::default()).expect("loads");
    let r = resolve(&p);
    let bad: Vec<&String> = r
        .boxes
        .iter()
        .filter(|(_, b)| b.is_err())
        .map(|(n, _)| n)
        .collect();
    assert!(bad.is_empty(), "boxes that do not resolve: {bad:?}");
    assert_eq!(r.boxes.len(), boxes);

    let t = Instant::now();
    let cold = run_once(&root, &store, &Goal::Generate, false);
    let t_cold = t.elapsed();
    assert_eq!(
        cold.totals.nodes, g.generate_nodes,
        "charly's graph matches the generator's (and build.ninja's) node count"
    );
    let t = Instant::now();
    let cold_build = run_once(&root, &store, &Goal::Build, false);
    let t_build = t.elapsed();
    let warm = run_once(&root, &store, &Goal::Generate, false);
    assert_eq!(warm.totals.ran, 0, "second generate is a no-op");
    let dry = run_once(&root, &store, &Goal::Build, true);
    assert_eq!(dry.totals.would_run, 0, "dry run after a build: all cached");
    eprintln!(
        "noop {candies}x{boxes}: {} files, {:.1} MiB generated in {:.2}s; generate graph {} nodes \
         (cold {:.2}s), build graph {} nodes (cold, fake runner {:.2}s)",
        g.files,
        g.bytes as f64 / (1 << 20) as f64,
        t_gen.as_secs_f64(),
        cold.totals.nodes,
        t_cold.as_secs_f64(),
        cold_build.totals.nodes,
        t_build.as_secs_f64(),
    );
    Fixture {
        _tmp: tmp,
        root,
        store,
        label: format!("{candies}x{boxes}"),
    }
}

fn sizes() -> Vec<(usize, usize)> {
    let mut v = vec![(100, 10), (1000, 100)];
    if std::env::var_os("CHARLY_BENCH_HUGE").is_some_and(|v| v != "0") {
        v.push((10_000, 1000));
    }
    v
}

fn noop_benches(c: &mut Criterion) {
    for (n, m) in sizes() {
        let f = fixture(n, m);
        let mut g = c.benchmark_group("noop-generate");
        if n >= 10_000 {
            g.sample_size(10).measurement_time(Duration::from_secs(20));
        }
        g.bench_function(BenchmarkId::from_parameter(&f.label), |b| {
            b.iter(|| {
                let s = run_once(&f.root, &f.store, &Goal::Generate, false);
                assert_eq!(s.totals.ran, 0);
                black_box(s)
            });
        });
        g.finish();
        // The no-op journal (what `charly box generate --all` does when
        // nothing changed): record once after a full no-op run, then time
        // the check that replays it.
        let journal = {
            let mut j = Journal::new(&f.store, &format!("bench generate {}", f.label));
            j.racy_ns = 0; // the project was generated moments ago
            let scope = Scope::project(&f.root, &[], &f.store);
            let rec = j.begin(&scope.roots, &scope.files, &scope.skip);
            let s = run_once(&f.root, &f.store, &Goal::Generate, false);
            let outputs = vec![f.root.join(".build"), f.root.join(".containerignore")];
            assert!(
                j.record(rec, &outputs, &[], s.outcome(Vec::new()))
                    .expect("journal written")
            );
            j
        };
        let mut g = c.benchmark_group("noop-journal");
        g.bench_function(BenchmarkId::from_parameter(&f.label), |b| {
            b.iter(|| black_box(journal.check().expect("replayed")));
        });
        g.finish();
        let mut g = c.benchmark_group("noop-build-dry-run");
        if n >= 10_000 {
            g.sample_size(10).measurement_time(Duration::from_secs(20));
        }
        g.bench_function(BenchmarkId::from_parameter(&f.label), |b| {
            b.iter(|| {
                let s = run_once(&f.root, &f.store, &Goal::Build, true);
                assert_eq!(s.totals.would_run, 0);
                black_box(s)
            });
        });
        g.finish();
        phase_benches(c, &f, n >= 10_000);
    }
}

/// Each phase of the no-op generate at one size, alone; plus plan
/// compilation and cold (in-memory) Containerfile rendering of every box.
fn phase_benches(c: &mut Criterion, f: &Fixture, huge: bool) {
    let mut g = c.benchmark_group(format!("noop-phases/{}", f.label));
    if huge {
        g.sample_size(10).measurement_time(Duration::from_secs(10));
    }
    g.bench_function("open-store+statcache", |b| {
        b.iter(|| {
            let s = Store::open(&f.store).expect("store");
            let h = FileHasher::with_cache_file(f.store.join("statcache.bin"));
            black_box((s, h))
        });
    });
    g.bench_function("load", |b| {
        b.iter(|| black_box(load(&f.root, &LoadOptions::default()).expect("loads")));
    });
    let p: Project = load(&f.root, &LoadOptions::default()).expect("loads");
    g.bench_function("resolve", |b| b.iter(|| black_box(resolve(&p))));
    let r = resolve(&p);
    let resolved: Vec<&ResolvedBox> = r.boxes.values().filter_map(|b| b.as_ref().ok()).collect();
    let host = HostContext::default();
    g.bench_function("plan-all-boxes", |b| {
        b.iter(|| {
            for rb in &resolved {
                black_box(build_merged_plan(&p, rb, &host, &[]).expect("plan compiles"));
            }
        });
    });
    let opts = EmitOptions {
        image_refs: image_refs(&r),
        ..EmitOptions::default()
    };
    g.bench_function("containerfile-cold-all-boxes", |b| {
        b.iter(|| {
            for rb in &resolved {
                black_box(render(&p, rb, &opts).expect("renders"));
            }
        });
    });
    let store = Store::open(&f.store).expect("store");
    let hasher = FileHasher::with_cache_file(f.store.join("statcache.bin"));
    let runner = FakeRunner::new();
    let engine = Engine {
        project: &p,
        resolution: &r,
        store: &store,
        runner: Some(&runner),
        hasher: &hasher,
        opts: charly_engine::graph::GraphOptions::new(runner.name(), "amd64"),
        remote: None,
        own_inputs: None,
    };
    let boxes = boxes_of(&r);
    g.bench_function("graph+keys", |b| {
        b.iter(|| black_box(engine.graph(&Goal::Generate, &boxes).expect("graph")));
    });
    let graph: Graph = engine.graph(&Goal::Generate, &boxes).expect("graph");
    g.bench_function("run-all-cached", |b| {
        b.iter(|| {
            let s = engine.run(&graph, &p.root, jobs(), false, &Quiet);
            assert_eq!(s.totals.ran, 0);
            black_box(s)
        });
    });
    g.bench_function("write-build-dirs-check", |b| {
        b.iter(|| {
            black_box(
                engine
                    .write_build_dirs(&graph, &p.root, false)
                    .expect("dirs"),
            )
        });
    });
    g.finish();
}

fn key_benches(c: &mut Criterion) {
    // 3,000 candies × 300 boxes ≈ 10,000 nodes in the generate graph.
    let f = fixture(3000, 300);
    let p = load(&f.root, &LoadOptions::default()).expect("loads");
    let r = resolve(&p);
    let store = Store::open(&f.store).expect("store");
    let hasher = FileHasher::with_cache_file(f.store.join("statcache.bin"));
    let runner = FakeRunner::new();
    let engine = Engine {
        project: &p,
        resolution: &r,
        store: &store,
        runner: Some(&runner),
        hasher: &hasher,
        opts: charly_engine::graph::GraphOptions::new(runner.name(), "amd64"),
        remote: None,
        own_inputs: None,
    };
    let boxes = boxes_of(&r);
    let graph = engine.graph(&Goal::Generate, &boxes).expect("graph");
    let nodes = graph.g.node_count();
    eprintln!("keys: generate graph of {}: {nodes} nodes", f.label);
    let mut g = c.benchmark_group(format!("keys/{nodes}-nodes"));
    g.bench_function("graph", |b| {
        b.iter(|| black_box(engine.graph(&Goal::Generate, &boxes).expect("graph")));
    });
    g.bench_function("encode", |b| {
        b.iter(|| {
            for n in graph.g.node_weights() {
                black_box(n.inputs().key());
            }
        });
    });
    g.finish();
}

/// `CHARLY_BENCH_HASH_DIR`: hashing throughput of `hash_file` over a tree.
fn hash_mode(dir: &Path) {
    let mut files: Vec<(PathBuf, u64)> = Vec::new();
    for e in walkdir::WalkDir::new(dir).sort_by_file_name() {
        let e = e.expect("walk");
        if e.file_type().is_file() {
            let len = e.metadata().expect("stat").len();
            files.push((e.path().to_path_buf(), len));
        }
    }
    let total: u64 = files.iter().map(|f| f.1).sum();
    let rounds: usize = std::env::var("CHARLY_BENCH_HASH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let best = |f: &dyn Fn()| {
        f(); // warm the page cache
        (0..rounds)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min)
    };
    let seq = best(&|| {
        for (p, len) in &files {
            black_box(hash_file(p, *len).expect("hash"));
        }
    });
    let threads = jobs();
    let par = best(&|| {
        let next = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some((p, len)) = files.get(i) else { break };
                        black_box(hash_file(p, *len).expect("hash"));
                    }
                });
            }
        });
    });
    let gib = total as f64 / (1u64 << 30) as f64;
    println!(
        "hash_file {}: {} files, {total} bytes; best of {rounds}: sequential {seq:.3} s ({:.2} GiB/s), \
         {threads} threads {par:.3} s ({:.2} GiB/s)",
        dir.display(),
        files.len(),
        gib / seq,
        gib / par
    );
    println!("hash_seq_s={seq:.4} hash_par_s={par:.4} bytes={total}");
}

fn main() {
    if let Some(dir) = std::env::var_os("CHARLY_BENCH_HASH_DIR") {
        hash_mode(Path::new(&dir));
        return;
    }
    let mut c = Criterion::default().configure_from_args();
    noop_benches(&mut c);
    key_benches(&mut c);
    c.final_summary();
}
