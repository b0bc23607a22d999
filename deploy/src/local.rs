//! The local host: this machine, optionally rooted at a directory.
//!
//! Rooted (`--root DIR`, and every test), target paths live below `DIR`, no
//! command is elevated and no user is switched: the root is a directory,
//! not a machine. Owners are applied only when charly runs as root (a
//! rooted tree written by an ordinary user belongs to that user).
//! Unrooted, file operations that need root while charly is not root go
//! through `sudo -n` shell scripts ([`crate::shellops`]); everything else
//! uses std directly.
//!
//! Commands run in their own process group, so a timeout kills the whole
//! tree (`kill -KILL -PGID`), not just the wrapper.

use crate::host::{
    BASE_PATH, Cmd, CmdOutput, FileAttrs, Host, HostError, KeptLogin, Login, PathKind, Stat,
    sha256_hex,
};
use crate::shellops;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// A root directory that cannot be opened.
fn open_root_err(dir: &Path, e: impl std::fmt::Display) -> HostError {
    HostError::Io {
        host: "local".into(),
        op: "open root".into(),
        path: dir.display().to_string(),
        message: e.to_string(),
    }
}

/// Why a [`LocalHost::preview`] of a missing root refuses a change.
const ABSENT_ROOT: &str = "the root directory does not exist (a dry run's view changes nothing)";

/// This machine.
pub struct LocalHost {
    root: Option<String>,
    /// The root, opened: every file operation of a rooted host goes
    /// through it, so no path leaves the root ([`charly_files::fsroot`]).
    froot: Option<charly_files::fsroot::Root>,
    login: KeptLogin,
    /// Rooted at a directory that does not exist ([`LocalHost::preview`]):
    /// everything in it reads as absent and nothing can change.
    absent: bool,
}

impl LocalHost {
    /// The real system.
    pub fn new() -> Self {
        LocalHost {
            root: None,
            froot: None,
            login: KeptLogin::default(),
            absent: false,
        }
    }

    /// Rooted at `dir` (made absolute).
    pub fn rooted(dir: &Path) -> Result<Self, HostError> {
        let abs = std::fs::canonicalize(dir).map_err(|e| open_root_err(dir, e))?;
        let froot = charly_files::fsroot::Root::open(&abs).map_err(|e| open_root_err(dir, e))?;
        Ok(LocalHost {
            root: Some(abs.to_string_lossy().into_owned()),
            froot: Some(froot),
            login: KeptLogin::default(),
            absent: false,
        })
    }

    /// Rooted at `dir` for a dry run: as [`LocalHost::rooted`] when `dir`
    /// exists; when it does not (yet), a view in which everything reads as
    /// absent and every change or command is refused (a dry run makes
    /// none), so previewing a deploy into a new directory creates nothing.
    pub fn preview(dir: &Path) -> Result<Self, HostError> {
        if std::fs::symlink_metadata(dir).is_ok() {
            return Self::rooted(dir);
        }
        let abs = std::path::absolute(dir).map_err(|e| open_root_err(dir, e))?;
        Ok(LocalHost {
            root: Some(abs.to_string_lossy().into_owned()),
            froot: None,
            login: KeptLogin::default(),
            absent: true,
        })
    }

    fn err(&self, op: &str, path: &str, e: impl std::fmt::Display) -> HostError {
        HostError::Io {
            host: self.describe(),
            op: op.into(),
            path: path.into(),
            message: e.to_string(),
        }
    }

    /// Whether a privileged operation must go through `sudo -n`.
    fn via_sudo(&mut self, privileged: bool) -> Result<bool, HostError> {
        Ok(privileged && self.root.is_none() && self.login()?.uid != 0)
    }

    /// Whether owners can be applied (charly runs as root).
    fn can_chown(&mut self) -> Result<bool, HostError> {
        Ok(self.login()?.uid == 0)
    }
}

impl Default for LocalHost {
    fn default() -> Self {
        Self::new()
    }
}

fn current_uid() -> u32 {
    std::fs::metadata("/proc/self").map_or(u32::MAX, |m| m.uid())
}

fn user_name(uid: u32) -> Option<String> {
    let text = std::fs::read_to_string("/etc/passwd").ok()?;
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() >= 3 && f[2].parse::<u32>().ok() == Some(uid)).then(|| f[0].to_string())
    })
}

/// Finds a program on a PATH (real paths).
fn find_on(name: &str, path: &str) -> Option<String> {
    if name.contains('/') {
        return Some(name.to_string());
    }
    path.split(':').filter(|d| !d.is_empty()).find_map(|d| {
        let p = Path::new(d).join(name);
        let m = std::fs::metadata(&p).ok()?;
        (m.is_file() && m.permissions().mode() & 0o111 != 0)
            .then(|| p.to_string_lossy().into_owned())
    })
}

impl LocalHost {
    /// A target path checked lexically (absolute, no `..` or `.`), relative
    /// to the root. Every host file operation starts here.
    fn rel(&self, op: &str, path: &str) -> Result<PathBuf, HostError> {
        if self.absent && !matches!(op, "read" | "stat") {
            return Err(self.err(op, path, ABSENT_ROOT));
        }
        charly_files::fsroot::target_rel(path).map_err(|e| self.err(op, path, e))
    }

    /// Temp files of killed writers in the directories `dirs` (target
    /// paths): removed when their writer is dead (nobody holds their lock);
    /// returns those that could not be removed, with why.
    fn sweep_local(&mut self, dirs: &[String]) -> Vec<(String, String)> {
        let mut left = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for d in dirs {
            let Ok(rel) = charly_files::fsroot::target_rel(d) else {
                continue;
            };
            if !seen.insert(rel.clone()) {
                continue;
            }
            let res = match &self.froot {
                Some(r) => r.sweep_temps(&rel, false),
                None => charly_files::fsroot::Root::open(Path::new("/"))
                    .and_then(|r| r.sweep_temps(&rel, false)),
            };
            match res {
                Ok(l) => left.extend(l.into_iter().map(|(p, why)| (p.display().to_string(), why))),
                Err(e) => left.push((d.clone(), e.to_string())),
            }
        }
        left
    }
}

impl LocalHost {
    /// A tar directory entry: made with its parents when missing.
    fn extract_dir(
        &mut self,
        rel: &Path,
        target: &str,
        mode: u32,
        owner: Option<(u32, u32)>,
    ) -> Result<(), HostError> {
        if let Some(r) = &self.froot {
            use rustix::fs::FileType;
            let kind = match r.lstat(rel) {
                Ok(Some(st)) => Some(FileType::from_raw_mode(st.st_mode)),
                _ => None,
            };
            if kind == Some(FileType::Symlink) {
                // A link to a directory inside the root, as merged /usr
                // trees have (`lib -> usr/lib`): entries go through it; a
                // link out of the root is refused by create_dir_all.
                r.create_dir_all(rel)
                    .map_err(|x| self.err("mkdir", target, x))?;
            } else if kind != Some(FileType::Directory) {
                if let Some(p) = rel.parent().filter(|p| !p.as_os_str().is_empty()) {
                    r.create_dir_all(p)
                        .map_err(|x| self.err("mkdir", target, x))?;
                }
                r.mkdir(rel, mode, owner)
                    .map_err(|x| self.err("mkdir", target, x))?;
            }
            return Ok(());
        }
        let real = PathBuf::from(self.real(target));
        if !real.is_dir() {
            std::fs::create_dir_all(&real).map_err(|x| self.err("mkdir", target, x))?;
            std::fs::set_permissions(&real, std::fs::Permissions::from_mode(mode))
                .map_err(|x| self.err("chmod", target, x))?;
            if let Some((u, g)) = owner {
                std::os::unix::fs::chown(&real, Some(u), Some(g))
                    .map_err(|x| self.err("chown", target, x))?;
            }
        }
        Ok(())
    }

    /// `stat` of one path below the root, never following the last component.
    fn stat_rooted(
        &self,
        r: &charly_files::fsroot::Root,
        rel: &Path,
        p: &str,
        digest: bool,
    ) -> Result<Option<Stat>, HostError> {
        use rustix::fs::FileType;
        let Some(st) = r.lstat(rel).map_err(|e| self.err("stat", p, e))? else {
            return Ok(None);
        };
        let kind = match FileType::from_raw_mode(st.st_mode) {
            FileType::Symlink => PathKind::Symlink {
                target: r
                    .read_link(rel)
                    .map_err(|e| self.err("readlink", p, e))?
                    .to_string_lossy()
                    .into_owned(),
            },
            FileType::Directory => PathKind::Dir,
            FileType::RegularFile => PathKind::File {
                sha256: if digest {
                    let data = r
                        .read(rel)
                        .map_err(|e| self.err("read", p, e))?
                        .unwrap_or_default();
                    Some(sha256_hex(&data))
                } else {
                    None
                },
            },
            _ => PathKind::Other,
        };
        Ok(Some(Stat {
            kind,
            mode: st.st_mode & 0o7777,
            uid: st.st_uid,
            gid: st.st_gid,
        }))
    }
}

impl Host for LocalHost {
    fn describe(&self) -> String {
        match &self.root {
            Some(r) => format!("local (root {r})"),
            None => "local".into(),
        }
    }

    fn root(&self) -> Option<&str> {
        self.root.as_deref()
    }

    fn kept_login(&mut self) -> &mut KeptLogin {
        &mut self.login
    }

    fn find_login(&mut self) -> Result<Login, HostError> {
        let uid = current_uid();
        let name = user_name(uid)
            .or_else(|| std::env::var("USER").ok())
            .unwrap_or_else(|| uid.to_string());
        Ok(Login::new(name, uid))
    }

    fn run(&mut self, cmd: &Cmd) -> Result<CmdOutput, HostError> {
        if self.absent {
            return Err(self.err("run", &cmd.what(), ABSENT_ROOT));
        }
        let login = self.login()?;
        let argv = cmd.argv_for(&login, self.root.is_some());
        let stdin = cmd.stdin_for(&login, self.root.is_some());
        let Some((prog, args)) = argv.split_first() else {
            return Err(self.err("run", "", "empty command"));
        };
        let prog_path = find_on(prog, BASE_PATH)
            .ok_or_else(|| self.err("run", prog, format!("`{prog}` is not on PATH {BASE_PATH}")))?;
        let mut c = std::process::Command::new(&prog_path);
        c.args(args)
            .env_clear()
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        if let Some(d) = &cmd.cwd {
            c.current_dir(d);
        }
        let mut child = c.spawn().map_err(|e| self.err("run", &cmd.what(), e))?;
        let pid = child.id();
        let stdin_thread = match (child.stdin.take(), stdin) {
            (Some(mut w), Some(data)) => Some(std::thread::spawn(move || {
                let _ = w.write_all(&data);
            })),
            _ => None,
        };
        let reader = |r: Option<Box<dyn Read + Send>>| {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                if let Some(mut r) = r {
                    let _ = r.read_to_end(&mut buf);
                }
                buf
            })
        };
        let out_t = reader(
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        );
        let err_t = reader(
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        );
        let start = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break s,
                Ok(None) => {}
                Err(e) => return Err(self.err("run", &cmd.what(), e)),
            }
            if let Some(t) = cmd.timeout
                && start.elapsed() > t
            {
                // The whole process group: sudo, the shell and what it started.
                let _ = std::process::Command::new("/bin/kill")
                    .args(["-KILL", "--", &format!("-{pid}")])
                    .env_clear()
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
                let _ = child.kill();
                let _ = child.wait();
                return Err(HostError::Timeout {
                    host: self.describe(),
                    what: cmd.what(),
                    secs: t.as_secs(),
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        if let Some(t) = stdin_thread {
            let _ = t.join();
        }
        let stdout = out_t.join().unwrap_or_default();
        let stderr = err_t.join().unwrap_or_default();
        use std::os::unix::process::ExitStatusExt;
        let code = status
            .code()
            .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
        Ok(CmdOutput {
            status: code,
            stdout,
            stderr,
        })
    }

    fn read_file(&mut self, path: &str, privileged: bool) -> Result<Option<Vec<u8>>, HostError> {
        let rel = self.rel("read", path)?;
        if self.via_sudo(privileged)? {
            return shellops::read_file(self, path, true);
        }
        if let Some(r) = &self.froot {
            return r.read(&rel).map_err(|e| self.err("read", path, e));
        }
        let real = self.real(path);
        match std::fs::read(&real) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.err("read", path, e)),
        }
    }

    fn write_file(&mut self, path: &str, data: &[u8], attrs: &FileAttrs) -> Result<(), HostError> {
        let rel = self.rel("write", path)?;
        if self.via_sudo(attrs.privileged)? {
            return shellops::write_file(self, path, data, attrs);
        }
        let chown = self.can_chown()?;
        let owner = attrs.owner.filter(|_| chown);
        if let Some(r) = &self.froot {
            return r
                .write_atomic(&rel, data, attrs.mode, owner, false)
                .map_err(|e| self.err("write", path, e));
        }
        let real = PathBuf::from(self.real(path));
        let dir = real
            .parent()
            .ok_or_else(|| self.err("write", path, "no parent directory"))?;
        let mut tmp = tempfile::Builder::new()
            .prefix(".charly-")
            .tempfile_in(dir)
            .map_err(|e| self.err("write", path, e))?;
        tmp.write_all(data)
            .and_then(|()| tmp.as_file().sync_all())
            .map_err(|e| self.err("write", path, e))?;
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(attrs.mode))
            .map_err(|e| self.err("chmod", path, e))?;
        if let (Some((u, g)), true) = (attrs.owner, chown) {
            std::os::unix::fs::chown(tmp.path(), Some(u), Some(g))
                .map_err(|e| self.err("chown", path, e))?;
        }
        tmp.persist(&real)
            .map_err(|e| self.err("write", path, e.error))?;
        Ok(())
    }

    fn which(&mut self, name: &str, path: &str) -> Result<Option<String>, HostError> {
        Ok(find_on(name, path).filter(|_| !name.contains('/')))
    }

    fn stat(&mut self, paths: &[String], digest: bool) -> Result<Vec<Option<Stat>>, HostError> {
        let mut out = Vec::with_capacity(paths.len());
        for p in paths {
            let rel = self.rel("stat", p)?;
            if let Some(r) = &self.froot {
                out.push(self.stat_rooted(r, &rel, p, digest)?);
                continue;
            }
            let real = self.real(p);
            let m = match std::fs::symlink_metadata(&real) {
                Ok(m) => m,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    out.push(None);
                    continue;
                }
                Err(e) => return Err(self.err("stat", p, e)),
            };
            let ft = m.file_type();
            let kind = if ft.is_symlink() {
                PathKind::Symlink {
                    target: std::fs::read_link(&real)
                        .map_err(|e| self.err("readlink", p, e))?
                        .to_string_lossy()
                        .into_owned(),
                }
            } else if ft.is_dir() {
                PathKind::Dir
            } else if ft.is_file() {
                let sha256 = if digest {
                    Some(sha256_hex(
                        &std::fs::read(&real).map_err(|e| self.err("read", p, e))?,
                    ))
                } else {
                    None
                };
                PathKind::File { sha256 }
            } else {
                PathKind::Other
            };
            out.push(Some(Stat {
                kind,
                mode: m.mode() & 0o7777,
                uid: m.uid(),
                gid: m.gid(),
            }));
        }
        Ok(out)
    }

    fn mkdir(&mut self, path: &str, attrs: &FileAttrs) -> Result<(), HostError> {
        let rel = self.rel("mkdir", path)?;
        if self.via_sudo(attrs.privileged)? {
            return shellops::mkdir(self, path, attrs);
        }
        let chown = self.can_chown()?;
        if let Some(r) = &self.froot {
            return r
                .mkdir(&rel, attrs.mode, attrs.owner.filter(|_| chown))
                .map_err(|e| self.err("mkdir", path, e));
        }
        let real = self.real(path);
        std::fs::create_dir(&real).map_err(|e| self.err("mkdir", path, e))?;
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(attrs.mode))
            .map_err(|e| self.err("chmod", path, e))?;
        if let (Some((u, g)), true) = (attrs.owner, chown) {
            std::os::unix::fs::chown(&real, Some(u), Some(g))
                .map_err(|e| self.err("chown", path, e))?;
        }
        Ok(())
    }

    fn symlink(&mut self, path: &str, target: &str, attrs: &FileAttrs) -> Result<(), HostError> {
        let rel = self.rel("symlink", path)?;
        if self.via_sudo(attrs.privileged)? {
            return shellops::symlink(self, path, target, attrs);
        }
        let chown = self.can_chown()?;
        if let Some(r) = &self.froot {
            return r
                .symlink(&rel, target, attrs.owner.filter(|_| chown))
                .map_err(|e| self.err("symlink", path, e));
        }
        let real = self.real(path);
        std::os::unix::fs::symlink(target, &real).map_err(|e| self.err("symlink", path, e))?;
        if let (Some((u, g)), true) = (attrs.owner, chown) {
            std::os::unix::fs::lchown(&real, Some(u), Some(g))
                .map_err(|e| self.err("chown", path, e))?;
        }
        Ok(())
    }

    fn remove(&mut self, path: &str, privileged: bool) -> Result<bool, HostError> {
        let rel = self.rel("remove", path)?;
        if self.via_sudo(privileged)? {
            return shellops::remove(self, path, true);
        }
        if let Some(r) = &self.froot {
            return r.remove(&rel).map_err(|e| self.err("remove", path, e));
        }
        let real = self.real(path);
        let m = match std::fs::symlink_metadata(&real) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(true),
            Err(e) => return Err(self.err("remove", path, e)),
        };
        if m.is_dir() {
            match std::fs::remove_dir(&real) {
                Ok(()) => Ok(true),
                Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty => Ok(false),
                Err(e) => Err(self.err("rmdir", path, e)),
            }
        } else {
            std::fs::remove_file(&real).map_err(|e| self.err("remove", path, e))?;
            Ok(true)
        }
    }

    fn extract_tar(&mut self, tar: &[u8], privileged: bool) -> Result<(), HostError> {
        if self.via_sudo(privileged)? {
            return shellops::extract_tar(self, tar, true);
        }
        let chown = self.can_chown()?;
        let entries =
            charly_files::artifact::read_tar(tar, "").map_err(|e| self.err("read tar", "", e))?;
        for e in entries {
            let target = format!("/{}", e.path);
            let rel = self.rel("extract", &target)?;
            let owner = chown.then_some((e.uid as u32, e.gid as u32));
            match &e.kind {
                charly_files::artifact::Kind::Dir => {
                    self.extract_dir(&rel, &target, e.mode, owner)?
                }
                charly_files::artifact::Kind::Symlink(t) => {
                    if let Some(r) = &self.froot {
                        r.remove(&rel)
                            .and_then(|_| r.symlink(&rel, t, owner))
                            .map_err(|x| self.err("symlink", &target, x))?;
                    } else {
                        let real = PathBuf::from(self.real(&target));
                        if std::fs::symlink_metadata(&real).is_ok() {
                            std::fs::remove_file(&real)
                                .map_err(|x| self.err("replace", &target, x))?;
                        }
                        std::os::unix::fs::symlink(t, &real)
                            .map_err(|x| self.err("symlink", &target, x))?;
                        if let Some((u, g)) = owner {
                            std::os::unix::fs::lchown(&real, Some(u), Some(g))
                                .map_err(|x| self.err("chown", &target, x))?;
                        }
                    }
                }
                charly_files::artifact::Kind::File(data) => {
                    self.write_file(
                        &target,
                        data,
                        &FileAttrs {
                            mode: e.mode,
                            owner: owner.filter(|_| chown),
                            privileged: false,
                        },
                    )?;
                }
            }
        }
        Ok(())
    }

    fn reconnect(&mut self, _timeout: Duration) -> Result<(), HostError> {
        Ok(())
    }

    fn sweep_temps(&mut self, dirs: &[String]) -> Vec<(String, String)> {
        self.sweep_local(dirs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rooted_file_ops_stay_below_the_root() {
        let t = tempfile::tempdir().expect("tmp");
        let mut h = LocalHost::rooted(t.path()).expect("root");
        h.mkdir(
            "/etc",
            &FileAttrs {
                mode: 0o755,
                ..FileAttrs::default()
            },
        )
        .expect("mkdir");
        h.write_file(
            "/etc/x.conf",
            b"x=1\n",
            &FileAttrs {
                mode: 0o600,
                owner: None,
                privileged: true,
            },
        )
        .expect("write");
        let on_disk = t.path().join("etc/x.conf");
        assert_eq!(std::fs::read(&on_disk).expect("read"), b"x=1\n");
        assert_eq!(
            std::fs::metadata(&on_disk)
                .expect("meta")
                .permissions()
                .mode()
                & 0o7777,
            0o600
        );
        assert_eq!(
            h.read_file("/etc/x.conf", false).expect("read"),
            Some(b"x=1\n".to_vec())
        );
        assert_eq!(h.read_file("/etc/none", false).expect("read"), None);
        let st = h
            .stat(&["/etc/x.conf".into(), "/nope".into()], true)
            .expect("stat");
        assert!(
            matches!(&st[0], Some(Stat { kind: PathKind::File { sha256: Some(d) }, .. }) if *d == sha256_hex(b"x=1\n"))
        );
        assert_eq!(st[1], None);
        assert!(!h.remove("/etc", false).expect("rm"), "not empty");
        assert!(h.remove("/etc/x.conf", false).expect("rm"));
        assert!(h.remove("/etc", false).expect("rm"));
    }

    /// A tar directory entry goes through a link to a directory inside the
    /// root (merged /usr: `lib -> usr/lib`), never through one out of it.
    #[test]
    fn extraction_follows_links_inside_the_root_only() {
        let t = tempfile::tempdir().expect("tmp");
        let root = t.path().join("root");
        let outside = t.path().join("outside");
        std::fs::create_dir_all(root.join("usr/lib")).expect("usr/lib");
        std::fs::create_dir_all(&outside).expect("outside");
        std::os::unix::fs::symlink("usr/lib", root.join("lib")).expect("link");
        std::os::unix::fs::symlink(&outside, root.join("opt")).expect("link out");
        let tar_of = |dir: &str, file: &str| {
            let mut b = tar::Builder::new(Vec::new());
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Directory);
            h.set_mode(0o755);
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(0);
            h.set_size(0);
            b.append_data(&mut h, dir, std::io::empty()).expect("dir");
            let mut h = tar::Header::new_gnu();
            h.set_mode(0o644);
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(0);
            h.set_size(2);
            b.append_data(&mut h, file, &b"ok"[..]).expect("file");
            b.into_inner().expect("tar")
        };
        let mut h = LocalHost::rooted(&root).expect("root");
        h.extract_tar(&tar_of("lib/", "lib/x.so"), false)
            .expect("through lib -> usr/lib");
        assert_eq!(std::fs::read(root.join("usr/lib/x.so")).expect("x"), b"ok");
        assert!(h.extract_tar(&tar_of("opt/", "opt/y"), false).is_err());
        assert_eq!(std::fs::read_dir(&outside).expect("ls").count(), 0);
    }

    #[test]
    fn run_builds_the_env_and_times_out() {
        let mut h = LocalHost::new();
        let mut c = Cmd::sh("echo \"$PATH|${HOME:-unset}\"; exit 3");
        c.env
            .insert("PATH".into(), format!("/opt/x/bin:{BASE_PATH}"));
        let out = h.run(&c).expect("run");
        assert_eq!(out.status, 3);
        assert_eq!(
            out.stdout_str().trim(),
            format!("/opt/x/bin:{BASE_PATH}|unset"),
            "nothing inherited"
        );
        let t = Instant::now();
        let err = h
            .run(&Cmd::sh("sleep 30").timeout(Duration::from_millis(200)))
            .expect_err("timeout");
        assert!(matches!(err, HostError::Timeout { .. }), "{err}");
        assert!(t.elapsed() < Duration::from_secs(10));
        let out = h.run(&Cmd::sh("cat").stdin(b"in".to_vec())).expect("stdin");
        assert_eq!(out.stdout, b"in");
        assert!(h.which("sh", BASE_PATH).expect("which").is_some());
        assert!(
            h.which("no-such-binary-x", BASE_PATH)
                .expect("which")
                .is_none()
        );
    }
}
