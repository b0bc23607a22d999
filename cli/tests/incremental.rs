//! Incremental generation is a from-scratch generation: random edits to a
//! project (content, rename, delete, add, touch without change, an edit
//! that keeps size and mtime, a candy definition, a box's candy list, a
//! hand edit of a generated file),
//! each followed by `box generate --all` on a store that remembers the
//! previous runs (the no-op journal, its memo of present keys and
//! untouched build directories; or, with `--no-journal`, the parse cache,
//! the directory listings, the resolution and nodes' own key inputs kept
//! in the store), must leave the same build directories,
//! byte for byte, and the same node keys as a run on an empty store over a
//! copy of the project.

use proptest::prelude::*;
use std::path::{Path, PathBuf};

const CANDIES: usize = 6;
const BOXES: usize = 3;
/// Box names where one is a prefix of another (`b-x` sorts between `b`
/// and `b/Containerfile`).
const BOX_NAMES: [&str; BOXES] = ["b", "b-x", "bx"];

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, text).expect("write");
}

fn candy_yml(i: usize, env: &str) -> String {
    format!(
        "candy:\n    version: 1.0.0\n    name: c{i}\n    env:\n        C{i}_VALUE: \"{env}\"\n    \
         task:\n        - copy: files/a.conf\n          to: /opt/c{i}/a.conf\n          user: root\n        \
         - copy: files/b.conf\n          to: /opt/c{i}/b.conf\n          user: root\n"
    )
}

fn box_yml(b: usize, candies: &[usize]) -> String {
    let list: String = candies
        .iter()
        .map(|c| format!("        - c{c}\n"))
        .collect();
    format!(
        "box:\n    name: {}\n    version: 1.0.0\n    base: localhost/charly-scale-base:1\n    candy:\n{list}",
        BOX_NAMES[b]
    )
}

/// The root `charly.yml`, its distro's user id `uid`.
fn root_yml(uid: u32) -> String {
    format!(
        "version: 2026.160.1301\ndiscover: [box, candy]\ndefaults:\n    distro: [scale]\n    build: [none]\n\
         distro:\n    scale:\n        base_user: {{name: user, uid: {uid}, gid: 1000, home: /home/user}}\n        \
         format:\n            none:\n                install_template: |\n                    \
         RUN echo \"packages:{{{{range .Packages}}}} {{{{.}}}}{{{{end}}}}\"\n"
    )
}

/// A small project in the shape `scalegen` makes.
fn project(root: &Path) {
    write(&root.join("charly.yml"), &root_yml(1000));
    for i in 0..CANDIES {
        let dir = root.join(format!("candy/c{i}"));
        write(&dir.join("charly.yml"), &candy_yml(i, "0"));
        write(&dir.join("files/a.conf"), &format!("a of c{i}\n"));
        write(&dir.join("files/b.conf"), &format!("b of c{i}\n"));
        write(&dir.join("files/extra-0.txt"), "extra\n");
    }
    for (b, name) in BOX_NAMES.iter().enumerate() {
        let candies: Vec<usize> = (0..CANDIES).filter(|c| c % BOXES != b).collect();
        write(
            &root.join(format!("box/{name}/charly.yml")),
            &box_yml(b, &candies),
        );
    }
}

#[derive(Clone, Debug)]
enum Edit {
    /// New content in a copied file.
    Content(usize, u32),
    /// An unreferenced file renamed.
    Rename(usize, u32),
    /// An unreferenced file deleted (when there is one).
    Delete(usize),
    /// A new unreferenced file.
    Add(usize, u32),
    /// A file's mtime set to now, content unchanged.
    Touch(usize),
    /// Same size, the old mtime put back.
    KeepMtime(usize, u8),
    /// The candy's definition changes.
    Definition(usize, u32),
    /// A box's candy list loses or regains a candy.
    BoxList(usize, usize),
    /// A generated Containerfile edited by hand (generation puts it back).
    Output(usize),
    /// The root's distro definition changes (every box depends on it).
    Root(u32),
}

fn edit() -> impl Strategy<Value = Edit> {
    let c = 0..CANDIES;
    prop_oneof![
        (c.clone(), any::<u32>()).prop_map(|(c, n)| Edit::Content(c, n)),
        (c.clone(), any::<u32>()).prop_map(|(c, n)| Edit::Rename(c, n)),
        c.clone().prop_map(Edit::Delete),
        (c.clone(), any::<u32>()).prop_map(|(c, n)| Edit::Add(c, n)),
        c.clone().prop_map(Edit::Touch),
        (c.clone(), any::<u8>()).prop_map(|(c, n)| Edit::KeepMtime(c, n)),
        (c.clone(), any::<u32>()).prop_map(|(c, n)| Edit::Definition(c, n)),
        (0..BOXES, c).prop_map(|(b, c)| Edit::BoxList(b, c)),
        (0..BOXES).prop_map(Edit::Output),
        (0..3u32).prop_map(Edit::Root),
    ]
}

fn extras(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir.join("files"))
        .expect("files")
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("extra-"))
        })
        .collect();
    v.sort();
    v
}

fn apply(root: &Path, e: &Edit) {
    let candy = |c: usize| root.join(format!("candy/c{c}"));
    match e {
        Edit::Content(c, n) => {
            let p = candy(*c).join("files/a.conf");
            let mut t = std::fs::read_to_string(&p).expect("read");
            t.push_str(&format!("line {n}\n"));
            std::fs::write(&p, t).expect("write");
        }
        Edit::Rename(c, n) => {
            if let Some(f) = extras(&candy(*c)).first() {
                let to = candy(*c).join(format!("files/extra-r{n}.txt"));
                std::fs::rename(f, to).expect("rename");
            }
        }
        Edit::Delete(c) => {
            if let Some(f) = extras(&candy(*c)).last() {
                std::fs::remove_file(f).expect("delete");
            }
        }
        Edit::Add(c, n) => write(
            &candy(*c).join(format!("files/extra-{n}.txt")),
            &format!("added {n}\n"),
        ),
        Edit::Touch(c) => {
            let f = std::fs::File::options()
                .write(true)
                .open(candy(*c).join("files/b.conf"))
                .expect("open");
            f.set_modified(std::time::SystemTime::now()).expect("touch");
        }
        Edit::KeepMtime(c, n) => {
            let p = candy(*c).join("files/b.conf");
            let old = std::fs::metadata(&p)
                .expect("meta")
                .modified()
                .expect("mtime");
            let mut bytes = std::fs::read(&p).expect("read");
            bytes[0] = b'a' + n % 26;
            std::fs::write(&p, &bytes).expect("write");
            let f = std::fs::File::options().write(true).open(&p).expect("open");
            f.set_modified(old).expect("restore mtime");
        }
        Edit::Definition(c, n) => write(
            &candy(*c).join("charly.yml"),
            &candy_yml(*c, &n.to_string()),
        ),
        Edit::BoxList(b, c) => {
            let p = root.join(format!("box/{}/charly.yml", BOX_NAMES[*b]));
            let text = std::fs::read_to_string(&p).expect("read");
            let mut list: Vec<usize> = text
                .lines()
                .filter_map(|l| l.trim().strip_prefix("- c"))
                .map(|n| n.parse().expect("candy number"))
                .collect();
            if let Some(at) = list.iter().position(|x| x == c) {
                if list.len() > 1 {
                    list.remove(at);
                }
            } else {
                list.push(*c);
            }
            write(&p, &box_yml(*b, &list));
        }
        Edit::Root(n) => write(&root.join("charly.yml"), &root_yml(1000 + n)),
        Edit::Output(b) => {
            let p = root.join(format!(".build/{}/Containerfile", BOX_NAMES[*b]));
            if p.exists() {
                std::fs::write(&p, "FROM scratch\n").expect("hand edit");
            }
        }
    }
}

/// `box generate --all ARGS --summary-json SUMMARY` on `root` with
/// `store`: its stderr, and the node ids and keys of the summary.
fn run_generate(
    root: &Path,
    store: &Path,
    racy_ms: &str,
    summary: &Path,
    args: &[&str],
) -> (String, Vec<(String, String)>) {
    let out = std::process::Command::new(assert_cmd::cargo::cargo_bin("charly"))
        .env("NO_COLOR", "1")
        .env("CHARLY_CACHE_DIR", store)
        .env("CHARLY_JOURNAL_RACY_MS", racy_ms)
        .env_remove("CHARLY_NO_JOURNAL")
        .env_remove("CHARLY_REMOTE")
        .arg("-C")
        .arg(root)
        .args(["box", "generate", "--all"])
        .args(args)
        .arg("--summary-json")
        .arg(summary)
        .output()
        .expect("charly runs");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "generate failed:\n{err}");
    let s: serde_json::Value =
        serde_json::from_slice(&std::fs::read(summary).expect("summary")).expect("json");
    let mut v: Vec<(String, String)> = s["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| {
            (
                n["id"].as_str().expect("id").into(),
                n["key"].as_str().expect("key").into(),
            )
        })
        .collect();
    v.sort();
    (err, v)
}

/// `box generate --all` on `root` with `store`: the node ids and keys.
fn generate(root: &Path, store: &Path, racy_ms: &str, summary: &Path) -> Vec<(String, String)> {
    run_generate(root, store, racy_ms, summary, &["-q"]).1
}

/// `box generate --all --explain` (stat trusted): how many boxes it
/// carried over, and the node ids and keys.
fn generate_explained(root: &Path, store: &Path, summary: &Path) -> (usize, Vec<(String, String)>) {
    let (err, keys) = run_generate(root, store, "0", summary, &["--explain"]);
    let carried = err
        .lines()
        .find_map(|l| {
            let rest = l.split("explain: ").nth(1)?;
            let (n, tail) = rest.split_once(" of ")?;
            tail.contains("carried over")
                .then(|| n.parse().expect("count"))
        })
        .unwrap_or(0);
    (carried, keys)
}

/// An edit to one candy re-derives only the boxes that contain it; the
/// others are carried over with the keys a fresh run gives them. An edit
/// to the root re-derives every box.
#[test]
fn an_edit_rederives_only_the_boxes_it_touches() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("p");
    let store = tmp.path().join("store");
    let s = tmp.path().join("s.json");
    project(&root);
    assert_eq!(generate_explained(&root, &store, &s).0, 0, "first run");
    // The first run wrote .containerignore and .dockerignore into the
    // project root, inputs of the next: that one derives everything again.
    assert_eq!(generate_explained(&root, &store, &s).0, 0, "second run");
    // c0 is in `b-x` and `bx`, not in `b`.
    apply(&root, &Edit::Content(0, 7));
    let (carried, keys) = generate_explained(&root, &store, &s);
    assert_eq!(carried, 1, "only `b` is carried over");
    let fresh_root = tmp.path().join("fresh");
    charly_testutil::copy_project(&root, &fresh_root);
    let _ = std::fs::remove_dir_all(fresh_root.join(".build"));
    let fresh = generate(&fresh_root, &tmp.path().join("fresh-store"), "0", &s);
    assert_eq!(keys, fresh);
    assert_eq!(build_tree(&root), build_tree(&fresh_root));
    // A box file is global: every box is derived again.
    apply(&root, &Edit::Root(2));
    assert_eq!(generate_explained(&root, &store, &s).0, 0, "root edit");
    apply(&root, &Edit::Content(1, 3));
    let (carried, _) = generate_explained(&root, &store, &s);
    assert_eq!(carried, 1, "c1 is in `b` and `bx`");
}

/// Every file below `.build` (not the locks) with its content, by relative path.
fn build_tree(root: &Path) -> Vec<(String, Vec<u8>)> {
    let build = root.join(".build");
    let mut v: Vec<(String, Vec<u8>)> = walkdir::WalkDir::new(&build)
        .into_iter()
        .flatten()
        .filter(|e| e.file_type().is_file())
        .filter_map(|e| {
            let rel = e
                .path()
                .strip_prefix(&build)
                .ok()?
                .to_string_lossy()
                .into_owned();
            (!rel.starts_with(".locks")).then(|| (rel, std::fs::read(e.path()).expect("read")))
        })
        .collect();
    v.sort();
    v
}

proptest! {
    // 12 cases by default; `CHARLY_INCREMENTAL_CASES=N` for a longer soak.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("CHARLY_INCREMENTAL_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(12),
        ..ProptestConfig::default()
    })]

    #[test]
    fn incremental_generation_equals_a_fresh_one(
        steps in prop::collection::vec(prop::collection::vec(edit(), 1..4), 1..5),
        trust_stat in any::<bool>(),
        no_journal in any::<bool>(),
    ) {
        // The racy window: 0 lets the journal trust every fingerprint (and
        // replay); the real one (2 s) makes each run after an edit
        // unreplayable, so the memo does the work.
        let racy_ms = if trust_stat { "0" } else { "2000" };
        let tmp = tempfile::tempdir().expect("tmp");
        let root = tmp.path().join("p");
        let store = tmp.path().join("store");
        project(&root);
        generate(&root, &store, racy_ms, &tmp.path().join("s0.json"));
        for (n, edits) in steps.iter().enumerate() {
            for e in edits {
                apply(&root, e);
            }
            let summary = tmp.path().join(format!("s{n}.json"));
            let inc = match no_journal {
                true => run_generate(&root, &store, racy_ms, &summary, &["-q", "--no-journal"]).1,
                false => generate(&root, &store, racy_ms, &summary),
            };
            let fresh_root = tmp.path().join(format!("fresh{n}"));
            charly_testutil::copy_project(&root, &fresh_root);
            let _ = std::fs::remove_dir_all(fresh_root.join(".build"));
            let fresh = generate(
                &fresh_root,
                &tmp.path().join(format!("fresh-store{n}")),
                racy_ms,
                &tmp.path().join(format!("f{n}.json")),
            );
            prop_assert_eq!(&inc, &fresh, "keys after {:?}", edits);
            prop_assert_eq!(build_tree(&root), build_tree(&fresh_root), "build dirs after {:?}", edits);
            std::fs::remove_dir_all(&fresh_root).expect("clean");
        }
    }
}
