//! A sidecar (`loadgate worker --engine`) that leaves routing when its
//! engine stops answering and rejoins when it answers again, while a
//! frontend still holds it: its Deregister was lost (the network between
//! them was cut at that moment), so the frontend keeps the worker through
//! its grace and the new Register (same id, same incarnation) keeps its
//! slots. The sidecar's report numbering survives the rejoin, so its new
//! load applies at once (issue 21, item 3; before, every report of the new
//! publisher was stale until its count caught up with the old one's, and
//! the worker stayed frozen at its last load meanwhile).
//!
//! The network is a relay in this test process between the sidecar and the
//! frontend's event port: it can cut a connection (the worker's bytes are
//! dropped, the frontend's side stays open, as in a partition), and when the
//! sidecar connects again it closes the cut connections' frontend side
//! first (the partition heals: the frontend sees the old connection close,
//! then the new one arrive).

mod common;
#[allow(dead_code)]
#[path = "sidecar/fake_engine.rs"]
mod fake_engine;

use std::io::{Read as _, Write as _};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{exclusive, expect_field, metrics_text, Frontend, SECRET};
use fake_engine::FakeEngine;

/// How often the relay's threads look at the stop flag.
const RELAY_TICK: Duration = Duration::from_millis(50);

/// One relayed connection: the frontend's side, and whether it is cut.
struct RelayLink {
    upstream: TcpStream,
    cut: AtomicBool,
}

struct RelayShared {
    frontend: SocketAddr,
    stop: AtomicBool,
    links: Mutex<Vec<Arc<RelayLink>>>,
    /// Cut connections the worker closed (its bytes, a Deregister too, lost).
    closed_while_cut: AtomicUsize,
}

/// A TCP relay to `frontend` (see the module docs); stops on drop.
struct Relay {
    addr: SocketAddr,
    shared: Arc<RelayShared>,
    thread: Option<JoinHandle<()>>,
}

impl Relay {
    fn start(frontend: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(RelayShared {
            frontend,
            stop: AtomicBool::new(false),
            links: Mutex::new(Vec::new()),
            closed_while_cut: AtomicUsize::new(0),
        });
        let s = shared.clone();
        let thread = std::thread::spawn(move || {
            // Acquire: pairs with the Release store in drop.
            while !s.stop.load(Ordering::Acquire) {
                match listener.accept() {
                    Ok((worker, _)) => relay_one(&s, worker),
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        Relay { addr, shared, thread: Some(thread) }
    }

    /// Cuts every connection open now: the worker's bytes are dropped from
    /// here on; the frontend's side stays open.
    fn cut(&self) {
        for link in self.shared.links.lock().unwrap().iter() {
            // Release: the pump's Acquire load sees it before its next write.
            link.cut.store(true, Ordering::Release);
        }
    }

    fn closed_while_cut(&self) -> usize {
        // Acquire: pairs with the pump's Release increment.
        self.shared.closed_while_cut.load(Ordering::Acquire)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        // Release: every relay thread's Acquire load sees it.
        self.shared.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        for link in self.shared.links.lock().unwrap().drain(..) {
            let _ = link.upstream.shutdown(Shutdown::Both);
        }
    }
}

/// A new connection from the worker: the cut connections' frontend side
/// closes first, then the new one is relayed both ways.
fn relay_one(shared: &Arc<RelayShared>, worker: TcpStream) {
    let mut links = shared.links.lock().unwrap();
    for old in links.drain(..) {
        let _ = old.upstream.shutdown(Shutdown::Both);
    }
    let Ok(upstream) = TcpStream::connect_timeout(&shared.frontend, Duration::from_secs(2)) else { return };
    let link = Arc::new(RelayLink { upstream, cut: AtomicBool::new(false) });
    links.push(link.clone());
    drop(links);
    let (Ok(worker_in), Ok(worker_out), Ok(up_in), Ok(up_out)) =
        (worker.try_clone(), worker.try_clone(), link.upstream.try_clone(), link.upstream.try_clone())
    else {
        return;
    };
    let s = shared.clone();
    let to_frontend = link.clone();
    std::thread::spawn(move || {
        let cut = pump(&s, worker_in, up_out, Some(&to_frontend.cut));
        if cut {
            // Release: pairs with the test's Acquire load.
            s.closed_while_cut.fetch_add(1, Ordering::Release);
        }
    });
    let s = shared.clone();
    std::thread::spawn(move || {
        pump(&s, up_in, worker_out, None);
    });
}

/// Copies `from` to `to` until EOF, an error or stop; bytes are dropped
/// while `cut` is set, and then `to` is left open. Returns whether it ended
/// cut.
fn pump(shared: &RelayShared, mut from: TcpStream, mut to: TcpStream, cut: Option<&AtomicBool>) -> bool {
    let is_cut = || cut.is_some_and(|c| c.load(Ordering::Acquire));
    let _ = from.set_read_timeout(Some(RELAY_TICK));
    let _ = to.set_write_timeout(Some(Duration::from_secs(2)));
    let mut buf = [0u8; 16 * 1024];
    // Acquire: pairs with the Release store in `Relay::drop`.
    while !shared.stop.load(Ordering::Acquire) {
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) if !is_cut() => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    if is_cut() {
        return true;
    }
    let _ = to.shutdown(Shutdown::Write);
    false
}

/// How long the first publisher runs before the cut: at a 5 ms heartbeat,
/// about 800 numbered reports.
const OLD_RUN: Duration = Duration::from_secs(4);
/// How soon the rejoined sidecar's new load must reach the frontend. It
/// takes one scrape interval (20 ms) plus a connection and a handshake:
/// tens of ms. Before, the new publisher's reports were stale until its
/// count passed the old one's: about `OLD_RUN` at the same pace.
const REJOIN_WITHIN: Duration = Duration::from_secs(2);

/// The waiting requests the frontend has for rank 0 of worker 31.
async fn waiting(fe: &Frontend) -> Option<f64> {
    let text = metrics_text(&fe.client, &fe.http).await;
    let series = "loadgate_frontend_worker_waiting_requests{worker_id=\"31\",dp_rank=\"0\"} ";
    text.lines().find_map(|l| l.strip_prefix(series)).and_then(|v| v.trim().parse().ok())
}

/// Waits (bounded) until the frontend has `value` waiting requests for
/// rank 0 of worker 31; whether it did, and the last value seen.
async fn wait_waiting(fe: &Frontend, value: f64, within: Duration) -> (bool, Option<f64>) {
    let deadline = Instant::now() + within;
    loop {
        let seen = waiting(fe).await;
        if seen == Some(value) {
            return (true, seen);
        }
        if Instant::now() >= deadline {
            return (false, seen);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The status of `GET url` (0: no answer).
async fn status(client: &reqwest::Client, url: &str) -> u16 {
    client.get(url).send().await.map(|r| r.status().as_u16()).unwrap_or(0)
}

/// Waits (bounded, 5 s) until `GET url` answers `expected`.
async fn wait_status(client: &reqwest::Client, url: &str, expected: u16) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while status(client, url).await != expected {
        assert!(Instant::now() < deadline, "{url} never answered {expected}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_that_rejoins_while_a_frontend_still_holds_it_reports_its_new_load_at_once() {
    let _box = exclusive().await;
    let engine = FakeEngine::start(1).await;
    engine.set_waiting(&[1]);
    // The frontend keeps a connection that goes quiet (the cut one) open.
    let fe = Frontend::secured(&["--event-idle-timeout-ms", "60000", "--event-silence-ms", "60000"]);
    let relay = Relay::start(fe.events);
    let spec = engine.spec();
    let relay_addr = relay.addr.to_string();
    let args = [
        "worker",
        "--engine",
        spec.as_str(),
        "--http-host",
        "127.0.0.1",
        "--http-port",
        "0",
        "--frontend",
        relay_addr.as_str(),
        "--worker-id",
        "31",
        "--engine-scrape-interval-ms",
        "20",
        "--engine-scrape-failures",
        "2",
        "--heartbeat-ms",
        "5",
    ];
    let (sidecar, line) = common::spawn("sidecar", &args, &[("LOADGATE_EVENT_SECRET", SECRET)]);
    let health = format!("http://{}/health", expect_field(&line, "http"));
    fe.wait_workers(1, Duration::from_secs(10)).await;
    assert!(wait_waiting(&fe, 1.0, Duration::from_secs(5)).await.0, "the first load never reached the frontend");
    tokio::time::sleep(OLD_RUN).await;
    // The network is cut, then the engine stops answering: the sidecar
    // leaves routing, and its Deregister is lost.
    relay.cut();
    engine.set_metrics_up(false);
    wait_status(&fe.client, &health, 503).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while relay.closed_while_cut() == 0 {
        assert!(Instant::now() < deadline, "the first publisher did not close its connection");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(fe.workers().await, Some(1), "the frontend still holds the worker (its Deregister was lost)");
    // The engine answers again, with a new load: the sidecar rejoins.
    engine.set_waiting(&[9]);
    engine.set_metrics_up(true);
    let rejoined = Instant::now();
    let (seen, last) = wait_waiting(&fe, 9.0, REJOIN_WITHIN).await;
    eprintln!(
        "the new load reached the frontend: {seen}, {:?} after the engine answered (last {last:?})",
        rejoined.elapsed()
    );
    assert!(seen, "the rejoined sidecar's load did not reach the frontend within {REJOIN_WITHIN:?}: {last:?}");
    wait_status(&fe.client, &health, 200).await;
    drop(sidecar);
}
