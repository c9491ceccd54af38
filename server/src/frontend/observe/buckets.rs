//! Dynamo's log-spaced histogram buckets.

use std::sync::LazyLock;

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
}
