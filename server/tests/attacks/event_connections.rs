//! Event connections: past `--max-event-connections` the extra are closed
//! at once and the rest at the handshake timeout.

use std::time::{Duration, Instant};

use loadgate::wire::{self, Frame};

use crate::common::{self, shared, worker, EventConn, Frontend, HANDSHAKE_TIMEOUT, SECRET};
use crate::{MAX_RSS_MIB, MODEL};

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

/// Found by a review: the event plane caps its lines about connections not
/// yet authenticated at 50 a second (`PlaneLog`: anyone who reaches the
/// port can cause them), but a connection closed before its handshake
/// logged an `info` line of its own every time, and one gone before its
/// Challenge could be sent a `warn` line, neither counted: a peer without
/// the secret that connects and closes (or resets) in a loop wrote one log
/// line per connection, as fast as it could connect. Now both lines come
/// from the unauthenticated bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_closed_before_the_handshake_cannot_flood_the_log() {
    const CONNECTIONS: usize = 2000;
    let _box = shared().await;
    let fe = logging_frontend();
    let started = Instant::now();
    // Four connecting threads: the listener, not the client, sets the pace.
    let events = fe.events;
    let threads: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                for i in 0..CONNECTIONS / 4 {
                    let tcp = std::net::TcpStream::connect(events).expect("connect to the event port");
                    if i % 2 == 1 {
                        // Closed with a reset rather than a FIN.
                        let _ = socket2::SockRef::from(&tcp).set_linger(Some(Duration::ZERO));
                    }
                    drop(tcp);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("a connecting thread");
    }
    eprintln!("{CONNECTIONS} connections made and closed in {:?}", started.elapsed());
    let per_connection = [
        "event connection closed before the handshake",
        "could not send the challenge",
        "event connection refused",
        "closing event connection",
    ];
    at_most_50_lines_a_second(&fe, started, &per_connection, "unauthenticated connections closed").await;
}

/// A frontend with the secret and the default filter (`info`, no access
/// log), as a deployment runs.
fn logging_frontend() -> Frontend {
    Frontend::start_with_env(&[("LOADGATE_EVENT_SECRET", SECRET), ("RUST_LOG", "info,loadgate::access=off")], &[])
}

/// After a second more (for the listener to see every close; the bound
/// counts it too), `fe` has logged at most 50 lines a second since
/// `started` that contain one of `patterns` (about `what`), and it answers.
async fn at_most_50_lines_a_second(fe: &Frontend, started: Instant, patterns: &[&str], what: &str) {
    tokio::time::sleep(Duration::from_secs(1)).await;
    let log = fe.proc.stderr();
    let elapsed = started.elapsed();
    let lines = log.lines().filter(|l| patterns.iter().any(|p| l.contains(p))).count();
    // 50 a second, and a second more of slack for the bucket's edges.
    let bound = 50 * (elapsed.as_secs() as usize + 2);
    eprintln!("{what}: {lines} log lines in {elapsed:?}");
    assert!(lines <= bound, "{lines} log lines about {what} in {elapsed:?} (at most {bound})");
    let live = fe.client.get(format!("{}/live", fe.http)).send().await.expect("the frontend answers");
    assert_eq!(live.status(), 200);
}

/// Found by a review: a worker that registers and leaves in a loop (as a
/// sidecar does when its engine flaps between failing and answering: a
/// Deregister when it fails, a new connection and a Register when it
/// answers) made the frontend log three `info` lines a cycle, uncounted:
/// connection closed, worker deregistered, worker registered. 100 cycles
/// a second is 300 lines a second for as long as it likes. Now these lines
/// come from the bucket of authenticated connections (50 a second).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_registers_and_leaves_in_a_loop_cannot_flood_the_log() {
    const CYCLES: u64 = 400;
    let _box = shared().await;
    let (fe, started) = (logging_frontend(), Instant::now());
    let events = fe.events;
    tokio::task::spawn_blocking(move || (0..CYCLES).for_each(|_| register_and_leave(events)))
        .await
        .expect("the cycling worker");
    eprintln!("{CYCLES} register-deregister cycles in {:?}", started.elapsed());
    assert!(fe.proc.stderr().contains("worker registered"), "the first registration is logged");
    let per_cycle = ["worker registered", "worker deregistered", "event connection closed"];
    at_most_50_lines_a_second(&fe, started, &per_cycle, "one worker's register-deregister cycles").await;
}

/// One cycle of worker 91: connects, proves the secret, registers,
/// deregisters and closes.
fn register_and_leave(events: std::net::SocketAddr) {
    let mut conn = EventConn::authenticated(events, SECRET);
    conn.send(&common::register(91, 1, 1, MODEL, "127.0.0.1:1")).expect("send the Register");
    conn.send(&Frame::Deregister { worker: 91, incarnation: 1 }).expect("send the Deregister");
    // Dropped at once: the frontend reads the Deregister, then the close.
}
