//! Every crate's `lib.rs` is the map of its modules (issue 45): its `//!`
//! doc names each of the crate's top-level modules and points to
//! `docs/architecture.md`, the map of the crates, which exists and names
//! every crate. A new module without a line in its crate's map fails here.

const CRATES: &[&str] = &[
    "rules", "cache", "reapi", "engine", "deploy", "plugin", "cli", "testutil",
];

/// The top-level modules `lib.rs` declares (`mod x;`, `pub mod x;`,
/// `pub mod x {`).
fn modules(lib: &str) -> Vec<String> {
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
            (!name.is_empty() && name != "tests").then_some(name)
        })
        .collect()
}

#[test]
fn every_lib_rs_names_its_modules_and_the_architecture_page() {
    let root = charly_testutil::workspace();
    let arch = std::fs::read_to_string(root.join("docs/architecture.md"))
        .expect("docs/architecture.md exists");
    for c in CRATES {
        let lib = std::fs::read_to_string(root.join(c).join("src/lib.rs")).expect("lib.rs");
        let doc: String = lib
            .lines()
            .filter(|l| l.starts_with("//!"))
            .collect::<Vec<_>>()
            .join("\n");
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
