//! Dialing a plugin or broker endpoint (Unix socket or TCP) with tonic,
//! in plaintext or, with AutoMTLS, over mutual TLS (see [`crate::tls`]).

use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tonic::transport::{Channel, Endpoint, Uri};

use crate::handshake::Addr;

/// A byte stream tonic can speak HTTP/2 over.
trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// Opens a channel to `addr`, failing after `timeout`; with `tls`, each
/// connection is a TLS client to `localhost` first.
pub(crate) async fn connect(
    addr: &Addr,
    timeout: Duration,
    tls: Option<Arc<rustls::ClientConfig>>,
) -> Result<Channel, String> {
    let addr = addr.clone();
    let tls = tls.map(tokio_rustls::TlsConnector::from);
    // The URI is required by the API and ignored by the connector.
    Endpoint::from_static("http://plugin.invalid")
        .connect_timeout(timeout)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let addr = addr.clone();
            let tls = tls.clone();
            async move {
                let raw: Box<dyn Io> = match &addr {
                    Addr::Unix(path) => Box::new(tokio::net::UnixStream::connect(path).await?),
                    Addr::Tcp(a) => {
                        let s = tokio::net::TcpStream::connect(a).await?;
                        s.set_nodelay(true)?;
                        Box::new(s)
                    }
                };
                let io: Box<dyn Io> = match tls {
                    None => raw,
                    Some(c) => Box::new(c.connect(crate::tls::server_name(), raw).await?),
                };
                Ok::<_, std::io::Error>(TokioIo::new(io))
            }
        }))
        .await
        .map_err(|e| format!("{e}: {}", source_chain(&e)))
}

fn source_chain(e: &dyn std::error::Error) -> String {
    let mut out = Vec::new();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push(s.to_string());
        cur = s.source();
    }
    out.join(": ")
}

/// Accepted connections of `listener`, each through a TLS handshake with
/// `config` first (handshakes run side by side; a failed one is dropped);
/// for tonic's `serve_with_incoming`.
pub(crate) fn tls_incoming(
    listener: tokio::net::UnixListener,
    config: Arc<rustls::ServerConfig>,
) -> tokio_stream::wrappers::ReceiverStream<
    Result<tokio_rustls::server::TlsStream<tokio::net::UnixStream>, std::io::Error>,
> {
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    tokio::spawn(async move {
        loop {
            let conn = tokio::select! {
                c = listener.accept() => c,
                () = tx.closed() => return,
            };
            let Ok((stream, _)) = conn else { continue };
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                if let Ok(s) = acceptor.accept(stream).await {
                    let _ = tx.send(Ok(s)).await;
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
