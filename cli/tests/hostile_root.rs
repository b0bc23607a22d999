//! A hostile or broken root `charly.yml` or vocabulary file (`build.yml`,
//! `charly/build.yml`) is reported with file:line:col and exit 1, by
//! `validate` and by the commands that act on the project, and never panics
//! (issue 18, finding 1: a parse error in the root file used to panic the
//! loader at `namespaces[0]`, exit 101).

use assert_cmd::Command;
use std::path::Path;

const VERSION: &str = "version: 2026.160.1301\n";
const BOX: &[u8] = b"box:\n  name: b\n  version: 1.0.0\n  base: quay.io/fedora/fedora:43\n  distro: [fedora]\n  candy: [a]\n";
const CANDY: &[u8] = b"candy:\n  version: 1.0.0\n  package: [curl]\n";

/// One hostile variant: its name, the file's bytes, and the line an error
/// must name (`None`: any line).
struct Variant {
    name: &'static str,
    bytes: Vec<u8>,
    line: Option<usize>,
}

fn variants() -> Vec<Variant> {
    let v = |name, bytes: &[u8], line| Variant {
        name,
        bytes: bytes.to_vec(),
        line: Some(line),
    };
    let mut deep_flow = VERSION.as_bytes().to_vec();
    deep_flow.extend_from_slice(b"x: ");
    deep_flow.extend(std::iter::repeat_n(b'[', 100_000));
    deep_flow.push(b'\n');
    let mut deep_block = VERSION.as_bytes().to_vec();
    deep_block.extend_from_slice(b"x:\n");
    deep_block.extend(std::iter::repeat_n(*b"- ", 100_000).flatten());
    deep_block.extend_from_slice(b"x\n");
    let mut big = VERSION.as_bytes().to_vec();
    big.extend_from_slice(b"x: ");
    big.extend(std::iter::repeat_n(b'a', 20_000_000));
    big.push(b'\n');
    let mut bomb = format!("{VERSION}a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..=10 {
        let p = i - 1;
        let refs = vec![format!("*a{p}"); 10].join(", ");
        bomb.push_str(&format!("a{i}: &a{i} [{refs}]\n"));
    }
    vec![
        v("parse error", b"version: 2026.160.1301\nfoo: [\n", 3),
        v(
            "duplicate key",
            b"version: 2026.160.1301\nversion: 2026.160.1301\n",
            2,
        ),
        v(
            "tab indentation",
            b"version: 2026.160.1301\ndefaults:\n\tbuild: [rpm]\n",
            3,
        ),
        // Encoding problems point at the first bad byte.
        v("NUL bytes", b"version: 2026.160.1301\nfoo: a\0b\n", 2),
        v(
            "invalid UTF-8",
            b"version: 2026.160.1301\nfoo: \xff\xfebar\n",
            2,
        ),
        v(
            "binary file",
            b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03\xcbH\xcd\xc9\xc9W(\xcf/\xcaI\xe1\x02\x00",
            1,
        ),
        Variant {
            name: "20 MB scalar",
            bytes: big,
            line: Some(1),
        },
        Variant {
            name: "100k-deep flow nesting",
            bytes: deep_flow,
            line: Some(2),
        },
        Variant {
            name: "100k-deep block nesting",
            bytes: deep_block,
            line: Some(3),
        },
        Variant {
            name: "alias bomb",
            bytes: bomb.into_bytes(),
            // Wherever the expansion passes the parser's node limit.
            line: None,
        },
        v("empty file", b"", 1),
        v("a YAML list", b"- version\n- 2026.160.1301\n", 1),
        v("a YAML scalar", b"just a scalar\n", 1),
        v(
            "a wrong shape",
            b"version: 2026.160.1301\ndefaults: [1, 2]\n",
            2,
        ),
    ]
}

fn charly(dir: &Path, store: &Path) -> Command {
    let mut c = Command::cargo_bin("charly").expect("binary");
    c.env("NO_COLOR", "1")
        .env("CHARLY_CACHE_DIR", store)
        .arg("-C")
        .arg(dir);
    c
}

/// A project with one box and one candy, plus `files` (which may replace
/// the root file).
fn project(files: &[(&str, &[u8])]) -> tempfile::TempDir {
    let t = tempfile::tempdir().expect("tmp");
    let base: &[(&str, &[u8])] = &[
        (
            "charly.yml",
            b"version: 2026.160.1301\ndiscover: [box, candy]\ndefaults:\n  build: [rpm]\n",
        ),
        ("box/b/charly.yml", BOX),
        ("candy/a/charly.yml", CANDY),
    ];
    for (path, body) in base.iter().chain(files) {
        let p = t.path().join(path);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, body).expect("write");
    }
    t
}

/// Runs `args` and checks: exit 1, no panic, and `file:LINE:COL` on stderr.
fn refused(dir: &Path, args: &[&str], file: &str, line: Option<usize>, what: &str) {
    let store = tempfile::tempdir().expect("store");
    let out = charly(dir, store.path()).args(args).output().expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{what}: `charly {}` must exit 1\n{err}",
        args.join(" ")
    );
    for bad in ["panicked", "internal error", "RUST_BACKTRACE"] {
        assert!(!err.contains(bad), "{what}: {bad}\n{err}");
    }
    // `file:LINE:COL` (miette prints `[file:LINE:COL]` over the source).
    let loc = format!("{file}:");
    let located = err.match_indices(&loc).any(|(i, _)| {
        let rest = &err[i + loc.len()..];
        let mut parts = rest.splitn(3, ':');
        let l = parts.next().unwrap_or("");
        let c = parts.next().unwrap_or("");
        let c: String = c.chars().take_while(char::is_ascii_digit).collect();
        l.parse::<usize>()
            .is_ok_and(|l| line.is_none_or(|want| l == want))
            && !c.is_empty()
    });
    assert!(
        located,
        "{what}: `charly {}` names no {file}:{line:?}:COL\n{err}",
        args.join(" ")
    );
}

/// `validate --json`: an error is in `file` at `line`.
fn json_error(dir: &Path, file: &str, line: Option<usize>, what: &str) {
    let store = tempfile::tempdir().expect("store");
    let out = charly(dir, store.path())
        .args(["validate", "--json"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(1), "{what}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let errors = v["errors"].as_array().expect("errors");
    assert!(
        errors.iter().any(|e| e["file"] == file
            && e["line"]
                .as_u64()
                .is_some_and(|l| line.is_none_or(|want| l == want as u64))
            && e["column"].as_u64() >= Some(1)),
        "{what}: no error at {file}:{line:?} in {errors:#?}"
    );
}

#[test]
fn a_hostile_root_file_is_reported_never_a_panic() {
    for v in variants() {
        let t = project(&[("charly.yml", &v.bytes)]);
        let what = format!("root charly.yml, {}", v.name);
        json_error(t.path(), "charly.yml", v.line, &what);
        for args in [
            &["validate"][..],
            &["box", "list"],
            &["box", "generate", "--all", "--no-journal"],
            &["candy", "list"],
        ] {
            refused(t.path(), args, "charly.yml", v.line, &what);
        }
        assert!(
            !t.path().join(".build").exists(),
            "{what}: generate wrote output for a broken project"
        );
    }
}

#[test]
fn a_hostile_vocabulary_file_is_reported_never_a_panic() {
    for file in ["build.yml", "charly/build.yml"] {
        for v in variants() {
            // An empty vocabulary file defines nothing and is only a warning.
            if v.name == "empty file" {
                continue;
            }
            let what = format!("{file}, {}", v.name);
            let t = project(&[(file, &v.bytes)]);
            json_error(t.path(), file, v.line, &what);
            for args in [
                &["validate"][..],
                &["box", "list"],
                &["box", "generate", "--all", "--no-journal"],
            ] {
                refused(t.path(), args, file, v.line, &what);
            }
        }
    }
}

#[test]
fn an_empty_vocabulary_file_is_a_warning() {
    let t = project(&[("build.yml", b"")]);
    let store = tempfile::tempdir().expect("store");
    let out = charly(t.path(), store.path())
        .args(["validate", "--json"])
        .output()
        .expect("runs");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(
        v["warnings"]
            .as_array()
            .expect("warnings")
            .iter()
            .any(|w| w["file"] == "build.yml" && w["line"] == 1),
        "{v:#}"
    );
    assert_eq!(out.status.code(), Some(0), "{v:#}");
}
