//! Every crate's `lib.rs` is the map of its modules (issue 45): its `//!`
//! doc names each of the crate's top-level modules and points to
//! `docs/architecture.md`, the map of the crates, which exists and names
//! every crate. A new module without a line in its crate's map fails here.

mod common;

use common::{CRATES, lib_doc, modules};

#[test]
fn every_lib_rs_names_its_modules_and_the_architecture_page() {
    let root = charly_testutil::workspace();
    let arch = std::fs::read_to_string(root.join("docs/architecture.md"))
        .expect("docs/architecture.md exists");
    for c in CRATES {
        let lib = std::fs::read_to_string(root.join(c).join("src/lib.rs")).expect("lib.rs");
        let doc = lib_doc(&lib);
        if *c != "testutil" {
            assert!(
                doc.contains("docs/architecture.md"),
                "{c}/src/lib.rs does not point to docs/architecture.md"
            );
            assert!(
                arch.contains(&format!("charly-{c}")),
                "the architecture page names charly-{c}"
            );
        }
        let missing: Vec<String> = modules(&lib)
            .into_iter()
            .map(|m| m.name)
            .filter(|m| !doc.contains(&format!("`{m}`")) && !doc.contains(&format!("[`{m}`]")))
            .collect();
        assert!(
            missing.is_empty(),
            "{c}/src/lib.rs's doc does not name its modules {missing:?}"
        );
    }
}

/// Nothing of the product points outside the repository (a clone has no
/// `../shared`).
#[test]
fn nothing_points_outside_the_repository() {
    let root = charly_testutil::workspace();
    let mut found = Vec::new();
    for c in CRATES.iter().copied().chain(["docs"]) {
        for e in walkdir::WalkDir::new(root.join(c))
            .into_iter()
            .filter_map(Result::ok)
        {
            let p = e.path();
            if !matches!(p.extension().and_then(|x| x.to_str()), Some("rs" | "md")) {
                continue;
            }
            let text = std::fs::read_to_string(p).unwrap_or_default();
            for (i, l) in text.lines().enumerate() {
                if l.contains("DESIGN.md") || l.contains("FORMAT.md") {
                    found.push(format!("{}:{}", p.display(), i + 1));
                }
            }
        }
    }
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README");
    for (i, l) in readme.lines().enumerate() {
        if l.contains("../shared") {
            found.push(format!("README.md:{}", i + 1));
        }
    }
    assert!(found.is_empty(), "{found:#?}");
}
