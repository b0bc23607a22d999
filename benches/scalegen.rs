//! Scale-project generator: writes a deterministic charly project of N
//! candies and M boxes (and, with `--ninja`, the equivalent `build.ninja`)
//! for benchmarks. The logic lives in `scalegen_lib.rs`, shared with the
//! `noop` bench.
//!
//! ```sh
//! cargo run --release --bin scalegen -- --candies 1000 --boxes 100 --out /tmp/scale-1k --ninja
//! ```

#[path = "scalegen_lib.rs"]
#[allow(dead_code)]
mod scalegen_lib;

use std::process::ExitCode;

const USAGE: &str = "usage: scalegen --candies N --boxes M --out DIR [--ninja]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (spec, out) = match scalegen_lib::parse_args(&args) {
        Ok(v) => v,
        Err(e) if e.is_empty() => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("scalegen: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let t = std::time::Instant::now();
    match scalegen_lib::generate(&out, &spec) {
        Ok(s) => {
            eprintln!(
                "scalegen: {} candies ({} npm), {} boxes ({} on another box, chains up to {}) in {}: \
                 {} files, {:.1} MiB in {:.2}s; expected `box generate --all` graph: {} nodes \
                 ({} candy sources, {} fragments, {} box sources, {} containerfiles){}",
                spec.candies,
                s.npm_candies,
                spec.boxes,
                s.boxes_on_boxes,
                s.max_chain,
                out.display(),
                s.files,
                s.bytes as f64 / (1 << 20) as f64,
                t.elapsed().as_secs_f64(),
                s.generate_nodes,
                s.candy_sources,
                s.fragments,
                spec.boxes,
                spec.boxes,
                if spec.ninja {
                    "; wrote build.ninja"
                } else {
                    ""
                },
            );
            // Machine-readable line on stdout for scripts.
            println!("nodes={}", s.generate_nodes);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("scalegen: {}: {e}", out.display());
            ExitCode::from(1)
        }
    }
}
