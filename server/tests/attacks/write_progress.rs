//! Clients that stop reading (issue 20). A response body that the client
//! does not take used to hold everything behind it for as long as the
//! client liked: the worker's permit (a few connections held every slot of
//! `N + Q`, everyone else got 529) and, in `--router-mode kv`, the load the
//! router tracks for the request (one h2c connection with a zero window kept
//! a whole pool busy while its engines sat idle).
//!
//! Now the tracked load follows the worker's response, not the client, and a
//! body whose ready data the client does not take for
//! `--http-write-timeout-secs` is cut; a slow reader that keeps taking data
//! is not. The deadline is handed over as `LOADGATE_FRONTEND_HTTP_WRITE_TIMEOUT_SECS`,
//! not as the flag, so that these tests run unchanged against a build from
//! before issue 20 (which ignores the variable) and fail there on their
//! assertions.
//!
//! Every test here measures time: each takes [`exclusive`]. The margins are
//! for a debug build on a 2-core machine with a `cargo build` beside it.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::clients::{
    addr_of, drain, h1_request, h1_small_window, head, read_slowly_h1, read_slowly_h2, stream_body, tail, H2c,
    SlowRead, READ_EVERY, READ_PIECE,
};
use crate::common::{
    client_within, exclusive, metric, metrics_text, worker_with_env, Frontend, Mem, Worker, SECRET, STARTUP,
};
use crate::MODEL;

/// The write-progress deadline these tests run with (from the environment).
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);
const WRITE_TIMEOUT_ENV: (&str, &str) = ("LOADGATE_FRONTEND_HTTP_WRITE_TIMEOUT_SECS", "2");
/// What a cut may take past the deadline (the "free within 3 s" of
/// a 2 s deadline): the connection's check timer, closing it, and the worker
/// seeing its requests go. Measured over h2c: the slots free 2.0 s after
/// they were seen full (the deadline ran from a little before).
const CHECK_SLACK: Duration = Duration::from_secs(1);
/// Room for a debug build on a busy 2-core machine (a `cargo build` beside
/// the test) on top of every timing bound below.
const BUSY_MARGIN: Duration = Duration::from_secs(2);
/// `N` and `Q` of the worker whose slots the stalled clients fill.
const SLOTS: u64 = 2;
const QUEUE: u64 = 2;
/// How long a non-reading HTTP/1.1 client's stream takes to fill what is in
/// flight (its 4 KiB buffer, the frontend's socket and hyper's write buffer)
/// at the worker's token per millisecond. Measured: ~0.9 s.
const FILL: Duration = Duration::from_secs(2);
/// How much RSS the frontend may keep after an attack.
const RSS_GROWTH_MIB: f64 = 10.0;
/// `max_tokens` of a stream that outlasts every test here (100 s at one
/// token per millisecond), and the KV blocks per rank that let a worker run
/// it (its 1,024 default blocks hold 16,384 tokens; more is refused with 400).
const LONG_TOKENS: u64 = 100_000;
const LONG_KV_BLOCKS: &str = "16384";

// ---------------------------------------------------------------------------
// Processes and what they report.

/// A frontend with the secret, `env` and `extra` flags.
fn frontend(env: &[(&str, &str)], extra: &[&str]) -> Frontend {
    let mut all = vec![("LOADGATE_EVENT_SECRET", SECRET)];
    all.extend_from_slice(env);
    Frontend::start_with_env(&all, extra)
}

/// A simulated worker with the secret, `env` and `extra` flags, registered
/// with `fe`.
fn pool_worker(fe: &Frontend, env: &[(&str, &str)], extra: &[&str]) -> Worker {
    let mut all = vec![("LOADGATE_EVENT_SECRET", SECRET)];
    all.extend_from_slice(env);
    worker_with_env(Some(fe.events), MODEL, &all, extra)
}

/// A worker's `dynamo_engine_request` (running) and `dynamo_request_queue`
/// (queued) gauges; `None` when `/metrics` did not answer.
async fn slots(client: &reqwest::Client, w: &Worker) -> Option<(f64, f64)> {
    let text = metrics_text(client, &w.http).await;
    Some((metric(&text, "dynamo_engine_request")?, metric(&text, "dynamo_request_queue").unwrap_or(0.0)))
}

/// Polls `w`'s slots every 20 ms (each read bounded by 1 s) until `done`
/// holds or `deadline` passes: when it held (`None`: not by the deadline)
/// and the last reading.
async fn wait_slots(
    w: &Worker,
    deadline: Instant,
    done: impl Fn(f64, f64) -> bool,
) -> (Option<Instant>, Option<(f64, f64)>) {
    let client = client_within(Duration::from_secs(1));
    let mut last = None;
    // At most one poll per 20 ms until the deadline.
    while Instant::now() < deadline {
        last = slots(&client, w).await;
        if let Some((running, queued)) = last {
            if done(running, queued) {
                return (Some(Instant::now()), last);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (None, last)
}

/// The frontend's `loadgate_frontend_tracked_blocks`.
async fn tracked_blocks(fe: &Frontend) -> Option<f64> {
    metric(&metrics_text(&fe.client, &fe.http).await, "loadgate_frontend_tracked_blocks")
}

/// `GET /health` on a new connection (a client of its own), bounded: the
/// status (0: no answer) and how long it took.
async fn health_on_a_new_connection(fe: &Frontend) -> (u16, Duration) {
    let started = Instant::now();
    let status = match client_within(Duration::from_secs(3)).get(format!("{}/health", fe.http)).send().await {
        Ok(response) => response.status().as_u16(),
        Err(_) => 0,
    };
    (status, started.elapsed())
}

// ---------------------------------------------------------------------------
// The kv-mode pin.

/// Prompt words of the pinning requests: 440 tokens, 28 blocks of 16.
const PIN_WORDS: usize = 440;
/// KV blocks per worker: two pinning requests (56 blocks, 0.875) are over
/// the 0.5 threshold, one (28 blocks, 0.44) is not.
const PIN_KV_BLOCKS: &str = "64";

/// Found in issue 20: in `--router-mode kv` one unauthenticated h2c
/// connection with SETTINGS_INITIAL_WINDOW_SIZE = 0 and 4 streams of
/// 440-word prompts (`max_tokens` 8) kept both workers of a pool busy (529
/// for everyone) for as long as it stayed open, while the engines sat idle:
/// the router's tracked load (112 blocks) was released only when the client
/// read the responses. Now it is released when the worker's response ends:
/// normal requests get 200 within 1 s of the engines finishing, with the
/// default write timeout (30 s) and the attacking connection still open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_tracked_load_follows_the_worker_not_a_zero_window_client() {
    let _box = exclusive().await;
    let fe = frontend(&[], &["--router-mode", "kv", "--active-decode-blocks-threshold", "0.5"]);
    let workers: Vec<Worker> = (0..2).map(|_| pool_worker(&fe, &[], &["--kv-total-blocks", PIN_KV_BLOCKS])).collect();
    fe.wait_workers(2, STARTUP).await;
    let (status, body) = fe.complete(MODEL).await;
    assert_eq!(status, 200, "a normal request before the attack: {body}");

    // One stream at a time, each awaited to its response head (the router
    // has tracked it by then), so the least-loaded choice spreads them two
    // per worker: 56 of 64 blocks each, both over the threshold.
    let mut attacker = H2c::connect(addr_of(&fe.http), Some(0)).await;
    let mut bodies = Vec::new();
    for i in 0..4 {
        let (status, body) = head(attacker.post(stream_body(PIN_WORDS, 8)).await).await;
        assert_eq!(status, 200, "pinning stream {i}");
        bodies.push(body);
    }
    let attacked = Instant::now();
    // The engines finish 8 tokens in milliseconds; wait (bounded) until
    // both report no request in service.
    let mut idle_at = None;
    for w in &workers {
        let (at, last) = wait_slots(w, Instant::now() + Duration::from_secs(10), |r, q| r + q == 0.0).await;
        assert!(at.is_some(), "a worker's engine still busy 10 s after 8-token requests: {last:?}");
        idle_at = at.max(idle_at);
    }
    let idle_at = idle_at.expect("both workers seen idle");
    let tracked_when_idle = tracked_blocks(&fe).await;
    eprintln!(
        "engines idle {:?} after the 4 pinning streams; the frontend tracks {tracked_when_idle:?} blocks",
        idle_at - attacked
    );

    // Within 1 s of that moment a normal request is served (each try is
    // bounded by what is left of the second).
    let mut statuses = Vec::new();
    let served_after = loop {
        let left = (idle_at + Duration::from_secs(1)).saturating_duration_since(Instant::now());
        if left.is_zero() || statuses.len() >= 200 {
            break None;
        }
        let (status, _) = crate::common::complete(&client_within(left), &fe.http, MODEL, None).await;
        statuses.push(status);
        if status == 200 {
            break Some(idle_at.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let tracked_now = tracked_blocks(&fe).await;
    eprintln!(
        "normal requests after the engines finished: {statuses:?}, the first 200 after {served_after:?}; tracked \
         blocks now {tracked_now:?}"
    );
    assert!(
        served_after.is_some(),
        "no normal request served within 1 s of the engines finishing (statuses {statuses:?}); the frontend still \
         tracks {tracked_now:?} blocks for a client that reads nothing"
    );
    // And it stays so: 10 of 10 served while the connection stays open.
    let mut later = Vec::new();
    for _ in 0..10 {
        later.push(fe.complete(MODEL).await.0);
    }
    assert!(later.iter().all(|&s| s == 200), "normal requests with the pinning connection open: {later:?}");
    assert!(!attacker.closed(), "the pinning connection was closed before the default write timeout");
    drop(bodies);
}

// ---------------------------------------------------------------------------
// Non-reading clients fill a worker's N + Q.

/// A frontend with the 2 s write timeout and one worker with `N` =
/// [`SLOTS`], `Q` = [`QUEUE`], warmed up; the frontend's memory after the
/// warm-up.
async fn capped_pool() -> (Frontend, Worker, Mem) {
    let fe = frontend(&[WRITE_TIMEOUT_ENV], &[]);
    let w = pool_worker(
        &fe,
        &[("DYN_DYNAMO_REQUEST_QUEUE_LIMIT", "2")],
        &["--engine-request-limit", "2", "--decode-step-ms", "1", "--kv-total-blocks", LONG_KV_BLOCKS],
    );
    fe.wait_workers(1, STARTUP).await;
    for _ in 0..5 {
        let (status, body) = fe.complete(MODEL).await;
        assert_eq!(status, 200, "a normal request before the attack: {body}");
    }
    let before = fe.mem();
    (fe, w, before)
}

/// Waits (bounded) until the stalled requests hold the worker's whole
/// `N + Q`, then checks a normal request is refused and `GET /health` on a
/// new connection answers meanwhile. Returns when the slots were seen full.
async fn assert_filled(fe: &Frontend, w: &Worker, what: &str) -> Instant {
    let (full_at, last) =
        wait_slots(w, Instant::now() + Duration::from_secs(10), |r, q| r == SLOTS as f64 && q == QUEUE as f64).await;
    let full_at = full_at.unwrap_or_else(|| panic!("{what} did not fill N + Q = 2 + 2 within 10 s: {last:?}"));
    let (status, body) = fe.complete(MODEL).await;
    eprintln!("{what}: the worker's N + Q full; a normal request got {status}");
    assert_eq!(status, 529, "a normal request while {what} hold N + Q: {body}");
    let (health, took) = health_on_a_new_connection(fe).await;
    eprintln!("GET /health on a new connection meanwhile: {health} in {took:?}");
    assert_eq!(health, 200, "GET /health on a new connection while {what} hold N + Q");
    full_at
}

/// Waits (bounded by `by`) until the worker's slots are all free, then
/// checks a normal request is served and, 5 s later, the frontend's RSS.
async fn assert_freed(fe: &Frontend, w: &Worker, before: Mem, full_at: Instant, by: Instant, what: &str) {
    let (free_at, last) = wait_slots(w, by, |r, q| r + q == 0.0).await;
    let Some(free_at) = free_at else {
        panic!(
            "{what}: the worker's slots not free {:?} after they filled (running, queued: {last:?}); write timeout \
             {WRITE_TIMEOUT:?}",
            by - full_at
        );
    };
    eprintln!("{what}: the worker's slots free {:?} after they filled", free_at - full_at);
    let (status, body) = fe.complete(MODEL).await;
    assert_eq!(status, 200, "a normal request once {what} were cut: {body}");
    // The client stalled, not the worker: cut at the frontend (the worker's
    // own deadline is 5 s longer), so no upstream failure and no quarantine.
    let text = crate::common::metrics_text(&fe.client, &fe.http).await;
    for name in ["loadgate_frontend_upstream_failures_total", "loadgate_frontend_workers_quarantined_total"] {
        assert_eq!(crate::common::metric(&text, name), Some(0.0), "{what}: {name} after the cut\n{text}");
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = fe.mem();
    eprintln!("frontend VmRSS {:.1} MiB before the attack, {:.1} MiB 5 s after", before.rss_mib(), after.rss_mib());
    assert!(
        after.rss_mib() <= before.rss_mib() + RSS_GROWTH_MIB,
        "frontend RSS grew from {:.1} to {:.1} MiB",
        before.rss_mib(),
        after.rss_mib()
    );
}

/// One h2c connection opens `N + Q` streams (`max_tokens` 100,000, one
/// token per millisecond) with a zero window and never reads. They fill the
/// worker's `N + Q` (a normal request gets 529; `GET /health` on a new
/// connection answers). The streams' data is ready as soon as their heads
/// are sent, so the write deadline (2 s) runs from before the slots are seen
/// full: by 2 s + 1 s (the check's granularity) + 2 s (busy machine) after
/// that, the connection is cut, every slot is free and a normal request is
/// served; 5 s later the frontend's RSS is within 10 MiB of before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_streams_that_are_never_read_are_cut() {
    let _box = exclusive().await;
    let (fe, w, before) = capped_pool().await;
    let mut attacker = H2c::connect(addr_of(&fe.http), Some(0)).await;
    let mut responses = Vec::new();
    for _ in 0..SLOTS + QUEUE {
        responses.push(attacker.post(stream_body(4, LONG_TOKENS)).await);
    }
    let full_at = assert_filled(&fe, &w, "4 unread h2c streams").await;
    let by = full_at + WRITE_TIMEOUT + CHECK_SLACK + BUSY_MARGIN;
    assert_freed(&fe, &w, before, full_at, by, "4 unread h2c streams").await;
    assert!(attacker.closed(), "the frontend left the stalled h2c connection open");
    drop(responses);
}

/// `N + Q` HTTP/1.1 connections with a 4 KiB receive buffer each send one
/// streamed completion (`max_tokens` 100,000) and never read. They fill the
/// worker's `N + Q` (a normal request gets 529; `GET /health` on a new
/// connection answers). A running one stalls once its bytes in flight fill
/// the client's buffer, the frontend's socket and hyper's write buffer
/// (within [`FILL`]); the 2 queued ones start, and stall alike, only when
/// the first 2 are cut. So each round (the running 2 cut, then the other 2)
/// ends by fill 2 s + deadline 2 s + 1 s + 2 s (busy machine) after the
/// previous one; then a normal request is served, the frontend closed every
/// stalled connection, and 5 s later its RSS is within 10 MiB of before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_connections_that_never_read_are_cut() {
    let _box = exclusive().await;
    let (fe, w, before) = capped_pool().await;
    let addr = addr_of(&fe.http);
    let request = h1_request(addr, &stream_body(4, LONG_TOKENS));
    let mut stalled: Vec<TcpStream> = (0..SLOTS + QUEUE).map(|_| h1_small_window(addr, &request)).collect();
    let full_at = assert_filled(&fe, &w, "4 unread HTTP/1.1 connections").await;
    let round = FILL + WRITE_TIMEOUT + CHECK_SLACK + BUSY_MARGIN;
    // The first round: the running 2 cut, the queued 2 admitted.
    let (first_at, last) = wait_slots(&w, full_at + round, |r, q| r + q <= QUEUE as f64).await;
    let Some(first_at) = first_at else {
        panic!(
            "the 2 running unread HTTP/1.1 connections not cut {round:?} after the slots filled (running, queued: \
             {last:?}); write timeout {WRITE_TIMEOUT:?}"
        );
    };
    eprintln!("the 2 running unread HTTP/1.1 connections cut {:?} after the slots filled", first_at - full_at);
    assert_freed(&fe, &w, before, full_at, first_at + round, "4 unread HTTP/1.1 connections").await;
    for (i, conn) in stalled.iter_mut().enumerate() {
        let (ended, got) = drain(conn, Duration::from_secs(5));
        let done = String::from_utf8_lossy(&got).contains("data: [DONE]");
        eprintln!(
            "stalled connection {i}: {} bytes left in flight, then {}",
            got.len(),
            if ended { "closed" } else { "open" }
        );
        assert!(ended && !done, "stalled connection {i} was not cut (ended {ended}, [DONE] {done})");
    }
}

// ---------------------------------------------------------------------------
// Slow readers are not cut.

/// How long a slow reader's stream lasts at [`READ_PIECE`] per
/// [`READ_EVERY`]: 4 write timeouts. The reader never takes more than that,
/// so the stream cannot be shorter; a busy machine makes it longer (8.1 to
/// 8.5 s measured with a build beside it, up to 12.7 s with 4 CPU hogs too).
const SLOW_STREAM: Duration = Duration::from_secs(8);

/// A frontend with the 2 s write timeout and one uncapped worker producing a
/// token per millisecond; and the `max_tokens` of a stream of about
/// [`SLOW_STREAM`] at [`READ_PIECE`] per [`READ_EVERY`] (measured from a
/// short stream's bytes per token).
async fn slow_pool() -> (Frontend, Worker, u64) {
    let fe = frontend(&[WRITE_TIMEOUT_ENV], &[]);
    let w = pool_worker(&fe, &[], &["--decode-step-ms", "1", "--kv-total-blocks", LONG_KV_BLOCKS]);
    fe.wait_workers(1, STARTUP).await;
    let probe = fe
        .client
        .post(format!("{}/v1/completions", fe.http))
        .header("content-type", "application/json")
        .body(stream_body(4, 200))
        .send()
        .await
        .expect("a probe stream");
    assert_eq!(probe.status(), 200, "a probe stream");
    let bytes = probe.bytes().await.expect("the probe's body").len() as u64;
    let rate = READ_PIECE as f64 / READ_EVERY.as_secs_f64();
    let max_tokens = (rate * SLOW_STREAM.as_secs_f64() / (bytes as f64 / 200.0)) as u64;
    eprintln!("{} bytes per token: a {SLOW_STREAM:?} slow read is {max_tokens} tokens", bytes / 200);
    (fe, w, max_tokens)
}

/// Checks what a slow reader got over `took`: the whole stream, lasting at
/// least 3 write timeouts, with data waiting on the reader for longer than
/// one write timeout at a stretch.
fn assert_whole(read: &SlowRead, took: Duration, what: &str) {
    let text = String::from_utf8_lossy(&read.got);
    eprintln!(
        "a slow {what} reader took {} bytes in {took:?}; {} of {} reads found a whole piece, {} in a row at most",
        read.got.len(),
        read.full,
        read.ticks,
        read.longest_full_run
    );
    assert!(
        read.ended && read.error.is_none() && text.contains("data: [DONE]"),
        "the slow {what} reader did not get the whole stream ({} bytes in {took:?}, error {:?}): ...{}",
        read.got.len(),
        read.error,
        tail(&text, 300)
    );
    assert!(took >= 3 * WRITE_TIMEOUT, "the slow {what} read lasted {took:?}, not 3 write timeouts");
    // Reads that each found a whole piece waiting, in a row, for longer than
    // the deadline: the reader, not the engine, set the pace then (else the
    // test proved nothing). With a build beside it: 78 and more of ~83
    // reads, all in a row; only with 4 more CPU hogs did the engine fall
    // behind for half of them.
    let needed = (WRITE_TIMEOUT.as_millis() / READ_EVERY.as_millis()) as usize;
    assert!(
        read.longest_full_run > needed,
        "the engine, not the reader, set the pace: at most {} reads in a row found a piece waiting ({needed} needed)",
        read.longest_full_run
    );
}

/// A slow HTTP/1.1 reader (4 KiB receive buffer, 8 KiB taken every 100 ms,
/// slower than the engine) of a stream lasting about 8 s, 4 times the 2 s
/// write timeout, gets the whole stream to `data: [DONE]`. Beside it, the
/// same request on a connection that never reads is cut by the time the
/// slow read ends (so the deadline was armed all along).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_http1_reader_is_not_cut() {
    let _box = exclusive().await;
    let (fe, _w, max_tokens) = slow_pool().await;
    let addr = addr_of(&fe.http);
    let mut stalled = h1_small_window(addr, &h1_request(addr, &stream_body(4, LONG_TOKENS)));
    let started = Instant::now();
    let mut reader = h1_small_window(addr, &h1_request(addr, &stream_body(4, max_tokens)));
    let read =
        tokio::task::spawn_blocking(move || read_slowly_h1(&mut reader)).await.expect("the slow reader's thread");
    let took = started.elapsed();
    assert!(read.got.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&read.got[..read.got.len().min(300)]));
    assert_whole(&read, took, "HTTP/1.1");
    // The stalled one's data was ready from its start, 6 s and more ago.
    let (ended, rest) = drain(&mut stalled, Duration::from_secs(5));
    let done = String::from_utf8_lossy(&rest).contains("data: [DONE]");
    assert!(ended && !done, "the connection that never read was not cut (ended {ended}, [DONE] {done})");
}

/// The same over h2c: the slow reader's stream (default window, 8 KiB read
/// and exactly that released every 100 ms) gets the whole stream to
/// `data: [DONE]` over about 8 s, and its connection stays open; a second
/// h2c connection with a zero window, on the same frontend, is cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_h2c_reader_is_not_cut() {
    let _box = exclusive().await;
    let (fe, _w, max_tokens) = slow_pool().await;
    let addr = addr_of(&fe.http);
    let mut stalled = H2c::connect(addr, Some(0)).await;
    let stalled_response = stalled.post(stream_body(4, LONG_TOKENS)).await;
    let mut reader = H2c::connect(addr, None).await;
    let started = Instant::now();
    let (status, mut body) = head(reader.post(stream_body(4, max_tokens)).await).await;
    assert_eq!(status, 200, "the slow reader's stream");
    let read = read_slowly_h2(&mut body).await;
    assert_whole(&read, started.elapsed(), "h2c");
    assert!(!reader.closed(), "the slow reader's connection was closed");
    // The zero-window stream's head went out when it started, 6 s and more
    // ago: its connection is cut by now.
    assert!(stalled.closed(), "the zero-window h2c connection beside it was not cut");
    drop(stalled_response);
}
