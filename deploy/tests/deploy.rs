//! Deploy walker tests: the example box applied to a rooted directory with
//! builder artifacts from a real store, `del` restoring the tree exactly,
//! drift, and faults on the in-memory host.

use charly_cache::Store;
use charly_deploy::ledger::{BundleRecord, BundleState, Connection, Ledger, StepState};
use charly_deploy::local::LocalHost;
use charly_deploy::mem::{MemHost, MemNode, Response};
use charly_deploy::source::StoreArtifacts;
use charly_deploy::walk::{self, Artifacts, Options, TargetUser, WalkError};
use charly_engine::api::Engine;
use charly_engine::graph::{Goal, GraphOptions};
use charly_engine::hash::FileHasher;
use charly_engine::runners::fake::FakeRunner;
use charly_engine::runners::{
    ExportedImage, LayerRequest, LayerResult, LocalPkgRequest, RootfsRequest, RunError, Runner,
    StageRequest,
};
use charly_engine::sched::Quiet;
use charly_rules::load::{self, LoadOptions, Project};
use charly_rules::plan::{Gates, HostContext, InstallPlan, Target, build_merged_plan};
use charly_rules::resolve::{self, Resolution};
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use charly_testutil::example;

fn open() -> (Project, Resolution) {
    let p = load::load(&example(), &LoadOptions::default()).expect("loads");
    let r = resolve::resolve(&p);
    (p, r)
}

fn plan(p: &Project, r: &Resolution) -> InstallPlan {
    let b = r.get("hello").expect("hello resolves");
    build_merged_plan(
        p,
        b,
        &HostContext {
            target: Target::Local,
            ..HostContext::default()
        },
        &[],
    )
    .expect("plan")
}

/// The fake runner, except that builder stages write a real artifact tar
/// (an npm prefix under the box home) as podman's would.
struct TarRunner(FakeRunner);

impl Runner for TarRunner {
    fn name(&self) -> &str {
        "tar-test"
    }
    fn build_stage(&self, req: &StageRequest) -> Result<(), RunError> {
        use charly_files::artifact::{Entry, Kind, write_tar};
        let e = |path: &str, kind: Kind, mode: u32| Entry {
            path: path.into(),
            kind,
            mode,
            uid: 1000,
            gid: 1000,
        };
        write_tar(
            &req.out,
            vec![
                e("home/user/.npm-global", Kind::Dir, 0o755),
                e("home/user/.npm-global/bin", Kind::Dir, 0o755),
                e(
                    "home/user/.npm-global/bin/cowsay",
                    Kind::Symlink("../lib/node_modules/cowsay/cli.js".into()),
                    0o777,
                ),
                e("home/user/.npm-global/lib", Kind::Dir, 0o755),
                e("home/user/.npm-global/lib/node_modules", Kind::Dir, 0o755),
                e(
                    "home/user/.npm-global/lib/node_modules/cowsay",
                    Kind::Dir,
                    0o755,
                ),
                e(
                    "home/user/.npm-global/lib/node_modules/cowsay/cli.js",
                    Kind::File(b"#!/usr/bin/env node\nconsole.log('moo')\n".to_vec()),
                    0o755,
                ),
            ],
            Some(req.owner),
        )
        .map_err(|x| RunError::new(x.to_string()))
    }
    fn build_layer(&self, req: &LayerRequest) -> Result<LayerResult, RunError> {
        self.0.build_layer(req)
    }

    fn export_layers(&self, r: &str, out: &Path) -> Result<ExportedImage, RunError> {
        self.0.export_layers(r, out)
    }

    fn load_layout(&self, d: &Path, r: &str, t: &[String]) -> Result<String, RunError> {
        self.0.load_layout(d, r, t)
    }

    fn rename_image(&self, from: &str, to: &str) -> Result<(), RunError> {
        self.0.rename_image(from, to)
    }
    fn has_image(&self, reference: &str) -> bool {
        self.0.has_image(reference)
    }
    fn build_local_pkg(&self, req: &LocalPkgRequest) -> Result<(), RunError> {
        self.0.build_local_pkg(req)
    }
    fn build_rootfs(&self, req: &RootfsRequest) -> Result<(), RunError> {
        self.0.build_rootfs(req)
    }
}

/// Path → (kind, mode, uid, gid, content digest or link target).
fn tree(root: &Path) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    for e in walkdir::WalkDir::new(root).sort_by_file_name() {
        let e = e.expect("walk");
        let rel = e
            .path()
            .strip_prefix(root)
            .expect("rel")
            .display()
            .to_string();
        let md = e.path().symlink_metadata().expect("meta");
        let what = if md.file_type().is_symlink() {
            format!(
                "link {}",
                std::fs::read_link(e.path()).expect("link").display()
            )
        } else if md.is_dir() {
            "dir".to_string()
        } else {
            format!(
                "file {}",
                blake3::hash(&std::fs::read(e.path()).expect("read")).to_hex()
            )
        };
        m.insert(
            rel,
            format!("{what} {:o} {}:{}", md.mode() & 0o7777, md.uid(), md.gid()),
        );
    }
    m
}

/// A system file step writing `content` to `path`.
fn write_step(candy: &str, path: &str, content: &str) -> charly_rules::plan::InstallStep {
    charly_rules::plan::InstallStep {
        candy: candy.into(),
        kind: charly_rules::plan::StepKind::File,
        scope: charly_rules::plan::Scope::System,
        venue: charly_rules::plan::Venue::HostNative,
        gate: charly_rules::plan::Gate::None,
        phase: None,
        reverse: Vec::new(),
        data: charly_rules::plan::StepData::File(charly_rules::plan::FileStep {
            verb: "write".into(),
            path: path.into(),
            content: Some(content.into()),
            source: None,
            mode: "0644".into(),
            user: String::new(),
            task: 0,
        }),
    }
}

/// Applies `plan` as bundle `name` (vm target, every gate open) on
/// `host`, recorded in `ledger`.
fn apply_as(
    host: &mut MemHost,
    ledger: &mut Ledger,
    name: &str,
    plan: &InstallPlan,
    arts: &dyn Artifacts,
) -> Result<walk::Report, WalkError> {
    let user = walk::resolve_user(host, "user", plan).expect("user");
    walk::apply(
        host,
        Some(ledger),
        &record(name, plan, &user, "mem"),
        plan,
        &user,
        arts,
        &Options {
            target: Target::Vm,
            gates: charly_rules::plan::Gates::all(),
            ..Options::default()
        },
        &mut |_| {},
    )
}

/// `bundle del NAME` on `host`: what it did there, in order (the host's
/// log entries it added).
/// An empty ledger in a directory of its own (kept while the guard lives).
fn scratch_ledger() -> (tempfile::TempDir, Ledger) {
    let t = tempfile::tempdir().expect("tmp");
    let ledger = Ledger::open(t.path()).expect("ledger");
    (t, ledger)
}

fn del_log(host: &mut MemHost, ledger: &mut Ledger, name: &str) -> Vec<String> {
    let n = host.log.len();
    walk::remove(host, ledger, name, false, &mut |_| {}).expect("del");
    host.log[n..].to_vec()
}

/// The commands `bundle del NAME` ran that contain `word`.
fn del_runs(host: &mut MemHost, ledger: &mut Ledger, name: &str, word: &str) -> Vec<String> {
    del_log(host, ledger, name)
        .into_iter()
        .filter_map(|l| l.strip_prefix("run ").map(String::from))
        .filter(|l| l.contains(word))
        .collect()
}

fn record(name: &str, plan: &InstallPlan, user: &TargetUser, key: &str) -> BundleRecord {
    BundleRecord {
        name: name.into(),
        deploy_id: plan.deploy_id.clone(),
        box_name: plan.box_name.clone(),
        target: Target::Local,
        target_key: key.into(),
        connection: Connection::Local { root: None },
        user: user.name.clone(),
        home: user.home.clone(),
        state: BundleState::Applying,
        plan: serde_json::to_value(plan).expect("json"),
        options: serde_json::json!({}),
        created_unix: 0,
        updated_unix: 0,
        error: None,
    }
}

#[test]
fn example_applies_to_a_rooted_dir_and_del_restores_it_exactly() {
    let (p, r) = open();
    let plan = plan(&p, &r);
    let t = tempfile::tempdir().expect("tmp");
    let store = Store::open(&t.path().join("store")).expect("store");
    let hasher = FileHasher::in_memory();
    // Fill the store the way `box build hello` does (builder stage artifacts).
    let runner = TarRunner(FakeRunner::default());
    let engine = Engine {
        project: &p,
        resolution: &r,
        store: &store,
        runner: Some(&runner),
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
    let g = engine
        .graph(&Goal::Build, &["hello".into()])
        .expect("graph");
    let s = engine.run(&g, &t.path().join("out"), 2, false, &Quiet);
    assert!(
        s.ok(),
        "{}",
        serde_json::to_string(&s.nodes).unwrap_or_default()
    );
    let arts = StoreArtifacts::new(
        &p,
        &r,
        &store,
        &hasher,
        GraphOptions {
            plugins: Default::default(),
            dev_local_pkg: true,
            runner: "tar-test".into(),
            arch: "amd64".into(),
        },
        "hello",
    )
    .expect("artifacts");

    // A target with things of its own that the deploy must leave as they were.
    let root = t.path().join("root");
    std::fs::create_dir_all(root.join("etc/systemd")).expect("mkdir");
    std::fs::write(root.join("etc/hostname"), "box\n").expect("write");
    std::fs::write(
        root.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\n",
    )
    .expect("passwd");
    std::fs::create_dir_all(root.join("home/user")).expect("home");
    std::fs::write(root.join("home/user/.bashrc"), "alias ll='ls -l'").expect("bashrc");
    let before = tree(&root);

    let mut host = LocalHost::rooted(&root).expect("rooted");
    let user = walk::resolve_user(&mut host, "user", &plan).expect("user");
    assert_eq!(user.home, "/home/user");
    let mut ledger = Ledger::open(&t.path().join("ledger")).expect("ledger");
    let rec = record("hello-local", &plan, &user, "local:test");
    let o = Options {
        gates: Gates::all(),
        ..Options::default()
    };

    // Dry run: nothing on disk, nothing in the ledger, and it says what it would do.
    let dry = walk::apply(
        &mut host,
        None,
        &rec,
        &plan,
        &user,
        &arts,
        &Options {
            dry_run: true,
            ..o.clone()
        },
        &mut |_| {},
    )
    .expect("dry run");
    assert_eq!(tree(&root), before, "dry run touched nothing");
    assert!(ledger.get("hello-local").expect("get").is_none());
    let mkdirs: Vec<&String> = dry
        .steps
        .iter()
        .flat_map(|s| s.actions.iter())
        .filter(|a| a.starts_with("mkdir /opt"))
        .collect();
    assert_eq!(
        mkdirs,
        ["mkdir /opt", "mkdir /opt/hello"],
        "each directory once"
    );
    assert!(
        dry.steps
            .iter()
            .any(|s| s.actions.iter().any(|a| a.contains("/opt/hello/motd.txt")))
    );

    let report = walk::apply(
        &mut host,
        Some(&mut ledger),
        &rec,
        &plan,
        &user,
        &arts,
        &o,
        &mut |_| {},
    )
    .expect("apply");
    let state = |t: &str| {
        report
            .steps
            .iter()
            .find(|s| s.title.contains(t))
            .map(|s| s.state.clone())
            .unwrap_or_else(|| panic!("no step {t}"))
    };
    assert_eq!(state("write /opt/hello/motd.txt"), "complete");
    let (kinds, ops) = reverse_ops_are_what_was_recorded(
        &plan,
        &ledger.steps("hello-local").expect("steps"),
        &user.home,
        true,
    );
    assert!(
        ops >= 13 && kinds.len() >= 6,
        "the example's files, links, blocks, env files, unit and artifact: {kinds:?} {ops}"
    );
    assert_eq!(state("packages"), "skipped", "rooted: no packages");
    assert_eq!(state("cmd jq"), "skipped", "rooted: no commands");
    let rd = |p: &str| std::fs::read_to_string(root.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
    assert_eq!(rd("opt/hello/motd.txt"), "Welcome to the hello box.\n");
    assert_eq!(
        std::fs::read_link(root.join("usr/local/bin/hello-motd")).expect("link"),
        PathBuf::from("/opt/hello/motd.txt")
    );
    assert!(
        rd("etc/systemd/system/greeter.service").contains("[Service]")
            || rd("etc/systemd/system/greeter.service").contains("greeter")
    );
    assert_eq!(
        std::fs::metadata(root.join("home/user/.config/hello/settings.json"))
            .expect("settings")
            .mode()
            & 0o777,
        0o600
    );
    // The npm artifact from the store, in the target home.
    assert!(rd("home/user/.npm-global/lib/node_modules/cowsay/cli.js").contains("moo"));
    // env.d and the managed block in the login shell's rc file.
    let bashrc = rd("home/user/.bashrc");
    assert!(
        bashrc.starts_with("alias ll='ls -l'\n# >>> charly charly-env:"),
        "{bashrc}"
    );
    let envd: Vec<_> = walkdir::WalkDir::new(root.join("home/user/.config/charly/env.d"))
        .into_iter()
        .flatten()
        .filter(|e| e.file_type().is_file())
        .collect();
    assert!(!envd.is_empty(), "env.d files");
    let all_env: String = envd
        .iter()
        .map(|e| std::fs::read_to_string(e.path()).expect("env"))
        .collect();
    assert!(
        all_env.contains("HELLO_GREETING=\"hello from charly\""),
        "{all_env}"
    );
    assert_eq!(
        ledger.get("hello-local").expect("get").expect("rec").state,
        BundleState::Applied
    );

    // Status: clean, then a file changed behind our back is disk drift.
    let d = walk::drift(&mut host, &ledger, "hello-local", Some(&plan)).expect("drift");
    assert!(d.is_empty(), "{d:?}");
    std::fs::write(root.join("opt/hello/motd.txt"), "tampered\n").expect("tamper");
    let d = walk::drift(&mut host, &ledger, "hello-local", Some(&plan)).expect("drift");
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].kind, "disk");
    assert!(d[0].subject.contains("motd.txt") && d[0].detail.contains("content"));
    // Config drift: the plan changed since.
    let mut changed = plan.clone();
    changed.steps.pop();
    let d = walk::drift(&mut host, &ledger, "hello-local", Some(&changed)).expect("drift");
    assert!(d.iter().any(|x| x.kind == "config"), "{d:?}");

    // The tampered file is removed only when forced (without, it is kept:
    // del_keeps_a_file_changed_since_the_deploy_unless_forced).
    let undone = walk::remove_with(
        &mut host,
        &mut ledger,
        "hello-local",
        &walk::DelOptions {
            dry_run: false,
            force: true,
        },
        &mut |_| {},
    )
    .expect("del");
    assert!(!undone.is_empty());
    assert_eq!(tree(&root), before, "del restores the tree exactly");
    assert!(ledger.get("hello-local").expect("get").is_none());
}

/// Artifacts for in-memory tests: an empty npm tree, files from the example.
struct TestArts;

impl Artifacts for TestArts {
    fn builder_tar(&self, _candy: &str, _builder: &str) -> Result<Vec<u8>, String> {
        let t = tempfile::NamedTempFile::new().map_err(|e| e.to_string())?;
        charly_files::artifact::write_tar(
            t.path(),
            vec![charly_files::artifact::Entry {
                path: "home/user/.npm-global".into(),
                kind: charly_files::artifact::Kind::Dir,
                mode: 0o755,
                uid: 1000,
                gid: 1000,
            }],
            None,
        )
        .map_err(|e| e.to_string())?;
        std::fs::read(t.path()).map_err(|e| e.to_string())
    }
    fn local_packages(
        &self,
        _candy: &str,
        _format: &str,
    ) -> Result<Vec<(String, Vec<u8>)>, String> {
        Ok(vec![(
            "hello-charly_1.0_all.deb".into(),
            b"!<arch>\n".to_vec(),
        )])
    }
    fn candy_file(&self, candy: &str, rel: &str) -> Result<Vec<u8>, String> {
        std::fs::read(example().join("candy").join(candy).join(rel)).map_err(|e| e.to_string())
    }
}

/// Runs the example plan on a scripted in-memory host; returns the error,
/// the host and the ledger.
fn faulty(
    setup: impl FnOnce(&mut MemHost),
) -> (WalkError, MemHost, MemHost, Ledger, tempfile::TempDir) {
    faulty_with(false, setup)
}

/// [`faulty`], the steps of one (scope, venue) batched when `batch`.
fn faulty_with(
    batch: bool,
    setup: impl FnOnce(&mut MemHost),
) -> (WalkError, MemHost, MemHost, Ledger, tempfile::TempDir) {
    let (p, r) = open();
    let plan = plan(&p, &r);
    let mut host = MemHost::new("user", 1000);
    // Every package is already installed, unless a test says otherwise.
    let names: Vec<String> = plan
        .steps
        .iter()
        .filter_map(|s| match &s.data {
            charly_rules::plan::StepData::SystemPackages(p) => Some(p.packages.clone()),
            _ => None,
        })
        .flatten()
        .chain(["hello-charly".to_string()])
        .collect();
    host.on("dpkg-deb -f", Response::ok("hello-charly\n"));
    setup(&mut host);
    host.on(
        "dpkg-query",
        Response::ok(
            &names
                .iter()
                .map(|n| format!("{n}\tii \n"))
                .collect::<String>(),
        ),
    );
    let original = host.clone();
    let user = walk::resolve_user(&mut host, "user", &plan).expect("user");
    let (t, mut ledger) = scratch_ledger();
    let rec = record("b", &plan, &user, "mem");
    let err = walk::apply(
        &mut host,
        Some(&mut ledger),
        &rec,
        &plan,
        &user,
        &TestArts,
        &Options {
            gates: Gates::all(),
            target: Target::Vm,
            batch_commands: batch,
            ..Options::default()
        },
        &mut |_| {},
    )
    .expect_err("the walk stops");
    (err, host, original, ledger, t)
}

fn check_stop(
    err: &WalkError,
    host: &mut MemHost,
    original: &MemHost,
    ledger: &mut Ledger,
    what: &str,
) {
    let WalkError::Step {
        seq,
        title,
        message,
        not_attempted,
    } = err
    else {
        panic!("not a step error: {err}");
    };
    assert!(message.contains(what), "{message}");
    assert!(!not_attempted.is_empty(), "names what was not attempted");
    let text = err.to_string();
    assert!(
        text.contains(title.as_str()) && text.contains("not attempted"),
        "{text}"
    );
    let rec = ledger.get("b").expect("get").expect("record kept");
    assert_eq!(rec.state, BundleState::Failed);
    assert!(rec.error.as_deref().unwrap_or("").contains(what));
    let steps = ledger.steps("b").expect("steps");
    let failed = steps
        .iter()
        .find(|s| s.seq == *seq)
        .expect("failed step recorded");
    assert_eq!(failed.state, StepState::Failed);
    assert!(
        steps.iter().all(|s| s.seq <= *seq),
        "nothing after the failure was recorded"
    );
    assert!(
        steps
            .iter()
            .filter(|s| s.seq < *seq)
            .all(|s| matches!(s.state, StepState::Complete | StepState::Skipped)),
        "earlier steps are complete"
    );
    assert!(
        steps
            .iter()
            .any(|s| s.state == StepState::Complete && !s.undo.is_empty()),
        "undo ops of earlier steps kept"
    );
    // And everything done before the failure is undone by del.
    walk::remove(host, ledger, "b", false, &mut |_| {}).expect("del");
    assert_eq!(
        host.files, original.files,
        "del restores the in-memory tree"
    );
    assert!(ledger.get("b").expect("get").is_none());
}

#[test]
fn nonzero_exit_stops_the_walk() {
    let (err, mut host, original, mut ledger, _t) = faulty(|h| {
        h.on("jq --version", Response::fail(3, "jq: error: broken"));
    });
    check_stop(&err, &mut host, &original, &mut ledger, "exit 3");
    assert!(err.to_string().contains("jq: error: broken"));
}

/// In a batch the failing step is named exactly: the link before it in
/// the same round trip is complete, nothing after it is recorded, and
/// `del` undoes what was done.
#[test]
fn a_failure_inside_a_batch_stops_the_walk_at_that_step() {
    let (err, mut host, original, mut ledger, _t) = faulty_with(true, |h| {
        h.on("jq --version", Response::fail(3, "jq: error: broken"));
    });
    let WalkError::Step { title, .. } = &err else {
        panic!("{err}");
    };
    assert!(title.contains("cmd jq --version"), "{title}");
    let steps = ledger.steps("b").expect("steps");
    let link = steps
        .iter()
        .find(|s| s.title.contains("link /usr/local/bin/hello-motd"))
        .expect("the link");
    assert_eq!(link.state, StepState::Complete);
    assert!(
        host.commands()
            .iter()
            .any(|c| c.contains("ln -s -- /opt/hello/motd.txt /usr/local/bin/hello-motd")),
        "the link was made by the batch: {:#?}",
        host.log
    );
    check_stop(&err, &mut host, &original, &mut ledger, "exit 3");
    assert!(err.to_string().contains("jq: error: broken"));
}

/// A batch that breaks off (a timeout, a lost connection) tells nothing of
/// which of its steps ran: the first is failed with the error, the others
/// keep their recorded undo and say so, and `del` undoes whatever may have
/// happened.
#[test]
fn a_batch_that_breaks_off_keeps_the_undo_of_every_step_in_it() {
    let (err, mut host, original, mut ledger, _t) = faulty_with(true, |h| {
        h.on("jq --version", Response::Timeout);
    });
    assert!(err.to_string().contains("timed out"), "{err}");
    let steps = ledger.steps("b").expect("steps");
    let state = |t: &str| {
        steps
            .iter()
            .find(|s| s.title.contains(t))
            .unwrap_or_else(|| panic!("no step {t}"))
    };
    // mkdir, write, link and cmd went in one batch.
    let first = state("mkdir /opt/hello");
    assert_eq!(first.state, StepState::Failed);
    assert!(first.note.as_deref().unwrap_or("").contains("timed out"));
    let link = state("link /usr/local/bin/hello-motd");
    assert_eq!(link.state, StepState::Failed);
    assert!(
        link.note.as_deref().unwrap_or("").contains("broke off"),
        "{:?}",
        link.note
    );
    assert!(
        link.undo.iter().any(|(_, u)| matches!(u,
            charly_deploy::ledger::Undo::RemovePath { path, .. } if path == "/usr/local/bin/hello-motd")),
        "its undo is kept: {:?}",
        link.undo
    );
    assert!(
        !steps
            .iter()
            .any(|s| s.title.contains("mkdir /home/user/.local/bin")),
        "nothing after the batch was attempted"
    );
    walk::remove(&mut host, &mut ledger, "b", false, &mut |_| {}).expect("del");
    assert_eq!(host.files, original.files);
}

#[test]
fn timeout_stops_the_walk() {
    let (err, mut host, original, mut ledger, _t) = faulty(|h| {
        h.on("jq --version", Response::Timeout);
    });
    check_stop(&err, &mut host, &original, &mut ledger, "timed out");
}

#[test]
fn garbage_output_stops_the_walk() {
    let (err, mut host, original, mut ledger, _t) = faulty(|h| {
        h.on("dpkg-query", Response::ok("<html>502 Bad Gateway</html>\n"));
    });
    check_stop(&err, &mut host, &original, &mut ledger, "unexpected output");
}

#[test]
fn missing_binary_stops_the_walk() {
    let (err, mut host, original, mut ledger, _t) = faulty(|h| {
        h.binaries.remove("apt-get");
    });
    check_stop(
        &err,
        &mut host,
        &original,
        &mut ledger,
        "`apt-get` is not installed",
    );
}

#[test]
fn a_full_run_on_the_mem_host_records_and_undoes_everything() {
    let (p, r) = open();
    let plan = plan(&p, &r);
    let mut host = MemHost::new("user", 1000);
    host.on("dpkg-deb -f", Response::ok("hello-charly\n"));
    let original = host.clone();
    let user = walk::resolve_user(&mut host, "user", &plan).expect("user");
    let (_t, mut ledger) = scratch_ledger();
    let rec = record("b", &plan, &user, "mem");
    // Nothing installed before, everything after: a scripted package database.
    host.on("dpkg-query", Response::ok(""));
    let err = walk::apply(
        &mut host,
        Some(&mut ledger),
        &rec,
        &plan,
        &user,
        &TestArts,
        &Options {
            gates: Gates::default(),
            target: Target::Vm,
            ..Options::default()
        },
        &mut |_| {},
    )
    .expect_err("the mem host never installs packages");
    // The install "succeeded" but the query still says not installed: caught.
    assert!(err.to_string().contains("not installed"), "{err}");
    // The undo of the package step was recorded before the install ran.
    let steps = ledger.steps("b").expect("steps");
    let pk = steps
        .iter()
        .find(|s| s.kind == "system-packages")
        .expect("pk");
    assert!(
        pk.undo
            .iter()
            .any(|(_, u)| u.describe().contains("remove deb packages"))
    );
    walk::remove(&mut host, &mut ledger, "b", false, &mut |_| {}).expect("del");
    assert_eq!(host.files, original.files);
    // Gates closed: the root cmd never ran.
    assert!(!host.commands().iter().any(|c| c.contains("jq --version")));
}

/// What the example box lacks of the step kinds a host applies: a
/// third-party repository (the prepare phase), a downloaded file and an
/// unpacked archive, file capabilities, a packaged service and a reboot.
const EXTRAS: &str = "candy:
    version: 2026.12.1
    name: extras
    description: the host step kinds the example lacks
    distro:
        debian:
            package:
                - htop
            repo:
                - name: extra-repo
                  url: https://example.org/debian
                  key: https://example.org/key.asc
    task:
        - download: https://example.org/tool
          extract: none
          to: /usr/local/bin/tool
          mode: \"0755\"
          user: root
        - download: https://example.org/t.tar.gz
          to: /opt/t
          user: root
        - setcap: /usr/local/bin/tool
          caps: cap_net_raw+ep
          user: root
    service:
        - name: cron
          use_packaged: cron
          scope: system
    reboot: true
";

/// The example project with the `extras` candy, and the merged vm plan of
/// box hello plus extras.
fn extras_plan(dir: &Path) -> (Project, InstallPlan) {
    let proj = charly_testutil::copy_project(&example(), dir);
    charly_testutil::write(&proj, "candy/extras/charly.yml", EXTRAS);
    let p = load::load(&proj, &LoadOptions::default()).expect("loads");
    let r = resolve::resolve(&p);
    let plan = build_merged_plan(
        &p,
        r.get("hello").expect("hello"),
        &HostContext {
            target: Target::Vm,
            ..HostContext::default()
        },
        &["extras".to_string()],
    )
    .expect("plan");
    (p, plan)
}

/// A host whose package database answers as the packages of `plan` are
/// installed: nothing before the first step, each step's packages after it
/// (`dpkg-query` runs before and after every install), all of them for
/// `del`; downloads stage a file and an archive with a `bin/t`.
fn scripted_host(plan: &InstallPlan) -> MemHost {
    let mut host = MemHost::new("user", 1000);
    host.files
        .insert("/tmp".into(), MemNode::Dir { mode: 0o1777 });
    let list = |names: &[String]| {
        names
            .iter()
            .map(|n| format!("{n}\tii \n"))
            .collect::<String>()
    };
    let mut have: Vec<String> = Vec::new();
    for s in &plan.steps {
        let new: Vec<String> = match &s.data {
            charly_rules::plan::StepData::SystemPackages(p)
                if s.phase == Some(charly_rules::plan::Phase::Install) =>
            {
                p.packages.clone()
            }
            charly_rules::plan::StepData::LocalPkgInstall(_) => vec!["hello-charly".into()],
            _ => continue,
        };
        host.once("dpkg-query -W", Response::ok(&list(&have)));
        have.extend(new);
        // A dependency comes with the first install.
        if !have.iter().any(|h| h == "libonig5") {
            have.push("libonig5".into());
        }
        host.once("dpkg-query -W", Response::ok(&list(&have)));
    }
    host.on("dpkg-query", Response::ok(&list(&have)));
    host.on("dpkg-deb -f", Response::ok("hello-charly\n"));
    host.on(
        "mktemp -d /tmp/charly-dl.",
        Response::ok("/tmp/charly-dl.abcdefgh\n"),
    );
    host.on(
        "find ./file -printf",
        Response::ok("f\x00755\x00./file\x00\x00"),
    );
    host.on("find ./file -type f", Response::ok("ab12  ./file\x00"));
    host.on(
        "find . -mindepth 1 -printf",
        Response::ok("d\x00755\x00./bin\x00\x00f\x00755\x00./bin/t\x00\x00"),
    );
    host.on(
        "find . -mindepth 1 -type f",
        Response::ok("cd34  ./bin/t\x00"),
    );
    host
}

/// Every kind of step the compiler emits for a host, applied on a vm
/// target, records the undo its own reverse ops say (the conformance check
/// of `reverse_ops_are_what_was_recorded`), and `del` replays exactly those
/// records: the host's files are as before, the packages that were new are
/// removed (with the dependency they pulled in), each service goes back to
/// its prior state, the capabilities and the repository are undone.
#[test]
fn every_step_kind_a_host_applies_records_the_undo_its_reverse_ops_say() {
    let t = tempfile::tempdir().expect("tmp");
    let (_p, plan) = extras_plan(&t.path().join("p"));
    let mut host = scripted_host(&plan);
    let original = host.clone();
    let user = walk::resolve_user(&mut host, "user", &plan).expect("user");
    let mut ledger = Ledger::open(&t.path().join("ledger")).expect("ledger");
    let report = walk::apply(
        &mut host,
        Some(&mut ledger),
        &record("all", &plan, &user, "mem"),
        &plan,
        &user,
        &TestArts,
        &Options {
            gates: Gates::all(),
            target: Target::Vm,
            ..Options::default()
        },
        &mut |_| {},
    )
    .expect("apply");
    let steps = ledger.steps("all").expect("steps");
    let (kinds, ops) = reverse_ops_are_what_was_recorded(&plan, &steps, &user.home, false);
    let every: std::collections::BTreeSet<String> = [
        "system-packages",
        "builder",
        "op",
        "file",
        "service-packaged",
        "service-custom",
        "shell-hook",
        "shell-snippet",
        "local-pkg-install",
        "reboot",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(kinds, every, "every kind a host applies was checked");
    assert!(ops >= 25, "{ops} reverse ops checked");
    // Each op verb and reverse kind the plan has was among them.
    let reverse_kinds: std::collections::BTreeSet<String> = plan
        .steps
        .iter()
        .flat_map(|s| &s.reverse)
        .map(|r| walk::kind_name(r.kind))
        .collect();
    for k in [
        "package-remove",
        "remove-repo-file",
        "rm-file-system",
        "rm-file-user",
        "remove-artifact-files",
        "npm-uninstall-g",
        "restore-caps",
        "service-disable",
        "restore-enabled",
        "service-remove",
        "remove-envd-file",
        "remove-managed-block",
    ] {
        assert!(reverse_kinds.contains(k), "{k} not in {reverse_kinds:?}");
    }
    assert!(
        report
            .steps
            .iter()
            .all(|s| s.state == "complete" || s.state == "skipped")
    );

    let n = host.log.len();
    walk::remove(&mut host, &mut ledger, "all", false, &mut |_| {}).expect("del");
    let del: Vec<String> = host.log[n..]
        .iter()
        .filter_map(|l| l.strip_prefix("run ").map(String::from))
        .collect();
    // The commands themselves (what `sh -c` runs), matched whole: a `del`
    // that merely mentions a package is not one that removes it.
    let ran = |w: &str| {
        del.iter().any(|c| {
            c.split_once("/bin/sh -c '")
                .and_then(|(_, rest)| rest.strip_suffix('\''))
                == Some(w)
        })
    };
    assert!(
        ran("DEBIAN_FRONTEND=noninteractive apt-get purge -y htop"),
        "{del:#?}"
    );
    assert!(
        ran("DEBIAN_FRONTEND=noninteractive apt-get purge -y -- nodejs npm libonig5"),
        "the dependency goes too: {del:#?}"
    );
    assert!(
        ran("setcap -r /usr/local/bin/tool 2>/dev/null || true"),
        "{del:#?}"
    );
    assert!(ran("systemctl disable --now cron.service"), "{del:#?}");
    assert!(ran("apt-get update -qq"), "{del:#?}");
    assert_eq!(host.files, original.files, "del restores the host's files");
    assert!(ledger.get("all").expect("get").is_none());
}

/// Steps of one (scope, venue) that are commands with a checkable outcome
/// (packages, mkdir, link, cmd, setcap, a packaged service, file writes,
/// a generated unit) go in two round trips per run of them — one asks,
/// one does — and the ledger is what the same steps record one by one:
/// the same undo records (tagged with the same reverse ops, backups
/// included), facts and states; `del` undoes them.
#[test]
fn batched_steps_record_what_they_would_alone_in_fewer_round_trips() {
    let t = tempfile::tempdir().expect("tmp");
    let (_p, plan) = extras_plan(&t.path().join("p"));
    let run = |batch: bool| {
        let mut host = scripted_host(&plan);
        let original = host.clone();
        let user = walk::resolve_user(&mut host, "user", &plan).expect("user");
        let dir = tempfile::tempdir().expect("ledger");
        let mut ledger = Ledger::open(dir.path()).expect("ledger");
        let report = walk::apply(
            &mut host,
            Some(&mut ledger),
            &record("b", &plan, &user, "mem"),
            &plan,
            &user,
            &TestArts,
            &Options {
                gates: Gates::all(),
                target: Target::Vm,
                batch_commands: batch,
                ..Options::default()
            },
            &mut |_| {},
        )
        .expect("apply");
        (host, original, ledger, dir, report, user)
    };
    let (alone, _, one_by_one, _d1, _, _) = run(false);
    let (mut host, original, mut ledger, _d2, report, user) = run(true);
    let strip = |l: &Ledger| -> Vec<serde_json::Value> {
        l.steps("b")
            .expect("steps")
            .into_iter()
            .map(|s| {
                serde_json::json!({"seq": s.seq, "state": s.state, "undo": s.undo,
                    "realizes": s.realizes, "facts": s.facts})
            })
            .collect()
    };
    assert_eq!(strip(&ledger), strip(&one_by_one), "the same ledger");
    let together = |t: &str| {
        report
            .steps
            .iter()
            .find(|s| s.title.contains(t))
            .unwrap_or_else(|| panic!("no step {t}"))
            .actions
            .iter()
            .any(|a| a.contains("in one round trip"))
    };
    for t in [
        "packages jq tree",
        "mkdir /opt/hello",
        "write /opt/hello/motd.txt",
        "link /usr/local/bin/hello-motd",
        "cmd jq --version",
        "write /home/user/.config/hello/settings.json",
        "copy /etc/systemd/system/greeter.service",
        "service charly-greeter-greeter",
        "setcap /usr/local/bin/tool",
        "service cron.service",
    ] {
        assert!(together(t), "{t} ran in a batch");
    }
    assert!(!together("bash snippet"), "a managed block runs alone");
    let (n1, n2) = (alone.round_trips(), host.round_trips());
    eprintln!("round trips: {n1} one by one, {n2} batched");
    assert!(n2 * 10 <= n1 * 7, "{n2} batched vs {n1} one by one");
    let (kinds, _) = reverse_ops_are_what_was_recorded(
        &plan,
        &ledger.steps("b").expect("steps"),
        &user.home,
        false,
    );
    assert!(kinds.contains("service-packaged") && kinds.contains("op"));
    walk::remove(&mut host, &mut ledger, "b", false, &mut |_| {}).expect("del");
    assert_eq!(host.files, original.files);
}

#[test]
fn vm_reboot_waits_for_a_new_boot_id() {
    let (p, r) = open();
    let mut plan = plan(&p, &r);
    plan.steps = vec![charly_rules::plan::InstallStep::reboot("rebooter")];
    let run = |host: &mut MemHost| {
        let user = walk::resolve_user(host, "user", &plan).expect("user");
        let (t, mut ledger) = scratch_ledger();
        let res = walk::apply(
            host,
            Some(&mut ledger),
            &record("b", &plan, &user, "mem"),
            &plan,
            &user,
            &TestArts,
            &Options {
                target: Target::Vm,
                timeout: std::time::Duration::from_secs(5),
                ..Options::default()
            },
            &mut |_| {},
        );
        (res, ledger, t)
    };
    let mut host = MemHost::new("user", 1000);
    let (res, mut ledger, _t) = run(&mut host);
    let report = res.expect("reboot");
    assert_eq!(report.steps[0].state, "complete");
    assert_eq!(host.boots, 2, "one reboot");
    let log = host.log.join("\n");
    let at = |s: &str| log.find(s).unwrap_or_else(|| panic!("{s} not in {log}"));
    assert!(at("systemctl reboot") < at("reconnect"), "{log}");
    let steps = ledger.steps("b").expect("steps");
    assert!(
        steps[0]
            .undo
            .iter()
            .any(|(_, u)| u.describe().contains("cannot be undone"))
    );
    walk::remove(&mut host, &mut ledger, "b", false, &mut |_| {}).expect("del");

    // A target that never comes back with a new boot: the step fails, named.
    let mut host = MemHost::new("user", 1000);
    host.on("systemctl reboot", Response::ok(""));
    let (res, _l, _t) = run(&mut host);
    let err = res.expect_err("no new boot").to_string();
    assert!(
        err.contains("reboot") && err.contains("no new boot within 5 s"),
        "{err}"
    );
}

#[test]
fn removing_a_unit_file_reloads_systemd_afterwards() {
    let (p, r) = open();
    let mut plan = plan(&p, &r);
    plan.steps = vec![write_step(
        "pod",
        "/etc/containers/systemd/charly-x.container",
        "[Container]\nImage=x\n",
    )];
    let mut host = MemHost::new("user", 1000);
    let original = host.clone();
    let (_t, mut ledger) = scratch_ledger();
    apply_as(&mut host, &mut ledger, "b", &plan, &TestArts).expect("apply");
    let after = del_log(&mut host, &mut ledger, "b");
    let rm = after
        .iter()
        .position(|l| l.starts_with("remove /etc/containers/systemd/charly-x.container"))
        .expect("file removed");
    let reload = after
        .iter()
        .position(|l| l.contains("systemctl daemon-reload"))
        .unwrap_or_else(|| panic!("no reload in {after:#?}"));
    assert!(rm < reload, "{after:#?}");
    assert_eq!(host.files, original.files);
}

/// A packaged service's undo restores the state the host had before the
/// deploy, read at apply time: enabled and running stays so, enabled but
/// stopped is only stopped again, running but not enabled is only disabled,
/// neither is disabled and stopped.
#[test]
fn removing_a_packaged_service_restores_its_prior_state() {
    let (p, r) = open();
    let cases = [
        ("enabled active", None),
        ("enabled inactive", Some("systemctl stop sshd.service")),
        ("disabled active", Some("systemctl disable sshd.service")),
        (
            "disabled inactive",
            Some("systemctl disable --now sshd.service"),
        ),
        ("", Some("systemctl disable --now sshd.service")),
    ];
    for (prior, undo) in cases {
        let mut plan = plan(&p, &r);
        plan.steps = vec![charly_rules::plan::InstallStep {
            candy: "ssh".into(),
            kind: charly_rules::plan::StepKind::ServicePackaged,
            scope: charly_rules::plan::Scope::System,
            venue: charly_rules::plan::Venue::HostNative,
            gate: charly_rules::plan::Gate::None,
            phase: None,
            reverse: Vec::new(),
            data: charly_rules::plan::StepData::ServicePackaged(
                charly_rules::plan::ServicePackagedStep {
                    name: "sshd".into(),
                    unit: "sshd.service".into(),
                    enable: true,
                },
            ),
        }];
        let mut host = MemHost::new("user", 1000);
        host.on("is-enabled", Response::ok(&format!("{prior}\n")));
        let (_t, mut ledger) = scratch_ledger();
        apply_as(&mut host, &mut ledger, "b", &plan, &TestArts).expect("apply");
        assert!(
            host.commands()
                .iter()
                .any(|c| c.contains("systemctl enable --now sshd.service")),
            "{:#?}",
            host.log
        );
        let after = del_runs(&mut host, &mut ledger, "b", "systemctl");
        match undo {
            None => assert!(after.is_empty(), "{prior}: {after:#?}"),
            Some(cmd) => assert!(
                after.len() == 1 && after[0].contains(cmd),
                "{prior}: expected `{cmd}`, ran {after:#?}"
            ),
        }
    }
}

/// A local package installs with its format's own install template and
/// glob (an Arch package is `*.pkg.tar.zst`, not `*.pac`), and the format's
/// probe gates it: a host without the package manager is refused before
/// anything is staged.
#[test]
fn local_packages_install_with_the_formats_template_behind_its_probe() {
    let (p, r) = open();
    let mut plan = plan(&p, &r);
    plan.steps = vec![charly_rules::plan::InstallStep::local_pkg(
        "hello",
        charly_rules::plan::LocalPkgStep {
            format: "pac".into(),
            source: "pkg/arch".into(),
            glob: "*.pkg.tar.zst".into(),
            install_template: Some("pacman -U --noconfirm {{.StageDir}}/{{.Glob}}\n".into()),
            probe: Some("command -v pacman".into()),
        },
    )];
    struct ArchPkgs;
    impl Artifacts for ArchPkgs {
        fn builder_tar(&self, _: &str, _: &str) -> Result<Vec<u8>, String> {
            Err("no artifacts".into())
        }
        fn local_packages(&self, _: &str, f: &str) -> Result<Vec<(String, Vec<u8>)>, String> {
            assert_eq!(f, "pac");
            Ok(vec![(
                "hello-1.0-1-any.pkg.tar.zst".into(),
                b"zst".to_vec(),
            )])
        }
        fn candy_file(&self, _: &str, _: &str) -> Result<Vec<u8>, String> {
            Err("no files".into())
        }
    }
    let run = |host: &mut MemHost| {
        let (_t, mut ledger) = scratch_ledger();
        apply_as(host, &mut ledger, "b", &plan, &ArchPkgs)
    };
    let tmp = || MemNode::Dir { mode: 0o1777 };
    let mut host = MemHost::new("user", 1000);
    host.files.insert("/tmp".into(), tmp());
    host.binaries.insert("pacman".into());
    host.on("pacman -Qqp", Response::ok("hello\n"));
    // The installed-package list (before and after the install).
    host.on("-c 'pacman -Q'", Response::ok("hello 1.0-1\n"));
    run(&mut host).expect("apply");
    let install = host
        .commands()
        .into_iter()
        .find(|c| c.contains("pacman -U"))
        .unwrap_or_else(|| panic!("no install in {:#?}", host.log))
        .to_string();
    assert!(
        install.contains("/tmp/charly-pkgs-b-") && install.contains("/*.pkg.tar.zst"),
        "{install}"
    );
    assert!(!install.contains("*.pac"), "{install}");

    // No pacman: the probe fails, nothing is written.
    let mut host = MemHost::new("user", 1000);
    host.files.insert("/tmp".into(), tmp());
    host.on("command -v pacman", Response::fail(1, ""));
    let err = run(&mut host).expect_err("probe gates").to_string();
    assert!(
        err.contains("cannot install pac packages") && err.contains("command -v pacman"),
        "{err}"
    );
    assert!(
        !host.log.iter().any(|l| l.starts_with("write ")),
        "{:#?}",
        host.log
    );
}

/// A fish user's env hook is native fish (no third-party `bass`): a `.fish`
/// env file next to the POSIX one, sourced from config.fish; `bundle del`
/// removes both and the block.
#[test]
fn a_fish_users_env_hook_is_native_fish_and_undone() {
    let (p, r) = open();
    let mut plan = plan(&p, &r);
    plan.steps = vec![charly_rules::plan::InstallStep::shell_hook(
        "tool",
        charly_rules::plan::ShellHookStep {
            env: [("TOOL_HOME".to_string(), "/opt/tool".to_string())]
                .into_iter()
                .collect(),
            path: vec!["/opt/tool/bin".into()],
            env_file: "/home/user/.config/charly/env.d/tool.sh".into(),
        },
    )];
    let mut host = MemHost::new("user", 1000);
    host.passwd[1] = "user:x:1000:1000::/home/user:/usr/bin/fish".into();
    for d in ["/home/user/.config", "/home/user/.config/fish"] {
        host.files.insert(d.into(), MemNode::Dir { mode: 0o755 });
    }
    host.files.insert(
        "/home/user/.config/fish/config.fish".into(),
        MemNode::File {
            data: b"set -g fish_greeting\n".to_vec(),
            mode: 0o644,
            uid: 1000,
            gid: 1000,
        },
    );
    let original = host.clone();
    let (_t, mut ledger) = scratch_ledger();
    apply_as(&mut host, &mut ledger, "b", &plan, &TestArts).expect("apply");
    let text = |host: &MemHost, p: &str| match host.files.get(p) {
        Some(MemNode::File { data, .. }) => String::from_utf8_lossy(data).into_owned(),
        other => panic!("{p}: {other:?}"),
    };
    let fish = text(&host, "/home/user/.config/charly/env.d/tool.fish");
    assert!(
        fish.contains("set -gx TOOL_HOME '/opt/tool'")
            && fish.contains("set -gx PATH '/opt/tool/bin' $PATH"),
        "{fish}"
    );
    let config = text(&host, "/home/user/.config/fish/config.fish");
    assert!(
        config.contains("source /home/user/.config/charly/env.d/tool.fish")
            && !config.contains("bass"),
        "{config}"
    );
    walk::remove(&mut host, &mut ledger, "b", false, &mut |_| {}).expect("del");
    assert_eq!(host.files, original.files);
}

/// `bundle del` keeps a file the user changed after the deploy and says so
/// (as it does for a file the deploy overwrote); `--force` removes it.
#[test]
fn del_keeps_a_file_changed_since_the_deploy_unless_forced() {
    let (p, r) = open();
    let mut plan = plan(&p, &r);
    plan.steps = vec![
        write_step("cfg", "/etc/tool.conf", "deployed\n"),
        write_step("cfg", "/etc/motd", "deployed\n"),
    ];
    for force in [false, true] {
        let mut host = MemHost::new("user", 1000);
        // /etc/motd was there before: the deploy overwrote it.
        let before = MemNode::File {
            data: b"welcome\n".to_vec(),
            mode: 0o644,
            uid: 0,
            gid: 0,
        };
        host.files.insert("/etc/motd".into(), before.clone());
        let (_t, mut ledger) = scratch_ledger();
        apply_as(&mut host, &mut ledger, "b", &plan, &TestArts).expect("apply");
        let edited = MemNode::File {
            data: b"deployed\nmine\n".to_vec(),
            mode: 0o644,
            uid: 0,
            gid: 0,
        };
        host.files.insert("/etc/tool.conf".into(), edited.clone());
        host.files.insert("/etc/motd".into(), edited.clone());
        let reports = walk::remove_with(
            &mut host,
            &mut ledger,
            "b",
            &walk::DelOptions {
                dry_run: false,
                force,
            },
            &mut |_| {},
        )
        .expect("del");
        let notes: Vec<String> = reports.iter().filter_map(|r| r.note.clone()).collect();
        if force {
            assert!(!host.files.contains_key("/etc/tool.conf"), "{notes:?}");
            assert_eq!(host.files.get("/etc/motd"), Some(&before));
        } else {
            assert_eq!(host.files.get("/etc/tool.conf"), Some(&edited));
            assert_eq!(host.files.get("/etc/motd"), Some(&edited));
            for f in ["/etc/tool.conf", "/etc/motd"] {
                assert!(
                    notes.iter().any(|n| n.contains(f)
                        && n.contains("changed since the deploy; kept as it is now")),
                    "{f}: {notes:?}"
                );
            }
        }
        assert!(
            ledger.get("b").expect("ledger").is_none(),
            "the record is gone"
        );
    }
}

/// Two bundles on one target that install the same package and write the
/// same file: deleting either leaves what the other still needs (the
/// package stays, the file keeps the other's content), and deleting both,
/// in either order, leaves the target as it was.
#[test]
fn shared_packages_and_files_outlive_the_first_del() {
    let (p, r) = open();
    let base = plan(&p, &r);
    let plan_of = |name: &str, content: &str| {
        let mut pl = base.clone();
        pl.deploy_id = format!("id-{name}");
        pl.steps = vec![
            charly_rules::plan::InstallStep::system_packages(
                name,
                charly_rules::plan::Phase::Install,
                charly_rules::plan::SystemPackages {
                    format: "deb".into(),
                    packages: vec!["jq".into()],
                    ..Default::default()
                },
                None,
            ),
            write_step(name, "/etc/shared.conf", content),
        ];
        pl
    };
    let (pa, pb) = (plan_of("a", "from a\n"), plan_of("b", "from b\n"));
    let text = |h: &MemHost| match h.files.get("/etc/shared.conf") {
        Some(MemNode::File { data, .. }) => Some(String::from_utf8_lossy(data).into_owned()),
        _ => None,
    };
    let purges = |h: &MemHost| {
        h.commands()
            .iter()
            .filter(|c| c.contains("apt-get purge"))
            .count()
    };
    for b_first in [false, true] {
        let mut host = MemHost::new("user", 1000);
        // jq is absent until a installs it.
        host.once("dpkg-query", Response::ok(""));
        host.on("dpkg-query", Response::ok("jq\tii \n"));
        let original = host.files.clone();
        let (_t, mut ledger) = scratch_ledger();
        for (name, pl) in [("a", &pa), ("b", &pb)] {
            apply_as(&mut host, &mut ledger, name, pl, &TestArts).expect("apply");
        }
        assert_eq!(text(&host).as_deref(), Some("from b\n"));
        let (first, second) = if b_first { ("b", "a") } else { ("a", "b") };
        let reports =
            walk::remove(&mut host, &mut ledger, first, false, &mut |_| {}).expect("del first");
        assert_eq!(purges(&host), 0, "jq is still needed: {reports:#?}");
        let still = if b_first { "from a\n" } else { "from b\n" };
        assert_eq!(text(&host).as_deref(), Some(still), "{reports:#?}");
        walk::remove(&mut host, &mut ledger, second, false, &mut |_| {}).expect("del second");
        assert_eq!(purges(&host), 1, "the last one removes jq");
        assert_eq!(host.files, original, "b_first={b_first}");
    }
}

/// Two targets, two bundles on each: a package, a service and a managed
/// block both bundles of a target share, and a file each writes its own
/// content to. On each target, after every `del` (in both orders) what
/// the remaining bundle needs is there and untouched, the last `del`
/// leaves the target as it was, and the other target sees nothing of it:
/// sharing is decided per target, never by what another target holds.
#[test]
fn sharing_is_per_target_and_every_del_order_restores_each_target() {
    use charly_rules::plan::{
        InstallStep, Phase, Scope, ServicePackagedStep, ShellSnippetStep, SystemPackages,
    };
    let (p, r) = open();
    let base = plan(&p, &r);
    let plan_of = |name: &str| {
        let mut pl = base.clone();
        pl.deploy_id = format!("id-{name}");
        pl.steps = vec![
            InstallStep::system_packages(
                "shared",
                Phase::Install,
                SystemPackages {
                    format: "deb".into(),
                    packages: vec!["jq".into()],
                    ..Default::default()
                },
                None,
            ),
            write_step(name, "/etc/shared.conf", &format!("from {name}\n")),
            InstallStep::service_packaged(
                "shared",
                Scope::System,
                ServicePackagedStep {
                    name: "sshd".into(),
                    unit: "sshd.service".into(),
                    enable: true,
                },
            ),
            InstallStep::shell_snippet(
                "shared",
                ShellSnippetStep {
                    shell: "bash".into(),
                    text: "export SHARED=1\n".into(),
                    destination: "/home/user/.bashrc".into(),
                    managed_block: true,
                    path: Vec::new(),
                },
            ),
        ];
        pl
    };
    let text = |h: &MemHost, path: &str| match h.files.get(path) {
        Some(MemNode::File { data, .. }) => Some(String::from_utf8_lossy(data).into_owned()),
        _ => None,
    };
    let count = |h: &MemHost, word: &str| h.commands().iter().filter(|c| c.contains(word)).count();
    let new_host = || {
        let mut host = MemHost::new("user", 1000);
        // jq is absent and sshd disabled until the first bundle is applied.
        host.once("dpkg-query", Response::ok(""));
        host.on("dpkg-query", Response::ok("jq\tii \n"));
        host.once("is-enabled", Response::ok("disabled inactive\n"));
        host.on("is-enabled", Response::ok("enabled active\n"));
        host
    };
    let (_t, mut ledger) = scratch_ledger();
    let mut hosts = [new_host(), new_host()];
    let originals = [hosts[0].files.clone(), hosts[1].files.clone()];
    let names = [["a1", "b1"], ["a2", "b2"]];
    for (h, host) in hosts.iter_mut().enumerate() {
        for name in names[h] {
            let pl = plan_of(name);
            let user = walk::resolve_user(host, "user", &pl).expect("user");
            let mut rec = record(name, &pl, &user, &format!("mem-{h}"));
            rec.connection = Connection::Local {
                root: Some(format!("/target-{h}")),
            };
            walk::apply(
                host,
                Some(&mut ledger),
                &rec,
                &pl,
                &user,
                &TestArts,
                &Options {
                    target: Target::Vm,
                    gates: charly_rules::plan::Gates::all(),
                    ..Options::default()
                },
                &mut |_| {},
            )
            .expect("apply");
        }
    }
    // Target 0 goes a first, target 1 b first.
    for (h, order) in [(0, names[0]), (1, [names[1][1], names[1][0]])] {
        let other = 1 - h;
        let other_before = (hosts[other].files.clone(), hosts[other].log.len());
        let del = |host: &mut MemHost, ledger: &mut Ledger, name: &str| {
            walk::remove(host, ledger, name, false, &mut |_| {}).expect("del")
        };
        let reports = del(&mut hosts[h], &mut ledger, order[0]);
        let host = &hosts[h];
        let ctx = format!("target {h} after del {}: {reports:#?}", order[0]);
        assert_eq!(count(host, "apt-get purge"), 0, "jq still needed: {ctx}");
        assert_eq!(
            count(host, "systemctl disable"),
            0,
            "sshd still needed: {ctx}"
        );
        assert!(
            text(host, "/home/user/.bashrc").is_some_and(|t| t.contains("export SHARED=1")),
            "the block stays: {ctx}"
        );
        assert_eq!(
            text(host, "/etc/shared.conf"),
            Some(format!("from {}\n", order[1])),
            "{ctx}"
        );
        del(&mut hosts[h], &mut ledger, order[1]);
        let host = &hosts[h];
        assert_eq!(count(host, "apt-get purge"), 1, "the last del removes jq");
        assert_eq!(
            count(host, "systemctl disable --now sshd.service"),
            1,
            "the last del puts sshd back as it was"
        );
        assert_eq!(host.files, originals[h], "target {h} as it was");
        assert_eq!(
            (hosts[other].files.clone(), hosts[other].log.len()),
            other_before,
            "target {other} untouched by target {h}'s dels"
        );
    }
}

/// The preflight waits for a package manager lock held by another process
/// (an fcntl lock, as dpkg takes) and names it when it is still held at the
/// end; a lock released in time lets the deploy go on.
#[test]
fn preflight_waits_for_the_package_managers_lock() {
    let t = tempfile::tempdir().expect("tmp");
    let lock = t.path().join("lock-frontend");
    std::fs::write(&lock, "").expect("lock file");
    let hold = |secs: u32| {
        let child = std::process::Command::new("python3")
            .args([
                "-c",
                "import fcntl,sys,time\nf=open(sys.argv[1],'w')\nfcntl.lockf(f,fcntl.LOCK_EX)\nprint('held',flush=True)\ntime.sleep(float(sys.argv[2]))",
            ])
            .arg(&lock)
            .arg(secs.to_string())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3");
        let mut child = child;
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.as_mut().expect("stdout")),
            &mut line,
        )
        .expect("held");
        child
    };
    let path = lock.to_str().expect("utf8");
    let mut host = LocalHost::new();
    let mut c = hold(30);
    let err =
        charly_deploy::bundle::preflight(&mut host, std::time::Duration::from_secs(2), &[path])
            .expect_err("still locked");
    assert!(
        err.to_string().contains(path) && err.to_string().contains("still locked"),
        "{err}"
    );
    let _ = c.kill();
    let _ = c.wait();
    let mut c = hold(2);
    let t0 = std::time::Instant::now();
    charly_deploy::bundle::preflight(&mut host, std::time::Duration::from_secs(20), &[path])
        .expect("released in time");
    assert!(
        t0.elapsed() >= std::time::Duration::from_secs(1),
        "it waited"
    );
    let _ = c.wait();
    // Nothing to wait for: at once.
    charly_deploy::bundle::preflight(&mut host, std::time::Duration::from_secs(20), &[path])
        .expect("free");
}

/// `setcap:` on a host reads the file's capabilities first; `del` puts
/// back exactly those, or removes what the deploy set.
#[test]
fn setcap_on_a_host_is_undone_to_the_prior_capabilities() {
    let (p, r) = open();
    let mut plan = plan(&p, &r);
    let step = |caps: Option<&str>| {
        charly_rules::plan::InstallStep::op(
            "ping",
            charly_rules::plan::OpStep {
                verb: "setcap".into(),
                value: "/usr/bin/ping".into(),
                user: "root".into(),
                caps: caps.map(String::from),
                ..charly_rules::plan::OpStep::default()
            },
        )
    };
    for (prior, undo) in [
        ("", "setcap -r /usr/bin/ping"),
        (
            "/usr/bin/ping cap_net_raw=ep\n",
            "setcap cap_net_raw=ep /usr/bin/ping",
        ),
    ] {
        plan.steps = vec![step(Some("cap_net_raw,cap_net_admin+ep"))];
        let mut host = MemHost::new("user", 1000);
        host.on("getcap /usr/bin/ping", Response::ok(prior));
        let (_t, mut ledger) = scratch_ledger();
        apply_as(&mut host, &mut ledger, "b", &plan, &TestArts).expect("apply");
        assert!(
            host.commands()
                .iter()
                .any(|c| c.contains("setcap cap_net_raw,cap_net_admin+ep /usr/bin/ping")),
            "{:#?}",
            host.log
        );
        let after = del_runs(&mut host, &mut ledger, "b", "setcap");
        assert!(
            after.len() == 1 && after[0].contains(undo),
            "prior {prior:?}: {after:#?}"
        );
    }
}

/// `download:` on a host: an archive is unpacked into place (files it
/// replaces backed up, new paths recorded) and a plain file lands at `to`;
/// `del` leaves the tree exactly as it was. Served from a `file://` URL.
#[test]
fn download_on_a_rooted_host_is_placed_and_undone_exactly() {
    let (p, r) = open();
    let mut plan = plan(&p, &r);
    let t = tempfile::tempdir().expect("tmp");
    // The archive: pkg/bin/tool, pkg/bin/old (replaces a file), pkg/README, pkg/bin/t -> tool.
    let src = t.path().join("src/pkg");
    std::fs::create_dir_all(src.join("bin")).expect("mkdir");
    std::fs::write(src.join("bin/tool"), "#!/bin/sh\necho tool\n").expect("w");
    std::fs::write(src.join("bin/old"), "new old\n").expect("w");
    std::fs::write(src.join("README"), "read me\n").expect("w");
    std::os::unix::fs::symlink("tool", src.join("bin/t")).expect("ln");
    let archive = t.path().join("tool.tar.gz");
    let st = std::process::Command::new("tar")
        .arg("-czf")
        .arg(&archive)
        .arg("-C")
        .arg(t.path().join("src"))
        .arg("pkg")
        .status()
        .expect("tar");
    assert!(st.success());
    let single = t.path().join("single");
    std::fs::write(&single, "single file\n").expect("w");

    let root = t.path().join("root");
    std::fs::create_dir_all(root.join("opt/tool/bin")).expect("mkdir");
    std::fs::write(root.join("opt/tool/bin/old"), "old old\n").expect("w");
    std::fs::write(root.join("opt/tool/keep"), "mine\n").expect("w");
    std::fs::create_dir_all(root.join("home/user")).expect("home");
    std::fs::create_dir_all(root.join("etc")).expect("etc");
    std::fs::write(
        root.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\n",
    )
    .expect("passwd");
    let before = tree(&root);

    let dl = |url: String, to: &str, extract: &str, strip: Option<u32>, mode: Option<&str>| {
        charly_rules::plan::InstallStep::op(
            "tool",
            charly_rules::plan::OpStep {
                verb: "download".into(),
                value: url,
                user: "root".into(),
                to: Some(to.into()),
                extract: Some(extract.into()),
                strip_components: strip,
                mode: mode.map(String::from),
                ..charly_rules::plan::OpStep::default()
            },
        )
    };
    plan.steps = vec![
        dl(
            format!("file://{}", archive.display()),
            "/opt/tool",
            "tar.gz",
            Some(1),
            None,
        ),
        dl(
            format!("file://{}", single.display()),
            "/usr/local/bin/single",
            "none",
            None,
            Some("0750"),
        ),
    ];
    let mut host = LocalHost::rooted(&root).expect("rooted");
    let user = walk::resolve_user(&mut host, "user", &plan).expect("user");
    let mut ledger = Ledger::open(&t.path().join("ledger")).expect("ledger");
    let rec = record("dl", &plan, &user, "local:test");
    let o = Options {
        gates: Gates::all(),
        ..Options::default()
    };
    let dry = walk::apply(
        &mut host,
        None,
        &rec,
        &plan,
        &user,
        &TestArts,
        &Options {
            dry_run: true,
            ..o.clone()
        },
        &mut |_| {},
    )
    .expect("dry run");
    assert_eq!(tree(&root), before, "a dry run downloads nothing");
    assert!(
        dry.steps[1]
            .actions
            .iter()
            .any(|a| a.contains("mkdir /usr/local/bin")),
        "{:?}",
        dry.steps[1].actions
    );
    let report = walk::apply(
        &mut host,
        Some(&mut ledger),
        &rec,
        &plan,
        &user,
        &TestArts,
        &o,
        &mut |_| {},
    )
    .expect("apply");
    assert!(
        report.steps.iter().all(|s| s.state == "complete"),
        "{:#?}",
        report.steps
    );
    let rd = |p: &str| std::fs::read_to_string(root.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
    assert_eq!(rd("opt/tool/bin/tool"), "#!/bin/sh\necho tool\n");
    assert_eq!(rd("opt/tool/bin/old"), "new old\n");
    assert_eq!(rd("opt/tool/README"), "read me\n");
    assert_eq!(rd("opt/tool/keep"), "mine\n");
    assert_eq!(
        std::fs::read_link(root.join("opt/tool/bin/t")).expect("link"),
        PathBuf::from("tool")
    );
    assert_eq!(rd("usr/local/bin/single"), "single file\n");
    assert_eq!(
        std::fs::metadata(root.join("usr/local/bin/single"))
            .expect("single")
            .mode()
            & 0o7777,
        0o750
    );
    // Nothing drifted: the recorded facts are what is on disk.
    assert!(
        walk::drift(&mut host, &ledger, "dl", None)
            .expect("drift")
            .is_empty()
    );
    assert!(
        !std::fs::read_dir("/tmp").expect("tmp").flatten().any(|e| e
            .file_name()
            .to_string_lossy()
            .starts_with("charly-dl.")
            && e.path().join("tree/bin/tool").exists()),
        "the staging directory is gone"
    );
    walk::remove(&mut host, &mut ledger, "dl", false, &mut |_| {}).expect("del");
    assert_eq!(tree(&root), before, "del restores the tree exactly");

    // A symlink in the root that points out of it is not followed.
    let outside = t.path().join("outside");
    std::fs::create_dir_all(&outside).expect("outside");
    std::os::unix::fs::symlink(&outside, root.join("opt/escape")).expect("ln");
    plan.steps = vec![dl(
        format!("file://{}", archive.display()),
        "/opt/escape/tool",
        "tar.gz",
        Some(1),
        None,
    )];
    let rec = record("dl2", &plan, &user, "local:test");
    let err = walk::apply(
        &mut host,
        Some(&mut ledger),
        &rec,
        &plan,
        &user,
        &TestArts,
        &o,
        &mut |_| {},
    )
    .expect_err("refused");
    let said = err.to_string();
    assert!(
        said.contains("leads out of") || said.contains("outside the root"),
        "{said}"
    );
    assert!(
        !outside.join("tool/bin/tool").exists(),
        "nothing written outside the root"
    );
}

/// Repositories on a host: gated by `--allow-repo-changes`; the key (its
/// armour removed) and the source line are files of the step, so `del`
/// puts back a source file that was there before, removes the rest, and
/// refreshes the index after they are gone.
#[test]
fn repositories_on_a_host_are_gated_written_and_undone_exactly() {
    let (p, r) = open();
    let mut plan = plan(&p, &r);
    let repo = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    plan.steps = vec![charly_rules::plan::InstallStep::repo_change(
        "gh",
        charly_rules::plan::RepoChangeStep {
            format: "deb".into(),
            repos: vec![
                repo(&[
                    ("name", "github-cli"),
                    ("url", "https://cli.github.com/packages"),
                    ("key", "https://cli.github.com/key.asc"),
                ]),
                repo(&[("name", "local"), ("url", "file:/srv/repo"), ("suite", "/")]),
            ],
            copr: Vec::new(),
        },
    )];
    // "binary key" as ASCII armour.
    let armored = "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nYmluYXJ5IGtleQ==\n=AAAA\n-----END PGP PUBLIC KEY BLOCK-----\n";
    let fresh = || {
        let mut host = MemHost::new("user", 1000);
        host.on("cli.github.com/key.asc", Response::ok(armored));
        host.on("apt-get update", Response::ok(""));
        for d in ["/etc/apt", "/etc/apt/sources.list.d"] {
            host.files.insert(d.into(), MemNode::Dir { mode: 0o755 });
        }
        host.files.insert(
            "/etc/apt/sources.list.d/local.list".into(),
            MemNode::File {
                data: b"deb file:/old /\n".to_vec(),
                mode: 0o644,
                uid: 0,
                gid: 0,
            },
        );
        host
    };

    // Without the gate: skipped, nothing written.
    let mut host = fresh();
    let before = host.files.clone();
    let (_t, mut ledger) = scratch_ledger();
    let user = walk::resolve_user(&mut host, "user", &plan).expect("user");
    let report = walk::apply(
        &mut host,
        Some(&mut ledger),
        &record("g", &plan, &user, "mem"),
        &plan,
        &user,
        &TestArts,
        &Options {
            target: Target::Vm,
            ..Options::default()
        },
        &mut |_| {},
    )
    .expect("apply");
    assert_eq!(report.steps[0].state, "skipped");
    assert!(
        report.steps[0]
            .note
            .as_deref()
            .is_some_and(|n| n.contains("allow-repo-changes")),
        "{:?}",
        report.steps[0].note
    );
    assert_eq!(host.files, before);

    // With it: written, index refreshed.
    let mut host = fresh();
    let before = host.files.clone();
    let (_t, mut ledger) = scratch_ledger();
    apply_as(&mut host, &mut ledger, "g", &plan, &TestArts).expect("apply");
    let file = |host: &MemHost, p: &str| match host.files.get(p) {
        Some(MemNode::File { data, .. }) => String::from_utf8_lossy(data).into_owned(),
        other => panic!("{p}: {other:?}"),
    };
    assert_eq!(
        file(&host, "/etc/apt/keyrings/github-cli.gpg"),
        "binary key"
    );
    assert_eq!(
        file(&host, "/etc/apt/sources.list.d/github-cli.list"),
        "deb [signed-by=/etc/apt/keyrings/github-cli.gpg] https://cli.github.com/packages stable main\n"
    );
    assert_eq!(
        file(&host, "/etc/apt/sources.list.d/local.list"),
        "deb file:/srv/repo /\n"
    );
    assert!(host.commands().iter().any(|c| c.contains("apt-get update")));
    let after = del_log(&mut host, &mut ledger, "g");
    assert_eq!(host.files, before, "del restores the files exactly");
    let last_removal = after
        .iter()
        .rposition(|l| l.contains("sources.list.d") || l.contains("keyrings"))
        .expect("files removed");
    let update = after
        .iter()
        .rposition(|l| l.contains("apt-get update"))
        .expect("index refreshed");
    assert!(update > last_removal, "{after:#?}");
}

/// A login that needs a sudo password: without one, nothing runs and the
/// steps that need root are named; a password sudo rejects stops the walk
/// before the first step, saying so; an accepted one is checked once and
/// every privileged command asks sudo with it (`-k -S`), never showing it.
#[test]
fn sudo_with_a_password_is_checked_once_up_front() {
    let (p, r) = open();
    let mut plan = plan(&p, &r);
    plan.steps = vec![write_step("motd", "/etc/motd", "hi\n")];
    let walk_with = |pw: Option<&str>, sudo_says: Response| {
        let mut host = MemHost::new("user", 1000);
        host.login = charly_deploy::host::Login::new("user", 1000);
        host.on("-c true", sudo_says);
        if let Some(pw) = pw {
            charly_deploy::host::Host::set_sudo_password(
                &mut host,
                Some(charly_deploy::host::Secret::new(pw).expect("pw")),
            )
            .expect("set");
        }
        let (_t, mut ledger) = scratch_ledger();
        let res = apply_as(&mut host, &mut ledger, "s", &plan, &TestArts);
        (res, host)
    };
    let refused = Response::Exit {
        status: 1,
        stdout: String::new(),
        stderr: "sudo: a password is required\n".into(),
    };
    let (res, host) = walk_with(None, refused.clone());
    let err = res.expect_err("no password").to_string();
    assert!(
        err.contains("needs a password")
            && err.contains("/etc/motd")
            && err.contains("--ask-become-pass"),
        "{err}"
    );
    assert!(!host.files.contains_key("/etc/motd"));
    let (res, host) = walk_with(
        Some("wrong"),
        Response::Exit {
            status: 1,
            stdout: String::new(),
            stderr: "Sorry, try again.\nsudo: 1 incorrect password attempt\n".into(),
        },
    );
    let err = res.expect_err("rejected").to_string();
    assert!(err.contains("did not accept the password"), "{err}");
    assert!(!err.contains("wrong"), "the password is never shown: {err}");
    assert!(!host.files.contains_key("/etc/motd"));
    let (res, host) = walk_with(Some("right"), Response::ok(""));
    res.expect("accepted");
    assert!(host.files.contains_key("/etc/motd"));
    let checks: Vec<&str> = host
        .commands()
        .into_iter()
        .filter(|c| c.contains("-c true"))
        .collect();
    assert_eq!(checks.len(), 1, "checked once: {:#?}", host.log);
    assert!(
        checks[0].starts_with("sudo -k -S -p '' --"),
        "{}",
        checks[0]
    );
    assert!(host.log.iter().all(|l| !l.contains("right")));

    // Where sudo needs no password, it is never handed to sudo: sudo would
    // not read it, and the line would reach the command's own stdin.
    let secret = || charly_deploy::host::Secret::new("pw").expect("pw");
    for (sudo_n, used) in [(Response::ok(""), false), (refused, true)] {
        let mut host = MemHost::new("user", 1000);
        host.login = charly_deploy::host::Login::new("user", 1000);
        host.on("-c true", sudo_n);
        let given = charly_deploy::host::give_sudo_password(&mut host, secret()).expect("give");
        assert_eq!(given, used);
        let login = charly_deploy::host::Host::login(&mut host).expect("login");
        assert_eq!(login.sudo_password.is_some(), used);
    }
    let mut root = MemHost::new("user", 1000);
    assert!(!charly_deploy::host::give_sudo_password(&mut root, secret()).expect("root"));
    let login = charly_deploy::host::Host::login(&mut root).expect("login");
    assert!(login.sudo_password.is_none());
}

/// A `build:` task on a host does what it does in the image: nothing of
/// its own (the candy's builder steps carry the artifacts); it completes
/// and says so, on a rooted target too.
#[test]
fn a_build_task_on_a_host_completes_as_a_marker() {
    let (p, r) = open();
    let mut plan = plan(&p, &r);
    plan.steps = vec![charly_rules::plan::InstallStep::op(
        "tool",
        charly_rules::plan::OpStep {
            verb: "build".into(),
            value: "all".into(),
            user: "${USER}".into(),
            ..charly_rules::plan::OpStep::default()
        },
    )];
    let mut host = MemHost::new("user", 1000);
    let (_t, mut ledger) = scratch_ledger();
    let report = apply_as(&mut host, &mut ledger, "b", &plan, &TestArts).expect("apply");
    assert_eq!(report.steps[0].state, "complete", "{:?}", report.steps[0]);
    assert!(
        report.steps[0]
            .actions
            .iter()
            .any(|a| a.contains("builder steps")),
        "{:?}",
        report.steps[0].actions
    );
    assert!(
        host.commands().iter().all(|c| c.contains("getent passwd")),
        "the step itself runs nothing: {:?}",
        host.log
    );
}

/// Consecutive `cmd` steps run as one command when batching is on (one
/// round trip over SSH): the same parent shell runs them all; each step
/// is recorded and finished as its own marker says; the first failure
/// stops the batch, and the steps after it are neither run nor recorded.
#[test]
fn consecutive_commands_run_in_one_round_trip_and_stop_at_the_first_failure() {
    let (p, r) = open();
    let mut plan = plan(&p, &r);
    let t = tempfile::tempdir().expect("tmp");
    let d = t.path().display().to_string();
    let cmd = |body: String| {
        charly_rules::plan::InstallStep::op(
            "cmds",
            charly_rules::plan::OpStep {
                verb: "cmd".into(),
                value: body,
                user: "root".into(),
                ..charly_rules::plan::OpStep::default()
            },
        )
    };
    plan.steps = vec![
        cmd(format!("echo $PPID > {d}/a")),
        cmd(format!("echo $PPID > {d}/b")),
        cmd(format!("echo $PPID > {d}/c\necho broken >&2\nexit 3")),
        cmd(format!("touch {d}/d")),
    ];
    let mut host = LocalHost::new();
    let user = walk::resolve_user(&mut host, "root", &plan).expect("user");
    let mut ledger = Ledger::open(&t.path().join("ledger")).expect("ledger");
    let rec = record("batch", &plan, &user, "local:test");
    let mut seen = Vec::new();
    let err = walk::apply(
        &mut host,
        Some(&mut ledger),
        &rec,
        &plan,
        &user,
        &TestArts,
        &Options {
            gates: Gates::all(),
            batch_commands: true,
            ..Options::default()
        },
        &mut |s| seen.push((s.seq, s.state.clone())),
    )
    .expect_err("step 2 fails");
    match &err {
        WalkError::Step {
            seq,
            message,
            not_attempted,
            ..
        } => {
            assert_eq!(*seq, 2);
            assert!(
                message.contains("exit 3") && message.contains("broken"),
                "{message}"
            );
            assert_eq!(not_attempted.len(), 1, "{not_attempted:?}");
        }
        e => panic!("{e}"),
    }
    assert_eq!(
        seen,
        [
            (0, "complete".to_string()),
            (1, "complete".to_string()),
            (2, "failed".to_string())
        ]
    );
    let ppid = |f: &str| std::fs::read_to_string(t.path().join(f)).expect(f);
    assert_eq!(ppid("a"), ppid("b"));
    assert_eq!(ppid("a"), ppid("c"));
    assert_ne!(ppid("a").trim(), std::process::id().to_string());
    assert!(!t.path().join("d").exists(), "not attempted");
    let steps = ledger.steps("batch").expect("steps");
    let states: Vec<(u32, StepState)> = steps.iter().map(|s| (s.seq, s.state)).collect();
    assert_eq!(
        states,
        [
            (0, StepState::Complete),
            (1, StepState::Complete),
            (2, StepState::Failed)
        ]
    );
    // del: the commands are not undone (each says so), and the bundle goes.
    walk::remove(&mut host, &mut ledger, "batch", false, &mut |_| {}).expect("del");
    assert!(ledger.get("batch").expect("get").is_none());
}

/// Plugin steps for the walker tests: runs a marker command on the walk's
/// host through the host seam, then reports a teardown script; or fails.
struct MarkerPlugin {
    fail: bool,
    calls: std::sync::Mutex<Vec<String>>,
}

impl walk::PluginSteps for MarkerPlugin {
    fn execute(
        &self,
        call: &walk::PluginCall<'_>,
        host: &mut dyn charly_deploy::host::Host,
    ) -> Result<Vec<charly_rules::plan::ReverseOp>, String> {
        self.calls
            .lock()
            .expect("calls")
            .push(format!("{} {} {}", call.word, call.class, call.input));
        if self.fail {
            return Err("plugin crashed".into());
        }
        let mut c = charly_deploy::host::Cmd::sh("mkdir -p /tmp/marker-dir".to_string());
        c.as_user = Some(call.user.name.clone());
        host.run(&c).map_err(|e| e.to_string())?;
        walk::parse_deploy_reply(
            br#"{"reverse_ops":[{"kind":"plugin-script","scope":1,"extra":{"script":"rm -rf /tmp/marker-dir"}}],"record":{"candy":"x"}}"#,
        )
    }
}

fn plugin_plan(p: &Project, r: &Resolution) -> InstallPlan {
    let mut plan = plan(p, r);
    plan.steps = vec![charly_rules::plan::InstallStep::external(
        "tool",
        charly_rules::plan::StepKind::External("marker".into()),
        charly_rules::plan::Scope::User,
        charly_rules::plan::Venue::HostNative,
        charly_rules::plan::Gate::None,
        charly_rules::plan::ExternalStep {
            data: serde_json::json!({"word": "marker", "class": "step", "input": {"m": 1}, "task": 0}),
        },
    )];
    plan
}

#[test]
fn a_plugin_step_executes_through_the_host_and_del_replays_its_reverse_ops() {
    let (p, r) = open();
    let plan = plugin_plan(&p, &r);
    let plugin = std::sync::Arc::new(MarkerPlugin {
        fail: false,
        calls: Default::default(),
    });
    let mut host = MemHost::new("user", 1000);
    let (_t, mut ledger) = scratch_ledger();
    let user = walk::resolve_user(&mut host, "user", &plan).expect("user");
    let opts = |dry_run: bool, plugins: Option<std::sync::Arc<dyn walk::PluginSteps>>| Options {
        target: Target::Vm,
        gates: Gates::all(),
        dry_run,
        plugins,
        ..Options::default()
    };

    // Without a plugin host the step is skipped, saying why.
    let rep = walk::apply(
        &mut host,
        None,
        &record("p", &plan, &user, "mem"),
        &plan,
        &user,
        &TestArts,
        &opts(true, None),
        &mut |_| {},
    )
    .expect("dry");
    assert_eq!(rep.steps[0].state, "skipped", "{:?}", rep.steps[0]);
    assert!(
        rep.steps[0]
            .note
            .as_deref()
            .unwrap_or("")
            .contains("plugin `marker` is not served"),
        "{:?}",
        rep.steps[0]
    );
    // A dry run never calls execute.
    let rep = walk::apply(
        &mut host,
        None,
        &record("p", &plan, &user, "mem"),
        &plan,
        &user,
        &TestArts,
        &opts(true, Some(plugin.clone())),
        &mut |_| {},
    )
    .expect("dry");
    assert_eq!(rep.steps[0].state, "would-run");
    assert!(plugin.calls.lock().expect("calls").is_empty());

    let rep = walk::apply(
        &mut host,
        Some(&mut ledger),
        &record("p", &plan, &user, "mem"),
        &plan,
        &user,
        &TestArts,
        &opts(false, Some(plugin.clone())),
        &mut |_| {},
    )
    .expect("apply");
    assert_eq!(rep.steps[0].state, "complete", "{:?}", rep.steps[0]);
    assert_eq!(
        *plugin.calls.lock().expect("calls"),
        ["marker step {\"m\":1}"]
    );
    assert!(
        host.commands()
            .iter()
            .any(|c| c.contains("mkdir -p /tmp/marker-dir"))
    );
    // Its undo records carry the reverse ops the plugin reported.
    let steps = ledger.steps("p").expect("steps");
    let (kinds, _) = reverse_ops_are_what_was_recorded(&plan, &steps, &user.home, false);
    assert!(kinds.contains("external:marker"), "{kinds:?}");
    assert_eq!(
        steps[0]
            .realizes
            .values()
            .flatten()
            .map(|r| r.kind)
            .collect::<Vec<_>>(),
        [charly_rules::plan::ReverseKind::PluginScript]
    );
    let runs = del_runs(&mut host, &mut ledger, "p", "marker-dir");
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert!(
        runs[0].starts_with("runuser -u user -- ")
            && runs[0].ends_with("sh -c 'rm -rf /tmp/marker-dir'"),
        "as the user: {runs:?}"
    );
}

#[test]
fn a_failing_plugin_stops_the_walk_naming_it() {
    let (p, r) = open();
    let plan = plugin_plan(&p, &r);
    let plugin = std::sync::Arc::new(MarkerPlugin {
        fail: true,
        calls: Default::default(),
    });
    let mut host = MemHost::new("user", 1000);
    let (_t, mut ledger) = scratch_ledger();
    let user = walk::resolve_user(&mut host, "user", &plan).expect("user");
    let err = walk::apply(
        &mut host,
        Some(&mut ledger),
        &record("p", &plan, &user, "mem"),
        &plan,
        &user,
        &TestArts,
        &Options {
            target: Target::Vm,
            plugins: Some(plugin),
            ..Options::default()
        },
        &mut |_| {},
    )
    .expect_err("fails");
    let text = err.to_string();
    assert!(text.contains("plugin `marker`: plugin crashed"), "{text}");
}

/// The IR's reverse ops are the undo (conformance). For every completed
/// step: the ledger holds the step as the compiler made it (home
/// resolved); each undo operation it recorded either carries out reverse
/// ops of that very step, and is a faithful form of each
/// (`walk::realizes`: same kind of reversal, same subject, same
/// privilege), or is something done on the way that no op names
/// (`walk::incidental`: a directory created, a reload, a note that a
/// command is not undone); and every reverse op of the step is carried out
/// by some record, unless the host has nothing to carry out for it
/// (`walk::vacuous`). Plugin steps carry the ops their plugin reported.
/// Returns the step kinds checked and how many reverse ops.
fn reverse_ops_are_what_was_recorded(
    plan: &InstallPlan,
    steps: &[charly_deploy::ledger::StepRecord],
    home: &str,
    rooted: bool,
) -> (std::collections::BTreeSet<String>, usize) {
    use charly_rules::plan::{InstallStep, StepKind};
    let mut kinds = std::collections::BTreeSet::new();
    let mut ops = 0;
    for rec in steps.iter().filter(|r| r.state == StepState::Complete) {
        let mut want = plan.steps[rec.seq as usize].clone();
        want.resolve_home(home);
        let applied: InstallStep =
            serde_json::from_value(rec.step.clone()).expect("the recorded step reads");
        assert_eq!(applied, want, "step {}: recorded as compiled", rec.seq);
        let plugin = matches!(want.kind, StepKind::ExternalPlugin | StepKind::External(_));
        let at = format!("step {} ({})", rec.seq, applied.kind);
        for (idx, u) in &rec.undo {
            match rec.realizes.get(idx) {
                Some(rs) => {
                    assert!(!rs.is_empty(), "{at}: {u:?}");
                    for r in rs {
                        assert!(
                            plugin || want.reverse.contains(r),
                            "{at}: {u:?} claims {r:?}, which is not one of its reverse ops {:?}",
                            want.reverse
                        );
                        assert!(walk::realizes(r, u), "{at}: {u:?} does not carry out {r:?}");
                    }
                    assert!(
                        !matches!(u, charly_deploy::ledger::Undo::Note { text } if text.contains("made no change it undoes")),
                        "{at}: the walker did nothing for an op: {u:?}"
                    );
                }
                None => assert!(
                    walk::incidental(u),
                    "{at}: {u:?} carries out none of the reverse ops {:?}",
                    want.reverse
                ),
            }
        }
        for r in &want.reverse {
            let done = rec.realizes.values().any(|rs| rs.contains(r));
            assert!(
                done || walk::vacuous(r, rooted).is_some(),
                "{at}: reverse op {r:?} has no undo record in {:?}",
                rec.undo
            );
            ops += 1;
        }
        kinds.insert(applied.kind.as_str());
    }
    (kinds, ops)
}

/// An Arch project: box `app` (candy `paru` with an AUR package next to a
/// repository one) and the builder box `yay` that produces `aur`.
fn arch_plan(dir: &Path) -> InstallPlan {
    let w = |rel: &str, text: &str| charly_testutil::write(dir, rel, text);
    w(
        "charly.yml",
        "version: 2026.1.1\ndiscover:\n    - box\n    - candy\ndefaults:\n    distro:\n        - arch\n    build:\n        - pac\n        - aur\n    builder:\n        aur: yay\n",
    );
    w(
        "box/yay/charly.yml",
        "box:\n    name: yay\n    version: 2026.1.1\n    base: docker.io/library/archlinux:latest\n    produce:\n        - aur\n",
    );
    w(
        "box/app/charly.yml",
        "box:\n    name: app\n    version: 2026.1.1\n    base: docker.io/library/archlinux:latest\n    candy:\n        - paru\n",
    );
    w(
        "candy/paru/charly.yml",
        "candy:\n    version: 2026.1.1\n    name: paru\n    distro:\n        arch:\n            package:\n                - git\n            aur:\n                package:\n                    - paru-bin\n",
    );
    let p = load::load(dir, &LoadOptions::default()).expect("loads");
    let r = resolve::resolve(&p);
    build_merged_plan(
        &p,
        r.get("app").expect("app resolves"),
        &HostContext {
            target: Target::Vm,
            ..HostContext::default()
        },
        &[],
    )
    .expect("plan")
}

/// The aur artifact as the builder stage stores it: the packages it
/// staged in /tmp/aur-pkgs (and a signature, which is no package).
struct AurArts;

impl Artifacts for AurArts {
    fn builder_tar(&self, candy: &str, builder: &str) -> Result<Vec<u8>, String> {
        assert_eq!((candy, builder), ("paru", "aur"));
        use charly_files::artifact::{Entry, Kind, write_tar};
        let e = |path: &str, kind: Kind| Entry {
            path: path.into(),
            kind,
            mode: 0o644,
            uid: 0,
            gid: 0,
        };
        let t = tempfile::NamedTempFile::new().map_err(|e| e.to_string())?;
        write_tar(
            t.path(),
            vec![
                e("tmp/aur-pkgs", Kind::Dir),
                e(
                    "tmp/aur-pkgs/paru-bin-2.0-1-x86_64.pkg.tar.zst",
                    Kind::File(b"zstd package".to_vec()),
                ),
                e(
                    "tmp/aur-pkgs/paru-bin-2.0-1-x86_64.pkg.tar.zst.sig",
                    Kind::File(b"sig".to_vec()),
                ),
            ],
            None,
        )
        .map_err(|e| e.to_string())?;
        std::fs::read(t.path()).map_err(|e| e.to_string())
    }
    fn local_packages(&self, _: &str, _: &str) -> Result<Vec<(String, Vec<u8>)>, String> {
        Err("no local packages".into())
    }
    fn candy_file(&self, _: &str, _: &str) -> Result<Vec<u8>, String> {
        Err("no files".into())
    }
}

/// An aur builder on a pacman host: the packages the builder stage made
/// (from the store) are copied to a staging directory on the target,
/// named with `pacman -Qqp` and installed with `pacman -U`; the removal of
/// the new ones is recorded first, as the step's `package-remove` op (the
/// conformance check), and `del` removes them.
#[test]
fn aur_packages_are_copied_to_a_pacman_host_installed_and_removed() {
    let t = tempfile::tempdir().expect("tmp");
    let plan = arch_plan(&t.path().join("p"));
    let aur = plan
        .steps
        .iter()
        .position(
            |s| matches!(&s.data, charly_rules::plan::StepData::Builder(b) if b.builder == "aur"),
        )
        .expect("an aur builder step");
    let mut host = MemHost::new("user", 1000);
    host.files
        .insert("/tmp".into(), MemNode::Dir { mode: 0o1777 });
    host.binaries.insert("pacman".into());
    host.on("pacman -Qqp", Response::ok("paru-bin\n"));
    // Nothing installed before; git, then paru-bin, after their installs.
    for out in [
        "",
        "git 2.45-1\n",
        "git 2.45-1\n",
        "git 2.45-1\nparu-bin 2.0-1\n",
    ] {
        host.once("-c 'pacman -Q'", Response::ok(out));
    }
    host.on("pacman -Q --", Response::ok("git 2.45-1\nparu-bin 2.0-1\n"));
    let original = host.clone();
    let user = walk::resolve_user(&mut host, "user", &plan).expect("user");
    let mut ledger = Ledger::open(&t.path().join("ledger")).expect("ledger");
    let rec = record("aur", &plan, &user, "mem");
    let opts = Options {
        gates: Gates::all(),
        target: Target::Vm,
        ..Options::default()
    };
    // A dry run says what it would upload and run, and does neither.
    let dry = walk::apply(
        &mut host.clone(),
        None,
        &rec,
        &plan,
        &user,
        &AurArts,
        &Options {
            dry_run: true,
            ..opts.clone()
        },
        &mut |_| {},
    )
    .expect("dry run");
    let acts = dry.steps[aur].actions.join("\n");
    assert!(
        acts.contains("upload 1 aur package(s)")
            && acts.contains("pacman -U --noconfirm -- /tmp/charly-aur-aur-"),
        "{acts}"
    );
    let report = walk::apply(
        &mut host,
        Some(&mut ledger),
        &rec,
        &plan,
        &user,
        &AurArts,
        &opts,
        &mut |_| {},
    )
    .expect("apply");
    assert_eq!(
        report.steps[aur].state, "complete",
        "{:?}",
        report.steps[aur]
    );
    let dir = format!("/tmp/charly-aur-aur-{aur}");
    let written: Vec<&String> = host
        .log
        .iter()
        .filter(|l| l.starts_with("write "))
        .collect();
    assert_eq!(
        written,
        [&format!("write {dir}/paru-bin-2.0-1-x86_64.pkg.tar.zst")],
        "the package is shipped, the signature is not"
    );
    let install = host
        .commands()
        .into_iter()
        .find(|c| c.contains("pacman -U"))
        .expect("pacman -U ran")
        .to_string();
    assert!(
        install.contains(&format!(
            "pacman -U --noconfirm -- {dir}/paru-bin-2.0-1-x86_64.pkg.tar.zst"
        )),
        "{install}"
    );
    assert!(
        !host.files.keys().any(|k| k.starts_with(&dir)),
        "the staging directory is gone"
    );
    let steps = ledger.steps("aur").expect("steps");
    let st = steps
        .iter()
        .find(|s| s.seq as usize == aur)
        .expect("recorded");
    assert!(
        st.undo.iter().any(|(_, u)| matches!(u,
            charly_deploy::ledger::Undo::RemovePackages { format, packages, .. }
                if format == "pac" && packages == &["paru-bin".to_string()])),
        "{:?}",
        st.undo
    );
    assert!(st.facts.iter().any(|f| matches!(f,
        charly_deploy::ledger::Fact::Packages { format, packages, .. }
            if format == "pac" && packages == &["paru-bin".to_string()])));
    let (kinds, _) = reverse_ops_are_what_was_recorded(&plan, &steps, &user.home, false);
    assert!(kinds.contains("builder"), "{kinds:?}");
    let runs = del_runs(&mut host, &mut ledger, "aur", "pacman -R");
    assert!(
        runs.iter()
            .any(|r| r.contains("pacman -R --noconfirm -- paru-bin")),
        "{runs:#?}"
    );
    assert_eq!(host.files, original.files);
}

/// An aur builder on a host without pacman is refused before any change,
/// naming the step and the host's package format; a rooted target skips
/// it (installing packages would touch the real system).
#[test]
fn aur_on_a_host_without_pacman_is_refused_naming_its_package_format() {
    let t = tempfile::tempdir().expect("tmp");
    let plan = arch_plan(&t.path().join("p"));
    let mut host = MemHost::new("user", 1000);
    let user = walk::resolve_user(&mut host, "user", &plan).expect("user");
    let mut ledger = Ledger::open(&t.path().join("ledger")).expect("ledger");
    let before = host.log.len();
    let err = walk::apply(
        &mut host,
        Some(&mut ledger),
        &record("aur", &plan, &user, "mem"),
        &plan,
        &user,
        &AurArts,
        &Options {
            gates: Gates::all(),
            target: Target::Vm,
            ..Options::default()
        },
        &mut |_| {},
    )
    .expect_err("refused");
    let text = err.to_string();
    assert!(matches!(err, WalkError::Setup(_)), "{text}");
    assert!(
        text.contains("aur packages are Arch packages")
            && text.contains("its packages are deb packages (dpkg-query)")
            && text.contains("paru: builder aur builder artifact"),
        "{text}"
    );
    assert!(
        host.log[before..]
            .iter()
            .all(|l| !l.starts_with("run ") && !l.starts_with("write ")),
        "nothing ran: {:#?}",
        &host.log[before..]
    );
    assert!(
        ledger.get("aur").expect("get").is_none(),
        "nothing recorded"
    );

    // A rooted target never installs packages: the step is skipped, saying so.
    let root = t.path().join("root");
    std::fs::create_dir_all(&root).expect("root");
    let mut local = LocalHost::rooted(&root).expect("rooted");
    let user = walk::resolve_user(&mut local, "user", &plan).expect("user");
    let rep = walk::apply(
        &mut local,
        None,
        &record("aur", &plan, &user, "local"),
        &plan,
        &user,
        &AurArts,
        &Options {
            gates: Gates::all(),
            dry_run: true,
            ..Options::default()
        },
        &mut |_| {},
    )
    .expect("dry run on a rooted target");
    let step = rep
        .steps
        .iter()
        .find(|s| s.title.contains("aur builder"))
        .expect("aur step");
    assert_eq!(step.state, "skipped");
    assert!(
        step.note
            .as_deref()
            .unwrap_or("")
            .contains("installing aur packages"),
        "{step:?}"
    );
}

// ---------------------------------------------------------------------
// Undo and sharing, rule by rule: each test below pins one rule of
// `walk::undo` that mutation testing (docs/mutants.md) found unguarded.

/// Applies `plan` as bundle `name` of ledger user `owner` on the one
/// in-memory target `mem`.
fn apply_owned(
    host: &mut MemHost,
    ledger: &mut Ledger,
    name: &str,
    owner: &str,
    plan: &InstallPlan,
    arts: &dyn Artifacts,
) {
    let user = walk::resolve_user(host, "user", plan).expect("user");
    let mut rec = record(name, plan, &user, "mem");
    rec.user = owner.into();
    walk::apply(
        host,
        Some(ledger),
        &rec,
        plan,
        &user,
        arts,
        &Options {
            target: Target::Vm,
            gates: Gates::all(),
            ..Options::default()
        },
        &mut |_| {},
    )
    .expect("apply");
}

/// The example's plan with `steps` only, as bundle `name`'s.
fn plan_with(name: &str, steps: Vec<charly_rules::plan::InstallStep>) -> InstallPlan {
    let (p, r) = open();
    let mut pl = plan(&p, &r);
    pl.deploy_id = format!("id-{name}");
    pl.steps = steps;
    pl
}

/// The example's builder-artifact step (its npm prefix).
fn artifact_step() -> charly_rules::plan::InstallStep {
    let (p, r) = open();
    plan(&p, &r)
        .steps
        .into_iter()
        .find(|s| matches!(s.data, charly_rules::plan::StepData::Builder(_)))
        .expect("the example has a builder step")
}

/// Builder artifacts holding `.npm-global` and, below it, `files` (each
/// with its own name as content).
struct TreeArts(&'static [&'static str]);

impl Artifacts for TreeArts {
    fn builder_tar(&self, _candy: &str, _builder: &str) -> Result<Vec<u8>, String> {
        use charly_files::artifact::{Entry, Kind, write_tar};
        let mut entries = vec![Entry {
            path: "home/user/.npm-global".into(),
            kind: Kind::Dir,
            mode: 0o755,
            uid: 1000,
            gid: 1000,
        }];
        for f in self.0 {
            entries.push(Entry {
                path: format!("home/user/.npm-global/{f}"),
                kind: Kind::File(f.as_bytes().to_vec()),
                mode: 0o644,
                uid: 1000,
                gid: 1000,
            });
        }
        let t = tempfile::NamedTempFile::new().map_err(|e| e.to_string())?;
        write_tar(t.path(), entries, None).map_err(|e| e.to_string())?;
        std::fs::read(t.path()).map_err(|e| e.to_string())
    }
    fn local_packages(&self, candy: &str, format: &str) -> Result<Vec<(String, Vec<u8>)>, String> {
        TestArts.local_packages(candy, format)
    }
    fn candy_file(&self, candy: &str, rel: &str) -> Result<Vec<u8>, String> {
        TestArts.candy_file(candy, rel)
    }
}

fn del_reports(host: &mut MemHost, ledger: &mut Ledger, name: &str) -> Vec<walk::UndoReport> {
    walk::remove(host, ledger, name, false, &mut |_| {}).expect("del")
}

/// The report of the undo operation whose description contains `what`.
fn report_of<'a>(reports: &'a [walk::UndoReport], what: &str) -> &'a walk::UndoReport {
    reports
        .iter()
        .find(|r| r.what.contains(what))
        .unwrap_or_else(|| panic!("no report on {what}: {reports:#?}"))
}

/// A dry-run `del` changes nothing, not even the bundle's state in the
/// ledger or a dead writer's temp file; the real `del` sweeps that temp
/// file away with the bundle.
#[test]
fn a_dry_run_del_changes_nothing_and_the_real_one_sweeps_dead_temps() {
    let t = tempfile::tempdir().expect("tmp");
    let root = t.path().join("root");
    std::fs::create_dir_all(root.join("etc")).expect("mkdir");
    std::fs::write(
        root.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\n",
    )
    .expect("passwd");
    std::fs::create_dir_all(root.join("home/user")).expect("home");
    let mut host = LocalHost::rooted(&root).expect("rooted");
    let pl = plan_with("a", vec![write_step("a", "/etc/app.conf", "x\n")]);
    let user = walk::resolve_user(&mut host, "user", &pl).expect("user");
    let mut ledger = Ledger::open(&t.path().join("ledger")).expect("ledger");
    let rec = record("a", &pl, &user, "local:test");
    walk::apply(
        &mut host,
        Some(&mut ledger),
        &rec,
        &pl,
        &user,
        &TestArts,
        &Options {
            gates: Gates::all(),
            ..Options::default()
        },
        &mut |_| {},
    )
    .expect("apply");
    // What a killed charly leaves: a temp file nobody holds the lock of.
    let temp = root.join("etc/.charly-tmp-999999-1");
    std::fs::write(&temp, "half").expect("temp");
    let state = |l: &Ledger| l.get("a").expect("get").map(|r| r.state);
    let applied = state(&ledger);
    let before = tree(&root);

    let dry = walk::remove(&mut host, &mut ledger, "a", true, &mut |_| {}).expect("dry run");
    assert!(
        !dry.is_empty() && dry.iter().all(|r| r.state == "would-run"),
        "{dry:#?}"
    );
    assert_eq!(tree(&root), before, "a dry run touches nothing");
    assert_eq!(state(&ledger), applied, "nor the ledger");

    del_reports_local(&mut host, &mut ledger, "a");
    assert!(!temp.exists(), "the real del sweeps the dead temp");
    assert!(!root.join("etc/app.conf").exists());
    assert_eq!(state(&ledger), None);
}

fn del_reports_local(host: &mut LocalHost, ledger: &mut Ledger, name: &str) {
    walk::remove(host, ledger, name, false, &mut |_| {}).expect("del");
}

/// `del --forget` reports every undo operation as not carried out,
/// changes nothing on the target and forgets the bundle.
#[test]
fn forget_reports_every_undo_as_not_done_and_touches_nothing() {
    let mut host = MemHost::new("user", 1000);
    let (_t, mut ledger) = scratch_ledger();
    let pl = plan_with(
        "a",
        vec![
            write_step("a", "/opt/app/a.conf", "a\n"),
            write_step("a", "/etc/a.conf", "a\n"),
        ],
    );
    apply_owned(&mut host, &mut ledger, "a", "user", &pl, &TestArts);
    let undos: Vec<String> = ledger
        .steps("a")
        .expect("steps")
        .iter()
        .rev()
        .flat_map(|s| s.undo.iter().rev().map(|(_, u)| u.describe()))
        .collect();
    assert!(undos.len() >= 3, "two files and a directory: {undos:#?}");
    let files = host.files.clone();
    let log = host.log.len();
    let reports = walk::forget(&mut ledger, "a", &mut |_| {}).expect("forget");
    let got: Vec<(&str, &str)> = reports
        .iter()
        .map(|r| (r.what.as_str(), r.state.as_str()))
        .collect();
    let want: Vec<(&str, &str)> = undos.iter().map(|u| (u.as_str(), "not-undone")).collect();
    assert_eq!(got, want);
    assert_eq!((&host.files, host.log.len()), (&files, log));
    assert!(ledger.get("a").expect("get").is_none());
}

/// A directory bundle a made and bundle b put a file in stays with a's
/// `del` and goes with the `del` after which no bundle needs it, even
/// while unrelated bundles remain; when someone else's file is in it at
/// the end, the last `del` on the target says so and forgets it.
#[test]
fn a_shared_directory_goes_with_the_last_del_that_needs_it() {
    for user_file in [false, true] {
        let mut host = MemHost::new("user", 1000);
        let original = host.files.clone();
        let (_t, mut ledger) = scratch_ledger();
        for (name, path) in [
            ("a", "/opt/app/a.conf"),
            ("b", "/opt/app/b.conf"),
            ("c", "/etc/c.conf"),
        ] {
            let pl = plan_with(name, vec![write_step(name, path, "x\n")]);
            apply_owned(&mut host, &mut ledger, name, "user", &pl, &TestArts);
        }
        let pending = |l: &Ledger| -> Vec<String> {
            l.pending_dirs(&Connection::Local { root: None }.host_key())
                .expect("pending")
                .into_iter()
                .map(|d| d.0)
                .collect()
        };
        let ctx = format!("user_file={user_file}");
        let ra = del_reports(&mut host, &mut ledger, "a");
        let r = report_of(&ra, "/opt/app (if empty)");
        assert_eq!(r.state, "kept", "b still needs it: {ctx} {ra:#?}");
        assert!(host.files.contains_key("/opt/app"), "{ctx}");
        assert_eq!(pending(&ledger), ["/opt/app", "/opt"], "{ctx}");
        if user_file {
            host.files.insert(
                "/opt/app/mine".into(),
                MemNode::File {
                    data: b"mine".to_vec(),
                    mode: 0o644,
                    uid: 0,
                    gid: 0,
                },
            );
        }
        let rb = del_reports(&mut host, &mut ledger, "b");
        let about_dir: Vec<_> = rb
            .iter()
            .filter(|r| r.what.contains("(if empty)"))
            .collect();
        if user_file {
            // Not empty, and c is still there: left for the last del.
            assert!(about_dir.is_empty(), "{ctx} {rb:#?}");
            assert_eq!(pending(&ledger), ["/opt/app", "/opt"], "{ctx}");
        } else {
            assert_eq!(
                about_dir
                    .iter()
                    .map(|r| r.state.as_str())
                    .collect::<Vec<_>>(),
                ["done", "done"],
                "{ctx} {rb:#?}"
            );
            assert!(pending(&ledger).is_empty(), "{ctx}");
            assert!(!host.files.contains_key("/opt"), "{ctx}");
        }
        let rc = del_reports(&mut host, &mut ledger, "c");
        assert!(pending(&ledger).is_empty(), "{ctx}");
        if user_file {
            let r = report_of(&rc, "/opt/app (if empty)");
            assert_eq!(r.state, "warning", "{ctx}");
            assert!(
                r.note.as_deref().is_some_and(|n| n.contains("not empty")),
                "{ctx} {r:#?}"
            );
            for p in ["/opt/app/mine", "/opt/app", "/opt"] {
                host.files.remove(p);
            }
        } else {
            assert!(rc.iter().all(|r| !r.what.contains("/opt")), "{rc:#?}");
        }
        assert_eq!(host.files, original, "{ctx}");
    }
}

/// A package only the deleted bundle asked for goes with it, even when
/// other bundles (with other packages) stay on the target.
#[test]
fn a_package_no_other_bundle_needs_goes_while_others_stay() {
    use charly_rules::plan::{InstallStep, Phase, SystemPackages};
    let pkg = |name: &str, p: &str| {
        plan_with(
            name,
            vec![InstallStep::system_packages(
                name,
                Phase::Install,
                SystemPackages {
                    format: "deb".into(),
                    packages: vec![p.into()],
                    ..Default::default()
                },
                None,
            )],
        )
    };
    let mut host = MemHost::new("user", 1000);
    // Each install queries before and after: jq comes with a, curl with b.
    host.once("dpkg-query", Response::ok(""));
    host.once("dpkg-query", Response::ok("jq\tii \n"));
    host.once("dpkg-query", Response::ok("jq\tii \n"));
    host.on("dpkg-query", Response::ok("jq\tii \ncurl\tii \n"));
    let (_t, mut ledger) = scratch_ledger();
    apply_owned(
        &mut host,
        &mut ledger,
        "a",
        "user",
        &pkg("a", "jq"),
        &TestArts,
    );
    apply_owned(
        &mut host,
        &mut ledger,
        "b",
        "user",
        &pkg("b", "curl"),
        &TestArts,
    );
    let purged = del_runs(&mut host, &mut ledger, "a", "apt-get purge");
    assert!(
        purged.len() == 1 && purged[0].contains("jq") && !purged[0].contains("curl"),
        "{purged:#?}"
    );
}

/// Every undo of a bundle is carried out cleanly when nothing on the
/// target is shared, alone there or beside another bundle: each report is
/// `done`, with no note (a directory removed is not "not empty"; an
/// artifact's entries all went).
#[test]
fn a_plain_del_reports_every_undo_done() {
    for beside in [false, true] {
        let mut host = MemHost::new("user", 1000);
        let original = host.files.clone();
        let (_t, mut ledger) = scratch_ledger();
        let pl = plan_with(
            "a",
            vec![write_step("a", "/opt/app/a.conf", "a\n"), artifact_step()],
        );
        apply_owned(
            &mut host,
            &mut ledger,
            "a",
            "user",
            &pl,
            &TreeArts(&["x", "y"]),
        );
        if beside {
            // b shares nothing with a, but is there.
            let pb = plan_with("b", vec![write_step("b", "/etc/b.conf", "b\n")]);
            apply_owned(&mut host, &mut ledger, "b", "user", &pb, &TestArts);
        }
        let reports = del_reports(&mut host, &mut ledger, "a");
        assert!(
            reports.iter().any(|r| r.what.contains(".npm-global"))
                && reports
                    .iter()
                    .any(|r| r.what.contains("/opt/app (if empty)")),
            "{reports:#?}"
        );
        for r in &reports {
            assert_eq!(
                (r.state.as_str(), &r.note),
                ("done", &None),
                "beside={beside}: {r:#?}"
            );
        }
        if beside {
            let rb = del_reports(&mut host, &mut ledger, "b");
            assert!(rb.iter().all(|r| r.state == "done"), "{rb:#?}");
        }
        assert_eq!(host.files, original, "beside={beside}");
    }
}

/// An artifact directory holding a file that is not the artifact's: the
/// `del` removes every entry it can and says how many directories it left.
#[test]
fn an_artifact_directory_with_a_foreign_file_is_left_and_said() {
    let mut host = MemHost::new("user", 1000);
    let (_t, mut ledger) = scratch_ledger();
    let pl = plan_with("a", vec![artifact_step()]);
    apply_owned(&mut host, &mut ledger, "a", "user", &pl, &TreeArts(&["x"]));
    host.files.insert(
        "/home/user/.npm-global/mine".into(),
        MemNode::File {
            data: b"mine".to_vec(),
            mode: 0o644,
            uid: 1000,
            gid: 1000,
        },
    );
    let reports = del_reports(&mut host, &mut ledger, "a");
    let r = report_of(&reports, ".npm-global");
    assert_eq!(r.state, "warning", "{reports:#?}");
    assert_eq!(
        r.note.as_deref(),
        Some("1 directories were not empty; left in place")
    );
    assert!(!host.files.contains_key("/home/user/.npm-global/x"));
    assert!(host.files.contains_key("/home/user/.npm-global/mine"));
}

/// A managed block added to a file that already ended in a newline: the
/// `del` gives the file back byte for byte (its newline included).
#[test]
fn a_managed_block_in_a_file_ending_in_a_newline_is_taken_out_exactly() {
    use charly_rules::plan::{InstallStep, ShellSnippetStep};
    let mut host = MemHost::new("user", 1000);
    host.files.insert(
        "/home/user/.bashrc".into(),
        MemNode::File {
            data: b"alias ll='ls -l'\n".to_vec(),
            mode: 0o644,
            uid: 1000,
            gid: 1000,
        },
    );
    let original = host.files.clone();
    let (_t, mut ledger) = scratch_ledger();
    let pl = plan_with(
        "a",
        vec![InstallStep::shell_snippet(
            "a",
            ShellSnippetStep {
                shell: "bash".into(),
                text: "export A=1\n".into(),
                destination: "/home/user/.bashrc".into(),
                managed_block: true,
                path: Vec::new(),
            },
        )],
    );
    apply_owned(&mut host, &mut ledger, "a", "user", &pl, &TestArts);
    assert_ne!(host.files, original);
    del_reports(&mut host, &mut ledger, "a");
    assert_eq!(host.files, original);
}

/// The file a managed block goes into stays when it holds anything but
/// the block, or was there before (even empty): only a file charly made
/// for the block and nothing else went into goes with it.
#[test]
fn a_managed_blocks_file_goes_only_when_charly_made_it_and_it_is_empty() {
    use charly_rules::plan::{InstallStep, ShellSnippetStep};
    let rc = "/home/user/.bashrc";
    let text = |h: &MemHost| match h.files.get(rc) {
        Some(MemNode::File { data, .. }) => Some(String::from_utf8_lossy(data).into_owned()),
        _ => None,
    };
    // (what was there, what the user adds after the deploy, what is left)
    let cases: [(Option<&str>, &str, Option<&str>); 3] = [
        (None, "", None),
        (Some(""), "", Some("")),
        (None, "alias x=1\n", Some("alias x=1\n")),
    ];
    for (before, added, left) in cases {
        let mut host = MemHost::new("user", 1000);
        if let Some(b) = before {
            host.files.insert(
                rc.into(),
                MemNode::File {
                    data: b.as_bytes().to_vec(),
                    mode: 0o644,
                    uid: 1000,
                    gid: 1000,
                },
            );
        }
        let (_t, mut ledger) = scratch_ledger();
        let pl = plan_with(
            "a",
            vec![InstallStep::shell_snippet(
                "a",
                ShellSnippetStep {
                    shell: "bash".into(),
                    text: "export A=1\n".into(),
                    destination: rc.into(),
                    managed_block: true,
                    path: Vec::new(),
                },
            )],
        );
        apply_owned(&mut host, &mut ledger, "a", "user", &pl, &TestArts);
        let now = text(&host).expect("the block's file");
        if let Some(MemNode::File { data, .. }) = host.files.get_mut(rc) {
            *data = format!("{now}{added}").into_bytes();
        }
        del_reports(&mut host, &mut ledger, "a");
        assert_eq!(
            text(&host).as_deref(),
            left,
            "before {before:?}, added {added:?}"
        );
    }
}

/// Two bundles set capabilities on one file, one after the other: the
/// first one's `del` leaves them (the second still needs its own), and
/// the second's puts back what was there before either.
#[test]
fn capabilities_two_bundles_set_are_put_back_by_the_last_del() {
    let step = |candy: &str, caps: &str| {
        charly_rules::plan::InstallStep::op(
            candy,
            charly_rules::plan::OpStep {
                verb: "setcap".into(),
                value: "/usr/bin/ping".into(),
                user: "root".into(),
                caps: Some(caps.into()),
                ..charly_rules::plan::OpStep::default()
            },
        )
    };
    let mut host = MemHost::new("user", 1000);
    host.once("getcap /usr/bin/ping", Response::ok(""));
    host.on(
        "getcap /usr/bin/ping",
        Response::ok("/usr/bin/ping cap_net_raw=ep\n"),
    );
    let (_t, mut ledger) = scratch_ledger();
    let pa = plan_with("a", vec![step("a", "cap_net_raw+ep")]);
    let pb = plan_with("b", vec![step("b", "cap_net_admin+ep")]);
    apply_owned(&mut host, &mut ledger, "a", "user", &pa, &TestArts);
    apply_owned(&mut host, &mut ledger, "b", "user", &pb, &TestArts);
    let first = del_runs(&mut host, &mut ledger, "a", "setcap");
    assert!(first.is_empty(), "b's capabilities stay: {first:#?}");
    let last = del_runs(&mut host, &mut ledger, "b", "setcap");
    assert!(
        last.len() == 1 && last[0].contains("setcap -r /usr/bin/ping"),
        "{last:#?}"
    );
}

/// A system service two bundles of two different users enable is one
/// thing on the target: the first `del` leaves it enabled.
#[test]
fn a_system_service_is_shared_across_the_bundles_users() {
    use charly_rules::plan::{InstallStep, Scope, ServicePackagedStep};
    let svc = |name: &str| {
        plan_with(
            name,
            vec![InstallStep::service_packaged(
                name,
                Scope::System,
                ServicePackagedStep {
                    name: "sshd".into(),
                    unit: "sshd.service".into(),
                    enable: true,
                },
            )],
        )
    };
    let mut host = MemHost::new("user", 1000);
    host.once("is-enabled", Response::ok("disabled inactive\n"));
    host.on("is-enabled", Response::ok("enabled active\n"));
    let (_t, mut ledger) = scratch_ledger();
    apply_owned(&mut host, &mut ledger, "a", "user", &svc("a"), &TestArts);
    apply_owned(&mut host, &mut ledger, "b", "other", &svc("b"), &TestArts);
    let first = del_runs(&mut host, &mut ledger, "a", "systemctl disable");
    assert!(first.is_empty(), "b still needs sshd: {first:#?}");
    let last = del_runs(&mut host, &mut ledger, "b", "systemctl disable");
    assert_eq!(last.len(), 1, "{last:#?}");
}

/// A file two bundles' artifacts both extract, and a file of the first
/// artifact the second bundle writes over: whatever the `del` order, each
/// `del` leaves what the other still has, and the last leaves the target
/// as it was (no entry of either artifact behind).
#[test]
fn artifacts_and_files_over_them_go_with_the_last_del() {
    let cases: [(&str, &[&str], &[&str], bool); 3] = [
        // b writes over a's artifact file x.
        ("write over", &["x", "y"], &[], true),
        // b's artifact holds a's x and one more.
        ("two artifacts", &["x"], &["x", "z"], false),
        // a writes x, then b's artifact holds it and one more.
        ("artifact over a file", &[], &["x", "z"], false),
    ];
    for (what, a_files, b_files, b_writes) in cases {
        for b_first in [false, true] {
            let mut host = MemHost::new("user", 1000);
            let original = host.files.clone();
            let (_t, mut ledger) = scratch_ledger();
            let x = "/home/user/.npm-global/x";
            let pa = if a_files.is_empty() {
                plan_with("a", vec![write_step("a", x, "from a\n")])
            } else {
                plan_with("a", vec![artifact_step()])
            };
            let pb = if b_writes {
                plan_with("b", vec![write_step("b", x, "from b\n")])
            } else {
                plan_with("b", vec![artifact_step()])
            };
            apply_owned(&mut host, &mut ledger, "a", "user", &pa, &TreeArts(a_files));
            apply_owned(&mut host, &mut ledger, "b", "user", &pb, &TreeArts(b_files));
            let after_b = host.files.clone();
            let (first, second) = if b_first { ("b", "a") } else { ("a", "b") };
            let ctx = format!("{what}, {first} first");
            let r1 = del_reports(&mut host, &mut ledger, first);
            if !b_first {
                // b's content of everything is still there.
                for (p, n) in &after_b {
                    if p.starts_with("/home/user/.npm-global/")
                        && b_files.iter().any(|f| p.ends_with(f))
                        || (b_writes && p == x)
                    {
                        assert_eq!(host.files.get(p), Some(n), "{ctx}: {p} {r1:#?}");
                    }
                }
            }
            let r2 = del_reports(&mut host, &mut ledger, second);
            assert_eq!(host.files, original, "{ctx}: {r1:#?} {r2:#?}");
        }
    }
}

/// A path the user removed after bundle a made it, which bundle b's
/// artifact then brought back with other entries: b's removal of its
/// artifact covers it, so a's `del` leaves it (and everything b brought)
/// to b, and b's `del` takes all of it out.
#[test]
fn a_path_another_bundles_artifact_brought_back_is_left_to_that_artifact() {
    let dir = "/home/user/.npm-global";
    let x = "/home/user/.npm-global/x";
    // a writes x alone, or extracts an artifact holding x and y.
    for a_artifact in [false, true] {
        let mut host = MemHost::new("user", 1000);
        let original = host.files.clone();
        let (_t, mut ledger) = scratch_ledger();
        let pa = if a_artifact {
            plan_with("a", vec![artifact_step()])
        } else {
            plan_with("a", vec![write_step("a", x, "from a\n")])
        };
        apply_owned(
            &mut host,
            &mut ledger,
            "a",
            "user",
            &pa,
            &TreeArts(&["x", "y"]),
        );
        // The user removes x; b's artifact brings it back with z.
        host.files.remove(x);
        let pb = plan_with("b", vec![artifact_step()]);
        apply_owned(
            &mut host,
            &mut ledger,
            "b",
            "user",
            &pb,
            &TreeArts(&["x", "z"]),
        );
        let of_b: BTreeMap<String, MemNode> = host
            .files
            .iter()
            .filter(|(p, _)| p.as_str() == x || p.ends_with("/z"))
            .map(|(p, n)| (p.clone(), n.clone()))
            .collect();
        assert_eq!(of_b.len(), 2);
        let ctx = format!("a_artifact={a_artifact}");
        let ra = del_reports(&mut host, &mut ledger, "a");
        for (p, n) in &of_b {
            assert_eq!(host.files.get(p), Some(n), "{ctx}: {p} {ra:#?}");
        }
        assert!(host.files.contains_key(dir), "{ctx}");
        let rb = del_reports(&mut host, &mut ledger, "b");
        assert_eq!(host.files, original, "{ctx}: {ra:#?} {rb:#?}");
    }
}

/// Deleting the bundle that changed a file last puts back what the bundle
/// before it left, and says whose that is.
#[test]
fn putting_back_another_bundles_content_says_whose_it_is() {
    let mut host = MemHost::new("user", 1000);
    let (_t, mut ledger) = scratch_ledger();
    for name in ["a", "b"] {
        let pl = plan_with(name, vec![write_step(name, "/etc/shared.conf", name)]);
        apply_owned(&mut host, &mut ledger, name, "user", &pl, &TestArts);
    }
    let rb = del_reports(&mut host, &mut ledger, "b");
    let r = report_of(&rb, "/etc/shared.conf");
    assert_eq!(
        (r.state.as_str(), r.note.as_deref()),
        (
            "warning",
            Some("bundle a changed it before this one: what it left is put back")
        ),
        "{rb:#?}"
    );
    assert!(matches!(
        host.files.get("/etc/shared.conf"),
        Some(MemNode::File { data, .. }) if data == b"a"
    ));
}
