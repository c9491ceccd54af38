//! One test per rule of DESIGN.md › Semantics (and every case issue 2 lists),
//! grouped by topic: thresholds, aggregation, reports, staleness, live
//! threshold changes, routing, admission, status codes, migration, client
//! retry, metrics, and a concurrency sanity check.

use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "prometheus")]
use loadgate::metrics::*;
use loadgate::*;
use loadgate::{admission::*, backoff::*, migration::*, monitor::*, rejection::*, route::*, thresholds::*};

/// Decode-only thresholds.
fn decode(threshold: f64) -> BusyThresholds {
    BusyThresholds { active_decode_blocks_threshold: Some(threshold), ..Default::default() }
}

/// A rank with `active` of `total` KV blocks in use and nothing else known.
fn blocks(active: u32, total: u32) -> RankLoad {
    RankLoad { active_decode_blocks: active, kv_total_blocks: total, ..Default::default() }
}

/// A rank with `active` prefill tokens of a `budget` per-step budget.
fn prefill(active: u32, budget: u32) -> RankLoad {
    RankLoad { active_prefill_tokens: active, max_num_batched_tokens: budget, ..Default::default() }
}

/// A worker-published report.
fn report(worker: WorkerId, rank: u32, seq: u64, load: RankLoad) -> LoadReport {
    LoadReport { worker, incarnation: 0, rank, publisher: Publisher::Worker, seq, load }
}

/// A monitor with `workers` (ids) of model "m", each with `dp` ranks, and `thresholds` set.
fn monitor_with(workers: &[WorkerId], dp: u32, thresholds: BusyThresholds) -> Arc<WorkerMonitor> {
    let monitor = Arc::new(WorkerMonitor::new(MonitorConfig::default()).unwrap());
    for &w in workers {
        assert_eq!(monitor.register(w, "m", dp, 0), Ok(Registered::New));
    }
    if !workers.is_empty() {
        monitor.set_thresholds("m", thresholds).unwrap();
    }
    monitor
}

/// Whether rank load `load` is busy under `thresholds`.
fn rank_busy(thresholds: BusyThresholds, load: RankLoad) -> bool {
    thresholds.validate().unwrap().evaluate(&load).any()
}

/// Asserts the exact decode boundary: `free` blocks of `total` is not busy, `free + 1` is.
fn assert_decode_boundary(threshold: f64, total: u32, free: u32) {
    assert!(!rank_busy(decode(threshold), blocks(free, total)), "{free}/{total} at {threshold} must be free");
    assert!(rank_busy(decode(threshold), blocks(free + 1, total)), "{}/{total} at {threshold} must be busy", free + 1);
}

mod thresholds {
    use super::*;

    #[test]
    fn all_unset_is_never_busy() {
        let t = BusyThresholds::default().validate().unwrap();
        assert!(!t.is_enabled());
        assert!(BusyThresholds::default().is_empty());
        let full = RankLoad {
            active_decode_blocks: u32::MAX,
            kv_total_blocks: 1,
            active_prefill_tokens: u32::MAX,
            max_num_batched_tokens: 1,
            waiting_requests: 0,
        };
        assert_eq!(t.evaluate(&full), BusySignals::default());
    }

    #[test]
    fn decode_threshold_alone() {
        let t = decode(0.5).validate().unwrap();
        // Only the decode signal fires, however many prefill tokens there are.
        let load = RankLoad {
            active_decode_blocks: 51,
            kv_total_blocks: 100,
            active_prefill_tokens: u32::MAX,
            max_num_batched_tokens: 1,
            waiting_requests: 0,
        };
        assert_eq!(
            t.evaluate(&load),
            BusySignals { decode: true, prefill: false, prefill_frac: false, waiting: false }
        );
        assert!(!t.evaluate(&RankLoad { active_decode_blocks: 50, ..load }).any());
    }

    #[test]
    fn absolute_prefill_threshold_alone() {
        let t = BusyThresholds { active_prefill_tokens_threshold: Some(100), ..Default::default() }.validate().unwrap();
        let load = RankLoad {
            active_decode_blocks: 100,
            kv_total_blocks: 100,
            active_prefill_tokens: 101,
            max_num_batched_tokens: 1,
            waiting_requests: 0,
        };
        assert_eq!(
            t.evaluate(&load),
            BusySignals { decode: false, prefill: true, prefill_frac: false, waiting: false }
        );
        assert!(!t.evaluate(&RankLoad { active_prefill_tokens: 100, ..load }).any(), "exactly at: not busy");
        // The absolute threshold needs no budget: an unknown one does not matter.
        assert!(t.evaluate(&prefill(101, 0)).prefill);
    }

    #[test]
    fn absolute_prefill_extremes() {
        let zero = BusyThresholds { active_prefill_tokens_threshold: Some(0), ..Default::default() };
        assert!(!rank_busy(zero, prefill(0, 0)));
        assert!(rank_busy(zero, prefill(1, 0)));
        let huge = BusyThresholds { active_prefill_tokens_threshold: Some(u64::MAX), ..Default::default() };
        assert!(!rank_busy(huge, prefill(u32::MAX, 0)));
        let at_max =
            BusyThresholds { active_prefill_tokens_threshold: Some(u64::from(u32::MAX)), ..Default::default() };
        assert!(!rank_busy(at_max, prefill(u32::MAX, 0)));
        let below =
            BusyThresholds { active_prefill_tokens_threshold: Some(u64::from(u32::MAX) - 1), ..Default::default() };
        assert!(rank_busy(below, prefill(u32::MAX, 0)));
    }

    #[test]
    fn fractional_prefill_threshold_alone() {
        let t = BusyThresholds { active_prefill_tokens_threshold_frac: Some(0.5), ..Default::default() }
            .validate()
            .unwrap();
        let load = RankLoad {
            active_decode_blocks: 100,
            kv_total_blocks: 100,
            active_prefill_tokens: 4097,
            max_num_batched_tokens: 8192,
            waiting_requests: 0,
        };
        assert_eq!(
            t.evaluate(&load),
            BusySignals { decode: false, prefill: false, prefill_frac: true, waiting: false }
        );
        assert!(!t.evaluate(&RankLoad { active_prefill_tokens: 4096, ..load }).any(), "exactly at: not busy");
    }

    #[test]
    fn fractional_prefill_above_one() {
        // A fraction may exceed 1 (more prompt tokens queued than one step takes).
        let t = BusyThresholds { active_prefill_tokens_threshold_frac: Some(1.5), ..Default::default() };
        assert!(!rank_busy(t, prefill(1500, 1000)));
        assert!(rank_busy(t, prefill(1501, 1000)));
        let max = BusyThresholds { active_prefill_tokens_threshold_frac: Some(MAX_PREFILL_FRAC), ..Default::default() };
        // 1e6 * 4295 = 4_295_000_000 > u32::MAX; 1e6 * 4294 = 4_294_000_000 < u32::MAX.
        assert!(!rank_busy(max, prefill(u32::MAX, 4295)));
        assert!(rank_busy(max, prefill(u32::MAX, 4294)));
    }

    #[test]
    fn all_four_signals_report_which_fired() {
        let t = BusyThresholds {
            active_decode_blocks_threshold: Some(0.5),
            active_prefill_tokens_threshold: Some(10),
            active_prefill_tokens_threshold_frac: Some(0.5),
            active_waiting_requests_threshold: Some(2),
        }
        .validate()
        .unwrap();
        let load = RankLoad {
            active_decode_blocks: 60,
            kv_total_blocks: 100,
            active_prefill_tokens: 11,
            max_num_batched_tokens: 100,
            waiting_requests: 2,
        };
        let fired = |decode, prefill, prefill_frac, waiting| BusySignals { decode, prefill, prefill_frac, waiting };
        assert_eq!(t.evaluate(&load), fired(true, true, false, false));
        let load = RankLoad { active_prefill_tokens: 51, ..load };
        assert_eq!(t.evaluate(&load), fired(true, true, true, false));
        let load = RankLoad { active_decode_blocks: 0, active_prefill_tokens: 5, max_num_batched_tokens: 8, ..load };
        assert_eq!(t.evaluate(&load), fired(false, false, true, false));
        let load = RankLoad { waiting_requests: 3, ..load };
        assert_eq!(t.evaluate(&load), fired(false, false, true, true));
    }

    #[test]
    fn waiting_requests_threshold_alone() {
        let t = BusyThresholds { active_waiting_requests_threshold: Some(4), ..Default::default() };
        let waiting = |n| RankLoad { waiting_requests: n, ..Default::default() };
        assert!(!rank_busy(t, waiting(4)), "exactly at the threshold");
        assert!(rank_busy(t, waiting(5)));
        // Only this signal is enabled: full KV and prefill say nothing.
        let full =
            RankLoad { active_decode_blocks: 100, kv_total_blocks: 100, active_prefill_tokens: u32::MAX, ..waiting(0) };
        assert!(!rank_busy(t, full));
        // An engine with no queue reports 0, which no threshold exceeds.
        let zero = BusyThresholds { active_waiting_requests_threshold: Some(0), ..Default::default() };
        assert!(!rank_busy(zero, waiting(0)));
        assert!(rank_busy(zero, waiting(1)));
        assert!(!rank_busy(
            BusyThresholds { active_waiting_requests_threshold: Some(u64::MAX), ..t },
            waiting(u32::MAX)
        ));
    }

    #[test]
    fn waiting_requests_make_a_worker_busy_through_the_monitor() {
        let monitor = monitor_with(
            &[1, 2],
            1,
            BusyThresholds { active_waiting_requests_threshold: Some(1), ..Default::default() },
        );
        let queue = |n| RankLoad { waiting_requests: n, ..Default::default() };
        assert_eq!(monitor.apply(&report(1, 0, 1, queue(2))), Ok(Applied::Flipped));
        assert_eq!(monitor.busy_reasons(1), BusySignals { waiting: true, ..Default::default() });
        assert!(monitor.model_busy_reasons("m").waiting);
        let router = WorkerRouter::new(monitor.clone(), Policy::RoundRobin);
        assert_eq!(router.route("m", &[]), Ok(2));
        monitor.apply(&report(2, 0, 1, queue(5))).unwrap();
        assert_eq!(router.route("m", &[]), Err(RouteError::Overloaded));
        #[cfg(feature = "prometheus")]
        assert_eq!(
            Reason::from_signals(monitor.model_busy_reasons("m")).collect::<Vec<_>>(),
            [Reason::WaitingRequests]
        );
        monitor.apply(&report(2, 0, 2, queue(1))).unwrap();
        assert_eq!(router.route("m", &[]), Ok(2));
    }

    #[test]
    fn exactly_at_085_is_not_busy() {
        // The f64 nearest 0.85 lies just below it: an exact comparison against
        // the binary value would call 85 of 100 busy.
        assert_decode_boundary(0.85, 100, 85);
    }

    #[test]
    fn exactly_at_029_is_not_busy() {
        // The reference's `used > thr * total` calls 29 of 100 busy (0.29 * 100.0
        // is 28.999999999999996).
        let (used, threshold, total) = std::hint::black_box((29.0, 0.29, 100.0));
        assert!(used > threshold * total, "the f64 pitfall this test guards against");
        assert_decode_boundary(0.29, 100, 29);
    }

    #[test]
    fn thresholds_01_and_07() {
        assert_decode_boundary(0.1, 100, 10);
        assert_decode_boundary(0.1, 10, 1);
        assert_decode_boundary(0.1, 30, 3); // 0.1 * 30.0 = 3.0000000000000004 in f64
        assert_decode_boundary(0.7, 100, 70);
        assert_decode_boundary(0.7, 10, 7);
        assert_decode_boundary(0.7, 1000, 700);
    }

    #[test]
    fn boundaries_near_u32_max() {
        // floor(threshold * (2^32 - 1)), computed by hand in exact decimal.
        let total = u32::MAX;
        assert_decode_boundary(0.85, total, 3_650_722_200); // 3_650_722_200.75
        assert_decode_boundary(0.29, total, 1_245_540_515); // 1_245_540_515.55
        assert_decode_boundary(0.1, total, 429_496_729); // 429_496_729.5
        assert_decode_boundary(0.7, total, 3_006_477_106); // 3_006_477_106.5
        assert!(!rank_busy(decode(1.0), blocks(u32::MAX, u32::MAX)), "100% of the cache at threshold 1 is not over it");
        assert!(rank_busy(decode(0.0), blocks(1, u32::MAX)));
        assert!(!rank_busy(decode(0.0), blocks(0, u32::MAX)));
    }

    #[test]
    fn fractional_prefill_boundaries_are_exact_too() {
        let frac = |v| BusyThresholds { active_prefill_tokens_threshold_frac: Some(v), ..Default::default() };
        for (v, budget, free) in [
            (0.85, 100, 85),
            (0.29, 100, 29),
            (0.1, 30, 3),
            (0.7, 10, 7),
            (0.85, u32::MAX, 3_650_722_200),
            (0.29, u32::MAX, 1_245_540_515),
            (1.0 / 3.0, u32::MAX, 1_431_655_763),
            (1.0 / 3.0, 300, 99),
        ] {
            assert!(!rank_busy(frac(v), prefill(free, budget)), "{free}/{budget} at {v} must be free");
            assert!(rank_busy(frac(v), prefill(free + 1, budget)), "{}/{budget} at {v} must be busy", free + 1);
        }
    }

    #[test]
    fn one_third_uses_the_stored_nine_decimals() {
        // 1/3 is stored as 333_333_333 parts per billion, i.e. the decimal
        // 0.333333333 — slightly BELOW one third. The exact rule is
        // `active * 1e9 > 333_333_333 * total`, so the largest free count is
        // floor(333_333_333 * total / 1e9):
        let t = decode(1.0 / 3.0).validate().unwrap();
        assert_eq!(t.decode_ppb(), Some(333_333_333));
        // total = 1e9: exactly at the stored threshold (333_333_333) is free.
        assert_decode_boundary(1.0 / 3.0, 1_000_000_000, 333_333_333);
        // total = 300: 99 free; 100 (exactly one third) is busy, because one
        // third is above the stored 0.333333333.
        assert_decode_boundary(1.0 / 3.0, 300, 99);
        // total = 3: 0 free; 1 of 3 is busy for the same reason.
        assert_decode_boundary(1.0 / 3.0, 3, 0);
        // total = 2^32 - 1: 333_333_333 * 4_294_967_295 / 1e9 = 1_431_655_763.57...
        assert_decode_boundary(1.0 / 3.0, u32::MAX, 1_431_655_763);
    }

    #[test]
    fn fixed_point_rounds_to_the_written_decimal() {
        for (value, ppb) in [(0.85, 850_000_000), (0.29, 290_000_000), (0.1, 100_000_000), (0.7, 700_000_000)] {
            assert_eq!(decode(value).validate().unwrap().decode_ppb(), Some(ppb));
        }
        let frac =
            BusyThresholds { active_prefill_tokens_threshold_frac: Some(123_456.789_012_345), ..Default::default() };
        assert_eq!(frac.validate().unwrap().prefill_frac_ppb(), Some(123_456_789_012_345));
        // Reading the thresholds back gives the decimals that were written.
        let config = BusyThresholds {
            active_decode_blocks_threshold: Some(0.29),
            active_prefill_tokens_threshold: Some(7),
            active_prefill_tokens_threshold_frac: Some(0.7),
            active_waiting_requests_threshold: None,
        };
        assert_eq!(config.validate().unwrap().to_config(), config);
    }

    #[test]
    fn zero_kv_total_blocks_says_nothing() {
        assert!(!rank_busy(decode(0.0), blocks(u32::MAX, 0)));
        // ... but another configured signal still speaks.
        let both = BusyThresholds { active_prefill_tokens_threshold: Some(5), ..decode(0.0) };
        let load = RankLoad {
            active_decode_blocks: 9,
            kv_total_blocks: 0,
            active_prefill_tokens: 6,
            max_num_batched_tokens: 0,
            waiting_requests: 0,
        };
        assert_eq!(
            both.validate().unwrap().evaluate(&load),
            BusySignals { decode: false, prefill: true, prefill_frac: false, waiting: false }
        );
    }

    #[test]
    fn unknown_max_num_batched_tokens_says_nothing() {
        let frac = BusyThresholds { active_prefill_tokens_threshold_frac: Some(0.0), ..Default::default() };
        assert!(!rank_busy(frac, prefill(u32::MAX, 0)));
        assert!(rank_busy(frac, prefill(1, 1)));
    }

    #[test]
    fn invalid_decode_thresholds_are_typed_errors() {
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.1, 1.5, 1.000_000_001, -f64::MIN_POSITIVE] {
            let err = decode(bad).validate().unwrap_err();
            assert!(matches!(err, ThresholdError::DecodeBlocks(v) if v.to_bits() == bad.to_bits()), "{bad}: {err:?}");
            assert!(err.to_string().contains("active_decode_blocks_threshold"), "{err}");
        }
        for good in [0.0, -0.0, 1.0, 0.5] {
            assert!(decode(good).validate().is_ok(), "{good}");
        }
    }

    #[test]
    fn invalid_fractions_are_typed_errors() {
        let frac = |v| BusyThresholds { active_prefill_tokens_threshold_frac: Some(v), ..Default::default() };
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.1, -1e9, MAX_PREFILL_FRAC * 1.000_001, 1e300] {
            let err = frac(bad).validate().unwrap_err();
            assert!(matches!(err, ThresholdError::PrefillFrac(v) if v.to_bits() == bad.to_bits()), "{bad}: {err:?}");
            assert!(err.to_string().contains("active_prefill_tokens_threshold_frac"), "{err}");
        }
        for good in [0.0, 1.0, 2.5, MAX_PREFILL_FRAC] {
            assert!(frac(good).validate().is_ok(), "{good}");
        }
    }

    #[test]
    fn invalid_config_makes_a_monitor_error() {
        let config = MonitorConfig { staleness: None, default_thresholds: decode(f64::NAN), ..Default::default() };
        assert!(matches!(WorkerMonitor::new(config).unwrap_err(), ThresholdError::DecodeBlocks(_)));
    }
}

mod aggregation {
    use super::*;

    #[test]
    fn four_rank_worker_is_busy_only_when_all_ranks_are() {
        let monitor = monitor_with(&[1], 4, decode(0.5));
        for rank in 0..4 {
            assert!(!monitor.is_busy(1), "busy with only {rank} of 4 ranks busy");
            monitor.apply(&report(1, rank, 1, blocks(60, 100))).unwrap();
        }
        assert!(monitor.is_busy(1));
        // One rank drops below: the worker is free again.
        assert_eq!(monitor.apply(&report(1, 2, 2, blocks(50, 100))), Ok(Applied::Flipped));
        assert!(!monitor.is_busy(1));
    }

    #[test]
    fn ranks_may_be_busy_for_different_signals() {
        let t = BusyThresholds { active_prefill_tokens_threshold: Some(10), ..decode(0.5) };
        let monitor = monitor_with(&[1], 2, t);
        monitor.apply(&report(1, 0, 1, blocks(60, 100))).unwrap();
        monitor.apply(&report(1, 1, 1, prefill(11, 0))).unwrap();
        assert!(monitor.is_busy(1));
        assert_eq!(
            monitor.busy_reasons(1),
            BusySignals { decode: true, prefill: true, prefill_frac: false, waiting: false }
        );
        assert_eq!(
            monitor.model_busy_reasons("m"),
            BusySignals { decode: true, prefill: true, prefill_frac: false, waiting: false }
        );
    }

    #[test]
    fn a_rank_that_never_reported_keeps_its_worker_free() {
        let monitor = monitor_with(&[1], 4, decode(0.0));
        for rank in 0..3 {
            monitor.apply(&report(1, rank, 1, blocks(100, 100))).unwrap();
        }
        assert!(!monitor.is_busy(1), "rank 3 never reported");
        assert_eq!(monitor.apply(&report(1, 3, 1, blocks(100, 100))), Ok(Applied::Flipped));
        assert!(monitor.is_busy(1));
    }

    #[test]
    fn a_new_worker_starts_free() {
        let monitor = monitor_with(&[1], 1, decode(0.0));
        assert!(!monitor.is_busy(1));
        assert_eq!(
            monitor.workers(),
            vec![WorkerInfo { id: 1, incarnation: 0, model: "m".into(), dp_size: 1, busy: false }]
        );
    }

    #[test]
    fn with_no_threshold_nothing_is_busy() {
        let monitor = monitor_with(&[1], 1, BusyThresholds::default());
        assert_eq!(monitor.apply(&report(1, 0, 1, blocks(100, 100))), Ok(Applied::Stored));
        assert!(!monitor.is_busy(1));
        assert_eq!(monitor.busy_reasons(1), BusySignals::default());
    }

    #[test]
    fn registration_errors() {
        let monitor = WorkerMonitor::new(MonitorConfig::default()).unwrap();
        assert_eq!(monitor.register(1, "m", 0, 0), Err(RegisterError::InvalidDpSize(0)));
        assert_eq!(monitor.register(1, "m", 65_537, 0), Err(RegisterError::InvalidDpSize(65_537)));
        assert_eq!(monitor.register(1, "", 1, 0), Err(RegisterError::EmptyModel));
        assert_eq!(monitor.register(1, "m", 2, 0), Ok(Registered::New));
        assert_eq!(monitor.register(1, "m", 2, 0), Ok(Registered::Same), "same registration again is a no-op");
        assert_eq!(monitor.register(1, "m", 3, 0), Err(RegisterError::Conflict(1)));
        assert_eq!(monitor.register(1, "other", 2, 0), Err(RegisterError::Conflict(1)));
    }
}

mod reports {
    use super::*;

    #[test]
    fn duplicate_and_out_of_order_reports_are_dropped() {
        let monitor = monitor_with(&[1], 1, decode(0.5));
        assert_eq!(monitor.apply(&report(1, 0, 5, blocks(60, 100))), Ok(Applied::Flipped));
        // Duplicate seq: dropped, even with different values.
        assert_eq!(monitor.apply(&report(1, 0, 5, blocks(0, 100))), Ok(Applied::Stale));
        // Older seq: dropped.
        assert_eq!(monitor.apply(&report(1, 0, 4, blocks(0, 100))), Ok(Applied::Stale));
        assert!(monitor.is_busy(1));
        let snap = monitor.rank_snapshots();
        assert_eq!(snap[0].reported, Some(blocks(60, 100)));
        // Newer seq (with a gap): applied.
        assert_eq!(monitor.apply(&report(1, 0, 9, blocks(0, 100))), Ok(Applied::Flipped));
        assert!(!monitor.is_busy(1));
    }

    #[test]
    fn the_first_report_of_an_incarnation_applies_seq_zero_included() {
        let monitor = monitor_with(&[1], 1, decode(0.5));
        assert_eq!(monitor.apply(&report(1, 0, 0, blocks(60, 100))), Ok(Applied::Flipped));
        assert_eq!(monitor.apply(&report(1, 0, 0, blocks(10, 100))), Ok(Applied::Stale), "0 again is not newer");
        assert_eq!(monitor.apply(&report(1, 0, 1, blocks(10, 100))), Ok(Applied::Flipped));
    }

    /// Defect 1 (fails on b1708da, where `seq = u64::MAX` made every later
    /// report stale and re-registering kept the slots: the worker stayed busy).
    #[test]
    fn a_huge_seq_wedges_nothing_past_its_incarnation() {
        let monitor = monitor_with(&[1], 1, decode(0.5));
        assert_eq!(monitor.apply(&report(1, 0, u64::MAX, blocks(60, 100))), Ok(Applied::Flipped));
        assert_eq!(monitor.apply(&report(1, 0, 1, blocks(10, 100))), Ok(Applied::Stale), "within the incarnation");
        assert!(monitor.is_busy(1));
        // The worker restarts: a new incarnation resets its slots (free), and
        // its reports count from any seq again.
        assert_eq!(monitor.register(1, "m", 1, 7), Ok(Registered::Restarted));
        assert!(!monitor.is_busy(1), "a restarted worker starts free");
        assert_eq!(monitor.rank_snapshots()[0].reported, None, "its slots were reset");
        let restarted = |seq, load| LoadReport { worker: 1, incarnation: 7, seq, load, ..Default::default() };
        assert_eq!(monitor.apply(&restarted(1, blocks(60, 100))), Ok(Applied::Flipped));
        assert_eq!(monitor.apply(&restarted(2, blocks(10, 100))), Ok(Applied::Flipped));
        assert!(!monitor.is_busy(1));
    }

    #[test]
    fn reports_of_another_incarnation_are_dropped() {
        let monitor = monitor_with(&[1], 1, decode(0.5));
        assert_eq!(monitor.register(1, "m", 1, 5), Ok(Registered::Restarted));
        let old = LoadReport { worker: 1, incarnation: 0, seq: 99, load: blocks(90, 100), ..Default::default() };
        assert_eq!(monitor.apply(&old), Ok(Applied::OtherIncarnation));
        let future = LoadReport { incarnation: 6, ..old };
        assert_eq!(monitor.apply(&future), Ok(Applied::OtherIncarnation));
        assert!(!monitor.is_busy(1));
        assert_eq!(monitor.rank_snapshots()[0].reported, None);
    }

    #[test]
    fn a_reconnect_with_the_same_incarnation_keeps_the_slots() {
        let monitor = monitor_with(&[1], 1, decode(0.5));
        monitor.apply(&report(1, 0, 3, blocks(60, 100))).unwrap();
        assert_eq!(monitor.register(1, "m", 1, 0), Ok(Registered::Same));
        assert!(monitor.is_busy(1), "still busy: the slots stayed");
        assert_eq!(monitor.apply(&report(1, 0, 3, blocks(10, 100))), Ok(Applied::Stale), "and so did the seq");
        // A reconnect must not change the model or dp size; a restart may.
        assert_eq!(monitor.register(1, "m", 2, 0), Err(RegisterError::Conflict(1)));
        assert_eq!(monitor.register(1, "other", 2, 1), Ok(Registered::Restarted));
        assert_eq!(monitor.workers()[0].model, "other");
        assert_eq!(monitor.workers()[0].dp_size, 2);
        assert_eq!(monitor.busy_set("m").unwrap().0, Vec::<WorkerId>::new(), "left its old model");
        assert_eq!(monitor.busy_set("other").unwrap().0, [1]);
    }

    /// A request sent to a worker's previous life that ends after the
    /// restart must not take its load off the new life's tracked load
    /// (found by review).
    #[test]
    fn tracked_load_belongs_to_one_incarnation() {
        let monitor = monitor_with(&[1], 1, decode(0.5));
        monitor.set_tracked_capacity(1, 0, 0, 100, 0).unwrap();
        monitor.track(1, 0, 0, 60, 0).unwrap();
        assert_eq!(monitor.register(1, "m", 1, 9), Ok(Registered::Restarted));
        assert_eq!(monitor.incarnation(1), Some(9));
        monitor.set_tracked_capacity(1, 9, 0, 100, 0).unwrap();
        assert_eq!(monitor.track(1, 9, 0, 60, 0), Ok(Applied::Flipped), "the new life's own request");
        // The old request ends: dropped, the new life stays busy.
        assert_eq!(monitor.track(1, 0, 0, -60, 0), Ok(Applied::OtherIncarnation));
        assert_eq!(monitor.set_tracked_capacity(1, 0, 0, 1, 1), Ok(Applied::OtherIncarnation));
        assert!(monitor.is_busy(1));
        assert_eq!(monitor.rank_snapshots()[0].tracked, Some(blocks(60, 100)));
    }

    /// Tracked load belongs to one registration: a worker deregistered and
    /// registered again in the same incarnation (fresh slots) takes no
    /// give-back of a request dispatched before; a reconnect (the same
    /// registration) does (found by review).
    #[test]
    fn tracked_load_belongs_to_one_registration() {
        let monitor = monitor_with(&[1], 1, decode(0.5));
        monitor.set_tracked_capacity(1, 0, 0, 100, 0).unwrap();
        let first = monitor.worker_life(1).expect("registered");
        assert_eq!(monitor.track_life(1, first, 0, 60, 0), Ok(Applied::Flipped));
        assert_eq!(monitor.register(1, "m", 1, 0), Ok(Registered::Same));
        assert_eq!(monitor.worker_life(1), Some(first), "a reconnect keeps the registration");
        assert!(monitor.deregister_incarnation(1, 0));
        assert_eq!(monitor.worker_life(1), None);
        assert_eq!(monitor.register(1, "m", 1, 0), Ok(Registered::New));
        let second = monitor.worker_life(1).expect("registered again");
        assert_ne!(second, first);
        monitor.set_tracked_capacity(1, 0, 0, 100, 0).unwrap();
        assert_eq!(monitor.track_life(1, second, 0, 60, 0), Ok(Applied::Flipped), "the new registration's request");
        assert_eq!(monitor.track_life(1, first, 0, -60, 0), Ok(Applied::OtherIncarnation), "the old one's ends");
        assert!(monitor.is_busy(1));
        assert_eq!(monitor.track_life(1, second, 0, -60, 0), Ok(Applied::Flipped));
        assert_eq!(monitor.track_life(2, second, 0, 1, 0), Err(ApplyError::UnknownWorker(2)));
    }

    /// Found by a review: the rank was checked against the *current*
    /// registration's dp size before the incarnation, so an update of a
    /// previous life for a rank the new life no longer has (a worker
    /// restarted with a smaller dp size) failed with `RankOutOfRange`
    /// instead of being dropped as another incarnation's: a request guard
    /// giving back its load, a reporter of the old life, or a peer's frame
    /// for it saw an error the docs promise only for a bad rank of the
    /// worker they name.
    #[test]
    fn another_incarnation_s_rank_is_not_checked_against_the_new_dp_size() {
        let monitor = monitor_with(&[1], 4, decode(0.5));
        let first = monitor.worker_life(1).expect("registered");
        let old_reporter = monitor.reporter(1).unwrap();
        monitor.set_tracked_capacity(1, 0, 3, 100, 0).unwrap();
        assert_eq!(monitor.track_life(1, first, 3, 60, 0), Ok(Applied::Stored));
        assert_eq!(monitor.register(1, "m", 1, 9), Ok(Registered::Restarted));
        let old =
            LoadReport { worker: 1, incarnation: 0, rank: 3, seq: 5, load: blocks(90, 100), ..Default::default() };
        assert_eq!(monitor.apply(&old), Ok(Applied::OtherIncarnation));
        assert_eq!(monitor.track(1, 0, 3, -60, 0), Ok(Applied::OtherIncarnation));
        assert_eq!(monitor.track_life(1, first, 3, -60, 0), Ok(Applied::OtherIncarnation));
        assert_eq!(monitor.set_tracked_capacity(1, 0, 3, 1, 1), Ok(Applied::OtherIncarnation));
        assert_eq!(old_reporter.report_rank(3, blocks(90, 100)), Ok(Applied::OtherIncarnation));
        // The current life's ranks are still checked.
        let new = LoadReport { incarnation: 9, ..old };
        assert_eq!(monitor.apply(&new), Err(ApplyError::RankOutOfRange { worker: 1, rank: 3, dp_size: 1 }));
        assert_eq!(monitor.track(1, 9, 1, 1, 0), Err(ApplyError::RankOutOfRange { worker: 1, rank: 1, dp_size: 1 }));
        assert!(!monitor.is_busy(1));
    }

    #[test]
    fn deregistering_an_old_incarnation_keeps_the_new_one() {
        let monitor = monitor_with(&[1], 1, decode(0.5));
        assert_eq!(monitor.register(1, "m", 1, 2), Ok(Registered::Restarted));
        assert!(!monitor.deregister_incarnation(1, 0), "the old incarnation is gone already");
        assert_eq!(monitor.workers().len(), 1);
        assert!(monitor.deregister_incarnation(1, 2));
        assert!(monitor.workers().is_empty());
    }

    #[test]
    fn sequence_numbers_are_per_rank() {
        let monitor = monitor_with(&[1], 2, decode(0.5));
        monitor.apply(&report(1, 0, 10, blocks(60, 100))).unwrap();
        assert_eq!(monitor.apply(&report(1, 1, 1, blocks(60, 100))), Ok(Applied::Flipped));
    }

    #[test]
    fn unchanged_values_are_stored_without_a_flip() {
        let monitor = monitor_with(&[1], 1, decode(0.5));
        monitor.apply(&report(1, 0, 1, blocks(60, 100))).unwrap();
        assert_eq!(monitor.apply(&report(1, 0, 2, blocks(60, 100))), Ok(Applied::Stored));
        assert_eq!(monitor.apply(&report(1, 0, 3, blocks(70, 100))), Ok(Applied::Stored));
        assert!(monitor.is_busy(1));
    }

    #[test]
    fn report_errors() {
        let monitor = monitor_with(&[1], 2, decode(0.5));
        assert_eq!(monitor.apply(&report(9, 0, 1, blocks(1, 1))), Err(ApplyError::UnknownWorker(9)));
        assert_eq!(
            monitor.apply(&report(1, 2, 1, blocks(1, 1))),
            Err(ApplyError::RankOutOfRange { worker: 1, rank: 2, dp_size: 2 })
        );
        assert_eq!(monitor.track(9, 0, 0, 1, 1), Err(ApplyError::UnknownWorker(9)));
        assert_eq!(monitor.track(1, 0, 5, 1, 1), Err(ApplyError::RankOutOfRange { worker: 1, rank: 5, dp_size: 2 }));
        assert_eq!(monitor.set_tracked_capacity(9, 0, 0, 1, 1), Err(ApplyError::UnknownWorker(9)));
    }

    #[test]
    fn tracked_load_does_not_overwrite_reported_load() {
        let monitor = monitor_with(&[1], 1, decode(0.85));
        monitor.apply(&report(1, 0, 1, blocks(90, 100))).unwrap();
        assert!(monitor.is_busy(1));
        // The router tracks less than the worker reports: the larger wins.
        monitor.track(1, 0, 0, 10, 0).unwrap();
        assert!(monitor.is_busy(1));
        let snap = monitor.rank_snapshots()[0];
        assert_eq!(snap.reported, Some(blocks(90, 100)));
        assert_eq!(snap.tracked, Some(blocks(10, 0)));
        assert_eq!(snap.effective(), Some(blocks(90, 100)));
    }

    #[test]
    fn reported_load_does_not_overwrite_tracked_load() {
        let monitor = monitor_with(&[1], 1, decode(0.85));
        monitor.set_tracked_capacity(1, 0, 0, 100, 0).unwrap();
        assert_eq!(monitor.track(1, 0, 0, 90, 0), Ok(Applied::Flipped));
        assert!(monitor.is_busy(1));
        // The worker reports less (its report lags): the tracked load stays and wins.
        assert_eq!(monitor.apply(&report(1, 0, 1, blocks(10, 100))), Ok(Applied::Stored));
        assert!(monitor.is_busy(1));
        let snap = monitor.rank_snapshots()[0];
        assert_eq!(snap.reported, Some(blocks(10, 100)));
        assert_eq!(snap.tracked, Some(blocks(90, 100)));
        // Requests end: the tracked load falls, the reported one decides.
        assert_eq!(monitor.track(1, 0, 0, -90, 0), Ok(Applied::Flipped));
        assert!(!monitor.is_busy(1));
    }

    #[test]
    fn tracked_numerator_uses_the_reported_denominator() {
        // The router knows what it dispatched but not the capacity: the
        // worker's kv_total_blocks completes the fraction.
        let monitor = monitor_with(&[1], 1, decode(0.85));
        monitor.apply(&report(1, 0, 1, blocks(10, 100))).unwrap();
        assert_eq!(monitor.track(1, 0, 0, 86, 0), Ok(Applied::Flipped));
        assert_eq!(monitor.rank_snapshots()[0].effective(), Some(blocks(86, 100)));
    }

    #[test]
    fn publishers_have_separate_sequence_numbers() {
        let monitor = monitor_with(&[1], 1, decode(0.5));
        let router_report = LoadReport {
            worker: 1,
            incarnation: 0,
            rank: 0,
            publisher: Publisher::Router,
            seq: 100,
            load: blocks(60, 100),
        };
        assert_eq!(monitor.apply(&router_report), Ok(Applied::Flipped));
        // A worker report with a lower seq than the router's is still new for its publisher.
        assert_eq!(monitor.apply(&report(1, 0, 1, blocks(10, 100))), Ok(Applied::Stored));
        assert!(monitor.is_busy(1), "the router-published load still decides");
        assert_eq!(monitor.apply(&LoadReport { seq: 100, load: blocks(0, 100), ..router_report }), Ok(Applied::Stale));
        assert_eq!(
            monitor.apply(&LoadReport { seq: 101, load: blocks(0, 100), ..router_report }),
            Ok(Applied::Flipped)
        );
    }

    #[test]
    fn tracking_saturates_at_zero() {
        let monitor = monitor_with(&[1], 1, decode(0.5));
        monitor.track(1, 0, 0, -5, -5).unwrap();
        assert_eq!(monitor.rank_snapshots()[0].tracked, Some(RankLoad::default()));
        monitor.track(1, 0, 0, 3, 4).unwrap();
        assert_eq!(
            monitor.rank_snapshots()[0].tracked,
            Some(RankLoad { active_decode_blocks: 3, active_prefill_tokens: 4, ..Default::default() })
        );
    }

    #[test]
    fn tracking_saturates_with_extreme_deltas() {
        let monitor = monitor_with(&[1], 1, decode(0.5));
        monitor.track(1, 0, 0, 7, 7).unwrap();
        monitor.track(1, 0, 0, i64::MAX, i64::MAX).unwrap();
        let full = RankLoad { active_decode_blocks: u32::MAX, active_prefill_tokens: u32::MAX, ..Default::default() };
        assert_eq!(monitor.rank_snapshots()[0].tracked, Some(full));
        monitor.track(1, 0, 0, i64::MIN, i64::MIN).unwrap();
        assert_eq!(monitor.rank_snapshots()[0].tracked, Some(RankLoad::default()));
    }

    #[test]
    fn worker_load_sums_effective_ranks() {
        let monitor = monitor_with(&[1], 2, decode(0.5));
        monitor.apply(&report(1, 0, 1, RankLoad { active_prefill_tokens: 5, ..blocks(10, 100) })).unwrap();
        monitor.apply(&report(1, 1, 1, blocks(30, 50))).unwrap();
        monitor.track(1, 0, 1, 40, 0).unwrap();
        assert_eq!(
            monitor.worker_load(1),
            Some(WorkerLoad {
                active_decode_blocks: 50,
                kv_total_blocks: 150,
                active_prefill_tokens: 5,
                waiting_requests: 0
            })
        );
        assert_eq!(monitor.worker_load(2), None);
    }
}

mod staleness {
    use super::*;

    fn stale_monitor(window: Duration) -> (Arc<WorkerMonitor>, Arc<quanta::Mock>) {
        let (clock, mock) = quanta::Clock::mock();
        let config = MonitorConfig { staleness: Some(window), default_thresholds: decode(0.5), ..Default::default() };
        let monitor = Arc::new(WorkerMonitor::with_clock(config, clock).unwrap());
        monitor.register(1, "m", 1, 0).unwrap();
        (monitor, mock)
    }

    #[test]
    fn a_busy_worker_whose_reports_age_out_becomes_free() {
        let (monitor, mock) = stale_monitor(Duration::from_secs(3));
        monitor.apply(&report(1, 0, 1, blocks(60, 100))).unwrap();
        assert!(monitor.is_busy(1));
        mock.increment(Duration::from_secs(3));
        assert_eq!(monitor.expire_stale(), 0, "exactly at the window is still fresh");
        assert!(monitor.is_busy(1));
        mock.increment(1u64);
        assert_eq!(monitor.expire_stale(), 1);
        assert!(!monitor.is_busy(1));
        assert_eq!(monitor.rank_snapshots()[0].reported, None, "a stale rank counts as unreported");
        // A fresh report (same values) makes it busy again.
        assert_eq!(monitor.apply(&report(1, 0, 2, blocks(60, 100))), Ok(Applied::Flipped));
        assert!(monitor.is_busy(1));
    }

    #[test]
    fn expiry_refreshes_the_reasons_of_a_worker_that_stays_busy() {
        let (clock, mock) = quanta::Clock::mock();
        let thresholds = BusyThresholds { active_prefill_tokens_threshold: Some(10), ..decode(0.5) };
        let config = MonitorConfig {
            staleness: Some(Duration::from_secs(3)),
            default_thresholds: thresholds,
            ..Default::default()
        };
        let monitor = WorkerMonitor::with_clock(config, clock).unwrap();
        monitor.register(1, "m", 1, 0).unwrap();
        monitor.apply(&report(1, 0, 1, blocks(60, 100))).unwrap();
        monitor.track(1, 0, 0, 0, 11).unwrap(); // the router's own prefill count never goes stale
        assert_eq!(
            monitor.busy_reasons(1),
            BusySignals { decode: true, prefill: true, prefill_frac: false, waiting: false }
        );
        mock.increment(Duration::from_secs(4));
        assert_eq!(monitor.expire_stale(), 0, "still busy on prefill");
        assert!(monitor.is_busy(1));
        assert_eq!(monitor.busy_reasons(1), BusySignals { prefill: true, ..Default::default() });
    }

    #[test]
    fn heartbeats_keep_a_steady_load_fresh() {
        let (monitor, mock) = stale_monitor(Duration::from_secs(3));
        monitor.apply(&report(1, 0, 1, blocks(60, 100))).unwrap();
        for seq in 2..10 {
            mock.increment(Duration::from_secs(1));
            assert_eq!(monitor.apply(&report(1, 0, seq, blocks(60, 100))), Ok(Applied::Stored));
            assert_eq!(monitor.expire_stale(), 0);
            assert!(monitor.is_busy(1));
        }
    }

    #[test]
    fn router_tracked_load_never_goes_stale() {
        let (monitor, mock) = stale_monitor(Duration::from_secs(3));
        monitor.set_tracked_capacity(1, 0, 0, 100, 0).unwrap();
        monitor.track(1, 0, 0, 60, 0).unwrap();
        assert!(monitor.is_busy(1));
        mock.increment(Duration::from_secs(3600));
        assert_eq!(monitor.expire_stale(), 0);
        assert!(monitor.is_busy(1));
    }

    #[test]
    fn a_stale_rank_of_a_multi_rank_worker_frees_it() {
        let (clock, mock) = quanta::Clock::mock();
        let config = MonitorConfig {
            staleness: Some(Duration::from_millis(100)),
            default_thresholds: decode(0.5),
            ..Default::default()
        };
        let monitor = WorkerMonitor::with_clock(config, clock).unwrap();
        monitor.register(1, "m", 2, 0).unwrap();
        monitor.apply(&report(1, 0, 1, blocks(60, 100))).unwrap();
        mock.increment(Duration::from_millis(60));
        monitor.apply(&report(1, 1, 1, blocks(60, 100))).unwrap();
        assert!(monitor.is_busy(1));
        mock.increment(Duration::from_millis(60)); // rank 0 is 120 ms old, rank 1 60 ms
        assert_eq!(monitor.expire_stale(), 1);
        assert!(!monitor.is_busy(1));
    }

    #[test]
    fn without_a_window_reports_never_go_stale() {
        let (clock, mock) = quanta::Clock::mock();
        let monitor = WorkerMonitor::with_clock(
            MonitorConfig { staleness: None, default_thresholds: decode(0.5), ..Default::default() },
            clock,
        )
        .unwrap();
        monitor.register(1, "m", 1, 0).unwrap();
        monitor.apply(&report(1, 0, 1, blocks(60, 100))).unwrap();
        mock.increment(Duration::from_secs(1_000_000));
        assert_eq!(monitor.expire_stale(), 0);
        assert!(monitor.is_busy(1));
    }
}

mod live_thresholds {
    use super::*;

    #[test]
    fn a_threshold_change_takes_effect_with_no_new_report() {
        let monitor = monitor_with(&[1, 2], 1, decode(0.85));
        let router = WorkerRouter::new(monitor.clone(), Policy::RoundRobin);
        monitor.apply(&report(1, 0, 1, blocks(80, 100))).unwrap();
        monitor.apply(&report(2, 0, 1, blocks(10, 100))).unwrap();
        assert!(!monitor.is_busy(1));
        let t = monitor.update_thresholds("m", |t| t.active_decode_blocks_threshold = Some(0.75)).unwrap();
        assert_eq!(t.decode_ppb(), Some(750_000_000));
        // Before the call returned, worker 1 was re-evaluated and published.
        assert!(monitor.is_busy(1));
        assert_eq!(monitor.busy_set("m").unwrap().1.busy_count(), 1);
        for _ in 0..4 {
            assert_eq!(router.route("m", &[]), Ok(2));
        }
    }

    #[test]
    fn a_threshold_clear_takes_effect_with_no_new_report() {
        let monitor = monitor_with(&[1], 1, decode(0.5));
        let router = WorkerRouter::new(monitor.clone(), Policy::RoundRobin);
        monitor.apply(&report(1, 0, 1, blocks(60, 100))).unwrap();
        assert_eq!(router.route("m", &[]), Err(RouteError::Overloaded));
        let t = monitor.update_thresholds("m", |t| t.active_decode_blocks_threshold = None).unwrap();
        assert!(!t.is_enabled());
        assert!(!monitor.is_busy(1));
        assert_eq!(router.route("m", &[]), Ok(1));
        // Setting it again makes it busy again, still without a report.
        monitor.set_thresholds("m", decode(0.5)).unwrap();
        assert!(monitor.is_busy(1));
        assert_eq!(router.route("m", &[]), Err(RouteError::Overloaded));
    }

    #[test]
    fn a_local_router_sees_threshold_changes_and_expiry_at_once() {
        let (clock, mock) = quanta::Clock::mock();
        let config = MonitorConfig {
            staleness: Some(Duration::from_secs(1)),
            default_thresholds: decode(0.5),
            ..Default::default()
        };
        let monitor = Arc::new(WorkerMonitor::with_clock(config, clock).unwrap());
        monitor.register(1, "m", 1, 0).unwrap();
        let mut local = WorkerRouter::new(monitor.clone(), Policy::RoundRobin).model("m").unwrap().local();
        assert_eq!(local.route(&[]), Ok(1));
        monitor.apply(&report(1, 0, 1, blocks(60, 100))).unwrap();
        assert_eq!(local.route(&[]), Err(RouteError::Overloaded));
        monitor.update_thresholds("m", |t| t.active_decode_blocks_threshold = Some(0.7)).unwrap();
        assert_eq!(local.route(&[]), Ok(1));
        monitor.update_thresholds("m", |t| t.active_decode_blocks_threshold = Some(0.5)).unwrap();
        assert_eq!(local.route(&[]), Err(RouteError::Overloaded));
        mock.increment(Duration::from_secs(2));
        assert_eq!(monitor.expire_stale(), 1);
        assert_eq!(local.route(&[]), Ok(1));
        monitor.deregister(1);
        assert_eq!(local.route(&[]), Err(RouteError::Unavailable));
    }

    #[test]
    fn clearing_one_signal_keeps_the_others() {
        let both = BusyThresholds { active_prefill_tokens_threshold: Some(10), ..decode(0.5) };
        let monitor = monitor_with(&[1], 1, both);
        monitor.apply(&report(1, 0, 1, RankLoad { active_prefill_tokens: 11, ..blocks(60, 100) })).unwrap();
        assert!(monitor.is_busy(1));
        let t = monitor.update_thresholds("m", |t| t.active_decode_blocks_threshold = None).unwrap();
        assert_eq!((t.decode_ppb(), t.prefill_tokens()), (None, Some(10)));
        assert!(monitor.is_busy(1), "the prefill signal still fires");
        assert_eq!(
            monitor.busy_reasons(1),
            BusySignals { decode: false, prefill: true, prefill_frac: false, waiting: false }
        );
        monitor.update_thresholds("m", |t| t.active_prefill_tokens_threshold = None).unwrap();
        assert!(!monitor.is_busy(1));
    }

    #[test]
    fn invalid_or_unknown_changes_change_nothing() {
        let monitor = monitor_with(&[1], 1, decode(0.5));
        assert_eq!(monitor.set_thresholds("nope", decode(0.5)), Err(SetThresholdsError::UnknownModel("nope".into())));
        let err = monitor.update_thresholds("m", |t| t.active_decode_blocks_threshold = Some(1.5)).unwrap_err();
        assert!(matches!(err, SetThresholdsError::Invalid(ThresholdError::DecodeBlocks(_))));
        assert_eq!(monitor.thresholds("m").unwrap().decode_ppb(), Some(500_000_000));
        assert_eq!(monitor.thresholds("nope"), None);
    }

    #[test]
    fn thresholds_are_per_model() {
        let monitor = Arc::new(WorkerMonitor::new(MonitorConfig::default()).unwrap());
        monitor.register(1, "a", 1, 0).unwrap();
        monitor.register(2, "b", 1, 0).unwrap();
        monitor.set_thresholds("a", decode(0.5)).unwrap();
        monitor.apply(&report(1, 0, 1, blocks(60, 100))).unwrap();
        monitor.apply(&report(2, 0, 1, blocks(60, 100))).unwrap();
        assert!(monitor.is_busy(1));
        assert!(!monitor.is_busy(2));
        let all = monitor.all_thresholds();
        assert_eq!(all.iter().map(|(m, _)| m.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        assert!(all[0].1.is_enabled() && !all[1].1.is_enabled());
    }

    #[test]
    fn default_thresholds_apply_to_every_new_model() {
        let config = MonitorConfig { staleness: None, default_thresholds: decode(0.5), ..Default::default() };
        let monitor = WorkerMonitor::new(config).unwrap();
        monitor.register(1, "x", 1, 0).unwrap();
        assert!(monitor.add_model("y"));
        assert!(!monitor.add_model("y"));
        assert!(!monitor.add_model(""), "an empty model name is refused, as in register");
        assert!(!monitor.has_model(""));
        assert_eq!(monitor.thresholds("x").unwrap().decode_ppb(), Some(500_000_000));
        assert_eq!(monitor.thresholds("y").unwrap().decode_ppb(), Some(500_000_000));
        monitor.apply(&report(1, 0, 1, blocks(60, 100))).unwrap();
        assert!(monitor.is_busy(1));
        assert_eq!(monitor.models(), ["x", "y"]);
    }
}

mod routing {
    use std::collections::HashMap;

    use super::*;

    fn count_picks(router: &WorkerRouter, exclude: &[WorkerId], n: usize) -> HashMap<WorkerId, usize> {
        let mut counts = HashMap::new();
        for _ in 0..n {
            *counts.entry(router.route("m", exclude).unwrap()).or_insert(0) += 1;
        }
        counts
    }

    fn assert_fair(counts: &HashMap<WorkerId, usize>, free: &[WorkerId]) {
        let picked: Vec<usize> = free.iter().map(|w| counts.get(w).copied().unwrap_or(0)).collect();
        let (min, max) = (picked.iter().min().unwrap(), picked.iter().max().unwrap());
        assert!(max - min <= 1, "unfair round robin: {counts:?}");
        assert_eq!(
            picked.iter().sum::<usize>(),
            counts.values().sum::<usize>(),
            "a busy or excluded worker was picked"
        );
    }

    #[test]
    fn with_no_threshold_busy_looking_workers_are_still_routed_to() {
        let monitor = monitor_with(&[1, 2], 1, BusyThresholds::default());
        for w in [1, 2] {
            monitor.apply(&report(w, 0, 1, RankLoad { active_prefill_tokens: u32::MAX, ..blocks(100, 100) })).unwrap();
        }
        let router = WorkerRouter::new(monitor, Policy::RoundRobin);
        assert_fair(&count_picks(&router, &[], 100), &[1, 2]);
    }

    #[test]
    fn round_robin_skips_busy_workers_fairly() {
        let ids: Vec<WorkerId> = (1..=10).collect();
        let monitor = monitor_with(&ids, 1, decode(0.5));
        for w in [2, 3, 7] {
            monitor.apply(&report(w, 0, 1, blocks(60, 100))).unwrap();
        }
        let router = WorkerRouter::new(monitor, Policy::RoundRobin);
        let counts = count_picks(&router, &[], 7001);
        assert_fair(&counts, &[1, 4, 5, 6, 8, 9, 10]);
        assert!([2, 3, 7].iter().all(|w| !counts.contains_key(w)));
    }

    /// Defect 6d (fails on b1708da: the cursor lived in the monitor, shared
    /// by every router, so A got [1, 1]).
    #[test]
    fn each_router_keeps_its_own_rotation() {
        let monitor = monitor_with(&[1, 2], 1, BusyThresholds::default());
        let a = WorkerRouter::new(monitor.clone(), Policy::RoundRobin);
        let b = WorkerRouter::new(monitor.clone(), Policy::RoundRobin);
        let least = WorkerRouter::new(monitor, Policy::LeastLoaded);
        let mut seen = Vec::new();
        for _ in 0..3 {
            seen.push(a.route("m", &[]).unwrap());
            b.route("m", &[]).unwrap();
            least.route("m", &[]).unwrap();
        }
        assert_eq!(seen, [1, 2, 1], "router A's own sequence");
        // A router's handles share its rotation; a clone is the same router.
        let handle = a.model("m").unwrap();
        let mut local = handle.local();
        let clone = a.clone();
        assert_eq!([handle.route(&[]), local.route(&[]), clone.route("m", &[])], [Ok(2), Ok(1), Ok(2)]);
    }

    #[test]
    fn round_robin_is_fair_across_word_boundaries_and_exclusions() {
        let ids: Vec<WorkerId> = (0..150).collect();
        let monitor = monitor_with(&ids, 1, decode(0.5));
        let busy: Vec<WorkerId> = ids.iter().copied().filter(|w| w % 3 == 0).collect();
        for &w in &busy {
            monitor.apply(&report(w, 0, 1, blocks(60, 100))).unwrap();
        }
        let exclude = [1, 64, 128, 3 /* busy too */, 1 /* twice */];
        let free: Vec<WorkerId> = ids.iter().copied().filter(|w| w % 3 != 0 && !exclude.contains(w)).collect();
        let router = WorkerRouter::new(monitor, Policy::RoundRobin);
        let counts = count_picks(&router, &exclude, free.len() * 10 + 7);
        assert_fair(&counts, &free);
    }

    #[test]
    fn overloaded_unavailable_and_unknown_model_differ() {
        let monitor = monitor_with(&[1], 1, decode(0.5));
        let router = WorkerRouter::new(monitor.clone(), Policy::RoundRobin);
        assert_eq!(router.route("nope", &[]), Err(RouteError::UnknownModel));
        assert!(router.model("nope").is_err());
        monitor.add_model("empty");
        assert_eq!(router.route("empty", &[]), Err(RouteError::Unavailable));
        monitor.apply(&report(1, 0, 1, blocks(60, 100))).unwrap();
        assert_eq!(router.route("m", &[]), Err(RouteError::Overloaded));
        monitor.apply(&report(1, 0, 2, blocks(0, 100))).unwrap();
        assert_eq!(router.route("m", &[1]), Err(RouteError::Overloaded), "every worker excluded");
        assert!(monitor.deregister(1));
        assert_eq!(router.route("m", &[]), Err(RouteError::Unavailable), "registered once, none now");
        assert_eq!(RouteError::Overloaded.to_string(), "All workers are busy, please retry later");
    }

    #[test]
    fn exclusions_are_request_local() {
        let monitor = monitor_with(&[1, 2, 3], 1, decode(0.5));
        let router = WorkerRouter::new(monitor, Policy::RoundRobin);
        for _ in 0..20 {
            assert_eq!(router.route("m", &[1, 3]), Ok(2));
            assert!(router.route("m", &[2]).unwrap() != 2);
        }
        // Unknown ids and duplicates in the exclusion list are harmless.
        assert_fair(&count_picks(&router, &[99, 2, 2, 42], 100), &[1, 3]);
        assert_fair(&count_picks(&router, &[], 99), &[1, 2, 3]);
    }

    #[test]
    fn excluding_a_busy_worker_does_not_count_it_twice() {
        let monitor = monitor_with(&[1, 2, 3], 1, decode(0.5));
        monitor.apply(&report(1, 0, 1, blocks(60, 100))).unwrap();
        let router = WorkerRouter::new(monitor, Policy::RoundRobin);
        for _ in 0..10 {
            assert_eq!(router.route("m", &[1, 2]), Ok(3));
            assert_eq!(router.route("m", &[1, 1, 3, 2, 3]), Err(RouteError::Overloaded));
        }
    }

    #[test]
    fn deregistered_workers_are_never_routed_to() {
        let monitor = monitor_with(&[1, 2, 3], 1, decode(0.5));
        let router = WorkerRouter::new(monitor.clone(), Policy::RoundRobin);
        let handle = router.model("m").unwrap();
        assert!(monitor.deregister(2));
        assert!(!monitor.deregister(2));
        for _ in 0..20 {
            assert_ne!(router.route("m", &[]), Ok(2));
            assert_ne!(handle.route(&[]), Ok(2));
        }
        assert_eq!(monitor.apply(&report(2, 0, 1, blocks(1, 1))), Err(ApplyError::UnknownWorker(2)));
        assert!(!monitor.is_busy(2));
        // The model and its thresholds stay; a re-registered worker starts free and fresh.
        assert_eq!(monitor.thresholds("m").unwrap().decode_ppb(), Some(500_000_000));
        assert_eq!(monitor.register(2, "m", 4, 0), Ok(Registered::New));
        assert!(!monitor.is_busy(2));
        assert_eq!(monitor.apply(&report(2, 3, 1, blocks(1, 1))), Ok(Applied::Stored));
    }

    #[test]
    fn deregistering_a_busy_worker_keeps_the_others_bits() {
        let monitor = monitor_with(&[1, 2, 3], 1, decode(0.5));
        monitor.apply(&report(1, 0, 1, blocks(60, 100))).unwrap();
        monitor.apply(&report(3, 0, 1, blocks(60, 100))).unwrap();
        monitor.deregister(1);
        let (ids, set) = monitor.busy_set("m").unwrap();
        assert_eq!(ids, [2, 3]);
        assert!(!set.is_busy(0) && set.is_busy(1));
        let router = WorkerRouter::new(monitor, Policy::RoundRobin);
        assert_eq!(router.route("m", &[]), Ok(2));
        assert_eq!(router.route("m", &[2]), Err(RouteError::Overloaded));
    }

    fn loaded_pool() -> Arc<WorkerMonitor> {
        // 1: 50%, 2: 20%, 3: 90% (busy), 4: 30%, 5: 20% with more prefill.
        let monitor = monitor_with(&[1, 2, 3, 4, 5], 1, decode(0.85));
        for (w, used) in [(1, 50), (2, 20), (3, 90), (4, 30), (5, 20)] {
            let tokens = if w == 5 { 100 } else { 0 };
            monitor.apply(&report(w, 0, 1, RankLoad { active_prefill_tokens: tokens, ..blocks(used, 100) })).unwrap();
        }
        assert!(monitor.is_busy(3));
        monitor
    }

    #[test]
    fn random_and_power_of_two_choose_only_eligible_workers() {
        let monitor = loaded_pool();
        for policy in [Policy::Random, Policy::PowerOfTwoChoices] {
            let router = WorkerRouter::new(monitor.clone(), policy.clone());
            let counts = count_picks(&router, &[4], 2000);
            assert!(!counts.contains_key(&3) && !counts.contains_key(&4), "{policy:?}: {counts:?}");
            assert!(counts.contains_key(&2), "{policy:?}: {counts:?}");
            assert_eq!(router.route("m", &[1, 2, 4, 5]), Err(RouteError::Overloaded));
        }
        let random = WorkerRouter::new(monitor.clone(), Policy::Random);
        let counts = count_picks(&random, &[4], 2000);
        assert!([1, 2, 5].iter().all(|w| counts.contains_key(w)), "random reaches every eligible worker: {counts:?}");
        // With exactly two eligible, power-of-two compares both: the less loaded always wins.
        let p2c = WorkerRouter::new(monitor, Policy::PowerOfTwoChoices);
        for _ in 0..100 {
            assert_eq!(p2c.route("m", &[2, 5]), Ok(4));
            assert_eq!(p2c.route("m", &[1, 4]), Ok(2), "same blocks: fewer prefill tokens wins");
        }
    }

    #[test]
    fn power_of_two_draws_two_distinct_workers_uniformly() {
        // 1: 50%, 2: 40%, 3: 10%, none busy. Power of two returns the less
        // loaded of a uniformly drawn pair: {1,2} -> 2, {1,3} and {2,3} -> 3.
        // So 3 wins 2/3 of the time and 1 never does. A biased second draw
        // (never or rarely the last eligible) shows as 3 winning ~1/2.
        let monitor = monitor_with(&[1, 2, 3, 4], 1, decode(0.99));
        for (w, used) in [(1, 50), (2, 40), (3, 10), (4, 0)] {
            monitor.apply(&report(w, 0, 1, blocks(used, 100))).unwrap();
        }
        let router = WorkerRouter::new(monitor, Policy::PowerOfTwoChoices);
        // Excluding 4 both ways: through the exclusion scan, and with 4 deregistered-like busy.
        let counts = count_picks(&router, &[4], 6000);
        assert_eq!(counts.get(&1), None, "the most loaded of three can never win a pair: {counts:?}");
        let third = counts.get(&3).copied().unwrap_or(0);
        // Expected 4000, standard deviation ~37: [3700, 4300] is over 8 sigma wide.
        assert!((3700..=4300).contains(&third), "worker 3 won {third} of 6000, expected ~4000: {counts:?}");
    }

    #[test]
    fn power_of_two_is_uniform_without_exclusions() {
        let monitor = monitor_with(&[1, 2, 3], 1, decode(0.99));
        for (w, used) in [(1, 50), (2, 40), (3, 10)] {
            monitor.apply(&report(w, 0, 1, blocks(used, 100))).unwrap();
        }
        let router = WorkerRouter::new(monitor, Policy::PowerOfTwoChoices);
        let counts = count_picks(&router, &[], 6000);
        let third = counts.get(&3).copied().unwrap_or(0);
        assert!((3700..=4300).contains(&third), "worker 3 won {third} of 6000, expected ~4000: {counts:?}");
    }

    #[test]
    fn least_loaded_picks_the_minimum() {
        let router = WorkerRouter::new(loaded_pool(), Policy::LeastLoaded);
        for _ in 0..10 {
            assert_eq!(router.route("m", &[]), Ok(2));
            assert_eq!(router.route("m", &[2]), Ok(5));
            assert_eq!(router.route("m", &[2, 5]), Ok(4));
            assert_eq!(router.route("m", &[2, 5, 4]), Ok(1), "the busy worker 3 stays out");
        }
    }

    #[test]
    fn least_loaded_compares_utilisation_not_blocks() {
        let monitor = monitor_with(&[1, 2], 1, decode(0.99));
        monitor.apply(&report(1, 0, 1, blocks(30, 1000))).unwrap(); // 3%
        monitor.apply(&report(2, 0, 1, blocks(10, 100))).unwrap(); // 10%
        let router = WorkerRouter::new(monitor, Policy::LeastLoaded);
        assert_eq!(router.route("m", &[]), Ok(1));
    }

    #[test]
    fn cost_picks_the_minimum_among_eligible() {
        let monitor = loaded_pool();
        // Cost: prefer high ids (a stand-in for prefix overlap).
        let cost: CostFn = Arc::new(|id, _load| 100 - id);
        let router = WorkerRouter::new(monitor.clone(), Policy::Cost(cost));
        for _ in 0..10 {
            assert_eq!(router.route("m", &[]), Ok(5));
            assert_eq!(router.route("m", &[5]), Ok(4), "3 is busy");
            assert_eq!(router.model("m").unwrap().route(&[5, 4]), Ok(2));
        }
        // route_by_cost on any router, with the load passed in.
        let rr = WorkerRouter::new(monitor, Policy::RoundRobin);
        let by_blocks = |_id, load: &WorkerLoad| load.active_decode_blocks;
        assert_eq!(rr.route_by_cost("m", &[2, 5], &by_blocks), Ok(4));
        assert_eq!(rr.route_by_cost("m", &[1, 2, 4, 5], &by_blocks), Err(RouteError::Overloaded));
        assert_eq!(rr.route_by_cost("x", &[], &by_blocks), Err(RouteError::UnknownModel));
    }

    #[test]
    fn cost_ties_rotate() {
        let monitor = monitor_with(&[1, 2, 3], 1, decode(0.5));
        let router = WorkerRouter::new(monitor, Policy::Cost(Arc::new(|_, _| 7)));
        assert_fair(&count_picks(&router, &[], 300), &[1, 2, 3]);
    }

    /// A tie goes to the first tied instance from the rotating start, not
    /// the last: equal costs take the instances in round-robin order, from
    /// the first, for `Policy::Cost` and `route_by_cost` alike.
    #[test]
    fn cost_ties_go_to_the_first_from_the_rotating_start() {
        let monitor = monitor_with(&[1, 2, 3], 1, decode(0.5));
        let router = WorkerRouter::new(monitor.clone(), Policy::Cost(Arc::new(|_, _| 7)));
        let picks: Vec<WorkerId> = (0..6).map(|_| router.route("m", &[]).unwrap()).collect();
        assert_eq!(picks, [1, 2, 3, 1, 2, 3]);
        let rr = WorkerRouter::new(monitor, Policy::RoundRobin);
        let picks: Vec<WorkerId> = (0..4).map(|_| rr.route_by_cost("m", &[2], &|_, _| 7).unwrap()).collect();
        assert_eq!(picks, [1, 3, 3, 1], "starts at positions 0, 1, 2, 0; 2 excluded");
    }

    /// What a log of a router shows: its policy (a cost function as
    /// `Cost(..)`), and a handle's model.
    #[test]
    fn debug_output_names_the_policy_and_the_model() {
        let monitor = monitor_with(&[1], 1, decode(0.5));
        let names = [
            (Policy::RoundRobin, "RoundRobin"),
            (Policy::Random, "Random"),
            (Policy::PowerOfTwoChoices, "PowerOfTwoChoices"),
            (Policy::LeastLoaded, "LeastLoaded"),
            (Policy::Cost(Arc::new(|_, _| 0)), "Cost(..)"),
        ];
        for (policy, name) in names {
            assert_eq!(format!("{policy:?}"), name);
        }
        let router = WorkerRouter::new(monitor, Policy::LeastLoaded);
        assert_eq!(format!("{router:?}"), "WorkerRouter { policy: LeastLoaded, .. }");
        let handle = router.model("m").unwrap();
        assert_eq!(format!("{handle:?}"), r#"ModelRouter { model: "m" }"#);
        assert_eq!(format!("{:?}", handle.local()), r#"LocalRouter { model: "m" }"#);
    }

    #[test]
    fn model_router_handle_sees_later_changes() {
        let monitor = monitor_with(&[1, 2], 1, decode(0.5));
        let handle = WorkerRouter::new(monitor.clone(), Policy::RoundRobin).model("m").unwrap();
        monitor.apply(&report(1, 0, 1, blocks(60, 100))).unwrap();
        assert_eq!(handle.route(&[]), Ok(2));
        monitor.register(3, "m", 1, 0).unwrap();
        assert!([handle.route(&[]), handle.route(&[])].contains(&Ok(3)));
        monitor.apply(&report(2, 0, 1, blocks(60, 100))).unwrap();
        monitor.apply(&report(3, 0, 1, blocks(60, 100))).unwrap();
        assert_eq!(handle.route(&[]), Err(RouteError::Overloaded));
    }
}

mod admission {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    use std::sync::mpsc;

    use super::*;

    type Ready = mpsc::Receiver<(u32, Permit<u32>)>;

    /// An admission whose dispatch hands queued items to a channel; items in
    /// `gone` are refused by their (departed) client.
    fn channel_admission(n: usize, q: usize, gone: &'static [u32]) -> (Arc<Admission<u32>>, Ready) {
        let (tx, rx) = mpsc::channel();
        let tx = std::sync::Mutex::new(tx);
        let admission = Admission::with_dispatch(
            n,
            q,
            Box::new(move |item, permit| {
                if gone.contains(&item) {
                    return Err(permit);
                }
                tx.lock().unwrap().send((item, permit)).map_err(|e| e.0 .1)
            }),
        )
        .unwrap();
        (admission, rx)
    }

    fn now(result: Result<Admitted<u32>, Rejected<u32>>) -> Permit<u32> {
        match result {
            Ok(Admitted::Now(_, permit)) => permit,
            other => panic!("expected a direct admission, got {other:?}"),
        }
    }

    fn queued(result: Result<Admitted<u32>, Rejected<u32>>) {
        assert!(matches!(result, Ok(Admitted::Queued)), "expected queued, got {result:?}");
    }

    /// Defect 2 (fails on b1708da: "thread 'releaser' has overflowed its
    /// stack", SIGABRT, from 616 queued items in debug and 1608 in release on
    /// this stack). Every queued item finishes inline, inside the dispatch
    /// that hands it its slot, so each release would recurse into the next.
    #[test]
    fn inline_releases_drain_the_largest_queue_on_a_small_stack() {
        let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = runs.clone();
        let admission = Admission::with_dispatch(
            1,
            MAX_QUEUE_LIMIT,
            Box::new(move |_item: u32, permit| {
                counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                drop(permit); // the item ran to its end inline
                Ok(())
            }),
        )
        .unwrap();
        let first = now(admission.try_admit(0));
        for item in 1..=MAX_QUEUE_LIMIT as u32 {
            queued(admission.try_admit(item));
        }
        assert!(admission.try_admit(u32::MAX).is_err(), "N + Q admitted");
        assert_eq!(admission.queued(), MAX_QUEUE_LIMIT);
        std::thread::Builder::new()
            .name("releaser".into())
            .stack_size(256 * 1024)
            .spawn(move || drop(first))
            .unwrap()
            .join()
            .expect("the releasing thread survives");
        assert_eq!(runs.load(std::sync::atomic::Ordering::Relaxed), MAX_QUEUE_LIMIT);
        assert_eq!((admission.running(), admission.queued()), (0, 0));
    }

    /// A dispatcher that panics does not jam the gate: its slot is
    /// released as the panic unwinds, and the loop passing slots on still
    /// reaches the other waiting items (found by review: the pass-on
    /// counter stayed set and every later slot was kept).
    /// The permits a test's dispatch sends on, with their items.
    type Dispatched = mpsc::Receiver<(u32, loadgate::Permit<u32>)>;

    /// A gate of N = 1, Q = 4 whose dispatch panics for the items in
    /// `panicking` and sends the others' permits on the channel; item 0
    /// running, items 1 to 3 queued, then item 0's permit dropped (the
    /// first panic caught here, as the releasing thread sees it).
    fn panicking_gate(panicking: &'static [u32]) -> (Arc<Admission<u32>>, Dispatched, std::thread::Result<()>) {
        let (tx, rx) = mpsc::channel();
        let tx = std::sync::Mutex::new(tx);
        let admission = Admission::with_dispatch(
            1,
            4,
            Box::new(move |item: u32, permit| {
                assert!(!panicking.contains(&item), "item {item}'s dispatch panics");
                tx.lock().unwrap().send((item, permit)).map_err(|e| e.0 .1)
            }),
        )
        .unwrap();
        let first = now(admission.try_admit(0));
        for item in 1..=3 {
            queued(admission.try_admit(item));
        }
        let unwound = catch_unwind(AssertUnwindSafe(move || drop(first)));
        (admission, rx, unwound)
    }

    #[test]
    fn a_panicking_dispatcher_leaves_the_gate_working() {
        let (admission, rx, unwound) = panicking_gate(&[1]);
        assert!(unwound.is_err(), "the dispatcher's panic reaches the releasing thread");
        // Item 1's slot went to item 2, which holds it now.
        let (item, permit) = rx.try_recv().expect("item 2 got the slot");
        assert_eq!(item, 2);
        assert_eq!((admission.running(), admission.queued()), (1, 1));
        drop(permit);
        let (item, permit) = rx.try_recv().expect("item 3 got the slot");
        assert_eq!(item, 3);
        drop(permit);
        assert_eq!((admission.running(), admission.queued()), (0, 0));
        // And it admits again, directly.
        drop(now(admission.try_admit(4)));
    }

    /// Found by a review: the slots a panicking dispatch's unwinding passes
    /// on ran the next dispatches inside a destructor, so a second panic
    /// aborted the process ("panic in a destructor during cleanup"). Items 1
    /// and 2 panic: the first panic reaches the releasing thread, the
    /// second is caught, and item 3 gets the slot.
    #[test]
    fn dispatches_that_panic_one_after_another_leave_the_gate_working() {
        let (admission, rx, unwound) = panicking_gate(&[1, 2]);
        assert!(unwound.is_err(), "the first panic reaches the releasing thread");
        let (item, permit) = rx.try_recv().expect("item 3 got the slot");
        assert_eq!((item, admission.running(), admission.queued()), (3, 1, 0));
        drop(permit);
        assert_eq!((admission.running(), admission.queued()), (0, 0));
        // And it admits again, directly.
        drop(now(admission.try_admit(4)));
    }

    /// A dispatcher that drops several permits it holds, from inside a
    /// dispatch, has every one of them passed on, in order.
    #[test]
    fn releases_from_inside_a_dispatch_pass_every_slot_on_in_order() {
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = order.clone();
        let admission = Admission::with_dispatch(
            2,
            4,
            Box::new(move |item: u32, permit| {
                log.lock().unwrap().push(item);
                drop(permit);
                Ok(())
            }),
        )
        .unwrap();
        let a = now(admission.try_admit(0));
        let b = now(admission.try_admit(1));
        for item in 2..6 {
            queued(admission.try_admit(item));
        }
        drop(a);
        drop(b);
        assert_eq!(*order.lock().unwrap(), [2, 3, 4, 5]);
        assert_eq!((admission.running(), admission.queued()), (0, 0));
    }

    #[test]
    fn construction_errors() {
        let noop = || -> Dispatch<()> { Box::new(|_, _| Ok(())) };
        assert_eq!(Admission::with_dispatch(0, 16, noop()).unwrap_err(), AdmissionError::ZeroLimit);
        assert_eq!(Admission::with_dispatch(1, 1, noop()).unwrap_err(), AdmissionError::QueueLimitTooSmall(1));
        assert_eq!(Admission::with_dispatch(1, 0, noop()).unwrap_err(), AdmissionError::QueueLimitTooSmall(0));
        let ok = Admission::with_dispatch(1, 2, noop()).unwrap();
        assert_eq!((ok.limit(), ok.queue_limit()), (1, 2));
    }

    #[test]
    fn queue_limit_parsing() {
        assert_eq!(parse_queue_limit(None), Ok(DEFAULT_QUEUE_LIMIT));
        assert_eq!(DEFAULT_QUEUE_LIMIT, 16);
        assert_eq!(parse_queue_limit(Some(" 4 ")), Ok(4));
        assert_eq!(parse_queue_limit(Some("2")), Ok(2));
        assert_eq!(parse_queue_limit(Some("abc")), Err(AdmissionError::InvalidQueueLimit("abc".into())));
        assert_eq!(parse_queue_limit(Some("")), Err(AdmissionError::InvalidQueueLimit("".into())));
        assert_eq!(parse_queue_limit(Some("-3")), Err(AdmissionError::InvalidQueueLimit("-3".into())));
        assert_eq!(parse_queue_limit(Some("2.5")), Err(AdmissionError::InvalidQueueLimit("2.5".into())));
        assert_eq!(parse_queue_limit(Some("1")), Err(AdmissionError::QueueLimitTooSmall(1)));
        assert_eq!(parse_queue_limit(Some("0")), Err(AdmissionError::QueueLimitTooSmall(0)));
        // The overflow is allocated up front: a huge value is an error, not an out-of-memory.
        assert_eq!(parse_queue_limit(Some("4000000000")), Err(AdmissionError::QueueLimitTooLarge(4_000_000_000)));
        assert_eq!(parse_queue_limit(Some(&MAX_QUEUE_LIMIT.to_string())), Ok(MAX_QUEUE_LIMIT));
        let msg = parse_queue_limit(Some("abc")).unwrap_err().to_string();
        assert!(msg.contains(QUEUE_LIMIT_ENV) && msg.contains("abc"), "{msg}");
    }

    #[test]
    fn from_env_without_the_variable_uses_sixteen() {
        if std::env::var_os(QUEUE_LIMIT_ENV).is_some() {
            return; // the environment of this run sets it; parse_queue_limit covers the rest
        }
        let admission = Admission::<()>::new(3, queue_limit_from_env().unwrap()).unwrap();
        assert_eq!((admission.limit(), admission.queue_limit()), (3, 16));
    }

    #[test]
    fn exactly_n_plus_q_are_admitted() {
        for (n, q) in [(1, 2), (2, 3), (4, 16), (1, 7)] {
            let (admission, _rx) = channel_admission(n, q, &[]);
            let permits: Vec<_> = (0..n as u32).map(|i| now(admission.try_admit(i))).collect();
            for i in 0..q as u32 {
                queued(admission.try_admit(100 + i));
            }
            assert_eq!((admission.running(), admission.queued()), (n, q));
            for i in 0..3 {
                let refused = admission.try_admit(999 + i).unwrap_err();
                assert_eq!(refused.to_string(), WORKER_AT_CAPACITY);
                assert_eq!(refused.into_inner(), 999 + i, "the item comes back");
            }
            assert_eq!(admission.rejected(), 3);
            assert_eq!((admission.running(), admission.queued()), (n, q));
            drop(permits);
        }
    }

    #[test]
    fn queued_items_run_in_arrival_order() {
        let (admission, rx) = channel_admission(1, 5, &[]);
        let mut running = now(admission.try_admit(0));
        for i in 1..=5 {
            queued(admission.try_admit(i));
        }
        for expected in 1..=5 {
            drop(running);
            let (item, permit) = rx.try_recv().expect("the freed slot went to the next item at once");
            assert_eq!(item, expected);
            assert_eq!(admission.running(), 1);
            assert_eq!(admission.queued(), 5 - expected as usize);
            running = permit;
        }
        drop(running);
        assert_eq!((admission.running(), admission.queued()), (0, 0));
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn fifo_holds_while_arrivals_keep_coming() {
        let (admission, rx) = channel_admission(2, 3, &[]);
        let a = now(admission.try_admit(0));
        let b = now(admission.try_admit(1));
        queued(admission.try_admit(2));
        queued(admission.try_admit(3));
        drop(a);
        // Item 4 arrives after 2 took a slot: it queues behind 3, never overtakes it.
        queued(admission.try_admit(4));
        queued(admission.try_admit(5));
        let mut order = Vec::new();
        let mut held = vec![b];
        while let Ok((item, permit)) = rx.try_recv() {
            order.push(item);
            held.push(permit);
        }
        while !held.is_empty() {
            drop(held.remove(0));
            while let Ok((item, permit)) = rx.try_recv() {
                order.push(item);
                held.push(permit);
            }
        }
        assert_eq!(order, [2, 3, 4, 5]);
        assert_eq!((admission.running(), admission.queued()), (0, 0));
    }

    #[test]
    fn a_direct_admission_only_when_nothing_is_queued() {
        let (admission, rx) = channel_admission(1, 2, &[]);
        let a = now(admission.try_admit(0));
        queued(admission.try_admit(1));
        drop(a); // item 1 takes the slot
        let (item, p1) = rx.try_recv().unwrap();
        assert_eq!(item, 1);
        queued(admission.try_admit(2)); // the slot is held: wait
        drop(p1);
        let (item, p2) = rx.try_recv().unwrap();
        assert_eq!(item, 2);
        drop(p2);
        let _direct = now(admission.try_admit(3)); // nothing queued, a slot free
    }

    #[test]
    fn a_dropped_permit_releases_its_slot() {
        let (admission, _rx) = channel_admission(2, 2, &[]);
        let a = now(admission.try_admit(0));
        let b = now(admission.try_admit(1));
        assert_eq!(admission.running(), 2);
        drop(a);
        assert_eq!(admission.running(), 1);
        drop(b);
        assert_eq!(admission.running(), 0);
    }

    #[test]
    fn a_scoped_permit_counts_and_releases_like_an_owned_one() {
        let (admission, rx) = channel_admission(1, 2, &[]);
        let Ok(Admitted::Now(0, scoped)) = admission.try_admit_scoped(0) else { panic!("a slot was free") };
        assert_eq!(admission.running(), 1);
        // Same cap, same FIFO: the next arrivals queue, then one is refused.
        assert!(matches!(admission.try_admit_scoped(1), Ok(Admitted::Queued)));
        assert!(matches!(admission.try_admit(2), Ok(Admitted::Queued)));
        assert_eq!(admission.try_admit_scoped(3).unwrap_err().into_inner(), 3);
        // Dropping the scoped permit hands its slot to the oldest waiting item.
        drop(scoped);
        let (item, permit) = rx.try_recv().expect("the slot passed to the next item at once");
        assert_eq!((item, admission.running(), admission.queued()), (1, 1, 1));
        drop(permit);
        let (item, permit) = rx.try_recv().expect("and on to the last one");
        assert_eq!(item, 2);
        drop(permit);
        assert_eq!((admission.running(), admission.queued()), (0, 0));
    }

    #[test]
    fn a_scoped_permit_turned_owned_keeps_its_slot_until_dropped() {
        let (admission, _rx) = channel_admission(1, 2, &[]);
        let Ok(Admitted::Now(_, scoped)) = admission.try_admit_scoped(0) else { panic!("a slot was free") };
        let owned = scoped.into_owned();
        assert_eq!(admission.running(), 1, "into_owned neither frees nor takes a slot");
        let moved = std::thread::spawn(move || drop(owned));
        moved.join().unwrap();
        assert_eq!(admission.running(), 0);
        assert_eq!(Arc::strong_count(&admission), 1, "the owned permit let go of its gate");
    }

    #[test]
    fn a_scoped_permit_released_by_unwinding_passes_its_slot_on() {
        let (admission, rx) = channel_admission(1, 2, &[]);
        let result = catch_unwind(AssertUnwindSafe(|| {
            let Ok(Admitted::Now(_, _held)) = admission.try_admit_scoped(0) else { panic!("a slot was free") };
            assert!(matches!(admission.try_admit(1), Ok(Admitted::Queued)));
            panic!("the engine failed mid-request (expected by this test)");
        }));
        assert!(result.is_err());
        let (item, permit) = rx.try_recv().expect("the unwound scoped permit passed its slot on");
        assert_eq!(item, 1);
        drop(permit);
        assert_eq!(admission.running(), 0);
    }

    #[test]
    fn a_panicking_request_releases_its_slot() {
        let (admission, rx) = channel_admission(1, 2, &[]);
        let permit = now(admission.try_admit(0));
        queued(admission.try_admit(1));
        let result = catch_unwind(AssertUnwindSafe(move || {
            let _held = permit;
            panic!("the engine failed mid-request (expected by this test)");
        }));
        assert!(result.is_err());
        let (item, permit) = rx.try_recv().expect("the unwound permit passed its slot on");
        assert_eq!(item, 1);
        assert_eq!(admission.running(), 1);
        drop(permit);
        assert_eq!(admission.running(), 0);
    }

    #[test]
    fn a_returned_permit_passes_the_slot_to_the_next_item() {
        // Items 1 and 2 lost their clients while queued.
        let (admission, rx) = channel_admission(1, 4, &[1, 2]);
        let a = now(admission.try_admit(0));
        for i in 1..=3 {
            queued(admission.try_admit(i));
        }
        drop(a);
        let (item, p3) = rx.try_recv().unwrap();
        assert_eq!(item, 3, "the slot skipped the departed items 1 and 2");
        assert_eq!((admission.running(), admission.queued()), (1, 0));
        drop(p3);
        assert_eq!((admission.running(), admission.queued()), (0, 0));
    }

    #[test]
    fn a_returned_permit_with_nobody_waiting_frees_the_slot() {
        let (admission, rx) = channel_admission(1, 2, &[1]);
        let a = now(admission.try_admit(0));
        queued(admission.try_admit(1));
        drop(a);
        assert!(rx.try_recv().is_err());
        assert_eq!((admission.running(), admission.queued()), (0, 0));
        let _b = now(admission.try_admit(2));
    }

    #[test]
    fn gauges_and_rejection_counter() {
        let (admission, rx) = channel_admission(2, 2, &[]);
        assert_eq!((admission.running(), admission.queued(), admission.rejected()), (0, 0, 0));
        let a = now(admission.try_admit(0));
        assert_eq!((admission.running(), admission.queued()), (1, 0));
        let _b = now(admission.try_admit(1));
        queued(admission.try_admit(2));
        assert_eq!((admission.running(), admission.queued()), (2, 1));
        queued(admission.try_admit(3));
        assert!(admission.try_admit(4).is_err());
        assert!(admission.try_admit(5).is_err());
        assert_eq!((admission.running(), admission.queued(), admission.rejected()), (2, 2, 2));
        drop(a);
        assert_eq!((admission.running(), admission.queued()), (2, 1));
        #[cfg(feature = "prometheus")]
        {
            let stats = WorkerAdmissionStats {
                rejected: admission.rejected(),
                running: admission.running() as u64,
                queued: admission.queued() as u64,
            };
            assert_eq!(stats, WorkerAdmissionStats { rejected: 2, running: 2, queued: 1 });
        }
        drop(rx);
    }

    #[test]
    fn a_dispatch_into_a_closed_channel_frees_every_slot() {
        let (admission, rx) = channel_admission(1, 3, &[]);
        let a = now(admission.try_admit(0));
        for i in 1..=3 {
            queued(admission.try_admit(i));
        }
        drop(rx); // the consumer is gone: every dispatch hands the permit back
        drop(a);
        assert_eq!((admission.running(), admission.queued()), (0, 0));
    }
}

mod status {
    use super::*;

    #[test]
    fn overload_status_parse() {
        for (input, expected) in [
            (None, 529),
            (Some(""), 529),
            (Some("   "), 529),
            (Some("abc"), 529),
            (Some("99"), 529),
            (Some("100"), 529),
            (Some("199"), 529),
            (Some("1000"), 529),
            (Some("-503"), 529),
            (Some("+503"), 529),
            (Some("503.0"), 529),
            (Some("99999999999999999999"), 529),
            (Some("200"), 200),
            (Some("503"), 503),
            (Some("529"), 529),
            (Some("600"), 600),
            (Some("999"), 999),
            (Some(" 503 "), 503),
        ] {
            assert_eq!(parse_overload_status(input), expected, "{input:?}");
        }
        assert_eq!(DEFAULT_OVERLOAD_STATUS, 529);
    }

    #[test]
    fn overload_status_code_is_the_parsed_environment() {
        let env = std::env::var(OVERLOAD_STATUS_ENV).ok();
        assert_eq!(overload_status_code(), parse_overload_status(env.as_deref()));
        assert_eq!(overload_status_code(), overload_status_code(), "cached");
    }

    #[test]
    fn only_worker_overloaded_is_retried_elsewhere() {
        assert!(Rejection::WorkerOverloaded.retry_elsewhere());
        assert!(!Rejection::Overloaded.retry_elsewhere());
        assert!(!Rejection::Unavailable.retry_elsewhere());
    }

    #[test]
    fn rejection_statuses_and_bodies() {
        assert_eq!(Rejection::Unavailable.status(), 503);
        assert_eq!(Rejection::Overloaded.status(), overload_status_code());
        assert_eq!(Rejection::WorkerOverloaded.status(), overload_status_code());
        assert_eq!(Rejection::Overloaded.error_type(), "Overloaded");
        assert_eq!(Rejection::Unavailable.error_type(), "Unavailable");
        assert_eq!(Rejection::Overloaded.message(), "All workers are busy, please retry later");
        assert_eq!(Rejection::WorkerOverloaded.to_string(), WORKER_AT_CAPACITY);
        assert_eq!(WORKER_AT_CAPACITY, "Server overloaded: worker at capacity");
    }

    #[test]
    fn route_errors_map_to_rejections() {
        assert_eq!(Rejection::try_from(RouteError::Overloaded), Ok(Rejection::Overloaded));
        assert_eq!(Rejection::try_from(RouteError::Unavailable), Ok(Rejection::Unavailable));
        assert_eq!(Rejection::try_from(RouteError::UnknownModel), Err(RouteError::UnknownModel));
    }
}

/// The environment-reading paths, each run in a child process of this test
/// binary so that setting a variable cannot race other tests' threads.
mod environment {
    use std::process::Command;

    use super::*;

    const CHILD: &str = "LOADGATE_TEST_CHILD";
    const EXPECT: &str = "LOADGATE_TEST_EXPECT";

    /// Runs the ignored test `name` alone in a child process with `vars` set.
    fn child(name: &str, vars: &[(&str, &str)]) {
        let output = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--ignored", "--test-threads=1"])
            .env_remove(QUEUE_LIMIT_ENV)
            .env_remove(OVERLOAD_STATUS_ENV)
            .env(CHILD, "1")
            .envs(vars.iter().copied())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success() && stdout.contains("1 passed"), "child {name} {vars:?}:\n{stdout}");
    }

    /// Runs only as a child: the expected value comes from the environment.
    fn expected() -> Option<String> {
        std::env::var_os(CHILD)?;
        Some(std::env::var(EXPECT).unwrap())
    }

    #[test]
    #[ignore = "runs as a child process of `overload_status_is_read_once_from_the_environment`"]
    fn child_overload_status() {
        let Some(expected) = expected() else { return };
        let expected: u16 = expected.parse().unwrap();
        assert_eq!(overload_status_code(), expected);
        assert_eq!(Rejection::Overloaded.status(), expected);
        assert_eq!(Rejection::WorkerOverloaded.status(), expected);
        // Cached: a later change of the variable is not seen.
        std::env::set_var(OVERLOAD_STATUS_ENV, "777");
        assert_eq!(overload_status_code(), expected);
    }

    #[test]
    fn overload_status_is_read_once_from_the_environment() {
        let name = "environment::child_overload_status";
        child(name, &[(EXPECT, "529")]);
        for (value, expected) in [("503", "503"), ("abc", "529"), ("199", "529"), ("999", "999"), ("", "529")] {
            child(name, &[(OVERLOAD_STATUS_ENV, value), (EXPECT, expected)]);
        }
    }

    #[test]
    #[ignore = "runs as a child process of `queue_limit_is_read_from_the_environment`"]
    fn child_queue_limit() {
        let Some(expected) = expected() else { return };
        let result = queue_limit_from_env().and_then(|q| Admission::<()>::new(2, q));
        match expected.as_str() {
            "invalid" => assert!(matches!(result.unwrap_err(), AdmissionError::InvalidQueueLimit(_))),
            "small" => assert!(matches!(result.unwrap_err(), AdmissionError::QueueLimitTooSmall(_))),
            q => assert_eq!(result.unwrap().queue_limit(), q.parse::<usize>().unwrap()),
        }
    }

    #[test]
    fn queue_limit_is_read_from_the_environment() {
        let name = "environment::child_queue_limit";
        child(name, &[(EXPECT, "16")]);
        for (value, expected) in
            [(" 4 ", "4"), ("2", "2"), ("abc", "invalid"), ("-3", "invalid"), ("1", "small"), ("0", "small")]
        {
            child(name, &[(QUEUE_LIMIT_ENV, value), (EXPECT, expected)]);
        }
    }
}

mod migration {
    use super::*;

    fn pool(n: u64) -> WorkerRouter {
        let ids: Vec<WorkerId> = (1..=n).collect();
        WorkerRouter::new(monitor_with(&ids, 1, decode(0.5)), Policy::RoundRobin)
    }

    #[test]
    fn retries_worker_overloaded_excluding_every_refusing_worker() {
        let router = pool(5);
        let mut tried = Vec::new();
        let result = Migration::new(3).run(
            |ex| router.route("m", ex),
            |w| {
                tried.push(w);
                if tried.len() < 4 {
                    Err(Rejection::WorkerOverloaded)
                } else {
                    Ok(w)
                }
            },
        );
        assert_eq!(tried.len(), 4);
        let mut distinct = tried.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 4, "a refusing worker was tried again: {tried:?}");
        assert_eq!(result, Ok(tried[3]));
    }

    #[test]
    fn stops_at_its_limit() {
        let router = pool(10);
        for limit in [0, 1, 3] {
            let mut sends = 0;
            let result: Result<(), _> = Migration::new(limit).run(
                |ex| router.route("m", ex),
                |_| {
                    sends += 1;
                    Err(Rejection::WorkerOverloaded)
                },
            );
            assert_eq!(result, Err(MigrationError::Exhausted));
            assert_eq!(result.unwrap_err().rejection(), Some(Rejection::WorkerOverloaded));
            assert_eq!(sends, limit + 1, "limit {limit}: the first attempt plus {limit} retries");
        }
    }

    #[test]
    fn runs_out_of_workers_before_the_limit() {
        let router = pool(2);
        let mut sends = 0;
        let result: Result<(), _> = Migration::new(5).run(
            |ex| router.route("m", ex),
            |_| {
                sends += 1;
                Err(Rejection::WorkerOverloaded)
            },
        );
        assert_eq!((result, sends), (Err(MigrationError::Exhausted), 2));
    }

    #[test]
    fn never_retries_overloaded_or_unavailable() {
        let router = pool(5);
        for rejection in [Rejection::Overloaded, Rejection::Unavailable] {
            let mut sends = 0;
            let result: Result<(), _> = Migration::new(3).run(
                |ex| router.route("m", ex),
                |_| {
                    sends += 1;
                    Err(rejection)
                },
            );
            assert_eq!((result, sends), (Err(MigrationError::Rejected(rejection)), 1));
        }
    }

    #[test]
    fn routing_errors_end_the_request_without_a_send() {
        let router = pool(1);
        router.monitor().apply(&report(1, 0, 1, blocks(60, 100))).unwrap();
        let never = |_| -> Result<(), Rejection> { panic!("nothing to send to") };
        let overloaded = Migration::new(3).run(|ex| router.route("m", ex), never);
        assert_eq!(overloaded, Err(MigrationError::Route(RouteError::Overloaded)));
        assert_eq!(overloaded.unwrap_err().rejection(), Some(Rejection::Overloaded));
        router.monitor().add_model("empty");
        let empty = Migration::new(3).run(|ex| router.route("empty", ex), never);
        assert_eq!(empty, Err(MigrationError::Route(RouteError::Unavailable)));
        assert_eq!(empty.unwrap_err().rejection(), Some(Rejection::Unavailable));
        // An unknown model stays a 404-class error, not a 503 (it failed
        // before the fix, on b1708da: Err(Unavailable)).
        let unknown = Migration::new(3).run(|ex| router.route("unknown", ex), never);
        assert_eq!(unknown, Err(MigrationError::Route(RouteError::UnknownModel)));
        assert_eq!(unknown.unwrap_err().rejection(), None);
    }

    #[test]
    fn the_step_api_records_refusals() {
        let router = pool(3);
        let mut m = Migration::new(1);
        let first = router.route("m", m.refusals()).unwrap();
        assert!(m.refused(first), "one retry allowed");
        assert!(m.refused(first), "the same worker twice counts once");
        let second = router.route("m", m.refusals()).unwrap();
        assert_ne!(first, second);
        assert!(!m.refused(second), "limit reached");
        assert_eq!(m.refusals(), [first, second]);
        assert_eq!(DEFAULT_MIGRATION_LIMIT, 3);
    }

    /// Polls a future that never waits (its sends resolve at once).
    fn ready<F: std::future::Future>(future: F) -> F::Output {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match std::pin::pin!(future).poll(&mut cx) {
            std::task::Poll::Ready(output) => output,
            std::task::Poll::Pending => panic!("the sends are ready at once"),
        }
    }

    #[test]
    fn async_migration_works_from_every_routing_handle() {
        let router = pool(3);
        let model = router.model("m").unwrap();
        let mut local = model.local();
        // Workers 1 and 2 refuse at capacity; 3 serves.
        let send = |w: WorkerId| async move {
            if w < 3 {
                Err(Rejection::WorkerOverloaded)
            } else {
                Ok(w)
            }
        };
        assert_eq!(ready(Migration::new(3).run_async(|ex| router.route("m", ex), send)), Ok(3));
        assert_eq!(ready(Migration::new(3).run_async(|ex| model.route(ex), send)), Ok(3));
        assert_eq!(ready(Migration::new(3).run_async(|ex| local.route(ex), send)), Ok(3));
        // Every worker refuses: exhausted, after one attempt each.
        let mut tried = Vec::new();
        let all_refuse = ready(Migration::new(5).run_async(
            |ex| model.route(ex),
            |w| {
                tried.push(w);
                async { Err::<(), _>(Rejection::WorkerOverloaded) }
            },
        ));
        assert_eq!(all_refuse, Err(MigrationError::Exhausted));
        tried.sort_unstable();
        assert_eq!(tried, [1, 2, 3]);
        // The limit ends it early; another rejection ends it at once.
        let limited = ready(Migration::new(1).run_async(|ex| model.route(ex), send));
        assert_eq!(limited, Err(MigrationError::Exhausted));
        let other = ready(
            Migration::new(3).run_async(|ex| model.route(ex), |_| async { Err::<(), _>(Rejection::Unavailable) }),
        );
        assert_eq!(other, Err(MigrationError::Rejected(Rejection::Unavailable)));
    }
}

mod retry {
    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            max_retries: 4,
            base: Duration::from_millis(100),
            cap: Duration::from_secs(1),
            max_retry_after: Duration::from_secs(5),
        }
    }

    #[test]
    fn delay_stays_within_the_jitter_window() {
        let p = policy();
        for attempt in 0..40 {
            let ceiling = Duration::from_millis(100).saturating_mul(1 << attempt.min(20)).min(p.cap);
            for unit in [0.0, 0.25, 0.5, 0.999_999, 1.0] {
                let d = p.delay(attempt, None, unit);
                assert!(d <= ceiling, "attempt {attempt}, unit {unit}: {d:?} > {ceiling:?}");
            }
            assert_eq!(p.delay(attempt, None, 0.0), Duration::ZERO);
            assert_eq!(p.delay(attempt, None, 1.0), ceiling);
        }
        assert_eq!(p.delay(2, None, 0.5), Duration::from_millis(200));
        assert_eq!(p.delay(u32::MAX, None, 1.0), p.cap);
    }

    #[test]
    fn delay_with_an_odd_draw_stays_in_range() {
        let p = policy();
        for unit in [f64::NAN, -1.0, 2.0, f64::INFINITY, f64::NEG_INFINITY] {
            let d = p.delay(3, None, unit);
            assert!(d <= Duration::from_millis(800), "unit {unit}: {d:?}");
        }
    }

    #[test]
    fn an_uncapped_policy_never_panics() {
        let p = RetryPolicy { max_retries: 3, base: Duration::MAX, cap: Duration::MAX, max_retry_after: Duration::MAX };
        for unit in [0.0, 0.5, 0.999_999_999, 1.0] {
            assert!(p.delay(40, None, unit) <= Duration::MAX);
        }
        assert_eq!(p.delay(0, Some(Duration::MAX), 0.0), Duration::MAX);
    }

    #[test]
    fn retry_after_raises_the_delay_up_to_its_cap() {
        let p = policy();
        assert_eq!(p.delay(0, Some(Duration::from_secs(3)), 0.0), Duration::from_secs(3));
        assert_eq!(p.delay(0, Some(Duration::from_secs(120)), 1.0), Duration::from_secs(5), "capped");
        assert_eq!(p.delay(5, Some(Duration::from_millis(10)), 1.0), Duration::from_secs(1), "jitter larger");
    }

    #[test]
    fn no_sleep_after_the_last_attempt_and_the_last_response_returned() {
        let p = policy();
        let mut sleeps = Vec::new();
        let mut sends = 0;
        let last = p.send_with_retry(
            |attempt| {
                sends += 1;
                (529u16, attempt)
            },
            |_| Verdict::Retry { retry_after: Some(Duration::from_secs(2)) },
            |d| sleeps.push(d),
        );
        assert_eq!(sends, 5);
        assert_eq!(sleeps.len(), 4, "no sleep after the final attempt");
        assert!(sleeps.iter().all(|d| *d == Duration::from_secs(2)), "Retry-After honoured: {sleeps:?}");
        assert_eq!(last, (529, 4), "the last response comes back, not an error");
    }

    #[test]
    fn stops_at_the_first_final_answer() {
        let p = policy();
        let mut sleeps = Vec::new();
        let statuses = [529u16, 503, 200, 529];
        let result = p.send_with_retry(
            |attempt| statuses[attempt as usize],
            |s| if is_retryable_status(*s, 529) { Verdict::Retry { retry_after: None } } else { Verdict::Done },
            |d| sleeps.push(d),
        );
        assert_eq!(result, 200);
        assert_eq!(sleeps.len(), 2);
        assert!(sleeps[0] <= Duration::from_millis(100) && sleeps[1] <= Duration::from_millis(200), "{sleeps:?}");
    }

    #[test]
    fn zero_retries_sends_once() {
        let p = RetryPolicy { max_retries: 0, ..policy() };
        let mut sleeps = 0;
        let r = p.send_with_retry(|a| a, |_| Verdict::Retry { retry_after: None }, |_| sleeps += 1);
        assert_eq!((r, sleeps), (0, 0));
    }

    #[test]
    fn retryable_statuses() {
        for s in [429, 503, 529] {
            assert!(is_retryable_status(s, 529));
        }
        assert!(is_retryable_status(600, 600));
        for s in [200, 400, 404, 500, 502] {
            assert!(!is_retryable_status(s, 529), "{s}");
        }
    }

    #[test]
    fn retry_after_parsing() {
        assert_eq!(parse_retry_after("3"), Some(Duration::from_secs(3)));
        assert_eq!(parse_retry_after(" 0 "), Some(Duration::ZERO));
        for bad in ["", " ", "abc", "-1", "1.5", "+2", "Wed, 21 Oct 2015 07:28:00 GMT", "99999999999999999999999"] {
            assert_eq!(parse_retry_after(bad), None, "{bad:?}");
        }
    }
}

// The Prometheus side: only with the `prometheus` feature (on in the root's
// plain `cargo test`, which builds the server crate that enables it).
#[cfg(feature = "prometheus")]
mod metrics {
    use super::*;

    #[test]
    fn frontend_render_has_rejections_and_per_rank_gauges() {
        let monitor = monitor_with(&[7], 2, decode(0.5));
        monitor.apply(&report(7, 1, 1, RankLoad { active_prefill_tokens: 13, ..blocks(42, 100) })).unwrap();
        let metrics = RejectionMetrics::default();
        for _ in 0..3 {
            metrics.record("m", Endpoint::Completions, [Reason::DecodeBlocks]);
        }
        metrics.record("m", Endpoint::ChatCompletions, Reason::from_signals(monitor.model_busy_reasons("m")));
        metrics.record("other", Endpoint::ChatCompletions, [Reason::WorkerCapacity]);
        assert_eq!(metrics.total("m", Endpoint::Completions), 3);
        assert_eq!(metrics.by_reason("m", Reason::DecodeBlocks), 3);
        assert_eq!(metrics.total("never", Endpoint::Completions), 0);

        let text = metrics.render_frontend(&monitor);
        for line in [
            r#"dynamo_frontend_model_rejection_total{model="m",endpoint="completions"} 3"#,
            r#"dynamo_frontend_model_rejection_total{model="m",endpoint="chat_completions"} 1"#,
            r#"dynamo_frontend_model_rejection_total{model="other",endpoint="chat_completions"} 1"#,
            r#"dynamo_frontend_worker_active_decode_blocks{worker_id="7",dp_rank="1"} 42"#,
            r#"dynamo_frontend_worker_active_prefill_tokens{worker_id="7",dp_rank="1"} 13"#,
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        assert!(!text.contains(r#"dp_rank="0""#), "rank 0 never reported: no gauge\n{text}");
    }

    #[test]
    fn reasons_follow_the_signals() {
        let all = BusySignals { decode: true, prefill: true, prefill_frac: true, waiting: false };
        let reasons: Vec<Reason> = Reason::from_signals(all).collect();
        assert_eq!(reasons, [Reason::DecodeBlocks, Reason::PrefillTokens, Reason::PrefillTokensFrac]);
        assert_eq!(Reason::from_signals(BusySignals::default()).count(), 0);
    }

    #[test]
    fn model_names_are_escaped_in_label_values() {
        let monitor = WorkerMonitor::new(MonitorConfig::default()).unwrap();
        let odd = "m\"x\\y\nz";
        monitor.register(3, odd, 1, 0).unwrap();
        let metrics = RejectionMetrics::default();
        metrics.record(odd, Endpoint::Completions, [Reason::WorkerCapacity]);
        let text = metrics.render_frontend(&monitor);
        let escaped = r#"model="m\"x\\y\nz""#;
        for family in [
            "dynamo_frontend_model_rejection_total{",
            "loadgate_frontend_rejection_reason_total{",
            "loadgate_frontend_worker_busy{",
        ] {
            let line = text.lines().find(|l| l.starts_with(family)).unwrap_or_else(|| panic!("no {family} in\n{text}"));
            assert!(line.contains(escaped), "{line}");
        }
        assert_eq!(
            text.lines().count(),
            text.split('\n').filter(|l| !l.is_empty()).count(),
            "no raw newline inside a line"
        );
        let worker = render_worker(odd, WorkerAdmissionStats { rejected: 1, running: 0, queued: 0 });
        assert!(worker.contains(r#"dynamo_rejection_request_total{model="m\"x\\y\nz"} 1"#), "{worker}");
    }

    #[test]
    fn worker_render_has_the_reference_names() {
        let text = render_worker("m", WorkerAdmissionStats { rejected: 5, running: 2, queued: 1 });
        for line in [
            r#"dynamo_rejection_request_total{model="m"} 5"#,
            r#"dynamo_engine_request{model="m"} 2"#,
            r#"dynamo_request_queue{model="m"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
    }
}

mod concurrency {
    use std::sync::Barrier;
    use std::thread;

    use super::*;

    const FLIPS: u64 = if cfg!(miri) { 50 } else { 5_000 };

    #[test]
    fn two_writers_flipping_different_workers_lose_no_change() {
        for round in 0..4u64 {
            let monitor = monitor_with(&[1, 2, 3], 1, decode(0.5));
            let barrier = Arc::new(Barrier::new(3));
            let writers: Vec<_> = [1u64, 2]
                .into_iter()
                .map(|worker| {
                    let (monitor, barrier) = (monitor.clone(), barrier.clone());
                    thread::spawn(move || {
                        barrier.wait();
                        // End busy for one worker and free for the other, alternating by round.
                        let end_busy = (worker + round) % 2 == 0;
                        for seq in 1..=FLIPS {
                            let busy = (seq % 2 == 0) == end_busy;
                            let load = blocks(if busy { 60 } else { 40 }, 100);
                            monitor.apply(&report(worker, 0, seq, load)).unwrap();
                        }
                        end_busy
                    })
                })
                .collect();
            let router = WorkerRouter::new(monitor.clone(), Policy::RoundRobin);
            barrier.wait();
            // Worker 3 is never busy: routing always succeeds and never picks a busy-published worker.
            for _ in 0..FLIPS {
                let w = router.route("m", &[]).unwrap();
                assert!((1..=3).contains(&w));
            }
            let expected: Vec<bool> = writers.into_iter().map(|h| h.join().unwrap()).collect();
            let (ids, set) = monitor.busy_set("m").unwrap();
            assert_eq!(ids, [1, 2, 3]);
            assert_eq!([set.is_busy(0), set.is_busy(1), set.is_busy(2)], [expected[0], expected[1], false]);
            assert_eq!([monitor.is_busy(1), monitor.is_busy(2)], [expected[0], expected[1]]);
            assert_eq!(set.busy_count(), expected.iter().filter(|b| **b).count());
        }
    }

    #[test]
    fn two_writers_on_different_ranks_of_one_worker_lose_no_change() {
        for round in 0..4u64 {
            let monitor = monitor_with(&[1], 2, decode(0.5));
            let barrier = Arc::new(Barrier::new(2));
            let writers: Vec<_> = [0u32, 1]
                .into_iter()
                .map(|rank| {
                    let (monitor, barrier) = (monitor.clone(), barrier.clone());
                    thread::spawn(move || {
                        barrier.wait();
                        let end_busy = (u64::from(rank) + round) % 3 != 0;
                        for seq in 1..=FLIPS {
                            let busy = (seq % 2 == 0) == end_busy;
                            monitor.apply(&report(1, rank, seq, blocks(if busy { 60 } else { 40 }, 100))).unwrap();
                        }
                        end_busy
                    })
                })
                .collect();
            let ends: Vec<bool> = writers.into_iter().map(|h| h.join().unwrap()).collect();
            assert_eq!(monitor.is_busy(1), ends.iter().all(|b| *b), "round {round}: ranks ended {ends:?}");
        }
    }

    #[test]
    fn threshold_changes_racing_reports_end_consistent() {
        for round in 0..4u64 {
            let monitor = monitor_with(&[1, 2], 1, decode(0.5));
            let barrier = Arc::new(Barrier::new(3));
            let reporters: Vec<_> = [1u64, 2]
                .into_iter()
                .map(|worker| {
                    let (monitor, barrier) = (monitor.clone(), barrier.clone());
                    thread::spawn(move || {
                        barrier.wait();
                        for seq in 1..=FLIPS {
                            let used = ((seq * 7 + worker * 13 + round) % 100) as u32;
                            monitor.apply(&report(worker, 0, seq, blocks(used, 100))).unwrap();
                        }
                    })
                })
                .collect();
            let setter = {
                let (monitor, barrier) = (monitor.clone(), barrier.clone());
                thread::spawn(move || {
                    barrier.wait();
                    for i in 0..FLIPS / 10 {
                        let t = match (i + round) % 3 {
                            0 => BusyThresholds::default(),
                            1 => decode(0.3),
                            _ => decode(0.6),
                        };
                        monitor.set_thresholds("m", t).unwrap();
                    }
                })
            };
            for h in reporters {
                h.join().unwrap();
            }
            setter.join().unwrap();
            // After the dust settles the published bits are those of the final inputs.
            let t = monitor.thresholds("m").unwrap();
            for (w, snap) in [1u64, 2].into_iter().zip(monitor.rank_snapshots()) {
                let expected = t.evaluate(&snap.effective().unwrap()).any();
                assert_eq!(monitor.is_busy(w), expected, "round {round}, worker {w}: {snap:?} under {t:?}");
            }
        }
    }

    #[test]
    fn admission_under_contention_never_exceeds_n_and_runs_each_item_once() {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
        use std::sync::mpsc;

        const N: usize = 2;
        const Q: usize = 3;
        const PER_THREAD: usize = if cfg!(miri) { 20 } else { 3_000 };
        const THREADS: usize = 3;
        let running = Arc::new(AtomicUsize::new(0));
        let max_running = Arc::new(AtomicUsize::new(0));
        let ran: Arc<Vec<AtomicBool>> = Arc::new((0..THREADS * PER_THREAD).map(|_| AtomicBool::new(false)).collect());
        let run = {
            let (running, max_running, ran) = (running.clone(), max_running.clone(), ran.clone());
            move |item: usize| {
                let now = running.fetch_add(1, SeqCst) + 1;
                max_running.fetch_max(now, SeqCst);
                assert!(!ran[item].swap(true, SeqCst), "item {item} ran twice");
                running.fetch_sub(1, SeqCst);
            }
        };
        let (tx, rx) = mpsc::channel::<Option<(usize, Permit<usize>)>>();
        let dispatch_tx = std::sync::Mutex::new(tx.clone());
        let admission = Admission::with_dispatch(
            N,
            Q,
            Box::new(move |item, permit| {
                dispatch_tx.lock().unwrap().send(Some((item, permit))).map_err(|e| e.0.unwrap().1)
            }),
        )
        .unwrap();
        let consumer = {
            let run = run.clone();
            thread::spawn(move || {
                while let Some((item, permit)) = rx.recv().unwrap() {
                    run(item);
                    drop(permit);
                }
            })
        };
        let barrier = Arc::new(Barrier::new(THREADS));
        let producers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (admission, barrier, run) = (admission.clone(), barrier.clone(), run.clone());
                thread::spawn(move || {
                    barrier.wait();
                    let (mut admitted, mut refused) = (Vec::new(), 0);
                    for i in 0..PER_THREAD {
                        let item = t * PER_THREAD + i;
                        match admission.try_admit(item) {
                            Ok(Admitted::Now(item, permit)) => {
                                run(item);
                                drop(permit);
                                admitted.push(item);
                            }
                            Ok(Admitted::Queued) => admitted.push(item),
                            Err(Rejected(back)) => {
                                assert_eq!(back, item);
                                refused += 1;
                            }
                        }
                    }
                    (admitted, refused)
                })
            })
            .collect();
        let (mut admitted, mut refused) = (Vec::new(), 0u64);
        for p in producers {
            let (a, r) = p.join().unwrap();
            admitted.extend(a);
            refused += r;
        }
        // Queued items still drain through the consumer.
        for spins in 0u64.. {
            if admission.running() == 0 && admission.queued() == 0 {
                break;
            }
            // A lost wake-up would leave items queued forever: fail instead of hanging.
            assert!(
                spins < 20_000_000,
                "never drained: {} running, {} queued",
                admission.running(),
                admission.queued()
            );
            thread::yield_now();
        }
        tx.send(None).unwrap();
        consumer.join().unwrap();
        assert!(max_running.load(SeqCst) <= N, "{} ran at once", max_running.load(SeqCst));
        assert_eq!(admission.rejected(), refused);
        let admitted: std::collections::HashSet<usize> = admitted.into_iter().collect();
        for (item, ran) in ran.iter().enumerate() {
            assert_eq!(ran.load(SeqCst), admitted.contains(&item), "item {item}");
        }
        assert!(!admitted.is_empty());
    }
}

/// Models come and go with their workers unless they are kept: named by
/// `add_model` (the frontend's `--model`) or given thresholds.
mod forgotten_models {
    use super::*;

    fn plain() -> Arc<WorkerMonitor> {
        Arc::new(WorkerMonitor::new(MonitorConfig::default()).unwrap())
    }

    fn assert_gone(monitor: &WorkerMonitor, model: &str) {
        assert!(!monitor.has_model(model), "{model} is still known");
        assert!(monitor.thresholds(model).is_none());
        assert!(monitor.busy_set(model).is_none());
        assert!(!monitor.models().iter().any(|m| m == model));
        assert!(!monitor.all_thresholds().iter().any(|(m, _)| m == model));
    }

    #[test]
    fn a_model_is_forgotten_when_its_last_worker_leaves() {
        let monitor = plain();
        monitor.register(1, "a", 1, 0).unwrap();
        monitor.register(2, "a", 1, 7).unwrap();
        monitor.register(3, "b", 1, 0).unwrap();
        assert_eq!(monitor.model_count(), 2);
        assert!(monitor.deregister(1));
        assert!(monitor.has_model("a"), "a still has worker 2");
        // deregister_incarnation of another life removes nothing, forgets nothing.
        assert!(!monitor.deregister_incarnation(2, 6));
        assert!(monitor.has_model("a"));
        assert!(monitor.deregister_incarnation(2, 7));
        assert_gone(&monitor, "a");
        assert_eq!(monitor.model_count(), 1);
        let router = WorkerRouter::new(monitor.clone(), Policy::RoundRobin);
        assert_eq!(router.route("a", &[]), Err(RouteError::UnknownModel));
        assert!(monitor.deregister(3));
        assert_eq!(monitor.model_count(), 0);
        assert!(monitor.models().is_empty());
    }

    #[test]
    fn a_model_added_or_given_thresholds_is_kept() {
        let monitor = plain();
        // Added before its worker, and after (add_model of a known model keeps it).
        assert!(monitor.add_model("early"));
        monitor.register(1, "early", 1, 0).unwrap();
        monitor.register(2, "late", 1, 0).unwrap();
        assert!(!monitor.add_model("late"));
        // Given thresholds, whole or by an edit.
        monitor.register(3, "set", 1, 0).unwrap();
        monitor.set_thresholds("set", decode(0.5)).unwrap();
        monitor.register(4, "edited", 1, 0).unwrap();
        monitor.update_thresholds("edited", |t| t.active_prefill_tokens_threshold = Some(10)).unwrap();
        // An edit that fails changes nothing, so it does not keep the model.
        monitor.register(5, "refused", 1, 0).unwrap();
        let invalid = monitor.update_thresholds("refused", |t| t.active_decode_blocks_threshold = Some(2.0));
        assert!(matches!(invalid, Err(SetThresholdsError::Invalid(_))));
        for w in 1..=5 {
            assert!(monitor.deregister(w));
        }
        assert_eq!(monitor.models(), ["early", "edited", "late", "set"]);
        assert_eq!(monitor.thresholds("set").unwrap().decode_ppb(), Some(500_000_000));
        assert_eq!(monitor.thresholds("edited").unwrap().to_config().active_prefill_tokens_threshold, Some(10));
        assert_gone(&monitor, "refused");
        // A kept model without workers routes as unavailable, not unknown.
        let router = WorkerRouter::new(monitor.clone(), Policy::RoundRobin);
        assert_eq!(router.route("early", &[]), Err(RouteError::Unavailable));
        assert_eq!(router.model("set").unwrap().route(&[]), Err(RouteError::Unavailable));
    }

    #[test]
    fn a_restart_into_another_model_forgets_the_old_one() {
        let monitor = plain();
        monitor.register(1, "old", 1, 0).unwrap();
        monitor.register(2, "shared", 1, 0).unwrap();
        monitor.register(3, "shared", 1, 0).unwrap();
        assert_eq!(monitor.register(1, "new", 1, 1), Ok(Registered::Restarted));
        assert_gone(&monitor, "old");
        assert!(monitor.has_model("new"));
        // A model another worker still serves stays.
        assert_eq!(monitor.register(2, "new", 1, 1), Ok(Registered::Restarted));
        assert!(monitor.has_model("shared"));
        assert_eq!(monitor.register(3, "new", 1, 1), Ok(Registered::Restarted));
        assert_gone(&monitor, "shared");
        assert_eq!(monitor.models(), ["new"]);
        // A restart in the same model keeps it.
        assert_eq!(monitor.register(1, "new", 1, 2), Ok(Registered::Restarted));
        assert_eq!(monitor.model_count(), 1);
    }

    #[test]
    fn nothing_of_a_forgotten_model_leaks_into_its_return() {
        let config = MonitorConfig { staleness: None, default_thresholds: decode(0.5), ..Default::default() };
        let monitor = Arc::new(WorkerMonitor::new(config).unwrap());
        monitor.register(1, "m", 1, 0).unwrap();
        monitor.apply(&report(1, 0, 1, blocks(90, 100))).unwrap();
        // Routers that cached the model, and handles made from them, before it goes.
        let router = WorkerRouter::new(monitor.clone(), Policy::RoundRobin);
        let least = WorkerRouter::new(monitor.clone(), Policy::LeastLoaded);
        assert_eq!(router.route("m", &[]), Err(RouteError::Overloaded));
        assert_eq!(least.route_by_cost("m", &[], &|_, _| 0), Err(RouteError::Overloaded));
        let handle = router.model("m").unwrap();
        let mut local = handle.local();
        assert_eq!(local.route(&[]), Err(RouteError::Overloaded));

        assert!(monitor.deregister(1));
        assert_gone(&monitor, "m");
        assert_eq!(local.route(&[]), Err(RouteError::UnknownModel));
        assert_eq!(handle.route(&[]), Err(RouteError::UnknownModel));
        assert_eq!(router.route("m", &[]), Err(RouteError::UnknownModel));
        // Setting thresholds does not bring a forgotten model back.
        assert!(matches!(monitor.set_thresholds("m", decode(0.9)), Err(SetThresholdsError::UnknownModel(_))));

        // The same worker id comes back (another life) in the same model: it
        // starts free, under the default thresholds, and every router and
        // handle made before routes to it.
        assert_eq!(monitor.register(1, "m", 1, 1), Ok(Registered::New));
        monitor.register(2, "m", 1, 0).unwrap();
        assert!(!monitor.is_busy(1));
        assert_eq!(monitor.thresholds("m").unwrap().decode_ppb(), Some(500_000_000));
        let (ids, set) = monitor.busy_set("m").unwrap();
        assert_eq!(ids, [1, 2]);
        assert_eq!(set.busy_count(), 0);
        let mut seen = Vec::new();
        for _ in 0..2 {
            seen.push(router.route("m", &[]).unwrap());
        }
        seen.sort_unstable();
        assert_eq!(seen, [1, 2], "round robin over both, from a fresh rotation");
        assert!(least.route_by_cost("m", &[], &|_, _| 0).is_ok());
        assert!(handle.route(&[2]) == Ok(1));
        assert_eq!(local.route(&[1]), Ok(2));
        assert_eq!(local.route(&[1, 2]), Err(RouteError::Overloaded));
        // Its reports count again, under the new model's thresholds.
        let again = LoadReport { incarnation: 1, ..report(1, 0, 1, blocks(90, 100)) };
        assert_eq!(monitor.apply(&again), Ok(Applied::Flipped));
        assert!(monitor.is_busy(1));
        assert_eq!(local.route(&[]), Ok(2));
    }

    #[test]
    fn thresholds_set_while_the_last_worker_leaves_keep_the_model() {
        // A threshold change that succeeds keeps its model, even when the
        // model's last worker is leaving at the same moment.
        for _ in 0..20 {
            let monitor = plain();
            monitor.register(1, "m", 1, 0).unwrap();
            let setter = {
                let monitor = monitor.clone();
                std::thread::spawn(move || (0..200).any(|_| monitor.set_thresholds("m", decode(0.5)).is_ok()))
            };
            for round in 0..200u64 {
                monitor.deregister(1);
                monitor.register(1, "m", 1, round + 1).unwrap();
            }
            monitor.deregister(1);
            let kept = setter.join().unwrap();
            assert_eq!(monitor.has_model("m"), kept);
            if kept {
                assert_eq!(monitor.thresholds("m").unwrap().decode_ppb(), Some(500_000_000));
            }
        }
    }

    #[test]
    fn a_model_that_keeps_coming_back_routes_every_time() {
        let monitor = plain();
        let router = WorkerRouter::new(monitor.clone(), Policy::RoundRobin);
        let mut local = None;
        for round in 0..50u64 {
            let model = format!("m{}", round % 3);
            monitor.register(round, &model, 1, round).unwrap();
            assert_eq!(router.route(&model, &[]), Ok(round));
            let local = local.get_or_insert_with(|| router.model("m0").unwrap().local());
            if round % 3 == 0 {
                assert_eq!(local.route(&[]), Ok(round));
            }
            assert!(monitor.deregister(round));
            assert_eq!(router.route(&model, &[]), Err(RouteError::UnknownModel));
            assert_eq!(monitor.model_count(), 0);
        }
    }
}
