//! What the workspace-level tests about the code's own structure share:
//! the crates and the modules each `lib.rs` declares.
// Each test file uses part of this.
#![allow(dead_code)]

/// Every crate directory of the workspace.
pub const CRATES: &[&str] = &[
    "rules", "text", "cache", "files", "reapi", "engine", "deploy", "plugin", "cli", "testutil",
];

/// A top-level module `lib.rs` declares (`mod x;`, `pub mod x;`,
/// `pub mod x {`).
pub struct LibModule {
    pub name: String,
    /// In its own file (`mod x;`), not inline in `lib.rs`.
    pub file_backed: bool,
}

/// The top-level modules of a `lib.rs` (a `tests` module left out).
pub fn modules(lib: &str) -> Vec<LibModule> {
    lib.lines()
        .filter(|l| !l.starts_with("//") && !l.starts_with(' '))
        .filter_map(|l| {
            let l = l
                .trim_start_matches("pub ")
                .trim_start_matches("pub(crate) ");
            let rest = l.strip_prefix("mod ")?;
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let file_backed = rest[name.len()..].trim_start().starts_with(';');
            (!name.is_empty() && name != "tests").then_some(LibModule { name, file_backed })
        })
        .collect()
}

/// The `//!` doc of a `lib.rs`.
pub fn lib_doc(lib: &str) -> String {
    lib.lines()
        .filter(|l| l.starts_with("//!"))
        .collect::<Vec<_>>()
        .join("\n")
}
