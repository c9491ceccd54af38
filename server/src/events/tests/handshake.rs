//! The handshake: with a secret, nothing applies before a valid Proof; the
//! worker checks the frontend's Welcome; rotation; timeouts on both sides.

use std::time::{Duration, Instant};

use loadgate::wire::Frame;

use super::*;

const SECRET: &str = "the event secret, 16+ bytes";
const OTHER: &str = "another secret of 16+ bytes";

/// A fake frontend: a listener the test accepts on by hand.
fn fake_frontend() -> (std::net::TcpListener, String) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    (listener, addr)
}

/// The next connection on `listener`, within `timeout`.
fn accept(listener: &std::net::TcpListener, timeout: Duration) -> Option<Peer> {
    listener.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + timeout;
    loop {
        match listener.accept() {
            Ok((stream, _)) => return Some(Peer::accepted(stream)),
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
            Err(_) => return None,
        }
    }
}

#[test]
fn a_publisher_with_the_secret_registers_and_reports() {
    let plane = Plane::start(Some(secrets(SECRET, None)), PlaneLimits::default());
    let publisher = EventPublisher::start(
        vec![plane.addr()],
        registration(1),
        Duration::from_millis(20),
        Some(secrets(SECRET, None)),
    )
    .unwrap();
    publisher.report(0, load(4));
    eventually("an authenticated registration and report", || reported(&plane.monitor, 1, 0) == Some(load(4)));
    drop(publisher);
    eventually("deregistration", || !plane.registered(1));
}

#[test]
fn the_frontend_accepts_the_previous_secret_during_rotation() {
    // The frontend already has the new secret and keeps the old one; the
    // worker still has only the old one.
    let plane = Plane::start(Some(secrets(SECRET, Some(OTHER))), PlaneLimits::default());
    let publisher = EventPublisher::start(
        vec![plane.addr()],
        registration(2),
        Duration::from_millis(20),
        Some(secrets(OTHER, None)),
    )
    .unwrap();
    publisher.report(0, load(1));
    eventually("registration under the previous secret", || reported(&plane.monitor, 2, 0) == Some(load(1)));
    // And a worker that moved to the new secret first, against a frontend
    // that has it as its previous one: the Welcome verifies under either.
    let plane = Plane::start(Some(secrets(OTHER, Some(SECRET))), PlaneLimits::default());
    let publisher = EventPublisher::start(
        vec![plane.addr()],
        registration(3),
        Duration::from_millis(20),
        Some(secrets(SECRET, Some(OTHER))),
    )
    .unwrap();
    publisher.report(0, load(1));
    eventually("registration with both rotated", || reported(&plane.monitor, 3, 0) == Some(load(1)));
}

#[test]
fn no_secret_and_wrong_secret_are_refused() {
    let plane = Plane::start(Some(secrets(SECRET, None)), PlaneLimits::default());
    // No secret: Register straight away (after the Challenge arrives).
    let mut bare = plane.peer();
    assert!(matches!(bare.recv(Duration::from_secs(5)), Some(Frame::Challenge { .. })));
    let _ = bare.send(&register_frame(10, 1));
    assert!(bare.closed_within(Duration::from_secs(5)), "a Register before the Proof closes the connection");
    // A wrong secret: the Proof fails, no Welcome comes.
    let mut wrong = plane.peer();
    let (_, welcome) = wrong.authenticate(&secrets(OTHER, None));
    assert_eq!(welcome, None, "no Welcome for a wrong Proof");
    assert!(wrong.closed_within(Duration::from_secs(5)));
    // A publisher with the wrong secret never registers.
    let publisher = EventPublisher::start(
        vec![plane.addr()],
        registration(11),
        Duration::from_millis(20),
        Some(secrets(OTHER, None)),
    )
    .unwrap();
    // A publisher without one neither.
    let bare_publisher =
        EventPublisher::start(vec![plane.addr()], registration(12), Duration::from_millis(20), None).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(plane.monitor.workers().is_empty() && plane.directory.is_empty());
    drop((publisher, bare_publisher));
}

#[test]
fn frames_before_the_proof_never_apply() {
    let plane = Plane::start(Some(secrets(SECRET, None)), PlaneLimits::default());
    let before = [
        load_frame(20, 1, 1, 5),
        Frame::Deregister { worker: 20, incarnation: 1 },
        Frame::Challenge { nonce: [0; 32] },
        Frame::Welcome { mac: [0; 32] },
    ];
    for frame in &before {
        let mut peer = plane.peer();
        let _ = peer.send(frame);
        assert!(peer.closed_within(Duration::from_secs(5)), "{frame:?} before the Proof");
    }
    // Garbage too.
    let mut peer = plane.peer();
    let _ = std::io::Write::write_all(&mut peer.stream, b"GET / HTTP/1.1\r\n\r\n");
    assert!(peer.closed_within(Duration::from_secs(5)));
    // The frontend still serves an honest worker.
    let mut honest = plane.peer();
    let (_, welcome) = honest.authenticate(&secrets(SECRET, None));
    assert!(matches!(welcome, Some(Frame::Welcome { .. })));
    honest.send(&register_frame(21, 1)).unwrap();
    eventually("the honest registration", || plane.registered(21));
    assert!(!plane.registered(20));
}

#[test]
fn a_replayed_proof_is_refused() {
    let plane = Plane::start(Some(secrets(SECRET, None)), PlaneLimits::default());
    let mut recorded = plane.peer();
    let (proof, welcome) = recorded.authenticate(&secrets(SECRET, None));
    assert!(matches!(welcome, Some(Frame::Welcome { .. })));
    // An eavesdropper replays the Proof (and then a Register) on its own
    // connection: its Challenge differs, so the Proof does not verify.
    let mut replay = plane.peer();
    assert!(matches!(replay.recv(Duration::from_secs(5)), Some(Frame::Challenge { .. })));
    replay.send(&proof).unwrap();
    let _ = replay.send(&register_frame(30, 1));
    assert_eq!(replay.recv(Duration::from_secs(1)), None, "no Welcome for a replay");
    assert!(replay.closed_within(Duration::from_secs(5)));
    assert!(!plane.registered(30));
}

#[test]
fn a_silent_connection_is_closed_after_the_handshake_timeout() {
    let plane = Plane::start(Some(secrets(SECRET, None)), PlaneLimits::default());
    let start = Instant::now();
    let mut silent = plane.peer();
    assert!(silent.closed_within(Duration::from_secs(4)), "closed after the handshake timeout");
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(1900), "closed too early: {took:?}");
}

#[test]
fn the_worker_refuses_a_frontend_whose_welcome_is_wrong() {
    let (listener, addr) = fake_frontend();
    let worker_secrets = secrets(SECRET, None);
    let publisher =
        EventPublisher::start(vec![addr], registration(40), Duration::from_millis(20), Some(worker_secrets.clone()))
            .unwrap();
    publisher.report(0, load(1));
    // A frontend that does not hold the secret: it challenges, then answers
    // the Proof with a made-up Welcome.
    let mut first = accept(&listener, Duration::from_secs(5)).expect("the worker connects");
    let challenge = [7u8; 32];
    first.send(&Frame::Challenge { nonce: challenge }).unwrap();
    let Some(Frame::Proof { nonce, mac }) = first.recv(Duration::from_secs(5)) else { panic!("no Proof") };
    assert!(secrets(SECRET, None).accept_event_proof(&challenge, &nonce, &mac).is_some(), "a valid Proof");
    first.send(&Frame::Welcome { mac: [0; 32] }).unwrap();
    assert_eq!(first.recv(Duration::from_secs(5)), None, "no Register to a frontend without the secret");
    // The worker retries (with its backoff); a frontend with the secret
    // gets the Register.
    let mut second = accept(&listener, Duration::from_secs(5)).expect("the worker retries");
    second.send(&Frame::Challenge { nonce: challenge }).unwrap();
    let Some(Frame::Proof { nonce, mac }) = second.recv(Duration::from_secs(5)) else { panic!("no Proof") };
    let welcome = worker_secrets.accept_event_proof(&challenge, &nonce, &mac).unwrap();
    second.send(&Frame::Welcome { mac: welcome }).unwrap();
    assert!(matches!(second.recv(Duration::from_secs(5)), Some(Frame::Register { worker: 40, .. })));
}

#[test]
fn the_worker_gives_up_on_a_frontend_that_sends_no_challenge() {
    let (listener, addr) = fake_frontend();
    let start = Instant::now();
    let publisher =
        EventPublisher::start(vec![addr], registration(41), Duration::from_millis(20), Some(secrets(SECRET, None)))
            .unwrap();
    let mut silent = accept(&listener, Duration::from_secs(5)).expect("the worker connects");
    // A frontend without a secret waits for a Register: the worker sends
    // none, closes after the handshake timeout, and retries.
    assert_eq!(silent.recv(Duration::from_secs(4)), None, "no frame to a frontend that did not challenge");
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(1900) && took < Duration::from_secs(4), "closed after {took:?}");
    assert!(accept(&listener, Duration::from_secs(3)).is_some(), "the worker retries");
    drop(publisher);
}
