//! InstallPlan compiler tests over real corpus candies.

use charly_rules::load::{self, LoadOptions, Project};
use charly_rules::plan::*;
use charly_rules::resolve::{self, Resolution};
use std::path::Path;

use charly_testutil::corpus;

/// A corpus copy with extra test boxes.
fn with_boxes(boxes: &[(&str, &str)]) -> (tempfile::TempDir, Project, Resolution) {
    let files: Vec<(String, &str)> = boxes
        .iter()
        .map(|(name, body)| (format!("box/{name}/charly.yml"), *body))
        .collect();
    let files: Vec<(&str, &str)> = files.iter().map(|(p, b)| (p.as_str(), *b)).collect();
    with_files(&files)
}

/// A corpus copy with extra files (project-relative paths).
fn with_files(files: &[(&str, &str)]) -> (tempfile::TempDir, Project, Resolution) {
    let t = tempfile::tempdir().expect("tmp");
    for e in walkdir::WalkDir::new(corpus()).into_iter().flatten() {
        let rel = e.path().strip_prefix(corpus()).expect("prefix");
        let dest = t.path().join(rel);
        if e.file_type().is_dir() {
            std::fs::create_dir_all(&dest).expect("mkdir");
        } else {
            std::fs::copy(e.path(), &dest).expect("copy");
        }
    }
    for (rel, body) in files {
        let p = t.path().join(rel);
        std::fs::create_dir_all(p.parent().expect("p")).expect("mkdir");
        std::fs::write(p, body).expect("write");
    }
    let p = load::load(t.path(), &LoadOptions::default()).expect("loads");
    let r = resolve::resolve(&p);
    (t, p, r)
}

fn plan(p: &Project, r: &Resolution, b: &str, candy: &str, target: Target) -> InstallPlan {
    let rb = r
        .get(b)
        .unwrap_or_else(|| panic!("{b}: {:?}", r.boxes.get(b)));
    build_deploy_plan(
        p,
        rb,
        candy,
        &HostContext {
            target,
            ..HostContext::default()
        },
    )
    .expect("compiles")
}

#[test]
fn ripgrep_in_a_fedora_box() {
    let (_t, p, r) = with_boxes(&[(
        "rg",
        "box:\n  name: rg\n  base: fedora\n  candy: [ripgrep]\n",
    )]);
    let pl = plan(&p, &r, "rg", "ripgrep", Target::Local);
    assert_eq!(pl.steps.len(), 1, "{:#?}", pl.steps);
    let s = &pl.steps[0];
    assert_eq!(s.kind, StepKind::SystemPackages);
    assert_eq!(
        (s.scope, s.venue, s.gate, s.phase),
        (
            Scope::System,
            Venue::HostNative,
            Gate::None,
            Some(Phase::Install)
        )
    );
    let StepData::SystemPackages(d) = &s.data else {
        panic!("data")
    };
    assert_eq!(d.format, "rpm");
    assert_eq!(d.packages, vec!["ripgrep"]);
    assert_eq!(s.reverse.len(), 1);
    assert_eq!(s.reverse[0].kind, ReverseKind::PackageRemove);
    assert_eq!(s.reverse[0].targets, vec!["ripgrep"]);
    assert_eq!(
        s.reverse[0].uninstall_cmd.as_deref(),
        Some("dnf remove -y ripgrep")
    );
    assert_eq!(d.host_cmd.as_deref(), Some("dnf install -y ripgrep"));
}

#[test]
fn pre_commit_is_an_npm_builder_in_a_container() {
    let (_t, p, r) = with_boxes(&[(
        "pc",
        "box:\n  name: pc\n  base: fedora\n  candy: [pre-commit]\n",
    )]);
    let pl = plan(&p, &r, "pc", "pre-commit", Target::Local);
    let npm = pl
        .steps
        .iter()
        .find(|s| matches!(&s.data, StepData::Builder(b) if b.builder == "npm"))
        .expect("npm builder step");
    assert_eq!(
        (npm.scope, npm.venue, npm.gate),
        (Scope::User, Venue::ContainerBuilder, Gate::None)
    );
    let StepData::Builder(b) = &npm.data else {
        panic!()
    };
    assert_eq!(b.image.as_deref(), Some("fedora-builder"));
    assert_eq!(b.manifest.as_deref(), Some("package.json"));
    assert_eq!(npm.reverse[0].kind, ReverseKind::NpmUninstallG);
    assert!(
        !npm.reverse[0].targets.is_empty(),
        "package names from package.json"
    );
    // Emission order: packages, then ops in YAML order, then builders.
    let kinds: Vec<String> = pl.steps.iter().map(|s| s.kind.as_str()).collect();
    let first_builder = kinds.iter().position(|k| k == "builder").expect("builder");
    let op = kinds
        .iter()
        .position(|k| k == "op")
        .expect("cargo install op");
    assert!(
        kinds[0] == "system-packages" && op < first_builder,
        "{kinds:?}"
    );
}

#[test]
fn direnv_snippets_with_the_fish_override() {
    let (_t, p, r) = with_boxes(&[]);
    for (target, bash_dest, managed) in [
        (Target::Oci, "/etc/profile.d/charly-direnv-bash.sh", false),
        (Target::Local, "{{.Home}}/.bashrc", true),
    ] {
        let pl = plan(&p, &r, "filebrowser", "direnv", target);
        let snippets: Vec<&ShellSnippetStep> = pl
            .steps
            .iter()
            .filter_map(|s| match &s.data {
                StepData::ShellSnippet(x) => Some(x),
                _ => None,
            })
            .collect();
        assert_eq!(
            snippets
                .iter()
                .map(|s| s.shell.as_str())
                .collect::<Vec<_>>(),
            vec!["bash", "zsh", "fish", "sh"]
        );
        // In an image every POSIX shell sources all of /etc/profile.d, so
        // each snippet is guarded for its shell; rc-file blocks are not.
        let guard = |test: &str, body: &str| {
            if managed {
                body.to_string()
            } else {
                format!("if {test}; then\n{body}fi\n")
            }
        };
        assert_eq!(
            snippets[0].text,
            guard(
                "[ -n \"${BASH_VERSION:-}\" ]",
                "eval \"$(direnv hook bash)\"\n"
            )
        );
        assert_eq!(
            snippets[1].text,
            guard(
                "[ -n \"${ZSH_VERSION:-}\" ]",
                "eval \"$(direnv hook zsh)\"\n"
            )
        );
        assert_eq!(
            snippets[2].text, "direnv hook fish | source\n",
            "per-shell entry wins"
        );
        assert_eq!(snippets[0].destination, bash_dest);
        assert_eq!(snippets[0].managed_block, managed);
        // Snippets come after packages.
        assert_eq!(pl.steps[0].kind, StepKind::SystemPackages);
    }
}

#[test]
fn nvidia_driver_on_an_arch_family_box_ends_with_a_reboot() {
    let (_t, p, r) = with_boxes(&[(
        "nv",
        "box:\n  name: nv\n  base: cachyos.cachyos\n  candy: [nvidia-driver]\n",
    )]);
    let pl = plan(&p, &r, "nv", "nvidia-driver", Target::Vm);
    let last = pl.steps.last().expect("steps");
    assert_eq!(last.kind, StepKind::Reboot);
    assert_eq!(
        (last.scope, last.venue, last.gate),
        (Scope::System, Venue::HostNative, Gate::None)
    );
    assert!(last.reverse.is_empty());
    let StepData::SystemPackages(d) = &pl.steps[0].data else {
        panic!("packages first")
    };
    assert_eq!(d.format, "pac");
    assert!(
        d.packages
            .contains(&"linux-cachyos-nvidia-open".to_string())
    );
    // Root cmds are gated, root writes are system files.
    assert!(
        pl.steps
            .iter()
            .any(|s| s.kind == StepKind::Op && s.gate == Gate::AllowRootTasks)
    );
    assert!(
        pl.steps
            .iter()
            .any(|s| s.kind == StepKind::File && s.scope == Scope::System)
    );
    // In an image build the reboot is skipped.
    let oci = plan(&p, &r, "nv", "nvidia-driver", Target::Oci);
    assert_eq!(oci.steps.last().map(|s| s.venue), Some(Venue::Skip));
}

#[test]
fn every_resolvable_box_compiles_for_every_target_deterministically() {
    let p = load::load(&corpus(), &LoadOptions::default()).expect("loads");
    let r = resolve::resolve(&p);
    let mut n = 0;
    for (name, b) in &r.boxes {
        let Ok(b) = b else { continue };
        for target in [
            Target::Oci,
            Target::Local,
            Target::Vm,
            Target::Pod,
            Target::K8s,
        ] {
            let ctx = HostContext {
                target,
                ..HostContext::default()
            };
            let a = build_merged_plan(&p, b, &ctx, &[])
                .unwrap_or_else(|e| panic!("{name}/{target:?}: {e}"));
            let again = build_merged_plan(&p, b, &ctx, &[]).expect("again");
            let (ja, jb) = (
                serde_json::to_string(&a).expect("json"),
                serde_json::to_string(&again).expect("json"),
            );
            assert_eq!(ja, jb, "{name} {target:?}");
            let back: InstallPlan = serde_json::from_str(&ja).expect("round trip");
            assert_eq!(back, a);
            n += 1;
        }
    }
    assert!(n >= 19 * 5);
}

#[test]
fn merged_plans_keep_candy_boundaries() {
    let p = load::load(Path::new(&corpus()), &LoadOptions::default()).expect("loads");
    let r = resolve::resolve(&p);
    let b = r.get("jupyter").expect("jupyter");
    let m = build_merged_plan(&p, b, &HostContext::default(), &["ripgrep".into()]).expect("plan");
    assert_eq!(m.candies_included, b.candies);
    assert_eq!(m.add_candies, vec!["ripgrep"]);
    assert_eq!(
        m.deploy_id,
        deploy_id("jupyter", &b.candies, &["ripgrep".into()])
    );
    // Steps appear grouped by candy, in candy order.
    let mut seen: Vec<&str> = Vec::new();
    for s in &m.steps {
        if seen.last() != Some(&s.candy.as_str()) {
            assert!(!seen.contains(&s.candy.as_str()), "candy {} split", s.candy);
            seen.push(&s.candy);
        }
    }
}

/// A local package step carries what its format's `local_pkg` block says
/// (glob, install template, probe): a host walker installs from it, never
/// from a glob guessed from the format's name (`*.pac`).
#[test]
fn local_packages_carry_their_formats_install_template_glob_and_probe() {
    let (_t, p, r) = with_boxes(&[(
        "lp",
        "box:\n  name: lp\n  base: cachyos.cachyos\n  candy: [charly]\n",
    )]);
    let pl = plan(&p, &r, "lp", "charly", Target::Vm);
    let l = pl
        .steps
        .iter()
        .find_map(|s| match &s.data {
            StepData::LocalPkgInstall(l) => Some(l),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no local package step in {:#?}", pl.steps));
    assert_eq!(
        (l.format.as_str(), l.source.as_str(), l.glob.as_str()),
        ("pac", "pkg/arch", "*.pkg.tar.zst")
    );
    assert!(
        l.install_template
            .as_deref()
            .is_some_and(|t| t.contains("pacman -U") && t.contains("{{.Glob}}")),
        "{l:?}"
    );
    assert_eq!(l.probe.as_deref(), Some("command -v pacman"));
}

/// A box that keeps its base's user may run systemd: pod and k8s plans pick
/// it for custom services, as the Containerfile does; other boxes get
/// supervisord.
#[test]
fn a_box_keeping_its_base_user_runs_its_services_under_systemd() {
    let (_t, p, r) = with_boxes(&[
        (
            "keeps",
            "box:\n  name: keeps\n  base: fedora\n  preserve_user: true\n  candy: [dbus]\n",
        ),
        (
            "plain",
            "box:\n  name: plain\n  base: fedora\n  candy: [dbus]\n",
        ),
    ]);
    let init = |b: &str, target: Target| {
        plan(&p, &r, b, "dbus", target)
            .steps
            .iter()
            .find_map(|s| match &s.data {
                StepData::ServiceCustom(c) => Some(c.init.clone()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("{b}: no custom service"))
    };
    for target in [Target::Pod, Target::K8s, Target::Oci] {
        assert_eq!(init("keeps", target), "systemd", "{target:?}");
        assert_eq!(init("plain", target), "supervisord", "{target:?}");
    }
}

/// A box made for Fedora, deployed on a Debian host: refused before any
/// change, naming both distros and the candies without a Debian section;
/// with only candies that have one, compiled with the Debian section and
/// the deb format. On its own distro the box is unchanged.
#[test]
fn a_box_for_another_distro_is_refused_or_compiled_for_the_host() {
    let (_t, p, r) = with_boxes(&[
        (
            "fmixed",
            "box:\n  name: fmixed\n  base: fedora\n  candy: [dbus, ffmpeg]\n",
        ),
        (
            "fdbus",
            "box:\n  name: fdbus\n  base: fedora\n  candy: [dbus]\n",
        ),
    ]);
    let debian = HostOs::parse("ID=debian\nVERSION_ID=\"12\"\n").expect("os");
    let mixed = r.get("fmixed").expect("fmixed resolves");
    let err = for_host(&p, mixed, &[], &debian).expect_err("ffmpeg has no debian section");
    let msg = err.to_string();
    assert!(
        msg.contains("fedora (rpm packages)")
            && msg.contains("debian 12 (deb packages)")
            && msg.contains("ffmpeg")
            && !msg.contains("dbus"),
        "{msg}"
    );

    let dbus = r.get("fdbus").expect("fdbus resolves");
    let hb = for_host(&p, dbus, &[], &debian).expect("dbus has a debian section");
    assert_eq!(hb.distro_def.as_deref(), Some("debian"));
    assert_eq!(hb.pkg(), Some("deb"));
    let pl = build_deploy_plan(
        &p,
        &hb,
        "dbus",
        &HostContext {
            target: Target::Vm,
            distro: hb.distro_def.clone(),
            ..HostContext::default()
        },
    )
    .expect("compiles");
    let pk = pl
        .steps
        .iter()
        .find_map(|s| match &s.data {
            StepData::SystemPackages(pk) => Some(pk),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no packages: {:#?}", pl.steps));
    assert_eq!(
        (pk.format.as_str(), pk.packages.as_slice()),
        ("deb", &["dbus".to_string()][..])
    );

    let fedora = HostOs::parse("ID=fedora\nVERSION_ID=43\n").expect("os");
    let same = for_host(&p, mixed, &[], &fedora).expect("its own distro");
    assert_eq!(same.tags, mixed.tags);
    assert_eq!(same.formats, mixed.formats);
}

/// A candy declaring a step and a verb, and one whose tasks use them.
const PLUGIN_FILES: [(&str, &str); 3] = [
    (
        "candy/stepper/charly.yml",
        "candy:\n  name: stepper\n  plugin:\n    providers: [step:examplestepkind, verb:probe]\n    source: builtin\n",
    ),
    (
        "candy/uses-plugins/charly.yml",
        "candy:\n  name: uses-plugins\n  task:\n    - plugin: examplestepkind\n      plugin_input: {marker: M1, n: 3}\n      context: [build]\n    - plugin: probe\n      user: ${USER}\n",
    ),
    (
        "box/pl/charly.yml",
        "box:\n  name: pl\n  base: fedora\n  candy: [uses-plugins]\n",
    ),
];

#[test]
fn plugin_tasks_compile_to_external_steps_carrying_their_input() {
    let (_t, p, r) = with_files(&PLUGIN_FILES);
    let errors: Vec<String> = p.diags.errors().map(|d| d.one_line(&p.sources)).collect();
    assert!(errors.is_empty(), "{errors:#?}");
    let pl = plan(&p, &r, "pl", "uses-plugins", Target::Oci);
    let kinds: Vec<String> = pl.steps.iter().map(|s| s.kind.as_str()).collect();
    assert_eq!(kinds, ["external:examplestepkind", "external-plugin"]);
    let s = &pl.steps[0];
    assert_eq!(
        (s.scope, s.venue, s.gate),
        (Scope::System, Venue::HostNative, Gate::None)
    );
    let StepData::External(e) = &s.data else {
        panic!("{:?}", s.data)
    };
    assert_eq!(e.data["input"], serde_json::json!({"marker": "M1", "n": 3}));
    assert_eq!(e.data["provider"], "stepper");
    assert_eq!(e.data["class"], "step");
    assert_eq!(
        pl.steps[1].scope,
        Scope::User,
        "a ${{USER}} task is the user's"
    );
    assert_eq!(
        serde_json::to_value(&pl.steps[1].data).expect("json")["data"]["word"],
        "probe"
    );

    // A build-only step is not applied on a host.
    let local = plan(&p, &r, "pl", "uses-plugins", Target::Local);
    assert_eq!(local.steps[0].venue, Venue::Skip);
    assert_eq!(local.steps[1].venue, Venue::HostNative);

    // Once the plugin has described itself, its contract decides.
    let mut p = p;
    p.plugins.contracts.insert(
        "examplestepkind".into(),
        charly_rules::plugin::StepContract {
            scope: Scope::User,
            venue: Venue::ContainerBuilder,
            gate: Gate::AllowRootTasks,
            emits: true,
        },
    );
    let pl = plan(&p, &r, "pl", "uses-plugins", Target::Oci);
    let s = &pl.steps[0];
    assert_eq!(
        (s.scope, s.venue, s.gate),
        (Scope::User, Venue::ContainerBuilder, Gate::AllowRootTasks)
    );
}

#[test]
fn a_task_using_an_undeclared_plugin_is_a_load_error_at_its_word() {
    let mut files = PLUGIN_FILES;
    files[1].1 = "candy:\n  name: uses-plugins\n  task:\n    - plugin: examplestepknd\n    - plugin_input: {a: 1}\n      cmd: true\n";
    let (_t, p, _r) = with_files(&files);
    let errors: Vec<String> = p.diags.errors().map(|d| d.one_line(&p.sources)).collect();
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert!(
        errors[0].starts_with("candy/uses-plugins/charly.yml:4:15")
            && errors[0].contains("plugin `examplestepknd`, which no candy declares"),
        "{errors:#?}"
    );
    let hint = p.diags.errors().next().and_then(|d| d.hint.clone());
    assert_eq!(hint.as_deref(), Some("did you mean `examplestepkind`?"));
    assert!(
        errors[1].contains("task #2 has `plugin_input:` but no `plugin:`"),
        "{errors:#?}"
    );
}

#[test]
fn a_plugin_fragment_is_spliced_as_root_and_a_missing_one_is_an_error() {
    use charly_rules::emit::{EmitOptions, render_box};
    let (_t, p, r) = with_files(&PLUGIN_FILES);
    let b = r.get("pl").expect("box");
    let plans = build_box_plans(&p, b, &HostContext::default()).expect("plans");
    let err = render_box(&p, b, &plans, &EmitOptions::default()).expect_err("no fragment");
    assert!(
        err.message
            .contains("candy `uses-plugins` task #1 (plugin `examplestepkind`): the `external:examplestepkind` step has no build fragment"),
        "{err}"
    );

    let mut opts = EmitOptions::default();
    opts.plugin_fragments.insert(
        ("uses-plugins".into(), 0),
        "RUN printf '%s\\n' M1 > /etc/baked\n".into(),
    );
    opts.plugin_fragments
        .insert(("uses-plugins".into(), 1), "LABEL probe=1\n".into());
    let d = render_box(&p, b, &plans, &opts).expect("renders");
    let cf = &d.containerfile;
    let at = cf
        .find("RUN printf '%s\\n' M1 > /etc/baked")
        .expect("spliced");
    let before = &cf[..at];
    let last_user = before.lines().rev().find(|l| l.starts_with("USER "));
    assert!(
        matches!(last_user, Some("USER 0" | "USER root")),
        "as root:\n{cf}"
    );
    assert!(cf.contains("# candy `uses-plugins` task #1 (plugin `examplestepkind`)"));
    assert!(cf.contains("LABEL probe=1"));

    // A deploy-only plugin step is left out of the image, saying so.
    let mut opts = opts.clone();
    opts.plugin_fragments.clear();
    opts.deploy_only_plugins = ["examplestepkind", "probe"].map(String::from).into();
    let d = render_box(&p, b, &plans, &opts).expect("renders");
    assert!(
        d.containerfile
            .contains("(plugin `probe`): deploy-only, not in images")
    );

    // A fragment that would start a stage, or is not instructions, is refused.
    for (bad, why) in [
        ("FROM alpine\nRUN true\n", "starts a new stage"),
        ("rm -rf /\n", "not an instruction"),
        ("RUN cat <<EOF\nx\n", "here-document open"),
        ("  \n", "is empty"),
    ] {
        let mut opts = EmitOptions {
            deploy_only_plugins: ["probe".to_string()].into(),
            ..EmitOptions::default()
        };
        opts.plugin_fragments
            .insert(("uses-plugins".into(), 0), bad.into());
        let e = render_box(&p, b, &plans, &opts).expect_err(bad);
        assert!(e.message.contains(why), "{bad:?}: {e}");
    }
    let ok = "RUN cat <<EOF > /x\nnot an instruction\nEOF\nRUN a \\\n  b\n";
    assert_eq!(
        charly_rules::emit::containerfile::check_fragment(ok),
        Ok(())
    );
}

/// A candy's steps depend only on its [`CompileContext`]: for every box and
/// candy of the corpus and the example, and every target, the plan is the
/// shared steps under the box's header ([`deploy_plan_header`]), encoded
/// alike (the engine keys fragments by this encoding, and shares the
/// steps across boxes whose context agrees).
#[test]
fn plans_are_context_steps_under_a_box_header() {
    use std::collections::HashMap;
    for root in [corpus(), charly_testutil::example()] {
        let p = load::load(&root, &LoadOptions::default()).expect("loads");
        let r = resolve::resolve(&p);
        for target in Target::ALL {
            let host = HostContext {
                target,
                ..HostContext::default()
            };
            let mut seen: HashMap<(String, CompileContext), Vec<InstallStep>> = HashMap::new();
            let mut checked = 0;
            for b in r.boxes.values().filter_map(|b| b.as_ref().ok()) {
                for k in &b.candies {
                    let Ok(plan) = build_deploy_plan(&p, b, k, &host) else {
                        continue;
                    };
                    let cx = CompileContext::of(b, k);
                    let steps = compile_candy_steps(&p, &cx, k, &host).expect("compiles");
                    assert_eq!(steps, plan.steps, "{}/{k}", b.name);
                    let view = DeployPlanRef {
                        steps: &steps,
                        ..deploy_plan_header(b, k, &host)
                    };
                    assert_eq!(
                        serde_json::to_value(&view).expect("encodes"),
                        serde_json::to_value(&plan).expect("encodes"),
                        "{}/{k}",
                        b.name
                    );
                    if let Some(prev) = seen.get(&(k.clone(), cx.clone())) {
                        assert_eq!(prev, &steps, "{}/{k}: same context, other steps", b.name);
                    }
                    seen.insert((k.clone(), cx), steps);
                    checked += 1;
                }
            }
            assert!(checked > 0, "{}: no plans", root.display());
        }
    }
}
