//! The JSON shapes carried in `result_json` for step/deploy plugins, as the
//! original Go tool defines them (`charly/spec`: `EmitReply`, `DeployReply`,
//! `DeployReplyRecord`, `ReverseOp`; `charly/plugin/sdk`: `BuildDeployReply`,
//! `PluginScriptReverseOp`). Field names follow the Go `json` tags.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The op a step plugin answers at image build time.
pub const OP_EMIT: &str = "emit";
/// The op a step/deploy plugin answers at deploy time (with an executor).
pub const OP_EXECUTE: &str = "execute";

/// `ReverseOp.kind` of a recorded teardown shell script.
pub const REVERSE_OP_PLUGIN_SCRIPT: &str = "plugin-script";
/// The `extra` key holding a plugin-script's body.
pub const REVERSE_OP_PLUGIN_SCRIPT_KEY: &str = "script";

/// Reply to `emit`: a Containerfile fragment spliced verbatim.
/// JSON: `{"fragment": "RUN …\n"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmitReply {
    /// RUN/COPY/… directives.
    pub fragment: String,
}

/// Reply to `execute`: the teardown ops to record, and the ledger identity.
/// JSON: `{"reverse_ops": [ReverseOp…], "record": {"candy": "…", "version": "…"}}`
/// (`reverse_ops` left out when empty, as Go's `omitempty`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeployReply {
    /// Teardown ops, replayed in order at removal.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reverse_ops: Vec<ReverseOp>,
    /// Who the record belongs to.
    pub record: DeployReplyRecord,
}

/// The ledger identity in a [`DeployReply`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeployReplyRecord {
    /// The candy name.
    pub candy: String,
    /// Its version (left out when empty).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,
}

/// One recorded teardown action.
/// JSON: `{"kind": "plugin-script", "scope": "user", "extra": {"script": "rm -rf …"}}`;
/// `format`, `targets`, `scope`, `extra` are left out when empty.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReverseOp {
    /// What kind of op (`plugin-script`, …).
    pub kind: String,
    /// Package format for package removal (`rpm`/`deb`/`pac`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub format: String,
    /// Package names, file paths, env names, …
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<String>,
    /// `system` (as root) or `user`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub scope: String,
    /// Op-specific details.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, String>,
}

impl ReverseOp {
    /// A recorded shell script run at removal at `scope` (`system` → root,
    /// `user` → the deploy user): the Go SDK's `PluginScriptReverseOp`.
    pub fn plugin_script(scope: &str, script: &str) -> ReverseOp {
        ReverseOp {
            kind: REVERSE_OP_PLUGIN_SCRIPT.to_string(),
            format: String::new(),
            targets: Vec::new(),
            scope: scope.to_string(),
            extra: BTreeMap::from([(REVERSE_OP_PLUGIN_SCRIPT_KEY.to_string(), script.to_string())]),
        }
    }

    /// The script of a `plugin-script` op.
    pub fn script(&self) -> Option<&str> {
        (self.kind == REVERSE_OP_PLUGIN_SCRIPT)
            .then(|| {
                self.extra
                    .get(REVERSE_OP_PLUGIN_SCRIPT_KEY)
                    .map(String::as_str)
            })
            .flatten()
    }
}

/// Quotes a string for a POSIX shell (single quotes).
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deploy_reply_matches_the_go_shape() {
        let r = DeployReply {
            reverse_ops: vec![ReverseOp::plugin_script("user", "rm -rf /tmp/x")],
            record: DeployReplyRecord {
                candy: "c".into(),
                version: "1".into(),
            },
        };
        let v = serde_json::to_value(&r).expect("serializes");
        assert_eq!(
            v,
            serde_json::json!({
                "reverse_ops": [{"kind": "plugin-script", "scope": "user", "extra": {"script": "rm -rf /tmp/x"}}],
                "record": {"candy": "c", "version": "1"}
            })
        );
        assert_eq!(r.reverse_ops[0].script(), Some("rm -rf /tmp/x"));
    }

    #[test]
    fn shell_quote_survives_quotes() {
        assert_eq!(shell_quote("a'b"), r"'a'\''b'");
    }
}
