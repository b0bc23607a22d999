//! What is documented as not entering keys does not (issue 52): the flags
//! that say how a build runs and reports — the CA bundle, jobs, progress,
//! quiet, keep-going, a trace file, offline, the journal, the heartbeat, the
//! store's location — leave every node's key as it is. A flag that does
//! enter keys (`--dev-local-pkg`) is the control: it moves them.

use assert_cmd::Command;
use std::collections::BTreeMap;
use std::path::Path;

/// Every node's key from a dry run of the example with `args` added.
fn keys(
    project: &Path,
    cache: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> BTreeMap<String, String> {
    let summary = cache.with_extension("summary.json");
    let mut c = Command::cargo_bin("charly").expect("binary");
    c.env("NO_COLOR", "1")
        .env("CHARLY_CACHE_DIR", cache)
        .env_remove("CHARLY_PROGRESS")
        .arg("-C")
        .arg(project)
        .args(["box", "build", "--all", "--runner", "fake", "--dry-run"])
        .arg("--summary-json")
        .arg(&summary)
        .args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("runs");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&summary).expect("summary")).expect("json");
    s["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| {
            (
                n["id"].as_str().expect("id").to_string(),
                n["key"].as_str().expect("key").to_string(),
            )
        })
        .collect()
}

#[test]
fn flags_that_say_how_a_build_runs_leave_every_key_as_it_is() {
    let t = tempfile::tempdir().expect("tmp");
    let project = t.path().join("hello");
    charly_testutil::copy_project(&charly_testutil::example(), &project);
    let store = t.path().join("store");
    let base = keys(&project, &store, &[], &[]);
    assert!(base.len() > 20, "{} nodes", base.len());
    let trace = t.path().join("trace.json");
    let trace = trace.to_str().expect("utf-8");
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)]);
    let cases: &[Case] = &[
        (&["--ca-bundle", "/etc/ssl/certs/ca-certificates.crt"], &[]),
        (&["-j", "1"], &[]),
        (&["-j", "7"], &[]),
        (&["--progress", "plain"], &[]),
        (&["--quiet"], &[]),
        (&["--keep-going"], &[]),
        (&["--trace", trace], &[]),
        (&["--offline"], &[]),
        (&["--no-journal"], &[]),
        (&[], &[("CHARLY_HEARTBEAT_SECS", "1")]),
    ];
    for (args, env) in cases {
        assert_eq!(
            keys(&project, &store, args, env),
            base,
            "{args:?} {env:?} moved keys"
        );
    }
    // Another store, another directory: the same keys.
    let elsewhere = t.path().join("elsewhere/hello");
    charly_testutil::copy_project(&charly_testutil::example(), &elsewhere);
    assert_eq!(
        keys(&elsewhere, &t.path().join("store2"), &[], &[]),
        base,
        "the store's and the project's location moved keys"
    );
    // The control: a flag that is keyed moves keys.
    assert_ne!(
        keys(&project, &store, &["--dev-local-pkg=false"], &[]),
        base,
        "--dev-local-pkg is keyed: the comparison above can see a change"
    );
}
