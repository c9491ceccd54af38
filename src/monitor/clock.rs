//! [`MonitorClock`]: the monitor's time in nanoseconds, the staleness
//! windows that decide whether a report still counts, and the fleet's lease
//! that decides how much of other frontends' unseen load to assume.

use std::time::Duration;

use super::lease::Lease;

/// The clock reports are stamped with, and the staleness window.
pub(crate) struct MonitorClock {
    clock: quanta::Clock,
    base: quanta::Instant,
    staleness_ns: u64,
    /// How long another frontend's publication counts.
    shared_ns: u64,
    /// The fleet's lease (with other frontends).
    pub(crate) lease: Lease,
}

impl MonitorClock {
    /// `clock` from now on; `staleness` `None` means never stale; other
    /// frontends' publications count for `shared`.
    pub(crate) fn new(clock: quanta::Clock, staleness: Option<Duration>, shared: Duration, lease: Lease) -> Self {
        let base = clock.now();
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let staleness_ns = staleness.map_or(u64::MAX, nanos);
        MonitorClock { clock, base, staleness_ns, shared_ns: nanos(shared), lease }
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

    /// Whether another frontend's publication stamped `at` still counts at `now`.
    #[inline]
    pub(crate) fn is_shared_fresh(&self, at: u64, now: u64) -> bool {
        now.saturating_sub(at) <= self.shared_ns
    }

    /// The staleness window in nanoseconds (`u64::MAX`: none).
    pub(crate) fn staleness_ns(&self) -> u64 {
        self.staleness_ns
    }
}
