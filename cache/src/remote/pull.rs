//! Fetching a record and its blobs from the registry into the local store.
//!
//! Nothing from the registry reaches the store unverified. Blob bodies are
//! streamed through [`VerifyingReader`] straight into
//! [`Store::put_blob_reader`]: the reader hashes what passes through with
//! both sha256 (the registry's address) and blake3 (charly's), counts it,
//! and at the end of the body fails the read if either digest or the size
//! is wrong, so the store drops its temp file instead of committing the
//! blob. The record is put into the local store only after all its blobs
//! are in, by the store's ordinary rule (blobs durable first).

use std::io::{self, Read};

use bytes::{Buf, Bytes};
use futures_util::StreamExt;
use sha2::Digest as _;

use super::error::{Kind, RemoteError, classify_io};
use super::manifest::{self, Layer, tag_for};
use super::registry::{BlobStream, Registry};
use super::stats::Counters;
use crate::{BlobDigest, CacheError, NodeKey, Record, Store};

/// How a pull ended, when it did not fail.
pub(crate) enum Fetched {
    /// The record is now in the local store.
    Stored(Record),
    /// The registry has no record for the key.
    Missing,
}

/// Why a pull failed: the registry (a miss for the build) or the local
/// store (a real error).
pub(crate) enum PullFail {
    Remote(RemoteError),
    Local(CacheError),
}

impl From<RemoteError> for PullFail {
    fn from(e: RemoteError) -> PullFail {
        PullFail::Remote(e)
    }
}

impl From<CacheError> for PullFail {
    fn from(e: CacheError) -> PullFail {
        PullFail::Local(e)
    }
}

/// Fetches `key`'s record and any blobs `local` lacks, verifies everything,
/// stores the blobs, then the record.
pub(crate) fn fetch(
    reg: &Registry,
    counters: &Counters,
    local: &Store,
    key: &NodeKey,
) -> Result<Fetched, PullFail> {
    let tag = tag_for(key);
    let Some((body, _)) = reg.get_manifest(&tag)? else {
        return Ok(Fetched::Missing);
    };
    Counters::add(&counters.bytes_down, body.len() as u64);
    let m = manifest::parse(key, &body)
        .map_err(|e| RemoteError::corrupt(format!("manifest {tag}: {e}")))?;

    let config = Layer {
        sha256: m.config.digest.clone(),
        blake3: BlobDigest::of(b""), // unused: records are checked by sha256
        size: m.config.size,
        trailer: 0,
    };
    let mut json = Vec::with_capacity(usize::try_from(config.size).unwrap_or(0));
    let mut reader = VerifyingReader::new(reg, reg.pull_blob(&config.sha256)?, config, false);
    if reader.read_to_end(&mut json).is_err() {
        return Err(reader
            .failure()
            .context(format!("record of {tag}"))
            .in_blob(&m.config.digest)
            .into());
    }
    Counters::add(&counters.bytes_down, json.len() as u64);
    let rec: Record = serde_json::from_slice(&json)
        .map_err(|e| RemoteError::corrupt(format!("record of {tag} does not decode: {e}")))?;
    let layers = manifest::layers_for(&m, &rec)
        .map_err(|e| RemoteError::corrupt(format!("manifest {tag}: {e}")))?;

    for layer in layers {
        if local.has_blob(&layer.blake3) {
            continue;
        }
        let blake3 = layer.blake3;
        let size = layer.size;
        let sha256 = layer.sha256.clone();
        let stream = reg.pull_blob(&layer.sha256)?;
        let mut reader = VerifyingReader::new(reg, stream, layer, true);
        match local.put_blob_reader(&mut reader) {
            Ok((d, n)) if d == blake3 && n == size => {
                Counters::add(&counters.bytes_down, n);
            }
            // The reader checked both already; this would be a store bug.
            Ok((d, n)) => {
                return Err(RemoteError::corrupt(format!(
                    "blob {blake3} of {tag} stored as {d} ({n} bytes)"
                ))
                .into());
            }
            Err(CacheError::Input(_)) => {
                return Err(reader
                    .failure()
                    .context(format!("blob {blake3} of {tag}"))
                    .in_blob(&sha256)
                    .into());
            }
            Err(e) => return Err(e.into()),
        }
    }

    local.put_record(key, &rec)?;
    // Another process may have put its own record first; that one wins.
    match local.get_record(key)? {
        Some(stored) => Ok(Fetched::Stored(stored)),
        None => Err(RemoteError::other(format!(
            "record {tag} vanished from the local store right after it was stored"
        ))
        .into()),
    }
}

/// A blocking [`Read`] over a blob body being downloaded, which verifies
/// the body as it ends (see the module docs). A failed read leaves the
/// cause in [`VerifyingReader::failure`].
pub(crate) struct VerifyingReader<'a> {
    reg: &'a Registry,
    stream: BlobStream,
    expect: Layer,
    check_blake3: bool,
    pending: Bytes,
    sha: sha2::Sha256,
    b3: blake3::Hasher,
    got: u64,
    done: bool,
    failure: Option<RemoteError>,
}

impl<'a> VerifyingReader<'a> {
    pub(crate) fn new(
        reg: &'a Registry,
        stream: BlobStream,
        expect: Layer,
        check_blake3: bool,
    ) -> VerifyingReader<'a> {
        VerifyingReader {
            reg,
            stream,
            expect,
            check_blake3,
            pending: Bytes::new(),
            sha: sha2::Sha256::new(),
            b3: blake3::Hasher::new(),
            got: 0,
            done: false,
            failure: None,
        }
    }

    /// Why the last read failed.
    pub(crate) fn failure(&mut self) -> RemoteError {
        self.failure
            .take()
            .unwrap_or_else(|| RemoteError::other("download failed for an unknown reason"))
    }

    fn fail(&mut self, e: RemoteError) -> io::Error {
        let err = io::Error::other(e.message.clone());
        self.failure = Some(e);
        err
    }

    /// Checks the complete body.
    fn verify_end(&mut self) -> Result<(), RemoteError> {
        let total = self.expect.size + self.expect.trailer;
        if self.got != total {
            return Err(RemoteError::corrupt(format!(
                "truncated: {} of {total} bytes",
                self.got
            )));
        }
        let sha = manifest::oci_digest(self.sha.clone().finalize().as_slice());
        if sha != self.expect.sha256 {
            return Err(RemoteError::corrupt(format!(
                "sha256 mismatch: expected {}, got {sha}",
                self.expect.sha256
            )));
        }
        if self.check_blake3 {
            let b3 = BlobDigest::from_bytes(*self.b3.finalize().as_bytes());
            if b3 != self.expect.blake3 {
                return Err(RemoteError::corrupt(format!(
                    "blake3 mismatch: expected {}, got {b3}",
                    self.expect.blake3
                )));
            }
        }
        Ok(())
    }
}

impl Read for VerifyingReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if !self.pending.is_empty() {
                let n = buf.len().min(self.pending.len());
                buf[..n].copy_from_slice(&self.pending[..n]);
                self.pending.advance(n);
                return Ok(n);
            }
            if self.done || buf.is_empty() {
                return Ok(0);
            }
            let next = self.reg.runtime().block_on(self.stream.next());
            match next {
                Some(Ok(mut chunk)) => {
                    let before = self.got;
                    self.got += chunk.len() as u64;
                    let total = self.expect.size + self.expect.trailer;
                    if self.got > total {
                        let e =
                            RemoteError::corrupt(format!("more than the {total} bytes announced"));
                        return Err(self.fail(e));
                    }
                    self.sha.update(&chunk);
                    // A repaired copy's trailer is hashed, never passed on.
                    let own = self.expect.size.saturating_sub(before);
                    chunk.truncate(usize::try_from(own).unwrap_or(usize::MAX).min(chunk.len()));
                    if self.check_blake3 {
                        crate::digest::update_hasher(&mut self.b3, &chunk);
                    }
                    self.pending = chunk;
                }
                Some(Err(e)) => {
                    // The client's own digest check surfaces here as an
                    // error of the stream; anything else broke the transfer
                    // off mid-body, which is a truncated blob all the same.
                    let what = match classify_io(&e) {
                        Kind::Corrupt => "digest check failed",
                        _ => "transfer broke off",
                    };
                    let short = if self.got < self.expect.size + self.expect.trailer {
                        "truncated: "
                    } else {
                        ""
                    };
                    let err = RemoteError::corrupt(format!(
                        "{short}{what} after {} of {} bytes: {}",
                        self.got,
                        self.expect.size + self.expect.trailer,
                        super::error::error_chain(&e)
                    ));
                    return Err(self.fail(err));
                }
                None => {
                    self.done = true;
                    if let Err(e) = self.verify_end() {
                        return Err(self.fail(e));
                    }
                }
            }
        }
    }
}
