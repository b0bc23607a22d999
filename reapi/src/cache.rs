//! `--remote grpc://HOST:PORT[/INSTANCE]`: a REAPI engine's CAS and
//! ActionCache as charly's shared cache, beside the OCI-registry backend.
//!
//! Every node kind goes through the same [`RemoteCache`] seam as with a
//! registry, keyed by its [`NodeKey`]; nothing is executed. A node's record
//! is stored as the ActionCache entry of a synthetic action that names the
//! key:
//!
//! * Command `charly-record <key hex>` with output path `record.json`, an
//!   empty input root, platform property `charly-cache=record-v1`. Its
//!   digest is the ActionCache key; no engine ever runs it (the Command,
//!   input root and Action are uploaded anyway, so the entry is
//!   self-describing for engines that check).
//! * ActionResult, exit code 0, output files: `record.json` (the record as
//!   charly stores it, JSON) and one `blobs/<blake3 hex>` per output blob,
//!   whose CAS digest is SHA-256 or BLAKE3, whichever the engine agreed to.
//!
//! A fetch reads the entry, downloads the record and the blobs the local
//! store lacks, checks each blob twice (the engine's digest by the client,
//! then charly's own blake3 address on the way into the store) and only
//! then commits the record locally. Anything that does not check out is a
//! miss, counted as corrupt, never stored. Uploads run on background threads
//! (FindMissingBlobs first, then only what the CAS lacks) and the entry is
//! written last, so a reader never sees an entry whose blobs are not there.
//!
//! The whole record goes through memory, blob by blob; that suits records
//! (fragments, Containerfiles, artifact tars, packages). Image archives of
//! several GiB would want streaming, which the OCI backend does.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use bazel_remote_apis::build::bazel::remote::execution::v2 as re;
use charly_cache::{
    CacheError, NodeKey, Record, RemoteCache, RemoteReport, RemoteStats, Store, StoreHandles,
};

use crate::client::{Client, RemoteError, RemoteUrl, digest_str};

/// Name of the record in an entry's output files.
const RECORD_FILE: &str = "record.json";
/// Prefix of blob outputs (`blobs/<blake3 hex>`).
const BLOB_PREFIX: &str = "blobs/";
/// Upload threads.
const PUSH_THREADS: usize = 4;
/// Messages kept for the report.
const MAX_MESSAGES: usize = 50;

/// gRPC status code UNAVAILABLE.
const UNAVAILABLE: i32 = 14;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The ActionCache key of a node's record, and the messages behind it.
fn action_for(client: &Client, key: &NodeKey) -> (re::Digest, Vec<(re::Digest, Vec<u8>)>) {
    let d = client.digest_fn();
    let cmd = re::Command {
        arguments: vec!["charly-record".into(), key.to_hex()],
        output_paths: vec![RECORD_FILE.into()],
        ..Default::default()
    };
    let (cmd_d, cmd_b) = d.message(&cmd);
    let (root_d, root_b) = d.message(&re::Directory::default());
    let action = re::Action {
        command_digest: Some(cmd_d.clone()),
        input_root_digest: Some(root_d.clone()),
        platform: Some(re::Platform {
            properties: vec![re::platform::Property {
                name: "charly-cache".into(),
                value: "record-v1".into(),
            }],
        }),
        ..Default::default()
    };
    let (act_d, act_b) = d.message(&action);
    (
        act_d.clone(),
        vec![(cmd_d, cmd_b), (root_d, root_b), (act_d, act_b)],
    )
}

/// Why an entry could not be used.
enum Fail {
    /// No entry: a plain miss.
    Missing,
    /// The engine served something that does not check out: a miss.
    Corrupt(String),
    /// Talking to the engine failed.
    Remote(RemoteError),
    /// The local store failed.
    Local(CacheError),
}

struct Inner {
    client: Option<Client>,
    url: String,
    read_only: bool,
    required: bool,
    down: AtomicBool,
    stats: Mutex<RemoteStats>,
    from_remote: Mutex<HashSet<NodeKey>>,
}

impl Inner {
    fn note(&self, msg: String) {
        let mut s = lock(&self.stats);
        if s.errors.len() < MAX_MESSAGES {
            s.errors.push(msg);
        }
    }

    fn err(&self, what: &str, e: &str) -> CacheError {
        CacheError::Io {
            action: "using remote cache",
            path: PathBuf::from(&self.url),
            source: std::io::Error::other(format!("{what}: {e}")),
        }
    }

    /// Records a failed call; an unreachable engine switches the remote off.
    fn failed(&self, what: &str, e: &RemoteError) {
        if e.code.is_none() || e.code == Some(UNAVAILABLE) {
            self.down.store(true, Ordering::Relaxed);
            lock(&self.stats).unavailable = true;
        }
        self.note(format!("{what}: {}", e.message));
    }

    fn fetch(&self, client: &Client, local: &Store, key: &NodeKey) -> Result<Record, Fail> {
        let (action, _) = action_for(client, key);
        let ar = client
            .get_action_result(&action)
            .map_err(Fail::Remote)?
            .ok_or(Fail::Missing)?;
        let named: HashMap<&str, &re::Digest> = ar
            .output_files
            .iter()
            .filter_map(|f| f.digest.as_ref().map(|d| (f.path.as_str(), d)))
            .collect();
        let rec_d = named.get(RECORD_FILE).ok_or_else(|| {
            Fail::Corrupt(format!(
                "ActionCache entry {} has no {RECORD_FILE}",
                digest_str(&action)
            ))
        })?;
        let got = client
            .download(&[(*rec_d).clone()])
            .map_err(corrupt_or_remote)?;
        let rec_bytes = got.get(&rec_d.hash).cloned().unwrap_or_default();
        let mut down = rec_bytes.len() as u64;
        let rec: Record = serde_json::from_slice(&rec_bytes)
            .map_err(|e| Fail::Corrupt(format!("the record is not charly's: {e}")))?;
        let mut wanted = Vec::new();
        for (name, o) in &rec.outputs {
            let hex = o.digest.to_hex();
            let d = named
                .get(format!("{BLOB_PREFIX}{hex}").as_str())
                .ok_or_else(|| Fail::Corrupt(format!("output {name}: blob {hex} not listed")))?;
            if u64::try_from(d.size_bytes).ok() != Some(o.size) {
                return Err(Fail::Corrupt(format!(
                    "output {name}: the engine lists {} bytes, the record {}",
                    d.size_bytes, o.size
                )));
            }
            if !local.has_blob(&o.digest) {
                wanted.push(((*d).clone(), o.digest));
            }
        }
        let blobs = client
            .download(&wanted.iter().map(|(d, _)| d.clone()).collect::<Vec<_>>())
            .map_err(corrupt_or_remote)?;
        for (d, ours) in &wanted {
            let bytes = blobs.get(&d.hash).map(Vec::as_slice).unwrap_or_default();
            down += bytes.len() as u64;
            let stored = local.put_blob(bytes).map_err(Fail::Local)?;
            if stored != *ours {
                return Err(Fail::Corrupt(format!(
                    "blob {} from the engine hashes to {stored} (blake3), not {ours}",
                    digest_str(d)
                )));
            }
        }
        local.put_record(key, &rec).map_err(Fail::Local)?;
        lock(&self.stats).bytes_down += down;
        Ok(rec)
    }

    /// Uploads one record (blobs the CAS lacks, then the entry).
    fn push(&self, client: &Client, local: &Store, key: &NodeKey) -> Result<(), RemoteError> {
        let (action, messages) = action_for(client, key);
        if client.get_action_result(&action)?.is_some() {
            lock(&self.stats).already_present += 1;
            return Ok(());
        }
        let local_err = |e: CacheError| RemoteError::new(format!("reading the local store: {e}"));
        let rec = local
            .get_record(key)
            .map_err(local_err)?
            .ok_or_else(|| RemoteError::new("the record is no longer in the local store"))?;
        let d = client.digest_fn();
        let rec_bytes = serde_json::to_vec(&rec).map_err(|e| RemoteError::new(e.to_string()))?;
        let rec_d = d.digest(&rec_bytes);
        let mut files = vec![re::OutputFile {
            path: RECORD_FILE.into(),
            digest: Some(rec_d.clone()),
            ..Default::default()
        }];
        let mut blobs: Vec<(re::Digest, Vec<u8>)> = messages;
        blobs.push((rec_d, rec_bytes));
        for (name, o) in &rec.outputs {
            let bytes = local
                .get_blob(&o.digest)
                .map_err(local_err)?
                .ok_or_else(|| {
                    RemoteError::new(format!("output {name}: blob missing from the local store"))
                })?;
            let bd = d.digest(&bytes);
            files.push(re::OutputFile {
                path: format!("{BLOB_PREFIX}{}", o.digest.to_hex()),
                digest: Some(bd.clone()),
                ..Default::default()
            });
            blobs.push((bd, bytes.into_vec()));
        }
        files.sort_by(|a, b| a.path.cmp(&b.path));
        files.dedup_by(|a, b| a.path == b.path);
        let digests: Vec<re::Digest> = blobs.iter().map(|(d, _)| d.clone()).collect();
        let missing: HashSet<String> = client
            .find_missing(&digests)?
            .into_iter()
            .map(|d| d.hash)
            .collect();
        let upload: Vec<(re::Digest, Vec<u8>)> = blobs
            .into_iter()
            .filter(|(d, _)| missing.contains(&d.hash))
            .collect();
        let up: u64 = upload.iter().map(|(_, b)| b.len() as u64).sum();
        client.upload(upload)?;
        client.update_action_result(
            &action,
            re::ActionResult {
                output_files: files,
                exit_code: 0,
                ..Default::default()
            },
        )?;
        let mut s = lock(&self.stats);
        s.bytes_up += up;
        s.pushed += 1;
        Ok(())
    }
}

/// gRPC status code NOT_FOUND.
const NOT_FOUND: i32 = 5;

fn corrupt_or_remote(e: RemoteError) -> Fail {
    // The client's digest checks fail without a gRPC status; a blob the
    // entry names but the CAS lacks makes the entry as unusable.
    if e.message.contains("does not match its digest") || e.code == Some(NOT_FOUND) {
        Fail::Corrupt(e.message)
    } else {
        Fail::Remote(e)
    }
}

type Job = (Arc<Store>, NodeKey);

/// A REAPI engine as a shared cache (see the module docs).
pub struct GrpcCache {
    inner: Arc<Inner>,
    seen: Mutex<HashSet<NodeKey>>,
    stores: StoreHandles,
    tx: Mutex<Option<Sender<Job>>>,
    rx: Arc<Mutex<Receiver<Job>>>,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

impl GrpcCache {
    /// Connects to `url` (`grpc://HOST:PORT[/INSTANCE]` or `grpcs://…`).
    /// An unreachable engine is an error when `required`; otherwise the
    /// cache is off for the run and says so in its report.
    pub fn open(url: &str, read_only: bool, required: bool) -> Result<GrpcCache, RemoteError> {
        let parsed = RemoteUrl::parse(url)?;
        let (client, down_msg) = match Client::connect(url) {
            Ok(c) => (Some(c), None),
            Err(e) if !required && e.code.is_none_or(|c| c == UNAVAILABLE) => (None, Some(e)),
            Err(e) => return Err(e),
        };
        let mut read_only = read_only;
        let mut stats = RemoteStats::default();
        if let Some(c) = &client
            && !c.capabilities().ac_update
            && !read_only
        {
            read_only = true;
            stats.errors.push(format!(
                "{} does not let clients write its ActionCache: reading only",
                parsed.display()
            ));
        }
        if let Some(e) = &down_msg {
            stats.unavailable = true;
            stats.errors.push(e.message.clone());
        }
        let (tx, rx) = channel();
        Ok(GrpcCache {
            inner: Arc::new(Inner {
                client,
                url: parsed.display(),
                read_only,
                required,
                down: AtomicBool::new(down_msg.is_some()),
                stats: Mutex::new(stats),
                from_remote: Mutex::new(HashSet::new()),
            }),
            seen: Mutex::new(HashSet::new()),
            stores: StoreHandles::default(),
            tx: Mutex::new(Some(tx)),
            rx: Arc::new(Mutex::new(rx)),
            workers: Mutex::new(Vec::new()),
        })
    }

    /// The figures so far.
    pub fn stats(&self) -> RemoteStats {
        lock(&self.inner.stats).clone()
    }

    fn ensure_workers(&self) {
        let mut workers = lock(&self.workers);
        while workers.len() < PUSH_THREADS {
            let inner = Arc::clone(&self.inner);
            let rx = Arc::clone(&self.rx);
            let spawned = std::thread::Builder::new()
                .name("charly-grpc-push".into())
                .spawn(move || {
                    loop {
                        let job = lock(&rx).recv();
                        let Ok((store, key)) = job else { break };
                        let Some(client) = &inner.client else {
                            continue;
                        };
                        if inner.down.load(Ordering::Relaxed) {
                            lock(&inner.stats).skipped_unavailable += 1;
                            continue;
                        }
                        if let Err(e) = inner.push(client, &store, &key) {
                            lock(&inner.stats).push_failures += 1;
                            inner.failed(&format!("pushing {}", key.short(16)), &e);
                        }
                    }
                });
            match spawned {
                Ok(h) => workers.push(h),
                Err(e) => {
                    self.inner.note(format!("starting an upload thread: {e}"));
                    break;
                }
            }
        }
    }
}

impl RemoteCache for GrpcCache {
    fn url(&self) -> String {
        self.inner.url.clone()
    }

    fn read_only(&self) -> bool {
        self.inner.read_only
    }

    fn required(&self) -> bool {
        self.inner.required
    }

    fn fetch(&self, local: &Store, key: &NodeKey) -> Result<Option<Record>, CacheError> {
        let inner = &self.inner;
        let what = format!("pulling {}", key.short(16));
        let client = match &inner.client {
            Some(c) if !inner.down.load(Ordering::Relaxed) => c,
            _ => {
                lock(&inner.stats).skipped_unavailable += 1;
                if inner.required {
                    return Err(
                        inner.err(&what, "the engine became unreachable earlier in the run")
                    );
                }
                return Ok(None);
            }
        };
        match inner.fetch(client, local, key) {
            Ok(rec) => {
                lock(&inner.stats).hits += 1;
                lock(&inner.from_remote).insert(*key);
                Ok(Some(rec))
            }
            Err(Fail::Missing) => {
                lock(&inner.stats).misses += 1;
                Ok(None)
            }
            Err(Fail::Corrupt(msg)) => {
                {
                    let mut s = lock(&inner.stats);
                    s.corrupt += 1;
                    s.misses += 1;
                }
                inner.note(format!("{what}: refused, nothing used: {msg}"));
                Ok(None)
            }
            Err(Fail::Local(e)) => Err(e),
            Err(Fail::Remote(e)) => {
                inner.failed(&what, &e);
                lock(&inner.stats).misses += 1;
                if inner.required {
                    return Err(inner.err(&what, &e.message));
                }
                Ok(None)
            }
        }
    }

    fn push(&self, local: &Store, key: &NodeKey) {
        let inner = &self.inner;
        if inner.read_only
            || inner.client.is_none()
            || lock(&inner.from_remote).contains(key)
            || !lock(&self.seen).insert(*key)
        {
            return;
        }
        let store = match self.stores.get(local) {
            Ok(s) => s,
            Err(e) => {
                lock(&inner.stats).push_failures += 1;
                inner.note(format!(
                    "pushing {}: opening the local store for uploads: {e}",
                    key.short(16)
                ));
                return;
            }
        };
        self.ensure_workers();
        if let Some(tx) = lock(&self.tx).as_ref() {
            let _ = tx.send((store, *key));
        }
    }

    fn finish(&self) -> RemoteReport {
        // Closing the queue ends the workers once it is drained.
        drop(lock(&self.tx).take());
        for h in lock(&self.workers).drain(..) {
            let _ = h.join();
        }
        // Later pushes (none expected after finish) get a fresh queue.
        let (tx, rx) = channel();
        *lock(&self.tx) = Some(tx);
        *lock(&self.rx) = rx;
        RemoteReport {
            url: self.inner.url.clone(),
            read_only: self.inner.read_only,
            required: self.inner.required,
            stats: self.stats(),
        }
    }
}
