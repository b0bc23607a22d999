//! Bad input never panics and always gets a clear, located diagnostic.

use charly_rules::diag::Diagnostic;
use charly_rules::load::{self, LoadOptions, Project};
use charly_rules::resolve;
use std::path::Path;

/// A small project: one fedora box with the given candies.
fn project(files: &[(&str, &[u8])]) -> tempfile::TempDir {
    let t = tempfile::tempdir().expect("tmp");
    let base: &[(&str, &[u8])] = &[(
        "charly.yml",
        b"version: 2026.160.1301\ndiscover: [box, candy]\ndefaults:\n  build: [rpm]\n",
    )];
    for (path, body) in base.iter().chain(files) {
        let p = t.path().join(path);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, body).expect("write");
    }
    t
}

fn all_diags(dir: &Path) -> (Project, Vec<Diagnostic>) {
    let p = load::load(dir, &LoadOptions::default()).expect("loads");
    let r = resolve::resolve(&p);
    let mut d: Vec<Diagnostic> = p.diags.iter().cloned().collect();
    d.extend(charly_rules::validate::validate_candies(&p));
    d.extend(r.diags.iter().cloned());
    for b in r.boxes.values() {
        if let Err(e) = b {
            d.extend(e.iter().cloned());
        }
    }
    (p, d)
}

fn find<'a>(p: &Project, d: &'a [Diagnostic], needle: &str) -> (&'a Diagnostic, String) {
    let hit = d
        .iter()
        .find(|x| x.message.contains(needle))
        .unwrap_or_else(|| {
            panic!(
                "no diagnostic containing {needle:?} in {:#?}",
                d.iter()
                    .map(|x| x.one_line(p.sources_ref()))
                    .collect::<Vec<_>>()
            )
        });
    (hit, hit.one_line(p.sources_ref()))
}

trait Src {
    fn sources_ref(&self) -> &charly_rules::SourceMap;
}
impl Src for Project {
    fn sources_ref(&self) -> &charly_rules::SourceMap {
        &self.sources
    }
}

const BOX: &[u8] = b"box:\n  name: b\n  version: 1.0.0\n  base: quay.io/fedora/fedora:43\n  distro: [fedora]\n  candy: [a]\n";

#[test]
fn malformed_yaml_keeps_the_parser_position() {
    let t = project(&[
        ("box/b/charly.yml", BOX),
        (
            "candy/a/charly.yml",
            b"candy:\n  version: 1.0.0\n  package: [x\n  task: y\n",
        ),
    ]);
    let (p, d) = all_diags(t.path());
    let (hit, line) = find(&p, &d, "YAML syntax error");
    assert!(hit.is_error());
    assert!(line.starts_with("candy/a/charly.yml:"), "{line}");
    // The box then names the candy and the error that kept it from
    // loading, instead of crashing (or calling it unknown).
    let (_, line) = find(&p, &d, "uses candy `a`, which does not load");
    assert!(line.starts_with("box/b/charly.yml:6:11:"), "{line}");
    assert!(
        line.contains("candy/a/charly.yml:4:7: YAML syntax error"),
        "{line}"
    );
}

#[test]
fn wrong_types_are_located() {
    let t = project(&[
        ("box/b/charly.yml", BOX),
        (
            "candy/a/charly.yml",
            b"candy:\n  version: 1.0.0\n  reboot: maybe\n",
        ),
    ]);
    let (p, d) = all_diags(t.path());
    let (_, line) = find(&p, &d, "expected true or false");
    assert!(line.starts_with("candy/a/charly.yml:3:11:"), "{line}");
    let t = project(&[
        ("box/b/charly.yml", BOX),
        (
            "candy/a/charly.yml",
            b"candy:\n  version: 1.0.0\n  package: {x: y}\n",
        ),
    ]);
    let (p, d) = all_diags(t.path());
    let (_, line) = find(&p, &d, "expected a list");
    assert!(line.starts_with("candy/a/charly.yml:3:12:"), "{line}");
}

#[test]
fn require_cycle_names_the_whole_cycle() {
    let t = project(&[
        ("box/b/charly.yml", BOX),
        (
            "candy/a/charly.yml",
            b"candy:\n  version: 1.0.0\n  require: [b]\n  package: [x]\n",
        ),
        (
            "candy/b/charly.yml",
            b"candy:\n  version: 1.0.0\n  require: [c]\n  package: [x]\n",
        ),
        (
            "candy/c/charly.yml",
            b"candy:\n  version: 1.0.0\n  require: [a]\n  package: [x]\n",
        ),
    ]);
    let (p, d) = all_diags(t.path());
    let (_, line) = find(&p, &d, "candy dependency cycle");
    assert!(line.contains("a → b → c → a"), "{line}");
}

#[test]
fn unknown_fields_are_errors_and_distro_keys_warn_with_the_nearest_name() {
    let t = project(&[
        ("box/b/charly.yml", BOX),
        ("candy/a/charly.yml", b"candy:\n  version: 1.0.0\n  pakage: [x]\n  distro:\n    fedroa:\n      package: [y]\n"),
    ]);
    let (p, d) = all_diags(t.path());
    let (w, line) = find(&p, &d, "unknown field `pakage`");
    assert!(w.is_error(), "a misspelt field is an error by default");
    assert!(line.starts_with("candy/a/charly.yml:3:3:"), "{line}");
    let hint = w.hint.as_deref().unwrap_or_default();
    assert!(hint.starts_with("did you mean `package`?"), "{hint}");
    assert!(hint.contains("--allow-unknown-fields"), "{hint}");
    // Allowed, the same field is a warning that says it is ignored.
    let opts = LoadOptions {
        allow_unknown_fields: true,
        ..LoadOptions::default()
    };
    let p = load::load(t.path(), &opts).expect("loads");
    let w = p
        .diags
        .iter()
        .find(|x| x.message.contains("unknown field `pakage`"))
        .expect("still said");
    assert!(
        !w.is_error() && w.message.contains("it is ignored"),
        "{w:?}"
    );
    let (w, _) = find(&p, &d, "distro key `fedroa`");
    assert_eq!(w.hint.as_deref(), Some("did you mean `fedora`?"));
}

#[test]
fn unknown_candy_in_a_box_suggests_close_names() {
    let t = project(&[
        ("box/b/charly.yml", BOX),
        (
            "candy/ab/charly.yml",
            b"candy:\n  version: 1.0.0\n  package: [x]\n",
        ),
    ]);
    let (p, d) = all_diags(t.path());
    let (e, line) = find(&p, &d, "unknown candy `a`");
    assert!(line.starts_with("box/b/charly.yml:6:11:"), "{line}");
    assert_eq!(e.hint.as_deref(), Some("did you mean `ab`?"));
}

#[test]
fn missing_copy_source_names_the_task() {
    let t = project(&[
        ("box/b/charly.yml", BOX),
        ("candy/a/charly.yml", b"candy:\n  version: 1.0.0\n  task:\n    - copy: tool.sh\n      to: /usr/local/bin/tool\n"),
    ]);
    let (p, d) = all_diags(t.path());
    let (_, line) = find(&p, &d, "file `tool.sh` does not exist");
    assert!(
        line.starts_with("candy/a/charly.yml:4:13: task #1 (copy: tool.sh)"),
        "{line}"
    );
}

#[test]
fn missing_vocabulary_entry() {
    let t = project(&[
        ("box/b/charly.yml", b"box:\n  name: b\n  version: 1.0.0\n  distro: [fedora]\n  build: [rpmx]\n  candy: [a]\n"),
        ("candy/a/charly.yml", b"candy:\n  version: 1.0.0\n  package: [x]\n"),
    ]);
    let (p, d) = all_diags(t.path());
    let (e, line) = find(&p, &d, "unknown build format `rpmx`");
    assert!(line.starts_with("box/b/charly.yml:5:10:"), "{line}");
    assert_eq!(e.hint.as_deref(), Some("did you mean `rpm`?"));
    let t = project(&[
        (
            "box/b/charly.yml",
            b"box:\n  name: b\n  version: 1.0.0\n  distro: [plan9]\n  candy: [a]\n",
        ),
        (
            "candy/a/charly.yml",
            b"candy:\n  version: 1.0.0\n  package: [x]\n",
        ),
    ]);
    let (p, d) = all_diags(t.path());
    find(&p, &d, "no distro definition matches");
}

#[test]
fn empty_binary_and_huge_files() {
    let huge = vec![b'#'; 10 * 1024 * 1024];
    let t = project(&[
        ("box/b/charly.yml", BOX),
        ("candy/a/charly.yml", b""),
        ("candy/bin/charly.yml", b"\x7fELF\x02\x01\x01\x00\x00\x00"),
        ("candy/huge/charly.yml", &huge),
    ]);
    let (p, d) = all_diags(t.path());
    let (w, _) = find(&p, &d, "is empty");
    assert!(!w.is_error());
    let (e, _) = find(&p, &d, "binary");
    assert!(e.is_error());
    let (e, line) = find(&p, &d, "10.5 MB");
    assert!(
        e.is_error() && line.contains("candy/huge/charly.yml"),
        "{line}"
    );
}

#[test]
fn wrong_root_shapes() {
    let t = project(&[("box/b/charly.yml", b"- just\n- a list\n")]);
    let (p, d) = all_diags(t.path());
    find(&p, &d, "a charly document is a mapping");
    let t = project(&[("box/b/charly.yml", b"images:\n  x: {}\n")]);
    let (p, d) = all_diags(t.path());
    let (e, _) = find(&p, &d, "legacy key");
    assert_eq!(
        e.hint.as_deref().map(|h| h.starts_with("use `box:`")),
        Some(true)
    );
}

/// A diagnostic about `text` (file 0) points into it: a line that exists
/// (or the one just past the end, for an unexpected end of input) and a
/// column within that line.
fn located_in(d: &Diagnostic, text: &str) -> Result<(), String> {
    let s = d
        .span
        .ok_or_else(|| format!("no location: {}", d.message))?;
    let lines: Vec<&str> = text.split('\n').collect();
    let line = s.line as usize;
    if s.file != charly_rules::FileId(0) || line == 0 || line > lines.len() + 1 {
        return Err(format!(
            "{}:{}: outside the text's {} lines: {}",
            s.line,
            s.col,
            lines.len(),
            d.message
        ));
    }
    let width = lines.get(line - 1).map_or(0, |l| l.chars().count());
    if s.col == 0 || s.col as usize > width + 1 {
        return Err(format!(
            "{}:{}: past the line's {width} characters: {}",
            s.line, s.col, d.message
        ));
    }
    Ok(())
}

/// Parses and types `text` as candy documents (and root documents); every
/// diagnostic on the way, error or warning, must be located in the text.
fn every_diagnostic_is_located(text: &str, body_of: Option<&str>) -> Result<(), String> {
    let docs = match charly_rules::yaml::parse_stream(charly_rules::FileId(0), text) {
        Ok(docs) => docs,
        Err(e) => return located_in(&e, text),
    };
    for doc in docs {
        let body = match body_of {
            Some(key) => match doc.get(key) {
                Some(b) => b.clone(),
                None => continue,
            },
            None => doc.clone(),
        };
        let mut w = Vec::new();
        if let Err(e) = charly_rules::yaml::from_node::<charly_rules::model::Candy>(&body, &mut w) {
            located_in(&e, text)?;
        }
        if body_of.is_none()
            && let Err(e) =
                charly_rules::yaml::from_node::<charly_rules::model::RootDoc>(&body, &mut w)
        {
            located_in(&e, text)?;
        }
        for d in &w {
            located_in(d, text)?;
        }
    }
    Ok(())
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]
    /// Any text: parsing and typing a candy either works or gives a
    /// diagnostic located in the text, never a panic.
    #[test]
    fn candy_parser_never_panics_and_locates_its_diagnostics(text in "\\PC{0,400}") {
        if let Err(e) = every_diagnostic_is_located(&text, None) {
            proptest::prop_assert!(false, "{:?}: {}", text, e);
        }
    }

    /// Structured-ish YAML built from candy vocabulary: every wrong type or
    /// shape is a diagnostic at its line and column.
    #[test]
    fn candy_like_yaml_is_located(
        keys in proptest::collection::vec(proptest::sample::select(vec!["version", "package", "task", "distro", "require", "env", "service", "shell", "reboot", "port", "localpkg", "var", "cmd", "user", "mode", "fedora", "aur", "repo"]), 1..12),
        vals in proptest::collection::vec(proptest::sample::select(vec!["x", "[a, b]", "{a: 1}", "~", "0755", "true", "- y", "\"q\"", "{cmd: x, user: root}", "[{name: n}]"]), 1..12),
    ) {
        let mut text = String::from("candy:\n");
        for (k, v) in keys.iter().zip(vals.iter().cycle()) {
            text.push_str(&format!("  {k}: {v}\n"));
        }
        if let Err(e) = every_diagnostic_is_located(&text, Some("candy")) {
            proptest::prop_assert!(false, "{:?}: {}", text, e);
        }
    }
}

/// The located check itself: it must refuse what is not located.
#[test]
fn the_located_check_refuses_what_is_not_located() {
    let text = "candy:\n  version: x\n";
    let at = |line, col| {
        Diagnostic::error(
            charly_rules::source::Span {
                file: charly_rules::FileId(0),
                line,
                col,
                ..Default::default()
            },
            "m",
        )
    };
    assert!(located_in(&at(2, 3), text).is_ok());
    assert!(located_in(&at(0, 1), text).is_err());
    assert!(located_in(&at(9, 1), text).is_err());
    assert!(located_in(&at(2, 40), text).is_err());
    assert!(located_in(&Diagnostic::error(None, "m"), text).is_err());
}

#[test]
fn boxes_listing_candies_in_opposite_orders_keep_the_first_and_warn_at_the_second() {
    let boxed = |name: &str, candies: &str| {
        format!(
            "box:\n  name: {name}\n  version: 1.0.0\n  base: quay.io/fedora/fedora:43\n  distro: [fedora]\n  candy: [{candies}]\n"
        )
    };
    let (b1, b2, b3) = (
        boxed("b1", "x, y"),
        boxed("b2", "y, x"),
        boxed("b3", "z, y"),
    );
    let candy = b"candy:\n  version: 1.0.0\n  package: [p]\n".as_slice();
    let t = project(&[
        ("box/b1/charly.yml", b1.as_bytes()),
        ("box/b2/charly.yml", b2.as_bytes()),
        ("box/b3/charly.yml", b3.as_bytes()),
        ("candy/x/charly.yml", candy),
        ("candy/y/charly.yml", candy),
        ("candy/z/charly.yml", candy),
    ]);
    let (p, d) = all_diags(t.path());
    let (w, line) = find(&p, &d, "lists them the other way");
    assert!(!w.is_error());
    assert!(line.starts_with("box/b2/charly.yml:"), "{line}");
    assert!(
        line.contains("b2 lists `y` before `x`, but b1 lists them the other way"),
        "{line}"
    );
    let r = resolve::resolve(&p);
    let order = |b: &str| r.get(b).expect("resolves").candies.clone();
    // b1's order wins for both; z (one box) goes after y (three) only
    // where b3 does not say otherwise.
    assert_eq!(order("b1"), ["x", "y"]);
    assert_eq!(order("b2"), ["x", "y"]);
    assert_eq!(order("b3"), ["z", "y"]);
    assert_eq!(r.popularity.get("y"), Some(&3));
    assert_eq!(r.popularity.get("z"), Some(&1));
}

/// Renders `d` as the CLI does (graphical, one line of context).
fn render(p: &Project, d: &Diagnostic) -> String {
    let mut out = String::new();
    miette::GraphicalReportHandler::new_themed(miette::GraphicalTheme::unicode_nocolor())
        .with_context_lines(1)
        .render_report(&mut out, d.to_report(&p.sources).as_ref())
        .expect("renders");
    out
}

/// Issue 43, finding 7: a diagnostic at column 65,535 and beyond (a long
/// key in a candy, in the root file, a tab after a long line) renders with
/// its file:line:col and a window of the line, never a panic.
#[test]
fn diagnostics_on_very_long_lines_render_with_their_location() {
    let k = "k".repeat(65_535);
    let cases: Vec<(&str, String, String)> = vec![
        (
            "candy/a/charly.yml",
            format!("candy:\n  version: 1.0.0\n  {k}: 1\n  package: [curl]\n"),
            "candy/a/charly.yml:3:".to_string(),
        ),
        (
            "candy/b/charly.yml",
            format!("candy:\n  version: 1.0.0\n  package: [curl]\n  x: \"{k}\"\n\ty: 1\n"),
            "candy/b/charly.yml:5:".to_string(),
        ),
        (
            "candy/c/charly.yml",
            format!("{k}: 1\n"),
            "candy/c/charly.yml:1:".to_string(),
        ),
    ];
    let files: Vec<(&str, &[u8])> = cases.iter().map(|(f, t, _)| (*f, t.as_bytes())).collect();
    let dir = project(&files);
    let (p, d) = all_diags(dir.path());
    for (file, _, at) in &cases {
        let hit = d
            .iter()
            .find(|x| x.location(&p.sources).starts_with(&at[..at.len() - 1]))
            .unwrap_or_else(|| panic!("no diagnostic in {file}"));
        let shown = render(&p, hit);
        assert!(shown.contains(at.as_str()), "{file}: {shown}");
        assert!(
            shown.len() < 2_000,
            "{file}: the long line is cut: {} bytes",
            shown.len()
        );
    }
}
