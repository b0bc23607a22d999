//! `charly migrate --to 2026.174` on the whole 2026.160 corpus: the
//! migrated copy loads in the node form with no errors, and what charly
//! builds from it is what it builds from the original — the same candies,
//! the same resolved boxes, the same install plans, the same checks, and
//! the same generated files under `.build` (Containerfiles and their
//! context), byte for byte. Only two things are normalised, each where it
//! is done: source positions (`span`: the files are rewritten, so lines
//! move) and a check's `definition` (its source text as JSON, the bed's
//! cache key: a node-form step spells the same check with other keys).
//! The labels charly writes carry no schema version, so Containerfiles
//! need no normalisation. What the node form cannot express (a box's
//! `port:`, root sections without a node form) is a located warning.

use charly_cache::Store;
use charly_engine::api::Engine;
use charly_engine::graph::{Goal, GraphOptions};
use charly_engine::hash::FileHasher;
use charly_engine::sched::Quiet;
use charly_rules::load::{self, LoadOptions, Project};
use charly_rules::plan::{HostContext, Target, build_box_plans};
use charly_rules::resolve::{self, Resolution};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

fn load(dir: &Path) -> (Project, Resolution) {
    let p = load::load(dir, &LoadOptions::default())
        .unwrap_or_else(|e| panic!("{} loads: {e:?}", dir.display()));
    let r = resolve::resolve(&p);
    (p, r)
}

/// A value with every `span` key removed (positions differ by design).
fn no_spans(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(k, _)| k != "span")
                .map(|(k, v)| (k, no_spans(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(no_spans).collect()),
        other => other,
    }
}

/// Per resolving box: the resolved box, its plans for a container and the
/// host, and its checks — as JSON without positions.
fn model(p: &Project, r: &Resolution) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for (name, b) in &r.boxes {
        let Ok(b) = b else { continue };
        let mut plans = Vec::new();
        for target in [Target::Oci, Target::Local] {
            let ctx = HostContext {
                target,
                ..HostContext::default()
            };
            plans.push(match build_box_plans(p, b, &ctx) {
                Ok(ps) => serde_json::to_value(&ps).unwrap_or_default(),
                Err(e) => Value::String(e.to_string()),
            });
        }
        let mut diags = Vec::new();
        let checks: Vec<Value> = charly_engine::check::box_checks(p, b, &mut diags)
            .into_iter()
            .map(|(owner, mut c)| {
                // The definition is the check's source text as JSON, the
                // bed's cache key: a node-form step spells the same check
                // with other keys (`plugin_input`, `context`).
                c.definition = Value::Null;
                serde_json::json!([owner, c])
            })
            .collect();
        out.insert(
            name.clone(),
            no_spans(serde_json::json!({
                "box": b,
                "plans": plans,
                "checks": checks,
            })),
        );
    }
    out
}

/// Generates every resolving box; returns `.build/**` (relative path → bytes).
fn generate(p: &Project, r: &Resolution, root: &Path, store: &Path) -> BTreeMap<String, String> {
    let boxes = r.resolved_names();
    let store = Store::open(store).expect("store");
    let hasher = FileHasher::in_memory();
    let engine = Engine {
        project: p,
        resolution: r,
        store: &store,
        runner: None,
        hasher: &hasher,
        opts: GraphOptions::new("podman", "amd64"),
        remote: None,
        own_inputs: None,
    };
    let g = engine.graph(&Goal::Generate, &boxes).expect("graph");
    let s = engine.run(&g, root, 2, false, &Quiet);
    assert!(
        s.ok(),
        "{:?}",
        s.nodes
            .iter()
            .filter(|n| n.error.is_some())
            .collect::<Vec<_>>()
    );
    engine
        .write_build_dirs(&g, root, false)
        .expect("build dirs");
    let build = root.join(".build");
    walkdir::WalkDir::new(&build)
        .into_iter()
        .map(|e| e.expect("walk"))
        .filter(|e| e.file_type().is_file())
        .filter(|e| e.file_name() != charly_engine::generate::KEY_MARKER)
        .map(|e| {
            let rel = e
                .path()
                .strip_prefix(&build)
                .expect("rel")
                .to_string_lossy()
                .into_owned();
            let bytes = std::fs::read(e.path()).expect("read");
            (rel, String::from_utf8_lossy(&bytes).into_owned())
        })
        .collect()
}

#[test]
fn the_migrated_corpus_builds_what_the_original_builds() {
    let tmp = tempfile::tempdir().expect("tmp");
    let old_root = tmp.path().join("old");
    let new_root = tmp.path().join("new");
    charly_testutil::copy_project(&charly_testutil::corpus(), &old_root);
    let (old, old_r) = load(&old_root);
    let m = charly_rules::migrate::to_nodeform(&old, "2026.174").expect("migrates");
    // What cannot be expressed is a located warning each.
    for w in &m.warnings {
        assert!(!w.is_error());
        let at = w.location(&old.sources);
        assert!(
            at.split(':').count() >= 3,
            "a warning without file:line:col: {at} {}",
            w.message
        );
    }
    let warned = |needle: &str| m.warnings.iter().any(|w| w.message.contains(needle));
    assert!(warned("`port:` of box `redis` was removed in 2026.174"));
    assert!(warned("`recipe:` has no 2026.174 form"));
    for w in &m.warnings {
        eprintln!("warning: {}", w.one_line(&old.sources));
    }
    charly_testutil::copy_project(&old_root, &new_root);
    for (rel, text) in &m.files {
        charly_testutil::write(&new_root, rel, text);
    }
    let (new, new_r) = load(&new_root);
    assert!(new.root_ns().nodeform, "the copy is node form");
    let errors: Vec<String> = new
        .diags
        .errors()
        .map(|d| d.one_line(&new.sources))
        .collect();
    assert!(errors.is_empty(), "{errors:#?}");
    let mut old_keys: Vec<&String> = old.candies.keys().collect();
    let mut new_keys: Vec<&String> = new.candies.keys().collect();
    old_keys.sort();
    new_keys.sort();
    assert_eq!(old_keys, new_keys, "the same candies");
    assert!(old_r.resolved_names().len() >= 20);
    assert_eq!(
        old_r.resolved_names(),
        new_r.resolved_names(),
        "the same boxes resolve"
    );

    let (a, b) = (model(&old, &old_r), model(&new, &new_r));
    if let Some(dir) = std::env::var_os("CHARLY_MIGRATE_DUMP") {
        // For a person reading a difference: both models, one file each.
        for (era, m) in [("2026.160", &a), ("2026.174", &b)] {
            let text = serde_json::to_string_pretty(m).unwrap_or_default();
            std::fs::write(Path::new(&dir).join(format!("{era}.json")), text).expect("dump");
        }
    }
    for (name, want) in &a {
        let got = b.get(name).unwrap_or(&Value::Null);
        assert!(
            want == got,
            "box {name} differs after migration:\n--- 2026.160\n{}\n--- 2026.174\n{}",
            serde_json::to_string_pretty(want).unwrap_or_default(),
            serde_json::to_string_pretty(got).unwrap_or_default()
        );
    }

    let old_files = generate(&old, &old_r, &old_root, &tmp.path().join("store-old"));
    let new_files = generate(&new, &new_r, &new_root, &tmp.path().join("store-new"));
    assert!(old_files.len() > 40, "{} files", old_files.len());
    assert_eq!(
        old_files.keys().collect::<Vec<_>>(),
        new_files.keys().collect::<Vec<_>>()
    );
    for (rel, want) in &old_files {
        let got = &new_files[rel];
        assert!(
            want == got,
            "{rel} differs after migration:\n--- 2026.160\n{want}\n--- 2026.174\n{got}"
        );
    }
}
