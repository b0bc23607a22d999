//! Nodes' own key inputs kept in the store between runs
//! (`charly_engine::graph::own`): a graph keyed from them is the graph
//! keyed from scratch, node for node (key and key inputs), and they are
//! used only for the project state and options they were made for.

use charly_cache::Store;
use charly_engine::api::Engine;
use charly_engine::graph::own::{self, OwnFile};
use charly_engine::graph::{Goal, Graph, GraphOptions};
use charly_engine::hash::FileHasher;
use charly_engine::key::KeyInputs;
use charly_engine::sched::Quiet;
use charly_rules::load::{self, LoadOptions, Project};
use charly_rules::plan::Target;
use charly_rules::resolve::{self, Resolution};
use charly_testutil::{copy_project, corpus, graph_fixture, write};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

struct World {
    tmp: tempfile::TempDir,
    root: PathBuf,
    store: Store,
}

impl World {
    fn new(src: &Path) -> World {
        let tmp = tempfile::tempdir().expect("tmp");
        let root = copy_project(src, &tmp.path().join("project"));
        let store = Store::open(&tmp.path().join("store")).expect("store");
        World { tmp, root, store }
    }

    fn open(&self) -> (Project, Resolution) {
        let p = load::load(&self.root, &LoadOptions::default()).expect("loads");
        let r = resolve::resolve(&p);
        (p, r)
    }

    /// The own-inputs file of the project as it is now.
    fn own_file(&self, p: &Project) -> OwnFile {
        OwnFile::new(self.store.dir(), &self.root, p.resolution_inputs())
    }
}

fn opts(dev_local_pkg: bool) -> GraphOptions {
    GraphOptions {
        plugins: Default::default(),
        dev_local_pkg,
        runner: "podman".into(),
        arch: "amd64".into(),
    }
}

/// Every resolved box under each goal that keys it.
fn goals(r: &Resolution) -> Vec<(Goal, Vec<String>)> {
    let boxes = r.resolved_names();
    vec![
        (Goal::Generate, boxes.clone()),
        (Goal::Build, boxes.clone()),
        (Goal::Plan(Target::Local), boxes.clone()),
        (Goal::Plan(Target::Pod), boxes),
    ]
}

fn engine<'a>(
    w: &'a World,
    p: &'a Project,
    r: &'a Resolution,
    hasher: &'a FileHasher,
    opts: GraphOptions,
    own: Option<OwnFile>,
) -> Engine<'a> {
    Engine {
        project: p,
        resolution: r,
        store: &w.store,
        runner: None,
        hasher,
        opts,
        remote: None,
        own_inputs: own,
    }
}

/// The graph for `goals`, keyed with or without the own-inputs file.
fn keyed(
    w: &World,
    goals: &[(Goal, Vec<String>)],
    opts: GraphOptions,
    own: bool,
) -> (Graph, BTreeMap<String, (String, KeyInputs)>) {
    let (p, r) = w.open();
    let hasher = FileHasher::default();
    let own = own.then(|| w.own_file(&p));
    let g = engine(w, &p, &r, &hasher, opts, own)
        .graph_goals(goals)
        .expect("graph");
    let nodes =
        g.g.node_weights()
            .map(|n| (n.id.clone(), (n.key.to_hex().to_string(), n.inputs())))
            .collect();
    (g, nodes)
}

/// How many nodes keep their own inputs in the store.
fn keepable(g: &Graph) -> usize {
    g.g.node_weights().filter(|n| own::keeps(n.kind)).count()
}

#[test]
fn kept_own_inputs_key_every_node_as_computing_them_does() {
    for src in [graph_fixture(), corpus()] {
        let w = World::new(&src);
        let (_, r) = w.open();
        let goals = goals(&r);
        let (_, scratch) = keyed(&w, &goals, opts(false), false);
        // The first run computes them all and keeps them; the second
        // takes every one it can from the store.
        let (g1, first) = keyed(&w, &goals, opts(false), true);
        assert_eq!(g1.own_inputs_reused, 0, "{}", src.display());
        assert!(first == scratch, "{}: first run", src.display());
        let (g2, second) = keyed(&w, &goals, opts(false), true);
        assert!(keepable(&g2) > 10, "{}", src.display());
        assert_eq!(g2.own_inputs_reused, keepable(&g2), "{}", src.display());
        assert!(second == scratch, "{}: second run", src.display());
    }
}

/// Runs the build directories' graph of `w` into `out` (in its store)
/// and writes them; gives how many nodes took kept own inputs.
fn write_build_dirs(w: &World, goal: &(Goal, Vec<String>), own: bool, out: &Path) -> usize {
    let (p, r) = w.open();
    let hasher = FileHasher::default();
    let own = own.then(|| w.own_file(&p));
    let e = engine(w, &p, &r, &hasher, opts(false), own);
    let g = e.graph(&goal.0, &goal.1).expect("graph");
    let s = e.run(&g, out, 2, false, &Quiet);
    assert_eq!(s.totals.failed, 0, "{:?}", s.nodes);
    assert!(s.totals.ran > 0, "nothing ran");
    e.write_build_dirs(&g, out, false).expect("write");
    g.own_inputs_reused
}

fn files(out: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    walkdir::WalkDir::new(out)
        .into_iter()
        .map(|e| e.expect("walk"))
        .filter(|e| e.file_type().is_file())
        .map(|e| {
            let rel = e.path().strip_prefix(out).expect("under").to_path_buf();
            (rel, std::fs::read(e.path()).expect("read"))
        })
        .collect()
}

#[test]
fn build_directories_written_from_kept_inputs_are_the_same() {
    let w = World::new(&graph_fixture());
    let (p, r) = w.open();
    let goal = goals(&r).swap_remove(0);
    let (a, b) = (w.tmp.path().join("a"), w.tmp.path().join("b"));
    assert_eq!(write_build_dirs(&w, &goal, true, &a), 0);
    // The second run has the kept inputs but a new store: its fragments
    // run (compiling their candies, which its graph did not), rather
    // than come from the records of the first.
    let w2 = World {
        tmp: tempfile::tempdir().expect("tmp"),
        root: w.root.clone(),
        store: Store::open(&w.tmp.path().join("store2")).expect("store"),
    };
    let kept = w2.own_file(&p);
    std::fs::create_dir_all(kept.path().parent().expect("trees")).expect("trees");
    std::fs::copy(w.own_file(&p).path(), kept.path()).expect("copy the kept inputs");
    assert!(write_build_dirs(&w2, &goal, true, &b) > 0);
    let (fa, fb) = (files(&a), files(&b));
    assert!(
        fa.keys().any(|f| f.ends_with("Containerfile")),
        "{:?}",
        fa.keys()
    );
    assert!(fa == fb, "the build directories differ");
}

#[test]
fn kept_inputs_serve_only_their_options_and_project_state() {
    let w = World::new(&graph_fixture());
    let (_, r) = w.open();
    let goals = goals(&r);
    keyed(&w, &goals, opts(false), true);
    // Other options: none is taken; the keys are those computed from
    // scratch under them (they differ: dev-local-pkg is a key input).
    let (_, plain) = keyed(&w, &goals, opts(false), false);
    let (_, scratch) = keyed(&w, &goals, opts(true), false);
    assert!(scratch != plain);
    let (g, dev) = keyed(&w, &goals, opts(true), true);
    assert_eq!(g.own_inputs_reused, 0);
    assert!(dev == scratch);
    // The file now keeps them for the new options; the old ones went.
    let (g, _) = keyed(&w, &goals, opts(true), true);
    assert_eq!(g.own_inputs_reused, keepable(&g));
    let (g, _) = keyed(&w, &goals, opts(false), true);
    assert_eq!(g.own_inputs_reused, 0);
    // An edited candy: another project state, nothing taken.
    let (p, r) = w.open();
    let candy = p
        .candies
        .values()
        .find(|c| {
            r.boxes
                .values()
                .flatten()
                .any(|b| b.candies.contains(&c.key))
        })
        .expect("a candy in a box");
    let manifest = p
        .sources
        .get(candy.file)
        .expect("its manifest")
        .path
        .clone();
    let text = std::fs::read_to_string(&manifest).expect("manifest");
    let rel = manifest.strip_prefix(&w.root).expect("in the project");
    write(
        &w.root,
        &rel.to_string_lossy(),
        &format!("{text}\n# edited: the digest of the project changes\n"),
    );
    let (_, scratch) = keyed(&w, &goals, opts(false), false);
    let (g, edited) = keyed(&w, &goals, opts(false), true);
    assert_eq!(g.own_inputs_reused, 0);
    assert!(edited == scratch);
}

#[test]
fn graphs_of_other_goals_add_to_the_file() {
    let w = World::new(&graph_fixture());
    let (_, r) = w.open();
    let all = goals(&r);
    let (generate, build) = (&all[..1], &all[1..2]);
    let (g, _) = keyed(&w, generate, opts(false), true);
    assert_eq!(g.own_inputs_reused, 0);
    // The build graph shares no kept node with build directories: it
    // adds its own.
    let (g, _) = keyed(&w, build, opts(false), true);
    assert_eq!(g.own_inputs_reused, 0);
    let (g, _) = keyed(&w, build, opts(false), true);
    assert_eq!(g.own_inputs_reused, keepable(&g));
    // And the build directories' are still there.
    let (g, _) = keyed(&w, generate, opts(false), true);
    assert_eq!(g.own_inputs_reused, keepable(&g));
}
