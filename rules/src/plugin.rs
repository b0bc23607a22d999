//! Plugins as the project declares them: a candy's `plugin:` block names
//! the `<class>:<word>` capabilities it serves (`step:examplestepkind`,
//! `verb:file`, `kind:pod`, …), where its code comes from (`source:`) and,
//! as charly's extension, how to build its executable (`build:`).
//!
//! The loader collects every declaration into [`Plugins`] (one owner per
//! capability); a task written `plugin: <word>` must name a `step:` or
//! `verb:` capability some candy declares, and compiles to an
//! `external:<word>` step (step class) or an `external-plugin` step (verb
//! class) that carries the task's `plugin_input` as its payload. What the
//! step's scope, venue and gate are is the plugin's to say (its Describe
//! reply, [`StepContract`]); until the host has asked it, the task's own
//! account decides the scope and the step runs on the target itself.
//!
//! Nothing here starts a plugin: this crate is pure.

use crate::diag::{Diagnostic, nearest};
use crate::ir::{Gate, Scope, Venue};
use crate::source::Span;
use crate::yaml::node::Node;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A capability class (`<class>:<word>`). The original's schema lists
/// kind, deploy, verb, step, build and builder; its own plugin candies
/// also declare `command:` words, so charly accepts those too.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProviderClass {
    /// A node kind (`kind:pod`).
    Kind,
    /// A deploy substrate (`deploy:vm`).
    Deploy,
    /// A verb usable as a run step or a check (`verb:file`).
    Verb,
    /// An install-step kind (`step:examplestepkind`).
    Step,
    /// A build command (`build:box`).
    Build,
    /// A builder (`builder:pixi`).
    Builder,
    /// A CLI command (`command:doctor`).
    Command,
}

impl ProviderClass {
    /// Every class, in the order the spelling lists them.
    pub const ALL: [ProviderClass; 7] = [
        ProviderClass::Kind,
        ProviderClass::Deploy,
        ProviderClass::Verb,
        ProviderClass::Step,
        ProviderClass::Build,
        ProviderClass::Builder,
        ProviderClass::Command,
    ];

    /// The spelling before the colon.
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderClass::Kind => "kind",
            ProviderClass::Deploy => "deploy",
            ProviderClass::Verb => "verb",
            ProviderClass::Step => "step",
            ProviderClass::Build => "build",
            ProviderClass::Builder => "builder",
            ProviderClass::Command => "command",
        }
    }

    /// Parses the spelling before the colon.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

/// Whether `w` can be a capability word: lowercase letters, digits, `-`
/// and `_`, starting with a letter or digit. The word names a plugin
/// executable, a key and a Containerfile comment, so nothing else passes.
pub fn is_word(w: &str) -> bool {
    let mut chars = w.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
        && w.len() <= 64
}

/// One declared capability and the candy that serves it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Provider {
    /// Its class.
    pub class: ProviderClass,
    /// Its word.
    pub word: String,
    /// The key of the candy that declares it.
    pub candy: String,
    /// Where it is declared.
    pub span: Span,
}

/// A candy's `plugin:` block, checked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PluginDecl {
    /// `(class, word, where)`, as listed.
    pub providers: Vec<(ProviderClass, String, Span)>,
    /// `source:` (`builtin` or a `github.com/org/repo[/sub][@tag]` ref).
    pub source: Option<String>,
    /// `build:` (charly's extension): a shell command run in the candy's
    /// directory that leaves the executable at `$CHARLY_PLUGIN_OUT`.
    pub build: Option<String>,
}

/// The fields a `plugin:` block may have.
const DECL_FIELDS: [&str; 3] = ["providers", "source", "build"];

/// Reads a candy's `plugin:` block; problems go to `out` with their
/// position (a bad entry is left out, the rest is kept).
pub fn parse_decl(candy: &str, node: &Node, out: &mut Vec<Diagnostic>) -> PluginDecl {
    let mut decl = PluginDecl::default();
    let Some(fields) = node.as_map() else {
        out.push(Diagnostic::error(
            node.span,
            format!("candy `{candy}`: `plugin:` must be a mapping with `providers:` and `source:`"),
        ));
        return decl;
    };
    for (k, v) in fields {
        let key = k.as_str().unwrap_or("");
        match key {
            "providers" => decl.providers = parse_providers(candy, v, out),
            "source" | "build" => match v.as_str() {
                Some(s) if !s.trim().is_empty() => {
                    let s = s.to_string();
                    if key == "source" {
                        decl.source = Some(s);
                    } else {
                        decl.build = Some(s);
                    }
                }
                _ => out.push(Diagnostic::error(
                    v.span,
                    format!("candy `{candy}`: plugin `{key}:` must be a non-empty string"),
                )),
            },
            _ => {
                let mut d = Diagnostic::warning(
                    k.span,
                    format!("candy `{candy}`: unknown field `{key}` in `plugin:`; it is ignored"),
                );
                if let Some(n) = nearest(key, DECL_FIELDS) {
                    d = d.with_hint(format!("did you mean `{n}`?"));
                }
                out.push(d);
            }
        }
    }
    if node.get("providers").is_none() {
        out.push(Diagnostic::warning(
            node.span,
            format!("candy `{candy}`: `plugin:` declares no providers"),
        ));
    }
    decl
}

fn parse_providers(
    candy: &str,
    v: &Node,
    out: &mut Vec<Diagnostic>,
) -> Vec<(ProviderClass, String, Span)> {
    let Some(items) = v.as_seq() else {
        out.push(Diagnostic::error(
            v.span,
            format!("candy `{candy}`: plugin `providers:` must be a list of `<class>:<word>`"),
        ));
        return Vec::new();
    };
    let mut got = Vec::new();
    for item in items {
        let text = item.as_str().unwrap_or("");
        let Some((class, word)) = text.split_once(':') else {
            out.push(
                Diagnostic::error(
                    item.span,
                    format!("candy `{candy}`: provider `{text}` is not `<class>:<word>`"),
                )
                .with_hint("for example `step:mystep` or `verb:myprobe`"),
            );
            continue;
        };
        let Some(c) = ProviderClass::parse(class) else {
            let mut d = Diagnostic::error(
                item.span,
                format!(
                    "candy `{candy}`: provider class `{class}` is not one of {}",
                    ProviderClass::ALL.map(ProviderClass::as_str).join(", ")
                ),
            );
            if let Some(n) = nearest(class, ProviderClass::ALL.map(ProviderClass::as_str)) {
                d = d.with_hint(format!("did you mean `{n}:{word}`?"));
            }
            out.push(d);
            continue;
        };
        if !is_word(word) {
            out.push(
                Diagnostic::error(
                    item.span,
                    format!("candy `{candy}`: provider word `{word}` is not a valid word"),
                )
                .with_hint("lowercase letters, digits, `-` and `_`, at most 64, starting with a letter or digit"),
            );
            continue;
        }
        got.push((c, word.to_string(), item.span));
    }
    got
}

/// The install-step contract a plugin declares for a `step:` or `verb:`
/// word (its Describe reply): authoritative for the compiled step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepContract {
    /// Where its effect lands.
    pub scope: Scope,
    /// Where its commands run.
    pub venue: Venue,
    /// The opt-in it needs.
    pub gate: Gate,
    /// Whether it contributes a Containerfile fragment at build (`emit`).
    pub emits: bool,
}

/// Every plugin capability of a project, and the contracts the host has
/// learned from the plugins themselves.
#[derive(Clone, Debug, Default)]
pub struct Plugins {
    /// `(class, word)` → who serves it.
    pub providers: BTreeMap<(ProviderClass, String), Provider>,
    /// `word` → its step contract (filled by the host after asking the
    /// plugin; empty in a project as loaded).
    pub contracts: BTreeMap<String, StepContract>,
    /// Candy key → its declaration's `build:` command, when it has one.
    pub builds: BTreeMap<String, String>,
}

impl Plugins {
    /// Collects the declarations of `decls` (`(candy key, decl)`, in the
    /// order candies were registered); a capability declared twice is an
    /// error at the second declaration, naming the first.
    pub fn collect<'a>(
        decls: impl IntoIterator<Item = (&'a str, &'a PluginDecl)>,
        out: &mut Vec<Diagnostic>,
    ) -> Plugins {
        let mut p = Plugins::default();
        for (candy, decl) in decls {
            if let Some(b) = &decl.build {
                p.builds.insert(candy.to_string(), b.clone());
            }
            for (class, word, span) in &decl.providers {
                let key = (*class, word.clone());
                if let Some(first) = p.providers.get(&key) {
                    if first.candy != candy {
                        out.push(Diagnostic::error(
                            *span,
                            format!(
                                "`{}:{word}` is declared by candy `{candy}` and by candy `{}`; one capability has one plugin",
                                class.as_str(),
                                first.candy
                            ),
                        ));
                    }
                    continue;
                }
                p.providers.insert(
                    key,
                    Provider {
                        class: *class,
                        word: word.clone(),
                        candy: candy.to_string(),
                        span: *span,
                    },
                );
            }
        }
        p
    }

    /// Whether `word` is declared in `class`.
    pub fn declares(&self, class: ProviderClass, word: &str) -> bool {
        self.providers.contains_key(&(class, word.to_string()))
    }

    /// The provider a task's `plugin: <word>` means: a `step:` word, else
    /// a `verb:` word.
    pub fn for_task(&self, word: &str) -> Option<&Provider> {
        [ProviderClass::Step, ProviderClass::Verb]
            .into_iter()
            .find_map(|c| self.providers.get(&(c, word.to_string())))
    }

    /// The words of `classes`, for "did you mean".
    pub fn words(&self, classes: &[ProviderClass]) -> Vec<&str> {
        self.providers
            .values()
            .filter(|p| classes.contains(&p.class))
            .map(|p| p.word.as_str())
            .collect()
    }
}

/// The `context:` words a plugin task may list.
pub const CONTEXTS: [&str; 3] = ["build", "deploy", "runtime"];

/// Checks task `index` of candy `candy` against the declarations: its
/// `plugin:` word must be a declared `step:` or `verb:` word, and
/// `plugin_input:` and `context:` belong to plugin tasks only.
pub fn check_task(
    plugins: &Plugins,
    candy: &str,
    index: usize,
    t: &crate::model::candy::Task,
    out: &mut Vec<Diagnostic>,
) {
    let n = index + 1;
    let Some(word) = &t.plugin else {
        if let Some(i) = &t.plugin_input {
            out.push(Diagnostic::error(
                i.0.span,
                format!("candy `{candy}`: task #{n} has `plugin_input:` but no `plugin:`"),
            ));
        }
        if let Some(c) = t.context.first() {
            out.push(Diagnostic::error(
                c.span,
                format!("candy `{candy}`: task #{n}: `context:` is only for `plugin:` tasks"),
            ));
        }
        return;
    };
    if plugins.for_task(&word.value).is_none() {
        let mut d = Diagnostic::error(
            word.span,
            format!(
                "candy `{candy}`: task #{n} uses plugin `{}`, which no candy declares as a step or verb",
                word.value
            ),
        );
        let known = plugins.words(&[ProviderClass::Step, ProviderClass::Verb]);
        d = match nearest(&word.value, known) {
            Some(k) => d.with_hint(format!("did you mean `{k}`?")),
            None => d.with_hint(format!(
                "a plugin candy declares it with `plugin: {{providers: [\"step:{}\"], source: …}}`",
                word.value
            )),
        };
        out.push(d);
    }
    for c in &t.context {
        if !CONTEXTS.contains(&c.value.as_str()) {
            out.push(Diagnostic::error(
                c.span,
                format!(
                    "candy `{candy}`: task #{n}: context `{}` is not one of {}",
                    c.value,
                    CONTEXTS.join(", ")
                ),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::FileId;
    use crate::yaml::node::parse_stream;

    fn decl(yaml: &str) -> (PluginDecl, Vec<Diagnostic>) {
        let n = parse_stream(FileId(0), yaml).expect("yaml").remove(0);
        let mut out = Vec::new();
        let d = parse_decl("c", &n, &mut out);
        (d, out)
    }

    #[test]
    fn a_declaration_reads_providers_source_and_build() {
        let (d, out) = decl(
            "providers: [step:examplestepkind, verb:unix_group, command:doctor]\nsource: builtin\nbuild: cargo build\n",
        );
        assert!(out.is_empty(), "{out:?}");
        let got: Vec<_> = d
            .providers
            .iter()
            .map(|(c, w, _)| (*c, w.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (ProviderClass::Step, "examplestepkind"),
                (ProviderClass::Verb, "unix_group"),
                (ProviderClass::Command, "doctor")
            ]
        );
        assert_eq!(d.source.as_deref(), Some("builtin"));
        assert_eq!(d.build.as_deref(), Some("cargo build"));
    }

    #[test]
    fn bad_entries_are_errors_at_their_position_and_left_out() {
        let (d, out) =
            decl("providers:\n  - stpe:x\n  - step:Bad/Word\n  - nocolon\n  - verb:ok\nsorce: y\n");
        assert_eq!(d.providers.len(), 1);
        let msgs: Vec<&str> = out.iter().map(|d| d.message.as_str()).collect();
        assert!(msgs[0].contains("class `stpe`"), "{msgs:?}");
        assert_eq!(out[0].span.map(|s| s.line), Some(2));
        assert!(
            out[0].hint.as_deref().is_some_and(|h| h.contains("step:x")),
            "{out:?}"
        );
        assert!(
            msgs[1].contains("`Bad/Word` is not a valid word"),
            "{msgs:?}"
        );
        assert!(
            msgs[2].contains("`nocolon` is not `<class>:<word>`"),
            "{msgs:?}"
        );
        assert!(msgs[3].contains("unknown field `sorce`"), "{msgs:?}");
    }

    #[test]
    fn one_capability_has_one_owner() {
        let (a, _) = decl("providers: [step:s, verb:v]\n");
        let (b, _) = decl("providers: [step:s, kind:s]\n");
        let mut out = Vec::new();
        let p = Plugins::collect([("a", &a), ("b", &b)], &mut out);
        assert_eq!(out.len(), 1, "{out:?}");
        assert!(out[0].message.contains("by candy `b` and by candy `a`"));
        assert_eq!(p.for_task("s").map(|p| p.candy.as_str()), Some("a"));
        assert_eq!(p.for_task("v").map(|p| p.class), Some(ProviderClass::Verb));
        assert!(p.for_task("nope").is_none());
        assert!(p.declares(ProviderClass::Kind, "s"));
    }

    #[test]
    fn words_are_checked() {
        assert!(is_word("unix_group") && is_word("kernel-param") && is_word("9p"));
        assert!(!is_word("") && !is_word("-x") && !is_word("A") && !is_word("a/b"));
        assert!(!is_word("a b") && !is_word(&"a".repeat(65)));
    }
}
