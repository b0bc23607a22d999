//! charly-rules: the model of a charly project.
//!
//! This crate is pure: apart from reading the project's files in the loader it
//! does no I/O. It owns the YAML schema and loader (with diagnostics that point
//! at file:line:col), the distro cascade, the InstallPlan IR and its compiler,
//! and the text emitters (Containerfile, quadlet, kustomize). Where it sits
//! among the crates, and how a build flows through it:
//! `docs/architecture.md`.
//!
//! Its modules form layers, listed here bottom first; each names (through
//! `crate::`) only modules listed before it (`tests/module_graph.rs` keeps
//! the modules acyclic):
//!
//! 1. Text and data with no project in them: [`source`] files and
//!    positions, [`diag`] diagnostics at file:line:col, [`yaml`] the
//!    spanned YAML tree and its serde Deserializer, [`sh`] shell quoting,
//!    [`walk`] a directory walk, [`ir`] the InstallPlan IR (steps, scope,
//!    venue, phase, gate, reverse ops), [`home`] `~` and `${HOME}`.
//! 2. The schema: [`model`] the YAML types, [`cascade`] the distro
//!    cascade, [`template`] Go `text/template` for the vocabulary,
//!    [`plugin`] the plugins a project declares.
//! 3. A loaded project: [`project`] its types (namespaces, boxes, candies),
//!    [`names`] the identifier rules, [`resolve`] boxes ready to build,
//!    [`naming`] names built from names, [`check`] the typed `eval:`
//!    entries, [`load`] reading a project from disk (both eras).
//! 4. Planning and rendering: [`plan`] the IR's compiler, [`emit`] the
//!    Containerfile, quadlet and kustomize emitters, [`validate`] candy
//!    checks, [`migrate`] the classic form as node-form files, [`spec`]
//!    what command-running nodes are asked to do, [`origin`] from a failed
//!    build step back to the candy file.

// Shell quoting and Go templates live in a leaf crate (the REAPI stage
// interpreter below this crate quotes the same way); they are this
// crate's modules too, where the crates above have always found them.
pub use charly_text::{sh, template};

pub mod cascade;
pub mod check;
pub mod diag;
pub mod emit;
pub mod home;
pub mod ir;
pub mod load;
pub mod migrate;
pub mod model;
pub mod names;
pub mod naming;
pub mod origin;
pub mod plan;
pub mod plugin;
pub mod project;
pub mod resolve;
pub mod source;
pub mod spec;
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
