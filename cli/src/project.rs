//! Opening the project named by `-C` (or found upwards from the cwd), and
//! finding the boxes a command names in it.

use crate::{Cli, output};
use anyhow::Context;
use charly_rules::load::{self, LoadOptions, Project};
use charly_rules::resolve::{self, Resolution};

/// A loaded and resolved project.
pub struct Opened {
    /// The project.
    pub project: Project,
    /// Its resolution.
    pub resolution: Resolution,
    /// What its plugins answered for the build leg
    /// (`plugins::prepare_build`; empty until then).
    pub plugin_build: charly_engine::graph::PluginBuild,
    /// Where the store keeps its nodes' own key inputs for this project
    /// state (`None` without a store).
    pub own_inputs: Option<charly_engine::graph::own::OwnFile>,
}

/// Loads and resolves the project. Refused (the errors printed, exit 1)
/// when its root file cannot be used as a whole, or when a name or token
/// breaks the identifier rules ([`charly_rules::names`]): such a name could
/// become a path outside the project or an instruction the YAML never asked
/// for, so no command but `validate` uses the project at all.
pub fn open(cli: &Cli) -> anyhow::Result<Opened> {
    open_at(cli, root(cli)?)
}

/// Loads and resolves the project without refusing it: for `validate`,
/// which reports every diagnostic itself.
pub fn open_lenient(cli: &Cli) -> anyhow::Result<Opened> {
    load_at(cli, root(cli)?)
}

/// The project's root directory: `-C DIR`, or found upwards from the cwd.
pub fn root(cli: &Cli) -> anyhow::Result<std::path::PathBuf> {
    Ok(match &cli.dir {
        Some(d) => {
            if !d.join("charly.yml").is_file() {
                anyhow::bail!(
                    "{} has no charly.yml (give -C the directory that holds your project's charly.yml)",
                    d.display()
                );
            }
            d.clone()
        }
        None => {
            let cwd = std::env::current_dir().context("cannot read the current directory")?;
            load::locate(&cwd).with_context(|| {
                "not inside a charly project; run from a directory with a charly.yml or pass -C DIR"
            })?
        }
    })
}

/// Loads and resolves the project at `root`; refused as [`open`] says.
/// A root `charly.yml` or vocabulary file that cannot be used as a whole (not
/// YAML, not UTF-8, empty, not a project document) would otherwise mean "no
/// boxes" and a silent success.
pub fn open_at(cli: &Cli, root: std::path::PathBuf) -> anyhow::Result<Opened> {
    let o = load_at(cli, root)?;
    if o.project.root_unusable {
        output::diagnostics(o.project.diags.errors(), &o.project.sources);
        anyhow::bail!(
            "the project file cannot be used; fix the errors above (`charly validate` lists every problem)"
        );
    }
    // Checked when the project loaded (charly_rules::names::check_project).
    let refused = &o.project.refused_names;
    if !refused.is_empty() {
        output::diagnostics(refused.iter(), &o.project.sources);
        output::error(&format!(
            "the project has {} name{} charly refuses to use (see above); nothing was done",
            refused.len(),
            if refused.len() == 1 { "" } else { "s" }
        ));
        return Err(crate::Reported.into());
    }
    Ok(o)
}

fn load_at(cli: &Cli, root: std::path::PathBuf) -> anyhow::Result<Opened> {
    // Trees parsed by earlier runs, kept in the store
    // (charly_engine::trees): only the manifests whose text changed are
    // parsed again; and the listings of the directories it walked
    // (charly_engine::dirs): only directories that changed are read again.
    // Both files are read whole, side by side. The store's caches are per
    // project, by its canonical root.
    let store = cli
        .cache_dir
        .clone()
        .or_else(charly_cache::Store::default_dir)
        .map(|s| {
            let canonical = std::fs::canonicalize(&root).unwrap_or_else(|_| root.clone());
            (s, canonical)
        });
    let (trees, dirs) = match &store {
        Some((s, canonical)) => {
            let (t, d) = rayon::join(
                || charly_engine::trees::TreeFile::open(s, canonical),
                || {
                    let racy = racy_ns_for_tests().unwrap_or(charly_engine::hash::RACY_NS);
                    charly_engine::dirs::DirFile::open(s, canonical, racy)
                },
            );
            (Some(std::sync::Arc::new(t)), Some(std::sync::Arc::new(d)))
        }
        None => (None, None),
    };
    let opts = LoadOptions {
        allow_unknown_fields: cli.allow_unknown_fields,
        imports: cli.imports.iter().cloned().collect(),
        trees: trees
            .clone()
            .map(|t| t as std::sync::Arc<dyn charly_rules::yaml::TreeCache>),
        dirs: dirs
            .clone()
            .map(|d| d as std::sync::Arc<dyn charly_rules::walk::DirCache>),
    };
    let project = {
        let _t = charly_engine::timings::phase("load");
        load::load(&root, &opts)?
    };
    drop(opts);
    if let Some((s, _)) = &store {
        // A cache that cannot be written only costs the next run its parse
        // or its listings.
        if let Some(t) = &trees {
            let _ = t.save(s);
        }
        if let Some(d) = &dirs {
            let _ = d.save(s);
        }
    }
    // Read back from the store when the project is as the last run
    // resolved it (charly_engine::resolved).
    let (resolution, own_inputs) = {
        let _t = charly_engine::timings::phase("resolve");
        match &store {
            Some((s, canonical)) => {
                let (r, state) = charly_engine::resolved::resolve(s, canonical, &project);
                let own = charly_engine::graph::own::OwnFile::new(s, canonical, state);
                (r, Some(own))
            }
            None => (resolve::resolve(&project), None),
        }
    };
    Ok(Opened {
        project,
        resolution,
        plugin_build: Default::default(),
        own_inputs,
    })
}

/// The definition of a box by qualified name, resolved or not.
pub fn find_def<'a>(p: &'a Project, qualified: &str) -> Option<&'a charly_rules::model::BoxDef> {
    p.namespaces.iter().find_map(|n| {
        n.boxes
            .values()
            .find(|b| n.qualify(&b.name) == qualified)
            .map(|b| &b.def)
    })
}

/// Finds a resolved box or explains why it is unavailable.
pub fn resolved<'a>(
    o: &'a Opened,
    name: &str,
) -> anyhow::Result<&'a charly_rules::resolve::ResolvedBox> {
    match o.resolution.boxes.get(name) {
        Some(Ok(b)) => {
            let errs = candy_errors(o, std::slice::from_ref(&b.name));
            if let Some((_, errs)) = errs.into_iter().next() {
                output::diagnostics(errs.iter(), &o.project.sources);
                output::error(&format!(
                    "box `{name}` uses candies with errors (above); nothing was done"
                ));
                return Err(crate::Reported.into());
            }
            Ok(b)
        }
        Some(Err(errs)) => {
            output::diagnostics(errs.iter(), &o.project.sources);
            Err(crate::Reported.into())
        }
        None => {
            let names = o.resolution.boxes.keys().map(String::as_str);
            let close = charly_rules::diag::nearest_n(name, names, 3);
            if close.is_empty() {
                anyhow::bail!("no box named `{name}` (see `charly box list`)")
            }
            anyhow::bail!("no box named `{name}`; did you mean {}?", close.join(", "))
        }
    }
}

/// The boxes of `names` (resolved) that use a candy with errors, each with
/// those errors (what `validate` says about the candy: its file's load
/// errors, [`charly_rules::validate::candy_errors`]). Each candy is
/// checked once, all in parallel.
pub fn candy_errors(o: &Opened, names: &[String]) -> Vec<(String, Vec<charly_rules::Diagnostic>)> {
    use rayon::prelude::*;
    let boxes: Vec<&charly_rules::resolve::ResolvedBox> = names
        .iter()
        .filter_map(|n| o.resolution.boxes.get(n).and_then(|r| r.as_ref().ok()))
        .collect();
    let keys: std::collections::BTreeSet<&str> = boxes
        .iter()
        .flat_map(|b| b.candies.iter().map(String::as_str))
        .collect();
    let bad: std::collections::BTreeMap<&str, Vec<charly_rules::Diagnostic>> = keys
        .into_par_iter()
        .map(|k| (k, charly_rules::validate::candy_errors(&o.project, k)))
        .filter(|(_, e)| !e.is_empty())
        .collect();
    boxes
        .iter()
        .filter_map(|b| {
            let errs: Vec<charly_rules::Diagnostic> = b
                .candies
                .iter()
                .filter_map(|k| bad.get(k.as_str()))
                .flatten()
                .cloned()
                .collect();
            (!errs.is_empty()).then(|| (b.name.clone(), errs))
        })
        .collect()
}

/// What to do with enabled boxes that do not resolve when `--all` selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unresolved {
    /// Name each with its first error and stop (exit 1).
    Fail,
    /// Name each with its first error and go on with the rest.
    Warn,
    /// Leave them out quietly (`explain`, which looks at one node).
    Ignore,
}

impl Unresolved {
    /// `Fail`, or `Warn` with `--keep-going`.
    pub fn unless(keep_going: bool) -> Self {
        if keep_going { Self::Warn } else { Self::Fail }
    }
}

/// Boxes named, or every enabled box with `--all`. A named box that does not
/// resolve is always an error. With `--all`, an enabled box that does not
/// resolve is never dropped silently: `policy` says whether it stops the run.
pub fn select(
    o: &Opened,
    names: &[String],
    all: bool,
    policy: Unresolved,
) -> anyhow::Result<Vec<String>> {
    select_warning(o, names, all, policy).map(|(names, _)| names)
}

/// [`select`], also returning the warnings it printed for boxes left out.
pub fn select_warning(
    o: &Opened,
    names: &[String],
    all: bool,
    policy: Unresolved,
) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    let mut warnings = Vec::new();
    if all || names.is_empty() {
        if !all && names.is_empty() {
            anyhow::bail!("name the boxes, or pass --all");
        }
        let mut chosen = Vec::new();
        let mut dropped: Vec<(&String, std::borrow::Cow<'_, [charly_rules::Diagnostic]>)> =
            Vec::new();
        for (n, b) in &o.resolution.boxes {
            match b {
                Ok(b) if b.enabled => chosen.push(n.clone()),
                Ok(_) => {}
                Err(errs) => {
                    if find_def(&o.project, n).is_some_and(|d| d.enabled == Some(false)) {
                        continue;
                    }
                    dropped.push((n, errs.as_slice().into()));
                }
            }
        }
        // A box whose candies have errors is not used either.
        for (n, errs) in candy_errors(o, &chosen) {
            chosen.retain(|c| *c != n);
            if let Some((key, _)) = o.resolution.boxes.get_key_value(&n) {
                dropped.push((key, errs.into()));
            }
        }
        dropped.sort_by(|a, b| a.0.cmp(b.0));
        if policy != Unresolved::Ignore {
            for (n, errs) in &dropped {
                let first = errs
                    .iter()
                    .find(|d| d.is_error())
                    .or(errs.first())
                    .map(|d| d.one_line(&o.project.sources))
                    .unwrap_or_else(|| "no reason recorded".into());
                let line = format!("box `{n}` does not resolve: {first}");
                match policy {
                    Unresolved::Fail => output::error(&line),
                    _ => {
                        let w = format!("warning: {line} (left out)");
                        output::note(&w);
                        warnings.push(w);
                    }
                }
            }
            if policy == Unresolved::Fail && !dropped.is_empty() {
                anyhow::bail!(
                    "{} of {} enabled boxes do not resolve (`charly box list` says why; \
                     --keep-going builds the rest)",
                    dropped.len(),
                    dropped.len() + chosen.len()
                );
            }
        }
        if chosen.is_empty() {
            output::note("no boxes: the project defines no enabled box that resolves");
        }
        return Ok((chosen, warnings));
    }
    for n in names {
        resolved(o, n)?;
    }
    Ok((names.to_vec(), warnings))
}

/// Test hook (test builds only, `CHARLY_JOURNAL_RACY_MS`): how recent an
/// input may be and still be trusted by stat, for the journal and the
/// loader's directory listings (tests shrink it instead of waiting out the
/// clock). `None` in a release build.
pub(crate) fn racy_ns_for_tests() -> Option<i64> {
    #[cfg(feature = "testing")]
    if let Some(ms) = std::env::var("CHARLY_JOURNAL_RACY_MS")
        .ok()
        .and_then(|v| v.parse::<i64>().ok())
    {
        return Some(ms.saturating_mul(1_000_000));
    }
    None
}
