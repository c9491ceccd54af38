//! [`StripedHistogram`] against prometheus-client's `Histogram`: bucket
//! placement, sums, the encoded text, and exact counts under concurrent
//! recording.

use std::sync::Barrier;
use std::thread;

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use proptest::prelude::*;

use super::*;
use crate::metrics::MetricsFormat;

/// Dynamo's request-duration bounds (the server's `DURATION_BUCKETS`).
const BOUNDS: [f64; 10] = [0.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 130.0, 260.0, 510.0];

const COUNT: u64 = if cfg!(miri) { 100 } else { 100_000 };

/// The text of a registry holding `metric` as `name`, in `format`.
fn text(metric: impl EncodeMetric + TypedMetric + Send + Sync + fmt::Debug + 'static, format: MetricsFormat) -> String {
    let mut registry = Registry::default();
    registry.register("request_seconds", "Duration of requests", metric);
    format.encode(&registry)
}

/// Both histograms after the same observations, in both formats.
fn both(bounds: &[f64], values: &[f64]) -> [(String, String); 2] {
    let ours = StripedHistogram::new(bounds.iter().copied());
    let theirs = Histogram::new(bounds.iter().copied());
    for &value in values {
        ours.observe(value);
        theirs.observe(value);
    }
    [MetricsFormat::OpenMetrics, MetricsFormat::Prometheus]
        .map(|format| (text(ours.clone(), format), text(theirs.clone(), format)))
}

/// The own count of each bucket and the count.
fn counts(histogram: &StripedHistogram) -> (Vec<u64>, u64) {
    let (_, count, buckets) = histogram.merged();
    (buckets.iter().map(|&(_, n)| n).collect(), count)
}

#[test]
fn le_is_inclusive_at_exact_bounds_like_prometheus_client() {
    let histogram = StripedHistogram::new(BOUNDS);
    for value in [0.0, 2.0, 4.0, 510.0] {
        histogram.observe(value);
    }
    histogram.observe(-1.0); // below the lowest bound: in it
    histogram.observe(2.0 + f64::EPSILON * 2.0); // just above 2: in 4
    histogram.observe(f64::MAX); // above 510: +Inf
    let (buckets, count) = counts(&histogram);
    assert_eq!(buckets, [2, 1, 2, 0, 0, 0, 0, 0, 0, 1, 1]);
    assert_eq!(count, 7);
    let values = [0.0, 2.0, 4.0, 510.0, -1.0, 2.0 + f64::EPSILON * 2.0, f64::MAX, 1.0, 3.9999, 600.0];
    for (ours, theirs) in both(&BOUNDS, &values) {
        assert_eq!(ours, theirs);
    }
    // Bounds out of order or repeated: prometheus-client's first-match
    // search, bound by bound.
    for bounds in [&[4.0, 1.0, 2.0][..], &[1.0, 1.0, 3.0], &[0.5, f64::MAX]] {
        for (ours, theirs) in both(bounds, &[0.5, 1.0, 1.5, 2.0, 3.0, 5.0, f64::MAX, -1.0]) {
            assert_eq!(ours, theirs);
        }
    }
}

#[test]
fn sums_add_up_in_prometheus_clients_order_and_rounding() {
    let values = [0.1, 0.2, 0.3, 1e-9, 2.001, 600.0, -0.5];
    let histogram = StripedHistogram::new(BOUNDS);
    let mut expected = 0.0;
    for value in values {
        histogram.observe(value);
        expected += value;
    }
    assert_eq!(histogram.merged().0.to_bits(), expected.to_bits());
    // 0.1 + 0.2 is not 0.3 in f64, and the text says so, as prometheus-client's does.
    let [(ours, theirs), _] = both(&BOUNDS, &[0.1, 0.2]);
    assert!(ours.contains("request_seconds_sum 0.300000000000000"), "{ours}");
    assert_eq!(ours, theirs);
}

#[test]
fn observe_n_is_n_observations() {
    let many = StripedHistogram::new(BOUNDS);
    let one_by_one = StripedHistogram::new(BOUNDS);
    many.observe_n(0.1, 7);
    many.observe_n(3.0, 0);
    for _ in 0..7 {
        one_by_one.observe(0.1);
    }
    assert_eq!(text(many, MetricsFormat::OpenMetrics), text(one_by_one, MetricsFormat::OpenMetrics));
}

#[test]
fn nan_and_infinity_count_in_inf() {
    let histogram = StripedHistogram::new(BOUNDS);
    histogram.observe(f64::NAN);
    histogram.observe(f64::INFINITY);
    let (buckets, count) = counts(&histogram);
    assert_eq!((buckets.last(), count), (Some(&2), 2));
}

#[test]
fn a_family_of_striped_histograms_encodes_as_prometheus_clients() {
    type Labels = Vec<(&'static str, &'static str)>;
    let ours = Family::<Labels, StripedHistogram>::new_with_constructor(|| StripedHistogram::new(BOUNDS));
    let theirs = Family::<Labels, Histogram>::new_with_constructor(|| Histogram::new(BOUNDS));
    for (model, value) in [("a", 1.5), ("b", 300.0), ("a", 2.0), ("a\"b", 0.0)] {
        ours.get_or_create(&vec![("model", model)]).observe(value);
        theirs.get_or_create(&vec![("model", model)]).observe(value);
    }
    // A family writes its series in its hash map's order, which differs
    // between two maps: compare the lines as sets.
    let lines = |text: String| {
        let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
        lines.sort();
        lines
    };
    for format in [MetricsFormat::OpenMetrics, MetricsFormat::Prometheus] {
        assert_eq!(lines(text(ours.clone(), format)), lines(text(theirs.clone(), format)));
    }
}

#[test]
fn debug_shows_the_merged_figures() {
    let histogram = StripedHistogram::with_owned([1.0], 2);
    histogram.observe(0.5);
    assert_eq!(format!("{histogram:?}"), "StripedHistogram { bounds: [1.0], owned_stripes: 2, count: 1, sum: 0.5 }");
}

/// `threads` threads, started together, each record `COUNT` values that
/// cycle through one per bucket, into a histogram of `owned` owned stripes.
fn record_together(threads: usize, owned: usize) -> StripedHistogram {
    let histogram = StripedHistogram::with_owned(BOUNDS, owned);
    let barrier = Barrier::new(threads);
    // One value per bucket, whole numbers: their sum is exact in any order.
    let values = [0.0, 1.0, 3.0, 5.0, 9.0, 17.0, 33.0, 65.0, 131.0, 261.0, 511.0];
    thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                barrier.wait();
                for i in 0..COUNT {
                    histogram.observe(values[i as usize % values.len()]);
                }
            });
        }
    });
    histogram
}

#[test]
fn concurrent_recording_counts_exactly() {
    // Few or no owned stripes: threads meet on the shared one (test threads
    // hold indexes from 0 up, so with 64 most of these own theirs).
    for (threads, owned) in [(4, 64), (4, 0), (3, 1)] {
        let histogram = record_together(threads, owned);
        let (buckets, count) = counts(&histogram);
        let threads = threads as u64;
        assert_eq!(count, threads * COUNT);
        let per_value = |i: u64| threads * (COUNT / 11 + u64::from(i < COUNT % 11));
        assert_eq!(buckets, (0..11).map(per_value).collect::<Vec<_>>());
        let values = [0.0, 1.0, 3.0, 5.0, 9.0, 17.0, 33.0, 65.0, 131.0, 261.0, 511.0];
        let sum: f64 = (0..11).map(|i| values[i as usize] * per_value(i) as f64).sum();
        assert_eq!(histogram.merged().0, sum);
    }
}

#[test]
fn a_reused_index_carries_on_from_its_last_holders_figures() {
    // Threads one after the other take the same lowest free index, each
    // starting from the figures of the one before.
    let histogram = StripedHistogram::with_owned(BOUNDS, 64);
    for _ in 0..50 {
        thread::scope(|s| {
            s.spawn(|| (0..100).for_each(|_| histogram.observe(3.0)));
        });
    }
    let (buckets, count) = counts(&histogram);
    assert_eq!((buckets[2], count, histogram.merged().0), (5_000, 5_000, 15_000.0));
}

/// `(+Inf bucket, _count)` of an OpenMetrics text.
fn inf_and_count(text: &str) -> (u64, u64) {
    let value = |prefix: &str| {
        let line = text.lines().find(|line| line.starts_with(prefix)).expect(prefix);
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    (value("request_seconds_bucket{le=\"+Inf\"}"), value("request_seconds_count"))
}

#[test]
fn inf_equals_count_while_recording_races_the_scrape() {
    let histogram = StripedHistogram::with_owned(BOUNDS, 2);
    let done = crate::sync::AtomicBool::new(false);
    thread::scope(|s| {
        for value in [1.0, 100.0] {
            let (histogram, done) = (&histogram, &done);
            s.spawn(move || {
                // Relaxed: a stop flag; the scope's join publishes the rest.
                while !done.load(Ordering::Relaxed) {
                    histogram.observe(value);
                }
            });
        }
        let mut last = 0;
        for _ in 0..if cfg!(miri) { 5 } else { 2_000 } {
            let (inf, count) = inf_and_count(&text(histogram.clone(), MetricsFormat::OpenMetrics));
            assert_eq!(inf, count);
            assert!(count >= last, "{count} after {last}");
            last = count;
        }
        // Relaxed: see the loop above.
        done.store(true, Ordering::Relaxed);
    });
}

proptest! {
    #[test]
    fn one_threads_text_is_prometheus_clients(
        bounds in prop::collection::vec(-10.0..1000.0_f64, 0..20),
        picks in prop::collection::vec((0..25_usize, -20.0..2000.0_f64), 0..60),
    ) {
        let mut bounds = bounds;
        bounds.sort_by(f64::total_cmp);
        bounds.dedup();
        // Half the values sit exactly on a bound.
        let values: Vec<f64> = picks
            .iter()
            .map(|&(i, random)| bounds.get(i).copied().unwrap_or(random))
            .collect();
        for (ours, theirs) in both(&bounds, &values) {
            prop_assert_eq!(ours, theirs);
        }
    }
}
