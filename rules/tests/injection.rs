//! Issue 18, finding 3: no value of a candy or a box can add an instruction
//! to a generated Containerfile, a line to a quadlet unit, or a key to a
//! kustomize file.
//!
//! A property test puts arbitrary strings (line breaks of every kind, `\`,
//! quotes, `$`, `#`, control characters) into one free-text field at a time
//! of a small project. Either the loader refuses the value (an error at
//! file:line:col, so no command uses the project), or the outputs parse back
//! with exactly the structure they have when the field holds a plain value
//! of the same shape: the same instruction keywords in the same order (a
//! small Containerfile tokenizer that understands comments and `\`
//! continuations, as buildah 1.28 has no heredocs), every unit line a
//! `[Section]`, comment or `Key=Value`, every YAML value reading back as the
//! original.

use charly_rules::emit::containerfile::default_image_ref;
use charly_rules::emit::kustomize::{KustomizeOptions, render_kustomize};
use charly_rules::emit::quadlet::{QuadletOptions, render_quadlet};
use charly_rules::emit::{EmitOptions, render_box};
use charly_rules::load::{self, LoadOptions};
use charly_rules::plan::{HostContext, Target, build_box_plans, build_merged_plan};
use charly_rules::resolve;
use proptest::prelude::*;
use std::path::Path;

const ROOT: &str = "version: 2026.160.1301\ndiscover:\n    - box\n    - candy\ndefaults:\n    base: debian:12\n    distro:\n        - debian:12\n        - debian\n    build:\n        - deb\n";

/// The fields under test: name, and how the value is placed (`{}` is the
/// YAML double-quoted value).
const FIELDS: [(&str, &str); 19] = [
    ("description", "candy"),
    ("env value", "candy"),
    ("var value", "candy"),
    ("cmd", "candy"),
    ("write content", "candy"),
    ("write path", "candy"),
    ("mkdir path", "candy"),
    ("link target", "candy"),
    ("download url", "candy"),
    ("download env", "candy"),
    ("path_append", "candy"),
    ("package", "candy"),
    ("volume path", "candy"),
    ("shell init", "candy"),
    ("port", "candy"),
    ("service exec", "candy"),
    ("service env", "candy"),
    ("box description", "box"),
    ("box env", "box"),
];

/// A YAML double-quoted scalar that reads back as exactly `s`.
fn yq(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_ascii_graphic() || c == ' ' => out.push(c),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push('"');
    out
}

/// The candy and box manifests with `field` set to `v` and every other field
/// plain.
fn manifests(field: &str, v: &str) -> (String, String) {
    let f = |name: &str, plain: &str| {
        if name == field { yq(v) } else { yq(plain) }
    };
    let candy = format!(
        "candy:
    version: 2026.1.1
    description: {desc}
    package:
        - {pkg}
    env:
        GREETING: {envv}
    var:
        MYVAR: {varv}
    path_append:
        - {pa}
    port:
        - {port}
    task:
        - cmd: {cmd}
        - write: {wpath}
          mode: \"0644\"
          content: {content}
        - mkdir: {mkdir}
        - link: /opt/c/link
          target: {target}
        - download: {url}
          to: /opt/c/dl
          env:
              K: {tenv}
    volume:
        - name: data
          path: {volp}
    shell:
        init: {init}
    require:
        - supervisord
    service:
        - name: svc
          exec: {exec}
          env:
              SV: {senv}
",
        desc = f("description", "a candy"),
        pkg = f("package", "curl"),
        envv = f("env value", "hello"),
        varv = f("var value", "x"),
        pa = f("path_append", "/opt/c/bin"),
        port = f("port", "8080"),
        cmd = f("cmd", "echo hi"),
        wpath = f("write path", "/opt/c/file"),
        content = f("write content", "text"),
        mkdir = f("mkdir path", "/opt/c/dir"),
        target = f("link target", "/opt/c/file"),
        url = f("download url", "https://example.invalid/x"),
        tenv = f("download env", "v"),
        volp = f("volume path", "/data"),
        init = f("shell init", "echo init"),
        exec = f("service exec", "/usr/bin/svc --flag"),
        senv = f("service env", "v"),
    );
    let bx = format!(
        "box:
    name: b
    description: {desc}
    env:
        - {env}
    candy:
        - c
",
        desc = f("box description", "a box"),
        env = if field == "box env" {
            yq(&format!("BE={v}"))
        } else {
            yq("BE=1")
        },
    );
    (candy, bx)
}

/// What a project turned into: refused at load, or its outputs.
#[derive(Debug)]
enum Outcome {
    /// Refused: where each error points (project-relative file, line).
    Refused(Vec<(String, u32)>),
    Emitted {
        containerfile: String,
        quadlet: String,
        kustomize: Vec<(String, String)>,
    },
}

fn run(dir: &Path, field: &str, v: &str) -> Outcome {
    let _ = std::fs::remove_dir_all(dir);
    let (candy, bx) = manifests(field, v);
    for (rel, text) in [
        ("charly.yml", ROOT.to_string()),
        (
            "candy/supervisord/charly.yml",
            "candy:\n    version: 2026.1.1\n    package:\n        - supervisor\n".to_string(),
        ),
        ("candy/c/charly.yml", candy),
        ("box/b/charly.yml", bx),
    ] {
        let f = dir.join(rel);
        std::fs::create_dir_all(f.parent().expect("parent")).expect("mkdir");
        std::fs::write(f, text).expect("write");
    }
    let p = load::load(dir, &LoadOptions::default()).expect("loads");
    if p.diags.iter().any(|d| d.is_error()) {
        return Outcome::Refused(
            p.diags
                .iter()
                .filter(|d| d.is_error())
                .filter_map(|d| d.span.map(|s| (p.sources.rel(s.file).to_string(), s.line)))
                .collect(),
        );
    }
    let r = resolve::resolve(&p);
    let b = r
        .get("b")
        .unwrap_or_else(|| panic!("{field}={v:?}: {:?}", r.boxes.get("b")));
    let mut plans = build_box_plans(&p, b, &HostContext::default()).expect("plans");
    for plan in &mut plans {
        plan.resolve_home(&b.user.home);
    }
    let opts = EmitOptions {
        image_refs: [("b".to_string(), default_image_ref("b", &b.version))].into(),
        ..EmitOptions::default()
    };
    let dir_out = render_box(&p, b, &plans, &opts).expect("renders");
    let containerfile = dir_out.containerfile;
    // Service fragments (supervisord INI) are checked like units.
    let mut fragments = String::new();
    for (path, f) in &dir_out.files {
        if path.contains("/supervisor/")
            && let charly_rules::emit::Staged::Bytes(bytes) = f
        {
            fragments.push_str(&String::from_utf8_lossy(bytes));
        }
    }
    let plan = |target| {
        let ctx = HostContext {
            target,
            ..HostContext::default()
        };
        build_merged_plan(&p, b, &ctx, &[]).expect("plan")
    };
    let quadlet = render_quadlet(&p, b, &plan(Target::Pod), &QuadletOptions::default())
        .map(|q| q.text)
        .unwrap_or_else(|e| format!("# refused: {e}\n").replace('\n', " ") + "\n")
        + &fragments;
    let kustomize = render_kustomize(&p, b, &plan(Target::K8s), &KustomizeOptions::default())
        .map(|k| k.files.into_iter().collect())
        .unwrap_or_default();
    Outcome::Emitted {
        containerfile,
        quadlet,
        kustomize,
    }
}

/// The instructions of a Containerfile: (keyword, logical line). Comments and
/// blank lines are skipped (also inside a continuation, as buildah does); a
/// line ending in `\` continues on the next.
fn instructions(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut cur: Option<String> = None;
    for line in text.split('\n') {
        let t = line.trim();
        if t.starts_with('#') || (t.is_empty() && cur.is_none()) {
            continue;
        }
        let (body, more) = match t.strip_suffix('\\') {
            Some(b) => (b, true),
            None => (t, false),
        };
        let logical = match cur.take() {
            Some(mut c) => {
                c.push_str(body);
                c
            }
            None => body.to_string(),
        };
        if more {
            cur = Some(logical);
        } else if !logical.trim().is_empty() {
            let kw = logical
                .split_whitespace()
                .next()
                .unwrap_or("")
                .to_ascii_uppercase();
            out.push((kw, logical));
        }
    }
    assert!(cur.is_none(), "a continuation runs off the end:\n{text}");
    out
}

const KEYWORDS: [&str; 17] = [
    "FROM",
    "RUN",
    "COPY",
    "ADD",
    "ENV",
    "ARG",
    "LABEL",
    "USER",
    "WORKDIR",
    "EXPOSE",
    "ENTRYPOINT",
    "CMD",
    "SHELL",
    "VOLUME",
    "STOPSIGNAL",
    "HEALTHCHECK",
    "ONBUILD",
];

/// Every line of a unit (or a supervisord INI fragment) is a section header,
/// a comment, blank, or `Key=Value` with a plain key; returns the keys in
/// order.
fn unit_keys(text: &str) -> Vec<String> {
    let mut keys = Vec::new();
    for line in text.lines() {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if line.starts_with('[') && line.ends_with(']') {
            keys.push(line.to_string());
            continue;
        }
        let (k, _) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("not Key=Value: {line:?}\n{text}"));
        assert!(
            !k.is_empty() && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'),
            "bad key {k:?} in {text}"
        );
        keys.push(k.to_string());
    }
    keys
}

/// The YAML keys of every document of every file, parsed back.
fn yaml_shape(files: &[(String, String)]) -> Vec<String> {
    fn walk(n: &charly_rules::yaml::Node, path: &str, out: &mut Vec<String>) {
        if let Some(m) = n.as_map() {
            for (k, v) in m {
                let p = format!("{path}.{}", k.as_str().unwrap_or("?"));
                out.push(p.clone());
                walk(v, &p, out);
            }
        } else if let Some(s) = n.as_seq() {
            for (i, v) in s.iter().enumerate() {
                walk(v, &format!("{path}[{i}]"), out);
            }
        }
    }
    let mut out = Vec::new();
    for (name, text) in files {
        let docs = charly_rules::yaml::parse_stream(charly_rules::FileId(0), text)
            .unwrap_or_else(|d| panic!("{name} does not parse back: {d:?}\n{text}"));
        for d in docs {
            walk(&d, name, &mut out);
        }
    }
    out
}

/// A plain value with the shape of `s`: `/` kept, everything else `a`.
fn plain_like(s: &str) -> String {
    s.chars()
        .map(|c| if c == '/' { '/' } else { 'a' })
        .collect()
}

/// The manifest `field` is in, and its text with `v` in the field.
fn field_file(field: &str, v: &str) -> (&'static str, String) {
    let (candy, bx) = manifests(field, v);
    match FIELDS.iter().find(|(f, _)| *f == field) {
        Some((_, "box")) => ("box/b/charly.yml", bx),
        _ => ("candy/c/charly.yml", candy),
    }
}

fn same_structure(dir: &Path, field: &str, v: &str) -> Result<bool, TestCaseError> {
    let hostile = run(dir, field, v);
    let (containerfile, quadlet, kustomize) = match hostile {
        Outcome::Emitted {
            containerfile,
            quadlet,
            kustomize,
        } => (containerfile, quadlet, kustomize),
        Outcome::Refused(errors) => {
            // A refusal is an error at the value's line, in its file.
            let (file, text) = field_file(field, v);
            let inner = yq(v);
            let inner = &inner[1..inner.len() - 1];
            let lines: Vec<u32> = (1..)
                .zip(text.lines())
                .filter(|(_, l)| l.contains(inner))
                .map(|(n, _)| n)
                .collect();
            prop_assert!(
                errors.iter().any(|(f, l)| f == file && lines.contains(l)),
                "{}={:?} was refused without an error at its line ({} {:?}): {:?}",
                field,
                v,
                file,
                lines,
                errors
            );
            return Ok(false);
        }
    };
    let plain = plain_like(v);
    let Outcome::Emitted {
        containerfile: c0,
        quadlet: q0,
        kustomize: k0,
    } = run(dir, field, &plain)
    else {
        // The plain twin is refused while the hostile one is not: compare
        // the hostile output with itself only.
        let ins = instructions(&containerfile);
        for (kw, line) in &ins {
            prop_assert!(KEYWORDS.contains(&kw.as_str()), "{field}={v:?}: {line}");
        }
        unit_keys(&quadlet);
        yaml_shape(&kustomize);
        return Ok(true);
    };
    let a: Vec<String> = instructions(&containerfile)
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    let b: Vec<String> = instructions(&c0).into_iter().map(|(k, _)| k).collect();
    for kw in &a {
        prop_assert!(KEYWORDS.contains(&kw.as_str()), "{field}={v:?}: {kw}");
    }
    prop_assert_eq!(
        &a,
        &b,
        "{}={:?} changed the instructions:\n{}\n---- plain ----\n{}",
        field,
        v,
        containerfile,
        c0
    );
    prop_assert_eq!(unit_keys(&quadlet), unit_keys(&q0), "{}={:?}", field, v);
    prop_assert_eq!(yaml_shape(&kustomize), yaml_shape(&k0), "{}={:?}", field, v);
    Ok(true)
}

/// Strings made of the characters that matter to the three syntaxes.
fn hostile() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("\n".to_string()),
        Just("\r".to_string()),
        Just("\r\n".to_string()),
        Just("\\".to_string()),
        Just("\\\n".to_string()),
        Just("\"".to_string()),
        Just("'".to_string()),
        Just("$".to_string()),
        Just("${PATH}".to_string()),
        Just("#".to_string()),
        Just("%".to_string()),
        Just(" ".to_string()),
        Just("\t".to_string()),
        Just("=".to_string()),
        Just("\u{b}".to_string()),
        Just("\u{c}".to_string()),
        Just("\u{1b}".to_string()),
        Just("\u{7f}".to_string()),
        Just("\u{85}".to_string()),
        Just("\u{2028}".to_string()),
        Just("\u{2029}".to_string()),
        Just("RUN touch /pwned".to_string()),
        Just("\nRUN touch /pwned".to_string()),
        Just("[Service]\nExecStart=/bin/sh".to_string()),
        Just("key: value".to_string()),
        Just("- item".to_string()),
        "[a-z0-9/._-]{1,6}",
        "\\PC{1,4}",
    ];
    proptest::collection::vec(piece, 1..6).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Each string goes through every field in turn.
    #[test]
    fn no_field_adds_an_instruction(v in hostile()) {
        let t = tempfile::tempdir().expect("tempdir");
        let dir = t.path().join("p");
        for (field, _) in FIELDS {
            same_structure(&dir, field, &v)?;
        }
    }
}

/// The free-text fields take line breaks and come out escaped, not refused:
/// the property above is not satisfied by refusing everything.
#[test]
fn free_text_with_line_breaks_is_escaped_not_refused() {
    let t = tempfile::tempdir().expect("tempdir");
    let dir = t.path().join("p");
    for field in [
        "description",
        "env value",
        "var value",
        "cmd",
        "write content",
        "shell init",
        "box description",
    ] {
        for v in [
            "A=1\nRUN touch /pwned-key",
            "x\r\nRUN touch /pwned",
            "a\\\nRUN touch /pwned\\",
            "\u{2028}RUN x\u{85}#\u{1b}",
        ] {
            let accepted = same_structure(&dir, field, v).expect("same structure");
            assert!(accepted, "{field}={v:?} was refused");
        }
    }
}

/// Identifiers and single tokens with a line break are refused at load.
#[test]
fn tokens_with_line_breaks_are_refused() {
    let t = tempfile::tempdir().expect("tempdir");
    let dir = t.path().join("p");
    for field in [
        "write path",
        "mkdir path",
        "link target",
        "download url",
        "download env",
        "path_append",
        "package",
        "volume path",
        "port",
        "service exec",
        "service env",
    ] {
        let v = "/opt/x\nRUN touch /pwned";
        assert!(
            !same_structure(&dir, field, v).expect("refused at the value's line"),
            "{field}={v:?} was accepted"
        );
    }
}
