//! loom: the monitor's busy-set publication. Concurrent writers never lose a
//! bit change, a reader only sees bitmaps some sequential order of the
//! writes produces, and a threshold change racing a report ends in the state
//! the last values of both give.
#![cfg(loom)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use loadgate::{
    monitor::{Applied, Publisher, Registered},
    BusyThresholds, LoadReport, MonitorConfig, Policy, RankLoad, RouteError, WorkerId, WorkerMonitor, WorkerRouter,
};
use loadgate_loom_tests::{apply_on_two_threads, run_model_with};
use loom::thread;

const MODEL: &str = "m";

fn decode(threshold: f64) -> BusyThresholds {
    BusyThresholds { active_decode_blocks_threshold: Some(threshold), ..Default::default() }
}

/// A worker-published report of `blocks` active of 100.
fn report(worker: WorkerId, seq: u64, blocks: u32) -> LoadReport {
    LoadReport {
        worker,
        incarnation: 0,
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
        monitor.register(id, MODEL, 1, 0).unwrap();
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
/// worker 3 stays busy; the main thread reads the busy set twice. Under loom
/// a chunk of the view holds two instances, so three workers are two chunks
/// (`[1]`, `[2, 3]`: the third registration split `[1, 2, 3]`): the two flips
/// race in different chunks.
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

/// A registration (worker 4, which joins worker 3's chunk and splits it)
/// races a report that makes worker 2 busy: the reader sees the instances
/// before or after the registration, each with the bits some sequential
/// order gives, and the end state has both. Every one of the four states is
/// seen in some execution (the bound holds from both sides).
#[test]
fn a_registration_races_a_flip() {
    static SEEN: AtomicUsize = AtomicUsize::new(0);
    run_model_with("monitor/a_registration_races_a_flip", 3, || {
        let monitor = monitor(0.5, &[(1, 90), (2, 10), (3, 90)]);
        let registering = {
            let monitor = monitor.clone();
            thread::spawn(move || assert_eq!(monitor.register(4, MODEL, 1, 0), Ok(Registered::New)))
        };
        let flipping = {
            let monitor = monitor.clone();
            thread::spawn(move || assert_eq!(monitor.apply(&report(2, 2, 70)), Ok(Applied::Flipped)))
        };
        let (ids, set) = monitor.busy_set(MODEL).expect("model known");
        let bits: Vec<bool> = (0..ids.len()).map(|i| set.is_busy(i)).collect();
        let allowed: [(&[WorkerId], &[bool]); 4] = [
            (&[1, 2, 3], &[true, false, true]),
            (&[1, 2, 3], &[true, true, true]),
            (&[1, 2, 3, 4], &[true, false, true, false]),
            (&[1, 2, 3, 4], &[true, true, true, false]),
        ];
        let state = allowed.iter().position(|a| *a == (&ids[..], &bits[..]));
        let state = state.unwrap_or_else(|| panic!("{ids:?} {bits:?} is not reachable sequentially"));
        // Relaxed: a counter outside the model, read after it.
        SEEN.fetch_or(1 << state, Ordering::Relaxed);
        registering.join().unwrap();
        flipping.join().unwrap();
        assert_eq!(published(&monitor, &[1, 2, 3, 4]), [true, true, true, false], "a flip or a worker was lost");
    });
    // Relaxed: every execution has ended.
    assert_eq!(SEEN.load(Ordering::Relaxed), 0b1111, "some reachable state was never seen");
}

/// Taking worker 2 out of routing races a report that makes it busy: both
/// land (its busy bit and its out-of-routing bit are separate), and routers
/// skip it; bringing it back leaves it busy.
#[test]
fn out_of_routing_races_a_flip_of_the_same_worker() {
    run_model_with("monitor/out_of_routing_races_a_flip_of_the_same_worker", 3, || {
        let monitor = monitor(0.5, &[(1, 10), (2, 10), (3, 90)]);
        let taking_out = {
            let monitor = monitor.clone();
            thread::spawn(move || assert!(monitor.set_out_of_routing(2, true)))
        };
        let flipping = {
            let monitor = monitor.clone();
            thread::spawn(move || assert_eq!(monitor.apply(&report(2, 2, 70)), Ok(Applied::Flipped)))
        };
        let router = WorkerRouter::new(monitor.clone(), Policy::RoundRobin);
        let routed = router.route(MODEL, &[1]);
        assert!(matches!(routed, Ok(2) | Err(RouteError::Overloaded)), "routed {routed:?}");
        taking_out.join().unwrap();
        flipping.join().unwrap();
        assert!(monitor.is_out_of_routing(2) && monitor.is_busy(2), "one of the two changes was lost");
        assert_eq!(router.route(MODEL, &[]), Ok(1));
        assert!(monitor.set_out_of_routing(2, false));
        assert!(monitor.is_busy(2), "bringing it back cleared its busy bit");
        assert_eq!(router.route(MODEL, &[1]), Err(RouteError::Overloaded));
    });
}

/// A restart of worker 3 (a new incarnation: fresh slots, so free) races a
/// report that makes it busy in its old incarnation: the old entry's flip
/// never lands on the new one, so worker 3 ends free.
#[test]
fn a_restart_races_a_flip_of_its_old_incarnation() {
    run_model_with("monitor/a_restart_races_a_flip_of_its_old_incarnation", 3, || {
        let monitor = monitor(0.5, &[(1, 90), (2, 10), (3, 10)]);
        let restarting = {
            let monitor = monitor.clone();
            thread::spawn(move || assert_eq!(monitor.register(3, MODEL, 1, 1), Ok(Registered::Restarted)))
        };
        let flipping = {
            let monitor = monitor.clone();
            thread::spawn(move || {
                let applied = monitor.apply(&report(3, 2, 70)).unwrap();
                assert!(matches!(applied, Applied::Flipped | Applied::Stored | Applied::OtherIncarnation));
            })
        };
        restarting.join().unwrap();
        flipping.join().unwrap();
        assert_eq!(published(&monitor, &[1, 2, 3]), [true, false, false], "the old incarnation's flip landed");
        assert!(!monitor.is_busy(3));
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
        let router = WorkerRouter::new(monitor.clone(), Policy::RoundRobin);
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

/// Two reports race on one worker entry, for its two ranks (dp size 2): rank
/// 0 goes busy -> free and rank 1 free -> busy. The worker is busy only when
/// both ranks are: it starts free, is busy for a moment if rank 1's report
/// lands first, and must end free, published and mirrored alike.
#[test]
fn two_reports_race_on_one_worker_entry() {
    run_model_with("monitor/two_reports_race_on_one_worker_entry", 3, || {
        let (clock, _mock) = quanta::Clock::mock();
        let monitor = WorkerMonitor::with_clock(MonitorConfig::default(), clock).unwrap();
        monitor.register(1, MODEL, 2, 0).unwrap();
        monitor.set_thresholds(MODEL, decode(0.5)).unwrap();
        let rank = |rank, seq, blocks| LoadReport { rank, ..report(1, seq, blocks) };
        monitor.apply(&rank(0, 1, 60)).unwrap();
        monitor.apply(&rank(1, 1, 10)).unwrap();
        let monitor = Arc::new(monitor);
        assert!(!monitor.is_busy(1));
        apply_on_two_threads(&monitor, [rank(0, 2, 10), rank(1, 2, 70)]);
        assert_eq!(published(&monitor, &[1]), [false], "rank 0 is free: the worker must end free");
        assert!(!monitor.workers()[0].busy, "mirror disagrees with the published set");
    });
}

/// The same slot from two threads (reports 2 and 3 of rank 0 after report
/// 1): the worker's published bit always matches the load the slot ends
/// with, which is one report whole (see `rank_slot`).
///
/// Fails on b1708da (loom execution #128): report 2's values under seq 3.
#[test]
fn two_reports_race_on_one_slot() {
    run_model_with("monitor/two_reports_race_on_one_slot", 3, || {
        let monitor = monitor(0.5, &[(1, 10)]);
        let results = apply_on_two_threads(&monitor, [report(1, 2, 60), report(1, 3, 20)]);
        let held = monitor.rank_snapshots()[0].reported.expect("reported").active_decode_blocks;
        let expected = if results[1] == Applied::Contended { 60 } else { 20 };
        assert_eq!(held, expected, "outcomes {results:?}");
        assert_eq!(published(&monitor, &[1]), [held > 50], "published bit disagrees with the load held");
        let again = monitor.apply(&report(1, 3, 0));
        assert_eq!(
            again,
            Ok(if expected == 20 { Applied::Stale } else { Applied::Flipped }),
            "outcomes {results:?} held {held}"
        );
    });
}

/// A report racing expiry at the staleness boundary is never published free
/// while its fresh load says busy. Worker 1 is busy (report 1 at t = 0) and
/// the clock sits exactly at the boundary (still fresh). A re-sends the same
/// busy load (report 2); B moves the clock 1 ns past the boundary and
/// expires. If the slot ends fresh, the worker must end busy.
///
/// Fails on b1708da (loom execution #1 and, with B's whole expiry inside
/// A's apply, #40): a report with unchanged values took a shortcut that
/// skipped the version handshake, so expiry's "free" stood.
#[test]
fn a_report_racing_expiry_is_never_published_free() {
    run_model_with("monitor/a_report_racing_expiry_is_never_published_free", 3, || {
        let (monitor, mock) = stale_monitor();
        mock.increment(STALENESS); // the boundary: now - at == staleness, fresh
        assert!(monitor.rank_snapshots()[0].reported.is_some());
        let reporter = {
            let monitor = monitor.clone();
            thread::spawn(move || monitor.apply(&report(1, 2, 60)).unwrap())
        };
        let expirer = {
            let (monitor, mock) = (monitor.clone(), mock.clone());
            thread::spawn(move || {
                mock.increment(1u64);
                monitor.expire_stale()
            })
        };
        reporter.join().unwrap();
        expirer.join().unwrap();
        if monitor.rank_snapshots()[0].reported.is_some() {
            assert!(monitor.is_busy(1), "a fresh busy report is published free");
            assert!(monitor.workers()[0].busy);
        }
    });
}

/// `expire_stale` returns the bits it flipped, not the workers it looked at
/// twice. Worker 1's only report is stale when expiry starts while A
/// re-sends its busy load. Only A and expiry publish, A flips at most once,
/// so expiry's flips have the parity of (start != end) xor (A flipped).
///
/// Fails on b1708da (loom execution #2): it returned 1 for a bit that went
/// busy -> busy with A storing and not flipping.
#[test]
fn expire_stale_counts_the_bits_it_flipped() {
    run_model_with("monitor/expire_stale_counts_the_bits_it_flipped", 3, || {
        let (monitor, mock) = stale_monitor();
        mock.increment(STALENESS + Duration::from_nanos(1)); // stale from here on
        assert!(monitor.is_busy(1), "not yet expired");
        let reporter = {
            let monitor = monitor.clone();
            thread::spawn(move || monitor.apply(&report(1, 2, 60)).unwrap())
        };
        let flips = monitor.expire_stale();
        let applied = reporter.join().unwrap();
        let end = monitor.is_busy(1);
        let parity = usize::from(!end ^ (applied == Applied::Flipped));
        assert_eq!(flips % 2, parity, "expiry returned {flips}; busy -> {end}, A {applied:?}");
    });
}

const STALENESS: Duration = Duration::from_secs(3);

/// A monitor with a staleness window, worker 1 busy from report 1 at t = 0.
fn stale_monitor() -> (Arc<WorkerMonitor>, Arc<quanta::Mock>) {
    let (clock, mock) = quanta::Clock::mock();
    let config = MonitorConfig { staleness: Some(STALENESS), ..Default::default() };
    let monitor = WorkerMonitor::with_clock(config, clock).unwrap();
    monitor.register(1, MODEL, 1, 0).unwrap();
    monitor.set_thresholds(MODEL, decode(0.5)).unwrap();
    assert_eq!(monitor.apply(&report(1, 1, 60)), Ok(Applied::Flipped));
    (Arc::new(monitor), mock)
}
