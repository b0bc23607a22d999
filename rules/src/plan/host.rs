//! A box seen from the host it is deployed on: a host deploy installs with
//! the host's package manager, so a box made for another distro is either
//! refused before any change (naming both), or, when every candy that
//! installs packages has a section for the host's distro, compiled with
//! that section (the seed's `HostContext`: the target carries its distro
//! and version).

use crate::cascade;
use crate::project::Project;
use crate::resolve::{ResolvedBox, effective_distro, expand_tags, pick_distro};

/// What a host says it runs (`/etc/os-release`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostOs {
    /// `ID` (`debian`, `fedora`, `ubuntu`).
    pub id: String,
    /// `VERSION_ID` (`12`, `43`), when given.
    pub version_id: Option<String>,
    /// `ID_LIKE`, in order (`ubuntu` → `debian`).
    pub id_like: Vec<String>,
}

impl HostOs {
    /// Parses os-release text (shell-like `KEY=value` lines, values maybe
    /// quoted). None without an `ID`.
    pub fn parse(text: &str) -> Option<HostOs> {
        let mut os = HostOs::default();
        for line in text.lines() {
            let Some((k, v)) = line.trim().split_once('=') else {
                continue;
            };
            let v = v.trim();
            let v = v
                .strip_prefix('"')
                .and_then(|x| x.strip_suffix('"'))
                .or_else(|| v.strip_prefix('\'').and_then(|x| x.strip_suffix('\'')))
                .unwrap_or(v)
                .to_string();
            match k.trim() {
                "ID" => os.id = v.to_ascii_lowercase(),
                "VERSION_ID" if !v.is_empty() => os.version_id = Some(v),
                "ID_LIKE" => {
                    os.id_like = v.split_whitespace().map(str::to_ascii_lowercase).collect();
                }
                _ => {}
            }
        }
        (!os.id.is_empty()).then_some(os)
    }

    /// `debian 12`, for messages.
    pub fn describe(&self) -> String {
        match &self.version_id {
            Some(v) => format!("{} {v}", self.id),
            None => self.id.clone(),
        }
    }

    /// The distro tags of the host, most specific first (`debian:12`,
    /// `debian`, then what it is like).
    pub fn tags(&self) -> Vec<String> {
        let mut t = Vec::new();
        if let Some(v) = &self.version_id {
            t.push(format!("{}:{v}", self.id));
        }
        t.push(self.id.clone());
        t.extend(self.id_like.iter().cloned());
        t
    }
}

/// Why a box cannot be deployed on a host.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HostMismatch {
    /// The host's distro is unknown to the project's vocabulary.
    #[error(
        "box {box_name} is made for {box_distro}; the target runs {host}, which this project's \
         vocabulary does not know (no `distro: {host_id}`), so its packages cannot be installed there"
    )]
    UnknownDistro {
        /// The box.
        box_name: String,
        /// The box's distro and format.
        box_distro: String,
        /// The host, described.
        host: String,
        /// The host's `ID`.
        host_id: String,
    },
    /// Candies install packages (or local packages) only for the box's
    /// distro.
    #[error(
        "box {box_name} is made for {box_distro}; the target runs {host_distro}, and these \
         candies install packages with no section for it: {}",
        candies.join(", ")
    )]
    NoSection {
        /// The box.
        box_name: String,
        /// The box's distro and format.
        box_distro: String,
        /// The host's distro and format.
        host_distro: String,
        /// The candies without a section for the host.
        candies: Vec<String>,
    },
}

/// The box as compiled for `host`: unchanged when the host runs the box's
/// distro; else with the host's distro, tags and formats, when every
/// candy of the box that installs packages has a section for the host's
/// distro (or a distro-independent package list). Refused otherwise,
/// before anything is changed.
pub fn for_host(
    p: &Project,
    b: &ResolvedBox,
    add: &[String],
    host: &HostOs,
) -> Result<ResolvedBox, HostMismatch> {
    let vocab = &p.ns(b.ns).vocab;
    let box_distro = format!(
        "{} ({} packages)",
        b.distro_def.as_deref().unwrap_or("an unknown distro"),
        b.pkg().unwrap_or("no")
    );
    let host_tags = expand_tags(vocab, &host.tags());
    let Some(host_distro) = pick_distro(vocab, &host_tags) else {
        if !installs_packages(p, b, add) {
            return Ok(b.clone());
        }
        return Err(HostMismatch::UnknownDistro {
            box_name: b.name.clone(),
            box_distro,
            host: host.describe(),
            host_id: host.id.clone(),
        });
    };
    if b.distro_def.as_deref() == Some(host_distro.as_str()) {
        return Ok(b.clone());
    }
    // The host's primary formats, then the secondary ones (aur) the box
    // uses too.
    let mut formats: Vec<(bool, String)> = effective_distro(vocab, &host_distro)
        .map(|d| {
            d.format
                .0
                .iter()
                .filter(|(k, f)| !f.secondary || b.formats.contains(&k.value))
                .map(|(k, f)| (f.secondary, k.value.clone()))
                .collect()
        })
        .unwrap_or_default();
    formats.sort_by_key(|(secondary, _)| *secondary);
    let formats: Vec<String> = formats.into_iter().map(|(_, f)| f).collect();
    let host_chain = cascade::tag_chain(&host_tags, formats.first().map(String::as_str));
    let box_chain = b.tag_chain();
    let missing: Vec<String> = b
        .candies
        .iter()
        .chain(add)
        .filter(|k| p.candies.contains_key(*k))
        .filter(|k| {
            let def = &p.candies[*k].def;
            let here = cascade::resolve(def, &box_chain);
            let packages = here.matched
                && !here.packages.is_empty()
                && !cascade::resolve(def, &host_chain).matched;
            // A local package built for the box's format only.
            let local = def.localpkg.as_ref().is_some_and(|m| {
                let has = |fs: &[String]| m.value.0.keys().any(|f| fs.iter().any(|x| x == f));
                has(&b.formats) && !has(&formats)
            });
            packages || local
        })
        .map(|k| p.candies[k].name.clone())
        .collect();
    if !missing.is_empty() {
        return Err(HostMismatch::NoSection {
            box_name: b.name.clone(),
            box_distro,
            host_distro: format!(
                "{} ({} packages)",
                host.describe(),
                formats.first().map_or("no", String::as_str)
            ),
            candies: missing,
        });
    }
    let mut hb = b.clone();
    hb.distro = host.tags();
    hb.tags = host_tags;
    hb.formats = formats;
    hb.distro_def = Some(host_distro);
    Ok(hb)
}

/// Whether any candy of the box (or added to it) installs packages on the
/// box's distro.
fn installs_packages(p: &Project, b: &ResolvedBox, add: &[String]) -> bool {
    let chain = b.tag_chain();
    b.candies.iter().chain(add).any(|k| {
        p.candies.get(k).is_some_and(|c| {
            let set = cascade::resolve(&c.def, &chain);
            set.matched && !set.packages.is_empty()
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_release_parsing() {
        let os = HostOs::parse(
            "PRETTY_NAME=\"Ubuntu 24.04 LTS\"\nID=ubuntu\nID_LIKE=debian\nVERSION_ID=\"24.04\"\n",
        )
        .expect("parse");
        assert_eq!(os.tags(), ["ubuntu:24.04", "ubuntu", "debian"]);
        assert_eq!(os.describe(), "ubuntu 24.04");
        let arch = HostOs::parse("NAME='Arch Linux'\nID=arch\n").expect("arch");
        assert_eq!((arch.id.as_str(), arch.version_id), ("arch", None));
        assert_eq!(HostOs::parse("NAME=x\n"), None);
    }
}
