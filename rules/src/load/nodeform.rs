//! The node-form reader (schema 2026.174): a second front end that folds
//! name-first nodes into the same model the classic (2026.160) reader fills.
//!
//! A node-form document is a mapping of **directives** (`version`, `repo`,
//! `import`, `discover`, `defaults`, …) and **nodes**:
//!
//! ```yaml
//! redis:                     # the node's name
//!   candy: {version: …}      # exactly one kind discriminator (its scalars)
//!   redis-port:              # a data child: one field of the kind
//!     port: [6379]
//!   redis-step-0:            # a step child: exactly one of run/check/…
//!     run: mkdir=/x
//!     mkdir: /x
//! ```
//!
//! Folding happens on the spanned tree, before typing: the kind's value and
//! its data children become one mapping in the classic shape (`run:` steps
//! become `task:` entries, `check:` steps become `eval:` entries), which the
//! classic deserializers then type. So every value keeps its file:line:col,
//! and the model is not forked. A `candy:` with `base:` or `from:` is an
//! image (a [`BoxDef`]); without, a layer ([`Candy`]).
//!
//! What this reader keeps, changes or does not support yet is listed in
//! docs/format.md ("The node form (schema 2026.174)").

use crate::check::SUBJECTS;
use crate::diag::{Diagnostic, nearest};
use crate::model::{BoxDef, Candy, RootDoc};
use crate::source::Span;
use crate::yaml::{self, Node, Style, Value};

/// The first schema version read as node form.
pub const NODEFORM_FIRST: &str = "2026.174.0";
/// The newest node-form schema version this charly supports.
pub const NODEFORM_SCHEMA_VERSION: &str = "2026.174.1100";

/// Document directives: top-level keys that are not nodes. The first six
/// are read into the model; the others are data of the original's own
/// binary (its embedded configuration) and are accepted and ignored.
pub const DIRECTIVES: [&str; 18] = [
    "version",
    "repo",
    "import",
    "discover",
    "defaults",
    "provides",
    "providers",
    "compiled_plugins",
    "context_ignore_baseline",
    "install_hints",
    "ovmf_paths",
    "device_descriptions",
    "device_patterns",
    "gpu_vendors",
    "pci_class_labels",
    "distro_package_managers",
    "distro_family_map",
    "ovmf_distro_aliases",
];

/// Kind discriminators a node may carry (exactly one).
pub const NODE_KINDS: [&str; 16] = [
    "candy",
    "pod",
    "vm",
    "k8s",
    "local",
    "android",
    "group",
    "agent",
    "distro",
    "builder",
    "init",
    "resource",
    "target",
    "package-group",
    "module",
    "sidecar",
];

/// Step discriminators (a step child has exactly one).
pub const STEP_KEYS: [&str; 5] = ["run", "check", "agent-run", "agent-check", "include"];

/// Builders whose stage templates left the 2026.174 vocabulary: charly
/// keeps its own built-in definitions for them.
pub const BUILTIN_BUILDERS: [&str; 4] = ["pixi", "npm", "cargo", "aur"];

/// Fields of a layer candy (the classic ones plus the node-form additions).
pub const CANDY_FIELDS: [&str; 48] = [
    "version",
    "name",
    "description",
    "require",
    "candy",
    "package",
    "distro",
    "env",
    "path_append",
    "var",
    "service",
    "shell",
    "localpkg",
    "reboot",
    "port",
    "volume",
    "env_accept",
    "env_require",
    "env_provide",
    "secret",
    "secret_accept",
    "secret_require",
    "mcp_provide",
    "mcp_accept",
    "mcp_require",
    "route",
    "alias",
    "security",
    "libvirt",
    "apk",
    "data",
    "artifact",
    "port_relay",
    "hook",
    "capability",
    "status",
    "info",
    "skill",
    "engine",
    "plugin",
    "bake_plugin",
    "external_builder",
    "requires_capability",
    "extract",
    // Folded from step children; writing them directly is refused.
    "task",
    "eval",
    "plan",
    "agent_step",
];

/// Fields of an image (a `candy:` with `base:` or `from:`).
pub const BOX_FIELDS: [&str; 42] = [
    "name",
    "version",
    "description",
    "enabled",
    "base",
    "from",
    "bootstrap_builder_image",
    "platform",
    "tag",
    "registry",
    "distro",
    "build",
    "candy",
    "port",
    "user",
    "uid",
    "gid",
    "home",
    "user_policy",
    "builder",
    "produce",
    "env",
    "env_file",
    "security",
    "network",
    "init",
    "data_image",
    "bootc",
    "readiness",
    "jobs",
    "podman_jobs",
    "podman_jobs_cap",
    "context_ignore",
    "cache",
    "keep_images",
    "keep_check_runs",
    "merge",
    "alias",
    "plan",
    "check_level",
    "shell",
    "preserve_user",
];

/// Image fields of 2026.174 that the model does not carry yet: read,
/// warned about once each, and dropped.
pub const BOX_UNSUPPORTED: [&str; 12] = [
    "env_file",
    "bootc",
    "readiness",
    "jobs",
    "podman_jobs",
    "podman_jobs_cap",
    "context_ignore",
    "cache",
    "keep_images",
    "keep_check_runs",
    "check_level",
    "shell",
];

/// Whether a declared schema version selects the node form.
pub fn is_nodeform_version(v: &str) -> bool {
    super::compare_calver(v, NODEFORM_FIRST).is_some_and(|o| o != std::cmp::Ordering::Less)
}

/// Whether text is a strict CalVer `YYYY.DDD.HHMM`, the schema's
/// `^[0-9]{4}\.[0-9]{1,3}\.[0-9]{3,4}$` (its shape only: the corpus has
/// versions like `2026.176.3201`).
pub fn is_strict_calver(v: &str) -> bool {
    let parts: Vec<&str> = v.split('.').collect();
    let [y, d, hm] = parts.as_slice() else {
        return false;
    };
    let digits = |s: &str, n: std::ops::RangeInclusive<usize>| {
        n.contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit())
    };
    digits(y, 4..=4) && digits(d, 1..=3) && digits(hm, 3..=4)
}

/// Whether a document looks like node form (a node whose value carries a
/// kind discriminator), for files read outside any namespace's era.
pub fn looks_like_node_doc(doc: &Node) -> bool {
    doc.as_map().is_some_and(|m| {
        m.iter().any(|(k, v)| {
            let key = k.as_str().unwrap_or("");
            !DIRECTIVES.contains(&key)
                && !NODE_KINDS.contains(&key)
                && key != "box"
                && v.as_map().is_some_and(|vm| {
                    vm.iter()
                        .any(|(vk, _)| NODE_KINDS.contains(&vk.as_str().unwrap_or("")))
                })
        })
    })
}

/// One thing a node-form document defines.
#[derive(Debug)]
pub enum Item {
    /// The directives, as a classic root-form document.
    Root(Box<RootDoc>),
    /// A layer candy.
    Candy {
        /// The node's name key.
        key: Node,
        /// The definition.
        def: Box<Candy>,
    },
    /// An image.
    Box {
        /// The node's name key.
        key: Node,
        /// The definition.
        def: Box<BoxDef>,
    },
    /// Any other kind (`distro`, `builder`, `init`, `vm`, `local`, …): the
    /// kind's value with its data children folded in, untyped.
    Other {
        /// The kind word.
        kind: String,
        /// Not a charly kind: a word a plugin candy must declare
        /// (`plugin: {providers: ["kind:<word>"]}`); the loader checks it
        /// once every candy is known.
        plugin_kind: bool,
        /// The node's name key.
        key: Node,
        /// Folded value.
        value: Node,
    },
}

/// Reads one node-form document. Problems go to `out`.
pub fn read_document(doc: &Node, out: &mut Vec<Diagnostic>) -> Vec<Item> {
    let Some(entries) = doc.as_map() else {
        if !doc.is_null() {
            out.push(Diagnostic::error(
                doc.span,
                format!("a charly document is a mapping, found {}", doc.kind_name()),
            ));
        }
        return Vec::new();
    };
    let mut items = Vec::new();
    let mut directives = Vec::new();
    for (k, v) in entries {
        let Some(name) = k.as_str() else {
            out.push(Diagnostic::error(k.span, "a node name must be text"));
            continue;
        };
        if DIRECTIVES.contains(&name) {
            if [
                "version", "repo", "import", "discover", "defaults", "provides",
            ]
            .contains(&name)
            {
                directives.push((k.clone(), v.clone()));
            }
            continue;
        }
        if v.as_map().is_none() {
            let mut d = Diagnostic::warning(
                k.span,
                format!(
                    "unknown top-level key `{name}`; it is ignored (a node is a mapping with one kind)"
                ),
            );
            if let Some(n) = nearest(name, DIRECTIVES.iter().copied()) {
                d = d.with_hint(format!("did you mean `{n}`?"));
            }
            out.push(d);
            continue;
        }
        if let Some(item) = read_node(k, v, out) {
            items.push(item);
        }
    }
    if !directives.is_empty() {
        let node = Node {
            span: doc.span,
            value: Value::Map(directives),
        };
        let mut w = Vec::new();
        match yaml::from_node::<RootDoc>(&node, &mut w) {
            Ok(r) => items.insert(0, Item::Root(Box::new(r))),
            Err(d) => out.push(d),
        }
        out.extend(w);
    }
    items
}

fn read_node(key: &Node, node: &Node, out: &mut Vec<Diagnostic>) -> Option<Item> {
    let name = key.as_str().unwrap_or("");
    let entries = node.as_map().unwrap_or(&[]);
    let discs: Vec<&(Node, Node)> = entries
        .iter()
        .filter(|(k, v)| {
            NODE_KINDS.contains(&k.as_str().unwrap_or("")) && (v.as_map().is_some() || v.is_null())
        })
        .collect();
    let (disc_key, disc_val) = match discs.as_slice() {
        [one] => (&one.0, &one.1),
        [] if plugin_kind_candidate(name, entries).is_some() => {
            return plugin_node(key, name, entries);
        }
        [] => {
            no_kind(key, name, entries, out);
            return None;
        }
        [first, second, ..] => {
            out.push(Diagnostic::error(
                second.0.span,
                format!(
                    "node `{name}` has two kinds (`{}` and `{}`); a node has exactly one",
                    first.0.as_str().unwrap_or(""),
                    second.0.as_str().unwrap_or("")
                ),
            ));
            return None;
        }
    };
    let kind = disc_key.as_str().unwrap_or("").to_string();
    let is_image = kind == "candy"
        && (disc_val.get("base").is_some_and(|v| !v.is_null())
            || disc_val.get("from").is_some_and(|v| !v.is_null()));
    let fields: Option<&[&str]> = match kind.as_str() {
        "candy" if is_image => Some(&BOX_FIELDS),
        "candy" => Some(&CANDY_FIELDS),
        _ => None,
    };
    if kind == "candy"
        && let Some(v) = disc_val.get("version")
        && !v.as_str().is_some_and(is_strict_calver)
    {
        out.push(Diagnostic::error(
            v.span,
            format!(
                "node `{name}`: version `{}` is not a strict CalVer YYYY.DDD.HHMM (e.g. 2026.174.1100)",
                v.as_str().unwrap_or("")
            ),
        ));
    }
    let mut fold = Fold::default();
    // The kind's own value.
    for (k, v) in disc_val.as_map().unwrap_or(&[]) {
        add_field(&mut fold.folded, fields, name, None, k, v, out);
    }
    // Children.
    for (ck, cv) in entries {
        if !std::ptr::eq(ck, disc_key) {
            fold.child(ck, cv, name, fields, is_image, out);
        }
    }
    let Fold {
        mut folded,
        tasks,
        evals,
        agents,
    } = fold;
    let seq = |span: Span, items: Vec<Node>| Node {
        span,
        value: Value::Seq(items),
    };
    let synth = |s: &str| Node {
        span: disc_key.span,
        value: Value::Scalar(s.to_string(), Style::Plain),
    };
    if !tasks.is_empty() {
        folded.push((synth("task"), seq(disc_key.span, tasks)));
    }
    if !evals.is_empty() {
        folded.push((synth("eval"), seq(disc_key.span, evals)));
    }
    if !agents.is_empty() && !is_image {
        folded.push((synth("agent_step"), seq(disc_key.span, agents)));
    }
    if kind == "init" {
        // Fields renamed with the layer → candy rename.
        for (k, _) in folded.iter_mut() {
            if let Some((_, to)) = INIT_RENAMES.iter().find(|(f, _)| k.as_str() == Some(*f)) {
                *k = text_node(k.span, to);
            }
        }
    }
    let value = Node {
        span: disc_val.span,
        value: Value::Map(folded),
    };
    let mut w = Vec::new();
    let item = match (kind.as_str(), is_image) {
        ("candy", false) => yaml::from_node::<Candy>(&value, &mut w)
            .map(|def| Item::Candy {
                key: key.clone(),
                def: Box::new(def),
            })
            .map_err(|d| out.push(d))
            .ok(),
        ("candy", true) => yaml::from_node::<BoxDef>(&value, &mut w)
            .map(|def| Item::Box {
                key: key.clone(),
                def: Box::new(def),
            })
            .map_err(|d| out.push(d))
            .ok(),
        _ => Some(Item::Other {
            kind,
            plugin_kind: false,
            key: key.clone(),
            value,
        }),
    };
    out.extend(w);
    item
}

/// What a node's kind value and children fold into: the kind's fields, and
/// the steps its children are (tasks, checks, agent steps).
#[derive(Default)]
struct Fold {
    folded: Vec<(Node, Node)>,
    tasks: Vec<Node>,
    evals: Vec<Node>,
    agents: Vec<Node>,
}

impl Fold {
    /// Child `ck: cv` of node `name`: a data child (its fields join the
    /// kind's) or a step (`run:`, `check:`, an agent step).
    fn child(
        &mut self,
        ck: &Node,
        cv: &Node,
        name: &str,
        fields: Option<&[&str]>,
        is_image: bool,
        out: &mut Vec<Diagnostic>,
    ) {
        let cname = ck.as_str().unwrap_or("");
        let Some(centries) = cv.as_map() else {
            let mut d = Diagnostic::error(
                ck.span,
                format!(
                    "`{cname}` in node `{name}` is {}; a child node is a mapping",
                    cv.kind_name()
                ),
            );
            if let Some(n) = nearest(cname, NODE_KINDS.iter().copied()) {
                d = d.with_hint(format!("did you mean the kind `{n}:`?"));
            }
            out.push(d);
            return;
        };
        let steps: Vec<&(Node, Node)> = centries
            .iter()
            .filter(|(k, _)| STEP_KEYS.contains(&k.as_str().unwrap_or("")))
            .collect();
        match steps.as_slice() {
            [] => {
                if fields.is_none() {
                    // Other kinds: the data child's fields join the value.
                    self.folded.extend(centries.iter().cloned());
                    return;
                }
                for (k, v) in centries {
                    add_field(&mut self.folded, fields, name, Some(cname), k, v, out);
                }
            }
            [(sk, sv)] => {
                if fields.is_none() {
                    self.folded.push((ck.clone(), cv.clone()));
                    return;
                }
                match sk.as_str().unwrap_or("") {
                    "run" if is_image => out.push(Diagnostic::warning(
                        sk.span,
                        format!("step `{cname}`: `run:` steps of an image are not supported yet; it is ignored"),
                    )),
                    "run" => {
                        if let Some(t) = run_to_task(ck, cv, out) {
                            self.tasks.push(t);
                        }
                    }
                    "check" => {
                        if let Some(c) = check_to_eval(ck, cv, sv, out) {
                            self.evals.push(c);
                        }
                    }
                    "include" => out.push(Diagnostic::warning(
                        sk.span,
                        format!("step `{cname}`: `include:` steps are not supported yet; it is ignored"),
                    )),
                    _ => self.agents.push(cv.clone()),
                }
            }
            [first, second, ..] => out.push(Diagnostic::error(
                second.0.span,
                format!(
                    "step `{cname}` has both `{}:` and `{}:`; a step has exactly one of {}",
                    first.0.as_str().unwrap_or(""),
                    second.0.as_str().unwrap_or(""),
                    STEP_KEYS.join(", ")
                ),
            )),
        }
    }
}

/// A kindless node whose one candidate entry is a plugin-declared kind:
/// that entry's mapping with the node's other entries (its children)
/// folded in.
fn plugin_node(key: &Node, name: &str, entries: &[(Node, Node)]) -> Option<Item> {
    let (k, v) = plugin_kind_candidate(name, entries)?;
    let mut children = Vec::new();
    for (ck, cv) in entries {
        if !std::ptr::eq(ck, k) {
            children.push((ck.clone(), cv.clone()));
        }
    }
    let mut folded: Vec<(Node, Node)> = v.as_map().unwrap_or(&[]).to_vec();
    folded.extend(children);
    Some(Item::Other {
        kind: k.as_str().unwrap_or("").to_string(),
        plugin_kind: true,
        key: key.clone(),
        value: Node {
            span: v.span,
            value: Value::Map(folded),
        },
    })
}

/// Says why a node has no kind: `box:` (a 2026.160 kind), or none of the
/// node kinds (with the nearest one to a key it has).
fn no_kind(key: &Node, name: &str, entries: &[(Node, Node)], out: &mut Vec<Diagnostic>) {
    if let Some((k, _)) = entries.iter().find(|(k, _)| k.as_str() == Some("box")) {
        out.push(
            Diagnostic::error(
                k.span,
                format!("node `{name}`: `box:` is not a 2026.174 kind"),
            )
            .with_hint("an image is a `candy:` with `base:` or `from:`"),
        );
        return;
    }
    let mut d = Diagnostic::error(
        key.span,
        format!(
            "node `{name}` has no kind; it needs exactly one of: {}",
            NODE_KINDS.join(", ")
        ),
    );
    if let Some(g) = entries
        .iter()
        .filter_map(|(k, _)| k.as_str())
        .find_map(|k| nearest(k, NODE_KINDS.iter().copied()).filter(|n| *n != k))
    {
        d = d.with_hint(format!("did you mean `{g}`?"));
    }
    out.push(d);
}

/// The one entry of a kindless node that can be a plugin-declared kind:
/// a lowercase word that is not a typo of a charly kind, not named like a
/// child (`<name>-…`), whose value is a mapping that is not a step.
fn plugin_kind_candidate<'a>(name: &str, entries: &'a [(Node, Node)]) -> Option<&'a (Node, Node)> {
    let cands: Vec<&(Node, Node)> = entries
        .iter()
        .filter(|(k, v)| {
            let w = k.as_str().unwrap_or("");
            !w.is_empty()
                && !w.starts_with(&format!("{name}-"))
                && w.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && nearest(w, NODE_KINDS.iter().copied()).is_none()
                && (v.is_null()
                    || v.as_map().is_some_and(|m| {
                        !m.iter()
                            .any(|(sk, _)| STEP_KEYS.contains(&sk.as_str().unwrap_or("")))
                    }))
        })
        .collect();
    match cands.as_slice() {
        [one] => Some(one),
        _ => None,
    }
}

/// Adds one field of a kind's value or data child to the folded mapping:
/// unknown fields warn once with the nearest name, a field set twice is an
/// error, fields charly does not carry yet warn and are dropped.
fn add_field(
    folded: &mut Vec<(Node, Node)>,
    fields: Option<&[&str]>,
    node: &str,
    child: Option<&str>,
    k: &Node,
    v: &Node,
    out: &mut Vec<Diagnostic>,
) {
    let fname = k.as_str().unwrap_or("");
    let place = match child {
        Some(c) => format!("child `{c}` of node `{node}`"),
        None => format!("node `{node}`"),
    };
    let Some(fields) = fields else {
        folded.push((k.clone(), v.clone()));
        return;
    };
    let image = fields.contains(&"base");
    if !fields.contains(&fname) {
        let mut d = Diagnostic::warning(
            k.span,
            format!("unknown field `{fname}` in {place}; it is ignored"),
        );
        if let Some(n) = nearest(fname, fields.iter().copied()) {
            d = d.with_hint(format!("did you mean `{n}`?"));
        }
        out.push(d);
        return;
    }
    if ["task", "eval", "plan", "agent_step"].contains(&fname) {
        out.push(
            Diagnostic::error(
                k.span,
                format!("`{fname}:` in {place}: steps are child nodes in the 2026.174 form"),
            )
            .with_hint("write each step as a child node with one of run/check/agent-run/agent-check/include"),
        );
        return;
    }
    if image && fname == "port" {
        out.push(
            Diagnostic::error(
                k.span,
                format!("`port:` of an image ({place}) was removed in 2026.174"),
            )
            .with_hint("ports are inherited from the image's candies"),
        );
        return;
    }
    if image && BOX_UNSUPPORTED.contains(&fname) {
        out.push(Diagnostic::warning(
            k.span,
            format!("image field `{fname}` ({place}) is not supported yet; it is ignored"),
        ));
        return;
    }
    if let Some((prev, _)) = folded.iter().find(|(pk, _)| pk.as_str() == Some(fname)) {
        out.push(Diagnostic::error(
            k.span,
            format!(
                "field `{fname}` of node `{node}` is set twice (first at line {})",
                prev.span.line
            ),
        ));
        return;
    }
    folded.push((k.clone(), v.clone()));
}

fn text_node(span: Span, s: &str) -> Node {
    Node {
        span,
        value: Value::Scalar(s.to_string(), Style::Plain),
    }
}

/// `init:` fields of 2026.174 and their classic names.
const INIT_RENAMES: [(&str, &str); 3] = [
    ("candy_field", "layer_field"),
    ("candy_file", "layer_file"),
    ("depends_candy", "depends_layer"),
];

/// Install-step keys copied into a classic task (renamed where the name
/// changed).
const TASK_KEYS: [(&str, &str); 20] = [
    ("mkdir", "mkdir"),
    ("copy", "copy"),
    ("write", "write"),
    ("link", "link"),
    ("download", "download"),
    ("setcap", "setcap"),
    ("build", "build"),
    ("run_as", "user"),
    ("mode", "mode"),
    ("to", "to"),
    ("target", "target"),
    ("content", "content"),
    ("extract", "extract"),
    ("extract_include", "include"),
    ("strip_components", "strip_components"),
    ("env", "env"),
    ("caps", "caps"),
    ("cache", "cache"),
    ("uninstall", "uninstall"),
    ("comment", "comment"),
];

/// Step keys that only describe a run step.
const RUN_DESCRIPTIVE: [&str; 6] = [
    "run",
    "id",
    "description",
    "context",
    "plugin",
    "plugin_input",
];

/// A `run:` step as a classic task.
fn run_to_task(ck: &Node, cv: &Node, out: &mut Vec<Diagnostic>) -> Option<Node> {
    let cname = ck.as_str().unwrap_or("");
    let mut task: Vec<(Node, Node)> = Vec::new();
    for (k, v) in cv.as_map().unwrap_or(&[]) {
        let key = k.as_str().unwrap_or("");
        if let Some((_, to)) = TASK_KEYS.iter().find(|(from, _)| *from == key) {
            task.push((text_node(k.span, to), v.clone()));
        } else if !RUN_DESCRIPTIVE.contains(&key) {
            let mut d = Diagnostic::warning(
                k.span,
                format!("step `{cname}`: unknown field `{key}` for a run step; it is ignored"),
            );
            let known = TASK_KEYS
                .iter()
                .map(|(f, _)| *f)
                .chain(RUN_DESCRIPTIVE.iter().copied());
            if let Some(n) = nearest(key, known) {
                d = d.with_hint(format!("did you mean `{n}`?"));
            }
            out.push(d);
        }
    }
    if let Some(p) = cv.get("plugin") {
        match p.as_str() {
            Some("command") => {
                match cv.get("plugin_input").and_then(|i| i.get("command")) {
                    Some(c) => task.push((text_node(p.span, "cmd"), c.clone())),
                    None => {
                        out.push(Diagnostic::error(
                            p.span,
                            format!("step `{cname}`: `plugin: command` needs `plugin_input: {{command: …}}`"),
                        ));
                        return None;
                    }
                }
            }
            _ => {
                // A plugin step or verb: the loader checks the word is
                // declared, the compiler makes it an external step.
                task.push((text_node(k_span(cv, "plugin"), "plugin"), p.clone()));
                for field in ["plugin_input", "context"] {
                    if let Some(v) = cv.get(field) {
                        task.push((text_node(k_span(cv, field), field), v.clone()));
                    }
                }
                return Some(Node {
                    span: cv.span,
                    value: Value::Map(task),
                });
            }
        }
    }
    if let Some(c) = cv.get("context")
        && !context_has(c, "build")
    {
        out.push(Diagnostic::warning(
            c.span,
            format!("step `{cname}`: run steps limited to deploy/runtime `context:` are not supported yet; it runs at build"),
        ));
    }
    Some(Node {
        span: cv.span,
        value: Value::Map(task),
    })
}

/// The span of key `key` of mapping `m` (the mapping's own when absent).
fn k_span(m: &Node, key: &str) -> Span {
    m.as_map()
        .and_then(|f| f.iter().find(|(k, _)| k.as_str() == Some(key)))
        .map_or(m.span, |(k, _)| k.span)
}

fn context_has(c: &Node, word: &str) -> bool {
    match &c.value {
        Value::Seq(items) => items.iter().any(|i| i.as_str() == Some(word)),
        Value::Scalar(s, _) => s == word,
        Value::Map(_) => false,
    }
}

/// Keys of a check step that map onto classic check keys of another name.
const CHECK_RENAMES: [(&str, &str); 3] = [
    ("kube", "k8s"),
    ("kube_count", "k8s_count"),
    ("kube_kind", "k8s_kind"),
];

/// A check step's `context:` as the classic `scope:` (build when it names
/// `build` or neither `runtime` nor `deploy`).
fn push_scope(cv: &Node, entry: &mut Vec<(Node, Node)>) {
    if let Some(c) = cv.get("context") {
        let scope = if context_has(c, "build")
            || !(context_has(c, "runtime") || context_has(c, "deploy"))
        {
            "build"
        } else {
            "deploy"
        };
        entry.push((text_node(c.span, "scope"), text_node(c.span, scope)));
    }
}

/// A `check:` step as a classic `eval:` entry.
fn check_to_eval(ck: &Node, cv: &Node, text: &Node, out: &mut Vec<Diagnostic>) -> Option<Node> {
    let cname = ck.as_str().unwrap_or("");
    let mut entry: Vec<(Node, Node)> = Vec::new();
    let rename = |k: &Node| {
        let key = k.as_str().unwrap_or("");
        let to = CHECK_RENAMES
            .iter()
            .find(|(f, _)| *f == key)
            .map_or(key, |(_, t)| t);
        text_node(k.span, to)
    };
    let plugin = cv.get("plugin");
    for (k, v) in cv.as_map().unwrap_or(&[]) {
        match k.as_str().unwrap_or("") {
            "check" | "plugin" | "plugin_input" | "context" => {}
            _ => entry.push((rename(k), v.clone())),
        }
    }
    if cv.get("id").is_none() {
        entry.push((text_node(ck.span, "id"), text_node(ck.span, cname)));
    }
    let has_subject = |e: &[(Node, Node)]| {
        e.iter()
            .any(|(k, _)| SUBJECTS.contains(&k.as_str().unwrap_or("")))
    };
    if let Some(p) = plugin {
        let word = p.as_str().unwrap_or("");
        let input = cv.get("plugin_input");
        if !SUBJECTS.contains(&word) {
            // Kept as a check of its own kind, so check beds list it as
            // skipped with the reason instead of passing or dropping it.
            out.push(Diagnostic::warning(
                p.span,
                format!(
                    "check `{cname}`: `plugin: {word}` is not supported yet; check beds report it as skipped"
                ),
            ));
            entry.push((text_node(ck.span, "plugin"), p.clone()));
            if let Some(i) = input {
                entry.push((text_node(ck.span, "plugin_input"), i.clone()));
            }
            push_scope(cv, &mut entry);
            return Some(Node {
                span: cv.span,
                value: Value::Map(entry),
            });
        }
        for (k, v) in input.and_then(Node::as_map).unwrap_or(&[]) {
            if entry.iter().any(|(ek, _)| ek.as_str() == k.as_str()) {
                continue;
            }
            entry.push((rename(k), v.clone()));
        }
        if !entry.iter().any(|(k, _)| k.as_str() == Some(word)) {
            out.push(Diagnostic::error(
                p.span,
                format!("check `{cname}`: `plugin: {word}` needs `plugin_input: {{{word}: …}}`"),
            ));
            return None;
        }
    } else if !has_subject(&entry) {
        // `check: word=value` alone.
        let t = text.as_str().unwrap_or("");
        match t.split_once('=') {
            Some((w, v)) if SUBJECTS.contains(&w.trim()) => {
                entry.push((
                    text_node(text.span, w.trim()),
                    text_node(text.span, v.trim()),
                ));
            }
            _ => {
                out.push(Diagnostic::error(
                    text.span,
                    format!(
                        "check `{cname}` has no plugin or verb charly can run; it needs `plugin: <word>` with `plugin_input:`"
                    ),
                ));
                return None;
            }
        }
    }
    push_scope(cv, &mut entry);
    Some(Node {
        span: cv.span,
        value: Value::Map(entry),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::FileId;

    fn doc(text: &str) -> Node {
        crate::yaml::parse_stream(FileId(0), text)
            .expect("yaml")
            .remove(0)
    }

    #[test]
    fn strict_calver() {
        assert!(is_strict_calver("2026.174.1100"));
        assert!(is_strict_calver("2026.1.100"));
        assert!(
            is_strict_calver("2026.176.3201"),
            "the schema checks the shape only"
        );
        assert!(!is_strict_calver("2026.174.11"));
        assert!(!is_strict_calver("2026.1745.1100"));
        assert!(!is_strict_calver("2026.174.1100-rc1"));
        assert!(!is_strict_calver("2026.174"));
        assert!(!is_strict_calver("26.174.1100"));
        assert!(!is_strict_calver("2026.174.1100.1"));
        assert!(is_nodeform_version("2026.174.0"));
        assert!(!is_nodeform_version("2026.160.1301"));
        assert!(!is_nodeform_version("banana"));
    }

    #[test]
    fn node_documents_are_recognized_by_shape() {
        assert!(looks_like_node_doc(&doc("a:\n  candy: {version: 1}\n")));
        assert!(!looks_like_node_doc(&doc("candy:\n  version: 1\n")));
        assert!(!looks_like_node_doc(&doc("version: 2026.174.1100\n")));
    }

    #[test]
    fn a_check_step_becomes_a_classic_check() {
        let mut out = Vec::new();
        let items = read_document(
            &doc(
                "a:\n  candy: {version: 2026.1.100, description: x}\n  a-c:\n    check: k8s nodes\n    kube: nodes\n    kube_count: 1\n    context: [runtime]\n  a-d:\n    check: file=/etc/x\n",
            ),
            &mut out,
        );
        assert!(out.is_empty(), "{out:?}");
        let Some(Item::Candy { def, .. }) = items.first() else {
            panic!("a candy: {items:?}")
        };
        let eval = def.eval.as_ref().expect("eval").to_json();
        assert_eq!(
            eval,
            serde_json::json!([
                {"k8s": "nodes", "k8s_count": 1, "id": "a-c", "scope": "deploy"},
                {"id": "a-d", "file": "/etc/x"}
            ])
        );
    }

    #[test]
    fn a_check_without_anything_to_run_is_an_error() {
        let mut out = Vec::new();
        read_document(
            &doc(
                "a:\n  candy: {version: 2026.1.100, description: x}\n  a-c:\n    check: it works\n",
            ),
            &mut out,
        );
        assert_eq!(out.len(), 1, "{out:?}");
        assert!(out[0].is_error());
        assert_eq!(out[0].span.map(|s| (s.line, s.col)), Some((4, 12)));
    }
}
