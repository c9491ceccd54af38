//! The chunked view against a flat reference: random registrations, restarts,
//! departures, reports and threshold changes on a monitor whose chunks hold
//! a few instances, checked after every step.

use std::collections::BTreeMap;

use super::*;
use crate::load::{LoadReport, RankLoad};
use crate::thresholds::{BusySignals, BusyThresholds};
use crate::{Policy, RouteError, WorkerMonitor, WorkerRouter};

const MODEL: &str = "m";

fn decode(blocks: u32) -> RankLoad {
    RankLoad { active_decode_blocks: blocks, kv_total_blocks: 100, ..Default::default() }
}

fn waiting(requests: u32) -> RankLoad {
    RankLoad { waiting_requests: requests, kv_total_blocks: 100, ..Default::default() }
}

fn thresholds(on: bool) -> BusyThresholds {
    match on {
        true => BusyThresholds {
            active_decode_blocks_threshold: Some(0.5),
            active_waiting_requests_threshold: Some(2),
            ..Default::default()
        },
        false => BusyThresholds::default(),
    }
}

/// What the view must show: every instance in id order with its bit (and
/// out of routing).
fn check(view: &ModelView, expected: &BTreeMap<WorkerId, (Option<BusySignals>, bool)>, capacity: usize) {
    let bits: Vec<(WorkerId, bool)> = view.bits().collect();
    let want: Vec<(WorkerId, bool)> = expected.iter().map(|(&id, (s, _))| (id, s.is_some())).collect();
    assert_eq!(bits, want);
    assert_eq!(view.len(), expected.len());
    assert_eq!(view.busy_count(), expected.values().filter(|(s, _)| s.is_some()).count());
    let out = expected.values().filter(|(_, out)| *out).count();
    assert_eq!(view.all_out(), out > 0 && out == expected.len());
    // Round-robin's list: the instances in routing and (filtering) free, in order.
    let eligible: Vec<WorkerId> = (0..view.eligible).map(|k| view.nth_eligible_id(k)).collect();
    let free: Vec<WorkerId> = expected
        .iter()
        .filter(|(_, (busy, out))| !out && (!view.filtering || busy.is_none()))
        .map(|(id, _)| *id)
        .collect();
    assert_eq!(eligible, free);
    let positions: Vec<WorkerId> = (0..view.eligible).map(|k| view.id(view.nth_eligible(k))).collect();
    assert_eq!(positions, free);
    for (position, (id, _)) in want.iter().enumerate() {
        let place = view.find(*id).expect("listed");
        assert_eq!(view.place(position), place);
        assert_eq!(view.entry(position).id, *id);
        assert!(view.find_entry(view.entry(position)).is_some());
    }
    assert_eq!(view.find(WorkerId::MAX), None);
    // Chunks: none empty, none over capacity, no two neighbours that fit in half of one.
    let sizes: Vec<usize> = view.slots.iter().map(|s| s.chunk.len()).collect();
    assert!(sizes.iter().all(|&n| n > 0 && n <= capacity), "{sizes:?}");
    assert!(sizes.windows(2).all(|w| w[0] + w[1] > capacity / 2), "{sizes:?}");
    // Every position is visited once from any start, wrapping.
    if !want.is_empty() {
        let start = want.len() / 2;
        let mut seen = Vec::new();
        view.for_each_from(start, |p, place, chunk| {
            assert_eq!(view.place(p), place);
            seen.push(chunk.id(place.local));
        });
        let order: Vec<WorkerId> = want[start..].iter().chain(&want[..start]).map(|(id, _)| *id).collect();
        assert_eq!(seen, order);
    }
}

#[test]
fn the_chunked_view_always_matches_a_flat_reference() {
    for (seed, capacity) in [(1, 1), (2, 2), (3, 4), (4, 7), (5, 16)] {
        let mut rng = fastrand::Rng::with_seed(seed);
        let monitor = Arc::new(WorkerMonitor::with_chunk_capacity(Default::default(), capacity));
        let router = WorkerRouter::new(monitor.clone(), Policy::RoundRobin);
        monitor.add_model(MODEL);
        let mut on = rng.bool();
        monitor.set_thresholds(MODEL, thresholds(on)).unwrap();
        // id -> (incarnation, signals when busy, out of routing)
        let mut expected: BTreeMap<WorkerId, (u64, Option<BusySignals>, bool)> = BTreeMap::new();
        let mut seq = 0;
        for step in 0..1_500 {
            let id = rng.u64(..40);
            match rng.u8(..10) {
                0..=2 => {
                    let incarnation = expected.get(&id).map_or(0, |(i, _, _)| i + u64::from(rng.bool()));
                    monitor.register(id, MODEL, 1, incarnation).unwrap();
                    // A restart starts afresh: free and in routing.
                    let kept = expected.get(&id).filter(|(i, _, _)| *i == incarnation);
                    let (signals, out) = kept.map_or((None, false), |(_, s, out)| (*s, *out));
                    expected.insert(id, (incarnation, signals, out));
                }
                3 => {
                    monitor.deregister(id);
                    expected.remove(&id);
                }
                4 if rng.bool() => {
                    let out = rng.bool();
                    let Some(state) = expected.get_mut(&id) else { continue };
                    assert_eq!(monitor.set_out_of_routing(id, out), state.2 != out);
                    state.2 = out;
                    assert_eq!(monitor.is_out_of_routing(id), out);
                }
                5 if rng.u8(..5) == 0 => {
                    on = !on;
                    monitor.set_thresholds(MODEL, thresholds(on)).unwrap();
                    // Slots stay, the decision changes: re-derive below from reports.
                    for (id, (_, signals, _)) in expected.iter_mut() {
                        *signals = monitor.is_busy(*id).then(|| monitor.busy_reasons(*id));
                    }
                }
                _ => {
                    let Some(&(incarnation, _, out)) = expected.get(&id) else { continue };
                    seq += 1;
                    let load = match rng.u8(..3) {
                        0 => decode(90),
                        1 => waiting(5),
                        _ => decode(10),
                    };
                    monitor.apply(&LoadReport { worker: id, incarnation, seq, load, ..Default::default() }).unwrap();
                    let fired = thresholds(on).validate().unwrap().evaluate(&load);
                    expected.insert(id, (incarnation, fired.any().then_some(fired), out));
                }
            }
            let view = monitor.model_state(MODEL).unwrap().view().load_full();
            let flat: BTreeMap<WorkerId, (Option<BusySignals>, bool)> =
                expected.iter().map(|(&id, (_, s, out))| (id, (*s, *out))).collect();
            check(&view, &flat, capacity);
            let reasons = flat.values().filter_map(|(s, _)| *s).fold(BusySignals::default(), |all, s| all.union(s));
            assert_eq!(monitor.model_busy_reasons(MODEL), reasons, "step {step}");
            // The router's verdict when nothing is eligible.
            if view.eligible == 0 && !view.is_empty() {
                let routed = router.route(MODEL, &[]);
                let all_out = flat.values().all(|(_, out)| *out);
                assert_eq!(routed, Err(if all_out { RouteError::Unavailable } else { RouteError::Overloaded }));
            }
        }
    }
}

/// Full chunks of the real capacity split as members join (a chunk briefly
/// holds one more than its capacity) and merge as they leave.
#[test]
fn full_chunks_split_and_merge_at_the_real_capacity() {
    let monitor = Arc::new(WorkerMonitor::with_chunk_capacity(Default::default(), CHUNK_MAX));
    monitor.add_model(MODEL);
    monitor.set_thresholds(MODEL, thresholds(true)).unwrap();
    let n = 2 * CHUNK_MAX as WorkerId + 5;
    // Every other id first, then the gaps: inserts land inside full chunks.
    let order = (0..n).filter(|id| id % 2 == 0).chain((0..n).filter(|id| id % 2 == 1));
    for id in order {
        monitor.register(id, MODEL, 1, 0).unwrap();
        if id % 3 == 0 {
            monitor
                .apply(&LoadReport { worker: id, incarnation: 0, seq: 1, load: decode(90), ..Default::default() })
                .unwrap();
        }
    }
    let signals = |id: WorkerId| (id % 3 == 0).then_some(BusySignals { decode: true, ..Default::default() });
    let mut expected: BTreeMap<WorkerId, (Option<BusySignals>, bool)> =
        (0..n).map(|id| (id, (signals(id), false))).collect();
    check(&monitor.model_state(MODEL).unwrap().view().load_full(), &expected, CHUNK_MAX);
    for id in (0..n).filter(|id| id % 4 != 1) {
        monitor.deregister(id);
        expected.remove(&id);
    }
    check(&monitor.model_state(MODEL).unwrap().view().load_full(), &expected, CHUNK_MAX);
}
