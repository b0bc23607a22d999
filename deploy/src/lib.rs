//! charly-deploy: deploy walkers: apply a box's merged InstallPlan to a target over the
//! [`host::Host`] seam, recording every change in a crash-safe
//! [`ledger::Ledger`] so `bundle del` can undo exactly what was done.
//!
//! * [`host`] — the seam (commands, files, stat, tar extraction);
//! * [`local`] — this machine, optionally rooted at a directory;
//! * `mem` — an in-memory host with scriptable failures (tests only: the
//!   `testing` feature);
//! * [`ledger`] — SQLite, write-ahead undo;
//! * [`walk`] — the walker (`apply`, `remove`, `drift`);
//! * [`ssh`] — a machine over SSH (russh);
//! * [`source`] — builder artifacts and local packages from the store;
//! * [`bundle`] — what `charly bundle` deploys: the plan per target (pod and
//!   k8s as rendered files), a target's identity, reaching a recorded host;
//!   [`session`] — `bundle add` and `bundle apply` up to their walk (plan,
//!   account, artifacts, options, record);
//! * [`pkg`] — package managers' queries and removals, [`shellops`] — file
//!   operations as shell for hosts reached by commands, [`plugin_host`] —
//!   plugin steps executed on a host.
//!
//! Where the crate sits: `docs/architecture.md`.

pub mod bundle;
pub mod host;
pub mod ledger;
pub mod local;
#[cfg(any(test, feature = "testing"))]
pub mod mem;
pub mod pkg;
pub mod plugin_host;
pub mod session;
pub mod shellops;
pub mod source;
pub mod ssh;
pub mod walk;
