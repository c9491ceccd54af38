//! Guard (issue 23): with none of the waiting line's flags set, a request
//! for a model whose workers are all busy is refused at once, with the
//! overload status and exactly the body main sent on df655a4.
//!
//! This guard test never changes: every later issue keeps it passing.
//!
//! A real `loadgate frontend` (`--active-decode-blocks-threshold 0`: a worker
//! is busy while it holds any decode block) and two real simulated
//! `loadgate worker`s over sockets. Each worker runs one long stream sent to
//! it directly, so both report decode blocks and the frontend counts both
//! busy. Then every completion and chat completion through the frontend is
//! answered 529 within [`INSTANT`], with `Retry-After` and `retry-after-ms`,
//! and a body whose JSON value is [`REFERENCE_BODY`] (copied literally from
//! df655a4: `server/src/frontend/reply.rs` `overloaded`,
//! `src/rejection.rs` `Rejection::Overloaded`, `server/src/openai.rs`
//! `error_body`).

mod common;

use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use serde_json::{json, Value};

const MODEL: &str = "guard-model";
/// How long a refusal may take, on a busy 2-core machine.
const INSTANT: Duration = Duration::from_millis(200);
/// How long the frontend may take to see its workers, and them busy.
const SETTLE: Duration = Duration::from_secs(15);
/// The 529 body on df655a4, byte for byte.
const REFERENCE_BODY: &str =
    r#"{"error":{"message":"All workers are busy, please retry later","type":"Overloaded","param":null,"code":529}}"#;
/// Refused requests timed, per endpoint.
const TRIES: usize = 5;

/// Holds one long stream on `worker` (sent to it directly) until aborted.
fn hold(worker: &common::Worker) -> tokio::task::JoinHandle<()> {
    let client = common::long_client();
    let url = format!("{}/v1/completions", worker.http);
    tokio::spawn(async move {
        let body = json!({"model": MODEL, "prompt": "hold this worker busy", "max_tokens": 4000, "stream": true});
        let response = client.post(url).json(&body).send().await.expect("the held stream");
        assert_eq!(response.status().as_u16(), 200, "the held stream");
        let mut chunks = response.bytes_stream();
        while let Some(Ok(_)) = chunks.next().await {}
    })
}

/// Waits until the frontend's `/metrics` counts `n` busy workers.
async fn wait_busy(frontend: &common::Frontend, n: f64) {
    let deadline = Instant::now() + SETTLE;
    loop {
        let text = common::metrics_text(&frontend.client, &frontend.http).await;
        let busy = common::metric(&text, "loadgate_frontend_worker_busy").unwrap_or(0.0);
        if busy == n {
            return;
        }
        assert!(Instant::now() < deadline, "{n} busy workers never seen (last {busy}):\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_model_is_refused_at_once_with_the_reference_body() {
    let frontend = common::Frontend::start(None, &["--active-decode-blocks-threshold", "0"]);
    let workers: Vec<common::Worker> =
        (0..2).map(|_| common::worker(Some(frontend.events), MODEL, None, &["--decode-step-ms", "10"])).collect();
    frontend.wait_workers(2, SETTLE).await;
    let held: Vec<_> = workers.iter().map(hold).collect();
    wait_busy(&frontend, 2.0).await;

    let reference: Value = serde_json::from_str(REFERENCE_BODY).expect("the reference body");
    let client = common::client();
    // A connection already open: the time measured is the frontend's.
    let health = client.get(format!("{}/health", frontend.http)).send().await.expect("GET /health");
    assert_eq!(health.status().as_u16(), 200);
    let requests = [
        ("/v1/completions", json!({"model": MODEL, "prompt": "hello world", "max_tokens": 2})),
        (
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
        ),
    ];
    for (path, body) in &requests {
        for attempt in 0..TRIES {
            let url = format!("{}{path}", frontend.http);
            let start = Instant::now();
            let response = client.post(url).json(body).send().await.expect("the refused request");
            let status = response.status().as_u16();
            let headers = response.headers().clone();
            let text = response.text().await.expect("the refusal's body");
            let took = start.elapsed();
            let what = format!("{path} #{attempt}");
            assert_eq!(status, 529, "{what}: {text}");
            assert!(took < INSTANT, "{what}: the refusal took {took:?}");
            let answer: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{what}: {e}: {text}"));
            assert_eq!(answer, reference, "{what}: the body is the reference body");
            let content_type = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default();
            assert!(content_type.starts_with("application/json"), "{what}: content type {content_type:?}");
            for hint in ["retry-after", "retry-after-ms"] {
                let value = headers.get(hint).and_then(|v| v.to_str().ok()).unwrap_or_default();
                assert!(value.parse::<u64>().is_ok_and(|v| v > 0), "{what}: {hint}: {value:?}");
            }
        }
    }
    for task in held {
        task.abort();
    }
}
