//! The NATS event plane end to end (issue 25): a real `nats-server` on a
//! free 127.0.0.1 port (Debian's, installed by `scripts/prepare-nats-server`),
//! real `loadgate frontend` and `loadgate worker` processes with
//! `--event-plane nats`, and a raw NATS client playing the attacker.
//!
//! `#[ignore]` in plain `cargo test` (they need `nats-server`); `.ci/run`
//! installs it and runs them with `--ignored`, in release (the flood test
//! measures throughput: a debug frontend opens about 80,000 envelopes a
//! second, a release one about a million), where a missing server fails.
//!
//! Margins: a frontend must know every worker within max(1 s, one
//! heartbeat) of its start; asserted within 1 s plus 1 s for a 2-core
//! machine busy with a build (the measured time is printed). Every other
//! wait is bounded (10 s).

#[path = "common/mod.rs"]
mod common;
#[allow(dead_code)]
#[path = "sidecar/fake_engine.rs"]
mod fake_engine;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use common::{frontend, metric, metrics_text, plane, unix_ms, Frontend, Nats, SECRET};
use futures_util::StreamExt as _;
use loadgate::wire::envelope::{seal, ENVELOPE_MAGIC};
use loadgate::wire::Frame;
use loadgate::RankLoad;

const MODEL: &str = "nats-model";

fn worker(nats: &Nats, id: u64) -> common::Worker {
    let id = id.to_string();
    let mut flags = plane(nats);
    flags.extend(["--worker-id".to_owned(), id]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    common::worker(None, MODEL, Some(SECRET), &flags)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nats-server (scripts/prepare-nats-server); run by .ci/run"]
async fn frontends_that_start_late_learn_every_worker_and_route_to_them() {
    let _box = common::shared().await;
    let nats = Nats::start(&[]);
    let _workers: Vec<_> = (1..=6).map(|id| worker(&nats, id)).collect();
    // Let the workers' first frames go by: nobody hears them.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut frontends = Vec::new();
    for _ in 0..3 {
        let fe = frontend(&nats, &[]);
        let started = Instant::now();
        fe.wait_workers(6, Duration::from_secs(2)).await;
        eprintln!("a frontend knew the 6 workers {:?} after it listened", started.elapsed());
        frontends.push(fe);
    }
    for fe in &frontends {
        for _ in 0..3 {
            let (status, body) = fe.complete(MODEL).await;
            assert_eq!(status, 200, "{body}");
        }
    }
    // kill -9 one frontend: the others keep serving, no worker lost.
    let mut first = frontends.remove(0);
    first.proc.kill();
    for fe in &frontends {
        assert_eq!(fe.workers().await, Some(6));
        assert_eq!(fe.complete(MODEL).await.0, 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nats-server (scripts/prepare-nats-server); run by .ci/run"]
async fn a_silent_worker_leaves_routing_and_a_stopped_one_deregisters() {
    let _box = common::shared().await;
    let nats = Nats::start(&[]);
    let fe = frontend(&nats, &["--event-silence-ms", "500", "--event-idle-timeout-ms", "1500"]);
    let mut killed = worker(&nats, 1);
    let stopped = worker(&nats, 2);
    fe.wait_workers(2, Duration::from_secs(10)).await;
    // SIGTERM: the worker deregisters at once.
    stopped.proc.terminate();
    fe.wait_workers(1, Duration::from_secs(10)).await;
    // kill -9: out of routing after the silence, forgotten after the idle timeout.
    killed.proc.kill();
    let started = Instant::now();
    let out = |text: &str| metric(text, "loadgate_frontend_workers_out_of_routing") == Some(1.0);
    common::wait_for_metrics(&fe.client, &fe.http, Duration::from_secs(10), "a silent worker stayed in routing", out)
        .await;
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(400), "out of routing after {took:?}, before its silence");
    fe.wait_workers(0, Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nats-server (scripts/prepare-nats-server); run by .ci/run"]
async fn a_client_without_the_secret_can_neither_register_nor_replay_nor_move_frames() {
    let _box = common::shared().await;
    let nats = Nats::start(&[]);
    let fe = frontend(&nats, &[]);
    let attacker = async_nats::connect(nats.url.as_str()).await.expect("attacker connects");
    let mut seen = attacker.subscribe("loadgate.ev.>").await.unwrap();
    let _w1 = worker(&nats, 1);
    let _w2 = worker(&nats, 2);
    fe.wait_workers(2, Duration::from_secs(10)).await;
    // Capture real frames of worker 1.
    let mut captured = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while captured.len() < 20 && Instant::now() < deadline {
        if let Ok(Some(message)) = tokio::time::timeout(Duration::from_secs(1), seen.next()).await {
            captured.push(message);
        }
    }
    assert!(!captured.is_empty(), "no frame seen on NATS");
    let subject_1 = format!("loadgate.ev.{MODEL}.1");
    for _ in 0..200 {
        for message in &captured {
            // Replayed as is (stale seq, or a heartbeat of the same life).
            attacker.publish(message.subject.clone(), message.payload.clone()).await.unwrap();
            // Moved to another worker's subject, or to a new one.
            attacker.publish(format!("loadgate.ev.{MODEL}.2"), message.payload.clone()).await.unwrap();
            attacker.publish(format!("loadgate.ev.{MODEL}.99"), message.payload.clone()).await.unwrap();
            // Altered.
            let mut bent = message.payload.to_vec();
            let at = bent.len() / 2;
            bent[at] ^= 0x40;
            attacker.publish(message.subject.clone(), bent.into()).await.unwrap();
        }
        // Garbage.
        attacker.publish(subject_1.clone(), vec![ENVELOPE_MAGIC; 300].into()).await.unwrap();
    }
    attacker.flush().await.unwrap();
    assert!(fe.workers().await == Some(2), "the attack changed the fleet");
    for _ in 0..5 {
        assert_eq!(fe.complete(MODEL).await.0, 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nats-server (scripts/prepare-nats-server); run by .ci/run"]
async fn a_nats_outage_of_ten_seconds_costs_no_request_and_heals_by_itself() {
    let _box = common::shared().await;
    let nats = Nats::start(&[]);
    let port: u16 = nats.url.rsplit(':').next().unwrap().parse().unwrap();
    let fe = frontend(&nats, &[]);
    let _w1 = worker(&nats, 1);
    let _w2 = worker(&nats, 2);
    fe.wait_workers(2, Duration::from_secs(10)).await;
    // Load through the outage: one request every 20 ms.
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let client = fe.client.clone();
    let url = fe.http.clone();
    let load = tokio::spawn(async move {
        let mut statuses = std::collections::BTreeMap::new();
        loop {
            let (status, _) = common::complete(&client, &url, MODEL, None).await;
            *statuses.entry(status).or_insert(0u32) += 1;
            tokio::select! {
                _ = &mut stopped => return statuses,
                () = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
        }
    });
    drop(nats);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(fe.workers().await, Some(2), "the workers stayed in the last view");
    let _nats = Nats::start_on(port, &[]);
    let back = Instant::now();
    // Recovered: a worker that starts now is known (the frontend and the
    // workers reconnected, the frontend subscribed again).
    let _w3 = worker(&_nats, 3);
    fe.wait_workers(3, Duration::from_secs(10)).await;
    let recovery = back.elapsed();
    eprintln!("recovered {recovery:?} after nats-server came back");
    let _ = stop.send(());
    let statuses = load.await.unwrap();
    eprintln!("answers during the outage and after: {statuses:?}");
    assert_eq!(statuses.keys().copied().collect::<Vec<_>>(), [200], "{statuses:?}");
    // 2 s, plus 1 s for a busy 2-core machine (the worker's own start included).
    assert!(recovery < Duration::from_secs(3), "{recovery:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nats-server (scripts/prepare-nats-server); run by .ci/run"]
async fn a_worker_that_moves_hosts_is_routed_to_its_new_address_only() {
    let _box = common::shared().await;
    let nats = Nats::start(&[]);
    let fe = frontend(&nats, &[]);
    let mut old = worker(&nats, 5);
    fe.wait_workers(1, Duration::from_secs(10)).await;
    assert_eq!(fe.complete(MODEL).await.0, 200);
    let old_http = old.http.clone();
    // kill -9 (no Deregister), then the same id elsewhere: a new address
    // and a new incarnation.
    old.proc.kill();
    let moved = worker(&nats, 5);
    assert_ne!(moved.http, old_http);
    // Its Register (a newer incarnation) replaces the old one once that one
    // is silent (--event-silence-ms): the old address is dead, so any
    // request sent there would fail.
    let deadline = Instant::now() + Duration::from_secs(10);
    while fe.complete(MODEL).await.0 != 200 {
        assert!(Instant::now() < deadline, "the moved worker was not routed to");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for _ in 0..20 {
        let (status, body) = fe.complete(MODEL).await;
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(fe.workers().await, Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nats-server (scripts/prepare-nats-server); run by .ci/run"]
async fn a_flood_without_the_secret_leaves_health_and_real_flips_working() {
    const FLIPS: u64 = 100;
    let _box = common::shared().await;
    let nats = Nats::start(&[]);
    let fe = frontend(&nats, &["--active-decode-blocks-threshold", "0.5", "--worker-health-check-ms", "0"]);
    let _w = worker(&nats, 1);
    // A second worker this test speaks for, with the secret: its flips are
    // the real ones measured under the flood.
    let honest = async_nats::connect(nats.url.as_str()).await.expect("connects");
    let subject = format!("loadgate.ev.{MODEL}.42");
    let incarnation = unix_ms() * 1000;
    let send = |frame: Frame| {
        let mut buf = BytesMut::new();
        seal(SECRET.as_bytes(), &subject, unix_ms(), &frame, &mut buf).unwrap();
        let (honest, subject) = (honest.clone(), subject.clone());
        async move { honest.publish(subject, buf.freeze()).await.unwrap() }
    };
    let register = Frame::Register {
        worker: 42,
        incarnation,
        dp_size: 1,
        model: MODEL.to_owned(),
        http_addr: "127.0.0.1:9".to_owned(),
    };
    send(register).await;
    fe.wait_workers(2, Duration::from_secs(10)).await;
    // Forged frames on every worker subject until the flips below are done
    // (at most 20 s), at `LOADGATE_TEST_FLOOD_RATE` a second: 300,000 by
    // default, which passes with two CPU hogs beside this 2-core machine's
    // attacker, nats-server and frontend; 0 floods as fast as one connection
    // publishes (about 1.1 million a second here), where a quiet machine
    // passes and one with two hogs beside sometimes does not (figures in
    // docs/deployment.md: measured, not asserted).
    let rate: u64 = std::env::var("LOADGATE_TEST_FLOOD_RATE").ok().and_then(|r| r.parse().ok()).unwrap_or(300_000);
    let url = nats.url.clone();
    let done = Arc::new(AtomicBool::new(false));
    let flooding = done.clone();
    let flood = tokio::spawn(async move {
        let attacker = async_nats::connect(url.as_str()).await.expect("attacker connects");
        let start = Instant::now();
        let until = start + Duration::from_secs(20);
        let mut sent = 0u64;
        // Relaxed: a stop hint; a few more frames after it change nothing.
        while Instant::now() < until && !flooding.load(Ordering::Relaxed) {
            for w in 0..64u64 {
                let mut forged = vec![ENVELOPE_MAGIC; 120];
                forged[9] = 0xB2;
                forged[10..18].copy_from_slice(&w.to_be_bytes());
                attacker.publish(format!("loadgate.ev.{MODEL}.{w}"), forged.into()).await.unwrap();
                sent += 1;
            }
            if rate > 0 {
                let due = start + Duration::from_secs_f64(sent as f64 / rate as f64);
                tokio::time::sleep_until(due.into()).await;
            }
        }
        let _ = attacker.flush().await;
        (sent, start.elapsed())
    });
    // Meanwhile: 100 real flips of worker 42, one every 70 ms, each sent as
    // a worker sends a change (again 5 ms and 50 ms later, each with the next
    // seq: `a_changed_load_is_sent_again_5_ms_later`); /health answers. A
    // flip whose first send is lost is applied by a repeat: at most 50 ms
    // late. The bound is p99 within 100 ms: 99 of the 100.
    let mut answered = 0;
    for flip in 1..=FLIPS {
        let busy = flip % 2 == 1;
        let load =
            RankLoad { active_decode_blocks: if busy { 90 } else { 10 }, kv_total_blocks: 100, ..Default::default() };
        send(Frame::Load { worker: 42, incarnation, rank: 0, seq: 3 * flip - 2, load }).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        send(Frame::Load { worker: 42, incarnation, rank: 0, seq: 3 * flip - 1, load }).await;
        tokio::time::sleep(Duration::from_millis(45)).await;
        send(Frame::Load { worker: 42, incarnation, rank: 0, seq: 3 * flip, load }).await;
        if flip % 10 == 0 {
            assert_eq!(fe.workers().await, Some(2), "/health answers with the two workers");
            answered += 1;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    done.store(true, Ordering::Relaxed);
    let (sent, flooded) = flood.await.unwrap();
    let text = metrics_text(&fe.client, &fe.http).await;
    let bucket = |le: &str| {
        let series = format!("loadgate_frontend_event_flip_lag_seconds_bucket{{le=\"{le}\"}} ");
        text.lines().find_map(|l| l.strip_prefix(series.as_str())).and_then(|v| v.trim().parse::<f64>().ok())
    };
    let (within, all) = (bucket("0.1").unwrap_or(0.0), bucket("+Inf").unwrap_or(0.0));
    let dropped: Vec<&str> = text.lines().filter(|l| l.starts_with("loadgate_frontend_event_frames_dropped")).collect();
    eprintln!(
        "{sent} forged frames in {flooded:.1?}; flips applied {all}, within 100 ms {within}; {answered} health checks answered"
    );
    eprintln!("{dropped:?}");
    assert_eq!(all, FLIPS as f64, "every real flip applied:\n{text}");
    assert!(within >= FLIPS as f64 * 0.99, "p99 of the flips within 100 ms of its seal: {within} of {all}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nats-server (scripts/prepare-nats-server); run by .ci/run"]
async fn a_changed_load_is_sent_again_5_ms_later() {
    let _box = common::shared().await;
    let nats = Nats::start(&[]);
    let listener = async_nats::connect(nats.url.as_str()).await.expect("connects");
    let subject = format!("loadgate.ev.{MODEL}.8");
    let mut frames = listener.subscribe(subject.clone()).await.unwrap();
    let fe = frontend(&nats, &[]);
    let _w = worker(&nats, 8);
    fe.wait_workers(1, Duration::from_secs(10)).await;
    // A request changes the worker's load (and its end changes it back).
    assert_eq!(fe.complete(MODEL).await.0, 200);
    let mut loads = Vec::new();
    let until = Instant::now() + Duration::from_millis(400);
    while let Ok(Some(message)) = tokio::time::timeout_at(until.into(), frames.next()).await {
        let opened = loadgate::wire::envelope::open(&[SECRET.as_bytes()], &subject, &message.payload).unwrap();
        if let Frame::Load { seq, load, .. } = opened.frame {
            loads.push((Instant::now(), seq, load));
        }
    }
    // Some load sent twice in a row, with increasing seqs, within 50 ms
    // (a heartbeat's re-send comes only every 200 ms).
    let repeated =
        loads.windows(2).any(|w| w[0].2 == w[1].2 && w[1].1 > w[0].1 && w[1].0 - w[0].0 < Duration::from_millis(50));
    let seen: Vec<(u64, u32)> = loads.iter().map(|l| (l.1, l.2.active_decode_blocks)).collect();
    assert!(repeated, "no change sent twice: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nats-server (scripts/prepare-nats-server); run by .ci/run"]
async fn the_plane_runs_over_tls_and_an_unknown_ca_is_refused() {
    let _box = common::shared().await;
    let generated = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .expect("generate a certificate");
    let dir = std::env::temp_dir().join(format!("loadgate-nats-tls-{}-{}", std::process::id(), fastrand::u64(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, generated.cert.pem()).unwrap();
    std::fs::write(&key, generated.key_pair.serialize_pem()).unwrap();
    let (cert, key) = (cert.to_str().unwrap().to_owned(), key.to_str().unwrap().to_owned());
    let nats = Nats::start(&["--tls", "--tlscert", &cert, "--tlskey", &key]);
    let url = nats.url.replace("nats://", "tls://");
    let tls = ["--event-plane", "nats", "--nats-url", url.as_str(), "--nats-tls-ca-file", cert.as_str()];
    let fe = Frontend::secured(&tls);
    let mut worker_flags = tls.to_vec();
    worker_flags.extend(["--worker-id", "3"]);
    let _w = common::worker(None, MODEL, Some(SECRET), &worker_flags);
    fe.wait_workers(1, Duration::from_secs(10)).await;
    assert_eq!(fe.complete(MODEL).await.0, 200);
    // Without the CA, the server's certificate is not trusted: a clear error at start.
    let stderr = common::frontend_refuses(
        &["--event-plane", "nats", "--nats-url", url.as_str(), "--nats-connect-timeout-secs", "2"],
        &[("LOADGATE_EVENT_SECRET", SECRET)],
    );
    assert!(stderr.contains("cannot connect to NATS at"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The frontend's waiting requests of worker 41, rank 0.
async fn waiting_of_41(fe: &Frontend) -> Option<f64> {
    let text = metrics_text(&fe.client, &fe.http).await;
    let series = "loadgate_frontend_worker_waiting_requests{worker_id=\"41\",dp_rank=\"0\"} ";
    text.lines().find_map(|l| l.strip_prefix(series)).and_then(|v| v.trim().parse().ok())
}

/// Waits (bounded: 10 s) until `check` holds.
async fn until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nats-server (scripts/prepare-nats-server); run by .ci/run"]
async fn a_sidecar_reports_its_engine_over_nats_leaves_and_rejoins() {
    let _box = common::shared().await;
    let nats = Nats::start(&[]);
    let fe = frontend(&nats, &[]);
    let engine = fake_engine::FakeEngine::start(1).await;
    engine.set_waiting(&[3]);
    let spec = engine.spec();
    let args = [
        "worker",
        "--engine",
        spec.as_str(),
        "--http-host",
        "127.0.0.1",
        "--http-port",
        "0",
        "--event-plane",
        "nats",
        "--nats-url",
        nats.url.as_str(),
        "--worker-id",
        "41",
        "--engine-scrape-interval-ms",
        "20",
        "--engine-scrape-failures",
        "2",
        "--heartbeat-ms",
        "50",
    ];
    let (_sidecar, _) = common::spawn("sidecar", &args, &[("LOADGATE_EVENT_SECRET", SECRET)]);
    fe.wait_workers(1, Duration::from_secs(10)).await;
    until("the engine's load", async || waiting_of_41(&fe).await == Some(3.0)).await;
    assert_eq!(fe.complete(fake_engine::MODEL).await.0, 200);
    // The engine stops answering its scrapes: the sidecar deregisters over NATS.
    engine.set_metrics_up(false);
    fe.wait_workers(0, Duration::from_secs(10)).await;
    // It answers again, with a new load: the sidecar rejoins with it.
    engine.set_waiting(&[9]);
    engine.set_metrics_up(true);
    fe.wait_workers(1, Duration::from_secs(10)).await;
    until("the new load", async || waiting_of_41(&fe).await == Some(9.0)).await;
}

#[test]
#[ignore = "needs nats-server (scripts/prepare-nats-server); run by .ci/run"]
fn without_the_secret_with_wrong_credentials_or_too_many_models_a_frontend_refuses_to_start() {
    let nats = Nats::start(&["--user", "lg", "--pass", "right-password"]);
    let url = nats.url.clone();
    let refuses = |env: &[(&str, &str)]| {
        let plane = ["--event-plane", "nats", "--nats-url", url.as_str(), "--nats-connect-timeout-secs", "2"];
        common::frontend_refuses(&plane, env)
    };
    let stderr = refuses(&[]);
    assert!(stderr.contains("--event-plane nats needs the event secret"), "{stderr}");
    let wrong = [("LOADGATE_EVENT_SECRET", SECRET), ("LOADGATE_NATS_USER", "lg"), ("LOADGATE_NATS_PASSWORD", "wrong")];
    let stderr = refuses(&wrong);
    assert!(stderr.contains("cannot connect to NATS at"), "{stderr}");
    // More models than a beat can tell the others about.
    let many = [("LOADGATE_EVENT_SECRET", SECRET), ("LOADGATE_FRONTEND_MAX_MODELS", "340")];
    let stderr = refuses(&many);
    assert!(stderr.contains("--max-models 340 with frontends sharing their load"), "{stderr}");
}

/// `frame` sealed for `subject` with the event secret, now.
fn sealed(subject: &str, frame: &Frame) -> bytes::Bytes {
    let mut buf = BytesMut::new();
    seal(SECRET.as_bytes(), subject, unix_ms(), frame, &mut buf).unwrap();
    buf.freeze()
}

/// A worker the test plays (with the secret): a Register and a Load every
/// 200 ms on `MODEL`'s subject, until aborted.
fn played_worker(
    client: async_nats::Client,
    worker: u64,
    incarnation: u64,
    addr: String,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let subject = format!("loadgate.ev.{MODEL}.{worker}");
        for seq in 1u64.. {
            let register =
                Frame::Register { worker, incarnation, dp_size: 1, model: MODEL.to_owned(), http_addr: addr.clone() };
            let load = RankLoad { kv_total_blocks: 1000, ..Default::default() };
            let report = Frame::Load { worker, incarnation, rank: 0, seq, load };
            for frame in [register, report] {
                let _ = client.publish(subject.clone(), sealed(&subject, &frame)).await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}

/// Publishes `messages` as recorded, every 100 ms, for `for_how_long`.
fn replay(
    attacker: async_nats::Client,
    messages: Vec<async_nats::Message>,
    for_how_long: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let stop = Instant::now() + for_how_long;
        while Instant::now() < stop {
            for m in &messages {
                let _ = attacker.publish(m.subject.clone(), m.payload.clone()).await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

/// A crashed worker's last frames, replayed by a client without the
/// secret, do not keep it registered: it is forgotten after the idle
/// timeout (2 s; asserted at 4 s) as if nobody replayed them. Before,
/// each replayed Register or Load counted as heard, for the whole 30 s
/// clock window, and a Register replayed after the idle sweep registered
/// it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nats-server (scripts/prepare-nats-server); run by .ci/run"]
async fn a_crashed_worker_leaves_on_time_whatever_is_replayed_of_it() {
    let _box = common::shared().await;
    let nats = Nats::start(&[]);
    let fe = frontend(&nats, &[]);
    let attacker = async_nats::connect(nats.url.as_str()).await.unwrap();
    let mut seen = attacker.subscribe(format!("loadgate.ev.{MODEL}.42")).await.unwrap();
    let honest = async_nats::connect(nats.url.as_str()).await.unwrap();
    let endpoint = common::FakeWorker::start();
    let played = played_worker(honest, 42, unix_ms() * 1000, endpoint.addr.to_string());
    fe.wait_workers(1, Duration::from_secs(10)).await;
    let mut captured = Vec::new();
    let until = Instant::now() + Duration::from_secs(1);
    while let Ok(Some(m)) = tokio::time::timeout_at(until.into(), seen.next()).await {
        captured.push(m);
    }
    assert!(captured.len() >= 2, "its Register and Load recorded");
    played.abort();
    drop(endpoint);
    let crashed = Instant::now();
    let replaying = replay(attacker, captured, Duration::from_secs(6));
    tokio::time::sleep_until((crashed + Duration::from_secs(4)).into()).await;
    assert_eq!(fe.workers().await, Some(0), "still registered 4 s after its crash (idle timeout 2 s)");
    replaying.await.unwrap();
    assert_eq!(fe.workers().await, Some(0), "registered again by a replay");
}

/// A dead frontend's last beat, replayed by a client without the secret,
/// does not keep its load counting: 1,000 prefill tokens it published
/// (threshold 100) stop counting after the staleness (three heartbeats,
/// 600 ms; asserted at 2.5 s), as if nobody replayed it. Before, the load
/// counted on for the 30 s clock window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nats-server (scripts/prepare-nats-server); run by .ci/run"]
async fn a_dead_frontends_beat_replayed_does_not_keep_its_load_counting() {
    let _box = common::shared().await;
    let nats = Nats::start(&[]);
    let fe = frontend(&nats, &["--active-prefill-tokens-threshold", "100", "--worker-health-check-ms", "0"]);
    let honest = async_nats::connect(nats.url.as_str()).await.unwrap();
    let incarnation = unix_ms() * 1000;
    let endpoint = common::FakeWorker::start();
    let _played = played_worker(honest.clone(), 42, incarnation, endpoint.addr.to_string());
    fe.wait_workers(1, Duration::from_secs(10)).await;
    assert_eq!(fe.complete(MODEL).await.0, 200);
    let attacker = async_nats::connect(nats.url.as_str()).await.unwrap();
    let mut seen = attacker.subscribe("loadgate.fe.777").await.unwrap();
    // Frontend 777 (played with the secret): 1,000 tokens on worker 42,
    // then beats for a second.
    let (peer, peer_incarnation) = (777u64, unix_ms() * 1_000_000);
    let subject = format!("loadgate.fe.{peer}");
    let load = RankLoad { active_prefill_tokens: 1000, ..Default::default() };
    let added = Frame::FrontendLoad {
        frontend: peer,
        incarnation: peer_incarnation,
        seq: 1,
        worker: 42,
        worker_incarnation: incarnation,
        rank: 0,
        load,
    };
    honest.publish(subject.clone(), sealed(&subject, &added)).await.unwrap();
    for _ in 0..5 {
        let beat = Frame::FrontendBeat {
            frontend: peer,
            incarnation: peer_incarnation,
            in_flight: 10,
            waiting: 0,
            lines: vec![],
        };
        honest.publish(subject.clone(), sealed(&subject, &beat)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(fe.complete(MODEL).await.0, 529, "its 1,000 tokens count while it beats");
    let mut recorded = Vec::new();
    while let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(100), seen.next()).await {
        recorded.push(m);
    }
    assert!(!recorded.is_empty(), "its frames recorded");
    let died = Instant::now();
    let replaying = replay(attacker, recorded, Duration::from_secs(4));
    tokio::time::sleep_until((died + Duration::from_millis(2500)).into()).await;
    assert_eq!(fe.complete(MODEL).await.0, 200, "a dead frontend's load still counts, kept alive by a replay");
    replaying.await.unwrap();
}
