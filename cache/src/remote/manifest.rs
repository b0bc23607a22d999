//! How a record and its blobs are laid out as an OCI artifact.
//!
//! One manifest per node key, tagged [`tag_for`] (`k-` + the key's 64 hex
//! digits; tags may be 128 characters). It is a plain OCI image manifest
//! (any Distribution registry stores it) in the artifact style:
//!
//! * `config`: the [`Record`] as JSON, media type [`RECORD_MEDIA_TYPE`];
//! * `layers`: one per distinct output blob, in the record's digest order,
//!   holding the blob's *uncompressed* bytes (media type
//!   [`BLOB_MEDIA_TYPE`]; the registry addresses it by sha256), annotated
//!   with its blake3 [`BlobDigest`] and the name of an output it backs;
//! * `annotations`: the full node key, node id and kind, for people
//!   browsing the registry.
//!
//! Uncompressed layers keep the registry's sha256 a pure function of the
//! content (the same blob pushed by any runner dedups to one registry blob),
//! and let a pull verify both digests in one pass over the bytes.
//!
//! Reading trusts nothing: the manifest must name this key, the record must
//! decode, and every output must be backed by exactly one layer with the
//! same blake3 and size. Anything else is corruption (a miss, reported).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{BlobDigest, NodeKey, Record};

/// Media type of the config blob: a charly [`Record`] as JSON.
pub const RECORD_MEDIA_TYPE: &str = "application/vnd.charly.record.v1+json";
/// Media type of a layer: one output blob, uncompressed.
pub const BLOB_MEDIA_TYPE: &str = "application/vnd.charly.blob.v1";
/// Layer annotation: the blob's blake3 digest (64 hex).
pub const ANNOTATION_BLAKE3: &str = "dev.charly.blob.blake3";
/// Layer annotation: how many bytes follow the blob's own in the layer (a
/// copy uploaded to replace a registry blob that failed verification,
/// under a new digest); readers hash them with the rest and drop them.
pub const ANNOTATION_TRAILER: &str = "dev.charly.blob.trailer";
/// The longest trailer a reader accepts.
const MAX_TRAILER: u64 = 4096;
/// Layer annotation: an output name the blob backs.
pub const ANNOTATION_OUTPUT: &str = "dev.charly.output";
/// Manifest annotation: the full node key (64 hex).
pub const ANNOTATION_KEY: &str = "dev.charly.node-key";
/// Manifest annotation: the node's id.
pub const ANNOTATION_NODE: &str = "dev.charly.node-id";
/// Manifest annotation: the node's kind.
pub const ANNOTATION_KIND: &str = "dev.charly.kind";

/// Largest record (config blob) a pull accepts: records are small JSON.
pub(crate) const MAX_RECORD_BYTES: u64 = 16 * 1024 * 1024;

/// The tag of a node key's manifest.
pub fn tag_for(key: &NodeKey) -> String {
    format!("k-{}", key.to_hex())
}

/// Whether `tag` is one of [`tag_for`]'s.
pub fn is_record_tag(tag: &str) -> bool {
    tag.strip_prefix("k-")
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// An OCI content descriptor (only the fields charly uses).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Descriptor {
    pub(crate) media_type: String,
    pub(crate) digest: String,
    pub(crate) size: u64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) annotations: BTreeMap<String, String>,
}

/// An OCI image manifest (only the fields charly uses; others are ignored).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Manifest {
    pub(crate) schema_version: u32,
    #[serde(default)]
    pub(crate) media_type: String,
    pub(crate) config: Descriptor,
    pub(crate) layers: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) annotations: BTreeMap<String, String>,
}

/// A layer to pull: where the registry has it and what it must hash to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layer {
    pub(crate) sha256: String,
    pub(crate) blake3: BlobDigest,
    /// The blob's own size.
    pub(crate) size: u64,
    /// Bytes after it in the registry's blob ([`ANNOTATION_TRAILER`]).
    pub(crate) trailer: u64,
}

/// The bytes a repaired copy of a blob ends with: unique per process and
/// moment, so every repair gets a digest of its own.
pub(crate) fn repair_trailer() -> Vec<u8> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let seed = format!("charly repair {} {now} {n}", std::process::id());
    format!("\n{}", &blake3::hash(seed.as_bytes()).to_hex()[..31]).into_bytes()
}

/// `sha256:` + 64 lowercase hex.
pub(crate) fn is_sha256_digest(s: &str) -> bool {
    s.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == 64
            && h.bytes()
                .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
    })
}

/// The sha256 digest of `bytes` in OCI form.
pub(crate) fn sha256_of(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    oci_digest(sha2::Sha256::digest(bytes).as_slice())
}

/// `sha256:` + hex of a finished sha256.
pub(crate) fn oci_digest(raw: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(7 + 64);
    s.push_str("sha256:");
    for b in raw {
        s.push(char::from(HEX[usize::from(b >> 4)]));
        s.push(char::from(HEX[usize::from(b & 0x0f)]));
    }
    s
}

/// The config blob of a record: its JSON (keys of JSON values sort, so the
/// same record always gives the same bytes).
pub(crate) fn record_json(rec: &Record) -> Result<Vec<u8>, String> {
    serde_json::to_vec(rec).map_err(|e| format!("encoding record: {e}"))
}

/// Builds the manifest of `rec` under `key`. `sha256` maps every blob of the
/// record to its registry digest and trailer length (0 but for a repaired
/// copy); `config` is the record JSON's descriptor.
pub(crate) fn build(
    key: &NodeKey,
    rec: &Record,
    config: Descriptor,
    sha256: &BTreeMap<BlobDigest, (String, u64)>,
) -> Result<Vec<u8>, String> {
    let mut layers = Vec::new();
    for d in rec.blob_digests() {
        let (name, out) = rec
            .outputs
            .iter()
            .find(|(_, o)| o.digest == d)
            .ok_or_else(|| format!("blob {d} names no output"))?;
        let (sha, trailer) = sha256
            .get(&d)
            .ok_or_else(|| format!("no registry digest for blob {d}"))?;
        let mut annotations = BTreeMap::from([
            (ANNOTATION_BLAKE3.into(), d.to_hex()),
            (ANNOTATION_OUTPUT.into(), name.clone()),
        ]);
        if *trailer > 0 {
            annotations.insert(ANNOTATION_TRAILER.into(), trailer.to_string());
        }
        layers.push(Descriptor {
            media_type: BLOB_MEDIA_TYPE.into(),
            digest: sha.clone(),
            size: out.size + trailer,
            annotations,
        });
    }
    let m = Manifest {
        schema_version: 2,
        media_type: super::registry::OCI_MANIFEST.into(),
        config,
        layers,
        annotations: BTreeMap::from([
            (ANNOTATION_KEY.into(), key.to_hex()),
            (ANNOTATION_NODE.into(), rec.node_id.clone()),
            (ANNOTATION_KIND.into(), rec.kind.clone()),
        ]),
    };
    serde_json::to_vec(&m).map_err(|e| format!("encoding manifest: {e}"))
}

/// Parses a manifest fetched for `key` and returns its config descriptor.
/// Errors describe why the manifest cannot be charly's for this key.
pub(crate) fn parse(key: &NodeKey, body: &[u8]) -> Result<Manifest, String> {
    let m: Manifest =
        serde_json::from_slice(body).map_err(|e| format!("manifest is not valid JSON: {e}"))?;
    if m.schema_version != 2 {
        return Err(format!("manifest schema version {}", m.schema_version));
    }
    if !m.media_type.is_empty() && m.media_type != super::registry::OCI_MANIFEST {
        return Err(format!("manifest media type {}", m.media_type));
    }
    if m.config.media_type != RECORD_MEDIA_TYPE {
        return Err(format!(
            "config media type {} (not a charly record)",
            m.config.media_type
        ));
    }
    if !is_sha256_digest(&m.config.digest) {
        return Err(format!("config digest {:?}", m.config.digest));
    }
    if m.config.size > MAX_RECORD_BYTES {
        return Err(format!("record of {} bytes", m.config.size));
    }
    match m.annotations.get(ANNOTATION_KEY) {
        Some(k) if *k == key.to_hex() => {}
        Some(k) => return Err(format!("manifest is for key {k}")),
        None => return Err("manifest names no node key".into()),
    }
    Ok(m)
}

/// Matches a decoded record against its manifest's layers: every distinct
/// output blob must have exactly one layer with the same blake3 and size,
/// and there must be no other layers.
pub(crate) fn layers_for(m: &Manifest, rec: &Record) -> Result<Vec<Layer>, String> {
    let mut by_blake3: BTreeMap<BlobDigest, Layer> = BTreeMap::new();
    for l in &m.layers {
        if l.media_type != BLOB_MEDIA_TYPE {
            return Err(format!("layer media type {}", l.media_type));
        }
        if !is_sha256_digest(&l.digest) {
            return Err(format!("layer digest {:?}", l.digest));
        }
        let b3: BlobDigest = l
            .annotations
            .get(ANNOTATION_BLAKE3)
            .ok_or_else(|| format!("layer {} has no blake3 annotation", l.digest))?
            .parse()
            .map_err(|e| format!("layer {}: {e}", l.digest))?;
        let trailer = match l.annotations.get(ANNOTATION_TRAILER) {
            None => 0,
            Some(t) => t
                .parse::<u64>()
                .ok()
                .filter(|t| *t <= MAX_TRAILER && *t <= l.size)
                .ok_or_else(|| format!("layer {}: trailer {t:?}", l.digest))?,
        };
        let layer = Layer {
            sha256: l.digest.clone(),
            blake3: b3,
            size: l.size - trailer,
            trailer,
        };
        if by_blake3.insert(b3, layer).is_some() {
            return Err(format!("blob {b3} appears twice"));
        }
    }
    let mut out = Vec::new();
    for d in rec.blob_digests() {
        let layer = by_blake3
            .remove(&d)
            .ok_or_else(|| format!("output blob {d} has no layer"))?;
        for (name, o) in rec.outputs.iter().filter(|(_, o)| o.digest == d) {
            if o.size != layer.size {
                return Err(format!(
                    "output {name:?} says {} bytes, its layer {}",
                    o.size, layer.size
                ));
            }
        }
        out.push(layer);
    }
    if let Some(extra) = by_blake3.keys().next() {
        return Err(format!("layer {extra} backs no output"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Output;

    fn record() -> Record {
        let a = BlobDigest::of(b"a");
        let b = BlobDigest::of(b"bb");
        Record {
            node_id: "stage:x".into(),
            kind: "builder-stage".into(),
            outputs: BTreeMap::from([
                (
                    "one".into(),
                    Output {
                        digest: a,
                        size: 1,
                        mode: 0o644,
                    },
                ),
                (
                    "two".into(),
                    Output {
                        digest: b,
                        size: 2,
                        mode: 0o755,
                    },
                ),
                (
                    "same-as-one".into(),
                    Output {
                        digest: a,
                        size: 1,
                        mode: 0o600,
                    },
                ),
            ]),
            duration_ms: 5,
            producer: "fake".into(),
            key_inputs: serde_json::json!({"z": 1, "a": [1, 2]}),
            created_unix: 7,
            meta: serde_json::Value::Null,
        }
    }

    fn shas(rec: &Record) -> BTreeMap<BlobDigest, (String, u64)> {
        rec.blob_digests()
            .into_iter()
            .map(|d| (d, (sha256_of(d.as_bytes()), 0)))
            .collect()
    }

    fn config(rec: &Record) -> Descriptor {
        let json = record_json(rec).expect("json");
        Descriptor {
            media_type: RECORD_MEDIA_TYPE.into(),
            digest: sha256_of(&json),
            size: json.len() as u64,
            annotations: BTreeMap::new(),
        }
    }

    #[test]
    fn round_trip() {
        let key = NodeKey::from_bytes([3; 32]);
        let rec = record();
        let body = build(&key, &rec, config(&rec), &shas(&rec)).expect("build");
        let m = parse(&key, &body).expect("parse");
        assert_eq!(m.layers.len(), 2, "one layer per distinct blob");
        let layers = layers_for(&m, &rec).expect("layers");
        assert_eq!(
            layers.iter().map(|l| l.blake3).collect::<Vec<_>>(),
            rec.blob_digests()
        );
        assert_eq!(tag_for(&key).len(), 66);
        assert!(tag_for(&key).starts_with("k-0303"));
        // Deterministic bytes for the same record.
        assert_eq!(
            body,
            build(&key, &rec, config(&rec), &shas(&rec)).expect("build")
        );
        assert_eq!(
            record_json(&rec).expect("json"),
            record_json(&rec).expect("json")
        );
    }

    #[test]
    fn rejects_what_is_not_ours() {
        let key = NodeKey::from_bytes([3; 32]);
        let rec = record();
        let body = build(&key, &rec, config(&rec), &shas(&rec)).expect("build");
        let other = NodeKey::from_bytes([4; 32]);
        assert!(parse(&other, &body).is_err(), "manifest of another key");
        assert!(parse(&key, b"{").is_err());

        let mut m = parse(&key, &body).expect("parse");
        m.config.media_type = "application/vnd.oci.image.config.v1+json".into();
        let s = serde_json::to_vec(&m).expect("json");
        assert!(parse(&key, &s).is_err(), "an image, not a record");

        let m = parse(&key, &body).expect("parse");
        let mut shrunk = m.clone();
        shrunk.layers[0].size += 1;
        assert!(layers_for(&shrunk, &rec).is_err(), "size disagrees");
        let mut missing = m.clone();
        missing.layers.pop();
        assert!(layers_for(&missing, &rec).is_err(), "output without layer");
        let mut extra = m.clone();
        let mut l = extra.layers[0].clone();
        l.annotations
            .insert(ANNOTATION_BLAKE3.into(), BlobDigest::of(b"zzz").to_hex());
        extra.layers.push(l);
        assert!(layers_for(&extra, &rec).is_err(), "layer backing nothing");
        let mut bad_digest = m;
        bad_digest.layers[0].digest = "sha256:XYZ".into();
        assert!(layers_for(&bad_digest, &rec).is_err());
    }

    /// A repaired copy: the layer is the blob plus a declared trailer; the
    /// reader sees the blob's own size, and a trailer that is too long or
    /// longer than the layer is refused.
    #[test]
    fn a_repaired_layer_declares_its_trailer() {
        let key = NodeKey::from_bytes([3; 32]);
        let rec = record();
        let mut with = shas(&rec);
        let first = rec.blob_digests()[0];
        with.get_mut(&first).expect("first").1 = 32;
        let body = build(&key, &rec, config(&rec), &with).expect("build");
        let m = parse(&key, &body).expect("parse");
        let layers = layers_for(&m, &rec).expect("layers");
        let l = layers.iter().find(|l| l.blake3 == first).expect("layer");
        let own = rec
            .outputs
            .values()
            .find(|o| o.digest == first)
            .expect("o")
            .size;
        assert_eq!((l.size, l.trailer), (own, 32));
        assert_eq!(m.layers[0].size, own + 32);
        for bad in ["4097", "x", "-1", &(own + 33).to_string()] {
            let mut m2 = m.clone();
            let i = m2
                .layers
                .iter()
                .position(|d| d.annotations.contains_key(ANNOTATION_TRAILER))
                .expect("annotated");
            m2.layers[i]
                .annotations
                .insert(ANNOTATION_TRAILER.into(), bad.to_string());
            assert!(layers_for(&m2, &rec).is_err(), "trailer {bad}");
        }
        assert_ne!(repair_trailer(), repair_trailer(), "each repair its own");
    }

    #[test]
    fn sha256_form() {
        assert_eq!(
            sha256_of(b""),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert!(is_sha256_digest(&sha256_of(b"x")));
        assert!(!is_sha256_digest("sha512:00"));
    }
}
