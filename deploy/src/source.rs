//! Artifacts for deploys from the store: builder-stage artifact tars and
//! built local packages, as the engine finds them ([`Built`]: by the keys
//! `charly box build` stored them under), and candy files. Nothing is
//! built here: a missing artifact is an error that says which build makes
//! it.

use crate::walk::Artifacts;
use charly_cache::Store;
use charly_engine::api::Engine;
use charly_engine::built::Built;
use charly_engine::graph::GraphOptions;
use charly_engine::hash::FileHasher;
use charly_rules::load::Project;
use charly_rules::resolve::Resolution;

/// The store as an [`Artifacts`] source for one box.
pub struct StoreArtifacts<'a> {
    project: &'a Project,
    built: Built<'a>,
}

impl<'a> StoreArtifacts<'a> {
    /// What the engine says `box build` stored for the box (keys only;
    /// nothing runs). `opts` must match the build that filled the store
    /// (runner name, arch, dev-local-pkg).
    pub fn new(
        project: &'a Project,
        resolution: &'a Resolution,
        store: &'a Store,
        hasher: &'a FileHasher,
        opts: GraphOptions,
        box_name: &str,
    ) -> Result<Self, String> {
        let engine = Engine {
            project,
            resolution,
            store,
            runner: None,
            hasher,
            opts,
            remote: None,
            own_inputs: None,
        };
        let built = engine.built(box_name).map_err(|e| e.to_string())?;
        Ok(StoreArtifacts { project, built })
    }
}

impl Artifacts for StoreArtifacts<'_> {
    fn builder_tar(&self, candy: &str, builder: &str) -> Result<Vec<u8>, String> {
        self.built.builder_tar(candy, builder)
    }

    fn local_packages(&self, candy: &str, format: &str) -> Result<Vec<(String, Vec<u8>)>, String> {
        self.built.local_packages(candy, format)
    }

    fn candy_file(&self, candy: &str, rel: &str) -> Result<Vec<u8>, String> {
        let c = self
            .project
            .candies
            .get(candy)
            .ok_or_else(|| format!("unknown candy {candy}"))?;
        // Inside the candy directory only: no absolute path, no `..`, no
        // symlink leading out of it (charly_files::fsroot).
        let p = c.dir.join(rel);
        charly_files::fsroot::Root::open(&c.dir)
            .and_then(|r| r.read(std::path::Path::new(rel)))
            .map_err(|e| format!("{}: {e}", p.display()))?
            .ok_or_else(|| format!("{}: no such file", p.display()))
    }
}
