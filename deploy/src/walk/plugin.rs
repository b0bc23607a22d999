//! Plugin steps on hosts (`external:<word>`, `external-plugin`): the
//! walker asks charly's plugin host to `execute` the step on the walk's own
//! host, then records the reverse ops the plugin's reply carries as undo
//! operations before the step is reported done; `bundle del` replays them
//! like any other undo (record and replay: never recomputed).

use super::reverse::undo_of;
use super::{R, StepCx, TargetUser};
use crate::host::Host;
use crate::ledger::Undo;
use charly_rules::plan::{ExternalStep, InstallStep, ReverseKind, ReverseOp, Scope};
use std::collections::BTreeMap;

/// One plugin step to execute.
#[derive(Debug)]
pub struct PluginCall<'a> {
    /// The capability word.
    pub word: &'a str,
    /// `step` or `verb`.
    pub class: &'a str,
    /// The task's `plugin_input` (JSON `null` when there is none).
    pub input: &'a serde_json::Value,
    /// The bundle being applied (the plugin's `deploy_name`).
    pub bundle: &'a str,
    /// The account the plan is for.
    pub user: &'a TargetUser,
    /// The step's scope.
    pub scope: Scope,
}

/// What executes plugin steps for a walk (the CLI wires charly's plugin
/// host in; without one, plugin steps are skipped and say why).
pub trait PluginSteps: Send + Sync {
    /// Executes `call` against `host` (the plugin acts on the host only
    /// through it) and returns the reverse ops the plugin reported.
    fn execute(&self, call: &PluginCall<'_>, host: &mut dyn Host)
    -> Result<Vec<ReverseOp>, String>;
}

/// Applies a plugin step: the plugin executes it, its reverse ops become
/// the step's undo operations (committed before the step is done).
pub(super) fn plugin_step(cx: &mut StepCx<'_>, s: &InstallStep, e: &ExternalStep) -> R<()> {
    let word = e.data["word"].as_str().unwrap_or_default();
    let class = e.data["class"].as_str().unwrap_or("step");
    let Some(plugins) = cx.plugins.clone() else {
        return Err(format!("plugin `{word}`: no plugin host for this walk"));
    };
    cx.actions.push(format!("plugin {word}: execute"));
    if cx.dry() {
        return Ok(());
    }
    let call = PluginCall {
        word,
        class,
        input: &e.data["input"],
        bundle: cx.bundle,
        user: cx.user,
        scope: s.scope,
    };
    let ops = plugins
        .execute(&call, &mut *cx.host)
        .map_err(|m| format!("plugin `{word}`: {m}"))?;
    cx.changed();
    // Each reported op, replayed as recorded; the record carries the op.
    for op in &ops {
        let undo = undo_of(op, cx.user, &format!("plugin `{word}`"));
        cx.undo_for(&undo, std::slice::from_ref(op), &[])?;
    }
    if ops.is_empty() {
        cx.undo(
            &Undo::Note {
                text: format!("plugin `{word}` reported nothing to undo"),
            },
            &[],
        )?;
    }
    Ok(())
}

/// Reads the reverse ops of a plugin's `execute` reply (the original's
/// `DeployReply`: `{"reverse_ops": [{"kind", "format", "targets",
/// "scope", "extra", "uninstall_cmd"}], "record": {…}}`, where `scope` is
/// 0 system, 1 user, 2 user profile, absent meaning system; the names
/// `system`, `user`, `user-profile` are read too).
pub fn parse_deploy_reply(json: &[u8]) -> Result<Vec<ReverseOp>, String> {
    #[derive(serde::Deserialize)]
    struct Wire {
        #[serde(default)]
        reverse_ops: Vec<WireOp>,
    }
    #[derive(serde::Deserialize)]
    struct WireOp {
        kind: ReverseKind,
        #[serde(default)]
        format: Option<String>,
        #[serde(default)]
        targets: Vec<String>,
        #[serde(default)]
        scope: WireScope,
        #[serde(default)]
        extra: BTreeMap<String, String>,
        #[serde(default)]
        uninstall_cmd: Option<String>,
    }
    /// The Go wire's integer, or a name (as hand-written plugins send).
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum WireScope {
        Number(i64),
        Name(String),
    }
    impl Default for WireScope {
        fn default() -> Self {
            WireScope::Number(0)
        }
    }
    let w: Wire = serde_json::from_slice(json).map_err(|e| {
        format!(
            "its execute reply is not a deploy reply ({e}): {}",
            crate::host::shorten(&String::from_utf8_lossy(json), 200)
        )
    })?;
    w.reverse_ops
        .into_iter()
        .map(|o| {
            let scope = match o.scope {
                WireScope::Number(0) => Scope::System,
                WireScope::Number(1) => Scope::User,
                WireScope::Number(2) => Scope::UserProfile,
                WireScope::Name(n) if n == "system" || n.is_empty() => Scope::System,
                WireScope::Name(n) if n == "user" => Scope::User,
                WireScope::Name(n) if n == "user-profile" => Scope::UserProfile,
                WireScope::Number(n) => {
                    return Err(format!("its reverse op has scope {n} (0, 1 or 2)"));
                }
                WireScope::Name(n) => {
                    return Err(format!(
                        "its reverse op has scope `{n}` (system, user or user-profile)"
                    ));
                }
            };
            Ok(ReverseOp {
                kind: o.kind,
                format: o.format.filter(|f| !f.is_empty()),
                targets: o.targets,
                scope,
                extra: o.extra,
                uninstall_cmd: o.uninstall_cmd.filter(|c| !c.is_empty()),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_originals_reply_shape_is_read() {
        let ops = parse_deploy_reply(
            br#"{"reverse_ops":[{"kind":"plugin-script","scope":1,"extra":{"script":"rm -rf /tmp/x"}},
                {"kind":"rm-file-system","targets":["/etc/a"]}],"record":{"candy":"c","version":"1"}}"#,
        )
        .expect("parses");
        assert_eq!(ops.len(), 2);
        assert_eq!(
            (ops[0].kind, ops[0].scope),
            (ReverseKind::PluginScript, Scope::User)
        );
        assert_eq!(
            (ops[1].kind, ops[1].scope),
            (ReverseKind::RmFileSystem, Scope::System)
        );
        assert!(parse_deploy_reply(b"not json").is_err());
        let e = parse_deploy_reply(br#"{"reverse_ops":[{"kind":"plugin-script","scope":7}]}"#)
            .expect_err("scope 7");
        assert!(e.contains("scope 7"), "{e}");
        let named = parse_deploy_reply(
            br#"{"reverse_ops":[{"kind":"plugin-script","scope":"user","extra":{"script":"x"}}]}"#,
        )
        .expect("a named scope");
        assert_eq!(named[0].scope, Scope::User);
        let e = parse_deploy_reply(br#"{"reverse_ops":[{"kind":"format-disk"}]}"#)
            .expect_err("unknown kind");
        assert!(e.contains("format-disk"), "{e}");
    }
}
