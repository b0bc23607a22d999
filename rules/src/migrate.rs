//! `charly migrate --to 2026.174`: a classic (2026.160) project as node-form
//! files (schema 2026.174).
//!
//! Pure: [`to_nodeform`] takes a loaded classic [`Project`] and returns the
//! files to write (paths relative to the project root, contents) and one
//! warning per field the node form cannot express, at its file:line:col.
//! The CLI decides where and whether to write.
//!
//! The conversion is syntactic, on the spanned YAML tree the loader read,
//! so every scalar keeps the exact text its author wrote (a quoted `"0755"`
//! stays quoted): each `candy:`/`box:` becomes a name-first node whose
//! kind value holds the scalar fields and whose data children hold the
//! others (`redis-port: {port: […]}`); `task:` entries become `run:` steps,
//! `eval:` entries `check:` steps (`plugin: <subject>` + `plugin_input:`);
//! the vocabulary (`charly/build.yml` or `build.yml`) becomes
//! `charly/charly.yml` with one node per distro, builder, init. Comments
//! are not carried over. docs/format.md lists what is not expressible.

use crate::check::SUBJECTS;
use crate::diag::Diagnostic;
use crate::load::nodeform::{
    BOX_FIELDS, BOX_UNSUPPORTED, CANDY_FIELDS, NODE_KINDS, NODEFORM_SCHEMA_VERSION,
};
use crate::project::Project;
use crate::source::{FileId, Span};
use crate::yaml::{Node, Style, Value, parse_stream};

/// The schema versions `--to` accepts.
pub const TARGETS: [&str; 1] = ["2026.174"];

/// What a migration produces.
#[derive(Debug, Default)]
pub struct Migration {
    /// Files to write: path relative to the project root (`/`-separated,
    /// never absolute, never with `..`), and contents.
    pub files: Vec<(String, String)>,
    /// Files of the classic form the node form no longer reads (relative).
    pub obsolete: Vec<String>,
    /// One per field that could not be expressed (dropped), located.
    pub warnings: Vec<Diagnostic>,
    /// Files left as they are, with why (relative; e.g. a definition file
    /// already in the node form: converting it again would lose it).
    pub skipped: Vec<(String, String)>,
}

/// Directives of a root document that keep their meaning.
const ROOT_DIRECTIVES: [&str; 6] = [
    "version", "repo", "import", "discover", "defaults", "provides",
];

/// Classic task keys and their node-form names (`cmd` is special).
const TASK_RENAMES: [(&str, &str); 2] = [("user", "run_as"), ("include", "extract_include")];

/// Task keys written as they are.
const TASK_SAME: [&str; 18] = [
    "mkdir",
    "copy",
    "write",
    "link",
    "download",
    "setcap",
    "build",
    "mode",
    "to",
    "target",
    "content",
    "extract",
    "strip_components",
    "env",
    "caps",
    "cache",
    "uninstall",
    "comment",
];

/// Verbs of a task, for the `run:` text.
const TASK_VERBS: [&str; 8] = [
    "cmd", "mkdir", "copy", "write", "link", "download", "setcap", "build",
];

/// Check subjects written as `plugin: <word>` with `plugin_input:`; the
/// other subjects are verb keys of the step (`mcp:`, `cdp:`, `k8s:` as
/// `kube:`, …).
const PLUGIN_SUBJECTS: [&str; 9] = [
    "file", "command", "package", "service", "addr", "http", "process", "port", "matching",
];

/// Check keys that stay on the step (the rest goes into `plugin_input:`).
const CHECK_STEP_KEYS: [&str; 13] = [
    "id",
    "description",
    "timeout",
    "eventually",
    "retry_interval",
    "exclude_distro",
    "depends_on",
    "skip",
    "stdout",
    "stderr",
    "exit_status",
    "tag",
    "note",
];

/// Classic check keys with another name in a node-form step.
const CHECK_RENAMES: [(&str, &str); 3] = [
    ("k8s", "kube"),
    ("k8s_count", "kube_count"),
    ("k8s_kind", "kube_kind"),
];

/// Converts a loaded classic project. An already node-form project, or one
/// whose root could not be read, is an error.
pub fn to_nodeform(p: &Project, to: &str) -> Result<Migration, Diagnostic> {
    if !TARGETS.contains(&to) {
        return Err(Diagnostic::error(
            None,
            format!(
                "cannot migrate to `{to}`; supported: {}",
                TARGETS.join(", ")
            ),
        ));
    }
    let ns = p.root_ns();
    if ns.nodeform {
        return Err(Diagnostic::error(
            ns.version.as_ref().map(|v| v.span),
            "the project is already in the node form (schema 2026.174)",
        ));
    }
    if p.root_unusable {
        return Err(Diagnostic::error(
            None,
            "the project's root files cannot be read; fix them before migrating",
        ));
    }
    let mut m = Migration::default();
    // The root's own files: every loaded file inside the project that is not
    // in another namespace's directory.
    let mut vocab_docs: Vec<Node> = Vec::new();
    let mut vocab_version: Option<Node> = None;
    for i in 0..p.sources.len() {
        let id = FileId(i as u32);
        let Some(f) = p.sources.get(id) else { continue };
        let rel = f.rel.as_str();
        if rel.starts_with('<') || rel.starts_with("..") || rel.starts_with('/') {
            continue;
        }
        let in_other_ns =
            p.namespaces.iter().skip(1).any(|n| {
                f.path.starts_with(&n.dir) && n.dir != ns.dir && n.dir.starts_with(&ns.dir)
            });
        if in_other_ns {
            continue;
        }
        let docs = parse_stream(id, &f.text)?;
        let dir_name = rel
            .rsplit_once('/')
            .and_then(|(d, _)| d.rsplit('/').next())
            .unwrap_or("");
        match rel {
            "charly.yml" => {
                let mut out_docs = Vec::new();
                for d in &docs {
                    out_docs.push(root_doc(d, &mut m.warnings));
                }
                m.files.push((rel.to_string(), write_docs(&out_docs)));
            }
            "charly/build.yml" | "build.yml" => {
                for d in &docs {
                    if let Some(entries) = d.as_map() {
                        for (k, v) in entries {
                            match k.as_str().unwrap_or("") {
                                "version" => vocab_version = Some(v.clone()),
                                kind => kind_map(kind, k, v, &mut vocab_docs, &mut m.warnings),
                            }
                        }
                    }
                }
                m.obsolete.push(rel.to_string());
            }
            _ => {
                // A file already in the node form (a copy of a migrated
                // candy, a run that stopped part-way) has no `candy:` or
                // `box:` document: it is left as it is, never rewritten
                // into what the classic reading of it would leave (nothing).
                let classic = |d: &Node| {
                    d.as_map().is_some_and(|e| {
                        e.iter()
                            .any(|(k, _)| matches!(k.as_str(), Some("candy" | "box")))
                    })
                };
                let meaningful: Vec<&Node> = docs.iter().filter(|d| !d.is_null()).collect();
                if meaningful.is_empty() {
                    continue;
                }
                if !meaningful.iter().all(|d| classic(d)) {
                    let why = if meaningful.iter().any(|d| classic(d)) {
                        "it mixes classic and other documents; convert it by hand"
                    } else {
                        "it has no `candy:` or `box:` document (already in the node form?)"
                    };
                    m.skipped.push((rel.to_string(), why.to_string()));
                    continue;
                }
                let mut out_docs = Vec::new();
                for d in &docs {
                    out_docs.push(definition_doc(d, dir_name, &mut m.warnings));
                }
                if out_docs
                    .iter()
                    .all(|d| d.as_map().is_some_and(|e| e.is_empty()))
                {
                    m.skipped.push((
                        rel.to_string(),
                        "nothing in it has a 2026.174 form (see the warnings)".to_string(),
                    ));
                    continue;
                }
                m.files.push((rel.to_string(), write_docs(&out_docs)));
            }
        }
    }
    if !vocab_docs.is_empty() || vocab_version.is_some() {
        let mut entries = vec![(key("version"), text(NODEFORM_SCHEMA_VERSION))];
        let mut seen: Vec<String> = Vec::new();
        for n in vocab_docs {
            if let Value::Map(pairs) = n.value {
                for (k, v) in pairs {
                    let name = k.as_str().unwrap_or("").to_string();
                    if seen.contains(&name) {
                        m.warnings.push(Diagnostic::warning(
                            k.span,
                            format!("`{name}` names two vocabulary entries; a node name is unique in charly/charly.yml, the second is not migrated"),
                        ));
                        continue;
                    }
                    seen.push(name);
                    entries.push((k, v));
                }
            }
        }
        m.files
            .push(("charly/charly.yml".to_string(), write_docs(&[map(entries)])));
    }
    m.files.sort();
    Ok(m)
}

fn key(s: &str) -> Node {
    text(s)
}

fn text(s: &str) -> Node {
    Node {
        span: Span::default(),
        value: Value::Scalar(s.to_string(), Style::Plain),
    }
}

fn map(entries: Vec<(Node, Node)>) -> Node {
    Node {
        span: Span::default(),
        value: Value::Map(entries),
    }
}

fn seq(items: Vec<Node>) -> Node {
    Node {
        span: Span::default(),
        value: Value::Seq(items),
    }
}

fn is_scalar(n: &Node) -> bool {
    matches!(n.value, Value::Scalar(..))
}

/// A classic root document as directives and nodes.
fn root_doc(d: &Node, w: &mut Vec<Diagnostic>) -> Node {
    let Some(entries) = d.as_map() else {
        return d.clone();
    };
    let mut out: Vec<(Node, Node)> = Vec::new();
    let mut nodes: Vec<Node> = Vec::new();
    for (k, v) in entries {
        let name = k.as_str().unwrap_or("");
        match name {
            "version" => out.push((k.clone(), text(NODEFORM_SCHEMA_VERSION))),
            "defaults" => out.push((k.clone(), defaults(v))),
            _ if ROOT_DIRECTIVES.contains(&name) => out.push((k.clone(), v.clone())),
            "candy" | "box" => {
                for (nk, nv) in v.as_map().unwrap_or(&[]) {
                    let n = nk.as_str().unwrap_or("");
                    let def = if name == "box" {
                        box_node(n, nk, nv, w)
                    } else {
                        Some(candy_node(n, nv, w))
                    };
                    if let Some(def) = def {
                        nodes.push(map(vec![(nk.clone(), def)]));
                    }
                }
            }
            kind => kind_map(kind, k, v, &mut nodes, w),
        }
    }
    for n in nodes {
        if let Value::Map(pairs) = n.value {
            for (k, v) in pairs {
                if out.iter().any(|(ok, _)| ok.as_str() == k.as_str()) {
                    w.push(Diagnostic::warning(
                        k.span,
                        format!(
                            "`{}` names two nodes of the root file; the second is not migrated",
                            k.as_str().unwrap_or("")
                        ),
                    ));
                    continue;
                }
                out.push((k, v));
            }
        }
    }
    map(out)
}

/// `defaults:` with the renamed field.
fn defaults(v: &Node) -> Node {
    let Some(entries) = v.as_map() else {
        return v.clone();
    };
    map(entries
        .iter()
        .map(|(k, val)| {
            if k.as_str() == Some("keep_eval_runs") {
                (
                    Node {
                        span: k.span,
                        value: Value::Scalar("keep_check_runs".into(), Style::Plain),
                    },
                    val.clone(),
                )
            } else {
                (k.clone(), val.clone())
            }
        })
        .collect())
}

/// A classic `<kind>: {name: value}` map as nodes `name: {<kind>: value}`
/// (pushed to `nodes` as one-entry maps); kinds the node form does not have
/// are warned about.
fn kind_map(kind: &str, k: &Node, v: &Node, nodes: &mut Vec<Node>, w: &mut Vec<Diagnostic>) {
    if !NODE_KINDS.contains(&kind) || kind == "candy" {
        w.push(Diagnostic::warning(
            k.span,
            format!("`{kind}:` has no 2026.174 form charly writes; it is not migrated"),
        ));
        return;
    }
    let Some(entries) = v.as_map() else {
        if !v.is_null() {
            w.push(Diagnostic::warning(
                k.span,
                format!("`{kind}:` is not a mapping of names; it is not migrated"),
            ));
        }
        return;
    };
    for (nk, nv) in entries {
        nodes.push(map(vec![(nk.clone(), map(vec![(key(kind), nv.clone())]))]));
    }
}

/// A candy or box file's document as one node named by its directory (a
/// candy) or its `name:` (a box).
fn definition_doc(d: &Node, dir_name: &str, w: &mut Vec<Diagnostic>) -> Node {
    let Some(entries) = d.as_map() else {
        return d.clone();
    };
    let mut out = Vec::new();
    for (k, v) in entries {
        match k.as_str().unwrap_or("") {
            "candy" => out.push((text(dir_name), candy_node(dir_name, v, w))),
            "box" => {
                let name = v
                    .get("name")
                    .and_then(Node::as_str)
                    .unwrap_or(dir_name)
                    .to_string();
                if let Some(n) = box_node(&name, k, v, w) {
                    out.push((text(&name), n));
                }
            }
            other => w.push(Diagnostic::warning(
                k.span,
                format!("`{other}:` in a definition file has no 2026.174 form; it is not migrated"),
            )),
        }
    }
    map(out)
}

/// A classic candy definition as a node's value.
fn candy_node(name: &str, def: &Node, w: &mut Vec<Diagnostic>) -> Node {
    fold(name, def, &CANDY_FIELDS, false, w)
}

/// A classic box definition as a node's value (a `candy:` with `base:` or
/// `from:`), or `None` (warned) when it has neither.
fn box_node(name: &str, k: &Node, def: &Node, w: &mut Vec<Diagnostic>) -> Option<Node> {
    let has = |f: &str| def.get(f).is_some_and(|v| !v.is_null());
    if !has("base") && !has("from") {
        w.push(Diagnostic::warning(
            k.span,
            format!("box `{name}` has neither `base:` nor `from:`; in 2026.174 it would be a layer, so it is not migrated"),
        ));
        return None;
    }
    Some(fold(name, def, &BOX_FIELDS, true, w))
}

/// The kind value (scalars) plus data and step children of a definition.
fn fold(name: &str, def: &Node, fields: &[&str], image: bool, w: &mut Vec<Diagnostic>) -> Node {
    let Some(entries) = def.as_map() else {
        return map(vec![(key("candy"), def.clone())]);
    };
    let what = if image { "box" } else { "candy" };
    let mut scalars: Vec<(Node, Node)> = Vec::new();
    let mut children: Vec<(Node, Node)> = Vec::new();
    let mut steps: Vec<(Node, Node)> = Vec::new();
    for (k, v) in entries {
        let f = k.as_str().unwrap_or("");
        match f {
            "task" => {
                for t in v.as_seq().unwrap_or(&[]) {
                    if let Some(s) = run_step(t, w) {
                        steps.push((text(&format!("{name}-step-{}", steps.len())), s));
                    }
                }
            }
            "eval" | "deploy_eval" => {
                for c in v.as_seq().unwrap_or(&[]) {
                    if let Some(s) = check_step(c, f == "deploy_eval", w) {
                        steps.push((text(&format!("{name}-step-{}", steps.len())), s));
                    }
                }
            }
            "port" if image => w.push(Diagnostic::warning(
                k.span,
                format!("`port:` of box `{name}` was removed in 2026.174 (ports come from the candies); it is not migrated"),
            )),
            _ if image && BOX_UNSUPPORTED.contains(&f) => w.push(Diagnostic::warning(
                k.span,
                format!("`{f}:` of box `{name}` is not supported by charly's 2026.174 reader; it is not migrated"),
            )),
            "plan" | "agent_step" => w.push(Diagnostic::warning(
                k.span,
                format!("`{f}:` of {what} `{name}` has no 2026.174 form charly writes; it is not migrated"),
            )),
            _ if !fields.contains(&f) => w.push(Diagnostic::warning(
                k.span,
                format!("`{f}:` of {what} `{name}` has no 2026.174 field; it is not migrated"),
            )),
            _ if is_scalar(v) => scalars.push((k.clone(), v.clone())),
            _ => children.push((
                text(&format!("{name}-{}", f.replace('_', "-"))),
                map(vec![(k.clone(), v.clone())]),
            )),
        }
    }
    let mut out = vec![(key("candy"), map(scalars))];
    out.extend(children);
    out.extend(steps);
    map(out)
}

/// A classic task as a `run:` step.
fn run_step(t: &Node, w: &mut Vec<Diagnostic>) -> Option<Node> {
    let Some(entries) = t.as_map() else {
        w.push(Diagnostic::warning(
            t.span,
            "a task that is not a mapping is not migrated",
        ));
        return None;
    };
    let verb = entries
        .iter()
        .find(|(k, _)| TASK_VERBS.contains(&k.as_str().unwrap_or("")));
    let desc = match verb {
        Some((k, v)) => {
            let word = match k.as_str() {
                Some("cmd") => "command",
                other => other.unwrap_or(""),
            };
            match v.as_str() {
                Some(s) if !s.contains('\n') && s.len() <= 120 => format!("{word}={s}"),
                _ => word.to_string(),
            }
        }
        None => "task".to_string(),
    };
    let mut out = vec![(key("run"), quoted(&desc))];
    for (k, v) in entries {
        let f = k.as_str().unwrap_or("");
        if f == "cmd" {
            out.push((key("plugin"), text("command")));
            out.push((key("plugin_input"), map(vec![(key("command"), v.clone())])));
        } else if let Some((_, to)) = TASK_RENAMES.iter().find(|(from, _)| *from == f) {
            out.push((key(to), v.clone()));
        } else if TASK_SAME.contains(&f) {
            out.push((k.clone(), v.clone()));
        } else {
            w.push(Diagnostic::warning(
                k.span,
                format!("task field `{f}` has no 2026.174 run-step field; it is not migrated"),
            ));
        }
    }
    Some(map(out))
}

fn quoted(s: &str) -> Node {
    Node {
        span: Span::default(),
        value: Value::Scalar(s.to_string(), Style::Quoted),
    }
}

/// A classic `eval:` entry as a `check:` step.
fn check_step(c: &Node, deploy_list: bool, w: &mut Vec<Diagnostic>) -> Option<Node> {
    let Some(entries) = c.as_map() else {
        w.push(Diagnostic::warning(
            c.span,
            "a check that is not a mapping is not migrated",
        ));
        return None;
    };
    let subject = entries
        .iter()
        .filter_map(|(k, _)| k.as_str())
        .find(|k| SUBJECTS.contains(k));
    let Some(subject) = subject else {
        w.push(Diagnostic::warning(
            c.span,
            "a check without a known subject is not migrated",
        ));
        return None;
    };
    let label = c
        .get("description")
        .and_then(Node::as_str)
        .or_else(|| c.get("id").and_then(Node::as_str))
        .map(str::to_string)
        .unwrap_or_else(|| {
            let v = c.get(subject).and_then(Node::as_str).unwrap_or("");
            format!("{subject}={v}")
        });
    let mut step = vec![(key("check"), quoted(&label))];
    let mut input: Vec<(Node, Node)> = Vec::new();
    let plugin = PLUGIN_SUBJECTS.contains(&subject);
    let mut scope_deploy = deploy_list;
    for (k, v) in entries {
        let f = k.as_str().unwrap_or("");
        let renamed = CHECK_RENAMES
            .iter()
            .find(|(from, _)| *from == f)
            .map_or(f, |(_, to)| to);
        if f == "scope" {
            match v.as_str() {
                Some("deploy") => scope_deploy = true,
                Some("build") => {}
                other => w.push(Diagnostic::warning(
                    v.span,
                    format!(
                        "check scope `{}` has no 2026.174 context; it is not migrated",
                        other.unwrap_or("?")
                    ),
                )),
            }
        } else if f == "on" {
            w.push(Diagnostic::warning(
                k.span,
                "`on:` of a check was retired in 2026.174 (a step's venue comes from its place); it is not migrated",
            ));
        } else if plugin && !CHECK_STEP_KEYS.contains(&f) {
            input.push((k.clone(), v.clone()));
        } else {
            step.push((key(renamed), v.clone()));
        }
    }
    if plugin {
        step.push((key("plugin"), text(subject)));
        step.push((key("plugin_input"), map(input)));
    }
    if scope_deploy {
        step.push((key("context"), seq(vec![text("runtime")])));
    }
    Some(map(step))
}

// --- writing YAML ---------------------------------------------------------

/// Documents as YAML text (block style, four-space indentation).
pub fn write_docs(docs: &[Node]) -> String {
    let mut s = String::new();
    for (i, d) in docs.iter().enumerate() {
        if i > 0 {
            s.push_str("---\n");
        }
        match &d.value {
            Value::Scalar(..) => {
                s.push_str(&scalar(d, 0));
                s.push('\n');
            }
            _ => block(&mut s, d, 0),
        }
    }
    s
}

/// A block collection, each line indented by `ind`.
fn block(s: &mut String, n: &Node, ind: usize) {
    let pad = " ".repeat(ind);
    match &n.value {
        Value::Map(entries) => {
            for (k, v) in entries {
                s.push_str(&pad);
                s.push_str(&scalar(k, ind));
                s.push(':');
                value_after(s, v, ind);
            }
        }
        Value::Seq(items) => {
            for it in items {
                match &it.value {
                    Value::Scalar(..) => {
                        s.push_str(&pad);
                        s.push_str("- ");
                        s.push_str(&scalar(it, ind + 2));
                        s.push('\n');
                    }
                    Value::Map(e) if e.is_empty() => s.push_str(&format!("{pad}- {{}}\n")),
                    Value::Seq(e) if e.is_empty() => s.push_str(&format!("{pad}- []\n")),
                    _ => {
                        let mut inner = String::new();
                        block(&mut inner, it, ind + 2);
                        s.push_str(&pad);
                        s.push_str("- ");
                        s.push_str(&inner[ind + 2..]);
                    }
                }
            }
        }
        Value::Scalar(..) => {
            s.push_str(&pad);
            s.push_str(&scalar(n, ind));
            s.push('\n');
        }
    }
}

/// What follows `key:` (the colon is written).
fn value_after(s: &mut String, v: &Node, ind: usize) {
    match &v.value {
        Value::Scalar(t, Style::Plain) if t.is_empty() => s.push('\n'),
        Value::Scalar(..) => {
            s.push(' ');
            s.push_str(&scalar(v, ind));
            s.push('\n');
        }
        Value::Map(e) if e.is_empty() => s.push_str(" {}\n"),
        Value::Seq(e) if e.is_empty() => s.push_str(" []\n"),
        _ => {
            s.push('\n');
            block(s, v, ind + 4);
        }
    }
}

/// A scalar as YAML text with the same meaning: plain text as written,
/// quoted text double-quoted, block text as a literal block when that
/// keeps it exactly (else double-quoted). `ind` is the indentation of the
/// line it is on.
fn scalar(n: &Node, ind: usize) -> String {
    let Value::Scalar(t, style) = &n.value else {
        return String::new();
    };
    match style {
        Style::Plain if !t.contains('\n') => t.clone(),
        Style::Block if literal_ok(t) => {
            let chomp = if t.ends_with("\n\n") {
                "+"
            } else if t.ends_with('\n') {
                ""
            } else {
                "-"
            };
            let pad = " ".repeat(ind + 4);
            let mut out = format!("|{chomp}\n");
            let body = t.strip_suffix('\n').unwrap_or(t);
            for (i, line) in body.split('\n').enumerate() {
                if i > 0 {
                    out.push('\n');
                }
                if !line.is_empty() {
                    out.push_str(&pad);
                    out.push_str(line);
                }
            }
            out
        }
        _ => serde_json::to_string(t).unwrap_or_else(|_| format!("{t:?}")),
    }
}

/// Whether a literal block keeps `t` exactly.
fn literal_ok(t: &str) -> bool {
    !t.is_empty()
        && !t.starts_with([' ', '\t', '\n'])
        && t.chars().all(|c| c == '\n' || c == '\t' || !c.is_control())
        && !t.contains(['\u{feff}', '\u{2028}', '\u{2029}', '\u{85}'])
        // A line of spaces only would be read as indentation.
        && !t.split('\n').any(|l| !l.is_empty() && l.trim_start_matches(' ').is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(text: &str) {
        let docs = parse_stream(FileId(0), text).expect("yaml");
        let out = write_docs(&docs);
        let again = parse_stream(FileId(0), &out).unwrap_or_else(|e| panic!("{out}\n{e:?}"));
        assert_eq!(docs.len(), again.len());
        for (a, b) in docs.iter().zip(&again) {
            assert_eq!(a.to_json(), b.to_json(), "{out}");
        }
    }

    #[test]
    fn written_yaml_reads_back_the_same() {
        roundtrip("a: 1\nb: \"0755\"\nc: [x, {y: z}, [1, 2]]\nd: {}\ne: []\nf:\n");
        roundtrip(
            "s: |\n  line one\n    indented\n\n  three\nt: |-\n  no newline\nu: |+\n  keep\n\n",
        );
        roundtrip("q: \"tab\\there\\u0001\"\nr: '  lead'\nb: |2\n    lead\n");
        roundtrip("- - a\n  - b\n- k: v\n  l:\n    - m\n");
        roundtrip("a: 1\n---\nb: 2\n");
    }

    #[test]
    fn a_task_and_a_check_become_steps() {
        let docs = parse_stream(
            FileId(0),
            "candy:\n  version: 2026.1.100\n  port: [80]\n  task:\n    - cmd: echo hi\n      user: root\n    - download: http://x/y.tgz\n      include: [a]\n      bogus: 1\n  eval:\n    - id: f\n      file: /x\n      exists: true\n      scope: deploy\n    - k8s: nodes\n      k8s_count: 1\n",
        )
        .expect("yaml");
        let mut w = Vec::new();
        let out = definition_doc(&docs[0], "a", &mut w);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].message.contains("`bogus`"));
        assert_eq!(w[0].span.map(|s| (s.line, s.col)), Some((9, 7)));
        assert_eq!(
            out.to_json(),
            serde_json::json!({"a": {
                "candy": {"version": "2026.1.100"},
                "a-port": {"port": [80]},
                "a-step-0": {"run": "command=echo hi", "plugin": "command", "plugin_input": {"command": "echo hi"}, "run_as": "root"},
                "a-step-1": {"run": "download=http://x/y.tgz", "download": "http://x/y.tgz", "extract_include": ["a"]},
                "a-step-2": {"check": "f", "id": "f", "plugin": "file", "plugin_input": {"file": "/x", "exists": true}, "context": ["runtime"]},
                "a-step-3": {"check": "k8s=nodes", "kube": "nodes", "kube_count": 1},
            }})
        );
    }
}
