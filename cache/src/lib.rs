//! charly-cache: the local content-addressed store (`docs/architecture.md`,
//! "The store and the remotes").
//!
//! Modules: `store` the [`Store`] and its SQLite index, `blob` and `frames`
//! blob I/O and its zstd frames, `digest` the [`BlobDigest`] and
//! [`NodeKey`] newtypes, `record` what a node produced, `gc` eviction to a
//! budget, `verify` checking and repairing a store, `lock` cross-process
//! locks, `epoch` the deletion epoch, `error` its errors, [`remote`] the OCI
//! registry as a shared cache and `remote_cache` the seam both remotes
//! implement.
//!
//! The engine memoizes build-graph nodes here and keeps their artifacts (tars
//! of builder outputs, rendered Containerfiles, OCI layers). Two halves:
//!
//! * **Blobs** live in `blobs/<2 hex>/<64 hex>`, addressed by blake3 of the
//!   *uncompressed* content ([`BlobDigest`]) and stored as a sequence of
//!   independent zstd frames of 512 KiB of content each, every frame
//!   compressed single-threaded at a fixed level: the same content always
//!   gives the same bytes, yet frames are (de)compressed on all cores. A blob
//!   is compressed into a temp file, fsynced, renamed into place and its
//!   directory fsynced (except what charly derives in process and redoes in
//!   milliseconds: [`Store::put_derived_blob`], verified on read like every
//!   blob); an existing blob is never overwritten, so concurrent
//!   writers of the same content are harmless. Reads decompress and hash in
//!   one streaming pass and never hand out bytes that fail verification: a
//!   bad blob is moved to `quarantine/` and the read is a miss.
//! * **The action cache** is an SQLite index (`index.db`, WAL mode) mapping a
//!   [`NodeKey`] to a [`Record`] that names the node's output blobs. It also
//!   indexes blobs (sizes, last access) and GC roots. A record is only
//!   inserted after every blob it names is in place (and, but for derived
//!   blobs, durable), checked inside the inserting transaction; a record whose
//!   blobs have since vanished or fail verification is a miss.
//!
//! Many threads share one [`Store`] (`&Store` is all they need) and many
//! processes share one directory: SQLite serializes writers (with a generous
//! busy timeout), blob files appear atomically by rename, and
//! [`Store::lock_key`] keeps two processes from building the same node at once.
//! A process killed at any point leaves at worst temp files in its session
//! directory under `tmp/`, which [`Store::verify`] and [`Store::gc`] recognise
//! as stale because the session's lock died with the process.
//!
//! Last-access times drive LRU garbage collection. They are updated in memory
//! on reads and written back in batches, so a no-op build that looks up
//! thousands of records does a handful of write transactions, not thousands.
//!
//! Layout of a store directory:
//!
//! ```text
//! index.db (+ -wal, -shm)   SQLite: records, record_blobs, blobs, roots
//! blobs/ab/ab12…            zstd-compressed blobs
//! tmp/<session>.lock        held by a live Store for its lifetime
//! tmp/<session>/            that Store's temp files
//! locks/<key hex>.lock      per-node build locks (Store::lock_key)
//! quarantine/               blobs that failed verification, kept for inspection
//! init.lock                 serializes index creation and migration
//! epoch                     replaced before anything is deleted (see read_epoch)
//! ```
//!
//! Anything else in the directory (the engine keeps scratch space there) is
//! left alone by `gc` and `verify`.
//!
//! The engine's protocol for one node:
//!
//! ```
//! # fn main() -> Result<(), charly_cache::CacheError> {
//! use std::collections::BTreeMap;
//! use charly_cache::{NodeKey, Output, Record, Store};
//!
//! # let tmp = tempfile::tempdir().expect("tempdir");
//! let store = Store::open(tmp.path())?;
//! let key = NodeKey::from_bytes(*blake3::hash(b"canonical key inputs").as_bytes());
//! let record = match store.get_record(&key)? {
//!     Some(hit) => hit,
//!     None => {
//!         // Another process may be building it: wait for it, then look again.
//!         let _lock = store.lock_key(&key)?;
//!         match store.get_record(&key)? {
//!             Some(hit) => hit,
//!             None => {
//!                 let text = b"FROM fedora:42\nRUN dnf install -y ripgrep\n";
//!                 let digest = store.put_blob(text)?;
//!                 let rec = Record {
//!                     node_id: "containerfile:fedora".into(),
//!                     kind: "fragment".into(),
//!                     outputs: BTreeMap::from([(
//!                         "Containerfile".into(),
//!                         Output { digest, size: text.len() as u64, mode: 0o644 },
//!                     )]),
//!                     duration_ms: 3,
//!                     producer: "generate".into(),
//!                     key_inputs: serde_json::json!({ "template": "v1" }),
//!                     created_unix: 1_700_000_000,
//!                     meta: serde_json::Value::Null,
//!                 };
//!                 store.put_record(&key, &rec)?;
//!                 rec
//!             }
//!         }
//!     }
//! };
//! let text = store.get_blob(&record.outputs["Containerfile"].digest)?;
//! assert!(text.is_some_and(|t| t.starts_with(b"FROM")));
//! # Ok(())
//! # }
//! ```
//!
//! Behind the local store, a shared cache: [`RemoteCache`] is the one seam
//! the engine knows; the OCI-registry backend ([`remote`], `oci://…`)
//! implements it here, the REAPI backend in `charly-reapi`.

mod blob;
mod digest;
mod epoch;
mod error;
mod frames;
mod gc;
mod lock;
mod record;
pub mod remote;
mod remote_cache;
mod store;
mod verify;

pub use blob::BlobBuf;
pub use digest::{BlobDigest, NodeKey, decode_exact_hex, encode_hex};
pub use epoch::read_epoch;
pub use error::CacheError;
pub use gc::{GcReport, PENDING_GRACE_SECS};
pub use lock::{KeyLock, Scratch};
pub use record::{Output, Record};
pub use remote::{
    ImageUpload, PullOutcome, PushReport, Remote, RemoteAuth, RemoteConfig, RemoteStats,
};
pub use remote_cache::{RemoteCache, RemoteReport, human_bytes};
pub use store::{SeenBlobs, Stats, Store, StoreHandles, busy_waits};
pub use verify::VerifyReport;
