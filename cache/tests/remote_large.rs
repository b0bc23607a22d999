//! A blob far larger than any buffer goes up and down without ever being
//! held in memory whole. Its own test binary (own process), so the peak
//! resident size measured is this test's alone.

mod remote_common;

use std::collections::BTreeMap;

use charly_cache::{NodeKey, Output, Record, Remote, RemoteAuth, RemoteConfig, Store};
use remote_common::{Generated, Registry};

const MIB: u64 = 1024 * 1024;
const SIZE: u64 = 256 * MIB + 12_345;

/// Peak resident set size of this process, in bytes.
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .expect("VmHWM")
}

/// Resets the peak resident set size to the current one (Linux ≥ 4.0).
fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

#[test]
fn a_256_mib_blob_streams_up_and_down_in_bounded_memory() {
    let Some(reg) = Registry::start() else { return };
    let url = reg.url("charly/large");
    let da = tempfile::tempdir().expect("tempdir");
    let a = Store::open(da.path()).expect("store");
    let (digest, size) = a
        .put_blob_reader(Generated::new(99, SIZE))
        .expect("put blob");
    assert_eq!(size, SIZE);
    let key = NodeKey::from_bytes([7; 32]);
    let rec = Record {
        node_id: "image:big".into(),
        kind: "image".into(),
        outputs: BTreeMap::from([(
            "archive".into(),
            Output {
                digest,
                size,
                mode: 0o644,
            },
        )]),
        duration_ms: 1,
        producer: "podman".into(),
        key_inputs: serde_json::Value::Null,
        created_unix: 0,
        meta: serde_json::Value::Null,
    };
    a.put_record(&key, &rec).expect("record");

    let mut cfg = RemoteConfig::new(url.clone());
    cfg.auth = RemoteAuth::Anonymous;
    let remote = Remote::open(cfg.clone()).expect("open");
    let can_measure = reset_peak();
    let before = peak_rss();

    remote.push(&a, &key);
    let r = remote.finish();
    assert!(r.ok() && r.pushed == 1, "{r:?}");
    assert!(r.bytes_up >= SIZE);

    let db = tempfile::tempdir().expect("tempdir");
    let b = Store::open(db.path()).expect("store");
    let remote_b = Remote::open(cfg).expect("open");
    let got = remote_b.get_record(&b, &key).expect("pull");
    assert_eq!(got.as_ref(), Some(&rec));
    assert!(remote_b.stats().bytes_down >= SIZE);

    let growth = peak_rss().saturating_sub(before);
    eprintln!(
        "peak RSS growth while pushing and pulling: {} MiB",
        growth / MIB
    );
    if can_measure {
        assert!(
            growth < 160 * MIB,
            "peak memory grew by {} MiB moving a {} MiB blob",
            growth / MIB,
            SIZE / MIB
        );
    } else {
        eprintln!(
            "(peak RSS reset unsupported here; growth {} MiB not checked)",
            growth / MIB
        );
    }

    // Byte-identical, compared without loading either copy whole.
    let (fa, fb) = (da.path().join("out-a"), db.path().join("out-b"));
    assert!(a.copy_blob_to(&digest, &fa).expect("copy"));
    assert!(b.copy_blob_to(&digest, &fb).expect("copy"));
    let hash = |p: &std::path::Path| {
        let mut h = blake3::Hasher::new();
        h.update_mmap(p).expect("hash");
        h.finalize()
    };
    assert_eq!(hash(&fa), hash(&fb));
    assert_eq!(hash(&fa).as_bytes(), digest.as_bytes());
}
