//! loom: a reader never pairs a numerator with a denominator from a
//! different report, and router-tracked increments are never lost.
#![cfg(loom)]

use loadgate::{
    monitor::{RankSlot, SlotUpdate},
    MonitorConfig, RankLoad, WorkerMonitor,
};
use loadgate_loom_tests::{run_model, run_model_with};
use loom::sync::Arc;
use loom::thread;

/// Report `k`: every pair is a multiple of `k`, and the two pairs differ, so
/// a torn pair, a pair from two reports or a pair from before any report is
/// recognisable.
fn report(k: u32) -> RankLoad {
    RankLoad {
        active_decode_blocks: k,
        kv_total_blocks: k * 10,
        active_prefill_tokens: k * 100,
        max_num_batched_tokens: k * 1000,
        waiting_requests: k,
    }
}

/// Which report the blocks pair and the tokens pair of `load` come from.
fn reports_of(load: &RankLoad, written: &[u32]) -> (u32, u32) {
    let blocks = load.active_decode_blocks;
    assert!(
        written.contains(&blocks) && load.kv_total_blocks == blocks * 10,
        "blocks pair {}/{} is not one that was written",
        load.active_decode_blocks,
        load.kv_total_blocks
    );
    let tokens = load.active_prefill_tokens / 100;
    assert!(
        written.contains(&tokens)
            && load.active_prefill_tokens == tokens * 100
            && load.max_num_batched_tokens == tokens * 1000,
        "tokens pair {}/{} is not one that was written",
        load.active_prefill_tokens,
        load.max_num_batched_tokens
    );
    (blocks, tokens)
}

/// One writer stores reports 1, 2, 3 in order; a reader loading twice only
/// ever sees written pairs, and never goes back to an older report.
#[test]
fn reader_never_sees_a_torn_pair() {
    run_model_with("rank_slot/reader_never_sees_a_torn_pair", 4, || {
        let slot = Arc::new(RankSlot::new());
        let writer = {
            let slot = slot.clone();
            thread::spawn(move || {
                for k in 1..=3u32 {
                    assert_eq!(slot.store(u64::from(k), &report(k), u64::from(k)), SlotUpdate::Stored);
                }
            })
        };
        let mut last = (0, 0);
        for _ in 0..2 {
            if let Some((load, _at)) = slot.load() {
                let seen = reports_of(&load, &[1, 2, 3]);
                assert!(seen.0 >= last.0 && seen.1 >= last.1, "went back from {last:?} to {seen:?}");
                last = seen;
            }
        }
        writer.join().unwrap();
        let (load, at) = slot.load().expect("reported");
        assert_eq!((load, at), (report(3), 3));
    });
}

/// Two writers race on one slot after report 1 (not the intended use: one
/// publisher per thread), with reports 2 and 3, while a reader loads it: the
/// reader sees only written pairs, and the slot ends holding one report
/// whole under its own seq. Report 3 wins unless it found report 2 being
/// stored (`Contended`); then the slot holds report 2, and a later report 3
/// still applies.
///
/// Fails on b1708da (loom execution #16): both stores went through and left
/// report 2's values under seq 3.
#[test]
fn racing_writers_leave_one_whole_report() {
    run_model_with("rank_slot/racing_writers_leave_one_whole_report", 3, || {
        let slot = Arc::new(RankSlot::new());
        assert_eq!(slot.store(1, &report(1), 1), SlotUpdate::Stored);
        let writers: Vec<_> = [2u32, 3]
            .into_iter()
            .map(|k| {
                let slot = slot.clone();
                thread::spawn(move || slot.store(u64::from(k), &report(k), u64::from(k)))
            })
            .collect();
        if let Some((load, _)) = slot.load() {
            reports_of(&load, &[1, 2, 3]);
        }
        let results: Vec<SlotUpdate> = writers.into_iter().map(|w| w.join().unwrap()).collect();
        let (load, at) = slot.load().expect("reported");
        let winner = match results[..] {
            [_, SlotUpdate::Stored] => 3,
            [SlotUpdate::Stored, SlotUpdate::Contended] => 2,
            _ => panic!("impossible outcomes {results:?}"),
        };
        assert_eq!((load, at), (report(winner), u64::from(winner)), "outcomes {results:?}");
        // The seq the slot keeps is the winner's: report 3 is new only if 2 won.
        let again = slot.store(3, &report(3), 9);
        assert_eq!(again, if winner == 3 { SlotUpdate::Stale } else { SlotUpdate::Stored });
    });
}

/// Router-tracked load: two request threads add to the same rank while a
/// third sets its capacity; no increment and no capacity is lost.
#[test]
fn tracked_increments_are_never_lost() {
    run_model("rank_slot/tracked_increments_are_never_lost", || {
        let (clock, _mock) = quanta::Clock::mock();
        let monitor = Arc::new(WorkerMonitor::with_clock(MonitorConfig::default(), clock).unwrap());
        monitor.register(1, "m", 1, 0).unwrap();
        let adders: Vec<_> = (0..2)
            .map(|_| {
                let monitor = monitor.clone();
                thread::spawn(move || {
                    monitor.track(1, 0, 0, 3, 50).unwrap();
                })
            })
            .collect();
        monitor.set_tracked_capacity(1, 0, 0, 100, 1000).unwrap();
        for a in adders {
            a.join().unwrap();
        }
        let snapshot = monitor.rank_snapshots()[0];
        assert_eq!(
            snapshot.tracked,
            Some(RankLoad {
                active_decode_blocks: 6,
                kv_total_blocks: 100,
                active_prefill_tokens: 100,
                max_num_batched_tokens: 1000,
                waiting_requests: 0,
            })
        );
    });
}
