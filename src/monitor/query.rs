//! What the monitor answers about its workers: per-rank snapshots, listings
//! and summed loads.

use crate::load::{RankLoad, WorkerId};

/// The latest observed load of one rank, for metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankSnapshot {
    /// The worker.
    pub worker: WorkerId,
    /// The rank.
    pub rank: u32,
    /// The worker's own last report (`None`: never reported, or stale).
    pub reported: Option<RankLoad>,
    /// The router's tracked load (`None`: never tracked).
    pub tracked: Option<RankLoad>,
    /// The sum of what other frontends published for it, fresh ones only
    /// (`None`: none; see [`SharedLoad`](crate::monitor::SharedLoad)).
    pub shared: Option<RankLoad>,
}

impl RankSnapshot {
    /// What the routers added: the sum of tracked and shared.
    #[inline]
    pub fn added(&self) -> Option<RankLoad> {
        match (self.tracked, self.shared) {
            (Some(t), Some(s)) => Some(t.plus(&s)),
            (t, s) => t.or(s),
        }
    }

    /// The load the busy decision uses (without a lease): the larger of
    /// reported and the sum of tracked and shared.
    #[inline]
    pub fn effective(&self) -> Option<RankLoad> {
        match (self.reported, self.added()) {
            (Some(r), Some(a)) => Some(r.max_with(&a)),
            (r, a) => r.or(a),
        }
    }
}

/// A worker as registered, for listings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerInfo {
    /// The worker's id.
    pub id: WorkerId,
    /// Its current incarnation.
    pub incarnation: u64,
    /// The model it serves.
    pub model: String,
    /// Its declared data-parallel size.
    pub dp_size: u32,
    /// Whether it is in its model's published busy set.
    pub busy: bool,
}

/// The sum of a worker's effective load over its ranks (least-loaded and
/// cost policies rank workers by it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkerLoad {
    /// Sum of active decode blocks.
    pub active_decode_blocks: u64,
    /// Sum of known total KV blocks.
    pub kv_total_blocks: u64,
    /// Sum of active prefill tokens.
    pub active_prefill_tokens: u64,
    /// Sum of waiting requests.
    pub waiting_requests: u64,
}

impl WorkerLoad {
    /// Orders loads: lower decode utilisation first (exact cross-multiplied),
    /// then fewer prefill tokens, then fewer waiting requests.
    pub fn cmp_load(&self, other: &WorkerLoad) -> std::cmp::Ordering {
        let util = |l: &WorkerLoad, o: &WorkerLoad| {
            // Unknown capacity counts as capacity 1 so blocks still compare.
            u128::from(l.active_decode_blocks) * u128::from(o.kv_total_blocks.max(1))
        };
        util(self, other)
            .cmp(&util(other, self))
            .then(self.active_prefill_tokens.cmp(&other.active_prefill_tokens))
            .then(self.waiting_requests.cmp(&other.waiting_requests))
    }

    /// Adds one rank's load.
    #[inline]
    pub(crate) fn add(&mut self, load: &RankLoad) {
        self.active_decode_blocks += u64::from(load.active_decode_blocks);
        self.kv_total_blocks += u64::from(load.kv_total_blocks);
        self.active_prefill_tokens += u64::from(load.active_prefill_tokens);
        self.waiting_requests += u64::from(load.waiting_requests);
    }
}
