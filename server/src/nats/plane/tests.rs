//! The plane's checks on frames, without NATS.

use super::*;
use bytes::BytesMut;
use loadgate::wire::envelope::seal;
use loadgate::MonitorConfig;

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
    let mut buf = BytesMut::new();
    seal(SECRET, &subject, unix_ms() - ago_ms, frame, &mut buf).unwrap();
    a.apply(&subject, &buf);
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
