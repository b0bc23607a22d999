//! The IR's reverse ops as the undo a host records.
//!
//! The compiler gives every step the typed operations that undo it
//! ([`ReverseOp`], its `reverse`). The walker carries them out in their
//! exact, observed form: before a change it records the undo operation
//! ([`Undo`]) the step's reverse op names for that change, refined with
//! what only the host can tell (the file that was there, the packages that
//! were new, the unit's prior state, the capabilities a file had), and
//! tags it with the reverse ops it carries out. `bundle del` replays those
//! records, last first.
//!
//! Three things here:
//!
//! * [`undo_of`] — an op's undo when nothing more is known about the host
//!   (plugin replies, COPR projects, modules);
//! * [`realizes`] — whether an undo record is a faithful form of an op
//!   (the walker checks every record it tags, tests check whole ledgers);
//! * [`incidental`] and [`vacuous`] — what a step records on the way that
//!   no op names (a parent directory it created, systemd or apt reloading
//!   after files go, a note that a command is not undone), and the ops a
//!   host has nothing to carry out for.

use super::TargetUser;
use super::managed::fish_env_file;
use crate::ledger::Undo;
use charly_rules::plan::{ReverseKind, ReverseOp, Scope};
use charly_rules::sh;
use std::collections::BTreeMap;

/// The undo operation that carries out `op` when nothing more is known
/// about the host (`who` names what reported it in messages: `plugin
/// foo`, a candy). What cannot be replayed exactly becomes a note `del`
/// shows, never a guess.
pub fn undo_of(op: &ReverseOp, user: &TargetUser, who: &str) -> Undo {
    let sys = op.scope == Scope::System;
    let run = |what: String, script: String| Undo::Run {
        what,
        script,
        privileged: sys,
        as_user: (!sys).then(|| user.name.clone()),
        env: BTreeMap::new(),
        ignore_failure: false,
    };
    let paths_ok = !op.targets.is_empty()
        && op
            .targets
            .iter()
            .all(|t| t.starts_with('/') && charly_rules::plan::compile::climbing_path(t).is_none());
    let quoted = |ts: &[String]| ts.iter().map(|t| sh::quote(t)).collect::<Vec<_>>();
    match op.kind {
        ReverseKind::PluginScript => match op.extra.get("script") {
            Some(script) if !script.trim().is_empty() => {
                run(format!("{who}: teardown script"), script.clone())
            }
            _ => note(who, op, "a plugin-script without a script"),
        },
        ReverseKind::RmFileSystem | ReverseKind::RmFileUser | ReverseKind::RemoveEnvdFile
            if paths_ok =>
        {
            run(
                format!("{who}: remove {}", op.targets.join(", ")),
                format!("rm -f -- {}", quoted(&op.targets).join(" ")),
            )
        }
        ReverseKind::RmDirRecursive if paths_ok && op.targets.iter().all(|t| t != "/") => run(
            format!("{who}: remove {}", op.targets.join(", ")),
            format!("rm -rf -- {}", quoted(&op.targets).join(" ")),
        ),
        ReverseKind::ServiceDisable if !op.targets.is_empty() => {
            let user_flag = if sys { "" } else { "--user " };
            run(
                format!("{who}: disable {}", op.targets.join(", ")),
                format!(
                    "systemctl {user_flag}disable --now -- {}",
                    quoted(&op.targets).join(" ")
                ),
            )
        }
        ReverseKind::PackageRemove => match &op.uninstall_cmd {
            Some(cmd) if !cmd.trim().is_empty() => Undo::Run {
                what: format!("{who}: remove packages {}", op.targets.join(", ")),
                script: cmd.clone(),
                privileged: true,
                as_user: None,
                env: BTreeMap::new(),
                ignore_failure: false,
            },
            _ => note(who, op, "package removal without an uninstall command"),
        },
        // A project or module that is gone already is no failure.
        ReverseKind::CoprDisable if !op.targets.is_empty() => {
            let script = op
                .targets
                .iter()
                .map(|c| {
                    let q = sh::quote_min(c);
                    format!("{{ dnf copr remove -y {q} || dnf copr disable -y {q}; }}")
                })
                .collect::<Vec<_>>()
                .join(" && ");
            Undo::root_run(format!("undo enable copr {}", op.targets.join(" ")), script)
        }
        ReverseKind::ModuleReset if !op.targets.is_empty() => Undo::root_run(
            format!("undo enable module {}", op.targets.join(" ")),
            format!(
                "dnf module reset -y {}",
                op.targets
                    .iter()
                    .map(|m| sh::quote_min(m))
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
        ),
        _ => note(who, op, "a kind this host does not replay"),
    }
}

fn note(who: &str, op: &ReverseOp, why: &str) -> Undo {
    Undo::Note {
        text: format!(
            "{who} reported teardown `{}` ({why}; targets: {}); not undone",
            kind_name(op.kind),
            op.targets.join(", ")
        ),
    }
}

/// The kebab-case name of a reverse kind (`rm-file-system`).
pub fn kind_name(k: ReverseKind) -> String {
    serde_json::to_value(k)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// Why a host records nothing for `op`, when it does not: the compiler's
/// catalogue names it, but the host made no change it would undo.
pub fn vacuous(op: &ReverseOp, rooted: bool) -> Option<&'static str> {
    match op.kind {
        ReverseKind::RemoveDropin => Some("charly writes no drop-in for a packaged unit on a host"),
        ReverseKind::ServiceDisable | ReverseKind::RestoreEnabled if rooted => {
            Some("a rooted target's units are written, never enabled")
        }
        _ => None,
    }
}

/// Whether `u` is something a step records on the way, for no reverse op:
/// a directory it created (removed again when empty), systemd or apt
/// reloading once the files are gone, a note that what ran is not undone.
pub fn incidental(u: &Undo) -> bool {
    match u {
        Undo::RemoveDir { .. } | Undo::Note { .. } => true,
        Undo::Run { script, .. } => {
            script.ends_with("daemon-reload") || script == "apt-get update -qq"
        }
        _ => false,
    }
}

/// Whether the undo record `u` is a faithful form of `op`: the same kind
/// of reversal, of what `op` names, with the privilege its scope has.
pub fn realizes(op: &ReverseOp, u: &Undo) -> bool {
    let sys = op.scope == Scope::System;
    let names = |p: &str| op.targets.iter().any(|t| t == p);
    let under = |p: &str| {
        op.targets.is_empty()
            || op
                .targets
                .iter()
                .any(|t| p == t || p.starts_with(&format!("{}/", t.trim_end_matches('/'))))
    };
    let file_undo = |u: &Undo| -> Option<(String, bool)> {
        match u {
            Undo::RemovePath { path, privileged }
            | Undo::RestoreFile {
                path, privileged, ..
            }
            | Undo::RestoreSymlink {
                path, privileged, ..
            } => Some((path.clone(), *privileged)),
            _ => None,
        }
    };
    let script = match u {
        Undo::Run { script, .. } => script.as_str(),
        _ => "",
    };
    match op.kind {
        ReverseKind::RmFileSystem | ReverseKind::RmFileUser | ReverseKind::ServiceRemove => {
            match u {
                // A downloaded file placed where nothing was.
                Undo::RemoveTree { paths, privileged } => {
                    *privileged == sys && paths.iter().all(|p| names(p))
                }
                _ => file_undo(u).is_some_and(|(p, privileged)| names(&p) && privileged == sys),
            }
        }
        ReverseKind::RemoveEnvdFile => file_undo(u).is_some_and(|(p, privileged)| {
            (names(&p) || op.targets.iter().any(|t| fish_env_file(t) == p)) && !privileged
        }),
        ReverseKind::RemoveManagedBlock => match u {
            Undo::RemoveBlock {
                file,
                marker,
                privileged,
                ..
            } => {
                op.extra.get("marker") == Some(marker)
                    && (op.targets.is_empty() || names(file))
                    && *privileged == sys
            }
            // An earlier block of the same marker: its body put back.
            Undo::RestoreBlock {
                file,
                marker,
                privileged,
                ..
            } => {
                op.extra.get("marker") == Some(marker)
                    && (op.targets.is_empty() || names(file))
                    && *privileged == sys
            }
            // The same, as versions before block-level undo recorded it:
            // the whole file put back.
            Undo::RestoreFile { path, .. } => op.targets.is_empty() || names(path),
            _ => false,
        },
        ReverseKind::RemoveArtifactFiles
        | ReverseKind::PixiEnvRemove
        | ReverseKind::NpmUninstallG
        | ReverseKind::CargoUninstall => {
            let in_dest = |p: &str| op.extra.get("verb").is_none_or(|_| under(p));
            match u {
                Undo::RemoveTree { paths, privileged } => {
                    *privileged == sys && paths.iter().all(|p| in_dest(p))
                }
                _ => file_undo(u).is_some_and(|(p, privileged)| privileged == sys && in_dest(&p)),
            }
        }
        ReverseKind::PackageRemove => match u {
            Undo::RemovePackages {
                format, packages, ..
            } => {
                op.format.as_deref().is_none_or(|f| f == format)
                    && (op.targets.is_empty() || packages.iter().any(|p| names(p)))
            }
            // Every package was there before the deploy.
            Undo::Note { text } => op.targets.iter().all(|t| text.contains(t.as_str())),
            _ => false,
        },
        ReverseKind::ServiceDisable | ReverseKind::RestoreEnabled => match u {
            Undo::Run {
                script, privileged, ..
            } => {
                script.starts_with("systemctl")
                    && *privileged == sys
                    && op.targets.iter().all(|t| {
                        script.contains(&format!(" {}", sh::quote_min(t)))
                            || script.contains(&format!(" {}", sh::quote(t)))
                    })
            }
            // The unit was already as the step leaves it.
            Undo::Note { text } => op.targets.iter().all(|t| text.contains(t.as_str())),
            _ => false,
        },
        ReverseKind::RemoveRepoFile => {
            file_undo(u).is_some_and(|(_, privileged)| privileged)
                || script.starts_with("add-apt-repository")
        }
        // One record per project or module (each undone by itself).
        ReverseKind::CoprDisable => {
            script.contains("dnf copr") && op.targets.iter().any(|c| script.contains(c.as_str()))
        }
        ReverseKind::ModuleReset => {
            script.starts_with("dnf module reset")
                && op.targets.iter().any(|m| script.contains(m.as_str()))
        }
        ReverseKind::RestoreCaps => {
            script.starts_with("setcap") && op.targets.iter().all(|t| script.contains(t.as_str()))
        }
        ReverseKind::PluginScript => op.extra.get("script").is_some_and(|s| s == script),
        ReverseKind::RmDirRecursive => script.starts_with("rm -rf"),
        ReverseKind::RemoveDropin => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user() -> TargetUser {
        TargetUser {
            name: "alice".into(),
            uid: 1000,
            gid: 1000,
            home: "/home/alice".into(),
            shell: "/bin/bash".into(),
        }
    }

    #[test]
    fn ops_replay_as_undos_and_what_cannot_is_a_note() {
        let u = user();
        let mut script = ReverseOp::new(ReverseKind::PluginScript, vec![], Scope::User);
        script.extra.insert("script".into(), "rm -rf /tmp/m".into());
        match undo_of(&script, &u, "plugin w") {
            Undo::Run {
                script,
                privileged,
                as_user,
                ..
            } => {
                assert_eq!(script, "rm -rf /tmp/m");
                assert!(!privileged);
                assert_eq!(as_user.as_deref(), Some("alice"));
            }
            other => panic!("{other:?}"),
        }
        let rm = ReverseOp::new(
            ReverseKind::RmFileSystem,
            vec!["/etc/a b".into()],
            Scope::System,
        );
        match undo_of(&rm, &u, "plugin w") {
            Undo::Run {
                script, privileged, ..
            } => {
                assert_eq!(script, "rm -f -- '/etc/a b'");
                assert!(privileged);
            }
            other => panic!("{other:?}"),
        }
        let copr = ReverseOp::new(ReverseKind::CoprDisable, vec!["o/p".into()], Scope::System);
        let cu = undo_of(&copr, &u, "c");
        assert!(realizes(&copr, &cu), "{cu:?}");
        assert!(
            matches!(&cu, Undo::Run { script, ignore_failure: true, privileged: true, .. }
                if script == "{ dnf copr remove -y o/p || dnf copr disable -y o/p; }"),
            "{cu:?}"
        );
        let m = ReverseOp::new(
            ReverseKind::ModuleReset,
            vec!["nodejs:20".into()],
            Scope::System,
        );
        assert!(realizes(&m, &undo_of(&m, &u, "c")));
        for bad in [
            ReverseOp::new(ReverseKind::RmDirRecursive, vec!["/".into()], Scope::System),
            ReverseOp::new(ReverseKind::RmFileUser, vec!["rel/x".into()], Scope::User),
            ReverseOp::new(
                ReverseKind::RmFileUser,
                vec!["/a/../etc".into()],
                Scope::User,
            ),
            ReverseOp::new(ReverseKind::PluginScript, vec![], Scope::User),
            ReverseOp::new(
                ReverseKind::RemoveDropin,
                vec!["x.service".into()],
                Scope::System,
            ),
        ] {
            assert!(
                matches!(undo_of(&bad, &u, "plugin w"), Undo::Note { .. }),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn realizes_checks_kind_subject_and_privilege() {
        let rm = ReverseOp::new(
            ReverseKind::RmFileSystem,
            vec!["/etc/a".into()],
            Scope::System,
        );
        let remove = |p: &str, privileged| Undo::RemovePath {
            path: p.into(),
            privileged,
        };
        assert!(realizes(&rm, &remove("/etc/a", true)));
        assert!(!realizes(&rm, &remove("/etc/b", true)), "another path");
        assert!(!realizes(&rm, &remove("/etc/a", false)), "not as root");
        assert!(!realizes(
            &rm,
            &Undo::Note {
                text: "/etc/a".into()
            }
        ));
        let env = ReverseOp::new(
            ReverseKind::RemoveEnvdFile,
            vec!["/h/.config/charly/env.d/c.sh".into()],
            Scope::UserProfile,
        );
        assert!(realizes(
            &env,
            &remove("/h/.config/charly/env.d/c.fish", false)
        ));
        let svc = ReverseOp::new(
            ReverseKind::ServiceDisable,
            vec!["sshd.service".into()],
            Scope::System,
        );
        let run = |script: &str| Undo::Run {
            what: String::new(),
            script: script.into(),
            privileged: true,
            as_user: None,
            env: BTreeMap::new(),
            ignore_failure: true,
        };
        assert!(realizes(&svc, &run("systemctl stop sshd.service")));
        assert!(!realizes(&svc, &run("systemctl stop other.service")));
        let mut pk = ReverseOp::new(
            ReverseKind::PackageRemove,
            vec!["jq".into(), "tree".into()],
            Scope::System,
        );
        pk.format = Some("deb".into());
        let pkgs = |format: &str, p: &[&str]| Undo::RemovePackages {
            format: format.into(),
            packages: p.iter().map(|s| s.to_string()).collect(),
            command: String::new(),
            root: None,
        };
        assert!(realizes(&pk, &pkgs("deb", &["tree"])));
        assert!(
            realizes(&pk, &pkgs("deb", &["tree", "libonig5"])),
            "with deps"
        );
        assert!(!realizes(&pk, &pkgs("rpm", &["tree"])));
        assert!(!realizes(&pk, &pkgs("deb", &["vim"])));
        let dl = ReverseOp::new(
            ReverseKind::RemoveArtifactFiles,
            vec!["/opt/t".into()],
            Scope::System,
        )
        .with("verb", "download");
        let tree = |p: &[&str]| Undo::RemoveTree {
            paths: p.iter().map(|s| s.to_string()).collect(),
            privileged: true,
        };
        assert!(realizes(&dl, &tree(&["/opt/t/bin", "/opt/t/bin/x"])));
        assert!(!realizes(&dl, &tree(&["/opt/other"])));
        assert!(incidental(&Undo::RemoveDir {
            path: "/opt".into(),
            privileged: true
        }));
        assert!(incidental(&run("systemctl daemon-reload")));
        assert!(!incidental(&run("systemctl stop x")));
        assert!(
            vacuous(
                &ReverseOp::new(ReverseKind::RemoveDropin, vec![], Scope::System),
                false
            )
            .is_some()
        );
        assert!(vacuous(&svc, false).is_none() && vacuous(&svc, true).is_some());
    }
}
