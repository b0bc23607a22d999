//! The last resolution of a project, kept in the store next to its parse
//! cache (`<store>/trees/<id>.res`): a load whose project is the same as
//! the last one's — by [`Project::resolution_inputs`], a digest of every
//! part of the project resolving reads — takes the resolution from the
//! file instead of resolving again (~190 ms of one thread at 10,000
//! candies × 1,000 boxes, against ~15 ms to read it back).
//!
//! Resolving is pure: the same project resolves alike under the same
//! binary, so the file names the binary (as the parse cache does) and the
//! digest, and carries a digest of its body. A file from another binary,
//! for another project state, truncated or damaged answers nothing: the
//! project is resolved, and the file written again. It is rewritten only
//! when the project changed.

use charly_rules::diag::{Diagnostic, Diagnostics, Severity};
use charly_rules::load::{NsId, Project};
use charly_rules::resolve::{self, BaseRef, BuilderUse, Resolution, ResolvedBox, User};
use charly_rules::source::{FileId, Span};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"chresol\x01";

/// The cache file of the project at `root` in the store at `store_dir`.
pub fn path(store_dir: &Path, root: &Path) -> PathBuf {
    crate::trees::TreeFile::path(store_dir, root).with_extension("res")
}

/// The resolution of the project `p` at `root`: read from the store's file
/// when it was made for this project state by this binary, else resolved
/// (and the file written, into an existing `store_dir` only). With it, the
/// project's digest ([`Project::resolution_inputs`]), which names the
/// project state to the store's other per-project files.
pub fn resolve(store_dir: &Path, root: &Path, p: &Project) -> (Resolution, [u8; 32]) {
    let file = path(store_dir, root);
    let inputs = {
        let _t = crate::timings::phase("resolve: inputs");
        p.resolution_inputs()
    };
    let context = crate::trees::context();
    let head: [&[u8]; 3] = [MAGIC, &context, &inputs];
    if let Some(r) = read(&file, &head) {
        return (r, inputs);
    }
    let r = {
        let _t = crate::timings::phase("resolve: resolve");
        resolve::resolve(p)
    };
    if store_dir.is_dir()
        && let Ok(body) = postcard::to_stdvec(&Wire::of(&r))
    {
        let _t = crate::timings::phase("resolve: save");
        // A file that cannot be written only costs the next run a resolve.
        let _ = crate::trees::write_sealed(&file, store_dir, &head, &body);
    }
    (r, inputs)
}

/// The resolution in `file`, when it is sound and made under `head`.
fn read(file: &Path, head: &[&[u8]]) -> Option<Resolution> {
    let _t = crate::timings::phase("resolve: read");
    let data = std::fs::read(file).ok()?;
    let at = crate::trees::sealed_body_at(&data, head)?;
    let wire: Wire = postcard::from_bytes(data.get(at..)?).ok()?;
    Some(wire.into_resolution())
}

// The file's own types: every field written, in order (the JSON form of
// a resolved box leaves out its namespace and span, and some empty
// fields, which a format without field names cannot do).

#[derive(Serialize, Deserialize)]
struct Wire {
    boxes: Vec<(String, Result<WireBox, Vec<WireDiag>>)>,
    global_order: Vec<String>,
    popularity: Vec<(String, u64)>,
    diags: Vec<WireDiag>,
}

#[derive(Serialize, Deserialize)]
struct WireSpan {
    file: u32,
    offset: u32,
    len: u32,
    line: u32,
    col: u32,
}

#[derive(Serialize, Deserialize)]
struct WireDiag {
    error: bool,
    message: String,
    span: Option<WireSpan>,
    hint: Option<String>,
}

#[derive(Serialize, Deserialize)]
enum WireBase {
    External(String),
    Box(String),
    Bootstrap {
        builder: String,
        image: Option<String>,
    },
}

#[derive(Serialize, Deserialize)]
struct WireUser {
    name: String,
    uid: u32,
    gid: u32,
    home: String,
    adopted: bool,
}

#[derive(Serialize, Deserialize)]
struct WireBuilderUse {
    builder: String,
    image: Option<String>,
    candies: Vec<String>,
}

#[derive(Serialize, Deserialize)]
struct WireBox {
    name: String,
    ns: u64,
    span: WireSpan,
    base: WireBase,
    base_chain: Vec<String>,
    root_image: String,
    distro: Vec<String>,
    tags: Vec<String>,
    formats: Vec<String>,
    distro_def: Option<String>,
    authored: Vec<String>,
    candies: Vec<String>,
    provided: Vec<String>,
    builders: Vec<WireBuilderUse>,
    builder_map: Vec<(String, String)>,
    produce: Vec<String>,
    user: WireUser,
    version: String,
    enabled: bool,
    preserve_user: bool,
}

impl WireSpan {
    fn of(s: &Span) -> Self {
        WireSpan {
            file: s.file.0,
            offset: s.offset,
            len: s.len,
            line: s.line,
            col: s.col,
        }
    }

    fn span(self) -> Span {
        Span {
            file: FileId(self.file),
            offset: self.offset,
            len: self.len,
            line: self.line,
            col: self.col,
        }
    }
}

impl WireDiag {
    fn of(d: &Diagnostic) -> Self {
        let Diagnostic {
            severity,
            message,
            span,
            hint,
            code: _,
        } = d;
        WireDiag {
            error: *severity == Severity::Error,
            message: message.clone(),
            span: span.as_ref().map(WireSpan::of),
            hint: hint.clone(),
        }
    }

    fn diagnostic(self) -> Diagnostic {
        Diagnostic {
            severity: if self.error {
                Severity::Error
            } else {
                Severity::Warning
            },
            message: self.message,
            span: self.span.map(WireSpan::span),
            hint: self.hint,
            code: None,
        }
    }
}

impl WireBox {
    fn of(b: &ResolvedBox) -> Self {
        // Every field named: a field added to ResolvedBox fails to compile
        // here until the file carries it.
        let ResolvedBox {
            name,
            ns,
            span,
            base,
            base_chain,
            root_image,
            distro,
            tags,
            formats,
            distro_def,
            authored,
            candies,
            provided,
            builders,
            builder_map,
            produce,
            user,
            version,
            enabled,
            preserve_user,
        } = b;
        let User {
            name: user_name,
            uid,
            gid,
            home,
            adopted,
        } = user;
        WireBox {
            name: name.clone(),
            ns: ns.0 as u64,
            span: WireSpan::of(span),
            base: match base {
                BaseRef::External(s) => WireBase::External(s.clone()),
                BaseRef::Box(s) => WireBase::Box(s.clone()),
                BaseRef::Bootstrap { builder, image } => WireBase::Bootstrap {
                    builder: builder.clone(),
                    image: image.clone(),
                },
            },
            base_chain: base_chain.clone(),
            root_image: root_image.clone(),
            distro: distro.clone(),
            tags: tags.clone(),
            formats: formats.clone(),
            distro_def: distro_def.clone(),
            authored: authored.clone(),
            candies: candies.clone(),
            provided: provided.clone(),
            builders: builders
                .iter()
                .map(|u| {
                    let BuilderUse {
                        builder,
                        image,
                        candies,
                    } = u;
                    WireBuilderUse {
                        builder: builder.clone(),
                        image: image.clone(),
                        candies: candies.clone(),
                    }
                })
                .collect(),
            builder_map: builder_map
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            produce: produce.clone(),
            user: WireUser {
                name: user_name.clone(),
                uid: *uid,
                gid: *gid,
                home: home.clone(),
                adopted: *adopted,
            },
            version: version.clone(),
            enabled: *enabled,
            preserve_user: *preserve_user,
        }
    }

    fn resolved(self) -> ResolvedBox {
        ResolvedBox {
            name: self.name,
            ns: NsId(self.ns as usize),
            span: self.span.span(),
            base: match self.base {
                WireBase::External(s) => BaseRef::External(s),
                WireBase::Box(s) => BaseRef::Box(s),
                WireBase::Bootstrap { builder, image } => BaseRef::Bootstrap { builder, image },
            },
            base_chain: self.base_chain,
            root_image: self.root_image,
            distro: self.distro,
            tags: self.tags,
            formats: self.formats,
            distro_def: self.distro_def,
            authored: self.authored,
            candies: self.candies,
            provided: self.provided,
            builders: self
                .builders
                .into_iter()
                .map(|u| BuilderUse {
                    builder: u.builder,
                    image: u.image,
                    candies: u.candies,
                })
                .collect(),
            builder_map: self.builder_map.into_iter().collect(),
            produce: self.produce,
            user: User {
                name: self.user.name,
                uid: self.user.uid,
                gid: self.user.gid,
                home: self.user.home,
                adopted: self.user.adopted,
            },
            version: self.version,
            enabled: self.enabled,
            preserve_user: self.preserve_user,
        }
    }
}

impl Wire {
    fn of(r: &Resolution) -> Self {
        let Resolution {
            boxes,
            global_order,
            popularity,
            diags: project_diags,
        } = r;
        Wire {
            boxes: boxes
                .iter()
                .map(|(name, b)| {
                    let b = match b {
                        Ok(b) => Ok(WireBox::of(b)),
                        Err(e) => Err(e.iter().map(WireDiag::of).collect()),
                    };
                    (name.clone(), b)
                })
                .collect(),
            global_order: global_order.clone(),
            popularity: popularity
                .iter()
                .map(|(k, n)| (k.clone(), *n as u64))
                .collect(),
            diags: project_diags.iter().map(WireDiag::of).collect(),
        }
    }

    fn into_resolution(self) -> Resolution {
        let mut project_diags = Diagnostics::new();
        for d in self.diags {
            project_diags.push(d.diagnostic());
        }
        Resolution {
            boxes: self
                .boxes
                .into_iter()
                .map(|(name, b)| {
                    let b = match b {
                        Ok(b) => Ok(b.resolved()),
                        Err(e) => Err(e.into_iter().map(WireDiag::diagnostic).collect()),
                    };
                    (name, b)
                })
                .collect(),
            global_order: self.global_order,
            popularity: self
                .popularity
                .into_iter()
                .map(|(k, n)| (k, n as usize))
                .collect(),
            diags: project_diags,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use charly_rules::load::{LoadOptions, load};

    fn loaded(root: &Path) -> Project {
        load(root, &LoadOptions::default()).expect("load")
    }

    fn text(r: &Resolution) -> String {
        format!("{r:?}")
    }

    /// What the store's file answers, if anything (the project as `p`).
    fn from_file(store: &Path, root: &Path, p: &Project) -> Option<Resolution> {
        let inputs = p.resolution_inputs();
        let context = crate::trees::context();
        read(&path(store, root), &[MAGIC, &context, &inputs])
    }

    /// Real projects of both formats, with boxes that do not resolve and
    /// project-wide warnings: read back, the resolution is the one
    /// resolving gives, every field (spans, namespaces, errors) included.
    #[test]
    fn a_resolution_reads_back_as_it_was_resolved() {
        for root in [
            charly_testutil::project::example(),
            charly_testutil::project::corpus(),
            charly_testutil::project::corpus_174(),
        ] {
            let store = tempfile::tempdir().expect("tmp");
            let p = loaded(&root);
            let want = text(&resolve::resolve(&p));
            assert!(from_file(store.path(), &root, &p).is_none());
            assert_eq!(text(&super::resolve(store.path(), &root, &p).0), want);
            let back = from_file(store.path(), &root, &p).expect("written");
            assert_eq!(text(&back), want, "{}", root.display());
            assert_eq!(text(&super::resolve(store.path(), &root, &p).0), want);
            // The same project loaded again has the same inputs.
            assert_eq!(loaded(&root).resolution_inputs(), p.resolution_inputs());
        }
    }

    /// Edits that change what resolves, one of them to a file that is not
    /// a manifest (a builder is triggered by a candy's `package.json`),
    /// are never answered from the file of the project before them.
    #[test]
    fn a_changed_project_is_resolved_again() {
        let tmp = tempfile::tempdir().expect("tmp");
        let store = tmp.path().join("store");
        std::fs::create_dir_all(&store).expect("store");
        let root = charly_testutil::project::copy_project(
            &charly_testutil::project::example(),
            &tmp.path().join("p"),
        );
        let fresh = |p: &Project| text(&resolve::resolve(p));
        let mut seen = vec![];
        let edits: [&dyn Fn(); 3] = [
            &|| {
                let f = root.join("box/hello/charly.yml");
                let body = std::fs::read_to_string(&f).expect("read");
                std::fs::write(&f, body.replace("        - cowsay\n", "")).expect("write");
            },
            &|| charly_testutil::write(&root, "candy/greeter/package.json", "{\"name\": \"x\"}"),
            &|| std::fs::remove_dir_all(root.join("candy/hello-deb")).expect("rm"),
        ];
        let p = loaded(&root);
        super::resolve(&store, &root, &p);
        seen.push(fresh(&p));
        for (i, edit) in edits.iter().enumerate() {
            edit();
            let p = loaded(&root);
            assert!(from_file(&store, &root, &p).is_none(), "edit {i}");
            let got = text(&super::resolve(&store, &root, &p).0);
            assert_eq!(got, fresh(&p), "edit {i}");
            assert!(!seen.contains(&got), "edit {i} changed the resolution");
            seen.push(got);
        }
    }

    /// A damaged file, or one made by another binary, answers nothing.
    #[test]
    fn a_damaged_or_foreign_file_is_not_read() {
        let store = tempfile::tempdir().expect("tmp");
        let root = charly_testutil::project::example();
        let p = loaded(&root);
        super::resolve(store.path(), &root, &p);
        let file = path(store.path(), &root);
        let good = std::fs::read(&file).expect("written");
        let mut bad = good.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        std::fs::write(&file, &bad).expect("write");
        assert!(from_file(store.path(), &root, &p).is_none());
        std::fs::write(&file, &good[..good.len() / 2]).expect("write");
        assert!(from_file(store.path(), &root, &p).is_none());
        let inputs = p.resolution_inputs();
        assert!(read(&file, &[MAGIC, &[0; 32], &inputs]).is_none());
        // Resolved again, and written again.
        assert_eq!(
            text(&super::resolve(store.path(), &root, &p).0),
            text(&resolve::resolve(&p))
        );
        assert_eq!(std::fs::read(&file).expect("rewritten"), good);
    }
}
