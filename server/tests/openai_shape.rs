//! OpenAI's shapes end to end (issue 10, Found 6), with real `loadgate
//! frontend` and `loadgate worker` processes on 127.0.0.1: a field of the
//! wrong type is a 400 naming it (`param`), at the frontend and at the
//! worker; every error body is `{"error":{"message","type","param","code"}}`;
//! `stream_options.include_usage` ends a stream with a usage chunk of
//! `"choices": []`.

mod common;

use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use serde_json::{json, Value};

const MODEL: &str = "shape-model";
/// How long a frontend may take to see its worker.
const SETTLE: Duration = Duration::from_secs(15);

/// A frontend (with `extra` flags) and one worker registered with it.
async fn pool(extra: &[&str], worker_extra: &[&str], env: &[(&str, &str)]) -> (common::Frontend, common::Worker) {
    let frontend = common::Frontend::start(None, extra);
    let worker = common::worker_with_env(Some(frontend.events), MODEL, env, worker_extra);
    frontend.wait_workers(1, SETTLE).await;
    (frontend, worker)
}

/// `POST base+path` with a raw `body`: status, content type and JSON body
/// (`Null` when not JSON).
async fn post(client: &reqwest::Client, url: &str, body: String) -> (u16, String, Value) {
    let response = client.post(url).header("content-type", "application/json").body(body).send().await.unwrap();
    parts(response).await
}

async fn parts(response: reqwest::Response) -> (u16, String, Value) {
    let status = response.status().as_u16();
    let content_type =
        response.headers().get("content-type").map(|v| v.to_str().unwrap_or_default().to_owned()).unwrap_or_default();
    let text = response.text().await.unwrap_or_default();
    (status, content_type, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Asserts `body` is an OpenAI error of `type` `kind`, `code` `status` and
/// `param` `param` (whose name the message holds).
#[track_caller]
fn assert_error(what: &str, status: u16, content_type: &str, body: &Value, kind: &str, param: Option<&str>) {
    assert!(content_type.starts_with("application/json"), "{what}: content type {content_type:?}");
    let error = body["error"].as_object().unwrap_or_else(|| panic!("{what}: not an error body: {body}"));
    let mut keys: Vec<&str> = error.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["code", "message", "param", "type"], "{what}: {body}");
    assert_eq!(error["type"], kind, "{what}: {body}");
    assert_eq!(error["code"], status, "{what}: {body}");
    assert_eq!(error["param"].as_str(), param, "{what}: {body}");
    let message = error["message"].as_str().unwrap_or_else(|| panic!("{what}: no message: {body}"));
    if let Some(param) = param {
        assert!(message.contains(param), "{what}: the message names {param}: {body}");
    }
}

/// Requests with one field wrong, the path they go to, and the field.
fn wrong_types() -> Vec<(&'static str, Value, &'static str)> {
    let completion = |extra: Value| {
        let mut body = json!({"model": MODEL, "prompt": "hello there", "max_tokens": 2});
        for (key, value) in extra.as_object().unwrap() {
            body[key] = value.clone();
        }
        body
    };
    let chat = |extra: Value| {
        let mut body = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
        for (key, value) in extra.as_object().unwrap() {
            body[key] = value.clone();
        }
        body
    };
    let c = "/v1/completions";
    let ch = "/v1/chat/completions";
    vec![
        (c, completion(json!({"stream": "yes"})), "stream"),
        (ch, chat(json!({"stream": 1})), "stream"),
        (c, completion(json!({"max_tokens": -1})), "max_tokens"),
        (c, completion(json!({"max_tokens": "5"})), "max_tokens"),
        (c, completion(json!({"max_tokens": 1e12})), "max_tokens"),
        (c, completion(json!({"max_tokens": 0})), "max_tokens"),
        (c, completion(json!({"max_tokens": 2_147_483_648u64})), "max_tokens"),
        (ch, chat(json!({"max_completion_tokens": -1})), "max_completion_tokens"),
        (c, completion(json!({"prompt": 5})), "prompt"),
        (c, completion(json!({"prompt": ["a", 1]})), "prompt"),
        (c, completion(json!({"prompt": [[1, 2], [-3]]})), "prompt"),
        (c, json!({"model": MODEL}), "prompt"),
        (ch, chat(json!({"messages": []})), "messages"),
        (ch, chat(json!({"messages": "hi"})), "messages"),
        (ch, chat(json!({"messages": ["hi"]})), "messages"),
        (c, completion(json!({"model": 5})), "model"),
        (c, completion(json!({"model": ""})), "model"),
        (ch, json!({"messages": [{"role": "user", "content": "hi"}]}), "model"),
        (c, completion(json!({"stream": true, "stream_options": "usage"})), "stream_options"),
        (
            c,
            completion(json!({"stream": true, "stream_options": {"include_usage": "yes"}})),
            "stream_options.include_usage",
        ),
        (ch, chat(json!({"stream_options": {"include_usage": true}})), "stream_options"),
        (ch, chat(json!({"stream": false, "stream_options": {"include_usage": true}})), "stream_options"),
    ]
}

/// A field of the wrong type is a 400 `invalid_request_error` naming it,
/// from the frontend (before any worker is asked) and from the worker
/// itself; the fields not checked pass through untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_type_is_a_400_naming_the_field() {
    let _shared = common::shared().await;
    let (frontend, worker) = pool(&[], &[], &[]).await;
    let client = common::client_within(Duration::from_secs(20));
    for (path, body, param) in wrong_types() {
        for (who, base) in [("frontend", &frontend.http), ("worker", &worker.http)] {
            let what = format!("{who} {path} {body}");
            let (status, content_type, answer) = post(&client, &format!("{base}{path}"), body.to_string()).await;
            assert_eq!(status, 400, "{what}: {answer}");
            assert_error(&what, status, &content_type, &answer, "invalid_request_error", Some(param));
        }
    }
    // The body as a whole: no `param`.
    for (who, base) in [("frontend", &frontend.http), ("worker", &worker.http)] {
        for body in ["not json", "[1, 2]", "{\"model\": "] {
            let (status, content_type, answer) = post(&client, &format!("{base}/v1/completions"), body.into()).await;
            assert_eq!(status, 400, "{who} {body}: {answer}");
            assert_error(&format!("{who} {body}"), status, &content_type, &answer, "invalid_request_error", None);
        }
    }
    // Right types, with fields nobody checks (and nulls for the defaults), are served.
    let good = [
        ("/v1/completions", json!({"model": MODEL, "prompt": [[1, 2], [3]], "max_tokens": 2, "temperature": "hot"})),
        ("/v1/completions", json!({"model": MODEL, "prompt": ["a", "b"], "max_tokens": null, "stream": null})),
        ("/v1/chat/completions", json!({"model": MODEL, "messages": [{"content": 5}], "max_completion_tokens": 2})),
    ];
    for (path, body) in good {
        let (status, _, answer) = post(&client, &format!("{}{path}", frontend.http), body.to_string()).await;
        assert_eq!(status, 200, "{path} {body}: {answer}");
    }
}

/// Every error of the inference listener is JSON in OpenAI's shape: unknown
/// route and model 404, wrong method 405, a body over the limit 413.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_is_json_in_openais_shape() {
    let _shared = common::shared().await;
    let (frontend, worker) = pool(&["--http-body-limit-mb", "1"], &["--http-body-limit-mb", "1"], &[]).await;
    let client = common::client_within(Duration::from_secs(20));
    let base = &frontend.http;
    let invalid = "invalid_request_error";

    let (status, content_type, body) = parts(client.get(format!("{base}/v1/nothing")).send().await.unwrap()).await;
    assert_eq!(status, 404);
    assert_error("unknown route", status, &content_type, &body, invalid, None);
    let (status, content_type, body) = parts(client.get(format!("{base}/v1/completions")).send().await.unwrap()).await;
    assert_eq!(status, 405);
    assert_error("wrong method", status, &content_type, &body, invalid, None);
    let (status, content_type, body) =
        parts(client.get(format!("{base}/v1/models/no/such-model")).send().await.unwrap()).await;
    assert_eq!(status, 404);
    assert_error("GET /v1/models/{id}", status, &content_type, &body, invalid, Some("model"));
    let models: Value = client.get(format!("{base}/v1/models/{MODEL}")).send().await.unwrap().json().await.unwrap();
    assert_eq!(models["id"], MODEL, "{models}");

    let unknown = json!({"model": "no-such-model", "prompt": "hi", "max_tokens": 1}).to_string();
    let (status, content_type, body) = post(&client, &format!("{base}/v1/completions"), unknown).await;
    assert_eq!(status, 404);
    assert_error("unknown model", status, &content_type, &body, invalid, Some("model"));

    let big = format!(r#"{{"model":"{MODEL}","prompt":"{}"}}"#, "x".repeat(2 << 20));
    let (status, content_type, body) = post(&client, &format!("{base}/v1/completions"), big).await;
    assert_eq!(status, 413);
    assert_error("too large", status, &content_type, &body, invalid, None);

    // The worker's own: unknown route 404, wrong method 405, too large 413.
    let (status, content_type, body) =
        parts(client.get(format!("{}/v1/nothing", worker.http)).send().await.unwrap()).await;
    assert_eq!(status, 404);
    assert_error("worker: unknown route", status, &content_type, &body, invalid, None);
    let (status, content_type, body) =
        parts(client.get(format!("{}/v1/completions", worker.http)).send().await.unwrap()).await;
    assert_eq!(status, 405);
    assert_error("worker: wrong method", status, &content_type, &body, invalid, None);
    // The worker's 413. It refuses before reading and closes: the
    // client, still sending, may see the reset instead of the answer.
    let worker_big = format!(r#"{{"model":"{MODEL}","prompt":"{}"}}"#, "x".repeat(2 << 20));
    let response = client.post(format!("{}/v1/completions", worker.http)).body(worker_big).send().await;
    if let Ok(response) = response {
        let (status, content_type, body) = parts(response).await;
        assert_eq!(status, 413, "{body}");
        assert_error("worker: too large", status, &content_type, &body, invalid, None);
    }
}

/// The `data:` payloads of an SSE body, `[DONE]` included.
fn data_events(text: &str) -> Vec<&str> {
    text.split("\n\n").filter_map(|event| event.trim().strip_prefix("data:")).map(str::trim).collect()
}

/// With `include_usage`, the stream ends as OpenAI's: the finish chunk
/// without usage, then one chunk of `"choices": []` and the usage, then
/// `[DONE]`; every other chunk says `"usage": null`. Without it, no chunk
/// carries usage. A full response keeps its usage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn include_usage_ends_the_stream_with_a_usage_chunk() {
    let _shared = common::shared().await;
    let (frontend, _worker) = pool(&[], &[], &[]).await;
    let client = common::client_within(Duration::from_secs(30));
    let requests = [
        ("/v1/completions", json!({"model": MODEL, "prompt": "one two three", "max_tokens": 4})),
        (
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": [{"role": "user", "content": "one two three"}], "max_tokens": 4}),
        ),
    ];
    for (path, request) in requests {
        let url = format!("{}{path}", frontend.http);
        for include_usage in [true, false] {
            let mut body = request.clone();
            body["stream"] = json!(true);
            if include_usage {
                body["stream_options"] = json!({"include_usage": true});
            }
            let response = client.post(&url).json(&body).send().await.unwrap();
            assert_eq!(response.status().as_u16(), 200);
            assert!(response.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
            let text = response.text().await.unwrap();
            let events = data_events(&text);
            assert_eq!(events.last(), Some(&"[DONE]"), "{text}");
            let chunks: Vec<Value> = events[..events.len() - 1]
                .iter()
                .map(|e| serde_json::from_str(e).unwrap_or_else(|err| panic!("{err}: {e}")))
                .collect();
            let tokens = chunks
                .iter()
                .filter(|c| c["choices"].as_array().is_some_and(|choices| !choices.is_empty()))
                .filter(|c| c["choices"][0]["finish_reason"].is_null())
                .count();
            assert_eq!(tokens, 4, "{text}");
            if include_usage {
                let (last, rest) = chunks.split_last().unwrap();
                assert_eq!(last["choices"], json!([]), "{path}: {text}");
                assert_eq!(last["usage"], json!({"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}));
                for chunk in rest {
                    assert!(chunk["usage"].is_null(), "{path}: only the last chunk has usage: {chunk}");
                    assert_eq!(chunk["choices"].as_array().map(Vec::len), Some(1), "{chunk}");
                }
                assert_eq!(rest.last().unwrap()["choices"][0]["finish_reason"], "length", "{text}");
            } else {
                for chunk in &chunks {
                    assert!(chunk.get("usage").is_none(), "{path}: no usage without include_usage: {chunk}");
                }
                assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "length", "{text}");
            }
        }
        let full: Value = client.post(&url).json(&request).send().await.unwrap().json().await.unwrap();
        assert_eq!(full["usage"]["completion_tokens"], 4, "{full}");
    }
}

/// A 529 of the frontend (its only worker refuses at its cap) has type
/// `Overloaded` and code 529, in OpenAI's shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overload_is_overloaded_with_code_529() {
    let _shared = common::shared().await;
    let capped = [("DYN_DYNAMO_REQUEST_QUEUE_LIMIT", "2")];
    let (frontend, worker) = pool(&[], &["--engine-request-limit", "1"], &capped).await;
    let client = common::long_client();
    // Fill the worker: one running, two queued (each a long stream).
    let mut held = Vec::new();
    for _ in 0..3 {
        let (client, url) = (client.clone(), format!("{}/v1/completions", worker.http));
        held.push(tokio::spawn(async move {
            let body = json!({"model": MODEL, "prompt": "x", "max_tokens": 10000, "stream": true});
            if let Ok(response) = client.post(url).json(&body).send().await {
                let mut stream = response.bytes_stream();
                while let Some(Ok(_)) = stream.next().await {}
            }
        }));
    }
    let deadline = Instant::now() + SETTLE;
    loop {
        let text = client.get(format!("{}/metrics", worker.http)).send().await.unwrap().text().await.unwrap();
        if gauge(&text, "dynamo_engine_request") == Some(1.0) && gauge(&text, "dynamo_request_queue") == Some(2.0) {
            break;
        }
        assert!(Instant::now() < deadline, "the worker never filled:\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let body = json!({"model": MODEL, "prompt": "x", "max_tokens": 1}).to_string();
    let (status, content_type, answer) = post(&client, &format!("{}/v1/completions", frontend.http), body).await;
    assert_eq!(status, 529, "{answer}");
    assert_error("overloaded", status, &content_type, &answer, "Overloaded", None);
    for task in held {
        task.abort();
    }
}

/// The value of the first sample of `name` in an OpenMetrics text.
fn gauge(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|line| line.starts_with(name) && matches!(line.as_bytes().get(name.len()), Some(b'{' | b' ')))
        .find_map(|line| line.rsplit(' ').next()?.parse().ok())
}

/// Found by a review: a `model` of megabytes was copied outside the body
/// budget (the request's label, then a 404 echoing it whole, escaped: a
/// body of 192 MiB made some 800 MiB of copies and answered a 192 MiB 404).
/// A model's name past `MAX_MODEL_LEN` (64 KiB) is a 400 naming `model`,
/// at the frontend and at the worker, with a small body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_name_past_the_bound_is_a_small_400() {
    let _shared = common::shared().await;
    let (frontend, worker) = pool(&[], &[], &[]).await;
    let client = common::client_within(Duration::from_secs(20));
    let long = "m".repeat(1 << 20);
    for (who, base) in [("frontend", &frontend.http), ("worker", &worker.http)] {
        let body = json!({"model": long, "prompt": "a"}).to_string();
        let response = client
            .post(format!("{base}/v1/completions"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let content_type = response.headers()["content-type"].to_str().unwrap_or_default().to_owned();
        let text = response.text().await.unwrap_or_default();
        assert!(text.len() < 4096, "{who}: {status} with a body of {} bytes", text.len());
        let answer: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        assert_eq!(status, 400, "{who}: {answer}");
        assert_error(who, status, &content_type, &answer, "invalid_request_error", Some("model"));
    }
    // At the bound, the name is a name (unknown here: 404).
    let at_bound = json!({"model": "m".repeat(64 << 10), "prompt": "a"}).to_string();
    let (status, _, answer) = post(&client, &format!("{}/v1/completions", frontend.http), at_bound).await;
    assert_eq!(status, 404, "{answer}");
}
