//! Upstream faults: workers killed under load in every router mode, a
//! worker that stops answering (first byte, between chunks), refusals
//! signalled with an overload status of 200, and refusals that come after
//! the frontend let go of the body.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::common::{self, register, EventConn, Frontend, Worker, SECRET};

/// A worker `kill -9`ed every [`KILL_EVERY`] under load, and a new one
/// started: every client gets an answer (200, or 529), never a 503 while a
/// live worker exists; killed workers leave, the new ones take the traffic;
/// every gauge is back to 0 after.
async fn kill_loop(mode: &str) {
    const KILL_EVERY: Duration = Duration::from_millis(1200);
    const KILLS: usize = 4;
    let _serial = common::exclusive().await;
    // A request stuck on a worker ends (logged with the worker) well within
    // the clients' 10 s: a failure then says where it was stuck. A request
    // here takes milliseconds.
    let frontend = Frontend::start(
        None,
        &["--router-mode", mode, "--router-track-output-blocks", "--upstream-first-byte-timeout-secs", "5"],
    );
    let start_worker = {
        let events = frontend.events;
        move || common::worker(Some(events), "m", None, &["--decode-step-ms", "2"])
    };
    let workers: Arc<Mutex<Vec<Worker>>> = Arc::new(Mutex::new((0..3).map(|_| start_worker()).collect()));
    frontend.wait_workers(3, Duration::from_secs(10)).await;
    let started = Instant::now();
    let killer = {
        let workers = workers.clone();
        tokio::task::spawn_blocking(move || {
            let mut kills = Vec::new();
            for _ in 0..KILLS {
                std::thread::sleep(KILL_EVERY);
                let mut oldest = workers.lock().unwrap().remove(0);
                oldest.proc.kill();
                kills.push(started.elapsed());
                let fresh = start_worker();
                workers.lock().unwrap().push(fresh);
            }
            kills
        })
    };
    let run_for = KILL_EVERY * (KILLS as u32 + 1);
    let outcomes = common::load(&frontend.http, "m", 6, run_for, 100_000, Duration::from_secs(10)).await;
    let kills = killer.await.expect("the killer panicked");
    let statuses = common::by_status(&outcomes);
    eprintln!("{mode}: {} requests in {run_for:?}, workers killed at {kills:?}, statuses {statuses:?}", outcomes.len());
    let odd: Vec<_> = outcomes.iter().filter(|o| !matches!(o.status, 200 | 529)).take(5).collect();
    if !odd.is_empty() {
        // What each process holds now, for the failure's message.
        let mut held =
            format!("frontend:\n{}", in_flight(&common::metrics_text(&frontend.client, &frontend.http).await));
        let live: Vec<String> = workers.lock().unwrap().iter().map(|w| w.http.clone()).collect();
        for url in live {
            held += &format!("worker {url}:\n{}", in_flight(&common::metrics_text(&frontend.client, &url).await));
        }
        panic!("{mode}: answers other than 200/529 (none may be 503 while a live worker exists): {odd:?}\n{held}");
    }
    // Every original worker is gone by the last kill: the requests after it
    // were served by workers started during the run.
    let last_kill = kills.last().copied().unwrap_or_default();
    let after = outcomes.iter().filter(|o| o.sent > last_kill + Duration::from_millis(100)).count();
    assert!(after > 0, "{mode}: no request after the last kill");
    frontend.wait_workers(3, Duration::from_secs(5)).await;
    let text = common::metrics_text(&frontend.client, &frontend.http).await;
    for gauge in [
        "loadgate_frontend_inflight_requests",
        "loadgate_frontend_tracked_blocks",
        "loadgate_frontend_tracked_prefill_tokens",
    ] {
        assert_eq!(common::metric(&text, gauge), Some(0.0), "{mode}: {gauge} after the run:\n{text}");
    }
}

/// The in-flight, tracked and queued samples of a frontend's or a worker's
/// `/metrics` text, a line each.
fn in_flight(text: &str) -> String {
    let names = ["inflight", "tracked", "engine_request", "request_queue"];
    let held = |line: &&str| !line.starts_with('#') && names.iter().any(|name| line.contains(name));
    text.lines().filter(held).map(|line| format!("  {line}\n")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_workers_under_load_round_robin() {
    kill_loop("round-robin").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_workers_under_load_random() {
    kill_loop("random").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_workers_under_load_p2c() {
    kill_loop("p2c").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_workers_under_load_least_loaded() {
    kill_loop("least-loaded").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_workers_under_load_kv() {
    kill_loop("kv").await;
}

/// The only worker freezes: a request sent to it ends at the first-byte
/// timeout with a 504 in OpenAI's shape (no other worker can take it); a
/// stream it stops in the middle of is cut at the between-chunks timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_stops_answering_gets_504_or_a_cut_stream_at_the_timeouts() {
    let _serial = common::exclusive().await;
    let frontend = Frontend::start(
        None,
        &[
            "--upstream-first-byte-timeout-secs",
            "2",
            "--upstream-chunk-timeout-secs",
            "1",
            "--event-silence-ms",
            "5000",
        ],
    );
    let worker = common::worker(Some(frontend.events), "m", None, &["--decode-step-ms", "20"]);
    frontend.wait_workers(1, Duration::from_secs(10)).await;
    let client = common::client_within(Duration::from_secs(10));

    // A stream of 200 tokens (4 s); frozen after its first chunks.
    let body = json!({"model": "m", "prompt": "hello", "max_tokens": 200, "stream": true});
    let mut stream = client.post(format!("{}/v1/completions", frontend.http)).json(&body).send().await.unwrap();
    assert_eq!(stream.status(), 200);
    let first = stream.chunk().await.unwrap().expect("a first chunk");
    assert!(!first.is_empty());
    common::signal(worker.proc.pid(), "STOP");
    let froze = Instant::now();
    let mut ended = None;
    while froze.elapsed() < Duration::from_secs(8) {
        match stream.chunk().await {
            Ok(Some(_)) => continue,
            Ok(None) => {
                ended = Some(("end", froze.elapsed()));
                break;
            }
            Err(_) => {
                ended = Some(("cut", froze.elapsed()));
                break;
            }
        }
    }
    eprintln!("stream of a frozen worker: {ended:?} after the freeze");
    let (how, after) = ended.expect("the stream ended");
    assert_eq!(how, "cut", "the stream is cut, not ended as if complete");
    assert!(after >= Duration::from_millis(900) && after < Duration::from_secs(3), "cut after {after:?}");

    // A new request to the frozen worker (still in routing: silence 5 s).
    let t = Instant::now();
    let (status, text) = common::complete(&client, &frontend.http, "m", None).await;
    let took = t.elapsed();
    eprintln!("request to the frozen worker: {status} after {took:?}: {text}");
    assert_eq!(status, 504, "{text}");
    let error: Value = serde_json::from_str(&text).expect("a JSON error body");
    assert!(error["error"]["message"].is_string(), "{text}");
    assert!(took >= Duration::from_millis(1900) && took < Duration::from_secs(4), "{took:?}");
    let metrics = common::metrics_text(&frontend.client, &frontend.http).await;
    for kind in ["first_byte_timeout", "between_chunks_timeout"] {
        let line = format!("loadgate_frontend_upstream_failures_total{{kind=\"{kind}\"}} 1");
        assert!(metrics.contains(&line), "{line} in\n{metrics}");
    }
    common::signal(worker.proc.pid(), "CONT");
}

/// A worker whose overload status is 200 still refuses with the header: the
/// frontend migrates, and no client receives a refusal as a completion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_with_an_overload_status_of_200_are_never_relayed_as_completions() {
    let _serial = common::exclusive().await;
    let frontend = Frontend::start(None, &["--router-mode", "round-robin"]);
    let capped_env = [("DYN_HTTP_OVERLOAD_STATUS_CODE", "200"), ("DYN_DYNAMO_REQUEST_QUEUE_LIMIT", "2")];
    let capped = common::worker_with_env(
        Some(frontend.events),
        "m",
        &capped_env,
        &["--engine-request-limit", "1", "--decode-step-ms", "10"],
    );
    let _roomy = common::worker(Some(frontend.events), "m", None, &["--decode-step-ms", "10"]);
    frontend.wait_workers(2, Duration::from_secs(10)).await;
    let client = common::client_within(Duration::from_secs(20));
    let body = json!({"model": "m", "prompt": "hello", "max_tokens": 50});
    let mut tasks = Vec::new();
    for _ in 0..24 {
        let (client, url, body) = (client.clone(), format!("{}/v1/completions", frontend.http), body.clone());
        tasks.push(tokio::spawn(async move {
            let response = client.post(url).json(&body).send().await.unwrap();
            (response.status().as_u16(), response.text().await.unwrap_or_default())
        }));
    }
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    let worker_metrics = common::metrics_text(&frontend.client, &capped.http).await;
    let refused = common::metric(&worker_metrics, "dynamo_rejection_request_total").unwrap_or(0.0);
    let completions = answers.iter().filter(|(s, b)| *s == 200 && b.contains("\"choices\"")).count();
    eprintln!(
        "overload status 200: {} answers, {completions} completions, the capped worker refused {refused}",
        answers.len()
    );
    assert!(refused >= 1.0, "the capped worker never refused: the test did not exercise refusals");
    for (status, text) in &answers {
        assert!(!text.contains("worker at capacity"), "a refusal reached the client ({status}): {text}");
        assert!(*status == 200 && text.contains("\"choices\""), "not a completion ({status}): {text}");
    }
}

/// A raw upstream on a free port: reads each request (its head and a
/// `Content-Length` body), counts it, answers `head` at once, holds the
/// connection for `hold` and closes it (a chunked body never ended).
async fn breaking_upstream(head: &'static [u8], hold: Duration) -> (String, Arc<AtomicUsize>) {
    late_upstream(head, Duration::ZERO, hold).await
}

/// As [`breaking_upstream`], answering `answer` only `after` the whole
/// request was read.
async fn late_upstream(answer: &'static [u8], after: Duration, hold: Duration) -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 8192];
                let head_end = loop {
                    match tcp.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                    if let Some(at) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                        break at + 4;
                    }
                };
                let text = String::from_utf8_lossy(&got[..head_end]).to_ascii_lowercase();
                let len: usize = text
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                while got.len() < head_end + len {
                    match tcp.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                // Relaxed: a count read after the client's answer.
                seen.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(after).await;
                let _ = tcp.write_all(answer).await;
                tokio::time::sleep(hold).await;
            });
        }
    });
    (addr.to_string(), count)
}

/// Found by a review: a worker that answers a stream's head at once and
/// holds the request past the release grace (1 s) has taken it; when its
/// connection then breaks before the first token, the request is not run
/// again on another worker (it was: the grace stopped counting once the
/// head arrived, so the break counted as "not taken" and migrated).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_a_worker_held_past_the_grace_is_not_sent_again_when_it_breaks() {
    let _serial = common::exclusive().await;
    let frontend = Frontend::secured(&[
        "--router-mode",
        "round-robin",
        "--event-idle-timeout-ms",
        "600000",
        "--event-silence-ms",
        "600000",
        "--upstream-first-byte-timeout-secs",
        "30",
    ]);
    let head: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
    let (a, a_count) = breaking_upstream(head, Duration::from_secs(2)).await;
    let (b, b_count) = breaking_upstream(head, Duration::from_secs(2)).await;
    let mut conn_a = EventConn::authenticated(frontend.events, SECRET);
    conn_a.send(&register(7001, 1, 1, "m", &a)).unwrap();
    let mut conn_b = EventConn::authenticated(frontend.events, SECRET);
    conn_b.send(&register(7002, 1, 1, "m", &b)).unwrap();
    frontend.wait_workers(2, Duration::from_secs(5)).await;
    let client = common::client_within(Duration::from_secs(20));
    let body = json!({"model": "m", "prompt": "hello", "max_tokens": 8, "stream": true});
    let response = client.post(format!("{}/v1/completions", frontend.http)).json(&body).send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap_or_default();
    // Relaxed: the upstreams counted before they answered.
    let sent = a_count.load(Ordering::Relaxed) + b_count.load(Ordering::Relaxed);
    assert_eq!(sent, 1, "sent to {sent} workers; the client got {status}: {text}");
    assert_eq!(status, 502, "{text}");
    drop((conn_a, conn_b));
}

/// Found by a review: a worker that refuses at its cap only after it has
/// held the whole body past the release grace (1 s; its cap filled while it
/// read and parsed a large body, or its engine could not be reached in
/// time) gets no second attempt elsewhere, since the frontend has let go of
/// the body. The client got 502 "worker unreachable" (the next worker's
/// attempt found no body to send); nothing ran, so it gets the overload
/// answer with its retry hint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_after_the_body_was_let_go_is_the_overload_answer() {
    let _serial = common::exclusive().await;
    let frontend = Frontend::secured(&[
        "--router-mode",
        "round-robin",
        "--event-idle-timeout-ms",
        "600000",
        "--event-silence-ms",
        "600000",
    ]);
    let refusal: &[u8] = b"HTTP/1.1 529 Overloaded\r\nx-loadgate-refusal: worker-at-capacity\r\n\
        content-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
    // Margin: the refusal comes 2 s after the grace ends (the first-byte
    // timeout, 120 s, is far).
    let (a, a_count) = late_upstream(refusal, Duration::from_secs(3), Duration::ZERO).await;
    let (b, b_count) = late_upstream(refusal, Duration::from_secs(3), Duration::ZERO).await;
    let mut conn_a = EventConn::authenticated(frontend.events, SECRET);
    conn_a.send(&register(7101, 1, 1, "m", &a)).unwrap();
    let mut conn_b = EventConn::authenticated(frontend.events, SECRET);
    conn_b.send(&register(7102, 1, 1, "m", &b)).unwrap();
    frontend.wait_workers(2, Duration::from_secs(5)).await;
    let client = common::client_within(Duration::from_secs(20));
    let body = json!({"model": "m", "prompt": "hello", "max_tokens": 8});
    let response = client.post(format!("{}/v1/completions", frontend.http)).json(&body).send().await.unwrap();
    let status = response.status().as_u16();
    let reason = response.headers().get("x-loadgate-rejected-reason").map(|v| v.to_str().unwrap_or("").to_owned());
    let text = response.text().await.unwrap_or_default();
    // Relaxed: the upstreams counted before they answered.
    let sent = a_count.load(Ordering::Relaxed) + b_count.load(Ordering::Relaxed);
    assert_eq!(sent, 1, "sent to {sent} workers; the client got {status}: {text}");
    assert_eq!(status, 529, "the client got {status} for a refusal: {text}");
    assert!(reason.as_deref().is_some_and(|r| r.contains("worker_capacity")), "reason {reason:?}: {text}");
    assert!(text.contains("Overloaded"), "{text}");
    drop((conn_a, conn_b));
}
