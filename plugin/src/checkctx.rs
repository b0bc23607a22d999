//! `CheckContextService`: the host-vantage legs of a check verb served out
//! of process (plugin.proto, F2). The host serves it on the same broker
//! connection as `ExecutorService` (the same `executor_broker_id`), as the
//! original does, so a verb reaches both the venue and these legs with one
//! dial.
//!
//! * `HTTPDo` issues the request from charly's own network namespace with
//!   the request's policy, as the original's `doHTTPRequest` does: method
//!   (default `GET`), headers (set, one value each), body; `timeout` a Go
//!   duration (`"1m30s"`; empty or unreadable: [`BASE_TIMEOUT`]);
//!   `allow_insecure` skips certificate verification; `ca_pem` replaces the
//!   system's roots with its certificates (none readable is an error);
//!   `no_follow_redirects` answers the redirect itself (else up to 10 are
//!   followed); no proxy (Go's fresh `http.Transport` uses none). The reply
//!   is the status, the body and the headers as a `Key: value\n` blob, one
//!   line per value, names in Go's canonical form (`Content-Type`), sorted.
//!   A request that fails answers the failure in `error` (the RPC itself
//!   succeeds).
//! * `AddBackground` (register a host-side background process for reaping
//!   when the plan run ends) answers UNIMPLEMENTED with a message saying this
//!   host does not support it: charly runs no plan-scoped reaper, and
//!   accepting a pid it will never reap would leak the process silently.

use std::time::Duration;

use tonic::{Request, Response, Status};

use crate::proto::charly as pb;

/// `HTTPDo`'s timeout when the request names none.
pub const BASE_TIMEOUT: Duration = Duration::from_secs(30);

/// The host's `CheckContextService`.
pub(crate) struct HostCheckContext;

#[tonic::async_trait]
impl pb::check_context_service_server::CheckContextService for HostCheckContext {
    async fn http_do(
        &self,
        req: Request<pb::HttpDoRequest>,
    ) -> Result<Response<pb::HttpDoReply>, Status> {
        let reply = match http_do(req.into_inner()).await {
            Ok(r) => r,
            Err(error) => pb::HttpDoReply {
                error,
                ..Default::default()
            },
        };
        Ok(Response::new(reply))
    }

    async fn add_background(
        &self,
        req: Request<pb::AddBackgroundRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        Err(Status::unimplemented(format!(
            "AddBackground (pid {}) is not supported by this host: charly does not reap background processes of check verbs",
            req.into_inner().pid
        )))
    }
}

async fn http_do(req: pb::HttpDoRequest) -> Result<pb::HttpDoReply, String> {
    let client = client_for(&req)?;
    let method = if req.method.is_empty() {
        reqwest::Method::GET
    } else {
        reqwest::Method::from_bytes(req.method.as_bytes())
            .map_err(|e| format!("method {:?}: {e}", req.method))?
    };
    let mut r = client.request(method, &req.url);
    for (k, v) in &req.headers {
        r = r.header(k, v);
    }
    if !req.body.is_empty() {
        r = r.body(req.body);
    }
    let resp = r.send().await.map_err(|e| error_chain(&e))?;
    let status = i32::from(resp.status().as_u16());
    let header_blob = header_blob(resp.headers());
    let body = resp.bytes().await.map_err(|e| error_chain(&e))?;
    Ok(pb::HttpDoReply {
        status,
        body: body.to_vec(),
        header_blob,
        error: String::new(),
    })
}

/// A client with the request's policy (a fresh one per request, as the
/// original builds one per request).
fn client_for(req: &pb::HttpDoRequest) -> Result<reqwest::Client, String> {
    let timeout = parse_go_duration(&req.timeout).unwrap_or(BASE_TIMEOUT);
    let builder = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let tls = if req.allow_insecure {
        builder
            .dangerous()
            .with_custom_certificate_verifier(crate::tls::AnyServerCert::new())
            .with_no_client_auth()
    } else {
        let mut roots = rustls::RootCertStore::empty();
        if req.ca_pem.is_empty() {
            for c in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(c);
            }
        } else {
            use rustls::pki_types::CertificateDer;
            use rustls::pki_types::pem::PemObject;
            for c in CertificateDer::pem_slice_iter(&req.ca_pem).flatten() {
                let _ = roots.add(c);
            }
            if roots.is_empty() {
                return Err("no certs parsed from CA PEM".into());
            }
        }
        builder.with_root_certificates(roots).with_no_client_auth()
    };
    let redirects = if req.no_follow_redirects {
        reqwest::redirect::Policy::none()
    } else {
        reqwest::redirect::Policy::limited(10)
    };
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .timeout(timeout)
        .redirect(redirects)
        .no_proxy()
        .build()
        .map_err(|e| error_chain(&e))
}

/// `Key: value\n` per value, names in Go's canonical form, sorted by name
/// (Go's map order is random; a stable order reads better).
fn header_blob(h: &reqwest::header::HeaderMap) -> String {
    let mut lines: Vec<(String, String)> = h
        .iter()
        .map(|(k, v)| {
            (
                canonical_header(k.as_str()),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    // Stable: the values of one name keep their order.
    lines.sort_by(|a, b| a.0.cmp(&b.0));
    lines
        .into_iter()
        .map(|(k, v)| format!("{k}: {v}\n"))
        .collect()
}

/// Go's `CanonicalMIMEHeaderKey`: `content-type` → `Content-Type`.
fn canonical_header(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = true;
    for c in name.chars() {
        out.push(if upper {
            c.to_ascii_uppercase()
        } else {
            c.to_ascii_lowercase()
        });
        upper = c == '-';
    }
    out
}

/// Go's `time.ParseDuration` (`300ms`, `1.5h`, `2h45m`); `None` for the
/// empty string or what Go would reject (negative durations too).
fn parse_go_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    let s = s.strip_prefix('+').unwrap_or(s);
    if s == "0" {
        return Some(Duration::ZERO);
    }
    let mut rest = s;
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_end == 0 {
            return None;
        }
        let n: f64 = rest[..num_end].parse().ok()?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let nanos = match &rest[..unit_end] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        rest = &rest[unit_end..];
        total += n * nanos;
    }
    Some(Duration::from_nanos(total.round() as u64))
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let t = s.to_string();
        if !out.contains(&t) {
            out.push_str(": ");
            out.push_str(&t);
        }
        cur = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration(""), None);
        assert_eq!(parse_go_duration("0"), Some(Duration::ZERO));
        assert_eq!(parse_go_duration("300ms"), Some(Duration::from_millis(300)));
        assert_eq!(parse_go_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("1.5h"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_go_duration("2us"), Some(Duration::from_micros(2)));
        for bad in ["5", "-1s", "1x", "s", "1s2"] {
            assert_eq!(parse_go_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn header_names_are_canonical() {
        assert_eq!(canonical_header("content-type"), "Content-Type");
        assert_eq!(canonical_header("x-charly"), "X-Charly");
        assert_eq!(canonical_header("etag"), "Etag");
    }
}
