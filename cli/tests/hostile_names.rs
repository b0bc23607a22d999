//! Issue 18, findings 2 and 3: names and keys that would become paths
//! outside the project or Containerfile instructions are refused at load.
//!
//! Each case writes a small project next to a sentinel file and directory,
//! then checks that `charly validate` reports the value at file:line:col
//! with exit 1, and that `box generate --all` refuses (exit 1) without
//! touching anything: the whole temp tree is the same before and after.

use assert_cmd::Command;
use charly_testutil as project_copy;
use project_copy::tree;
use std::path::{Path, PathBuf};

fn charly() -> Command {
    let mut c = Command::cargo_bin("charly").expect("binary");
    c.env("NO_COLOR", "1");
    c
}

const ROOT: &str = "version: 2026.160.1301\ndiscover:\n    - box\n    - candy\ndefaults:\n    base: debian:12\n    distro:\n        - debian:12\n        - debian\n    build:\n        - deb\n";

const CANDY_OK: &str =
    "candy:\n    version: 2026.1.1\n    description: fine\n    package:\n        - curl\n";

/// A temp dir holding `project/` (with `files`), a sentinel file and a
/// sentinel directory next to it.
fn setup(files: &[(&str, &str)]) -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir().expect("tempdir");
    let p = t.path().join("project");
    std::fs::create_dir_all(&p).expect("mkdir");
    std::fs::write(p.join("charly.yml"), ROOT).expect("root");
    for (rel, text) in files {
        let f = p.join(rel);
        std::fs::create_dir_all(f.parent().expect("parent")).expect("mkdir");
        std::fs::write(f, text).expect("write");
    }
    std::fs::write(t.path().join("sentinel"), "keep me").expect("sentinel");
    std::fs::create_dir_all(t.path().join("sentinel-dir")).expect("sentinel dir");
    std::fs::write(t.path().join("sentinel-dir/inside"), "keep me too").expect("sentinel");
    (t, p)
}

/// `validate` exits 1 with `<file>:<line>:<col>` and `needle` on stderr;
/// `box generate --all` exits 1 and changes nothing anywhere in the temp dir.
fn refused(files: &[(&str, &str)], location: &str, needle: &str) {
    let (t, p) = setup(files);
    let out = charly()
        .arg("-C")
        .arg(&p)
        .arg("validate")
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "validate: {err}");
    if !location.contains('\n') {
        assert!(err.contains(location), "no `{location}` in: {err}");
    }
    assert!(err.contains(needle), "no `{needle}` in: {err}");

    let out = charly()
        .arg("-C")
        .arg(&p)
        .args(["validate", "--json"])
        .output()
        .expect("runs");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let errs = v["errors"].as_array().expect("errors");
    let (file, line) = location.split_once(':').expect("file:line");
    let line: u64 = line
        .split(':')
        .next()
        .and_then(|l| l.parse().ok())
        .expect("line");
    assert!(
        errs.iter()
            .any(|e| e["file"] == file && e["line"] == line && e["column"].as_u64().is_some()),
        "{errs:?}"
    );

    let store = tempfile::tempdir().expect("store");
    let before = tree(t.path());
    for args in [
        &["box", "generate", "--all"][..],
        &["box", "list"][..],
        &["box", "plan", "good"][..],
    ] {
        let out = charly()
            .env("CHARLY_CACHE_DIR", store.path())
            .arg("-C")
            .arg(&p)
            .args(args)
            .output()
            .expect("runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: no `{needle}` in: {err}");
        assert_eq!(tree(t.path()), before, "{args:?} changed the tree");
    }
    assert!(!Path::new("/pwned").exists() && !Path::new("/pwned-key").exists());
}

#[test]
fn box_named_dot_dot_never_leaves_the_project() {
    refused(
        &[
            ("candy/ok/charly.yml", CANDY_OK),
            (
                "box/evil/charly.yml",
                "box:\n    name: \"../..\"\n    candy:\n        - ok\n",
            ),
        ],
        "box/evil/charly.yml:2:11",
        "box name `../..`",
    );
}

#[test]
fn box_named_with_a_path_is_refused() {
    refused(
        &[
            ("candy/ok/charly.yml", CANDY_OK),
            (
                "box/evil/charly.yml",
                "box:\n    name: \"../../../../tmp/pwned-box\"\n    candy:\n        - ok\n",
            ),
        ],
        "box/evil/charly.yml:2:11",
        "box name",
    );
}

#[test]
fn box_name_with_a_newline_is_refused() {
    refused(
        &[
            ("candy/ok/charly.yml", CANDY_OK),
            (
                "box/evil/charly.yml",
                "box:\n    name: \"x\\nRUN touch /pwned\"\n    candy:\n        - ok\n",
            ),
        ],
        "box/evil/charly.yml:2:11",
        "box name `x\\nRUN touch /pwned`",
    );
}

#[test]
fn candy_env_key_with_a_newline_is_refused() {
    refused(
        &[
            (
                "candy/ok/charly.yml",
                "candy:\n    version: 2026.1.1\n    description: fine\n    env:\n        \"A=1\\nRUN touch /pwned-key\": x\n",
            ),
            (
                "box/good/charly.yml",
                "box:\n    name: good\n    candy:\n        - ok\n",
            ),
        ],
        "candy/ok/charly.yml:5:9",
        "env key `A=1\\nRUN touch /pwned-key`",
    );
}

#[test]
fn candy_directory_with_a_newline_is_refused() {
    refused(
        &[
            ("candy/evil\nRUN touch pwned/charly.yml", CANDY_OK),
            (
                "box/good/charly.yml",
                "box:\n    name: good\n    candy:\n        - ok\n",
            ),
            ("candy/ok/charly.yml", CANDY_OK),
        ],
        "candy/evil\nRUN touch pwned/charly.yml:1:1",
        "candy name `evil\\nRUN touch pwned`",
    );
}

#[test]
fn a_clean_project_still_generates() {
    let (t, p) = setup(&[
        ("candy/ok/charly.yml", CANDY_OK),
        (
            "box/good/charly.yml",
            "box:\n    name: good\n    candy:\n        - ok\n",
        ),
    ]);
    let out = charly()
        .arg("-C")
        .arg(&p)
        .arg("--cache-dir")
        .arg(t.path().join("store"))
        .args(["box", "generate", "--all", "--no-journal"])
        .output()
        .expect("runs");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(p.join(".build/good/Containerfile").is_file());
}

#[test]
fn vocabulary_paths_and_stage_names_are_refused() {
    refused(
        &[
            ("candy/ok/charly.yml", CANDY_OK),
            (
                "box/good/charly.yml",
                "box:\n    name: good\n    candy:\n        - ok\n",
            ),
            (
                "build.yml",
                "init:\n    evil:\n        model: fragment_assembly\n        fragment_dir: ../../escape\n        stage_name: \"x\\nRUN touch /pwned\"\n",
            ),
        ],
        "build.yml:1:1",
        "fragment_dir `..`",
    );
}

/// A `write:` through `..` is refused by `validate` at file:line:col, and
/// `box generate --all` refuses it without touching anything anywhere.
#[test]
fn write_through_dot_dot_is_refused_at_its_line() {
    let (t, p) = setup(&[
        (
            "candy/evil/charly.yml",
            "candy:\n    version: 2026.1.1\n    description: climbs\n    task:\n        - write: /opt/../../../../tmp/pwned-write\n          content: x\n",
        ),
        (
            "box/good/charly.yml",
            "box:\n    name: good\n    version: 2026.1.1\n    candy:\n        - evil\n",
        ),
    ]);
    let out = charly()
        .arg("-C")
        .arg(&p)
        .arg("validate")
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("candy/evil/charly.yml:5:"),
        "file:line:col: {err}"
    );
    assert!(err.contains("`..`"), "{err}");
    let store = tempfile::tempdir().expect("store");
    let before = tree(t.path());
    let out = charly()
        .env("CHARLY_CACHE_DIR", store.path())
        .arg("-C")
        .arg(&p)
        .args(["box", "generate", "--all"])
        .output()
        .expect("runs");
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(tree(t.path()), before, "nothing changed");
    assert!(!Path::new("/tmp/pwned-write").exists());
}
