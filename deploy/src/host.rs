//! The Host seam: everything a walker does to a target goes through [`Host`].
//!
//! A host runs commands, reads and writes files, inspects paths and finds
//! binaries. Walkers speak in **target paths** (`/etc/x`, `/home/user/.bashrc`);
//! a host rooted at a directory maps them below its root for file
//! operations, and [`Host::real`] gives the mapped path for command
//! arguments. Three implementations: `local::LocalHost` (optionally
//! rooted, so tests and `--root DIR` never touch the real system),
//! `ssh::SshHost` (russh) and `mem::MemHost` (in memory,
//! scriptable failures, for unit tests).
//!
//! **Commands never inherit an environment.** [`Cmd::argv_for`] builds the
//! full argv — privilege wrapper (`sudo -n`, or `runuser` when the login is
//! root), then `env -i` with exactly the variables the walker constructed
//! (PATH from recorded bin dirs plus [`BASE_PATH`]), then the program — so
//! the local and the SSH host run the very same words, and `--dry-run`
//! prints them.

use charly_rules::sh;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// The minimal system PATH every command gets after the recorded bin dirs.
pub const BASE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Why a host operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// Connecting or talking to the host failed.
    #[error("{host}: {message}")]
    Connection {
        /// The host.
        host: String,
        /// What happened.
        message: String,
    },
    /// The server's host key is not the one known_hosts records (or is unknown).
    #[error("{host}: host key verification failed: {message}")]
    HostKey {
        /// The host.
        host: String,
        /// What was found.
        message: String,
    },
    /// A command ran longer than allowed.
    #[error("{host}: `{what}` timed out after {secs} s")]
    Timeout {
        /// The host.
        host: String,
        /// The command, shortened.
        what: String,
        /// The limit.
        secs: u64,
    },
    /// A file operation failed.
    #[error("{host}: {op} {path}: {message}")]
    Io {
        /// The host.
        host: String,
        /// Operation (`write`, `read`, `mkdir`…).
        op: String,
        /// Target path.
        path: String,
        /// Why.
        message: String,
    },
    /// A command printed something charly cannot read.
    #[error("{host}: unexpected output from `{what}`: {output:?}")]
    Garbage {
        /// The host.
        host: String,
        /// The command.
        what: String,
        /// What it printed (shortened).
        output: String,
    },
}

/// Where a host writes or removes with elevated rights.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileAttrs {
    /// Permission bits.
    pub mode: u32,
    /// Owner to set (`uid`, `gid`), when it should be set.
    pub owner: Option<(u32, u32)>,
    /// Needs root (system scope): `sudo -n` unless the login is root.
    pub privileged: bool,
}

/// What a path is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "type")]
pub enum PathKind {
    /// A regular file; `sha256` when asked for.
    File {
        /// Hex sha256 of the content.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sha256: Option<String>,
    },
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink {
        /// Its target.
        target: String,
    },
    /// Something else (device, fifo, socket).
    Other,
}

/// Facts about an existing path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stat {
    /// What it is.
    #[serde(flatten)]
    pub kind: PathKind,
    /// Permission bits.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
}

/// The account a host session runs as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Login {
    /// User name.
    pub name: String,
    /// Numeric uid (0: root, no sudo needed).
    pub uid: u32,
    /// The login's sudo password, when sudo asks for one
    /// (`--ask-become-pass`, `CHARLY_SUDO_PASSWORD_FILE`).
    pub sudo_password: Option<Secret>,
}

impl Login {
    /// A login without a sudo password.
    pub fn new(name: impl Into<String>, uid: u32) -> Self {
        Login {
            name: name.into(),
            uid,
            sudo_password: None,
        }
    }
}

/// A password: never printed (`Debug` shows `***`).
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a password (one line: a trailing newline is dropped, and a
    /// password with a line break in it is refused).
    pub fn new(s: &str) -> Result<Self, String> {
        let s = s.strip_suffix('\n').unwrap_or(s);
        let s = s.strip_suffix('\r').unwrap_or(s);
        if s.contains(['\n', '\r']) {
            return Err("a sudo password is one line".into());
        }
        Ok(Secret(s.to_string()))
    }

    /// The password.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

/// Gives `host` the login's sudo password, if sudo needs one there. A
/// login that is root, or whose sudo asks for no password, never gets it:
/// sudo would not read it, and the line meant for sudo would reach the
/// command's own stdin. Returns whether the password is used.
pub fn give_sudo_password(host: &mut dyn Host, pw: Secret) -> Result<bool, HostError> {
    if host.root().is_some() || host.login()?.uid == 0 {
        return Ok(false);
    }
    let probe = Cmd::sh("true")
        .privileged(true)
        .timeout(Duration::from_secs(60));
    if host.run(&probe)?.ok() {
        return Ok(false);
    }
    host.set_sudo_password(Some(pw))?;
    Ok(true)
}

/// A command to run on a host.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cmd {
    /// Program and arguments (the program is looked up on `env["PATH"]`).
    pub argv: Vec<String>,
    /// The complete environment (nothing is inherited).
    pub env: BTreeMap<String, String>,
    /// Bytes for standard input.
    pub stdin: Option<Vec<u8>>,
    /// Needs root: run under `sudo -n` unless the login is root (never on a rooted host).
    pub privileged: bool,
    /// Run as this user when it differs from the login (never on a rooted host).
    pub as_user: Option<String>,
    /// Working directory (a real path on the host).
    pub cwd: Option<String>,
    /// Give up after this long.
    pub timeout: Option<Duration>,
}

impl Cmd {
    /// A shell script run with `/bin/sh -c`.
    pub fn sh(script: impl Into<String>) -> Self {
        Cmd {
            argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
            env: base_env(),
            ..Cmd::default()
        }
    }

    /// Sets privileged.
    #[must_use]
    pub fn privileged(mut self, p: bool) -> Self {
        self.privileged = p;
        self
    }

    /// Sets the timeout.
    #[must_use]
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = Some(t);
        self
    }

    /// Sets standard input.
    #[must_use]
    pub fn stdin(mut self, data: Vec<u8>) -> Self {
        self.stdin = Some(data);
        self
    }

    /// The full argv the host executes: privilege wrapper, `env -i` with
    /// the constructed environment, then the program. `rooted` hosts never
    /// switch users (their root is a directory, not a machine).
    pub fn argv_for(&self, login: &Login, rooted: bool) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let other_user = self
            .as_user
            .as_deref()
            .filter(|u| !rooted && *u != login.name);
        // With a password, sudo reads it from the first line of stdin
        // (see `stdin_for`); `-k` makes it ask every time, so the line is
        // never left for the command when a cached credential would do.
        let sudo: &[&str] = if login.sudo_password.is_some() {
            &["sudo", "-k", "-S", "-p", ""]
        } else {
            &["sudo", "-n"]
        };
        if let Some(u) = other_user {
            if login.uid == 0 {
                out.extend(["runuser", "-u", u, "--"].map(String::from));
            } else {
                out.extend(sudo.iter().map(|s| s.to_string()));
                out.extend(["-u", u, "--"].map(String::from));
            }
        } else if self.privileged && !rooted && login.uid != 0 {
            out.extend(sudo.iter().map(|s| s.to_string()));
            out.push("--".into());
        }
        out.push("env".into());
        out.push("-i".into());
        for (k, v) in &self.env {
            out.push(format!("{k}={v}"));
        }
        out.extend(self.argv.iter().cloned());
        out
    }

    /// Whether [`Cmd::argv_for`] runs this command through sudo.
    fn uses_sudo(&self, login: &Login, rooted: bool) -> bool {
        login.uid != 0
            && !rooted
            && (self.privileged || self.as_user.as_deref().is_some_and(|u| u != login.name))
    }

    /// The bytes for the command's stdin: the sudo password's line first
    /// when sudo will ask for it, then the command's own input.
    pub fn stdin_for(&self, login: &Login, rooted: bool) -> Option<Vec<u8>> {
        match &login.sudo_password {
            Some(pw) if self.uses_sudo(login, rooted) => {
                let mut v = pw.expose().as_bytes().to_vec();
                v.push(b'\n');
                v.extend_from_slice(self.stdin.as_deref().unwrap_or_default());
                Some(v)
            }
            _ => self.stdin.clone(),
        }
    }

    /// One line for people and `--dry-run`: the argv, shell-quoted.
    pub fn display(&self, login: &Login, rooted: bool) -> String {
        let mut s = String::new();
        if let Some(c) = &self.cwd {
            s.push_str(&format!("cd {} && ", sh::quote_min(c)));
        }
        s.push_str(&sh::join_min(&self.argv_for(login, rooted)));
        if let Some(i) = &self.stdin {
            s.push_str(&format!(" < ({} bytes)", i.len()));
        }
        s
    }

    /// A short name for errors: the script's first line or the program.
    pub fn what(&self) -> String {
        let s = match self.argv.as_slice() {
            [sh, c, script, ..] if c == "-c" && (sh.ends_with("sh")) => script.clone(),
            v => sh::join_min(v),
        };
        shorten(s.lines().find(|l| !l.trim().is_empty()).unwrap_or(""), 120)
    }
}

/// What a command did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CmdOutput {
    /// Exit status (128+N for a signal).
    pub status: i32,
    /// Standard output.
    pub stdout: Vec<u8>,
    /// Standard error.
    pub stderr: Vec<u8>,
}

impl CmdOutput {
    /// Exit status zero.
    pub fn ok(&self) -> bool {
        self.status == 0
    }

    /// Standard output as text.
    pub fn stdout_str(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// The last lines of standard error (for error messages).
    pub fn stderr_tail(&self) -> String {
        let s = String::from_utf8_lossy(&self.stderr);
        let lines: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
        let tail = &lines[lines.len().saturating_sub(6)..];
        tail.join("\n")
    }
}

/// A host's login, found once, and the sudo password given for it (kept
/// when the host forgets the account, e.g. across a reconnect). The
/// password lives here only: the account is kept without it and
/// [`Host::login`] puts it in.
#[derive(Clone, Debug, Default)]
pub struct KeptLogin {
    found: Option<(String, u32)>,
    sudo_password: Option<Secret>,
}

impl KeptLogin {
    /// Forgets the account (found again on next use); keeps the password.
    pub fn forget(&mut self) {
        self.found = None;
    }

    /// The kept account with the password, if the account was found.
    fn get(&self) -> Option<Login> {
        self.found.as_ref().map(|(name, uid)| Login {
            name: name.clone(),
            uid: *uid,
            sudo_password: self.sudo_password.clone(),
        })
    }
}

/// The one seam between walkers and targets.
pub trait Host {
    /// `local`, `local (root /tmp/x)`, `ssh root@10.0.0.5:22`.
    fn describe(&self) -> String;
    /// The directory target paths are mapped below, if any.
    fn root(&self) -> Option<&str>;
    /// Where the session's account is kept once found, with the sudo
    /// password given for it.
    fn kept_login(&mut self) -> &mut KeptLogin;
    /// Finds the account the session runs as (once: [`Host::login`] keeps
    /// it until the host forgets it, e.g. on reconnecting).
    fn find_login(&mut self) -> Result<Login, HostError>;
    /// The account the session runs as, with its sudo password.
    fn login(&mut self) -> Result<Login, HostError> {
        if let Some(l) = self.kept_login().get() {
            return Ok(l);
        }
        let Login { name, uid, .. } = self.find_login()?;
        let kept = self.kept_login();
        kept.found = Some((name.clone(), uid));
        Ok(Login {
            name,
            uid,
            sudo_password: kept.sudo_password.clone(),
        })
    }
    /// Gives the login's sudo password for privileged commands (None:
    /// `sudo -n`, which fails when sudo wants one).
    fn set_sudo_password(&mut self, pw: Option<Secret>) -> Result<(), HostError> {
        self.kept_login().sudo_password = pw;
        Ok(())
    }
    /// Runs a command (see [`Cmd::argv_for`]). A nonzero exit is an `Ok`
    /// output; only failing to run, or a timeout, is an error.
    fn run(&mut self, cmd: &Cmd) -> Result<CmdOutput, HostError>;
    /// Reads a file; `None` when it does not exist.
    fn read_file(&mut self, path: &str, privileged: bool) -> Result<Option<Vec<u8>>, HostError>;
    /// Writes a file atomically (temp file in the same directory, then
    /// rename) with mode and owner. The parent must exist.
    fn write_file(&mut self, path: &str, data: &[u8], attrs: &FileAttrs) -> Result<(), HostError>;
    /// Finds an executable `name` on an explicit PATH (real host paths);
    /// returns its full path.
    fn which(&mut self, name: &str, path: &str) -> Result<Option<String>, HostError>;
    /// Facts about paths (`None`: absent), in one round trip. `digest`
    /// hashes regular files.
    fn stat(&mut self, paths: &[String], digest: bool) -> Result<Vec<Option<Stat>>, HostError>;
    /// Creates one directory (the parent must exist).
    fn mkdir(&mut self, path: &str, attrs: &FileAttrs) -> Result<(), HostError>;
    /// Creates a symlink `path → target` (nothing may exist at `path`).
    fn symlink(&mut self, path: &str, target: &str, attrs: &FileAttrs) -> Result<(), HostError>;
    /// Removes a file or symlink, or an empty directory. Absent is fine.
    /// `Ok(false)`: a directory that is not empty was left.
    fn remove(&mut self, path: &str, privileged: bool) -> Result<bool, HostError>;
    /// Unpacks a tar whose entry paths are target paths relative to `/`,
    /// keeping modes (and numeric owners when allowed).
    fn extract_tar(&mut self, tar: &[u8], privileged: bool) -> Result<(), HostError>;
    /// Re-establishes the session (after a reboot).
    fn reconnect(&mut self, timeout: Duration) -> Result<(), HostError>;
    /// Removes temp files that killed writers left in the directories
    /// `dirs` (target paths); a live writer's are kept. Returns the
    /// leftovers that could not be removed, with why. Hosts whose writes
    /// leave nothing behind keep the default (nothing to do).
    fn sweep_temps(&mut self, dirs: &[String]) -> Vec<(String, String)> {
        let _ = dirs;
        Vec::new()
    }

    /// The host path of a target path (below the root, if any).
    fn real(&self, path: &str) -> String {
        match self.root() {
            Some(r) => format!(
                "{}/{}",
                r.trim_end_matches('/'),
                path.trim_start_matches('/')
            ),
            None => path.to_string(),
        }
    }
}

/// The environment every command starts from.
pub fn base_env() -> BTreeMap<String, String> {
    let mut e = BTreeMap::new();
    e.insert("PATH".into(), BASE_PATH.into());
    e.insert("LANG".into(), "C.UTF-8".into());
    e
}

/// Cuts a string to `n` characters, marking the cut.
pub fn shorten(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n).collect();
        t.push('…');
        t
    }
}

/// Hex sha256 of bytes.
pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(data);
    let mut s = String::with_capacity(64);
    for b in d.iter() {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// The parent of a target path (`/` for top-level paths).
pub fn parent(path: &str) -> Option<&str> {
    let t = path.trim_end_matches('/');
    let i = t.rfind('/')?;
    Some(if i == 0 { "/" } else { &t[..i] })
}

/// The shell script the SSH host (and any shell-based host) uses to stat
/// paths: one line per path (`N`, `O`, `D mode uid gid`, `F mode uid gid
/// [sha256]`, `L mode uid gid` then a second line with the link target).
pub fn stat_script(real_paths: &[String], digest: bool) -> String {
    let mut s = String::from("set --");
    for p in real_paths {
        s.push(' ');
        s.push_str(&sh::quote_min(p));
    }
    s.push_str(
        "\nfor p in \"$@\"; do\n\
         if [ -L \"$p\" ]; then printf 'L %s\\n' \"$(stat -c '%a %u %g' -- \"$p\")\"; readlink -- \"$p\" | od -An -tx1 | tr -d ' \\n'; echo\n\
         elif [ -d \"$p\" ]; then printf 'D %s\\n' \"$(stat -c '%a %u %g' -- \"$p\")\"\n\
         elif [ -f \"$p\" ]; then ",
    );
    if digest {
        s.push_str("printf 'F %s %s\\n' \"$(stat -c '%a %u %g' -- \"$p\")\" \"$(sha256sum < \"$p\" | cut -c1-64)\"\n");
    } else {
        s.push_str("printf 'F %s\\n' \"$(stat -c '%a %u %g' -- \"$p\")\"\n");
    }
    s.push_str("elif [ -e \"$p\" ]; then echo O\nelse echo N\nfi\ndone\n");
    s
}

/// Parses [`stat_script`] output for `n` paths.
pub fn parse_stat_output(out: &str, n: usize) -> Result<Vec<Option<Stat>>, String> {
    let mut lines = out.lines();
    let mut res = Vec::with_capacity(n);
    for _ in 0..n {
        let line = lines.next().ok_or("fewer lines than paths")?;
        let mut f = line.split_whitespace();
        let tag = f.next().ok_or("empty line")?;
        let mut num = |radix: u32| -> Result<u32, String> {
            let w = f.next().ok_or_else(|| format!("short line `{line}`"))?;
            u32::from_str_radix(w, radix).map_err(|_| format!("bad number `{w}` in `{line}`"))
        };
        let st = match tag {
            "N" => None,
            "O" => Some(Stat {
                kind: PathKind::Other,
                mode: 0,
                uid: 0,
                gid: 0,
            }),
            "D" | "F" | "L" => {
                let (mode, uid, gid) = (num(8)?, num(10)?, num(10)?);
                let kind = match tag {
                    "D" => PathKind::Dir,
                    "F" => {
                        let sha = f.next().map(str::to_string);
                        if let Some(h) = &sha
                            && (h.len() != 64 || !h.bytes().all(|b| b.is_ascii_hexdigit()))
                        {
                            return Err(format!("bad digest in `{line}`"));
                        }
                        PathKind::File { sha256: sha }
                    }
                    _ => {
                        let hex = lines.next().ok_or("missing link target line")?;
                        PathKind::Symlink {
                            target: unhex(hex.trim())?,
                        }
                    }
                };
                Some(Stat {
                    kind,
                    mode,
                    uid,
                    gid,
                })
            }
            other => return Err(format!("unknown tag `{other}`")),
        };
        res.push(st);
    }
    Ok(res)
}

fn unhex(s: &str) -> Result<String, String> {
    if !s.len().is_multiple_of(2) {
        return Err(format!("odd hex `{s}`"));
    }
    let mut bytes = Vec::with_capacity(s.len() / 2);
    for i in (0..s.len()).step_by(2) {
        let b = u8::from_str_radix(&s[i..i + 2], 16).map_err(|_| format!("bad hex `{s}`"))?;
        bytes.push(b);
    }
    // `readlink` ends with a newline which od shows as 0a.
    if bytes.last() == Some(&b'\n') {
        bytes.pop();
    }
    String::from_utf8(bytes).map_err(|_| "link target is not UTF-8".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn login(name: &str, uid: u32) -> Login {
        Login::new(name, uid)
    }

    #[test]
    fn a_sudo_password_goes_first_on_stdin_and_is_never_shown() {
        let mut l = login("alice", 1000);
        l.sudo_password = Some(Secret::new("s3cret\n").expect("one line"));
        let c = Cmd::sh("cat").privileged(true).stdin(b"data".to_vec());
        assert_eq!(
            &c.argv_for(&l, false)[..7],
            &["sudo", "-k", "-S", "-p", "", "--", "env"]
        );
        assert_eq!(
            c.stdin_for(&l, false).as_deref(),
            Some(&b"s3cret\ndata"[..])
        );
        // No sudo, no password: as root, on a rooted host, unprivileged.
        assert_eq!(
            c.stdin_for(&login("root", 0), false).as_deref(),
            Some(&b"data"[..])
        );
        assert_eq!(c.stdin_for(&l, true).as_deref(), Some(&b"data"[..]));
        assert_eq!(Cmd::sh("true").stdin_for(&l, false), None);
        let mut u = Cmd::sh("id");
        u.as_user = Some("bob".into());
        assert_eq!(&u.argv_for(&l, false)[5..8], &["-u", "bob", "--"]);
        assert_eq!(u.stdin_for(&l, false).as_deref(), Some(&b"s3cret\n"[..]));
        assert!(!c.display(&l, false).contains("s3cret"));
        assert_eq!(format!("{l:?}").matches("s3cret").count(), 0);
        assert!(Secret::new("a\nb").is_err());
    }

    #[test]
    fn argv_wraps_privilege_and_env() {
        let c = Cmd::sh("echo hi").privileged(true);
        let a = c.argv_for(&login("alice", 1000), false);
        assert_eq!(&a[..5], &["sudo", "-n", "--", "env", "-i"]);
        assert!(a.contains(&format!("PATH={BASE_PATH}")));
        assert_eq!(a.last().map(String::as_str), Some("echo hi"));
        // Root needs no sudo; a rooted host never elevates.
        assert_eq!(c.argv_for(&login("root", 0), false)[0], "env");
        assert_eq!(c.argv_for(&login("alice", 1000), true)[0], "env");
        let mut u = Cmd::sh("id");
        u.as_user = Some("bob".into());
        assert_eq!(
            &u.argv_for(&login("root", 0), false)[..4],
            &["runuser", "-u", "bob", "--"]
        );
        assert_eq!(
            &u.argv_for(&login("alice", 1), false)[..5],
            &["sudo", "-n", "-u", "bob", "--"]
        );
        assert_eq!(u.argv_for(&login("bob", 1), false)[0], "env");
    }

    #[test]
    fn stat_parsing() {
        let out = "N\nD 755 0 0\nF 644 1000 1000 e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\nL 777 0 0\n2e2e2f610a\nO\n";
        let s = parse_stat_output(out, 5).expect("parse");
        assert_eq!(s[0], None);
        assert_eq!(s[1].as_ref().map(|s| s.mode), Some(0o755));
        assert!(matches!(
            &s[2],
            Some(Stat {
                kind: PathKind::File { sha256: Some(_) },
                uid: 1000,
                ..
            })
        ));
        assert_eq!(
            s[3].as_ref().map(|s| s.kind.clone()),
            Some(PathKind::Symlink {
                target: "../a".into()
            })
        );
        assert!(parse_stat_output("X 1\n", 1).is_err());
        assert!(parse_stat_output("F 6z4 0 0\n", 1).is_err());
        assert!(parse_stat_output("", 1).is_err());
    }

    #[test]
    fn parents() {
        assert_eq!(parent("/a/b"), Some("/a"));
        assert_eq!(parent("/a"), Some("/"));
        assert_eq!(parent("a"), None);
    }
}
