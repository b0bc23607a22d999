//! The remote cache in one run, against a loopback registry (Debian's
//! `docker-registry`, started here on a free 127.0.0.1 port, stopped by PID):
//!
//! 1. library throughput: one record with one blob of 64 MiB / 256 MiB
//!    pushed from a local store (sha256 pass, streamed upload) and pulled
//!    into an empty one (streamed download verified with sha256 and blake3,
//!    zstd into the store, fsync); and 50 small records (2 KiB blob each),
//!    pushed through the bounded background queue and pulled one by one
//!    (per-record latency, what a graph of small nodes pays);
//! 2. builds through the `charly` binary: store A's cold build pushing to
//!    the remote, vs a fresh store B's all-hit build from it, vs a cold
//!    build without any remote (the cost of pushing). Graphs: the graph
//!    fixture's `box build left right --runner fake` (builder stages and
//!    images, fake runner: no podman), and the corpus' `box generate --all`.
//!
//! Run: `cargo bench -p charly-cli --bench remote_e2e` (prints a table).
//! Set `CHARLY_FAKE_DELAY_MS` to give every fake runner call a duration.

#[path = "../tests/registry/mod.rs"]
mod registry;

use charly_testutil as project_copy;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use charly_cache::{NodeKey, Output, Record, Remote, RemoteAuth, RemoteConfig, Store};
use registry::Registry;

const MIB: u64 = 1024 * 1024;

/// Deterministic bytes, about half compressible (tar-like): 4 KiB blocks
/// of xorshift noise alternating with 4 KiB of repeated text.
struct Gen {
    state: u64,
    left: u64,
    pos: u64,
}

impl Gen {
    fn new(seed: u64, size: u64) -> Gen {
        Gen {
            state: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            left: size,
            pos: 0,
        }
    }
}

impl Read for Gen {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.left as usize);
        for b in &mut buf[..n] {
            *b = if (self.pos / 4096).is_multiple_of(2) {
                self.state ^= self.state << 13;
                self.state ^= self.state >> 7;
                self.state ^= self.state << 17;
                self.state as u8
            } else {
                b"usr/share/doc/charly/README "[(self.pos % 28) as usize]
            };
            self.pos += 1;
        }
        self.left -= n as u64;
        Ok(n)
    }
}

fn key(s: &str) -> NodeKey {
    NodeKey::from_bytes(*blake3::hash(format!("{s}-{}", std::process::id()).as_bytes()).as_bytes())
}

fn put(store: &Store, k: &NodeKey, seed: u64, size: u64) {
    let (digest, n) = store
        .put_blob_reader(Gen::new(seed, size))
        .expect("put blob");
    let rec = Record {
        node_id: format!("bench:{}", k.short(8)),
        kind: "builder-stage".into(),
        outputs: BTreeMap::from([(
            "artifact.tar".into(),
            Output {
                digest,
                size: n,
                mode: 0o644,
            },
        )]),
        duration_ms: 1,
        producer: "bench".into(),
        key_inputs: serde_json::Value::Null,
        created_unix: 0,
        meta: serde_json::Value::Null,
    };
    store.put_record(k, &rec).expect("put record");
}

fn remote(url: &str) -> Remote {
    let mut cfg = RemoteConfig::new(url);
    cfg.auth = RemoteAuth::Anonymous;
    Remote::open(cfg).expect("open remote")
}

fn mibs(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / MIB as f64 / d.as_secs_f64()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn throughput(reg: &Registry) {
    println!("## library throughput (loopback docker-registry)");
    println!("| what | size | median of 3 | MiB/s |");
    println!("|---|---|---|---|");
    for size in [64 * MIB, 256 * MIB] {
        let (mut push, mut pull) = (Vec::new(), Vec::new());
        for i in 0..3u64 {
            let url = reg.url(&format!("bench/big{}-{i}", size / MIB));
            let src_dir = tempfile::tempdir().expect("tmp");
            let src = Store::open(src_dir.path()).expect("store");
            let k = key(&format!("big-{size}-{i}"));
            put(&src, &k, 1000 + i + size, size);
            let r = remote(&url);
            let t = Instant::now();
            r.push(&src, &k);
            let rep = r.finish();
            push.push(t.elapsed());
            assert!(rep.ok() && rep.pushed == 1, "{rep:?}");
            let dst_dir = tempfile::tempdir().expect("tmp");
            let dst = Store::open(dst_dir.path()).expect("store");
            let r = remote(&url);
            let t = Instant::now();
            let got = r.get_record(&dst, &k).expect("pull");
            pull.push(t.elapsed());
            assert!(got.is_some(), "{:?}", r.stats());
        }
        let (p, q) = (median(push), median(pull));
        println!(
            "| push 1 record | {} MiB | {:.0} ms | {:.0} |",
            size / MIB,
            p.as_secs_f64() * 1e3,
            mibs(size, p)
        );
        println!(
            "| pull 1 record | {} MiB | {:.0} ms | {:.0} |",
            size / MIB,
            q.as_secs_f64() * 1e3,
            mibs(size, q)
        );
    }
    let url = reg.url("bench/small");
    let src_dir = tempfile::tempdir().expect("tmp");
    let src = Store::open(src_dir.path()).expect("store");
    let keys: Vec<NodeKey> = (0..50).map(|i| key(&format!("small-{i}"))).collect();
    for (i, k) in keys.iter().enumerate() {
        put(&src, k, 7 + i as u64, 2048);
    }
    let r = remote(&url);
    let t = Instant::now();
    for k in &keys {
        r.push(&src, k);
    }
    let rep = r.finish();
    let push = t.elapsed();
    assert!(rep.ok() && rep.pushed == 50, "{rep:?}");
    let dst_dir = tempfile::tempdir().expect("tmp");
    let dst = Store::open(dst_dir.path()).expect("store");
    let r = remote(&url);
    let t = Instant::now();
    for k in &keys {
        assert!(r.get_record(&dst, k).expect("pull").is_some());
    }
    let pull = t.elapsed();
    println!(
        "| push 50 records (4 in flight) | 2 KiB each | {:.0} ms | {:.1} ms/record |",
        push.as_secs_f64() * 1e3,
        push.as_secs_f64() * 1e3 / 50.0
    );
    println!(
        "| pull 50 records (one by one) | 2 KiB each | {:.0} ms | {:.1} ms/record |",
        pull.as_secs_f64() * 1e3,
        pull.as_secs_f64() * 1e3 / 50.0
    );
}

fn charly(store: &Path, project: &Path, remote: Option<&str>, args: &[&str]) -> Duration {
    let summary = store.with_extension("json");
    let mut c = Command::new(env!("CARGO_BIN_EXE_charly"));
    c.env("NO_COLOR", "1")
        .env("CHARLY_CACHE_DIR", store)
        .env_remove("CHARLY_REMOTE")
        .arg("-C")
        .arg(project);
    if let Some(r) = remote {
        c.arg("--remote").arg(r);
    }
    c.args(args).arg("-q").arg("--summary-json").arg(&summary);
    let t = Instant::now();
    let out = c.output().expect("run charly");
    let d = t.elapsed();
    assert!(
        out.status.success(),
        "charly {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&summary).expect("summary")).expect("json");
    let t = &s["totals"];
    let r = &s["remote"];
    eprintln!(
        "    {} nodes: {} ran, {} cached, {} pulled; remote hits {} misses {} down {} B up {} B errors {}",
        t["nodes"],
        t["ran"],
        t["cached"],
        t["pulled"],
        r["hits"],
        r["misses"],
        r["bytes_down"],
        r["bytes_up"],
        r["errors"].as_array().map_or(0, Vec::len)
    );
    d
}

fn builds(reg: &Registry) {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let fixture = manifest.join("../tests/fixtures/graph");
    let corpus = std::env::var_os("CHARLY_BENCH_CORPUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.join("../../shared/corpus/overthink"));
    println!();
    println!("## builds through the charly binary (median of 3)");
    println!("| graph | cold, no remote | A: cold + push | B: all hits from remote | B / A |");
    println!("|---|---|---|---|---|");
    let cases: Vec<(&str, PathBuf, Vec<&str>)> = vec![
        (
            "fixture `box build left right --runner fake`",
            fixture,
            vec!["box", "build", "left", "right", "--runner", "fake"],
        ),
        (
            "corpus `box generate --all`",
            corpus,
            vec!["box", "generate", "--all", "--out", "OUT"],
        ),
    ];
    for (ci, (name, src, args)) in cases.into_iter().enumerate() {
        if !src.join("charly.yml").exists() {
            println!("| {name} | skipped: {} not found | | | |", src.display());
            continue;
        }
        let (mut plain, mut cold, mut hit) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..3 {
            let t = tempfile::tempdir().expect("tmp");
            let url = reg.url(&format!("bench/build{ci}-{i}"));
            let run = |m: &str, remote: Option<&str>| {
                let project = t.path().join(m).join("project");
                // The fixture builds in place: a copy each; the corpus is
                // only read (output goes to --out).
                let project = if ci == 0 {
                    project_copy::copy_project(&src, &project);
                    project
                } else {
                    src.clone()
                };
                let out = t.path().join(m).join("out");
                let out = out.display().to_string();
                let args: Vec<&str> = args
                    .iter()
                    .map(|a| if *a == "OUT" { out.as_str() } else { a })
                    .collect();
                eprintln!("  {name} #{i} {m}");
                charly(&t.path().join(m).join("store"), &project, remote, &args)
            };
            plain.push(run("plain", None));
            cold.push(run("a", Some(&url)));
            hit.push(run("b", Some(&url)));
        }
        let (p, a, b) = (median(plain), median(cold), median(hit));
        println!(
            "| {name} | {:.0} ms | {:.0} ms | {:.0} ms | {:.2} |",
            p.as_secs_f64() * 1e3,
            a.as_secs_f64() * 1e3,
            b.as_secs_f64() * 1e3,
            b.as_secs_f64() / a.as_secs_f64()
        );
    }
}

fn main() {
    // `cargo test --all-targets` runs benches as tests: do nothing there.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let Some(reg) = Registry::start() else { return };
    throughput(&reg);
    builds(&reg);
}
