//! A synchronous face on the (async) OCI Distribution client.
//!
//! `oci-client` speaks the Distribution API and its auth schemes on tokio.
//! The store and the engine are synchronous (rayon threads), so this module
//! owns a small private multi-thread runtime and blocks on it. That is sound
//! from any thread that is not itself running async code: the runtime's own
//! workers drive the sockets while the calling thread waits. Blob bodies
//! cross the boundary as streams, a chunk at a time, so no blob is ever held
//! in memory whole.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::BoxStream;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use tokio::runtime::Runtime;

use super::config::{RemoteAuth, Target};
use super::error::{Kind, RemoteError, classify, is_transient};

/// How many times a request that may be repeated is sent when the registry
/// answers that it failed for now (HTTP 500, 502–504, 429).
const ATTEMPTS: u32 = 3;

/// The pause before attempt `n + 1`: 100 ms, then 400 ms.
fn backoff(n: u32) -> Duration {
    Duration::from_millis(100 * 4u64.pow(n - 1))
}

/// Media type of the manifests charly writes and reads.
pub(crate) const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

/// A blob body being downloaded.
pub(crate) type BlobStream = BoxStream<'static, std::io::Result<Bytes>>;

/// One registry repository.
pub(crate) struct Registry {
    rt: Runtime,
    client: Client,
    auth: RegistryAuth,
    target: Target,
}

impl Registry {
    pub(crate) fn new(target: Target, auth: &RemoteAuth) -> Result<Registry, RemoteError> {
        // reqwest is built without a default TLS crypto provider (to keep one
        // backend, ring, in the tree); it takes the process default. An
        // error means one is installed already, which is just as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("charly-remote")
            .enable_all()
            .build()
            .map_err(|e| RemoteError::other(format!("starting the remote I/O runtime: {e}")))?;
        let config = ClientConfig {
            protocol: if target.plain_http {
                ClientProtocol::Http
            } else {
                ClientProtocol::Https
            },
            // One PUT with a streamed body per blob: the most widely
            // supported upload and, on a fast link, the quickest.
            use_monolithic_push: true,
            connect_timeout: Some(Duration::from_secs(10)),
            // Between two reads of a response, not for the whole transfer.
            read_timeout: Some(Duration::from_secs(120)),
            user_agent: concat!("charly/", env!("CARGO_PKG_VERSION")),
            ..ClientConfig::default()
        };
        let client = Client::new(config);
        let auth = match auth {
            RemoteAuth::Anonymous => RegistryAuth::Anonymous,
            RemoteAuth::Basic { user, pass } => RegistryAuth::Basic(user.clone(), pass.clone()),
            RemoteAuth::Bearer { token } => RegistryAuth::Bearer(token.clone()),
        };
        // Blob calls of the client use stored credentials only.
        rt.block_on(client.store_auth_if_needed(&target.registry, &auth));
        Ok(Registry {
            rt,
            client,
            auth,
            target,
        })
    }

    /// The runtime, for callers that pump streams themselves.
    pub(crate) fn runtime(&self) -> &Runtime {
        &self.rt
    }

    fn tagged(&self, tag: &str) -> Reference {
        Reference::with_tag(
            self.target.registry.clone(),
            self.target.repository.clone(),
            tag.to_string(),
        )
    }

    /// Reference for blob operations (only registry and repository matter).
    fn repo(&self) -> Reference {
        self.tagged("latest")
    }

    /// Runs a request that may be repeated without changing what the registry
    /// holds (a lookup, or an upload of content named by its digest), again
    /// after a pause while the registry answers with a transient failure.
    /// Registries under concurrent load (Docker Distribution among them)
    /// answer an occasional 500 to a request that succeeds a moment later;
    /// that must not cost a cache hit or fail a push.
    fn idempotent<T, F, Fut>(&self, mut request: F) -> Result<T, OciDistributionError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, OciDistributionError>>,
    {
        let mut attempt = 1;
        loop {
            match self.rt.block_on(request()) {
                Err(e) if attempt < ATTEMPTS && is_transient(&e) => {
                    std::thread::sleep(backoff(attempt));
                    attempt += 1;
                }
                done => return done,
            }
        }
    }

    /// The manifest tagged `tag` and its digest; `None` if there is none.
    pub(crate) fn get_manifest(&self, tag: &str) -> Result<Option<(Bytes, String)>, RemoteError> {
        let r = self.tagged(tag);
        match self.idempotent(|| {
            self.client
                .pull_manifest_raw(&r, &self.auth, &[OCI_MANIFEST])
        }) {
            Ok(found) => Ok(Some(found)),
            Err(e) => match classify(&e) {
                err if err.kind == Kind::NotFound => Ok(None),
                err => Err(err.context(format!("fetching manifest {tag}"))),
            },
        }
    }

    /// Whether a manifest is tagged `tag` (HEAD).
    pub(crate) fn has_manifest(&self, tag: &str) -> Result<bool, RemoteError> {
        let r = self.tagged(tag);
        match self.idempotent(|| self.client.fetch_manifest_digest(&r, &self.auth)) {
            Ok(_) => Ok(true),
            Err(e) => match classify(&e) {
                err if err.kind == Kind::NotFound => Ok(false),
                err => Err(err.context(format!("checking manifest {tag}"))),
            },
        }
    }

    /// Uploads an OCI image manifest under `tag`.
    pub(crate) fn put_manifest(&self, tag: &str, body: Vec<u8>) -> Result<(), RemoteError> {
        let r = self.tagged(tag);
        // The header type belongs to the client's HTTP stack; let inference
        // name it rather than depending on that crate directly.
        let content_type = OCI_MANIFEST
            .parse()
            .map_err(|e| RemoteError::other(format!("header value {OCI_MANIFEST:?}: {e}")))?;
        self.idempotent(|| {
            self.client
                .push_manifest_raw(&r, body.clone(), Clone::clone(&content_type))
        })
        .map(|_| ())
        .map_err(|e| classify(&e).context(format!("uploading manifest {tag}")))
    }

    /// Whether the repository has the blob `digest` (`sha256:…`).
    pub(crate) fn has_blob(&self, digest: &str) -> Result<bool, RemoteError> {
        let r = self.repo();
        match self.idempotent(|| self.client.blob_exists(&r, digest)) {
            Ok(found) => Ok(found),
            Err(e) => match classify(&e) {
                err if err.kind == Kind::NotFound => Ok(false),
                err => Err(err.context(format!("checking blob {digest}"))),
            },
        }
    }

    /// Uploads a small blob held in memory.
    pub(crate) fn push_bytes(
        &self,
        digest: &str,
        data: impl Into<Bytes>,
    ) -> Result<(), RemoteError> {
        let r = self.repo();
        let data: Bytes = data.into();
        let size = data.len() as u64;
        self.idempotent(|| {
            let body = futures_util::stream::iter([Ok(data.clone())]);
            self.client.push_blob_stream(&r, body, digest, Some(size))
        })
        .map(|_| ())
        .map_err(|e| classify(&e).context(format!("uploading blob {digest}")))
    }

    /// Uploads a blob whose body `produce` writes, chunk by chunk, into the
    /// sender it is given (on the calling thread, while the runtime sends).
    /// `size` must be exact. If `produce` fails it must first send an error
    /// into the body, so the registry never completes the upload; its error
    /// is then the one returned, unless it is only that the upload stopped
    /// (kind `Unavailable`), in which case the upload's own error explains more.
    pub(crate) fn push_stream(
        &self,
        digest: &str,
        size: u64,
        produce: impl FnOnce(
            &tokio::sync::mpsc::Sender<std::io::Result<Bytes>>,
        ) -> Result<(), RemoteError>,
    ) -> Result<(), RemoteError> {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(2);
        let body = futures_util::stream::poll_fn(move |cx| {
            rx.poll_recv(cx)
                .map(|item| item.map(|r| r.map_err(OciDistributionError::IoError)))
        });
        let client = self.client.clone();
        let r = self.repo();
        let d = digest.to_string();
        let upload = self.rt.spawn(async move {
            client
                .push_blob_stream(&r, body, &d, Some(size))
                .await
                .map(|_| ())
        });
        let produced = produce(&tx);
        drop(tx);
        let uploaded = self
            .rt
            .block_on(upload)
            .map_err(|e| RemoteError::other(format!("upload task of blob {digest}: {e}")))?
            .map_err(|e| classify(&e).context(format!("uploading blob {digest}")));
        match (produced, uploaded) {
            (Ok(()), Ok(())) => Ok(()),
            (Err(p), _) if p.kind != Kind::Unavailable => Err(p),
            (_, Err(u)) => Err(u),
            (Err(p), Ok(())) => Err(p),
        }
    }

    /// Starts downloading blob `digest`. The client checks the body against
    /// `digest` (and the registry's `Docker-Content-Digest`) as it ends and
    /// turns a mismatch into an error of the stream.
    pub(crate) fn pull_blob(&self, digest: &str) -> Result<BlobStream, RemoteError> {
        let r = self.repo();
        self.idempotent(|| self.client.pull_blob_stream(&r, digest))
            .map(|s| s.stream)
            .map_err(|e| classify(&e).context(format!("fetching blob {digest}")))
    }

    /// Every tag of the repository (paged); none for a repository that
    /// does not exist yet.
    pub(crate) fn list_tags(&self) -> Result<Vec<String>, RemoteError> {
        const PAGE: usize = 1000;
        let r = self.repo();
        let mut all: Vec<String> = Vec::new();
        loop {
            let last = all.last().cloned();
            let page = match self.idempotent(|| {
                self.client
                    .list_tags(&r, &self.auth, Some(PAGE), last.as_deref())
            }) {
                Ok(p) => p.tags,
                Err(e) => match classify(&e) {
                    err if err.kind == Kind::NotFound => Vec::new(),
                    err => return Err(err.context("listing tags")),
                },
            };
            let n = page.len();
            // A registry that ignores `last` would repeat itself: stop.
            if n == 0 || page.last() == all.last() {
                break;
            }
            all.extend(page);
            if n < PAGE {
                break;
            }
        }
        Ok(all)
    }

    /// Checks that the registry answers and accepts the credentials for
    /// reading (a lookup of a tag that never exists).
    pub(crate) fn ping(&self) -> Result<(), RemoteError> {
        self.get_manifest("charly-ping").map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Write};
    use std::net::TcpListener;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A registry stand-in that answers each blob request with the next status
    /// of `script` (the last one repeating) and counts them.
    fn scripted(script: &'static [&'static str]) -> (Registry, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let seen = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&seen);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut s) = stream else { return };
                let mut r = BufReader::new(s.try_clone().expect("clone"));
                let mut request = String::new();
                let _ = r.read_line(&mut request);
                let mut line = String::new();
                while r.read_line(&mut line).is_ok_and(|n| n > 2) {
                    line.clear();
                }
                // The client's own discovery of the registry's auth (GET
                // /v2/) is answered plainly; blob requests follow the script.
                let status = if request.contains("/blobs/") {
                    let n = count.fetch_add(1, Ordering::SeqCst);
                    script[n.min(script.len() - 1)]
                } else {
                    "200 OK"
                };
                let _ = write!(
                    s,
                    "HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                );
            }
        });
        let target = Target {
            registry: format!("127.0.0.1:{port}"),
            repository: "charly/retry".into(),
            plain_http: true,
        };
        let reg = Registry::new(target, &RemoteAuth::Anonymous).expect("client");
        (reg, seen)
    }

    const DIGEST: &str = "sha256:d45809248362ea418dff5d4bdae950a4394bf2415a40757907fb0197b75cd0df";

    #[test]
    fn a_transient_server_error_is_retried() {
        let (reg, seen) = scripted(&["500 Internal Server Error", "200 OK"]);
        assert!(reg.has_blob(DIGEST).expect("answered on the second try"));
        assert_eq!(seen.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_lasting_server_error_is_reported_after_a_bounded_number_of_tries() {
        let (reg, seen) = scripted(&["503 Service Unavailable"]);
        let err = reg.has_blob(DIGEST).expect_err("never answered");
        assert_eq!(err.kind, Kind::Unavailable, "{err}");
        assert_eq!(seen.load(Ordering::SeqCst), ATTEMPTS as usize);
    }

    #[test]
    fn a_definite_answer_is_not_retried() {
        let (reg, seen) = scripted(&["404 Not Found", "200 OK"]);
        assert!(!reg.has_blob(DIGEST).expect("a plain miss"));
        let (reg2, seen2) = scripted(&["400 Bad Request", "200 OK"]);
        assert!(reg2.has_blob(DIGEST).is_err());
        assert_eq!(seen.load(Ordering::SeqCst), 1);
        assert_eq!(seen2.load(Ordering::SeqCst), 1);
    }
}
