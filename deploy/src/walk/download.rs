//! `download` tasks on hosts: the file is fetched and unpacked into a
//! private staging directory on the target first, so that what it will
//! put where is known before anything at the destination changes; then
//! every new path is recorded for removal and every file it replaces is
//! backed up in the ledger, and only then is the tree copied into place.
//! An installer script (`extract: sh`) runs like a `cmd` task.

use super::apply::op_env;
use super::{R, StepCx, title};
use crate::host::{Cmd, PathKind, parent};
use crate::ledger::{Fact, Undo};
use charly_rules::plan::{InstallStep, OpStep, ReverseKind, Scope};
use charly_rules::sh;
use std::collections::BTreeMap;

/// The archive kind of a download (see [`OpStep::download_kind`]: the
/// IR's reverse ops follow the same rule).
pub(super) fn download_kind(op: &OpStep) -> String {
    op.download_kind()
}

/// One path the download unpacked, relative to its destination.
#[derive(Debug, PartialEq)]
struct Unpacked {
    /// `./a/b` as `find` prints it.
    rel: String,
    /// `f`, `d` or `l`.
    kind: char,
    mode: u32,
    /// Symlink target.
    link: String,
}

/// Parses `find -printf '%y\0%m\0%p\0%l\0'`.
fn parse_listing(out: &[u8]) -> R<Vec<Unpacked>> {
    let fields: Vec<&[u8]> = out.split(|b| *b == 0).collect();
    // A trailing NUL leaves one empty field at the end.
    let fields = match fields.split_last() {
        Some(([], rest)) => rest,
        _ => &fields[..],
    };
    if fields.len() % 4 != 0 {
        return Err("unreadable listing of the unpacked download".into());
    }
    fields
        .chunks(4)
        .map(|c| {
            let text = |b: &[u8]| {
                String::from_utf8(b.to_vec())
                    .map_err(|_| "a downloaded path is not UTF-8 text".to_string())
            };
            let rel = text(c[2])?;
            if !rel.starts_with("./") || rel.split('/').any(|p| p == "..") {
                return Err(format!("unexpected path {rel:?} in the download"));
            }
            Ok(Unpacked {
                kind: text(c[0])?.chars().next().unwrap_or('?'),
                mode: u32::from_str_radix(&text(c[1])?, 8).unwrap_or(0o644),
                rel,
                link: text(c[3])?,
            })
        })
        .collect()
}

/// Parses `sha256sum -z` output: `HASH  ./path\0`.
fn parse_sums(out: &[u8]) -> BTreeMap<String, String> {
    out.split(|b| *b == 0)
        .filter_map(|rec| {
            let rec = std::str::from_utf8(rec).ok()?;
            let (hash, path) = rec.split_once("  ")?;
            Some((path.to_string(), hash.to_string()))
        })
        .collect()
}

/// The script that fetches `op`'s URL into `stage` and unpacks it into
/// `stage/tree` (an archive) or `stage/file` (a plain file), then applies
/// the task's mode to what it unpacked.
fn fetch_script(op: &OpStep, kind: &str, stage: &str) -> R<String> {
    if op.value.contains("$(") || op.value.contains('`') {
        return Err("a download URL with command substitution is not run on hosts".into());
    }
    let strip = op
        .strip_components
        .map(|n| format!(" --strip-components={n}"))
        .unwrap_or_default();
    let include: String = op
        .include
        .iter()
        .map(|x| format!(" {}", sh::quote(x)))
        .collect();
    let unpack = match kind {
        "tar.gz" => format!("tar --no-same-owner -xzf archive{strip} -C tree{include}"),
        "tar.xz" => format!("tar --no-same-owner -xJf archive{strip} -C tree{include}"),
        "tar.zst" => format!("tar --no-same-owner --zstd -xf archive{strip} -C tree{include}"),
        "zip" => "unzip -q -o archive -d tree".to_string(),
        "none" => "mv archive file".to_string(),
        other => return Err(format!("unknown archive kind `{other}`")),
    };
    let mode = match (&op.mode, kind) {
        (Some(m), "none") => format!("\nchmod {} file", sh::quote_min(m)),
        (Some(m), _) => format!(
            "\nfind tree -mindepth 1 ! -type l -exec chmod {} {{}} +",
            sh::quote_min(m)
        ),
        (None, _) => String::new(),
    };
    // Variables expand as in the image build (`${BUILD_ARCH}`, the candy's
    // vars); command substitution was refused above.
    Ok(format!(
        "{}set -e\ncd {}\nmkdir tree\n__u=\"{}\"\ncurl -fsSL \"$__u\" -o archive\n{unpack}{mode}\n",
        sh::ARCH_PREAMBLE,
        sh::quote_min(stage),
        op.value.replace('\\', "\\\\").replace('"', "\\\"")
    ))
}

pub(super) fn download_step(
    cx: &mut StepCx<'_>,
    s: &InstallStep,
    op: &OpStep,
    bin_dirs: &[String],
) -> R<()> {
    let sys = s.scope == Scope::System;
    let kind = download_kind(op);
    // What it places (a file at `to`, or what an archive unpacked there).
    cx.realize(|r| {
        matches!(
            r.kind,
            ReverseKind::RemoveArtifactFiles | ReverseKind::RmFileSystem | ReverseKind::RmFileUser
        )
    });
    let as_user = |mut c: Cmd, cx: &StepCx<'_>| {
        c.env = op_env(cx.user, bin_dirs, op);
        c.privileged = sys;
        if !sys {
            c.as_user = Some(cx.user.name.clone());
        }
        c
    };
    if op.value.contains("$(") || op.value.contains('`') {
        return Err("a download URL with command substitution is not run on hosts".into());
    }
    if kind == "sh" {
        if !cx.dry() {
            cx.undo(
                &Undo::Note {
                    text: format!(
                        "`{}` ran a downloaded installer; what it changed is not undone",
                        title(s)
                    ),
                },
                &[],
            )?;
        }
        let c = as_user(
            Cmd::sh(format!(
                "{}set -e\n__u=\"{}\"\n__c=$(mktemp)\ntrap 'rm -f \"$__c\"' EXIT\ncurl -fsSL \"$__u\" -o \"$__c\"\nsh \"$__c\"",
                sh::ARCH_PREAMBLE,
                op.value.replace('\\', "\\\\").replace('"', "\\\"")
            )),
            cx,
        );
        cx.run(c, "installer")?;
        cx.changed();
        return Ok(());
    }
    let to = op
        .to
        .as_deref()
        .ok_or("download without `to`")?
        .trim_end_matches('/');
    let to = if to.is_empty() { "/" } else { to };
    // The directory the download lands in.
    let dest_dir = if kind == "none" {
        parent(to).unwrap_or("/").to_string()
    } else {
        to.to_string()
    };
    cx.ensure_dir(&dest_dir, 0o755, sys)?;
    if !cx.dry() {
        cx.facts.pop(); // the directory is not a fact of this step
    }
    cx.actions
        .push(format!("download {} ({kind}) into {to}", op.value));
    if cx.dry() {
        return Ok(());
    }
    let stage = cx.run(
        as_user(Cmd::sh("mktemp -d /tmp/charly-dl.XXXXXXXX"), cx),
        "make a staging directory",
    )?;
    let stage = stage.trim().to_string();
    if !stage.starts_with("/tmp/charly-dl.") || stage.contains(['\n', '\'']) {
        return Err(format!("mktemp printed {stage:?}"));
    }
    let res = place(cx, op, &kind, &stage, to, sys, &as_user);
    // The staging directory goes whatever happened.
    let _ = cx.host.run(&as_user(
        Cmd::sh(format!("rm -rf {}", sh::quote_min(&stage))),
        cx,
    ));
    res
}

/// Fetches into `stage`, records what placing it changes, places it.
fn place(
    cx: &mut StepCx<'_>,
    op: &OpStep,
    kind: &str,
    stage: &str,
    to: &str,
    sys: bool,
    as_user: &dyn Fn(Cmd, &StepCx<'_>) -> Cmd,
) -> R<()> {
    cx.run(
        as_user(Cmd::sh(fetch_script(op, kind, stage)?), cx),
        &format!("download {}", op.value),
    )?;
    let src = if kind == "none" { "file" } else { "tree" };
    let raw = |cx: &mut StepCx<'_>, script: String| -> R<Vec<u8>> {
        let c = as_user(Cmd::sh(script), cx);
        let out = cx.host.run(&c).map_err(|e| e.to_string())?;
        if !out.ok() {
            return Err(format!(
                "list the download: exit {}: {}",
                out.status,
                out.stderr_tail()
            ));
        }
        Ok(out.stdout)
    };
    let q_src = sh::quote_min(&format!("{stage}/{src}"));
    let (dir, find) = if kind == "none" {
        (stage.to_string(), "find ./file")
    } else {
        (format!("{stage}/tree"), "find . -mindepth 1")
    };
    let q_dir = sh::quote_min(&dir);
    let listing = raw(
        cx,
        format!("cd {q_dir} && {find} -printf '%y\\0%m\\0%p\\0%l\\0'"),
    )?;
    let sums = raw(
        cx,
        format!("cd {q_dir} && {find} -type f -print0 | xargs -0 -r sha256sum -z"),
    )?;
    let sums = parse_sums(&sums);
    let entries = parse_listing(&listing)?;
    if entries.is_empty() {
        return Err("the download unpacked nothing".into());
    }
    let dest = |rel: &str| -> String {
        if kind == "none" {
            to.to_string()
        } else if to == "/" {
            rel[1..].to_string()
        } else {
            format!("{to}{}", &rel[1..])
        }
    };
    let paths: Vec<String> = entries.iter().map(|e| dest(&e.rel)).collect();
    let stats = cx.host.stat(&paths, false).map_err(|e| e.to_string())?;
    let mut created = Vec::new();
    for ((p, st), e) in paths.iter().zip(&stats).zip(&entries) {
        match (st.as_ref().map(|s| &s.kind), e.kind) {
            (None, _) => created.push(p.clone()),
            (Some(PathKind::Dir), 'd') => {}
            (Some(PathKind::File { .. } | PathKind::Symlink { .. }), 'f' | 'l') => {
                cx.record_replace(p, sys)?;
            }
            (Some(k), _) => {
                return Err(format!(
                    "{p} exists as {k:?}; the download has another kind there"
                ));
            }
        }
    }
    cx.undo(
        &Undo::RemoveTree {
            paths: created,
            privileged: sys,
        },
        &[],
    )?;
    let real_to = cx.host.real(to);
    // `cp` follows symlinks already in the tree: on a rooted target the
    // destination must still resolve inside the root.
    if let Some(root) = cx.host.root() {
        let dir = if kind == "none" {
            parent(&real_to).unwrap_or("/").to_string()
        } else {
            real_to.clone()
        };
        let inside = match (std::fs::canonicalize(root), std::fs::canonicalize(&dir)) {
            (Ok(r), Ok(d)) => d.starts_with(r),
            _ => false,
        };
        if !inside {
            return Err(format!(
                "{to} resolves outside the root {root} (a symlink on the way); not written"
            ));
        }
    }
    let copy = if kind == "none" {
        format!(
            "cp -p --remove-destination {q_src} {}",
            sh::quote_min(&real_to)
        )
    } else {
        format!(
            "cp -R -p --remove-destination {}/. {}/",
            q_src,
            sh::quote_min(&real_to)
        )
    };
    cx.run(
        as_user(Cmd::sh(copy), cx),
        &format!("place the download in {to}"),
    )?;
    for (p, e) in paths.into_iter().zip(entries) {
        cx.facts.push(match e.kind {
            'd' => Fact::Dir { path: p },
            'l' => Fact::Symlink {
                path: p,
                target: e.link,
            },
            _ => Fact::File {
                sha256: sums.get(&e.rel).cloned().unwrap_or_default(),
                path: p,
                mode: e.mode,
            },
        });
    }
    cx.changed();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_and_sums_parse() {
        let out =
            b"d\x00755\x00./bin\x00\x00f\x00644\x00./bin/a b\x00\x00l\x00777\x00./x\x00bin/a b\x00";
        let l = parse_listing(out).expect("parses");
        assert_eq!(l.len(), 3);
        assert_eq!(
            (l[1].kind, l[1].mode, l[1].rel.as_str()),
            ('f', 0o644, "./bin/a b")
        );
        assert_eq!(l[2].link, "bin/a b");
        assert!(parse_listing(b"f\x00644\x00../x\x00\x00").is_err());
        assert!(parse_listing(b"f\x00644\x00").is_err());
        let sums = parse_sums(b"abc  ./bin/a b\x00def  ./c\x00");
        assert_eq!(sums.get("./bin/a b").map(String::as_str), Some("abc"));
        assert_eq!(sums.len(), 2);
    }

    #[test]
    fn urls_expand_variables_but_never_run_commands() {
        let mut op = OpStep {
            verb: "download".into(),
            value: "https://x/${BUILD_ARCH}/a\"b.tgz".into(),
            ..OpStep::default()
        };
        let s = fetch_script(&op, "tar.gz", "/tmp/charly-dl.1").expect("script");
        assert!(
            s.contains("__u=\"https://x/${BUILD_ARCH}/a\\\"b.tgz\""),
            "{s}"
        );
        op.value = "https://x/$(id)".into();
        assert!(fetch_script(&op, "none", "/tmp/charly-dl.1").is_err());
        op.value = "https://x/`id`".into();
        assert!(fetch_script(&op, "none", "/tmp/charly-dl.1").is_err());
    }
}
