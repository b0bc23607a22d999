//! Checks: the `eval:` entries of candies and boxes, typed.
//!
//! Each entry has exactly one *subject* key saying what it checks — `file`,
//! `command`, `package`, `service`, `addr`, `http`, `process`, `port`, `mcp`,
//! `k8s`, `cdp`, `matching` — plus matchers (`exists`, `mode`, `filetype`,
//! `contains`, `exit_status`, `stdout`/`stderr` with `contains`/`matches`,
//! `installed` with `package_map`, `running`, `reachable`, `status`, …) and
//! common fields (`id`, `scope`, `in_container`, `timeout`, `eventually`, …).
//! An entry with no known subject is an error at its file:line:col, never
//! silently dropped. Check beds run `scope: build` checks (the default) of
//! the kinds that make sense in a container; deploy-scope checks are listed
//! as skipped with the reason.

use crate::diag::{Diagnostic, nearest};
use crate::home::{Tilde, expand_home_with};
use crate::source::Span;
use crate::yaml::{Node, Value};
use serde::Serialize;
use std::collections::BTreeMap;

/// Keys naming what a check is about.
///
/// The last eight are the live-session verbs of schema 2026.174 (`adb:
/// shell`, `wl: screenshot`, …): kept as [`CheckKind::Other`], they need a
/// deployment.
pub const SUBJECTS: [&str; 20] = [
    "file", "command", "package", "service", "addr", "http", "process", "port", "mcp", "k8s",
    "cdp", "matching", "adb", "appium", "wl", "vnc", "spice", "libvirt", "dbus", "record",
];

/// Keys every check may have, whatever its subject.
const COMMON: [&str; 14] = [
    "id",
    "scope",
    "in_container",
    "timeout",
    "eventually",
    "retry_interval",
    "description",
    "exclude_distro",
    "on",
    "depends_on",
    "tag",
    "note",
    "skip",
    "platform",
];

/// Every key of a node-form step (`#Op` of the 2026.174 schema,
/// `charly/schema/_common.cue`, a closed struct, and the step keys of
/// `#Step`): a check entry converted from the node form may carry any of
/// them, and no other.
pub const OP_FIELDS: [&str; 131] = [
    "action",
    "activity",
    "adb",
    "agent-check",
    "agent-run",
    "amount",
    "apk",
    "app_id",
    "app_version",
    "appium",
    "arch",
    "arg",
    "artifact",
    "artifact_min_bytes",
    "artifact_min_cast_events",
    "artifact_min_dimensions",
    "artifact_not_uniform",
    "attribute",
    "build",
    "button",
    "cache",
    "caps",
    "capture",
    "capture_extract",
    "cdp",
    "check",
    "cluster",
    "combo",
    "command",
    "comment",
    "content",
    "context",
    "copy",
    "count",
    "dbus",
    "depends_on",
    "description",
    "dest",
    "direction",
    "download",
    "emit_id",
    "env",
    "eventually",
    "exclude_distro",
    "exit_status",
    "expression",
    "extract",
    "extract_include",
    "id",
    "include",
    "index_var",
    "input",
    "intent_do",
    "json",
    "key",
    "keycode",
    "kill",
    "kube",
    "kube_context",
    "kube_count",
    "kube_group",
    "kube_kind",
    "kube_resource",
    "kube_version",
    "kubeconfig",
    "label",
    "libvirt",
    "link",
    "manifest",
    "max",
    "mcp",
    "mcp_name",
    "mean",
    "method",
    "metric",
    "mkdir",
    "mode",
    "name",
    "namespace",
    "origin",
    "over_id",
    "p50",
    "p95",
    "p99",
    "parallel",
    "params",
    "path",
    "percent",
    "plugin",
    "plugin_input",
    "property",
    "query",
    "record",
    "record_audio",
    "record_fps",
    "record_mode",
    "record_name",
    "request_body",
    "retry_interval",
    "run",
    "run_as",
    "selector",
    "session",
    "setcap",
    "signal",
    "skip",
    "source",
    "spice",
    "stderr",
    "stdout",
    "strategy",
    "strip_components",
    "summarize",
    "tab",
    "tag",
    "target",
    "text",
    "timeout",
    "to",
    "tool",
    "uninstall",
    "uri",
    "url",
    "venue",
    "vnc",
    "wl",
    "write",
    "x",
    "x2",
    "y",
    "y2",
];

/// Matcher keys per subject (a key no subject knows is an error).
fn matchers(subject: &str) -> &'static [&'static str] {
    match subject {
        "file" => &["exists", "mode", "filetype", "contains", "owner", "size"],
        "command" => &[
            "exit_status",
            "exit_code",
            "stdout",
            "stderr",
            "user",
            "env",
        ],
        "package" => &["installed", "package_map", "version"],
        "service" => &["running", "enabled"],
        "addr" => &["reachable"],
        "http" => &[
            "status",
            "method",
            "body",
            "allow_insecure",
            "header",
            "stdout",
        ],
        "process" => &["running"],
        "port" => &["listening"],
        "mcp" => &["stdout", "tool", "input"],
        "k8s" => &[
            "k8s_count",
            "cluster",
            "k8s_kind",
            "namespace",
            "name",
            "label",
            "manifest",
            "text",
            "stdout",
        ],
        "cdp" => &["url", "tab", "stdout"],
        _ => &["contains", "stdout"],
    }
}

/// When a check runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CheckScope {
    /// In a check bed (the built image).
    Build,
    /// Against a running deployment.
    Deploy,
}

/// A text matcher.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Matcher {
    /// Contains a substring.
    Contains(String),
    /// Matches a regular expression.
    Matches(String),
}

/// What a check is about, with its expectations.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum CheckKind {
    /// A path.
    File {
        /// Path (may use `${HOME}`).
        path: String,
        /// Should it exist.
        exists: Option<bool>,
        /// Octal mode like `0755`.
        mode: Option<String>,
        /// `file`, `directory`, `symlink`.
        filetype: Option<String>,
        /// Substrings the content contains.
        contains: Vec<String>,
    },
    /// A shell command.
    Command {
        /// The command.
        command: String,
        /// Expected exit status.
        exit_status: Option<i64>,
        /// stdout matchers.
        stdout: Vec<Matcher>,
        /// stderr matchers.
        stderr: Vec<Matcher>,
    },
    /// A distro package.
    Package {
        /// Package name.
        name: String,
        /// Should it be installed.
        installed: bool,
        /// Per-distro names.
        package_map: BTreeMap<String, String>,
    },
    /// A service under the box's init.
    Service {
        /// Service name.
        name: String,
        /// Should it run.
        running: bool,
    },
    /// A TCP address.
    Addr {
        /// `host:port`.
        addr: String,
        /// Should it accept connections.
        reachable: bool,
    },
    /// A `plugin: <word>` check of schema 2026.174 whose word charly has no
    /// runner for (`tunnel`, `mount`, `dns`, a plugin candy's own word, …):
    /// kept so check beds report it as skipped with the reason, never passed
    /// or dropped.
    Unsupported {
        /// The plugin word.
        plugin: String,
    },
    /// Any other subject, kept as written (run against deployments).
    Other {
        /// The subject key (`http`, `mcp`, …).
        subject: String,
        /// The subject's value as text.
        value: String,
    },
}

/// One check.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Check {
    /// `id`, or `<owner>#<n>` when absent.
    pub id: String,
    /// build or deploy.
    pub scope: CheckScope,
    /// Run inside the container (default true).
    pub in_container: bool,
    /// Distros the check does not apply to.
    pub exclude_distro: Vec<String>,
    /// What it checks.
    pub kind: CheckKind,
    /// The entry's canonical JSON (what a cached result is keyed by).
    pub definition: serde_json::Value,
    /// Where it is written.
    #[serde(skip)]
    pub span: Span,
}

/// Parses an `eval:` list. `owner` names it in generated ids (`candy:redis`).
pub fn parse_checks(node: &Node, owner: &str, out: &mut Vec<Diagnostic>) -> Vec<Check> {
    let Some(items) = node.as_seq() else {
        if !node.is_null() {
            out.push(Diagnostic::error(
                node.span,
                "`eval:` must be a list of checks",
            ));
        }
        return Vec::new();
    };
    let mut checks = Vec::new();
    for (i, item) in items.iter().enumerate() {
        if let Some(c) = parse_check(item, owner, i, out) {
            checks.push(c);
        }
    }
    checks
}

fn parse_check(item: &Node, owner: &str, index: usize, out: &mut Vec<Diagnostic>) -> Option<Check> {
    let Some(entries) = item.as_map() else {
        out.push(Diagnostic::error(
            item.span,
            format!("check #{} of {owner} must be a mapping", index + 1),
        ));
        return None;
    };
    let id = text_field(item, "id").unwrap_or_else(|| format!("{owner}#{}", index + 1));
    let subject = check_subject(item, entries, &id, out)?;
    // An unsupported plugin's input is the plugin's own business.
    if subject != "plugin" {
        unknown_fields(entries, subject, &id, out);
    }
    let scope = check_scope(item, &id, out)?;
    let kind = check_kind(item, subject);
    Some(Check {
        id,
        scope,
        in_container: flag_field(item, "in_container", true),
        exclude_distro: exclude_distro(item),
        kind,
        definition: item.to_json(),
        span: item.span,
    })
}

/// The text of a check's field `k`, when it is a string.
fn text_field(item: &Node, k: &str) -> Option<String> {
    item.get(k).and_then(Node::as_str).map(str::to_string)
}

/// A check's boolean field `k` (`true`/`false` in any of YAML's three
/// spellings), else `default`.
fn flag_field(item: &Node, k: &str, default: bool) -> bool {
    match item.get(k).and_then(Node::as_str) {
        Some("true" | "True" | "TRUE") => true,
        Some("false" | "False" | "FALSE") => false,
        _ => default,
    }
}

/// The one subject key (kind) of the check `id`; none or several are errors
/// (with a guess at a misspelt one).
fn check_subject<'a>(
    item: &'a Node,
    entries: &'a [(Node, Node)],
    id: &str,
    out: &mut Vec<Diagnostic>,
) -> Option<&'a str> {
    let subjects: Vec<&str> = entries
        .iter()
        .filter_map(|(k, _)| k.as_str())
        .filter(|k| SUBJECTS.contains(k))
        .collect();
    match subjects.as_slice() {
        [one] => Some(*one),
        // A node-form `plugin: <word>` charly has no runner for (the loader
        // already warned where it is written).
        [] if item.get("plugin").and_then(Node::as_str).is_some() => Some("plugin"),
        [] => {
            let keys: Vec<&str> = entries.iter().filter_map(|(k, _)| k.as_str()).collect();
            let guess = keys.iter().find_map(|k| {
                nearest(k, SUBJECTS.iter().copied()).filter(|n| !COMMON.contains(k) && n != k)
            });
            let mut d = Diagnostic::error(
                item.span,
                format!(
                    "check `{id}` has no known kind; it needs one of: {}",
                    SUBJECTS.join(", ")
                ),
            );
            if let Some(g) = guess {
                d = d.with_hint(format!("did you mean `{g}`?"));
            }
            out.push(d);
            None
        }
        many => {
            out.push(Diagnostic::error(
                item.span,
                format!(
                    "check `{id}` names several kinds ({}); split it",
                    many.join(", ")
                ),
            ));
            None
        }
    }
}

/// Errors for the keys of the check `id` that belong to no kind: a misspelt
/// matcher (`contians:`) would silently leave a check that only tests
/// existence.
fn unknown_fields(entries: &[(Node, Node)], subject: &str, id: &str, out: &mut Vec<Diagnostic>) {
    for (k, _) in entries {
        let Some(name) = k.as_str() else { continue };
        if name == subject || COMMON.contains(&name) || matchers(subject).contains(&name) {
            continue;
        }
        // `on:` (cdp) is written unquoted in the corpus; other known matchers of other kinds are tolerated.
        let known_elsewhere =
            SUBJECTS.iter().any(|s| matchers(s).contains(&name)) || OP_FIELDS.contains(&name);
        if !known_elsewhere {
            let mut d = Diagnostic::error(
                k.span,
                format!("check `{id}`: unknown field `{name}` for a {subject} check"),
            );
            let all: Vec<&str> = matchers(subject)
                .iter()
                .chain(COMMON.iter())
                .copied()
                .collect();
            if let Some(n) = nearest(name, all) {
                d = d.with_hint(format!("did you mean `{n}`?"));
            }
            out.push(d);
        }
    }
}

/// The check's `scope:` (build when absent); another value is an error.
fn check_scope(item: &Node, id: &str, out: &mut Vec<Diagnostic>) -> Option<CheckScope> {
    match text_field(item, "scope").as_deref() {
        None | Some("build") => Some(CheckScope::Build),
        Some("deploy") => Some(CheckScope::Deploy),
        Some(other) => {
            out.push(Diagnostic::error(
                item.get("scope").map_or(item.span, |n| n.span),
                format!("check `{id}`: scope `{other}` must be `build` or `deploy`"),
            ));
            None
        }
    }
}

/// What a check of kind `subject` checks, read from its fields.
fn check_kind(item: &Node, subject: &str) -> CheckKind {
    let text = |k: &str| text_field(item, k);
    let flag = |k: &str, default: bool| flag_field(item, k, default);
    let value = item.get(subject).map(node_text).unwrap_or_default();
    match subject {
        "file" => CheckKind::File {
            path: value,
            exists: item.get("exists").map(|_| flag("exists", true)),
            mode: text("mode"),
            filetype: text("filetype"),
            contains: strings_or_matchers(item.get("contains")),
        },
        "command" => CheckKind::Command {
            command: value,
            exit_status: text("exit_status")
                .or_else(|| text("exit_code"))
                .and_then(|s| s.parse().ok()),
            stdout: matcher_list(item.get("stdout")),
            stderr: matcher_list(item.get("stderr")),
        },
        "package" => CheckKind::Package {
            name: value,
            installed: flag("installed", true),
            package_map: item
                .get("package_map")
                .and_then(Node::as_map)
                .map(|m| {
                    m.iter()
                        .filter_map(|(k, v)| {
                            Some((k.as_str()?.to_string(), v.as_str()?.to_string()))
                        })
                        .collect()
                })
                .unwrap_or_default(),
        },
        "service" => CheckKind::Service {
            name: value,
            running: flag("running", true),
        },
        "addr" => CheckKind::Addr {
            addr: value,
            reachable: flag("reachable", true),
        },
        "plugin" => CheckKind::Unsupported { plugin: value },
        other => CheckKind::Other {
            subject: other.to_string(),
            value,
        },
    }
}

/// The check's `exclude_distro:`: a list or a single distro.
fn exclude_distro(item: &Node) -> Vec<String> {
    item.get("exclude_distro")
        .map(|n| match n.as_seq() {
            Some(s) => s
                .iter()
                .filter_map(Node::as_str)
                .map(str::to_string)
                .collect(),
            None => n.as_str().map(|s| vec![s.to_string()]).unwrap_or_default(),
        })
        .unwrap_or_default()
}

fn node_text(n: &Node) -> String {
    n.as_str()
        .map_or_else(|| n.to_json().to_string(), str::to_string)
}

/// `stdout:` as a list of `{contains|matches}`, one mapping, or a plain string (contains).
fn matcher_list(n: Option<&Node>) -> Vec<Matcher> {
    let Some(n) = n else { return Vec::new() };
    let one = |m: &Node| -> Vec<Matcher> {
        if let Some(s) = m.as_str() {
            return vec![Matcher::Contains(s.to_string())];
        }
        let mut v = Vec::new();
        if let Some(c) = m.get("contains").and_then(Node::as_str) {
            v.push(Matcher::Contains(c.to_string()));
        }
        if let Some(r) = m.get("matches").and_then(Node::as_str) {
            v.push(Matcher::Matches(r.to_string()));
        }
        v
    };
    match n.as_seq() {
        Some(items) => items.iter().flat_map(one).collect(),
        None => one(n),
    }
}

fn strings_or_matchers(n: Option<&Node>) -> Vec<String> {
    matcher_list(n)
        .into_iter()
        .filter_map(|m| match m {
            Matcher::Contains(s) => Some(s),
            Matcher::Matches(_) => None,
        })
        .collect()
}

/// Expands `${HOME}`, `$HOME`, `${USER}` and a leading `~/` for the box user.
///
/// A lone `~` stays as written ([`Tilde::SlashOnly`]), unlike the emitters.
pub fn expand_user_vars(s: &str, user: &str, home: &str) -> String {
    expand_home_with(s, home, Tilde::SlashOnly).replace("${USER}", user)
}

/// Variables only a deployment can fill (`${HOST_PORT:…}`, `${VOLUME_CONTAINER_PATH:…}`, …).
pub fn deploy_only_var(s: &str) -> Option<String> {
    crate::names::vars_in(s)
        .into_iter()
        .find(|v| !matches!(v.as_str(), "HOME" | "USER" | "UID" | "GID"))
}

/// The byte range a node's text covers: from its start to the end of its last
/// descendant scalar.
fn extent(n: &Node) -> (usize, usize) {
    let start = n.span.offset as usize;
    let mut end = start + n.span.len as usize;
    match &n.value {
        Value::Scalar(..) => {}
        Value::Seq(items) => {
            for i in items {
                end = end.max(extent(i).1);
            }
        }
        Value::Map(pairs) => {
            for (k, v) in pairs {
                end = end.max(extent(k).1).max(extent(v).1);
            }
        }
    }
    (start, end)
}

/// A definition file's text with its check sections (`eval:`, `deploy_eval:`,
/// key and value) left out, for build keys: checks are not build inputs, so
/// adding, editing or removing a check never rebuilds an image (check beds
/// key their results on the check definitions themselves).
///
/// Whole lines are removed, from the line holding the section's key through
/// the line holding its last value. When the key cannot be found (an
/// unexpected layout) the text is returned unchanged: that can only cost a
/// rebuild, never a wrong cache hit.
pub fn without_checks<'a>(text: &'a str, sections: &[&Node]) -> std::borrow::Cow<'a, str> {
    let mut cut: Vec<(usize, usize)> = Vec::new();
    for n in sections {
        let (start, end) = extent(n);
        if start > text.len() || end > text.len() {
            return std::borrow::Cow::Borrowed(text);
        }
        // The key is on the value's line (flow style) or the nearest line
        // above whose text starts with `eval:`/`deploy_eval:`.
        let mut line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
        loop {
            let line = text[line_start..].trim_start();
            if line.starts_with("eval:") || line.starts_with("deploy_eval:") {
                break;
            }
            if line_start == 0 {
                return std::borrow::Cow::Borrowed(text);
            }
            line_start = text[..line_start - 1].rfind('\n').map_or(0, |i| i + 1);
        }
        let line_end = text[end..].find('\n').map_or(text.len(), |i| end + i + 1);
        cut.push((line_start, line_end));
    }
    if cut.is_empty() {
        return std::borrow::Cow::Borrowed(text);
    }
    cut.sort_unstable();
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for (a, b) in cut {
        if a > at {
            out.push_str(&text[at..a]);
        }
        at = at.max(b);
    }
    out.push_str(&text[at..]);
    std::borrow::Cow::Owned(out)
}

/// The key digest of a definition file's text, its check sections left out
/// (see [`without_checks`]): blake3 hex, the digest source keys record for
/// every other file, so a definition without checks keys as its bytes.
pub fn definition_digest(text: &str, checks: &[&Option<crate::yaml::Yaml>]) -> String {
    let sections: Vec<&Node> = checks
        .iter()
        .filter_map(|c| c.as_ref().map(|y| &y.0))
        .collect();
    let text = without_checks(text, &sections);
    blake3::hash(text.as_bytes()).to_hex().to_string()
}

/// [`definition_digest`] of a candy's definition file (`eval:` left out).
pub fn candy_definition_digest(text: &str, c: &crate::project::CandyEntry) -> String {
    definition_digest(text, &[&c.def.eval])
}

/// [`definition_digest`] of a box's definition file (`eval:` and
/// `deploy_eval:` left out).
pub fn box_definition_digest(text: &str, b: &crate::project::BoxEntry) -> String {
    definition_digest(text, &[&b.def.eval, &b.def.deploy_eval])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::FileId;
    use crate::yaml::parse_stream;

    fn parse(text: &str) -> (Vec<Check>, Vec<Diagnostic>) {
        let docs = parse_stream(FileId(0), text).expect("yaml");
        let mut d = Vec::new();
        let c = parse_checks(&docs[0], "candy:x", &mut d);
        (c, d)
    }

    #[test]
    fn every_shape_of_the_corpus() {
        let (c, d) = parse(
            "- {id: f, file: /usr/bin/x, exists: true, mode: \"0755\"}\n- id: c\n  command: echo hi\n  exit_status: 0\n  stdout:\n    - contains: hi\n    - matches: \"h.\"\n- {id: s, command: redis-cli ping, stdout: PONG}\n- {id: d, command: x, stdout: {contains: y}}\n- {id: p, package: openssh-server, installed: true, package_map: {arch: openssh}}\n- {id: sv, scope: deploy, service: sshd, running: true}\n- {id: a, scope: deploy, addr: \"127.0.0.1:${HOST_PORT:2222}\", reachable: true, timeout: 5s}\n- {id: h, scope: deploy, http: http://x/, status: 200}\n",
        );
        assert!(d.is_empty(), "{d:?}");
        assert_eq!(c.len(), 8);
        assert!(
            matches!(&c[0].kind, CheckKind::File { mode: Some(m), exists: Some(true), .. } if m == "0755")
        );
        assert!(
            matches!(&c[1].kind, CheckKind::Command { stdout, exit_status: Some(0), .. } if stdout.len() == 2)
        );
        assert!(
            matches!(&c[2].kind, CheckKind::Command { stdout, .. } if stdout == &vec![Matcher::Contains("PONG".into())])
        );
        assert!(
            matches!(&c[3].kind, CheckKind::Command { stdout, .. } if stdout == &vec![Matcher::Contains("y".into())])
        );
        assert!(
            matches!(&c[4].kind, CheckKind::Package { package_map, .. } if package_map["arch"] == "openssh")
        );
        assert_eq!(c[5].scope, CheckScope::Deploy);
        assert!(matches!(&c[7].kind, CheckKind::Other { subject, .. } if subject == "http"));
        assert_eq!(c[0].scope, CheckScope::Build, "build is the default");
    }

    #[test]
    fn unknown_kind_is_an_error_at_its_place() {
        let (c, d) =
            parse("- {id: ok, file: /x}\n- id: bad\n  fiel: /etc/passwd\n  exists: true\n");
        assert_eq!(c.len(), 1);
        assert_eq!(d.len(), 1);
        assert!(d[0].is_error());
        assert!(d[0].message.contains("check `bad` has no known kind"));
        assert_eq!(d[0].span.map(|s| s.line), Some(2));
        assert_eq!(d[0].hint.as_deref(), Some("did you mean `file`?"));
    }

    #[test]
    fn user_vars_and_deploy_vars() {
        assert_eq!(
            expand_user_vars("${HOME}/.x/${USER}", "u", "/home/u"),
            "/home/u/.x/u"
        );
        assert_eq!(expand_user_vars("~/a", "u", "/home/u"), "/home/u/a");
        assert_eq!(
            deploy_only_var("127.0.0.1:${HOST_PORT:2222}").as_deref(),
            Some("HOST_PORT")
        );
        assert_eq!(deploy_only_var("${HOME}/x"), None);
    }

    /// Checks keep a lone `~` (the emitters expand it): the one difference
    /// between the home expansions, kept on purpose.
    #[test]
    fn a_lone_tilde_is_not_the_home_in_checks() {
        assert_eq!(expand_user_vars("~", "u", "/home/u"), "~");
        assert_eq!(crate::home::expand_home("~", "/home/u"), "/home/u");
    }
}
