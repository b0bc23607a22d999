//! Every Containerfile `charly box generate --all` writes for the box
//! repositories of today's format (schema 2026.174: `box/debian` and
//! `box/ubuntu` of the corpus, resolving their `@github.com/…/candy/…`
//! layers in the enclosing candy library) builds with this machine's
//! podman.
//!
//! As for the 2026.160 corpus (tests/podman_corpus.rs), every base image is
//! one stub image: busybox-static plus stubs for apt-get/npm/pixi/… and a
//! `/bin/sh` that syntax-checks every RUN line (a syntax error fails the
//! build) and tolerates commands that fail only because the stub is not a
//! real distro; the npm and pixi stubs leave the directories their builder
//! stages' artifacts are copied from. Each build runs to the end and proves what the generator
//! controls: the Containerfile parses, every COPY/ADD path of the context
//! exists (the candies staged from the library into `.build/_layers`), every
//! `--from=` stage and bind mount is wired, every RUN is valid shell and the
//! USER switches work. `--pull=never`: nothing is fetched, a missing image
//! fails at once. `--layers=false`: one commit per stage instead of one per
//! instruction (a third of the time; the instructions run all the same).
//!
//! This test found that the 2026.174 vocabulary's two locked apt cache mounts
//! per RUN hang buildah 1.28 on the next apt RUN of a stage (see
//! `rules/src/emit/cache_lock.rs`): a hang would show here as a test that
//! never ends, so each build has a time limit.

use std::path::Path;
use std::process::Command;

/// The images a Containerfile names in `FROM` (not stages, not `scratch`,
/// not `${…}`).
fn from_images(text: &str, into: &mut Vec<String>) {
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("FROM ") else {
            continue;
        };
        let image = rest
            .split_whitespace()
            .find(|w| !w.starts_with("--"))
            .unwrap_or("");
        if image != "scratch" && !image.contains('$') && !image.is_empty() {
            into.push(image.to_string());
        }
    }
}

/// `ADD <src> …` sources ending in `.tar.gz` (bootstrap root filesystems,
/// a build-graph artifact rather than generated text).
fn added_tarballs(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("ADD "))
        .filter_map(|rest| rest.split_whitespace().find(|w| !w.starts_with("--")))
        .filter(|src| src.ends_with(".tar.gz"))
        .map(str::to_string)
        .collect()
}

#[test]
fn corpus_174_containerfiles_build_with_podman() {
    if !charly_testutil::podman_available() {
        return;
    }
    let t = tempfile::tempdir().expect("tmp");
    let lib = t.path().join("overthink");
    charly_testutil::copy_project(&charly_testutil::corpus_174(), &lib);
    let podman = charly_testutil::Podman::new(&t.path().join("podman"));
    let stub = charly_testutil::stub_rootfs_tar(t.path());
    podman.import_tar(&stub, "localhost/charly-stub:1");
    let gz = t.path().join("stub.tar.gz");
    let st = Command::new("sh")
        .arg("-c")
        .arg(format!("gzip -c {} > {}", stub.display(), gz.display()))
        .status()
        .expect("gzip");
    assert!(st.success());

    let mut built = 0;
    let mut failures = Vec::new();
    for repo in ["debian", "ubuntu"] {
        let dir = lib.join("box").join(repo);
        let out = Command::new(assert_cmd::cargo::cargo_bin("charly"))
            .env("NO_COLOR", "1")
            .env("CHARLY_CACHE_DIR", t.path().join("cache"))
            .env_remove("CHARLY_REMOTE")
            .arg("-C")
            .arg(&dir)
            .args(["box", "generate", "--all", "-q"])
            .output()
            .expect("charly runs");
        assert!(
            out.status.success(),
            "{repo}: generate failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let files: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect();
        assert_eq!(files.len(), 5, "{repo}: {files:?}");
        // Every image a Containerfile names is the stub.
        let mut images = Vec::new();
        for f in &files {
            let text = std::fs::read_to_string(f).expect("Containerfile");
            from_images(&text, &mut images);
            for src in added_tarballs(&text) {
                let at = dir.join(&src);
                if !at.exists() {
                    std::fs::copy(&gz, &at).expect("stand-in rootfs");
                }
            }
        }
        images.sort();
        images.dedup();
        for image in &images {
            let out = podman.run(&["tag", "localhost/charly-stub:1", image]);
            assert!(
                out.status.success(),
                "tag {image}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        for f in &files {
            let name = Path::new(f)
                .parent()
                .and_then(Path::file_name)
                .and_then(|n| n.to_str())
                .expect("box name");
            let out = podman
                .cmd_within(600)
                .current_dir(&dir)
                .args(["build", "--layers=false", "--pull=never", "-f", f])
                .args(["--build-arg", "BASE_IMAGE=localhost/charly-stub:1"])
                .args(["-t", &format!("localhost/test-174-{name}:1"), "."])
                .output()
                .expect("podman build");
            if out.status.success() {
                built += 1;
            } else {
                let text = String::from_utf8_lossy(&out.stdout).to_string()
                    + &String::from_utf8_lossy(&out.stderr);
                // A hung build was stopped with SIGQUIT: its log, then where
                // buildah was waiting.
                let (log, dump) = text.split_at(text.find("SIGQUIT").unwrap_or(text.len()));
                let tail: Vec<&str> = log.lines().rev().take(15).collect();
                let frames: Vec<&str> = dump
                    .lines()
                    .filter(|l| l.contains("containers/buildah") && !l.starts_with('\t'))
                    .take(8)
                    .collect();
                failures.push(format!(
                    "{repo}/{name}:\n{}{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
                    if dump.is_empty() {
                        String::new()
                    } else {
                        format!("\nhung for 600 s; buildah was in:\n{}", frames.join("\n"))
                    }
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} boxes failed to build:\n{}",
        failures.len(),
        built + failures.len(),
        failures.join("\n\n")
    );
    assert_eq!(built, 10);
}
