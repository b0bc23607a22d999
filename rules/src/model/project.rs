//! Root-form documents: the project file `charly.yml`, flat imports and
//! vocabulary files. A root-form document holds settings (`version`, `import`,
//! `discover`, `defaults`) and maps of entries per kind (`box: {name: {…}}`).

use super::boxdef::BoxDef;
use super::candy::Candy;
use super::vocab::{Builder, Defaults, Distro, Init};
use crate::yaml::{OrderedMap, Spanned, Yaml};
use serde::Deserialize;

/// Keys that only root-form documents have.
pub const ROOT_KEYS: [&str; 7] = [
    "version", "repo", "import", "discover", "defaults", "provides", "eval",
];

/// Keys naming entity kinds.
pub const KIND_KEYS: [&str; 19] = [
    "candy", "box", "deploy", "builder", "distro", "init", "pod", "vm", "k8s", "local", "android",
    "ai", "recipe", "score", "group", "target", "module", "resource", "bundle",
];

/// Legacy keys the loader refuses with a migration hint.
pub const LEGACY_KEYS: [(&str, &str); 8] = [
    ("images", "box"),
    ("layers", "candy"),
    ("tasks", "task"),
    ("layer", "candy"),
    ("image", "box"),
    ("deployment", "deploy"),
    ("deployments", "deploy"),
    ("builders", "builder"),
];

/// A root-form document.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename = "project file", default)]
pub struct RootDoc {
    /// Schema CalVer.
    pub version: Option<Spanned<String>>,
    /// Repository identity (`github.com/owner/repo`).
    pub repo: Option<Spanned<String>>,
    /// Imports: flat files or `alias: ref`.
    pub import: Vec<ImportItem>,
    /// Where manifests are discovered.
    pub discover: Option<Vec<DiscoverItem>>,
    /// Project defaults.
    pub defaults: Option<Defaults>,
    /// Kept.
    pub provides: Option<Yaml>,
    /// Check beds; kept.
    pub eval: Option<Yaml>,
    /// Inline candies rooted at the file's directory.
    pub candy: OrderedMap<Candy>,
    /// Boxes by name.
    #[serde(rename = "box")]
    pub boxes: OrderedMap<BoxDef>,
    /// Builders.
    pub builder: OrderedMap<Builder>,
    /// Distros.
    pub distro: OrderedMap<Distro>,
    /// Init systems.
    pub init: OrderedMap<Init>,
    /// Kept.
    pub resource: Option<Yaml>,
    /// Kept.
    pub deploy: Option<Yaml>,
    /// Kept.
    pub bundle: Option<Yaml>,
    /// Kept.
    pub pod: Option<Yaml>,
    /// Kept.
    pub vm: Option<Yaml>,
    /// Kept.
    pub k8s: Option<Yaml>,
    /// Kept.
    pub local: Option<Yaml>,
    /// Kept.
    pub android: Option<Yaml>,
    /// Kept.
    pub ai: Option<Yaml>,
    /// Kept.
    pub recipe: Option<Yaml>,
    /// Kept.
    pub score: Option<Yaml>,
    /// Kept.
    pub group: Option<Yaml>,
    /// Kept.
    pub target: Option<Yaml>,
    /// Kept.
    pub module: Option<Yaml>,
}

/// One `import:` item.
#[derive(Debug, Clone)]
pub enum ImportItem {
    /// A file merged into the importing namespace.
    Flat(Spanned<String>),
    /// `alias: ref`, a child project mounted under `alias`.
    Namespaced {
        /// The alias.
        alias: Spanned<String>,
        /// The reference (`@github.com/o/r:tag` or a path).
        reference: Spanned<String>,
    },
}

impl<'de> Deserialize<'de> for ImportItem {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let y = Spanned::<Yaml>::deserialize(d)?;
        let node = &y.value.0;
        if let Some(s) = node.as_str() {
            return Ok(ImportItem::Flat(Spanned::new(node.span, s.to_string())));
        }
        match node.as_map() {
            Some([(k, v)]) => match (k.as_str(), v.as_str()) {
                (Some(a), Some(r)) => Ok(ImportItem::Namespaced {
                    alias: Spanned::new(k.span, a.to_string()),
                    reference: Spanned::new(v.span, r.to_string()),
                }),
                _ => Err(D::Error::custom(
                    "an import `alias: ref` needs text on both sides",
                )),
            },
            _ => Err(D::Error::custom(
                "an import is a file path or a single `alias: ref` mapping",
            )),
        }
    }
}

/// One `discover:` item.
#[derive(Debug, Clone)]
pub struct DiscoverItem {
    /// Directory, relative to the file's project.
    pub path: Spanned<String>,
    /// Walk subdirectories (default true).
    pub recursive: bool,
    /// Manifest file name (default `charly.yml`).
    pub manifest: String,
}

impl<'de> Deserialize<'de> for DiscoverItem {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(rename = "discover item")]
        struct Full {
            path: Spanned<String>,
            recursive: Option<bool>,
            manifest: Option<String>,
        }
        let y = Spanned::<Yaml>::deserialize(d)?;
        if let Some(s) = y.value.0.as_str() {
            return Ok(DiscoverItem {
                path: Spanned::new(y.span, s.to_string()),
                recursive: true,
                manifest: "charly.yml".into(),
            });
        }
        let f: Full = crate::yaml::de::nested(&y.value.0)?;
        Ok(DiscoverItem {
            path: f.path,
            recursive: f.recursive.unwrap_or(true),
            manifest: f.manifest.unwrap_or_else(|| "charly.yml".into()),
        })
    }
}
