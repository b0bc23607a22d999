//! Where a run's time went, phase by phase: `CHARLY_TIMINGS=1` makes the
//! CLI print each phase's wall time on stderr when the command ends (the
//! profile behind benches/RESULTS.md's front-end figures; cheap enough to
//! leave in: one relaxed load per phase when off).

use std::sync::Mutex;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

static ENABLED: OnceLock<bool> = OnceLock::new();
static PHASES: Mutex<Vec<(&'static str, Duration, u64)>> = Mutex::new(Vec::new());

/// The process's resident set size in MiB (0 where /proc is not there).
fn rss_mib() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096 / (1024 * 1024))
}

/// Whether `CHARLY_TIMINGS` asks for timings.
pub fn enabled() -> bool {
    *ENABLED.get_or_init(|| {
        std::env::var_os("CHARLY_TIMINGS").is_some_and(|v| !v.is_empty() && v != "0")
    })
}

/// A running phase; recorded when dropped.
pub struct Phase(Option<(&'static str, Instant)>);

/// Starts timing a phase (nothing when timings are off).
pub fn phase(name: &'static str) -> Phase {
    Phase(enabled().then(|| (name, Instant::now())))
}

impl Drop for Phase {
    fn drop(&mut self) {
        if let Some((name, t)) = self.0.take() {
            let mut p = PHASES.lock().unwrap_or_else(|e| e.into_inner());
            p.push((name, t.elapsed(), rss_mib()));
        }
    }
}

/// The recorded phases, one line each (`timing: load   12.3 ms  rss 40
/// MiB`), in the order they first ended, with the resident set size when
/// the phase last ended; a phase timed more than once is summed and says
/// how often (`× 100`). `None` when timings are off.
pub fn report() -> Option<String> {
    if !enabled() {
        return None;
    }
    let p = PHASES.lock().unwrap_or_else(|e| e.into_inner());
    let mut sums: Vec<(&str, Duration, usize, u64)> = Vec::new();
    for (n, d, rss) in p.iter() {
        match sums.iter_mut().find(|(m, ..)| m == n) {
            Some(s) => {
                s.1 += *d;
                s.2 += 1;
                s.3 = *rss;
            }
            None => sums.push((n, *d, 1, *rss)),
        }
    }
    let width = sums.iter().map(|(n, ..)| n.len()).max().unwrap_or(0);
    Some(
        sums.iter()
            .map(|(n, d, c, rss)| {
                let times = if *c > 1 {
                    format!(" × {c}")
                } else {
                    String::new()
                };
                format!(
                    "timing: {n:<width$} {:>8.1} ms  rss {rss:>5} MiB{times}\n",
                    d.as_secs_f64() * 1000.0
                )
            })
            .collect(),
    )
}
