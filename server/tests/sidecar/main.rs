//! Integration tests of `loadgate worker --engine KIND=URL` (the sidecar) on
//! 127.0.0.1, in front of a fake engine: a small axum server in this test
//! process on a real socket, speaking vLLM's `/metrics` and `/v1/models`,
//! whose completions answer after a delay or stream slowly, and which counts
//! its concurrent requests and records when each connection closed.
//!
//! What they show: the exact `N + Q` cap in front of the engine, the relay
//! of streamed and whole responses, a client that leaves (streamed or not)
//! closing the engine connection within a second, the engine's load plus
//! the sidecar's queue reaching a frontend, failed scrapes taking the
//! worker out of routing and back, and the timeouts on engine calls.
//!
//! The fake engine is in `fake_engine.rs`; the sidecar's helpers and the
//! tests are here.

#[path = "../common/mod.rs"]
mod common;
mod fake_engine;
mod flap;

use std::time::{Duration, Instant};

use axum::http::header;
use common::{
    expect_field, long_client, metric, metrics_text, request_proof, target_of, unix_ms, Frontend, Proc, SECRET,
};
use fake_engine::{sse_chunk, whole_answer, whole_stream, FakeEngine, MODEL};
use futures_util::StreamExt as _;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// How soon the engine connection must close after its client left.
const CLOSE_WITHIN: Duration = Duration::from_secs(1);

// ---------------------------------------------------------------------------
// The sidecar.

/// A `loadgate worker --engine` process.
struct Sidecar {
    proc: Proc,
    /// `http://HOST:PORT`.
    base: String,
}

/// A sidecar in front of `engine` with `extra` flags and `env`.
fn sidecar(engine: &FakeEngine, extra: &[&str], env: &[(&str, &str)]) -> Sidecar {
    let spec = engine.spec();
    let mut args = vec!["worker", "--engine", spec.as_str(), "--http-host", "127.0.0.1", "--http-port", "0"];
    args.extend_from_slice(extra);
    let (proc, line) = common::spawn("sidecar", &args, env);
    assert!(line.starts_with("listening http="), "unexpected first line {line:?}");
    Sidecar { proc, base: format!("http://{}", expect_field(&line, "http")) }
}

/// A frontend, a fake engine and a sidecar in front of it that reports to
/// the frontend (scrapes 50 ms apart, out after 3 failures), once the
/// frontend has it.
async fn routed_sidecar() -> (Frontend, FakeEngine, Sidecar) {
    routed_sidecar_scraping("50", "3", &[]).await
}

/// As [`routed_sidecar`], scrapes `interval_ms` apart, out after `failures`,
/// with `env`.
async fn routed_sidecar_scraping(
    interval_ms: &str,
    failures: &str,
    env: &[(&str, &str)],
) -> (Frontend, FakeEngine, Sidecar) {
    let frontend = Frontend::start(None, &[]);
    let engine = FakeEngine::start(1).await;
    let events = frontend.events.to_string();
    let worker = sidecar(
        &engine,
        &["--frontend", &events, "--engine-scrape-interval-ms", interval_ms, "--engine-scrape-failures", failures],
        env,
    );
    frontend.wait_workers(1, Duration::from_secs(10)).await;
    (frontend, engine, worker)
}

/// The request body of a fake completion.
fn request(tokens: u64, token_ms: u64, stream: bool) -> Value {
    json!({"model": MODEL, "prompt": "hello", "max_tokens": tokens, "token_ms": token_ms, "stream": stream})
}

/// POSTs `body` to `base`'s completions, with a proof when `secret` is given.
async fn send(client: &reqwest::Client, base: &str, body: &Value, secret: Option<&str>) -> reqwest::Response {
    let bytes = serde_json::to_vec(body).unwrap();
    let mut request = client.post(format!("{base}/v1/completions")).header(header::CONTENT_TYPE, "application/json");
    if let Some(secret) = secret {
        let target = target_of(client, base).await;
        let proof = request_proof(secret.as_bytes(), "POST", "/v1/completions", &bytes, target, unix_ms());
        request = request.header("x-loadgate-proof", proof);
    }
    request.body(bytes).send().await.expect("the request is answered")
}

/// The status and body of a completion.
async fn complete(client: reqwest::Client, base: String, body: Value, secret: Option<&'static str>) -> (u16, String) {
    let response = send(&client, &base, &body, secret).await;
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

/// Waits (bounded) until the sidecar's `/metrics` shows `running` engine
/// requests and `queued` queued ones.
async fn wait_admission(client: &reqwest::Client, base: &str, running: f64, queued: f64) {
    let what = format!("admission never reached {running} + {queued}");
    common::wait_for_metrics(client, base, Duration::from_secs(10), &what, |text| {
        (metric(text, "dynamo_engine_request"), metric(text, "dynamo_request_queue")) == (Some(running), Some(queued))
    })
    .await;
}

/// Opens a raw client connection to `base` and sends `body` as a completion.
async fn raw_request(base: &str, body: &Value) -> tokio::net::TcpStream {
    let addr = base.strip_prefix("http://").unwrap();
    let mut tcp = tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr))
        .await
        .expect("connect in time")
        .expect("connect");
    let body = body.to_string();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(body.as_bytes()).await.unwrap();
    tcp
}

// ---------------------------------------------------------------------------
// The tests.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caps_the_engine_at_exactly_n_plus_q_and_refuses_the_rest() {
    let engine = FakeEngine::start(1).await;
    let worker = sidecar(&engine, &["--engine-request-limit", "2"], &[("DYN_DYNAMO_REQUEST_QUEUE_LIMIT", "2")]);
    let client = long_client();
    // N + Q = 4 long requests: two on the engine, two queued in the sidecar.
    let long: Vec<_> = (0..4)
        .map(|_| tokio::spawn(complete(client.clone(), worker.base.clone(), request(20, 100, false), None)))
        .collect();
    wait_admission(&client, &worker.base, 2.0, 2.0).await;
    engine.wait_running(2).await;
    // Given time, no third one reaches it.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(engine.running(), 2, "the engine runs exactly N");
    // Every further request is refused with the refusal signal.
    for _ in 0..3 {
        let response = send(&client, &worker.base, &request(1, 0, false), None).await;
        assert_eq!(response.status().as_u16(), 529);
        assert_eq!(response.headers()["x-loadgate-refusal"], "worker-at-capacity");
        assert_eq!(response.headers()["retry-after"], "1");
        assert_eq!(
            response.text().await.unwrap(),
            r#"{"error":{"message":"Server overloaded: worker at capacity","type":"Overloaded","param":null,"code":529}}"#
        );
    }
    for handle in long {
        let (status, body) = handle.await.unwrap();
        assert_eq!((status, body.as_str()), (200, whole_answer(20).as_str()));
    }
    assert_eq!(engine.max_running(), 2, "never more than N on the engine");
    assert_eq!(engine.seen().len(), 4, "exactly N + Q reached the engine");
    let text = metrics_text(&client, &worker.base).await;
    assert_eq!(metric(&text, "dynamo_rejection_request_total"), Some(3.0), "{text}");
    assert_eq!(metric(&text, "dynamo_engine_request"), Some(0.0), "{text}");
    assert_eq!(metric(&text, "dynamo_request_queue"), Some(0.0), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_streams_chunk_by_chunk_and_whole_answers_as_they_are() {
    let engine = FakeEngine::start(2).await;
    let worker = sidecar(&engine, &["--engine-request-limit", "4"], &[]);
    let client = long_client();
    // Without --model: the engine's first id, and its two ranks.
    let models: Value = client.get(format!("{}/v1/models", worker.base)).send().await.unwrap().json().await.unwrap();
    assert_eq!(models["data"][0]["id"], MODEL);
    let info: Value = client.get(format!("{}/info", worker.base)).send().await.unwrap().json().await.unwrap();
    assert_eq!((info["model"].as_str(), info["dp_size"].as_u64()), (Some(MODEL), Some(2)), "{info}");

    // The body reaches the engine byte for byte, on the same path.
    let odd = br#"{ "model" : "fake/model-7b", "prompt":"hi",  "max_tokens": 2, "unknown_field": [1, {"x": null}] }"#;
    let response = client
        .post(format!("{}/v1/completions", worker.base))
        .header(header::CONTENT_TYPE, "application/json")
        .header("x-request-id", "req-42")
        .body(&odd[..])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
    assert_eq!(response.text().await.unwrap(), whole_answer(2), "a whole answer is relayed as it is");
    let seen = engine.seen().pop().unwrap();
    assert_eq!((seen.path.as_str(), &seen.body[..]), ("/v1/completions", &odd[..]));
    assert_eq!(seen.headers["x-request-id"], "req-42");

    // A stream arrives chunk by chunk, as the engine sends it.
    let started = Instant::now();
    let response = send(&client, &worker.base, &request(5, 200, true), None).await;
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(response.headers()[header::CONTENT_TYPE], "text/event-stream");
    let mut arrivals = Vec::new();
    let mut text = Vec::new();
    let mut body = response.bytes_stream();
    while let Some(chunk) = body.next().await {
        arrivals.push(started.elapsed());
        text.extend_from_slice(&chunk.unwrap());
    }
    assert_eq!(String::from_utf8(text).unwrap(), whole_stream(5));
    assert!(arrivals[0] < Duration::from_millis(600), "the first chunk is relayed at once: {arrivals:?}");
    assert!(*arrivals.last().unwrap() >= Duration::from_millis(1000), "five pauses of 200 ms: {arrivals:?}");
    assert!(arrivals.len() >= 4, "relayed in pieces, not gathered: {arrivals:?}");

    // Chat goes to the engine's chat path; an engine's error is relayed with its status.
    let chat = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "status": 400});
    let response = client.post(format!("{}/v1/chat/completions", worker.base)).json(&chat).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 400);
    assert_eq!(response.text().await.unwrap(), r#"{"error":"fake engine error"}"#);
    assert_eq!(engine.seen().pop().unwrap().path, "/v1/chat/completions");
    let text = metrics_text(&client, &worker.base).await;
    assert_eq!(metric(&text, "dynamo_engine_request"), Some(0.0), "every permit came back: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_a_stream_closes_the_engine_connection() {
    let engine = FakeEngine::start(1).await;
    let worker = sidecar(&engine, &["--engine-request-limit", "1"], &[]);
    let client = long_client();
    let mut tcp = raw_request(&worker.base, &request(10_000, 50, true)).await;
    let mut buf = vec![0u8; 4096];
    let read = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut buf)).await.expect("a first chunk in time");
    assert!(read.unwrap() > 0);
    let seen = engine.wait_seen(1).await;
    assert_eq!(engine.running(), 1);
    drop(tcp);
    let left = Instant::now();
    let closed = engine.closed_at(seen[0].conn, Duration::from_secs(5)).await.expect("the engine connection closes");
    let after = closed.saturating_duration_since(left);
    eprintln!("stream: engine connection closed {after:?} after the client left");
    assert!(after < CLOSE_WITHIN, "closed {after:?} after the client left");
    assert_eq!(engine.running(), 0);
    wait_admission(&client, &worker.base, 0.0, 0.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_a_whole_answer_closes_the_engine_connection() {
    let engine = FakeEngine::start(1).await;
    let worker = sidecar(&engine, &["--engine-request-limit", "1"], &[]);
    let client = long_client();
    // 60 s before the engine would answer: only the client leaving ends it.
    let tcp = raw_request(&worker.base, &request(600, 100, false)).await;
    let seen = engine.wait_seen(1).await;
    wait_admission(&client, &worker.base, 1.0, 0.0).await;
    drop(tcp);
    let left = Instant::now();
    let closed = engine.closed_at(seen[0].conn, Duration::from_secs(5)).await.expect("the engine connection closes");
    let after = closed.saturating_duration_since(left);
    eprintln!("whole answer: engine connection closed {after:?} after the client left");
    assert!(after < CLOSE_WITHIN, "closed {after:?} after the client left");
    assert_eq!(engine.running(), 0);
    wait_admission(&client, &worker.base, 0.0, 0.0).await;
    // The slot is free again.
    let (status, body) = complete(client.clone(), worker.base.clone(), request(1, 0, false), None).await;
    assert_eq!((status, body.as_str()), (200, whole_answer(1).as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_load_plus_the_queue_reaches_the_frontend_which_sheds_on_it() {
    let frontend = Frontend::secured(&["--active-waiting-requests-threshold", "4"]);
    let engine = FakeEngine::start(2).await;
    engine.set_waiting(&[3, 5]);
    let events = frontend.events.to_string();
    let worker = sidecar(
        &engine,
        &["--engine-request-limit", "1", "--worker-id", "77", "--frontend", &events],
        &[("DYN_DYNAMO_REQUEST_QUEUE_LIMIT", "4"), ("LOADGATE_EVENT_SECRET", SECRET)],
    );
    frontend.wait_workers(1, Duration::from_secs(10)).await;
    let client = long_client();
    let waiting = |text: &str, rank: u32| {
        let series = format!("loadgate_frontend_worker_waiting_requests{{worker_id=\"77\",dp_rank=\"{rank}\"}} ");
        text.lines().find_map(|l| l.strip_prefix(&series)).and_then(|v| v.parse::<f64>().ok())
    };
    let wait_waiting = |expected: [f64; 2]| {
        let frontend = &frontend;
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let text = metrics_text(&frontend.client, &frontend.http).await;
                let seen = [waiting(&text, 0), waiting(&text, 1)];
                if seen == expected.map(Some) {
                    return;
                }
                assert!(Instant::now() < deadline, "the frontend never saw waiting {expected:?}: {seen:?}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    // Through the frontend (signed), proxied to the engine.
    let (status, body) = complete(client.clone(), frontend.http.clone(), request(1, 0, false), None).await;
    assert_eq!((status, body.as_str()), (200, whole_answer(1).as_str()));
    assert!(engine.seen()[0].headers.get("x-loadgate-proof").is_none(), "the proof stays with the sidecar");
    wait_waiting([3.0, 5.0]).await;
    // One running, two queued in the sidecar: every rank carries the queue.
    let long: Vec<_> = (0..3)
        .map(|_| tokio::spawn(complete(client.clone(), worker.base.clone(), request(15, 100, false), Some(SECRET))))
        .collect();
    wait_admission(&client, &worker.base, 1.0, 2.0).await;
    wait_waiting([5.0, 7.0]).await;
    // Both ranks over the threshold: the frontend sheds by itself (the sidecar still has room).
    let (status, body) = complete(client.clone(), frontend.http.clone(), request(1, 0, false), None).await;
    assert_eq!(status, 529, "{body}");
    let text = metrics_text(&client, &worker.base).await;
    assert_eq!(metric(&text, "dynamo_rejection_request_total"), Some(0.0), "not the sidecar's refusal: {text}");
    for handle in long {
        assert_eq!(handle.await.unwrap().0, 200);
    }
    wait_waiting([3.0, 5.0]).await;
    let (status, body) = complete(client.clone(), frontend.http.clone(), request(1, 0, false), None).await;
    assert_eq!((status, body.as_str()), (200, whole_answer(1).as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_scrapes_take_the_sidecar_out_of_routing_and_a_success_brings_it_back_and_sigterm_deregisters() {
    let (frontend, engine, worker) = routed_sidecar().await;
    let client = long_client();
    let health = |base: String| {
        let client = client.clone();
        async move { client.get(format!("{base}/health")).send().await.unwrap().status().as_u16() }
    };
    assert_eq!(health(worker.base.clone()).await, 200);
    engine.set_metrics_up(false);
    let down = Instant::now();
    // Three failures 50 ms apart, then a Deregister: out of the frontend at once.
    frontend.wait_workers(0, Duration::from_secs(5)).await;
    eprintln!("out of routing {:?} after the engine's metrics failed", down.elapsed());
    assert_eq!(health(worker.base.clone()).await, 503);
    let (status, _) = complete(client.clone(), frontend.http.clone(), request(1, 0, false), None).await;
    assert!(matches!(status, 404 | 503), "no worker left: {status}");
    engine.set_metrics_up(true);
    frontend.wait_workers(1, Duration::from_secs(5)).await;
    assert_eq!(health(worker.base.clone()).await, 200);
    let (status, body) = complete(client.clone(), frontend.http.clone(), request(1, 0, false), None).await;
    assert_eq!((status, body.as_str()), (200, whole_answer(1).as_str()));
    // SIGTERM: a Deregister, then a clean exit.
    let mut worker = worker;
    worker.proc.terminate();
    frontend.wait_workers(0, Duration::from_secs(3)).await;
    let status = worker.proc.wait_exit(Duration::from_secs(10)).expect("the sidecar exits");
    assert!(status.success(), "{status:?}");
}

/// The engine goes away and comes back serving another model on the same
/// address: the sidecar stays unhealthy and out of routing, saying why (its
/// requests would be answered by the new model), until the engine lists
/// its model again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_back_with_another_model_keeps_the_sidecar_out_until_it_lists_its_model() {
    let (frontend, engine, worker) = routed_sidecar().await;
    let client = long_client();
    let health = || async {
        let response = client.get(format!("{}/health", worker.base)).send().await.unwrap();
        (response.status().as_u16(), response.text().await.unwrap())
    };
    engine.set_model("another/model");
    engine.set_metrics_up(false);
    frontend.wait_workers(0, Duration::from_secs(5)).await;
    engine.set_metrics_up(true);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = health().await;
        if body.contains("restart the worker") {
            assert_eq!(status, 503, "{body}");
            assert!(body.contains("another/model"), "{body}");
            break;
        }
        assert!(Instant::now() < deadline, "the sidecar never told the model was gone: {status} {body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Found by a review: a request that still reached the sidecar (a frontend
    // yet to apply its Deregister, a direct client) went to the engine and was
    // answered 200 by the other model. Now: not sent, a 502 a frontend moves.
    let sent = engine.seen().len();
    let response = send(&client, &worker.base, &request(1, 0, false), None).await;
    assert_eq!(response.status().as_u16(), 502);
    assert_eq!(response.headers()["x-loadgate-refusal"], "engine-not-reached");
    assert_eq!(engine.seen().len(), sent, "the engine serving another model got the request");
    // A second of good scrapes (50 ms apart): still out.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(health().await.0, 503);
    let (status, _) = complete(client.clone(), frontend.http.clone(), request(1, 0, false), None).await;
    assert!(matches!(status, 404 | 503), "no worker in routing: {status}");
    engine.set_model(MODEL);
    frontend.wait_workers(1, Duration::from_secs(10)).await;
    assert_eq!(health().await.0, 200);
    let (status, body) = complete(client.clone(), frontend.http.clone(), request(1, 0, false), None).await;
    assert_eq!((status, body.as_str()), (200, whole_answer(1).as_str()));
}

/// The engine comes back serving another model, and its `/v1/models` does
/// not answer yet (an engine still loading answers 503): the sidecar cannot
/// tell which model it serves, so it stays out of routing until the list
/// answers (and names its model).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_back_whose_models_cannot_be_read_keeps_the_sidecar_out() {
    let (frontend, engine, worker) = routed_sidecar().await;
    let client = long_client();
    engine.set_model("another/model");
    engine.set_models_up(false);
    engine.set_metrics_up(false);
    frontend.wait_workers(0, Duration::from_secs(5)).await;
    engine.set_metrics_up(true);
    // 1.5 s of good scrapes (50 ms apart) and failing lists: never back.
    let until = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < until {
        let health: Value = client.get(format!("{}/health", frontend.http)).send().await.unwrap().json().await.unwrap();
        assert_eq!(health["workers"], 0, "back in routing with a model nobody checked: {health}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(client.get(format!("{}/health", worker.base)).send().await.unwrap().status().as_u16(), 503);
    // The list answers, with the worker's model: back.
    engine.set_model(MODEL);
    engine.set_models_up(true);
    frontend.wait_workers(1, Duration::from_secs(10)).await;
    let (status, body) = complete(client.clone(), frontend.http.clone(), request(1, 0, false), None).await;
    assert_eq!((status, body.as_str()), (200, whole_answer(1).as_str()));
}

/// An engine that hangs up on every request (as one being killed does)
/// while its scrapes still answer: the sidecar tells its frontend the
/// request never ran (`x-loadgate-refusal: engine-not-reached`), and the
/// frontend sends it to another worker instead of relaying a 502.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_engine_never_took_goes_to_another_worker() {
    let (frontend, engine, _sidecar) = routed_sidecar().await;
    let _other = common::worker(Some(frontend.events), MODEL, None, &["--decode-step-ms", "1"]);
    frontend.wait_workers(2, Duration::from_secs(10)).await;
    engine.set_hang_up(true);
    let client = long_client();
    let body = json!({"model": MODEL, "prompt": "hello", "max_tokens": 2});
    for _ in 0..4 {
        let (status, text) = complete(client.clone(), frontend.http.clone(), body.clone(), None).await;
        assert_eq!(status, 200, "{text}");
    }
    assert!(!engine.seen().is_empty(), "the engine was tried");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_is_too_slow_gets_a_504_or_a_cut_and_its_connection_closed() {
    let engine = FakeEngine::start(1).await;
    let worker = sidecar(
        &engine,
        &["--engine-first-byte-timeout-secs", "1", "--engine-chunk-timeout-secs", "1", "--engine-request-limit", "2"],
        &[],
    );
    let client = long_client();
    // No first byte within 1 s (the answer would take 30 s).
    let started = Instant::now();
    let response = send(&client, &worker.base, &request(300, 100, false), None).await;
    let took = started.elapsed();
    assert_eq!(response.status().as_u16(), 504);
    let error: Value = response.json().await.unwrap();
    assert_eq!(error["error"]["type"], "server_error");
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(3), "{took:?}");
    let conn = engine.seen()[0].conn;
    assert!(engine.closed_at(conn, CLOSE_WITHIN).await.is_some(), "the engine connection is closed");
    // A stream that stalls for 5 s after its first chunk is cut after 1 s.
    let started = Instant::now();
    let response = send(&client, &worker.base, &request(3, 5000, true), None).await;
    assert_eq!(response.status().as_u16(), 200);
    let mut body = response.bytes_stream();
    let first = body.next().await.unwrap().unwrap();
    assert_eq!(String::from_utf8_lossy(&first), sse_chunk(0));
    let mut broke = false;
    while let Some(chunk) = body.next().await {
        if chunk.is_err() {
            broke = true;
            break;
        }
    }
    let took = started.elapsed();
    assert!(broke, "the client sees the response cut, not a clean end");
    assert!(took < Duration::from_secs(3), "cut after the 1 s between-chunks timeout: {took:?}");
    let conn = engine.seen()[1].conn;
    assert!(engine.closed_at(conn, CLOSE_WITHIN).await.is_some(), "the engine connection is closed");
    wait_admission(&client, &worker.base, 0.0, 0.0).await;
}

/// Found by a review: a sidecar gave its engine 60 s to answer at start,
/// fixed, then exited; a vLLM loading a large model takes minutes, so a
/// sidecar started beside it (a pod's containers) exited before it was up.
/// A frontend gave each `--engine` the same fixed 60 s. Now
/// `--engine-start-timeout-secs` sets the wait of both (default 60).
#[test]
fn the_wait_for_the_engine_at_start_is_a_flag() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let spec = format!("vllm={closed},model=m");
    for (command, says) in [("worker", "did not answer within 1s"), ("frontend", "not ready within 1s")] {
        let args = [command, "--engine", &spec, "--engine-start-timeout-secs", "1", "--http-host", "127.0.0.1"];
        // Bounded: one still waiting after 30 s (1 s asked) is killed.
        let args = [&args[..], &["--http-port", "0"]].concat();
        let (status, stderr) = common::exit_within(&args, Duration::from_secs(30));
        assert!(status.is_some_and(|s| !s.success()), "{command}: {stderr}");
        assert!(stderr.contains(&format!("{says} (--engine-start-timeout-secs)")), "{command}: {stderr}");
    }
}

#[test]
fn the_model_is_required_without_an_engine() {
    let out = std::process::Command::new(common::bin())
        .args(["worker", "--http-host", "127.0.0.1", "--http-port", "0"])
        .env_remove("LOADGATE_WORKER_MODEL")
        .env_remove("LOADGATE_WORKER_ENGINE")
        .output()
        .expect("run loadgate");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--model"), "{stderr}");
}
