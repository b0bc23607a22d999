//! Application port protocols (`https+insecure:3000`, issue 18 finding 12)
//! reach the deploy emitters as TCP: the quadlet publishes `N:N` (TCP is
//! podman's default), Kubernetes gets `protocol: TCP` and a valid IANA port
//! name `tcp-N`; `udp:N` stays UDP. The protocol string itself never becomes
//! a token of either output.

use charly_rules::emit::kustomize::{KustomizeOptions, render_kustomize};
use charly_rules::emit::quadlet::{QuadletOptions, render_quadlet};
use charly_rules::load::{self, LoadOptions};
use charly_rules::plan::{HostContext, Target, build_merged_plan};
use charly_rules::resolve;

#[test]
fn https_insecure_is_published_over_tcp() {
    let t = tempfile::tempdir().expect("tmp");
    for (path, body) in [
        (
            "charly.yml",
            "version: 2026.160.1301\ndiscover: [box, candy]\ndefaults:\n  build: [rpm]\n",
        ),
        (
            "box/b/charly.yml",
            "box:\n  name: b\n  version: 1.0.0\n  base: quay.io/fedora/fedora:43\n  distro: [fedora]\n  candy: [a]\n",
        ),
        (
            "candy/a/charly.yml",
            "candy:\n  version: 1.0.0\n  package: [curl]\n  port: [\"https+insecure:3000\", \"udp:5353\", \"http:8080\"]\n",
        ),
    ] {
        let p = t.path().join(path);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, body).expect("write");
    }
    let p = load::load(t.path(), &LoadOptions::default()).expect("loads");
    let r = resolve::resolve(&p);
    let b = r.get("b").expect("b resolves");
    let diags = charly_rules::validate::validate_candies(&p);
    assert!(diags.is_empty(), "{diags:?}");

    let plan = |target| {
        let ctx = HostContext {
            target,
            ..HostContext::default()
        };
        build_merged_plan(&p, b, &ctx, &[]).expect("plan")
    };
    let q = render_quadlet(&p, b, &plan(Target::Pod), &QuadletOptions::default()).expect("quadlet");
    let publish: Vec<&str> = q
        .text
        .lines()
        .filter(|l| l.starts_with("PublishPort="))
        .collect();
    assert_eq!(
        publish,
        [
            "PublishPort=3000:3000",
            "PublishPort=5353:5353/udp",
            "PublishPort=8080:8080"
        ],
        "{}",
        q.text
    );
    assert!(!q.text.contains("insecure"), "{}", q.text);

    let k = render_kustomize(&p, b, &plan(Target::K8s), &KustomizeOptions::default())
        .expect("kustomize");
    let all: String = k.files.values().cloned().collect();
    assert!(!all.contains("insecure"), "{all}");
    let dep = &k.files["base/deployment.yaml"];
    for (name, port, proto) in [
        ("tcp-3000", 3000, "TCP"),
        ("tcp-8080", 8080, "TCP"),
        ("udp-5353", 5353, "UDP"),
    ] {
        let idx = dep
            .find(&format!("name: {name}"))
            .unwrap_or_else(|| panic!("no port {name}: {dep}"));
        let item = &dep[idx..];
        let item = &item[..item.find("- ").unwrap_or(item.len())];
        assert!(item.contains(&format!("containerPort: {port}")), "{item}");
        assert!(item.contains(&format!("protocol: {proto}")), "{item}");
    }
}
