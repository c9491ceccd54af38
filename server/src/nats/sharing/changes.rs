//! [`Changes`]: which (worker, rank) the router's tracking just changed,
//! for the publisher. Bounded: when the publisher falls behind, a flag
//! says "some were lost" and it republishes everything it tracks instead.

use std::sync::atomic::{AtomicBool, Ordering};

use loadgate::WorkerId;
use tokio::sync::mpsc;

/// Changes noted and not yet published, at most.
const CAPACITY: usize = 4096;

/// The request side: notes a change (never waits, never grows past
/// [`CAPACITY`]).
#[derive(Debug)]
pub(crate) struct Changes {
    tx: mpsc::Sender<(WorkerId, u32)>,
    /// Set when a note found the channel full.
    lost: std::sync::Arc<AtomicBool>,
}

/// The publisher side.
#[derive(Debug)]
pub(crate) struct ChangeFeed {
    pub(crate) rx: mpsc::Receiver<(WorkerId, u32)>,
    lost: std::sync::Arc<AtomicBool>,
}

/// A connected pair.
pub(crate) fn changes() -> (Changes, ChangeFeed) {
    let (tx, rx) = mpsc::channel(CAPACITY);
    let lost = std::sync::Arc::new(AtomicBool::new(false));
    (Changes { tx, lost: lost.clone() }, ChangeFeed { rx, lost })
}

impl Changes {
    /// The tracked load of `worker`'s `rank` changed.
    pub(crate) fn note(&self, worker: WorkerId, rank: u32) {
        if self.tx.try_send((worker, rank)).is_err() {
            // Relaxed: a hint the publisher takes with its next batch; the
            // worst a late read costs is one more full republication.
            self.lost.store(true, Ordering::Relaxed);
        }
    }
}

impl ChangeFeed {
    /// Whether changes were lost since the last call (then everything
    /// tracked must be published again).
    pub(crate) fn take_lost(&self) -> bool {
        // Relaxed: see `Changes::note`.
        self.lost.swap(false, Ordering::Relaxed)
    }
}
