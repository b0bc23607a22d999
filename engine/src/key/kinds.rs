//! What enters each kind of node's key, one struct per kind, every input a
//! named field.
//!
//! The graph fills one of these per node ([`OwnInputs`]) and writes it into
//! the [`KeyInputs`] maps the key is hashed from, under the names `charly
//! explain` reports (`fact:user`, `var:NAME`, `vocab:distro/fedora`, …).
//! Each `write` destructures its struct without `..`, so a new field does
//! not compile until it is written; the `every_field_moves_the_key` test
//! changes every field of every kind, one at a time (found from the
//! struct's own serialization, not from a list), and fails for a field
//! that does not move the key.
//!
//! Digests are [`super::text_digest`] hex; texts kept for explanations
//! (`KeyInputs::contents`) are added by the graph beside, never keyed.

use super::{KeyInputs, NodeKind};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The plugins a candy's plan uses.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginInputs {
    /// Step word → the plugin's identity (`plugin:<word>`).
    pub ids: BTreeMap<String, String>,
    /// Task index → digest of the fragment the plugin emitted for it
    /// (`plugin-fragment:<task>`).
    pub fragments: BTreeMap<String, String>,
}

impl PluginInputs {
    fn write(self, k: &mut KeyInputs) {
        let PluginInputs { ids, fragments } = self;
        for (word, id) in ids {
            k.value(format!("plugin:{word}"), id);
        }
        for (task, d) in fragments {
            k.texts.insert(format!("plugin-fragment:{task}"), d);
        }
    }
}

/// One candy's Containerfile section for one box.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FragmentInputs {
    /// Digest of the candy's plan under the box's header (`plan`).
    pub plan: String,
    /// The emitter's revision (`emitter`).
    pub emitter: String,
    /// Plugins of the plan's external steps.
    pub plugins: PluginInputs,
    /// The box's user, `name:uid:gid:home` (`user`).
    pub user: String,
    /// The box's package formats, comma-joined (`formats`).
    pub formats: String,
    /// The box's distro tags, comma-joined (`tags`).
    pub tags: String,
    /// Whether the candy is the box's last (`last`).
    pub last: bool,
    /// `--dev-local-pkg` (`dev-local-pkg`).
    pub dev_local_pkg: bool,
    /// The candy's `var:` entries (`var:<name>`).
    pub vars: BTreeMap<String, String>,
    /// Vocabulary entries it renders with: `vocab:<kind>/<name>` → digest.
    pub vocab: BTreeMap<String, String>,
}

/// A box's assembled build directory.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContainerfileInputs {
    /// The box's resolved facts, field → text (`fact:<field>`).
    pub facts: BTreeMap<String, String>,
    /// The emitter's revision (`emitter`).
    pub emitter: String,
    /// Whether builder artifacts come prebuilt (`prebuilt-artifacts`).
    pub prebuilt_artifacts: bool,
    /// Vocabulary entries: `vocab:<kind>/<name>` → digest.
    pub vocab: BTreeMap<String, String>,
    /// The root image (the key's base).
    pub root_image: String,
    /// The parent box's image reference, for a box on a box (`base-ref`).
    pub base_ref: Option<String>,
    /// Builder → its image reference (`builder-ref:<builder>`).
    pub builder_refs: BTreeMap<String, String>,
    /// `--dev-local-pkg` (`dev-local-pkg`).
    pub dev_local_pkg: bool,
}

/// A builder stage (the builder image's key is chained in with the
/// dependencies' keys).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BuilderStageInputs {
    /// Digest of the builder's definition (`builder/<builder>`), when the
    /// vocabulary has one.
    pub definition: Option<String>,
    /// The account it runs as, `name:uid:gid:home` (`user`).
    pub user: String,
    /// The builder (`builder`).
    pub builder: String,
    /// The candy (`candy`).
    pub candy: String,
    /// The runner (`runner`).
    pub runner: String,
}

/// A local package.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalPkgInputs {
    /// Digest of the format's `local_pkg` definition
    /// (`format/<format>/local_pkg`), when the distro has one.
    pub recipe: Option<String>,
    /// The package format (`format`).
    pub format: String,
    /// The candy (`candy`).
    pub candy: String,
    /// The directory the candy's `localpkg:` names for the format
    /// (`localpkg`).
    pub localpkg: String,
    /// The runner (`runner`).
    pub runner: String,
    /// The distro tags it is built for, comma-joined (`distro`).
    pub distro: String,
    /// The image it is built in (`built-in`).
    pub built_in: String,
}

/// A root filesystem made by a bootstrap builder.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RootfsInputs {
    /// Digest of the distro definition (`distro`), when there is one.
    pub distro: Option<String>,
    /// The bootstrap builder (`builder`).
    pub builder: String,
    /// The distro tags, comma-joined (`tags`).
    pub tags: String,
    /// The runner (`runner`).
    pub runner: String,
    /// The architecture (`arch`).
    pub arch: String,
}

/// A box image (its layers come in as the top layer's key).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageInputs {
    /// The root image (the key's base).
    pub root_image: String,
    /// The image's tag (`tag`).
    pub tag: String,
    /// The runner (`runner`).
    pub runner: String,
    /// The architecture (`arch`).
    pub arch: String,
    /// Digest of the image's labels (`labels`).
    pub labels: String,
    /// The image's final user (`user`).
    pub user: String,
}

/// One layer of a box image.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerInputs {
    /// Its Containerfile text (`containerfile`, kept for explanations),
    /// `None` when it does not render.
    pub containerfile: Option<String>,
    /// Files it stages: path → digest (`file:<path>`).
    pub files: BTreeMap<String, String>,
    /// Why it does not render (`render-error`).
    pub render_error: Option<String>,
    /// Plugins of a candy layer's external steps.
    pub plugins: PluginInputs,
    /// The runner (`runner`).
    pub runner: String,
    /// The architecture (`arch`).
    pub arch: String,
}

/// A box's InstallPlan for a deploy target.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanInputs {
    /// Digest of the merged plan (`plan`).
    pub plan: String,
    /// The target (`target`).
    pub target: String,
}

/// An external base image.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BaseInputs {
    /// Its reference (the key's base).
    pub reference: String,
    /// The runner (`runner`).
    pub runner: String,
    /// The architecture (`arch`).
    pub arch: String,
}

/// Hashed files: a candy directory, a local package's source tree, a box
/// definition.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceInputs {
    /// Project-relative path → content digest.
    pub files: BTreeMap<String, String>,
}

/// A node's own key inputs (all but its dependencies' keys and the builder
/// image's), one variant per [`NodeKind`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OwnInputs {
    /// [`NodeKind::Source`].
    Source(SourceInputs),
    /// [`NodeKind::Fragment`].
    Fragment(FragmentInputs),
    /// [`NodeKind::BuilderStage`].
    BuilderStage(BuilderStageInputs),
    /// [`NodeKind::LocalPkg`].
    LocalPkg(LocalPkgInputs),
    /// [`NodeKind::Containerfile`].
    Containerfile(ContainerfileInputs),
    /// [`NodeKind::Rootfs`].
    Rootfs(RootfsInputs),
    /// [`NodeKind::Image`].
    Image(ImageInputs),
    /// [`NodeKind::Plan`].
    Plan(PlanInputs),
    /// [`NodeKind::Layer`].
    Layer(LayerInputs),
    /// [`NodeKind::Base`].
    Base(BaseInputs),
}

fn flag(b: bool) -> &'static str {
    if b { "true" } else { "false" }
}

impl OwnInputs {
    /// The kind of node these are the inputs of.
    pub fn kind(&self) -> NodeKind {
        match self {
            OwnInputs::Source(_) => NodeKind::Source,
            OwnInputs::Fragment(_) => NodeKind::Fragment,
            OwnInputs::BuilderStage(_) => NodeKind::BuilderStage,
            OwnInputs::LocalPkg(_) => NodeKind::LocalPkg,
            OwnInputs::Containerfile(_) => NodeKind::Containerfile,
            OwnInputs::Rootfs(_) => NodeKind::Rootfs,
            OwnInputs::Image(_) => NodeKind::Image,
            OwnInputs::Plan(_) => NodeKind::Plan,
            OwnInputs::Layer(_) => NodeKind::Layer,
            OwnInputs::Base(_) => NodeKind::Base,
        }
    }

    /// The key inputs they make: the kind, and every field under its name.
    pub fn into_key_inputs(self) -> KeyInputs {
        let mut k = KeyInputs::new(self.kind());
        self.write(&mut k);
        k
    }

    /// Writes every field into `k` under its name.
    pub fn write(self, k: &mut KeyInputs) {
        match self {
            OwnInputs::Source(own) => own.write(k),
            OwnInputs::Fragment(own) => own.write(k),
            OwnInputs::Containerfile(own) => own.write(k),
            OwnInputs::BuilderStage(own) => own.write(k),
            OwnInputs::LocalPkg(own) => own.write(k),
            OwnInputs::Rootfs(own) => own.write(k),
            OwnInputs::Image(own) => own.write(k),
            OwnInputs::Layer(own) => own.write(k),
            OwnInputs::Plan(own) => own.write(k),
            OwnInputs::Base(own) => own.write(k),
        }
    }
}

// How each kind's struct enters the key: destructured whole (no `..`), so
// a new field does not compile until it is written.

impl SourceInputs {
    fn write(self, k: &mut KeyInputs) {
        let SourceInputs { files } = self;
        k.files.extend(files);
    }
}

impl FragmentInputs {
    fn write(self, k: &mut KeyInputs) {
        let FragmentInputs {
            plan,
            emitter,
            plugins,
            user,
            formats,
            tags,
            last,
            dev_local_pkg,
            vars,
            vocab,
        } = self;
        k.texts.insert("plan".into(), plan);
        k.value("emitter", emitter);
        plugins.write(k);
        k.value("user", user);
        k.value("formats", formats);
        k.value("tags", tags);
        k.value("last", flag(last));
        k.value("dev-local-pkg", flag(dev_local_pkg));
        for (name, v) in vars {
            k.value(format!("var:{name}"), v);
        }
        k.texts.extend(vocab);
    }
}

impl ContainerfileInputs {
    fn write(self, k: &mut KeyInputs) {
        let ContainerfileInputs {
            facts,
            emitter,
            prebuilt_artifacts,
            vocab,
            root_image,
            base_ref,
            builder_refs,
            dev_local_pkg,
        } = self;
        for (field, text) in facts {
            k.value(format!("fact:{field}"), text);
        }
        k.value("emitter", emitter);
        k.value("prebuilt-artifacts", flag(prebuilt_artifacts));
        k.texts.extend(vocab);
        k.base = Some(root_image);
        if let Some(r) = base_ref {
            k.value("base-ref", r);
        }
        for (builder, r) in builder_refs {
            k.value(format!("builder-ref:{builder}"), r);
        }
        k.value("dev-local-pkg", flag(dev_local_pkg));
    }
}

impl BuilderStageInputs {
    fn write(self, k: &mut KeyInputs) {
        let BuilderStageInputs {
            definition,
            user,
            builder,
            candy,
            runner,
        } = self;
        if let Some(d) = definition {
            k.texts.insert(format!("builder/{builder}"), d);
        }
        k.value("user", user);
        k.value("builder", builder);
        k.value("candy", candy);
        k.value("runner", runner);
    }
}

impl LocalPkgInputs {
    fn write(self, k: &mut KeyInputs) {
        let LocalPkgInputs {
            recipe,
            format,
            candy,
            localpkg,
            runner,
            distro,
            built_in,
        } = self;
        if let Some(d) = recipe {
            k.texts.insert(format!("format/{format}/local_pkg"), d);
        }
        k.value("format", format);
        k.value("candy", candy);
        k.value("localpkg", localpkg);
        k.value("runner", runner);
        k.value("distro", distro);
        k.value("built-in", built_in);
    }
}

impl RootfsInputs {
    fn write(self, k: &mut KeyInputs) {
        let RootfsInputs {
            distro,
            builder,
            tags,
            runner,
            arch,
        } = self;
        if let Some(d) = distro {
            k.texts.insert("distro".into(), d);
        }
        k.value("builder", builder);
        // Recorded as a layer (the chain's first) since layers
        // are nodes.
        k.value("output", "layer");
        k.value("tags", tags);
        k.value("runner", runner);
        k.value("arch", arch);
    }
}

impl ImageInputs {
    fn write(self, k: &mut KeyInputs) {
        let ImageInputs {
            root_image,
            tag,
            runner,
            arch,
            labels,
            user,
        } = self;
        k.base = Some(root_image);
        k.value("tag", tag);
        k.value("runner", runner);
        k.value("arch", arch);
        k.texts.insert("labels".into(), labels);
        k.value("user", user);
    }
}

impl LayerInputs {
    fn write(self, k: &mut KeyInputs) {
        let LayerInputs {
            containerfile,
            files,
            render_error,
            plugins,
            runner,
            arch,
        } = self;
        if let Some(e) = render_error {
            k.value("render-error", e);
        }
        if let Some(t) = containerfile {
            k.text_with_content("containerfile", &t);
        }
        for (path, d) in files {
            k.texts.insert(format!("file:{path}"), d);
        }
        plugins.write(k);
        k.value("runner", runner);
        k.value("arch", arch);
    }
}

impl PlanInputs {
    fn write(self, k: &mut KeyInputs) {
        let PlanInputs { plan, target } = self;
        k.texts.insert("plan".into(), plan);
        k.value("target", target);
    }
}

impl BaseInputs {
    fn write(self, k: &mut KeyInputs) {
        let BaseInputs {
            reference,
            runner,
            arch,
        } = self;
        k.base = Some(reference);
        k.value("runner", runner);
        k.value("arch", arch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// One value of every kind, each field at its default.
    fn defaults() -> Vec<OwnInputs> {
        NodeKind::ALL
            .iter()
            .map(|kind| match kind {
                NodeKind::Source => OwnInputs::Source(Default::default()),
                NodeKind::Fragment => OwnInputs::Fragment(Default::default()),
                NodeKind::BuilderStage => OwnInputs::BuilderStage(Default::default()),
                NodeKind::LocalPkg => OwnInputs::LocalPkg(Default::default()),
                NodeKind::Containerfile => OwnInputs::Containerfile(Default::default()),
                NodeKind::Rootfs => OwnInputs::Rootfs(Default::default()),
                NodeKind::Image => OwnInputs::Image(Default::default()),
                NodeKind::Plan => OwnInputs::Plan(Default::default()),
                NodeKind::Layer => OwnInputs::Layer(Default::default()),
                NodeKind::Base => OwnInputs::Base(Default::default()),
            })
            .collect()
    }

    /// Every way to change `v` by one field: a text gets a character, a
    /// flag flips, an absent option gets a value, a map gets an entry (a
    /// struct refuses unknown members, so the entry only survives in maps),
    /// and the members of an object are changed the same way, recursively.
    /// Each change comes with the path of the field it changed.
    fn one_field_changes(v: &Value, path: &str, out: &mut Vec<(String, Value)>) {
        match v {
            Value::String(s) => out.push((path.into(), Value::String(format!("{s}x")))),
            Value::Bool(b) => out.push((path.into(), Value::Bool(!b))),
            Value::Null => out.push((path.into(), Value::String("x".into()))),
            Value::Number(n) => out.push((path.into(), (n.as_u64().unwrap_or(0) + 1).into())),
            Value::Array(items) => {
                let mut more = items.clone();
                more.push(Value::String("x".into()));
                out.push((path.into(), Value::Array(more)));
            }
            Value::Object(members) => {
                let mut more = members.clone();
                more.insert("added".into(), Value::String("x".into()));
                out.push((format!("{path}+entry"), Value::Object(more)));
                for (name, m) in members {
                    let mut changes = Vec::new();
                    one_field_changes(m, &format!("{path}.{name}"), &mut changes);
                    for (p, changed) in changes {
                        let mut whole = members.clone();
                        whole.insert(name.clone(), changed);
                        out.push((p, Value::Object(whole)));
                    }
                }
            }
        }
    }

    /// Every field of every kind moves the key: a field added to a struct
    /// but not written into the key fails here (the fields are found from
    /// the struct's serialization, and each must have been changed).
    #[test]
    fn every_field_moves_the_key() {
        let mut changed_fields = 0;
        for own in defaults() {
            let base = own.clone().into_key_inputs().key();
            let json = serde_json::to_value(&own).expect("serializes");
            let (variant, fields) = json
                .as_object()
                .and_then(|o| o.iter().next())
                .and_then(|(v, f)| Some((v.clone(), f.as_object()?.clone())))
                .expect("a variant holding a struct");
            let mut changes = Vec::new();
            one_field_changes(&json, "", &mut changes);
            let mut moved = std::collections::BTreeSet::new();
            for (path, changed) in changes {
                // Changes that are not values of the type (an entry added to
                // a struct, the variant's name) are refused, not keyed.
                let Ok(other) = serde_json::from_value::<OwnInputs>(changed) else {
                    continue;
                };
                assert_ne!(other, own, "{path}");
                assert_ne!(
                    other.clone().into_key_inputs().key(),
                    base,
                    "{variant}: changing {path} does not change the key"
                );
                moved.insert(path);
            }
            for field in fields.keys() {
                let prefix = format!(".{variant}.{field}");
                assert!(
                    moved.iter().any(|p| p.starts_with(&prefix)),
                    "{variant}: no change of `{field}` was tried: {moved:?}"
                );
                changed_fields += 1;
            }
        }
        assert!(changed_fields >= 50, "only {changed_fields} fields");
    }

    /// Two kinds with the same fields never share a key (the kind is keyed).
    #[test]
    fn the_kind_is_keyed() {
        let keys: std::collections::BTreeSet<String> = defaults()
            .iter()
            .map(|o| o.clone().into_key_inputs().key().to_hex())
            .collect();
        assert_eq!(keys.len(), NodeKind::ALL.len());
    }
}
