//! [`Histogram`]: a fixed-bucket histogram of seconds, one relaxed atomic
//! per bucket (no lock on the request path), and Dynamo's log-spaced buckets.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;
use std::time::Duration;

/// Dynamo's buckets for `dynamo_frontend_time_to_first_token_seconds`
/// (`DYN_METRICS_TTFT_*` defaults: 0.001 s to 480 s, 18).
pub(super) static TTFT_BUCKETS: LazyLock<Vec<f64>> = LazyLock::new(|| log_buckets(0.001, 480.0, 18));
/// Dynamo's buckets for `dynamo_frontend_request_duration_seconds`
/// (`DYN_METRICS_REQUEST_DURATION_*` defaults: 1 s to 512 s, 10).
pub(super) static DURATION_BUCKETS: LazyLock<Vec<f64>> = LazyLock::new(|| log_buckets(1.0, 512.0, 10));
/// Dynamo's buckets for `dynamo_frontend_inter_token_latency_seconds`
/// (`DYN_METRICS_ITL_*` defaults: 0.001 s to 2 s, 13).
pub(super) static ITL_BUCKETS: LazyLock<Vec<f64>> = LazyLock::new(|| log_buckets(0.001, 2.0, 13));

/// Dynamo's `generate_log_buckets`: `0`, then `count - 1` bounds spaced
/// evenly in log scale after `min` up to `max`, each rounded to two
/// significant figures, duplicates removed.
fn log_buckets(min: f64, max: f64, count: usize) -> Vec<f64> {
    let mut bounds = vec![0.0];
    let (low, high) = (min.ln(), max.ln());
    for i in 1..count {
        let value = (low + (high - low) * i as f64 / (count - 1) as f64).exp();
        bounds.push(two_significant_figures(value));
    }
    bounds.dedup();
    bounds
}

fn two_significant_figures(value: f64) -> f64 {
    let scale = 10_f64.powf(1.0 - value.abs().log10().floor());
    (value * scale).round() / scale
}

/// Observations of durations in seconds, counted into fixed buckets.
#[derive(Debug)]
pub(super) struct Histogram {
    /// Upper bounds, ascending (the `+Inf` bucket is implicit).
    bounds: &'static [f64],
    /// One count per bound, then the `+Inf` bucket (not cumulative).
    counts: Box<[AtomicU64]>,
    /// The sum of the observations, in nanoseconds.
    sum_ns: AtomicU64,
}

/// A histogram as one scrape read it.
#[derive(Debug, PartialEq)]
pub(super) struct Snapshot {
    /// `(upper bound, cumulative count)`, the last bound `+Inf`.
    pub(super) buckets: Vec<(f64, u64)>,
    /// Observations so far.
    pub(super) count: u64,
    /// Their sum in seconds.
    pub(super) sum: f64,
}

impl Histogram {
    /// An empty histogram over `bounds` (ascending).
    pub(super) fn new(bounds: &'static [f64]) -> Self {
        Histogram { bounds, counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(), sum_ns: AtomicU64::new(0) }
    }

    /// Counts one observation of `elapsed`.
    #[inline]
    pub(super) fn observe(&self, elapsed: Duration) {
        self.observe_n(elapsed, 1);
    }

    /// Counts `n` observations of `elapsed` each.
    pub(super) fn observe_n(&self, elapsed: Duration, n: u64) {
        let seconds = elapsed.as_secs_f64();
        // The first bucket whose bound is at least the value (`le` semantics).
        let at = self.bounds.partition_point(|&bound| bound < seconds);
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        // Relaxed: independent counters; a scrape needs no ordering between
        // them (it may see a bucket count a sum ahead or behind).
        self.counts[at].fetch_add(n, Ordering::Relaxed);
        // Relaxed: as above.
        self.sum_ns.fetch_add(ns.saturating_mul(n), Ordering::Relaxed);
    }

    /// The counts now, cumulative as the exposition writes them.
    pub(super) fn snapshot(&self) -> Snapshot {
        let mut cumulative = 0;
        let bounds = self.bounds.iter().copied().chain(std::iter::once(f64::INFINITY));
        let buckets: Vec<(f64, u64)> = bounds
            .zip(self.counts.iter())
            .map(|(bound, count)| {
                // Relaxed: a counter read (see `observe_n`).
                cumulative += count.load(Ordering::Relaxed);
                (bound, cumulative)
            })
            .collect();
        // Relaxed: as above.
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        Snapshot { count: cumulative, buckets, sum }
    }
}

impl Snapshot {
    /// Writes the `_sum`, `_count` and `_bucket` lines of one series of
    /// family `name`, whose other labels are `labels` (`k="v",...`, escaped).
    pub(super) fn write(&self, out: &mut String, name: &str, labels: &str) {
        let _ = writeln!(out, "{name}_sum{{{labels}}} {:?}", self.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count);
        for (bound, count) in &self.buckets {
            if bound.is_infinite() {
                let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {count}");
            } else {
                let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound:?}\"}} {count}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_dynamos() {
        // Two significant figures, as Dynamo rounds them (128 s is 130).
        assert_eq!(*DURATION_BUCKETS, [0.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 130.0, 260.0, 510.0]);
        assert_eq!(TTFT_BUCKETS.len(), 18);
        assert_eq!(TTFT_BUCKETS.last(), Some(&480.0));
        assert_eq!(ITL_BUCKETS.last(), Some(&2.0));
        for bounds in [&*TTFT_BUCKETS, &*DURATION_BUCKETS, &*ITL_BUCKETS] {
            assert!(bounds.windows(2).all(|w| w[0] < w[1]), "{bounds:?}");
        }
    }

    #[test]
    fn observations_land_in_the_first_bucket_at_least_as_large() {
        static BOUNDS: [f64; 3] = [0.5, 1.0, 2.0];
        let histogram = Histogram::new(&BOUNDS);
        histogram.observe(Duration::from_millis(500));
        histogram.observe(Duration::from_millis(501));
        histogram.observe_n(Duration::from_secs(3), 2);
        let snap = histogram.snapshot();
        assert_eq!(snap.buckets, [(0.5, 1), (1.0, 2), (2.0, 2), (f64::INFINITY, 4)]);
        assert_eq!(snap.count, 4);
        assert!((snap.sum - 7.001).abs() < 1e-9, "{}", snap.sum);
        let mut text = String::new();
        snap.write(&mut text, "x_seconds", "model=\"m\"");
        assert!(text.contains("x_seconds_count{model=\"m\"} 4\n"), "{text}");
        assert!(text.contains("x_seconds_bucket{model=\"m\",le=\"1.0\"} 2\n"), "{text}");
        assert!(text.ends_with("x_seconds_bucket{model=\"m\",le=\"+Inf\"} 4\n"), "{text}");
    }
}
