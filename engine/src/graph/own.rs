//! Nodes' own key inputs, kept in the store between runs
//! (`<store>/trees/<id>.own`, next to the project's parse cache and
//! resolution): a node's own inputs (all but its dependencies' keys) are a
//! pure function of the project, its resolution and the graph options —
//! for the kinds [`keeps`] names. A run whose
//! project and options are those the file was written for takes them from
//! the file, so it neither compiles the candies' plans for the fragments
//! nor encodes them again (at 10,000 candies × 1,000 boxes, ~26,000
//! fragments); it only chains the dependencies' keys in.
//!
//! The file names the binary (as the parse cache does), the project's
//! digest ([`Project::resolution_inputs`]: everything compiling and keying
//! read of the project) and the options' digest ([`options_digest`]), and
//! carries a digest of its body. A file made for anything else, truncated
//! or damaged answers nothing: every node's own inputs are computed again,
//! and the file rewritten. Nodes the file lacks (another command's graph)
//! are computed, and added to it.
//!
//! [`Project::resolution_inputs`]: charly_rules::load::Project::resolution_inputs

use super::GraphOptions;
use crate::key::NodeKind;
use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"chownin\x01";

/// Where a project's own inputs are kept, and the project state they are
/// valid for.
#[derive(Clone, Debug)]
pub struct OwnFile {
    file: PathBuf,
    store_dir: PathBuf,
    project: [u8; 32],
}

impl OwnFile {
    /// The file of the project at `root` in the store at `store_dir`, for
    /// the project whose digest is `project`
    /// ([`charly_rules::load::Project::resolution_inputs`]).
    pub fn new(store_dir: &Path, root: &Path, project: [u8; 32]) -> OwnFile {
        OwnFile {
            file: crate::trees::TreeFile::path(store_dir, root).with_extension("own"),
            store_dir: store_dir.to_path_buf(),
            project,
        }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.file
    }

    fn head(&self, opts: &GraphOptions) -> [[u8; 32]; 3] {
        [crate::trees::context(), self.project, options_digest(opts)]
    }

    /// What the file keeps for `opts`: empty when it is missing, unsound,
    /// or made for another binary, project or options.
    pub(super) fn read(&self, opts: &GraphOptions) -> Kept {
        let _t = crate::timings::phase("own inputs: read");
        let [a, b, c] = self.head(opts);
        std::fs::read(&self.file)
            .ok()
            .and_then(|data| Kept::parse(data, &[MAGIC, &a, &b, &c]))
            .unwrap_or_default()
    }

    /// Writes what `kept` holds and `fresh` adds (a fresh entry replaces a
    /// kept one of the same id), sorted by id. Only into an existing store.
    pub(super) fn save(
        &self,
        opts: &GraphOptions,
        kept: &Kept,
        mut fresh: Vec<(String, Box<[u8]>)>,
    ) -> std::io::Result<()> {
        if !self.store_dir.is_dir() {
            return Ok(());
        }
        let _t = crate::timings::phase("own inputs: save");
        fresh.sort_by(|a, b| a.0.cmp(&b.0));
        let mut entries: Vec<(&[u8], &[u8])> = Vec::with_capacity(kept.len() + fresh.len());
        let mut old = kept.entries().peekable();
        for (id, bytes) in &fresh {
            while let Some(e) = old.next_if(|e| e.0 < id.as_bytes()) {
                entries.push(e);
            }
            old.next_if(|e| e.0 == id.as_bytes());
            entries.push((id.as_bytes(), bytes));
        }
        entries.extend(old);
        let size = entries.iter().map(|(i, b)| 8 + i.len() + b.len()).sum();
        let mut body = Vec::with_capacity(size);
        for (id, bytes) in entries {
            put(&mut body, id);
            put(&mut body, bytes);
        }
        let [a, b, c] = self.head(opts);
        crate::trees::write_sealed(&self.file, &self.store_dir, &[MAGIC, &a, &b, &c], &body)
    }
}

/// Whether the store keeps the own inputs of nodes of `kind`: those whose
/// id names all they are computed from. Not sources and layers (they hash
/// files), nor builder stages and local packages: their ids do not name the
/// box whose namespace and distro their inputs are taken from (the first
/// box in the graph that needs them), so another run's could differ.
pub fn keeps(kind: NodeKind) -> bool {
    match kind {
        NodeKind::Fragment
        | NodeKind::Containerfile
        | NodeKind::Image
        | NodeKind::Plan
        | NodeKind::Rootfs
        | NodeKind::Base => true,
        NodeKind::Source | NodeKind::Layer | NodeKind::BuilderStage | NodeKind::LocalPkg => false,
    }
}

/// Appends one part of an entry (an id, or its packed inputs): its length,
/// then its bytes.
fn put(body: &mut Vec<u8>, part: &[u8]) {
    body.extend_from_slice(&(part.len() as u32).to_le_bytes());
    body.extend_from_slice(part);
}

/// A digest of every graph option a node's own inputs read (each field
/// named: a field added to the options does not compile here until it is
/// placed).
pub fn options_digest(opts: &GraphOptions) -> [u8; 32] {
    let GraphOptions {
        dev_local_pkg,
        runner,
        arch,
        plugins,
    } = opts;
    let super::PluginBuild {
        fragments,
        deploy_only,
        ids,
    } = plugins;
    let text =
        format!("{dev_local_pkg:?} {runner:?} {arch:?} {fragments:?} {deploy_only:?} {ids:?}");
    *blake3::hash(text.as_bytes()).as_bytes()
}

/// Own inputs read from the file: node id → packed key inputs
/// ([`crate::key::KeyInputs::pack`]), sorted by id.
#[derive(Default)]
pub(super) struct Kept {
    data: Vec<u8>,
    at: Vec<(Range<usize>, Range<usize>)>,
    /// Entry by id: a graph looks up every node it keys, fragments twice
    /// (a binary search over ids that share long prefixes cost ~105 ms of
    /// CPU at 10,000 candies × 1,000 boxes).
    index: HashMap<Box<[u8]>, usize>,
}

impl Kept {
    /// The entries of a sealed file's bytes, when it is sound, made under
    /// `head`, and its ids are sorted and distinct (as [`OwnFile::save`]
    /// merges them).
    fn parse(data: Vec<u8>, head: &[&[u8]]) -> Option<Kept> {
        let mut pos = crate::trees::sealed_body_at(&data, head)?;
        let mut at: Vec<(Range<usize>, Range<usize>)> = Vec::new();
        let part = |pos: &mut usize| -> Option<Range<usize>> {
            let len = u32::from_le_bytes(data.get(*pos..*pos + 4)?.try_into().ok()?) as usize;
            let r = *pos + 4..(*pos + 4).checked_add(len)?;
            data.get(r.clone())?;
            *pos = r.end;
            Some(r)
        };
        while pos < data.len() {
            let id = part(&mut pos)?;
            let bytes = part(&mut pos)?;
            if let Some((last, _)) = at.last()
                && data[last.clone()] >= data[id.clone()]
            {
                return None;
            }
            at.push((id, bytes));
        }
        let index = at
            .iter()
            .enumerate()
            .map(|(n, (id, _))| (Box::from(&data[id.clone()]), n))
            .collect();
        Some(Kept { data, at, index })
    }

    /// How many nodes it keeps.
    pub(super) fn len(&self) -> usize {
        self.at.len()
    }

    /// The packed own inputs of node `id`.
    pub(super) fn get(&self, id: &str) -> Option<&[u8]> {
        let i = *self.index.get(id.as_bytes())?;
        Some(&self.data[self.at[i].1.clone()])
    }

    fn entries(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.at
            .iter()
            .map(|(i, b)| (&self.data[i.clone()], &self.data[b.clone()]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(runner: &str) -> GraphOptions {
        GraphOptions {
            runner: runner.into(),
            ..GraphOptions::default()
        }
    }

    fn entries(k: &Kept) -> Vec<(String, Vec<u8>)> {
        k.entries()
            .map(|(i, b)| (String::from_utf8(i.to_vec()).unwrap(), b.to_vec()))
            .collect()
    }

    #[test]
    fn saved_entries_read_back_merged_and_only_for_their_state() {
        let dir = tempfile::tempdir().unwrap();
        let f = OwnFile::new(dir.path(), Path::new("/p"), [1; 32]);
        let o = opts("podman");
        assert_eq!(f.read(&o).len(), 0);
        let fresh = |v: &[(&str, &[u8])]| -> Vec<(String, Box<[u8]>)> {
            v.iter()
                .map(|(i, b)| (i.to_string(), Box::from(*b)))
                .collect()
        };
        f.save(&o, &Kept::default(), fresh(&[("b", b"2"), ("a", b"1")]))
            .unwrap();
        let k = f.read(&o);
        assert_eq!(k.get("a"), Some(&b"1"[..]));
        assert_eq!(k.get("b"), Some(&b"2"[..]));
        assert_eq!(k.get("c"), None);
        // Kept and fresh merge, fresh winning.
        f.save(&o, &k, fresh(&[("c", b"3"), ("a", b"9")])).unwrap();
        let k = f.read(&o);
        assert_eq!(
            entries(&k),
            [("a", b"9"), ("b", b"2"), ("c", b"3")].map(|(i, b)| (i.to_string(), b.to_vec()))
        );
        // Another project state, other options: nothing.
        assert_eq!(
            OwnFile::new(dir.path(), Path::new("/p"), [2; 32])
                .read(&o)
                .len(),
            0
        );
        assert_eq!(f.read(&opts("other")).len(), 0);
        let mut plugin = o.clone();
        plugin.plugins.ids.insert("word".into(), "id".into());
        assert_eq!(f.read(&plugin).len(), 0);
        assert_eq!(f.read(&o).len(), 3);
    }

    #[test]
    fn a_damaged_or_truncated_file_answers_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let f = OwnFile::new(dir.path(), Path::new("/p"), [1; 32]);
        let o = opts("podman");
        f.save(
            &o,
            &Kept::default(),
            vec![
                ("a".into(), Box::from(&b"1"[..])),
                ("b".into(), Box::from(&b"2"[..])),
            ],
        )
        .unwrap();
        let good = std::fs::read(f.path()).unwrap();
        for bad in [
            good[..good.len() - 1].to_vec(),
            {
                let mut d = good.clone();
                *d.last_mut().unwrap() ^= 1;
                d
            },
            Vec::new(),
        ] {
            std::fs::write(f.path(), &bad).unwrap();
            assert_eq!(f.read(&o).len(), 0);
        }
    }

    #[test]
    fn entries_out_of_order_are_refused() {
        // Sealed and well framed, but "b" before "a": not a file `save`
        // wrote (it merges sorted entries), so it is not used.
        let head: [&[u8]; 1] = [b"h"];
        let sealed = |parts: [&[u8]; 4]| -> Vec<u8> {
            let mut body = Vec::new();
            parts.iter().for_each(|p| put(&mut body, p));
            let mut data = b"h".to_vec();
            data.extend_from_slice(blake3::hash(&body).as_bytes());
            data.extend_from_slice(&body);
            data
        };
        assert!(Kept::parse(sealed([b"b", b"2", b"a", b"1"]), &head).is_none());
        // The same framing in order is read.
        let data = sealed([b"a", b"1", b"b", b"2"]);
        assert_eq!(Kept::parse(data, &head).map(|k| k.len()), Some(2));
    }
}
