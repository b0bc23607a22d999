//! Reproducible tars for builder artifacts and layers.
//!
//! The same files always give the same bytes: entries sorted by path, mtime
//! 0, numeric owner (the box user's when the artifact is chowned), modes
//! taken from the files (setuid and 0600 survive — `tar`'s deterministic
//! header mode would flatten them), symlinks kept as links, no sparse files.

use std::io::Read;
use std::path::Path;

/// What an entry is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A regular file with its content.
    File(Vec<u8>),
    /// A directory.
    Dir,
    /// A symbolic link to a target.
    Symlink(String),
}

/// One entry, with a path relative to `/` (no leading slash).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Path, relative to the root.
    pub path: String,
    /// Kind and content.
    pub kind: Kind,
    /// Permission bits (incl. setuid/setgid/sticky).
    pub mode: u32,
    /// Owner.
    pub uid: u64,
    /// Group.
    pub gid: u64,
}

/// The entries of an exported path: `tar` holds `src` as `podman cp
/// ctr:SRC -` writes it (entries start with `src`'s last component); they
/// are placed under `src`'s parent.
pub fn read_export(tar: &[u8], src: &str) -> std::io::Result<Vec<Entry>> {
    let parent = Path::new(src.trim_end_matches('/'))
        .parent()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    read_tar(tar, &parent)
}

/// Reads a tar stream (as `podman cp ctr:/a/b -` writes it: entries start
/// with `b/`) and places the entries under `parent` (`/a`).
pub fn read_tar(bytes: &[u8], parent: &str) -> std::io::Result<Vec<Entry>> {
    let mut ar = tar::Archive::new(bytes);
    let mut out = Vec::new();
    let parent = parent.trim_matches('/');
    for e in ar.entries()? {
        let mut e = e?;
        let rel = e
            .path()?
            .to_string_lossy()
            .trim_start_matches("./")
            .trim_end_matches('/')
            .to_string();
        if rel.is_empty() {
            continue;
        }
        // A member may not climb: `..` would place it outside the tree it
        // is extracted into (absolute members are made relative below).
        if rel.split('/').any(|c| c == "..") {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("tar member `{rel}` has a `..` component"),
            ));
        }
        let rel = rel.trim_start_matches('/').to_string();
        if rel.is_empty() {
            continue;
        }
        let path = if parent.is_empty() {
            rel
        } else {
            format!("{parent}/{rel}")
        };
        let h = e.header();
        let mode = h.mode()?;
        let (uid, gid) = (h.uid()?, h.gid()?);
        let kind = match h.entry_type() {
            tar::EntryType::Directory => Kind::Dir,
            tar::EntryType::Symlink => Kind::Symlink(
                e.link_name()?
                    .map(|l| l.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            ),
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let mut buf = Vec::new();
                e.read_to_end(&mut buf)?;
                Kind::File(buf)
            }
            // Hard links, devices and fifos do not occur in builder outputs;
            // keeping them out makes artifacts portable.
            _ => continue,
        };
        out.push(Entry {
            path,
            kind,
            mode,
            uid,
            gid,
        });
    }
    Ok(out)
}

/// Writes entries as a reproducible tar. `owner` replaces every owner.
pub fn write_tar(
    dest: &Path,
    mut entries: Vec<Entry>,
    owner: Option<(u32, u32)>,
) -> std::io::Result<()> {
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    entries.dedup_by(|a, b| a.path == b.path);
    if let Some(p) = dest.parent() {
        std::fs::create_dir_all(p)?;
    }
    let file = std::fs::File::create(dest)?;
    let mut b = tar::Builder::new(std::io::BufWriter::new(file));
    b.follow_symlinks(false);
    b.sparse(false);
    for e in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mtime(0);
        h.set_mode(e.mode & 0o7777);
        let (uid, gid) = owner.map_or((e.uid, e.gid), |(u, g)| (u64::from(u), u64::from(g)));
        h.set_uid(uid);
        h.set_gid(gid);
        match &e.kind {
            Kind::Dir => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_size(0);
                b.append_data(&mut h, format!("{}/", e.path), std::io::empty())?;
            }
            Kind::Symlink(target) => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_size(0);
                b.append_link(&mut h, &e.path, target)?;
            }
            Kind::File(data) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_size(data.len() as u64);
                b.append_data(&mut h, &e.path, data.as_slice())?;
            }
        }
    }
    b.into_inner()?
        .into_inner()
        .map_err(|e| e.into_error())?
        .sync_all()
}

/// Reads a directory tree into entries under `prefix` (for tests and local artifacts).
pub fn entries_of_dir(dir: &Path, prefix: &str) -> std::io::Result<Vec<Entry>> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    for e in walkdir::WalkDir::new(dir)
        .follow_links(false)
        .sort_by_file_name()
    {
        let e = e.map_err(std::io::Error::other)?;
        let rel = e.path().strip_prefix(dir).map_err(std::io::Error::other)?;
        if rel.as_os_str().is_empty() {
            continue;
        }
        let path = format!("{}/{}", prefix.trim_matches('/'), rel.to_string_lossy())
            .trim_start_matches('/')
            .to_string();
        let meta = std::fs::symlink_metadata(e.path())?;
        let kind = if meta.file_type().is_symlink() {
            Kind::Symlink(std::fs::read_link(e.path())?.to_string_lossy().into_owned())
        } else if meta.is_dir() {
            Kind::Dir
        } else if meta.is_file() {
            Kind::File(std::fs::read(e.path())?)
        } else {
            continue;
        };
        out.push(Entry {
            path,
            kind,
            mode: meta.mode() & 0o7777,
            uid: u64::from(meta.uid()),
            gid: u64::from(meta.gid()),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<Entry> {
        vec![
            Entry {
                path: "home/user/.npm-global/bin/cowsay".into(),
                kind: Kind::Symlink("../lib/node_modules/cowsay/cli.js".into()),
                mode: 0o777,
                uid: 0,
                gid: 0,
            },
            Entry {
                path: "home/user/.npm-global".into(),
                kind: Kind::Dir,
                mode: 0o755,
                uid: 0,
                gid: 0,
            },
            Entry {
                path: "home/user/.npm-global/secret".into(),
                kind: Kind::File(b"s".to_vec()),
                mode: 0o600,
                uid: 0,
                gid: 0,
            },
            Entry {
                path: "usr/local/bin/tool".into(),
                kind: Kind::File(b"#!/bin/sh\n".to_vec()),
                mode: 0o4755,
                uid: 0,
                gid: 0,
            },
        ]
    }

    #[test]
    fn climbing_members_are_refused() {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(1);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        // `append_data` refuses `..`; write the name into the header directly.
        h.as_gnu_mut().expect("gnu").name[..8].copy_from_slice(b"../../x\0");
        h.set_cksum();
        b.append(&h, &b"x"[..]).expect("append");
        let bytes = b.into_inner().expect("tar");
        let e = read_tar(&bytes, "").expect_err("refused");
        assert!(e.to_string().contains(".."), "{e}");
    }

    #[test]
    fn reproducible_and_faithful() {
        let t = tempfile::tempdir().expect("tmp");
        let a = t.path().join("a.tar");
        let b = t.path().join("b.tar");
        write_tar(&a, sample(), Some((1000, 1000))).expect("a");
        let mut rev = sample();
        rev.reverse();
        write_tar(&b, rev, Some((1000, 1000))).expect("b");
        assert_eq!(
            std::fs::read(&a).expect("a"),
            std::fs::read(&b).expect("b"),
            "order of input does not matter"
        );
        let back = read_tar(&std::fs::read(&a).expect("read"), "").expect("parse");
        let secret = back
            .iter()
            .find(|e| e.path.ends_with("secret"))
            .expect("secret");
        assert_eq!((secret.mode, secret.uid, secret.gid), (0o600, 1000, 1000));
        let tool = back
            .iter()
            .find(|e| e.path.ends_with("tool"))
            .expect("tool");
        assert_eq!(tool.mode, 0o4755, "setuid survives");
        let link = back
            .iter()
            .find(|e| e.path.ends_with("cowsay"))
            .expect("link");
        assert_eq!(
            link.kind,
            Kind::Symlink("../lib/node_modules/cowsay/cli.js".into())
        );
        // Sorted by path.
        let paths: Vec<&str> = back.iter().map(|e| e.path.as_str()).collect();
        let mut sorted = paths.clone();
        sorted.sort_unstable();
        assert_eq!(paths, sorted);
    }
}
