//! What can go wrong talking to a plugin. Every error names the plugin and,
//! once it runs, the operation.

use std::path::PathBuf;
use std::time::Duration;

/// An error of the plugin host.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The executable could not be started.
    #[error("plugin {plugin}: cannot start {}: {source}", exe.display())]
    Spawn {
        /// Plugin name.
        plugin: String,
        /// The executable.
        exe: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The host could not set itself up (runtime, socket directory).
    #[error("plugin {plugin}: host setup: {reason}")]
    Setup {
        /// Plugin name.
        plugin: String,
        /// Why.
        reason: String,
    },
    /// The plugin exited before it printed its handshake line.
    #[error("plugin {plugin}: exited ({status}) before its handshake{}", quote_stderr(.stderr))]
    ExitedBeforeHandshake {
        /// Plugin name.
        plugin: String,
        /// How it ended (`exit status: 3`).
        status: String,
        /// The last lines it wrote on stderr.
        stderr: String,
    },
    /// No handshake line in time.
    #[error("plugin {plugin}: no handshake line on stdout within {after:?}{}", quote_stderr(.stderr))]
    HandshakeTimeout {
        /// Plugin name.
        plugin: String,
        /// The timeout.
        after: Duration,
        /// The last lines it wrote on stderr.
        stderr: String,
    },
    /// The handshake line is not what this host speaks.
    #[error("plugin {plugin}: bad handshake line {line:?}: {reason}")]
    BadHandshake {
        /// Plugin name.
        plugin: String,
        /// What it printed.
        line: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The plugin asks for something this host does not implement.
    #[error("plugin {plugin}: {what} is not supported by this host")]
    Unsupported {
        /// Plugin name.
        plugin: String,
        /// What (AutoMTLS, net/rpc).
        what: String,
    },
    /// The certificate a plugin sent for AutoMTLS (the handshake's 6th
    /// field) is unusable: not base64, not a certificate, or a key this host
    /// cannot verify (named, e.g. `ECDSA on curve secp256k1`).
    #[error("plugin {plugin}: bad AutoMTLS certificate in its handshake: {reason}")]
    BadCertificate {
        /// Plugin name.
        plugin: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Connecting to the plugin's address, or its health check, failed.
    #[error("plugin {plugin}: {op}: {reason}")]
    Connect {
        /// Plugin name.
        plugin: String,
        /// `connect to unix:/…` or `health check`.
        op: String,
        /// Why.
        reason: String,
    },
    /// A call took longer than its timeout.
    #[error("plugin {plugin}: {op} timed out after {after:?}")]
    Timeout {
        /// Plugin name.
        plugin: String,
        /// The operation.
        op: String,
        /// The timeout.
        after: Duration,
    },
    /// The plugin process died during a call.
    #[error("plugin {plugin}: crashed during {op} ({status}){}", quote_stderr(.stderr))]
    Crashed {
        /// Plugin name.
        plugin: String,
        /// The operation.
        op: String,
        /// How it ended.
        status: String,
        /// The last lines it wrote on stderr.
        stderr: String,
    },
    /// The plugin answered with a gRPC error.
    #[error("plugin {plugin}: {op} failed: {code:?}: {message}")]
    Rpc {
        /// Plugin name.
        plugin: String,
        /// The operation.
        op: String,
        /// The gRPC status code.
        code: tonic::Code,
        /// The status message.
        message: String,
    },
    /// The plugin answered something that is not a valid reply.
    #[error("plugin {plugin}: {op} answered garbage ({reason}): {excerpt:?}")]
    BadReply {
        /// Plugin name.
        plugin: String,
        /// The operation.
        op: String,
        /// What is wrong.
        reason: String,
        /// The start of what it answered.
        excerpt: String,
    },
}

fn quote_stderr(stderr: &str) -> String {
    if stderr.trim().is_empty() {
        String::new()
    } else {
        format!("; its stderr ended with:\n{stderr}")
    }
}
