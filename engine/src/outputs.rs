//! What a node's record holds: the names of its outputs and its typed
//! `meta`. One place for both, since a record written by one charly is read
//! by another (the store is shared between processes, remote caches between
//! machines).
//!
//! | node | outputs | meta |
//! |---|---|---|
//! | fragment | [`TEXT`], [`file()`]`(path)` per staged file | — |
//! | containerfile | [`file()`]`(path)` per file of the build directory | [`ContainerfileMeta`] |
//! | builder stage | [`ARTIFACT_TAR`] | — |
//! | local package | [`pkg`]`(file name)` per package | — |
//! | root filesystem | [`ROOTFS_TAR`] | — |
//! | layer | [`LAYER`] (when the layer changed files) | [`LayerMeta`] |
//! | external base | [`chain_layer`]`(n)` per layer | [`LayerMeta`] |
//! | image | [`CONFIG`], [`MANIFEST`], [`chain_layer`]`(n)` per layer (blobs the layers stored) | [`ImageMeta`] |
//!
//! Older records of images hold one [`ARCHIVE`] instead.

use serde::{Deserialize, Serialize};

/// A fragment's Containerfile text.
pub const TEXT: &str = "text";
/// A builder stage's artifact tar.
pub const ARTIFACT_TAR: &str = "artifact.tar";
/// A bootstrapped root filesystem.
pub const ROOTFS_TAR: &str = "rootfs.tar.gz";
/// An image archive the runner can restore.
pub const ARCHIVE: &str = "archive";

/// A layer's filesystem diff (an OCI layer blob).
pub const LAYER: &str = "layer";
/// An image's OCI config.
pub const CONFIG: &str = "config";
/// An image's OCI manifest.
pub const MANIFEST: &str = "manifest";

const FILE: &str = "file:";

/// The output name of the `n`th layer of an image or base (from the bottom).
pub fn chain_layer(n: usize) -> String {
    format!("layer/{n:03}")
}
const PKG: &str = "pkg:";

/// The output name of a staged or build-directory file.
pub fn file(path: &str) -> String {
    format!("{FILE}{path}")
}

/// The path of a file output, or `None` for other outputs.
pub fn file_path(name: &str) -> Option<&str> {
    name.strip_prefix(FILE)
}

/// The output name of a built local package.
pub fn pkg(file_name: &str) -> String {
    format!("{PKG}{file_name}")
}

/// The package file name of a package output, or `None` for other outputs.
pub fn pkg_name(name: &str) -> Option<&str> {
    name.strip_prefix(PKG)
}

/// `meta` of a build-directory (containerfile) record.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerfileMeta {
    /// The build directory, relative to the output root (`.build/<box>`).
    #[serde(default)]
    pub dir: String,
    /// Candy directories outside the project, copied in as layers.
    #[serde(default)]
    pub layers: Vec<String>,
}

/// `meta` of an image record.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageMeta {
    /// The image id the runner reported.
    #[serde(default)]
    pub id: String,
    /// The tag it was given.
    #[serde(default)]
    pub tag: String,
    /// What it was built on (an image reference, or `builder:<type>`).
    #[serde(default)]
    pub base: String,
    /// The manifest's digest (assembled images).
    #[serde(default)]
    pub manifest: String,
    /// Its layers and configuration (assembled images).
    #[serde(default)]
    pub layers: LayerMeta,
}

/// One layer of an image, as its manifest lists it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerDesc {
    /// The blob's OCI digest (`sha256:…` of the bytes as stored).
    pub digest: String,
    /// The digest of the uncompressed tar (the config's `diff_id`).
    pub diff_id: String,
    /// Size of the blob.
    pub size: u64,
    /// Media type (`application/vnd.oci.image.layer.v1.tar+gzip`).
    pub media_type: String,
    /// The store's digest of the same bytes (blake3 hex).
    pub blob: String,
}

/// `meta` of a layer or external base record: the whole chain up to it
/// and the image configuration after it, so one record is enough to
/// assemble (or load) the image it tops.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerMeta {
    /// Every layer from the bottom, this one last.
    #[serde(default)]
    pub chain: Vec<LayerDesc>,
    /// The image configuration after this layer (OCI `config` object:
    /// Env, User, WorkingDir, ExposedPorts, Labels, Cmd, Entrypoint…).
    #[serde(default)]
    pub config: serde_json::Value,
    /// The runner's tag for the image this layer tops.
    #[serde(default)]
    pub tag: String,
}

/// Reads a typed `meta`; a record without it (or with an older shape)
/// gives the defaults.
pub fn read_meta<T: for<'de> Deserialize<'de> + Default>(meta: &serde_json::Value) -> T {
    serde_json::from_value(meta.clone()).unwrap_or_default()
}

/// A typed `meta` as the record stores it.
pub fn write_meta<T: Serialize>(meta: &T) -> serde_json::Value {
    serde_json::to_value(meta).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        assert_eq!(file("etc/x"), "file:etc/x");
        assert_eq!(file_path(&file("etc/x")), Some("etc/x"));
        assert_eq!(file_path(TEXT), None);
        assert_eq!(pkg("a.deb"), "pkg:a.deb");
        assert_eq!(pkg_name("pkg:a.deb"), Some("a.deb"));
        assert_eq!(pkg_name(ARCHIVE), None);
    }

    #[test]
    fn meta_reads_what_older_records_wrote() {
        // As exec wrote them with json! before the types existed.
        let cf = serde_json::json!({"dir": ".build/hello", "layers": [".build/_layers/x"]});
        let m: ContainerfileMeta = read_meta(&cf);
        assert_eq!(m.dir, ".build/hello");
        assert_eq!(m.layers, [".build/_layers/x"]);
        let img = serde_json::json!({"id": "abc", "tag": "localhost/hello:latest", "base": "builder:pacstrap"});
        let m: ImageMeta = read_meta(&img);
        assert_eq!(
            (m.id.as_str(), m.base.as_str()),
            ("abc", "builder:pacstrap")
        );
        // Older records gain the assembled image's (empty) fields only.
        let mut written = write_meta(&m);
        for k in ["manifest", "layers"] {
            if let Some(o) = written.as_object_mut() {
                o.remove(k);
            }
        }
        assert_eq!(written, img);
        let none: ImageMeta = read_meta(&serde_json::Value::Null);
        assert_eq!(none, ImageMeta::default());
    }
}
