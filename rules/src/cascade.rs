//! The distro cascade: which packages (and repos, options, …) a candy installs
//! on a box, given the box's tag chain.
//!
//! This is the one resolution function every consumer uses (Containerfile,
//! InstallPlan, labels, deploy), so they can never disagree.
//!
//! * A box's **tag chain** is its expanded distro list, most specific first,
//!   plus its primary format: `[ubuntu:24.04, ubuntu, deb]`.
//! * Section keys are matched after normalisation: `a,b` feeds both parts;
//!   in a part without `:` the first `-` becomes `:` (`debian-13` →
//!   `debian:13`); `rpm`/`deb`/`pac` match through the format.
//! * Walking the chain from least to most specific, packages are the base
//!   `package:` list followed by each matching section's list, de-duplicated
//!   in first-seen order. Extras (repo, copr, option, exclude, module, keys)
//!   come from the most specific matching section **that defines them**
//!   (charly differs from the original here on purpose: a more specific
//!   section never erases a broader one's repo by omitting it).
//! * Between keys that map to the same tag, the later key in sorted order wins.
//! * `aur:` blocks under any key feed one candy-wide AUR section.

use crate::model::Candy;
use crate::model::candy::DistroSection;
use crate::yaml::{OrderedMap, Spanned};
use serde::Serialize;

/// What a candy installs for one box and format.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PackageSet {
    /// Whether the base list or any section applied (else: nothing to install).
    pub matched: bool,
    /// Packages, in order.
    pub packages: Vec<String>,
    /// Repositories (maps of strings).
    pub repos: Vec<OrderedMap<String>>,
    /// COPR projects.
    pub copr: Vec<String>,
    /// Installer options.
    pub options: Vec<String>,
    /// Excluded packages.
    pub exclude: Vec<String>,
    /// Modules.
    pub modules: Vec<String>,
    /// Signing keys.
    pub keys: Vec<String>,
    /// The section keys that matched, least specific first.
    pub sections: Vec<String>,
}

/// Candy-wide AUR packages.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct AurSet {
    /// AUR package names.
    pub packages: Vec<String>,
    /// yay options.
    pub options: Vec<String>,
}

/// Splits and normalises a section key into the tags it feeds.
pub fn section_tags(key: &str) -> Vec<String> {
    key.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            if p.contains(':') {
                p.to_string()
            } else {
                p.replacen('-', ":", 1)
            }
        })
        .collect()
}

/// The tag chain of a box: expanded distro tags (most specific first) plus the format.
pub fn tag_chain(distro_tags: &[String], format: Option<&str>) -> Vec<String> {
    let mut chain: Vec<String> = Vec::new();
    for t in distro_tags {
        if !chain.contains(t) {
            chain.push(t.clone());
        }
    }
    if let Some(f) = format
        && !chain.iter().any(|t| t == f)
    {
        chain.push(f.to_string());
    }
    chain
}

/// Resolves a candy's package surface for a tag chain (most specific first).
pub fn resolve(candy: &Candy, chain: &[String]) -> PackageSet {
    let mut out = PackageSet::default();
    for p in &candy.package {
        push_unique(&mut out.packages, &p.name.value);
    }
    out.matched = !candy.package.is_empty();

    // Sections sorted by key; each contributes to every tag it names.
    let mut sections: Vec<(&Spanned<String>, &DistroSection)> = candy.distro.iter().collect();
    sections.sort_by(|a, b| a.0.value.cmp(&b.0.value));

    // Least specific first.
    for tag in chain.iter().rev() {
        for (key, sec) in &sections {
            if !section_tags(&key.value).iter().any(|t| t == tag) {
                continue;
            }
            out.matched = true;
            out.sections.push(key.value.clone());
            for p in &sec.package {
                push_unique(&mut out.packages, &p.name.value);
            }
            // More specific (later) sections override what they define.
            if !sec.repo.is_empty() {
                out.repos = sec.repo.iter().map(|r| r.value.clone()).collect();
            }
            if !sec.copr.is_empty() {
                out.copr.clone_from(&sec.copr);
            }
            if !sec.option.is_empty() {
                out.options.clone_from(&sec.option);
            }
            if !sec.exclude.is_empty() {
                out.exclude.clone_from(&sec.exclude);
            }
            if !sec.module.is_empty() {
                out.modules.clone_from(&sec.module);
            }
            if !sec.keys.is_empty() {
                out.keys.clone_from(&sec.keys);
            }
        }
    }
    out
}

/// The candy-wide AUR section (union over every key, in key order).
pub fn aur(candy: &Candy) -> AurSet {
    let mut out = AurSet::default();
    let mut sections: Vec<_> = candy.distro.iter().collect();
    sections.sort_by(|a, b| a.0.value.cmp(&b.0.value));
    for (_, sec) in sections {
        if let Some(a) = &sec.aur {
            for p in &a.package {
                push_unique(&mut out.packages, &p.name.value);
            }
            for o in &a.option {
                push_unique(&mut out.options, o);
            }
        }
    }
    out
}

fn push_unique(list: &mut Vec<String>, v: &str) {
    if !list.iter().any(|x| x == v) {
        list.push(v.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::FileId;
    use crate::yaml::{from_node, parse_stream};

    fn candy(text: &str) -> Candy {
        let docs = parse_stream(FileId(0), text).expect("yaml");
        let mut w = Vec::new();
        let c = from_node(&docs[0], &mut w).expect("candy");
        assert!(w.is_empty(), "{w:?}");
        c
    }

    fn chain(tags: &[&str], f: &str) -> Vec<String> {
        tag_chain(
            &tags.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            Some(f),
        )
    }

    #[test]
    fn key_normalisation() {
        assert_eq!(section_tags("debian-13"), vec!["debian:13"]);
        assert_eq!(section_tags("ubuntu:24.04"), vec!["ubuntu:24.04"]);
        assert_eq!(section_tags("debian,ubuntu"), vec!["debian", "ubuntu"]);
        assert_eq!(section_tags("ubuntu-24.04"), vec!["ubuntu:24.04"]);
    }

    #[test]
    fn packages_union_least_specific_first() {
        let c = candy(
            "package: [sudo]\ndistro:\n  ubuntu:\n    package: [openssh-server]\n  ubuntu:24.04:\n    package: [extra, sudo]\n  deb:\n    package: [fmt-pkg]\n  fedora:\n    package: [nope]\n",
        );
        let s = resolve(&c, &chain(&["ubuntu:24.04", "ubuntu"], "deb"));
        assert!(s.matched);
        assert_eq!(
            s.packages,
            vec!["sudo", "fmt-pkg", "openssh-server", "extra"]
        );
    }

    #[test]
    fn most_specific_defining_section_wins_extras() {
        let c = candy(
            "distro:\n  debian:\n    package: [a]\n    repo:\n      - {name: r1, url: http://x}\n    option: [--o1]\n  debian-13:\n    package: [b]\n    option: [--o2]\n",
        );
        let s = resolve(&c, &chain(&["debian:13", "debian"], "deb"));
        assert_eq!(s.packages, vec!["a", "b"]);
        assert_eq!(s.options, vec!["--o2"]);
        // debian:13 defines no repo, so debian's survives (deliberate difference).
        assert_eq!(s.repos.len(), 1);
        assert_eq!(s.repos[0].get("name").map(String::as_str), Some("r1"));
    }

    #[test]
    fn comma_keys_feed_both_and_no_match_is_nothing() {
        let c = candy("distro:\n  debian,ubuntu:\n    package: [x]\n");
        assert_eq!(resolve(&c, &chain(&["ubuntu"], "deb")).packages, vec!["x"]);
        assert_eq!(resolve(&c, &chain(&["debian"], "deb")).packages, vec!["x"]);
        let none = resolve(&c, &chain(&["fedora"], "rpm"));
        assert!(!none.matched);
        assert!(none.packages.is_empty());
    }

    #[test]
    fn aur_from_any_key() {
        let c = candy(
            "distro:\n  arch:\n    package: [a]\n    aur:\n      package: [google-chrome]\n  pac:\n    aur:\n      package: [yay-bin]\n",
        );
        assert_eq!(aur(&c).packages, vec!["google-chrome", "yay-bin"]);
    }
}
