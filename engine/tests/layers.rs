//! Layers as nodes, with the fake runner: sibling boxes share their
//! common prefix as one chain of nodes, built once; a box built after
//! another runs only its own suffix; images are assembled, not built.

use charly_cache::Store;
use charly_engine::api::Engine;
use charly_engine::graph::{Goal, Graph, GraphOptions};
use charly_engine::hash::FileHasher;
use charly_engine::id::NodeId;
use charly_engine::key::NodeKind;
use charly_engine::runners::Runner as _;
use charly_engine::runners::fake::FakeRunner;
use charly_engine::sched::{Quiet, State, Summary};
use charly_rules::load::{self, LoadOptions};
use charly_rules::resolve;
use std::collections::BTreeSet;
use std::path::Path;

const BOXES: usize = 20;

/// A project of 20 boxes on one base: each takes a prefix (5–15 candies)
/// of one of two trunks, plus a candy of its own.
fn project(root: &Path) {
    let w = |rel: &str, text: String| {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, text).expect("write");
    };
    w(
        "charly.yml",
        "version: 2026.160.1301\ndiscover: [box, candy]\ndefaults:\n    distro: [busybox]\n    build: [none]\ndistro:\n    busybox:\n        base_user: {name: user, uid: 1000, gid: 1000, home: /home/user}\n".into(),
    );
    w(
        "box/root/charly.yml",
        "box:\n    name: root\n    version: 1.0.0\n    base: localhost/charly-test-busybox:1\n"
            .into(),
    );
    let candy = |name: &str| {
        format!(
            "candy:\n    version: 1.0.0\n    name: {name}\n    task:\n        - write: /etc/{name}.conf\n          user: root\n          content: \"{name}\\n\"\n"
        )
    };
    for t in ["a", "b"] {
        for n in 0..15 {
            let name = format!("{t}{n:02}");
            // Each trunk candy needs the one before it: one global order.
            let mut text = candy(&name);
            if n > 0 {
                text.push_str(&format!("    depends: [{t}{:02}]\n", n - 1));
            }
            w(&format!("candy/{name}/charly.yml"), text);
        }
    }
    for i in 0..BOXES {
        let trunk = if i % 2 == 0 { "a" } else { "b" };
        let len = 5 + (i * 7) % 11;
        let own = format!("own{i:02}");
        w(&format!("candy/{own}/charly.yml"), candy(&own));
        let mut list: Vec<String> = (0..len).map(|n| format!("{trunk}{n:02}")).collect();
        list.push(own);
        w(
            &format!("box/box{i:02}/charly.yml"),
            format!(
                "box:\n    name: box{i:02}\n    version: 1.0.0\n    base: root\n    candy: [{}]\n",
                list.join(", ")
            ),
        );
    }
}

struct World {
    _tmp: tempfile::TempDir,
    root: std::path::PathBuf,
    store: Store,
    hasher: FileHasher,
}

fn world() -> World {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("p");
    project(&root);
    let store = Store::open(&tmp.path().join("store")).expect("store");
    let hasher = FileHasher::with_cache_file(tmp.path().join("stat.json"));
    World {
        _tmp: tmp,
        root,
        store,
        hasher,
    }
}

/// Wants every node's reason (so the summary carries them).
struct Reasons;
impl charly_engine::sched::Observer for Reasons {
    fn wants_reason(&self, _kind: charly_engine::key::NodeKind) -> bool {
        true
    }
}

fn build(w: &World, boxes: &[String], f: &FakeRunner) -> (Graph, Summary) {
    let p = load::load(&w.root, &LoadOptions::default()).expect("loads");
    let r = resolve::resolve(&p);
    let engine = Engine {
        project: &p,
        resolution: &r,
        store: &w.store,
        runner: Some(f),
        hasher: &w.hasher,
        opts: GraphOptions::new(f.name(), "amd64"),
        remote: None,
        own_inputs: None,
    };
    let g = engine.graph(&Goal::Build, boxes).expect("graph");
    let s = engine.run(&g, &w.root, 2, false, &Reasons);
    assert!(
        s.ok(),
        "{:?}",
        s.nodes
            .iter()
            .filter(|n| n.error.is_some())
            .collect::<Vec<_>>()
    );
    (g, s)
}

fn names() -> Vec<String> {
    (0..BOXES).map(|i| format!("box{i:02}")).collect()
}

/// The distinct candy prefixes of the boxes' chains, from the resolution
/// (independently of the graph): what the layer nodes must be.
fn distinct_prefixes(w: &World) -> (usize, usize, usize) {
    let p = load::load(&w.root, &LoadOptions::default()).expect("loads");
    let r = resolve::resolve(&p);
    let mut prefixes = BTreeSet::new();
    let mut longest = 0;
    let mut total = 0;
    for b in names() {
        let rb = r.get(&b).expect("resolves");
        for n in 1..=rb.candies.len() {
            prefixes.insert(rb.candies[..n].to_vec());
        }
        longest = longest.max(rb.candies.len());
        total += rb.candies.len();
    }
    (prefixes.len(), longest, total)
}

#[test]
fn siblings_share_their_prefix_as_one_chain_of_layers() {
    let w = world();
    let (expected, longest, total) = distinct_prefixes(&w);
    assert!(longest >= 15, "the chains are deep: {longest}");
    assert!(
        expected * 2 < total,
        "the boxes share most of their chains: {expected} distinct of {total}"
    );
    let f = FakeRunner::new();
    let (g, s) = build(&w, &names(), &f);
    // One layer node per distinct prefix, plus the root box's setup layer.
    let layers: Vec<&charly_engine::graph::Node> =
        g.g.node_weights()
            .filter(|n| n.kind == NodeKind::Layer)
            .collect();
    assert_eq!(
        layers.len(),
        expected + 1,
        "layer nodes = distinct prefixes + root setup"
    );
    // Each ran exactly once, through the runner.
    let calls = f.calls();
    for l in &layers {
        assert_eq!(
            calls
                .iter()
                .filter(|c| c.what == "layer" && c.node == l.id)
                .count(),
            1,
            "{}",
            l.id
        );
    }
    assert_eq!(
        calls.iter().filter(|c| c.what == "layer").count(),
        layers.len()
    );
    // A shared layer is reported once, with every box whose image holds it.
    let first = s
        .nodes
        .iter()
        .find(|n| n.candy.as_deref() == Some("a00"))
        .expect("a00 layer");
    assert_eq!(first.kind, NodeKind::Layer);
    assert_eq!(
        first.boxes,
        (0..BOXES)
            .step_by(2)
            .map(|i| format!("box{i:02}"))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        s.nodes
            .iter()
            .filter(|n| n.candy.as_deref() == Some("a00"))
            .count(),
        1
    );
    // Images are assembled: no runner call builds them, one load each.
    for b in names() {
        let id = format!("image:{b}");
        assert!(
            !calls.iter().any(|c| c.node == id),
            "{id} reached the runner"
        );
        assert_eq!(
            calls
                .iter()
                .filter(|c| c.what == "load" && c.node == format!("localhost/{b}:1.0.0"))
                .count(),
            1,
            "{b} is loaded once"
        );
    }
    // The same build again: nothing runs and the runner is not called.
    let f2 = FakeRunner::new();
    let (_, s2) = build(&w, &names(), &f2);
    assert_eq!(s2.totals.ran, 0);
    assert!(f2.calls().is_empty(), "{:?}", f2.calls());

    // Every built image is a GC root with its chain, and its record names
    // the chain's blobs: a GC down to nothing keeps every layer of every
    // image, and the next build still runs nothing.
    let roots = w.store.roots().expect("roots");
    let images: Vec<_> = roots
        .iter()
        .filter(|(n, _)| !n.contains('#'))
        .cloned()
        .collect();
    assert_eq!(images.len(), BOXES);
    let report = w.store.gc(1).expect("gc");
    assert!(!report.within_budget);
    let f3 = FakeRunner::new();
    let (_, s3) = build(&w, &names(), &f3);
    let reran: Vec<&str> = s3
        .nodes
        .iter()
        .filter(|n| n.state == State::Ran && n.kind != NodeKind::Source)
        .map(|n| n.id.as_str())
        .collect();
    assert!(reran.is_empty(), "nothing reran after the GC: {reran:?}");
    assert!(!f3.calls().iter().any(|c| c.what == "layer"));
    for (_, key) in images {
        let rec = w
            .store
            .get_record(&key)
            .expect("get")
            .expect("rooted record");
        let meta: charly_engine::outputs::ImageMeta = charly_engine::outputs::read_meta(&rec.meta);
        assert!(meta.layers.chain.len() >= 7, "{:?}", meta.layers.chain);
        for l in &meta.layers.chain {
            let d: charly_cache::BlobDigest = l.blob.parse().expect("digest");
            assert!(w.store.has_blob(&d), "layer {} kept", l.digest);
        }
    }
}

#[test]
fn a_box_built_after_its_sibling_runs_only_its_own_suffix() {
    let w = world();
    let p = load::load(&w.root, &LoadOptions::default()).expect("loads");
    let r = resolve::resolve(&p);
    // box00 (trunk a, 5 candies + own) then box02 (trunk a, 8 candies + own).
    let c0 = r.get("box00").expect("box00").candies.clone();
    let c2 = r.get("box02").expect("box02").candies.clone();
    let shared = c0.iter().zip(&c2).take_while(|(a, b)| a == b).count();
    assert!(shared >= 5, "{c0:?} / {c2:?}");
    let f = FakeRunner::new();
    build(&w, &["box00".to_string()], &f);
    let f2 = FakeRunner::new();
    let (g, s) = build(&w, &["box02".to_string()], &f2);
    let ran_layers: Vec<String> = s
        .nodes
        .iter()
        .filter(|n| n.kind == NodeKind::Layer && n.state == State::Ran)
        .map(|n| n.candy.clone().unwrap_or_default())
        .collect();
    assert_eq!(ran_layers, c2[shared..].to_vec(), "only the suffix ran");
    // A fresh runner (a fresh machine's storage): the parent of the first
    // new layer is loaded from the store, then the assembled image.
    assert_eq!(f2.calls().iter().filter(|c| c.what == "load").count(), 2);
    // The shared layers are cached, under the same keys.
    let cached = s
        .nodes
        .iter()
        .filter(|n| n.kind == NodeKind::Layer && n.state == State::Cached)
        .count();
    assert_eq!(cached, shared + 1, "the shared candies and root's setup");
    assert!(
        g.g.node_weights()
            .any(|n| matches!(&n.nid, NodeId::Image { box_name } if box_name == "box02"))
    );
}

/// `explain` on a layer names the input that changed; a merged layer's
/// other id finds the same node.
#[test]
fn explain_names_what_changed_in_a_layer() {
    let w = world();
    let f = FakeRunner::new();
    build(&w, &names(), &f);
    let conf = w.root.join("candy/a03/charly.yml");
    let text = std::fs::read_to_string(&conf).expect("read");
    std::fs::write(
        &conf,
        text.replace("content: \"a03\\n\"", "content: \"a03 v2\\n\""),
    )
    .expect("edit");
    let p = load::load(&w.root, &LoadOptions::default()).expect("loads");
    let r = resolve::resolve(&p);
    let engine = Engine {
        project: &p,
        resolution: &r,
        store: &w.store,
        runner: Some(&f),
        hasher: &w.hasher,
        opts: GraphOptions::new(f.name(), "amd64"),
        remote: None,
        own_inputs: None,
    };
    let g = engine.graph(&Goal::Build, &names()).expect("graph");
    let e = engine.explain(&g, "layer:box00/a03").expect("explain");
    let text = e.lines().join("\n");
    assert!(text.contains("would rebuild"), "{text}");
    assert!(text.contains("source:candy/a03"), "{text}");
    assert!(text.contains("candy/a03/charly.yml"), "{text}");
    // The layer's text changed too: which line, not only two digests.
    assert!(
        text.contains("containerfile changed: ")
            && text.contains("\n      - ")
            && text.contains("\n      + "),
        "{text}"
    );
    // box02 shares the layer: its id is an alias of the same node.
    assert_eq!(
        g.node("layer:box02/a03").map(|n| n.key),
        g.node("layer:box00/a03").map(|n| n.key)
    );
    // Above it, box02's own layers would rebuild because their parent did;
    // the parent is named by its id (keys name it by role).
    let e = engine.explain(&g, "layer:box02/a07").expect("explain");
    let i = g.find("layer:box02/a07").expect("layer");
    let parent = g.dep_id(i, charly_engine::graph::PARENT_DEP);
    assert!(parent.starts_with("layer:"), "{parent}");
    let text = e.lines().join("\n");
    assert!(
        text.contains(&format!("dependency {parent} rebuilt")) && !text.contains("parent:"),
        "{text}"
    );
    // Built: the layer's reason starts with the file the user edited, the
    // layers above say their parent rebuilt; cached nodes have none.
    let (_, s) = build(&w, &names(), &f);
    let reason = |id: &str| s.get(id).and_then(|n| n.reason.clone()).unwrap_or_default();
    assert!(
        reason("layer:box00/a03").starts_with("file candy/a03/charly.yml changed: "),
        "{}",
        reason("layer:box00/a03")
    );
    let above = s
        .nodes
        .iter()
        .find(|n| {
            n.state == State::Ran
                && n.reason
                    .as_deref()
                    .is_some_and(|r| r.starts_with("dependency layer:"))
        })
        .map(|n| n.id.clone());
    assert!(
        above.is_some(),
        "{:?}",
        s.nodes
            .iter()
            .map(|n| (&n.id, &n.reason))
            .collect::<Vec<_>>()
    );
    assert!(
        s.nodes
            .iter()
            .all(|n| (n.state == State::Ran) == n.reason.is_some()
                || n.kind == charly_engine::key::NodeKind::Source)
    );
}

/// A layer that cannot render without `--dev-local-pkg` (the example's
/// local .deb) does not stop the graph: every key is computed, and the
/// layer fails when it runs, naming the cause.
#[test]
fn a_layer_that_does_not_render_fails_when_it_runs_not_when_keyed() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("hello");
    charly_testutil::copy_project(&charly_testutil::example(), &root);
    let p = load::load(&root, &LoadOptions::default()).expect("loads");
    let r = resolve::resolve(&p);
    let store = Store::open(&tmp.path().join("store")).expect("store");
    let hasher = FileHasher::with_cache_file(tmp.path().join("stat.json"));
    let f = FakeRunner::new();
    let engine = Engine {
        project: &p,
        resolution: &r,
        store: &store,
        runner: Some(&f),
        hasher: &hasher,
        opts: GraphOptions::new(f.name(), "amd64"),
        remote: None,
        own_inputs: None,
    };
    let g = engine
        .graph(&Goal::Build, &["hello".to_string()])
        .expect("the graph builds");
    let n = g.node("layer:hello/hello-deb").expect("layer");
    assert!(
        n.inputs().values.contains_key("render-error"),
        "{:?}",
        n.inputs()
    );
    let s = engine.run(&g, &root, 2, false, &Quiet);
    let failed = s.get("layer:hello/hello-deb").expect("reported");
    assert_eq!(failed.state, State::Failed);
    assert!(
        failed
            .error
            .as_deref()
            .is_some_and(|e| e.contains("--dev-local-pkg")),
        "{failed:?}"
    );
}
