//! The parse cache (`<store>/trees/`, charly_engine::trees) never changes
//! what a project loads: the warnings and errors of a run that reads every
//! tree from it are the ones of a run that parses every file, a cache that
//! is damaged is ignored and written again, and runs that fill it at the
//! same time leave a sound file.

use charly_testutil::{Sandbox, graph_fixture};
use std::path::{Path, PathBuf};
use std::process::Output;

struct Env(Sandbox);

impl std::ops::Deref for Env {
    type Target = Sandbox;
    fn deref(&self) -> &Sandbox {
        &self.0
    }
}

impl Env {
    fn new() -> Env {
        let sb = Sandbox::new(assert_cmd::cargo::cargo_bin("charly"), &graph_fixture());
        // An unknown key (a near miss of `description`) warns with its
        // place and a suggestion (the project allows unknown fields, so it
        // is a warning, not an error); a parse error in a box file is an
        // error.
        let candy = sb.project.join("candy/common/charly.yml");
        let text = std::fs::read_to_string(&candy).expect("read");
        std::fs::write(
            &candy,
            text.replace(
                "    version: 1.0.0\n",
                "    version: 1.0.0\n    descriptoin: common things\n",
            ),
        )
        .expect("write");
        std::fs::create_dir_all(sb.project.join(".charly")).expect("mkdir");
        std::fs::write(
            sb.project.join(".charly/settings.yml"),
            "allow_unknown_fields: true\n",
        )
        .expect("settings");
        // The cache is only written into a store that exists.
        std::fs::create_dir_all(&sb.store).expect("store");
        Env(sb)
    }

    /// Every run loads the project (the journal would replay an unchanged
    /// `validate` without reading a tree; here the trees are the point).
    fn cmd(&self, args: &[&str]) -> std::process::Command {
        let mut c = self.command(args);
        c.env("CHARLY_NO_JOURNAL", "true");
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("charly runs")
    }

    /// `n` runs of `args` at the same time: what each said.
    fn run_together(&self, n: usize, args: &[&str]) -> Vec<Output> {
        let children: Vec<std::process::Child> = (0..n)
            .map(|_| {
                self.cmd(args)
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .expect("spawn")
            })
            .collect();
        children
            .into_iter()
            .map(|c| c.wait_with_output().expect("wait"))
            .collect()
    }

    /// What a generate said (the project's path left out) and the
    /// Containerfiles it wrote.
    fn generated(&self, o: &Output) -> (Said, Files) {
        let p = self.project.to_string_lossy().into_owned();
        let (code, out, err) = said(o);
        let mut files: Files = std::fs::read_dir(self.project.join(".build"))
            .expect(".build")
            .flatten()
            .map(|e| e.path().join("Containerfile"))
            .filter(|f| f.is_file())
            .map(|f| {
                let rel = f
                    .strip_prefix(&self.project)
                    .expect("inside")
                    .to_string_lossy()
                    .into_owned();
                (rel, std::fs::read(&f).expect("read"))
            })
            .collect();
        files.sort();
        assert!(!files.is_empty(), "generated something: {err}");
        (
            (code, out.replace(&p, "<P>"), err.replace(&p, "<P>")),
            files,
        )
    }

    /// The cache file (the one file under `trees/`), if any.
    fn cache_file(&self) -> Option<PathBuf> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(self.store.join("trees"))
            .ok()?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "bin"))
            .collect();
        assert!(files.len() <= 1, "one cache file per project: {files:?}");
        files.pop()
    }
}

/// What a run said: exit code, stdout, stderr.
type Said = (Option<i32>, String, String);

/// Files by path, with their bytes.
type Files = Vec<(String, Vec<u8>)>;

fn said(o: &Output) -> Said {
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn bytes(p: &Path) -> Vec<u8> {
    std::fs::read(p).expect("read cache")
}

/// The file's inode: a cache written again is a new file (renamed over).
fn inode(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).expect("cache").ino()
}

#[test]
fn a_cached_tree_warns_and_loads_like_a_parsed_one() {
    let env = Env::new();
    let cold = said(&env.run(&["validate"]));
    assert!(
        cold.1.contains("descriptoin") || cold.2.contains("descriptoin"),
        "the unknown key is reported: {cold:?}"
    );
    let file = env.cache_file().expect("the first run fills the cache");
    let filled = (bytes(&file), inode(&file));
    let warm = said(&env.run(&["validate"]));
    assert_eq!(cold, warm, "the same report from the cache");
    assert_eq!(
        (bytes(&file), inode(&file)),
        filled,
        "every tree came from the cache (nothing new to write)"
    );
    // The loaded model too.
    let list = said(&env.run(&["box", "list", "--json"]));
    std::fs::remove_dir_all(env.store.join("trees")).expect("rm");
    assert_eq!(said(&env.run(&["box", "list", "--json"])), list);

    // An edit is parsed again and reported at its new place.
    let candy = env.project.join("candy/common/charly.yml");
    let text = std::fs::read_to_string(&candy).expect("read");
    std::fs::write(&candy, format!("# moved down\n{text}")).expect("write");
    let edited = said(&env.run(&["validate"]));
    std::fs::remove_dir_all(env.store.join("trees")).expect("rm");
    assert_eq!(said(&env.run(&["validate"])), edited);
    assert_ne!(edited, cold, "the warning's line moved");
}

#[test]
fn a_damaged_cache_is_ignored_and_written_again() {
    let env = Env::new();
    let want = said(&env.run(&["validate"]));
    let file = env.cache_file().expect("filled");
    let good = bytes(&file);
    let mut damaged: Vec<Vec<u8>> = vec![
        Vec::new(),
        good[..good.len() / 2].to_vec(),
        good[..good.len() - 1].to_vec(),
        b"not a cache at all".to_vec(),
    ];
    for at in [0, 9, 45, good.len() / 2, good.len() - 1] {
        let mut b = good.clone();
        b[at] ^= 0x5a;
        damaged.push(b);
    }
    for (i, bad) in damaged.iter().enumerate() {
        std::fs::write(&file, bad).expect("damage");
        let damaged_inode = inode(&file);
        assert_eq!(said(&env.run(&["validate"])), want, "damage {i}");
        assert_eq!(bytes(&file), good, "damage {i}: written again");
        assert_ne!(inode(&file), damaged_inode, "damage {i}: a new file");
    }
    // Generating on top of a damaged cache gives what a clean store gives.
    std::fs::write(&file, &good[..good.len() / 3]).expect("damage");
    let args = ["box", "generate", "--all", "-q", "--no-journal"];
    let damaged_run = env.generated(&env.run(&args));
    let fresh = Env::new();
    assert_eq!(fresh.generated(&fresh.run(&args)), damaged_run);
}

#[test]
fn runs_at_the_same_time_leave_a_sound_cache() {
    let env = Env::new();
    let want = said(&env.run(&["validate"]));
    std::fs::remove_dir_all(env.store.join("trees")).expect("rm");
    for out in env.run_together(6, &["validate"]) {
        assert_eq!(said(&out), want);
    }
    let file = env.cache_file().expect("filled");
    let left = (bytes(&file), inode(&file));
    let resolution = file.with_extension("res");
    let resolved = (bytes(&resolution), inode(&resolution));
    // Sound: the next run takes every tree from it and writes nothing,
    // nor resolves again (charly_engine::resolved).
    assert_eq!(said(&env.run(&["validate"])), want);
    assert_eq!((bytes(&file), inode(&file)), left);
    assert_eq!((bytes(&resolution), inode(&resolution)), resolved);
    // No temporary files left behind: the parse cache, the directory
    // listings (charly_engine::dirs) and the resolution, one file each.
    let mut names: Vec<String> = std::fs::read_dir(env.store.join("trees"))
        .expect("trees")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let stem = file.file_stem().expect("stem").to_string_lossy();
    assert_eq!(
        names,
        [
            format!("{stem}.bin"),
            format!("{stem}.dirs"),
            format!("{stem}.res")
        ]
    );
}

/// Nodes' own key inputs (`<store>/trees/<id>.own`, charly_engine::graph::own):
/// generate runs at the same time leave a sound file, which the next run
/// reads whole (it writes nothing); a damaged one is written again; and
/// neither changes what a generate writes.
#[test]
fn own_inputs_are_kept_soundly_and_change_no_output() {
    let env = Env::new();
    let args = ["box", "generate", "--all", "-q", "--no-journal"];
    let want = env.generated(&env.run(&args));
    let own = env.cache_file().expect("filled").with_extension("own");
    assert!(own.is_file(), "the first generate keeps its own inputs");
    std::fs::remove_file(&own).expect("rm");
    for out in env.run_together(4, &args) {
        assert_eq!(out.status.code(), Some(0), "{}", said(&out).2);
    }
    let left = (bytes(&own), inode(&own));
    assert_eq!(env.generated(&env.run(&args)), want);
    assert_eq!((bytes(&own), inode(&own)), left, "read whole, not written");
    // Damaged: ignored, and written again as it was.
    let good = left.0;
    let mut bad = good.clone();
    let at = good.len() - 3;
    bad[at] ^= 0x5a;
    std::fs::write(&own, &bad).expect("damage");
    assert_eq!(env.generated(&env.run(&args)), want);
    assert_eq!(bytes(&own), good, "written again");
}
