//! The candy schema (`candy/<name>/charly.yml`, root key `candy:`).
//!
//! Field names and shapes follow the real format (docs/format.md).
//! Everything the engine acts on is typed; fields it only carries along
//! (eval, env_accept, route, security, …) are kept as [`Yaml`] so they can
//! become labels and are never rejected.

use crate::yaml::{OneOrMany, OrderedMap, Spanned, Yaml};
use serde::Deserialize;

/// One candy's definition.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename = "candy", default)]
pub struct Candy {
    /// CalVer or semver of the candy.
    pub version: Option<Spanned<String>>,
    /// Declared name (the directory name is authoritative).
    pub name: Option<Spanned<String>>,
    /// Free text.
    pub description: Option<Box<Yaml>>,
    /// Dependencies, installed earlier.
    pub require: Vec<Spanned<String>>,
    /// Composition: candies expanded in place of this one.
    pub candy: Vec<Spanned<String>>,
    /// Packages installed on every distro.
    pub package: Vec<PackageItem>,
    /// Per-distro sections keyed by cascade keys (`ubuntu:24.04`, `debian,ubuntu`, `rpm`).
    pub distro: OrderedMap<DistroSection>,
    /// Environment for the box.
    pub env: OrderedMap<Spanned<String>>,
    /// Entries prepended to PATH.
    pub path_append: Vec<Spanned<String>>,
    /// Build-time variables (`ENV` before the candy's steps).
    pub var: OrderedMap<Spanned<String>>,
    /// Ordered install tasks.
    pub task: Vec<Task>,
    /// Services (packaged units or exec entries).
    pub service: Vec<Service>,
    /// Shell snippets.
    pub shell: Option<Box<Shell>>,
    /// Local packages: format → source directory.
    pub localpkg: Option<Spanned<LocalPkgMap>>,
    /// Ask for a reboot after deploying.
    pub reboot: bool,
    /// Exposed ports (`8080`, `tcp:2222`, `udp:53`).
    pub port: Vec<Spanned<String>>,
    /// Named volumes.
    pub volume: Vec<Volume>,
    /// Build and deploy checks.
    pub eval: Option<Yaml>,
    /// Kept, not interpreted by the build engine.
    pub env_accept: Option<Box<Yaml>>,
    /// Kept.
    pub env_require: Option<Box<Yaml>>,
    /// Kept.
    pub env_provide: Option<Box<Yaml>>,
    /// Kept.
    pub secret: Option<Box<Yaml>>,
    /// Kept.
    pub secret_accept: Option<Box<Yaml>>,
    /// Kept.
    pub secret_require: Option<Box<Yaml>>,
    /// Kept.
    pub mcp_provide: Option<Box<Yaml>>,
    /// Kept.
    pub mcp_accept: Option<Box<Yaml>>,
    /// Kept.
    pub mcp_require: Option<Box<Yaml>>,
    /// Kept.
    pub route: Option<Box<Yaml>>,
    /// Kept.
    pub alias: Option<Box<Yaml>>,
    /// Kept.
    pub security: Option<Box<Yaml>>,
    /// Kept.
    pub libvirt: Option<Box<Yaml>>,
    /// Android packages; kept.
    pub apk: Option<Box<Yaml>>,
    /// Data staged into volumes.
    pub data: Option<Box<Yaml>>,
    /// Kept.
    pub artifact: Option<Box<Yaml>>,
    /// Kept.
    pub port_relay: Option<Box<Yaml>>,
    /// Lifecycle hooks; kept.
    pub hook: Option<Box<Yaml>>,
    /// Kept.
    pub capability: Option<Box<Yaml>>,
    /// Kept.
    pub status: Option<Box<Yaml>>,
    /// Kept.
    pub info: Option<Box<Yaml>>,
    /// Kept.
    pub skill: Option<Box<Yaml>>,
    /// Container engine the candy needs (`docker`, `podman`); kept
    /// (2026.174).
    pub engine: Option<Box<Yaml>>,
    /// Plugin declaration (`providers`, `source`); kept, charly runs no
    /// plugins (2026.174).
    pub plugin: Option<Box<Yaml>>,
    /// Plugin candies baked into composing images; kept, not built
    /// (2026.174).
    pub bake_plugin: Option<Box<Yaml>>,
    /// External builder word (`builder:<word>`); kept, not built (2026.174).
    pub external_builder: Option<Box<Yaml>>,
    /// Capabilities required of the image; kept (2026.174).
    pub requires_capability: Option<Box<Yaml>>,
    /// Paths copied out of other images; kept (2026.174).
    pub extract: Option<Box<Yaml>>,
    /// `agent-run:` / `agent-check:` steps of the node form, as written;
    /// kept, never run (charly has no agent runner). Only the node-form
    /// reader fills it.
    pub agent_step: Vec<Yaml>,
}

/// A package: a name, or `{name, description}`.
#[derive(Debug, Clone)]
pub struct PackageItem {
    /// Package name.
    pub name: Spanned<String>,
}

impl<'de> Deserialize<'de> for PackageItem {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(rename = "package")]
        struct Full {
            name: Spanned<String>,
            #[allow(dead_code)]
            description: Option<Yaml>,
        }
        let y = Spanned::<Yaml>::deserialize(d)?;
        let span = y.span;
        match y.value.0.as_str() {
            Some(s) => Ok(PackageItem {
                name: Spanned::new(span, s.to_string()),
            }),
            None => {
                let full: Full = crate::yaml::de::nested(&y.value.0)?;
                Ok(PackageItem { name: full.name })
            }
        }
    }
}

/// A distro section of a candy.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename = "distro section", default)]
pub struct DistroSection {
    /// Packages for this key.
    pub package: Vec<PackageItem>,
    /// Repositories (maps of strings: name, url, key, …).
    pub repo: Vec<Spanned<OrderedMap<String>>>,
    /// COPR projects (rpm).
    pub copr: Vec<String>,
    /// Excluded packages.
    pub exclude: Vec<String>,
    /// Extra installer options.
    pub option: Vec<String>,
    /// Modules to enable (rpm).
    pub module: Vec<String>,
    /// Signing keys (pac).
    pub keys: Vec<String>,
    /// AUR packages (pac family).
    pub aur: Option<AurSection>,
}

/// An `aur:` block.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename = "aur section", default)]
pub struct AurSection {
    /// AUR package names.
    pub package: Vec<PackageItem>,
    /// Extra yay options.
    pub option: Vec<String>,
    /// Packages replaced.
    pub replace: Vec<String>,
}

/// One task: exactly one verb plus modifiers.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename = "task", default)]
pub struct Task {
    /// Shell body.
    pub cmd: Option<Spanned<String>>,
    /// Directory to create.
    pub mkdir: Option<Box<Spanned<String>>>,
    /// Candy-relative file to copy.
    pub copy: Option<Box<Spanned<String>>>,
    /// Destination to write `content` to.
    pub write: Option<Box<Spanned<String>>>,
    /// Symlink path (points at `target`).
    pub link: Option<Box<Spanned<String>>>,
    /// URL to download.
    pub download: Option<Box<Spanned<String>>>,
    /// File to set capabilities on.
    pub setcap: Option<Box<Spanned<String>>>,
    /// Builder trigger (`all`).
    pub build: Option<Box<Spanned<String>>>,
    /// Who runs it.
    pub user: Option<Box<Spanned<String>>>,
    /// File mode like `0755`.
    pub mode: Option<Box<Spanned<String>>>,
    /// Destination for copy/download.
    pub to: Option<Box<Spanned<String>>>,
    /// Link target.
    pub target: Option<Box<Spanned<String>>>,
    /// Content for write.
    pub content: Option<Box<Spanned<String>>>,
    /// Archive kind for download (`tar.gz`, `zip`, `sh`, `none`, …).
    pub extract: Option<Box<Spanned<String>>>,
    /// Members to extract.
    pub include: Vec<String>,
    /// `--strip-components`.
    pub strip_components: Option<Box<Spanned<u32>>>,
    /// Task environment.
    pub env: OrderedMap<Spanned<String>>,
    /// Capabilities for setcap (none = remove).
    pub caps: Option<Box<Spanned<String>>>,
    /// Cache directories mounted for cmd/download.
    pub cache: OneOrMany<Spanned<String>>,
    /// Paths a download leaves behind (for reversal).
    pub uninstall: Vec<String>,
    /// A comment emitted before the step.
    pub comment: Option<String>,
    /// A plugin capability serving the task (`plugin: <word>`: a `step:`
    /// or `verb:` word a plugin candy declares); see the `plugin` module.
    pub plugin: Option<Box<Spanned<String>>>,
    /// What the plugin gets as its input (`plugin_input:`, any YAML,
    /// carried to it as JSON).
    pub plugin_input: Option<Box<Yaml>>,
    /// When a plugin task acts (`context: [build, deploy]`, the node
    /// form's run-step field): `build` emits into the image, `deploy`
    /// executes on a deploy target. Empty: both.
    pub context: Vec<Spanned<String>>,
}

/// The verbs a task may use, in the order they are checked.
pub const TASK_VERBS: [&str; 9] = [
    "cmd", "mkdir", "copy", "write", "link", "download", "setcap", "build", "plugin",
];

impl Task {
    /// The verbs this task sets, with their values.
    pub fn verbs(&self) -> Vec<(&'static str, &Spanned<String>)> {
        let all = [
            ("cmd", self.cmd.as_ref()),
            ("mkdir", self.mkdir.as_deref()),
            ("copy", self.copy.as_deref()),
            ("write", self.write.as_deref()),
            ("link", self.link.as_deref()),
            ("download", self.download.as_deref()),
            ("setcap", self.setcap.as_deref()),
            ("build", self.build.as_deref()),
            ("plugin", self.plugin.as_deref()),
        ];
        all.into_iter()
            .filter_map(|(n, v)| v.map(|v| (n, v)))
            .collect()
    }
}

/// A service entry: a packaged unit (`use_packaged`) or a command (`exec`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename = "service", default)]
pub struct Service {
    /// Service name.
    pub name: Spanned<String>,
    /// Packaged unit to enable.
    pub use_packaged: Option<Spanned<String>>,
    /// Distros (`debian`, `debian:13`) this entry is limited to; empty =
    /// every distro (2026.174).
    pub distro: Vec<Spanned<String>>,
    /// Command to run.
    pub exec: Option<Spanned<String>>,
    /// Environment.
    pub env: OrderedMap<String>,
    /// `always`, `on-failure`, `no`, `unless-stopped`.
    pub restart: Option<String>,
    /// Working directory.
    pub working_directory: Option<String>,
    /// User to run as.
    pub user: Option<String>,
    /// Ordering.
    pub after: OneOrMany<String>,
    /// Ordering.
    pub before: OneOrMany<String>,
    /// Install targets.
    pub wanted_by: OneOrMany<String>,
    /// Where stdout goes.
    pub stdout: Option<String>,
    /// Stop timeout.
    pub stop_timeout: Option<String>,
    /// `system` or `user`.
    pub scope: Option<Spanned<String>>,
    /// Enable at boot.
    pub enable: Option<bool>,
    /// Overrides for packaged units.
    pub overrides: Option<Yaml>,
    /// `program` or `eventlistener` (supervisord).
    pub kind: Option<String>,
    /// Events for an event listener.
    pub event: Option<OneOrMany<String>>,
    /// Start automatically.
    pub auto_start: Option<bool>,
    /// Start retries.
    pub start_retry: Option<String>,
    /// Seconds to count as started.
    pub start_sec: Option<String>,
    /// Stop signal.
    pub stop_signal: Option<String>,
    /// Expected exit codes.
    pub exit_code: Option<String>,
    /// Start priority.
    pub priority: Option<String>,
}

/// `shell:` snippets.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename = "shell", default)]
pub struct Shell {
    /// Generic init body (`${SHELL_NAME}` is replaced per shell).
    pub init: Option<Spanned<String>>,
    /// Generic PATH entries.
    pub path_append: Vec<String>,
    /// Destination override.
    pub path: Option<String>,
    /// Ordering priority.
    pub priority: Option<String>,
    /// bash override.
    pub bash: Option<ShellOverride>,
    /// zsh override.
    pub zsh: Option<ShellOverride>,
    /// fish override.
    pub fish: Option<ShellOverride>,
    /// sh override.
    pub sh: Option<ShellOverride>,
}

/// A per-shell override.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename = "shell override", default)]
pub struct ShellOverride {
    /// Init body.
    pub init: Option<Spanned<String>>,
    /// PATH entries.
    pub path_append: Vec<String>,
    /// Destination override.
    pub path: Option<String>,
}

/// A volume: `{name, path}`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename = "volume", default)]
pub struct Volume {
    /// Name (`^[a-z0-9]+(-[a-z0-9]+)*$`).
    pub name: Spanned<String>,
    /// Path inside the box.
    pub path: Spanned<String>,
}

/// `localpkg:` — a map from format to source directory (a scalar is rejected).
#[derive(Debug, Clone, Default)]
pub struct LocalPkgMap(pub OrderedMap<Spanned<String>>);

impl<'de> Deserialize<'de> for LocalPkgMap {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let y = Yaml::deserialize(d)?;
        if y.0.as_map().is_none() && !y.0.is_null() {
            return Err(serde::de::Error::custom(
                "localpkg must be a mapping from format to source directory (e.g. `deb: pkg/debian`)",
            ));
        }
        crate::yaml::de::nested(&y.0).map(LocalPkgMap)
    }
}

impl Service {
    /// Whether this entry applies to a box with these distro tags: an entry
    /// without `distro:` applies everywhere; `debian` matches `debian` and
    /// `debian:13`, `debian:13` only itself.
    pub fn applies_to(&self, tags: &[String]) -> bool {
        self.distro.is_empty()
            || self.distro.iter().any(|d| {
                tags.iter().any(|t| {
                    t == &d.value
                        || (!d.value.contains(':') && t.split(':').next() == Some(&d.value))
                })
            })
    }
}

impl Candy {
    /// Whether the candy installs anything itself (packages, tasks, services, …).
    ///
    /// `has_builder_files` says whether its directory triggers a builder.
    pub fn has_install_content(&self, has_builder_files: bool) -> bool {
        !self.package.is_empty()
            || self.distro.iter().any(|(_, s)| {
                !s.package.is_empty() || s.aur.as_ref().is_some_and(|a| !a.package.is_empty())
            })
            || !self.task.is_empty()
            || !self.service.is_empty()
            || self.shell.is_some()
            || self.localpkg.is_some()
            || self.reboot
            || has_builder_files
    }

    /// Whether a composer counts as content-bearing (installed after its parts).
    pub fn has_content(&self, has_builder_files: bool) -> bool {
        self.has_install_content(has_builder_files)
            || !self.env.is_empty()
            || !self.path_append.is_empty()
            || !self.port.is_empty()
            || !self.var.is_empty()
            || !self.volume.is_empty()
    }

    /// Whether any section carries AUR packages.
    pub fn has_aur_packages(&self) -> bool {
        self.distro
            .iter()
            .any(|(_, s)| s.aur.as_ref().is_some_and(|a| !a.package.is_empty()))
    }
}
