//! Issue 18, finding 3, checked by buildah itself: the `ENV` and `LABEL`
//! lines charly writes for hostile values (line breaks of every kind,
//! backslashes, quotes, control characters) parse as exactly the
//! instructions charly meant.
//!
//! The hostile project's Containerfile is cut down to its `ENV`/`LABEL`
//! instructions on top of `FROM scratch` (no base image, no RUN: buildah
//! only parses and commits), built with podman (buildah 1.28 on Debian 12),
//! and the image's environment and labels are read back: the same keys as
//! the YAML declares, none more.

use charly_testutil as common;

use charly_rules::emit::containerfile::default_image_ref;
use charly_rules::emit::{EmitOptions, render_box};
use charly_rules::load::{self, LoadOptions};
use charly_rules::plan::{HostContext, build_box_plans};
use charly_rules::resolve;
use std::collections::BTreeSet;

const HOSTILE: [&str; 5] = [
    "A=1\nRUN touch /pwned-key",
    "x\r\nRUN touch /pwned",
    "a\\\nRUN touch /pwned\\",
    "\u{2028}RUN x\u{85}#\u{1b}\"'$`",
    "\\",
];

/// A YAML double-quoted scalar for `s`.
fn yq(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_ascii_graphic() || c == ' ' => out.push(c),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push('"');
    out
}

#[test]
fn hostile_env_and_label_values_parse_as_one_instruction_each() {
    if !common::podman_available() {
        return;
    }
    let t = tempfile::tempdir().expect("tmp");
    let root = t.path().join("project");
    let mut env = String::new();
    let mut var = String::new();
    for (i, v) in HOSTILE.iter().enumerate() {
        env.push_str(&format!("        E{i}: {}\n", yq(v)));
        var.push_str(&format!("        V{i}: {}\n", yq(v)));
    }
    common::write(
        &root,
        "charly.yml",
        "version: 2026.160.1301\ndiscover:\n    - box\n    - candy\ndefaults:\n    base: debian:12\n    distro:\n        - debian:12\n        - debian\n    build:\n        - deb\n",
    );
    common::write(
        &root,
        "candy/c/charly.yml",
        &format!(
            "candy:\n    version: 2026.1.1\n    description: {}\n    env:\n{env}    var:\n{var}    task:\n        - cmd: {}\n",
            yq(HOSTILE[0]),
            yq(HOSTILE[1])
        ),
    );
    common::write(
        &root,
        "box/b/charly.yml",
        &format!(
            "box:\n    name: b\n    description: {}\n    candy:\n        - c\n",
            yq(HOSTILE[3])
        ),
    );
    let p = load::load(&root, &LoadOptions::default()).expect("loads");
    assert!(!p.diags.has_errors(), "{:?}", p.diags);
    let r = resolve::resolve(&p);
    let b = r.get("b").expect("resolves");
    let mut plans = build_box_plans(&p, b, &HostContext::default()).expect("plans");
    for plan in &mut plans {
        plan.resolve_home(&b.user.home);
    }
    let opts = EmitOptions {
        image_refs: [("b".to_string(), default_image_ref("b", &b.version))].into(),
        ..EmitOptions::default()
    };
    let cf = render_box(&p, b, &plans, &opts)
        .expect("renders")
        .containerfile;
    let kept: Vec<&str> = cf
        .lines()
        .filter(|l| (l.starts_with("ENV ") && !l.contains("${")) || l.starts_with("LABEL "))
        .collect();
    let envs = kept.iter().filter(|l| l.starts_with("ENV ")).count();
    let labels = kept.iter().filter(|l| l.starts_with("LABEL ")).count();
    assert!(envs >= 2 * HOSTILE.len() && labels >= 2, "{cf}");

    let ctx = t.path().join("ctx");
    std::fs::create_dir_all(&ctx).expect("mkdir");
    std::fs::write(
        ctx.join("Containerfile"),
        format!("FROM scratch\n{}\n", kept.join("\n")),
    )
    .expect("write");
    let pm = common::Podman::new(&t.path().join("podman"));
    let tag = "localhost/charly-injection:1";
    let out = pm
        .cmd()
        .args(["build", "--no-cache", "-t", tag, "-f"])
        .arg(ctx.join("Containerfile"))
        .arg(&ctx)
        .output()
        .expect("podman build");
    assert!(
        out.status.success(),
        "buildah refused the ENV/LABEL lines: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        kept.join("\n")
    );
    let inspect = |what: &str| -> serde_json::Value {
        let out = pm.run(&[
            "image",
            "inspect",
            "--format",
            &format!("{{{{json .Config.{what}}}}}"),
            tag,
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("json")
    };
    let env_keys: BTreeSet<String> = inspect("Env")
        .as_array()
        .expect("env list")
        .iter()
        .filter_map(|e| e.as_str()?.split_once('=').map(|(k, _)| k.to_string()))
        .collect();
    let expected: BTreeSet<String> = (0..HOSTILE.len())
        .flat_map(|i| [format!("E{i}"), format!("V{i}")])
        .collect();
    assert!(
        expected.is_subset(&env_keys),
        "{expected:?} not in {env_keys:?}"
    );
    assert!(
        env_keys
            .iter()
            .all(|k| k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')),
        "an ENV key that the YAML does not have: {env_keys:?}"
    );
    // podman gives a `FROM scratch` image a default PATH.
    let ours = env_keys.iter().filter(|k| *k != "PATH").count();
    assert_eq!(ours, envs, "{env_keys:?}\n{}", kept.join("\n"));
    let label_map = inspect("Labels");
    // buildah adds `io.buildah.version` itself.
    let label_keys: Vec<&String> = label_map
        .as_object()
        .expect("labels")
        .keys()
        .filter(|k| *k != "io.buildah.version")
        .collect();
    assert_eq!(label_keys.len(), labels, "{label_keys:?}");
    let _ = pm.run(&["rmi", "-f", tag]);
}
