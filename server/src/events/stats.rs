//! [`PlaneStats`]: what the event plane has applied, counted on its thread
//! and read by `/metrics` (`loadgate_frontend_event_loads_applied_total`,
//! `loadgate_frontend_event_busy_flips_total`), and how late the NATS plane
//! applies flips (`loadgate_frontend_event_flip_lag_seconds`).

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::metrics::histogram::Histogram;

/// Upper bounds of the flip lag's buckets (seconds): the sender's clock has
/// millisecond resolution.
const FLIP_LAG_BUCKETS: [f64; 12] = [0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0];

/// Counters of the event plane's thread. Each is a relaxed increment where
/// it happens: one thread writes them, and a reader wants a total, not an
/// order with anything else.
#[derive(Debug)]
pub struct PlaneStats {
    loads_applied: AtomicU64,
    busy_flips: AtomicU64,
    /// From a flip's seal to its application (NATS plane only: its frames
    /// carry the sender's clock).
    flip_lag: Histogram,
    /// NATS frames dropped unopened (no secret, altered, moved) or
    /// refused after opening (clock, subject, incarnation).
    unsealed: AtomicU64,
    refused: AtomicU64,
    /// Other frontends' FrontendLoad frames applied (shared load).
    shared_loads: AtomicU64,
    /// Frontends counting together, this one included (0: not sharing).
    shared_frontends: AtomicU64,
}

impl Default for PlaneStats {
    fn default() -> Self {
        PlaneStats {
            loads_applied: AtomicU64::default(),
            busy_flips: AtomicU64::default(),
            flip_lag: Histogram::new(FLIP_LAG_BUCKETS),
            unsealed: AtomicU64::default(),
            refused: AtomicU64::default(),
            shared_loads: AtomicU64::default(),
            shared_frontends: AtomicU64::default(),
        }
    }
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

    /// A flip sealed at `sent_ms` was applied now (`now_ms`, the same
    /// clock: both on one host, or synchronised).
    pub(crate) fn flip_lag(&self, sent_ms: u64, now_ms: u64) {
        self.flip_lag.observe(now_ms.saturating_sub(sent_ms) as f64 / 1000.0);
    }

    /// A NATS frame was dropped: its envelope did not open (`unsealed`), or
    /// it opened and was refused.
    pub(crate) fn frame_dropped(&self, unsealed: bool) {
        // Relaxed: counters, read on their own.
        let counter = if unsealed { &self.unsealed } else { &self.refused };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Another frontend's load was applied.
    pub(crate) fn shared_load_applied(&self) {
        // Relaxed: a counter, read on its own.
        self.shared_loads.fetch_add(1, Ordering::Relaxed);
    }

    /// How many frontends count together now (this one included).
    pub(crate) fn set_shared_frontends(&self, live: usize) {
        // Relaxed: a gauge, read on its own.
        self.shared_frontends.store(live as u64, Ordering::Relaxed);
    }

    /// (Other frontends' loads applied, frontends counting together.)
    pub fn shared(&self) -> (u64, u64) {
        // Relaxed: read on their own.
        (self.shared_loads.load(Ordering::Relaxed), self.shared_frontends.load(Ordering::Relaxed))
    }

    /// NATS frames dropped: (unopened, refused after opening).
    pub fn frames_dropped(&self) -> (u64, u64) {
        // Relaxed: counters read on their own.
        (self.unsealed.load(Ordering::Relaxed), self.refused.load(Ordering::Relaxed))
    }

    /// The flip lag histogram (for `/metrics`).
    pub(crate) fn flip_lag_histogram(&self) -> Histogram {
        self.flip_lag.clone()
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
