//! charly-plugin-fault: a plugin that misbehaves on purpose, for the host's
//! tests. `CHARLY_PLUGIN_FAULT` picks how:
//!
//! - `exit-early`: prints to stderr and exits 3 before any handshake;
//! - `bad-handshake`: prints a garbage handshake line, then sleeps;
//! - `no-handshake`: prints nothing and sleeps;
//! - `crash`: serves, and exits 101 in the middle of `invoke`;
//! - `hang`: serves, and never answers `invoke`;
//! - `garbage`: serves, and answers `invoke` with a result that is not JSON;
//! - `callbacks`: serves, and in `invoke` calls every `ExecutorService` RPC
//!   on the host's executor and the host's `CheckContextService` (on the
//!   same broker connection: `HTTPDo` of `$CHARLY_PLUGIN_FAULT_URL`,
//!   following redirects and not, one with an unreadable CA, and
//!   `AddBackground`), answering what each returned as JSON;
//! - `tcp`: serves health and `PluginMeta` on TCP in the host's port range
//!   (as go-plugin does where Unix sockets are not used); no broker or
//!   controller, so the host has to kill it;
//! - `stubborn`: serves, and keeps running after `GRPCController.Shutdown`;
//! - `empty-stream`: serves, and answers `InvokeStream` with no frame;
//! - anything else: serves, answering `invoke` with `{"ok": true}`.
//!
//! `InvokeStream` follows the mode too: `crash` exits after one frame,
//! `hang` sends one frame and then nothing, `garbage` sends a frame that is
//! not JSON; in the other modes it is not implemented (UNIMPLEMENTED, as a
//! plugin with only `Invoke` answers), so the host falls back to `Invoke`.
//!
//! With `CHARLY_PLUGIN_FAULT_PIDFILE` set, it first writes its pid there.
//!
//! `CHARLY_PLUGIN_FAULT_TLS` picks its AutoMTLS side (when the host asks):
//!
//! - `p521`: serves as a Go plugin does, with an ECDSA P-521 certificate of
//!   go-plugin's shape (a fixed test certificate and key,
//!   `tests/fixtures/go-p521.*.der`, made with openssl; ring cannot make
//!   P-521 keys, so it signs with RustCrypto's `p521`);
//! - `wrong-cert`: announces one certificate and serves another;
//! - `garbage-cert`: prints a handshake whose certificate field is not
//!   base64, then sleeps;
//! - `secp256k1-cert`: prints a handshake with a certificate on secp256k1
//!   (`tests/fixtures/secp256k1.cert.der`), then sleeps;
//! - unset: the kit's default (ECDSA P-256).

use std::process::ExitCode;
use std::time::Duration;

use std::sync::Arc;

use charly_plugin::proto::charly as pb;
use charly_plugin::serve::{ServeOptions, ServeTls, serve_with};
use tonic::{Request, Response, Status};

fn mode() -> String {
    std::env::var("CHARLY_PLUGIN_FAULT").unwrap_or_default()
}

struct Provider;

#[tonic::async_trait]
impl pb::provider_server::Provider for Provider {
    async fn invoke(
        &self,
        req: Request<pb::InvokeRequest>,
    ) -> Result<Response<pb::InvokeReply>, Status> {
        match mode().as_str() {
            "crash" => {
                eprintln!("fault: crashing in invoke");
                std::process::exit(101);
            }
            "hang" => {
                std::future::pending::<()>().await;
                Err(Status::internal("unreachable"))
            }
            "callbacks" => callbacks(req.into_inner().executor_broker_id).await,
            "garbage" => Ok(Response::new(pb::InvokeReply {
                result_json: b"this is {not json".to_vec(),
            })),
            _ => Ok(Response::new(pb::InvokeReply {
                result_json: br#"{"ok": true}"#.to_vec(),
            })),
        }
    }

    async fn invoke_stream(
        &self,
        _: Request<pb::InvokeRequest>,
    ) -> Result<Response<FrameStream>, Status> {
        let frame = |b: &[u8]| {
            Ok(pb::Frame {
                result_json: b.to_vec(),
            })
        };
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        match mode().as_str() {
            "crash" => {
                tokio::spawn(async move {
                    let _ = tx.send(frame(br#""about to crash""#)).await;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    eprintln!("fault: crashing in invoke-stream");
                    std::process::exit(101);
                });
            }
            "hang" => {
                tokio::spawn(async move {
                    let _ = tx.send(frame(br#"{"step": 1}"#)).await;
                    std::future::pending::<()>().await;
                });
            }
            "garbage" => {
                tokio::spawn(async move {
                    let _ = tx.send(frame(b"this is {not json")).await;
                });
            }
            "empty-stream" => drop(tx),
            _ => {
                return Err(Status::unimplemented("method InvokeStream not implemented"));
            }
        }
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

type FrameStream =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::Frame, Status>> + Send + 'static>>;

/// Calls each executor RPC once and reports what came back.
async fn callbacks(broker_id: u32) -> Result<Response<pb::InvokeReply>, Status> {
    // One dial, both services (as the original's kit does).
    let conn = charly_plugin::serve::dial(broker_id)
        .await
        .map_err(|e| Status::failed_precondition(e.to_string()))?;
    let mut ex = pb::executor_service_client::ExecutorServiceClient::new(conn.clone());
    let mut cc = pb::check_context_service_client::CheckContextServiceClient::new(conn);
    let url = std::env::var("CHARLY_PLUGIN_FAULT_URL").unwrap_or_default();
    let http = |follow: bool, ca: &[u8]| pb::HttpDoRequest {
        method: "POST".into(),
        url: format!("{url}/redirect"),
        body: b"ping".to_vec(),
        headers: [("X-Asked".to_string(), "yes".to_string())].into(),
        timeout: "5s".into(),
        allow_insecure: false,
        no_follow_redirects: !follow,
        ca_pem: ca.to_vec(),
    };
    let http_reply = |r: pb::HttpDoReply| {
        serde_json::json!([
            r.status,
            String::from_utf8_lossy(&r.body),
            r.header_blob,
            r.error
        ])
    };
    let followed = http_reply(cc.http_do(http(true, b"")).await?.into_inner());
    let unfollowed = http_reply(cc.http_do(http(false, b"")).await?.into_inner());
    let bad_ca = http_reply(cc.http_do(http(true, b"not a pem")).await?.into_inner());
    let add_background = match cc
        .add_background(pb::AddBackgroundRequest { pid: 42 })
        .await
    {
        Ok(_) => "answered".to_string(),
        Err(s) => format!("{:?}: {}", s.code(), s.message()),
    };
    let venue = ex.venue(pb::Empty {}).await?.into_inner().venue;
    let system = ex
        .run_system(pb::RunRequest {
            script: "id -u".into(),
            opts_json: b"{}".to_vec(),
        })
        .await?
        .into_inner()
        .error;
    let capture = ex
        .run_capture(pb::RunRequest {
            script: "echo hi".into(),
            opts_json: Vec::new(),
        })
        .await?
        .into_inner();
    let put = ex
        .put_file(pb::PutFileRequest {
            path: "/etc/x".into(),
            content: b"abc".to_vec(),
            mode: 0o640,
            owner_root: true,
            opts_json: Vec::new(),
        })
        .await?
        .into_inner()
        .error;
    let get = ex
        .get_file(pb::GetFileRequest {
            path: "/etc/y".into(),
            as_root: true,
            opts_json: Vec::new(),
        })
        .await?
        .into_inner();
    let host_step = ex
        .run_host_step(pb::HostStepRequest::default())
        .await?
        .into_inner()
        .error;
    let host_build = ex
        .host_build(pb::HostBuildRequest::default())
        .await?
        .into_inner()
        .error;
    let host_arbiter = ex
        .host_arbiter(pb::HostArbiterRequest::default())
        .await?
        .into_inner()
        .error;
    let invoke_provider = match ex
        .invoke_provider(pb::InvokeProviderRequest::default())
        .await
    {
        Ok(_) => "answered".to_string(),
        Err(s) => format!("{:?}: {}", s.code(), s.message()),
    };
    let v = serde_json::json!({
        "venue": venue,
        "system": system,
        "capture": [capture.stdout, capture.stderr, capture.exit_code, capture.error],
        "put": put,
        "get": [String::from_utf8_lossy(&get.content), get.error],
        "host_step": host_step,
        "host_build": host_build,
        "host_arbiter": host_arbiter,
        "invoke_provider": invoke_provider,
        "http": followed,
        "http_no_follow": unfollowed,
        "http_bad_ca": bad_ca,
        "add_background": add_background,
    });
    Ok(Response::new(pb::InvokeReply {
        result_json: v.to_string().into_bytes(),
    }))
}

struct Meta;

#[tonic::async_trait]
impl pb::plugin_meta_server::PluginMeta for Meta {
    async fn describe(&self, _: Request<pb::Empty>) -> Result<Response<pb::Capabilities>, Status> {
        Ok(Response::new(pb::Capabilities {
            calver: "0".into(),
            protocol_version: 1,
            provided: Vec::new(),
            schema_cue: String::new(),
        }))
    }
}

fn main() -> ExitCode {
    if let Some(p) = std::env::var_os("CHARLY_PLUGIN_FAULT_PIDFILE")
        && std::fs::write(&p, std::process::id().to_string()).is_err()
    {
        return ExitCode::from(4);
    }
    let opts = match std::env::var("CHARLY_PLUGIN_FAULT_TLS").as_deref() {
        Ok("garbage-cert") => return announce_and_sleep(&"!".repeat(60)),
        Ok("secp256k1-cert") => return announce_and_sleep(&b64(SECP256K1_CERT)),
        Ok("p521") => ServeOptions {
            tls: ServeTls::Fixed(Arc::new(p521_key())),
            ..ServeOptions::default()
        },
        Ok("wrong-cert") => {
            let Ok(other) = rcgen::generate_simple_self_signed(vec!["localhost".to_string()])
            else {
                return ExitCode::from(4);
            };
            ServeOptions {
                announce_cert: Some(other.cert.der().to_vec()),
                ..ServeOptions::default()
            }
        }
        _ => ServeOptions::default(),
    };
    match mode().as_str() {
        "exit-early" => {
            eprintln!("fault: giving up before the handshake");
            ExitCode::from(3)
        }
        "bad-handshake" => {
            println!("hello from a plugin that does not speak go-plugin");
            std::thread::sleep(Duration::from_secs(600));
            ExitCode::SUCCESS
        }
        "no-handshake" => {
            std::thread::sleep(Duration::from_secs(600));
            ExitCode::SUCCESS
        }
        "tcp" => serve_tcp(),
        "stubborn" => {
            let _ = serve_with(Provider, Meta, opts);
            std::thread::sleep(Duration::from_secs(600));
            ExitCode::SUCCESS
        }
        _ => serve_with(Provider, Meta, opts),
    }
}

/// A go-plugin-shaped P-521 certificate and its key (test material only).
const P521_CERT: &[u8] = include_bytes!("../../tests/fixtures/go-p521.cert.der");
const P521_KEY: &[u8] = include_bytes!("../../tests/fixtures/go-p521.key.der");
/// A certificate on secp256k1, which no host here verifies (test material).
const SECP256K1_CERT: &[u8] = include_bytes!("../../tests/fixtures/secp256k1.cert.der");

fn b64(der: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD_NO_PAD.encode(der)
}

/// Prints a handshake line carrying `cert` (no server behind it), then
/// sleeps: the host must refuse the certificate before connecting.
fn announce_and_sleep(cert: &str) -> ExitCode {
    println!("1|1|unix|/nonexistent/plugin.sock|grpc|{cert}");
    std::thread::sleep(Duration::from_secs(600));
    ExitCode::SUCCESS
}

fn p521_key() -> rustls::sign::CertifiedKey {
    use p521::pkcs8::DecodePrivateKey;
    let key = p521::ecdsa::SigningKey::from_pkcs8_der(P521_KEY)
        .unwrap_or_else(|e| panic!("the P-521 test key: {e}"));
    rustls::sign::CertifiedKey::new(
        vec![rustls::pki_types::CertificateDer::from(P521_CERT.to_vec())],
        Arc::new(P521(key)),
    )
}

/// ECDSA P-521/SHA-512 signing for rustls (as a Go plugin's TLS signs).
#[derive(Clone)]
struct P521(p521::ecdsa::SigningKey);

impl std::fmt::Debug for P521 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("P521")
    }
}

impl rustls::sign::SigningKey for P521 {
    fn choose_scheme(
        &self,
        offered: &[rustls::SignatureScheme],
    ) -> Option<Box<dyn rustls::sign::Signer>> {
        offered
            .contains(&rustls::SignatureScheme::ECDSA_NISTP521_SHA512)
            .then(|| Box::new(self.clone()) as Box<dyn rustls::sign::Signer>)
    }

    fn algorithm(&self) -> rustls::SignatureAlgorithm {
        rustls::SignatureAlgorithm::ECDSA
    }
}

impl rustls::sign::Signer for P521 {
    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, rustls::Error> {
        use p521::ecdsa::signature::Signer;
        let sig: p521::ecdsa::Signature = self.0.sign(message);
        Ok(sig.to_der().as_bytes().to_vec())
    }

    fn scheme(&self) -> rustls::SignatureScheme {
        rustls::SignatureScheme::ECDSA_NISTP521_SHA512
    }
}

/// The `tcp` mode: a bare go-plugin-style server on 127.0.0.1.
fn serve_tcp() -> ExitCode {
    let port = |k: &str| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse::<u16>().ok())
            .unwrap_or(0)
    };
    let (min, max) = (port("PLUGIN_MIN_PORT"), port("PLUGIN_MAX_PORT"));
    let Ok(rt) = tokio::runtime::Runtime::new() else {
        return ExitCode::from(1);
    };
    rt.block_on(async {
        let mut listener = None;
        for p in min..=max {
            if let Ok(l) = tokio::net::TcpListener::bind(("127.0.0.1", p)).await {
                listener = Some(l);
                break;
            }
        }
        let Some(listener) = listener else {
            eprintln!("fault: no free port in {min}..={max}");
            return ExitCode::from(1);
        };
        let Ok(addr) = listener.local_addr() else {
            return ExitCode::from(1);
        };
        let (health, health_svc) = tonic_health::server::health_reporter();
        health
            .set_service_status("plugin", tonic_health::ServingStatus::Serving)
            .await;
        println!("1|1|tcp|{addr}|grpc|");
        let r = tonic::transport::Server::builder()
            .add_service(health_svc)
            .add_service(pb::plugin_meta_server::PluginMetaServer::new(Meta))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await;
        match r {
            Ok(()) => ExitCode::SUCCESS,
            Err(_) => ExitCode::from(1),
        }
    })
}
