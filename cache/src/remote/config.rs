//! Configuration of the remote cache: where the registry is, how to log in,
//! and how the build treats it.

use std::fmt;

use crate::CacheError;

/// Environment variable with the registry user name (basic auth).
pub const ENV_USER: &str = "CHARLY_REMOTE_USER";
/// Environment variable with the registry password or access token used
/// together with [`ENV_USER`].
pub const ENV_PASSWORD: &str = "CHARLY_REMOTE_PASSWORD";
/// Environment variable with a registry bearer token, sent as is.
pub const ENV_TOKEN: &str = "CHARLY_REMOTE_TOKEN";

/// How to authenticate to the registry.
///
/// `Basic` credentials work with both registry schemes in use: registries
/// that ask for HTTP basic auth directly (htpasswd) get them on every
/// request, registries with a token service (GHCR, GitLab, Harbor, Docker
/// Hub, ECR through its Docker login) get them once in exchange for a
/// short-lived bearer token. `Bearer` sends a token the caller already has.
#[derive(Clone, PartialEq, Eq, Default)]
pub enum RemoteAuth {
    /// No credentials (a public or loopback registry).
    #[default]
    Anonymous,
    /// User name and password (or personal access token).
    Basic {
        /// User name.
        user: String,
        /// Password or access token.
        pass: String,
    },
    /// A registry bearer token, sent as `Authorization: Bearer …`.
    Bearer {
        /// The token.
        token: String,
    },
}

impl fmt::Debug for RemoteAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print secrets, not even in debug output.
        match self {
            RemoteAuth::Anonymous => f.write_str("Anonymous"),
            RemoteAuth::Basic { user, .. } => write!(f, "Basic({user}, <redacted>)"),
            RemoteAuth::Bearer { .. } => f.write_str("Bearer(<redacted>)"),
        }
    }
}

impl RemoteAuth {
    /// Credentials from `CHARLY_REMOTE_TOKEN` (bearer) or
    /// `CHARLY_REMOTE_USER` + `CHARLY_REMOTE_PASSWORD` (basic), else anonymous.
    pub fn from_env() -> RemoteAuth {
        RemoteAuth::from_vars(|name| std::env::var(name).ok())
    }

    /// [`RemoteAuth::from_env`] over an arbitrary lookup.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> RemoteAuth {
        let set = |name: &str| var(name).filter(|v| !v.is_empty());
        if let Some(token) = set(ENV_TOKEN) {
            return RemoteAuth::Bearer { token };
        }
        match (set(ENV_USER), set(ENV_PASSWORD)) {
            (Some(user), Some(pass)) => RemoteAuth::Basic { user, pass },
            _ => RemoteAuth::Anonymous,
        }
    }
}

/// Everything [`Remote::open`](crate::remote::Remote::open) needs.
#[derive(Debug, Clone)]
pub struct RemoteConfig {
    /// The registry repository: `oci://HOST[:PORT]/REPO` (TLS unless
    /// `insecure_http`), `https://HOST[:PORT]/REPO`, or
    /// `http://HOST[:PORT]/REPO` (always plain HTTP).
    pub url: String,
    /// Read, never write (`--remote-read-only`: untrusted jobs such as pull
    /// requests must not be able to poison the shared cache).
    pub read_only: bool,
    /// Remote failures fail the build (`--remote-required`); otherwise they
    /// are reported and the build goes on with local work.
    pub required: bool,
    /// Speak plain HTTP to an `oci://` URL. [`RemoteConfig::new`] turns it on
    /// for loopback hosts only (`127.0.0.0/8`, `localhost`, `[::1]`).
    pub insecure_http: bool,
    /// Credentials.
    pub auth: RemoteAuth,
    /// Records pushed at the same time in the background (at least 1).
    pub push_concurrency: usize,
}

impl RemoteConfig {
    /// A configuration for `url` with the defaults: read-write, not
    /// required, plain HTTP only for loopback hosts, credentials from the
    /// environment ([`RemoteAuth::from_env`]), 4 concurrent pushes.
    pub fn new(url: impl Into<String>) -> RemoteConfig {
        let url = url.into();
        let insecure_http = split_url(&url)
            .map(|(_, host, _)| is_loopback_registry(host))
            .unwrap_or(false);
        RemoteConfig {
            url,
            read_only: false,
            required: false,
            insecure_http,
            auth: RemoteAuth::from_env(),
            push_concurrency: 4,
        }
    }
}

/// A parsed remote location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// `HOST[:PORT]` as the registry is addressed.
    pub(crate) registry: String,
    /// Repository path inside the registry.
    pub(crate) repository: String,
    /// Plain HTTP instead of TLS.
    pub(crate) plain_http: bool,
}

/// `(scheme, host[:port], repository)`; the scheme defaults to `oci`.
fn split_url(url: &str) -> Option<(&str, &str, &str)> {
    let (scheme, rest) = match url.split_once("://") {
        Some((s, r)) => (s, r),
        None => ("oci", url),
    };
    let (host, repo) = rest.split_once('/')?;
    Some((scheme, host, repo.trim_end_matches('/')))
}

/// The host part of `host[:port]` (also `[v6]:port`).
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    host.rsplit_once(':').map_or(host, |(h, _)| h)
}

/// Whether a registry addressed as `HOST[:PORT]` (also `[v6]:port`) is on
/// the loopback interface (`localhost`, `127.0.0.0/8`, `::1`): spoken to
/// over plain HTTP by default.
pub fn is_loopback_registry(host_port: &str) -> bool {
    is_loopback(host_name(host_port))
}

fn is_loopback(host: &str) -> bool {
    if host.eq_ignore_ascii_case("localhost") || host == "::1" {
        return true;
    }
    host.parse::<std::net::Ipv4Addr>()
        .is_ok_and(|ip| ip.is_loopback())
}

/// Whether `s` is a valid repository path (Distribution spec grammar:
/// lowercase components separated by `/`, each `[a-z0-9]+` joined by `.`,
/// `_`, `__` or runs of `-`).
fn valid_repository(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 255
        && s.split('/').all(|comp| {
            let b = comp.as_bytes();
            let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
            if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
                return false;
            }
            let mut i = 0;
            while i < b.len() {
                if alnum(b[i]) {
                    i += 1;
                    continue;
                }
                let start = i;
                while i < b.len() && !alnum(b[i]) {
                    i += 1;
                }
                let sep = &comp[start..i];
                let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|c| c == b'-');
                if !ok {
                    return false;
                }
            }
            true
        })
}

impl Target {
    /// Parses and checks `cfg.url`.
    pub(crate) fn parse(cfg: &RemoteConfig) -> Result<Target, CacheError> {
        let bad = |why: &str| CacheError::Io {
            action: "parsing remote cache URL",
            path: cfg.url.clone().into(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, why.to_string()),
        };
        let (scheme, host, repository) =
            split_url(&cfg.url).ok_or_else(|| bad("expected oci://HOST[:PORT]/REPOSITORY"))?;
        let plain_http = match scheme {
            "oci" => cfg.insecure_http,
            "http" => true,
            "https" => false,
            _ => return Err(bad("the scheme must be oci://, https:// or http://")),
        };
        if host.is_empty() || host.contains(['@', '?', '#', ' ']) {
            return Err(bad("missing or invalid registry host"));
        }
        if !valid_repository(repository) {
            return Err(bad(
                "the repository must be lowercase path components ([a-z0-9] joined by '.', '_', '__' or '-')",
            ));
        }
        Ok(Target {
            registry: host.to_string(),
            repository: repository.to_string(),
            plain_http,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(url: &str) -> Result<Target, CacheError> {
        Target::parse(&RemoteConfig::new(url))
    }

    #[test]
    fn urls() {
        let t = target("oci://127.0.0.1:5000/charly/cache").expect("parses");
        assert_eq!(t.registry, "127.0.0.1:5000");
        assert_eq!(t.repository, "charly/cache");
        assert!(t.plain_http, "loopback defaults to plain HTTP");

        let t = target("oci://ghcr.io/acme/charly-cache").expect("parses");
        assert!(!t.plain_http, "remote hosts default to TLS");
        assert_eq!(t.registry, "ghcr.io");

        assert!(
            target("http://reg.example:80/a")
                .expect("parses")
                .plain_http
        );
        assert!(
            !target("https://localhost:5000/a")
                .expect("parses")
                .plain_http
        );
        assert!(target("localhost:5000/a/b/").expect("parses").plain_http);
        assert!(target("oci://[::1]:5000/a").expect("parses").plain_http);

        let mut cfg = RemoteConfig::new("oci://reg.internal:5000/cache");
        assert!(!cfg.insecure_http);
        cfg.insecure_http = true;
        assert!(Target::parse(&cfg).expect("parses").plain_http);
    }

    #[test]
    fn bad_urls() {
        for url in [
            "oci://host",
            "oci:///repo",
            "ftp://host/repo",
            "oci://host/Upper",
            "oci://host/a//b",
            "oci://host/-a",
            "oci://host/a..b",
            "oci://user@host/a",
        ] {
            assert!(target(url).is_err(), "{url} accepted");
        }
        for url in ["oci://h/a-b", "oci://h/a--b/c_d", "oci://h/a__b.c/x9"] {
            assert!(target(url).is_ok(), "{url} rejected");
        }
    }

    #[test]
    fn auth_from_vars() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_string())
            }
        };
        assert_eq!(RemoteAuth::from_vars(vars(&[])), RemoteAuth::Anonymous);
        assert_eq!(
            RemoteAuth::from_vars(vars(&[(ENV_USER, "u"), (ENV_PASSWORD, "p")])),
            RemoteAuth::Basic {
                user: "u".into(),
                pass: "p".into()
            }
        );
        assert_eq!(
            RemoteAuth::from_vars(vars(&[
                (ENV_USER, "u"),
                (ENV_PASSWORD, "p"),
                (ENV_TOKEN, "t")
            ])),
            RemoteAuth::Bearer { token: "t".into() }
        );
        assert_eq!(
            RemoteAuth::from_vars(vars(&[(ENV_USER, "u")])),
            RemoteAuth::Anonymous
        );
        let shown = format!(
            "{:?}",
            RemoteAuth::Basic {
                user: "u".into(),
                pass: "secret".into()
            }
        );
        assert!(!shown.contains("secret"));
    }
}
