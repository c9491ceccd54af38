//! [`Lease`]: how much of a worker's headroom one of several frontends may
//! take before the others have seen it.
//!
//! Summing what every frontend publishes (see [`SharedLoad`]) counts the
//! fleet's load once, but each frontend sees the others' with a delay: k
//! frontends admitting flat out would each fill the headroom they see, and
//! overshoot a worker's threshold up to k times. Under the lease a
//! frontend's growth not yet seen by the others (its tracked load less its
//! **reference**, [`Publisher::Echo`](crate::Publisher::Echo): the least
//! any other live frontend may hold of its publications, from what they
//! acknowledged applying) stays within **its 1/k share of the headroom
//! everyone has seen**: per signal,
//!
//! ```text
//! seen     = max(worker's report, echo + Σ other frontends' publications)
//! headroom = threshold − seen
//! busy (for this frontend) when  (tracked − echo) × k > headroom
//! ```
//!
//! with k the live frontends, this one included; past it the worker is busy
//! for this frontend until the others acknowledge its publication (two
//! trips through NATS), and then the headroom has shrunk by what it took.
//! Alone (k = 1) the rule is the threshold itself.
//!
//! **The bound.** Let `P` be the sum of every frontend's reference. A
//! frontend's view of each other frontend is at least that one's reference
//! (by construction: the reference is the least any live peer may hold,
//! from the peers' own acknowledgements; an echo of one's own publication
//! would not do, as a peer busy with requests may apply it later than its
//! sender hears it back), so its headroom is at most `threshold − P`, and it has admitted
//! at most `(threshold − P) / k` unseen plus the one request that crossed
//! it (if the frontend routes and tracks one request at a time, as
//! `loadgate frontend` does under the lease; two threads of a caller
//! deciding at once would each add one). Over the k frontends: the
//! worker's load stays within **threshold + k × (the largest request)**,
//! whatever the delivery delays, as long as every frontend counts the same
//! k live ones (a frontend silent past the staleness stops counting, and a
//! newcomer counts the others only from their first frames). Geometric, not static: an
//! idle fleet lets one frontend take a k-th of the whole headroom per round
//! trip, so it fills the worker in a few round trips and no capacity is
//! set aside.
//!
//! [`SharedLoad`]: crate::monitor::SharedLoad

use crate::load::RankLoad;
use crate::sync::{AtomicU32, Ordering};
use crate::thresholds::Thresholds;

const PPB: u128 = 1_000_000_000;

/// Whether the lease holds, and how many other frontends are live.
#[derive(Debug)]
pub(crate) struct Lease {
    on: bool,
    /// Other frontends live now (set by the event plane).
    others: AtomicU32,
}

/// What one rank's slots hold, for the lease.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Slots {
    pub(crate) reported: Option<RankLoad>,
    pub(crate) tracked: Option<RankLoad>,
    pub(crate) shared: Option<RankLoad>,
    pub(crate) echo: Option<RankLoad>,
}

impl Lease {
    pub(crate) fn new(on: bool) -> Self {
        Lease { on, others: AtomicU32::new(0) }
    }

    /// Sets how many other frontends are live; whether it changed.
    pub(crate) fn set_others(&self, others: u32) -> bool {
        // Relaxed: read by evaluations, which the caller re-runs after a change.
        self.others.swap(others, Ordering::Relaxed) != others
    }

    /// `load` (the rank's effective load) with each field whose unseen
    /// growth is past this frontend's share of the headroom made busy
    /// outright (`u32::MAX`).
    pub(crate) fn apply(&self, thresholds: &Thresholds, load: RankLoad, slots: &Slots) -> RankLoad {
        // Relaxed: see `set_others`.
        let others = self.others.load(Ordering::Relaxed);
        let Some(own) = slots.tracked.filter(|_| self.on && others > 0) else {
            return load;
        };
        let k = u64::from(others) + 1;
        let echo = slots.echo.unwrap_or_default();
        let published = echo.plus(&slots.shared.unwrap_or_default());
        let seen = slots.reported.map_or(published, |r| r.max_with(&published));
        let of = |ppb: u64, total: u32| u64::try_from(u128::from(ppb) * u128::from(total) / PPB).unwrap_or(u64::MAX);
        let past = |threshold: Option<u64>, own: u32, echo: u32, seen: u32| {
            threshold.is_some_and(|t| u64::from(own.saturating_sub(echo)) * k > t.saturating_sub(u64::from(seen)))
        };
        let mut leased = load;
        let blocks = thresholds.decode_ppb().filter(|_| load.kv_total_blocks != 0).map(|p| of(p, load.kv_total_blocks));
        if past(blocks, own.active_decode_blocks, echo.active_decode_blocks, seen.active_decode_blocks) {
            leased.active_decode_blocks = u32::MAX;
        }
        let by_frac = thresholds
            .prefill_frac_ppb()
            .filter(|_| load.max_num_batched_tokens != 0)
            .map(|p| of(p, load.max_num_batched_tokens));
        let prefill = thresholds.prefill_tokens().into_iter().chain(by_frac).min();
        if past(prefill, own.active_prefill_tokens, echo.active_prefill_tokens, seen.active_prefill_tokens) {
            leased.active_prefill_tokens = u32::MAX;
        }
        if past(thresholds.waiting_requests(), own.waiting_requests, echo.waiting_requests, seen.waiting_requests) {
            leased.waiting_requests = u32::MAX;
        }
        leased
    }
}
