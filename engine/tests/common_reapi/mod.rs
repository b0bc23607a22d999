//! A real REAPI engine for tests: buildbox-casd serving CAS, ActionCache
//! and Execution (with buildbox-run, which sandboxes actions with
//! bubblewrap) on 127.0.0.1, started on a free port and stopped by PID.
//!
//! The binaries come from `.ci/install-buildbox` (`.ci/buildbox/`), or
//! `CHARLY_BUILDBOX_DIR`. Without them a test is skipped, except under CI
//! (`CI=true`), where that is a failure.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running buildbox-casd.
pub struct Casd {
    child: Child,
    /// `grpc://127.0.0.1:PORT`.
    pub url: String,
    /// Its storage directory.
    pub dir: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Drop for Casd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn buildbox_dir() -> Option<PathBuf> {
    let mut cands = Vec::new();
    if let Ok(d) = std::env::var("CHARLY_BUILDBOX_DIR") {
        cands.push(PathBuf::from(d));
    }
    // From the engine crate's tests and from the workspace root's.
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    cands.push(here.join("../.ci/buildbox"));
    cands.push(here.join(".ci/buildbox"));
    cands
        .into_iter()
        .find(|d| d.join("buildbox-casd").is_file() && d.join("buildbox-run").is_file())
}

/// Whether the engine can run here; panics under CI when it cannot.
pub fn available() -> bool {
    let ok = buildbox_dir().is_some() && Path::new("/usr/bin/bwrap").exists();
    if !ok {
        assert!(
            std::env::var("CI").is_err(),
            "buildbox-casd/buildbox-run or bubblewrap missing: run .ci/install"
        );
        eprintln!("skipping: buildbox-casd/buildbox-run or bwrap missing (run .ci/install)");
    }
    ok
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// Starts buildbox-casd with local execution (`jobs` actions at once).
pub fn start(jobs: usize) -> Casd {
    let bin = buildbox_dir().expect("buildbox binaries");
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("cas");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let port = free_port();
    let log = std::fs::File::create(tmp.path().join("casd.log")).expect("log");
    let mut cmd = Command::new(bin.join("buildbox-casd"));
    cmd.arg(format!("--bind=127.0.0.1:{port}"))
        .arg(format!(
            "--buildbox-run={}",
            bin.join("buildbox-run").display()
        ))
        .arg(format!("--jobs={jobs}"));
    // Actions see the host's tools read-only: Debian 12 has a merged /usr,
    // so /bin, /lib and /lib64 are /usr's.
    for m in [
        "/usr:/usr",
        "/usr/bin:/bin",
        "/usr/lib:/lib",
        "/usr/lib64:/lib64",
    ] {
        cmd.arg(format!("--runner-arg=--bind-mount={m}"));
    }
    cmd.arg(&dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log);
    let child = cmd.spawn().expect("start buildbox-casd");
    let casd = Casd {
        child,
        url: format!("grpc://127.0.0.1:{port}"),
        dir,
        _tmp: tmp,
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "buildbox-casd did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    casd
}
