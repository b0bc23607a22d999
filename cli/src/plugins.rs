//! Plugins for one command: the words the selected boxes' candies use,
//! their plugins' contracts set on the project before any plan compiles,
//! and (for commands that build) the plugins' fragments the graph keys and
//! renders with. A project whose boxes use no plugin word starts nothing.

use crate::project::Opened;
use charly_deploy::plugin_host::PluginHost;
use charly_rules::plan::{HostContext, build_box_plans};
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// How long one plugin call may wait for the plugin.
const CALL_TIMEOUT: Duration = Duration::from_secs(300);

/// `boxes` and the boxes they are built on, resolved.
fn with_bases<'a>(
    o: &'a Opened,
    boxes: &'a [String],
) -> impl Iterator<Item = &'a charly_rules::resolve::ResolvedBox> {
    let mut all: BTreeSet<&str> = boxes.iter().map(String::as_str).collect();
    for name in boxes {
        if let Some(b) = o.resolution.get(name) {
            all.extend(b.base_chain.iter().map(String::as_str));
        }
    }
    all.into_iter().filter_map(|n| o.resolution.get(n))
}

/// The plugin words the candies of `boxes` (and of the boxes they are
/// built on) use, plus those of `extra` candies.
pub fn words_used(o: &Opened, boxes: &[String], extra: &[String]) -> BTreeSet<String> {
    // Most projects use no plugin at all: one pass over the candies says
    // so, without gathering every box's candies first.
    let uses_plugin =
        |c: &charly_rules::load::CandyEntry| c.def.task.iter().any(|t| t.plugin.is_some());
    if !o.project.candies.values().any(uses_plugin) {
        return BTreeSet::new();
    }
    let mut candies: BTreeSet<&str> = extra.iter().map(String::as_str).collect();
    for b in with_bases(o, boxes) {
        candies.extend(b.candies.iter().map(String::as_str));
    }
    candies
        .into_iter()
        .filter_map(|k| o.project.candies.get(k))
        .flat_map(|c| c.def.task.iter())
        .filter_map(|t| t.plugin.as_ref().map(|w| w.value.clone()))
        .collect()
}

/// Starts charly's plugin host for the plugin words `boxes` use and sets
/// their contracts on the project; `None` when they use none. A plugin
/// that cannot be found or asked is an error naming it.
pub fn host_for(
    o: &mut Opened,
    store_dir: &Path,
    boxes: &[String],
    extra: &[String],
) -> anyhow::Result<Option<Arc<PluginHost>>> {
    let words = words_used(o, boxes, extra);
    if words.is_empty() {
        return Ok(None);
    }
    // A word no candy declares is a load error: shown where it is written.
    let undeclared: Vec<String> = words
        .iter()
        .filter(|w| o.project.plugins.for_task(w).is_none())
        .map(|w| format!("uses plugin `{w}`,"))
        .collect();
    if !undeclared.is_empty() {
        let located: Vec<_> = o
            .project
            .diags
            .errors()
            .filter(|d| undeclared.iter().any(|u| d.message.contains(u.as_str())))
            .cloned()
            .collect();
        crate::output::diagnostics(located.iter(), &o.project.sources);
        anyhow::bail!("the boxes use plugin words no candy declares (see above)");
    }
    let sink: charly_plugin::LineSink =
        Arc::new(|line: &str| crate::output::note(&format!("plugin {line}")));
    let host = PluginHost::new(&o.project, store_dir, Some(sink), CALL_TIMEOUT);
    let (contracts, problems) = host.contracts(words.iter().map(String::as_str));
    if let Some(first) = problems.first() {
        anyhow::bail!("{first}");
    }
    o.project.plugins.contracts = contracts;
    Ok(Some(Arc::new(host)))
}

/// [`host_for`], then the build leg: every plugin step of `boxes`'
/// images asked for its fragment (answers cached in the store), for the
/// graph to key and render with. Returns whether any plugin is in play.
pub fn prepare_build(o: &mut Opened, store_dir: &Path, boxes: &[String]) -> anyhow::Result<bool> {
    let Some(host) = host_for(o, store_dir, boxes, &[])? else {
        return Ok(false);
    };
    let mut plans = Vec::new();
    for b in with_bases(o, boxes) {
        let mut ps = build_box_plans(&o.project, b, &HostContext::default())?;
        for p in &mut ps {
            p.resolve_home(&b.user.home);
        }
        plans.extend(ps);
    }
    let refs: Vec<_> = plans.iter().collect();
    o.plugin_build = host.build_inputs(&refs).map_err(anyhow::Error::msg)?;
    Ok(true)
}
