//! An in-memory host for unit tests: a file tree in a map, a passwd, a set
//! of binaries, and scripted command responses — including the failures a
//! real host produces (nonzero exits, timeouts, garbage output), so walker
//! tests can check that each one stops the walk cleanly.
//!
//! Commands are matched by substring against their display form (the full
//! `env -i … sh -c '…'` line); the first matching rule wins, and an
//! unmatched command exits 0 with no output. `getent passwd NAME` answers
//! from the configured accounts. Every command and mutation is logged.

use crate::host::{Cmd, CmdOutput, FileAttrs, Host, HostError, Login, PathKind, Stat, sha256_hex};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// One node of the in-memory tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemNode {
    /// A file.
    File {
        /// Content.
        data: Vec<u8>,
        /// Mode.
        mode: u32,
        /// Owner.
        uid: u32,
        /// Group.
        gid: u32,
    },
    /// A directory.
    Dir {
        /// Mode.
        mode: u32,
    },
    /// A symbolic link.
    Symlink {
        /// Target.
        target: String,
    },
}

/// What a scripted command does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Response {
    /// Exit with a status and output.
    Exit {
        /// Status.
        status: i32,
        /// Standard output.
        stdout: String,
        /// Standard error.
        stderr: String,
    },
    /// Never finish: the host reports a timeout.
    Timeout,
}

impl Response {
    /// Exit 0 with this output.
    pub fn ok(stdout: &str) -> Self {
        Response::Exit {
            status: 0,
            stdout: stdout.into(),
            stderr: String::new(),
        }
    }

    /// Exit with a status and a message on stderr.
    pub fn fail(status: i32, stderr: &str) -> Self {
        Response::Exit {
            status,
            stdout: String::new(),
            stderr: stderr.into(),
        }
    }
}

/// The in-memory host.
#[derive(Clone, Debug)]
pub struct MemHost {
    /// The file tree by absolute path.
    pub files: BTreeMap<String, MemNode>,
    /// Executables by name (found in any PATH directory).
    pub binaries: BTreeSet<String>,
    /// Scripted responses: substring → response.
    pub rules: Vec<(String, Response)>,
    /// Responses used once (before `rules`), in order: the first match is
    /// taken out (a package absent before its install, present after).
    pub once: Vec<(String, Response)>,
    /// passwd lines (`name:x:uid:gid::home:shell`).
    pub passwd: Vec<String>,
    /// Everything that happened, in order.
    pub log: Vec<String>,
    /// The login.
    pub login: Login,
    /// Name shown in messages.
    pub name: String,
    /// Boots so far: `reconnect` after a reboot command starts a new one
    /// (the boot_id changes).
    pub boots: u32,
    /// A reboot command ran since the last reconnect.
    pub reboot_pending: bool,
}

impl MemHost {
    /// A host with `/`, `/etc`, `/home/<user>` and the usual binaries,
    /// logged in as root.
    pub fn new(user: &str, uid: u32) -> Self {
        let mut h = MemHost {
            files: BTreeMap::new(),
            binaries: [
                "sh",
                "bash",
                "env",
                "tar",
                "sudo",
                "systemctl",
                "apt-get",
                "dpkg-query",
                "dpkg",
                "getent",
            ]
            .into_iter()
            .map(String::from)
            .collect(),
            rules: Vec::new(),
            once: Vec::new(),
            passwd: vec![
                "root:x:0:0:root:/root:/bin/bash".into(),
                format!("{user}:x:{uid}:{uid}::/home/{user}:/bin/bash"),
            ],
            log: Vec::new(),
            login: Login::new("root", 0),
            name: "mem".into(),
            boots: 1,
            reboot_pending: false,
        };
        for d in ["/", "/etc", "/home", "/root"] {
            h.files.insert(d.into(), MemNode::Dir { mode: 0o755 });
        }
        h.files
            .insert(format!("/home/{user}"), MemNode::Dir { mode: 0o755 });
        h
    }

    /// Adds a scripted response.
    pub fn on(&mut self, pattern: &str, r: Response) -> &mut Self {
        self.rules.push((pattern.into(), r));
        self
    }

    /// Adds a response used once, before the rules.
    pub fn once(&mut self, pattern: &str, r: Response) -> &mut Self {
        self.once.push((pattern.into(), r));
        self
    }

    /// Commands run so far (display form).
    pub fn commands(&self) -> Vec<&str> {
        self.log
            .iter()
            .filter_map(|l| l.strip_prefix("run "))
            .collect()
    }

    fn err(&self, op: &str, path: &str, m: &str) -> HostError {
        HostError::Io {
            host: self.name.clone(),
            op: op.into(),
            path: path.into(),
            message: m.into(),
        }
    }

    fn parent_is_dir(&self, path: &str) -> bool {
        match crate::host::parent(path) {
            Some(p) => matches!(self.files.get(p), Some(MemNode::Dir { .. })),
            None => false,
        }
    }
}

impl Host for MemHost {
    fn describe(&self) -> String {
        self.name.clone()
    }

    fn root(&self) -> Option<&str> {
        None
    }

    fn set_sudo_password(&mut self, pw: Option<crate::host::Secret>) -> Result<(), HostError> {
        self.login.sudo_password = pw;
        Ok(())
    }

    fn login(&mut self) -> Result<Login, HostError> {
        Ok(self.login.clone())
    }

    fn run(&mut self, cmd: &Cmd) -> Result<CmdOutput, HostError> {
        let line = cmd.display(&self.login, false);
        self.log.push(format!("run {line}"));
        let once = self
            .once
            .iter()
            .position(|(p, _)| line.contains(p.as_str()))
            .map(|i| self.once.remove(i).1);
        if let Some(r) = once.or_else(|| {
            self.rules
                .iter()
                .find(|(p, _)| line.contains(p.as_str()))
                .map(|(_, r)| r.clone())
        }) {
            return match r {
                Response::Exit {
                    status,
                    stdout,
                    stderr,
                } => Ok(CmdOutput {
                    status,
                    stdout: stdout.into_bytes(),
                    stderr: stderr.into_bytes(),
                }),
                Response::Timeout => Err(HostError::Timeout {
                    host: self.name.clone(),
                    what: cmd.what(),
                    secs: cmd.timeout.map_or(0, |t| t.as_secs()),
                }),
            };
        }
        let script = cmd.argv.last().cloned().unwrap_or_default();
        if script.contains("/proc/sys/kernel/random/boot_id") {
            return Ok(CmdOutput {
                status: 0,
                stdout: format!("boot-{}\n", self.boots).into_bytes(),
                stderr: Vec::new(),
            });
        }
        if script.contains("systemctl reboot") {
            self.reboot_pending = true;
            return Ok(CmdOutput::default());
        }
        let getent = cmd
            .argv
            .last()
            .and_then(|s| s.trim().strip_prefix("getent passwd "))
            .map(|n| n.trim().trim_matches('\'').to_string());
        if let Some(name) = getent {
            let name = &name;
            return Ok(
                match self
                    .passwd
                    .iter()
                    .find(|l| l.split(':').next() == Some(name))
                {
                    Some(l) => CmdOutput {
                        status: 0,
                        stdout: format!("{l}\n").into_bytes(),
                        stderr: Vec::new(),
                    },
                    None => CmdOutput {
                        status: 2,
                        ..CmdOutput::default()
                    },
                },
            );
        }
        Ok(CmdOutput::default())
    }

    fn read_file(&mut self, path: &str, _privileged: bool) -> Result<Option<Vec<u8>>, HostError> {
        match self.files.get(path) {
            Some(MemNode::File { data, .. }) => Ok(Some(data.clone())),
            Some(_) => Err(self.err("read", path, "not a regular file")),
            None => Ok(None),
        }
    }

    fn write_file(&mut self, path: &str, data: &[u8], attrs: &FileAttrs) -> Result<(), HostError> {
        if !self.parent_is_dir(path) {
            return Err(self.err("write", path, "no parent directory"));
        }
        if matches!(self.files.get(path), Some(MemNode::Dir { .. })) {
            return Err(self.err("write", path, "is a directory"));
        }
        self.log.push(format!("write {path}"));
        let (uid, gid) = attrs.owner.unwrap_or((self.login.uid, self.login.uid));
        self.files.insert(
            path.into(),
            MemNode::File {
                data: data.to_vec(),
                mode: attrs.mode,
                uid,
                gid,
            },
        );
        Ok(())
    }

    fn which(&mut self, name: &str, path: &str) -> Result<Option<String>, HostError> {
        Ok(self
            .binaries
            .contains(name)
            .then(|| format!("{}/{name}", path.split(':').next().unwrap_or("/usr/bin"))))
    }

    fn stat(&mut self, paths: &[String], digest: bool) -> Result<Vec<Option<Stat>>, HostError> {
        Ok(paths
            .iter()
            .map(|p| {
                self.files.get(p).map(|n| match n {
                    MemNode::File {
                        data,
                        mode,
                        uid,
                        gid,
                    } => Stat {
                        kind: PathKind::File {
                            sha256: digest.then(|| sha256_hex(data)),
                        },
                        mode: *mode,
                        uid: *uid,
                        gid: *gid,
                    },
                    MemNode::Dir { mode } => Stat {
                        kind: PathKind::Dir,
                        mode: *mode,
                        uid: 0,
                        gid: 0,
                    },
                    MemNode::Symlink { target } => Stat {
                        kind: PathKind::Symlink {
                            target: target.clone(),
                        },
                        mode: 0o777,
                        uid: 0,
                        gid: 0,
                    },
                })
            })
            .collect())
    }

    fn mkdir(&mut self, path: &str, attrs: &FileAttrs) -> Result<(), HostError> {
        if self.files.contains_key(path) {
            return Err(self.err("mkdir", path, "exists"));
        }
        if !self.parent_is_dir(path) {
            return Err(self.err("mkdir", path, "no parent directory"));
        }
        self.log.push(format!("mkdir {path}"));
        self.files
            .insert(path.into(), MemNode::Dir { mode: attrs.mode });
        Ok(())
    }

    fn symlink(&mut self, path: &str, target: &str, _attrs: &FileAttrs) -> Result<(), HostError> {
        if self.files.contains_key(path) {
            return Err(self.err("symlink", path, "exists"));
        }
        if !self.parent_is_dir(path) {
            return Err(self.err("symlink", path, "no parent directory"));
        }
        self.log.push(format!("symlink {path}"));
        self.files.insert(
            path.into(),
            MemNode::Symlink {
                target: target.into(),
            },
        );
        Ok(())
    }

    fn remove(&mut self, path: &str, _privileged: bool) -> Result<bool, HostError> {
        if let Some(MemNode::Dir { .. }) = self.files.get(path) {
            let prefix = format!("{}/", path.trim_end_matches('/'));
            if self.files.keys().any(|k| k.starts_with(&prefix)) {
                return Ok(false);
            }
        }
        if self.files.remove(path).is_some() {
            self.log.push(format!("remove {path}"));
        }
        Ok(true)
    }

    fn extract_tar(&mut self, tar: &[u8], _privileged: bool) -> Result<(), HostError> {
        let entries =
            charly_engine::artifact::read_tar(tar, "").map_err(|e| HostError::Garbage {
                host: self.name.clone(),
                what: "tar".into(),
                output: e.to_string(),
            })?;
        self.log.push(format!("extract {} entries", entries.len()));
        for e in entries {
            let p = format!("/{}", e.path);
            // Parents exist in a well-formed tar (sorted); create any that do not.
            let mut cur = String::new();
            for comp in p
                .trim_start_matches('/')
                .split('/')
                .collect::<Vec<_>>()
                .split_last()
                .map(|(_, d)| d.to_vec())
                .unwrap_or_default()
            {
                cur.push('/');
                cur.push_str(comp);
                self.files
                    .entry(cur.clone())
                    .or_insert(MemNode::Dir { mode: 0o755 });
            }
            let node = match e.kind {
                charly_engine::artifact::Kind::Dir => {
                    if matches!(self.files.get(&p), Some(MemNode::Dir { .. })) {
                        continue;
                    }
                    MemNode::Dir { mode: e.mode }
                }
                charly_engine::artifact::Kind::Symlink(t) => MemNode::Symlink { target: t },
                charly_engine::artifact::Kind::File(data) => MemNode::File {
                    data,
                    mode: e.mode,
                    uid: e.uid as u32,
                    gid: e.gid as u32,
                },
            };
            self.files.insert(p, node);
        }
        Ok(())
    }

    fn reconnect(&mut self, _timeout: Duration) -> Result<(), HostError> {
        self.log.push("reconnect".into());
        if std::mem::take(&mut self.reboot_pending) {
            self.boots += 1;
        }
        Ok(())
    }
}
