//! The REAPI v2 client against a real engine (buildbox-casd + buildbox-run
//! on 127.0.0.1): capabilities, CAS (batch and ByteStream), ActionCache,
//! Execute with outputs verified, and the faults: unreachable engine, a
//! command that fails remotely, a truncated output blob.

use charly_testutil::casd as common_reapi;

use charly_reapi::action::RemoteCommand;
use charly_reapi::client::{Client, DigestFn};
use charly_reapi::tree::InputRoot;
use std::collections::BTreeMap;

fn cmd(script: &str, outputs: &[&str]) -> RemoteCommand {
    let mut env = BTreeMap::new();
    env.insert("PATH".to_string(), "/usr/bin:/bin".to_string());
    RemoteCommand {
        args: vec!["sh".into(), "-c".into(), script.into()],
        env,
        outputs: outputs.iter().map(|s| s.to_string()).collect(),
        ..RemoteCommand::default()
    }
}

#[test]
fn capabilities_cas_and_action_cache() {
    if !common_reapi::available() {
        return;
    }
    let casd = common_reapi::start(2);
    let c = Client::connect(&casd.url).expect("connects");
    let caps = c.capabilities().clone();
    assert_eq!(
        caps.digest,
        DigestFn::Sha256,
        "buildbox offers SHA-256, not BLAKE3"
    );
    assert!(caps.exec_enabled, "{caps:?}");

    // Small blobs go in batches, a big one over ByteStream; both read back.
    let small: Vec<Vec<u8>> = (0..50).map(|i| format!("blob {i}").into_bytes()).collect();
    let big: Vec<u8> = (0..(9u32 << 20)).map(|i| (i % 251) as u8).collect();
    let mut blobs: Vec<_> = small
        .iter()
        .map(|b| (c.digest_fn().digest(b), b.clone()))
        .collect();
    blobs.push((c.digest_fn().digest(&big), big.clone()));
    let digests: Vec<_> = blobs.iter().map(|(d, _)| d.clone()).collect();
    assert_eq!(c.find_missing(&digests).expect("find").len(), 51);
    c.upload(blobs.clone()).expect("upload");
    assert!(c.find_missing(&digests).expect("find").is_empty());
    let got = c.download(&digests).expect("download");
    for (d, b) in &blobs {
        assert_eq!(got.get(&d.hash), Some(b), "blob {}", d.hash);
    }

    // Two blobs that together pass 4 MiB less 64 KiB (what buildbox-casd
    // takes in one batch when it advertises no limit), each below it:
    // read in two batches, not refused.
    let pair: Vec<_> = [1u8, 2]
        .iter()
        .map(|i| vec![*i; 2_080_000])
        .map(|b| (c.digest_fn().digest(&b), b))
        .collect();
    c.upload(pair.clone()).expect("upload the pair");
    let wanted: Vec<_> = pair.iter().map(|(d, _)| d.clone()).collect();
    let got = c.download(&wanted).expect("download the pair");
    assert_eq!(got.len(), 2);

    // ActionCache: nothing for an unknown action; an entry round-trips.
    let action = c.digest_fn().digest(b"not really an action");
    assert!(c.get_action_result(&action).expect("get").is_none());
    let mut ar = bazel_remote_apis::build::bazel::remote::execution::v2::ActionResult::default();
    ar.output_files.push(
        bazel_remote_apis::build::bazel::remote::execution::v2::OutputFile {
            path: "out/x".into(),
            digest: Some(blobs[0].0.clone()),
            ..Default::default()
        },
    );
    c.update_action_result(&action, ar.clone()).expect("update");
    let back = c.get_action_result(&action).expect("get").expect("entry");
    assert_eq!(back.output_files[0].digest, ar.output_files[0].digest);
}

#[test]
fn execute_verifies_outputs_and_hits_the_action_cache() {
    if !common_reapi::available() {
        return;
    }
    let casd = common_reapi::start(2);
    let c = Client::connect(&casd.url).expect("connects");
    let src = tempfile::tempdir().expect("tmp");
    std::fs::write(src.path().join("in.txt"), "hello from the input root\n").expect("w");
    let run = cmd(
        "set -e; mkdir -p out/sub; cat /src/in.txt > out/a.txt; echo made > out/sub/b; \
         printf exe > out/tool; chmod +x out/tool; echo to-stderr >&2",
        &["out/"],
    );
    let input = |_: ()| {
        let mut i = InputRoot::new(c.digest_fn());
        i.add_dir("src", src.path()).expect("src");
        i
    };
    let dest = tempfile::tempdir().expect("tmp");
    let first = run
        .run(&c, input(()), dest.path(), false)
        .expect("runs remotely");
    assert!(!first.cached);
    assert_eq!(
        std::fs::read_to_string(dest.path().join("out/a.txt")).expect("a"),
        "hello from the input root\n"
    );
    assert_eq!(
        std::fs::read_to_string(dest.path().join("out/sub/b")).expect("b"),
        "made\n"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dest.path().join("out/tool"))
        .expect("tool")
        .permissions()
        .mode();
    assert!(mode & 0o100 != 0, "executable bit kept: {mode:o}");
    assert_eq!(String::from_utf8_lossy(&first.stderr), "to-stderr\n");

    // The same action again: an ActionCache hit, nothing executed.
    let dest2 = tempfile::tempdir().expect("tmp");
    let second = run.run(&c, input(()), dest2.path(), false).expect("cached");
    assert!(second.cached, "{second:?}");
    assert_eq!(second.action_digest, first.action_digest);
    assert_eq!(second.uploaded_bytes, 0);
    assert_eq!(
        std::fs::read(dest2.path().join("out/a.txt")).expect("a"),
        std::fs::read(dest.path().join("out/a.txt")).expect("a")
    );
}

#[test]
fn a_failing_command_names_its_action_and_writes_nothing() {
    if !common_reapi::available() {
        return;
    }
    let casd = common_reapi::start(1);
    let c = Client::connect(&casd.url).expect("connects");
    let run = cmd(
        "mkdir -p out; echo partial > out/x; echo broken build >&2; exit 3",
        &["out/"],
    );
    let dest = tempfile::tempdir().expect("tmp");
    let err = run
        .run(&c, InputRoot::new(c.digest_fn()), dest.path(), false)
        .expect_err("fails");
    assert!(
        err.message.contains("exited with code 3"),
        "{}",
        err.message
    );
    assert!(err.message.contains("broken build"), "{}", err.message);
    assert!(err.message.contains(&err.action_digest), "{}", err.message);
    assert!(!err.engine_error);
    assert!(
        !dest.path().join("out").exists(),
        "nothing of a failed action is written"
    );
    // A missing declared output is an error too, not an empty success.
    let run = cmd("true", &["out/"]);
    let err = run
        .run(&c, InputRoot::new(c.digest_fn()), dest.path(), false)
        .expect_err("no output");
    assert!(
        err.message.contains("declared output `out/`"),
        "{}",
        err.message
    );
}

#[test]
fn an_unreachable_engine_is_reported() {
    let port = charly_testutil::free_port();
    let err = Client::connect(&format!("grpc://127.0.0.1:{port}"))
        .err()
        .expect("nothing listens there");
    assert!(err.message.contains("unreachable"), "{}", err.message);
    assert!(err.message.contains(&port.to_string()), "{}", err.message);
    let err = Client::connect("http://127.0.0.1:1")
        .err()
        .expect("bad scheme");
    assert!(err.message.contains("grpc://"), "{}", err.message);
}

/// Truncates every CAS object of exactly this content in casd's storage.
pub fn truncate_in_casd(dir: &std::path::Path, content: &[u8]) -> usize {
    let mut n = 0;
    for e in walkdir::WalkDir::new(dir).into_iter().flatten() {
        if e.file_type().is_file() && std::fs::read(e.path()).ok().as_deref() == Some(content) {
            let mut p = std::fs::metadata(e.path()).expect("meta").permissions();
            use std::os::unix::fs::PermissionsExt;
            p.set_mode(0o644);
            std::fs::set_permissions(e.path(), p).expect("chmod");
            std::fs::write(e.path(), &content[..content.len() / 2]).expect("truncate");
            n += 1;
        }
    }
    n
}

#[test]
fn a_truncated_output_blob_is_an_error() {
    if !common_reapi::available() {
        return;
    }
    let casd = common_reapi::start(1);
    let c = Client::connect(&casd.url).expect("connects");
    let body = "x".repeat(1000) + "unique-truncation-marker\n";
    let run = cmd(
        &format!("mkdir -p out; printf '%s' '{body}' > out/big"),
        &["out/"],
    );
    let dest = tempfile::tempdir().expect("tmp");
    run.run(&c, InputRoot::new(c.digest_fn()), dest.path(), false)
        .expect("runs");
    assert!(
        truncate_in_casd(&casd.dir, body.as_bytes()) > 0,
        "found the blob in casd's storage"
    );
    let dest2 = tempfile::tempdir().expect("tmp");
    let err = run
        .run(&c, InputRoot::new(c.digest_fn()), dest2.path(), false)
        .expect_err("truncated");
    assert!(
        err.message.contains("truncated or corrupt") || err.message.contains("BatchReadBlobs"),
        "{}",
        err.message
    );
    assert!(err.message.contains("action "), "{}", err.message);
    assert!(!dest2.path().join("out").exists(), "nothing written");
}
