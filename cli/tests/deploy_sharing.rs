//! Bundles that share a target (issue 43, findings 1–5), end to end on the
//! CLI against a rooted directory: two bundles deploying the same files,
//! npm artifacts and managed blocks; a user's edit of a shared rc file;
//! six `bundle add` and six `bundle del` at once on one store and one
//! root; names that would reach outside the store; a bundle whose root is
//! gone. After the last `del` the root is as it was before the first
//! `add`, byte for byte and mode for mode.

use assert_cmd::Command;
use charly_testutil as project_copy;
use charly_testutil::tree_with_modes as tree;
use project_copy::example;
use std::path::{Path, PathBuf};

struct World {
    t: tempfile::TempDir,
    cache: PathBuf,
    root: PathBuf,
    project: PathBuf,
}

/// A copy of the example, plus `extra` candies and boxes written by `more`,
/// with the store filled for `boxes` (fake runner: no podman).
fn world(more: &dyn Fn(&Path), boxes: &[&str]) -> World {
    let t = tempfile::tempdir().expect("tmp");
    let cache = t.path().join("cache");
    let root = t.path().join("root");
    std::fs::create_dir_all(root.join("etc")).expect("root");
    std::fs::write(root.join("etc/hostname"), "target\n").expect("hostname");
    std::fs::create_dir_all(root.join("home/user")).expect("home");
    std::fs::write(root.join("home/user/.bashrc"), "# mine\n").expect("bashrc");
    let project = t.path().join("project");
    project_copy::copy_project(&example(), &project);
    more(&project);
    let w = World {
        t,
        cache,
        root,
        project,
    };
    let mut args = vec!["box", "build"];
    args.extend(boxes);
    args.extend(["--runner", "fake", "--dev-local-pkg", "-q"]);
    let out = w.cmd().args(&args).output().expect("build");
    assert!(out.status.success(), "{}", text(&out));
    w
}

fn write(dir: &Path, rel: &str, body: &str) {
    let p = dir.join(rel);
    std::fs::create_dir_all(p.parent().expect("parent")).expect("dir");
    std::fs::write(p, body).expect("write");
}

/// A candy with one file, one env value and a shell snippet.
fn candy(project: &Path, name: &str, env: &str) {
    write(
        project,
        &format!("candy/{name}/charly.yml"),
        &format!(
            "candy:\n    version: 2026.12.1\n    name: {name}\n    description: test\n\
             \x20   env:\n        {env}: \"on\"\n\
             \x20   task:\n        - write: \"${{HOME}}/.config/{name}/conf\"\n          user: \"${{USER}}\"\n          content: |\n            {name}\n"
        ),
    );
}

/// A box on the example's base with `candies`.
fn boxdef(project: &Path, name: &str, candies: &[&str]) {
    let list: String = candies.iter().map(|c| format!("        - {c}\n")).collect();
    write(
        project,
        &format!("box/{name}/charly.yml"),
        &format!(
            "box:\n    name: {name}\n    version: 2026.12.1\n    base: base\n    candy:\n{list}"
        ),
    );
}

fn text(o: &std::process::Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

impl World {
    fn cmd(&self) -> Command {
        let mut c = Command::cargo_bin("charly").expect("binary");
        c.env("NO_COLOR", "1")
            .env("CHARLY_CACHE_DIR", &self.cache)
            .env_remove("CHARLY_TEST_BLOCK_AT_STEP")
            .arg("-C")
            .arg(&self.project);
        c
    }

    fn add_cmd(&self, name: &str, box_name: &str, extra: &[&str]) -> Command {
        let mut c = self.cmd();
        c.args([
            "bundle", "add", name, box_name, "--target", "local", "--root",
        ])
        .arg(&self.root)
        .args(["--runner", "fake", "--dev-local-pkg", "--yes"])
        .args(extra);
        c
    }

    fn ok(&self, mut c: Command) -> String {
        let out = c.output().expect("run");
        assert!(out.status.success(), "{}", text(&out));
        text(&out)
    }

    fn add(&self, name: &str, box_name: &str, extra: &[&str]) -> String {
        self.ok(self.add_cmd(name, box_name, extra))
    }

    fn del(&self, name: &str) -> String {
        let mut c = self.cmd();
        c.args(["bundle", "del", name]);
        self.ok(c)
    }

    /// `bundle status NAME`: (exit code, output).
    fn status(&self, name: &str) -> (Option<i32>, String) {
        let out = self
            .cmd()
            .args(["bundle", "status", name])
            .output()
            .expect("status");
        (out.status.code(), text(&out))
    }

    fn bashrc(&self) -> String {
        std::fs::read_to_string(self.root.join("home/user/.bashrc")).expect("bashrc")
    }
}

/// Finding 1: two bundles of the same box on one root, the first with an
/// added candy. Deleting the first leaves everything the second deployed
/// (files, the npm artifact, managed blocks) in place and clean; deleting
/// the second then puts the root back as it was before the first `add`.
#[test]
fn deleting_one_of_two_bundles_keeps_what_the_other_needs() {
    let w = world(&|p| candy(p, "extra", "EXTRA_ON"), &["hello"]);
    let before = tree(&w.root);
    w.add("a", "hello", &["--add", "extra"]);
    let after_a = tree(&w.root);
    w.add("b", "hello", &[]);
    assert_eq!(w.status("b").0, Some(0), "{}", w.status("b").1);
    w.del("a");
    let (code, said) = w.status("b");
    assert_eq!(code, Some(0), "b is clean after `del a`: {said}");
    // What a alone added (the extra candy) is gone; the rest is b's.
    assert!(!w.root.join("home/user/.config/extra/conf").exists());
    assert!(!w.bashrc().contains("EXTRA_ON"));
    let now = tree(&w.root);
    for (path, what) in &after_a {
        if path.contains("extra") || path.ends_with(".bashrc") || path.contains("env.d") {
            continue;
        }
        assert_eq!(now.get(path), Some(what), "{path} as b deployed it");
    }
    w.del("b");
    assert_eq!(
        tree(&w.root),
        before,
        "the root as it was before the first add"
    );

    // The other order: the second bundle goes first.
    w.add("a", "hello", &["--add", "extra"]);
    w.add("b", "hello", &[]);
    w.del("b");
    let (code, said) = w.status("a");
    assert_eq!(code, Some(0), "a is clean after `del b`: {said}");
    w.del("a");
    assert_eq!(tree(&w.root), before);
}

/// Finding 2: a user's edit of an rc file both bundles put managed blocks
/// in survives both `del`s, in either order, and only charly's blocks go.
#[test]
fn a_users_edit_of_a_shared_rc_file_survives_both_dels() {
    let w = world(
        &|p| {
            candy(p, "a", "A_ON");
            candy(p, "b", "B_ON");
            boxdef(p, "d1", &["a", "b"]);
            boxdef(p, "d2", &["b"]);
        },
        &["d1", "d2"],
    );
    let before = tree(&w.root);
    for order in [["k1", "k2"], ["k2", "k1"]] {
        w.add("k1", "d1", &[]);
        w.add("k2", "d2", &[]);
        let rc = w.root.join("home/user/.bashrc");
        let mut text = w.bashrc();
        assert!(text.contains("# >>> charly"), "blocks were added: {text}");
        text.push_str("export MY_EDIT=1\n");
        std::fs::write(&rc, &text).expect("edit");
        w.del(order[0]);
        assert!(w.bashrc().contains("export MY_EDIT=1"), "{}", w.bashrc());
        w.del(order[1]);
        assert_eq!(
            w.bashrc(),
            "# mine\nexport MY_EDIT=1\n",
            "only charly's blocks removed ({order:?})"
        );
        std::fs::write(&rc, "# mine\n").expect("reset");
        // Apart from the edit, the root is as it was.
        assert_eq!(tree(&w.root), before, "{order:?}");
    }
}

/// Six boxes that share a candy, for the concurrency tests.
fn six_boxes(p: &Path) {
    candy(p, "common", "COMMON_ON");
    for i in 1..=6 {
        candy(p, &format!("own{i}"), &format!("OWN{i}_ON"));
        boxdef(
            p,
            &format!("b{i}"),
            &["hello-tools", "common", &format!("own{i}")],
        );
    }
}

/// Finding 3: six `bundle add` at once on one store and one root all
/// succeed, then six `bundle del` at once all succeed and leave the root
/// as it was; `bundle list` never forgets a bundle with files on disk.
/// Repeated, since a race shows only sometimes.
#[test]
fn six_concurrent_adds_then_six_concurrent_dels() {
    let boxes = ["b1", "b2", "b3", "b4", "b5", "b6"];
    let w = world(&six_boxes, &boxes);
    let before = tree(&w.root);
    for round in 0..3 {
        let spawn = |args: Vec<String>| {
            let mut c = std::process::Command::new(assert_cmd::cargo::cargo_bin("charly"));
            c.env("NO_COLOR", "1")
                .env("CHARLY_CACHE_DIR", &w.cache)
                .env_remove("CHARLY_TEST_BLOCK_AT_STEP")
                .arg("-C")
                .arg(&w.project)
                .args(args)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            c.spawn().expect("spawn")
        };
        let root = w.root.to_str().expect("utf8").to_string();
        let adds: Vec<_> = (1..=6)
            .map(|i| {
                spawn(
                    [
                        "bundle",
                        "add",
                        &format!("k{i}"),
                        &format!("b{i}"),
                        "--target",
                        "local",
                        "--root",
                        &root,
                        "--runner",
                        "fake",
                        "--dev-local-pkg",
                        "--yes",
                    ]
                    .map(String::from)
                    .to_vec(),
                )
            })
            .collect();
        for c in adds {
            let out = c.wait_with_output().expect("wait");
            assert!(out.status.success(), "round {round}: {}", text(&out));
        }
        for i in 1..=6 {
            assert_eq!(
                w.status(&format!("k{i}")).0,
                Some(0),
                "{}",
                w.status(&format!("k{i}")).1
            );
        }
        // `apply` and `status` of all six at once: every apply converges,
        // every status answers (3 while an apply is under way is an answer).
        let mixed: Vec<_> = (1..=6)
            .flat_map(|i| {
                let name = format!("k{i}");
                [
                    (
                        true,
                        spawn(["bundle", "apply", &name].map(String::from).to_vec()),
                    ),
                    (
                        false,
                        spawn(["bundle", "status", &name].map(String::from).to_vec()),
                    ),
                ]
            })
            .collect();
        for (apply, c) in mixed {
            let out = c.wait_with_output().expect("wait");
            let code = out.status.code();
            if apply {
                assert_eq!(code, Some(0), "round {round}: apply: {}", text(&out));
            } else {
                assert!(
                    matches!(code, Some(0 | 3)),
                    "round {round}: status: {}",
                    text(&out)
                );
            }
        }
        let dels: Vec<_> = (1..=6)
            .map(|i| {
                spawn(
                    ["bundle", "del", &format!("k{i}")]
                        .map(String::from)
                        .to_vec(),
                )
            })
            .collect();
        for c in dels {
            let out = c.wait_with_output().expect("wait");
            assert!(out.status.success(), "round {round}: {}", text(&out));
        }
        let list = w
            .cmd()
            .args(["bundle", "list", "--json"])
            .output()
            .expect("list");
        assert_eq!(String::from_utf8_lossy(&list.stdout).trim(), "[]");
        assert_eq!(tree(&w.root), before, "round {round}");
    }
}

/// Finding 4: a bundle name is an identifier: one with `/` or `..` is
/// refused at the command line, and nothing is created outside the store.
#[test]
fn bundle_names_that_would_be_paths_are_refused() {
    let w = world(&|_| {}, &["hello"]);
    let outside = w.t.path().join("outside");
    std::fs::create_dir_all(&outside).expect("outside");
    std::fs::write(outside.join("victim.lock"), "precious\n").expect("victim");
    let before = tree(w.t.path());
    for name in ["../../../outside/victim", "a/b", "..", ".hidden", "", "a b"] {
        let out = w.add_cmd(name, "hello", &[]).output().expect("add");
        assert_eq!(out.status.code(), Some(2), "{name:?}: {}", text(&out));
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(said.contains("bundle name"), "{name:?}: {said}");
        for sub in [vec!["del", name], vec!["status", name], vec!["apply", name]] {
            let mut args = vec!["bundle"];
            args.extend(sub);
            let out = w.cmd().args(&args).output().expect("cmd");
            assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        }
    }
    let now = tree(w.t.path());
    let outside_now: Vec<_> = now.keys().filter(|k| !k.starts_with("cache/")).collect();
    let outside_before: Vec<_> = before.keys().filter(|k| !k.starts_with("cache/")).collect();
    assert_eq!(outside_now, outside_before, "nothing outside the store");
    assert_eq!(
        std::fs::read_to_string(outside.join("victim.lock")).expect("victim"),
        "precious\n"
    );
}

/// Finding 5: a bundle whose root was deleted is listed as unreachable;
/// `del` says how to forget it, and `del --forget` does, naming what it
/// could not undo.
#[test]
fn a_bundle_whose_root_is_gone_can_be_forgotten() {
    let w = world(&|_| {}, &["hello"]);
    w.add("gone", "hello", &[]);
    std::fs::remove_dir_all(&w.root).expect("rm root");
    let list = w.cmd().args(["bundle", "list"]).output().expect("list");
    let said = text(&list);
    assert!(list.status.success(), "{said}");
    assert!(said.contains("unreachable"), "{said}");
    let list = w
        .cmd()
        .args(["bundle", "list", "--json"])
        .output()
        .expect("list");
    let v: serde_json::Value = serde_json::from_slice(&list.stdout).expect("json");
    assert_eq!(v[0]["reachable"], serde_json::json!(false), "{v}");
    let out = w
        .cmd()
        .args(["bundle", "del", "gone"])
        .output()
        .expect("del");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("--forget"), "{}", text(&out));
    let out = w
        .cmd()
        .args(["bundle", "del", "gone", "--forget"])
        .output()
        .expect("forget");
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("not undone"), "{}", text(&out));
    let list = w
        .cmd()
        .args(["bundle", "list", "--json"])
        .output()
        .expect("list");
    assert_eq!(String::from_utf8_lossy(&list.stdout).trim(), "[]");
}
