//! Node keys: what a node's output depends on, canonically encoded and hashed.
//!
//! A node's own inputs are one struct per kind ([`OwnInputs`], module
//! `kinds`: every input a named field), written into [`KeyInputs`], whose
//! maps group them by what they are so `charly explain` can say *which*
//! input changed: files
//! (project-relative path → content digest), texts (templates, rendered plans:
//! name → digest), values (user, formats, flags: name → value), dependency
//! keys (node id → key), the base image and the builder image.
//!
//! The encoding is canonical: fixed field order with a tag byte per field,
//! length-prefixed strings, maps in sorted order (they are `BTreeMap`s),
//! then blake3. The encoder destructures [`KeyInputs`] without `..`, so a new
//! field does not compile until someone decides how it enters the key.
//! Keys never contain absolute paths, mtimes, user or host names or time.
//! Changing the encoding means bumping [`KEY_SCHEMA_VERSION`]; golden tests
//! pin exact key hex.

mod kinds;

pub use kinds::*;

use charly_cache::NodeKey;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Version of the key encoding and of the meaning of key inputs.
pub const KEY_SCHEMA_VERSION: u32 = 1;

/// What a node is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NodeKind {
    /// Hashed inputs: a candy directory, a box file, the vocabulary.
    Source,
    /// One candy's Containerfile section for one box.
    Fragment,
    /// A builder stage run in its builder box's image; output: an artifact tar.
    BuilderStage,
    /// A local package built from source for a format.
    LocalPkg,
    /// A box's assembled build directory.
    Containerfile,
    /// A root filesystem made by a bootstrap builder.
    Rootfs,
    /// A box image built by a runner.
    Image,
    /// A box's InstallPlan for a deploy target.
    Plan,
    /// One layer of a box image: a filesystem diff and the configuration
    /// after it, on top of its parent layer.
    Layer,
    /// An external base image's layers and configuration.
    Base,
}

impl NodeKind {
    /// Every kind, in tag order.
    pub const ALL: [NodeKind; 10] = [
        NodeKind::Source,
        NodeKind::Fragment,
        NodeKind::BuilderStage,
        NodeKind::LocalPkg,
        NodeKind::Containerfile,
        NodeKind::Rootfs,
        NodeKind::Image,
        NodeKind::Plan,
        NodeKind::Layer,
        NodeKind::Base,
    ];

    /// The fixed tag byte of the kind in the encoding.
    fn tag(self) -> u8 {
        match self {
            NodeKind::Source => 1,
            NodeKind::Fragment => 2,
            NodeKind::BuilderStage => 3,
            NodeKind::LocalPkg => 4,
            NodeKind::Containerfile => 5,
            NodeKind::Rootfs => 6,
            NodeKind::Image => 7,
            NodeKind::Plan => 8,
            NodeKind::Layer => 9,
            NodeKind::Base => 10,
        }
    }

    /// Whether charly computes the node itself from its inputs, without a
    /// runner (fragments, build directories, plans; sources are only hashed).
    pub fn in_process(self) -> bool {
        matches!(
            self,
            NodeKind::Source | NodeKind::Fragment | NodeKind::Containerfile | NodeKind::Plan
        )
    }

    /// The kind named `name` ([`NodeKind::as_str`]'s inverse).
    pub fn named(name: &str) -> Option<NodeKind> {
        NodeKind::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// The kind a stored record says its node is (`None` for a record
    /// charly did not write).
    pub fn of_record(rec: &charly_cache::Record) -> Option<NodeKind> {
        NodeKind::named(&rec.kind)
    }

    /// The kebab-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeKind::Source => "source",
            NodeKind::Fragment => "fragment",
            NodeKind::BuilderStage => "builder-stage",
            NodeKind::LocalPkg => "local-pkg",
            NodeKind::Containerfile => "containerfile",
            NodeKind::Rootfs => "rootfs",
            NodeKind::Image => "image",
            NodeKind::Plan => "plan",
            NodeKind::Layer => "layer",
            NodeKind::Base => "base",
        }
    }
}

/// Everything a node's output depends on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyInputs {
    /// [`KEY_SCHEMA_VERSION`].
    pub schema: u32,
    /// The node kind (`None` only for a default value).
    pub kind: Option<NodeKind>,
    /// Input files: project-relative unix path → blake3 hex of the content.
    pub files: BTreeMap<String, String>,
    /// Texts (templates, rendered plans): name → blake3 hex of the text.
    pub texts: BTreeMap<String, String>,
    /// Values (user, formats, flags, env): name → value.
    pub values: BTreeMap<String, String>,
    /// Dependencies: node id → key hex.
    pub deps: BTreeMap<String, String>,
    /// The base image reference or digest, for nodes built on one.
    pub base: Option<String>,
    /// The builder image's key, for nodes run in a builder box.
    pub builder_image: Option<String>,
    /// The full text of some `texts` (small ones explanations show line by
    /// line). Kept in the record, never part of the key.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub contents: BTreeMap<String, String>,
}

/// How key inputs name a text: the blake3 hex of its bytes.
pub fn text_digest(text: &str) -> String {
    blake3::hash(text.as_bytes()).to_hex().to_string()
}

/// Texts up to this size keep their content for explanations.
pub(crate) const CONTENT_MAX: usize = 64 * 1024;

impl KeyInputs {
    /// Inputs of a kind, with the schema version set.
    pub fn new(kind: NodeKind) -> Self {
        KeyInputs {
            schema: KEY_SCHEMA_VERSION,
            kind: Some(kind),
            ..KeyInputs::default()
        }
    }

    /// Adds a text by its digest ([`text_digest`]).
    pub fn text(&mut self, name: impl Into<String>, text: &str) {
        self.texts.insert(name.into(), text_digest(text));
    }

    /// Adds a text by its digest, keeping its content (when small) so an
    /// explanation can say which lines changed.
    pub fn text_with_content(&mut self, name: impl Into<String>, text: &str) {
        let name = name.into();
        self.text(name.clone(), text);
        if text.len() <= CONTENT_MAX {
            self.contents.insert(name, text.to_string());
        }
    }

    /// Adds a value.
    pub fn value(&mut self, name: impl Into<String>, v: impl Into<String>) {
        self.values.insert(name.into(), v.into());
    }

    /// Adds a dependency.
    pub fn dep(&mut self, id: impl Into<String>, key: &NodeKey) {
        self.deps.insert(id.into(), key.to_hex());
    }

    /// The canonical encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut buf = Vec::new();
        self.encode_into(&mut buf);
        buf
    }

    /// Writes the canonical encoding into `out`, piece by piece.
    fn encode_into(&self, out: &mut impl Sink) {
        let KeyInputs {
            schema,
            kind,
            files,
            texts,
            values,
            deps,
            base,
            builder_image,
            contents: _,
        } = self;
        let mut e = Encoder(out);
        e.tag(0x01);
        e.u32(*schema);
        e.tag(0x02);
        e.u8(kind.map_or(0, NodeKind::tag));
        e.tag(0x03);
        e.map(files);
        e.tag(0x04);
        e.map(texts);
        e.tag(0x05);
        e.map(values);
        e.tag(0x06);
        e.map(deps);
        e.tag(0x07);
        e.opt(base.as_deref());
        e.tag(0x08);
        e.opt(builder_image.as_deref());
    }

    /// The node key: blake3 of the canonical encoding (hashed as it is
    /// written: no buffer to grow and copy, which cost the serial keying
    /// loop of a large graph tens of milliseconds).
    pub fn key(&self) -> NodeKey {
        let mut h = blake3::Hasher::new();
        self.encode_into(&mut h);
        NodeKey::from_bytes(*h.finalize().as_bytes())
    }
}

/// Key inputs packed for keeping in memory ([`KeyInputs::pack`]): the
/// same fields, with every value that is 64 lowercase hex digits (the
/// digests of files and texts, the keys of dependencies) as its 32 bytes.
/// Written from borrowed fields ([`PackedRef`]), read back owned: postcard
/// encodes both alike.
#[derive(Deserialize)]
struct Packed {
    schema: u32,
    kind: Option<NodeKind>,
    files: Vec<(String, Val)>,
    texts: Vec<(String, Val)>,
    values: Vec<(String, String)>,
    deps: Vec<(String, Val)>,
    base: Option<String>,
    builder_image: Option<Val>,
    contents: Vec<(String, String)>,
}

#[derive(Serialize)]
struct PackedRef<'a> {
    schema: u32,
    kind: Option<NodeKind>,
    files: Vec<(&'a str, ValRef<'a>)>,
    texts: Vec<(&'a str, ValRef<'a>)>,
    values: Vec<(&'a str, &'a str)>,
    deps: Vec<(&'a str, ValRef<'a>)>,
    base: Option<&'a str>,
    builder_image: Option<ValRef<'a>>,
    contents: Vec<(&'a str, &'a str)>,
}

/// A packed value: a digest's bytes, or any other text as it is.
#[derive(Deserialize)]
enum Val {
    Digest([u8; 32]),
    Text(String),
}

#[derive(Serialize)]
enum ValRef<'a> {
    Digest([u8; 32]),
    Text(&'a str),
}

impl<'a> ValRef<'a> {
    /// Packs a digest as its bytes: only lowercase hex comes back exactly as
    /// it was (from `to_hex`); anything else stays text.
    fn of(s: &'a str) -> ValRef<'a> {
        match charly_cache::decode_exact_hex(s) {
            Some(d) => ValRef::Digest(d),
            None => ValRef::Text(s),
        }
    }
}

impl Val {
    fn text(self) -> String {
        match self {
            Val::Digest(b) => charly_cache::encode_hex(&b),
            Val::Text(s) => s,
        }
    }
}

impl KeyInputs {
    /// A compact encoding for keeping key inputs in memory (a graph keeps
    /// every node's: as JSON text they were ~25 MB at 10,000 candies, most
    /// of it hex); [`KeyInputs::unpack`] gives them back exactly.
    pub fn pack(&self) -> Box<[u8]> {
        fn vals(m: &BTreeMap<String, String>) -> Vec<(&str, ValRef<'_>)> {
            m.iter().map(|(k, v)| (k.as_str(), ValRef::of(v))).collect()
        }
        fn strs(m: &BTreeMap<String, String>) -> Vec<(&str, &str)> {
            m.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
        }
        let packed = PackedRef {
            schema: self.schema,
            kind: self.kind,
            files: vals(&self.files),
            texts: vals(&self.texts),
            values: strs(&self.values),
            deps: vals(&self.deps),
            base: self.base.as_deref(),
            builder_image: self.builder_image.as_deref().map(ValRef::of),
            contents: strs(&self.contents),
        };
        postcard::to_allocvec(&packed)
            .unwrap_or_default()
            .into_boxed_slice()
    }

    /// Key inputs [`KeyInputs::pack`] packed (`None` for bytes it did not
    /// write).
    pub fn unpack(bytes: &[u8]) -> Option<KeyInputs> {
        let p: Packed = postcard::from_bytes(bytes).ok()?;
        let texts = |v: Vec<(String, Val)>| -> BTreeMap<String, String> {
            v.into_iter().map(|(k, v)| (k, v.text())).collect()
        };
        Some(KeyInputs {
            schema: p.schema,
            kind: p.kind,
            files: texts(p.files),
            texts: texts(p.texts),
            values: p.values.into_iter().collect(),
            deps: texts(p.deps),
            base: p.base,
            builder_image: p.builder_image.map(Val::text),
            contents: p.contents.into_iter().collect(),
        })
    }
}

/// Where an encoding goes: a buffer or straight into a hash.
trait Sink {
    fn put(&mut self, bytes: &[u8]);
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

impl Sink for blake3::Hasher {
    fn put(&mut self, bytes: &[u8]) {
        self.update(bytes);
    }
}

struct Encoder<'a, S: Sink>(&'a mut S);

impl<S: Sink> Encoder<'_, S> {
    fn tag(&mut self, t: u8) {
        self.0.put(&[t]);
    }
    fn u8(&mut self, v: u8) {
        self.0.put(&[v]);
    }
    fn u32(&mut self, v: u32) {
        self.0.put(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.put(&v.to_le_bytes());
    }
    fn str(&mut self, s: &str) {
        self.u64(s.len() as u64);
        self.0.put(s.as_bytes());
    }
    fn opt(&mut self, s: Option<&str>) {
        match s {
            None => self.u8(0),
            Some(s) => {
                self.u8(1);
                self.str(s);
            }
        }
    }
    fn map(&mut self, m: &BTreeMap<String, String>) {
        self.u64(m.len() as u64);
        for (k, v) in m {
            self.str(k);
            self.str(v);
        }
    }
}

/// One difference between the key inputs of two builds of a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "what", rename_all = "kebab-case")]
pub enum Change {
    /// A file changed, appeared or disappeared.
    File {
        /// Project-relative path.
        path: String,
        /// Digest before (none: added).
        old: Option<String>,
        /// Digest now (none: removed).
        new: Option<String>,
    },
    /// A template or rendered text changed.
    Text {
        /// Its name.
        name: String,
        /// Digest before.
        old: Option<String>,
        /// Digest now.
        new: Option<String>,
        /// The lines that changed (`- `/`+ `, with context), when both
        /// contents were kept.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        lines: Vec<String>,
    },
    /// A value changed.
    Value {
        /// Its name.
        name: String,
        /// Before.
        old: Option<String>,
        /// Now.
        new: Option<String>,
    },
    /// A dependency's key changed (it rebuilt).
    Dep {
        /// Node id.
        id: String,
        /// Key before.
        old: Option<String>,
        /// Key now.
        new: Option<String>,
    },
    /// The base image changed.
    Base {
        /// Before.
        old: Option<String>,
        /// Now.
        new: Option<String>,
    },
    /// The builder image changed.
    BuilderImage {
        /// Before.
        old: Option<String>,
        /// Now.
        new: Option<String>,
    },
    /// The last record's inputs no longer decode: it was written by an
    /// older key schema, so nothing can be compared input by input.
    OlderSchema,
    /// The key schema or node kind changed.
    Schema {
        /// Before.
        old: String,
        /// Now.
        new: String,
    },
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let short = |d: &Option<String>| {
            d.as_deref()
                .map_or("(none)".to_string(), |s| s.chars().take(12).collect())
        };
        let val = |d: &Option<String>| {
            d.as_deref()
                .map_or("(unset)".to_string(), |s| format!("{s:?}"))
        };
        match self {
            Change::File {
                path,
                old: None,
                new,
            } => write!(f, "file {path} added ({})", short(new)),
            Change::File {
                path,
                old,
                new: None,
            } => write!(f, "file {path} removed (was {})", short(old)),
            Change::File { path, old, new } => {
                write!(f, "file {path} changed: {} -> {}", short(old), short(new))
            }
            Change::Text {
                name,
                old,
                new,
                lines,
            } => {
                write!(f, "{name} changed: {} -> {}", short(old), short(new))?;
                for l in lines {
                    write!(f, "\n      {l}")?;
                }
                Ok(())
            }
            Change::Value { name, old, new } => {
                write!(f, "{name} changed: {} -> {}", val(old), val(new))
            }
            Change::Dep {
                id,
                old: Some(o),
                new: None,
            } => write!(f, "{id} is no longer a dependency (was {})", &o[..12.min(o.len())]),
            Change::Dep {
                id,
                old: None,
                new: Some(n),
            } => write!(f, "{id} is a new dependency ({})", &n[..12.min(n.len())]),
            Change::Dep { id, old, new } => write!(
                f,
                "dependency {id} rebuilt: {} -> {}",
                short(old),
                short(new)
            ),
            Change::Base { old, new } => {
                write!(f, "base image changed: {} -> {}", val(old), val(new))
            }
            Change::BuilderImage { old, new } => {
                write!(f, "builder image changed: {} -> {}", short(old), short(new))
            }
            Change::OlderSchema => f.write_str(
                "recorded by an older key schema (its inputs no longer decode; every input is new to this one)",
            ),
            Change::Schema { old, new } => write!(f, "key schema changed: {old} -> {new}"),
        }
    }
}

/// Lines of `b` that differ from `a`, as `- old` / `+ new` with one line of
/// context (`@@` between hunks), at most `DIFF_LINES` of them.
pub fn line_diff(a: &str, b: &str) -> Vec<String> {
    let diff = similar::TextDiff::from_lines(a, b);
    let mut out = Vec::new();
    for (n, group) in diff.grouped_ops(1).iter().enumerate() {
        if n > 0 {
            out.push("@@".to_string());
        }
        for op in group {
            for change in diff.iter_changes(op) {
                let sign = match change.tag() {
                    similar::ChangeTag::Delete => '-',
                    similar::ChangeTag::Insert => '+',
                    similar::ChangeTag::Equal => ' ',
                };
                out.push(format!("{sign} {}", change.value().trim_end_matches('\n')));
            }
        }
    }
    if out.len() > DIFF_LINES {
        let more = out.len() - DIFF_LINES;
        out.truncate(DIFF_LINES);
        out.push(format!("… {more} more lines"));
    }
    out
}

/// The most diff lines one change shows.
const DIFF_LINES: usize = 24;

/// The differences from `old` to `new`, in a stable order.
pub fn diff(old: &KeyInputs, new: &KeyInputs) -> Vec<Change> {
    let mut out = Vec::new();
    if old.schema != new.schema || old.kind != new.kind {
        out.push(Change::Schema {
            old: format!("{} {:?}", old.schema, old.kind),
            new: format!("{} {:?}", new.schema, new.kind),
        });
    }
    let maps = |a: &BTreeMap<String, String>,
                b: &BTreeMap<String, String>|
     -> Vec<(String, Option<String>, Option<String>)> {
        let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
        keys.sort();
        keys.dedup();
        keys.into_iter()
            .filter(|k| a.get(*k) != b.get(*k))
            .map(|k| (k.clone(), a.get(k).cloned(), b.get(k).cloned()))
            .collect()
    };
    for (path, old, new) in maps(&old.files, &new.files) {
        out.push(Change::File { path, old, new });
    }
    let mut texts = maps(&old.texts, &new.texts);
    // A staged file is named by its content's digest (`…/_inline/<candy>/
    // <digest>`): an edit of it is one file gone and one come in the same
    // directory. Paired, it is one change with the lines that changed.
    let staged_dir = |name: &str| {
        name.strip_prefix("file:")
            .and_then(|p| p.rsplit_once('/'))
            .map(|(d, _)| d.to_string())
    };
    let mut paired = Vec::new();
    let gone: Vec<usize> = (0..texts.len())
        .filter(|i| texts[*i].2.is_none() && old.contents.contains_key(&texts[*i].0))
        .collect();
    for g in gone {
        let dir = staged_dir(&texts[g].0);
        let came: Vec<usize> = (0..texts.len())
            .filter(|i| {
                texts[*i].1.is_none()
                    && staged_dir(&texts[*i].0) == dir
                    && new.contents.contains_key(&texts[*i].0)
            })
            .collect();
        // Only one for one: two files edited at once cannot be told apart.
        if let ([c], Some(d)) = (came.as_slice(), &dir) {
            let changed = Change::Text {
                name: format!("a file written into {d}"),
                old: texts[g].1.clone(),
                new: texts[*c].2.clone(),
                lines: line_diff(&old.contents[&texts[g].0], &new.contents[&texts[*c].0]),
            };
            paired.push((g, *c, changed));
        }
    }
    let drop: std::collections::BTreeSet<usize> =
        paired.iter().flat_map(|(g, c, _)| [*g, *c]).collect();
    let mut i = 0;
    texts.retain(|_| {
        i += 1;
        !drop.contains(&(i - 1))
    });
    out.extend(paired.into_iter().map(|(_, _, c)| c));
    for (name, old_d, new_d) in texts {
        let lines = match (old.contents.get(&name), new.contents.get(&name)) {
            (Some(a), Some(b)) => line_diff(a, b),
            _ => Vec::new(),
        };
        out.push(Change::Text {
            name,
            old: old_d,
            new: new_d,
            lines,
        });
    }
    for (name, old, new) in maps(&old.values, &new.values) {
        out.push(Change::Value { name, old, new });
    }
    for (id, old, new) in maps(&old.deps, &new.deps) {
        out.push(Change::Dep { id, old, new });
    }
    if old.base != new.base {
        out.push(Change::Base {
            old: old.base.clone(),
            new: new.base.clone(),
        });
    }
    if old.builder_image != new.builder_image {
        out.push(Change::BuilderImage {
            old: old.builder_image.clone(),
            new: new.builder_image.clone(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> KeyInputs {
        let mut k = KeyInputs::new(NodeKind::Fragment);
        k.files.insert("candy/a/charly.yml".into(), "ab".repeat(32));
        k.text(
            "template:format/rpm/install",
            "RUN dnf install -y {{.Packages}}",
        );
        k.value("user", "user:1000:1000:/home/user");
        k.deps.insert("source:candy/a".into(), "cd".repeat(32));
        k.base = Some("quay.io/fedora/fedora:43".into());
        k
    }

    /// A record's kind text names its kind; serde's name is the same.
    #[test]
    fn kinds_are_named_as_records_and_json_write_them() {
        for k in NodeKind::ALL {
            assert_eq!(NodeKind::named(k.as_str()), Some(k));
            let json = serde_json::to_string(&k).expect("json");
            assert_eq!(json, format!("\"{}\"", k.as_str()));
        }
        assert_eq!(NodeKind::named("Image"), None);
        assert_eq!(NodeKind::named(""), None);
    }

    /// Packed key inputs read back exactly: digests (packed as bytes),
    /// uppercase hex and other 64-character values (kept as text), empty
    /// and optional fields.
    #[test]
    fn packed_inputs_read_back_exactly() {
        let mut k = sample();
        k.texts.insert("upper".into(), "AB".repeat(32));
        k.texts.insert("not-hex".into(), "xy".repeat(32));
        k.texts.insert("short".into(), "abc".into());
        k.deps.insert("dep:empty".into(), String::new());
        k.value("hexish", "ef".repeat(32));
        k.builder_image = Some("01".repeat(32));
        k.contents.insert("template".into(), "RUN true\n".into());
        let packed = k.pack();
        assert_eq!(KeyInputs::unpack(&packed).as_ref(), Some(&k));
        // Smaller than the JSON it replaces.
        let json = serde_json::to_string(&k).expect("json");
        assert!(
            packed.len() < json.len(),
            "{} >= {}",
            packed.len(),
            json.len()
        );
        let bare = KeyInputs::new(NodeKind::Image);
        assert_eq!(KeyInputs::unpack(&bare.pack()), Some(bare));
        assert_eq!(KeyInputs::unpack(b""), None);
    }

    #[test]
    fn golden_keys() {
        // Pinned: changing the encoding must bump KEY_SCHEMA_VERSION. The
        // values were computed by an independent Python implementation of
        // the encoding described in this module (tag, u32 LE schema, kind
        // tag, maps as u64 LE count + u64-length-prefixed strings, options
        // as 0 / 1 + string), hashed with the `blake3` package.
        assert_eq!(
            KeyInputs::new(NodeKind::Source).key().to_hex(),
            "10063fd5b76da1445bc7c97fe6d5a7263e79041a25cfbfabdb50581d20e51883"
        );
        assert_eq!(
            sample().key().to_hex(),
            "5dda9d3a10997a3a106bae691a95f79fdcb1d60b1a26288c3b76079500506f53"
        );
        // The key hashes the encoding as it is written; `encode` buffers it.
        assert_eq!(
            sample().key(),
            NodeKey::from_bytes(*blake3::hash(&sample().encode()).as_bytes())
        );
    }

    #[test]
    fn every_single_input_changes_the_key() {
        let base = sample().key();
        let mut variants: Vec<KeyInputs> = Vec::new();
        let mut k = sample();
        k.files.insert("candy/a/charly.yml".into(), "ac".repeat(32));
        variants.push(k);
        let mut k = sample();
        k.files.insert("candy/a/extra".into(), "00".into());
        variants.push(k);
        let mut k = sample();
        k.text(
            "template:format/rpm/install",
            "RUN dnf install -y --nodocs {{.Packages}}",
        );
        variants.push(k);
        let mut k = sample();
        k.value("user", "user:1001:1000:/home/user");
        variants.push(k);
        let mut k = sample();
        k.value("env:FOO", "1");
        variants.push(k);
        let mut k = sample();
        k.deps.insert("source:candy/a".into(), "ce".repeat(32));
        variants.push(k);
        let mut k = sample();
        k.base = Some("quay.io/fedora/fedora:44".into());
        variants.push(k);
        let mut k = sample();
        k.builder_image = Some("00".into());
        variants.push(k);
        let mut k = sample();
        k.kind = Some(NodeKind::Containerfile);
        variants.push(k);
        let mut keys = std::collections::BTreeSet::new();
        keys.insert(base.to_hex());
        for v in &variants {
            assert!(
                keys.insert(v.key().to_hex()),
                "a change did not change the key: {v:?}"
            );
        }
    }

    #[test]
    fn field_boundaries_are_unambiguous() {
        // ("ab","c") and ("a","bc") must not collide.
        let mut a = KeyInputs::new(NodeKind::Source);
        a.value("ab", "c");
        let mut b = KeyInputs::new(NodeKind::Source);
        b.value("a", "bc");
        assert_ne!(a.key(), b.key());
        let mut c = KeyInputs::new(NodeKind::Source);
        c.text("ab", "c");
        assert_ne!(a.key(), c.key(), "same name in another field");
    }

    #[test]
    fn diff_names_what_changed() {
        let old = sample();
        let mut new = sample();
        new.files
            .insert("candy/a/charly.yml".into(), "ef".repeat(32));
        new.value("formats", "rpm");
        new.deps.clear();
        let d = diff(&old, &new);
        let text: Vec<String> = d.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            vec![
                "file candy/a/charly.yml changed: abababababab -> efefefefefef",
                "formats changed: (unset) -> \"rpm\"",
                "source:candy/a is no longer a dependency (was cdcdcdcdcdcd)",
            ]
        );
        assert!(diff(&old, &old).is_empty());
    }
}
