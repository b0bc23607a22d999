//! Every node's key, pinned per node, and what enters each kind's key,
//! pinned per kind (issue 52), on the 2026.160 corpus and the bundled
//! example, for images (layers, images, builder stages, local packages,
//! root filesystems, bases) and deploy plans (every target).
//!
//! * `keys_*` snapshots list `id key` for every node: a change that means
//!   to move keys (a new input, an emitter fix) shows which nodes it moves
//!   in the snapshot's diff (`cargo insta review`); a refactor must leave
//!   them as they are.
//! * `inputs_*` snapshots list, per node kind, the names of the inputs its
//!   key is made of (`var:*` for every `var:` entry, and so on): an input
//!   dropped from a kind's key, or one added, changes the list.
//! * `key_follows_*` tests change one input that the corpus and example
//!   never vary on their own (architecture, runner, `--dev-local-pkg`, a
//!   builder stage's user, a local package's distro) and require exactly
//!   the kinds that must follow it to change.

use charly_cache::Store;
use charly_engine::api::Engine;
use charly_engine::graph::{Goal, Graph, GraphOptions};
use charly_engine::hash::FileHasher;
use charly_engine::key::NodeKind;
use charly_rules::load::{self, LoadOptions};
use charly_rules::plan::Target;
use charly_rules::resolve;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

fn opts() -> GraphOptions {
    GraphOptions::new("podman", "amd64")
}

/// The graph of every resolvable box of the project at `root`: images and
/// the deploy plans of every target.
fn graph(root: &Path, store: &Path, opts: GraphOptions) -> Graph {
    let p = load::load(root, &LoadOptions::default()).expect("project loads");
    let r = resolve::resolve(&p);
    let boxes = r.resolved_names();
    assert!(!boxes.is_empty());
    let store = Store::open(store).expect("store");
    let hasher = FileHasher::in_memory();
    let engine = Engine {
        project: &p,
        resolution: &r,
        store: &store,
        runner: None,
        hasher: &hasher,
        opts,
        remote: None,
        own_inputs: None,
    };
    let mut goals = vec![(Goal::Build, boxes.clone())];
    for t in [Target::Local, Target::Vm, Target::Pod, Target::K8s] {
        goals.push((Goal::Plan(t), boxes.clone()));
    }
    engine.graph_goals(&goals).expect("graph")
}

fn keys(g: &Graph) -> BTreeMap<String, (NodeKind, String)> {
    g.g.node_weights()
        .map(|n| (n.id.clone(), (n.kind, n.key.to_hex().to_string())))
        .collect()
}

fn key_lines(g: &Graph) -> String {
    let mut out = String::new();
    for (id, (_, key)) in keys(g) {
        out.push_str(&format!("{id} {key}\n"));
    }
    out
}

/// An input's name with its variable part starred: `var:GREETING` →
/// `var:*`, `format/deb/local_pkg` → `format/*`.
fn shape(name: &str) -> String {
    match name.find([':', '/']) {
        Some(i) => format!("{}*", &name[..=i]),
        None => name.to_string(),
    }
}

/// Per kind, the shapes of the inputs its nodes' keys are made of.
fn input_lines(g: &Graph) -> String {
    let mut by_kind: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for n in g.g.node_weights() {
        let k = n.inputs();
        let set = by_kind.entry(n.kind.as_str()).or_default();
        set.insert(format!("schema {}", k.schema));
        for name in k.values.keys() {
            set.insert(format!("value {}", shape(name)));
        }
        for name in k.texts.keys() {
            set.insert(format!("text {}", shape(name)));
        }
        if !k.files.is_empty() {
            set.insert("files".into());
        }
        for dep in k.deps.keys() {
            set.insert(format!("dep {}", shape(dep)));
        }
        if k.base.is_some() {
            set.insert("base".into());
        }
        if k.builder_image.is_some() {
            set.insert("builder-image".into());
        }
    }
    let mut out = String::new();
    for (kind, set) in by_kind {
        out.push_str(&format!("{kind}:\n"));
        for s in set {
            out.push_str(&format!("  {s}\n"));
        }
    }
    out
}

fn kinds(g: &Graph) -> BTreeSet<NodeKind> {
    g.g.node_weights().map(|n| n.kind).collect()
}

/// A copy of a project in a temp dir, with its store beside it.
struct Copy {
    _tmp: tempfile::TempDir,
    root: std::path::PathBuf,
    store: std::path::PathBuf,
}

fn copy(from: &Path) -> Copy {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("project");
    charly_testutil::copy_project(from, &root);
    let store = tmp.path().join("store");
    Copy {
        _tmp: tmp,
        root,
        store,
    }
}

/// The example's settings turn `--dev-local-pkg` on (its local package
/// exists only as source).
fn example_opts() -> GraphOptions {
    GraphOptions {
        dev_local_pkg: true,
        ..opts()
    }
}

fn example() -> std::path::PathBuf {
    charly_testutil::workspace().join("examples/hello")
}

#[test]
fn corpus_keys_are_pinned_per_node() {
    let c = copy(&charly_testutil::corpus());
    let g = graph(&c.root, &c.store, opts());
    let want: BTreeSet<NodeKind> = [
        NodeKind::Source,
        NodeKind::Layer,
        NodeKind::Image,
        NodeKind::BuilderStage,
        NodeKind::Rootfs,
        NodeKind::Base,
        NodeKind::Plan,
    ]
    .into();
    let have = kinds(&g);
    assert!(
        want.is_subset(&have),
        "the corpus graph lacks kinds {:?}",
        want.difference(&have).collect::<Vec<_>>()
    );
    insta::assert_snapshot!("keys_corpus", key_lines(&g));
    insta::assert_snapshot!("inputs_corpus", input_lines(&g));
}

#[test]
fn example_keys_are_pinned_per_node() {
    let c = copy(&example());
    let g = graph(&c.root, &c.store, example_opts());
    let want: BTreeSet<NodeKind> = [
        NodeKind::Source,
        NodeKind::Layer,
        NodeKind::Image,
        NodeKind::BuilderStage,
        NodeKind::LocalPkg,
        NodeKind::Rootfs,
        NodeKind::Plan,
    ]
    .into();
    let have = kinds(&g);
    assert!(
        want.is_subset(&have),
        "the example's graph lacks kinds {:?}",
        want.difference(&have).collect::<Vec<_>>()
    );
    insta::assert_snapshot!("keys_example", key_lines(&g));
    insta::assert_snapshot!("inputs_example", input_lines(&g));
}

/// The kinds of the nodes whose keys differ between two graphs of the same
/// nodes.
fn moved(a: &Graph, b: &Graph) -> BTreeSet<NodeKind> {
    let (ka, kb) = (keys(a), keys(b));
    assert_eq!(
        ka.keys().collect::<Vec<_>>(),
        kb.keys().collect::<Vec<_>>(),
        "the same nodes"
    );
    ka.iter()
        .filter(|(id, k)| kb[*id] != **k)
        .map(|(_, (kind, _))| *kind)
        .collect()
}

/// The ids of the nodes of `kind` whose keys differ.
fn moved_ids(a: &Graph, b: &Graph, kind: NodeKind) -> BTreeSet<String> {
    let (ka, kb) = (keys(a), keys(b));
    ka.iter()
        .filter(|(id, (k, key))| *k == kind && kb.get(*id).is_some_and(|(_, other)| other != key))
        .map(|(id, _)| id.clone())
        .collect()
}

#[test]
fn key_follows_the_architecture_and_the_runner() {
    let c = copy(&example());
    let base = graph(&c.root, &c.store, example_opts());
    // Everything an image is made of is per architecture and per runner;
    // sources and plans are neither.
    let built = [
        NodeKind::Layer,
        NodeKind::Image,
        NodeKind::Rootfs,
        NodeKind::BuilderStage,
        NodeKind::LocalPkg,
    ];
    let arch = graph(
        &c.root,
        &c.store,
        GraphOptions {
            arch: "arm64".into(),
            ..example_opts()
        },
    );
    let m = moved(&base, &arch);
    for k in [NodeKind::Layer, NodeKind::Image, NodeKind::Rootfs] {
        assert!(m.contains(&k), "{k:?} keys follow the architecture: {m:?}");
    }
    assert!(!m.contains(&NodeKind::Source) && !m.contains(&NodeKind::Plan));
    let runner = graph(
        &c.root,
        &c.store,
        GraphOptions {
            runner: "remote".into(),
            ..example_opts()
        },
    );
    let m = moved(&base, &runner);
    for k in built {
        assert!(m.contains(&k), "{k:?} keys follow the runner: {m:?}");
    }
    assert!(!m.contains(&NodeKind::Source) && !m.contains(&NodeKind::Plan));
}

#[test]
fn key_follows_dev_local_pkg() {
    let c = copy(&example());
    let base = graph(&c.root, &c.store, opts());
    let dev = graph(
        &c.root,
        &c.store,
        GraphOptions {
            dev_local_pkg: true,
            ..opts()
        },
    );
    // The candy with the local package renders differently: its layer (and
    // every layer and image above it) moves.
    let m = moved_ids(&base, &dev, NodeKind::Layer);
    assert!(
        m.iter().any(|id| id.contains("hello-deb")),
        "hello-deb's layer follows --dev-local-pkg: {m:?}"
    );
}

/// A builder stage runs as its box's user: two users, two keys, even where
/// nothing else about the stage differs (the stage's id names the user only
/// by uid and home, so two names with one uid share an id: the key must
/// tell them apart).
#[test]
fn key_follows_a_builder_stages_user() {
    let c = copy(&example());
    let base = graph(&c.root, &c.store, example_opts());
    let hello = c.root.join("box/hello/charly.yml");
    let text = std::fs::read_to_string(&hello).expect("read");
    std::fs::write(
        &hello,
        format!("{text}    user: greeter\n    home: /home/user\n"),
    )
    .expect("edit");
    let other = graph(&c.root, &c.store, example_opts());
    let stage = |g: &Graph| -> BTreeMap<String, charly_engine::key::KeyInputs> {
        g.g.node_weights()
            .filter(|n| n.kind == NodeKind::BuilderStage)
            .map(|n| (n.id.clone(), n.inputs()))
            .collect()
    };
    let (a, b) = (stage(&base), stage(&other));
    assert!(!a.is_empty(), "the example has builder stages");
    let moved = moved_ids(&base, &other, NodeKind::BuilderStage);
    assert!(
        !moved.is_empty(),
        "hello's builder stages follow hello's user: {:?} / {:?}",
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>()
    );
    // Only through the user: the stage's other inputs are the same.
    for id in &moved {
        let (a, b) = (&a[id], &b[id]);
        assert_eq!(a.deps, b.deps, "{id}: same dependencies");
        assert_eq!(a.texts, b.texts, "{id}: same texts");
        assert_ne!(a.values.get("user"), b.values.get("user"), "{id}");
    }
}

#[test]
fn key_follows_a_local_packages_distro() {
    let c = copy(&example());
    let base = graph(&c.root, &c.store, example_opts());
    let root = c.root.join("charly.yml");
    let text = std::fs::read_to_string(&root).expect("read");
    // The first distro tag a box is resolved for.
    std::fs::write(&root, text.replace("- debian:12\n", "- debian:13\n")).expect("edit");
    let other = graph(&c.root, &c.store, example_opts());
    let m = moved_ids(&base, &other, NodeKind::LocalPkg);
    assert!(
        !m.is_empty(),
        "local packages follow the distro they are built for"
    );
}

/// What is documented as not keyed stays out of every key: the same
/// project in another directory, loaded again, gives the same keys.
#[test]
fn keys_do_not_follow_the_location() {
    let a = copy(&example());
    let b = copy(&example());
    assert_eq!(
        key_lines(&graph(&a.root, &a.store, opts())),
        key_lines(&graph(&b.root, &b.store, opts()))
    );
}

/// A local package is made of its source files, its recipe (the candy's
/// `localpkg:` entry, the format's `local_pkg` definition) and the image it
/// is built in (issue 46): an edit elsewhere in its candy keeps its key,
/// an edit of the recipe or of a source file moves it.
#[test]
fn a_local_package_follows_its_recipe_not_the_rest_of_its_candy() {
    let c = copy(&example());
    let local_pkgs = |g: &Graph| -> BTreeMap<String, String> {
        g.g.node_weights()
            .filter(|n| n.kind == NodeKind::LocalPkg)
            .map(|n| (n.id.clone(), n.key.to_hex().to_string()))
            .collect()
    };
    let base = local_pkgs(&graph(&c.root, &c.store, example_opts()));
    assert!(!base.is_empty(), "the example builds a local package");
    let candy = c.root.join("candy/hello-deb/charly.yml");
    let text = std::fs::read_to_string(&candy).expect("read");

    // Unrelated: the description and a check. The candy's layer moves (its
    // labels), the package does not.
    std::fs::write(
        &candy,
        text.replace("description: A local", "description: Another local")
            .replace("contains: hello from", "contains: hello"),
    )
    .expect("edit");
    let g = graph(&c.root, &c.store, example_opts());
    assert_eq!(
        local_pkgs(&g),
        base,
        "an unrelated edit kept the package's key"
    );

    // The recipe: the directory the candy names (same files, another name).
    std::fs::rename(
        c.root.join("candy/hello-deb/pkg"),
        c.root.join("candy/hello-deb/pkg2"),
    )
    .expect("rename");
    std::fs::write(&candy, text.replace("deb: pkg", "deb: pkg2")).expect("edit");
    let moved = local_pkgs(&graph(&c.root, &c.store, example_opts()));
    assert!(
        moved.iter().all(|(id, k)| base.get(id) != Some(k)),
        "the candy's localpkg entry is part of the recipe"
    );
    std::fs::rename(
        c.root.join("candy/hello-deb/pkg2"),
        c.root.join("candy/hello-deb/pkg"),
    )
    .expect("rename back");
    std::fs::write(&candy, &text).expect("restore");
    assert_eq!(local_pkgs(&graph(&c.root, &c.store, example_opts())), base);

    // The format's build template (the vocabulary's `local_pkg`): the
    // example uses the embedded vocabulary; a project copy overrides it.
    let vocab = c.root.join("charly/build.yml");
    assert!(!vocab.exists(), "the example has no vocabulary of its own");
    let embedded = charly_rules::load::DEFAULT_VOCAB;
    let line = "command -v dpkg-buildpackage >/dev/null";
    assert!(embedded.contains(line), "deb's build template");
    std::fs::create_dir_all(vocab.parent().expect("dir")).expect("mkdir");
    std::fs::write(&vocab, embedded.replacen(line, &format!("{line} "), 1)).expect("vocabulary");
    let after = local_pkgs(&graph(&c.root, &c.store, example_opts()));
    assert!(
        after.iter().all(|(id, k)| base.get(id) != Some(k)),
        "the format's build template is part of the recipe: {after:?}"
    );
    std::fs::write(&vocab, embedded).expect("the embedded vocabulary, as it is");
    assert_eq!(
        local_pkgs(&graph(&c.root, &c.store, example_opts())),
        base,
        "a project copy of the embedded vocabulary is the same recipe"
    );

    // A source file.
    let src = walkdir::WalkDir::new(c.root.join("candy/hello-deb/pkg"))
        .into_iter()
        .flatten()
        .find(|e| e.file_type().is_file())
        .expect("a source file");
    let mut bytes = std::fs::read(src.path()).expect("read");
    bytes.extend_from_slice(b"\n");
    std::fs::write(src.path(), bytes).expect("edit source");
    let after = local_pkgs(&graph(&c.root, &c.store, example_opts()));
    assert!(
        after.iter().all(|(id, k)| base.get(id) != Some(k)),
        "a source file is part of the package"
    );
}
