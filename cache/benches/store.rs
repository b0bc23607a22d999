//! Store throughput and lookup latency.
//!
//! * `put_new`: store content that is not there yet (hash, compress, fsync,
//!   rename, index) — the blob file is deleted between iterations;
//! * `put_existing`: store content that is already there (hash + index touch);
//! * `get` / `copy_to`: verified reads (decompress + blake3) into memory or a
//!   file; `baseline_fresh_buffer` is what merely faulting in a fresh output
//!   buffer costs (on a VM page faults can be a large share of `get`);
//! * `records`: one `get_record` hit in a store of 10,000 records, a whole
//!   no-op pass over all 10,000 (what a no-op build does), and `put_record`.
//!
//! Data is compressible, tar-like text (zstd level 3 shrinks it ~3x), which is
//! what builder artifacts and Containerfiles mostly are.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use charly_cache::{BlobDigest, NodeKey, Output, Record, Store};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use rayon::prelude::*;

const MIB: usize = 1024 * 1024;

/// Compressible bytes: words from a small vocabulary with random numbers mixed in.
fn data(len: usize) -> Vec<u8> {
    const WORDS: [&[u8]; 12] = [
        b"usr/lib/node_modules/",
        b"package.json",
        b"\x00\x00\x00\x00",
        b"ustar  ",
        b"0000755",
        b"index.js ",
        b"module.exports = require(",
        b"); ",
        b"\n",
        b"function ",
        b"return ",
        b"const ",
    ];
    let mut out = Vec::with_capacity(len + 32);
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(WORDS[(x % 12) as usize]);
        if x.is_multiple_of(3) {
            out.extend_from_slice(format!("{:x}", x >> 40).as_bytes());
        }
    }
    out.truncate(len);
    out
}

fn blob_path(store: &Store, d: &BlobDigest) -> PathBuf {
    let hex = d.to_hex();
    store.dir().join("blobs").join(&hex[..2]).join(hex)
}

fn blobs(c: &mut Criterion) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = Store::open(tmp.path()).expect("open");
    for (label, size) in [("1MiB", MIB), ("64MiB", 64 * MIB)] {
        let bytes = data(size);
        let d = store.put_blob(&bytes).expect("put");
        let mut g = c.benchmark_group(format!("blob/{label}"));
        g.throughput(Throughput::Bytes(size as u64));
        if size > MIB {
            g.sample_size(10);
        }
        g.bench_function("put_new", |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    std::fs::remove_file(blob_path(&store, &d)).expect("rm blob");
                    let t = Instant::now();
                    black_box(store.put_blob(&bytes).expect("put"));
                    total += t.elapsed();
                }
                total
            })
        });
        g.bench_function("put_existing", |b| {
            b.iter(|| black_box(store.put_blob(&bytes).expect("put")))
        });
        g.bench_function("get", |b| {
            b.iter(|| {
                let got = store.get_blob(&d).expect("get").expect("hit");
                assert_eq!(got.len(), size);
                black_box(got)
            })
        });
        // Reference point for `get`: the cost of merely faulting in a fresh
        // output buffer of this size (on all cores), which every `get` pays.
        g.bench_function("baseline_fresh_buffer", |b| {
            b.iter(|| {
                let mut v = vec![0u8; size];
                v.par_chunks_mut(64 * 1024).for_each(|c| {
                    for page in c.chunks_mut(4096) {
                        page[0] = 1;
                    }
                });
                black_box(v)
            })
        });
        let dest = tmp.path().join("copy.out");
        g.bench_function("copy_to", |b| {
            b.iter(|| assert!(store.copy_blob_to(&d, &dest).expect("copy")))
        });
        g.finish();
    }
}

fn key(i: u64) -> NodeKey {
    NodeKey::from_bytes(*blake3::hash(&i.to_le_bytes()).as_bytes())
}

fn records(c: &mut Criterion) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = Store::open(tmp.path()).expect("open");
    let n = 10_000u64;
    let outs: Vec<Output> = (0..4u64)
        .map(|i| {
            let b = data(2000 + i as usize);
            Output {
                digest: store.put_blob(&b).expect("put"),
                size: b.len() as u64,
                mode: 0o644,
            }
        })
        .collect();
    let record = |i: u64| Record {
        node_id: format!("fragment:fedora/pkg{i}"),
        kind: "fragment".into(),
        outputs: BTreeMap::from([
            ("containerfile".to_string(), outs[(i % 4) as usize].clone()),
            (
                "context.tar".to_string(),
                outs[((i + 1) % 4) as usize].clone(),
            ),
        ]),
        duration_ms: 12,
        producer: "generate".into(),
        key_inputs: serde_json::json!({
            "kind": "fragment",
            "template": "RUN dnf install -y {{ .Packages }}",
            "files": { "candy/ripgrep/charly.yml": "ab12cd34ef56", "charly.yml": "0011223344" },
            "deps": [key(i + 1).to_hex(), key(i + 2).to_hex()],
            "schema": 1
        }),
        created_unix: 1_700_000_000 + i,
        meta: serde_json::json!({}),
    };
    for i in 0..n {
        store.put_record(&key(i), &record(i)).expect("put record");
    }
    store.flush().expect("flush");

    let mut g = c.benchmark_group("records");
    let mut i = 0u64;
    g.bench_function("get_record_hit", |b| {
        b.iter(|| {
            i = (i + 7919) % n;
            black_box(store.get_record(&key(i)).expect("get").expect("hit"))
        })
    });
    // What a scheduler asks of every cached node: the record is there and
    // its blobs are present (no decode of the blobs).
    g.bench_function("has_record_hit", |b| {
        b.iter(|| {
            i = (i + 7919) % n;
            assert!(black_box(store.has_record(&key(i)).expect("has")))
        })
    });
    g.bench_function("get_record_miss", |b| {
        b.iter(|| black_box(store.get_record(&key(n + 1)).expect("get")))
    });
    g.sample_size(10);
    g.bench_function("noop_build_10k_lookups", |b| {
        b.iter(|| {
            for i in 0..n {
                black_box(store.get_record(&key(i)).expect("get").expect("hit"));
            }
        })
    });
    g.finish();

    let mut g = c.benchmark_group("records");
    let mut next = n;
    g.bench_function("put_record", |b| {
        b.iter_batched(
            || {
                next += 1;
                (key(next), record(next))
            },
            |(k, r)| assert!(store.put_record(&k, &r).expect("put")),
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, blobs, records);
criterion_main!(benches);
