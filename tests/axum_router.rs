//! Runs `examples/axum_router.rs` on a real socket: the statuses, hints and
//! bodies of shedding, its `/metrics`, and a permit that lasts exactly as
//! long as its SSE body.

#[allow(dead_code)] // its `main`
#[path = "../examples/axum_router.rs"]
mod example;

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::Value;

/// Serves the example's app on a free port; the server task ends with the
/// test's runtime.
async fn serve() -> (String, example::App) {
    let (http, app) = example::app();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, http).await.unwrap() });
    (base, app)
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap()
}

async fn chat(base: &str, model: &str) -> reqwest::Response {
    chat_tokens(base, model, 5).await
}

/// A chat request streaming `max_tokens` tokens, 100 ms apart.
async fn chat_tokens(base: &str, model: &str, max_tokens: u64) -> reqwest::Response {
    let body = serde_json::json!({ "model": model, "messages": [], "max_tokens": max_tokens }).to_string();
    client().post(format!("{base}/v1/chat/completions")).body(body).send().await.unwrap()
}

/// The default hint ([`loadgate::retry_hint::default_retry_after`]): 1 s
/// to 2 s, rounded up to whole seconds in `retry-after`.
fn assert_default_hint(response: &reqwest::Response) {
    let header = |name| response.headers()[name].to_str().unwrap().parse::<u64>().unwrap();
    let (secs, ms) = (header("retry-after"), header("retry-after-ms"));
    assert!((1000..=2000).contains(&ms) && secs == ms.div_ceil(1000), "{secs} s, {ms} ms");
}

async fn error_of(response: reqwest::Response) -> Value {
    assert_eq!(response.headers()["content-type"], "application/json");
    response.json::<Value>().await.unwrap()
}

/// Waits (bounded) until `cond` holds.
async fn eventually(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sheds_with_proper_statuses_and_bodies() {
    let (base, _app) = serve().await;
    let unknown = chat(&base, "gpt-9").await;
    assert_eq!(unknown.status(), 404);
    assert!(!unknown.headers().contains_key("retry-after"));
    // The `loadgate` binary's 404, byte for byte.
    assert_eq!(unknown.text().await.unwrap(), loadgate::openai_error::unknown_model(Some("gpt-9")));

    let empty = chat(&base, "empty").await;
    assert_eq!(empty.status(), 503);
    assert_default_hint(&empty);
    assert_eq!(error_of(empty).await["error"]["type"], "Unavailable");

    let bad = client().post(format!("{base}/v1/chat/completions")).body("{}").send().await.unwrap();
    assert_eq!(bad.status(), 400);
    let body = error_of(bad).await;
    assert_eq!((body["error"]["code"].as_u64(), body["error"]["param"].as_str()), (Some(400), Some("model")));

    // Both workers report 90 of 100 blocks: past 0.85, every worker is busy.
    for worker in [1, 2] {
        let reported = client().post(format!("{base}/load/{worker}/90")).send().await.unwrap();
        assert_eq!(reported.status(), 204);
    }
    assert_eq!(client().post(format!("{base}/load/7/90")).send().await.unwrap().status(), 404);
    let shed = chat(&base, "llama").await;
    assert_eq!(shed.status(), 529);
    assert_default_hint(&shed);
    let body = error_of(shed).await;
    assert_eq!(
        body,
        serde_json::json!({"error": {"message": "All workers are busy, please retry later", "type": "Overloaded", "param": null, "code": 529}})
    );

    // Worker 2 frees up: it takes the request.
    client().post(format!("{base}/load/2/10")).send().await.unwrap();
    let served = chat(&base, "llama").await;
    assert_eq!(served.status(), 200);
    let text = served.text().await.unwrap();
    assert!(text.contains("token 4 from worker 2") && text.ends_with("data: [DONE]\n\n"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_permit_lasts_until_the_sse_body_ends_or_the_client_leaves() {
    let (base, app) = serve().await;
    // Route everything to worker 1.
    client().post(format!("{base}/load/2/99")).send().await.unwrap();
    let gate = app.gates[&1].clone();

    // 10 tokens, 100 ms apart: the body ends about 1 s after it starts.
    let streaming = chat_tokens(&base, "llama", 10).await;
    assert_eq!(streaming.status(), 200);
    let mut body = streaming.bytes_stream();
    let first = body.next().await.unwrap().unwrap();
    let mut seen = String::from_utf8_lossy(&first).into_owned();
    assert!(seen.contains("token 0"), "{seen}");
    // Headers and a token are out; the engine is still busy with the rest.
    assert_eq!(gate.running(), 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(gate.running(), 1, "released before the body ended");
    while let Some(chunk) = body.next().await {
        seen.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
    }
    assert!(seen.contains("token 9") && seen.ends_with("data: [DONE]\n\n"), "{seen}");
    eventually("the finished stream releases its slot", || gate.running() == 0).await;

    // From here every stream asks for 1000 tokens (100 s): within the test's
    // 5 s waits, only a client leaving can free a slot.
    // N = 1 running and Q = 2 waiting; a fourth request is refused at the
    // worker's hard cap (the router still sees worker 1 as free).
    let held = chat_tokens(&base, "llama", 1000).await;
    let mut held_body = held.bytes_stream();
    held_body.next().await.unwrap().unwrap();
    let waiting: Vec<_> = (0..2).map(|_| tokio::spawn(long_chat(base.clone()))).collect();
    eventually("two requests wait", || gate.queued() == 2).await;
    let refused = chat(&base, "llama").await;
    assert_eq!(refused.status(), 529);
    assert_default_hint(&refused);
    assert_eq!(error_of(refused).await["error"]["message"], "Server overloaded: worker at capacity");

    // The client goes away mid-stream: its slot passes to the oldest waiter.
    drop(held_body);
    eventually("the next waiter runs", || gate.queued() == 1 && gate.running() == 1).await;
    let mut waiting = waiting;
    for round in 0..2 {
        // The waiter that queued first gets the slot (not necessarily the
        // first spawned); the other keeps waiting.
        let deadline = Instant::now() + Duration::from_secs(5);
        let admitted = loop {
            if let Some(i) = waiting.iter().position(|w| w.is_finished()) {
                break i;
            }
            assert!(Instant::now() < deadline, "round {round}: no waiter got the slot");
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let response = waiting.swap_remove(admitted).await.unwrap();
        assert!(waiting.iter().all(|w| !w.is_finished()), "one slot, one stream at a time");
        let mut body = response.bytes_stream();
        assert!(String::from_utf8_lossy(&body.next().await.unwrap().unwrap()).contains("token 0"));
        assert_eq!(gate.running(), 1, "round {round}: the waiter streams in the one slot");
        drop(body); // disconnects mid-stream
    }
    eventually("every disconnected stream releases its slot", || gate.running() == 0 && gate.queued() == 0).await;
}

/// `/metrics` answers each scraper in its format, with the example's 529s
/// (counted by `Routed`) and the workers' reported load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_the_overloads_in_the_scrapers_format() {
    let (base, _app) = serve().await;
    for worker in [1, 2] {
        client().post(format!("{base}/load/{worker}/90")).send().await.unwrap();
    }
    for _ in 0..3 {
        assert_eq!(chat(&base, "llama").await.status(), 529);
    }
    let scrape = |accept: &'static str| {
        let request = client().get(format!("{base}/metrics"));
        async move { request.header("accept", accept).send().await.unwrap() }
    };
    let classic = scrape("text/plain").await;
    assert_eq!(classic.headers()["content-type"], "text/plain; version=0.0.4; charset=utf-8");
    assert_eq!(classic.headers()["vary"], "Accept");
    let text = classic.text().await.unwrap();
    let rejected = r#"dynamo_frontend_model_rejection_total{model="llama",endpoint="chat_completions"} 3"#;
    assert!(text.lines().any(|l| l == rejected), "{text}");
    assert!(text.contains(r#"dynamo_frontend_worker_active_decode_blocks{worker_id="1",dp_rank="0"} 90"#), "{text}");
    assert!(!text.contains("# EOF"));
    let openmetrics = scrape("application/openmetrics-text;version=1.0.0,text/plain;q=0.5").await;
    assert_eq!(openmetrics.headers()["content-type"], "application/openmetrics-text; version=1.0.0; charset=utf-8");
    let text = openmetrics.text().await.unwrap();
    assert!(text.lines().any(|l| l == rejected) && text.ends_with("# EOF\n"), "{text}");
}

async fn long_chat(base: String) -> reqwest::Response {
    chat_tokens(&base, "llama", 1000).await
}
