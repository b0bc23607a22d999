//! Every `eval:` entry of the corpus parses into a check; none is dropped.

use charly_rules::check::{CheckKind, parse_checks};
use charly_rules::load::{self, LoadOptions};
use charly_rules::yaml::{Node, parse_stream};
use std::path::PathBuf;

fn corpus() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/corpus/overthink")
}

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
