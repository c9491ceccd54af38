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
#[path = "line/mod.rs"]
mod line;

use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{encoded, metric, metrics_text, register, Frontend};
use line::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_request_is_served_when_its_worker_frees() {
    let _box = common::shared().await;
    let (fe, mut worker) = busy(&["--router-queue-timeout-ms", "10000"]).await;
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
    let (fe, worker) = busy(&["--router-queue-timeout-ms", "1000"]).await;
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
    let (fe, mut worker) = busy(&["--router-queue-timeout-ms", "20000"]).await;
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

/// The model's last worker leaves (a restart's first half) while a request
/// waits: there is nothing left to wait for, so the request hears at once
/// that no worker is available (503), as a request sent then would, not a
/// 529 at its deadline 20 s later. Back as its next incarnation, the worker
/// serves through the model's new line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_request_hears_at_once_when_the_models_last_worker_leaves() {
    let _box = common::shared().await;
    let (fe, mut worker) = busy(&["--router-queue-timeout-ms", "20000"]).await;
    let request = tokio::spawn(send(&fe, fe.client.clone()));
    wait_waiting(&fe, 1.0).await;
    worker.leave();
    let (status, reason, took) = tokio::time::timeout(Duration::from_secs(5), request)
        .await
        .expect("answered well before its deadline")
        .unwrap();
    assert_eq!((status, reason), (503, None), "answered after {took:?}");
    fe.wait_workers(0, Duration::from_secs(5)).await;
    worker.come_back_busy(&fe).await;
    let request = tokio::spawn(send(&fe, fe.client.clone()));
    wait_waiting(&fe, 1.0).await;
    worker.report(false);
    let (status, _, took) = tokio::time::timeout(Duration::from_secs(5), request).await.expect("served").unwrap();
    assert_eq!(status, 200, "served after {took:?}");
    assert_eq!(worker.http.requests(), 1);
    wait_waiting(&fe, 0.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_freed_worker_takes_one_waiter_per_report_of_its_own() {
    let _box = common::shared().await;
    let (fe, mut worker) = busy(&["--router-queue-timeout-ms", "20000"]).await;
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
    let (fe, mut worker) = busy(&["--router-queue-timeout-ms", "20000", "--router-queue-limit", "2"]).await;
    let waiters: Vec<_> = (0..2).map(|_| tokio::spawn(send(&fe, fe.client.clone()))).collect();
    wait_waiting(&fe, 2.0).await;
    let (status, reason, took) = send(&fe, fe.client.clone()).await;
    assert_eq!((status, reason.as_deref()), (529, Some("queue_full")));
    assert!(took < Duration::from_secs(2), "at once, not after waiting: {took:?}");
    worker.serve(waiters).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_limit_counts_prompts_in_every_router_mode() {
    let _box = common::shared().await;
    // The default router mode (round-robin) tracks no load of its own: the
    // prompts are counted for the line's token bound alone. Each request's
    // prompt is "hello there": 2 tokens.
    let (fe, mut worker) = busy(&["--router-queue-timeout-ms", "20000", "--router-queue-token-limit", "5"]).await;
    let waiters: Vec<_> = (0..2).map(|_| tokio::spawn(send(&fe, fe.client.clone()))).collect();
    wait_waiting(&fe, 2.0).await;
    let text = metrics_text(&fe.client, &fe.http).await;
    assert_eq!(metric(&text, "loadgate_frontend_queue_tokens"), Some(4.0), "{text}");
    let (status, reason, _) = send(&fe, fe.client.clone()).await;
    assert_eq!((status, reason.as_deref()), (529, Some("queue_full")), "6 tokens would pass 5");
    worker.serve(waiters).await;
}

/// A prompt without whitespace counted as one token however long it was
/// (base64, a URL, Chinese), so it passed the line's token limit (and a
/// tenant's `max_tokens`) and waited. Now a word counts one token per 8
/// bytes: both are refused at once. Found by a review.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_without_spaces_is_not_one_token() {
    let _box = common::shared().await;
    let (fe, worker) = busy(&["--router-queue-timeout-ms", "20000", "--router-queue-token-limit", "5"]).await;
    let blob = "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0NTY3".repeat(500);
    let cjk = "负载均衡器应当拒绝过多的请求".repeat(430);
    for prompt in [blob, cjk] {
        let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 4});
        let started = Instant::now();
        let response = fe.client.post(format!("{}/v1/completions", fe.http)).json(&body).send().await.unwrap();
        let reason = response.headers().get("x-loadgate-rejected-reason").map(|v| v.to_str().unwrap().to_owned());
        assert_eq!(
            (response.status().as_u16(), reason.as_deref()),
            (529, Some("queue_full")),
            "{} bytes",
            prompt.len()
        );
        assert!(started.elapsed() < Duration::from_secs(10), "refused at once, not at the 20 s deadline");
    }
    drop(worker);
}

/// `POST /busy_threshold` with `body` on the admin listener: the status and
/// the JSON answer.
async fn admin_post(fe: &common::Frontend, body: serde_json::Value) -> (u16, serde_json::Value) {
    let admin = fe.admin.clone().expect("admin listener");
    let r = fe.client.post(format!("{admin}/busy_threshold")).json(&body).send().await.unwrap();
    (r.status().as_u16(), r.json::<serde_json::Value>().await.unwrap())
}

/// Found by a review: a `POST /busy_threshold` that set only the line's
/// timeout did not keep the model, as one that sets a threshold does, so
/// the timeout went with the model when its last worker left (and the docs
/// said both were kept). Now any change keeps the model, so its timeout
/// stays whatever happens meanwhile (before an earlier fix, a read of
/// `/metrics` decided whether it stayed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_set_through_the_admin_api_outlives_the_models_last_worker() {
    let _box = common::shared().await;
    let fe = frontend(&[]);
    let mut worker = Controlled::register(&fe).await;
    let (status, body) = admin_post(&fe, json!({"model": MODEL, "router_queue_timeout_ms": 5000})).await;
    assert_eq!((status, body["router_queue_timeout_ms"].as_u64()), (200, Some(5000)), "{body}");
    worker.leave();
    fe.wait_workers(0, Duration::from_secs(10)).await;
    let (status, body) = admin_post(&fe, json!({"model": MODEL})).await;
    assert_eq!((status, body["router_queue_timeout_ms"].as_u64()), (200, Some(5000)), "kept: {body}");
    worker.come_back_busy(&fe).await;
    let request = tokio::spawn(send(&fe, fe.client.clone()));
    wait_waiting(&fe, 1.0).await;
    worker.report(false);
    assert_eq!(request.await.unwrap().0, 200, "the kept timeout lets it wait for the worker back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_sets_and_clears_a_models_timeout() {
    let _box = common::shared().await;
    let fe = frontend(&[]);
    let mut worker = Controlled::register(&fe).await;
    let post = |body| admin_post(&fe, body);
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
    let (fe, mut worker) = busy(&["--router-queue-timeout-ms", "3000"]).await;
    let overrun = |fe: &Frontend| {
        let (client, http) = (fe.client.clone(), fe.http.clone());
        async move { metric(&metrics_text(&client, &http).await, "loadgate_frontend_queue_overrun") }
    };
    // Four requests, 700 ms apart: their deadlines are 700 ms apart (the
    // margin for each step below, on a loaded 2-core machine), and the last
    // joins about 900 ms before the first expires.
    let client = common::client_within(Duration::from_secs(30));
    let mut requests = Vec::new();
    for n in 1..=4 {
        if n > 1 {
            tokio::time::sleep(Duration::from_millis(700)).await;
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

/// The retry hint of a refusal is never less than the line's expected wait
/// (docs/deployment.md, the retry hint), also once the admin API took the
/// line away from newcomers (`router_queue_timeout_ms: 0`): those already
/// waiting keep their deadlines, and a client refused beside them comes
/// back only after them. Before, the hint forgot them (1 s or so, with 20
/// waiting an expected 20 s: no request has finished, 1 s each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_beside_a_line_closed_to_newcomers_still_counts_its_waiters() {
    let _box = common::shared().await;
    let (fe, _worker) = busy(&["--router-queue-timeout-ms", "20000"]).await;
    let client = common::client_within(Duration::from_secs(30));
    let waiters: Vec<_> = (0..20).map(|_| tokio::spawn(send(&fe, client.clone()))).collect();
    wait_waiting(&fe, 20.0).await;
    let hint_ms = || async {
        let body = json!({"model": MODEL, "prompt": "hello there", "max_tokens": 4});
        let response = fe.client.post(format!("{}/v1/completions", fe.http)).json(&body).send().await.unwrap();
        assert_eq!(response.status().as_u16(), 529);
        let hint = response.headers().get("retry-after-ms").expect("retry-after-ms").to_str().unwrap().to_owned();
        hint.parse::<f64>().unwrap()
    };
    let (status, body) = admin_post(&fe, json!({"model": MODEL, "router_queue_timeout_ms": 0})).await;
    assert_eq!(status, 200, "{body}");
    let hint = hint_ms().await;
    assert!(hint >= 19_000.0, "a refusal beside 20 waiters was told to retry after {hint} ms");
    assert_eq!(waiting(&fe).await, 20.0, "those waiting keep their places");
    for waiter in &waiters {
        assert!(!waiter.is_finished());
    }
}

/// The admin API clears the model's last threshold while requests wait:
/// nothing can be busy any more ("no threshold configured: nothing is ever
/// excluded"), so the waiters go at once, and so do newcomers. Before, the
/// line kept giving the worker one waiter per report of its own (the
/// pacing that lets a report say whether the worker can take another,
/// though no report could say so now): the rest waited for reports and,
/// without, were refused at their deadlines, newcomers behind them too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clearing_the_last_threshold_lets_the_whole_line_go() {
    let _box = common::shared().await;
    let (fe, worker) = busy(&["--router-queue-timeout-ms", "10000"]).await;
    let client = common::client_within(Duration::from_secs(30));
    let waiters: Vec<_> = (0..10).map(|_| tokio::spawn(send(&fe, client.clone()))).collect();
    wait_waiting(&fe, 10.0).await;
    let (status, body) = admin_post(&fe, json!({"model": MODEL, "active_decode_blocks_threshold": null})).await;
    assert_eq!(status, 200, "{body}");
    for (n, waiter) in waiters.into_iter().enumerate() {
        let (status, reason, took) =
            tokio::time::timeout(Duration::from_secs(5), waiter).await.expect("answered").unwrap();
        assert_eq!(status, 200, "waiter {n}: {reason:?} after {took:?}");
        assert!(took < Duration::from_secs(5), "waiter {n} served after {took:?}");
    }
    let (status, _, took) = send(&fe, client.clone()).await;
    assert_eq!(status, 200, "a newcomer after {took:?}");
    wait_waiting(&fe, 0.0).await;
    assert_eq!(worker.http.requests(), 11);
}

/// `loadgate_frontend_queue_tokens` is the prompt tokens waiting in the
/// line (docs/deployment.md, metrics) whatever limits are set. Before, the
/// prompts were counted only with a token limit, a tenants file or the
/// router's own tracking: with the line alone (the default) it read 0
/// while requests waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_gauge_counts_the_waiting_prompts_without_a_token_limit() {
    let _box = common::shared().await;
    let (fe, mut worker) = busy(&["--router-queue-timeout-ms", "20000"]).await;
    // "hello there": 2 tokens each.
    let waiters: Vec<_> = (0..3).map(|_| tokio::spawn(send(&fe, fe.client.clone()))).collect();
    wait_waiting(&fe, 3.0).await;
    let text = metrics_text(&fe.client, &fe.http).await;
    assert_eq!(metric(&text, "loadgate_frontend_queue_tokens"), Some(6.0), "{text}");
    for k in 1..=3 {
        worker.report(false);
        wait_received(&worker.http, k).await;
    }
    for waiter in waiters {
        assert_eq!(waiter.await.unwrap().0, 200);
    }
    let text = metrics_text(&fe.client, &fe.http).await;
    assert_eq!(metric(&text, "loadgate_frontend_queue_tokens"), Some(0.0), "{text}");
}

/// Found by a review: a request whose client went away while it waited was
/// left out of `loadgate_frontend_queue_wait_seconds` (docs: every request
/// of a model with a line), so a line whose clients give up showed only
/// the waits of those that stayed. Its wait now counts too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_its_client_abandoned_counts_in_the_histogram() {
    let _box = common::shared().await;
    let (fe, _worker) = busy(&["--router-queue-timeout-ms", "20000"]).await;
    let impatient = reqwest::Client::builder().timeout(Duration::from_millis(1500)).build().unwrap();
    let request = tokio::spawn(send(&fe, impatient));
    wait_waiting(&fe, 1.0).await;
    assert!(tokio::time::timeout(Duration::from_secs(10), request).await.expect("client gave up").is_err());
    wait_waiting(&fe, 0.0).await;
    let text = metrics_text(&fe.client, &fe.http).await;
    assert_eq!(metric(&text, "loadgate_frontend_queue_wait_seconds_count"), Some(1.0), "{text}");
    let sum = metric(&text, "loadgate_frontend_queue_wait_seconds_sum").unwrap_or_default();
    assert!(sum >= 0.5, "waited about 1.5 s, counted {sum} s");
}

/// Found by a review: SIGTERM while a request waited in the line left it
/// waiting through the drain, although no new work starts while draining
/// (docs/deployment.md "Shutdown": a completion then gets 503 Unavailable
/// with a retry hint): a worker freed meanwhile was given it, and without
/// one it was cut at the drain timeout (5 s) with no answer at all. It now
/// hears 503 with the hint at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_hears_503_at_once_when_the_frontend_drains() {
    let _box = common::shared().await;
    let (fe, worker) = busy(&["--router-queue-timeout-ms", "20000"]).await;
    let (url, client) = (format!("{}/v1/completions", fe.http), fe.client.clone());
    let request = tokio::spawn(async move {
        let body = json!({"model": MODEL, "prompt": "hello there", "max_tokens": 4});
        let response = client.post(url).json(&body).send().await.map_err(|e| e.to_string())?;
        let hint = response.headers().get("retry-after-ms").and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        Ok::<_, String>((response.status().as_u16(), hint))
    });
    wait_waiting(&fe, 1.0).await;
    let signalled = Instant::now();
    fe.proc.terminate();
    let answer = tokio::time::timeout(Duration::from_secs(25), request).await.expect("an end").unwrap();
    let took = signalled.elapsed();
    let (status, hint) = answer.unwrap_or_else(|e| panic!("no answer {took:?} after SIGTERM: {e}"));
    assert_eq!(status, 503, "{took:?} after SIGTERM");
    assert!(hint.is_some_and(|ms| ms >= 1000), "the retry hint: {hint:?}");
    assert!(took < Duration::from_secs(4), "at once, not at the 5 s drain timeout: {took:?}");
    assert_eq!(worker.http.requests(), 0);
}

/// Found by a review: a request given a worker from the line that then
/// failed (its connection) waits again, and each wait was its own sample of
/// `loadgate_frontend_queue_wait_seconds`: one request counted twice, each
/// time with part of its wait (the access log's `waited_ms` is the sum). A
/// request's time in the line is now one sample, its whole wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_waits_twice_is_one_sample_of_its_whole_wait() {
    let _box = common::shared().await;
    let (fe, mut worker) = busy(&["--router-queue-timeout-ms", "20000"]).await;
    // A second worker whose every connection is closed at once, busy too.
    let closing = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let closing_addr = closing.local_addr().unwrap().to_string();
    std::thread::spawn(move || closing.incoming().take(16).for_each(drop));
    let mut events = TcpStream::connect(fe.events).expect("event port");
    let load = |seq, blocks| {
        let load = loadgate::RankLoad { active_decode_blocks: blocks, kv_total_blocks: 100, ..Default::default() };
        encoded(&loadgate::wire::Frame::Load { worker: 8, incarnation: 1, rank: 0, seq, load })
    };
    std::io::Write::write_all(&mut events, &encoded(&register(8, 1, 1, MODEL, &closing_addr))).expect("register");
    std::io::Write::write_all(&mut events, &load(1, 90)).expect("report");
    fe.wait_workers(2, Duration::from_secs(10)).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while metric(&metrics_text(&fe.client, &fe.http).await, "loadgate_frontend_worker_busy") != Some(2.0) {
        assert!(Instant::now() < deadline, "both workers never became busy");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let request = tokio::spawn(send(&fe, fe.client.clone()));
    wait_waiting(&fe, 1.0).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Freed, the closing worker takes the waiter and fails it: it waits again.
    std::io::Write::write_all(&mut events, &load(2, 10)).expect("report");
    let tried = |text: &str| metric(text, "loadgate_frontend_upstream_failures_total").is_some_and(|n| n >= 1.0);
    common::wait_for_metrics(&fe.client, &fe.http, Duration::from_secs(5), "the closing worker was never tried", tried)
        .await;
    wait_waiting(&fe, 1.0).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    worker.report(false);
    let (status, _, took) = tokio::time::timeout(Duration::from_secs(10), request).await.expect("served").unwrap();
    assert_eq!(status, 200, "served after {took:?}");
    let text = metrics_text(&fe.client, &fe.http).await;
    assert_eq!(metric(&text, "loadgate_frontend_queue_wait_seconds_count"), Some(1.0), "one request: {text}");
    let sum = metric(&text, "loadgate_frontend_queue_wait_seconds_sum").unwrap_or_default();
    assert!(sum >= 0.5, "waited over 0.6 s in all, counted {sum} s");
}
