//! Reading a file once into the source map and parsing it from its own text,
//! or taking what [`Loader::prefetch`] read and parsed ahead in parallel.

use super::*;

impl Loader<'_> {
    /// Reads and parses a file. `None` when it cannot be used (diagnosed).
    pub(super) fn read_docs(
        &mut self,
        path: &Path,
        at: Option<Span>,
    ) -> Option<(FileId, Vec<Node>)> {
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
    pub(super) fn read_and_parse(
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
    pub(super) fn prefetch(
        &mut self,
        manifests: &[PathBuf],
        listings: HashMap<PathBuf, BTreeSet<String>>,
    ) {
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
}
