//! loom: the monitor's busy-set publication. Concurrent writers never lose a
//! bit change, a reader only sees bitmaps some sequential order of the
//! writes produces, and a threshold change racing a report ends in the state
//! the last values of both give.
#![cfg(loom)]

use std::sync::Arc;

use loadgate::{
    BusyThresholds, LoadReport, MonitorConfig, Policy, Publisher, RankLoad, RouteError, Router, WorkerId, WorkerMonitor,
};
use loadgate_loom_tests::run_model_with;
use loom::thread;

const MODEL: &str = "m";

fn decode(threshold: f64) -> BusyThresholds {
    BusyThresholds { active_decode_blocks_threshold: Some(threshold), ..Default::default() }
}

/// A worker-published report of `blocks` active of 100.
fn report(worker: WorkerId, seq: u64, blocks: u32) -> LoadReport {
    LoadReport {
        worker,
        rank: 0,
        publisher: Publisher::Worker,
        seq,
        load: RankLoad { active_decode_blocks: blocks, kv_total_blocks: 100, ..Default::default() },
    }
}

/// A monitor on a mock clock with `workers` registered (dp size 1), the
/// model's decode threshold at `threshold`, and each worker's first report.
fn monitor(threshold: f64, workers: &[(WorkerId, u32)]) -> Arc<WorkerMonitor> {
    let (clock, _mock) = quanta::Clock::mock();
    let monitor = WorkerMonitor::with_clock(MonitorConfig::default(), clock).unwrap();
    for &(id, _) in workers {
        monitor.register(id, MODEL, 1).unwrap();
    }
    monitor.set_thresholds(MODEL, decode(threshold)).unwrap();
    for &(id, blocks) in workers {
        monitor.apply(&report(id, 1, blocks)).unwrap();
    }
    Arc::new(monitor)
}

/// The published busy bits of the model, by instance position, after
/// checking the set is well formed.
fn published(monitor: &WorkerMonitor, ids: &[WorkerId]) -> Vec<bool> {
    let (instances, set) = monitor.busy_set(MODEL).expect("model known");
    assert_eq!(instances, ids, "instance list changed");
    assert_eq!(set.len(), ids.len());
    let bits: Vec<bool> = (0..ids.len()).map(|i| set.is_busy(i)).collect();
    assert_eq!(set.busy_count(), bits.iter().filter(|b| **b).count(), "busy count disagrees with the bits");
    bits
}

/// Worker 1 goes busy -> free and worker 2 free -> busy on two threads while
/// worker 3 stays busy; the main thread reads the busy set twice.
#[test]
fn two_writers_never_lose_a_flip() {
    run_model_with("monitor/two_writers_never_lose_a_flip", 4, || {
        let ids = [1, 2, 3];
        let monitor = monitor(0.5, &[(1, 60), (2, 10), (3, 90)]);
        assert_eq!(published(&monitor, &ids), [true, false, true]);
        let writers: Vec<_> = [report(1, 2, 20), report(2, 2, 70)]
            .into_iter()
            .map(|r| {
                let monitor = monitor.clone();
                thread::spawn(move || {
                    monitor.apply(&r).unwrap();
                })
            })
            .collect();

        // Every state some sequential order of the two writes passes through.
        const INITIAL: [bool; 3] = [true, false, true];
        const ONLY_1_FREED: [bool; 3] = [false, false, true];
        const ONLY_2_BUSY: [bool; 3] = [true, true, true];
        const BOTH: [bool; 3] = [false, true, true];
        let allowed = [INITIAL, ONLY_1_FREED, ONLY_2_BUSY, BOTH];
        let first = published(&monitor, &ids);
        let second = published(&monitor, &ids);
        for seen in [&first, &second] {
            assert!(allowed.iter().any(|a| a[..] == seen[..]), "bitmap {seen:?} is not reachable sequentially");
        }
        // Each bit changes once: once a read shows a write, later reads do too.
        for bit in 0..2 {
            if first[bit] != INITIAL[bit] {
                assert_eq!(second[bit], first[bit], "bit {bit} went back: {first:?} then {second:?}");
            }
        }

        for w in writers {
            w.join().unwrap();
        }
        assert_eq!(published(&monitor, &ids), BOTH, "a flip was lost");
        assert_eq!([monitor.is_busy(1), monitor.is_busy(2), monitor.is_busy(3)], BOTH);
        let mirrors: Vec<bool> = monitor.workers().iter().map(|w| w.busy).collect();
        assert_eq!(mirrors, BOTH, "per-worker mirror disagrees with the published set");
    });
}

/// A threshold change (0.7 -> 0.5) races a report that frees the worker
/// under either threshold: the end state is free, whichever runs first.
#[test]
fn threshold_change_races_a_report() {
    run_model_with("monitor/threshold_change_races_a_report", 4, || {
        let monitor = monitor(0.7, &[(1, 60)]); // 60 % of 0.7: free
        assert!(!monitor.is_busy(1));
        let setter = {
            let monitor = monitor.clone();
            thread::spawn(move || {
                monitor.set_thresholds(MODEL, decode(0.5)).unwrap(); // 60 % of 0.5: busy
            })
        };
        monitor.apply(&report(1, 2, 40)).unwrap(); // 40 %: free under both
        setter.join().unwrap();
        assert!(!monitor.is_busy(1), "published busy from the old load");
        assert_eq!(published(&monitor, &[1]), [false]);
        assert!(!monitor.workers()[0].busy);
    });
}

/// Clearing the threshold races a report that would make the worker busy:
/// with no threshold nothing is busy, and the router routes to it.
#[test]
fn threshold_clear_races_a_report() {
    run_model_with("monitor/threshold_clear_races_a_report", 4, || {
        let monitor = monitor(0.5, &[(1, 40)]);
        let router = Router::new(monitor.clone(), Policy::RoundRobin);
        let clearer = {
            let monitor = monitor.clone();
            thread::spawn(move || {
                monitor.set_thresholds(MODEL, BusyThresholds::default()).unwrap();
            })
        };
        monitor.apply(&report(1, 2, 60)).unwrap(); // busy while the threshold stands
        let routed = router.route(MODEL, &[]);
        assert!(matches!(routed, Ok(1) | Err(RouteError::Overloaded)), "{routed:?}");
        clearer.join().unwrap();
        assert!(!monitor.is_busy(1), "busy with no threshold configured");
        assert_eq!(published(&monitor, &[1]), [false]);
        assert_eq!(router.route(MODEL, &[]), Ok(1));
    });
}
