//! Loading benchmarks over the real corpus (`../shared/corpus/overthink`, or
//! the directory in `CHARLY_BENCH_CORPUS`).
//!
//! * `load/corpus`: `charly_rules::load::load` of the whole project (every
//!   file read, parsed, deserialized, registered). Target: well under 100 ms.
//! * `load/corpus+resolve`: the same plus `charly_rules::resolve::resolve`.
//! * `resolve/corpus`: `resolve` alone on an already loaded project.
//!
//! CI smoke run:
//! `cargo bench -p charly-suite --bench load -- --warm-up-time 1 --measurement-time 3`

use charly_rules::load::{LoadOptions, Project, load};
use charly_rules::resolve::resolve;
use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;

use charly_testutil::bench_corpus as corpus;

fn load_corpus(root: &std::path::Path) -> Project {
    load(root, &LoadOptions::default())
        .expect("the corpus root has a readable charly.yml (set CHARLY_BENCH_CORPUS to move it)")
}

fn benches(c: &mut Criterion) {
    let root = corpus();
    // One untimed load up front: fail early with a clear message, and print
    // what is being measured so numbers can be compared across runs.
    let p = load_corpus(&root);
    let r = resolve(&p);
    let ok = r.boxes.values().filter(|b| b.is_ok()).count();
    eprintln!(
        "corpus {}: {} files, {} namespaces, {} candies, {} boxes ({} resolvable), {} load diagnostics",
        root.display(),
        p.sources.len(),
        p.namespaces.len(),
        p.candies.len(),
        r.boxes.len(),
        ok,
        p.diags.len(),
    );

    let mut g = c.benchmark_group("load");
    g.bench_function("corpus", |b| {
        b.iter(|| black_box(load_corpus(black_box(&root))));
    });
    g.bench_function("corpus+resolve", |b| {
        b.iter(|| {
            let p = load_corpus(black_box(&root));
            let r = resolve(&p);
            black_box((p, r))
        });
    });
    g.finish();

    let mut g = c.benchmark_group("resolve");
    g.bench_function("corpus", |b| {
        b.iter(|| black_box(resolve(black_box(&p))));
    });
    g.finish();
}

criterion_group!(load_benches, benches);
criterion_main!(load_benches);
