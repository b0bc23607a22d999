//! A runner for tests (only with the `testing` feature).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use super::{
    ImageRequest, ImageResult, LocalPkgRequest, RootfsRequest, RunError, Runner, StageRequest,
};

/// One call the fake runner received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invocation {
    /// `stage`, `image`, `local-pkg`, `rootfs`, `restore`.
    pub what: String,
    /// Node id.
    pub node: String,
    /// Key hex.
    pub key: String,
}

/// A runner for tests: deterministic outputs, recorded calls, injectable
/// failures and delays. It can also stand in for another runner's *name*
/// when only keys are computed (`graph`, `explain`).
#[derive(Default)]
pub struct FakeRunner {
    name: Option<String>,
    calls: Mutex<Vec<Invocation>>,
    /// Node ids that fail.
    pub fail: BTreeSet<String>,
    /// Per-node delays.
    pub delay: BTreeMap<String, Duration>,
    /// Delay for every call without its own.
    pub default_delay: Option<Duration>,
    images: Mutex<BTreeSet<String>>,
    /// A file every call is appended to (`what node`), for tests that drive
    /// the binary and must see whether the runner was reached.
    pub log: Option<PathBuf>,
}

impl FakeRunner {
    /// A fake runner.
    pub fn new() -> Self {
        Self::default()
    }

    /// A fake configured from the environment, for tests that drive the
    /// `charly` binary: `CHARLY_FAKE_DELAY_MS` (every call sleeps that long)
    /// `CHARLY_FAKE_FAIL` (comma-separated node ids that fail) and
    /// `CHARLY_FAKE_LOG` (a file each call is appended to as `what node`).
    pub fn from_env() -> Self {
        let mut f = FakeRunner {
            log: std::env::var_os("CHARLY_FAKE_LOG").map(PathBuf::from),
            ..Self::default()
        };
        if let Some(ms) = std::env::var("CHARLY_FAKE_DELAY_MS")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            f.default_delay = Some(Duration::from_millis(ms));
        }
        if let Ok(list) = std::env::var("CHARLY_FAKE_FAIL") {
            f.fail = list
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect();
        }
        f
    }

    /// A fake that reports another runner's name (for computing that
    /// runner's keys without running anything).
    pub fn named(name: &str) -> Self {
        FakeRunner {
            name: Some(name.to_string()),
            ..Self::default()
        }
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Invocation> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }

    /// Forgets all images (like `podman rmi -a`).
    pub fn remove_all_images(&self) {
        if let Ok(mut i) = self.images.lock() {
            i.clear();
        }
    }

    fn record(&self, what: &str, node: &str, key: &str) -> Result<(), RunError> {
        if let Ok(mut c) = self.calls.lock() {
            c.push(Invocation {
                what: what.into(),
                node: node.into(),
                key: key.into(),
            });
        }
        if let Some(log) = &self.log {
            use std::io::Write;
            let line = format!("{what} {node}\n");
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .and_then(|mut f| f.write_all(line.as_bytes()))
                .map_err(|e| RunError::new(format!("fake runner log {}: {e}", log.display())))?;
        }
        if let Some(d) = self.delay.get(node).or(self.default_delay.as_ref()) {
            std::thread::sleep(*d);
        }
        if self.fail.contains(node) {
            return Err(RunError::new(format!("injected failure of {node}")));
        }
        Ok(())
    }
}

/// The file the fake runner puts in every exported directory of a stage.
pub const FAKE_ARTIFACT_FILE: &str = "FAKE-ARTIFACT";

fn write_fake(out: &Path, body: &str) -> Result<(), RunError> {
    if let Some(p) = out.parent() {
        std::fs::create_dir_all(p).map_err(|e| RunError::new(e.to_string()))?;
    }
    std::fs::write(out, body).map_err(|e| RunError::new(e.to_string()))
}

impl Runner for FakeRunner {
    fn name(&self) -> &str {
        self.name.as_deref().unwrap_or("fake")
    }

    fn build_stage(&self, req: &StageRequest) -> Result<(), RunError> {
        self.record("stage", &req.node, &req.key)?;
        // A real artifact tar, as the podman runner writes it: each export
        // path as a directory holding one deterministic file, owned by the
        // stage's user, so walkers can extract it like a real one.
        let (uid, gid) = (u64::from(req.owner.0), u64::from(req.owner.1));
        let mut entries = Vec::new();
        for src in &req.export {
            let dir = src.trim_matches('/').to_string();
            if dir.is_empty() {
                continue;
            }
            entries.push(crate::artifact::Entry {
                path: dir.clone(),
                kind: crate::artifact::Kind::Dir,
                mode: 0o755,
                uid,
                gid,
            });
            entries.push(crate::artifact::Entry {
                path: format!("{dir}/{FAKE_ARTIFACT_FILE}"),
                kind: crate::artifact::Kind::File(
                    format!("fake artifact of {} ({})\n", req.node, req.key).into_bytes(),
                ),
                mode: 0o644,
                uid,
                gid,
            });
        }
        crate::artifact::write_tar(&req.out, entries, Some(req.owner))
            .map_err(|e| RunError::new(format!("writing the fake artifact: {e}")))
    }

    fn build_image(&self, req: &ImageRequest) -> Result<ImageResult, RunError> {
        self.record("image", &req.node, &req.key)?;
        let id = format!("sha256:{}", blake3::hash(req.key.as_bytes()).to_hex());
        if let Ok(mut i) = self.images.lock() {
            i.insert(id.clone());
            i.insert(req.tag.clone());
        }
        // A stand-in archive, so restoring from the store is exercised too.
        let dir = tempfile::Builder::new()
            .prefix("charly-fake-image-")
            .tempdir()
            .map_err(|e| RunError::new(e.to_string()))?
            .keep();
        let archive = dir.join("image.tar");
        write_fake(&archive, &format!("{id} {}\n", req.tag))?;
        Ok(ImageResult {
            id,
            tag: req.tag.clone(),
            archive: Some(archive),
        })
    }

    fn has_image(&self, reference: &str) -> bool {
        self.images
            .lock()
            .map(|i| i.contains(reference))
            .unwrap_or(false)
    }

    fn restore_image(&self, archive: &Path, tag: &str) -> Result<String, RunError> {
        self.record("restore", tag, "")?;
        let text = std::fs::read_to_string(archive).map_err(|e| RunError::new(e.to_string()))?;
        let id = text
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string();
        if let Ok(mut i) = self.images.lock() {
            i.insert(tag.to_string());
            i.insert(id);
        }
        Ok(tag.to_string())
    }

    fn build_local_pkg(&self, req: &LocalPkgRequest) -> Result<(), RunError> {
        self.record("local-pkg", &req.node, &req.key)?;
        write_fake(&req.out.join(format!("fake.{}", req.format)), &req.key)
    }

    fn build_rootfs(&self, req: &RootfsRequest) -> Result<(), RunError> {
        self.record("rootfs", &req.node, &req.key)?;
        write_fake(&req.out, &req.key)
    }
}
