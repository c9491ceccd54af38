//! The event plane's time and admission bounds with real `loadgate`
//! processes on 127.0.0.1:
//!
//! - a worker whose connection went silent (its host vanished without a
//!   FIN) does not hold its id forever: `--event-idle-timeout-ms` closes it
//!   and the restarted worker with the same `--worker-id` takes over;
//! - unauthenticated connections cannot keep real workers out: past
//!   `--max-pending-handshakes` (or at `--max-event-connections`) the
//!   oldest pending connection is evicted, not the newcomer refused;
//! - `--worker URL` workers are registered before the event plane starts
//!   (no event peer can take their ids) and what their `/info` names passes
//!   the event plane's limits.

mod common;

use std::collections::VecDeque;
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{exclusive, field, register, shared, worker, EventConn, FakeWorker, Frontend, IMPOSTOR_MARK, SECRET};

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

/// An attacker without the secret who holds more idle connections than
/// `--max-event-connections` and keeps opening new ones cannot keep a real
/// worker out: the oldest pending connection is evicted for each newcomer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_flood_without_the_secret_does_not_keep_workers_out() {
    let _box = exclusive().await;
    let fe = Frontend::secured(&["--max-event-connections", "128", "--max-pending-handshakes", "32"]);
    let flood = ConnectFlood::start(fe.events, 300);
    let deadline = Instant::now() + Duration::from_secs(10);
    while flood.opened() < 400 {
        assert!(Instant::now() < deadline, "the flood opened only {} connections", flood.opened());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let started = Instant::now();
    let _w = worker(Some(fe.events), MODEL, Some(SECRET), &[]);
    fe.wait_workers(1, Duration::from_secs(10)).await;
    let took = started.elapsed();
    // And a raw client doing the handshake by hand, still under the flood.
    let mut raw = EventConn::connect(fe.events).expect("connect");
    let handshake = raw.handshake(SECRET);
    eprintln!(
        "under a flood of {} connections: the worker registered {took:?} after it started; raw handshake {:?}",
        flood.opened(),
        handshake.as_ref().map(|_| "ok")
    );
    handshake.expect("a handshake under the flood");
    // Without eviction it took about 8 s (until the flood's own connections
    // timed out at a moment it was not reopening them); with it, tens of ms.
    assert!(took < Duration::from_secs(3), "the worker took {took:?} to register under the flood");
    assert!(fe.proc.wait_log("limit hit: --max-pending-handshakes 32", Duration::from_secs(1)));
    drop(flood);
    fe.assert_still_serving(MODEL, 256.0).await;
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
    let mut child = Command::new(common::bin())
        .arg("frontend")
        .args(["--http-host", "127.0.0.1", "--http-port", "0", "--event-port", "0", "--admin-port", "0"])
        .args(args)
        .env_remove("LOADGATE_EVENT_SECRET")
        .env_remove("LOADGATE_EVENT_SECRET_PREVIOUS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn loadgate");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            let out = child.wait_with_output().expect("output");
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            assert!(!status.success(), "the frontend started with {args:?}; stderr: {stderr}");
            assert!(!String::from_utf8_lossy(&out.stdout).contains("listening"), "{args:?} listened");
            return stderr;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the frontend with {args:?} neither started nor exited within 20 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
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
