//! Cross-process file locks: per-key build locks and writer sessions.
//!
//! All locks are `std::fs::File::lock` (flock on Unix): they belong to an open
//! file handle, so they exclude other threads of the same process as well as
//! other processes, and the kernel drops them when a process dies, even by
//! SIGKILL. That last property is what lets the store tell abandoned temp files
//! from live ones: every `Store` holds a *session* lock for its lifetime, and
//! its temp files live in a directory named after the session. A temp
//! directory whose session lock can be taken belongs to a dead process.
//!
//! Lock files may be deleted (GC removes unused ones), which is only safe
//! because an acquirer re-checks, after locking, that the path still names the
//! file it locked; if not, it retries with the new file.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::IoContext;
use crate::{CacheError, NodeKey};

/// An exclusive, cross-process lock on one node key; released on drop.
///
/// The engine takes it after a cache miss and checks the cache again before
/// running the node, so two processes never build the same key at once: the
/// second one waits and then finds the first one's record.
#[derive(Debug)]
pub struct KeyLock {
    key: NodeKey,
    // Held only for its lock; closing the handle releases it.
    _file: File,
}

impl KeyLock {
    /// The key this lock protects.
    pub fn key(&self) -> NodeKey {
        self.key
    }
}

/// Blocks until the lock file of `key` at `path` is exclusively ours.
pub(crate) fn acquire_key_lock(path: &Path, key: NodeKey) -> Result<KeyLock, CacheError> {
    Ok(KeyLock {
        key,
        _file: acquire_file_lock(path)?,
    })
}

/// Blocks until the lock file at `path` (created if needed) is exclusively
/// locked through the returned handle.
pub(crate) fn acquire_file_lock(path: &Path) -> Result<File, CacheError> {
    loop {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .at("opening lock file", path)?;
        file.lock().at("locking", path)?;
        if still_linked(&file, path)? {
            return Ok(file);
        }
        // Someone removed the file between our open and our lock: the lock we
        // hold protects nothing. Retry on whatever the path names now.
    }
}

/// Whether `path` still names the very file `file` has open.
fn still_linked(file: &File, path: &Path) -> Result<bool, CacheError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let held = file.metadata().at("inspecting lock file", path)?;
        match fs::metadata(path) {
            Ok(now) => Ok(held.ino() == now.ino() && held.dev() == now.dev()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e).at("inspecting lock file", path),
        }
    }
    #[cfg(not(unix))]
    {
        let _ = (file, path);
        Ok(true)
    }
}

/// Takes the lock at `path` if nobody holds it. `Ok(None)` if it is held or
/// the file is gone; the returned handle keeps the lock.
fn try_take(path: &Path) -> Result<Option<File>, CacheError> {
    let file = match OpenOptions::new().read(true).write(true).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).at("opening lock file", path),
    };
    match file.try_lock() {
        Ok(()) => Ok(still_linked(&file, path)?.then_some(file)),
        Err(TryLockError::WouldBlock) => Ok(None),
        Err(TryLockError::Error(e)) => Err(e).at("locking", path),
    }
}

/// Removes the lock file at `path` if no one holds it; true if removed.
pub(crate) fn remove_if_unheld(path: &Path) -> Result<bool, CacheError> {
    match try_take(path)? {
        Some(_held) => {
            // Unlink while still holding it, so a waiter that then gets the
            // lock sees the path changed and retries.
            remove_file_if_exists(path)?;
            Ok(true)
        }
        None => Ok(false),
    }
}

pub(crate) fn remove_file_if_exists(path: &Path) -> Result<(), CacheError> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e).at("removing", path),
        _ => Ok(()),
    }
}

/// A writer session: a locked `tmp/<id>.lock` plus the temp dir `tmp/<id>/`.
#[derive(Debug)]
pub(crate) struct Session {
    id: String,
    dir: PathBuf,
    lock_path: PathBuf,
    _lock: File,
}

static SESSION_COUNTER: AtomicU64 = AtomicU64::new(0);

fn new_session_id() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mut h = blake3::Hasher::new();
    h.update(&std::process::id().to_le_bytes());
    h.update(&nanos.to_le_bytes());
    h.update(
        &SESSION_COUNTER
            .fetch_add(1, Ordering::Relaxed)
            .to_le_bytes(),
    );
    h.update(format!("{:?}", std::thread::current().id()).as_bytes());
    h.finalize().to_hex()[..16].to_string()
}

impl Session {
    /// Creates a session under `tmp_root` (which must exist).
    ///
    /// The lock file is created and locked under a temporary name and only
    /// then renamed into place, so `<id>.lock` is never seen unlocked while
    /// its owner lives; the temp dir is created after it and removed before it.
    pub(crate) fn create(tmp_root: &Path) -> Result<Session, CacheError> {
        loop {
            let id = new_session_id();
            let pending = tmp_root.join(format!("{id}.lock.new"));
            let file = match OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&pending)
            {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e).at("creating session lock", &pending),
            };
            file.lock().at("locking", &pending)?;
            let lock_path = tmp_root.join(format!("{id}.lock"));
            match fs::rename(&pending, &lock_path) {
                // Between our create and our lock, another opener found the
                // pending file unlocked, took it for a dead session's and
                // removed it: start over under a new id.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                r => r.at("installing session lock", &lock_path)?,
            }
            let dir = tmp_root.join(&id);
            fs::create_dir(&dir).at("creating session temp dir", &dir)?;
            return Ok(Session {
                id,
                dir,
                lock_path,
                _lock: file,
            });
        }
    }

    /// The directory for this session's temp files.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // Best effort: whatever is left is found as stale by verify/gc later.
        let _ = fs::remove_dir_all(&self.dir);
        let _ = fs::remove_file(&self.lock_path);
    }
}

/// Finds the temp entries of dead sessions under `tmp_root` (every entry but
/// `own`'s); with `remove`, deletes them. Returns the stale paths found.
pub(crate) fn stale_session_entries(
    tmp_root: &Path,
    own: &Session,
    remove: bool,
) -> Result<Vec<PathBuf>, CacheError> {
    let mut stale = Vec::new();
    let entries = match fs::read_dir(tmp_root) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(stale),
        Err(e) => return Err(e).at("listing", tmp_root),
    };
    let mut names: Vec<(String, bool)> = Vec::new();
    for entry in entries {
        let entry = entry.at("listing", tmp_root)?;
        let is_dir = entry.file_type().at("inspecting", entry.path())?.is_dir();
        names.push((entry.file_name().to_string_lossy().into_owned(), is_dir));
    }
    // Directories first, so their lock files are still there to be checked.
    names.sort_by_key(|(n, is_dir)| (!is_dir, n.clone()));
    let mut handled = std::collections::HashSet::new();
    for (name, is_dir) in names {
        let path = tmp_root.join(&name);
        if is_dir {
            if name == own.id {
                continue;
            }
            let lock_path = tmp_root.join(format!("{name}.lock"));
            let guard = try_take(&lock_path)?;
            let dead = guard.is_some() || !lock_path.exists();
            if !dead {
                continue;
            }
            // Another opener may be sweeping the same dead session.
            match fs::read_dir(&path) {
                Ok(entries) => {
                    for f in entries {
                        match f {
                            Ok(f) => stale.push(f.path()),
                            Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                            Err(e) => return Err(e).at("listing", &path),
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e).at("listing", &path),
            }
            if guard.is_some() {
                stale.push(lock_path.clone());
                handled.insert(lock_path.clone());
            }
            if remove {
                match fs::remove_dir_all(&path) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => {
                        return Err(e).at("removing stale temp dir", &path);
                    }
                    _ => {}
                }
                if guard.is_some() {
                    remove_file_if_exists(&lock_path)?;
                }
            }
        } else if handled.contains(&path) {
            continue;
        } else if name.ends_with(".lock") || name.ends_with(".lock.new") {
            // A live session's lock is held (even against our own process),
            // so only abandoned ones can be taken.
            if let Some(_held) = try_take(&path)? {
                stale.push(path.clone());
                if remove {
                    remove_file_if_exists(&path)?;
                }
            }
        } else {
            // Nothing else is ever written here.
            stale.push(path.clone());
            if remove {
                remove_file_if_exists(&path)?;
            }
        }
    }
    Ok(stale)
}

/// A private scratch directory outside any store, for a process's
/// short-lived files that must live at a path of its choosing (e.g. an
/// image layout whose path podman turns into a name): `<root>/<id>/`, with
/// the session lock beside it. Dropping it removes both. What a killed
/// process leaves there is removed by the next [`Scratch::open`] on the
/// same root; a live process's directory is never touched.
///
/// `root` is made when missing; in a directory other users can write to
/// (the system temp directory), it must then be a real directory (not a
/// symlink) that this user owns and only it can write to, or opening fails.
#[derive(Debug)]
pub struct Scratch {
    session: Session,
}

impl Scratch {
    /// Opens a fresh scratch directory under `root`, sweeping dead ones.
    pub fn open(root: &Path) -> Result<Scratch, CacheError> {
        match fs::create_dir(root) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e).at("creating scratch root", root),
        }
        let meta = fs::symlink_metadata(root).at("inspecting", root)?;
        {
            use std::os::unix::fs::MetadataExt;
            let own = meta.file_type().is_dir()
                && meta.uid() == rustix::process::geteuid().as_raw()
                && meta.mode() & 0o022 == 0;
            if !own {
                return Err(io::Error::other(
                    "not a directory of this user's that only it can write to",
                ))
                .at("using scratch root", root);
            }
        }
        let session = Session::create(root)?;
        // Best effort, as for a store's temp directory.
        let _ = stale_session_entries(root, &session, true);
        Ok(Scratch { session })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        self.session.dir()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scratch_directory_is_removed_when_dropped_and_swept_when_abandoned() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("scratch");
        let a = Scratch::open(&root).expect("open");
        let a_dir = a.dir().to_path_buf();
        fs::write(a_dir.join("x"), b"x").expect("write");
        // A second process's scratch leaves the live one alone.
        let b = Scratch::open(&root).expect("open again");
        assert!(a_dir.join("x").exists());
        drop(b);
        // What a killed process leaves (its lock unheld): swept by the next.
        let dead = root.join("deadbeefdeadbeef");
        fs::create_dir(&dead).expect("mkdir");
        fs::write(dead.join("layout"), b"half").expect("write");
        fs::write(root.join("deadbeefdeadbeef.lock"), b"").expect("lock");
        let c = Scratch::open(&root).expect("open");
        assert!(!dead.exists(), "a dead process's scratch was left");
        assert!(a_dir.join("x").exists(), "a live one was swept");
        drop(a);
        drop(c);
        let left: Vec<_> = fs::read_dir(&root).expect("list").flatten().collect();
        assert!(left.is_empty(), "{left:?}");
        // A root others can write to, or a symlink, is refused.
        let open = tmp.path().join("open");
        fs::create_dir(&open).expect("mkdir");
        let everyone: fs::Permissions = std::os::unix::fs::PermissionsExt::from_mode(0o777);
        fs::set_permissions(&open, everyone).expect("chmod");
        assert!(Scratch::open(&open).is_err());
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&root, &link).expect("symlink");
        assert!(Scratch::open(&link).is_err());
    }

    #[test]
    fn live_sessions_are_not_stale_and_dead_ones_are() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let a = Session::create(tmp.path()).expect("session a");
        let b = Session::create(tmp.path()).expect("session b");
        fs::write(b.dir().join("blob-x"), b"partial").expect("write");
        // b is alive: nothing is stale from a's point of view.
        assert!(
            stale_session_entries(tmp.path(), &a, false)
                .expect("scan")
                .is_empty()
        );

        // What a SIGKILLed session leaves behind: an unlocked lock file and its
        // temp dir with a partial file.
        let b_dir = tmp.path().join("deadbeefdeadbeef");
        let b_lock = tmp.path().join("deadbeefdeadbeef.lock");
        fs::create_dir(&b_dir).expect("mkdir");
        fs::write(b_dir.join("blob-x"), b"partial").expect("write");
        fs::write(&b_lock, b"").expect("write lock");

        let stale = stale_session_entries(tmp.path(), &a, false).expect("scan");
        assert_eq!(stale.len(), 2, "{stale:?}");
        assert!(stale.contains(&b_dir.join("blob-x")), "{stale:?}");
        assert!(stale.contains(&b_lock), "{stale:?}");
        let removed = stale_session_entries(tmp.path(), &a, true).expect("repair");
        assert_eq!(removed.len(), stale.len());
        assert!(!b_dir.exists() && !b_lock.exists());
        assert!(a.dir().exists() && b.dir().join("blob-x").exists());
        assert!(
            stale_session_entries(tmp.path(), &a, false)
                .expect("scan")
                .is_empty()
        );
    }

    #[test]
    fn key_lock_excludes_other_handles_and_survives_lock_file_removal() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("k.lock");
        let key = NodeKey::from_bytes([1; 32]);
        let held = acquire_key_lock(&path, key).expect("lock");
        assert!(
            !remove_if_unheld(&path).expect("try remove"),
            "held lock removed"
        );
        assert!(path.exists());
        drop(held);
        assert!(remove_if_unheld(&path).expect("remove"));
        assert!(!path.exists());
        let again = acquire_key_lock(&path, key).expect("relock");
        assert_eq!(again.key(), key);
    }
}
