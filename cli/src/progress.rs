//! Progress on stderr: a spinner per running node and a total bar with
//! counts of done / cached / failed. Hidden when stderr is not a terminal
//! (CI logs get the summary line instead).

use charly_engine::key::NodeKind;
use charly_engine::sched::{NodeReport, Observer, State};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::Duration;

/// Draws progress for a schedule.
pub struct Progress {
    multi: MultiProgress,
    total: ProgressBar,
    running: Mutex<HashMap<String, ProgressBar>>,
    counts: Mutex<(u64, u64, u64)>,
    enabled: bool,
}

impl Progress {
    /// Progress for `nodes` nodes; `quiet` hides it.
    pub fn new(nodes: usize, quiet: bool) -> Self {
        let enabled = !quiet && std::io::stderr().is_terminal();
        let multi = MultiProgress::with_draw_target(if enabled {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        });
        let total = multi.add(ProgressBar::new(nodes as u64));
        total.set_style(
            ProgressStyle::with_template("{bar:30} {pos}/{len} nodes {msg} [{elapsed}]")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        Progress {
            multi,
            total,
            running: Mutex::new(HashMap::new()),
            counts: Mutex::new((0, 0, 0)),
            enabled,
        }
    }

    /// Clears the bars.
    pub fn finish(&self) {
        if let Ok(r) = self.running.lock() {
            for b in r.values() {
                b.finish_and_clear();
            }
        }
        self.total.finish_and_clear();
    }
}

impl Observer for Progress {
    fn started(&self, id: &str, kind: NodeKind) {
        if !self.enabled || kind == NodeKind::Source {
            return;
        }
        let b = self.multi.add(ProgressBar::new_spinner());
        b.set_style(
            ProgressStyle::with_template("  {spinner} {msg} {elapsed}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        b.set_message(id.to_string());
        b.enable_steady_tick(Duration::from_millis(120));
        if let Ok(mut r) = self.running.lock() {
            r.insert(id.to_string(), b);
        }
    }

    fn finished(&self, report: &NodeReport) {
        if let Ok(mut r) = self.running.lock()
            && let Some(b) = r.remove(&report.id)
        {
            b.finish_and_clear();
        }
        if let Ok(mut c) = self.counts.lock() {
            match report.state {
                State::Ran => c.0 += 1,
                State::Cached | State::Pulled => c.1 += 1,
                State::Failed => c.2 += 1,
                _ => {}
            }
            self.total
                .set_message(format!("({} ran, {} cached, {} failed)", c.0, c.1, c.2));
        }
        self.total.inc(1);
        if report.state == State::Failed && self.enabled {
            let _ = self.multi.println(format!("failed: {}", report.id));
        }
    }
}
