//! An in-memory host for unit tests: a file tree in a map, a passwd, a set
//! of binaries, and scripted command responses — including the failures a
//! real host produces (nonzero exits, timeouts, garbage output), so walker
//! tests can check that each one stops the walk cleanly.
//!
//! Commands are matched by substring against their display form (the full
//! `env -i … sh -c '…'` line); the first matching rule wins, and an
//! unmatched command exits 0 with no output. `getent passwd NAME` answers
//! from the configured accounts. Every command and mutation is logged.

use crate::host::{
    Cmd, CmdOutput, FileAttrs, Host, HostError, KeptLogin, Login, PathKind, Stat, sha256_hex,
};
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
    /// The login (what `login()` finds: set it before the first use).
    pub login: Login,
    kept_login: KeptLogin,
    /// Name shown in messages.
    pub name: String,
    /// Boots so far: `reconnect` after a reboot command starts a new one
    /// (the boot_id changes).
    pub boots: u32,
    /// A reboot command ran since the last reconnect.
    pub reboot_pending: bool,
    /// Host operations so far (commands and file operations; a batch
    /// script is one): what each would cost over SSH, an exec channel.
    pub trips: usize,
    /// Inside a batch script (its operations are not trips of their own).
    in_batch: bool,
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
            kept_login: KeptLogin::default(),
            name: "mem".into(),
            boots: 1,
            reboot_pending: false,
            trips: 0,
            in_batch: false,
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

    /// Commands run so far (display form), with those a batch script ran.
    pub fn commands(&self) -> Vec<&str> {
        self.log
            .iter()
            .filter_map(|l| l.strip_prefix("run ").or_else(|| l.strip_prefix("sub ")))
            .collect()
    }

    /// How many round trips the walk cost: host operations, commands and
    /// file operations alike (each an exec channel over SSH; a batch script
    /// is one).
    pub fn round_trips(&self) -> usize {
        self.trips
    }

    fn trip(&mut self) {
        if !self.in_batch {
            self.trips += 1;
        }
    }

    /// The scripted answer to a command line, if a rule has one.
    fn respond(&mut self, line: &str) -> Option<Response> {
        let once = self
            .once
            .iter()
            .position(|(p, _)| line.contains(p.as_str()))
            .map(|i| self.once.remove(i).1);
        once.or_else(|| {
            self.rules
                .iter()
                .find(|(p, _)| line.contains(p.as_str()))
                .map(|(_, r)| r.clone())
        })
    }

    /// Runs a walker's batch script (see `walk::batch`) as a shell would:
    /// statements of marker `printf`s, `__rc` bookkeeping, `&&`, `||`,
    /// `if … fi` and `exit`, each command in it answered by the rules (and
    /// the directories, links and removals of the file-operation scripts
    /// made in the tree). Logged as `sub <command>` each.
    fn run_batch(&mut self, script: &str) -> Result<CmdOutput, HostError> {
        let mut out = CmdOutput::default();
        let (mut rc, mut last) = (0i32, 0i32);
        for stmt in split_unquoted(script, &["\n"]) {
            let mut skipping = false;
            let mut op = ";".to_string();
            for seg in split_ops(&stmt) {
                let (sep, text) = seg;
                let run_it = match op.as_str() {
                    "&&" => last == 0,
                    "||" => last != 0,
                    _ => true,
                };
                op = sep;
                let mut w = words(&text);
                if w.first().map(String::as_str) == Some("then") {
                    w.remove(0);
                }
                if w.first().map(String::as_str) == Some("fi") {
                    skipping = false;
                    continue;
                }
                if skipping || !run_it || w.is_empty() {
                    continue;
                }
                match w[0].as_str() {
                    "if" => skipping = rc != 0,
                    "[" => last = i32::from(rc != 0),
                    "exit" => {
                        out.status = rc;
                        return Ok(out);
                    }
                    "__rc=$?" => rc = last,
                    "printf" => {
                        let kind = if w[1].contains("end") {
                            format!("end {} {rc}", w.get(3).cloned().unwrap_or_default())
                        } else {
                            // `'\n@@charly-%s <part> %s\n'`
                            let part = w[1].split_whitespace().nth(1).unwrap_or("part").to_string();
                            format!("{part} {}", w.get(3).cloned().unwrap_or_default())
                        };
                        out.stdout.extend_from_slice(
                            format!(
                                "\n@@charly-{} {kind}\n",
                                w.get(2).cloned().unwrap_or_default()
                            )
                            .as_bytes(),
                        );
                        last = 0;
                    }
                    _ => {
                        let argv: Vec<String> =
                            w.into_iter().filter(|x| x != "</dev/null").collect();
                        let line = charly_rules::sh::join_min(&argv);
                        self.log.push(format!("sub {line}"));
                        let o = self.answer(&argv, &line)?;
                        out.stdout.extend_from_slice(&o.stdout);
                        out.stderr.extend_from_slice(&o.stderr);
                        last = o.status;
                    }
                }
            }
        }
        out.status = 0;
        Ok(out)
    }

    /// A command's answer: a rule's, else what the built-in behaviours
    /// (boot id, reboot, getent, file-operation scripts) make of it.
    fn answer(&mut self, argv: &[String], line: &str) -> Result<CmdOutput, HostError> {
        if let Some(r) = self.respond(line) {
            return self.scripted(r, line);
        }
        let script = argv.last().cloned().unwrap_or_default();
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
        let getent = script
            .trim()
            .strip_prefix("getent passwd ")
            .map(|n| n.trim().trim_matches('\'').to_string());
        if let Some(name) = getent {
            return Ok(self.getent_passwd(&name));
        }
        // A stat script (`host::stat_script`): answered from the tree.
        if let Some(first) = script
            .lines()
            .next()
            .filter(|_| script.contains("for p in \"$@\""))
            && let Some(list) = first.strip_prefix("set --")
        {
            return self.stat_script(list);
        }
        // Inline file reads and writes (`shellops::read_inline_script`,
        // `write_inline_script`): from and into the tree.
        if script.starts_with("p=") && script.contains("base64 -w0") {
            return Ok(self.read_inline(&script));
        }
        if let Some((_, rest)) = script.split_once("<<'CHARLY_DATA'\n")
            && let Some((b64, tail)) = rest.split_once("CHARLY_DATA\n")
        {
            return self.write_inline(b64, tail);
        }
        // The file-operation scripts (`shellops`): made in the tree.
        self.file_ops(&script)?;
        Ok(CmdOutput::default())
    }

    /// What a scripted response gives for the command `line`: its exit, or
    /// a timeout.
    fn scripted(&self, r: Response, line: &str) -> Result<CmdOutput, HostError> {
        match r {
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
                what: line.chars().take(60).collect(),
                secs: 0,
            }),
        }
    }

    /// `getent passwd NAME`: the account's passwd line, else exit 2.
    fn getent_passwd(&self, name: &str) -> CmdOutput {
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
        }
    }

    /// A stat script's output for the paths of its `set --` line `list`:
    /// one `N`, `D`, `F`, `L` (with the hex target) or `O` record a path.
    fn stat_script(&mut self, list: &str) -> Result<CmdOutput, HostError> {
        let paths = words(list);
        let stats = self.stat(&paths, false)?;
        let mut text = String::new();
        for st in stats {
            match st {
                None => text.push_str("N\n"),
                Some(st) => {
                    let ids = format!("{:o} {} {}", st.mode, st.uid, st.gid);
                    match st.kind {
                        PathKind::Dir => text.push_str(&format!("D {ids}\n")),
                        PathKind::File { .. } => text.push_str(&format!("F {ids}\n")),
                        PathKind::Symlink { target } => {
                            let hex: String = target.bytes().map(|b| format!("{b:02x}")).collect();
                            text.push_str(&format!("L {ids}\n{hex}0a\n"));
                        }
                        PathKind::Other => text.push_str("O\n"),
                    }
                }
            }
        }
        Ok(CmdOutput {
            status: 0,
            stdout: text.into_bytes(),
            stderr: Vec::new(),
        })
    }

    /// An inline read script: the file named by its `p=` as base64 (empty
    /// when it is not a file in the tree).
    fn read_inline(&self, script: &str) -> CmdOutput {
        use base64::Engine as _;
        let path = words(script.split(';').next().unwrap_or_default())
            .first()
            .and_then(|w| w.strip_prefix("p=").map(String::from))
            .unwrap_or_default();
        let text = match self.files.get(&path) {
            Some(MemNode::File { data, .. }) => {
                base64::engine::general_purpose::STANDARD.encode(data)
            }
            _ => String::new(),
        };
        CmdOutput {
            status: 0,
            stdout: text.into_bytes(),
            stderr: Vec::new(),
        }
    }

    /// An inline write script: the base64 data `b64` written into the tree
    /// with the mode, owner and destination its `tail` commands give.
    fn write_inline(&mut self, b64: &str, tail: &str) -> Result<CmdOutput, HostError> {
        use base64::Engine as _;
        let data = base64::engine::general_purpose::STANDARD
            .decode(b64.replace('\n', ""))
            .map_err(|e| self.err("write", "(inline)", &e.to_string()))?;
        let mut attrs = FileAttrs::default();
        let mut dest = None;
        for l in tail.lines() {
            let w = words(l);
            let w: Vec<&str> = w.iter().map(String::as_str).collect();
            match w.as_slice() {
                ["chmod", mode, "$t"] => {
                    attrs.mode = u32::from_str_radix(mode, 8).unwrap_or(0o644);
                }
                ["chown", owner, "$t"] => {
                    attrs.owner = owner
                        .split_once(':')
                        .and_then(|(u, g)| Some((u.parse().ok()?, g.parse().ok()?)));
                }
                ["mv", "-f", "$t", p] => dest = Some(p.to_string()),
                _ => {}
            }
        }
        if let Some(p) = dest {
            self.write_file(&p, &data, &attrs)?;
        }
        Ok(CmdOutput::default())
    }

    /// The `mkdir -m`, `ln -s` and `rm -f` lines of a file-operation script,
    /// made in the tree (other lines are ignored).
    fn file_ops(&mut self, script: &str) -> Result<(), HostError> {
        for l in script.lines() {
            let w = words(l);
            let w: Vec<&str> = w.iter().map(String::as_str).collect();
            match w.as_slice() {
                ["mkdir", "-m", mode, p] => {
                    let mode = u32::from_str_radix(mode, 8).unwrap_or(0o755);
                    self.mkdir(
                        p,
                        &FileAttrs {
                            mode,
                            ..FileAttrs::default()
                        },
                    )?;
                }
                ["ln", "-s", "--", t, p] => self.symlink(p, t, &FileAttrs::default())?,
                ["rm", "-f", "--", p] => {
                    self.remove(p, false)?;
                }
                _ => {}
            }
        }
        Ok(())
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

    fn kept_login(&mut self) -> &mut KeptLogin {
        &mut self.kept_login
    }

    fn find_login(&mut self) -> Result<Login, HostError> {
        Ok(self.login.clone())
    }

    fn run(&mut self, cmd: &Cmd) -> Result<CmdOutput, HostError> {
        let login = self.login()?;
        let line = cmd.display(&login, false);
        self.log.push(format!("run {line}"));
        let script = cmd.argv.last().cloned().unwrap_or_default();
        self.trip();
        if script.contains("@@charly-") && script.contains("__rc") {
            self.in_batch = true;
            let r = self.run_batch(&script);
            self.in_batch = false;
            return r;
        }
        match self.answer(&cmd.argv, &line) {
            Err(HostError::Timeout { host, .. }) => Err(HostError::Timeout {
                host,
                what: cmd.what(),
                secs: cmd.timeout.map_or(0, |t| t.as_secs()),
            }),
            r => r,
        }
    }

    fn read_file(&mut self, path: &str, _privileged: bool) -> Result<Option<Vec<u8>>, HostError> {
        self.trip();
        match self.files.get(path) {
            Some(MemNode::File { data, .. }) => Ok(Some(data.clone())),
            Some(_) => Err(self.err("read", path, "not a regular file")),
            None => Ok(None),
        }
    }

    fn write_file(&mut self, path: &str, data: &[u8], attrs: &FileAttrs) -> Result<(), HostError> {
        self.trip();
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
        self.trip();
        Ok(self
            .binaries
            .contains(name)
            .then(|| format!("{}/{name}", path.split(':').next().unwrap_or("/usr/bin"))))
    }

    fn stat(&mut self, paths: &[String], digest: bool) -> Result<Vec<Option<Stat>>, HostError> {
        self.trip();
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
        self.trip();
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
        self.trip();
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
        self.trip();
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
        self.trip();
        let entries =
            charly_files::artifact::read_tar(tar, "").map_err(|e| HostError::Garbage {
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
                charly_files::artifact::Kind::Dir => {
                    if matches!(self.files.get(&p), Some(MemNode::Dir { .. })) {
                        continue;
                    }
                    MemNode::Dir { mode: e.mode }
                }
                charly_files::artifact::Kind::Symlink(t) => MemNode::Symlink { target: t },
                charly_files::artifact::Kind::File(data) => MemNode::File {
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
        // A new session: its account is found again, as over SSH.
        self.kept_login.forget();
        if std::mem::take(&mut self.reboot_pending) {
            self.boots += 1;
        }
        Ok(())
    }
}

/// `text` split at the unquoted occurrences of `seps` (single and double
/// quotes and backslash escapes respected), pieces kept as written.
fn split_unquoted(text: &str, seps: &[&str]) -> Vec<String> {
    split_ops_with(text, seps)
        .into_iter()
        .map(|(_, t)| t)
        .filter(|t| !t.trim().is_empty())
        .collect()
}

/// A statement's simple commands, each with the operator that follows it
/// (`;`, `&&`, `||`; `;` at the end).
fn split_ops(stmt: &str) -> Vec<(String, String)> {
    split_ops_with(stmt, &["&&", "||", ";"])
}

fn split_ops_with(text: &str, seps: &[&str]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let (mut sq, mut dq) = (false, false);
    let mut i = 0;
    let b = text.as_bytes();
    while i < b.len() {
        let c = b[i] as char;
        if !sq
            && !dq
            && let Some(sep) = seps.iter().find(|s| text[i..].starts_with(**s))
        {
            out.push((sep.to_string(), std::mem::take(&mut cur)));
            i += sep.len();
            continue;
        }
        match c {
            '\'' if !dq => sq = !sq,
            '"' if !sq => dq = !dq,
            '\\' if !sq && i + 1 < b.len() => {
                cur.push(c);
                i += 1;
                cur.push(b[i] as char);
                i += 1;
                continue;
            }
            _ => {}
        }
        cur.push(c);
        i += 1;
    }
    out.push((";".to_string(), cur));
    out
}

/// The words of a simple command, unquoted as a POSIX shell does (single
/// and double quotes, backslash escapes).
fn words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut any = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                any = true;
                for d in chars.by_ref() {
                    if d == '\'' {
                        break;
                    }
                    cur.push(d);
                }
            }
            '"' => {
                any = true;
                while let Some(d) = chars.next() {
                    match d {
                        '"' => break,
                        '\\' => {
                            if let Some(e) = chars.next() {
                                cur.push(e);
                            }
                        }
                        _ => cur.push(d),
                    }
                }
            }
            '\\' => {
                if let Some(e) = chars.next() {
                    cur.push(e);
                    any = true;
                }
            }
            c if c.is_whitespace() => {
                if any || !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            c => cur.push(c),
        }
    }
    if any || !cur.is_empty() {
        out.push(cur);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The login is found once, then kept; a sudo password given before or
    /// after it is found goes with it, and stays across a reconnect (which
    /// finds the account again).
    #[test]
    fn a_sudo_password_stays_with_the_login_across_a_reconnect() {
        let mut h = MemHost::new("vm", 1);
        h.login = Login::new("user", 1000);
        let pw = crate::host::Secret::new("s3cret").expect("a password");
        h.set_sudo_password(Some(pw.clone())).expect("set");
        let l = h.login().expect("login");
        assert_eq!((l.name.as_str(), l.uid), ("user", 1000));
        assert!(l.sudo_password.is_some());
        // Kept: a change of the account is not seen until a reconnect.
        h.login = Login::new("other", 1001);
        assert_eq!(h.login().expect("login").uid, 1000);
        h.reconnect(Duration::from_secs(1)).expect("reconnect");
        let l = h.login().expect("login");
        assert_eq!((l.name.as_str(), l.uid), ("other", 1001));
        assert!(l.sudo_password.is_some(), "the password was lost");
        h.set_sudo_password(None).expect("unset");
        assert!(h.login().expect("login").sudo_password.is_none());
    }

    #[test]
    fn words_and_statements_split_as_a_shell_does() {
        assert_eq!(
            words("env -i 'A=b c' /bin/sh -c 'it'\\''s \"q\"' \"$__rc\""),
            ["env", "-i", "A=b c", "/bin/sh", "-c", "it's \"q\"", "$__rc"]
        );
        let s = split_unquoted("a 'x\ny'\nb; c && d", &["\n"]);
        assert_eq!(s, ["a 'x\ny'", "b; c && d"]);
        assert_eq!(
            split_ops("b; c && d || e"),
            [
                (";".to_string(), "b".to_string()),
                ("&&".to_string(), " c ".to_string()),
                ("||".to_string(), " d ".to_string()),
                (";".to_string(), " e".to_string())
            ]
        );
    }
}
