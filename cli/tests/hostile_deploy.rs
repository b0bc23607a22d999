//! `bundle add --root DIR` never writes, reads or deletes outside DIR
//! (issue 18, finding 4): each crafted candy below is refused — `..` in a
//! target path at plan compile time, a symlink leading out of the root when
//! the walker would write through it — with an error naming the candy or
//! step, and a sentinel tree outside the root is byte-for-byte unchanged,
//! after `add` and after `del`.

use assert_cmd::Command;
use charly_testutil as project_copy;
use project_copy::{example, hold_lock, tree};
use std::collections::BTreeMap;
use std::path::PathBuf;

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

/// Issue 18, finding 9: temp files a killed `add`/`del` left in the deploy
/// root (what a SIGKILL between "temp written" and "renamed" leaves) are
/// removed by the next `status`/`del`; a live writer's (lock held) stay.
#[test]
fn temp_files_of_a_killed_deploy_are_removed_by_status_and_del() {
    let w = world("        - write: /opt/app/conf\n          content: ok\n");
    let out = w.add("t");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = w.root.join("opt/app");
    let dead = [
        dir.join(".charly-tmp-999999-1"),
        dir.join(".charly-tmp-999999-2"),
    ];
    for d in &dead {
        std::fs::write(d, "half").expect("leftover");
    }
    let live = dir.join(".charly-tmp-1-7");
    std::fs::write(&live, "being written").expect("live");
    let mut holder = hold_lock(&live);
    let st = w
        .cmd()
        .args(["bundle", "status", "t"])
        .output()
        .expect("status");
    let live_kept = live.exists();
    let _ = holder.kill();
    let _ = holder.wait();
    assert!(
        st.status.success(),
        "status clean once the leftovers are gone: {}{}",
        String::from_utf8_lossy(&st.stdout),
        String::from_utf8_lossy(&st.stderr)
    );
    for d in &dead {
        assert!(!d.exists(), "{} left", d.display());
    }
    assert!(live_kept, "a live writer's temp file was removed");
    // `del` sweeps too (the live one is now dead).
    let del = w.cmd().args(["bundle", "del", "t"]).output().expect("del");
    assert!(
        del.status.success(),
        "{}",
        String::from_utf8_lossy(&del.stderr)
    );
    assert!(!w.root.join("opt/app").exists(), "del removed everything");
}

/// `copy:` reads only inside the candy directory: a symlink there to a file
/// outside is not followed (nothing from outside lands in the root).
#[test]
fn copy_source_symlinked_out_of_the_candy_is_refused() {
    let w = world("        - copy: leak\n          to: /opt/leak\n");
    std::os::unix::fs::symlink(
        w.outside.join("precious"),
        w.project.join("candy/evil/leak"),
    )
    .expect("ln");
    refused(
        &w,
        &[
            "candy/evil/charly.yml:6",
            "`leak` is a symlink leading outside",
        ],
    );
    assert!(!w.root.join("opt/leak").exists());
}
