//! charly-engine: the build graph, its keys, and running it.
//!
//! * [`graph`]: a loaded, resolved project (from `charly-rules`) as a DAG of
//!   nodes named by [`id`] (`NodeId`); [`graph::inputs`] fills each kind of
//!   node's typed key inputs ([`key::OwnInputs`], one struct per kind),
//!   [`key`] encodes and hashes them, [`hash`] digests files behind a stat
//!   cache.
//! * [`sched`] runs ready nodes in parallel; [`exec`] runs one node against
//!   the store (local, then the remote cache) and records its [`outputs`];
//!   [`report`] what a run tells as it goes (each node's state, the
//!   observer that hears it).
//! * [`runners`]: what runs command nodes (podman; remote execution over
//!   `charly-reapi`; a fake only with the `testing` feature), [`stage`] the
//!   requests they get.
//! * [`generate`] writes build directories confined to their root
//!   (`charly_files::fsroot`); [`journal`] makes an unchanged repeat a no-op; [`check`] runs
//!   check beds; [`api`] is the entry point the CLI and the deploy crate use
//!   ([`build`]: `box build` in one call, run to pushed and exported
//!   images; [`beds`]: `check`'s beds after the build; [`built`]: what a
//!   build stored for a box, for deploys).
//! * [`trees`] and [`dirs`]: the loader's parse cache and directory listings,
//!   kept in the store, so a load reads only what changed.
//! * A box image is a chain of layer nodes that sibling boxes share
//!   ([`graph::layers`] what the chain is, [`exec::layers`] building it);
//!   [`oci`] assembles images from them and writes OCI layouts
//!   (artifact tars: `charly_files::artifact`).
//! * Around them: [`ctx`] what running a node needs and how it fails,
//!   [`why`] why a node runs, [`canon`] canonical JSON, [`carry`] boxes
//!   carried over from the last run, [`pure`] the journal of print-only
//!   commands, [`resolved`] the resolution kept in the store, [`timings`]
//!   where a run's time went.
//!
//! Where the crate sits and how a build flows: `docs/architecture.md`.

pub use charly_cache as cache;
pub use charly_reapi as reapi;
pub use charly_rules as rules;

pub mod api;
pub mod beds;
pub mod build;
pub mod built;
pub mod canon;
pub mod carry;
pub mod check;
pub mod ctx;
pub mod dirs;
pub mod exec;
pub mod generate;
pub mod graph;
pub mod hash;
pub mod id;
pub mod journal;
pub mod key;
pub mod oci;
pub mod outputs;
pub mod pure;
pub mod report;
pub mod resolved;
pub mod runners;
pub mod sched;
pub mod stage;
pub mod timings;
pub mod trees;
pub mod why;
