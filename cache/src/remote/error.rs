//! What can go wrong talking to a registry, sorted by what the caller does
//! about it.
//!
//! The remote cache never lets a registry problem become a wrong result, and
//! (unless the remote is required) never lets it fail a build either. What
//! matters about an error is therefore its *kind*: a missing manifest is an
//! ordinary miss, corrupt data is a miss that must be reported, an
//! unreachable registry should stop further attempts, and everything else is
//! reported once per operation.

use std::fmt;
use std::io;
use std::path::PathBuf;

use oci_client::errors::{DigestError, OciDistributionError, OciErrorCode};

use crate::CacheError;

/// How an operation against the registry failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The manifest or blob does not exist (a plain miss).
    NotFound,
    /// The registry served bytes that fail verification (digest, size,
    /// format): never used, reported.
    Corrupt,
    /// The registry could not be reached or the transfer broke off.
    Unavailable,
    /// Credentials were refused or missing.
    Auth,
    /// Anything else: the registry rejected a request, spoke nonsense, or a
    /// local step (reading a blob from the store) failed.
    Other,
}

/// An error from one remote operation.
#[derive(Debug, Clone)]
pub(crate) struct RemoteError {
    pub(crate) kind: Kind,
    pub(crate) message: String,
    /// The blob (`sha256:…`) whose bytes failed verification, when one did:
    /// the next push of its record replaces it.
    pub(crate) bad_blob: Option<String>,
}

impl RemoteError {
    pub(crate) fn new(kind: Kind, message: impl Into<String>) -> RemoteError {
        RemoteError {
            kind,
            message: message.into(),
            bad_blob: None,
        }
    }

    /// Names the blob whose bytes failed verification (for corruption).
    pub(crate) fn in_blob(mut self, sha256: &str) -> RemoteError {
        if self.kind == Kind::Corrupt {
            self.bad_blob = Some(sha256.to_string());
        }
        self
    }

    pub(crate) fn corrupt(message: impl Into<String>) -> RemoteError {
        RemoteError::new(Kind::Corrupt, message)
    }

    pub(crate) fn other(message: impl Into<String>) -> RemoteError {
        RemoteError::new(Kind::Other, message)
    }

    /// Prefixes the message with what was being done.
    pub(crate) fn context(mut self, what: impl fmt::Display) -> RemoteError {
        self.message = format!("{what}: {}", self.message);
        self
    }

    /// Wraps a local store error met during a remote operation.
    pub(crate) fn local(e: &CacheError) -> RemoteError {
        RemoteError::other(format!("local store: {e}"))
    }

    /// The error as a [`CacheError`] for callers of the public API.
    pub(crate) fn into_cache_error(self, url: &str) -> CacheError {
        CacheError::Io {
            action: "using remote cache",
            path: PathBuf::from(url),
            source: io::Error::other(self.message),
        }
    }
}

impl fmt::Display for RemoteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Classifies an error of the OCI client.
pub(crate) fn classify(e: &OciDistributionError) -> RemoteError {
    let kind = match e {
        OciDistributionError::ImageManifestNotFoundError(_) => Kind::NotFound,
        OciDistributionError::RegistryError { envelope, .. } => {
            let codes: Vec<&OciErrorCode> = envelope.errors.iter().map(|e| &e.code).collect();
            if codes.iter().any(|c| {
                matches!(
                    c,
                    OciErrorCode::ManifestUnknown
                        | OciErrorCode::NameUnknown
                        | OciErrorCode::BlobUnknown
                        | OciErrorCode::NotFound
                )
            }) {
                Kind::NotFound
            } else if codes
                .iter()
                .any(|c| matches!(c, OciErrorCode::Unauthorized | OciErrorCode::Denied))
            {
                Kind::Auth
            } else if codes.contains(&&OciErrorCode::Toomanyrequests) {
                Kind::Unavailable
            } else {
                Kind::Other
            }
        }
        OciDistributionError::ServerError { code, .. } => status_kind(*code),
        OciDistributionError::UnauthorizedError { .. }
        | OciDistributionError::AuthenticationFailure(_) => Kind::Auth,
        OciDistributionError::DigestError(DigestError::VerificationError { .. }) => Kind::Corrupt,
        OciDistributionError::RequestError(r) => {
            // Some calls of the client turn an error status into a request
            // error (`error_for_status`): the status decides.
            if let Some(status) = r.status() {
                status_kind(status.as_u16())
            } else if r.is_connect() || r.is_timeout() || r.is_request() || r.is_body() {
                Kind::Unavailable
            } else {
                Kind::Other
            }
        }
        OciDistributionError::IoError(io) => classify_io(io),
        _ => Kind::Other,
    };
    RemoteError::new(kind, error_chain(e))
}

/// Whether the registry answered that this request failed for now, so the
/// same request may succeed if sent again: a server error without an OCI
/// error body (500, 502–504) or a rate limit.
pub(crate) fn is_transient(e: &OciDistributionError) -> bool {
    match e {
        OciDistributionError::ServerError { code, .. } => transient_status(*code),
        OciDistributionError::RequestError(r) => {
            r.status().is_some_and(|s| transient_status(s.as_u16()))
        }
        OciDistributionError::RegistryError { envelope, .. } => envelope
            .errors
            .iter()
            .any(|e| e.code == OciErrorCode::Toomanyrequests),
        _ => false,
    }
}

fn transient_status(code: u16) -> bool {
    matches!(code, 429 | 500 | 502..=504)
}

/// What an HTTP error status says about the request.
fn status_kind(code: u16) -> Kind {
    match code {
        404 => Kind::NotFound,
        401 | 403 => Kind::Auth,
        429 | 502..=504 => Kind::Unavailable,
        _ => Kind::Other,
    }
}

/// Classifies an I/O error from a blob stream: a failed digest check inside
/// the client is corruption, anything else a broken transfer.
pub(crate) fn classify_io(e: &io::Error) -> Kind {
    match e.get_ref() {
        Some(inner) if inner.downcast_ref::<DigestError>().is_some() => Kind::Corrupt,
        _ => Kind::Unavailable,
    }
}

/// The error and its sources on one line (reqwest hides the useful part,
/// e.g. "connection refused", in the source chain).
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(src) = cur {
        let part = src.to_string();
        if !s.contains(&part) {
            s.push_str(": ");
            s.push_str(&part);
        }
        cur = src.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use oci_client::errors::{OciEnvelope, OciError};

    fn registry_error(code: OciErrorCode) -> OciDistributionError {
        OciDistributionError::RegistryError {
            envelope: OciEnvelope {
                errors: vec![OciError {
                    code,
                    message: "m".into(),
                    detail: serde_json::Value::Null,
                }],
            },
            url: "http://x/v2/".into(),
        }
    }

    #[test]
    fn kinds() {
        let k = |e: OciDistributionError| classify(&e).kind;
        assert_eq!(
            k(registry_error(OciErrorCode::ManifestUnknown)),
            Kind::NotFound
        );
        assert_eq!(k(registry_error(OciErrorCode::NameUnknown)), Kind::NotFound);
        assert_eq!(k(registry_error(OciErrorCode::Denied)), Kind::Auth);
        assert_eq!(
            k(registry_error(OciErrorCode::ManifestInvalid)),
            Kind::Other
        );
        let server = |code| OciDistributionError::ServerError {
            code,
            url: String::new(),
            message: String::new(),
        };
        assert_eq!(k(server(404)), Kind::NotFound);
        assert_eq!(k(server(401)), Kind::Auth);
        assert_eq!(k(server(503)), Kind::Unavailable);
        assert_eq!(k(server(500)), Kind::Other);
        let digest = DigestError::VerificationError {
            expected: "sha256:a".into(),
            actual: "sha256:b".into(),
        };
        assert_eq!(
            classify_io(&io::Error::other(digest)),
            Kind::Corrupt,
            "a digest failure inside a blob stream is corruption"
        );
        assert_eq!(
            classify_io(&io::Error::new(io::ErrorKind::UnexpectedEof, "eof")),
            Kind::Unavailable
        );
    }

    #[test]
    fn chain_names_sources_once() {
        let inner = io::Error::new(io::ErrorKind::ConnectionRefused, "connection refused");
        let outer = OciDistributionError::IoError(inner);
        assert_eq!(error_chain(&outer), "connection refused");
    }
}
