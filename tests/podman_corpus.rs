//! Every generated Containerfile of the resolvable corpus boxes builds with
//! the podman of this machine (Debian 12: podman 4.3 / buildah 1.28).
//!
//! How it is arranged: the corpus is copied to a temp directory and the
//! non-YAML files it lacks (SOURCE.md lists them) get placeholders. Every
//! image a Containerfile names (`quay.io/fedora/fedora:43`, the parent and
//! builder boxes' `localhost/<box>:<version>`) is a tag of one stub image:
//! busybox-static plus stubs for dnf/pacman/apt-get/yay/npm/pixi/… that
//! succeed, and a `/bin/sh` that syntax-checks every RUN line (a syntax
//! error fails the build) and tolerates commands that fail only because the
//! stub is not a real distro (logged). So each build runs to the end and
//! proves what the generator controls: the Containerfile parses, every
//! COPY/ADD context path exists, every `--from=` and bind-mount stage is
//! wired, every RUN is valid shell, and USER switches work. Real builds of a
//! real distro are covered by the example project tests.

use charly_testutil as common;

use charly_rules::load::{self, LoadOptions};
use charly_rules::resolve;
use std::process::Command;

#[test]
fn corpus_containerfiles_build_with_podman() {
    if !common::podman_available() {
        return;
    }
    let t = tempfile::tempdir().expect("tmp");
    let root = t.path().join("project");
    common::copy_project(&common::corpus(), &root);
    for f in common::MISSING_SIBLINGS {
        common::write(&root, f, "#!/bin/sh\necho placeholder\n");
    }
    let p = load::load(&root, &LoadOptions::default()).expect("loads");
    let r = resolve::resolve(&p);
    let refs = charly_engine::generate::image_refs(&r);
    let opts = charly_rules::emit::EmitOptions {
        image_refs: refs.clone(),
        ..Default::default()
    };
    let names = r.resolved_names();
    assert!(names.len() >= 19, "{names:?}");

    let podman = common::Podman::new(&t.path().join("podman"));
    let tar = common::stub_rootfs_tar(t.path());
    podman.import_tar(&tar, "localhost/charly-stub:1");

    let mut tags: Vec<String> = refs.values().cloned().collect();
    for n in &names {
        let b = r.get(n).expect("resolved");
        if !b.root_image.contains('@') && !b.root_image.starts_with("builder:") {
            tags.push(b.root_image.clone());
        }
    }
    tags.sort();
    tags.dedup();
    for tag in &tags {
        let out = podman.run(&["tag", "localhost/charly-stub:1", tag]);
        assert!(
            out.status.success(),
            "tag {tag}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    let mut failures = Vec::new();
    for n in &names {
        let b = r.get(n).expect("resolved");
        let d = charly_engine::generate::render(&p, b, &opts).expect("renders");
        charly_engine::generate::write(&root, &d).expect("writes");
        if let charly_rules::resolve::BaseRef::Bootstrap { builder, .. } = &b.base {
            // The bootstrap rootfs is a build-graph artifact, not generated
            // text; stand in the stub rootfs for it.
            let gz = root.join(&d.dir).join(format!("{builder}.tar.gz"));
            let st = Command::new("sh")
                .arg("-c")
                .arg(format!("gzip -c {} > {}", tar.display(), gz.display()))
                .status()
                .expect("gzip");
            assert!(st.success());
        }
        let mut cmd: Command = podman.cmd();
        cmd.current_dir(&root)
            .args(["build", "--layers=false", "-f"])
            .arg(format!("{}/Containerfile", d.dir));
        if b.root_image.contains('@') {
            cmd.args(["--build-arg", "BASE_IMAGE=localhost/charly-stub:1"]);
        }
        cmd.args(["-t", &format!("localhost/test-{n}:1"), "."]);
        let out = cmd.output().expect("podman build");
        if !out.status.success() {
            let text = String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr);
            let tail: Vec<&str> = text.lines().rev().take(12).collect();
            failures.push(format!(
                "{n}:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} boxes failed to build:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}
