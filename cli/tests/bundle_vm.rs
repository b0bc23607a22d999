//! `charly bundle add --target vm` over a real SSH connection: the test
//! starts its own sshd on a free 127.0.0.1 port with generated ed25519 keys.
//! Every session runs in a private mount namespace with a temp directory
//! bound over /root, so the root login's home (env.d, rc-file block) lives
//! in the test's directory; system files of the test candy go below it too.

use assert_cmd::Command;
use charly_testutil as project_copy;
use std::path::{Path, PathBuf};

fn sh(cmd: &mut std::process::Command) {
    let out = cmd.output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

use charly_testutil::sshd::{guest_wrap, guest_wrap_as, home_wrap, keygen};

fn start_sshd(t: &Path, wrap: &str) -> (charly_testutil::sshd::Sshd, u16) {
    charly_testutil::sshd::start(t, Some(wrap))
}

fn project(t: &Path, sys: &Path) -> PathBuf {
    let p = t.join("project");
    let w = |rel: &str, text: String| {
        let f = p.join(rel);
        std::fs::create_dir_all(f.parent().expect("parent")).expect("mkdir");
        std::fs::write(f, text).expect("write");
    };
    w(
        "charly.yml",
        "version: 2026.1.1\ndiscover:\n    - box\n    - candy\ndefaults:\n    distro:\n        - debian:12\n        - debian\n    build:\n        - deb\n".into(),
    );
    w(
        "box/vmt/charly.yml",
        "box:\n    name: vmt\n    version: 2026.1.1\n    from: builder:debootstrap\n    candy:\n        - vmfiles\n".into(),
    );
    w(
        "candy/vmfiles/charly.yml",
        format!(
            "candy:\n    version: 2026.1.1\n    name: vmfiles\n    description: files and an env over ssh\n    env:\n        VMT_GREETING: \"hi over ssh\"\n    task:\n        - write: {sys}/vmt.conf\n          user: root\n          mode: \"0644\"\n          content: |\n            deployed over ssh\n        - write: \"${{HOME}}/.config/vmt/settings\"\n          user: \"${{USER}}\"\n          mode: \"0600\"\n          content: |\n            user file\n",
            sys = sys.display()
        ),
    );
    p
}

use charly_testutil::tree_with_modes as tree;

#[test]
fn vm_over_ssh_add_status_drift_del_and_wrong_host_key() {
    if !charly_testutil::sshd::root_available("sshd, mount namespaces") {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let t = tmp.path();
    let home = t.join("home");
    let sys = t.join("sys");
    std::fs::create_dir_all(&home).expect("home");
    std::fs::create_dir_all(&sys).expect("sys");
    let (_sshd, port) = start_sshd(t, &home_wrap(&home));
    let proj = project(t, &sys);
    let cache = t.join("cache");
    let cmd = || {
        let mut c = Command::cargo_bin("charly").expect("binary");
        c.env("NO_COLOR", "1")
            .env("CHARLY_CACHE_DIR", &cache)
            .arg("-C")
            .arg(&proj);
        c
    };
    let out = cmd()
        .args(["box", "build", "vmt", "--runner", "fake", "-q"])
        .output()
        .expect("build");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let before = (tree(&home), tree(&sys));
    let host = format!("root@127.0.0.1:{port}");
    let add = |name: &str, known_hosts: &Path| {
        cmd()
            .args([
                "bundle", "add", name, "vmt", "--target", "vm", "--host", &host, "--user", "root",
            ])
            .arg("--identity")
            .arg(t.join("userkey"))
            .arg("--known-hosts")
            .arg(known_hosts)
            .args(["--runner", "fake", "--json"])
            .output()
            .expect("add")
    };

    // A wrong host key: refused, naming the host and the key's fingerprint.
    keygen(&t.join("otherkey"));
    let other = std::fs::read_to_string(t.join("otherkey.pub")).expect("pub");
    std::fs::write(
        t.join("wrong_known_hosts"),
        format!("[127.0.0.1]:{port} {other}"),
    )
    .expect("w");
    let out = add("bad", &t.join("wrong_known_hosts"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("host key verification failed"), "{err}");
    assert!(
        err.contains("does NOT match") && err.contains("SHA256:"),
        "{err}"
    );
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    // An unknown host: refused too.
    std::fs::write(t.join("empty_known_hosts"), "").expect("w");
    let out = add("bad", &t.join("empty_known_hosts"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("is not in") && err.contains("SHA256:"),
        "{err}"
    );
    assert_eq!((tree(&home), tree(&sys)), before, "nothing touched");

    let out = add("v", &t.join("known_hosts"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rep: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert!(
        rep["host"]
            .as_str()
            .unwrap_or("")
            .starts_with("ssh root@127.0.0.1")
    );
    assert_eq!(
        std::fs::read_to_string(sys.join("vmt.conf")).expect("system file"),
        "deployed over ssh\n"
    );
    assert_eq!(
        std::fs::read_to_string(home.join(".config/vmt/settings")).expect("user file"),
        "user file\n"
    );
    let envd: Vec<String> = walkdir::WalkDir::new(&home)
        .into_iter()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_file())
        .filter(|e| std::fs::read_to_string(e.path()).is_ok_and(|s| s.contains("VMT_GREETING")))
        .map(|e| e.path().display().to_string())
        .collect();
    assert!(
        !envd.is_empty(),
        "no env file in the guest home: {:?}",
        tree(&home)
    );

    let out = cmd()
        .args(["bundle", "status", "v"])
        .output()
        .expect("status");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(sys.join("vmt.conf"), "changed behind our back\n").expect("tamper");
    let out = cmd()
        .args(["bundle", "status", "v", "--json"])
        .output()
        .expect("status");
    assert_eq!(out.status.code(), Some(3));
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert!(
        st["drift"]
            .as_array()
            .expect("drift")
            .iter()
            .any(|d| d["kind"] == "disk"
                && d["subject"].as_str().unwrap_or("").ends_with("vmt.conf")),
        "{st}"
    );
    // `bundle apply` keeps a changed file unless --force (as `del` does);
    // with it, it converges over SSH: the file is as deployed again and
    // status is clean; then del restores both trees exactly.
    let out = cmd()
        .args(["bundle", "apply", "v"])
        .output()
        .expect("apply");
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cmd()
        .args(["bundle", "apply", "v", "--force"])
        .output()
        .expect("apply");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(sys.join("vmt.conf")).expect("vmt.conf"),
        "deployed over ssh\n"
    );
    let out = cmd()
        .args(["bundle", "status", "v"])
        .output()
        .expect("status");
    assert!(
        out.status.success(),
        "clean after apply: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cmd().args(["bundle", "del", "v"]).output().expect("del");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!((tree(&home), tree(&sys)), before);
    let out = cmd()
        .args(["bundle", "list", "--json"])
        .output()
        .expect("list");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]");
}

fn guest_pkg_status(guest: &Path, pkg: &str) -> String {
    let out = std::process::Command::new("chroot")
        .arg(guest)
        .args(["dpkg-query", "-W", "-f=${Status}", pkg])
        .output()
        .expect("chroot dpkg-query");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A signed flat apt repository at `dir` with one package,
/// `charly-repo-probe`, and its public key ASCII-armoured in `key.asc`
/// (made with this machine's dpkg-deb and gpg).
fn local_apt_repo(t: &Path, dir: &Path) {
    use sha2::Digest as _;
    let pkg = t.join("probe-pkg");
    std::fs::create_dir_all(pkg.join("DEBIAN")).expect("mkdir");
    std::fs::create_dir_all(pkg.join("usr/share/charly-repo-probe")).expect("mkdir");
    std::fs::write(
        pkg.join("DEBIAN/control"),
        "Package: charly-repo-probe\nVersion: 1.0\nArchitecture: all\nMaintainer: charly tests <t@example.org>\nDescription: installed from a test repository\n",
    )
    .expect("control");
    std::fs::write(pkg.join("usr/share/charly-repo-probe/probe.txt"), "probe\n").expect("w");
    std::fs::create_dir_all(dir).expect("repo dir");
    let deb = dir.join("charly-repo-probe_1.0_all.deb");
    sh(std::process::Command::new("dpkg-deb")
        .args(["--root-owner-group", "-Zgzip", "--build"])
        .arg(&pkg)
        .arg(&deb));
    let deb_bytes = std::fs::read(&deb).expect("deb");
    let packages = format!(
        "{}Filename: ./charly-repo-probe_1.0_all.deb\nSize: {}\nSHA256: {}\n\n",
        std::fs::read_to_string(pkg.join("DEBIAN/control")).expect("control"),
        deb_bytes.len(),
        hex(&sha2::Sha256::digest(&deb_bytes))
    );
    std::fs::write(dir.join("Packages"), &packages).expect("Packages");
    let release = format!(
        "Origin: charly-test\nLabel: charly-test\nDate: Thu, 01 Jan 2026 00:00:00 UTC\nSHA256:\n {} {} Packages\n",
        hex(&sha2::Sha256::digest(packages.as_bytes())),
        packages.len()
    );
    std::fs::write(dir.join("Release"), release).expect("Release");
    let gnupg = t.join("gnupg");
    std::fs::create_dir_all(&gnupg).expect("gnupg");
    let gpg = |args: &[&str]| {
        let mut c = std::process::Command::new("gpg");
        c.env("GNUPGHOME", &gnupg)
            .args([
                "--batch",
                "--yes",
                "--pinentry-mode",
                "loopback",
                "--passphrase",
                "",
            ])
            .args(args)
            .current_dir(dir);
        c
    };
    sh(&mut gpg(&[
        "--quick-gen-key",
        "charly tests <t@example.org>",
        "ed25519",
        "sign",
        "never",
    ]));
    sh(&mut gpg(&["--clearsign", "-o", "InRelease", "Release"]));
    sh(&mut gpg(&["--armor", "--export", "-o", "key.asc"]));
}

/// The guest's installed packages, one `name version` per line.
fn guest_installed(guest: &Path) -> String {
    let out = std::process::Command::new("chroot")
        .arg(guest)
        .args([
            "dpkg-query",
            "-W",
            "-f=${db:Status-Abbrev} ${Package} ${Version}\n",
        ])
        .output()
        .expect("chroot dpkg-query");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("ii "))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// The paths whose entries differ between two trees (as `tree` makes them).
fn tree_diff(
    a: &std::collections::BTreeMap<String, String>,
    b: &std::collections::BTreeMap<String, String>,
) -> Vec<String> {
    let what = |k: &String| match (a.contains_key(k), b.contains_key(k)) {
        (true, true) => "changed",
        (true, false) => "gone",
        _ => "new",
    };
    a.keys()
        .chain(b.keys())
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| format!("{k}: {}", what(k)))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// Writes `text` to `rel` below `p`, making directories.
fn write_in(p: &Path, rel: &str, text: &str) {
    let f = p.join(rel);
    std::fs::create_dir_all(f.parent().expect("parent")).expect("mkdir");
    std::fs::write(f, text).expect("write");
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A package install over SSH on a guest that can do one: a Debian
/// bookworm minbase root filesystem (debootstrap from the mirror, apt lists
/// fetched) that every SSH session is chrooted into. `bundle add` installs
/// GNU hello there with apt-get (not on this machine), `status` is clean,
/// `del` removes it again.
#[test]
fn vm_over_ssh_installs_and_removes_a_package_on_the_guest() {
    if !charly_testutil::sshd::root_available("sshd, chroot, mount namespaces") {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let t = tmp.path();
    let Some(guest) = charly_testutil::debootstrap_bookworm(&t.join("guest")) else {
        return;
    };
    std::fs::copy("/etc/resolv.conf", guest.join("etc/resolv.conf")).expect("resolv.conf");
    sh(std::process::Command::new("chroot")
        .arg(&guest)
        .args(["apt-get", "update", "-qq"]));
    assert_eq!(guest_pkg_status(&guest, "hello"), "", "hello starts absent");
    let host_had_hello = std::process::Command::new("dpkg-query")
        .args(["-W", "hello"])
        .output()
        .is_ok_and(|o| o.status.success());

    let (_sshd, port) = start_sshd(t, &guest_wrap(&guest));
    let p = t.join("project");
    let w = |rel: &str, text: &str| write_in(&p, rel, text);
    w(
        "charly.yml",
        "version: 2026.1.1\ndiscover:\n    - box\n    - candy\ndefaults:\n    distro:\n        - debian:12\n        - debian\n    build:\n        - deb\n",
    );
    w(
        "box/guestbox/charly.yml",
        "box:\n    name: guestbox\n    version: 2026.1.1\n    from: builder:debootstrap\n    candy:\n        - greeting\n",
    );
    w(
        "candy/greeting/charly.yml",
        "candy:\n    version: 2026.1.1\n    name: greeting\n    description: GNU hello from the distro\n    package:\n        - hello\n",
    );
    let cache = t.join("cache");
    let host = format!("root@127.0.0.1:{port}");
    // `charly -C proj ARGS…`, which must succeed.
    let ok = |proj: &Path, args: &[&str]| {
        let out = Command::cargo_bin("charly")
            .expect("binary")
            .env("NO_COLOR", "1")
            .env("CHARLY_CACHE_DIR", &cache)
            .arg("-C")
            .arg(proj)
            .args(args)
            .output()
            .expect("charly runs");
        assert!(
            out.status.success(),
            "{args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    };
    // Build BOX with the fake runner, then deploy it as NAME to the guest.
    let build_and_add = |proj: &Path, name: &str, bx: &str, add: &[&str]| {
        ok(proj, &["box", "build", bx, "--runner", "fake", "-q"]);
        let identity = t.join("userkey");
        let known_hosts = t.join("known_hosts");
        ok(
            proj,
            &[
                "bundle",
                "add",
                name,
                bx,
                "--target",
                "vm",
                "--host",
                &host,
                "--user",
                "root",
                "--yes",
                "--identity",
                identity.to_str().expect("utf8"),
                "--known-hosts",
                known_hosts.to_str().expect("utf8"),
                "--runner",
                "fake",
                "--json",
            ]
            .iter()
            .chain(add)
            .copied()
            .collect::<Vec<&str>>(),
        );
    };

    build_and_add(&p, "g", "guestbox", &[]);
    assert_eq!(
        guest_pkg_status(&guest, "hello"),
        "install ok installed",
        "installed on the guest"
    );
    let host_has_hello = std::process::Command::new("dpkg-query")
        .args(["-W", "hello"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert_eq!(host_has_hello, host_had_hello, "this machine is untouched");
    ok(&p, &["bundle", "status", "g"]);
    ok(&p, &["bundle", "del", "g"]);
    let status = guest_pkg_status(&guest, "hello");
    assert!(
        !status.contains("installed") || status.contains("not-installed"),
        "removed again: {status:?}"
    );

    // A third-party repository: a signed flat apt repository in the guest
    // (file:/srv/repo, its key served ASCII-armoured) whose only package
    // is installed from it; `del` removes the package, the source line and
    // the key, and the guest's apt tree and package list are as before.
    let repo = guest.join("srv/repo");
    local_apt_repo(t, &repo);
    w(
        "box/repobox/charly.yml",
        "box:\n    name: repobox\n    version: 2026.1.1\n    from: builder:debootstrap\n    candy:\n        - probe\n",
    );
    w(
        "candy/probe/charly.yml",
        "candy:\n    version: 2026.1.1\n    name: probe\n    distro:\n        debian:\n            package:\n                - charly-repo-probe\n            repo:\n                - name: charly-test\n                  url: file:/srv/repo\n                  suite: /\n                  key: file:///srv/repo/key.asc\n",
    );
    let apt_before = tree(&guest.join("etc/apt"));
    let installed_before = guest_installed(&guest);
    build_and_add(&p, "r", "repobox", &[]);
    assert_eq!(
        guest_pkg_status(&guest, "charly-repo-probe"),
        "install ok installed",
        "installed from the repository"
    );
    assert!(
        std::fs::read_to_string(guest.join("etc/apt/sources.list.d/charly-test.list"))
            .expect("source line")
            .starts_with("deb [signed-by=/etc/apt/keyrings/charly-test.gpg] file:/srv/repo /")
    );
    ok(&p, &["bundle", "status", "r"]);
    ok(&p, &["bundle", "del", "r"]);
    assert_eq!(
        tree(&guest.join("etc/apt")),
        apt_before,
        "apt config as before"
    );
    assert_eq!(
        guest_installed(&guest),
        installed_before,
        "package list as before"
    );

    // The issue's scenario: a box plus an added candy (jq from the
    // mirror); a tampered file makes `status` exit 3, `bundle apply`
    // fixes it, `status` is clean again; `del` leaves /etc and the
    // package list as they were.
    w(
        "box/appbox/charly.yml",
        "box:\n    name: appbox\n    version: 2026.1.1\n    from: builder:debootstrap\n    candy:\n        - appconf\n",
    );
    w(
        "candy/appconf/charly.yml",
        "candy:\n    version: 2026.1.1\n    name: appconf\n    task:\n        - write: /etc/app.conf\n          user: root\n          content: |\n            setting = 1\n",
    );
    w(
        "candy/jqtool/charly.yml",
        "candy:\n    version: 2026.1.1\n    name: jqtool\n    package:\n        - jq\n",
    );
    // ld.so.cache is ldconfig's, rebuilt (not byte for byte) by the
    // package manager's triggers on install and on removal.
    let etc = || {
        let mut t = tree(&guest.join("etc"));
        t.retain(|k, _| !k.ends_with("/etc/ld.so.cache"));
        t
    };
    let etc_before = etc();
    let installed_before = guest_installed(&guest);
    build_and_add(&p, "app", "appbox", &["--add", "jqtool"]);
    assert_eq!(guest_pkg_status(&guest, "jq"), "install ok installed");
    std::fs::write(guest.join("etc/app.conf"), "setting = tampered\n").expect("tamper");
    let status = Command::cargo_bin("charly")
        .expect("binary")
        .env("NO_COLOR", "1")
        .env("CHARLY_CACHE_DIR", &cache)
        .arg("-C")
        .arg(&p)
        .args(["bundle", "status", "app"])
        .output()
        .expect("charly runs");
    assert_eq!(
        status.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    ok(&p, &["bundle", "apply", "app", "--force"]);
    assert_eq!(
        std::fs::read_to_string(guest.join("etc/app.conf")).expect("conf"),
        "setting = 1\n"
    );
    ok(&p, &["bundle", "status", "app"]);
    ok(&p, &["bundle", "del", "app"]);
    assert_eq!(
        tree_diff(&etc_before, &etc()),
        Vec::<String>::new(),
        "/etc as before"
    );
    assert_eq!(
        guest_installed(&guest),
        installed_before,
        "packages as before"
    );

    // A box made for Fedora is refused on this Debian guest before any
    // change, naming both distros and the candy.
    w(
        "box/fbox/charly.yml",
        "box:\n    name: fbox\n    version: 2026.1.1\n    from: builder:debootstrap\n    distro: [fedora]\n    build: [rpm]\n    candy:\n        - fonly\n",
    );
    w(
        "candy/fonly/charly.yml",
        "candy:\n    version: 2026.1.1\n    name: fonly\n    distro:\n        fedora:\n            package:\n                - hello\n",
    );
    let dpkg_before = std::fs::read(guest.join("var/lib/dpkg/status")).expect("dpkg status");
    let guest_root_before = tree(&guest.join("root"));
    let out = Command::cargo_bin("charly")
        .expect("binary")
        .env("NO_COLOR", "1")
        .env("CHARLY_CACHE_DIR", &cache)
        .arg("-C")
        .arg(&p)
        .args([
            "bundle", "add", "f", "fbox", "--target", "vm", "--host", &host,
        ])
        .args(["--user", "root", "--yes", "--identity"])
        .arg(t.join("userkey"))
        .arg("--known-hosts")
        .arg(t.join("known_hosts"))
        .output()
        .expect("charly runs");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("made for fedora (rpm packages)")
            && said.contains("debian 12 (deb packages)")
            && said.contains("fonly"),
        "{said}"
    );
    assert_eq!(
        std::fs::read(guest.join("var/lib/dpkg/status")).expect("dpkg status"),
        dpkg_before,
        "no package changed"
    );
    assert_eq!(tree(&guest.join("root")), guest_root_before);

    // A builder artifact from the store, extracted into the guest's home:
    // box `left` of the graph fixture (an npm builder stage, system files
    // from its base chain), built with the fake runner, whose stage writes
    // a real artifact tar.
    let graph = t.join("graph");
    project_copy::copy_project(&project_copy::graph_fixture(), &graph);
    let before = tree(&guest.join("root"));
    build_and_add(&graph, "l", "left", &[]);
    assert_eq!(
        std::fs::read_to_string(guest.join("etc/common2.conf")).expect("system file"),
        "common2\n"
    );
    let artifacts: Vec<PathBuf> = walkdir::WalkDir::new(guest.join("root"))
        .into_iter()
        .flatten()
        .filter(|e| e.file_name() == charly_engine::runners::fake::FAKE_ARTIFACT_FILE)
        .map(|e| e.into_path())
        .collect();
    assert!(
        !artifacts.is_empty(),
        "no artifact in the guest home: {:?}",
        tree(&guest.join("root"))
    );
    let body = std::fs::read_to_string(&artifacts[0]).expect("artifact");
    assert!(body.contains("a-npm"), "{body}");
    ok(&graph, &["bundle", "status", "l"]);
    ok(&graph, &["bundle", "del", "l"]);
    assert!(!guest.join("etc/common2.conf").exists());
    assert_eq!(
        tree(&guest.join("root")),
        before,
        "the guest home as it was"
    );

    sudo_with_a_password(t, &guest, &p, &cache);
}

/// A login that needs sudo with a password: a second sshd whose sessions
/// run as `deployer` inside the guest (sudo installed there from the
/// mirror, a password required). Without the password nothing changes
/// and the steps that need root are named; a wrong one is refused before
/// the first step; with the right one (`CHARLY_SUDO_PASSWORD_FILE`) the
/// deploy, `status` and `del` work, and the guest is as it was.
fn sudo_with_a_password(t: &Path, guest: &Path, p: &Path, cache: &Path) {
    sh(std::process::Command::new("chroot")
        .arg(guest)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .args(["apt-get", "install", "-y", "-qq", "sudo"]));
    sh(std::process::Command::new("chroot").arg(guest).args([
        "useradd",
        "-m",
        "-s",
        "/bin/bash",
        "deployer",
    ]));
    sh(std::process::Command::new("chroot").arg(guest).args([
        "sh",
        "-c",
        "echo deployer:right-password | chpasswd",
    ]));
    let sudoers = guest.join("etc/sudoers.d/deployer");
    std::fs::write(&sudoers, "deployer ALL=(ALL:ALL) ALL\n").expect("sudoers");
    std::fs::set_permissions(
        &sudoers,
        std::os::unix::fs::PermissionsExt::from_mode(0o440),
    )
    .expect("chmod");
    let t2 = t.join("sshd-deployer");
    std::fs::create_dir_all(&t2).expect("mkdir");
    let (_sshd, port) = start_sshd(&t2, &guest_wrap_as(guest, Some("deployer")));
    let w = |rel: &str, text: &str| write_in(p, rel, text);
    w(
        "box/sudobox/charly.yml",
        "box:\n    name: sudobox\n    version: 2026.1.1\n    from: builder:debootstrap\n    candy:\n        - rootfile\n",
    );
    w(
        "candy/rootfile/charly.yml",
        "candy:\n    version: 2026.1.1\n    name: rootfile\n    task:\n        - write: /etc/charly-sudo.conf\n          user: root\n          content: |\n            written with sudo\n        - write: \"${HOME}/.config/sudo-test\"\n          user: \"${USER}\"\n          content: |\n            mine\n",
    );
    let pwfile = |pw: &str| {
        let f = t2.join(format!("pw-{pw}"));
        std::fs::write(&f, format!("{pw}\n")).expect("pw");
        f
    };
    let run = |args: &[&str], pw: Option<&Path>| {
        let mut c = Command::cargo_bin("charly").expect("binary");
        c.env("NO_COLOR", "1")
            .env("CHARLY_CACHE_DIR", cache)
            .env_remove("CHARLY_SUDO_PASSWORD_FILE")
            .arg("-C")
            .arg(p)
            .args(args);
        if let Some(f) = pw {
            c.env("CHARLY_SUDO_PASSWORD_FILE", f);
        }
        c.output().expect("charly runs")
    };
    let host = format!("root@127.0.0.1:{port}");
    let identity = t2.join("userkey");
    let known_hosts = t2.join("known_hosts");
    let add = [
        "bundle",
        "add",
        "s",
        "sudobox",
        "--target",
        "vm",
        "--host",
        &host,
        "--user",
        "deployer",
        "--yes",
        "--identity",
        identity.to_str().expect("utf8"),
        "--known-hosts",
        known_hosts.to_str().expect("utf8"),
        "--runner",
        "fake",
    ];
    let out = run(&["box", "build", "sudobox", "--runner", "fake", "-q"], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let etc_before = tree(&guest.join("etc"));
    let home_before = tree(&guest.join("home/deployer"));

    let out = run(&add, None);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("needs a password for deployer") && said.contains("/etc/charly-sudo.conf"),
        "{said}"
    );
    let out = run(&add, Some(&pwfile("wrong-password")));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("did not accept the password"), "{said}");
    assert!(!said.contains("wrong-password"), "{said}");
    assert_eq!(tree(&guest.join("etc")), etc_before, "nothing changed");

    let right = pwfile("right-password");
    let out = run(&add, Some(&right));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let conf = guest.join("etc/charly-sudo.conf");
    assert_eq!(
        std::fs::read_to_string(&conf).expect("root file"),
        "written with sudo\n"
    );
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(&conf).expect("meta").uid(), 0);
    let out = run(&["bundle", "status", "s"], Some(&right));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(&["bundle", "del", "s"], Some(&right));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(tree(&guest.join("etc")), etc_before, "/etc as it was");
    assert_eq!(
        tree(&guest.join("home/deployer")),
        home_before,
        "the home as it was"
    );
}
