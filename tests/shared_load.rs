//! Several frontends, one fleet: other frontends' published load
//! (`Publisher::Frontend`) is summed with this router's tracking, and the
//! busy decision takes the larger of that sum and the worker's own report
//! (`loadgate::monitor::SharedLoad`).

use std::time::Duration;

use loadgate::monitor::{Applied, ApplyError, MonitorConfig, Publisher, SharedLoad, WorkerMonitor};
use loadgate::{BusyThresholds, LoadReport, RankLoad};

const MODEL: &str = "m";
const W: u64 = 7;

/// A monitor keeping `frontends` other frontends, a prefill threshold of
/// 1,000 tokens, on a mock clock; worker 7 registered (incarnation 1).
fn monitor(frontends: u16) -> (WorkerMonitor, std::sync::Arc<quanta::Mock>) {
    let (clock, mock) = quanta::Clock::mock();
    let config = MonitorConfig {
        default_thresholds: BusyThresholds { active_prefill_tokens_threshold: Some(1000), ..Default::default() },
        shared: SharedLoad { frontends, staleness: Duration::from_millis(600), ..Default::default() },
        ..Default::default()
    };
    let monitor = WorkerMonitor::with_clock(config, clock).unwrap();
    monitor.register(W, MODEL, 1, 1).unwrap();
    (monitor, mock)
}

fn report(publisher: Publisher, seq: u64, prefill: u32) -> LoadReport {
    let load = RankLoad { active_prefill_tokens: prefill, ..Default::default() };
    LoadReport { worker: W, incarnation: 1, rank: 0, publisher, seq, load }
}

#[test]
fn the_sum_of_the_frontends_decides_when_no_one_of_them_is_over() {
    let (monitor, _) = monitor(2);
    monitor.track(W, 1, 0, 0, 400).unwrap();
    monitor.apply(&report(Publisher::Frontend(0), 1, 400)).unwrap();
    assert!(!monitor.is_busy(W), "800 of 1,000: free");
    assert_eq!(monitor.apply(&report(Publisher::Frontend(1), 1, 201)).unwrap(), Applied::Flipped);
    assert!(monitor.is_busy(W), "1,001 > 1,000 though each publisher holds at most 400");
    monitor.apply(&report(Publisher::Frontend(1), 2, 200)).unwrap();
    assert!(!monitor.is_busy(W), "exactly 1,000: free (the threshold is strict)");
    let snapshot = monitor.rank_snapshots()[0];
    assert_eq!(snapshot.shared.map(|l| l.active_prefill_tokens), Some(600));
    assert_eq!(snapshot.effective().map(|l| l.active_prefill_tokens), Some(1000));
}

#[test]
fn the_workers_own_report_is_compared_with_the_sum_not_added_to_it() {
    let (monitor, _) = monitor(1);
    monitor.apply(&report(Publisher::Worker, 1, 700)).unwrap();
    monitor.apply(&report(Publisher::Frontend(0), 1, 300)).unwrap();
    monitor.track(W, 1, 0, 0, 300).unwrap();
    assert!(!monitor.is_busy(W), "max(700, 300 + 300) = 700");
    monitor.apply(&report(Publisher::Worker, 2, 1001)).unwrap();
    assert!(monitor.is_busy(W), "the worker's own 1,001");
}

#[test]
fn a_frontends_publication_stops_counting_after_its_staleness_whatever_the_workers() {
    let (monitor, mock) = monitor(1);
    monitor.apply(&report(Publisher::Worker, 1, 100)).unwrap();
    monitor.apply(&report(Publisher::Frontend(0), 1, 1001)).unwrap();
    assert!(monitor.is_busy(W));
    mock.increment(Duration::from_millis(600));
    assert_eq!(monitor.expire_stale(), 0, "600 ms old still counts");
    mock.increment(Duration::from_millis(1));
    assert_eq!(monitor.expire_stale(), 1, "601 ms old: the frontend stopped counting");
    assert!(!monitor.is_busy(W));
    assert_eq!(monitor.rank_snapshots()[0].shared, None);
    // The worker's own report has no staleness window here: it still counts.
    assert_eq!(monitor.rank_snapshots()[0].reported.map(|l| l.active_prefill_tokens), Some(100));
}

#[test]
fn a_renewal_keeps_a_live_frontends_load_counting_without_republication() {
    let (monitor, mock) = monitor(2);
    monitor.apply(&report(Publisher::Frontend(0), 1, 1001)).unwrap();
    monitor.apply(&report(Publisher::Frontend(1), 1, 500)).unwrap();
    assert!(monitor.is_busy(W));
    // Frontend 0 beats every 400 ms and never publishes again: its load
    // counts on (both sides of the window, from the last renewal).
    for _ in 0..5 {
        mock.increment(Duration::from_millis(400));
        assert_eq!(monitor.renew_publisher(Publisher::Frontend(0)), Ok(0));
        assert_eq!(monitor.expire_stale(), 0);
        assert!(monitor.is_busy(W), "renewed: still 1,001 of frontend 0");
    }
    // Frontend 1's was never renewed: long gone from the sum.
    assert_eq!(monitor.rank_snapshots()[0].shared.map(|l| l.active_prefill_tokens), Some(1001));
    mock.increment(Duration::from_millis(600));
    assert_eq!(monitor.expire_stale(), 0, "600 ms after the last renewal still counts");
    mock.increment(Duration::from_millis(1));
    assert_eq!(monitor.expire_stale(), 1, "601 ms after it: frontend 0 stopped counting");
    assert!(!monitor.is_busy(W));
    // A renewal past the window does not revive what it published (it may
    // be stale after a partition): dropped, until published again.
    assert_eq!(monitor.renew_publisher(Publisher::Frontend(0)), Ok(0));
    assert!(!monitor.is_busy(W));
    assert_eq!(monitor.rank_snapshots()[0].shared, None);
    assert_eq!(monitor.apply(&report(Publisher::Frontend(0), 1, 1001)), Ok(Applied::Flipped), "numbering starts over");
    // Silent past the window while its load still counted (a renewal that
    // is only late, no expiry sweep in between): dropped all the same.
    mock.increment(Duration::from_millis(700));
    assert_eq!(monitor.renew_publisher(Publisher::Frontend(0)), Ok(1));
    assert!(!monitor.is_busy(W));
    let refused = |p| Err(ApplyError::UnknownPublisher(p));
    for publisher in [Publisher::Frontend(2), Publisher::Worker, Publisher::Router, Publisher::Echo] {
        assert_eq!(monitor.renew_publisher(publisher), refused(publisher));
    }
}

/// Found by a review: a frontend never renewed before was never "silent"
/// at its first renewal, so that renewal revived a publication long past
/// the window. Silence is measured from the frontend's last renewal or
/// publication.
#[test]
fn a_first_renewal_after_a_long_silence_does_not_revive_an_old_publication() {
    let (monitor, mock) = monitor(1);
    monitor.apply(&report(Publisher::Frontend(0), 1, 5000)).unwrap();
    assert!(monitor.is_busy(W), "the publication counts while fresh");
    mock.increment(Duration::from_secs(10));
    monitor.expire_stale();
    assert!(!monitor.is_busy(W), "10 s later it no longer counts");
    monitor.renew_publisher(Publisher::Frontend(0)).unwrap();
    monitor.expire_stale();
    assert!(!monitor.is_busy(W), "a renewal after the silence revived a 10 s old publication");
    assert_eq!(monitor.rank_snapshots()[0].shared, None);
}

#[test]
fn a_first_renewal_within_the_window_of_a_publication_keeps_it() {
    let (monitor, mock) = monitor(1);
    monitor.apply(&report(Publisher::Frontend(0), 1, 5000)).unwrap();
    mock.increment(Duration::from_millis(500));
    assert_eq!(monitor.renew_publisher(Publisher::Frontend(0)), Ok(0));
    mock.increment(Duration::from_millis(500));
    assert_eq!(monitor.expire_stale(), 0, "renewed 500 ms ago: counts");
    assert!(monitor.is_busy(W));
}

/// A frontend that publishes again after a silence past the window (no
/// renewal in between) drops what it published before: a renewal after the
/// new publication would otherwise revive figures from before the silence.
#[test]
fn a_publication_after_a_long_silence_drops_the_frontends_older_ones() {
    let (monitor, mock) = monitor(1);
    monitor.register(8, MODEL, 1, 1).unwrap();
    monitor.apply(&report(Publisher::Frontend(0), 1, 5000)).unwrap();
    assert!(monitor.is_busy(W));
    mock.increment(Duration::from_secs(10));
    let other = LoadReport { worker: 8, ..report(Publisher::Frontend(0), 2, 10) };
    assert_eq!(monitor.apply(&other), Ok(Applied::Stored));
    assert_eq!(monitor.renew_publisher(Publisher::Frontend(0)), Ok(0), "heard 0 ms ago: not silent");
    assert!(!monitor.is_busy(W), "the publication from before the silence was revived");
    // Publications within the window of each other keep the older ones.
    mock.increment(Duration::from_millis(300));
    assert_eq!(monitor.apply(&report(Publisher::Frontend(0), 3, 5000)), Ok(Applied::Flipped));
    mock.increment(Duration::from_millis(500));
    assert_eq!(monitor.apply(&LoadReport { seq: 4, ..other }), Ok(Applied::Stored));
    assert!(monitor.is_busy(W), "500 ms apart: the earlier one still counts");
}

/// Found by a review: clearing the router's own tracking left its numbers
/// in the slot, so the next tracked request counted from them (501 of a
/// 500 cleared, then 1 added).
#[test]
fn clearing_the_routers_slot_forgets_its_tracked_load() {
    let (monitor, _) = monitor(0);
    monitor.track(W, 1, 0, 0, 500).unwrap();
    assert_eq!(monitor.tracked(W, 0).unwrap().1.active_prefill_tokens, 500);
    monitor.clear_publisher(Publisher::Router).unwrap();
    assert_eq!(monitor.tracked(W, 0).unwrap().1.active_prefill_tokens, 0, "forgotten");
    monitor.track(W, 1, 0, 0, 1).unwrap();
    assert_eq!(monitor.tracked(W, 0).unwrap().1.active_prefill_tokens, 1, "only what was tracked since the clear");
}

#[test]
fn a_frontend_index_not_kept_is_refused() {
    let (kept_two, _) = monitor(2);
    let refused = Err(ApplyError::UnknownPublisher(Publisher::Frontend(2)));
    assert_eq!(kept_two.apply(&report(Publisher::Frontend(2), 1, 5)), refused);
    assert_eq!(kept_two.clear_publisher(Publisher::Frontend(2)), refused.map(|_| 0));
    let (single, _) = monitor(0);
    assert!(single.apply(&report(Publisher::Frontend(0), 1, 5)).is_err(), "a single frontend keeps none");
    assert_eq!(single.apply(&report(Publisher::Worker, 1, 5)), Ok(Applied::Stored));
}

#[test]
fn clearing_a_frontend_index_frees_its_load_and_restarts_its_numbering() {
    let (monitor, _) = monitor(1);
    monitor.apply(&report(Publisher::Frontend(0), 50, 1001)).unwrap();
    assert!(monitor.is_busy(W));
    assert_eq!(monitor.apply(&report(Publisher::Frontend(0), 3, 0)), Ok(Applied::Stale), "numbered below 50");
    assert_eq!(monitor.clear_publisher(Publisher::Frontend(0)), Ok(1), "cleared: free again");
    assert!(!monitor.is_busy(W));
    assert_eq!(monitor.rank_snapshots()[0].shared, None);
    // The index's next frontend starts its own numbering.
    assert_eq!(monitor.apply(&report(Publisher::Frontend(0), 3, 1001)), Ok(Applied::Flipped));
}

#[test]
fn tracked_capacity_and_shared_numerators_combine_field_by_field() {
    let (clock, _) = quanta::Clock::mock();
    let config = MonitorConfig {
        default_thresholds: BusyThresholds { active_decode_blocks_threshold: Some(0.5), ..Default::default() },
        shared: SharedLoad { frontends: 1, ..Default::default() },
        ..Default::default()
    };
    let monitor = WorkerMonitor::with_clock(config, clock).unwrap();
    monitor.register(W, MODEL, 1, 1).unwrap();
    monitor.set_tracked_capacity(W, 1, 0, 100, 0).unwrap();
    monitor.track(W, 1, 0, 30, 0).unwrap();
    let load = RankLoad { active_decode_blocks: 20, ..Default::default() };
    monitor
        .apply(&LoadReport {
            worker: W,
            incarnation: 1,
            publisher: Publisher::Frontend(0),
            seq: 1,
            load,
            ..Default::default()
        })
        .unwrap();
    assert!(!monitor.is_busy(W), "50 of 100 blocks: not above half");
    let load = RankLoad { active_decode_blocks: 21, ..Default::default() };
    monitor
        .apply(&LoadReport {
            worker: W,
            incarnation: 1,
            publisher: Publisher::Frontend(0),
            seq: 2,
            load,
            ..Default::default()
        })
        .unwrap();
    assert!(monitor.is_busy(W), "51 of the tracked capacity's 100");
}

/// A monitor with the lease, two other frontends kept and live (k = 3).
fn leased() -> WorkerMonitor {
    let (clock, _) = quanta::Clock::mock();
    let config = MonitorConfig {
        default_thresholds: BusyThresholds { active_prefill_tokens_threshold: Some(1000), ..Default::default() },
        shared: SharedLoad { frontends: 2, staleness: Duration::from_secs(60), lease: true },
        ..Default::default()
    };
    let monitor = WorkerMonitor::with_clock(config, clock).unwrap();
    monitor.register(W, MODEL, 1, 1).unwrap();
    assert_eq!(monitor.set_other_frontends(2), 0);
    monitor
}

#[test]
fn a_frontend_takes_at_most_a_kth_of_the_seen_headroom_before_its_echo() {
    let monitor = leased();
    monitor.track(W, 1, 0, 0, 333).unwrap();
    assert!(!monitor.is_busy(W), "333 x 3 = 999 <= 1,000 of headroom: free");
    monitor.track(W, 1, 0, 0, 1).unwrap();
    assert!(monitor.is_busy(W), "334 unseen x 3 > 1,000: busy until the echo");
    assert_eq!(monitor.apply(&report(Publisher::Echo, 1, 334)), Ok(Applied::Flipped), "seen: free again");
    // Seen now: 334 of ours and 300 of another frontend; headroom 366.
    monitor.apply(&report(Publisher::Frontend(0), 1, 300)).unwrap();
    monitor.track(W, 1, 0, 0, 122).unwrap();
    assert!(!monitor.is_busy(W), "122 x 3 = 366: free");
    monitor.track(W, 1, 0, 0, 1).unwrap();
    assert!(monitor.is_busy(W), "123 x 3 > 366");
    assert_eq!(monitor.set_other_frontends(0), 1, "alone: the threshold alone (757 of 1,000)");
    assert_eq!(monitor.set_other_frontends(1), 0, "k = 2: 123 x 2 <= 366, still free");
    assert_eq!(monitor.set_other_frontends(2), 1, "k = 3 again: busy");
}

#[test]
fn the_workers_own_report_shrinks_the_headroom_too() {
    let monitor = leased();
    monitor.apply(&report(Publisher::Worker, 1, 700)).unwrap();
    monitor.track(W, 1, 0, 0, 100).unwrap();
    assert!(!monitor.is_busy(W), "100 x 3 <= 300");
    monitor.track(W, 1, 0, 0, 1).unwrap();
    assert!(monitor.is_busy(W), "101 x 3 > 1,000 - 700");
}

#[test]
fn without_a_lease_or_other_frontends_the_echo_changes_nothing() {
    let (unleased, _) = monitor(1);
    unleased.track(W, 1, 0, 0, 900).unwrap();
    assert!(!unleased.is_busy(W), "no lease: 900 unseen is fine");
    assert_eq!(unleased.apply(&report(Publisher::Echo, 1, 0)), Ok(Applied::Stored));
    let (single, _) = monitor(0);
    assert!(single.apply(&report(Publisher::Echo, 1, 0)).is_err(), "no echo slot without other frontends");
}

#[test]
fn the_count_of_dropped_slots_moves_at_a_restart_or_a_removal_only() {
    let (monitor, _clock) = monitor(2);
    let at_start = monitor.slots_dropped();
    monitor.register(2, "m", 1, 1).unwrap();
    monitor.register(2, "m", 1, 1).unwrap();
    assert_eq!(monitor.slots_dropped(), at_start, "a new worker, and the same life again, drop nothing");
    monitor.register(2, "m", 1, 2).unwrap();
    assert_eq!(monitor.slots_dropped(), at_start + 1, "a restart starts its slots empty");
    assert!(!monitor.deregister_incarnation(2, 1));
    assert_eq!(monitor.slots_dropped(), at_start + 1, "an older life's removal drops nothing");
    assert!(monitor.deregister(2));
    assert!(!monitor.deregister(2));
    assert_eq!(monitor.slots_dropped(), at_start + 2);
}
