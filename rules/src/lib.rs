//! charly-rules: the model of a charly project.
//!
//! This crate is pure: apart from reading the project's files in the loader it
//! does no I/O. It owns the YAML schema and loader (with diagnostics that point
//! at file:line:col), the distro cascade, the InstallPlan IR and its compiler,
//! and the text emitters (Containerfile, quadlet, kustomize). Where it sits
//! among the crates, and how a build flows through it:
//! `docs/architecture.md`.
//!
//! Reading (the bottom): [`source`] files and positions, [`diag`]
//! diagnostics at file:line:col, [`yaml`] the spanned YAML tree and its
//! serde Deserializer, [`model`] the schema types, [`names`] the identifier
//! rules, [`home`] `~` and `${HOME}`, [`sh`] shell quoting.
//!
//! Loading: [`load`] a project from disk (both eras), [`walk`] its
//! directory walk, [`plugin`] the plugins a project declares, [`migrate`]
//! the classic form as node-form files.
//!
//! Resolving and checking: [`resolve`] boxes ready to build, [`cascade`]
//! the distro cascade, [`validate`] candy checks, [`check`] the typed
//! `eval:` entries.
//!
//! Planning and rendering: [`plan`] the InstallPlan IR and its compiler,
//! [`template`] Go `text/template` for the vocabulary, [`emit`] the
//! Containerfile, quadlet and kustomize emitters, [`naming`] names built
//! from names, [`spec`] what command-running nodes are asked to do,
//! [`origin`] from a failed build step back to the candy file.

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
