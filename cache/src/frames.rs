//! The on-disk encoding of a blob: independent zstd frames of fixed size.
//!
//! A blob file is a sequence of zstd frames, each compressing exactly
//! [`FRAME`] bytes of content (the last one fewer; empty content is one empty
//! frame). Every frame is compressed by single-threaded zstd at
//! [`ZSTD_LEVEL`] with its content size in the header and no checksum (blake3
//! over the whole content is the check). Frame boundaries depend only on
//! offsets in the content, so the file is a pure function of the content no
//! matter how it was fed in or how many threads did the work. The file is a
//! valid zstd stream: `zstd -d` reads it.
//!
//! Independent frames are what make blobs fast on more than one core:
//! frames of a batch are compressed or decompressed in parallel (rayon), and
//! each task also hashes its frame while it is hot in cache. That works
//! because a frame is 512 KiB, a power-of-two number of blake3 chunks at an
//! aligned offset, i.e. a complete blake3 subtree: its chaining value is
//! computed on its own and the values are merged into the root hash at the
//! end (`blake3::hazmat`; tested against `blake3::hash` for many lengths).
//! Splitting at 512 KiB costs no measurable ratio on tar-like data (level 3
//! rarely matches further back than that) and lets a 1 MiB blob use two cores.
//!
//! Reading never trusts the file: every frame must parse, declare a content
//! size of exactly [`FRAME`] (the last: 1..=[`FRAME`]; a lone frame may be
//! empty) and decompress to exactly that size, or the blob is corrupt.
//! Memory is bounded by one batch on both sides.

use std::cell::RefCell;
use std::fs::File;
use std::io::{self, Read, Write};
use std::ops::Range;
use std::path::Path;

use blake3::hazmat::{
    ChainingValue, HasherExt, Mode, left_subtree_len, merge_subtrees_non_root, merge_subtrees_root,
};
use rayon::prelude::*;

use crate::error::IoContext;
use crate::{BlobDigest, CacheError};

/// zstd level of every frame. Fixed: a blob's bytes must not depend on who
/// wrote it. 3 is zstd's default balance of speed and ratio.
pub(crate) const ZSTD_LEVEL: i32 = 3;

/// Content bytes per frame.
pub(crate) const FRAME: usize = 512 * 1024;

/// Content bytes per batch (a whole number of frames): the unit of parallel
/// work and of memory use while streaming.
pub(crate) const BATCH: usize = 16 * FRAME;

thread_local! {
    // zstd contexts are worth reusing: allocating one costs more than
    // compressing a small frame.
    static COMPRESSOR: RefCell<Option<zstd::bulk::Compressor<'static>>> =
        const { RefCell::new(None) };
    static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { RefCell::new(None) };
}

fn compress_frame(content: &[u8]) -> io::Result<Vec<u8>> {
    COMPRESSOR.with(|c| {
        let mut c = c.borrow_mut();
        if c.is_none() {
            *c = Some(zstd::bulk::Compressor::new(ZSTD_LEVEL)?);
        }
        match c.as_mut() {
            Some(c) => c.compress(content),
            None => Err(io::Error::other("zstd compressor unavailable")),
        }
    })
}

/// Decompresses one frame into `out`, which must be exactly its content size.
fn decompress_frame(frame: &[u8], out: &mut [u8]) -> bool {
    DECOMPRESSOR.with(|d| {
        let mut d = d.borrow_mut();
        if d.is_none() {
            match zstd::bulk::Decompressor::new() {
                Ok(new) => *d = Some(new),
                Err(_) => return false,
            }
        }
        let want = out.len();
        d.as_mut()
            .is_some_and(|d| matches!(d.decompress_to_buffer(frame, out), Ok(n) if n == want))
    })
}

/// Reads until `buf` is full or the input ends; returns the bytes read.
pub(crate) fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// The blake3 chaining value of frame `index` (a complete subtree).
fn frame_cv(index: u64, content: &[u8]) -> ChainingValue {
    if content.is_empty() {
        // Only a lone frame may be empty, and a lone frame is hashed as a
        // root instead (blake3 rejects empty subtrees).
        return [0; 32];
    }
    let mut h = blake3::Hasher::new();
    h.set_input_offset(index * FRAME as u64);
    h.update(content);
    h.finalize_non_root()
}

/// Merges the chaining values of the frames of a `len`-byte content (two or
/// more frames, all full but the last) into the subtree's chaining value.
fn merge_cvs(cvs: &[ChainingValue], len: u64) -> ChainingValue {
    if cvs.len() <= 1 {
        // Frame layout is validated before hashing, so a split never yields
        // an empty side; if it did, any value just fails verification.
        return cvs.first().copied().unwrap_or([0; 32]);
    }
    let (left, right, left_len) = split_cvs(cvs, len);
    merge_subtrees_non_root(
        &merge_cvs(left, left_len),
        &merge_cvs(right, len - left_len),
        Mode::Hash,
    )
}

/// Splits frame CVs where blake3 splits the tree over `len` bytes. For more
/// than one frame that point is a power of two of at least [`FRAME`] bytes,
/// hence on a frame boundary.
fn split_cvs(cvs: &[ChainingValue], len: u64) -> (&[ChainingValue], &[ChainingValue], u64) {
    let left_len = left_subtree_len(len);
    let k = usize::try_from(left_len / FRAME as u64).map_or(cvs.len(), |k| k.min(cvs.len()));
    (&cvs[..k], &cvs[k..], left_len)
}

/// The blake3 hash of a content of `len` bytes, from its frames' CVs
/// (at least two frames).
fn root_from_cvs(cvs: &[ChainingValue], len: u64) -> blake3::Hash {
    let (left, right, left_len) = split_cvs(cvs, len);
    merge_subtrees_root(
        &merge_cvs(left, left_len),
        &merge_cvs(right, len - left_len),
        Mode::Hash,
    )
}

/// The digest of a content from what a reader or writer collected: the CVs
/// of every frame, or the root hash if the content was a single frame.
fn digest_of(cvs: &[ChainingValue], single: Option<blake3::Hash>, len: u64) -> BlobDigest {
    let hash = match (cvs.len(), single) {
        (0, _) => blake3::hash(b""),
        (1, Some(h)) => h,
        (2.., _) => root_from_cvs(cvs, len),
        // Callers always supply the root hash of a lone frame; without it
        // there is no digest, and all zeros matches nothing.
        (1, None) => return BlobDigest::from_bytes([0; 32]),
    };
    BlobDigest::from_bytes(*hash.as_bytes())
}

/// Encodes content into frames, batch by batch, hashing it on the way.
pub(crate) struct FrameWriter {
    hash: bool,
    cvs: Vec<ChainingValue>,
    single: Option<blake3::Hash>,
    total: u64,
    frames: u64,
}

impl FrameWriter {
    /// A writer; `hash` asks it to compute the content digest.
    pub(crate) fn new(hash: bool) -> FrameWriter {
        FrameWriter {
            hash,
            cvs: Vec::new(),
            single: None,
            total: 0,
            frames: 0,
        }
    }

    /// Encodes the next `content` (a multiple of [`FRAME`] long unless it is
    /// the last piece) and appends it to `out`.
    pub(crate) fn write(
        &mut self,
        content: &[u8],
        out: &mut File,
        path: &Path,
    ) -> Result<(), CacheError> {
        debug_assert!(self.total.is_multiple_of(FRAME as u64));
        let first = self.frames;
        let hash = self.hash;
        if hash && first == 0 && content.len() <= FRAME {
            // Possibly the whole content: a lone frame is hashed as a root.
            self.single = Some(blake3::hash(content));
        }
        let encoded: Vec<(Vec<u8>, Option<ChainingValue>)> = content
            .par_chunks(FRAME)
            .enumerate()
            .map(|(i, chunk)| {
                let cv = hash.then(|| frame_cv(first + i as u64, chunk));
                compress_frame(chunk).map(|f| (f, cv))
            })
            .collect::<io::Result<_>>()
            .at("compressing into", path)?;
        for (frame, cv) in encoded {
            out.write_all(&frame).at("writing", path)?;
            self.cvs.extend(cv);
            self.frames += 1;
        }
        self.total += content.len() as u64;
        Ok(())
    }

    /// Finishes the encoding; returns the digest (if hashing) and the
    /// content size.
    pub(crate) fn finish(
        self,
        out: &mut File,
        path: &Path,
    ) -> Result<(Option<BlobDigest>, u64), CacheError> {
        if self.frames == 0 {
            let empty = compress_frame(&[]).at("compressing into", path)?;
            out.write_all(&empty).at("writing", path)?;
        }
        let digest = self
            .hash
            .then(|| digest_of(&self.cvs, self.single, self.total));
        Ok((digest, self.total))
    }
}

/// How a verified read of a blob ended.
pub(crate) enum ReadOutcome {
    /// The content hashed to the expected digest; its size.
    Verified(u64),
    /// Undecodable, wrongly sized, or not the expected content.
    Corrupt,
}

/// Where decoded content goes.
pub(crate) enum Dest<'a> {
    /// Straight into a buffer that must end up exactly full (the content
    /// size is known from the index).
    Exact(&'a mut [u8]),
    /// Batch by batch to a consumer, which must treat what it got as
    /// provisional unless the outcome is `Verified`.
    Stream(&'a mut (dyn FnMut(&[u8]) -> io::Result<()> + Send)),
}

/// The compressed side of a read: complete frames, a batch at a time.
struct FrameSource {
    file: File,
    buf: Vec<u8>,
    pos: usize,
    len: usize,
    eof: bool,
    /// Frames handed out so far.
    frames: u64,
    /// Whether a frame shorter than [`FRAME`] was seen (it must be the last).
    short_seen: bool,
}

/// A frame of the current batch: where it is in the buffer, and its size.
type FrameRef = (Range<usize>, usize);

impl FrameSource {
    fn new(file: File) -> FrameSource {
        // Room for a batch of well-compressed frames plus a partial one, and
        // at least two worst-case frames; no bigger than the file, so small
        // blobs cost small buffers.
        let max = (2 << 20) + zstd::zstd_safe::compress_bound(FRAME);
        let file_len = file.metadata().map(|m| m.len()).unwrap_or(u64::MAX);
        // (One byte more than the file, so that the first fill sees its end.)
        let cap = usize::try_from(file_len.saturating_add(1)).map_or(max, |n| n.min(max));
        FrameSource {
            file,
            buf: vec![0; cap],
            pos: 0,
            len: 0,
            eof: false,
            frames: 0,
            short_seen: false,
        }
    }

    /// The next batch of complete frames (and whether it is the last);
    /// `Ok(None)` at the end, `Err(())` if the file is not a sequence of
    /// well-formed frames.
    fn next_batch(&mut self) -> Result<Option<(Vec<FrameRef>, bool)>, ()> {
        if self.pos > 0 {
            self.buf.copy_within(self.pos..self.len, 0);
            self.len -= self.pos;
            self.pos = 0;
        }
        while !self.eof && self.len < self.buf.len() {
            match self.file.read(&mut self.buf[self.len..]) {
                Ok(0) => self.eof = true,
                Ok(n) => self.len += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Err(()),
            }
        }
        if self.len == 0 {
            return Ok(None);
        }
        let mut frames = Vec::new();
        let mut off = 0;
        while frames.len() < BATCH / FRAME && off < self.len {
            match zstd::zstd_safe::find_frame_compressed_size(&self.buf[off..self.len]) {
                Ok(n) if n > 0 => {
                    let frame = &self.buf[off..off + n];
                    let size = match zstd::zstd_safe::get_frame_content_size(frame) {
                        Ok(Some(s)) if s <= FRAME as u64 => s as usize,
                        _ => return Err(()),
                    };
                    // Only the last frame may be short, and only a lone
                    // frame may be empty.
                    if self.short_seen || (size == 0 && self.frames > 0) {
                        return Err(());
                    }
                    self.short_seen = size < FRAME;
                    self.frames += 1;
                    frames.push((off..off + n, size));
                    off += n;
                }
                // A frame cut off by the end of a full buffer: next batch.
                _ if !frames.is_empty() && !self.eof => break,
                _ => return Err(()),
            }
        }
        self.pos = off;
        let last = self.eof && self.pos == self.len;
        Ok(Some((frames, last)))
    }
}

/// Decompresses a batch of frames into `dst` (exactly their total size),
/// the first being frame number `first` of the blob. Returns each frame's
/// chaining value, or `None` if a frame does not decode to its size.
fn decode_batch(
    src: &[u8],
    frames: &[FrameRef],
    first: u64,
    dst: &mut [u8],
) -> Option<Vec<ChainingValue>> {
    let mut outs: Vec<&mut [u8]> = Vec::with_capacity(frames.len());
    let mut rest = dst;
    for (_, size) in frames {
        let (head, tail) = rest.split_at_mut(*size);
        outs.push(head);
        rest = tail;
    }
    let task = |i: usize, range: &Range<usize>, out: &mut [u8]| {
        decompress_frame(&src[range.clone()], out).then(|| frame_cv(first + i as u64, out))
    };
    if frames.len() == 1 {
        return task(0, &frames[0].0, outs[0]).map(|cv| vec![cv]);
    }
    frames
        .par_iter()
        .zip(outs.into_par_iter())
        .enumerate()
        .map(|(i, ((range, _), out))| task(i, range, out))
        .collect()
}

/// Decoding state of one blob: frame CVs so far and bytes produced.
struct Decoder {
    src: FrameSource,
    cvs: Vec<ChainingValue>,
    single: Option<blake3::Hash>,
    total: usize,
}

impl Decoder {
    fn new(file: File) -> Decoder {
        Decoder {
            src: FrameSource::new(file),
            cvs: Vec::new(),
            single: None,
            total: 0,
        }
    }

    /// The next batch: its frames, whether it is the last, its content size.
    fn next_batch(&mut self) -> Result<Option<(Vec<FrameRef>, bool, usize)>, ()> {
        Ok(self.src.next_batch()?.map(|(frames, last)| {
            let len = frames.iter().map(|(_, s)| s).sum();
            (frames, last, len)
        }))
    }

    /// Decodes a batch into `dst` (exactly its content size), hashing it.
    fn decode(&mut self, frames: &[FrameRef], last: bool, dst: &mut [u8]) -> bool {
        let ok = if self.cvs.is_empty() && last && frames.len() == 1 {
            // The whole content is one frame: its hash is a root hash.
            let ok = decompress_frame(&self.src.buf[frames[0].0.clone()], dst);
            self.single = ok.then(|| blake3::hash(dst));
            self.cvs.push([0; 32]);
            ok
        } else {
            match decode_batch(&self.src.buf, frames, self.cvs.len() as u64, dst) {
                Some(cvs) => {
                    self.cvs.extend(cvs);
                    true
                }
                None => false,
            }
        };
        self.total += dst.len();
        ok
    }

    /// The digest of everything decoded; `last_batch` is the content of the
    /// final batch (all of it if the content was a single frame).
    fn digest(&self, last_batch: &[u8]) -> BlobDigest {
        let single = match (self.cvs.len(), self.single) {
            // A lone frame not recognised as such up front.
            (1, None) => Some(blake3::hash(last_batch)),
            (_, single) => single,
        };
        digest_of(&self.cvs, single, self.total as u64)
    }
}

/// Decodes and verifies the blob in `file` against `expected`.
/// `Err` only if a [`Dest::Stream`] consumer failed.
pub(crate) fn read_blob(
    file: File,
    expected: &BlobDigest,
    dest: Dest<'_>,
) -> io::Result<ReadOutcome> {
    let mut dec = Decoder::new(file);
    let verified = match dest {
        Dest::Exact(buf) => {
            while let Some((frames, last, len)) = match dec.next_batch() {
                Ok(batch) => batch,
                Err(()) => return Ok(ReadOutcome::Corrupt),
            } {
                let start = dec.total;
                let Some(dst) = buf.get_mut(start..start + len) else {
                    return Ok(ReadOutcome::Corrupt);
                };
                if !dec.decode(&frames, last, dst) {
                    return Ok(ReadOutcome::Corrupt);
                }
            }
            buf.len() == dec.total && dec.digest(buf) == *expected
        }
        Dest::Stream(sink) => {
            // Double-buffered: the consumer takes one batch (usually a
            // single-threaded write) while the next one is decoded.
            let (mut ready, mut spare) = (Vec::new(), Vec::new());
            while let Some((frames, last, len)) = match dec.next_batch() {
                Ok(batch) => batch,
                Err(()) => return Ok(ReadOutcome::Corrupt),
            } {
                spare.resize(len, 0);
                let (decoded, consumed) = rayon::join(
                    || dec.decode(&frames, last, &mut spare),
                    || {
                        if ready.is_empty() {
                            Ok(())
                        } else {
                            sink(&ready)
                        }
                    },
                );
                consumed?;
                if !decoded {
                    return Ok(ReadOutcome::Corrupt);
                }
                std::mem::swap(&mut ready, &mut spare);
            }
            if !ready.is_empty() {
                sink(&ready)?;
            }
            dec.digest(&ready) == *expected
        }
    };
    Ok(if verified {
        ReadOutcome::Verified(dec.total as u64)
    } else {
        ReadOutcome::Corrupt
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn content(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 1000) as u8).collect()
    }

    fn encode(data: &[u8], step: usize) -> (Vec<u8>, BlobDigest) {
        let mut file = tempfile::tempfile().expect("tempfile");
        let path = Path::new("test");
        let mut w = FrameWriter::new(true);
        for piece in data.chunks(step) {
            w.write(piece, &mut file, path).expect("write");
        }
        let (d, len) = w.finish(&mut file, path).expect("finish");
        assert_eq!(len, data.len() as u64);
        let mut bytes = Vec::new();
        use std::io::Seek;
        file.rewind().expect("rewind");
        file.read_to_end(&mut bytes).expect("read");
        (bytes, d.expect("digest"))
    }

    fn decode(bytes: &[u8], expected: &BlobDigest) -> Option<Vec<u8>> {
        let mut file = tempfile::tempfile().expect("tempfile");
        file.write_all(bytes).expect("write");
        use std::io::Seek;
        file.rewind().expect("rewind");
        let mut out = Vec::new();
        match read_blob(
            file,
            expected,
            Dest::Stream(&mut |c| {
                out.extend_from_slice(c);
                Ok(())
            }),
        ) {
            Ok(ReadOutcome::Verified(n)) => {
                assert_eq!(n, out.len() as u64);
                Some(out)
            }
            _ => None,
        }
    }

    #[test]
    fn frame_tree_hash_equals_blake3_for_many_lengths() {
        let lens = [
            0,
            1,
            1024,
            1025,
            FRAME - 1,
            FRAME,
            FRAME + 1,
            2 * FRAME,
            2 * FRAME + 1,
            3 * FRAME,
            3 * FRAME + 4097,
            5 * FRAME - 1,
            8 * FRAME,
            BATCH,
            BATCH + 1,
            BATCH + FRAME,
            2 * BATCH + 3 * FRAME + 77,
        ];
        for len in lens {
            let data = content(len);
            let expected = BlobDigest::of(&data);
            // Batch-sized pieces, as the store feeds them.
            let (bytes, d) = encode(&data, BATCH);
            assert_eq!(d, expected, "writer digest, len {len}");
            assert_eq!(
                zstd::decode_all(&bytes[..]).expect("plain zstd"),
                data,
                "len {len}"
            );
            assert_eq!(
                decode(&bytes, &expected).as_deref(),
                Some(&data[..]),
                "len {len}"
            );
            let mut file = tempfile::tempfile().expect("tempfile");
            file.write_all(&bytes).expect("write");
            use std::io::Seek;
            file.rewind().expect("rewind");
            let mut exact = vec![0u8; len];
            assert!(matches!(
                read_blob(file, &expected, Dest::Exact(&mut exact)),
                Ok(ReadOutcome::Verified(_))
            ));
            assert_eq!(exact, data);
        }
    }

    #[test]
    fn malformed_frame_sequences_are_corrupt() {
        let data = content(3 * FRAME + 10);
        let d = BlobDigest::of(&data);
        // Same content, but split at the wrong places: valid zstd, valid
        // content, wrong layout. It must be rejected, not mis-hashed.
        let mut odd = Vec::new();
        for piece in [&data[..100], &data[100..]] {
            odd.extend(zstd::bulk::compress(piece, ZSTD_LEVEL).expect("compress"));
        }
        assert_eq!(zstd::decode_all(&odd[..]).expect("decodes"), data);
        assert_eq!(decode(&odd, &d), None);
        // An empty frame after real ones.
        let (mut bytes, d2) = encode(&data, BATCH);
        assert_eq!(d2, d);
        bytes.extend(zstd::bulk::compress(&[], ZSTD_LEVEL).expect("compress"));
        assert_eq!(decode(&bytes, &d), None);
        // A frame without a content size.
        let mut enc = zstd::stream::write::Encoder::new(Vec::new(), ZSTD_LEVEL).expect("encoder");
        enc.include_contentsize(false).expect("no content size");
        enc.write_all(&data[..1000]).expect("write");
        let streamed = enc.finish().expect("finish");
        assert_eq!(
            zstd::decode_all(&streamed[..]).expect("decodes"),
            &data[..1000]
        );
        assert_eq!(decode(&streamed, &BlobDigest::of(&data[..1000])), None);
        // Truncation and garbage.
        let (bytes, _) = encode(&data, BATCH);
        assert_eq!(decode(&bytes[..bytes.len() - 1], &d), None);
        let mut extra = bytes.clone();
        extra.extend_from_slice(b"garbage");
        assert_eq!(decode(&extra, &d), None);
        assert_eq!(decode(&bytes, &d).as_deref(), Some(&data[..]));
    }
}
