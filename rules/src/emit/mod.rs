//! Text emitters: the OCI target (Containerfile), quadlet and kustomize.

pub mod cache_lock;
pub mod containerfile;

/// The emitter's revision. Fragment and build-directory keys are computed
/// from what a box is made of, not from the text charly renders of it, so
/// when the same inputs come to render different text the revision is
/// bumped: it is part of those keys, and text an older charly stored is not
/// served again. 2: at most one locked cache mount per `RUN`
/// ([`cache_lock`]). 3: a `download:` unpacked into `to:` makes that
/// directory first.
pub const REVISION: u32 = 3;
pub mod kustomize;
pub mod quadlet;

pub use containerfile::{
    BuildDir, EmitError, EmitOptions, Fragment, Staged, assemble, render_box, render_fragment,
};
