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

/// Why a runner failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct RunError {
    /// What went wrong, for people.
    pub message: String,
}

impl RunError {
    /// An error with a message.
    pub fn new(m: impl Into<String>) -> Self {
        RunError { message: m.into() }
    }
}

/// A builder stage to run.
#[derive(Clone, Debug)]
pub struct StageRequest {
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

/// A box image to build.
#[derive(Clone, Debug)]
pub struct ImageRequest {
    /// Node id.
    pub node: String,
    /// Key hex.
    pub key: String,
    /// Build context (the project root or a generated context).
    pub context: PathBuf,
    /// Containerfile path relative to the context.
    pub containerfile: String,
    /// The tag to give the image (`localhost/<box>:<version>`).
    pub tag: String,
    /// Build arguments.
    pub build_args: BTreeMap<String, String>,
    /// Labels to add.
    pub labels: BTreeMap<String, String>,
}

/// A built image.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ImageResult {
    /// Image id (`sha256:…` from the runner).
    pub id: String,
    /// The tag it was given.
    pub tag: String,
    /// An OCI archive of the image, when the runner saved one.
    #[serde(skip)]
    pub archive: Option<PathBuf>,
}

/// A local package to build from source.
#[derive(Clone, Debug)]
pub struct LocalPkgRequest {
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
pub struct RootfsRequest {
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

/// Executes command-running nodes.
pub trait Runner: Send + Sync {
    /// A short name recorded as the producer (part of image keys).
    fn name(&self) -> &str;
    /// Runs a builder stage and writes its artifact tar to `req.out`.
    fn build_stage(&self, req: &StageRequest) -> Result<(), RunError>;
    /// Builds a box image.
    fn build_image(&self, req: &ImageRequest) -> Result<ImageResult, RunError>;
    /// Whether an image with this id or tag is present (so a cached image needs no restore).
    fn has_image(&self, reference: &str) -> bool;
    /// Restores an image from an archive written by [`Runner::build_image`], tagging it.
    fn restore_image(&self, archive: &Path, tag: &str) -> Result<String, RunError>;
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
