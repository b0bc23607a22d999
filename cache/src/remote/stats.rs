//! Figures of a remote cache session, for `charly cache stats`, the build
//! summary and `--json`.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use crate::NodeKey;
use crate::store::lock_ignoring_poison;

/// Messages kept in [`RemoteStats::errors`]; later ones are only counted.
const MAX_MESSAGES: usize = 50;

/// What the remote cache did in this process so far.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RemoteStats {
    /// Records fetched from the registry, verified and stored locally.
    pub hits: u64,
    /// Lookups the registry had no record for.
    pub misses: u64,
    /// Records refused because something the registry served failed
    /// verification (digest, size, format). Each is also a miss.
    pub corrupt: u64,
    /// Blob and record bytes downloaded.
    pub bytes_down: u64,
    /// Blob and record bytes uploaded.
    pub bytes_up: u64,
    /// Records pushed.
    pub pushed: u64,
    /// Records not pushed because the registry already had them.
    pub already_present: u64,
    /// Records that could not be pushed.
    pub push_failures: u64,
    /// Lookups and pushes skipped because the registry had become
    /// unreachable earlier in the run.
    pub skipped_unavailable: u64,
    /// Whether the registry stopped answering during the run (further
    /// remote work was skipped).
    pub unavailable: bool,
    /// Everything that went wrong, one line each (the first 50; then a count).
    pub errors: Vec<String>,
}

/// The outcome of pushing records.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PushReport {
    /// Records uploaded (with whatever blobs the registry lacked).
    pub pushed: u64,
    /// Records the registry already had.
    pub already_present: u64,
    /// Records not pushed on purpose: read-only mode, records that came
    /// from the remote, records refused by the poisoning checks.
    pub skipped: u64,
    /// Bytes uploaded.
    pub bytes_up: u64,
    /// Records that failed, with why.
    pub failures: Vec<(NodeKey, String)>,
}

impl PushReport {
    /// Whether every push succeeded.
    pub fn ok(&self) -> bool {
        self.failures.is_empty()
    }

    pub(crate) fn merge(&mut self, other: PushReport) {
        self.pushed += other.pushed;
        self.already_present += other.already_present;
        self.skipped += other.skipped;
        self.bytes_up += other.bytes_up;
        self.failures.extend(other.failures);
    }
}

/// Thread-safe counters behind [`RemoteStats`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) hits: AtomicU64,
    pub(crate) misses: AtomicU64,
    pub(crate) corrupt: AtomicU64,
    pub(crate) bytes_down: AtomicU64,
    pub(crate) bytes_up: AtomicU64,
    pub(crate) pushed: AtomicU64,
    pub(crate) already_present: AtomicU64,
    pub(crate) push_failures: AtomicU64,
    pub(crate) skipped_unavailable: AtomicU64,
    messages: Mutex<(Vec<String>, u64)>,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Records a problem for the report.
    pub(crate) fn report(&self, message: String) {
        let mut m = lock_ignoring_poison(&self.messages);
        if m.0.len() < MAX_MESSAGES {
            m.0.push(message);
        } else {
            m.1 += 1;
        }
    }

    pub(crate) fn snapshot(&self, unavailable: bool) -> RemoteStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let (mut errors, more) = lock_ignoring_poison(&self.messages).clone();
        if more > 0 {
            errors.push(format!("… and {more} more"));
        }
        RemoteStats {
            hits: get(&self.hits),
            misses: get(&self.misses),
            corrupt: get(&self.corrupt),
            bytes_down: get(&self.bytes_down),
            bytes_up: get(&self.bytes_up),
            pushed: get(&self.pushed),
            already_present: get(&self.already_present),
            push_failures: get(&self.push_failures),
            skipped_unavailable: get(&self.skipped_unavailable),
            unavailable,
            errors,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_capped() {
        let c = Counters::default();
        for i in 0..(MAX_MESSAGES + 3) {
            c.report(format!("e{i}"));
        }
        Counters::add(&c.hits, 2);
        let s = c.snapshot(true);
        assert_eq!(s.hits, 2);
        assert!(s.unavailable);
        assert_eq!(s.errors.len(), MAX_MESSAGES + 1);
        assert_eq!(s.errors.last().map(String::as_str), Some("… and 3 more"));
    }
}
