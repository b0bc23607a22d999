//! charly-rules: the model of a charly project.
//!
//! This crate is pure: apart from reading the project's files in the loader it
//! does no I/O. It owns the YAML schema and loader (with diagnostics that point
//! at file:line:col), the distro cascade, the InstallPlan IR and its compiler,
//! and the text emitters (Containerfile, quadlet, kustomize).

pub mod cascade;
pub mod diag;
pub mod load;
pub mod model;
pub mod resolve;
pub mod source;
pub mod validate;
pub mod yaml;

pub use diag::{Diagnostic, Diagnostics, Severity};
pub use source::{FileId, SourceMap, Span};
