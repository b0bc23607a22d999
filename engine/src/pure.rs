//! The no-op journal for commands that only print: `box plan`, `box list`,
//! `graph`, `box build --dry-run`.
//!
//! Their stdout is a function of the project's files (and, where they print
//! whether a node is in the store, of which keys the store holds), so the
//! same [`Journal`] that lets `box generate` skip an unchanged project
//! answers them too: a run records exactly the bytes it printed and the
//! notes it wrote to stderr; a later run of the same command whose inputs,
//! binary and store epoch are unchanged, and for which the store still
//! lacks every node reported as not built ([`Journal::check_store`]),
//! prints them again without loading anything. Only successful runs are
//! recorded, so a replay always exits 0, as the run it repeats did.
//!
//! The project's inputs are fingerprinted on another thread while the
//! command runs (from a start taken before it reads anything), as for
//! `box generate`.

use crate::journal::{Journal, Miss, Outcome, Scope};

/// What a command printed, for [`run`] to record.
#[derive(Debug, Default)]
pub struct Printed {
    /// Everything it wrote to stdout.
    pub stdout: Vec<u8>,
    /// Lines for people it wants written to stderr (after stdout; a
    /// replay writes them again).
    pub notes: Vec<String>,
    /// Lines for people it already wrote to stderr (warnings about boxes
    /// left out; a replay writes them before the notes).
    pub said: Vec<String>,
    /// Nodes it reported as not in the store: id, key hex.
    pub absent: Vec<(String, String)>,
    /// Whether what it printed depends on every record it found, so that a
    /// replay needs the store's index as this run left it
    /// ([`Journal::store_index`]).
    pub uses_store: bool,
    /// Whether the command failed (exit 1 after printing): not recorded.
    pub failed: bool,
    /// Whether everything it read lies inside the journal's scope
    /// ([`Scope::covers_project`]); a run that read outside it (or ran a
    /// plugin) is not recorded.
    pub covered: bool,
}

/// Whether the answer came from the journal, and why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replay {
    /// Replayed: nothing was loaded.
    Replayed,
    /// Run in full, because of this.
    Missed(Miss),
    /// No journal for this run (the caller knows why).
    Off,
}

/// What to print: a replay's recorded output or a full run's.
#[derive(Debug)]
pub struct Answer {
    /// The bytes for stdout.
    pub stdout: Vec<u8>,
    /// The lines still to write to stderr.
    pub notes: Vec<String>,
    /// Where they came from.
    pub replay: Replay,
    /// Whether the command failed (never a replay: failures are not recorded).
    pub failed: bool,
}

/// Answers a printing command: from `journal` when it can replay, else by
/// `full` (whose successful result is recorded for next time).
pub fn run<E>(
    journal: Option<(&Journal, &Scope)>,
    full: impl FnOnce(&Scope) -> Result<Printed, E>,
) -> Result<Answer, E> {
    let Some((j, scope)) = journal else {
        let p = full(&Scope::default())?;
        return Ok(Answer {
            stdout: p.stdout,
            notes: p.notes,
            replay: Replay::Off,
            failed: p.failed,
        });
    };
    let t = crate::timings::phase("journal: check");
    let miss = match j.check().and_then(|o| j.check_store(&o).map(|()| o)) {
        Ok(o) => {
            return Ok(Answer {
                stdout: o.raw.unwrap_or_default(),
                notes: o.warnings.into_iter().chain(o.notes).collect(),
                replay: Replay::Replayed,
                failed: false,
            });
        }
        Err(m) => m,
    };
    drop(t);
    let started = j.start();
    let (rec, printed) = std::thread::scope(|s| {
        let walk = s.spawn(|| {
            let _t = crate::timings::phase("journal: begin");
            j.fingerprint_inputs(started, &scope.roots, &scope.files, &scope.skip)
        });
        let printed = full(scope);
        let rec = walk.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        (rec, printed)
    });
    let p = printed?;
    if p.failed {
        return Ok(Answer {
            stdout: p.stdout,
            notes: p.notes,
            replay: Replay::Missed(miss),
            failed: true,
        });
    }
    let mut rec = rec;
    if !p.covered {
        rec.spoil();
    }
    let _t = crate::timings::phase("journal: record");
    let outcome = Outcome {
        raw: Some(p.stdout.clone()),
        warnings: p.said,
        notes: p.notes.clone(),
        absent: p.absent,
        ..Outcome::default()
    };
    // A journal that cannot be written only costs the next run its replay.
    let outputs = if p.uses_store {
        j.store_index()
    } else {
        Vec::new()
    };
    let _ = j.record(rec, &outputs, &[], outcome);
    Ok(Answer {
        stdout: p.stdout,
        notes: p.notes,
        replay: Replay::Missed(miss),
        failed: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn fixture() -> (tempfile::TempDir, Journal, Scope) {
        let t = tempfile::tempdir().expect("tmp");
        let proj = t.path().join("p");
        std::fs::create_dir_all(proj.join("candy/a")).expect("mkdir");
        std::fs::write(proj.join("charly.yml"), "version: 1\n").expect("write");
        let store = t.path().join("store");
        let mut j = Journal::new(&store, "plan x");
        j.racy_ns = 0;
        let scope = Scope::project(&proj, &[], &store);
        (t, j, scope)
    }

    fn printed(out: &[u8], absent: &[(&str, String)]) -> Printed {
        Printed {
            stdout: out.to_vec(),
            notes: vec!["a note".into()],
            absent: absent
                .iter()
                .map(|(i, k)| (i.to_string(), k.clone()))
                .collect(),
            covered: true,
            ..Printed::default()
        }
    }

    #[test]
    fn a_second_run_replays_the_exact_bytes_until_an_input_changes() {
        let (t, j, scope) = fixture();
        // No trailing newline, not valid as lines: bytes are bytes.
        let out = b"line one\n\tline two";
        let a = run::<()>(Some((&j, &scope)), |_| Ok(printed(out, &[]))).expect("run");
        assert_eq!(a.replay, Replay::Missed(Miss::NoEntry));
        let b = run::<()>(Some((&j, &scope)), |_| panic!("must replay")).expect("replay");
        assert_eq!(b.replay, Replay::Replayed);
        assert_eq!(b.stdout, out);
        assert_eq!(b.notes, vec!["a note".to_string()]);
        let file = t.path().join("p/charly.yml");
        std::fs::write(&file, "version: 2\n").expect("edit");
        let c = run::<()>(Some((&j, &scope)), |_| Ok(printed(b"new", &[]))).expect("run");
        assert_eq!(
            c.replay,
            Replay::Missed(Miss::Input(file.display().to_string()))
        );
        assert_eq!(c.stdout, b"new");
    }

    #[test]
    fn failures_and_uncovered_runs_are_not_recorded() {
        let (_t, j, scope) = fixture();
        assert!(run::<&str>(Some((&j, &scope)), |_| Err("no")).is_err());
        let mut p = printed(b"x", &[]);
        p.failed = true;
        let a = run::<()>(Some((&j, &scope)), |_| Ok(p)).expect("run");
        assert!(a.failed);
        let mut p = printed(b"x", &[]);
        p.covered = false;
        let a = run::<()>(Some((&j, &scope)), |_| Ok(p)).expect("run");
        assert_eq!(
            a.replay,
            Replay::Missed(Miss::NoEntry),
            "the failure left none"
        );
        let a = run::<()>(Some((&j, &scope)), |_| Ok(printed(b"y", &[]))).expect("run");
        assert_eq!(a.replay, Replay::Missed(Miss::Unreplayable));
    }

    #[test]
    fn a_record_added_for_a_node_reported_absent_misses() {
        let (t, j, scope) = fixture();
        let store = charly_cache::Store::open(&t.path().join("store")).expect("store");
        let key: charly_cache::NodeKey = "cd".repeat(32).parse().expect("key");
        let absent = [("image:a", key.to_hex())];
        run::<()>(Some((&j, &scope)), |_| Ok(printed(b"would run", &absent))).expect("run");
        let b = run::<()>(Some((&j, &scope)), |_| panic!("must replay")).expect("replay");
        assert_eq!(b.replay, Replay::Replayed);
        let rec = charly_cache::Record {
            node_id: "image:a".into(),
            kind: "image".into(),
            outputs: Default::default(),
            duration_ms: 0,
            producer: "test".into(),
            key_inputs: serde_json::Value::Null,
            created_unix: 0,
            meta: serde_json::Value::Null,
        };
        store.put_record(&key, &rec).expect("put");
        let mut p = printed(b"cached", &[]);
        p.uses_store = true;
        let c = run::<()>(Some((&j, &scope)), |_| Ok(p)).expect("run");
        assert_eq!(c.replay, Replay::Missed(Miss::Added("image:a".into())));
        // A run that depends on the whole index: any write misses.
        let d = run::<()>(Some((&j, &scope)), |_| panic!("must replay")).expect("replay");
        assert_eq!(d.stdout, b"cached");
        let key2: charly_cache::NodeKey = "ef".repeat(32).parse().expect("key");
        store.put_record(&key2, &rec).expect("put");
        drop(store);
        let e = run::<()>(Some((&j, &scope)), |_| Ok(printed(b"more", &[]))).expect("run");
        assert_eq!(e.replay, Replay::Missed(Miss::StoreIndex));
        assert!(Path::new(&t.path().join("store/journal")).is_dir());
    }
}
