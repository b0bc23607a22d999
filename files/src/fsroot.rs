//! Writing, reading and removing below a root directory, never outside it.
//!
//! Every path charly writes or deletes for a project comes, one way or
//! another, from configuration (box names, candy names, `write:` paths,
//! artifact tar members). A [`Root`] is the one place where such a path
//! meets the file system, and it holds the rule for all of them:
//!
//! * **Lexically**, a path is relative to the root and every component is a
//!   plain name: absolute paths, `..`, `.` and empty components are refused
//!   before anything is touched ([`check_rel`]; deploy target paths such as
//!   `/etc/x` are taken relative to the root by [`target_rel`]).
//! * **Physically**, the path is walked one component at a time from a
//!   file descriptor of the root (`openat` with `O_NOFOLLOW`, through the
//!   safe `rustix` API: the workspace forbids `unsafe`, and `rustix` is
//!   already in the tree through `tempfile`). A symlink met on the way is
//!   followed only when where it leads stays inside the root: relative
//!   targets are resolved from the link's directory with `..` never
//!   climbing above the root, absolute targets only when they name a path
//!   below the root itself; anything else is an error naming the link.
//!   At most 40 links are followed (loops end as errors). The last
//!   component is never followed by writes, `mkdir`, `symlink` and
//!   removals: a write replaces a symlink (rename), it does not write
//!   through it. `openat2(RESOLVE_IN_ROOT)` would give chroot semantics
//!   instead (an absolute link read as root-relative); the walk is used
//!   because it also runs where `openat2` is filtered (containers, older
//!   kernels) and because refusing a link out of the root is what a rooted
//!   deploy must report.
//! * **Removal** never follows a symlink: [`Root::remove_tree`] and
//!   [`Root::prune`] unlink links, they do not descend into them.
//!
//! **Temp files** are named `.charly-tmp-<pid>-<n>` and locked (`flock`)
//! by their writer until it renamed them; [`Root::sweep_temps`] removes
//! the ones whose lock it can take (their writer is dead: a kill leaves
//! them), never those of a live concurrent writer.

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// The prefix of every temp file a [`Root`] writes.
pub const TEMP_PREFIX: &str = ".charly-tmp-";

/// How many symlinks one resolution may follow.
const MAX_LINKS: usize = 40;

/// A directory that paths are confined to.
#[derive(Debug)]
pub struct Root {
    path: PathBuf,
    fd: OwnedFd,
}

fn err(kind: io::ErrorKind, msg: String) -> io::Error {
    io::Error::new(kind, msg)
}

fn from_rustix(e: rustix::io::Errno) -> io::Error {
    io::Error::from(e)
}

/// Checks a relative path lexically: not empty, not absolute, every
/// component a plain name (no `..`, no `.`). Returns the components.
pub fn check_rel(rel: &Path) -> io::Result<Vec<OsString>> {
    let mut out = Vec::new();
    if rel.as_os_str().is_empty() {
        return Err(err(io::ErrorKind::InvalidInput, "empty path".into()));
    }
    if rel.as_os_str().as_bytes().contains(&0) {
        return Err(err(
            io::ErrorKind::InvalidInput,
            format!("{}: NUL byte in path", rel.display()),
        ));
    }
    // `Path::components` drops `.` in the middle; check the raw text too.
    for raw in rel.as_os_str().as_bytes().split(|b| *b == b'/') {
        if raw == b"." || raw == b".." {
            return Err(err(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: `{}` components are refused",
                    rel.display(),
                    String::from_utf8_lossy(raw)
                ),
            ));
        }
    }
    for c in rel.components() {
        match c {
            Component::Normal(n) => out.push(n.to_os_string()),
            Component::RootDir | Component::Prefix(_) => {
                return Err(err(
                    io::ErrorKind::InvalidInput,
                    format!("{}: an absolute path is refused here", rel.display()),
                ));
            }
            Component::CurDir | Component::ParentDir => {
                return Err(err(
                    io::ErrorKind::InvalidInput,
                    format!("{}: `.` and `..` components are refused", rel.display()),
                ));
            }
        }
    }
    Ok(out)
}

/// A deploy target path (`/etc/x`) as a path relative to the root
/// (`etc/x`; `/` itself is the empty path). Must be absolute, without
/// `..` or `.` components.
pub fn target_rel(target: &str) -> io::Result<PathBuf> {
    if !target.starts_with('/') {
        return Err(err(
            io::ErrorKind::InvalidInput,
            format!("{target}: target paths must be absolute"),
        ));
    }
    let rel = target.trim_start_matches('/').trim_end_matches('/');
    if rel.is_empty() {
        return Ok(PathBuf::new());
    }
    // Repeated slashes are harmless; `.` and `..` are not.
    let joined: Vec<&str> = rel.split('/').filter(|s| !s.is_empty()).collect();
    let p = PathBuf::from(joined.join("/"));
    check_rel(&p).map_err(|e| err(e.kind(), format!("{target}: {e}")))?;
    Ok(p)
}

/// Whether a file name is one of charly's locked temp files (a crashed
/// writer's leftover once nobody holds its lock): exactly the form
/// `temp_name` makes, `.charly-tmp-<pid>-<digits>`. Nothing else is ever
/// swept where other programs write too (a deploy's `$HOME`, a project
/// root): their `.tmpXXXXXX` files hold no lock charly could test.
pub fn is_temp_name(name: &OsStr) -> bool {
    let digits = |s: &[u8]| !s.is_empty() && s.iter().all(u8::is_ascii_digit);
    name.as_bytes()
        .strip_prefix(TEMP_PREFIX.as_bytes())
        .and_then(|rest| {
            let i = rest.iter().position(|&c| c == b'-')?;
            Some(digits(&rest[..i]) && digits(&rest[i + 1..]))
        })
        .unwrap_or(false)
}

/// Temp names of writers that take no lock: earlier versions' `.tmpXXXXXX`
/// and `.charly-XXXXXX`, and the store's blob copies `.charly-tmp-XXXXXX`.
/// Swept only inside `.build/`, where nothing but charly writes and every
/// writer holds the box's lock while it writes.
fn is_unlocked_temp_name(name: &OsStr) -> bool {
    let b = name.as_bytes();
    let rand6 = |s: &[u8]| s.len() == 6 && s.iter().all(u8::is_ascii_alphanumeric);
    [&b".charly-tmp-"[..], b".charly-", b".tmp"]
        .iter()
        .any(|p| b.strip_prefix(*p).is_some_and(rand6))
}

fn temp_name() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{TEMP_PREFIX}{}-{n}{nanos:09}", std::process::id())
}

/// What a resolution ended on: the directory holding the last component
/// and that component (`None`: the path is the directory itself).
struct Resolved {
    dir: OwnedFd,
    name: Option<OsString>,
}

/// Whether a write is fsynced before it is renamed into place.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Durability {
    /// Synced: the file is either the old or the whole new content after a
    /// power loss (deployed files, the project's own sources).
    Synced,
    /// Derived from the store and verified when read again: not synced.
    Derived,
}

impl Root {
    /// Opens an existing directory as a root (the root path itself is
    /// trusted and may be reached through symlinks).
    pub fn open(path: &Path) -> io::Result<Root> {
        let fd = rustix::fs::open(
            path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| err(from_rustix(e).kind(), format!("{}: {e}", path.display())))?;
        // The canonical path, so an absolute link to a path below the root
        // is recognised whatever way the root was named.
        let path = std::fs::canonicalize(path).or_else(|_| std::path::absolute(path))?;
        Ok(Root { path, fd })
    }

    /// Creates the directory (and its parents) if needed, then opens it.
    pub fn create(path: &Path) -> io::Result<Root> {
        std::fs::create_dir_all(path)
            .map_err(|e| err(e.kind(), format!("{}: {e}", path.display())))?;
        Self::open(path)
    }

    /// The root directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn describe(&self, rel: &Path) -> String {
        self.path.join(rel).display().to_string()
    }

    /// Resolves `rel` (already checked by [`check_rel`], or empty for the
    /// root itself). Intermediate symlinks are followed inside the root; the
    /// last component only when `follow_last`. Missing directories are made
    /// (mode 0777 before the umask) when `create`.
    fn resolve(&self, rel: &Path, follow_last: bool, create: bool) -> io::Result<Resolved> {
        let comps: Vec<OsString> = if rel.as_os_str().is_empty() {
            Vec::new()
        } else {
            check_rel(rel)?
        };
        let mut stack: Vec<OwnedFd> = vec![dup_dir(&self.fd)?];
        let mut pending: VecDeque<OsString> = comps.into();
        let mut links = 0;
        let escape = |link: &OsStr, target: &OsStr| self.escape(rel, link, target);
        let mut last_link = OsString::new();
        let mut last_target = OsString::new();
        loop {
            let Some(c) = pending.pop_front() else {
                let dir = stack
                    .pop()
                    .ok_or_else(|| escape(&last_link, &last_target))?;
                return Ok(Resolved { dir, name: None });
            };
            if c.is_empty() || c == "." {
                continue;
            }
            if c == ".." {
                // Only from a symlink's target: `..` of the root leaves it.
                if stack.len() <= 1 {
                    return Err(escape(&last_link, &last_target));
                }
                stack.pop();
                continue;
            }
            let top = stack
                .last()
                .ok_or_else(|| escape(&last_link, &last_target))?;
            let is_last = pending.is_empty();
            if is_last && !follow_last {
                let dir = stack
                    .pop()
                    .ok_or_else(|| escape(&last_link, &last_target))?;
                return Ok(Resolved { dir, name: Some(c) });
            }
            match rustix::fs::statat(top, c.as_os_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => match FileType::from_raw_mode(st.st_mode) {
                    FileType::Symlink => {
                        links += 1;
                        let target = read_link_at(top, &c)?;
                        last_link = c.clone();
                        last_target = target.clone();
                        if links > MAX_LINKS {
                            return Err(err(
                                io::ErrorKind::InvalidInput,
                                format!(
                                    "{}: too many levels of symbolic links",
                                    self.describe(rel)
                                ),
                            ));
                        }
                        let (from_root, rest) = self
                            .link_continuation(target.as_bytes())
                            .ok_or_else(|| escape(&c, &target))?;
                        if from_root {
                            stack.truncate(1);
                        }
                        for part in rest.rsplit(|b| *b == b'/') {
                            pending.push_front(OsStr::from_bytes(part).to_os_string());
                        }
                    }
                    FileType::Directory => {
                        if is_last {
                            let dir = stack.pop().ok_or_else(|| escape(&c, &c))?;
                            return Ok(Resolved { dir, name: Some(c) });
                        }
                        let fd = self.open_dir_at(top, &c, rel)?;
                        stack.push(fd);
                    }
                    _ if is_last => {
                        let dir = stack.pop().ok_or_else(|| escape(&c, &c))?;
                        return Ok(Resolved { dir, name: Some(c) });
                    }
                    _ => return Err(self.not_a_directory(rel, &c)),
                },
                Err(rustix::io::Errno::NOENT) if is_last => {
                    let dir = stack.pop().ok_or_else(|| escape(&c, &c))?;
                    return Ok(Resolved { dir, name: Some(c) });
                }
                Err(rustix::io::Errno::NOENT) if create => {
                    self.mkdir_at(top, &c, rel)?;
                    pending.push_front(c);
                }
                Err(e) => return Err(self.errno_error(rel, e)),
            }
        }
    }

    /// The error for the symlink `link` (while resolving `rel`) whose
    /// `target` leads out of the root.
    fn escape(&self, rel: &Path, link: &OsStr, target: &OsStr) -> io::Error {
        err(
            io::ErrorKind::PermissionDenied,
            format!(
                "{}: symlink `{}` -> `{}` leads out of {}",
                self.describe(rel),
                link.to_string_lossy(),
                target.to_string_lossy(),
                self.path.display()
            ),
        )
    }

    /// Where a symlink's `target` continues the walk: whether from the root
    /// (an absolute target) and the path left to walk. `None` when an
    /// absolute target is not this root or a path below it.
    fn link_continuation<'t>(&self, target: &'t [u8]) -> Option<(bool, &'t [u8])> {
        let root = self.path.as_os_str().as_bytes();
        if target.starts_with(b"/") && root == b"/" {
            Some((true, target))
        } else if target.starts_with(b"/") {
            // Absolute: only a path below this very root.
            match target.strip_prefix(root) {
                Some(r) if r.is_empty() || r.starts_with(b"/") => Some((true, r)),
                _ => None,
            }
        } else {
            Some((false, target))
        }
    }

    /// Opens the directory `c` of `top` (never through a symlink) to walk
    /// into while resolving `rel`.
    fn open_dir_at(&self, top: &OwnedFd, c: &OsStr, rel: &Path) -> io::Result<OwnedFd> {
        rustix::fs::openat(
            top,
            c,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| self.errno_error(rel, e))
    }

    /// Makes the missing directory `c` of `top` (one that appeared
    /// meanwhile is fine) while resolving `rel`.
    fn mkdir_at(&self, top: &OwnedFd, c: &OsStr, rel: &Path) -> io::Result<()> {
        match rustix::fs::mkdirat(top, c, Mode::from_raw_mode(0o777)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => Ok(()),
            Err(e) => Err(err(
                from_rustix(e).kind(),
                format!("{}: mkdir: {e}", self.describe(rel)),
            )),
        }
    }

    /// The error for the component `c` of `rel` that is neither a directory
    /// nor a symlink but has components after it.
    fn not_a_directory(&self, rel: &Path, c: &OsStr) -> io::Error {
        err(
            io::ErrorKind::NotADirectory,
            format!(
                "{}: `{}` is not a directory",
                self.describe(rel),
                c.to_string_lossy()
            ),
        )
    }

    /// A system call's error while resolving `rel`, naming the path.
    fn errno_error(&self, rel: &Path, e: rustix::io::Errno) -> io::Error {
        err(
            from_rustix(e).kind(),
            format!("{}: {e}", self.describe(rel)),
        )
    }

    fn parent_and_name(&self, rel: &Path, create: bool) -> io::Result<(OwnedFd, OsString)> {
        let r = self.resolve(rel, false, create)?;
        let name = r.name.ok_or_else(|| {
            err(
                io::ErrorKind::InvalidInput,
                format!("{}: names the root itself", self.describe(rel)),
            )
        })?;
        Ok((r.dir, name))
    }

    /// Makes the directory `rel` (and missing parents) inside the root.
    pub fn create_dir_all(&self, rel: &Path) -> io::Result<()> {
        let (dir, name) = self.parent_and_name(rel, true)?;
        match rustix::fs::mkdirat(&dir, name.as_os_str(), Mode::from_raw_mode(0o777)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => {
                return Err(err(
                    from_rustix(e).kind(),
                    format!("{}: mkdir: {e}", self.describe(rel)),
                ));
            }
        }
        // What exists must be a directory (or a link to one inside the root).
        self.resolve(rel, true, false)
            .and_then(|r| self.open_dir_of(&r, rel))
            .map(drop)
    }

    /// Proves that `rel` lies inside the root (missing parents are made)
    /// and gives its path, for APIs that take a path. The last component
    /// is not followed.
    pub fn prepare(&self, rel: &Path) -> io::Result<PathBuf> {
        self.parent_and_name(rel, true)?;
        Ok(self.path.join(rel))
    }

    fn open_dir_of(&self, r: &Resolved, rel: &Path) -> io::Result<OwnedFd> {
        let name: &OsStr = r.name.as_deref().unwrap_or(OsStr::new("."));
        rustix::fs::openat(
            &r.dir,
            name,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| {
            err(
                from_rustix(e).kind(),
                format!("{}: {e}", self.describe(rel)),
            )
        })
    }

    /// Reads a file (symlinks followed inside the root); `None` when absent.
    pub fn read(&self, rel: &Path) -> io::Result<Option<Vec<u8>>> {
        let r = match self.resolve(rel, true, false) {
            Ok(r) => r,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let Some(name) = r.name else {
            return Err(err(
                io::ErrorKind::IsADirectory,
                format!("{}: is a directory", self.describe(rel)),
            ));
        };
        match rustix::fs::openat(
            &r.dir,
            name.as_os_str(),
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => {
                let mut f = File::from(fd);
                let mut buf = Vec::new();
                io::Read::read_to_end(&mut f, &mut buf)
                    .map_err(|e| err(e.kind(), format!("{}: {e}", self.describe(rel))))?;
                Ok(Some(buf))
            }
            Err(rustix::io::Errno::NOENT) => Ok(None),
            Err(e) => Err(err(
                from_rustix(e).kind(),
                format!("{}: {e}", self.describe(rel)),
            )),
        }
    }

    /// Facts about `rel` without following its last component.
    pub fn lstat(&self, rel: &Path) -> io::Result<Option<rustix::fs::Stat>> {
        let (dir, name) = match self.parent_and_name(rel, false) {
            Ok(x) => x,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        match rustix::fs::statat(&dir, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(st)),
            Err(rustix::io::Errno::NOENT) => Ok(None),
            Err(e) => Err(err(
                from_rustix(e).kind(),
                format!("{}: {e}", self.describe(rel)),
            )),
        }
    }

    /// The target of the symlink `rel`.
    pub fn read_link(&self, rel: &Path) -> io::Result<OsString> {
        let (dir, name) = self.parent_and_name(rel, false)?;
        let t = rustix::fs::readlinkat(&dir, name.as_os_str(), Vec::new()).map_err(|e| {
            err(
                from_rustix(e).kind(),
                format!("{}: {e}", self.describe(rel)),
            )
        })?;
        Ok(OsStr::from_bytes(t.as_bytes()).to_os_string())
    }

    /// Writes `bytes` to `rel` atomically: a locked temp file beside it,
    /// mode and owner set, synced, renamed over it (a symlink at `rel` is
    /// replaced, never written through). Parents are made when `parents`.
    pub fn write_atomic(
        &self,
        rel: &Path,
        bytes: &[u8],
        mode: u32,
        owner: Option<(u32, u32)>,
        parents: bool,
    ) -> io::Result<()> {
        self.write_atomic_as(rel, bytes, mode, owner, parents, Durability::Synced)
    }

    fn write_atomic_as(
        &self,
        rel: &Path,
        bytes: &[u8],
        mode: u32,
        owner: Option<(u32, u32)>,
        parents: bool,
        durability: Durability,
    ) -> io::Result<()> {
        let (dir, name) = self.parent_and_name(rel, parents)?;
        let ctx = |e: io::Error| err(e.kind(), format!("{}: {e}", self.describe(rel)));
        let (file, tmp) = create_locked_temp(&dir).map_err(ctx)?;
        let res = (|| {
            let mut f = &file;
            f.write_all(bytes)?;
            rustix::fs::fchmod(&file, Mode::from_raw_mode(mode)).map_err(from_rustix)?;
            if let Some((u, g)) = owner {
                std::os::unix::fs::fchown(&file, Some(u), Some(g))?;
            }
            if durability == Durability::Synced {
                file.sync_all()?;
            }
            rustix::fs::renameat(&dir, tmp.as_str(), &dir, name.as_os_str()).map_err(from_rustix)
        })();
        if res.is_err() {
            let _ = rustix::fs::unlinkat(&dir, tmp.as_str(), AtFlags::empty());
        }
        drop(file);
        res.map_err(ctx)
    }

    /// The first half of a write that must happen together with others:
    /// `bytes` in a synced temp file next to `rel` (mode `mode`, parents
    /// made), renamed over `rel` by [`Staged::commit`]. A `Staged` dropped
    /// without its commit removes its temp file, so a set of writes can be
    /// staged one by one and committed only when every one was staged.
    pub fn stage(&self, rel: &Path, bytes: &[u8], mode: u32) -> io::Result<Staged> {
        let (dir, name) = self.parent_and_name(rel, true)?;
        let ctx = |e: io::Error| err(e.kind(), format!("{}: {e}", self.describe(rel)));
        let (file, tmp) = create_locked_temp(&dir).map_err(ctx)?;
        let staged = Staged {
            dir,
            tmp,
            name,
            what: self.describe(rel),
            _file: file,
            done: false,
        };
        (|| {
            let mut f = &staged._file;
            f.write_all(bytes)?;
            rustix::fs::fchmod(&staged._file, Mode::from_raw_mode(mode)).map_err(from_rustix)?;
            staged._file.sync_all()
        })()
        .map_err(ctx)?;
        Ok(staged)
    }

    /// Writes `rel` (mode 0644, parents made) unless it already holds
    /// `bytes`, so mtimes stay put for tools that watch them. Returns
    /// whether it wrote.
    pub fn write_if_changed(&self, rel: &Path, bytes: &[u8]) -> io::Result<bool> {
        self.write_if_changed_as(rel, bytes, Durability::Synced)
    }

    /// [`Root::write_if_changed`] for a derived output (a build directory's
    /// files): renamed into place unsynced, like every build tool writes
    /// its outputs. Whoever reads it again verifies it against what it
    /// should hold (the key marker, the stat cache, the journal's
    /// fingerprints) and rewrites it after a crash left it short or old.
    pub fn write_output_if_changed(&self, rel: &Path, bytes: &[u8]) -> io::Result<bool> {
        self.write_if_changed_as(rel, bytes, Durability::Derived)
    }

    fn write_if_changed_as(
        &self,
        rel: &Path,
        bytes: &[u8],
        durability: Durability,
    ) -> io::Result<bool> {
        let (dir, name) = self.parent_and_name(rel, true)?;
        if let Ok(fd) = rustix::fs::openat(
            &dir,
            name.as_os_str(),
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            let mut f = File::from(fd);
            let mut old = Vec::new();
            if f.metadata()
                .is_ok_and(|m| m.is_file() && m.len() == bytes.len() as u64)
                && io::Read::read_to_end(&mut f, &mut old).is_ok()
                && old == bytes
            {
                return Ok(false);
            }
        }
        // Context files are bind-mounted into RUNs that may run as the box
        // user: they must be readable by everyone.
        self.write_atomic_as(rel, bytes, 0o644, None, true, durability)?;
        Ok(true)
    }

    /// Creates one directory (the parent must exist) with `mode` and owner.
    pub fn mkdir(&self, rel: &Path, mode: u32, owner: Option<(u32, u32)>) -> io::Result<()> {
        let (dir, name) = self.parent_and_name(rel, false)?;
        let ctx = |e: rustix::io::Errno| {
            err(
                from_rustix(e).kind(),
                format!("{}: {e}", self.describe(rel)),
            )
        };
        rustix::fs::mkdirat(&dir, name.as_os_str(), Mode::from_raw_mode(0o700)).map_err(ctx)?;
        let fd = rustix::fs::openat(
            &dir,
            name.as_os_str(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(ctx)?;
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode)).map_err(ctx)?;
        if let Some((u, g)) = owner {
            std::os::unix::fs::fchown(&fd, Some(u), Some(g))
                .map_err(|e| err(e.kind(), format!("{}: {e}", self.describe(rel))))?;
        }
        Ok(())
    }

    /// Creates the symlink `rel -> target` (nothing may exist at `rel`).
    /// The link itself may point anywhere: it is not followed here, and
    /// nothing is later written or removed through it out of the root.
    pub fn symlink(&self, rel: &Path, target: &str, owner: Option<(u32, u32)>) -> io::Result<()> {
        let (dir, name) = self.parent_and_name(rel, false)?;
        let ctx = |e: rustix::io::Errno| {
            err(
                from_rustix(e).kind(),
                format!("{}: {e}", self.describe(rel)),
            )
        };
        rustix::fs::symlinkat(target, &dir, name.as_os_str()).map_err(ctx)?;
        if let Some((u, g)) = owner {
            rustix::fs::chownat(
                &dir,
                name.as_os_str(),
                Some(rustix::fs::Uid::from_raw(u)),
                Some(rustix::fs::Gid::from_raw(g)),
                AtFlags::SYMLINK_NOFOLLOW,
            )
            .map_err(ctx)?;
        }
        Ok(())
    }

    /// Removes a file, a symlink (not what it points to) or an empty
    /// directory; absent is fine. `Ok(false)`: a directory not empty.
    pub fn remove(&self, rel: &Path) -> io::Result<bool> {
        let (dir, name) = match self.parent_and_name(rel, false) {
            Ok(x) => x,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(true),
            Err(e) => return Err(e),
        };
        let ctx = |e: rustix::io::Errno| {
            err(
                from_rustix(e).kind(),
                format!("{}: {e}", self.describe(rel)),
            )
        };
        let st = match rustix::fs::statat(&dir, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(rustix::io::Errno::NOENT) => return Ok(true),
            Err(e) => return Err(ctx(e)),
        };
        if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
            match rustix::fs::unlinkat(&dir, name.as_os_str(), AtFlags::REMOVEDIR) {
                Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(true),
                Err(rustix::io::Errno::NOTEMPTY) | Err(rustix::io::Errno::EXIST) => Ok(false),
                Err(e) => Err(ctx(e)),
            }
        } else {
            match rustix::fs::unlinkat(&dir, name.as_os_str(), AtFlags::empty()) {
                Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(true),
                Err(e) => Err(ctx(e)),
            }
        }
    }

    /// Removes `rel` and everything below it; symlinks are unlinked, never
    /// followed. Absent is fine.
    pub fn remove_tree(&self, rel: &Path) -> io::Result<()> {
        let (dir, name) = match self.parent_and_name(rel, false) {
            Ok(x) => x,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        remove_entry(&dir, &name).map_err(|e| err(e.kind(), format!("{}: {e}", self.describe(rel))))
    }

    /// Makes the directory `rel` hold only what `keep` accepts: every
    /// other file or symlink below it is removed, then every directory
    /// left empty. `keep` sees paths relative to the root; a directory it
    /// keeps is not entered. Symlinks are never followed. A temp file is
    /// removed only when its writer is dead, as [`Root::sweep_temps`] does.
    pub fn prune(&self, rel: &Path, keep: &dyn Fn(&Path, bool) -> bool) -> io::Result<()> {
        let r = self.resolve(rel, false, false)?;
        let fd = self.open_dir_of(&r, rel)?;
        prune_dir(&fd, rel, keep).map_err(|e| err(e.kind(), format!("{}: {e}", self.describe(rel))))
    }

    /// Removes the temp files of dead writers in the directory `rel`
    /// (below it too when `recursive`). A temp file whose lock a live
    /// writer holds is left alone. Returns the leftovers that could not be
    /// removed, with why.
    pub fn sweep_temps(&self, rel: &Path, recursive: bool) -> io::Result<Vec<(PathBuf, String)>> {
        let r = match self.resolve(rel, true, false) {
            Ok(r) => r,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let fd = match self.open_dir_of(&r, rel) {
            Ok(fd) => fd,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                ) =>
            {
                return Ok(Vec::new());
            }
            Err(e) => return Err(e),
        };
        let mut left = Vec::new();
        sweep_dir(&fd, &self.path.join(rel), recursive, &mut left)?;
        Ok(left)
    }

    /// Takes an exclusive lock on the lock file `rel` (made, with its
    /// parents, when missing). When another process holds it, `on_wait`
    /// runs once, then this blocks until the lock is free. The lock lasts
    /// as long as the returned file.
    pub fn lock(&self, rel: &Path, on_wait: impl FnOnce()) -> io::Result<File> {
        let (dir, name) = self.parent_and_name(rel, true)?;
        let fd = rustix::fs::openat(
            &dir,
            name.as_os_str(),
            OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        )
        .map_err(|e| {
            err(
                from_rustix(e).kind(),
                format!("{}: {e}", self.describe(rel)),
            )
        })?;
        let f = File::from(fd);
        match f.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                on_wait();
                f.lock()?;
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
        }
        Ok(f)
    }
}

/// Creates a temp file in `dir` and locks it; retried when a sweeper
/// removed it between creation and lock.
/// A write [`Root::stage`]d and not yet committed.
pub struct Staged {
    dir: OwnedFd,
    tmp: String,
    name: OsString,
    what: String,
    _file: File,
    done: bool,
}

impl Staged {
    /// Renames the staged file over its target.
    pub fn commit(mut self) -> io::Result<()> {
        rustix::fs::renameat(
            &self.dir,
            self.tmp.as_str(),
            &self.dir,
            self.name.as_os_str(),
        )
        .map_err(|e| {
            let e = from_rustix(e);
            err(e.kind(), format!("{}: {e}", self.what))
        })?;
        self.done = true;
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.done {
            let _ = rustix::fs::unlinkat(&self.dir, self.tmp.as_str(), AtFlags::empty());
        }
    }
}

fn create_locked_temp(dir: &OwnedFd) -> io::Result<(File, String)> {
    for _ in 0..100 {
        let name = temp_name();
        let fd = match rustix::fs::openat(
            dir,
            name.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        ) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::EXIST) => continue,
            Err(e) => return Err(from_rustix(e)),
        };
        let f = File::from(fd);
        f.lock()?;
        if rustix::fs::fstat(&f).map_err(from_rustix)?.st_nlink == 0 {
            continue; // swept before we held it
        }
        return Ok((f, name));
    }
    Err(err(
        io::ErrorKind::AlreadyExists,
        "could not create a temp file".into(),
    ))
}

fn list(fd: &OwnedFd) -> io::Result<Vec<(OsString, FileType)>> {
    let rd = rustix::fs::openat(
        fd,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(from_rustix)?;
    let mut d = rustix::fs::Dir::new(rd).map_err(from_rustix)?;
    let mut out = Vec::new();
    while let Some(e) = d.read() {
        let e = e.map_err(from_rustix)?;
        let name = OsStr::from_bytes(e.file_name().to_bytes()).to_os_string();
        if name == "." || name == ".." {
            continue;
        }
        let mut ft = e.file_type();
        if ft == FileType::Unknown {
            ft = rustix::fs::statat(fd, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW)
                .map(|st| FileType::from_raw_mode(st.st_mode))
                .map_err(from_rustix)?;
        }
        out.push((name, ft));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// A new `O_PATH` descriptor of the directory `fd`.
fn dup_dir(fd: &OwnedFd) -> io::Result<OwnedFd> {
    rustix::fs::openat(
        fd,
        ".",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(from_rustix)
}

/// The target of the symlink `name` in `dir`.
fn read_link_at(dir: &OwnedFd, name: &OsStr) -> io::Result<OsString> {
    let target = rustix::fs::readlinkat(dir, name, Vec::new()).map_err(from_rustix)?;
    Ok(OsStr::from_bytes(target.as_bytes()).to_os_string())
}

fn open_subdir(fd: &OwnedFd, name: &OsStr) -> io::Result<OwnedFd> {
    rustix::fs::openat(
        fd,
        name,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(from_rustix)
}

fn remove_entry(dir: &OwnedFd, name: &OsStr) -> io::Result<()> {
    let st = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(rustix::io::Errno::NOENT) => return Ok(()),
        Err(e) => return Err(from_rustix(e)),
    };
    if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
        let sub = open_subdir(dir, name)?;
        for (n, _) in list(&sub)? {
            remove_entry(&sub, &n)?;
        }
        match rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
            Err(e) => Err(from_rustix(e)),
        }
    } else {
        match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
            Err(e) => Err(from_rustix(e)),
        }
    }
}

fn prune_dir(fd: &OwnedFd, rel: &Path, keep: &dyn Fn(&Path, bool) -> bool) -> io::Result<()> {
    for (name, ft) in list(fd)? {
        let p = rel.join(&name);
        if ft == FileType::Directory {
            if keep(&p, true) {
                continue;
            }
            let sub = open_subdir(fd, &name)?;
            prune_dir(&sub, &p, keep)?;
            // Only succeeds when empty.
            let _ = rustix::fs::unlinkat(fd, name.as_os_str(), AtFlags::REMOVEDIR);
        } else if is_temp_name(&name) {
            remove_if_dead(fd, &name)?;
        } else if !keep(&p, false) {
            match rustix::fs::unlinkat(fd, name.as_os_str(), AtFlags::empty()) {
                Ok(()) | Err(rustix::io::Errno::NOENT) => {}
                Err(e) => return Err(from_rustix(e)),
            }
        }
    }
    Ok(())
}

fn sweep_dir(
    fd: &OwnedFd,
    shown: &Path,
    recursive: bool,
    left: &mut Vec<(PathBuf, String)>,
) -> io::Result<()> {
    for (name, ft) in list(fd)? {
        if ft == FileType::Directory {
            if recursive && let Ok(sub) = open_subdir(fd, &name) {
                sweep_dir(&sub, &shown.join(&name), true, left)?;
            }
            continue;
        }
        let charly_only = shown.components().any(|c| c.as_os_str() == ".build");
        if ft != FileType::RegularFile
            || !(is_temp_name(&name) || (charly_only && is_unlocked_temp_name(&name)))
        {
            continue;
        }
        if let Err(e) = remove_if_dead(fd, &name) {
            left.push((shown.join(&name), e.to_string()));
        }
    }
    Ok(())
}

/// Removes the temp file `name` in `fd` if its writer is dead (its lock
/// can be taken); a live writer's is left alone. Absent is fine.
fn remove_if_dead(fd: &OwnedFd, name: &OsStr) -> io::Result<()> {
    let f = match rustix::fs::openat(
        fd,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(f) => File::from(f),
        Err(rustix::io::Errno::NOENT) => return Ok(()),
        Err(e) => return Err(from_rustix(e)),
    };
    match f.try_lock() {
        // Its writer is gone: nobody will rename it any more.
        Ok(()) => match rustix::fs::unlinkat(fd, name, AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
            Err(e) => Err(from_rustix(e)),
        },
        // A live writer holds it.
        Err(std::fs::TryLockError::WouldBlock) => Ok(()),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

/// Writes `bytes` to `path` unless it already holds them, atomically (a
/// locked temp file beside it, then rename), mode 0644. The parent must
/// exist; the parent directory is the root of the write.
pub fn write_file_if_changed(path: &Path, bytes: &[u8]) -> io::Result<bool> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name = path.file_name().ok_or_else(|| {
        err(
            io::ErrorKind::InvalidInput,
            format!("{}: no file name", path.display()),
        )
    })?;
    Root::open(parent)?.write_if_changed(Path::new(name), bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let t = tempfile::tempdir().expect("tmp");
        let root = t.path().join("root");
        let outside = t.path().join("outside");
        std::fs::create_dir_all(&root).expect("root");
        std::fs::create_dir_all(&outside).expect("outside");
        std::fs::write(outside.join("secret"), "s").expect("secret");
        (t, root, outside)
    }

    #[test]
    fn lexical_rules() {
        for bad in ["", "/etc/x", "a/../b", "..", "./a", "a/./b", "a/..", "a\0b"] {
            assert!(check_rel(Path::new(bad)).is_err(), "{bad:?} refused");
        }
        assert_eq!(check_rel(Path::new("a/b")).expect("ok").len(), 2);
        assert_eq!(check_rel(Path::new("a//b/")).expect("ok").len(), 2);
        assert_eq!(target_rel("/etc//x/").expect("ok"), PathBuf::from("etc/x"));
        assert_eq!(target_rel("/").expect("ok"), PathBuf::new());
        for bad in ["etc/x", "/opt/../../x", "/a/./b", "/.."] {
            assert!(target_rel(bad).is_err(), "{bad:?} refused");
        }
    }

    /// Staged writes change nothing until committed; dropped, they leave
    /// no temp file; committed, the target holds the new bytes and mode.
    #[test]
    fn staged_writes_commit_together_or_leave_nothing() {
        let (_t, root, _) = setup();
        std::fs::write(root.join("a"), "old a").expect("a");
        let r = Root::open(&root).expect("root");
        let listing = || {
            let mut v: Vec<String> = std::fs::read_dir(&root)
                .expect("ls")
                .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        let a = r.stage(Path::new("a"), b"new a", 0o600).expect("stage a");
        let b = r.stage(Path::new("d/b"), b"new b", 0o644).expect("stage b");
        assert_eq!(std::fs::read(root.join("a")).expect("a"), b"old a");
        assert!(!root.join("d/b").exists());
        drop((a, b));
        assert_eq!(listing(), ["a", "d"], "no temp file left");
        assert!(
            std::fs::read_dir(root.join("d"))
                .expect("d")
                .next()
                .is_none()
        );
        let a = r.stage(Path::new("a"), b"new a", 0o600).expect("stage a");
        a.commit().expect("commit");
        assert_eq!(std::fs::read(root.join("a")).expect("a"), b"new a");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(root.join("a"))
            .expect("md")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(listing(), ["a", "d"]);
        assert!(
            r.stage(Path::new("../x"), b"x", 0o644).is_err(),
            "inside the root"
        );
    }

    #[test]
    fn physical_rules() {
        let (_t, root, outside) = setup();
        let r = Root::open(&root).expect("open");
        // A link out (absolute), a link climbing out (relative), a link inside.
        symlink(&outside, root.join("abs")).expect("ln");
        symlink("../outside", root.join("rel")).expect("ln");
        std::fs::create_dir_all(root.join("usr/lib")).expect("mkdir");
        symlink("usr/lib", root.join("lib")).expect("ln");
        symlink(root.join("usr"), root.join("absin")).expect("ln");
        for p in ["abs/x", "rel/x", "abs/secret", "rel/secret"] {
            let e = r
                .write_atomic(Path::new(p), b"x", 0o644, None, true)
                .expect_err(p);
            assert!(e.to_string().contains("leads out of"), "{p}: {e}");
            assert!(r.read(Path::new(p)).is_err(), "{p}: read refused");
            assert!(r.remove_tree(Path::new(p)).is_err(), "{p}: rm refused");
        }
        assert_eq!(std::fs::read(outside.join("secret")).expect("s"), b"s");
        assert!(!outside.join("x").exists());
        // Inside links are followed.
        r.write_atomic(Path::new("lib/x"), b"1", 0o644, None, false)
            .expect("lib/x");
        assert_eq!(std::fs::read(root.join("usr/lib/x")).expect("x"), b"1");
        r.write_atomic(Path::new("absin/lib/y"), b"2", 0o644, None, false)
            .expect("absin");
        assert_eq!(std::fs::read(root.join("usr/lib/y")).expect("y"), b"2");
        // The last component is replaced, not written through.
        symlink(outside.join("secret"), root.join("last")).expect("ln");
        r.write_atomic(Path::new("last"), b"mine", 0o644, None, false)
            .expect("replace link");
        assert_eq!(std::fs::read(outside.join("secret")).expect("s"), b"s");
        assert_eq!(std::fs::read(root.join("last")).expect("last"), b"mine");
        // Removing a link to a directory outside removes the link only.
        assert!(r.remove(Path::new("abs")).expect("rm link"));
        assert!(outside.join("secret").exists());
        symlink(&outside, root.join("abs2")).expect("ln");
        r.remove_tree(Path::new("abs2")).expect("rm tree link");
        assert!(outside.join("secret").exists());
    }

    #[test]
    fn loops_and_dangling_links() {
        let (_t, root, _outside) = setup();
        let r = Root::open(&root).expect("open");
        symlink("b", root.join("a")).expect("ln");
        symlink("a", root.join("b")).expect("ln");
        let e = r
            .write_atomic(Path::new("a/x"), b"x", 0o644, None, true)
            .expect_err("loop");
        assert!(e.to_string().contains("too many levels"), "{e}");
        symlink("nowhere/deeper", root.join("dangling")).expect("ln");
        assert!(r.read(Path::new("dangling")).expect("read").is_none());
        // A dangling link to outside is still refused.
        symlink("/nonexistent-charly-dir/x", root.join("dout")).expect("ln");
        assert!(r.read(Path::new("dout")).is_err());
        // Creating parents through a dangling inside link makes them inside.
        r.write_atomic(Path::new("dangling/f"), b"x", 0o644, None, true)
            .expect("through dangling");
        assert!(root.join("nowhere/deeper/f").is_file());
    }

    #[test]
    fn temps_of_dead_writers_are_swept_live_ones_kept() {
        let (_t, root, _outside) = setup();
        let r = Root::open(&root).expect("open");
        // `d` is any directory (a deploy's $HOME): only locked temps go.
        // `.build/b` is charly's own: unlocked temps of earlier versions and
        // blob copies go too.
        for d in ["d", ".build/b"] {
            std::fs::create_dir_all(root.join(d)).expect("d");
            for (name, text) in [
                (".charly-tmp-1-1", "dead"),
                (".tmpAbC123", "old"),
                (".charly-xY12z9", "old"),
                (".charly-tmp-Q1w2E3", "blob copy"),
                (".charly-tmp-x-1", "not ours"),
                ("keep.txt", "k"),
            ] {
                std::fs::write(root.join(d).join(name), text).expect("write");
            }
        }
        let live = root.join("d/.charly-tmp-2-2");
        std::fs::write(&live, "live").expect("live");
        let holder = File::open(&live).expect("open");
        holder.lock().expect("lock");
        let left = r.sweep_temps(Path::new(""), true).expect("sweep");
        assert!(left.is_empty(), "{left:?}");
        let names = |d: &str| {
            let mut v: Vec<String> = std::fs::read_dir(root.join(d))
                .expect("ls")
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        assert_eq!(
            names("d"),
            [
                ".charly-tmp-2-2",
                ".charly-tmp-Q1w2E3",
                ".charly-tmp-x-1",
                ".charly-xY12z9",
                ".tmpAbC123",
                "keep.txt"
            ]
        );
        assert_eq!(names(".build/b"), [".charly-tmp-x-1", "keep.txt"]);
    }

    #[test]
    fn prune_removes_dead_writers_temp_files_and_keeps_live_ones() {
        let (_t, root, _outside) = setup();
        let r = Root::open(&root).expect("open");
        std::fs::create_dir_all(root.join("box/sub")).expect("mkdir");
        for f in [
            "box/.charly-tmp-7-1",
            "box/sub/.charly-tmp-7-2",
            "box/stale",
        ] {
            std::fs::write(root.join(f), "x").expect("write");
        }
        // A live writer holds the lock of its temp file.
        let live = root.join("box/.charly-tmp-8-1");
        std::fs::write(&live, "being written").expect("live");
        let held = File::open(&live).expect("open live");
        held.lock().expect("lock");
        r.prune(Path::new("box"), &|_, _| false).expect("prune");
        assert!(!root.join("box/stale").exists(), "a stale file is pruned");
        assert!(!root.join("box/.charly-tmp-7-1").exists());
        assert!(
            !root.join("box/sub").exists(),
            "emptied of a dead temp file"
        );
        assert!(live.exists(), "a live writer's temp file was removed");
    }

    #[test]
    fn prune_never_follows_links() {
        let (_t, root, outside) = setup();
        let r = Root::open(&root).expect("open");
        std::fs::create_dir_all(root.join("box/sub")).expect("mkdir");
        std::fs::write(root.join("box/keep"), "k").expect("k");
        std::fs::write(root.join("box/sub/stale"), "s").expect("s");
        symlink(&outside, root.join("box/out")).expect("ln");
        r.prune(Path::new("box"), &|p, _| p == Path::new("box/keep"))
            .expect("prune");
        assert!(root.join("box/keep").exists());
        assert!(!root.join("box/sub").exists());
        assert!(std::fs::symlink_metadata(root.join("box/out")).is_err());
        assert!(outside.join("secret").exists());
        // The pruned directory itself may not be a link out.
        symlink(&outside, root.join("evil")).expect("ln");
        assert!(r.prune(Path::new("evil"), &|_, _| false).is_err());
        assert!(outside.join("secret").exists());
    }
}
