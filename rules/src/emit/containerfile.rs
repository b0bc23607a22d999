//! The OCI target: a box rendered as a build directory `.build/<box>/`
//! holding a `Containerfile` and every staged context file it references.
//!
//! The emitter reads the box's InstallPlans (target `oci`, home resolved) and
//! the vocabulary's templates. Structure, in order: header; `ARG BASE_IMAGE`;
//! one scratch stage per candy carrying its directory; builder stages; init
//! stages; `FROM ${BASE_IMAGE}`; bootstrap (user creation for an external
//! base, `USER root` for a parent box); `ENV`/`PATH`; `EXPOSE`; builder
//! artifacts; data; then per candy (`# candy: <name>`): vars, packages,
//! AUR, local package, tasks with `USER` switching, inline builders, shell
//! snippets; init assembly; the runtime `USER`; and all `LABEL`s last, so a
//! label edit never invalidates an earlier layer.
//!
//! **No heredocs.** Podman/buildah before 1.33 (Debian 12 ships 1.28) cannot
//! parse `RUN <<EOF`. Command bodies, written files and shell snippets are
//! staged under `.build/<box>/_inline/<candy>/<sha256>` instead: command
//! scripts are bind-mounted into their RUN, files are COPYed. The
//! content-addressed name puts the content into the instruction text, so
//! builder layer caches invalidate exactly when the content changes, and no
//! content can collide with a heredoc marker.
//!
//! **No injected instructions.** Every value lands in the Containerfile one
//! of three ways, so no value of the YAML can start an instruction of its
//! own: identifiers and single tokens (names, paths, users, modes, URLs,
//! package names, keys) are checked at load by [`crate::names`] (no
//! whitespace, no control character, no Unicode line break, no backslash);
//! `ENV`/`LABEL` values are double-quoted with every control character and
//! line break escaped (`dq`), JSON labels are single-quoted JSON (which
//! escapes them itself); multi-line text (`cmd:`, `content:`, shell snippets)
//! is staged as a file, never written inline; comments have control
//! characters replaced by spaces. A line continuation is never produced from
//! a value: a token cannot end with `\`.
//!
//! Output is deterministic: no timestamps, no absolute paths, sorted maps.

use crate::cascade;
use crate::home::expand_home;
use crate::ir::{FileStep, InstallPlan, InstallStep, OpStep, StepData};
use crate::model::vocab::CacheMount;
use crate::model::{Distro, Format, Vocab};
use crate::naming::stage_name;
use crate::project::{CandyEntry, Project};
use crate::resolve::{BaseRef, ResolvedBox, effective_distro};
use crate::sh;
use crate::source::relative;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::PathBuf;

/// A file the Containerfile needs in the build context.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Staged {
    /// Generated content.
    Bytes(Vec<u8>),
    /// A copy of a file outside the context (absolute source path).
    CopyOf(PathBuf),
}

/// A rendered build directory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BuildDir {
    /// The box.
    pub box_name: String,
    /// `.build/<box>` (project-relative).
    pub dir: String,
    /// The Containerfile text.
    pub containerfile: String,
    /// Context files by project-relative path (all under `.build/`).
    pub files: BTreeMap<String, Staged>,
    /// Candy stages that point outside the project (`.build/_layers/<n>` → source dir).
    pub layers: BTreeMap<String, PathBuf>,
}

/// Options for the emitter.
#[derive(Clone, Debug, Default)]
pub struct EmitOptions {
    /// Build local packages from local source and COPY them in.
    pub dev_local_pkg: bool,
    /// Image reference of each box by qualified name (parents and builder
    /// boxes); missing ones default to `localhost/<name>:<version>`.
    pub image_refs: BTreeMap<String, String>,
    /// Builder stages already built: stage name → context path of a tar of
    /// its artifact (the stage is then not rendered; the tar is ADDed).
    pub artifacts: BTreeMap<String, String>,
    /// Extra labels (e.g. the node key), sorted.
    pub labels: BTreeMap<String, String>,
    /// The context directory staged files are written under, instead of
    /// the box's `.build/<box>` (layers use [`LAYER_DIR`], so their text
    /// does not name the box and sibling boxes share them).
    pub dir: Option<String>,
    /// What plugins answered `emit` for their build steps: `(candy key,
    /// task index)` → Containerfile fragment, spliced where the task is.
    pub plugin_fragments: BTreeMap<(String, usize), String>,
    /// Plugin words whose plugin said it emits nothing at build (a
    /// deploy-only step kind): their steps are left out of images.
    pub deploy_only_plugins: std::collections::BTreeSet<String>,
}

/// Whether a plugin's fragment can be spliced into a stage: instructions
/// only, no `FROM` (a new stage would cut the image in two), no line
/// breaks other than `\n`, not empty.
pub fn check_fragment(f: &str) -> Result<(), String> {
    if f.trim().is_empty() {
        return Err("is empty".into());
    }
    if f.contains(['\r', '\0']) || f.chars().any(|c| c != '\n' && c != '\t' && c.is_control()) {
        return Err("has control characters".into());
    }
    let mut continued = false;
    let mut heredoc: Option<String> = None;
    for l in f.lines() {
        if let Some(end) = &heredoc {
            if l.trim() == end {
                heredoc = None;
            }
            continue;
        }
        let t = l.trim_start();
        heredoc = heredoc_end(t);
        if !continued && !t.is_empty() && !t.starts_with('#') {
            let word = t.split_whitespace().next().unwrap_or("");
            if word.eq_ignore_ascii_case("FROM") {
                return Err("starts a new stage (`FROM`)".into());
            }
            if !INSTRUCTIONS.iter().any(|i| word.eq_ignore_ascii_case(i)) {
                return Err(format!("has a line that is not an instruction: `{l}`"));
            }
        }
        continued = l.trim_end().ends_with('\\');
    }
    match heredoc {
        Some(end) => Err(format!("leaves a here-document open (no `{end}` line)")),
        None => Ok(()),
    }
}

/// The instructions a fragment may use (every one but `FROM`).
const INSTRUCTIONS: [&str; 17] = [
    "ADD",
    "ARG",
    "CMD",
    "COPY",
    "ENTRYPOINT",
    "ENV",
    "EXPOSE",
    "HEALTHCHECK",
    "LABEL",
    "MAINTAINER",
    "ONBUILD",
    "RUN",
    "SHELL",
    "STOPSIGNAL",
    "USER",
    "VOLUME",
    "WORKDIR",
];

/// The terminator of a here-document a line opens (`<<EOF`, `<<-"EOF"`).
pub(super) fn heredoc_end(line: &str) -> Option<String> {
    let at = line.find("<<")?;
    let rest = line[at + 2..].trim_start_matches('-');
    let rest = rest.trim_start_matches(['"', '\'']);
    let word: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    (!word.is_empty()).then_some(word)
}

/// The context directory of layer builds (see [`layer_containerfile`]).
pub const LAYER_DIR: &str = ".build/_layer";

/// A rendering problem (template failures, missing local sources).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("box `{box_name}`: {message}")]
pub struct EmitError {
    /// The box.
    pub box_name: String,
    /// What failed.
    pub message: String,
}

/// The default image reference of a box (kept under its old name; see
/// [`crate::naming::image_ref`]).
pub use crate::naming::image_ref as default_image_ref;

/// `.build/<box>` for a qualified box name (kept under its old name; see
/// [`crate::naming::build_dir`]).
pub use crate::naming::build_dir as build_dir_of;

fn sha256_hex(bytes: &[u8]) -> String {
    crate::hex(&Sha256::digest(bytes))
}

/// The user directive of a task user and its `--chown` value.
pub fn user_directive(raw: &str, uid: u32, gid: u32, name: &str) -> (String, Option<String>) {
    let raw = raw
        .replace("${UID}", &uid.to_string())
        .replace("${GID}", &gid.to_string());
    match raw.as_str() {
        "" | "root" | "0" | "0:0" => ("0".into(), None),
        "${USER}" => (uid.to_string(), Some(format!("{uid}:{gid}"))),
        r if r == name => (uid.to_string(), Some(format!("{uid}:{gid}"))),
        r if r.contains(':') => (r.to_string(), Some(r.to_string())),
        r if r.bytes().all(|b| b.is_ascii_digit()) => (r.to_string(), Some(format!("{r}:{r}"))),
        r => (r.to_string(), Some(format!("{r}:{r}"))),
    }
}

/// `cacheMounts` semantics for a list (shared, `sharing=locked` default).
fn cache_mounts(list: &[CacheMount]) -> Vec<String> {
    list.iter()
        .map(|m| {
            format!(
                "--mount=type=cache,id=charly-{},dst={},sharing={}",
                safe_id(&m.dst),
                m.dst,
                m.sharing.as_deref().unwrap_or("locked")
            )
        })
        .collect()
}

fn owned_mount(dst: &str, uid: u32, gid: u32) -> String {
    format!(
        "--mount=type=cache,id=charly-{}-uid{uid},dst={dst},uid={uid},gid={gid}",
        safe_id(dst)
    )
}

fn safe_id(dst: &str) -> String {
    dst.trim_start_matches('/').replace('/', "-")
}

/// Go `%q`-style quoting for ENV/LABEL values: `\` and `"` escaped, and
/// every control character or Unicode line break written as an escape
/// (`\n`, `\r`, `\x01`, `\u2028`), so a value never ends its line.
fn dq(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for ch in s.chars() {
        match ch {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x80 && c.is_control() => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if crate::names::is_line_break_like(c) => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Text for a `# …` comment line: control characters and Unicode line
/// breaks become spaces, so a comment is always one line.
fn comment_text(s: &str) -> String {
    s.chars()
        .map(|c| {
            if crate::names::is_line_break_like(c) {
                ' '
            } else {
                c
            }
        })
        .collect()
}

/// One candy's section of a box's Containerfile, with the files it stages.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fragment {
    /// The candy.
    pub candy: String,
    /// Containerfile text (ends with a blank line).
    pub text: String,
    /// Staged context files by project-relative path.
    pub files: BTreeMap<String, Vec<u8>>,
}

/// Whether the candy at `index` is the last thing in the box that may run
/// as a non-root user (its trailing `USER root` is then omitted).
pub fn fragment_is_last(p: &Project, b: &ResolvedBox, index: usize) -> bool {
    index + 1 == b.candies.len() && !needs_init(p, b)
}

fn needs_init(p: &Project, b: &ResolvedBox) -> bool {
    b.candies.iter().any(|k| {
        p.candies[k]
            .def
            .service
            .iter()
            .any(|s| s.exec.is_some() && s.applies_to(&b.tags))
    })
}

fn emitter<'a>(p: &'a Project, b: &'a ResolvedBox, opts: &'a EmitOptions) -> Emitter<'a> {
    let vocab = &p.ns(b.ns).vocab;
    let distro = b
        .distro_def
        .as_deref()
        .and_then(|d| effective_distro(vocab, d));
    Emitter {
        p,
        b,
        vocab,
        distro,
        opts,
        out: String::new(),
        dir: opts
            .dir
            .clone()
            .unwrap_or_else(|| crate::naming::build_dir(&b.name)),
        files: BTreeMap::new(),
        layers: BTreeMap::new(),
        origins: Vec::new(),
    }
}

/// Renders one candy's section from its plan (target `oci`, home resolved).
pub fn render_fragment(
    p: &Project,
    b: &ResolvedBox,
    plan: &InstallPlan,
    is_last: bool,
    opts: &EmitOptions,
) -> Result<Fragment, EmitError> {
    let key = plan.candy.as_deref().unwrap_or_default();
    render_candy_fragment(p, b, key, &plan.steps, is_last, opts)
}

/// Renders candy `key`'s section from its plan's steps (target `oci`, home
/// resolved): [`render_fragment`] of a plan with that candy and steps.
pub fn render_candy_fragment(
    p: &Project,
    b: &ResolvedBox,
    key: &str,
    steps: &[InstallStep],
    is_last: bool,
    opts: &EmitOptions,
) -> Result<Fragment, EmitError> {
    let mut e = emitter(p, b, opts);
    e.candy_section(key, steps, is_last)?;
    super::cache_lock::one_lock_per_run(&mut e.out);
    let files = e
        .files
        .into_iter()
        .filter_map(|(k, v)| match v {
            Staged::Bytes(b) => Some((k, b)),
            Staged::CopyOf(_) => None,
        })
        .collect();
    Ok(Fragment {
        candy: key.to_string(),
        text: e.out,
        files,
    })
}

/// Renders a box. `plans` are the box's per-candy plans for target `oci`
/// with the home resolved.
pub fn render_box(
    p: &Project,
    b: &ResolvedBox,
    plans: &[InstallPlan],
    opts: &EmitOptions,
) -> Result<BuildDir, EmitError> {
    let fragments = plans
        .iter()
        .enumerate()
        .map(|(i, plan)| render_fragment(p, b, plan, fragment_is_last(p, b, i), opts))
        .collect::<Result<Vec<_>, _>>()?;
    assemble(p, b, &fragments, opts)
}

/// Assembles a box's build directory around its rendered candy fragments.
pub fn assemble(
    p: &Project,
    b: &ResolvedBox,
    fragments: &[Fragment],
    opts: &EmitOptions,
) -> Result<BuildDir, EmitError> {
    let mut e = emitter(p, b, opts);
    e.render(fragments)?;
    super::cache_lock::one_lock_per_run(&mut e.out);
    Ok(BuildDir {
        box_name: b.name.clone(),
        dir: e.dir,
        containerfile: e.out,
        files: e.files,
        layers: e.layers,
    })
}

/// One part of a box's layer chain (see [`layer_containerfile`]).
#[derive(Clone, Copy, Debug)]
pub enum LayerPart<'a> {
    /// The box's own setup on an external or bootstrapped base: the
    /// distro's bootstrap packages, the box user and its home as WORKDIR.
    Setup,
    /// One candy: its environment, ports, builder artifacts, data and
    /// fragment (always rendered as if a candy followed: the box's final
    /// user is image configuration, not part of any layer).
    Candy {
        /// The candy key.
        key: &'a str,
        /// Its plan's steps (target `oci`, home resolved).
        steps: &'a [InstallStep],
    },
    /// The init system's configuration, assembled from the box's services.
    Init,
}

/// What one layer build needs: a Containerfile whose `FROM ${PARENT}` is
/// the image below it (`scratch` under a bootstrapped root filesystem) and
/// the context it reads. Staged paths are under [`LAYER_DIR`] and nothing
/// in the text names the box, so two boxes that render the same layer on
/// the same parent share it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LayerText {
    /// The Containerfile.
    pub containerfile: String,
    /// Staged context files by context path.
    pub files: BTreeMap<String, Staged>,
    /// Candy directories the text COPYs: context path → source directory.
    pub dirs: BTreeMap<String, PathBuf>,
    /// What wrote each part of the text: `(byte offset, origin)`, sorted;
    /// an origin covers the text up to the next one. Not part of any key.
    pub origins: Vec<(usize, Origin)>,
}

impl LayerText {
    /// The origin of the text at byte `offset`.
    pub fn origin_at(&self, offset: usize) -> Option<&Origin> {
        let i = self.origins.partition_point(|(o, _)| *o <= offset);
        i.checked_sub(1).map(|i| &self.origins[i].1)
    }
}

/// What part of a candy wrote a stretch of Containerfile text (for errors
/// that point at the candy file, the `origin` module).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The candy's environment, ports, artifacts and data.
    Setup(String),
    /// Its packages.
    Packages(String),
    /// Its local packages.
    LocalPkg(String),
    /// Task number `.1` (0-based) of candy `.0`.
    Task(String, usize),
    /// Its builders (inline builder stages, aur).
    Builder(String),
    /// Its shell snippets.
    Shell(String),
}

/// The build arg naming a layer's parent image.
pub const LAYER_PARENT_ARG: &str = "PARENT";

/// Renders one layer of a box; `None` when the part is empty for this box
/// (no setup on a box base, no init configuration without exec services).
/// `opts.dir` is set to [`LAYER_DIR`] here; `opts.artifacts` should name
/// prebuilt builder artifacts under it.
pub fn layer_containerfile(
    p: &Project,
    b: &ResolvedBox,
    part: LayerPart<'_>,
    opts: &EmitOptions,
) -> Result<Option<LayerText>, EmitError> {
    let opts = EmitOptions {
        dir: Some(LAYER_DIR.to_string()),
        labels: BTreeMap::new(),
        ..opts.clone()
    };
    let mut e = emitter(p, b, &opts);
    let mut dirs = BTreeMap::new();
    match part {
        LayerPart::Setup => {
            if matches!(b.base, BaseRef::Box(_)) {
                return Ok(None);
            }
            e.line("# layer: box setup (generated by charly -- do not edit)");
            e.line(&format!("ARG {LAYER_PARENT_ARG}=scratch"));
            e.line(&format!("FROM ${{{LAYER_PARENT_ARG}}}"));
            e.bootstrap()?;
        }
        LayerPart::Candy { key, steps } => {
            let c = e.candy(key);
            let short = c.name.clone();
            let src = match &c.rel_dir {
                Some(r) => r.clone(),
                None => crate::naming::layer_dir(&c.name),
            };
            dirs.insert(src.clone(), c.dir.clone());
            e.line(&format!(
                "# layer: candy {short} (generated by charly -- do not edit)"
            ));
            e.line(&format!("ARG {LAYER_PARENT_ARG}"));
            e.line(&format!("FROM scratch AS {short}"));
            e.line(&format!("COPY {src}/ /"));
            e.blank();
            e.line(&format!("FROM ${{{LAYER_PARENT_ARG}}}"));
            e.line("USER root");
            e.blank();
            e.mark(Origin::Setup(key.to_string()));
            let keys = [key.to_string()];
            e.candy_env(&keys, Some(key), &format!("charly-path-{short}.sh"));
            e.artifacts_of(Some(key));
            e.data_copies_of(&keys);
            e.candy_section(key, steps, false)?;
        }
        LayerPart::Init => {
            let mut head = std::mem::take(&mut e.out);
            let Some(assembly) = e.init_stages()? else {
                return Ok(None);
            };
            let stages = std::mem::take(&mut e.out);
            head.push_str("# layer: init configuration (generated by charly -- do not edit)\n");
            head.push_str(&format!("ARG {LAYER_PARENT_ARG}\n"));
            head.push_str(&stages);
            e.out = head;
            e.line(&format!("FROM ${{{LAYER_PARENT_ARG}}}"));
            e.out.push_str(&assembly);
            e.blank();
        }
    }
    super::cache_lock::one_lock_per_run(&mut e.out);
    Ok(Some(LayerText {
        containerfile: e.out,
        files: e.files,
        dirs,
        origins: e.origins,
    }))
}

/// What a box's image configuration adds over its last layer: the labels
/// its Containerfile would set (values as they are) and the final user
/// (`None` when the box keeps its base's user).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageFacts {
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// `USER`.
    pub user: Option<String>,
}

/// The [`ImageFacts`] of a box.
pub fn image_facts(p: &Project, b: &ResolvedBox, opts: &EmitOptions) -> ImageFacts {
    let e = emitter(p, b, opts);
    let (plain, json) = e.label_list();
    ImageFacts {
        labels: plain.into_iter().chain(json).collect(),
        user: (!e.b.preserve_user).then(|| b.user.uid.to_string()),
    }
}

/// Labels in the order they are written.
type Labels = Vec<(String, String)>;

struct Emitter<'a> {
    p: &'a Project,
    b: &'a ResolvedBox,
    vocab: &'a Vocab,
    distro: Option<Distro>,
    opts: &'a EmitOptions,
    out: String,
    dir: String,
    files: BTreeMap<String, Staged>,
    layers: BTreeMap<String, PathBuf>,
    origins: Vec<(usize, Origin)>,
}

impl Emitter<'_> {
    /// Marks the text written from here on as coming from `o`.
    fn mark(&mut self, o: Origin) {
        self.origins.push((self.out.len(), o));
    }

    fn err(&self, message: impl Into<String>) -> EmitError {
        EmitError {
            box_name: self.b.name.clone(),
            message: message.into(),
        }
    }

    fn line(&mut self, s: &str) {
        self.out.push_str(s);
        self.out.push('\n');
    }

    fn blank(&mut self) {
        if !self.out.ends_with("\n\n") {
            self.out.push('\n');
        }
    }

    fn tmpl(&self, name: &str, text: &str, data: &serde_json::Value) -> Result<String, EmitError> {
        crate::template::render(name, text, data).map_err(|e| self.err(e.to_string()))
    }

    /// A box's image reference: the caller's (`EmitOptions::image_refs`,
    /// normally [`crate::naming::box_image_refs`]), else built from the
    /// version its definition spells (no resolution at hand here).
    fn image_ref(&self, name: &str) -> String {
        if let Some(r) = self.opts.image_refs.get(name) {
            return r.clone();
        }
        let version = self
            .p
            .namespaces
            .iter()
            .flat_map(|n| n.boxes.values().map(move |b| (n.qualify(&b.name), b)))
            .find(|(q, _)| q == name)
            .and_then(|(_, b)| b.def.version.as_ref().map(|v| v.value.clone()))
            .unwrap_or_default();
        crate::naming::image_ref(name, &version)
    }

    fn candy(&self, key: &str) -> &CandyEntry {
        &self.p.candies[key]
    }

    /// The context path of a candy directory (staged under `.build/_layers`
    /// when it is outside the project).
    fn candy_src(&mut self, key: &str) -> String {
        let c = &self.p.candies[key];
        match &c.rel_dir {
            Some(r) => r.clone(),
            None => {
                let path = crate::naming::layer_dir(&c.name);
                self.layers.insert(path.clone(), c.dir.clone());
                path
            }
        }
    }

    /// Stages content under `_inline/<candy>/<sha256><ext>` and returns its path.
    fn stage(&mut self, candy: &str, bytes: &[u8], ext: &str) -> String {
        let path = format!("{}/_inline/{candy}/{}{ext}", self.dir, sha256_hex(bytes));
        self.files
            .insert(path.clone(), Staged::Bytes(bytes.to_vec()));
        path
    }

    fn format_def(&self, f: &str) -> Option<&Format> {
        self.distro.as_ref().and_then(|d| d.format.get(f))
    }

    fn render(&mut self, fragments: &[Fragment]) -> Result<(), EmitError> {
        let b = self.b;
        self.line(&format!(
            "# {}/Containerfile (generated by charly -- do not edit)",
            self.dir
        ));
        self.blank();
        let base = match &b.base {
            BaseRef::External(x) => x.clone(),
            BaseRef::Box(parent) => self.image_ref(parent),
            BaseRef::Bootstrap { .. } => "scratch".into(),
        };
        self.line(&format!("ARG BASE_IMAGE={base}"));
        self.blank();

        // One scratch stage per candy, carrying its directory.
        for k in &b.candies {
            let src = self.candy_src(k);
            let short = self.candy(k).name.clone();
            self.line(&format!("FROM scratch AS {short}"));
            self.line(&format!("COPY {src}/ /"));
            self.blank();
        }

        self.builder_stages()?;
        let init = self.init_stages()?;

        self.line("FROM ${BASE_IMAGE}");
        self.bootstrap()?;
        self.env_and_ports();
        self.artifacts();
        self.data_copies();

        let uid = b.user.uid;
        for f in fragments {
            self.out.push_str(&f.text);
            for (path, bytes) in &f.files {
                self.files
                    .insert(path.clone(), Staged::Bytes(bytes.clone()));
            }
        }
        if let Some(assembly) = init {
            self.out.push_str(&assembly);
            self.blank();
        }
        if !self.b.preserve_user {
            self.line(&format!("USER {uid}"));
        }
        self.labels();
        Ok(())
    }

    fn builder_stages(&mut self) -> Result<(), EmitError> {
        let b = self.b;
        for u in &b.builders {
            let Some(def) = self.vocab.builder.get(&u.builder).cloned() else {
                continue;
            };
            if def.inline || def.stage_template.is_none() {
                continue;
            }
            let builder_ref = u
                .image
                .as_deref()
                .map(|i| self.image_ref(i))
                .unwrap_or_default();
            for k in &u.candies {
                let stage = stage_name(&self.candy(k).name, &u.builder);
                if self.opts.artifacts.contains_key(&stage) {
                    continue;
                }
                let copy_src = self.candy_src(k);
                let text = builder_stage_text(self.p, b, k, &u.builder, &builder_ref, &copy_src)?;
                self.out.push_str(text.trim_end());
                self.out.push('\n');
                self.blank();
            }
        }
        Ok(())
    }

    /// Init stages; returns the assembly text placed after the candies.
    fn init_stages(&mut self) -> Result<Option<String>, EmitError> {
        let b = self.b;
        // Own candies with exec services trigger the fragment-assembly init.
        let own_exec = b.candies.iter().any(|k| {
            self.candy(k)
                .def
                .service
                .iter()
                .any(|s| s.exec.is_some() && s.applies_to(&b.tags))
        });
        if !own_exec {
            return Ok(None);
        }
        let Some((init_name, init)) = self
            .vocab
            .init
            .iter()
            .find(|(_, i)| {
                i.model.as_deref() == Some("fragment_assembly") && i.requires_capability.is_empty()
            })
            .map(|(n, i)| (n.clone(), i.clone()))
        else {
            return Ok(None);
        };
        // The original rejects a box whose services need an init candy it
        // does not carry; charly still writes the configuration (it is only
        // a file) and says so, so such boxes keep building.
        let missing_dep = init
            .depends_layer
            .as_ref()
            .filter(|dep| !b.candies.iter().chain(b.provided.iter()).any(|k| k == *dep))
            .cloned();
        let schema = init.service_schema.clone().unwrap_or_default();
        let Some(tmpl) = schema.service_template.clone() else {
            return Ok(None);
        };
        let frag_dir = init
            .fragment_dir
            .clone()
            .unwrap_or_else(|| init_name.clone());
        let stage_name = init
            .stage_name
            .clone()
            .unwrap_or_else(|| format!("{init_name}-conf"));
        // The whole chain: the config is rebuilt from every candy's fragment.
        let all: Vec<String> = self
            .p
            .candies
            .keys()
            .filter(|k| b.provided.contains(k) || b.candies.contains(k))
            .cloned()
            .collect();
        let order: Vec<String> = {
            let mut v: Vec<String> = b
                .provided
                .iter()
                .filter(|k| all.contains(k))
                .cloned()
                .collect();
            v.extend(b.candies.iter().cloned());
            v
        };
        self.line(&format!("FROM scratch AS {stage_name}"));
        // A vocabulary that names a header file gets it as fragment 00 (the
        // project's copy, or a standard header when the project has none).
        if let Some(h) = init.header_file.as_deref() {
            let header_rel = format!("{}/{frag_dir}/00-header.conf", self.dir);
            let path = self.p.root.join(h);
            let header = if path.is_file() {
                Staged::CopyOf(path)
            } else {
                Staged::Bytes(DEFAULT_SUPERVISOR_HEADER.as_bytes().to_vec())
            };
            self.files.insert(header_rel.clone(), header);
            self.line(&format!("COPY {header_rel} /{frag_dir}/00-header.conf"));
        }
        for (i, k) in order.iter().enumerate() {
            let c = self.candy(k).clone();
            let mut parts = Vec::new();
            for s in c
                .def
                .service
                .iter()
                .filter(|s| s.exec.is_some() && s.applies_to(&self.b.tags))
            {
                let Some(exec) = &s.exec else { continue };
                let scope = crate::ir::Scope::System;
                let data = crate::plan::compile::service_data(k, &s.name.value, exec, s, scope);
                parts.push(self.tmpl(
                    &format!("init/{init_name}/service_template"),
                    &tmpl.value,
                    &data,
                )?);
            }
            if parts.is_empty() {
                continue;
            }
            let file = format!("{:02}-{}.conf", i + 1, c.name);
            let rel = format!("{}/{frag_dir}/{file}", self.dir);
            let body = parts
                .iter()
                .map(|p| p.trim_end().to_string())
                .collect::<Vec<_>>()
                .join("\n\n")
                + "\n";
            self.files
                .insert(rel.clone(), Staged::Bytes(body.into_bytes()));
            self.line(&format!("COPY {rel} /{frag_dir}/{file}"));
        }
        self.blank();
        let assembly = match &init.assembly_template {
            Some(t) => self.tmpl(
                &format!("init/{init_name}/assembly_template"),
                &t.value,
                &serde_json::json!({}),
            )?,
            None => String::new(),
        };
        let note = match missing_dep {
            Some(dep) => format!(
                "# note: candy `{dep}` is not in this box or its bases; {init_name} is configured but not installed\n"
            ),
            None => String::new(),
        };
        Ok(Some(format!("{note}USER root\n{}\n", assembly.trim_end())))
    }

    fn bootstrap(&mut self) -> Result<(), EmitError> {
        let b = self.b;
        match &b.base {
            BaseRef::Box(_) => {
                self.line("USER root");
                self.blank();
                return Ok(());
            }
            BaseRef::Bootstrap { builder, .. } => {
                // A fresh root filesystem gets the same bootstrap as an
                // external base: packages and the box user. A layer build
                // has it as its parent image already.
                if self.opts.dir.as_deref() != Some(LAYER_DIR) {
                    self.line(&format!("ADD {}/{builder}.tar.gz /", self.dir));
                }
            }
            BaseRef::External(_) => {}
        }
        self.line("USER root");
        if let Some(d) = self.distro.clone()
            && let Some(bs) = &d.bootstrap
            && !bs.install_cmd.is_empty()
        {
            self.line("# Bootstrap");
            let mut parts: Vec<String> = cache_mounts(&bs.cache_mount);
            let mut cmds: Vec<String> = Vec::new();
            if let Some(dnf) = &d.dnf {
                let mut conf = String::new();
                if let Some(n) = dnf.max_parallel_downloads {
                    let _ = write!(conf, "max_parallel_downloads={n}\\n");
                }
                if let Some(f) = dnf.fastestmirror {
                    let _ = write!(
                        conf,
                        "fastestmirror={}\\n",
                        if f { "True" } else { "False" }
                    );
                }
                if !conf.is_empty() {
                    cmds.push(format!("printf '{conf}' >> /etc/dnf/dnf.conf"));
                }
            }
            let mut install = bs.install_cmd.clone();
            for pk in &bs.package {
                install.push(' ');
                install.push_str(pk);
            }
            cmds.push(install);
            cmds.extend(d.workaround.iter().cloned());
            cmds.push("{ [ -L /usr/local ] && mkdir -p \"$(readlink /usr/local)\"; mkdir -p /usr/local/bin; }".into());
            let body = cmds.join(" && \\\n    ");
            parts.push(body);
            self.line(&format!("RUN {}", parts.join(" \\\n    ")));
            self.blank();
        }
        let u = &b.user;
        if u.adopted {
            self.line(&format!(
                "# User {} (uid={}) adopted from the base image",
                u.name, u.uid
            ));
        } else if u.uid != 0 {
            self.line(&format!(
                "RUN if ! getent passwd {uid} >/dev/null 2>&1; then \\\n      (getent group {gid} >/dev/null 2>&1 || groupadd -g {gid} {name}) && \\\n      useradd -m -u {uid} -g {gid} -d {home} -s /bin/bash {name}; \\\n    fi",
                uid = u.uid,
                gid = u.gid,
                name = u.name,
                home = u.home
            ));
        }
        self.blank();
        self.line(&format!("WORKDIR {}", u.home));
        self.blank();
        Ok(())
    }

    fn env_and_ports(&mut self) {
        let keys = self.b.candies.clone();
        self.candy_env(&keys, None, "charly-path.sh");
    }

    /// ENV, PATH and EXPOSE of `keys` (and of the builders they use: all
    /// of the box's when `builder_of` is `None`, else those whose first
    /// candy is `builder_of`); the PATH entries also go to a profile.d
    /// snippet named `profile` for login shells.
    fn candy_env(&mut self, keys: &[String], builder_of: Option<&str>, profile: &str) {
        let b = self.b;
        let home = b.user.home.clone();
        let mut env: BTreeMap<String, String> = BTreeMap::new();
        let mut path: Vec<String> = Vec::new();
        for k in keys {
            let c = self.candy(k);
            for (kk, v) in c.def.env.iter() {
                env.insert(kk.value.clone(), expand_home(&v.value, &home));
            }
            for pth in &c.def.path_append {
                path.push(expand_home(&pth.value, &home));
            }
        }
        for u in &b.builders {
            if builder_of.is_some_and(|k| u.candies.first().map(String::as_str) != Some(k)) {
                continue;
            }
            if let Some(def) = self.vocab.builder.get(&u.builder) {
                for (kk, v) in def.runtime_env.iter() {
                    env.insert(kk.value.clone(), expand_home(v, &home));
                }
                for pth in &def.path_contribution {
                    path.push(expand_home(pth, &home));
                }
            }
        }
        if !env.is_empty() || !path.is_empty() {
            self.line("# Candy environment");
            for (k, v) in &env {
                let escaped = v.replace('$', "\\$").replace("\\${PATH}", "${PATH}");
                self.line(&format!("ENV {k}={}", dq(&escaped)));
            }
            if !path.is_empty() {
                // The same directory from two candies is listed once.
                let mut seen = BTreeSet::new();
                path.retain(|p| seen.insert(p.clone()));
                let mut joined = path.join(":");
                joined.push_str(":${PATH}");
                self.line(&format!("ENV PATH={}", dq(&joined)));
                // Login shells reset PATH from /etc/profile; a profile.d
                // snippet puts the same entries back for them.
                let snippet = format!(
                    "# PATH entries of this box's candies (generated by charly)\nexport PATH=\"{}:$PATH\"\n",
                    path.join(":")
                );
                let staged = self.stage("_env", snippet.as_bytes(), "");
                self.line(&format!(
                    "COPY --chmod=0644 {staged} /etc/profile.d/{profile}"
                ));
            }
            self.blank();
        }
        let mut ports: BTreeSet<String> = BTreeSet::new();
        for k in keys {
            for pt in &self.candy(k).def.port {
                if let Some((proto, n)) = crate::names::parse_port(&pt.value) {
                    ports.insert(if proto == "udp" {
                        format!("{n}/udp")
                    } else {
                        n.to_string()
                    });
                }
            }
        }
        if !ports.is_empty() {
            self.line("# Exposed ports");
            for pt in ports {
                self.line(&format!("EXPOSE {pt}"));
            }
            self.blank();
        }
    }

    fn artifacts(&mut self) {
        self.artifacts_of(None);
    }

    /// The builder artifacts of every candy, or of `only`.
    fn artifacts_of(&mut self, only: Option<&str>) {
        let b = self.b;
        let home = b.user.home.clone();
        for u in &b.builders {
            let Some(def) = self.vocab.builder.get(&u.builder).cloned() else {
                continue;
            };
            if def.inline || u.builder == "aur" {
                continue;
            }
            if only.is_some_and(|k| !u.candies.iter().any(|c| c == k)) {
                continue;
            }
            self.line(&format!("# Copy {} artifacts", u.builder));
            for k in &u.candies {
                if only.is_some_and(|o| o != k) {
                    continue;
                }
                let stage = stage_name(&self.candy(k).name, &u.builder);
                if let Some(tar) = self.opts.artifacts.get(&stage) {
                    self.line(&format!("ADD {tar} /"));
                    continue;
                }
                for a in &def.copy_artifact {
                    let src = a.src.replace("{{.Home}}", &home);
                    let dst = a.dst.replace("{{.Home}}", &home);
                    let chown = if a.chown {
                        format!(" --chown={}:{}", b.user.uid, b.user.gid)
                    } else {
                        String::new()
                    };
                    self.line(&format!("COPY --from={stage}{chown} {src} {dst}"));
                }
            }
            if let Some(bin) = &def.copy_binary
                && let Some(first) = u.candies.first()
                && only.is_none_or(|k| k == first)
            {
                let stage = stage_name(&self.candy(first).name, &u.builder);
                if !self.opts.artifacts.contains_key(&stage) {
                    self.line(&format!("COPY --from={stage} {} {}", bin.src, bin.dst));
                }
            }
            self.blank();
        }
    }

    fn data_copies(&mut self) {
        let keys = self.b.candies.clone();
        self.data_copies_of(&keys);
    }

    fn data_copies_of(&mut self, keys: &[String]) {
        let b = self.b;
        let mut lines = Vec::new();
        for k in keys {
            let c = self.candy(k);
            let Some(data) = c.def.data.as_ref() else {
                continue;
            };
            let Some(items) = data.0.as_seq() else {
                continue;
            };
            for it in items {
                let (Some(src), Some(vol)) = (
                    it.get("src").and_then(|n| n.as_str()),
                    it.get("volume").and_then(|n| n.as_str()),
                ) else {
                    continue;
                };
                let dest = it
                    .get("dest")
                    .and_then(|n| n.as_str())
                    .map(|d| format!("{}/", d.trim_matches('/')))
                    .unwrap_or_default();
                lines.push(format!(
                    "COPY --from={} --chown={}:{} /{}/ /data/{vol}/{dest}",
                    c.name,
                    b.user.uid,
                    b.user.gid,
                    src.trim_matches('/')
                ));
            }
        }
        if !lines.is_empty() {
            self.line("# Data");
            for l in lines {
                self.line(&l);
            }
            self.blank();
        }
    }

    fn candy_section(
        &mut self,
        key: &str,
        steps: &[InstallStep],
        is_last: bool,
    ) -> Result<(), EmitError> {
        let c = self.candy(key).clone();
        let b = self.b;
        self.line(&format!("# candy: {}", c.name));
        if !c.def.task.is_empty() || !c.def.var.is_empty() {
            self.line("ARG TARGETARCH");
            self.line("ENV ARCH=${TARGETARCH}");
            let vars: BTreeMap<&str, &str> = c
                .def
                .var
                .iter()
                .map(|(k, v)| (k.value.as_str(), v.value.as_str()))
                .collect();
            for (k, v) in vars {
                self.line(&format!("ENV {k}={}", dq(v)));
            }
        }
        // Packages: prepare + install render as one RUN from the format's template.
        let install = steps.iter().find_map(|s| match &s.data {
            StepData::SystemPackages(p) if s.phase == Some(crate::ir::Phase::Install) => {
                Some(p.clone())
            }
            _ => None,
        });
        if let Some(install) = install {
            self.mark(Origin::Packages(key.to_string()));
            self.packages(key, &install)?;
        }
        self.mark(Origin::Builder(key.to_string()));
        self.aur(key)?;
        self.mark(Origin::LocalPkg(key.to_string()));
        for s in steps {
            if let StepData::LocalPkgInstall(l) = &s.data {
                self.local_pkg(key, l)?;
            }
        }
        let mut running = "0".to_string();
        self.tasks(key, steps, &mut running)?;
        self.mark(Origin::Builder(key.to_string()));
        self.inline_builders(key, &mut running)?;
        self.mark(Origin::Shell(key.to_string()));
        for s in steps {
            if let StepData::ShellSnippet(sn) = &s.data {
                if running != "0" {
                    self.line("USER 0");
                    running = "0".into();
                }
                let mut content = sn.text.clone();
                if !content.ends_with('\n') {
                    content.push('\n');
                }
                let path = self.stage(&c.name, content.as_bytes(), "");
                self.line(&format!("# shell snippet ({})", sn.shell));
                self.line(&format!("COPY --chmod=0644 {path} {}", sn.destination));
            }
        }
        if running != "0" && !is_last {
            self.line("USER root");
        }
        let _ = b;
        self.blank();
        Ok(())
    }

    fn packages(&mut self, key: &str, set: &crate::ir::SystemPackages) -> Result<(), EmitError> {
        let b = self.b;
        let Some(fmt) = self.format_def(&set.format).cloned() else {
            return Err(self.err(format!(
                "candy `{key}` installs {} packages but the distro has no `{}` format",
                set.format, set.format
            )));
        };
        let tmpl = fmt
            .phase
            .as_ref()
            .and_then(|ph| ph.install.as_ref())
            .and_then(|i| i.container.clone())
            .or(fmt.install_template.clone());
        let Some(tmpl) = tmpl else {
            return Err(self.err(format!("format `{}` has no install template", set.format)));
        };
        let data = serde_json::json!({
            "CacheMounts": fmt.cache_mount,
            "Packages": set.packages,
            "Repos": set.repos,
            "Options": set.options,
            "Copr": set.copr,
            "Modules": set.modules,
            "Exclude": set.exclude,
            "Keys": set.keys,
            "StageName": stage_name(&self.candy(key).name, &set.format),
            "BuilderRef": "",
            "User": b.user.name,
            "UID": b.user.uid,
            "GID": b.user.gid,
            "Home": b.user.home,
        });
        let text = self.tmpl(
            &format!("format/{}/install", set.format),
            &tmpl.value,
            &data,
        )?;
        self.out.push_str(text.trim_end());
        self.out.push('\n');
        Ok(())
    }

    fn aur(&mut self, key: &str) -> Result<(), EmitError> {
        if !self.b.formats.iter().any(|f| f == "aur") {
            return Ok(());
        }
        let c = self.candy(key).clone();
        let aur = cascade::aur(&c.def);
        if aur.packages.is_empty() {
            return Ok(());
        }
        let Some(fmt) = self.format_def("aur").cloned() else {
            return Err(self.err("box builds `aur` but the distro has no aur format"));
        };
        let Some(t) = fmt.install_template.clone() else {
            return Ok(());
        };
        let data = serde_json::json!({
            "CacheMounts": fmt.cache_mount,
            "Packages": aur.packages,
            "StageName": stage_name(&c.name, "aur"),
        });
        let text = self.tmpl("format/aur/install_template", &t.value, &data)?;
        self.out.push_str(text.trim_end());
        self.out.push('\n');
        Ok(())
    }

    fn local_pkg(&mut self, key: &str, l: &crate::ir::LocalPkgStep) -> Result<(), EmitError> {
        let c = self.candy(key).clone();
        let Some(lp) = self.format_def(&l.format).and_then(|f| f.local_pkg.clone()) else {
            return Ok(());
        };
        let Some(install) = lp.install_template.as_ref() else {
            return Ok(());
        };
        if self.opts.dev_local_pkg {
            // The loader resolved the source; the sentinel marks it (`a|b`: either).
            let found = c.localpkg_sources.get(&l.format);
            let ok = found.is_some_and(|(_, files)| {
                lp.source_sentinel.as_deref().is_none_or(|alts| {
                    alts.split('|').any(|s| {
                        if let Some(suffix) = s.strip_prefix('*') {
                            files
                                .iter()
                                .any(|f| !f.contains('/') && f.ends_with(suffix))
                        } else {
                            files.contains(s)
                        }
                    })
                })
            });
            if !ok {
                let place = found.map_or_else(
                    || {
                        format!(
                            "no directory `{}` was found next to the candy or the project",
                            l.source
                        )
                    },
                    |(d, _)| {
                        format!(
                            "{} has no {}",
                            relative(d, &self.p.root),
                            lp.source_sentinel.as_deref().unwrap_or("sources")
                        )
                    },
                );
                return Err(self.err(format!(
                    "--dev-local-pkg: candy `{}` builds {} packages from `{}`, but {place}",
                    c.name, l.format, l.source
                )));
            }
            let stage_dir = format!("{}/_localpkg/{}", self.dir, c.name);
            let rendered = self.tmpl(
                &format!("format/{}/local_pkg.install_template", l.format),
                &install.value,
                &serde_json::json!({"StageDir": "/tmp/charly-pkgs", "Glob": lp.pkg_glob}),
            )?;
            self.line(&format!("COPY {stage_dir}/ /tmp/charly-pkgs/"));
            self.line(&format!(
                "RUN {} && rm -rf /tmp/charly-pkgs",
                rendered.trim()
            ));
            return Ok(());
        }
        let Some(url) = lp.download_template.as_ref() else {
            return Err(self.err(format!(
                "candy `{}` has a local {} package but the format has no download_template; build it from source with --dev-local-pkg",
                c.name, l.format
            )));
        };
        let glob = lp.pkg_glob.replace('*', "");
        let rendered = self.tmpl(
            &format!("format/{}/local_pkg.install_template", l.format),
            &install.value,
            &serde_json::json!({"StageDir": "/tmp/charly-pkgs", "Glob": lp.pkg_glob}),
        )?;
        self.line(&format!(
            "RUN mkdir -p /tmp/charly-pkgs && curl -fsSL \"{url}\" -o /tmp/charly-pkgs/pkg{glob} && {} && rm -rf /tmp/charly-pkgs",
            rendered.trim()
        ));
        Ok(())
    }

    fn switch_user(&mut self, running: &mut String, directive: &str) {
        if running != directive {
            self.line(&format!("USER {directive}"));
            *running = directive.to_string();
        }
    }

    fn tasks(
        &mut self,
        key: &str,
        steps: &[InstallStep],
        running: &mut String,
    ) -> Result<(), EmitError> {
        let c = self.candy(key).clone();
        let b = self.b;
        let u = &b.user;
        // Directories created by mkdir tasks (auto parent mkdir skips these and their children).
        let mkdirs: Vec<String> = steps
            .iter()
            .filter_map(|s| match &s.data {
                StepData::Op(o) if o.verb == "mkdir" => Some(o.value.clone()),
                _ => None,
            })
            .collect();
        let task_steps: Vec<&InstallStep> = steps
            .iter()
            .filter(|s| match &s.data {
                StepData::Op(_) | StepData::File(_) => true,
                StepData::External(_) => s.venue != crate::ir::Venue::Skip,
                _ => false,
            })
            .collect();
        let mut i = 0;
        while i < task_steps.len() {
            let s = task_steps[i];
            match &s.data {
                StepData::Op(o) => self.mark(Origin::Task(key.to_string(), o.task)),
                StepData::File(f) => self.mark(Origin::Task(key.to_string(), f.task)),
                _ => {}
            }
            match &s.data {
                StepData::Op(o) if matches!(o.verb.as_str(), "mkdir" | "link" | "setcap") => {
                    // Adjacent tasks with the same verb and the same raw user share a RUN.
                    let mut group: Vec<&OpStep> = vec![o];
                    let mut j = i + 1;
                    while j < task_steps.len() {
                        match &task_steps[j].data {
                            StepData::Op(n)
                                if n.verb == o.verb && n.user == o.user && n.comment.is_none() =>
                            {
                                group.push(n)
                            }
                            _ => break,
                        }
                        j += 1;
                    }
                    let (dir, _) = user_directive(&o.user, u.uid, u.gid, &u.name);
                    self.switch_user(running, &dir);
                    if let Some(cm) = &o.comment {
                        self.line(&format!("# {}", comment_text(cm)));
                    }
                    self.line(&group_run(&group));
                    i = j;
                    continue;
                }
                StepData::Op(o) => self.op(&c, o, running)?,
                StepData::File(f) => self.file(&c, f, &mkdirs, running),
                StepData::External(e) => self.plugin_fragment(key, s, e, running)?,
                _ => {}
            }
            i += 1;
        }
        Ok(())
    }

    /// A plugin task's build fragment, as its plugin emitted it, spliced
    /// in as root (a fragment carries its own `USER` when it needs one).
    /// A step whose plugin declared it emits nothing is left out; one with
    /// no fragment is an error, never a silent gap in the image.
    fn plugin_fragment(
        &mut self,
        key: &str,
        s: &InstallStep,
        e: &crate::ir::ExternalStep,
        running: &mut String,
    ) -> Result<(), EmitError> {
        let word = e.data["word"].as_str().unwrap_or("?");
        let Some(task) = e.data["task"].as_u64().map(|t| t as usize) else {
            return Ok(());
        };
        self.mark(Origin::Task(key.to_string(), task));
        let what = format!("candy `{key}` task #{} (plugin `{word}`)", task + 1);
        if self.opts.deploy_only_plugins.contains(word) {
            self.line(&format!(
                "# {}: deploy-only, not in images",
                comment_text(&what)
            ));
            return Ok(());
        }
        let Some(fragment) = self.opts.plugin_fragments.get(&(key.to_string(), task)) else {
            return Err(self.err(format!(
                "{what}: the `{}` step has no build fragment: its plugin was not asked to emit one (is the plugin installed?)",
                s.kind.as_str()
            )));
        };
        check_fragment(fragment)
            .map_err(|m| self.err(format!("{what}: its plugin's fragment {m}")))?;
        self.switch_user(running, "0");
        self.line(&format!("# {}", comment_text(&what)));
        for l in fragment.trim_end().lines() {
            self.line(l);
        }
        Ok(())
    }

    fn op(&mut self, c: &CandyEntry, o: &OpStep, running: &mut String) -> Result<(), EmitError> {
        let b = self.b;
        let u = &b.user;
        let (dir, _) = user_directive(&o.user, u.uid, u.gid, &u.name);
        let is_root = dir == "0";
        match o.verb.as_str() {
            "build" => {
                self.switch_user(running, &u.uid.to_string());
                self.line(&format!("# build: {} (handled by builder stage)", o.value));
            }
            "cmd" => {
                self.switch_user(running, &dir);
                if let Some(cm) = &o.comment {
                    self.line(&format!("# {}", comment_text(cm)));
                }
                let mut script = String::from(sh::ARCH_PREAMBLE);
                for (k, v) in &o.env {
                    let _ = writeln!(script, "export {k}={}", sh::quote(v));
                }
                script.push_str("set -e\n");
                script.push_str(&o.value);
                if !script.ends_with('\n') {
                    script.push('\n');
                }
                let path = self.stage(&c.name, script.as_bytes(), ".sh");
                let hash8 = &sha256_hex(script.as_bytes())[..8];
                let mut mounts = vec![
                    format!("--mount=type=bind,from={},source=/,target=/ctx", c.name),
                    format!("--mount=type=bind,source={path},target=/tmp/charly-{hash8}.sh"),
                ];
                mounts.extend(self.cmd_cache_mounts(is_root));
                mounts.extend(self.task_caches(o, is_root));
                let first = o
                    .value
                    .lines()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("")
                    .trim();
                let first: String = first.chars().take(100).collect();
                self.line(&format!("# cmd: {}", comment_text(&first)));
                self.line(&format!(
                    "RUN {} \\\n    bash /tmp/charly-{hash8}.sh",
                    mounts.join(" \\\n    ")
                ));
            }
            "download" => {
                self.switch_user(running, &dir);
                let mut mounts = vec![
                    "--mount=type=cache,id=charly-tmp-downloads,dst=/tmp/downloads,sharing=locked"
                        .to_string(),
                ];
                mounts.extend(self.task_caches(o, is_root));
                let mut env = String::from("export BUILD_ARCH=$(uname -m);");
                for (k, v) in &o.env {
                    let _ = write!(env, " export {k}={};", sh::quote(v));
                }
                let url = &o.value;
                let extract = o.extract.clone().unwrap_or_else(|| {
                    if url.ends_with(".tar.gz") || url.ends_with(".tgz") {
                        "tar.gz".into()
                    } else {
                        "none".into()
                    }
                });
                let to = o.to.clone().unwrap_or_default();
                let strip = o
                    .strip_components
                    .map(|n| format!(" --strip-components={n}"))
                    .unwrap_or_default();
                let include = if o.include.is_empty() {
                    String::new()
                } else {
                    format!(
                        " {}",
                        o.include
                            .iter()
                            .map(|x| sh::quote(x))
                            .collect::<Vec<_>>()
                            .join(" ")
                    )
                };
                // An archive is unpacked into `to`, made first (as the
                // original does: `tar -C` needs it to exist).
                let into = |cmd: String| format!("mkdir -p {} && {cmd}", sh::quote(&to));
                let mut x = match extract.as_str() {
                    "tar.gz" => into(format!(
                        "tar -xzf \"$__c\"{strip} -C {}{include}",
                        sh::quote(&to)
                    )),
                    "tar.xz" => into(format!(
                        "tar -xJf \"$__c\"{strip} -C {}{include}",
                        sh::quote(&to)
                    )),
                    "tar.zst" => into(format!(
                        "tar --zstd -xf \"$__c\"{strip} -C {}{include}",
                        sh::quote(&to)
                    )),
                    "zip" => into(format!("unzip -o \"$__c\" -d {}", sh::quote(&to))),
                    "sh" => {
                        let envs: String = o
                            .env
                            .iter()
                            .map(|(k, v)| format!(" {k}={}", sh::quote(v)))
                            .collect();
                        format!("BUILD_ARCH=$(uname -m){envs} sh \"$__c\"")
                    }
                    _ => format!("cp -f \"$__c\" {}", sh::quote(&to)),
                };
                if let Some(m) = &o.mode {
                    if extract == "none" {
                        let _ = write!(x, " && chmod {m} {}", sh::quote(&to));
                    } else if extract != "sh" {
                        let _ = write!(x, " && chmod -R {m} {}", sh::quote(&to));
                    }
                }
                let script = format!(
                    "{env} mkdir -p /tmp/downloads; __u={}; __c=/tmp/downloads/$(printf %s \"$__u\" | sha256sum | cut -c1-64); [ -s \"$__c\" ] || {{ curl -fsSL \"$__u\" -o \"$__c.part\" && mv -f \"$__c.part\" \"$__c\"; }} && {x}",
                    go_quote(url)
                );
                self.line(&format!(
                    "RUN {} \\\n    bash -c {}",
                    mounts.join(" \\\n    "),
                    sh::quote(&script)
                ));
            }
            _ => {}
        }
        Ok(())
    }

    /// Cache mounts a cmd gets: the primary format's shared mounts as root,
    /// a per-uid npm cache otherwise.
    fn cmd_cache_mounts(&self, is_root: bool) -> Vec<String> {
        let u = &self.b.user;
        if is_root {
            self.b
                .pkg()
                .and_then(|f| self.format_def(f))
                .map(|f| cache_mounts(&f.cache_mount))
                .unwrap_or_default()
        } else {
            vec![owned_mount("/tmp/npm-cache", u.uid, u.gid)]
        }
    }

    fn task_caches(&self, o: &OpStep, is_root: bool) -> Vec<String> {
        let u = &self.b.user;
        o.cache
            .iter()
            .map(|d| {
                if is_root {
                    format!(
                        "--mount=type=cache,id=charly-{},dst={d},sharing=locked",
                        safe_id(d)
                    )
                } else {
                    owned_mount(d, u.uid, u.gid)
                }
            })
            .collect()
    }

    fn file(&mut self, c: &CandyEntry, f: &FileStep, mkdirs: &[String], running: &mut String) {
        let b = self.b;
        let u = &b.user;
        let (dir, chown) = user_directive(&f.user, u.uid, u.gid, &u.name);
        self.switch_user(running, &dir);
        let parent = match f.path.rsplit_once('/') {
            Some(("", _)) | None => String::new(),
            Some((p, _)) => p.to_string(),
        };
        let covered = parent.is_empty()
            || parent == u.home
            || mkdirs.iter().any(|m| {
                *m == parent
                    || parent.starts_with(&format!("{m}/"))
                    || m.starts_with(&format!("{parent}/"))
            });
        if !covered {
            self.line(&format!("RUN mkdir -p {parent}"));
        }
        let chown = chown.map(|c| format!(" --chown={c}")).unwrap_or_default();
        match f.verb.as_str() {
            "write" => {
                let content = f.content.clone().unwrap_or_default();
                let path = self.stage(&c.name, content.as_bytes(), "");
                self.line(&format!("COPY --chmod={}{chown} {path} {}", f.mode, f.path));
            }
            _ => {
                let src = f.source.clone().unwrap_or_default();
                self.line(&format!(
                    "COPY --from={} --chmod={}{chown} {} {}",
                    c.name,
                    f.mode,
                    src.trim_start_matches("./"),
                    f.path
                ));
            }
        }
    }

    fn inline_builders(&mut self, key: &str, running: &mut String) -> Result<(), EmitError> {
        let b = self.b;
        let c = self.candy(key).clone();
        for u in &b.builders {
            if !u.candies.iter().any(|k| k == key) {
                continue;
            }
            let Some(def) = self.vocab.builder.get(&u.builder).cloned() else {
                continue;
            };
            if !def.inline {
                continue;
            }
            let Some(t) = def.install_template.as_ref() else {
                continue;
            };
            self.switch_user(running, &b.user.uid.to_string());
            let data = serde_json::json!({
                "LayerStage": c.name,
                "CacheMounts": def.cache_mount,
                "UID": b.user.uid,
                "GID": b.user.gid,
                "Home": b.user.home,
                "User": b.user.name,
            });
            let text = self.tmpl(
                &format!("builder/{}/install_template", u.builder),
                &t.value,
                &data,
            )?;
            self.out.push_str(text.trim_end());
            self.out.push('\n');
        }
        Ok(())
    }

    fn labels(&mut self) {
        let (labels, json_labels) = self.label_list();
        self.blank();
        for (k, v) in labels {
            self.line(&format!("LABEL {k}={}", dq(&v)));
        }
        for (k, v) in json_labels {
            self.line(&format!("LABEL {k}={}", sh::quote(&v)));
        }
    }

    /// The box's labels, values as they are: plain ones, then those whose
    /// value is JSON text.
    fn label_list(&self) -> (Labels, Labels) {
        let b = self.b;
        let mut labels: Vec<(String, String)> = vec![
            ("ai.opencharly.version".into(), b.version.clone()),
            ("ai.opencharly.box".into(), b.name.clone()),
            ("ai.opencharly.uid".into(), b.user.uid.to_string()),
            ("ai.opencharly.gid".into(), b.user.gid.to_string()),
            ("ai.opencharly.user".into(), b.user.name.clone()),
            ("ai.opencharly.home".into(), b.user.home.clone()),
        ];
        if let Some(d) = &b.distro_def {
            labels.push(("ai.opencharly.platform.distro".into(), d.clone()));
        }
        if let Some(f) = b.pkg() {
            labels.push(("ai.opencharly.platform.format".into(), f.to_string()));
        }
        let mut json_labels: Vec<(String, serde_json::Value)> = Vec::new();
        let candy_versions: BTreeMap<String, String> = b
            .candies
            .iter()
            .map(|k| {
                (
                    k.clone(),
                    self.candy(k)
                        .def
                        .version
                        .as_ref()
                        .map(|v| v.value.clone())
                        .unwrap_or_default(),
                )
            })
            .collect();
        if !candy_versions.is_empty() {
            json_labels.push((
                "ai.opencharly.candy_version".into(),
                serde_json::to_value(&candy_versions).unwrap_or_default(),
            ));
        }
        let builders: BTreeMap<&str, &str> = b
            .builders
            .iter()
            .filter_map(|u| u.image.as_deref().map(|i| (u.builder.as_str(), i)))
            .collect();
        if !builders.is_empty() {
            json_labels.push((
                "ai.opencharly.builder.use".into(),
                serde_json::to_value(&builders).unwrap_or_default(),
            ));
        }
        if !b.produce.is_empty() {
            json_labels.push((
                "ai.opencharly.builder.provide".into(),
                serde_json::to_value(&b.produce).unwrap_or_default(),
            ));
        }
        // Shell and service metadata merged over the box's candies.
        let mut shells: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut services: Vec<serde_json::Value> = Vec::new();
        for k in &b.candies {
            let c = self.candy(k);
            if let Some(sh) = &c.def.shell {
                let mut list = Vec::new();
                for (name, ov) in [
                    ("bash", &sh.bash),
                    ("zsh", &sh.zsh),
                    ("fish", &sh.fish),
                    ("sh", &sh.sh),
                ] {
                    let has = ov
                        .as_ref()
                        .is_some_and(|o| o.init.is_some() || !o.path_append.is_empty())
                        || sh.init.is_some()
                        || !sh.path_append.is_empty();
                    if has {
                        list.push(name.to_string());
                    }
                }
                shells.insert(k.clone(), list);
            }
            for s in c.def.service.iter().filter(|s| s.applies_to(&b.tags)) {
                let init = if s.exec.is_some() {
                    "supervisord"
                } else {
                    "packaged"
                };
                services.push(serde_json::json!({"candy": k, "name": s.name.value, "form": init}));
            }
        }
        if !shells.is_empty() {
            json_labels.push((
                "ai.opencharly.shell".into(),
                serde_json::to_value(&shells).unwrap_or_default(),
            ));
        }
        if !services.is_empty() {
            json_labels.push((
                "ai.opencharly.service".into(),
                serde_json::Value::Array(services),
            ));
        }
        let mut env_candy: BTreeMap<String, String> = BTreeMap::new();
        let mut path_append: Vec<String> = Vec::new();
        for k in &b.candies {
            let c = self.candy(k);
            for (kk, v) in c.def.env.iter() {
                env_candy.insert(kk.value.clone(), v.value.clone());
            }
            path_append.extend(c.def.path_append.iter().map(|p| p.value.clone()));
        }
        if !env_candy.is_empty() {
            json_labels.push((
                "ai.opencharly.env_candy".into(),
                serde_json::to_value(&env_candy).unwrap_or_default(),
            ));
        }
        if !path_append.is_empty() {
            json_labels.push((
                "ai.opencharly.path_append".into(),
                serde_json::to_value(&path_append).unwrap_or_default(),
            ));
        }
        let mut volumes: BTreeMap<String, String> = BTreeMap::new();
        for k in b.candies.iter().chain(b.provided.iter()) {
            for v in &self.candy(k).def.volume {
                volumes
                    .entry(v.name.value.clone())
                    .or_insert_with(|| expand_home(&v.path.value, &b.user.home));
            }
        }
        if !volumes.is_empty() {
            let list: Vec<serde_json::Value> = volumes
                .iter()
                .map(|(n, p)| serde_json::json!({"name": n, "path": p}))
                .collect();
            json_labels.push((
                "ai.opencharly.volume".into(),
                serde_json::Value::Array(list),
            ));
        }
        for (k, v) in &self.opts.labels {
            labels.push((k.clone(), v.clone()));
        }
        let json_labels = json_labels
            .into_iter()
            .map(|(k, v)| (k, serde_json::to_string(&v).unwrap_or_default()))
            .collect();
        (labels, json_labels)
    }
}

/// Renders one builder stage (`<candy>-<builder>-build`) from the builder's
/// `stage_template`. `copy_src` is the context path of the candy directory.
pub fn builder_stage_text(
    p: &Project,
    b: &ResolvedBox,
    candy: &str,
    builder: &str,
    builder_ref: &str,
    copy_src: &str,
) -> Result<String, EmitError> {
    let err = |m: String| EmitError {
        box_name: b.name.clone(),
        message: m,
    };
    let vocab = &p.ns(b.ns).vocab;
    let def = vocab
        .builder
        .get(builder)
        .ok_or_else(|| err(format!("unknown builder `{builder}`")))?;
    let tmpl = def
        .stage_template
        .as_ref()
        .ok_or_else(|| err(format!("builder `{builder}` has no stage_template")))?;
    let c = &p.candies[candy];
    let stage = stage_name(&c.name, builder);
    let manifest = def
        .detect_file
        .iter()
        .find(|f| c.has_file(f))
        .cloned()
        .unwrap_or_default();
    let has_lock = !manifest.is_empty()
        && (c.has_file(&format!("{manifest}.lock"))
            || (manifest == "pixi.toml" && c.has_file("pixi.lock")));
    let install_cmd = if has_lock {
        def.install_command
            .get(&format!("{manifest}+lock"))
            .or_else(|| def.install_command.get(&manifest))
    } else {
        def.install_command.get(&manifest)
    }
    .cloned()
    .unwrap_or_default();
    let build_script = def.build_script.clone().unwrap_or_default();
    let has_script = !build_script.is_empty() && c.has_file(&build_script);
    let aur = cascade::aur(&c.def);
    let mut data = serde_json::json!({
        "BuilderRef": builder_ref,
        "StageName": stage,
        "LayerStage": c.name,
        "CopySrc": copy_src,
        "UID": b.user.uid,
        "GID": b.user.gid,
        "Home": b.user.home,
        "User": b.user.name,
        "Manifest": manifest,
        "HasLockFile": has_lock,
        "InstallCmd": install_cmd,
        "CacheMounts": def.cache_mount,
        "Packages": aur.packages,
        "Options": aur.options,
        "HasBuildScript": has_script,
        "BuildScript": build_script,
        "ManylinuxFix": "",
    });
    let render = |name: String, text: &str, data: &serde_json::Value| {
        crate::template::render(&name, text, data).map_err(|e| err(e.to_string()))
    };
    if let Some(fix) = &def.manylinux_fix {
        let rendered = render(
            format!("builder/{builder}/manylinux_fix"),
            &fix.value,
            &data,
        )?;
        data["ManylinuxFix"] = serde_json::Value::String(rendered.trim_end().to_string());
    }
    let mut text = render(
        format!("builder/{builder}/stage_template"),
        &tmpl.value,
        &data,
    )?;
    super::cache_lock::one_lock_per_run(&mut text);
    Ok(text)
}

/// mkdir/link/setcap tasks sharing one RUN.
fn group_run(group: &[&OpStep]) -> String {
    match group[0].verb.as_str() {
        "mkdir" => {
            let paths: Vec<&str> = group.iter().map(|o| o.value.as_str()).collect();
            let mut s = format!("RUN mkdir -p {}", paths.join(" "));
            let mut modes: Vec<(&str, Vec<&str>)> = Vec::new();
            for o in group {
                if let Some(m) = o.mode.as_deref() {
                    match modes.iter_mut().find(|(mm, _)| *mm == m) {
                        Some((_, ps)) => ps.push(&o.value),
                        None => modes.push((m, vec![&o.value])),
                    }
                }
            }
            for (m, ps) in modes {
                let _ = write!(s, " && chmod {m} {}", ps.join(" "));
            }
            s
        }
        "link" => {
            let parts: Vec<String> = group
                .iter()
                .map(|o| format!("ln -sf {} {}", o.target.as_deref().unwrap_or(""), o.value))
                .collect();
            format!("RUN {}", parts.join(" && "))
        }
        _ => {
            let parts: Vec<String> = group
                .iter()
                .map(|o| match o.caps.as_deref() {
                    Some(caps) => format!("setcap {caps} {}", o.value),
                    None => format!("setcap -r {} 2>/dev/null || true", o.value),
                })
                .collect();
            format!("RUN {}", parts.join(" && "))
        }
    }
}

/// Go `%q` for a URL inside a double-quoted shell string.
fn go_quote(s: &str) -> String {
    let mut out = String::from("\"");
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// supervisord's header when the project has none.
pub const DEFAULT_SUPERVISOR_HEADER: &str = "[supervisord]\nnodaemon=true\nuser=root\nlogfile=/dev/null\nlogfile_maxbytes=0\npidfile=/tmp/supervisord.pid\n\n[unix_http_server]\nfile=/tmp/supervisor.sock\n\n[rpcinterface:supervisor]\nsupervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface\n\n[supervisorctl]\nserverurl=unix:///tmp/supervisor.sock\n";

/// `.containerignore` contents for the project root.
pub fn containerignore(extra: &[String]) -> String {
    let mut s = String::from(
        "# .containerignore (generated by charly -- do not edit; source: defaults.context_ignore in charly.yml)\n\
         # `podman build -f .build/<box>/Containerfile .` (docker: .dockerignore) reads it from the\n\
         # build context: it keeps VCS data and caches out. charly's own builds do not need it.\n",
    );
    let base = [
        ".git",
        "bin",
        "*.md",
        "**/__pycache__",
        "**/*.pyc",
        "**/*.pyo",
        "**/*.egg-info",
        "**/node_modules",
        "**/.git",
        "**/.DS_Store",
        "**/*~",
        "**/*.swp",
        "**/*.swo",
        "**/.pytest_cache",
        "**/.mypy_cache",
    ];
    let mut seen = BTreeSet::new();
    for l in base
        .iter()
        .map(|s| s.to_string())
        .chain(extra.iter().cloned())
    {
        if seen.insert(l.clone()) {
            s.push_str(&l);
            s.push('\n');
        }
    }
    s
}
