//! The waiting line end to end: a real `loadgate frontend` process with
//! `--router-queue-timeout-ms`, and a worker the test controls — a fake
//! HTTP worker that counts what it receives, registered and reported over a
//! real event connection by the test, so each load report is the test's.
//!
//! Margins: the frontend's silence and idle timeouts are raised to 60 s, so
//! no report comes but the test's; a request "still waiting" is checked
//! 400 ms after it was sent (a loaded 2-core machine delivers a request in
//! well under that); the deadline test allows the issue's ±100 ms.

#[path = "common/mod.rs"]
mod common;

use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{encoded, metric, metrics_text, register, FakeWorker, Frontend};
use loadgate::wire::Frame;
use loadgate::RankLoad;
use serde_json::json;

const MODEL: &str = "line-model";
const WORKER: u64 = 7;

/// A frontend whose model is busy above half its KV blocks, with `extra`
/// flags; no report reaches it but the test's.
fn frontend(extra: &[&str]) -> Frontend {
    let mut flags = vec![
        "--active-decode-blocks-threshold",
        "0.5",
        "--event-silence-ms",
        "60000",
        "--event-idle-timeout-ms",
        "60000",
    ];
    flags.extend_from_slice(extra);
    Frontend::start(None, &flags)
}

/// The fake worker and the test's event connection for it.
struct Controlled {
    http: FakeWorker,
    events: TcpStream,
    seq: u64,
}

impl Controlled {
    async fn register(frontend: &Frontend) -> Controlled {
        let http = FakeWorker::start();
        let mut events = TcpStream::connect(frontend.events).expect("event port");
        let frame = register(WORKER, 1, 1, MODEL, &http.addr.to_string());
        std::io::Write::write_all(&mut events, &encoded(&frame)).expect("register");
        frontend.wait_workers(1, Duration::from_secs(10)).await;
        Controlled { http, events, seq: 0 }
    }

    /// One load report: 90 of 100 blocks (busy) or 10 (free).
    fn report(&mut self, busy: bool) {
        self.seq += 1;
        let blocks = if busy { 90 } else { 10 };
        let load = RankLoad { active_decode_blocks: blocks, kv_total_blocks: 100, ..Default::default() };
        let frame = Frame::Load { worker: WORKER, incarnation: 1, rank: 0, seq: self.seq, load };
        std::io::Write::write_all(&mut self.events, &encoded(&frame)).expect("report");
    }
}

/// Sends one completion; returns its status, reason header and how long it took.
fn send(
    frontend: &Frontend,
    client: reqwest::Client,
) -> impl std::future::Future<Output = (u16, Option<String>, Duration)> {
    let url = format!("{}/v1/completions", frontend.http);
    async move { send_to(url, client).await }
}

async fn send_to(url: String, client: reqwest::Client) -> (u16, Option<String>, Duration) {
    send_as(url, client, None).await
}

/// Sends one completion with `x-loadgate-priority: priority` (if any).
fn send_with(
    frontend: &Frontend,
    client: reqwest::Client,
    priority: &'static str,
) -> impl std::future::Future<Output = (u16, Option<String>, Duration)> {
    let url = format!("{}/v1/completions", frontend.http);
    async move { send_as(url, client, Some(priority)).await }
}

async fn send_as(url: String, client: reqwest::Client, priority: Option<&str>) -> (u16, Option<String>, Duration) {
    let start = Instant::now();
    let body = json!({"model": MODEL, "prompt": "hello there", "max_tokens": 4});
    let mut request = client.post(url).json(&body);
    if let Some(priority) = priority {
        request = request.header("x-loadgate-priority", priority);
    }
    let response = request.send().await.expect("send");
    let reason = response.headers().get("x-loadgate-rejected-reason").and_then(|v| v.to_str().ok()).map(str::to_owned);
    (response.status().as_u16(), reason, start.elapsed())
}

async fn waiting(frontend: &Frontend) -> f64 {
    metric(&metrics_text(&frontend.client, &frontend.http).await, "loadgate_frontend_queue_waiting").unwrap_or(-1.0)
}

/// Waits (bounded: 5 s) until the line holds `n` requests.
async fn wait_waiting(frontend: &Frontend, n: f64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while waiting(frontend).await != n {
        assert!(Instant::now() < deadline, "the line never held {n} (holds {})", waiting(frontend).await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (bounded: 5 s) until the fake worker has received `n` requests.
async fn wait_received(worker: &FakeWorker, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while worker.requests() < n {
        assert!(Instant::now() < deadline, "the worker received {} of {n}", worker.requests());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_request_is_served_when_its_worker_frees() {
    let _box = common::shared().await;
    let fe = frontend(&["--router-queue-timeout-ms", "10000"]);
    let mut worker = Controlled::register(&fe).await;
    worker.report(true);
    wait_for_busy(&fe).await;
    let request = tokio::spawn(send(&fe, fe.client.clone()));
    wait_waiting(&fe, 1.0).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!request.is_finished(), "the request waits while the worker is busy");
    assert_eq!(worker.http.requests(), 0);
    worker.report(false);
    let (status, _, took) = tokio::time::timeout(Duration::from_secs(5), request).await.expect("served").unwrap();
    assert_eq!(status, 200, "served after {took:?}");
    assert_eq!(worker.http.requests(), 1);
    wait_waiting(&fe, 0.0).await;
    let text = metrics_text(&fe.client, &fe.http).await;
    assert_eq!(metric(&text, "loadgate_frontend_queue_dispatched_total"), Some(1.0), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_its_deadline_a_request_gets_the_overload_status_with_reason_deadline() {
    let _box = common::exclusive().await;
    let fe = frontend(&["--router-queue-timeout-ms", "1000"]);
    let mut worker = Controlled::register(&fe).await;
    worker.report(true);
    wait_for_busy(&fe).await;
    let (status, reason, took) = send(&fe, fe.client.clone()).await;
    assert_eq!(status, 529);
    assert_eq!(reason.as_deref(), Some("deadline"));
    let ms = took.as_millis();
    assert!((900..=1100).contains(&ms), "refused {ms} ms after it was sent; the deadline is 1000 ms (±100)");
    assert_eq!(worker.http.requests(), 0);
    wait_waiting(&fe, 0.0).await;
    let text = metrics_text(&fe.client, &fe.http).await;
    let refused = metric_with(&text, "loadgate_frontend_rejection_reason_total", "reason=\"deadline\"");
    assert_eq!(refused, Some(1.0), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_leaves_the_line() {
    let _box = common::shared().await;
    let fe = frontend(&["--router-queue-timeout-ms", "20000"]);
    let mut worker = Controlled::register(&fe).await;
    worker.report(true);
    wait_for_busy(&fe).await;
    let impatient = reqwest::Client::builder().timeout(Duration::from_millis(600)).build().unwrap();
    let request = tokio::spawn(send(&fe, impatient));
    wait_waiting(&fe, 1.0).await;
    // The client gives up at 600 ms (reqwest panics in `send`'s expect: the
    // task ends with an error, which is the point).
    assert!(tokio::time::timeout(Duration::from_secs(5), request).await.expect("client gave up").is_err());
    wait_waiting(&fe, 0.0).await;
    worker.report(false);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(worker.http.requests(), 0, "nobody left to serve");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_freed_worker_takes_one_waiter_per_report_of_its_own() {
    let _box = common::shared().await;
    let fe = frontend(&["--router-queue-timeout-ms", "20000"]);
    let mut worker = Controlled::register(&fe).await;
    worker.report(true);
    wait_for_busy(&fe).await;
    let client = common::client_within(Duration::from_secs(30));
    let requests: Vec<_> = (0..50).map(|_| tokio::spawn(send(&fe, client.clone()))).collect();
    wait_waiting(&fe, 50.0).await;
    // Each report that finds the worker free lets exactly one waiter go:
    // the fake worker never reports the load those requests add, so more
    // would all be past the threshold.
    for k in 1..=5 {
        worker.report(false);
        wait_received(&worker.http, k).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(worker.http.requests(), k, "report {k}: one waiter per report");
    }
    wait_waiting(&fe, 45.0).await;
    // Busy again: nobody more goes, however long they wait.
    worker.report(true);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(worker.http.requests(), 5);
    // Free, repeatedly: the rest drain, one per report.
    for k in 6..=50 {
        worker.report(false);
        wait_received(&worker.http, k).await;
    }
    for request in requests {
        assert_eq!(request.await.unwrap().0, 200);
    }
    assert_eq!(worker.http.requests(), 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_line_refuses_at_once_with_reason_queue_full() {
    let _box = common::shared().await;
    let fe = frontend(&["--router-queue-timeout-ms", "20000", "--router-queue-limit", "2"]);
    let mut worker = Controlled::register(&fe).await;
    worker.report(true);
    wait_for_busy(&fe).await;
    let waiters: Vec<_> = (0..2).map(|_| tokio::spawn(send(&fe, fe.client.clone()))).collect();
    wait_waiting(&fe, 2.0).await;
    let (status, reason, took) = send(&fe, fe.client.clone()).await;
    assert_eq!((status, reason.as_deref()), (529, Some("queue_full")));
    assert!(took < Duration::from_secs(2), "at once, not after waiting: {took:?}");
    // One waiter per report: the second report must come after the first
    // dispatch (a report before it would find the worker not yet spent).
    worker.report(false);
    wait_received(&worker.http, 1).await;
    worker.report(false);
    for waiter in waiters {
        assert_eq!(waiter.await.unwrap().0, 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_sets_and_clears_a_models_timeout() {
    let _box = common::shared().await;
    let fe = frontend(&[]);
    let mut worker = Controlled::register(&fe).await;
    let admin = fe.admin.clone().expect("admin listener");
    let post = |body: serde_json::Value| {
        let (client, url) = (fe.client.clone(), format!("{admin}/busy_threshold"));
        async move {
            let r = client.post(url).json(&body).send().await.unwrap();
            (r.status().as_u16(), r.json::<serde_json::Value>().await.unwrap())
        }
    };
    let (status, body) = post(json!({"model": MODEL, "router_queue_timeout_ms": 5000})).await;
    assert_eq!((status, body["router_queue_timeout_ms"].as_u64()), (200, Some(5000)), "{body}");
    // Thresholds untouched.
    assert_eq!(body["active_decode_blocks_threshold"].as_f64(), Some(0.5));
    worker.report(true);
    wait_for_busy(&fe).await;
    let request = tokio::spawn(send(&fe, fe.client.clone()));
    wait_waiting(&fe, 1.0).await;
    worker.report(false);
    assert_eq!(request.await.unwrap().0, 200);
    let (status, body) = post(json!({"model": MODEL, "router_queue_timeout_ms": null})).await;
    assert_eq!((status, body["router_queue_timeout_ms"].as_u64()), (200, Some(0)), "{body}");
    worker.report(true);
    wait_for_busy(&fe).await;
    let (status, reason, took) = send(&fe, fe.client.clone()).await;
    assert_eq!(status, 529);
    assert_ne!(reason.as_deref(), Some("deadline"));
    assert!(took < Duration::from_millis(500), "cleared: the instant 529 again ({took:?})");
    let (status, _) = post(json!({"model": "no-such-model", "router_queue_timeout_ms": 10})).await;
    assert_eq!(status, 404);
    let (status, _) = post(json!({"model": MODEL, "router_queue_timeout_ms": -1})).await;
    assert_eq!(status, 400);
    // By class: shown as an object while the classes differ.
    let (status, body) = post(json!({"model": MODEL, "router_queue_timeout_ms": {"critical": 5000}})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["router_queue_timeout_ms"], json!({"critical": 5000, "standard": 0, "sheddable": 0}));
    let (status, _) = post(json!({"model": MODEL, "router_queue_timeout_ms": {"urgent": 5}})).await;
    assert_eq!(status, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_class_waits_up_to_its_own_timeout() {
    let _box = common::shared().await;
    let fe = frontend(&["--router-queue-timeout-ms", "critical=20000,standard=800", "--trust-priority-header"]);
    let mut worker = Controlled::register(&fe).await;
    worker.report(true);
    wait_for_busy(&fe).await;
    let client = common::client_within(Duration::from_secs(30));
    // Sheddable is not named: 0, no line: the instant 529 of the busy signal.
    let (status, reason, took) = send_with(&fe, client.clone(), "sheddable").await;
    assert_eq!((status, reason.as_deref()), (529, Some("decode_blocks")), "after {took:?}");
    assert!(took < Duration::from_millis(500), "{took:?}");
    // Standard waits its 800 ms (the ±100 ms of the deadline test, widened
    // below to 700 ms for a loaded machine: the point is that it waited).
    let (status, reason, took) = send_with(&fe, client.clone(), "standard").await;
    assert_eq!((status, reason.as_deref()), (529, Some("deadline")));
    assert!(took >= Duration::from_millis(700), "{took:?}");
    let critical = tokio::spawn(send_with(&fe, client.clone(), "critical"));
    wait_waiting(&fe, 1.0).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(!critical.is_finished(), "critical waits past the standard timeout");
    worker.report(false);
    let (status, _, _) = tokio::time::timeout(Duration::from_secs(5), critical).await.expect("served").unwrap();
    assert_eq!(status, 200);
}

/// Waits (bounded: 5 s) until the model's worker is busy.
async fn wait_for_busy(frontend: &Frontend) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = metrics_text(&frontend.client, &frontend.http).await;
        if metric(&text, "loadgate_frontend_worker_busy").is_some_and(|v| v >= 1.0) {
            return;
        }
        assert!(Instant::now() < deadline, "the worker never became busy:\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The sum of the samples of `name` whose labels contain `filter`.
fn metric_with(text: &str, name: &str, filter: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#') && l.contains(filter)) {
        let Some((series, value)) = line.rsplit_once(' ') else { continue };
        if series.split('{').next() == Some(name) {
            *found.get_or_insert(0.0) += value.parse::<f64>().unwrap_or(0.0);
        }
    }
    found
}

/// A worker that refuses every request at its hard cap (the refusal
/// header), counting them.
struct RefusingWorker {
    addr: std::net::SocketAddr,
    requests: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl RefusingWorker {
    fn start() -> RefusingWorker {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().unwrap();
        let requests = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = requests.clone();
        // Bounded: at most 64 connections, each read for at most 2 s; the
        // thread ends with the test process.
        std::thread::spawn(move || {
            for stream in listener.incoming().take(64) {
                let Ok(mut stream) = stream else { continue };
                let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                while let Ok(n @ 1..) = stream.read(&mut buf) {
                    seen.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&seen).to_ascii_lowercase();
                    let Some(at) = text.find("\r\n\r\n") else { continue };
                    let length: usize = text
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    if seen.len() >= at + 4 + length {
                        break;
                    }
                }
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let body = r#"{"error":{"message":"Server overloaded: worker at capacity","type":"Overloaded","param":null,"code":529}}"#;
                let answer = format!(
                    "HTTP/1.1 529 Site Overloaded\r\ncontent-type: application/json\r\nx-loadgate-refusal: worker-at-capacity\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes());
            }
        });
        RefusingWorker { addr, requests }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_every_worker_refused_at_its_cap_does_not_wait() {
    let _box = common::shared().await;
    let fe = frontend(&["--router-queue-timeout-ms", "10000"]);
    let refusing = RefusingWorker::start();
    let mut events = TcpStream::connect(fe.events).expect("event port");
    std::io::Write::write_all(&mut events, &encoded(&register(WORKER, 1, 1, MODEL, &refusing.addr.to_string())))
        .expect("register");
    fe.wait_workers(1, Duration::from_secs(10)).await;
    // Free by its reports, full at its cap: a refusal no publication would
    // end, so the request is refused as before, at once.
    let (status, reason, took) = send(&fe, fe.client.clone()).await;
    assert_eq!(status, 529);
    assert!(reason.as_deref().is_some_and(|r| r.contains("worker_capacity")), "{reason:?}");
    assert!(took < Duration::from_secs(2), "refused at once, not after the 10 s line: {took:?}");
    assert_eq!(refusing.requests.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(waiting(&fe).await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overrun_line_serves_the_latest_deadline_first() {
    let _box = common::shared().await;
    let fe = frontend(&["--router-queue-timeout-ms", "1500"]);
    let mut worker = Controlled::register(&fe).await;
    worker.report(true);
    wait_for_busy(&fe).await;
    let overrun = |fe: &Frontend| {
        let (client, http) = (fe.client.clone(), fe.http.clone());
        async move { metric(&metrics_text(&client, &http).await, "loadgate_frontend_queue_overrun") }
    };
    // Four requests, 400 ms apart: their deadlines are 400 ms apart (the
    // margin for each step below).
    let client = common::client_within(Duration::from_secs(30));
    let mut requests = Vec::new();
    for n in 1..=4 {
        if n > 1 {
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
        requests.push(tokio::spawn(send(&fe, client.clone())));
        wait_waiting(&fe, f64::from(n)).await;
    }
    assert_eq!(overrun(&fe).await, Some(0.0), "deadline order while nobody expired");
    // The first expires with three behind it and none served while it
    // waited: the line is overrun.
    wait_waiting(&fe, 3.0).await;
    assert_eq!(overrun(&fe).await, Some(1.0));
    worker.report(false);
    let mut outcomes = Vec::new();
    for request in requests {
        outcomes.push(tokio::time::timeout(Duration::from_secs(10), request).await.expect("answered").unwrap());
    }
    let statuses: Vec<_> = outcomes.iter().map(|(status, reason, _)| (*status, reason.as_deref())).collect();
    assert_eq!(
        statuses,
        [(529, Some("deadline")), (529, Some("deadline")), (529, Some("deadline")), (200, None)],
        "the freed worker took the latest deadline; the worker did not report again, so the others expired"
    );
    assert_eq!(worker.http.requests(), 1);
    wait_waiting(&fe, 0.0).await;
    assert_eq!(overrun(&fe).await, Some(0.0), "an empty line is in deadline order again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_critical_request_takes_a_sheddable_place_in_a_full_line_and_is_served_first() {
    let _box = common::shared().await;
    let fe = frontend(&["--router-queue-timeout-ms", "20000", "--router-queue-limit", "3", "--trust-priority-header"]);
    let mut worker = Controlled::register(&fe).await;
    worker.report(true);
    wait_for_busy(&fe).await;
    let client = common::client_within(Duration::from_secs(30));
    let mut sheddable = Vec::new();
    for n in 1..=3 {
        sheddable.push(tokio::spawn(send_with(&fe, client.clone(), "-1")));
        wait_waiting(&fe, f64::from(n)).await;
    }
    let (status, reason, _) = send_with(&fe, client.clone(), "standard").await;
    assert_eq!((status, reason.as_deref()), (529, Some("queue_full")), "a standard request displaces nobody");
    let critical = tokio::spawn(send_with(&fe, client.clone(), "critical"));
    // The latest sheddable request gives its place at once.
    let last = sheddable.pop().unwrap();
    let (status, reason, took) = tokio::time::timeout(Duration::from_secs(5), last).await.expect("answered").unwrap();
    assert_eq!((status, reason.as_deref()), (529, Some("class_shed")), "after {took:?}");
    wait_waiting(&fe, 3.0).await;
    assert_eq!(worker.http.requests(), 0);
    // One place frees: the critical request goes first, whatever the
    // sheddable ones' deadlines.
    worker.report(false);
    let (status, _, _) = tokio::time::timeout(Duration::from_secs(5), critical).await.expect("served").unwrap();
    assert_eq!(status, 200);
    assert_eq!(worker.http.requests(), 1);
    wait_waiting(&fe, 2.0).await;
    assert!(sheddable.iter().all(|r| !r.is_finished()), "the sheddable ones still wait");
    let text = metrics_text(&fe.client, &fe.http).await;
    let shed = metric_with(&text, "loadgate_frontend_rejection_reason_total", "reason=\"class_shed\"");
    assert_eq!(shed, Some(1.0), "{text}");
    let by_class = |class: &str, reason: &str| {
        let filter = format!("class=\"{class}\",reason=\"{reason}\"");
        metric_with(&text, "loadgate_frontend_rejection_class_reason_total", &filter)
    };
    assert_eq!(by_class("sheddable", "class_shed"), Some(1.0), "{text}");
    assert_eq!(by_class("standard", "queue_full"), Some(1.0), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_trust_cannot_promote_itself() {
    let _box = common::shared().await;
    let fe = frontend(&["--router-queue-timeout-ms", "20000", "--router-queue-limit", "1"]);
    let mut worker = Controlled::register(&fe).await;
    worker.report(true);
    wait_for_busy(&fe).await;
    let client = common::client_within(Duration::from_secs(30));
    let first = tokio::spawn(send_with(&fe, client.clone(), "sheddable"));
    wait_waiting(&fe, 1.0).await;
    // Without --trust-priority-header both are standard: the line is full,
    // and nobody is displaced (an unreadable value is not even read).
    for priority in ["critical", "99", "nonsense"] {
        let (status, reason, _) = send_with(&fe, client.clone(), priority).await;
        assert_eq!((status, reason.as_deref()), (529, Some("queue_full")), "{priority}");
    }
    assert!(!first.is_finished(), "the first still waits: it was not displaced");
    worker.report(false);
    let (status, _, _) = tokio::time::timeout(Duration::from_secs(5), first).await.expect("served").unwrap();
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_priority_that_is_not_a_class_is_a_bad_request() {
    let _box = common::shared().await;
    let fe = frontend(&["--trust-priority-header"]);
    let _worker = Controlled::register(&fe).await;
    let (status, _, _) = send_with(&fe, fe.client.clone(), "urgent").await;
    assert_eq!(status, 400);
}

/// Sends one completion to `base` whose body carries
/// `nvext.agent_hints.priority`; its status and reason header.
async fn send_nvext(base: String, client: reqwest::Client, priority: i64) -> (u16, Option<String>) {
    let body =
        json!({"model": MODEL, "prompt": "hi", "max_tokens": 4, "nvext": {"agent_hints": {"priority": priority}}});
    let response = client.post(format!("{base}/v1/completions")).json(&body).send().await.expect("send");
    let reason = response.headers().get("x-loadgate-rejected-reason").and_then(|v| v.to_str().ok()).map(str::to_owned);
    (response.status().as_u16(), reason)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nvext_priority_sets_the_class_in_vllms_order() {
    let _box = common::shared().await;
    let fe = frontend(&[
        "--router-queue-timeout-ms",
        "20000",
        "--router-queue-limit",
        "1",
        "--trust-priority-header",
        "--priority-from-nvext",
        "vllm",
    ]);
    let mut worker = Controlled::register(&fe).await;
    worker.report(true);
    wait_for_busy(&fe).await;
    let client = common::client_within(Duration::from_secs(30));
    // vLLM's order: a positive value is scheduled late (sheddable), a
    // negative one early (critical).
    let sheddable = tokio::spawn(send_nvext(fe.http.clone(), client.clone(), 5));
    wait_waiting(&fe, 1.0).await;
    let (status, reason) = send_nvext(fe.http.clone(), client.clone(), 0).await;
    assert_eq!((status, reason.as_deref()), (529, Some("queue_full")), "priority 0: standard, displaces nobody");
    let critical = tokio::spawn(send_nvext(fe.http.clone(), client, -1));
    let (status, reason) = tokio::time::timeout(Duration::from_secs(5), sheddable).await.expect("answered").unwrap();
    assert_eq!((status, reason.as_deref()), (529, Some("class_shed")));
    worker.report(false);
    let (status, _) = tokio::time::timeout(Duration::from_secs(5), critical).await.expect("served").unwrap();
    assert_eq!(status, 200);
}

#[test]
fn priority_from_nvext_without_trust_refuses_to_start() {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_loadgate"))
        .args(["frontend", "--http-host", "127.0.0.1", "--http-port", "0", "--priority-from-nvext", "sglang"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn loadgate");
    // A flag error exits at once; bounded anyway (10 s).
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait().expect("wait").is_none() {
        assert!(Instant::now() < deadline, "it started");
        std::thread::sleep(Duration::from_millis(10));
    }
    let output = child.wait_with_output().expect("output");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("--trust-priority-header"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bench_sends_its_class_mix_and_counts_each_class() {
    let _box = common::shared().await;
    let fe = frontend(&["--trust-priority-header"]);
    let mut worker = Controlled::register(&fe).await;
    worker.report(true);
    wait_for_busy(&fe).await;
    // Every request is refused at once (no line): the bench's per-class
    // counts must be the frontend's.
    let url = fe.http.clone();
    let args = [
        "bench",
        "--url",
        url.as_str(),
        "--model",
        MODEL,
        "--rate",
        "60",
        "--duration",
        "1",
        "--mix",
        "critical=0.3,standard=0.4,sheddable=0.3",
        "--seed",
        "7",
        "--drain-timeout",
        "5",
        "--json",
    ];
    let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
    let (_bench, line) = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        common::spawn_within("bench", &args, &[], Duration::from_secs(30))
    })
    .await
    .unwrap();
    let summary: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    let text = metrics_text(&fe.client, &fe.http).await;
    let mut sent = 0;
    for class in ["critical", "standard", "sheddable"] {
        let counts = &summary["by_class"][class];
        let n = counts["sent"].as_u64().expect("sent");
        assert!(n > 0, "{class}: {summary}");
        assert_eq!(counts["rejected"].as_u64(), Some(n), "{class}: {summary}");
        let filter = format!("class=\"{class}\",reason=\"decode_blocks\"");
        let counted = metric_with(&text, "loadgate_frontend_rejection_class_reason_total", &filter);
        assert_eq!(counted, Some(n as f64), "{class}: the frontend counted what the bench sent\n{text}");
        sent += n;
    }
    assert_eq!(summary["sent"].as_u64(), Some(sent));
}
