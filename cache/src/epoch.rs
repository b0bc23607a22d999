//! The store's deletion epoch.
//!
//! Readers that remember "these records exist" without asking the index each
//! time (the engine's no-op journal) need to know when records or blobs may
//! have gone away. Every operation that deletes from the store — GC, a
//! repairing verify, quarantining a bad blob — first replaces the token in
//! `<store>/epoch` with a fresh one. A reader that saw token T before it
//! started and still sees T knows nothing was deleted in between. Adding
//! never changes the epoch.

use crate::error::{CacheError, IoContext};
use crate::store::Store;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

const EPOCH_FILE: &str = "epoch";

static BUMPS: AtomicU64 = AtomicU64::new(0);

/// The epoch token of the store in `dir` (empty when nothing was ever
/// deleted, or the store does not exist). Reads one small file; does not
/// open the store.
pub fn read_epoch(dir: &Path) -> String {
    std::fs::read_to_string(dir.join(EPOCH_FILE)).unwrap_or_default()
}

impl Store {
    /// This store's epoch token (see the module docs).
    pub fn epoch(&self) -> String {
        read_epoch(self.dir())
    }

    /// Replaces the epoch token before a deletion (atomically: temp file
    /// in the session directory, then rename).
    pub(crate) fn bump_epoch(&self) -> Result<(), CacheError> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let token = format!(
            "{nanos}.{}.{}",
            std::process::id(),
            BUMPS.fetch_add(1, Ordering::Relaxed)
        );
        let path = self.dir().join(EPOCH_FILE);
        let tmp = self.session.dir().join(format!("epoch.{token}"));
        std::fs::write(&tmp, token.as_bytes()).at("writing", &tmp)?;
        std::fs::rename(&tmp, &path).at("renaming into place", &path)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bump_gives_a_new_token() {
        let t = tempfile::tempdir().expect("tmp");
        let s = Store::open(t.path()).expect("open");
        assert_eq!(s.epoch(), "");
        s.bump_epoch().expect("bump");
        let one = read_epoch(t.path());
        assert!(!one.is_empty());
        s.bump_epoch().expect("bump");
        assert_ne!(read_epoch(t.path()), one);
    }
}
