//! The crate graph is the one docs/architecture.md and the README draw:
//! `cli → deploy → engine → {rules, cache, files}`, `deploy → files`,
//! `engine → reapi → cache`, `{rules, reapi} → text`,
//! `{engine, deploy} → plugin` (plugin depends on no charly crate)
//! (each crate may use what lies below it, never what lies above), and no
//! test-only crate or `testing` feature on a normal (product) edge.
//! Read from `cargo metadata`, so a new `[dependencies]` line that breaks
//! the layering fails here.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// Each workspace crate and the workspace crates it may depend on
/// (normal dependencies).
const ALLOWED: &[(&str, &[&str])] = &[
    // Shell quoting and Go templates: a leaf under the model and reapi.
    ("charly-text", &[]),
    ("charly-rules", &["charly-text"]),
    ("charly-cache", &[]),
    // Leaf file utilities (fsroot, artifact) shared by engine and deploy.
    ("charly-files", &[]),
    ("charly-reapi", &["charly-cache", "charly-text"]),
    // The plugin host: below engine and deploy, above nothing of charly's.
    ("charly-plugin", &[]),
    (
        "charly-engine",
        &[
            "charly-text",
            "charly-rules",
            "charly-cache",
            "charly-files",
            "charly-reapi",
            "charly-plugin",
        ],
    ),
    (
        "charly-deploy",
        &[
            "charly-text",
            "charly-engine",
            "charly-rules",
            "charly-cache",
            "charly-files",
            "charly-reapi",
            "charly-plugin",
        ],
    ),
    (
        "charly-cli",
        &[
            "charly-text",
            "charly-deploy",
            "charly-engine",
            "charly-rules",
            "charly-cache",
            "charly-files",
            "charly-reapi",
            "charly-plugin",
        ],
    ),
    // Test fixtures: a dev-dependency of the others, never a normal one.
    ("charly-testutil", &["charly-rules", "charly-engine"]),
    // The workspace's own integration tests and benches (dev only).
    ("charly-suite", &[]),
];

/// Crates that exist for tests only.
const TEST_ONLY: &[&str] = &["charly-testutil"];

fn metadata() -> serde_json::Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("cargo metadata JSON")
}

/// `(package, dependency, kind, features)` for every workspace-internal edge.
fn edges(meta: &serde_json::Value) -> Vec<(String, String, String, Vec<String>)> {
    let pkgs = meta["packages"].as_array().expect("packages");
    let names: BTreeSet<&str> = pkgs.iter().filter_map(|p| p["name"].as_str()).collect();
    let mut out = Vec::new();
    for p in pkgs {
        let from = p["name"].as_str().expect("name");
        for d in p["dependencies"].as_array().expect("dependencies") {
            let to = d["name"].as_str().expect("dep name");
            if !names.contains(to) {
                continue;
            }
            let kind = d["kind"].as_str().unwrap_or("normal").to_string();
            let features = d["features"]
                .as_array()
                .map(|f| {
                    f.iter()
                        .filter_map(|x| x.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            out.push((from.to_string(), to.to_string(), kind, features));
        }
    }
    out
}

/// Edges against the layering, and crates missing from it.
fn layering_violations(meta: &serde_json::Value) -> Vec<String> {
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let mut bad = Vec::new();
    for p in meta["packages"].as_array().expect("packages") {
        let m = p["name"].as_str().expect("name");
        if !allowed.contains_key(m) {
            bad.push(format!(
                "{m} is not in the layering (tests/crate_graph.rs ALLOWED)"
            ));
        }
    }
    for (from, to, kind, _) in edges(meta) {
        if kind == "normal"
            && !allowed
                .get(from.as_str())
                .is_some_and(|ok| ok.contains(&to.as_str()))
        {
            bad.push(format!("{from} → {to}"));
        }
    }
    bad
}

/// Test-only crates or the `testing` feature on a product edge.
fn test_double_violations(meta: &serde_json::Value) -> Vec<String> {
    let mut bad = Vec::new();
    for (from, to, kind, features) in edges(meta) {
        // charly-testutil is itself test-only; what it enables is fine.
        if kind != "normal" || TEST_ONLY.contains(&from.as_str()) {
            continue;
        }
        if TEST_ONLY.contains(&to.as_str()) {
            bad.push(format!("{from} → {to} (a test-only crate)"));
        }
        if features.iter().any(|f| f == "testing") {
            bad.push(format!("{from} → {to} with feature `testing`"));
        }
    }
    // No crate's default features switch the test doubles on.
    for p in meta["packages"].as_array().expect("packages") {
        let defaults = p["features"]["default"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if defaults
            .iter()
            .any(|f| f.as_str().is_some_and(|f| f.contains("testing")))
        {
            bad.push(format!("{} enables `testing` by default", p["name"]));
        }
    }
    bad
}

#[test]
fn workspace_crates_depend_only_downwards() {
    let bad = layering_violations(&metadata());
    assert!(bad.is_empty(), "edges against the layering: {bad:?}");
}

#[test]
fn test_doubles_stay_out_of_the_product() {
    let bad = test_double_violations(&metadata());
    assert!(bad.is_empty(), "{bad:?}");
}

/// The checks see what they are for: an upward edge (also out of the
/// plugin crate, which may use no charly crate), an unknown crate, a
/// test-only crate or the `testing` feature on a normal edge (a dev edge
/// with them is fine).
#[test]
fn the_checks_catch_bad_edges() {
    let meta = serde_json::json!({"packages": [
        {"name": "charly-engine", "features": {}, "dependencies": [
            {"name": "charly-deploy", "kind": null, "features": []},
            {"name": "charly-testutil", "kind": null, "features": []},
            {"name": "charly-reapi", "kind": null, "features": ["testing"]},
            {"name": "charly-testutil", "kind": "dev", "features": ["testing"]},
        ]},
        {"name": "charly-deploy", "features": {"default": ["testing"]}, "dependencies": []},
        {"name": "charly-reapi", "features": {}, "dependencies": []},
        {"name": "charly-testutil", "features": {}, "dependencies": []},
        {"name": "charly-new", "features": {}, "dependencies": []},
        {"name": "charly-plugin", "features": {}, "dependencies": [
            {"name": "charly-rules", "kind": null, "features": []},
        ]},
        {"name": "charly-rules", "features": {}, "dependencies": []},
    ]});
    let layering = layering_violations(&meta);
    assert_eq!(
        layering,
        [
            "charly-new is not in the layering (tests/crate_graph.rs ALLOWED)",
            "charly-engine → charly-deploy",
            "charly-engine → charly-testutil",
            "charly-plugin → charly-rules",
        ]
    );
    let doubles = test_double_violations(&meta);
    assert_eq!(
        doubles,
        [
            "charly-engine → charly-testutil (a test-only crate)",
            "charly-engine → charly-reapi with feature `testing`",
            "\"charly-deploy\" enables `testing` by default",
        ]
    );
}
