//! Plugins end to end with a real plugin process (the example plugin,
//! the Rust mirror of the original's plugin-example-stepkind): a candy
//! declares `step:examplestepkind`, another's task uses it; `box generate`
//! splices what the plugin emits, a second run starts no plugin, a new
//! plugin build regenerates; `bundle add` has the plugin execute on the
//! host through charly's venue and `bundle del` replays its teardown. The
//! example plugin answers charly's AutoMTLS, so all of it runs over mutual
//! TLS, and `execute` streams its progress.

use assert_cmd::Command;
use std::path::{Path, PathBuf};

struct World {
    _t: tempfile::TempDir,
    project: PathBuf,
    cache: PathBuf,
    plugins: PathBuf,
    starts: PathBuf,
}

impl World {
    fn new() -> World {
        let t = tempfile::tempdir().expect("tmp");
        let project = t.path().join("project");
        charly_testutil::copy_project(&charly_testutil::graph_fixture(), &project);
        let w = |rel: &str, body: &str| charly_testutil::write(&project, rel, body);
        w(
            "candy/plugin-example-stepkind/charly.yml",
            "candy:\n  name: plugin-example-stepkind\n  plugin:\n    providers: [step:examplestepkind]\n    source: github.com/overthinkos/overthink/candy/plugin-example-stepkind\n",
        );
        w(
            "candy/baked/charly.yml",
            "candy:\n  name: baked\n  version: 2026.1.1\n  task:\n    - plugin: examplestepkind\n      plugin_input: {marker: HELLO-PLUGIN}\n",
        );
        w(
            "box/plug/charly.yml",
            "box:\n  name: plug\n  version: 1.0.0\n  base: localhost/charly-test-busybox:1\n  candy: [baked]\n",
        );
        // The plugin directory holds a wrapper that counts its starts.
        let plugins = t.path().join("plugins");
        let starts = t.path().join("starts");
        std::fs::create_dir_all(&plugins).expect("mkdir");
        install_plugin(&plugins, &starts, "");
        World {
            project,
            cache: t.path().join("cache"),
            plugins,
            starts,
            _t: t,
        }
    }

    fn cmd(&self) -> Command {
        let mut c = Command::cargo_bin("charly").expect("binary");
        c.env("NO_COLOR", "1")
            .env("CHARLY_CACHE_DIR", &self.cache)
            .env("CHARLY_PLUGIN_DIR", &self.plugins)
            .arg("-C")
            .arg(&self.project);
        c
    }

    fn starts(&self) -> usize {
        std::fs::read_to_string(&self.starts)
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }
}

/// Writes the plugin wrapper (`plugin-example-stepkind`, the declaring
/// candy's name): it notes each start, then runs the example plugin.
/// `tag` changes its bytes (a new plugin build).
fn install_plugin(dir: &Path, starts: &Path, tag: &str) {
    use std::os::unix::fs::PermissionsExt;
    let exe = charly_testutil::plugin_example();
    let p = dir.join("plugin-example-stepkind");
    std::fs::write(
        &p,
        format!(
            "#!/bin/sh\n# {tag}\necho start >> '{}'\nexec '{}' \"$@\"\n",
            starts.display(),
            exe.display()
        ),
    )
    .expect("write");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

fn ok(out: &std::process::Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    err
}

#[test]
fn generate_splices_the_plugins_fragment_and_caches_its_answers() {
    let w = World::new();
    let out = w
        .cmd()
        .args(["box", "generate", "plug"])
        .output()
        .expect("run");
    ok(&out);
    let cf = std::fs::read_to_string(w.project.join(".build/plug/Containerfile")).expect("cf");
    assert!(
        cf.contains("# candy `baked` task #1 (plugin `examplestepkind`)")
            && cf.contains("'HELLO-PLUGIN' > /etc/examplestepkind-build-baked"),
        "{cf}"
    );
    assert_eq!(w.starts(), 1, "one start for describe and emit");

    // Again: the answers are cached by the plugin's digest, no start.
    ok(&w
        .cmd()
        .args(["box", "generate", "plug"])
        .output()
        .expect("run"));
    assert_eq!(w.starts(), 1);

    // A new plugin build: asked again, and the box's nodes rerun.
    install_plugin(&w.plugins, &w.starts, "v2");
    let out = w
        .cmd()
        .args(["box", "generate", "plug", "--explain"])
        .output()
        .expect("run");
    let said = ok(&out);
    assert_eq!(w.starts(), 2);
    assert!(said.contains("plugin:examplestepkind"), "{said}");

    // An input the plugin does not serve: a load error at its place.
    charly_testutil::write(
        &w.project,
        "candy/baked/charly.yml",
        "candy:\n  name: baked\n  version: 2026.1.1\n  task:\n    - plugin: examplestepkin\n",
    );
    let out = w
        .cmd()
        .args(["box", "generate", "plug"])
        .output()
        .expect("run");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        said.contains("candy/baked/charly.yml:5:15") && said.contains("examplestepkin"),
        "{said}"
    );
}

#[test]
fn a_missing_plugin_is_named_before_anything_runs() {
    let w = World::new();
    std::fs::remove_file(w.plugins.join("plugin-example-stepkind")).expect("rm");
    let out = w
        .cmd()
        .args(["box", "generate", "plug"])
        .output()
        .expect("run");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        said.contains("plugin `examplestepkind`: no executable `plugin-example-stepkind`"),
        "{said}"
    );
}

#[test]
fn a_deploy_has_the_plugin_execute_on_the_host_and_del_replays_its_teardown() {
    let w = World::new();
    let marker = Path::new("/tmp/charly-examplestepkind/marker");
    let _ = std::fs::remove_dir_all("/tmp/charly-examplestepkind");
    let user = std::env::var("USER").unwrap_or_else(|_| "root".into());
    let out = w
        .cmd()
        .args([
            "bundle", "add", "pl", "plug", "--target", "local", "--user", &user, "--runner",
            "fake", "--yes", "--json",
        ])
        .output()
        .expect("add");
    let said = ok(&out);
    // execute is streamed: the plugin's progress frames are shown like its
    // stderr (the reply itself is not).
    assert!(
        said.contains("plugin-example-stepkind: examplestepkind: writing the marker"),
        "{said}"
    );
    assert!(
        said.contains(r#"plugin-example-stepkind: {"examplestepkind":"marker written"}"#),
        "{said}"
    );
    assert!(!said.contains("reverse_ops"), "{said}");
    let rep: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let step = &rep["steps"][0];
    assert_eq!(step["kind"], "external:examplestepkind", "{rep}");
    assert_eq!(step["state"], "complete", "{rep}");
    assert_eq!(
        std::fs::read_to_string(marker).expect("the plugin wrote its marker"),
        "HELLO-PLUGIN\n"
    );
    ok(&w.cmd().args(["bundle", "del", "pl"]).output().expect("del"));
    assert!(
        !marker.parent().expect("dir").exists(),
        "del replayed the plugin's teardown"
    );

    // A dry run never asks the plugin to execute.
    let out = w
        .cmd()
        .args([
            "bundle",
            "add",
            "pl",
            "plug",
            "--target",
            "local",
            "--user",
            &user,
            "--runner",
            "fake",
            "--yes",
            "--dry-run",
        ])
        .output()
        .expect("dry");
    ok(&out);
    assert!(!marker.exists());
}

#[test]
fn a_plugin_is_built_by_its_declared_command_once_per_source() {
    let w = World::new();
    std::fs::remove_file(w.plugins.join("plugin-example-stepkind")).expect("rm");
    let builds = w.project.join("../builds");
    let exe = charly_testutil::plugin_example();
    charly_testutil::write(
        &w.project,
        "candy/plugin-example-stepkind/charly.yml",
        &format!(
            "candy:\n  name: plugin-example-stepkind\n  plugin:\n    providers: [step:examplestepkind]\n    source: builtin\n    build: echo built >> '{}' && cp '{}' \"$CHARLY_PLUGIN_OUT\"\n",
            builds.display(),
            exe.display()
        ),
    );
    let count = || {
        std::fs::read_to_string(&builds)
            .map(|s| s.lines().count())
            .unwrap_or(0)
    };
    ok(&w
        .cmd()
        .args(["box", "generate", "plug"])
        .output()
        .expect("run"));
    let cf = std::fs::read_to_string(w.project.join(".build/plug/Containerfile")).expect("cf");
    assert!(cf.contains("HELLO-PLUGIN"), "{cf}");
    assert_eq!(count(), 1);
    ok(&w
        .cmd()
        .args(["box", "generate", "plug"])
        .output()
        .expect("run"));
    assert_eq!(count(), 1, "built once for the same source");

    // A build command that fails is named.
    charly_testutil::write(
        &w.project,
        "candy/plugin-example-stepkind/charly.yml",
        "candy:\n  name: plugin-example-stepkind\n  plugin:\n    providers: [step:examplestepkind]\n    build: echo no compiler >&2; exit 3\n",
    );
    let out = w
        .cmd()
        .args(["box", "generate", "plug"])
        .output()
        .expect("run");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        said.contains("failed") && said.contains("no compiler"),
        "{said}"
    );
}

#[test]
fn the_spliced_fragment_builds_into_the_image_with_podman() {
    if !charly_testutil::podman_available() {
        return;
    }
    let w = World::new();
    ok(&w
        .cmd()
        .args(["box", "generate", "plug"])
        .output()
        .expect("run"));
    let t = tempfile::tempdir().expect("tmp");
    let podman = charly_testutil::Podman::new(&t.path().join("podman"));
    podman.import_busybox(t.path(), "localhost/charly-test-busybox:1");
    let out = podman
        .cmd()
        .current_dir(&w.project)
        .args([
            "build",
            "--build-arg",
            "TARGETARCH=amd64",
            "-f",
            ".build/plug/Containerfile",
            "-t",
            "localhost/plug:1",
            ".",
        ])
        .output()
        .expect("podman build");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let out = podman.run(&[
        "run",
        "--rm",
        "localhost/plug:1",
        "cat",
        "/etc/examplestepkind-build-baked",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "HELLO-PLUGIN\n");
}
