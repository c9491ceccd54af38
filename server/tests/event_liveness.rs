//! The event plane's time and admission bounds with real `loadgate`
//! processes on 127.0.0.1:
//!
//! - a worker whose connection went silent (its host vanished without a
//!   FIN) does not hold its id forever: `--event-idle-timeout-ms` closes it
//!   and the restarted worker with the same `--worker-id` takes over;
//! - unauthenticated connections cannot keep real workers out: past
//!   `--max-pending-handshakes` a new connection evicts only a pending one
//!   that has not answered within its share of the handshake deadline
//!   (250 ms), else it waits in the listen backlog, so a handshake that
//!   answers within its share survives any flood;
//! - without a secret the frontend warns, once, that the event plane is
//!   unauthenticated; a worker whose id another connection holds says so
//!   in its log, naming the holder's address;
//! - `--worker URL` workers are registered before the event plane starts
//!   (no event peer can take their ids) and what their `/info` names passes
//!   the event plane's limits.

mod common;

use std::collections::VecDeque;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{
    encoded, exclusive, field, random_nonce, register, shared, worker, EventConn, FakeWorker, Frontend, IMPOSTOR_MARK,
    SECRET,
};
use loadgate::wire::{self, Frame};

const MODEL: &str = "liveness-model";

/// Keeps opening connections to `addr` (holding the last `hold`) until
/// dropped; counts them.
struct ConnectFlood {
    stop: Arc<AtomicBool>,
    opened: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ConnectFlood {
    fn start(addr: SocketAddr, hold: usize) -> ConnectFlood {
        let stop = Arc::new(AtomicBool::new(false));
        let opened = Arc::new(AtomicUsize::new(0));
        let (s, o) = (stop.clone(), opened.clone());
        let thread = std::thread::spawn(move || {
            let mut held = VecDeque::new();
            let deadline = Instant::now() + Duration::from_secs(30);
            // Acquire: pairs with the Release store in drop.
            while !s.load(Ordering::Acquire) && Instant::now() < deadline {
                if let Ok(stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
                    held.push_back(stream);
                    // Relaxed: a counter read after the fact.
                    o.fetch_add(1, Ordering::Relaxed);
                }
                if held.len() > hold {
                    held.pop_front();
                }
            }
        });
        ConnectFlood { stop, opened, thread: Some(thread) }
    }

    fn opened(&self) -> usize {
        // Relaxed: a counter.
        self.opened.load(Ordering::Relaxed)
    }
}

impl Drop for ConnectFlood {
    fn drop(&mut self) {
        // Release: the flood's Acquire load sees it.
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Sends completions until one is answered 200 by a real worker (not the
/// impostor), within `within`; returns how long it took.
async fn until_served_by_a_real_worker(fe: &Frontend, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let (status, body) = fe.complete(MODEL).await;
        if status == 200 && !body.contains(IMPOSTOR_MARK) {
            return started.elapsed();
        }
        assert!(started.elapsed() < within, "no answer from the real worker within {within:?} (last: {status} {body})");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A worker id held by a connection that went silent (an old worker whose
/// host vanished) is freed after `--event-idle-timeout-ms`: the restarted
/// worker with the same `--worker-id` registers and serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_frees_its_worker_id_for_the_restarted_worker() {
    let _box = shared().await;
    let fe = Frontend::secured(&["--event-idle-timeout-ms", "1000"]);
    let vanished = FakeWorker::start();
    let mut old = EventConn::authenticated(fe.events, SECRET);
    old.send(&register(777, 1, 1, MODEL, &vanished.addr.to_string())).unwrap();
    fe.wait_workers(1, Duration::from_secs(5)).await;
    let started = Instant::now();
    // The restarted worker, same id: refused while the old connection is held.
    let _w = worker(Some(fe.events), MODEL, Some(SECRET), &["--worker-id", "777"]);
    assert!(fe.proc.wait_log("worker id 777 is held by a live connection", Duration::from_secs(3)));
    let took = until_served_by_a_real_worker(&fe, Duration::from_secs(10)).await;
    eprintln!("the restarted worker served {took:?} after it started (idle timeout 1 s)");
    assert!(old.closed_within(Duration::from_secs(1)), "the silent connection was left open");
    assert!(fe.proc.wait_log("--event-idle-timeout-ms 1000", Duration::from_secs(1)), "no idle-timeout log line");
    assert!(started.elapsed() >= Duration::from_millis(900), "taken over before the idle timeout");
    let before = vanished.requests();
    let served = (0..10).map(|_| fe.complete(MODEL));
    for answer in futures_join(served).await {
        assert_eq!(answer.0, 200, "{answer:?}");
        assert!(!answer.1.contains(IMPOSTOR_MARK), "served by the vanished worker's address: {answer:?}");
    }
    assert_eq!(vanished.requests(), before, "the vanished worker's address got requests after the takeover");
}

/// Awaits each future in turn (the requests are small).
async fn futures_join<F: std::future::Future>(futures: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut out = Vec::new();
    for f in futures {
        out.push(f.await);
    }
    out
}

/// A pending connection's share of the handshake deadline: within it, no
/// new connection evicts it (`events/listener/admission.rs`).
const ANSWER_SHARE: Duration = Duration::from_millis(250);
/// How long the slow honest clients wait between the Challenge and their
/// Proof: far longer than it takes a burst of new connections to fill
/// every pending place (what evicted them before), and 150 ms (60% of the
/// share) short of their share, for the scheduling of a busy machine.
const SLOW_ANSWER: Duration = Duration::from_millis(100);
// The margin: the slow answer takes at most 40% of the share.
const _: () = assert!(SLOW_ANSWER.as_millis() * 5 <= ANSWER_SHARE.as_millis() * 2);

/// Connects (bounded, with retries: under a flood the frontend may leave a
/// new connection in its listen backlog, and a full backlog drops a SYN).
fn connect_under_flood(addr: SocketAddr) -> EventConn {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match EventConn::connect(addr) {
            Ok(conn) => return conn,
            Err(e) => assert!(Instant::now() < deadline, "no connection under the flood within 10 s: {e}"),
        }
    }
}

/// The worker side of the handshake by hand, waiting `pause` between the
/// Challenge and the Proof; the Welcome, or why none came.
fn slow_handshake(conn: &mut EventConn, pause: Duration) -> Result<(), String> {
    // Under the flood a new connection may wait in the backlog for up to
    // about 128 x 250 ms / 64 = 0.5 s before its Challenge.
    let challenge = conn.read_challenge(Duration::from_secs(5)).map_err(|e| format!("reading the challenge: {e}"))?;
    let challenge = challenge.ok_or("no Challenge within 5 s")?;
    std::thread::sleep(pause);
    let nonce = random_nonce();
    let mac = wire::proof_mac(SECRET.as_bytes(), &challenge, &nonce);
    conn.send_raw(&encoded(&Frame::Proof { nonce, mac })).map_err(|e| format!("sending the proof: {e}"))?;
    match conn.read_frame(Duration::from_secs(3)).map_err(|e| format!("reading the welcome: {e}"))? {
        Some(Frame::Welcome { mac }) if wire::verify_welcome_mac(SECRET.as_bytes(), &challenge, &nonce, &mac) => Ok(()),
        other => Err(format!("{other:?} instead of a valid Welcome")),
    }
}

/// An attacker without the secret who holds more idle connections than
/// `--max-event-connections` and keeps opening new ones cannot keep a real
/// worker out, nor evict a handshake that answers within its share of the
/// deadline: a new connection evicts only a pending one past its share
/// (250 ms), and otherwise waits in the listen backlog.
///
/// Margins: the slow client answers 100 ms after its Challenge, 2.5 times
/// short of its share. A worker's connection waits behind at most the
/// listen backlog (128 connections) x 250 ms / 64 places = 0.5 s (a
/// quarter of its 2 s wait for the Challenge); each of its connects that
/// finds the backlog full (the flood refills it) costs 0.5 s and its
/// backoff (50 ms, doubling). It registered 0.26-2.26 s after it started in
/// 30 runs on a busy 2-core machine; it must within 6 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_flood_without_the_secret_does_not_keep_workers_out() {
    let _box = exclusive().await;
    let fe = Frontend::secured(&["--max-event-connections", "128", "--max-pending-handshakes", "64"]);
    let flood = ConnectFlood::start(fe.events, 300);
    let deadline = Instant::now() + Duration::from_secs(10);
    while flood.opened() < 400 {
        assert!(Instant::now() < deadline, "the flood opened only {} connections", flood.opened());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(fe.proc.wait_log("limit hit: --max-pending-handshakes 64", Duration::from_secs(5)));
    // A client that takes its time (within its share) to answer.
    let events = fe.events;
    let slow = tokio::task::spawn_blocking(move || {
        let mut conn = connect_under_flood(events);
        let before = Instant::now();
        let answered = slow_handshake(&mut conn, SLOW_ANSWER);
        (answered, before.elapsed())
    });
    let started = Instant::now();
    let _w = worker(Some(fe.events), MODEL, Some(SECRET), &[]);
    fe.wait_workers(1, Duration::from_secs(10)).await;
    let took = started.elapsed();
    let (answered, slow_took) = slow.await.unwrap();
    // And a raw client doing the handshake at once, still under the flood.
    let mut raw = connect_under_flood(fe.events);
    let handshake = raw.handshake(SECRET);
    eprintln!(
        "under a flood of {} connections: the worker registered {took:?} after it started; a client answering \
         after {SLOW_ANSWER:?}: {answered:?} (its whole handshake {slow_took:?}); raw handshake {:?}",
        flood.opened(),
        handshake.as_ref().map(|_| "ok")
    );
    answered.expect("a handshake answered within its share, under the flood");
    handshake.expect("a handshake under the flood");
    assert!(took < Duration::from_secs(6), "the worker took {took:?} to register under the flood");
    drop(flood);
    fe.assert_still_serving(MODEL, 256.0).await;
}

/// Connections that never answer cannot evict a handshake answered within
/// its share of the deadline, however many arrive meanwhile: with every
/// pending place (8) taken by idle connections, a client reads its
/// Challenge, waits 100 ms (40% of its 250 ms share), and meanwhile 24 new
/// connections arrive (and are taken as far as there is room); then it
/// answers, and is welcomed. Before, the oldest pending connection was
/// evicted for each new one, so this client was gone after 8.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_connections_cannot_evict_a_handshake_answered_within_its_share() {
    let _box = exclusive().await;
    const PLACES: usize = 8;
    let fe = Frontend::secured(&["--max-pending-handshakes", "8"]);
    let events = fe.events;
    let (answered, taken) = tokio::task::spawn_blocking(move || {
        let _idle: Vec<EventConn> = (0..PLACES).map(|_| EventConn::connect(events).expect("connect")).collect();
        let mut slow = connect_under_flood(events);
        let challenge = slow.read_challenge(Duration::from_secs(5)).expect("the challenge").expect("a challenge");
        let answer_at = Instant::now() + SLOW_ANSWER;
        let mut burst: Vec<EventConn> = (0..3 * PLACES).map(|_| connect_under_flood(events)).collect();
        // How many of them the frontend took (each got its Challenge) by
        // the time the client answers.
        let mut taken = vec![false; burst.len()];
        while Instant::now() < answer_at && taken.iter().any(|t| !t) {
            for (conn, taken) in burst.iter_mut().zip(taken.iter_mut()).filter(|(_, t)| !**t) {
                *taken = !matches!(conn.read_challenge(Duration::from_millis(1)), Ok(None));
            }
        }
        std::thread::sleep(answer_at.saturating_duration_since(Instant::now()));
        let nonce = random_nonce();
        let mac = wire::proof_mac(SECRET.as_bytes(), &challenge, &nonce);
        let answered = slow
            .send_raw(&encoded(&Frame::Proof { nonce, mac }))
            .map_err(|e| format!("sending the proof: {e}"))
            .and_then(|()| slow.read_frame(Duration::from_secs(3)).map_err(|e| format!("reading the welcome: {e}")));
        (answered, taken.iter().filter(|t| **t).count())
    })
    .await
    .unwrap();
    let said = answered.as_ref().map(|frame| frame.as_ref().map(Frame::kind_name));
    eprintln!("{taken} of {} new connections taken while the client waited {SLOW_ANSWER:?}: {said:?}", 3 * PLACES);
    assert!(matches!(answered, Ok(Some(Frame::Welcome { .. }))), "the client was evicted: {answered:?}");
}

/// Without a secret the frontend says, once, that its event plane is
/// unauthenticated: any local process can register a worker and so receive
/// prompts. With one it says nothing of the kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_secret_the_frontend_warns_once_that_the_event_plane_is_unauthenticated() {
    let _box = shared().await;
    let warning = "the event plane is unauthenticated, and any local process can register a worker and receive prompts";
    let open = Frontend::start(None, &[]);
    let secured = Frontend::secured(&[]);
    // Logged before the listening line: already there.
    let log = open.proc.stderr();
    assert_eq!(log.matches(warning).count(), 1, "the warning, once, at WARN: {log}");
    assert!(log.lines().any(|l| l.contains(warning) && l.contains("WARN")), "{log}");
    assert!(!secured.proc.stderr().contains("unauthenticated"), "{}", secured.proc.stderr());
}

/// A worker restarted with a fixed `--worker-id` while another secret holder
/// has the id says why it is refused, naming the address the holder
/// announced; the frontend names the holder's connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_id_another_connection_holds_says_so_naming_the_holder() {
    let _box = shared().await;
    let fe = Frontend::secured(&["--event-idle-timeout-ms", "60000"]);
    let mut holder = EventConn::authenticated(fe.events, SECRET);
    holder.send(&register(4242, 1, 1, MODEL, "192.0.2.7:9999")).unwrap();
    fe.wait_workers(1, Duration::from_secs(5)).await;
    let holder_addr = holder.stream.local_addr().unwrap().to_string();
    let w = worker(Some(fe.events), MODEL, Some(SECRET), &["--worker-id", "4242"]);
    let said = "worker id 4242 is held by another connection to this frontend, a worker announcing 192.0.2.7:9999";
    // The refusal reaches the worker's log with its second write after it
    // (a heartbeat every 200 ms): well within 5 s.
    assert!(w.proc.wait_log(said, Duration::from_secs(5)), "the worker does not say who holds its id");
    assert!(!w.proc.stderr().contains("event plane connection lost"), "{}", w.proc.stderr());
    let refused = format!("worker id 4242 is held by a live connection from {holder_addr}");
    assert!(fe.proc.wait_log(&refused, Duration::from_secs(1)), "the frontend does not name the holder");
    assert_eq!(fe.workers().await, Some(1));
}

/// A free 127.0.0.1 port (closed again: a small race, fine for a test).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// An event peer that keeps trying to register a `--worker` worker's id
/// while the frontend starts never gets it: the static workers are
/// registered before the event plane accepts anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_peer_cannot_take_a_static_worker_id_during_startup() {
    let _box = shared().await;
    let w = worker(None, MODEL, None, &["--worker-id", "5150"]);
    let impostor = FakeWorker::start();
    let port = free_port();
    let stop = Arc::new(AtomicBool::new(false));
    let attacker = {
        let (stop, addr) = (stop.clone(), impostor.addr.to_string());
        std::thread::spawn(move || {
            let target: SocketAddr = ([127, 0, 0, 1], port).into();
            let deadline = Instant::now() + Duration::from_secs(30);
            // Acquire: pairs with the Release store below.
            while !stop.load(Ordering::Acquire) && Instant::now() < deadline {
                match EventConn::connect(target) {
                    Ok(mut conn) => {
                        let _ = conn.send(&register(5150, 1, 1, MODEL, &addr));
                        let _ = conn.closed_within(Duration::from_millis(200));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(1)),
                }
            }
        })
    };
    let port_arg = port.to_string();
    let args = [
        "frontend",
        "--http-host",
        "127.0.0.1",
        "--http-port",
        "0",
        "--admin-port",
        "0",
        "--event-port",
        port_arg.as_str(),
        "--worker",
        w.http.as_str(),
    ];
    let (proc, line) = common::spawn("frontend", &args, &[]);
    let http = format!("http://{}", field(&line, "http").expect("http= in the listening line"));
    let client = common::client();
    // Let the attacker try against the running event plane too.
    assert!(proc.wait_log("worker id 5150 is registered by --worker", Duration::from_secs(5)), "attacker not refused");
    for _ in 0..20 {
        let (status, body) = common::complete(&client, &http, MODEL, None).await;
        assert_eq!(status, 200, "{body}");
        assert!(!body.contains(IMPOSTOR_MARK), "a static worker's id was taken: {body}");
    }
    // Release: the attacker's Acquire load sees it.
    stop.store(true, Ordering::Release);
    attacker.join().unwrap();
    assert_eq!(impostor.requests(), 0, "the impostor received requests");
}

/// Runs `loadgate frontend <args>` (no secret), which must exit (bounded);
/// returns its stderr.
fn frontend_refuses(args: &[&str]) -> String {
    common::frontend_refuses(args, &[])
}

/// What a `--worker URL`'s `/info` names passes the same limits as an
/// event-plane Register; past one, the frontend refuses to start, naming
/// the flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_url_registrations_pass_the_event_plane_limits() {
    let _box = shared().await;
    let long_name = "m".repeat(40);
    let long = worker(None, &long_name, None, &[]);
    let wide = worker(None, MODEL, None, &["--dp-size", "4"]);
    let a = worker(None, MODEL, None, &["--worker-id", "1"]);
    let b = worker(None, "other-model", None, &["--worker-id", "2"]);
    let cases: [(Vec<&str>, &str); 5] = [
        (vec!["--max-name-len", "16", "--worker", &long.http], "--max-name-len 16"),
        (vec!["--max-dp-size", "2", "--worker", &wide.http], "--max-dp-size 2"),
        (vec!["--max-workers", "1", "--worker", &a.http, "--worker", &b.http], "--max-workers 1"),
        (vec!["--max-models", "1", "--model", "kept", "--worker", &a.http], "--max-models 1"),
        (vec!["--worker", &a.http, "--worker", &a.http], "already registered by another --worker"),
    ];
    for (args, expected) in cases {
        let stderr = frontend_refuses(&args);
        assert!(stderr.contains(expected), "{args:?}: expected {expected:?} in stderr: {stderr}");
        let line = stderr.lines().find(|l| l.contains(expected)).unwrap_or_default();
        eprintln!("{args:?} refused: {line}");
    }
}

/// A worker without the event secret, against a frontend that has one,
/// says what is wrong (the frontend's challenge went unanswered) instead of
/// only "Broken pipe".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_without_the_secret_says_the_frontend_expects_one() {
    let _box = shared().await;
    let fe = Frontend::secured(&[]);
    let w = worker(Some(fe.events), MODEL, None, &[]);
    let said = "the frontend expects an event secret (it sent a handshake challenge) and this worker has none";
    // Refused at its first write after the Register (a heartbeat every 200
    // ms), then at each retry: well within 5 s.
    assert!(w.proc.wait_log(said, Duration::from_secs(5)), "{}", w.proc.stderr());
    assert!(!w.proc.stderr().contains("Broken pipe"), "{}", w.proc.stderr());
    assert_eq!(fe.workers().await, Some(0));
}

/// `--load-staleness-ms 0` took every event-plane worker out of routing for
/// good (the connection's silence window is the smallest of the liveness
/// flags, and nothing arrives within 0 ms); it is refused at start, naming
/// the flag. Found by a review.
#[test]
fn a_load_staleness_of_zero_is_refused() {
    let stderr = frontend_refuses(&["--load-staleness-ms", "0"]);
    assert!(stderr.contains("--load-staleness-ms takes"), "{stderr}");
}
