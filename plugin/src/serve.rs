//! The plugin side, for plugins written in Rust: checks how it was started,
//! listens on a Unix socket, serves health, go-plugin's broker and
//! controller, and the plugin's own `PluginMeta` and `Provider`, and prints
//! the handshake line.
//!
//! ```no_run
//! # use charly_plugin::proto::charly as pb;
//! # struct P; struct M;
//! # #[tonic::async_trait] impl pb::provider_server::Provider for P {}
//! # #[tonic::async_trait] impl pb::plugin_meta_server::PluginMeta for M {}
//! fn main() -> std::process::ExitCode {
//!     charly_plugin::serve::serve(P, M)
//! }
//! ```
//!
//! AutoMTLS as go-plugin's server does it: when the host passes its
//! certificate in `PLUGIN_CLIENT_CERT`, the plugin makes its own (ECDSA
//! P-256 by default, see [`ServeTls`]), answers with it in the handshake's
//! 6th field and serves mutual TLS, trusting exactly the host's
//! certificate; its broker dials ([`dial`]) use TLS the same way. Without
//! the variable it serves plaintext.
//!
//! Not implemented here: GRPCStdio (the host falls back to the process's
//! stderr, which it forwards anyway).

use std::collections::HashMap;
use std::io::Write;
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};

use crate::handshake::Addr;
use crate::proto::charly as pb;
use crate::proto::goplugin as gp;
use crate::{
    APP_PROTOCOL_VERSION, CORE_PROTOCOL_VERSION, HEALTH_SERVICE, MAGIC_COOKIE_KEY,
    MAGIC_COOKIE_VALUE, net,
};

/// How long [`dial_executor`] waits for the host's announcement (go-plugin: 5 s).
const DIAL_WAIT: Duration = Duration::from_secs(5);

/// An error of the plugin side.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The host never announced the broker id.
    #[error("broker id {0}: the host announced no connection within {1:?}")]
    UnknownBrokerId(u32, Duration),
    /// Dialing the announced address failed.
    #[error("broker id {id}: cannot connect to {addr}: {reason}")]
    Dial {
        /// The broker id.
        id: u32,
        /// Where.
        addr: String,
        /// Why.
        reason: String,
    },
    /// Not running under [`serve`].
    #[error("not serving: the broker exists only inside charly_plugin::serve::serve")]
    NotServing,
}

/// What the host announced on the broker stream, by service id.
static BROKER: OnceLock<watch::Sender<HashMap<u32, gp::ConnInfo>>> = OnceLock::new();

/// With AutoMTLS: how broker connections to the host are dialed.
static BROKER_TLS: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();

pub use crate::tls::Curve;

/// The plugin side of AutoMTLS.
#[derive(Clone, Debug)]
pub enum ServeTls {
    /// When the host asks (`PLUGIN_CLIENT_CERT`), make a certificate on this
    /// curve and serve mutual TLS (go-plugin's server behaviour).
    Auto(Curve),
    /// Serve plaintext even when the host asks (a plugin without AutoMTLS).
    Off,
    /// When the host asks, present this certificate and key (one ring
    /// cannot make, such as go-plugin's ECDSA P-521).
    Fixed(Arc<rustls::sign::CertifiedKey>),
}

impl Default for ServeTls {
    fn default() -> Self {
        ServeTls::Auto(Curve::P256)
    }
}

/// Settings of [`serve_with`].
#[derive(Clone, Debug, Default)]
pub struct ServeOptions {
    /// AutoMTLS.
    pub tls: ServeTls,
    /// Announce this DER certificate in the handshake instead of the one
    /// served: only for testing that a host refuses a certificate other
    /// than the announced one.
    pub announce_cert: Option<Vec<u8>>,
}

/// Dials the host's `ExecutorService` announced under `broker_id`
/// (`InvokeRequest.executor_broker_id`).
pub async fn dial_executor(
    broker_id: u32,
) -> Result<pb::executor_service_client::ExecutorServiceClient<Channel>, ServeError> {
    Ok(pb::executor_service_client::ExecutorServiceClient::new(
        dial(broker_id).await?,
    ))
}

/// Dials any endpoint the host announced under `id` on the broker.
pub async fn dial(id: u32) -> Result<Channel, ServeError> {
    let tx = BROKER.get().ok_or(ServeError::NotServing)?;
    let mut rx = tx.subscribe();
    let info = tokio::time::timeout(DIAL_WAIT, rx.wait_for(|m| m.contains_key(&id)))
        .await
        .map_err(|_| ServeError::UnknownBrokerId(id, DIAL_WAIT))?
        .map_err(|_| ServeError::NotServing)?
        .get(&id)
        .cloned()
        .ok_or(ServeError::UnknownBrokerId(id, DIAL_WAIT))?;
    let addr = Addr::parse(&info.network, &info.address).map_err(|reason| ServeError::Dial {
        id,
        addr: info.address.clone(),
        reason,
    })?;
    net::connect(&addr, DIAL_WAIT, BROKER_TLS.get().cloned())
        .await
        .map_err(|reason| ServeError::Dial {
            id,
            addr: addr.to_string(),
            reason,
        })
}

struct Broker;

#[tonic::async_trait]
impl gp::grpc_broker_server::GrpcBroker for Broker {
    async fn start_stream(
        &self,
        req: Request<Streaming<gp::ConnInfo>>,
    ) -> Result<Response<tonic::codegen::BoxStream<gp::ConnInfo>>, Status> {
        let mut inbound = req.into_inner();
        tokio::spawn(async move {
            while let Some(Ok(info)) = inbound.next().await {
                // Knocks belong to go-plugin's multiplexing, which is off.
                if info.knock.is_some() {
                    continue;
                }
                if let Some(tx) = BROKER.get() {
                    tx.send_modify(|m| {
                        m.insert(info.service_id, info);
                    });
                }
            }
        });
        // This side announces nothing.
        Ok(Response::new(Box::pin(tokio_stream::pending())))
    }
}

struct Controller(std::sync::Arc<Notify>);

#[tonic::async_trait]
impl gp::grpc_controller_server::GrpcController for Controller {
    async fn shutdown(&self, _: Request<gp::Empty>) -> Result<Response<gp::Empty>, Status> {
        self.0.notify_one();
        Ok(Response::new(gp::Empty {}))
    }
}

/// Serves a plugin until the host shuts it down; returns the exit code.
/// Expects to be started as `<exe> __plugin serve` with the magic cookie in
/// the environment, as [`crate::Plugin::start`] does.
pub fn serve<P, M>(provider: P, meta: M) -> ExitCode
where
    P: pb::provider_server::Provider,
    M: pb::plugin_meta_server::PluginMeta,
{
    serve_with(provider, meta, ServeOptions::default())
}

/// [`serve`] with settings.
pub fn serve_with<P, M>(provider: P, meta: M, opts: ServeOptions) -> ExitCode
where
    P: pb::provider_server::Provider,
    M: pb::plugin_meta_server::PluginMeta,
{
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args != ["__plugin", "serve"] {
        eprintln!(
            "this is a charly plugin; charly starts it as `<exe> __plugin serve` (got {args:?})"
        );
        return ExitCode::from(2);
    }
    if std::env::var(MAGIC_COOKIE_KEY).as_deref() != Ok(MAGIC_COOKIE_VALUE) {
        eprintln!(
            "this is a charly plugin, not meant to be run directly ({MAGIC_COOKIE_KEY} is not {MAGIC_COOKIE_VALUE})"
        );
        return ExitCode::from(1);
    }
    if let Ok(vs) = std::env::var("PLUGIN_PROTOCOL_VERSIONS") {
        let want = APP_PROTOCOL_VERSION.to_string();
        if !vs.split(',').any(|v| v.trim() == want) {
            eprintln!("the host speaks protocol versions {vs}, this plugin speaks {want}");
            return ExitCode::from(1);
        }
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("plugin: tokio runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let code = rt.block_on(run(provider, meta, opts));
    // A call still in flight (a hung handler) must not keep the process.
    rt.shutdown_timeout(Duration::from_millis(200));
    code
}

/// The server's TLS configuration and the handshake's certificate field,
/// when the host asked for AutoMTLS and `opts` allows it.
fn auto_mtls(opts: &ServeOptions) -> Result<Option<(Arc<rustls::ServerConfig>, String)>, String> {
    let Some(pem) = std::env::var("PLUGIN_CLIENT_CERT")
        .ok()
        .filter(|p| !p.trim().is_empty())
    else {
        return Ok(None);
    };
    let me = match &opts.tls {
        ServeTls::Off => return Ok(None),
        ServeTls::Auto(curve) => crate::tls::Identity::generate(*curve)?.certified_key()?,
        ServeTls::Fixed(key) => key.as_ref().clone(),
    };
    let host = crate::tls::parse_pem_cert(&pem).map_err(|e| format!("PLUGIN_CLIENT_CERT: {e}"))?;
    let _ = BROKER_TLS.set(Arc::new(crate::tls::client_config(&me, &host)?));
    let server = crate::tls::server_config(&me, &host)?;
    let cert = match &opts.announce_cert {
        Some(c) => c.clone(),
        None => me
            .cert
            .first()
            .map(|c| c.as_ref().to_vec())
            .ok_or("no certificate")?,
    };
    Ok(Some((Arc::new(server), crate::tls::handshake_field(&cert))))
}

async fn run<P, M>(provider: P, meta: M, opts: ServeOptions) -> ExitCode
where
    P: pb::provider_server::Provider,
    M: pb::plugin_meta_server::PluginMeta,
{
    let dir = std::env::var_os("PLUGIN_UNIX_SOCKET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let sockdir = match tempfile::Builder::new().prefix("plugin").tempdir_in(&dir) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("plugin: socket directory in {}: {e}", dir.display());
            return ExitCode::from(1);
        }
    };
    let path = sockdir.path().join("plugin.sock");
    let listener = match tokio::net::UnixListener::bind(&path) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("plugin: listen on {}: {e}", path.display());
            return ExitCode::from(1);
        }
    };
    let tls = match auto_mtls(&opts) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("plugin: AutoMTLS: {e}");
            return ExitCode::from(1);
        }
    };
    let _ = BROKER.set(watch::channel(HashMap::new()).0);
    let (health, health_svc) = tonic_health::server::health_reporter();
    health
        .set_service_status(HEALTH_SERVICE, tonic_health::ServingStatus::Serving)
        .await;
    let stop = std::sync::Arc::new(Notify::new());
    let router = tonic::transport::Server::builder()
        .add_service(health_svc)
        .add_service(gp::grpc_broker_server::GrpcBrokerServer::new(Broker))
        .add_service(gp::grpc_controller_server::GrpcControllerServer::new(
            Controller(stop.clone()),
        ))
        .add_service(pb::plugin_meta_server::PluginMetaServer::new(meta))
        .add_service(pb::provider_server::ProviderServer::new(provider));
    let (server, cert_field) = match tls {
        None => (
            Box::pin(router.serve_with_incoming(UnixListenerStream::new(listener)))
                as std::pin::Pin<
                    Box<dyn Future<Output = Result<(), tonic::transport::Error>> + Send>,
                >,
            String::new(),
        ),
        Some((config, field)) => (
            Box::pin(router.serve_with_incoming(net::tls_incoming(listener, config))) as _,
            field,
        ),
    };

    let line = format!(
        "{CORE_PROTOCOL_VERSION}|{APP_PROTOCOL_VERSION}|unix|{}|grpc|{cert_field}",
        path.display()
    );
    {
        let mut out = std::io::stdout().lock();
        if writeln!(out, "{line}").and_then(|_| out.flush()).is_err() {
            return ExitCode::from(1);
        }
    }
    tokio::select! {
        r = server => match r {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("plugin: serve: {e}");
                ExitCode::from(1)
            }
        },
        _ = stop.notified() => {
            // Let the Shutdown answer leave before the process ends.
            tokio::time::sleep(Duration::from_millis(50)).await;
            ExitCode::SUCCESS
        }
    }
}
