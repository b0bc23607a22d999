//! A box made only of busybox-compatible steps builds for real with podman
//! from the generated Containerfile, and the image has the files, modes,
//! owners, env and labels the candies describe.

use charly_testutil as common;

use charly_rules::load::{self, LoadOptions};
use charly_rules::resolve;

use charly_testutil::busybox_fixture as fixture;

#[test]
fn busybox_box_builds_and_has_what_its_candies_say() {
    if !common::podman_available() {
        return;
    }
    let t = tempfile::tempdir().expect("tmp");
    let root = t.path().join("project");
    common::copy_project(&fixture(), &root);
    let podman = common::Podman::new(&t.path().join("podman"));
    podman.import_busybox(t.path(), "localhost/charly-test-busybox:1");

    let p = load::load(&root, &LoadOptions::default()).expect("loads");
    let r = resolve::resolve(&p);
    let b = r.get("tiny").expect("tiny resolves");
    let opts = charly_rules::emit::EmitOptions::default();
    let d = charly_engine::generate::render(&p, b, &opts).expect("renders");
    charly_engine::generate::write(&root, &d).expect("writes");
    let out = podman
        .cmd()
        .current_dir(&root)
        .args([
            "build",
            "--layers=true",
            "--build-arg",
            "TARGETARCH=amd64",
            "-f",
            ".build/tiny/Containerfile",
            "-t",
            "localhost/tiny:1.2.3",
            ".",
        ])
        .output()
        .expect("podman build");
    assert!(
        out.status.success(),
        "build failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let sh = |script: &str| -> String {
        let out = podman.run(&["run", "--rm", "localhost/tiny:1.2.3", "sh", "-c", script]);
        assert!(
            out.status.success(),
            "{script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    // Files, modes and owners.
    assert_eq!(
        sh("stat -c '%a %u' /opt/hello/bin /opt/hello/bin/hello"),
        "755 0\n755 0"
    );
    assert_eq!(sh("hi"), "hello files", "link + write + env at run time");
    assert_eq!(
        sh("cat /opt/hello/built.txt"),
        "built as 0 for amd64",
        "root cmd with ARCH from TARGETARCH"
    );
    assert_eq!(
        sh("stat -c '%a %u' /home/user/data/note.txt; cat /home/user/data/note.txt"),
        "600 1000\nprivate note"
    );
    assert_eq!(
        sh("cat /home/user/data/whoami.txt"),
        "1000",
        "user cmd runs as the box user"
    );
    assert_eq!(sh("id -u"), "1000", "runtime user");
    assert!(sh("cat /etc/systemd/system/hello.service").contains("ExecStart=/opt/hello/bin/hello"));
    // profile.d is read by every login shell: the bash snippet is guarded.
    assert_eq!(
        sh("cat /etc/profile.d/charly-motd-bash.sh"),
        "if [ -n \"${BASH_VERSION:-}\" ]; then\nexport MOTD_SHELL=bash\nfi"
    );
    assert_eq!(
        sh("cat /etc/fish/conf.d/charly-motd.fish"),
        "set -gx MOTD_SHELL fish"
    );
    assert_eq!(
        sh(". /etc/profile.d/charly-motd-sh.sh; echo $MOTD_SHELL"),
        "sh"
    );

    // Env and labels from the image config.
    let out = podman.run(&["image", "inspect", "localhost/tiny:1.2.3"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("inspect json");
    let cfg = &v[0]["Config"];
    let env: Vec<&str> = cfg["Env"]
        .as_array()
        .expect("env")
        .iter()
        .filter_map(|e| e.as_str())
        .collect();
    assert!(env.contains(&"HELLO_MODE=files"), "{env:?}");
    assert!(env.contains(&"HELLO_DATA=/home/user/data"), "{env:?}");
    assert!(
        env.iter().any(|e| e.starts_with("PATH=/opt/hello/bin:")),
        "{env:?}"
    );
    let labels = &cfg["Labels"];
    assert_eq!(labels["ai.opencharly.box"], "tiny");
    assert_eq!(labels["ai.opencharly.version"], "1.2.3");
    assert_eq!(labels["ai.opencharly.platform.distro"], "busybox");
    let versions: serde_json::Value = serde_json::from_str(
        labels["ai.opencharly.candy_version"]
            .as_str()
            .expect("label"),
    )
    .expect("json label");
    assert_eq!(versions["motd"], "1.0.1");
    assert!(
        cfg["ExposedPorts"].get("8080/tcp").is_some(),
        "{}",
        cfg["ExposedPorts"]
    );
}
