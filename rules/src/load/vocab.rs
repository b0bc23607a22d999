//! The vocabulary (project entries, the project's `build.yml`, the root's,
//! the embedded default) and the checks made once everything is
//! registered: plugin kinds and the schema version.

use super::*;

impl Loader<'_> {
    /// Fills each namespace's vocabulary: its own entries, then its
    /// `build.yml` (`charly/build.yml` or `build.yml`), then the root's, then
    /// the embedded default. Whole entries, no deep merge.
    pub(super) fn fill_vocab(&mut self) {
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

    pub(super) fn parse_vocab_text(
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
    pub(super) fn check_plugin_kinds(&mut self) {
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

    pub(super) fn check_schema_version(&mut self) {
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

/// Vocabulary entries of one kind merged into a namespace's: the first
/// definition of a name wins, and `origin` remembers the file it came from
/// as `<kind>/<name>` (when known).
pub(super) fn merge_vocab_kind<V>(
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
pub(super) fn merge_vocab(
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
pub(super) fn fill_missing(n: &mut Namespace, v: &Vocab, origin: &BTreeMap<String, FileId>) {
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
