//! The SSH host against a real sshd the test starts on a free 127.0.0.1
//! port (generated ed25519 keys): constructed env, stdin, exit codes,
//! atomic writes with mode and owner, batched stat with digests, tar
//! extraction, a timeout that leaves the connection usable, and refusal
//! of unknown or changed host keys. All paths are inside the test's dir.

use charly_engine::deploy::host::{Cmd, FileAttrs, Host, HostError, PathKind};
use charly_engine::deploy::ssh::{SshHost, SshTarget};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

struct Sshd(Child);

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn keygen(path: &Path) {
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

fn start(t: &Path) -> (Sshd, u16) {
    keygen(&t.join("hostkey"));
    keygen(&t.join("userkey"));
    std::fs::copy(t.join("userkey.pub"), t.join("authorized_keys")).expect("authorized");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let cfg = t.join("sshd_config");
    std::fs::write(
        &cfg,
        format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {t}/hostkey\nAuthorizedKeysFile {t}/authorized_keys\nPidFile {t}/sshd.pid\nUsePAM no\nStrictModes no\nPermitRootLogin prohibit-password\nLogLevel DEBUG1\n",
            t = t.display()
        ),
    )
    .expect("cfg");
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
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(10), "sshd did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let pubkey = std::fs::read_to_string(t.join("hostkey.pub")).expect("pub");
    std::fs::write(
        t.join("known_hosts"),
        format!("[127.0.0.1]:{port} {pubkey}"),
    )
    .expect("kh");
    (d, port)
}

#[test]
fn ssh_host_runs_writes_stats_extracts_and_refuses_bad_keys() {
    if std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(1)
        != 0
    {
        eprintln!("skipped: needs root (sshd with a root login)");
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let t = tmp.path();
    let (_sshd, port) = start(t);
    let target = |kh: &str| {
        SshTarget::parse(
            &format!("root@127.0.0.1:{port}"),
            &t.join("userkey"),
            &t.join(kh),
        )
        .expect("target")
    };

    // Unknown and changed host keys are refused, naming host and fingerprint.
    std::fs::write(t.join("empty"), "").expect("w");
    match SshHost::connect(&target("empty"), Duration::from_secs(10)) {
        Err(HostError::HostKey { host, message }) => {
            assert!(host.contains(&format!("127.0.0.1:{port}")), "{host}");
            assert!(
                message.contains("is not in") && message.contains("SHA256:"),
                "{message}"
            );
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("an unknown host key was trusted"),
    }
    keygen(&t.join("other"));
    let other = std::fs::read_to_string(t.join("other.pub")).expect("pub");
    std::fs::write(t.join("wrong"), format!("[127.0.0.1]:{port} {other}")).expect("w");
    match SshHost::connect(&target("wrong"), Duration::from_secs(10)) {
        Err(HostError::HostKey { message, .. }) => {
            assert!(message.contains("does NOT match line 1"), "{message}");
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a changed host key was trusted"),
    }
    match SshHost::connect(&target("missing"), Duration::from_secs(10)) {
        Err(HostError::HostKey { message, .. }) => assert!(message.contains("does not exist")),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("connected without a known_hosts file"),
    }

    let mut h = SshHost::connect(&target("known_hosts"), Duration::from_secs(10)).expect("connect");
    assert_eq!(h.login().expect("login").uid, 0);
    // The environment is constructed, not inherited; stdin and exit codes pass.
    let mut c =
        Cmd::sh("read x; echo \"$x|$PATH|${HOME:-unset}|${SSH_CONNECTION:-unset}\"; exit 7")
            .stdin(b"hello\n".to_vec());
    c.env
        .insert("PATH".into(), "/opt/x/bin:/usr/bin:/bin".into());
    let out = h.run(&c).expect("run");
    assert_eq!(out.status, 7);
    assert_eq!(
        out.stdout_str().trim(),
        "hello|/opt/x/bin:/usr/bin:/bin|unset|unset"
    );

    // Files: atomic write with mode and owner, read back, stat with digest.
    let dir = t.join("guest");
    std::fs::create_dir(&dir).expect("dir");
    let f = format!("{}/a.conf", dir.display());
    let attrs = FileAttrs {
        mode: 0o640,
        owner: Some((1234, 1235)),
        privileged: true,
    };
    h.write_file(&f, b"one\n", &attrs).expect("write");
    let md = std::fs::metadata(&f).expect("meta");
    assert_eq!(
        (md.mode() & 0o7777, md.uid(), md.gid()),
        (0o640, 1234, 1235)
    );
    assert_eq!(
        h.read_file(&f, false).expect("read"),
        Some(b"one\n".to_vec())
    );
    assert_eq!(
        h.read_file(&format!("{f}.nope"), false).expect("read"),
        None
    );
    let st = h
        .stat(
            &[f.clone(), format!("{f}.nope"), dir.display().to_string()],
            true,
        )
        .expect("stat");
    assert_eq!(
        st[0].as_ref().map(|s| &s.kind),
        Some(&PathKind::File {
            sha256: Some("2c8b08da5ce60398e1f19af0e5dccc744df274b826abe585eaba68c525434806".into())
        })
    );
    assert!(st[1].is_none());
    assert_eq!(st[2].as_ref().map(|s| &s.kind), Some(&PathKind::Dir));
    assert!(h.remove(&f, false).expect("remove"));
    assert!(!Path::new(&f).exists());

    // A tar extracted on the guest (entries relative to /).
    let rel = dir.strip_prefix("/").expect("abs").display().to_string();
    let mut b = tar::Builder::new(Vec::new());
    let mut hd = tar::Header::new_gnu();
    hd.set_entry_type(tar::EntryType::Directory);
    hd.set_mode(0o755);
    hd.set_size(0);
    b.append_data(&mut hd, format!("{rel}/home/.local/"), std::io::empty())
        .expect("dir");
    let mut hd = tar::Header::new_gnu();
    hd.set_mode(0o755);
    hd.set_size(3);
    b.append_data(&mut hd, format!("{rel}/home/.local/tool"), &b"hi\n"[..])
        .expect("file");
    let tarball = b.into_inner().expect("tar");
    h.extract_tar(&tarball, false).expect("extract");
    let tool = dir.join("home/.local/tool");
    assert_eq!(std::fs::read(&tool).expect("tool"), b"hi\n");
    assert_eq!(
        std::fs::metadata(&tool).expect("m").permissions().mode() & 0o777,
        0o755
    );

    // A timeout is an error; the same connection keeps working.
    let t0 = Instant::now();
    let pidfile = dir.join("sleep.pid");
    let script = format!("echo $$ > {}; exec sleep 30", pidfile.display());
    match h.run(&Cmd::sh(script).timeout(Duration::from_secs(1))) {
        Err(HostError::Timeout { secs, .. }) => assert_eq!(secs, 1),
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(t0.elapsed() < Duration::from_secs(10));
    // The remote command was killed, not left running.
    let pid = std::fs::read_to_string(&pidfile).expect("pid");
    let proc_dir = format!("/proc/{}", pid.trim());
    let t1 = Instant::now();
    while Path::new(&proc_dir).exists() {
        assert!(
            t1.elapsed() < Duration::from_secs(5),
            "remote sleep still runs; sshd log:\n{}",
            std::fs::read_to_string(t.join("sshd.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        h.run(&Cmd::sh("echo still"))
            .expect("run")
            .stdout_str()
            .trim(),
        "still"
    );
    assert_eq!(
        h.which("sh", "/nonexistent:/bin:/usr/bin")
            .expect("which")
            .as_deref(),
        Some("/bin/sh")
    );
}
