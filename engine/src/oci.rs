//! OCI image layouts: `charly box build BOX --output oci:DIR`.
//!
//! A built image is stored as an OCI archive (what `podman save --format
//! oci-archive` writes: an image layout in a tar). Exporting unpacks it into
//! an image layout directory with the oci-spec types: every blob is checked
//! against its sha256 digest before it is written (atomically, skipped when
//! present), the manifest descriptor is tagged with
//! `org.opencontainers.image.ref.name`, and the layout's `index.json` keeps
//! the other images already in it, so one directory can hold several boxes.
//! `index.json` is written canonically (sorted keys): oci-spec keeps
//! annotations in hash maps, whose order would otherwise vary.

use oci_spec::image::{ImageIndex, ImageIndexBuilder, OciLayoutBuilder};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The annotation naming an image in a layout.
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// An OCI content digest (`sha256:<hex>`), distinct from charly's blake3 digests.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OciDigest(String);

impl OciDigest {
    /// The sha256 digest of bytes.
    pub fn sha256(bytes: &[u8]) -> Self {
        OciDigest(format!(
            "sha256:{}",
            charly_rules::hex(&Sha256::digest(bytes))
        ))
    }

    /// `sha256:<hex>`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Why an export failed.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    /// Reading or writing failed.
    #[error("{0}")]
    Io(String),
    /// The archive is not an OCI layout.
    #[error("not an OCI archive: {0}")]
    Format(String),
    /// A blob's content does not match its name.
    #[error("blob {name} has digest {actual}")]
    Digest {
        /// Name in the archive.
        name: String,
        /// What the content hashes to.
        actual: String,
    },
}

fn io(what: impl std::fmt::Display) -> impl Fn(std::io::Error) -> OciError {
    move |e| OciError::Io(format!("{what}: {e}"))
}

/// What an export wrote.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Exported {
    /// The layout directory.
    pub dir: PathBuf,
    /// The ref name the image got.
    pub reference: String,
    /// The manifest digest.
    pub manifest: String,
    /// Blobs written (not already present).
    pub blobs_written: usize,
}

/// Unpacks an OCI archive into the layout at `dir` under `reference`.
pub fn export_archive(archive: &Path, dir: &Path, reference: &str) -> Result<Exported, OciError> {
    let blobs_dir = dir.join("blobs").join("sha256");
    // Every write stays inside the layout directory (crate::fsroot), and
    // temp files a killed export left there are removed first.
    let root = crate::fsroot::Root::create(dir).map_err(io(dir.display()))?;
    let blobs_rel = Path::new("blobs/sha256");
    root.create_dir_all(blobs_rel)
        .map_err(io(blobs_dir.display()))?;
    let _ = root.sweep_temps(blobs_rel, false);
    let _ = root.sweep_temps(Path::new(""), false);
    let file = std::fs::File::open(archive).map_err(io(archive.display()))?;
    let mut ar = tar::Archive::new(std::io::BufReader::new(file));
    let mut index: Option<ImageIndex> = None;
    let mut written = 0;
    for e in ar.entries().map_err(io("archive"))? {
        let mut e = e.map_err(io("archive entry"))?;
        let path = e
            .path()
            .map_err(io("archive path"))?
            .to_string_lossy()
            .trim_start_matches("./")
            .to_string();
        if path == "index.json" {
            let mut buf = Vec::new();
            e.read_to_end(&mut buf).map_err(io("index.json"))?;
            index = Some(
                ImageIndex::from_reader(buf.as_slice())
                    .map_err(|err| OciError::Format(format!("index.json: {err}")))?,
            );
        } else if let Some(hex) = path.strip_prefix("blobs/sha256/") {
            if hex.is_empty() || !e.header().entry_type().is_file() {
                continue;
            }
            let mut buf = Vec::new();
            e.read_to_end(&mut buf).map_err(io(&path))?;
            let actual = OciDigest::sha256(&buf);
            if actual.as_str() != format!("sha256:{hex}") {
                return Err(OciError::Digest {
                    name: path,
                    actual: actual.0,
                });
            }
            // The name is the verified digest: 64 hex digits, a plain file name.
            let dest_rel = blobs_rel.join(hex);
            let dest = blobs_dir.join(hex);
            if root.lstat(&dest_rel).map_err(io(dest.display()))?.is_none() {
                root.write_atomic(&dest_rel, &buf, 0o644, None, false)
                    .map_err(io(dest.display()))?;
                written += 1;
            }
        }
    }
    let index = index.ok_or_else(|| OciError::Format("no index.json".into()))?;
    let mut manifests = index.manifests().clone();
    let first = manifests
        .first()
        .cloned()
        .ok_or_else(|| OciError::Format("index.json lists no image".into()))?;
    for m in &mut manifests {
        let mut ann: HashMap<String, String> = m.annotations().clone().unwrap_or_default();
        ann.insert(REF_NAME.to_string(), reference.to_string());
        m.set_annotations(Some(ann));
    }
    // Keep the other images of an existing layout.
    let index_path = dir.join("index.json");
    let mut all = Vec::new();
    if index_path.is_file() {
        let old = ImageIndex::from_file(&index_path)
            .map_err(|e| OciError::Format(format!("{}: {e}", index_path.display())))?;
        for m in old.manifests() {
            let name = m
                .annotations()
                .as_ref()
                .and_then(|a| a.get(REF_NAME))
                .cloned();
            if name.as_deref() != Some(reference) {
                all.push(m.clone());
            }
        }
    }
    all.extend(manifests);
    let merged = ImageIndexBuilder::default()
        .schema_version(2u32)
        .media_type(oci_spec::image::MediaType::ImageIndex)
        .manifests(all)
        .build()
        .map_err(|e| OciError::Format(e.to_string()))?;
    write_canonical(&index_path, &merged)?;
    let layout = OciLayoutBuilder::default()
        .image_layout_version("1.0.0")
        .build()
        .map_err(|e| OciError::Format(e.to_string()))?;
    write_canonical(&dir.join("oci-layout"), &layout)?;
    Ok(Exported {
        dir: dir.to_path_buf(),
        reference: reference.to_string(),
        manifest: first.digest().to_string(),
        blobs_written: written,
    })
}

/// JSON with sorted keys, written atomically.
fn write_canonical<T: serde::Serialize>(path: &Path, v: &T) -> Result<(), OciError> {
    let value = serde_json::to_value(v).map_err(|e| OciError::Format(e.to_string()))?;
    let text = serde_json::to_string(&value).map_err(|e| OciError::Format(e.to_string()))?;
    crate::generate::write_if_changed(path, text.as_bytes()).map_err(io(path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal OCI archive: one config, one layer, one manifest.
    fn archive(dir: &Path, marker: &str) -> PathBuf {
        let layer = {
            let mut b = tar::Builder::new(Vec::new());
            let mut h = tar::Header::new_gnu();
            h.set_size(marker.len() as u64);
            h.set_mode(0o644);
            h.set_mtime(0);
            b.append_data(&mut h, "hello.txt", marker.as_bytes())
                .expect("append");
            b.into_inner().expect("tar")
        };
        let layer_d = OciDigest::sha256(&layer);
        let config = format!(
            "{{\"architecture\":\"amd64\",\"os\":\"linux\",\"rootfs\":{{\"type\":\"layers\",\"diff_ids\":[\"{}\"]}},\"config\":{{}}}}",
            layer_d.as_str()
        );
        let config_d = OciDigest::sha256(config.as_bytes());
        let manifest = format!(
            "{{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"config\":{{\"mediaType\":\"application/vnd.oci.image.config.v1+json\",\"digest\":\"{}\",\"size\":{}}},\"layers\":[{{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar\",\"digest\":\"{}\",\"size\":{}}}]}}",
            config_d.as_str(),
            config.len(),
            layer_d.as_str(),
            layer.len()
        );
        let manifest_d = OciDigest::sha256(manifest.as_bytes());
        let index = format!(
            "{{\"schemaVersion\":2,\"manifests\":[{{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"digest\":\"{}\",\"size\":{}}}]}}",
            manifest_d.as_str(),
            manifest.len()
        );
        let path = dir.join(format!("{marker}.tar"));
        let mut b = tar::Builder::new(std::fs::File::create(&path).expect("create"));
        let mut add = |name: &str, data: &[u8]| {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            b.append_data(&mut h, name, data).expect("append");
        };
        add("oci-layout", b"{\"imageLayoutVersion\":\"1.0.0\"}");
        add("index.json", index.as_bytes());
        for (d, data) in [
            (&layer_d, layer.as_slice()),
            (&config_d, config.as_bytes()),
            (&manifest_d, manifest.as_bytes()),
        ] {
            add(
                &format!("blobs/sha256/{}", d.as_str().trim_start_matches("sha256:")),
                data,
            );
        }
        b.finish().expect("finish");
        path
    }

    #[test]
    fn export_merges_images_and_is_canonical() {
        let t = tempfile::tempdir().expect("tmp");
        let layout = t.path().join("layout");
        let a = archive(t.path(), "a");
        let b = archive(t.path(), "b");
        let ea = export_archive(&a, &layout, "box-a-1.0").expect("export a");
        assert_eq!(ea.blobs_written, 3);
        let eb = export_archive(&b, &layout, "box-b-1.0").expect("export b");
        assert_eq!(eb.blobs_written, 3);
        // Re-exporting a writes nothing new and keeps both names.
        let again = export_archive(&a, &layout, "box-a-1.0").expect("again");
        assert_eq!(again.blobs_written, 0);
        let index = ImageIndex::from_file(layout.join("index.json")).expect("index");
        let names: Vec<String> = index
            .manifests()
            .iter()
            .filter_map(|m| {
                m.annotations()
                    .as_ref()
                    .and_then(|a| a.get(REF_NAME).cloned())
            })
            .collect();
        assert_eq!(names.len(), 2);
        assert!(
            names.contains(&"box-a-1.0".to_string()) && names.contains(&"box-b-1.0".to_string())
        );
        let text = std::fs::read_to_string(layout.join("index.json")).expect("read");
        let reserialized =
            serde_json::to_string(&serde_json::from_str::<serde_json::Value>(&text).expect("json"))
                .expect("json");
        assert_eq!(text, reserialized, "sorted keys");
    }

    #[test]
    fn a_corrupt_blob_is_refused() {
        let t = tempfile::tempdir().expect("tmp");
        let a = archive(t.path(), "a");
        // Flip a byte of the layer content inside the tar.
        let mut bytes = std::fs::read(&a).expect("read");
        let pos = bytes
            .windows(1)
            .position(|w| w == b"a" as &[u8])
            .expect("marker");
        let _ = pos;
        let needle = b"hello.txt";
        let at = bytes
            .windows(needle.len())
            .position(|w| w == needle)
            .expect("layer entry");
        bytes[at] ^= 0x20;
        std::fs::write(&a, bytes).expect("write");
        let err = export_archive(&a, &t.path().join("layout"), "x").expect_err("corrupt");
        assert!(matches!(err, OciError::Digest { .. }), "{err}");
    }
}
