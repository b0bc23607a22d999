//! Everyday use: settings files that set flag defaults (and lose to flags
//! and the environment), `box list` as a table, a reader that leaves a
//! pipe early, and mode flags that only change the nodes they affect.

use assert_cmd::Command;
use std::path::Path;

fn charly(project: &Path, home: &Path) -> Command {
    let mut c = Command::cargo_bin("charly").expect("binary");
    c.env("NO_COLOR", "1")
        .env("XDG_CONFIG_HOME", home.join("config"))
        .env("CHARLY_CACHE_DIR", home.join("store"))
        .env_remove("CHARLY_DEV_LOCAL_PKG")
        .env_remove("CHARLY_JOBS")
        .env_remove("CHARLY_REMOTE")
        .env_remove("CHARLY_PROGRESS")
        .arg("-C")
        .arg(project);
    c
}

fn stdout(c: &mut Command) -> String {
    let out = c.output().expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `box generate --stdout hello`: needs dev-local-pkg (the example's local
/// .deb has no release download).
fn generate(project: &Path, home: &Path, extra: &[&str]) -> std::process::Output {
    charly(project, home)
        .args(["box", "generate", "--stdout", "hello"])
        .args(extra)
        .output()
        .expect("runs")
}

#[test]
fn settings_files_give_flag_defaults_that_flags_and_env_override() {
    let tmp = tempfile::tempdir().expect("tmp");
    let project = tmp.path().join("hello");
    charly_testutil::copy_project(&charly_testutil::example(), &project);
    // The example sets dev_local_pkg itself; start without it.
    std::fs::remove_dir_all(project.join(".charly")).expect("rm");
    let home = tmp.path();
    // No setting: the local package has no release download.
    let out = generate(&project, home, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--dev-local-pkg"));
    // The user's setting turns it on; the project's wins over it.
    std::fs::create_dir_all(home.join("config/charly")).expect("mkdir");
    std::fs::write(
        home.join("config/charly/settings.yml"),
        "dev_local_pkg: true\n",
    )
    .expect("w");
    let out = generate(&project, home, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("/tmp/charly-pkgs/"));
    std::fs::create_dir_all(project.join(".charly")).expect("mkdir");
    std::fs::write(
        project.join(".charly/settings.yml"),
        "dev_local_pkg: false\n",
    )
    .expect("w");
    assert_eq!(generate(&project, home, &[]).status.code(), Some(1));
    // A flag wins over both, the environment over the files.
    std::fs::write(
        project.join(".charly/settings.yml"),
        "dev_local_pkg: true\njobs: 1\n",
    )
    .expect("w");
    assert!(generate(&project, home, &[]).status.success());
    assert_eq!(
        generate(&project, home, &["--dev-local-pkg=false"])
            .status
            .code(),
        Some(1)
    );
    let out = charly(&project, home)
        .env("CHARLY_DEV_LOCAL_PKG", "false")
        .args(["box", "generate", "--stdout", "hello"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(1));
    // `--dev-local-pkg BOX` still reads BOX as a box.
    assert!(
        generate(&project, home, &["--dev-local-pkg"])
            .status
            .success()
    );
    // graph and explain take the same default: after a generate, all cached.
    stdout(charly(&project, home).args(["box", "generate", "--all"]));
    let g: serde_json::Value = serde_json::from_str(&stdout(charly(&project, home).args([
        "graph",
        "--generate",
        "--format",
        "json",
    ])))
    .expect("json");
    let states: Vec<&str> = g["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter_map(|n| n["state"].as_str())
        .collect();
    assert!(
        !states.is_empty() && states.iter().all(|s| *s == "cached"),
        "{states:?}"
    );
    // A misspelt or mistyped setting is refused with its place.
    std::fs::write(project.join(".charly/settings.yml"), "dev_locl_pkg: true\n").expect("w");
    let out = charly(&project, home)
        .args(["box", "list"])
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(".charly/settings.yml:1:1: unknown field `dev_locl_pkg`"),
        "{err}"
    );
    std::fs::write(project.join(".charly/settings.yml"), "jobs: many\n").expect("w");
    let out = charly(&project, home)
        .args(["box", "list"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("settings.yml:1:7"));
}

#[test]
fn box_list_is_a_table_without_trailing_blanks() {
    let tmp = tempfile::tempdir().expect("tmp");
    let text = stdout(charly(&charly_testutil::example(), tmp.path()).args(["box", "list"]));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["BOX", "BASE", "DISTRO", "CANDIES"]
    );
    assert!(lines.iter().all(|l| !l.ends_with(' ')), "{text:?}");
    let base = lines.iter().find(|l| l.starts_with("base ")).expect("base");
    assert_eq!(
        base.split_whitespace().collect::<Vec<_>>(),
        ["base", "builder:debootstrap", "debian:12"]
    );
    // Columns line up: CANDIES starts where hello's candies do.
    let hello = lines
        .iter()
        .find(|l| l.starts_with("hello "))
        .expect("hello");
    assert_eq!(lines[0].find("CANDIES"), hello.find("nodejs"));
}

#[test]
fn a_reader_that_leaves_early_is_not_an_error() {
    // The corpus graph is far larger than a pipe's buffer.
    let tmp = tempfile::tempdir().expect("tmp");
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("charly"))
        .env("CHARLY_CACHE_DIR", tmp.path().join("store"))
        .arg("-C")
        .arg(charly_testutil::corpus())
        .arg("graph")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("runs");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("waits");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(!err.contains("Broken pipe"), "{err}");
}

/// A box repository checked out on its own (not inside the candy
/// library's tree) resolves its `@github.com/overthinkos/overthink/candy/…`
/// references with `--import-repo IDENTITY=DIR`; without it, it says which
/// repository it could not find.
#[test]
fn a_box_repository_outside_its_library_uses_import_repo() {
    let t = tempfile::tempdir().expect("tmp");
    let repo = t.path().join("debian");
    charly_testutil::copy_project(&charly_testutil::corpus_174().join("box/debian"), &repo);
    let list = |extra: &[&str]| {
        Command::cargo_bin("charly")
            .expect("binary")
            .env("CHARLY_CACHE_DIR", t.path().join("cache"))
            .arg("-C")
            .arg(&repo)
            .args(extra)
            .args(["box", "list", "--json"])
            .output()
            .expect("list")
    };
    let lib = format!(
        "github.com/overthinkos/overthink={}",
        charly_testutil::corpus_174().display()
    );
    let out = list(&["--import-repo", &lib]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let boxes = v.as_array().expect("boxes");
    assert_eq!(boxes.len(), 5, "{v}");
    assert!(boxes.iter().all(|b| b["error"].is_null()), "{v}");
    let coder = boxes
        .iter()
        .find(|b| b["name"] == "debian-coder")
        .expect("coder");
    assert!(
        coder["candies"].as_array().is_some_and(|c| c.len() > 30),
        "{coder}"
    );

    let out = list(&[]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let unresolved: Vec<&str> = v
        .as_array()
        .expect("boxes")
        .iter()
        .filter_map(|b| b["error"].as_str())
        .collect();
    assert_eq!(unresolved.len(), 3, "{v}");
    assert!(
        unresolved[0].contains(
            "is not available offline (map it with --import github.com/overthinkos/overthink=DIR)"
        ),
        "{unresolved:?}"
    );
}

/// `charly init` writes today's format (issue 44, item 12): the node form
/// of schema 2026.174, which validates as written, and `candy new` adds a
/// candy in the project's own form; `--format 2026.160` writes the
/// classic form.
#[test]
fn init_writes_the_node_form_unless_asked_for_the_classic_one() {
    let t = tempfile::tempdir().expect("tmp");
    let home = t.path().join("home");
    for (format, marker) in [
        (None, "version: 2026.174."),
        (Some("2026.160"), "version: 2026.160."),
    ] {
        let dir = t.path().join(format.unwrap_or("default"));
        let mut c = Command::cargo_bin("charly").expect("binary");
        c.env("NO_COLOR", "1").arg("init").arg(&dir);
        if let Some(f) = format {
            c.args(["--format", f]);
        }
        let out = c.output().expect("init");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let root = std::fs::read_to_string(dir.join("charly.yml")).expect("root");
        assert!(root.contains(marker), "{root}");
        stdout(charly(&dir, &home).args(["candy", "new", "extra-tools"]));
        let candy =
            std::fs::read_to_string(dir.join("candy/extra-tools/charly.yml")).expect("candy");
        let node = candy.starts_with("extra-tools:\n");
        assert_eq!(
            node,
            format.is_none(),
            "candy new writes the project's form: {candy}"
        );
        let out = charly(&dir, &home)
            .args(["validate", "--strict"])
            .output()
            .expect("validate");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{format:?}: {said}");
        assert!(
            said.contains("2 candies, 2 boxes (2 resolve): 0 errors, 0 warnings"),
            "{said}"
        );
    }
}
