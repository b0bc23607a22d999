//! Text emitters: the OCI target (Containerfile), quadlet and kustomize.

pub mod containerfile;
pub mod kustomize;
pub mod quadlet;

pub use containerfile::{
    BuildDir, EmitError, EmitOptions, Fragment, Staged, assemble, render_box, render_fragment,
};
