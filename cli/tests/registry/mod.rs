//! A real Docker Distribution registry (Debian's `docker-registry`) on a
//! free 127.0.0.1 port with its own storage, stopped by PID on drop. Shared
//! by the remote-cache tests and the `remote_e2e` bench.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const REGISTRY_BIN: &str = "/usr/bin/docker-registry";

/// A running `docker-registry serve`, killed (by PID) on drop.
pub struct Registry {
    child: Option<Child>,
    pub port: u16,
    pub dir: tempfile::TempDir,
}

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

fn answers(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let req = format!("GET /v2/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).is_ok() && line.contains(" 200")
}

impl Registry {
    pub fn start() -> Option<Registry> {
        if !registry_available() {
            return None;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let storage = dir.path().join("storage");
        std::fs::create_dir_all(&storage).expect("storage");
        for _ in 0..5 {
            let port = charly_testutil::free_port();
            let config = dir.path().join("config.yml");
            std::fs::write(
                &config,
                format!(
                    "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\n\
                     storage:\n  filesystem:\n    rootdirectory: {}\n\
                     http:\n  addr: 127.0.0.1:{port}\n  secret: charly-test\n",
                    storage.display()
                ),
            )
            .expect("config");
            let log = std::fs::File::create(dir.path().join("registry.log")).expect("log");
            let mut child = Command::new(REGISTRY_BIN)
                .arg("serve")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log"))
                .stderr(log)
                .spawn()
                .expect("spawn docker-registry");
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(30) {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                if answers(port) {
                    return Some(Registry {
                        child: Some(child),
                        port,
                        dir,
                    });
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("docker-registry did not start");
    }

    pub fn url(&self, repo: &str) -> String {
        format!("oci://127.0.0.1:{}/{repo}", self.port)
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Every blob file of the registry's storage.
    pub fn blob_files(&self) -> Vec<PathBuf> {
        walkdir::WalkDir::new(
            self.dir
                .path()
                .join("storage/docker/registry/v2/blobs/sha256"),
        )
        .into_iter()
        .flatten()
        .filter(|e| e.file_type().is_file() && e.file_name() == "data")
        .map(|e| e.into_path())
        .collect()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}
