//! Resolution: from registered entities to boxes ready to generate.
//!
//! * **Names.** Box references split at their first dot through import
//!   aliases (`cachyos.cachyos`, `charly.arch-builder`); an unknown prefix
//!   means an external image. Candy references are short names or remote refs
//!   (`@github.com/…/candy/x:tag`), mapped by [`Project::candy_key`].
//! * **Closure.** A box installs its `candy:` list with compositions expanded
//!   (parts first, then the composer when it has content of its own) and
//!   requires added transitively, minus everything its base boxes install.
//!   (The original only subtracts the bases' authored lists and so reinstalls
//!   their requires; charly subtracts what the base image really contains.)
//! * **Order.** One global order for all boxes: a topological sort of require,
//!   composition and authored-adjacency edges (Kahn), ready candies taken by
//!   popularity (how many boxes contain them), then name. A box's order is the
//!   global order filtered to its install set. Cycles are errors naming the
//!   whole cycle; conflicting authored orders are warnings (the original's
//!   result here depends on Go map order; charly's on box name order).
//! * **Distro, formats, user, version, builders** follow the original tool (docs/format.md, "Boxes").

use crate::cascade;
use crate::diag::{Diagnostic, Diagnostics, nearest_n};
use crate::model::{BoxDef, Builder, Vocab};
use crate::project::{BoxEntry, CandyEntry, ImportBinding, NsId, Project};
use crate::source::Span;
use rayon::prelude::*;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};

/// What a box is built on.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", content = "ref", rename_all = "kebab-case")]
pub enum BaseRef {
    /// An image from a registry (`quay.io/fedora/fedora:43`).
    External(String),
    /// Another box (qualified name).
    Box(String),
    /// A root filesystem made by a bootstrap builder (`from: builder:debootstrap`).
    Bootstrap {
        /// The builder type.
        builder: String,
        /// The box whose image runs the bootstrap, when given.
        image: Option<String>,
    },
}

/// The box user.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct User {
    /// Name.
    pub name: String,
    /// uid.
    pub uid: u32,
    /// gid.
    pub gid: u32,
    /// Home directory.
    pub home: String,
    /// Adopted from the base image (no user is created).
    pub adopted: bool,
}

/// A builder a box uses: type, builder box, and the candies that trigger it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct BuilderUse {
    /// Builder type (`npm`).
    pub builder: String,
    /// Builder box (qualified), when configured.
    pub image: Option<String>,
    /// Candies (keys, in box order) that trigger it.
    pub candies: Vec<String>,
}

/// A resolved box.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ResolvedBox {
    /// Qualified name.
    pub name: String,
    /// Namespace.
    #[serde(skip)]
    pub ns: NsId,
    /// Where it is defined.
    #[serde(skip)]
    pub span: Span,
    /// Its base.
    pub base: BaseRef,
    /// Internal bases, nearest first.
    pub base_chain: Vec<String>,
    /// The external image at the end of the chain (or `scratch`).
    pub root_image: String,
    /// Distro list as declared or inherited.
    pub distro: Vec<String>,
    /// Distro tags expanded through `inherits` (most specific first).
    pub tags: Vec<String>,
    /// Formats; the first is primary.
    pub formats: Vec<String>,
    /// The distro definition used (its name), when one matches.
    pub distro_def: Option<String>,
    /// Candies as authored (keys).
    pub authored: Vec<String>,
    /// Candies installed by this box, in install order (keys).
    pub candies: Vec<String>,
    /// Candies already in the base image.
    pub provided: Vec<String>,
    /// Builders triggered by this box's candies, by type (name order).
    pub builders: Vec<BuilderUse>,
    /// The full builder map (type → builder box).
    pub builder_map: BTreeMap<String, String>,
    /// Builder types this box produces.
    pub produce: Vec<String>,
    /// The box user.
    pub user: User,
    /// Effective version.
    pub version: String,
    /// Whether `--all` includes it.
    pub enabled: bool,
    /// `preserve_user:` — the image keeps its base's user (no `USER`
    /// switch), which is what lets systemd be its init.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub preserve_user: bool,
}

impl ResolvedBox {
    /// The tag chain (tags plus primary format) used by the cascade.
    pub fn tag_chain(&self) -> Vec<String> {
        cascade::tag_chain(&self.tags, self.formats.first().map(String::as_str))
    }

    /// The primary format.
    pub fn pkg(&self) -> Option<&str> {
        self.formats.first().map(String::as_str)
    }
}

/// The whole project resolved.
#[derive(Clone, Debug, Default)]
pub struct Resolution {
    /// Every box by qualified name: resolved, or the errors that stop it.
    pub boxes: BTreeMap<String, Result<ResolvedBox, Vec<Diagnostic>>>,
    /// The global candy order (keys).
    pub global_order: Vec<String>,
    /// Box count per candy.
    pub popularity: BTreeMap<String, usize>,
    /// Project-wide problems (cycles, conflicting orders).
    pub diags: Diagnostics,
}

impl Resolution {
    /// A resolved box by name.
    pub fn get(&self, name: &str) -> Option<&ResolvedBox> {
        self.boxes.get(name).and_then(|r| r.as_ref().ok())
    }

    /// The names of the boxes that resolve, in name order.
    pub fn resolved_names(&self) -> Vec<String> {
        self.boxes
            .iter()
            .filter(|(_, b)| b.is_ok())
            .map(|(n, _)| n.clone())
            .collect()
    }
}

/// Resolves every box of a project.
pub fn resolve(p: &Project) -> Resolution {
    let mut r = Resolver {
        p,
        res: Resolution::default(),
        closures: BTreeMap::new(),
        candy_errors: BTreeMap::new(),
        order_pos: Default::default(),
    };
    r.check_candy_graph();
    let names = all_box_names(p);
    let mut partial: BTreeMap<String, Result<Partial, Vec<Diagnostic>>> = BTreeMap::new();
    for (name, ns, short) in &names {
        let res = r.partial(*ns, short, &mut Vec::new());
        partial.insert(name.clone(), res);
    }
    r.order(&partial);
    // Each box is finished on its own (in parallel: at 1,000 boxes a
    // quarter of `resolve`), then inserted in order.
    let finished: Vec<Result<ResolvedBox, Vec<Diagnostic>>> = names
        .par_iter()
        .map(|(name, ns, short)| match &partial[name] {
            Ok(part) => r.finish(*ns, short, part, &partial),
            Err(e) => Err(e.clone()),
        })
        .collect();
    for ((name, ..), out) in names.iter().zip(finished) {
        r.res.boxes.insert(name.clone(), out);
    }
    r.res
}

/// (qualified name, namespace, short name) of every box, root first.
fn all_box_names(p: &Project) -> Vec<(String, NsId, String)> {
    let mut out = Vec::new();
    for (i, n) in p.namespaces.iter().enumerate() {
        for short in n.boxes.keys() {
            out.push((n.qualify(short), NsId(i), short.clone()));
        }
    }
    out
}

/// Resolves a box reference from namespace `ns`: `Ok(Some)` for a box,
/// `Ok(None)` for an external image, `Err` for an unavailable import.
pub fn resolve_box_ref(p: &Project, ns: NsId, r: &str) -> Result<Option<(NsId, String)>, String> {
    let n = p.ns(ns);
    if n.boxes.contains_key(r) {
        return Ok(Some((ns, r.to_string())));
    }
    if let Some((alias, rest)) = r.split_once('.')
        && let Some(b) = n.imports.get(alias)
    {
        return match b {
            ImportBinding::Bound(id) => match resolve_box_ref(p, *id, rest)? {
                Some(x) => Ok(Some(x)),
                None => Err(format!("`{r}`: import `{alias}` has no box `{rest}`")),
            },
            ImportBinding::Unavailable { reason, .. } => Err(reason.clone()),
        };
    }
    Ok(None)
}

/// Canonical qualified name of a box.
pub fn qualified(p: &Project, ns: NsId, short: &str) -> String {
    p.ns(ns).qualify(short)
}

/// A box user as written: (name, uid, gid, home).
type UserSpec = (String, Option<u32>, Option<u32>, Option<String>);

/// Distro/format/user facts a box inherits through its base chain.
#[derive(Clone, Debug)]
struct Partial {
    base: BaseRef,
    chain: Vec<String>,
    root_image: String,
    distro: Vec<String>,
    formats: Vec<String>,
    user: Option<UserSpec>,
    authored: Vec<String>,
    install: BTreeSet<String>,
    provided: BTreeSet<String>,
    version: Option<String>,
}

struct Resolver<'p> {
    p: &'p Project,
    res: Resolution,
    /// Candy key → its expansion (parts, requires), computed once.
    closures: BTreeMap<String, Result<Vec<String>, Diagnostic>>,
    /// Candy key → errors that make it unusable (unknown refs, cycles).
    candy_errors: BTreeMap<String, Vec<Diagnostic>>,
    /// Candy key → its position in the global order (set by `order`).
    order_pos: HashMap<String, usize>,
}

impl<'p> Resolver<'p> {
    fn entry(&self, ns: NsId, short: &str) -> &'p BoxEntry {
        &self.p.ns(ns).boxes[short]
    }

    /// Candy-level reference checks and cycle detection over require +
    /// composition, naming the whole cycle.
    fn check_candy_graph(&mut self) {
        let p = self.p;
        for (key, c) in &p.candies {
            let mut errs = Vec::new();
            let mut seen_req = BTreeSet::new();
            for r in &c.def.require {
                seen_req.insert(r.value.clone());
            }
            for (field, list) in [("require", &c.def.require), ("candy", &c.def.candy)] {
                for r in list {
                    match p.candy_key(&r.value) {
                        Ok(k) if k == *key => errs.push(Diagnostic::error(
                            r.span,
                            format!("candy `{key}` includes itself in `{field}:`"),
                        )),
                        Ok(k) if p.candies.contains_key(&k) => {}
                        Ok(k) => errs.push(unknown_candy(
                            p,
                            r.span,
                            &k,
                            &format!("candy `{key}` {field}s"),
                        )),
                        Err(msg) => errs.push(Diagnostic::error(r.span, msg)),
                    }
                    if field == "candy" && seen_req.contains(&r.value) {
                        errs.push(Diagnostic::error(
                            r.span,
                            format!(
                                "`{}` is in both `candy:` and `require:` of `{key}`",
                                r.value
                            ),
                        ));
                    }
                }
            }
            if !errs.is_empty() {
                self.candy_errors.insert(key.clone(), errs);
            }
        }
        // Cycles (Tarjan over require + composition edges).
        let mut edges = Vec::new();
        for (key, c) in &p.candies {
            for r in c.def.require.iter().chain(c.def.candy.iter()) {
                if let Ok(k) = p.candy_key(&r.value)
                    && p.candies.contains_key(&k)
                {
                    edges.push((key.clone(), k));
                }
            }
        }
        for cycle in candy_cycles(&edges) {
            let first = &cycle[0];
            let span = p.candies[first].span;
            let mut shown = cycle.clone();
            shown.push(first.clone());
            let d = Diagnostic::error(
                span,
                format!("candy dependency cycle: {}", shown.join(" → ")),
            )
            .with_hint("remove one `require:` or `candy:` entry to break the cycle");
            for k in &cycle {
                self.candy_errors
                    .entry(k.clone())
                    .or_default()
                    .push(d.clone());
            }
            self.res.diags.push(d);
        }
    }

    /// Expands one candy: composition parts and requires (transitively),
    /// dependencies first, the candy itself last when it has content.
    fn expand(&mut self, key: &str, stack: &mut Vec<String>) -> Result<Vec<String>, Diagnostic> {
        if let Some(r) = self.closures.get(key) {
            return r.clone();
        }
        if let Some(errs) = self.candy_errors.get(key) {
            return Err(errs[0].clone());
        }
        if stack.iter().any(|s| s == key) {
            return Err(Diagnostic::error(
                None,
                format!("candy cycle through `{key}`"),
            ));
        }
        stack.push(key.to_string());
        let c = &self.p.candies[key];
        let mut out: Vec<String> = Vec::new();
        let mut result = Ok(());
        for r in c.def.require.iter().chain(c.def.candy.iter()) {
            let k = match self.p.candy_key(&r.value) {
                Ok(k) => k,
                Err(m) => {
                    result = Err(Diagnostic::error(r.span, m));
                    break;
                }
            };
            match self.expand(&k, stack) {
                Ok(list) => {
                    for x in list {
                        if !out.contains(&x) {
                            out.push(x);
                        }
                    }
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        stack.pop();
        let r = result.map(|()| {
            let has_builder = !self.triggered_by_files(c).is_empty();
            if c.def.candy.is_empty() || c.def.has_content(has_builder) {
                out.push(key.to_string());
            }
            out
        });
        self.closures.insert(key.to_string(), r.clone());
        r
    }

    /// Builders whose `detect_file` is present in the candy directory.
    fn triggered_by_files(&self, c: &CandyEntry) -> Vec<String> {
        let vocab = &self.p.ns(c.ns).vocab;
        vocab
            .builder
            .iter()
            .filter(|(_, b)| b.detect_file.iter().any(|f| c.has_file(f)))
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Base chain, distro, formats, user and install set of a box.
    fn partial(
        &mut self,
        ns: NsId,
        short: &str,
        visiting: &mut Vec<String>,
    ) -> Result<Partial, Vec<Diagnostic>> {
        let p = self.p;
        let e = self.entry(ns, short);
        let name = qualified(p, ns, short);
        if visiting.contains(&name) {
            let mut cyc = visiting.clone();
            cyc.push(name.clone());
            return Err(vec![Diagnostic::error(
                e.def.base.as_ref().map_or(e.span, |b| b.span),
                format!("box base cycle: {}", cyc.join(" → ")),
            )]);
        }
        visiting.push(name.clone());
        let def = &e.def;
        let nsd = p.ns(ns);
        let mut errs = Vec::new();

        let (base, parent) = self.base_of(ns, def, visiting, &mut errs);
        visiting.pop();

        let (chain, root_image) = match (&base, &parent) {
            (BaseRef::Box(b), Some(pp)) => {
                let mut c = vec![b.clone()];
                c.extend(pp.chain.iter().cloned());
                (c, pp.root_image.clone())
            }
            (BaseRef::External(x), _) => (Vec::new(), x.clone()),
            (BaseRef::Bootstrap { builder, .. }, _) => (Vec::new(), format!("builder:{builder}")),
            _ => (Vec::new(), "scratch".into()),
        };

        let distro = def
            .distro
            .as_ref()
            .map(|d| d.value.0.clone())
            .or_else(|| {
                parent
                    .as_ref()
                    .map(|pp| pp.distro.clone())
                    .filter(|d| !d.is_empty())
            })
            .or_else(|| nsd.defaults.distro.as_ref().map(|d| d.value.0.clone()))
            .unwrap_or_default();
        let formats = def
            .build
            .as_ref()
            .map(|d| d.value.0.clone())
            .or_else(|| {
                parent
                    .as_ref()
                    .map(|pp| pp.formats.clone())
                    .filter(|d| !d.is_empty())
            })
            .or_else(|| nsd.defaults.build.as_ref().map(|d| d.value.0.clone()))
            .unwrap_or_default();

        let user = match (&def.user, &def.uid) {
            (None, None) => parent.as_ref().and_then(|pp| pp.user.clone()),
            _ => Some((
                def.user
                    .as_ref()
                    .map(|u| u.value.clone())
                    .unwrap_or_default(),
                def.uid.as_ref().map(|u| u.value),
                def.gid.as_ref().map(|g| g.value),
                def.home.clone(),
            )),
        };

        let (authored, install) = self.box_candies(def, &name, &mut errs);
        let provided: BTreeSet<String> = parent
            .as_ref()
            .map(|pp| pp.install.union(&pp.provided).cloned().collect())
            .unwrap_or_default();
        let install: BTreeSet<String> = install
            .into_iter()
            .filter(|k| !provided.contains(k))
            .collect();

        let version = def
            .version
            .as_ref()
            .map(|v| v.value.clone())
            .or_else(|| {
                let mut best: Option<String> = None;
                for k in install.iter().chain(provided.iter()) {
                    if let Some(v) = &p.candies[k].def.version
                        && best.as_ref().is_none_or(|b| {
                            crate::project::compare_calver(&v.value, b)
                                == Some(std::cmp::Ordering::Greater)
                        })
                    {
                        best = Some(v.value.clone());
                    }
                }
                best
            })
            .or_else(|| parent.as_ref().and_then(|pp| pp.version.clone()));

        if !errs.is_empty() {
            return Err(errs);
        }
        Ok(Partial {
            base,
            chain,
            root_image,
            distro,
            formats,
            user,
            authored,
            install,
            provided,
            version,
        })
    }

    /// A box's base (`base:` a box or an image, `from: builder:<type>`,
    /// else the defaults'), with the base box's own partial resolution.
    fn base_of(
        &mut self,
        ns: NsId,
        def: &BoxDef,
        visiting: &mut Vec<String>,
        errs: &mut Vec<Diagnostic>,
    ) -> (BaseRef, Option<Partial>) {
        let p = self.p;
        let nsd = p.ns(ns);
        let mut parent: Option<Partial> = None;
        let base = match (&def.base, &def.from) {
            (Some(b), Some(f)) => {
                errs.push(Diagnostic::error(
                    f.span,
                    "a box has either `base:` or `from:`, not both",
                ));
                BaseRef::External(b.value.clone())
            }
            (None, Some(f)) => match f.value.strip_prefix("builder:") {
                Some(b) => BaseRef::Bootstrap {
                    builder: b.to_string(),
                    image: def.bootstrap_builder_image.as_ref().map(|i| {
                        match resolve_box_ref(p, ns, &i.value) {
                            Ok(Some((bns, bshort))) => qualified(p, bns, &bshort),
                            _ => i.value.clone(),
                        }
                    }),
                },
                None => {
                    errs.push(Diagnostic::error(
                        f.span,
                        format!(
                            "`from: {}` is not understood; use `from: builder:<type>`",
                            f.value
                        ),
                    ));
                    BaseRef::External("scratch".into())
                }
            },
            (Some(b), None) => match resolve_box_ref(p, ns, &b.value) {
                Ok(Some((bns, bshort))) => {
                    match self.partial(bns, &bshort, visiting) {
                        Ok(pp) => parent = Some(pp),
                        Err(mut e2) => {
                            let bq = qualified(p, bns, &bshort);
                            let first = e2.remove(0);
                            errs.push(Diagnostic::error(
                                b.span,
                                format!(
                                    "base box `{bq}` does not resolve: {}",
                                    first.one_line(&p.sources)
                                ),
                            ));
                        }
                    }
                    BaseRef::Box(qualified(p, bns, &bshort))
                }
                Ok(None) => BaseRef::External(b.value.clone()),
                Err(msg) => {
                    errs.push(Diagnostic::error(
                        b.span,
                        format!("base `{}`: {msg}", b.value),
                    ));
                    BaseRef::External(b.value.clone())
                }
            },
            (None, None) => match &nsd.defaults.base {
                Some(b) => BaseRef::External(b.value.clone()),
                None => BaseRef::External("quay.io/fedora/fedora:43".into()),
            },
        };
        (base, parent)
    }

    /// The candies a box names (`authored`) and what they expand to
    /// (`install`: with their parts and requirements, each once, in order).
    fn box_candies(
        &mut self,
        def: &BoxDef,
        name: &str,
        errs: &mut Vec<Diagnostic>,
    ) -> (Vec<String>, Vec<String>) {
        let p = self.p;
        let mut authored = Vec::new();
        let mut install: Vec<String> = Vec::new();
        for c in &def.candy {
            match p.candy_key(&c.value) {
                Ok(k) if p.candies.contains_key(&k) => {
                    authored.push(k.clone());
                    match self.expand(&k, &mut Vec::new()) {
                        Ok(list) => {
                            for x in list {
                                if !install.contains(&x) {
                                    install.push(x);
                                }
                            }
                        }
                        Err(d) => {
                            let mut d2 = Diagnostic::error(
                                c.span,
                                format!(
                                    "candy `{}` cannot be used: {}",
                                    c.value,
                                    d.one_line(&p.sources)
                                ),
                            );
                            d2.hint = d.hint.clone();
                            errs.push(d2);
                        }
                    }
                }
                Ok(k) => errs.push(unknown_candy(p, c.span, &k, &format!("box `{name}` uses"))),
                Err(msg) => errs.push(Diagnostic::error(c.span, msg)),
            }
        }
        (authored, install)
    }

    /// The global order over every box's install set.
    ///
    /// Candies are numbered in name order (comparing numbers compares
    /// names) and the graph is kept as adjacency lists of numbers: at
    /// 10,000 candies, string-keyed maps and sets were half of `resolve`.
    fn order(&mut self, partial: &BTreeMap<String, Result<Partial, Vec<Diagnostic>>>) {
        let p = self.p;
        // How many boxes use each candy (install or provided, once per box).
        let mut count: HashMap<&str, usize> = HashMap::new();
        for part in partial.values().flatten() {
            let provided_only = part.provided.iter().filter(|k| !part.install.contains(*k));
            for k in part.install.iter().chain(provided_only) {
                *count.entry(k.as_str()).or_default() += 1;
            }
        }
        let mut used: Vec<&str> = count.keys().copied().collect();
        used.sort_unstable();
        let n = used.len();
        let idx: HashMap<&str, usize> = used.iter().enumerate().map(|(i, k)| (*k, i)).collect();
        let at = |reference: &str| {
            p.candy_key(reference)
                .ok()
                .and_then(|k| idx.get(k.as_str()).copied())
        };
        let popularity: Vec<usize> = used.iter().map(|k| count[k]).collect();
        let content: Vec<bool> = used
            .iter()
            .map(|k| {
                p.candies.get(*k).is_some_and(|c| {
                    let has_builder = !self.triggered_by_files(c).is_empty();
                    c.def.candy.is_empty() || c.def.has_content(has_builder)
                })
            })
            .collect();
        // Edges: dep → dependant.
        let mut adj: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, k) in used.iter().enumerate() {
            let Some(c) = p.candies.get(*k) else { continue };
            for r in &c.def.require {
                if let Some(j) = at(&r.value)
                    && content[j]
                {
                    adj[j].push(i);
                }
            }
            if content[i] {
                for r in &c.def.candy {
                    if let Some(j) = at(&r.value) {
                        adj[j].push(i);
                    }
                }
            }
        }
        for outs in &mut adj {
            outs.sort_unstable();
            outs.dedup();
        }
        // Adjacency edges from authored lists: the boxes' in name order,
        // then the candies' that list parts, in name order.
        let mut lists: Vec<(String, Vec<usize>)> = Vec::new();
        for (name, part) in partial {
            if let Ok(part) = part {
                let list = part
                    .authored
                    .iter()
                    .filter_map(|k| idx.get(k.as_str()).copied())
                    .collect();
                lists.push((name.clone(), list));
            }
        }
        for (i, k) in used.iter().enumerate() {
            if let Some(c) = p.candies.get(*k)
                && content[i]
                && !c.def.candy.is_empty()
            {
                let list = c.def.candy.iter().filter_map(|r| at(&r.value)).collect();
                lists.push((format!("candy {k}"), list));
            }
        }
        // Which list first put each added pair in order.
        let mut first_said: HashMap<(usize, usize), usize> = HashMap::new();
        let mut reach = Reach::new(adj);
        for (li, (who, list)) in lists.iter().enumerate() {
            for w in list.windows(2) {
                let (a, b) = (w[0], w[1]);
                if a == b || reach.reaches(a, b) {
                    continue;
                }
                if reach.reaches(b, a) {
                    if let Some(&other) = first_said.get(&(b, a)) {
                        let span = self.box_span(who);
                        let (other, a, b) = (&lists[other].0, used[a], used[b]);
                        self.res.diags.push(Diagnostic::warning(
                            span,
                            format!("{who} lists `{a}` before `{b}`, but {other} lists them the other way; the earlier order is kept"),
                        ));
                    }
                    continue;
                }
                reach.add(a, b);
                first_said.insert((a, b), li);
            }
        }
        // Kahn with (popularity desc, name asc).
        let adj = reach.adj;
        let mut indeg = vec![0usize; n];
        for outs in &adj {
            for &b in outs {
                indeg[b] += 1;
            }
        }
        let mut heap: BinaryHeap<(usize, std::cmp::Reverse<usize>)> = (0..n)
            .filter(|&i| indeg[i] == 0)
            .map(|i| (popularity[i], std::cmp::Reverse(i)))
            .collect();
        let mut order = Vec::with_capacity(n);
        while let Some((_, std::cmp::Reverse(k))) = heap.pop() {
            for &b in &adj[k] {
                indeg[b] -= 1;
                if indeg[b] == 0 {
                    heap.push((popularity[b], std::cmp::Reverse(b)));
                }
            }
            order.push(used[k].to_string());
        }
        self.order_pos = order
            .iter()
            .enumerate()
            .map(|(i, k)| (k.clone(), i))
            .collect();
        self.res.global_order = order;
        self.res.popularity = used
            .iter()
            .zip(popularity)
            .map(|(k, n)| (k.to_string(), n))
            .collect();
    }

    fn box_span(&self, who: &str) -> Option<Span> {
        for n in &self.p.namespaces {
            for b in n.boxes.values() {
                if n.qualify(&b.name) == who {
                    return Some(b.span);
                }
            }
        }
        None
    }

    fn finish(
        &self,
        ns: NsId,
        short: &str,
        part: &Partial,
        all: &BTreeMap<String, Result<Partial, Vec<Diagnostic>>>,
    ) -> Result<ResolvedBox, Vec<Diagnostic>> {
        let p = self.p;
        let e = self.entry(ns, short);
        let def = &e.def;
        let name = qualified(p, ns, short);
        let vocab = &p.ns(ns).vocab;
        let mut errs = Vec::new();

        let tags = expand_tags(vocab, &part.distro);
        let distro_def = pick_distro(vocab, &tags);
        let is_data = def.data_image.unwrap_or(false);
        check_formats(vocab, def, e.span, &name, part, is_data, &mut errs);

        // The box's candies in the global order (by position: scanning the
        // whole order per box was quadratic in large projects).
        let mut candies: Vec<String> = part
            .install
            .iter()
            .filter(|k| self.order_pos.contains_key(*k))
            .cloned()
            .collect();
        candies.sort_by_key(|k| self.order_pos[k]);

        if distro_def.is_none() {
            let chain = cascade::tag_chain(&tags, part.formats.first().map(String::as_str));
            if let Some(k) = candies.iter().find(|k| {
                let set = cascade::resolve(&p.candies[*k].def, &chain);
                set.matched && !set.packages.is_empty()
            }) {
                let known: Vec<&str> = vocab.distro.keys().map(String::as_str).collect();
                errs.push(
                    Diagnostic::error(
                        def.distro.as_ref().map_or(e.span, |d| d.span),
                        format!(
                            "box `{name}`: no distro definition matches {:?}, so the packages of candy `{k}` cannot be installed",
                            tags
                        ),
                    )
                    .with_hint(format!("set `distro:` to one of: {}", known.join(", "))),
                );
            }
        }

        let user = self.box_user(ns, def, part, distro_def.as_deref(), &mut errs);

        let builder_map = self.builder_map(ns, short, &tags);
        let builders = self.builder_uses(
            ns,
            e.span,
            &name,
            part,
            &candies,
            &builder_map,
            all,
            &mut errs,
        );

        let version = match &part.version {
            Some(v) => v.clone(),
            None => {
                errs.push(
                    Diagnostic::error(e.span, format!("box `{name}` needs a dedicated `version:` (none of its candies or bases has one)"))
                        .with_hint("add `version: 2026.1.1` (CalVer) to the box"),
                );
                String::new()
            }
        };

        if !errs.is_empty() {
            return Err(errs);
        }
        Ok(ResolvedBox {
            name,
            ns,
            span: e.span,
            base: part.base.clone(),
            base_chain: part.chain.clone(),
            root_image: part.root_image.clone(),
            distro: part.distro.clone(),
            tags,
            formats: part.formats.clone(),
            distro_def,
            authored: part.authored.clone(),
            candies,
            provided: part.provided.iter().cloned().collect(),
            builders,
            builder_map,
            produce: def.produce.iter().map(|s| s.value.clone()).collect(),
            user,
            version,
            enabled: def.enabled.unwrap_or(true),
            preserve_user: def.preserve_user.unwrap_or(false),
        })
    }

    /// The box's account: its `user:`, else the distro's base user
    /// (`user_policy` auto or adopt), else the default one.
    fn box_user(
        &self,
        ns: NsId,
        def: &BoxDef,
        part: &Partial,
        distro_def: Option<&str>,
        errs: &mut Vec<Diagnostic>,
    ) -> User {
        let p = self.p;
        let vocab = &p.ns(ns).vocab;
        let policy = def
            .user_policy
            .as_ref()
            .or(p.ns(ns).defaults.user_policy.as_ref())
            .map_or("auto", |s| s.value.as_str());
        let base_user = distro_def
            .and_then(|d| vocab.distro[d].base_user.clone())
            .or_else(|| {
                distro_def
                    .and_then(|d| vocab.distro[d].inherits.as_ref())
                    .and_then(|i| vocab.distro.get(&i.value))
                    .and_then(|d| d.base_user.clone())
            });
        match (&part.user, policy) {
            (_, pol) if !matches!(pol, "auto" | "adopt" | "create") => {
                errs.push(Diagnostic::error(
                    def.user_policy.as_ref().map(|s| s.span),
                    format!("unknown user_policy `{pol}`; expected auto, adopt or create"),
                ));
                default_user()
            }
            (Some((n, uid, gid, home)), _) => {
                let n = if n.is_empty() {
                    "user".to_string()
                } else {
                    n.clone()
                };
                let uid = uid.unwrap_or(if n == "root" { 0 } else { 1000 });
                let gid = gid.unwrap_or(uid);
                let home = home.clone().unwrap_or_else(|| {
                    if n == "root" {
                        "/root".into()
                    } else {
                        format!("/home/{n}")
                    }
                });
                let adopted = matches!(part.base, BaseRef::Box(_))
                    || base_user
                        .as_ref()
                        .is_some_and(|b| b.name == n && b.uid == uid && policy != "create");
                User {
                    name: n,
                    uid,
                    gid,
                    home,
                    adopted,
                }
            }
            (None, pol) => match (&base_user, pol) {
                (Some(b), "auto" | "adopt") => User {
                    name: b.name.clone(),
                    uid: b.uid,
                    gid: b.gid,
                    home: b
                        .home
                        .clone()
                        .unwrap_or_else(|| format!("/home/{}", b.name)),
                    adopted: true,
                },
                (None, "adopt") => {
                    errs.push(Diagnostic::error(
                        def.user_policy.as_ref().map(|s| s.span),
                        "user_policy adopt needs a distro with `base_user` or a box `user:`",
                    ));
                    default_user()
                }
                _ => {
                    let mut u = default_user();
                    u.adopted = matches!(part.base, BaseRef::Box(_));
                    u
                }
            },
        }
    }

    /// The builders the box's candies need (their files, their AUR
    /// packages), each checked against the box's builder map: the builder
    /// box exists, is enabled and produces it.
    #[allow(clippy::too_many_arguments)]
    fn builder_uses(
        &self,
        ns: NsId,
        span: Span,
        name: &str,
        part: &Partial,
        candies: &[String],
        builder_map: &BTreeMap<String, String>,
        all: &BTreeMap<String, Result<Partial, Vec<Diagnostic>>>,
        errs: &mut Vec<Diagnostic>,
    ) -> Vec<BuilderUse> {
        let p = self.p;
        let vocab = &p.ns(ns).vocab;
        let mut uses: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for k in candies {
            let c = &p.candies[k];
            for b in self.triggered_by_files(c) {
                uses.entry(b).or_default().push(k.clone());
            }
            if c.def.has_aur_packages() && part.formats.iter().any(|f| f == "aur") {
                for (bn, b) in &vocab.builder {
                    if b.detect_config.as_deref() == Some("aur") {
                        uses.entry(bn.clone()).or_default().push(k.clone());
                    }
                }
            }
        }
        let mut builders = Vec::new();
        for (b, cands) in uses {
            let image = builder_map.get(&b).cloned();
            match &image {
                None => errs.push(
                    Diagnostic::error(
                        p.candies[&cands[0]].span,
                        format!("box `{name}`: candy `{}` needs builder `{b}` but no `builder.{b}` is configured", cands[0]),
                    )
                    .with_hint(format!("add `builder: {{{b}: <builder-box>}}` to the box, a base box or `defaults:`")),
                ),
                Some(img) => {
                    match all.get(img) {
                        None => errs.push(Diagnostic::error(
                            span,
                            format!("box `{name}`: builder box `{img}` for `{b}` does not exist"),
                        )),
                        Some(Err(_)) => {}
                        Some(Ok(_)) => {
                            let (bns, bshort) = find_box(p, img).unwrap_or((ns, img.clone()));
                            let bdef = &self.entry(bns, &bshort).def;
                            if bdef.enabled == Some(false) {
                                errs.push(Diagnostic::error(span, format!("box `{name}`: builder box `{img}` is disabled")));
                            }
                            if !bdef.produce.is_empty() && !bdef.produce.iter().any(|x| x.value == b) {
                                errs.push(Diagnostic::error(
                                    span,
                                    format!("box `{name}`: builder box `{img}` does not list `{b}` in `produce:`"),
                                ));
                            }
                        }
                    }
                }
            }
            if !vocab.builder.contains_key(&b) {
                errs.push(Diagnostic::error(
                    span,
                    format!("unknown builder type `{b}`"),
                ));
            }
            builders.push(BuilderUse {
                builder: b,
                image,
                candies: cands,
            });
        }
        builders
    }

    /// defaults.builder → distro-keyed map → immediate same-namespace base's
    /// map → the box's own map; entries naming the box itself are dropped.
    fn builder_map(&self, ns: NsId, short: &str, tags: &[String]) -> BTreeMap<String, String> {
        let p = self.p;
        let nsd = p.ns(ns);
        let e = self.entry(ns, short);
        let mut map: BTreeMap<String, (NsId, String)> = BTreeMap::new();
        let mut put = |m: &crate::yaml::OrderedMap<crate::yaml::Spanned<String>>, from: NsId| {
            for (k, v) in m.iter() {
                map.insert(k.value.clone(), (from, v.value.clone()));
            }
        };
        put(&nsd.defaults.builder, ns);
        'outer: for t in tags {
            for (bname, b) in &nsd.boxes {
                if b.def.builder.is_empty() || bname == short {
                    continue;
                }
                if b.def
                    .distro
                    .as_ref()
                    .is_some_and(|d| d.value.0.iter().any(|x| x == t))
                {
                    put(&b.def.builder, ns);
                    break 'outer;
                }
            }
        }
        if let Some(b) = &e.def.base
            && let Some(pb) = nsd.boxes.get(&b.value)
        {
            put(&pb.def.builder, ns);
        }
        put(&e.def.builder, ns);
        let me = qualified(p, ns, short);
        map.into_iter()
            .filter_map(|(k, (from, r))| {
                let q = match resolve_box_ref(p, from, &r) {
                    Ok(Some((bns, bshort))) => qualified(p, bns, &bshort),
                    _ => r,
                };
                (q != me).then_some((k, q))
            })
            .collect()
    }
}
/// A box's `build:` formats: at least one (unless it is a data image),
/// none twice, each one a distro of the vocabulary knows.
fn check_formats(
    vocab: &Vocab,
    def: &BoxDef,
    span: Span,
    name: &str,
    part: &Partial,
    is_data: bool,
    errs: &mut Vec<Diagnostic>,
) {
    if part.formats.is_empty() && !is_data {
        errs.push(
            Diagnostic::error(
                span,
                format!("box `{name}` has no `build:` formats (none inherited, none in defaults)"),
            )
            .with_hint("add e.g. `build: [rpm]` to the box or `defaults:`"),
        );
    }
    if let Some(b) = &def.build {
        let mut seen = BTreeSet::new();
        for f in &b.value.0 {
            if !seen.insert(f) {
                errs.push(Diagnostic::error(
                    b.span,
                    format!("format `{f}` is listed twice in `build:`"),
                ));
            }
            let known = vocab.distro.values().any(|d| d.format.get(f).is_some());
            if !known {
                let all: BTreeSet<&str> = vocab
                    .distro
                    .values()
                    .flat_map(|d| d.format.keys())
                    .collect();
                let mut d = Diagnostic::error(b.span, format!("unknown build format `{f}`"));
                if let Some(n) = crate::diag::nearest(f, all.iter().copied()) {
                    d = d.with_hint(format!("did you mean `{n}`?"));
                } else {
                    d = d.with_hint(format!(
                        "known formats: {}",
                        all.into_iter().collect::<Vec<_>>().join(", ")
                    ));
                }
                errs.push(d);
            }
        }
    }
}

fn find_box(p: &Project, qualified_name: &str) -> Option<(NsId, String)> {
    for (i, n) in p.namespaces.iter().enumerate() {
        for short in n.boxes.keys() {
            if n.qualify(short) == qualified_name {
                return Some((NsId(i), short.clone()));
            }
        }
    }
    None
}

fn default_user() -> User {
    User {
        name: "user".into(),
        uid: 1000,
        gid: 1000,
        home: "/home/user".into(),
        adopted: false,
    }
}

/// Expands a distro list through `inherits` while `inherit_packages` holds.
pub fn expand_tags(vocab: &Vocab, distro: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for t in distro {
        if !out.contains(t) {
            out.push(t.clone());
        }
    }
    let mut i = 0;
    let mut guard = 0;
    while i < out.len() && guard < 100 {
        let name = out[i].split(':').next().unwrap_or("").to_string();
        if let Some(d) = vocab.distro.get(&name)
            && d.inherit_packages
            && let Some(parent) = &d.inherits
            && !out.contains(&parent.value)
        {
            out.push(parent.value.clone());
        }
        i += 1;
        guard += 1;
    }
    out
}

/// The distro definition for a tag chain: the first tag that matches a
/// definition exactly or by its name before `:`.
pub fn pick_distro(vocab: &Vocab, tags: &[String]) -> Option<String> {
    for t in tags {
        if vocab.distro.contains_key(t) {
            return Some(t.clone());
        }
        let name = t.split(':').next().unwrap_or("");
        if vocab.distro.contains_key(name) {
            return Some(name.to_string());
        }
    }
    None
}

/// A distro definition with `inherits` applied (child wins; bootstrap taken
/// from the parent when the child's install_cmd is empty; formats inherited
/// when the child declares none), at most 10 levels deep.
pub fn effective_distro(vocab: &Vocab, name: &str) -> Option<crate::model::Distro> {
    let mut d = vocab.distro.get(name)?.clone();
    let mut cur = d.inherits.as_ref().map(|s| s.value.clone());
    let mut depth = 0;
    while let Some(pn) = cur {
        depth += 1;
        if depth > 10 {
            break;
        }
        let Some(parent) = vocab.distro.get(&pn) else {
            break;
        };
        let empty_bootstrap = d
            .bootstrap
            .as_ref()
            .is_none_or(|b| b.install_cmd.is_empty());
        if empty_bootstrap {
            d.bootstrap.clone_from(&parent.bootstrap);
            if d.workaround.is_empty() {
                d.workaround.clone_from(&parent.workaround);
            }
        }
        if d.format.is_empty() {
            d.format = parent.format.clone();
        }
        if d.base_user.is_none() {
            d.base_user.clone_from(&parent.base_user);
        }
        if d.dnf.is_none() {
            d.dnf.clone_from(&parent.dnf);
        }
        if d.version.is_none() {
            d.version.clone_from(&parent.version);
        }
        cur = parent.inherits.as_ref().map(|s| s.value.clone());
    }
    Some(d)
}

/// A builder definition by type.
pub fn builder<'v>(vocab: &'v Vocab, name: &str) -> Option<&'v Builder> {
    vocab.builder.get(name)
}

fn unknown_candy(p: &Project, span: Span, key: &str, what: &str) -> Diagnostic {
    // Its file was found but did not load (a YAML error, a bad field): that
    // error is the one to fix, wherever this one is shown.
    let file = format!("candy/{key}/charly.yml");
    let broken = p.diags.errors().find(|d| {
        d.span.is_some_and(|s| {
            let rel = p.sources.rel(s.file);
            rel == file || rel.ends_with(&format!("/{file}"))
        })
    });
    if let Some(e) = broken {
        return Diagnostic::error(
            span,
            format!(
                "{what} candy `{key}`, which does not load: {}",
                e.one_line(&p.sources)
            ),
        );
    }
    let close = nearest_n(key, p.candies.keys().map(String::as_str), 3);
    let mut d = Diagnostic::error(span, format!("{what} unknown candy `{key}`"));
    if !close.is_empty() {
        d = d.with_hint(format!(
            "did you mean {}?",
            close
                .iter()
                .map(|c| format!("`{c}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    } else {
        d = d.with_hint(format!("no directory candy/{key}/charly.yml was found"));
    }
    d
}

/// Reachability queries over the candy order graph while edges are added.
///
/// Nodes are interned to indices and the visited set is a generation-stamped
/// array, so a query allocates nothing: the global order asks two queries
/// per adjacent pair of every authored list, which with string sets and
/// fresh `BTreeSet`s per query dominated resolution of large projects.
///
/// While the graph is acyclic it also keeps a topological order, updated on
/// each added edge (Pearce & Kelly, "A dynamic topological sort algorithm
/// for directed acyclic graphs", 2006): `a` can only reach `b` when `a`
/// comes first, so most queries are answered without a search, and a search
/// never leaves the part of the order between the two. Without it, queries
/// walked everything reachable and resolution grew quadratically (0.56 s of
/// 10,000 candies in 1,000 boxes).
struct Reach {
    /// Each node's successors.
    adj: Vec<Vec<usize>>,
    radj: Vec<Vec<usize>>,
    seen: Vec<u32>,
    generation: u32,
    stack: Vec<usize>,
    /// Each node's position in a topological order; `None` once the graph
    /// has a cycle (queries then search everything reachable).
    ord: Option<Vec<usize>>,
}

impl Reach {
    /// Over nodes `0..adj.len()` with the edges `adj` (each list without
    /// repeats).
    fn new(adj: Vec<Vec<usize>>) -> Self {
        let n = adj.len();
        let mut radj = vec![Vec::new(); n];
        for (a, outs) in adj.iter().enumerate() {
            for &b in outs {
                radj[b].push(a);
            }
        }
        let ord = topo_positions(&adj);
        Reach {
            adj,
            radj,
            seen: vec![0; n],
            generation: 0,
            stack: Vec::new(),
            ord,
        }
    }

    fn next_generation(&mut self) -> u32 {
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            self.seen.fill(0);
            self.generation = 1;
        }
        self.generation
    }

    /// Adds the edge `ia → ib`.
    fn add(&mut self, ia: usize, ib: usize) {
        if self.adj[ia].contains(&ib) {
            return;
        }
        self.adj[ia].push(ib);
        self.radj[ib].push(ia);
        // Taken out while it is repaired; left out when the edge closes a cycle.
        let Some(mut ord) = self.ord.take() else {
            return;
        };
        let (lb, ub) = (ord[ib], ord[ia]);
        if lb > ub {
            self.ord = Some(ord); // already in order
            return;
        }
        // What b reaches within [lb, ub] (meeting a means a cycle), and
        // what reaches a within it.
        let mut forward = Vec::new();
        if self.search(ib, false, Some(ia), |m| ord[m] <= ub, Some(&mut forward)) {
            return;
        }
        let mut backward = Vec::new();
        self.search(ia, true, None, |m| ord[m] >= lb, Some(&mut backward));
        // What reaches a goes before what b reaches, in the positions they
        // held, each group keeping its relative order.
        backward.sort_unstable_by_key(|&n| ord[n]);
        forward.sort_unstable_by_key(|&n| ord[n]);
        let mut slots: Vec<usize> = backward.iter().chain(&forward).map(|&n| ord[n]).collect();
        slots.sort_unstable();
        for (n, slot) in backward.into_iter().chain(forward).zip(slots) {
            ord[n] = slot;
        }
        self.ord = Some(ord);
    }

    /// Whether `to` is reachable from `from` (a node reaches itself).
    fn reaches(&mut self, f: usize, t: usize) -> bool {
        if f == t {
            return true;
        }
        // Taken out for the search, put back after.
        let ord = self.ord.take();
        let found = match &ord {
            Some(o) if o[f] > o[t] => false,
            Some(o) => {
                let limit = o[t];
                self.search(f, false, Some(t), |m| o[m] < limit, None)
            }
            None => self.search(f, false, Some(t), |_| true, None),
        };
        self.ord = ord;
        found
    }

    /// Depth first from `from` along the edges (`backward`: against them),
    /// entering only nodes `within` admits, listing them in `visited` when
    /// given. Returns whether it met `stop` (and stopped there).
    fn search(
        &mut self,
        from: usize,
        backward: bool,
        stop: Option<usize>,
        within: impl Fn(usize) -> bool,
        mut visited: Option<&mut Vec<usize>>,
    ) -> bool {
        let g = self.next_generation();
        let edges = if backward { &self.radj } else { &self.adj };
        self.stack.clear();
        self.stack.push(from);
        self.seen[from] = g;
        while let Some(n) = self.stack.pop() {
            if let Some(v) = visited.as_deref_mut() {
                v.push(n);
            }
            for &m in &edges[n] {
                if Some(m) == stop {
                    return true;
                }
                if self.seen[m] != g && within(m) {
                    self.seen[m] = g;
                    self.stack.push(m);
                }
            }
        }
        false
    }
}

/// Each node's position in a topological order of `adj` (Kahn), or `None`
/// when it has a cycle.
fn topo_positions(adj: &[Vec<usize>]) -> Option<Vec<usize>> {
    let n = adj.len();
    let mut indeg = vec![0usize; n];
    for outs in adj {
        for &b in outs {
            indeg[b] += 1;
        }
    }
    let mut ready: Vec<usize> = (0..n).filter(|&i| indeg[i] == 0).collect();
    let mut ord = vec![0; n];
    let mut next = 0;
    while let Some(i) = ready.pop() {
        ord[i] = next;
        next += 1;
        for &b in &adj[i] {
            indeg[b] -= 1;
            if indeg[b] == 0 {
                ready.push(b);
            }
        }
    }
    (next == n).then_some(ord)
}

/// Every dependency cycle among candies: each strongly connected component
/// that contains a cycle, walked from its smallest name along its edges.
fn candy_cycles(edges: &[(String, String)]) -> Vec<Vec<String>> {
    use petgraph::graphmap::DiGraphMap;
    let mut g: DiGraphMap<&str, ()> = DiGraphMap::new();
    for (a, b) in edges {
        g.add_edge(a.as_str(), b.as_str(), ());
    }
    let mut out = Vec::new();
    for comp in petgraph::algo::tarjan_scc(&g) {
        let is_cycle = comp.len() > 1 || g.contains_edge(comp[0], comp[0]);
        if !is_cycle {
            continue;
        }
        let Some(start) = comp.iter().min().copied() else {
            continue;
        };
        let mut path = vec![start];
        let mut cur = start;
        loop {
            let mut next: Vec<&str> = g
                .neighbors(cur)
                .filter(|n| comp.contains(n) && (*n == start || !path.contains(n)))
                .collect();
            next.sort_unstable();
            match next.first().copied() {
                Some(n) if n == start => break,
                Some(n) => {
                    path.push(n);
                    cur = n;
                }
                None => break,
            }
        }
        out.push(path.into_iter().map(str::to_string).collect());
    }
    out.sort();
    out
}

#[cfg(test)]
mod reach_tests {
    use super::*;

    #[test]
    fn reach_follows_initial_and_added_edges_and_survives_cycles() {
        let (a, b, c, d, x) = (0, 1, 2, 3, 4);
        let mut adj = vec![Vec::new(); 5];
        adj[a].push(b);
        adj[b].push(c);
        // A cycle among c and d must not loop forever.
        adj[c].push(d);
        adj[d].push(c);
        let mut r = Reach::new(adj);
        assert!(r.reaches(a, d));
        assert!(r.reaches(a, a));
        assert!(!r.reaches(d, a));
        assert!(!r.reaches(a, x));
        r.add(d, x);
        assert!(r.reaches(a, x), "an added edge is followed");
        assert!(!r.reaches(x, a));
        // Many queries (generation stamps) keep answering the same.
        for _ in 0..1000 {
            assert!(r.reaches(b, x));
            assert!(!r.reaches(x, b));
        }
    }

    /// Reachability by a plain search over the edge set.
    fn naive(edges: &BTreeSet<(usize, usize)>, from: usize, to: usize) -> bool {
        let mut seen = BTreeSet::from([from]);
        let mut stack = vec![from];
        while let Some(n) = stack.pop() {
            if n == to {
                return true;
            }
            for &(a, b) in edges.range((n, 0)..=(n, usize::MAX)) {
                debug_assert_eq!(a, n);
                if seen.insert(b) {
                    stack.push(b);
                }
            }
        }
        false
    }

    proptest::proptest! {
        /// The kept topological order answers exactly what a full search
        /// answers, through any sequence of queries and the insertions the
        /// global order makes (an edge between two unrelated nodes), and
        /// on graphs that start with a cycle.
        #[test]
        fn reach_answers_what_a_search_answers(
            initial in proptest::collection::vec((0usize..12, 0usize..12), 0..20),
            pairs in proptest::collection::vec((0usize..12, 0usize..12), 0..60),
        ) {
            let mut adj = vec![Vec::new(); 12];
            let mut edges = BTreeSet::new();
            for (a, b) in initial {
                if a != b && edges.insert((a, b)) {
                    adj[a].push(b);
                }
            }
            let mut r = Reach::new(adj);
            for (a, b) in pairs {
                let ab = r.reaches(a, b);
                proptest::prop_assert_eq!(ab, a == b || naive(&edges, a, b), "{} -> {}", a, b);
                let ba = r.reaches(b, a);
                proptest::prop_assert_eq!(ba, a == b || naive(&edges, b, a), "{} -> {}", b, a);
                if !ab && !ba {
                    r.add(a, b);
                    edges.insert((a, b));
                }
            }
        }
    }
}
