//! The host side of charly's out-of-process plugin protocol `charly-plugin-v1`,
//! wire-compatible with the original Go tool's plugins.
//!
//! A plugin is an executable started as `<exe> __plugin serve`. It speaks gRPC
//! the way HashiCorp go-plugin does: the host passes a magic cookie
//! (`CHARLY_PLUGIN=charly-plugin-v1`) and `PLUGIN_*` variables in the
//! environment, the plugin answers with one handshake line on stdout
//! (`1|1|unix|/path/to.sock|grpc|`), then serves `grpc.health.v1` ("plugin"),
//! go-plugin's `GRPCBroker`/`GRPCController`/`GRPCStdio` and charly's
//! `PluginMeta`/`Provider` services on that socket.
//!
//! [`Plugin`] is the host: [`Plugin::start`], [`Plugin::describe`],
//! [`Plugin::invoke`] and its streaming form [`Plugin::invoke_stream`]
//! (`Provider.InvokeStream`, progress frames forwarded like stderr, falling
//! back to `Invoke` for plugins without it), serving an [`Executor`] (and
//! `CheckContextService`, see `checkctx`) back to the plugin over the
//! broker when given one, and on drop `GRPCController.Shutdown`, then a
//! kill. The API is blocking; each plugin runs a small private tokio
//! runtime.
//!
//! Connections use go-plugin's AutoMTLS when the plugin answers with a
//! certificate ([`PluginOptions::auto_mtls`]; module `tls`: ECDSA P-256,
//! P-384 and go-plugin's P-521 are verified). A plugin process never
//! outlives charly, even a SIGKILLed one (module `pdeathsig`: Linux's
//! parent-death signal, set from a keeper thread per plugin).
//!
//! With the `serve` feature (default), [`serve`] is the plugin side for plugins
//! written in Rust (the example and fault plugins of the tests use it).
//!
//! Modules: [`proto`] the generated messages and stubs, `handshake` the
//! handshake line, `net` dialing a socket or TCP endpoint, `tls` AutoMTLS,
//! `host` starting, calling and stopping a plugin, `pdeathsig` a plugin
//! never outliving charly, `caps` what a plugin serves, `executor` and
//! `checkctx` the services served back to it, [`reply`] the JSON its
//! replies carry, `error` what can go wrong. Where the crate sits:
//! `docs/architecture.md`.

pub mod proto {
    //! Messages and tonic stubs generated from the vendored `.proto` files.

    /// charly's plugin services (`package charlyplugin`, proto/plugin.proto).
    #[allow(missing_docs, clippy::all, clippy::pedantic, clippy::unwrap_used)]
    pub mod charly {
        tonic::include_proto!("charlyplugin");
    }

    /// go-plugin's internal services (`package plugin`): broker, controller, stdio.
    #[allow(missing_docs, clippy::all, clippy::pedantic, clippy::unwrap_used)]
    pub mod goplugin {
        tonic::include_proto!("plugin");
    }
}

mod caps;
mod checkctx;
mod error;
mod executor;
mod handshake;
mod host;
mod net;
mod pdeathsig;
pub mod reply;
#[cfg(feature = "serve")]
pub mod serve;
mod tls;

pub use caps::{Capabilities, ProvidedCapability, StepContract, StepVenue};
pub use checkctx::BASE_TIMEOUT as HTTP_DO_BASE_TIMEOUT;
pub use error::PluginError;
pub use executor::{Capture, ExecError, Executor};
pub use host::{LineSink, Plugin, PluginOptions};

/// The environment variable carrying the magic cookie.
pub const MAGIC_COOKIE_KEY: &str = "CHARLY_PLUGIN";
/// The magic cookie's value: the protocol's name.
pub const MAGIC_COOKIE_VALUE: &str = "charly-plugin-v1";
/// go-plugin's own protocol version (the first handshake field).
pub const CORE_PROTOCOL_VERSION: u32 = 1;
/// charly's application protocol version (the second handshake field).
pub const APP_PROTOCOL_VERSION: u32 = 1;
/// The grpc.health.v1 service name go-plugin checks.
pub const HEALTH_SERVICE: &str = "plugin";
