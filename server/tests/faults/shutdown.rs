//! Graceful shutdown on SIGTERM, with SSE streams in flight: the frontend
//! (`/health` 503 during the drain, new connections refused, every stream
//! completes, exit within the drain timeout; a stream longer than the
//! timeout is cut at it) and a worker (it leaves routing first, its streams
//! complete, new requests go to the other worker, exit 0).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common;
use crate::http::{connect, get_new, limited_frontend, read_response, LocalProc};

/// Engine step of the workers here and tokens per stream: a stream takes
/// about 100 × 20 ms = 2 s.
const STEP_MS: &str = "20";
const TOKENS: u64 = 100;
/// The drain timeout given to the processes under test (the default).
const DRAIN: Duration = Duration::from_secs(5);

/// A worker for `m` pushing to `events`, spawned by hand (its exit status
/// is read), logging at info (its shutdown phases).
fn worker(events: SocketAddr, id: &str) -> LocalProc {
    let events = events.to_string();
    let args = [
        "worker",
        "--http-host",
        "127.0.0.1",
        "--http-port",
        "0",
        "--model",
        "m",
        "--frontend",
        &events,
        "--decode-step-ms",
        STEP_MS,
        "--worker-id",
        id,
    ];
    LocalProc::spawn("worker", None, &args, &[("LOADGATE_EVENT_SECRET", common::SECRET), ("RUST_LOG", "info")])
}

/// `GET /health`'s `workers` (bounded).
async fn workers(client: &reqwest::Client, base: &str) -> Option<u64> {
    let response = client.get(format!("{base}/health")).send().await.ok()?;
    response.json::<Value>().await.ok()?["workers"].as_u64()
}

/// Waits (bounded) until `/health` reports `n` workers.
async fn wait_workers(client: &reqwest::Client, base: &str, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while workers(client, base).await != Some(n) {
        assert!(Instant::now() < deadline, "timed out waiting for {n} workers");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// One streamed completion of [`TOKENS`] tokens: whether it ended with
/// `[DONE]`, its chunk count, its status and how long it took.
async fn stream(client: reqwest::Client, base: String) -> (bool, usize, u16, Duration) {
    let started = Instant::now();
    let body = json!({"model": "m", "prompt": "hello", "max_tokens": TOKENS, "stream": true});
    let response = match client.post(format!("{base}/v1/completions")).json(&body).send().await {
        Ok(response) => response,
        Err(_) => return (false, 0, 0, started.elapsed()),
    };
    let status = response.status().as_u16();
    let mut response = response;
    // Chunk by chunk: a stream cut midway keeps what arrived.
    let mut text = String::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    let chunks = text.matches("data: ").count();
    (text.trim_end().ends_with("data: [DONE]"), chunks, status, started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_to_the_frontend_lets_in_flight_streams_finish() {
    let _serial = common::exclusive().await;
    let mut frontend =
        limited_frontend(None, &["--model", "m"], &[("LOADGATE_EVENT_SECRET", common::SECRET), ("RUST_LOG", "info")]);
    let addr = frontend.http_addr();
    let base = format!("http://{addr}");
    let events: SocketAddr = common::expect_field(&frontend.line, "events").parse().unwrap();
    let _workers = [worker(events, "1"), worker(events, "2")];
    let client = common::long_client();
    wait_workers(&client, &base, 2).await;
    // A keep-alive connection opened before the signal: it may carry one
    // more request during the drain.
    let open_kept = move || {
        let mut kept = connect(addr).expect("connect");
        std::io::Write::write_all(&mut kept, b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
        assert_eq!(read_response(&mut kept, Duration::from_secs(3)), Some(200));
        kept
    };
    let (mut kept, mut kept_for_work) = tokio::task::spawn_blocking(move || (open_kept(), open_kept())).await.unwrap();
    let streams: Vec<_> = (0..8).map(|_| tokio::spawn(stream(client.clone(), base.clone()))).collect();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let signalled = Instant::now();
    frontend.terminate();
    tokio::time::sleep(Duration::from_millis(150)).await;
    let (refused, health_during_drain, work_during_drain) = tokio::task::spawn_blocking(move || {
        let refused = get_new(addr, "/live", Duration::from_secs(1));
        std::io::Write::write_all(&mut kept, b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
        let health = read_response(&mut kept, Duration::from_secs(3));
        let body = br#"{"model":"m","prompt":"hello","max_tokens":2}"#;
        let head = format!(
            "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        std::io::Write::write_all(&mut kept_for_work, head.as_bytes()).unwrap();
        std::io::Write::write_all(&mut kept_for_work, body).unwrap();
        (refused, health, read_response(&mut kept_for_work, Duration::from_secs(3)))
    })
    .await
    .unwrap();
    let mut results = Vec::new();
    for stream in streams {
        results.push(stream.await.expect("a stream task"));
    }
    let streams_done = signalled.elapsed();
    let exit = tokio::task::spawn_blocking(move || {
        let status = frontend.wait_exit(DRAIN + Duration::from_secs(3));
        (status, signalled.elapsed(), frontend)
    })
    .await
    .unwrap();
    let (status, exited_after, frontend) = exit;
    let whole = results.iter().filter(|r| r.0 && r.2 == 200).count();
    let longest = results.iter().map(|r| r.3).max().unwrap_or_default();
    eprintln!(
        "frontend SIGTERM: {whole}/{} streams completed whole ([DONE]; chunks {:?}; longest {longest:?}); \
         a new connection after the signal: {refused:?}; /health on a kept connection during the drain: \
         {health_during_drain:?}, a completion on another: {work_during_drain:?}; streams done {streams_done:?} and exit ({status:?}) {exited_after:?} after the signal",
        results.len(),
        results.iter().map(|r| r.1).collect::<Vec<_>>(),
    );
    let log = frontend.stderr();
    for phase in ["shutdown signal received", "draining", "drained", "frontend stopped"] {
        assert!(log.contains(phase), "the frontend logs {phase:?}:\n{log}");
    }
    assert_eq!(whole, results.len(), "every in-flight stream completes: {results:?}");
    assert!(refused.is_err(), "a new connection after the signal is refused: {refused:?}");
    assert_eq!(health_during_drain, Some(503), "/health on a kept connection during the drain");
    assert_eq!(work_during_drain, Some(503), "no new inference work during the drain");
    assert!(status.is_some_and(|s| s.success()), "the frontend exits 0: {status:?}");
    assert!(exited_after < DRAIN + Duration::from_secs(1), "exits within the drain timeout: {exited_after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_to_a_worker_leaves_routing_first_and_finishes_its_streams() {
    let _serial = common::exclusive().await;
    let frontend = common::Frontend::secured(&["--model", "m"]);
    let base = frontend.http.clone();
    let client = common::long_client();
    let mut leaving = worker(frontend.events, "1");
    let _staying = worker(frontend.events, "2");
    wait_workers(&client, &base, 2).await;
    let streams: Vec<_> = (0..8).map(|_| tokio::spawn(stream(client.clone(), base.clone()))).collect();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let signalled = Instant::now();
    leaving.terminate();
    // It leaves routing first: the frontend sees one worker.
    let deadline = signalled + Duration::from_secs(3);
    while workers(&client, &base).await != Some(1) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let left_routing = signalled.elapsed();
    // New requests meanwhile all go to the other worker.
    let mut after = Vec::new();
    for _ in 0..10 {
        after.push(common::complete(&client, &base, "m", None).await.0);
    }
    let mut results = Vec::new();
    for stream in streams {
        results.push(stream.await.expect("a stream task"));
    }
    let exit = tokio::task::spawn_blocking(move || {
        let status = leaving.wait_exit(DRAIN + Duration::from_secs(5));
        (status, signalled.elapsed(), leaving)
    })
    .await
    .unwrap();
    let (status, exited_after, leaving) = exit;
    let whole = results.iter().filter(|r| r.0 && r.2 == 200).count();
    let log = leaving.stderr();
    let drained_line = log.lines().find(|l| l.contains("drained")).unwrap_or("(no drained line)").to_owned();
    eprintln!(
        "worker SIGTERM: out of routing {left_routing:?} after the signal; {whole}/{} streams completed whole \
         (chunks {:?}); new requests meanwhile {after:?}; exit {status:?} {exited_after:?} after the signal; {drained_line}",
        results.len(),
        results.iter().map(|r| r.1).collect::<Vec<_>>(),
    );
    for phase in ["shutdown signal received", "draining", "drained", "worker stopped"] {
        assert!(log.contains(phase), "the worker logs {phase:?}:\n{log}");
    }
    assert!(left_routing < Duration::from_secs(1), "out of routing within 1 s: {left_routing:?}");
    assert!(after.iter().all(|s| *s == 200), "new requests go to the other worker: {after:?}");
    assert_eq!(whole, results.len(), "every in-flight stream completes: {results:?}");
    assert!(status.is_some_and(|s| s.success()), "the worker exits 0: {status:?}");
    assert!(exited_after < DRAIN + Duration::from_secs(2), "{exited_after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_longer_than_the_drain_timeout_is_cut_at_it() {
    let _serial = common::exclusive().await;
    let mut frontend = limited_frontend(
        None,
        &["--model", "m"],
        &[
            ("LOADGATE_EVENT_SECRET", common::SECRET),
            ("RUST_LOG", "info"),
            ("DYN_HTTP_GRACEFUL_SHUTDOWN_TIMEOUT_SECS", "1"),
        ],
    );
    let base = format!("http://{}", frontend.http_addr());
    let events: SocketAddr = common::expect_field(&frontend.line, "events").parse().unwrap();
    let _worker = worker(events, "1");
    let client = common::long_client();
    wait_workers(&client, &base, 1).await;
    // About 2 s per stream; the drain allows 1 s.
    let streams: Vec<_> = (0..4).map(|_| tokio::spawn(stream(client.clone(), base.clone()))).collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let signalled = Instant::now();
    frontend.terminate();
    let exit = tokio::task::spawn_blocking(move || {
        let status = frontend.wait_exit(Duration::from_secs(5));
        (status, signalled.elapsed(), frontend)
    })
    .await
    .unwrap();
    let (status, exited_after, frontend) = exit;
    let mut results = Vec::new();
    for stream in streams {
        results.push(stream.await.expect("a stream task"));
    }
    let cut = results.iter().filter(|r| !r.0).count();
    eprintln!(
        "drain timeout 1 s: exit {status:?} {exited_after:?} after the signal; {cut}/{} streams cut (chunks {:?})",
        results.len(),
        results.iter().map(|r| r.1).collect::<Vec<_>>(),
    );
    assert!(frontend.stderr().contains("drain timeout"), "the cut is logged:\n{}", frontend.stderr());
    assert_eq!(cut, results.len(), "streams longer than the drain are cut: {results:?}");
    assert!(status.is_some_and(|s| s.success()), "the frontend exits 0: {status:?}");
    assert!(
        exited_after >= Duration::from_millis(900) && exited_after < Duration::from_millis(2500),
        "exits at the drain timeout: {exited_after:?}"
    );
}
