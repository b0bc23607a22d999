//! The pure compiler from a resolved box's candies to InstallPlans.
//!
//! `build_deploy_plan` is deterministic: the same project, box, candy and
//! host context give the same plan, byte for byte. Emission order per candy:
//! shell hook (env + path_append), packages (prepare phase when the cascade
//! brings repos/copr/modules, then install), local package, tasks in YAML
//! order (write/copy become File steps, the rest Op steps), builder steps per
//! triggered builder, services, shell snippets, Android packages, reboot.

use crate::cascade;
use crate::home::{Tilde, expand_home, expand_tilde};
use crate::ir::*;
use crate::model::{Candy, Service, Vocab};
use crate::project::{CandyEntry, Project};
use crate::resolve::{ResolvedBox, User, effective_distro};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Where a plan will be applied.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "kebab-case")]
pub enum Target {
    /// An OCI image build (the Containerfile).
    #[default]
    Oci,
    /// The local host.
    Local,
    /// A VM over SSH.
    Vm,
    /// A pod (quadlet) running the box image.
    Pod,
    /// Kubernetes (kustomize) running the box image.
    K8s,
}

impl Target {
    /// Whether the target runs the built image (so the image already contains everything).
    pub fn is_container(self) -> bool {
        matches!(self, Target::Oci | Target::Pod | Target::K8s)
    }

    /// Every target.
    pub const ALL: [Target; 5] = [
        Target::Oci,
        Target::Local,
        Target::Vm,
        Target::Pod,
        Target::K8s,
    ];

    /// The target of a name ([`Target::as_str`]), if it is one.
    pub fn named(s: &str) -> Option<Target> {
        Target::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// The name as used on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Target::Oci => "oci",
            Target::Local => "local",
            Target::Vm => "vm",
            Target::Pod => "pod",
            Target::K8s => "k8s",
        }
    }
}

/// Facts about the target that change the plan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostContext {
    /// The target kind.
    pub target: Target,
    /// The target's distro, when it differs from the box's (host deploys).
    pub distro: Option<String>,
    /// Overrides every builder's image.
    pub builder_image: Option<String>,
}

/// A problem compiling a plan (a template that fails to render).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{candy}: {message}")]
pub struct PlanError {
    /// The candy.
    pub candy: String,
    /// What failed.
    pub message: String,
}

/// Expands `~/`, a bare `~`, `${HOME}` and `$HOME` to the home token.
pub fn home_token(s: &str) -> String {
    expand_home(s, HOME_TOKEN)
}

/// Wraps a snippet so only `shell` runs it when sourced from /etc/profile.d.
fn guard_for_shell(shell: &str, text: &str) -> String {
    let test = match shell {
        "bash" => "[ -n \"${BASH_VERSION:-}\" ]",
        "zsh" => "[ -n \"${ZSH_VERSION:-}\" ]",
        _ => "[ -z \"${BASH_VERSION:-}\" ] && [ -z \"${ZSH_VERSION:-}\" ]",
    };
    let body = text.trim_end_matches('\n');
    format!("if {test}; then\n{body}\nfi\n")
}

/// A PATH entry for a shell snippet: a leading `~` becomes `$HOME` (the
/// shell expands it; `${HOME}` stays as written).
fn shell_home(p: &str) -> String {
    expand_tilde(p, "$HOME", Tilde::BareAndSlash)
}

/// Substitutes `${USER}`, `${UID}`, `${GID}` and the home (as the token) in a
/// non-shell field.
pub fn subst_user(s: &str, u: &User) -> String {
    home_token(s)
        .replace("${USER}", &u.name)
        .replace("${UID}", &u.uid.to_string())
        .replace("${GID}", &u.gid.to_string())
}

/// The user a task runs as, resolved: `root`/`0`/empty stay root; `${USER}`
/// becomes the box user's uid; `${UID}:${GID}` is substituted.
pub fn resolve_task_user(raw: &str, u: &User) -> String {
    match raw {
        "" | "root" | "0" | "0:0" => "0".into(),
        "${USER}" => u.uid.to_string(),
        other => other
            .replace("${UID}", &u.uid.to_string())
            .replace("${GID}", &u.gid.to_string())
            .replace("${USER}", &u.name),
    }
}

/// Why candy `c`'s `copy:` source `src` is refused: it must name a file of
/// the candy's directory (absolute, or climbing with `..`, it would read
/// outside it), and not a symlink leading out of the project (a build
/// never reads one). `validate` and every plan compile ask this one
/// function.
pub fn copy_problem(c: &crate::project::CandyEntry, src: &str) -> Option<String> {
    if src.starts_with('/') || src.split('/').any(|s| s == "..") {
        return Some("the source must be a path inside the candy directory".into());
    }
    let src = src.trim_start_matches("./");
    let under = format!("{}/", src.trim_end_matches('/'));
    c.links_out
        .iter()
        .find(|f| f.as_str() == src || f.starts_with(&under))
        .map(|f| {
            format!(
                "`{f}` is a symlink leading outside the project (or nowhere); \
                 put the file itself in the candy directory"
            )
        })
}

/// Why a target path is refused: a `..` component (the path would climb
/// out of where it is put, or above `/` of a rooted deploy), or a `.` one.
pub fn climbing_path(p: &str) -> Option<String> {
    let bad: Vec<&str> = p.split('/').filter(|c| *c == ".." || *c == ".").collect();
    (!bad.is_empty()).then(|| {
        format!(
            "`{p}` has a `{}` component; target paths must not contain `..` or `.`",
            bad[0]
        )
    })
}

/// Compiles every candy of a box (in install order) into per-candy plans.
pub fn build_box_plans(
    p: &Project,
    b: &ResolvedBox,
    ctx: &HostContext,
) -> Result<Vec<InstallPlan>, PlanError> {
    b.candies
        .iter()
        .map(|k| build_deploy_plan(p, b, k, ctx))
        .collect()
}

/// Compiles the box's merged plan, with the candies `add` (keys in
/// [`Project::candies`], not in the box) compiled after the box's own, as
/// part of the same deploy (its id names them).
pub fn build_merged_plan(
    p: &Project,
    b: &ResolvedBox,
    ctx: &HostContext,
    add: &[String],
) -> Result<InstallPlan, PlanError> {
    let plans = build_box_plans(p, b, ctx)?;
    let mut m = merge_plans(&plans, &b.name, add);
    for k in add {
        if b.candies.contains(k) {
            return Err(PlanError {
                candy: k.clone(),
                message: format!(
                    "is already in box {}; --add is for candies it lacks",
                    b.name
                ),
            });
        }
        let extra = build_deploy_plan(p, b, k, ctx)?;
        m.steps.extend(extra.steps);
    }
    if plans.is_empty() {
        m.version.clone_from(&b.version);
        m.meta = meta(b, ctx);
    }
    Ok(m)
}

fn meta(b: &ResolvedBox, ctx: &HostContext) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    m.insert("target".into(), ctx.target.as_str().into());
    m.insert("user".into(), b.user.name.clone());
    m.insert("uid".into(), b.user.uid.to_string());
    m.insert("gid".into(), b.user.gid.to_string());
    m.insert("home".into(), b.user.home.clone());
    if let Some(f) = b.pkg() {
        m.insert("format".into(), f.to_string());
    }
    m
}

/// Everything of a resolved box that compiling one of its candies reads,
/// and nothing else: the same context and candy give the same steps, so
/// boxes that agree on it can share one compiled candy
/// ([`compile_candy_steps`]). What differs per box (its name, version,
/// deploy id, meta) is only in the plan's header ([`deploy_plan_header`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CompileContext {
    /// The box's namespace (whose vocabulary the candy compiles with).
    pub ns: crate::project::NsId,
    /// The box's distro definition.
    pub distro_def: Option<String>,
    /// The box's package formats, primary first.
    pub formats: Vec<String>,
    /// The box's tags.
    pub tags: Vec<String>,
    /// The box user.
    pub user: User,
    /// Whether the box keeps its base's user.
    pub preserve_user: bool,
    /// The box's builder uses that include this candy, in the box's order:
    /// (builder, image).
    pub builders: Vec<(String, Option<String>)>,
}

impl CompileContext {
    /// The context box `b` compiles candy `key` in.
    pub fn of(b: &ResolvedBox, key: &str) -> Self {
        CompileContext {
            ns: b.ns,
            distro_def: b.distro_def.clone(),
            formats: b.formats.clone(),
            tags: b.tags.clone(),
            user: b.user.clone(),
            preserve_user: b.preserve_user,
            builders: b
                .builders
                .iter()
                .filter(|u| u.candies.iter().any(|c| c == key))
                .map(|u| (u.builder.clone(), u.image.clone()))
                .collect(),
        }
    }

    /// The primary format.
    fn pkg(&self) -> Option<&str> {
        self.formats.first().map(String::as_str)
    }

    /// The cascade's tag chain (as [`ResolvedBox::tag_chain`]).
    fn tag_chain(&self) -> Vec<String> {
        cascade::tag_chain(&self.tags, self.pkg())
    }
}

/// Compiles one candy of a box for a target.
pub fn build_deploy_plan(
    p: &Project,
    b: &ResolvedBox,
    key: &str,
    ctx: &HostContext,
) -> Result<InstallPlan, PlanError> {
    let steps = compile_candy_steps(p, &CompileContext::of(b, key), key, ctx)?;
    let h = deploy_plan_header(b, key, ctx);
    Ok(InstallPlan {
        deploy_id: h.deploy_id,
        box_name: h.box_name.to_string(),
        version: h.version.to_string(),
        distro: h.distro.map(str::to_string),
        candy: h.candy.map(str::to_string),
        steps,
        candies_included: h.candies_included,
        add_candies: h.add_candies,
        builder_image: h.builder_image.map(str::to_string),
        meta: h.meta,
    })
}

/// The steps of one candy compiled in a context, for a target: the
/// [`InstallPlan::steps`] of [`build_deploy_plan`] for every box whose
/// [`CompileContext`] for the candy is `cx`.
pub fn compile_candy_steps(
    p: &Project,
    b: &CompileContext,
    key: &str,
    ctx: &HostContext,
) -> Result<Vec<InstallStep>, PlanError> {
    let c = p.candies.get(key).ok_or_else(|| PlanError {
        candy: key.into(),
        message: "unknown candy".into(),
    })?;
    let vocab = &p.ns(b.ns).vocab;
    let mut cx = Cx {
        b,
        c,
        vocab,
        ctx,
        plugins: &p.plugins,
        steps: Vec::new(),
    };
    cx.shell_hook();
    cx.packages()?;
    cx.local_pkg();
    cx.tasks()?;
    cx.builders();
    cx.services()?;
    cx.snippets();
    cx.apk();
    if c.def.reboot {
        let mut s = InstallStep::reboot(key);
        if ctx.target.is_container() {
            s.venue = Venue::Skip;
        }
        cx.steps.push(s);
    }
    Ok(cx.steps)
}

/// A per-candy plan with its steps borrowed: it serializes exactly as the
/// [`InstallPlan`] [`build_deploy_plan`] gives for the same box, candy and
/// steps (same fields, names and encodings), so a key over it is the key
/// over that plan.
#[derive(Clone, Debug, Serialize)]
pub struct DeployPlanRef<'a> {
    /// See [`InstallPlan::deploy_id`].
    pub deploy_id: String,
    /// See [`InstallPlan::box_name`].
    #[serde(rename = "box")]
    pub box_name: &'a str,
    /// See [`InstallPlan::version`].
    pub version: &'a str,
    /// See [`InstallPlan::distro`].
    pub distro: Option<&'a str>,
    /// See [`InstallPlan::candy`].
    pub candy: Option<&'a str>,
    /// See [`InstallPlan::steps`].
    pub steps: &'a [InstallStep],
    /// See [`InstallPlan::candies_included`].
    pub candies_included: Vec<String>,
    /// See [`InstallPlan::add_candies`].
    pub add_candies: Vec<String>,
    /// See [`InstallPlan::builder_image`].
    pub builder_image: Option<&'a str>,
    /// See [`InstallPlan::meta`].
    pub meta: BTreeMap<String, String>,
}

/// The box's part of candy `key`'s plan (everything but the steps, which
/// are empty here): [`build_deploy_plan`] without compiling.
pub fn deploy_plan_header<'a>(
    b: &'a ResolvedBox,
    key: &'a str,
    ctx: &'a HostContext,
) -> DeployPlanRef<'a> {
    let candies = vec![key.to_string()];
    DeployPlanRef {
        deploy_id: deploy_id(&b.name, &candies, &[]),
        box_name: &b.name,
        version: &b.version,
        distro: ctx.distro.as_deref().or(b.distro_def.as_deref()),
        candy: Some(key),
        steps: &[],
        candies_included: candies,
        add_candies: Vec::new(),
        builder_image: ctx.builder_image.as_deref(),
        meta: meta(b, ctx),
    }
}

struct Cx<'a> {
    b: &'a CompileContext,
    c: &'a CandyEntry,
    vocab: &'a Vocab,
    ctx: &'a HostContext,
    plugins: &'a crate::plugin::Plugins,
    steps: Vec<InstallStep>,
}

impl Cx<'_> {
    fn def(&self) -> &Candy {
        &self.c.def
    }

    fn key(&self) -> &str {
        &self.c.key
    }

    /// Where `span` is, for an error: `candy/<name>/charly.yml:L:C` for a
    /// candy of the project, `line L:C` for one from elsewhere.
    fn at(&self, span: crate::source::Span) -> String {
        match &self.c.rel_dir {
            Some(d) => format!("{d}/charly.yml:{}:{}", span.line, span.col),
            None => format!("line {}:{}", span.line, span.col),
        }
    }

    fn shell_hook(&mut self) {
        let d = self.def();
        if d.env.is_empty() && d.path_append.is_empty() {
            return;
        }
        let env: BTreeMap<String, String> = d
            .env
            .iter()
            .map(|(k, v)| (k.value.clone(), home_token(&v.value)))
            .collect();
        let path: Vec<String> = d.path_append.iter().map(|p| home_token(&p.value)).collect();
        let step = InstallStep::shell_hook(
            self.key(),
            ShellHookStep {
                env,
                path,
                env_file: format!("{HOME_TOKEN}/.config/charly/env.d/{}.sh", self.key()),
            },
        );
        self.steps.push(step);
    }

    fn packages(&mut self) -> Result<(), PlanError> {
        let Some(format) = self.b.pkg().map(str::to_string) else {
            return Ok(());
        };
        let chain = self.b.tag_chain();
        let set = cascade::resolve(self.def(), &chain);
        let fmt_def = self
            .b
            .distro_def
            .as_deref()
            .and_then(|d| effective_distro(self.vocab, d))
            .and_then(|d| d.format.get(&format).cloned());
        if set.matched {
            let repos: Vec<BTreeMap<String, String>> = set
                .repos
                .iter()
                .map(|r| {
                    r.iter()
                        .map(|(k, v)| (k.value.clone(), v.clone()))
                        .collect()
                })
                .collect();
            if !repos.is_empty() || !set.copr.is_empty() || !set.modules.is_empty() {
                let data = SystemPackages {
                    format: format.clone(),
                    packages: Vec::new(),
                    repos: repos.clone(),
                    copr: set.copr.clone(),
                    options: Vec::new(),
                    exclude: Vec::new(),
                    modules: set.modules.clone(),
                    keys: set.keys.clone(),
                    host_cmd: None,
                };
                self.steps.push(InstallStep::system_packages(
                    self.key(),
                    Phase::Prepare,
                    data,
                    None,
                ));
            }
            let tdata = serde_json::json!({
                "Packages": set.packages, "Options": set.options, "Repos": [], "Copr": [],
                "Modules": [], "Exclude": set.exclude, "Keys": set.keys,
            });
            let host_cmd = match fmt_def
                .as_ref()
                .and_then(|f| f.phase.as_ref())
                .and_then(|ph| ph.install.as_ref())
                .and_then(|i| i.host.as_ref())
            {
                Some(t) => Some(self.render(
                    &format!("format/{format}/phase.install.host"),
                    &t.value,
                    &tdata,
                )?),
                None => None,
            };
            let uninstall = match fmt_def.as_ref().and_then(|f| f.uninstall_template.as_ref()) {
                Some(t) if !set.packages.is_empty() => Some(self.render(
                    &format!("format/{format}/uninstall_template"),
                    &t.value,
                    &tdata,
                )?),
                _ => None,
            };
            let data = SystemPackages {
                format: format.clone(),
                packages: set.packages.clone(),
                repos,
                copr: set.copr.clone(),
                options: set.options.clone(),
                exclude: set.exclude.clone(),
                modules: set.modules.clone(),
                keys: set.keys.clone(),
                host_cmd: host_cmd.map(|s| s.trim().to_string()),
            };
            self.steps.push(InstallStep::system_packages(
                self.key(),
                Phase::Install,
                data,
                uninstall.map(|s| s.trim().to_string()),
            ));
        }
        Ok(())
    }

    fn local_pkg(&mut self) {
        let Some(map) = &self.def().localpkg else {
            return;
        };
        let Some(fmt) = self.local_pkg_format() else {
            return;
        };
        let Some(src) = map.value.0.get(&fmt) else {
            return;
        };
        let def = self
            .b
            .distro_def
            .as_deref()
            .and_then(|d| effective_distro(self.vocab, d))
            .and_then(|d| d.format.get(&fmt).and_then(|f| f.local_pkg.clone()))
            .unwrap_or_default();
        let step = InstallStep::local_pkg(
            self.key(),
            LocalPkgStep {
                format: fmt,
                source: src.value.clone(),
                glob: def.pkg_glob,
                install_template: def.install_template.map(|t| t.value),
                probe: def.probe,
            },
        );
        self.steps.push(step);
    }

    /// The format used for localpkg: the primary format if it has `local_pkg`,
    /// else any of the box's formats that does (as the original does).
    fn local_pkg_format(&self) -> Option<String> {
        let d = self
            .b
            .distro_def
            .as_deref()
            .and_then(|d| effective_distro(self.vocab, d))?;
        let has = |f: &str| d.format.get(f).is_some_and(|x| x.local_pkg.is_some());
        self.b
            .formats
            .iter()
            .find(|f| has(f))
            .cloned()
            .or_else(|| d.format.keys().find(|f| has(f)).map(str::to_string))
    }

    fn tasks(&mut self) -> Result<(), PlanError> {
        let u = &self.b.user;
        let key = self.key().to_string();
        for (i, t) in self.c.def.task.iter().enumerate() {
            let Some((verb, value)) = t.verbs().into_iter().next() else {
                continue;
            };
            // Target paths never climb: `..` is refused before any walker
            // or host sees the plan (rooted or not, local or SSH).
            let mut paths: Vec<&crate::yaml::Spanned<String>> =
                t.to.as_deref().into_iter().collect();
            if matches!(verb, "mkdir" | "write" | "link" | "setcap") {
                paths.push(value);
            }
            for p in paths {
                if let Some(m) = climbing_path(&p.value) {
                    return Err(PlanError {
                        candy: key.clone(),
                        message: format!(
                            "{}: task #{} ({verb}: {}): {m}",
                            self.at(p.span),
                            i + 1,
                            p.value,
                        ),
                    });
                }
            }
            // What `validate` refuses is refused here too: every command
            // that builds or deploys compiles this plan.
            if verb == "copy"
                && let Some(m) = copy_problem(self.c, &value.value)
            {
                return Err(PlanError {
                    candy: key.clone(),
                    message: format!(
                        "{}: task #{} (copy: {}): {m}",
                        self.at(value.span),
                        i + 1,
                        value.value,
                    ),
                });
            }
            let raw_user = t.user.as_ref().map(|s| s.value.clone()).unwrap_or_else(|| {
                if verb == "build" {
                    "${USER}".into()
                } else {
                    String::new()
                }
            });
            let resolved = resolve_task_user(&raw_user, u);
            match verb {
                "plugin" => {
                    let step = self.plugin_step(i, t, value, raw_user, &resolved)?;
                    self.steps.push(step);
                }
                "write" | "copy" => {
                    let dest = match verb {
                        "write" => value.value.clone(),
                        _ => t.to.as_ref().map(|s| s.value.clone()).unwrap_or_default(),
                    };
                    let default_mode = if verb == "write" { "0644" } else { "0755" };
                    let data = FileStep {
                        verb: verb.into(),
                        path: subst_user(&dest, u),
                        content: (verb == "write").then(|| {
                            t.content
                                .as_ref()
                                .map(|c| c.value.clone())
                                .unwrap_or_default()
                        }),
                        source: (verb == "copy").then(|| value.value.clone()),
                        mode: t
                            .mode
                            .as_ref()
                            .map_or(default_mode.to_string(), |m| m.value.clone()),
                        user: raw_user,
                        task: i,
                    };
                    self.steps.push(InstallStep::file(&key, data));
                }
                _ => {
                    let data = OpStep {
                        verb: verb.into(),
                        value: if verb == "cmd" {
                            value.value.clone()
                        } else {
                            subst_user(&value.value, u)
                        },
                        user: raw_user,
                        to: t.to.as_ref().map(|s| subst_user(&s.value, u)),
                        target: t.target.as_ref().map(|s| subst_user(&s.value, u)),
                        mode: t.mode.as_ref().map(|s| s.value.clone()),
                        extract: t.extract.as_ref().map(|s| s.value.clone()),
                        include: t.include.clone(),
                        strip_components: t.strip_components.as_ref().map(|s| s.value),
                        env: t
                            .env
                            .iter()
                            .map(|(k, v)| (k.value.clone(), v.value.clone()))
                            .collect(),
                        vars: if matches!(verb, "cmd" | "download") {
                            self.c
                                .def
                                .var
                                .iter()
                                .map(|(k, v)| (k.value.clone(), v.value.clone()))
                                .collect()
                        } else {
                            BTreeMap::new()
                        },
                        caps: t.caps.as_ref().map(|s| s.value.clone()),
                        cache: t.cache.0.iter().map(|s| subst_user(&s.value, u)).collect(),
                        comment: t.comment.clone(),
                        task: i,
                    };
                    let mut step = InstallStep::op(&key, data);
                    // Scope follows the resolved user (a box whose user is root runs `${USER}` tasks as root).
                    if is_root_user(&resolved) && step.scope != Scope::System {
                        step.scope = Scope::System;
                        if verb == "cmd" {
                            step.gate = Gate::AllowRootTasks;
                        }
                    }
                    self.steps.push(step);
                }
            }
        }
        Ok(())
    }

    /// A `plugin: <word>` task: an `external:<word>` step (a `step:` word)
    /// or an `external-plugin` step (a `verb:` word) carrying the task's
    /// input. The plugin's declared contract, once the host knows it,
    /// decides scope, venue and gate; before that the task's account
    /// decides the scope. A `context:` without this target's leg (`build`
    /// for images and pods, `deploy` for hosts) skips the step here.
    fn plugin_step(
        &self,
        index: usize,
        t: &crate::model::candy::Task,
        word: &crate::yaml::Spanned<String>,
        user: String,
        resolved: &str,
    ) -> Result<InstallStep, PlanError> {
        let key = self.key();
        let Some(provider) = self.plugins.for_task(&word.value) else {
            return Err(PlanError {
                candy: key.to_string(),
                message: format!(
                    "task #{} at line {}:{}: plugin `{}` is declared by no candy",
                    index + 1,
                    word.span.line,
                    word.span.col,
                    word.value
                ),
            });
        };
        let (kind, class) = match provider.class {
            crate::plugin::ProviderClass::Step => (StepKind::External(word.value.clone()), "step"),
            _ => (StepKind::ExternalPlugin, "verb"),
        };
        let (scope, mut venue, gate) = match self.plugins.contracts.get(&word.value) {
            Some(c) => (c.scope, c.venue, c.gate),
            None if is_root_user(resolved) => (Scope::System, Venue::HostNative, Gate::None),
            None => (Scope::User, Venue::HostNative, Gate::None),
        };
        let context: Vec<&str> = t.context.iter().map(|c| c.value.as_str()).collect();
        let leg = if self.ctx.target.is_container() {
            "build"
        } else {
            "deploy"
        };
        if !context.is_empty() && !context.contains(&leg) {
            venue = Venue::Skip;
        }
        let data = serde_json::json!({
            "word": word.value,
            "class": class,
            "provider": provider.candy,
            "input": t.plugin_input.as_ref().map_or(serde_json::Value::Null, |i| i.to_json()),
            "context": context,
            "user": user,
            "task": index,
        });
        Ok(InstallStep::external(
            key,
            kind,
            scope,
            venue,
            gate,
            ExternalStep { data },
        ))
    }

    fn builders(&mut self) {
        let key = self.key().to_string();
        for (builder, image) in &self.b.builders {
            let Some(def) = self.vocab.builder.get(builder) else {
                continue;
            };
            let manifest = def.detect_file.iter().find(|f| self.c.has_file(f)).cloned();
            let aur = cascade::aur(self.def());
            let data = BuilderStep {
                builder: builder.clone(),
                image: self.ctx.builder_image.clone().or_else(|| image.clone()),
                manifest: manifest.clone(),
                source: crate::naming::candy_key_dir(self.c),
                path: def
                    .path_contribution
                    .iter()
                    .map(|p| home_token(p))
                    .collect(),
                env: def
                    .runtime_env
                    .iter()
                    .map(|(k, v)| (k.value.clone(), home_token(v)))
                    .collect(),
                artifacts: def
                    .copy_artifact
                    .iter()
                    .map(|a| (a.src.clone(), a.dst.clone()))
                    .collect(),
                packages: if builder == "aur" {
                    aur.packages
                } else {
                    Vec::new()
                },
            };
            let npm = manifest
                .as_deref()
                .filter(|m| *m == "package.json")
                .and_then(|m| self.c.small_files.get(m))
                .map(|text| npm_dependencies(text))
                .unwrap_or_default();
            let cargo = self
                .c
                .small_files
                .get("Cargo.toml")
                .and_then(|t| cargo_package_name(t))
                .into_iter()
                .collect();
            self.steps
                .push(InstallStep::builder(&key, data, npm, cargo));
        }
    }

    fn services(&mut self) -> Result<(), PlanError> {
        let key = self.key().to_string();
        let host = !self.ctx.target.is_container();
        let init = if host {
            Some("systemd".to_string())
        } else {
            self.container_init()
        };
        let services: Vec<&Service> = self
            .c
            .def
            .service
            .iter()
            .filter(|s| s.applies_to(&self.b.tags))
            .collect();
        for s in &services {
            let scope = match s.scope.as_ref().map(|x| x.value.as_str()) {
                Some("user") => Scope::User,
                _ => Scope::System,
            };
            let has_packaged = services
                .iter()
                .any(|o| o.name.value == s.name.value && o.use_packaged.is_some());
            let has_exec = services
                .iter()
                .any(|o| o.name.value == s.name.value && o.exec.is_some());
            if let Some(unit) = &s.use_packaged {
                // Packaged wins on hosts; under supervisord the exec form wins.
                if !host && has_exec {
                    continue;
                }
                let supports = init
                    .as_deref()
                    .and_then(|i| self.vocab.init.get(i))
                    .and_then(|i| i.service_schema.as_ref())
                    .is_some_and(|sc| sc.supports_packaged);
                if !host && !supports {
                    continue;
                }
                let unit = if unit.value.contains('.') {
                    unit.value.clone()
                } else {
                    format!("{}.service", unit.value)
                };
                self.steps.push(InstallStep::service_packaged(
                    &key,
                    scope,
                    ServicePackagedStep {
                        name: s.name.value.clone(),
                        unit,
                        enable: s.enable.unwrap_or(true),
                    },
                ));
            } else if let Some(exec) = &s.exec {
                if host && has_packaged {
                    continue;
                }
                let Some(init_name) = init.clone() else {
                    continue;
                };
                let Some(schema) = self
                    .vocab
                    .init
                    .get(&init_name)
                    .and_then(|i| i.service_schema.clone())
                else {
                    continue;
                };
                let Some(tmpl) = schema.service_template.as_ref() else {
                    continue;
                };
                let unit = format!("charly-{key}-{}", s.name.value);
                let name = if init_name == "systemd" {
                    unit.clone()
                } else {
                    s.name.value.clone()
                };
                let data = service_data(&key, &name, exec, s, scope);
                let text = self.render(
                    &format!("init/{init_name}/service_template"),
                    &tmpl.value,
                    &data,
                )?;
                let path = match schema.unit_path_template.as_ref() {
                    Some(pt) => {
                        let pd = serde_json::json!({"Scope": scope_name(scope), "Home": HOME_TOKEN, "Name": unit});
                        Some(
                            self.render(
                                &format!("init/{init_name}/unit_path_template"),
                                &pt.value,
                                &pd,
                            )?
                            .trim()
                            .to_string(),
                        )
                    }
                    None => None,
                };
                self.steps.push(InstallStep::service_custom(
                    &key,
                    scope,
                    ServiceCustomStep {
                        name: s.name.value.clone(),
                        unit,
                        init: init_name,
                        text,
                        path,
                        enable: s.enable.unwrap_or(true),
                    },
                ));
            }
        }
        Ok(())
    }

    /// The init system for an image: among inits whose capability needs are
    /// met (systemd needs `preserve_user`), prefer systemd when the box keeps
    /// the base user, then supervisord, then by name.
    fn container_init(&self) -> Option<String> {
        // The capability the Containerfile reads too: a box that keeps its
        // base's user may run systemd.
        let preserve = self.b.preserve_user;
        let mut names: Vec<&String> = self
            .vocab
            .init
            .iter()
            .filter(|(_, i)| {
                i.requires_capability
                    .iter()
                    .all(|c| c == "preserve_user" && preserve)
            })
            .map(|(n, _)| n)
            .collect();
        names.sort_by_key(|n| {
            let rank = match n.as_str() {
                "systemd" if preserve => 0,
                "supervisord" => 1,
                _ => 2,
            };
            (rank, n.as_str().to_string())
        });
        names.first().map(|s| s.to_string())
    }

    fn snippets(&mut self) {
        let Some(sh) = &self.c.def.shell else { return };
        let key = self.key().to_string();
        let host = !self.ctx.target.is_container();
        for shell in ["bash", "zsh", "fish", "sh"] {
            let ov = match shell {
                "bash" => sh.bash.as_ref(),
                "zsh" => sh.zsh.as_ref(),
                "fish" => sh.fish.as_ref(),
                _ => sh.sh.as_ref(),
            };
            let init = ov
                .and_then(|o| o.init.as_ref().map(|s| s.value.clone()))
                .or_else(|| {
                    sh.init
                        .as_ref()
                        .map(|s| s.value.replace("${SHELL_NAME}", shell))
                });
            let paths: Vec<String> = ov
                .filter(|o| !o.path_append.is_empty())
                .map(|o| o.path_append.clone())
                .unwrap_or_else(|| sh.path_append.clone());
            if init.is_none() && paths.is_empty() {
                continue;
            }
            let mut text = init.unwrap_or_default();
            for p in &paths {
                if !text.is_empty() && !text.ends_with('\n') {
                    text.push('\n');
                }
                // `~` does not expand inside quotes: use $HOME, which the
                // shell expands at login for whichever user logs in.
                let p = shell_home(p);
                if shell == "fish" {
                    text.push_str(&format!("fish_add_path -gP \"{p}\"\n"));
                } else {
                    text.push_str(&format!("export PATH=\"$PATH:{p}\"\n"));
                }
            }
            let path_override = ov.and_then(|o| o.path.clone()).or_else(|| sh.path.clone());
            let (destination, managed_block) = if let Some(p) = path_override {
                (home_token(&p), false)
            } else if host {
                match shell {
                    "bash" => (format!("{HOME_TOKEN}/.bashrc"), true),
                    "zsh" => (format!("{HOME_TOKEN}/.zshrc"), true),
                    "sh" => (format!("{HOME_TOKEN}/.profile"), true),
                    _ => (
                        format!("{HOME_TOKEN}/.config/fish/conf.d/charly-{key}.fish"),
                        false,
                    ),
                }
            } else if shell == "fish" {
                (format!("/etc/fish/conf.d/charly-{key}.fish"), false)
            } else {
                // Every POSIX login shell sources all of /etc/profile.d/*.sh,
                // so each shell's snippet is guarded to run in that shell
                // only (the original writes them unguarded, and a bash login
                // then also runs the zsh and sh variants).
                text = guard_for_shell(shell, &text);
                (format!("/etc/profile.d/charly-{key}-{shell}.sh"), false)
            };
            self.steps.push(InstallStep::shell_snippet(
                &key,
                ShellSnippetStep {
                    shell: shell.into(),
                    text,
                    destination,
                    managed_block,
                    path: paths.iter().map(|p| home_token(p)).collect(),
                },
            ));
        }
    }

    fn apk(&mut self) {
        if let Some(a) = &self.c.def.apk {
            let mut s = InstallStep::apk(self.key(), ApkStep { apk: a.to_json() });
            if self.ctx.target.is_container() {
                s.venue = Venue::Skip;
            }
            self.steps.push(s);
        }
    }

    fn render(
        &self,
        name: &str,
        text: &str,
        data: &serde_json::Value,
    ) -> Result<String, PlanError> {
        crate::template::render(name, text, data).map_err(|e| PlanError {
            candy: self.key().to_string(),
            message: e.to_string(),
        })
    }
}

fn scope_name(s: Scope) -> &'static str {
    match s {
        Scope::System => "system",
        Scope::User | Scope::UserProfile => "user",
    }
}

/// The data a service template sees.
pub fn service_data(
    candy: &str,
    name: &str,
    exec: &crate::yaml::Spanned<String>,
    s: &Service,
    scope: Scope,
) -> serde_json::Value {
    let env: Vec<serde_json::Value> = s
        .env
        .iter()
        .map(|(k, v)| serde_json::json!({"Key": k.value, "Value": v}))
        .collect();
    serde_json::json!({
        "Layer": candy,
        "Name": name,
        "Exec": exec.value,
        "Restart": s.restart.clone().unwrap_or_default(),
        "User": s.user.clone().unwrap_or_default(),
        "WorkingDirectory": s.working_directory.clone().unwrap_or_default(),
        "EnvList": env,
        "After": s.after.0,
        "Before": s.before.0,
        "WantedBy": s.wanted_by.0,
        "Scope": scope_name(scope),
        "Kind": s.kind.clone().unwrap_or_default(),
        "Events": s.event.as_ref().map(|e| e.0.join(",")).unwrap_or_default(),
        "AutoStart": s.auto_start.map(|b| vec![b]),
        "StartRetries": s.start_retry.clone().unwrap_or_default(),
        "StartSecs": s.start_sec.clone().unwrap_or_default(),
        "ExitCodes": s.exit_code.clone().unwrap_or_default(),
        "StopSignal": s.stop_signal.clone().unwrap_or_default(),
        "StopTimeout": s.stop_timeout.clone().unwrap_or_default(),
        "Priority": s.priority.clone().unwrap_or_default(),
        "Stdout": s.stdout.clone().unwrap_or_default(),
    })
}

/// `dependencies` of a package.json, as `name` or `name@version` (as `npm install -g` takes them).
pub fn npm_dependencies(text: &str) -> Vec<String> {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(text) else {
        return Vec::new();
    };
    let Some(deps) = v.get("dependencies").and_then(|d| d.as_object()) else {
        return Vec::new();
    };
    deps.keys().cloned().collect()
}

/// `[package] name` of a Cargo.toml (a line scan: charly needs only the name).
pub fn cargo_package_name(text: &str) -> Option<String> {
    let mut in_pkg = false;
    for line in text.lines() {
        let l = line.trim();
        if l.starts_with('[') {
            in_pkg = l == "[package]";
            continue;
        }
        if in_pkg
            && let Some(rest) = l.strip_prefix("name")
            && let Some(v) = rest.trim_start().strip_prefix('=')
        {
            return Some(v.trim().trim_matches('"').to_string());
        }
    }
    None
}
