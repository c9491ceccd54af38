//! [`SharedLoad`]: the load other frontends of one fleet add to its workers.
//!
//! With several frontends in front of one fleet, each tracks only what it
//! dispatched. Each publishes that (per worker and rank) on the event plane,
//! and each monitor keeps every other frontend's latest publication in its
//! own slot, [`Publisher::Frontend`](crate::Publisher::Frontend). A rank's
//! effective load is then, field by field, the larger of the worker's own
//! report and the **sum** of this router's tracking and every fresh
//! frontend publication: `k` frontends never count a worker's load `k`
//! times lower than it is.

use std::time::Duration;

/// How a monitor keeps other frontends' load apart; `Default` keeps none
/// (a single frontend).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedLoad {
    /// How many other frontends' publications each rank keeps (the slots
    /// `Publisher::Frontend(0..frontends)`); `0`: none. Each costs every
    /// rank of every worker one slot, and every evaluation one read.
    pub frontends: u16,
    /// How long a frontend's publication counts: a frontend that stopped
    /// (or lost the event plane) stops counting this long after its last
    /// one, whatever [`MonitorConfig::staleness`](crate::MonitorConfig::staleness)
    /// says. Frontends publish at least every heartbeat; three heartbeats
    /// is the intended value.
    pub staleness: Duration,
    /// The lease: a frontend's growth not yet seen by the others stays
    /// within its 1/k share of the headroom everyone has seen, so k
    /// frontends admitting at once overshoot a threshold by at most k
    /// requests (the argument is in the docs of `monitor/lease.rs`).
    /// `false`: the sum alone.
    pub lease: bool,
}

impl Default for SharedLoad {
    fn default() -> Self {
        SharedLoad { frontends: 0, staleness: Duration::from_millis(600), lease: false }
    }
}
