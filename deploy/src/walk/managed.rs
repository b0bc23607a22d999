//! Managed blocks in files (marked sections charly adds to and removes
//! from files it does not own, such as a shell's rc file), the env.d files
//! of shell hooks and the shell snippets that use them.

use super::{R, StepCx};
use crate::host::{parent, sha256_hex};
use crate::ledger::{Fact, Undo};
use charly_rules::plan::{InstallStep, ReverseKind, Scope, ShellHookStep, ShellSnippetStep};
use charly_rules::sh;

/// The rc file a login shell reads.
pub fn rc_file(shell: &str, home: &str) -> String {
    let base = shell.rsplit('/').next().unwrap_or(shell);
    match base {
        "bash" => format!("{home}/.bashrc"),
        "zsh" => format!("{home}/.zshrc"),
        "fish" => format!("{home}/.config/fish/config.fish"),
        _ => format!("{home}/.profile"),
    }
}

fn block_markers(marker: &str) -> (String, String) {
    (
        format!("# >>> charly {marker} >>>"),
        format!("# <<< charly {marker} <<<"),
    )
}

/// The text of a managed block in `content`, if present.
pub fn find_block(content: &str, marker: &str) -> Option<String> {
    let (b, e) = block_markers(marker);
    let start = content.find(&format!("{b}\n"))?;
    let body_start = start + b.len() + 1;
    let end = content[body_start..].find(&e)? + body_start;
    Some(content[body_start..end].to_string())
}

/// `content` with the block removed (markers and body, one line each side).
pub fn strip_block(content: &str, marker: &str) -> String {
    let (b, e) = block_markers(marker);
    let Some(start) = content.find(&format!("{b}\n")) else {
        return content.to_string();
    };
    let Some(rel_end) = content[start..].find(&e) else {
        return content.to_string();
    };
    let mut end = start + rel_end + e.len();
    if content[end..].starts_with('\n') {
        end += 1;
    }
    format!("{}{}", &content[..start], &content[end..])
}

/// `content` with the body of its block `marker` replaced by `body`
/// (markers and everything around them unchanged); `content` as it is
/// when it has no such block.
pub fn replace_block(content: &str, marker: &str, body: &str) -> String {
    let (b, e) = block_markers(marker);
    let Some(start) = content.find(&format!("{b}\n")) else {
        return content.to_string();
    };
    let body_start = start + b.len() + 1;
    let Some(rel_end) = content[body_start..].find(&e) else {
        return content.to_string();
    };
    format!(
        "{}{body}{}",
        &content[..body_start],
        &content[body_start + rel_end..]
    )
}

impl StepCx<'_> {
    pub(super) fn put_block(
        &mut self,
        file: &str,
        marker: &str,
        text: &str,
        privileged: bool,
    ) -> R<()> {
        if let Some(p) = parent(file) {
            self.ensure_dir(p, 0o755, privileged)?;
            if !self.dry() {
                self.facts.pop();
            }
        }
        let body = if text.ends_with('\n') {
            text.to_string()
        } else {
            format!("{text}\n")
        };
        self.actions
            .push(format!("managed block {marker} in {file}"));
        if self.dry() {
            return Ok(());
        }
        let st = self
            .host
            .stat(&[file.to_string()], false)
            .map_err(|e| e.to_string())?
            .pop()
            .flatten();
        let old = self
            .host
            .read_file(file, privileged)
            .map_err(|e| e.to_string())?;
        let created = old.is_none();
        let old = String::from_utf8(old.unwrap_or_default())
            .map_err(|_| format!("{file} is not UTF-8 text"))?;
        let (new, undo) = match find_block(&old, marker) {
            // An earlier block of ours (another bundle's): its body is
            // replaced where it stands, and put back by the undo; the rest
            // of the file is not touched, then or at `del`.
            Some(prior) => (
                replace_block(&old, marker, &body),
                Undo::RestoreBlock {
                    file: file.into(),
                    marker: marker.into(),
                    body: prior,
                    privileged,
                },
            ),
            None => {
                let added_newline = !old.is_empty() && !old.ends_with('\n');
                let (b, e) = block_markers(marker);
                (
                    format!(
                        "{old}{}{b}\n{body}{e}\n",
                        if added_newline { "\n" } else { "" }
                    ),
                    Undo::RemoveBlock {
                        file: file.into(),
                        marker: marker.into(),
                        added_newline,
                        created_file: created,
                        privileged,
                    },
                )
            }
        };
        self.undo(&undo, &[])?;
        // An existing file keeps its mode and owner.
        let mut a = self.attrs(st.as_ref().map_or(0o644, |s| s.mode), privileged);
        if let Some(s) = &st {
            a.owner = Some((s.uid, s.gid));
        }
        self.host
            .write_file(file, new.as_bytes(), &a)
            .map_err(|e| e.to_string())?;
        self.facts.push(Fact::Block {
            file: file.into(),
            marker: marker.into(),
            sha256: sha256_hex(body.as_bytes()),
        });
        self.changed();
        Ok(())
    }
}

fn env_file_text(h: &ShellHookStep) -> String {
    let mut t = String::from("# Written by charly; removed by `charly bundle del`.\n");
    for (k, v) in &h.env {
        t.push_str(&format!("export {k}={}\n", dq(v)));
    }
    for p in h.path.iter().rev() {
        // Quoted in the pattern too: a path entry is literal there.
        let p = dq(p);
        t.push_str(&format!(
            "case \":$PATH:\" in *:{p}:*) ;; *) PATH={p}:$PATH ;; esac\n"
        ));
    }
    t.push_str("export PATH\n");
    t
}

/// The env file in fish's own syntax (fish cannot source a POSIX file):
/// values are literal, as in the POSIX file; PATH entries are prepended in
/// order unless already present.
fn fish_env_text(h: &ShellHookStep) -> String {
    let mut t = String::from("# Written by charly; removed by `charly bundle del`.\n");
    for (k, v) in &h.env {
        t.push_str(&format!("set -gx {k} {}\n", fq(v)));
    }
    for p in h.path.iter().rev() {
        let p = fq(p);
        t.push_str(&format!(
            "contains -- {p} $PATH; or set -gx PATH {p} $PATH\n"
        ));
    }
    t
}

/// A fish single-quoted string: only `\\` and `\'` are escapes inside.
fn fq(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// Where the fish form of an env file goes: next to it, `.fish` for `.sh`.
pub(super) fn fish_env_file(env_file: &str) -> String {
    format!("{}.fish", env_file.strip_suffix(".sh").unwrap_or(env_file))
}

fn dq(s: &str) -> String {
    format!(
        "\"{}\"",
        s.replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('`', "\\`")
            .replace('$', "\\$")
    )
}

pub(super) fn hook_step(cx: &mut StepCx<'_>, s: &InstallStep, h: &ShellHookStep) -> R<()> {
    // The fish form of the env file is the env file too (its op names the
    // POSIX one); the block is named by its marker.
    cx.realize(|r| r.kind == ReverseKind::RemoveEnvdFile);
    cx.put_file(&h.env_file, env_file_text(h).as_bytes(), 0o644, false)?;
    let rc = rc_file(&cx.user.shell, &cx.user.home);
    let line = if rc.ends_with(".fish") {
        let fish = fish_env_file(&h.env_file);
        cx.put_file(&fish, fish_env_text(h).as_bytes(), 0o644, false)?;
        format!("test -r {f}; and source {f}", f = sh::quote_min(&fish))
    } else {
        format!("[ -r {f} ] && . {f}", f = sh::quote_min(&h.env_file))
    };
    cx.put_block(&rc, &format!("charly-env:{}", s.candy), &line, false)
}

pub(super) fn snippet_step(cx: &mut StepCx<'_>, s: &InstallStep, sn: &ShellSnippetStep) -> R<()> {
    let sys = s.scope == Scope::System;
    if sn.managed_block {
        cx.put_block(&sn.destination, &s.candy, &sn.text, sys)
    } else {
        cx.put_file(&sn.destination, sn.text.as_bytes(), 0o644, sys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fish env file sets what the POSIX one sets, byte for byte, in a
    /// real fish and a real sh (fish is required under CI: `.ci/install`).
    #[test]
    fn the_fish_env_file_sets_what_the_posix_one_does() {
        let h = ShellHookStep {
            env: [
                ("A".to_string(), r#"it's $HOME \ "q" `x`"#.to_string()),
                ("B".to_string(), "plain".to_string()),
            ]
            .into_iter()
            .collect(),
            path: vec!["/opt/a b/bin".into(), "/opt/c".into(), "/usr/bin".into()],
            env_file: "/h/.config/charly/env/x.sh".into(),
        };
        assert_eq!(fish_env_file(&h.env_file), "/h/.config/charly/env/x.fish");
        let t = tempfile::tempdir().expect("tmp");
        let (posix, fish) = (t.path().join("x.sh"), t.path().join("x.fish"));
        std::fs::write(&posix, env_file_text(&h)).expect("write");
        std::fs::write(&fish, fish_env_text(&h)).expect("write");
        let show = "printf '%s|' \"$A\" \"$B\"";
        let run = |prog: &str, script: String| {
            let out = std::process::Command::new(prog)
                .args(["-c", &script])
                .env_clear()
                .env("PATH", "/usr/bin:/bin")
                .output()
                .unwrap_or_else(|e| panic!("{prog}: {e}"));
            assert!(out.status.success(), "{prog}: {out:?}");
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        let sh_out = run(
            "sh",
            format!(". '{}'; {show}; printf '%s' \"$PATH\"", posix.display()),
        );
        assert_eq!(
            sh_out,
            r#"it's $HOME \ "q" `x`|plain|/opt/a b/bin:/opt/c:/usr/bin:/bin"#
        );
        if std::process::Command::new("fish")
            .arg("--version")
            .output()
            .is_err()
        {
            charly_testutil::missing_tool("fish", "CHARLY_SKIP_FISH", "run .ci/install");
            return;
        }
        let fish_out = run(
            "fish",
            format!(
                "source '{}'; {show}; printf '%s' (string join : $PATH)",
                fish.display()
            ),
        );
        assert_eq!(fish_out, sh_out);
    }

    #[test]
    fn blocks_round_trip() {
        let base = "a\nb";
        let (b, e) = block_markers("m");
        let with = format!("{base}\n{b}\nx=1\n{e}\n");
        assert_eq!(find_block(&with, "m").as_deref(), Some("x=1\n"));
        assert_eq!(strip_block(&with, "m"), "a\nb\n");
        assert_eq!(strip_block("plain\n", "m"), "plain\n");
        assert_eq!(rc_file("/bin/zsh", "/h"), "/h/.zshrc");
        assert_eq!(rc_file("/bin/dash", "/h"), "/h/.profile");
    }
}
