//! [`Peers`](super::Peers) with a real monitor.

use super::*;
use loadgate::monitor::SharedLoad;
use loadgate::wire::LineWaiting;
use loadgate::{BusyThresholds, MonitorConfig};

fn monitor(slots: u16) -> Arc<WorkerMonitor> {
    monitor_with(SharedLoad { frontends: slots, staleness: Duration::from_millis(60), ..Default::default() })
}

fn monitor_with(shared: SharedLoad) -> Arc<WorkerMonitor> {
    let config = MonitorConfig {
        default_thresholds: BusyThresholds { active_prefill_tokens_threshold: Some(100), ..Default::default() },
        shared,
        ..Default::default()
    };
    let monitor = Arc::new(WorkerMonitor::new(config).unwrap());
    monitor.register(1, "m", 1, 9).unwrap();
    monitor
}

fn added(frontend: u64, incarnation: u64, seq: u64, tokens: u32) -> Added {
    let load = RankLoad { active_prefill_tokens: tokens, ..Default::default() };
    Added { frontend, incarnation, seq, worker: 1, worker_incarnation: 9, rank: 0, load }
}

/// `in_flight`, and (model key, waiting) lines.
fn holding(in_flight: u32, lines: &[(u64, u32)]) -> Holding {
    let lines: Vec<LineWaiting> = lines.iter().map(|&(model, waiting)| LineWaiting { model, waiting }).collect();
    let waiting = lines.iter().map(|l| l.waiting).sum();
    Holding { in_flight, waiting, lines }
}

const OWN: Identity = Identity { frontend: 1000, incarnation: 1 };

#[test]
fn two_frontends_add_up_and_the_own_frames_add_nothing() {
    let monitor = monitor(2);
    let peers = Peers::new(OWN, monitor.clone(), 2, Duration::from_millis(60));
    assert_eq!(peers.load(added(1000, 1, 1, 500)), Heard::Own);
    assert!(!monitor.is_busy(1), "this frontend's own frame back adds nothing");
    assert_eq!(peers.load(added(1000, 0, 2, 500)), Heard::Dropped, "a previous life's echo");
    assert_eq!(peers.load(added(1, 1, 1, 60)), Heard::Taken);
    assert!(!monitor.is_busy(1));
    assert_eq!(peers.load(added(2, 1, 1, 41)), Heard::Taken);
    assert!(monitor.is_busy(1), "60 + 41 > 100");
    assert_eq!(peers.beat(2, 1, holding(7, &[(5, 3)])), Heard::Changed);
    assert_eq!(peers.beat(2, 1, holding(7, &[(5, 3)])), Heard::Taken, "the same lines");
    let lines = HashMap::from([(5, LineShare { ahead: 3, others: 3 })]);
    assert_eq!(peers.pool(), Pool { frontends: 3, in_flight: 7, waiting: 3, lines });
}

#[test]
fn each_peer_s_applied_frames_are_acknowledged_once_as_a_run_since_its_last_gap() {
    let peers = Peers::new(OWN, monitor(2), 2, Duration::from_secs(60));
    assert!(peers.acks().is_empty());
    peers.load(added(1, 1, 5, 10));
    peers.load(added(1, 1, 6, 20));
    peers.load(added(2, 3, 1, 30));
    let mut acks = peers.acks();
    acks.sort_by_key(|a| a.peer);
    let run = |peer, peer_incarnation, first, seq| Ack { peer, peer_incarnation, first, seq };
    assert_eq!(acks, vec![run(1, 1, 5, 6), run(2, 3, 1, 1)]);
    assert!(peers.acks().is_empty(), "nothing new");
    peers.load(added(1, 1, 6, 20));
    assert!(peers.acks().is_empty(), "a duplicate leaves the run as it was");
    peers.ack_again();
    let mut again = peers.acks();
    again.sort_by_key(|a| a.peer);
    assert_eq!(again, vec![run(1, 1, 5, 6), run(2, 3, 1, 1)], "every run told again (an ack may be lost)");
    peers.load(added(1, 1, 9, 20));
    assert_eq!(peers.acks(), vec![run(1, 1, 9, 9)], "a gap starts a new run");
    peers.load(added(1, 2, 1, 20));
    assert_eq!(peers.acks(), vec![run(1, 2, 1, 1)], "a restart too");
    peers.load(added(1000, 1, 7, 20));
    assert!(peers.acks().is_empty(), "its own frames are not acknowledged");
}

#[test]
fn a_frame_for_a_worker_not_routed_here_ends_the_run_only_once_it_is() {
    let monitor = monitor(2);
    let peers = Peers::new(OWN, monitor.clone(), 2, Duration::from_secs(60));
    let run = |first, seq| vec![Ack { peer: 1, peer_incarnation: 1, first, seq }];
    peers.load(added(1, 1, 1, 10));
    assert_eq!(peers.acks(), run(1, 1));
    let unknown = Added { worker: 77, ..added(1, 1, 2, 10) };
    assert_eq!(peers.load(unknown), Heard::Dropped);
    let other_life = Added { worker_incarnation: 8, ..added(1, 1, 3, 10) };
    assert_eq!(peers.load(other_life), Heard::Dropped);
    assert_eq!(peers.acks(), run(1, 3), "it routes nothing there as theirs: the run goes on");
    peers.registered(78);
    assert!(peers.acks().is_empty(), "a worker no frame went unapplied for");
    peers.registered(77);
    assert_eq!(peers.acks(), run(0, 0), "now it routes there without peer 1's frame 2");
    peers.load(added(1, 1, 4, 10));
    assert_eq!(peers.acks(), run(4, 4), "a new run");
    monitor.register(1, "m", 1, 10).unwrap(); // a restart: its slots dropped
    assert_eq!(peers.acks(), run(0, 0), "a worker's slots dropped here, by any plane");
    peers.load(added(1, 1, 5, 10));
    monitor.register(2, "m", 1, 1).unwrap();
    monitor.deregister(2);
    assert_eq!(peers.acks(), run(0, 0), "a worker forgotten here");
    peers.load(added(1, 1, 5, 10));
    assert!(peers.acks().is_empty(), "a replay starts no run");
}

/// Found in a review: only the NATS plane's registrations told the peers'
/// runs; a worker registered here by another way (`--worker`, `--engine`,
/// the TCP event plane) after a peer's frame for it went unapplied left the
/// run claiming that frame. The monitor's count of registrations is checked
/// at each round of acks.
#[test]
fn a_worker_registered_here_by_any_plane_ends_the_runs_over_its_unapplied_frames() {
    let monitor = monitor(2);
    let peers = Peers::new(OWN, monitor.clone(), 2, Duration::from_secs(60));
    let run = |first, seq| vec![Ack { peer: 1, peer_incarnation: 1, first, seq }];
    let unknown = Added { worker: 77, ..added(1, 1, 1, 10) };
    assert_eq!(peers.load(unknown), Heard::Dropped);
    let other_life = Added { worker_incarnation: 8, ..added(1, 1, 2, 10) };
    assert_eq!(peers.load(other_life), Heard::Dropped);
    assert_eq!(peers.acks(), run(1, 2));
    monitor.register(78, "m", 1, 1).unwrap();
    peers.load(added(1, 1, 3, 10));
    assert_eq!(peers.acks(), run(1, 3), "a worker no frame went unapplied for (nor the other life's)");
    monitor.register(77, "m", 1, 1).unwrap();
    assert_eq!(peers.acks(), run(0, 0), "it routes there now without peer 1's frame 1");
    peers.load(added(1, 1, 4, 10));
    monitor.register(79, "m", 1, 1).unwrap();
    assert_eq!(peers.acks(), run(4, 4), "77 was taken off the list");
}

/// Found in a review: a peer's frame for an older life of a worker, at a
/// rank its life here does not have (a restart with a smaller dp size that
/// the peer had not heard of yet), failed in the monitor with
/// `RankOutOfRange` rather than being another life's: counted as a worker
/// this frontend does not know, its next registration of anything ended
/// every peer's run (each peer then sent everything again).
#[test]
fn a_frame_for_a_rank_of_a_worker_s_older_life_is_another_life_s() {
    let monitor = monitor(2);
    let peers = Peers::new(OWN, monitor.clone(), 2, Duration::from_secs(60));
    let run = |first, seq| vec![Ack { peer: 1, peer_incarnation: 1, first, seq }];
    peers.load(added(1, 1, 1, 10));
    assert_eq!(peers.acks(), run(1, 1));
    let older_life = Added { worker_incarnation: 8, rank: 3, ..added(1, 1, 2, 10) };
    assert_eq!(peers.load(older_life), Heard::Dropped);
    monitor.register(78, "m", 1, 1).unwrap();
    peers.load(added(1, 1, 3, 10));
    assert_eq!(peers.acks(), run(1, 3), "the run goes on: worker 1 is routed here in another life");
}

#[test]
fn a_peer_starting_a_new_run_of_this_frontend_s_frames_has_everything_sent_again() {
    let peers = Peers::new(OWN, monitor(2), 2, Duration::from_secs(60));
    let links = peers.links();
    let ack = |first, seq| [Ack { peer: OWN.frontend, peer_incarnation: OWN.incarnation, first, seq }];
    for seq in 1..=5 {
        links.reference.published((1, 0), 9, seq, RankLoad::default());
    }
    peers.ack(1, 1, &ack(1, 3));
    links.newcomer.store(false, Ordering::Relaxed);
    peers.ack(1, 1, &ack(1, 5));
    assert!(!links.newcomer.load(Ordering::Relaxed), "the run grew");
    peers.ack(1, 1, &ack(0, 0));
    assert!(links.newcomer.load(Ordering::Relaxed), "it holds nothing: everything again");
}

#[test]
fn a_peer_s_ack_of_this_frontend_moves_its_lease_reference() {
    let monitor = monitor_with(SharedLoad { frontends: 2, staleness: Duration::from_secs(60), lease: true });
    let peers = Peers::new(OWN, monitor.clone(), 2, Duration::from_secs(60));
    let ack = |seq| [Ack { peer: OWN.frontend, peer_incarnation: OWN.incarnation, first: 1, seq }];
    assert_eq!(peers.ack(1000, 1, &ack(1)), Heard::Own);
    assert_eq!(peers.ack(1, 1, &ack(1)), Heard::Taken, "a new peer, heard");
    assert_eq!(peers.pool().frontends, 2);
    // Tracking 60 of the 100 tokens, alone with one peer that has
    // applied none of it: 60 unseen × 2 > 100 − 0 (busy for the lease).
    monitor.track(1, 9, 0, 0, 60).unwrap();
    let load = monitor.tracked(1, 0).unwrap().1;
    peers.links().reference.published((1, 0), 9, 2, load);
    assert!(monitor.is_busy(1), "60 unseen of 100 with two frontends");
    let other_life = [Ack { peer: OWN.frontend, peer_incarnation: 0, first: 1, seq: 2 }];
    assert_eq!(peers.ack(1, 1, &other_life), Heard::Taken);
    assert!(monitor.is_busy(1), "an ack of another life of this frontend says nothing");
    assert_eq!(peers.ack(1, 1, &ack(2)), Heard::Taken);
    assert!(!monitor.is_busy(1), "peer 1 applied the 60: none unseen");
}

#[test]
fn the_waiters_ahead_are_those_of_lower_ids() {
    let peers = Peers::new(Identity { frontend: 5, incarnation: 1 }, monitor(2), 2, Duration::from_millis(60));
    assert_eq!(peers.beat(3, 1, holding(0, &[(1, 4), (2, 1)])), Heard::Changed);
    assert_eq!(peers.beat(9, 1, holding(0, &[(1, 6)])), Heard::Changed);
    let lines = HashMap::from([(1, LineShare { ahead: 4, others: 10 }), (2, LineShare { ahead: 1, others: 1 })]);
    assert_eq!(peers.pool(), Pool { frontends: 3, in_flight: 0, waiting: 11, lines }, "per model");
}

#[test]
fn a_replayed_load_keeps_no_silent_peer_alive() {
    // Staleness 60 ms: after 100 ms without a new frame, peer 1 is
    // silent whatever the scheduling, unless the replay renewed it.
    let peers = Peers::new(OWN, monitor(2), 2, Duration::from_millis(60));
    assert_eq!(peers.load(added(1, 1, 1, 10)), Heard::Taken);
    assert_eq!(peers.pool().frontends, 2);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(peers.load(added(1, 1, 1, 10)), Heard::Dropped, "the same seq again");
    assert_eq!(peers.pool().frontends, 1, "a replay says nothing of its sender");
    assert_eq!(peers.load(added(1, 1, 2, 10)), Heard::Taken, "a new seq does");
    assert_eq!(peers.pool().frontends, 2);
}

#[test]
fn a_restart_starts_over_and_an_older_life_is_dropped() {
    let monitor = monitor(1);
    let peers = Peers::new(OWN, monitor.clone(), 1, Duration::from_millis(60));
    assert_eq!(peers.load(added(1, 5, 90, 101)), Heard::Taken);
    assert!(monitor.is_busy(1));
    assert_eq!(peers.load(added(1, 4, 91, 0)), Heard::Dropped, "an older incarnation");
    assert_eq!(peers.load(added(1, 6, 1, 10)), Heard::Taken, "the restart's seq 1 applies");
    assert!(!monitor.is_busy(1));
}

#[test]
fn a_slot_goes_to_a_new_frontend_only_once_its_holder_is_silent() {
    let monitor = monitor(1);
    let peers = Peers::new(OWN, monitor.clone(), 1, Duration::from_millis(60));
    assert_eq!(peers.load(added(1, 1, 1, 101)), Heard::Taken);
    assert_eq!(peers.beat(2, 1, Holding::default()), Heard::Dropped, "the one slot is live");
    assert!(monitor.is_busy(1));
    std::thread::sleep(Duration::from_millis(80));
    assert_eq!(peers.load(added(2, 1, 1, 10)), Heard::Taken, "frontend 1 silent past 60 ms");
    assert!(!monitor.is_busy(1), "frontend 1's load went with its slot");
    assert_eq!(peers.pool().frontends, 2);
}

/// Found by a review: one frame naming a live frontend's id with a newer
/// incarnation (a holder of the secret can seal it) made every genuine
/// frame of that frontend "an older life", dropped for as long as it ran:
/// its load stopped counting everywhere. Frontend ids are random per
/// start, so no genuine frontend comes back under the same id with a newer
/// incarnation: once the newer life is silent past the window, the older
/// one speaking takes the id back.
#[test]
fn a_single_forged_newer_incarnation_does_not_silence_a_live_frontend_for_good() {
    // Frontend 1 (incarnation 1) holds 60 of the 100 tokens on worker 1.
    // One frame names frontend 1 with incarnation u64::MAX; then the
    // forger goes quiet.
    let monitor = monitor(2);
    let peers = Peers::new(OWN, monitor.clone(), 2, Duration::from_millis(60));
    assert_eq!(peers.load(added(1, 1, 1, 60)), Heard::Taken);
    assert_eq!(peers.load(added(2, 1, 1, 41)), Heard::Taken);
    assert!(monitor.is_busy(1), "60 + 41 > 100");
    assert_eq!(peers.beat(1, u64::MAX, Holding::default()), Heard::Taken, "the forged frame");
    // Well past the staleness of the forged life (60 ms): only the
    // genuine frontend 1 speaks, as it always did.
    std::thread::sleep(Duration::from_millis(150));
    for seq in 2..5 {
        peers.beat(1, 1, Holding::default());
        peers.beat(2, 1, Holding::default());
        peers.load(added(1, 1, seq, 60));
        peers.load(added(2, 1, seq, 41));
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(monitor.is_busy(1), "frontend 1's 60 tokens count again (60 + 41 > 100)");
    assert_eq!(peers.pool().frontends, 3, "frontend 1 beats every 10 ms: it is live");
}
