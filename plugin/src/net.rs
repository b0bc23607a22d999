//! Dialing a plugin or broker endpoint (Unix socket or TCP) with tonic.

use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::handshake::Addr;

/// Opens a channel to `addr`, failing after `timeout`.
pub(crate) async fn connect(addr: &Addr, timeout: Duration) -> Result<Channel, String> {
    match addr {
        Addr::Tcp(a) => Endpoint::from_shared(format!("http://{a}"))
            .map_err(|e| e.to_string())?
            .connect_timeout(timeout)
            .connect()
            .await
            .map_err(|e| format!("{e}: {}", source_chain(&e))),
        Addr::Unix(path) => {
            let path = path.clone();
            // The URI is required by the API and ignored by the connector.
            Endpoint::from_static("http://plugin.invalid")
                .connect_timeout(timeout)
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        let s = tokio::net::UnixStream::connect(path).await?;
                        Ok::<_, std::io::Error>(TokioIo::new(s))
                    }
                }))
                .await
                .map_err(|e| format!("{e}: {}", source_chain(&e)))
        }
    }
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
