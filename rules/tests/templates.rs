//! Tests of the Go `text/template` engine (`charly_rules::template`).
//!
//! Part 1 pins Go semantics on small templates (each expectation reasoned
//! from Go's `text/template` and `fmt` rules). Part 2 renders every template
//! of the real vocabulary (`../shared/corpus/overthink/charly/build.yml`)
//! and part 3 every template of the embedded default vocabulary
//! (`rules/vocab/default-build.yml`), each against realistic data and an
//! exact expected text. A completeness check walks both YAML files and fails
//! when a scalar containing `{{` has no case.

use charly_rules::model::RootDoc;
use charly_rules::source::FileId;
use charly_rules::template::{TemplateError, check, render};
use charly_rules::yaml::{self, Node, Value};
use serde_json::{Value as Json, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

fn r(text: &str, data: &Json) -> String {
    render("test", text, data).unwrap_or_else(|e| panic!("{e}\n--- template ---\n{text}"))
}

fn err(text: &str, data: &Json) -> TemplateError {
    match render("test/tmpl", text, data) {
        Ok(out) => panic!("expected an error, got {out:?}"),
        Err(e) => e,
    }
}

// ---------------------------------------------------------------------------
// Part 1: Go semantics

#[test]
fn trim_markers_eat_spaces_and_newlines() {
    let d = json!({});
    assert_eq!(r("a  {{- 1 -}}  b", &d), "a1b");
    assert_eq!(r("a \n\t{{- \"x\" }} \n b", &d), "ax \n b");
    assert_eq!(r("a {{ \"x\" -}}\n\n  b", &d), "a xb");
    // `{{-` needs a space (or tab/newline) after the dash: `{{-3}}` is minus three.
    assert_eq!(r("a {{-3}}", &d), "a -3");
    assert_eq!(r("a {{-\n3}}", &d), "a3");
    // Multi-byte text before a trim marker.
    assert_eq!(r("→ {{- 1}}", &d), "→1");
    assert_eq!(r("x{{/* a comment */}}y", &d), "xy");
    assert_eq!(r("x {{- /* a comment */ -}} y", &d), "xy");
}

#[test]
fn missing_keys_are_no_value() {
    let d = json!({"A": {"B": "b"}, "N": null, "E": "", "Z": 0, "F": 0.0, "L": [], "M": {}});
    assert_eq!(r("{{.A.B}}", &d), "b");
    assert_eq!(r("{{.Missing}}", &d), "<no value>");
    assert_eq!(r("{{.Missing.B.C}}", &d), "<no value>");
    assert_eq!(r("{{.A.Missing}}", &d), "<no value>");
    // A nil value printed by an action is also "no value" (Go digs it out of
    // its interface); formatted as an argument it is `<nil>`.
    assert_eq!(r("{{.N}}", &d), "<no value>");
    assert_eq!(
        r("{{printf \"%v\" .N}}|{{printf \"%v\" .Missing}}", &d),
        "<nil>|<nil>"
    );
    for k in ["Missing", "N", "E", "Z", "F", "L", "M", "Missing.X"] {
        assert_eq!(
            r(&format!("{{{{if .{k}}}}}y{{{{else}}}}n{{{{end}}}}"), &d),
            "n",
            "{k}"
        );
    }
    assert_eq!(r("{{if .A}}y{{end}}{{if .A.B}}y{{end}}", &d), "yy");
    assert_eq!(r("{{with .Missing}}a{{else}}b{{end}}", &d), "b");
    assert_eq!(r("{{with .A}}{{.B}}{{end}}", &d), "b");
    assert_eq!(r("{{range .Missing}}x{{else}}none{{end}}", &d), "none");
    let e = err("{{.N.X}}", &d);
    assert!(
        e.message.contains("nil pointer evaluating interface {}.X"),
        "{e}"
    );
    let e = err("{{.E.X}}", &d);
    assert!(
        e.message.contains("can't evaluate field X in type string"),
        "{e}"
    );
}

#[test]
fn numbers_print_like_go() {
    let d = json!({"I": 1000, "Neg": -7, "F": 1.5, "Big": 1_000_000.0, "Small": 0.000_01, "G": 123_456.0});
    assert_eq!(
        r("{{.I}} {{.Neg}} {{.F}} {{.Big}} {{.Small}} {{.G}}", &d),
        "1000 -7 1.5 1e+06 1e-05 123456"
    );
    assert_eq!(
        r(
            "{{1000}} {{-2}} {{0x1F}} {{0755}} {{1.0}} {{'a'}} {{1e3}}",
            &d
        ),
        "1000 -2 31 493 1 97 1000"
    );
    assert_eq!(r("{{if .I}}y{{end}}{{if eq .I 1000}}=={{end}}", &d), "y==");
}

#[test]
fn composites_print_like_fmt() {
    let d = json!({"L": ["a", 1, null, true], "M": {"b": 2, "a": [1, 2]}});
    assert_eq!(r("{{.L}}", &d), "[a 1 <nil> true]");
    assert_eq!(r("{{.M}}", &d), "map[a:[1 2] b:2]");
}

#[test]
fn range_forms() {
    let d = json!({
        "L": ["x", "y"],
        "E": [],
        "M": {"zeta": 1, "alpha": 2, "mid": 3},
        "KV": [{"Key": "A", "Value": "1"}, {"Key": "B", "Value": "2"}],
    });
    assert_eq!(r("{{range .L}}<{{.}}>{{end}}", &d), "<x><y>");
    assert_eq!(
        r("{{range $i, $v := .L}}{{$i}}={{$v}};{{end}}", &d),
        "0=x;1=y;"
    );
    assert_eq!(r("{{range $v := .L}}{{$v}}{{end}}", &d), "xy");
    // Maps in sorted key order, always.
    assert_eq!(
        r("{{range $k, $v := .M}}{{$k}}={{$v}};{{end}}", &d),
        "alpha=2;mid=3;zeta=1;"
    );
    assert_eq!(r("{{range .M}}{{.}}{{end}}", &d), "231");
    // The else branch runs only when nothing was visited.
    assert_eq!(r("{{range .L}}x{{else}}empty{{end}}", &d), "xx");
    assert_eq!(r("{{range .E}}x{{else}}empty{{end}}", &d), "empty");
    assert_eq!(r("{{range 3}}{{.}}{{end}}", &d), "012");
    assert_eq!(
        r(
            "{{range 0}}x{{else}}none{{end}}|{{range -2}}x{{else}}none{{end}}",
            &d
        ),
        "none|none"
    );
    // Counting is lazy: a huge range that breaks at once costs nothing.
    assert_eq!(r("{{range 1000000000000}}{{.}}{{break}}{{end}}", &d), "0");
    assert!(
        err("{{range $i, $v := 3}}{{end}}", &d)
            .message
            .contains("can't use 3 to iterate over more than one variable")
    );
    assert!(
        err("{{range \"abc\"}}{{end}}", &d)
            .message
            .contains("range can't iterate over abc")
    );
    assert_eq!(
        r(
            "{{range $i, $kv := .KV}}{{if $i}},{{end}}{{$kv.Key}}=\"{{$kv.Value}}\"{{end}}",
            &d
        ),
        "A=\"1\",B=\"2\""
    );
    assert_eq!(
        r(
            "{{range .L}}{{if eq . \"y\"}}{{break}}{{end}}{{.}}{{end}}",
            &d
        ),
        "x"
    );
    assert_eq!(
        r(
            "{{range .L}}{{if eq . \"x\"}}{{continue}}{{end}}{{.}}{{end}}",
            &d
        ),
        "y"
    );
    // `$` is the data everywhere; range variables end with the range.
    assert_eq!(
        r(
            "{{range .L}}{{$.KV}}{{end}}",
            &json!({"L": [1], "KV": "top"})
        ),
        "top"
    );
}

#[test]
fn variables_scope_and_assignment() {
    let d = json!({"A": "a"});
    assert_eq!(r("{{$x := 1}}{{if true}}{{$x = 2}}{{end}}{{$x}}", &d), "2");
    assert_eq!(
        r("{{$x := 1}}{{if true}}{{$x := 2}}{{$x}}{{end}}{{$x}}", &d),
        "21"
    );
    assert_eq!(r("{{with $v := .A}}{{$v}}{{.}}{{end}}", &d), "aa");
    assert!(
        err("{{if true}}{{$y := 1}}{{end}}{{$y}}", &d)
            .message
            .contains("undefined variable \"$y\"")
    );
}

#[test]
fn if_else_chains() {
    let t = "{{if eq .K \"a\"}}A{{else if eq .K \"b\"}}B{{else if .K}}other{{else}}none{{end}}";
    assert_eq!(r(t, &json!({"K": "a"})), "A");
    assert_eq!(r(t, &json!({"K": "b"})), "B");
    assert_eq!(r(t, &json!({"K": "c"})), "other");
    assert_eq!(r(t, &json!({"K": ""})), "none");
    assert_eq!(r(t, &json!({})), "none");
    let w = "{{with .A}}a={{.}}{{else with .B}}b={{.}}{{else}}-{{end}}";
    assert_eq!(r(w, &json!({"B": 2})), "b=2");
    assert_eq!(r(w, &json!({})), "-");
}

#[test]
fn comparisons_follow_go_kinds() {
    let d = json!({"S": "x", "I": 3, "F": 2.5, "B": true, "L": [1], "N": null});
    assert_eq!(
        r(
            "{{eq .S \"x\"}} {{eq .S \"y\" \"x\"}} {{ne .I 3}} {{eq .B true}}",
            &d
        ),
        "true true false true"
    );
    // Anything compared with a missing value or nil is just unequal.
    assert_eq!(
        r(
            "{{eq .Missing \"x\"}} {{eq .N \"x\"}} {{eq .Missing .N}} {{eq .L nil}}",
            &d
        ),
        "false false true false"
    );
    assert_eq!(
        r(
            "{{lt .I 4}} {{le .I 3}} {{gt .F 2.0}} {{ge \"b\" \"a\"}} {{lt .F 2.5}}",
            &d
        ),
        "true true true true false"
    );
    assert!(
        err("{{eq .S 1}}", &d)
            .message
            .contains("incompatible types for comparison")
    );
    assert!(
        err("{{lt .Missing 1}}", &d)
            .message
            .contains("invalid type for comparison")
    );
    assert!(err("{{eq .L .L}}", &d).message.contains("non-comparable"));
}

#[test]
fn logic_functions() {
    let d = json!({"A": "a", "E": ""});
    assert_eq!(
        r(
            "{{or .Missing .E \"c\"}}|{{or .E .Missing}}|{{and .A .E}}|{{and .A 1}}",
            &d
        ),
        "c|<no value>||1"
    );
    // Short-circuit: the erroring argument is never evaluated.
    assert_eq!(
        r("{{or .A (index .A 99)}}|{{and .E (index .A 99)}}", &d),
        "a|"
    );
    assert_eq!(
        r("{{not .E}} {{not .A}} {{not .Missing}}", &d),
        "true false true"
    );
    assert_eq!(r("{{.A | or .E}}", &d), "a");
}

#[test]
fn builtin_functions() {
    let d = json!({"L": ["a", "b", "c"], "M": {"k": "v"}, "S": "héllo"});
    assert_eq!(r("{{len .L}} {{len .M}} {{len .S}}", &d), "3 1 6");
    assert_eq!(
        r("{{index .L 1}} {{index .M \"k\"}} {{index .M \"no\"}}", &d),
        "b v <no value>"
    );
    assert_eq!(r("{{slice .L 1}} {{slice .L 0 2}}", &d), "[b c] [a b]");
    assert_eq!(r("{{print 1 2 \"a\" 3 \"b\"}}", &d), "1 2a3b");
    assert_eq!(r("{{println \"a\" 1}}", &d), "a 1\n");
    assert_eq!(
        r("{{html \"<a href='x'>&</a>\"}}", &d),
        "&lt;a href=&#39;x&#39;&gt;&amp;&lt;/a&gt;"
    );
    assert_eq!(r("{{urlquery \"a b&c/d\"}}", &d), "a+b%26c%2Fd");
    assert_eq!(r("{{js \"it's <x>\"}}", &d), "it\\'s \\u003Cx\\u003E");
    assert_eq!(r("{{\"a\" | printf \"%s-%s\" \"b\"}}", &d), "b-a");
    assert_eq!(r("{{(index .M \"k\") | printf \"%q\"}}", &d), "\"v\"");
    assert_eq!(r("{{(.M).k}}", &d), "v");
}

#[test]
fn printf_verbs() {
    let d = json!({"N": null, "L": ["a", "b"]});
    assert_eq!(
        r(
            "{{printf \"%5d|%-4s|%05.1f|%x|%X|%o|%b\" 42 \"ab\" 3.14159 255 255 8 5}}",
            &d
        ),
        "   42|ab  |003.1|ff|FF|10|101"
    );
    assert_eq!(
        r(
            "{{printf \"%q %v %t %c %U %%\" \"a\\\"b\\n\" true false 65 65}}",
            &d
        ),
        "\"a\\\"b\\n\" true false A U+0041 %"
    );
    assert_eq!(
        r(
            "{{printf \"%e|%.2e|%g|%.3g|%f|%.0f\" 1234.5678 1234.5678 0.000012 3.14159 2.5 2.5}}",
            &d
        ),
        "1.234568e+03|1.23e+03|1.2e-05|3.14|2.500000|2"
    );
    assert_eq!(
        r(
            "{{printf \"%+d|% d|%#x|%08.3f|%-6d|\" 5 5 255 -3.14159 7}}",
            &d
        ),
        "+5| 5|0xff|-003.142|7     |"
    );
    assert_eq!(
        r(
            "{{printf \"%s\" .N}}|{{printf \"%d\" \"x\"}}|{{printf \"%s\" 3}}",
            &d
        ),
        "%!s(<nil>)|%!d(string=x)|%!s(int=3)"
    );
    assert_eq!(
        r("{{printf \"%s %d\" \"a\"}}|{{printf \"%s\" \"a\" 1}}", &d),
        "a %!d(MISSING)|a%!(EXTRA int=1)"
    );
    assert_eq!(
        r("{{printf \"%s|%q|%v|%T\" .L .L .L .L}}", &d),
        "[a b]|[\"a\" \"b\"]|[a b]|[]interface {}"
    );
    assert_eq!(
        r("{{printf \"%.2s|%6.2f|%x\" \"abc\" 3.14159 \"hi\"}}", &d),
        "ab|  3.14|6869"
    );
}

#[test]
fn define_template_and_block() {
    let d = json!({"A": {"B": "b"}});
    let t = "{{define \"x\"}}[{{.B}}]{{end}}{{template \"x\" .A}}{{template \"x\" .A}}";
    assert_eq!(r(t, &d), "[b][b]");
    assert_eq!(r("{{block \"y\" .A}}<{{.B}}>{{end}}!", &d), "<b>!");
    assert!(
        err("{{template \"nope\"}}", &d)
            .message
            .contains("template \"nope\" not defined")
    );
}

#[test]
fn vocabulary_functions() {
    let mounts = json!([
        {"dst": "/var/cache/libdnf5", "sharing": "locked", "owned": false},
        {"dst": "/tmp/cargo-cache", "sharing": null, "owned": true},
        {"dst": "/var/lib/apt", "sharing": "shared"},
    ]);
    let d = json!({"CM": mounts, "One": [{"dst": "/tmp/cargo-cache"}], "None": [], "UID": 1000, "GID": 1000});
    assert_eq!(
        r("{{cacheMounts .CM}}", &d),
        "--mount=type=cache,id=charly-var-cache-libdnf5,dst=/var/cache/libdnf5,sharing=locked \\\n    \
         --mount=type=cache,id=charly-tmp-cargo-cache,dst=/tmp/cargo-cache,sharing=locked \\\n    \
         --mount=type=cache,id=charly-var-lib-apt,dst=/var/lib/apt,sharing=shared"
    );
    assert_eq!(
        r("{{cacheMountsOwned .One .UID .GID}}cargo install", &d),
        "--mount=type=cache,id=charly-tmp-cargo-cache-uid1000,dst=/tmp/cargo-cache,uid=1000,gid=1000 \\\n    cargo install"
    );
    assert_eq!(
        r("{{cacheMountsAuto .CM .UID .GID}}", &d),
        "--mount=type=cache,id=charly-var-cache-libdnf5,dst=/var/cache/libdnf5,sharing=locked \\\n    \
         --mount=type=cache,id=charly-tmp-cargo-cache-uid1000,dst=/tmp/cargo-cache,uid=1000,gid=1000 \\\n    \
         --mount=type=cache,id=charly-var-lib-apt,dst=/var/lib/apt,sharing=shared"
    );
    assert_eq!(
        r(
            "[{{cacheMounts .None}}][{{cacheMountsOwned .None 0 0}}][{{cacheMounts .Missing}}]",
            &d
        ),
        "[][][]"
    );
    assert_eq!(
        r(
            "{{quote \"a b\"}} {{quote \"x\\ty\"}} {{quote .Missing}}",
            &d
        ),
        "\"a b\" \"x\\ty\" %!q(<nil>)"
    );
    assert_eq!(
        r(
            "{{default .Missing \"fb\"}} {{default \"\" \"fb\"}} {{default \"v\" \"fb\"}} {{default false \"true\"}} {{default 0 \"x\"}}",
            &d
        ),
        "fb fb v false 0"
    );
    assert_eq!(
        r(
            "{{splitFirst \"nodejs:20\" \":\"}} {{splitFirst \"plain\" \":\"}}",
            &d
        ),
        "nodejs plain"
    );
    assert_eq!(
        r("{{replace \"owner/project\" \"/\" \":\"}}", &d),
        "owner:project"
    );
    assert_eq!(
        r(
            "{{join .L \",\"}}|{{join .Missing \",\"}}",
            &json!({"L": ["a", 1, true]})
        ),
        "a,1,true|"
    );
    assert_eq!(
        r(
            "{{shquote \"plain-1.0_x/y:z=w@v%u+t,s\"}} {{shquote \"has space\"}} {{shquote \"it's\"}} {{shquote \"\"}}",
            &d
        ),
        "plain-1.0_x/y:z=w@v%u+t,s 'has space' 'it'\\''s' ''"
    );
    assert_eq!(
        r(
            "{{hasSuffix \"x.repo\" \".repo\"}} {{hasSuffix \"x\" \".repo\"}}",
            &d
        ),
        "true false"
    );
    assert_eq!(
        r(
            "{{anyRepoHasURL .A}} {{anyRepoHasURL .B}} {{anyRepoHasURL .Missing}}",
            &json!({"A": [{"name": "x"}, {"url": "u"}], "B": [{"url": ""}]})
        ),
        "true false false"
    );
    assert_eq!(
        r(
            "{{derefBool .T}} {{derefBool .F}} {{derefBool .P}} {{derefBool .Q}} {{derefBool .Missing}} {{derefBool .N}}",
            &json!({"T": true, "F": false, "P": [true], "Q": [false], "N": null})
        ),
        "true false true false false false"
    );
    assert_eq!(
        r(
            "{{systemdRestart \"always\"}},{{systemdRestart \"on-failure\"}},{{systemdRestart \"no\"}},{{systemdRestart \"unless-stopped\"}},{{systemdRestart .Missing}}",
            &d
        ),
        "always,on-failure,no,,"
    );
    assert_eq!(
        r(
            "{{supervisordRestart \"no\"}},{{supervisordRestart \"always\"}},{{supervisordRestart \"on-failure\"}},{{supervisordRestart .Missing}}",
            &d
        ),
        "false,true,true,true"
    );
    assert_eq!(
        r(
            "{{systemdStdout \"file:/var/log/x\"}},{{systemdStdout \"journal\"}},{{systemdStdout .Missing}}",
            &d
        ),
        "append:/var/log/x,journal,"
    );
    assert_eq!(
        r(
            "{{supervisordLog \"file:/var/log/x\"}},{{supervisordLog \"none\"}},{{supervisordLog \"journal\"}},{{supervisordLog .Missing}}",
            &d
        ),
        "/var/log/x,/dev/null,/dev/fd/1,/dev/fd/1"
    );
    assert_eq!(
        r(
            "{{supervisordLogMaxbytes \"file:/x\"}},{{supervisordLogMaxbytes \"\"}}",
            &d
        ),
        "10MB,0"
    );
    assert!(
        err("{{cacheMountsOwned .One .Missing 1}}", &d)
            .message
            .contains("uid is missing")
    );
}

#[test]
fn parse_errors_name_the_template() {
    let cases = [
        ("{{if .A}}x", "unexpected EOF"),
        ("{{foo .A}}", "function \"foo\" not defined"),
        ("{{$x}}", "undefined variable \"$x\""),
        ("x{{end}}", "unexpected {{end}}"),
        ("{{else}}", "unexpected {{else}}"),
        (
            "{{.A | \"x\"}}",
            "non executable command in pipeline stage 2",
        ),
        ("{{}}", "missing value for command"),
        ("{{\"unterminated}}", "unterminated quoted string"),
        (
            "line one\n  {{.A | 3}}",
            "2:10: non executable command in pipeline stage 2",
        ),
        (
            "{{range .L}}{{else if .X}}{{end}}",
            "unexpected <if> in input",
        ),
        ("{{break}}", "{{break}} outside {{range}}"),
        ("{{(.A}}", "unclosed"),
        ("{{/* open", "unclosed comment"),
    ];
    for (text, want) in cases {
        let e = check("distro/fedora/format/rpm/install_template", text).expect_err(text);
        assert_eq!(e.name, "distro/fedora/format/rpm/install_template");
        assert!(e.message.contains(want), "{text:?}: {e}");
        assert!(
            e.to_string()
                .starts_with("template distro/fedora/format/rpm/install_template: "),
            "{e}"
        );
        // render reports the same error.
        assert_eq!(
            render(
                "distro/fedora/format/rpm/install_template",
                text,
                &json!({})
            ),
            Err(e)
        );
    }
}

#[test]
fn exec_errors_name_the_template_and_action() {
    let e = err("ok\n{{.A | len}}", &json!({"A": 1}));
    assert_eq!(e.name, "test/tmpl");
    assert!(e.message.starts_with("2:"), "{e}");
    assert!(e.message.contains("error calling len"), "{e}");
    let e = err("{{index .L 5}}", &json!({"L": [1]}));
    assert!(
        e.message
            .contains("executing at <index .L 5>: error calling index: index out of range: 5"),
        "{e}"
    );
    let e = err("{{.A 1}}", &json!({"A": {"B": 1}}));
    assert!(
        e.message.contains("A is not a method but has arguments"),
        "{e}"
    );
}

#[test]
fn renders_concurrently() {
    let text = "{{range $i, $v := .L}}{{if $i}},{{end}}{{$v}}{{end}}";
    let handles: Vec<_> = (0..8)
        .map(|t| {
            std::thread::spawn(move || {
                for n in 0..200 {
                    let d = json!({"L": [t, n]});
                    assert_eq!(
                        render("par", text, &d).expect("renders"),
                        format!("{t},{n}")
                    );
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("thread ok");
    }
}

// ---------------------------------------------------------------------------
// Shared machinery for parts 2 and 3

fn vocab_file(rel: &str) -> (String, Vec<Node>) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let docs = yaml::parse_stream(FileId(0), &text).unwrap_or_else(|d| panic!("{rel}: {d:?}"));
    (text, docs)
}

fn corpus_build_yml() -> (String, Vec<Node>) {
    vocab_file("../../shared/corpus/overthink/charly/build.yml")
}

fn default_build_yml() -> (String, Vec<Node>) {
    vocab_file("vocab/default-build.yml")
}

/// Every scalar that contains `{{`, by its `/`-joined YAML path.
fn scan(node: &Node, path: &mut Vec<String>, out: &mut BTreeMap<String, String>) {
    match &node.value {
        Value::Scalar(s, _) => {
            if s.contains("{{") {
                out.insert(path.join("/"), s.clone());
            }
        }
        Value::Seq(items) => {
            for (i, it) in items.iter().enumerate() {
                path.push(i.to_string());
                scan(it, path, out);
                path.pop();
            }
        }
        Value::Map(entries) => {
            for (k, v) in entries {
                path.push(k.as_str().unwrap_or("?").to_string());
                scan(v, path, out);
                path.pop();
            }
        }
    }
}

/// Every field the typed model declares as a template, by YAML path.
fn typed_templates(doc: &RootDoc) -> BTreeMap<String, String> {
    use charly_rules::model::vocab::Phases;
    let mut out = BTreeMap::new();
    let mut commands = Vec::new();
    let mut put = |path: String, t: Option<&charly_rules::yaml::Spanned<String>>| {
        if let Some(t) = t {
            out.insert(path, t.value.clone());
        }
    };
    let phases =
        |base: &str,
         p: &Option<Phases>,
         put: &mut dyn FnMut(String, Option<&charly_rules::yaml::Spanned<String>>)| {
            if let Some(p) = p {
                for (name, ph) in [
                    ("prepare", &p.prepare),
                    ("install", &p.install),
                    ("cleanup", &p.cleanup),
                ] {
                    if let Some(ph) = ph {
                        put(
                            format!("{base}/phase/{name}/container"),
                            ph.container.as_ref(),
                        );
                        put(format!("{base}/phase/{name}/host"), ph.host.as_ref());
                    }
                }
            }
        };
    for (name, b) in doc.builder.iter() {
        let base = format!("builder/{}", name.value);
        put(format!("{base}/stage_template"), b.stage_template.as_ref());
        put(
            format!("{base}/install_template"),
            b.install_template.as_ref(),
        );
        put(format!("{base}/manylinux_fix"), b.manylinux_fix.as_ref());
        phases(&base, &b.phase, &mut put);
    }
    for (name, d) in doc.distro.iter() {
        for (fname, f) in d.format.iter() {
            let base = format!("distro/{}/format/{}", name.value, fname.value);
            put(
                format!("{base}/install_template"),
                f.install_template.as_ref(),
            );
            put(
                format!("{base}/uninstall_template"),
                f.uninstall_template.as_ref(),
            );
            phases(&base, &f.phase, &mut put);
            if let Some(lp) = &f.local_pkg {
                put(
                    format!("{base}/local_pkg/build_template"),
                    lp.build_template.as_ref(),
                );
                put(
                    format!("{base}/local_pkg/install_template"),
                    lp.install_template.as_ref(),
                );
            }
        }
    }
    for (name, i) in doc.init.iter() {
        let base = format!("init/{}", name.value);
        put(format!("{base}/relay_template"), i.relay_template.as_ref());
        put(
            format!("{base}/stage_fragment_copy"),
            i.stage_fragment_copy.as_ref(),
        );
        put(
            format!("{base}/assembly_template"),
            i.assembly_template.as_ref(),
        );
        put(
            format!("{base}/system_enable_template"),
            i.system_enable_template.as_ref(),
        );
        put(
            format!("{base}/post_assembly_template"),
            i.post_assembly_template.as_ref(),
        );
        if let Some(s) = &i.service_schema {
            let sb = format!("{base}/service_schema");
            put(
                format!("{sb}/service_template"),
                s.service_template.as_ref(),
            );
            put(
                format!("{sb}/unit_path_template"),
                s.unit_path_template.as_ref(),
            );
            put(format!("{sb}/dropin_template"), s.dropin_template.as_ref());
            put(
                format!("{sb}/dropin_path_template"),
                s.dropin_path_template.as_ref(),
            );
        }
        for (cmd, text) in i.management_command.iter() {
            commands.push((
                format!("{base}/management_command/{}", cmd.value),
                text.clone(),
            ));
        }
    }
    out.extend(commands);
    out
}

/// All templates of a vocabulary file: typed template fields plus every
/// other scalar with an action (kept subtrees such as `bootloader:`).
fn all_templates(docs: &[Node]) -> BTreeMap<String, String> {
    let mut all = BTreeMap::new();
    for d in docs {
        let mut warnings = Vec::new();
        let doc: RootDoc = yaml::from_node(d, &mut warnings).unwrap_or_else(|e| panic!("{e:?}"));
        let typed = typed_templates(&doc);
        let mut scanned = BTreeMap::new();
        scan(d, &mut Vec::new(), &mut scanned);
        for (path, text) in &typed {
            if let Some(raw) = scanned.get(path) {
                assert_eq!(raw, text, "typed and raw text of {path} differ");
            }
        }
        all.extend(scanned);
        all.extend(typed);
    }
    all
}

/// One rendering: template path, data, exact expected output.
struct Case {
    path: &'static str,
    data: Json,
    want: String,
}

fn case(path: &'static str, data: Json, want: impl Into<String>) -> Case {
    Case {
        path,
        data,
        want: want.into(),
    }
}

/// The expected text derived from the template by replacing each action (or
/// run of text and actions) with what Go prints for it. Every `from` must
/// occur, so a stale replacement fails loudly.
fn derive(text: &str, repl: &[(&str, &str)]) -> String {
    let mut out = text.to_string();
    for (from, to) in repl {
        assert!(out.contains(from), "{from:?} not in template");
        out = out.replace(from, to);
    }
    assert!(
        !out.contains("{{"),
        "an action is left in the derived text:\n{out}"
    );
    out
}

fn run_cases(file: &str, templates: &BTreeMap<String, String>, cases: &[Case]) {
    let print = std::env::var_os("CHARLY_TMPL_PRINT").is_some();
    let mut failures = Vec::new();
    for c in cases {
        let text = templates
            .get(c.path)
            .unwrap_or_else(|| panic!("{file}: no template at {}", c.path));
        let name = format!("{file}:{}", c.path);
        let got = render(&name, text, &c.data).unwrap_or_else(|e| panic!("{e}"));
        if print {
            println!("##### {} {}\n{got}#####END", c.path, c.data);
        }
        if got != c.want {
            failures.push(format!(
                "{name} with {}\n--- want ---\n{}\n--- got ---\n{got}\n",
                c.data, c.want
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
    let covered: BTreeSet<&str> = cases.iter().map(|c| c.path).collect();
    let missing: Vec<&String> = templates
        .keys()
        .filter(|p| !covered.contains(p.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "{file}: templates without a case: {missing:?}"
    );
}

fn cache_mounts(dsts: &[&str]) -> Json {
    Json::Array(
        dsts.iter()
            .map(|d| json!({"dst": d, "sharing": "locked", "owned": false}))
            .collect(),
    )
}

/// Data of a format install template: the given fields over empty defaults.
fn fmt_data(mounts: &[&str], extra: Json) -> Json {
    let mut d = json!({
        "CacheMounts": cache_mounts(mounts),
        "Packages": [], "Repos": null, "Options": [], "Copr": [], "Modules": [],
        "Exclude": [], "Keys": [], "StageName": "", "BuilderRef": "",
        "User": "user", "UID": 1000, "GID": 1000, "Home": "/home/user",
    });
    if let (Json::Object(m), Json::Object(e)) = (&mut d, extra) {
        m.extend(e);
    }
    d
}

/// Data of one service entry, as Go's zero values, with the given fields.
fn service(extra: Json) -> Json {
    let mut d = json!({
        "Name": "", "Exec": "", "Kind": "", "Events": "", "AutoStart": null,
        "Restart": "", "StartRetries": 0, "StartSecs": 0, "ExitCodes": "",
        "StopSignal": "", "StopTimeout": "", "Priority": 0, "WorkingDirectory": "",
        "User": "", "EnvList": [], "Stdout": "", "Layer": "", "After": [],
        "Before": [], "WantedBy": [], "Scope": "", "Home": "/home/user",
    });
    if let (Json::Object(m), Json::Object(e)) = (&mut d, extra) {
        m.extend(e);
    }
    d
}

// ---------------------------------------------------------------------------
// Part 2: every template of the real vocabulary (corpus charly/build.yml)

const RPM_MOUNT: &str =
    "--mount=type=cache,id=charly-var-cache-libdnf5,dst=/var/cache/libdnf5,sharing=locked";
const APT_MOUNTS: &str = "--mount=type=cache,id=charly-var-cache-apt,dst=/var/cache/apt,sharing=locked \\\n    --mount=type=cache,id=charly-var-lib-apt,dst=/var/lib/apt,sharing=locked";
const PAC_MOUNT: &str =
    "--mount=type=cache,id=charly-var-cache-pacman-pkg,dst=/var/cache/pacman/pkg,sharing=locked";
const BUILDER: &str = "ghcr.io/overthinkos/fedora-builder:2026.160.1301";

/// The `supervisord` program the original writes.
const VERIFIED_PROGRAM: &str = r#"[program:foo]
command=/usr/bin/foo --x
autostart=true
autorestart=true
priority=10
user=user
environment=A="1",B="2"
stdout_logfile=/dev/fd/1
stdout_logfile_maxbytes=0
redirect_stderr=true
"#;

/// The cargo inline RUN the original writes.
const VERIFIED_CARGO: &str = "RUN --mount=type=bind,from=mytool,source=/,target=/ctx \\
    --mount=type=cache,id=charly-tmp-cargo-cache-uid1000,dst=/tmp/cargo-cache,uid=1000,gid=1000 \\
    cargo install --path /ctx
";

fn verified_program_data() -> Json {
    service(json!({
        "Name": "foo", "Exec": "/usr/bin/foo --x", "Priority": 10, "User": "user",
        "EnvList": [{"Key": "A", "Value": "1"}, {"Key": "B", "Value": "2"}],
    }))
}

fn eventlistener_data() -> Json {
    service(json!({
        "Name": "crashmail", "Exec": "crashmail -a -m root@localhost", "Kind": "eventlistener",
        "Events": "PROCESS_STATE_EXITED",
    }))
}

const EVENTLISTENER: &str = "[eventlistener:crashmail]
command=crashmail -a -m root@localhost
events=PROCESS_STATE_EXITED
stdout_logfile=/dev/fd/1
stdout_logfile_maxbytes=0
stderr_logfile=/dev/fd/2
stderr_logfile_maxbytes=0
";

/// Every optional supervisord setting; AutoStart is a pointer to false.
fn full_program_data() -> Json {
    service(json!({
        "Name": "chrome", "Exec": "/usr/bin/chrome --no-sandbox", "AutoStart": [false],
        "Restart": "no", "StartRetries": 5, "StartSecs": 3, "ExitCodes": "0,2",
        "StopSignal": "TERM", "StopTimeout": 30, "Priority": 20,
        "WorkingDirectory": "/home/user", "User": "user",
        "EnvList": [{"Key": "DISPLAY", "Value": ":0"}], "Stdout": "file:/var/log/chrome.log",
    }))
}

const FULL_PROGRAM: &str = r#"[program:chrome]
command=/usr/bin/chrome --no-sandbox
autostart=false
autorestart=false
startretries=5
startsecs=3
exitcodes=0,2
stopsignal=TERM
stopwaitsecs=30
priority=20
directory=/home/user
user=user
environment=DISPLAY=":0"
stdout_logfile=/var/log/chrome.log
stdout_logfile_maxbytes=10MB
redirect_stderr=true
"#;

fn user_unit_data() -> Json {
    service(json!({
        "Layer": "foo", "Name": "web", "After": ["network-online.target"],
        "Exec": "/usr/bin/web --port 8080", "Restart": "always", "StopTimeout": "30",
        "WorkingDirectory": "/srv/web", "EnvList": [{"Key": "PORT", "Value": "8080"}],
        "Scope": "user",
    }))
}

/// The original's deploy-time unit, filled in.
const USER_UNIT: &str = "[Unit]
Description=foo service web (generated by charly)
After=network-online.target

[Service]
Type=simple
ExecStart=/usr/bin/web --port 8080
Restart=always
TimeoutStopSec=30
WorkingDirectory=/srv/web
Environment=PORT=8080

[Install]
WantedBy=default.target
";

fn system_unit_data() -> Json {
    service(json!({
        "Layer": "db", "Name": "charly-db-postgres", "After": ["network.target", "local-fs.target"],
        "Before": ["app.service"], "Exec": "/usr/bin/postgres -D /var/lib/pgsql/data",
        "Restart": "unless-stopped", "User": "postgres", "Scope": "system",
        "WantedBy": ["multi-user.target", "graphical.target"],
        "EnvList": [{"Key": "PGDATA", "Value": "/var/lib/pgsql/data"}, {"Key": "LANG", "Value": "C.UTF-8"}],
    }))
}

/// `unless-stopped` writes no Restart=; explicit WantedBy entries win.
const SYSTEM_UNIT: &str = "[Unit]
Description=db service charly-db-postgres (generated by charly)
After=network.target
After=local-fs.target
Before=app.service

[Service]
Type=simple
ExecStart=/usr/bin/postgres -D /var/lib/pgsql/data
User=postgres
Environment=PGDATA=/var/lib/pgsql/data
Environment=LANG=C.UTF-8

[Install]
WantedBy=multi-user.target
WantedBy=graphical.target
";

fn minimal_system_unit_data() -> Json {
    service(
        json!({"Layer": "tools", "Name": "sync", "Exec": "/usr/local/bin/sync --daemon", "Restart": "on-failure", "Scope": "system"}),
    )
}

const MINIMAL_SYSTEM_UNIT: &str = "[Unit]
Description=tools service sync (generated by charly)

[Service]
Type=simple
ExecStart=/usr/local/bin/sync --daemon
Restart=on-failure

[Install]
WantedBy=multi-user.target
";

fn corpus_cases(t: &BTreeMap<String, String>) -> Vec<Case> {
    let tp = |p: &str| {
        t.get(p)
            .cloned()
            .unwrap_or_else(|| panic!("no template {p}"))
    };
    let mut cases = Vec::new();

    // --- builders
    let aur_host = tp("builder/aur/phase/install/host");
    cases.push(case(
        "builder/aur/phase/install/host",
        json!({"Packages": ["google-chrome", "visual-studio-code-bin"]}),
        derive(
            &aur_host,
            &[(
                "{{range .Packages}} {{shquote .}}{{end}}",
                " google-chrome visual-studio-code-bin",
            )],
        ),
    ));
    cases.push(case(
        "builder/aur/phase/install/host",
        json!({"Packages": ["foo;rm", "it's"]}),
        derive(
            &aur_host,
            &[(
                "{{range .Packages}} {{shquote .}}{{end}}",
                " 'foo;rm' 'it'\\''s'",
            )],
        ),
    ));
    cases.push(case(
        "builder/aur/stage_template",
        json!({
            "BuilderRef": "ghcr.io/overthinkos/arch-builder:2026.160.1301", "StageName": "chrome-aur-build",
            "User": "user", "UID": 1000, "GID": 1000, "Home": "/home/user",
            "CacheMounts": [
                {"dst": "/var/cache/pacman/pkg", "sharing": "locked", "owned": false},
                {"dst": "/tmp/aur-srcdest", "sharing": null, "owned": true},
                {"dst": "/tmp/aur-xdg-cache", "sharing": null, "owned": true},
            ],
            "Options": ["--mflags=--skipinteg"], "Packages": ["google-chrome", "spotify"],
        }),
        r#"FROM ghcr.io/overthinkos/arch-builder:2026.160.1301 AS chrome-aur-build
USER root
RUN echo 'user ALL=(ALL) NOPASSWD: ALL' > /etc/sudoers.d/builder
USER 1000
WORKDIR /home/user
ENV XDG_CACHE_HOME=/tmp/aur-xdg-cache
RUN --mount=type=cache,id=charly-var-cache-pacman-pkg,dst=/var/cache/pacman/pkg,sharing=locked \
    --mount=type=cache,id=charly-tmp-aur-srcdest-uid1000,dst=/tmp/aur-srcdest,uid=1000,gid=1000 \
    --mount=type=cache,id=charly-tmp-aur-xdg-cache-uid1000,dst=/tmp/aur-xdg-cache,uid=1000,gid=1000 \
    mkdir -p /tmp/aur-build /tmp/aur-srcdest /tmp/aur-xdg-cache && \
    cp /etc/makepkg.conf /tmp/makepkg.conf && \
    sed -i '/^OPTIONS/s/ debug/ !debug/' /tmp/makepkg.conf && \
    echo 'SRCDEST=/tmp/aur-srcdest' >> /tmp/makepkg.conf && \
    sudo pacman -Syu --noconfirm && \
    yay -S --noconfirm --needed --builddir /tmp/aur-build --makepkgconf /tmp/makepkg.conf --mflags=--skipinteg \
      google-chrome \
      spotify && \
    mkdir -p /tmp/aur-pkgs && \
    find /tmp/aur-build -name '*.pkg.tar.zst' -exec cp {} /tmp/aur-pkgs/ \;
"#,
    ));
    cases.push(case(
        "builder/cargo/install_template",
        json!({"LayerStage": "mytool", "CacheMounts": [{"dst": "/tmp/cargo-cache", "sharing": null, "owned": false}], "UID": 1000, "GID": 1000}),
        VERIFIED_CARGO,
    ));

    let deboot = tp("builder/debootstrap/phase/install/container");
    let include_chunk = "\n{{- if .Distro.Debootstrap.IncludePackages}}\n  --include={{join .Distro.Debootstrap.IncludePackages \",\"}} \\\n{{- end}}";
    let extra_chunk = "\n{{- if .ExtraAptSources}}\n{{.ExtraAptSources}}\n{{- end}}";
    let variant = "--variant={{if .Distro.Debootstrap.Variant}}{{.Distro.Debootstrap.Variant}}{{else}}minbase{{end}}";
    let components = "--components={{if .Distro.Debootstrap.Components}}{{.Distro.Debootstrap.Components}}{{else}}main{{end}}";
    let suite_line = "  {{.Distro.Debootstrap.Suite}} /target {{.Distro.Debootstrap.Mirror}}";
    let deb_line = "deb {{.Distro.Debootstrap.Mirror}} {{.Distro.Debootstrap.Suite}} {{replace (printf \"%s\" .Distro.Debootstrap.Components) \",\" \" \"}}";
    let pkgs = "{{range .Packages}}{{.}} {{end}}";
    cases.push(case(
        "builder/debootstrap/phase/install/container",
        json!({
            "Distro": {"Debootstrap": {
                "Suite": "noble", "Mirror": "http://archive.ubuntu.com/ubuntu", "Variant": "minbase",
                "Components": "main,universe", "IncludePackages": ["ca-certificates", "curl", "gnupg"],
            }},
            "ExtraAptSources": "echo 'deb http://security.ubuntu.com/ubuntu noble-security main universe' >> /target/etc/apt/sources.list",
            "Packages": ["systemd-sysv", "linux-image-generic", "openssh-server"],
        }),
        derive(&deboot, &[
            (variant, "--variant=minbase"),
            (components, "--components=main,universe"),
            (include_chunk, "\n  --include=ca-certificates,curl,gnupg \\"),
            (suite_line, "  noble /target http://archive.ubuntu.com/ubuntu"),
            (deb_line, "deb http://archive.ubuntu.com/ubuntu noble main universe"),
            (extra_chunk, "\necho 'deb http://security.ubuntu.com/ubuntu noble-security main universe' >> /target/etc/apt/sources.list"),
            (pkgs, "systemd-sysv linux-image-generic openssh-server "),
        ]),
    ));
    // Unset variant/components fall back; no includes, no extra sources.
    cases.push(case(
        "builder/debootstrap/phase/install/container",
        json!({
            "Distro": {"Debootstrap": {"Suite": "trixie", "Mirror": "http://deb.debian.org/debian", "Variant": "", "Components": "", "IncludePackages": []}},
            "ExtraAptSources": "", "Packages": ["systemd-sysv"],
        }),
        derive(&deboot, &[
            (variant, "--variant=minbase"),
            (components, "--components=main"),
            (include_chunk, ""),
            (suite_line, "  trixie /target http://deb.debian.org/debian"),
            (deb_line, "deb http://deb.debian.org/debian trixie "),
            (extra_chunk, ""),
            (pkgs, "systemd-sysv "),
        ]),
    ));

    for p in [
        "builder/npm/copy_artifact/0/src",
        "builder/npm/copy_artifact/0/dst",
        "builder/pixi/copy_artifact/0/src",
        "builder/pixi/copy_artifact/0/dst",
    ] {
        cases.push(case(p, json!({"Home": "/home/user"}), "/home/user"));
    }
    let npm = tp("builder/npm/stage_template");
    cases.push(case(
        "builder/npm/stage_template",
        json!({
            "BuilderRef": BUILDER, "StageName": "claude-code-npm-build", "UID": 1000, "GID": 1000,
            "Home": "/home/user", "CopySrc": "candy/claude-code",
            "CacheMounts": [{"dst": "/tmp/npm-cache", "sharing": null, "owned": false}],
        }),
        derive(&npm, &[
            ("{{cacheMountsOwned .CacheMounts .UID .GID}}", "--mount=type=cache,id=charly-tmp-npm-cache-uid1000,dst=/tmp/npm-cache,uid=1000,gid=1000 \\\n    "),
            ("{{.BuilderRef}}", BUILDER),
            ("{{.StageName}}", "claude-code-npm-build"),
            ("{{.UID}}", "1000"),
            ("{{.GID}}", "1000"),
            ("{{.Home}}", "/home/user"),
            ("{{.CopySrc}}", "candy/claude-code"),
        ]),
    ));

    let pacstrap = tp("builder/pacstrap/phase/install/container");
    let runtime_chunk = "\n{{- if .RuntimePacmanConf}}
# pacstrap configures only THIS container's pacman.conf for the
# install; the booted guest is left without a working one. Write
# the runtime config into the rootfs so add_layer pac installs
# work in the guest. RuntimePacmanConf is RENDERED (Go) from the
# SAME extra_repo source as the install config — one repo list,
# no install-vs-runtime drift (see renderRuntimePacmanConf).
cat > /target/etc/pacman.conf <<'CHARLY_RUNTIME_PACMAN_CONF'
{{.RuntimePacmanConf}}
CHARLY_RUNTIME_PACMAN_CONF
{{- end}}";
    let extra_conf_chunk = "\n{{- if .ExtraPacmanConf}}
cat > /etc/pacman.conf.extra <<'CACHYOS_REPOS'
{{.ExtraPacmanConf}}
CACHYOS_REPOS
cat /etc/pacman.conf.extra >> /etc/pacman.conf
{{- end}}";
    cases.push(case(
        "builder/pacstrap/phase/install/container",
        json!({
            "Distro": {"Pacstrap": {"KeyringInitCmd": "pacman-key --init && pacman-key --populate archlinux\n"}},
            "ExtraPacmanConf": "", "RuntimePacmanConf": "", "Packages": ["base", "linux", "openssh"],
        }),
        derive(&pacstrap, &[
            ("{{.Distro.Pacstrap.KeyringInitCmd}}", "pacman-key --init && pacman-key --populate archlinux\n"),
            (extra_conf_chunk, ""),
            ("{{range .Packages}}{{.}} {{end}}", "base linux openssh "),
            (runtime_chunk, ""),
        ]),
    ));
    let cachy_conf =
        "[cachyos-v3]\nServer = https://mirror.cachyos.org/repo/x86_64_v3/$repo\nSigLevel = Never";
    cases.push(case(
        "builder/pacstrap/phase/install/container",
        json!({
            "Distro": {"Pacstrap": {"KeyringInitCmd": "pacman-key --init && pacman-key --populate archlinux"}},
            "ExtraPacmanConf": cachy_conf, "RuntimePacmanConf": "[options]\nSigLevel = Never",
            "Packages": ["base", "linux-cachyos"],
        }),
        derive(&pacstrap, &[
            ("{{.Distro.Pacstrap.KeyringInitCmd}}", "pacman-key --init && pacman-key --populate archlinux"),
            ("\n{{- if .ExtraPacmanConf}}", ""),
            ("{{.ExtraPacmanConf}}", cachy_conf),
            ("cat /etc/pacman.conf.extra >> /etc/pacman.conf\n{{- end}}", "cat /etc/pacman.conf.extra >> /etc/pacman.conf"),
            ("{{range .Packages}}{{.}} {{end}}", "base linux-cachyos "),
            ("\n{{- if .RuntimePacmanConf}}", ""),
            ("{{.RuntimePacmanConf}}", "[options]\nSigLevel = Never"),
            ("CHARLY_RUNTIME_PACMAN_CONF\n{{- end}}", "CHARLY_RUNTIME_PACMAN_CONF"),
        ]),
    ));

    let manylinux = "RUN grep -q 'system-requirements' pixi.toml || printf '\\n[system-requirements]\\nlibc = { family = \"glibc\", version = \"2.39\" }\\n' >> pixi.toml\n";
    cases.push(case(
        "builder/pixi/manylinux_fix",
        json!({"Manifest": "pixi.toml"}),
        manylinux,
    ));
    let pixi_mounts = json!([{"dst": "/tmp/pixi-cache", "sharing": null, "owned": false}, {"dst": "/tmp/rattler-cache", "sharing": null, "owned": false}]);
    cases.push(case(
        "builder/pixi/stage_template",
        json!({
            "BuilderRef": BUILDER, "StageName": "jupyter-pixi-build", "UID": 1000, "GID": 1000, "Home": "/home/user",
            "CopySrc": "candy/jupyter", "Manifest": "pixi.toml", "HasLockFile": true,
            "ManylinuxFix": manylinux.trim_end(), "InstallCmd": "pixi install --frozen",
            "HasBuildScript": false, "BuildScript": "", "CacheMounts": pixi_mounts,
        }),
        r#"FROM ghcr.io/overthinkos/fedora-builder:2026.160.1301 AS jupyter-pixi-build
USER 1000
WORKDIR /home/user
COPY --chown=1000:1000 candy/jupyter/pixi.lock pixi.lock
COPY --chown=1000:1000 candy/jupyter/pixi.toml pixi.toml
RUN grep -q 'system-requirements' pixi.toml || printf '\n[system-requirements]\nlibc = { family = "glibc", version = "2.39" }\n' >> pixi.toml
ENV PIXI_CACHE_DIR=/tmp/pixi-cache RATTLER_CACHE_DIR=/tmp/rattler-cache
RUN --mount=type=cache,id=charly-tmp-pixi-cache-uid1000,dst=/tmp/pixi-cache,uid=1000,gid=1000 \
    --mount=type=cache,id=charly-tmp-rattler-cache-uid1000,dst=/tmp/rattler-cache,uid=1000,gid=1000 \
    pixi install --frozen && rm -f pixi.toml pixi.lock
"#,
    ));
    let pixi = tp("builder/pixi/stage_template");
    let owned_pixi = "--mount=type=cache,id=charly-tmp-pixi-cache-uid1000,dst=/tmp/pixi-cache,uid=1000,gid=1000 \\\n    --mount=type=cache,id=charly-tmp-rattler-cache-uid1000,dst=/tmp/rattler-cache,uid=1000,gid=1000 \\\n    ";
    cases.push(case(
        "builder/pixi/stage_template",
        json!({
            "BuilderRef": BUILDER, "StageName": "selkies-pixi-build", "UID": 1000, "GID": 1000, "Home": "/home/user",
            "CopySrc": ".build/_layers/selkies", "Manifest": "pyproject.toml", "HasLockFile": false,
            "ManylinuxFix": "", "InstallCmd": "pixi install --manifest-path pyproject.toml",
            "HasBuildScript": true, "BuildScript": "build.sh", "CacheMounts": pixi_mounts,
        }),
        derive(&pixi, &[
            ("\n{{- if .HasLockFile}}\nCOPY --chown={{.UID}}:{{.GID}} {{.CopySrc}}/pixi.lock pixi.lock\n{{- end}}", ""),
            ("\n{{- if .HasBuildScript}}", ""),
            ("\n{{- else}}\nRUN {{cacheMountsOwned .CacheMounts .UID .GID}}{{.InstallCmd}} && rm -f {{.Manifest}} pixi.lock\n{{- end}}", ""),
            ("{{cacheMountsOwned .CacheMounts .UID .GID}}", owned_pixi),
            ("{{.ManylinuxFix}}", ""),
            ("{{.BuilderRef}}", BUILDER),
            ("{{.StageName}}", "selkies-pixi-build"),
            ("{{.UID}}", "1000"),
            ("{{.GID}}", "1000"),
            ("{{.Home}}", "/home/user"),
            ("{{.CopySrc}}", ".build/_layers/selkies"),
            ("{{.Manifest}}", "pyproject.toml"),
            ("{{.InstallCmd}}", "pixi install --manifest-path pyproject.toml"),
            ("{{.BuildScript}}", "build.sh"),
        ]),
    ));

    // --- distros: VM bootloader templates (kept subtrees) and cachyos' runtime pacman.conf
    for distro in ["arch", "debian"] {
        for name in ["install_template", "initramfs_template", "fstab_template"] {
            let path: &'static str =
                Box::leak(format!("distro/{distro}/bootloader/{name}").into_boxed_str());
            let text = tp(path);
            let mut repl = vec![("{{.Mnt}}", "/mnt")];
            if text.contains("{{.SSHUser}}") {
                repl.push(("{{.SSHUser}}", "charly"));
            }
            if text.contains("{{.Rootfs}}") {
                repl.push(("{{.Rootfs}}", "ext4"));
            }
            cases.push(case(
                path,
                json!({"Mnt": "/mnt", "SSHUser": "charly", "Rootfs": "ext4"}),
                derive(&text, &repl),
            ));
        }
    }
    cases.push(case(
        "distro/cachyos/pacstrap/runtime_pacman_conf",
        json!({"ExtraRepos": [
            {"Name": "cachyos-v3", "Server": "https://mirror.cachyos.org/repo/x86_64_v3/$repo"},
            {"Name": "cachyos", "Server": "https://mirror.cachyos.org/repo/$arch/$repo"},
        ]}),
        "[options]
Architecture = x86_64 x86_64_v3
SigLevel = Never
ParallelDownloads = 5
[cachyos-v3]
Server = https://mirror.cachyos.org/repo/x86_64_v3/$repo
[cachyos]
Server = https://mirror.cachyos.org/repo/$arch/$repo
[core]
Include = /etc/pacman.d/mirrorlist
[extra]
Include = /etc/pacman.d/mirrorlist
",
    ));

    // --- arch formats
    cases.push(case(
        "distro/arch/format/aur/install_template",
        json!({"StageName": "chrome-aur-build", "CacheMounts": cache_mounts(&["/var/cache/pacman/pkg"]), "Packages": ["google-chrome"]}),
        format!("COPY --from=chrome-aur-build /tmp/aur-pkgs/ /tmp/aur-pkgs/\nRUN {PAC_MOUNT} \\\n    pacman -U --noconfirm /tmp/aur-pkgs/*.pkg.tar.zst && \\\n    rm -rf /tmp/aur-pkgs\n"),
    ));
    let pac = tp("distro/arch/format/pac/install_template");
    let pac_prelude = "\n{{- range .Keys}}
    pacman-key --recv-keys {{.}} && pacman-key --lsign-key {{.}} && \\
{{- end}}
{{- range .Repos}}
    printf '[{{.name}}]\\nServer = {{.server}}\\nSigLevel = {{default .siglevel \"Optional TrustAll\"}}\\n' >> /etc/pacman.conf && \\
{{- if .key}}
    pacman-key --recv-keys {{.key}} && pacman-key --lsign-key {{.key}} && \\
{{- end}}
{{- end}}";
    let pac_tail =
        "\n{{- range .Options}} {{.}}{{end}}\n{{- range .Packages}} \\\n      {{.}}{{end}}";
    cases.push(case(
        "distro/arch/format/pac/install_template",
        fmt_data(
            &["/var/cache/pacman/pkg"],
            json!({"Packages": ["ripgrep", "fd"]}),
        ),
        derive(
            &pac,
            &[
                ("{{cacheMounts .CacheMounts}}", PAC_MOUNT),
                (pac_prelude, ""),
                (pac_tail, " \\\n      ripgrep \\\n      fd"),
            ],
        ),
    ));
    cases.push(case(
        "distro/arch/format/pac/install_template",
        fmt_data(&["/var/cache/pacman/pkg"], json!({
            "Keys": ["F3B607488DB35A47"],
            "Repos": [
                {"name": "cachyos", "server": "https://mirror.cachyos.org/repo/$arch/$repo", "key": "F3B607488DB35A47"},
                {"name": "chaotic-aur", "server": "https://cdn-mirror.chaotic.cx/$repo/$arch", "siglevel": "Never"},
            ],
            "Options": ["--needed"], "Packages": ["cachyos-settings"],
        })),
        derive(&pac, &[
            ("{{cacheMounts .CacheMounts}}", PAC_MOUNT),
            (pac_prelude, "
    pacman-key --recv-keys F3B607488DB35A47 && pacman-key --lsign-key F3B607488DB35A47 && \\
    printf '[cachyos]\\nServer = https://mirror.cachyos.org/repo/$arch/$repo\\nSigLevel = Optional TrustAll\\n' >> /etc/pacman.conf && \\
    pacman-key --recv-keys F3B607488DB35A47 && pacman-key --lsign-key F3B607488DB35A47 && \\
    printf '[chaotic-aur]\\nServer = https://cdn-mirror.chaotic.cx/$repo/$arch\\nSigLevel = Never\\n' >> /etc/pacman.conf && \\"),
            (pac_tail, " --needed \\\n      cachyos-settings"),
        ]),
    ));
    let lp = json!({"SrcDir": "/home/user/src/overthink/pkg/arch", "PkgDest": "/tmp/charly-localpkg-1", "StageDir": "/tmp/charly-pkgs", "Glob": "*.pkg.tar.zst"});
    cases.push(case("distro/arch/format/pac/local_pkg/build_template", lp.clone(),
        "cd /home/user/src/overthink/pkg/arch && PKGDEST=/tmp/charly-localpkg-1 makepkg -sf --noconfirm\n"));
    cases.push(case(
        "distro/arch/format/pac/local_pkg/install_template",
        lp,
        "pacman -U --noconfirm /tmp/charly-pkgs/*.pkg.tar.zst\n",
    ));
    cases.push(case(
        "distro/arch/format/pac/phase/install/host",
        json!({"Options": [], "Packages": ["ripgrep", "fd"]}),
        "pacman -Sy --noconfirm --needed ripgrep fd\n",
    ));
    cases.push(case(
        "distro/arch/format/pac/phase/install/host",
        json!({"Options": ["--overwrite=/usr/lib/x"], "Packages": null}),
        "pacman -Sy --noconfirm --needed --overwrite=/usr/lib/x\n",
    ));
    cases.push(case(
        "distro/arch/format/pac/uninstall_template",
        json!({"Packages": ["ripgrep", "fd"]}),
        "pacman -Rs --noconfirm ripgrep fd\n",
    ));

    // --- debian formats
    cases.push(case(
        "distro/debian/format/deb/install_template",
        fmt_data(&["/var/cache/apt", "/var/lib/apt"], json!({"Packages": ["ripgrep", "fd-find"]})),
        format!("RUN {APT_MOUNTS} \\\n    apt-get update && apt-get install -y --no-install-recommends \\\n      ripgrep \\\n      fd-find\n"),
    ));
    cases.push(case(
        "distro/debian/format/deb/install_template",
        fmt_data(&["/var/cache/apt", "/var/lib/apt"], json!({
            "Repos": [{"name": "tailscale", "key": "https://pkgs.tailscale.com/stable/debian/bookworm.noarmor.gpg",
                       "url": "https://pkgs.tailscale.com/stable/debian", "suite": "bookworm"}],
            "Options": ["--allow-downgrades"], "Packages": ["tailscale"],
        })),
        format!(r#"RUN {APT_MOUNTS} \
    curl -fsSL "https://pkgs.tailscale.com/stable/debian/bookworm.noarmor.gpg" | gpg --batch --yes --dearmor -o /etc/apt/keyrings/tailscale.gpg && \
    echo "deb [signed-by=/etc/apt/keyrings/tailscale.gpg] https://pkgs.tailscale.com/stable/debian bookworm main" > /etc/apt/sources.list.d/tailscale.list && \
    apt-get update && apt-get install -y --no-install-recommends --allow-downgrades \
      tailscale
"#),
    ));
    // A flat repository (suite "/") without key, and one with an existing keyring.
    cases.push(case(
        "distro/debian/format/deb/install_template",
        fmt_data(&["/var/cache/apt", "/var/lib/apt"], json!({
            "Repos": [
                {"name": "obs-tools", "url": "https://download.opensuse.org/repositories/home:/tools/Debian_12/", "suite": "/"},
                {"name": "docker", "url": "https://download.docker.com/linux/debian", "suite": "bookworm",
                 "components": "stable", "signed_by": "/usr/share/keyrings/docker.gpg"},
            ],
            "Packages": ["docker-ce", "tools"],
        })),
        format!(r#"RUN {APT_MOUNTS} \
    echo "deb [] https://download.opensuse.org/repositories/home:/tools/Debian_12/ /" > /etc/apt/sources.list.d/obs-tools.list && \
    echo "deb [signed-by=/usr/share/keyrings/docker.gpg] https://download.docker.com/linux/debian bookworm stable" > /etc/apt/sources.list.d/docker.list && \
    apt-get update && apt-get install -y --no-install-recommends \
      docker-ce \
      tools
"#),
    ));
    // A PPA and an empty package list: the RUN is still rendered.
    cases.push(case(
        "distro/debian/format/deb/install_template",
        fmt_data(&["/var/cache/apt", "/var/lib/apt"], json!({"Repos": [{"ppa": "git-core/ppa"}]})),
        format!("RUN {APT_MOUNTS} \\\n    add-apt-repository -y ppa:git-core/ppa && \\\n    apt-get update && apt-get install -y --no-install-recommends\n"),
    ));
    cases.push(case(
        "distro/debian/format/deb/phase/install/host",
        json!({"Repos": null, "Options": [], "Packages": ["ripgrep"]}),
        "\nDEBIAN_FRONTEND=noninteractive apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y ripgrep\n",
    ));
    cases.push(case(
        "distro/debian/format/deb/phase/install/host",
        json!({
            "Repos": [{"name": "tailscale", "key": "https://pkgs.tailscale.com/stable/debian/bookworm.noarmor.gpg",
                       "url": "https://pkgs.tailscale.com/stable/debian", "suite": "bookworm"}],
            "Options": ["-q"], "Packages": ["tailscale"],
        }),
        r#"
mkdir -p /etc/apt/keyrings && curl -fsSL "https://pkgs.tailscale.com/stable/debian/bookworm.noarmor.gpg" | gpg --batch --yes --dearmor -o /etc/apt/keyrings/tailscale.gpg && \
echo "deb [signed-by=/etc/apt/keyrings/tailscale.gpg] https://pkgs.tailscale.com/stable/debian bookworm main" > /etc/apt/sources.list.d/tailscale.list && \
DEBIAN_FRONTEND=noninteractive apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y -q tailscale
"#,
    ));
    cases.push(case(
        "distro/debian/format/deb/uninstall_template",
        json!({"Packages": ["ripgrep", "fd-find"]}),
        "DEBIAN_FRONTEND=noninteractive apt-get purge -y ripgrep fd-find\n",
    ));
    let lp = json!({"SrcDir": "/home/user/src/overthink/pkg/deb", "PkgDest": "/tmp/charly-localpkg-2", "StageDir": "/tmp/charly-pkgs", "Glob": "*.deb"});
    let deb_build = tp("distro/debian/format/deb/local_pkg/build_template");
    cases.push(case(
        "distro/debian/format/deb/local_pkg/build_template",
        lp.clone(),
        derive(
            &deb_build,
            &[
                ("{{.SrcDir}}", "/home/user/src/overthink/pkg/deb"),
                ("{{.PkgDest}}", "/tmp/charly-localpkg-2"),
            ],
        ),
    ));
    cases.push(case("distro/debian/format/deb/local_pkg/install_template", lp,
        "DEBIAN_FRONTEND=noninteractive apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y /tmp/charly-pkgs/*.deb\n"));

    // --- fedora formats
    cases.push(case(
        "distro/fedora/format/rpm/install_template",
        fmt_data(
            &["/var/cache/libdnf5"],
            json!({"Packages": ["git", "htop"]}),
        ),
        format!("RUN {RPM_MOUNT} \\\n    dnf install -y \\\n      git \\\n      htop\n"),
    ));
    cases.push(case(
        "distro/fedora/format/rpm/install_template",
        fmt_data(&["/var/cache/libdnf5"], json!({})),
        format!("RUN {RPM_MOUNT} \\\n    dnf install -y\n"),
    ));
    cases.push(case(
        "distro/fedora/format/rpm/install_template",
        fmt_data(&["/var/cache/libdnf5"], json!({
            "Repos": [{"name": "rpmfusion-free", "rpm": "https://mirrors.rpmfusion.org/free/fedora/rpmfusion-free-release-43.noarch.rpm"}],
            "Options": ["--setopt=install_weak_deps=False"], "Exclude": ["*-debuginfo"], "Packages": ["ffmpeg"],
        })),
        format!(r#"RUN {RPM_MOUNT} \
    dnf install -y "https://mirrors.rpmfusion.org/free/fedora/rpmfusion-free-release-43.noarch.rpm" && \
    dnf install -y --setopt=install_weak_deps=False --exclude='*-debuginfo' \
      ffmpeg
"#),
    ));
    cases.push(case(
        "distro/fedora/format/rpm/install_template",
        fmt_data(&["/var/cache/libdnf5"], json!({
            "Repos": [{"name": "tailscale-stable", "url": "https://pkgs.tailscale.com/stable/fedora/tailscale.repo", "gpgcheck": false}],
            "Copr": ["atim/starship"], "Modules": ["nodejs:20"], "Packages": ["tailscale", "starship"],
        })),
        format!(r#"RUN {RPM_MOUNT} \
    dnf install -y dnf5-plugins && \
    dnf5 config-manager addrepo --from-repofile="https://pkgs.tailscale.com/stable/fedora/tailscale.repo" 2>/dev/null || true && \
    dnf5 config-manager setopt "tailscale-stable.enabled=0" && \
    dnf5 config-manager setopt "tailscale-stable.gpgcheck=0" && \
    dnf5 copr enable -y atim/starship && \
    dnf module reset -y nodejs && \
    dnf module enable -y nodejs:20 && \
    dnf install -y --enable-repo="tailscale-stable" \
      tailscale \
      starship && \
    dnf5 config-manager setopt "copr:copr.fedorainfracloud.org:atim:starship.enabled=0"
"#),
    ));
    cases.push(case(
        "distro/fedora/format/rpm/install_template",
        fmt_data(&["/var/cache/libdnf5"], json!({
            "Repos": [{"name": "vscode", "url": "https://packages.microsoft.com/yumrepos/vscode",
                       "gpgkey": "https://packages.microsoft.com/keys/microsoft.asc"}],
            "Packages": ["code"],
        })),
        format!(r#"RUN {RPM_MOUNT} \
    dnf install -y dnf5-plugins && \
    printf '%s\n' '[vscode]' 'name=vscode' 'baseurl=https://packages.microsoft.com/yumrepos/vscode' 'enabled=0' 'gpgcheck=1' 'gpgkey=https://packages.microsoft.com/keys/microsoft.asc' > /etc/yum.repos.d/vscode.repo && \
    rpm --import https://packages.microsoft.com/keys/microsoft.asc || true && \
    dnf install -y --enable-repo="vscode" \
      code
"#),
    ));
    // A baseurl repo with gpgcheck off: no .repo-file setopt, gpgcheck=0 in the file.
    cases.push(case(
        "distro/fedora/format/rpm/install_template",
        fmt_data(&["/var/cache/libdnf5"], json!({
            "Repos": [{"name": "local", "url": "http://repo.lan/fedora/43", "gpgcheck": "false"}],
            "Copr": null, "Packages": ["tool"],
        })),
        format!(r#"RUN {RPM_MOUNT} \
    dnf install -y dnf5-plugins && \
    printf '%s\n' '[local]' 'name=local' 'baseurl=http://repo.lan/fedora/43' 'enabled=0' 'gpgcheck=0' > /etc/yum.repos.d/local.repo && \
    dnf install -y --enable-repo="local" \
      tool
"#),
    ));
    cases.push(case(
        "distro/fedora/format/rpm/phase/install/host",
        json!({"Options": ["--allowerasing"], "Packages": ["git", "htop"]}),
        "dnf install -y --allowerasing git htop\n",
    ));
    cases.push(case(
        "distro/fedora/format/rpm/uninstall_template",
        json!({"Packages": ["git", "htop"]}),
        "dnf remove -y git htop\n",
    ));
    let lp = json!({"SrcDir": "/home/user/src/overthink/pkg/rpm", "PkgDest": "/tmp/charly-localpkg-3", "StageDir": "/tmp/charly-pkgs", "Glob": "*.rpm"});
    let rpm_build = tp("distro/fedora/format/rpm/local_pkg/build_template");
    cases.push(case(
        "distro/fedora/format/rpm/local_pkg/build_template",
        lp.clone(),
        derive(
            &rpm_build,
            &[
                ("{{.SrcDir}}", "/home/user/src/overthink/pkg/rpm"),
                ("{{.PkgDest}}", "/tmp/charly-localpkg-3"),
            ],
        ),
    ));
    cases.push(case(
        "distro/fedora/format/rpm/local_pkg/install_template",
        lp,
        "dnf install -y /tmp/charly-pkgs/*.rpm\n",
    ));

    // --- init systems
    let svc = json!({"Service": "jupyter"});
    for (cmd, want) in [
        ("restart", "restart jupyter"),
        ("start", "start jupyter"),
        ("stop", "stop jupyter"),
        ("status", "status"),
    ] {
        let path: &'static str =
            Box::leak(format!("init/supervisord/management_command/{cmd}").into_boxed_str());
        cases.push(case(path, svc.clone(), want));
    }
    for (cmd, want) in [
        ("restart", "--user restart jupyter"),
        ("start", "--user start jupyter"),
        ("status", "--user status jupyter"),
        ("stop", "--user stop jupyter"),
    ] {
        let path: &'static str =
            Box::leak(format!("init/systemd/management_command/{cmd}").into_boxed_str());
        cases.push(case(path, svc.clone(), want));
    }
    let frag =
        json!({"ImageName": "jupyter", "FragmentDir": "supervisor", "FileName": "03-jupyter.conf"});
    cases.push(case(
        "init/supervisord/stage_fragment_copy",
        frag,
        "COPY .build/jupyter/supervisor/03-jupyter.conf /supervisor/03-jupyter.conf",
    ));
    let frag = json!({"ImageName": "fedora-bootc", "FragmentDir": "systemd", "FileName": "ollama.service"});
    cases.push(case(
        "init/systemd/stage_fragment_copy",
        frag,
        "COPY .build/fedora-bootc/systemd/ollama.service /systemd/ollama.service",
    ));
    cases.push(case(
        "init/supervisord/relay_template",
        json!({"Port": 8888, "LayerName": "jupyter", "Index": 1}),
        "[program:relay-8888]
command=/usr/local/bin/relay-wrapper 8888
autostart=true
autorestart=true
priority=1
startsecs=0
stdout_logfile=/dev/fd/1
stdout_logfile_maxbytes=0
redirect_stderr=true
",
    ));
    cases.push(case(
        "init/supervisord/service_schema/service_template",
        verified_program_data(),
        VERIFIED_PROGRAM,
    ));
    cases.push(case(
        "init/supervisord/service_schema/service_template",
        eventlistener_data(),
        EVENTLISTENER,
    ));
    cases.push(case(
        "init/supervisord/service_schema/service_template",
        full_program_data(),
        FULL_PROGRAM,
    ));
    // A pointer to true prints autostart=true explicitly (same text as unset).
    cases.push(case(
        "init/supervisord/service_schema/service_template",
        service(json!({"Name": "x", "Exec": "/bin/x", "AutoStart": [true], "Restart": "on-failure"})),
        "[program:x]\ncommand=/bin/x\nautostart=true\nautorestart=true\nstdout_logfile=/dev/fd/1\nstdout_logfile_maxbytes=0\nredirect_stderr=true\n",
    ));
    cases.push(case(
        "init/systemd/service_schema/service_template",
        user_unit_data(),
        USER_UNIT,
    ));
    cases.push(case(
        "init/systemd/service_schema/service_template",
        system_unit_data(),
        SYSTEM_UNIT,
    ));
    cases.push(case(
        "init/systemd/service_schema/service_template",
        minimal_system_unit_data(),
        MINIMAL_SYSTEM_UNIT,
    ));
    cases.push(case(
        "init/systemd/service_schema/unit_path_template",
        json!({"Scope": "user", "Home": "/home/user", "Name": "charly-foo-web"}),
        "/home/user/.config/systemd/user/charly-foo-web.service",
    ));
    cases.push(case(
        "init/systemd/service_schema/unit_path_template",
        json!({"Scope": "system", "Home": "/home/user", "Name": "charly-db-postgres"}),
        "/etc/systemd/system/charly-db-postgres.service",
    ));
    cases.push(case("init/systemd/system_enable_template", json!({"Units": ["sshd.service", "podman.socket"]}),
        "# Enable system-level services\nRUN systemctl enable sshd.service && \\\n   systemctl enable podman.socket\n"));
    cases.push(case(
        "init/systemd/system_enable_template",
        json!({"Units": ["sshd.service"]}),
        "# Enable system-level services\nRUN systemctl enable sshd.service\n",
    ));

    // Templates without actions render verbatim.
    for (path, text) in t {
        if !text.contains("{{") {
            let path: &'static str = Box::leak(path.clone().into_boxed_str());
            cases.push(case(
                path,
                json!({"Home": "/home/user", "Packages": ["x"]}),
                text.clone(),
            ));
        }
    }
    cases
}

#[test]
fn corpus_vocabulary_templates_render_exactly() {
    let (_, docs) = corpus_build_yml();
    let templates = all_templates(&docs);
    for (path, text) in &templates {
        check(path, text).unwrap_or_else(|e| panic!("{e}"));
    }
    let cases = corpus_cases(&templates);
    run_cases("charly/build.yml", &templates, &cases);
}

// ---------------------------------------------------------------------------
// Part 3: every template of the embedded default vocabulary

#[test]
fn default_vocabulary_loads_without_warnings() {
    let (text, docs) = default_build_yml();
    assert_eq!(
        text,
        charly_rules::load::DEFAULT_VOCAB,
        "the embedded text is the file"
    );
    assert_eq!(docs.len(), 1);
    let mut warnings = Vec::new();
    let doc: RootDoc = yaml::from_node(&docs[0], &mut warnings).unwrap_or_else(|e| panic!("{e:?}"));
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(
        doc.version.as_ref().map(|v| v.value.as_str()),
        Some(charly_rules::load::SCHEMA_VERSION)
    );
    assert_eq!(
        doc.distro.keys().collect::<Vec<_>>(),
        ["fedora", "debian", "ubuntu", "arch"]
    );
    assert_eq!(
        doc.builder.keys().collect::<Vec<_>>(),
        ["npm", "pixi", "cargo", "aur"]
    );
    assert_eq!(
        doc.init.keys().collect::<Vec<_>>(),
        ["supervisord", "systemd"]
    );
    let arch = doc.distro.get("arch").expect("arch");
    assert_eq!(arch.format.keys().collect::<Vec<_>>(), ["pac", "aur"]);
    assert!(arch.format.get("aur").is_some_and(|f| f.secondary));
    let ubuntu = doc.distro.get("ubuntu").expect("ubuntu");
    assert_eq!(
        ubuntu.inherits.as_ref().map(|i| i.value.as_str()),
        Some("debian")
    );
    let user = ubuntu.base_user.as_ref().expect("base_user");
    assert_eq!(
        (user.name.as_str(), user.uid, user.gid),
        ("ubuntu", 1000, 1000)
    );
    for (name, d) in doc.distro.iter() {
        if name.value != "ubuntu" {
            let b = d.bootstrap.as_ref().expect("bootstrap");
            assert!(
                !b.install_cmd.is_empty() && !b.package.is_empty() && !b.cache_mount.is_empty(),
                "{}",
                name.value
            );
            for (f, fmt) in d.format.iter() {
                assert!(
                    !fmt.cache_mount.is_empty() && fmt.install_template.is_some(),
                    "{}/{}",
                    name.value,
                    f.value
                );
                if !fmt.secondary {
                    let lp = fmt.local_pkg.as_ref().expect("local_pkg");
                    assert!(
                        lp.download_template.is_none()
                            && lp.build_template.is_some()
                            && lp.probe.is_some()
                    );
                    assert!(fmt.uninstall_template.is_some());
                }
            }
        }
    }
    let npm = doc.builder.get("npm").expect("npm");
    assert_eq!(npm.path_contribution, ["~/.npm-global/bin"]);
    let pixi = doc.builder.get("pixi").expect("pixi");
    assert_eq!(
        pixi.detect_file,
        ["pixi.toml", "pyproject.toml", "environment.yml"]
    );
    assert_eq!(
        pixi.path_contribution,
        ["~/.pixi/bin", "~/.pixi/envs/default/bin"]
    );
    let cargo = doc.builder.get("cargo").expect("cargo");
    assert!(cargo.inline && cargo.install_template.is_some());
    assert_eq!(
        doc.builder
            .get("aur")
            .and_then(|a| a.detect_config.clone())
            .as_deref(),
        Some("aur")
    );
    let systemd = doc.init.get("systemd").expect("systemd");
    assert_eq!(systemd.requires_capability, ["preserve_user"]);
    assert_eq!(systemd.model.as_deref(), Some("file_copy"));
    assert_eq!(
        doc.init
            .get("supervisord")
            .and_then(|s| s.model.clone())
            .as_deref(),
        Some("fragment_assembly")
    );
}

fn default_cases(t: &BTreeMap<String, String>) -> Vec<Case> {
    let tp = |p: &str| {
        t.get(p)
            .cloned()
            .unwrap_or_else(|| panic!("no template {p}"))
    };
    let builder = "ghcr.io/example/fedora-builder:1";
    let mut cases = Vec::new();

    // --- builders
    let aur_host = tp("builder/aur/phase/install/host");
    cases.push(case(
        "builder/aur/phase/install/host",
        json!({"Packages": ["google-chrome", "foo;rm"]}),
        derive(
            &aur_host,
            &[(
                "{{range .Packages}} {{shquote .}}{{end}}",
                " google-chrome 'foo;rm'",
            )],
        ),
    ));
    cases.push(case(
        "builder/aur/stage_template",
        json!({
            "BuilderRef": "ghcr.io/example/arch-builder:1", "StageName": "chrome-aur-build",
            "User": "user", "UID": 1000, "GID": 1000, "Home": "/home/user",
            "CacheMounts": [
                {"dst": "/var/cache/pacman/pkg", "sharing": null, "owned": false},
                {"dst": "/tmp/charly-aur-cache", "sharing": null, "owned": true},
            ],
            "Options": [], "Packages": ["google-chrome"],
        }),
        r#"FROM ghcr.io/example/arch-builder:1 AS chrome-aur-build
USER root
RUN printf '%s ALL=(ALL) NOPASSWD: ALL\n' user > /etc/sudoers.d/charly-aur && \
    chmod 0440 /etc/sudoers.d/charly-aur
USER 1000
WORKDIR /home/user
ENV XDG_CACHE_HOME=/tmp/charly-aur-cache
RUN --mount=type=cache,id=charly-var-cache-pacman-pkg,dst=/var/cache/pacman/pkg,sharing=locked \
    --mount=type=cache,id=charly-tmp-charly-aur-cache-uid1000,dst=/tmp/charly-aur-cache,uid=1000,gid=1000 \
    mkdir -p /tmp/charly-aur-build /tmp/aur-pkgs && \
    sudo pacman -Syu --noconfirm && \
    yay -S --noconfirm --needed --builddir /tmp/charly-aur-build google-chrome && \
    find /tmp/charly-aur-build -name '*.pkg.tar.zst' -exec cp {} /tmp/aur-pkgs/ \;
"#,
    ));
    cases.push(case(
        "builder/aur/stage_template",
        json!({
            "BuilderRef": "b:1", "StageName": "x-aur-build", "User": "dev user", "UID": 1001, "GID": 100,
            "Home": "/home/dev", "CacheMounts": [], "Options": ["--mflags", "--nocheck"], "Packages": ["a", "b"],
        }),
        r#"FROM b:1 AS x-aur-build
USER root
RUN printf '%s ALL=(ALL) NOPASSWD: ALL\n' 'dev user' > /etc/sudoers.d/charly-aur && \
    chmod 0440 /etc/sudoers.d/charly-aur
USER 1001
WORKDIR /home/dev
ENV XDG_CACHE_HOME=/tmp/charly-aur-cache
RUN  \
    mkdir -p /tmp/charly-aur-build /tmp/aur-pkgs && \
    sudo pacman -Syu --noconfirm && \
    yay -S --noconfirm --needed --builddir /tmp/charly-aur-build --mflags --nocheck a b && \
    find /tmp/charly-aur-build -name '*.pkg.tar.zst' -exec cp {} /tmp/aur-pkgs/ \;
"#,
    ));
    let cargo_mount = json!([{"dst": "/tmp/cargo-cache", "sharing": null, "owned": false}]);
    cases.push(case(
        "builder/cargo/install_template",
        json!({"LayerStage": "mytool", "CacheMounts": cargo_mount, "UID": 1000, "GID": 1000, "Home": "/home/user"}),
        "RUN --mount=type=bind,from=mytool,source=/,target=/ctx \\
    --mount=type=cache,id=charly-tmp-cargo-cache-uid1000,dst=/tmp/cargo-cache,uid=1000,gid=1000 \\
    CARGO_HOME=/tmp/cargo-cache/home CARGO_TARGET_DIR=/tmp/cargo-cache/target cargo install --path /ctx --root /home/user/.cargo
",
    ));
    cases.push(case(
        "builder/cargo/install_template",
        json!({"LayerStage": "tool", "CacheMounts": cargo_mount, "UID": 0, "GID": 0, "Home": "/root"}),
        "RUN --mount=type=bind,from=tool,source=/,target=/ctx \\
    --mount=type=cache,id=charly-tmp-cargo-cache-uid0,dst=/tmp/cargo-cache,uid=0,gid=0 \\
    CARGO_HOME=/tmp/cargo-cache/home CARGO_TARGET_DIR=/tmp/cargo-cache/target cargo install --path /ctx --root /root/.cargo
",
    ));
    cases.push(case(
        "builder/npm/copy_artifact/0/src",
        json!({"Home": "/home/user"}),
        "/home/user/.npm-global",
    ));
    cases.push(case(
        "builder/npm/copy_artifact/0/dst",
        json!({"Home": "/root"}),
        "/root/.npm-global",
    ));
    cases.push(case(
        "builder/pixi/copy_artifact/0/src",
        json!({"Home": "/home/user"}),
        "/home/user/.pixi",
    ));
    cases.push(case(
        "builder/pixi/copy_artifact/0/dst",
        json!({"Home": "/root"}),
        "/root/.pixi",
    ));
    let npm = tp("builder/npm/stage_template");
    let node_line = tp("builder/npm/stage_template")
        .lines()
        .find(|l| l.starts_with("RUN {{cacheMountsOwned"))
        .map(|l| {
            l.trim_start_matches("RUN {{cacheMountsOwned .CacheMounts .UID .GID}}")
                .to_string()
        })
        .expect("RUN line");
    assert!(
        node_line.starts_with("node -e '") && !node_line.contains("{{"),
        "{node_line}"
    );
    cases.push(case(
        "builder/npm/stage_template",
        json!({
            "BuilderRef": builder, "StageName": "webtool-npm-build", "UID": 1000, "GID": 1000,
            "Home": "/home/user", "CopySrc": "candy/webtool",
            "CacheMounts": [{"dst": "/tmp/npm-cache", "sharing": null, "owned": false}],
        }),
        format!(
            "FROM ghcr.io/example/fedora-builder:1 AS webtool-npm-build
USER root
RUN install -d -o 1000 -g 1000 /home/user
USER 1000
WORKDIR /home/user
ENV NPM_CONFIG_PREFIX=/home/user/.npm-global NPM_CONFIG_CACHE=/tmp/npm-cache
COPY --chown=1000:1000 candy/webtool/package.json /tmp/charly-npm/package.json
RUN --mount=type=cache,id=charly-tmp-npm-cache-uid1000,dst=/tmp/npm-cache,uid=1000,gid=1000 \\
    {node_line}
"
        ),
    ));
    assert_eq!(npm.lines().count(), 8);
    let pixi_mounts = json!([{"dst": "/tmp/pixi-cache", "sharing": null, "owned": false}, {"dst": "/tmp/rattler-cache", "sharing": null, "owned": false}]);
    let owned_pixi = "--mount=type=cache,id=charly-tmp-pixi-cache-uid1000,dst=/tmp/pixi-cache,uid=1000,gid=1000 \\
    --mount=type=cache,id=charly-tmp-rattler-cache-uid1000,dst=/tmp/rattler-cache,uid=1000,gid=1000 \\
    ";
    cases.push(case(
        "builder/pixi/stage_template",
        json!({
            "BuilderRef": builder, "StageName": "jupyter-pixi-build", "UID": 1000, "GID": 1000, "Home": "/home/user",
            "CopySrc": "candy/jupyter", "Manifest": "pixi.toml", "HasLockFile": true, "ManylinuxFix": "",
            "InstallCmd": "pixi install --frozen", "HasBuildScript": false, "BuildScript": "", "CacheMounts": pixi_mounts,
        }),
        format!("FROM ghcr.io/example/fedora-builder:1 AS jupyter-pixi-build
USER root
RUN install -d -o 1000 -g 1000 /home/user
USER 1000
WORKDIR /home/user
ENV PIXI_CACHE_DIR=/tmp/pixi-cache RATTLER_CACHE_DIR=/tmp/rattler-cache
COPY --chown=1000:1000 candy/jupyter/pixi.toml pixi.toml
COPY --chown=1000:1000 candy/jupyter/pixi.lock pixi.lock
RUN {owned_pixi}pixi install --frozen
"),
    ));
    cases.push(case(
        "builder/pixi/stage_template",
        json!({
            "BuilderRef": builder, "StageName": "selkies-pixi-build", "UID": 1000, "GID": 1000, "Home": "/home/user",
            "CopySrc": ".build/_layers/selkies", "Manifest": "pyproject.toml", "HasLockFile": false, "ManylinuxFix": "",
            "InstallCmd": "pixi install --manifest-path pyproject.toml", "HasBuildScript": true, "BuildScript": "build.sh",
            "CacheMounts": pixi_mounts,
        }),
        format!("FROM ghcr.io/example/fedora-builder:1 AS selkies-pixi-build
USER root
RUN install -d -o 1000 -g 1000 /home/user
USER 1000
WORKDIR /home/user
ENV PIXI_CACHE_DIR=/tmp/pixi-cache RATTLER_CACHE_DIR=/tmp/rattler-cache
COPY --chown=1000:1000 .build/_layers/selkies/pyproject.toml pyproject.toml
COPY --chown=1000:1000 .build/_layers/selkies/build.sh /tmp/charly-build.sh
RUN {owned_pixi}pixi install --manifest-path pyproject.toml && \\
    bash /tmp/charly-build.sh
"),
    ));

    // --- arch
    cases.push(case(
        "distro/arch/format/aur/install_template",
        json!({"StageName": "chrome-aur-build", "CacheMounts": cache_mounts(&["/var/cache/pacman/pkg"]), "Packages": ["google-chrome"]}),
        format!("COPY --from=chrome-aur-build /tmp/aur-pkgs/ /tmp/aur-pkgs/\nRUN {PAC_MOUNT} \\\n    pacman -U --noconfirm --needed /tmp/aur-pkgs/*.pkg.tar.zst && \\\n    rm -rf /tmp/aur-pkgs\n"),
    ));
    cases.push(case(
        "distro/arch/format/pac/install_template",
        fmt_data(&["/var/cache/pacman/pkg"], json!({"Packages": ["ripgrep", "fd"]})),
        format!("RUN {PAC_MOUNT} \\\n    pacman -Syu --noconfirm --needed \\\n      ripgrep \\\n      fd\n"),
    ));
    cases.push(case(
        "distro/arch/format/pac/install_template",
        fmt_data(&["/var/cache/pacman/pkg"], json!({
            "Keys": ["3056513887B78AEB"],
            "Repos": [
                {"name": "chaotic-aur", "server": "https://cdn-mirror.chaotic.cx/$repo/$arch", "key": "3056513887B78AEB"},
                {"name": "local", "server": "file:///srv/repo", "siglevel": "Never"},
            ],
            "Options": ["--ask=4"], "Packages": ["chaotic-keyring"],
        })),
        format!(r#"RUN {PAC_MOUNT} \
    pacman-key --recv-keys 3056513887B78AEB && pacman-key --lsign-key 3056513887B78AEB && \
    printf '\n[%s]\nSigLevel = %s\nServer = %s\n' chaotic-aur 'Optional TrustAll' 'https://cdn-mirror.chaotic.cx/$repo/$arch' >> /etc/pacman.conf && \
    pacman-key --recv-keys 3056513887B78AEB && pacman-key --lsign-key 3056513887B78AEB && \
    printf '\n[%s]\nSigLevel = %s\nServer = %s\n' local Never file:///srv/repo >> /etc/pacman.conf && \
    pacman -Syu --noconfirm --needed --ask=4 \
      chaotic-keyring
"#),
    ));
    cases.push(case(
        "distro/arch/format/pac/local_pkg/build_template",
        json!({"SrcDir": "/home/user/src/app/pkg", "PkgDest": "/tmp/charly-localpkg-1"}),
        "cd /home/user/src/app/pkg && PKGDEST=/tmp/charly-localpkg-1 makepkg -sf --noconfirm\n",
    ));
    cases.push(case(
        "distro/arch/format/pac/local_pkg/build_template",
        json!({"SrcDir": "/home/user/My Projects/app", "PkgDest": "/tmp/out dir"}),
        "cd '/home/user/My Projects/app' && PKGDEST='/tmp/out dir' makepkg -sf --noconfirm\n",
    ));
    cases.push(case(
        "distro/arch/format/pac/local_pkg/install_template",
        json!({"StageDir": "/tmp/charly-pkgs", "Glob": "*.pkg.tar.zst"}),
        "pacman -U --noconfirm /tmp/charly-pkgs/*.pkg.tar.zst\n",
    ));
    cases.push(case(
        "distro/arch/format/pac/phase/install/host",
        json!({"Options": [], "Packages": ["ripgrep", "fd"]}),
        "pacman -Sy --noconfirm --needed ripgrep fd\n",
    ));
    cases.push(case(
        "distro/arch/format/pac/uninstall_template",
        json!({"Packages": ["ripgrep", "fd"]}),
        "pacman -Rs --noconfirm ripgrep fd\n",
    ));

    // --- debian
    let apt_tail = "    apt-get update && \\\n    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends";
    cases.push(case(
        "distro/debian/format/deb/install_template",
        fmt_data(
            &["/var/cache/apt", "/var/lib/apt"],
            json!({"Packages": ["ripgrep", "fd-find"]}),
        ),
        format!("RUN {APT_MOUNTS} \\\n{apt_tail} \\\n      ripgrep \\\n      fd-find\n"),
    ));
    cases.push(case(
        "distro/debian/format/deb/install_template",
        fmt_data(&["/var/cache/apt", "/var/lib/apt"], json!({
            "Repos": [{"name": "tailscale", "key": "https://pkgs.tailscale.com/stable/debian/bookworm.noarmor.gpg",
                       "url": "https://pkgs.tailscale.com/stable/debian", "suite": "bookworm"}],
            "Packages": ["tailscale"],
        })),
        format!(r#"RUN {APT_MOUNTS} \
    mkdir -p /etc/apt/keyrings && \
    curl -fsSL "https://pkgs.tailscale.com/stable/debian/bookworm.noarmor.gpg" | gpg --batch --yes --dearmor -o /etc/apt/keyrings/tailscale.gpg && \
    echo "deb [signed-by=/etc/apt/keyrings/tailscale.gpg] https://pkgs.tailscale.com/stable/debian bookworm main" > /etc/apt/sources.list.d/tailscale.list && \
{apt_tail} \
      tailscale
"#),
    ));
    cases.push(case(
        "distro/debian/format/deb/install_template",
        fmt_data(&["/var/cache/apt", "/var/lib/apt"], json!({
            "Repos": [
                {"name": "obs-tools", "url": "https://download.opensuse.org/repositories/home:/tools/Debian_12/", "suite": "/"},
                {"name": "docker", "url": "https://download.docker.com/linux/debian", "suite": "bookworm",
                 "components": "stable", "signed_by": "/usr/share/keyrings/docker.gpg"},
            ],
            "Options": ["--allow-downgrades"], "Packages": ["docker-ce"],
        })),
        format!(r#"RUN {APT_MOUNTS} \
    echo "deb https://download.opensuse.org/repositories/home:/tools/Debian_12/ /" > /etc/apt/sources.list.d/obs-tools.list && \
    echo "deb [signed-by=/usr/share/keyrings/docker.gpg] https://download.docker.com/linux/debian bookworm stable" > /etc/apt/sources.list.d/docker.list && \
{apt_tail} --allow-downgrades \
      docker-ce
"#),
    ));
    cases.push(case(
        "distro/debian/format/deb/install_template",
        fmt_data(
            &["/var/cache/apt", "/var/lib/apt"],
            json!({"Repos": [{"ppa": "git-core/ppa"}]}),
        ),
        format!(
            "RUN {APT_MOUNTS} \\\n    add-apt-repository -y ppa:git-core/ppa && \\\n{apt_tail}\n"
        ),
    ));
    cases.push(case(
        "distro/debian/format/deb/phase/install/host",
        json!({"Repos": [], "Options": [], "Packages": ["ripgrep"]}),
        "set -e\nDEBIAN_FRONTEND=noninteractive apt-get update\nDEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ripgrep\n",
    ));
    cases.push(case(
        "distro/debian/format/deb/phase/install/host",
        json!({
            "Repos": [{"name": "tailscale", "key": "https://pkgs.tailscale.com/stable/debian/bookworm.noarmor.gpg",
                       "url": "https://pkgs.tailscale.com/stable/debian", "suite": "bookworm"}, {"ppa": "git-core/ppa"}],
            "Options": ["-q"], "Packages": ["tailscale", "git"],
        }),
        r#"set -e
mkdir -p /etc/apt/keyrings
curl -fsSL "https://pkgs.tailscale.com/stable/debian/bookworm.noarmor.gpg" | gpg --batch --yes --dearmor -o /etc/apt/keyrings/tailscale.gpg
echo "deb [signed-by=/etc/apt/keyrings/tailscale.gpg] https://pkgs.tailscale.com/stable/debian bookworm main" > /etc/apt/sources.list.d/tailscale.list
add-apt-repository -y ppa:git-core/ppa
DEBIAN_FRONTEND=noninteractive apt-get update
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends -q tailscale git
"#,
    ));
    cases.push(case(
        "distro/debian/format/deb/uninstall_template",
        json!({"Packages": ["ripgrep", "fd-find"]}),
        "DEBIAN_FRONTEND=noninteractive apt-get purge -y ripgrep fd-find\n",
    ));
    cases.push(case(
        "distro/debian/format/deb/local_pkg/build_template",
        json!({"SrcDir": "/home/user/src/app/debian-pkg", "PkgDest": "/tmp/charly-localpkg-2"}),
        r#"set -e
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p /tmp/charly-localpkg-2
if [ -f /home/user/src/app/debian-pkg/DEBIAN/control ]; then
  cp -a /home/user/src/app/debian-pkg "$work/pkg"
  dpkg-deb --root-owner-group --build "$work/pkg" /tmp/charly-localpkg-2/
else
  command -v dpkg-buildpackage >/dev/null || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends dpkg-dev debhelper fakeroot; }
  cp -a /home/user/src/app/debian-pkg "$work/src"
  cd "$work/src"
  dpkg-buildpackage -us -uc -b
  cp "$work"/*.deb /tmp/charly-localpkg-2/
fi
"#,
    ));
    cases.push(case("distro/debian/format/deb/local_pkg/install_template",
        json!({"StageDir": "/tmp/charly-pkgs", "Glob": "*.deb"}),
        "DEBIAN_FRONTEND=noninteractive apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y /tmp/charly-pkgs/*.deb\n"));

    // --- fedora
    cases.push(case(
        "distro/fedora/format/rpm/install_template",
        fmt_data(
            &["/var/cache/libdnf5"],
            json!({"Packages": ["git", "htop"]}),
        ),
        format!("RUN {RPM_MOUNT} \\\n    dnf install -y \\\n      git \\\n      htop\n"),
    ));
    cases.push(case(
        "distro/fedora/format/rpm/install_template",
        fmt_data(&["/var/cache/libdnf5"], json!({"Packages": null})),
        format!("RUN {RPM_MOUNT} \\\n    true\n"),
    ));
    cases.push(case(
        "distro/fedora/format/rpm/install_template",
        fmt_data(&["/var/cache/libdnf5"], json!({
            "Repos": [{"name": "rpmfusion-free", "rpm": "https://mirrors.rpmfusion.org/free/fedora/rpmfusion-free-release-43.noarch.rpm"}],
            "Options": ["--setopt=install_weak_deps=False"], "Exclude": ["*-debuginfo"], "Packages": ["ffmpeg"],
        })),
        format!(r#"RUN {RPM_MOUNT} \
    dnf install -y "https://mirrors.rpmfusion.org/free/fedora/rpmfusion-free-release-43.noarch.rpm" && \
    dnf install -y --setopt=install_weak_deps=False --exclude='*-debuginfo' \
      ffmpeg
"#),
    ));
    cases.push(case(
        "distro/fedora/format/rpm/install_template",
        fmt_data(&["/var/cache/libdnf5"], json!({
            "Repos": [{"name": "tailscale-stable", "url": "https://pkgs.tailscale.com/stable/fedora/tailscale.repo", "gpgcheck": false}],
            "Copr": ["atim/starship"], "Modules": ["nodejs:20"], "Packages": ["tailscale", "starship"],
        })),
        format!(r#"RUN {RPM_MOUNT} \
    dnf install -y dnf5-plugins && \
    dnf5 config-manager addrepo --overwrite --from-repofile="https://pkgs.tailscale.com/stable/fedora/tailscale.repo" && \
    dnf5 config-manager setopt "tailscale-stable.enabled=0" "tailscale-stable.gpgcheck=0" && \
    dnf5 copr enable -y atim/starship && \
    dnf module reset -y nodejs && \
    dnf module enable -y nodejs:20 && \
    dnf install -y --enable-repo="tailscale-stable" \
      tailscale \
      starship && \
    dnf5 copr disable atim/starship
"#),
    ));
    cases.push(case(
        "distro/fedora/format/rpm/install_template",
        fmt_data(&["/var/cache/libdnf5"], json!({
            "Repos": [{"name": "vscode", "url": "https://packages.microsoft.com/yumrepos/vscode",
                       "gpgkey": "https://packages.microsoft.com/keys/microsoft.asc"}],
            "Packages": ["code"],
        })),
        format!(r#"RUN {RPM_MOUNT} \
    dnf install -y dnf5-plugins && \
    printf '%s\n' '[vscode]' name=vscode baseurl=https://packages.microsoft.com/yumrepos/vscode 'enabled=0' 'gpgcheck=1' gpgkey=https://packages.microsoft.com/keys/microsoft.asc > /etc/yum.repos.d/vscode.repo && \
    rpm --import https://packages.microsoft.com/keys/microsoft.asc && \
    dnf install -y --enable-repo="vscode" \
      code
"#),
    ));
    cases.push(case(
        "distro/fedora/format/rpm/phase/install/host",
        json!({"Options": ["--allowerasing"], "Packages": ["git", "htop"]}),
        "dnf install -y --allowerasing git htop\n",
    ));
    cases.push(case(
        "distro/fedora/format/rpm/uninstall_template",
        json!({"Packages": ["git", "htop"]}),
        "dnf remove -y git htop\n",
    ));
    cases.push(case(
        "distro/fedora/format/rpm/local_pkg/build_template",
        json!({"SrcDir": "/home/user/src/app/rpm", "PkgDest": "/tmp/charly-localpkg-3"}),
        r#"set -e
top=$(mktemp -d)
trap 'rm -rf "$top"' EXIT
cd /home/user/src/app/rpm
for spec in *.spec; do
  rpmbuild -bb --define "_topdir $top" --define "_sourcedir $PWD" "$spec"
done
mkdir -p /tmp/charly-localpkg-3
find "$top/RPMS" -name '*.rpm' -exec cp {} /tmp/charly-localpkg-3/ \;
"#,
    ));
    cases.push(case(
        "distro/fedora/format/rpm/local_pkg/install_template",
        json!({"StageDir": "/tmp/charly-pkgs", "Glob": "*.rpm"}),
        "dnf install -y /tmp/charly-pkgs/*.rpm\n",
    ));

    // --- init systems: the same data as the real vocabulary gives the same text
    let svc = json!({"Service": "jupyter"});
    for (cmd, want) in [
        ("restart", "restart jupyter"),
        ("start", "start jupyter"),
        ("status", "status jupyter"),
        ("stop", "stop jupyter"),
    ] {
        let path: &'static str =
            Box::leak(format!("init/supervisord/management_command/{cmd}").into_boxed_str());
        cases.push(case(path, svc.clone(), want));
    }
    for (cmd, want) in [
        ("restart", "--user restart jupyter"),
        ("start", "--user start jupyter"),
        ("status", "--user status jupyter"),
        ("stop", "--user stop jupyter"),
    ] {
        let path: &'static str =
            Box::leak(format!("init/systemd/management_command/{cmd}").into_boxed_str());
        cases.push(case(path, svc.clone(), want));
    }
    cases.push(case(
        "init/supervisord/stage_fragment_copy",
        json!({"ImageName": "jupyter", "FragmentDir": "supervisor", "FileName": "03-jupyter.conf"}),
        "COPY .build/jupyter/supervisor/03-jupyter.conf /supervisor/03-jupyter.conf",
    ));
    cases.push(case("init/systemd/stage_fragment_copy",
        json!({"ImageName": "fedora-bootc", "FragmentDir": "systemd", "FileName": "ollama.service"}),
        "COPY .build/fedora-bootc/systemd/ollama.service /systemd/ollama.service"));
    cases.push(case(
        "init/supervisord/relay_template",
        json!({"Port": 8888, "LayerName": "jupyter", "Index": 1}),
        "[program:relay-8888]\ncommand=/usr/local/bin/relay-wrapper 8888\nautostart=true\nautorestart=true\npriority=1\nstartsecs=0\nstdout_logfile=/dev/fd/1\nstdout_logfile_maxbytes=0\nredirect_stderr=true\n",
    ));
    let program = "init/supervisord/service_schema/service_template";
    cases.push(case(program, verified_program_data(), VERIFIED_PROGRAM));
    cases.push(case(program, eventlistener_data(), EVENTLISTENER));
    cases.push(case(program, full_program_data(), FULL_PROGRAM));
    cases.push(case(
        program,
        service(json!({"Name": "x", "Exec": "/bin/x", "AutoStart": [true], "Restart": "on-failure"})),
        "[program:x]\ncommand=/bin/x\nautostart=true\nautorestart=true\nstdout_logfile=/dev/fd/1\nstdout_logfile_maxbytes=0\nredirect_stderr=true\n",
    ));
    // The default template also takes AutoStart as a plain boolean.
    let mut plain = full_program_data();
    plain["AutoStart"] = json!(false);
    cases.push(case(program, plain, FULL_PROGRAM));
    let mut plain = verified_program_data();
    plain["AutoStart"] = json!(true);
    cases.push(case(program, plain, VERIFIED_PROGRAM));
    // Keys missing altogether behave like Go's zero values.
    cases.push(case(
        program,
        json!({"Name": "bare", "Exec": "/bin/bare", "Stdout": "none"}),
        "[program:bare]\ncommand=/bin/bare\nautostart=true\nautorestart=true\nstdout_logfile=/dev/null\nstdout_logfile_maxbytes=0\nredirect_stderr=true\n",
    ));
    let unit = "init/systemd/service_schema/service_template";
    cases.push(case(unit, user_unit_data(), USER_UNIT));
    cases.push(case(unit, system_unit_data(), SYSTEM_UNIT));
    cases.push(case(unit, minimal_system_unit_data(), MINIMAL_SYSTEM_UNIT));
    let mut logged = user_unit_data();
    logged["Stdout"] = json!("file:/var/log/web.log");
    cases.push(case(
        unit,
        logged,
        USER_UNIT.replace(
            "Environment=PORT=8080\n",
            "Environment=PORT=8080\nStandardOutput=append:/var/log/web.log\n",
        ),
    ));
    cases.push(case(
        "init/systemd/service_schema/unit_path_template",
        json!({"Scope": "user", "Home": "/home/user", "Name": "charly-foo-web"}),
        "/home/user/.config/systemd/user/charly-foo-web.service",
    ));
    cases.push(case(
        "init/systemd/service_schema/unit_path_template",
        json!({"Scope": "system", "Home": "/home/user", "Name": "charly-db-postgres"}),
        "/etc/systemd/system/charly-db-postgres.service",
    ));
    cases.push(case("init/systemd/system_enable_template", json!({"Units": ["sshd.service", "podman.socket"]}),
        "# Enable system services\nRUN systemctl enable sshd.service && \\\n   systemctl enable podman.socket\n"));
    cases.push(case(
        "init/systemd/system_enable_template",
        json!({"Units": ["sshd.service"]}),
        "# Enable system services\nRUN systemctl enable sshd.service\n",
    ));

    // Templates without actions render verbatim.
    for (path, text) in t {
        if !text.contains("{{") {
            let path: &'static str = Box::leak(path.clone().into_boxed_str());
            cases.push(case(
                path,
                json!({"Home": "/home/user", "Packages": ["x"]}),
                text.clone(),
            ));
        }
    }
    cases
}

#[test]
fn default_vocabulary_templates_render_exactly() {
    let (_, docs) = default_build_yml();
    let templates = all_templates(&docs);
    for (path, text) in &templates {
        check(path, text).unwrap_or_else(|e| panic!("{e}"));
    }
    let cases = default_cases(&templates);
    run_cases("vocab/default-build.yml", &templates, &cases);
}

/// The supervisord header and fragments the default assembly writes: the
/// built-in header is exactly this INI text.
#[test]
fn default_supervisord_header_is_valid_ini() {
    let (_, docs) = default_build_yml();
    let templates = all_templates(&docs);
    let assembly = &templates["init/supervisord/assembly_template"];
    let start = assembly.find("printf '%s\\n' ").expect("printf") + "printf '%s\\n' ".len();
    let end = assembly.find("; \\\n      cat").expect("cat");
    let words: Vec<String> = assembly[start..end]
        .split('\'')
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(_, w)| w.to_string())
        .collect();
    assert_eq!(
        words.join("\n"),
        "[supervisord]\nnodaemon=true\nlogfile=/dev/null\nlogfile_maxbytes=0\npidfile=/tmp/supervisord.pid\n\n\
         [unix_http_server]\nfile=/tmp/supervisor.sock\n\n\
         [rpcinterface:supervisor]\nsupervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface\n\n\
         [supervisorctl]\nserverurl=unix:///tmp/supervisor.sock\n"
    );
}

#[test]
fn hostile_nesting_is_an_error_not_a_crash() {
    // Run on a 1 MiB stack (rayon workers get 2 MiB) in a debug build.
    fn on_small_stack(text: String) -> Result<String, TemplateError> {
        std::thread::Builder::new()
            .stack_size(1024 * 1024)
            .spawn(move || render("deep", &text, &json!({"a": 1})))
            .expect("spawn")
            .join()
            .expect("no stack overflow")
    }
    let deep_if = "{{if true}}".repeat(5000) + &"{{end}}".repeat(5000);
    let e = check("deep", &deep_if).expect_err("too deep");
    assert!(e.message.contains("max expression depth exceeded"), "{e}");
    let deep_paren = "{{".to_string() + &"(".repeat(5000) + "1" + &")".repeat(5000) + "}}";
    let e = check("deep", &deep_paren).expect_err("too deep");
    assert!(e.message.contains("max expression depth exceeded"), "{e}");
    // The deepest nesting the parser accepts renders.
    let nested = "{{if true}}{{with .}}".repeat(49) + "ok" + &"{{end}}{{end}}".repeat(49);
    assert_eq!(on_small_stack(nested).expect("renders"), "ok");
    // Recursion through templates, alone or with nesting, is bounded.
    let recursive = "{{define \"r\"}}x{{template \"r\" .}}{{end}}{{template \"r\" .}}";
    let e = on_small_stack(recursive.to_string()).expect_err("recursion");
    assert!(e.message.contains("exceeded maximum template depth"), "{e}");
    let nested_recursion = "{{define \"r\"}}".to_string()
        + &"{{if true}}{{with .}}".repeat(45)
        + "x{{template \"r\" .}}"
        + &"{{end}}{{end}}".repeat(45)
        + "{{end}}{{template \"r\" .}}";
    let e = on_small_stack(nested_recursion).expect_err("recursion");
    assert!(e.message.contains("exceeded maximum template depth"), "{e}");
}
