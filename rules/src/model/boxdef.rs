//! The box schema (`box/<name>/charly.yml`, root key `box:`).

use crate::yaml::{OneOrMany, OrderedMap, Spanned, Yaml};
use serde::Deserialize;

/// One box's definition as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename = "box", default)]
pub struct BoxDef {
    /// Box name.
    pub name: Option<Spanned<String>>,
    /// Version (CalVer).
    pub version: Option<Spanned<String>>,
    /// Base: an external image ref, another box, or `ns.box`.
    pub base: Option<Spanned<String>>,
    /// Bootstrap source (`builder:debootstrap`), instead of `base`.
    pub from: Option<Spanned<String>>,
    /// The builder box that runs a `from: builder:<b>` bootstrap.
    pub bootstrap_builder_image: Option<Spanned<String>>,
    /// Distro tags, most specific first.
    pub distro: Option<Spanned<OneOrMany<String>>>,
    /// Package formats; the first is primary.
    pub build: Option<Spanned<OneOrMany<String>>>,
    /// Builder type → builder box.
    pub builder: OrderedMap<Spanned<String>>,
    /// Builder types this box can serve.
    pub produce: Vec<Spanned<String>>,
    /// Candies installed, in authored order.
    pub candy: Vec<Spanned<String>>,
    /// Box user name.
    pub user: Option<Spanned<String>>,
    /// Box user uid.
    pub uid: Option<Spanned<u32>>,
    /// Box user gid.
    pub gid: Option<Spanned<u32>>,
    /// Box user home.
    pub home: Option<String>,
    /// `auto`, `adopt` or `create`.
    pub user_policy: Option<Spanned<String>>,
    /// Published ports (`host:container`, a label only).
    pub port: Vec<Spanned<String>>,
    /// Environment (`K=V` list or a mapping); a label.
    pub env: Option<Yaml>,
    /// Disabled boxes are skipped by `--all`.
    pub enabled: Option<bool>,
    /// Target platforms.
    pub platform: Option<OneOrMany<String>>,
    /// Image tag (`auto` derives it from the version and key).
    pub tag: Option<String>,
    /// Registry prefix.
    pub registry: Option<String>,
    /// Keep the base image's user (bootc).
    pub preserve_user: Option<bool>,
    /// Data-only image.
    pub data_image: Option<bool>,
    /// Kept.
    pub description: Option<Yaml>,
    /// Checks.
    pub eval: Option<Yaml>,
    /// Kept.
    pub deploy_eval: Option<Yaml>,
    /// Kept.
    pub network: Option<Yaml>,
    /// Kept.
    pub security: Option<Yaml>,
    /// Kept.
    pub alias: Option<Yaml>,
    /// Kept.
    pub volume: Option<Yaml>,
    /// Kept (the original ignores it too).
    pub init: Option<Yaml>,
    /// Kept.
    pub status: Option<Yaml>,
    /// Kept.
    pub info: Option<Yaml>,
    /// Kept.
    pub hook: Option<Yaml>,
    /// Kept.
    pub merge: Option<Yaml>,
}
