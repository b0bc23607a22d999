//! charly-testutil: fixtures shared by the workspace's tests and benches
//! (a dev-dependency only; nothing here reaches a release binary).
//!
//! * projects ([`project`], re-exported here): [`example`], [`corpus`],
//!   fixtures, [`open`], private copies ([`copy_project`], [`Sandbox`] with
//!   a store and the command that runs charly on them), tree snapshots
//!   ([`tree`]); [`workspace`], [`write()`], [`free_port`], [`hold_lock`];
//! * podman: [`Podman`] (isolated storage), [`podman_available`], root
//!   filesystem tars ([`busybox_rootfs_tar`], [`stub_rootfs_tar`]);
//! * [`casd`]: a real REAPI engine (buildbox-casd + buildbox-run);
//!   `casd::podman_with_image` with the `engine` feature;
//! * [`sshd`]: a real sshd on 127.0.0.1 with generated keys.
//!
//! A fixture whose tool is missing fails under CI (`CI` set) and is
//! skipped, loudly, elsewhere.

pub mod casd;
pub mod project;
pub mod sshd;

pub use project::{
    Sandbox, bench_corpus, busybox_fixture, copy_project, corpus, corpus_174, example,
    graph_fixture, hold_lock, open, tree, tree_with_modes,
};

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The workspace root.
pub fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// A free TCP port on 127.0.0.1.
///
/// Never the same port twice in one process: tests run in parallel, and a
/// port the kernel hands out again before the first server bound it would
/// make two servers race for it.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("free port");
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// Whether a server listens on 127.0.0.1:`port`. A connect to a port of
/// the ephemeral range that nobody listens on can succeed by connecting the
/// socket to itself (Linux picks the same port as its source: a TCP
/// "simultaneous open"); such a connection is not a server and counts as no.
pub fn listens(port: u16) -> bool {
    match std::net::TcpStream::connect(("127.0.0.1", port)) {
        Ok(s) => match (s.local_addr(), s.peer_addr()) {
            (Ok(local), Ok(peer)) => local != peer,
            _ => false,
        },
        Err(_) => false,
    }
}

/// Writes a file, creating parents.
pub fn write(root: &Path, rel: &str, body: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(p, body).expect("write");
}

/// The non-YAML files the corpus does not carry (see its SOURCE.md) but its
/// tasks copy: tests that build put placeholders there.
pub const MISSING_SIBLINGS: &[&str] = &[
    "candy/chrome-cdp/browser-open",
    "candy/chrome-cdp/cdp-proxy",
    "candy/chrome-cdp/chrome-restart",
    "candy/chrome-cdp/chrome-wrapper",
    "candy/chrome-cdp/chrome-windows/content.js",
    "candy/openwebui/openwebui-entrypoint",
    "candy/socat/relay-wrapper",
    "candy/sshd/sshd-wrapper",
    "candy/sway/sway-wrapper",
    "candy/sway/config",
    "candy/testapi/app.py",
    "candy/notebook-templates/data/notebooks/welcome.ipynb",
];

/// A podman with isolated storage (so tests never touch the machine's
/// images) and the configuration this machine needs (runc, ulimits).
pub struct Podman {
    /// Scratch directory holding storage and config.
    pub dir: PathBuf,
}

impl Podman {
    /// Sets up storage under `dir`.
    pub fn new(dir: &Path) -> Podman {
        std::fs::create_dir_all(dir).expect("mkdir");
        std::fs::write(
            dir.join("containers.conf"),
            "[containers]\ndefault_ulimits = [\"nofile=20000:20000\", \"nproc=32768:32768\"]\n[engine]\nruntime = \"runc\"\n",
        )
        .expect("conf");
        Podman {
            dir: dir.to_path_buf(),
        }
    }

    /// A podman command with this storage.
    pub fn cmd(&self) -> Command {
        let mut c = Command::new("podman");
        self.configure(&mut c);
        c
    }

    /// A podman command with this storage that `timeout` ends with SIGQUIT
    /// (podman then prints every goroutine's stack: where it hung) after
    /// `secs` seconds.
    pub fn cmd_within(&self, secs: u32) -> Command {
        let mut c = Command::new("timeout");
        c.args(["-s", "QUIT", &secs.to_string(), "podman"]);
        self.configure(&mut c);
        c
    }

    fn configure(&self, c: &mut Command) {
        c.env("CONTAINERS_CONF", self.dir.join("containers.conf"))
            .arg("--root")
            .arg(self.dir.join("storage"))
            .arg("--runroot")
            .arg(self.dir.join("run"))
            .arg("--storage-driver")
            .arg("overlay");
    }

    /// Runs podman with args.
    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd().args(args).output().expect("podman runs")
    }

    /// Imports the busybox root filesystem ([`busybox_rootfs_tar`], made
    /// under `dir`) as image `tag`; panics with podman's stderr on failure.
    pub fn import_busybox(&self, dir: &Path, tag: &str) {
        self.import_tar(&busybox_rootfs_tar(dir), tag);
    }

    /// Imports a root filesystem tar as image `tag`; panics with podman's
    /// stderr on failure.
    pub fn import_tar(&self, tar: &Path, tag: &str) {
        let out = self.run(&["import", "-q", tar.to_str().expect("utf8"), tag]);
        assert!(
            out.status.success(),
            "podman import {tag}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Whether the tests run under CI: `CI` is set (`.ci/run` sets it) to
/// anything but `false`, `0` or nothing.
pub fn under_ci() -> bool {
    ci_means_ci(std::env::var("CI").ok().as_deref())
}

fn ci_means_ci(v: Option<&str>) -> bool {
    v.is_some_and(|v| !matches!(v.trim(), "" | "0" | "false"))
}

/// What a test does when a tool it needs is missing: under CI it fails
/// (nothing is skipped there, whatever variable is set); elsewhere it skips,
/// loudly, only when `skip_var=1` says so, and fails otherwise. Returns
/// `false` when the test is to skip.
pub fn missing_tool(what: &str, skip_var: &str, how: &str) -> bool {
    assert!(
        !under_ci(),
        "{what} is missing under CI (CI is set, so nothing is skipped): {how}"
    );
    assert!(
        std::env::var(skip_var).as_deref() == Ok("1"),
        "{what} is missing: {how} (or set {skip_var}=1 outside CI to skip these tests)"
    );
    // Written past the test harness's output capture, so a skip is seen.
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr(),
        "\n!!! SKIPPED: {what} is missing and {skip_var}=1: these tests did not run\n"
    );
    false
}

/// Whether podman is installed; tests that need it fail without it unless
/// `CHARLY_SKIP_PODMAN=1` says to skip (never silently, never under CI).
pub fn podman_available() -> bool {
    let ok = Command::new("podman")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    ok || missing_tool("podman", "CHARLY_SKIP_PODMAN", "run .ci/install")
}

/// Builds a root filesystem tar of busybox-static plus stub tools, so that
/// generated Containerfiles for other distros build end to end: every
/// package manager and builder tool is a stub that succeeds; `/bin/sh`
/// syntax-checks each RUN before running it and tolerates commands that
/// fail for lack of a real distro (the failure is logged, not fatal).
pub fn stub_rootfs_tar(dir: &Path) -> PathBuf {
    let root = dir.join("stubroot");
    for d in [
        "bin",
        "usr/bin",
        "usr/local/bin",
        "usr/sbin",
        "etc",
        "tmp",
        "root",
        "home",
        "var/log",
    ] {
        std::fs::create_dir_all(root.join(d)).expect("mkdir");
    }
    std::fs::copy("/bin/busybox", root.join("bin/busybox"))
        .expect("busybox-static is installed (apt install busybox-static)");
    let applets = [
        "ls",
        "cat",
        "echo",
        "mkdir",
        "ln",
        "chmod",
        "chown",
        "cp",
        "mv",
        "rm",
        "id",
        "tar",
        "gzip",
        "find",
        "grep",
        "sed",
        "printf",
        "test",
        "[",
        "true",
        "false",
        "xargs",
        "head",
        "cut",
        "sha256sum",
        "uname",
        "touch",
        "env",
        "readlink",
        "dirname",
        "basename",
        "unzip",
        "whoami",
        "sleep",
        "install",
        "tr",
        "wc",
        "sort",
        "awk",
    ];
    for a in applets {
        let _ = std::os::unix::fs::symlink("busybox", root.join("bin").join(a));
    }
    // The shell: syntax errors are real failures; command failures are tolerated.
    std::fs::write(
        root.join("bin/sh"),
        "#!/bin/busybox ash\nif [ \"$1\" = \"-c\" ]; then\n  /bin/busybox ash -n -c \"$2\" || { echo 'charly-stub: shell syntax error in RUN' >&2; exit 2; }\n  /bin/busybox ash -c \"$2\" || echo \"charly-stub: tolerated exit $? in: $2\" >> /var/log/charly-stub.log\n  exit 0\nfi\nexec /bin/busybox ash \"$@\"\n",
    )
    .expect("sh");
    std::fs::write(
        root.join("bin/bash"),
        "#!/bin/busybox ash\n/bin/busybox ash \"$@\" || echo \"charly-stub: tolerated bash $*\" >> /var/log/charly-stub.log\nexit 0\n",
    )
    .expect("bash");
    let stubs = [
        "dnf",
        "dnf5",
        "rpm",
        "pacman",
        "pacman-key",
        "apt-get",
        "yay",
        "makepkg",
        "useradd",
        "groupadd",
        "usermod",
        "sudo",
        "setcap",
        "gpg",
        "pixi",
        "npm",
        "node",
        "cargo",
        "curl",
        "systemctl",
        "add-apt-repository",
        "bootc",
        "supervisord",
        "runuser",
        "getent",
    ];
    for s in stubs {
        let body = if s == "getent" {
            "#!/bin/sh\nexit 2\n".to_string()
        } else if s == "node" {
            // The npm builder lists its packages with `node -e … | xargs -r
            // npm install --global`: name one, so that npm runs.
            "#!/bin/sh\necho \"charly-stub: node $*\" >> /var/log/charly-stub.log\n[ \"$1\" != -e ] || echo charly-stub-package\nexit 0\n".to_string()
        } else if s == "npm" {
            // `npm install --global` leaves the prefix the npm builder
            // stage's artifact is copied from.
            "#!/bin/sh\necho \"charly-stub: npm $*\" >> /var/log/charly-stub.log\n[ -z \"$NPM_CONFIG_PREFIX\" ] || mkdir -p \"$NPM_CONFIG_PREFIX/bin\"\nexit 0\n".to_string()
        } else {
            format!("#!/bin/sh\necho \"charly-stub: {s} $*\" >> /var/log/charly-stub.log\nexit 0\n")
        };
        std::fs::write(root.join("usr/bin").join(s), body).expect("stub");
    }
    // `pixi install` leaves the project's environment the pixi builder
    // stage's artifact is copied from.
    std::fs::write(
        root.join("usr/local/bin/pixi"),
        "#!/bin/sh\n[ \"$1\" != install ] || mkdir -p .pixi/envs/default\nexit 0\n",
    )
    .expect("pixi");
    std::fs::write(root.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").expect("passwd");
    std::fs::write(root.join("etc/group"), "root:x:0:\n").expect("group");
    for e in walkdir::WalkDir::new(&root).into_iter().flatten() {
        if e.file_type().is_file()
            && e.path() != root.join("bin/busybox")
            && !e.path().starts_with(root.join("etc"))
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(e.path(), std::fs::Permissions::from_mode(0o755))
                .expect("chmod");
        }
    }
    tar_dir(&root, &dir.join("stub.tar"))
}

/// A real (not stubbed) busybox root filesystem tar: busybox-static with its
/// applets, `/bin/bash` running busybox's shell, and user 1000 (`user`,
/// home `/home/user`).
pub fn busybox_rootfs_tar(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let root = dir.join("bbroot");
    for d in [
        "bin",
        "usr/bin",
        "usr/local/bin",
        "etc",
        "tmp",
        "root",
        "home/user",
    ] {
        std::fs::create_dir_all(root.join(d)).expect("mkdir");
    }
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
        root.join("bin/bash"),
        "#!/bin/busybox sh\nexec /bin/busybox sh \"$@\"\n",
    )
    .expect("bash");
    std::fs::set_permissions(
        root.join("bin/bash"),
        std::fs::Permissions::from_mode(0o755),
    )
    .expect("chmod");
    std::fs::write(
        root.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n",
    )
    .expect("passwd");
    std::fs::write(root.join("etc/group"), "root:x:0:\nuser:x:1000:\n").expect("group");
    std::fs::set_permissions(root.join("tmp"), std::fs::Permissions::from_mode(0o1777))
        .expect("chmod tmp");
    std::os::unix::fs::chown(root.join("home/user"), Some(1000), Some(1000))
        .expect("chown home (tests run as root)");
    tar_dir(&root, &dir.join("busybox.tar"))
}

/// Tars the tree under `root` into `tar` (paths relative to `root`, numeric
/// owners, so an imported image has the tree's ids) and returns `tar`.
pub fn tar_dir(root: &Path, tar: &Path) -> PathBuf {
    let st = Command::new("tar")
        .arg("-C")
        .arg(root)
        .args(["--numeric-owner", "-cf"])
        .arg(tar)
        .arg(".")
        .status()
        .expect("tar");
    assert!(st.success(), "tar -C {} failed", root.display());
    tar.to_path_buf()
}

/// The example plugin (`charly-plugin-example`, the Rust mirror of the
/// original's plugin-example-stepkind), from this test's target directory;
/// built there first when missing (a lone `cargo test -p X` does not
/// build another package's binaries).
pub fn plugin_example() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    // target/<profile>/deps/<test> → target/<profile>
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target directory")
        .to_path_buf();
    let p = dir.join("charly-plugin-example");
    if !p.is_file() {
        let target = dir.parent().expect("target");
        let mut c = std::process::Command::new(std::env::var_os("CARGO").unwrap_or("cargo".into()));
        c.args(["build", "-q", "-p", "charly-plugin", "--bins"])
            .env("CARGO_TARGET_DIR", target)
            .current_dir(workspace());
        if dir.ends_with("release") {
            c.arg("--release");
        }
        assert!(
            c.status().expect("cargo").success(),
            "building the example plugin"
        );
    }
    p
}

/// The Debian mirror this machine's apt uses (`deb.debian.org` otherwise).
pub fn debian_mirror() -> String {
    std::fs::read_to_string("/etc/apt/sources.list.d/debian.sources")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("URIs:").map(|u| u.trim().to_string()))
        })
        .unwrap_or_else(|| "http://deb.debian.org/debian".into())
}

/// A Debian bookworm minbase root filesystem at `dir`, made with
/// debootstrap from [`debian_mirror`]. `None` when debootstrap is not
/// installed: a failure under CI (`.ci/install` installs it), a loud skip
/// elsewhere.
pub fn debootstrap_bookworm(dir: &Path) -> Option<PathBuf> {
    if !Path::new("/usr/sbin/debootstrap").exists()
        && !missing_tool("debootstrap", "CHARLY_SKIP_DEBOOTSTRAP", "run .ci/install")
    {
        return None;
    }
    let out = Command::new("/usr/sbin/debootstrap")
        .args(["--variant=minbase", "bookworm"])
        .arg(dir)
        .arg(debian_mirror())
        .output()
        .expect("debootstrap runs");
    assert!(
        out.status.success(),
        "debootstrap: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Some(dir.to_path_buf())
}

#[cfg(test)]
mod tests {
    #[test]
    fn ci_is_any_value_but_false_zero_or_nothing() {
        for v in ["true", "1", "yes", "github"] {
            assert!(super::ci_means_ci(Some(v)), "{v}");
        }
        for v in [None, Some(""), Some("0"), Some("false")] {
            assert!(!super::ci_means_ci(v), "{v:?}");
        }
    }

    #[test]
    fn listens_is_true_only_while_a_server_listens() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        assert!(super::listens(port));
        drop(l);
        assert!(!super::listens(port));
    }
}
