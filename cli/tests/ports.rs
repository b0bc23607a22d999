//! Port protocols (issue 18, finding 12): `https+insecure:3000` (a candy of
//! the full public project) was refused by `validate`. Every protocol of the
//! original's schema syntax `[a-z+-]+:N` parses; the known ones are silent,
//! an unknown one is a located warning naming the known list; every one but
//! `udp` (and `sctp`) is published over TCP.

use assert_cmd::Command;
use std::path::Path;

fn project(ports: &str) -> tempfile::TempDir {
    let t = tempfile::tempdir().expect("tmp");
    let files = [
        (
            "charly.yml",
            "version: 2026.160.1301\ndiscover: [box, candy]\ndefaults:\n  build: [rpm]\n".to_string(),
        ),
        (
            "box/b/charly.yml",
            "box:\n  name: b\n  version: 1.0.0\n  base: quay.io/fedora/fedora:43\n  distro: [fedora]\n  candy: [a]\n".to_string(),
        ),
        (
            "candy/a/charly.yml",
            format!("candy:\n  version: 1.0.0\n  package: [curl]\n  port: {ports}\n"),
        ),
    ];
    for (path, body) in files {
        let p = t.path().join(path);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, body).expect("write");
    }
    t
}

fn charly(dir: &Path, store: &Path, args: &[&str]) -> std::process::Output {
    Command::cargo_bin("charly")
        .expect("binary")
        .env("NO_COLOR", "1")
        .env("CHARLY_CACHE_DIR", store)
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .expect("runs")
}

fn validate(dir: &Path) -> (Option<i32>, serde_json::Value) {
    let store = tempfile::tempdir().expect("store");
    let out = charly(dir, store.path(), &["validate", "--json"]);
    let v = serde_json::from_slice(&out.stdout).expect("JSON");
    (out.status.code(), v)
}

#[test]
fn the_originals_protocols_validate_and_reach_expose() {
    let t = project(
        r#"["https+insecure:3000", "http:8080", "https:8443", "tcp:2222", "udp:5353", 9000]"#,
    );
    let (code, v) = validate(t.path());
    assert_eq!(code, Some(0), "{v:#}");
    assert!(
        !v["warnings"]
            .as_array()
            .expect("warnings")
            .iter()
            .any(|w| w["message"].as_str().unwrap_or("").contains("port")),
        "{v:#}"
    );
    let store = tempfile::tempdir().expect("store");
    let out = charly(
        t.path(),
        store.path(),
        &["box", "generate", "b", "--stdout", "--no-journal"],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let expose: Vec<&str> = text.lines().filter(|l| l.starts_with("EXPOSE ")).collect();
    assert_eq!(
        expose,
        [
            "EXPOSE 2222",
            "EXPOSE 3000",
            "EXPOSE 5353/udp",
            "EXPOSE 8080",
            "EXPOSE 8443",
            "EXPOSE 9000"
        ],
        "{text}"
    );
    assert!(
        !text.contains("insecure"),
        "the protocol is no token: {text}"
    );
}

#[test]
fn an_unknown_protocol_is_a_located_warning_and_a_bad_port_an_error() {
    let t = project(r#"["udpp:3000"]"#);
    let (code, v) = validate(t.path());
    assert_eq!(code, Some(0), "{v:#}");
    let w = v["warnings"]
        .as_array()
        .expect("warnings")
        .iter()
        .find(|w| {
            w["message"]
                .as_str()
                .unwrap_or("")
                .contains("unknown port protocol `udpp`")
        })
        .unwrap_or_else(|| panic!("no warning: {v:#}"));
    assert_eq!(w["file"], "candy/a/charly.yml");
    assert_eq!(w["line"], 4);
    assert!(
        w["message"]
            .as_str()
            .unwrap_or("")
            .contains("http, https, https+insecure, tcp, udp"),
        "{w}"
    );
    assert_eq!(w["hint"], "did you mean `udp`?");
    for bad in ["tcp:+80", "TCP:80", "tcp:0", "tcp:65536", "a b:1"] {
        let t = project(&format!("[\"{bad}\"]"));
        let (code, v) = validate(t.path());
        assert_eq!(code, Some(1), "{bad}: {v:#}");
        let errors = v["errors"].as_array().expect("errors");
        assert!(
            errors.iter().any(|e| e["file"] == "candy/a/charly.yml"
                && e["line"] == 4
                && e["message"]
                    .as_str()
                    .unwrap_or("")
                    .contains("must be a number 1-65535")),
            "{bad}: {errors:#?}"
        );
    }
}

/// A port the emitters cannot read is refused at load by every command, not
/// only by `validate`: before, `box generate` dropped its `EXPOSE` without a
/// word (found by the injection property test with `port: "a"`).
#[test]
fn generate_refuses_a_bad_port_at_its_location() {
    let t = project(r#"["http"]"#);
    let store = tempfile::tempdir().expect("store");
    let out = charly(
        t.path(),
        store.path(),
        &["box", "generate", "b", "--stdout", "--no-journal"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        err.contains("port `http` must be a number 1-65535")
            && err.contains("candy/a/charly.yml:4"),
        "{err}"
    );
}
