//! The two 32-byte digests of the store, as distinct newtypes.
//!
//! [`NodeKey`] names a build-graph node's result (the engine hashes the node's
//! canonical key inputs); [`BlobDigest`] names blob *content* (blake3 of the
//! uncompressed bytes). Both are blake3 sized and both print as 64 lowercase hex
//! digits, but they are different things: there is deliberately no conversion
//! between them, so a key can never be used where content is expected.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::CacheError;

const HEX: &[u8; 16] = b"0123456789abcdef";

/// 32 bytes as 64 lowercase hex digits (what both digests print).
pub fn encode_hex(bytes: &[u8; 32]) -> String {
    let mut s = String::with_capacity(64);
    for b in bytes {
        s.push(char::from(HEX[usize::from(b >> 4)]));
        s.push(char::from(HEX[usize::from(b & 0x0f)]));
    }
    s
}

/// Each byte's value as a hex digit (either case), `0xff` for the others:
/// a journal or stat cache read parses thousands of digests.
const UNHEX: [u8; 256] = {
    let mut t = [0xff; 256];
    let mut i = 0;
    while i < 10 {
        t[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        t[b'a' as usize + i] = 10 + i as u8;
        t[b'A' as usize + i] = 10 + i as u8;
        i += 1;
    }
    t
};

/// The 32 bytes of 64 hex digits (lowercase only with `lower_only`).
fn decode(raw: &[u8], lower_only: bool) -> Option<[u8; 32]> {
    if raw.len() != 64 || (lower_only && raw.iter().any(u8::is_ascii_uppercase)) {
        return None;
    }
    let mut out = [0u8; 32];
    for (o, pair) in out.iter_mut().zip(raw.chunks_exact(2)) {
        let (hi, lo) = (UNHEX[usize::from(pair[0])], UNHEX[usize::from(pair[1])]);
        if (hi | lo) > 0x0f {
            return None;
        }
        *o = (hi << 4) | lo;
    }
    Some(out)
}

/// Exactly what [`encode_hex`] writes, parsed back: 64 lowercase hex digits,
/// else `None` (no error is built, for callers that try every value they
/// see).
pub fn decode_exact_hex(s: &str) -> Option<[u8; 32]> {
    decode(s.as_bytes(), true)
}

fn decode_hex(s: &str) -> Result<[u8; 32], CacheError> {
    decode(s.as_bytes(), false).ok_or_else(|| CacheError::InvalidDigest {
        input: s.chars().take(80).collect(),
        reason: if s.len() == 64 {
            "not a hex digit"
        } else {
            "expected 64 hex digits"
        },
    })
}

macro_rules! digest_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name([u8; 32]);

        impl $name {
            /// Wraps 32 raw digest bytes.
            pub const fn from_bytes(bytes: [u8; 32]) -> Self {
                Self(bytes)
            }

            /// The 32 raw digest bytes.
            pub const fn as_bytes(&self) -> &[u8; 32] {
                &self.0
            }

            /// The full digest as 64 lowercase hex digits.
            pub fn to_hex(&self) -> String {
                encode_hex(&self.0)
            }

            /// The first `n` hex digits (at most 64), for display.
            pub fn short(&self, n: usize) -> String {
                let mut s = self.to_hex();
                s.truncate(n.min(64));
                s
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.to_hex())
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({})"), self.short(16))
            }
        }

        impl FromStr for $name {
            type Err = CacheError;

            /// Parses 64 hex digits (either case).
            fn from_str(s: &str) -> Result<Self, CacheError> {
                decode_hex(s).map(Self)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(&self.to_hex())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

digest_type!(
    /// The key of a build-graph node: blake3 of the node's canonical key inputs,
    /// computed by the engine. Names an entry of the action cache.
    NodeKey
);

digest_type!(
    /// The address of a blob: blake3 of its uncompressed content.
    BlobDigest
);

impl BlobDigest {
    /// The digest of `content` (blake3 of the uncompressed bytes).
    pub fn of(content: &[u8]) -> Self {
        Self(*hash_bytes(content).as_bytes())
    }
}

/// Inputs at least this long are hashed with blake3's multi-threaded mode.
pub(crate) const RAYON_HASH_THRESHOLD: usize = 256 * 1024;

/// blake3 of `bytes`, using all cores for large inputs.
pub(crate) fn hash_bytes(bytes: &[u8]) -> blake3::Hash {
    let mut hasher = blake3::Hasher::new();
    update_hasher(&mut hasher, bytes);
    hasher.finalize()
}

/// Feeds `bytes` to `hasher`, using all cores for large chunks.
pub(crate) fn update_hasher(hasher: &mut blake3::Hasher, bytes: &[u8]) {
    if bytes.len() >= RAYON_HASH_THRESHOLD {
        hasher.update_rayon(bytes);
    } else {
        hasher.update(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip_and_display() {
        let mut bytes = [0u8; 32];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = u8::try_from(i * 7 % 256).expect("fits");
        }
        let key = NodeKey::from_bytes(bytes);
        let hex = key.to_hex();
        assert_eq!(hex.len(), 64);
        assert!(hex.starts_with("00070e15"));
        assert_eq!(key.to_string(), hex);
        assert_eq!(hex.parse::<NodeKey>().expect("parses"), key);
        assert_eq!(hex.to_uppercase().parse::<NodeKey>().expect("parses"), key);
        assert_eq!(decode_exact_hex(&hex), Some(bytes));
        assert_eq!(decode_exact_hex(&hex.to_uppercase()), None);
        assert_eq!(decode_exact_hex(&hex[1..]), None);
        assert_eq!(key.short(8), "00070e15");
        assert_eq!(key.short(100).len(), 64);
        assert_eq!(format!("{key:?}"), "NodeKey(00070e151c232a31)");
    }

    #[test]
    fn bad_hex_is_rejected() {
        assert!("abc".parse::<BlobDigest>().is_err());
        let not_hex = "g".repeat(64);
        assert!(not_hex.parse::<BlobDigest>().is_err());
        let too_long = "a".repeat(66);
        assert!(too_long.parse::<BlobDigest>().is_err());
        // Multi-byte UTF-8 of the right byte length must not panic.
        let unicode = "é".repeat(32);
        assert!(unicode.parse::<BlobDigest>().is_err());
        // The characters either side of each hex range.
        for c in ['/', ':', '@', 'G', '`', 'g', '\0'] {
            let one_bad = format!("{}{c}", "a".repeat(63));
            assert!(one_bad.parse::<BlobDigest>().is_err(), "{c:?}");
        }
    }

    #[test]
    fn blob_digest_is_blake3_of_content() {
        let d = BlobDigest::of(b"hello");
        assert_eq!(d.as_bytes(), blake3::hash(b"hello").as_bytes());
        let big = vec![7u8; 1 << 20];
        assert_eq!(
            BlobDigest::of(&big).as_bytes(),
            blake3::hash(&big).as_bytes()
        );
    }

    #[test]
    fn serde_uses_hex_strings() {
        let d = BlobDigest::of(b"x");
        let json = serde_json::to_string(&d).expect("serializes");
        assert_eq!(json, format!("\"{}\"", d.to_hex()));
        let back: BlobDigest = serde_json::from_str(&json).expect("deserializes");
        assert_eq!(back, d);
        assert!(serde_json::from_str::<BlobDigest>("\"zz\"").is_err());
    }
}
