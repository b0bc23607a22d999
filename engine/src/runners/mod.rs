//! Runners: what executes the nodes that run commands.
//!
//! The [`Runner`] trait has one method per command-running node kind. The
//! real one is podman ([`podman`]); [`remote`] sends command nodes to a
//! REAPI engine and leaves images to a local runner. A fake for tests
//! (`fake::FakeRunner`: deterministic outputs, recorded calls, injectable
//! failures and delays) exists only with the `testing` feature, never in a
//! release binary. The cache layer sits above any runner: a node whose key
//! has a record never reaches it.

#[cfg(any(test, feature = "testing"))]
pub mod fake;
pub mod podman;
pub mod remote;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Why a runner failed: the message, then the command's last lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunError {
    /// What went wrong, for people.
    pub message: String,
    /// The build instruction that failed: `(stage, step)`, both 1-based as
    /// the builder counts them ([`charly_rules::origin::instruction_offset`]).
    pub step: Option<(usize, usize)>,
    /// The failing command's own last lines (the builder's chatter removed).
    pub output: Vec<String>,
}

impl RunError {
    /// An error with a message.
    pub fn new(m: impl Into<String>) -> Self {
        RunError {
            message: m.into(),
            step: None,
            output: Vec::new(),
        }
    }
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)?;
        for l in &self.output {
            write!(f, "\n  | {l}")?;
        }
        if let Some(h) = hint(&self.output) {
            write!(f, "\n  hint: {h}")?;
        }
        Ok(())
    }
}

/// What to do about a failure whose cause the command's output names,
/// when the fix is known.
fn hint(output: &[String]) -> Option<&'static str> {
    let says = |needles: &[&str]| output.iter().any(|l| needles.iter().any(|n| l.contains(n)));
    if says(&[
        "SSL certificate problem",
        "certificate verify failed",
        "self-signed certificate in certificate chain",
        "self signed certificate in certificate chain",
        "unable to get local issuer certificate",
        "UNABLE_TO_GET_ISSUER_CERT_LOCALLY",
        "SELF_SIGNED_CERT_IN_CHAIN",
        "x509: certificate signed by unknown authority",
    ]) {
        return Some(
            "the step does not trust the HTTPS certificate it was shown (an intercepting \
             proxy?): `--ca-bundle /etc/ssl/certs/ca-certificates.crt` (or `ca_bundle:` in \
             .charly/settings.yml) gives build steps this machine's CA bundle",
        );
    }
    None
}

impl std::error::Error for RunError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_failure_names_the_ca_bundle_flag() {
        let mut e = RunError::new("podman build failed at step 3 (`RUN curl …`): exit status 60");
        e.output = vec![
            "curl: (60) SSL certificate problem: self-signed certificate in certificate chain"
                .into(),
        ];
        assert!(e.to_string().contains("hint: ") && e.to_string().contains("--ca-bundle"));
        e.output = vec!["npm ERR! code SELF_SIGNED_CERT_IN_CHAIN".into()];
        assert!(e.to_string().contains("--ca-bundle"));
        e.output = vec!["E: Unable to locate package jqq".into()];
        assert!(!e.to_string().contains("hint"));
    }
}

/// Where a runner sends the output of the command it runs for a node, line
/// by line, as it comes (progress shows it; nothing else depends on it).
#[derive(Clone, Copy, Default)]
pub struct LogSink<'a>(Option<&'a (dyn Fn(&str) + Sync)>);

impl<'a> LogSink<'a> {
    /// A sink calling `f` with each line.
    pub fn new(f: &'a (dyn Fn(&str) + Sync)) -> Self {
        LogSink(Some(f))
    }

    /// Sends one line.
    pub fn line(&self, l: &str) {
        if let Some(f) = self.0 {
            f(l)
        }
    }
}

impl std::fmt::Debug for LogSink<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "LogSink(on)"
        } else {
            "LogSink(off)"
        })
    }
}

/// A builder stage to run.
#[derive(Clone, Debug)]
pub struct StageRequest<'a> {
    /// Where the command's output goes as it runs.
    pub log: LogSink<'a>,
    /// Node id.
    pub node: String,
    /// Key hex (tag images and containers with it).
    pub key: String,
    /// The stage's Containerfile text (from the builder's stage template).
    pub containerfile: String,
    /// Build context directory.
    pub context: PathBuf,
    /// The builder box image to run in.
    pub builder_image: String,
    /// Paths inside the stage to export (`copy_artifact` sources).
    pub export: Vec<String>,
    /// uid:gid the exported files belong to.
    pub owner: (u32, u32),
    /// Where to write the artifact tar.
    pub out: PathBuf,
}

/// A local package to build from source.
#[derive(Clone, Debug)]
pub struct LocalPkgRequest<'a> {
    /// Where the command's output goes as it runs.
    pub log: LogSink<'a>,
    /// Node id.
    pub node: String,
    /// Key hex.
    pub key: String,
    /// Package format (deb, rpm, pac).
    pub format: String,
    /// Source directory.
    pub source: PathBuf,
    /// Image to build in.
    pub image: String,
    /// The build script (rendered `build_template`: `.SrcDir` `/src`, `.PkgDest` `/out`).
    pub script: String,
    /// Glob of produced packages.
    pub glob: String,
    /// Where to put the packages.
    pub out: PathBuf,
}

/// A root filesystem to bootstrap.
#[derive(Clone, Debug)]
pub struct RootfsRequest<'a> {
    /// Where the command's output goes as it runs.
    pub log: LogSink<'a>,
    /// Node id.
    pub node: String,
    /// Key hex.
    pub key: String,
    /// `debootstrap`, `pacstrap`.
    pub builder: String,
    /// Suite/release (`bookworm`).
    pub suite: String,
    /// Mirror URL.
    pub mirror: String,
    /// Variant (`minbase`).
    pub variant: String,
    /// Extra packages.
    pub include: Vec<String>,
    /// Where to write the rootfs tar.
    pub out: PathBuf,
}

/// One layer to build: a Containerfile whose `FROM ${PARENT}` is `parent`.
#[derive(Clone, Debug)]
pub struct LayerRequest<'a> {
    /// Where the command's output goes as it runs.
    pub log: LogSink<'a>,
    /// Node id.
    pub node: String,
    /// Key hex.
    pub key: String,
    /// Build context (everything the text reads, and nothing else).
    pub context: PathBuf,
    /// The Containerfile (outside the context).
    pub containerfile: PathBuf,
    /// The parent image as the runner knows it; `None`: scratch, or not
    /// loaded because the runner builds layers from blobs
    /// ([`Runner::layers_from_blobs`]; then `load_parent` loads it).
    pub parent: Option<String>,
    /// The layers the parent already has (only what is new is exported).
    pub parent_layers: Vec<LayerDesc>,
    /// For a runner that builds layers from blobs: the parent's layer
    /// blobs as files, bottom first.
    pub parent_blobs: Vec<PathBuf>,
    /// The parent's configuration (the OCI config's `config` object).
    pub parent_config: serde_json::Value,
    /// Loads the parent into the runner when it was not (a layer that falls
    /// back to a local build) and gives its tag.
    pub load_parent: ParentLoader<'a>,
    /// The tag to give the result in the runner.
    pub tag: String,
    /// Build arguments (besides `PARENT`).
    pub build_args: BTreeMap<String, String>,
    /// A directory to write the new layer blob into.
    pub out: PathBuf,
}

/// Loads a layer's parent image into the runner on demand.
#[derive(Clone, Copy, Default)]
pub struct ParentLoader<'a>(Option<&'a (dyn Fn() -> Result<Option<String>, RunError> + Sync)>);

impl<'a> ParentLoader<'a> {
    /// A loader calling `f`.
    pub fn new(f: &'a (dyn Fn() -> Result<Option<String>, RunError> + Sync)) -> Self {
        ParentLoader(Some(f))
    }

    /// The parent's tag in the runner: `have` when it is loaded already,
    /// else what loading it gives.
    pub fn tag(&self, have: &Option<String>) -> Result<Option<String>, RunError> {
        match (have, self.0) {
            (Some(t), _) => Ok(Some(t.clone())),
            (None, Some(f)) => f(),
            (None, None) => Ok(None),
        }
    }
}

impl std::fmt::Debug for ParentLoader<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "ParentLoader(on)"
        } else {
            "ParentLoader(off)"
        })
    }
}

/// A layer blob on disk (defined with the OCI code that reads it).
pub use crate::oci::LayerFile;

/// What a layer build made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerResult {
    /// The new filesystem diff (`None`: the layer changed only configuration).
    pub layer: Option<LayerFile>,
    /// The image configuration after it (the OCI config's `config` object).
    pub config: serde_json::Value,
    /// Whether the runner holds the built image under the request's tag
    /// (a layer built elsewhere exists only as its blob).
    pub in_runner: bool,
}

/// An image taken out of the runner, layer by layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportedImage {
    /// Its layers, bottom first.
    pub layers: Vec<LayerFile>,
    /// Its configuration (the OCI config's `config` object).
    pub config: serde_json::Value,
}

pub use crate::outputs::LayerDesc;

/// Where a `--ca-bundle` appears inside build containers and actions (over
/// the image's own bundle).
pub const CA_TARGET: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The variables that point a command at [`CA_TARGET`] (npm/node, OpenSSL
/// and curl, Python requests, pip, npm's own setting).
pub const CA_ENV: &[&str] = &[
    "NODE_EXTRA_CA_CERTS",
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "PIP_CERT",
    "CURL_CA_BUNDLE",
    "npm_config_cafile",
];

/// Executes command-running nodes.
pub trait Runner: Send + Sync {
    /// A short name recorded as the producer (part of image keys).
    fn name(&self) -> &str;
    /// Runs a builder stage and writes its artifact tar to `req.out`.
    fn build_stage(&self, req: &StageRequest) -> Result<(), RunError>;
    /// Whether an image with this id or tag is present (so a cached image needs no restore).
    fn has_image(&self, reference: &str) -> bool;
    /// Builds one layer on its parent and exports what it added.
    fn build_layer(&self, req: &LayerRequest) -> Result<LayerResult, RunError>;
    /// Whether layers are built from the parent's blobs
    /// ([`LayerRequest::parent_blobs`]) rather than an image the runner
    /// holds: the parent is then not loaded first.
    fn layers_from_blobs(&self) -> bool {
        false
    }
    /// Takes an image the runner has (an external base) out as layer blobs
    /// written into `out`.
    fn export_layers(&self, reference: &str, out: &Path) -> Result<ExportedImage, RunError>;
    /// Loads the image `reference` of the OCI layout `dir` and gives it
    /// `tags`; returns the image id.
    fn load_layout(&self, dir: &Path, reference: &str, tags: &[String])
    -> Result<String, RunError>;
    /// Renames an image (`from` is dropped, `to` added).
    fn rename_image(&self, from: &str, to: &str) -> Result<(), RunError>;
    /// The id of the image `reference` (an id or a name) names, if the
    /// runner has it and can tell (runners that cannot say `None`).
    fn image_id(&self, reference: &str) -> Option<String> {
        let _ = reference;
        None
    }
    /// Gives the image `image` (an id or a name) the names `tags`, moving
    /// each from whatever image had it.
    fn tag_image(&self, image: &str, tags: &[String]) -> Result<(), RunError> {
        let _ = tags;
        Err(RunError::new(format!(
            "the {} runner cannot name image {image}",
            self.name()
        )))
    }
    /// Builds local packages into `req.out`.
    fn build_local_pkg(&self, req: &LocalPkgRequest) -> Result<(), RunError>;
    /// Bootstraps a root filesystem tar into `req.out`.
    fn build_rootfs(&self, req: &RootfsRequest) -> Result<(), RunError>;
    /// The configuration of a local image (environment, user, working
    /// directory) and, when `rootfs` is given, its root filesystem written
    /// there as a tar: what running a builder stage elsewhere needs
    /// (remote execution). Runners without images refuse.
    fn export_image(&self, image: &str, rootfs: Option<&Path>) -> Result<ImageConfig, RunError> {
        let _ = rootfs;
        Err(RunError::new(format!(
            "the {} runner cannot export image {image}",
            self.name()
        )))
    }
}

/// What a container started from an image inherits from it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageConfig {
    /// `KEY=VALUE` entries.
    pub env: Vec<String>,
    /// `USER` (empty: root).
    pub user: String,
    /// `WORKDIR` (empty: `/`).
    pub workdir: String,
}
