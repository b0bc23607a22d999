//! Golden tests over the real corpus (`../shared/corpus/overthink`, unmodified).
//!
//! They pin the resolved candy order and the cascade-resolved package sets of
//! several boxes, and check that every candy and box file loads.

use charly_rules::cascade;
use charly_rules::load::{self, LoadOptions, Project};
use charly_rules::resolve::{self, Resolution};
use std::path::PathBuf;

use charly_testutil::corpus;

fn open(dir: PathBuf) -> (Project, Resolution) {
    charly_testutil::open(&dir)
}

fn order(r: &Resolution, b: &str) -> Vec<String> {
    r.get(b)
        .unwrap_or_else(|| panic!("{b} resolves: {:?}", r.boxes.get(b)))
        .candies
        .clone()
}

/// `candy → packages` for a box, in install order, for the primary format.
fn packages(p: &Project, r: &Resolution, b: &str) -> Vec<(String, Vec<String>)> {
    let rb = r.get(b).expect("resolves");
    let chain = rb.tag_chain();
    rb.candies
        .iter()
        .map(|k| {
            (
                k.clone(),
                cascade::resolve(&p.candies[k].def, &chain).packages,
            )
        })
        .filter(|(_, pk)| !pk.is_empty())
        .collect()
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

#[test]
fn every_file_loads_without_errors_of_its_own() {
    let (p, r) = open(corpus());
    // 56 main candies + nvidia-driver from image/cachyos.
    assert_eq!(p.candies.len(), 57);
    let root_boxes = p.root_ns().boxes.len();
    assert_eq!(
        root_boxes, 43,
        "every box file of the main tree is registered"
    );
    // Loading itself produces no errors: all problems are per box (missing
    // candies, unavailable imports) and reported by resolution.
    let load_errors: Vec<String> = p.diags.errors().map(|d| d.one_line(&p.sources)).collect();
    assert!(load_errors.is_empty(), "{load_errors:#?}");
    assert!(r.diags.errors().next().is_none());
}

#[test]
fn the_resolvable_boxes_resolve_and_the_others_say_why() {
    let (p, r) = open(corpus());
    let ok: Vec<&str> = r
        .boxes
        .iter()
        .filter(|(n, b)| b.is_ok() && !n.contains('.'))
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(
        ok,
        vec![
            "arch",
            "arch-builder",
            "chrome-headless",
            "composition-source",
            "fedora",
            "fedora-builder",
            "fedora-nonfree",
            "filebrowser",
            "githubrunner",
            "immich",
            "jupyter",
            "mcp",
            "openclaw",
            "openwebui",
            "redis",
            "selftest-image",
            "selftest-layer",
            "valkey-test",
            "vscode-test",
        ],
        "17 boxes with every candy present, plus githubrunner and openclaw through image/cachyos"
    );
    // Imported boxes are listed under their namespaced names.
    for b in [
        "cachyos.cachyos",
        "cachyos.cachyos-pacstrap",
        "cachyos.cachyos-pacstrap-builder",
    ] {
        assert!(r.get(b).is_some(), "{b}");
    }
    // Every other box names what is missing, with file:line:col.
    let versa = r.boxes["versa"]
        .as_ref()
        .expect_err("versa needs candies not in the corpus");
    let first = versa[0].one_line(&p.sources);
    assert!(first.starts_with("box/versa/charly.yml:13:11:"), "{first}");
    assert!(first.contains("unknown candy `marimo`"), "{first}");
    let comfy = r.boxes["comfyui"]
        .as_ref()
        .expect_err("nvidia import is not in the corpus");
    let first = comfy[0].one_line(&p.sources);
    assert!(first.starts_with("box/comfyui/charly.yml:4:11:"), "{first}");
    assert!(
        first.contains("import `nvidia`") && first.contains("--import nvidia=DIR"),
        "{first}"
    );
}

#[test]
fn without_the_cachyos_checkout_only_its_dependants_fail() {
    let tmp = tempfile::tempdir().expect("tmp");
    copy_tree(&corpus(), tmp.path());
    std::fs::remove_dir_all(tmp.path().join("image/cachyos")).expect("rm");
    let (p, r) = open(tmp.path().to_path_buf());
    let ok = r.boxes.iter().filter(|(_, b)| b.is_ok()).count();
    assert_eq!(ok, 17);
    let gh = r.boxes["githubrunner"].as_ref().expect_err("needs cachyos");
    assert!(gh[0].one_line(&p.sources).contains("import `cachyos`"));
    // With an explicit --import it resolves again.
    let opts = LoadOptions {
        imports: [("cachyos".to_string(), corpus().join("image/cachyos"))].into(),
        ..LoadOptions::default()
    };
    let p = load::load(tmp.path(), &opts).expect("loads");
    let r = resolve::resolve(&p);
    assert!(r.get("githubrunner").is_some());
}

#[test]
fn golden_candy_orders() {
    let (_, r) = open(corpus());
    assert_eq!(order(&r, "fedora"), Vec::<String>::new());
    assert_eq!(
        order(&r, "jupyter"),
        s(&[
            "direnv",
            "gnupg",
            "ssh-client",
            "supervisord",
            "jupyter-mcp",
            "jupyter",
            "notebook-templates",
            "dbus"
        ])
    );
    assert_eq!(
        order(&r, "filebrowser"),
        s(&[
            "direnv",
            "gnupg",
            "ssh-client",
            "supervisord",
            "filebrowser",
            "dbus"
        ])
    );
    assert_eq!(
        order(&r, "redis"),
        s(&["supervisord", "redis", "eval-redis-init-layer"])
    );
    assert_eq!(
        order(&r, "fedora-builder"),
        s(&["pixi", "nodejs", "build-toolchain"])
    );
    assert_eq!(
        order(&r, "arch-builder"),
        s(&["pixi", "nodejs", "build-toolchain", "yay"])
    );
    assert_eq!(
        order(&r, "vscode-test"),
        s(&["supervisord", "eval-keepalive", "vscode"])
    );
    // fedora-nonfree's rpmfusion is in fedora-builder's base, so not reinstalled.
    assert_eq!(
        r.get("fedora-builder").map(|b| b.provided.clone()),
        Some(s(&["rpmfusion"]))
    );
}

#[test]
fn golden_package_sets() {
    let (p, r) = open(corpus());
    assert_eq!(
        packages(&p, &r, "redis"),
        vec![
            ("supervisord".to_string(), s(&["supervisor"])),
            ("redis".to_string(), s(&["redis"])),
            (
                "eval-redis-init-layer".to_string(),
                s(&["iproute", "procps-ng"])
            ),
        ]
    );
    assert_eq!(
        packages(&p, &r, "filebrowser"),
        vec![
            ("direnv".to_string(), s(&["direnv"])),
            ("gnupg".to_string(), s(&["gnupg2"])),
            ("ssh-client".to_string(), s(&["openssh-clients"])),
            ("supervisord".to_string(), s(&["supervisor"])),
            ("dbus".to_string(), s(&["dbus-daemon"])),
        ]
    );
    let jup = packages(&p, &r, "jupyter");
    assert_eq!(
        jup.iter().map(|(c, _)| c.as_str()).collect::<Vec<_>>(),
        vec![
            "direnv",
            "gnupg",
            "ssh-client",
            "supervisord",
            "jupyter",
            "dbus"
        ]
    );
    // pac family: vscode on arch installs from the pac section.
    let vs = packages(&p, &r, "vscode-test");
    assert_eq!(vs[0], ("supervisord".to_string(), s(&["supervisor"])));
    // the fedora box resolves nothing (no candies) but its chain is right.
    let f = r.get("fedora").expect("fedora");
    assert_eq!(f.tag_chain(), s(&["fedora:43", "fedora", "rpm"]));
    let a = r.get("openclaw").expect("openclaw");
    assert_eq!(a.tag_chain(), s(&["cachyos", "arch", "pac"]));
}

#[test]
fn deb_family_box_from_image_ubuntu() {
    // image/ubuntu is its own project; its remote candy refs point at the
    // enclosing overthink checkout, found by its `repo:` identity.
    let (p, r) = open(corpus().join("image/ubuntu"));
    let b = r
        .get("ubuntu-builder")
        .unwrap_or_else(|| panic!("{:?}", r.boxes.get("ubuntu-builder")));
    assert_eq!(b.tag_chain(), s(&["ubuntu:24.04", "ubuntu", "deb"]));
    assert_eq!(b.candies, s(&["pixi", "nodejs", "build-toolchain"]));
    let pk = packages(&p, &r, "ubuntu-builder");
    let nodejs = pk.iter().find(|(c, _)| c == "nodejs").expect("nodejs");
    // ubuntu's section adds only the NodeSource repo, no `npm` (see the candy's comment).
    assert_eq!(nodejs.1, s(&["nodejs"]));
    let chain = b.tag_chain();
    let set = cascade::resolve(&p.candies["nodejs"].def, &chain);
    assert_eq!(set.repos.len(), 1);
    assert_eq!(
        set.repos[0].get("name").map(String::as_str),
        Some("nodesource")
    );
}

fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    for e in walkdir::WalkDir::new(from).into_iter().flatten() {
        let rel = e.path().strip_prefix(from).expect("prefix");
        let dest = to.join(rel);
        if e.file_type().is_dir() {
            std::fs::create_dir_all(&dest).expect("mkdir");
        } else {
            std::fs::copy(e.path(), &dest).expect("copy");
        }
    }
}
