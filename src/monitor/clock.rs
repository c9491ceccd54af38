//! [`MonitorClock`]: the monitor's time in nanoseconds, the staleness
//! windows that decide whether a report still counts, and the fleet's lease
//! that decides how much of other frontends' unseen load to assume.

use std::time::Duration;

use super::lease::Lease;
use crate::sync::{AtomicU64, Ordering};

/// The clock reports are stamped with, and the staleness window.
pub(crate) struct MonitorClock {
    clock: quanta::Clock,
    base: quanta::Instant,
    staleness_ns: u64,
    /// How long another frontend's publication counts.
    shared_ns: u64,
    /// When each other frontend (by slot) was last heard alive (its beat),
    /// in `now()`'s nanoseconds; 0: never. Its publications count while
    /// either they or this are within `shared_ns`, so a live frontend need
    /// not repeat its unchanged load.
    renewed: Box<[AtomicU64]>,
    /// When each other frontend (by slot) was last heard at all: a renewal
    /// or a publication, one past `now()`'s nanoseconds; 0: never. A
    /// silence past `shared_ns` is measured from it ([`MonitorClock::heard`]).
    heard: Box<[AtomicU64]>,
    /// The fleet's lease (with other frontends).
    pub(crate) lease: Lease,
}

impl MonitorClock {
    /// `clock` from now on; `staleness` `None` means never stale; other
    /// frontends' publications count for `shared`.
    pub(crate) fn new(
        clock: quanta::Clock,
        staleness: Option<Duration>,
        shared: Duration,
        frontends: u16,
        lease: Lease,
    ) -> Self {
        let base = clock.now();
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let staleness_ns = staleness.map_or(u64::MAX, nanos);
        let never = || (0..frontends).map(|_| AtomicU64::new(0)).collect();
        MonitorClock { clock, base, staleness_ns, shared_ns: nanos(shared), renewed: never(), heard: never(), lease }
    }

    /// Nanoseconds since the monitor started (never the "never reported"
    /// sentinel `u64::MAX`).
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        u64::try_from(self.clock.now().duration_since(self.base).as_nanos()).unwrap_or(u64::MAX - 1)
    }

    /// Whether a report stamped `at` still counts at `now`.
    #[inline]
    pub(crate) fn is_fresh(&self, at: u64, now: u64) -> bool {
        now.saturating_sub(at) <= self.staleness_ns
    }

    /// Whether frontend `slot`'s publication stamped `at` still counts at
    /// `now`: it, or the frontend's last renewal, is within the window.
    #[inline]
    pub(crate) fn is_shared_fresh(&self, slot: u16, at: u64, now: u64) -> bool {
        // Relaxed: a timestamp compared with the clock, guarding no other
        // data; a renewal seen late only shortens a window (and one after a
        // silence past it comes with the slot cleared, see `renew`).
        let renewed = self.renewed.get(usize::from(slot)).map_or(0, |r| r.load(Ordering::Relaxed));
        now.saturating_sub(at.max(renewed)) <= self.shared_ns
    }

    /// Frontend `slot` was heard alive at `now`; returns whether it had
    /// been silent past the window before (the caller drops what it
    /// published rather than let this renewal revive it).
    pub(crate) fn renew(&self, slot: u16, now: u64) -> bool {
        let Some(renewed) = self.renewed.get(usize::from(slot)) else { return false };
        // Relaxed: as in `is_shared_fresh`; the max keeps it monotonic.
        renewed.fetch_max(now, Ordering::Relaxed);
        self.heard(slot, now)
    }

    /// Frontend `slot` was heard at `now` (a renewal, or a publication
    /// about to be applied); returns whether it had been heard before and
    /// silent since past the window: what it published before then is
    /// to be dropped, not revived by a renewal or left beside the new.
    pub(crate) fn heard(&self, slot: u16, now: u64) -> bool {
        let Some(heard) = self.heard.get(usize::from(slot)) else { return false };
        // Relaxed: a timestamp compared with the clock, guarding no other
        // data; the max keeps it monotonic.
        // Stamped one past `now`: 0 stays "never" at the clock's start.
        let stamp = now.saturating_add(1);
        let before = heard.fetch_max(stamp, Ordering::Relaxed);
        before != 0 && stamp.saturating_sub(before) > self.shared_ns
    }

    /// The staleness window in nanoseconds (`u64::MAX`: none).
    pub(crate) fn staleness_ns(&self) -> u64 {
        self.staleness_ns
    }
}
