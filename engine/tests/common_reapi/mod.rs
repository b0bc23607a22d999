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
pub fn start_with(jobs: usize, mounts: &[&str]) -> Casd {
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
    for m in mounts {
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

/// Writes `body` at `root/rel`, creating directories.
pub fn write(root: &Path, rel: &str, body: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(p, body).expect("write");
}

/// Whether podman runs; under CI its absence is a failure.
pub fn podman_available() -> bool {
    let ok = Command::new("podman")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("CI").is_err(),
            "podman is not installed (.ci/install)"
        );
        eprintln!("skipping: podman is not installed");
    }
    ok
}

/// A busybox-static root filesystem tar (an image for local reference
/// runs, and a root filesystem for remote ones): busybox and its applets in
/// /bin, users root and `user` (1000), a world-writable /tmp.
pub fn busybox_rootfs_tar(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let root = dir.join("bbroot");
    for d in ["bin", "etc", "tmp", "root"] {
        std::fs::create_dir_all(root.join(d)).expect("mkdir");
    }
    std::fs::set_permissions(root.join("tmp"), std::fs::Permissions::from_mode(0o1777))
        .expect("chmod /tmp");
    std::fs::copy("/bin/busybox", root.join("bin/busybox"))
        .expect("busybox-static is installed (apt install busybox-static)");
    let list = Command::new("/bin/busybox")
        .arg("--list")
        .output()
        .expect("busybox --list");
    for applet in String::from_utf8_lossy(&list.stdout).lines() {
        let _ = std::os::unix::fs::symlink("busybox", root.join("bin").join(applet));
    }
    std::fs::write(
        root.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n",
    )
    .expect("passwd");
    std::fs::write(root.join("etc/group"), "root:x:0:\nuser:x:1000:\n").expect("group");
    let tar = dir.join("busybox.tar");
    let st = Command::new("tar")
        .arg("-C")
        .arg(&root)
        .args(["--numeric-owner", "-cf"])
        .arg(&tar)
        .arg(".")
        .status()
        .expect("tar");
    assert!(st.success());
    tar
}

/// A podman runner with its own storage under `dir`, and the busybox root
/// filesystem imported as image `tag` (`changes`: `podman import --change`
/// instructions such as `ENV A=b`).
pub fn podman_with_image(
    dir: &Path,
    tag: &str,
    changes: &[&str],
) -> charly_engine::podman::PodmanRunner {
    use charly_engine::podman::{PodmanOptions, PodmanRunner};
    let podman = PodmanRunner::new(PodmanOptions {
        root: Some(dir.join("podman")),
        conf_dir: dir.to_path_buf(),
        ca_bundle: None,
        jobs: 1,
    })
    .expect("podman");
    let tar = busybox_rootfs_tar(dir);
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
