//! The build vocabulary (`build.yml`): builders, distros with their package
//! formats, and init systems. Templates are Go text/template source strings,
//! rendered by the `template` module.

use crate::yaml::{OneOrMany, OrderedMap, Spanned, Yaml};
use serde::Deserialize;

/// A cache mount used by templates (`cacheMounts`).
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(rename = "cache mount", default)]
pub struct CacheMount {
    /// Mount destination.
    pub dst: String,
    /// `locked`, `shared` or `private` (default locked).
    pub sharing: Option<String>,
    /// Owned by the build user (uid/gid set).
    pub owned: bool,
}

/// Per-phase templates (`phase.install.container` / `.host`).
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(rename = "phase", default)]
pub struct Phases {
    /// Before install (repos).
    pub prepare: Option<PhaseTemplates>,
    /// The install itself.
    pub install: Option<PhaseTemplates>,
    /// After install.
    pub cleanup: Option<PhaseTemplates>,
}

/// The templates of one phase.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(rename = "phase templates", default)]
pub struct PhaseTemplates {
    /// Containerfile text.
    pub container: Option<Spanned<String>>,
    /// Shell run on a host.
    pub host: Option<Spanned<String>>,
}

/// A builder (pixi, npm, cargo, aur, debootstrap, …).
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(rename = "builder", default)]
pub struct Builder {
    /// `bootstrap` for rootfs builders.
    pub kind: Option<String>,
    /// Needs a privileged container.
    pub privileged: bool,
    /// The artifact a bootstrap builder writes.
    pub output_artifact: Option<String>,
    /// Files in a candy directory that trigger this builder.
    pub detect_file: Vec<String>,
    /// A config section that triggers it (`aur`).
    pub detect_config: Option<String>,
    /// Runs inline in the final stage (cargo).
    pub inline: bool,
    /// Needs the candy's source directory.
    pub requires_src_dir: bool,
    /// Cache mounts.
    pub cache_mount: Vec<CacheMount>,
    /// The builder stage template.
    pub stage_template: Option<Spanned<String>>,
    /// Inline install template.
    pub install_template: Option<Spanned<String>>,
    /// Install command per manifest (`pixi.toml`, `pixi.toml+lock`).
    pub install_command: OrderedMap<String>,
    /// Extra template rendered into `.ManylinuxFix`.
    pub manylinux_fix: Option<Spanned<String>>,
    /// Optional build script name (`build.sh`).
    pub build_script: Option<String>,
    /// Files copied from the stage into the box.
    pub copy_artifact: Vec<CopyArtifact>,
    /// A binary copied once per builder.
    pub copy_binary: Option<CopyArtifact>,
    /// PATH entries the builder's output needs.
    pub path_contribution: Vec<String>,
    /// Environment the builder's output needs.
    pub runtime_env: OrderedMap<String>,
    /// Unused by the original; kept.
    pub env: OrderedMap<String>,
    /// Host/container phase scripts.
    pub phase: Option<Phases>,
}

/// `{src, dst, chown}`.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(rename = "copy artifact", default)]
pub struct CopyArtifact {
    /// Path in the builder stage.
    pub src: String,
    /// Path in the box.
    pub dst: String,
    /// Chown to the box user.
    pub chown: bool,
}

/// A distro definition.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(rename = "distro", default)]
pub struct Distro {
    /// Bootstrap packages for an external base.
    pub bootstrap: Option<Bootstrap>,
    /// Shell lines run after bootstrap.
    pub workaround: Vec<String>,
    /// Package formats.
    pub format: OrderedMap<Format>,
    /// The user an image of this distro already has.
    pub base_user: Option<BaseUser>,
    /// Distro version.
    pub version: Option<String>,
    /// dnf tuning.
    pub dnf: Option<Dnf>,
    /// Kept (VM bootstrap).
    pub pacstrap: Option<Yaml>,
    /// Kept (VM bootstrap).
    pub debootstrap: Option<Yaml>,
    /// Kept (VM bootstrap).
    pub bootloader: Option<Yaml>,
    /// Parent distro.
    pub inherits: Option<Spanned<String>>,
    /// Whether the parent's candy sections apply.
    pub inherit_packages: bool,
}

/// `bootstrap:` of a distro.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(rename = "bootstrap", default)]
pub struct Bootstrap {
    /// Installer command, packages appended.
    pub install_cmd: String,
    /// Packages.
    pub package: Vec<String>,
    /// Cache mounts.
    pub cache_mount: Vec<CacheMount>,
}

/// `base_user:` of a distro.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(rename = "base user", default)]
pub struct BaseUser {
    /// User name.
    pub name: String,
    /// uid.
    pub uid: u32,
    /// gid.
    pub gid: u32,
    /// Home directory.
    pub home: Option<String>,
}

/// dnf tuning.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(rename = "dnf", default)]
pub struct Dnf {
    /// `max_parallel_downloads=`.
    pub max_parallel_downloads: Option<u32>,
    /// `fastestmirror=`.
    pub fastestmirror: Option<bool>,
}

/// A package format (rpm, deb, pac, aur).
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(rename = "format", default)]
pub struct Format {
    /// Never a primary format (aur).
    pub secondary: bool,
    /// Cache mounts.
    pub cache_mount: Vec<CacheMount>,
    /// Legacy container install template.
    pub install_template: Option<Spanned<String>>,
    /// Uninstall command template (deploy reversal).
    pub uninstall_template: Option<Spanned<String>>,
    /// Phased templates (`install.container` wins over `install_template`).
    pub phase: Option<Phases>,
    /// Local package build/install.
    pub local_pkg: Option<LocalPkgFormat>,
    /// Which section fields the format reads.
    pub section_field: OrderedMap<String>,
}

/// `local_pkg:` of a format.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(rename = "local_pkg", default)]
pub struct LocalPkgFormat {
    /// Glob of built packages (`*.deb`).
    pub pkg_glob: String,
    /// File that marks a source directory (`debian/control`).
    pub source_sentinel: Option<String>,
    /// Builds packages from `.SrcDir` into `.PkgDest`.
    pub build_template: Option<Spanned<String>>,
    /// Installs `.StageDir/.Glob`.
    pub install_template: Option<Spanned<String>>,
    /// Release download URL.
    pub download_template: Option<String>,
    /// Command that says whether a host supports the format.
    pub probe: Option<String>,
    /// Builder for dependencies.
    pub dep_builder: Option<String>,
}

/// An init system (supervisord, systemd).
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(rename = "init", default)]
pub struct Init {
    /// Candy fields that trigger it (`service`).
    pub layer_field: Vec<String>,
    /// Candy files that trigger it (`*.service`).
    pub layer_file: Vec<String>,
    /// Candy that must be in the base chain.
    pub depends_layer: Option<String>,
    /// Capabilities required (`preserve_user`).
    pub requires_capability: Vec<String>,
    /// `fragment_assembly` or `file_copy`.
    pub model: Option<String>,
    /// Header file for fragment assembly.
    pub header_file: Option<String>,
    /// Directory of fragments under `.build/<box>/`.
    pub fragment_dir: Option<String>,
    /// Template for a port relay program.
    pub relay_template: Option<Spanned<String>>,
    /// Scratch stage name.
    pub stage_name: Option<String>,
    /// COPY of the header into the stage.
    pub stage_header_copy: Option<String>,
    /// COPY of each fragment into the stage.
    pub stage_fragment_copy: Option<Spanned<String>>,
    /// RUN that assembles fragments.
    pub assembly_template: Option<Spanned<String>>,
    /// RUN that enables packaged system units.
    pub system_enable_template: Option<Spanned<String>>,
    /// RUN after assembly.
    pub post_assembly_template: Option<Spanned<String>>,
    /// Runtime entrypoint.
    pub entrypoint: Vec<String>,
    /// Entrypoint without services.
    pub fallback_entrypoint: Vec<String>,
    /// Tool to manage services.
    pub management_tool: Option<String>,
    /// Commands of the tool.
    pub management_command: OrderedMap<String>,
    /// Label naming triggering candies.
    pub label_key: Option<String>,
    /// How services render.
    pub service_schema: Option<ServiceSchema>,
}

/// `service_schema:` of an init.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(rename = "service schema", default)]
pub struct ServiceSchema {
    /// Unit/program template for exec entries.
    pub service_template: Option<Spanned<String>>,
    /// Where a unit file goes.
    pub unit_path_template: Option<Spanned<String>>,
    /// Drop-in template for packaged overrides.
    pub dropin_template: Option<Spanned<String>>,
    /// Where a drop-in goes.
    pub dropin_path_template: Option<Spanned<String>>,
    /// Whether packaged units are supported.
    pub supports_packaged: bool,
}

/// The whole vocabulary as merged for one project.
#[derive(Debug, Clone, Default)]
pub struct Vocab {
    /// Builders by type.
    pub builder: std::collections::BTreeMap<String, Builder>,
    /// Distros by name.
    pub distro: std::collections::BTreeMap<String, Distro>,
    /// Init systems by name.
    pub init: std::collections::BTreeMap<String, Init>,
}

/// Root-level `defaults:`.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(rename = "defaults", default)]
pub struct Defaults {
    /// Target platforms.
    pub platform: Option<OneOrMany<String>>,
    /// Tag policy.
    pub tag: Option<String>,
    /// Registry prefix.
    pub registry: Option<String>,
    /// Default base image.
    pub base: Option<Spanned<String>>,
    /// Default distro tags.
    pub distro: Option<Spanned<OneOrMany<String>>>,
    /// Default formats.
    pub build: Option<Spanned<OneOrMany<String>>>,
    /// Merge settings; kept.
    pub merge: Option<Yaml>,
    /// Builder type → builder box.
    pub builder: OrderedMap<Spanned<String>>,
    /// Parallel box builds.
    pub jobs: Option<Spanned<u32>>,
    /// Stages per podman build.
    pub podman_jobs: Option<u32>,
    /// Ceiling for auto podman jobs.
    pub podman_jobs_cap: Option<u32>,
    /// Extra context ignores.
    pub context_ignore: Vec<String>,
    /// Cache mode; kept.
    pub cache: Option<String>,
    /// Retention; kept.
    pub keep_images: Option<u32>,
    /// Retention; kept.
    pub keep_eval_runs: Option<u32>,
    /// `keep_eval_runs` as 2026.174 names it.
    pub keep_check_runs: Option<u32>,
    /// Default user.
    pub user: Option<Spanned<String>>,
    /// Default uid.
    pub uid: Option<Spanned<u32>>,
    /// Default gid.
    pub gid: Option<Spanned<u32>>,
    /// Default user policy.
    pub user_policy: Option<Spanned<String>>,
}
