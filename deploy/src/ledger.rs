//! The deploy ledger: what `bundle add` did, durably, so `bundle del` can
//! undo exactly that and `bundle status` can compare.
//!
//! **Write-ahead undo.** A step is recorded `incomplete` (committed) before
//! it starts. Before each change it makes, the operation that undoes the
//! change is committed ([`Undo`], with a backup of anything it overwrites).
//! Only then is the change made. When the step ends it becomes `complete`
//! (or `failed`) together with the state it left behind ([`Fact`]s, for
//! drift). So a deploy killed at any instant leaves a ledger whose undo
//! operations cover every change that may have happened; they are written
//! to be safe when the change did not happen (removing an absent file,
//! restoring a file to the content it still has). `del` replays them LIFO
//! and deletes each one as it succeeds, so an interrupted `del` resumes.
//!
//! Every write is its own transaction on a WAL database with
//! `synchronous=FULL`: committed means on disk. A per-bundle lock file
//! (`flock` through std) is held while `add` or `del` runs; a bundle in state
//! `applying` whose lock is free was interrupted.
//!
//! Schema (one database for all targets; a bundle is keyed by its name and
//! is unique per target and deploy id):
//!
//! ```text
//! bundles(name PK, deploy_id, box, target, target_key, connection JSON, user,
//!         home, state, plan JSON, options JSON, created_unix, updated_unix,
//!         error, UNIQUE(target_key, deploy_id))
//! steps(bundle, seq, candy, kind, scope, title, state, note, step JSON,
//!       started_unix, finished_unix, PK(bundle, seq))
//! undo(bundle, seq, idx, op JSON, reverse JSON, PK(bundle, seq, idx))
//! facts(bundle, seq, idx, fact JSON, PK(bundle, seq, idx))
//! blobs(bundle, sha256, data, PK(bundle, sha256))   -- backups
//! ```
//!
//! **Reverse ops.** The plan's steps carry the typed reverse operations the
//! compiler derived ([`ReverseOp`]); an undo operation records which of its
//! step's reverse ops it carries out (`undo.reverse`: a JSON array, empty
//! for what a step does on the way, such as a parent directory it created).
//! The undo operation is the exact, observed form of those ops: what was
//! there before, which packages were new, the unit's prior state.
//! The column was added later: ledgers without it gain it when opened,
//! and earlier versions read the rest unchanged.
//!
//! A record's target and connection are typed ([`Target`], [`Connection`])
//! in memory and stored as the text they always were: the target's name
//! (`local`, `vm`, `pod`, `k8s`) and the connection's JSON object
//! (`{"kind":"local","root":…}` or `{"kind":"ssh","user":…,"host":…,
//! "port":…,"identity":…,"known_hosts":…}`), so ledgers written by earlier
//! versions read unchanged and earlier versions can read new ones.

use crate::ssh::SshTarget;
use charly_rules::plan::{ReverseOp, Target};
use rusqlite::{OptionalExtension, params};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Ledger failures.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// SQLite failed.
    #[error("ledger {path}: {source}")]
    Sql {
        /// Database file.
        path: String,
        /// Why.
        source: rusqlite::Error,
    },
    /// A file operation failed.
    #[error("ledger {path}: {message}")]
    Io {
        /// Path.
        path: String,
        /// Why.
        message: String,
    },
    /// A bundle with this name exists.
    #[error(
        "bundle `{0}` already exists (see `charly bundle status {0}`; `charly bundle del {0}` removes it)"
    )]
    Exists(String),
    /// The same plan is already deployed to this target under another name.
    #[error(
        "deploy {deploy_id} of box {box_name} is already applied to {target} as bundle `{other}`"
    )]
    Duplicate {
        /// Deploy id.
        deploy_id: String,
        /// Box.
        box_name: String,
        /// Target.
        target: String,
        /// The existing bundle.
        other: String,
    },
    /// No such bundle.
    #[error("no bundle named `{0}` (see `charly bundle list`)")]
    NotFound(String),
    /// Another charly holds the bundle.
    #[error("bundle `{0}` is being changed by another charly process")]
    Busy(String),
    /// Stored JSON does not parse.
    #[error("ledger record of bundle `{bundle}` is unreadable: {message}")]
    Corrupt {
        /// Bundle.
        bundle: String,
        /// Why.
        message: String,
    },
    /// A record cannot be written in the ledger's format.
    #[error("bundle `{bundle}` cannot be recorded: {message}")]
    Unrecordable {
        /// Bundle.
        bundle: String,
        /// Why.
        message: String,
    },
}

/// How to reach a bundle's host again (`bundle del` and `bundle status`
/// need only the bundle's name).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Connection {
    /// This machine, rooted at `root` when given (the host's root as it
    /// reported it: an absolute, canonical directory).
    Local {
        /// The root directory.
        root: Option<String>,
    },
    /// A machine over SSH.
    Ssh(SshTarget),
    /// A kind of connection this version cannot reach, kept as stored
    /// (its JSON object).
    Other(serde_json::Value),
}

impl Connection {
    /// The machine (and the root on it) a bundle changes: bundles with the
    /// same key share its files, packages and services, whatever their
    /// target kind (a pod's unit file and a host deploy's files land in
    /// the same tree).
    pub fn host_key(&self) -> String {
        match self {
            Connection::Local { root: Some(r) } => format!("local:{r}"),
            Connection::Local { root: None } => "local:/".into(),
            Connection::Ssh(t) => format!("ssh:{}:{}", t.host, t.port),
            Connection::Other(v) => format!("other:{v}"),
        }
    }

    /// The `kind` it is stored under (`local`, `ssh`, or what another
    /// kind's record says, if anything).
    pub fn kind(&self) -> Option<&str> {
        match self {
            Connection::Local { .. } => Some("local"),
            Connection::Ssh(_) => Some("ssh"),
            Connection::Other(v) => v.get("kind").and_then(|k| k.as_str()),
        }
    }

    /// The JSON object the ledger stores (its `connection` column). Fails
    /// only for an SSH key or known_hosts path that is not UTF-8.
    pub fn to_json(&self) -> Result<serde_json::Value, String> {
        Ok(match self {
            Connection::Local { root } => serde_json::json!({"kind": "local", "root": root}),
            Connection::Ssh(t) => {
                let text = |what: &str, p: &Path| {
                    p.to_str()
                        .map(String::from)
                        .ok_or_else(|| format!("the {what} path {} is not UTF-8", p.display()))
                };
                serde_json::json!({"kind": "ssh", "user": t.user, "host": t.host,
                    "port": t.port, "identity": text("identity", &t.identity)?,
                    "known_hosts": text("known_hosts", &t.known_hosts)?})
            }
            Connection::Other(v) => v.clone(),
        })
    }

    /// Reads the stored JSON object. As lenient as readers always were: a
    /// missing SSH field is empty (the port 22), a `root` that is not a
    /// string is no root, and an unknown kind is kept as [`Connection::Other`].
    pub fn from_json(v: &serde_json::Value) -> Connection {
        let text = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or_default();
        match v.get("kind").and_then(|k| k.as_str()) {
            Some("local") => Connection::Local {
                root: v.get("root").and_then(|r| r.as_str()).map(String::from),
            },
            Some("ssh") => Connection::Ssh(SshTarget {
                user: text("user").into(),
                host: text("host").into(),
                port: v.get("port").and_then(|p| p.as_u64()).unwrap_or(22) as u16,
                identity: text("identity").into(),
                known_hosts: text("known_hosts").into(),
            }),
            _ => Connection::Other(v.clone()),
        }
    }
}

impl Serialize for Connection {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_json()
            .map_err(serde::ser::Error::custom)?
            .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Connection {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Connection::from_json(&serde_json::Value::deserialize(d)?))
    }
}

/// An operation that undoes one change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Undo {
    /// Remove a file or symlink we created.
    RemovePath {
        /// Target path.
        path: String,
        /// Needs root.
        privileged: bool,
    },
    /// Remove a directory we created (only when empty).
    RemoveDir {
        /// Target path.
        path: String,
        /// Needs root.
        privileged: bool,
    },
    /// Put back a file we overwrote (content in the ledger's blobs).
    RestoreFile {
        /// Target path.
        path: String,
        /// sha256 of the backup.
        sha256: String,
        /// Its mode.
        mode: u32,
        /// Its owner.
        uid: u32,
        /// Its group.
        gid: u32,
        /// Needs root.
        privileged: bool,
    },
    /// Put back a symlink we replaced.
    RestoreSymlink {
        /// Target path.
        path: String,
        /// What it pointed to.
        target: String,
        /// Needs root.
        privileged: bool,
    },
    /// Remove what an artifact created: files and links, then directories
    /// (only when empty), in reverse of the given order.
    RemoveTree {
        /// Paths in creation order (parents first).
        paths: Vec<String>,
        /// Needs root.
        privileged: bool,
    },
    /// Remove a managed block from a file.
    RemoveBlock {
        /// The file.
        file: String,
        /// Block marker.
        marker: String,
        /// We added a newline before the block (the file did not end in one).
        added_newline: bool,
        /// We created the file: remove it when nothing else is left in it.
        created_file: bool,
        /// Needs root.
        privileged: bool,
    },
    /// Put back the body a managed block had before we replaced it (every
    /// other byte of the file stays as it is).
    RestoreBlock {
        /// The file.
        file: String,
        /// Block marker.
        marker: String,
        /// The body it had.
        body: String,
        /// Needs root.
        privileged: bool,
    },
    /// Remove packages we installed (those still installed).
    RemovePackages {
        /// Package format (deb, rpm, pac).
        format: String,
        /// Packages.
        packages: Vec<String>,
        /// The command that removes all of them (rendered at apply time).
        command: String,
        /// The host's package root when rooted (`dpkg --root`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        root: Option<String>,
    },
    /// Run a command.
    Run {
        /// What it does, for people.
        what: String,
        /// Shell script.
        script: String,
        /// Needs root.
        privileged: bool,
        /// Run as this user.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        as_user: Option<String>,
        /// Extra environment.
        #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
        env: std::collections::BTreeMap<String, String>,
        /// A failure is a warning (the change may never have happened).
        ignore_failure: bool,
    },
    /// Nothing can undo this; said at `del`.
    Note {
        /// The note.
        text: String,
    },
}

/// An undo operation as the ledger stores it.
fn undo_json(bundle: &str, op: &Undo) -> Result<String, LedgerError> {
    serde_json::to_string(op).map_err(|e| LedgerError::Corrupt {
        bundle: bundle.into(),
        message: e.to_string(),
    })
}

/// The position after the last undo operation of step `seq` (undo runs
/// last first).
fn next_undo_idx(tx: &rusqlite::Transaction<'_>, bundle: &str, seq: u32) -> rusqlite::Result<i64> {
    tx.query_row(
        "SELECT COALESCE(MAX(idx)+1, 0) FROM undo WHERE bundle=?1 AND seq=?2",
        params![bundle, seq],
        |r| r.get(0),
    )
}

impl Undo {
    /// A root command that puts something back; its failure does not stop
    /// the removal (what it undoes may be gone already).
    pub fn root_run(what: impl Into<String>, script: impl Into<String>) -> Self {
        Undo::Run {
            what: what.into(),
            script: script.into(),
            privileged: true,
            as_user: None,
            env: std::collections::BTreeMap::new(),
            ignore_failure: true,
        }
    }

    /// One line for people.
    pub fn describe(&self) -> String {
        match self {
            Undo::RemovePath { path, .. } => format!("remove {path}"),
            Undo::RemoveDir { path, .. } => format!("remove directory {path} (if empty)"),
            Undo::RestoreFile { path, .. } => format!("restore {path} from backup"),
            Undo::RestoreSymlink { path, target, .. } => {
                format!("restore symlink {path} -> {target}")
            }
            Undo::RemoveTree { paths, .. } => format!(
                "remove {} artifact entries{}",
                paths.len(),
                paths
                    .first()
                    .map(|p| format!(" under {p}"))
                    .unwrap_or_default()
            ),
            Undo::RemoveBlock { file, marker, .. } => {
                format!("remove managed block {marker} from {file}")
            }
            Undo::RestoreBlock { file, marker, .. } => {
                format!("put back managed block {marker} in {file}")
            }
            Undo::RemovePackages {
                format, packages, ..
            } => format!("remove {format} packages {}", packages.join(" ")),
            Undo::Run { what, .. } => format!("run: {what}"),
            Undo::Note { text } => format!("note: {text}"),
        }
    }
}

/// What a completed step left on the target (for drift).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum Fact {
    /// A file with this content and mode.
    File {
        /// Path.
        path: String,
        /// sha256.
        sha256: String,
        /// Mode.
        mode: u32,
    },
    /// A symlink.
    Symlink {
        /// Path.
        path: String,
        /// Target.
        target: String,
    },
    /// A directory.
    Dir {
        /// Path.
        path: String,
    },
    /// A managed block with this content.
    Block {
        /// File.
        file: String,
        /// Marker.
        marker: String,
        /// sha256 of the block text.
        sha256: String,
    },
    /// Installed packages.
    Packages {
        /// Format.
        format: String,
        /// Names.
        packages: Vec<String>,
        /// Package root when rooted.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        root: Option<String>,
    },
}

impl Fact {
    /// The path or name it is about.
    pub fn subject(&self) -> String {
        match self {
            Fact::File { path, .. } | Fact::Symlink { path, .. } | Fact::Dir { path } => {
                path.clone()
            }
            Fact::Block { file, marker, .. } => format!("{file} [{marker}]"),
            Fact::Packages {
                format, packages, ..
            } => format!("{format}: {}", packages.join(" ")),
        }
    }
}

/// State of a bundle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BundleState {
    /// `add` is running (or was killed: see [`Ledger::is_locked`]).
    Applying,
    /// Every step ran or was skipped.
    Applied,
    /// A step failed; the rest were not attempted.
    Failed,
    /// `del` is running (or was interrupted).
    Removing,
}

impl BundleState {
    fn as_str(self) -> &'static str {
        match self {
            BundleState::Applying => "applying",
            BundleState::Applied => "applied",
            BundleState::Failed => "failed",
            BundleState::Removing => "removing",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "applying" => BundleState::Applying,
            "applied" => BundleState::Applied,
            "failed" => BundleState::Failed,
            "removing" => BundleState::Removing,
            _ => return None,
        })
    }
}

/// State of a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StepState {
    /// Started, not finished (the process may have died in it).
    Incomplete,
    /// Finished.
    Complete,
    /// Failed.
    Failed,
    /// Not applied (a gate, the target), with the reason.
    Skipped,
}

impl StepState {
    fn as_str(self) -> &'static str {
        match self {
            StepState::Incomplete => "incomplete",
            StepState::Complete => "complete",
            StepState::Failed => "failed",
            StepState::Skipped => "skipped",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "incomplete" => StepState::Incomplete,
            "complete" => StepState::Complete,
            "failed" => StepState::Failed,
            "skipped" => StepState::Skipped,
            _ => return None,
        })
    }
}

/// A bundle's record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BundleRecord {
    /// Bundle name.
    pub name: String,
    /// Deploy id of the plan.
    pub deploy_id: String,
    /// Box.
    #[serde(rename = "box")]
    pub box_name: String,
    /// Where it was deployed (`local`, `vm`, `pod` or `k8s`).
    pub target: Target,
    /// Identity of the target (host and root; see
    /// `bundle::target_key`): a target takes a deploy id once.
    pub target_key: String,
    /// How to reach the host again.
    pub connection: Connection,
    /// Target user.
    pub user: String,
    /// Target home.
    pub home: String,
    /// State.
    pub state: BundleState,
    /// The (home-resolved) plan that was applied.
    pub plan: serde_json::Value,
    /// Gates and options.
    pub options: serde_json::Value,
    /// Created.
    pub created_unix: u64,
    /// Last change.
    pub updated_unix: u64,
    /// The failure, when failed.
    pub error: Option<String>,
}

/// A step's record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// Position in the plan.
    pub seq: u32,
    /// Candy.
    pub candy: String,
    /// Kind.
    pub kind: String,
    /// Scope.
    pub scope: String,
    /// One line for people.
    pub title: String,
    /// State.
    pub state: StepState,
    /// Skip reason or error.
    pub note: Option<String>,
    /// The step as applied (JSON), for config drift.
    pub step: serde_json::Value,
    /// Undo operations in the order they were recorded.
    pub undo: Vec<(u32, Undo)>,
    /// The reverse ops of the step each undo operation (by index) carries
    /// out; absent for what the step did on the way.
    pub realizes: BTreeMap<u32, Vec<ReverseOp>>,
    /// When each undo operation (by index) was recorded, in one order
    /// across every bundle of the ledger (an operation handed over from
    /// another bundle keeps its own): who changed a shared thing first.
    #[serde(skip)]
    pub at: BTreeMap<u32, i64>,
    /// State left behind.
    pub facts: Vec<Fact>,
}

/// The ledger.
pub struct Ledger {
    conn: rusqlite::Connection,
    path: PathBuf,
}

/// Holds a bundle while `add` or `del` runs.
pub struct BundleLock {
    _file: std::fs::File,
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// How long a write waits for another process's transaction.
const BUSY_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// The schema this version writes (`PRAGMA user_version`): 1, the first
/// tables; 2, `undo.reverse`; 3, `undo.at` and `pending_dirs`.
const SCHEMA: i64 = 3;

/// Puts the database in WAL mode. Only the first open of a new file
/// changes anything; it needs the file alone for a moment, so a busy
/// answer (another process opening it too) is waited out.
fn set_wal(conn: &rusqlite::Connection) -> rusqlite::Result<()> {
    let give_up = std::time::Instant::now() + BUSY_WAIT;
    loop {
        match conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get::<_, String>(0)) {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::DatabaseBusy
                    && std::time::Instant::now() < give_up =>
            {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            r => return r.map(|_| ()),
        }
    }
}

/// Creates the tables, or upgrades those of an earlier version, in one
/// immediate transaction (the first writer wins; the others wait for it
/// and then find nothing to do).
fn upgrade(conn: &mut rusqlite::Connection) -> rusqlite::Result<()> {
    let have: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if have >= SCHEMA {
        return Ok(());
    }
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS bundles(
           name TEXT PRIMARY KEY, deploy_id TEXT NOT NULL, box TEXT NOT NULL,
           target TEXT NOT NULL, target_key TEXT NOT NULL, connection TEXT NOT NULL,
           user TEXT NOT NULL, home TEXT NOT NULL, state TEXT NOT NULL,
           plan TEXT NOT NULL, options TEXT NOT NULL,
           created_unix INTEGER NOT NULL, updated_unix INTEGER NOT NULL, error TEXT,
           UNIQUE(target_key, deploy_id));
         CREATE TABLE IF NOT EXISTS steps(
           bundle TEXT NOT NULL REFERENCES bundles(name) ON DELETE CASCADE,
           seq INTEGER NOT NULL, candy TEXT NOT NULL, kind TEXT NOT NULL,
           scope TEXT NOT NULL, title TEXT NOT NULL, state TEXT NOT NULL, note TEXT,
           step TEXT NOT NULL, started_unix INTEGER, finished_unix INTEGER,
           PRIMARY KEY(bundle, seq));
         CREATE TABLE IF NOT EXISTS undo(
           bundle TEXT NOT NULL REFERENCES bundles(name) ON DELETE CASCADE,
           seq INTEGER NOT NULL, idx INTEGER NOT NULL, op TEXT NOT NULL,
           PRIMARY KEY(bundle, seq, idx));
         CREATE TABLE IF NOT EXISTS facts(
           bundle TEXT NOT NULL REFERENCES bundles(name) ON DELETE CASCADE,
           seq INTEGER NOT NULL, idx INTEGER NOT NULL, fact TEXT NOT NULL,
           PRIMARY KEY(bundle, seq, idx));
         CREATE TABLE IF NOT EXISTS blobs(
           bundle TEXT NOT NULL REFERENCES bundles(name) ON DELETE CASCADE,
           sha256 TEXT NOT NULL, data BLOB NOT NULL,
           PRIMARY KEY(bundle, sha256));
         CREATE TABLE IF NOT EXISTS pending_dirs(
           host TEXT NOT NULL, path TEXT NOT NULL, privileged INTEGER NOT NULL,
           PRIMARY KEY(host, path));",
    )?;
    let has = |col: &str| -> rusqlite::Result<bool> {
        tx.query_row(
            "SELECT COUNT(*) FROM pragma_table_info('undo') WHERE name=?1",
            params![col],
            |r| r.get::<_, i64>(0),
        )
        .map(|n| n > 0)
    };
    // Which reverse ops an undo carries out (schema 2).
    if !has("reverse")? {
        tx.execute_batch("ALTER TABLE undo ADD COLUMN reverse TEXT")?;
    }
    // When each undo was recorded, across bundles (schema 3): rows of
    // earlier versions are ordered as they were inserted.
    if !has("at")? {
        tx.execute_batch("ALTER TABLE undo ADD COLUMN at INTEGER; UPDATE undo SET at=rowid;")?;
    }
    tx.execute_batch(&format!("PRAGMA user_version={SCHEMA}"))?;
    tx.commit()
}

/// A lock file's name: a digest of what it locks, never the name itself
/// (a bundle name or a target is not a path).
fn lock_file(kind: &str, what: &str) -> String {
    let h = blake3::hash(what.as_bytes()).to_hex();
    format!("{kind}-{}.lock", &h[..32])
}

/// Holds a deploy target (see [`Ledger::lock_host`]).
pub struct HostLock {
    _file: std::fs::File,
}

impl Ledger {
    /// `$CHARLY_STATE_DIR`, else `$XDG_STATE_HOME/charly`, else `~/.local/state/charly`.
    pub fn default_dir() -> Option<PathBuf> {
        if let Some(d) = std::env::var_os("CHARLY_STATE_DIR").filter(|d| !d.is_empty()) {
            return Some(PathBuf::from(d));
        }
        if let Some(d) = std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
            return Some(PathBuf::from(d).join("charly"));
        }
        std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state/charly"))
    }

    /// Opens (creating) `<dir>/ledger.sqlite`, bringing its schema up to
    /// date. Any number of processes may open one ledger at once: the
    /// schema is created and upgraded in one immediate transaction, read
    /// and written against `PRAGMA user_version`, so two first opens (or
    /// two upgrades) never race.
    pub fn open(dir: &Path) -> Result<Ledger, LedgerError> {
        std::fs::create_dir_all(dir.join("locks")).map_err(|e| LedgerError::Io {
            path: dir.display().to_string(),
            message: e.to_string(),
        })?;
        let path = dir.join("ledger.sqlite");
        let sql = |e| LedgerError::Sql {
            path: path.display().to_string(),
            source: e,
        };
        let mut conn = rusqlite::Connection::open(&path).map_err(sql)?;
        // Another deploy may hold the database for a step's commit: wait,
        // as long as a slow disk could need.
        conn.busy_timeout(BUSY_WAIT).map_err(sql)?;
        set_wal(&conn).map_err(sql)?;
        conn.execute_batch("PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;")
            .map_err(sql)?;
        upgrade(&mut conn).map_err(sql)?;
        Ok(Ledger { conn, path })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn sql(&self) -> impl Fn(rusqlite::Error) -> LedgerError + '_ {
        move |e| LedgerError::Sql {
            path: self.path.display().to_string(),
            source: e,
        }
    }

    fn lock_path(&self, name: &str) -> PathBuf {
        self.path
            .parent()
            .unwrap_or(Path::new("."))
            .join("locks")
            .join(lock_file("bundle", name))
    }

    /// Takes the bundle's lock (fails when another process holds it).
    pub fn lock(&self, name: &str) -> Result<BundleLock, LedgerError> {
        // A lock just released can still be held for a moment by a child
        // process forked in between (flock locks belong to the open file,
        // which a fork shares until its exec closes it): wait that out.
        let give_up = std::time::Instant::now() + std::time::Duration::from_secs(2);
        loop {
            match self.try_lock(name) {
                Err(LedgerError::Busy(_)) if std::time::Instant::now() < give_up => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                r => return r,
            }
        }
    }

    fn try_lock(&self, name: &str) -> Result<BundleLock, LedgerError> {
        let p = self.lock_path(name);
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&p)
            .map_err(|e| LedgerError::Io {
                path: p.display().to_string(),
                message: e.to_string(),
            })?;
        match f.try_lock() {
            Ok(()) => Ok(BundleLock { _file: f }),
            Err(std::fs::TryLockError::WouldBlock) => Err(LedgerError::Busy(name.into())),
            Err(std::fs::TryLockError::Error(e)) => Err(LedgerError::Io {
                path: p.display().to_string(),
                message: e.to_string(),
            }),
        }
    }

    /// Whether another process holds the bundle now.
    pub fn is_locked(&self, name: &str) -> bool {
        matches!(self.try_lock(name), Err(LedgerError::Busy(_)))
    }

    /// Takes the lock of a deploy target ([`Connection::host_key`]),
    /// waiting as long as another charly holds it; `waiting` is called
    /// once when the wait begins. `add`, `apply` and `del` hold it from
    /// their first look at the target to their last change, so deploys
    /// that share files take turns, and each one decides what is shared
    /// from the others' finished records.
    pub fn lock_host(
        &self,
        host: &str,
        waiting: &mut dyn FnMut(),
    ) -> Result<HostLock, LedgerError> {
        let p = self
            .path
            .parent()
            .unwrap_or(Path::new("."))
            .join("locks")
            .join(lock_file("host", host));
        let io = |e: std::io::Error| LedgerError::Io {
            path: p.display().to_string(),
            message: e.to_string(),
        };
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&p)
            .map_err(io)?;
        match f.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                waiting();
                f.lock().map_err(io)?;
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
        }
        Ok(HostLock { _file: f })
    }

    /// Records a new bundle (state `applying`).
    pub fn create(&self, r: &BundleRecord) -> Result<(), LedgerError> {
        let connection = r
            .connection
            .to_json()
            .map_err(|message| LedgerError::Unrecordable {
                bundle: r.name.clone(),
                message,
            })?;
        // Checked and inserted in one transaction: two processes creating
        // the same name get one bundle and one clear refusal.
        let tx = rusqlite::Transaction::new_unchecked(
            &self.conn,
            rusqlite::TransactionBehavior::Immediate,
        )
        .map_err(self.sql())?;
        if self.get(&r.name)?.is_some() {
            return Err(LedgerError::Exists(r.name.clone()));
        }
        let other: Option<String> = self
            .conn
            .query_row(
                "SELECT name FROM bundles WHERE target_key=?1 AND deploy_id=?2",
                params![r.target_key, r.deploy_id],
                |row| row.get(0),
            )
            .optional()
            .map_err(self.sql())?;
        if let Some(other) = other {
            return Err(LedgerError::Duplicate {
                deploy_id: r.deploy_id.clone(),
                box_name: r.box_name.clone(),
                target: r.target_key.clone(),
                other,
            });
        }
        self.conn
            .execute(
                "INSERT INTO bundles(name, deploy_id, box, target, target_key, connection, user, home,
                   state, plan, options, created_unix, updated_unix, error)
                 VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?12,NULL)",
                params![
                    r.name,
                    r.deploy_id,
                    r.box_name,
                    r.target.as_str(),
                    r.target_key,
                    connection.to_string(),
                    r.user,
                    r.home,
                    r.state.as_str(),
                    r.plan.to_string(),
                    r.options.to_string(),
                    now() as i64
                ],
            )
            .map_err(self.sql())?;
        tx.commit().map_err(self.sql())?;
        Ok(())
    }

    /// Sets a bundle's state (and error).
    pub fn set_state(
        &self,
        name: &str,
        state: BundleState,
        error: Option<&str>,
    ) -> Result<(), LedgerError> {
        self.conn
            .execute(
                "UPDATE bundles SET state=?2, error=?3, updated_unix=?4 WHERE name=?1",
                params![name, state.as_str(), error, now() as i64],
            )
            .map_err(self.sql())?;
        Ok(())
    }

    /// Records a step as started (`incomplete`) or `skipped`.
    #[allow(clippy::too_many_arguments)]
    pub fn begin_step(
        &self,
        name: &str,
        seq: u32,
        head: &StepHead,
        state: StepState,
        note: Option<&str>,
    ) -> Result<(), LedgerError> {
        self.conn
            .execute(
                "INSERT OR REPLACE INTO steps(bundle, seq, candy, kind, scope, title, state, note, step, started_unix)
                 VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10)",
                params![
                    name,
                    seq,
                    head.candy,
                    head.kind,
                    head.scope,
                    head.title,
                    state.as_str(),
                    note,
                    head.step.to_string(),
                    now() as i64
                ],
            )
            .map_err(self.sql())?;
        Ok(())
    }

    /// Commits an undo operation (and the backups it needs) before the
    /// change it undoes, with the step's reverse ops it carries out (none:
    /// something the step did on the way).
    pub fn add_undo(
        &mut self,
        name: &str,
        seq: u32,
        op: &Undo,
        realizes: &[ReverseOp],
        blobs: &[(String, Vec<u8>)],
    ) -> Result<(), LedgerError> {
        let json = undo_json(name, op)?;
        let reverse = (!realizes.is_empty())
            .then(|| serde_json::to_string(realizes))
            .transpose()
            .map_err(|e| LedgerError::Corrupt {
                bundle: name.into(),
                message: e.to_string(),
            })?;
        let path = self.path.display().to_string();
        let sql = |e| LedgerError::Sql {
            path: path.clone(),
            source: e,
        };
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(sql)?;
        for (sha, data) in blobs {
            tx.execute(
                "INSERT OR IGNORE INTO blobs(bundle, sha256, data) VALUES(?1,?2,?3)",
                params![name, sha, data],
            )
            .map_err(sql)?;
        }
        let idx = next_undo_idx(&tx, name, seq).map_err(sql)?;
        // After every undo recorded so far, by any bundle: which bundle
        // changed a shared file first is read off this order at `del`.
        tx.execute(
            "INSERT INTO undo(bundle, seq, idx, op, reverse, at)
             VALUES(?1,?2,?3,?4,?5,(SELECT COALESCE(MAX(at),0)+1 FROM undo))",
            params![name, seq, idx, json, reverse],
        )
        .map_err(sql)?;
        tx.commit().map_err(sql)?;
        Ok(())
    }

    /// Ends a step: its state, note and the facts it left.
    pub fn finish_step(
        &mut self,
        name: &str,
        seq: u32,
        state: StepState,
        note: Option<&str>,
        facts: &[Fact],
    ) -> Result<(), LedgerError> {
        let path = self.path.display().to_string();
        let sql = |e| LedgerError::Sql {
            path: path.clone(),
            source: e,
        };
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(sql)?;
        tx.execute(
            "DELETE FROM facts WHERE bundle=?1 AND seq=?2",
            params![name, seq],
        )
        .map_err(sql)?;
        for (i, f) in facts.iter().enumerate() {
            let json = serde_json::to_string(f).map_err(|e| LedgerError::Corrupt {
                bundle: name.into(),
                message: e.to_string(),
            })?;
            tx.execute(
                "INSERT INTO facts(bundle, seq, idx, fact) VALUES(?1,?2,?3,?4)",
                params![name, seq, i as i64, json],
            )
            .map_err(sql)?;
        }
        tx.execute(
            "UPDATE steps SET state=?3, note=?4, finished_unix=?5 WHERE bundle=?1 AND seq=?2",
            params![name, seq, state.as_str(), note, now() as i64],
        )
        .map_err(sql)?;
        tx.commit().map_err(sql)?;
        Ok(())
    }

    /// A bundle by name.
    pub fn get(&self, name: &str) -> Result<Option<BundleRecord>, LedgerError> {
        let row = self
            .conn
            .query_row(
                "SELECT name, deploy_id, box, target, target_key, connection, user, home, state,
                        plan, options, created_unix, updated_unix, error
                 FROM bundles WHERE name=?1",
                params![name],
                row_to_raw,
            )
            .optional()
            .map_err(self.sql())?;
        row.map(|r| r.into_record()).transpose()
    }

    /// Every bundle, by name.
    pub fn list(&self) -> Result<Vec<BundleRecord>, LedgerError> {
        let mut st = self
            .conn
            .prepare(
                "SELECT name, deploy_id, box, target, target_key, connection, user, home, state,
                        plan, options, created_unix, updated_unix, error
                 FROM bundles ORDER BY name",
            )
            .map_err(self.sql())?;
        let rows = st
            .query_map([], row_to_raw)
            .map_err(self.sql())?
            .collect::<Result<Vec<_>, _>>()
            .map_err(self.sql())?;
        rows.into_iter().map(|r| r.into_record()).collect()
    }

    /// A bundle's steps with their undo operations and facts, by seq.
    pub fn steps(&self, name: &str) -> Result<Vec<StepRecord>, LedgerError> {
        let corrupt = |m: String| LedgerError::Corrupt {
            bundle: name.into(),
            message: m,
        };
        let mut st = self
            .conn
            .prepare(
                "SELECT seq, candy, kind, scope, title, state, note, step FROM steps
                 WHERE bundle=?1 ORDER BY seq",
            )
            .map_err(self.sql())?;
        type Row = (
            u32,
            String,
            String,
            String,
            String,
            String,
            Option<String>,
            String,
        );
        let rows: Vec<Row> = st
            .query_map(params![name], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                    r.get(6)?,
                    r.get(7)?,
                ))
            })
            .map_err(self.sql())?
            .collect::<Result<_, _>>()
            .map_err(self.sql())?;
        let mut out = Vec::with_capacity(rows.len());
        for (seq, candy, kind, scope, title, state, note, step) in rows {
            let mut u = self
                .conn
                .prepare(
                    "SELECT idx, op, reverse, at FROM undo WHERE bundle=?1 AND seq=?2 ORDER BY idx",
                )
                .map_err(self.sql())?;
            let rows: Vec<(u32, String, Option<String>, Option<i64>)> = u
                .query_map(params![name, seq], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
                })
                .map_err(self.sql())?
                .collect::<Result<_, _>>()
                .map_err(self.sql())?;
            let mut undo = Vec::with_capacity(rows.len());
            let mut realizes = BTreeMap::new();
            let mut at = BTreeMap::new();
            for (i, j, rev, when) in rows {
                let op = serde_json::from_str(&j)
                    .map_err(|e| corrupt(format!("undo {seq}.{i}: {e}")))?;
                undo.push((i, op));
                at.insert(i, when.unwrap_or(0));
                if let Some(rev) = rev {
                    let ops: Vec<ReverseOp> = serde_json::from_str(&rev)
                        .map_err(|e| corrupt(format!("reverse ops of undo {seq}.{i}: {e}")))?;
                    realizes.insert(i, ops);
                }
            }
            let mut f = self
                .conn
                .prepare("SELECT fact FROM facts WHERE bundle=?1 AND seq=?2 ORDER BY idx")
                .map_err(self.sql())?;
            let facts: Vec<String> = f
                .query_map(params![name, seq], |r| r.get(0))
                .map_err(self.sql())?
                .collect::<Result<_, _>>()
                .map_err(self.sql())?;
            let facts = facts
                .iter()
                .map(|j| serde_json::from_str(j).map_err(|e| corrupt(format!("fact: {e}"))))
                .collect::<Result<Vec<_>, _>>()?;
            out.push(StepRecord {
                seq,
                candy,
                kind,
                scope,
                title,
                state: StepState::parse(&state)
                    .ok_or_else(|| corrupt(format!("step {seq} state `{state}`")))?,
                note,
                step: serde_json::from_str(&step).unwrap_or(serde_json::Value::Null),
                undo,
                realizes,
                at,
                facts,
            });
        }
        Ok(out)
    }

    /// A backup by digest.
    pub fn blob(&self, name: &str, sha256: &str) -> Result<Option<Vec<u8>>, LedgerError> {
        self.conn
            .query_row(
                "SELECT data FROM blobs WHERE bundle=?1 AND sha256=?2",
                params![name, sha256],
                |r| r.get(0),
            )
            .optional()
            .map_err(self.sql())
    }

    /// Hands an undo operation of one bundle over to another on the same
    /// target that still needs what it would undo (a package both
    /// installed, a file the other changed after it): `op` is added to the
    /// other's step `seq` (with the backups it needs, copied) with its own
    /// time `at`, replacing the other's operations `replace` there (which
    /// would have put back what the first bundle left); all in one
    /// transaction.
    pub fn hand_over(
        &mut self,
        from: &str,
        to: &str,
        seq: u32,
        replace: &[u32],
        op: &Undo,
        at: i64,
    ) -> Result<(), LedgerError> {
        let json = undo_json(from, op)?;
        let path = self.path.display().to_string();
        let sql = |e| LedgerError::Sql {
            path: path.clone(),
            source: e,
        };
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(sql)?;
        if let Undo::RestoreFile { sha256, .. } = op {
            tx.execute(
                "INSERT OR IGNORE INTO blobs(bundle, sha256, data)
                 SELECT ?1, sha256, data FROM blobs WHERE bundle=?2 AND sha256=?3",
                params![to, from, sha256],
            )
            .map_err(sql)?;
        }
        for idx in replace {
            tx.execute(
                "DELETE FROM undo WHERE bundle=?1 AND seq=?2 AND idx=?3",
                params![to, seq, idx],
            )
            .map_err(sql)?;
        }
        // In the place of the first one replaced (undo runs last first),
        // else after the step's others.
        let idx: i64 = match replace.first() {
            Some(i) => i64::from(*i),
            None => next_undo_idx(&tx, to, seq).map_err(sql)?,
        };
        tx.execute(
            "INSERT INTO undo(bundle, seq, idx, op, at) VALUES(?1,?2,?3,?4,?5)",
            params![to, seq, idx, json, at],
        )
        .map_err(sql)?;
        tx.commit().map_err(sql)?;
        Ok(())
    }

    /// Remembers a directory a removed bundle created but could not remove
    /// (another bundle on `host` still had files in it): the `del` that
    /// leaves it unneeded removes it.
    pub fn add_pending_dir(
        &self,
        host: &str,
        path: &str,
        privileged: bool,
    ) -> Result<(), LedgerError> {
        self.conn
            .execute(
                "INSERT OR REPLACE INTO pending_dirs(host, path, privileged) VALUES(?1,?2,?3)",
                params![host, path, privileged],
            )
            .map_err(self.sql())?;
        Ok(())
    }

    /// The directories waiting to be removed on `host`, deepest first.
    pub fn pending_dirs(&self, host: &str) -> Result<Vec<(String, bool)>, LedgerError> {
        let mut st = self
            .conn
            .prepare("SELECT path, privileged FROM pending_dirs WHERE host=?1")
            .map_err(self.sql())?;
        let mut dirs: Vec<(String, bool)> = st
            .query_map(params![host], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(self.sql())?
            .collect::<Result<_, _>>()
            .map_err(self.sql())?;
        dirs.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
        Ok(dirs)
    }

    /// Forgets a pending directory (removed, gone, or kept for good).
    pub fn drop_pending_dir(&self, host: &str, path: &str) -> Result<(), LedgerError> {
        self.conn
            .execute(
                "DELETE FROM pending_dirs WHERE host=?1 AND path=?2",
                params![host, path],
            )
            .map_err(self.sql())?;
        Ok(())
    }

    /// Forgets steps `from` and later (their undo was carried out): a
    /// re-apply records them again.
    pub fn clear_steps_from(&mut self, name: &str, from: u32) -> Result<(), LedgerError> {
        let path = self.path.display().to_string();
        let sql = |e| LedgerError::Sql {
            path: path.clone(),
            source: e,
        };
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(sql)?;
        for table in ["undo", "facts", "steps"] {
            tx.execute(
                &format!("DELETE FROM {table} WHERE bundle=?1 AND seq>=?2"),
                params![name, from],
            )
            .map_err(sql)?;
        }
        tx.commit().map_err(sql)?;
        Ok(())
    }

    /// A re-apply's new plan (and its deploy id) for a bundle.
    pub fn update_plan(
        &self,
        name: &str,
        deploy_id: &str,
        plan: &serde_json::Value,
    ) -> Result<(), LedgerError> {
        self.conn
            .execute(
                "UPDATE bundles SET deploy_id=?2, plan=?3, updated_unix=?4 WHERE name=?1",
                params![name, deploy_id, plan.to_string(), now() as i64],
            )
            .map_err(self.sql())?;
        Ok(())
    }

    /// Deletes one undo operation (it was carried out).
    pub fn done_undo(&self, name: &str, seq: u32, idx: u32) -> Result<(), LedgerError> {
        self.conn
            .execute(
                "DELETE FROM undo WHERE bundle=?1 AND seq=?2 AND idx=?3",
                params![name, seq, idx],
            )
            .map_err(self.sql())?;
        Ok(())
    }

    /// Deletes a bundle and everything recorded for it.
    pub fn remove(&self, name: &str) -> Result<(), LedgerError> {
        self.conn
            .execute("DELETE FROM bundles WHERE name=?1", params![name])
            .map_err(self.sql())?;
        let _ = std::fs::remove_file(self.lock_path(name));
        Ok(())
    }
}

/// The step fields the ledger keeps.
#[derive(Clone, Debug, PartialEq)]
pub struct StepHead {
    /// Candy.
    pub candy: String,
    /// Kind.
    pub kind: String,
    /// Scope.
    pub scope: String,
    /// One line for people.
    pub title: String,
    /// The step as applied.
    pub step: serde_json::Value,
}

struct RawBundle {
    name: String,
    deploy_id: String,
    box_name: String,
    target: String,
    target_key: String,
    connection: String,
    user: String,
    home: String,
    state: String,
    plan: String,
    options: String,
    created: i64,
    updated: i64,
    error: Option<String>,
}

fn row_to_raw(r: &rusqlite::Row<'_>) -> rusqlite::Result<RawBundle> {
    Ok(RawBundle {
        name: r.get(0)?,
        deploy_id: r.get(1)?,
        box_name: r.get(2)?,
        target: r.get(3)?,
        target_key: r.get(4)?,
        connection: r.get(5)?,
        user: r.get(6)?,
        home: r.get(7)?,
        state: r.get(8)?,
        plan: r.get(9)?,
        options: r.get(10)?,
        created: r.get(11)?,
        updated: r.get(12)?,
        error: r.get(13)?,
    })
}

impl RawBundle {
    fn into_record(self) -> Result<BundleRecord, LedgerError> {
        let corrupt = |m: String| LedgerError::Corrupt {
            bundle: self.name.clone(),
            message: m,
        };
        let json = |s: &str| -> Result<serde_json::Value, LedgerError> {
            serde_json::from_str(s).map_err(|e| corrupt(e.to_string()))
        };
        Ok(BundleRecord {
            deploy_id: self.deploy_id.clone(),
            box_name: self.box_name.clone(),
            target: Target::named(&self.target)
                .ok_or_else(|| corrupt(format!("target `{}`", self.target)))?,
            target_key: self.target_key.clone(),
            connection: Connection::from_json(&json(&self.connection)?),
            user: self.user.clone(),
            home: self.home.clone(),
            state: BundleState::parse(&self.state)
                .ok_or_else(|| corrupt(format!("state `{}`", self.state)))?,
            plan: json(&self.plan)?,
            options: json(&self.options)?,
            created_unix: self.created as u64,
            updated_unix: self.updated as u64,
            error: self.error.clone(),
            name: self.name,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(name: &str) -> BundleRecord {
        BundleRecord {
            name: name.into(),
            deploy_id: "d1".into(),
            box_name: "b".into(),
            target: Target::Local,
            target_key: "local:/r".into(),
            connection: Connection::Local { root: None },
            user: "u".into(),
            home: "/home/u".into(),
            state: BundleState::Applying,
            plan: serde_json::json!({}),
            options: serde_json::json!({}),
            created_unix: 0,
            updated_unix: 0,
            error: None,
        }
    }

    fn head() -> StepHead {
        StepHead {
            candy: "c".into(),
            kind: "file".into(),
            scope: "user".into(),
            title: "c: write /x".into(),
            step: serde_json::json!({"k": 1}),
        }
    }

    #[test]
    fn round_trip_and_uniqueness() {
        let t = tempfile::tempdir().expect("tmp");
        let mut l = Ledger::open(t.path()).expect("open");
        l.create(&rec("a")).expect("create");
        assert!(matches!(l.create(&rec("a")), Err(LedgerError::Exists(_))));
        assert!(matches!(
            l.create(&rec("b")),
            Err(LedgerError::Duplicate { .. })
        ));
        l.begin_step("a", 0, &head(), StepState::Incomplete, None)
            .expect("begin");
        let op = Undo::RestoreFile {
            path: "/x".into(),
            sha256: "ab".into(),
            mode: 0o644,
            uid: 1,
            gid: 1,
            privileged: false,
        };
        l.add_undo("a", 0, &op, &[], &[("ab".into(), b"old".to_vec())])
            .expect("undo");
        let rm_y = ReverseOp::new(
            charly_rules::plan::ReverseKind::RmFileUser,
            vec!["/y".into()],
            charly_rules::plan::Scope::User,
        );
        l.add_undo(
            "a",
            0,
            &Undo::RemovePath {
                path: "/y".into(),
                privileged: false,
            },
            std::slice::from_ref(&rm_y),
            &[],
        )
        .expect("undo");
        // A second handle (another process) sees the incomplete step at once.
        let l2 = Ledger::open(t.path()).expect("open 2");
        let steps = l2.steps("a").expect("steps");
        assert_eq!(steps[0].state, StepState::Incomplete);
        assert_eq!(steps[0].undo.len(), 2);
        assert_eq!(steps[0].undo[0], (0, op));
        // Which reverse op each carries out (none for the first).
        assert_eq!(steps[0].realizes.get(&0), None);
        assert_eq!(steps[0].realizes.get(&1), Some(&vec![rm_y]));
        assert_eq!(l2.blob("a", "ab").expect("blob"), Some(b"old".to_vec()));
        l.finish_step(
            "a",
            0,
            StepState::Complete,
            None,
            &[Fact::Dir { path: "/d".into() }],
        )
        .expect("finish");
        let s = &l2.steps("a").expect("steps")[0];
        assert_eq!(s.state, StepState::Complete);
        assert_eq!(s.facts, vec![Fact::Dir { path: "/d".into() }]);
        l.done_undo("a", 0, 1).expect("done");
        assert_eq!(l2.steps("a").expect("steps")[0].undo.len(), 1);
        let lock = l.lock("a").expect("lock");
        assert!(l2.is_locked("a"));
        drop(lock);
        assert!(!l2.is_locked("a"));
        l.remove("a").expect("rm");
        assert!(l2.get("a").expect("get").is_none());
        assert!(l2.steps("a").expect("steps").is_empty(), "cascade");
        assert_eq!(l2.blob("a", "ab").expect("blob"), None);
    }
    /// The tables as the first ledger versions created them, and rows as
    /// `charly bundle add` wrote them (connection JSON from `json!`).
    fn old_ledger(dir: &Path) {
        let c = rusqlite::Connection::open(dir.join("ledger.sqlite")).expect("db");
        c.execute_batch(
            "CREATE TABLE bundles(
               name TEXT PRIMARY KEY, deploy_id TEXT NOT NULL, box TEXT NOT NULL,
               target TEXT NOT NULL, target_key TEXT NOT NULL, connection TEXT NOT NULL,
               user TEXT NOT NULL, home TEXT NOT NULL, state TEXT NOT NULL,
               plan TEXT NOT NULL, options TEXT NOT NULL,
               created_unix INTEGER NOT NULL, updated_unix INTEGER NOT NULL, error TEXT,
               UNIQUE(target_key, deploy_id));",
        )
        .expect("schema");
        let rows: &[(&str, &str, &str, &str)] = &[
            (
                "l",
                "local",
                "local:local:/",
                r#"{"kind":"local","root":null}"#,
            ),
            (
                "r",
                "local",
                "local:local:/srv/r",
                r#"{"kind":"local","root":"/srv/r"}"#,
            ),
            ("p", "pod", "pod:local:/", r#"{"kind":"local","root":null}"#),
            (
                "k",
                "k8s",
                "k8s:/p/.build/k8s/k",
                r#"{"kind":"local","root":null}"#,
            ),
            (
                "v",
                "vm",
                "vm:al@10.0.0.2:2222",
                r#"{"host":"10.0.0.2","identity":"/k/id","kind":"ssh","known_hosts":"/k/kh","port":2222,"user":"al"}"#,
            ),
            ("t", "local", "local:/t", r#"{"kind":"test"}"#),
            ("n", "local", "local:/n", r#"{"kind":"local"}"#),
        ];
        for (name, target, key, conn) in rows {
            c.execute(
                "INSERT INTO bundles VALUES(?1,'d1','b',?2,?3,?4,'u','/home/u','applied','{}',
                   '{\"emit\":{\"system\":false,\"out\":null,\"image\":null}}',1,2,NULL)",
                params![name, target, key, conn],
            )
            .expect("row");
        }
    }

    /// An undo table of the versions before reverse ops were recorded: it
    /// gains the column when opened, its rows read as carrying out none.
    #[test]
    fn undo_rows_of_earlier_versions_read_and_new_ones_record_reverse_ops() {
        let t = tempfile::tempdir().expect("tmp");
        {
            let l = Ledger::open(t.path()).expect("open");
            l.create(&rec("a")).expect("create");
            l.begin_step("a", 0, &head(), StepState::Complete, None)
                .expect("begin");
            l.conn
                .execute_batch(
                    "DROP TABLE undo;
                     CREATE TABLE undo(
                       bundle TEXT NOT NULL REFERENCES bundles(name) ON DELETE CASCADE,
                       seq INTEGER NOT NULL, idx INTEGER NOT NULL, op TEXT NOT NULL,
                       PRIMARY KEY(bundle, seq, idx));
                     INSERT INTO undo VALUES('a', 0, 0, '{\"op\":\"note\",\"text\":\"old\"}');
                     PRAGMA user_version=0;",
                )
                .expect("old table");
        }
        let mut l = Ledger::open(t.path()).expect("reopen");
        let s = &l.steps("a").expect("steps")[0];
        assert_eq!(s.undo, vec![(0, Undo::Note { text: "old".into() })]);
        assert!(s.realizes.is_empty());
        let op = ReverseOp::new(
            charly_rules::plan::ReverseKind::RmFileSystem,
            vec!["/etc/x".into()],
            charly_rules::plan::Scope::System,
        );
        l.add_undo(
            "a",
            0,
            &Undo::RemovePath {
                path: "/etc/x".into(),
                privileged: true,
            },
            std::slice::from_ref(&op),
            &[],
        )
        .expect("undo");
        let s = &l.steps("a").expect("steps")[0];
        assert_eq!(s.realizes.get(&1), Some(&vec![op]));
        // Opening again leaves the table as it is.
        drop(l);
        assert_eq!(
            Ledger::open(t.path())
                .expect("open")
                .steps("a")
                .expect("steps")[0]
                .undo
                .len(),
            2
        );
    }

    /// Many processes opening a new ledger at once (each `bundle add` of a
    /// parallel CI job does): every open succeeds, the schema is made once,
    /// and records made right after are all there.
    #[test]
    fn concurrent_first_opens_and_creates_all_succeed() {
        let t = tempfile::tempdir().expect("tmp");
        let dir = t.path().to_path_buf();
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let dir = dir.clone();
                std::thread::spawn(move || {
                    let l = Ledger::open(&dir).map_err(|e| e.to_string())?;
                    let mut r = rec(&format!("b{i}"));
                    r.target_key = format!("local:/r{i}");
                    l.create(&r).map_err(|e| e.to_string())?;
                    l.begin_step(&r.name, 0, &head(), StepState::Incomplete, None)
                        .map_err(|e| e.to_string())
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread").expect("open, create and record");
        }
        let l = Ledger::open(&dir).expect("open");
        assert_eq!(l.list().expect("list").len(), 8);
        let v: i64 = l
            .conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .expect("version");
        assert_eq!(v, SCHEMA);
    }

    /// Undo operations are ordered across bundles as they were recorded;
    /// one handed over keeps its own place in that order.
    #[test]
    fn undo_order_spans_bundles_and_survives_hand_over() {
        let t = tempfile::tempdir().expect("tmp");
        let mut l = Ledger::open(t.path()).expect("open");
        for (name, key) in [("a", "k1"), ("b", "k2")] {
            let mut r = rec(name);
            r.target_key = key.into();
            l.create(&r).expect("create");
            l.begin_step(name, 0, &head(), StepState::Complete, None)
                .expect("begin");
        }
        let rm = |p: &str| Undo::RemovePath {
            path: p.into(),
            privileged: false,
        };
        l.add_undo("a", 0, &rm("/x"), &[], &[]).expect("a1");
        l.add_undo("b", 0, &rm("/x"), &[], &[]).expect("b1");
        l.add_undo("a", 0, &rm("/y"), &[], &[]).expect("a2");
        let a = &l.steps("a").expect("a")[0];
        let b = &l.steps("b").expect("b")[0];
        assert!(
            a.at[&0] < b.at[&0] && b.at[&0] < a.at[&1],
            "{:?} {:?}",
            a.at,
            b.at
        );
        let first = a.at[&0];
        l.hand_over("a", "b", 0, &[0], &rm("/x"), first)
            .expect("hand over");
        let b = &l.steps("b").expect("b")[0];
        assert_eq!(b.at[&0], first);
    }

    #[test]
    fn ledgers_of_earlier_versions_read_typed() {
        let t = tempfile::tempdir().expect("tmp");
        old_ledger(t.path());
        let l = Ledger::open(t.path()).expect("open");
        let get = |n: &str| l.get(n).expect("get").expect("present");
        let local = Connection::Local { root: None };
        assert_eq!(get("l").target, Target::Local);
        assert_eq!(get("l").connection, local);
        assert_eq!(get("l").target_key, "local:local:/");
        assert_eq!(
            get("r").connection,
            Connection::Local {
                root: Some("/srv/r".into())
            }
        );
        assert_eq!(
            (get("p").target, get("p").connection),
            (Target::Pod, local.clone())
        );
        assert_eq!(get("k").target, Target::K8s);
        assert_eq!(get("k").options["emit"]["out"], serde_json::Value::Null);
        let v = get("v");
        assert_eq!(v.target, Target::Vm);
        assert_eq!(
            v.connection,
            Connection::Ssh(SshTarget {
                user: "al".into(),
                host: "10.0.0.2".into(),
                port: 2222,
                identity: "/k/id".into(),
                known_hosts: "/k/kh".into(),
            })
        );
        assert_eq!(v.state, BundleState::Applied);
        assert_eq!((v.created_unix, v.updated_unix), (1, 2));
        // A kind this version cannot reach is kept as it was stored.
        assert_eq!(get("t").connection.kind(), Some("test"));
        assert_eq!(
            get("t").connection.to_json().expect("json"),
            serde_json::json!({"kind": "test"})
        );
        assert_eq!(get("n").connection, local);
        let names: Vec<String> = l
            .list()
            .expect("list")
            .into_iter()
            .map(|r| r.name)
            .collect();
        assert_eq!(names, ["k", "l", "n", "p", "r", "t", "v"]);
        // A target name no version wrote is a corrupt record, not a guess.
        l.conn
            .execute("UPDATE bundles SET target='moon' WHERE name='l'", [])
            .expect("update");
        assert!(matches!(l.get("l"), Err(LedgerError::Corrupt { .. })));
    }

    #[test]
    fn records_are_stored_as_earlier_versions_wrote_them() {
        let t = tempfile::tempdir().expect("tmp");
        let l = Ledger::open(t.path()).expect("open");
        let ssh = SshTarget {
            user: "al".into(),
            host: "10.0.0.2".into(),
            port: 2222,
            identity: "/k/id".into(),
            known_hosts: "/k/kh".into(),
        };
        let cases = [
            (
                "a",
                Target::Local,
                Connection::Local { root: None },
                r#"{"kind":"local","root":null}"#,
            ),
            (
                "b",
                Target::Pod,
                Connection::Local {
                    root: Some("/srv/r".into()),
                },
                r#"{"kind":"local","root":"/srv/r"}"#,
            ),
            (
                "c",
                Target::Vm,
                Connection::Ssh(ssh.clone()),
                r#"{"host":"10.0.0.2","identity":"/k/id","kind":"ssh","known_hosts":"/k/kh","port":2222,"user":"al"}"#,
            ),
        ];
        for (name, target, connection, _) in &cases {
            let mut r = rec(name);
            r.target = *target;
            r.target_key = format!("key-{name}");
            r.connection = connection.clone();
            l.create(&r).expect("create");
            let mut got = l.get(name).expect("get").expect("present");
            (got.created_unix, got.updated_unix) = (0, 0);
            assert_eq!(got, r);
        }
        for (name, target, _, stored) in &cases {
            let (t, c): (String, String) = l
                .conn
                .query_row(
                    "SELECT target, connection FROM bundles WHERE name=?1",
                    params![name],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .expect("row");
            assert_eq!(t, target.as_str());
            assert_eq!(c, *stored);
        }
        // The old writer's exact text (serde_json's json! of the same fields).
        let old = serde_json::json!({"kind": "ssh", "user": ssh.user, "host": ssh.host,
            "port": ssh.port, "identity": ssh.identity, "known_hosts": ssh.known_hosts});
        assert_eq!(old.to_string(), cases[2].3);
    }
}
