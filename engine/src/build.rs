//! `box build` behind two calls, the front door the CLI uses: run a box
//! graph ([`Engine::build`]), then name each box's image in the runner,
//! push one, export them to an OCI layout and describe what was made
//! ([`Engine::deliver`], into the [`BuildReport`]). The CLI
//! opens the project, store, runner and remote, shows progress and prints
//! the report; everything between is here.

use crate::api::{Engine, EngineError, NamedImage, Status};
use crate::graph::Graph;
use crate::key::NodeKind;
use crate::sched::{Observer, Summary};
use std::collections::HashMap;
use std::path::PathBuf;

/// What a build is asked for besides its graph.
#[derive(Clone, Debug, Default)]
pub struct BuildRequest {
    /// The boxes the graph builds, in the order they are reported.
    pub boxes: Vec<String>,
    /// Nodes run at once.
    pub jobs: usize,
    /// Only find what would run.
    pub dry_run: bool,
    /// Load images the runner lacks (`--load`).
    pub load: bool,
    /// Push the (one) box's image to `[oci://]HOST[:PORT]/REPO[:TAG]`.
    pub push: Option<String>,
    /// Write every box's image into this OCI layout directory.
    pub export_to: Option<PathBuf>,
    /// Describe what was made ([`BuildReport::metadata`]).
    pub metadata: bool,
}

/// A box's image pushed to a registry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pushed {
    /// The box.
    pub box_name: String,
    /// The repository, with its scheme as given (`oci://host/repo`).
    pub url: String,
    /// The tag.
    pub tag: String,
    /// Where it is: `host/repo:tag@sha256:…`.
    pub at: String,
    /// Bytes sent.
    pub sent: u64,
}

/// What a build did and made.
#[derive(Debug)]
pub struct BuildReport {
    /// Every node's outcome; when it is not [`Summary::ok`] (or the run
    /// was a dry run), [`Engine::deliver`] leaves the rest empty.
    pub summary: Summary,
    /// The boxes whose image is in the runner now.
    pub in_runner: Vec<NamedImage>,
    /// The image pushed (`BuildRequest::push`).
    pub pushed: Option<Pushed>,
    /// The images written to the OCI layout (`BuildRequest::export_to`),
    /// one per box, in order.
    pub exported: Vec<crate::oci::Exported>,
    /// Per box: its image reference, image key, config and manifest
    /// digests, whether podman has it and where it was pushed
    /// (`BuildRequest::metadata`), as `{"boxes": {…}}`.
    pub metadata: Option<serde_json::Value>,
}

impl Engine<'_> {
    /// Runs `graph` (the [`crate::graph::Goal::Build`] graph of
    /// `req.boxes`). What `req` asks after the run is [`Engine::deliver`]'s.
    pub fn build(
        &self,
        graph: &Graph,
        req: &BuildRequest,
        obs: &dyn Observer,
    ) -> Result<BuildReport, EngineError> {
        // Asked wrongly: said before anything runs.
        if req.push.is_some() && !req.dry_run && req.boxes.len() != 1 {
            return Err(EngineError::Request(
                "--push writes one box's image; name exactly one box".into(),
            ));
        }
        Ok(BuildReport {
            summary: self.run(graph, &self.project.root, req.jobs, req.dry_run, obs),
            in_runner: Vec::new(),
            pushed: None,
            exported: Vec::new(),
            metadata: None,
        })
    }

    /// After a [`Engine::build`] that ran every node (not a dry run, no
    /// failure): names each box's image in the runner, then pushes,
    /// describes and exports as `req` asks, into `report`.
    pub fn deliver(
        &self,
        graph: &Graph,
        req: &BuildRequest,
        report: &mut BuildReport,
    ) -> Result<(), EngineError> {
        if req.dry_run || !report.summary.ok() {
            return Ok(());
        }
        // Each box's reference names the image of the keys just reported,
        // whether they ran or came from a cache (issue 44).
        report.in_runner = self.name_images(graph, &req.boxes, req.load)?;
        if let (Some(reference), [name]) = (&req.push, req.boxes.as_slice()) {
            report.pushed = Some(self.push_box(graph, name, reference)?);
        }
        if req.metadata {
            report.metadata = Some(self.metadata(graph, &req.boxes, report)?);
        }
        if let Some(dir) = &req.export_to {
            for name in &req.boxes {
                let reference = format!("{name}-{}", self.version(name));
                report
                    .exported
                    .push(self.export_oci(graph, name, dir, &reference)?);
            }
        }
        Ok(())
    }

    /// Why each node that is not cached would run (`--explain`, asked
    /// before the run: afterwards every node is cached), by node id.
    pub fn why_each_runs(
        &self,
        graph: &Graph,
    ) -> Result<HashMap<String, Vec<String>>, EngineError> {
        let mut lines = HashMap::new();
        for n in graph.g.node_weights() {
            if n.kind == NodeKind::Source {
                continue;
            }
            let e = self.explain(graph, &n.id)?;
            if e.status != Status::Cached {
                lines.insert(n.id.clone(), e.lines());
            }
        }
        Ok(lines)
    }

    /// A box's version (the push tag and export name when none is given).
    fn version(&self, name: &str) -> String {
        self.resolution
            .get(name)
            .map(|b| b.version.clone())
            .unwrap_or_default()
    }

    /// Pushes box `name`'s image to the registry `reference` names.
    fn push_box(&self, graph: &Graph, name: &str, reference: &str) -> Result<Pushed, EngineError> {
        let (url, tag) = split_push_ref(reference, &self.version(name));
        let remote = charly_cache::Remote::open(charly_cache::RemoteConfig::new(url.clone()))?;
        let sent = self.push_image(graph, name, &remote, &tag)?;
        // The registry serves the manifest charly assembled, byte for byte.
        let (_, digest) = self.image_digests(graph, name)?;
        let at = format!("{}:{tag}@{digest}", url.trim_start_matches("oci://"));
        Ok(Pushed {
            box_name: name.to_string(),
            url,
            tag,
            at,
            sent,
        })
    }

    /// What the build made, per box (see [`BuildReport::metadata`]).
    fn metadata(
        &self,
        graph: &Graph,
        names: &[String],
        report: &BuildReport,
    ) -> Result<serde_json::Value, EngineError> {
        let mut boxes = serde_json::Map::new();
        for name in names {
            let (config, manifest) = self.image_digests(graph, name)?;
            let key = graph
                .node(&format!("image:{name}"))
                .map(|n| n.key.to_hex())
                .unwrap_or_default();
            let pushed = report
                .pushed
                .as_ref()
                .filter(|p| p.box_name == *name)
                .map(|p| p.at.clone());
            boxes.insert(
                name.clone(),
                serde_json::json!({
                    "image": charly_rules::naming::box_image_ref(self.resolution, name),
                    "image_key": key,
                    "config_digest": config,
                    "manifest_digest": manifest,
                    "in_podman": report.in_runner.iter().any(|i| i.box_name == *name),
                    "pushed": pushed,
                }),
            );
        }
        Ok(serde_json::json!({ "boxes": boxes }))
    }
}

/// `[oci://]HOST[:PORT]/REPO[:TAG]` → (`HOST[:PORT]/REPO` with its
/// scheme, TAG or `default_tag`).
pub fn split_push_ref(reference: &str, default_tag: &str) -> (String, String) {
    let slash = reference.rfind('/').unwrap_or(0);
    match reference[slash..].rfind(':') {
        Some(i) => (
            reference[..slash + i].to_string(),
            reference[slash + i + 1..].to_string(),
        ),
        None => (reference.to_string(), default_tag.to_string()),
    }
}
