//! End to end: builder stages run as REAPI actions on a real engine
//! (buildbox-casd + buildbox-run, bubblewrap sandbox, no host directories
//! bound in) with the builder image's root filesystem as the input root
//! (`--remote-stage-rootfs`). The artifact is byte for byte the one the
//! podman runner builds from the same stage locally; a second runner gets
//! it from the ActionCache without executing; a stage that fails remotely
//! is reported with its node and action and leaves no artifact; a stage the
//! interpreter cannot run is refused with its line, or runs locally with
//! `--remote-fallback`.

use charly_testutil::casd as common_reapi;

use charly_engine::reapi::stage::StageMode;
use charly_engine::runners::fake::FakeRunner;
use charly_engine::runners::podman::PodmanRunner;
use charly_engine::runners::remote::{Place, RemoteOptions, RemoteRunner};
use charly_engine::runners::{
    ExportedImage, LayerRequest, LayerResult, LocalPkgRequest, RootfsRequest, RunError, Runner,
    StageRequest,
};
use std::path::Path;

const BUILDER: &str = "localhost/charly-stage-builder:1";

/// Like a rendered stage template: WORKDIR, ENV, COPY (a file with
/// --chown, a directory, an executable), USER switches, a cache mount, a
/// symlink, an environment value from the image and HOME from passwd.
fn stage_text(run_extra: &str) -> String {
    format!(
        r#"FROM {BUILDER} AS stage-demo
USER root
WORKDIR /work
ENV OUT=/tmp/out CACHE=/tmp/demo-cache
COPY --chown=1000:1000 candy/demo/package.json /tmp/charly-demo/package.json
COPY candy/demo/data ./data/
COPY candy/demo/tool /usr/local/bin/
# Give the output to the box user first, as the npm stage gives its home:
# a sandbox that cannot chown leaves owners alone (shims), the artifact's
# owner is set when it is written.
RUN mkdir -p /tmp/out/owned && chown -R 1000:1000 /tmp/out && chgrp 1000 /tmp/out
# Build as the box user, like the npm and pixi stages.
USER 1000
RUN --mount=type=cache,dst=/tmp/demo-cache,uid=1000,gid=1000 mkdir -p "$OUT/bin" && \
    cp /tmp/charly-demo/package.json "$OUT/" && \
    echo "$GREETING from $(pwd), home $HOME" > "$OUT/greeting" && \
    cp -R data "$OUT/" && tool > "$OUT/tool.out" && \
    printf '#!/bin/sh\necho hi\n' > "$OUT/bin/hi" && chmod 755 "$OUT/bin/hi" && \
    ln -s bin/hi "$OUT/link" && echo junk > "$CACHE/junk"{run_extra}
LABEL org.example.demo=1
"#
    )
}

fn context(root: &Path) {
    use std::os::unix::fs::PermissionsExt;
    charly_testutil::write(root, "candy/demo/package.json", "{\"name\":\"demo\"}\n");
    charly_testutil::write(root, "candy/demo/data/a.txt", "a\n");
    charly_testutil::write(root, "candy/demo/data/sub/b.txt", "b\n");
    charly_testutil::write(root, "candy/demo/tool", "#!/bin/sh\necho tool ran\n");
    for (p, mode) in [
        ("candy/demo/package.json", 0o644),
        ("candy/demo/data/a.txt", 0o644),
        ("candy/demo/data/sub/b.txt", 0o644),
        ("candy/demo/tool", 0o755),
    ] {
        std::fs::set_permissions(root.join(p), std::fs::Permissions::from_mode(mode))
            .expect("chmod");
    }
}

fn request(dir: &Path, ctx: &Path, node: &str, text: String) -> StageRequest<'static> {
    StageRequest {
        log: Default::default(),
        node: node.to_string(),
        key: blake3::hash(text.as_bytes()).to_hex().to_string(),
        containerfile: text,
        context: ctx.to_path_buf(),
        builder_image: BUILDER.to_string(),
        export: vec!["/tmp/out/".to_string()],
        owner: (1000, 1000),
        out: dir.join(format!("{node}.tar")),
    }
}

fn opts(fallback: bool) -> RemoteOptions {
    RemoteOptions {
        jobs: 2,
        fallback,
        image_property: false,
        stage_rootfs: true,
        ..RemoteOptions::default()
    }
}

fn names(tar: &[u8]) -> Vec<String> {
    charly_files::artifact::read_tar(tar, "")
        .expect("artifact tar")
        .into_iter()
        .map(|e| e.path)
        .collect()
}

fn setup(dir: &Path) -> PodmanRunner {
    let ctx = dir.join("ctx");
    context(&ctx);
    common_reapi::podman_with_image(
        dir,
        BUILDER,
        &[
            "ENV GREETING=hello",
            "ENV PATH=/usr/local/bin:/bin",
            "WORKDIR /srv",
        ],
    )
}

/// A test's world: a scratch directory with the build context, podman
/// with the builder image, and an engine with nothing bound in.
struct World {
    _tmp: tempfile::TempDir,
    dir: std::path::PathBuf,
    ctx: std::path::PathBuf,
    podman: PodmanRunner,
    casd: common_reapi::Casd,
}

fn world() -> Option<World> {
    if !common_reapi::available() || !charly_testutil::podman_available() {
        return None;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().to_path_buf();
    let podman = setup(&dir);
    Some(World {
        ctx: dir.join("ctx"),
        dir,
        podman,
        casd: common_reapi::start_with(2, &[]),
        _tmp: tmp,
    })
}

#[test]
fn a_builder_stage_runs_remotely_like_podman_and_hits_the_action_cache() {
    let Some(World {
        dir,
        ctx,
        podman,
        casd,
        _tmp,
    }) = world()
    else {
        return;
    };
    let dir = dir.as_path();

    // The reference: podman builds the stage.
    let local_req = request(dir, &ctx, "local", stage_text(""));
    podman
        .build_stage(&local_req)
        .expect("podman runs the stage");
    let local = std::fs::read(&local_req.out).expect("local artifact");

    // The same stage on the engine.
    let remote = RemoteRunner::connect(&casd.url, &podman, opts(false)).expect("connects");
    let remote_req = request(dir, &ctx, "remote", stage_text(""));
    remote.build_stage(&remote_req).expect("runs remotely");
    let got = std::fs::read(&remote_req.out).expect("remote artifact");
    let stats = remote.stats();
    assert_eq!(stats["remote"].place, Place::Remote, "{stats:?}");
    assert!(!stats["remote"].action_digest.is_empty());
    let files = names(&got);
    for want in [
        "tmp/out/greeting",
        "tmp/out/package.json",
        "tmp/out/data/sub/b.txt",
        "tmp/out/tool.out",
        "tmp/out/link",
    ] {
        assert!(files.iter().any(|f| f == want), "{want} in {files:?}");
    }
    let entries = charly_files::artifact::read_tar(&got, "").expect("tar");
    let greeting = entries
        .iter()
        .find(|e| e.path == "tmp/out/greeting")
        .expect("greeting");
    assert_eq!(
        greeting.kind,
        charly_files::artifact::Kind::File(b"hello from /work, home /home/user\n".to_vec())
    );
    assert!(entries.iter().all(|e| (e.uid, e.gid) == (1000, 1000)));
    assert_eq!(
        got,
        local,
        "the remote artifact differs from podman's: remote {files:?}, local {:?}",
        names(&local)
    );

    // A second runner (another machine, a fresh store) gets it from the
    // engine's ActionCache: nothing is executed.
    let again = RemoteRunner::connect(&casd.url, &podman, opts(false)).expect("connects");
    let again_req = request(dir, &ctx, "again", stage_text(""));
    again.build_stage(&again_req).expect("cache hit");
    assert_eq!(again.stats()["again"].place, Place::RemoteCached);
    assert_eq!(
        again.stats()["again"].action_digest,
        stats["remote"].action_digest
    );
    assert_eq!(std::fs::read(&again_req.out).expect("artifact"), local);

    // For engines that run containers, the image is named, not sent: the
    // input root holds only the COPY sources.
    let named = RemoteRunner::connect(
        &casd.url,
        &podman,
        RemoteOptions {
            jobs: 1,
            ..RemoteOptions::default()
        },
    )
    .expect("connects");
    assert_eq!(named.stage_mode(), Some(StageMode::ImageProperty));
    let (cmd, input) = named
        .stage_action(&remote_req, StageMode::ImageProperty)
        .expect("action");
    assert_eq!(
        cmd.platform.get("container-image").map(String::as_str),
        Some(format!("docker://{BUILDER}").as_str())
    );
    let busybox = std::fs::read("/bin/busybox").expect("busybox");
    let busybox = named.client().digest_fn().digest(&busybox).hash;
    let (_, blobs) = input.finish();
    assert!(!blobs.contains_key(&busybox), "the image's files were sent");
    let (_, input) = remote
        .stage_action(&remote_req, StageMode::Rootfs)
        .expect("action");
    assert!(input.finish().1.contains_key(&busybox));
    // Neither property nor root filesystem: stages stay local.
    let plain = RemoteRunner::connect(
        &casd.url,
        &podman,
        RemoteOptions {
            image_property: false,
            ..RemoteOptions::default()
        },
    )
    .expect("connects");
    assert_eq!(plain.stage_mode(), None);

    // For the issue's notes (`-- --nocapture`).
    eprintln!(
        "stage: remote run {} ms (uploaded {} bytes, downloaded {}), action-cache hit {} ms",
        stats["remote"].ms,
        stats["remote"].uploaded_bytes,
        stats["remote"].downloaded_bytes,
        again.stats()["again"].ms
    );
}

/// `--ca-bundle` reaches a stage sent with its image's files, where a
/// local build mounts it: over the image's bundle, and named by the
/// variables npm, OpenSSL, curl and pip read.
#[test]
fn a_ca_bundle_reaches_a_remote_stage() {
    let Some(World {
        dir,
        ctx,
        podman,
        casd,
        _tmp,
    }) = world()
    else {
        return;
    };
    let ca = dir.join("proxy-ca.pem");
    std::fs::write(
        &ca,
        "-----BEGIN CERTIFICATE-----\nproxy\n-----END CERTIFICATE-----\n",
    )
    .expect("ca");
    let text = format!(
        "FROM {BUILDER} AS stage-ca\nUSER root\n\
         RUN mkdir -p /tmp/out && cp \"$SSL_CERT_FILE\" /tmp/out/ca && \
         cp /etc/ssl/certs/ca-certificates.crt /tmp/out/bundle && \
         echo \"$NODE_EXTRA_CA_CERTS $npm_config_cafile\" > /tmp/out/env\n"
    );
    let remote = RemoteRunner::connect(
        &casd.url,
        &podman,
        RemoteOptions {
            ca_bundle: Some(ca.clone()),
            ..opts(false)
        },
    )
    .expect("connects");
    let req = request(&dir, &ctx, "ca", text);
    remote.build_stage(&req).expect("runs remotely");
    let entries =
        charly_files::artifact::read_tar(&std::fs::read(&req.out).expect("tar"), "").expect("tar");
    let file = |p: &str| match &entries.iter().find(|e| e.path == p).expect(p).kind {
        charly_files::artifact::Kind::File(b) => String::from_utf8_lossy(b).into_owned(),
        k => panic!("{p}: {k:?}"),
    };
    let want = std::fs::read_to_string(&ca).expect("ca");
    assert_eq!(file("tmp/out/ca"), want);
    assert_eq!(file("tmp/out/bundle"), want);
    assert_eq!(
        file("tmp/out/env"),
        "/etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt\n"
    );
}

#[test]
fn stage_failures_name_node_and_action_and_leave_no_artifact() {
    let Some(World {
        dir,
        ctx,
        podman,
        casd,
        _tmp,
    }) = world()
    else {
        return;
    };
    let dir = dir.as_path();

    // The command fails on the engine: never a fallback, never stored.
    let remote = RemoteRunner::connect(&casd.url, &podman, opts(true)).expect("connects");
    let req = request(
        dir,
        &ctx,
        "failing",
        stage_text(" && echo 'demo broke' >&2 && false"),
    );
    let e = remote.build_stage(&req).expect_err("fails").to_string();
    assert!(e.contains("failing"), "{e}");
    assert!(e.contains("action "), "{e}");
    assert!(
        e.contains("demo broke"),
        "the command's stderr is shown: {e}"
    );
    assert!(!req.out.exists());

    // A Containerfile the interpreter cannot run is refused up front with
    // its line, and runs locally when fallback is allowed.
    let text = stage_text("").replace("USER root\n", "USER root\nARG VERSION=1\n");
    let strict = RemoteRunner::connect(&casd.url, &podman, opts(false)).expect("connects");
    let req = request(dir, &ctx, "unsupported", text.clone());
    let e = strict.build_stage(&req).expect_err("refused").to_string();
    assert!(e.contains("line 3: ARG is not supported"), "{e}");
    assert!(!req.out.exists());
    let req = request(dir, &ctx, "fallback", text);
    remote.build_stage(&req).expect("runs locally");
    let stats = remote.stats();
    assert_eq!(stats["fallback"].place, Place::LocalFallback);
    assert!(
        stats["fallback"]
            .fallback_reason
            .as_deref()
            .is_some_and(|r| r.contains("ARG")),
        "{stats:?}"
    );
    assert!(req.out.exists());
}

/// `--remote-platform` properties reach the engine: buildbox-run runs the
/// action as `unixUID`/`unixGID` (in a user namespace).
#[test]
fn platform_properties_reach_the_engine() {
    let Some(World {
        dir,
        ctx,
        podman,
        casd,
        _tmp,
    }) = world()
    else {
        return;
    };
    let dir = dir.as_path();
    let mut o = opts(false);
    o.platform.insert("unixUID".into(), "1000".into());
    o.platform.insert("unixGID".into(), "1000".into());
    let remote = RemoteRunner::connect(&casd.url, &podman, o).expect("connects");
    let text = format!("FROM {BUILDER} AS ids\nRUN mkdir -p /tmp/out && id -u > /tmp/out/uid\n");
    let req = request(dir, &ctx, "ids", text);
    remote.build_stage(&req).expect("runs");
    let entries = charly_files::artifact::read_tar(&std::fs::read(&req.out).expect("artifact"), "")
        .expect("tar");
    let uid = entries
        .iter()
        .find(|e| e.path == "tmp/out/uid")
        .expect("uid");
    assert_eq!(
        uid.kind,
        charly_files::artifact::Kind::File(b"1000\n".to_vec())
    );
}

/// Records every stage Containerfile the engine hands out; the rest fake.
#[derive(Default)]
struct Recorder {
    fake: FakeRunner,
    stages: std::sync::Mutex<Vec<(String, String)>>,
}

impl Runner for Recorder {
    fn name(&self) -> &str {
        self.fake.name()
    }
    fn build_stage(&self, r: &StageRequest) -> Result<(), RunError> {
        if let Ok(mut s) = self.stages.lock() {
            s.push((r.node.clone(), r.containerfile.clone()));
        }
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
        self.fake.build_local_pkg(r)
    }
    fn build_rootfs(&self, r: &RootfsRequest) -> Result<(), RunError> {
        self.fake.build_rootfs(r)
    }
}

/// Every builder stage of the real corpus and of the bundled example (npm,
/// pixi, aur, …, as the engine renders them) is one the interpreter can
/// send: the stage text parses, with its layer stage.
#[test]
fn every_corpus_and_example_stage_can_be_sent() {
    use charly_engine::api::Engine;
    use charly_engine::graph::Goal;
    use charly_engine::hash::FileHasher;
    use charly_rules::load::{self, LoadOptions};
    use charly_rules::resolve;
    let here = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut seen = 0;
    // The example's local .deb is built from source (--dev-local-pkg); the
    // corpus has no sources for its local packages.
    for (src, dev_local_pkg) in [
        (here.join("../../shared/corpus/overthink"), false),
        (here.join("../examples/hello"), true),
    ] {
        let tmp = tempfile::tempdir().expect("tmp");
        let root = tmp.path().join("project");
        for e in walkdir::WalkDir::new(&src).into_iter().flatten() {
            let rel = e.path().strip_prefix(&src).expect("rel");
            if rel.starts_with(".build") {
                continue;
            }
            if e.file_type().is_dir() {
                std::fs::create_dir_all(root.join(rel)).expect("mkdir");
            } else if e.file_type().is_file() {
                std::fs::copy(e.path(), root.join(rel)).expect("copy");
            }
        }
        let p = load::load(&root, &LoadOptions::default()).expect("loads");
        let r = resolve::resolve(&p);
        let store = charly_engine::cache::Store::open(&tmp.path().join("store")).expect("store");
        let recorder = Recorder::default();
        let engine = Engine {
            project: &p,
            resolution: &r,
            store: &store,
            runner: Some(&recorder),
            hasher: &FileHasher::in_memory(),
            opts: charly_engine::graph::GraphOptions {
                plugins: Default::default(),
                dev_local_pkg,
                runner: recorder.name().to_string(),
                arch: "amd64".into(),
            },
            remote: None,
            own_inputs: None,
        };
        let boxes = r.resolved_names();
        let graph = engine.graph(&Goal::Build, &boxes).expect("graph");
        let summary = engine.run(&graph, &root, 2, false, &charly_engine::sched::Quiet);
        let failed: Vec<String> = summary
            .nodes
            .iter()
            .filter(|n| n.state == charly_engine::sched::State::Failed)
            .map(|n| format!("{} {:?}", n.id, n.error))
            .collect();
        assert!(failed.is_empty(), "{}: {failed:?}", src.display());
        let stages = recorder.stages.into_inner().expect("stages");
        for (node, text) in &stages {
            if let Err(e) = charly_engine::reapi::stage::parse(text) {
                panic!("{node} ({}): {e}\n{text}", src.display());
            }
        }
        seen += stages.len();
    }
    // chrome-devtools-mcp (npm, pixi), jupyter, openwebui, python (pixi),
    // openclaw (npm) in the corpus; cowsay (npm) in the example.
    assert!(seen >= 7, "only {seen} stages");
    eprintln!("{seen} stages parsed");
}
