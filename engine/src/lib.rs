//! charly-engine: the build graph, scheduler, runners and deploy walkers.
//!
//! The engine turns a loaded project (from `charly-rules`) into a DAG of
//! content-keyed nodes and runs it against the store (`charly-cache`).

pub use charly_rules as rules;

pub mod generate;
