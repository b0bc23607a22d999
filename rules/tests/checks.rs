//! Every `eval:` entry of the corpus parses into a check; none is dropped.

use charly_rules::check::{CheckKind, parse_checks};
use charly_rules::load::{self, LoadOptions};
use charly_rules::yaml::{Node, parse_stream};

use charly_testutil::corpus;

/// Every list under an `eval:` or `deploy_eval:` key, anywhere in a document.
fn eval_lists<'a>(n: &'a Node, out: &mut Vec<&'a Node>) {
    if let Some(m) = n.as_map() {
        for (k, v) in m {
            if matches!(k.as_str(), Some("eval" | "deploy_eval")) && v.as_seq().is_some() {
                out.push(v);
            } else {
                eval_lists(v, out);
            }
        }
    } else if let Some(s) = n.as_seq() {
        for i in s {
            eval_lists(i, out);
        }
    }
}

#[test]
fn every_corpus_eval_entry_parses() {
    let p = load::load(&corpus(), &LoadOptions::default()).expect("loads");
    let mut entries = 0;
    let mut checks = Vec::new();
    let mut diags = Vec::new();
    for i in 0..p.sources.len() as u32 {
        let f = p.sources.get(charly_rules::FileId(i)).expect("file");
        if f.rel.starts_with('<') {
            continue; // the embedded vocabulary
        }
        let Ok(docs) = parse_stream(charly_rules::FileId(i), &f.text) else {
            continue;
        };
        for d in &docs {
            let mut lists = Vec::new();
            eval_lists(d, &mut lists);
            for l in lists {
                entries += l.as_seq().map_or(0, <[Node]>::len);
                checks.extend(parse_checks(l, &f.rel, &mut diags));
            }
        }
    }
    let errors: Vec<String> = diags
        .iter()
        .filter(|d| d.is_error())
        .map(|d| d.one_line(&p.sources))
        .collect();
    assert!(errors.is_empty(), "{errors:#?}");
    assert_eq!(checks.len(), entries, "every entry became a check");
    assert!(
        entries >= 300,
        "the corpus has hundreds of checks, found {entries}"
    );
    let kinds = |f: fn(&CheckKind) -> bool| checks.iter().filter(|c| f(&c.kind)).count();
    assert!(kinds(|k| matches!(k, CheckKind::File { .. })) >= 100);
    assert!(kinds(|k| matches!(k, CheckKind::Command { .. })) >= 140);
    assert!(kinds(|k| matches!(k, CheckKind::Package { .. })) >= 20);
    assert!(kinds(|k| matches!(k, CheckKind::Service { .. })) >= 10);
    assert!(kinds(|k| matches!(k, CheckKind::Addr { .. })) >= 10);
}

fn without(text: &str) -> String {
    let docs = parse_stream(charly_rules::FileId(0), text).expect("parses");
    let mut lists = Vec::new();
    eval_lists(&docs[0], &mut lists);
    charly_rules::check::without_checks(text, &lists).into_owned()
}

#[test]
fn check_sections_are_left_out_of_key_text() {
    let plain = "candy:\n    name: a\n    package:\n        - jq\n";
    // In the middle, with comments and nested maps, block style.
    let mid = "candy:\n    name: a\n    eval:\n        # jq works\n        - id: jq\n          command: jq --version\n          stdout:\n            - matches: \"^jq-\"\n    package:\n        - jq\n";
    assert_eq!(without(mid), plain);
    // At the end, flow style on the key's line.
    let flow = format!("{plain}    eval: [{{file: /x, exists: true}}]\n");
    assert_eq!(without(&flow), plain);
    // A box's deploy_eval too.
    let b = "box:\n    name: b\n    deploy_eval:\n        - addr: 127.0.0.1:80\n          reachable: true\n    base: x\n";
    assert_eq!(without(b), "box:\n    name: b\n    base: x\n");
    // Every corpus candy keeps its non-check text and parses without checks.
    let p = load::load(&corpus(), &LoadOptions::default()).expect("corpus loads");
    let mut stripped = 0;
    for c in p.candies.values() {
        let Some(e) = &c.def.eval else { continue };
        let src = p.sources.get(c.file).expect("source");
        let t = charly_rules::check::without_checks(&src.text, &[&e.0]);
        assert!(t.len() < src.text.len(), "{}: eval removed", src.rel);
        assert!(!t.contains("\n    eval:"), "{}", src.rel);
        let docs = parse_stream(charly_rules::FileId(0), &t).expect("still YAML");
        assert!(docs[0].get("candy").and_then(|c| c.get("eval")).is_none());
        stripped += 1;
    }
    assert!(stripped > 20, "{stripped} corpus candies have checks");
}
