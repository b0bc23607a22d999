//! charly's own checks on what a REAPI engine serves (issue 52), against an
//! in-process stand-in engine that lies on purpose: an in-memory CAS and
//! ActionCache that, when told to, serve every blob with one byte altered
//! and its length kept (so only a digest check can tell), or name another
//! blob of the same size under an entry's output path (so the engine's
//! digest checks out and only charly's blake3 address can tell).
//!
//! A real engine (buildbox-casd) notices its own damaged storage and says
//! NOT_FOUND, which proves nothing about charly; these tests pass only
//! because charly refuses, and they name the check that refuses.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bazel_remote_apis::build::bazel::remote::execution::v2 as re;
use bazel_remote_apis::google::bytestream as bs;
use charly_cache::{NodeKey, Output, Record, RemoteCache, Store};
use charly_reapi::cache::GrpcCache;
use charly_reapi::client::Client;
use futures_util::Stream;
use re::action_cache_server::{ActionCache, ActionCacheServer};
use re::capabilities_server::{Capabilities, CapabilitiesServer};
use re::content_addressable_storage_server::{
    ContentAddressableStorage, ContentAddressableStorageServer,
};
use sha2::Digest as _;
use tonic::{Request, Response, Status};

/// What the stand-in holds and how it lies.
#[derive(Default)]
struct State {
    cas: Mutex<HashMap<String, Vec<u8>>>,
    ac: Mutex<HashMap<String, re::ActionResult>>,
    /// Serve every blob with its middle byte flipped.
    flip: AtomicBool,
    /// Entries' `blobs/…` outputs name this digest instead.
    swap_to: Mutex<Option<re::Digest>>,
    /// Blob bytes served.
    served: std::sync::atomic::AtomicUsize,
}

impl State {
    fn read(&self, hash: &str) -> Option<Vec<u8>> {
        let mut data = self.cas.lock().expect("lock").get(hash).cloned()?;
        self.served.fetch_add(data.len(), Ordering::SeqCst);
        if self.flip.load(Ordering::SeqCst) && !data.is_empty() {
            let mid = data.len() / 2;
            data[mid] ^= 0x20;
        }
        Some(data)
    }
}

fn sha256(data: &[u8]) -> re::Digest {
    re::Digest {
        hash: sha2::Sha256::digest(data)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect(),
        size_bytes: data.len() as i64,
    }
}

/// The batch limit the stand-in announces and enforces.
const MAX_BATCH: i64 = 128 << 10;

#[derive(Clone)]
struct Engine(Arc<State>);

#[tonic::async_trait]
impl Capabilities for Engine {
    async fn get_capabilities(
        &self,
        _: Request<re::GetCapabilitiesRequest>,
    ) -> Result<Response<re::ServerCapabilities>, Status> {
        Ok(Response::new(re::ServerCapabilities {
            cache_capabilities: Some(re::CacheCapabilities {
                digest_functions: vec![re::digest_function::Value::Sha256 as i32],
                action_cache_update_capabilities: Some(re::ActionCacheUpdateCapabilities {
                    update_enabled: true,
                }),
                // Small batches, so large blobs go through ByteStream.
                max_batch_total_size_bytes: MAX_BATCH,
                ..Default::default()
            }),
            ..Default::default()
        }))
    }
}

#[tonic::async_trait]
impl ActionCache for Engine {
    async fn get_action_result(
        &self,
        r: Request<re::GetActionResultRequest>,
    ) -> Result<Response<re::ActionResult>, Status> {
        let hash = r.into_inner().action_digest.unwrap_or_default().hash;
        let mut ar = self
            .0
            .ac
            .lock()
            .expect("lock")
            .get(&hash)
            .cloned()
            .ok_or_else(|| Status::not_found("no entry"))?;
        if let Some(to) = self.0.swap_to.lock().expect("lock").clone() {
            for f in &mut ar.output_files {
                if f.path.starts_with("blobs/") {
                    f.digest = Some(to.clone());
                }
            }
        }
        Ok(Response::new(ar))
    }

    async fn update_action_result(
        &self,
        r: Request<re::UpdateActionResultRequest>,
    ) -> Result<Response<re::ActionResult>, Status> {
        let r = r.into_inner();
        let ar = r.action_result.unwrap_or_default();
        self.0
            .ac
            .lock()
            .expect("lock")
            .insert(r.action_digest.unwrap_or_default().hash, ar.clone());
        Ok(Response::new(ar))
    }
}

type Boxed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl ContentAddressableStorage for Engine {
    async fn find_missing_blobs(
        &self,
        r: Request<re::FindMissingBlobsRequest>,
    ) -> Result<Response<re::FindMissingBlobsResponse>, Status> {
        let cas = self.0.cas.lock().expect("lock");
        Ok(Response::new(re::FindMissingBlobsResponse {
            missing_blob_digests: r
                .into_inner()
                .blob_digests
                .into_iter()
                .filter(|d| !cas.contains_key(&d.hash))
                .collect(),
        }))
    }

    async fn batch_update_blobs(
        &self,
        r: Request<re::BatchUpdateBlobsRequest>,
    ) -> Result<Response<re::BatchUpdateBlobsResponse>, Status> {
        let mut responses = Vec::new();
        for b in r.into_inner().requests {
            let d = b.digest.unwrap_or_default();
            self.0
                .cas
                .lock()
                .expect("lock")
                .insert(d.hash.clone(), b.data);
            responses.push(re::batch_update_blobs_response::Response {
                digest: Some(d),
                status: Some(Default::default()),
            });
        }
        Ok(Response::new(re::BatchUpdateBlobsResponse { responses }))
    }

    async fn batch_read_blobs(
        &self,
        r: Request<re::BatchReadBlobsRequest>,
    ) -> Result<Response<re::BatchReadBlobsResponse>, Status> {
        let digests = r.into_inner().digests;
        // The limit the capabilities announce, enforced as engines do.
        let total: i64 = digests.iter().map(|d| d.size_bytes).sum();
        if total > MAX_BATCH {
            return Err(Status::invalid_argument(format!(
                "batch of {total} bytes exceeds {MAX_BATCH}"
            )));
        }
        let mut responses = Vec::new();
        for d in digests {
            let data = self.0.read(&d.hash);
            responses.push(re::batch_read_blobs_response::Response {
                status: Some(bazel_remote_apis::google::rpc::Status {
                    code: if data.is_some() { 0 } else { 5 },
                    ..Default::default()
                }),
                data: data.unwrap_or_default(),
                digest: Some(d),
                ..Default::default()
            });
        }
        Ok(Response::new(re::BatchReadBlobsResponse { responses }))
    }

    type GetTreeStream = Boxed<re::GetTreeResponse>;
    async fn get_tree(
        &self,
        _: Request<re::GetTreeRequest>,
    ) -> Result<Response<Self::GetTreeStream>, Status> {
        Err(Status::unimplemented("GetTree"))
    }

    async fn split_blob(
        &self,
        _: Request<re::SplitBlobRequest>,
    ) -> Result<Response<re::SplitBlobResponse>, Status> {
        Err(Status::unimplemented("SplitBlob"))
    }

    type GetChunkMappingStream = Boxed<re::GetChunkMappingResponse>;
    async fn get_chunk_mapping(
        &self,
        _: Request<re::GetChunkMappingRequest>,
    ) -> Result<Response<Self::GetChunkMappingStream>, Status> {
        Err(Status::unimplemented("GetChunkMapping"))
    }

    async fn splice_blob(
        &self,
        _: Request<re::SpliceBlobRequest>,
    ) -> Result<Response<re::SpliceBlobResponse>, Status> {
        Err(Status::unimplemented("SpliceBlob"))
    }

    async fn register_chunk_mapping(
        &self,
        _: Request<tonic::Streaming<re::RegisterChunkMappingRequest>>,
    ) -> Result<Response<re::RegisterChunkMappingResponse>, Status> {
        Err(Status::unimplemented("RegisterChunkMapping"))
    }
}

#[tonic::async_trait]
impl bs::byte_stream_server::ByteStream for Engine {
    type ReadStream = Boxed<bs::ReadResponse>;

    async fn read(
        &self,
        r: Request<bs::ReadRequest>,
    ) -> Result<Response<Self::ReadStream>, Status> {
        // `[instance/]blobs/<hash>/<size>`
        let name = r.into_inner().resource_name;
        let parts: Vec<&str> = name.split('/').collect();
        let hash = parts
            .iter()
            .position(|p| *p == "blobs")
            .and_then(|i| parts.get(i + 1))
            .ok_or_else(|| Status::invalid_argument(name.clone()))?;
        let data = self
            .0
            .read(hash)
            .ok_or_else(|| Status::not_found(name.clone()))?;
        let chunks: Vec<Result<bs::ReadResponse, Status>> = data
            .chunks(16 << 10)
            .map(|c| Ok(bs::ReadResponse { data: c.to_vec() }))
            .collect();
        Ok(Response::new(Box::pin(futures_util::stream::iter(chunks))))
    }

    async fn write(
        &self,
        r: Request<tonic::Streaming<bs::WriteRequest>>,
    ) -> Result<Response<bs::WriteResponse>, Status> {
        let mut s = r.into_inner();
        let mut name = String::new();
        let mut data = Vec::new();
        while let Some(m) = s.message().await? {
            if !m.resource_name.is_empty() {
                name = m.resource_name;
            }
            data.extend_from_slice(&m.data);
        }
        let d = sha256(&data);
        if !name.contains(&d.hash) {
            return Err(Status::invalid_argument("digest mismatch"));
        }
        let n = data.len() as i64;
        self.0.cas.lock().expect("lock").insert(d.hash, data);
        Ok(Response::new(bs::WriteResponse { committed_size: n }))
    }

    async fn query_write_status(
        &self,
        _: Request<bs::QueryWriteStatusRequest>,
    ) -> Result<Response<bs::QueryWriteStatusResponse>, Status> {
        Err(Status::unimplemented("QueryWriteStatus"))
    }
}

/// The stand-in, served on a free 127.0.0.1 port until dropped.
struct StandIn {
    state: Arc<State>,
    url: String,
    _rt: tokio::runtime::Runtime,
}

fn start() -> StandIn {
    let state = Arc::new(State::default());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let incoming = {
        let _g = rt.enter();
        tonic::transport::server::TcpIncoming::bind("127.0.0.1:0".parse().expect("addr"))
            .expect("bind")
    };
    let port = incoming.local_addr().expect("addr").port();
    let e = Engine(state.clone());
    rt.spawn(
        tonic::transport::Server::builder()
            .add_service(CapabilitiesServer::new(e.clone()))
            .add_service(ActionCacheServer::new(e.clone()))
            .add_service(
                ContentAddressableStorageServer::new(e.clone()).max_decoding_message_size(64 << 20),
            )
            .add_service(bs::byte_stream_server::ByteStreamServer::new(e))
            .serve_with_incoming(incoming),
    );
    StandIn {
        state,
        url: format!("grpc://127.0.0.1:{port}"),
        _rt: rt,
    }
}

fn bytes(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Small blobs (BatchReadBlobs) and large ones (ByteStream.Read): bytes of
/// the right length with one altered are refused by the client's digest
/// check, which names the blob and the engine.
#[test]
fn altered_bytes_of_the_right_length_are_refused_by_the_clients_digest_check() {
    let e = start();
    let c = Client::connect(&e.url).expect("connects");
    for (what, len) in [("batch", 1000usize), ("bytestream", 300 << 10)] {
        let data = bytes(len as u8, len);
        let d = c.digest_fn().digest(&data);
        c.upload(vec![(d.clone(), data.clone())]).expect("upload");
        e.state.flip.store(false, Ordering::SeqCst);
        let got = c.download(std::slice::from_ref(&d)).expect("intact");
        assert_eq!(
            got[&d.hash], data,
            "{what}: the stand-in serves what it got"
        );
        e.state.flip.store(true, Ordering::SeqCst);
        let err = c
            .download(std::slice::from_ref(&d))
            .expect_err("altered bytes are refused");
        assert!(
            err.message.contains("does not match its digest")
                && err.message.contains(&d.hash)
                && err.message.contains(&format!("got {len} bytes")),
            "{what}: {}",
            err.message
        );
    }
}

fn key(label: &str) -> NodeKey {
    NodeKey::from_bytes(*blake3::hash(label.as_bytes()).as_bytes())
}

/// A store with one record naming one blob.
fn store_with(dir: &std::path::Path, k: &NodeKey, blob: &[u8]) -> Store {
    let s = Store::open(dir).expect("store");
    put_record(&s, k, blob, "builder-stage:x/npm@node-builder");
    s
}

/// Puts `blob` and a record naming it (`node_id`) under `k`.
fn put_record(s: &Store, k: &NodeKey, blob: &[u8], node_id: &str) -> Record {
    let digest = s.put_blob(blob).expect("blob");
    let rec = Record {
        node_id: node_id.into(),
        kind: "builder-stage".into(),
        outputs: [(
            "artifact.tar".to_string(),
            Output {
                digest,
                size: blob.len() as u64,
                mode: 0o644,
            },
        )]
        .into(),
        duration_ms: 1,
        producer: "test".into(),
        key_inputs: serde_json::json!({}),
        created_unix: 0,
        meta: serde_json::json!({}),
    };
    assert!(s.put_record(k, &rec).expect("record"));
    rec
}

/// The gRPC remote cache, pushing from `a` (an honest engine), then pulling
/// into a fresh store once the engine lies: a miss, counted corrupt, with
/// the check that refused in the report, and nothing stored.
fn pull_from_a_lying_engine(lie: impl FnOnce(&StandIn, &[u8])) -> (Store, String, usize) {
    let e = start();
    let tmp = tempfile::tempdir().expect("tmp");
    let k = key("lied-about");
    let blob = bytes(7, 5000);
    let a = store_with(&tmp.path().join("a"), &k, &blob);
    let push = GrpcCache::open(&e.url, false, false).expect("open");
    push.push(&a, &k);
    let r = push.finish();
    assert_eq!(r.stats.pushed, 1, "{r:?}");
    lie(&e, &blob);
    let b = Store::open(&tmp.path().join("b")).expect("store");
    let pull = GrpcCache::open(&e.url, true, false).expect("open");
    let got = pull.fetch(&b, &k).expect("a lie is a miss, not an error");
    assert!(got.is_none(), "a record from a lying engine was used");
    assert_eq!(b.get_record(&k).expect("local"), None, "recorded locally");
    assert!(
        !b.has_blob(&charly_cache::BlobDigest::of(&blob)),
        "the blob was stored"
    );
    let s = pull.stats();
    let text = s.errors.join("\n");
    (b, text, s.corrupt as usize)
}

#[test]
fn the_grpc_cache_refuses_altered_blobs_by_the_engines_digest() {
    let (_b, text, corrupt) = pull_from_a_lying_engine(|e, _| {
        e.state.flip.store(true, Ordering::SeqCst);
    });
    assert_eq!(corrupt, 1, "{text}");
    assert!(
        text.contains("refused, nothing used") && text.contains("does not match its digest"),
        "{text}"
    );
    assert!(
        text.contains(&key("lied-about").short(16)),
        "the node's key: {text}"
    );
}

/// The engine's digest of what it serves checks out (it is another blob of
/// the same size, honestly stored), but it is not the blob the record names:
/// only charly's blake3 address tells them apart.
#[test]
fn the_grpc_cache_refuses_a_blob_whose_engine_digest_matches_but_blake3_does_not() {
    let (_b, text, corrupt) = pull_from_a_lying_engine(|e, blob| {
        let other = bytes(99, blob.len());
        let d = sha256(&other);
        e.state
            .cas
            .lock()
            .expect("lock")
            .insert(d.hash.clone(), other);
        *e.state.swap_to.lock().expect("lock") = Some(d);
    });
    assert_eq!(corrupt, 1, "{text}");
    assert!(
        text.contains("refused, nothing used") && text.contains("(blake3), not"),
        "{text}"
    );
}

/// An honest engine: two keys, two records, each pulled as it was pushed
/// (an entry per key: the action names the key), with the counts a report
/// shows; a key nobody pushed is a miss; an entry whose blob the CAS lost
/// is refused as corrupt; once the engine is gone, lookups are skipped
/// and counted, not attempted again.
#[test]
fn the_grpc_cache_pulls_what_was_pushed_per_key_and_counts_it() {
    let e = start();
    let tmp = tempfile::tempdir().expect("tmp");
    let a = Store::open(&tmp.path().join("a")).expect("store");
    let (k1, k2) = (key("one"), key("two"));
    let (b1, b2) = (bytes(1, 3000), bytes(2, 4000));
    let r1 = put_record(&a, &k1, &b1, "local-pkg:one/deb@base");
    let r2 = put_record(&a, &k2, &b2, "local-pkg:two/deb@base");
    let push = GrpcCache::open(&e.url, false, false).expect("open");
    push.push(&a, &k1);
    push.push(&a, &k2);
    let r = push.finish();
    assert_eq!((r.stats.pushed, r.stats.already_present), (2, 0), "{r:?}");

    let b = Store::open(&tmp.path().join("b")).expect("store");
    let pull = GrpcCache::open(&e.url, true, false).expect("open");
    assert_eq!(pull.fetch(&b, &k1).expect("pull"), Some(r1.clone()));
    assert_eq!(pull.fetch(&b, &k2).expect("pull"), Some(r2));
    assert_eq!(
        b.get_blob(&r1.outputs["artifact.tar"].digest)
            .expect("read")
            .expect("stored")
            .into_vec(),
        b1
    );
    assert_eq!(pull.fetch(&b, &key("nobody")).expect("miss"), None);
    let s = pull.stats();
    assert_eq!((s.hits, s.misses, s.corrupt), (2, 1, 0), "{s:?}");
    let records: u64 = [&k1, &k2]
        .iter()
        .map(|k| {
            serde_json::to_vec(&b.get_record(k).expect("read").expect("stored"))
                .expect("json")
                .len() as u64
        })
        .sum();
    assert_eq!(
        s.bytes_down,
        records + (b1.len() + b2.len()) as u64,
        "records and blobs, counted once each"
    );

    // The CAS lost k1's blob: its entry is unusable, counted corrupt.
    let c = Store::open(&tmp.path().join("c")).expect("store");
    let lost = sha256(&b1).hash;
    e.state.cas.lock().expect("lock").remove(&lost);
    let pull = GrpcCache::open(&e.url, true, false).expect("open");
    assert_eq!(pull.fetch(&c, &k1).expect("a miss"), None);
    let s = pull.stats();
    assert_eq!((s.corrupt, s.misses, s.unavailable), (1, 1, false), "{s:?}");

    // The engine goes away: the first lookup fails and switches it off;
    // the next is skipped, not attempted.
    let url = e.url.clone();
    drop(e);
    let gone = GrpcCache::open(&url, true, false);
    if let Ok(gone) = gone {
        assert_eq!(gone.fetch(&c, &k2).expect("a miss"), None);
        assert_eq!(gone.fetch(&c, &k2).expect("a miss"), None);
        let s = gone.stats();
        assert!(s.unavailable, "{s:?}");
        assert!(s.skipped_unavailable >= 1, "{s:?}");
    }
    // Opened while it was up, then gone.
    let e = start();
    let up = GrpcCache::open(&e.url, true, false).expect("open");
    drop(e);
    assert_eq!(up.fetch(&c, &k2).expect("a miss"), None);
    assert_eq!(up.fetch(&c, &k2).expect("a miss"), None);
    let s = up.stats();
    assert!(s.unavailable, "{s:?}");
    assert_eq!(s.skipped_unavailable, 1, "{s:?}");
}

/// Many small blobs: the client splits them into batches the engine
/// accepts (it refuses a batch over the limit it announced), and gets each
/// one once, verified.
#[test]
fn downloads_stay_within_the_engines_batch_limit() {
    let e = start();
    let c = Client::connect(&e.url).expect("connects");
    let blobs: Vec<Vec<u8>> = (0..8u8).map(|i| bytes(i, 30 << 10)).collect();
    let digests: Vec<_> = blobs.iter().map(|b| c.digest_fn().digest(b)).collect();
    c.upload(digests.iter().cloned().zip(blobs.iter().cloned()).collect())
        .expect("upload");
    // Each asked twice: fetched once.
    let mut asked = digests.clone();
    asked.extend(digests.iter().cloned());
    let got = c.download(&asked).expect("batched within the limit");
    assert_eq!(got.len(), blobs.len());
    assert_eq!(
        e.state.served.load(Ordering::SeqCst),
        blobs.iter().map(Vec::len).sum::<usize>(),
        "each blob fetched once"
    );
    for (d, b) in digests.iter().zip(&blobs) {
        assert_eq!(&got[&d.hash], b);
    }
}
