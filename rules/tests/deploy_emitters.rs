//! Snapshot and schema tests of the deploy emitters: the quadlet unit (pod
//! target) and the kustomize tree (k8s target).
//!
//! * Snapshots (exact text, `tests/snapshots/deploy_emitters__*.snap`) for
//!   corpus boxes: `jupyter` (ports, a volume, supervisord services → the
//!   init entrypoint), `filebrowser` (a box port remapping a candy port,
//!   home-relative volumes), `redis`, `githubrunner` (`network: host`, the
//!   container-nesting security block, from an imported base), and a test
//!   box with a `security:`-heavy candy set (chrome, k3s-server,
//!   container-nesting) plus box-level env, ports and security.
//! * Schema checks for *every* corpus box that resolves: the quadlet unit is
//!   only sections, comments, blanks and known `Key=Value` lines; the
//!   kustomize YAML reads back with the crate's own parser into well-formed
//!   Kubernetes objects (apiVersion/kind/metadata, DNS-1123 names, integer
//!   ports, mounts that name volumes, claims that exist, a selector the pod
//!   template matches, an overlay that points at the base image).
//! * Real validators when installed: podman's quadlet generator
//!   (`quadlet -dryrun`), `kubernetes-validate --strict` (PyPI) and
//!   `kustomize build` (or `kubectl kustomize`). Each is skipped with a
//!   message when absent, unless `CHARLY_REQUIRE_VALIDATORS=1`, which turns
//!   absence into a failure. `CHARLY_QUADLET`, `CHARLY_KUBERNETES_VALIDATE`,
//!   `CHARLY_KUSTOMIZE` and `CHARLY_KUBECTL` point at binaries off `PATH`.

use charly_rules::emit::kustomize::{KustomizeOptions, KustomizeTree, render_kustomize};
use charly_rules::emit::quadlet::{QuadletOptions, QuadletUnit, render_quadlet};
use charly_rules::load::Project;
use charly_rules::plan::{HostContext, InstallPlan, Target, build_merged_plan};
use charly_rules::resolve::{Resolution, ResolvedBox};
use charly_rules::source::FileId;
use charly_rules::yaml::{Node, Style, Value, parse_stream};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use charly_testutil::corpus;

use charly_testutil::open;

fn get<'r>(r: &'r Resolution, name: &str) -> &'r ResolvedBox {
    r.get(name)
        .unwrap_or_else(|| panic!("{name}: {:?}", r.boxes.get(name)))
}

fn plan(p: &Project, b: &ResolvedBox, target: Target) -> InstallPlan {
    let ctx = HostContext {
        target,
        ..HostContext::default()
    };
    build_merged_plan(p, b, &ctx, &[]).expect("plan")
}

fn quadlet(p: &Project, b: &ResolvedBox) -> QuadletUnit {
    render_quadlet(p, b, &plan(p, b, Target::Pod), &QuadletOptions::default()).expect("quadlet")
}

fn kustomize(p: &Project, b: &ResolvedBox) -> KustomizeTree {
    render_kustomize(p, b, &plan(p, b, Target::K8s), &KustomizeOptions::default())
        .expect("kustomize")
}

/// Every file of a tree, for one snapshot.
fn tree_text(t: &KustomizeTree) -> String {
    let mut s = String::new();
    for (path, text) in &t.files {
        s.push_str(&format!("===== {path}\n{text}"));
    }
    s
}

/// A copy of the corpus with a box that collects security blocks.
fn security_project() -> (tempfile::TempDir, Project, Resolution) {
    let t = tempfile::tempdir().expect("tmp");
    copy_tree(&corpus(), t.path());
    let dir = t.path().join("box/secbox");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(
        dir.join("charly.yml"),
        r#"box:
    name: secbox
    version: 2026.1.1
    base: fedora
    candy:
        - supervisord
        - chrome
        - k3s-server
        - container-nesting
    port:
        - 16443:6443
        - 127.0.0.1:9222:9222
        - 5353:53/udp
    env:
        PLAIN: hello
        YESISH: "yes"
        OCTAL: "0755"
        VERSIONISH: "1.10"
        SPACED: two words
        COLON: "a: b # c"
        DOLLAR: $HOME/x $(pwd)
        PERCENT: 50%
        QUOTE: say "hi"
        EMPTY: ""
    security:
        cap_add:
            - CAP_NET_ADMIN
            - sys_ptrace
        security_opt:
            - label=disable
            - seccomp=unconfined
        group_add:
            - keep-groups
            - "10"
        shm_size: 2g
        userns: keep-id
"#,
    )
    .expect("write");
    let dir = t.path().join("box/hostnet");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(
        dir.join("charly.yml"),
        "box:\n    name: hostnet\n    base: fedora\n    candy: [redis]\n    network: host\n    env:\n        - A=1\n        - B=x=y\n",
    )
    .expect("write");
    let (p, r) = open(t.path());
    (t, p, r)
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

macro_rules! corpus_snapshots {
    ($test:ident, $box:literal) => {
        #[test]
        fn $test() {
            let (p, r) = open(&corpus());
            let b = get(&r, $box);
            let q = quadlet(&p, b);
            check_quadlet(&q.text);
            insta::assert_snapshot!(concat!("quadlet_", $box), q.text);
            let k = kustomize(&p, b);
            check_tree(&k, b);
            insta::assert_snapshot!(concat!("kustomize_", $box), tree_text(&k));
        }
    };
}

corpus_snapshots!(jupyter_ports_volume_services, "jupyter");
corpus_snapshots!(filebrowser_remapped_port_home_volumes, "filebrowser");
corpus_snapshots!(redis_services, "redis");
corpus_snapshots!(githubrunner_host_network_nesting, "githubrunner");

#[test]
fn security_box() {
    let (_t, p, r) = security_project();
    let b = get(&r, "secbox");
    let q = quadlet(&p, b);
    check_quadlet(&q.text);
    let t = &q.text;
    // Union of candy and box security, box scalars winning.
    for line in [
        "PodmanArgs=--privileged",
        "PodmanArgs=--cgroupns=host",
        "AddCapability=NET_ADMIN",
        "AddCapability=SYS_PTRACE",
        "AddDevice=/dev/fuse",
        "AddDevice=/dev/net/tun",
        "Unmask=/proc/*",
        "SecurityLabelDisable=true",
        "SeccompProfile=unconfined",
        "ShmSize=2g",
        "PodmanArgs=--group-add=keep-groups",
        "PodmanArgs=--memory=6g",
        "PodmanArgs=--memory-reservation=5g",
        "PodmanArgs=--memory-swap=8g",
        "PublishPort=16443:6443",
        "PublishPort=127.0.0.1:9222:9222",
        "PublishPort=5353:53/udp",
        "Environment=\"DOLLAR=$$HOME/x $$(pwd)\"",
        "Environment=\"QUOTE=say \\\"hi\\\"\"",
        "Environment=PERCENT=50%%",
        "Environment=EMPTY=\n",
    ] {
        assert!(
            t.lines().any(|l| format!("{l}\n").starts_with(line)),
            "missing {line:?} in\n{t}"
        );
    }
    assert!(
        !t.contains("PublishPort=6443:6443"),
        "the box maps container port 6443 itself"
    );
    assert!(t.contains("# security.userns is not mapped to quadlet: \"keep-id\" (box)"));
    insta::assert_snapshot!("quadlet_secbox", q.text);

    let k = kustomize(&p, b);
    check_tree(&k, b);
    let d = &k.files["base/deployment.yaml"];
    for needle in [
        "privileged: true",
        "- NET_ADMIN",
        "type: Unconfined",
        "sizeLimit: \"2Gi\"",
        "memory: \"6Gi\"",
        "supplementalGroups:\n          - 10",
        "value: \"$HOME/x $$(pwd)\"",
        "# device `/dev/fuse` is not mapped",
        "# group_add `keep-groups` is a group name",
    ] {
        assert!(d.contains(needle), "missing {needle:?} in\n{d}");
    }
    // Values YAML 1.1 would retype stay strings.
    let dep = parse_yaml(d);
    let env: BTreeMap<String, serde_json::Value> = dep
        .to_json()
        .pointer("/spec/template/spec/containers/0/env")
        .and_then(|e| e.as_array().cloned())
        .unwrap_or_default()
        .into_iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap_or("").to_string(),
                e["value"].clone(),
            )
        })
        .collect();
    for (k, v) in [
        ("YESISH", "yes"),
        ("OCTAL", "0755"),
        ("VERSIONISH", "1.10"),
        ("COLON", "a: b # c"),
        ("EMPTY", ""),
        ("QUOTE", "say \"hi\""),
    ] {
        assert_eq!(env.get(k), Some(&serde_json::json!(v)), "{k}");
    }
    insta::assert_snapshot!("kustomize_secbox", tree_text(&k));
}

#[test]
fn host_network_publishes_no_ports() {
    let (_t, p, r) = security_project();
    let b = get(&r, "hostnet");
    let q = quadlet(&p, b);
    check_quadlet(&q.text);
    assert!(q.text.contains("Network=host\n"));
    assert!(
        !q.text.lines().any(|l| l.starts_with("PublishPort=")),
        "{}",
        q.text
    );
    assert!(
        q.text
            .contains("# PublishPort=6379:6379 omitted: network host publishes no ports\n")
    );
    assert!(q.text.contains("Environment=A=1\nEnvironment=B=x=y\n"));
    let k = kustomize(&p, b);
    check_tree(&k, b);
    let dep = parse_yaml(&k.files["base/deployment.yaml"]).to_json();
    assert_eq!(dep["spec"]["template"]["spec"]["hostNetwork"], true);
    assert_eq!(
        dep["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"],
        6379
    );
}

#[test]
fn options_change_image_ports_and_overlay() {
    let (p, r) = open(&corpus());
    let b = get(&r, "filebrowser");
    let q = render_quadlet(
        &p,
        b,
        &plan(&p, b, Target::Pod),
        &QuadletOptions {
            image: Some("ghcr.io/x/filebrowser@sha256:abc".into()),
            skip_candy_ports: true,
            env: [("EXTRA".to_string(), "1".to_string())].into(),
            labels: [("ai.opencharly.node".to_string(), "k".to_string())].into(),
        },
    )
    .expect("quadlet");
    assert!(q.text.contains("Image=ghcr.io/x/filebrowser@sha256:abc\n"));
    assert!(q.text.contains("Environment=EXTRA=1\n"));
    assert!(q.text.contains("Label=ai.opencharly.node=k\n"));
    assert_eq!(
        q.text.matches("PublishPort=").count(),
        1,
        "only the box mapping"
    );
    let k = render_kustomize(
        &p,
        b,
        &plan(&p, b, Target::K8s),
        &KustomizeOptions {
            overlay: Some("prod".into()),
            namespace: Some("tools".into()),
            overlay_image: Some("registry.example:5000/fb:2".into()),
            storage_class: Some("fast".into()),
            volume_size: Some("1Gi".into()),
            ..KustomizeOptions::default()
        },
    )
    .expect("kustomize");
    check_tree(&k, b);
    let ov = parse_yaml(&k.files["overlays/prod/kustomization.yaml"]).to_json();
    assert_eq!(ov["namespace"], "tools");
    assert_eq!(
        ov["images"][0],
        serde_json::json!({"name": "localhost/filebrowser", "newName": "registry.example:5000/fb", "newTag": "2"})
    );
    let pvc = parse_yaml(&k.files["base/pvc-data.yaml"]).to_json();
    assert_eq!(pvc["spec"]["storageClassName"], "fast");
    assert_eq!(pvc["spec"]["resources"]["requests"]["storage"], "1Gi");
    // Bad user-given names are errors, not silently changed.
    for (overlay, ns) in [("Prod", "x"), ("p", "a.b")] {
        let e = render_kustomize(
            &p,
            b,
            &plan(&p, b, Target::K8s),
            &KustomizeOptions {
                overlay: Some(overlay.into()),
                namespace: Some(ns.into()),
                ..KustomizeOptions::default()
            },
        );
        assert!(e.is_err(), "{overlay} {ns}");
    }
}

#[test]
fn host_plans_and_foreign_plans_are_rejected() {
    let (p, r) = open(&corpus());
    let b = get(&r, "jupyter");
    let local = plan(&p, b, Target::Local);
    let e = render_quadlet(&p, b, &local, &QuadletOptions::default()).expect_err("local plan");
    assert!(e.message.contains("target `local`"), "{e}");
    let other = plan(&p, get(&r, "redis"), Target::Pod);
    assert!(render_quadlet(&p, b, &other, &QuadletOptions::default()).is_err());
}

#[test]
fn rendering_is_deterministic_and_location_independent() {
    let (p, r) = open(&corpus());
    let t = tempfile::tempdir().expect("tmp");
    copy_tree(&corpus(), t.path());
    let (p2, r2) = open(t.path());
    for name in ["jupyter", "filebrowser"] {
        let a = (quadlet(&p, get(&r, name)), kustomize(&p, get(&r, name)));
        let b = (quadlet(&p, get(&r, name)), kustomize(&p, get(&r, name)));
        let c = (quadlet(&p2, get(&r2, name)), kustomize(&p2, get(&r2, name)));
        assert_eq!(a, b, "{name}");
        assert_eq!(a, c, "{name}");
    }
}

/// Schema checks over every resolvable box of the corpus and its imports.
#[test]
fn every_corpus_box_renders_well_formed_units_and_manifests() {
    let (p, r) = open(&corpus());
    let mut n = 0;
    for (name, res) in &r.boxes {
        let Ok(b) = res else { continue };
        let q = render_quadlet(&p, b, &plan(&p, b, Target::Pod), &QuadletOptions::default())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        check_quadlet(&q.text);
        let k = render_kustomize(
            &p,
            b,
            &plan(&p, b, Target::K8s),
            &KustomizeOptions::default(),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        check_tree(&k, b);
        n += 1;
    }
    assert!(n >= 22, "only {n} boxes resolved");
    // A namespaced box gets DNS-1123 names.
    let b = get(&r, "cachyos.cachyos");
    let k = kustomize(&p, b);
    let dep = parse_yaml(&k.files["base/deployment.yaml"]).to_json();
    assert_eq!(dep["metadata"]["name"], "charly-cachyos-cachyos");
    assert_eq!(
        dep["spec"]["template"]["spec"]["containers"][0]["name"],
        "cachyos-cachyos"
    );
    assert_eq!(
        dep["spec"]["template"]["spec"]["containers"][0]["image"],
        format!("localhost/cachyos.cachyos:{}", b.version)
    );
}

// ---------------------------------------------------------------- quadlet schema

/// Keys of podman-systemd.unit(5) per section, as far as charly may write them.
fn quadlet_keys(section: &str) -> &'static [&'static str] {
    match section {
        "Unit" => &[
            "Description",
            "Documentation",
            "After",
            "Before",
            "Wants",
            "Requires",
        ],
        "Container" => &[
            "AddCapability",
            "AddDevice",
            "AddHost",
            "Annotation",
            "AutoUpdate",
            "CgroupsMode",
            "ContainerName",
            "ContainersConfModule",
            "DNS",
            "DNSOption",
            "DNSSearch",
            "DropCapability",
            "Entrypoint",
            "Environment",
            "EnvironmentFile",
            "EnvironmentHost",
            "Exec",
            "ExposeHostPort",
            "GIDMap",
            "GlobalArgs",
            "Group",
            "GroupAdd",
            "HealthCmd",
            "HealthInterval",
            "HealthOnFailure",
            "HealthRetries",
            "HealthStartPeriod",
            "HostName",
            "IP",
            "IP6",
            "Image",
            "Label",
            "LogDriver",
            "LogOpt",
            "Mask",
            "Mount",
            "Network",
            "NetworkAlias",
            "NoNewPrivileges",
            "Notify",
            "PidsLimit",
            "Pod",
            "PodmanArgs",
            "PublishPort",
            "Pull",
            "ReadOnly",
            "ReadOnlyTmpfs",
            "Rootfs",
            "RunInit",
            "SeccompProfile",
            "Secret",
            "SecurityLabelDisable",
            "SecurityLabelFileType",
            "SecurityLabelLevel",
            "SecurityLabelNested",
            "SecurityLabelType",
            "ShmSize",
            "StopSignal",
            "StopTimeout",
            "SubGIDMap",
            "SubUIDMap",
            "Sysctl",
            "Timezone",
            "Tmpfs",
            "UIDMap",
            "Ulimit",
            "Unmask",
            "User",
            "UserNS",
            "Volume",
            "WorkingDir",
        ],
        "Service" => &["Restart", "RestartSec", "TimeoutStartSec", "TimeoutStopSec"],
        "Install" => &["WantedBy", "RequiredBy", "UpheldBy"],
        _ => &[],
    }
}

/// Every line is a known section, a comment, blank, or a known `Key=Value`;
/// sections come in the usual order; the essentials are present.
fn check_quadlet(text: &str) {
    let order = ["Unit", "Container", "Service", "Install"];
    let mut section: Option<&str> = None;
    let mut seen: Vec<&str> = Vec::new();
    let mut keys: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    assert!(text.ends_with('\n') && !text.ends_with("\n\n"), "{text}");
    for (i, line) in text.lines().enumerate() {
        let at = || format!("line {}: {line:?}\n{text}", i + 1);
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            assert!(order.contains(&name), "unknown section {}", at());
            assert!(!seen.contains(&name), "repeated section {}", at());
            seen.push(name);
            section = Some(name);
            continue;
        }
        let s = section.unwrap_or_else(|| panic!("key before any section {}", at()));
        let (k, v) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("not Key=Value {}", at()));
        assert!(
            quadlet_keys(s).contains(&k),
            "unknown key in [{s}] {}",
            at()
        );
        assert!(!v.is_empty(), "empty value {}", at());
        assert!(
            !v.chars().any(char::is_control),
            "control character {}",
            at()
        );
        assert!(
            v.replace("%%", "").find('%').is_none(),
            "unescaped specifier {}",
            at()
        );
        keys.entry(s).or_default().insert(k);
    }
    let mut sorted = seen.clone();
    sorted.sort_by_key(|s| order.iter().position(|o| o == s));
    assert_eq!(seen, sorted, "section order\n{text}");
    assert_eq!(seen, order, "all four sections\n{text}");
    for k in ["Image", "ContainerName", "User", "Group", "Label"] {
        assert!(keys["Container"].contains(k), "missing {k}\n{text}");
    }
    assert!(keys["Install"].contains("WantedBy"));
}

// ---------------------------------------------------------------- k8s schema

fn parse_yaml(text: &str) -> Node {
    let mut docs =
        parse_stream(FileId(0), text).unwrap_or_else(|d| panic!("unparsable YAML: {d:?}\n{text}"));
    assert_eq!(docs.len(), 1, "one document per file\n{text}");
    docs.remove(0)
}

fn is_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// IANA_SVC_NAME: ≤15, lowercase alnum and `-`, a letter, no `--`, no edge `-`.
fn is_port_name(s: &str) -> bool {
    is_label(s) && s.len() <= 15 && s.bytes().any(|b| b.is_ascii_lowercase()) && !s.contains("--")
}

fn is_label_value(s: &str) -> bool {
    s.len() <= 63
        && (s.is_empty()
            || (s.starts_with(|c: char| c.is_ascii_alphanumeric())
                && s.ends_with(|c: char| c.is_ascii_alphanumeric())
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))))
}

fn str_at<'a>(n: &'a Node, path: &[&str]) -> &'a str {
    let mut cur = n;
    for k in path {
        cur = cur
            .get(k)
            .unwrap_or_else(|| panic!("missing {}", path.join(".")));
    }
    cur.as_str()
        .unwrap_or_else(|| panic!("{} is not a scalar", path.join(".")))
}

/// A plain integer scalar (what Kubernetes needs for ports and ids).
fn int(n: &Node, what: &str) -> i64 {
    match &n.value {
        Value::Scalar(s, Style::Plain) => s
            .parse()
            .unwrap_or_else(|_| panic!("{what}: `{s}` is not an integer")),
        other => panic!("{what}: {other:?} is not a plain integer"),
    }
}

fn seq<'a>(n: &'a Node, what: &str) -> &'a [Node] {
    n.as_seq().unwrap_or_else(|| panic!("{what} is not a list"))
}

fn check_metadata(n: &Node, file: &str) {
    let name = str_at(n, &["metadata", "name"]);
    assert!(is_label(name), "{file}: name {name:?}");
    if let Some(labels) = n.get("metadata").and_then(|m| m.get("labels")) {
        for (k, v) in labels.as_map().unwrap_or_else(|| panic!("{file}: labels")) {
            let v = v.as_str().unwrap_or_else(|| panic!("{file}: label value"));
            assert!(is_label_value(v), "{file}: label {k:?}={v:?}");
            assert!(matches!(v.len(), 0..=63));
        }
    }
}

/// Structural checks of a whole tree, cross-file.
fn check_tree(t: &KustomizeTree, b: &ResolvedBox) {
    let docs: BTreeMap<&str, Node> = t
        .files
        .iter()
        .map(|(p, text)| (p.as_str(), parse_yaml(text)))
        .collect();
    let base_k = &docs["base/kustomization.yaml"];
    assert_eq!(str_at(base_k, &["kind"]), "Kustomization");
    let resources: Vec<&str> = seq(base_k.get("resources").expect("resources"), "resources")
        .iter()
        .map(|r| r.as_str().expect("resource"))
        .collect();
    let base_files: BTreeSet<&str> = docs
        .keys()
        .filter_map(|p| p.strip_prefix("base/"))
        .filter(|p| *p != "kustomization.yaml")
        .collect();
    assert_eq!(
        resources.iter().copied().collect::<BTreeSet<_>>(),
        base_files,
        "base resources list every manifest"
    );

    let mut claims: BTreeSet<String> = BTreeSet::new();
    for (path, n) in &docs {
        if path.ends_with("kustomization.yaml") {
            continue;
        }
        check_metadata(n, path);
        let kind = str_at(n, &["kind"]);
        let api = str_at(n, &["apiVersion"]);
        match kind {
            "PersistentVolumeClaim" => {
                assert_eq!(api, "v1");
                assert_eq!(
                    seq(
                        n.get("spec")
                            .and_then(|s| s.get("accessModes"))
                            .expect("modes"),
                        "modes"
                    )[0]
                    .as_str(),
                    Some("ReadWriteOnce")
                );
                str_at(n, &["spec", "resources", "requests", "storage"]);
                claims.insert(str_at(n, &["metadata", "name"]).to_string());
            }
            "Deployment" | "Service" => {}
            other => panic!("{path}: unexpected kind {other}"),
        }
    }

    let dep = &docs["base/deployment.yaml"];
    assert_eq!(str_at(dep, &["apiVersion"]), "apps/v1");
    assert_eq!(str_at(dep, &["kind"]), "Deployment");
    let spec = dep.get("spec").expect("spec");
    assert_eq!(int(spec.get("replicas").expect("replicas"), "replicas"), 1);
    let selector = spec
        .get("selector")
        .and_then(|s| s.get("matchLabels"))
        .and_then(Node::as_map)
        .expect("selector");
    let tmpl = spec.get("template").expect("template");
    for (k, v) in selector {
        let key = k.as_str().expect("key");
        assert_eq!(
            str_at(tmpl, &["metadata", "labels", key]),
            v.as_str().expect("v"),
            "selector {key} matches the template"
        );
    }
    let pod = tmpl.get("spec").expect("pod spec");
    let psec = pod.get("securityContext").expect("pod securityContext");
    assert_eq!(
        int(psec.get("runAsUser").expect("runAsUser"), "runAsUser"),
        i64::from(b.user.uid)
    );
    assert_eq!(
        int(psec.get("runAsGroup").expect("runAsGroup"), "runAsGroup"),
        i64::from(b.user.gid)
    );
    let containers = seq(pod.get("containers").expect("containers"), "containers");
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    assert!(is_label(str_at(c, &["name"])));
    let image = str_at(c, &["image"]);
    assert!(!image.is_empty());
    let mut container_ports = BTreeSet::new();
    if let Some(ports) = c.get("ports") {
        for pt in seq(ports, "ports") {
            let n = int(
                pt.get("containerPort").expect("containerPort"),
                "containerPort",
            );
            assert!((1..=65535).contains(&n));
            assert!(is_port_name(str_at(pt, &["name"])), "port name");
            assert!(matches!(str_at(pt, &["protocol"]), "TCP" | "UDP" | "SCTP"));
            assert!(container_ports.insert(n), "container port {n} listed once");
        }
    }
    let vol_names: BTreeSet<&str> = pod
        .get("volumes")
        .map(|v| {
            seq(v, "volumes")
                .iter()
                .map(|v| str_at(v, &["name"]))
                .collect()
        })
        .unwrap_or_default();
    if let Some(vols) = pod.get("volumes") {
        for v in seq(vols, "volumes") {
            assert!(is_label(str_at(v, &["name"])));
            if let Some(pvc) = v.get("persistentVolumeClaim") {
                let claim = str_at(pvc, &["claimName"]);
                assert!(claims.contains(claim), "claim {claim} has a PVC");
            }
        }
    }
    if let Some(mounts) = c.get("volumeMounts") {
        for m in seq(mounts, "volumeMounts") {
            let name = str_at(m, &["name"]);
            assert!(vol_names.contains(name), "mount {name} names a volume");
            assert!(str_at(m, &["mountPath"]).starts_with('/'));
        }
    }
    if let Some(cmd) = c.get("command") {
        assert!(seq(cmd, "command").iter().all(|a| a.as_str().is_some()));
    }
    if let Some(env) = c.get("env") {
        let names: Vec<&str> = seq(env, "env")
            .iter()
            .map(|e| str_at(e, &["name"]))
            .collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(names, sorted, "env sorted and unique");
        for e in seq(env, "env") {
            assert!(
                matches!(e.get("value").map(|v| &v.value), Some(Value::Scalar(..))),
                "env values are strings"
            );
            let j = e.get("value").map(Node::to_json);
            assert!(
                j.as_ref().is_some_and(serde_json::Value::is_string),
                "{j:?}"
            );
        }
    }

    if let Some(svc) = docs.get("base/service.yaml") {
        assert_eq!(str_at(svc, &["apiVersion"]), "v1");
        assert_eq!(str_at(svc, &["kind"]), "Service");
        let sel = svc
            .get("spec")
            .and_then(|s| s.get("selector"))
            .and_then(Node::as_map)
            .expect("service selector");
        let json = |m: &[(Node, Node)]| -> Vec<(serde_json::Value, serde_json::Value)> {
            m.iter().map(|(k, v)| (k.to_json(), v.to_json())).collect()
        };
        assert_eq!(
            json(sel),
            json(selector),
            "service selects the deployment's pods"
        );
        for pt in seq(
            svc.get("spec").and_then(|s| s.get("ports")).expect("ports"),
            "ports",
        ) {
            let port = int(pt.get("port").expect("port"), "port");
            assert!((1..=65535).contains(&port));
            let target = int(pt.get("targetPort").expect("targetPort"), "targetPort");
            assert!(container_ports.contains(&target), "targetPort {target}");
            assert!(is_port_name(str_at(pt, &["name"])));
        }
    } else {
        assert!(container_ports.is_empty(), "ports without a Service");
    }

    let overlays: Vec<&&str> = docs.keys().filter(|p| p.starts_with("overlays/")).collect();
    assert_eq!(overlays.len(), 1, "one overlay");
    let ov = &docs[*overlays[0]];
    assert_eq!(str_at(ov, &["kind"]), "Kustomization");
    assert!(is_label(str_at(ov, &["namespace"])));
    assert_eq!(
        seq(ov.get("resources").expect("resources"), "resources")[0].as_str(),
        Some("../../base")
    );
    let img = &seq(ov.get("images").expect("images"), "images")[0];
    let name = str_at(img, &["name"]);
    assert!(
        image == name
            || image.starts_with(&format!("{name}:"))
            || image.starts_with(&format!("{name}@")),
        "overlay image entry {name} matches {image}"
    );
}

// ---------------------------------------------------------------- real validators

/// Under CI every validator is required (no skip); elsewhere when
/// `CHARLY_REQUIRE_VALIDATORS=1`.
fn require_validators() -> bool {
    charly_testutil::under_ci()
        || std::env::var("CHARLY_REQUIRE_VALIDATORS").is_ok_and(|v| v == "1")
}

/// A tool from an environment variable, else the first existing candidate.
fn find_tool(var: &str, candidates: &[&str]) -> Option<PathBuf> {
    if let Ok(v) = std::env::var(var) {
        return Some(PathBuf::from(v));
    }
    for c in candidates {
        let p = PathBuf::from(c);
        if p.is_absolute() {
            if p.is_file() {
                return Some(p);
            }
        } else if let Some(path) = std::env::var_os("PATH") {
            for dir in std::env::split_paths(&path) {
                if dir.join(c).is_file() {
                    return Some(dir.join(c));
                }
            }
        }
    }
    None
}

fn absent(tool: &str, how: &str) {
    assert!(
        !require_validators(),
        "{tool} is required (under CI, or with CHARLY_REQUIRE_VALIDATORS=1) but not found; {how}"
    );
    // Written past the test harness's output capture, so a skip is seen.
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "SKIP: {tool} not found; {how}");
}

/// The boxes the validators see: the snapshot boxes and the security box.
fn validator_inputs() -> (tempfile::TempDir, Vec<(String, QuadletUnit, KustomizeTree)>) {
    let (t, p, r) = security_project();
    let out = ["jupyter", "filebrowser", "redis", "githubrunner", "secbox"]
        .iter()
        .map(|n| {
            let b = get(&r, n);
            (n.to_string(), quadlet(&p, b), kustomize(&p, b))
        })
        .collect();
    (t, out)
}

/// podman's own quadlet generator parses every unit and turns it into a
/// service. Needs quadlet from podman >= 4.7 (see the module docs of
/// `charly_rules::emit::quadlet`); Debian 12's podman 4.3 has none.
#[test]
fn quadlet_generator_accepts_units() {
    let Some(tool) = find_tool(
        "CHARLY_QUADLET",
        &["/usr/libexec/podman/quadlet", "/usr/lib/podman/quadlet"],
    ) else {
        return absent(
            "podman quadlet",
            "install podman >= 4.7 or set CHARLY_QUADLET to a quadlet binary",
        );
    };
    let (_t, inputs) = validator_inputs();
    let dir = tempfile::tempdir().expect("tmp");
    for (_, q, _) in &inputs {
        std::fs::write(dir.path().join(&q.file_name), &q.text).expect("write");
    }
    let out = Command::new(&tool)
        .args(["-dryrun", "-user", "-no-kmsg-log"])
        .env("QUADLET_UNIT_DIRS", dir.path())
        .output()
        .expect("run quadlet");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "quadlet failed:\n{stderr}\n{stdout}");
    assert!(!stderr.contains("unsupported key"), "{stderr}");
    for (name, q, _) in &inputs {
        let version = q
            .text
            .lines()
            .find_map(|l| l.strip_prefix("Image="))
            .and_then(|i| i.rsplit_once(':'))
            .map(|(_, v)| v)
            .unwrap_or_default();
        let marker = format!("---{}---", q.service);
        let start = stdout
            .find(&marker)
            .unwrap_or_else(|| panic!("{name}: no {marker} in\n{stdout}"));
        let section = &stdout[start..];
        let exec = section
            .lines()
            .find(|l| l.starts_with("ExecStart="))
            .unwrap_or_else(|| panic!("{name}: no ExecStart"));
        assert!(
            exec.contains(&format!("--name {}", q.container_name)),
            "{exec}"
        );
        assert!(exec.contains("--user 1000:1000"), "{exec}");
        if name == "jupyter" {
            assert!(exec.contains("--publish 8888:8888"), "{exec}");
            assert!(
                exec.contains("-v charly-jupyter-workspace:/workspace"),
                "{exec}"
            );
            let tail = format!(
                "--entrypoint=supervisord localhost/jupyter:{} -n -c /etc/supervisord.conf",
                version
            );
            assert!(exec.ends_with(&tail), "{exec}");
        }
        if name == "secbox" {
            // systemd reduces `$$` to `$` and `%%` to `%` when it runs ExecStart.
            assert!(exec.contains("--env \"DOLLAR=$$HOME/x $$(pwd)\""), "{exec}");
            assert!(exec.contains("--env PERCENT=50%%"), "{exec}");
            assert!(exec.contains("--privileged"), "{exec}");
            assert!(
                exec.contains("--shm-size 2g") || exec.contains("--shm-size=2g"),
                "{exec}"
            );
        }
    }
}

/// kubernetes-validate (PyPI) checks every manifest against the bundled
/// Kubernetes JSON schemas, rejecting unknown fields (`--strict`).
#[test]
fn kubernetes_validate_accepts_manifests() {
    let Some(tool) = find_tool("CHARLY_KUBERNETES_VALIDATE", &["kubernetes-validate"]) else {
        return absent(
            "kubernetes-validate",
            "`pip install kubernetes-validate` or set CHARLY_KUBERNETES_VALIDATE",
        );
    };
    let (_t, inputs) = validator_inputs();
    let dir = tempfile::tempdir().expect("tmp");
    let mut files = Vec::new();
    for (name, _, k) in &inputs {
        for (path, text) in &k.files {
            if path.ends_with("kustomization.yaml") {
                continue;
            }
            let f = dir
                .path()
                .join(format!("{name}-{}", path.replace('/', "-")));
            std::fs::write(&f, text).expect("write");
            files.push(f);
        }
    }
    let out = Command::new(&tool)
        .arg("--strict")
        .args(&files)
        .output()
        .expect("run kubernetes-validate");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "kubernetes-validate failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.matches("INFO").count(),
        files.len(),
        "one verdict per file:\n{stdout}"
    );
}

/// `kustomize build` (or `kubectl kustomize`) builds every overlay — it
/// rejects unknown kustomization fields and dangling resources — and the
/// built stream is valid for kubernetes-validate when that is installed too.
#[test]
fn kustomize_builds_overlays() {
    let build: Box<dyn Fn(&Path) -> Command> =
        if let Some(k) = find_tool("CHARLY_KUSTOMIZE", &["kustomize"]) {
            Box::new(move |dir: &Path| {
                let mut c = Command::new(&k);
                c.arg("build").arg(dir);
                c
            })
        } else if let Some(k) = find_tool("CHARLY_KUBECTL", &["kubectl"]) {
            Box::new(move |dir: &Path| {
                let mut c = Command::new(&k);
                c.arg("kustomize").arg(dir);
                c
            })
        } else {
            return absent(
                "kustomize",
                "install kustomize (or kubectl), or set CHARLY_KUSTOMIZE",
            );
        };
    let (_t, inputs) = validator_inputs();
    let validate = find_tool("CHARLY_KUBERNETES_VALIDATE", &["kubernetes-validate"]);
    for (name, _, k) in &inputs {
        let dir = tempfile::tempdir().expect("tmp");
        for (path, text) in &k.files {
            let f = dir.path().join(path);
            std::fs::create_dir_all(f.parent().expect("parent")).expect("mkdir");
            std::fs::write(&f, text).expect("write");
        }
        let out = build(&dir.path().join("overlays/default"))
            .output()
            .expect("run kustomize");
        let built = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "{name}: kustomize build failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let docs = parse_stream(FileId(0), &built).expect("built stream parses");
        assert_eq!(
            docs.len(),
            k.files.len() - 2,
            "{name}: every manifest built"
        );
        for d in &docs {
            assert_eq!(str_at(d, &["metadata", "namespace"]), "charly", "{name}");
            assert_eq!(
                str_at(d, &["metadata", "labels", "ai.opencharly.overlay"]),
                "default",
                "{name}"
            );
        }
        if let Some(v) = &validate {
            let f = dir.path().join("built.yaml");
            std::fs::write(&f, &built).expect("write");
            let out = Command::new(v)
                .arg("--strict")
                .arg(&f)
                .output()
                .expect("run kubernetes-validate");
            assert!(
                out.status.success(),
                "{name}: built stream invalid:\n{}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
    }
}
