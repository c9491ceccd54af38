//! Direct calls to a worker: without the frontend's request proof for that
//! worker they get 401; a proof is good for one delivery to one worker in
//! one life; and a worker's proof refusals never reach a frontend's client.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::HeaderMap;
use serde_json::{json, Value};

use crate::common::{
    self, register, request_proof, shared, small_body, target_of, unix_ms, worker, worker_with_env, EventConn,
    Frontend, Target, PROOF_HEADER, SECRET, STARTUP, WRONG_SECRET,
};
use crate::MODEL;

/// The refusal signal of a proof refusal.
const REFUSAL: (&str, &str) = ("x-loadgate-refusal", "proof-refused");

/// POSTs `body` to `base`'s completions with `proof`: the status, the
/// refusal signal and the body.
async fn post(client: &reqwest::Client, base: &str, body: &[u8], proof: Option<&str>) -> (u16, Option<String>, String) {
    let mut request =
        client.post(format!("{base}/v1/completions")).header("content-type", "application/json").body(body.to_vec());
    if let Some(proof) = proof {
        request = request.header(PROOF_HEADER, proof);
    }
    let response = request.send().await.expect("the worker answers");
    let status = response.status().as_u16();
    let signal = response.headers().get(REFUSAL.0).and_then(|v| v.to_str().ok()).map(str::to_owned);
    (status, signal, response.text().await.unwrap_or_default())
}

/// A worker with the secret refuses requests that lack a proof for it (nobody
/// bypasses shedding and the cap by calling it directly): no proof, a wrong,
/// malformed, stale, future, other-path, other-method, other-worker or
/// other-incarnation proof all get 401 with the refusal signal; a valid proof
/// gets 200; `/health`, `/metrics` and `/info` stay open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_calls_to_a_worker_without_the_proof_get_401() {
    let _box = shared().await;
    let w = worker(None, MODEL, Some(SECRET), &[]);
    let client = common::client();
    let target = target_of(&client, &w.http).await;
    let now = unix_ms();
    let key = SECRET.as_bytes();
    let body = small_body(MODEL);
    let other_worker = Target { worker: target.worker.wrapping_add(1), ..target };
    let other_life = Target { incarnation: target.incarnation.wrapping_add(1), ..target };
    let cases: Vec<(&str, Option<String>)> = vec![
        ("no proof", None),
        ("wrong secret", Some(request_proof(WRONG_SECRET.as_bytes(), "POST", "/v1/completions", &body, target, now))),
        ("malformed", Some("v1.123.nothex".to_owned())),
        ("stale (6 s old)", Some(request_proof(key, "POST", "/v1/completions", &body, target, now - 6_000))),
        ("future (6 s ahead)", Some(request_proof(key, "POST", "/v1/completions", &body, target, now + 6_000))),
        ("other path", Some(request_proof(key, "POST", "/v1/chat/completions", &body, target, now))),
        ("other method", Some(request_proof(key, "GET", "/v1/completions", b"", target, now))),
        ("other worker", Some(request_proof(key, "POST", "/v1/completions", &body, other_worker, now))),
        ("other incarnation", Some(request_proof(key, "POST", "/v1/completions", &body, other_life, now))),
    ];
    for (what, proof) in &cases {
        let (status, signal, text) = post(&client, &w.http, &body, proof.as_deref()).await;
        assert_eq!(status, 401, "POST /v1/completions with {what}: {text}");
        assert_eq!(signal.as_deref(), Some(REFUSAL.1), "{what}: the refusal signal");
        let error: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        assert_eq!(error["error"]["type"], "Unauthorized", "{what}: {text}");
        assert_eq!(error["error"]["code"], 401, "{what}: {text}");
    }
    let chat = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let response = client.post(format!("{}/v1/chat/completions", w.http)).json(&chat).send().await.unwrap();
    assert_eq!(response.status(), 401, "chat without a proof");
    let response = client.get(format!("{}/v1/models", w.http)).send().await.unwrap();
    assert_eq!(response.status(), 401, "GET /v1/models without a proof");
    // The valid proof works (the MAC is the one docs/deployment.md defines)...
    let valid = request_proof(key, "POST", "/v1/completions", &body, target, unix_ms());
    let (status, _, text) = post(&client, &w.http, &body, Some(&valid)).await;
    assert_eq!(status, 200, "a valid proof: {text}");
    // A proof does not carry another prompt: it vouches for its body.
    let other = request_proof(key, "POST", "/v1/completions", &small_body("another model"), target, unix_ms());
    let (status, _, text) = post(&client, &w.http, &body, Some(&other)).await;
    assert_eq!(status, 400, "a valid proof for another body: {text}");
    // ...and the probes and the identity stay open.
    for path in ["/health", "/metrics", "/info"] {
        let response = client.get(format!("{}{path}", w.http)).send().await.unwrap();
        assert_eq!(response.status(), 200, "GET {path} without a proof");
    }
}

/// A proof a worker accepted is refused when it comes again, and a proof made
/// for this worker's previous life (a restart with the same `--worker-id`) is
/// refused by the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proof_is_accepted_once_and_by_one_life_of_one_worker() {
    let _box = shared().await;
    let id = 777_000 + u64::from(fastrand::u16(..));
    let id_flag = id.to_string();
    let mut first = worker(None, MODEL, Some(SECRET), &["--worker-id", &id_flag]);
    let client = common::client();
    let old_life = target_of(&client, &first.http).await;
    let body = small_body(MODEL);
    let proof = request_proof(SECRET.as_bytes(), "POST", "/v1/completions", &body, old_life, unix_ms());
    let (status, _, text) = post(&client, &first.http, &body, Some(&proof)).await;
    assert_eq!(status, 200, "the first delivery: {text}");
    let (status, signal, text) = post(&client, &first.http, &body, Some(&proof)).await;
    assert_eq!((status, signal.as_deref()), (401, Some(REFUSAL.1)), "the same proof again: {text}");
    assert!(text.contains("replayed"), "{text}");
    // The same worker id, restarted: a new incarnation.
    first.proc.kill();
    let restarted = worker(None, MODEL, Some(SECRET), &["--worker-id", &id_flag]);
    let new_life = target_of(&client, &restarted.http).await;
    assert_eq!(new_life.worker, id);
    assert_ne!(new_life.incarnation, old_life.incarnation);
    let stale_life = request_proof(SECRET.as_bytes(), "POST", "/v1/completions", &body, old_life, unix_ms());
    let (status, signal, text) = post(&client, &restarted.http, &body, Some(&stale_life)).await;
    assert_eq!((status, signal.as_deref()), (401, Some(REFUSAL.1)), "a proof for the previous life: {text}");
}

/// What a capturing endpoint saw of one proxied request.
#[derive(Clone, Debug, Default)]
struct Captured {
    proof: Option<String>,
    body: Vec<u8>,
}

/// An endpoint that answers every completion 200 and keeps the last request's
/// proof and body: what a compromised worker (or anyone on the path) sees.
async fn capturing_endpoint() -> (SocketAddr, Arc<Mutex<Captured>>) {
    let seen = Arc::new(Mutex::new(Captured::default()));
    let kept = seen.clone();
    let handler = move |headers: HeaderMap, body: axum::body::Bytes| {
        let kept = kept.clone();
        async move {
            let proof = headers.get(PROOF_HEADER).and_then(|v| v.to_str().ok()).map(str::to_owned);
            *kept.lock().unwrap() = Captured { proof, body: body.to_vec() };
            axum::Json(json!({"choices": [{"index": 0, "text": "captured", "finish_reason": "stop"}]}))
        }
    };
    let app = axum::Router::new().route("/v1/completions", axum::routing::post(handler));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, seen)
}

/// A request proof the frontend sent one worker — here to an insider that
/// holds the event secret and registered a worker of its own — is refused by
/// every other worker, however often it is replayed. On df655a4 the proof
/// was bound to no worker and no nonce: the same request replayed to the real
/// worker was served every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proof_sent_to_one_worker_is_refused_by_every_other() {
    let _box = shared().await;
    // The insider sends nothing after its Register: a long silence bound
    // keeps it in routing however slow the machine.
    let fe = Frontend::secured(&[
        "--router-mode",
        "round-robin",
        "--event-silence-ms",
        "30000",
        "--event-idle-timeout-ms",
        "60000",
    ]);
    let real = worker(Some(fe.events), MODEL, Some(SECRET), &[]);
    fe.wait_workers(1, STARTUP).await;
    let (capture, seen) = capturing_endpoint().await;
    let mut insider = EventConn::authenticated(fe.events, SECRET);
    insider.send(&register(9_900_001, 1, 1, MODEL, &capture.to_string())).expect("the insider registers");
    fe.wait_workers(2, STARTUP).await;
    // Round robin: within a few requests one goes to the insider.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while seen.lock().unwrap().proof.is_none() {
        assert!(tokio::time::Instant::now() < deadline, "no request reached the insider");
        let (status, text) = fe.complete(MODEL).await;
        assert_eq!(status, 200, "{text}");
    }
    let captured = seen.lock().unwrap().clone();
    let proof = captured.proof.expect("the frontend signs what it sends a worker");
    let client = common::client();
    for attempt in 1..=3 {
        let (status, signal, text) = post(&client, &real.http, &captured.body, Some(&proof)).await;
        assert_eq!(status, 401, "replay {attempt} of a proof meant for another worker was served: {text}");
        assert_eq!(signal.as_deref(), Some(REFUSAL.1));
    }
    drop(insider);
}

/// A rotation done in the wrong order: the frontend signs with the new
/// secret while one worker still has only the old one (the frontend still
/// verifies the old one, so that worker keeps its event connection). That
/// worker refuses every proof; the frontend migrates its requests, takes it
/// out of routing, counts `upstream_failures_total{kind="proof"}`, and no
/// client ever gets a 401. With only that worker, clients get 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotation_in_the_wrong_order_never_reaches_a_client() {
    let _box = shared().await;
    const NEW: &str = "the-new-event-secret-0123456789abcdef";
    let env = [("LOADGATE_EVENT_SECRET", NEW), ("LOADGATE_EVENT_SECRET_PREVIOUS", SECRET)];
    let fe = Frontend::start_with_env(&env, &["--router-mode", "round-robin", "--migration-limit", "3"]);
    // The lagging worker has only the old secret.
    let lagging = worker_with_env(Some(fe.events), MODEL, &[("LOADGATE_EVENT_SECRET", SECRET)], &[]);
    fe.wait_workers(1, STARTUP).await;
    for _ in 0..5 {
        let (status, text) = fe.complete(MODEL).await;
        assert_eq!(status, 503, "only a worker that refuses every proof: {text}");
        assert!(!text.contains("Unauthorized") && !text.contains("x-loadgate-proof"), "{text}");
    }
    // A worker done right joins: every request is served, none is a 401.
    let _current = worker_with_env(
        Some(fe.events),
        MODEL,
        &[("LOADGATE_EVENT_SECRET", NEW), ("LOADGATE_EVENT_SECRET_PREVIOUS", SECRET)],
        &[],
    );
    fe.wait_workers(2, STARTUP).await;
    for i in 0..20 {
        let (status, text) = fe.complete(MODEL).await;
        assert_eq!(status, 200, "request {i}: {text}");
    }
    let text = common::metrics_text(&fe.client, &fe.http).await;
    let refused = text
        .lines()
        .find(|l| l.starts_with("loadgate_frontend_upstream_failures_total{kind=\"proof\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok());
    assert!(refused.is_some_and(|n| n >= 1.0), "proof refusals counted: {refused:?}\n{text}");
    assert!(fe.proc.wait_log("refused the request proof", Duration::from_secs(1)), "the refusal is logged");
    drop(lagging);
}
