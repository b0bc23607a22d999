//! Uploading a locally committed record and its blobs.
//!
//! Order matters for readers on other machines: blobs first, then the
//! record (config blob), then the manifest that names them, so a tag never
//! points at something incomplete. What the registry already has is not
//! sent again: the manifest tag is checked first (the first writer of a key
//! wins, as in the local store), then each blob by sha256.
//!
//! The sha256 of a blob is not stored locally; it is computed by one
//! verified streaming read of the local blob (blake3 checked at the end)
//! and remembered for the rest of the process. Small blobs are read into
//! memory once; large ones are read a second time, frame batch by frame
//! batch, straight into the upload body, so memory stays bounded by a few
//! batches whatever the blob size.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io;
use std::sync::Mutex;

use bytes::Bytes;
use sha2::Digest as _;

use super::error::{Kind, RemoteError};
use super::manifest::{self, Descriptor, RECORD_MEDIA_TYPE, tag_for};
use super::registry::Registry;
use crate::blob::FileId;
use crate::frames::{Dest, ReadOutcome, read_blob};
use crate::store::lock_ignoring_poison;
use crate::{BlobDigest, NodeKey, Record, Store};

/// Blobs up to this size are read into memory and sent in one piece.
const SMALL_BLOB: u64 = 4 * 1024 * 1024;

/// What pushing one record did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Pushed {
    /// Uploaded; bytes sent.
    Uploaded(u64),
    /// The registry had the record already.
    AlreadyPresent,
    /// Not pushed on purpose, and why.
    Refused(String),
}

/// Why a record must not be shared, if it must not (poisoning defence).
///
/// Only records of clean, complete executions may leave the machine: the
/// store only holds records of successful runs, but a producer that noted a
/// non-zero exit status or a failure in the record's metadata is refused
/// all the same, as is a record without a producer.
pub(crate) fn refusal(rec: &Record) -> Option<String> {
    if rec.producer.trim().is_empty() {
        return Some("the record names no producer".into());
    }
    for field in ["exit_code", "exit_status"] {
        if let Some(v) = rec.meta.get(field)
            && v.as_i64() != Some(0)
        {
            return Some(format!("the producer did not exit cleanly ({field} = {v})"));
        }
    }
    if rec.meta.get("failed").and_then(|v| v.as_bool()) == Some(true) {
        return Some("the record is marked failed".into());
    }
    None
}

/// Pushes `key`'s record from `local`. `shas` remembers blob sha256s.
/// `repair`: the registry's copy of this record failed verification when
/// it was pulled (`Some(blob)`: that blob's bytes did): the record is
/// pushed whatever the registry says it has, and the bad blob is deleted
/// and uploaded again (a registry never overwrites a blob it has).
pub(crate) fn push_record(
    reg: &Registry,
    local: &Store,
    key: &NodeKey,
    shas: &Mutex<HashMap<BlobDigest, String>>,
    repair: Option<Option<String>>,
) -> Result<Pushed, RemoteError> {
    let rec = match local.get_record(key) {
        Ok(Some(rec)) => rec,
        Ok(None) => {
            return Ok(Pushed::Refused(
                "no complete record in the local store (missing record or outputs)".into(),
            ));
        }
        Err(e) => return Err(RemoteError::local(&e)),
    };
    if let Some(why) = refusal(&rec) {
        return Ok(Pushed::Refused(why));
    }
    let tag = tag_for(key);
    if repair.is_none() && reg.has_manifest(&tag)? {
        return Ok(Pushed::AlreadyPresent);
    }
    // The registry's copy of this blob failed verification. A registry
    // never overwrites a blob it has (Docker Distribution keeps the data
    // even when the blob is deleted, until it collects garbage), so the
    // replacement goes under a new digest: the blob's bytes followed by a
    // trailer the manifest declares (`manifest::ANNOTATION_TRAILER`), which
    // readers hash with the rest and do not store.
    let bad = repair.flatten();
    let trailer = manifest::repair_trailer();

    let mut sent = 0u64;
    let mut layer_shas = BTreeMap::new();
    for d in rec.blob_digests() {
        let size = rec
            .outputs
            .values()
            .find(|o| o.digest == d)
            .map_or(0, |o| o.size);
        let known = lock_ignoring_poison(shas).get(&d).cloned();
        let (sha, extra) = if size <= SMALL_BLOB {
            // One verified read serves both the digest and the upload.
            let bytes = match local.get_blob(&d) {
                Ok(Some(b)) => b,
                Ok(None) => return Ok(Pushed::Refused(local_blob_gone(&d))),
                Err(e) => return Err(RemoteError::local(&e)),
            };
            if bytes.len() as u64 != size {
                return Ok(Pushed::Refused(format!(
                    "blob {d} holds {} bytes, the record says {size}",
                    bytes.len()
                )));
            }
            let sha = known.unwrap_or_else(|| manifest::sha256_of(&bytes));
            lock_ignoring_poison(shas).insert(d, sha.clone());
            if bad.as_deref() == Some(sha.as_str()) {
                let mut with = bytes.to_vec();
                with.extend_from_slice(&trailer);
                let sha = manifest::sha256_of(&with);
                reg.push_bytes(&sha, with)?;
                sent += size;
                (sha, trailer.len() as u64)
            } else {
                if !reg.has_blob(&sha)? {
                    reg.push_bytes(&sha, bytes)?;
                    sent += size;
                }
                (sha, 0)
            }
        } else {
            let sha = match known {
                Some(sha) => sha,
                None => match stream_sha256(local, &d, size, &[])? {
                    Ok(sha) => sha,
                    Err(why) => return Ok(Pushed::Refused(why)),
                },
            };
            lock_ignoring_poison(shas).insert(d, sha.clone());
            if bad.as_deref() == Some(sha.as_str()) {
                let sha = match stream_sha256(local, &d, size, &trailer)? {
                    Ok(sha) => sha,
                    Err(why) => return Ok(Pushed::Refused(why)),
                };
                upload_stream(reg, local, &d, &sha, size, &trailer)?;
                sent += size;
                (sha, trailer.len() as u64)
            } else {
                if !reg.has_blob(&sha)? {
                    upload_stream(reg, local, &d, &sha, size, &[])?;
                    sent += size;
                }
                (sha, 0)
            }
        };
        layer_shas.insert(d, (sha, extra));
    }

    let mut json = manifest::record_json(&rec).map_err(RemoteError::other)?;
    let mut digest = manifest::sha256_of(&json);
    if bad.as_deref() == Some(digest.as_str()) {
        // JSON may end in whitespace: a record with a new digest.
        json.extend(std::iter::repeat_n(b'\n', 1 + trailer.len() % 64));
        digest = manifest::sha256_of(&json);
    }
    let config = Descriptor {
        media_type: RECORD_MEDIA_TYPE.into(),
        digest,
        size: json.len() as u64,
        annotations: BTreeMap::new(),
    };
    if !reg.has_blob(&config.digest)? {
        sent += json.len() as u64;
        reg.push_bytes(&config.digest, json)?;
    }
    let body = manifest::build(key, &rec, config, &layer_shas).map_err(RemoteError::other)?;
    sent += body.len() as u64;
    reg.put_manifest(&tag, body)?;
    Ok(Pushed::Uploaded(sent))
}

fn local_blob_gone(d: &BlobDigest) -> String {
    format!("blob {d} is missing from the local store or failed verification (quarantined)")
}

fn open_blob(local: &Store, d: &BlobDigest) -> Result<Option<(File, FileId)>, RemoteError> {
    let path = local.blob_path(d);
    match File::open(&path) {
        Ok(f) => {
            let meta = f
                .metadata()
                .map_err(|e| RemoteError::other(format!("inspecting {}: {e}", path.display())))?;
            Ok(Some((f, FileId::of(&meta))))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(RemoteError::other(format!(
            "opening {}: {e}",
            path.display()
        ))),
    }
}

/// The sha256 of a local blob by one verified streaming read. The inner
/// `Err` is a reason to refuse the record (blob gone or corrupt).
/// `trailer` is hashed after the blob's bytes (a repaired copy).
fn stream_sha256(
    local: &Store,
    d: &BlobDigest,
    size: u64,
    trailer: &[u8],
) -> Result<Result<String, String>, RemoteError> {
    let Some((file, id)) = open_blob(local, d)? else {
        return Ok(Err(local_blob_gone(d)));
    };
    let mut sha = sha2::Sha256::new();
    let outcome = read_blob(
        file,
        d,
        Dest::Stream(&mut |chunk| {
            sha.update(chunk);
            Ok(())
        }),
    )
    .map_err(|e| RemoteError::other(format!("reading local blob {d}: {e}")))?;
    match outcome {
        ReadOutcome::Verified(n) if n == size => {
            sha.update(trailer);
            Ok(Ok(manifest::oci_digest(sha.finalize().as_slice())))
        }
        ReadOutcome::Verified(n) => Ok(Err(format!(
            "blob {d} holds {n} bytes, the record says {size}"
        ))),
        ReadOutcome::Corrupt => {
            local
                .quarantine(d, id)
                .map_err(|e| RemoteError::local(&e))?;
            Ok(Err(local_blob_gone(d)))
        }
    }
}

/// Streams a local blob (and `trailer` after it: a repaired copy) into an
/// upload. The registry checks the body against `sha`; should the local
/// read fail verification, an error is sent into the body so the upload
/// can never complete.
pub(super) fn upload_stream(
    reg: &Registry,
    local: &Store,
    d: &BlobDigest,
    sha: &str,
    size: u64,
    trailer: &[u8],
) -> Result<(), RemoteError> {
    let Some((file, id)) = open_blob(local, d)? else {
        return Err(RemoteError::other(local_blob_gone(d)));
    };
    reg.push_stream(sha, size + trailer.len() as u64, |tx| {
        let mut sink_closed = false;
        let outcome = read_blob(
            file,
            d,
            Dest::Stream(&mut |chunk| {
                tx.blocking_send(Ok(Bytes::copy_from_slice(chunk)))
                    .map_err(|_| {
                        sink_closed = true;
                        io::Error::other("the upload stopped")
                    })
            }),
        );
        let abort = |why: &str| {
            let _ = tx.blocking_send(Err(io::Error::other(why.to_string())));
        };
        match outcome {
            Ok(ReadOutcome::Verified(n)) if n == size => {
                if !trailer.is_empty() {
                    tx.blocking_send(Ok(Bytes::copy_from_slice(trailer)))
                        .map_err(|_| {
                            RemoteError::new(Kind::Unavailable, "the upload stopped early")
                        })?;
                }
                Ok(())
            }
            Ok(ReadOutcome::Verified(n)) => {
                let why = format!("blob {d} holds {n} bytes, the record says {size}");
                abort(&why);
                Err(RemoteError::other(why))
            }
            Ok(ReadOutcome::Corrupt) => {
                abort("local blob failed verification");
                let _ = local.quarantine(d, id);
                Err(RemoteError::other(local_blob_gone(d)))
            }
            Err(_) if sink_closed => Err(RemoteError::new(
                Kind::Unavailable,
                "the upload stopped early",
            )),
            Err(e) => {
                abort("reading the local blob failed");
                Err(RemoteError::other(format!("reading local blob {d}: {e}")))
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn rec(producer: &str, meta: serde_json::Value) -> Record {
        Record {
            node_id: "n".into(),
            kind: "k".into(),
            outputs: BTreeMap::new(),
            duration_ms: 0,
            producer: producer.into(),
            key_inputs: serde_json::Value::Null,
            created_unix: 0,
            meta,
        }
    }

    #[test]
    fn poisoning_checks() {
        use serde_json::json;
        assert_eq!(refusal(&rec("podman", json!(null))), None);
        assert_eq!(refusal(&rec("podman", json!({"exit_code": 0}))), None);
        assert_eq!(refusal(&rec("podman", json!({"id": "sha256:1"}))), None);
        assert!(refusal(&rec("", json!(null))).is_some());
        assert!(refusal(&rec("podman", json!({"exit_code": 1}))).is_some());
        assert!(refusal(&rec("podman", json!({"exit_status": "killed"}))).is_some());
        assert!(refusal(&rec("podman", json!({"failed": true}))).is_some());
    }
}
