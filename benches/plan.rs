//! Plan compilation benchmark over the real corpus (`../shared/corpus/overthink`,
//! or the directory in `CHARLY_BENCH_CORPUS`).
//!
//! `plan/all-boxes`: `charly_rules::plan::build_merged_plan` for every box of
//! the corpus that resolves and compiles, one iteration = all of them. The
//! project is loaded and resolved once, outside the measurement.
//!
//! CI smoke run:
//! `cargo bench -p charly-suite --bench plan -- --warm-up-time 1 --measurement-time 3`

use charly_rules::load::{LoadOptions, load};
use charly_rules::plan::{HostContext, build_merged_plan};
use charly_rules::resolve::{ResolvedBox, resolve};
use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;

use charly_testutil::bench_corpus as corpus;

fn benches(c: &mut Criterion) {
    let root = corpus();
    let p = load(&root, &LoadOptions::default())
        .expect("the corpus root has a readable charly.yml (set CHARLY_BENCH_CORPUS to move it)");
    let r = resolve(&p);
    let ctx = HostContext::default();

    // Untimed pass: keep the boxes whose plan compiles; report the others
    // instead of panicking (a plan error is a finding, not a bench failure).
    let mut boxes: Vec<&ResolvedBox> = Vec::new();
    let mut steps = 0usize;
    for (name, b) in &r.boxes {
        let Ok(b) = b else { continue };
        match build_merged_plan(&p, b, &ctx, &[]) {
            Ok(plan) => {
                steps += plan.steps.len();
                boxes.push(b);
            }
            Err(e) => eprintln!("plan: skipping box `{name}`: {e}"),
        }
    }
    eprintln!(
        "plan: {} of {} boxes resolve and compile ({} steps in total)",
        boxes.len(),
        r.boxes.len(),
        steps
    );
    if boxes.is_empty() {
        eprintln!("plan: no corpus box compiles; nothing to measure");
        return;
    }

    let mut g = c.benchmark_group("plan");
    g.bench_function("all-boxes", |bench| {
        bench.iter(|| {
            for b in &boxes {
                let plan = build_merged_plan(black_box(&p), black_box(b), &ctx, &[])
                    .expect("compiled in the untimed pass, so it compiles again");
                black_box(plan);
            }
        });
    });
    g.finish();
}

criterion_group!(plan_benches, benches);
criterion_main!(plan_benches);
