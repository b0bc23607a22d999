//! Edges found by trying charly as an attacker and as a busy CI host would
//! (issue 43, findings 7–9): very long lines in diagnostics, absurd `-j`,
//! generate refusing what validate refuses, links out of the project, a
//! rooted deploy into `/`.

use assert_cmd::Command;
use charly_testutil::{copy_project, example};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

struct World {
    _t: tempfile::TempDir,
    cache: PathBuf,
    project: PathBuf,
}

fn world() -> World {
    let t = tempfile::tempdir().expect("tmp");
    let project = t.path().join("project");
    copy_project(&example(), &project);
    World {
        cache: t.path().join("cache"),
        _t: t,
        project,
    }
}

impl World {
    fn cmd(&self) -> Command {
        let mut c = Command::cargo_bin("charly").expect("binary");
        c.env("NO_COLOR", "1")
            .env("CHARLY_CACHE_DIR", &self.cache)
            .arg("-C")
            .arg(&self.project);
        c
    }

    fn edit(&self, rel: &str, f: impl FnOnce(String) -> String) {
        let p = self.project.join(rel);
        let text = std::fs::read_to_string(&p).expect("read");
        std::fs::write(&p, f(text)).expect("write");
    }
}

fn text(o: &std::process::Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Finding 7: a YAML error at column 65,535 and beyond exits 1 with its
/// location (the report renderer panicked on it: exit 101).
#[test]
fn a_yaml_error_past_column_65535_exits_1_with_its_location() {
    let k = "k".repeat(65_535);
    type Edit<'a> = Box<dyn Fn(String) -> String + 'a>;
    let cases: [(&str, Edit<'_>, &str); 3] = [
        (
            "candy/cowsay/charly.yml",
            Box::new(|t: String| {
                t.replace(
                    "    name: cowsay\n",
                    &format!("    name: cowsay\n    {k}: 1\n"),
                )
            }),
            "candy/cowsay/charly.yml:4:",
        ),
        (
            "charly.yml",
            Box::new(|t: String| format!("{t}{k}: 1\n")),
            "charly.yml:",
        ),
        (
            "charly.yml",
            Box::new(|t: String| format!("{t}x: \"{k}\"\n\ty: 1\n")),
            "charly.yml:",
        ),
    ];
    for (file, edit, at) in cases {
        let w = world();
        w.edit(file, edit);
        for cmd in [&["validate"][..], &["box", "generate", "--all"][..]] {
            let out = w.cmd().args(cmd).output().expect("run");
            let said = text(&out);
            assert_eq!(
                out.status.code(),
                Some(1),
                "{file} {cmd:?}: {}",
                &said[..said.len().min(3000)]
            );
            assert!(
                said.contains(at),
                "{file} {cmd:?}: {}",
                &said[..said.len().min(3000)]
            );
            assert!(!said.contains("internal error"), "{file} {cmd:?}");
        }
    }
}

/// Finding 8: `-j 100000` runs like `-j 8` (at most 256 at once, said),
/// instead of starting a hundred thousand threads.
#[test]
fn an_absurd_jobs_value_runs_like_a_small_one() {
    let w = world();
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("charly"))
        .env("NO_COLOR", "1")
        .env("CHARLY_CACHE_DIR", &w.cache)
        .arg("-C")
        .arg(&w.project)
        .args(["box", "generate", "--all", "--no-journal", "-j", "100000"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("-j 100000 did not finish in 120 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut err)
        .expect("read");
    assert!(status.success(), "{err}");
    assert!(
        err.contains("-j 100000: running at most 256 nodes at once"),
        "{err}"
    );
}

/// The project's `candy/<name>` directory, for writing a crafted candy.
fn candy_dir(w: &World, name: &str) -> PathBuf {
    let d = w.project.join("candy").join(name);
    std::fs::create_dir_all(&d).expect("dir");
    d
}

/// A box `edge` on the example's base with the one candy `edge`.
fn edge_box(w: &World, candy: &str) {
    let d = candy_dir(w, "edge");
    std::fs::write(d.join("charly.yml"), candy).expect("candy");
    let b = w.project.join("box/edge");
    std::fs::create_dir_all(&b).expect("box");
    std::fs::write(
        b.join("charly.yml"),
        "box:\n    name: edge\n    version: 2026.12.1\n    base: base\n    candy:\n        - edge\n",
    )
    .expect("box yml");
}

/// Finding 9: `box generate` refuses a `copy:` source outside the project,
/// as `validate` does (one check), with its file:line:col.
#[test]
fn generate_refuses_a_copy_source_outside_the_project_as_validate_does() {
    for src in ["/tmp/x", "../../../../x"] {
        let w = world();
        edge_box(
            &w,
            &format!(
                "candy:\n    version: 2026.12.1\n    name: edge\n    task:\n        - copy: {src}\n          to: /opt/s\n          user: root\n"
            ),
        );
        for cmd in [&["validate"][..], &["box", "generate", "edge"][..]] {
            let out = w.cmd().args(cmd).output().expect("run");
            let said = text(&out);
            assert_eq!(out.status.code(), Some(1), "{src} {cmd:?}: {said}");
            assert!(
                said.contains("candy/edge/charly.yml:5:"),
                "{src} {cmd:?}: {said}"
            );
        }
        assert!(
            !w.project.join(".build/edge/Containerfile").exists(),
            "{src}: nothing generated"
        );
    }
}

/// Finding 9: a candy file that is a symlink out of the project is refused
/// with its location, not silently left out of a build directory whose
/// Containerfile still COPYs it.
#[test]
fn generate_refuses_a_candy_file_linked_out_of_the_project() {
    let w = world();
    let outside = w._t.path().join("outside.sh");
    std::fs::write(&outside, "echo secret\n").expect("outside");
    edge_box(
        &w,
        "candy:\n    version: 2026.12.1\n    name: edge\n    task:\n        - copy: s.sh\n          to: /opt/s\n          user: root\n",
    );
    std::os::unix::fs::symlink(&outside, candy_dir(&w, "edge").join("s.sh")).expect("link");
    let out_dir = w._t.path().join("out");
    let out = w
        .cmd()
        .args(["box", "generate", "edge", "--out"])
        .arg(&out_dir)
        .output()
        .expect("run");
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("candy/edge/charly.yml:5:"), "{said}");
    assert!(said.contains("outside the project"), "{said}");
    let leaked = walk(&out_dir)
        .into_iter()
        .any(|p| std::fs::read(&p).is_ok_and(|d| d == b"echo secret\n"));
    assert!(!leaked, "the linked file's content is not in the output");
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    walkdir::WalkDir::new(dir)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
        .map(|e| e.into_path())
        .collect()
}

/// Finding 9: `--root /` (or a path that normalizes to it) is refused: a
/// rooted deploy into `/` would be the real system.
#[test]
fn a_rooted_deploy_into_slash_is_refused() {
    let w = world();
    for root in ["/", "/tmp/..", "//"] {
        let out = w
            .cmd()
            .args([
                "bundle",
                "add",
                "r",
                "hello",
                "--target",
                "local",
                "--root",
                root,
                "--dry-run",
            ])
            .output()
            .expect("run");
        let said = text(&out);
        assert!(!out.status.success(), "{root}: {said}");
        assert!(
            said.contains("would change the real system"),
            "{root}: {said}"
        );
    }
}

/// Finding 9, node form: a box whose `@github` candy (resolved to the
/// enclosing project offline) has errors `validate` reports — a version
/// that is not one, a scalar where a child node goes — is refused by
/// `box generate` too, naming the candy's file and line.
#[test]
fn generate_refuses_a_node_form_candy_that_validate_refuses() {
    let cases: [(&str, &str, &str); 2] = [
        (
            "version: 2026.166.1750",
            "version: not-a-version",
            "candy/pixi/charly.yml:3:",
        ),
        (
            "    pixi-var:",
            "    pixi-scalar: hello\n    pixi-var:",
            "candy/pixi/charly.yml:",
        ),
    ];
    for (from, to, at) in cases {
        let t = tempfile::tempdir().expect("tmp");
        let corpus = t.path().join("corpus");
        copy_project(&charly_testutil::corpus_174(), &corpus);
        let pixi = corpus.join("candy/pixi/charly.yml");
        let was = std::fs::read_to_string(&pixi).expect("pixi");
        assert!(was.contains(from), "the corpus's pixi candy has `{from}`");
        std::fs::write(&pixi, was.replacen(from, to, 1)).expect("edit");
        let debian = corpus.join("box/debian");
        for cmd in [
            &["validate"][..],
            &["box", "generate", "debian-builder"][..],
        ] {
            let out = Command::cargo_bin("charly")
                .expect("binary")
                .env("NO_COLOR", "1")
                .env("CHARLY_CACHE_DIR", t.path().join("cache"))
                .arg("-C")
                .arg(&debian)
                .args(cmd)
                .output()
                .expect("run");
            let said = text(&out);
            assert_eq!(out.status.code(), Some(1), "{to} {cmd:?}: {said}");
            assert!(said.contains(at), "{to} {cmd:?}: {said}");
        }
        assert!(
            !debian.join(".build/debian-builder").exists(),
            "{to}: nothing generated"
        );
    }
}
