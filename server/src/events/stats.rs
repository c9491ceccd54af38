//! [`PlaneStats`]: what the event plane has applied, counted on its thread
//! and read by `/metrics` (`loadgate_frontend_event_loads_applied_total`,
//! `loadgate_frontend_event_busy_flips_total`).

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of the event plane's thread. Each is a relaxed increment where
/// it happens: one thread writes them, and a reader wants a total, not an
/// order with anything else.
#[derive(Debug, Default)]
pub struct PlaneStats {
    loads_applied: AtomicU64,
    busy_flips: AtomicU64,
}

impl PlaneStats {
    /// A Load frame was stored (`flipped`: and its worker's busy bit flipped).
    #[inline]
    pub(crate) fn load_applied(&self, flipped: bool) {
        // Relaxed: a counter, read on its own.
        self.loads_applied.fetch_add(1, Ordering::Relaxed);
        if flipped {
            self.busy_flips.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Load frames the monitor stored (stale, contended and other
    /// incarnations' reports not counted).
    pub fn loads_applied(&self) -> u64 {
        // Relaxed: a counter read on its own.
        self.loads_applied.load(Ordering::Relaxed)
    }

    /// Of those, the ones that flipped their worker's busy bit.
    pub fn busy_flips(&self) -> u64 {
        // Relaxed: a counter read on its own.
        self.busy_flips.load(Ordering::Relaxed)
    }
}
