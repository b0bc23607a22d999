//! Imports and discovery: flat imports merge, `alias: ref` mounts a child
//! project offline, `discover:` finds manifests, remote references resolve
//! to local checkouts (never the network).

use super::*;

impl Loader<'_> {
    pub(super) fn flat_import(
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
    pub(super) fn repo_dir(&self, identity: &str) -> Option<PathBuf> {
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

    pub(super) fn namespaced_import(
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

    pub(super) fn discover(&mut self, ns: NsId, item: &DiscoverItem, base: &Path) {
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
    pub(super) fn load_remote_candies(&mut self) {
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
    pub(super) fn all_candy_refs(&self) -> Vec<(String, Span, Option<String>)> {
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
}
