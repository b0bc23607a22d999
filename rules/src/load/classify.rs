//! Classifying documents: root-form settings against kind-form entities, in
//! the classic layout and in the node form.

use super::*;

impl Loader<'_> {
    pub(super) fn classify(&mut self, doc: Node, file: FileId, discovered: bool) -> Option<Doc> {
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
    pub(super) fn classify_root_aware(
        &mut self,
        doc: Node,
        file: FileId,
        discovered: bool,
    ) -> Option<Doc> {
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
    pub(super) fn is_root_project_file(&self, file: FileId) -> bool {
        self.p.sources.path(file).is_some_and(|p| {
            ["charly.yml", "charly/build.yml", "build.yml"]
                .iter()
                .any(|f| p == self.p.root.join(f))
        })
    }

    pub(super) fn unknown_top_key(&mut self, k: &Node, name: &str) {
        let known = ROOT_KEYS.iter().chain(KIND_KEYS.iter()).copied();
        let mut d = Diagnostic::warning(k.span, format!("unknown top-level key `{name}`"))
            .with_code(crate::diag::UNKNOWN_FIELD);
        if let Some(n) = nearest(name, known) {
            d = d.with_hint(format!("did you mean `{n}`?"));
        }
        self.diag(d);
    }

    pub(super) fn classify_all(
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
    pub(super) fn classify_all_nodeform(
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
    pub(super) fn nodeform_other(
        &mut self,
        ns: NsId,
        kind: &str,
        name: &str,
        span: Span,
        value: Node,
    ) {
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
}
