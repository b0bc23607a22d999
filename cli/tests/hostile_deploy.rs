//! `bundle add --root DIR` never writes, reads or deletes outside DIR
//! (issue 18, finding 4): each crafted candy below is refused — `..` in a
//! target path at plan compile time, a symlink leading out of the root when
//! the walker would write through it — with an error naming the candy or
//! step, and a sentinel tree outside the root is byte-for-byte unchanged,
//! after `add` and after `del`.

mod project_copy;
use assert_cmd::Command;
use project_copy::example;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

struct World {
    _t: tempfile::TempDir,
    cache: PathBuf,
    root: PathBuf,
    outside: PathBuf,
    project: PathBuf,
}

/// A copy of the example with a box `evil` whose only candy `evil` has `tasks`.
fn world(tasks: &str) -> World {
    let t = tempfile::tempdir().expect("tmp");
    let cache = t.path().join("cache");
    let root = t.path().join("a/b/c/root");
    std::fs::create_dir_all(root.join("etc")).expect("root");
    let outside = t.path().join("outside");
    std::fs::create_dir_all(outside.join("dir")).expect("outside");
    std::fs::write(outside.join("precious"), "keep\n").expect("sentinel");
    std::fs::write(outside.join("dir/x"), "keep too\n").expect("sentinel");
    let project = t.path().join("project");
    project_copy::copy_project(&example(), &project);
    let candy = project.join("candy/evil");
    std::fs::create_dir_all(&candy).expect("candy");
    std::fs::write(candy.join("f.txt"), "payload\n").expect("f");
    std::fs::write(
        candy.join("charly.yml"),
        format!(
            "candy:\n    version: 2026.12.1\n    name: evil\n    description: hostile paths\n    task:\n{tasks}"
        ),
    )
    .expect("candy yml");
    std::fs::create_dir_all(project.join("box/evil")).expect("box");
    std::fs::write(
        project.join("box/evil/charly.yml"),
        "box:\n    name: evil\n    version: 2026.12.1\n    base: base\n    candy:\n        - evil\n",
    )
    .expect("box yml");
    World {
        _t: t,
        cache,
        root,
        outside,
        project,
    }
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

    fn add(&self, name: &str) -> std::process::Output {
        self.cmd()
            .args(["bundle", "add", name, "evil", "--target", "local", "--root"])
            .arg(&self.root)
            .args(["--runner", "fake", "--dev-local-pkg", "--yes"])
            .output()
            .expect("add")
    }

    /// Everything under the temp dir except the root, the cache and the project.
    fn sentinel(&self) -> BTreeMap<String, String> {
        tree(&self.outside)
    }
}

fn tree(dir: &Path) -> BTreeMap<String, String> {
    walkdir::WalkDir::new(dir)
        .follow_links(false)
        .sort_by_file_name()
        .into_iter()
        .map(|e| {
            let e = e.expect("walk");
            let md = e.path().symlink_metadata().expect("meta");
            let what = if md.is_file() {
                String::from_utf8_lossy(&std::fs::read(e.path()).expect("read")).into_owned()
            } else {
                format!("{:?}", md.file_type())
            };
            (e.path().display().to_string(), what)
        })
        .collect()
}

/// Runs `add` (expected to fail naming `expect`), then `del` if a bundle
/// was recorded, and checks the sentinel tree outside the root.
fn refused(w: &World, expect: &[&str]) {
    let before = w.sentinel();
    let out = w.add("b");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "must fail: {stderr}");
    for e in expect {
        assert!(stderr.contains(e), "error names `{e}`: {stderr}");
    }
    assert_eq!(before, w.sentinel(), "add touched the outside: {stderr}");
    let listed = w
        .cmd()
        .args(["bundle", "list", "--json"])
        .output()
        .expect("list");
    if String::from_utf8_lossy(&listed.stdout).contains("\"b\"") {
        let st = w
            .cmd()
            .args(["bundle", "status", "b"])
            .output()
            .expect("status");
        assert_ne!(st.status.code(), Some(101), "status must not panic");
        let del = w.cmd().args(["bundle", "del", "b"]).output().expect("del");
        assert!(
            del.status.success(),
            "del: {}",
            String::from_utf8_lossy(&del.stderr)
        );
    }
    assert_eq!(before, w.sentinel(), "del touched the outside");
    assert!(
        !w.outside.join("x").exists() && !w.outside.join("l").exists(),
        "nothing written outside"
    );
}

#[test]
fn write_with_dotdot_climbing_out_of_the_root() {
    // The root is 4 levels below the temp dir that holds `outside`.
    let w = world("        - write: /opt/../../../../../../outside/x\n          content: pwned\n");
    refused(&w, &["evil", ".."]);
}

#[test]
fn copy_to_dotdot() {
    let w = world("        - copy: f.txt\n          to: /../../../../../outside/x\n");
    refused(&w, &["evil", ".."]);
}

#[test]
fn link_at_dotdot() {
    let w = world("        - link: /../../../../../outside/l\n          target: /etc\n");
    refused(&w, &["evil", ".."]);
}

#[test]
fn write_under_home_dotdot() {
    let w = world(
        "        - write: \"${HOME}/../../../../../../../outside/x\"\n          content: pwned\n",
    );
    refused(&w, &["evil", ".."]);
}

#[test]
fn write_through_a_link_the_candy_made_to_the_outside() {
    let w = world("");
    // The outside directory is absolute: the candy is written once it is known.
    let tasks = format!(
        "        - link: /opt/evil\n          target: {}\n        - write: /opt/evil/x\n          content: pwned\n",
        w.outside.display()
    );
    std::fs::write(
        w.project.join("candy/evil/charly.yml"),
        format!(
            "candy:\n    version: 2026.12.1\n    name: evil\n    description: hostile paths\n    task:\n{tasks}"
        ),
    )
    .expect("rewrite");
    refused(&w, &["/opt/evil/x", "leads out of"]);
    // The link itself was fine to make, inside the root.
}

#[test]
fn write_through_an_absolute_link_already_in_the_root() {
    let w = world("        - write: /opt/x\n          content: pwned\n");
    std::os::unix::fs::symlink(&w.outside, w.root.join("opt")).expect("ln");
    refused(&w, &["/opt/x", "leads out of"]);
    assert!(
        std::fs::symlink_metadata(w.root.join("opt"))
            .expect("link kept")
            .file_type()
            .is_symlink()
    );
}

#[test]
fn a_relative_link_climbing_out_is_not_followed_either() {
    let w = world("        - write: /opt/dir/x\n          content: pwned\n");
    std::os::unix::fs::symlink("../../../../../outside", w.root.join("opt")).expect("ln");
    refused(&w, &["/opt/dir/x", "leads out of"]);
}

#[test]
fn sane_paths_still_deploy_and_del_cleans() {
    let w = world(
        "        - write: /opt/app/conf\n          content: ok\n        - link: /opt/current\n          target: app\n        - write: /opt/current/more\n          content: via an inside link\n",
    );
    let before = w.sentinel();
    let out = w.add("ok");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(w.root.join("opt/app/more")).expect("more"),
        "via an inside link"
    );
    let del = w.cmd().args(["bundle", "del", "ok"]).output().expect("del");
    assert!(
        del.status.success(),
        "{}",
        String::from_utf8_lossy(&del.stderr)
    );
    assert!(!w.root.join("opt/app").exists());
    assert_eq!(before, w.sentinel());
}
