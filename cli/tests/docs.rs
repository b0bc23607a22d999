//! docs/format.md cannot drift from the loader: every field its tables
//! document is known where it is documented (a manifest using it loads
//! without an "unknown field" warning), and a made-up field is not.

use charly_rules::load::{LoadOptions, load};
use std::collections::BTreeMap;
use std::path::Path;

/// `<!-- fields: CONTEXT -->` → the names in the first column of the table
/// that follows (`a`, or `a`, `b`, … in one cell).
fn documented() -> BTreeMap<String, Vec<String>> {
    let text = std::fs::read_to_string(charly_testutil::workspace().join("docs/format.md"))
        .expect("docs/format.md");
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut context: Option<String> = None;
    for line in text.lines() {
        if let Some(c) = line
            .strip_prefix("<!-- fields: ")
            .and_then(|r| r.strip_suffix(" -->"))
        {
            context = Some(c.to_string());
            continue;
        }
        let Some(c) = &context else { continue };
        if !line.starts_with('|') {
            if !line.trim().is_empty() {
                context = None;
            }
            continue;
        }
        let cell = line.split('|').nth(1).unwrap_or("");
        for name in cell.split(',') {
            if let Some(n) = name
                .trim()
                .strip_prefix('`')
                .and_then(|n| n.strip_suffix('`'))
            {
                out.entry(c.clone()).or_default().push(n.to_string());
            }
        }
    }
    out
}

/// The text of a manifest of `context` that sets `field` (and what else
/// it needs to be that kind of document), with its path.
fn manifest(context: &str, field: &str) -> (&'static str, String) {
    match context {
        "root" => (
            "charly.yml",
            format!("version: 2026.160.1301\n{field}: ~\n"),
        ),
        "box" => (
            "box/b/charly.yml",
            format!("box:\n    name: b\n    base: x\n    {field}: ~\n"),
        ),
        "candy" => ("candy/c/charly.yml", format!("candy:\n    {field}: ~\n")),
        "task" => (
            "candy/c/charly.yml",
            format!("candy:\n    version: 1.0.0\n    task:\n        - {field}: ~\n"),
        ),
        "service" => (
            "candy/c/charly.yml",
            format!("candy:\n    version: 1.0.0\n    service:\n        - {field}: ~\n"),
        ),
        "shell" => (
            "candy/c/charly.yml",
            format!("candy:\n    version: 1.0.0\n    shell:\n        {field}: ~\n"),
        ),
        // The node form (schema 2026.174): a data child, a run step.
        "node-candy" => (
            "candy/c/charly.yml",
            format!(
                "c:\n    candy:\n        version: 2026.174.1100\n        description: x\n    c-f:\n        {field}: ~\n"
            ),
        ),
        "node-run" => (
            "candy/c/charly.yml",
            format!(
                "c:\n    candy:\n        version: 2026.174.1100\n        description: x\n    c-s:\n        run: x\n        mkdir: /x\n        {field}: ~\n"
            ),
        ),
        c => panic!("docs/format.md documents fields of `{c}`, which this test cannot check"),
    }
}

/// The loader's "unknown field" diagnostics for `field` in `context`.
fn unknown(dir: &Path, context: &str, field: &str) -> Vec<String> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).expect("mkdir");
    let (rel, text) = manifest(context, field);
    if rel != "charly.yml" {
        std::fs::write(
            dir.join("charly.yml"),
            if context.starts_with("node-") {
                "version: 2026.174.1100\ndiscover: [box, candy]\n"
            } else {
                "version: 2026.160.1301\ndiscover: [box, candy]\n"
            },
        )
        .expect("root");
    }
    let path = dir.join(rel);
    std::fs::create_dir_all(path.parent().expect("dir")).expect("mkdir");
    std::fs::write(&path, text).expect("manifest");
    let p = load(dir, &LoadOptions::default()).expect("loads");
    p.diags
        .iter()
        .map(|d| d.message.clone())
        .filter(|m| m.contains(&format!("`{field}`")) && m.contains("unknown"))
        .collect()
}

#[test]
fn every_documented_field_is_known_to_the_loader() {
    let docs = documented();
    for c in [
        "root", "box", "candy", "task", "service", "shell", "settings",
    ] {
        assert!(docs.get(c).is_some_and(|f| f.len() > 3), "{c}: {docs:?}");
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("p");
    for (context, fields) in &docs {
        if context == "settings" {
            continue;
        }
        // The check can fail: a made-up field is reported.
        assert!(
            !unknown(&dir, context, "made_up_field").is_empty(),
            "{context}: a made-up field is not reported"
        );
        for f in fields {
            let u = unknown(&dir, context, f);
            assert!(
                u.is_empty(),
                "{context}.{f} is documented but unknown: {u:?}"
            );
        }
    }
}

#[test]
fn every_documented_setting_is_read() {
    let docs = documented();
    let tmp = tempfile::tempdir().expect("tmp");
    let project = charly_testutil::copy_project(&charly_testutil::example(), &tmp.path().join("p"));
    let settings = project.join(".charly/settings.yml");
    let run = |text: &str| {
        std::fs::write(&settings, text).expect("settings");
        let out = std::process::Command::new(assert_cmd::cargo::cargo_bin("charly"))
            .env("XDG_CONFIG_HOME", tmp.path().join("config"))
            .env("CHARLY_CACHE_DIR", tmp.path().join("store"))
            .arg("-C")
            .arg(&project)
            .args(["box", "list"])
            .output()
            .expect("runs");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(run("made_up_field: 1\n").contains("unknown field `made_up_field`"));
    for f in &docs["settings"] {
        let err = run(&format!("{f}: ~\n"));
        assert!(!err.contains("unknown field"), "{f}: {err}");
    }
}

/// Every combination of the alternatives of a subcommand path
/// (`cache stats|gc` → `cache stats`, `cache gc`).
fn combinations(path: &[Vec<String>]) -> Vec<Vec<String>> {
    let mut combos: Vec<Vec<String>> = vec![Vec::new()];
    for choices in path {
        combos = combos
            .iter()
            .flat_map(|c| {
                choices.iter().map(move |x| {
                    let mut c = c.clone();
                    c.push(x.clone());
                    c
                })
            })
            .collect();
    }
    combos
}

/// `charly ARGS --help`, which must succeed.
fn help(args: &[String]) -> String {
    let out = assert_cmd::Command::cargo_bin("charly")
        .expect("binary")
        .args(args)
        .arg("--help")
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "`charly {} --help`: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The README's Commands block is the binary's: every command line of it
/// (each ` | ` alternative on its own) names a subcommand whose `--help`
/// works, and every `--flag` the line shows is taken by that subcommand
/// (one of them, for `build|generate|check`) or by charly itself. A usage
/// error in a command a newcomer copies fails here first.
#[test]
fn readme_commands_match_the_binary() {
    let readme =
        std::fs::read_to_string(charly_testutil::workspace().join("README.md")).expect("README.md");
    let block = readme
        .split("## Commands")
        .nth(1)
        .and_then(|r| r.split("```sh\n").nth(1))
        .and_then(|r| r.split("```").next())
        .expect("a ```sh block under ## Commands");
    // Continuation lines (indented) belong to the line above.
    let mut lines: Vec<String> = Vec::new();
    for l in block.lines() {
        let l = l.split(" # ").next().unwrap_or("").trim_end();
        if l.starts_with(' ') {
            if let Some(last) = lines.last_mut() {
                last.push(' ');
                last.push_str(l.trim());
            }
        } else if !l.is_empty() {
            lines.push(l.to_string());
        }
    }
    let top = help(&[]);
    let mut checked = 0;
    for line in &lines {
        let line = line.strip_prefix("charly ").expect("a charly command line");
        for alt in line.split(" | ") {
            let mut words = alt.split_whitespace();
            let mut path: Vec<Vec<String>> = Vec::new();
            while let Some(w) = words.next() {
                // Global options before the subcommand: `[-C DIR]`, `--remote URL`.
                if w.starts_with('[') {
                    let mut w = w;
                    while !w.contains(']') {
                        w = words.next().unwrap_or("]");
                    }
                    continue;
                }
                if w.starts_with('-') {
                    words.next();
                    continue;
                }
                path.push(w.split('|').map(String::from).collect());
                // `box`, `candy`, `cache` and `bundle` take one more word.
                let group = matches!(path[0][0].as_str(), "box" | "candy" | "cache" | "bundle");
                if !group || path.len() == 2 {
                    break;
                }
            }
            assert!(!path.is_empty(), "no subcommand in `{alt}`");
            let flags: Vec<&str> = alt
                .split(|c: char| c.is_whitespace() || matches!(c, '[' | ']' | '|'))
                .filter(|w| w.starts_with("--") && w.len() > 2)
                .map(|w| w.split('=').next().unwrap_or(w))
                .collect();
            let helps: Vec<(Vec<String>, String)> = combinations(&path)
                .into_iter()
                .map(|c| {
                    let h = help(&c);
                    (c, h)
                })
                .collect();
            for f in &flags {
                assert!(
                    top.contains(f) || helps.iter().any(|(_, h)| h.contains(f)),
                    "no `charly {}` takes {f} (README: `{alt}`)",
                    helps
                        .iter()
                        .map(|(c, _)| c.join(" "))
                        .collect::<Vec<_>>()
                        .join("` or `")
                );
            }
            checked += helps.len();
        }
    }
    assert!(checked >= 20, "the block's commands were read: {checked}");
}
