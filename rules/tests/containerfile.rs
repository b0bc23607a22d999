//! Snapshot tests of generated Containerfiles for real corpus boxes.
//!
//! Covered: rpm (fedora, its bootstrap, a base-of-a-base chain), deb
//! (`image/ubuntu`), pac (arch family, a namespaced cachyos base) plus AUR,
//! the npm / pixi / cargo builders, services (supervisord fragments), shell
//! snippets, write/copy/link/mkdir/setcap/download/cmd tasks, data staging,
//! and boxes whose base is another box. Snapshots live in `tests/snapshots/`
//! and are reviewed like code (`cargo insta review`).

use charly_rules::emit::containerfile::default_image_ref;
use charly_rules::emit::{BuildDir, EmitOptions, Staged, render_box};
use charly_rules::load::Project;
use charly_rules::plan::{HostContext, build_box_plans};
use charly_rules::resolve::Resolution;
use std::path::Path;

use charly_testutil::corpus;

use charly_testutil::open;

fn render(p: &Project, r: &Resolution, name: &str) -> BuildDir {
    let b = r
        .get(name)
        .unwrap_or_else(|| panic!("{name}: {:?}", r.boxes.get(name)));
    let mut plans = build_box_plans(p, b, &HostContext::default()).expect("plans");
    for plan in &mut plans {
        plan.resolve_home(&b.user.home);
    }
    let opts = EmitOptions {
        image_refs: r
            .boxes
            .iter()
            .filter_map(|(n, b)| {
                b.as_ref()
                    .ok()
                    .map(|b| (n.clone(), default_image_ref(n, &b.version)))
            })
            .collect(),
        ..EmitOptions::default()
    };
    render_box(p, b, &plans, &opts).expect("renders")
}

/// The Containerfile followed by every staged file, for one snapshot.
fn snapshot_text(d: &BuildDir) -> String {
    let mut s = d.containerfile.clone();
    for (path, f) in &d.files {
        s.push_str(&format!("\n===== {path}\n"));
        match f {
            Staged::Bytes(b) => s.push_str(&String::from_utf8_lossy(b)),
            Staged::CopyOf(src) => s.push_str(&format!(
                "(copy of {})\n",
                src.file_name()
                    .map(|n| n.to_string_lossy())
                    .unwrap_or_default()
            )),
        }
    }
    s
}

macro_rules! corpus_snapshot {
    ($test:ident, $box:literal) => {
        #[test]
        fn $test() {
            let (p, r) = open(&corpus());
            let d = render(&p, &r, $box);
            insta::assert_snapshot!(concat!("corpus_", $box), snapshot_text(&d));
        }
    };
}

corpus_snapshot!(fedora_rpm_bootstrap, "fedora");
corpus_snapshot!(jupyter_pixi_services_data, "jupyter");
corpus_snapshot!(filebrowser_download_copy_mkdir, "filebrowser");
corpus_snapshot!(chrome_headless_npm_pixi_link, "chrome-headless");
corpus_snapshot!(redis_write_tasks, "redis");
corpus_snapshot!(fedora_builder_base_of_base, "fedora-builder");
corpus_snapshot!(vscode_test_pac, "vscode-test");
corpus_snapshot!(openclaw_namespaced_base_npm, "openclaw");

#[test]
fn ubuntu_builder_deb() {
    let (p, r) = open(&corpus().join("image/ubuntu"));
    let d = render(&p, &r, "ubuntu-builder");
    insta::assert_snapshot!("image_ubuntu_ubuntu-builder", snapshot_text(&d));
}

/// A test copy of the corpus with one extra box using `build: [pac, aur]`
/// (chrome's AUR package, sway's setcap task) and a cargo candy.
#[test]
fn pac_aur_cargo_setcap() {
    let t = tempfile::tempdir().expect("tmp");
    copy_tree(&corpus(), t.path());
    let add = |rel: &str, body: &str| {
        let p = t.path().join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, body).expect("write");
    };
    add(
        "box/aurtest/charly.yml",
        "box:\n  name: aurtest\n  base: arch\n  build: [pac, aur]\n  builder:\n    aur: arch-builder\n    cargo: arch-builder\n  candy: [chrome, sway, rusty]\n",
    );
    add(
        "candy/rusty/charly.yml",
        "candy:\n  version: 1.0.0\n  name: rusty\n  distro:\n    arch:\n      package: [gcc]\n",
    );
    add(
        "candy/rusty/Cargo.toml",
        "[package]\nname = \"rusty\"\nversion = \"0.1.0\"\n",
    );
    let (p, r) = open(t.path());
    let d = render(&p, &r, "aurtest");
    let text = snapshot_text(&d);
    assert!(
        text.contains("FROM localhost/arch-builder:"),
        "aur stage from the builder box"
    );
    assert!(text.contains("pacman -U --noconfirm /tmp/aur-pkgs/*.pkg.tar.zst"));
    assert!(text.contains("cargo install --path /ctx"));
    assert!(text.contains("setcap -r /usr/bin/sway"));
    insta::assert_snapshot!("corpus_aurtest", text);
}

#[test]
fn generation_is_deterministic() {
    let (p, r) = open(&corpus());
    for name in ["jupyter", "chrome-headless", "openclaw"] {
        let a = render(&p, &r, name);
        let b = render(&p, &r, name);
        assert_eq!(a, b, "{name}");
    }
    // And independent of where the project lives.
    let t = tempfile::tempdir().expect("tmp");
    copy_tree(&corpus(), t.path());
    let (p2, r2) = open(t.path());
    assert_eq!(
        render(&p, &r, "jupyter").containerfile,
        render(&p2, &r2, "jupyter").containerfile
    );
}

fn copy_tree(from: &Path, to: &Path) {
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

/// Each instruction of a layer maps back to the part of its candy that
/// wrote it: the package install to the package the build log names, a
/// task's RUN to the task, at file:line:col.
#[test]
fn layer_instructions_map_back_to_the_candy_file() {
    use charly_rules::emit::containerfile::{LayerPart, layer_containerfile};
    use charly_rules::origin::{instruction_offset, locate};
    let (p, r) = open(&charly_testutil::example());
    let b = r.get("hello").expect("hello");
    let mut plans = build_box_plans(&p, b, &HostContext::default()).expect("plans");
    for plan in &mut plans {
        plan.resolve_home(&b.user.home);
    }
    let idx = b
        .candies
        .iter()
        .position(|k| k == "hello-tools")
        .expect("candy");
    let opts = EmitOptions {
        dev_local_pkg: true,
        ..EmitOptions::default()
    };
    let text = layer_containerfile(
        &p,
        b,
        LayerPart::Candy {
            key: "hello-tools",
            steps: &plans[idx].steps,
        },
        &opts,
    )
    .expect("renders")
    .expect("a layer");
    let cf = &text.containerfile;
    // The step of the install RUN and of the `cmd` task's RUN, counted as
    // buildah counts them (stage 2 is `FROM ${PARENT}`).
    let step_of = |needle: &str| {
        (1..60)
            .find(|n| instruction_offset(cf, 2, *n).is_some_and(|o| cf[o..].starts_with(needle)))
            .unwrap_or_else(|| panic!("{needle}: {cf}"))
    };
    let at = |step: usize, log: &[String]| {
        let o = instruction_offset(cf, 2, step).expect("offset");
        locate(&p, text.origin_at(o).expect("origin"), log).expect("located")
    };
    let install = step_of("RUN --mount=type=cache,id=charly-var-cache-apt");
    let log = vec!["E: Unable to locate package tree".to_string()];
    let l = at(install, &log);
    assert_eq!(
        (
            l.candy.as_str(),
            l.what.as_str(),
            l.file.as_str(),
            l.line,
            l.col
        ),
        (
            "hello-tools",
            "package `tree`",
            "candy/hello-tools/charly.yml",
            7,
            11
        ),
        "{l}"
    );
    // Without a name in the log: the first package.
    assert_eq!(at(install, &[]).what, "package `jq`");
    let cmd = step_of("RUN --mount=type=bind,from=hello-tools");
    let l = at(cmd, &[]);
    assert_eq!(l.what, "task #4 (cmd)", "{l}");
    let src =
        std::fs::read_to_string(charly_testutil::example().join("candy/hello-tools/charly.yml"))
            .expect("read");
    // A block scalar's span starts at its body.
    let line = src.lines().nth(l.line as usize - 1).expect("line");
    assert_eq!(line.trim(), "jq --version > /opt/hello/jq-version.txt");
}
