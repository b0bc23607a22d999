//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::collections::BTreeMap;

use charly_cache::{BlobDigest, NodeKey, Output, Record, Store};

/// Deterministic pseudo-random bytes, unique per seed.
pub fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Compressible bytes (a small vocabulary of words), unique per seed.
pub fn text(seed: u64, len: usize) -> Vec<u8> {
    const WORDS: [&[u8]; 8] = [
        b"package ",
        b"ripgrep ",
        b"fedora ",
        b"install ",
        b"\n",
        b"--yes ",
        b"/usr/bin ",
        b"0755 ",
    ];
    let mut out = Vec::with_capacity(len + 16);
    let mut x = seed.wrapping_mul(0xA24B_AED4_963E_E407) | 1;
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(WORDS[(x % 8) as usize]);
    }
    out.truncate(len);
    out
}

/// A node key derived from a label.
pub fn key(label: &str) -> NodeKey {
    NodeKey::from_bytes(*blake3::hash(label.as_bytes()).as_bytes())
}

/// Stores each blob and builds a record naming them as `out0`, `out1`, ...
pub fn record(store: &Store, node_id: &str, blobs: &[&[u8]]) -> Record {
    let mut outputs = BTreeMap::new();
    for (i, b) in blobs.iter().enumerate() {
        let digest = store.put_blob(b).expect("put blob");
        outputs.insert(format!("out{i}"), output(digest, b.len()));
    }
    Record {
        node_id: node_id.to_string(),
        kind: "test".to_string(),
        outputs,
        duration_ms: 7,
        producer: "fake".to_string(),
        key_inputs: serde_json::json!({ "node": node_id }),
        created_unix: 1_700_000_000,
        meta: serde_json::json!({}),
    }
}

pub fn output(digest: BlobDigest, len: usize) -> Output {
    Output {
        digest,
        size: len as u64,
        mode: 0o644,
    }
}
