//! `aur` builders on hosts: Arch packages built from the AUR, installed on
//! a pacman target.
//!
//! As in the seed, the packages are built on the machine that deploys,
//! never on the target: the box's aur builder stage (`makepkg` through yay
//! in the builder box's container, the vocabulary's `stage_template`) is
//! the build graph's builder node, so `charly box build` builds it once
//! per key and its artifact — the `*.pkg.tar.zst` files it stages in
//! `/tmp/aur-pkgs/` (`copy_artifact`) — is in the store. A host deploy
//! copies those files to a staging directory on the target, reads each
//! one's package name (`pacman -Qqp`), and installs them with `pacman -U`
//! under the packages step's ledger rules: the removal of the packages
//! that were not installed before (the step's `package-remove` reverse
//! op) is recorded first, and what the install pulled in with them is
//! removed with them.
//!
//! A target without pacman cannot install them: the walk is refused
//! before any change, naming the host's own package format
//! ([`refuse_without_pacman`]).

use super::apply::packages;
use super::{Artifacts, R, StepCx, WalkError, title};
use crate::host::{BASE_PATH, Cmd, FileAttrs, Host};
use crate::pkg;
use charly_rules::plan::{BuilderStep, InstallPlan, InstallStep, ReverseKind, StepData};
use charly_rules::sh;

/// Whether a file of the aur artifact is a package pacman installs.
fn is_package(name: &str) -> bool {
    name.contains(".pkg.tar.") && !name.ends_with(".sig")
}

/// Whether `s` is an aur builder step.
pub(super) fn is_aur(s: &InstallStep) -> bool {
    matches!(&s.data, StepData::Builder(b) if b.builder == "aur")
}

/// The package format a host installs, told by its package manager.
fn host_format(host: &mut dyn Host) -> Result<Option<(&'static str, &'static str)>, WalkError> {
    for (tool, format) in [
        ("pacman", "pac"),
        ("dpkg-query", "deb"),
        ("rpm", "rpm"),
        ("apk", "apk"),
    ] {
        if host.which(tool, BASE_PATH)?.is_some() {
            return Ok(Some((format, tool)));
        }
    }
    Ok(None)
}

/// Refuses, before any change, a walk whose aur steps would run on a host
/// without pacman, naming the steps and the host's package format.
pub(super) fn refuse_without_pacman(
    host: &mut dyn Host,
    plan: &InstallPlan,
    skip: &[Option<String>],
) -> Result<(), WalkError> {
    let steps: Vec<String> = plan
        .steps
        .iter()
        .enumerate()
        .filter(|(i, s)| skip[*i].is_none() && is_aur(s))
        .map(|(i, s)| format!("{i} {}", title(s)))
        .collect();
    if steps.is_empty() {
        return Ok(());
    }
    let found = host_format(host)?;
    if let Some(("pac", _)) = found {
        return Ok(());
    }
    let what = match found {
        Some((format, tool)) => format!("its packages are {format} packages ({tool})"),
        None => "it has no package manager charly knows (pacman, dpkg, rpm, apk)".into(),
    };
    Err(WalkError::Setup(format!(
        "{}: aur packages are Arch packages, installed with `pacman -U`, and this host has no \
         pacman: {what}. These steps need an Arch-family target:\n  {}",
        host.describe(),
        steps.join("\n  ")
    )))
}

/// Installs the aur packages of a builder step (see the module docs).
pub(super) fn aur_step(
    cx: &mut StepCx<'_>,
    s: &InstallStep,
    b: &BuilderStep,
    arts: &dyn Artifacts,
) -> R<()> {
    cx.realize(|r| r.kind == ReverseKind::PackageRemove);
    let tar = arts.builder_tar(&s.candy, &b.builder)?;
    let entries = charly_files::artifact::read_tar(&tar, "")
        .map_err(|e| format!("unreadable aur artifact tar: {e}"))?;
    let files: Vec<(String, Vec<u8>)> = entries
        .into_iter()
        .filter_map(|e| match e.kind {
            charly_files::artifact::Kind::File(data) => {
                let name = e.path.rsplit('/').next().unwrap_or_default().to_string();
                is_package(&name).then_some((name, data))
            }
            _ => None,
        })
        .collect();
    if files.is_empty() {
        return Err(format!(
            "the aur artifact of {} has no package files (*.pkg.tar.*); rebuild it with `charly box build`",
            s.candy
        ));
    }
    let dir = format!("/tmp/charly-aur-{}-{}", cx.bundle, cx.seq);
    cx.actions.push(format!(
        "upload {} aur package(s) to {dir}: {}",
        files.len(),
        files
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>()
            .join(" ")
    ));
    let real = |cx: &StepCx<'_>, p: &str| cx.host.real(p);
    let paths: Vec<String> = files
        .iter()
        .map(|(n, _)| real(cx, &format!("{dir}/{n}")))
        .collect();
    let install = format!(
        "pacman -U --noconfirm -- {}",
        paths
            .iter()
            .map(|p| sh::quote_min(p))
            .collect::<Vec<_>>()
            .join(" ")
    );
    if cx.dry() {
        cx.actions.push(install);
        return Ok(());
    }
    let staged = stage(cx, &dir, &files);
    let res = staged.and_then(|names| {
        // What the plan asked for is what the artifact holds.
        let missing: Vec<&String> = b.packages.iter().filter(|p| !names.contains(p)).collect();
        if !missing.is_empty() {
            return Err(format!(
                "the aur artifact of {} has no package {} (it has {})",
                s.candy,
                missing
                    .iter()
                    .map(|m| m.as_str())
                    .collect::<Vec<_>>()
                    .join(" "),
                names.join(" ")
            ));
        }
        packages(cx, "pac", &names, &install, None)
    });
    for (n, _) in &files {
        let _ = cx.host.remove(&format!("{dir}/{n}"), true);
    }
    let _ = cx.host.remove(&dir, true);
    res
}

/// Uploads the package files into `dir` on the target (made afresh) and
/// returns their package names, in file order.
fn stage(cx: &mut StepCx<'_>, dir: &str, files: &[(String, Vec<u8>)]) -> R<Vec<String>> {
    let attrs = |mode| FileAttrs {
        mode,
        owner: None,
        privileged: true,
    };
    let _ = cx.host.remove(dir, true);
    cx.host
        .mkdir(dir, &attrs(0o755))
        .map_err(|e| e.to_string())?;
    let mut names = Vec::new();
    for (n, data) in files {
        let p = format!("{dir}/{n}");
        cx.host
            .write_file(&p, data, &attrs(0o644))
            .map_err(|e| e.to_string())?;
        let script = pkg::name_script("pac", &cx.host.real(&p)).ok_or("no pac name script")?;
        let out = cx
            .host
            .run(&Cmd::sh(script).timeout(cx.timeout))
            .map_err(|e| e.to_string())?;
        let name = out.stdout_str().trim().to_string();
        if !out.ok() || !pkg::valid_name(&name) {
            return Err(format!(
                "cannot read the package name of {n}: {}",
                crate::host::shorten(&format!("{name} {}", out.stderr_tail()), 160)
            ));
        }
        names.push(name);
    }
    Ok(names)
}
