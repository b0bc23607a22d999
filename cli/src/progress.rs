//! Progress on stderr, in one of three forms ([`ProgressMode`]):
//!
//! * **tty** (a terminal): a spinner per running node with why it runs and
//!   the last lines its command printed (as BuildKit shows them), under a
//!   bar weighted by expected work — each node counts for its last recorded
//!   duration, or a default for its kind — with an elapsed time that ticks.
//! * **plain** (CI logs, pipes): one line when a node starts (with why),
//!   one when it ends (state, duration), and for a node running longer, a
//!   heartbeat every 15 seconds (`CHARLY_HEARTBEAT_SECS`) with the last line
//!   its command printed; nodes too quick to list (fragments, build
//!   directories) are counted in one line at the end, so the lines add up
//!   to the summary. A failure's error carries the command's last lines and
//!   the path of its whole log.
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

/// A node running in plain mode: when it started, when its last line was
/// printed, and the last line its command wrote.
struct Beat {
    started: Instant,
    said: Instant,
    last: String,
}

/// Plain mode's running nodes, and the thread that prints their
/// heartbeats (stopped when the progress finishes).
#[derive(Default)]
struct Heartbeat {
    beats: std::sync::Arc<Mutex<HashMap<String, Beat>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// How often a long-running node says it is still running (plain mode).
fn heartbeat_every() -> Duration {
    std::env::var("CHARLY_HEARTBEAT_SECS")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|s| *s > 0.0)
        .map_or(Duration::from_secs(15), Duration::from_secs_f64)
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
    heartbeat: Heartbeat,
    /// Quick nodes (not listed one by one) that ran, by kind.
    quick: Mutex<std::collections::BTreeMap<&'static str, u64>>,
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
        let t0 = Instant::now();
        let heartbeat = Heartbeat::default();
        if mode == ProgressMode::Plain {
            let beats = std::sync::Arc::clone(&heartbeat.beats);
            let stop = std::sync::Arc::clone(&heartbeat.stop);
            let every = heartbeat_every();
            let tick = every.min(Duration::from_millis(250));
            let thread = std::thread::Builder::new()
                .name("charly-heartbeat".into())
                .spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::thread::sleep(tick);
                        let Ok(mut b) = beats.lock() else { return };
                        let mut due: Vec<(&String, &mut Beat)> = b
                            .iter_mut()
                            .filter(|(_, beat)| beat.said.elapsed() >= every)
                            .collect();
                        due.sort_by_key(|(id, _)| id.as_str());
                        for (id, beat) in due {
                            beat.said = Instant::now();
                            let t = t0.elapsed().as_secs_f64();
                            let last = if beat.last.is_empty() {
                                String::new()
                            } else {
                                format!(": {}", beat.last)
                            };
                            let _ = writeln!(
                                std::io::stderr().lock(),
                                "[{t:>7.1}s] ...    {id} (running {}){last}",
                                secs(beat.started.elapsed().as_millis() as u64)
                            );
                        }
                    }
                })
                .ok();
            if let Ok(mut t) = heartbeat.thread.lock() {
                *t = thread;
            }
        }
        Progress {
            mode,
            t0,
            multi,
            total,
            weights,
            running: Mutex::new(HashMap::new()),
            counts: Mutex::new((0, 0, 0)),
            width,
            all_reasons,
            explain: HashMap::new(),
            heartbeat,
            quick: Mutex::new(std::collections::BTreeMap::new()),
        }
    }

    /// Prints `lines[id]` when node `id` starts (`box build --explain`:
    /// explanations made before anything ran, so they compare with the
    /// records the run replaces).
    pub fn explaining(mut self, lines: HashMap<String, Vec<String>>) -> Self {
        self.explain = lines;
        self
    }

    /// Clears the bars, stops the heartbeats, and (plain mode) counts the
    /// quick nodes that ran.
    pub fn finish(&self) {
        if let Ok(r) = self.running.lock() {
            for b in r.values() {
                b.bar.finish_and_clear();
            }
        }
        self.total.finish_and_clear();
        self.heartbeat
            .stop
            .store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.heartbeat.thread.lock().ok().and_then(|mut t| t.take()) {
            let _ = t.join();
        }
        if self.mode == ProgressMode::Plain
            && let Ok(q) = self.quick.lock()
            && !q.is_empty()
        {
            let n: u64 = q.values().sum();
            let kinds: Vec<String> = q.iter().map(|(k, v)| format!("{k} {v}")).collect();
            self.plain(&format!(
                "done   {n} quick node{} ({})",
                if n == 1 { "" } else { "s" },
                kinds.join(", ")
            ));
        }
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
            ProgressMode::Plain => {
                self.plain(&format!("start  {id}{why}"));
                if let Ok(mut b) = self.heartbeat.beats.lock() {
                    let now = Instant::now();
                    b.insert(
                        id.to_string(),
                        Beat {
                            started: now,
                            said: now,
                            last: String::new(),
                        },
                    );
                }
            }
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
        if line.is_empty() {
            return;
        }
        if self.mode == ProgressMode::Plain {
            if let Ok(mut b) = self.heartbeat.beats.lock()
                && let Some(beat) = b.get_mut(id)
            {
                beat.last = self.cut(line.trim(), 40);
            }
            return;
        }
        if self.mode != ProgressMode::Tty {
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
        if let Ok(mut b) = self.heartbeat.beats.lock() {
            b.remove(&report.id);
        }
        if report.state == State::Ran
            && !shown(report.kind)
            && let Ok(mut q) = self.quick.lock()
        {
            *q.entry(report.kind.as_str()).or_default() += 1;
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
