//! What enters each node's key: one function per kind of work.
//!
//! Dependencies' keys are added by `Builder::compute_keys`; these
//! functions add the rest: the node's own files, texts (digests of
//! templates, vocabulary entries and compiled plans, as canonical JSON) and
//! values. A box's resolved facts enter a build directory's key one named
//! value per fact (`fact:candies`, `fact:user`, …), so `explain` can say
//! which fact changed.

use super::{Builder, GraphError, Work, image_ref};
use crate::hash::FileHasher;
use crate::id::{LayerSlot, NodeId, SourceId};
use crate::key::{
    BaseInputs, BuilderStageInputs, ContainerfileInputs, FragmentInputs, ImageInputs, KeyInputs,
    LayerInputs, LocalPkgInputs, OwnInputs, PlanInputs, PluginInputs, RootfsInputs, SourceInputs,
    text_digest,
};
use charly_rules::emit::containerfile::fragment_is_last;
use charly_rules::load::{CandyEntry, Project};
use charly_rules::plan::{HostContext, InstallStep, Target, build_merged_plan, deploy_plan_header};
use charly_rules::resolve::{BaseRef, ResolvedBox, User, effective_distro};
use petgraph::stable_graph::NodeIndex;
use std::collections::BTreeMap;

impl Builder<'_> {
    /// Non-dependency inputs of a node; `steps_json`, for a fragment, is
    /// its steps' canonical JSON when the caller has it.
    pub(super) fn inputs_of(
        &self,
        i: NodeIndex,
        hasher: &FileHasher,
        steps_json: Option<&str>,
    ) -> Result<KeyInputs, GraphError> {
        let n = &self.graph.g[i];
        // Texts of staged files kept (not keyed) so `explain` can show the
        // lines of a written file that changed.
        let mut contents = BTreeMap::new();
        let bad = || GraphError::Canonical {
            what: format!("the key inputs of {}", n.id),
            message: "its work does not fit its id".into(),
        };
        let own = match (&n.nid, &n.work) {
            (NodeId::Source(_), _) => OwnInputs::Source(SourceInputs::default()),
            (NodeId::Fragment { box_name, candy }, Work::Fragment { index, steps }) => {
                OwnInputs::Fragment(
                    self.fragment_inputs(box_name, candy, *index, steps, steps_json)?,
                )
            }
            (NodeId::Containerfile { box_name, prebuilt }, _) => {
                OwnInputs::Containerfile(self.containerfile_inputs(box_name, *prebuilt)?)
            }
            (NodeId::BuilderStage { candy, builder, .. }, Work::BuilderStage { user, for_box }) => {
                OwnInputs::BuilderStage(self.builder_stage_inputs(candy, builder, user, for_box)?)
            }
            (NodeId::LocalPkg { candy, format, .. }, Work::LocalPkg { for_box }) => {
                OwnInputs::LocalPkg(self.local_pkg_inputs(candy, format, for_box)?)
            }
            (NodeId::Rootfs { box_name }, Work::Rootfs { builder }) => {
                OwnInputs::Rootfs(self.rootfs_inputs(box_name, builder)?)
            }
            (NodeId::Image { box_name }, _) => OwnInputs::Image(self.image_inputs(box_name)?),
            (NodeId::Plan { box_name, target }, _) => {
                OwnInputs::Plan(self.plan_inputs(box_name, *target)?)
            }
            (NodeId::Layer { box_name, slot }, Work::Layer { steps, .. }) => OwnInputs::Layer(
                self.layer_inputs(box_name, slot, steps.as_ref(), hasher, &mut contents)?,
            ),
            (NodeId::Base { reference }, _) => OwnInputs::Base(BaseInputs {
                reference: reference.clone(),
                runner: self.opts.runner.clone(),
                arch: self.opts.arch.clone(),
            }),
            _ => return Err(bad()),
        };
        debug_assert_eq!(own.kind(), n.kind);
        let mut k = own.into_key_inputs();
        k.contents.extend(contents);
        Ok(k)
    }

    /// One candy's fragment: its compiled plan, the box's user, formats and
    /// tags, its position, its variables and the vocabulary it renders with.
    fn fragment_inputs(
        &self,
        box_name: &str,
        candy: &str,
        index: usize,
        steps: &super::FragmentSteps,
        steps_json: Option<&str>,
    ) -> Result<FragmentInputs, GraphError> {
        let b = self.rbox(box_name)?;
        let steps = steps.get(self.p, b, candy)?;
        let steps = steps.as_slice();
        // The plan as `build_deploy_plan` gives it for this box: the
        // shared steps under this box's header.
        let host = HostContext::default();
        let header = deploy_plan_header(b, candy, &host);
        let plan = match steps_json {
            Some(json) => plan_json(&header, json)?,
            None => canonical(
                "the candy's plan",
                &charly_rules::plan::DeployPlanRef { steps, ..header },
            )?,
        };
        let c = &self.p.candies[candy];
        Ok(FragmentInputs {
            plan: text_digest(&plan),
            emitter: charly_rules::emit::REVISION.to_string(),
            plugins: plugin_inputs(steps, &self.opts.plugins),
            user: user_value(&b.user),
            formats: b.formats.join(","),
            tags: b.tags.join(","),
            last: fragment_is_last(self.p, b, index),
            dev_local_pkg: self.opts.dev_local_pkg,
            vars: c
                .def
                .var
                .iter()
                .map(|(name, v)| (name.value.clone(), v.value.clone()))
                .collect(),
            vocab: vocab_texts(self.p, b, Some(c), &self.vocab_digests)?,
        })
    }

    /// A box's build directory: its facts, base, builder images and vocabulary.
    fn containerfile_inputs(
        &self,
        box_name: &str,
        prebuilt: bool,
    ) -> Result<ContainerfileInputs, GraphError> {
        let b = self.rbox(box_name)?;
        Ok(ContainerfileInputs {
            facts: box_facts(b)?,
            emitter: charly_rules::emit::REVISION.to_string(),
            prebuilt_artifacts: prebuilt,
            vocab: vocab_texts(self.p, b, None, &self.vocab_digests)?,
            root_image: b.root_image.clone(),
            base_ref: match &b.base {
                BaseRef::Box(parent) => Some(image_ref(self.r, parent)),
                _ => None,
            },
            builder_refs: b
                .builders
                .iter()
                .filter_map(|u| Some((u.builder.clone(), image_ref(self.r, u.image.as_ref()?))))
                .collect(),
            dev_local_pkg: self.opts.dev_local_pkg,
        })
    }

    /// A builder stage: the builder's definition, the account, the candy,
    /// the runner (the builder image's key, another node's, is set where
    /// keys are chained: `Builder::compute_keys`).
    fn builder_stage_inputs(
        &self,
        candy: &str,
        builder: &str,
        user: &User,
        for_box: &str,
    ) -> Result<BuilderStageInputs, GraphError> {
        let b = self.rbox(for_box)?;
        let vocab = &self.p.ns(b.ns).vocab;
        Ok(BuilderStageInputs {
            definition: vocab
                .builder
                .get(builder)
                .map(|def| canonical("the builder definition", def).map(|t| text_digest(&t)))
                .transpose()?,
            user: user_value(user),
            builder: builder.to_string(),
            candy: candy.to_string(),
            runner: self.opts.runner.clone(),
        })
    }

    /// A local package: its recipe (the format's `local_pkg` definition and
    /// the candy's `localpkg:` entry; its source files come in as a
    /// dependency, the rest of the candy does not enter), the runner, the
    /// distro it is built for and the image it is built in.
    fn local_pkg_inputs(
        &self,
        candy: &str,
        format: &str,
        for_box: &str,
    ) -> Result<LocalPkgInputs, GraphError> {
        let b = self.rbox(for_box)?;
        let vocab = &self.p.ns(b.ns).vocab;
        let recipe = b
            .distro_def
            .as_deref()
            .and_then(|d| effective_distro(vocab, d))
            .and_then(|d| {
                let f = d.format.get(format)?;
                Some(canonical("the format's local_pkg", &f.local_pkg))
            })
            .transpose()?
            .map(|t| text_digest(&t));
        // The candy's part of the recipe: which directory it names for the
        // format (its files are the source node's).
        let entry = self.p.candies[candy].def.localpkg.as_ref().and_then(|m| {
            m.value
                .0
                .iter()
                .find(|(f, _)| f.value == format)
                .map(|(_, dir)| dir.value.clone())
        });
        Ok(LocalPkgInputs {
            recipe,
            format: format.to_string(),
            candy: candy.to_string(),
            localpkg: entry.unwrap_or_default(),
            runner: self.opts.runner.clone(),
            distro: b.tags.join(","),
            // The image it is built in (its identity's last part).
            built_in: super::local_pkg_image(b).to_string(),
        })
    }

    /// A root filesystem: the distro definition, the bootstrap builder, the
    /// runner and the architecture.
    fn rootfs_inputs(&self, box_name: &str, builder: &str) -> Result<RootfsInputs, GraphError> {
        let b = self.rbox(box_name)?;
        let vocab = &self.p.ns(b.ns).vocab;
        let distro = match b
            .distro_def
            .as_deref()
            .and_then(|d| effective_distro(vocab, d))
        {
            Some(d) => Some(text_digest(&canonical("the distro definition", &d)?)),
            None => None,
        };
        Ok(RootfsInputs {
            distro,
            builder: builder.to_string(),
            tags: b.tags.join(","),
            runner: self.opts.runner.clone(),
            arch: self.opts.arch.clone(),
        })
    }

    /// An image: its tag, labels, final user, runner and architecture
    /// (its layers come in as the top layer's key).
    fn image_inputs(&self, box_name: &str) -> Result<ImageInputs, GraphError> {
        let b = self.rbox(box_name)?;
        let facts = charly_rules::emit::containerfile::image_facts(self.p, b, self.emit());
        Ok(ImageInputs {
            root_image: b.root_image.clone(),
            tag: image_ref(self.r, box_name),
            runner: self.opts.runner.clone(),
            arch: self.opts.arch.clone(),
            labels: text_digest(&canonical("the image labels", &facts.labels)?),
            user: facts.user.unwrap_or_default(),
        })
    }

    /// A layer: its Containerfile text and the files it stages (the
    /// candy's directory, builder artifacts, local packages and the root
    /// filesystem come in as dependencies), the runner and architecture.
    /// Small written files' texts go to `contents`, for explanations.
    fn layer_inputs(
        &self,
        box_name: &str,
        slot: &LayerSlot,
        steps: Option<&super::OciSteps>,
        hasher: &FileHasher,
        contents: &mut BTreeMap<String, String>,
    ) -> Result<LayerInputs, GraphError> {
        let b = self.rbox(box_name)?;
        let mut own = LayerInputs {
            runner: self.opts.runner.clone(),
            arch: self.opts.arch.clone(),
            ..LayerInputs::default()
        };
        // A layer that does not render (a local package without
        // --dev-local-pkg…) still gets a key: `graph` and `explain` work,
        // and the node fails with the same message when it runs.
        match super::layers::render(self.p, b, slot, steps, self.emit()) {
            Ok(Some(t)) => {
                for (path, staged) in &t.files {
                    let d = match staged {
                        charly_rules::emit::Staged::Bytes(bytes) => {
                            if bytes.len() <= crate::key::CONTENT_MAX
                                && let Ok(text) = std::str::from_utf8(bytes)
                            {
                                contents.insert(format!("file:{path}"), text.to_string());
                            }
                            blake3::hash(bytes).to_hex().to_string()
                        }
                        charly_rules::emit::Staged::CopyOf(src) => {
                            hasher.digest(src).map_err(|source| GraphError::Io {
                                path: src.display().to_string(),
                                source,
                            })?
                        }
                    };
                    own.files.insert(path.clone(), d);
                }
                own.containerfile = Some(t.containerfile);
            }
            Ok(None) => {}
            Err(e) => own.render_error = Some(e.to_string()),
        }
        if let Some(steps) = steps {
            own.plugins = plugin_inputs(steps, &self.opts.plugins);
        }
        Ok(own)
    }

    /// A deploy plan: the merged plan for the target.
    fn plan_inputs(&self, box_name: &str, target: Target) -> Result<PlanInputs, GraphError> {
        let b = self.rbox(box_name)?;
        let plan = build_merged_plan(
            self.p,
            b,
            &HostContext {
                target,
                ..HostContext::default()
            },
            &[],
        )?;
        Ok(PlanInputs {
            plan: text_digest(&canonical("the merged plan", &plan)?),
            target: target.as_str().to_string(),
        })
    }
}

/// The plugins a candy's plan uses: each one's identity, and the fragment
/// it emitted for each of the candy's tasks (a new plugin build, or a new
/// answer, rebuilds what uses it; `explain` names the word).
fn plugin_inputs(steps: &[InstallStep], pb: &super::PluginBuild) -> PluginInputs {
    let mut own = PluginInputs::default();
    for s in steps {
        let charly_rules::plan::StepData::External(e) = &s.data else {
            continue;
        };
        let word = e.data["word"].as_str().unwrap_or_default();
        let id = pb.ids.get(word).map_or("not found", String::as_str);
        own.ids.insert(word.to_string(), id.to_string());
        if let Some(t) = e.data["task"].as_u64()
            && let Some(f) = pb.fragments.get(&(s.candy.clone(), t as usize))
        {
            own.fragments.insert(t.to_string(), text_digest(f));
        }
    }
    own
}

/// A user as it enters keys: `name:uid:gid:home`.
fn user_value(u: &User) -> String {
    format!("{}:{}:{}:{}", u.name, u.uid, u.gid, u.home)
}

/// A box's resolved facts, one value per fact: `fact:<field>` → the
/// field's text (strings as they are, everything else as canonical JSON).
fn box_facts(b: &ResolvedBox) -> Result<BTreeMap<String, String>, GraphError> {
    let value = serde_json::to_value(b).map_err(|e| GraphError::Canonical {
        what: format!("the facts of box {}", b.name),
        message: e.to_string(),
    })?;
    let serde_json::Value::Object(fields) = value else {
        return Err(GraphError::Canonical {
            what: format!("the facts of box {}", b.name),
            message: "not a map of fields".into(),
        });
    };
    Ok(fields
        .into_iter()
        .map(|(field, v)| {
            let text = match v {
                serde_json::Value::String(s) => s,
                other => other.to_string(),
            };
            (field, text)
        })
        .collect())
}

/// Digests of vocabulary entries' canonical texts by namespace and entry
/// name: every fragment of every box names the same few entries, each is
/// encoded and digested once per graph.
pub(super) type VocabDigests = std::sync::Mutex<std::collections::HashMap<String, String>>;

/// Adds the text `name` (a vocabulary entry of namespace `ns`) by its
/// digest, encoding it with `text` only the first time (`None`: no entry).
fn cached_text(
    k: &mut BTreeMap<String, String>,
    digests: &VocabDigests,
    ns: usize,
    name: String,
    text: impl FnOnce() -> Result<Option<String>, GraphError>,
) -> Result<(), GraphError> {
    let id = format!("{ns}\0{name}");
    if let Some(d) = digests.lock().unwrap_or_else(|e| e.into_inner()).get(&id) {
        k.insert(name, d.clone());
        return Ok(());
    }
    if let Some(text) = text()? {
        let d = crate::key::text_digest(&text);
        digests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, d.clone());
        k.insert(name, d);
    }
    Ok(())
}

/// Vocabulary entries a box (or one of its candies) renders with.
fn vocab_texts(
    p: &Project,
    b: &ResolvedBox,
    candy: Option<&CandyEntry>,
    digests: &VocabDigests,
) -> Result<BTreeMap<String, String>, GraphError> {
    let mut texts = BTreeMap::new();
    let k = &mut texts;
    let vocab = &p.ns(b.ns).vocab;
    if let Some(name) = b.distro_def.as_deref() {
        cached_text(k, digests, b.ns.0, format!("vocab:distro/{name}"), || {
            effective_distro(vocab, name)
                .map(|d| canonical("the distro definition", &d))
                .transpose()
        })?;
    }
    for u in &b.builders {
        if candy.is_none_or(|c| u.candies.contains(&c.key))
            && let Some(def) = vocab.builder.get(&u.builder)
        {
            cached_text(
                k,
                digests,
                b.ns.0,
                format!("vocab:builder/{}", u.builder),
                || canonical("the builder definition", def).map(Some),
            )?;
        }
    }
    let services = match candy {
        Some(c) => !c.def.service.is_empty(),
        None => b
            .candies
            .iter()
            .any(|c| !p.candies[c].def.service.is_empty()),
    };
    if services {
        for (name, init) in &vocab.init {
            cached_text(k, digests, b.ns.0, format!("vocab:init/{name}"), || {
                canonical("the init definition", init).map(Some)
            })?;
        }
    }
    Ok(texts)
}

/// Canonical JSON of a key input: compact, every object's members (struct
/// fields and map entries alike) sorted by name, as `serde_json` writes a
/// `Value` (its map is ordered). `what` names the input if it cannot be
/// encoded (never hashed as "").
pub fn canonical<T: serde::Serialize + ?Sized>(what: &str, v: &T) -> Result<String, GraphError> {
    crate::canon::to_string(v).map_err(|e| GraphError::Canonical {
        what: what.to_string(),
        message: e.to_string(),
    })
}

/// Where shared steps are: fragments whose steps are at the same place
/// share them (while the graph holds them no other steps can be there).
pub(super) fn steps_addr(steps: &[InstallStep]) -> (usize, usize) {
    (steps.as_ptr() as usize, steps.len())
}

/// The canonical JSON of a candy's plan, `header` with the steps whose
/// canonical JSON is `steps_json` in it: byte for byte [`canonical`] of the
/// whole plan, the steps spliced in where they go, so boxes that share a
/// candy's steps serialize them once.
fn plan_json(
    header: &charly_rules::plan::DeployPlanRef<'_>,
    steps_json: &str,
) -> Result<String, GraphError> {
    crate::canon::to_string_with(header, "steps", steps_json).map_err(|e| GraphError::Canonical {
        what: "the candy's plan".to_string(),
        message: e.to_string(),
    })
}

/// Key inputs of a source node.
pub(super) fn source_inputs(
    p: &Project,
    id: &SourceId,
    hasher: &FileHasher,
) -> Result<KeyInputs, GraphError> {
    let mut own = SourceInputs::default();
    let files = &mut own.files;
    match id {
        SourceId::Candy(candy) => source_candy(p, &p.candies[candy], hasher, files)?,
        SourceId::LocalPkg { candy, format } => source_localpkg(p, candy, format, hasher, files)?,
        SourceId::Box(name) => source_box(p, name, files),
    }
    Ok(OwnInputs::Source(own).into_key_inputs())
}

/// A candy directory: every file, the definition without its checks.
fn source_candy(
    p: &Project,
    c: &CandyEntry,
    hasher: &FileHasher,
    k: &mut BTreeMap<String, String>,
) -> Result<(), GraphError> {
    let prefix = charly_rules::naming::candy_key_dir(c);
    let def_file = p.sources.get(c.file);
    for f in &c.files {
        let path = c.dir.join(f);
        // The definition file is keyed without its checks (already in
        // memory; checks are not build inputs).
        let d = match def_file.filter(|s| s.path == path) {
            Some(src) => charly_rules::check::candy_definition_digest(&src.text, c),
            None => hasher.digest(&path).map_err(|source| GraphError::Io {
                path: format!("{prefix}/{f}"),
                source,
            })?,
        };
        k.insert(format!("{prefix}/{f}"), d);
    }
    Ok(())
}

/// The source tree of a candy's local package.
fn source_localpkg(
    p: &Project,
    candy: &str,
    fmt: &str,
    hasher: &FileHasher,
    k: &mut BTreeMap<String, String>,
) -> Result<(), GraphError> {
    if let Some((dir, files)) = p
        .candies
        .get(candy)
        .and_then(|c| c.localpkg_sources.get(fmt))
    {
        let prefix = charly_rules::load::relative(dir, &p.root);
        for f in files {
            let d = hasher
                .digest(&dir.join(f))
                .map_err(|source| GraphError::Io {
                    path: format!("{prefix}/{f}"),
                    source,
                })?;
            k.insert(format!("{prefix}/{f}"), d);
        }
    }
    Ok(())
}

/// A box's definition, without its checks.
fn source_box(p: &Project, name: &str, k: &mut BTreeMap<String, String>) {
    // Look the box up by its namespace prefix and short name (a scan of
    // every box here made the graph quadratic in the number of boxes).
    for n in &p.namespaces {
        let short = if n.path.is_empty() {
            Some(name)
        } else {
            name.strip_prefix(n.path.as_str())
                .and_then(|s| s.strip_prefix('.'))
        };
        if let Some(b) = short.and_then(|s| n.boxes.get(s))
            && n.qualify(&b.name) == name
            && let Some(src) = p.sources.get(b.file)
        {
            k.insert(
                src.rel.clone(),
                charly_rules::check::box_definition_digest(&src.text, b),
            );
        }
    }
}
