//! The [`Store`]: opening a store directory, the SQLite index and its
//! connection pool, records, roots, statistics and batched access times.
//!
//! Durability: the index runs in WAL mode with `synchronous=NORMAL`. A commit
//! then survives a crash of the process but may be lost on power failure. That
//! is the right trade for a cache: the invariant that matters is "a record
//! never outlives its blobs", and it holds either way because blobs are fsynced
//! (file and directory) before a record naming them is inserted. Blobs stored
//! with [`Store::put_derived_blob`] are not: a power loss may leave their
//! record naming a short or missing blob, which fails verification on read and
//! makes the engine run that (in-process, millisecond) node again. Losing the
//! newest records costs a rebuild, not correctness. GC roots are the exception
//! (a lost root could let GC delete what a live deploy uses), so root changes
//! are committed with `synchronous=FULL`.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior, params};

use crate::error::IoContext;
use crate::lock::{KeyLock, Session, acquire_file_lock, acquire_key_lock};
use crate::{BlobDigest, CacheError, NodeKey, Output, Record};

/// Version of the index schema written by this build. Version 1 kept a
/// record's last access in its row; 2 keeps it in `record_access`
/// ([`MIGRATE_V1`]).
const SCHEMA_VERSION: i64 = 2;

/// How long a connection waits for another writer before giving up. Writers
/// hold the lock for milliseconds; GC may hold it while deleting files.
const BUSY_TIMEOUT: Duration = Duration::from_secs(120);

/// Idle connections kept for reuse; more are opened under contention.
const MAX_IDLE_CONNECTIONS: usize = 8;

/// Pending access-time updates are written once this many have queued
/// (~40 bytes each), else at [`Store::flush`]. Every write ends the read
/// snapshot of the other connections, which then read their pages again:
/// written every 1,024, the access times of a run that hit 38,000 records
/// tripled the CPU time of its lookups.
pub(crate) const TOUCH_BATCH: usize = 1 << 16;

/// A record read again within this many seconds of its recorded last access
/// is not touched again: LRU at minute resolution is plenty for GC.
pub(crate) const ACCESS_RESOLUTION_SECS: u64 = 60;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS blobs (
    digest      TEXT PRIMARY KEY,
    csize       INTEGER NOT NULL,   -- bytes on disk (compressed)
    lsize       INTEGER NOT NULL,   -- logical (uncompressed) bytes
    last_access INTEGER NOT NULL    -- unix seconds
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS records (
    key          TEXT PRIMARY KEY,  -- NodeKey hex
    node_id      TEXT NOT NULL,
    kind         TEXT NOT NULL,
    outputs      TEXT NOT NULL,     -- JSON: name -> {digest, size, mode}
    duration_ms  INTEGER NOT NULL,
    producer     TEXT NOT NULL,
    key_inputs   TEXT NOT NULL,     -- JSON
    created_unix INTEGER NOT NULL,
    meta         TEXT NOT NULL      -- JSON
);
CREATE INDEX IF NOT EXISTS records_node_id ON records (node_id, created_unix);
CREATE TABLE IF NOT EXISTS record_access (
    key         TEXT PRIMARY KEY,   -- a record's key
    last_access INTEGER NOT NULL    -- unix seconds
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS record_blobs (
    key    TEXT NOT NULL,
    digest TEXT NOT NULL,
    PRIMARY KEY (key, digest)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS roots (
    name TEXT PRIMARY KEY,
    key  TEXT NOT NULL
) WITHOUT ROWID;
";

/// From schema 1 to 2: a record's last access leaves its row for
/// `record_access`. A record row is ~1.3 KB (its outputs and key inputs):
/// counting the accesses of a run that hit 38,000 records rewrote 38,000
/// rows, one page each, and the index by access time (~360 ms at 10,000
/// candies × 1,000 boxes, whenever the last run was a minute ago). A row
/// of `record_access` is ~75 bytes: the same update writes ~50 times
/// fewer pages. GC sorts by access time itself; no index keeps the order.
const MIGRATE_V1: &str = "
CREATE TABLE record_access (
    key         TEXT PRIMARY KEY,
    last_access INTEGER NOT NULL
) WITHOUT ROWID;
INSERT OR IGNORE INTO record_access (key, last_access) SELECT key, last_access FROM records;
DROP INDEX IF EXISTS records_last_access;
ALTER TABLE records DROP COLUMN last_access;
";

/// Counts and sizes of a store, for `charly cache stats`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    /// Records in the action cache.
    pub records: u64,
    /// Indexed blobs.
    pub blobs: u64,
    /// Bytes the blobs take on disk (compressed).
    pub compressed_bytes: u64,
    /// Bytes the blobs hold (uncompressed).
    pub logical_bytes: u64,
    /// GC roots.
    pub roots: u64,
    /// Files in `quarantine/`.
    pub quarantined: u64,
    /// Bytes of the SQLite index (database plus write-ahead log).
    pub index_bytes: u64,
}

/// Where "now" comes from; tests drive a manual clock to order accesses.
#[derive(Debug)]
pub(crate) enum Clock {
    System,
    #[cfg(test)]
    Manual(AtomicU64),
}

#[derive(Debug, Default)]
pub(crate) struct Touches {
    pub(crate) records: HashMap<NodeKey, u64>,
    pub(crate) blobs: HashMap<BlobDigest, u64>,
}

impl Touches {
    fn len(&self) -> usize {
        self.records.len() + self.blobs.len()
    }
}

/// A content-addressed store in one directory. `Send + Sync`: share `&Store`
/// across threads. Several processes may open the same directory at once.
#[derive(Debug)]
pub struct Store {
    pub(crate) root: PathBuf,
    pub(crate) blobs_dir: PathBuf,
    /// `blobs_dir`, open (`O_PATH`): a blob is looked up relative to it,
    /// two path components instead of the store's whole path.
    pub(crate) blobs_fd: Option<rustix::fd::OwnedFd>,
    pub(crate) tmp_dir: PathBuf,
    pub(crate) quarantine_dir: PathBuf,
    pub(crate) locks_dir: PathBuf,
    db_path: PathBuf,
    idle: Mutex<Vec<Connection>>,
    /// Held by every write transaction of this process ([`Store::begin_write`]).
    write_gate: Mutex<()>,
    touches: Mutex<Touches>,
    /// Write transactions spent on access times (observable in tests).
    pub(crate) touch_flushes: AtomicU64,
    pub(crate) clock: Clock,
    pub(crate) session: Session,
    notes: Mutex<Vec<String>>,
    /// Whether opening ran SQLite's `quick_check` (see [`init_index`]).
    pub(crate) index_checked: bool,
}

pub(crate) fn lock_ignoring_poison<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves its data consistent, so a panic in
    // another thread does not invalidate it.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// u64 -> SQLite integer (values here are sizes and times, far below i64::MAX).
pub(crate) fn to_sql_int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// SQLite integer -> u64 (negative values never written; clamp if found).
pub(crate) fn from_sql_int(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn create_dir(path: &Path) -> Result<(), CacheError> {
    fs::create_dir_all(path).at("creating directory", path)
}

fn open_connection(path: &Path) -> Result<Connection, CacheError> {
    let mut conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_handler(Some(busy_wait))?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    Ok(conn)
}

/// How many times this process's connections waited for a lock another
/// connection held ([`busy_waits`]).
static BUSY_WAITS: AtomicU64 = AtomicU64::new(0);

/// How many times, so far, this process waited for the index's lock held
/// by another connection (its own, when two threads write at once without
/// `Store::begin_write`, or another process's).
pub fn busy_waits() -> u64 {
    BUSY_WAITS.load(Ordering::Relaxed)
}

/// SQLite's own busy handler for a timeout of [`BUSY_TIMEOUT`] (its
/// `sqliteDefaultBusyCallback`: sleeps of 1, 2, 5… 100 ms), counted.
/// `count` is how many times this lock event waited already.
fn busy_wait(count: i32) -> bool {
    const DELAYS_MS: [u64; 12] = [1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50, 100];
    let n = usize::try_from(count).unwrap_or(0);
    let (delay, prior) = match DELAYS_MS.get(n) {
        Some(d) => (*d, DELAYS_MS[..n].iter().sum::<u64>()),
        None => {
            let last = DELAYS_MS[DELAYS_MS.len() - 1];
            let over = (n - (DELAYS_MS.len() - 1)) as u64;
            (
                last,
                DELAYS_MS[..DELAYS_MS.len() - 1].iter().sum::<u64>() + last * over,
            )
        }
    };
    let timeout = BUSY_TIMEOUT.as_millis() as u64;
    let delay = delay.min(timeout.saturating_sub(prior));
    if delay == 0 {
        return false;
    }
    BUSY_WAITS.fetch_add(1, Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(delay));
    true
}

/// The fingerprint of the index files (`index.db` and its WAL: size,
/// mtime, ctime, inode of each) as text, for the "checked" stamp.
fn index_fingerprint(db_path: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let mut wal = db_path.as_os_str().to_owned();
    wal.push("-wal");
    [db_path.to_path_buf(), PathBuf::from(wal)]
        .iter()
        .map(|p| match fs::metadata(p) {
            Ok(m) => format!(
                "{} {}.{} {}.{} {}",
                m.len(),
                m.mtime(),
                m.mtime_nsec(),
                m.ctime(),
                m.ctime_nsec(),
                m.ino()
            ),
            Err(_) => "absent".to_string(),
        })
        .collect::<Vec<_>>()
        .join(" / ")
}

/// Where the fingerprint of the index as charly last left it, or last
/// found it sound, is kept.
fn checked_stamp(db_path: &Path) -> PathBuf {
    db_path.with_file_name("index.checked")
}

/// Opens the index at `path`, switches it to WAL, creates or checks its
/// schema and runs SQLite's `quick_check` — unless the index files are
/// exactly as charly last left them or last found them sound (their
/// fingerprint, ctime included, equals the stamp): the check reads the
/// whole file, which at a few thousand nodes is most of a no-op's system
/// time. Returns whether the check ran. The caller holds `init.lock`.
fn init_index(db_path: &Path) -> Result<(Connection, bool), CacheError> {
    let stamp = checked_stamp(db_path);
    let unchanged = fs::read_to_string(&stamp).is_ok_and(|s| s == index_fingerprint(db_path));
    let conn = open_connection(db_path)?;
    let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(CacheError::NoWal {
            path: db_path.to_path_buf(),
            mode,
        });
    }
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version > SCHEMA_VERSION {
        return Err(CacheError::IncompatibleIndex {
            path: db_path.to_path_buf(),
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    if version < SCHEMA_VERSION {
        let steps = if version == 1 { MIGRATE_V1 } else { SCHEMA };
        conn.execute_batch(&format!(
            "BEGIN IMMEDIATE; {steps} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
        ))?;
    }
    drop_digest_index(&conn)?;
    // Damage anywhere in the file (not only in the header the statements
    // above read) is found now rather than halfway through a build.
    if unchanged {
        return Ok((conn, false));
    }
    let problems = quick_check(&conn)?;
    if !problems.is_empty() {
        return Err(CacheError::DamagedIndex {
            path: db_path.to_path_buf(),
            problems,
        });
    }
    // Best effort: without the stamp the next open checks again.
    let _ = fs::write(&stamp, index_fingerprint(db_path));
    Ok((conn, true))
}

/// Drops the index of `record_blobs` by digest that the first stores had.
/// It served only GC, which now counts references itself, and it cost
/// every new record a write to a random page per output: most of the WAL
/// an edit run writes, and of the checkpoint that copies it back. No
/// schema version change: a charly that still creates the index opens the
/// store as it is and works (its GC slower).
fn drop_digest_index(conn: &Connection) -> Result<(), CacheError> {
    let present: Option<i64> = conn
        .query_row(
            "SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = 'record_blobs_digest'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    if present.is_some() {
        conn.execute_batch("DROP INDEX IF EXISTS record_blobs_digest")?;
    }
    Ok(())
}

/// SQLite's `quick_check`: the problems it reports (empty when fine).
pub(crate) fn quick_check(conn: &Connection) -> Result<Vec<String>, CacheError> {
    let mut st = conn.prepare("PRAGMA quick_check")?;
    let rows = st.query_map([], |r| r.get::<_, String>(0))?;
    let msgs: Vec<String> = rows.collect::<Result<_, _>>()?;
    Ok(msgs.into_iter().filter(|m| m != "ok").collect())
}

/// Whether an error means the index file itself is damaged (as opposed to
/// busy, unreadable, newer than us or on a file system without WAL).
pub(crate) fn is_damage(e: &CacheError) -> bool {
    match e {
        CacheError::DamagedIndex { .. } => true,
        CacheError::Sqlite(rusqlite::Error::SqliteFailure(f, _)) => matches!(
            f.code,
            rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase
        ),
        _ => false,
    }
}

/// Renames `index.db` and its `-wal` and `-shm` files to
/// `index.db.corrupt-<unix time>-<pid>` (+ suffix), keeping them for
/// inspection; returns the new name of the database file.
fn move_index_aside(db_path: &Path) -> Result<PathBuf, CacheError> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let aside = PathBuf::from(format!(
        "{}.corrupt-{}.{:09}-{}",
        db_path.display(),
        now.as_secs(),
        now.subsec_nanos(),
        std::process::id()
    ));
    // The WAL and shared-memory files belong to the damaged database: left
    // behind, SQLite would apply the old log to the new file.
    for suffix in ["-wal", "-shm", ""] {
        let from = PathBuf::from(format!("{}{suffix}", db_path.display()));
        let to = PathBuf::from(format!("{}{suffix}", aside.display()));
        match fs::rename(&from, &to) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(e).at("moving the damaged index aside", from);
            }
            _ => {}
        }
    }
    Ok(aside)
}

fn moved_aside_note(db_path: &Path, aside: &Path, e: &CacheError) -> String {
    let why = match e {
        CacheError::DamagedIndex { problems, .. } => problems.first().cloned().unwrap_or_default(),
        other => other.to_string(),
    };
    format!(
        "cache: the index {} was damaged ({why}); moved it aside to {} and started an empty \
         one (cached results are rebuilt as needed; `charly cache verify --repair` re-indexes \
         the blobs)",
        db_path.display(),
        aside.display()
    )
}

/// Blobs found present by lookups that run together
/// ([`Store::has_records`] over a graph's chunks, from several threads):
/// each blob's file is looked for once. It lives as long as the lookups
/// do; a blob removed after it was seen is met by its reader, which runs
/// the node again.
///
/// A blob directory (`blobs/ab/`) asked about more than `LIST_AFTER`
/// times is listed once and answered from the listing: a full run at
/// 10,000 candies looked for ~43,000 blobs, one `statat` each, where
/// listing all 256 directories reads a few hundred blocks. A listing is
/// a snapshot as a stat is: a blob that goes after it is met by its
/// reader; one that comes after it is a miss, and its node runs again.
#[derive(Default)]
pub struct SeenBlobs {
    seen: Mutex<std::collections::HashSet<BlobDigest>>,
    /// By a blob directory's first byte: the blobs looked for there one
    /// by one so far, or the directory's listing.
    dirs: Mutex<HashMap<u8, BlobDir>>,
}

/// What [`SeenBlobs`] knows of one blob directory.
enum BlobDir {
    Asked(usize),
    Listed(Arc<std::collections::HashSet<BlobDigest>>),
}

/// Lookups in one blob directory after which it is listed.
const LIST_AFTER: usize = 16;

impl SeenBlobs {
    fn contains(&self, d: &BlobDigest) -> bool {
        lock_ignoring_poison(&self.seen).contains(d)
    }

    fn insert(&self, d: BlobDigest) {
        lock_ignoring_poison(&self.seen).insert(d);
    }

    /// The listing of the directory of `d` once it has been asked about
    /// often enough (listed now if this is the time), else `None`: look
    /// for the file itself.
    fn listing(
        &self,
        store: &Store,
        d: &BlobDigest,
    ) -> Option<Arc<std::collections::HashSet<BlobDigest>>> {
        let first = d.as_bytes()[0];
        let mut dirs = lock_ignoring_poison(&self.dirs);
        let entry = dirs.entry(first).or_insert(BlobDir::Asked(0));
        match entry {
            BlobDir::Listed(l) => Some(l.clone()),
            BlobDir::Asked(n) if *n < LIST_AFTER => {
                *n += 1;
                None
            }
            BlobDir::Asked(_) => {
                let l = Arc::new(store.list_blob_dir(first)?);
                *entry = BlobDir::Listed(l.clone());
                Some(l)
            }
        }
    }
}

impl Store {
    /// Opens (creating if needed) the store in `dir`.
    ///
    /// An index that SQLite finds damaged is moved aside (see
    /// [`Store::take_notes`]) and an empty one started: a cache must never
    /// block a build.
    pub fn open(dir: &Path) -> Result<Store, CacheError> {
        let root = dir.to_path_buf();
        let blobs_dir = root.join("blobs");
        let tmp_dir = root.join("tmp");
        let quarantine_dir = root.join("quarantine");
        let locks_dir = root.join("locks");
        for d in [&root, &blobs_dir, &tmp_dir, &quarantine_dir, &locks_dir] {
            create_dir(d)?;
        }
        let db_path = root.join("index.db");

        // Switching to WAL and creating tables want exclusive access; rather
        // than rely on SQLite's busy handling for those, concurrent openers
        // take turns on a plain file lock. The damage check and a move aside
        // happen under the same lock, on whatever `index.db` names then: of
        // two processes that both saw a damaged index, the second finds the
        // first one's fresh index healthy and keeps it.
        let init_lock = acquire_file_lock(&root.join("init.lock"))?;
        let mut notes = Vec::new();
        let (conn, index_checked) = match init_index(&db_path) {
            Ok(c) => c,
            Err(e) if is_damage(&e) => {
                let aside = move_index_aside(&db_path)?;
                notes.push(moved_aside_note(&db_path, &aside, &e));
                init_index(&db_path)?
            }
            Err(e) => return Err(e),
        };
        drop(init_lock);

        let session = Session::create(&tmp_dir)?;
        // Temp files of processes that died (their session lock is free) are
        // removed by the next opener; a live session is never touched.
        // Best effort: a failure here only leaves them for the next run.
        let _ = crate::lock::stale_session_entries(&tmp_dir, &session, true);
        let blobs_fd = rustix::fs::open(
            &blobs_dir,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .ok();
        Ok(Store {
            root,
            blobs_dir,
            blobs_fd,
            tmp_dir,
            quarantine_dir,
            locks_dir,
            db_path,
            idle: Mutex::new(vec![conn]),
            write_gate: Mutex::new(()),
            touches: Mutex::new(Touches::default()),
            touch_flushes: AtomicU64::new(0),
            clock: Clock::System,
            session,
            notes: Mutex::new(notes),
            index_checked,
        })
    }

    /// Whether opening ran SQLite's `quick_check` on the index (it does
    /// unless the index files are exactly as charly last left them).
    pub fn index_was_checked(&self) -> bool {
        self.index_checked
    }

    /// Takes the notes the store made since the last call: damage it found
    /// and handled on its own (a blob that failed verification and was
    /// quarantined, a record that did not decode and was dropped, a damaged
    /// index moved aside). None of them is an error — each turned into a
    /// miss — but a person should hear about it once.
    pub fn take_notes(&self) -> Vec<String> {
        std::mem::take(&mut *lock_ignoring_poison(&self.notes))
    }

    /// Adds a note for [`Store::take_notes`] (identical notes are kept once).
    pub fn add_note(&self, note: impl Into<String>) {
        let note = note.into();
        let mut notes = lock_ignoring_poison(&self.notes);
        if !notes.contains(&note) {
            notes.push(note);
        }
    }

    /// Moves the index aside and starts an empty one in its place (after
    /// `verify` found it damaged). Every pooled connection is closed first;
    /// connections of other processes keep the old file until they close.
    pub(crate) fn replace_index(&self, why: &str) -> Result<PathBuf, CacheError> {
        self.bump_epoch()?;
        let init_lock = acquire_file_lock(&self.root.join("init.lock"))?;
        lock_ignoring_poison(&self.idle).clear();
        let aside = move_index_aside(&self.db_path)?;
        let (conn, _) = init_index(&self.db_path)?;
        drop(init_lock);
        lock_ignoring_poison(&self.idle).push(conn);
        self.add_note(format!(
            "cache: the index {} was damaged ({why}); moved it aside to {} and rebuilt it from the blobs",
            self.db_path.display(),
            aside.display()
        ));
        Ok(aside)
    }

    /// The conventional store location: `$CHARLY_CACHE_DIR`, else
    /// `$XDG_CACHE_HOME/charly`, else `~/.cache/charly`. `None` if none is set.
    pub fn default_dir() -> Option<PathBuf> {
        default_dir_from(|name| std::env::var_os(name))
    }

    /// The directory this store lives in.
    pub fn dir(&self) -> &Path {
        &self.root
    }

    /// This process's scratch directory, on the store's file system: what
    /// is left in it when the process dies (killed mid-build) is removed by
    /// the next process that opens the store, never while this one lives.
    pub fn scratch_dir(&self) -> &Path {
        self.session.dir()
    }

    pub(crate) fn now(&self) -> u64 {
        match &self.clock {
            Clock::System => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            #[cfg(test)]
            Clock::Manual(t) => t.load(Ordering::SeqCst),
        }
    }

    /// Closes the pooled connections: the next use opens the index again.
    #[cfg(test)]
    pub(crate) fn close_idle_connections(&self) {
        lock_ignoring_poison(&self.idle).clear();
    }

    /// Runs `f` with a pooled connection (opening one if all are busy).
    pub(crate) fn with_conn<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, CacheError>,
    ) -> Result<T, CacheError> {
        let pooled = lock_ignoring_poison(&self.idle).pop();
        let mut conn = match pooled {
            Some(c) => c,
            None => open_connection(&self.db_path)?,
        };
        let result = f(&mut conn);
        let mut idle = lock_ignoring_poison(&self.idle);
        if idle.len() < MAX_IDLE_CONNECTIONS {
            idle.push(conn);
        }
        result
    }

    /// Begins a write (`IMMEDIATE`) transaction on `c`. This process's
    /// writers queue on a mutex first: two of its threads asking SQLite
    /// for the write lock at once made one of them sleep in SQLite's busy
    /// handler (1, 2, 5, 10 ms… for a transaction that takes tens of
    /// microseconds): ~30 ms of sleep in a run that stored 11 nodes.
    /// Other processes still wait through the busy handler.
    pub(crate) fn begin_write<'c>(
        &self,
        c: &'c mut Connection,
    ) -> Result<WriteTx<'_, 'c>, CacheError> {
        let gate = lock_ignoring_poison(&self.write_gate);
        let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
        Ok(WriteTx { tx, _gate: gate })
    }

    /// Looks up the record for `key`. A record whose blobs are not all present
    /// is a miss (`Ok(None)`). A record that does not decode (damaged JSON or
    /// columns) is dropped, noted ([`Store::take_notes`]) and a miss too: the
    /// node is rebuilt and recorded afresh. A hit counts as an access for GC.
    pub fn get_record(&self, key: &NodeKey) -> Result<Option<Record>, CacheError> {
        let hex = key.to_hex();
        let Some(decoded) = self.decoded_record(&hex, true)? else {
            return Ok(None);
        };
        let Some(rec) = decoded else {
            self.drop_undecodable_record(&hex)?;
            return Ok(None);
        };
        Ok(self
            .hit(key, &rec.outputs, &SeenBlobs::default())?
            .then_some(rec))
    }

    /// The record for `key` as a reader of its outputs needs it, without
    /// the two costs of [`Store::get_record`] such a reader does not need:
    /// its key inputs are not read (`key_inputs` is null), and its output
    /// blobs are not looked up first — the reader gets each one it uses
    /// with [`Store::get_blob`], and one that is gone is its miss. An
    /// access for GC, as a hit is. A record that does not decode is
    /// dropped, as `get_record` drops it.
    pub fn read_record(&self, key: &NodeKey) -> Result<Option<Record>, CacheError> {
        let Some(decoded) = self.decoded_record(&key.to_hex(), false)? else {
            return Ok(None);
        };
        let Some(rec) = decoded else {
            return self.get_record(key);
        };
        self.touch_record(key)?;
        Ok(Some(rec))
    }

    /// The record `hex` decoded: `None` when there is none, `Some(None)`
    /// when it does not decode. Without `with_inputs`, its key inputs are
    /// not read (null).
    fn decoded_record(
        &self,
        hex: &str,
        with_inputs: bool,
    ) -> Result<Option<Option<Record>>, CacheError> {
        let sql = if with_inputs {
            "SELECT node_id, kind, outputs, duration_ms, producer, key_inputs,
                    created_unix, meta
             FROM records WHERE key = ?1"
        } else {
            "SELECT node_id, kind, outputs, duration_ms, producer, 'null',
                    created_unix, meta
             FROM records WHERE key = ?1"
        };
        let row = self.record_row(sql, hex, RecordRow::read)?;
        Ok(row.map(|row| row.ok().and_then(|row| row.decode(hex).ok())))
    }

    /// Whether a usable record for `key` is present: what [`Store::get_record`]
    /// answers with `Some`, without decoding the record's inputs and
    /// metadata (the cache-hit check of every node of every run). A record
    /// whose outputs do not decode is read (and dropped) as `get_record`
    /// does.
    pub fn has_record(&self, key: &NodeKey) -> Result<bool, CacheError> {
        let row = self.record_row(HAS_RECORD_SQL, &key.to_hex(), read_has_row)?;
        self.row_is_hit(key, row, &SeenBlobs::default())
    }

    /// [`Store::has_record`] for many keys: one connection and one read
    /// transaction for all of them. Each lookup on its own took the
    /// index's shared lock again, a third of its time: a run at 10,000
    /// candies looks up 38,000 keys. A key whose lookup fails is a miss
    /// (its node runs and reports what went wrong, as it would anyway).
    ///
    /// `seen` holds the blobs found present by the lookups this one runs
    /// beside: each blob's file is looked for once. Sibling boxes' fragments
    /// share most of their outputs (at 10,000 candies, 139,000 outputs name
    /// 43,000 blobs).
    pub fn has_records(&self, keys: &[NodeKey], seen: &SeenBlobs) -> Vec<bool> {
        let rows = self.with_conn(|c| {
            let tx = c.transaction()?;
            let mut rows = Vec::with_capacity(keys.len());
            {
                let mut st = tx.prepare_cached(HAS_RECORD_SQL)?;
                for k in keys {
                    rows.push(row_or_damage(st.query_row([k.to_hex()], read_has_row))?);
                }
            }
            tx.finish()?;
            Ok(rows)
        });
        match rows {
            Ok(rows) => keys
                .iter()
                .zip(rows)
                .map(|(k, row)| self.row_is_hit(k, row, seen).unwrap_or(false))
                .collect(),
            // One at a time, as without the batch.
            Err(_) => keys
                .iter()
                .map(|k| self.has_record(k).unwrap_or(false))
                .collect(),
        }
    }

    /// Whether a record's row read by [`HAS_RECORD_SQL`] is a hit. One whose
    /// outputs do not decode is read (and dropped) as `get_record` does.
    fn row_is_hit(
        &self,
        key: &NodeKey,
        row: Option<Result<String, ()>>,
        seen: &SeenBlobs,
    ) -> Result<bool, CacheError> {
        let Some(row) = row else { return Ok(false) };
        let outputs = row.ok().and_then(|outputs| {
            serde_json::from_str::<BTreeMap<String, crate::record::Output>>(&outputs).ok()
        });
        let Some(outputs) = outputs else {
            return Ok(self.get_record(key)?.is_some());
        };
        self.hit(key, &outputs, seen)
    }

    /// The row of the record `hex` read by `read` from `sql` (a `SELECT …
    /// FROM records WHERE key = ?1`): `None` when there is none,
    /// `Some(Err(()))` when a column does not hold the type it should.
    fn record_row<T>(
        &self,
        sql: &str,
        hex: &str,
        read: impl FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    ) -> Result<Option<Result<T, ()>>, CacheError> {
        self.with_conn(|c| row_or_damage(c.prepare_cached(sql)?.query_row([hex], read)))
    }

    /// Whether a found record is a hit (every output blob present); a hit
    /// counts as an access for GC.
    fn hit(
        &self,
        key: &NodeKey,
        outputs: &BTreeMap<String, crate::record::Output>,
        seen: &SeenBlobs,
    ) -> Result<bool, CacheError> {
        let present = |d: &BlobDigest| {
            if seen.contains(d) {
                return true;
            }
            let found = match seen.listing(self, d) {
                Some(listed) => listed.contains(d),
                None => self.has_blob(d),
            };
            if found {
                seen.insert(*d);
            }
            found
        };
        if !outputs.values().all(|o| present(&o.digest)) {
            return Ok(false);
        }
        self.touch_record(key)?;
        Ok(true)
    }

    /// Counts an access to the record `key` for GC. Queued: the lookup
    /// reads no access time, and [`Store::flush`] writes only those
    /// older than [`ACCESS_RESOLUTION_SECS`].
    fn touch_record(&self, key: &NodeKey) -> Result<(), CacheError> {
        let now = self.now();
        self.queue_touch(|t| {
            t.records.insert(*key, now);
        })
    }

    /// Deletes the record `hex` if it still does not decode (re-read under
    /// the write lock: a concurrent writer may have just replaced it).
    fn drop_undecodable_record(&self, hex: &str) -> Result<(), CacheError> {
        self.bump_epoch()?;
        let dropped = self.with_conn(|c| {
            let tx = self.begin_write(c)?;
            let still_bad = match tx
                .prepare_cached(
                    "SELECT node_id, kind, outputs, duration_ms, producer, key_inputs,
                            created_unix, meta
                     FROM records WHERE key = ?1",
                )?
                .query_row([hex], RecordRow::read)
                .optional()
            {
                Ok(Some(row)) => row.decode(hex).is_err(),
                Ok(None) => false,
                Err(e) if is_bad_value(&e) => true,
                Err(e) => return Err(e.into()),
            };
            if still_bad {
                delete_record(&tx, hex)?;
            }
            tx.commit()?;
            Ok(still_bad)
        })?;
        if dropped {
            self.add_note(format!(
                "cache: record {} was damaged (it did not decode); dropped it, its node is rebuilt",
                &hex[..12.min(hex.len())]
            ));
        }
        Ok(())
    }

    /// Inserts `rec` under `key` unless a record is already there: the first
    /// writer wins and `false` means one existed. Every output blob must be in
    /// the store with the recorded size (checked in the inserting transaction,
    /// so a concurrent GC cannot slip in between). An existing record whose
    /// blobs are gone is replaced.
    pub fn put_record(&self, key: &NodeKey, rec: &Record) -> Result<bool, CacheError> {
        let hex = key.to_hex();
        let outputs = to_json(&rec.outputs, &hex)?;
        let key_inputs = to_json(&rec.key_inputs, &hex)?;
        let meta = to_json(&rec.meta, &hex)?;
        let now = self.now();
        self.with_conn(|c| {
            let tx = self.begin_write(c)?;
            let existing: Option<String> = tx
                .prepare_cached("SELECT outputs FROM records WHERE key = ?1")?
                .query_row([&hex], |r| r.get(0))
                .optional()?;
            if let Some(existing) = existing {
                let intact =
                    serde_json::from_str::<std::collections::BTreeMap<String, Output>>(&existing)
                        .map(|outs| outs.values().all(|o| self.has_blob(&o.digest)))
                        .unwrap_or(false);
                if intact {
                    return Ok(false);
                }
                delete_record(&tx, &hex)?;
            }
            for (name, out) in &rec.outputs {
                let d = out.digest.to_hex();
                let path = self.blob_path(&out.digest);
                let on_disk = match fs::metadata(&path) {
                    Ok(m) => m,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {
                        return Err(CacheError::MissingBlob {
                            key: *key,
                            output: name.clone(),
                            digest: out.digest,
                        });
                    }
                    Err(e) => return Err(e).at("inspecting blob", path),
                };
                let lsize: Option<i64> = tx
                    .prepare_cached("SELECT lsize FROM blobs WHERE digest = ?1")?
                    .query_row([&d], |r| r.get(0))
                    .optional()?;
                match lsize.map(from_sql_int) {
                    Some(actual) if actual != out.size => {
                        return Err(CacheError::OutputSizeMismatch {
                            key: *key,
                            output: name.clone(),
                            digest: out.digest,
                            claimed: out.size,
                            actual,
                        });
                    }
                    Some(_) => {}
                    None => {
                        // The file is there but unindexed (a writer died
                        // between rename and index update). verify re-derives
                        // the sizes if the claim was wrong.
                        tx.prepare_cached(
                            "INSERT OR IGNORE INTO blobs (digest, csize, lsize, last_access)
                             VALUES (?1, ?2, ?3, ?4)",
                        )?
                        .execute(params![
                            d,
                            to_sql_int(on_disk.len()),
                            to_sql_int(out.size),
                            to_sql_int(now)
                        ])?;
                    }
                }
            }
            tx.prepare_cached(
                "INSERT INTO records (key, node_id, kind, outputs, duration_ms, producer,
                                      key_inputs, created_unix, meta)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            )?
            .execute(params![
                hex,
                rec.node_id,
                rec.kind,
                outputs,
                to_sql_int(rec.duration_ms),
                rec.producer,
                key_inputs,
                to_sql_int(rec.created_unix),
                meta,
            ])?;
            tx.prepare_cached(
                "INSERT OR REPLACE INTO record_access (key, last_access) VALUES (?1, ?2)",
            )?
            .execute(params![hex, to_sql_int(now)])?;
            for d in rec.blob_digests() {
                tx.prepare_cached("INSERT INTO record_blobs (key, digest) VALUES (?1, ?2)")?
                    .execute(params![hex, d.to_hex()])?;
            }
            tx.commit()?;
            Ok(true)
        })
    }

    /// The newest record (by `created_unix`, then insertion order) for a
    /// stable node id, whether or not its blobs are still present: `charly
    /// explain` needs its key inputs, not its outputs.
    pub fn last_record_for(&self, node_id: &str) -> Result<Option<(NodeKey, Record)>, CacheError> {
        let row = self.with_conn(|c| {
            let mut st = c.prepare_cached(
                "SELECT node_id, kind, outputs, duration_ms, producer, key_inputs,
                        created_unix, meta, key
                 FROM records WHERE node_id = ?1
                 ORDER BY created_unix DESC, rowid DESC LIMIT 1",
            )?;
            Ok(st
                .query_row([node_id], |r| {
                    Ok((RecordRow::read(r)?, r.get::<_, String>(8)?))
                })
                .optional()?)
        })?;
        let Some((row, hex)) = row else {
            return Ok(None);
        };
        // A damaged record explains nothing; get_record drops it.
        let (Ok(key), Ok(rec)) = (hex.parse::<NodeKey>(), row.decode(&hex)) else {
            return Ok(None);
        };
        Ok(Some((key, rec)))
    }

    /// Takes the exclusive cross-process build lock of `key`, waiting for it
    /// if another thread or process holds it. Released when dropped.
    ///
    /// Use: miss, lock, look up again (the previous holder may have just
    /// recorded it), and only then run the node and put its record.
    pub fn lock_key(&self, key: &NodeKey) -> Result<KeyLock, CacheError> {
        acquire_key_lock(&self.locks_dir.join(format!("{key}.lock")), *key)
    }

    /// Makes `name` (e.g. `box:fedora`, `deploy:web`) a GC root pointing at
    /// `key`, replacing its previous target. GC never removes a rooted record
    /// or its blobs.
    pub fn set_root(&self, name: &str, key: &NodeKey) -> Result<(), CacheError> {
        if name.is_empty() {
            return Err(CacheError::EmptyRootName);
        }
        self.with_conn(|c| {
            with_full_sync(self, c, |c| {
                c.execute(
                    "INSERT INTO roots (name, key) VALUES (?1, ?2)
                     ON CONFLICT (name) DO UPDATE SET key = excluded.key",
                    params![name, key.to_hex()],
                )?;
                Ok(())
            })
        })
    }

    /// Removes the GC root `name` (no-op if absent).
    pub fn remove_root(&self, name: &str) -> Result<(), CacheError> {
        self.with_conn(|c| {
            with_full_sync(self, c, |c| {
                c.execute("DELETE FROM roots WHERE name = ?1", [name])?;
                Ok(())
            })
        })
    }

    /// All GC roots, sorted by name.
    pub fn roots(&self) -> Result<Vec<(String, NodeKey)>, CacheError> {
        let rows = self.with_conn(|c| {
            let mut st = c.prepare_cached("SELECT name, key FROM roots ORDER BY name")?;
            let rows =
                st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })?;
        rows.into_iter()
            .map(|(name, hex)| Ok((name, hex.parse()?)))
            .collect()
    }

    /// Counts and sizes (flushes pending access times first).
    pub fn stats(&self) -> Result<Stats, CacheError> {
        self.flush()?;
        let mut stats = self.with_conn(|c| {
            let (records, roots): (i64, i64) = c.query_row(
                "SELECT (SELECT COUNT(*) FROM records), (SELECT COUNT(*) FROM roots)",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?;
            let (blobs, csize, lsize): (i64, i64, i64) = c.query_row(
                "SELECT COUNT(*), COALESCE(SUM(csize), 0), COALESCE(SUM(lsize), 0) FROM blobs",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )?;
            Ok(Stats {
                records: from_sql_int(records),
                blobs: from_sql_int(blobs),
                compressed_bytes: from_sql_int(csize),
                logical_bytes: from_sql_int(lsize),
                roots: from_sql_int(roots),
                ..Stats::default()
            })
        })?;
        stats.quarantined = fs::read_dir(&self.quarantine_dir)
            .at("listing", &self.quarantine_dir)?
            .count() as u64;
        for suffix in ["", "-wal"] {
            let p = PathBuf::from(format!("{}{suffix}", self.db_path.display()));
            stats.index_bytes += fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
        }
        Ok(stats)
    }

    /// Writes pending access times to the index. Also happens automatically
    /// in batches, before `gc`/`stats`, and (best effort) on drop.
    pub fn flush(&self) -> Result<(), CacheError> {
        let pending = std::mem::take(&mut *lock_ignoring_poison(&self.touches));
        if pending.len() == 0 {
            return Ok(());
        }
        self.touch_flushes.fetch_add(1, Ordering::Relaxed);
        self.with_conn(|c| {
            let tx = self.begin_write(c)?;
            {
                // Written only when older than the resolution: a run that
                // hits what the last one did a minute ago writes nothing.
                // A record without its access row (the index edited by
                // hand, or its record removed by a GC since the lookup)
                // gets one; GC drops those of records that are gone.
                let mut st = tx.prepare_cached(
                    "INSERT INTO record_access (key, last_access) VALUES (?1, ?2)
                     ON CONFLICT (key) DO UPDATE SET last_access = excluded.last_access
                     WHERE last_access <= excluded.last_access - ?3",
                )?;
                // In key order: neighbours share the table's pages.
                let mut records: Vec<_> = pending.records.iter().collect();
                records.sort_unstable();
                let resolution = to_sql_int(ACCESS_RESOLUTION_SECS);
                for (k, t) in records {
                    st.execute(params![k.to_hex(), to_sql_int(*t), resolution])?;
                }
                // Blobs alike: a blob read again within the resolution
                // leaves its row (and the index's files) as they were.
                let mut st = tx.prepare_cached(
                    "UPDATE blobs SET last_access = ?2
                     WHERE digest = ?1 AND last_access <= ?2 - ?3",
                )?;
                let mut blobs: Vec<_> = pending.blobs.iter().collect();
                blobs.sort_unstable();
                for (d, t) in blobs {
                    st.execute(params![d.to_hex(), to_sql_int(*t), resolution])?;
                }
            }
            tx.commit()?;
            Ok(())
        })
    }

    /// Records an access in memory, flushing once a batch has accumulated.
    pub(crate) fn queue_touch(&self, f: impl FnOnce(&mut Touches)) -> Result<(), CacheError> {
        let full = {
            let mut t = lock_ignoring_poison(&self.touches);
            f(&mut t);
            t.len() >= TOUCH_BATCH
        };
        if full { self.flush() } else { Ok(()) }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // Losing access times only makes GC slightly less precise.
        let _ = self.flush();
        // The index as this process leaves it (its connections closed, the
        // WAL checkpointed when it was the last): the next open trusts it
        // unless something changed it since. Under `init.lock`, so an
        // opener's check and this stamp do not interleave.
        lock_ignoring_poison(&self.idle).clear();
        if let Ok(_lock) = acquire_file_lock(&self.root.join("init.lock")) {
            let _ = fs::write(
                checked_stamp(&self.db_path),
                index_fingerprint(&self.db_path),
            );
        }
    }
}

/// A write transaction holding this process's write gate
/// ([`Store::begin_write`]); the gate is released after the transaction
/// ends (fields drop in order).
pub(crate) struct WriteTx<'s, 'c> {
    tx: rusqlite::Transaction<'c>,
    _gate: MutexGuard<'s, ()>,
}

impl<'c> std::ops::Deref for WriteTx<'_, 'c> {
    type Target = rusqlite::Transaction<'c>;
    fn deref(&self) -> &Self::Target {
        &self.tx
    }
}

impl WriteTx<'_, '_> {
    pub(crate) fn commit(self) -> Result<(), CacheError> {
        self.tx.commit()?;
        Ok(())
    }
}

/// Runs `f` in an immediate transaction committed with `synchronous=FULL`.
fn with_full_sync(
    store: &Store,
    c: &mut Connection,
    f: impl FnOnce(&Connection) -> Result<(), CacheError>,
) -> Result<(), CacheError> {
    c.pragma_update(None, "synchronous", "FULL")?;
    let result = (|| {
        let tx = store.begin_write(c)?;
        f(&tx)?;
        tx.commit()?;
        Ok(())
    })();
    c.pragma_update(None, "synchronous", "NORMAL")?;
    result
}

/// Deletes a record and its blob references (not the blobs).
pub(crate) fn delete_record(c: &Connection, key_hex: &str) -> Result<(), CacheError> {
    c.prepare_cached("DELETE FROM records WHERE key = ?1")?
        .execute([key_hex])?;
    c.prepare_cached("DELETE FROM record_blobs WHERE key = ?1")?
        .execute([key_hex])?;
    c.prepare_cached("DELETE FROM record_access WHERE key = ?1")?
        .execute([key_hex])?;
    Ok(())
}

/// What [`Store::has_record`] reads of a record.
const HAS_RECORD_SQL: &str = "SELECT outputs FROM records WHERE key = ?1";

fn read_has_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<String> {
    r.get::<_, String>(0)
}

/// A lookup of one row as [`Store::record_row`] gives it: `None` when there
/// is none, `Some(Err(()))` when a column does not hold the type it should.
fn row_or_damage<T>(found: rusqlite::Result<T>) -> Result<Option<Result<T, ()>>, CacheError> {
    match found.optional() {
        Ok(row) => Ok(row.map(Ok)),
        Err(e) if is_bad_value(&e) => Ok(Some(Err(()))),
        Err(e) => Err(e.into()),
    }
}

/// Whether a row failed to read because a column holds a value of the
/// wrong type (a damaged row, not a failing index).
fn is_bad_value(e: &rusqlite::Error) -> bool {
    matches!(
        e,
        rusqlite::Error::InvalidColumnType(..)
            | rusqlite::Error::FromSqlConversionFailure(..)
            | rusqlite::Error::IntegralValueOutOfRange(..)
            | rusqlite::Error::Utf8Error(..)
    )
}

/// A records row as stored: JSON columns still text.
struct RecordRow {
    node_id: String,
    kind: String,
    outputs: String,
    duration_ms: i64,
    producer: String,
    key_inputs: String,
    created_unix: i64,
    meta: String,
}

impl RecordRow {
    fn read(r: &rusqlite::Row<'_>) -> rusqlite::Result<RecordRow> {
        Ok(RecordRow {
            node_id: r.get(0)?,
            kind: r.get(1)?,
            outputs: r.get(2)?,
            duration_ms: r.get(3)?,
            producer: r.get(4)?,
            key_inputs: r.get(5)?,
            created_unix: r.get(6)?,
            meta: r.get(7)?,
        })
    }

    fn decode(self, key_hex: &str) -> Result<Record, CacheError> {
        let err = |source| CacheError::RecordJson {
            key: key_hex.to_string(),
            source,
        };
        Ok(Record {
            node_id: self.node_id,
            kind: self.kind,
            outputs: serde_json::from_str(&self.outputs).map_err(err)?,
            duration_ms: from_sql_int(self.duration_ms),
            producer: self.producer,
            key_inputs: serde_json::from_str(&self.key_inputs).map_err(err)?,
            created_unix: from_sql_int(self.created_unix),
            meta: serde_json::from_str(&self.meta).map_err(err)?,
        })
    }
}

fn to_json<T: serde::Serialize>(v: &T, key_hex: &str) -> Result<String, CacheError> {
    serde_json::to_string(v).map_err(|source| CacheError::RecordJson {
        key: key_hex.to_string(),
        source,
    })
}

/// [`Store::default_dir`] over an arbitrary environment lookup.
pub(crate) fn default_dir_from(
    var: impl Fn(&str) -> Option<std::ffi::OsString>,
) -> Option<PathBuf> {
    let set = |name: &str| var(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = set("CHARLY_CACHE_DIR") {
        return Some(dir);
    }
    // The XDG spec says relative values are invalid and must be ignored.
    if let Some(xdg) = set("XDG_CACHE_HOME").filter(|p| p.is_absolute()) {
        return Some(xdg.join("charly"));
    }
    set("HOME").map(|home| home.join(".cache").join("charly"))
}

/// Owned handles on local stores, one per directory, for work that must
/// outlive the `&Store` it was given (background uploads of a remote
/// cache). Several handles on one directory are as safe as several
/// processes.
#[derive(Debug, Default)]
pub struct StoreHandles(Mutex<HashMap<PathBuf, Arc<Store>>>);

impl StoreHandles {
    /// A handle on the store in `local`'s directory, opened once.
    pub fn get(&self, local: &Store) -> Result<Arc<Store>, CacheError> {
        let mut stores = lock_ignoring_poison(&self.0);
        if let Some(s) = stores.get(local.dir()) {
            return Ok(Arc::clone(s));
        }
        let s = Arc::new(Store::open(local.dir())?);
        stores.insert(local.dir().to_path_buf(), Arc::clone(&s));
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    /// A blob directory asked about more than `LIST_AFTER` times is
    /// answered from one listing of it: blob files by name, nothing else,
    /// as they were when it was listed.
    #[test]
    fn a_blob_directory_asked_often_is_listed_once() {
        let tmp = tempfile::tempdir().expect("tmp");
        let store = Store::open(tmp.path()).expect("open");
        let digest = |last: u8| {
            let mut b = [0xab; 32];
            b[31] = last;
            BlobDigest::from_bytes(b)
        };
        let dir = tmp.path().join("blobs/ab");
        std::fs::create_dir_all(&dir).expect("mkdir");
        for last in 0..3 {
            std::fs::write(dir.join(digest(last).to_hex()), b"x").expect("write");
        }
        // Not blobs of this directory: a temp name, another first byte.
        std::fs::write(dir.join("tmp-123"), b"x").expect("write");
        let other = [0xcd; 32];
        std::fs::write(dir.join(BlobDigest::from_bytes(other).to_hex()), b"x").expect("write");
        let seen = SeenBlobs::default();
        for _ in 0..LIST_AFTER {
            assert!(seen.listing(&store, &digest(0)).is_none());
        }
        let listed = seen.listing(&store, &digest(0)).expect("listed now");
        assert_eq!(listed.len(), 3, "{listed:?}");
        assert!((0..3).all(|l| listed.contains(&digest(l))));
        // A snapshot: later changes are not seen, and it is not read again.
        std::fs::write(dir.join(digest(9).to_hex()), b"x").expect("write");
        std::fs::remove_file(dir.join(digest(1).to_hex())).expect("rm");
        let again = seen.listing(&store, &digest(9)).expect("listed");
        assert!(Arc::ptr_eq(&listed, &again));
        assert!(!again.contains(&digest(9)) && again.contains(&digest(1)));
        // A directory with no blobs yet lists as empty.
        let empty = BlobDigest::from_bytes([0x01; 32]);
        for _ in 0..LIST_AFTER {
            assert!(seen.listing(&store, &empty).is_none());
        }
        assert!(seen.listing(&store, &empty).expect("listed").is_empty());
    }

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| OsString::from(v))
        }
    }

    #[test]
    fn default_dir_precedence() {
        let all = [
            ("CHARLY_CACHE_DIR", "/c"),
            ("XDG_CACHE_HOME", "/x"),
            ("HOME", "/h"),
        ];
        assert_eq!(default_dir_from(env(&all)), Some(PathBuf::from("/c")));
        assert_eq!(
            default_dir_from(env(&all[1..])),
            Some(PathBuf::from("/x/charly"))
        );
        assert_eq!(
            default_dir_from(env(&all[2..])),
            Some(PathBuf::from("/h/.cache/charly"))
        );
        let relative_xdg = [("XDG_CACHE_HOME", "rel"), ("HOME", "/h")];
        assert_eq!(
            default_dir_from(env(&relative_xdg)),
            Some(PathBuf::from("/h/.cache/charly"))
        );
        let empty = [("CHARLY_CACHE_DIR", ""), ("HOME", "/h")];
        assert_eq!(
            default_dir_from(env(&empty)),
            Some(PathBuf::from("/h/.cache/charly"))
        );
        assert_eq!(default_dir_from(env(&[])), None);
    }
}
