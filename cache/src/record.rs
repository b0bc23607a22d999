//! Action-cache records: what a node produced, and why.
//!
//! A record is written once per [`NodeKey`](crate::NodeKey) and only for a
//! successful execution (failures are never cached). It names every output blob
//! and carries the node's key inputs as JSON so `charly explain` can diff them
//! against a later build of the same node. Records may carry clock time
//! (`created_unix`); keys never do.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::BlobDigest;

/// One named output of a node: a blob plus how to write it back as a file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Output {
    /// Content address of the output's bytes.
    pub digest: BlobDigest,
    /// Logical (uncompressed) size in bytes.
    pub size: u64,
    /// Unix mode bits to apply when the output is written back as a file.
    pub mode: u32,
}

/// The memoized result of one successful node execution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Stable human id of the node, e.g. `containerfile:fedora`.
    pub node_id: String,
    /// Node kind, e.g. `fragment` or `builder-stage`.
    pub kind: String,
    /// Outputs by name; every digest must be in the store when the record is put.
    pub outputs: BTreeMap<String, Output>,
    /// Wall-clock duration of the execution, in milliseconds.
    pub duration_ms: u64,
    /// What produced the result, e.g. `generate`, `podman`, `fake`.
    pub producer: String,
    /// The node's typed key-input struct as JSON, for `charly explain`.
    pub key_inputs: serde_json::Value,
    /// When the result was produced, in seconds since the Unix epoch.
    pub created_unix: u64,
    /// Free-form metadata (image ids and the like).
    pub meta: serde_json::Value,
}

impl Record {
    /// The distinct blob digests the record references, in sorted order.
    pub fn blob_digests(&self) -> Vec<BlobDigest> {
        let mut ds: Vec<BlobDigest> = self.outputs.values().map(|o| o.digest).collect();
        ds.sort_unstable();
        ds.dedup();
        ds
    }
}
