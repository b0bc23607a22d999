//! Names charly builds out of other names: builder stage names, the build
//! directory layout, box image references.
//!
//! **Why one module.** These strings are written in one place and read in
//! another (a stage name the emitter writes into `FROM … AS <stage>` is the
//! key of a prebuilt artifact the engine supplies; a layer directory the
//! emitter points `COPY` at is one the engine fills), and most of them are
//! bytes of generated Containerfiles or key inputs. Spelled in one place,
//! the writer and the reader cannot drift apart.
//!
//! Checking the parts (that a candy name is an entity, a box name a
//! qualified box) is [`crate::names`]' business, done once at load.

use crate::project::CandyEntry;
use crate::resolve::Resolution;
use std::collections::BTreeMap;

/// The directory (relative to the output root) that holds everything charly
/// generates.
pub const BUILD_DIR: &str = ".build";

/// Where candy directories from outside the project are staged for a build
/// context, relative to the output root.
pub const LAYERS_DIR: &str = ".build/_layers";

/// `.build/<box>`: a box's build directory, for a qualified box name.
pub fn build_dir(box_name: &str) -> String {
    format!("{BUILD_DIR}/{box_name}")
}

/// The builder stage (and its artifact) of a candy built by a builder or
/// a package format: `<candy>-<builder>-build`.
pub fn stage_name(candy_name: &str, builder: &str) -> String {
    format!("{candy_name}-{builder}-build")
}

/// `_layers/<candy>`: the name of an outside-project candy directory below
/// [`BUILD_DIR`]. Source keys and plans name such a candy's files by it
/// (no output root in a key).
pub fn layer_name(candy_name: &str) -> String {
    format!("_layers/{candy_name}")
}

/// `.build/_layers/<candy>`: where an outside-project candy directory is
/// staged in the build context.
pub fn layer_dir(candy_name: &str) -> String {
    format!("{BUILD_DIR}/{}", layer_name(candy_name))
}

/// The candy name of a staged layer path ([`layer_dir`]'s inverse: the
/// `.build/_layers/` prefix trimmed, repeatedly, as `str::trim_start_matches`
/// does; a path without it comes back whole).
pub fn layer_candy(path: &str) -> &str {
    path.trim_start_matches(".build/_layers/")
}

/// A candy directory as a build context path: its project-relative
/// directory, or [`layer_dir`] when it lives outside the project.
pub fn candy_context_dir(c: &CandyEntry) -> String {
    c.rel_dir.clone().unwrap_or_else(|| layer_dir(&c.name))
}

/// A candy directory as keys and plans name it: its project-relative
/// directory, or [`layer_name`] when it lives outside the project.
pub fn candy_key_dir(c: &CandyEntry) -> String {
    c.rel_dir.clone().unwrap_or_else(|| layer_name(&c.name))
}

/// The image reference of a box: `localhost/<box>:<version>`, `latest`
/// when the version is empty.
pub fn image_ref(box_name: &str, version: &str) -> String {
    format!(
        "localhost/{box_name}:{}",
        if version.is_empty() {
            "latest"
        } else {
            version
        }
    )
}

/// The image reference of a resolved box ([`image_ref`] with its effective
/// version; `latest` for a box that does not resolve).
pub fn box_image_ref(r: &Resolution, box_name: &str) -> String {
    let version = r
        .get(box_name)
        .map(|b| b.version.clone())
        .unwrap_or_default();
    image_ref(box_name, &version)
}

/// Image references of every resolved box, by qualified name (for
/// `ARG BASE_IMAGE` and builder stages).
pub fn box_image_refs(r: &Resolution) -> BTreeMap<String, String> {
    r.boxes
        .iter()
        .filter_map(|(n, b)| {
            b.as_ref()
                .ok()
                .map(|b| (n.clone(), image_ref(n, &b.version)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_pinned() {
        assert_eq!(build_dir("jupyter"), ".build/jupyter");
        assert_eq!(build_dir("ns.b"), ".build/ns.b");
        assert_eq!(stage_name("cowsay", "npm"), "cowsay-npm-build");
        assert_eq!(stage_name("yay", "aur"), "yay-aur-build");
        assert_eq!(layer_name("x"), "_layers/x");
        assert_eq!(layer_dir("x"), ".build/_layers/x");
        assert_eq!(format!("{LAYERS_DIR}/x"), layer_dir("x"));
        assert_eq!(image_ref("jupyter", "2026.1"), "localhost/jupyter:2026.1");
        assert_eq!(image_ref("ns.b", ""), "localhost/ns.b:latest");
    }

    #[test]
    fn layer_candy_inverts_layer_dir() {
        assert_eq!(layer_candy(&layer_dir("cowsay")), "cowsay");
        assert_eq!(layer_candy("other/path"), "other/path");
        assert_eq!(layer_candy(".build/_layers/.build/_layers/x"), "x");
    }

    #[test]
    fn candy_dirs_inside_and_outside_the_project() {
        let mut c = CandyEntry {
            key: "k".into(),
            name: "c".into(),
            dir: "/elsewhere/c".into(),
            rel_dir: None,
            ns: crate::project::NsId(0),
            file: crate::source::FileId(0),
            span: crate::source::Span::default(),
            def: Default::default(),
            files: Default::default(),
            small_files: Default::default(),
            localpkg_sources: Default::default(),
            links_out: Default::default(),
        };
        assert_eq!(candy_context_dir(&c), ".build/_layers/c");
        assert_eq!(candy_key_dir(&c), "_layers/c");
        c.rel_dir = Some("candy/c".into());
        assert_eq!(candy_context_dir(&c), "candy/c");
        assert_eq!(candy_key_dir(&c), "candy/c");
    }
}
