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

pub mod nodeform;

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

    /// Reads and parses a file. `None` when it cannot be used (diagnosed).
    fn read_docs(&mut self, path: &Path, at: Option<Span>) -> Option<(FileId, Vec<Node>)> {
        let parsed = match self.prefetched.remove(path) {
            Some(Prefetched { text, mut docs }) => {
                let id = self
                    .p
                    .sources
                    .add(path.to_path_buf(), self.rel_of(path), text);
                docs.iter_mut().for_each(|d| d.set_file(id));
                (id, Ok(docs))
            }
            None => self.read_and_parse(path, at)?,
        };
        let (id, docs) = parsed;
        let rel = self.p.sources.rel(id).to_string();
        match docs {
            Ok(docs) => {
                if docs.iter().all(Node::is_null) {
                    let at = Span {
                        file: id,
                        line: 1,
                        col: 1,
                        ..Span::default()
                    };
                    if path == self.p.root.join("charly.yml") {
                        // An empty project file is no project: without it the
                        // commands would act on "no boxes" and succeed.
                        self.p.root_unusable = true;
                        self.diag(Diagnostic::error(at, format!("{rel} is empty")).with_hint(
                            format!("a project file needs at least `version: {SCHEMA_VERSION}`"),
                        ));
                    } else {
                        self.diag(Diagnostic::warning(
                            at,
                            format!("{rel} is empty; it defines nothing"),
                        ));
                    }
                }
                Some((id, docs))
            }
            Err(d) => {
                self.diag(d);
                None
            }
        }
    }

    /// Reads a file, registers its text and parses it. `None` when it
    /// cannot be read or is no text (diagnosed).
    #[allow(clippy::type_complexity)]
    fn read_and_parse(
        &mut self,
        path: &Path,
        at: Option<Span>,
    ) -> Option<(FileId, Result<Vec<Node>, Diagnostic>)> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) => {
                self.diag(Diagnostic::error(
                    at,
                    format!("cannot read {}: {e}", self.rel_of(path)),
                ));
                return None;
            }
        };
        let rel = self.rel_of(path);
        let text: Arc<str> = match yaml::check_text(&bytes) {
            Ok(t) => Arc::from(t),
            Err(msg) => {
                // Point at the byte the message is about (the first NUL, else
                // the first invalid UTF-8 byte). The valid text before it is
                // kept as the file's source, so the report shows its line.
                let bad = if bytes.len() > yaml::node::MAX_FILE_BYTES {
                    0
                } else if let Some(nul) = bytes.iter().position(|&b| b == 0) {
                    nul
                } else {
                    std::str::from_utf8(&bytes)
                        .err()
                        .map_or(0, |e| e.valid_up_to())
                };
                let before = &bytes[..bad];
                let prefix = match std::str::from_utf8(before) {
                    Ok(t) => t,
                    Err(e) => std::str::from_utf8(&before[..e.valid_up_to()]).unwrap_or(""),
                };
                let line_start = before
                    .iter()
                    .rposition(|&b| b == b'\n')
                    .map_or(0, |i| i + 1);
                let id = self
                    .p
                    .sources
                    .add(path.to_path_buf(), rel.clone(), Arc::from(prefix));
                self.diag(Diagnostic::error(
                    Span {
                        file: id,
                        offset: u32::try_from(prefix.len()).unwrap_or(0),
                        len: 0,
                        line: u32::try_from(before.iter().filter(|&&b| b == b'\n').count() + 1)
                            .unwrap_or(1),
                        col: u32::try_from(
                            std::str::from_utf8(&before[line_start..])
                                .map_or(bad - line_start, |t| t.chars().count())
                                + 1,
                        )
                        .unwrap_or(1),
                    },
                    format!("{rel}: {msg}"),
                ));
                return None;
            }
        };
        let id = self.p.sources.add(path.to_path_buf(), rel, text.clone());
        Some((id, yaml::parse_cached(self.trees(), id, &text)))
    }

    /// Reads and parses `manifests` ahead, in parallel, with the listings
    /// of their directories: [`Loader::read_docs`] and
    /// [`Loader::add_candy`] then take them in order, so file ids,
    /// diagnostics and the model are what a sequential load gives. A file
    /// that cannot be read or parsed is left to `read_docs` to diagnose.
    /// `listings` are the file lists of some of their directories, known
    /// already (the others are listed here).
    fn prefetch(&mut self, manifests: &[PathBuf], listings: HashMap<PathBuf, BTreeSet<String>>) {
        use rayon::prelude::*;
        let trees = self.trees();
        let ahead: Vec<_> = manifests
            .par_iter()
            .map(|m| {
                let parsed = std::fs::read(m).ok().and_then(|bytes| {
                    let text: Arc<str> = Arc::from(yaml::check_text(&bytes).ok()?);
                    let docs = yaml::parse_cached(trees, PROVISIONAL, &text).ok()?;
                    Some(Prefetched { text, docs })
                });
                let listing = m.parent().map(|d| {
                    let files = listings.get(d).cloned().unwrap_or_else(|| list_files(d));
                    let small = read_small_manifests(d, &files);
                    (d.to_path_buf(), (files, small))
                });
                (m.clone(), parsed, listing)
            })
            .collect();
        for (m, parsed, listing) in ahead {
            if let Some(p) = parsed {
                self.prefetched.insert(m, p);
            }
            if let Some((d, l)) = listing {
                self.listed.insert(d, l);
            }
        }
    }

    fn classify(&mut self, doc: Node, file: FileId, discovered: bool) -> Option<Doc> {
        let whole = Span {
            file,
            line: 1,
            col: 1,
            ..doc.span
        };
        let Some(entries) = doc.as_map() else {
            if doc.is_null() {
                return None;
            }
            self.diag(Diagnostic::error(
                doc.span,
                format!("a charly document is a mapping, found {}", doc.kind_name()),
            ));
            return None;
        };
        if entries.is_empty() {
            return None;
        }
        for (k, _) in entries {
            let key = k.as_str().unwrap_or("");
            if let Some((_, new)) = LEGACY_KEYS.iter().find(|(old, _)| *old == key) {
                self.diag(
                    Diagnostic::error(
                        k.span,
                        format!("`{key}:` is a legacy key this charly does not read"),
                    )
                    .with_hint(format!(
                        "use `{new}:` (see docs/format.md; `charly migrate` converts old files)"
                    )),
                );
                return None;
            }
            if matches!(key, "include" | "benchmark") {
                self.diag(Diagnostic::error(
                    k.span,
                    format!("`{key}:` is not supported in charly documents"),
                ));
                return None;
            }
        }
        let has_name = |v: &Node| v.get("name").is_some();
        // The entries that define an entity (by position: the one kept is
        // moved out of the document, not copied).
        let mut kind_form = Vec::new();
        let mut root_form = false;
        for (at, (k, v)) in entries.iter().enumerate() {
            let key = k.as_str().unwrap_or("");
            let is_kind = KIND_KEYS.contains(&key);
            let is_root = ROOT_KEYS.contains(&key);
            if is_kind
                && (has_name(v)
                    || (discovered && entries.len() == 1 && matches!(key, "candy" | "box")))
            {
                kind_form.push(at);
            } else if is_kind || is_root {
                root_form = true;
            }
        }
        if !kind_form.is_empty() && root_form {
            self.diag(
                Diagnostic::error(whole, "ambiguous document: it mixes entity definitions (`box: {name: …}`) with project settings")
                    .with_hint("put each entity in its own document or file"),
            );
            return None;
        }
        if let [_, second, ..] = kind_form[..] {
            self.diag(Diagnostic::error(
                entries[second].0.span,
                "a document defines one entity; split this into separate documents (`---`)",
            ));
            return None;
        }
        if let Some(at) = kind_form.pop() {
            let kind = entries[at].0.as_str().unwrap_or("").to_string();
            for (k, _) in entries {
                let name = k.as_str().unwrap_or("");
                if name != kind {
                    self.unknown_top_key(k, name);
                }
            }
            // A mapping (`as_map` gave its entries above).
            let yaml::node::Value::Map(mut entries) = doc.value else {
                return None;
            };
            let (key, value) = entries.swap_remove(at);
            return Some(Doc::Kind { kind, key, value });
        }
        for (k, _) in entries {
            let name = k.as_str().unwrap_or("");
            if !KIND_KEYS.contains(&name) && !ROOT_KEYS.contains(&name) {
                self.unknown_top_key(k, name);
            }
        }
        let mut w = Vec::new();
        let r = yaml::from_node::<RootDoc>(&doc, &mut w);
        self.p.diags.extend(w);
        match r {
            Ok(r) => Some(Doc::Root(Box::new(r))),
            Err(d) => {
                self.diag(d);
                None
            }
        }
    }

    /// [`Loader::classify`], and a document of the root's own `charly.yml`
    /// or vocabulary file refused with an error makes the root unusable: the
    /// project's settings would be silently incomplete.
    fn classify_root_aware(&mut self, doc: Node, file: FileId, discovered: bool) -> Option<Doc> {
        let before = self.p.diags.len();
        let d = self.classify(doc, file, discovered);
        if d.is_none()
            && self.is_root_project_file(file)
            && self.p.diags.iter().skip(before).any(Diagnostic::is_error)
        {
            self.p.root_unusable = true;
        }
        d
    }

    /// The root's `charly.yml`, `charly/build.yml` or `build.yml`.
    fn is_root_project_file(&self, file: FileId) -> bool {
        self.p.sources.path(file).is_some_and(|p| {
            ["charly.yml", "charly/build.yml", "build.yml"]
                .iter()
                .any(|f| p == self.p.root.join(f))
        })
    }

    fn unknown_top_key(&mut self, k: &Node, name: &str) {
        let known = ROOT_KEYS.iter().chain(KIND_KEYS.iter()).copied();
        let mut d = Diagnostic::warning(k.span, format!("unknown top-level key `{name}`"))
            .with_code(crate::diag::UNKNOWN_FIELD);
        if let Some(n) = nearest(name, known) {
            d = d.with_hint(format!("did you mean `{n}`?"));
        }
        self.diag(d);
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

    fn classify_all(
        &mut self,
        docs: Vec<Node>,
        fid: FileId,
        dir: &Path,
        ns: NsId,
        discovered: bool,
    ) -> Vec<RootDoc> {
        if self.p.namespaces[ns.0].nodeform {
            return self.classify_all_nodeform(docs, fid, dir, ns, discovered);
        }
        let mut roots = Vec::new();
        for doc in docs {
            match self.classify_root_aware(doc, fid, discovered) {
                Some(Doc::Root(r)) => roots.push(*r),
                Some(Doc::Kind { kind, key, value }) => {
                    self.register_kind(ns, fid, dir, &kind, &key, &value, discovered);
                }
                None => {}
            }
        }
        roots
    }

    /// [`Loader::classify_all`] for a node-form namespace: each document is
    /// read by [`nodeform::read_document`] and its items registered.
    fn classify_all_nodeform(
        &mut self,
        docs: Vec<Node>,
        fid: FileId,
        dir: &Path,
        ns: NsId,
        discovered: bool,
    ) -> Vec<RootDoc> {
        let basename = dir
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut roots = Vec::new();
        for doc in docs {
            if doc.as_map().is_none() && !doc.is_null() && self.is_root_project_file(fid) {
                self.p.root_unusable = true;
            }
            let mut out = Vec::new();
            let items = nodeform::read_document(&doc, &mut out);
            self.p.diags.extend(out);
            let candies = items
                .iter()
                .filter(|i| matches!(i, nodeform::Item::Candy { .. }))
                .count();
            for item in items {
                match item {
                    nodeform::Item::Root(r) => roots.push(*r),
                    nodeform::Item::Candy { key, def } => {
                        let node_name = key.as_str().unwrap_or("").to_string();
                        // A discovered candy is named by its directory.
                        let name = if discovered && candies == 1 {
                            if node_name != basename {
                                self.diag(Diagnostic::warning(
                                    key.span,
                                    format!("candy name `{node_name}` differs from its directory `{basename}`; the directory name is used"),
                                ));
                            }
                            basename.clone()
                        } else {
                            node_name
                        };
                        self.add_candy(ns, fid, dir, name, key.span, *def);
                    }
                    nodeform::Item::Box { key, def } => {
                        let name = key.as_str().unwrap_or("").to_string();
                        let mut def = *def;
                        if def.name.is_none() {
                            def.name = Some(Spanned::new(key.span, name.clone()));
                        }
                        self.add_box(ns, fid, name, key.span, def);
                    }
                    nodeform::Item::Other {
                        kind,
                        plugin_kind,
                        key,
                        value,
                    } => {
                        let name = key.as_str().unwrap_or("").to_string();
                        if plugin_kind {
                            self.plugin_kinds
                                .push((name.clone(), kind.clone(), key.span));
                        }
                        self.nodeform_other(ns, &kind, &name, key.span, value);
                    }
                }
            }
        }
        roots
    }

    /// A node-form vocabulary entry (`distro`, `builder`, `init`) goes into
    /// the namespace's vocabulary (first definition wins; the builders
    /// whose stage templates left 2026.174 keep charly's built-ins); any
    /// other kind is kept as `<kind>/<name>`.
    fn nodeform_other(&mut self, ns: NsId, kind: &str, name: &str, span: Span, value: Node) {
        let vocab = &self.p.namespaces[ns.0].vocab;
        let absent = match kind {
            "distro" => !vocab.distro.contains_key(name),
            "builder" => !vocab.builder.contains_key(name),
            "init" => !vocab.init.contains_key(name),
            _ => {
                self.p.namespaces[ns.0]
                    .kept
                    .entry(format!("{kind}/{name}"))
                    .or_insert_with(|| yaml::Yaml(value));
                return;
            }
        };
        if !absent {
            return;
        }
        let mut w = Vec::new();
        let file = Some(span.file);
        match kind {
            "distro" => {
                if let Some(d) = self.vocab_entry(&value, &mut w) {
                    let n = &mut self.p.namespaces[ns.0];
                    merge_vocab_kind(
                        kind,
                        &mut n.vocab.distro,
                        &mut n.vocab_origin,
                        [(name.into(), d, file)],
                    );
                }
            }
            "builder" => {
                if let Some(b) = self
                    .vocab_entry::<crate::model::Builder>(&value, &mut w)
                    // A builder whose stage template left the vocabulary
                    // keeps charly's built-in one; a project that still
                    // writes its own (a migrated one) keeps its own.
                    .filter(|b| {
                        b.stage_template.is_some() || !nodeform::BUILTIN_BUILDERS.contains(&name)
                    })
                {
                    let n = &mut self.p.namespaces[ns.0];
                    merge_vocab_kind(
                        kind,
                        &mut n.vocab.builder,
                        &mut n.vocab_origin,
                        [(name.into(), b, file)],
                    );
                }
            }
            _ => {
                if let Some(i) = self.vocab_entry(&value, &mut w) {
                    let n = &mut self.p.namespaces[ns.0];
                    merge_vocab_kind(
                        kind,
                        &mut n.vocab.init,
                        &mut n.vocab_origin,
                        [(name.into(), i, file)],
                    );
                }
            }
        }
        self.p.diags.extend(w);
    }

    /// A node-form vocabulary entry's value, its errors reported.
    fn vocab_entry<T: serde::de::DeserializeOwned>(
        &mut self,
        value: &Node,
        w: &mut Vec<Diagnostic>,
    ) -> Option<T> {
        yaml::from_node::<T>(value, w)
            .map_err(|d| self.p.diags.push(d))
            .ok()
    }

    #[allow(clippy::too_many_arguments)]
    fn register_kind(
        &mut self,
        ns: NsId,
        fid: FileId,
        dir: &Path,
        kind: &str,
        key: &Node,
        value: &Node,
        discovered: bool,
    ) {
        let basename = dir
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        match kind {
            "candy" => {
                let mut w = Vec::new();
                let r = yaml::from_node::<Candy>(value, &mut w);
                self.p.diags.extend(w);
                let Ok(def) = r.map_err(|d| self.diag(d)) else {
                    return;
                };
                // A discovered candy is named by its directory.
                let name = if discovered {
                    if let Some(n) = &def.name
                        && n.value != basename
                    {
                        self.diag(
                            Diagnostic::warning(n.span, format!("candy name `{}` differs from its directory `{basename}`; the directory name is used", n.value)),
                        );
                    }
                    basename
                } else {
                    def.name
                        .as_ref()
                        .map(|n| n.value.clone())
                        .unwrap_or(basename)
                };
                self.add_candy(ns, fid, dir, name, key.span, def);
            }
            "box" => {
                let mut w = Vec::new();
                let r = yaml::from_node::<BoxDef>(value, &mut w);
                self.p.diags.extend(w);
                let Ok(def) = r.map_err(|d| self.diag(d)) else {
                    return;
                };
                let name = def
                    .name
                    .as_ref()
                    .map(|n| n.value.clone())
                    .filter(|n| !n.is_empty())
                    .unwrap_or(basename);
                self.add_box(ns, fid, name, key.span, def);
            }
            other => {
                // Other kinds (vm, pod, deploy, …) are kept, not built.
                let name = value
                    .get("name")
                    .and_then(Node::as_str)
                    .unwrap_or("")
                    .to_string();
                self.p.namespaces[ns.0]
                    .kept
                    .entry(format!("{other}/{name}"))
                    .or_insert_with(|| yaml::Yaml(value.clone()));
            }
        }
    }

    fn add_box(&mut self, ns: NsId, file: FileId, name: String, span: Span, def: BoxDef) {
        if name.is_empty() {
            self.diag(Diagnostic::error(span, "a box needs a name"));
            return;
        }
        let nsr = &self.p.namespaces[ns.0];
        if let Some(prev) = nsr.boxes.get(&name) {
            let prev_loc = format!("{}:{}", self.p.sources.rel(prev.file), prev.span.line);
            self.diag(Diagnostic::warning(
                span,
                format!(
                    "box `{name}` is already defined at {prev_loc}; this definition is ignored"
                ),
            ));
            return;
        }
        self.p.namespaces[ns.0].boxes.insert(
            name.clone(),
            BoxEntry {
                name,
                ns,
                file,
                span,
                def,
            },
        );
    }

    fn add_candy(
        &mut self,
        ns: NsId,
        file: FileId,
        dir: &Path,
        name: String,
        span: Span,
        def: Candy,
    ) -> String {
        let key = name.clone();
        if let Some(prev) = self.p.candies.get(&key) {
            if prev.dir != dir {
                let prev_loc = format!("{}:{}", self.p.sources.rel(prev.file), prev.span.line);
                self.diag(Diagnostic::warning(
                    span,
                    format!("candy `{name}` is already defined at {prev_loc}; this definition is ignored"),
                ));
            }
            return key;
        }
        let (files, small_files) = self.listed.remove(dir).unwrap_or_else(|| {
            let files = list_files(dir);
            let small = read_small_manifests(dir, &files);
            (files, small)
        });
        let localpkg_sources = find_localpkg_sources(&def, dir, &self.p.root);
        let links_out = copied_links_out(&def, dir, &files, &[&self.p.root, &self.p.ns(ns).dir]);
        let rel_dir = dir.strip_prefix(&self.p.root).ok().map(unix);
        self.p.candies.insert(
            key.clone(),
            CandyEntry {
                key: key.clone(),
                name,
                dir: dir.to_path_buf(),
                rel_dir,
                ns,
                file,
                span,
                def: Box::new(def),
                files,
                small_files,
                localpkg_sources,
                links_out,
            },
        );
        key
    }

    #[allow(clippy::too_many_arguments)]
    fn apply_root_doc(
        &mut self,
        ns: NsId,
        r: RootDoc,
        file_dir: &Path,
        discover: &mut Option<Vec<(DiscoverItem, PathBuf)>>,
        visited: &mut BTreeSet<PathBuf>,
        depth: usize,
    ) {
        {
            let n = &mut self.p.namespaces[ns.0];
            if n.version.is_none() {
                n.version = r.version.clone();
            }
            if let Some(d) = r.defaults.clone()
                && n.defaults.build.is_none()
                && n.defaults.base.is_none()
                && n.defaults.builder.is_empty()
                && n.defaults.registry.is_none()
            {
                n.defaults = d;
            }
            for (k, v) in [
                ("eval", &r.eval),
                ("vm", &r.vm),
                ("pod", &r.pod),
                ("local", &r.local),
                ("deploy", &r.deploy),
                ("bundle", &r.bundle),
                ("k8s", &r.k8s),
            ] {
                if let Some(v) = v {
                    n.kept.entry(k.to_string()).or_insert_with(|| v.clone());
                }
            }
        }
        if let Some(items) = &r.discover {
            let list = discover.get_or_insert_with(Vec::new);
            for it in items {
                list.push((it.clone(), file_dir.to_path_buf()));
            }
        }
        // Vocabulary entries: first definition wins.
        let (builder, distro, init) = (r.builder, r.distro, r.init);
        merge_vocab(&mut self.p.namespaces[ns.0], builder, distro, init, |k| {
            k.span.file
        });
        for (k, v) in r.boxes.0 {
            self.add_box(ns, k.span.file, k.value, k.span, v);
        }
        for (k, v) in r.candy.0 {
            let span = k.span;
            let dir = file_dir.to_path_buf();
            self.add_candy(ns, span.file, &dir, k.value, span, v);
        }
        for item in r.import {
            match item {
                ImportItem::Flat(f) => {
                    self.flat_import(ns, &f, file_dir, discover, visited, depth + 1)
                }
                ImportItem::Namespaced { alias, reference } => {
                    self.namespaced_import(ns, &alias, &reference)
                }
            }
        }
    }

    fn flat_import(
        &mut self,
        ns: NsId,
        f: &Spanned<String>,
        file_dir: &Path,
        discover: &mut Option<Vec<(DiscoverItem, PathBuf)>>,
        visited: &mut BTreeSet<PathBuf>,
        depth: usize,
    ) {
        if depth > MAX_IMPORT_DEPTH {
            self.diag(Diagnostic::error(
                f.span,
                format!("imports nest deeper than {MAX_IMPORT_DEPTH} levels"),
            ));
            return;
        }
        let path = if let Some(r) = f.value.strip_prefix('@') {
            match RemoteRef::parse(r).and_then(|rr| {
                self.repo_dir(&rr.repo)
                    .map(|d| d.join(&rr.sub))
                    .ok_or_else(|| {
                        format!(
                            "repository {} is not available offline (map it with --import {}=DIR)",
                            rr.repo, rr.repo
                        )
                    })
            }) {
                Ok(p) => p,
                Err(msg) => {
                    self.diag(Diagnostic::error(
                        f.span,
                        format!("import `{}`: {msg}", f.value),
                    ));
                    return;
                }
            }
        } else {
            file_dir.join(&f.value)
        };
        let path = if path.is_dir() {
            path.join("charly.yml")
        } else {
            path
        };
        let canon = std::fs::canonicalize(&path).unwrap_or(path.clone());
        if !visited.insert(canon.clone()) {
            self.diag(Diagnostic::error(
                f.span,
                format!("include cycle: `{}` is already being imported", f.value),
            ));
            return;
        }
        let Some((fid, docs)) = self.read_docs(&canon, Some(f.span)) else {
            return;
        };
        let dir = canon.parent().unwrap_or(file_dir).to_path_buf();
        let roots = self.classify_all(docs, fid, &dir, ns, false);
        for r in roots {
            self.apply_root_doc(ns, r, &dir, discover, visited, depth);
        }
    }

    /// Where a repo identity's working tree is, offline.
    fn repo_dir(&self, identity: &str) -> Option<PathBuf> {
        let identity = normalize_identity(identity);
        if let Some(d) = self.opts.imports.get(&identity) {
            return Some(d.clone());
        }
        for n in &self.p.namespaces {
            if n.identity.as_deref() == Some(identity.as_str()) {
                return Some(n.dir.clone());
            }
        }
        // An enclosing checkout (a superproject) whose `repo:` matches.
        let mut cur = self.p.root.parent();
        while let Some(d) = cur {
            let f = d.join("charly.yml");
            if f.is_file()
                && let Ok(text) = std::fs::read_to_string(&f)
                && let Some(line) = text.lines().find(|l| l.starts_with("repo:"))
                && normalize_identity(
                    line.trim_start_matches("repo:")
                        .trim()
                        .trim_matches(['"', '\'']),
                ) == identity
            {
                return Some(d.to_path_buf());
            }
            cur = d.parent();
        }
        None
    }

    fn namespaced_import(
        &mut self,
        ns: NsId,
        alias: &Spanned<String>,
        reference: &Spanned<String>,
    ) {
        let a = alias.value.as_str();
        if crate::names::entity(a).is_err() {
            self.diag(Diagnostic::error(
                alias.span,
                format!("import alias `{a}` must be lowercase words joined by `-` (e.g. `my-lib`)"),
            ));
            return;
        }
        if let Some(prev) = self.p.namespaces[ns.0].imports.get(a) {
            let same = matches!(prev, ImportBinding::Unavailable { reference: r, .. } if *r == reference.value);
            if !same && !matches!(prev, ImportBinding::Bound(_)) {
                self.diag(Diagnostic::error(
                    alias.span,
                    format!("import alias `{a}` is bound twice"),
                ));
            }
            return;
        }
        let parent_path = self.p.namespaces[ns.0].path.clone();
        let child_path = if parent_path.is_empty() {
            a.to_string()
        } else {
            format!("{parent_path}.{a}")
        };
        let ns_dir = self.p.namespaces[ns.0].dir.clone();
        // Identity first: a back-reference to a namespace still loading binds to it.
        let (identity, local_dir) = if let Some(r) = reference.value.strip_prefix('@') {
            match RemoteRef::parse(r) {
                Ok(rr) => (
                    Some(rr.repo.clone()),
                    None::<PathBuf>.or_else(|| self.repo_dir(&rr.repo).map(|d| d.join(&rr.sub))),
                ),
                Err(msg) => {
                    self.diag(Diagnostic::error(reference.span, msg));
                    return;
                }
            }
        } else {
            (None, Some(ns_dir.join(&reference.value)))
        };
        if let Some(ident) = &identity
            && let Some((bound, _)) = self
                .in_progress
                .iter()
                .find(|(_, i)| i.as_deref() == Some(ident.as_str()))
        {
            let bound = *bound;
            self.p.namespaces[ns.0]
                .imports
                .insert(a.to_string(), ImportBinding::Bound(bound));
            return;
        }
        let explicit = self
            .opts
            .imports
            .get(&child_path)
            .or_else(|| self.opts.imports.get(a))
            .cloned();
        let candidates: Vec<PathBuf> = explicit
            .into_iter()
            .chain(local_dir)
            .chain([
                self.p.root.join("image").join(a),
                ns_dir.join("image").join(a),
            ])
            .collect();
        let mut candidates = candidates;
        candidates.dedup();
        let found = candidates
            .iter()
            .find(|d| d.join("charly.yml").is_file())
            .cloned();
        let Some(dir) = found else {
            let looked: Vec<String> = candidates.iter().map(|d| self.rel_of(d)).collect();
            self.p.namespaces[ns.0].imports.insert(
                a.to_string(),
                ImportBinding::Unavailable {
                    reference: reference.value.clone(),
                    span: reference.span,
                    reason: format!(
                        "import `{a}` ({}) is not available offline: no charly.yml in {}; pass --import {a}=DIR",
                        reference.value,
                        looked.join(", ")
                    ),
                },
            );
            return;
        };
        let dir = std::fs::canonicalize(&dir).unwrap_or(dir);
        if let Some(&id) = self.loaded_dirs.get(&dir) {
            self.p.namespaces[ns.0]
                .imports
                .insert(a.to_string(), ImportBinding::Bound(id));
            return;
        }
        match self.load_namespace(&dir, child_path, identity, Some(reference.span)) {
            Some(id) => {
                self.p.namespaces[ns.0]
                    .imports
                    .insert(a.to_string(), ImportBinding::Bound(id));
            }
            None => {
                self.p.namespaces[ns.0].imports.insert(
                    a.to_string(),
                    ImportBinding::Unavailable {
                        reference: reference.value.clone(),
                        span: reference.span,
                        reason: format!("import `{a}` failed to load (see the errors above)"),
                    },
                );
            }
        }
    }

    fn discover(&mut self, ns: NsId, item: &DiscoverItem, base: &Path) {
        let dir = base.join(&item.path.value);
        if !dir.is_dir() {
            return;
        }
        let mut manifests = Vec::new();
        let mut listings = HashMap::new();
        if item.recursive {
            (manifests, listings) = discover_walk(&dir, &item.manifest, self.opts.dirs.as_deref());
        } else {
            let mut subdirs: Vec<PathBuf> = std::fs::read_dir(&dir)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect();
            subdirs.sort();
            for d in subdirs {
                let f = d.join(&item.manifest);
                if f.is_file() {
                    manifests.push(f);
                }
            }
        }
        self.prefetch(&manifests, listings);
        for m in manifests {
            let Some((fid, docs)) = self.read_docs(&m, None) else {
                continue;
            };
            let mdir = m.parent().unwrap_or(&dir).to_path_buf();
            let roots = self.classify_all(docs, fid, &mdir, ns, true);
            for r in roots {
                let mut disc = None;
                let mut visited = BTreeSet::new();
                self.apply_root_doc(ns, r, &mdir, &mut disc, &mut visited, 0);
            }
        }
    }

    /// Loads candies named by remote refs (`@github.com/…/candy/x:tag`) from
    /// their offline working trees, transitively; a plain name inside such a
    /// candy means a sibling in the same repo.
    fn load_remote_candies(&mut self) {
        loop {
            let mut wanted: BTreeMap<String, (PathBuf, Span)> = BTreeMap::new();
            for (r, span, from) in self.all_candy_refs() {
                let dir = if let Some(rest) = r.strip_prefix('@') {
                    let Ok(rr) = RemoteRef::parse(rest) else {
                        continue;
                    };
                    let Some(repo_dir) = self.repo_dir(&rr.repo) else {
                        continue;
                    };
                    self.p
                        .repos
                        .entry(rr.repo.clone())
                        .or_insert_with(|| repo_dir.clone());
                    repo_dir.join(&rr.sub)
                } else {
                    // A sibling of a candy that lives outside the project tree.
                    let Some(from_dir) = from
                        .as_ref()
                        .and_then(|k| self.p.candies.get(k))
                        .map(|c| c.dir.clone())
                    else {
                        continue;
                    };
                    if from_dir.starts_with(&self.p.root) {
                        continue;
                    }
                    let Some(parent) = from_dir.parent() else {
                        continue;
                    };
                    parent.join(&r)
                };
                let Ok(key) = self.p.candy_key(&r) else {
                    continue;
                };
                if self.p.candies.contains_key(&key) {
                    continue;
                }
                wanted.entry(key).or_insert((dir, span));
            }
            let mut progressed = false;
            for (key, (dir, span)) in wanted {
                let file = dir.join("charly.yml");
                if !file.is_file() {
                    continue;
                }
                let Some((fid, docs)) = self.read_docs(&file, Some(span)) else {
                    continue;
                };
                for doc in docs {
                    if nodeform::looks_like_node_doc(&doc) {
                        let mut out = Vec::new();
                        let items = nodeform::read_document(&doc, &mut out);
                        self.p.diags.extend(out);
                        for item in items {
                            if let nodeform::Item::Candy { key: k, def } = item {
                                self.add_candy(NsId(0), fid, &dir, key.clone(), k.span, *def);
                                progressed = true;
                            }
                        }
                        continue;
                    }
                    if let Some(Doc::Kind {
                        kind,
                        key: k,
                        value,
                    }) = self.classify(doc, fid, true)
                        && kind == "candy"
                    {
                        let mut w = Vec::new();
                        let r = yaml::from_node::<Candy>(&value, &mut w);
                        self.p.diags.extend(w);
                        if let Ok(def) = r.map_err(|d| self.diag(d)) {
                            self.add_candy(NsId(0), fid, &dir, key.clone(), k.span, def);
                            progressed = true;
                        }
                    }
                }
            }
            if !progressed {
                break;
            }
        }
    }

    /// Every candy reference in boxes and candies: (ref, span, referring candy key).
    fn all_candy_refs(&self) -> Vec<(String, Span, Option<String>)> {
        let mut out = Vec::new();
        for n in &self.p.namespaces {
            for b in n.boxes.values() {
                for c in &b.def.candy {
                    out.push((c.value.clone(), c.span, None));
                }
            }
        }
        for c in self.p.candies.values() {
            for r in c.def.require.iter().chain(c.def.candy.iter()) {
                out.push((r.value.clone(), r.span, Some(c.key.clone())));
            }
        }
        out
    }

    /// Fills each namespace's vocabulary: its own entries, then its
    /// `build.yml` (`charly/build.yml` or `build.yml`), then the root's, then
    /// the embedded default. Whole entries, no deep merge.
    fn fill_vocab(&mut self) {
        let default = self.parse_vocab_text("<embedded>/default-build.yml", DEFAULT_VOCAB);
        for i in 0..self.p.namespaces.len() {
            let dir = self.p.namespaces[i].dir.clone();
            if self.p.namespaces[i].nodeform {
                // The 2026.174 vocabulary is node form, in `charly/charly.yml`;
                // a box repository without one uses the vocabulary of the
                // repository its shared candies come from (reached offline).
                let own = dir.join("charly/charly.yml");
                let f = if own.is_file() {
                    own
                } else {
                    let used: BTreeSet<&PathBuf> =
                        self.p.candies.values().map(|c| &c.dir).collect();
                    self.p
                        .repos
                        .values()
                        .filter(|r| **r != dir && used.iter().any(|c| c.starts_with(r)))
                        .map(|r| r.join("charly/charly.yml"))
                        .find(|f| f.is_file())
                        .unwrap_or(own)
                };
                if f.is_file() && self.p.sources.path_is_loaded(&f).is_none() {
                    if let Some((fid, docs)) = self.read_docs(&f, None) {
                        self.classify_all_nodeform(docs, fid, &dir, NsId(i), false);
                    } else if i == 0 {
                        self.p.root_unusable = true;
                    }
                }
                continue;
            }
            for cand in ["charly/build.yml", "build.yml"] {
                let f = dir.join(cand);
                if f.is_file() && self.p.sources.path_is_loaded(&f).is_none() {
                    if let Some((fid, docs)) = self.read_docs(&f, None) {
                        for doc in docs {
                            if let Some(Doc::Root(r)) = self.classify_root_aware(doc, fid, false) {
                                {
                                    let r = *r;
                                    merge_vocab(
                                        &mut self.p.namespaces[i],
                                        r.builder,
                                        r.distro,
                                        r.init,
                                        |_| fid,
                                    );
                                }
                            }
                        }
                    } else if i == 0 {
                        self.p.root_unusable = true;
                    }
                    break;
                }
            }
        }
        let (root_vocab, root_origin) = self
            .p
            .namespaces
            .first()
            .map(|n| (n.vocab.clone(), n.vocab_origin.clone()))
            .unwrap_or_default();
        for i in 0..self.p.namespaces.len() {
            let n = &mut self.p.namespaces[i];
            if i != 0 {
                fill_missing(n, &root_vocab, &root_origin);
            }
            if let Some((vocab, origin)) = &default {
                fill_missing(n, vocab, origin);
            }
        }
    }

    fn parse_vocab_text(
        &mut self,
        name: &str,
        text: &str,
    ) -> Option<(Vocab, BTreeMap<String, FileId>)> {
        let id = self
            .p
            .sources
            .add(PathBuf::from(name), name.to_string(), Arc::from(text));
        let docs = match yaml::parse_cached(self.trees(), id, text) {
            Ok(d) => d,
            Err(d) => {
                self.diag(d);
                return None;
            }
        };
        let mut ns = Namespace::default();
        for doc in docs {
            let mut w = Vec::new();
            match yaml::from_node::<RootDoc>(&doc, &mut w) {
                Ok(r) => merge_vocab(&mut ns, r.builder, r.distro, r.init, |_| id),
                Err(d) => self.diag(d),
            }
            self.p.diags.extend(w);
        }
        Some((ns.vocab, ns.vocab_origin))
    }

    /// A node-form node of a kind charly does not know is fine when a plugin
    /// candy declares that kind (`plugin: {providers: ["kind:<word>"]}`).
    ///
    /// Collects every candy's `plugin:` declaration into
    /// [`Project::plugins`] first (both eras spell it the same way).
    fn check_plugin_kinds(&mut self) {
        let mut out = Vec::new();
        let decls: Vec<(String, PluginDecl)> = self
            .p
            .candies
            .values()
            .filter_map(|c| {
                let y = c.def.plugin.as_ref()?;
                Some((c.key.clone(), plugin::parse_decl(&c.key, &y.0, &mut out)))
            })
            .collect();
        self.p.plugins = Plugins::collect(decls.iter().map(|(k, d)| (k.as_str(), d)), &mut out);
        for c in self.p.candies.values() {
            for (i, t) in c.def.task.iter().enumerate() {
                plugin::check_task(&self.p.plugins, &c.key, i, t, &mut out);
            }
        }
        self.p.diags.extend(out);
        if self.plugin_kinds.is_empty() {
            return;
        }
        let declared: BTreeSet<String> = self
            .p
            .plugins
            .words(&[ProviderClass::Kind, ProviderClass::Deploy])
            .into_iter()
            .map(str::to_string)
            .collect();
        for (name, kind, span) in std::mem::take(&mut self.plugin_kinds) {
            if declared.contains(&kind) {
                continue;
            }
            let mut d = Diagnostic::error(
                span,
                format!(
                    "node `{name}`: `{kind}` is neither a charly kind ({}) nor declared by a plugin candy",
                    nodeform::NODE_KINDS.join(", ")
                ),
            )
            .with_hint(format!(
                "a plugin candy declares it with `plugin: {{providers: [\"kind:{kind}\"]}}`"
            ));
            if let Some(n) = nearest(&kind, declared.iter().map(String::as_str)) {
                d = d.with_hint(format!("did you mean `{n}`?"));
            }
            self.diag(d);
        }
    }

    fn check_schema_version(&mut self) {
        let Some(v) = self.p.namespaces.first().and_then(|n| n.version.clone()) else {
            if self.p.root_unusable {
                // Already an error; "declares no version" would only mislead.
                return;
            }
            let root_file = self.p.sources.find_rel("charly.yml");
            self.diag(
                Diagnostic::warning(
                    root_file.map(|f| Span {
                        file: f,
                        line: 1,
                        col: 1,
                        ..Span::default()
                    }),
                    "charly.yml declares no schema `version:`",
                )
                .with_hint(format!("add `version: {SCHEMA_VERSION}`")),
            );
            return;
        };
        if self.p.namespaces[0].nodeform {
            let newest = nodeform::NODEFORM_SCHEMA_VERSION;
            if !nodeform::is_strict_calver(&v.value) {
                self.diag(Diagnostic::error(
                    v.span,
                    format!(
                        "schema version `{}` is not a strict CalVer YYYY.DDD.HHMM like {newest}",
                        v.value
                    ),
                ));
            } else if compare_calver(&v.value, newest) == Some(std::cmp::Ordering::Greater) {
                self.diag(
                    Diagnostic::error(
                        v.span,
                        format!(
                            "schema version {} is newer than this charly supports ({newest})",
                            v.value
                        ),
                    )
                    .with_hint("upgrade charly"),
                );
            }
            return;
        }
        match compare_calver(&v.value, SCHEMA_VERSION) {
            Some(std::cmp::Ordering::Greater) => self.diag(
                Diagnostic::error(
                    v.span,
                    format!(
                        "schema version {} is newer than this charly supports ({SCHEMA_VERSION})",
                        v.value
                    ),
                )
                .with_hint("upgrade charly"),
            ),
            Some(_) => {}
            None => self.diag(Diagnostic::error(
                v.span,
                format!(
                    "schema version `{}` is not a CalVer like {SCHEMA_VERSION}",
                    v.value
                ),
            )),
        }
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

/// Vocabulary entries of one kind merged into a namespace's: the first
/// definition of a name wins, and `origin` remembers the file it came from
/// as `<kind>/<name>` (when known).
fn merge_vocab_kind<V>(
    kind: &str,
    into: &mut BTreeMap<String, V>,
    origin: &mut BTreeMap<String, FileId>,
    entries: impl IntoIterator<Item = (String, V, Option<FileId>)>,
) {
    for (name, v, file) in entries {
        if let std::collections::btree_map::Entry::Vacant(e) = into.entry(name) {
            if let Some(f) = file {
                origin.insert(format!("{kind}/{}", e.key()), f);
            }
            e.insert(v);
        }
    }
}

/// A document's vocabulary merged into a namespace's; `file` says which
/// file each entry came from.
fn merge_vocab(
    n: &mut Namespace,
    builder: crate::yaml::OrderedMap<crate::model::Builder>,
    distro: crate::yaml::OrderedMap<crate::model::Distro>,
    init: crate::yaml::OrderedMap<crate::model::Init>,
    file: impl Fn(&Spanned<String>) -> FileId,
) {
    fn with_files<'a, V: 'a>(
        m: crate::yaml::OrderedMap<V>,
        file: &'a impl Fn(&Spanned<String>) -> FileId,
    ) -> impl Iterator<Item = (String, V, Option<FileId>)> + 'a {
        m.0.into_iter().map(move |(k, v)| {
            let f = file(&k);
            (k.value, v, Some(f))
        })
    }
    let to = &mut n.vocab_origin;
    merge_vocab_kind(
        "builder",
        &mut n.vocab.builder,
        to,
        with_files(builder, &file),
    );
    merge_vocab_kind("distro", &mut n.vocab.distro, to, with_files(distro, &file));
    merge_vocab_kind("init", &mut n.vocab.init, to, with_files(init, &file));
}

/// The entries of `v` that the namespace lacks, with their files from
/// `origin`.
fn fill_missing(n: &mut Namespace, v: &Vocab, origin: &BTreeMap<String, FileId>) {
    fn entries<'a, V: Clone>(
        kind: &'a str,
        m: &'a BTreeMap<String, V>,
        origin: &'a BTreeMap<String, FileId>,
    ) -> impl Iterator<Item = (String, V, Option<FileId>)> + 'a {
        m.iter().map(move |(k, v)| {
            let f = origin.get(&format!("{kind}/{k}")).copied();
            (k.clone(), v.clone(), f)
        })
    }
    let to = &mut n.vocab_origin;
    merge_vocab_kind(
        "builder",
        &mut n.vocab.builder,
        to,
        entries("builder", &v.builder, origin),
    );
    merge_vocab_kind(
        "distro",
        &mut n.vocab.distro,
        to,
        entries("distro", &v.distro, origin),
    );
    merge_vocab_kind(
        "init",
        &mut n.vocab.init,
        to,
        entries("init", &v.init, origin),
    );
}

/// Resolves each `localpkg:` source: an absolute path, else under the candy
/// directory, else under the project directory, else the first match
/// walking up from the project (at most 64 levels).
fn find_localpkg_sources(
    def: &Candy,
    candy_dir: &Path,
    root: &Path,
) -> BTreeMap<String, (PathBuf, BTreeSet<String>)> {
    let mut out = BTreeMap::new();
    let Some(map) = &def.localpkg else { return out };
    for (fmt, rel) in map.value.0.iter() {
        let rel = Path::new(&rel.value);
        let mut candidates: Vec<PathBuf> = Vec::new();
        if rel.is_absolute() {
            candidates.push(rel.to_path_buf());
        } else {
            candidates.push(candy_dir.join(rel));
            let mut cur = Some(root);
            let mut depth = 0;
            while let Some(d) = cur {
                candidates.push(d.join(rel));
                depth += 1;
                if depth > 64 {
                    break;
                }
                cur = d.parent();
            }
        }
        if let Some(dir) = candidates.into_iter().find(|d| d.is_dir()) {
            let files = list_files(&dir);
            out.insert(fmt.value.clone(), (dir, files));
        }
    }
    out
}

/// Reads top-level `*.json` / `*.toml` files of at most 64 KiB.
fn read_small_manifests(dir: &Path, files: &BTreeSet<String>) -> BTreeMap<String, String> {
    files
        .iter()
        .filter(|f| !f.contains('/') && (f.ends_with(".json") || f.ends_with(".toml")))
        .filter_map(|f| {
            let p = dir.join(f);
            let meta = std::fs::metadata(&p).ok()?;
            if meta.len() > 64 * 1024 {
                return None;
            }
            Some((f.clone(), std::fs::read_to_string(p).ok()?))
        })
        .collect()
}

/// The manifests named `manifest` under `dir` (sorted, skipping `.git` and
/// `.build`), and the [`list_files`] of their directories taken from the
/// same walk instead of walking each directory again. `dirs` may answer the
/// walk's listings ([`crate::walk`]).
fn discover_walk(
    dir: &Path,
    manifest: &str,
    dirs: Option<&dyn crate::walk::DirCache>,
) -> (Vec<PathBuf>, HashMap<PathBuf, BTreeSet<String>>) {
    let skipped_build = std::sync::Mutex::new(Vec::new());
    let all = crate::walk::walk(dir, dirs, &|path, _| match path.file_name() {
        Some(n) if n == ".build" => {
            if let Ok(mut s) = skipped_build.lock() {
                s.push(path.to_path_buf());
            }
            false
        }
        Some(n) => n != ".git",
        None => true,
    });
    let skipped_build = skipped_build.into_inner().unwrap_or_default();
    let manifests: Vec<PathBuf> = all
        .iter()
        .filter(|e| e.kind == Kind::File && e.path.file_name().is_some_and(|n| n == manifest))
        .map(|e| e.path.clone())
        .collect();
    let listings = listings_from_walk(&all, &manifests, &skipped_build);
    (manifests, listings)
}

/// [`list_files`] of each manifest's directory, from a walk that already
/// saw everything under them: `all`, every entry of a [`crate::walk::walk`]
/// that left out `.git` and `.build` (those in `skipped_build`). A directory
/// with a `.build` somewhere below it is not answered (`list_files` does not
/// skip `.build`): it is listed on its own.
fn listings_from_walk(
    all: &[crate::walk::WalkEntry],
    manifests: &[PathBuf],
    skipped_build: &[PathBuf],
) -> HashMap<PathBuf, BTreeSet<String>> {
    let at: HashMap<&Path, usize> = all
        .iter()
        .enumerate()
        .filter(|(_, e)| e.kind == Kind::Dir)
        .map(|(i, e)| (e.path.as_path(), i))
        .collect();
    // Directories with their own `charly.yml` (a nested candy: not listed).
    let nested: std::collections::HashSet<&Path> = all
        .iter()
        .filter(|e| {
            e.path.file_name().is_some_and(|n| n == "charly.yml")
                && (e.kind == Kind::File || (e.kind == Kind::Symlink && e.path.is_file()))
        })
        .filter_map(|e| e.path.parent())
        .collect();
    let mut out = HashMap::new();
    for m in manifests {
        let Some(d) = m.parent() else { continue };
        let Some(&i) = at.get(d) else { continue };
        if skipped_build.iter().any(|b| b.starts_with(d)) {
            continue;
        }
        let depth = all[i].depth;
        let mut files = BTreeSet::new();
        let mut j = i + 1;
        while j < all.len() && all[j].depth > depth {
            let e = &all[j];
            if e.kind == Kind::Dir {
                if nested.contains(e.path.as_path()) {
                    // Skip the nested candy's whole tree.
                    let nd = e.depth;
                    j += 1;
                    while j < all.len() && all[j].depth > nd {
                        j += 1;
                    }
                    continue;
                }
            } else if let Ok(r) = e.path.strip_prefix(d) {
                files.insert(unix(r));
            }
            j += 1;
        }
        out.insert(d.to_path_buf(), files);
    }
    out
}

/// The files `copy:` tasks of `def` name (a file, or every file under a
/// directory) that are symlinks leading outside every one of `roots` (or
/// nowhere). One `lstat` per copied file; a link is resolved only then.
fn copied_links_out(
    def: &crate::model::Candy,
    dir: &Path,
    files: &BTreeSet<String>,
    roots: &[&Path],
) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for t in &def.task {
        let Some(src) = t.copy.as_ref().map(|s| s.value.trim_start_matches("./")) else {
            continue;
        };
        let under = format!("{}/", src.trim_end_matches('/'));
        for f in files
            .iter()
            .filter(|f| f.as_str() == src || f.starts_with(&under))
        {
            let p = dir.join(f);
            if !std::fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_symlink()) {
                continue;
            }
            let inside = std::fs::canonicalize(&p).is_ok_and(|real| {
                roots
                    .iter()
                    .any(|r| std::fs::canonicalize(r).is_ok_and(|r| real.starts_with(r)))
            });
            if !inside {
                out.insert(f.clone());
            }
        }
    }
    out
}

/// Lists the files under a candy directory (relative, sorted), skipping
/// `.git` and nested candies (directories with their own `charly.yml`).
fn list_files(dir: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let walker = walkdir::WalkDir::new(dir)
        .sort_by_file_name()
        .into_iter()
        .filter_entry(|e| {
            if e.depth() == 0 {
                return true;
            }
            if e.file_name() == ".git" {
                return false;
            }
            !(e.file_type().is_dir() && e.path().join("charly.yml").is_file())
        });
    for e in walker.flatten() {
        if e.depth() == 0 || e.file_type().is_dir() {
            continue;
        }
        if let Ok(r) = e.path().strip_prefix(dir) {
            out.insert(unix(r));
        }
    }
    out
}

/// A path with `/` separators.
pub fn unix(p: &Path) -> String {
    p.components()
        .map(|c| c.as_os_str().to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The listings the discovery walk gives are what [`list_files`] gives
    /// each directory: nested candies, `.git`, `.build`, symlinks.
    #[test]
    fn listings_from_the_discovery_walk_are_list_files() {
        let tmp = tempfile::tempdir().expect("tmp");
        let d = tmp.path().join("candy");
        let w = |rel: &str| {
            let p = d.join(rel);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(p, "x").expect("write");
        };
        for f in [
            "a/charly.yml",
            "a/files/x.conf",
            "a/files/deep/y",
            "a/.git/config",
            "a/.gitignore",
            "a/nested/charly.yml",
            "a/nested/files/z",
            "a/nested/more/charly.yml",
            "a/dirnamed/charly.yml/inner",
            "b/charly.yml",
            "b/.build/out",
            "b/kept",
            "c/charly.yml",
            "c/sub/.build",
            "c/sub/f",
            "e/charly.yml",
            "e/linked/data",
        ] {
            w(f);
        }
        std::os::unix::fs::symlink(d.join("a/files"), d.join("c/dirlink")).expect("symlink");
        std::fs::create_dir_all(d.join("e/viasym")).expect("mkdir");
        std::os::unix::fs::symlink(d.join("e/charly.yml"), d.join("e/viasym/charly.yml"))
            .expect("symlink");
        std::fs::write(d.join("e/viasym/hidden"), "x").expect("write");
        std::os::unix::fs::symlink(d.join("nowhere"), d.join("e/dangling")).expect("symlink");
        let (manifests, listings) = discover_walk(&d, "charly.yml", None);
        assert!(manifests.len() >= 5, "{manifests:?}");
        let mut answered = 0;
        for m in &manifests {
            let dir = m.parent().expect("dir");
            if let Some(files) = listings.get(dir) {
                answered += 1;
                assert_eq!(files, &list_files(dir), "{}", dir.display());
            }
        }
        // b has a .build below it: listed on its own.
        assert!(!listings.contains_key(&d.join("b")));
        assert!(answered >= 4, "{answered}");
        // The root of the walk as a candy directory too.
        w("charly.yml");
        let (_, listings) = discover_walk(&d, "charly.yml", None);
        assert!(!listings.contains_key(&d), "a .build below the root");
    }
}
