//! [`RetryHint`]: how long a refused client should wait (`Retry-After` and
//! `retry-after-ms`), computed so that refused clients come back spread over
//! the time the frontend needs to take them, not all at once.
//!
//! A constant hint makes every client refused in one burst retry in the same
//! instant, a retry storm by construction. Instead the frontend hands out
//! *retry slots*, like tickets at a counter:
//!
//! - The frontend serves about `capacity = max(in_flight, 1) / W` requests per
//!   second (Little's law), where `in_flight` is the number of requests
//!   dispatched and not finished and `W` the mean time an answered request
//!   takes (an exponentially weighted mean, α = max(1/16, 1/n) over the n
//!   answered so far, so the first answers count fully; 1 s before any).
//!   Attempts a worker refused or failed are not answers: they take a
//!   millisecond and would make requests look short. One slot is
//!   `1 / capacity = W / max(in_flight, 1)`.
//! - Each refusal takes the next slot:
//!   `next = max(next, now + 50 ms) + slot`. The k-th client refused in a
//!   burst is told to wait 50 ms and about k slots: retries arrive at about
//!   the rate requests finish. Slots in the past are forgotten, so the queue
//!   drains by itself as time passes.
//! - The queue never reaches past `now + 30 s`: a client that ignores its
//!   hint cannot push everyone else's out for minutes.
//! - The hint is a point drawn uniformly within the slot taken,
//!   `[next - slot, next)`, less `now`: jittered, yet no two clients share a
//!   slot, so retries never bunch (stratified jitter). It is never under
//!   50 ms (no busy retry). At the cap the slots coincide, and the hint is
//!   `30 s · U(0.75, 1)`.
//!
//! A refusal costs two atomic loads and one compare-and-swap loop, no lock.
//! `--retry-after-mode constant` always answers 1 s (the behaviour before,
//! kept to measure the difference).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The shortest hint: a client never retries sooner.
pub const MIN_RETRY_AFTER: Duration = Duration::from_millis(50);

/// The longest hint.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);

/// The hint in constant mode.
pub const CONSTANT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The mean request time assumed before any request finished.
const INITIAL_MEAN: Duration = Duration::from_secs(1);

/// The EWMA's window: α = 1/16 once 16 requests were answered.
const WINDOW: u64 = 16;

/// Hints at the cap are the cap times a uniform factor in this range.
const CAP_JITTER: (f64, f64) = (0.75, 1.0);

/// Computes retry hints from the frontend's recent drain rate.
#[derive(Debug)]
pub struct RetryHint {
    /// `false`: always [`CONSTANT_RETRY_AFTER`].
    computed: bool,
    /// Where times are counted from.
    epoch: Instant,
    /// The next free retry slot, ns since `epoch`.
    next_slot_ns: AtomicU64,
    /// The mean request time, ns (an EWMA over answered requests).
    mean_ns: AtomicU64,
    /// Answered requests seen (up to the EWMA's window).
    samples: AtomicU64,
}

impl RetryHint {
    /// Computed hints (`computed`), or the constant 1 s.
    pub fn new(computed: bool) -> Self {
        RetryHint {
            computed,
            epoch: Instant::now(),
            next_slot_ns: AtomicU64::new(0),
            mean_ns: AtomicU64::new(nanos(INITIAL_MEAN)),
            samples: AtomicU64::new(0),
        }
    }

    /// A request answered by a worker finished after `took`.
    pub fn finished(&self, took: Duration) {
        if !self.computed {
            return;
        }
        let sample = nanos(took);
        // Relaxed: statistics; a lost update (two finishing at once) only
        // drops one sample from the mean.
        let n = self.samples.fetch_add(1, Ordering::Relaxed).saturating_add(1).min(WINDOW);
        let mean = self.mean_ns.load(Ordering::Relaxed);
        // mean + (sample - mean) / n, in unsigned steps.
        let next = if sample >= mean { mean + (sample - mean) / n } else { mean - (mean - sample) / n };
        self.mean_ns.store(next.max(1), Ordering::Relaxed);
    }

    /// The mean request time the hint works from.
    pub fn mean(&self) -> Duration {
        // Relaxed: a statistic read on its own.
        Duration::from_nanos(self.mean_ns.load(Ordering::Relaxed))
    }

    /// The hint for one refusal now, with `in_flight` requests dispatched.
    pub fn refused(&self, in_flight: u64) -> Duration {
        if !self.computed {
            return CONSTANT_RETRY_AFTER;
        }
        let now = nanos(self.epoch.elapsed());
        let slot = (self.mean().as_nanos() as u64 / in_flight.max(1)).max(1);
        // Relaxed: the slot counter orders nothing else; the CAS makes each
        // refusal take a distinct slot.
        let earliest = now.saturating_add(nanos(MIN_RETRY_AFTER));
        // The queue never reaches past the longest hint: a client that
        // ignores its hint and hammers cannot push everyone else's out for
        // minutes (they would all get the cap, in step).
        let latest = now.saturating_add(nanos(MAX_RETRY_AFTER));
        let mut current = self.next_slot_ns.load(Ordering::Relaxed);
        let (taken, capped) = loop {
            let wanted = current.max(earliest).saturating_add(slot);
            let next = wanted.min(latest);
            match self.next_slot_ns.compare_exchange_weak(current, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => break (next, wanted > latest),
                Err(seen) => current = seen,
            }
        };
        // A point drawn uniformly within its own slot: jittered, yet no two
        // clients share a slot, so retries never bunch (stratified jitter).
        if !capped {
            let start = taken.saturating_sub(slot).max(earliest);
            let wait = Duration::from_nanos(start - now + fastrand::u64(..=taken - start));
            return wait.clamp(MIN_RETRY_AFTER, MAX_RETRY_AFTER);
        }
        // At the cap, the slots coincide: spread those hints below it.
        MAX_RETRY_AFTER.mul_f64(CAP_JITTER.0 + fastrand::f64() * (CAP_JITTER.1 - CAP_JITTER.0)).max(MIN_RETRY_AFTER)
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_mode_always_answers_one_second() {
        let hint = RetryHint::new(false);
        hint.finished(Duration::from_millis(10));
        for _ in 0..100 {
            assert_eq!(hint.refused(3), CONSTANT_RETRY_AFTER);
        }
    }

    #[test]
    fn a_burst_is_spread_over_the_time_the_frontend_needs() {
        let hint = RetryHint::new(true);
        // Requests take 100 ms and 10 are in flight: 100 per second, one slot
        // 10 ms. The first answer counts fully: no long start from 1 s.
        hint.finished(Duration::from_millis(100));
        assert_eq!(hint.mean(), Duration::from_millis(100));
        for _ in 0..64 {
            hint.finished(Duration::from_millis(100));
        }
        let mean = hint.mean();
        assert!(mean > Duration::from_millis(95) && mean < Duration::from_millis(105), "{mean:?}");
        let hints: Vec<Duration> = (0..300).map(|_| hint.refused(10)).collect();
        // The k-th refusal waits about k slots (± jitter): 300 refusals span about 3 s.
        let last = hints[250..].iter().min().copied().unwrap_or_default();
        assert!(last > Duration::from_millis(1500), "late refusals wait longer: {last:?}");
        assert!(hints.iter().all(|h| (MIN_RETRY_AFTER..=MAX_RETRY_AFTER).contains(h)));
        // At most a few retries fall in any 10 ms window (one slot each, jitter aside).
        let mut ms: Vec<u128> = hints.iter().map(|h| h.as_millis() / 10).collect();
        ms.sort_unstable();
        let peak = ms.chunk_by(|a, b| a == b).map(<[u128]>::len).max().unwrap_or(0);
        assert!(peak <= 12, "peak per 10 ms window {peak} of 300");
    }

    #[test]
    fn a_hammer_does_not_push_the_queue_past_the_cap_and_capped_hints_are_spread() {
        let hint = RetryHint::new(true);
        hint.finished(Duration::from_secs(2));
        // One client ignoring its hints: 5000 refusals at once.
        for _ in 0..5000 {
            assert!(hint.refused(20) <= MAX_RETRY_AFTER);
        }
        let burst: Vec<Duration> = (0..100).map(|_| hint.refused(20)).collect();
        assert!(burst.iter().all(|h| *h <= MAX_RETRY_AFTER && *h >= MAX_RETRY_AFTER.mul_f64(0.74)), "{burst:?}");
        let distinct: std::collections::BTreeSet<u128> = burst.iter().map(|h| h.as_millis() / 10).collect();
        assert!(distinct.len() > 50, "capped hints are jittered: {} distinct 10 ms windows of 100", distinct.len());
    }

    #[test]
    fn hints_are_bounded_and_slots_in_the_past_are_forgotten() {
        let hint = RetryHint::new(true);
        // Slow requests and nothing in flight: a slot is the whole mean, 1 s.
        for _ in 0..100 {
            assert!(hint.refused(0) <= MAX_RETRY_AFTER);
        }
        let capped = hint.refused(0);
        assert!(capped >= MAX_RETRY_AFTER.mul_f64(0.74) && capped <= MAX_RETRY_AFTER, "{capped:?}");
        let fresh = RetryHint::new(true);
        for _ in 0..64 {
            fresh.finished(Duration::from_micros(100));
        }
        // Tiny slots: just above the floor.
        let tiny = fresh.refused(1000);
        assert!(tiny >= MIN_RETRY_AFTER && tiny < Duration::from_millis(70), "{tiny:?}");
    }
}
