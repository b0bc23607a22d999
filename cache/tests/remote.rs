//! The remote cache against a real registry (Debian's `docker-registry`,
//! started by each test on a free 127.0.0.1 port, stopped by PID).

mod remote_common;

use std::collections::BTreeMap;
use std::path::Path;

use charly_cache::remote::manifest::{
    ANNOTATION_BLAKE3, ANNOTATION_KEY, BLOB_MEDIA_TYPE, RECORD_MEDIA_TYPE, tag_for,
};
use charly_cache::{
    BlobDigest, NodeKey, Output, PullOutcome, Record, Remote, RemoteAuth, RemoteConfig, Store,
};
use remote_common::{Auth, Registry, TokenService, content, http, http_get};

fn key(label: &str) -> NodeKey {
    NodeKey::from_bytes(*blake3::hash(label.as_bytes()).as_bytes())
}

fn config(url: String) -> RemoteConfig {
    let mut cfg = RemoteConfig::new(url);
    // Never pick up credentials from the developer's environment.
    cfg.auth = RemoteAuth::Anonymous;
    cfg
}

fn open(url: String) -> Remote {
    Remote::open(config(url)).expect("open remote")
}

/// Stores `blobs` and a record naming them `out0`, `out1`, … under `key`.
fn put(store: &Store, key: &NodeKey, node_id: &str, blobs: &[&[u8]]) -> Record {
    let mut outputs = BTreeMap::new();
    for (i, b) in blobs.iter().enumerate() {
        let digest = store.put_blob(b).expect("put blob");
        outputs.insert(
            format!("out{i}"),
            Output {
                digest,
                size: b.len() as u64,
                mode: if i == 0 { 0o644 } else { 0o755 },
            },
        );
    }
    let rec = Record {
        node_id: node_id.to_string(),
        kind: "builder-stage".to_string(),
        outputs,
        duration_ms: 42,
        producer: "fake".to_string(),
        key_inputs: serde_json::json!({ "node": node_id, "files": {"b": 2, "a": 1} }),
        created_unix: 1_700_000_000,
        meta: serde_json::json!({ "id": format!("sha256:{node_id}") }),
    };
    assert!(store.put_record(key, &rec).expect("put record"));
    rec
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    let d = sha2::Sha256::digest(bytes);
    let mut s = String::from("sha256:");
    for b in d.as_slice() {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// The manifest the registry holds for `key` (raw HTTP, no charly code).
fn registry_manifest(reg: &Registry, repo: &str, key: &NodeKey) -> Option<serde_json::Value> {
    let (status, body) = http_get(
        reg.port,
        &format!("/v2/{repo}/manifests/{}", tag_for(key)),
        &[("Accept", "application/vnd.oci.image.manifest.v1+json")],
    )
    .expect("GET manifest");
    match status {
        200 => Some(serde_json::from_slice(&body).expect("manifest JSON")),
        404 => None,
        s => panic!("GET manifest: HTTP {s}: {}", String::from_utf8_lossy(&body)),
    }
}

#[test]
fn store_b_gets_every_record_of_store_a_byte_identical() {
    let Some(reg) = Registry::start() else { return };
    let url = reg.url("charly/cache");
    let dir_a = tempfile::tempdir().expect("tempdir");
    let dir_b = tempfile::tempdir().expect("tempdir");
    let a = Store::open(dir_a.path()).expect("store A");

    // Sizes around every boundary that matters: empty, tiny, one zstd
    // frame, the small-blob limit of uploads (4 MiB), well above it.
    let big = content(1, 9 * 1024 * 1024 + 17);
    let frame = content(2, 512 * 1024);
    let limit = content(3, 4 * 1024 * 1024);
    let text = b"FROM fedora:42\nRUN dnf install -y ripgrep\n".to_vec();
    let shared = content(4, 70_000);
    let nodes: Vec<(NodeKey, Vec<Vec<u8>>)> = vec![
        (key("containerfile"), vec![text.clone()]),
        (key("empty"), vec![Vec::new()]),
        (key("stage"), vec![big.clone(), shared.clone()]),
        (key("frame"), vec![frame, shared.clone(), text.clone()]),
        (key("limit"), vec![limit]),
        (key("no-outputs"), vec![]),
        (key("dup"), vec![shared.clone(), shared]),
    ];
    let remote_a = open(url.clone());
    let mut recs = BTreeMap::new();
    for (i, (k, blobs)) in nodes.iter().enumerate() {
        let refs: Vec<&[u8]> = blobs.iter().map(Vec::as_slice).collect();
        recs.insert(*k, put(&a, k, &format!("node{i}"), &refs));
        remote_a.push(&a, k);
    }
    // Queuing the same key twice pushes it once.
    remote_a.push(&a, &nodes[0].0);
    let report = remote_a.finish();
    assert!(
        report.ok(),
        "push failures: {:?}\n{}",
        report.failures,
        reg.log()
    );
    assert_eq!(report.pushed, nodes.len() as u64);
    let stats_a = remote_a.stats();
    assert_eq!(stats_a.pushed, nodes.len() as u64);
    assert!(stats_a.bytes_up >= big.len() as u64, "{stats_a:?}");
    assert!(stats_a.errors.is_empty(), "{:?}", stats_a.errors);

    // What the registry holds, read without charly's code.
    let m = registry_manifest(&reg, "charly/cache", &key("stage")).expect("stage manifest");
    assert_eq!(m["config"]["mediaType"], RECORD_MEDIA_TYPE);
    assert_eq!(m["annotations"][ANNOTATION_KEY], key("stage").to_hex());
    let layers = m["layers"].as_array().expect("layers");
    assert_eq!(layers.len(), 2);
    for l in layers {
        assert_eq!(l["mediaType"], BLOB_MEDIA_TYPE);
    }
    let big_layer = layers
        .iter()
        .find(|l| l["annotations"][ANNOTATION_BLAKE3] == BlobDigest::of(&big).to_hex())
        .expect("layer of the big blob");
    assert_eq!(
        big_layer["digest"],
        sha256_hex(&big),
        "layers are uncompressed"
    );
    assert_eq!(big_layer["size"], big.len() as u64);
    let dup = registry_manifest(&reg, "charly/cache", &key("dup")).expect("dup manifest");
    assert_eq!(
        dup["layers"].as_array().map(Vec::len),
        Some(1),
        "one layer per distinct blob"
    );

    // A fresh store with the same remote: every record comes from there.
    let b = Store::open(dir_b.path()).expect("store B");
    let remote_b = open(url.clone());
    for (k, _) in &nodes {
        let got = remote_b.get_record(&b, k).expect("get_record");
        let rec = got.unwrap_or_else(|| panic!("no remote hit for {k:?}: {:?}", remote_b.stats()));
        assert_eq!(&rec, &recs[k], "record differs");
        for (name, out) in &rec.outputs {
            let in_a = a.get_blob(&out.digest).expect("A").expect("A has it");
            let in_b = b.get_blob(&out.digest).expect("B").expect("B has it");
            assert!(in_a == in_b, "output {name} of {k:?} differs");
            let (fa, fb) = (dir_a.path().join("fa"), dir_b.path().join("fb"));
            assert!(a.copy_output_to(out, &fa).expect("copy A"));
            assert!(b.copy_output_to(out, &fb).expect("copy B"));
            assert!(std::fs::read(&fa).expect("read") == std::fs::read(&fb).expect("read"));
        }
        // Now local in B: a plain local hit.
        assert_eq!(b.get_record(k).expect("local"), Some(rec));
    }
    let s = remote_b.stats();
    assert_eq!(s.hits, nodes.len() as u64, "100% remote hits: {s:?}");
    assert_eq!((s.misses, s.corrupt), (0, 0), "{s:?}");
    assert!(s.errors.is_empty(), "{:?}", s.errors);
    // Blobs shared between records are downloaded once.
    let logical: u64 = {
        let mut all: BTreeMap<BlobDigest, u64> = BTreeMap::new();
        for r in recs.values() {
            for o in r.outputs.values() {
                all.insert(o.digest, o.size);
            }
        }
        all.values().sum()
    };
    assert!(s.bytes_down >= logical, "{s:?}");
    assert!(
        s.bytes_down < logical + 64 * 1024,
        "downloaded more than once: {s:?}"
    );

    // Local first: asking again does not touch the registry.
    assert!(matches!(
        remote_b.pull_record(&b, &key("stage")).expect("pull"),
        PullOutcome::Local(_)
    ));
    assert_eq!(remote_b.stats().hits, nodes.len() as u64);

    // Records that came from the registry are not pushed back…
    for (k, _) in &nodes {
        remote_b.push(&b, k);
    }
    let rb = remote_b.finish();
    assert_eq!((rb.pushed, rb.already_present), (0, 0), "{rb:?}");
    // …and pushing what the registry has costs a HEAD, not an upload.
    let again = open(url.clone());
    let r = again.push_all(&a, &|_, _| true).expect("push_all");
    assert!(r.ok(), "{r:?}");
    assert_eq!(
        (r.pushed, r.already_present),
        (0, nodes.len() as u64),
        "{r:?}"
    );
    assert_eq!(again.stats().bytes_up, 0);

    // An unknown key is a plain miss.
    assert!(matches!(
        remote_b.pull_record(&b, &key("never built")).expect("pull"),
        PullOutcome::Miss
    ));
    assert_eq!(remote_b.stats().misses, 1);
    remote_b.check().expect("registry reachable");
}

#[test]
fn push_all_selects_and_read_only_never_writes() {
    let Some(reg) = Registry::start() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let a = Store::open(dir.path()).expect("store");
    put(&a, &key("x"), "x", &[b"x"]);
    put(&a, &key("y"), "y", &[b"y"]);
    let mut src = put(&a, &key("src-placeholder"), "src", &[]);
    src.kind = "source".into();
    a.put_record(&key("source"), &src).expect("source record");

    let mut cfg = config(reg.url("ro/cache"));
    cfg.read_only = true;
    let ro = Remote::open(cfg).expect("open");
    assert!(ro.is_read_only());
    ro.push(&a, &key("x"));
    let r = ro.finish();
    assert_eq!((r.pushed, r.failures.len()), (0, 0));
    let r = ro.push_all(&a, &|_, _| true).expect("push_all");
    assert_eq!(r.pushed, 0);
    assert_eq!(r.skipped, 4, "{r:?}");
    assert!(
        registry_manifest(&reg, "ro/cache", &key("x")).is_none(),
        "read-only wrote"
    );

    let rw = open(reg.url("ro/cache"));
    let r = rw
        .push_all(&a, &|_, rec| rec.kind != "source")
        .expect("push_all");
    assert!(r.ok(), "{r:?}");
    assert_eq!(r.pushed, 3, "{r:?}");
    assert!(registry_manifest(&reg, "ro/cache", &key("x")).is_some());
    assert!(registry_manifest(&reg, "ro/cache", &key("source")).is_none());

    // A read-only remote still reads.
    let dir_b = tempfile::tempdir().expect("tempdir");
    let b = Store::open(dir_b.path()).expect("store");
    assert!(ro.get_record(&b, &key("y")).expect("get").is_some());
}

#[test]
fn corrupt_or_truncated_registry_blobs_are_misses_never_used() {
    let Some(reg) = Registry::start() else { return };
    let url = reg.url("charly/corrupt");
    let dir_a = tempfile::tempdir().expect("tempdir");
    let a = Store::open(dir_a.path()).expect("store A");
    let flipped = content(10, 3 * 1024 * 1024);
    let cut = content(11, 6 * 1024 * 1024);
    let fine = content(12, 1000);
    let rec_config = content(13, 10);
    put(&a, &key("flipped"), "flipped", &[&flipped, &fine]);
    put(&a, &key("cut"), "cut", &[&cut]);
    put(&a, &key("fine"), "fine", &[&fine]);
    put(&a, &key("bad-record"), "bad-record", &[&rec_config]);
    let remote_a = open(url.clone());
    let r = remote_a.push_all(&a, &|_, _| true).expect("push");
    assert!(r.ok(), "{r:?}");

    // Damage the registry's own storage: one byte flipped in the middle,
    // one blob cut short, and one record (config blob) garbled.
    let path = reg.blob_file(&sha256_hex(&flipped));
    let mut bytes = std::fs::read(&path).expect("registry blob");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&path, bytes).expect("corrupt");
    let path = reg.blob_file(&sha256_hex(&cut));
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open");
    f.set_len(cut.len() as u64 / 3).expect("truncate");
    let m = registry_manifest(&reg, "charly/corrupt", &key("bad-record")).expect("manifest");
    let config_digest = m["config"]["digest"].as_str().expect("config digest");
    let path = reg.blob_file(config_digest);
    let mut json = std::fs::read(&path).expect("record blob");
    let pos = json.len() - 3;
    json[pos] = b'X';
    std::fs::write(&path, json).expect("garble");

    let dir_b = tempfile::tempdir().expect("tempdir");
    let b = Store::open(dir_b.path()).expect("store B");
    let remote_b = open(url.clone());
    for k in ["flipped", "cut", "bad-record"] {
        let out = remote_b
            .pull_record(&b, &key(k))
            .expect("pull never errors");
        let PullOutcome::Corrupt(why) = out else {
            panic!("{k}: expected a refused pull, got {out:?}")
        };
        assert!(!why.is_empty());
        assert_eq!(b.get_record(&key(k)).expect("local"), None, "{k} recorded");
    }
    assert!(
        !b.has_blob(&BlobDigest::of(&flipped)),
        "corrupt blob stored"
    );
    assert!(!b.has_blob(&BlobDigest::of(&cut)), "truncated blob stored");
    // Nothing half-written is left behind in the store either.
    assert_eq!(
        b.stats().expect("stats").blobs,
        u64::from(b.has_blob(&BlobDigest::of(&fine)))
    );

    let s = remote_b.stats();
    assert_eq!(s.corrupt, 3, "{s:?}");
    assert_eq!(s.hits, 0);
    assert!(!s.unavailable, "corruption must not switch the remote off");
    // Each refusal names the blob (or record) of the node's tag and the
    // check that failed (the registry client's sha256 check here: charly's
    // own blake3 check has its own test below).
    let text = s.errors.join("\n");
    for want in [
        format!(
            "blob {} of {}: digest check failed after {n} of {n} bytes",
            BlobDigest::of(&flipped),
            tag_for(&key("flipped")),
            n = flipped.len()
        ),
        format!(
            "blob {} of {}: truncated: ",
            BlobDigest::of(&cut),
            tag_for(&key("cut"))
        ),
        format!(
            "record of {}: digest check failed",
            tag_for(&key("bad-record"))
        ),
    ] {
        assert!(text.contains(&want), "{want:?} in {text}");
    }

    // Undamaged records still come through; get_record reports a miss for
    // the damaged ones without failing, even with --remote-required.
    assert!(
        remote_b
            .get_record(&b, &key("fine"))
            .expect("get")
            .is_some()
    );
    let mut cfg = config(url);
    cfg.required = true;
    let strict = Remote::open(cfg).expect("open");
    assert_eq!(strict.get_record(&b, &key("cut")).expect("a miss"), None);
}

/// A blob the registry damaged is refused, then repaired by the next push
/// of a machine that has it (uploaded again with a declared trailer, so it
/// gets a new sha256); a fresh machine then pulls the repaired copy, byte
/// for byte, the trailer hashed for sha256 and never passed on.
#[test]
fn a_damaged_blob_is_repaired_by_the_next_push_and_pulls_whole() {
    let Some(reg) = Registry::start() else { return };
    let repo = "charly/repair";
    let dir_a = tempfile::tempdir().expect("tempdir");
    let a = Store::open(dir_a.path()).expect("store A");
    let blob = content(31, 100_000);
    put(&a, &key("repair"), "repair", &[&blob]);
    let r = open(reg.url(repo))
        .push_all(&a, &|_, _| true)
        .expect("push");
    assert!(r.ok(), "{r:?}");
    let path = reg.blob_file(&sha256_hex(&blob));
    let mut bytes = std::fs::read(&path).expect("registry blob");
    bytes[500] ^= 0x01;
    std::fs::write(&path, bytes).expect("damage");

    // B is refused, and remembers the broken blob for its next push.
    let dir_b = tempfile::tempdir().expect("tempdir");
    let b = Store::open(dir_b.path()).expect("store B");
    let remote = open(reg.url(repo));
    assert!(matches!(
        remote.pull_record(&b, &key("repair")).expect("pull"),
        PullOutcome::Corrupt(_)
    ));
    remote.push(&a, &key("repair"));
    let r = remote.finish();
    assert!(r.ok(), "{r:?}");
    let m = registry_manifest(&reg, repo, &key("repair")).expect("manifest");
    let layer = &m["layers"][0];
    let trailer: u64 = layer["annotations"][charly_cache::remote::manifest::ANNOTATION_TRAILER]
        .as_str()
        .expect("a repaired copy declares its trailer")
        .parse()
        .expect("number");
    assert!(trailer > 0);
    assert_eq!(layer["size"].as_u64(), Some(blob.len() as u64 + trailer));

    let dir_c = tempfile::tempdir().expect("tempdir");
    let c = Store::open(dir_c.path()).expect("store C");
    let out = open(reg.url(repo))
        .pull_record(&c, &key("repair"))
        .expect("pull");
    assert!(matches!(out, PullOutcome::Pulled(_)), "{out:?}");
    assert_eq!(
        c.get_blob(&BlobDigest::of(&blob))
            .expect("read")
            .expect("present")
            .into_vec(),
        blob,
        "the repaired copy's bytes, without its trailer"
    );
}

/// Uploads `bytes` as a blob of `repo` (raw HTTP, no charly code):
/// POST an upload, PUT it whole with its digest.
fn upload_blob(reg: &Registry, repo: &str, bytes: &[u8]) -> String {
    let digest = sha256_hex(bytes);
    let (status, headers, body) = http(
        reg.port,
        "POST",
        &format!("/v2/{repo}/blobs/uploads/"),
        &[],
        &[],
    )
    .expect("POST upload");
    assert_eq!(status, 202, "{}", String::from_utf8_lossy(&body));
    let loc = headers
        .iter()
        .find(|(k, _)| k == "location")
        .map(|(_, v)| v.clone())
        .expect("Location");
    let path = loc
        .strip_prefix(&format!("http://127.0.0.1:{}", reg.port))
        .unwrap_or(&loc);
    let sep = if path.contains('?') { '&' } else { '?' };
    let (status, _, body) = http(
        reg.port,
        "PUT",
        &format!("{path}{sep}digest={digest}"),
        &[("Content-Type", "application/octet-stream")],
        bytes,
    )
    .expect("PUT blob");
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    digest
}

/// Replaces the manifest under `key`'s tag (raw HTTP).
fn put_manifest(reg: &Registry, repo: &str, key: &NodeKey, m: &serde_json::Value) {
    let (status, _, body) = http(
        reg.port,
        "PUT",
        &format!("/v2/{repo}/manifests/{}", tag_for(key)),
        &[("Content-Type", "application/vnd.oci.image.manifest.v1+json")],
        &serde_json::to_vec(m).expect("json"),
    )
    .expect("PUT manifest");
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
}

/// A registry serving a blob whose sha256 matches (the registry checks that
/// itself) but whose blake3 is not the one the record and the manifest
/// name: charly's blake3 check on the way into the store refuses it, and
/// says so. A manifest cut short is refused too, by name.
#[test]
fn a_blob_whose_sha256_matches_but_blake3_does_not_is_refused_by_blake3() {
    let Some(reg) = Registry::start() else { return };
    let repo = "charly/b3";
    let dir_a = tempfile::tempdir().expect("tempdir");
    let a = Store::open(dir_a.path()).expect("store A");
    let real = content(21, 4096);
    let claimed = content(22, real.len());
    put(&a, &key("b3"), "b3", &[&real]);
    let r = open(reg.url(repo))
        .push_all(&a, &|_, _| true)
        .expect("push");
    assert!(r.ok(), "{r:?}");

    // The record and the manifest now claim `claimed`'s blake3 for the
    // blob whose bytes (and sha256) are `real`'s.
    let mut m = registry_manifest(&reg, repo, &key("b3")).expect("manifest");
    let config = m["config"]["digest"].as_str().expect("config").to_string();
    let (status, rec) =
        http_get(reg.port, &format!("/v2/{repo}/blobs/{config}"), &[]).expect("GET record");
    assert_eq!(status, 200);
    let mut rec: serde_json::Value = serde_json::from_slice(&rec).expect("record JSON");
    let b3_real = BlobDigest::of(&real).to_hex();
    let b3_claimed = BlobDigest::of(&claimed).to_hex();
    assert_eq!(rec["outputs"]["out0"]["digest"], b3_real.as_str());
    rec["outputs"]["out0"]["digest"] = b3_claimed.clone().into();
    let rec = serde_json::to_vec(&rec).expect("json");
    m["config"]["digest"] = upload_blob(&reg, repo, &rec).into();
    m["config"]["size"] = rec.len().into();
    let layer = &mut m["layers"][0];
    assert_eq!(layer["digest"], sha256_hex(&real).as_str());
    layer["annotations"][ANNOTATION_BLAKE3] = b3_claimed.clone().into();
    put_manifest(&reg, repo, &key("b3"), &m);

    let dir_b = tempfile::tempdir().expect("tempdir");
    let b = Store::open(dir_b.path()).expect("store B");
    let remote_b = open(reg.url(repo));
    let out = remote_b
        .pull_record(&b, &key("b3"))
        .expect("pull never errors");
    let PullOutcome::Corrupt(why) = out else {
        panic!("expected a refused pull, got {out:?}")
    };
    assert!(
        why.contains(&format!(
            "blake3 mismatch: expected {b3_claimed}, got {b3_real}"
        )),
        "{why}"
    );
    assert!(why.contains(&tag_for(&key("b3"))), "the node's tag: {why}");
    assert_eq!(b.get_record(&key("b3")).expect("local"), None);
    assert!(!b.has_blob(&BlobDigest::of(&real)) && !b.has_blob(&BlobDigest::of(&claimed)));
    assert_eq!(remote_b.stats().corrupt, 1);

    // A manifest cut short (the registry's stored copy, truncated).
    let m = registry_manifest(&reg, repo, &key("b3")).expect("manifest");
    let body = serde_json::to_vec(&m).expect("json");
    let path = reg.blob_file(&sha256_hex(&body));
    assert!(
        path.exists(),
        "the registry keeps the manifest we put as it was"
    );
    {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open");
        f.set_len(body.len() as u64 / 2).expect("truncate");
        let out = open(reg.url(repo))
            .pull_record(&b, &key("b3"))
            .expect("pull never errors");
        match out {
            PullOutcome::Corrupt(why) => assert!(why.contains("manifest"), "{why}"),
            // The registry may notice the short file itself and answer
            // with an error: a miss all the same, never a record.
            other => assert!(
                !matches!(other, PullOutcome::Pulled(_) | PullOutcome::Local(_)),
                "a truncated manifest was used: {other:?}"
            ),
        }
        assert_eq!(b.get_record(&key("b3")).expect("local"), None);
    }
}

/// An engine-like loop: look up (local, then remote), else "build" the
/// node locally and queue a push.
fn build_all(remote: &Remote, store: &Store, labels: &[String]) -> (usize, usize) {
    let (mut hits, mut built) = (0, 0);
    for l in labels {
        let k = key(l);
        match remote
            .get_record(store, &k)
            .expect("lookups never fail when not required")
        {
            Some(_) => hits += 1,
            None => {
                put(
                    store,
                    &k,
                    l,
                    &[l.as_bytes(), &content(l.len() as u64, 300_000)],
                );
                remote.push(store, &k);
                built += 1;
            }
        }
    }
    (hits, built)
}

#[test]
fn registry_down_mid_run_the_build_completes_locally_and_reports() {
    let Some(mut reg) = Registry::start() else {
        return;
    };
    let url = reg.url("charly/down");
    let labels: Vec<String> = (0..12).map(|i| format!("node-{i}")).collect();

    // Runner 1 builds the first half and shares it.
    let d1 = tempfile::tempdir().expect("tempdir");
    let s1 = Store::open(d1.path()).expect("store");
    let r1 = open(url.clone());
    assert_eq!(build_all(&r1, &s1, &labels[..6]), (0, 6));
    assert!(r1.finish().ok());

    // Runner 2: the first part comes from the registry, then it dies.
    let d2 = tempfile::tempdir().expect("tempdir");
    let s2 = Store::open(d2.path()).expect("store");
    let r2 = open(url.clone());
    assert_eq!(build_all(&r2, &s2, &labels[..3]), (3, 0));
    let pid = reg.pid().expect("pid");
    reg.stop();
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|s| s.contains(") Z"))
                .unwrap_or(true),
        "registry still running"
    );
    let (hits, built) = build_all(&r2, &s2, &labels[3..]);
    assert_eq!((hits, built), (0, 9), "everything else is built locally");
    let report = r2.finish();
    assert!(!report.ok(), "push failures must be reported: {report:?}");
    assert_eq!(report.pushed, 0);
    for l in &labels {
        assert!(
            s2.get_record(&key(l)).expect("local").is_some(),
            "{l} missing"
        );
    }
    let s = r2.stats();
    assert_eq!(s.hits, 3);
    assert!(
        s.unavailable,
        "the remote is switched off after repeated failures: {s:?}"
    );
    assert!(s.skipped_unavailable > 0, "{s:?}");
    assert!(
        s.errors.iter().any(|e| e.contains("switched off")),
        "{:?}",
        s.errors
    );

    // With --remote-required the same failure is an error.
    let mut cfg = config(url);
    cfg.required = true;
    let strict = Remote::open(cfg).expect("open");
    assert!(strict.check().is_err());
    let err = strict
        .get_record(&s2, &key("not-local"))
        .expect_err("required remote down");
    assert!(err.to_string().contains("remote cache"), "{err}");
}

#[test]
fn poisoning_defence_only_clean_complete_records_are_pushed() {
    let Some(reg) = Registry::start() else { return };
    let url = reg.url("charly/poison");
    let dir = tempfile::tempdir().expect("tempdir");
    let a = Store::open(dir.path()).expect("store");

    // A producer that noted a failed exit.
    let mut rec = put(&a, &key("ok"), "ok", &[b"fine"]);
    rec.meta = serde_json::json!({ "exit_code": 2 });
    a.put_record(&key("failed"), &rec).expect("put");
    // A record whose output blob has since vanished locally.
    let gone = b"this blob will be deleted".to_vec();
    put(&a, &key("incomplete"), "incomplete", &[&gone]);
    let hex = BlobDigest::of(&gone).to_hex();
    std::fs::remove_file(dir.path().join("blobs").join(&hex[..2]).join(&hex)).expect("rm");
    // A record whose local blob is corrupt on disk (large: streamed path).
    let big = content(20, 5 * 1024 * 1024);
    put(&a, &key("rotten"), "rotten", &[&big]);
    let hex = BlobDigest::of(&big).to_hex();
    let path = dir.path().join("blobs").join(&hex[..2]).join(&hex);
    let mut bytes = std::fs::read(&path).expect("blob");
    let n = bytes.len();
    bytes[n / 2] ^= 1;
    std::fs::write(&path, bytes).expect("rot");

    let remote = open(url);
    for k in ["ok", "failed", "incomplete", "rotten"] {
        remote.push(&a, &key(k));
    }
    let r = remote.finish();
    assert_eq!(r.pushed, 1, "{r:?}");
    assert_eq!(r.skipped, 3, "{r:?}");
    assert!(r.ok(), "refusals are not registry failures: {r:?}");
    assert!(registry_manifest(&reg, "charly/poison", &key("ok")).is_some());
    for k in ["failed", "incomplete", "rotten"] {
        assert!(
            registry_manifest(&reg, "charly/poison", &key(k)).is_none(),
            "{k} was pushed"
        );
    }
    assert!(
        !reg.blob_file(&sha256_hex(&big)).exists(),
        "rotten blob uploaded"
    );
    let errors = remote.stats().errors.join("\n");
    assert!(errors.contains("did not exit cleanly"), "{errors}");
    assert!(errors.contains("no complete record"), "{errors}");
    assert!(errors.contains("failed verification"), "{errors}");
    assert_eq!(
        a.stats().expect("stats").quarantined,
        1,
        "rotten blob quarantined"
    );
}

#[test]
fn htpasswd_basic_auth() {
    let (user, pass) = ("ci-runner", "s3cret pass");
    let Some(reg) = Registry::start_with(Auth::Htpasswd {
        user: user.into(),
        pass: pass.into(),
    }) else {
        return;
    };
    let url = reg.url("team/cache");
    let dir = tempfile::tempdir().expect("tempdir");
    let a = Store::open(dir.path()).expect("store");
    put(&a, &key("n"), "n", &[b"artifact"]);

    // Anonymous: refused, reported, not fatal…
    let anon = open(url.clone());
    let out = anon.pull_record(&Store::open(&dir.path().join("x")).expect("s"), &key("n"));
    assert!(matches!(out, Ok(PullOutcome::Failed(_))), "{out:?}");
    anon.push(&a, &key("n"));
    assert!(!anon.finish().ok());
    // …unless required.
    let mut cfg = config(url.clone());
    cfg.required = true;
    assert!(Remote::open(cfg).expect("open").check().is_err());

    let mut cfg = config(url.clone());
    cfg.auth = RemoteAuth::Basic {
        user: user.into(),
        pass: pass.into(),
    };
    let authed = Remote::open(cfg.clone()).expect("open");
    authed.check().expect("credentials accepted");
    authed.push(&a, &key("n"));
    let r = authed.finish();
    assert!(r.ok() && r.pushed == 1, "{r:?}\n{}", reg.log());
    let dir_b = tempfile::tempdir().expect("tempdir");
    let b = Store::open(dir_b.path()).expect("store");
    let reader = Remote::open(cfg).expect("open");
    assert!(reader.get_record(&b, &key("n")).expect("get").is_some());
    assert_eq!(
        b.get_blob(&BlobDigest::of(b"artifact"))
            .expect("get")
            .as_deref(),
        Some(&b"artifact"[..])
    );
}

#[test]
fn token_auth_basic_exchange_and_bearer() {
    let ts = TokenService::start("robot$ci", "tok-pass");
    let Some(reg) = Registry::start_with(Auth::Token(ts.clone())) else {
        ts.shutdown();
        return;
    };
    let url = reg.url("org/charly-cache");
    let dir = tempfile::tempdir().expect("tempdir");
    let a = Store::open(dir.path()).expect("store");
    let big = content(30, 6 * 1024 * 1024);
    put(&a, &key("t"), "t", &[b"small", &big]);

    // User + password exchanged for a token at the registry's realm (the
    // GHCR/GitLab/Harbor flow).
    let mut cfg = config(url.clone());
    cfg.auth = RemoteAuth::Basic {
        user: "robot$ci".into(),
        pass: "tok-pass".into(),
    };
    let writer = Remote::open(cfg).expect("open");
    writer.push(&a, &key("t"));
    let r = writer.finish();
    assert!(r.ok() && r.pushed == 1, "{r:?}\n{}", reg.log());
    assert!(ts.requests.load(std::sync::atomic::Ordering::Relaxed) > 0);

    // A token obtained elsewhere, sent as is.
    let mut cfg = config(url.clone());
    cfg.auth = RemoteAuth::Bearer {
        token: ts.mint("org/charly-cache", &["pull"]),
    };
    let reader = Remote::open(cfg).expect("open");
    let dir_b = tempfile::tempdir().expect("tempdir");
    let b = Store::open(dir_b.path()).expect("store");
    assert!(
        reader.get_record(&b, &key("t")).expect("get").is_some(),
        "{:?}\n{}",
        reader.stats(),
        reg.log()
    );
    assert_eq!(
        b.get_blob(&BlobDigest::of(&big))
            .expect("get")
            .map(Vec::from),
        Some(big)
    );
    // A pull-only token cannot push.
    put(&b, &key("u"), "u", &[b"new"]);
    reader.push(&b, &key("u"));
    assert!(!reader.finish().ok(), "a pull-only token pushed");

    // Wrong password: reported, a miss.
    let mut cfg = config(url);
    cfg.auth = RemoteAuth::Basic {
        user: "robot$ci".into(),
        pass: "wrong".into(),
    };
    let bad = Remote::open(cfg).expect("open");
    let dir_c = tempfile::tempdir().expect("tempdir");
    let c = Store::open(dir_c.path()).expect("store");
    assert_eq!(bad.get_record(&c, &key("t")).expect("not fatal"), None);
    assert!(!bad.stats().errors.is_empty());
    ts.shutdown();
}

#[test]
fn parallel_lookups_and_pushes_from_many_threads() {
    let Some(reg) = Registry::start() else { return };
    let url = reg.url("charly/parallel");
    let da = tempfile::tempdir().expect("tempdir");
    let a = Store::open(da.path()).expect("store");
    let remote_a = open(url.clone());
    let labels: Vec<String> = (0..24).map(|i| format!("p{i}")).collect();
    std::thread::scope(|s| {
        for chunk in labels.chunks(6) {
            let (a, remote_a) = (&a, &remote_a);
            s.spawn(move || {
                for l in chunk {
                    put(a, &key(l), l, &[l.as_bytes(), &content(7, 200_000)]);
                    remote_a.push(a, &key(l));
                }
            });
        }
    });
    let r = remote_a.finish();
    assert!(r.ok() && r.pushed == 24, "{r:?}");

    let db = tempfile::tempdir().expect("tempdir");
    let b = Store::open(db.path()).expect("store");
    let remote_b = open(url);
    std::thread::scope(|s| {
        for _ in 0..4 {
            let (b, remote_b, labels) = (&b, &remote_b, &labels);
            s.spawn(move || {
                // Every thread asks for every key: concurrent pulls of the
                // same record must all succeed.
                for l in labels {
                    assert!(remote_b.get_record(b, &key(l)).expect("get").is_some());
                }
            });
        }
    });
    let s = remote_b.stats();
    assert!(
        s.hits >= 24 && s.corrupt == 0 && s.errors.is_empty(),
        "{s:?}"
    );
}
