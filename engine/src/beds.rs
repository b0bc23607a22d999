//! `check`'s beds after the build, the front door the CLI uses: each box's
//! bed (its image, its checks, its init), the images of the beds that
//! start a container made present in podman, the beds run in parallel
//! ([`Engine::run_beds`]). What a bed is and does: [`crate::check`].

use crate::api::{Engine, EngineError};
use crate::check::{Bed, BedHost, BedReport, bed_without_container, run_bed};
use crate::graph::Graph;
use crate::id::NodeId;
use charly_rules::check::Check;
use charly_rules::load::Project;
use charly_rules::resolve::ResolvedBox;
use rayon::prelude::*;

/// How beds run.
#[derive(Clone, Copy, Debug)]
pub struct BedOptions {
    /// Beds run at once.
    pub jobs: usize,
    /// Keep each bed's container.
    pub keep: bool,
    /// Run beds whose last all-pass result still holds.
    pub force: bool,
}

impl Engine<'_> {
    /// Runs the bed of each box in `boxes` (with its checks and their
    /// owners) on `host`, after `graph` (their build) succeeded. A bed
    /// whose box has no image node in `graph` is left out.
    pub fn run_beds(
        &self,
        host: &dyn BedHost,
        graph: &Graph,
        boxes: Vec<(&ResolvedBox, Vec<(String, Check)>)>,
        o: BedOptions,
    ) -> Result<Vec<BedReport>, EngineError> {
        let beds: Vec<(Bed<'_>, charly_cache::NodeKey)> = boxes
            .into_iter()
            .filter_map(|(b, checks)| {
                let image_key = graph.get(&NodeId::image(&b.name))?.key;
                Some((
                    Bed {
                        b,
                        image: charly_rules::naming::box_image_ref(self.resolution, &b.name),
                        checks,
                        init: supervisord_entrypoint(self.project, b),
                        format: b.pkg().unwrap_or_default().to_string(),
                    },
                    image_key,
                ))
            })
            .collect();
        // Beds run in podman: images assembled earlier are loaded when it
        // lacks them. Only for beds that start a container: a check whose
        // beds are all unchanged since an all-pass run (or have no checks)
        // starts no podman.
        let need: Vec<String> = beds
            .iter()
            .filter(|(bed, key)| bed_without_container(self.store, key, bed, o.force).is_none())
            .map(|(bed, _)| bed.b.name.clone())
            .collect();
        if !need.is_empty() {
            self.ensure_images(graph, &need)?;
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(o.jobs)
            .build()
            .map_err(|e| EngineError::Request(format!("starting {} threads: {e}", o.jobs)))?;
        let reports = pool.install(|| {
            beds.par_iter()
                .map(|(bed, key)| run_bed(host, self.store, key, bed, o.keep, o.force))
                .collect()
        });
        let _ = self.store.flush();
        Ok(reports)
    }
}

/// The entrypoint a bed's container starts with: supervisord's (from the
/// vocabulary), when the box has supervisord and services of its own;
/// else the image's.
fn supervisord_entrypoint(p: &Project, b: &ResolvedBox) -> Option<Vec<String>> {
    let own_services = b
        .candies
        .iter()
        .chain(b.provided.iter())
        .any(|k| p.candies[k].def.service.iter().any(|s| s.exec.is_some()));
    let has_supervisord = b
        .candies
        .iter()
        .chain(b.provided.iter())
        .any(|k| k == "supervisord");
    if !own_services || !has_supervisord {
        return None;
    }
    let init = p.ns(b.ns).vocab.init.get("supervisord")?;
    (!init.entrypoint.is_empty()).then(|| init.entrypoint.clone())
}
