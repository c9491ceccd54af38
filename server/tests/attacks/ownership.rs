//! Ownership: a worker id, its Load and its Deregister belong to the
//! connection that registered it.

use std::time::{Duration, Instant};

use loadgate::wire::Frame;

use crate::common::{register, shared, worker, EventConn, FakeWorker, Frontend, GRACE, SECRET, STARTUP};
use crate::{busy_load, info, pool, serve_many, CLOSE_WITHIN, MAX_RSS_MIB, MODEL};

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
