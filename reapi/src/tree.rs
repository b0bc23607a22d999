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

    /// Puts a directory, symlink or file at `at` (path components).
    fn put(&mut self, at: &[&str], item: Item) {
        let Some((name, dirs)) = at.split_last() else {
            return;
        };
        let name = (*name).to_string();
        match item {
            Item::Dir => {
                self.dir_at(at);
            }
            Item::Symlink(target) => {
                self.dir_at(dirs).symlinks.insert(name, target);
            }
            Item::File(d, exec) => {
                self.dir_at(dirs).files.insert(name, (d, exec));
            }
        }
    }

    /// Every path in the tree (directories, files and symlinks, relative to
    /// the root), sorted.
    pub fn paths(&self) -> Vec<String> {
        fn walk(d: &Dir, at: &str, out: &mut Vec<String>) {
            let join = |n: &str| {
                if at.is_empty() {
                    n.to_string()
                } else {
                    format!("{at}/{n}")
                }
            };
            for n in d.files.keys().chain(d.symlinks.keys()) {
                out.push(join(n));
            }
            for (n, sub) in &d.dirs {
                let p = join(n);
                out.push(p.clone());
                walk(sub, &p, out);
            }
        }
        let mut out = Vec::new();
        walk(&self.root, "", &mut out);
        out.sort();
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
        use std::io::Read as _;
        let base: Vec<String> = components(path)?.into_iter().map(String::from).collect();
        let err = |e: std::io::Error| {
            RemoteError::new(format!(
                "reading root filesystem tar {}: {e}",
                tar.display()
            ))
        };
        let file: std::sync::Arc<Path> = std::sync::Arc::from(tar);
        let mut files: BTreeMap<String, (re::Digest, bool)> = BTreeMap::new();
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
            let mut at: Vec<&str> = base.iter().map(String::as_str).collect();
            at.extend(components(&rel)?);
            let link = |entry: &tar::Entry<_>| -> Result<String, RemoteError> {
                Ok(entry
                    .link_name()
                    .map_err(err)?
                    .map(|l| l.to_string_lossy().into_owned())
                    .unwrap_or_default())
            };
            match entry.header().entry_type() {
                tar::EntryType::Directory => self.put(&at, Item::Dir),
                tar::EntryType::Symlink => self.put(&at, Item::Symlink(link(&entry)?)),
                tar::EntryType::Link => {
                    let target = link(&entry)?.trim_start_matches("./").to_string();
                    let Some((d, exec)) = files.get(&target).cloned() else {
                        return Err(RemoteError::new(format!(
                            "root filesystem tar: hard link {rel} to {target}, which is not a file before it"
                        )));
                    };
                    self.put(&at, Item::File(d.clone(), exec));
                    files.insert(rel.clone(), (d, exec));
                }
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    let exec = entry.header().mode().map_err(err)? & 0o111 != 0;
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
                    self.put(&at, Item::File(d.clone(), exec));
                    files.insert(rel.clone(), (d, exec));
                }
                _ => {}
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
}
