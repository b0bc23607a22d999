//! A loaded project's types: the [`Project`], its namespaces (the root
//! and each import), the boxes and candies registered in them, and remote
//! references. Plain data with a few lookups: the loader fills them,
//! every other module reads them.

use crate::diag::{Diagnostic, Diagnostics};
use crate::model::{BoxDef, Candy, Defaults, Vocab};
use crate::plugin::Plugins;
use crate::source::{FileId, SourceMap, Span};
use crate::yaml::{self, Spanned};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

/// Index of a namespace in [`Project::namespaces`]; 0 is the root.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct NsId(pub usize);

/// An import alias and what it resolved to.
#[derive(Clone, Debug)]
pub enum ImportBinding {
    /// Loaded (or bound to an in-progress ancestor, e.g. the root itself).
    Bound(NsId),
    /// Not available offline; boxes that need it report this.
    Unavailable {
        /// The reference as written.
        reference: String,
        /// Where the import is declared.
        span: Span,
        /// Why it could not be resolved.
        reason: String,
    },
}

/// One project (the root, or an imported child project).
#[derive(Clone, Debug, Default)]
pub struct Namespace {
    /// Qualified prefix: `""` for the root, `cachyos` for an import.
    pub path: String,
    /// Directory on disk.
    pub dir: PathBuf,
    /// Repo identity (`github.com/owner/repo`), when known.
    pub identity: Option<String>,
    /// Schema version declared.
    pub version: Option<Spanned<String>>,
    /// Defaults (first root-form document wins).
    pub defaults: Defaults,
    /// Import aliases.
    pub imports: BTreeMap<String, ImportBinding>,
    /// Boxes by short name.
    pub boxes: BTreeMap<String, BoxEntry>,
    /// The effective vocabulary.
    pub vocab: Vocab,
    /// Where each vocabulary entry came from (`builder/npm` → file).
    pub vocab_origin: BTreeMap<String, FileId>,
    /// Check beds and other root sections kept as-is.
    pub kept: BTreeMap<String, yaml::Yaml>,
    /// Whether this project is written in the node form (schema 2026.174,
    /// chosen by its root `version:`); its files are read by
    /// `load::nodeform`, the others by the classic reader.
    pub nodeform: bool,
}

impl Namespace {
    /// Qualifies a short box name (`x` or `ns.x`).
    pub fn qualify(&self, short: &str) -> String {
        if self.path.is_empty() {
            short.to_string()
        } else {
            format!("{}.{short}", self.path)
        }
    }
}

/// A registered box.
#[derive(Clone, Debug)]
pub struct BoxEntry {
    /// Short name.
    pub name: String,
    /// Its namespace.
    pub ns: NsId,
    /// The file it is defined in.
    pub file: FileId,
    /// Span of its definition (the `box:` key or the map entry key).
    pub span: Span,
    /// The definition.
    pub def: BoxDef,
}

/// A registered candy.
#[derive(Clone, Debug)]
pub struct CandyEntry {
    /// Key in [`Project::candies`] (short name, or `repo/sub` for foreign repos).
    pub key: String,
    /// Short name (directory basename).
    pub name: String,
    /// Directory on disk.
    pub dir: PathBuf,
    /// Directory relative to the project root (unix), when inside it.
    pub rel_dir: Option<String>,
    /// The namespace that registered it.
    pub ns: NsId,
    /// Its manifest.
    pub file: FileId,
    /// Span of the `candy:` key.
    pub span: Span,
    /// The definition (boxed: the candy map's nodes hold eleven entries
    /// each, most of them half full).
    pub def: Box<Candy>,
    /// Every file under the directory (candy-relative, sorted), nested
    /// candies excluded.
    pub files: BTreeSet<String>,
    /// Contents of small top-level manifests (`*.json`, `*.toml` up to
    /// 64 KiB): builders read package names from them.
    pub small_files: BTreeMap<String, String>,
    /// `localpkg:` sources found on disk, by format: the directory and the
    /// files under it (relative). A format whose source is missing is absent.
    pub localpkg_sources: BTreeMap<String, (PathBuf, BTreeSet<String>)>,
    /// Files a `copy:` task of the candy names that are symlinks leading
    /// out of its project (or nowhere): a build never reads them, so a
    /// plan that copies one is refused
    /// (`plan::compile::copy_problem`).
    pub links_out: BTreeSet<String>,
}

impl CandyEntry {
    /// Whether a candy-relative file exists.
    pub fn has_file(&self, rel: &str) -> bool {
        self.files.contains(rel.trim_start_matches("./"))
    }
}

/// A loaded project.
#[derive(Clone, Debug, Default)]
pub struct Project {
    /// Root directory.
    pub root: PathBuf,
    /// Every file read.
    pub sources: SourceMap,
    /// Namespaces; `[0]` is the root.
    pub namespaces: Vec<Namespace>,
    /// All candies (candies are not namespaced).
    pub candies: BTreeMap<String, CandyEntry>,
    /// Repo identity → its working tree, for every repo reachable offline.
    pub repos: BTreeMap<String, PathBuf>,
    /// Problems found while loading.
    pub diags: Diagnostics,
    /// The root's own `charly.yml` or vocabulary file (`charly/build.yml`,
    /// `build.yml`) could not be used as a whole: unreadable, not YAML, not
    /// UTF-8, empty, or a document that is not a valid project document.
    /// The reason is an error in [`Project::diags`]. The project still
    /// loads (namespace 0 always exists) so `validate` can report
    /// everything; commands that act on the project refuse to run.
    pub root_unusable: bool,
    /// Every plugin capability the candies declare (`plugin:`).
    pub plugins: Plugins,
    /// The names and tokens `names::check_project` refused when
    /// the project loaded (also in [`Project::diags`]): what a command
    /// refuses to act on, without checking every name again.
    pub refused_names: Vec<Diagnostic>,
}

impl Project {
    /// A digest of every part of the project `resolve::resolve`
    /// can read: two projects with the same digest resolve alike (under
    /// the same charly binary), and compile and key alike (charly's store
    /// keeps the resolution and nodes' own key inputs by it). It covers all
    /// of the project but what was
    /// parsed from source files (boxes' and candies' definitions, kept
    /// sections), which the files' text covers, and the load's own
    /// diagnostics, which resolving does not read: every source file's
    /// path and text; each namespace and each candy as it prints (`Debug`)
    /// without its definitions — the directory listings, small manifests,
    /// local package sources and imports found on disk are there; the
    /// root, repos, plugins and the names the load refused. A field added
    /// to a candy or a namespace does not compile here until it is placed.
    /// Parts are hashed in parallel.
    pub fn resolution_inputs(&self) -> [u8; 32] {
        use rayon::prelude::*;
        let part = |tag: &str, text: &str| -> [u8; 32] {
            let mut h = blake3::Hasher::new();
            h.update(tag.as_bytes());
            h.update(&(text.len() as u64).to_le_bytes());
            h.update(text.as_bytes());
            *h.finalize().as_bytes()
        };
        let sources: Vec<[u8; 32]> = self
            .sources
            .all()
            .par_iter()
            .map(|f| {
                let mut h = blake3::Hasher::new();
                h.update(f.path.as_os_str().as_encoded_bytes());
                h.update(&[0]);
                h.update(f.rel.as_bytes());
                h.update(&[0]);
                h.update(&(f.text.len() as u64).to_le_bytes());
                h.update(f.text.as_bytes());
                *h.finalize().as_bytes()
            })
            .collect();
        let candies: Vec<[u8; 32]> = self
            .candies
            .par_iter()
            .map(|(key, c)| {
                let CandyEntry {
                    key: own_key,
                    name,
                    dir,
                    rel_dir,
                    ns,
                    file,
                    span,
                    def: _,
                    files,
                    small_files,
                    localpkg_sources,
                    links_out,
                } = c;
                let text = format!(
                    "{key:?} {own_key:?} {name:?} {dir:?} {rel_dir:?} {ns:?} {file:?} {span:?} \
                     {files:?} {small_files:?} {localpkg_sources:?} {links_out:?}"
                );
                part("candy", &text)
            })
            .collect();
        let namespaces: Vec<[u8; 32]> = self
            .namespaces
            .par_iter()
            .map(|n| {
                let Namespace {
                    path,
                    dir,
                    identity,
                    version,
                    defaults,
                    imports,
                    boxes,
                    vocab,
                    vocab_origin,
                    kept: _,
                    nodeform,
                } = n;
                let boxes: Vec<(&String, &str, NsId, FileId, &Span)> = boxes
                    .iter()
                    .map(|(k, b)| (k, b.name.as_str(), b.ns, b.file, &b.span))
                    .collect();
                let text = format!(
                    "{path:?} {dir:?} {identity:?} {version:?} {defaults:?} {imports:?} \
                     {boxes:?} {vocab:?} {vocab_origin:?} {nodeform:?}"
                );
                part("namespace", &text)
            })
            .collect();
        let mut h = blake3::Hasher::new();
        h.update(b"charly resolution inputs 1\0");
        for d in sources.iter().chain(&candies).chain(&namespaces) {
            h.update(d);
        }
        let rest = format!(
            "{:?} {:?} {:?} {:?} {:?} {} {} {}",
            self.root,
            self.repos,
            self.plugins,
            self.root_unusable,
            self.refused_names,
            self.sources.len(),
            self.candies.len(),
            self.namespaces.len()
        );
        h.update(rest.as_bytes());
        *h.finalize().as_bytes()
    }

    /// The root namespace (always present in a project `load` returns,
    /// even when the root file is unusable).
    pub fn root_ns(&self) -> &Namespace {
        &self.namespaces[0]
    }

    /// A namespace by id.
    pub fn ns(&self, id: NsId) -> &Namespace {
        &self.namespaces[id.0]
    }

    /// Maps a candy reference (short name or `@host/org/repo/candy/x:tag`)
    /// to a key in [`Project::candies`]. Candies are not namespaced: a remote
    /// reference names the candy of that repo's working tree by its short name.
    pub fn candy_key(&self, reference: &str) -> Result<String, String> {
        let Some(r) = reference.strip_prefix('@') else {
            return Ok(reference.to_string());
        };
        let parsed = RemoteRef::parse(r)?;
        if !self.repos.contains_key(&parsed.repo) {
            return Err(format!(
                "remote candy `{reference}`: repository {} is not available offline (map it with --import {}=DIR)",
                parsed.repo, parsed.repo
            ));
        }
        Ok(parsed
            .sub
            .rsplit('/')
            .next()
            .filter(|s| !s.is_empty())
            .unwrap_or(&parsed.repo)
            .to_string())
    }
}

/// A parsed `host/org/repo[/sub][:tag]` reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteRef {
    /// `host/org/repo`.
    pub repo: String,
    /// Path inside the repo (may be empty).
    pub sub: String,
    /// Tag after the last `:` (may be empty).
    pub tag: String,
}

impl RemoteRef {
    /// Parses a reference without its leading `@`.
    pub fn parse(r: &str) -> Result<Self, String> {
        let (path, tag) = match r.rsplit_once(':') {
            Some((p, t)) if !t.contains('/') => (p, t),
            _ => (r, ""),
        };
        let parts: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        if parts.len() < 3 {
            return Err(format!(
                "remote reference `@{r}` needs host/org/repo (e.g. @github.com/org/repo/candy/x:v1)"
            ));
        }
        Ok(RemoteRef {
            repo: parts[..3].join("/"),
            sub: parts[3..].join("/"),
            tag: tag.to_string(),
        })
    }
}

/// Normalizes a repo identity: `owner/repo` gets `github.com/`, schemes and
/// `.git` are dropped.
pub fn normalize_identity(s: &str) -> String {
    let s = s.trim().trim_start_matches('@');
    let s = s
        .strip_prefix("https://")
        .or_else(|| s.strip_prefix("http://"))
        .unwrap_or(s);
    let s = s.trim_end_matches('/').trim_end_matches(".git");
    if s.split('/').count() == 2 {
        format!("github.com/{s}")
    } else {
        s.to_string()
    }
}

/// Compares dotted numeric versions (`2026.160.1301`); `None` when not numeric.
pub fn compare_calver(a: &str, b: &str) -> Option<std::cmp::Ordering> {
    let pa: Option<Vec<u64>> = a.split('.').map(|x| x.parse().ok()).collect();
    let pb: Option<Vec<u64>> = b.split('.').map(|x| x.parse().ok()).collect();
    Some(pa?.cmp(&pb?))
}
