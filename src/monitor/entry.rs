//! [`WorkerEntry`]: one registered worker's slots and published state, and
//! its evaluation against a model's thresholds.

use crossbeam_utils::CachePadded;

use crate::load::{Publisher, RankLoad, RankSlot, WorkerId};
use crate::monitor::clock::MonitorClock;
use crate::monitor::lease::Slots;
use crate::monitor::query::{RankSnapshot, WorkerLoad};
use crate::sync::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use crate::thresholds::{BusySignals, Thresholds};

/// Numbers the entries of this process ([`WorkerEntry::life`]), from 1.
static LIVES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// One registered worker (one incarnation of it): its slots and its
/// published state. A restart with a new incarnation gets a new entry; so
/// does a registration after a deregistration, even of the same
/// incarnation.
pub(crate) struct WorkerEntry {
    pub(crate) id: WorkerId,
    pub(crate) incarnation: u64,
    /// This entry's number, unique in the process (never 0).
    pub(crate) life: u64,
    pub(crate) dp_size: u32,
    /// Other frontends kept per rank (their slots follow the own ones).
    frontends: u16,
    /// Slots per rank (`Publisher::per_rank(frontends)`).
    per_rank: usize,
    /// `dp_size * Publisher::per_rank(frontends)` slots, rank-major.
    slots: Box<[RankSlot]>,
    /// Bumped (RMW) after every change to this worker's inputs.
    pub(crate) version: CachePadded<AtomicU64>,
    /// The busy bit as last published; written only under the model's lock.
    pub(crate) busy: AtomicBool,
    /// The signals that made it busy at its last evaluation (diagnostics).
    reasons: AtomicU32,
    /// The signals it was last published busy with (beside `busy`, which
    /// says whether they count); written only under the model's lock.
    published: AtomicU32,
    /// Out of routing as last published; written only under the model's
    /// lock.
    out: AtomicBool,
    /// The last `seq` a [`Reporter`](crate::monitor::Reporter) gave a
    /// report of this incarnation.
    reported: AtomicU64,
}

impl WorkerEntry {
    /// A worker with every rank unreported (so free), keeping `frontends`
    /// other frontends' loads per rank.
    pub(crate) fn new(id: WorkerId, incarnation: u64, dp_size: u32, frontends: u16) -> Self {
        let per_rank = Publisher::per_rank(frontends);
        WorkerEntry {
            id,
            incarnation,
            // Relaxed (a std atomic, not modelled by loom): only unique numbers.
            life: LIVES.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            dp_size,
            frontends,
            per_rank,
            slots: (0..dp_size as usize * per_rank).map(|_| RankSlot::new()).collect(),
            version: CachePadded::new(AtomicU64::new(0)),
            busy: AtomicBool::new(false),
            reasons: AtomicU32::new(0),
            published: AtomicU32::new(0),
            out: AtomicBool::new(false),
            reported: AtomicU64::new(0),
        }
    }

    /// The next `seq` for a report a [`Reporter`](crate::monitor::Reporter)
    /// makes: 1, 2, … for this incarnation, whichever reporter asks.
    pub(crate) fn next_report_seq(&self) -> u64 {
        // Relaxed: each caller only needs a number no other caller got;
        // which of two racing reports lands last is the slot's `seq` check's
        // to decide, not this counter's.
        self.reported.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The slot of one rank and publisher: `rank < dp_size`, and a
    /// frontend's index below the frontends kept (the monitor checks it).
    #[inline]
    pub(crate) fn slot(&self, rank: u32, publisher: Publisher) -> &RankSlot {
        &self.slots[rank as usize * self.per_rank + publisher.index()]
    }

    /// Empties every rank's slot of `publisher` (a frontend index given to
    /// another frontend); whether any slot held something.
    /// Whether any rank holds a report of the worker's own
    /// ([`Publisher::Worker`]); a worker known only by the router's
    /// tracking (a frontend's `--worker URL`) has none.
    pub(crate) fn has_reported(&self) -> bool {
        (0..self.dp_size).any(|rank| self.slot(rank, Publisher::Worker).load().is_some())
    }

    pub(crate) fn clear(&self, publisher: Publisher) -> bool {
        let mut held = false;
        for rank in 0..self.dp_size {
            let slot = self.slot(rank, publisher);
            held |= slot.load().is_some();
            // One writer per frontend slot (the event plane's): a store in
            // progress can only be a racing embedder's; it wins.
            let _ = slot.clear();
        }
        held
    }

    /// Evaluates the worker at `now`: busy only when every declared rank is
    /// busy. Returns the union of the signals that fired when busy (`None`
    /// when free), and records those signals as the worker's reasons.
    pub(crate) fn evaluate(&self, thresholds: &Thresholds, clock: &MonitorClock, now: u64) -> Option<BusySignals> {
        let (busy, signals) = self.signals(thresholds, clock, now);
        // Relaxed: diagnostic labels only; last writer wins.
        self.reasons.store(encode(signals), Ordering::Relaxed);
        busy.then_some(signals)
    }

    /// Its signals if it is published busy (under the model's lock).
    pub(crate) fn published(&self) -> Option<BusySignals> {
        // Relaxed: written and read under the model's lock.
        self.busy.load(Ordering::Relaxed).then(|| decode(self.published.load(Ordering::Relaxed)))
    }

    /// Whether it is published out of routing (under the model's lock).
    pub(crate) fn is_out(&self) -> bool {
        // Relaxed: written and read under the model's lock.
        self.out.load(Ordering::Relaxed)
    }

    /// Records that it was just published out of routing, or back in it
    /// (under the model's lock).
    pub(crate) fn set_out(&self, out: bool) {
        // Relaxed: read only under the model's lock.
        self.out.store(out, Ordering::Relaxed);
    }

    /// Whether `now` (an evaluation: its signals when busy) is what was last
    /// published for it: no publication needed. Outside the model's lock.
    #[inline]
    pub(crate) fn matches_published(&self, now: Option<BusySignals>) -> bool {
        // Acquire: pairs with the mirror's Release store in `set_published`,
        // so the signals stored before it are seen too.
        let busy = self.busy.load(Ordering::Acquire);
        // Relaxed: ordered by the Acquire above.
        busy == now.is_some() && (!busy || decode(self.published.load(Ordering::Relaxed)) == now.unwrap_or_default())
    }

    /// Records what was just published for it (under the model's lock):
    /// the signals first, then the mirror, which a writer outside the lock
    /// compares against.
    pub(crate) fn set_published(&self, busy: Option<BusySignals>) {
        // Relaxed: read only under the model's lock.
        self.published.store(busy.map_or(0, encode), Ordering::Relaxed);
        // Release: a writer whose version bump follows ours acquires this
        // and compares against the bit just published.
        self.busy.store(busy.is_some(), Ordering::Release);
    }

    /// Whether it is busy at `thresholds` now (every declared rank busy),
    /// and the union of the signals that fired (under the fleet's lease,
    /// with other frontends).
    pub(crate) fn signals(&self, thresholds: &Thresholds, clock: &MonitorClock, now: u64) -> (bool, BusySignals) {
        if !thresholds.is_enabled() {
            return (false, BusySignals::default());
        }
        let mut signals = BusySignals::default();
        for rank in 0..self.dp_size {
            let snapshot = self.snapshot(rank, clock, now);
            let Some(load) = snapshot.effective() else {
                return (false, BusySignals::default()); // an unreported rank keeps its worker free
            };
            let load = if self.frontends == 0 {
                load
            } else {
                let echo = self.slot(rank, Publisher::Echo).load().map(|(load, _)| load);
                let slots =
                    Slots { reported: snapshot.reported, tracked: snapshot.tracked, shared: snapshot.shared, echo };
                clock.lease.apply(thresholds, load, &slots)
            };
            let fired = thresholds.evaluate(&load);
            if !fired.any() {
                return (false, BusySignals::default());
            }
            signals = signals.union(fired);
        }
        (true, signals)
    }

    /// The signals that made the worker busy at its last evaluation.
    pub(crate) fn reasons(&self) -> BusySignals {
        // Relaxed: diagnostic only.
        decode(self.reasons.load(Ordering::Relaxed))
    }

    /// What one rank last reported (fresh only), what the router tracks,
    /// and what other frontends published (fresh only, summed).
    #[inline]
    pub(crate) fn snapshot(&self, rank: u32, clock: &MonitorClock, now: u64) -> RankSnapshot {
        let reported =
            self.slot(rank, Publisher::Worker).load().filter(|(_, at)| clock.is_fresh(*at, now)).map(|(load, _)| load);
        let tracked = self.slot(rank, Publisher::Router).load().map(|(load, _)| load);
        let shared = if self.frontends == 0 { None } else { self.shared(rank, clock, now) };
        RankSnapshot { worker: self.id, rank, reported, tracked, shared }
    }

    /// What other frontends published for one rank, fresh ones summed
    /// (apart from `snapshot`, which stays small enough to inline on the
    /// report path of a single frontend).
    #[inline(never)]
    fn shared(&self, rank: u32, clock: &MonitorClock, now: u64) -> Option<RankLoad> {
        let mut shared: Option<RankLoad> = None;
        for n in 0..self.frontends {
            let fresh =
                self.slot(rank, Publisher::Frontend(n)).load().filter(|(_, at)| clock.is_shared_fresh(n, *at, now));
            if let Some((load, _)) = fresh {
                shared = Some(shared.map_or(load, |sum| sum.plus(&load)));
            }
        }
        shared
    }

    /// Sum of the effective load over the ranks (no lock, no allocation).
    #[inline]
    pub(crate) fn load(&self, clock: &MonitorClock, now: u64) -> WorkerLoad {
        let mut sum = WorkerLoad::default();
        for rank in 0..self.dp_size {
            if let Some(l) = self.snapshot(rank, clock, now).effective() {
                sum.add(&l);
            }
        }
        sum
    }
}

/// The signals as bits (for atomics).
pub(crate) fn encode(s: BusySignals) -> u32 {
    u32::from(s.decode) | u32::from(s.prefill) << 1 | u32::from(s.prefill_frac) << 2 | u32::from(s.waiting) << 3
}

/// The signals of [`encode`]'s bits.
pub(crate) fn decode(bits: u32) -> BusySignals {
    BusySignals { decode: bits & 1 != 0, prefill: bits & 2 != 0, prefill_frac: bits & 4 != 0, waiting: bits & 8 != 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_round_trip_through_their_bits() {
        for bits in 0..16u32 {
            assert_eq!(encode(decode(bits)), bits);
        }
    }
}
