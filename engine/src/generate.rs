//! Rendering boxes to build directories and writing them to disk.
//!
//! Rendering is pure (`charly-rules`); this module owns the I/O: it writes
//! `.build/<box>/Containerfile` and every staged context file atomically,
//! removes stale files from earlier runs, and writes the root
//! `.containerignore`.

use charly_rules::emit::{BuildDir, EmitOptions, Staged, render_box};
use charly_rules::load::Project;
use charly_rules::plan::{HostContext, Target, build_box_plans};
use charly_rules::resolve::Resolution;
use charly_rules::resolve::ResolvedBox;
use std::collections::BTreeMap;
use std::collections::BTreeSet;
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
/// for `ARG BASE_IMAGE` and builder stages (see
/// [`charly_rules::naming::box_image_refs`]).
pub fn image_refs(r: &Resolution) -> BTreeMap<String, String> {
    charly_rules::naming::box_image_refs(r)
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

/// Name of the marker that records which key a build directory holds
/// (the executor writes it when it materializes a build directory from the
/// store; [`write()`] keeps it when it prunes the directory).
pub const KEY_MARKER: &str = ".charly-key";

/// Writes a build directory under `out` (the project root by default: paths
/// in the Containerfile are relative to the build context). The box's
/// directory is made to contain exactly the rendered files. Returns the
/// paths written, Containerfile first.
///
/// Every path is proven inside `out` before anything is written or
/// removed ([`charly_files::fsroot`]): the box directory and staged files must be
/// relative paths of plain names (no `..`, no absolute path), no symlink
/// may lead out of `out`, and stale files are removed without following
/// symlinks. A hostile `BuildDir` gets an error and changes nothing outside.
pub fn write(out: &Path, d: &BuildDir) -> Result<Vec<PathBuf>, GenerateError> {
    write_keeping(out, d, &BTreeSet::new())
}

/// [`write()`], leaving the files `in_place` (paths relative to `out`, as
/// `d.files` names them) untouched and not pruned: the caller found them
/// holding what `d` would write there, and left them out of `d.files`.
pub fn write_keeping(
    out: &Path,
    d: &BuildDir,
    in_place: &BTreeSet<String>,
) -> Result<Vec<PathBuf>, GenerateError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| GenerateError::Io { path, source }
    };
    let root = charly_files::fsroot::Root::create(out).map_err(io(out))?;
    let dir_rel = Path::new(&d.dir);
    let dir = out.join(dir_rel);
    charly_files::fsroot::check_rel(dir_rel).map_err(io(&dir))?;
    for rel in d.files.keys().chain(d.layers.keys()).chain(in_place) {
        charly_files::fsroot::check_rel(Path::new(rel)).map_err(io(&out.join(rel)))?;
    }
    root.create_dir_all(dir_rel).map_err(io(&dir))?;
    // A build directory is made of real directories: a symlink met where
    // one of them goes (below the box's directory) is removed, not
    // followed, or the files written through it would vanish with it when
    // the directory is pruned. Parents sort before their children, so a
    // removed link is not looked through.
    let subdirs: BTreeSet<&Path> = d
        .files
        .keys()
        .flat_map(|rel| {
            Path::new(rel)
                .ancestors()
                .skip(1)
                .take_while(|a| *a != dir_rel && a.starts_with(dir_rel))
        })
        .collect();
    for sub in subdirs {
        if std::fs::symlink_metadata(out.join(sub)).is_ok_and(|m| m.file_type().is_symlink()) {
            root.remove(sub).map_err(io(&out.join(sub)))?;
        }
    }
    let mut written = Vec::new();
    let cf_rel = dir_rel.join("Containerfile");
    let cf = out.join(&cf_rel);
    root.write_output_if_changed(&cf_rel, d.containerfile.as_bytes())
        .map_err(io(&cf))?;
    written.push(cf);
    let mut keep: BTreeSet<PathBuf> = BTreeSet::new();
    keep.insert(cf_rel);
    keep.insert(dir_rel.join(KEY_MARKER));
    keep.extend(in_place.iter().map(PathBuf::from));
    for (rel, staged) in &d.files {
        let path = out.join(rel);
        match staged {
            Staged::Bytes(b) => root
                .write_output_if_changed(Path::new(rel), b)
                .map_err(io(&path))?,
            Staged::CopyOf(src) => {
                let bytes = std::fs::read(src).map_err(io(src))?;
                root.write_output_if_changed(Path::new(rel), &bytes)
                    .map_err(io(&path))?
            }
        };
        keep.insert(PathBuf::from(rel));
        written.push(path);
    }
    for (rel, src) in &d.layers {
        copy_tree(&root, src, Path::new(rel)).map_err(io(&out.join(rel)))?;
    }
    // Remove files an earlier run staged that this one does not use, and
    // the temp files of killed writers (a live writer's is kept).
    root.prune(dir_rel, &|p, is_dir| {
        keep.contains(p) || (is_dir && is_build_output(dir_rel, p))
    })
    .map_err(io(&dir))?;
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
    outputs.push(root.join(charly_rules::naming::LAYERS_DIR));
    outputs.push(root.join(".containerignore"));
    outputs.push(root.join(".dockerignore"));
    (outputs, skip)
}

/// Writes atomically (a locked temp file + rename), skipping identical
/// content so mtimes stay put for tools that watch them. Mode 0644: context
/// files are bind-mounted into RUNs that may run as the box user.
pub fn write_if_changed(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    charly_files::fsroot::write_file_if_changed(path, bytes).map(drop)
}

fn copy_tree(root: &charly_files::fsroot::Root, src: &Path, dest: &Path) -> std::io::Result<()> {
    for e in walkdir::WalkDir::new(src).sort_by_file_name() {
        let e = e.map_err(std::io::Error::other)?;
        let rel = e.path().strip_prefix(src).map_err(std::io::Error::other)?;
        let target = dest.join(rel);
        if e.file_type().is_dir() {
            root.create_dir_all(&target)?;
        } else if e.file_type().is_file() {
            let bytes = std::fs::read(e.path())?;
            root.write_output_if_changed(&target, &bytes)?;
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

/// Copies a directory's regular files and directories (links are left out:
/// a build would refuse links out of its context).
pub(crate) fn copy_dir(src: &Path, dest: &Path) -> std::io::Result<()> {
    for e in walkdir::WalkDir::new(src).sort_by_file_name() {
        let e = e.map_err(std::io::Error::other)?;
        let rel = e.path().strip_prefix(src).map_err(std::io::Error::other)?;
        let t = dest.join(rel);
        if e.file_type().is_dir() {
            std::fs::create_dir_all(&t)?;
        } else if e.file_type().is_file() {
            let bytes = std::fs::read(e.path())?;
            write_if_changed(&t, &bytes)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// Every file, dir and link below `dir` with its content or target.
    fn snapshot(dir: &Path) -> Vec<(PathBuf, String)> {
        walkdir::WalkDir::new(dir)
            .follow_links(false)
            .sort_by_file_name()
            .into_iter()
            .flatten()
            .map(|e| {
                let p = e.path().to_path_buf();
                let what = if e.path_is_symlink() {
                    format!("-> {}", std::fs::read_link(&p).expect("link").display())
                } else if e.file_type().is_file() {
                    std::fs::read_to_string(&p).expect("read")
                } else {
                    "dir".into()
                };
                (p, what)
            })
            .collect()
    }

    fn build_dir(dir: &str, file: Option<&str>) -> BuildDir {
        let mut d = BuildDir {
            box_name: "evil".into(),
            dir: dir.into(),
            containerfile: "FROM scratch\n".into(),
            ..Default::default()
        };
        if let Some(f) = file {
            d.files.insert(f.into(), Staged::Bytes(b"pwned".to_vec()));
        }
        d
    }

    /// A hostile `BuildDir` (box dir `../..`, absolute, through a symlink
    /// out of the root, staged files escaping) is refused and nothing
    /// outside the output root changes, nothing is deleted there.
    #[test]
    fn hostile_build_dirs_change_nothing_outside_the_root() {
        let t = tempfile::tempdir().expect("tmp");
        let sentinel = t.path().join("sentinel");
        std::fs::create_dir_all(sentinel.join("sub")).expect("mkdir");
        std::fs::write(sentinel.join("charly.yml"), "keep me\n").expect("write");
        std::fs::write(sentinel.join("sub/Containerfile"), "mine\n").expect("write");
        let out = sentinel.join("proj/out");
        std::fs::create_dir_all(out.join(".build")).expect("mkdir");
        symlink(&sentinel, out.join(".build/link")).expect("ln");
        symlink("../..", out.join(".build/rel")).expect("ln");
        let abs = sentinel.join("sub").display().to_string();
        let before = snapshot(&sentinel);
        let cases = [
            build_dir("../..", None),
            build_dir("../../sub", None),
            build_dir(&abs, None),
            build_dir(".build/link", None),
            build_dir(".build/link/sub", None),
            build_dir(".build/rel/..", None),
            build_dir(".build/rel", None),
            build_dir(".build/.", None),
            build_dir("", None),
            build_dir(".build/ok", Some("../../x")),
            build_dir(".build/ok", Some(&format!("{abs}/x"))),
            build_dir(".build/ok", Some(".build/link/x")),
        ];
        for d in &cases {
            let r = write(&out, d);
            assert!(
                r.is_err(),
                "{:?} / {:?} must be refused",
                d.dir,
                d.files.keys()
            );
            // Only things inside the output root may have appeared.
            let after: Vec<_> = snapshot(&sentinel)
                .into_iter()
                .filter(|(p, _)| !p.starts_with(out.join(".build/ok")))
                .collect();
            assert_eq!(before, after, "{:?} changed the tree", d.dir);
        }
        // A sane build dir still works, and its stale files go.
        let ok = build_dir(".build/fine", Some(".build/fine/a.sh"));
        write(&out, &ok).expect("fine");
        std::fs::write(out.join(".build/fine/stale"), "x").expect("stale");
        write(&out, &build_dir(".build/fine", None)).expect("again");
        assert!(!out.join(".build/fine/stale").exists());
        assert!(!out.join(".build/fine/a.sh").exists());
        assert_eq!(
            std::fs::read_to_string(out.join(".build/fine/Containerfile")).expect("cf"),
            "FROM scratch\n"
        );
    }
}
