//! Time bounds: a silent established connection is closed (its id freed),
//! a connection must authenticate or register within the handshake
//! timeout, and unauthenticated connections cannot keep a worker out.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::*;

const SECRET: &str = "the event secret, 16+ bytes";
const IDLE: Duration = Duration::from_millis(300);

fn idle_limits() -> PlaneLimits {
    PlaneLimits { event_idle_timeout: IDLE, ..Default::default() }
}

#[test]
fn a_silent_registered_connection_is_closed_and_its_id_can_register_again() {
    let plane = Plane::start(None, idle_limits());
    let started = Instant::now();
    let mut silent = plane.peer();
    silent.send(&register_frame(7, 1)).unwrap();
    eventually("registration", || plane.registered(7));
    // Held while the connection is open (and not yet silent for too long).
    let mut early = plane.peer();
    early.send(&register_frame(7, 2)).unwrap();
    assert!(early.closed_within(Duration::from_secs(1)), "a live holder's id was taken");
    assert_eq!(plane.monitor.incarnation(7), Some(1));
    // Silent (but open) past the idle timeout: closed by the frontend.
    assert!(silent.closed_within(Duration::from_secs(3)), "a silent connection was kept open");
    let took = started.elapsed();
    assert!(took >= IDLE, "closed before the idle timeout: {took:?}");
    // The restarted worker with the same id registers on a new connection.
    let mut restarted = plane.peer();
    restarted.send(&register_frame(7, 2)).unwrap();
    eventually("the new incarnation", || plane.monitor.incarnation(7) == Some(2));
    assert!(!restarted.closed_within(Duration::from_millis(50)));
}

#[test]
fn a_silent_worker_leaves_routing_and_rejoins_with_its_next_frame() {
    let silence = Duration::from_millis(150);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let plane = Plane::silent_after(listener, MonitorConfig::default(), None, idle_limits(), silence);
    let mut peer = plane.peer();
    peer.send(&register_frame(11, 1)).unwrap();
    eventually("registration", || plane.registered(11));
    assert!(plane.directory.out_of_routing().is_empty());
    let quiet = Instant::now();
    eventually("out of routing", || plane.directory.out_of_routing() == [11]);
    let took = quiet.elapsed();
    assert!(took >= silence - Duration::from_millis(20) && took < IDLE, "left routing after {took:?}");
    assert!(plane.registered(11), "still registered: only out of routing");
    peer.send(&load_frame(11, 1, 1, 1)).unwrap();
    eventually("back in routing", || plane.directory.out_of_routing().is_empty());
    // Closed (the peer goes away): out of routing at once, during the grace.
    drop(peer);
    eventually("out of routing on close", || plane.directory.out_of_routing() == [11]);
    // The monitor forgets the worker before the directory does (so the
    // router never picks a worker without an address): wait for both.
    eventually("deregistered after the grace, leaving no flag", || {
        !plane.registered(11) && plane.directory.out_of_routing().is_empty()
    });
}

#[test]
fn a_connection_that_keeps_sending_stays_open() {
    let plane = Plane::start(None, idle_limits());
    let mut peer = plane.peer();
    peer.send(&register_frame(8, 1)).unwrap();
    eventually("registration", || plane.registered(8));
    // Heartbeats every 60 ms for over three idle timeouts.
    let until = Instant::now() + IDLE * 3 + Duration::from_millis(100);
    let mut seq = 0;
    while Instant::now() < until {
        seq += 1;
        peer.send(&load_frame(8, 1, seq, 1)).unwrap();
        std::thread::sleep(Duration::from_millis(60));
    }
    assert!(!peer.closed_within(Duration::from_millis(20)), "a connection that kept sending was closed");
    assert_eq!(reported(&plane.monitor, 8, 0), Some(load(1)));
}

#[test]
fn a_publisher_that_never_reports_is_not_timed_out() {
    // No rank ever reports: the heartbeat is the Registration itself.
    let plane = Plane::start(None, idle_limits());
    let publisher =
        EventPublisher::start(vec![plane.addr()], registration(9), Duration::from_millis(50), None).unwrap();
    eventually("registration", || plane.registered(9));
    let mut peer = plane.peer();
    let until = Instant::now() + IDLE * 4;
    while Instant::now() < until {
        assert!(plane.registered(9), "the quiet publisher's worker was deregistered");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Its id is still held by its live connection (never timed out).
    peer.send(&register_frame(9, 5)).unwrap();
    assert!(peer.closed_within(Duration::from_secs(1)), "the quiet publisher's id was free");
    drop(publisher);
}

#[test]
fn without_a_secret_a_connection_must_register_within_the_handshake_timeout() {
    let plane = Plane::start(None, PlaneLimits::default());
    let started = Instant::now();
    let mut silent = plane.peer();
    assert!(silent.closed_within(Duration::from_secs(4)), "an unregistered connection was kept open");
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(1900), "closed too early: {took:?}");
}

#[test]
fn unauthenticated_connections_cannot_keep_a_worker_out() {
    let limits = PlaneLimits { max_pending_handshakes: 8, max_event_connections: 32, ..Default::default() };
    let plane = Plane::start(Some(secrets(SECRET, None)), limits);
    let addr = plane.addr();
    // The attacker holds far more idle connections than the cap and keeps
    // opening new ones for the whole test.
    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicUsize::new(0));
    let attacker = {
        let (stop, opened, addr) = (stop.clone(), opened.clone(), addr.clone());
        std::thread::spawn(move || {
            let mut held = VecDeque::new();
            let deadline = Instant::now() + Duration::from_secs(20);
            // Acquire: pairs with the Release store below.
            while !stop.load(Ordering::Acquire) && Instant::now() < deadline {
                if let Ok(stream) = TcpStream::connect(&addr) {
                    held.push_back(stream);
                    // Relaxed: a counter read after the fact.
                    opened.fetch_add(1, Ordering::Relaxed);
                }
                if held.len() > 64 {
                    held.pop_front();
                }
                // Up to 4000 connections a second: 500 times the cap per
                // second, yet a pace the test's other threads keep up with
                // when the machine's two cores are busy with other tests
                // (unpaced, this thread alone could starve the plane's).
                std::thread::sleep(Duration::from_micros(250));
            }
        })
    };
    eventually("the attacker's first connections", || opened.load(Ordering::Relaxed) >= 100);
    let started = Instant::now();
    let publisher = EventPublisher::start(
        vec![addr.clone()],
        registration(11),
        Duration::from_millis(20),
        Some(secrets(SECRET, None)),
    )
    .unwrap();
    publisher.report(0, load(3));
    eventually("the worker's registration under the connection flood", || {
        reported(&plane.monitor, 11, 0) == Some(load(3))
    });
    let took = started.elapsed();
    // Also a raw client doing the handshake by hand. Like a worker it tries
    // again when it was evicted before its Proof arrived (which happens when
    // the machine's cores are busy with other tests), a bounded number of times.
    let mut attempts = 0;
    let mut raw = loop {
        attempts += 1;
        let mut raw = plane.peer();
        let welcome = match raw.recv(Duration::from_secs(5)) {
            Some(Frame::Challenge { nonce: challenge }) => {
                let nonce: [u8; 32] = std::array::from_fn(|_| fastrand::u8(..));
                let mac = secrets(SECRET, None).event_proof(&challenge, &nonce);
                raw.send(&Frame::Proof { nonce, mac }).ok().and_then(|()| raw.recv(Duration::from_secs(5)))
            }
            other => other,
        };
        if matches!(welcome, Some(Frame::Welcome { .. })) {
            break raw;
        }
        assert!(attempts < 20, "no Welcome under the flood in {attempts} attempts: {welcome:?}");
    };
    eprintln!("the raw client was welcomed at attempt {attempts}");
    raw.send(&register_frame(12, 1)).unwrap();
    eventually("the raw client's registration", || plane.registered(12));
    // Release: the attacker's Acquire load sees it.
    stop.store(true, Ordering::Release);
    attacker.join().unwrap();
    let opened = opened.load(Ordering::Relaxed);
    eprintln!("registered {took:?} after the flood began; the attacker opened {opened} connections");
    assert!(took < Duration::from_secs(5), "the worker took {took:?} to register");
    drop(publisher);
}

/// A library caller's heartbeat past the clock's range (no flag takes
/// one: they stop at a day) is held at a day: the publisher's thread
/// computed its next deadline as `last + heartbeat` and panicked, so the
/// worker never registered.
#[test]
fn a_heartbeat_past_the_clock_s_range_is_held_at_a_day() {
    let plane = Plane::start(None, PlaneLimits::default());
    let publisher = EventPublisher::start(vec![plane.addr()], registration(12), Duration::MAX, None).unwrap();
    eventually("the registration", || plane.registered(12));
    publisher.report(0, load(3));
    eventually("a report", || reported(&plane.monitor, 12, 0) == Some(load(3)));
}
