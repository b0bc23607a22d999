//! Third-party repositories on hosts (the prepare phase and `RepoChange`
//! steps, behind `--allow-repo-changes`). What a repository is made of on
//! disk is written as files through the step context, so `bundle del`
//! removes or restores exactly those; what only a command can change
//! (COPR, modules, PPAs) is undone by the inverse command.
//!
//! deb: a key (`key:` URL, fetched on the target; ASCII armour is removed
//! here, as `gpg --dearmor` would) in `signed_by` or
//! `/etc/apt/keyrings/<name>.gpg`, the source line in
//! `/etc/apt/sources.list.d/<name>.list` (the vocabulary's line: suite
//! `stable`, components `main` by default, none for a flat `/` suite),
//! `ppa:` through add-apt-repository; then `apt-get update`, which `del`
//! runs again after the files are gone. rpm: `/etc/yum.repos.d/<name>.repo`
//! (fetched when the URL is a `.repo` file, else written from the fields),
//! `dnf copr enable` / `dnf module enable` undone by `copr remove` /
//! `module reset`.

use super::reverse::undo_of;
use super::{R, StepCx};
use crate::host::Cmd;
use crate::ledger::Undo;
use base64::Engine as _;
use charly_rules::plan::{ReverseKind, ReverseOp, Scope};
use charly_rules::sh;
use std::collections::BTreeMap;

type Repo = BTreeMap<String, String>;

/// Why the repositories of a step cannot be set up on a host, if so.
pub(super) fn unsupported(format: &str, repos: &[Repo]) -> Option<String> {
    if !matches!(format, "deb" | "rpm") {
        return Some(format!(
            "{format} repositories are not set up on host targets yet"
        ));
    }
    if repos.iter().any(|r| r.contains_key("rpm")) {
        return Some("repository release packages (`rpm:`) are not installed on hosts yet".into());
    }
    None
}

/// A value written into a source line or repo file: one token.
fn token<'a>(r: &'a Repo, key: &str) -> R<Option<&'a str>> {
    match r.get(key).map(String::as_str) {
        Some(v) if v.is_empty() || v.chars().any(char::is_whitespace) => Err(format!(
            "repo `{}`: `{key}` must be one word, not {v:?}",
            r.get("name").map_or("?", String::as_str)
        )),
        v => Ok(v),
    }
}

fn name(r: &Repo) -> R<&str> {
    let n = r.get("name").map(String::as_str).unwrap_or_default();
    charly_rules::names::path_segment(n).map_err(|why| format!("repo name {n:?} {why}"))?;
    Ok(n)
}

/// The binary form of an OpenPGP key: armour removed, binary kept.
fn dearmor(data: &[u8]) -> R<Vec<u8>> {
    let text = match std::str::from_utf8(data) {
        Ok(t) if t.trim_start().starts_with("-----BEGIN PGP") => t,
        _ => return Ok(data.to_vec()),
    };
    let mut body = String::new();
    let mut in_block = false;
    let mut in_headers = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with("-----BEGIN PGP") {
            in_block = true;
            in_headers = true;
        } else if line.starts_with("-----END PGP") {
            break;
        } else if in_block && in_headers {
            // Armour headers (`Version: …`) end at the first blank line;
            // a block without headers starts right away.
            if line.is_empty() {
                in_headers = false;
            } else if !line.contains(": ") {
                in_headers = false;
                body.push_str(line);
            }
        } else if in_block && !line.starts_with('=') {
            body.push_str(line);
        }
    }
    base64::engine::general_purpose::STANDARD
        .decode(body.as_bytes())
        .map_err(|e| format!("the key is not valid ASCII-armoured OpenPGP: {e}"))
}

/// Fetches a URL on the target (curl, wget, or apt's own helper).
fn fetch(cx: &mut StepCx<'_>, url: &str) -> R<Vec<u8>> {
    let script = format!(
        "u={}\nif command -v curl >/dev/null 2>&1; then exec curl -fsSL \"$u\"\n\
         elif command -v wget >/dev/null 2>&1; then exec wget -qO- \"$u\"\n\
         else t=$(mktemp) || exit 1; /usr/lib/apt/apt-helper download-file \"$u\" \"$t\" >&2 && cat \"$t\"; r=$?; rm -f \"$t\"; exit $r; fi",
        sh::quote(url)
    );
    let c = Cmd::sh(script).timeout(cx.timeout);
    cx.actions.push(format!("fetch {url}"));
    if cx.dry() {
        return Ok(Vec::new());
    }
    let out = cx.host.run(&c).map_err(|e| e.to_string())?;
    if !out.ok() {
        return Err(format!(
            "fetch {url}: exit {}: {}",
            out.status,
            out.stderr_tail()
        ));
    }
    Ok(out.stdout)
}

/// Runs `script` as root, recording `undo` first.
fn run_undoable(cx: &mut StepCx<'_>, what: &str, script: String, undo: Undo) -> R<()> {
    if !cx.dry() {
        cx.undo(&undo, &[])?;
    }
    cx.run(Cmd::sh(script).privileged(true), what)?;
    cx.changed();
    Ok(())
}

/// Whether `o` is the reverse op of repository `name`'s files.
fn repo_file_op(o: &ReverseOp, name: &str) -> bool {
    o.kind == ReverseKind::RemoveRepoFile && o.targets.iter().any(|t| t == name)
}

/// The source line of a deb repository.
fn deb_line(r: &Repo, keyring: Option<&str>) -> R<Option<String>> {
    let Some(url) = token(r, "url")? else {
        return Ok(None);
    };
    let suite = token(r, "suite")?.unwrap_or("stable");
    let components = match (suite, r.get("components")) {
        ("/", _) => String::new(),
        (_, Some(c)) if !c.trim().is_empty() => {
            format!(" {}", c.split_whitespace().collect::<Vec<_>>().join(" "))
        }
        _ => " main".into(),
    };
    let opts = keyring
        .map(|k| format!("[signed-by={k}] "))
        .unwrap_or_default();
    Ok(Some(format!("deb {opts}{url} {suite}{components}\n")))
}

/// The `.repo` file of an rpm repository given by its base URL.
fn rpm_repo_file(r: &Repo, name: &str, url: &str) -> R<String> {
    let gpgcheck = if r.get("gpgcheck").map(String::as_str) == Some("false") {
        0
    } else {
        1
    };
    let mut text =
        format!("[{name}]\nname={name}\nbaseurl={url}\nenabled=1\ngpgcheck={gpgcheck}\n");
    if let Some(k) = token(r, "gpgkey")? {
        text.push_str(&format!("gpgkey={k}\n"));
    }
    Ok(text)
}

pub(super) fn repo_step(
    cx: &mut StepCx<'_>,
    format: &str,
    repos: &[Repo],
    copr: &[String],
    modules: &[String],
) -> R<()> {
    if let Some(why) = unsupported(format, repos) {
        return Err(why);
    }
    match format {
        "deb" => {
            if !cx.dry() {
                // Recorded first, so `del` refreshes the index last, after
                // the repository's files are gone.
                cx.undo_incidental(&Undo::root_run("apt-get update", "apt-get update -qq"), &[])?;
            }
            for r in repos {
                let n = name(r)?;
                // The repository's files (key, source line) and its PPA are
                // what the step's `remove-repo-file <name>` undoes.
                cx.realize(|o| repo_file_op(o, n));
                let keyring = match (r.get("key"), r.get("signed_by")) {
                    (Some(_), Some(p)) | (None, Some(p)) => Some(p.clone()),
                    (Some(_), None) => Some(format!("/etc/apt/keyrings/{n}.gpg")),
                    (None, None) => None,
                };
                if let (Some(key), Some(path)) = (r.get("key"), &keyring) {
                    let data = dearmor(&fetch(cx, key)?)?;
                    cx.put_file(path, &data, 0o644, true)?;
                }
                if let Some(line) = deb_line(r, keyring.as_deref())? {
                    cx.put_file(
                        &format!("/etc/apt/sources.list.d/{n}.list"),
                        line.as_bytes(),
                        0o644,
                        true,
                    )?;
                }
                if let Some(ppa) = token(r, "ppa")? {
                    let p = sh::quote_min(&format!("ppa:{ppa}"));
                    run_undoable(
                        cx,
                        &format!("add ppa:{ppa}"),
                        format!("add-apt-repository -y {p}"),
                        Undo::root_run(
                            format!("undo add ppa:{ppa}"),
                            format!("add-apt-repository -y --remove {p}"),
                        ),
                    )?;
                }
            }
            cx.run(
                Cmd::sh("apt-get update -qq").privileged(true),
                "apt-get update",
            )?;
            cx.changed();
        }
        _ => {
            for r in repos {
                let n = name(r)?;
                let Some(url) = token(r, "url")? else {
                    continue;
                };
                cx.realize(|o| repo_file_op(o, n));
                let text = if url.ends_with(".repo") {
                    fetch(cx, url)?
                } else {
                    rpm_repo_file(r, n, url)?.into_bytes()
                };
                cx.put_file(&format!("/etc/yum.repos.d/{n}.repo"), &text, 0o644, true)?;
            }
            // Each project and module by itself: the undo of each is
            // recorded before it is enabled.
            for (kind, list, verb) in [
                (ReverseKind::CoprDisable, copr, "copr enable"),
                (ReverseKind::ModuleReset, modules, "module enable"),
            ] {
                for c in list {
                    cx.realize(|o| o.kind == kind && o.targets.contains(c));
                    let op = ReverseOp::new(kind, vec![c.clone()], Scope::System);
                    run_undoable(
                        cx,
                        &format!("{verb} {c}"),
                        format!("dnf {verb} -y {}", sh::quote_min(c)),
                        undo_of(&op, cx.user, "repositories"),
                    )?;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo(kv: &[(&str, &str)]) -> Repo {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn source_lines_follow_the_vocabulary() {
        let r = repo(&[("name", "gh"), ("url", "https://cli.github.com/packages")]);
        assert_eq!(
            deb_line(&r, Some("/etc/apt/keyrings/gh.gpg"))
                .expect("line")
                .as_deref(),
            Some(
                "deb [signed-by=/etc/apt/keyrings/gh.gpg] https://cli.github.com/packages stable main\n"
            )
        );
        let flat = repo(&[("name", "l"), ("url", "file:/srv/repo"), ("suite", "/")]);
        assert_eq!(
            deb_line(&flat, None).expect("line").as_deref(),
            Some("deb file:/srv/repo /\n")
        );
        let bad = repo(&[("name", "x"), ("url", "https://a b")]);
        assert!(deb_line(&bad, None).is_err());
        assert!(name(&repo(&[("name", "../x")])).is_err());
        assert!(
            deb_line(&repo(&[("name", "p"), ("ppa", "a/b")]), None)
                .expect("ok")
                .is_none()
        );
    }

    #[test]
    fn armour_is_removed_and_binary_kept() {
        let bin = b"\x99\x01\x0d\x04binary key".to_vec();
        assert_eq!(dearmor(&bin).expect("binary"), bin);
        let b64 = base64::engine::general_purpose::STANDARD.encode(&bin);
        let armored = format!(
            "-----BEGIN PGP PUBLIC KEY BLOCK-----\nComment: test\n\n{}\n{}\n=abcd\n-----END PGP PUBLIC KEY BLOCK-----\n",
            &b64[..8],
            &b64[8..]
        );
        assert_eq!(dearmor(armored.as_bytes()).expect("armored"), bin);
        let no_headers = format!(
            "-----BEGIN PGP PUBLIC KEY BLOCK-----\n{b64}\n=abcd\n-----END PGP PUBLIC KEY BLOCK-----\n"
        );
        assert_eq!(dearmor(no_headers.as_bytes()).expect("armored"), bin);
        assert!(dearmor(b"-----BEGIN PGP PUBLIC KEY BLOCK-----\n\n!!!\n-----END PGP").is_err());
    }

    #[test]
    fn rpm_repo_files() {
        let r = repo(&[("name", "chrome"), ("gpgkey", "https://k/pub")]);
        assert_eq!(
            rpm_repo_file(&r, "chrome", "https://dl/x86_64").expect("text"),
            "[chrome]\nname=chrome\nbaseurl=https://dl/x86_64\nenabled=1\ngpgcheck=1\ngpgkey=https://k/pub\n"
        );
        assert!(unsupported("pac", &[]).is_some());
        assert!(unsupported("rpm", &[repo(&[("rpm", "x")])]).is_some());
        assert!(unsupported("deb", &[r]).is_none());
    }
}
