//! Progress on stderr, in one of three forms ([`ProgressMode`]):
//!
//! * **tty** (a terminal): a spinner per running node with why it runs and
//!   the last lines its command printed (as BuildKit shows them), under a
//!   bar weighted by expected work — each node counts for its last recorded
//!   duration, or a default for its kind — with an elapsed time that ticks.
//! * **plain** (CI logs, pipes): one line when a node starts (with why),
//!   one when it ends (state, duration); a failure's error carries the
//!   command's last lines.
//! * **quiet**: nothing.
//!
//! Cache hits are counted, not listed: a no-op build prints no node lines.

use charly_cache::Store;
use charly_engine::graph::Graph;
use charly_engine::key::NodeKind;
use charly_engine::sched::{NodeReport, Observer, State};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::collections::{HashMap, VecDeque};
use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How progress is shown.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProgressMode {
    /// `tty` when stderr is a terminal, else `plain`.
    #[default]
    Auto,
    /// Spinners with each running node's last log lines, a weighted bar.
    Tty,
    /// One line per node start and end (for CI logs).
    Plain,
    /// Nothing.
    Quiet,
}

impl ProgressMode {
    /// The mode to use: `quiet` wins; `auto` looks at stderr.
    pub fn resolve(self, quiet: bool) -> ProgressMode {
        match self {
            _ if quiet => ProgressMode::Quiet,
            ProgressMode::Auto if std::io::stderr().is_terminal() => ProgressMode::Tty,
            ProgressMode::Auto => ProgressMode::Plain,
            m => m,
        }
    }
}

/// Log lines kept under a running node's spinner.
const LOG_LINES: usize = 3;

/// Expected milliseconds of a node with no earlier record, by kind.
fn default_ms(kind: NodeKind) -> u64 {
    match kind {
        NodeKind::Source | NodeKind::Fragment | NodeKind::Containerfile | NodeKind::Plan => 1,
        NodeKind::Image => 2_000,
        NodeKind::Base => 10_000,
        NodeKind::LocalPkg => 20_000,
        NodeKind::Layer => 30_000,
        NodeKind::BuilderStage | NodeKind::Rootfs => 60_000,
    }
}

struct Running {
    bar: ProgressBar,
    head: String,
    log: VecDeque<String>,
}

/// Draws progress for a schedule.
pub struct Progress {
    mode: ProgressMode,
    t0: Instant,
    multi: MultiProgress,
    total: ProgressBar,
    weights: HashMap<String, u64>,
    running: Mutex<HashMap<String, Running>>,
    counts: Mutex<(u64, u64, u64)>,
    width: usize,
    all_reasons: bool,
    explain: HashMap<String, Vec<String>>,
}

impl Progress {
    /// Progress for running `graph` (`store`: the last recorded durations
    /// that weigh the bar), shown as `mode` says. Nodes that take no time
    /// (fragments, build directories, plans) are not shown; `all_reasons`
    /// still asks why each of them runs (for `--summary-json`).
    pub fn new(graph: &Graph, store: &Store, mode: ProgressMode, all_reasons: bool) -> Self {
        let tty = mode == ProgressMode::Tty;
        let multi = MultiProgress::with_draw_target(if tty {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        });
        // Weights only matter on a terminal; cheap kinds never ask the store.
        let weights: HashMap<String, u64> = if tty {
            graph
                .g
                .node_weights()
                .map(|n| {
                    let d = default_ms(n.kind);
                    let w = if d > 1 {
                        store
                            .last_record_for(&n.id)
                            .ok()
                            .flatten()
                            .map_or(d, |(_, r)| r.duration_ms.max(1))
                    } else {
                        d
                    };
                    (n.id.clone(), w)
                })
                .collect()
        } else {
            HashMap::new()
        };
        let total = multi.add(ProgressBar::new(weights.values().sum::<u64>().max(1)));
        total.set_style(
            ProgressStyle::with_template("{bar:30} {percent:>3}% {msg} [{elapsed_precise}]")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        if tty {
            total.enable_steady_tick(Duration::from_millis(250));
        }
        let width = terminal_width().unwrap_or(100).clamp(40, 200);
        Progress {
            mode,
            t0: Instant::now(),
            multi,
            total,
            weights,
            running: Mutex::new(HashMap::new()),
            counts: Mutex::new((0, 0, 0)),
            width,
            all_reasons,
            explain: HashMap::new(),
        }
    }

    /// Prints `lines[id]` when node `id` starts (`box build --explain`:
    /// explanations made before anything ran, so they compare with the
    /// records the run replaces).
    pub fn explaining(mut self, lines: HashMap<String, Vec<String>>) -> Self {
        self.explain = lines;
        self
    }

    /// Clears the bars.
    pub fn finish(&self) {
        if let Ok(r) = self.running.lock() {
            for b in r.values() {
                b.bar.finish_and_clear();
            }
        }
        self.total.finish_and_clear();
    }

    fn plain(&self, line: &str) {
        let t = self.t0.elapsed().as_secs_f64();
        let _ = writeln!(std::io::stderr().lock(), "[{t:>7.1}s] {line}");
    }

    fn cut(&self, s: &str, indent: usize) -> String {
        let max = self.width.saturating_sub(indent + 1);
        let s = s.replace('\t', "    ");
        if s.chars().count() <= max {
            s
        } else {
            let mut t: String = s.chars().take(max.saturating_sub(1)).collect();
            t.push('…');
            t
        }
    }
}

/// Whether nodes of `kind` take long enough to be shown one by one.
fn shown(kind: NodeKind) -> bool {
    default_ms(kind) > 1
}

fn terminal_width() -> Option<usize> {
    std::env::var("COLUMNS").ok().and_then(|c| c.parse().ok())
}

fn secs(ms: u64) -> String {
    format!("{:.1}s", ms as f64 / 1000.0)
}

impl Observer for Progress {
    fn wants_reason(&self, kind: NodeKind) -> bool {
        self.all_reasons || (self.mode != ProgressMode::Quiet && shown(kind))
    }

    fn started(&self, id: &str, kind: NodeKind, reason: &str) {
        if !shown(kind) {
            return;
        }
        if let Some(lines) = self.explain.get(id) {
            let text = lines.join("\n");
            if self.mode == ProgressMode::Tty {
                let _ = self.multi.println(text);
            } else {
                let _ = writeln!(std::io::stderr().lock(), "{text}");
            }
        }
        let why = if reason.is_empty() {
            String::new()
        } else {
            format!(" ({reason})")
        };
        match self.mode {
            ProgressMode::Plain => self.plain(&format!("start  {id}{why}")),
            ProgressMode::Tty => {
                let b = self
                    .multi
                    .insert_before(&self.total, ProgressBar::new_spinner());
                b.set_style(
                    ProgressStyle::with_template("{spinner} [{elapsed:>4}] {msg}")
                        .unwrap_or_else(|_| ProgressStyle::default_spinner()),
                );
                let head = self.cut(&format!("{id}{why}"), 10);
                b.set_message(head.clone());
                b.enable_steady_tick(Duration::from_millis(120));
                if let Ok(mut r) = self.running.lock() {
                    r.insert(
                        id.to_string(),
                        Running {
                            bar: b,
                            head,
                            log: VecDeque::new(),
                        },
                    );
                }
            }
            _ => {}
        }
    }

    fn log(&self, id: &str, line: &str) {
        // A progress meter redraws its line after `\r`: show the last state.
        let line = line
            .split('\r')
            .rfind(|s| !s.trim().is_empty())
            .unwrap_or("");
        if self.mode != ProgressMode::Tty || line.is_empty() {
            return;
        }
        if let Ok(mut r) = self.running.lock()
            && let Some(run) = r.get_mut(id)
        {
            if run.log.len() == LOG_LINES {
                run.log.pop_front();
            }
            run.log.push_back(self.cut(line.trim_end(), 6));
            let mut msg = run.head.clone();
            for l in &run.log {
                msg.push_str("\n      ");
                msg.push_str(l);
            }
            run.bar.set_message(msg);
        }
    }

    fn finished(&self, report: &NodeReport) {
        if let Ok(mut r) = self.running.lock()
            && let Some(run) = r.remove(&report.id)
        {
            run.bar.finish_and_clear();
        }
        let ran = match report.state {
            State::Ran | State::Pulled => shown(report.kind),
            State::Failed => true,
            _ => false,
        };
        if self.mode == ProgressMode::Plain && ran {
            let state = match report.state {
                State::Ran => "done  ",
                State::Pulled => "pulled",
                _ => "FAILED",
            };
            self.plain(&format!(
                "{state} {} in {}",
                report.id,
                secs(report.duration_ms)
            ));
        }
        if let Ok(mut c) = self.counts.lock() {
            match report.state {
                State::Ran => c.0 += 1,
                State::Cached | State::Pulled => c.1 += 1,
                State::Failed => c.2 += 1,
                _ => {}
            }
            self.total
                .set_message(format!("{} ran, {} cached, {} failed", c.0, c.1, c.2));
        }
        self.total
            .inc(self.weights.get(&report.id).copied().unwrap_or(1));
        if report.state == State::Failed && self.mode == ProgressMode::Tty {
            let _ = self.multi.println(format!("failed: {}", report.id));
        }
    }
}
