//! The frontend end to end: real `loadgate frontend` and `loadgate worker`
//! processes on free 127.0.0.1 ports, driven over HTTP and the event port.
//! Every child process is killed when its handle drops.
//!
//! Starting the processes and reading their metrics is in `cluster.rs`; the
//! load the tests send and the tests are here.

mod cluster;
#[path = "../common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use cluster::{frontend, prompt, spawn, sum_metric, worker, worker_with_env, Frontend, MODEL, SETTLE};
use common::{expect_field, long_client, Worker};
use futures_util::StreamExt;
use serde_json::{json, Value};

fn request(words: usize, max_tokens: u32, stream: bool) -> Value {
    json!({"model": MODEL, "prompt": prompt(words), "max_tokens": max_tokens, "stream": stream})
}

/// `Retry-After` when it agrees with `retry-after-ms` (whole seconds,
/// rounded up) and both are within the documented bounds (1 s to 30 s).
fn retry_hint(headers: &reqwest::header::HeaderMap) -> Option<String> {
    let secs: u64 = headers.get("retry-after")?.to_str().ok()?.parse().ok()?;
    let ms: u64 = headers.get("retry-after-ms")?.to_str().ok()?.parse().ok()?;
    ((1_000..=30_000).contains(&ms) && secs == ms.div_ceil(1000)).then(|| secs.to_string())
}

/// Fires `count` non-streaming requests `spacing` apart (open loop) and
/// returns each one's status and body.
async fn burst(frontend: &Frontend, count: usize, spacing: Duration) -> Vec<(u16, Option<String>, Value)> {
    let mut tasks = Vec::new();
    for _ in 0..count {
        let client = frontend.client.clone();
        let url = format!("{}/v1/completions", frontend.http);
        tasks.push(tokio::spawn(async move {
            let response = client.post(url).json(&request(64, 32, false)).send().await.unwrap();
            let status = response.status().as_u16();
            let retry_after = retry_hint(response.headers());
            (status, retry_after, response.json::<Value>().await.unwrap_or(Value::Null))
        }));
        tokio::time::sleep(spacing).await;
    }
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap());
    }
    results
}

/// Two workers of 24 KV blocks; each request holds 4 blocks at first and 6
/// at the end, for 32 steps of 20 ms; 30 requests 15 ms apart.
async fn saturate(extra_frontend_flags: &[&str]) -> (Frontend, Vec<(u16, Option<String>, Value)>) {
    let fe = frontend(extra_frontend_flags);
    let _w1 = worker(&fe, 24, 20, &[]);
    let _w2 = worker(&fe, 24, 20, &[]);
    fe.wait_workers(2).await;
    let results = burst(&fe, 30, Duration::from_millis(15)).await;
    (fe, results)
}

/// (a) With a decode threshold and saturated workers, some requests succeed,
/// some get 529 with `Retry-After` and the Overloaded body, and the
/// rejection counter equals the 529s the client saw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_rejects_with_529_and_counts_each_rejection() {
    let (fe, results) = saturate(&["--active-decode-blocks-threshold", "0.5"]).await;
    let ok = results.iter().filter(|r| r.0 == 200).count();
    let rejected: Vec<_> = results.iter().filter(|r| r.0 == 529).collect();
    eprintln!("overload: {ok} served, {} rejected", rejected.len());
    assert_eq!(ok + rejected.len(), results.len(), "only 200 and 529 expected: {results:?}");
    assert!(ok > 0, "some requests must be served");
    assert!(!rejected.is_empty(), "saturated workers must shed load");
    for (_, retry_after, body) in &rejected {
        assert!(retry_after.is_some(), "a 529 carries a consistent retry hint");
        assert_eq!(
            *body,
            json!({"error": {"message": "All workers are busy, please retry later", "type": "Overloaded", "param": null, "code": 529}})
        );
    }
    for (status, _, body) in results.iter().filter(|r| r.0 == 200) {
        assert_eq!(*status, 200);
        assert_eq!(body["usage"]["prompt_tokens"], 64, "{body}");
    }
    let counted = fe.metric("dynamo_frontend_model_rejection_total", &format!("model=\"{MODEL}\"")).await;
    assert_eq!(counted, rejected.len() as f64);
    let by_decode = fe.metric("loadgate_frontend_rejection_reason_total", "reason=\"decode_blocks\"").await;
    assert_eq!(by_decode, rejected.len() as f64, "every rejection was for the decode signal");
    fe.wait_metrics("in-flight back to zero", |m| sum_metric(m, "loadgate_frontend_inflight_requests", "") == 0.0)
        .await;
}

/// (b) The same load without any threshold: nothing is rejected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_threshold_nothing_is_rejected() {
    let (fe, results) = saturate(&[]).await;
    assert!(results.iter().all(|r| r.0 == 200), "{results:?}");
    assert_eq!(fe.metric("dynamo_frontend_model_rejection_total", "").await, 0.0);
}

/// Starts a streaming request and returns its byte stream after the first
/// chunk arrived (the request is running on the worker).
async fn start_stream(
    fe: &Frontend,
    words: usize,
    max_tokens: u32,
) -> impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> {
    let response = fe.complete(request(words, max_tokens, true)).await;
    assert_eq!(response.status().as_u16(), 200);
    let mut stream = Box::pin(response.bytes_stream());
    let first = stream.next().await.expect("a first chunk").expect("a first chunk");
    assert!(first.starts_with(b"data: "), "{first:?}");
    stream
}

/// (d) `/busy_threshold`: read, set, clear with null, absent = unchanged,
/// the 400 / 415 / 413 / 404 cases, and a change decides the very next
/// request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_threshold_reads_sets_clears_and_takes_effect_at_once() {
    let fe = frontend(&[]);
    let _w = worker(&fe, 20, 50, &[]);
    fe.wait_workers(1).await;
    let unset = json!({"model": MODEL, "active_decode_blocks_threshold": null,
        "active_prefill_tokens_threshold": null, "active_prefill_tokens_threshold_frac": null,
        "active_waiting_requests_threshold": null, "router_queue_timeout_ms": 0});

    // Read: GET lists every model; a POST with only the model reads it.
    let all: Value = fe.client.get(format!("{}/busy_threshold", fe.admin)).send().await.unwrap().json().await.unwrap();
    assert_eq!(all, json!({"thresholds": [unset.clone()]}));
    let body = json!({"model": MODEL}).to_string();
    assert_eq!(fe.post_threshold(&body, "application/json").await, (200, unset.clone()));

    // A long request holds 7 of the worker's 20 blocks (100 prompt tokens), more as it decodes.
    let _running = start_stream(&fe, 100, 100).await;
    fe.wait_metrics("7 active blocks", |m| sum_metric(m, "dynamo_frontend_worker_active_decode_blocks", "") >= 7.0)
        .await;
    assert_eq!(fe.complete(request(1, 1, false)).await.status().as_u16(), 200);

    // Set: the very next request is rejected.
    let set = json!({"model": MODEL, "active_decode_blocks_threshold": 0.3}).to_string();
    let (status, reply) = fe.post_threshold(&set, "application/json; charset=utf-8").await;
    assert_eq!(status, 200);
    assert_eq!(reply["active_decode_blocks_threshold"], 0.3);
    assert_eq!(fe.complete(request(1, 1, false)).await.status().as_u16(), 529);

    // Absent fields stay; another field is set alongside.
    let more = json!({"model": MODEL, "active_prefill_tokens_threshold": 4096}).to_string();
    let (status, reply) = fe.post_threshold(&more, "application/json").await;
    assert_eq!(status, 200);
    assert_eq!(reply["active_decode_blocks_threshold"], 0.3);
    assert_eq!(reply["active_prefill_tokens_threshold"], 4096);

    // The fourth signal: set and cleared like the others.
    let waiting = json!({"model": MODEL, "active_waiting_requests_threshold": 2}).to_string();
    let (status, reply) = fe.post_threshold(&waiting, "application/json").await;
    assert_eq!((status, &reply["active_waiting_requests_threshold"]), (200, &json!(2)));
    let waiting = json!({"model": MODEL, "active_waiting_requests_threshold": null}).to_string();
    let (status, reply) = fe.post_threshold(&waiting, "application/json").await;
    assert_eq!((status, &reply["active_waiting_requests_threshold"]), (200, &Value::Null));

    // Clear with null: the very next request is served.
    let clear =
        json!({"model": MODEL, "active_decode_blocks_threshold": null, "active_prefill_tokens_threshold": null})
            .to_string();
    assert_eq!(fe.post_threshold(&clear, "application/json").await, (200, unset.clone()));
    assert_eq!(fe.complete(request(1, 1, false)).await.status().as_u16(), 200);

    // Errors, each with {"error": "..."} and nothing changed.
    for (body, content_type, status) in [
        (json!({"model": MODEL, "active_decode_blocks_threshold": 1.5}).to_string(), "application/json", 400),
        (json!({"model": MODEL, "active_decode_blocks_threshold": "0.5"}).to_string(), "application/json", 400),
        (json!({"model": MODEL, "active_prefill_tokens_threshold": -3}).to_string(), "application/json", 400),
        (json!({"model": MODEL, "active_waiting_requests_threshold": -1}).to_string(), "application/json", 400),
        (json!({"model": MODEL, "active_waiting_requests_threshold": 1.5}).to_string(), "application/json", 400),
        (json!({"model": MODEL, "active_decode_blocks": 0.5}).to_string(), "application/json", 400),
        ("{not json".to_owned(), "application/json", 400),
        (set.clone(), "text/plain", 415),
        (format!("{{\"model\":\"{MODEL}\",\"pad\":\"{}\"}}", "x".repeat(70 * 1024)), "application/json", 413),
        (json!({"model": "no-such-model", "active_decode_blocks_threshold": 0.5}).to_string(), "application/json", 404),
        (json!({"model": "no-such-model"}).to_string(), "application/json", 404),
    ] {
        let (got, reply) = fe.post_threshold(&body, content_type).await;
        assert_eq!(got, status, "{content_type} {}", &body[..body.len().min(80)]);
        assert!(reply["error"].is_string(), "error body for {status}: {reply}");
    }
    let all: Value = fe.client.get(format!("{}/busy_threshold", fe.admin)).send().await.unwrap().json().await.unwrap();
    assert_eq!(all, json!({"thresholds": [unset]}));
}

/// The fourth signal end to end: `--active-waiting-requests-threshold 0`
/// sheds as soon as a request waits in a worker's engine queue (the
/// simulated engine reports its waiting line), and serves again once it
/// drains.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_requests_threshold_sheds_while_the_engine_queue_is_not_empty() {
    let fe = frontend(&["--active-waiting-requests-threshold", "0"]);
    // 10 blocks of 16 tokens: a 100-word prompt takes 7, so a second one waits.
    let _w = worker(&fe, 10, 100, &[]);
    fe.wait_workers(1).await;
    let all: Value = fe.client.get(format!("{}/busy_threshold", fe.admin)).send().await.unwrap().json().await.unwrap();
    assert_eq!(all["thresholds"][0]["active_waiting_requests_threshold"], 0, "{all}");

    let running = start_stream(&fe, 100, 40).await; // 140 tokens at most: 9 blocks, 4 s
    let (client, url) = (fe.client.clone(), format!("{}/v1/completions", fe.http));
    let waiting = tokio::spawn(async move { client.post(url).json(&request(100, 2, false)).send().await });
    fe.wait_metrics("a request waiting in the engine", |m| {
        sum_metric(m, "loadgate_frontend_worker_waiting_requests", "") >= 1.0
    })
    .await;
    assert_eq!(fe.complete(request(1, 1, false)).await.status().as_u16(), 529);
    assert_eq!(fe.metric("loadgate_frontend_rejection_reason_total", "reason=\"waiting_requests\"").await, 1.0);

    drop(running); // the first request goes; the waiting one runs and the queue drains
    let served = waiting.await.unwrap().unwrap();
    assert_eq!(served.status().as_u16(), 200);
    fe.wait_metrics("the queue drained", |m| sum_metric(m, "loadgate_frontend_worker_waiting_requests", "") == 0.0)
        .await;
    assert_eq!(fe.complete(request(1, 1, false)).await.status().as_u16(), 200);
}

/// (e) No worker: 503 Unavailable, for any model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_worker_is_503_unavailable() {
    let fe = frontend(&["--active-decode-blocks-threshold", "0.85"]);
    let response = fe.complete(request(4, 4, false)).await;
    assert_eq!(response.status().as_u16(), 503);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["type"], "Unavailable");
    assert_eq!(body["error"]["code"], 503);
    assert_eq!(fe.metric("dynamo_frontend_model_rejection_total", "").await, 0.0);
    // Not ready without a worker; alive all the same.
    let health = fe.client.get(format!("{}/health", fe.http)).send().await.unwrap();
    assert_eq!(health.status().as_u16(), 503);
    let health: Value = health.json().await.unwrap();
    assert_eq!((health["status"].as_str(), health["workers"].as_u64()), (Some("unhealthy"), Some(0)));
    assert_eq!(fe.client.get(format!("{}/live", fe.http)).send().await.unwrap().status().as_u16(), 200);
}

/// (f) A worker killed mid-stream: the client's stream fails, the worker is
/// deregistered, and in-flight requests and router-tracked load return to
/// zero; its model then answers 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_killed_mid_stream_releases_everything() {
    let fe = frontend(&["--router-mode", "kv", "--router-track-output-blocks"]);
    let mut w = worker(&fe, 64, 50, &[]);
    fe.wait_workers(1).await;
    let mut stream = start_stream(&fe, 40, 400).await;
    let held = fe.metrics().await;
    assert_eq!(sum_metric(&held, "loadgate_frontend_inflight_requests", ""), 1.0);
    assert!(sum_metric(&held, "loadgate_frontend_tracked_blocks", "") >= 3.0, "{held}");

    w.proc.kill();
    let mut body = Vec::new();
    let failed = tokio::time::timeout(SETTLE, async {
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(bytes) => body.extend_from_slice(&bytes),
                Err(_) => return true,
            }
        }
        false
    })
    .await
    .expect("the stream ends once the worker is gone");
    assert!(failed, "the client must see an error, not a clean end");
    assert!(!String::from_utf8_lossy(&body).contains("[DONE]"));

    fe.wait_workers(0).await;
    fe.wait_metrics("nothing held", |m| {
        [
            "loadgate_frontend_inflight_requests",
            "loadgate_frontend_tracked_blocks",
            "loadgate_frontend_tracked_prefill_tokens",
        ]
        .iter()
        .all(|name| sum_metric(m, name, "") == 0.0)
    })
    .await;
    assert_eq!(fe.complete(request(4, 4, false)).await.status().as_u16(), 503);
    let _ = w.http;
}

/// (g) Garbage, oversized and truncated frames on the event port close only
/// their own connection; the registered worker stays and requests are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_the_event_port_leaves_the_frontend_serving() {
    let fe = frontend(&[]);
    let _w = worker(&fe, 64, 10, &[]);
    fe.wait_workers(1).await;

    let garbage: [&[u8]; 4] = [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        &[0xB1, 2, 0xFF, 0xFF],                    // oversized Load
        &[0xB1, 7, 0, 0],                          // unknown kind
        &[0xB1, 2, 0, 36, 0, 0, 0, 0, 0, 0, 0, 1], // Load for an unregistered worker, cut short
    ];
    for bytes in garbage {
        let mut conn = TcpStream::connect(&fe.events).unwrap();
        conn.write_all(bytes).unwrap();
        if bytes[0] == 0xB1 && bytes[1] == 2 && bytes.len() > 4 {
            conn.shutdown(std::net::Shutdown::Write).unwrap(); // truncated frame, then EOF
        }
        conn.set_read_timeout(Some(SETTLE)).unwrap();
        let mut buf = [0u8; 16];
        // The frontend closes the connection: EOF (or a reset), never a hang.
        let read = conn.read(&mut buf);
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
        if let Err(e) = &read {
            assert_ne!(e.kind(), std::io::ErrorKind::WouldBlock, "connection left open");
        }
    }
    // Past the deregistration grace period, the real worker is still there.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(fe.metric("loadgate_frontend_workers", "").await, 1.0);
    let response = fe.complete(request(8, 4, false)).await;
    assert_eq!(response.status().as_u16(), 200);
    let health = fe.client.get(format!("{}/health", fe.http)).send().await.unwrap();
    assert_eq!(health.status().as_u16(), 200);
}

/// The event plane alone: a fake worker registers and reports over a raw
/// socket, then disconnects; it is deregistered after the grace period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_event_frames_register_report_and_expire() {
    use loadgate::wire::{encode, Frame};
    use loadgate::RankLoad;
    let fe = frontend(&["--active-decode-blocks-threshold", "0.85"]);
    let mut buf = bytes::BytesMut::new();
    let register = Frame::Register {
        worker: 77,
        incarnation: 1,
        dp_size: 1,
        model: "raw".into(),
        http_addr: "127.0.0.1:9".into(),
    };
    encode(&register, &mut buf).unwrap();
    let full = RankLoad { active_decode_blocks: 90, kv_total_blocks: 100, ..Default::default() };
    encode(&Frame::Load { worker: 77, incarnation: 1, rank: 0, seq: 1, load: full }, &mut buf).unwrap();
    let mut conn = TcpStream::connect(&fe.events).unwrap();
    conn.write_all(&buf).unwrap();
    fe.wait_metrics("the raw worker busy", |m| {
        sum_metric(m, "loadgate_frontend_worker_busy", "worker_id=\"77\"") == 1.0
            && sum_metric(m, "dynamo_frontend_worker_active_decode_blocks", "worker_id=\"77\"") == 90.0
    })
    .await;
    let response = fe.client.post(format!("{}/v1/completions", fe.http)).json(&json!({"model": "raw", "prompt": "hi"}));
    assert_eq!(response.send().await.unwrap().status().as_u16(), 529);
    drop(conn);
    fe.wait_workers(0).await;
}

/// Fills `worker` (N = 1, Q = 2) with three long streaming requests sent
/// directly to it: one running, two queued. Returns the tasks holding them.
async fn fill(worker: &Worker) -> Vec<tokio::task::JoinHandle<()>> {
    let client = long_client();
    let mut held = Vec::new();
    for _ in 0..3 {
        let client = client.clone();
        let url = format!("{}/v1/completions", worker.http);
        held.push(tokio::spawn(async move {
            let response = client.post(url).json(&request(8, 400, true)).send().await.unwrap();
            assert_eq!(response.status().as_u16(), 200);
            let mut body = response.bytes_stream();
            while let Some(Ok(_)) = body.next().await {}
        }));
    }
    let deadline = Instant::now() + SETTLE;
    loop {
        let text = client.get(format!("{}/metrics", worker.http)).send().await.unwrap().text().await.unwrap();
        if sum_metric(&text, "dynamo_engine_request", "") == 1.0 && sum_metric(&text, "dynamo_request_queue", "") == 2.0
        {
            return held;
        }
        assert!(Instant::now() < deadline, "worker never filled:\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn worker_rejections(client: &reqwest::Client, worker: &Worker) -> f64 {
    let text = client.get(format!("{}/metrics", worker.http)).send().await.unwrap().text().await.unwrap();
    sum_metric(&text, "dynamo_rejection_request_total", "")
}

/// Migration: a worker at its hard cap (N = 1, Q = 2) refuses; the frontend
/// retries on the other worker and the client never sees the refusal. With
/// both at capacity, the client gets the overload status, counted as a
/// `worker_capacity` rejection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_request_migrates_then_overload_when_all_refuse() {
    let fe = frontend(&[]);
    let capped = [("DYN_DYNAMO_REQUEST_QUEUE_LIMIT", "2")];
    let a = worker_with_env(&fe, 1024, 20, &["--engine-request-limit", "1"], &capped);
    let b = worker_with_env(&fe, 1024, 20, &["--engine-request-limit", "1"], &capped);
    fe.wait_workers(2).await;
    let client = long_client();

    // Fill A: one running, two queued.
    let mut held = fill(&a).await;
    // Round-robin tries A within two requests; A refuses, B serves.
    for _ in 0..2 {
        let response = fe.complete(request(8, 2, false)).await;
        assert_eq!(response.status().as_u16(), 200);
    }
    assert!(worker_rejections(&client, &a).await >= 1.0, "A must have refused at least once");
    assert_eq!(fe.metric("dynamo_frontend_model_rejection_total", "").await, 0.0);

    // Fill B too: every worker refuses, the client gets 529.
    held.extend(fill(&b).await);
    let response = fe.complete(request(8, 2, false)).await;
    assert_eq!(response.status().as_u16(), 529);
    assert!(retry_hint(response.headers()).is_some(), "a 529 after refusals carries the retry hint");
    // It names the reasons it counted, each once.
    let reasons = response.headers().get("x-loadgate-rejected-reason").and_then(|v| v.to_str().ok()).unwrap_or("");
    let mut named: Vec<&str> = reasons.split(',').collect();
    named.sort_unstable();
    assert_eq!(named, ["excluded", "worker_capacity"], "x-loadgate-rejected-reason: {reasons:?}");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["type"], "Overloaded");
    assert_eq!(fe.metric("dynamo_frontend_model_rejection_total", "").await, 1.0);
    assert_eq!(fe.metric("loadgate_frontend_rejection_reason_total", "reason=\"worker_capacity\"").await, 1.0);
    // Both free workers had refused it: routing ended with every one
    // excluded (never recorded on b1708da).
    assert_eq!(fe.metric("loadgate_frontend_rejection_reason_total", "reason=\"excluded\"").await, 1.0);
    for task in held {
        task.abort();
    }
}

/// A client that goes away mid-stream: the frontend drops the worker stream
/// and releases the request's in-flight count and tracked load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_releases_everything() {
    let fe = frontend(&["--router-mode", "kv"]);
    let _w = worker(&fe, 64, 50, &[]);
    fe.wait_workers(1).await;
    let stream = start_stream(&fe, 40, 400).await;
    let held = fe.metrics().await;
    assert_eq!(sum_metric(&held, "loadgate_frontend_inflight_requests", ""), 1.0);
    assert_eq!(sum_metric(&held, "loadgate_frontend_tracked_blocks", ""), 3.0, "ceil(40 / 16) prompt blocks");
    // The first token arrived: the prompt's prefill tokens are released.
    assert_eq!(sum_metric(&held, "loadgate_frontend_tracked_prefill_tokens", ""), 0.0);
    drop(stream);
    fe.wait_metrics("nothing held", |m| {
        sum_metric(m, "loadgate_frontend_inflight_requests", "") == 0.0
            && sum_metric(m, "loadgate_frontend_tracked_blocks", "") == 0.0
    })
    .await;
    assert_eq!(fe.metric("loadgate_frontend_workers", "").await, 1.0, "the worker stays");
}

/// `--worker URL` registers a worker that is not on the event plane; bad
/// bodies are 400, unknown models 404, and `/v1/models` lists the model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_flag_registers_from_info_and_requests_are_validated() {
    let (standalone, line) =
        spawn("worker", &["worker", "--model", MODEL, "--http-host", "127.0.0.1", "--http-port", "0"], &[]);
    let url = format!("http://{}", expect_field(&line, "http"));
    let fe = frontend(&["--worker", &url]);
    fe.wait_workers(1).await;
    let response = fe.complete(request(8, 3, false)).await;
    assert_eq!(response.status().as_u16(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["usage"]["completion_tokens"], 3);

    let chat = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi there"}], "max_tokens": 2});
    let response = fe.client.post(format!("{}/v1/chat/completions", fe.http)).json(&chat).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 200);

    let unknown = fe.complete(json!({"model": "no-such-model", "prompt": "hi"})).await;
    assert_eq!(unknown.status().as_u16(), 404);
    for bad in ["not json", "[1, 2]", r#"{"prompt": "no model"}"#] {
        let response = fe.client.post(format!("{}/v1/completions", fe.http)).body(bad).send().await.unwrap().status();
        assert_eq!(response.as_u16(), 400, "{bad}");
    }
    let models: Value = fe.client.get(format!("{}/v1/models", fe.http)).send().await.unwrap().json().await.unwrap();
    assert_eq!(models["data"][0]["id"], MODEL);
    drop(standalone);
}

/// The service routes in OpenAI's and Prometheus' shapes: `/v1/models` lists
/// `created`; `GET /v1/models/{id}` answers one model (ids may hold slashes)
/// or a 404 error body; `/live` answers while the process runs; `/metrics`
/// (frontend and worker) is served as OpenMetrics, which its `# EOF` says it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_routes_speak_openai_and_both_metrics_formats() {
    let fe = frontend(&["--model", "org/a model.gguf"]);
    let w = worker(&fe, 64, 10, &[]);
    fe.wait_workers(1).await;
    let get = |path: String| {
        let client = fe.client.clone();
        async move { client.get(path).send().await.unwrap() }
    };
    let models: Value = get(format!("{}/v1/models", fe.http)).await.json().await.unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    for model in models["data"].as_array().unwrap() {
        let created = model["created"].as_u64().expect("created");
        assert!(now.abs_diff(created) < 120, "{model}");
        assert_eq!(model["object"], "model");
    }
    let one = get(format!("{}/v1/models/{MODEL}", fe.http)).await;
    assert_eq!(one.status().as_u16(), 200);
    let one: Value = one.json().await.unwrap();
    assert_eq!((one["id"].as_str(), one["object"].as_str()), (Some(MODEL), Some("model")));
    let kept = get(format!("{}/v1/models/org/a%20model.gguf", fe.http)).await;
    assert_eq!(kept.status().as_u16(), 200, "a model id with a slash");
    assert_eq!(kept.json::<Value>().await.unwrap()["id"], "org/a model.gguf");
    let missing = get(format!("{}/v1/models/no-such-model", fe.http)).await;
    assert_eq!(missing.status().as_u16(), 404);
    let error: Value = missing.json().await.unwrap();
    assert!(error["error"]["message"].as_str().unwrap().contains("no-such-model"), "{error}");
    let live = get(format!("{}/live", fe.http)).await;
    assert_eq!(live.status().as_u16(), 200);
    // `/metrics` speaks OpenMetrics to a scraper that asks for it, the
    // Prometheus text format 0.0.4 to anyone else.
    let client = reqwest::Client::new();
    for base in [&fe.http, &w.http] {
        let asked = client
            .get(format!("{base}/metrics"))
            .header(reqwest::header::ACCEPT, "application/openmetrics-text; version=1.0.0")
            .send()
            .await
            .unwrap();
        let content_type = asked.headers()[reqwest::header::CONTENT_TYPE].to_str().unwrap().to_owned();
        assert_eq!(content_type, "application/openmetrics-text; version=1.0.0; charset=utf-8", "{base}");
        assert!(asked.text().await.unwrap().trim_end().ends_with("# EOF"), "{base}");
        let plain = get(format!("{base}/metrics")).await;
        let content_type = plain.headers()[reqwest::header::CONTENT_TYPE].to_str().unwrap().to_owned();
        assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8", "{base}");
        assert!(!plain.text().await.unwrap().contains("# EOF"), "{base}");
    }
}

/// A worker whose operator set its overload status to 200: its hard-cap
/// refusals still carry `x-loadgate-refusal: worker-at-capacity`, so the
/// frontend takes them for refusals (not completions), and the client gets
/// the frontend's own overload answer without the signal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_with_status_200_is_still_a_refusal() {
    let fe = frontend(&[]);
    let env = [("DYN_DYNAMO_REQUEST_QUEUE_LIMIT", "2"), ("DYN_HTTP_OVERLOAD_STATUS_CODE", "200")];
    let w = worker_with_env(&fe, 1024, 20, &["--engine-request-limit", "1"], &env);
    fe.wait_workers(1).await;
    let held = fill(&w).await;
    let direct = fe.client.post(format!("{}/v1/completions", w.http)).json(&request(8, 2, false)).send().await.unwrap();
    assert_eq!(direct.status().as_u16(), 200, "the worker's own refusal status");
    assert_eq!(direct.headers().get("x-loadgate-refusal").unwrap(), "worker-at-capacity");
    let response = fe.complete(request(8, 2, false)).await;
    assert_eq!(response.status().as_u16(), 529, "a refusal, not a completion");
    assert!(response.headers().get("x-loadgate-refusal").is_none(), "the signal is stripped");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["type"], "Overloaded");
    assert_eq!(fe.metric("loadgate_frontend_rejection_reason_total", "reason=\"worker_capacity\"").await, 1.0);
    for task in held {
        task.abort();
    }
}
