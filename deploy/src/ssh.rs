//! A host over SSH (russh, ring backend, on a private tokio runtime).
//!
//! One connection per host, opened once and reused for every command;
//! each command is an `exec` on a fresh channel of it. Authentication is
//! an ed25519 (or any OpenSSH) private key; the server's key must be in
//! the given known_hosts file — an unknown or changed key refuses the
//! connection, naming the host and the key's fingerprint (never blind
//! trust). File operations are the POSIX scripts of [`crate::shellops`]
//! (content on the channel's stdin, `mktemp` + `mv` for atomic writes);
//! system-scope steps run under `sudo -n` unless the login is root.

use crate::host::{Cmd, CmdOutput, FileAttrs, Host, HostError, KeptLogin, Login, Stat};
use crate::shellops;
use charly_rules::sh;
use russh::keys::{HashAlg, PrivateKeyWithHashAlg, PublicKeyOrCertificate};
use russh::{ChannelMsg, client};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Where and how to connect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SshTarget {
    /// Login name.
    pub user: String,
    /// Host name or address.
    pub host: String,
    /// Port.
    pub port: u16,
    /// Private key file.
    pub identity: PathBuf,
    /// known_hosts file.
    pub known_hosts: PathBuf,
}

impl SshTarget {
    /// Parses `USER@HOST[:PORT]` (`[v6addr]:PORT` for IPv6).
    pub fn parse(spec: &str, identity: &Path, known_hosts: &Path) -> Result<SshTarget, String> {
        let (user, rest) = spec
            .split_once('@')
            .filter(|(u, h)| !u.is_empty() && !h.is_empty())
            .ok_or_else(|| format!("--host `{spec}`: expected USER@HOST[:PORT]"))?;
        let (host, port) = if let Some(r) = rest.strip_prefix('[') {
            let (h, p) = r
                .split_once(']')
                .ok_or_else(|| format!("--host `{spec}`: unclosed `[`"))?;
            (h.to_string(), p.strip_prefix(':'))
        } else {
            match rest.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (rest.to_string(), None),
            }
        };
        let port = match port {
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| format!("--host `{spec}`: bad port `{p}`"))?,
            None => 22,
        };
        Ok(SshTarget {
            user: user.into(),
            host,
            port,
            identity: identity.into(),
            known_hosts: known_hosts.into(),
        })
    }

    fn describe(&self) -> String {
        format!("ssh {}@{}:{}", self.user, self.host, self.port)
    }
}

struct Checker {
    host: String,
    port: u16,
    known_hosts: PathBuf,
    refusal: Arc<Mutex<Option<String>>>,
}

impl client::Handler for Checker {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        key: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        let PublicKeyOrCertificate::PublicKey { key, .. } = key else {
            *self.refusal.lock().expect("lock") =
                Some("the server offered a certificate; charly checks plain host keys only".into());
            return Ok(false);
        };
        let fp = key.fingerprint(HashAlg::Sha256);
        let name = if self.port == 22 {
            self.host.clone()
        } else {
            format!("[{}]:{}", self.host, self.port)
        };
        let why = match russh::keys::check_known_hosts_path(
            &self.host,
            self.port,
            key,
            &self.known_hosts,
        ) {
            Ok(true) => return Ok(true),
            Ok(false) => format!(
                "{name} is not in {} (its {} key is {fp}); add it after checking the fingerprint, e.g. `ssh-keyscan -p {} {} >> {}`",
                self.known_hosts.display(),
                key.algorithm(),
                self.port,
                self.host,
                self.known_hosts.display()
            ),
            Err(russh::keys::Error::KeyChanged { line }) => format!(
                "the {} key of {name} is {fp}, which does NOT match line {line} of {} (possible man-in-the-middle, or the host was reinstalled)",
                key.algorithm(),
                self.known_hosts.display()
            ),
            Err(e) => format!(
                "cannot read {}: {e} (server key {fp})",
                self.known_hosts.display()
            ),
        };
        *self.refusal.lock().expect("lock") = Some(why);
        Ok(false)
    }
}

/// A host reached over SSH.
pub struct SshHost {
    target: SshTarget,
    rt: tokio::runtime::Runtime,
    handle: client::Handle<Checker>,
    login: KeptLogin,
    /// Exec channels opened so far (each command or file operation is one).
    channels: u64,
}

impl SshHost {
    /// How many exec channels this connection has opened: one per command
    /// or file operation (a batch of steps is one), the round trips a walk
    /// costs.
    pub fn channels(&self) -> u64 {
        self.channels
    }

    /// Connects and authenticates.
    pub fn connect(target: &SshTarget, timeout: Duration) -> Result<SshHost, HostError> {
        Self::connect_waiting(target, timeout, Duration::ZERO, &mut |_| {})
    }

    /// [`SshHost::connect`], waiting up to `wait` for a machine that does
    /// not answer yet (booting: the connection is refused, reset or times
    /// out), trying again every second and telling `progress` every few
    /// seconds. A host key, identity or authentication refusal is never
    /// retried.
    pub fn connect_waiting(
        target: &SshTarget,
        timeout: Duration,
        wait: Duration,
        progress: &mut dyn FnMut(&str),
    ) -> Result<SshHost, HostError> {
        // One worker keeps the session task (keepalives, queued signals and
        // closes) running between calls.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| conn_err(target, format!("tokio runtime: {e}")))?;
        let started = std::time::Instant::now();
        let mut told = Duration::ZERO;
        let handle = loop {
            let try_for = if wait.is_zero() {
                timeout
            } else {
                timeout.min(
                    wait.saturating_sub(started.elapsed())
                        .max(Duration::from_secs(1)),
                )
            };
            match rt.block_on(open(target, try_for)) {
                Ok(h) => break h,
                Err(Opened::Refused(e)) => return Err(e),
                Err(Opened::NotYet(e)) => {
                    let waited = started.elapsed();
                    if waited + Duration::from_secs(1) >= wait {
                        return Err(if wait.is_zero() {
                            e
                        } else {
                            conn_err(
                                target,
                                format!("{e} (waited {} s for SSH to answer)", waited.as_secs()),
                            )
                        });
                    }
                    if waited >= told {
                        progress(&format!(
                            "waiting for SSH on {} ({} s of {} s): {e}",
                            target.describe(),
                            waited.as_secs(),
                            wait.as_secs()
                        ));
                        told = waited + Duration::from_secs(5);
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        };
        Ok(SshHost {
            channels: 0,
            target: target.clone(),
            rt,
            handle,
            login: KeptLogin::default(),
        })
    }

    fn err(&self, m: impl std::fmt::Display) -> HostError {
        conn_err(&self.target, m.to_string())
    }
}

fn conn_err(t: &SshTarget, message: String) -> HostError {
    HostError::Connection {
        host: t.describe(),
        message,
    }
}

/// Why a connection was not made: the machine does not answer yet (worth
/// another try while booting), or it answered and refused.
enum Opened {
    NotYet(HostError),
    Refused(HostError),
}

impl From<HostError> for Opened {
    fn from(e: HostError) -> Self {
        Opened::Refused(e)
    }
}

async fn open(t: &SshTarget, timeout: Duration) -> Result<client::Handle<Checker>, Opened> {
    let key = russh::keys::load_secret_key(&t.identity, None).map_err(|e| {
        conn_err(
            t,
            format!("cannot load identity {}: {e}", t.identity.display()),
        )
    })?;
    if !t.known_hosts.is_file() {
        return Err(Opened::Refused(HostError::HostKey {
            host: t.describe(),
            message: format!(
                "known_hosts file {} does not exist (charly never trusts an unknown host key)",
                t.known_hosts.display()
            ),
        }));
    }
    let refusal = Arc::new(Mutex::new(None));
    let checker = Checker {
        host: t.host.clone(),
        port: t.port,
        known_hosts: t.known_hosts.clone(),
        refusal: refusal.clone(),
    };
    let config = Arc::new(client::Config {
        keepalive_interval: Some(Duration::from_secs(30)),
        ..client::Config::default()
    });
    let connect = client::connect(config, (t.host.as_str(), t.port), checker);
    let res = tokio::time::timeout(timeout, connect).await.map_err(|_| {
        Opened::NotYet(conn_err(
            t,
            format!("connect timed out after {} s", timeout.as_secs()),
        ))
    })?;
    let mut handle = match res {
        Ok(h) => h,
        Err(e) => {
            if let Some(why) = refusal.lock().expect("lock").take() {
                return Err(Opened::Refused(HostError::HostKey {
                    host: t.describe(),
                    message: why,
                }));
            }
            // Refused, reset, unreachable, or closed before the handshake
            // ended: a machine still booting.
            return Err(Opened::NotYet(conn_err(t, format!("connect: {e}"))));
        }
    };
    let hash = handle
        .best_supported_rsa_hash()
        .await
        .map_err(|e| conn_err(t, e.to_string()))?
        .flatten();
    let auth = handle
        .authenticate_publickey(&t.user, PrivateKeyWithHashAlg::new(Arc::new(key), hash))
        .await
        .map_err(|e| conn_err(t, format!("authentication: {e}")))?;
    if !auth.success() {
        return Err(Opened::Refused(conn_err(
            t,
            format!(
                "the server refused key {} for user {}",
                t.identity.display(),
                t.user
            ),
        )));
    }
    Ok(handle)
}

/// Why an exec failed.
enum ExecError {
    /// The channel or connection failed.
    Failed(String),
    /// The time limit passed (the remote command was sent SIGKILL).
    TimedOut,
}

impl From<String> for ExecError {
    fn from(s: String) -> Self {
        ExecError::Failed(s)
    }
}

impl From<&str> for ExecError {
    fn from(s: &str) -> Self {
        ExecError::Failed(s.into())
    }
}

async fn exec(
    handle: &client::Handle<Checker>,
    line: String,
    stdin: Option<Vec<u8>>,
    timeout: Option<Duration>,
) -> Result<CmdOutput, ExecError> {
    let mut ch = handle
        .channel_open_session()
        .await
        .map_err(|e| format!("open channel: {e}"))?;
    ch.exec(true, line)
        .await
        .map_err(|e| format!("exec: {e}"))?;
    if let Some(data) = stdin {
        ch.data(&data[..])
            .await
            .map_err(|e| format!("send stdin: {e}"))?;
    }
    ch.eof().await.map_err(|e| format!("send eof: {e}"))?;
    let mut out = CmdOutput::default();
    let mut status = None;
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    loop {
        let msg = match deadline {
            Some(d) => match tokio::time::timeout_at(d, ch.wait()).await {
                Ok(m) => m,
                Err(_) => {
                    // Stop the remote command (sshd forwards the signal to
                    // what it started) and drop the channel; the
                    // connection stays usable.
                    let _ = ch.signal(russh::Sig::KILL).await;
                    let _ = ch.close().await;
                    return Err(ExecError::TimedOut);
                }
            },
            None => ch.wait().await,
        };
        let Some(msg) = msg else { break };
        match msg {
            ChannelMsg::Data { data } => out.stdout.extend_from_slice(&data),
            ChannelMsg::ExtendedData { data, ext: 1 } => out.stderr.extend_from_slice(&data),
            ChannelMsg::ExitStatus { exit_status } => status = Some(exit_status as i32),
            ChannelMsg::ExitSignal { signal_name, .. } => {
                status = Some(128 + signal_number(&signal_name));
            }
            _ => {}
        }
    }
    out.status = status.ok_or("the channel closed without an exit status")?;
    Ok(out)
}

fn signal_number(s: &russh::Sig) -> i32 {
    match s {
        russh::Sig::HUP => 1,
        russh::Sig::INT => 2,
        russh::Sig::QUIT => 3,
        russh::Sig::ABRT => 6,
        russh::Sig::KILL => 9,
        russh::Sig::SEGV => 11,
        russh::Sig::PIPE => 13,
        russh::Sig::ALRM => 14,
        russh::Sig::TERM => 15,
        _ => 127,
    }
}

impl Host for SshHost {
    fn describe(&self) -> String {
        self.target.describe()
    }

    fn root(&self) -> Option<&str> {
        None
    }

    fn kept_login(&mut self) -> &mut KeptLogin {
        &mut self.login
    }

    fn find_login(&mut self) -> Result<Login, HostError> {
        // The session's own account (a forced command may run it as
        // another user than the one that logged in).
        self.channels += 1;
        let out = self.rt.block_on(exec(
            &self.handle,
            "id -u && id -un".into(),
            None,
            Some(Duration::from_secs(60)),
        ));
        let out = match out {
            Ok(o) => o,
            Err(ExecError::Failed(e)) => return Err(self.err(e)),
            Err(ExecError::TimedOut) => return Err(self.err("`id -u` timed out after 60 s")),
        };
        let text = out.stdout_str();
        let mut lines = text.lines().map(str::trim);
        let garbage = || HostError::Garbage {
            host: self.describe(),
            what: "id -u && id -un".into(),
            output: crate::host::shorten(&text, 200),
        };
        let uid: u32 = lines
            .next()
            .and_then(|l| l.parse().ok())
            .ok_or_else(garbage)?;
        let name = lines
            .next()
            .filter(|n| charly_rules::names::user_name(n).is_ok())
            .map_or_else(|| self.target.user.clone(), String::from);
        Ok(Login::new(name, uid))
    }

    fn run(&mut self, cmd: &Cmd) -> Result<CmdOutput, HostError> {
        let login = self.login()?;
        // A command with a time limit carries a marker in its environment,
        // so a timeout can find and kill it and its children (sshd refuses
        // `signal` requests for root logins).
        let mut cmd = cmd.clone();
        let marker = cmd.timeout.map(|_| {
            static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            format!("{}-{n}-{nanos}", std::process::id())
        });
        if let Some(m) = &marker {
            cmd.env.insert("CHARLY_RUN".into(), m.clone());
        }
        let cmd = &cmd;
        let mut line = sh::join_min(&cmd.argv_for(&login, false));
        if let Some(c) = &cmd.cwd {
            line = format!("cd {} && {line}", sh::quote_min(c));
        }
        self.channels += 1;
        let res = self.rt.block_on(exec(
            &self.handle,
            line,
            cmd.stdin_for(&login, false),
            cmd.timeout,
        ));
        match res {
            Ok(o) => Ok(o),
            Err(ExecError::Failed(e)) => Err(self.err(e)),
            Err(ExecError::TimedOut) => {
                if let Some(m) = &marker {
                    let script = format!(
                        "for e in /proc/[0-9]*/environ; do if grep -qxz {} \"$e\" 2>/dev/null; then p=${{e#/proc/}}; kill -KILL \"${{p%/environ}}\" 2>/dev/null; fi; done; exit 0",
                        sh::quote_min(&format!("CHARLY_RUN={m}"))
                    );
                    let k = Cmd::sh(script).privileged(cmd.privileged || cmd.as_user.is_some());
                    let line = sh::join_min(&k.argv_for(&login, false));
                    self.channels += 1;
                    let _ = self.rt.block_on(exec(
                        &self.handle,
                        line,
                        k.stdin_for(&login, false),
                        Some(Duration::from_secs(30)),
                    ));
                }
                Err(HostError::Timeout {
                    host: self.describe(),
                    what: cmd.what(),
                    secs: cmd.timeout.map_or(0, |t| t.as_secs()),
                })
            }
        }
    }

    fn read_file(&mut self, path: &str, privileged: bool) -> Result<Option<Vec<u8>>, HostError> {
        shellops::read_file(self, path, privileged)
    }

    fn write_file(&mut self, path: &str, data: &[u8], attrs: &FileAttrs) -> Result<(), HostError> {
        shellops::write_file(self, path, data, attrs)
    }

    fn which(&mut self, name: &str, path: &str) -> Result<Option<String>, HostError> {
        shellops::which(self, name, path)
    }

    fn stat(&mut self, paths: &[String], digest: bool) -> Result<Vec<Option<Stat>>, HostError> {
        shellops::stat(self, paths, digest, false)
    }

    fn mkdir(&mut self, path: &str, attrs: &FileAttrs) -> Result<(), HostError> {
        shellops::mkdir(self, path, attrs)
    }

    fn symlink(&mut self, path: &str, target: &str, attrs: &FileAttrs) -> Result<(), HostError> {
        shellops::symlink(self, path, target, attrs)
    }

    fn remove(&mut self, path: &str, privileged: bool) -> Result<bool, HostError> {
        shellops::remove(self, path, privileged)
    }

    fn extract_tar(&mut self, tar: &[u8], privileged: bool) -> Result<(), HostError> {
        shellops::extract_tar(self, tar, privileged)
    }

    fn reconnect(&mut self, timeout: Duration) -> Result<(), HostError> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            match self
                .rt
                .block_on(open(&self.target, Duration::from_secs(10)))
            {
                Ok(h) => {
                    self.handle = h;
                    self.login.forget();
                    return Ok(());
                }
                Err(Opened::Refused(e @ HostError::HostKey { .. })) => return Err(e),
                Err(Opened::Refused(e) | Opened::NotYet(e))
                    if std::time::Instant::now() >= deadline =>
                {
                    return Err(e);
                }
                Err(_) => std::thread::sleep(Duration::from_secs(2)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_user_host_port() {
        let p = |s: &str| SshTarget::parse(s, Path::new("k"), Path::new("kh"));
        let t = p("root@127.0.0.1:2222").expect("ok");
        assert_eq!(
            (t.user.as_str(), t.host.as_str(), t.port),
            ("root", "127.0.0.1", 2222)
        );
        assert_eq!(p("u@h").expect("ok").port, 22);
        assert_eq!(p("u@[::1]:23").expect("ok").host, "::1");
        assert!(p("h:22").is_err());
        assert!(p("u@h:x").unwrap_err().contains("bad port"));
    }
}
