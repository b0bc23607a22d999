//! Text emitters: the OCI target (Containerfile), quadlet and kustomize.

pub mod containerfile;

pub use containerfile::{BuildDir, EmitError, EmitOptions, Staged, render_box};
