//! A real REAPI engine for tests: buildbox-casd serving CAS, ActionCache
//! and Execution (with buildbox-run, which sandboxes actions with
//! bubblewrap) on 127.0.0.1, started on a free port and stopped by PID.
//!
//! The binaries come from `.ci/install-buildbox` (`.ci/buildbox/`), or
//! `CHARLY_BUILDBOX_DIR`. Without them a test is skipped, except under CI
//! (`CI=true`), where that is a failure.

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
        // A test that failed shows how the engine ended: still running, or
        // exited (a crash, a failed bind), and what it logged.
        if std::thread::panicking() {
            let status = match self.child.try_wait() {
                Ok(Some(s)) => format!("exited with {s}"),
                Ok(None) => "still running".to_string(),
                Err(e) => format!("unknown ({e})"),
            };
            let log = std::fs::read_to_string(self._tmp.path().join("casd.log"))
                .unwrap_or_else(|e| format!("(no log: {e})"));
            eprintln!("buildbox-casd at {}: {status}; its log:\n{log}", self.url);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn buildbox_dir() -> Option<PathBuf> {
    let mut cands = Vec::new();
    if let Ok(d) = std::env::var("CHARLY_BUILDBOX_DIR") {
        cands.push(PathBuf::from(d));
    }
    cands.push(crate::workspace().join(".ci/buildbox"));
    cands
        .into_iter()
        .find(|d| d.join("buildbox-casd").is_file() && d.join("buildbox-run").is_file())
}

/// Whether the engine can run here; panics under CI when it cannot.
pub fn available() -> bool {
    let ok = buildbox_dir().is_some() && Path::new("/usr/bin/bwrap").exists();
    ok || crate::missing_tool(
        "buildbox-casd/buildbox-run or bubblewrap",
        "CHARLY_SKIP_REAPI",
        "run .ci/install",
    )
}

/// The host's tools, read-only, for actions that bring no root filesystem:
/// Debian 12 has a merged /usr, so /bin, /lib and /lib64 are /usr's.
pub const HOST_TOOLS: &[&str] = &[
    "/usr:/usr",
    "/usr/bin:/bin",
    "/usr/lib:/lib",
    "/usr/lib64:/lib64",
];

/// Starts buildbox-casd with local execution (`jobs` actions at once),
/// actions seeing the host's tools ([`HOST_TOOLS`]).
pub fn start(jobs: usize) -> Casd {
    start_with(jobs, HOST_TOOLS)
}

/// Starts buildbox-casd whose sandbox bind-mounts `mounts` (`HOST:SANDBOX`)
/// into every action; with none, an action sees only its input root (which
/// then carries a whole root filesystem).
///
/// The port is free when chosen but another process may take it before
/// casd binds it; a casd that exits instead of serving is started again on
/// another port, so a test never talks to a server that is not its own.
pub fn start_with(jobs: usize, mounts: &[&str]) -> Casd {
    let mut last = String::new();
    for _ in 0..3 {
        match try_start(jobs, mounts) {
            Ok(casd) => return casd,
            Err(e) => last = e,
        }
    }
    panic!("buildbox-casd did not start: {last}");
}

fn try_start(jobs: usize, mounts: &[&str]) -> Result<Casd, String> {
    let bin = buildbox_dir().expect("buildbox binaries");
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("cas");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let port = crate::free_port();
    let log = std::fs::File::create(tmp.path().join("casd.log")).expect("log");
    // casd and the runners it spawns keep each action's files in a temp
    // directory they do not always remove: keep them in the test's own.
    let scratch = tmp.path().join("tmp");
    std::fs::create_dir_all(&scratch).expect("mkdir");
    let mut cmd = Command::new(bin.join("buildbox-casd"));
    cmd.env("TMPDIR", &scratch)
        .arg(format!("--bind=127.0.0.1:{port}"))
        .arg(format!(
            "--buildbox-run={}",
            bin.join("buildbox-run").display()
        ))
        .arg(format!("--jobs={jobs}"));
    for m in mounts {
        cmd.arg(format!("--runner-arg=--bind-mount={m}"));
    }
    cmd.arg(&dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log);
    let child = cmd.spawn().expect("start buildbox-casd");
    let log_path = tmp.path().join("casd.log");
    let mut casd = Casd {
        child,
        url: format!("grpc://127.0.0.1:{port}"),
        dir,
        _tmp: tmp,
    };
    let exited = |casd: &mut Casd| -> Option<String> {
        let status = casd.child.try_wait().ok().flatten()?;
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        Some(format!("port {port}: exited with {status}: {log}"))
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !crate::listens(port) {
        if let Some(e) = exited(&mut casd) {
            return Err(e);
        }
        if Instant::now() >= deadline {
            return Err(format!("port {port}: did not listen within 20 s"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // Something listens; make sure it is this casd, not a process that
    // took the port first (casd then exits on the failed bind).
    std::thread::sleep(Duration::from_millis(100));
    match exited(&mut casd) {
        Some(e) => Err(e),
        None if !crate::listens(port) => Err(format!("port {port}: stopped listening")),
        None => Ok(casd),
    }
}

#[cfg(feature = "engine")]
/// A podman runner with its own storage under `dir`, and the busybox root
/// filesystem imported as image `tag` (`changes`: `podman import --change`
/// instructions such as `ENV A=b`).
pub fn podman_with_image(
    dir: &Path,
    tag: &str,
    changes: &[&str],
) -> charly_engine::runners::podman::PodmanRunner {
    use charly_engine::runners::podman::{PodmanOptions, PodmanRunner};
    let podman = PodmanRunner::new(PodmanOptions {
        root: Some(dir.join("podman")),
        conf_dir: dir.to_path_buf(),
        ca_bundle: None,
        offline: true,
        jobs: 1,
    })
    .expect("podman");
    let tar = crate::busybox_rootfs_tar(dir);
    let mut cmd = podman.cmd();
    cmd.args(["import", "-q"]);
    for c in changes {
        cmd.arg("--change").arg(c);
    }
    let out = cmd.arg(&tar).arg(tag).output().expect("podman import");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    podman
}
