//! What one group of a run's requests got — a priority class (`--mix`) or
//! a tenant (`--tenants`): refusals, TTFT and SLO goodput, read from the
//! group's counts in the report (the load generator's `ClassReport`).

use std::time::Duration;

use hdrhistogram::Histogram;

use crate::loadgen::Percentiles;

/// What one group got in one run.
pub(crate) struct GroupRow {
    pub(crate) sent: u64,
    /// Accepted and completed.
    pub(crate) ok: u64,
    pub(crate) rejected: u64,
    pub(crate) rejected_pct: f64,
    /// Sent and neither completed nor refused (the connection failed or
    /// broke, or no answer by the drain deadline), percent of `sent`.
    pub(crate) unanswered_pct: f64,
    /// TTFT of its accepted requests, ms.
    pub(crate) ttft: Percentiles,
    /// Its requests completed with TTFT within the objective, per second of
    /// arrivals.
    pub(crate) slo_goodput: f64,
}

impl GroupRow {
    /// The row of a group that sent `sent`, had `ok` completed, `rejected`
    /// refused and its accepted ones' TTFTs in `ttft` (µs), in a run of
    /// `duration` of arrivals.
    pub(crate) fn of(
        sent: u64,
        ok: u64,
        rejected: u64,
        ttft: &Histogram<u64>,
        duration: Duration,
        objective: Duration,
    ) -> GroupRow {
        let within = if ttft.is_empty() {
            0
        } else {
            let limit = u64::try_from(objective.as_micros()).unwrap_or(u64::MAX).min(ttft.high());
            ttft.count_between(1, limit)
        };
        let pct = |n: u64| if sent == 0 { 0.0 } else { 100.0 * n as f64 / sent as f64 };
        GroupRow {
            sent,
            ok,
            rejected,
            rejected_pct: pct(rejected),
            unanswered_pct: pct(sent.saturating_sub(ok.saturating_add(rejected))),
            ttft: Percentiles::of(ttft),
            slo_goodput: within as f64 / duration.as_secs_f64().max(1e-9),
        }
    }
}
