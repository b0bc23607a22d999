//! Remote cache throughput against a loopback registry (Debian's
//! `docker-registry`, started here on a free 127.0.0.1 port, stopped by PID).
//!
//! * `push/<size>`: one record with one new blob of that size, from a local
//!   store to the registry (sha256 pass over the local blob, existence
//!   checks, streamed upload, record and manifest). Content is new in every
//!   iteration, since the registry dedups blobs.
//! * `pull/<size>`: the same record from the registry into an empty local
//!   store (manifest, record, streamed download verified with sha256 and
//!   blake3, compression into the store, fsync, record commit).
//! * `records/push_50` and `records/pull_50`: 50 small records (a
//!   Containerfile-sized blob each): per-record latency, which is what a
//!   build of many small nodes pays.
//!
//! Run: `CARGO_TARGET_DIR=/work/target-remote cargo bench -p charly-cache --bench remote`
//! (`-- --quick` for a fast look). The data is fairly compressible,
//! tar-like bytes.

#[path = "../tests/remote_common/mod.rs"]
mod remote_common;

use std::collections::BTreeMap;
use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use charly_cache::{NodeKey, Output, Record, Remote, RemoteAuth, RemoteConfig, Store};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use remote_common::{Generated, Registry};

const MIB: u64 = 1024 * 1024;

static SEED: AtomicU64 = AtomicU64::new(1);

fn fresh_key() -> NodeKey {
    let n = SEED.fetch_add(1, Ordering::Relaxed);
    NodeKey::from_bytes(
        *blake3::hash(format!("bench-{n}-{}", std::process::id()).as_bytes()).as_bytes(),
    )
}

fn remote(url: &str) -> Remote {
    let mut cfg = RemoteConfig::new(url);
    cfg.auth = RemoteAuth::Anonymous;
    Remote::open(cfg).expect("open remote")
}

/// A store holding one new record with one blob of `size` bytes.
fn store_with_record(size: u64) -> (tempfile::TempDir, Store, NodeKey) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("store");
    let key = fresh_key();
    let seed = SEED.fetch_add(1, Ordering::Relaxed);
    let (digest, n) = store
        .put_blob_reader(Generated::new(seed, size))
        .expect("put blob");
    put_record(&store, &key, digest, n);
    (dir, store, key)
}

fn put_record(store: &Store, key: &NodeKey, digest: charly_cache::BlobDigest, size: u64) {
    let rec = Record {
        node_id: format!("bench:{}", key.short(8)),
        kind: "builder-stage".into(),
        outputs: BTreeMap::from([(
            "artifact.tar".into(),
            Output {
                digest,
                size,
                mode: 0o644,
            },
        )]),
        duration_ms: 1,
        producer: "bench".into(),
        key_inputs: serde_json::Value::Null,
        created_unix: 0,
        meta: serde_json::Value::Null,
    };
    store.put_record(key, &rec).expect("put record");
}

fn blobs(c: &mut Criterion, reg: &Registry) {
    let url = reg.url("bench/blobs");
    let push_remote = remote(&url);
    let mut g = c.benchmark_group("push");
    for size in [4 * MIB, 64 * MIB] {
        g.throughput(Throughput::Bytes(size));
        g.bench_function(format!("{}MiB", size / MIB), |b| {
            b.iter_batched(
                || store_with_record(size),
                |(_dir, store, key)| {
                    push_remote.push(&store, &key);
                    let r = push_remote.finish();
                    assert!(r.ok() && r.pushed == 1, "{r:?}");
                },
                BatchSize::PerIteration,
            );
        });
    }
    g.finish();

    let mut g = c.benchmark_group("pull");
    for size in [4 * MIB, 64 * MIB] {
        let (_dir, store, key) = store_with_record(size);
        push_remote.push(&store, &key);
        assert!(push_remote.finish().ok());
        g.throughput(Throughput::Bytes(size));
        g.bench_function(format!("{}MiB", size / MIB), |b| {
            b.iter_batched(
                || {
                    let dir = tempfile::tempdir().expect("tempdir");
                    let store = Store::open(dir.path()).expect("store");
                    (dir, store, remote(&url))
                },
                |(_dir, store, r)| {
                    assert!(r.get_record(&store, &key).expect("pull").is_some());
                },
                BatchSize::PerIteration,
            );
        });
    }
    g.finish();
}

fn records(c: &mut Criterion, reg: &Registry) {
    let url = reg.url("bench/records");
    let push_remote = remote(&url);
    let mut g = c.benchmark_group("records");
    g.throughput(Throughput::Elements(50));
    g.bench_function("push_50", |b| {
        b.iter_batched(
            || {
                let dir = tempfile::tempdir().expect("tempdir");
                let store = Store::open(dir.path()).expect("store");
                let keys: Vec<NodeKey> = (0..50)
                    .map(|_| {
                        let k = fresh_key();
                        let mut text = Vec::new();
                        let seed = SEED.fetch_add(1, Ordering::Relaxed);
                        Generated::new(seed, 2000)
                            .read_to_end(&mut text)
                            .expect("gen");
                        let d = store.put_blob(&text).expect("blob");
                        put_record(&store, &k, d, text.len() as u64);
                        k
                    })
                    .collect();
                (dir, store, keys)
            },
            |(_dir, store, keys)| {
                for k in &keys {
                    push_remote.push(&store, k);
                }
                let r = push_remote.finish();
                assert!(r.ok() && r.pushed == 50, "{r:?}");
            },
            BatchSize::PerIteration,
        );
    });
    // One set of 50 records to pull again and again.
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("store");
    let keys: Vec<NodeKey> = (0..50)
        .map(|i| {
            let k = fresh_key();
            let text = format!("FROM fedora:42\nRUN echo {i}\n").repeat(20);
            let d = store.put_blob(text.as_bytes()).expect("blob");
            put_record(&store, &k, d, text.len() as u64);
            push_remote.push(&store, &k);
            k
        })
        .collect();
    assert!(push_remote.finish().ok());
    g.bench_function("pull_50", |b| {
        b.iter_batched(
            || {
                let dir = tempfile::tempdir().expect("tempdir");
                let store = Store::open(dir.path()).expect("store");
                (dir, store, remote(&url))
            },
            |(_dir, store, r)| {
                for k in &keys {
                    assert!(r.get_record(&store, k).expect("pull").is_some());
                }
            },
            BatchSize::PerIteration,
        );
    });
    g.finish();
}

fn all(c: &mut Criterion) {
    let Some(reg) = Registry::start() else {
        eprintln!("remote benchmarks skipped: no registry");
        return;
    };
    blobs(c, &reg);
    records(c, &reg);
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(8));
    targets = all
}
criterion_main!(benches);
