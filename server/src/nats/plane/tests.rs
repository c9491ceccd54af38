//! The plane's checks on frames, without NATS.

use super::*;

use bytes::BytesMut;
use loadgate::wire::envelope::seal;
use loadgate::{MonitorConfig, RankLoad};
use std::time::Instant;

const SECRET: &[u8] = b"the event secret of the tests, 32+";

fn applier() -> Applier {
    let monitor = Arc::new(WorkerMonitor::new(MonitorConfig::default()).unwrap());
    let directory = Arc::new(WorkerDirectory::new(monitor.clone()));
    Applier {
        monitor,
        directory,
        openers: Openers::new(&[SECRET]),
        limits: PlaneLimits::default(),
        subjects: Subjects::new("lg"),
        known: Mutex::default(),
        ended: Mutex::default(),
        replays: Default::default(),
        connected: Arc::new(AtomicBool::new(true)),
        stats: Arc::default(),
        peers: None,
        acks: None,
        ack_ready: tokio::sync::Notify::new(),
        lines_changed: tokio::sync::Notify::new(),
        pool_hint: None,
    }
}

/// `frame` of worker 7 sealed `ago_ms` ago, applied.
fn deliver(a: &Applier, frame: &Frame, ago_ms: u64) {
    let subject = a.subjects.events("m", 7);
    a.apply(&subject, &sealed(&subject, frame, ago_ms));
}

/// `frame` sealed for `subject` `ago_ms` ago.
fn sealed(subject: &str, frame: &Frame, ago_ms: u64) -> BytesMut {
    let mut buf = BytesMut::new();
    seal(SECRET, subject, unix_ms() - ago_ms, frame, &mut buf).unwrap();
    buf
}

/// How long ago worker 7 was last heard.
fn silent_for(a: &Applier) -> Duration {
    a.known.lock().unwrap()[&7].heard.elapsed()
}

/// Worker 7 last heard `ago`.
fn heard_ago(a: &Applier, ago: Duration) {
    a.known.lock().unwrap().get_mut(&7).unwrap().heard = Instant::now() - ago;
}

#[test]
fn a_life_that_left_and_rejoined_is_safe_from_its_old_frames() {
    let a = applier();
    let register =
        Frame::Register { worker: 7, incarnation: 5, dp_size: 1, model: "m".into(), http_addr: "h:1".into() };
    let deregister = Frame::Deregister { worker: 7, incarnation: 5 };
    deliver(&a, &register, 3000);
    assert_eq!(a.monitor.incarnation(7), Some(5));
    deliver(&a, &deregister, 2000);
    assert_eq!(a.monitor.incarnation(7), None, "it left");
    deliver(&a, &register, 3000);
    assert_eq!(a.monitor.incarnation(7), None, "its old Register replayed does not bring it back");
    deliver(&a, &register, 1000);
    assert_eq!(a.monitor.incarnation(7), Some(5), "it rejoins with a new Register");
    deliver(&a, &deregister, 2000);
    assert_eq!(a.monitor.incarnation(7), Some(5), "its old Deregister replayed does not take it out");
    deliver(&a, &register, (CLOCK_WINDOW + Duration::from_secs(1)).as_millis() as u64);
    assert_eq!(a.stats.frames_dropped().1, 3, "two replays and one frame outside the clock window");
}

#[test]
fn a_replayed_register_or_load_keeps_no_crashed_worker_alive() {
    let a = applier();
    let subject = a.subjects.events("m", 7);
    let register =
        Frame::Register { worker: 7, incarnation: 5, dp_size: 1, model: "m".into(), http_addr: "h:1".into() };
    let first = sealed(&subject, &register, 3000);
    let heartbeat = sealed(&subject, &register, 2000);
    let load = Frame::Load { worker: 7, incarnation: 5, rank: 0, seq: 1, load: Default::default() };
    let report = sealed(&subject, &load, 1500);
    for frame in [&first, &heartbeat, &report] {
        a.apply(&subject, frame);
    }
    assert_eq!(a.stats.frames_dropped().1, 0);
    // It crashed 10 s ago; its frames come again, recorded off NATS.
    let crashed = Duration::from_secs(10);
    heard_ago(&a, crashed);
    for frame in [&first, &heartbeat, &report] {
        a.apply(&subject, frame);
    }
    assert!(silent_for(&a) >= crashed, "neither a Register nor a Load replayed is a sign of life");
    assert_eq!(a.stats.frames_dropped().1, 2, "the Registers dropped (the Load is stale for the monitor)");
    // Forgotten after the idle timeout, it is not registered again by them.
    a.sweep(Duration::from_secs(1), Duration::from_secs(2));
    assert_eq!(a.monitor.incarnation(7), None);
    for frame in [&first, &heartbeat] {
        a.apply(&subject, frame);
    }
    assert_eq!(a.monitor.incarnation(7), None, "a replayed Register does not bring it back");
    // Its own next heartbeat does.
    deliver(&a, &register, 100);
    assert_eq!(a.monitor.incarnation(7), Some(5));
}

#[test]
fn a_replayed_beat_or_ack_is_dropped() {
    let monitor = Arc::new(WorkerMonitor::new(MonitorConfig::default()).unwrap());
    let own = Identity { frontend: 1, incarnation: 1 };
    let a = Applier { peers: Some(Peers::new(own, monitor.clone(), 2, Duration::from_secs(60))), monitor, ..applier() };
    let subject = a.subjects.frontend(9);
    let beat = Frame::FrontendBeat { frontend: 9, incarnation: 3, in_flight: 1, waiting: 0, lines: vec![] };
    let ack = Frame::FrontendAck { frontend: 9, incarnation: 3, acks: vec![] };
    let (old_beat, new_beat) = (sealed(&subject, &beat, 900), sealed(&subject, &beat, 300));
    let (old_ack, new_ack) = (sealed(&subject, &ack, 800), sealed(&subject, &ack, 200));
    for frame in [&old_beat, &new_beat, &old_ack, &new_ack] {
        a.apply(&subject, frame);
    }
    assert_eq!(a.stats.frames_dropped().1, 0, "each newer than the last of its kind");
    for frame in [&old_beat, &new_beat, &old_ack, &new_ack] {
        a.apply(&subject, frame);
    }
    assert_eq!(a.stats.frames_dropped().1, 4, "each again: replays");
}

#[test]
fn an_older_lifes_register_does_not_come_back_after_the_newer_one_left() {
    let a = applier();
    let subject = a.subjects.events("m", 7);
    let life = |incarnation| Frame::Register {
        worker: 7,
        incarnation,
        dp_size: 1,
        model: "m".into(),
        http_addr: "h:1".into(),
    };
    let old = sealed(&subject, &life(5), 3000);
    a.apply(&subject, &old);
    // Life 5 crashed: silent, out of routing; then life 6 takes the id.
    heard_ago(&a, Duration::from_secs(5));
    a.sweep(Duration::from_secs(1), Duration::from_secs(60));
    deliver(&a, &life(6), 2000);
    assert_eq!(a.monitor.incarnation(7), Some(6), "a restart");
    deliver(&a, &Frame::Deregister { worker: 7, incarnation: 6 }, 1000);
    assert_eq!(a.monitor.incarnation(7), None, "it left");
    a.apply(&subject, &old);
    assert_eq!(a.monitor.incarnation(7), None, "the older life's Register, replayed, brings back no old address");
}

/// Pins the bound on what one Register may make the monitor allocate (a
/// review's suspicion, refuted): the NATS plane checks `--max-dp-size`
/// (256 by default) before the monitor sees the Register, as the TCP plane
/// does (`events::tests::limits::dp_size_is_bounded`); the monitor's own
/// cap (65,536) is never reached from the wire with the default.
#[test]
fn a_register_over_the_max_dp_size_allocates_nothing() {
    let a = applier();
    let huge =
        Frame::Register { worker: 7, incarnation: 5, dp_size: 65_536, model: "m".into(), http_addr: "h:1".into() };
    deliver(&a, &huge, 1000);
    assert_eq!(a.monitor.incarnation(7), None, "refused by --max-dp-size {}", a.limits.max_dp_size);
    assert!(!a.directory.contains(7));
    let fits = Frame::Register {
        worker: 7,
        incarnation: 6,
        dp_size: a.limits.max_dp_size,
        model: "m".into(),
        http_addr: "h:1".into(),
    };
    deliver(&a, &fits, 500);
    assert_eq!(a.monitor.workers()[0].dp_size, 256);
}

/// Pins where the publisher of a report from the wire comes from (a
/// review's suspicion, refuted): a worker's Load is always the worker's own
/// report, never the router's tracking (`Publisher::Router`), which only
/// the frontend's own dispatches change.
#[test]
fn a_load_off_the_wire_never_lands_in_the_router_s_tracking() {
    let a = applier();
    let register =
        Frame::Register { worker: 7, incarnation: 5, dp_size: 1, model: "m".into(), http_addr: "h:1".into() };
    deliver(&a, &register, 1000);
    let load = RankLoad { active_decode_blocks: 9, kv_total_blocks: 10, ..Default::default() };
    deliver(&a, &Frame::Load { worker: 7, incarnation: 5, rank: 0, seq: 1, load }, 500);
    let rank = a.monitor.rank_snapshots()[0];
    assert_eq!(rank.reported, Some(load));
    assert_eq!(rank.tracked, None, "nothing tracked by the router");
    assert_eq!(a.monitor.tracked(7, 0), Some((5, RankLoad::default())));
}

/// A newer incarnation takes a worker's id only once the registered life
/// is silent: any holder of the secret can name a higher incarnation.
#[test]
fn a_newer_incarnation_waits_for_the_registered_life_to_go_silent() {
    let a = applier();
    let life = |incarnation, http_addr: &str| Frame::Register {
        worker: 7,
        incarnation,
        dp_size: 1,
        model: "m".into(),
        http_addr: http_addr.into(),
    };
    deliver(&a, &life(5, "h:1"), 30);
    deliver(&a, &life(u64::MAX, "impostor:1"), 20);
    assert_eq!(a.monitor.incarnation(7), Some(5), "a life still heard keeps its id");
    assert_eq!(a.directory.get(7).map(|w| w.base_url.to_string()), Some("http://h:1".to_owned()));
    assert_eq!(a.stats.frames_dropped().1, 1, "counted as refused");
    // Silent past the silence window (a crash): the newer life takes over.
    heard_ago(&a, Duration::from_secs(5));
    a.sweep(Duration::from_secs(1), Duration::from_secs(60));
    deliver(&a, &life(6, "h:2"), 10);
    assert_eq!(a.monitor.incarnation(7), Some(6), "a restart after a crash");
}
