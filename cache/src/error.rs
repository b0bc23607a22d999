//! The error type of the store.
//!
//! Corruption found while *reading* is not an error: a blob that fails
//! verification is quarantined and reported as a miss, and a record whose blobs
//! are gone is a miss. Errors are reserved for things the caller must act on:
//! I/O failures, an unusable index, or a caller bug such as recording an output
//! whose blob was never stored.

use std::io;
use std::path::PathBuf;

use crate::{BlobDigest, NodeKey};

/// Everything that can go wrong in the store.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// A filesystem operation on the store (or a destination file) failed.
    #[error("cache: {action} {}: {source}", path.display())]
    Io {
        /// What was being done, e.g. "creating directory".
        action: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// Reading the caller's input stream failed while storing a blob.
    #[error("cache: reading blob input: {0}")]
    Input(#[source] io::Error),

    /// The SQLite index failed.
    #[error("cache index: {0}")]
    Sqlite(#[from] rusqlite::Error),

    /// A record could not be encoded, or an indexed record could not be decoded.
    #[error("cache: record {key}: {source}")]
    RecordJson {
        /// Hex of the record's key.
        key: String,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },

    /// The index was written by a newer, incompatible version of charly.
    #[error(
        "cache index {} has schema version {found}, this charly understands up to {supported}",
        path.display()
    )]
    IncompatibleIndex {
        /// Path of the index database.
        path: PathBuf,
        /// Schema version found in the database.
        found: i64,
        /// Newest schema version this build understands.
        supported: i64,
    },

    /// SQLite refused WAL mode (e.g. on a network filesystem), which
    /// sharing the store between processes relies on.
    #[error("cache index {}: cannot enable WAL mode (journal mode is {mode})", path.display())]
    NoWal {
        /// Path of the index database.
        path: PathBuf,
        /// The journal mode SQLite reported instead.
        mode: String,
    },

    /// `put_record` was given an output whose blob is not in the store.
    #[error(
        "cache: record {key} output {output:?} references blob {digest}, which is not in the store"
    )]
    MissingBlob {
        /// The record being written.
        key: NodeKey,
        /// Name of the output.
        output: String,
        /// The absent blob.
        digest: BlobDigest,
    },

    /// `put_record` was given an output whose size disagrees with the stored blob.
    #[error(
        "cache: record {key} output {output:?} says {claimed} bytes, but blob {digest} holds {actual}"
    )]
    OutputSizeMismatch {
        /// The record being written.
        key: NodeKey,
        /// Name of the output.
        output: String,
        /// The blob.
        digest: BlobDigest,
        /// Size given in the record.
        claimed: u64,
        /// Logical size of the stored blob.
        actual: u64,
    },

    /// A string is not a 64-digit hex digest.
    #[error("invalid digest {input:?}: {reason}")]
    InvalidDigest {
        /// The offending input (truncated).
        input: String,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// SQLite's `quick_check` found the index damaged.
    #[error("cache index {} is damaged: {}", path.display(), problems.join("; "))]
    DamagedIndex {
        /// Path of the index database.
        path: PathBuf,
        /// What `quick_check` reported.
        problems: Vec<String>,
    },

    /// A GC root name is empty.
    #[error("cache: a root name must not be empty")]
    EmptyRootName,
}

/// Attaches an action and a path to `io::Result`s.
pub(crate) trait IoContext<T> {
    /// Converts the error into [`CacheError::Io`].
    fn at(self, action: &'static str, path: impl Into<PathBuf>) -> Result<T, CacheError>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn at(self, action: &'static str, path: impl Into<PathBuf>) -> Result<T, CacheError> {
        self.map_err(|source| CacheError::Io {
            action,
            path: path.into(),
            source,
        })
    }
}
