//! A box of today's format (schema 2026.174) built for real and checked.
//!
//! The corpus's `box/debian` repository, as it is, plus one image of a few
//! candies from the shared library (`@github.com/overthinkos/overthink/
//! candy/…`, resolved offline to the enclosing checkout): `check-base-layer`
//! (a written file), `ssh-client` (a Debian package) and `socat` (packages
//! and a copied script). It is built on the repository's own `debian` box,
//! whose `base: debian:13` is a Debian root filesystem made here with
//! debootstrap (bookworm: the mirror this machine reaches), imported into
//! podman under that name — no registry. Then `charly check` starts a bed
//! of the image and runs the candies' `check:` steps (`plugin: file`,
//! `command`, `package`, with `stdout`/`stderr`/`exit_status` matchers),
//! plus one check of the image's own that must fail, so a bed that passed
//! everything without looking would be caught.

use charly_testutil as tu;
use std::path::Path;
use std::process::{Command, Output};

const CI_BOX: &str = "\
ci-tools:
    candy:
        version: 2026.339.1200
        description: a few library candies on the debian box, for CI
        base: debian
    ci-tools-candy:
        candy:
            - '@github.com/overthinkos/overthink/candy/check-base-layer:v2026.174.0425'
            - '@github.com/overthinkos/overthink/candy/ssh-client:v2026.174.0425'
            - '@github.com/overthinkos/overthink/candy/socat:v2026.174.0425'
    ci-tools-absent:
        check: a file nobody installs (this check must fail)
        plugin: file
        plugin_input:
            file: /usr/bin/charly-ci-absent
            exists: true
";

/// `candy/socat/relay-wrapper` is not in the corpus (SOURCE.md): a
/// stand-in that keeps the behaviour its checks describe.
const RELAY_WRAPPER: &str = "#!/bin/sh\n[ -n \"$1\" ] || { echo 'Usage: relay-wrapper PORT' >&2; exit 1; }\nexec socat \"TCP-LISTEN:$1,fork\" \"TCP:127.0.0.1:$1\"\n";

fn charly(dir: &Path, t: &Path, args: &[&str]) -> Output {
    let mut c = Command::new(assert_cmd::cargo::cargo_bin("charly"));
    c.env("NO_COLOR", "1")
        .env("CHARLY_CACHE_DIR", t.join("store"))
        .env("CHARLY_PODMAN_ROOT", t.join("podman"))
        .env_remove("CHARLY_REMOTE")
        .arg("-C")
        .arg(dir)
        .args(args);
    let ca = Path::new("/etc/ssl/certs/ca-certificates.crt");
    if ca.is_file() {
        c.env("CHARLY_CA_BUNDLE", ca);
    }
    c.output().expect("charly runs")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn a_node_form_debian_box_builds_and_its_checks_run() {
    if !tu::podman_available() {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let t = tmp.path();
    let Some(rootfs) = tu::debootstrap_bookworm(&t.join("rootfs")) else {
        return;
    };
    let podman = tu::Podman::new(&t.join("podman"));
    podman.import_tar(
        &tu::tar_dir(&rootfs, &t.join("rootfs.tar")),
        "docker.io/library/debian:13",
    );

    let lib = t.join("overthink");
    tu::copy_project(&tu::corpus_174(), &lib);
    tu::write(&lib, "candy/socat/relay-wrapper", RELAY_WRAPPER);
    let repo = lib.join("box/debian");
    tu::write(&repo, "box/ci-tools/charly.yml", CI_BOX);

    let out = charly(&repo, t, &["box", "build", "ci-tools", "-q"]);
    assert!(out.status.success(), "box build:\n{}", text(&out));

    let out = charly(&repo, t, &["check", "ci-tools", "--json"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "one check must fail:\n{}",
        text(&out)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("check --json: {e}\n{}", text(&out)));
    let beds = v.as_array().or_else(|| v["beds"].as_array()).expect("beds");
    assert_eq!(beds.len(), 1, "{v:#}");
    let bed = &beds[0];
    let results = bed["checks"].as_array().expect("checks");
    let outcome = |id: &str| -> String {
        results
            .iter()
            .find(|r| r["id"] == id)
            .map(|r| r["outcome"].as_str().unwrap_or("").to_string())
            .unwrap_or_else(|| panic!("no result {id}: {v:#}"))
    };
    for id in [
        "check-base-layer-step-1",
        "check-base-layer-step-2",
        "ssh-client-step-0",
        "ssh-client-step-3",
        "ssh-client-package",
        "socat-step-1",
        "socat-step-2",
        "socat-step-3",
        "socat-step-4",
        "socat-step-5",
        "socat-package",
    ] {
        assert_eq!(outcome(id), "pass", "{id}: {v:#}");
    }
    assert_eq!(outcome("ci-tools-absent"), "fail", "{v:#}");
    assert_eq!(bed["failed"], 1, "{v:#}");
    assert!(bed["passed"].as_u64().unwrap_or(0) >= 11, "{v:#}");
}
