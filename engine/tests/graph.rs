//! The build graph with the fake runner: memoization, diamonds, parallelism,
//! failures, determinism, key stability and incremental generation.

use charly_cache::Store;
use charly_engine::api::{Engine, Status};
use charly_engine::graph::{Goal, Graph};
use charly_engine::hash::FileHasher;
use charly_engine::key::NodeKind;
use charly_engine::runners::Runner as _;
use charly_engine::runners::fake::FakeRunner;
use charly_engine::sched::{Quiet, State, Summary};
use charly_rules::load::{self, LoadOptions, Project};
use charly_rules::resolve::{self, Resolution};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use charly_testutil::{copy_project as copy_tree, corpus, graph_fixture as fixture};

struct World {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    store_dir: PathBuf,
}

impl World {
    fn new(src: &Path) -> World {
        let tmp = tempfile::tempdir().expect("tmp");
        let root = tmp.path().join("project");
        copy_tree(src, &root);
        let store_dir = tmp.path().join("store");
        World {
            _tmp: tmp,
            root,
            store_dir,
        }
    }

    fn open(&self) -> (Project, Resolution) {
        let p = load::load(&self.root, &LoadOptions::default()).expect("loads");
        let r = resolve::resolve(&p);
        (p, r)
    }
}

/// Runs a goal; returns the graph, the summary and the runner.
fn run(
    w: &World,
    store: &Store,
    goal: &Goal,
    boxes: &[&str],
    runner: &FakeRunner,
    jobs: usize,
) -> (Graph, Summary) {
    let (p, r) = w.open();
    let hasher = FileHasher::with_cache_file(w.store_dir.join("statcache.bin"));
    let engine = Engine {
        project: &p,
        resolution: &r,
        store,
        runner: Some(runner),
        hasher: &hasher,
        opts: charly_engine::graph::GraphOptions::new(runner.name(), "amd64"),
        remote: None,
        own_inputs: None,
    };
    let names: Vec<String> = boxes.iter().map(|s| s.to_string()).collect();
    let g = engine.graph(goal, &names).expect("graph");
    let s = engine.run(&g, &w.root, jobs, false, &Quiet);
    (g, s)
}

/// The id of the top layer of a box's image (without running anything).
fn top_layer(w: &World, store: &Store, b: &str) -> String {
    let (p, r) = w.open();
    let hasher = FileHasher::with_cache_file(w.store_dir.join("statcache.bin"));
    let f = FakeRunner::new();
    let engine = Engine {
        project: &p,
        resolution: &r,
        store,
        runner: Some(&f),
        hasher: &hasher,
        opts: charly_engine::graph::GraphOptions::new(f.name(), "amd64"),
        remote: None,
        own_inputs: None,
    };
    let g = engine.graph(&Goal::Build, &[b.to_string()]).expect("graph");
    let i = g
        .index(&charly_engine::id::NodeId::image(b))
        .expect("image");
    g.deps(i)
        .into_iter()
        .map(|d| g.g[d].id.clone())
        .find(|id| id.starts_with("layer:"))
        .expect("top layer")
}

fn ran(s: &Summary) -> BTreeSet<String> {
    s.nodes
        .iter()
        .filter(|n| n.state == State::Ran)
        .map(|n| n.id.clone())
        .collect()
}

fn keys(g: &Graph) -> BTreeMap<String, String> {
    g.g.node_weights()
        .map(|n| (n.id.clone(), n.key.to_hex()))
        .collect()
}

#[test]
fn second_build_is_all_cached_and_never_reaches_the_runner() {
    let w = World::new(&fixture());
    let store = Store::open(&w.store_dir).expect("store");
    let f1 = FakeRunner::new();
    let (_, s1) = run(&w, &store, &Goal::Build, &["left", "right"], &f1, 4);
    assert!(s1.ok(), "{s1:#?}");
    assert_eq!(s1.totals.cached, 0);
    let f2 = FakeRunner::new();
    let (_, s2) = run(&w, &store, &Goal::Build, &["left", "right"], &f2, 4);
    assert_eq!(s2.totals.ran, 0, "{:?}", ran(&s2));
    assert_eq!(s2.totals.cached, s2.totals.nodes);
    assert!(
        f2.calls().iter().all(|c| c.what == "restore"),
        "only restores, no builds: {:?}",
        f2.calls()
    );
}

/// A builder stage's key inputs name its builder image by that image's key
/// (another node's key, chained after the own inputs computed in parallel).
#[test]
fn a_builder_stage_names_its_builder_image_by_key() {
    let w = World::new(&fixture());
    let store = Store::open(&w.store_dir).expect("store");
    let (g, s) = run(
        &w,
        &store,
        &Goal::Build,
        &["left", "right"],
        &FakeRunner::new(),
        2,
    );
    assert!(s.ok());
    let mut stages = 0;
    for n in g.g.node_weights() {
        if let charly_engine::id::NodeId::BuilderStage { image_box, .. } = &n.nid {
            let img = g
                .index(&charly_engine::id::NodeId::image(image_box))
                .expect("the builder image is in the graph");
            assert_eq!(
                n.inputs().builder_image.as_deref(),
                Some(g.g[img].key.to_hex().as_str()),
                "{}",
                n.id
            );
            stages += 1;
        }
    }
    assert!(stages >= 2, "the fixture has builder stages");
}

#[test]
fn diamonds_run_once() {
    let w = World::new(&fixture());
    let store = Store::open(&w.store_dir).expect("store");
    let f = FakeRunner::new();
    let (g, s) = run(&w, &store, &Goal::Build, &["left", "right"], &f, 4);
    assert!(s.ok());
    let calls = f.calls();
    let count = |node: &str| calls.iter().filter(|c| c.node == node).count();
    // root is the base of tools, left and right; tools is the builder of
    // both stages. Every layer and stage runs once, whoever needs it.
    for n in g.g.node_weights() {
        if matches!(n.kind, NodeKind::Layer | NodeKind::BuilderStage) {
            assert_eq!(count(&n.id), 1, "{}", n.id);
        }
    }
    assert_eq!(
        count("localhost/charly-test-busybox:1"),
        1,
        "the base is exported once"
    );
    // Dependencies ran first.
    let pos = |node: &str| calls.iter().position(|c| c.node == node).expect("called");
    let top = |b: &str| -> String {
        let i = g
            .index(&charly_engine::id::NodeId::image(b))
            .expect("image");
        g.deps(i)
            .into_iter()
            .map(|d| g.g[d].id.clone())
            .find(|id| id.starts_with("layer:"))
            .expect("top layer")
    };
    assert!(pos("layer:root#setup") < pos(&top("tools")));
    assert!(pos(&top("tools")) < pos("builder-stage:a-npm/npm@tools"));
    assert!(pos("builder-stage:a-npm/npm@tools") < pos(&top("left")));
}

#[test]
fn independent_builder_stages_overlap_in_time() {
    let w = World::new(&fixture());
    let store = Store::open(&w.store_dir).expect("store");
    let mut f = FakeRunner::new();
    for n in [
        "builder-stage:a-npm/npm@tools",
        "builder-stage:b-npm/npm@tools",
    ] {
        f.delay.insert(n.into(), Duration::from_millis(400));
    }
    let (_, s) = run(&w, &store, &Goal::Build, &["left", "right"], &f, 4);
    assert!(s.ok());
    // Measured from the trace, not from sleeps.
    let trace = s.chrome_trace();
    let ev = |name: &str| -> (u64, u64) {
        let e = trace["traceEvents"]
            .as_array()
            .expect("events")
            .iter()
            .find(|e| e["name"] == name)
            .unwrap_or_else(|| panic!("{name} in trace"));
        let ts = e["ts"].as_u64().expect("ts");
        (ts, ts + e["dur"].as_u64().expect("dur"))
    };
    let (a0, a1) = ev("builder-stage:a-npm/npm@tools");
    let (b0, b1) = ev("builder-stage:b-npm/npm@tools");
    assert!(
        a0 < b1 && b0 < a1,
        "stages did not overlap: a {a0}..{a1}, b {b0}..{b1}"
    );
    // With one job they cannot.
    let w2 = World::new(&fixture());
    let store2 = Store::open(&w2.store_dir).expect("store");
    let (_, s1) = run(&w2, &store2, &Goal::Build, &["left", "right"], &f, 1);
    let t = s1.chrome_trace();
    let span = |name: &str| {
        let e = t["traceEvents"]
            .as_array()
            .expect("events")
            .iter()
            .find(|e| e["name"] == name)
            .expect("event");
        (
            e["ts"].as_u64().expect("ts"),
            e["ts"].as_u64().expect("ts") + e["dur"].as_u64().expect("dur"),
        )
    };
    let (a0, a1) = span("builder-stage:a-npm/npm@tools");
    let (b0, b1) = span("builder-stage:b-npm/npm@tools");
    assert!(a1 <= b0 || b1 <= a0, "-j 1 ran them at once");
}

#[test]
fn a_failure_stops_the_schedule_and_names_what_was_not_attempted() {
    let w = World::new(&fixture());
    let store = Store::open(&w.store_dir).expect("store");
    let mut f = FakeRunner::new();
    // The top layer of tools (the builder box), whatever it is named.
    let failing_id = top_layer(&w, &store, "tools");
    let failing = failing_id.as_str();
    f.fail.insert(failing.into());
    let (g, s) = run(&w, &store, &Goal::Build, &["left", "right"], &f, 1);
    assert!(!s.ok());
    assert_eq!(s.totals.failed, 1);
    let failed: Vec<&str> = s
        .nodes
        .iter()
        .filter(|n| n.state == State::Failed)
        .map(|n| n.id.as_str())
        .collect();
    assert_eq!(failed, vec![failing]);
    assert!(
        s.get(failing)
            .and_then(|n| n.error.as_deref())
            .is_some_and(|e| e.contains("injected failure"))
    );
    // Exact: a node is not attempted iff the runner never saw it and it did not run.
    let called: BTreeSet<String> = f.calls().into_iter().map(|c| c.node).collect();
    for n in &s.nodes {
        match n.state {
            State::NotAttempted => assert!(!called.contains(&n.id), "{} was called", n.id),
            State::Ran | State::Failed
                if matches!(
                    n.kind,
                    charly_engine::key::NodeKind::Layer
                        | charly_engine::key::NodeKind::BuilderStage
                ) =>
            {
                assert!(called.contains(&n.id), "{} ran without the runner", n.id)
            }
            _ => {}
        }
    }
    // Everything downstream of the failure is not attempted.
    let tools = g.find(failing).expect("node");
    let mut down = vec![tools];
    let mut seen = BTreeSet::new();
    while let Some(i) = down.pop() {
        for n in g.g.neighbors_directed(i, petgraph::Direction::Outgoing) {
            if seen.insert(g.g[n].id.clone()) {
                down.push(n);
            }
        }
    }
    for id in &seen {
        assert_eq!(
            s.get(id).map(|n| n.state),
            Some(State::NotAttempted),
            "{id}"
        );
    }
    assert!(seen.contains("image:left") && seen.contains("image:right"));
    // Nothing was recorded for the failed node; a retry builds it.
    let f2 = FakeRunner::new();
    let (_, s2) = run(&w, &store, &Goal::Build, &["left", "right"], &f2, 1);
    assert!(s2.ok());
    assert!(ran(&s2).contains(failing) && ran(&s2).contains("image:tools"));
}

#[test]
fn jobs_do_not_change_records() {
    let summarize = |jobs: usize| {
        let w = World::new(&fixture());
        let store = Store::open(&w.store_dir).expect("store");
        let (g, s) = run(
            &w,
            &store,
            &Goal::Build,
            &["left", "right"],
            &FakeRunner::new(),
            jobs,
        );
        assert!(s.ok());
        let mut out = BTreeMap::new();
        for (id, i) in &g.by_id {
            let rec = store
                .get_record(&g.g[*i].key)
                .expect("get")
                .expect("recorded");
            let outputs: Vec<(String, String)> = rec
                .outputs
                .iter()
                .map(|(k, o)| (k.clone(), o.digest.to_hex()))
                .collect();
            out.insert(
                id.clone(),
                (
                    g.g[*i].key.to_hex(),
                    outputs,
                    rec.key_inputs.clone(),
                    rec.meta.clone(),
                ),
            );
        }
        out
    };
    assert_eq!(summarize(1), summarize(4));
}

#[test]
fn keys_ignore_location_and_mtimes_and_follow_every_input() {
    let w = World::new(&fixture());
    let store = Store::open(&w.store_dir).expect("store");
    let (g1, _) = run(
        &w,
        &store,
        &Goal::Build,
        &["left", "right"],
        &FakeRunner::new(),
        2,
    );
    let base = keys(&g1);
    // Another absolute path, fresh stat cache: same keys.
    let w2 = World::new(&fixture());
    let store2 = Store::open(&w2.store_dir).expect("store");
    let (g2, _) = run(
        &w2,
        &store2,
        &Goal::Build,
        &["left", "right"],
        &FakeRunner::new(),
        2,
    );
    assert_eq!(keys(&g2), base, "moving the project changes no key");
    // Touching mtimes changes nothing either.
    for e in walkdir::WalkDir::new(&w.root).into_iter().flatten() {
        if e.file_type().is_file() {
            let f = std::fs::OpenOptions::new()
                .append(true)
                .open(e.path())
                .expect("open");
            f.set_modified(std::time::SystemTime::now() + Duration::from_secs(3600))
                .expect("mtime");
        }
    }
    let (g3, s3) = run(
        &w,
        &store,
        &Goal::Build,
        &["left", "right"],
        &FakeRunner::new(),
        2,
    );
    assert_eq!(keys(&g3), base);
    assert_eq!(s3.totals.ran, 0);

    // Changing one input changes exactly the keys downstream of it.
    let downstream = |g: &Graph, id: &str| -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        let mut stack = vec![g.find(id).expect("node")];
        while let Some(i) = stack.pop() {
            if out.insert(g.g[i].id.clone()) {
                stack.extend(g.g.neighbors_directed(i, petgraph::Direction::Outgoing));
            }
        }
        out
    };
    let changed = |g: &Graph| -> BTreeSet<String> {
        keys(g)
            .into_iter()
            .filter(|(id, k)| base.get(id) != Some(k))
            .map(|(id, _)| id)
            .collect()
    };
    // A file byte in a candy.
    std::fs::write(
        w.root.join("candy/a-npm/package.json"),
        "{\"name\": \"a-npm\", \"dependencies\": {\"left-pad\": \"1.3.1\"}}",
    )
    .expect("edit");
    let (g, _) = run(
        &w,
        &store,
        &Goal::Build,
        &["left", "right"],
        &FakeRunner::new(),
        2,
    );
    assert_eq!(changed(&g), downstream(&g, "source:candy/a-npm"));
    assert!(changed(&g).contains("image:left") && !changed(&g).contains("image:right"));
    copy_tree(&fixture(), &w.root);
    // A var / env entry of a candy (rendered into fragments).
    let common = w.root.join("candy/common2/charly.yml");
    let text = std::fs::read_to_string(&common).expect("read");
    std::fs::write(&common, text.replace("COMMON2: \"yes\"", "COMMON2: \"no\"")).expect("edit");
    let (g, _) = run(
        &w,
        &store,
        &Goal::Build,
        &["left", "right"],
        &FakeRunner::new(),
        2,
    );
    assert_eq!(changed(&g), downstream(&g, "source:candy/common2"));
    copy_tree(&fixture(), &w.root);
    // The base image reference.
    let root_box = w.root.join("box/root/charly.yml");
    let text = std::fs::read_to_string(&root_box).expect("read");
    std::fs::write(
        &root_box,
        text.replace("charly-test-busybox:1", "charly-test-busybox:2"),
    )
    .expect("edit");
    let (g, _) = run(
        &w,
        &store,
        &Goal::Build,
        &["left", "right"],
        &FakeRunner::new(),
        2,
    );
    let c = changed(&g);
    assert!(c.contains("image:root") && c.contains("layer:root#setup"));
    let mut expected = downstream(&g, "source:box/root");
    expected.extend(downstream(&g, "base:localhost/charly-test-busybox:2"));
    assert_eq!(c, expected);
    copy_tree(&fixture(), &w.root);
    // A template line of the vocabulary (the format's install template):
    // no candy of the fixture installs packages, so no layer renders it
    // and no key changes (keys follow the rendered text, not the whole
    // vocabulary).
    let proj = w.root.join("charly.yml");
    let text = std::fs::read_to_string(&proj).expect("read");
    std::fs::write(
        &proj,
        text.replace("RUN echo \"packages:", "RUN echo \"pkgs:"),
    )
    .expect("edit");
    let (g, _) = run(
        &w,
        &store,
        &Goal::Build,
        &["left", "right"],
        &FakeRunner::new(),
        2,
    );
    assert_eq!(changed(&g), BTreeSet::new());
    // The base user's home is rendered into every setup layer (WORKDIR):
    // the root's setup and everything above it change, sources do not.
    std::fs::write(&proj, text.replace("home: /home/user", "home: /home/u2")).expect("edit");
    let (g, _) = run(
        &w,
        &store,
        &Goal::Build,
        &["left", "right"],
        &FakeRunner::new(),
        2,
    );
    let c = changed(&g);
    assert!(
        c.contains("layer:root#setup") && c.contains("image:left"),
        "{c:?}"
    );
    assert!(
        c.iter().all(|id| !id.starts_with("source:")),
        "sources do not depend on the vocabulary"
    );
}

#[test]
fn generate_on_the_corpus_is_incremental_and_explainable() {
    let w = World::new(&corpus());
    let store = Store::open(&w.store_dir).expect("store");
    let (p, r) = w.open();
    // Every resolvable box, disabled ones included (immich is disabled).
    let all = r.resolved_names();
    drop((p, r));
    let names: Vec<&str> = all.iter().map(String::as_str).collect();
    let (g1, s1) = run(&w, &store, &Goal::Generate, &names, &FakeRunner::new(), 2);
    assert!(s1.ok());
    let (_, s2) = run(&w, &store, &Goal::Generate, &names, &FakeRunner::new(), 2);
    assert_eq!(
        s2.totals.cached, s2.totals.nodes,
        "second run is all cached"
    );
    // Edit rpmfusion (installed by fedora-nonfree, the base of fedora-builder and immich).
    let f = w.root.join("candy/rpmfusion/charly.yml");
    let mut text = std::fs::read_to_string(&f).expect("read");
    text.push_str("# a comment\n");
    std::fs::write(&f, text).expect("edit");
    let (p, r) = w.open();
    let hasher = FileHasher::in_memory();
    let fake = FakeRunner::new();
    let engine = Engine {
        project: &p,
        resolution: &r,
        store: &store,
        runner: Some(&fake),
        hasher: &hasher,
        opts: charly_engine::graph::GraphOptions::new(fake.name(), "amd64"),
        remote: None,
        own_inputs: None,
    };
    let g = engine.graph(&Goal::Generate, &all).expect("graph");
    let e = engine
        .explain(&g, "containerfile:fedora-builder")
        .expect("explain");
    assert_eq!(e.status, Status::WouldRebuild);
    let text = e.lines().join("\n");
    assert!(
        text.contains("file candy/rpmfusion/charly.yml changed"),
        "{text}"
    );
    let s3 = engine.run(&g, &w.root, 2, false, &Quiet);
    let expected: BTreeSet<String> = [
        "source:candy/rpmfusion",
        "fragment:fedora-nonfree/rpmfusion",
        "containerfile:fedora-nonfree",
        "containerfile:fedora-builder",
        "containerfile:immich",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(ran(&s3), expected);
    assert_eq!(g1.by_id.len(), g.by_id.len());
    let e = engine
        .explain(&g, "containerfile:fedora-builder")
        .expect("explain");
    assert_eq!(e.status, Status::Cached);
}

#[test]
fn checks_are_not_build_inputs() {
    let w = World::new(&fixture());
    let store = Store::open(&w.store_dir).expect("store");
    let all = ["left", "right"];
    let (g0, _) = run(&w, &store, &Goal::Build, &all, &FakeRunner::new(), 2);
    let base = keys(&g0);
    let common = w.root.join("candy/common2/charly.yml");
    let text = std::fs::read_to_string(&common).expect("read");
    // Adding an eval section (with a comment) changes no key.
    std::fs::write(
        &common,
        format!(
            "{text}    eval:\n        # a check\n        - id: x\n          file: /etc/x\n          exists: true\n"
        ),
    )
    .expect("edit");
    let (g1, s1) = run(&w, &store, &Goal::Build, &all, &FakeRunner::new(), 2);
    assert_eq!(keys(&g1), base, "adding a check rebuilds nothing");
    assert_eq!(s1.totals.ran, 0);
    // Editing it changes nothing either; a real edit next to it does.
    std::fs::write(
        &common,
        format!("{text}    eval:\n        - id: y\n          command: \"true\"\n"),
    )
    .expect("edit");
    let (g2, _) = run(&w, &store, &Goal::Build, &all, &FakeRunner::new(), 2);
    assert_eq!(keys(&g2), base, "editing a check rebuilds nothing");
    std::fs::write(
        &common,
        format!(
            "{}    eval:\n        - id: y\n          command: \"true\"\n",
            text.replace("COMMON2: \"yes\"", "COMMON2: \"no\"")
        ),
    )
    .expect("edit");
    let (g3, _) = run(&w, &store, &Goal::Build, &all, &FakeRunner::new(), 2);
    assert_ne!(
        keys(&g3)["source:candy/common2"],
        base["source:candy/common2"],
        "the rest of the file is still an input"
    );
}

/// Explains `id` against the project as it is now on disk.
fn explain_now(w: &World, store: &Store, id: &str) -> charly_engine::api::Explanation {
    let (p, r) = w.open();
    let hasher = FileHasher::in_memory();
    let fake = FakeRunner::new();
    let engine = Engine {
        project: &p,
        resolution: &r,
        store,
        runner: None,
        hasher: &hasher,
        opts: charly_engine::graph::GraphOptions::new(fake.name(), "amd64"),
        remote: None,
        own_inputs: None,
    };
    let g = engine
        .graph(&Goal::Generate, &["left".to_string()])
        .expect("graph");
    engine.explain(&g, id).expect("explain")
}

/// A fresh copy of the fixture with box `left` generated.
fn generated() -> (World, Store) {
    let w = World::new(&fixture());
    let store = Store::open(&w.store_dir).expect("store");
    let (_, s) = run(
        &w,
        &store,
        &Goal::Generate,
        &["left"],
        &FakeRunner::new(),
        2,
    );
    assert!(s.ok());
    (w, store)
}

/// A keyed graph holds no fragment's steps (at 10,000 candies they were
/// the largest thing a run kept), and a fragment that runs then compiles
/// its candy again: what it stores is what the held steps render.
#[test]
fn a_keyed_graph_releases_fragment_steps_and_runs_render_them_again() {
    let w = World::new(&fixture());
    let store = Store::open(&w.store_dir).expect("store");
    let (g, s) = run(
        &w,
        &store,
        &Goal::Generate,
        &["left"],
        &FakeRunner::new(),
        2,
    );
    assert!(s.ok(), "{s:#?}");
    let (p, r) = w.open();
    let mut fragments = 0;
    for i in g.g.node_indices() {
        let n = &g.g[i];
        let (
            charly_engine::id::NodeId::Fragment { box_name, candy },
            charly_engine::graph::Work::Fragment { index, steps },
        ) = (&n.nid, &n.work)
        else {
            continue;
        };
        let b = r.get(box_name).expect("resolves");
        assert!(!steps.is_held(), "{} still holds its steps", n.id);
        // Rendered from a fresh compile of the candy, as the graph's
        // builder compiles it.
        let cx = charly_rules::plan::CompileContext::of(b, candy);
        let mut steps =
            charly_rules::plan::compile_candy_steps(&p, &cx, candy, &Default::default())
                .expect("compiles");
        for s in &mut steps {
            s.resolve_home(&cx.user.home);
        }
        fragments += usize::from(!steps.is_empty());
        let want = charly_rules::emit::containerfile::render_candy_fragment(
            &p,
            b,
            candy,
            &steps,
            charly_rules::emit::containerfile::fragment_is_last(&p, b, *index),
            &charly_engine::graph::layers::base_emit_options(&r, &Default::default()),
        )
        .expect("renders")
        .text;
        let rec = store.get_record(&n.key).expect("store").expect("record");
        let got = store
            .get_blob(&rec.outputs[charly_engine::outputs::TEXT].digest)
            .expect("store")
            .expect("blob");
        assert_eq!(String::from_utf8_lossy(&got), want, "{}", n.id);
    }
    assert!(fragments > 1, "fragments with steps: {fragments}");
}

/// Generates box `left`, then bumps its version (a box fact).
fn generated_then_version_bumped() -> (World, Store) {
    let (w, store) = generated();
    let f = w.root.join("box/left/charly.yml");
    let text = std::fs::read_to_string(&f).expect("read");
    std::fs::write(&f, text.replace("version: 1.0.0", "version: 1.0.1")).expect("edit");
    (w, store)
}

#[test]
fn explain_names_the_box_fact_that_changed() {
    let (w, store) = generated_then_version_bumped();
    let e = explain_now(&w, &store, "containerfile:left");
    assert_eq!(e.status, Status::WouldRebuild);
    let text = e.lines().join("\n");
    assert!(
        text.contains(r#"fact:version changed: "1.0.0" -> "1.0.1""#),
        "{text}"
    );
    // Only the facts that changed are named.
    assert!(!text.contains("fact:candies"), "{text}");
}

#[test]
fn a_record_of_an_older_key_schema_is_explained_as_such() {
    let (w, store) = generated_then_version_bumped();
    // The newest record of the node carries inputs in a shape this charly
    // does not read (as a record of an older key schema would).
    let old = charly_cache::Record {
        node_id: "containerfile:left".into(),
        kind: "containerfile".into(),
        outputs: BTreeMap::new(),
        duration_ms: 1,
        producer: "charly".into(),
        key_inputs: serde_json::json!({"schema": 0, "facts": "abc"}),
        created_unix: u64::MAX / 4,
        meta: serde_json::Value::Null,
    };
    let key = charly_cache::NodeKey::from_bytes([7; 32]);
    store.put_record(&key, &old).expect("put");
    let e = explain_now(&w, &store, "containerfile:left");
    assert_eq!(e.status, Status::WouldRebuild);
    let text = e.lines().join("\n");
    assert!(text.contains("recorded by an older key schema"), "{text}");
    assert!(!text.contains("added"), "not everything added: {text}");
}

/// A fragment whose candy gained a package says which line of its text
/// changed, against the text its last build stored.
#[test]
fn explain_shows_the_lines_of_a_fragment_that_changed() {
    let (w, store) = generated();
    let f = w.root.join("candy/common2/charly.yml");
    let text = std::fs::read_to_string(&f).expect("read");
    std::fs::write(
        &f,
        text.replace(
            "content: \"common2\\n\"",
            "content: \"common2\\n\"\n        - mkdir: /opt/explained",
        ),
    )
    .expect("edit");
    let e = explain_now(&w, &store, "fragment:left/common2");
    assert_eq!(e.status, Status::WouldRebuild);
    let text = e.lines().join("\n");
    assert!(text.contains("fragment text changed: "), "{text}");
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with("+ ") && l.contains("/opt/explained")),
        "{text}"
    );
}

/// Box `left` with a candy whose task a plugin serves.
fn with_plugin_task() -> World {
    let w = World::new(&fixture());
    let write = |rel: &str, body: &str| {
        let p = w.root.join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, body).expect("write");
    };
    write(
        "candy/stepper/charly.yml",
        "candy:\n  name: stepper\n  plugin:\n    providers: [step:bake]\n    source: builtin\n",
    );
    write(
        "candy/baked/charly.yml",
        "candy:\n  name: baked\n  task:\n    - plugin: bake\n      plugin_input: {marker: M}\n",
    );
    let f = w.root.join("box/left/charly.yml");
    let text = std::fs::read_to_string(&f).expect("read");
    std::fs::write(
        &f,
        text.replace("[a-npm, common2]", "[a-npm, common2, baked]"),
    )
    .expect("edit");
    w
}

fn generate_with(
    w: &World,
    store: &Store,
    plugins: charly_engine::graph::PluginBuild,
) -> (Graph, Summary) {
    let (p, r) = w.open();
    let hasher = FileHasher::in_memory();
    let fake = FakeRunner::new();
    let engine = Engine {
        project: &p,
        resolution: &r,
        store,
        runner: Some(&fake),
        hasher: &hasher,
        opts: charly_engine::graph::GraphOptions {
            plugins,
            dev_local_pkg: false,
            runner: fake.name().to_string(),
            arch: "amd64".into(),
        },
        remote: None,
        own_inputs: None,
    };
    let g = engine
        .graph(&Goal::Generate, &["left".to_string()])
        .expect("graph");
    let s = engine.run(&g, &w.root, 2, false, &Quiet);
    if s.ok() {
        engine.write_build_dirs(&g, &w.root, false).expect("write");
    }
    (g, s)
}

#[test]
fn plugin_fragments_are_spliced_and_their_plugin_is_part_of_the_key() {
    let w = with_plugin_task();
    let store = Store::open(&w.store_dir).expect("store");

    // Without the plugin's answer the candy's fragment fails, saying so.
    let (_, s) = generate_with(&w, &store, Default::default());
    assert!(!s.ok());
    let failed: Vec<String> = s.nodes.iter().filter_map(|n| n.error.clone()).collect();
    assert!(
        failed
            .iter()
            .any(|e| e.contains("candy `baked` task #1 (plugin `bake`)")
                && e.contains("no build fragment")),
        "{failed:?}"
    );

    let mut pb = charly_engine::graph::PluginBuild::default();
    pb.fragments
        .insert(("baked".into(), 0), "RUN echo M > /etc/baked\n".into());
    pb.ids.insert("bake".into(), "exe:aaa describe:bbb".into());
    let (g1, s) = generate_with(&w, &store, pb.clone());
    assert!(
        s.ok(),
        "{:?}",
        s.nodes
            .iter()
            .filter_map(|n| n.error.clone())
            .collect::<Vec<_>>()
    );
    let cf = std::fs::read_to_string(w.root.join(".build/left/Containerfile")).expect("cf");
    assert!(cf.contains("RUN echo M > /etc/baked"), "{cf}");

    // Nothing changed: nothing runs. A new plugin build: the candy's
    // fragment (and what contains it) runs again, nothing else.
    let (_, s) = generate_with(&w, &store, pb.clone());
    assert!(ran(&s).is_empty(), "{:?}", ran(&s));
    pb.ids.insert("bake".into(), "exe:ccc describe:bbb".into());
    let (g2, s) = generate_with(&w, &store, pb.clone());
    let k1 = keys(&g1);
    let k2 = keys(&g2);
    let changed: BTreeSet<&String> = k1.keys().filter(|id| k1[*id] != k2[*id]).collect();
    assert!(
        changed.contains(&"fragment:left/baked".to_string()),
        "{changed:?}"
    );
    assert!(
        !changed
            .iter()
            .any(|id| id.contains("common2") || id.contains("a-npm")),
        "{changed:?}"
    );
    assert!(ran(&s).contains("fragment:left/baked"), "{:?}", ran(&s));
}

/// Issue 43, finding 10: a local package is built in the base image of the
/// box that installs it, so two boxes on different bases that share a
/// local-package candy get two packages: two nodes, named after the image
/// each is built in, with two keys, each feeding its own box's layer.
#[test]
fn a_local_package_is_built_for_each_base_it_goes_into() {
    let w = World::new(&charly_testutil::example());
    std::fs::create_dir_all(w.root.join("box/other-base")).expect("dir");
    std::fs::write(
        w.root.join("box/other-base/charly.yml"),
        "box:\n    name: other-base\n    version: 2026.12.2\n    from: builder:debootstrap\n",
    )
    .expect("other base");
    std::fs::create_dir_all(w.root.join("box/other")).expect("dir");
    std::fs::write(
        w.root.join("box/other/charly.yml"),
        "box:\n    name: other\n    version: 2026.12.1\n    base: other-base\n    candy:\n        - hello-deb\n",
    )
    .expect("other");
    let store = Store::open(&w.store_dir).expect("store");
    let (p, r) = w.open();
    let hasher = FileHasher::with_cache_file(w.store_dir.join("statcache.bin"));
    let f = FakeRunner::new();
    let engine = Engine {
        project: &p,
        resolution: &r,
        store: &store,
        runner: Some(&f),
        hasher: &hasher,
        opts: charly_engine::graph::GraphOptions {
            plugins: Default::default(),
            dev_local_pkg: true,
            runner: f.name().to_string(),
            arch: "amd64".into(),
        },
        remote: None,
        own_inputs: None,
    };
    let g = engine
        .graph(&Goal::Build, &["hello".to_string(), "other".to_string()])
        .expect("graph");
    let k = keys(&g);
    let pkgs: BTreeMap<&String, &String> = k
        .iter()
        .filter(|(id, _)| id.starts_with("local-pkg:"))
        .collect();
    let ids: Vec<&str> = pkgs.keys().map(|s| s.as_str()).collect();
    assert_eq!(
        ids,
        [
            "local-pkg:hello-deb/deb@base",
            "local-pkg:hello-deb/deb@other-base"
        ]
    );
    let mut distinct: Vec<&String> = pkgs.values().copied().collect();
    distinct.dedup();
    assert_eq!(distinct.len(), 2, "two keys: {pkgs:?}");
    for (layer, pkg) in [
        ("layer:hello/hello-deb", "local-pkg:hello-deb/deb@base"),
        (
            "layer:other/hello-deb",
            "local-pkg:hello-deb/deb@other-base",
        ),
    ] {
        let i = g.find(layer).expect("layer");
        let deps: Vec<&str> = g.deps(i).into_iter().map(|d| g.g[d].id.as_str()).collect();
        assert!(deps.contains(&pkg), "{layer} uses {pkg}: {deps:?}");
    }
}

/// A node is found by its id (a merged layer's too), or by a name it is
/// made of that no other node has; a name several nodes have lists them,
/// and a piece of a name finds nothing (no substring matching).
#[test]
fn nodes_are_found_by_id_or_by_a_name_only_they_have() {
    let w = World::new(&fixture());
    let store = Store::open(&w.store_dir).expect("store");
    let (p, r) = w.open();
    let hasher = FileHasher::in_memory();
    let engine = Engine {
        project: &p,
        resolution: &r,
        store: &store,
        runner: None,
        hasher: &hasher,
        opts: charly_engine::graph::GraphOptions::new("fake", "amd64"),
        remote: None,
        own_inputs: None,
    };
    let g = engine
        .graph(&Goal::Build, &["left".to_string(), "right".to_string()])
        .expect("graph");
    let find = |q: &str| charly_engine::api::find_node(&g, q);
    assert_eq!(find("image:left").expect("exact"), "image:left");
    for (alias, i) in &g.aliases {
        assert_eq!(find(&alias.to_string()).expect("alias"), g.g[*i].id);
    }
    let mut holders: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for n in g.g.node_weights() {
        for part in n.nid.parts() {
            holders.entry(part).or_default().push(&n.id);
        }
    }
    let (mut unique, mut shared) = (0, 0);
    for (part, ids) in &holders {
        match ids.as_slice() {
            [one] => {
                unique += 1;
                assert_eq!(find(part).expect(part), *one);
            }
            _ => {
                shared += 1;
                let e = find(part).expect_err(part).to_string();
                assert!(ids.iter().take(3).all(|id| e.contains(id)), "{e}");
            }
        }
    }
    assert!(unique > 0 && shared > 0, "{holders:?}");
    assert!(find("lef").is_err(), "a piece of a name matched");
    assert!(find("image:lef").is_err());
}
