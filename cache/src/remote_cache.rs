//! The one seam to a shared remote cache (docs/architecture.md, "The store and the remotes"), used by
//! the engine and implemented by both backends.
//!
//! The engine knows a remote only through [`RemoteCache`]: on a local
//! action-cache miss (after the key's lock is taken and the local store
//! asked again) it calls [`RemoteCache::fetch`]; a hit there is already
//! verified and committed to the local store, so everything downstream reads
//! the local store as before. After a node ran and its record is committed,
//! it calls [`RemoteCache::push`], which must return at once (uploads go on
//! in the background). The engine's `Engine::run` calls
//! [`RemoteCache::finish`] after the schedule, which waits for the uploads
//! and returns the figures for the summary.
//!
//! The OCI-registry backend ([`crate::Remote`]) implements it here; the
//! REAPI backend (`charly_reapi::GrpcCache`, `grpc://…`) implements it in its
//! own crate.

use crate::{CacheError, NodeKey, Record, Remote, RemoteStats, Store};
use serde::Serialize;

/// A shared cache behind the local store.
pub trait RemoteCache: Send + Sync {
    /// Where it is (for reports), e.g. `oci://host:5000/repo`.
    fn url(&self) -> String;
    /// Whether it never writes.
    fn read_only(&self) -> bool;
    /// Whether remote failures fail the build.
    fn required(&self) -> bool;
    /// After a local miss: the remote record of `key`, verified and already
    /// committed (with its output blobs) to `local`; `None` on a miss, and
    /// also when the remote failed or served bad data (counted for the
    /// report) unless the remote is required, in which case that is an
    /// error.
    fn fetch(&self, local: &Store, key: &NodeKey) -> Result<Option<Record>, CacheError>;
    /// Queues an upload of `key`'s record, freshly committed in `local` by
    /// a clean execution. Returns at once; a no-op when read-only.
    fn push(&self, local: &Store, key: &NodeKey);
    /// Waits for queued uploads and returns what the remote did so far.
    fn finish(&self) -> RemoteReport;
}

/// What the remote cache did in a run (the build summary's `remote`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RemoteReport {
    /// The remote's URL.
    pub url: String,
    /// `--remote-read-only`.
    pub read_only: bool,
    /// `--remote-required`.
    pub required: bool,
    /// Hits, misses, corrupt, bytes down/up, pushes, failures, messages.
    #[serde(flatten)]
    pub stats: RemoteStats,
}

impl RemoteReport {
    /// Whether something went wrong talking to the remote that should fail
    /// a build with `--remote-required`: a failed upload, or the remote
    /// becoming unreachable. (Corrupt remote data is only ever a miss.)
    pub fn has_failures(&self) -> bool {
        self.stats.push_failures > 0 || self.stats.unavailable || self.stats.skipped_unavailable > 0
    }

    /// One line for people: `remote oci://…: 3 hits, 1 miss, 1.2 MiB down, …`.
    pub fn line(&self) -> String {
        let s = &self.stats;
        let mut line = format!(
            "remote {}{}: {} hits, {} misses",
            self.url,
            if self.read_only { " (read-only)" } else { "" },
            s.hits,
            s.misses
        );
        if s.corrupt > 0 {
            line.push_str(&format!(", {} corrupt (refused)", s.corrupt));
        }
        line.push_str(&format!(
            ", {} down, {} pushed ({} already there), {} up",
            human_bytes(s.bytes_down),
            s.pushed,
            s.already_present,
            human_bytes(s.bytes_up)
        ));
        if s.push_failures > 0 {
            line.push_str(&format!(", {} push failures", s.push_failures));
        }
        if s.unavailable {
            line.push_str(", unreachable (switched off)");
        }
        line
    }
}

/// `1.5 MiB`.
pub fn human_bytes(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

impl RemoteCache for Remote {
    fn url(&self) -> String {
        Remote::url(self).to_string()
    }

    fn read_only(&self) -> bool {
        self.is_read_only()
    }

    fn required(&self) -> bool {
        self.is_required()
    }

    fn fetch(&self, local: &Store, key: &NodeKey) -> Result<Option<Record>, CacheError> {
        self.get_record(local, key)
    }

    fn push(&self, local: &Store, key: &NodeKey) {
        Remote::push(self, local, key);
    }

    fn finish(&self) -> RemoteReport {
        // Push failures are also in the counters and messages.
        let _ = Remote::finish(self);
        RemoteReport {
            url: Remote::url(self).to_string(),
            read_only: self.is_read_only(),
            required: self.is_required(),
            stats: self.stats(),
        }
    }
}
