//! The shared remote cache: an OCI Distribution registry (GHCR, GitLab,
//! Harbor, ECR, Zot, Docker Distribution, …) holding action records and
//! blobs, so CI runners building the same boxes share results
//! (docs/architecture.md, "The store and the remotes").
//!
//! **Layering.** The local [`Store`] comes first. [`Remote::get_record`]
//! asks the registry only on a local miss; what it fetches is verified
//! (sha256 as the registry addresses it, blake3 as charly does, sizes, the
//! record's shape), stored locally, and only then returned, so everything
//! downstream reads the local store as before. New local results are handed
//! to [`Remote::push`], which uploads them in the background on a few
//! threads; [`Remote::finish`] waits for the uploads and reports failures.
//!
//! **Failure policy.** The remote is an accelerator. A registry that is
//! down, refuses credentials or serves bad data costs cache hits, never a
//! build: problems are counted and described in [`RemoteStats`], a lookup
//! that failed is a miss, and after a few consecutive connection failures
//! the remote is switched off for the rest of the process instead of
//! timing out on every node. With [`RemoteConfig::required`] lookups fail
//! with an error instead, and the caller should fail the build when
//! [`PushReport::ok`] is false. Corrupt remote data is always just a
//! reported miss (rebuilding fixes it).
//!
//! **Poisoning defence.** [`RemoteConfig::read_only`] never writes (for
//! untrusted jobs such as pull requests). Only complete local records (all
//! outputs present and verified while being read for upload) of clean
//! executions are pushed (see `push`); nothing fetched is used before it
//! verified.
//!
//! **Layout in the registry**: see [`manifest`]. In short, one OCI manifest
//! per node key tagged `k-<key hex>`, the record as its config blob, the
//! output blobs, uncompressed, as its layers.
//!
//! **Sync API over an async client.** The registry client (`oci-client`,
//! on tokio and reqwest) runs on a private runtime inside this module; the
//! API is synchronous and [`Remote`] is `Send + Sync`, so rayon workers call
//! it directly. Do not call it from inside an async runtime.

mod config;
mod error;
pub mod manifest;
mod pull;
mod push;
mod registry;
mod stats;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

pub use config::{
    ENV_PASSWORD, ENV_TOKEN, ENV_USER, RemoteAuth, RemoteConfig, is_loopback_registry,
};
pub use stats::{PushReport, RemoteStats};

use crate::store::lock_ignoring_poison;
use crate::{BlobDigest, CacheError, NodeKey, Record, Store, StoreHandles};
use error::{Kind, RemoteError};
use pull::{Fetched, PullFail};
use push::Pushed;
use registry::Registry;
use stats::Counters;

/// Consecutive "registry unreachable" failures after which the remote is
/// switched off for the rest of the process.
const UNAVAILABLE_LIMIT: u64 = 3;

/// What [`Remote::pull_record`] found.
#[derive(Debug, Clone, PartialEq)]
pub enum PullOutcome {
    /// The local store had the record already; the registry was not asked.
    Local(Record),
    /// Fetched from the registry, verified and stored locally.
    Pulled(Record),
    /// The registry has no record for the key.
    Miss,
    /// The registry's record or one of its blobs failed verification (or is
    /// gone); nothing of it was used. The reason is also in the stats.
    Corrupt(String),
    /// The registry could not be asked (unreachable, credentials refused,
    /// switched off earlier in the run). Also in the stats.
    Failed(String),
}

impl PullOutcome {
    /// The record, if there is one now in the local store.
    pub fn into_record(self) -> Option<Record> {
        match self {
            PullOutcome::Local(r) | PullOutcome::Pulled(r) => Some(r),
            _ => None,
        }
    }
}

/// State shared with the push workers.
struct Inner {
    registry: Registry,
    url: String,
    read_only: bool,
    required: bool,
    counters: Counters,
    /// Switched off after repeated connection failures.
    down: AtomicBool,
    consecutive_unavailable: AtomicU64,
    /// Keys whose records came from the registry (never pushed back).
    from_remote: Mutex<HashSet<NodeKey>>,
    /// sha256 of blobs computed for uploads.
    shas: Mutex<HashMap<BlobDigest, String>>,
    /// Keys whose registry copy failed verification, with the blob whose
    /// bytes did (none: the manifest or record itself): the next push of
    /// such a key replaces them instead of finding them "already there".
    broken: Mutex<HashMap<NodeKey, Option<String>>>,
}

impl Inner {
    fn succeeded(&self) {
        self.consecutive_unavailable.store(0, Ordering::Relaxed);
    }

    /// Records an error; trips the breaker on repeated unreachability.
    fn failed(&self, what: &str, e: &RemoteError) {
        self.counters.report(format!("{what}: {e}"));
        if e.kind == Kind::Unavailable {
            let n = self.consecutive_unavailable.fetch_add(1, Ordering::Relaxed) + 1;
            if n >= UNAVAILABLE_LIMIT && !self.down.swap(true, Ordering::Relaxed) {
                self.counters.report(format!(
                    "remote cache {} switched off for the rest of the run after {n} failed attempts",
                    self.url
                ));
            }
        }
    }

    fn is_down(&self) -> bool {
        self.down.load(Ordering::Relaxed)
    }

    fn push_one(&self, local: &Store, key: &NodeKey) -> Result<Pushed, RemoteError> {
        if self.is_down() {
            Counters::add(&self.counters.skipped_unavailable, 1);
            return Err(RemoteError::new(
                Kind::Unavailable,
                "skipped: the registry became unreachable earlier in the run",
            ));
        }
        let repair = lock_ignoring_poison(&self.broken).remove(key);
        let r = push::push_record(&self.registry, local, key, &self.shas, repair);
        match &r {
            Ok(_) => self.succeeded(),
            Err(e) => self.failed(&format!("pushing {}", key.short(16)), e),
        }
        r
    }
}

/// Push jobs and their bookkeeping.
#[derive(Default)]
struct PushState {
    /// Jobs queued or running.
    pending: usize,
    /// Outcomes since the last [`Remote::finish`].
    report: PushReport,
}

struct Job {
    store: Arc<Store>,
    key: NodeKey,
}

/// The background uploader: a queue and up to `concurrency` threads.
struct Pusher {
    concurrency: usize,
    sender: Mutex<Option<mpsc::Sender<Job>>>,
    receiver: Arc<Mutex<mpsc::Receiver<Job>>>,
    workers: Mutex<Vec<JoinHandle<()>>>,
    state: Arc<(Mutex<PushState>, Condvar)>,
    /// Our own handles on the local stores pushed from (the caller's
    /// `&Store` cannot outlive the call).
    stores: StoreHandles,
    /// Keys queued or pushed already in this process.
    seen: Mutex<HashSet<NodeKey>>,
}

/// A registry-backed remote cache. `Send + Sync`; share `&Remote`.
pub struct Remote {
    inner: Arc<Inner>,
    pusher: Pusher,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("url", &self.inner.url)
            .field("read_only", &self.inner.read_only)
            .field("required", &self.inner.required)
            .finish_non_exhaustive()
    }
}

/// An image to write to a registry with [`Remote::push_image`].
#[derive(Debug, Clone)]
pub struct ImageUpload<'a> {
    /// Its layer blobs: the store's digest, the OCI digest (`sha256:…` of
    /// the same bytes) and the size.
    pub layers: Vec<(BlobDigest, String, u64)>,
    /// The OCI config.
    pub config: &'a [u8],
    /// The OCI image manifest naming them.
    pub manifest: &'a [u8],
}

impl Remote {
    /// Writes an image to the remote's repository as `tag`: each layer
    /// blob the registry lacks (streamed from the store; registries keep
    /// one copy per digest, so layers shared with images already there are
    /// not sent), the config, then the manifest. Returns the bytes sent.
    pub fn push_image(
        &self,
        local: &Store,
        tag: &str,
        image: &ImageUpload<'_>,
    ) -> Result<u64, CacheError> {
        let reg = &self.inner.registry;
        let url = &self.inner.url;
        let err = |e: RemoteError| e.into_cache_error(url);
        let mut sent = 0;
        for (d, sha, size) in &image.layers {
            if !reg.has_blob(sha).map_err(err)? {
                push::upload_stream(reg, local, d, sha, *size, &[]).map_err(err)?;
                sent += size;
            }
        }
        let sum: [u8; 32] = <sha2::Sha256 as sha2::Digest>::digest(image.config).into();
        let config_sha = format!("sha256:{}", crate::digest::encode_hex(&sum));
        if !reg.has_blob(&config_sha).map_err(err)? {
            reg.push_bytes(&config_sha, image.config.to_vec())
                .map_err(err)?;
            sent += image.config.len() as u64;
        }
        reg.put_manifest(tag, image.manifest.to_vec())
            .map_err(err)?;
        Ok(sent + image.manifest.len() as u64)
    }

    /// Sets up the remote described by `cfg`. Does not contact the registry
    /// (see [`Remote::check`]); fails only on a malformed URL or if the I/O
    /// runtime cannot start.
    pub fn open(cfg: RemoteConfig) -> Result<Remote, CacheError> {
        let target = config::Target::parse(&cfg)?;
        let registry =
            Registry::new(target, &cfg.auth).map_err(|e| e.into_cache_error(&cfg.url))?;
        let (tx, rx) = mpsc::channel();
        Ok(Remote {
            inner: Arc::new(Inner {
                registry,
                url: cfg.url.clone(),
                read_only: cfg.read_only,
                required: cfg.required,
                counters: Counters::default(),
                down: AtomicBool::new(false),
                consecutive_unavailable: AtomicU64::new(0),
                from_remote: Mutex::new(HashSet::new()),
                shas: Mutex::new(HashMap::new()),
                broken: Mutex::new(HashMap::new()),
            }),
            pusher: Pusher {
                concurrency: cfg.push_concurrency.max(1),
                sender: Mutex::new(Some(tx)),
                receiver: Arc::new(Mutex::new(rx)),
                workers: Mutex::new(Vec::new()),
                state: Arc::new((Mutex::new(PushState::default()), Condvar::new())),
                stores: StoreHandles::default(),
                seen: Mutex::new(HashSet::new()),
            },
        })
    }

    /// The configured URL.
    pub fn url(&self) -> &str {
        &self.inner.url
    }

    /// Whether the remote never writes.
    pub fn is_read_only(&self) -> bool {
        self.inner.read_only
    }

    /// Whether remote failures should fail the build.
    pub fn is_required(&self) -> bool {
        self.inner.required
    }

    /// Contacts the registry: it must answer and accept the credentials for
    /// reading. Useful up front with `--remote-required`.
    pub fn check(&self) -> Result<(), CacheError> {
        self.inner.registry.ping().map_err(|e| {
            e.context("checking the registry")
                .into_cache_error(&self.inner.url)
        })
    }

    /// How many action records the registry repository holds (its
    /// `k-<key>` tags), for `charly cache stats`.
    pub fn count_records(&self) -> Result<u64, CacheError> {
        let tags = self
            .inner
            .registry
            .list_tags()
            .map_err(|e| e.into_cache_error(&self.inner.url))?;
        Ok(tags.iter().filter(|t| manifest::is_record_tag(t)).count() as u64)
    }

    /// Local first: the local record if there is one, else the registry's,
    /// fetched and verified into `local`. `None` on a miss, and also when the
    /// registry failed or served bad data (reported in [`Remote::stats`]);
    /// with [`RemoteConfig::required`], a registry failure is an error.
    /// Errors of the local store are always errors.
    pub fn get_record(&self, local: &Store, key: &NodeKey) -> Result<Option<Record>, CacheError> {
        Ok(self.pull_record(local, key)?.into_record())
    }

    /// [`Remote::get_record`] with the details (`charly cache pull`).
    pub fn pull_record(&self, local: &Store, key: &NodeKey) -> Result<PullOutcome, CacheError> {
        if let Some(rec) = local.get_record(key)? {
            return Ok(PullOutcome::Local(rec));
        }
        let inner = &self.inner;
        let what = format!("pulling {}", key.short(16));
        if inner.is_down() {
            Counters::add(&inner.counters.skipped_unavailable, 1);
            let e = RemoteError::new(
                Kind::Unavailable,
                "skipped: the registry became unreachable earlier in the run",
            );
            if inner.required {
                return Err(e.context(&what).into_cache_error(&inner.url));
            }
            return Ok(PullOutcome::Failed(e.message));
        }
        match pull::fetch(&inner.registry, &inner.counters, local, key) {
            Ok(Fetched::Stored(rec)) => {
                inner.succeeded();
                Counters::add(&inner.counters.hits, 1);
                lock_ignoring_poison(&inner.from_remote).insert(*key);
                Ok(PullOutcome::Pulled(rec))
            }
            Ok(Fetched::Missing) => {
                inner.succeeded();
                Counters::add(&inner.counters.misses, 1);
                Ok(PullOutcome::Miss)
            }
            Err(PullFail::Local(e)) => Err(e),
            // A blob the manifest names but the registry lacks is a broken
            // remote record, like a corrupt one.
            Err(PullFail::Remote(e)) if matches!(e.kind, Kind::Corrupt | Kind::NotFound) => {
                inner.succeeded();
                lock_ignoring_poison(&inner.broken).insert(*key, e.bad_blob.clone());
                Counters::add(&inner.counters.corrupt, 1);
                Counters::add(&inner.counters.misses, 1);
                inner
                    .counters
                    .report(format!("{what}: refused, nothing used: {e}"));
                Ok(PullOutcome::Corrupt(e.message))
            }
            Err(PullFail::Remote(e)) => {
                inner.failed(&what, &e);
                Counters::add(&inner.counters.misses, 1);
                if inner.required {
                    return Err(e.context(&what).into_cache_error(&inner.url));
                }
                Ok(PullOutcome::Failed(e.message))
            }
        }
    }

    /// Queues an upload of `key`'s record (already committed in `local`)
    /// and its blobs, and returns at once. Nothing happens in read-only
    /// mode, for records that came from the registry, or for a key queued
    /// before. Uploads run on background threads, a few at a time; see
    /// [`Remote::finish`].
    pub fn push(&self, local: &Store, key: &NodeKey) {
        if self.inner.read_only || lock_ignoring_poison(&self.inner.from_remote).contains(key) {
            return;
        }
        if !lock_ignoring_poison(&self.pusher.seen).insert(*key) {
            return;
        }
        let store = match self.pusher.stores.get(local) {
            Ok(s) => s,
            Err(e) => {
                let msg = format!("opening the local store for uploads: {e}");
                self.inner
                    .counters
                    .report(format!("pushing {}: {msg}", key.short(16)));
                Counters::add(&self.inner.counters.push_failures, 1);
                let (m, _) = &*self.pusher.state;
                lock_ignoring_poison(m).report.failures.push((*key, msg));
                return;
            }
        };
        {
            let (m, _) = &*self.pusher.state;
            lock_ignoring_poison(m).pending += 1;
        }
        self.ensure_workers();
        let sent = lock_ignoring_poison(&self.pusher.sender)
            .as_ref()
            .map(|tx| tx.send(Job { store, key: *key }).is_ok())
            .unwrap_or(false);
        if !sent {
            let (m, cv) = &*self.pusher.state;
            let mut st = lock_ignoring_poison(m);
            st.pending -= 1;
            st.report
                .failures
                .push((*key, "the upload queue is closed".into()));
            cv.notify_all();
        }
    }

    /// Waits until every queued upload has finished and returns what they
    /// did since the previous `finish`. Call before the process exits (and
    /// before printing the build summary). With [`RemoteConfig::required`],
    /// a report that is not [`PushReport::ok`] should fail the build.
    pub fn finish(&self) -> PushReport {
        let (m, cv) = &*self.pusher.state;
        let mut st = lock_ignoring_poison(m);
        while st.pending > 0 {
            st = cv
                .wait(st)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        std::mem::take(&mut st.report)
    }

    /// Pushes every record of `local` that `select` accepts (e.g. not
    /// source records, which carry nothing worth sharing) and waits for the
    /// uploads (`charly cache push`). Read-only mode pushes nothing.
    pub fn push_all(
        &self,
        local: &Store,
        select: &dyn Fn(&NodeKey, &Record) -> bool,
    ) -> Result<PushReport, CacheError> {
        let mut report = self.finish();
        let keys: Vec<String> = local.with_conn(|c| {
            let mut st = c.prepare("SELECT key FROM records ORDER BY key")?;
            let rows = st.query_map([], |r| r.get::<_, String>(0))?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })?;
        for hex in keys {
            let key: NodeKey = hex.parse()?;
            let Some(rec) = local.get_record(&key)? else {
                continue;
            };
            if !select(&key, &rec) {
                continue;
            }
            if self.inner.read_only {
                report.skipped += 1;
                continue;
            }
            self.push(local, &key);
        }
        report.merge(self.finish());
        Ok(report)
    }

    /// Figures so far: hits, misses, corrupt, bytes down and up, pushes,
    /// and what went wrong.
    pub fn stats(&self) -> RemoteStats {
        self.inner.counters.snapshot(self.inner.is_down())
    }

    fn ensure_workers(&self) {
        let mut workers = lock_ignoring_poison(&self.pusher.workers);
        let pending = lock_ignoring_poison(&self.pusher.state.0).pending;
        while workers.len() < self.pusher.concurrency && workers.len() < pending {
            let inner = Arc::clone(&self.inner);
            let rx = Arc::clone(&self.pusher.receiver);
            let state = Arc::clone(&self.pusher.state);
            let spawned = std::thread::Builder::new()
                .name("charly-push".into())
                .spawn(move || worker(&inner, &rx, &state));
            match spawned {
                Ok(h) => workers.push(h),
                Err(e) => {
                    self.inner
                        .counters
                        .report(format!("starting an upload thread: {e}"));
                    break;
                }
            }
        }
    }
}

fn worker(inner: &Inner, rx: &Mutex<mpsc::Receiver<Job>>, state: &(Mutex<PushState>, Condvar)) {
    loop {
        let job = lock_ignoring_poison(rx).recv();
        let Ok(job) = job else { return };
        let outcome = inner.push_one(&job.store, &job.key);
        let c = &inner.counters;
        let (m, cv) = state;
        let mut st = lock_ignoring_poison(m);
        match outcome {
            Ok(Pushed::Uploaded(bytes)) => {
                Counters::add(&c.pushed, 1);
                Counters::add(&c.bytes_up, bytes);
                st.report.pushed += 1;
                st.report.bytes_up += bytes;
            }
            Ok(Pushed::AlreadyPresent) => {
                Counters::add(&c.already_present, 1);
                st.report.already_present += 1;
            }
            Ok(Pushed::Refused(why)) => {
                c.report(format!("not pushing {}: {why}", job.key.short(16)));
                st.report.skipped += 1;
            }
            Err(e) => {
                Counters::add(&c.push_failures, 1);
                st.report.failures.push((job.key, e.message));
            }
        }
        st.pending -= 1;
        cv.notify_all();
    }
}

impl Drop for Remote {
    /// Lets queued uploads finish, then stops the upload threads.
    fn drop(&mut self) {
        lock_ignoring_poison(&self.pusher.sender).take();
        let workers = std::mem::take(&mut *lock_ignoring_poison(&self.pusher.workers));
        for w in workers {
            let _ = w.join();
        }
    }
}
