//! The InstallPlan IR: what installing a candy on a target means, as data.
//!
//! Every consumer reads this one IR: the Containerfile emitter (target
//! `oci`), the build graph (plan nodes are keyed by it) and the deploy
//! walkers (local, vm, pod, k8s). A step is its kind-specific data plus four
//! derived properties that decide how it is applied:
//!
//! * **scope** — who it touches: the system, the box user, or the user's
//!   login profile;
//! * **venue** — where it runs: natively on the target, in a builder
//!   container (whose artifact is then shipped), or nowhere;
//! * **gate** — the opt-in it needs (`--allow-repo-changes`,
//!   `--allow-root-tasks`, `--with-services`; `--yes` enables all);
//! * **reverse** — the typed operations that undo it, recorded in the ledger
//!   and replayed LIFO by `bundle del`.
//!
//! The derivation rules live in the constructors of [`InstallStep`], so a
//! step can never carry a scope or gate that disagrees with its data. Fields
//! that depend on the target's home directory carry the literal token
//! [`HOME_TOKEN`] until [`InstallPlan::resolve_home`] replaces it once per
//! target; command and file bodies are never rewritten.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// Placeholder for the target user's home directory.
pub const HOME_TOKEN: &str = "{{.Home}}";

/// Who a step touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scope {
    /// The system (root; sudo on a host).
    System,
    /// The box user (files in the home, user services).
    User,
    /// The user's login profile (env, rc files).
    UserProfile,
}

/// Where a step runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Venue {
    /// On the target itself.
    HostNative,
    /// In a builder container; its artifact is shipped to the target.
    ContainerBuilder,
    /// Not applied on this target.
    Skip,
}

/// Package phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Repositories and keys.
    Prepare,
    /// The packages.
    Install,
    /// After install.
    Cleanup,
}

/// The opt-in a step needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Gate {
    /// Always applied.
    None,
    /// `--allow-repo-changes`.
    AllowRepoChanges,
    /// `--allow-root-tasks`.
    AllowRootTasks,
    /// `--with-services`.
    WithServices,
}

/// Which gates are open for a deploy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gates {
    /// `--allow-repo-changes`.
    pub allow_repo_changes: bool,
    /// `--allow-root-tasks`.
    pub allow_root_tasks: bool,
    /// `--with-services`.
    pub with_services: bool,
}

impl Gates {
    /// `--yes`: every gate open.
    pub fn all() -> Self {
        Gates {
            allow_repo_changes: true,
            allow_root_tasks: true,
            with_services: true,
        }
    }

    /// Whether a step with this gate may run.
    pub fn allows(&self, g: Gate) -> bool {
        match g {
            Gate::None => true,
            Gate::AllowRepoChanges => self.allow_repo_changes,
            Gate::AllowRootTasks => self.allow_root_tasks,
            Gate::WithServices => self.with_services,
        }
    }
}

/// The kind of a step: thirteen built-in kinds plus the open `external:<word>` family.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StepKind {
    /// Distro packages.
    SystemPackages,
    /// A builder (npm, pixi, cargo, aur) run in a builder container.
    Builder,
    /// A task operation (cmd, mkdir, link, download, setcap, build).
    Op,
    /// A file placed on the target (write, copy).
    File,
    /// A packaged service unit enabled.
    ServicePackaged,
    /// A charly-generated service unit.
    ServiceCustom,
    /// Environment and PATH for the login profile.
    ShellHook,
    /// A shell init snippet.
    ShellSnippet,
    /// A repository change on its own.
    RepoChange,
    /// Android packages.
    ApkInstall,
    /// A locally built package installed.
    LocalPkgInstall,
    /// A reboot request.
    Reboot,
    /// A step handled by an external plugin.
    ExternalPlugin,
    /// `external:<word>`: carried opaquely with its declared properties.
    External(String),
}

impl StepKind {
    /// The kebab-case name (`system-packages`, `external:foo`).
    pub fn as_str(&self) -> String {
        match self {
            StepKind::SystemPackages => "system-packages".into(),
            StepKind::Builder => "builder".into(),
            StepKind::Op => "op".into(),
            StepKind::File => "file".into(),
            StepKind::ServicePackaged => "service-packaged".into(),
            StepKind::ServiceCustom => "service-custom".into(),
            StepKind::ShellHook => "shell-hook".into(),
            StepKind::ShellSnippet => "shell-snippet".into(),
            StepKind::RepoChange => "repo-change".into(),
            StepKind::ApkInstall => "apk-install".into(),
            StepKind::LocalPkgInstall => "local-pkg-install".into(),
            StepKind::Reboot => "reboot".into(),
            StepKind::ExternalPlugin => "external-plugin".into(),
            StepKind::External(w) => format!("external:{w}"),
        }
    }

    /// Parses a kind name.
    pub fn parse(s: &str) -> Option<StepKind> {
        Some(match s {
            "system-packages" => StepKind::SystemPackages,
            "builder" => StepKind::Builder,
            "op" => StepKind::Op,
            "file" => StepKind::File,
            "service-packaged" => StepKind::ServicePackaged,
            "service-custom" => StepKind::ServiceCustom,
            "shell-hook" => StepKind::ShellHook,
            "shell-snippet" => StepKind::ShellSnippet,
            "repo-change" => StepKind::RepoChange,
            "apk-install" => StepKind::ApkInstall,
            "local-pkg-install" => StepKind::LocalPkgInstall,
            "reboot" => StepKind::Reboot,
            "external-plugin" => StepKind::ExternalPlugin,
            other => {
                let w = other.strip_prefix("external:")?;
                if w.is_empty()
                    || !w
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                {
                    return None;
                }
                StepKind::External(w.to_string())
            }
        })
    }
}

impl fmt::Display for StepKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.as_str())
    }
}

impl Serialize for StepKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.as_str())
    }
}

impl<'de> Deserialize<'de> for StepKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        StepKind::parse(&s)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown step kind `{s}`")))
    }
}

/// The kinds of reverse operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReverseKind {
    /// Remove packages (`uninstall_cmd` holds the rendered command).
    PackageRemove,
    /// Disable COPR projects.
    CoprDisable,
    /// Remove a repository file.
    RemoveRepoFile,
    /// Remove a pixi environment.
    PixiEnvRemove,
    /// `cargo uninstall` crates.
    CargoUninstall,
    /// `npm uninstall -g` packages.
    NpmUninstallG,
    /// Remove the files a builder artifact or an unpacked download created
    /// (the host records which as it places them).
    RemoveArtifactFiles,
    /// Remove a system file.
    RmFileSystem,
    /// Remove a user file.
    RmFileUser,
    /// Remove a directory tree.
    RmDirRecursive,
    /// Remove a managed block from an rc file.
    RemoveManagedBlock,
    /// Remove an env.d file.
    RemoveEnvdFile,
    /// Disable a service.
    ServiceDisable,
    /// Restore a unit's previous enabled state.
    RestoreEnabled,
    /// Remove a drop-in.
    RemoveDropin,
    /// Remove a generated unit file.
    ServiceRemove,
    /// Run the teardown script a plugin reported (`extra.script`), as
    /// root for system scope, else as the user.
    PluginScript,
    /// Put back the capabilities files had before a `setcap` task (none:
    /// removed); a host reads them before the change.
    RestoreCaps,
    /// Reset modules a prepare phase enabled (`dnf module reset`).
    ModuleReset,
}

/// One typed undo operation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReverseOp {
    /// What to do.
    pub kind: ReverseKind,
    /// Package format, for package operations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
    /// Packages, paths, units…
    #[serde(default)]
    pub targets: Vec<String>,
    /// Scope it runs in.
    pub scope: Scope,
    /// Extra facts (`layer`, `shell`, `marker`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, String>,
    /// Rendered uninstall command, when known at plan time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uninstall_cmd: Option<String>,
}

impl ReverseOp {
    /// A reverse op with just kind, targets and scope.
    pub fn new(kind: ReverseKind, targets: Vec<String>, scope: Scope) -> Self {
        ReverseOp {
            kind,
            format: None,
            targets,
            scope,
            extra: BTreeMap::new(),
            uninstall_cmd: None,
        }
    }

    /// Adds an extra fact.
    #[must_use]
    pub fn with(mut self, k: &str, v: &str) -> Self {
        self.extra.insert(k.to_string(), v.to_string());
        self
    }
}

/// Distro packages for one format.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SystemPackages {
    /// Package format (rpm, deb, pac, aur).
    pub format: String,
    /// Packages.
    #[serde(default)]
    pub packages: Vec<String>,
    /// Repositories (maps of strings).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub repos: Vec<BTreeMap<String, String>>,
    /// COPR projects.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub copr: Vec<String>,
    /// Installer options.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
    /// Excluded packages.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,
    /// Modules.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub modules: Vec<String>,
    /// Signing keys.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<String>,
    /// The host install command (rendered `phase.install.host`), when the format has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_cmd: Option<String>,
}

/// A builder run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuilderStep {
    /// Builder type.
    pub builder: String,
    /// Builder box (qualified) or image override.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The detected manifest (`package.json`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest: Option<String>,
    /// The candy directory, project-relative.
    pub source: String,
    /// Paths the artifact contributes to PATH.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub path: Vec<String>,
    /// Environment the artifact needs.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// `src → dst` copied out of the builder.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<(String, String)>,
    /// Packages (aur).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub packages: Vec<String>,
}

/// A task operation other than placing a file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpStep {
    /// `cmd`, `mkdir`, `link`, `download`, `setcap` or `build`.
    pub verb: String,
    /// The verb's value (command body, path, URL…), `~`/`${HOME}` as the home token except in cmd bodies.
    pub value: String,
    /// The user as written (`root`, `${USER}`, `1000:1000`…).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub user: String,
    /// Destination (download).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// Link target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Archive kind (download).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extract: Option<String>,
    /// Members to extract.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub include: Vec<String>,
    /// `--strip-components`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strip_components: Option<u32>,
    /// Task environment.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// The candy's `var:` values (cmd and download): in an image they are
    /// `ENV` lines before the candy's steps; on a host, the command's
    /// environment.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub vars: BTreeMap<String, String>,
    /// Capabilities (setcap); none means remove.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caps: Option<String>,
    /// Cache directories.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cache: Vec<String>,
    /// Comment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
    /// Index of the task in the candy (0-based).
    pub task: usize,
}

impl OpStep {
    /// The archive kind of a `download`: its `extract:`, else by the URL's
    /// ending (`tar.gz` for `.tar.gz`/`.tgz`, else `none`), as the image
    /// build decides; `sh` is an installer script.
    pub fn download_kind(&self) -> String {
        self.extract.clone().unwrap_or_else(|| {
            if self.value.ends_with(".tar.gz") || self.value.ends_with(".tgz") {
                "tar.gz".into()
            } else {
                "none".into()
            }
        })
    }
}

/// A file placed on the target.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStep {
    /// `write` or `copy`.
    pub verb: String,
    /// Destination.
    pub path: String,
    /// Inline content (write).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Source, candy-relative (copy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Mode (`0644` for write, `0755` for copy by default).
    pub mode: String,
    /// The user as written.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub user: String,
    /// Index of the task in the candy (0-based).
    pub task: usize,
}

/// A packaged unit enabled.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServicePackagedStep {
    /// Service name.
    pub name: String,
    /// Unit (`sshd.service`).
    pub unit: String,
    /// Enable at boot.
    pub enable: bool,
}

/// A generated service.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceCustomStep {
    /// Service name as written.
    pub name: String,
    /// Unit name (`charly-<candy>-<name>`).
    pub unit: String,
    /// Init system it is rendered for (`systemd`, `supervisord`).
    pub init: String,
    /// Rendered unit or program text.
    pub text: String,
    /// Where the unit goes (systemd), if anywhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Enable at boot.
    pub enable: bool,
}

/// Environment and PATH for the login profile.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShellHookStep {
    /// Variables (sorted by name).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// PATH entries, prepended in order.
    #[serde(default)]
    pub path: Vec<String>,
    /// The env.d file written on hosts.
    pub env_file: String,
}

/// One shell's init snippet.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShellSnippetStep {
    /// `bash`, `zsh`, `fish` or `sh`.
    pub shell: String,
    /// The snippet.
    pub text: String,
    /// Where it goes.
    pub destination: String,
    /// A managed block inside an rc file (hosts) rather than a whole file.
    pub managed_block: bool,
    /// PATH entries it adds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub path: Vec<String>,
}

/// A repository change on its own.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepoChangeStep {
    /// Format.
    pub format: String,
    /// Repositories.
    #[serde(default)]
    pub repos: Vec<BTreeMap<String, String>>,
    /// COPR projects.
    #[serde(default)]
    pub copr: Vec<String>,
}

/// Android packages (kept as written).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ApkStep {
    /// The `apk:` entries.
    pub apk: serde_json::Value,
}

/// A local package installed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalPkgStep {
    /// Format.
    pub format: String,
    /// Source directory as written.
    pub source: String,
    /// Package glob.
    pub glob: String,
    /// The format's `local_pkg.install_template` (`.StageDir`, `.Glob`):
    /// how a host installs the staged packages (none: the built-in
    /// install of the format).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub install_template: Option<String>,
    /// The format's `local_pkg.probe`: a command that fails on a host
    /// that cannot install the format; it gates the install there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<String>,
}

/// A reboot request.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RebootStep {}

/// An opaque external step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ExternalStep {
    /// Whatever the plugin needs.
    #[serde(default)]
    pub data: serde_json::Value,
}

/// Kind-specific data of a step.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum StepData {
    /// See [`SystemPackages`].
    SystemPackages(SystemPackages),
    /// See [`BuilderStep`].
    Builder(BuilderStep),
    /// See [`OpStep`].
    Op(OpStep),
    /// See [`FileStep`].
    File(FileStep),
    /// See [`ServicePackagedStep`].
    ServicePackaged(ServicePackagedStep),
    /// See [`ServiceCustomStep`].
    ServiceCustom(ServiceCustomStep),
    /// See [`ShellHookStep`].
    ShellHook(ShellHookStep),
    /// See [`ShellSnippetStep`].
    ShellSnippet(ShellSnippetStep),
    /// See [`RepoChangeStep`].
    RepoChange(RepoChangeStep),
    /// See [`ApkStep`].
    ApkInstall(ApkStep),
    /// See [`LocalPkgStep`].
    LocalPkgInstall(LocalPkgStep),
    /// See [`RebootStep`].
    Reboot(RebootStep),
    /// See [`ExternalStep`] (both `external-plugin` and `external:<word>`).
    External(ExternalStep),
}

/// One step of a plan.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct InstallStep {
    /// The candy it comes from.
    pub candy: String,
    /// Its kind.
    pub kind: StepKind,
    /// Who it touches.
    pub scope: Scope,
    /// Where it runs.
    pub venue: Venue,
    /// The opt-in it needs.
    pub gate: Gate,
    /// Package phase, for package steps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// How to undo it.
    pub reverse: Vec<ReverseOp>,
    /// Kind-specific fields.
    #[serde(flatten)]
    pub data: StepData,
}

impl<'de> Deserialize<'de> for InstallStep {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        #[derive(Deserialize)]
        struct Head {
            candy: String,
            kind: StepKind,
            scope: Scope,
            venue: Venue,
            gate: Gate,
            #[serde(default)]
            phase: Option<Phase>,
            #[serde(default)]
            reverse: Vec<ReverseOp>,
        }
        let v = serde_json::Value::deserialize(d)?;
        let h: Head = serde_json::from_value(v.clone()).map_err(D::Error::custom)?;
        fn de<T: serde::de::DeserializeOwned, E: Error>(v: serde_json::Value) -> Result<T, E> {
            serde_json::from_value(v).map_err(E::custom)
        }
        let data = match &h.kind {
            StepKind::SystemPackages => StepData::SystemPackages(de(v)?),
            StepKind::Builder => StepData::Builder(de(v)?),
            StepKind::Op => StepData::Op(de(v)?),
            StepKind::File => StepData::File(de(v)?),
            StepKind::ServicePackaged => StepData::ServicePackaged(de(v)?),
            StepKind::ServiceCustom => StepData::ServiceCustom(de(v)?),
            StepKind::ShellHook => StepData::ShellHook(de(v)?),
            StepKind::ShellSnippet => StepData::ShellSnippet(de(v)?),
            StepKind::RepoChange => StepData::RepoChange(de(v)?),
            StepKind::ApkInstall => StepData::ApkInstall(de(v)?),
            StepKind::LocalPkgInstall => StepData::LocalPkgInstall(de(v)?),
            StepKind::Reboot => StepData::Reboot(RebootStep {}),
            StepKind::ExternalPlugin | StepKind::External(_) => StepData::External(de(v)?),
        };
        Ok(InstallStep {
            candy: h.candy,
            kind: h.kind,
            scope: h.scope,
            venue: h.venue,
            gate: h.gate,
            phase: h.phase,
            reverse: h.reverse,
            data,
        })
    }
}

/// Directories whose contents belong to the system.
pub const SYSTEM_PREFIXES: [&str; 11] = [
    "/etc", "/usr", "/var", "/opt", "/root", "/boot", "/srv", "/run", "/lib", "/sbin", "/bin",
];

/// Whether a destination path is system-owned (as the original decides it).
pub fn is_system_path(p: &str) -> bool {
    SYSTEM_PREFIXES
        .iter()
        .any(|pre| p == *pre || p.strip_prefix(pre).is_some_and(|r| r.starts_with('/')))
}

/// Whether a task user means root (`""`, `root`, `0`, `0:0`).
pub fn is_root_user(u: &str) -> bool {
    matches!(u, "" | "root" | "0" | "0:0")
}

fn file_reverse(path: &str, scope: Scope) -> ReverseOp {
    let kind = if scope == Scope::System {
        ReverseKind::RmFileSystem
    } else {
        ReverseKind::RmFileUser
    };
    ReverseOp::new(kind, vec![path.to_string()], scope)
}

impl InstallStep {
    /// A host-native, ungated step of `data`'s kind, undone by `reverse`;
    /// [`InstallStep::at`], [`InstallStep::gated`] and
    /// [`InstallStep::in_phase`] say otherwise.
    fn host(candy: &str, scope: Scope, data: StepData, reverse: Vec<ReverseOp>) -> Self {
        let kind = match &data {
            StepData::SystemPackages(_) => StepKind::SystemPackages,
            StepData::Builder(_) => StepKind::Builder,
            StepData::Op(_) => StepKind::Op,
            StepData::File(_) => StepKind::File,
            StepData::ServicePackaged(_) => StepKind::ServicePackaged,
            StepData::ServiceCustom(_) => StepKind::ServiceCustom,
            StepData::ShellHook(_) => StepKind::ShellHook,
            StepData::ShellSnippet(_) => StepKind::ShellSnippet,
            StepData::RepoChange(_) => StepKind::RepoChange,
            StepData::ApkInstall(_) => StepKind::ApkInstall,
            StepData::LocalPkgInstall(_) => StepKind::LocalPkgInstall,
            StepData::Reboot(_) => StepKind::Reboot,
            StepData::External(_) => StepKind::ExternalPlugin,
        };
        InstallStep {
            candy: candy.to_string(),
            kind,
            scope,
            venue: Venue::HostNative,
            gate: Gate::None,
            phase: None,
            reverse,
            data,
        }
    }

    /// The step, run at `venue`.
    fn at(mut self, venue: Venue) -> Self {
        self.venue = venue;
        self
    }

    /// The step, behind `gate`.
    fn gated(mut self, gate: Gate) -> Self {
        self.gate = gate;
        self
    }

    /// The step, in `phase`.
    fn in_phase(mut self, phase: Phase) -> Self {
        self.phase = Some(phase);
        self
    }

    /// Packages: always system scope and host-native. The prepare phase
    /// (repos, copr, modules) needs `allow-repo-changes` and reverses to
    /// copr-disable / remove-repo-file; the install phase is ungated and
    /// reverses to package-remove (with the rendered uninstall command).
    pub fn system_packages(
        candy: &str,
        phase: Phase,
        data: SystemPackages,
        uninstall_cmd: Option<String>,
    ) -> Self {
        let gate = if phase == Phase::Prepare
            && (!data.repos.is_empty() || !data.copr.is_empty() || !data.modules.is_empty())
        {
            Gate::AllowRepoChanges
        } else {
            Gate::None
        };
        let mut reverse = Vec::new();
        match phase {
            Phase::Prepare => {
                if !data.copr.is_empty() {
                    reverse.push(ReverseOp::new(
                        ReverseKind::CoprDisable,
                        data.copr.clone(),
                        Scope::System,
                    ));
                }
                for r in &data.repos {
                    if let Some(name) = r.get("name") {
                        let mut op = ReverseOp::new(
                            ReverseKind::RemoveRepoFile,
                            vec![name.clone()],
                            Scope::System,
                        )
                        .with("layer", candy)
                        .with("format", &data.format);
                        op.format = Some(data.format.clone());
                        reverse.push(op);
                    }
                }
                if !data.modules.is_empty() {
                    reverse.push(ReverseOp::new(
                        ReverseKind::ModuleReset,
                        data.modules.clone(),
                        Scope::System,
                    ));
                }
            }
            Phase::Install if !data.packages.is_empty() => {
                let mut op = ReverseOp::new(
                    ReverseKind::PackageRemove,
                    data.packages.clone(),
                    Scope::System,
                );
                op.format = Some(data.format.clone());
                op.uninstall_cmd = uninstall_cmd;
                reverse.push(op);
            }
            _ => {}
        }
        Self::host(
            candy,
            Scope::System,
            StepData::SystemPackages(data),
            reverse,
        )
        .gated(gate)
        .in_phase(phase)
    }

    /// A builder: aur builds system packages (system scope), pixi/npm/cargo
    /// install into the user's home (user scope); always in a builder container.
    pub fn builder(
        candy: &str,
        data: BuilderStep,
        npm_packages: Vec<String>,
        cargo_crates: Vec<String>,
    ) -> Self {
        let scope = if data.builder == "aur" {
            Scope::System
        } else {
            Scope::User
        };
        let reverse = match data.builder.as_str() {
            "aur" => {
                let mut op = ReverseOp::new(
                    ReverseKind::PackageRemove,
                    data.packages.clone(),
                    Scope::System,
                );
                op.format = Some("pac".into());
                vec![op]
            }
            "pixi" => vec![
                ReverseOp::new(ReverseKind::PixiEnvRemove, vec!["default".into()], scope)
                    .with("layer", candy),
            ],
            "npm" if !npm_packages.is_empty() => vec![ReverseOp::new(
                ReverseKind::NpmUninstallG,
                npm_packages,
                scope,
            )],
            "cargo" if !cargo_crates.is_empty() => vec![ReverseOp::new(
                ReverseKind::CargoUninstall,
                cargo_crates,
                scope,
            )],
            _ => Vec::new(),
        };
        let mut reverse = reverse;
        if data.builder != "aur" {
            // Whatever else the artifact unpacked is removed by its recorded file list.
            reverse.push(
                ReverseOp::new(ReverseKind::RemoveArtifactFiles, Vec::new(), scope)
                    .with("builder", &data.builder)
                    .with("layer", candy),
            );
        }
        Self::host(candy, scope, StepData::Builder(data), reverse).at(Venue::ContainerBuilder)
    }

    /// A task operation: scope from the resolved user; a root `cmd` needs
    /// `allow-root-tasks` (a root mkdir does not). Links and downloads
    /// reverse to removing what they created.
    pub fn op(candy: &str, data: OpStep) -> Self {
        let scope = if is_root_user(&data.user) {
            Scope::System
        } else {
            Scope::User
        };
        let gate = if scope == Scope::System && data.verb == "cmd" {
            Gate::AllowRootTasks
        } else {
            Gate::None
        };
        let reverse = match data.verb.as_str() {
            "link" => vec![file_reverse(&data.value, scope)],
            // A plain file at `to`; an archive's files under `to` (what it
            // unpacked, as for an artifact); an installer script (`sh`)
            // has nothing to reverse.
            "download" => match (&data.to, data.download_kind().as_str()) {
                (Some(to), "none") => vec![file_reverse(to, scope)],
                (_, "sh") | (None, _) => Vec::new(),
                (Some(to), _) => vec![
                    ReverseOp::new(ReverseKind::RemoveArtifactFiles, vec![to.clone()], scope)
                        .with("verb", "download"),
                ],
            },
            "setcap" => vec![ReverseOp::new(
                ReverseKind::RestoreCaps,
                vec![data.value.clone()],
                Scope::System,
            )],
            _ => Vec::new(),
        };
        Self::host(candy, scope, StepData::Op(data), reverse).gated(gate)
    }

    /// A file: system scope when the destination is under a system directory.
    pub fn file(candy: &str, data: FileStep) -> Self {
        let scope = if is_system_path(&data.path) {
            Scope::System
        } else {
            Scope::User
        };
        let reverse = vec![file_reverse(&data.path, scope)];
        Self::host(candy, scope, StepData::File(data), reverse)
    }

    /// A packaged service: the entry's scope, gated by `with-services`.
    pub fn service_packaged(candy: &str, scope: Scope, data: ServicePackagedStep) -> Self {
        let reverse = vec![
            ReverseOp::new(ReverseKind::ServiceDisable, vec![data.unit.clone()], scope),
            ReverseOp::new(ReverseKind::RestoreEnabled, vec![data.unit.clone()], scope),
            ReverseOp::new(ReverseKind::RemoveDropin, vec![data.unit.clone()], scope),
        ];
        Self::host(candy, scope, StepData::ServicePackaged(data), reverse).gated(Gate::WithServices)
    }

    /// A generated service: the entry's scope, gated by `with-services`.
    pub fn service_custom(candy: &str, scope: Scope, data: ServiceCustomStep) -> Self {
        let mut reverse = vec![ReverseOp::new(
            ReverseKind::ServiceDisable,
            vec![data.unit.clone()],
            scope,
        )];
        if let Some(p) = &data.path {
            reverse.push(ReverseOp::new(
                ReverseKind::ServiceRemove,
                vec![p.clone()],
                scope,
            ));
        }
        Self::host(candy, scope, StepData::ServiceCustom(data), reverse).gated(Gate::WithServices)
    }

    /// Env and PATH: always the user's profile.
    pub fn shell_hook(candy: &str, data: ShellHookStep) -> Self {
        let reverse = vec![
            ReverseOp::new(
                ReverseKind::RemoveEnvdFile,
                vec![data.env_file.clone()],
                Scope::UserProfile,
            ),
            ReverseOp::new(
                ReverseKind::RemoveManagedBlock,
                Vec::new(),
                Scope::UserProfile,
            )
            .with("layer", candy)
            .with("marker", &format!("charly-env:{candy}")),
        ];
        Self::host(
            candy,
            Scope::UserProfile,
            StepData::ShellHook(data),
            reverse,
        )
    }

    /// A shell snippet: system scope for a system drop-in, else the user's profile.
    pub fn shell_snippet(candy: &str, data: ShellSnippetStep) -> Self {
        let scope = if is_system_path(&data.destination) {
            Scope::System
        } else {
            Scope::UserProfile
        };
        let reverse = if data.managed_block {
            vec![
                ReverseOp::new(
                    ReverseKind::RemoveManagedBlock,
                    vec![data.destination.clone()],
                    scope,
                )
                .with("layer", candy)
                .with("shell", &data.shell)
                .with("marker", candy),
            ]
        } else {
            vec![
                file_reverse(
                    &data.destination,
                    if scope == Scope::System {
                        Scope::System
                    } else {
                        Scope::User
                    },
                )
                .with("layer", candy)
                .with("shell", &data.shell),
            ]
        };
        Self::host(candy, scope, StepData::ShellSnippet(data), reverse)
    }

    /// A repository change: system scope, gated by `allow-repo-changes`.
    pub fn repo_change(candy: &str, data: RepoChangeStep) -> Self {
        let mut reverse = Vec::new();
        if !data.copr.is_empty() {
            reverse.push(ReverseOp::new(
                ReverseKind::CoprDisable,
                data.copr.clone(),
                Scope::System,
            ));
        }
        for r in &data.repos {
            if let Some(n) = r.get("name") {
                reverse.push(
                    ReverseOp::new(ReverseKind::RemoveRepoFile, vec![n.clone()], Scope::System)
                        .with("layer", candy)
                        .with("format", &data.format),
                );
            }
        }
        Self::host(candy, Scope::System, StepData::RepoChange(data), reverse)
            .gated(Gate::AllowRepoChanges)
            .in_phase(Phase::Prepare)
    }

    /// Android packages: system scope, no gate.
    pub fn apk(candy: &str, data: ApkStep) -> Self {
        Self::host(candy, Scope::System, StepData::ApkInstall(data), Vec::new())
    }

    /// A local package: system scope, no gate; reverses to removing the
    /// packages it installs (their names are read from the built package
    /// files when they are installed, so the op names none).
    pub fn local_pkg(candy: &str, data: LocalPkgStep) -> Self {
        let mut op = ReverseOp::new(ReverseKind::PackageRemove, Vec::new(), Scope::System);
        op.format = Some(data.format.clone());
        Self::host(
            candy,
            Scope::System,
            StepData::LocalPkgInstall(data),
            vec![op],
        )
    }

    /// A reboot: system scope, no gate, nothing to undo.
    pub fn reboot(candy: &str) -> Self {
        Self::host(
            candy,
            Scope::System,
            StepData::Reboot(RebootStep {}),
            Vec::new(),
        )
    }

    /// An external step, carried with the properties it declares.
    pub fn external(
        candy: &str,
        kind: StepKind,
        scope: Scope,
        venue: Venue,
        gate: Gate,
        data: ExternalStep,
    ) -> Self {
        InstallStep {
            kind,
            venue,
            gate,
            ..Self::host(candy, scope, StepData::External(data), Vec::new())
        }
    }

    /// Replaces the home token in every home-bearing field (never in cmd or
    /// write bodies). Idempotent.
    pub fn resolve_home(&mut self, home: &str) {
        let r = |s: &mut String| {
            if s.contains(HOME_TOKEN) {
                *s = s.replace(HOME_TOKEN, home);
            }
        };
        match &mut self.data {
            StepData::ShellHook(h) => {
                h.env.values_mut().for_each(r);
                h.path.iter_mut().for_each(r);
                r(&mut h.env_file);
            }
            StepData::ShellSnippet(s) => {
                r(&mut s.text);
                r(&mut s.destination);
                s.path.iter_mut().for_each(r);
            }
            StepData::File(f) => r(&mut f.path),
            StepData::ServiceCustom(c) => {
                r(&mut c.text);
                if let Some(p) = &mut c.path {
                    r(p);
                }
            }
            StepData::Op(o) => {
                if o.verb != "cmd" {
                    r(&mut o.value);
                }
                if let Some(t) = &mut o.to {
                    r(t);
                }
                if let Some(t) = &mut o.target {
                    r(t);
                }
                o.cache.iter_mut().for_each(r);
            }
            StepData::Builder(b) => {
                b.path.iter_mut().for_each(r);
                b.env.values_mut().for_each(r);
                for (s, d) in &mut b.artifacts {
                    r(s);
                    r(d);
                }
            }
            _ => {}
        }
        for op in &mut self.reverse {
            op.targets.iter_mut().for_each(r);
        }
    }
}

/// A plan: one candy's steps (`candy: Some`), or a box's merged plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InstallPlan {
    /// First 16 hex of sha256 over (box, candy order, add-candies).
    pub deploy_id: String,
    /// Box name.
    #[serde(rename = "box")]
    pub box_name: String,
    /// Box version.
    pub version: String,
    /// Distro the plan was compiled for.
    #[serde(default)]
    pub distro: Option<String>,
    /// The candy, for a per-candy plan; `None` when merged.
    #[serde(default)]
    pub candy: Option<String>,
    /// Steps in order.
    pub steps: Vec<InstallStep>,
    /// Candies in this plan, in order.
    #[serde(default)]
    pub candies_included: Vec<String>,
    /// Candies added on top of the box's own.
    #[serde(default)]
    pub add_candies: Vec<String>,
    /// Builder image override.
    #[serde(default)]
    pub builder_image: Option<String>,
    /// Free-form facts (target, user, home).
    #[serde(default)]
    pub meta: BTreeMap<String, String>,
}

impl InstallPlan {
    /// Replaces the home token everywhere. Idempotent.
    pub fn resolve_home(&mut self, home: &str) {
        for s in &mut self.steps {
            s.resolve_home(home);
        }
    }

    /// Contiguous runs of steps sharing (scope, venue): the batches a walker
    /// applies with one privilege switch.
    pub fn steps_by_venue(&self) -> Vec<((Scope, Venue), &[InstallStep])> {
        let mut out = Vec::new();
        let mut start = 0;
        for i in 1..=self.steps.len() {
            let boundary = i == self.steps.len()
                || (self.steps[i].scope, self.steps[i].venue)
                    != (self.steps[start].scope, self.steps[start].venue);
            if boundary {
                if start < i {
                    out.push((
                        (self.steps[start].scope, self.steps[start].venue),
                        &self.steps[start..i],
                    ));
                }
                start = i;
            }
        }
        out
    }
}

/// `deploy_id`: the first 16 hex characters of sha256 over
/// `box 0x00, each candy 0x00, 0x01, each add-candy 0x00`.
pub fn deploy_id(box_name: &str, candies: &[String], add: &[String]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(box_name.as_bytes());
    h.update([0]);
    for c in candies {
        h.update(c.as_bytes());
        h.update([0]);
    }
    h.update([1]);
    for a in add {
        h.update(a.as_bytes());
        h.update([0]);
    }
    let d = h.finalize();
    crate::hex(&d[..8])
}

/// Merges per-candy plans into one, keeping candy boundaries (each step
/// names its candy) and their order.
pub fn merge_plans(plans: &[InstallPlan], box_name: &str, add_candies: &[String]) -> InstallPlan {
    let candies: Vec<String> = plans.iter().filter_map(|p| p.candy.clone()).collect();
    let first = plans.first();
    InstallPlan {
        deploy_id: deploy_id(box_name, &candies, add_candies),
        box_name: box_name.to_string(),
        version: first.map(|p| p.version.clone()).unwrap_or_default(),
        distro: first.and_then(|p| p.distro.clone()),
        candy: None,
        steps: plans.iter().flat_map(|p| p.steps.iter().cloned()).collect(),
        candies_included: candies,
        add_candies: add_candies.to_vec(),
        builder_image: first.and_then(|p| p.builder_image.clone()),
        meta: first.map(|p| p.meta.clone()).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(verb: &str, user: &str) -> InstallStep {
        InstallStep::op(
            "c",
            OpStep {
                verb: verb.into(),
                value: "/x".into(),
                user: user.into(),
                ..OpStep::default()
            },
        )
    }

    fn pkgs(phase: Phase, repos: bool) -> InstallStep {
        let mut d = SystemPackages {
            format: "rpm".into(),
            packages: vec!["a".into()],
            ..SystemPackages::default()
        };
        if repos {
            d.repos = vec![[("name".to_string(), "r".to_string())].into()];
            d.copr = vec!["o/p".into()];
        }
        InstallStep::system_packages("c", phase, d, Some("dnf remove -y a".into()))
    }

    #[test]
    fn system_packages_rules() {
        let s = pkgs(Phase::Install, false);
        assert_eq!(
            (s.scope, s.venue, s.gate),
            (Scope::System, Venue::HostNative, Gate::None)
        );
        assert_eq!(s.reverse.len(), 1);
        assert_eq!(s.reverse[0].kind, ReverseKind::PackageRemove);
        assert_eq!(
            s.reverse[0].uninstall_cmd.as_deref(),
            Some("dnf remove -y a")
        );
        let p = pkgs(Phase::Prepare, true);
        assert_eq!(p.gate, Gate::AllowRepoChanges);
        let kinds: Vec<_> = p.reverse.iter().map(|r| r.kind).collect();
        assert_eq!(
            kinds,
            vec![ReverseKind::CoprDisable, ReverseKind::RemoveRepoFile]
        );
        // Prepare without repos needs no gate.
        assert_eq!(pkgs(Phase::Prepare, false).gate, Gate::None);
        let modules = InstallStep::system_packages(
            "c",
            Phase::Prepare,
            SystemPackages {
                format: "rpm".into(),
                modules: vec!["nodejs:20".into()],
                ..SystemPackages::default()
            },
            None,
        );
        assert_eq!(modules.reverse[0].kind, ReverseKind::ModuleReset);
        assert_eq!(modules.reverse[0].targets, vec!["nodejs:20"]);
    }

    #[test]
    fn builder_rules() {
        let b = |name: &str| {
            InstallStep::builder(
                "c",
                BuilderStep {
                    builder: name.into(),
                    ..BuilderStep::default()
                },
                vec!["typescript".into()],
                vec!["tool".into()],
            )
        };
        assert_eq!(b("aur").scope, Scope::System);
        for n in ["pixi", "npm", "cargo"] {
            let s = b(n);
            assert_eq!(
                (s.scope, s.venue, s.gate),
                (Scope::User, Venue::ContainerBuilder, Gate::None),
                "{n}"
            );
        }
        assert_eq!(b("pixi").reverse[0].kind, ReverseKind::PixiEnvRemove);
        assert_eq!(b("pixi").reverse[0].targets, vec!["default"]);
        assert_eq!(b("npm").reverse[0].kind, ReverseKind::NpmUninstallG);
        assert_eq!(b("cargo").reverse[0].kind, ReverseKind::CargoUninstall);
        assert_eq!(b("aur").reverse[0].kind, ReverseKind::PackageRemove);
    }

    #[test]
    fn op_scope_and_root_gate() {
        for u in ["", "root", "0", "0:0"] {
            assert_eq!(op("cmd", u).scope, Scope::System, "{u:?}");
            assert_eq!(op("cmd", u).gate, Gate::AllowRootTasks, "{u:?}");
            assert_eq!(op("mkdir", u).gate, Gate::None, "root mkdir is ungated");
        }
        for u in ["${USER}", "1000", "1000:1000", "postgres"] {
            let s = op("cmd", u);
            assert_eq!((s.scope, s.gate), (Scope::User, Gate::None), "{u}");
        }
        assert_eq!(
            op("link", "root").reverse[0].kind,
            ReverseKind::RmFileSystem
        );
        assert_eq!(
            op("link", "${USER}").reverse[0].kind,
            ReverseKind::RmFileUser
        );
        assert!(op("mkdir", "root").reverse.is_empty());
        let setcap = op("setcap", "root");
        assert_eq!(
            (setcap.reverse[0].kind, setcap.reverse[0].targets.clone()),
            (ReverseKind::RestoreCaps, vec!["/x".to_string()])
        );
        let dl = |value: &str, extract: Option<&str>| {
            InstallStep::op(
                "c",
                OpStep {
                    verb: "download".into(),
                    value: value.into(),
                    to: Some("/opt/t".into()),
                    extract: extract.map(String::from),
                    ..OpStep::default()
                },
            )
            .reverse
        };
        assert_eq!(dl("https://x/t", None)[0].kind, ReverseKind::RmFileSystem);
        // An archive (by `extract:` or by the URL) unpacks files under `to`.
        for (url, ex) in [("https://x/t.tgz", None), ("https://x/t", Some("zip"))] {
            let r = dl(url, ex);
            assert_eq!(r[0].kind, ReverseKind::RemoveArtifactFiles, "{url}");
            assert_eq!(r[0].targets, vec!["/opt/t"]);
        }
        assert!(dl("https://x/install.sh", Some("sh")).is_empty());
        let lp = InstallStep::local_pkg(
            "c",
            LocalPkgStep {
                format: "deb".into(),
                ..LocalPkgStep::default()
            },
        );
        assert_eq!(lp.reverse[0].kind, ReverseKind::PackageRemove);
        assert_eq!(lp.reverse[0].format.as_deref(), Some("deb"));
    }

    #[test]
    fn system_path_detection_and_file_scope() {
        for p in [
            "/etc/x",
            "/usr/local/bin/t",
            "/var/lib/a",
            "/opt",
            "/root/.x",
            "/boot/g",
            "/srv/a",
            "/run/x",
            "/lib/a",
            "/sbin/a",
            "/bin/a",
        ] {
            assert!(is_system_path(p), "{p}");
        }
        for p in [
            "/home/user/x",
            "/tmp/x",
            "/etcetera",
            "/usrx/a",
            "{{.Home}}/.config/x",
        ] {
            assert!(!is_system_path(p), "{p}");
        }
        let f = |path: &str| {
            InstallStep::file(
                "c",
                FileStep {
                    verb: "write".into(),
                    path: path.into(),
                    mode: "0644".into(),
                    ..FileStep::default()
                },
            )
        };
        assert_eq!(f("/etc/a.conf").scope, Scope::System);
        assert_eq!(f("/etc/a.conf").reverse[0].kind, ReverseKind::RmFileSystem);
        assert_eq!(f("{{.Home}}/.x").scope, Scope::User);
        assert_eq!(f("{{.Home}}/.x").reverse[0].kind, ReverseKind::RmFileUser);
    }

    #[test]
    fn services_hooks_snippets_reboot() {
        let sc = InstallStep::service_custom(
            "c",
            Scope::User,
            ServiceCustomStep {
                unit: "charly-c-x".into(),
                path: Some("{{.Home}}/.config/systemd/user/charly-c-x.service".into()),
                ..ServiceCustomStep::default()
            },
        );
        assert_eq!((sc.scope, sc.gate), (Scope::User, Gate::WithServices));
        assert_eq!(
            sc.reverse.iter().map(|r| r.kind).collect::<Vec<_>>(),
            vec![ReverseKind::ServiceDisable, ReverseKind::ServiceRemove]
        );
        let sp = InstallStep::service_packaged(
            "c",
            Scope::System,
            ServicePackagedStep {
                unit: "sshd.service".into(),
                ..Default::default()
            },
        );
        assert_eq!(sp.gate, Gate::WithServices);
        assert_eq!(
            sp.reverse.iter().map(|r| r.kind).collect::<Vec<_>>(),
            vec![
                ReverseKind::ServiceDisable,
                ReverseKind::RestoreEnabled,
                ReverseKind::RemoveDropin
            ]
        );
        let h = InstallStep::shell_hook("c", ShellHookStep::default());
        assert_eq!(h.scope, Scope::UserProfile);
        let sn = |dest: &str, block: bool| {
            InstallStep::shell_snippet(
                "c",
                ShellSnippetStep {
                    shell: "bash".into(),
                    destination: dest.into(),
                    managed_block: block,
                    ..Default::default()
                },
            )
        };
        assert_eq!(sn("/etc/profile.d/x.sh", false).scope, Scope::System);
        let block = sn("{{.Home}}/.bashrc", true);
        assert_eq!(block.scope, Scope::UserProfile);
        assert_eq!(block.reverse[0].kind, ReverseKind::RemoveManagedBlock);
        let r = InstallStep::reboot("c");
        assert_eq!((r.scope, r.gate), (Scope::System, Gate::None));
        assert!(r.reverse.is_empty(), "reboot has no reverse ops");
        let rc = InstallStep::repo_change(
            "c",
            RepoChangeStep {
                format: "deb".into(),
                ..Default::default()
            },
        );
        assert_eq!(rc.gate, Gate::AllowRepoChanges);
    }

    #[test]
    fn gate_matrix_and_yes() {
        let gates = [
            Gate::None,
            Gate::AllowRepoChanges,
            Gate::AllowRootTasks,
            Gate::WithServices,
        ];
        let none = Gates::default();
        assert_eq!(gates.map(|g| none.allows(g)), [true, false, false, false]);
        let repo = Gates {
            allow_repo_changes: true,
            ..Gates::default()
        };
        assert_eq!(gates.map(|g| repo.allows(g)), [true, true, false, false]);
        let root = Gates {
            allow_root_tasks: true,
            ..Gates::default()
        };
        assert_eq!(gates.map(|g| root.allows(g)), [true, false, true, false]);
        let svc = Gates {
            with_services: true,
            ..Gates::default()
        };
        assert_eq!(gates.map(|g| svc.allows(g)), [true, false, false, true]);
        assert_eq!(gates.map(|g| Gates::all().allows(g)), [true; 4]);
    }

    fn plan_of(steps: Vec<InstallStep>) -> InstallPlan {
        InstallPlan {
            deploy_id: String::new(),
            box_name: "b".into(),
            version: "1".into(),
            distro: None,
            candy: None,
            steps,
            candies_included: vec![],
            add_candies: vec![],
            builder_image: None,
            meta: BTreeMap::new(),
        }
    }

    #[test]
    fn venue_batching_groups_contiguous_runs() {
        let builder = InstallStep::builder(
            "c",
            BuilderStep {
                builder: "npm".into(),
                ..Default::default()
            },
            vec![],
            vec![],
        );
        // system, system, user/container, user/container, system → 3 batches
        let p = plan_of(vec![
            pkgs(Phase::Install, false),
            op("mkdir", "root"),
            builder.clone(),
            builder,
            op("cmd", "root"),
        ]);
        let batches = p.steps_by_venue();
        assert_eq!(batches.len(), 3);
        assert_eq!(
            batches.iter().map(|(_, s)| s.len()).collect::<Vec<_>>(),
            vec![2, 2, 1]
        );
        assert_eq!(batches[1].0, (Scope::User, Venue::ContainerBuilder));
    }

    #[test]
    fn resolve_home_is_idempotent_and_spares_bodies() {
        let mut p = plan_of(vec![
            InstallStep::shell_hook(
                "c",
                ShellHookStep {
                    env: [("A".into(), "{{.Home}}/a".into())].into(),
                    path: vec!["{{.Home}}/bin".into()],
                    env_file: "{{.Home}}/.config/charly/env.d/c.sh".into(),
                },
            ),
            InstallStep::op(
                "c",
                OpStep {
                    verb: "cmd".into(),
                    value: "echo {{.Home}}".into(),
                    ..Default::default()
                },
            ),
            InstallStep::file(
                "c",
                FileStep {
                    verb: "write".into(),
                    path: "{{.Home}}/f".into(),
                    content: Some("{{.Home}} stays".into()),
                    mode: "0644".into(),
                    ..Default::default()
                },
            ),
        ]);
        p.resolve_home("/home/u");
        let once = p.clone();
        p.resolve_home("/somewhere/else");
        assert_eq!(p, once, "idempotent");
        let json = serde_json::to_string(&p).expect("json");
        assert!(
            json.contains("/home/u/a")
                && json.contains("/home/u/bin")
                && json.contains("/home/u/f")
        );
        assert!(json.contains("echo {{.Home}}"), "cmd body untouched");
        assert!(json.contains("{{.Home}} stays"), "write body untouched");
        assert!(json.contains("/home/u/f") && p.steps[2].reverse[0].targets == vec!["/home/u/f"]);
    }

    #[test]
    fn deploy_id_is_deterministic_and_order_sensitive() {
        let a = deploy_id("box", &["x".into(), "y".into()], &[]);
        assert_eq!(a, deploy_id("box", &["x".into(), "y".into()], &[]));
        assert_eq!(a.len(), 16);
        assert_ne!(a, deploy_id("box", &["y".into(), "x".into()], &[]));
        assert_ne!(a, deploy_id("box", &["x".into()], &["y".into()]));
        assert_ne!(a, deploy_id("box2", &["x".into(), "y".into()], &[]));
        // Golden: sha256("box\0x\0y\0\x01")[..8].
        assert_eq!(a, "df1689729236b4ff"); // printf 'box\0x\0y\0\x01' | sha256sum
    }

    #[test]
    fn every_kind_round_trips_through_json() {
        let steps = vec![
            pkgs(Phase::Install, true),
            InstallStep::builder(
                "c",
                BuilderStep {
                    builder: "pixi".into(),
                    artifacts: vec![("{{.Home}}".into(), "{{.Home}}".into())],
                    ..Default::default()
                },
                vec![],
                vec![],
            ),
            op("download", "root"),
            InstallStep::file(
                "c",
                FileStep {
                    verb: "copy".into(),
                    path: "/usr/local/bin/t".into(),
                    source: Some("t.sh".into()),
                    mode: "0755".into(),
                    ..Default::default()
                },
            ),
            InstallStep::service_packaged(
                "c",
                Scope::System,
                ServicePackagedStep {
                    name: "s".into(),
                    unit: "s.service".into(),
                    enable: true,
                },
            ),
            InstallStep::service_custom(
                "c",
                Scope::System,
                ServiceCustomStep {
                    name: "s".into(),
                    unit: "charly-c-s".into(),
                    init: "systemd".into(),
                    text: "[Unit]\n".into(),
                    path: Some("/etc/systemd/system/charly-c-s.service".into()),
                    enable: true,
                },
            ),
            InstallStep::shell_hook("c", ShellHookStep::default()),
            InstallStep::shell_snippet(
                "c",
                ShellSnippetStep {
                    shell: "fish".into(),
                    ..Default::default()
                },
            ),
            InstallStep::repo_change("c", RepoChangeStep::default()),
            InstallStep::apk(
                "c",
                ApkStep {
                    apk: serde_json::json!([{"apk": "a.apk"}]),
                },
            ),
            InstallStep::local_pkg(
                "c",
                LocalPkgStep {
                    format: "deb".into(),
                    source: "pkg/debian".into(),
                    glob: "*.deb".into(),
                    ..LocalPkgStep::default()
                },
            ),
            InstallStep::reboot("c"),
            InstallStep::external(
                "c",
                StepKind::ExternalPlugin,
                Scope::User,
                Venue::HostNative,
                Gate::None,
                ExternalStep::default(),
            ),
            InstallStep::external(
                "c",
                StepKind::External("flatpak".into()),
                Scope::User,
                Venue::Skip,
                Gate::WithServices,
                ExternalStep {
                    data: serde_json::json!({"app": "org.x"}),
                },
            ),
        ];
        let kinds: std::collections::BTreeSet<String> =
            steps.iter().map(|s| s.kind.as_str()).collect();
        assert_eq!(kinds.len(), 14, "13 builtin kinds plus external:<word>");
        let p = plan_of(steps);
        let json = serde_json::to_string(&p).expect("ser");
        let back: InstallPlan = serde_json::from_str(&json).expect("de");
        assert_eq!(back, p);
        assert!(json.contains("\"kind\":\"external:flatpak\""));
        assert!(StepKind::parse("external:").is_none());
        assert!(StepKind::parse("nope").is_none());
    }
}
