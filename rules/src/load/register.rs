//! Registering what a document declares: boxes, candies, vocabulary entries and
//! the root document's settings (first registration wins, duplicates warn).

use super::*;

impl Loader<'_> {
    /// A node-form vocabulary entry's value, its errors reported.
    pub(super) fn vocab_entry<T: serde::de::DeserializeOwned>(
        &mut self,
        value: &Node,
        w: &mut Vec<Diagnostic>,
    ) -> Option<T> {
        yaml::from_node::<T>(value, w)
            .map_err(|d| self.p.diags.push(d))
            .ok()
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn register_kind(
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

    pub(super) fn add_box(
        &mut self,
        ns: NsId,
        file: FileId,
        name: String,
        span: Span,
        def: BoxDef,
    ) {
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

    pub(super) fn add_candy(
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
    pub(super) fn apply_root_doc(
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
}
