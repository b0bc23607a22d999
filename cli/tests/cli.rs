//! The `charly` binary on the real corpus: exit codes, stdout data, JSON shapes.

use assert_cmd::Command;

use charly_testutil::corpus;

fn charly() -> Command {
    let mut c = Command::cargo_bin("charly").expect("binary");
    c.env("NO_COLOR", "1");
    c
}

fn json(args: &[&str]) -> serde_json::Value {
    let out = charly()
        .arg("-C")
        .arg(corpus())
        .args(args)
        .output()
        .expect("runs");
    assert!(out.status.code().is_some(), "terminated by a signal");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{args:?}: stdout is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

#[test]
fn box_list_json_shape_and_counts() {
    let v = json(&["box", "list", "--json"]);
    let rows = v.as_array().expect("array");
    assert_eq!(
        rows.iter()
            .filter(|r| !r["name"].as_str().unwrap_or("").contains('.'))
            .count(),
        43
    );
    let ok: Vec<&str> = rows
        .iter()
        .filter(|r| r["error"].is_null())
        .filter_map(|r| r["name"].as_str())
        .collect();
    assert_eq!(ok.iter().filter(|n| !n.contains('.')).count(), 19, "{ok:?}");
    for r in rows {
        for k in ["name", "base", "distro", "candies", "error"] {
            assert!(r.get(k).is_some(), "{k} missing in {r}");
        }
        if !r["error"].is_null() {
            assert_eq!(r["candies"], serde_json::json!([]));
            let e = r["error"].as_str().expect("message");
            assert!(e.contains("charly.yml:"), "error names file:line:col: {e}");
        }
    }
    let jupyter = rows
        .iter()
        .find(|r| r["name"] == "jupyter")
        .expect("jupyter");
    assert_eq!(jupyter["base"], "fedora");
    assert_eq!(jupyter["candies"][0], "direnv");
}

#[test]
fn validate_json_has_errors_and_warnings_and_exits_1() {
    let out = charly()
        .arg("-C")
        .arg(corpus())
        .args(["validate", "--json"])
        .output()
        .expect("runs");
    assert_eq!(
        out.status.code(),
        Some(1),
        "the corpus lacks candies some boxes need"
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let errors = v["errors"].as_array().expect("errors");
    assert!(v["warnings"].is_array());
    assert!(!errors.is_empty());
    for e in errors {
        assert!(
            e["file"].is_string()
                && e["line"].is_u64()
                && e["column"].is_u64()
                && e["message"].is_string(),
            "{e}"
        );
    }
}

#[test]
fn box_plan_json_for_every_resolvable_box_and_target_is_stable() {
    let list = json(&["box", "list", "--json"]);
    let names: Vec<String> = list
        .as_array()
        .expect("array")
        .iter()
        .filter(|r| r["error"].is_null())
        .filter_map(|r| r["name"].as_str().map(str::to_string))
        .collect();
    for name in &names {
        for target in ["oci", "local", "vm", "pod", "k8s"] {
            let run = || {
                charly()
                    .arg("-C")
                    .arg(corpus())
                    .args(["box", "plan", name, "--target", target, "--json"])
                    .output()
                    .expect("runs")
            };
            let (a, b) = (run(), run());
            assert!(
                a.status.success(),
                "{name} {target}: {}",
                String::from_utf8_lossy(&a.stderr)
            );
            assert_eq!(a.stdout, b.stdout, "{name} {target}: byte-identical");
            let v: serde_json::Value = serde_json::from_slice(&a.stdout).expect("json");
            assert_eq!(v["box"], name.as_str());
            assert_eq!(v["target"], target);
            assert_eq!(v["deploy_id"].as_str().map(str::len), Some(16));
            for p in v["plans"].as_array().expect("plans") {
                assert!(p["candy"].is_string());
                for s in p["steps"].as_array().expect("steps") {
                    for k in ["kind", "scope", "venue", "gate", "reverse"] {
                        assert!(s.get(k).is_some(), "{name}: step without {k}: {s}");
                    }
                    if s["kind"] == "system-packages" {
                        assert!(s["format"].is_string() && s["packages"].is_array());
                    }
                }
            }
        }
    }
}

#[test]
fn usage_errors_exit_2_and_unknown_boxes_exit_1() {
    let out = charly().args(["box", "frobnicate"]).output().expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let out = charly()
        .arg("-C")
        .arg(corpus())
        .args(["box", "plan", "jupytr"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("did you mean jupyter"));
    assert!(out.stdout.is_empty(), "nothing for people on stdout");
}

#[test]
fn generate_stdout_prints_only_the_containerfile() {
    let out = charly()
        .arg("-C")
        .arg(corpus())
        .args(["box", "generate", "redis", "--stdout"])
        .output()
        .expect("runs");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("# .build/redis/Containerfile (generated by charly"));
    assert!(text.contains("FROM ${BASE_IMAGE}"));
}
