//! What running a node needs ([`Ctx`]) and how it fails ([`ExecError`]).
//!
//! Shared by the node executor (`exec`, which re-exports both) and the
//! request builders it calls (`stage`): they sit below both, so `stage`
//! does not reach back into `exec` for them.

use crate::runners::Runner;
use charly_cache::Store;
use charly_rules::emit::EmitOptions;
use charly_rules::load::Project;
use charly_rules::resolve::Resolution;
use std::path::PathBuf;

/// Everything nodes need to run.
pub struct Ctx<'a> {
    /// The project.
    pub project: &'a Project,
    /// Its resolution.
    pub resolution: &'a Resolution,
    /// The store.
    pub store: &'a Store,
    /// The runner for command nodes (`None`: planning only).
    pub runner: Option<&'a dyn Runner>,
    /// The runner's name as keys and records carry it.
    pub runner_name: String,
    /// Where build directories are written (the build context root).
    pub out_root: PathBuf,
    /// Emitter options shared by every box (image refs, dev-local-pkg).
    pub emit: EmitOptions,
    /// Target architecture (`amd64`).
    pub arch: String,
    /// The shared cache consulted on local misses and fed with new results.
    pub remote: Option<&'a dyn charly_cache::RemoteCache>,
    /// Who hears how the run goes: nodes starting and ending, what their
    /// commands print.
    pub obs: Option<&'a dyn crate::report::Observer>,
    /// The stat cache: build-directory files are verified through it (a
    /// stat instead of a read per unchanged file).
    pub hasher: &'a crate::hash::FileHasher,
    /// Keys the last run of the same command left in the store
    /// ([`crate::journal::Memo`]): such a node is cached without a lookup
    /// of its own.
    pub present: Option<&'a std::collections::HashSet<charly_cache::NodeKey>>,
}

/// Why a node failed.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The store failed.
    #[error("store: {0}")]
    Cache(#[from] charly_cache::CacheError),
    /// Rendering failed.
    #[error(transparent)]
    Emit(#[from] charly_rules::emit::EmitError),
    /// Plan compilation failed.
    #[error(transparent)]
    Plan(#[from] charly_rules::plan::PlanError),
    /// A template failed.
    #[error(transparent)]
    Template(#[from] charly_rules::template::TemplateError),
    /// The runner failed.
    #[error(transparent)]
    Run(#[from] crate::runners::RunError),
    /// A build step failed, and the candy file says where it came from:
    /// the candy, the part and its place; the runner's error.
    #[error("{}: {}", .0.0, .0.1)]
    Located(Box<(charly_rules::origin::Located, crate::runners::RunError)>),
    /// File I/O failed.
    #[error("{0}")]
    Io(String),
    /// A node needs a runner but this command only plans.
    #[error("{0} needs a runner, and this command runs none")]
    NoRunner(String),
    /// A dependency's output is missing from the store.
    #[error("output `{output}` of {node} is missing from the store")]
    MissingOutput {
        /// Dependency node.
        node: String,
        /// Output name.
        output: String,
    },
    /// A node failed, and its whole log is kept in this file (the error
    /// shows only its last lines).
    #[error("{}\n  full log: {}", .0, .1.display())]
    Logged(Box<ExecError>, std::path::PathBuf),
}

/// Spec errors are the errors the engine raised when it computed the
/// requests itself: same variant, same message.
impl From<charly_rules::spec::SpecError> for ExecError {
    fn from(e: charly_rules::spec::SpecError) -> Self {
        use charly_rules::spec::SpecError;
        match e {
            SpecError::Emit(e) => ExecError::Emit(e),
            SpecError::Template(e) => ExecError::Template(e),
            SpecError::Missing(m) => ExecError::Io(m),
        }
    }
}

impl<'a> Ctx<'a> {
    /// The runner, or [`ExecError::NoRunner`] naming `node`.
    pub fn runner(&self, node: &str) -> Result<&'a dyn Runner, ExecError> {
        self.runner
            .ok_or_else(|| ExecError::NoRunner(node.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use charly_rules::spec::SpecError;

    /// Spec errors reach the engine as the variants (and messages) they
    /// had when the engine computed the requests itself.
    #[test]
    fn spec_errors_keep_their_exec_variants() {
        let e: ExecError =
            SpecError::Missing("format deb has no local_pkg definition".into()).into();
        assert!(matches!(&e, ExecError::Io(m) if m == "format deb has no local_pkg definition"));
        assert_eq!(e.to_string(), "format deb has no local_pkg definition");
        let t = charly_rules::template::render("t", "{{", &serde_json::Value::Null)
            .expect_err("bad template");
        let e: ExecError = SpecError::Template(t.clone()).into();
        assert!(matches!(&e, ExecError::Template(x) if *x == t));
        let emit = charly_rules::emit::EmitError {
            box_name: "b".into(),
            message: "m".into(),
        };
        let shown = emit.to_string();
        let e: ExecError = SpecError::Emit(emit).into();
        assert!(matches!(&e, ExecError::Emit(_)));
        assert_eq!(e.to_string(), shown);
    }
}
