//! Impersonation: a Register without the secret, with the wrong one, a
//! replayed handshake, handshake frames after the handshake, an
//! unauthenticated event listener, a fake frontend, and secret rotation.

use std::time::{Duration, Instant};

use bytes::BytesMut;
use loadgate::wire::{self, Frame};

use crate::common::{
    self, register, shared, worker, EventConn, FakeWorker, Frontend, GRACE, SECRET, STARTUP, WRONG_SECRET,
};
use crate::{pool, serve_many, wait_models, CLOSE_WITHIN, MAX_RSS_MIB, MODEL};

/// Found 1: an unauthenticated Register joined the pool and received a third
/// of the prompts. Now it is refused: the connection is closed, the
/// impostor's address gets nothing, its model is not listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_without_the_secret_is_refused() {
    let _box = shared().await;
    let (fe, _w) = pool(&[], &[]).await;
    let impostor = FakeWorker::start();
    let addr = impostor.addr.to_string();
    // Straight to Register, ignoring the Challenge.
    let mut same_model = EventConn::connect(fe.events).unwrap();
    let _ = same_model.send(&register(9001, 1, 1, MODEL, &addr));
    let mut own_model = EventConn::connect(fe.events).unwrap();
    let _ = own_model.send(&register(9002, 1, 1, "impostor-model", &addr));
    // Garbage instead of a Proof.
    let mut garbage = EventConn::connect(fe.events).unwrap();
    let _ = garbage.send_raw(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n");
    tokio::time::sleep(Duration::from_millis(100)).await;

    let served = serve_many(&fe, MODEL, 30).await;
    assert_eq!(impostor.requests(), 0, "the impostor received {} requests: {served:?}", impostor.requests());
    assert_eq!((served.ok, served.by_impostor), (30, 0), "{served:?}");
    let (models, _) = fe.models().await;
    assert_eq!(models, vec![MODEL.to_owned()], "an unauthenticated Register added a model");
    assert_eq!(fe.workers().await, Some(1));
    assert!(same_model.closed_within(CLOSE_WITHIN), "Register without a Proof: connection left open");
    assert!(own_model.closed_within(CLOSE_WITHIN), "Register without a Proof: connection left open");
    assert!(garbage.closed_within(CLOSE_WITHIN), "garbage instead of a Proof: connection left open");
    assert!(fe.proc.wait_log("event connection refused", Duration::from_secs(1)), "no refusal logged");
    fe.assert_still_serving(MODEL, MAX_RSS_MIB).await;
}

/// A Proof made with the wrong secret: no Welcome, connection closed, and a
/// Register sent after it is not applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_secret_is_refused() {
    let _box = shared().await;
    let (fe, _w) = pool(&[], &[]).await;
    let impostor = FakeWorker::start();
    let mut conn = EventConn::connect(fe.events).unwrap();
    let handshake = conn.handshake(WRONG_SECRET);
    let _ = conn.send(&register(9101, 1, 1, MODEL, &impostor.addr.to_string()));
    tokio::time::sleep(Duration::from_millis(100)).await;

    let served = serve_many(&fe, MODEL, 20).await;
    assert_eq!(impostor.requests(), 0, "the impostor received requests: {served:?}");
    assert_eq!(served.ok, 20, "{served:?}");
    assert!(handshake.is_err(), "a Proof under the wrong secret was welcomed");
    assert!(conn.closed_within(CLOSE_WITHIN), "wrong secret: connection left open");
    assert_eq!(fe.workers().await, Some(1));
    fe.assert_still_serving(MODEL, MAX_RSS_MIB).await;
}

/// A valid Proof captured on one connection, replayed on another: the
/// second connection's Challenge differs, so the replay fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_handshake_is_refused() {
    let _box = shared().await;
    let (fe, _w) = pool(&[], &[]).await;
    let impostor = FakeWorker::start();
    let mut first = EventConn::connect(fe.events).unwrap();
    let captured = first.handshake(SECRET).expect("the honest handshake");
    let mut replay = EventConn::connect(fe.events).unwrap();
    let wait = if common::legacy() { Duration::from_millis(200) } else { Duration::from_secs(3) };
    let challenge = replay.read_challenge(wait).expect("read the second challenge");
    if let Some(nonce) = challenge {
        assert_ne!(Some(nonce), first.frontend_nonce, "two connections got the same challenge");
    }
    let _ = replay.send_raw(&captured.proof_frame);
    let _ = replay.send(&register(9201, 1, 1, "replayed-model", &impostor.addr.to_string()));
    let _ = replay.send(&register(9202, 1, 1, MODEL, &impostor.addr.to_string()));
    tokio::time::sleep(Duration::from_millis(100)).await;

    let served = serve_many(&fe, MODEL, 20).await;
    assert_eq!(impostor.requests(), 0, "the replaying impostor received requests: {served:?}");
    let (models, _) = fe.models().await;
    assert!(!models.contains(&"replayed-model".to_owned()), "a replayed handshake registered: {models:?}");
    assert!(replay.closed_within(CLOSE_WITHIN), "replayed Proof: connection left open");
    drop(first);
    fe.assert_still_serving(MODEL, MAX_RSS_MIB).await;
}

/// Handshake frames after the handshake (a second Proof, a Challenge or a
/// Welcome from the worker side) close the connection; the registration it
/// made is not kept past the grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshake_frames_after_the_handshake_are_refused() {
    let _box = shared().await;
    let (fe, _w) = pool(&[], &[]).await;
    let impostor = FakeWorker::start();
    let frames = [
        Frame::Proof { nonce: [1; wire::NONCE_LEN], mac: [2; wire::TAG_LEN] },
        Frame::Challenge { nonce: [3; wire::NONCE_LEN] },
        Frame::Welcome { mac: [4; wire::TAG_LEN] },
    ];
    for (i, frame) in frames.iter().enumerate() {
        let mut conn = EventConn::authenticated(fe.events, SECRET);
        let _ = conn.send(&register(9300 + i as u64, 1, 1, "late-model", &impostor.addr.to_string()));
        let _ = conn.send(frame);
        assert!(conn.closed_within(CLOSE_WITHIN), "a {} after the handshake: connection left open", frame.kind_name());
    }
    wait_models(&fe, &[MODEL], GRACE + Duration::from_secs(3)).await;
    fe.assert_still_serving(MODEL, MAX_RSS_MIB).await;
}

/// Without a secret the event plane is unauthenticated, so the frontend
/// binds it on loopback whatever `--event-host` says, and logs why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_secret_the_event_listener_stays_on_loopback() {
    let _box = shared().await;
    let fe = Frontend::start(None, &["--event-host", "0.0.0.0"]);
    assert!(fe.events.ip().is_loopback(), "an unauthenticated event listener bound {}", fe.events);
    assert!(fe.proc.wait_log("no event secret", Duration::from_secs(1)), "no warning about the loopback bind");
    // Without a secret, a worker without one registers as before.
    let _w = worker(Some(fe.events), MODEL, None, &[]);
    fe.wait_workers(1, STARTUP).await;
    fe.assert_still_serving(MODEL, MAX_RSS_MIB).await;
}

/// The worker side of the mutual proof: a fake frontend that cannot prove
/// the secret (a wrong Welcome, or no Challenge at all) gets no Register,
/// so nobody learns a worker's registration by posing as a frontend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_registers_only_with_a_frontend_that_proves_the_secret() {
    let _box = shared().await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let fake_frontend = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    let w = worker(Some(fake_frontend), MODEL, Some(SECRET), &["--worker-id", "4711"]);
    let accept = |within: Duration| {
        let deadline = Instant::now() + within;
        loop {
            match listener.accept() {
                Ok((stream, _)) => {
                    stream.set_nonblocking(false).unwrap();
                    return stream;
                }
                Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => panic!("the worker did not connect within {within:?}: {e}"),
            }
        }
    };
    // 1. A Challenge, then a Welcome under the wrong secret.
    let mut conn = EventConn::from_stream(accept(Duration::from_secs(5))).unwrap();
    let nonce = common::random_nonce();
    let _ = conn.send(&Frame::Challenge { nonce });
    let first = conn.read_frame(Duration::from_secs(3));
    if !common::legacy() {
        let Ok(Some(Frame::Proof { nonce: worker_nonce, mac })) = &first else {
            panic!("the worker answers a Challenge with a Proof, not {first:?}");
        };
        assert!(wire::verify_proof_mac(SECRET.as_bytes(), &nonce, worker_nonce, mac), "the worker's Proof");
        let bad = wire::welcome_mac(WRONG_SECRET.as_bytes(), &nonce, worker_nonce);
        let _ = conn.send(&Frame::Welcome { mac: bad });
    }
    let next = if common::legacy() { first } else { conn.read_frame(Duration::from_millis(1500)) };
    assert!(
        !matches!(next, Ok(Some(Frame::Register { .. }))),
        "the worker registered with a frontend whose Welcome is wrong: {next:?}"
    );
    drop(conn);
    // 2. No Challenge: the worker gives up after its timeout, sending nothing.
    let mut silent = accept(Duration::from_secs(8));
    let started = Instant::now();
    let got = read_for(&mut silent, Duration::from_secs(4));
    let mut buf = BytesMut::from(&got[..]);
    let frame = wire::decode(&mut buf);
    assert!(
        !matches!(frame, Ok(Some(Frame::Register { .. }))),
        "the worker registered with a frontend that sent no Challenge: {frame:?}"
    );
    eprintln!("worker closed a challenge-less connection after {:?}", started.elapsed());
    assert!(w.proc.wait_log("frontend sent no challenge", Duration::from_secs(2)), "no log of the missing challenge");
}

/// What `stream` sends until it closes or `within` passes (at most 64 KiB).
fn read_for(stream: &mut std::net::TcpStream, within: Duration) -> Vec<u8> {
    let deadline = Instant::now() + within;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while got.len() < 64 * 1024 {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            break;
        }
        match std::io::Read::read(stream, &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    got
}

/// Rotation, the middle step of `docs/deployment.md`: a frontend that signs
/// with the new secret and a worker that still signs with the old one, each
/// holding both, register and serve; a worker that knows only a third
/// secret does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_with_two_secrets_keeps_serving() {
    let _box = shared().await;
    const NEW: &str = "the-new-secret-0123456789abcdefgh";
    let fe =
        Frontend::start_with_env(&[("LOADGATE_EVENT_SECRET", NEW), ("LOADGATE_EVENT_SECRET_PREVIOUS", SECRET)], &[]);
    let _w = common::worker_with_env(
        Some(fe.events),
        MODEL,
        &[("LOADGATE_EVENT_SECRET", SECRET), ("LOADGATE_EVENT_SECRET_PREVIOUS", NEW)],
        &[],
    );
    fe.wait_workers(1, STARTUP).await;
    let served = serve_many(&fe, MODEL, 10).await;
    assert_eq!(served.ok, 10, "mid-rotation requests: {served:?}");
    let _stranger = worker(Some(fe.events), "stranger-model", Some(WRONG_SECRET), &[]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(fe.workers().await, Some(1), "a worker with neither secret registered");
    fe.assert_still_serving(MODEL, MAX_RSS_MIB).await;
}
