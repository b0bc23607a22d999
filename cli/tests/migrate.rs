//! `charly migrate --to 2026.174 DIR`: writes a node-form copy next to the
//! project (never over an existing directory), or rewrites it in place
//! only with `--write`; what cannot be expressed is a warning at its
//! file:line:col; the result validates with the same boxes.

use assert_cmd::Command;
use charly_testutil::{tree, write};
use std::path::Path;

fn charly() -> Command {
    let mut c = Command::cargo_bin("charly").expect("binary");
    c.env("NO_COLOR", "1");
    c
}

const ROOT: &str = "version: 2026.160.1301\ndiscover:\n    - box\n    - candy\ndefaults:\n    build:\n        - deb\n";

const CANDY: &str = "candy:\n    version: 2026.1.100\n    description: a tool\n    package:\n        - curl\n    task:\n        - mkdir: /opt/tool\n          user: root\n    eval:\n        - id: tool-dir\n          file: /opt/tool\n          exists: true\n";

const BOX: &str = "box:\n    name: app\n    version: 2026.1.100\n    base: debian:13\n    distro: [debian:13, debian]\n    candy: [tool]\n    port:\n        - 8080:80\n";

fn project(dir: &Path) {
    write(dir, "charly.yml", ROOT);
    write(dir, "candy/tool/charly.yml", CANDY);
    write(dir, "box/app/charly.yml", BOX);
}

fn run(args: &[&str]) -> (bool, String) {
    let out = charly().args(args).output().expect("runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn migrate_writes_a_sibling_copy_and_never_overwrites_without_write() {
    let t = tempfile::tempdir().expect("tmp");
    let dir = t.path().join("proj");
    project(&dir);
    let before = tree(&dir);
    let d = dir.to_str().expect("utf8");
    let (ok, err) = run(&["migrate", "--to", "2026.174", d]);
    assert!(ok, "{err}");
    assert!(
        err.contains("box/app/charly.yml:7:5") && err.contains("`port:` of box `app`"),
        "{err}"
    );
    assert_eq!(tree(&dir), before, "the input is untouched");
    let out = t.path().join("proj-2026.174");
    let text = std::fs::read_to_string(out.join("candy/tool/charly.yml")).expect("written");
    assert!(text.starts_with("tool:\n    candy:\n"), "{text}");
    assert!(text.contains("plugin: file"), "{text}");
    // The copy is a node-form project with the same box.
    let o = out.to_str().expect("utf8");
    let (ok, err) = run(&["-C", o, "validate"]);
    assert!(ok, "{err}");
    assert!(
        err.contains("1 candies, 1 boxes (1 resolve): 0 errors"),
        "{err}"
    );
    // A second run does not overwrite the copy.
    let copy = tree(&out);
    let (ok, err) = run(&["migrate", "--to", "2026.174", d]);
    assert!(!ok);
    assert!(err.contains("exists"), "{err}");
    assert_eq!(tree(&out), copy);
    // Not into the project itself.
    let inside = dir.join("sub");
    let (ok, err) = run(&[
        "migrate",
        "--to",
        "2026.174",
        d,
        "--out",
        inside.to_str().expect("utf8"),
    ]);
    assert!(!ok && err.contains("inside the project"), "{err}");
    assert!(!inside.exists());
    // Unknown target version.
    let (ok, err) = run(&["migrate", "--to", "2027.1", d, "--out", "/nonexistent/x"]);
    assert!(!ok && err.contains("cannot migrate to `2027.1`"), "{err}");
}

#[test]
fn migrate_write_rewrites_in_place_and_refuses_a_node_form_project() {
    let t = tempfile::tempdir().expect("tmp");
    let dir = t.path().join("proj");
    project(&dir);
    let d = dir.to_str().expect("utf8");
    let (ok, err) = run(&["migrate", "--to", "2026.174", "--write", d]);
    assert!(ok, "{err}");
    let root = std::fs::read_to_string(dir.join("charly.yml")).expect("root");
    assert!(root.starts_with("version: 2026.174.1100\n"), "{root}");
    let (ok, err) = run(&["-C", d, "validate"]);
    assert!(ok, "{err}");
    let (ok, err) = run(&["migrate", "--to", "2026.174", "--write", d]);
    assert!(!ok);
    assert!(err.contains("already in the node form"), "{err}");
}

/// Every file of `dir` (relative path → bytes), `.build` left out.
fn bytes(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    walkdir::WalkDir::new(dir)
        .into_iter()
        .filter_entry(|e| e.file_name() != ".build")
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
        .map(|e| {
            let rel = e.path().strip_prefix(dir).expect("rel");
            (
                rel.display().to_string(),
                std::fs::read(e.path()).expect("read"),
            )
        })
        .collect()
}

/// Issue 43, finding 6: a half-migrated project (one candy file already in
/// the node form, as a copy of a migrated candy or a run that stopped
/// part-way leaves it) loses no byte with `--write`: the node-form file is
/// left as it is (said), every replaced file is in the named backup, and
/// the result validates.
#[test]
fn migrate_write_on_a_half_migrated_project_loses_no_byte() {
    let t = tempfile::tempdir().expect("tmp");
    let dir = t.path().join("proj");
    project(&dir);
    write(
        &dir,
        "candy/other/charly.yml",
        &CANDY.replace("a tool", "another"),
    );
    let d = dir.to_str().expect("utf8");
    // The other candy as a migrated copy has it.
    let copy = t.path().join("copy");
    let (ok, err) = run(&[
        "migrate",
        "--to",
        "2026.174",
        d,
        "--out",
        copy.to_str().expect("utf8"),
    ]);
    assert!(ok, "{err}");
    let node_form = std::fs::read(copy.join("candy/other/charly.yml")).expect("migrated");
    std::fs::write(dir.join("candy/other/charly.yml"), &node_form).expect("half");
    let before = bytes(&dir);
    let (ok, err) = run(&["migrate", "--to", "2026.174", "--write", d]);
    assert!(ok, "{err}");
    assert!(
        err.contains("candy/other/charly.yml left as it is"),
        "{err}"
    );
    let after = bytes(&dir);
    assert_eq!(after["candy/other/charly.yml"], node_form, "not emptied");
    for (rel, data) in &after {
        assert!(!data.is_empty(), "{rel} is empty");
    }
    // Every replaced file is in the backup the output names.
    let backup = err
        .lines()
        .find_map(|l| l.strip_prefix("the files it replaced are kept in "))
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| panic!("no backup named: {err}"));
    for (rel, data) in &before {
        if after.get(rel) != Some(data) {
            assert_eq!(
                std::fs::read(backup.join(rel)).ok().as_ref(),
                Some(data),
                "{rel} is in the backup"
            );
        }
    }
    let (ok, err) = run(&["-C", d, "validate"]);
    assert!(ok, "{err}");
}

/// `--write` changes all files or none: a symlinked YAML file is refused
/// before anything is written, and a file that cannot be created (its
/// directory is a file) leaves every other file as it was.
#[test]
fn migrate_write_refuses_links_and_changes_all_files_or_none() {
    let t = tempfile::tempdir().expect("tmp");
    let dir = t.path().join("proj");
    project(&dir);
    let d = dir.to_str().expect("utf8");
    let elsewhere = t.path().join("elsewhere.yml");
    std::fs::write(&elsewhere, CANDY).expect("target");
    std::fs::create_dir_all(dir.join("candy/linked")).expect("dir");
    std::os::unix::fs::symlink(&elsewhere, dir.join("candy/linked/charly.yml")).expect("link");
    let before = bytes(&dir);
    let (ok, err) = run(&["migrate", "--to", "2026.174", "--write", d]);
    assert!(!ok, "{err}");
    assert!(
        err.contains("candy/linked/charly.yml (a symlink)") && err.contains("nothing was changed"),
        "{err}"
    );
    assert_eq!(bytes(&dir), before);
    std::fs::remove_file(dir.join("candy/linked/charly.yml")).expect("rm");
    // A vocabulary makes the migration create charly/charly.yml, but
    // `charly` is a file: staging it fails after the others were staged.
    write(
        &dir,
        "build.yml",
        "distro:\n    mine:\n        bootstrap:\n            install_cmd: apt-get install -y\n",
    );
    write(&dir, "charly", "not a directory\n");
    let before = bytes(&dir);
    let (ok, err) = run(&["migrate", "--to", "2026.174", "--write", d]);
    assert!(!ok, "{err}");
    assert!(err.contains("nothing was changed"), "{err}");
    assert_eq!(bytes(&dir), before, "all files or none");
}
