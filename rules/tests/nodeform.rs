//! The node-form reader (schema 2026.174): the whole 2026.174 corpus loads
//! into the same model as the 2026.160 one, candies whose content did not
//! change resolve to the same model in both eras, and malformed nodes get
//! one located diagnostic each.

use charly_rules::cascade;
use charly_rules::diag::Diagnostic;
use charly_rules::load::{self, CandyEntry, LoadOptions, Project};
use charly_rules::resolve;
use charly_testutil::{corpus, corpus_174};
use std::path::Path;

fn load(dir: &Path) -> Project {
    load::load(dir, &LoadOptions::default())
        .unwrap_or_else(|e| panic!("{} loads: {e:?}", dir.display()))
}

fn lines(p: &Project, it: impl Iterator<Item = Diagnostic>) -> Vec<String> {
    it.map(|d| d.one_line(&p.sources)).collect()
}

/// Every diagnostic of loading plus the candies' own validation.
fn all_diags(p: &Project) -> Vec<Diagnostic> {
    // What `charly validate` reports: loading, the candies' own
    // validation, and resolving every box.
    let mut d: Vec<Diagnostic> = p.diags.iter().cloned().collect();
    d.extend(charly_rules::validate::validate_candies(p));
    let r = resolve::resolve(p);
    d.extend(r.diags.iter().cloned());
    for b in r.boxes.values() {
        if let Err(e) = b {
            d.extend(e.iter().cloned());
        }
    }
    d
}

#[test]
fn the_whole_2026_174_corpus_loads_without_errors() {
    let p = load(&corpus_174());
    assert!(
        p.root_ns().nodeform,
        "version 2026.174.1100 selects the node form"
    );
    assert!(!p.root_unusable);
    let dirs = std::fs::read_dir(corpus_174().join("candy"))
        .expect("candy dir")
        .flatten()
        .filter(|e| e.path().join("charly.yml").is_file())
        .count();
    assert_eq!(dirs, 272, "candy directories with a charly.yml");
    assert_eq!(p.candies.len(), 272, "every candy loads");
    let d = all_diags(&p);
    let errors = lines(&p, d.iter().filter(|x| x.is_error()).cloned());
    assert!(errors.is_empty(), "{errors:#?}");
    // Warnings only for what docs/format.md names as not supported yet.
    let documented = ["not supported yet"];
    let other: Vec<String> = lines(
        &p,
        d.iter()
            .filter(|x| !documented.iter().any(|m| x.message.contains(m)))
            .cloned(),
    );
    assert!(other.is_empty(), "{other:#?}");
    // One warning per place: nothing is reported twice.
    let all = lines(&p, d.iter().cloned());
    let mut dedup = all.clone();
    dedup.sort();
    dedup.dedup();
    assert_eq!(all.len(), dedup.len(), "a diagnostic is reported twice");
    // The vocabulary of charly/charly.yml is read; the builders whose stage
    // templates left it keep charly's built-ins.
    let v = &p.root_ns().vocab;
    assert!(v.distro.contains_key("debian") && v.distro.contains_key("fedora"));
    assert!(v.init.contains_key("supervisord"));
    assert!(v.builder["npm"].stage_template.is_some());
    // Other kinds are kept.
    assert!(p.root_ns().kept.contains_key("vm/k3s-vm"));
    assert!(p.root_ns().kept.contains_key("local/check-local"));
}

#[test]
fn a_node_form_candy_folds_its_children() {
    let p = load(&corpus_174());
    let redis = &p.candies["redis"].def;
    assert_eq!(redis.port.len(), 1);
    assert_eq!(redis.port[0].value, "6379");
    assert_eq!(
        redis.env.get("REDIS_URL").map(|v| v.value.as_str()),
        Some("redis://127.0.0.1:6379")
    );
    assert_eq!(redis.service.len(), 1);
    assert_eq!(redis.task.len(), 1);
    assert_eq!(
        redis.task[0].mkdir.as_ref().map(|m| m.value.as_str()),
        Some("${HOME}/.redis")
    );
    assert_eq!(
        redis.task[0].user.as_ref().map(|m| m.value.as_str()),
        Some("${USER}")
    );
    assert_eq!(redis.agent_step.len(), 1);
    let mut diags = Vec::new();
    let checks = charly_rules::check::parse_checks(
        &redis.eval.as_ref().expect("checks").0,
        "candy:redis",
        &mut diags,
    );
    assert!(diags.is_empty(), "{diags:?}");
    let ids: Vec<&str> = checks.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "redis-step-1",
            "redis-step-2",
            "redis-step-3",
            "redis-step-4",
            "redis-step-5",
            "redis-responds",
            "redis-port-open"
        ]
    );
    use charly_rules::check::{CheckKind, CheckScope};
    assert!(
        matches!(&checks[0].kind, CheckKind::File { path, exists: Some(true), .. } if path == "/usr/bin/redis-server")
    );
    assert!(
        matches!(&checks[2].kind, CheckKind::Package { name, package_map, .. } if name == "valkey-compat-redis" && package_map["arch"] == "valkey")
    );
    assert_eq!(checks[0].scope, CheckScope::Build);
    assert_eq!(checks[3].scope, CheckScope::Deploy, "context: [runtime]");
    // Positions point into the candy file.
    let f = p.sources.rel(p.candies["redis"].file);
    assert_eq!(f, "candy/redis/charly.yml");
    assert_eq!(redis.port[0].span.line, 31);
}

/// What the build acts on, comparable across eras.
fn shape(c: &CandyEntry) -> String {
    let d = &c.def;
    let mut s = String::new();
    let names = |v: &[charly_rules::model::PackageItem]| {
        v.iter().map(|p| p.name.value.clone()).collect::<Vec<_>>()
    };
    s += &format!(
        "require {:?}\ncandy {:?}\n",
        d.require.iter().map(|r| &r.value).collect::<Vec<_>>(),
        d.candy.iter().map(|r| &r.value).collect::<Vec<_>>()
    );
    s += &format!("package {:?}\n", names(&d.package));
    for (k, sec) in d.distro.iter() {
        s += &format!(
            "distro {} {:?} repos {}\n",
            k.value,
            names(&sec.package),
            sec.repo.len()
        );
    }
    for (k, v) in d.env.iter() {
        s += &format!("env {}={}\n", k.value, v.value);
    }
    for (k, v) in d.var.iter() {
        s += &format!("var {}={}\n", k.value, v.value);
    }
    s += &format!(
        "path_append {:?}\n",
        d.path_append.iter().map(|r| &r.value).collect::<Vec<_>>()
    );
    s += &format!(
        "port {:?}\n",
        d.port.iter().map(|r| &r.value).collect::<Vec<_>>()
    );
    for t in &d.task {
        let verbs: Vec<String> = t
            .verbs()
            .iter()
            .map(|(n, v)| format!("{n}={}", v.value.trim()))
            .collect();
        s += &format!(
            "task {verbs:?} user={:?} mode={:?} to={:?} content={:?}\n",
            t.user.as_ref().map(|x| &x.value),
            t.mode.as_ref().map(|x| &x.value),
            t.to.as_ref().map(|x| &x.value),
            t.content.as_ref().map(|x| x.value.trim()),
        );
    }
    for sv in &d.service {
        s += &format!(
            "service {} exec={:?} packaged={:?}\n",
            sv.name.value,
            sv.exec.as_ref().map(|x| &x.value),
            sv.use_packaged.as_ref().map(|x| &x.value)
        );
    }
    s += &format!(
        "volume {:?}\n",
        d.volume
            .iter()
            .map(|v| (&v.name.value, &v.path.value))
            .collect::<Vec<_>>()
    );
    s
}

#[test]
fn unchanged_candies_resolve_to_the_same_model_in_both_eras() {
    let old = load(&corpus());
    let new = load(&corpus_174());
    let mut same = Vec::new();
    for (k, c) in &old.candies {
        if let Some(n) = new.candies.get(k)
            && shape(c) == shape(n)
        {
            same.push(k.as_str());
        }
    }
    // Candies whose install content did not change between the eras.
    for k in [
        "redis",
        "ripgrep",
        "sshd",
        "supervisord",
        "postgresql",
        "k3s",
        "dbus",
        "python",
        "sway",
        "openwebui",
        "yay",
        "testapi",
    ] {
        {
            assert!(
                same.contains(&k),
                "{k} differs:\n--- 2026.160\n{}\n--- 2026.174\n{}",
                shape(&old.candies[k]),
                shape(&new.candies[k])
            );
        }
    }
    if std::env::var_os("CHARLY_SHOW_ERA_DIFF").is_some() {
        for (k, c) in &old.candies {
            if let Some(n) = new.candies.get(k)
                && !same.contains(&k.as_str())
            {
                eprintln!(
                    "=== {k}\n--- 2026.160\n{}--- 2026.174\n{}",
                    shape(c),
                    shape(n)
                );
            }
        }
        eprintln!("same: {}/{} {same:?}", same.len(), old.candies.len());
    }
    assert!(
        // 41 of the 57 classic candies; the 16 others changed content
        // between the eras (packages, requires, commands).
        same.len() >= 41,
        "only {} candies match: {same:?}",
        same.len()
    );
    // The cascade gives the same packages for a box's tags.
    let chain: Vec<String> = ["fedora:43", "fedora", "rpm", "all"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(
        cascade::resolve(&old.candies["redis"].def, &chain).packages,
        cascade::resolve(&new.candies["redis"].def, &chain).packages
    );
}

#[test]
fn a_box_repository_resolves_the_shared_candies_offline() {
    for repo in ["debian", "ubuntu"] {
        let p = load(&corpus_174().join("box").join(repo));
        assert!(p.root_ns().nodeform);
        assert_eq!(p.root_ns().boxes.len(), 5, "{repo}: every image");
        let d = all_diags(&p);
        let errors = lines(&p, d.iter().filter(|x| x.is_error()).cloned());
        assert!(errors.is_empty(), "{repo}: {errors:#?}");
        let r = resolve::resolve(&p);
        assert!(
            r.boxes.values().all(Result::is_ok),
            "{repo}: every box resolves"
        );
    }
    let p = load(&corpus_174().join("box/debian"));
    // Its vocabulary is the one of the repository its candies come from.
    let debian = p.root_ns().vocab_origin["distro/debian"];
    assert_eq!(p.sources.rel(debian), "../../charly/charly.yml");
    let boxes: Vec<&str> = p.root_ns().boxes.keys().map(String::as_str).collect();
    assert!(
        boxes.contains(&"debian") && boxes.contains(&"debian-coder"),
        "{boxes:?}"
    );
    let errors = lines(&p, p.diags.errors().cloned());
    assert!(errors.is_empty(), "{errors:#?}");
    let r = resolve::resolve(&p);
    let coder = r.get("debian-coder").unwrap_or_else(|| {
        panic!(
            "debian-coder resolves: {:?}",
            r.boxes
                .get("debian-coder")
                .map(|b| b.as_ref().err().map(|e| lines(&p, e.iter().cloned())))
        )
    });
    assert!(coder.candies.len() > 10, "{:?}", coder.candies);
    // The candies come from the enclosing project's tree.
    let k = &coder.candies[0];
    assert!(
        p.candies[k]
            .dir
            .starts_with(corpus_174().canonicalize().expect("canon").join("candy"))
    );
}

// --- edge cases -----------------------------------------------------------

fn project(files: &[(&str, &str)]) -> tempfile::TempDir {
    let t = tempfile::tempdir().expect("tmp");
    let base = [(
        "charly.yml",
        "version: 2026.174.1100\ndiscover:\n  - path: candy\n",
    )];
    for (path, body) in base.iter().chain(files) {
        let p = t.path().join(path);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, body).expect("write");
    }
    t
}

fn find<'a>(p: &Project, d: &'a [Diagnostic], needle: &str) -> (&'a Diagnostic, String) {
    let hits: Vec<&Diagnostic> = d.iter().filter(|x| x.message.contains(needle)).collect();
    assert_eq!(
        hits.len(),
        1,
        "exactly one `{needle}` in {:#?}",
        d.iter().map(|x| x.one_line(&p.sources)).collect::<Vec<_>>()
    );
    (hits[0], hits[0].location(&p.sources))
}

const HEAD: &str = "a:\n  candy:\n    version: 2026.174.1100\n    description: x\n";

#[test]
fn an_unknown_child_field_warns_once_with_the_nearest_name() {
    let t = project(&[(
        "candy/a/charly.yml",
        &format!("{HEAD}  a-port:\n    prot: [80]\n"),
    )]);
    let p = load(t.path());
    let d = all_diags(&p);
    let (w, at) = find(&p, &d, "unknown field `prot`");
    assert!(!w.is_error());
    assert_eq!(at, "candy/a/charly.yml:6:5");
    assert_eq!(w.hint.as_deref(), Some("did you mean `port`?"));
    assert_eq!(p.candies.len(), 1);
}

#[test]
fn a_step_with_run_and_check_is_an_error_at_its_second_key() {
    let t = project(&[(
        "candy/a/charly.yml",
        &format!("{HEAD}  a-step-0:\n    run: mkdir=/x\n    mkdir: /x\n    check: x\n"),
    )]);
    let p = load(t.path());
    let d = all_diags(&p);
    let (e, at) = find(&p, &d, "has both `run:` and `check:`");
    assert!(e.is_error());
    assert_eq!(at, "candy/a/charly.yml:8:5");
}

#[test]
fn a_node_without_a_kind_names_the_nearest_kind() {
    let t = project(&[(
        "candy/a/charly.yml",
        "a:\n  cany:\n    version: 2026.174.1100\n",
    )]);
    let p = load(t.path());
    let d = all_diags(&p);
    let (e, at) = find(&p, &d, "node `a` has no kind");
    assert!(e.is_error());
    assert_eq!(at, "candy/a/charly.yml:1:1");
    assert_eq!(e.hint.as_deref(), Some("did you mean `candy`?"));
    assert!(p.candies.is_empty());
}

#[test]
fn a_node_with_two_kinds_is_an_error() {
    let t = project(&[("candy/a/charly.yml", &format!("{HEAD}  vm: {{}}\n"))]);
    let p = load(t.path());
    let d = all_diags(&p);
    let (e, at) = find(&p, &d, "has two kinds");
    assert!(e.is_error());
    assert_eq!(at, "candy/a/charly.yml:5:3");
}

#[test]
fn an_image_is_a_candy_with_a_base_and_has_no_port() {
    let t = project(&[
        ("candy/a/charly.yml", HEAD),
        (
            "candy/img/charly.yml",
            "img:\n  candy:\n    base: debian:13\n    build: [deb]\n  img-candy:\n    candy: [a]\n  img-port:\n    port: [80]\n",
        ),
    ]);
    let p = load(t.path());
    let d = all_diags(&p);
    let b = &p.root_ns().boxes["img"];
    assert_eq!(
        b.def.base.as_ref().map(|x| x.value.as_str()),
        Some("debian:13")
    );
    assert_eq!(b.def.candy[0].value, "a");
    let (e, at) = find(&p, &d, "`port:` of an image");
    assert!(e.is_error());
    assert_eq!(at, "candy/img/charly.yml:8:5");
    assert_eq!(p.candies.len(), 1, "the image is not a layer");
}

#[test]
fn a_field_set_twice_and_a_field_in_the_wrong_place_are_errors() {
    let t = project(&[(
        "candy/a/charly.yml",
        &format!(
            "{HEAD}  a-port:\n    port: [80]\n  a-port2:\n    port: [81]\n  a-task:\n    task: []\n"
        ),
    )]);
    let p = load(t.path());
    let d = all_diags(&p);
    let (_, at) = find(&p, &d, "field `port` of node `a` is set twice");
    assert_eq!(at, "candy/a/charly.yml:8:5");
    let (_, at) = find(&p, &d, "steps are child nodes");
    assert_eq!(at, "candy/a/charly.yml:10:5");
}

#[test]
fn a_candy_version_is_strict_calver() {
    let t = project(&[(
        "candy/a/charly.yml",
        "a:\n  candy:\n    version: 1.2.3-beta\n    description: x\n",
    )]);
    let p = load(t.path());
    let d = all_diags(&p);
    let (e, at) = find(&p, &d, "is not a strict CalVer");
    assert!(e.is_error());
    assert_eq!(at, "candy/a/charly.yml:3:14");
}

#[test]
fn node_form_versions_are_strict_calver_and_bounded() {
    let t = project(&[]);
    std::fs::write(t.path().join("charly.yml"), "version: 2026.174.11\n").expect("write");
    let p = load(t.path());
    let d = all_diags(&p);
    let (e, at) = find(&p, &d, "not a strict CalVer");
    assert!(e.is_error());
    assert_eq!(at, "charly.yml:1:10");
    std::fs::write(t.path().join("charly.yml"), "version: 2026.190.1100\n").expect("write");
    let p = load(t.path());
    let d = all_diags(&p);
    find(&p, &d, "newer than this charly supports (2026.174.1100)");
    // The classic era still reads its own files.
    std::fs::write(t.path().join("charly.yml"), "version: 2026.160.1301\n").expect("write");
    let p = load(t.path());
    assert!(!p.root_ns().nodeform);
    assert!(p.diags.errors().next().is_none());
}

#[test]
fn an_unknown_top_level_scalar_warns_once() {
    let t = project(&[]);
    std::fs::write(
        t.path().join("charly.yml"),
        "version: 2026.174.1100\nrepoo: github.com/x/y\n",
    )
    .expect("write");
    let p = load(t.path());
    let d = all_diags(&p);
    let (w, at) = find(&p, &d, "unknown top-level key `repoo`");
    assert!(!w.is_error());
    assert_eq!(at, "charly.yml:2:1");
    assert_eq!(w.hint.as_deref(), Some("did you mean `repo`?"));
}

#[test]
fn a_service_distro_filter_picks_the_entries_of_the_box_distro() {
    let p = load(&corpus_174());
    let v = &p.candies["virtualization"].def;
    let names = |tags: &[&str]| {
        let tags: Vec<String> = tags.iter().map(|s| s.to_string()).collect();
        let mut n: Vec<&str> = v
            .service
            .iter()
            .filter(|s| s.applies_to(&tags))
            .map(|s| s.name.value.as_str())
            .collect();
        n.dedup();
        n
    };
    assert_eq!(names(&["debian:13", "debian"]), ["libvirtd"]);
    assert_eq!(
        names(&["fedora:43", "fedora"]),
        ["virtqemud", "virtnetworkd"]
    );
    assert!(names(&["alpine"]).is_empty());
    // An entry without `distro:` applies everywhere.
    assert!(p.candies["redis"].def.service[0].applies_to(&[]));
}

#[test]
fn plugin_run_steps_become_plugin_tasks_of_a_declared_word() {
    let p = load(&corpus_174());
    let c = &p.candies["stepkind-build-consumer"];
    let t = c
        .def
        .task
        .iter()
        .find(|t| t.plugin.is_some())
        .expect("a plugin task");
    assert_eq!(
        t.plugin.as_ref().map(|w| w.value.as_str()),
        Some("examplestepkind")
    );
    assert_eq!(
        t.plugin_input.as_ref().map(|i| i.to_json()),
        Some(serde_json::json!({"marker": "STEPKIND-BUILD-BAKED-OK"}))
    );
    let ctx: Vec<&str> = t.context.iter().map(|c| c.value.as_str()).collect();
    assert_eq!(ctx, ["build"]);
    let owner = p.plugins.for_task("examplestepkind").expect("declared");
    assert_eq!(owner.candy, "plugin-example-stepkind");
    assert_eq!(owner.class, charly_rules::plugin::ProviderClass::Step);
    // Every verb the corpus's run steps use is declared once.
    for w in ["file", "unix_group", "examplestep"] {
        assert!(p.plugins.for_task(w).is_some(), "{w}");
    }
}
