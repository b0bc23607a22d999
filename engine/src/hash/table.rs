//! The stat cache's file, used where it lies: a table sorted by path that a
//! lookup binary-searches, so loading it is one read and one check, not a
//! map built entry by entry (at 10,000 candies, 100,000 entries, that build
//! took 55 ms of a core while the project loads, and ~14 MB).
//!
//! Layout, little-endian:
//!
//! ```text
//! magic      16 bytes  "charly-statc-v2\n"
//! checksum   32 bytes  blake3 of everything after it
//! pruned_len u64       entries left after the last prune
//! count      u32
//! offsets    u32 × count, each entry's start in the entry area, in path order
//! entries    size u64, mtime_ns i64, ctime_ns i64, ino u64, digest 32 bytes,
//!            path length u32, path bytes
//! ```
//!
//! A file that fails any check (magic, checksum, bounds, order) is not
//! used: the cache starts empty and files are hashed again, never served
//! from bytes that are not what was written.

use super::Stat;
use charly_cache::BlobDigest;

const MAGIC: &[u8; 16] = b"charly-statc-v2\n";
const HEAD: usize = 16 + 32 + 8 + 4;
/// size, mtime, ctime, inode, digest, path length.
const FIXED: usize = 8 * 4 + 32 + 4;

/// A checked cache file.
#[derive(Default)]
pub(super) struct Table {
    bytes: Vec<u8>,
    count: usize,
    /// Where the entry area starts.
    entries_at: usize,
}

/// One entry as the table holds it.
pub(super) type Row<'a> = (&'a [u8], Stat, BlobDigest);

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

impl Table {
    /// Whether `bytes` start as a file of this layout does (whole and
    /// well-formed or not).
    pub(super) fn is_current(bytes: &[u8]) -> bool {
        bytes.starts_with(MAGIC)
    }

    /// The table in `bytes`, or `None` when they are not a whole,
    /// well-formed cache file.
    pub(super) fn parse(bytes: Vec<u8>) -> Option<Table> {
        if !Self::is_current(&bytes) || bytes.len() < HEAD {
            return None;
        }
        if blake3::hash(&bytes[48..]).as_bytes() != &bytes[16..48] {
            return None;
        }
        let count = usize::try_from(u32_at(&bytes, 56)?).ok()?;
        let entries_at = HEAD.checked_add(count.checked_mul(4)?)?;
        if entries_at > bytes.len() {
            return None;
        }
        let t = Table {
            bytes,
            count,
            entries_at,
        };
        // Every entry in bounds and the paths strictly increasing: a
        // lookup then never reads outside the file, and finds what is there.
        let mut last: Option<&[u8]> = None;
        for i in 0..count {
            let (path, ..) = t.row(i)?;
            if last.is_some_and(|l| l >= path) {
                return None;
            }
            last = Some(path);
        }
        Some(t)
    }

    pub(super) fn pruned_len(&self) -> u64 {
        u64_at(&self.bytes, 48).unwrap_or(0)
    }

    pub(super) fn len(&self) -> usize {
        self.count
    }

    /// Entry `i` (in path order); `None` only for a table [`Table::parse`]
    /// would refuse.
    fn row(&self, i: usize) -> Option<Row<'_>> {
        let b = &self.bytes;
        let at = self
            .entries_at
            .checked_add(usize::try_from(u32_at(b, HEAD + 4 * i)?).ok()?)?;
        let fixed = b.get(at..at.checked_add(FIXED)?)?;
        let n = |k: usize| u64_at(fixed, 8 * k).unwrap_or(0);
        // Stored as the bits of the i64s (`as`: a reinterpretation, both ways).
        let stat = Stat {
            size: n(0),
            mtime_ns: n(1) as i64,
            ctime_ns: n(2) as i64,
            ino: n(3),
        };
        let digest = BlobDigest::from_bytes(fixed[32..64].try_into().ok()?);
        let len = usize::try_from(u32_at(fixed, 64)?).ok()?;
        let path = b.get(at + FIXED..(at + FIXED).checked_add(len)?)?;
        Some((path, stat, digest))
    }

    /// The stat and digest recorded for `path`.
    pub(super) fn get(&self, path: &[u8]) -> Option<(Stat, BlobDigest)> {
        let (mut lo, mut hi) = (0, self.count);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let (p, stat, digest) = self.row(mid)?;
            match p.cmp(path) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some((stat, digest)),
            }
        }
        None
    }

    /// Every entry, in path order.
    pub(super) fn rows(&self) -> impl Iterator<Item = Row<'_>> {
        (0..self.count).filter_map(|i| self.row(i))
    }

    /// A cache file holding `rows`, which must be in strictly increasing
    /// path order (else [`Table::parse`] refuses the file).
    pub(super) fn encode(rows: &[Row<'_>], pruned_len: u64) -> Vec<u8> {
        let area: usize = rows.iter().map(|(p, ..)| FIXED + p.len()).sum();
        let mut out = Vec::with_capacity(HEAD + 4 * rows.len() + area);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&[0; 32]);
        out.extend_from_slice(&pruned_len.to_le_bytes());
        out.extend_from_slice(&u32::try_from(rows.len()).unwrap_or(u32::MAX).to_le_bytes());
        let mut at = 0usize;
        for (p, ..) in rows {
            out.extend_from_slice(&u32::try_from(at).unwrap_or(u32::MAX).to_le_bytes());
            at += FIXED + p.len();
        }
        for (p, s, d) in rows {
            out.extend_from_slice(&s.size.to_le_bytes());
            out.extend_from_slice(&s.mtime_ns.to_le_bytes());
            out.extend_from_slice(&s.ctime_ns.to_le_bytes());
            out.extend_from_slice(&s.ino.to_le_bytes());
            out.extend_from_slice(d.as_bytes());
            out.extend_from_slice(&u32::try_from(p.len()).unwrap_or(u32::MAX).to_le_bytes());
            out.extend_from_slice(p);
        }
        let sum = blake3::hash(&out[48..]);
        out[16..48].copy_from_slice(sum.as_bytes());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(i: u64) -> Stat {
        Stat {
            size: i,
            mtime_ns: -(i as i64),
            ctime_ns: i64::MAX - i as i64,
            ino: u64::MAX - i,
        }
    }

    fn digest(i: u8) -> BlobDigest {
        BlobDigest::from_bytes([i; 32])
    }

    #[test]
    fn encoded_rows_read_back_and_are_found() {
        let paths: Vec<Vec<u8>> = ["", "/a", "/a/b", "/a-b", "/b/ü"]
            .iter()
            .map(|p| p.as_bytes().to_vec())
            .collect();
        let mut sorted = paths.clone();
        sorted.sort();
        let rows: Vec<Row> = sorted
            .iter()
            .enumerate()
            .map(|(i, p)| (p.as_slice(), stat(i as u64), digest(i as u8)))
            .collect();
        let t = Table::parse(Table::encode(&rows, 7)).expect("parses");
        assert_eq!(t.len(), 5);
        assert_eq!(t.pruned_len(), 7);
        assert!(t.rows().eq(rows.iter().copied()));
        for (i, p) in sorted.iter().enumerate() {
            assert_eq!(t.get(p), Some((stat(i as u64), digest(i as u8))));
        }
        assert_eq!(t.get(b"/a/"), None);
        assert_eq!(t.get(b"/c"), None);
        let empty = Table::parse(Table::encode(&[], 0)).expect("empty parses");
        assert_eq!((empty.len(), empty.get(b"/a")), (0, None));
    }

    /// Any changed byte, a cut, rows out of order or an old file: refused.
    #[test]
    fn damaged_files_are_refused() {
        let rows: Vec<Row> = vec![
            (b"/a".as_slice(), stat(1), digest(1)),
            (b"/b".as_slice(), stat(2), digest(2)),
        ];
        let good = Table::encode(&rows, 0);
        assert!(Table::parse(good.clone()).is_some());
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x01;
            assert!(Table::parse(bad).is_none(), "byte {i} flipped");
        }
        for n in 0..good.len() {
            assert!(Table::parse(good[..n].to_vec()).is_none(), "cut at {n}");
        }
        let unsorted = Table::encode(&[rows[1], rows[0]], 0);
        assert!(Table::parse(unsorted).is_none());
        let twice = Table::encode(&[rows[0], rows[0]], 0);
        assert!(Table::parse(twice).is_none());
        assert!(Table::parse(b"not a cache".to_vec()).is_none());
        assert!(Table::is_current(&good) && !Table::is_current(b"not a cache"));
    }
}
