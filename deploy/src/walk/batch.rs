//! Consecutive `cmd` steps of one (scope, venue) in one round trip: a
//! target reached over SSH pays a channel, a privilege switch and a
//! shell start per command, so such a run is sent as one script that
//! runs each step's command as it would run alone and prints a marker
//! (with a nonce the commands cannot know) after each; the walker reads
//! which steps finished, and how, from the markers. Every step of the
//! batch is recorded before the script starts (intent before work); the
//! first one that fails stops the script, as the walk stops.

use super::TargetUser;
use super::apply::cmd_command;
use crate::host::{Cmd, Host, HostError};
use charly_rules::plan::{InstallStep, OpStep, Scope, StepData};
use charly_rules::sh;
use std::time::Duration;

/// A step a batch may take: runs (no skip reason), a `cmd` task.
pub(super) fn batchable<'a>(s: &'a InstallStep, skip: &Option<String>) -> Option<&'a OpStep> {
    match &s.data {
        StepData::Op(op) if skip.is_none() && op.verb == "cmd" => Some(op),
        _ => None,
    }
}

/// How one step of a batch ended.
#[derive(Debug, PartialEq)]
pub(super) enum Ended {
    /// Exit 0.
    Ok,
    /// It failed, or the batch broke off while it ran: why.
    Failed(String),
}

/// Runs `steps` (consecutive batchable steps of one scope and venue) as
/// one command; returns how each attempted step ended, in order (those
/// after the first failure were not attempted and are not listed).
pub(super) fn run(
    host: &mut dyn Host,
    steps: &[(u32, &InstallStep, &OpStep)],
    user: &TargetUser,
    bin_dirs: &[String],
    timeout: Duration,
) -> Result<Vec<(u32, Ended)>, HostError> {
    let login = host.login()?;
    let rooted = host.root().is_some();
    let nonce = {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let seed = format!(
            "{} {} {}",
            std::process::id(),
            now.as_nanos(),
            steps.first().map_or(0, |s| s.0)
        );
        crate::host::sha256_hex(seed.as_bytes())[..20].to_string()
    };
    let sys = steps
        .first()
        .is_some_and(|(_, s, _)| s.scope == Scope::System);
    let mut script = String::new();
    for (seq, _, op) in steps {
        // The step's own command, without the privilege switch (the batch
        // makes it once for all).
        let mut c = cmd_command(op, sys, user, bin_dirs);
        c.privileged = false;
        c.as_user = None;
        script.push_str(&format!(
            "{} </dev/null; __rc=$?; printf '\\n@@charly-%s %s %s\\n' {nonce} {seq} \"$__rc\"; [ \"$__rc\" -eq 0 ] || exit \"$__rc\"\n",
            sh::join_min(&c.argv_for(&login, rooted)),
        ));
    }
    let mut batch = Cmd::sh(script);
    batch.privileged = sys;
    if !sys {
        batch.as_user = Some(user.name.clone());
    }
    batch.timeout = Some(timeout.saturating_mul(steps.len() as u32));
    // A timeout or a lost connection is an error here: the caller fails
    // the batch's first step with it (the host returns no partial output,
    // so which steps had finished is not known).
    let out = host.run(&batch)?;
    let ended = parse_markers(&out.stdout_str(), &nonce);
    let mut res = Vec::new();
    for (seq, _, _) in steps {
        match ended.iter().find(|(s, _)| s == seq) {
            Some((_, 0)) => res.push((*seq, Ended::Ok)),
            Some((_, rc)) => {
                let tail = out.stderr_tail();
                res.push((
                    *seq,
                    Ended::Failed(format!(
                        "command: exit {rc}{}",
                        if tail.is_empty() {
                            String::new()
                        } else {
                            format!(": {tail}")
                        }
                    )),
                ));
                break;
            }
            None => {
                res.push((
                    *seq,
                    Ended::Failed(format!(
                        "the batch of commands ended (exit {}) before this step reported: {}",
                        out.status,
                        out.stderr_tail()
                    )),
                ));
                break;
            }
        }
    }
    Ok(res)
}

/// `(seq, exit status)` of every marker line with this nonce.
fn parse_markers(stdout: &str, nonce: &str) -> Vec<(u32, i32)> {
    let prefix = format!("@@charly-{nonce} ");
    stdout
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(&prefix)?;
            let (seq, rc) = rest.split_once(' ')?;
            Some((seq.parse().ok()?, rc.trim().parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_markers_with_the_nonce_count() {
        let out = "hello\n@@charly-abc 3 0\n@@charly-xyz 4 0\nno newline@@charly-abc 9 0\n@@charly-abc 4 2\n";
        assert_eq!(parse_markers(out, "abc"), vec![(3, 0), (4, 2)]);
    }
}
