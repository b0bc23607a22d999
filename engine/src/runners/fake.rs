//! A runner for tests (only with the `testing` feature).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use super::{
    ExportedImage, LayerDesc, LayerFile, LayerRequest, LayerResult, LocalPkgRequest, RootfsRequest,
    RunError, Runner, StageRequest,
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
    /// The image id each name (a loaded image's tags) names.
    ids: Mutex<BTreeMap<String, String>>,
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
        if let Ok(mut i) = self.ids.lock() {
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

/// A deterministic layer: a tar holding one file that names `what`.
fn fake_layer(dir: &Path, what: &str) -> Result<LayerFile, RunError> {
    let err = |e: std::io::Error| RunError::new(format!("fake layer: {e}"));
    std::fs::create_dir_all(dir).map_err(err)?;
    let mut b = tar::Builder::new(Vec::new());
    let body = format!("{what}\n");
    let mut h = tar::Header::new_gnu();
    h.set_size(body.len() as u64);
    h.set_mode(0o644);
    h.set_mtime(0);
    h.set_cksum();
    let name = format!("charly-fake/{}", blake3::hash(what.as_bytes()).to_hex());
    b.append_data(&mut h, &name, body.as_bytes()).map_err(err)?;
    let bytes = b.into_inner().map_err(err)?;
    let digest = crate::oci::OciDigest::sha256(&bytes).as_str().to_string();
    let path = dir.join(digest.trim_start_matches("sha256:"));
    std::fs::write(&path, &bytes).map_err(err)?;
    Ok(LayerFile {
        path,
        desc: LayerDesc {
            diff_id: digest.clone(),
            digest,
            size: bytes.len() as u64,
            media_type: crate::oci::LAYER_TAR.into(),
            blob: String::new(),
        },
    })
}

impl Runner for FakeRunner {
    fn name(&self) -> &str {
        self.name.as_deref().unwrap_or("fake")
    }

    fn build_stage(&self, req: &StageRequest) -> Result<(), RunError> {
        req.log.line(&format!("fake runner: stage {}", req.node));
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
            entries.push(charly_files::artifact::Entry {
                path: dir.clone(),
                kind: charly_files::artifact::Kind::Dir,
                mode: 0o755,
                uid,
                gid,
            });
            entries.push(charly_files::artifact::Entry {
                path: format!("{dir}/{FAKE_ARTIFACT_FILE}"),
                kind: charly_files::artifact::Kind::File(
                    format!("fake artifact of {} ({})\n", req.node, req.key).into_bytes(),
                ),
                mode: 0o644,
                uid,
                gid,
            });
        }
        charly_files::artifact::write_tar(&req.out, entries, Some(req.owner))
            .map_err(|e| RunError::new(format!("writing the fake artifact: {e}")))
    }

    fn build_layer(&self, req: &LayerRequest) -> Result<LayerResult, RunError> {
        req.log.line(&format!("fake runner: layer {}", req.node));
        self.record("layer", &req.node, &req.key)?;
        if let Some(p) = &req.parent
            && !self.has_image(p)
        {
            return Err(RunError::new(format!(
                "{}: parent image {p} is not in the fake runner",
                req.node
            )));
        }
        let layer = fake_layer(&req.out, &format!("{} {}", req.node, req.key))?;
        if let Ok(mut i) = self.images.lock() {
            i.insert(req.tag.clone());
        }
        Ok(LayerResult {
            layer: Some(layer),
            config: serde_json::json!({
                "User": "root",
                "Env": [format!("FAKE_LAYER={}", &req.key[..12.min(req.key.len())])],
            }),
            in_runner: true,
        })
    }

    fn export_layers(&self, reference: &str, out: &Path) -> Result<ExportedImage, RunError> {
        self.record("export", reference, "")?;
        if let Ok(mut i) = self.images.lock() {
            i.insert(reference.to_string());
        }
        Ok(ExportedImage {
            layers: vec![fake_layer(out, reference)?],
            config: serde_json::json!({"Env": ["PATH=/usr/bin:/bin"]}),
        })
    }

    fn rename_image(&self, from: &str, to: &str) -> Result<(), RunError> {
        if let Ok(mut i) = self.images.lock() {
            if !i.remove(from) {
                return Err(RunError::new(format!("no image {from} to rename")));
            }
            i.insert(to.to_string());
        }
        Ok(())
    }

    fn load_layout(
        &self,
        dir: &Path,
        reference: &str,
        tags: &[String],
    ) -> Result<String, RunError> {
        let tag = tags.first().map(String::as_str).unwrap_or_default();
        self.record("load", tag, "")?;
        let index = std::fs::read_to_string(dir.join("index.json"))
            .map_err(|e| RunError::new(format!("{}: {e}", dir.display())))?;
        if !index.contains(reference) {
            return Err(RunError::new(format!("{reference} is not in the layout")));
        }
        let id = format!("sha256:{}", blake3::hash(index.as_bytes()).to_hex());
        if let Ok(mut i) = self.images.lock() {
            i.extend(tags.iter().cloned());
            i.insert(id.clone());
        }
        if let Ok(mut i) = self.ids.lock() {
            for t in tags {
                i.insert(t.clone(), id.clone());
            }
        }
        Ok(id)
    }

    fn image_id(&self, reference: &str) -> Option<String> {
        if let Some(id) = self.ids.lock().ok()?.get(reference) {
            return Some(id.clone());
        }
        self.has_image(reference).then(|| reference.to_string())
    }

    fn tag_image(&self, image: &str, tags: &[String]) -> Result<(), RunError> {
        let id = self
            .image_id(image)
            .ok_or_else(|| RunError::new(format!("no image {image} to tag")))?;
        if let Ok(mut i) = self.images.lock() {
            i.extend(tags.iter().cloned());
        }
        if let Ok(mut i) = self.ids.lock() {
            for t in tags {
                i.insert(t.clone(), id.clone());
            }
        }
        Ok(())
    }

    fn has_image(&self, reference: &str) -> bool {
        self.images
            .lock()
            .map(|i| i.contains(reference))
            .unwrap_or(false)
    }

    fn build_local_pkg(&self, req: &LocalPkgRequest) -> Result<(), RunError> {
        req.log
            .line(&format!("fake runner: local-pkg {}", req.node));
        self.record("local-pkg", &req.node, &req.key)?;
        write_fake(&req.out.join(format!("fake.{}", req.format)), &req.key)
    }

    fn build_rootfs(&self, req: &RootfsRequest) -> Result<(), RunError> {
        req.log.line(&format!("fake runner: rootfs {}", req.node));
        self.record("rootfs", &req.node, &req.key)?;
        write_fake(&req.out, &req.key)
    }
}
