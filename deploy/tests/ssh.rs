//! The SSH host against a real sshd the test starts on a free 127.0.0.1
//! port (generated ed25519 keys): constructed env, stdin, exit codes,
//! atomic writes with mode and owner, batched stat with digests, tar
//! extraction, a timeout that leaves the connection usable, and refusal
//! of unknown or changed host keys. All paths are inside the test's dir.

use charly_deploy::host::{Cmd, FileAttrs, Host, HostError, PathKind};
use charly_deploy::ledger::{BundleRecord, BundleState, Connection, Ledger};
use charly_deploy::ssh::{SshHost, SshTarget};
use charly_deploy::walk::{self, Artifacts, Options};
use charly_rules::load::{self, LoadOptions};
use charly_rules::plan::{Gates, HostContext, Scope, StepData, Target, build_merged_plan};
use charly_rules::resolve;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use charly_testutil::sshd::{home_wrap, keygen, start as start_sshd};

fn start(t: &Path, bind_home: Option<&Path>) -> (charly_testutil::sshd::Sshd, u16) {
    start_sshd(t, bind_home.map(home_wrap).as_deref())
}

#[test]
fn ssh_host_runs_writes_stats_extracts_and_refuses_bad_keys() {
    if !charly_testutil::sshd::root_available("sshd with a root login") {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let t = tmp.path();
    let (_sshd, port) = start(t, None);
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

/// Builder artifacts as podman would store them: an npm prefix under the
/// box home `/home/user`.
struct Arts;

impl Artifacts for Arts {
    fn builder_tar(&self, _candy: &str, _builder: &str) -> Result<Vec<u8>, String> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, dir, data) in [
            ("home/user/.npm-global/", true, &b""[..]),
            ("home/user/.npm-global/bin/", true, &b""[..]),
            (
                "home/user/.npm-global/bin/cowsay",
                false,
                &b"#!/bin/sh\necho moo\n"[..],
            ),
        ] {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(if dir {
                tar::EntryType::Directory
            } else {
                tar::EntryType::Regular
            });
            h.set_mode(0o755);
            h.set_uid(1000);
            h.set_gid(1000);
            h.set_size(data.len() as u64);
            b.append_data(&mut h, path, data)
                .map_err(|e| e.to_string())?;
        }
        b.into_inner().map_err(|e| e.to_string())
    }
    fn local_packages(&self, _: &str, _: &str) -> Result<Vec<(String, Vec<u8>)>, String> {
        Err("no local packages in this test".into())
    }
    fn candy_file(&self, _: &str, rel: &str) -> Result<Vec<u8>, String> {
        Err(format!("no candy file {rel} in this test"))
    }
}

use charly_testutil::tree_with_modes as tree;

#[test]
fn walker_over_ssh_extracts_the_builder_artifact_into_the_guest_home() {
    if !charly_testutil::sshd::root_available("sshd, mount namespaces") {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let t = tmp.path();
    let home = t.join("home");
    std::fs::create_dir(&home).expect("home");
    let (_sshd, port) = start(t, Some(&home));
    let target = SshTarget::parse(
        &format!("root@127.0.0.1:{port}"),
        &t.join("userkey"),
        &t.join("known_hosts"),
    )
    .expect("target");
    let mut h = SshHost::connect(&target, Duration::from_secs(10)).expect("connect");
    // The example box's user-scope steps (its system steps would change this machine).
    let example = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/hello");
    let p = load::load(&example, &LoadOptions::default()).expect("loads");
    let r = resolve::resolve(&p);
    let mut plan = build_merged_plan(
        &p,
        r.get("hello").expect("hello"),
        &HostContext {
            target: Target::Vm,
            ..HostContext::default()
        },
        &[],
    )
    .expect("plan");
    plan.steps.retain(|s| {
        s.scope != Scope::System
            && !matches!(&s.data, StepData::Op(o) if o.verb == "cmd")
            && !matches!(&s.data, StepData::ShellSnippet(_))
    });
    assert!(
        plan.steps
            .iter()
            .any(|s| matches!(s.data, StepData::Builder(_))),
        "the example has a user-scope builder step"
    );
    let user = walk::resolve_user(&mut h, "root", &plan).expect("user");
    assert_eq!(user.home, "/root");
    let before = tree(&home);
    let ldir = tempfile::tempdir().expect("ledger");
    let mut ledger = Ledger::open(ldir.path()).expect("ledger");
    let rec = BundleRecord {
        name: "s".into(),
        deploy_id: plan.deploy_id.clone(),
        box_name: plan.box_name.clone(),
        target: Target::Vm,
        target_key: format!("vm:root@127.0.0.1:{port}"),
        connection: Connection::Ssh(target.clone()),
        user: user.name.clone(),
        home: user.home.clone(),
        state: BundleState::Applying,
        plan: serde_json::to_value(&plan).expect("json"),
        options: serde_json::json!({}),
        created_unix: 0,
        updated_unix: 0,
        error: None,
    };
    let report = walk::apply(
        &mut h,
        Some(&mut ledger),
        &rec,
        &plan,
        &user,
        &Arts,
        &Options {
            gates: Gates::all(),
            target: Target::Vm,
            box_home: "/home/user".into(),
            ..Options::default()
        },
        &mut |_| {},
    )
    .expect("apply over ssh");
    assert!(
        report.steps.iter().all(|s| s.state == "complete"),
        "{:#?}",
        report.steps
    );
    // The artifact landed in the guest's home, retargeted from /home/user, owned by root.
    let tool = home.join(".npm-global/bin/cowsay");
    assert_eq!(
        std::fs::read(&tool).expect("artifact"),
        b"#!/bin/sh\necho moo\n"
    );
    assert_eq!(std::fs::metadata(&tool).expect("m").uid(), 0);
    assert!(
        walk::drift(&mut h, &ledger, "s", None)
            .expect("drift")
            .is_empty()
    );
    walk::remove(&mut h, &mut ledger, "s", false, &mut |_| {}).expect("del");
    assert_eq!(tree(&home), before);
}

/// A machine still booting: connecting waits (bounded, with progress) for
/// SSH to answer; a machine that never answers is an error after the wait,
/// naming how long it waited; a refused host key is never retried.
#[test]
fn connecting_waits_for_a_booting_machine() {
    if !charly_testutil::sshd::root_available("sshd with a root login") {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let t = tmp.path();
    let port = charly_testutil::sshd::prepare(t);
    let target = |kh: &str| {
        SshTarget::parse(
            &format!("root@127.0.0.1:{port}"),
            &t.join("userkey"),
            &t.join(kh),
        )
        .expect("target")
    };
    // Nobody listens: an error after the wait, which it says it waited.
    let t0 = Instant::now();
    let mut said = Vec::new();
    let err = SshHost::connect_waiting(
        &target("known_hosts"),
        Duration::from_secs(5),
        Duration::from_secs(3),
        &mut |m| said.push(m.to_string()),
    )
    .err()
    .expect("nobody answers");
    assert!(t0.elapsed() >= Duration::from_secs(2), "it waited");
    assert!(err.to_string().contains("waited"), "{err}");
    assert!(
        said.first().is_some_and(|m| m.contains("waiting for SSH")),
        "{said:?}"
    );
    // The daemon comes up while the client waits.
    let boot = std::thread::spawn({
        let t = t.to_path_buf();
        move || {
            std::thread::sleep(Duration::from_secs(2));
            charly_testutil::sshd::launch(&t, None, port)
        }
    });
    let mut h = SshHost::connect_waiting(
        &target("known_hosts"),
        Duration::from_secs(5),
        Duration::from_secs(60),
        &mut |_| {},
    )
    .expect("connects once sshd answers");
    let _sshd = boot.join().expect("sshd");
    assert!(h.run(&Cmd::sh("true")).expect("run").ok());
    // A wrong host key is refused at once, however long the wait.
    std::fs::write(t.join("empty"), "").expect("w");
    let t0 = Instant::now();
    let err = SshHost::connect_waiting(
        &target("empty"),
        Duration::from_secs(5),
        Duration::from_secs(60),
        &mut |_| {},
    )
    .err()
    .expect("refused");
    assert!(matches!(err, HostError::HostKey { .. }), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(10));
}

/// The Debian mirror this machine uses (falls back to deb.debian.org).
fn debian_mirror() -> String {
    std::fs::read_to_string("/etc/apt/sources.list.d/debian.sources")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("URIs:").map(|u| u.trim().to_string()))
        })
        .unwrap_or_else(|| "http://deb.debian.org/debian".into())
}

fn sh_ok(cmd: &mut std::process::Command) -> String {
    let out = cmd.output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The example's artifacts for a guest deploy: the npm prefix as a tar,
/// its local .deb built here with dpkg-deb, the candies' files.
struct ExampleArts {
    deb: Vec<u8>,
}

impl Artifacts for ExampleArts {
    fn builder_tar(&self, candy: &str, builder: &str) -> Result<Vec<u8>, String> {
        Arts.builder_tar(candy, builder)
    }
    fn local_packages(&self, _: &str, format: &str) -> Result<Vec<(String, Vec<u8>)>, String> {
        assert_eq!(format, "deb");
        Ok(vec![("hello-charly_1.0_all.deb".into(), self.deb.clone())])
    }
    fn candy_file(&self, candy: &str, rel: &str) -> Result<Vec<u8>, String> {
        std::fs::read(
            charly_testutil::example()
                .join("candy")
                .join(candy)
                .join(rel),
        )
        .map_err(|e| e.to_string())
    }
}

/// The example box deployed over SSH to a Debian guest (debootstrap,
/// every session chrooted into it; systemd replaced by a `systemctl` that
/// records its calls), once with each step on its own and once with the
/// steps of one (scope, venue) batched: both install what the box says
/// (jq works, the local .deb is installed, the unit file is in place), and
/// `del` leaves the guest's files and package list as they were. Prints
/// the SSH exec channels each walk opened: the batched walk opens the 56
/// the README promises, one by one 93.
#[test]
fn the_example_box_on_a_guest_over_ssh_batched_in_fewer_round_trips() {
    if !charly_testutil::sshd::root_available("sshd, chroot, mount namespaces") {
        return;
    }
    if !Path::new("/usr/sbin/debootstrap").exists()
        && !charly_testutil::missing_tool(
            "debootstrap",
            "CHARLY_SKIP_DEBOOTSTRAP",
            "run .ci/install",
        )
    {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let t = tmp.path();
    let guest = t.join("guest");
    sh_ok(
        std::process::Command::new("/usr/sbin/debootstrap")
            .args(["--variant=minbase", "bookworm"])
            .arg(&guest)
            .arg(debian_mirror()),
    );
    std::fs::copy("/etc/resolv.conf", guest.join("etc/resolv.conf")).expect("resolv.conf");
    sh_ok(
        std::process::Command::new("chroot")
            .arg(&guest)
            .args(["apt-get", "update", "-qq"]),
    );
    // No systemd in a chroot: a systemctl that records what it is asked.
    let fake = guest.join("usr/local/bin/systemctl");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho \"$*\" >> /var/log/fake-systemctl.log\ncase \"$1\" in is-enabled|is-active) exit 1 ;; esac\nexit 0\n",
    )
    .expect("fake systemctl");
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    // The example's local package, built here.
    let deb = t.join("hello-charly_1.0_all.deb");
    sh_ok(
        std::process::Command::new("dpkg-deb")
            .args(["--root-owner-group", "-Zgzip", "--build"])
            .arg(charly_testutil::example().join("candy/hello-deb/pkg"))
            .arg(&deb),
    );
    let arts = ExampleArts {
        deb: std::fs::read(&deb).expect("deb"),
    };
    let installed = || {
        sh_ok(std::process::Command::new("chroot").arg(&guest).args([
            "dpkg-query",
            "-W",
            "-f=${db:Status-Abbrev} ${Package}\n",
        ]))
        .lines()
        .filter(|l| l.starts_with("ii "))
        .map(|l| format!("{l}\n"))
        .collect::<String>()
    };
    let files = || {
        let mut m = std::collections::BTreeMap::new();
        for d in ["etc", "root", "opt", "usr/local", "home"] {
            let mut tr = tree(&guest.join(d));
            // ldconfig's cache is rebuilt by the package manager's triggers.
            tr.retain(|k, _| !k.ends_with("/etc/ld.so.cache"));
            m.insert(d, tr);
        }
        m
    };
    let wrap = charly_testutil::sshd::guest_wrap(&guest);
    let (_sshd, port) = start_sshd(t, Some(wrap.as_str()));
    let target = SshTarget::parse(
        &format!("root@127.0.0.1:{port}"),
        &t.join("userkey"),
        &t.join("known_hosts"),
    )
    .expect("target");
    let p = load::load(&charly_testutil::example(), &LoadOptions::default()).expect("loads");
    let r = resolve::resolve(&p);
    let plan = build_merged_plan(
        &p,
        r.get("hello").expect("hello"),
        &HostContext {
            target: Target::Vm,
            ..HostContext::default()
        },
        &[],
    )
    .expect("plan");
    let before = (files(), installed());
    let mut counts = Vec::new();
    for batch in [false, true] {
        let mut h = SshHost::connect(&target, Duration::from_secs(10)).expect("connect");
        let user = walk::resolve_user(&mut h, "root", &plan).expect("user");
        let ldir = tempfile::tempdir().expect("ledger");
        let mut ledger = Ledger::open(ldir.path()).expect("ledger");
        let rec = BundleRecord {
            name: "ex".into(),
            deploy_id: plan.deploy_id.clone(),
            box_name: plan.box_name.clone(),
            target: Target::Vm,
            target_key: format!("vm:root@127.0.0.1:{port}"),
            connection: Connection::Ssh(target.clone()),
            user: user.name.clone(),
            home: user.home.clone(),
            state: BundleState::Applying,
            plan: serde_json::to_value(&plan).expect("json"),
            options: serde_json::json!({}),
            created_unix: 0,
            updated_unix: 0,
            error: None,
        };
        let c0 = h.channels();
        let report = walk::apply(
            &mut h,
            Some(&mut ledger),
            &rec,
            &plan,
            &user,
            &arts,
            &Options {
                gates: Gates::all(),
                target: Target::Vm,
                box_home: "/home/user".into(),
                batch_commands: batch,
                ..Options::default()
            },
            &mut |_| {},
        )
        .unwrap_or_else(|e| panic!("apply (batch {batch}): {e}"));
        let applied = h.channels() - c0;
        let batches = report
            .steps
            .iter()
            .filter(|s| s.actions.iter().any(|a| a.contains("in one round trip")))
            .count();
        assert!(
            report
                .steps
                .iter()
                .all(|s| s.state == "complete" || s.state == "skipped"),
            "{:#?}",
            report.steps
        );
        assert!(
            std::fs::read_to_string(guest.join("opt/hello/jq-version.txt"))
                .expect("jq ran")
                .starts_with("jq-1."),
            "the cmd ran with the installed jq"
        );
        assert!(installed().contains(" hello-charly\n"), "the local .deb");
        assert!(guest.join("etc/systemd/system/greeter.service").exists());
        assert!(
            walk::drift(&mut h, &ledger, "ex", Some(&plan))
                .expect("drift")
                .is_empty(),
            "clean after apply"
        );
        let c1 = h.channels();
        walk::remove(&mut h, &mut ledger, "ex", false, &mut |_| {}).expect("del");
        let removed = h.channels() - c1;
        let now = files();
        let diff: Vec<String> = before
            .0
            .iter()
            .flat_map(|(d, a)| {
                let b = &now[d];
                a.keys()
                    .chain(b.keys())
                    .filter(|k| a.get(*k) != b.get(*k))
                    .map(|k| k.to_string())
                    .collect::<std::collections::BTreeSet<_>>()
            })
            .collect();
        // What the `cmd` task wrote is not undone (its note says so), and
        // keeps its directory; everything else is as before.
        let opt = guest.join("opt/hello");
        assert_eq!(
            diff,
            [
                opt.display().to_string(),
                opt.join("jq-version.txt").display().to_string()
            ],
            "del (batch {batch}): the guest's files"
        );
        std::fs::remove_dir_all(&opt).expect("the cmd's output");
        assert_eq!(
            installed(),
            before.1,
            "del (batch {batch}): the package list"
        );
        counts.push((batch, applied, removed, batches));
    }
    for (batch, applied, removed, batches) in &counts {
        eprintln!(
            "SSH exec channels, example box, {}: apply {applied} ({batches} steps in batches), del {removed}",
            if *batch { "batched" } else { "one by one" }
        );
    }
    // The README's numbers, exactly: a change that costs or saves a round
    // trip shows here and in the README together.
    assert_eq!(
        (counts[0].1, counts[1].1),
        (93, 56),
        "SSH exec channels to apply the example box, one by one vs batched (README: 93 vs 56)"
    );
    assert_eq!(counts[1].3, 14, "steps in batches");
    assert_eq!((counts[0].2, counts[1].2), (65, 65), "channels to del");
}
