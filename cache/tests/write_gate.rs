//! The threads of one process never wait for each other in SQLite's busy
//! handler (its sleeps start at 1 ms, for transactions of tens of
//! microseconds): their write transactions queue on the store's own gate.
//! On its own in this test binary, so no other test's waits are counted.

use charly_cache::{Store, busy_waits};

#[test]
fn one_process_writing_from_many_threads_never_sleeps_on_the_index_lock() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = Store::open(tmp.path()).expect("open");
    let before = busy_waits();
    std::thread::scope(|s| {
        for t in 0..4 {
            let store = &store;
            s.spawn(move || {
                for i in 0..150 {
                    let body = format!("thread {t} blob {i}");
                    store.put_blob(body.as_bytes()).expect("put");
                }
            });
        }
    });
    assert_eq!(store.stats().expect("stats").blobs, 600);
    assert_eq!(busy_waits() - before, 0, "a thread slept on the index lock");
}
