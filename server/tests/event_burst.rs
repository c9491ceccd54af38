//! A burst of event connections that register and then stay silent keeps
//! every connection (issue 22), with a real `loadgate frontend` on
//! 127.0.0.1.
//!
//! Before the fix, the frontend armed TCP keepalive on every accepted event
//! socket (first probe after 5 s of silence, then every second, 3 probes).
//! Connections opened in one loop go silent together (the loop is paced by
//! the listen backlog: 129 accepted, then the next SYN waits for its 1 s
//! retransmission), the timer wheel rounds a 5 s timer up to a 512 ms
//! bucket and a 1 s one to 64 ms, and sockets whose probe was answered
//! re-arm in lockstep, so thousands of keepalive timers expired in the same
//! tick. On loopback each probe (and each answer) is queued on the CPU's
//! input backlog, which holds `net.core.netdev_max_backlog` (1,000) packets;
//! the rest were dropped (drop reason `CPU_BACKLOG`, `/proc/net/softnet_stat`
//! column 2). A socket whose three probes were all dropped was aborted by
//! the frontend's kernel with ETIMEDOUT 8 s after its last frame
//! (`TCPAbortOnTimeout`), and its RST was mostly dropped too, so the worker
//! side stayed ESTABLISHED, half-open. At 10,000 connections that was
//! 4,572 aborts in one run (the bench `event_plane`, `docs/benchmarks.md`).
//!
//! The fix: no TCP keepalive on event sockets; silence is the application's
//! business (`--event-silence-ms` takes a silent worker out of routing,
//! `--event-idle-timeout-ms` closes its connection).
//!
//! What this test checks, at a size CI affords ([`CONNECTIONS`]), in one
//! loop of connects with a Register each:
//!
//! 1. no frontend socket on the event port has a keepalive timer (`tr` 2 in
//!    `/proc/net/tcp`). Before the fix every one of them had it: this is
//!    the check that fails there, deterministically;
//! 2. after [`SILENT`] of silence (past the old abort at 8 s, by 2 s), every
//!    connection is still open on both sides and every worker registered.
//!    At 1,500 connections the old probes did not overflow the backlog (a
//!    tick delivers 1,001, and a socket had to lose three in a row: more
//!    than 3,000 in one tick), so (2) passed before the fix too; it guards
//!    the outcome against any other timer that would close silent
//!    connections.
//!
//! Margins: the frontend's idle timeout and silence are 120 s, far past the
//! test's end; the connects take about 12 s here (129 per SYN
//! retransmission) and are bounded by [`CONNECT_BOUND`]; the registrations
//! are waited for at most [`REGISTER_BOUND`]. Nothing in it depends on
//! how fast the machine is, only on the kernel's timers (which a busy
//! machine does not make fire earlier).

#![cfg(target_os = "linux")]

mod common;

use std::io::{self, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{encoded, register, Frontend};

const MODEL: &str = "burst-model";
/// Connections in the burst.
const CONNECTIONS: usize = 1500;
/// How long the connections stay silent before the last check: the old
/// keepalive aborted at 5 s + 3 × 1 s.
const SILENT: Duration = Duration::from_secs(10);
/// Bound on the loop of connects (about 12 s here).
const CONNECT_BOUND: Duration = Duration::from_secs(90);
/// Bound on the wait for every Register to apply, after the connects.
const REGISTER_BOUND: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_silent_connections_keeps_every_connection() {
    raise_nofile(CONNECTIONS as u64 + 512);
    let room = (CONNECTIONS + 64).to_string();
    let frontend = Frontend::start(
        None,
        &[
            "--model",
            MODEL,
            "--max-event-connections",
            &room,
            "--max-workers",
            &room,
            "--event-idle-timeout-ms",
            "120000",
            "--event-silence-ms",
            "120000",
        ],
    );
    let port = frontend.events.port();

    // One loop of connects, a Register on each, as a fleet restarting at once.
    let started = Instant::now();
    let mut conns = Vec::with_capacity(CONNECTIONS);
    for worker in 1..=CONNECTIONS as u64 {
        assert!(started.elapsed() < CONNECT_BOUND, "{} connects took over {CONNECT_BOUND:?}", conns.len());
        let frame = encoded(&register(worker, 1, 1, MODEL, "127.0.0.1:9"));
        let mut stream = TcpStream::connect_timeout(&frontend.events, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("connect {worker}: {e}"));
        stream.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
        stream.write_all(&frame).unwrap_or_else(|e| panic!("Register {worker}: {e}"));
        conns.push(stream);
    }
    // Silent from here on: nothing more is written.
    let silent_since = Instant::now();
    eprintln!("{CONNECTIONS} connects in {:.1} s", started.elapsed().as_secs_f64());
    frontend.wait_workers(CONNECTIONS as u64, REGISTER_BOUND).await;

    // 1. No keepalive timer on the frontend's side.
    let sockets = event_sockets(port);
    assert_eq!(sockets.established, CONNECTIONS, "frontend sockets on the event port: {sockets:?}");
    assert_eq!(
        sockets.keepalive_timers, 0,
        "frontend sockets with a TCP keepalive timer: probes that a burst sends in one tick overflow the \
         input backlog, and a socket whose probes are all dropped is aborted (ETIMEDOUT)"
    );

    // 2. Every connection outlives the old keepalive's abort.
    tokio::time::sleep(SILENT.saturating_sub(silent_since.elapsed())).await;
    let mut closed = Vec::new();
    for (i, stream) in conns.iter().enumerate() {
        if let Some(reason) = closed_reason(stream) {
            closed.push(format!("worker {}: {reason}", i + 1));
        }
    }
    assert!(
        closed.is_empty(),
        "{} of {CONNECTIONS} connections closed after {SILENT:?} of silence, e.g. {:?}",
        closed.len(),
        &closed[..closed.len().min(5)]
    );
    let sockets = event_sockets(port);
    assert_eq!(sockets.established, CONNECTIONS, "frontend sockets after the silence: {sockets:?}");
    assert_eq!(frontend.workers().await, Some(CONNECTIONS as u64), "registered workers after the silence");
}

/// The frontend's sockets on the event port, from `/proc/net/tcp`.
#[derive(Debug, Default)]
struct EventSockets {
    /// ESTABLISHED.
    established: usize,
    /// ESTABLISHED with the keepalive timer pending (`tr` 2).
    keepalive_timers: usize,
}

fn event_sockets(port: u16) -> EventSockets {
    let text = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    let mut sockets = EventSockets::default();
    for line in text.lines().skip(1) {
        // sl local_address rem_address st tx_queue:rx_queue tr:tm->when ...
        let cols: Vec<&str> = line.split_whitespace().collect();
        let [_, local, _, state, _, timer, ..] = cols.as_slice() else { continue };
        let local_port = local.rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok());
        if local_port != Some(port) || *state != "01" {
            continue;
        }
        sockets.established += 1;
        if timer.split(':').next() == Some("02") {
            sockets.keepalive_timers += 1;
        }
    }
    sockets
}

/// Why a connection the test holds is closed, or `None` while it is open
/// (no socket error, nothing to read, no EOF).
fn closed_reason(stream: &TcpStream) -> Option<String> {
    if let Err(e) = stream.set_nonblocking(true) {
        return Some(e.to_string());
    }
    match stream.take_error() {
        Ok(None) => {}
        Ok(Some(e)) | Err(e) => return Some(e.to_string()),
    }
    match stream.peek(&mut [0u8; 1]) {
        Ok(0) => Some("closed by the frontend".into()),
        Ok(_) => Some("the frontend sent a frame".into()),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => None,
        Err(e) => Some(e.to_string()),
    }
}

/// Raises this process's soft open-file limit to `want` (the frontend
/// inherits it); fails when the hard limit is lower.
fn raise_nofile(want: u64) {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current.is_none_or(|soft| soft >= want) {
        return;
    }
    let hard = limit.maximum.unwrap_or(u64::MAX);
    assert!(hard >= want, "this test needs {want} open files; the hard limit is {hard}");
    setrlimit(Resource::Nofile, Rlimit { current: Some(want), maximum: limit.maximum }).expect("raise RLIMIT_NOFILE");
}
