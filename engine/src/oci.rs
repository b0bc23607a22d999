//! OCI images: assembled from stored layers, written as image layouts.
//!
//! A box image is not built as a whole: its layers are (see
//! the layer executors), and the image is assembled from them here —
//! config (the last layer's configuration with the box's labels and final
//! user, the chain's diff ids, one history entry per layer, timestamps at
//! the epoch) and manifest — deterministically, without a runner. The same
//! chain and facts give the same manifest digest on every machine.
//!
//! Layouts: [`write_image`] writes an image into an OCI image layout
//! directory (`box build --output oci:DIR`, and what runners load): every
//! blob is written atomically inside the layout (charly_files::fsroot) and
//! skipped when present, the manifest descriptor is tagged with
//! `org.opencontainers.image.ref.name`, and `index.json` keeps the other
//! images already in it, so one directory can hold several boxes.
//! `index.json` is written canonically (sorted keys): oci-spec keeps
//! annotations in hash maps, whose order would otherwise vary.
//! [`read_layout`] reads what a runner exported, checking each new blob
//! against its digest.

use crate::outputs::LayerDesc;
use oci_spec::image::{ImageIndex, ImageIndexBuilder, OciLayoutBuilder};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The annotation naming an image in a layout.
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// A layer blob on disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerFile {
    /// The blob.
    pub path: PathBuf,
    /// Its OCI description (`blob` left empty: the store fills it).
    pub desc: LayerDesc,
}

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

/// Media type of an uncompressed layer.
pub const LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
/// Media type of a gzip-compressed layer.
pub const LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
const CONFIG_TYPE: &str = "application/vnd.oci.image.config.v1+json";

/// The sha256 of a file, streamed.
pub fn sha256_file(path: &Path) -> std::io::Result<OciDigest> {
    sha256_reader(std::fs::File::open(path)?)
}

/// The sha256 of everything `r` yields, streamed.
pub fn sha256_reader(mut r: impl std::io::Read) -> std::io::Result<OciDigest> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(OciDigest(format!(
        "sha256:{}",
        charly_rules::hex(&h.finalize())
    )))
}

fn json_at<'v>(v: &'v serde_json::Value, what: &str) -> Result<&'v serde_json::Value, OciError> {
    v.get(what)
        .ok_or_else(|| OciError::Format(format!("no `{what}`")))
}

fn blob_name(digest: &str) -> Result<&str, OciError> {
    digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| OciError::Format(format!("bad digest {digest}")))
}

/// The digest of an empty tar archive (two zero blocks, uncompressed).
const EMPTY_TAR: &str = "sha256:5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef";

/// Reads the image `reference` of the layout at `dir`: its layers (files
/// of the layout; those below `from` are not read, they may be stand-ins)
/// and its configuration object. Layers from `from` up are checked
/// against their digests.
pub fn read_layout(
    dir: &Path,
    reference: &str,
    from: usize,
) -> Result<(Vec<LayerFile>, serde_json::Value), OciError> {
    let blobs = dir.join("blobs").join("sha256");
    let read_json = |path: &Path| -> Result<serde_json::Value, OciError> {
        let text = std::fs::read(path).map_err(io(path.display()))?;
        serde_json::from_slice(&text)
            .map_err(|e| OciError::Format(format!("{}: {e}", path.display())))
    };
    let index = read_json(&dir.join("index.json"))?;
    let manifests = json_at(&index, "manifests")?
        .as_array()
        .cloned()
        .unwrap_or_default();
    let m = manifests
        .iter()
        .find(|m| {
            m.pointer(&format!("/annotations/{}", REF_NAME.replace('/', "~1")))
                .and_then(|v| v.as_str())
                == Some(reference)
        })
        .or(manifests.first())
        .ok_or_else(|| OciError::Format(format!("{reference}: not in the layout")))?;
    let mdigest = json_at(m, "digest")?.as_str().unwrap_or_default();
    let manifest = read_json(&blobs.join(blob_name(mdigest)?))?;
    let cdigest = json_at(json_at(&manifest, "config")?, "digest")?
        .as_str()
        .unwrap_or_default();
    let config = read_json(&blobs.join(blob_name(cdigest)?))?;
    let diff_ids: Vec<String> = json_at(json_at(&config, "rootfs")?, "diff_ids")?
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|d| d.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let layers = json_at(&manifest, "layers")?
        .as_array()
        .cloned()
        .unwrap_or_default();
    if layers.len() != diff_ids.len() {
        return Err(OciError::Format(format!(
            "{} layers but {} diff ids",
            layers.len(),
            diff_ids.len()
        )));
    }
    let mut out = Vec::new();
    for (n, (l, diff_id)) in layers.iter().zip(diff_ids).enumerate() {
        let digest = json_at(l, "digest")?
            .as_str()
            .unwrap_or_default()
            .to_string();
        let path = blobs.join(blob_name(&digest)?);
        if n >= from {
            // A layer that changed nothing (a candy of only `env:`) is the
            // empty tar. When a layer below was empty too, its stand-in
            // (see the runner's export) took the blob's place and the push
            // skipped it: the bytes are known, so they are put back.
            if digest == EMPTY_TAR && std::fs::metadata(&path).is_ok_and(|m| m.len() == 0) {
                std::fs::write(&path, [0u8; 1024]).map_err(io(path.display()))?;
            }
            let actual = sha256_file(&path).map_err(io(path.display()))?;
            if actual.as_str() != digest {
                return Err(OciError::Digest {
                    name: digest,
                    actual: actual.0,
                });
            }
        }
        out.push(LayerFile {
            path,
            desc: LayerDesc {
                digest,
                diff_id,
                size: json_at(l, "size")?.as_u64().unwrap_or(0),
                media_type: json_at(l, "mediaType")?
                    .as_str()
                    .unwrap_or(LAYER_TAR)
                    .to_string(),
                blob: String::new(),
            },
        });
    }
    let cfg = config
        .get("config")
        .cloned()
        .unwrap_or(serde_json::json!({}));
    Ok((out, cfg))
}

/// An assembled image: its config and manifest bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assembled {
    /// The OCI config.
    pub config: Vec<u8>,
    /// The OCI manifest.
    pub manifest: Vec<u8>,
}

impl Assembled {
    /// The config's digest: the image id runners report.
    pub fn id(&self) -> OciDigest {
        OciDigest::sha256(&self.config)
    }

    /// The manifest's digest.
    pub fn digest(&self) -> OciDigest {
        OciDigest::sha256(&self.manifest)
    }
}

/// Assembles an image from its layer chain and the configuration after
/// the top layer, with `labels` added and `user` (when given) as the final
/// user. Canonical JSON (sorted keys), timestamps at the epoch.
pub fn assemble(
    chain: &[LayerDesc],
    config: &serde_json::Value,
    labels: &BTreeMap<String, String>,
    user: Option<&str>,
    arch: &str,
) -> Result<Assembled, OciError> {
    let mut cfg = match config {
        serde_json::Value::Object(m) => m.clone(),
        _ => serde_json::Map::new(),
    };
    if !labels.is_empty() {
        let mut all = match cfg.get("Labels") {
            Some(serde_json::Value::Object(m)) => m.clone(),
            _ => serde_json::Map::new(),
        };
        for (k, v) in labels {
            all.insert(k.clone(), serde_json::Value::String(v.clone()));
        }
        cfg.insert("Labels".into(), serde_json::Value::Object(all));
    }
    if let Some(u) = user {
        cfg.insert("User".into(), serde_json::Value::String(u.to_string()));
    }
    let epoch = "1970-01-01T00:00:00Z";
    let config = serde_json::json!({
        "architecture": arch,
        "os": "linux",
        "created": epoch,
        "config": serde_json::Value::Object(cfg),
        "rootfs": {
            "type": "layers",
            "diff_ids": chain.iter().map(|l| l.diff_id.clone()).collect::<Vec<_>>(),
        },
        "history": chain.iter().map(|l| serde_json::json!({
            "created": epoch,
            "created_by": format!("charly layer {}", l.diff_id),
        })).collect::<Vec<_>>(),
    });
    let config = canonical_bytes(&config)?;
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": {
            "mediaType": CONFIG_TYPE,
            "digest": OciDigest::sha256(&config).as_str(),
            "size": config.len(),
        },
        "layers": chain.iter().map(|l| serde_json::json!({
            "mediaType": l.media_type,
            "digest": l.digest,
            "size": l.size,
        })).collect::<Vec<_>>(),
    });
    Ok(Assembled {
        manifest: canonical_bytes(&manifest)?,
        config,
    })
}

fn canonical_bytes(v: &serde_json::Value) -> Result<Vec<u8>, OciError> {
    // serde_json's maps are sorted (no preserve_order): canonical as is.
    serde_json::to_vec(v).map_err(|e| OciError::Format(e.to_string()))
}

/// Writes an assembled image into the layout at `dir` under `reference`;
/// `fetch` writes a layer's blob to the path it is given (only for blobs
/// the layout lacks) and says whether it wrote the real content (checked
/// against the digest) or a stand-in (for a reader known to have it).
pub fn write_image(
    dir: &Path,
    reference: &str,
    image: &Assembled,
    chain: &[LayerDesc],
    fetch: &dyn Fn(&LayerDesc, &Path) -> Result<bool, OciError>,
) -> Result<Exported, OciError> {
    let root = charly_files::fsroot::Root::create(dir).map_err(io(dir.display()))?;
    let blobs_rel = Path::new("blobs/sha256");
    root.create_dir_all(blobs_rel)
        .map_err(io(dir.join(blobs_rel).display()))?;
    // Temp files a killed export left are removed first.
    let _ = root.sweep_temps(blobs_rel, false);
    let _ = root.sweep_temps(Path::new(""), false);
    let mut written = 0;
    for l in chain {
        let rel = blobs_rel.join(blob_name(&l.digest)?);
        if root.lstat(&rel).map_err(io(rel.display()))?.is_some() {
            continue;
        }
        let tmp = root.prepare(&rel).map_err(io(rel.display()))?;
        let part = tmp.with_extension(format!("charly-part-{}", std::process::id()));
        let real = fetch(l, &part)?;
        let actual = if real {
            sha256_file(&part).map_err(io(part.display()))?
        } else {
            OciDigest(l.digest.clone())
        };
        if actual.as_str() != l.digest {
            let _ = std::fs::remove_file(&part);
            return Err(OciError::Digest {
                name: l.digest.clone(),
                actual: actual.0,
            });
        }
        std::fs::rename(&part, &tmp).map_err(io(tmp.display()))?;
        written += 1;
    }
    for bytes in [&image.config, &image.manifest] {
        let d = OciDigest::sha256(bytes);
        let rel = blobs_rel.join(blob_name(d.as_str())?);
        if root.lstat(&rel).map_err(io(rel.display()))?.is_none() {
            root.write_atomic(&rel, bytes, 0o644, None, false)
                .map_err(io(rel.display()))?;
            written += 1;
        }
    }
    let manifest: oci_spec::image::Descriptor = serde_json::from_value(serde_json::json!({
        "mediaType": MANIFEST_TYPE,
        "digest": image.digest().as_str(),
        "size": image.manifest.len(),
        "annotations": { REF_NAME: reference },
    }))
    .map_err(|e| OciError::Format(e.to_string()))?;
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
    all.push(manifest);
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
        manifest: image.digest().as_str().to_string(),
        blobs_written: written,
    })
}

/// JSON with sorted keys, written atomically.
fn write_canonical<T: serde::Serialize>(path: &Path, v: &T) -> Result<(), OciError> {
    let text = crate::canon::to_string(v).map_err(|e| OciError::Format(e.to_string()))?;
    crate::generate::write_if_changed(path, text.as_bytes()).map_err(io(path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(marker: &str) -> (LayerDesc, Vec<u8>) {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(marker.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(0);
        h.set_cksum();
        b.append_data(&mut h, "hello.txt", marker.as_bytes())
            .expect("append");
        let bytes = b.into_inner().expect("tar");
        let d = OciDigest::sha256(&bytes).as_str().to_string();
        (
            LayerDesc {
                digest: d.clone(),
                diff_id: d,
                size: bytes.len() as u64,
                media_type: LAYER_TAR.into(),
                blob: String::new(),
            },
            bytes,
        )
    }

    fn image(markers: &[&str], user: Option<&str>) -> (Assembled, Vec<(LayerDesc, Vec<u8>)>) {
        let layers: Vec<(LayerDesc, Vec<u8>)> = markers.iter().map(|m| layer(m)).collect();
        let chain: Vec<LayerDesc> = layers.iter().map(|(d, _)| d.clone()).collect();
        let labels = BTreeMap::from([("ai.opencharly.box".to_string(), "b".to_string())]);
        let a = assemble(
            &chain,
            &serde_json::json!({"Env": ["A=1"], "User": "root"}),
            &labels,
            user,
            "amd64",
        )
        .expect("assemble");
        (a, layers)
    }

    fn write(
        dir: &Path,
        reference: &str,
        a: &Assembled,
        layers: &[(LayerDesc, Vec<u8>)],
    ) -> Exported {
        let chain: Vec<LayerDesc> = layers.iter().map(|(d, _)| d.clone()).collect();
        let fetch = |d: &LayerDesc, p: &Path| -> Result<bool, OciError> {
            let bytes = &layers.iter().find(|(x, _)| x == d).expect("known").1;
            std::fs::write(p, bytes).map_err(io(p.display()))?;
            Ok(true)
        };
        write_image(dir, reference, a, &chain, &fetch).expect("write")
    }

    /// Same chain and facts, same bytes; the user and labels land in the
    /// config; the manifest lists the chain in order.
    #[test]
    fn assembly_is_deterministic_and_complete() {
        let (a1, _) = image(&["a", "b"], Some("1000"));
        let (a2, _) = image(&["a", "b"], Some("1000"));
        assert_eq!(a1, a2);
        let (other, _) = image(&["a", "c"], Some("1000"));
        assert_ne!(a1.digest(), other.digest());
        let cfg: serde_json::Value = serde_json::from_slice(&a1.config).expect("json");
        assert_eq!(cfg["config"]["User"], "1000");
        assert_eq!(cfg["config"]["Env"][0], "A=1");
        assert_eq!(cfg["config"]["Labels"]["ai.opencharly.box"], "b");
        assert_eq!(cfg["rootfs"]["diff_ids"].as_array().map(Vec::len), Some(2));
        assert_eq!(cfg["history"].as_array().map(Vec::len), Some(2));
        let m: serde_json::Value = serde_json::from_slice(&a1.manifest).expect("json");
        assert_eq!(m["config"]["digest"], a1.id().as_str());
        assert_eq!(m["layers"][0]["digest"], layer("a").0.digest);
        let (keep, _) = image(&["a"], None);
        let cfg: serde_json::Value = serde_json::from_slice(&keep.config).expect("json");
        assert_eq!(
            cfg["config"]["User"], "root",
            "no final user: the layer's stays"
        );
    }

    /// Two images share a layout; shared blobs are written once; the
    /// layout reads back with verified layers; index.json is canonical.
    #[test]
    fn layouts_merge_images_and_read_back() {
        let t = tempfile::tempdir().expect("tmp");
        let dir = t.path().join("layout");
        let (a, la) = image(&["base", "a"], None);
        let (b, lb) = image(&["base", "b"], None);
        let ea = write(&dir, "box-a-1.0", &a, &la);
        assert_eq!(ea.blobs_written, 4);
        let eb = write(&dir, "box-b-1.0", &b, &lb);
        assert_eq!(eb.blobs_written, 3, "the base layer is already there");
        assert_eq!(write(&dir, "box-a-1.0", &a, &la).blobs_written, 0);
        let index = ImageIndex::from_file(dir.join("index.json")).expect("index");
        assert_eq!(index.manifests().len(), 2);
        let text = std::fs::read_to_string(dir.join("index.json")).expect("read");
        let again =
            serde_json::to_string(&serde_json::from_str::<serde_json::Value>(&text).expect("json"))
                .expect("json");
        assert_eq!(text, again, "sorted keys");
        let (layers, cfg) = read_layout(&dir, "box-b-1.0", 0).expect("read");
        assert_eq!(
            layers
                .iter()
                .map(|l| l.desc.digest.clone())
                .collect::<Vec<_>>(),
            lb.iter().map(|(d, _)| d.digest.clone()).collect::<Vec<_>>()
        );
        assert_eq!(cfg["Env"][0], "A=1");
    }

    /// A blob whose bytes do not match its digest is refused, on write and on read.
    #[test]
    fn a_corrupt_blob_is_refused() {
        let t = tempfile::tempdir().expect("tmp");
        let dir = t.path().join("layout");
        let (a, la) = image(&["x"], None);
        let chain: Vec<LayerDesc> = la.iter().map(|(d, _)| d.clone()).collect();
        let bad = |_: &LayerDesc, p: &Path| -> Result<bool, OciError> {
            std::fs::write(p, b"not the layer").map_err(io(p.display()))?;
            Ok(true)
        };
        let err = write_image(&dir, "x", &a, &chain, &bad).expect_err("corrupt");
        assert!(matches!(err, OciError::Digest { .. }), "{err}");
        write(&dir, "x", &a, &la);
        let hex = la[0].0.digest.trim_start_matches("sha256:");
        std::fs::write(dir.join("blobs/sha256").join(hex), b"flipped").expect("damage");
        let err = read_layout(&dir, "x", 0).expect_err("corrupt on read");
        assert!(matches!(err, OciError::Digest { .. }), "{err}");
        // Layers below `from` are not read (stand-ins).
        assert!(read_layout(&dir, "x", 1).is_ok());
    }
}
