//! Direct calls to a worker: without the frontend's request proof they get
//! 401.

use serde_json::{json, Value};

use crate::common::{self, request_proof, shared, small_body, unix_ms, worker, PROOF_HEADER, SECRET, WRONG_SECRET};
use crate::MODEL;

/// A worker with the secret refuses requests that lack the frontend's proof
/// (nobody bypasses shedding and the cap by calling it directly): no proof,
/// a wrong, malformed, stale, future, other-path or other-method proof all
/// get 401; a valid proof gets 200; `/health` and `/metrics` stay open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_calls_to_a_worker_without_the_proof_get_401() {
    let _box = shared().await;
    let w = worker(None, MODEL, Some(SECRET), &[]);
    let client = common::client();
    let now = unix_ms();
    let key = SECRET.as_bytes();
    let cases: Vec<(&str, Option<String>)> = vec![
        ("no proof", None),
        (
            "wrong secret",
            Some(request_proof(WRONG_SECRET.as_bytes(), "POST", "/v1/completions", &small_body(MODEL), now)),
        ),
        ("malformed", Some("v1.123.nothex".to_owned())),
        ("stale (60 s old)", Some(request_proof(key, "POST", "/v1/completions", &small_body(MODEL), now - 60_000))),
        ("future (60 s ahead)", Some(request_proof(key, "POST", "/v1/completions", &small_body(MODEL), now + 60_000))),
        ("other path", Some(request_proof(key, "POST", "/v1/chat/completions", &small_body(MODEL), now))),
        ("other method", Some(request_proof(key, "GET", "/v1/completions", b"", now))),
    ];
    for (what, proof) in &cases {
        let (status, body) = common::complete(&client, &w.http, MODEL, proof.as_deref()).await;
        assert_eq!(status, 401, "POST /v1/completions with {what}: {body}");
        let error: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        assert_eq!(error["error"]["type"], "Unauthorized", "{what}: {body}");
        assert_eq!(error["error"]["code"], 401, "{what}: {body}");
    }
    let chat = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let response = client.post(format!("{}/v1/chat/completions", w.http)).json(&chat).send().await.unwrap();
    assert_eq!(response.status(), 401, "chat without a proof");
    for path in ["/info", "/v1/models"] {
        let response = client.get(format!("{}{path}", w.http)).send().await.unwrap();
        assert_eq!(response.status(), 401, "GET {path} without a proof");
        let stale = request_proof(key, "GET", path, b"", now - 31_000);
        let response = client.get(format!("{}{path}", w.http)).header(PROOF_HEADER, stale).send().await.unwrap();
        assert_eq!(response.status(), 401, "GET {path} with a 31 s old proof");
    }
    // The valid proof works (the MAC is the one spec section 1 defines)...
    let valid = request_proof(key, "POST", "/v1/completions", &small_body(MODEL), unix_ms());
    let (status, body) = common::complete(&client, &w.http, MODEL, Some(&valid)).await;
    assert_eq!(status, 200, "a valid proof: {body}");
    // A proof seen on the wire does not carry another prompt: it vouches for its body.
    let other = request_proof(key, "POST", "/v1/completions", &small_body("another model"), unix_ms());
    let (status, body) = common::complete(&client, &w.http, MODEL, Some(&other)).await;
    assert_eq!(status, 400, "a valid proof for another body: {body}");
    let valid = request_proof(key, "GET", "/info", b"", unix_ms());
    let response = client.get(format!("{}/info", w.http)).header(PROOF_HEADER, valid).send().await.unwrap();
    assert_eq!(response.status(), 200, "GET /info with a valid proof");
    // ...and the probes stay open.
    for path in ["/health", "/metrics"] {
        let response = client.get(format!("{}{path}", w.http)).send().await.unwrap();
        assert_eq!(response.status(), 200, "GET {path} without a proof");
    }
}
