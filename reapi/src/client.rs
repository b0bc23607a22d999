//! The REAPI v2 gRPC client behind a synchronous API.
//!
//! One [`Client`] owns a private multi-thread tokio runtime and one HTTP/2
//! channel; every method blocks on it, so callers on rayon threads (the
//! scheduler) stay synchronous. The channel multiplexes concurrent calls.
//!
//! URLs: `grpc://HOST:PORT[/INSTANCE]` (plain HTTP/2, meant for loopback and
//! private networks) and `grpcs://HOST:PORT[/INSTANCE]` (TLS with the
//! system's root certificates). A bearer token is sent when
//! `CHARLY_REMOTE_TOKEN` (the token) or `CHARLY_REMOTE_TOKEN_FILE` (a file
//! holding it) is set; without either, no authentication is sent.

use std::collections::BTreeMap;
use std::time::Duration;

use bazel_remote_apis::build::bazel::remote::execution::v2 as re;
use bazel_remote_apis::google::bytestream as bs;
use bazel_remote_apis::google::longrunning::{Operation, operation};
use futures_util::StreamExt;
use prost::Message;
use re::action_cache_client::ActionCacheClient;
use re::capabilities_client::CapabilitiesClient;
use re::content_addressable_storage_client::ContentAddressableStorageClient;
use re::execution_client::ExecutionClient;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

type Svc = InterceptedService<Channel, Auth>;

/// An error talking to the engine, with the call it happened in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct RemoteError {
    /// What went wrong, for people (names the call and the engine's words).
    pub message: String,
    /// The gRPC status code when the engine answered (`None`: transport or local).
    pub code: Option<i32>,
}

impl RemoteError {
    /// A local error (no gRPC status).
    pub fn new(m: impl Into<String>) -> Self {
        RemoteError {
            message: m.into(),
            code: None,
        }
    }

    fn status(call: &str, url: &str, s: &tonic::Status) -> Self {
        // A connection that breaks under a call surfaces as UNKNOWN
        // "transport error", or as CANCELLED "operation was canceled" when
        // it closes mid-call (charly never cancels its own calls), not as
        // the engine's answer: the engine is gone, as unreachable as when
        // it refuses connections.
        let broken = match s.code() {
            tonic::Code::Unknown => s.message().starts_with("transport error"),
            tonic::Code::Cancelled => s.message().starts_with("operation was canceled"),
            _ => false,
        };
        let code = if broken {
            tonic::Code::Unavailable
        } else {
            s.code()
        };
        let what = if code == tonic::Code::Unavailable {
            format!(
                "remote execution engine {url} is unreachable ({call}): {}",
                s.message()
            )
        } else {
            format!("{call} on {url} failed: {:?}: {}", s.code(), s.message())
        };
        RemoteError {
            message: what,
            code: Some(code as i32),
        }
    }
}

/// A parsed `grpc://HOST:PORT[/INSTANCE]` or `grpcs://…` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteUrl {
    /// Whether TLS is used (`grpcs://`).
    pub tls: bool,
    /// `host:port`.
    pub authority: String,
    /// The REAPI instance name (may be empty).
    pub instance: String,
}

impl RemoteUrl {
    /// Parses a URL; the message says what form is expected.
    pub fn parse(url: &str) -> Result<Self, RemoteError> {
        let (tls, rest) = if let Some(r) = url.strip_prefix("grpc://") {
            (false, r)
        } else if let Some(r) = url.strip_prefix("grpcs://") {
            (true, r)
        } else {
            return Err(RemoteError::new(format!(
                "remote execution URL `{url}` must start with grpc:// or grpcs:// \
                 (grpc://HOST:PORT[/INSTANCE])"
            )));
        };
        let (authority, instance) = match rest.split_once('/') {
            Some((a, i)) => (a, i.trim_end_matches('/')),
            None => (rest, ""),
        };
        let port_ok = authority
            .rsplit_once(':')
            .map(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok())
            .unwrap_or(false);
        if !port_ok {
            return Err(RemoteError::new(format!(
                "remote execution URL `{url}` needs HOST:PORT (grpc://HOST:PORT[/INSTANCE])"
            )));
        }
        Ok(RemoteUrl {
            tls,
            authority: authority.to_string(),
            instance: instance.to_string(),
        })
    }

    /// The URL as given back to people.
    pub fn display(&self) -> String {
        let scheme = if self.tls { "grpcs" } else { "grpc" };
        if self.instance.is_empty() {
            format!("{scheme}://{}", self.authority)
        } else {
            format!("{scheme}://{}/{}", self.authority, self.instance)
        }
    }
}

/// The digest function used for every blob, agreed with the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DigestFn {
    /// SHA-256, which every engine supports.
    Sha256,
    /// BLAKE3, used when the engine offers it.
    Blake3,
}

impl DigestFn {
    /// The REAPI enum value.
    pub fn proto(self) -> i32 {
        match self {
            DigestFn::Sha256 => re::digest_function::Value::Sha256 as i32,
            DigestFn::Blake3 => re::digest_function::Value::Blake3 as i32,
        }
    }

    /// Digest of bytes.
    pub fn digest(self, data: &[u8]) -> re::Digest {
        let hash = match self {
            DigestFn::Sha256 => {
                use sha2::Digest as _;
                hex(&sha2::Sha256::digest(data))
            }
            DigestFn::Blake3 => blake3::hash(data).to_hex().to_string(),
        };
        re::Digest {
            hash,
            size_bytes: data.len() as i64,
        }
    }

    /// Digest of a protobuf message's encoding (and the encoding).
    pub fn message<M: Message>(self, m: &M) -> (re::Digest, Vec<u8>) {
        let bytes = m.encode_to_vec();
        (self.digest(&bytes), bytes)
    }

    /// The ByteStream resource segment for non-SHA-256 functions.
    fn resource_segment(self) -> &'static str {
        match self {
            DigestFn::Sha256 => "",
            DigestFn::Blake3 => "blake3/",
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `hash/size`, the way digests are named in messages.
pub fn digest_str(d: &re::Digest) -> String {
    format!("{}/{}", d.hash, d.size_bytes)
}

/// Adds the bearer token to every call.
#[derive(Clone)]
pub struct Auth {
    token: Option<MetadataValue<Ascii>>,
}

impl tonic::service::Interceptor for Auth {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(t) = &self.token {
            req.metadata_mut().insert("authorization", t.clone());
        }
        Ok(req)
    }
}

fn token_from_env() -> Result<Option<String>, RemoteError> {
    if let Ok(t) = std::env::var("CHARLY_REMOTE_TOKEN")
        && !t.trim().is_empty()
    {
        return Ok(Some(t.trim().to_string()));
    }
    if let Ok(path) = std::env::var("CHARLY_REMOTE_TOKEN_FILE")
        && !path.is_empty()
    {
        let t = std::fs::read_to_string(&path).map_err(|e| {
            RemoteError::new(format!("reading CHARLY_REMOTE_TOKEN_FILE {path}: {e}"))
        })?;
        return Ok(Some(t.trim().to_string()));
    }
    Ok(None)
}

/// What the engine said it supports, reduced to what charly uses.
#[derive(Debug, Clone)]
pub struct Capabilities {
    /// The digest function picked (BLAKE3 when offered, else SHA-256).
    pub digest: DigestFn,
    /// Whether the engine executes actions.
    pub exec_enabled: bool,
    /// Whether clients may write the ActionCache.
    pub ac_update: bool,
    /// Largest total size of one batch call (0: the engine sets no limit).
    pub max_batch_bytes: i64,
    /// `major.minor` of the highest API version.
    pub high_api: (i32, i32),
}

/// A REAPI v2 client (see the module docs).
pub struct Client {
    rt: tokio::runtime::Runtime,
    url: RemoteUrl,
    cas: ContentAddressableStorageClient<Svc>,
    ac: ActionCacheClient<Svc>,
    exec: ExecutionClient<Svc>,
    bytestream: bs::byte_stream_client::ByteStreamClient<Svc>,
    caps: Capabilities,
    /// Batch calls stay below this many bytes.
    batch_limit: usize,
}

/// Largest message either side may send (batch limits stay well below).
const MAX_MESSAGE: usize = 64 << 20;
/// Batch size used when the engine gives no limit (gRPC's default message size).
const DEFAULT_BATCH: usize = 4 << 20;
/// ByteStream chunk size.
const CHUNK: usize = 1 << 20;

/// What an Execute call returned.
#[derive(Debug, Clone)]
pub struct Executed {
    /// The result (also for a non-zero exit code).
    pub result: re::ActionResult,
    /// Whether the engine answered from its own ActionCache.
    pub cached: bool,
    /// The engine's message, if any.
    pub message: String,
}

impl Client {
    /// Connects and asks for capabilities. Fails when the engine is
    /// unreachable, answers with an error, or cannot do SHA-256/BLAKE3.
    pub fn connect(url: &str) -> Result<Self, RemoteError> {
        let url = RemoteUrl::parse(url)?;
        let token = token_from_env()?
            .map(|t| {
                MetadataValue::try_from(format!("Bearer {t}"))
                    .map_err(|_| RemoteError::new("the remote token is not valid header text"))
            })
            .transpose()?;
        let auth = Auth { token };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("charly-reapi")
            .enable_all()
            .build()
            .map_err(|e| RemoteError::new(format!("starting the remote runtime: {e}")))?;
        let scheme = if url.tls { "https" } else { "http" };
        let mut ep = Endpoint::from_shared(format!("{scheme}://{}", url.authority))
            .map_err(|e| RemoteError::new(format!("remote URL {}: {e}", url.display())))?
            .connect_timeout(Duration::from_secs(10))
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_while_idle(true);
        if url.tls {
            ep = ep
                .tls_config(ClientTlsConfig::new().with_native_roots())
                .map_err(|e| RemoteError::new(format!("TLS for {}: {e}", url.display())))?;
        }
        let display = url.display();
        let channel = rt.block_on(ep.connect()).map_err(|e| {
            RemoteError::new(format!(
                "remote execution engine {display} is unreachable: {}",
                error_chain(&e)
            ))
        })?;
        let svc = || InterceptedService::new(channel.clone(), auth.clone());
        let mut capc = CapabilitiesClient::new(svc());
        let caps = rt
            .block_on(capc.get_capabilities(re::GetCapabilitiesRequest {
                instance_name: url.instance.clone(),
            }))
            .map_err(|s| RemoteError::status("GetCapabilities", &display, &s))?
            .into_inner();
        let caps = pick_capabilities(&caps, &display)?;
        // Leave room for the request's own framing, under the engine's
        // limit or, when it gives none, under gRPC's default message size
        // (buildbox-casd gives none and refuses a batch whose blobs sum
        // past 4 MiB less 64 KiB).
        let batch_limit = if caps.max_batch_bytes > 0 {
            caps.max_batch_bytes as usize
        } else {
            DEFAULT_BATCH
        }
        .saturating_sub(64 << 10)
        .clamp(64 << 10, MAX_MESSAGE / 2);
        Ok(Client {
            cas: ContentAddressableStorageClient::new(svc())
                .max_decoding_message_size(MAX_MESSAGE)
                .max_encoding_message_size(MAX_MESSAGE),
            ac: ActionCacheClient::new(svc()).max_decoding_message_size(MAX_MESSAGE),
            exec: ExecutionClient::new(svc()).max_decoding_message_size(MAX_MESSAGE),
            bytestream: bs::byte_stream_client::ByteStreamClient::new(svc())
                .max_decoding_message_size(MAX_MESSAGE),
            rt,
            url,
            caps,
            batch_limit,
        })
    }

    /// The engine's capabilities as charly uses them.
    pub fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    /// The URL connected to.
    pub fn url(&self) -> &RemoteUrl {
        &self.url
    }

    /// The digest function in use.
    pub fn digest_fn(&self) -> DigestFn {
        self.caps.digest
    }

    fn err(&self, call: &str, s: &tonic::Status) -> RemoteError {
        RemoteError::status(call, &self.url.display(), s)
    }

    /// The digests among `digests` the engine's CAS does not have.
    pub fn find_missing(&self, digests: &[re::Digest]) -> Result<Vec<re::Digest>, RemoteError> {
        let mut missing = Vec::new();
        // Keep requests small: 10k digests is ~1 MiB.
        for chunk in digests.chunks(10_000) {
            let mut cas = self.cas.clone();
            let r = self
                .rt
                .block_on(cas.find_missing_blobs(re::FindMissingBlobsRequest {
                    instance_name: self.url.instance.clone(),
                    blob_digests: chunk.to_vec(),
                    digest_function: self.caps.digest.proto(),
                }))
                .map_err(|s| self.err("FindMissingBlobs", &s))?;
            missing.extend(r.into_inner().missing_blob_digests);
        }
        Ok(missing)
    }

    /// Uploads blobs: small ones in batches, large ones over ByteStream.
    /// Each blob's digest must be the digest of its bytes.
    pub fn upload(&self, blobs: Vec<(re::Digest, Vec<u8>)>) -> Result<(), RemoteError> {
        self.upload_each(blobs.into_iter().map(Ok))
    }

    /// [`Client::upload`] of blobs produced one at a time (read from disk as
    /// they are sent), so memory holds one batch rather than every blob.
    pub fn upload_each(
        &self,
        blobs: impl Iterator<Item = Result<(re::Digest, Vec<u8>), RemoteError>>,
    ) -> Result<(), RemoteError> {
        let mut batch: Vec<re::batch_update_blobs_request::Request> = Vec::new();
        let mut batch_bytes = 0usize;
        for blob in blobs {
            let (d, data) = blob?;
            if data.len() + 200 > self.batch_limit {
                self.bytestream_write(&d, data)?;
                continue;
            }
            if batch_bytes + data.len() + 200 > self.batch_limit {
                self.batch_update(std::mem::take(&mut batch))?;
                batch_bytes = 0;
            }
            batch_bytes += data.len() + 200;
            batch.push(re::batch_update_blobs_request::Request {
                digest: Some(d),
                data,
                compressor: 0,
            });
        }
        if !batch.is_empty() {
            self.batch_update(batch)?;
        }
        Ok(())
    }

    fn batch_update(
        &self,
        requests: Vec<re::batch_update_blobs_request::Request>,
    ) -> Result<(), RemoteError> {
        let mut cas = self.cas.clone();
        let r = self
            .rt
            .block_on(cas.batch_update_blobs(re::BatchUpdateBlobsRequest {
                instance_name: self.url.instance.clone(),
                requests,
                digest_function: self.caps.digest.proto(),
            }))
            .map_err(|s| self.err("BatchUpdateBlobs", &s))?;
        for resp in r.into_inner().responses {
            if let Some(st) = resp.status
                && st.code != 0
            {
                let d = resp.digest.map(|d| digest_str(&d)).unwrap_or_default();
                return Err(RemoteError {
                    message: format!(
                        "BatchUpdateBlobs on {} rejected blob {d}: code {}: {}",
                        self.url.display(),
                        st.code,
                        st.message
                    ),
                    code: Some(st.code),
                });
            }
        }
        Ok(())
    }

    fn bytestream_write(&self, d: &re::Digest, data: Vec<u8>) -> Result<(), RemoteError> {
        let prefix = if self.url.instance.is_empty() {
            String::new()
        } else {
            format!("{}/", self.url.instance)
        };
        let resource = format!(
            "{prefix}uploads/{}/blobs/{}{}/{}",
            upload_id(),
            self.caps.digest.resource_segment(),
            d.hash,
            d.size_bytes
        );
        let total = data.len();
        let mut reqs = Vec::new();
        let mut off = 0usize;
        loop {
            let end = (off + CHUNK).min(total);
            reqs.push(bs::WriteRequest {
                resource_name: if off == 0 {
                    resource.clone()
                } else {
                    String::new()
                },
                write_offset: off as i64,
                finish_write: end == total,
                data: data[off..end].to_vec(),
            });
            off = end;
            if off >= total {
                break;
            }
        }
        let mut client = self.bytestream.clone();
        let r = self
            .rt
            .block_on(client.write(futures_util::stream::iter(reqs)))
            .map_err(|s| self.err("ByteStream.Write", &s))?;
        let committed = r.into_inner().committed_size;
        // An engine that already had the blob may answer early with its size.
        if committed != total as i64 {
            return Err(RemoteError::new(format!(
                "ByteStream.Write of {} on {} committed {committed} of {total} bytes",
                digest_str(d),
                self.url.display()
            )));
        }
        Ok(())
    }

    /// Downloads blobs; each is checked against its digest (size and hash).
    pub fn download(
        &self,
        digests: &[re::Digest],
    ) -> Result<BTreeMap<String, Vec<u8>>, RemoteError> {
        let mut out = BTreeMap::new();
        let mut batch: Vec<re::Digest> = Vec::new();
        let mut batch_bytes = 0usize;
        for d in digests {
            if out.contains_key(&d.hash) || batch.iter().any(|b| b.hash == d.hash) {
                continue;
            }
            let size = d.size_bytes.max(0) as usize;
            if size == 0 {
                out.insert(d.hash.clone(), Vec::new());
                continue;
            }
            if size + 200 > self.batch_limit {
                let data = self.bytestream_read(d)?;
                out.insert(d.hash.clone(), data);
                continue;
            }
            if batch_bytes + size + 200 > self.batch_limit {
                self.batch_read(std::mem::take(&mut batch), &mut out)?;
                batch_bytes = 0;
            }
            batch_bytes += size + 200;
            batch.push(d.clone());
        }
        if !batch.is_empty() {
            self.batch_read(batch, &mut out)?;
        }
        for d in digests {
            let data = out.get(&d.hash).map(Vec::as_slice).unwrap_or_default();
            self.verify(d, data)?;
        }
        Ok(out)
    }

    /// Checks bytes against a digest.
    pub fn verify(&self, d: &re::Digest, data: &[u8]) -> Result<(), RemoteError> {
        let got = self.caps.digest.digest(data);
        if got != *d {
            return Err(RemoteError::new(format!(
                "blob {} from {} does not match its digest (got {} bytes hashing to {}): \
                 truncated or corrupt",
                digest_str(d),
                self.url.display(),
                got.size_bytes,
                got.hash
            )));
        }
        Ok(())
    }

    fn batch_read(
        &self,
        digests: Vec<re::Digest>,
        out: &mut BTreeMap<String, Vec<u8>>,
    ) -> Result<(), RemoteError> {
        let mut cas = self.cas.clone();
        let r = self
            .rt
            .block_on(cas.batch_read_blobs(re::BatchReadBlobsRequest {
                instance_name: self.url.instance.clone(),
                digests,
                acceptable_compressors: Vec::new(),
                digest_function: self.caps.digest.proto(),
            }))
            .map_err(|s| self.err("BatchReadBlobs", &s))?;
        for resp in r.into_inner().responses {
            let d = resp.digest.unwrap_or_default();
            if let Some(st) = &resp.status
                && st.code != 0
            {
                return Err(RemoteError {
                    message: format!(
                        "BatchReadBlobs on {}: blob {}: code {}: {}",
                        self.url.display(),
                        digest_str(&d),
                        st.code,
                        st.message
                    ),
                    code: Some(st.code),
                });
            }
            out.insert(d.hash, resp.data);
        }
        Ok(())
    }

    fn bytestream_read(&self, d: &re::Digest) -> Result<Vec<u8>, RemoteError> {
        let prefix = if self.url.instance.is_empty() {
            String::new()
        } else {
            format!("{}/", self.url.instance)
        };
        let resource = format!(
            "{prefix}blobs/{}{}/{}",
            self.caps.digest.resource_segment(),
            d.hash,
            d.size_bytes
        );
        let mut client = self.bytestream.clone();
        let limit = d.size_bytes.max(0) as usize;
        self.rt.block_on(async {
            let mut stream = client
                .read(bs::ReadRequest {
                    resource_name: resource,
                    read_offset: 0,
                    read_limit: 0,
                })
                .await
                .map_err(|s| self.err("ByteStream.Read", &s))?
                .into_inner();
            let mut data = Vec::with_capacity(limit);
            while let Some(msg) = stream.next().await {
                let msg = msg.map_err(|s| self.err("ByteStream.Read", &s))?;
                data.extend_from_slice(&msg.data);
                if data.len() > limit {
                    break;
                }
            }
            Ok(data)
        })
    }

    /// The ActionCache entry for an action, if any.
    pub fn get_action_result(
        &self,
        action: &re::Digest,
    ) -> Result<Option<re::ActionResult>, RemoteError> {
        let mut ac = self.ac.clone();
        match self
            .rt
            .block_on(ac.get_action_result(re::GetActionResultRequest {
                instance_name: self.url.instance.clone(),
                action_digest: Some(action.clone()),
                inline_stdout: true,
                inline_stderr: true,
                inline_output_files: Vec::new(),
                digest_function: self.caps.digest.proto(),
            })) {
            Ok(r) => Ok(Some(r.into_inner())),
            Err(s) if s.code() == tonic::Code::NotFound => Ok(None),
            Err(s) => Err(self.err("GetActionResult", &s)),
        }
    }

    /// Stores an ActionCache entry (its blobs must already be in the CAS).
    pub fn update_action_result(
        &self,
        action: &re::Digest,
        result: re::ActionResult,
    ) -> Result<(), RemoteError> {
        let mut ac = self.ac.clone();
        self.rt
            .block_on(ac.update_action_result(re::UpdateActionResultRequest {
                instance_name: self.url.instance.clone(),
                action_digest: Some(action.clone()),
                action_result: Some(result),
                results_cache_policy: None,
                digest_function: self.caps.digest.proto(),
            }))
            .map_err(|s| self.err("UpdateActionResult", &s))?;
        Ok(())
    }

    /// Executes an action and follows its operation stream to the end
    /// (WaitExecution when the stream closes before the operation is done).
    pub fn execute(&self, action: &re::Digest, skip_cache: bool) -> Result<Executed, RemoteError> {
        let mut exec = self.exec.clone();
        let req = re::ExecuteRequest {
            instance_name: self.url.instance.clone(),
            skip_cache_lookup: skip_cache,
            action_digest: Some(action.clone()),
            execution_policy: None,
            results_cache_policy: None,
            digest_function: self.caps.digest.proto(),
            inline_stdout: true,
            inline_stderr: true,
            inline_output_files: Vec::new(),
        };
        self.rt.block_on(async {
            let mut stream = exec
                .execute(req)
                .await
                .map_err(|s| self.err("Execute", &s))?
                .into_inner();
            let mut last: Option<Operation> = None;
            loop {
                while let Some(op) = stream.next().await {
                    let op = op.map_err(|s| self.err("Execute", &s))?;
                    let done = op.done;
                    last = Some(op);
                    if done {
                        break;
                    }
                }
                match &last {
                    Some(op) if op.done => break,
                    Some(op) => {
                        stream = exec
                            .wait_execution(re::WaitExecutionRequest {
                                name: op.name.clone(),
                            })
                            .await
                            .map_err(|s| self.err("WaitExecution", &s))?
                            .into_inner();
                    }
                    None => {
                        return Err(RemoteError::new(format!(
                            "Execute on {}: the operation stream ended without an operation",
                            self.url.display()
                        )));
                    }
                }
            }
            let op = last.unwrap_or_default();
            self.finish(op)
        })
    }

    fn finish(&self, op: Operation) -> Result<Executed, RemoteError> {
        let any = match op.result {
            Some(operation::Result::Response(any)) => any,
            Some(operation::Result::Error(st)) => {
                return Err(RemoteError {
                    message: format!(
                        "Execute on {} failed: code {}: {}",
                        self.url.display(),
                        st.code,
                        st.message
                    ),
                    code: Some(st.code),
                });
            }
            None => {
                return Err(RemoteError::new(format!(
                    "Execute on {}: operation {} is done without a result",
                    self.url.display(),
                    op.name
                )));
            }
        };
        let resp = re::ExecuteResponse::decode(any.value.as_slice()).map_err(|e| {
            RemoteError::new(format!(
                "Execute on {}: undecodable ExecuteResponse ({}): {e}",
                self.url.display(),
                any.type_url
            ))
        })?;
        if let Some(st) = &resp.status
            && st.code != 0
        {
            return Err(RemoteError {
                message: format!(
                    "Execute on {} failed: code {}: {}{}",
                    self.url.display(),
                    st.code,
                    st.message,
                    if resp.message.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", resp.message)
                    }
                ),
                code: Some(st.code),
            });
        }
        let result = resp.result.ok_or_else(|| {
            RemoteError::new(format!(
                "Execute on {}: the response has no ActionResult",
                self.url.display()
            ))
        })?;
        Ok(Executed {
            result,
            cached: resp.cached_result,
            message: resp.message,
        })
    }
}

fn pick_capabilities(
    caps: &re::ServerCapabilities,
    url: &str,
) -> Result<Capabilities, RemoteError> {
    let cache = caps.cache_capabilities.clone().unwrap_or_default();
    let exec = caps.execution_capabilities.clone().unwrap_or_default();
    let mut offered: Vec<i32> = cache.digest_functions.clone();
    offered.extend(exec.digest_functions.iter().copied());
    if exec.digest_function != 0 {
        offered.push(exec.digest_function);
    }
    let digest = if offered.contains(&DigestFn::Blake3.proto()) {
        DigestFn::Blake3
    } else if offered.contains(&DigestFn::Sha256.proto()) || offered.is_empty() {
        // An engine that lists nothing speaks the protocol's default, SHA-256.
        DigestFn::Sha256
    } else {
        return Err(RemoteError::new(format!(
            "remote execution engine {url} offers neither SHA-256 nor BLAKE3 digests \
             (offered: {offered:?})"
        )));
    };
    let high = caps.high_api_version.clone().unwrap_or_default();
    Ok(Capabilities {
        digest,
        exec_enabled: exec.exec_enabled,
        ac_update: cache
            .action_cache_update_capabilities
            .map(|u| u.update_enabled)
            .unwrap_or(false),
        max_batch_bytes: cache.max_batch_total_size_bytes,
        high_api: (high.major, high.minor),
    })
}

fn upload_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let seed = format!(
        "{}-{:?}-{}",
        std::process::id(),
        std::time::SystemTime::now(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    let h = blake3::hash(seed.as_bytes()).to_hex().to_string();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {

    /// A connection broken under a call means the engine is gone; the
    /// engine's own answers keep their code.
    #[test]
    fn a_broken_connection_is_an_unreachable_engine() {
        let unavailable = Some(tonic::Code::Unavailable as i32);
        for s in [
            tonic::Status::unknown("transport error"),
            tonic::Status::cancelled("operation was canceled: connection closed"),
        ] {
            let e = RemoteError::status("GetActionResult", "grpc://h:1", &s);
            assert_eq!(e.code, unavailable, "{s:?}");
            assert!(e.message.contains("is unreachable"), "{}", e.message);
        }
        for s in [
            tonic::Status::cancelled("the engine cancelled the action"),
            tonic::Status::unknown("boom"),
        ] {
            let e = RemoteError::status("Execute", "grpc://h:1", &s);
            assert_eq!(e.code, Some(s.code() as i32), "{s:?}");
        }
    }

    use super::*;

    #[test]
    fn urls() {
        let u = RemoteUrl::parse("grpc://127.0.0.1:8980/main").expect("parse");
        assert_eq!(u.authority, "127.0.0.1:8980");
        assert_eq!(u.instance, "main");
        assert!(!u.tls);
        let u = RemoteUrl::parse("grpcs://re.example:443").expect("parse");
        assert!(u.tls);
        assert_eq!(u.instance, "");
        assert!(RemoteUrl::parse("http://x:1").is_err());
        assert!(RemoteUrl::parse("grpc://x").is_err());
        assert!(RemoteUrl::parse("grpc://:80").is_err());
    }

    #[test]
    fn digests() {
        let d = DigestFn::Sha256.digest(b"");
        assert_eq!(
            d.hash,
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(DigestFn::Blake3.digest(b"abc").size_bytes, 3);
    }

    #[test]
    fn picks_blake3_when_offered_else_sha256() {
        let mut caps = re::ServerCapabilities {
            cache_capabilities: Some(re::CacheCapabilities {
                digest_functions: vec![DigestFn::Sha256.proto()],
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            pick_capabilities(&caps, "x").expect("caps").digest,
            DigestFn::Sha256
        );
        if let Some(c) = caps.cache_capabilities.as_mut() {
            c.digest_functions.push(DigestFn::Blake3.proto());
        }
        assert_eq!(
            pick_capabilities(&caps, "x").expect("caps").digest,
            DigestFn::Blake3
        );
        if let Some(c) = caps.cache_capabilities.as_mut() {
            c.digest_functions = vec![re::digest_function::Value::Md5 as i32];
        }
        assert!(pick_capabilities(&caps, "x").is_err());
    }
}
