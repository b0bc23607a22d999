//! Rendering boxes to build directories and writing them to disk.
//!
//! Rendering is pure (`charly-rules`); this module owns the I/O: it writes
//! `.build/<box>/Containerfile` and every staged context file atomically,
//! removes stale files from earlier runs, and writes the root
//! `.containerignore`.

use charly_rules::emit::containerfile::default_image_ref;
use charly_rules::emit::{BuildDir, EmitOptions, Staged, render_box};
use charly_rules::load::Project;
use charly_rules::plan::{HostContext, Target, build_box_plans};
use charly_rules::resolve::Resolution;
use charly_rules::resolve::ResolvedBox;
use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Why a box could not be generated.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// Plan compilation failed.
    #[error(transparent)]
    Plan(#[from] charly_rules::plan::PlanError),
    /// Rendering failed.
    #[error(transparent)]
    Emit(#[from] charly_rules::emit::EmitError),
    /// Writing failed.
    #[error("writing {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Image references of every resolved box (`localhost/<name>:<version>`),
/// for `ARG BASE_IMAGE` and builder stages.
pub fn image_refs(r: &Resolution) -> BTreeMap<String, String> {
    r.boxes
        .iter()
        .filter_map(|(n, b)| {
            b.as_ref()
                .ok()
                .map(|b| (n.clone(), default_image_ref(n, &b.version)))
        })
        .collect()
}

/// Renders one box (plans for target `oci`, home resolved, then the emitter).
pub fn render(p: &Project, b: &ResolvedBox, opts: &EmitOptions) -> Result<BuildDir, GenerateError> {
    let ctx = HostContext {
        target: Target::Oci,
        ..HostContext::default()
    };
    let mut plans = build_box_plans(p, b, &ctx)?;
    for plan in &mut plans {
        plan.resolve_home(&b.user.home);
    }
    Ok(render_box(p, b, &plans, opts)?)
}

/// Writes a build directory under `out` (the project root by default: paths
/// in the Containerfile are relative to the build context). The box's
/// directory is made to contain exactly the rendered files. Returns the
/// paths written, Containerfile first.
pub fn write(out: &Path, d: &BuildDir) -> Result<Vec<PathBuf>, GenerateError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| GenerateError::Io { path, source }
    };
    let dir = out.join(&d.dir);
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    let mut written = Vec::new();
    let cf = dir.join("Containerfile");
    write_if_changed(&cf, d.containerfile.as_bytes()).map_err(io(&cf))?;
    written.push(cf);
    let mut keep: BTreeSet<PathBuf> = BTreeSet::new();
    keep.insert(dir.join("Containerfile"));
    keep.insert(dir.join(crate::exec::KEY_MARKER));
    for (rel, staged) in &d.files {
        let path = out.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        match staged {
            Staged::Bytes(b) => write_if_changed(&path, b).map_err(io(&path))?,
            Staged::CopyOf(src) => {
                let bytes = std::fs::read(src).map_err(io(src))?;
                write_if_changed(&path, &bytes).map_err(io(&path))?;
            }
        }
        keep.insert(path.clone());
        written.push(path);
    }
    for (rel, src) in &d.layers {
        let dest = out.join(rel);
        copy_tree(src, &dest).map_err(io(&dest))?;
    }
    // Remove files an earlier run staged that this one does not use.
    for e in walkdir::WalkDir::new(&dir)
        .contents_first(true)
        .into_iter()
        .flatten()
    {
        let p = e.path();
        if e.file_type().is_file() && !keep.contains(p) && !is_build_output(&dir, p) {
            let _ = std::fs::remove_file(p);
        } else if e.file_type().is_dir() && p != dir {
            let _ = std::fs::remove_dir(p); // only succeeds when empty
        }
    }
    Ok(written)
}

/// Subdirectories of a box's build directory that builds (not generation)
/// fill: generation leaves them alone.
pub const BUILD_OUTPUT_DIRS: [&str; 3] = ["_artifacts", "_localpkg", "_rootfs"];

/// Files that builds (not generation) put in the build directory.
fn is_build_output(dir: &Path, p: &Path) -> bool {
    p.strip_prefix(dir)
        .ok()
        .and_then(|r| r.components().next())
        .and_then(|c| c.as_os_str().to_str())
        .is_some_and(|c| BUILD_OUTPUT_DIRS.contains(&c))
}

/// What generation leaves on disk under `out_root`, for the no-op journal
/// ([`crate::journal::Journal::record`]): each written box's build
/// directory (the Containerfile paths in `written`) minus what builds put
/// there, the shared layer copies and the root ignore files. Returns the
/// paths to fingerprint and the ones to skip.
pub fn journal_outputs(out_root: &Path, written: &[PathBuf]) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let mut outputs = Vec::new();
    let mut skip = Vec::new();
    for cf in written {
        if let Some(dir) = cf.parent() {
            let dir = crate::journal::normalize(dir);
            skip.extend(BUILD_OUTPUT_DIRS.iter().map(|sub| dir.join(sub)));
            outputs.push(dir);
        }
    }
    let root = crate::journal::normalize(out_root);
    outputs.push(root.join(".build/_layers"));
    outputs.push(root.join(".containerignore"));
    outputs.push(root.join(".dockerignore"));
    (outputs, skip)
}

/// Writes atomically (temp + rename), skipping identical content so mtimes
/// stay put for tools that watch them.
pub fn write_if_changed(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Ok(old) = std::fs::read(path)
        && old == bytes
    {
        return Ok(());
    }
    let parent = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(parent)?;
    tmp.write_all(bytes)?;
    // Context files are bind-mounted into RUNs that may run as the box
    // user: they must be readable by everyone (temp files start as 0600).
    {
        use std::os::unix::fs::PermissionsExt;
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o644))?;
    }
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

fn copy_tree(src: &Path, dest: &Path) -> std::io::Result<()> {
    for e in walkdir::WalkDir::new(src).sort_by_file_name() {
        let e = e.map_err(std::io::Error::other)?;
        let rel = e.path().strip_prefix(src).map_err(std::io::Error::other)?;
        let target = dest.join(rel);
        if e.file_type().is_dir() {
            std::fs::create_dir_all(&target)?;
        } else if e.file_type().is_file() {
            let bytes = std::fs::read(e.path())?;
            write_if_changed(&target, &bytes)?;
        }
    }
    Ok(())
}

/// Writes the root `.containerignore` (and `.dockerignore`) for a project.
pub fn write_ignore_files(p: &Project) -> Result<(), GenerateError> {
    let text =
        charly_rules::emit::containerfile::containerignore(&p.root_ns().defaults.context_ignore);
    for name in [".containerignore", ".dockerignore"] {
        let path = p.root.join(name);
        let body = text.replace(".containerignore", name);
        write_if_changed(&path, body.as_bytes())
            .map_err(|source| GenerateError::Io { path, source })?;
    }
    Ok(())
}
