//! The loader's directory listings (`<store>/trees/*.dirs`,
//! charly_engine::dirs) never change what a project loads: after each kind of
//! change to the project's directories (a candy added, a candy removed, a
//! file renamed, a file added in a new subdirectory, a file replaced by a
//! directory of the same name), a run on a store that remembers the last
//! run's listings says and writes what a run on an empty store does. An
//! unchanged project is answered from the listings alone (the file is not
//! written again); a changed one rewrites it.

use charly_testutil::{Sandbox, graph_fixture};
use std::path::{Path, PathBuf};

fn write(p: &Path, text: &str) {
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(p, text).expect("write");
}

/// What a run said (the project's path, the summary line and the tally of
/// quick nodes left out: a fresh store runs what a warm one finds cached),
/// and every file under `.build` with the digest of its bytes.
type Seen = (Option<i32>, String, String, Vec<(String, String)>);

fn run(sb: &Sandbox, store: &Path, args: &[&str]) -> Seen {
    let _ = std::fs::remove_dir_all(sb.project.join(".build"));
    let out = sb
        .command(args)
        .env("CHARLY_CACHE_DIR", store)
        .output()
        .expect("charly runs");
    let p = sb.project.to_string_lossy().into_owned();
    let text = |b: &[u8]| {
        String::from_utf8_lossy(b)
            .replace(&p, "<P>")
            .lines()
            .filter(|l| !l.starts_with("generate: ") && !l.contains(" quick nodes ("))
            .map(|l| format!("{l}\n"))
            .collect::<String>()
    };
    let mut files: Vec<(String, String)> = walkdir::WalkDir::new(sb.project.join(".build"))
        .into_iter()
        .flatten()
        .filter(|e| e.file_type().is_file())
        .map(|e| {
            let rel = e.path().strip_prefix(&sb.project).expect("inside");
            (
                rel.to_string_lossy().into_owned(),
                blake3::hash(&std::fs::read(e.path()).expect("read"))
                    .to_hex()
                    .to_string(),
            )
        })
        .collect();
    files.sort();
    (
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr),
        files,
    )
}

/// The listings file, and its inode (a file written again is a new one).
fn listings(store: &Path) -> (PathBuf, u64) {
    use std::os::unix::fs::MetadataExt;
    let file = std::fs::read_dir(store.join("trees"))
        .expect("trees")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "dirs"))
        .expect("a listings file");
    let ino = std::fs::metadata(&file).expect("meta").ino();
    (file, ino)
}

#[test]
fn remembered_listings_load_what_the_disk_holds() {
    let sb = Sandbox::new(assert_cmd::cargo::cargo_bin("charly"), &graph_fixture());
    // The listings are only written into a store that exists.
    std::fs::create_dir_all(&sb.store).expect("store");
    let generate = ["box", "generate", "--all", "--no-journal"];
    let p = sb.project.clone();

    // The first run also writes .containerignore (and says so).
    run(&sb, &sb.store, &generate);
    let first = run(&sb, &sb.store, &generate);
    assert_eq!(first.0, Some(0), "{}", first.2);
    let (file, mut ino) = listings(&sb.store);
    // Unchanged: answered from the listings; the file is not written again.
    assert_eq!(run(&sb, &sb.store, &generate), first);
    assert_eq!(listings(&sb.store), (file.clone(), ino));

    type Edit = Box<dyn Fn(&Path)>;
    let edits: Vec<(&str, Edit)> = vec![
        (
            "a candy added and used",
            Box::new(|p: &Path| {
                write(
                    &p.join("candy/extra/charly.yml"),
                    "candy:\n    version: 1.0.0\n    name: extra\n    task:\n        \
                     - copy: files/extra.conf\n          to: /etc/extra.conf\n          user: root\n",
                );
                write(&p.join("candy/extra/files/extra.conf"), "extra\n");
                let text = std::fs::read_to_string(p.join("box/left/charly.yml")).expect("read");
                std::fs::write(
                    p.join("box/left/charly.yml"),
                    text.replace("candy: [a-npm, common2]", "candy: [a-npm, common2, extra]"),
                )
                .expect("write");
            }),
        ),
        (
            "a file added in a new subdirectory of a candy",
            Box::new(|p: &Path| write(&p.join("candy/extra/files/more/more.conf"), "more\n")),
        ),
        (
            "a file of a candy renamed",
            Box::new(|p: &Path| {
                std::fs::rename(
                    p.join("candy/extra/files/extra.conf"),
                    p.join("candy/extra/files/renamed.conf"),
                )
                .expect("rename")
            }),
        ),
        (
            "a file replaced by a directory of the same name",
            Box::new(|p: &Path| {
                std::fs::remove_file(p.join("candy/b-npm/package.json")).expect("rm");
                write(&p.join("candy/b-npm/package.json/x"), "{}\n");
            }),
        ),
        (
            "a candy removed",
            Box::new(|p: &Path| {
                std::fs::remove_dir_all(p.join("candy/extra")).expect("rm");
            }),
        ),
    ];
    for (what, edit) in edits {
        // Past the timestamps' granularity: the edit is a change the last
        // run's stamps can tell (the racy window is 0 in tests).
        std::thread::sleep(std::time::Duration::from_millis(30));
        edit(&p);
        let remembered = run(&sb, &sb.store, &generate);
        let fresh_store = tempfile::tempdir().expect("tmp");
        let fresh = run(&sb, fresh_store.path(), &generate);
        assert_eq!(remembered, fresh, "after {what}");
        let now = listings(&sb.store).1;
        assert_ne!(now, ino, "after {what}: the listings are written again");
        ino = now;
    }
    // The edits were seen at all: the removed candy is missing from `left`.
    let last = run(&sb, &sb.store, &generate);
    assert_ne!(last.0, Some(0), "`extra` is gone: {}", last.2);
    assert!(last.2.contains("extra"), "{}", last.2);
}
