//! Content-addressed input roots: local directories and inline files
//! mounted at paths of the action's root, turned into REAPI `Directory`
//! messages (children sorted by name, as the protocol requires) and the set
//! of blobs they reference. Equal content is one blob; the engine's
//! FindMissingBlobs decides what is uploaded, so an unchanged input root
//! costs one round trip.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use bazel_remote_apis::build::bazel::remote::execution::v2 as re;

use crate::client::{DigestFn, RemoteError};

/// Where a blob's bytes come from.
#[derive(Debug, Clone)]
pub enum Blob {
    /// A local file (read at upload time).
    File(PathBuf),
    /// Bytes in memory (messages, inline files), shared by clones.
    Bytes(std::sync::Arc<[u8]>),
    /// `len` bytes at `offset` of a local file (a member of a tar), read at
    /// upload time, so a root filesystem is never held in memory.
    Range {
        /// The file.
        file: std::sync::Arc<Path>,
        /// Where the bytes start.
        offset: u64,
        /// How many.
        len: u64,
    },
}

impl Blob {
    /// The bytes.
    pub fn read(&self) -> Result<Vec<u8>, RemoteError> {
        match self {
            Blob::Bytes(b) => Ok(b.to_vec()),
            Blob::File(p) => std::fs::read(p)
                .map_err(|e| RemoteError::new(format!("reading {}: {e}", p.display()))),
            Blob::Range { file, offset, len } => {
                use std::io::{Read, Seek, SeekFrom};
                let err = |e: std::io::Error| {
                    RemoteError::new(format!("reading {} at {offset}: {e}", file.display()))
                };
                let mut f = std::fs::File::open(file).map_err(err)?;
                f.seek(SeekFrom::Start(*offset)).map_err(err)?;
                let mut data = vec![0; *len as usize];
                f.read_exact(&mut data).map_err(err)?;
                Ok(data)
            }
        }
    }
}

/// One path of a tree, as REAPI describes it: what an action's output
/// tree (`RemoteCommand::run_root` in `action`) is compared with
/// ([`InputRoot::entries`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TreeEntry {
    /// A directory.
    Dir,
    /// A file: its digest and executable bit.
    File(re::Digest, bool),
    /// A symlink and its target.
    Symlink(String),
}

/// What [`InputRoot::put`] places.
enum Item {
    Dir,
    Symlink(String),
    File(re::Digest, bool),
}

#[derive(Default, Clone)]
struct Dir {
    files: BTreeMap<String, (re::Digest, bool)>,
    symlinks: BTreeMap<String, String>,
    dirs: BTreeMap<String, Dir>,
}

/// Builds an input root. Clones share blob bytes.
#[derive(Clone)]
pub struct InputRoot {
    f: DigestFn,
    root: Dir,
    /// Every blob referenced, by hash.
    pub blobs: BTreeMap<String, (re::Digest, Blob)>,
}

fn components(path: &str) -> Result<Vec<&str>, RemoteError> {
    let parts: Vec<&str> = path
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    if parts.contains(&"..") {
        return Err(RemoteError::new(format!(
            "input path `{path}` leaves the input root"
        )));
    }
    Ok(parts)
}

impl InputRoot {
    /// An empty root.
    pub fn new(f: DigestFn) -> Self {
        InputRoot {
            f,
            root: Dir::default(),
            blobs: BTreeMap::new(),
        }
    }

    fn dir_at(&mut self, parts: &[&str]) -> &mut Dir {
        let mut d = &mut self.root;
        for p in parts {
            d = d.dirs.entry((*p).to_string()).or_default();
        }
        d
    }

    /// Puts a directory, symlink or file at `at` (path components),
    /// replacing whatever of another kind was there (a directory put over
    /// a directory keeps its contents, as a layer's directory entry does).
    fn put(&mut self, at: &[&str], item: Item) {
        let Some((name, dirs)) = at.split_last() else {
            return;
        };
        let name = (*name).to_string();
        let parent = self.dir_at(dirs);
        match item {
            Item::Dir => {
                parent.files.remove(&name);
                parent.symlinks.remove(&name);
                parent.dirs.entry(name).or_default();
            }
            Item::Symlink(target) => {
                parent.files.remove(&name);
                parent.dirs.remove(&name);
                parent.symlinks.insert(name, target);
            }
            Item::File(d, exec) => {
                parent.symlinks.remove(&name);
                parent.dirs.remove(&name);
                parent.files.insert(name, (d, exec));
            }
        }
    }

    /// The directory at `at`, if there is one (nothing is created).
    fn find_dir(&mut self, at: &[&str]) -> Option<&mut Dir> {
        let mut d = &mut self.root;
        for p in at {
            d = d.dirs.get_mut(*p)?;
        }
        Some(d)
    }

    /// Removes whatever is at `at` (a directory with its contents).
    fn remove(&mut self, at: &[&str]) {
        let Some((name, dirs)) = at.split_last() else {
            return;
        };
        if let Some(parent) = self.find_dir(dirs) {
            parent.files.remove(*name);
            parent.symlinks.remove(*name);
            parent.dirs.remove(*name);
        }
    }

    /// The file at `at` (its digest and executable bit), if it is a file.
    fn file_at(&mut self, at: &[&str]) -> Option<(re::Digest, bool)> {
        let (name, dirs) = at.split_last()?;
        self.find_dir(dirs)?.files.get(*name).cloned()
    }

    /// Every path in the tree (directories, files and symlinks, relative to
    /// the root), sorted.
    pub fn paths(&self) -> Vec<String> {
        self.entries().into_keys().collect()
    }

    /// Every path of the tree (relative, no leading `/`) with what it is.
    pub fn entries(&self) -> BTreeMap<String, TreeEntry> {
        fn walk(d: &Dir, at: &str, out: &mut BTreeMap<String, TreeEntry>) {
            for (n, (dg, exec)) in &d.files {
                out.insert(join(at, n), TreeEntry::File(dg.clone(), *exec));
            }
            for (n, t) in &d.symlinks {
                out.insert(join(at, n), TreeEntry::Symlink(t.clone()));
            }
            for (n, sub) in &d.dirs {
                let p = join(at, n);
                out.insert(p.clone(), TreeEntry::Dir);
                walk(sub, &p, out);
            }
        }
        let mut out = BTreeMap::new();
        walk(&self.root, "", &mut out);
        out
    }

    /// Adds a file with these bytes at `path` (relative to the root).
    pub fn add_bytes(&mut self, path: &str, data: Vec<u8>, exec: bool) -> Result<(), RemoteError> {
        let parts = components(path)?;
        if parts.is_empty() {
            return Err(RemoteError::new("an input file needs a name"));
        }
        let d = self.f.digest(&data);
        self.blobs
            .insert(d.hash.clone(), (d.clone(), Blob::Bytes(data.into())));
        self.put(&parts, Item::File(d, exec));
        Ok(())
    }

    /// Adds an (empty) directory at `path`.
    pub fn add_empty_dir(&mut self, path: &str) -> Result<(), RemoteError> {
        let parts = components(path)?;
        self.dir_at(&parts);
        Ok(())
    }

    /// Adds the contents of a local directory at `path` (files, their
    /// executable bit, symlinks as links; other file types are refused).
    pub fn add_dir(&mut self, path: &str, local: &Path) -> Result<(), RemoteError> {
        let parts: Vec<String> = components(path)?.into_iter().map(String::from).collect();
        let walker = walkdir::WalkDir::new(local)
            .follow_links(false)
            .sort_by_file_name();
        for entry in walker {
            let entry = entry.map_err(|e| RemoteError::new(format!("{}: {e}", local.display())))?;
            let rel = entry
                .path()
                .strip_prefix(local)
                .map_err(|e| RemoteError::new(e.to_string()))?;
            let mut at: Vec<&str> = parts.iter().map(String::as_str).collect();
            let rel_parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().to_string())
                .collect();
            at.extend(rel_parts.iter().map(String::as_str));
            let ft = entry.file_type();
            if ft.is_dir() {
                self.put(&at, Item::Dir);
            } else if ft.is_symlink() {
                let target = std::fs::read_link(entry.path())
                    .map_err(|e| RemoteError::new(format!("{}: {e}", entry.path().display())))?;
                self.put(&at, Item::Symlink(target.to_string_lossy().to_string()));
            } else if ft.is_file() {
                let meta = entry
                    .metadata()
                    .map_err(|e| RemoteError::new(format!("{}: {e}", entry.path().display())))?;
                let data = std::fs::read(entry.path())
                    .map_err(|e| RemoteError::new(format!("{}: {e}", entry.path().display())))?;
                let d = self.f.digest(&data);
                let exec = meta.permissions().mode() & 0o111 != 0;
                self.blobs.insert(
                    d.hash.clone(),
                    (d.clone(), Blob::File(entry.path().to_path_buf())),
                );
                self.put(&at, Item::File(d, exec));
            } else {
                return Err(RemoteError::new(format!(
                    "{}: only files, directories and symlinks can be sent to a remote engine",
                    entry.path().display()
                )));
            }
        }
        Ok(())
    }

    /// Adds the contents of a tar archive (a root filesystem) at `path`:
    /// directories, files with their executable bit, symlinks, and hard
    /// links as copies of their target. Devices and fifos are left out (a
    /// sandbox provides its own `/dev`); ownership is not part of REAPI's
    /// tree. Paths that would leave `path` are refused.
    /// File contents are not kept: each blob is read back from `tar` (which
    /// must stay in place until the upload) at its offset.
    pub fn add_tar(&mut self, path: &str, tar: &Path) -> Result<(), RemoteError> {
        self.add_entries(path, tar, None)
    }

    /// Applies an OCI layer (an uncompressed tar) over what is at `path`,
    /// as a container runtime unpacks a chain of layers: entries replace
    /// what was there (a directory over a directory merges), `.wh.<name>`
    /// removes `<name>` of the layers below, `.wh..wh..opq` empties its
    /// directory of them, and a hard link may name a file of a layer
    /// below. `listing` is kept in step: every path with its kind, mode,
    /// owner and link target, as the layers say (what REAPI's tree cannot
    /// carry), removed paths gone. Applying a chain bottom first gives the
    /// image's root filesystem and its listing.
    pub fn add_layer(
        &mut self,
        path: &str,
        tar: &Path,
        listing: &mut Listing,
    ) -> Result<(), RemoteError> {
        self.add_entries(path, tar, Some(listing))
    }

    fn add_entries(
        &mut self,
        path: &str,
        tar: &Path,
        mut listing: Option<&mut Listing>,
    ) -> Result<(), RemoteError> {
        use std::io::Read as _;
        let base: Vec<String> = components(path)?.into_iter().map(String::from).collect();
        let err = |e: std::io::Error| {
            RemoteError::new(format!(
                "reading root filesystem tar {}: {e}",
                tar.display()
            ))
        };
        let file: std::sync::Arc<Path> = std::sync::Arc::from(tar);
        // Paths this tar put, so an opaque whiteout spares them.
        let mut own: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
        let mut ar = tar::Archive::new(std::io::BufReader::new(
            std::fs::File::open(tar).map_err(err)?,
        ));
        for entry in ar.entries().map_err(err)? {
            let mut entry = entry.map_err(err)?;
            let rel = entry.path().map_err(err)?.to_string_lossy().into_owned();
            let rel = rel
                .trim_start_matches("./")
                .trim_end_matches('/')
                .to_string();
            if rel.is_empty() || rel == "." {
                continue;
            }
            let rel_parts = components(&rel)?;
            let rel = rel_parts.join("/");
            let mut at: Vec<&str> = base.iter().map(String::as_str).collect();
            at.extend(rel_parts.iter().copied());
            if let Some(listing) = listing.as_deref_mut() {
                let (dir, name) = rel.rsplit_once('/').unwrap_or(("", rel.as_str()));
                if name == WHITEOUT_OPAQUE {
                    let dir_at = &at[..at.len() - 1];
                    if let Some(d) = self.find_dir(dir_at) {
                        keep_only(d, dir, &own);
                    }
                    let inside = if dir.is_empty() {
                        String::new()
                    } else {
                        format!("{dir}/")
                    };
                    listing.retain(|p, _| !p.starts_with(&inside) || own.contains(p) || p == dir);
                    continue;
                }
                if let Some(gone) = name.strip_prefix(WHITEOUT) {
                    let mut gone_at = at[..at.len() - 1].to_vec();
                    gone_at.push(gone);
                    self.remove(&gone_at);
                    remove_listed(listing, &join(dir, gone));
                    continue;
                }
            }
            let link = |entry: &tar::Entry<_>| -> Result<String, RemoteError> {
                Ok(entry
                    .link_name()
                    .map_err(err)?
                    .map(|l| l.to_string_lossy().into_owned())
                    .unwrap_or_default())
            };
            let h = entry.header();
            let mut meta = PathMeta {
                kind: PathKind::Other,
                mode: h.mode().map_err(err)? & 0o7777,
                // Owners only matter for a layer's listing (a plain root
                // filesystem tar may leave them blank).
                uid: if listing.is_some() {
                    h.uid().map_err(err)?
                } else {
                    0
                },
                gid: if listing.is_some() {
                    h.gid().map_err(err)?
                } else {
                    0
                },
                link: String::new(),
            };
            match h.entry_type() {
                tar::EntryType::Directory => {
                    meta.kind = PathKind::Dir;
                    self.put(&at, Item::Dir)
                }
                tar::EntryType::Symlink => {
                    meta.kind = PathKind::Symlink;
                    meta.link = link(&entry)?;
                    self.put(&at, Item::Symlink(meta.link.clone()))
                }
                tar::EntryType::Link => {
                    meta.kind = PathKind::File;
                    let target = link(&entry)?;
                    let target = components(&target)?;
                    let mut target_at: Vec<&str> = base.iter().map(String::as_str).collect();
                    target_at.extend(target.iter().copied());
                    let Some((d, exec)) = self.file_at(&target_at) else {
                        return Err(RemoteError::new(format!(
                            "root filesystem tar: hard link {rel} to {}, which is not a file before it",
                            target.join("/")
                        )));
                    };
                    self.put(&at, Item::File(d, exec));
                }
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    meta.kind = PathKind::File;
                    let exec = meta.mode & 0o111 != 0;
                    let offset = entry.raw_file_position();
                    let mut data = Vec::new();
                    entry.read_to_end(&mut data).map_err(err)?;
                    let d = self.f.digest(&data);
                    let blob = Blob::Range {
                        file: file.clone(),
                        offset,
                        len: data.len() as u64,
                    };
                    self.blobs
                        .entry(d.hash.clone())
                        .or_insert_with(|| (d.clone(), blob));
                    self.put(&at, Item::File(d, exec));
                }
                // Devices and fifos: listed, not in the tree.
                _ => self.remove(&at),
            }
            if let Some(listing) = listing.as_deref_mut() {
                if meta.kind != PathKind::Dir {
                    remove_listed(listing, &rel);
                }
                listing.insert(rel.clone(), meta);
                own.insert(rel);
            }
        }
        Ok(())
    }

    /// Encodes the tree: the root digest; every Directory message is added
    /// to the blobs.
    pub fn finish(mut self) -> (re::Digest, BTreeMap<String, (re::Digest, Blob)>) {
        let root = std::mem::take(&mut self.root);
        let d = encode(self.f, &root, &mut self.blobs);
        (d, self.blobs)
    }
}

/// A whiteout's name prefix: `.wh.<name>` removes `<name>` of the layers below.
pub const WHITEOUT: &str = ".wh.";

/// An opaque whiteout: its directory shows nothing of the layers below.
pub const WHITEOUT_OPAQUE: &str = ".wh..wh..opq";

/// What a path is, as a layer's tar says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathKind {
    /// A directory.
    Dir,
    /// A regular file (or a hard link to one).
    File,
    /// A symbolic link.
    Symlink,
    /// A device or a fifo (never in an input root).
    Other,
}

/// What REAPI's tree cannot carry about a path: its kind, permission bits
/// (with setuid, setgid and sticky), owner and link target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathMeta {
    /// Its kind.
    pub kind: PathKind,
    /// `mode & 0o7777`.
    pub mode: u32,
    /// Numeric owner.
    pub uid: u64,
    /// Numeric group.
    pub gid: u64,
    /// A symlink's target (empty otherwise).
    pub link: String,
}

/// Every path of a root filesystem (relative, no leading `/`) with its
/// [`PathMeta`].
pub type Listing = BTreeMap<String, PathMeta>;

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

/// Keeps in `d` (the directory at `dir`) only what `own` names, at any depth.
fn keep_only(d: &mut Dir, dir: &str, own: &std::collections::BTreeSet<String>) {
    d.files.retain(|n, _| own.contains(&join(dir, n)));
    d.symlinks.retain(|n, _| own.contains(&join(dir, n)));
    d.dirs.retain(|n, _| own.contains(&join(dir, n)));
    for (n, sub) in d.dirs.iter_mut() {
        keep_only(sub, &join(dir, n), own);
    }
}

/// Removes `path` and everything under it from a listing.
fn remove_listed(listing: &mut Listing, path: &str) {
    listing.remove(path);
    let inside = format!("{path}/");
    let under: Vec<String> = listing
        .range(inside.clone()..)
        .take_while(|(p, _)| p.starts_with(&inside))
        .map(|(p, _)| p.clone())
        .collect();
    for p in under {
        listing.remove(&p);
    }
}

/// Whether the file at `path` is gzip (its magic bytes).
fn is_gzip(path: &Path) -> std::io::Result<bool> {
    use std::io::Read as _;
    let mut magic = [0u8; 2];
    let mut f = std::fs::File::open(path)?;
    Ok(f.read_exact(&mut magic).is_ok() && magic == [0x1f, 0x8b])
}

/// The tar at `path`, gunzipped as it is read when it is gzip.
pub fn tar_reader(path: &Path) -> std::io::Result<Box<dyn std::io::Read>> {
    let file = std::io::BufReader::new(std::fs::File::open(path)?);
    Ok(if is_gzip(path)? {
        Box::new(flate2::read::MultiGzDecoder::new(file))
    } else {
        Box::new(file)
    })
}

/// A root filesystem assembled from an image's layer blobs (gzip or plain
/// tars, bottom first): the input root an action runs in, with the listing
/// of what its tree cannot say. The blobs are unpacked to plain tars in a
/// scratch directory, which lives as long as this value (the input root's
/// blobs are read from them at upload time).
pub struct LayeredRoot {
    /// The tree.
    pub input: InputRoot,
    /// Kind, mode, owner and link target of every path.
    pub listing: Listing,
    _tars: tempfile::TempDir,
}

impl LayeredRoot {
    /// Applies `layers` (bottom first) onto an empty root.
    pub fn from_layers(f: DigestFn, layers: &[PathBuf]) -> Result<Self, RemoteError> {
        let tars = tempfile::Builder::new()
            .prefix("charly-layers-")
            .tempdir()
            .map_err(|e| RemoteError::new(format!("scratch directory: {e}")))?;
        let mut input = InputRoot::new(f);
        let mut listing = Listing::new();
        for (i, blob) in layers.iter().enumerate() {
            let err =
                |e: std::io::Error| RemoteError::new(format!("layer {}: {e}", blob.display()));
            let plain = if is_gzip(blob).map_err(err)? {
                let plain = tars.path().join(format!("{i}.tar"));
                let mut out = std::fs::File::create(&plain).map_err(err)?;
                std::io::copy(&mut tar_reader(blob).map_err(err)?, &mut out).map_err(err)?;
                plain
            } else {
                blob.clone()
            };
            input.add_layer("", &plain, &mut listing)?;
        }
        Ok(LayeredRoot {
            input,
            listing,
            _tars: tars,
        })
    }
}

fn encode(f: DigestFn, d: &Dir, blobs: &mut BTreeMap<String, (re::Digest, Blob)>) -> re::Digest {
    let msg = re::Directory {
        files: d
            .files
            .iter()
            .map(|(n, (dg, exec))| re::FileNode {
                name: n.clone(),
                digest: Some(dg.clone()),
                is_executable: *exec,
                node_properties: None,
            })
            .collect(),
        directories: d
            .dirs
            .iter()
            .map(|(n, child)| re::DirectoryNode {
                name: n.clone(),
                digest: Some(encode(f, child, blobs)),
            })
            .collect(),
        symlinks: d
            .symlinks
            .iter()
            .map(|(n, t)| re::SymlinkNode {
                name: n.clone(),
                target: t.clone(),
                node_properties: None,
            })
            .collect(),
        node_properties: None,
    };
    let (dg, bytes) = f.message(&msg);
    blobs.insert(dg.hash.clone(), (dg.clone(), Blob::Bytes(bytes.into())));
    dg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_content_same_root_and_sorted_children() {
        let t = tempfile::tempdir().expect("tmp");
        std::fs::create_dir_all(t.path().join("b")).expect("mkdir");
        std::fs::write(t.path().join("b/z"), "same").expect("w");
        std::fs::write(t.path().join("a"), "same").expect("w");
        let mut one = InputRoot::new(DigestFn::Sha256);
        one.add_dir("src", t.path()).expect("add");
        one.add_bytes("build.sh", b"echo hi".to_vec(), true)
            .expect("add");
        let (d1, blobs) = one.finish();
        // "same" once, "echo hi" once, 3 directories (root, src, src/b).
        assert_eq!(blobs.len(), 5);
        let mut two = InputRoot::new(DigestFn::Sha256);
        two.add_bytes("build.sh", b"echo hi".to_vec(), true)
            .expect("add");
        two.add_dir("src/", t.path()).expect("add");
        assert_eq!(two.finish().0, d1);
        assert!(
            InputRoot::new(DigestFn::Sha256)
                .add_bytes("../x", vec![], false)
                .is_err()
        );
    }

    /// A root filesystem tar gives the tree its unpacked directory gives:
    /// files with their executable bit, symlinks, hard links as copies;
    /// devices are left out; an entry that leaves the root is refused.
    #[test]
    fn a_tar_gives_the_tree_of_its_directory() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().expect("tmp");
        let dir = t.path().join("root");
        std::fs::create_dir_all(dir.join("bin")).expect("mkdir");
        std::fs::create_dir_all(dir.join("empty")).expect("mkdir");
        std::fs::write(dir.join("bin/tool"), "#!/bin/sh\n").expect("w");
        std::fs::set_permissions(dir.join("bin/tool"), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        std::fs::write(dir.join("bin/data"), "data").expect("w");
        std::fs::write(dir.join("bin/same"), "data").expect("w");
        std::os::unix::fs::symlink("tool", dir.join("bin/link")).expect("symlink");
        let mut from_dir = InputRoot::new(DigestFn::Sha256);
        from_dir.add_dir("", &dir).expect("add");

        let mut b = tar::Builder::new(Vec::new());
        let head = |path: &str, kind: tar::EntryType, mode: u32, size: u64| {
            let mut h = tar::Header::new_gnu();
            h.set_path(path).expect("path");
            h.set_entry_type(kind);
            h.set_mode(mode);
            h.set_size(size);
            h.set_cksum();
            h
        };
        for d in ["./", "./bin/", "./empty/", "./dev/"] {
            b.append(
                &head(d, tar::EntryType::Directory, 0o755, 0),
                std::io::empty(),
            )
            .expect("dir");
        }
        b.append(
            &head("./bin/tool", tar::EntryType::Regular, 0o755, 10),
            &b"#!/bin/sh\n"[..],
        )
        .expect("file");
        b.append(
            &head("./bin/data", tar::EntryType::Regular, 0o644, 4),
            &b"data"[..],
        )
        .expect("file");
        let mut link = head("./bin/same", tar::EntryType::Link, 0o644, 0);
        link.set_link_name("./bin/data").expect("link");
        link.set_cksum();
        b.append(&link, std::io::empty()).expect("hard link");
        let mut sym = head("./bin/link", tar::EntryType::Symlink, 0o777, 0);
        sym.set_link_name("tool").expect("link");
        sym.set_cksum();
        b.append(&sym, std::io::empty()).expect("symlink");
        b.append(
            &head("./dev/null", tar::EntryType::Char, 0o666, 0),
            std::io::empty(),
        )
        .expect("device");
        let tar_file = t.path().join("root.tar");
        std::fs::write(&tar_file, b.into_inner().expect("tar")).expect("write tar");
        let mut from_tar = InputRoot::new(DigestFn::Sha256);
        from_tar.add_tar("", &tar_file).expect("add tar");
        // Every blob reads back as the bytes its digest names.
        for (d, blob) in from_tar.blobs.values() {
            assert_eq!(DigestFn::Sha256.digest(&blob.read().expect("read")), *d);
        }
        // The device is left out but its directory stays; the directory
        // tree has no dev/ at all, so add it there for the comparison.
        from_dir.add_empty_dir("dev").expect("dev");
        assert_eq!(from_tar.finish().0, from_dir.finish().0);

        let mut evil = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.as_gnu_mut().expect("gnu").name[..9].copy_from_slice(b"../escape");
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(0);
        h.set_cksum();
        evil.append(&h, std::io::empty()).expect("append");
        let evil_file = t.path().join("evil.tar");
        std::fs::write(&evil_file, evil.into_inner().expect("tar")).expect("write tar");
        let e = InputRoot::new(DigestFn::Sha256)
            .add_tar("", &evil_file)
            .expect_err("refused");
        assert!(e.message.contains("leaves the input root"), "{}", e.message);
    }
    /// A tar of `entries`: (path, kind, mode, uid, content or link target).
    fn layer_tar(entries: &[(&str, tar::EntryType, u32, u64, &str)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, kind, mode, uid, body) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_path(path).expect("path");
            h.set_entry_type(*kind);
            h.set_mode(*mode);
            h.set_uid(*uid);
            h.set_gid(*uid);
            let data: &[u8] = if matches!(kind, tar::EntryType::Regular) {
                body.as_bytes()
            } else {
                if !body.is_empty() {
                    h.set_link_name(body).expect("link");
                }
                b""
            };
            h.set_size(data.len() as u64);
            h.set_cksum();
            b.append(&h, data).expect("append");
        }
        b.into_inner().expect("tar")
    }

    /// A chain of layers gives the tree and listing of the image they
    /// make: whiteouts remove, an opaque directory hides the layers below,
    /// a hard link reaches into a lower layer, a file replaces a directory,
    /// and modes and owners are listed as the top layer says.
    #[test]
    fn layers_apply_with_whiteouts_and_list_modes_and_owners() {
        use tar::EntryType::{Directory as D, Link as H, Regular as F, Symlink as S};
        let t = tempfile::tempdir().expect("tmp");
        let lower = layer_tar(&[
            ("etc/", D, 0o755, 0, ""),
            ("etc/a", F, 0o644, 0, "a"),
            ("etc/keep", F, 0o600, 0, "keep"),
            ("etc/sub/", D, 0o700, 0, ""),
            ("etc/sub/x", F, 0o644, 0, "x"),
            ("bin/", D, 0o755, 0, ""),
            ("bin/tool", F, 0o4755, 0, "#!/bin/sh\n"),
            ("doc/", D, 0o755, 0, ""),
            ("doc/old", F, 0o644, 0, "old"),
            ("doc/deep/", D, 0o755, 0, ""),
            ("doc/deep/older", F, 0o644, 0, "older"),
            ("sh", S, 0o777, 0, "bin/tool"),
        ]);
        let upper = layer_tar(&[
            ("etc/.wh.a", F, 0o644, 0, ""),
            ("etc/sub", F, 0o640, 1000, "now a file"),
            ("etc/b", F, 0o644, 1000, "b"),
            ("doc/", D, 0o750, 0, ""),
            ("doc/.wh..wh..opq", F, 0o644, 0, ""),
            ("doc/deep/", D, 0o755, 0, ""),
            ("doc/deep/new", F, 0o644, 0, "new"),
            ("bin/tool2", H, 0o4755, 0, "bin/tool"),
        ]);
        std::fs::write(t.path().join("lower.tar"), lower).expect("w");
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &upper).expect("gz");
        std::fs::write(t.path().join("upper.tar.gz"), gz.finish().expect("gz")).expect("w");
        let root = LayeredRoot::from_layers(
            DigestFn::Sha256,
            &[t.path().join("lower.tar"), t.path().join("upper.tar.gz")],
        )
        .expect("layers apply");

        let listed: Vec<(&str, PathKind, u32, u64)> = root
            .listing
            .iter()
            .map(|(p, m)| (p.as_str(), m.kind, m.mode, m.uid))
            .collect();
        assert_eq!(
            listed,
            vec![
                ("bin", PathKind::Dir, 0o755, 0),
                ("bin/tool", PathKind::File, 0o4755, 0),
                ("bin/tool2", PathKind::File, 0o4755, 0),
                ("doc", PathKind::Dir, 0o750, 0),
                ("doc/deep", PathKind::Dir, 0o755, 0),
                ("doc/deep/new", PathKind::File, 0o644, 0),
                ("etc", PathKind::Dir, 0o755, 0),
                ("etc/b", PathKind::File, 0o644, 1000),
                ("etc/keep", PathKind::File, 0o600, 0),
                ("etc/sub", PathKind::File, 0o640, 1000),
                ("sh", PathKind::Symlink, 0o777, 0),
            ]
        );
        assert_eq!(root.listing["sh"].link, "bin/tool");

        // The tree is the one of the directory those layers unpack to.
        let dir = t.path().join("unpacked");
        for d in ["etc", "bin", "doc/deep"] {
            std::fs::create_dir_all(dir.join(d)).expect("mkdir");
        }
        for (p, body) in [
            ("etc/keep", "keep"),
            ("etc/sub", "now a file"),
            ("etc/b", "b"),
            ("doc/deep/new", "new"),
            ("bin/tool", "#!/bin/sh\n"),
            ("bin/tool2", "#!/bin/sh\n"),
        ] {
            std::fs::write(dir.join(p), body).expect("w");
        }
        for p in ["bin/tool", "bin/tool2"] {
            std::fs::set_permissions(dir.join(p), std::fs::Permissions::from_mode(0o755))
                .expect("chmod");
        }
        std::os::unix::fs::symlink("bin/tool", dir.join("sh")).expect("symlink");
        let mut expected = InputRoot::new(DigestFn::Sha256);
        expected.add_dir("", &dir).expect("add");
        assert_eq!(root.input.paths(), expected.paths());
        let blobs = root.input.blobs.clone();
        assert_eq!(root.input.finish().0, expected.finish().0);
        // Blobs read back from the unpacked tars as the bytes they name.
        for (d, blob) in blobs.values() {
            assert_eq!(DigestFn::Sha256.digest(&blob.read().expect("read")), *d);
        }

        // A hard link to nothing below is refused, naming it.
        std::fs::write(
            t.path().join("bad.tar"),
            layer_tar(&[("bin/x", H, 0o755, 0, "bin/none")]),
        )
        .expect("w");
        let e = LayeredRoot::from_layers(DigestFn::Sha256, &[t.path().join("bad.tar")])
            .err()
            .expect("refused");
        assert!(e.message.contains("bin/none"), "{}", e.message);
    }
}
