//! `charly box …`.

use crate::{Cli, output, project};
use charly_engine::journal::Scope;
use charly_engine::pure::Printed;
use charly_rules::plan::{HostContext, InstallStep, Target};
use charly_rules::resolve::BaseRef;
use serde::Serialize;
use std::io::Write;
use std::process::ExitCode;

/// Box subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum BoxCommand {
    /// List every box: base chain, distro, resolved candy order, or what stops it resolving.
    List {
        /// Print a JSON array instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        journal: crate::journaled::JournalArgs,
    },
    /// Show the InstallPlan of a box for a target: per candy, its steps with
    /// kind, scope, venue and gate. `--json` prints the full IR (stable).
    Plan {
        /// The box.
        #[arg(value_name = "BOX")]
        name: String,
        /// Where the plan would be applied.
        #[arg(long, value_enum, default_value = "oci")]
        target: TargetArg,
        /// Print `{box, target, deploy_id, plans: [{candy, steps}]}` as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        journal: crate::journaled::JournalArgs,
    },
    /// Render boxes to build directories (`.build/<box>/Containerfile` plus
    /// staged files); prints the written paths. Fails naming every box that
    /// could not be generated, after generating the others.
    Generate(crate::engine_cmd::GenerateArgs),
    /// Build box images: builder stages, local packages, base images first;
    /// only nodes whose key changed run.
    Build(crate::engine_cmd::BuildArgs),
    /// Build a box (as `box build` does) and push its image to a registry:
    /// `charly box push hello registry.example:5000/team/hello:1.0`. Layers
    /// the registry already has are not sent; `podman pull` of the
    /// reference then runs it anywhere.
    Push(PushArgs),
}

/// `box push`.
#[derive(clap::Args, Debug)]
pub struct PushArgs {
    /// The box.
    #[arg(value_name = "BOX")]
    pub name: String,
    /// `[oci://]HOST[:PORT]/REPO[:TAG]` (TAG defaults to the box's version;
    /// plain HTTP only for loopback registries).
    #[arg(value_name = "REF")]
    pub reference: String,
    /// Write what was pushed as JSON to FILE (see `box build --metadata-file`).
    #[arg(long, value_name = "FILE")]
    pub metadata_file: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub dev_local_pkg: crate::session::DevLocalPkg,
    #[command(flatten)]
    pub run: crate::session::RunArgs,
    #[command(flatten)]
    pub runner: crate::session::RunnerArgs,
}

/// `--target` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetArg {
    /// An OCI image build.
    Oci,
    /// This host.
    Local,
    /// A VM over SSH.
    Vm,
    /// A pod (quadlet).
    Pod,
    /// Kubernetes (kustomize).
    K8s,
}

impl From<TargetArg> for Target {
    fn from(t: TargetArg) -> Target {
        match t {
            TargetArg::Oci => Target::Oci,
            TargetArg::Local => Target::Local,
            TargetArg::Vm => Target::Vm,
            TargetArg::Pod => Target::Pod,
            TargetArg::K8s => Target::K8s,
        }
    }
}

/// The JSON document of `box plan --json` (a documented, stable interface).
#[derive(Serialize, serde::Deserialize, Debug, PartialEq)]
pub struct PlanDoc {
    /// Box name.
    #[serde(rename = "box")]
    pub box_name: String,
    /// Target.
    pub target: Target,
    /// Deploy id of the merged plan.
    pub deploy_id: String,
    /// Box version.
    pub version: String,
    /// The box user's home (home-bearing fields are resolved for container targets).
    pub home: String,
    /// Per-candy plans in install order.
    pub plans: Vec<CandyPlan>,
}

/// One candy's plan in [`PlanDoc`].
#[derive(Serialize, serde::Deserialize, Debug, PartialEq)]
pub struct CandyPlan {
    /// Candy name.
    pub candy: String,
    /// Its steps.
    pub steps: Vec<InstallStep>,
}

/// One row of `box list --json`.
#[derive(Serialize)]
pub struct BoxRow {
    /// Qualified name (`cachyos.cachyos` for imported boxes).
    pub name: String,
    /// The base as written: external image, box, or bootstrap.
    pub base: Option<String>,
    /// Internal bases, nearest first, ending with the external root image.
    pub base_chain: Vec<String>,
    /// Distro tags, most specific first (expanded through `inherits`).
    pub distro: Vec<String>,
    /// Package formats, primary first.
    pub formats: Vec<String>,
    /// Candies in install order (empty when unresolved).
    pub candies: Vec<String>,
    /// Candies already in the base image.
    pub provided: Vec<String>,
    /// Builder type → builder box, for builders this box's candies trigger.
    pub builders: std::collections::BTreeMap<String, Option<String>>,
    /// Effective version.
    pub version: Option<String>,
    /// Box user.
    pub user: Option<String>,
    /// Whether `--all` includes it.
    pub enabled: bool,
    /// `null`, or why the box does not resolve (each problem with file:line:col).
    pub error: Option<String>,
}

/// Runs a box subcommand.
pub fn run(cli: &Cli, c: &BoxCommand) -> anyhow::Result<ExitCode> {
    match c {
        BoxCommand::List { json, journal } => crate::journaled::print(
            cli,
            *journal,
            serde_json::json!({"command": "box list", "json": json}),
            |scope| list(cli, scope, *json),
        ),
        BoxCommand::Plan {
            name,
            target,
            json,
            journal,
        } => {
            let target: Target = (*target).into();
            crate::journaled::print(
                cli,
                *journal,
                serde_json::json!({
                    "command": "box plan",
                    "box": name,
                    "target": target.as_str(),
                    "json": json,
                }),
                |scope| plan(cli, scope, name, target, *json),
            )
        }
        BoxCommand::Generate(a) => crate::engine_cmd::generate(cli, a),
        BoxCommand::Build(a) => crate::engine_cmd::build(cli, a),
        BoxCommand::Push(a) => crate::engine_cmd::build(
            cli,
            &crate::engine_cmd::BuildArgs {
                boxes: vec![a.name.clone()],
                all: false,
                dry_run: false,
                explain: false,
                no_journal: false,
                dev_local_pkg: a.dev_local_pkg,
                load: false,
                output: None,
                push: Some(a.reference.clone()),
                metadata_file: a.metadata_file.clone(),
                run: a.run.clone(),
                runner: a.runner.clone(),
            },
        ),
    }
}

fn list(cli: &Cli, scope: &Scope, json: bool) -> anyhow::Result<Printed> {
    let o = project::open(cli)?;
    let mut printed = Printed {
        covered: scope.covers_project(&o.project),
        ..Printed::default()
    };
    let sources = &o.project.sources;
    let mut rows = Vec::new();
    for (name, r) in &o.resolution.boxes {
        let row = match r {
            Ok(b) => {
                let mut chain = b.base_chain.clone();
                chain.push(b.root_image.clone());
                BoxRow {
                    name: name.clone(),
                    base: Some(match &b.base {
                        BaseRef::External(x) | BaseRef::Box(x) => x.clone(),
                        BaseRef::Bootstrap { builder, .. } => format!("builder:{builder}"),
                    }),
                    base_chain: chain,
                    distro: b.tags.clone(),
                    formats: b.formats.clone(),
                    candies: b.candies.clone(),
                    provided: b.provided.clone(),
                    builders: b
                        .builders
                        .iter()
                        .map(|u| (u.builder.clone(), u.image.clone()))
                        .collect(),
                    version: Some(b.version.clone()),
                    user: Some(b.user.name.clone()),
                    enabled: b.enabled,
                    error: None,
                }
            }
            Err(errs) => {
                let def = project::find_def(&o.project, name);
                BoxRow {
                    name: name.clone(),
                    base: def
                        .and_then(|d| d.base.as_ref().or(d.from.as_ref()).map(|b| b.value.clone())),
                    base_chain: Vec::new(),
                    distro: def
                        .and_then(|d| d.distro.as_ref().map(|x| x.value.0.clone()))
                        .unwrap_or_default(),
                    formats: Vec::new(),
                    candies: Vec::new(),
                    provided: Vec::new(),
                    builders: Default::default(),
                    version: def.and_then(|d| d.version.as_ref().map(|v| v.value.clone())),
                    user: None,
                    enabled: def.and_then(|d| d.enabled).unwrap_or(true),
                    error: Some(
                        errs.iter()
                            .map(|d| d.one_line(sources))
                            .collect::<Vec<_>>()
                            .join("; "),
                    ),
                }
            }
        };
        rows.push(row);
    }
    if json {
        output::json_to(&mut printed.stdout, &rows)?;
    } else {
        // Columns as wide as their widest cell; no trailing blanks.
        let cells: Vec<[String; 4]> =
            std::iter::once(["BOX", "BASE", "DISTRO", "CANDIES"].map(String::from))
                .chain(rows.iter().map(|r| match &r.error {
                    None => [
                        r.name.clone(),
                        r.base.clone().unwrap_or_else(|| "-".into()),
                        r.distro.first().cloned().unwrap_or_else(|| "-".into()),
                        r.candies.join(" "),
                    ],
                    Some(e) => [r.name.clone(), "ERROR".into(), String::new(), e.clone()],
                }))
                .collect();
        let width = |c: usize| {
            cells
                .iter()
                .map(|r| r[c].chars().count())
                .max()
                .unwrap_or(0)
        };
        let (w0, w1, w2) = (width(0), width(1), width(2));
        let out = &mut printed.stdout;
        for r in &cells {
            let line = format!("{:w0$}  {:w1$}  {:w2$}  {}", r[0], r[1], r[2], r[3]);
            writeln!(out, "{}", line.trim_end())?;
        }
        let ok = rows.iter().filter(|r| r.error.is_none()).count();
        printed
            .notes
            .push(format!("{} boxes, {ok} resolve", rows.len()));
    }
    Ok(printed)
}

fn plan(
    cli: &Cli,
    scope: &Scope,
    name: &str,
    target: Target,
    json: bool,
) -> anyhow::Result<Printed> {
    let o = project::open(cli)?;
    let mut printed = Printed {
        covered: scope.covers_project(&o.project),
        ..Printed::default()
    };
    let b = project::resolved(&o, name)?;
    let ctx = HostContext {
        target,
        ..HostContext::default()
    };
    let mut plans = charly_rules::plan::build_box_plans(&o.project, b, &ctx)?;
    if target.is_container() {
        for p in &mut plans {
            p.resolve_home(&b.user.home);
        }
    }
    let merged = charly_rules::plan::merge_plans(&plans, &b.name, &[]);
    let doc = PlanDoc {
        box_name: b.name.clone(),
        target,
        deploy_id: merged.deploy_id.clone(),
        version: b.version.clone(),
        home: b.user.home.clone(),
        plans: plans
            .into_iter()
            .map(|p| CandyPlan {
                candy: p.candy.unwrap_or_default(),
                steps: p.steps,
            })
            .collect(),
    };
    if json {
        output::json_to(&mut printed.stdout, &doc)?;
        return Ok(printed);
    }
    let out = &mut printed.stdout;
    writeln!(
        out,
        "box {} {} for {} (deploy id {})",
        doc.box_name,
        doc.version,
        target.as_str(),
        doc.deploy_id
    )?;
    for p in &doc.plans {
        writeln!(out, "  candy {}", p.candy)?;
        for s in &p.steps {
            let gate = match s.gate {
                charly_rules::plan::Gate::None => String::new(),
                g => format!("  [needs --{}]", label(&g)),
            };
            writeln!(
                out,
                "    {:<17} {:<12} {:<17} {}{gate}",
                s.kind.as_str(),
                label(&s.scope),
                label(&s.venue),
                summary(s),
            )?;
        }
    }
    Ok(printed)
}

/// The serde name of a unit enum value.
fn label<T: Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// One short line describing a step.
fn summary(s: &InstallStep) -> String {
    use charly_rules::plan::StepData as D;
    let short = |t: &str| -> String {
        let first = t.lines().next().unwrap_or("");
        if first.chars().count() > 60 {
            format!("{}…", first.chars().take(60).collect::<String>())
        } else {
            first.to_string()
        }
    };
    match &s.data {
        D::SystemPackages(p) if p.packages.is_empty() => {
            format!("{} repos: {}", p.format, p.repos.len() + p.copr.len())
        }
        D::SystemPackages(p) => format!("{}: {}", p.format, p.packages.join(" ")),
        D::Builder(b) => format!("{} in {}", b.builder, b.image.as_deref().unwrap_or("?")),
        D::Op(o) => format!("{}: {}", o.verb, short(&o.value)),
        D::File(f) => format!("{} {} ({})", f.verb, f.path, f.mode),
        D::ServicePackaged(p) => p.unit.clone(),
        D::ServiceCustom(c) => format!("{} ({})", c.unit, c.init),
        D::ShellHook(h) => format!("{} env, {} path", h.env.len(), h.path.len()),
        D::ShellSnippet(sn) => format!("{} -> {}", sn.shell, sn.destination),
        D::RepoChange(r) => format!("{} repos", r.repos.len()),
        D::LocalPkgInstall(l) => format!("{} from {}", l.format, l.source),
        D::ApkInstall(_) => "android packages".into(),
        D::Reboot(_) => "reboot".into(),
        D::External(_) => String::new(),
    }
}
