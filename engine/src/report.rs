//! What a run tells as it goes and at the end: each node's [`State`] and
//! [`NodeReport`], and the [`Observer`] that hears them (the CLI draws
//! progress from it; the engine never prints). Below the scheduler and the
//! execution context, which both carry an observer.

use crate::key::NodeKind;
use serde::Serialize;

/// What happened to a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    /// It ran.
    Ran,
    /// Its result came from the local store.
    Cached,
    /// Its result came from the remote cache (verified, now also local).
    Pulled,
    /// It failed.
    Failed,
    /// It was not started (a failure stopped the schedule).
    NotAttempted,
    /// `--dry-run`: it would run.
    WouldRun,
}

/// One node in the summary.
#[derive(Clone, Debug, Serialize)]
pub struct NodeReport {
    /// Node id.
    pub id: String,
    /// Kind.
    pub kind: NodeKind,
    /// Key (hex in JSON).
    pub key: charly_cache::NodeKey,
    /// What happened.
    pub state: State,
    /// Wall time spent on it.
    pub duration_ms: u64,
    /// Why it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Why it ran (nodes that ran): `never built`, or what changed since
    /// its last record.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The candy a layer installs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub candy: Option<String>,
    /// For layers, bases and images: every requested box whose image contains it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub boxes: Vec<String>,
    /// Start, in microseconds since the schedule began (trace).
    #[serde(skip)]
    pub start_us: u64,
    /// Worker thread (trace).
    #[serde(skip)]
    pub thread: usize,
    /// Duration in microseconds (trace).
    #[serde(skip)]
    pub duration_us: u64,
}

impl NodeReport {
    /// A node cached under a key an earlier run recorded (the journal's
    /// replay, a box carried over).
    pub fn cached(id: String, kind: NodeKind, key: charly_cache::NodeKey) -> NodeReport {
        NodeReport {
            id,
            kind,
            key,
            state: State::Cached,
            duration_ms: 0,
            error: None,
            reason: None,
            start_us: 0,
            thread: 0,
            duration_us: 0,
            candy: None,
            boxes: Vec::new(),
        }
    }
}

/// Receives progress events (the CLI draws bars from them; the engine never prints).
pub trait Observer: Sync {
    /// A node started running (not called for cache hits), for `reason`
    /// (the `why` module's reason; empty unless [`Observer::wants_reason`]).
    fn started(&self, _id: &str, _kind: NodeKind, _reason: &str) {}
    /// Whether [`Observer::started`] should get the reasons of nodes of
    /// `kind` (they cost a store lookup per node that runs); the summary
    /// carries them when it does.
    fn wants_reason(&self, _kind: NodeKind) -> bool {
        false
    }
    /// A node finished in some state.
    fn finished(&self, _report: &NodeReport) {}
    /// A running node's command printed a line.
    fn log(&self, _id: &str, _line: &str) {}
}

/// An observer that ignores everything.
pub struct Quiet;
impl Observer for Quiet {}
