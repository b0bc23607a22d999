//! Rendering benchmark over the real corpus (`../shared/corpus/overthink`, or
//! the directory in `CHARLY_BENCH_CORPUS`).
//!
//! `generate/render-all`: `charly_engine::generate::render` of every box that
//! resolves and renders, to an in-memory `BuildDir` (Containerfile and staged
//! context files); nothing is written to disk. One iteration = all boxes.
//! The project is loaded and resolved once, outside the measurement.
//!
//! CI smoke run:
//! `cargo bench -p charly-suite --bench generate -- --warm-up-time 1 --measurement-time 3`

use charly_engine::generate::{image_refs, render};
use charly_rules::emit::EmitOptions;
use charly_rules::load::{LoadOptions, load};
use charly_rules::resolve::{ResolvedBox, resolve};
use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;

use charly_testutil::bench_corpus as corpus;

fn benches(c: &mut Criterion) {
    let root = corpus();
    let p = load(&root, &LoadOptions::default())
        .expect("the corpus root has a readable charly.yml (set CHARLY_BENCH_CORPUS to move it)");
    let r = resolve(&p);
    let opts = EmitOptions {
        image_refs: image_refs(&r),
        ..EmitOptions::default()
    };

    // Untimed pass: keep the boxes that render; report the others instead of
    // panicking (a render error is a finding, not a bench failure).
    let mut boxes: Vec<&ResolvedBox> = Vec::new();
    let (mut bytes, mut files) = (0usize, 0usize);
    for (name, b) in &r.boxes {
        let Ok(b) = b else { continue };
        match render(&p, b, &opts) {
            Ok(d) => {
                bytes += d.containerfile.len();
                files += d.files.len();
                boxes.push(b);
            }
            Err(e) => eprintln!("generate: skipping box `{name}`: {e}"),
        }
    }
    eprintln!(
        "generate: {} of {} boxes resolve and render ({} Containerfile bytes, {} staged files in total)",
        boxes.len(),
        r.boxes.len(),
        bytes,
        files
    );
    if boxes.is_empty() {
        eprintln!("generate: no corpus box renders; nothing to measure");
        return;
    }

    let mut g = c.benchmark_group("generate");
    g.bench_function("render-all", |bench| {
        bench.iter(|| {
            for b in &boxes {
                let d = render(black_box(&p), black_box(b), &opts)
                    .expect("rendered in the untimed pass, so it renders again");
                black_box(d);
            }
        });
    });
    g.finish();
}

criterion_group!(generate_benches, benches);
criterion_main!(generate_benches);
