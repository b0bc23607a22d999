//! What a plugin serves (`PluginMeta.Describe`), as plain Rust types.

use serde::{Deserialize, Serialize};

use crate::proto::charly as pb;

/// A plugin's answer to `Describe`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    /// The plugin's CalVer (the version authority).
    pub calver: String,
    /// A secondary protocol gate.
    pub protocol_version: u32,
    /// The capabilities it serves.
    pub provided: Vec<ProvidedCapability>,
    /// Its self-contained CUE source validating `plugin_input`.
    pub schema_cue: String,
}

/// One served capability.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProvidedCapability {
    /// `verb`, `kind`, `deploy`, `step` or `builder`.
    pub class: String,
    /// The reserved word, e.g. `examplestepkind`.
    pub word: String,
    /// The CUE definition validating this word's input.
    pub input_def: String,
    /// Only for class `step`: the declared install-step contract.
    pub step_contract: Option<StepContract>,
    /// Only for class `kind`: decodes a structural entity.
    pub structural: bool,
    /// Only for class `deploy`: brings its own venue lifecycle.
    pub lifecycle: bool,
    /// Only for class `deploy`: has a preresolve step.
    pub preresolve: bool,
    /// Only for class `kind`: serves a deep validate op.
    pub validates: bool,
    /// The lifecycle phase (`""`: the default).
    pub phase: String,
}

/// A step plugin's declared contract.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepContract {
    /// `system`, `user` or `user-profile`.
    pub scope: String,
    /// Where its commands run.
    pub venue: StepVenue,
    /// `""`, `allow-repo-changes`, `allow-root-tasks` or `with-services`.
    pub gate: String,
    /// Whether it emits a Containerfile fragment (op `emit`).
    pub emits: bool,
}

/// The wire's Venue enum (an `int32`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum StepVenue {
    /// 0: on the host itself.
    HostNative,
    /// 1: in the container builder.
    ContainerBuilder,
    /// 2: skipped.
    Skip,
    /// A value this host does not know.
    Other(i32),
}

impl From<i32> for StepVenue {
    fn from(v: i32) -> Self {
        match v {
            0 => StepVenue::HostNative,
            1 => StepVenue::ContainerBuilder,
            2 => StepVenue::Skip,
            n => StepVenue::Other(n),
        }
    }
}

impl From<StepVenue> for i32 {
    fn from(v: StepVenue) -> Self {
        match v {
            StepVenue::HostNative => 0,
            StepVenue::ContainerBuilder => 1,
            StepVenue::Skip => 2,
            StepVenue::Other(n) => n,
        }
    }
}

impl From<pb::Capabilities> for Capabilities {
    fn from(c: pb::Capabilities) -> Self {
        Capabilities {
            calver: c.calver,
            protocol_version: c.protocol_version,
            provided: c.provided.into_iter().map(Into::into).collect(),
            schema_cue: c.schema_cue,
        }
    }
}

impl From<pb::ProvidedCapability> for ProvidedCapability {
    fn from(p: pb::ProvidedCapability) -> Self {
        ProvidedCapability {
            class: p.class,
            word: p.word,
            input_def: p.input_def,
            step_contract: p.step_contract.map(|s| StepContract {
                scope: s.scope,
                venue: s.venue.into(),
                gate: s.gate,
                emits: s.emits,
            }),
            structural: p.structural,
            lifecycle: p.lifecycle,
            preresolve: p.preresolve,
            validates: p.validates,
            phase: p.phase,
        }
    }
}

impl From<Capabilities> for pb::Capabilities {
    fn from(c: Capabilities) -> Self {
        pb::Capabilities {
            calver: c.calver,
            protocol_version: c.protocol_version,
            provided: c
                .provided
                .into_iter()
                .map(|p| pb::ProvidedCapability {
                    class: p.class,
                    word: p.word,
                    input_def: p.input_def,
                    step_contract: p.step_contract.map(|s| pb::StepContract {
                        scope: s.scope,
                        venue: s.venue.into(),
                        gate: s.gate,
                        emits: s.emits,
                    }),
                    structural: p.structural,
                    lifecycle: p.lifecycle,
                    preresolve: p.preresolve,
                    validates: p.validates,
                    phase: p.phase,
                })
                .collect(),
            schema_cue: c.schema_cue,
        }
    }
}
