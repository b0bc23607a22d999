//! Parsed trees remembered between runs.
//!
//! Parsing YAML is most of what loading a large project costs, and between
//! two runs almost every manifest is unchanged. The loader asks a
//! [`TreeCache`] for the trees of a file by the digest of its text before it
//! parses it, and gives it the trees of every file it did parse. The cache's
//! storage is the caller's (the CLI keeps it in the store); this module only
//! turns trees into bytes and back ([`encode`], [`decode`]).
//!
//! A tree from the cache is the tree the parser would give for that text —
//! the same scalars, styles and spans — so everything read from it (the
//! model, warnings, file:line:col of every diagnostic) is identical whether
//! the cache answered or not. Only successful parses are remembered: a file
//! with a syntax error is parsed (and diagnosed) every time. Bytes that do
//! not decode to a well-formed tree for the text at hand are ignored and the
//! text is parsed.

use super::node::{MAX_DEPTH, Node, Style, Value, parse_stream};
use crate::diag::Diagnostic;
use crate::source::{FileId, Span};

/// Version of the encoding (and of the parser's output): a cache made under
/// another must not be used. Bump it whenever [`parse_stream`] would give a
/// different tree for the same text.
pub const TREE_FORMAT: u32 = 1;

/// The key of a file's trees: the blake3 digest of its text.
pub type TreeKey = [u8; 32];

/// Where parsed trees are remembered between runs (by the caller: the
/// rules crate itself does no I/O for it). Shared by the loader's threads.
pub trait TreeCache: Send + Sync {
    /// The encoded trees ([`encode`]) of the text with this digest, if remembered.
    fn get(&self, key: &TreeKey) -> Option<&[u8]>;
    /// Remembers the encoded trees of the text with this digest.
    fn put(&self, key: TreeKey, encoded: Vec<u8>);
}

/// The key of `text`'s trees.
pub fn key_of(text: &str) -> TreeKey {
    *blake3::hash(text.as_bytes()).as_bytes()
}

/// [`parse_stream`], answered from `cache` when it has the trees of this
/// text (and told the trees otherwise).
pub fn parse_cached(
    cache: Option<&dyn TreeCache>,
    file: FileId,
    text: &str,
) -> Result<Vec<Node>, Diagnostic> {
    let Some(cache) = cache else {
        return parse_stream(file, text);
    };
    let key = key_of(text);
    if let Some(docs) = cache.get(&key).and_then(|b| decode(b, file, text)) {
        return Ok(docs);
    }
    let docs = parse_stream(file, text)?;
    cache.put(key, encode(&docs, text));
    Ok(docs)
}

// Node tags. A scalar's tag also says whether its text is exactly the
// source under its span (most plain scalars): then only the span is kept.
const SCALAR_PLAIN: u8 = 0;
const SCALAR_QUOTED: u8 = 1;
const SCALAR_BLOCK: u8 = 2;
const SEQ: u8 = 3;
const MAP: u8 = 4;
const FROM_SOURCE: u8 = 0x10;

/// The documents of one file as bytes (spans without their file id: the
/// decoder is told it). `text` is the file's text.
pub fn encode(docs: &[Node], text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    put_varint(&mut out, docs.len() as u64);
    for d in docs {
        encode_node(&mut out, d, text);
    }
    out
}

fn encode_node(out: &mut Vec<u8>, n: &Node, text: &str) {
    let s = n.span;
    let tag_at = out.len();
    out.push(0);
    for v in [s.offset, s.len, s.line, s.col] {
        put_varint(out, u64::from(v));
    }
    let tag = match &n.value {
        Value::Scalar(v, style) => {
            let style = match style {
                Style::Plain => SCALAR_PLAIN,
                Style::Quoted => SCALAR_QUOTED,
                Style::Block => SCALAR_BLOCK,
            };
            if source_slice(text, s) == Some(v.as_str()) {
                style | FROM_SOURCE
            } else {
                put_varint(out, v.len() as u64);
                out.extend_from_slice(v.as_bytes());
                style
            }
        }
        Value::Seq(items) => {
            put_varint(out, items.len() as u64);
            for i in items {
                encode_node(out, i, text);
            }
            SEQ
        }
        Value::Map(entries) => {
            put_varint(out, entries.len() as u64);
            for (k, v) in entries {
                encode_node(out, k, text);
                encode_node(out, v, text);
            }
            MAP
        }
    };
    out[tag_at] = tag;
}

fn source_slice(text: &str, s: Span) -> Option<&str> {
    let start = s.offset as usize;
    text.get(start..start.checked_add(s.len as usize)?)
}

/// The documents [`encode`] made, their spans in `file`; `None` when the
/// bytes are not a well-formed encoding for `text` (truncated, corrupt, of
/// another text).
pub fn decode(bytes: &[u8], file: FileId, text: &str) -> Option<Vec<Node>> {
    let mut r = Reader {
        bytes,
        at: 0,
        file,
        text,
    };
    let n = r.count()?;
    let mut docs = Vec::with_capacity(n);
    for _ in 0..n {
        docs.push(r.node(0)?);
    }
    (r.at == bytes.len()).then_some(docs)
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    file: FileId,
    text: &'a str,
}

impl Reader<'_> {
    fn byte(&mut self) -> Option<u8> {
        let b = *self.bytes.get(self.at)?;
        self.at += 1;
        Some(b)
    }

    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    fn u32(&mut self) -> Option<u32> {
        u32::try_from(self.varint()?).ok()
    }

    /// A count of things each at least one byte long (so a corrupt count
    /// cannot make the decoder allocate more than the input is).
    fn count(&mut self) -> Option<usize> {
        let n = usize::try_from(self.varint()?).ok()?;
        (n <= self.bytes.len() - self.at).then_some(n)
    }

    fn node(&mut self, depth: usize) -> Option<Node> {
        if depth > MAX_DEPTH {
            return None;
        }
        let tag = self.byte()?;
        let span = Span {
            file: self.file,
            offset: self.u32()?,
            len: self.u32()?,
            line: self.u32()?,
            col: self.u32()?,
        };
        let value = match tag & !FROM_SOURCE {
            t @ (SCALAR_PLAIN | SCALAR_QUOTED | SCALAR_BLOCK) => {
                let style = match t {
                    SCALAR_PLAIN => Style::Plain,
                    SCALAR_QUOTED => Style::Quoted,
                    _ => Style::Block,
                };
                let s = if tag & FROM_SOURCE != 0 {
                    source_slice(self.text, span)?
                } else {
                    let len = self.count()?;
                    let b = self.bytes.get(self.at..self.at + len)?;
                    self.at += len;
                    std::str::from_utf8(b).ok()?
                };
                Value::Scalar(s.to_string(), style)
            }
            SEQ if tag & FROM_SOURCE == 0 => {
                let n = self.count()?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.node(depth + 1)?);
                }
                Value::Seq(items)
            }
            MAP if tag & FROM_SOURCE == 0 => {
                let n = self.count()?;
                let mut entries = Vec::with_capacity(n);
                for _ in 0..n {
                    let k = self.node(depth + 1)?;
                    let v = self.node(depth + 1)?;
                    entries.push((k, v));
                }
                Value::Map(entries)
            }
            _ => return None,
        };
        Some(Node { span, value })
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::Mutex;

    const TEXTS: &[&str] = &[
        "",
        "# only a comment\n",
        "a:\n  mode: 0755\n  b: NO\n  c: \"x\\ty\"\n  d: 'it''s'\n",
        "k: \"é\"\nx: y\nlist: [1, 2, {a: b}]\n",
        "text: |\n  line one\n  line two\nfolded: >\n  a\n  b\nplain: a\n  continued\n",
        "base: &b {x: 1, y: [a, b]}\nuse: *b\n---\nsecond: doc\n---\n",
        "? complex\n: value\nempty:\nnull: ~\n",
    ];

    #[test]
    fn decoding_gives_the_parsed_tree() {
        for text in TEXTS {
            let docs = parse_stream(FileId(3), text).expect("parses");
            let bytes = encode(&docs, text);
            assert_eq!(
                decode(&bytes, FileId(3), text).as_ref(),
                Some(&docs),
                "{text}"
            );
            // Spans take the file they are decoded for.
            let moved = decode(&bytes, FileId(7), text).expect("decodes");
            let mut want = docs.clone();
            want.iter_mut().for_each(|d| d.set_file(FileId(7)));
            assert_eq!(moved, want);
        }
    }

    #[test]
    fn truncated_or_corrupt_bytes_are_refused_not_trusted() {
        for text in TEXTS {
            let docs = parse_stream(FileId(0), text).expect("parses");
            let bytes = encode(&docs, text);
            for cut in 0..bytes.len() {
                assert_eq!(
                    decode(&bytes[..cut], FileId(0), text),
                    None,
                    "{text} cut {cut}"
                );
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert_eq!(decode(&longer, FileId(0), text), None);
            // Any flipped byte decodes to something or nothing, never panics.
            for i in 0..bytes.len() {
                for bit in 0..8 {
                    let mut b = bytes.clone();
                    b[i] ^= 1 << bit;
                    let _ = decode(&b, FileId(0), text);
                }
            }
        }
        // Garbage and a huge count.
        assert_eq!(decode(&[0xff; 16], FileId(0), "a: b"), None);
        assert_eq!(decode(&[0xff, 0xff, 0xff, 0x7f], FileId(0), "a: b"), None);
    }

    #[test]
    fn a_scalar_kept_by_span_needs_the_same_text() {
        let text = "name: hello\n";
        let docs = parse_stream(FileId(0), text).expect("parses");
        let bytes = encode(&docs, text);
        // A shorter text cannot supply the scalar: refused.
        assert_eq!(decode(&bytes, FileId(0), "name: h"), None);
    }

    #[derive(Default)]
    struct Mem {
        map: Mutex<HashMap<TreeKey, Vec<u8>>>,
        frozen: HashMap<TreeKey, Vec<u8>>,
    }

    impl TreeCache for Mem {
        fn get(&self, key: &TreeKey) -> Option<&[u8]> {
            self.frozen.get(key).map(Vec::as_slice)
        }
        fn put(&self, key: TreeKey, encoded: Vec<u8>) {
            self.map.lock().expect("lock").insert(key, encoded);
        }
    }

    #[test]
    fn parse_cached_fills_then_answers_and_never_caches_errors() {
        let text = "a: [1, 2]\nb: c\n";
        let first = Mem::default();
        let docs = parse_cached(Some(&first), FileId(1), text).expect("parses");
        let stored = first.map.into_inner().expect("lock");
        assert_eq!(stored.len(), 1);
        let second = Mem {
            frozen: stored,
            ..Mem::default()
        };
        assert_eq!(parse_cached(Some(&second), FileId(1), text), Ok(docs));
        assert!(second.map.lock().expect("lock").is_empty(), "answered");
        // A cache that holds garbage for the text: parsed anyway.
        let bad = Mem {
            frozen: [(key_of(text), vec![1, 2, 3])].into_iter().collect(),
            ..Mem::default()
        };
        assert!(parse_cached(Some(&bad), FileId(1), text).is_ok());
        let broken = "a: [1, 2\n";
        let c = Mem::default();
        assert!(parse_cached(Some(&c), FileId(1), broken).is_err());
        assert!(c.map.lock().expect("lock").is_empty());
    }
}
