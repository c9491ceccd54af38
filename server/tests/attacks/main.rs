//! The attack suite of issue 9: every attack of its *Found* list, tried with
//! real `loadgate` processes on 127.0.0.1 as an attacker who reaches the
//! event, inference and worker ports would, and refused. After each attack
//! the frontend still serves a normal request and its RSS stays bounded.
//!
//! The frontends have the event secret (`LOADGATE_EVENT_SECRET`); the real
//! workers have it too. The attacker either lacks it (impersonation) or has
//! it (an insider or a compromised worker: ownership and limits must still
//! hold). `common::FakeWorker` is the impostor's endpoint: it answers 200 and
//! counts what it receives, so "the impostor got 0 requests" is measured.
//!
//! `ATTACKS_LEGACY_BIN=/path/to/loadgate` runs the suite against a build from
//! before issue 9 (flags it lacks are left out), where the attacks succeed.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use common::{
    exclusive, register, request_proof, shared, small_body, unix_ms, worker, EventConn, FakeWorker, Frontend, GRACE,
    HANDSHAKE_TIMEOUT, IMPOSTOR_MARK, PROOF_HEADER, SECRET, STARTUP, WRONG_SECRET,
};
use loadgate::wire::{self, Frame};
use loadgate::RankLoad;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt as _;

const MODEL: &str = "attack-model";
/// RSS a frontend may have after an ordinary attack (a debug build idles at
/// a few tens of MiB).
const MAX_RSS_MIB: f64 = 256.0;
/// How long a refused connection may take to be closed.
const CLOSE_WITHIN: Duration = Duration::from_secs(3);

/// What `n` sequential requests for `model` got.
#[derive(Debug, Default)]
struct Served {
    ok: usize,
    by_impostor: usize,
    others: Vec<(u16, String)>,
}

async fn serve_many(fe: &Frontend, model: &str, n: usize) -> Served {
    let mut served = Served::default();
    for _ in 0..n {
        let (status, body) = fe.complete(model).await;
        if status == 200 && body.contains(IMPOSTOR_MARK) {
            served.by_impostor += 1;
        } else if status == 200 {
            served.ok += 1;
        } else {
            served.others.push((status, body));
        }
    }
    served
}

/// A secured frontend with `extra` flags and one real worker of [`MODEL`]
/// (with `worker_flags`), registered.
async fn pool(extra: &[&str], worker_flags: &[&str]) -> (Frontend, common::Worker) {
    let fe = Frontend::secured(extra);
    let w = worker(Some(fe.events), MODEL, Some(SECRET), worker_flags);
    fe.wait_workers(1, STARTUP).await;
    (fe, w)
}

/// The worker's `/info` (read with a valid proof, as the frontend does).
async fn info(fe: &Frontend, w: &common::Worker) -> Value {
    let proof = request_proof(SECRET.as_bytes(), "GET", "/info", b"", unix_ms());
    let response =
        fe.client.get(format!("{}/info", w.http)).header(PROOF_HEADER, proof).send().await.expect("GET /info");
    assert_eq!(response.status(), 200, "/info with a valid proof");
    response.json().await.expect("/info JSON")
}

fn busy_load() -> RankLoad {
    RankLoad { active_decode_blocks: 1024, kv_total_blocks: 1024, ..Default::default() }
}

// ---------------------------------------------------------------------------
// Impersonation.

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

// ---------------------------------------------------------------------------
// Ownership.

/// Found 1: a Register with a live worker's id replaced its address, and the
/// hijack outlived the attacker's connection. Now a Register for an id whose
/// connection is open is refused, even with the right secret and the right
/// incarnation; the real worker keeps its address and serves, also after the
/// attacker leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hijack_of_a_live_worker_id_is_refused() {
    let _box = shared().await;
    let (fe, w) = pool(&[], &["--worker-id", "4242"]).await;
    let incarnation = info(&fe, &w).await["incarnation"].as_u64().expect("incarnation in /info");
    let impostor = FakeWorker::start();
    let addr = impostor.addr.to_string();
    // The same incarnation (a reconnect claim) and another (a restart claim).
    let mut same = EventConn::authenticated(fe.events, SECRET);
    let _ = same.send(&register(4242, incarnation, 1, MODEL, &addr));
    let mut restart = EventConn::authenticated(fe.events, SECRET);
    let _ = restart.send(&register(4242, incarnation.wrapping_add(1), 1, MODEL, &addr));
    tokio::time::sleep(Duration::from_millis(100)).await;

    let served = serve_many(&fe, MODEL, 30).await;
    assert_eq!(impostor.requests(), 0, "hijacked: the impostor received {} requests", impostor.requests());
    assert_eq!(served.ok, 30, "{served:?}");
    assert!(same.closed_within(CLOSE_WITHIN), "hijack (same incarnation): connection left open");
    assert!(restart.closed_within(CLOSE_WITHIN), "hijack (new incarnation): connection left open");
    assert!(fe.proc.wait_log("worker id 4242 is held by a live connection", Duration::from_secs(1)));
    drop((same, restart));
    // After the attacker's connections are gone and the grace has passed.
    tokio::time::sleep(GRACE + Duration::from_millis(300)).await;
    let served = serve_many(&fe, MODEL, 30).await;
    assert_eq!(impostor.requests(), 0, "the hijack outlived the attacker's connection");
    assert_eq!(served.ok, 30, "{served:?}");
    assert_eq!(fe.workers().await, Some(1));
    fe.assert_still_serving(MODEL, MAX_RSS_MIB).await;
}

/// A worker id registered with `--worker URL` (no connection) cannot be
/// taken over the event plane.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_over_a_static_worker_id_is_refused() {
    let _box = shared().await;
    let w = worker(None, MODEL, Some(SECRET), &["--worker-id", "4545"]);
    let fe = Frontend::secured(&["--worker", &w.http]);
    fe.wait_workers(1, STARTUP).await;
    let impostor = FakeWorker::start();
    let mut conn = EventConn::authenticated(fe.events, SECRET);
    let _ = conn.send(&register(4545, 1, 1, MODEL, &impostor.addr.to_string()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let served = serve_many(&fe, MODEL, 20).await;
    assert_eq!(impostor.requests(), 0, "a --worker id was taken over the event plane");
    assert_eq!(served.ok, 20, "{served:?}");
    assert!(conn.closed_within(CLOSE_WITHIN), "connection left open");
    fe.assert_still_serving(MODEL, MAX_RSS_MIB).await;
}

/// The legitimate side of ownership: a worker restarted with a fixed
/// `--worker-id` (a new incarnation, during the grace) rejoins and takes
/// traffic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_worker_with_a_fixed_id_rejoins() {
    let _box = shared().await;
    let (fe, mut w) = pool(&[], &["--worker-id", "4343"]).await;
    let before = info(&fe, &w).await["incarnation"].as_u64();
    w.proc.kill();
    let w2 = worker(Some(fe.events), MODEL, Some(SECRET), &["--worker-id", "4343"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let started = Instant::now();
    loop {
        let (status, _) = fe.complete(MODEL).await;
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the restarted worker did not take traffic (last status {status})");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("restarted worker served after {:?}", started.elapsed());
    assert_ne!(info(&fe, &w2).await["incarnation"].as_u64(), before, "a new incarnation");
    let served = serve_many(&fe, MODEL, 10).await;
    assert_eq!(served.ok, 10, "{served:?}");
    assert_eq!(fe.workers().await, Some(1));
}

/// Found 1: spoofed Load frames with a huge seq made every idle worker busy
/// for good (100 % 529) and spoofed Deregister frames kept a real worker out.
/// Now Load and Deregister for a worker come only from the connection that
/// registered it: other connections (authenticated ones too) are closed, the
/// idle worker is not busy and stays registered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spoofed_load_and_deregister_from_another_connection_are_refused() {
    let _box = shared().await;
    let (fe, w) = pool(&["--active-decode-blocks-threshold", "0.5"], &["--worker-id", "77"]).await;
    let incarnation = info(&fe, &w).await["incarnation"].as_u64().expect("incarnation");
    let impostor = FakeWorker::start();
    let real_addr = w.http.trim_start_matches("http://").to_owned();
    let spoof_load = Frame::Load { worker: 77, incarnation, rank: 0, seq: u64::MAX, load: busy_load() };
    let spoof_deregister = Frame::Deregister { worker: 77, incarnation };

    // Load: bare; after registering another worker; after re-registering 77 as itself.
    let mut bare = EventConn::authenticated(fe.events, SECRET);
    let _ = bare.send(&spoof_load);
    let mut other = EventConn::authenticated(fe.events, SECRET);
    let _ = other.send(&register(78, 1, 1, "attacker-model", &impostor.addr.to_string()));
    let _ = other.send(&spoof_load);
    let mut as_itself = EventConn::authenticated(fe.events, SECRET);
    let _ = as_itself.send(&register(77, incarnation, 1, MODEL, &real_addr));
    let _ = as_itself.send(&spoof_load);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut statuses = Vec::new();
    for _ in 0..20 {
        statuses.push(fe.complete(MODEL).await.0);
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let busy = statuses.iter().filter(|&&s| s == 529).count();
    assert_eq!(busy, 0, "spoofed Load made the idle worker busy: {busy} of 20 got 529 ({statuses:?})");
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    for (name, conn) in
        [("bare Load", &mut bare), ("Load after another Register", &mut other), ("re-Register", &mut as_itself)]
    {
        assert!(conn.closed_within(CLOSE_WITHIN), "{name} for a worker it does not own: connection left open");
    }

    // Deregister: bare; after re-registering 77 as itself.
    let mut bare = EventConn::authenticated(fe.events, SECRET);
    let _ = bare.send(&spoof_deregister);
    let mut as_itself = EventConn::authenticated(fe.events, SECRET);
    let _ = as_itself.send(&register(77, incarnation, 1, MODEL, &real_addr));
    let _ = as_itself.send(&spoof_deregister);
    // Sample requests and /v1/models over ~1 s, past the grace.
    let mut missing = 0;
    let mut statuses = Vec::new();
    for _ in 0..24 {
        statuses.push(fe.complete(MODEL).await.0);
        if !fe.models().await.0.contains(&MODEL.to_owned()) {
            missing += 1;
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    assert_eq!(missing, 0, "spoofed Deregister kept the real worker out of {missing} of 24 samples ({statuses:?})");
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    assert!(bare.closed_within(CLOSE_WITHIN), "spoofed Deregister: connection left open");
    assert!(as_itself.closed_within(CLOSE_WITHIN), "spoofed Deregister after re-Register: connection left open");
    assert_eq!(impostor.requests(), 0);
    fe.assert_still_serving(MODEL, MAX_RSS_MIB).await;
}

// ---------------------------------------------------------------------------
// Cheap memory.

/// Found 2: a 34-byte Register with dp_size 65536 cost 16 MiB of frontend
/// memory. Now a dp size over --max-dp-size is refused and the RSS does not
/// grow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_dp_size_is_refused() {
    let _box = exclusive().await;
    let (fe, _w) = pool(&[], &[]).await;
    let impostor = FakeWorker::start();
    fe.assert_still_serving(MODEL, MAX_RSS_MIB).await;
    let before = fe.mem();
    let mut conns = Vec::new();
    for i in 0..8 {
        let mut conn = EventConn::authenticated(fe.events, SECRET);
        let _ = conn.send(&register(600 + i, 1, 65_536, "dp-model", &impostor.addr.to_string()));
        conns.push(conn);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = fe.mem();
    let grown = after.rss_mib() - before.rss_mib();
    eprintln!(
        "8 Registers with dp_size 65536: VmRSS {:.1} -> {:.1} MiB ({grown:+.1} MiB)",
        before.rss_mib(),
        after.rss_mib()
    );
    assert!(grown < 16.0, "8 huge-dp Registers grew the frontend by {grown:.1} MiB");
    let (models, _) = fe.models().await;
    assert!(!models.contains(&"dp-model".to_owned()), "a dp_size of 65536 was registered");
    for conn in &mut conns {
        assert!(conn.closed_within(CLOSE_WITHIN), "huge dp size: connection left open");
    }
    assert!(fe.proc.wait_log("limit hit: --max-dp-size", Duration::from_secs(1)), "no limit log line");
    fe.assert_still_serving(MODEL, MAX_RSS_MIB).await;
}

/// Found 2: models were never forgotten (3,000 registrations with distinct
/// 3 KB names left 3,000 models and 9 MB answers). Now names over
/// --max-name-len and models past --max-models are refused, the answers stay
/// small, and the flood's models are forgotten once their workers leave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_name_flood_is_bounded_and_forgotten() {
    let _box = shared().await;
    let (fe, _w) = pool(&["--max-models", "16"], &[]).await;
    let impostor = FakeWorker::start();
    let addr = impostor.addr.to_string();

    // Past --max-models: 40 distinct short names on 40 open connections.
    let mut held = Vec::new();
    for i in 0..40u64 {
        let mut conn = EventConn::authenticated(fe.events, SECRET);
        let _ = conn.send(&register(7000 + i, 1, 1, &format!("flood-{i:03}"), &addr));
        held.push(conn);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (models, bytes) = fe.models().await;
    eprintln!("40 models offered with --max-models 16: {} listed, /v1/models {bytes} bytes", models.len());
    assert!(models.len() <= 16, "{} models registered past --max-models 16", models.len());
    assert!(models.contains(&MODEL.to_owned()));
    let refused = held.iter_mut().map(|c| c.closed_within(Duration::from_millis(5))).filter(|&closed| closed).count();
    assert!(refused >= 40 - 15, "only {refused} of 40 Registers past the model limit were refused");
    assert!(fe.proc.wait_log("limit hit: --max-models", Duration::from_secs(1)), "no limit log line");
    drop(held);
    wait_models(&fe, &[MODEL], Duration::from_secs(5)).await;

    // Names over --max-name-len (256): 3,000 distinct 3 KB names, each on
    // its own authenticated connection, closed right after.
    let started = Instant::now();
    for i in 0..3000u64 {
        let mut conn = EventConn::authenticated(fe.events, SECRET);
        let name = format!("{i:05}-{}", "n".repeat(3000));
        let _ = conn.send(&register(10_000 + i, 1, 1, &name, &addr));
    }
    // And a long address.
    let mut long_addr = EventConn::authenticated(fe.events, SECRET);
    let _ = long_addr.send(&register(9_999, 1, 1, "short-name", &format!("127.0.0.1:1/{}", "a".repeat(1000))));
    eprintln!("3,000 Registers with 3 KB names sent in {:?}", started.elapsed());
    assert!(long_addr.closed_within(CLOSE_WITHIN), "an address over --max-name-len: connection left open");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (models, bytes) = fe.models().await;
    eprintln!("after the flood: {} models, /v1/models {bytes} bytes", models.len());
    assert!(bytes < 2048, "/v1/models is {bytes} bytes after a name flood ({} models)", models.len());
    let thresholds = fe
        .client
        .get(format!("{}/busy_threshold", fe.admin.as_deref().expect("admin listener")))
        .send()
        .await
        .expect("GET /busy_threshold")
        .text()
        .await
        .unwrap_or_default();
    eprintln!("/busy_threshold on the admin port: {} bytes", thresholds.len());
    assert!(thresholds.len() < 4096, "/busy_threshold is {} bytes after a name flood", thresholds.len());
    wait_models(&fe, &[MODEL], Duration::from_secs(5)).await;
    assert!(fe.proc.wait_log("limit hit: --max-name-len", Duration::from_secs(1)), "no limit log line");
    assert_eq!(impostor.requests(), 0);
    fe.assert_still_serving(MODEL, MAX_RSS_MIB).await;
}

/// More worker ids than --max-workers, from authenticated connections: the
/// extra are refused, and the real worker still serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_flood_is_bounded() {
    let _box = shared().await;
    let (fe, _w) = pool(&["--max-workers", "4"], &[]).await;
    let impostor = FakeWorker::start();
    let mut conns: Vec<EventConn> = (0..10u64)
        .map(|i| {
            let mut conn = EventConn::authenticated(fe.events, SECRET);
            let _ = conn.send(&register(6000 + i, 1, 1, MODEL, &impostor.addr.to_string()));
            conn
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let workers = fe.workers().await.expect("/health");
    eprintln!("11 workers offered with --max-workers 4: {workers} registered");
    assert!(workers <= 4, "{workers} workers registered past --max-workers 4");
    let refused = conns.iter_mut().map(|c| c.closed_within(Duration::from_millis(5))).filter(|&c| c).count();
    assert!(refused >= 7, "only {refused} of 10 Registers past the worker limit were refused");
    assert!(fe.proc.wait_log("limit hit: --max-workers 4", Duration::from_secs(1)), "no limit log line");
    drop(conns);
    fe.wait_workers(1, Duration::from_secs(5)).await;
    fe.assert_still_serving(MODEL, MAX_RSS_MIB).await;
}

/// Waits (bounded) until `/v1/models` lists exactly `expected`.
async fn wait_models(fe: &Frontend, expected: &[&str], within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let (models, _) = fe.models().await;
        if models.iter().map(String::as_str).eq(expected.iter().copied()) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "models not forgotten within {within:?}: {} listed ({:?}...)",
            models.len(),
            &models[..models.len().min(5)]
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------------------
// Fair reading.

/// One connection floods Load frames (for its own worker) as fast as it can
/// write; another connection's Register must still take effect within a few
/// milliseconds (fair reading, --event-read-budget).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_flood_does_not_delay_another_register() {
    let _box = exclusive().await;
    let (fe, _w) = pool(&[], &[]).await;
    let impostor = FakeWorker::start();
    let mut conns = Vec::new();
    // The same measurement without a flood, for comparison.
    let mut quiet = Vec::new();
    for k in 0..5u64 {
        let (_, delay, conn) = timed_register(&fe, 850 + k, &impostor.addr.to_string()).await;
        quiet.push(delay.as_secs_f64() * 1e3);
        conns.push(conn);
    }
    let mut flooder = EventConn::authenticated(fe.events, SECRET);
    flooder.send(&register(800, 1, 1, "flood-model", &impostor.addr.to_string())).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let flood = {
        let (stop, sent) = (stop.clone(), sent.clone());
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(12);
            let mut seq = 0u64;
            let mut buf = BytesMut::new();
            // Acquire: pairs with the Release store below.
            while !stop.load(Ordering::Acquire) && Instant::now() < deadline {
                buf.clear();
                for _ in 0..1000 {
                    seq += 1;
                    let load =
                        RankLoad { active_decode_blocks: (seq % 7) as u32, kv_total_blocks: 8, ..Default::default() };
                    let frame = Frame::Load { worker: 800, incarnation: 1, rank: 0, seq, load };
                    wire::encode(&frame, &mut buf).unwrap();
                }
                if let Err(e) = flooder.send_raw(&buf) {
                    return (flooder, Some(e.to_string()));
                }
                // Relaxed: a progress counter.
                sent.fetch_add(buf.len() as u64, Ordering::Relaxed);
            }
            (flooder, None)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Relaxed: a progress counter.
    let flooding_at = sent.load(Ordering::Relaxed);
    let mut delays = Vec::new();
    let mut handshakes = Vec::new();
    for k in 0..10u64 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (handshake, delay, conn) = timed_register(&fe, 900 + k, &impostor.addr.to_string()).await;
        handshakes.push(handshake);
        delays.push(delay);
        conns.push(conn);
    }
    // Relaxed: a progress counter.
    let flooded = sent.load(Ordering::Relaxed) - flooding_at;
    // Release: the flood thread's Acquire load sees it.
    stop.store(true, Ordering::Release);
    let (flooder, flood_error) = flood.join().expect("flood thread");
    let ms = |d: &Duration| d.as_secs_f64() * 1e3;
    let delays_ms: Vec<f64> = delays.iter().map(ms).collect();
    let handshakes_ms: Vec<f64> = handshakes.iter().map(ms).collect();
    eprintln!(
        "during a Load flood ({:.1} MB written while measuring): Register took effect after {delays_ms:.1?} ms \
         (handshake {handshakes_ms:.1?} ms); without a flood: {quiet:.1?} ms",
        flooded as f64 / 1e6
    );
    assert!(flood_error.is_none(), "the flooding connection failed: {flood_error:?}");
    assert!(flooded > 1_000_000, "the flood did not flow ({flooded} bytes; {flooding_at} before measuring)");
    // "A few ms" on an idle box; the bounds leave room for a noisy 2-core
    // machine running the flood, the frontend and the poller at once (before
    // fair reading, the Register waited for the flood to end).
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let worst = delays_ms.iter().copied().fold(0.0, f64::max);
    assert!(median(&delays_ms) < 50.0, "a Register waited {:.1} ms (median) behind a Load flood", median(&delays_ms));
    assert!(worst < 250.0, "a Register waited {worst:.1} ms behind a Load flood");
    let worst_handshake = handshakes_ms.iter().copied().fold(0.0, f64::max);
    assert!(worst_handshake < 250.0, "a handshake waited {worst_handshake:.1} ms behind a Load flood");
    drop(flooder);
    fe.assert_still_serving(MODEL, MAX_RSS_MIB).await;
}

/// Opens an authenticated connection, sends a Register for `id` and waits
/// (bounded, polling `/health`) until the frontend counts it. Returns the
/// handshake's time, the Register's time to effect, and the connection.
async fn timed_register(fe: &Frontend, id: u64, addr: &str) -> (Duration, Duration, EventConn) {
    let base = fe.workers().await.expect("/health");
    let started = Instant::now();
    let mut conn = EventConn::authenticated(fe.events, SECRET);
    let handshake = started.elapsed();
    let sent_at = Instant::now();
    conn.send(&register(id, 1, 1, &format!("fair-{id}"), addr)).unwrap();
    let deadline = sent_at + Duration::from_secs(8);
    while fe.workers().await != Some(base + 1) {
        assert!(Instant::now() < deadline, "a Register did not take effect within 8 s");
        // Short: this loop measures the delay (to a resolution of ~1 ms).
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    (handshake, sent_at.elapsed(), conn)
}

// ---------------------------------------------------------------------------
// Admin on the public port.

/// Found 3: anyone on the inference port could POST /busy_threshold. Now
/// the inference port answers 404 for it (GET and POST) and the thresholds,
/// read on the admin listener, are unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_calls_on_the_inference_port_get_404() {
    let _box = shared().await;
    let (fe, _w) = pool(&["--active-decode-blocks-threshold", "0.5"], &[]).await;
    let get = fe.client.get(format!("{}/busy_threshold", fe.http)).send().await.unwrap();
    assert_eq!(get.status(), 404, "GET /busy_threshold on the inference port");
    for body in [
        json!({"model": MODEL, "active_decode_blocks_threshold": null}),
        json!({"model": MODEL, "active_decode_blocks_threshold": 0.0}),
        json!({"model": MODEL}),
    ] {
        let post = fe.client.post(format!("{}/busy_threshold", fe.http)).json(&body).send().await.unwrap();
        assert_eq!(post.status(), 404, "POST /busy_threshold {body} on the inference port");
    }
    let admin = fe.admin.as_deref().expect("an admin listener");
    assert_ne!(admin, fe.http, "the admin listener is not the inference port");
    assert!(admin.starts_with("http://127.0.0.1:"), "admin listens on loopback by default: {admin}");
    let read: Value = fe.client.get(format!("{admin}/busy_threshold")).send().await.unwrap().json().await.unwrap();
    let ours = read["thresholds"]
        .as_array()
        .and_then(|all| all.iter().find(|t| t["model"] == MODEL))
        .unwrap_or_else(|| panic!("no thresholds for {MODEL}: {read}"))
        .clone();
    assert_eq!(ours["active_decode_blocks_threshold"], json!(0.5), "thresholds changed: {read}");
    fe.assert_still_serving(MODEL, MAX_RSS_MIB).await;
}

// ---------------------------------------------------------------------------
// Direct calls to a worker.

/// A worker with the secret refuses requests that lack the frontend's proof
/// (nobody bypasses shedding and the cap by calling it directly): no proof,
/// a wrong, malformed, stale, future, other-path or other-method proof all
/// get 401; a valid proof gets 200; `/health` and `/metrics` stay open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_calls_to_a_worker_without_the_proof_get_401() {
    let _box = shared().await;
    let w = worker(None, MODEL, Some(SECRET), &[]);
    let client = common::client();
    let now = unix_ms();
    let key = SECRET.as_bytes();
    let cases: Vec<(&str, Option<String>)> = vec![
        ("no proof", None),
        (
            "wrong secret",
            Some(request_proof(WRONG_SECRET.as_bytes(), "POST", "/v1/completions", &small_body(MODEL), now)),
        ),
        ("malformed", Some("v1.123.nothex".to_owned())),
        ("stale (60 s old)", Some(request_proof(key, "POST", "/v1/completions", &small_body(MODEL), now - 60_000))),
        ("future (60 s ahead)", Some(request_proof(key, "POST", "/v1/completions", &small_body(MODEL), now + 60_000))),
        ("other path", Some(request_proof(key, "POST", "/v1/chat/completions", &small_body(MODEL), now))),
        ("other method", Some(request_proof(key, "GET", "/v1/completions", b"", now))),
    ];
    for (what, proof) in &cases {
        let (status, body) = common::complete(&client, &w.http, MODEL, proof.as_deref()).await;
        assert_eq!(status, 401, "POST /v1/completions with {what}: {body}");
        let error: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        assert_eq!(error["error"]["type"], "Unauthorized", "{what}: {body}");
        assert_eq!(error["error"]["code"], 401, "{what}: {body}");
    }
    let chat = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let response = client.post(format!("{}/v1/chat/completions", w.http)).json(&chat).send().await.unwrap();
    assert_eq!(response.status(), 401, "chat without a proof");
    for path in ["/info", "/v1/models"] {
        let response = client.get(format!("{}{path}", w.http)).send().await.unwrap();
        assert_eq!(response.status(), 401, "GET {path} without a proof");
        let stale = request_proof(key, "GET", path, b"", now - 31_000);
        let response = client.get(format!("{}{path}", w.http)).header(PROOF_HEADER, stale).send().await.unwrap();
        assert_eq!(response.status(), 401, "GET {path} with a 31 s old proof");
    }
    // The valid proof works (the MAC is the one spec section 1 defines)...
    let valid = request_proof(key, "POST", "/v1/completions", &small_body(MODEL), unix_ms());
    let (status, body) = common::complete(&client, &w.http, MODEL, Some(&valid)).await;
    assert_eq!(status, 200, "a valid proof: {body}");
    // A proof seen on the wire does not carry another prompt: it vouches for its body.
    let other = request_proof(key, "POST", "/v1/completions", &small_body("another model"), unix_ms());
    let (status, body) = common::complete(&client, &w.http, MODEL, Some(&other)).await;
    assert_eq!(status, 400, "a valid proof for another body: {body}");
    let valid = request_proof(key, "GET", "/info", b"", unix_ms());
    let response = client.get(format!("{}/info", w.http)).header(PROOF_HEADER, valid).send().await.unwrap();
    assert_eq!(response.status(), 200, "GET /info with a valid proof");
    // ...and the probes stay open.
    for path in ["/health", "/metrics"] {
        let response = client.get(format!("{}{path}", w.http)).send().await.unwrap();
        assert_eq!(response.status(), 200, "GET {path} without a proof");
    }
}

// ---------------------------------------------------------------------------
// Big bodies.

/// 8 concurrent 150 MiB bodies: the frontend's peak RSS (VmHWM) stays under
/// 2 GiB, each big request gets a real answer (served, 413, or 503 from the
/// body budget), and a normal request is served during and after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_concurrent_150_mib_bodies_stay_under_2_gib() {
    let _box = exclusive().await;
    // The sink's event connection sends nothing after its Register.
    let (fe, _w) = pool(&["--event-idle-timeout-ms", "600000", "--event-silence-ms", "600000"], &[]).await;
    // The big bodies go to a fake worker that reads and drops them (a debug
    // build of the real one would spend most of the test parsing 900 MiB of
    // JSON); the normal requests go to the real worker.
    let sink = FakeWorker::start();
    let mut sink_conn = EventConn::authenticated(fe.events, SECRET);
    sink_conn.send(&register(5150, 1, 1, "big-model", &sink.addr.to_string())).unwrap();
    fe.wait_workers(2, Duration::from_secs(5)).await;
    const SIZE: usize = 150 << 20;
    let head = r#"{"model":"big-model","prompt":"hello","max_tokens":1,"pad":""#;
    let mut body = Vec::with_capacity(SIZE);
    body.extend_from_slice(head.as_bytes());
    body.resize(SIZE - 2, b'a');
    body.extend_from_slice(b"\"}");
    let body = Bytes::from(body);
    let client = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
    let started = Instant::now();
    let big: Vec<_> = (0..8)
        .map(|_| {
            let (client, url, body) = (client.clone(), format!("{}/v1/completions", fe.http), body.clone());
            tokio::spawn(async move {
                let sent = client.post(url).header("content-type", "application/json").body(body).send().await;
                let at = started.elapsed();
                match sent {
                    Ok(response) => {
                        let status = response.status().as_u16();
                        let text = response.text().await.unwrap_or_default();
                        (status, text.chars().take(200).collect::<String>(), at)
                    }
                    Err(e) => (0, format!("{e:?}"), at),
                }
            })
        })
        .collect();
    // A normal request while the big ones are in flight.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let during = Instant::now();
    let (status, text) = fe.complete(MODEL).await;
    let during = during.elapsed();
    let mut peak = fe.mem();
    let mut outcomes = Vec::new();
    for task in big {
        outcomes.push(task.await.expect("big request task"));
        peak = fe.mem();
    }
    eprintln!("a normal request during the big bodies: {status} after {during:?}");
    for (status, text, at) in &outcomes {
        eprintln!("  150 MiB body: {status} after {at:?}: {text}");
    }
    eprintln!(
        "8 x 150 MiB bodies in {:?}: frontend VmHWM {:.0} MiB, VmRSS after {:.0} MiB",
        started.elapsed(),
        peak.hwm_mib(),
        peak.rss_mib()
    );
    assert_eq!(status, 200, "a normal request during the big bodies: {text}");
    assert!(peak.hwm_mib() < 2048.0, "frontend peak RSS {:.0} MiB >= 2 GiB", peak.hwm_mib());
    for (status, text, _) in &outcomes {
        assert!(matches!(status, 200 | 503), "a big request got no real answer: {status} {text}");
    }
    let served = outcomes.iter().filter(|o| o.0 == 200).count();
    eprintln!("the sink received {} requests, {:.0} MiB", sink.requests(), sink.bytes() as f64 / f64::from(1 << 20));
    // As many as the default budget (1024 MiB) holds at once are served:
    // bodies that grow together past the budget refuse the youngest only.
    if !common::legacy() {
        let fit = 1024 / (SIZE >> 20);
        assert!(served >= fit, "only {served} of 8 bodies served; {fit} fit in the budget: {outcomes:?}");
    }
    // Each served body reached the worker whole (heads are on top).
    assert_eq!(sink.requests(), served, "the sink's requests are the served bodies");
    assert!(sink.bytes() >= (served * SIZE) as u64, "the served bodies reached the worker whole");
    assert!(sink.bytes() < (served * (SIZE + 64 * 1024)) as u64, "the sink received more than the served bodies");
    drop(sink_conn);
    fe.assert_still_serving(MODEL, 2048.0).await;
}

/// A slow-body attack: connections that declare the largest body
/// (192 MiB) and trickle bytes used to reserve their whole `Content-Length`
/// at once, so a few of them held the body budget and the frontend answered
/// 503 to everyone's POST. Now a body holds what it has sent (at most twice,
/// at least 64 KiB): with 6 such connections open, a normal request and a
/// 96 MiB body are served. The budget still refuses when real bytes fill it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trickling_big_declared_bodies_do_not_hold_the_budget() {
    let _box = exclusive().await;
    // The sink's event connection sends nothing after its Register.
    let (fe, _w) = pool(&["--event-idle-timeout-ms", "600000", "--event-silence-ms", "600000"], &[]).await;
    let sink = FakeWorker::start();
    let mut sink_conn = EventConn::authenticated(fe.events, SECRET);
    sink_conn.send(&register(5196, 1, 1, "big-model", &sink.addr.to_string())).unwrap();
    fe.wait_workers(2, Duration::from_secs(5)).await;
    let http = fe.http.trim_start_matches("http://").to_owned();
    let mut tricklers = Vec::new();
    for _ in 0..6 {
        tricklers.push(open_body(&http, 192 << 20, b"{").await);
    }
    let trickle = async {
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            for conn in &mut tricklers {
                conn.write_all(b" ").await.expect("the frontend keeps reading a trickling body");
            }
        }
    };
    let served = async {
        let normal = serve_many(&fe, MODEL, 3).await;
        let big = big_request(&fe.client, &fe.http, 96 << 20).await;
        (normal, big)
    };
    let ((), (normal, big)) = tokio::join!(trickle, served);
    eprintln!("with 6 trickling 192 MiB bodies open: 3 normal requests {normal:?}, a 96 MiB body {big}");
    assert_eq!(normal.ok, 3, "normal requests while bodies trickle: {normal:?}");
    assert_eq!(big, 200, "a 96 MiB body while 6 x 192 MiB declared bodies trickle");
    drop(tricklers);
    drop(sink_conn);

    // Real bytes still fill the budget: 8 MiB sent (of 16 declared) on one
    // connection fill --http-body-budget-mb 8, and the next body is refused.
    let (small, _w2) = pool(&["--http-body-budget-mb", "8"], &[]).await;
    let small_http = small.http.trim_start_matches("http://").to_owned();
    let mut filler = open_body(&small_http, 16 << 20, &vec![b' '; 8 << 20]).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    let refused = loop {
        let (status, body) = small.complete(MODEL).await;
        if status == 503 || Instant::now() >= deadline {
            break (status, body);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!("with 8 MiB of real bytes buffered under an 8 MiB budget: {refused:?}");
    assert_eq!(refused.0, 503, "the budget did not refuse: {}", refused.1);
    assert!(refused.1.contains("too many request bodies"), "{}", refused.1);
    assert!(small.proc.wait_log("limit hit: --http-body-budget-mb 8", Duration::from_secs(2)), "no limit log line");
    filler.write_all(b" ").await.ok();
    drop(filler);
    // Given back when the connection goes: served again.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (status, body) = small.complete(MODEL).await;
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the budget was not given back: {status} {body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    small.assert_still_serving(MODEL, MAX_RSS_MIB).await;
    fe.assert_still_serving(MODEL, MAX_RSS_MIB).await;
}

/// A raw connection to `addr` (HOST:PORT) that sent a completion head
/// declaring `declared` bytes and then `first` of them.
async fn open_body(addr: &str, declared: usize, first: &[u8]) -> tokio::net::TcpStream {
    let mut conn = tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr))
        .await
        .expect("connect within 2 s")
        .expect("connect");
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         content-length: {declared}\r\n\r\n"
    );
    let send = async {
        conn.write_all(head.as_bytes()).await?;
        conn.write_all(first).await
    };
    tokio::time::timeout(Duration::from_secs(10), send).await.expect("sent within 10 s").expect("send");
    conn
}

/// POSTs a `size`-byte completion for `big-model`; its status (0: no answer).
async fn big_request(client: &reqwest::Client, base: &str, size: usize) -> u16 {
    let head = r#"{"model":"big-model","prompt":"hello","max_tokens":1,"pad":""#;
    let mut body = Vec::with_capacity(size);
    body.extend_from_slice(head.as_bytes());
    body.resize(size - 2, b'a');
    body.extend_from_slice(b"\"}");
    let sent = client.post(format!("{base}/v1/completions")).header("content-type", "application/json").body(body);
    match sent.timeout(Duration::from_secs(60)).send().await {
        Ok(response) => response.status().as_u16(),
        Err(_) => 0,
    }
}

/// A body refused before it is read (413 over the limit, 503 over the
/// budget) must still reach the client as that answer, not as a reset
/// connection while it is still sending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_big_bodies_get_their_answer() {
    let _box = exclusive().await;
    let (fe, _w) = pool(&["--http-body-budget-mb", "64", "--http-body-limit-mb", "160"], &[]).await;
    let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
    let mut outcomes = Vec::new();
    for (size, expected) in [(100usize << 20, 503u16), (170 << 20, 413)] {
        let body = Bytes::from(vec![b' '; size]);
        for _ in 0..4 {
            let sent = client
                .post(format!("{}/v1/completions", fe.http))
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await;
            let got = match sent {
                Ok(response) => response.status().as_u16(),
                Err(e) => {
                    eprintln!("  {} MiB body: no answer: {e:?}", size >> 20);
                    0
                }
            };
            outcomes.push((size >> 20, expected, got));
        }
    }
    eprintln!("refused big bodies (MiB, expected, got): {outcomes:?}");
    let lost = outcomes.iter().filter(|(_, expected, got)| expected != got).count();
    assert_eq!(lost, 0, "{lost} of {} refused bodies got no answer: {outcomes:?}", outcomes.len());
    fe.assert_still_serving(MODEL, MAX_RSS_MIB).await;
}

// ---------------------------------------------------------------------------
// Connections.

/// More unauthenticated connections than --max-event-connections: the extra
/// are closed at once, the rest at the handshake timeout, and a real worker
/// registers once they are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_connection_limit_closes_the_extra_and_a_worker_still_registers() {
    let _box = shared().await;
    let fe = Frontend::secured(&["--max-event-connections", "8"]);
    let started = Instant::now();
    let mut conns: Vec<EventConn> = (0..20).map(|_| EventConn::connect(fe.events).expect("connect")).collect();
    // One stalls mid-Proof (slow loris), the others send nothing.
    let proof = common::encoded(&Frame::Proof { nonce: [0; wire::NONCE_LEN], mac: [0; wire::TAG_LEN] });
    let _ = conns[0].send_raw(&proof[..3]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let closed_early: Vec<bool> = conns.iter_mut().map(|c| c.closed_within(Duration::from_millis(5))).collect();
    let early = closed_early.iter().filter(|&&c| c).count();
    eprintln!("20 idle connections with --max-event-connections 8: {early} closed at once");
    assert!(early >= 12, "only {early} of 20 connections closed past --max-event-connections 8");
    assert!(fe.proc.wait_log("limit hit: --max-event-connections 8", Duration::from_secs(1)), "no limit log line");
    // A real worker starts while the 8 are held.
    let _w = worker(Some(fe.events), MODEL, Some(SECRET), &[]);
    for (conn, closed) in conns.iter_mut().zip(&closed_early) {
        if !closed {
            let left = (HANDSHAKE_TIMEOUT + Duration::from_secs(1)).saturating_sub(started.elapsed());
            assert!(conn.closed_within(left), "an idle unauthenticated connection outlived the handshake timeout");
        }
    }
    eprintln!("the held connections were closed by {:?}", started.elapsed());
    drop(conns);
    fe.wait_workers(1, Duration::from_secs(8)).await;
    eprintln!("the real worker registered after {:?}", started.elapsed());
    fe.assert_still_serving(MODEL, MAX_RSS_MIB).await;
}
