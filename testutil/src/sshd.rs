//! A real sshd for tests, on a free 127.0.0.1 port, with generated ed25519
//! keys in the test's directory `t`: `t/hostkey`, `t/userkey` (the client
//! key, authorized for root), `t/known_hosts` (the host key, pinned), the
//! daemon's log in `t/sshd.log`. Needs root (a root login) and
//! openssh-server (`.ci/install`).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// A running sshd; stopped when dropped.
pub struct Sshd(Child);

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Generates an ed25519 key pair at `path` and `path.pub`.
pub fn keygen(path: &Path) {
    let out = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path)
        .output()
        .expect("ssh-keygen (openssh-client, see .ci/install)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether a test that needs root (sshd with a root login, mount
/// namespaces) can run; under CI (`CI` set) not being root is a failure.
pub fn root_available(what: &str) -> bool {
    let root = rustix_free_geteuid() == 0;
    if !root {
        assert!(!crate::under_ci(), "needs root under CI: {what}");
        eprintln!("skipped: needs root ({what})");
    }
    root
}

fn rustix_free_geteuid() -> u32 {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
        .unwrap_or(u32::MAX)
}

/// A session wrapper: every session runs in a private mount namespace with
/// `home` bound over /root (the root login's home).
pub fn home_wrap(home: &Path) -> String {
    format!(
        "#!/bin/sh\nexec unshare -m --propagation private /bin/sh -c 'mount --bind \"$1\" /root && exec /bin/sh -c \"$SSH_ORIGINAL_COMMAND\"' wrap {}\n",
        home.display()
    )
}

/// A session wrapper: every session chrooted into the guest root
/// filesystem `guest` (its own /etc, package database and /root), with
/// /proc and /dev mounted in a private mount namespace: a separate system
/// as far as a deploy can tell.
pub fn guest_wrap(guest: &Path) -> String {
    guest_wrap_as(guest, None)
}

/// [`guest_wrap`], with every session running as `user` (an account of
/// the guest) instead of the login.
pub fn guest_wrap_as(guest: &Path, user: Option<&str>) -> String {
    let spec = user
        .map(|u| format!("--userspec={u}:{u} "))
        .unwrap_or_default();
    format!(
        "#!/bin/sh\nexec unshare -m --propagation private /bin/sh -c 'mount -t proc proc \"$1/proc\" && mount --bind /dev \"$1/dev\" && exec chroot {spec}\"$1\" /bin/sh -c \"$SSH_ORIGINAL_COMMAND\"' wrap {}\n",
        guest.display()
    )
}

/// Starts sshd with its files in `t`; with `wrap` (a script, see
/// [`home_wrap`], [`guest_wrap`]), every session runs through it. Returns
/// the daemon and its port once it accepts connections.
pub fn start(t: &Path, wrap: Option<&str>) -> (Sshd, u16) {
    let port = prepare(t);
    (launch(t, wrap, port), port)
}

/// What [`start`] does before the daemon runs: the keys, `known_hosts`
/// and a free port (returned), so a client can be pointed at a machine
/// that does not answer yet; [`launch`] then starts it there.
pub fn prepare(t: &Path) -> u16 {
    keygen(&t.join("hostkey"));
    keygen(&t.join("userkey"));
    std::fs::copy(t.join("userkey.pub"), t.join("authorized_keys")).expect("authorized");
    let port = crate::free_port();
    let pubkey = std::fs::read_to_string(t.join("hostkey.pub")).expect("pub");
    std::fs::write(
        t.join("known_hosts"),
        format!("[127.0.0.1]:{port} {pubkey}"),
    )
    .expect("known_hosts");
    port
}

/// Starts sshd on `port` with the files [`prepare`] made in `t`; returns
/// once it accepts connections.
pub fn launch(t: &Path, wrap: Option<&str>, port: u16) -> Sshd {
    let mut text = format!(
        "Port {port}\nListenAddress 127.0.0.1\nHostKey {t}/hostkey\nAuthorizedKeysFile {t}/authorized_keys\nPidFile {t}/sshd.pid\nUsePAM no\nStrictModes no\nPermitRootLogin prohibit-password\nLogLevel DEBUG1\n",
        t = t.display()
    );
    if let Some(script) = wrap {
        let w = t.join("wrap.sh");
        std::fs::write(&w, script).expect("wrap");
        std::fs::set_permissions(&w, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        text.push_str(&format!("ForceCommand {}\n", w.display()));
    }
    let cfg = t.join("sshd_config");
    std::fs::write(&cfg, text).expect("cfg");
    std::fs::create_dir_all("/run/sshd").expect("/run/sshd");
    let child = std::process::Command::new("/usr/sbin/sshd")
        .args(["-D", "-e", "-f"])
        .arg(&cfg)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(t.join("sshd.log")).expect("log"))
        .spawn()
        .expect("sshd (openssh-server, see .ci/install)");
    let d = Sshd(child);
    let t0 = Instant::now();
    while !crate::listens(port) {
        assert!(t0.elapsed() < Duration::from_secs(10), "sshd did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    d
}
