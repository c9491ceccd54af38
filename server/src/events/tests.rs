//! The event plane end to end over real sockets: a publisher (or raw
//! frames) on one side, the frontend's listener on the other.

use std::io::Write;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use loadgate::wire::{self, Frame};
use loadgate::{MonitorConfig, RankLoad, WorkerId, WorkerMonitor};

use crate::directory::WorkerDirectory;
use crate::events::listener::EventPlane;
use crate::events::publisher::{EventPublisher, Registration};

/// Polls `check` until it holds (bounded, generous: CI machines are slow).
fn eventually(what: &str, check: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn registration(worker: WorkerId) -> Registration {
    Registration { worker, incarnation: 1, model: "m".into(), dp_size: 2, http_addr: "127.0.0.1:1".into() }
}

fn load(blocks: u32) -> RankLoad {
    RankLoad { active_decode_blocks: blocks, kv_total_blocks: 100, ..Default::default() }
}

fn reported(monitor: &WorkerMonitor, worker: WorkerId, rank: u32) -> Option<RankLoad> {
    monitor.rank_snapshots().into_iter().find(|s| s.worker == worker && s.rank == rank).and_then(|s| s.reported)
}

fn plane(
    listener: std::net::TcpListener,
    config: MonitorConfig,
) -> (Arc<WorkerMonitor>, Arc<WorkerDirectory>, EventPlane) {
    let monitor = Arc::new(WorkerMonitor::new(config).unwrap());
    let directory = Arc::new(WorkerDirectory::default());
    let plane = EventPlane::start(listener, monitor.clone(), directory.clone(), Duration::from_millis(100)).unwrap();
    (monitor, directory, plane)
}

#[test]
fn publisher_registers_reports_latest_and_deregisters_on_drop() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (monitor, directory, plane) = plane(listener, MonitorConfig::default());
    let publisher =
        EventPublisher::start(vec![plane.local_addr().to_string()], registration(5), Duration::from_millis(50))
            .unwrap();
    for blocks in 0..50 {
        publisher.report(1, load(blocks));
    }
    publisher.report(0, load(7));
    publisher.report(9, load(1)); // out of range: ignored
    eventually("the latest load of both ranks", || {
        reported(&monitor, 5, 1) == Some(load(49)) && reported(&monitor, 5, 0) == Some(load(7))
    });
    assert_eq!(directory.get(5).unwrap().base_url.as_ref(), "http://127.0.0.1:1");
    assert_eq!(directory.get(5).unwrap().dp_size, 2);
    drop(publisher); // sends Deregister: no grace period needed
    eventually("deregistration", || monitor.workers().is_empty() && directory.get(5).is_none());
}

#[test]
fn publisher_reconnects_when_the_frontend_comes_up_later() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let publisher =
        EventPublisher::start(vec![format!("127.0.0.1:{port}")], registration(6), Duration::from_millis(20)).unwrap();
    publisher.report(0, load(3));
    std::thread::sleep(Duration::from_millis(100)); // a few refused connects
    let listener = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let (monitor, _directory, _plane) = plane(listener, MonitorConfig::default());
    eventually("registration and the state reported before the connection", || {
        reported(&monitor, 6, 0) == Some(load(3))
    });
}

#[test]
fn heartbeats_keep_a_steady_load_fresh() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let config = MonitorConfig { staleness: Some(Duration::from_millis(300)), ..Default::default() };
    let (monitor, _directory, plane) = plane(listener, config);
    let publisher =
        EventPublisher::start(vec![plane.local_addr().to_string()], registration(8), Duration::from_millis(20))
            .unwrap();
    publisher.report(0, load(1));
    eventually("the first report", || reported(&monitor, 8, 0).is_some());
    // Three staleness windows without a change: heartbeats keep it fresh.
    std::thread::sleep(Duration::from_millis(900));
    assert_eq!(reported(&monitor, 8, 0), Some(load(1)));
}

/// A rolling restart: the new life registers while the old one is still
/// connected; the new one crashes, then the old one leaves. The worker
/// must not stay registered with no connection (found by review).
#[test]
fn each_incarnation_leaves_with_its_own_last_connection() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (monitor, directory, plane) = plane(listener, MonitorConfig::default());
    let frame = |f: Frame| {
        let mut buf = BytesMut::new();
        wire::encode(&f, &mut buf).unwrap();
        buf
    };
    let register = |incarnation| Frame::Register {
        worker: 7,
        incarnation,
        dp_size: 1,
        model: "m".into(),
        http_addr: "127.0.0.1:1".into(),
    };
    let mut old = TcpStream::connect(plane.local_addr()).unwrap();
    old.write_all(&frame(register(1))).unwrap();
    eventually("the old life", || monitor.incarnation(7) == Some(1));
    let mut new = TcpStream::connect(plane.local_addr()).unwrap();
    new.write_all(&frame(register(2))).unwrap();
    eventually("the new life", || monitor.incarnation(7) == Some(2));
    drop(new); // crashes
    old.write_all(&frame(Frame::Deregister { worker: 7, incarnation: 1 })).unwrap();
    eventually("the crashed new life deregistered after its grace", || {
        monitor.workers().is_empty() && directory.get(7).is_none()
    });
}

#[test]
fn closed_connection_deregisters_after_grace_unless_reconnected() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (monitor, _directory, plane) = plane(listener, MonitorConfig::default());
    let mut frame = BytesMut::new();
    let register =
        Frame::Register { worker: 9, incarnation: 1, dp_size: 1, model: "m".into(), http_addr: "127.0.0.1:1".into() };
    wire::encode(&register, &mut frame).unwrap();
    // Reconnect within the grace period: stays registered.
    let mut first = TcpStream::connect(plane.local_addr()).unwrap();
    first.write_all(&frame).unwrap();
    eventually("registration", || monitor.workers().len() == 1);
    drop(first);
    let mut second = TcpStream::connect(plane.local_addr()).unwrap();
    second.write_all(&frame).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(monitor.workers().len(), 1, "reconnected within the grace period");
    // Gone for good: deregistered.
    drop(second);
    eventually("deregistration after the grace period", || monitor.workers().is_empty());
}
