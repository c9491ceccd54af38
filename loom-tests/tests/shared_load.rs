//! loom: the sum of several frontends' load (`Publisher::Frontend`, with
//! the router's own tracking). Two frontends' publications land on two
//! threads at once, each alone below the threshold: the worker ends
//! published busy exactly when their sum (with the tracked load) is over
//! it — both sides of the bound, and a lowering racing a raising.
#![cfg(loom)]

use std::sync::Arc;

use loadgate::monitor::{Publisher, SharedLoad};
use loadgate::{BusyThresholds, LoadReport, MonitorConfig, RankLoad, WorkerMonitor};
use loadgate_loom_tests::{apply_on_two_threads, run_model_with};

const MODEL: &str = "m";

/// Frontend `n`'s publication `seq` of `tokens` prefill tokens for worker 1.
fn published(n: u16, seq: u64, tokens: u32) -> LoadReport {
    let load = RankLoad { active_prefill_tokens: tokens, ..Default::default() };
    LoadReport { worker: 1, incarnation: 0, rank: 0, publisher: Publisher::Frontend(n), seq, load }
}

/// Worker 1 (threshold: 1,000 prefill tokens), two other frontends kept,
/// `tracked` tokens of this router's own.
fn monitor(tracked: i64) -> Arc<WorkerMonitor> {
    let (clock, _mock) = quanta::Clock::mock();
    let config = MonitorConfig {
        default_thresholds: BusyThresholds { active_prefill_tokens_threshold: Some(1000), ..Default::default() },
        shared: SharedLoad { frontends: 2, ..Default::default() },
        ..Default::default()
    };
    let monitor = WorkerMonitor::with_clock(config, clock).unwrap();
    monitor.register(1, MODEL, 1, 0).unwrap();
    monitor.track(1, 0, 0, 0, tracked).unwrap();
    Arc::new(monitor)
}

/// Applies both publications on two threads, then checks the published
/// bit (the set and the mirror agree) against `busy`.
fn race(monitor: &Arc<WorkerMonitor>, reports: [LoadReport; 2], busy: bool) {
    apply_on_two_threads(monitor, reports);
    let (_, set) = monitor.busy_set(MODEL).expect("model known");
    assert_eq!(set.is_busy(0), busy, "published bit");
    assert_eq!(monitor.workers()[0].busy, busy, "mirror");
}

/// 200 tracked + 400 + 401 = 1,001: busy, though no publisher is over.
#[test]
fn two_frontends_together_over_the_threshold_end_busy() {
    run_model_with("shared_load/over", 3, || {
        let monitor = monitor(200);
        race(&monitor, [published(0, 1, 400), published(1, 1, 401)], true);
    });
}

/// 200 tracked + 400 + 400 = 1,000: free (the threshold is strict).
#[test]
fn two_frontends_together_at_the_threshold_end_free() {
    run_model_with("shared_load/at", 3, || {
        let monitor = monitor(200);
        race(&monitor, [published(0, 1, 400), published(1, 1, 400)], false);
    });
}

/// Busy from frontend 0's 900 (+ 200 tracked); frontend 0 lowers to 100
/// while frontend 1 raises to 600: 900 in the end, free.
#[test]
fn a_lowering_racing_a_raising_ends_in_the_sum_of_the_last_values() {
    run_model_with("shared_load/lower_and_raise", 3, || {
        let monitor = monitor(200);
        monitor.apply(&published(0, 1, 900)).unwrap();
        assert!(monitor.is_busy(1));
        race(&monitor, [published(0, 2, 100), published(1, 1, 600)], false);
    });
}
