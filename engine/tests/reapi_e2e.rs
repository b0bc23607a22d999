//! End to end: the command nodes (local-package builds) of a project run on
//! a real REAPI engine (buildbox-casd + buildbox-run, bubblewrap sandbox) on
//! 127.0.0.1 through the engine's scheduler and store. Their outputs are
//! byte-for-byte those of a local podman run; a repeat with a fresh store
//! gets every node from the engine's ActionCache without executing; a
//! failure remotely names node and action and stores nothing.
//!
//! Image nodes use the fake runner (this test is about command nodes; image
//! builds stay local under `--remote-exec`).

use charly_testutil::casd as common_reapi;

use charly_engine::api::Engine;
use charly_engine::graph::Goal;
use charly_engine::hash::FileHasher;
use charly_engine::runners::fake::FakeRunner;
use charly_engine::runners::podman::PodmanRunner;
use charly_engine::runners::remote::{Place, RemoteOptions, RemoteRunner};
use charly_engine::runners::{
    ExportedImage, ImageConfig, LayerRequest, LayerResult, LocalPkgRequest, RootfsRequest,
    RunError, Runner, StageRequest,
};
use charly_engine::sched::{Quiet, State, Summary};
use charly_rules::load::{self, LoadOptions};
use charly_rules::resolve;
use std::collections::BTreeMap;
use std::path::Path;

const BASE: &str = "localhost/charly-reapi-base:1";

/// A project: one box over an external base with `n` candies, each a local
/// .deb-format package built by a shell script (busybox and dash alike).
fn project(root: &Path, n: usize, sleep: &str, fail: Option<usize>) {
    charly_testutil::write(
        root,
        "charly.yml",
        &format!(
            r#"version: 2026.160.1301
discover: [box, candy]
defaults:
    distro: [tiny]
    build: [deb]
distro:
    tiny:
        base_user:
            name: user
            uid: 1000
            gid: 1000
            home: /home/user
        format:
            deb:
                install_template: |
                    RUN true{{{{range .Packages}}}} {{{{.}}}}{{{{end}}}}
                local_pkg:
                    pkg_glob: "*.deb"
                    build_template: |
                        set -e
                        sleep {sleep}
                        test ! -e {{{{.SrcDir}}}}/FAIL || {{ echo "package refuses to build" >&2; exit 7; }}
                        name=$(cat {{{{.SrcDir}}}}/NAME)
                        for f in $(cd {{{{.SrcDir}}}} && ls); do [ -f "{{{{.SrcDir}}}}/$f" ] || continue; echo "== $f"; cat "{{{{.SrcDir}}}}/$f"; done > {{{{.PkgDest}}}}/$name.deb
                        echo "built $name" | tr a-z A-Z >> {{{{.PkgDest}}}}/$name.deb
                        stat -c '%a %n' {{{{.SrcDir}}}} {{{{.SrcDir}}}}/* {{{{.SrcDir}}}}/sub/* >> {{{{.PkgDest}}}}/$name.deb
                    install_template: |
                        true {{{{.StageDir}}}}/{{{{.Glob}}}}
"#
        ),
    );
    let names: Vec<String> = (0..n).map(|i| format!("pkg{i}")).collect();
    charly_testutil::write(
        root,
        "box/fan/charly.yml",
        &format!(
            "box:\n    name: fan\n    version: 1.0.0\n    base: {BASE}\n    candy:\n{}",
            names
                .iter()
                .map(|c| format!("        - {c}\n"))
                .collect::<String>()
        ),
    );
    for (i, c) in names.iter().enumerate() {
        charly_testutil::write(
            root,
            &format!("candy/{c}/charly.yml"),
            &format!(
                "candy:\n    version: 1.0.{i}\n    name: {c}\n    localpkg:\n        deb: src\n"
            ),
        );
        charly_testutil::write(root, &format!("candy/{c}/src/NAME"), c);
        charly_testutil::write(
            root,
            &format!("candy/{c}/src/data.txt"),
            &format!("payload of {c}\n{}\n", "z".repeat(i * 100)),
        );
        // A directory and an executable: their modes are part of a
        // package (the script records them).
        charly_testutil::write(root, &format!("candy/{c}/src/sub/run.sh"), "#!/bin/sh\n");
        let run = root.join(format!("candy/{c}/src/sub/run.sh"));
        std::fs::set_permissions(&run, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
        if fail == Some(i) {
            charly_testutil::write(root, &format!("candy/{c}/src/FAIL"), "");
        }
    }
}

/// Local packages with podman, everything else fake: the local reference.
struct LocalPkgsWithPodman {
    fake: FakeRunner,
    podman: PodmanRunner,
}

impl LocalPkgsWithPodman {
    /// Podman in a busybox image, its storage under `dir`.
    fn new(dir: &Path) -> Self {
        LocalPkgsWithPodman {
            fake: FakeRunner::new(),
            podman: podman_runner(dir),
        }
    }
}

impl Runner for LocalPkgsWithPodman {
    fn name(&self) -> &str {
        self.fake.name()
    }
    fn build_stage(&self, r: &StageRequest) -> Result<(), RunError> {
        self.fake.build_stage(r)
    }
    fn build_layer(&self, r: &LayerRequest) -> Result<LayerResult, RunError> {
        self.fake.build_layer(r)
    }
    fn export_layers(&self, r: &str, out: &Path) -> Result<ExportedImage, RunError> {
        self.fake.export_layers(r, out)
    }
    fn load_layout(&self, d: &Path, r: &str, t: &[String]) -> Result<String, RunError> {
        self.fake.load_layout(d, r, t)
    }

    fn rename_image(&self, from: &str, to: &str) -> Result<(), RunError> {
        self.fake.rename_image(from, to)
    }
    fn has_image(&self, r: &str) -> bool {
        self.fake.has_image(r)
    }
    fn build_local_pkg(&self, r: &LocalPkgRequest) -> Result<(), RunError> {
        self.podman.build_local_pkg(r)
    }
    fn build_rootfs(&self, r: &RootfsRequest) -> Result<(), RunError> {
        self.fake.build_rootfs(r)
    }
    fn export_image(&self, image: &str, rootfs: Option<&Path>) -> Result<ImageConfig, RunError> {
        self.podman.export_image(image, rootfs)
    }
}

fn run(
    root: &Path,
    store_dir: &Path,
    runner: &dyn Runner,
    jobs: usize,
) -> (Summary, BTreeMap<String, Vec<u8>>) {
    let p = load::load(root, &LoadOptions::default()).expect("loads");
    let r = resolve::resolve(&p);
    let store = charly_engine::cache::Store::open(store_dir).expect("store");
    let hasher = FileHasher::in_memory();
    let engine = Engine {
        project: &p,
        resolution: &r,
        store: &store,
        runner: Some(runner),
        hasher: &hasher,
        opts: charly_engine::graph::GraphOptions {
            plugins: Default::default(),
            dev_local_pkg: true,
            runner: runner.name().to_string(),
            arch: "amd64".into(),
        },
        remote: None,
        own_inputs: None,
    };
    let graph = engine
        .graph(&Goal::Build, &["fan".to_string()])
        .expect("graph");
    let summary = engine.run(&graph, root, jobs, false, &Quiet);
    // Every package output in the store, by node and name.
    let mut pkgs = BTreeMap::new();
    for n in &summary.nodes {
        if n.kind != charly_engine::key::NodeKind::LocalPkg || n.state == State::Failed {
            continue;
        }
        let node = graph.node(&n.id).expect("node");
        if let Some(rec) = store.get_record(&node.key).expect("record") {
            for (name, o) in &rec.outputs {
                let b = store.get_blob(&o.digest).expect("blob").expect("present");
                pkgs.insert(format!("{} {name}", n.id), b.into_vec());
            }
        }
    }
    (summary, pkgs)
}

/// Every node succeeded; else their errors.
fn assert_ok(s: &Summary) {
    assert!(
        s.ok(),
        "{:?}",
        s.nodes
            .iter()
            .filter_map(|n| n.error.clone())
            .collect::<Vec<_>>()
    );
}

fn local_pkg_nodes(s: &Summary) -> Vec<String> {
    s.nodes
        .iter()
        .filter(|n| n.kind == charly_engine::key::NodeKind::LocalPkg)
        .map(|n| n.id.clone())
        .collect()
}

fn podman_runner(dir: &Path) -> PodmanRunner {
    common_reapi::podman_with_image(dir, BASE, &[])
}

fn remote_opts(jobs: usize) -> RemoteOptions {
    RemoteOptions {
        jobs,
        // buildbox-run only sandboxes commands and refuses unknown properties.
        image_property: false,
        ..RemoteOptions::default()
    }
}

#[test]
fn command_nodes_run_remotely_match_local_and_hit_the_action_cache() {
    if !common_reapi::available() || !charly_testutil::podman_available() {
        return;
    }
    let t = tempfile::tempdir().expect("tmp");
    let root = t.path().join("project");
    project(&root, 4, "0", None);

    // Local reference: podman in a busybox image.
    let local = LocalPkgsWithPodman::new(t.path());
    let (ls, local_pkgs) = run(&root, &t.path().join("store-local"), &local, 4);
    assert_ok(&ls);
    assert_eq!(local_pkg_nodes(&ls).len(), 4);
    assert_eq!(local_pkgs.len(), 4);

    // Remote: the same graph with local packages on buildbox.
    let casd = common_reapi::start(4);
    let fake = FakeRunner::new();
    let remote = RemoteRunner::connect(&casd.url, &fake, remote_opts(4)).expect("connects");
    let (rs, remote_pkgs) = run(&root, &t.path().join("store-remote"), &remote, 4);
    assert_ok(&rs);
    assert_eq!(
        remote_pkgs, local_pkgs,
        "remote outputs are byte-for-byte the local ones"
    );
    let stats = remote.stats();
    for id in local_pkg_nodes(&rs) {
        let r = stats
            .get(&id)
            .unwrap_or_else(|| panic!("{id} has a remote record"));
        assert_eq!(r.place, Place::Remote, "{id}: {r:?}");
        assert!(!r.action_digest.is_empty());
    }
    // The fake never saw a local-package build.
    assert!(
        fake.calls().iter().all(|c| c.what != "local-pkg"),
        "{:?}",
        fake.calls()
    );

    // Same store again: the local store answers, the engine is not asked.
    let again = RemoteRunner::connect(&casd.url, &fake, remote_opts(4)).expect("connects");
    let (s2, _) = run(&root, &t.path().join("store-remote"), &again, 4);
    assert!(s2.ok());
    assert!(
        local_pkg_nodes(&s2)
            .iter()
            .all(|id| s2.get(id).map(|n| n.state) == Some(State::Cached))
    );
    assert!(again.stats().is_empty(), "{:?}", again.stats());

    // A second store against the same engine: every node from its ActionCache.
    let second = RemoteRunner::connect(&casd.url, &fake, remote_opts(4)).expect("connects");
    let (s3, pkgs3) = run(&root, &t.path().join("store-second"), &second, 4);
    assert!(s3.ok());
    assert_eq!(pkgs3, local_pkgs);
    let stats = second.stats();
    for id in local_pkg_nodes(&s3) {
        assert_eq!(
            stats.get(&id).map(|r| r.place.clone()),
            Some(Place::RemoteCached),
            "{id}"
        );
    }
}

/// An engine that only sandboxes commands and lends them no tools (no
/// host directory bind-mounted: the action sees its input root alone) runs
/// a local package with `--remote-stage-rootfs` in its build image's files,
/// sent as the input root; the packages are byte for byte podman's.
/// Without the flag the same engine cannot even start `sh` (issue 46).
#[test]
fn local_packages_run_in_their_images_files_on_an_engine_without_tools() {
    if !common_reapi::available() || !charly_testutil::podman_available() {
        return;
    }
    let t = tempfile::tempdir().expect("tmp");
    let root = t.path().join("project");
    project(&root, 2, "0", None);
    let local = LocalPkgsWithPodman::new(t.path());
    let (ls, local_pkgs) = run(&root, &t.path().join("store-local"), &local, 2);
    assert_ok(&ls);
    assert_eq!(local_pkgs.len(), 2);

    let casd = common_reapi::start_with(2, &[]);
    // Without the image's files: nothing to run the script with.
    let bare = RemoteRunner::connect(&casd.url, &local, remote_opts(2)).expect("connects");
    let (s, _) = run(&root, &t.path().join("store-bare"), &bare, 2);
    let errors: Vec<String> = s.nodes.iter().filter_map(|n| n.error.clone()).collect();
    assert_eq!(errors.len(), 2, "{:?}", s.nodes);
    assert!(
        errors.iter().all(|e| e.contains("remote execution of")),
        "{errors:?}"
    );

    let opts = RemoteOptions {
        stage_rootfs: true,
        image_property: true,
        ..remote_opts(2)
    };
    let remote = RemoteRunner::connect(&casd.url, &local, opts).expect("connects");
    let (rs, remote_pkgs) = run(&root, &t.path().join("store-remote"), &remote, 2);
    assert_ok(&rs);
    assert_eq!(
        remote_pkgs, local_pkgs,
        "the packages are podman's, byte for byte"
    );
    let stats = remote.stats();
    for id in local_pkg_nodes(&rs) {
        assert_eq!(
            stats.get(&id).map(|r| r.place.clone()),
            Some(Place::Remote),
            "{id}"
        );
    }
    // The image's files travel in the input root: no image is named
    // (the engine would try to pull it).
    let req = LocalPkgRequest {
        log: charly_engine::runners::LogSink::new(&|_| {}),
        node: "local-pkg:x".into(),
        key: "0".into(),
        format: "deb".into(),
        source: root.join("candy/pkg0/src"),
        image: BASE.into(),
        script: "true".into(),
        glob: "*.deb".into(),
        out: t.path().join("unused"),
    };
    let (cmd, input) = remote.local_pkg_action(&req).expect("action");
    assert!(
        !cmd.platform.contains_key("container-image"),
        "{:?}",
        cmd.platform
    );
    let paths = input.paths();
    for p in ["bin/sh", "charly-src/NAME", "out"] {
        assert!(paths.iter().any(|x| x == p), "{p} in the input root");
    }
}

#[test]
fn remote_failures_name_node_and_action_and_store_nothing() {
    if !common_reapi::available() {
        return;
    }
    let t = tempfile::tempdir().expect("tmp");
    let root = t.path().join("project");
    project(&root, 2, "0", Some(1));
    let casd = common_reapi::start(2);
    let fake = FakeRunner::new();
    let remote = RemoteRunner::connect(&casd.url, &fake, remote_opts(2)).expect("connects");
    let (s, pkgs) = run(&root, &t.path().join("store"), &remote, 2);
    assert!(!s.ok());
    let failed: Vec<_> = s
        .nodes
        .iter()
        .filter(|n| n.state == State::Failed)
        .collect();
    assert_eq!(failed.len(), 1, "{failed:?}");
    let e = failed[0].error.clone().unwrap_or_default();
    assert!(failed[0].id.contains("pkg1"), "{}", failed[0].id);
    assert!(
        e.contains("remote execution of") && e.contains("pkg1"),
        "{e}"
    );
    assert!(e.contains("exited with code 7"), "{e}");
    assert!(e.contains("package refuses to build"), "{e}");
    assert!(e.contains("(action "), "{e}");
    assert!(
        pkgs.keys().all(|k| !k.contains("pkg1")),
        "nothing stored for the failed node"
    );

    // Engine gone: connecting says so; with fallback the CLI runs locally.
    drop(casd);
    let err = RemoteRunner::connect(&remote.client().url().display(), &fake, remote_opts(1))
        .err()
        .expect("unreachable");
    assert!(err.message.contains("unreachable"), "{}", err.message);
}

/// An engine asked to run a local package in `container-image=docker://
/// localhost/…` (an image only this machine has) fails to pull it; the
/// failure names the image and the flags that fix it (issue 44, item 8).
/// buildbox-casd here does exactly that, as the issue's try did.
#[test]
fn a_local_image_the_engine_cannot_pull_is_named_with_the_flags_that_fix_it() {
    if !common_reapi::available() {
        return;
    }
    let t = tempfile::tempdir().expect("tmp");
    let root = t.path().join("project");
    project(&root, 1, "0", None);
    let casd = common_reapi::start(1);
    let fake = FakeRunner::new();
    let opts = RemoteOptions {
        image_property: true,
        ..remote_opts(1)
    };
    let remote = RemoteRunner::connect(&casd.url, &fake, opts).expect("connects");
    let (s, _) = run(&root, &t.path().join("store"), &remote, 1);
    let failed: Vec<_> = s
        .nodes
        .iter()
        .filter(|n| n.state == State::Failed)
        .collect();
    assert_eq!(failed.len(), 1, "{:?}", s.nodes);
    let e = failed[0].error.clone().unwrap_or_default();
    assert!(
        e.contains(&format!(
            "hint: the engine was asked to run it in docker://{BASE}"
        )) && e.contains("--remote-no-image-property")
            && e.contains("--remote-fallback"),
        "{e}"
    );
}

/// The numbers for the issue note: `cargo test -p charly-engine --test reapi_e2e -- --ignored --nocapture`.
#[test]
#[ignore]
fn measure_round_trips_and_fan_out() {
    if !common_reapi::available() {
        return;
    }
    let casd = common_reapi::start(8);
    let fake = FakeRunner::new();
    for (jobs, label) in [(1usize, "remote-jobs 1"), (8, "remote-jobs 8")] {
        let t = tempfile::tempdir().expect("tmp");
        let root = t.path().join("project");
        // A salt per round keeps the first round's results out of the second's ActionCache.
        project(&root, 16, &format!("0.5; : {label}"), None);
        let remote = RemoteRunner::connect(&casd.url, &fake, remote_opts(jobs)).expect("connects");
        let start = std::time::Instant::now();
        let (s, _) = run(&root, &t.path().join("store"), &remote, 16);
        assert!(s.ok());
        let wall = start.elapsed();
        let stats = remote.stats();
        let ms: Vec<u64> = stats
            .values()
            .filter(|r| r.place == Place::Remote)
            .map(|r| r.ms)
            .collect();
        eprintln!(
            "fan-out of 16 actions (sleep 0.5 each), {label}: total {:.2} s, peak in flight {}, per action {} ms min / {} ms max",
            wall.as_secs_f64(),
            remote.peak_in_flight(),
            ms.iter().min().unwrap_or(&0),
            ms.iter().max().unwrap_or(&0)
        );
    }
    // Per action and per cache hit without the sleep.
    let t = tempfile::tempdir().expect("tmp");
    let root = t.path().join("project");
    project(&root, 16, "0", None);
    let remote = RemoteRunner::connect(&casd.url, &fake, remote_opts(1)).expect("connects");
    let (s, _) = run(&root, &t.path().join("store-a"), &remote, 1);
    assert!(s.ok());
    let exec: Vec<u64> = remote
        .stats()
        .values()
        .filter(|r| r.place == Place::Remote)
        .map(|r| r.ms)
        .collect();
    let hits_runner = RemoteRunner::connect(&casd.url, &fake, remote_opts(1)).expect("connects");
    let (s, _) = run(&root, &t.path().join("store-b"), &hits_runner, 1);
    assert!(s.ok());
    let hits: Vec<u64> = hits_runner
        .stats()
        .values()
        .filter(|r| r.place == Place::RemoteCached)
        .map(|r| r.ms)
        .collect();
    let avg = |v: &[u64]| v.iter().sum::<u64>() as f64 / v.len().max(1) as f64;
    eprintln!(
        "round trip per remote action (16, sequential): avg {:.1} ms, min {} ms; per ActionCache hit (16): avg {:.1} ms, min {} ms",
        avg(&exec),
        exec.iter().min().unwrap_or(&0),
        avg(&hits),
        hits.iter().min().unwrap_or(&0)
    );
}
