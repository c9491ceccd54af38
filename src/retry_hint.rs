//! [`RetryHint`]: how long a refused client should wait (`Retry-After` and
//! `retry-after-ms`), computed so that refused clients come back spread over
//! the time the service needs to take them, not all at once, and never
//! before a default OpenAI SDK client (2 retries, honouring `retry-after-ms`
//! when in (0, 60 s]) has outlasted a short overload. Runtime-free: a few
//! atomics and the clock.
//!
//! A constant hint makes every client refused in one burst retry in the same
//! instant, a retry storm by construction. Instead the service hands out
//! *retry slots*, like tickets at a counter:
//!
//! - The service serves about `capacity = max(in_flight, 1) / W` requests per
//!   second (Little's law), where `in_flight` is the number of requests
//!   dispatched and not finished (the caller's count, given to
//!   [`refused`](RetryHint::refused)) and `W` the mean time an answered
//!   request takes (an exponentially weighted mean, α = max(1/16, 1/n) over
//!   the n answered so far, so the first answers count fully; 1 s before
//!   any; fed by [`finished`](RetryHint::finished)). Attempts a worker
//!   refused or failed are not answers: they take a millisecond and would
//!   make requests look short. One slot is
//!   `slot = 1 / capacity = W / max(in_flight, 1)`.
//! - The floor of a refusal is
//!   `floor = min(max(1 s, waiting · slot), 30 s)`, where `waiting` is the
//!   number of requests in the model's waiting line (0 without one):
//!   `waiting · slot` is the line's expected wait, and a client told to come
//!   back sooner would only find the line still ahead of it. The 1 s minimum
//!   makes a default OpenAI SDK client (2 retries) outlast at least 2 s of
//!   overload: with hints of 50–150 ms it gave up after 0.17 s.
//! - Each refusal takes the next slot:
//!   `next = min(max(next, now + floor) + slot, now + 30 s)`. The k-th client
//!   refused in a burst is told to wait the floor and about k slots: retries
//!   arrive at about the rate requests finish. Slots in the past are
//!   forgotten, so the queue drains by itself as time passes. The queue is
//!   the service's, like `W` and `in_flight`: a refusal behind a long
//!   waiting line pushes it for every model.
//! - The queue never reaches past `now + 30 s`: a client that ignores its
//!   hint cannot push everyone else's out for minutes.
//! - The hint is a point drawn uniformly within the slot taken,
//!   `[max(next - slot, now + floor), next)`, less `now`: jittered, yet no
//!   two clients share a slot, so retries never bunch (stratified jitter).
//!   At the cap the slots coincide, and the hint is drawn uniformly in
//!   `[max(floor, 22.5 s), 30 s]` (`30 s · U(0.75, 1)` when the floor is
//!   lower; exactly 30 s when the line's expected wait reaches the cap).
//!
//! So every hint is in `[floor, 30 s]`: at least 1 s (the first two a
//! client gets add up to at least 2 s), never less than the waiting line's
//! expected wait (up to the cap), at most 30 s.
//!
//! **Several frontends** sharing one pool of workers
//! ([`set_others`](RetryHint::set_others), every beat): the pool's figures,
//! not this frontend's. With `k` live frontends holding `in_flight` requests
//! in all (this one's own count, and each other's from its last beat, but
//! the others at least `k − 1` times this one's: the clients are spread over
//! the frontends and a beat may be 200 ms old) and `waiting` in their lines,
//! `slot = W · k / max(in_flight, 1)` (this frontend hands out its k-th of
//! the pool's retry slots) and `floor = min(max(1 s, waiting · W /
//! max(in_flight, 1)), 30 s)` (the pool's line's expected wait). Alone, the
//! same as above.
//!
//! A refusal costs a few atomic loads and one compare-and-swap loop, no lock.
//! [`RetryHint::constant`] always answers 1 s (a constant hint, to measure
//! the difference). A refusal made without any `RetryHint` (say, a
//! `Refusal` given no hint) waits [`default_retry_after`]: the 1 s floor
//! plus up to a second of jitter.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use loadgate::retry_hint::{RetryHint, MAX_RETRY_AFTER, MIN_RETRY_AFTER};
//!
//! let hint = RetryHint::computed();
//! hint.finished(Duration::from_millis(100)); // an answered request took 100 ms
//! // 10 in flight, 300 waiting in the model's line: 3 s expected, and one 10 ms slot.
//! let wait = hint.refused(10, 300);
//! assert!(wait >= Duration::from_secs(3) && wait <= Duration::from_millis(3010));
//! // The next refusal of the burst takes the next slot; every hint is in [1 s, 30 s].
//! let later = hint.refused(10, 0);
//! assert!((MIN_RETRY_AFTER..=MAX_RETRY_AFTER).contains(&later));
//! ```

use std::time::{Duration, Instant};

use crate::sync::{AtomicU64, Ordering};

/// The shortest hint: a client never retries sooner, so a default OpenAI
/// SDK client (2 retries) outlasts at least 2 s of overload.
pub const MIN_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The longest hint.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);

/// The hint in constant mode.
pub const CONSTANT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The mean request time assumed before any request finished.
const INITIAL_MEAN: Duration = Duration::from_secs(1);

/// The EWMA's window: α = 1/16 once 16 requests were answered.
const WINDOW: u64 = 16;

/// Hints at the cap are the cap times a uniform factor in this range (and
/// never under the floor).
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
    /// The other live frontends (0: alone, or a frontend-scoped hint), and
    /// the requests they hold in flight and waiting, from their beats.
    others: AtomicU64,
    others_in_flight: AtomicU64,
    others_waiting: AtomicU64,
}

impl Default for RetryHint {
    /// [`RetryHint::computed`].
    fn default() -> Self {
        RetryHint::computed()
    }
}

impl RetryHint {
    /// Hints computed from the drain rate (the module docs).
    pub fn computed() -> Self {
        RetryHint::new(true)
    }

    /// Always [`CONSTANT_RETRY_AFTER`] (a constant hint, kept to measure
    /// what the computed one changes).
    pub fn constant() -> Self {
        RetryHint::new(false)
    }

    fn new(computed: bool) -> Self {
        RetryHint {
            computed,
            epoch: Instant::now(),
            next_slot_ns: AtomicU64::new(0),
            mean_ns: AtomicU64::new(nanos(INITIAL_MEAN)),
            samples: AtomicU64::new(0),
            others: AtomicU64::new(0),
            others_in_flight: AtomicU64::new(0),
            others_waiting: AtomicU64::new(0),
        }
    }

    /// The other live frontends of the pool: how many, and the requests
    /// they hold in flight and waiting (every beat; see the module docs).
    /// `0, 0, 0`: alone again.
    pub fn set_others(&self, others: u64, in_flight: u64, waiting: u64) {
        // Relaxed: three figures read on their own by each refusal; a
        // refusal between two stores mixes two beats, harmlessly.
        self.others.store(others, Ordering::Relaxed);
        self.others_in_flight.store(in_flight, Ordering::Relaxed);
        self.others_waiting.store(waiting, Ordering::Relaxed);
    }

    /// A request answered by a worker finished after `took` (not one a
    /// worker refused or failed: see the module docs).
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

    /// The hint for one refusal now, with `in_flight` requests dispatched
    /// and `waiting` requests in the model's waiting line (0 without one).
    pub fn refused(&self, in_flight: u64, waiting: u64) -> Duration {
        if !self.computed {
            return CONSTANT_RETRY_AFTER;
        }
        let now = nanos(self.epoch.elapsed());
        // Relaxed: see `set_others`.
        let frontends = self.others.load(Ordering::Relaxed).saturating_add(1);
        // The others hold at least what this one holds (the clients spread
        // over the frontends; their beats lag by up to one).
        let others = self.others_in_flight.load(Ordering::Relaxed).max(in_flight.saturating_mul(frontends - 1));
        let in_flight = in_flight.saturating_add(others).max(1);
        let waiting = waiting.saturating_add(self.others_waiting.load(Ordering::Relaxed));
        let mean = nanos(self.mean());
        let pool_slot = (mean / in_flight).max(1);
        let slot = pool_slot.saturating_mul(frontends);
        let floor = floor_ns(mean, in_flight, waiting);
        let earliest = now.saturating_add(floor);
        // The queue never reaches past the longest hint: a client that
        // ignores its hint and hammers cannot push everyone else's out for
        // minutes (they would all get the cap, in step).
        let latest = now.saturating_add(nanos(MAX_RETRY_AFTER));
        // Relaxed: the slot counter orders nothing else; the CAS makes each
        // refusal take a distinct slot.
        let mut current = self.next_slot_ns.load(Ordering::Relaxed);
        let (taken, capped) = loop {
            let wanted = current.max(earliest).saturating_add(slot);
            let next = wanted.min(latest);
            match self.next_slot_ns.compare_exchange_weak(current, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => break (next, wanted > latest),
                Err(seen) => current = seen,
            }
        };
        let floor = Duration::from_nanos(floor);
        // A point drawn uniformly within its own slot: jittered, yet no two
        // clients share a slot, so retries never bunch (stratified jitter).
        if !capped {
            let start = taken.saturating_sub(slot).max(earliest);
            let wait = Duration::from_nanos(start - now + fastrand::u64(..=taken - start));
            return wait.clamp(floor, MAX_RETRY_AFTER);
        }
        // At the cap, the slots coincide: spread those hints below it, never
        // under the floor.
        let low = MAX_RETRY_AFTER.mul_f64(CAP_JITTER.0).max(floor);
        let high = MAX_RETRY_AFTER.mul_f64(CAP_JITTER.1);
        (low + (high - low).mul_f64(fastrand::f64())).clamp(floor, MAX_RETRY_AFTER)
    }
}

/// The hint of a refusal made without a [`RetryHint`]: the floor,
/// [`MIN_RETRY_AFTER`], plus a uniform draw of up to one more second, so
/// clients refused together do not all come back in the same instant.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use loadgate::retry_hint::{default_retry_after, MIN_RETRY_AFTER};
///
/// let wait = default_retry_after();
/// assert!(wait >= MIN_RETRY_AFTER && wait < 2 * MIN_RETRY_AFTER);
/// ```
pub fn default_retry_after() -> Duration {
    MIN_RETRY_AFTER + MIN_RETRY_AFTER.mul_f64(fastrand::f64())
}

/// The floor of a refusal, ns: `min(max(1 s, waiting · slot), 30 s)` with
/// `slot = mean / in_flight` (`in_flight` at least 1), computed whole and
/// rounded up: not from the slot truncated to whole ns, which `waiting`
/// multiplies into a wait short of the line's by up to `waiting` ns.
fn floor_ns(mean: u64, in_flight: u64, waiting: u64) -> u64 {
    let wait = (u128::from(waiting) * u128::from(mean)).div_ceil(u128::from(in_flight.max(1)));
    let wait = u64::try_from(wait).unwrap_or(u64::MAX);
    wait.clamp(nanos(MIN_RETRY_AFTER), nanos(MAX_RETRY_AFTER))
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A computed hint whose mean is exactly `mean` (the first answer
    /// counts fully).
    fn hint_with_mean(mean: Duration) -> RetryHint {
        let hint = RetryHint::computed();
        hint.finished(mean);
        assert_eq!(hint.mean(), mean);
        hint
    }

    /// Found by a review: `set_others(u64::MAX, ..)` overflowed the count
    /// of frontends (a panic in a debug build). Extreme figures give a hint
    /// within the bounds.
    #[test]
    fn extreme_figures_from_the_others_give_a_hint_within_bounds() {
        let hint = hint_with_mean(100 * MS);
        for (others, in_flight, waiting) in [(u64::MAX, 0, 0), (u64::MAX, u64::MAX, u64::MAX), (0, u64::MAX, 0)] {
            hint.set_others(others, in_flight, waiting);
            for (mine, line) in [(0, 0), (1, 0), (u64::MAX, u64::MAX)] {
                let wait = hint.refused(mine, line);
                assert!(
                    (MIN_RETRY_AFTER..=MAX_RETRY_AFTER).contains(&wait),
                    "{others} {in_flight} {waiting}: {wait:?}"
                );
            }
        }
    }

    #[test]
    fn the_default_hint_is_the_floor_and_up_to_a_second_of_jitter() {
        let hints: Vec<Duration> = (0..500).map(|_| default_retry_after()).collect();
        assert!(hints.iter().all(|h| *h >= MIN_RETRY_AFTER && *h < 2 * MIN_RETRY_AFTER), "{hints:?}");
        let distinct: std::collections::BTreeSet<u128> = hints.iter().map(|h| h.as_millis() / 10).collect();
        assert!(distinct.len() > 50, "jittered: {} distinct 10 ms windows of 500", distinct.len());
        assert!(RetryHint::default().refused(0, 0) >= MIN_RETRY_AFTER, "computed by default");
    }

    #[test]
    fn alone_again_after_the_pool_is_gone() {
        let hint = hint_with_mean(Duration::from_millis(100));
        hint.set_others(2, 20, 3000);
        assert!(hint.refused(10, 0) >= Duration::from_secs(9), "the pool's line: 3000 · 100 ms / 30");
        let hint = hint_with_mean(Duration::from_millis(100));
        hint.set_others(2, 20, 3000);
        hint.set_others(0, 0, 0);
        assert!(hint.refused(10, 0) < MIN_RETRY_AFTER + 11 * MS, "alone: the floor and one slot");
    }

    #[test]
    fn constant_mode_always_answers_one_second() {
        let hint = RetryHint::constant();
        hint.finished(Duration::from_millis(10));
        for (in_flight, waiting) in [(3, 0), (0, 0), (1, 1_000_000), (u64::MAX, u64::MAX)] {
            for _ in 0..100 {
                assert_eq!(hint.refused(in_flight, waiting), CONSTANT_RETRY_AFTER);
            }
        }
    }

    #[test]
    fn with_other_frontends_the_slots_and_the_floor_are_the_pools() {
        let alone = hint_with_mean(Duration::from_millis(100));
        let pooled = hint_with_mean(Duration::from_millis(100));
        // Two others hold 20 in flight and 300 waiting: pool 30 in flight, 3 frontends.
        pooled.set_others(2, 20, 300);
        // Alone with 10 in flight and 100 waiting: floor 100 · 10 ms = 1 s.
        let first = alone.refused(10, 100);
        assert!(first < MIN_RETRY_AFTER + 11 * MS, "{first:?}");
        // The pool's line: 400 waiting · 100 ms / 30 = 1.33 s; slots of 10 ms (3 · 100/30 ms).
        let first = pooled.refused(10, 100);
        let floor = Duration::from_nanos(400 * 100_000_000 / 30);
        assert!(first >= floor && first < floor + 11 * MS, "{first:?} vs the pool's floor {floor:?}");
    }

    /// The exact floor, `min(max(1 s, waiting · W / max(in_flight, 1)), 30 s)`,
    /// in ns rounded up: the reference the integer arithmetic must not go under.
    fn reference_floor_ns(mean_ns: u64, in_flight: u64, waiting: u64) -> u128 {
        let exact = (u128::from(waiting) * u128::from(mean_ns)).div_ceil(u128::from(in_flight.max(1)));
        exact.clamp(MIN_RETRY_AFTER.as_nanos(), MAX_RETRY_AFTER.as_nanos())
    }

    proptest::proptest! {
        /// Found by a review: the slot was truncated to whole ns before
        /// being multiplied by the line, so `waiting · slot` fell short of
        /// the line's expected wait by up to `waiting` ns (431 ms requests,
        /// 30,288 in flight, 70,197 waiting: a hint of 1.0000086 s against
        /// 1.0000207 s expected; 3 ns requests, 2 in flight, 10^9 waiting:
        /// 1 s against 1.5 s). Every
        /// hint, the first ones of a fresh queue included, is at least the
        /// exact expected wait (capped) and in [1 s, 30 s]; the first two
        /// add up to at least 2 s.
        #[test]
        fn a_hint_is_never_under_the_exact_expected_wait(
            mean_ns in 1u64..=3_000_000_000,
            in_flight in proptest::prop_oneof![0u64..=16, 0u64..=1_000_000, proptest::arbitrary::any::<u64>()],
            waiting in proptest::prop_oneof![0u64..=16, 0u64..=100_000_000, proptest::arbitrary::any::<u64>()],
            seed in proptest::arbitrary::any::<u64>(),
        ) {
            fastrand::seed(seed);
            let hint = hint_with_mean(Duration::from_nanos(mean_ns));
            let floor = reference_floor_ns(mean_ns, in_flight, waiting);
            let first = hint.refused(in_flight, waiting);
            let second = hint.refused(in_flight, waiting);
            for h in [first, second] {
                proptest::prop_assert!((MIN_RETRY_AFTER..=MAX_RETRY_AFTER).contains(&h), "{h:?}");
                proptest::prop_assert!(h.as_nanos() >= floor, "{h:?} under the expected wait {floor} ns");
            }
            proptest::prop_assert!(first + second >= 2 * MIN_RETRY_AFTER);
        }
    }

    /// The cases the property test above found, kept as plain ones.
    #[test]
    fn the_line_s_expected_wait_is_not_cut_by_a_truncated_slot() {
        // 1.5 ns slots (3 ns requests, 2 in flight), 10^9 waiting: 1.5 s.
        let hint = hint_with_mean(Duration::from_nanos(3));
        let h = hint.refused(2, 1_000_000_000);
        assert!(h >= Duration::from_millis(1500), "{h:?}");
        // 431,480,351 ns requests, 30,288 in flight, 70,197 waiting.
        let hint = hint_with_mean(Duration::from_nanos(431_480_351));
        let h = hint.refused(30_288, 70_197);
        assert!(h.as_nanos() >= reference_floor_ns(431_480_351, 30_288, 70_197), "{h:?}");
    }

    #[test]
    fn the_floor_formula() {
        let ms = |n: u64| n * 1_000_000;
        // max(1 s, waiting · slot), then at most 30 s (slots of 10 ms: 100 ms, 10 in flight).
        assert_eq!(floor_ns(ms(100), 10, 0), ms(1000));
        assert_eq!(floor_ns(ms(100), 10, 99), ms(1000));
        assert_eq!(floor_ns(ms(100), 10, 100), ms(1000));
        assert_eq!(floor_ns(ms(100), 10, 101), ms(1010));
        assert_eq!(floor_ns(ms(100), 10, 2999), ms(29_990));
        assert_eq!(floor_ns(ms(100), 10, 3000), ms(30_000));
        assert_eq!(floor_ns(ms(100), 10, 3001), ms(30_000));
        assert_eq!(floor_ns(u64::MAX, 1, u64::MAX), ms(30_000));
        assert_eq!(floor_ns(ms(100), 0, 11), ms(1100), "nothing in flight counts as one");
        // The slot is not truncated first: 1 s over 3 in flight, 10 waiting.
        assert_eq!(floor_ns(ms(1000), 3, 10), 3_333_333_334, "not 10 slots of 333,333,333 ns");
        assert_eq!(floor_ns(3, 2, 1_000_000_000), ms(1500), "1.5 ns slots: 1.5 s, not 1 s");
    }

    #[test]
    fn every_hint_is_at_least_one_second_and_a_lone_one_just_above() {
        // Tiny slots (100 µs requests, 1000 in flight): only the floor counts.
        let hint = hint_with_mean(Duration::from_micros(100));
        let first = hint.refused(1000, 0);
        assert!(first >= MIN_RETRY_AFTER, "{first:?}");
        assert!(first < MIN_RETRY_AFTER + MS, "a lone refusal waits the floor and one slot: {first:?}");
        // Whatever the load, never under 1 s.
        for (in_flight, waiting) in [(0, 0), (1, 0), (1000, 0), (u64::MAX, 0), (u64::MAX, 5), (1000, 9_000)] {
            for _ in 0..200 {
                let h = hint.refused(in_flight, waiting);
                assert!(
                    (MIN_RETRY_AFTER..=MAX_RETRY_AFTER).contains(&h),
                    "in flight {in_flight}, waiting {waiting}: {h:?}"
                );
            }
        }
    }

    #[test]
    fn a_default_sdk_client_outlasts_two_seconds() {
        // A client refused, waiting its hint, refused again: its first two
        // hints add up to at least 2 s, even with the shortest slots.
        let hint = hint_with_mean(Duration::from_micros(10));
        let first = hint.refused(u64::MAX, 0);
        let second = hint.refused(u64::MAX, 0);
        assert!(first >= MIN_RETRY_AFTER && second >= MIN_RETRY_AFTER, "{first:?} {second:?}");
        assert!(first + second >= 2 * MIN_RETRY_AFTER, "{first:?} + {second:?}");
        assert!(first + second < 2 * MIN_RETRY_AFTER + 10 * MS, "{first:?} + {second:?}");
    }

    #[test]
    fn never_less_than_the_waiting_lines_expected_wait() {
        // 100 ms requests, 10 in flight: one slot is 10 ms.
        let hint = hint_with_mean(Duration::from_millis(100));
        // 300 waiting: 3 s expected; a fresh queue's first slot starts there.
        let deep = hint.refused(10, 300);
        assert!(deep >= Duration::from_secs(3), "{deep:?}");
        assert!(deep <= Duration::from_secs(3) + 10 * MS, "{deep:?}");
        let fresh = hint_with_mean(Duration::from_millis(100));
        // 50 waiting: 0.5 s expected, under the 1 s minimum, which wins.
        let shallow = fresh.refused(10, 50);
        assert!(shallow >= MIN_RETRY_AFTER && shallow <= MIN_RETRY_AFTER + 10 * MS, "{shallow:?}");
        // Later refusals queue behind it, and never under the line's wait.
        let fresh = hint_with_mean(Duration::from_millis(100));
        for k in 1..=100u32 {
            let h = fresh.refused(10, 200);
            assert!(h >= Duration::from_secs(2), "{k}: {h:?}");
            assert!(h <= Duration::from_secs(2) + k * 10 * MS, "{k}: {h:?}");
        }
    }

    #[test]
    fn an_expected_wait_past_the_cap_is_the_cap() {
        let hint = hint_with_mean(Duration::from_millis(100));
        // 10 ms slots, 5000 waiting: 50 s expected, capped at 30 s.
        for _ in 0..50 {
            assert_eq!(hint.refused(10, 5000), MAX_RETRY_AFTER);
        }
        // Just under the cap (29 s): capped hints are in [29 s, 30 s].
        let hint = hint_with_mean(Duration::from_millis(100));
        for _ in 0..200 {
            let h = hint.refused(10, 2900);
            assert!(h >= Duration::from_secs(29) && h <= MAX_RETRY_AFTER, "{h:?}");
        }
    }

    /// Found by mutation testing: every mean-moving test fed one sample or a
    /// run of equal ones, so the update `mean ± |sample − mean| / n` could be
    /// `* n`, `% n`, or add `sample + mean`, unnoticed. The weights: 1/n
    /// over the first answers, then 1/16 for good, both ways.
    #[test]
    fn the_mean_moves_by_one_nth_then_one_sixteenth_of_the_difference() {
        let hint = hint_with_mean(100 * MS); // n = 1: the sample itself
        hint.finished(200 * MS); // n = 2: halfway up
        assert_eq!(hint.mean(), 150 * MS);
        hint.finished(30 * MS); // n = 3: a third of the way down
        assert_eq!(hint.mean(), 110 * MS);
        hint.finished(110 * MS); // n = 4: an equal sample moves nothing
        assert_eq!(hint.mean(), 110 * MS);
        for _ in 5..=16 {
            hint.finished(110 * MS);
        }
        assert_eq!(hint.mean(), 110 * MS);
        // From the 17th answer on, α stays 1/16.
        hint.finished(270 * MS);
        assert_eq!(hint.mean(), 120 * MS);
        hint.finished(Duration::ZERO);
        assert_eq!(hint.mean(), Duration::from_micros(112_500));
    }

    #[test]
    fn a_burst_is_spread_over_the_time_the_frontend_needs() {
        let hint = RetryHint::computed();
        // Requests take 100 ms and 10 are in flight: 100 per second, one slot
        // 10 ms. The first answer counts fully: no long start from 1 s.
        hint.finished(Duration::from_millis(100));
        assert_eq!(hint.mean(), Duration::from_millis(100));
        for _ in 0..64 {
            hint.finished(Duration::from_millis(100));
        }
        let mean = hint.mean();
        assert!(mean > Duration::from_millis(95) && mean < Duration::from_millis(105), "{mean:?}");
        let hints: Vec<Duration> = (0..300).map(|_| hint.refused(10, 0)).collect();
        // The k-th refusal waits 1 s and about k slots (± jitter): 300
        // refusals span about 1 s to 4 s.
        let early = hints[..50].iter().max().copied().unwrap_or_default();
        assert!(early < Duration::from_millis(1600), "early refusals wait about the floor: {early:?}");
        let last = hints[250..].iter().min().copied().unwrap_or_default();
        assert!(last > Duration::from_millis(2500), "late refusals wait longer: {last:?}");
        assert!(hints.iter().all(|h| (MIN_RETRY_AFTER..=MAX_RETRY_AFTER).contains(h)));
        // At most a few retries fall in any 10 ms window (one slot each, jitter aside).
        let mut ms: Vec<u128> = hints.iter().map(|h| h.as_millis() / 10).collect();
        ms.sort_unstable();
        let peak = ms.chunk_by(|a, b| a == b).map(<[u128]>::len).max().unwrap_or(0);
        assert!(peak <= 12, "peak per 10 ms window {peak} of 300");
    }

    #[test]
    fn a_hammer_does_not_push_the_queue_past_the_cap_and_capped_hints_are_spread() {
        let hint = RetryHint::computed();
        hint.finished(Duration::from_secs(2));
        // One client ignoring its hints: 5000 refusals at once.
        for _ in 0..5000 {
            let h = hint.refused(20, 0);
            assert!((MIN_RETRY_AFTER..=MAX_RETRY_AFTER).contains(&h), "{h:?}");
        }
        let burst: Vec<Duration> = (0..100).map(|_| hint.refused(20, 0)).collect();
        assert!(burst.iter().all(|h| *h <= MAX_RETRY_AFTER && *h >= MAX_RETRY_AFTER.mul_f64(0.75)), "{burst:?}");
        let distinct: std::collections::BTreeSet<u128> = burst.iter().map(|h| h.as_millis() / 10).collect();
        assert!(distinct.len() > 50, "capped hints are jittered: {} distinct 10 ms windows of 100", distinct.len());
    }

    #[test]
    fn hints_are_bounded_and_slots_in_the_past_are_forgotten() {
        let hint = RetryHint::computed();
        // Slow requests and nothing in flight: a slot is the whole mean, 1 s.
        for _ in 0..100 {
            assert!(hint.refused(0, 0) <= MAX_RETRY_AFTER);
        }
        let capped = hint.refused(0, 0);
        assert!(capped >= MAX_RETRY_AFTER.mul_f64(0.75) && capped <= MAX_RETRY_AFTER, "{capped:?}");
        // A queue whose slots have all passed starts again from the floor.
        let hint = hint_with_mean(Duration::from_micros(100));
        for _ in 0..1000 {
            hint.refused(1, 0);
        }
        std::thread::sleep(Duration::from_millis(1200));
        let again = hint.refused(1000, 0);
        assert!(again >= MIN_RETRY_AFTER && again < MIN_RETRY_AFTER + MS, "{again:?}");
    }
}
