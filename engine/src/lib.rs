//! charly-engine: the build graph, scheduler, runners and deploy walkers.
//!
//! The engine turns a loaded project (from `charly-rules`) into a DAG of
//! content-keyed nodes (`graph`, `key`), hashes inputs with a stat cache
//! (`hash`), runs ready nodes in parallel against the store (`sched`,
//! `exec`), with commands executed by a [`runner::Runner`] (podman, or a fake
//! for tests). It also writes build directories (`generate`).

pub use charly_cache as cache;
pub use charly_reapi as reapi;
pub use charly_rules as rules;

pub mod api;
pub mod artifact;
pub mod check;
pub mod ctx;
pub mod exec;
pub mod fsroot;
pub mod generate;
pub mod graph;
pub mod hash;
pub mod id;
pub mod journal;
pub mod key;
pub mod oci;
pub mod outputs;
pub mod runners;
pub mod sched;
pub mod stage;
