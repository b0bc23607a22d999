//! Loading a project from disk.
//!
//! Stages: **locate** the root (walk up to `charly.yml`, or `-C DIR`) →
//! **read** each file once into the [`SourceMap`] → **parse** it from its own
//! text (so every value keeps file:line:col) → **classify** each document
//! (root-form settings vs kind-form entities) → **register** names across all
//! files (first registration wins, duplicates warn) → follow **imports**
//! (flat files merge; `alias: ref` mounts a child project offline) →
//! **discover** manifests → fill the **vocabulary** (project entries, then the
//! project's `build.yml`, then the root's, then the embedded default).
//!
//! Problems are collected as diagnostics; only a missing root `charly.yml` is
//! fatal. Remote references (`@github.com/org/repo[/sub]:tag`) never touch the
//! network: they resolve to the working tree when the repo is the project's
//! own identity, to an explicit mapping, to an enclosing checkout whose
//! `repo:` matches, or to `image/<alias>`; otherwise the import is recorded as
//! unavailable and only the boxes that need it fail.
//!
//! The stages, one part each: `read` (files into the source map, parsed
//! ahead in parallel), `classify` (documents of both layouts),
//! `register` (boxes, candies, vocabulary entries, root settings),
//! `imports` (imports, discovery, remote references), `vocab` (the
//! vocabulary and the checks at the end), `files` (the filesystem walks);
//! [`nodeform`] reads today's node form. This file holds the options, the
//! errors and the order of the stages ([`load`]).

use crate::diag::{Diagnostic, nearest};
use crate::model::project::{KIND_KEYS, LEGACY_KEYS, ROOT_KEYS};
use crate::model::{BoxDef, Candy, DiscoverItem, ImportItem, RootDoc, Vocab};
use crate::plugin::{self, PluginDecl, Plugins, ProviderClass};
use crate::source::{FileId, SourceMap, Span};
use crate::walk::Kind;
use crate::yaml::{self, Node, Spanned};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod classify;
mod files;
mod imports;
pub mod nodeform;
mod read;
mod register;
mod vocab;

pub use files::unix;
// The helpers the parts share, named once for all of them (`use super::*`).
use files::{
    copied_links_out, discover_walk, find_localpkg_sources, list_files, read_small_manifests,
};
use vocab::{merge_vocab, merge_vocab_kind};

// The project's types live in `crate::project` (below the loader, so the
// modules that read a project need not depend on how it is loaded); they
// are named here too, where the crates above have always found them.
pub use crate::project::{
    BoxEntry, CandyEntry, ImportBinding, Namespace, NsId, Project, RemoteRef, compare_calver,
    normalize_identity,
};
pub use crate::source::relative;

/// Schema version this charly understands in the classic form (the
/// original's CalVer); node-form projects (2026.174) are read up to
/// [`nodeform::NODEFORM_SCHEMA_VERSION`].
pub const SCHEMA_VERSION: &str = "2026.160.1301";
/// The embedded default vocabulary.
pub const DEFAULT_VOCAB: &str = include_str!("../vocab/default-build.yml");
/// Most levels of flat imports followed.
pub const MAX_IMPORT_DEPTH: usize = 8;

/// Options that change how a project loads.
#[derive(Clone, Default)]
pub struct LoadOptions {
    /// `--import NS=DIR`: where an import alias (or a repo identity) lives.
    pub imports: BTreeMap<String, PathBuf>,
    /// Trees parsed by earlier runs, by the digest of their text
    /// ([`yaml::cache`]): what the project loads is the same with or
    /// without it.
    pub trees: Option<Arc<dyn yaml::TreeCache>>,
    /// Directory listings of earlier runs ([`crate::walk::DirCache`]): the
    /// discovery walk reads only directories that changed; what it finds is
    /// the same with or without them.
    pub dirs: Option<Arc<dyn crate::walk::DirCache>>,
    /// A field (or top-level key) charly does not know is a warning, not an
    /// error (`--allow-unknown-fields`: a project written for a newer
    /// version). By default it is an error: a misspelt field would
    /// otherwise build an image without what it asks for.
    pub allow_unknown_fields: bool,
}

impl std::fmt::Debug for LoadOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadOptions")
            .field("imports", &self.imports)
            .field("trees", &self.trees.is_some())
            .field("dirs", &self.dirs.is_some())
            .field("allow_unknown_fields", &self.allow_unknown_fields)
            .finish()
    }
}

/// A fatal loading error (everything else is a diagnostic).
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// No `charly.yml` where one is needed.
    #[error("no charly.yml found in {0} or any parent directory")]
    NotFound(PathBuf),
    /// The given directory has no `charly.yml`.
    #[error("{0} has no charly.yml")]
    NoProjectFile(PathBuf),
    /// The root `charly.yml` could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Finds the project root: `dir` itself when it has `charly.yml`, else the
/// nearest parent that has one.
pub fn locate(start: &Path) -> Result<PathBuf, LoadError> {
    let mut cur = Some(start);
    while let Some(d) = cur {
        if d.join("charly.yml").is_file() {
            return Ok(d.to_path_buf());
        }
        cur = d.parent();
    }
    Err(LoadError::NotFound(start.to_path_buf()))
}

/// Loads the project rooted at `root` (which must contain `charly.yml`).
pub fn load(root: &Path, opts: &LoadOptions) -> Result<Project, LoadError> {
    let root = std::fs::canonicalize(root).map_err(|source| LoadError::Read {
        path: root.to_path_buf(),
        source,
    })?;
    let file = root.join("charly.yml");
    if !file.is_file() {
        return Err(LoadError::NoProjectFile(root));
    }
    let mut l = Loader {
        p: Project {
            root: root.clone(),
            ..Project::default()
        },
        opts,
        in_progress: Vec::new(),
        loaded_dirs: BTreeMap::new(),
        prefetched: HashMap::new(),
        listed: HashMap::new(),
        plugin_kinds: Vec::new(),
    };
    if l.load_namespace(&root, String::new(), None, None).is_none() {
        // The root file is unusable (read_docs diagnosed why). Namespace 0
        // exists anyway, empty, so nothing below or downstream (resolve,
        // validate, emitters) ever indexes a root that is not there.
        l.p.root_unusable = true;
        l.new_ns(&root, String::new(), None);
    }
    l.load_remote_candies();
    l.check_plugin_kinds();
    l.fill_vocab();
    l.check_schema_version();
    let refused = crate::names::check_project(&l.p);
    l.p.refused_names = refused.clone();
    l.p.diags.extend(refused);
    unknown_fields(&mut l.p.diags, opts.allow_unknown_fields);
    Ok(l.p)
}

/// Unknown fields (and top-level keys) are errors, with how to accept
/// them; warnings (ignored fields) when the project allows them.
fn unknown_fields(diags: &mut crate::diag::Diagnostics, allow: bool) {
    diags.for_each_mut(|d| {
        if d.code != Some(crate::diag::UNKNOWN_FIELD) {
            return;
        }
        if allow {
            d.message
                .push_str("; it is ignored (--allow-unknown-fields)");
        } else {
            d.severity = crate::diag::Severity::Error;
            let accept = "a project written for a newer charly can pass \
                          --allow-unknown-fields (or set `allow_unknown_fields: true` in \
                          .charly/settings.yml) to have unknown fields ignored";
            d.hint = Some(match d.hint.take() {
                Some(h) => format!("{h} ({accept})"),
                None => accept.to_string(),
            });
        }
    });
}

struct Loader<'o> {
    p: Project,
    opts: &'o LoadOptions,
    /// Namespaces still loading, with their identities (cycle breaking).
    in_progress: Vec<(NsId, Option<String>)>,
    /// Canonical dir → namespace (memoization).
    loaded_dirs: BTreeMap<PathBuf, NsId>,
    /// Manifests read and parsed ahead, in parallel ([`Loader::prefetch`]),
    /// and the listings of their directories: taken by the first use.
    prefetched: HashMap<PathBuf, Prefetched>,
    listed: HashMap<PathBuf, Listing>,
    /// Node-form nodes whose kind is no charly kind: (node, kind word,
    /// span), checked against the plugin candies' declarations at the end.
    plugin_kinds: Vec<(String, String, Span)>,
}

/// A manifest read and parsed ahead of its registration: its text and its
/// documents, whose spans name [`PROVISIONAL`] until they are registered.
struct Prefetched {
    text: Arc<str>,
    docs: Vec<Node>,
}

/// What a candy directory holds: its files, and the small manifests among
/// them with their text ([`list_files`], [`read_small_manifests`]).
type Listing = (BTreeSet<String>, BTreeMap<String, String>);

/// The file id of a tree parsed before its file had one.
const PROVISIONAL: FileId = FileId(u32::MAX);

/// One document, classified.
enum Doc {
    Root(Box<RootDoc>),
    Kind {
        kind: String,
        key: Node,
        value: Node,
    },
}

impl Loader<'_> {
    fn diag(&mut self, d: Diagnostic) {
        self.p.diags.push(d);
    }

    fn rel_of(&self, path: &Path) -> String {
        relative(path, &self.p.root)
    }

    fn trees(&self) -> Option<&'_ dyn yaml::TreeCache> {
        self.opts.trees.as_deref()
    }

    fn new_ns(&mut self, dir: &Path, path: String, identity: Option<String>) -> NsId {
        let id = NsId(self.p.namespaces.len());
        self.p.namespaces.push(Namespace {
            path,
            dir: dir.to_path_buf(),
            identity: identity.clone(),
            ..Namespace::default()
        });
        if let Some(i) = identity {
            self.p.repos.entry(i).or_insert_with(|| dir.to_path_buf());
        }
        id
    }

    /// Loads a project directory as a namespace.
    fn load_namespace(
        &mut self,
        dir: &Path,
        path: String,
        identity: Option<String>,
        at: Option<Span>,
    ) -> Option<NsId> {
        let file = dir.join("charly.yml");
        let (fid, docs) = self.read_docs(&file, at)?;
        let ns = self.new_ns(dir, path, identity);
        self.p.namespaces[ns.0].nodeform = docs.iter().any(|d| {
            d.get("version")
                .and_then(Node::as_str)
                .is_some_and(nodeform::is_nodeform_version)
        });
        self.loaded_dirs.insert(dir.to_path_buf(), ns);
        // The root's identity comes from its own `repo:` (read before imports,
        // so a transitive back-reference binds to this tree).
        let roots: Vec<RootDoc> = self.classify_all(docs, fid, dir, ns, false);
        if let Some(repo) = roots.iter().find_map(|r| r.repo.clone()) {
            let ident = normalize_identity(&repo.value);
            if self.p.namespaces[ns.0].identity.is_none() {
                self.p.namespaces[ns.0].identity = Some(ident.clone());
            }
            self.p
                .repos
                .entry(ident)
                .or_insert_with(|| dir.to_path_buf());
        }
        let ident = self.p.namespaces[ns.0].identity.clone();
        self.in_progress.push((ns, ident));
        let mut discover: Option<Vec<(DiscoverItem, PathBuf)>> = None;
        let mut visited = BTreeSet::new();
        visited.insert(file.clone());
        for r in roots {
            self.apply_root_doc(ns, r, dir, &mut discover, &mut visited, 0);
        }
        let discover = discover.unwrap_or_else(|| {
            ["box", "candy"]
                .into_iter()
                .map(|p| {
                    (
                        DiscoverItem {
                            path: Spanned::new(Span::default(), p.to_string()),
                            recursive: true,
                            manifest: "charly.yml".into(),
                        },
                        dir.to_path_buf(),
                    )
                })
                .collect()
        });
        for (item, base) in discover {
            self.discover(ns, &item, &base);
        }
        self.in_progress.pop();
        Some(ns)
    }
}

impl SourceMap {
    /// Whether a file at this absolute path was already read.
    pub fn path_is_loaded(&self, path: &Path) -> Option<FileId> {
        (0..self.len() as u32)
            .map(FileId)
            .find(|id| self.path(*id) == Some(path))
    }
}
