//! The NATS event plane against a client without the secret, and a worker
//! on both planes whose TCP path breaks: a real `nats-server` (Debian's,
//! installed by `scripts/prepare-nats-server`), real `loadgate` processes,
//! raw NATS clients. `#[ignore]` in plain `cargo test`; `.ci/run` runs them
//! with `--ignored`, where a missing server fails them.
//!
//! Margins: a flood's effect is compared with the same worker's traffic
//! measured just before (at most 4 times it, where unbounded it was over a
//! thousand times); every wait is bounded (10 s).

#[path = "common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::{plane, Nats, SECRET};
use futures_util::StreamExt as _;

const MODEL: &str = "nats-model";

/// A simulated worker on the NATS plane of `nats` (and, with `tcp`, on the
/// TCP plane to that address too).
fn worker(nats: &Nats, id: u64, tcp: Option<std::net::SocketAddr>) -> common::Worker {
    let mut flags = plane(nats);
    flags.extend(["--worker-id".to_owned(), id.to_string()]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    common::worker(tcp, MODEL, Some(SECRET), &flags)
}

/// Messages seen on `sub` within `window`.
async fn count_for(sub: &mut async_nats::Subscriber, window: Duration) -> usize {
    let until = tokio::time::Instant::now() + window;
    let mut n = 0;
    while let Ok(Some(_)) = tokio::time::timeout_at(until, sub.next()).await {
        n += 1;
    }
    n
}

/// `{ns}.hello` carries no seal: any client on the namespace can publish it,
/// and each answer (a Register and every rank's load) costs every frontend
/// an authenticated frame each. A flood of hellos (about 20,000 in 2 s) made
/// one worker send 35,420 frames in 2 s against 26 before; now a worker
/// answers at most one hello per half heartbeat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nats-server (scripts/prepare-nats-server); run by .ci/run"]
async fn a_hello_flood_without_the_secret_is_not_amplified_by_workers() {
    let _box = common::shared().await;
    let nats = Nats::start(&[]);
    let _worker = worker(&nats, 1, None);
    let observer = async_nats::connect(nats.url.as_str()).await.unwrap();
    let mut frames = observer.subscribe("loadgate.ev.>").await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = count_for(&mut frames, Duration::from_secs(2)).await;
    let attacker = async_nats::connect(nats.url.as_str()).await.unwrap();
    let flood = tokio::spawn(async move {
        let start = Instant::now();
        let mut sent = 0u64;
        while start.elapsed() < Duration::from_secs(2) {
            for _ in 0..100 {
                attacker.publish("loadgate.hello", bytes::Bytes::new()).await.unwrap();
                sent += 1;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        attacker.flush().await.unwrap();
        sent
    });
    let during = count_for(&mut frames, Duration::from_secs(2)).await;
    let sent = tokio::time::timeout(Duration::from_secs(10), flood).await.unwrap().unwrap();
    eprintln!("the worker's frames in 2 s: {before} before, {during} during a flood of {sent} hellos");
    assert!(during <= 4 * before.max(10), "{during} frames answering {sent} unsealed hellos ({before} before)");
}

/// A TCP relay from a free port to `to`; aborting its task cuts every
/// connection and stops listening.
async fn relay(to: std::net::SocketAddr) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut conns = tokio::task::JoinSet::new();
        loop {
            let Ok((mut inbound, _)) = listener.accept().await else { return };
            conns.spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(to).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    (addr, task)
}

/// A worker on both planes (`--event-plane nats` and `--frontend`, the
/// documented migration) whose TCP path to the frontend breaks: the TCP
/// plane deregisters it after its grace, and the NATS plane, which still
/// hears it every heartbeat, registers it again (it took each heartbeat for
/// a repeat of a life it knew and kept the worker out for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nats-server (scripts/prepare-nats-server); run by .ci/run"]
async fn a_worker_on_both_planes_is_routed_again_while_nats_still_hears_it() {
    let _box = common::shared().await;
    let nats = Nats::start(&[]);
    let fe = common::frontend(&nats, &[]);
    let (via, cut) = relay(fe.events).await;
    let _worker = worker(&nats, 5, Some(via));
    fe.wait_workers(1, Duration::from_secs(10)).await;
    assert_eq!(fe.complete(MODEL).await.0, 200);
    cut.abort();
    let _ = cut.await;
    // Past the TCP plane's grace (500 ms) and a few heartbeats (200 ms).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if fe.workers().await == Some(1) && fe.complete(MODEL).await.0 == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "a worker NATS still hears stayed out of routing");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A model name whose NATS subject would pass the envelope's limit (bytes
/// outside `A-Z a-z 0-9 _ -` take three each): the worker refuses to start,
/// saying why, where it used to run and log "frame not sealed" at every
/// send, never registered.
#[test]
#[ignore = "needs nats-server (scripts/prepare-nats-server); run by .ci/run"]
fn a_model_name_too_long_for_a_subject_stops_the_worker_at_start() {
    let nats = Nats::start(&[]);
    let model = ".".repeat(400);
    let mut flags = plane(&nats);
    flags.extend(["--model".to_owned(), model]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let stderr = common::worker_refuses(&flags, &[("LOADGATE_EVENT_SECRET", SECRET)]);
    assert!(stderr.contains("makes a NATS subject of"), "{stderr}");
}

/// Found by a review: on the NATS plane any holder of the event secret (a
/// compromised worker: the insider the TCP plane's ownership stops) took a
/// live worker's id by sealing a Register of it with a higher incarnation,
/// and its own address: the frontend took it for a restart, sent that
/// worker's share of the prompts to the impostor, and dropped every frame
/// of the real worker as an older life, for good with incarnation
/// `u64::MAX`. Now a newer incarnation replaces a registered one only once
/// that one is silent (`--event-silence-ms`), as a TCP connection's id is
/// free only once its connection is gone: the real worker keeps its id and
/// every request, and a worker that really restarted still comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nats-server (scripts/prepare-nats-server); run by .ci/run"]
async fn an_insider_cannot_take_a_live_workers_id_with_a_newer_incarnation() {
    let _box = common::shared().await;
    let nats = Nats::start(&[]);
    let fe = common::frontend(&nats, &[]);
    let _victim = worker(&nats, 5, None);
    fe.wait_workers(1, Duration::from_secs(10)).await;
    assert_eq!(fe.complete(MODEL).await.0, 200);
    let impostor = common::FakeWorker::start();
    let insider = async_nats::connect(nats.url.as_str()).await.expect("connects");
    // A heartbeat's worth (a second).
    publish_register(&insider, 5, u64::MAX, &impostor, 5).await;
    the_victim_serves(&fe, &impostor, 20).await;
    assert_eq!(fe.workers().await, Some(1));
}

/// As above, across the planes: a frontend on the NATS plane still takes
/// TCP workers (the documented migration), and a Register sealed on NATS
/// with another incarnation took the id of a worker whose live TCP
/// connection holds it (the TCP plane's ownership never saw it). Now it
/// waits, as on one plane, until that worker is silent or gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nats-server (scripts/prepare-nats-server); run by .ci/run"]
async fn an_insider_on_nats_cannot_take_the_id_of_a_tcp_worker() {
    let _box = common::shared().await;
    let nats = Nats::start(&[]);
    let fe = common::frontend(&nats, &[]);
    let victim = common::worker(Some(fe.events), MODEL, Some(SECRET), &["--worker-id", "6"]);
    fe.wait_workers(1, Duration::from_secs(10)).await;
    assert_eq!(fe.complete(MODEL).await.0, 200);
    let impostor = common::FakeWorker::start();
    let insider = async_nats::connect(nats.url.as_str()).await.expect("connects");
    // Another life, and the victim's own life (its open /info names it)
    // at the impostor's address.
    let own = victim_incarnation(&fe, &victim).await;
    for incarnation in [u64::MAX, own] {
        publish_register(&insider, 6, incarnation, &impostor, 3).await;
    }
    the_victim_serves(&fe, &impostor, 20).await;
}

/// The other way across the planes: a worker the NATS plane registered has
/// no TCP connection holding its id, so an authenticated TCP connection's
/// Register of that id with another incarnation took it (and its requests).
/// (Until the worker's next Register on NATS took it back: a takeover the
/// insider renews from a new connection each time.) Now the TCP plane
/// refuses an id the NATS plane holds while that worker is heard there, as
/// it refuses one another connection holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nats-server (scripts/prepare-nats-server); run by .ci/run"]
async fn an_insider_on_tcp_cannot_take_the_id_of_a_nats_worker() {
    let _box = common::shared().await;
    let nats = Nats::start(&[]);
    // The victim re-announces itself every 3 s (its Register would undo a
    // takeover): the frontend waits 20 s before calling it silent.
    let fe = common::frontend(&nats, &["--event-silence-ms", "20000", "--event-idle-timeout-ms", "60000"]);
    let mut flags = plane(&nats);
    flags.extend(["--worker-id", "7", "--heartbeat-ms", "3000"].map(str::to_owned));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let victim = common::worker(None, MODEL, Some(SECRET), &flags);
    fe.wait_workers(1, Duration::from_secs(10)).await;
    assert_eq!(fe.complete(MODEL).await.0, 200);
    let impostor = common::FakeWorker::start();
    // Another life, and the victim's own life (its open /info names it)
    // at the impostor's address, each from a new connection.
    let own = victim_incarnation(&fe, &victim).await;
    for incarnation in [u64::MAX, own] {
        let mut insider = common::EventConn::authenticated(fe.events, SECRET);
        let _ = insider.send(&common::register(7, incarnation, 1, MODEL, &impostor.addr.to_string()));
        tokio::time::sleep(Duration::from_millis(20)).await;
        the_victim_serves(&fe, &impostor, 10).await;
    }
}

/// Publishes, `times` times 200 ms apart, a Register of `worker` in
/// `incarnation` at the impostor's address, sealed anew each time with the
/// secret (as every worker's frames are).
async fn publish_register(
    insider: &async_nats::Client,
    worker: u64,
    incarnation: u64,
    impostor: &common::FakeWorker,
    times: usize,
) {
    use bytes::BytesMut;
    use loadgate::wire::envelope::seal;
    use loadgate::wire::Frame;

    let subject = format!("loadgate.ev.{MODEL}.{worker}");
    let register = Frame::Register {
        worker,
        incarnation,
        dp_size: 1,
        model: MODEL.to_owned(),
        http_addr: impostor.addr.to_string(),
    };
    for _ in 0..times {
        let mut buf = BytesMut::new();
        seal(SECRET.as_bytes(), &subject, common::unix_ms(), &register, &mut buf).unwrap();
        insider.publish(subject.clone(), buf.freeze()).await.unwrap();
        insider.flush().await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Sends `n` completions after a takeover attempt: every one is answered
/// 200 by the victim, none by the impostor.
async fn the_victim_serves(fe: &common::Frontend, impostor: &common::FakeWorker, n: usize) {
    let mut statuses = Vec::new();
    for _ in 0..n {
        let (status, body) = fe.complete(MODEL).await;
        statuses.push(if body.contains(common::IMPOSTOR_MARK) { 0 } else { status });
    }
    eprintln!("{n} requests after the takeover: {statuses:?}; the impostor got {}", impostor.requests());
    assert_eq!(impostor.requests(), 0, "the impostor took the victim's requests: {statuses:?}");
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
}

/// The incarnation `victim` names in its `/info` (open without a proof).
async fn victim_incarnation(fe: &common::Frontend, victim: &common::Worker) -> u64 {
    let info: serde_json::Value =
        fe.client.get(format!("{}/info", victim.http)).send().await.unwrap().json().await.unwrap();
    info["incarnation"].as_u64().expect("an incarnation in /info")
}

/// Found by a review: a worker that registers and leaves in a loop on the
/// NATS plane (as a sidecar does when its engine flaps between failing and
/// answering) made every frontend log two `info` lines a cycle, uncounted
/// (worker registered, worker deregistered (NATS)). Now they pass one
/// throttle (50 a second, the held-back ones counted), as on the TCP plane.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nats-server (scripts/prepare-nats-server); run by .ci/run"]
async fn a_worker_that_registers_and_leaves_in_a_loop_cannot_flood_the_log() {
    let _box = common::shared().await;
    let nats = Nats::start(&[]);
    let fe = logging_frontend(&nats, &[]);
    let started = Instant::now();
    publish_lives(&nats, 92, 400).await;
    // Time for the frontend to apply them all (the bound counts it too).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let log = fe.proc.stderr();
    let elapsed = started.elapsed();
    let lines = log.lines().filter(|l| l.contains("worker registered (NATS)") || l.contains("deregistered (NATS)"));
    let lines = lines.count();
    // 50 a second, and a second more of slack for the bucket's edges.
    let bound = 50 * (elapsed.as_secs() as usize + 2);
    eprintln!("400 NATS register-deregister cycles in {elapsed:?}: {lines} log lines");
    assert!(lines >= 2, "the first cycle is logged:\n{log}");
    assert!(lines <= bound, "{lines} log lines about 400 cycles of one worker in {elapsed:?} (at most {bound})");
}

/// The default log filter (`info`, no access log), as a deployment runs.
const DEPLOYED_LOG: (&str, &str) = ("RUST_LOG", "info,loadgate::access=off");

/// A frontend with the secret on the NATS plane of `nats`, with the
/// deployed log filter and `extra` flags.
fn logging_frontend(nats: &Nats, extra: &[&str]) -> common::Frontend {
    let mut flags = plane(nats);
    flags.extend(extra.iter().map(|s| (*s).to_owned()));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    common::Frontend::start_with_env(&[("LOADGATE_EVENT_SECRET", SECRET), DEPLOYED_LOG], &flags)
}

/// Publishes `lives` Registers of `worker` (incarnation 1), each followed
/// by its Deregister, sealed with the secret 1 ms after the frame before
/// (a life's Register after the Deregister that ended the previous one;
/// 800 frames stay well within the 30 s clock window).
async fn publish_lives(nats: &Nats, worker: u64, lives: u64) {
    use bytes::BytesMut;
    use loadgate::wire::envelope::seal;
    use loadgate::wire::Frame;

    let insider = async_nats::connect(nats.url.as_str()).await.expect("connects");
    let subject = format!("loadgate.ev.{MODEL}.{worker}");
    let http_addr = "127.0.0.1:1".to_owned();
    let register = Frame::Register { worker, incarnation: 1, dp_size: 1, model: MODEL.to_owned(), http_addr };
    let deregister = Frame::Deregister { worker, incarnation: 1 };
    let base = common::unix_ms();
    for (i, frame) in (0..lives).flat_map(|_| [&register, &deregister]).enumerate() {
        let mut buf = BytesMut::new();
        seal(SECRET.as_bytes(), &subject, base + i as u64, frame, &mut buf).unwrap();
        insider.publish(subject.clone(), buf.freeze()).await.unwrap();
    }
    insider.flush().await.unwrap();
}

/// Floods from a client without the secret, as fast as it publishes: a
/// junk frame on a worker subject and a hello, in turn, until aborted.
fn flood(nats: &Nats) -> tokio::task::JoinHandle<()> {
    let url = nats.url.clone();
    tokio::spawn(async move {
        let attacker = async_nats::connect(url.as_str()).await.expect("the attacker connects");
        let junk = bytes::Bytes::from(vec![0u8; 120]);
        loop {
            for w in 0..64u64 {
                // An outage: the client reconnects by itself.
                let _ = attacker.publish(format!("loadgate.ev.{MODEL}.{w}"), junk.clone()).await;
                let _ = attacker.publish("loadgate.hello", bytes::Bytes::new()).await;
            }
            tokio::task::yield_now().await;
        }
    })
}

/// Found by a review: the NATS client raises an event for every message a
/// subscription drops (its buffer, `--nats-buffer`, full), and logged each
/// at `info` (and the worker's callback once more): a client without the
/// secret flooding past what a frontend or a worker reads wrote a line per
/// message it sent. Now at most one a second in each process. The flood
/// overflows both buffers for sure: each process is stopped (SIGSTOP) for
/// 300 ms three times meanwhile, and reads what queued at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nats-server (scripts/prepare-nats-server); run by .ci/run"]
async fn a_flood_past_the_nats_buffers_cannot_flood_the_log() {
    let _box = common::exclusive().await;
    let nats = Nats::start(&[]);
    let fe = logging_frontend(&nats, &["--nats-buffer", "64"]);
    let mut flags = plane(&nats);
    flags.extend(["--worker-id", "9", "--nats-buffer", "64"].map(str::to_owned));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let worker = common::worker_with_env(None, MODEL, &[("LOADGATE_EVENT_SECRET", SECRET), DEPLOYED_LOG], &flags);
    fe.wait_workers(1, Duration::from_secs(10)).await;
    let started = Instant::now();
    let flooding = flood(&nats);
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        for pid in [fe.proc.pid(), worker.proc.pid()] {
            common::signal(pid, "STOP");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        for pid in [fe.proc.pid(), worker.proc.pid()] {
            common::signal(pid, "CONT");
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    flooding.abort();
    let elapsed = started.elapsed();
    // One a second, and one more for the edges of the throttle's window.
    let bound = elapsed.as_secs() as usize + 2;
    for (name, log) in [("frontend", fe.proc.stderr()), ("worker", worker.proc.stderr())] {
        let lines = log.lines().filter(|l| l.contains("slow consumer")).count();
        eprintln!("the {name} logged {lines} lines about a full subscription in {elapsed:?}");
        assert!(lines >= 1, "the {name}'s subscription never overflowed (or it said nothing):\n{log}");
        assert!(lines <= bound, "the {name} logged {lines} lines about a full subscription (at most {bound})");
    }
}

/// Found by a review: the NATS client queues at most 128 of its events
/// and drops the rest, and under a flood past the frontend's buffer it
/// raises one per message dropped; the plane took its connection state
/// from those events. A Disconnected lost with them made the outage that
/// followed the workers' silence: every worker out of routing after
/// `--event-silence-ms`, forgotten after the idle timeout, for as long as
/// NATS was away. (A Connected lost made every later silence an outage.)
/// Here the frontend is stopped (SIGSTOP) under the flood, NATS dies, and
/// the frontend resumes: it reads the flood queued for it (one event per
/// message past its buffer), then the end of the connection. Now the plane
/// reads the client's own state. Margins: forgotten 1.5 s after its last
/// frame against an outage of 3 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nats-server (scripts/prepare-nats-server); run by .ci/run"]
async fn an_outage_that_begins_under_a_flood_is_no_workers_silence() {
    let _box = common::exclusive().await;
    let nats = Nats::start(&[]);
    let port: u16 = nats.url.rsplit(':').next().unwrap().parse().unwrap();
    let flags = ["--nats-buffer", "64", "--event-silence-ms", "500", "--event-idle-timeout-ms", "1500"];
    let fe = logging_frontend(&nats, &flags);
    let _worker = worker(&nats, 10, None);
    fe.wait_workers(1, Duration::from_secs(10)).await;
    let flooding = flood(&nats);
    tokio::time::sleep(Duration::from_millis(300)).await;
    common::signal(fe.proc.pid(), "STOP");
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(nats);
    flooding.abort();
    common::signal(fe.proc.pid(), "CONT");
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Still registered. (Maybe out of routing: the flood may have dropped
    // its frames past the silence before the outage, its silence then.)
    assert_eq!(fe.workers().await, Some(1), "the worker stayed in the last view through the outage");
    // NATS back: the frontend hears the worker again and routes to it.
    let _nats = Nats::start_on(port, &[]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while fe.complete(MODEL).await.0 != 200 || fe.workers().await != Some(1) {
        assert!(Instant::now() < deadline, "the worker is not routed again after the outage");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Found by a review: while NATS is away the client queues what is
/// published (up to `--nats-buffer`) and sends all of it when NATS is back:
/// a worker's heartbeats and loads of the whole outage (and a sharing
/// frontend's beats), each an HMAC check at every frontend, the loads
/// within the clock window applied again, in order, as stale as the outage
/// is long. Now nothing is published while disconnected: the latest state
/// goes out with the next heartbeat (or a frontend's hello, or a beat). An
/// observer that reconnects within milliseconds of nats-server's return
/// (the others back off: hundreds of milliseconds after a 3 s outage)
/// counts the frames sealed while NATS was away, from 500 ms after it died
/// (a frame sealed as it died may be queued: margin for a busy machine).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nats-server (scripts/prepare-nats-server); run by .ci/run"]
async fn nothing_published_while_nats_is_away_goes_out_stale_on_its_return() {
    use loadgate::wire::envelope::open;

    let _box = common::shared().await;
    let nats = Nats::start(&[]);
    let port: u16 = nats.url.rsplit(':').next().unwrap().parse().unwrap();
    let _fe = common::frontend(&nats, &["--share-heartbeat-ms", "10"]);
    let mut flags = plane(&nats);
    flags.extend(["--worker-id", "11", "--heartbeat-ms", "5"].map(str::to_owned));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let _worker = common::worker(None, MODEL, Some(SECRET), &flags);
    let observer = async_nats::ConnectOptions::new()
        .reconnect_delay_callback(|_| Duration::from_millis(2))
        .max_reconnects(None)
        .connect(nats.url.as_str())
        .await
        .expect("the observer connects");
    let mut frames = observer.subscribe("loadgate.>").await.unwrap();
    // (kind of sender, when sealed) of each sealed frame, until `until`.
    async fn next(frames: &mut async_nats::Subscriber, until: Instant) -> Option<(&'static str, u64)> {
        loop {
            let message = tokio::time::timeout_at(until.into(), frames.next()).await.ok()??;
            let Ok(sealed) = open(&[SECRET.as_bytes()], &message.subject, &message.payload) else { continue };
            let kind = if message.subject.starts_with("loadgate.fe.") { "frontend" } else { "worker" };
            return Some((kind, sealed.sent_ms));
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut heard = std::collections::HashSet::new();
    while heard.len() < 2 {
        let (kind, _) = next(&mut frames, deadline).await.expect("the worker and the frontend publish");
        heard.insert(kind);
    }
    let died = common::unix_ms();
    drop(nats);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let back = common::unix_ms();
    let _nats = Nats::start_on(port, &[]);
    // Until both publish again (bounded), and a second more.
    let (mut stale, mut fresh) = (Vec::new(), std::collections::HashSet::new());
    let mut until = Instant::now() + Duration::from_secs(10);
    while let Some((kind, sent_ms)) = next(&mut frames, until).await {
        if sent_ms >= back {
            if fresh.insert(kind) && fresh.len() == 2 {
                until = Instant::now() + Duration::from_secs(1);
            }
        } else if sent_ms > died + 500 {
            stale.push(kind);
        }
    }
    assert_eq!(fresh.len(), 2, "the worker and the frontend publish again after the outage: {fresh:?}");
    let of = |who| stale.iter().filter(|k| **k == who).count();
    let (worker, frontend) = (of("worker"), of("frontend"));
    eprintln!(
        "frames sealed while NATS was away, sent on its return: {worker} of the worker, {frontend} of the frontend"
    );
    assert!(stale.is_empty(), "{worker} frames of the worker and {frontend} of the frontend sealed during the outage");
}

/// Found by a review: a holder of the secret naming one frontend id with a
/// new incarnation in every frame (a restart each time, by the plane's
/// rules) made every sharing frontend log an `info` line per frame
/// ("frontend restarted"), uncounted. Now the lines about the other
/// frontends pass one throttle (50 a second, the held-back ones counted),
/// as those about the workers' lives do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nats-server (scripts/prepare-nats-server); run by .ci/run"]
async fn a_frontend_id_restarting_in_every_frame_cannot_flood_the_log() {
    use bytes::BytesMut;
    use loadgate::wire::envelope::seal;
    use loadgate::wire::Frame;

    let _box = common::shared().await;
    let nats = Nats::start(&[]);
    let fe = logging_frontend(&nats, &[]);
    let started = Instant::now();
    let insider = async_nats::connect(nats.url.as_str()).await.expect("connects");
    let subject = "loadgate.fe.77";
    for incarnation in 1..=1000u64 {
        let beat = Frame::FrontendBeat { frontend: 77, incarnation, in_flight: 0, waiting: 0, lines: vec![] };
        let mut buf = BytesMut::new();
        seal(SECRET.as_bytes(), subject, common::unix_ms(), &beat, &mut buf).unwrap();
        insider.publish(subject, buf.freeze()).await.unwrap();
    }
    insider.flush().await.unwrap();
    // Time for the frontend to apply them all (the bound counts it too).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let log = fe.proc.stderr();
    let elapsed = started.elapsed();
    let lines = log.lines().filter(|l| l.contains("frontend restarted") || l.contains("joined the shared load"));
    let lines = lines.count();
    // 50 a second, and a second more of slack for the bucket's edges.
    let bound = 50 * (elapsed.as_secs() as usize + 2);
    eprintln!("1000 restarts of one frontend id in {elapsed:?}: {lines} log lines");
    assert!(lines >= 2, "the first restart is logged:\n{log}");
    assert!(
        lines <= bound,
        "{lines} log lines about 1000 restarts of one frontend id in {elapsed:?} (at most {bound})"
    );
}
