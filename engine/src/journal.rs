//! The no-op journal: "nothing to do" without loading the project.
//!
//! A no-op `box generate` would load and resolve every YAML file, compile
//! every plan and compute every key only to find every record present. Like
//! ninja's log, the journal short-cuts that: after a successful run it
//! records the stat fingerprint (size, mtime, ctime, inode, mode) of every
//! file and directory the run could have read, of every output it left on
//! disk, the charly binary's own fingerprint and the store's deletion epoch
//! ([`charly_cache::read_epoch`]), together with the run's outcome (its nodes
//! and keys, the lines it printed). The next run with the same command stats
//! the same paths; when every fingerprint and the epoch match, the outcome is
//! the same as last time — every node cached under the same key, every output
//! file already right — and it is replayed. Any difference (a byte, a new
//! file, a touched file, a removed output, a GC, a new charly binary) falls
//! back to the full run, which is always correct; the journal can only make
//! a run faster, never change its result.
//!
//! What counts as read: every file and directory under each walked root (the
//! project and its imports, skipping `.git` and the build output directory),
//! plus single files (e.g. `charly.yml` in each directory above the project,
//! which the loader may consult, recorded as absent when absent). A
//! directory's mtime changes when an entry is added, removed or renamed, so
//! new files are seen without listing directories. The caller checks after
//! its run that everything the loader used lies inside the walked roots
//! ([`Recorder::covers`]); if not, nothing is recorded.
//!
//! Timestamps are coarse (a kernel tick; a second or two on some file
//! systems), so a file changed in the same tick as it was fingerprinted could
//! keep its fingerprint ("racy git"). Inputs are fingerprinted *before* the
//! run reads them, and a run whose inputs changed within [`RACY_NS`] of that
//! walk records nothing. Outputs are written by the run itself and are
//! always recent, so the journal also stores their content digest and
//! verifies racy outputs by content; once they are old enough, a replay
//! drops those digests and rewrites the journal, as git refreshes its index.
//!
//! When the journal cannot replay, its last entry still serves the full run
//! as a [`Memo`]. Besides the keys present and the outputs left, it holds a
//! digest per box of everything that box's output is derived from
//! ([`Recorder::box_digests`]): the fingerprints of every input outside
//! candy directories (the root, vocabularies, box files: "global"), of every
//! file in the directories of the candies of the box and of the boxes it is
//! built on or with, and those boxes' resolutions. A box whose digest is the
//! same, whose build directory is as it was left, is not derived again: its
//! nodes and outputs are carried over from the memo ([`Memo::carry`]). An
//! edit to one candy re-derives only the boxes that contain it; an edit to
//! anything global, all of them. Racy files make their boxes' digests
//! untrusted (recorded as none), as for the whole entry.

use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// Version of the journal file format; a different one is ignored.
pub const JOURNAL_SCHEMA: u32 = 4;

/// Files modified this close (nanoseconds) to a fingerprint are not trusted
/// by stat alone (the stat cache's window, [`crate::hash::RACY_NS`]).
pub use crate::hash::RACY_NS;

/// A path's stat fingerprint: `[kind, size, mtime_ns, ctime_ns, inode,
/// mode]`, kind 0 = absent, 1 = file, 2 = directory, 3 = other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fp(u8, u64, i64, i64, u64, u32);

impl Fp {
    const ABSENT: Fp = Fp(0, 0, 0, 0, 0, 0);

    /// A fingerprint from its fields, kind first (1 = file, 2 = directory,
    /// 3 = other). Only a file keeps its size: directory sizes are
    /// file-system bookkeeping, not content.
    fn new(kind: u8, size: u64, mtime_ns: i64, ctime_ns: i64, ino: u64, mode: u32) -> Fp {
        Fp(
            kind,
            if kind == 1 { size } else { 0 },
            mtime_ns,
            ctime_ns,
            ino,
            mode,
        )
    }

    fn of_meta(m: &std::fs::Metadata) -> Fp {
        let kind = if m.is_file() {
            1
        } else if m.is_dir() {
            2
        } else {
            3
        };
        Fp::new(
            kind,
            m.len(),
            m.mtime() * 1_000_000_000 + m.mtime_nsec(),
            m.ctime() * 1_000_000_000 + m.ctime_nsec(),
            m.ino(),
            m.mode(),
        )
    }

    /// The fingerprint of a `statx` result: the same fields as
    /// [`Fp::of_meta`] (the standard library fills its metadata from
    /// `statx` too).
    #[cfg(target_os = "linux")]
    fn of_statx(x: &rustix::fs::Statx) -> Fp {
        let kind = match rustix::fs::FileType::from_raw_mode(x.stx_mode.into()) {
            rustix::fs::FileType::RegularFile => 1,
            rustix::fs::FileType::Directory => 2,
            _ => 3,
        };
        let ns = |t: &rustix::fs::StatxTimestamp| t.tv_sec * 1_000_000_000 + i64::from(t.tv_nsec);
        Fp::new(
            kind,
            x.stx_size,
            ns(&x.stx_mtime),
            ns(&x.stx_ctime),
            x.stx_ino,
            x.stx_mode.into(),
        )
    }

    /// Fingerprints a path (following symlinks, as the loader does).
    pub fn of(path: &Path) -> Fp {
        match std::fs::metadata(path) {
            Ok(m) => Fp::of_meta(&m),
            Err(_) => Fp::ABSENT,
        }
    }

    fn is_file(&self) -> bool {
        self.0 == 1
    }

    /// The later of mtime and ctime.
    fn changed_ns(&self) -> i64 {
        self.2.max(self.3)
    }
}

/// One output file or directory: fingerprint, and the content digest while
/// the fingerprint is too recent to trust.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct OutputEntry(String, Fp, Option<String>);

impl OutputEntry {
    /// Whether the output is as recorded (by stat; by content while its
    /// fingerprint was too recent to trust).
    fn unchanged(&self) -> bool {
        self.matches(Fp::of(Path::new(&self.0)))
    }

    /// [`OutputEntry::unchanged`] of the entry at `rel` below the open
    /// directory `dir` (`""`: the directory itself), which is where the
    /// entry's path leads.
    #[cfg(target_os = "linux")]
    fn unchanged_at(&self, dir: &rustix::fd::OwnedFd, rel: &str) -> bool {
        let flags = if rel.is_empty() {
            rustix::fs::AtFlags::EMPTY_PATH
        } else {
            rustix::fs::AtFlags::empty()
        };
        let now = rustix::fs::statx(dir, rel, flags, rustix::fs::StatxFlags::BASIC_STATS)
            .map_or(Fp::ABSENT, |x| Fp::of_statx(&x));
        self.matches(now)
    }

    /// Whether `now`, the output's fingerprint as it is, shows it as
    /// recorded (its content hashed while the recorded fingerprint was
    /// too recent to trust).
    fn matches(&self, now: Fp) -> bool {
        let OutputEntry(p, fp, d) = self;
        now == *fp
            && d.as_ref()
                .is_none_or(|d| digest_of(Path::new(p)).as_ref() == Some(d))
    }

    /// Drops the content digest when the output last changed before
    /// `cutoff` (a change after it would change the fingerprint, so the
    /// stat alone is trusted from then on); whether it dropped one.
    fn settle(&mut self, cutoff: i64) -> bool {
        let OutputEntry(_, fp, d) = self;
        fp.changed_ns() < cutoff && d.take().is_some()
    }
}

/// What the last run of a command still tells a full run when the journal
/// cannot replay it (the same binary, the same store epoch): which keys
/// have records in the store (nothing was deleted since), which key each
/// node had, and what it left in the output directories. A full run uses
/// it to skip the store lookup of every node whose key did not change and
/// the rewrite of every build directory nobody touched; the work left is
/// in proportion to the change.
pub struct Memo {
    present: std::collections::HashSet<charly_cache::NodeKey>,
    keys: std::collections::HashMap<String, charly_cache::NodeKey>,
    /// Output entries sorted by path (a directory's entries follow it).
    outputs: Vec<OutputEntry>,
    /// The last run's nodes, in its order.
    nodes: Vec<(String, crate::key::NodeKind, charly_cache::NodeKey)>,
    /// The last run's boxes by name.
    boxes: std::collections::HashMap<String, BoxEntry>,
    /// [`Memo::dir_unchanged`]'s answers taken ahead, by normalized path
    /// ([`Memo::check_ahead`]).
    ahead: std::collections::HashMap<PathBuf, bool>,
}

/// The last run's journal entry, from which its [`Memo`] is built.
pub struct MemoSeed(Box<Entry>);

impl MemoSeed {
    /// The memo: the last run's keys, outputs and boxes, indexed.
    pub fn build(self) -> Memo {
        Memo::of(*self.0)
    }
}

impl Memo {
    fn of(e: Entry) -> Memo {
        let mut present = std::collections::HashSet::new();
        let mut keys = std::collections::HashMap::new();
        for (id, _, k) in &e.outcome.nodes {
            present.insert(*k);
            keys.insert(id.clone(), *k);
        }
        let mut outputs = e.outputs;
        outputs.sort_by(|a, b| a.0.cmp(&b.0));
        Memo {
            present,
            keys,
            outputs,
            nodes: e.outcome.nodes,
            boxes: e
                .outcome
                .boxes
                .into_iter()
                .map(|b| (b.name.clone(), b))
                .collect(),
            ahead: std::collections::HashMap::new(),
        }
    }

    /// The names of the last run's boxes.
    pub fn box_names(&self) -> impl Iterator<Item = &str> {
        self.boxes.keys().map(String::as_str)
    }

    /// Checks the output directories `dirs` now ([`Memo::dir_unchanged`]),
    /// so that the questions about them are answered at once until
    /// [`Memo::forget_ahead`]: a command does this on a core its project's
    /// resolution leaves idle. The answers are as of now: the caller
    /// forgets them before it writes in any of the directories.
    pub fn check_ahead(&mut self, dirs: impl IntoIterator<Item = PathBuf>) {
        for d in dirs {
            let d = normalize(&d);
            let unchanged = self.check_dir(&d);
            self.ahead.insert(d, unchanged);
        }
    }

    /// Drops the answers [`Memo::check_ahead`] took: later questions are
    /// checked when asked.
    pub fn forget_ahead(&mut self) {
        self.ahead = std::collections::HashMap::new();
    }

    /// Whether box `name` had `digest` in the last run (an untrusted
    /// digest, none, matches nothing).
    pub fn box_unchanged(&self, name: &str, digest: Option<&BoxDigest>) -> bool {
        digest.is_some() && self.boxes.get(name).and_then(|b| b.digest.as_ref()) == digest
    }

    /// The nodes of the last run's boxes `names` (each once, in the last
    /// run's order), but those in `except` (nodes this run has itself).
    pub fn carry(
        &self,
        names: &[&str],
        except: &std::collections::HashSet<&str>,
    ) -> Vec<(String, crate::key::NodeKind, charly_cache::NodeKey)> {
        let mut at: Vec<u32> = names
            .iter()
            .filter_map(|n| self.boxes.get(*n))
            .flat_map(|b| b.nodes.iter().copied())
            .collect();
        at.sort_unstable();
        at.dedup();
        at.iter()
            .filter_map(|i| self.nodes.get(*i as usize))
            .filter(|(id, ..)| !except.contains(id.as_str()))
            .cloned()
            .collect()
    }

    /// The ids of the nodes box `name` had in the last run.
    pub fn box_nodes(&self, name: &str) -> impl Iterator<Item = &str> {
        self.boxes
            .get(name)
            .into_iter()
            .flat_map(|b| b.nodes.iter())
            .filter_map(|i| self.nodes.get(*i as usize))
            .map(|(id, ..)| id.as_str())
    }

    /// The keys the store held records for at the end of the last run
    /// (and, the epoch being the same, still does).
    pub fn present_keys(&self) -> &std::collections::HashSet<charly_cache::NodeKey> {
        &self.present
    }

    /// Whether node `id` had `key` in the last run.
    pub fn key_was(&self, id: &str, key: &charly_cache::NodeKey) -> bool {
        self.keys.get(id) == Some(key)
    }

    /// Whether the output `dir` the last run left is exactly as it was
    /// left: the directory and everything recorded below it unchanged (an
    /// added or removed entry changes the directory's own fingerprint; an
    /// output the last run recorded as absent must still be absent).
    pub fn dir_unchanged(&self, dir: &Path) -> bool {
        if !self.ahead.is_empty()
            && let Some(unchanged) = self.ahead.get(&normalize(dir))
        {
            return *unchanged;
        }
        self.check_dir(dir)
    }

    /// [`Memo::dir_unchanged`], checked now.
    fn check_dir(&self, dir: &Path) -> bool {
        let Some(mut es) = self.entries_of(dir) else {
            return false;
        };
        // Below the directory, each entry is looked up from a handle on it
        // instead of by its whole path again: a build directory holds
        // thousands of files, each eight or more components deep.
        #[cfg(target_os = "linux")]
        if let Some(top) = es.next()
            && let Ok(fd) = rustix::fs::open(
                top.0.as_str(),
                rustix::fs::OFlags::PATH
                    | rustix::fs::OFlags::DIRECTORY
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
        {
            let prefix = top.0.len() + 1;
            // Every entry after the first starts with the directory's path
            // and a `/` (`entries_of`).
            return top.unchanged_at(&fd, "")
                && es.all(|e| {
                    e.0.get(prefix..)
                        .is_some_and(|rel| e.unchanged_at(&fd, rel))
                });
        }
        es.all(OutputEntry::unchanged)
    }

    /// The recorded entries of output `dir`: the directory itself, then
    /// everything below it (None when the directory was not recorded).
    fn entries_of(&self, dir: &Path) -> Option<impl Iterator<Item = &OutputEntry>> {
        let d = path_str(&normalize(dir))?;
        // Entries starting with `d/` are contiguous in sorted order (but not
        // adjacent to `d`: `d-x` sorts between them).
        let at = self
            .outputs
            .binary_search_by(|o| o.0.as_str().cmp(&d))
            .ok()?;
        let prefix = format!("{d}/");
        let start = self.outputs.partition_point(|o| o.0 < prefix);
        Some(
            std::iter::once(&self.outputs[at]).chain(
                self.outputs[start..]
                    .iter()
                    .take_while(move |o| o.0.starts_with(&prefix)),
            ),
        )
    }
}

/// What a successful run did, replayed by a matching later run.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Outcome {
    /// Every node: id, kind, key (hex in the file).
    pub nodes: Vec<(String, crate::key::NodeKind, charly_cache::NodeKey)>,
    /// The lines the run printed on stdout.
    pub stdout: Vec<String>,
    /// Warnings the run printed on stderr that a replay must repeat (boxes
    /// `--keep-going` left out).
    #[serde(default)]
    pub warnings: Vec<String>,
    /// The boxes the run derived or carried over, with their digests and
    /// nodes (what the next run's [`Memo`] compares and carries).
    #[serde(default)]
    pub boxes: Vec<BoxEntry>,
    /// Exactly what a command whose stdout is not a list of lines printed
    /// (`box plan`, `graph`, …: the `pure` module), byte for byte.
    #[serde(default)]
    pub raw: Option<Vec<u8>>,
    /// Nodes the run reported as not in the store (`would run`): id, key
    /// hex. Adding never changes the store's epoch, so a replay first asks
    /// the store that each is still absent ([`Journal::check_store`]).
    #[serde(default)]
    pub absent: Vec<(String, String)>,
    /// Lines for people the run printed after its stdout unless quiet
    /// (summary lines, hints), for a replay to print again.
    #[serde(default)]
    pub notes: Vec<String>,
}

/// The digest of what one box's output is derived from
/// ([`Recorder::box_digests`]).
pub type BoxDigest = [u8; 32];

/// One box of a run's outcome.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BoxEntry {
    /// The box.
    pub name: String,
    /// What its output is derived from; none when that could not be
    /// trusted (racy inputs, an incomplete walk).
    pub digest: Option<BoxDigest>,
    /// Its nodes (everything its goal depends on): indices into the
    /// outcome's nodes.
    pub nodes: Vec<u32>,
}

#[derive(Serialize, Deserialize)]
struct Entry {
    schema: u32,
    /// The command the entry answers (for people reading the file).
    command: String,
    exe: Fp,
    epoch: String,
    /// When the outputs were fingerprinted (unix ns).
    recorded_ns: i64,
    inputs: Vec<(String, Fp)>,
    outputs: Vec<OutputEntry>,
    outcome: Outcome,
    /// Whether the inputs can be trusted by stat (false: the run's inputs
    /// changed while it read them, or it used something outside the walked
    /// roots). Such an entry never replays, but its outcome and outputs
    /// still serve as the next run's [`Memo`].
    #[serde(default = "replayable_default")]
    replayable: bool,
}

fn replayable_default() -> bool {
    true
}

/// Why a journal did not answer (for `--explain`-style reporting and tests).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Miss {
    /// No entry for this command (or an unreadable / older-format one).
    NoEntry,
    /// The charly binary changed.
    Binary,
    /// Something was deleted from the store.
    StoreEpoch,
    /// An input's fingerprint changed.
    Input(String),
    /// An output was changed, removed or added to.
    Output(String),
    /// The last run's inputs changed while it read them (or it read
    /// something outside the project), so they cannot be trusted by stat.
    Unreplayable,
    /// The store now has a record for a node the run reported as absent.
    Added(String),
    /// The store's index was written since (by [`Journal::store_index`]).
    StoreIndex,
}

impl std::fmt::Display for Miss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Miss::NoEntry => write!(f, "no journal entry for this command"),
            Miss::Binary => write!(f, "the charly binary changed"),
            Miss::StoreEpoch => write!(f, "the store deleted entries since"),
            Miss::Input(p) => write!(f, "input changed: {p}"),
            Miss::Output(p) => write!(f, "output changed: {p}"),
            Miss::Unreplayable => write!(
                f,
                "the last run's inputs changed while it read them (or it read outside the project)"
            ),
            Miss::StoreIndex => write!(
                f,
                "the store's index changed since (records added, used or repaired)"
            ),
            Miss::Added(id) => write!(
                f,
                "the store has a record for {id} now (the last run reported it as not built)"
            ),
        }
    }
}

/// The journal of one command in one store (`<store>/journal/<id>.bin`, postcard).
pub struct Journal {
    store_dir: PathBuf,
    file: PathBuf,
    command: String,
    /// How recent a change must be to count as racy ([`RACY_NS`]; tests
    /// shrink it instead of waiting).
    pub racy_ns: i64,
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn exe_fp() -> Fp {
    std::env::current_exe()
        .map(|p| Fp::of(&p))
        .unwrap_or(Fp::ABSENT)
}

/// Adds a walked entry's fingerprint (followed: what a symlink points at);
/// false when it cannot be recorded (a walk error, a path not UTF-8).
fn fingerprint(e: walkdir::Result<walkdir::DirEntry>, into: &mut Vec<(String, Fp)>) -> bool {
    let Ok(e) = e else { return false };
    let Some(p) = path_str(e.path()) else {
        return false;
    };
    let fp = e.metadata().map(|m| Fp::of_meta(&m)).unwrap_or(Fp::ABSENT);
    into.push((p, fp));
    true
}

fn path_str(p: &Path) -> Option<String> {
    p.to_str().map(str::to_string)
}

fn digest_of(path: &Path) -> Option<String> {
    let m = std::fs::metadata(path).ok()?;
    crate::hash::hash_file(path, m.len())
        .ok()
        .map(|d| d.to_hex())
}

impl Journal {
    /// The journal for `command` (every argument that can change the
    /// result, e.g. `generate --all` plus the project's absolute root) in
    /// the store at `store_dir`. Opens nothing.
    pub fn new(store_dir: &Path, command: &str) -> Journal {
        let id = blake3::hash(command.as_bytes()).to_hex();
        Journal {
            store_dir: store_dir.to_path_buf(),
            file: store_dir.join("journal").join(format!("{}.bin", &id[..32])),
            command: command.to_string(),
            racy_ns: RACY_NS,
        }
    }

    fn read(&self) -> Option<Entry> {
        let bytes = std::fs::read(&self.file).ok()?;
        let e: Entry = postcard::from_bytes(&bytes).ok()?;
        (e.schema == JOURNAL_SCHEMA && e.command == self.command).then_some(e)
    }

    fn write(&self, e: &Entry) -> std::io::Result<()> {
        let dir = self.file.parent().unwrap_or(&self.store_dir);
        std::fs::create_dir_all(dir)?;
        let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
        let bytes = postcard::to_stdvec(e).map_err(std::io::Error::other)?;
        std::io::Write::write_all(tmp.as_file_mut(), &bytes)?;
        tmp.persist(&self.file).map_err(|e| e.error)?;
        // The entry's JSON predecessor (journal schema 1), if any.
        let _ = std::fs::remove_file(self.file.with_extension("json"));
        Ok(())
    }

    /// The files of the store's index, for a command whose result depends
    /// on every record it found (`box build`, `check`) to record as
    /// outputs: a replay then also needs the index exactly as that run
    /// left it (nothing added, used, repaired or damaged since; verified by
    /// content while recent, as outputs are).
    pub fn store_index(&self) -> Vec<PathBuf> {
        ["index.db", "index.db-wal"]
            .iter()
            .map(|f| normalize(&self.store_dir.join(f)))
            .collect()
    }

    /// Forgets this command's entry.
    pub fn clear(&self) {
        let _ = std::fs::remove_file(&self.file);
    }

    /// The recorded outcome, when nothing it depends on changed.
    pub fn check(&self) -> Result<Outcome, Miss> {
        self.check_or_seed().map_err(|(m, _)| m)
    }

    /// [`Journal::check`]; on a miss, what the last run still tells the
    /// full run, when the binary and the store's epoch are the same: the
    /// entry its [`Memo`] is built from ([`MemoSeed::build`], which a
    /// caller runs on another thread while the project loads).
    pub fn check_or_seed(&self) -> Result<Outcome, (Miss, Option<MemoSeed>)> {
        let mut e = self.read().ok_or((Miss::NoEntry, None))?;
        if e.exe != exe_fp() {
            return Err((Miss::Binary, None));
        }
        if e.epoch != charly_cache::read_epoch(&self.store_dir) {
            return Err((Miss::StoreEpoch, None));
        }
        if let Some(m) = self.changed(&e) {
            return Err((m, Some(MemoSeed(Box::new(e)))));
        }
        // Outputs verified by content that are now old enough to trust by
        // stat: drop their digests so later replays only stat.
        let cutoff = now_ns() - self.racy_ns;
        let settled = e
            .outputs
            .iter_mut()
            .fold(false, |any, o| o.settle(cutoff) | any);
        if settled {
            let _ = self.write(&e);
        }
        Ok(e.outcome)
    }

    /// Whether the store still lacks a record for every node `outcome`
    /// reported as absent (deletions are the epoch's business; additions
    /// leave it alone). Opens the store only when there is something to ask.
    pub fn check_store(&self, outcome: &Outcome) -> Result<(), Miss> {
        if outcome.absent.is_empty() {
            return Ok(());
        }
        let store = charly_cache::Store::open(&self.store_dir)
            .map_err(|e| Miss::Added(format!("(the store did not open: {e})")))?;
        for (id, hex) in &outcome.absent {
            let present = hex
                .parse::<charly_cache::NodeKey>()
                .map_or(true, |k| store.has_record(&k).unwrap_or(true));
            if present {
                return Err(Miss::Added(id.clone()));
            }
        }
        Ok(())
    }

    /// The first difference between the entry and the disk, if any.
    fn changed(&self, e: &Entry) -> Option<Miss> {
        if !e.replayable {
            return Some(Miss::Unreplayable);
        }
        // The inputs changed last are looked at first: in an edit loop the
        // file just edited is the one edited again, and finding it ends the
        // check (each stat here is repeated by the full run's own walk).
        if let Some(p) = recently_changed(&e.inputs, RECENT_FIRST)
            .into_iter()
            .find(|(p, fp)| Fp::of(Path::new(p)) != *fp)
            .map(|(p, _)| p)
        {
            return Some(Miss::Input(p.clone()));
        }
        if let Some((p, _)) = e
            .inputs
            .par_iter()
            .find_any(|(p, fp)| Fp::of(Path::new(p)) != *fp)
        {
            return Some(Miss::Input(p.clone()));
        }
        if let Some(OutputEntry(p, ..)) = e.outputs.par_iter().find_any(|o| !o.unchanged()) {
            if Path::new(p).starts_with(&self.store_dir) {
                return Some(Miss::StoreIndex);
            }
            return Some(Miss::Output(p.clone()));
        }
        None
    }

    /// Fingerprints the inputs before a full run: every file and directory
    /// under `roots` (skipping `.git` and the paths in `skip`), and each of
    /// `files`. The epoch is read first, so a deletion during the run
    /// invalidates what it records.
    pub fn begin(&self, roots: &[PathBuf], files: &[PathBuf], skip: &[PathBuf]) -> Recorder {
        self.fingerprint_inputs(self.start(), roots, files, skip)
    }

    /// The moment a full run starts: the store's epoch and the time, taken
    /// before the run reads anything. [`Journal::fingerprint_inputs`] may
    /// then walk the inputs while the run already reads them (on another
    /// thread): a file changed after this moment has a change time inside
    /// the racy window, so the entry is never replayed.
    pub fn start(&self) -> Started {
        Started {
            epoch: charly_cache::read_epoch(&self.store_dir),
            started_ns: now_ns(),
        }
    }

    /// [`Journal::begin`] from a [`Journal::start`] taken earlier.
    pub fn fingerprint_inputs(
        &self,
        started: Started,
        roots: &[PathBuf],
        files: &[PathBuf],
        skip: &[PathBuf],
    ) -> Recorder {
        let Started { epoch, started_ns } = started;
        let mut inputs = Vec::new();
        let mut ok = true;
        let skipped = |e: &walkdir::DirEntry| {
            e.file_type().is_dir()
                && (e.file_name() == ".git" || skip.iter().any(|s| s == e.path()))
        };
        // One thread walks: callers run this beside the full run, whose
        // loader and keys need the rayon pool (a parallel walk queued the
        // loader's parse jobs behind its own and left a core idle).
        for root in roots {
            for e in walkdir::WalkDir::new(root)
                .follow_links(true)
                .into_iter()
                .filter_entry(|e| !skipped(e))
            {
                ok &= fingerprint(e, &mut inputs);
            }
        }
        for f in files {
            match path_str(f) {
                Some(p) => inputs.push((p, Fp::of(f))),
                None => ok = false,
            }
        }
        let racy_after = started_ns - self.racy_ns;
        let racy = inputs.iter().any(|(_, fp)| is_racy(fp, racy_after));
        Recorder {
            roots: roots.to_vec(),
            skip: skip.to_vec(),
            epoch,
            inputs,
            usable: ok && !racy,
            walked: ok,
            racy_after,
        }
    }

    /// Records a successful run: `outputs` are walked (files and
    /// directories, skipping `skip_outputs`) and fingerprinted now. Returns
    /// whether an entry was written (not when the inputs were racy or the
    /// caller found the run used something outside the walked roots).
    pub fn record(
        &self,
        rec: Recorder,
        outputs: &[PathBuf],
        skip_outputs: &[PathBuf],
        outcome: Outcome,
    ) -> std::io::Result<bool> {
        self.record_reusing(rec, outputs, skip_outputs, outcome, None)
    }

    /// [`Journal::record`], taking the entries of the output directories
    /// in `reuse.1` from the memo instead of walking them: the caller found
    /// them unchanged ([`Memo::dir_unchanged`]) during this run and left
    /// them alone. A change made to one since is still seen by the next
    /// run: its fingerprint differs from the one recorded.
    pub fn record_reusing(
        &self,
        rec: Recorder,
        outputs: &[PathBuf],
        skip_outputs: &[PathBuf],
        outcome: Outcome,
        reuse: Option<(&Memo, &[PathBuf])>,
    ) -> std::io::Result<bool> {
        let recorded_ns = now_ns();
        let mut outs = Vec::new();
        // A set: a generate of many boxes skips a few paths in each.
        let skip_outputs: std::collections::HashSet<&Path> =
            skip_outputs.iter().map(PathBuf::as_path).collect();
        // Each output root walked on its own (in parallel), in order.
        let walked: Vec<Option<Vec<OutputEntry>>> = outputs
            .par_iter()
            .map(|root| {
                if let Some((memo, kept)) = reuse
                    && kept.contains(root)
                    && let Some(es) = memo.entries_of(root)
                {
                    // Checked this run, by content where the last run could
                    // not trust the stat: one old enough now is trusted by
                    // stat from here on (as a replay does), or every later
                    // run of an edit loop would read it again.
                    let cutoff = recorded_ns - self.racy_ns;
                    return Some(
                        es.map(|o| {
                            let mut o = o.clone();
                            o.settle(cutoff);
                            o
                        })
                        .collect(),
                    );
                }
                let mut outs = Vec::new();
                for e in walkdir::WalkDir::new(root)
                    .into_iter()
                    .filter_entry(|e| !skip_outputs.contains(e.path()))
                {
                    let (path, fp) = match e {
                        Ok(e) => (e.path().to_path_buf(), Fp::of(e.path())),
                        // A missing output root is recorded as absent.
                        Err(_) => (root.clone(), Fp::ABSENT),
                    };
                    let p = path_str(&path)?;
                    let digest = (fp.is_file() && fp.changed_ns() > recorded_ns - self.racy_ns)
                        .then(|| digest_of(&path))
                        .flatten();
                    outs.push(OutputEntry(p, fp, digest));
                }
                Some(outs)
            })
            .collect();
        for w in walked {
            let Some(w) = w else {
                // A path that is not UTF-8 cannot be recorded.
                self.clear();
                return Ok(false);
            };
            outs.extend(w);
        }
        self.write(&Entry {
            schema: JOURNAL_SCHEMA,
            command: self.command.clone(),
            exe: exe_fp(),
            epoch: rec.epoch,
            recorded_ns,
            inputs: if rec.usable { rec.inputs } else { Vec::new() },
            outputs: outs,
            outcome,
            replayable: rec.usable,
        })?;
        Ok(rec.usable)
    }
}

/// When a full run started ([`Journal::start`]).
#[derive(Debug, Clone)]
pub struct Started {
    epoch: String,
    started_ns: i64,
}

/// Input fingerprints taken before a full run ([`Journal::begin`]).
pub struct Recorder {
    roots: Vec<PathBuf>,
    skip: Vec<PathBuf>,
    epoch: String,
    inputs: Vec<(String, Fp)>,
    usable: bool,
    /// The walk saw everything (no error, every path UTF-8) and nothing
    /// outside it was used ([`Recorder::spoil`]).
    walked: bool,
    /// A change after this (unix ns) is racy.
    racy_after: i64,
}

/// How many of the most recently changed inputs [`Journal::check`] stats
/// before all of them.
const RECENT_FIRST: usize = 8;

/// The `n` entries with the latest change times (mtime or ctime), latest
/// first.
fn recently_changed(inputs: &[(String, Fp)], n: usize) -> Vec<&(String, Fp)> {
    let mut all: Vec<&(String, Fp)> = inputs.iter().collect();
    let by_latest = |a: &&(String, Fp), b: &&(String, Fp)| b.1.changed_ns().cmp(&a.1.changed_ns());
    if all.len() > n {
        all.select_nth_unstable_by(n, by_latest);
        all.truncate(n);
    }
    all.sort_unstable_by(by_latest);
    all
}

/// Whether a fingerprint is too recent to trust.
fn is_racy(fp: &Fp, racy_after: i64) -> bool {
    fp.0 != 0 && fp.changed_ns() > racy_after
}

impl Recorder {
    /// Whether `path` lies inside a walked root (and not in a skipped part).
    pub fn covers(&self, path: &Path) -> bool {
        // By bytes: both sides are normalized (no `.`, `..`, `//` or
        // trailing `/`), so a component-wise prefix is a byte prefix
        // ending at a `/` (this runs for every file a project loads).
        let path = normalize(path);
        let p = path.as_os_str().as_encoded_bytes();
        let under = |r: &PathBuf| {
            let r = r.as_os_str().as_encoded_bytes();
            p.starts_with(r) && (p.len() == r.len() || p[r.len()] == b'/' || r.ends_with(b"/"))
        };
        self.roots.iter().any(under)
            && !self.skip.iter().any(under)
            && !p.split(|&b| b == b'/').any(|c| c == b".git")
    }

    /// Marks the run as not recordable (it used something the walk did not
    /// see).
    pub fn spoil(&mut self) {
        self.usable = false;
        self.walked = false;
    }

    /// Whether [`Journal::record`] would write an entry.
    pub fn usable(&self) -> bool {
        self.usable
    }
}

impl Recorder {
    /// For each of `names`, the digest of everything its output is
    /// derived from, by this run's fingerprints: the global inputs (every
    /// walked path outside all candy directories), then for the box and
    /// each box it is built on or with (bases, builder boxes; transitively)
    /// its resolution, and the path and fingerprint of every file under
    /// the directory of each of their candies. None when that cannot be
    /// trusted: the walk was incomplete or spoiled, or one of those
    /// fingerprints is racy.
    pub fn box_digests(
        &self,
        p: &charly_rules::load::Project,
        r: &charly_rules::resolve::Resolution,
        names: &[String],
    ) -> Vec<Option<BoxDigest>> {
        if !self.walked {
            return vec![None; names.len()];
        }
        let mut sorted: Vec<&(String, Fp)> = self.inputs.iter().collect();
        sorted.par_sort_unstable_by(|a, b| a.0.cmp(&b.0));
        // Each candy's files (in parallel): a digest, or none when one is
        // racy, and the range of the entries under its directory.
        let ns_dirs: Vec<PathBuf> = p.namespaces.iter().map(|n| normalize(&n.dir)).collect();
        /// A candy's key, digest, and the entries only it holds.
        type PerCandy<'k> = (
            &'k str,
            Option<blake3::Hash>,
            Option<std::ops::Range<usize>>,
            Option<usize>,
        );
        let per_candy: Vec<PerCandy> = p
            .candies
            .par_iter()
            .map(|(key, c)| {
                let dir = normalize(&c.dir);
                let Some(d) = dir.to_str() else {
                    return (key.as_str(), None, None, None);
                };
                let prefix = format!("{d}/");
                let exact = sorted.binary_search_by(|e| e.0.as_str().cmp(d)).ok();
                let start = sorted.partition_point(|e| e.0.as_str() < prefix.as_str());
                let end = start
                    + sorted[start..]
                        .iter()
                        .take_while(|e| e.0.starts_with(&prefix))
                        .count();
                let mut buf = Vec::new();
                let mut racy = false;
                for (path, fp) in exact
                    .map(|i| sorted[i])
                    .into_iter()
                    .chain(sorted[start..end].iter().copied())
                    .map(|e| (&e.0, &e.1))
                {
                    racy |= fp.0 != 2 && is_racy(fp, self.racy_after);
                    hash_entry(&mut buf, path, fp);
                }
                // A candy directory holding a project's root holds global
                // files: nothing in it is the candy's alone.
                let holds_root = ns_dirs.iter().any(|n| n.starts_with(&dir));
                let digest = (!racy).then(|| blake3::hash(&buf));
                if holds_root {
                    (key.as_str(), digest, None, None)
                } else {
                    (key.as_str(), digest, Some(start..end), exact)
                }
            })
            .collect();
        let mut covered = vec![false; sorted.len()];
        let mut candies: std::collections::HashMap<&str, Option<blake3::Hash>> =
            std::collections::HashMap::with_capacity(per_candy.len());
        for (key, digest, range, exact) in per_candy {
            for i in range.into_iter().flatten().chain(exact) {
                covered[i] = true;
            }
            candies.insert(key, digest);
        }
        // Global even inside a candy directory: every file the loader read
        // but candy manifests (box files above all, also where an image's
        // manifest is a candy's, as in the node form).
        let box_files: std::collections::HashSet<charly_rules::source::FileId> = p
            .namespaces
            .iter()
            .flat_map(|n| n.boxes.values().map(|b| b.file))
            .collect();
        let manifests: std::collections::HashSet<charly_rules::source::FileId> = p
            .candies
            .values()
            .map(|c| c.file)
            .filter(|f| !box_files.contains(f))
            .collect();
        for f in (0..p.sources.len())
            .filter_map(|i| u32::try_from(i).ok().map(charly_rules::source::FileId))
        {
            if manifests.contains(&f) {
                continue;
            }
            let Some(path) = p.sources.path(f) else {
                continue;
            };
            let path = normalize(path);
            if let Some(i) = path
                .to_str()
                .and_then(|ps| sorted.binary_search_by(|e| e.0.as_str().cmp(ps)).ok())
            {
                covered[i] = false;
            }
        }
        let mut global = Vec::new();
        for (i, (path, fp)) in sorted.iter().map(|e| (&e.0, &e.1)).enumerate() {
            if covered[i] {
                continue;
            }
            if fp.0 != 2 && is_racy(fp, self.racy_after) {
                return vec![None; names.len()];
            }
            hash_entry(&mut global, path, fp);
        }
        let global = blake3::hash(&global);
        names
            .iter()
            .map(|name| {
                let mut h = blake3::Hasher::new();
                h.update(global.as_bytes());
                let mut todo = vec![name.as_str()];
                let mut seen = std::collections::BTreeSet::new();
                while let Some(n) = todo.pop() {
                    if !seen.insert(n) {
                        continue;
                    }
                    h.update(&[0x01]);
                    h.update(n.as_bytes());
                    let Some(b) = r.get(n) else {
                        h.update(&[0x00]);
                        continue;
                    };
                    h.update(&serde_json::to_vec(b).ok()?);
                    let keys = b.candies.iter().chain(&b.provided).chain(&b.authored);
                    for k in keys {
                        h.update(&[0x02]);
                        h.update(k.as_bytes());
                        match candies.get(k.as_str()) {
                            Some(Some(d)) => h.update(d.as_bytes()),
                            Some(None) => return None,
                            None => h.update(&[0x00]),
                        };
                    }
                    todo.extend(b.base_chain.iter().map(String::as_str));
                    todo.extend(b.builder_map.values().map(String::as_str));
                    todo.extend(b.builders.iter().filter_map(|u| u.image.as_deref()));
                }
                Some(*h.finalize().as_bytes())
            })
            .collect()
    }
}

/// A path and its fingerprint, delimited, onto what is digested. A
/// directory counts by its path only: what it holds is listed entry by
/// entry (its mtime also moves when an output directory or the store,
/// which the walk skips, is created in it).
fn hash_entry(h: &mut Vec<u8>, path: &str, fp: &Fp) {
    let Fp(kind, size, mtime, ctime, ino, mode) = *fp;
    h.extend_from_slice(&(path.len() as u64).to_le_bytes());
    h.extend_from_slice(path.as_bytes());
    h.push(kind);
    if kind != 2 {
        for v in [size, mtime as u64, ctime as u64, ino, u64::from(mode)] {
            h.extend_from_slice(&v.to_le_bytes());
        }
    }
}

/// `p` made absolute and lexically normalized (`.` and `..` resolved
/// without touching the disk), so paths compare by prefix.
pub fn normalize(p: &Path) -> PathBuf {
    if is_normal(p) {
        return p.to_path_buf();
    }
    let abs = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let mut out = PathBuf::new();
    for c in abs.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Whether `p` is absolute and already what [`normalize`] makes of it: no
/// empty, `.` or `..` component and no trailing `/` (most paths: checked
/// by bytes, without splitting it into components).
fn is_normal(p: &Path) -> bool {
    let b = p.as_os_str().as_encoded_bytes();
    b == b"/"
        || (b.first() == Some(&b'/')
            && b[1..]
                .split(|&c| c == b'/')
                .all(|c| !c.is_empty() && c != b"." && c != b".."))
}

/// What a full run over a project may read, for [`Journal::begin`].
#[derive(Clone, Debug, Default)]
pub struct Scope {
    /// Directories walked: the project root and every `--import` directory.
    pub roots: Vec<PathBuf>,
    /// Single files: `charly.yml` in every directory above the root (the
    /// loader looks for an enclosing checkout there).
    pub files: Vec<PathBuf>,
    /// Not walked: the root's `.build/` (outputs) and the store, when it
    /// lives inside the project.
    pub skip: Vec<PathBuf>,
}

impl Scope {
    /// The scope of a project at `root` with `imports`, using the store at
    /// `store_dir`.
    pub fn project(root: &Path, imports: &[PathBuf], store_dir: &Path) -> Scope {
        let root = normalize(root);
        let mut roots = vec![root.clone()];
        for d in imports {
            let d = normalize(d);
            if !roots.iter().any(|r| d.starts_with(r)) {
                roots.push(d);
            }
        }
        let files = root
            .ancestors()
            .skip(1)
            .map(|d| d.join("charly.yml"))
            .collect();
        Scope {
            roots,
            files,
            skip: vec![root.join(".build"), normalize(store_dir)],
        }
    }
}

impl Scope {
    /// Whether `path` lies inside a walked root (and not in a skipped part).
    pub fn covers(&self, path: &Path) -> bool {
        let path = normalize(path);
        self.roots.iter().any(|r| path.starts_with(r))
            && !self.skip.iter().any(|s| path.starts_with(s))
            && !path.components().any(|c| c.as_os_str() == ".git")
    }

    /// Whether everything the loaded project was read from lies inside
    /// the walked roots ([`Recorder::covers_project`]).
    pub fn covers_project(&self, p: &charly_rules::load::Project) -> bool {
        project_paths(p).all(|d| self.covers(d))
    }
}

/// Every path the loaded project was read from: namespaces, candy
/// directories, offline repos and every source file but the embedded ones.
fn project_paths(p: &charly_rules::load::Project) -> impl Iterator<Item = &Path> {
    let sources = (0..p.sources.len()).filter_map(|i| {
        u32::try_from(i)
            .ok()
            .and_then(|i| p.sources.path(charly_rules::source::FileId(i)))
    });
    p.namespaces
        .iter()
        .map(|n| n.dir.as_path())
        .chain(p.candies.values().map(|c| c.dir.as_path()))
        .chain(p.repos.values().map(PathBuf::as_path))
        .chain(sources.filter(|f| !f.starts_with("<embedded>")))
}

impl Recorder {
    /// Whether everything the loaded project was read from (namespaces,
    /// candy directories, every source file but the embedded ones, offline
    /// repos) lies inside the walked roots.
    pub fn covers_project(&self, p: &charly_rules::load::Project) -> bool {
        project_paths(p).all(|d| self.covers(d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Journal {
        /// [`Journal::check_or_seed`] with the memo built.
        fn check_or_memo(&self) -> Result<Outcome, (Miss, Option<Box<Memo>>)> {
            self.check_or_seed()
                .map_err(|(m, seed)| (m, seed.map(|s| Box::new(s.build()))))
        }
    }

    #[test]
    fn normal_paths_are_taken_as_they_are_and_others_normalized() {
        let slow = |p: &str| {
            let mut out = PathBuf::new();
            for c in std::path::absolute(p).expect("abs").components() {
                match c {
                    std::path::Component::ParentDir => {
                        out.pop();
                    }
                    std::path::Component::CurDir => {}
                    other => out.push(other),
                }
            }
            out
        };
        for p in [
            "/",
            "/a",
            "/a/b",
            "/a/b/",
            "/a//b",
            "/a/./b",
            "/a/../b",
            "/a/b/..",
            "/a/.",
            "/.a/..b",
            "//a",
            "a/b",
            ".",
            "/a/.git/b",
        ] {
            assert_eq!(normalize(Path::new(p)), slow(p), "{p}");
        }
        assert!(is_normal(Path::new("/a/.b/c..")));
        assert!(!is_normal(Path::new("/a/b/")));
        let rec = Recorder {
            roots: vec![PathBuf::from("/p")],
            skip: vec![PathBuf::from("/p/.build")],
            epoch: String::new(),
            inputs: Vec::new(),
            usable: true,
            walked: true,
            racy_after: 0,
        };
        for (p, want) in [
            ("/p", true),
            ("/p/a/b", true),
            ("/pa/b", false),
            ("/p/.build", false),
            ("/p/.builder/x", true),
            ("/p/.build/x", false),
            ("/p/x/.git/y", false),
            ("/p/x/.gitignore", true),
            ("/p/a/../../q", false),
            ("/p/a/../b", true),
        ] {
            assert_eq!(rec.covers(Path::new(p)), want, "{p}");
        }
    }

    fn outcome() -> Outcome {
        Outcome {
            nodes: vec![(
                "source:a".into(),
                crate::key::NodeKind::Source,
                charly_cache::NodeKey::from_bytes([0xab; 32]),
            )],
            stdout: vec!["out/x".into()],
            warnings: vec!["warning: box `b` does not resolve".into()],
            ..Outcome::default()
        }
    }

    struct Fix {
        t: tempfile::TempDir,
        proj: PathBuf,
        out: PathBuf,
        store: PathBuf,
    }

    impl Fix {
        fn new() -> Fix {
            let t = tempfile::tempdir().expect("tmp");
            let proj = t.path().join("p");
            std::fs::create_dir_all(proj.join("candy/a")).expect("mkdir");
            std::fs::write(proj.join("charly.yml"), "version: 1\n").expect("write");
            std::fs::write(proj.join("candy/a/charly.yml"), "candy: a\n").expect("write");
            let out = proj.join(".build/x");
            std::fs::create_dir_all(&out).expect("mkdir");
            std::fs::write(out.join("Containerfile"), "FROM a\n").expect("write");
            let store = t.path().join("store");
            Fix {
                proj,
                out,
                store,
                t,
            }
        }

        /// A journal trusting any timestamp (the racy window is tested
        /// separately), recorded over the fixture.
        fn recorded(&self) -> Journal {
            self.recorded_with(std::slice::from_ref(&self.out))
        }

        /// A journal whose entry records the fixture's inputs and `outs`.
        fn recorded_with(&self, outs: &[PathBuf]) -> Journal {
            let mut j = Journal::new(&self.store, "generate");
            j.racy_ns = 0;
            let scope = Scope::project(&self.proj, &[], &self.store);
            let rec = j.begin(&scope.roots, &scope.files, &scope.skip);
            assert!(rec.usable());
            assert!(j.record(rec, outs, &[], outcome()).expect("record"));
            j
        }
    }

    #[test]
    fn an_unchanged_project_replays_the_outcome() {
        let f = Fix::new();
        let j = f.recorded();
        let o = j.check().expect("replay");
        assert_eq!(o.nodes, outcome().nodes);
        assert_eq!(o.stdout, outcome().stdout);
        // Another command has its own entry.
        assert_eq!(
            Journal::new(&f.store, "generate a").check().unwrap_err(),
            Miss::NoEntry
        );
    }

    #[test]
    fn the_latest_changed_inputs_come_first() {
        let e = |p: &str, m: i64, c: i64| (p.to_string(), Fp(1, 1, m, c, 1, 0o644));
        let inputs = vec![
            e("a", 5, 5),
            e("b", 1, 9),
            e("c", 7, 2),
            e("d", 3, 3),
            e("e", 8, 1),
        ];
        fn names(v: Vec<&(String, Fp)>) -> Vec<&str> {
            v.into_iter().map(|(p, _)| p.as_str()).collect()
        }
        assert_eq!(names(recently_changed(&inputs, 3)), ["b", "e", "c"]);
        assert_eq!(
            names(recently_changed(&inputs, 9)),
            ["b", "e", "c", "a", "d"]
        );
        assert!(recently_changed(&[], 3).is_empty());
    }

    #[test]
    fn any_input_change_misses_and_names_the_path() {
        let f = Fix::new();
        let file = f.proj.join("candy/a/charly.yml");
        // Same size, different bytes.
        let j = f.recorded();
        std::fs::write(&file, "candy: b\n").expect("write");
        assert_eq!(
            j.check().unwrap_err(),
            Miss::Input(file.display().to_string())
        );
        // A new file: its directory changed.
        let j = f.recorded();
        std::fs::write(f.proj.join("candy/a/extra.sh"), "echo\n").expect("write");
        assert_eq!(
            j.check().unwrap_err(),
            Miss::Input(f.proj.join("candy/a").display().to_string())
        );
        // A removed directory.
        let j = f.recorded();
        std::fs::remove_dir_all(f.proj.join("candy/a")).expect("rm");
        assert!(matches!(j.check().unwrap_err(), Miss::Input(_)));
        // A charly.yml appearing above the project (an enclosing checkout).
        let j = f.recorded();
        std::fs::write(f.t.path().join("charly.yml"), "repo: x\n").expect("write");
        assert_eq!(
            j.check().unwrap_err(),
            Miss::Input(f.t.path().join("charly.yml").display().to_string())
        );
    }

    #[test]
    fn build_dirs_and_git_are_not_inputs() {
        let f = Fix::new();
        std::fs::create_dir_all(f.proj.join(".git")).expect("mkdir");
        let j = f.recorded();
        std::fs::write(f.proj.join(".git/index"), "x").expect("write");
        std::fs::write(f.proj.join(".build/other"), "x").expect("write");
        j.check().expect("still a replay");
    }

    #[test]
    fn output_changes_miss() {
        let f = Fix::new();
        let j = f.recorded();
        std::fs::write(f.out.join("Containerfile"), "FROM b\n").expect("write");
        assert!(matches!(j.check().unwrap_err(), Miss::Output(_)));
        let j = f.recorded();
        std::fs::write(f.out.join("stray"), "x").expect("write");
        assert!(matches!(j.check().unwrap_err(), Miss::Output(_)));
        let j = f.recorded();
        std::fs::remove_dir_all(&f.out).expect("rm");
        assert!(matches!(j.check().unwrap_err(), Miss::Output(_)));
    }

    #[test]
    fn a_store_deletion_misses() {
        let f = Fix::new();
        let store = charly_cache::Store::open(&f.store).expect("store");
        let j = f.recorded();
        j.check().expect("replay");
        store.gc(u64::MAX).expect("gc");
        assert_eq!(j.check().unwrap_err(), Miss::StoreEpoch);
    }

    #[test]
    fn uncovered_or_racy_runs_never_replay_but_leave_a_memo() {
        let f = Fix::new();
        // Everything was just written: inside the real racy window.
        let j = Journal::new(&f.store, "generate");
        let scope = Scope::project(&f.proj, &[], &f.store);
        let rec = j.begin(&scope.roots, &scope.files, &scope.skip);
        assert!(!rec.usable(), "files written just now must be racy");
        assert!(!j.record(rec, &[], &[], outcome()).expect("record"));
        assert_eq!(j.check().unwrap_err(), Miss::Unreplayable);
        let (_, memo) = j.check_or_memo().unwrap_err();
        let memo = memo.expect("a memo of the unreplayable run");
        let key = outcome().nodes[0].2;
        assert!(memo.present_keys().contains(&key));
        assert!(memo.key_was(&outcome().nodes[0].0, &key));
        assert!(!memo.key_was("fragment:other", &key));

        let mut j = Journal::new(&f.store, "generate");
        j.racy_ns = 0;
        let mut rec = j.begin(&scope.roots, &scope.files, &scope.skip);
        assert!(rec.covers(&f.proj.join("candy/a/charly.yml")));
        assert!(rec.covers(&f.proj.join("candy/../candy/a")));
        assert!(!rec.covers(&f.proj.join("../elsewhere/candy")));
        assert!(!rec.covers(&f.proj.join(".build/x")));
        rec.spoil();
        assert!(!j.record(rec, &[], &[], outcome()).expect("record"));
        assert_eq!(j.check().unwrap_err(), Miss::Unreplayable);
    }

    #[test]
    fn the_memo_knows_untouched_output_dirs_and_forgets_after_a_deletion() {
        let f = Fix::new();
        let store = charly_cache::Store::open(&f.store).expect("store");
        // A sibling whose name extends the directory's (`x-y` sorts
        // between `x` and `x/Containerfile`).
        let sibling = f.proj.join(".build/x-y");
        std::fs::create_dir_all(&sibling).expect("mkdir");
        std::fs::write(sibling.join("Containerfile"), "FROM c\n").expect("write");
        let j = f.recorded_with(&[f.out.clone(), sibling.clone()]);
        std::fs::write(
            f.proj.join("candy/a/charly.yml"),
            "candy: {name: a, env: {X: 1}}\n",
        )
        .expect("edit");
        let (miss, memo) = j.check_or_memo().unwrap_err();
        assert!(matches!(miss, Miss::Input(_)), "{miss:?}");
        let memo = memo.expect("memo");
        assert!(memo.dir_unchanged(&f.out));
        assert!(!memo.dir_unchanged(&f.proj.join("never-written")));
        // A changed file: the directory is not as left.
        assert!(memo.dir_unchanged(&sibling));
        std::fs::write(f.out.join("Containerfile"), "FROM b\n").expect("edit output");
        assert!(!memo.dir_unchanged(&f.out));
        assert!(memo.dir_unchanged(&sibling));
        // An added file, on a fresh fixture.
        let g = Fix::new();
        let jg = g.recorded();
        std::fs::write(g.proj.join("candy/a/charly.yml"), "candy: b\n").expect("edit");
        let memo_g = jg.check_or_memo().unwrap_err().1.expect("memo");
        assert!(memo_g.dir_unchanged(&g.out));
        std::fs::write(g.out.join("new"), "x").expect("add");
        assert!(!memo_g.dir_unchanged(&g.out));
        // After a deletion from the store nothing is trusted.
        store.gc(u64::MAX).expect("gc");
        assert!(j.check_or_memo().unwrap_err().1.is_none());
    }

    /// Directories checked ahead are answered as they were then (spelled
    /// any way that normalizes the same) until the answers are forgotten;
    /// the others are checked when asked.
    #[test]
    fn directories_checked_ahead_answer_as_they_were() {
        let f = Fix::new();
        let other = f.proj.join(".build/y");
        std::fs::create_dir_all(&other).expect("mkdir");
        std::fs::write(other.join("Containerfile"), "FROM c\n").expect("write");
        let j = f.recorded_with(&[f.out.clone(), other.clone()]);
        std::fs::write(f.proj.join("candy/a/charly.yml"), "candy: b\n").expect("edit");
        let mut memo = j.check_or_memo().unwrap_err().1.expect("memo");
        memo.check_ahead([f.out.clone(), f.proj.join("never-written")]);
        // Changed after the check: the answer is the one taken then.
        std::fs::write(f.out.join("Containerfile"), "FROM b\n").expect("edit output");
        assert!(memo.dir_unchanged(&f.out));
        let spelled = f.proj.join(".build/./y/../x");
        assert_eq!(normalize(&spelled), normalize(&f.out));
        assert!(memo.dir_unchanged(&spelled));
        assert!(!memo.dir_unchanged(&f.proj.join("never-written")));
        // Not checked ahead: checked now, and again when asked again.
        assert!(memo.dir_unchanged(&other));
        std::fs::write(other.join("new"), "x").expect("add");
        assert!(!memo.dir_unchanged(&other));
        // Forgotten: the change is seen.
        memo.forget_ahead();
        assert!(!memo.dir_unchanged(&f.out));
    }

    /// A stat relative to an open directory fingerprints an entry as a
    /// stat of its whole path does: files, directories, links followed,
    /// dangling links and missing entries.
    #[cfg(target_os = "linux")]
    #[test]
    fn relative_stats_fingerprint_as_whole_paths_do() {
        let t = tempfile::tempdir().expect("tmp");
        let d = t.path();
        std::fs::create_dir_all(d.join("sub/deeper")).expect("mkdir");
        std::fs::write(d.join("sub/deeper/f"), "content").expect("write");
        std::os::unix::fs::symlink("sub/deeper/f", d.join("link")).expect("link");
        std::os::unix::fs::symlink("nowhere", d.join("dangling")).expect("link");
        let fd = rustix::fs::open(
            d,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY,
            rustix::fs::Mode::empty(),
        )
        .expect("open");
        for rel in [
            "",
            "sub",
            "sub/deeper",
            "sub/deeper/f",
            "link",
            "dangling",
            "absent",
        ] {
            let whole = Fp::of(&d.join(rel));
            let entry = OutputEntry(path_str(&d.join(rel)).expect("utf-8"), whole, None);
            assert!(entry.unchanged_at(&fd, rel), "{rel}: {whole:?}");
        }
        // And a different entry's fingerprint is not taken for it.
        let other = OutputEntry(String::new(), Fp::of(&d.join("sub")), None);
        assert!(!other.unchanged_at(&fd, "sub/deeper/f"));
    }

    /// Changes deep below a kept output directory are seen, through a
    /// symlinked directory too: a rewrite, a removal, a file that became a
    /// directory.
    #[test]
    fn changes_deep_below_an_output_dir_are_seen() {
        let f = Fix::new();
        let real = f.t.path().join("elsewhere");
        std::fs::create_dir_all(real.join("a/b")).expect("mkdir");
        std::fs::write(real.join("a/b/f"), "one").expect("write");
        std::fs::write(real.join("a/g"), "two").expect("write");
        let linked = f.proj.join(".build/linked");
        std::os::unix::fs::symlink(&real, &linked).expect("link");
        std::fs::write(f.out.join("nested"), "x").expect("write");
        let outs = [f.out.clone(), linked.clone()];
        let j = f.recorded_with(&outs);
        let scope = Scope::project(&f.proj, &[], &f.store);
        // An input edit each time (a longer file): the memo, not a replay.
        let candy = f.proj.join("candy/a/charly.yml");
        let memo = || {
            let text = std::fs::read_to_string(&candy).expect("read");
            std::fs::write(&candy, format!("#\n{text}")).expect("edit");
            j.check_or_memo().unwrap_err().1.expect("memo")
        };
        assert!(memo().dir_unchanged(&linked));
        std::fs::write(real.join("a/b/f"), "three").expect("rewrite");
        assert!(!memo().dir_unchanged(&linked));
        let rec = j.begin(&scope.roots, &scope.files, &scope.skip);
        assert!(j.record(rec, &outs, &[], outcome()).expect("record"));
        assert!(memo().dir_unchanged(&linked));
        std::fs::remove_file(real.join("a/g")).expect("remove");
        std::fs::create_dir(real.join("a/g")).expect("mkdir");
        assert!(!memo().dir_unchanged(&linked));
        assert!(memo().dir_unchanged(&f.out));
        std::fs::remove_file(f.out.join("nested")).expect("remove");
        assert!(!memo().dir_unchanged(&f.out));
    }

    #[test]
    fn a_kept_output_dir_is_recorded_from_the_memo_and_still_checked() {
        let f = Fix::new();
        let j = f.recorded();
        let walked = j.read().expect("entry").outputs;
        std::fs::write(f.proj.join("candy/a/charly.yml"), "candy: b\n").expect("edit");
        let memo = j.check_or_memo().unwrap_err().1.expect("memo");
        assert!(memo.dir_unchanged(&f.out));
        // The next run keeps the directory: its entries come from the memo
        // and equal what a walk records.
        let scope = Scope::project(&f.proj, &[], &f.store);
        let rec = j.begin(&scope.roots, &scope.files, &scope.skip);
        let kept = [normalize(&f.out)];
        assert!(
            j.record_reusing(
                rec,
                std::slice::from_ref(&kept[0]),
                &[],
                outcome(),
                Some((&memo, &kept[..]))
            )
            .expect("record")
        );
        assert_eq!(j.read().expect("entry").outputs, walked);
        j.check().expect("replay");
        // A change to the kept directory after the record is still seen.
        std::fs::write(f.out.join("Containerfile"), "FROM z\n").expect("edit output");
        assert!(matches!(j.check().unwrap_err(), Miss::Output(_)));
    }

    #[test]
    fn recent_outputs_are_verified_by_content_until_they_age() {
        let f = Fix::new();
        let mut j = Journal::new(&f.store, "generate");
        // Inputs trusted; outputs written "just now" relative to a huge window.
        j.racy_ns = 0;
        let rec = j.begin(&[], &[], &[]);
        j.racy_ns = i64::MAX / 2;
        assert!(
            j.record(rec, std::slice::from_ref(&f.out), &[], outcome())
                .expect("record")
        );
        let entry = j.read().expect("entry");
        let cf = entry
            .outputs
            .iter()
            .find(|o| o.0.ends_with("Containerfile"))
            .expect("output");
        assert_eq!(
            cf.2.as_deref(),
            Some(blake3::hash(b"FROM a\n").to_hex().as_str())
        );
        j.check().expect("content matches");
        // Old enough now: the replay drops the digest and rewrites the entry.
        j.racy_ns = 0;
        j.check().expect("replay");
        assert!(
            j.read()
                .expect("entry")
                .outputs
                .iter()
                .all(|o| o.2.is_none())
        );
    }

    #[test]
    fn a_kept_output_dir_verified_by_content_is_trusted_by_stat_once_old() {
        let f = Fix::new();
        let mut j = Journal::new(&f.store, "generate");
        j.racy_ns = 0;
        let scope = Scope::project(&f.proj, &[], &f.store);
        let rec = j.begin(&scope.roots, &scope.files, &scope.skip);
        // The outputs were "just written": recorded with their digests.
        j.racy_ns = i64::MAX / 2;
        assert!(
            j.record(rec, std::slice::from_ref(&f.out), &[], outcome())
                .expect("record")
        );
        let with_digest = |j: &Journal| {
            j.read()
                .expect("entry")
                .outputs
                .iter()
                .filter(|o| o.2.is_some())
                .count()
        };
        assert!(with_digest(&j) > 0);
        // An edit loop: every run misses and keeps the build directory.
        let kept = [normalize(&f.out)];
        let edit_and_keep = |j: &Journal, text: &str| {
            std::fs::write(f.proj.join("candy/a/charly.yml"), text).expect("edit");
            let memo = j.check_or_memo().unwrap_err().1.expect("memo");
            assert!(memo.dir_unchanged(&f.out));
            let rec = j.begin(&scope.roots, &scope.files, &scope.skip);
            j.record_reusing(rec, &kept, &[], outcome(), Some((&memo, &kept[..])))
                .expect("record");
        };
        // Still inside the window: the digests stay.
        edit_and_keep(&j, "candy: b\n");
        assert!(with_digest(&j) > 0);
        // Old enough: kept entries lose them, so the next runs only stat.
        j.racy_ns = 0;
        edit_and_keep(&j, "candy: c\n");
        assert_eq!(with_digest(&j), 0);
        // And a change is still seen.
        std::fs::write(f.out.join("Containerfile"), "FROM y\n").expect("edit output");
        let memo = j.check_or_memo().unwrap_err().1.expect("memo");
        assert!(!memo.dir_unchanged(&f.out));
    }
}
