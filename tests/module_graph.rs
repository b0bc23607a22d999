//! Every crate's top-level modules form a DAG (issue 45): a module may
//! name, through `crate::`, only modules that do not name it back, directly
//! or through others. Product code only: `#[cfg(test)]` items are left out;
//! doc comments count, because a doc link is a reader's edge too. A new
//! two-way need fails here with the cycle it closes; break it by moving the
//! shared type down (or by a small trait), not by merging the files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

mod common;

use common::{CRATES, lib_doc, modules};

/// The module's files: `m.rs` and everything under `m/`.
fn files(src: &Path, m: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let single = src.join(format!("{m}.rs"));
    if single.is_file() {
        out.push(single);
    }
    let mut dirs = vec![src.join(m)];
    while let Some(d) = dirs.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// `text` without the items marked `#[cfg(test)]` (a `mod x;` line or a
/// braced item, skipped to its matching brace).
fn product_code(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines();
    while let Some(l) = lines.next() {
        if l.trim_start().starts_with("#[cfg(test)]") {
            let mut depth = 0i64;
            let mut opened = false;
            for l in lines.by_ref() {
                let t = l.trim_start();
                if !opened && t.starts_with("#[") {
                    continue;
                }
                for c in l.chars() {
                    match c {
                        '{' => {
                            depth += 1;
                            opened = true;
                        }
                        '}' => depth -= 1,
                        _ => {}
                    }
                }
                if (opened && depth <= 0) || (!opened && t.ends_with(';')) {
                    break;
                }
            }
            continue;
        }
        out.push_str(l);
        out.push('\n');
    }
    out
}

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The top-level modules `code` names through `crate::` (`crate::x::…` and
/// each path in `crate::{x, y::z}`).
fn named(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        if i > 0 {
            let prev = code.as_bytes()[i - 1];
            if prev.is_ascii_alphanumeric() || prev == b'_' {
                continue; // `charly_crate::`, `some_crate::`
            }
        }
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level entries of the group only.
            let mut depth = 0;
            let mut start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if c.is_whitespace() => {}
                    _ if start && depth == 0 => {
                        out.insert(ident(&group[j..]).to_string());
                        start = false;
                    }
                    _ => {}
                }
            }
        } else {
            out.insert(ident(rest).to_string());
        }
    }
    out
}

/// Strongly connected sets of more than one module (Tarjan).
fn cycles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    impl<'a> T<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on.insert(v);
            for w in &self.g[v] {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(lw);
                } else if self.on.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut comp = Vec::new();
                loop {
                    let w = self.stack.pop().unwrap();
                    self.on.remove(w);
                    comp.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    self.out.push(comp);
                }
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.out
}

fn graph(krate: &str) -> BTreeMap<String, BTreeSet<String>> {
    let src = charly_testutil::workspace().join(krate).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs");
    let mods: Vec<String> = modules(&lib)
        .into_iter()
        .filter(|m| m.file_backed)
        .map(|m| m.name)
        .collect();
    let known: BTreeSet<&str> = mods.iter().map(String::as_str).collect();
    let mut g = BTreeMap::new();
    for m in &mods {
        let mut edges = BTreeSet::new();
        for f in files(&src, m) {
            let text = std::fs::read_to_string(&f).expect("module file");
            for n in named(&product_code(&text)) {
                if n != *m && known.contains(n.as_str()) {
                    edges.insert(n);
                }
            }
        }
        g.insert(m.clone(), edges);
    }
    g
}

#[test]
fn every_crates_modules_form_a_dag() {
    let mut found = Vec::new();
    for c in CRATES {
        let g = graph(c);
        assert!(
            !g.is_empty(),
            "charly-{c} has no modules: the test reads the wrong place"
        );
        for comp in cycles(&g) {
            let edges: Vec<String> = comp
                .iter()
                .map(|m| {
                    let inside: Vec<&str> = g[m]
                        .iter()
                        .filter(|x| comp.contains(x))
                        .map(String::as_str)
                        .collect();
                    format!("    {m} → {}", inside.join(", "))
                })
                .collect();
            found.push(format!(
                "charly-{c}: {}\n{}",
                comp.join(", "),
                edges.join("\n")
            ));
        }
    }
    assert!(
        found.is_empty(),
        "module cycles (a module → the modules it names through `crate::`):\n{}",
        found.join("\n")
    );
}

/// The test's own reading, on made-up text: it must find what it is meant
/// to find, or a passing run above proves nothing.
#[test]
fn the_reader_finds_edges_groups_and_skips_tests() {
    let code = "use crate::a::X;\nuse crate::{b, c::{D, e}, \n f::G};\n/// See [`crate::h`].\n\
                #[cfg(test)]\nmod tests {\n    use crate::z;\n    fn f() { if true { crate::y(); } }\n}\n\
                let q = other_crate::k;\n";
    let got = named(&product_code(code));
    let want: BTreeSet<String> = ["a", "b", "c", "f", "h"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(got, want);

    let mut g = BTreeMap::new();
    let e = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    g.insert("a".to_string(), e(&["b"]));
    g.insert("b".to_string(), e(&["c"]));
    g.insert("c".to_string(), e(&["a"]));
    g.insert("d".to_string(), e(&["a"]));
    assert_eq!(
        cycles(&g),
        vec![vec!["a".to_string(), "b".into(), "c".into()]]
    );
    g.get_mut("c").unwrap().clear();
    assert!(cycles(&g).is_empty());
}

/// A `lib.rs` whose doc lists its modules "bottom first" promises an order
/// to read them in: each module names only modules its doc names before it.
#[test]
fn a_bottom_first_module_map_is_in_dependency_order() {
    let mut checked = 0;
    for c in CRATES {
        let lib = std::fs::read_to_string(charly_testutil::workspace().join(c).join("src/lib.rs"))
            .expect("lib.rs");
        let doc = lib_doc(&lib);
        if !doc.contains("bottom first") {
            continue;
        }
        checked += 1;
        let g = graph(c);
        let at = |m: &str| doc.find(&format!("[`{m}`]"));
        let mut wrong = Vec::new();
        for (m, deps) in &g {
            let Some(pm) = at(m) else {
                wrong.push(format!("{m} is not in the map"));
                continue;
            };
            for d in deps {
                if at(d).is_none_or(|pd| pd > pm) {
                    wrong.push(format!("{m} names {d}, listed after it"));
                }
            }
        }
        assert!(
            wrong.is_empty(),
            "charly-{c}'s module map is out of order:\n{}",
            wrong.join("\n")
        );
    }
    assert!(
        checked > 0,
        "no crate's map says `bottom first`: the test checks nothing"
    );
}
