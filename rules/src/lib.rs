//! charly-rules: the model of a charly project.
//!
//! This crate is pure: apart from reading the project's files in the loader it
//! does no I/O. It owns the YAML schema and loader (with diagnostics that point
//! at file:line:col), the distro cascade, the InstallPlan IR and its compiler,
//! and the text emitters (Containerfile, quadlet, kustomize).

pub mod cascade;
pub mod check;
pub mod diag;
pub mod emit;
pub mod home;
pub mod load;
pub mod migrate;
pub mod model;
pub mod names;
pub mod naming;
pub mod origin;
pub mod plan;
pub mod plugin;
pub mod resolve;
pub mod sh;
pub mod source;
pub mod spec;
pub mod template;
pub mod validate;
pub mod walk;
pub mod yaml;

pub use diag::{Diagnostic, Diagnostics, Severity};
pub use source::{FileId, SourceMap, Span};

/// Lowercase hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(HEX[(b >> 4) as usize] as char);
        s.push(HEX[(b & 15) as usize] as char);
    }
    s
}
