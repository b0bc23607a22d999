//! A real Docker Distribution registry (Debian's `docker-registry`) for the
//! remote cache tests and benchmark: started on a free 127.0.0.1 port with
//! its own storage directory and config file, stopped by PID.
//!
//! Also: a tiny token service (the Distribution "token" auth scheme, as
//! GHCR, GitLab and Harbor use it) signing ES256 JWTs with a self-signed
//! certificate the registry trusts, an htpasswd file, and a raw HTTP GET for
//! looking at what the registry holds.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub const REGISTRY_BIN: &str = "/usr/bin/docker-registry";

/// Whether the registry binary is here; without it the tests fail (under
/// CI always; elsewhere unless `CHARLY_SKIP_REGISTRY=1`).
pub fn registry_available() -> bool {
    Path::new(REGISTRY_BIN).exists()
        || charly_testutil::missing_tool(
            REGISTRY_BIN,
            "CHARLY_SKIP_REGISTRY",
            "apt-get install docker-registry",
        )
}

/// How the registry authenticates clients.
pub enum Auth {
    /// Open to anyone.
    None,
    /// HTTP basic auth against an htpasswd file with this user and password.
    Htpasswd { user: String, pass: String },
    /// Bearer tokens from this token service.
    Token(Arc<TokenService>),
}

/// A running `docker-registry serve CONFIG.yml`.
pub struct Registry {
    child: Option<Child>,
    pub port: u16,
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
}

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local addr").port()
}

impl Registry {
    /// Starts an open registry. `None` only when skipping is allowed.
    pub fn start() -> Option<Registry> {
        Registry::start_with(Auth::None)
    }

    /// Starts a registry with the given authentication.
    pub fn start_with(auth: Auth) -> Option<Registry> {
        if !registry_available() {
            return None;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let storage = dir.path().join("storage");
        std::fs::create_dir_all(&storage).expect("storage dir");
        let auth_yaml = match &auth {
            Auth::None => String::new(),
            Auth::Htpasswd { user, pass } => {
                let hash = bcrypt::hash(pass, 4).expect("bcrypt");
                let file = dir.path().join("htpasswd");
                std::fs::write(&file, format!("{user}:{hash}\n")).expect("htpasswd");
                format!(
                    "auth:\n  htpasswd:\n    realm: charly-test\n    path: {}\n",
                    file.display()
                )
            }
            Auth::Token(ts) => {
                let cert = dir.path().join("token.crt");
                std::fs::write(&cert, &ts.cert_pem).expect("cert");
                format!(
                    "auth:\n  token:\n    realm: {}\n    service: {}\n    issuer: {}\n    rootcertbundle: {}\n",
                    ts.realm(),
                    TokenService::SERVICE,
                    TokenService::ISSUER,
                    cert.display()
                )
            }
        };
        // Another process may take the port between free_port() and the
        // registry binding it: retry a few times on a fresh port.
        let config = dir.path().join("config.yml");
        let log_path = dir.path().join("registry.log");
        for _ in 0..5 {
            let port = free_port();
            let yaml = format!(
                "version: 0.1\n\
                 log:\n  level: warn\n  accesslog:\n    disabled: true\n\
                 storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n\
                 http:\n  addr: 127.0.0.1:{port}\n  secret: charly-test-secret\n{auth_yaml}",
                storage.display()
            );
            std::fs::write(&config, yaml).expect("config");
            let log = std::fs::File::create(&log_path).expect("log");
            let mut child = Command::new(REGISTRY_BIN)
                .arg("serve")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log"))
                .stderr(log)
                .spawn()
                .expect("spawn docker-registry");
            if wait_ready(&mut child, port, Duration::from_secs(30)) {
                return Some(Registry {
                    child: Some(child),
                    port,
                    dir,
                    config,
                });
            }
            let _ = child.kill();
            let _ = child.wait();
            eprintln!(
                "docker-registry on port {port} did not come up; log:\n{}",
                std::fs::read_to_string(&log_path).unwrap_or_default()
            );
        }
        panic!("docker-registry did not start");
    }

    /// The PID of the registry process.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The registry's log so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// Kills the registry (by its PID) and reaps it.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// A remote cache URL for `repo` on this registry.
    pub fn url(&self, repo: &str) -> String {
        format!("oci://127.0.0.1:{}/{repo}", self.port)
    }

    /// Where the registry keeps the content of blob `sha256:<hex>`.
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
        self.dir
            .path()
            .join("storage/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Waits until `/v2/` answers; false if the process died or time ran out.
fn wait_ready(child: &mut Child, port: u16, limit: Duration) -> bool {
    let t = Instant::now();
    while t.elapsed() < limit {
        if let Ok(Some(_)) = child.try_wait() {
            return false;
        }
        if let Ok((status, _)) = http_get(port, "/v2/", &[])
            && (status == 200 || status == 401)
        {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// `GET path` over plain HTTP/1.1 on 127.0.0.1:port: (status, body).
pub fn http_get(
    port: u16,
    path: &str,
    headers: &[(&str, &str)],
) -> std::io::Result<(u16, Vec<u8>)> {
    http(port, "GET", path, headers, &[]).map(|(status, _, body)| (status, body))
}

/// An HTTP response: status, headers (lower-case names), body.
pub type HttpResponse = (u16, Vec<(String, String)>, Vec<u8>);

/// One request over plain HTTP/1.1 on 127.0.0.1:port (no charly code).
pub fn http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<HttpResponse> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut req =
        format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if method != "GET" {
        req.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())?;
    s.write_all(body)?;
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {line:?}")))?;
    let mut chunked = false;
    let mut len: Option<usize> = None;
    let mut got = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            let v = v.trim();
            if k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked") {
                chunked = true;
            }
            if k.eq_ignore_ascii_case("content-length") {
                len = v.parse().ok();
            }
            got.push((k.to_ascii_lowercase(), v.to_string()));
        }
    }
    let mut body = Vec::new();
    if method == "HEAD" {
    } else if chunked {
        loop {
            line.clear();
            r.read_line(&mut line)?;
            let n = usize::from_str_radix(line.trim(), 16).unwrap_or(0);
            if n == 0 {
                break;
            }
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk)?;
            body.extend_from_slice(&chunk[..n]);
        }
    } else if let Some(n) = len {
        body.resize(n, 0);
        r.read_exact(&mut body)?;
    } else {
        r.read_to_end(&mut body)?;
    }
    Ok((status, got, body))
}

fn b64(data: &[u8], url: bool) -> String {
    let table: &[u8; 64] = if url {
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    } else {
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    };
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let chars = chunk.len() + 1;
        for i in 0..4 {
            if i < chars {
                out.push(char::from(table[((n >> (18 - 6 * i)) & 63) as usize]));
            } else if !url {
                out.push('=');
            }
        }
    }
    out
}

fn b64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' | b'-' => 62,
            _ => 63,
        }
    };
    let clean: Vec<u8> = s.bytes().filter(|&c| c != b'=').collect();
    let mut out = Vec::new();
    for chunk in clean.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= val(c) << (18 - 6 * i);
        }
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..chunk.len().saturating_sub(1)]);
    }
    out
}

/// A Distribution token service: `GET /token?service=…&scope=…` with HTTP
/// basic credentials answers `{"token": JWT}` granting what the scope asks.
pub struct TokenService {
    pub port: u16,
    pub cert_pem: String,
    cert_der: Vec<u8>,
    key: ring::signature::EcdsaKeyPair,
    user: String,
    pass: String,
    stop: AtomicBool,
    thread: std::sync::Mutex<Option<JoinHandle<()>>>,
    /// Token requests served (successful or not).
    pub requests: std::sync::atomic::AtomicU64,
}

impl TokenService {
    pub const SERVICE: &'static str = "charly-test-registry";
    pub const ISSUER: &'static str = "charly-test-issuer";

    /// Starts the service, accepting `user`/`pass`.
    pub fn start(user: &str, pass: &str) -> Arc<TokenService> {
        let key_pair =
            rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("ec key");
        let params =
            rcgen::CertificateParams::new(vec!["charly-token-signer".to_string()]).expect("params");
        let cert = params.self_signed(&key_pair).expect("self-signed cert");
        let rng = ring::rand::SystemRandom::new();
        let key = ring::signature::EcdsaKeyPair::from_pkcs8(
            &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            &key_pair.serialize_der(),
            &rng,
        )
        .expect("ring key");
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        listener.set_nonblocking(true).expect("nonblocking");
        let ts = Arc::new(TokenService {
            port,
            cert_pem: cert.pem(),
            cert_der: cert.der().to_vec(),
            key,
            user: user.into(),
            pass: pass.into(),
            stop: AtomicBool::new(false),
            thread: std::sync::Mutex::new(None),
            requests: std::sync::atomic::AtomicU64::new(0),
        });
        let me = Arc::clone(&ts);
        let h = std::thread::spawn(move || {
            while !me.stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((s, _)) => {
                        let _ = s.set_nonblocking(false);
                        me.serve(s);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        *ts.thread.lock().expect("lock") = Some(h);
        ts
    }

    pub fn realm(&self) -> String {
        format!("http://127.0.0.1:{}/token", self.port)
    }

    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.thread.lock().expect("lock").take() {
            let _ = h.join();
        }
    }

    /// A signed token granting `actions` on `repo`.
    pub fn mint(&self, repo: &str, actions: &[&str]) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock")
            .as_secs();
        let header = serde_json::json!({
            "typ": "JWT",
            "alg": "ES256",
            "x5c": [b64(&self.cert_der, false)],
        });
        let claims = serde_json::json!({
            "iss": Self::ISSUER,
            "sub": self.user,
            "aud": Self::SERVICE,
            "exp": now + 600,
            "nbf": now - 60,
            "iat": now,
            "jti": format!("{now}-{}", self.requests.load(Ordering::Relaxed)),
            "access": [{"type": "repository", "name": repo, "actions": actions}],
        });
        let signing_input = format!(
            "{}.{}",
            b64(header.to_string().as_bytes(), true),
            b64(claims.to_string().as_bytes(), true)
        );
        let sig = self
            .key
            .sign(&ring::rand::SystemRandom::new(), signing_input.as_bytes())
            .expect("sign");
        format!("{signing_input}.{}", b64(sig.as_ref(), true))
    }

    fn serve(&self, s: TcpStream) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let mut r = BufReader::new(match s.try_clone() {
            Ok(c) => c,
            Err(_) => return,
        });
        let mut line = String::new();
        if r.read_line(&mut line).is_err() {
            return;
        }
        let target = line.split_whitespace().nth(1).unwrap_or("").to_string();
        let mut authorized = false;
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).is_err() || h.trim_end().is_empty() {
                break;
            }
            if let Some((k, v)) = h.trim_end().split_once(':')
                && k.eq_ignore_ascii_case("authorization")
                && let Some(enc) = v.trim().strip_prefix("Basic ")
            {
                let creds = String::from_utf8_lossy(&b64_decode(enc)).into_owned();
                authorized = creds == format!("{}:{}", self.user, self.pass);
            }
        }
        let query = target.split_once('?').map(|(_, q)| q).unwrap_or("");
        let mut scopes = Vec::new();
        for pair in query.split('&') {
            if let Some(v) = pair.strip_prefix("scope=") {
                scopes.push(percent_decode(v));
            }
        }
        let (status, body) = if !authorized {
            (
                "401 Unauthorized",
                r#"{"errors":[{"code":"UNAUTHORIZED"}]}"#.to_string(),
            )
        } else {
            // scope = repository:NAME:ACTIONS
            let (repo, actions) = scopes
                .first()
                .and_then(|s| {
                    let mut parts = s.splitn(3, ':');
                    let _ = parts.next();
                    Some((parts.next()?.to_string(), parts.next()?.to_string()))
                })
                .unwrap_or_default();
            let actions: Vec<&str> = actions.split(',').filter(|a| !a.is_empty()).collect();
            let token = self.mint(&repo, &actions);
            (
                "200 OK",
                serde_json::json!({"token": token, "expires_in": 600}).to_string(),
            )
        };
        let mut w = s;
        let _ = write!(
            w,
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    }
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Drop for TokenService {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Deterministic pseudo-random bytes, unique per seed.
pub fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A reader of `len` pseudo-random, fairly compressible bytes (tar-like:
/// runs of words and zeros) that never holds them all in memory.
pub struct Generated {
    x: u64,
    left: u64,
    buf: Vec<u8>,
    pos: usize,
}

impl Generated {
    pub fn new(seed: u64, len: u64) -> Generated {
        Generated {
            x: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            left: len,
            buf: Vec::new(),
            pos: 0,
        }
    }
}

impl Read for Generated {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.pos == self.buf.len() {
            if self.left == 0 {
                return Ok(0);
            }
            self.buf.clear();
            self.pos = 0;
            while self.buf.len() < 64 * 1024 {
                self.x ^= self.x << 13;
                self.x ^= self.x >> 7;
                self.x ^= self.x << 17;
                let n = (self.x % 24) as usize;
                match self.x % 4 {
                    0 => self.buf.extend(std::iter::repeat_n(0u8, n * 8)),
                    1 => self.buf.extend_from_slice(b"usr/lib/node_modules/"),
                    _ => self.buf.extend_from_slice(&self.x.to_le_bytes()[..n % 8]),
                }
            }
            let take = (self.buf.len() as u64).min(self.left) as usize;
            self.buf.truncate(take);
            self.left -= take as u64;
        }
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}
