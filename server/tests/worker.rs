//! Integration tests of the real `loadgate worker` binary on 127.0.0.1:
//! OpenAI shapes, the `N + Q` hard cap (test (c) of issue 3), and the
//! configuration errors it refuses to start with.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{expect_field, long_client, Proc};
use serde_json::Value;

/// A server child process, killed when dropped (its logs printed if the
/// test fails).
struct Server {
    _proc: Proc,
    /// The HTTP address.
    addr: String,
    /// The whole `listening ...` line.
    line: String,
}

/// Starts `loadgate <args>` and waits (bounded) for its `listening http=...` line.
fn start(args: &[&str], env: &[(&str, &str)]) -> Server {
    let name = args.first().copied().unwrap_or("loadgate");
    let (proc, line) = common::spawn(name, args, env);
    let line = line.trim().to_owned();
    assert!(line.starts_with("listening http="), "unexpected first line {line:?}");
    let addr = expect_field(&line, "http");
    Server { _proc: proc, addr, line }
}

/// A worker with the cap `N = 1`, `Q = 2`, standalone or pushing to the
/// frontend event ports `frontends`.
fn capped_worker_for(frontends: &[&str]) -> Server {
    let mut args =
        vec!["worker", "--model", "m", "--http-host", "127.0.0.1", "--http-port", "0", "--engine-request-limit", "1"];
    args.extend(["--decode-step-ms", "10"]);
    for f in frontends {
        args.extend(["--frontend", f]);
    }
    start(&args, &[("DYN_DYNAMO_REQUEST_QUEUE_LIMIT", "2")])
}

fn capped_worker() -> Server {
    capped_worker_for(&[])
}

/// A frontend (no thresholds) and its event address.
fn frontend() -> (Server, String) {
    let server = start(
        &["frontend", "--http-host", "127.0.0.1", "--http-port", "0", "--event-port", "0", "--admin-port", "0"],
        &[],
    );
    let events = expect_field(&server.line, "events");
    (server, events)
}

/// Waits (bounded: 10 s) until the frontend has `n` registered workers.
async fn wait_for_workers(client: &reqwest::Client, frontend: &Server, n: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let health: Value =
            client.get(format!("http://{}/health", frontend.addr)).send().await.unwrap().json().await.unwrap();
        if health["workers"].as_u64() == Some(n) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "the frontend never had {n} workers: {health}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Fills `worker` to its cap with three long requests sent to it directly
/// (one running, two queued); returns their handles.
async fn fill(client: &reqwest::Client, worker: &Server) -> Vec<tokio::task::JoinHandle<(u16, String)>> {
    let long: Vec<_> = (0..3).map(|_| tokio::spawn(complete(client.clone(), worker.addr.clone(), 300))).collect();
    // Bounded (10 s): they fill the cap in milliseconds; once the running
    // one ends (3 s of generation) it is never full this way again.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = metrics(client, &worker.addr).await;
        if metric(&text, "dynamo_engine_request") == Some(1.0) && metric(&text, "dynamo_request_queue") == Some(2.0) {
            return long;
        }
        assert!(std::time::Instant::now() < deadline, "the cap never filled (1 running, 2 queued):\n{text}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find(|l| l.starts_with(name))?.rsplit(' ').next()?.parse().ok()
}

async fn metrics(client: &reqwest::Client, addr: &str) -> String {
    client.get(format!("http://{addr}/metrics")).send().await.unwrap().text().await.unwrap()
}

async fn complete(client: reqwest::Client, addr: String, max_tokens: u32) -> (u16, String) {
    let body = serde_json::json!({"model": "m", "prompt": "one two three", "max_tokens": max_tokens});
    let resp = client.post(format!("http://{addr}/v1/completions")).json(&body).send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_caps_at_n_plus_q_and_refuses_the_next() {
    let worker = capped_worker();
    let client = long_client();
    // Three long requests: one runs (N = 1), two wait (Q = 2).
    let long: Vec<_> = (0..3).map(|_| tokio::spawn(complete(client.clone(), worker.addr.clone(), 150))).collect();
    // Bounded (10 s), as in `fill`.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = metrics(&client, &worker.addr).await;
        if metric(&text, "dynamo_engine_request") == Some(1.0) && metric(&text, "dynamo_request_queue") == Some(2.0) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the cap never filled (1 running, 2 queued):\n{text}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The fourth concurrent request is refused.
    let resp = client
        .post(format!("http://{}/v1/completions", worker.addr))
        .json(&serde_json::json!({"model": "m", "prompt": "x", "max_tokens": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 529);
    assert_eq!(resp.headers().get("retry-after").unwrap(), "1");
    assert_eq!(
        resp.text().await.unwrap(),
        r#"{"error":{"message":"Server overloaded: worker at capacity","type":"Overloaded","param":null,"code":529}}"#
    );
    // The three accepted requests all complete.
    for handle in long {
        let (status, body) = handle.await.unwrap();
        assert_eq!(status, 200, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["usage"]["completion_tokens"], 150);
    }
    let text = metrics(&client, &worker.addr).await;
    assert_eq!(metric(&text, "dynamo_rejection_request_total"), Some(1.0), "{text}");
    assert_eq!(metric(&text, "dynamo_engine_request"), Some(0.0), "{text}");
    assert_eq!(metric(&text, "dynamo_request_queue"), Some(0.0), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_gone_returns_the_permit() {
    let worker = capped_worker();
    let client = long_client();
    // A streaming request whose client stops reading and goes away.
    let body = serde_json::json!({"model": "m", "prompt": "a b", "max_tokens": 10000, "stream": true});
    let url = format!("http://{}/v1/completions", worker.addr);
    let resp = client.post(&url).json(&body).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(metric(&metrics(&client, &worker.addr).await, "dynamo_engine_request"), Some(1.0));
    drop(resp);
    // Bounded (10 s): the permit comes back at the next engine step.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if metric(&metrics(&client, &worker.addr).await, "dynamo_engine_request") == Some(0.0) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the client's permit never came back");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The slot is free again: a new request runs at once.
    assert_eq!(complete(client.clone(), worker.addr.clone(), 2).await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_shapes_streaming_and_not() {
    let worker = start(
        &[
            "worker",
            "--model",
            "m",
            "--http-host",
            "127.0.0.1",
            "--http-port",
            "0",
            "--dp-size",
            "2",
            "--worker-id",
            "42",
        ],
        &[],
    );
    let client = long_client();
    let base = format!("http://{}", worker.addr);

    let info: Value = client.get(format!("{base}/info")).send().await.unwrap().json().await.unwrap();
    let incarnation = info["incarnation"].as_u64().expect("an incarnation");
    assert!(incarnation > 0, "picked from the clock at start");
    assert_eq!(info, serde_json::json!({"worker_id": 42, "incarnation": incarnation, "model": "m", "dp_size": 2}));
    let models: Value = client.get(format!("{base}/v1/models")).send().await.unwrap().json().await.unwrap();
    assert_eq!(models["data"][0]["id"], "m");
    assert_eq!(client.get(format!("{base}/health")).send().await.unwrap().status().as_u16(), 200);

    let (status, body) = complete(client.clone(), worker.addr.clone(), 4).await;
    assert_eq!(status, 200);
    assert!(body.contains(r#""usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}"#), "{body}");

    let chat = serde_json::json!({
        "model": "m",
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 3,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let resp = client.post(format!("{base}/v1/chat/completions")).json(&chat).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let text = resp.text().await.unwrap();
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.len(), 6, "3 tokens, the finish chunk, the usage chunk, [DONE]: {text}");
    assert_eq!(*events.last().unwrap(), "data: [DONE]");
    let first: Value = serde_json::from_str(events[0].strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    let last: Value = serde_json::from_str(events[4].strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(last["choices"], serde_json::json!([]), "the usage comes in its own chunk");
    assert_eq!(last["usage"]["prompt_tokens"], 2);
    assert_eq!(last["usage"]["completion_tokens"], 3);

    let resp = client.post(format!("{base}/v1/completions")).body("nope").send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_request_migrates_to_the_other_worker() {
    let (frontend, events) = frontend();
    let full = capped_worker_for(&[&events]);
    let free = capped_worker_for(&[&events]);
    let client = long_client();
    wait_for_workers(&client, &frontend, 2).await;
    let long = fill(&client, &full).await;
    // Round-robin sends some of these to the full worker first: it refuses,
    // the frontend migrates the request to the free one, the client never knows.
    for _ in 0..4 {
        let (status, body) = complete(client.clone(), frontend.addr.clone(), 2).await;
        assert_eq!(status, 200, "{body}");
    }
    let refused = metric(&metrics(&client, &full.addr).await, "dynamo_rejection_request_total").unwrap();
    assert!(refused >= 1.0, "the full worker refused at least one request");
    let served = metric(&metrics(&client, &free.addr).await, "dynamo_rejection_request_total").unwrap();
    assert_eq!(served, 0.0);
    let fe = metrics(&client, &frontend.addr).await;
    assert!(!fe.lines().any(|l| l.starts_with("dynamo_frontend_model_rejection_total") && !l.ends_with(" 0")), "{fe}");
    drop(long);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusal_with_nowhere_to_migrate_reaches_the_client() {
    let (frontend, events) = frontend();
    let worker = capped_worker_for(&[&events]);
    let client = long_client();
    wait_for_workers(&client, &frontend, 1).await;
    let long = fill(&client, &worker).await;
    let (status, body) = complete(client.clone(), frontend.addr.clone(), 2).await;
    assert_eq!(status, 529, "{body}");
    let error: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["error"]["code"], 529);
    assert_eq!(metric(&metrics(&client, &worker.addr).await, "dynamo_rejection_request_total"), Some(1.0));
    let fe = metrics(&client, &frontend.addr).await;
    let rejected: f64 = fe
        .lines()
        .filter(|l| l.starts_with("dynamo_frontend_model_rejection_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(rejected, 1.0, "{fe}");
    drop(long);
}

/// Runs `loadgate worker` with an invalid admission configuration: it must
/// exit with an error that names the problem.
fn refuses_to_start(extra: &[&str], env: &[(&str, &str)], expected: &str) {
    let mut cmd = Command::new(common::bin());
    cmd.args(["worker", "--model", "m", "--http-host", "127.0.0.1", "--http-port", "0"]).args(extra);
    for (k, v) in env {
        cmd.env(k, v);
    }
    // Bounded: a worker that starts after all is killed, not waited for.
    let mut child =
        cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().expect("run loadgate");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while child.try_wait().expect("wait for loadgate").is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let started = child.try_wait().expect("wait for loadgate").is_none();
    if started {
        child.kill().expect("kill loadgate");
    }
    let out = child.wait_with_output().expect("read loadgate's output");
    assert!(!started && !out.status.success(), "the worker must not start ({extra:?}, {env:?})");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(expected), "stderr {stderr:?} should mention {expected:?}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("listening"));
}

#[test]
fn invalid_queue_limit_is_an_error() {
    let cap = ["--engine-request-limit", "1"];
    refuses_to_start(&cap, &[("DYN_DYNAMO_REQUEST_QUEUE_LIMIT", "many")], "DYN_DYNAMO_REQUEST_QUEUE_LIMIT");
    refuses_to_start(&cap, &[("DYN_DYNAMO_REQUEST_QUEUE_LIMIT", "1")], "at least 2");
    refuses_to_start(&["--engine-request-limit", "0"], &[], "at least 1");
    // The flag at fault is named (it said only "limit 99999999999 is larger than 4294967295").
    refuses_to_start(&["--engine-request-limit", "99999999999"], &[], "--engine-request-limit 99999999999");
    refuses_to_start(&["--engine-request-limit", "0"], &[], "--engine-request-limit 0");
}

/// A `--frontend` that is not HOST:PORT is refused at start, naming the
/// flag: the worker started and retried it forever, each time logging a lost
/// connection it never had.
#[test]
fn a_frontend_that_is_not_host_port_is_an_error() {
    for bad in ["garbage", "http://127.0.0.1:8001/events", "127.0.0.1:0", ":8001", "127.0.0.1:port"] {
        refuses_to_start(&["--frontend", bad], &[], "--frontend");
    }
    refuses_to_start(&[], &[("LOADGATE_WORKER_FRONTEND", "127.0.0.1:8001,garbage")], "--frontend");
}

/// A request that could never fit in the KV cache is refused with a 400
/// before it takes a place in the cap: not queued behind the others, not a
/// 529 that invites the client to retry it forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_never_fits_is_refused_before_the_cap() {
    let worker = capped_worker();
    let client = long_client();
    let long = fill(&client, &worker).await;
    let (status, body) = complete(client.clone(), worker.addr.clone(), 1_000_000_000).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("more than the KV cache holds"), "{body}");
    let text = metrics(&client, &worker.addr).await;
    assert_eq!(metric(&text, "dynamo_rejection_request_total"), Some(0.0), "{text}");
    drop(long);
}

/// A client that sent bytes after its request (a stray CRLF, a pipelined
/// request) and then closed gives its place in the cap back at once: hyper
/// alone notices a close only with nothing unread, and the request ran to
/// the end of its generation (10 s here; the bound below is 3 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_with_bytes_unread_returns_the_permit() {
    use std::io::Write as _;
    let worker = capped_worker();
    let client = long_client();
    for trailing in ["\r\n", "GET /health HTTP/1.1\r\nhost: w\r\n\r\n"] {
        let body = serde_json::json!({"model": "m", "prompt": "a b", "max_tokens": 1000}).to_string();
        let request = format!(
            "POST /v1/completions HTTP/1.1\r\nhost: w\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}{trailing}",
            body.len()
        );
        let mut raw = std::net::TcpStream::connect(&worker.addr).unwrap();
        raw.write_all(request.as_bytes()).unwrap();
        let running = |text: &str| metric(text, "dynamo_engine_request");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while running(&metrics(&client, &worker.addr).await) != Some(1.0) {
            assert!(std::time::Instant::now() < deadline, "the request did not start");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(raw);
        let closed = std::time::Instant::now();
        while running(&metrics(&client, &worker.addr).await) != Some(0.0) {
            assert!(closed.elapsed() < Duration::from_secs(3), "{trailing:?}: the permit is still held");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// The frontend's `loadgate_frontend_worker_waiting_requests` of its one
/// worker (rank 0), if reported.
async fn frontend_waiting(client: &reqwest::Client, frontend: &Server) -> Option<f64> {
    metric(&metrics(client, &frontend.addr).await, "loadgate_frontend_worker_waiting_requests")
}

/// Polls the frontend (at most 20 s) until its worker's reported waiting
/// requests are `want`; returns the last value seen.
async fn wait_for_waiting(client: &reqwest::Client, frontend: &Server, want: f64) -> Option<f64> {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut seen = None;
    while std::time::Instant::now() < deadline {
        seen = frontend_waiting(client, frontend).await;
        if seen == Some(want) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    seen
}

/// A simulated worker reports the requests queued in its hard cap as
/// waiting, as a sidecar does (`with_queue`): they were invisible to the
/// frontends (`--active-waiting-requests-threshold`), which saw 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_simulated_worker_reports_its_cap_queue_as_waiting() {
    let (frontend, events) = frontend();
    let args =
        ["worker", "--model", "m", "--engine-request-limit", "1", "--decode-step-ms", "100", "--frontend", &events];
    let worker = start(&args, &[("DYN_DYNAMO_REQUEST_QUEUE_LIMIT", "2")]);
    let client = long_client();
    wait_for_workers(&client, &frontend, 1).await;
    // 300 tokens at 100 ms a step: the first runs for at least 30 s, the other two wait.
    let long = fill(&client, &worker).await;
    assert_eq!(wait_for_waiting(&client, &frontend, 2.0).await, Some(2.0), "the two queued requests");
    // Their clients gone: the report falls back to 0.
    long.iter().for_each(tokio::task::JoinHandle::abort);
    assert_eq!(wait_for_waiting(&client, &frontend, 0.0).await, Some(0.0));
}

/// A full worker refuses a large request (1 MiB or more) before reading and
/// parsing its body: refused only after the parse (2 s for 40 MiB in a debug build), the
/// frontend had let go of the body (its release grace, 1 s after the worker
/// had it all) and answered the client 502 "worker unreachable" instead of
/// moving the request to the free worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_worker_refuses_a_large_request_before_parsing_it() {
    let (frontend, events) = frontend();
    let capped = [
        "worker",
        "--model",
        "m",
        "--engine-request-limit",
        "1",
        "--decode-step-ms",
        "100",
        "--kv-total-blocks",
        "4000000",
    ];
    let full = start(&[&capped[..], &["--frontend", &events]].concat(), &[("DYN_DYNAMO_REQUEST_QUEUE_LIMIT", "2")]);
    let roomy = ["--kv-total-blocks", "4000000", "--max-num-batched-tokens", "100000000", "--frontend", &events];
    let free = start(&[&["worker", "--model", "m"][..], &roomy].concat(), &[]);
    let client = long_client();
    wait_for_workers(&client, &frontend, 2).await;
    // 300 tokens at 100 ms a step: `full` stays full for at least 30 s.
    let long = fill(&client, &full).await;
    let prompt = "a ".repeat(20 << 20);
    let body = serde_json::json!({"model": "m", "prompt": prompt, "max_tokens": 1}).to_string();
    // Round-robin: at least one of three goes to the full worker first.
    for _ in 0..3 {
        let sent = client
            .post(format!("http://{}/v1/completions", frontend.addr))
            .header("content-type", "application/json")
            .body(body.clone())
            .timeout(Duration::from_secs(25))
            .send()
            .await
            .unwrap();
        let status = sent.status().as_u16();
        assert_eq!(status, 200, "{}", sent.text().await.unwrap());
    }
    let refused = metric(&metrics(&client, &full.addr).await, "dynamo_rejection_request_total");
    assert!(refused >= Some(1.0), "the full worker was tried: {refused:?}");
    drop((long, free));
}

/// Request bodies buffered at once are bounded over all requests
/// (`--http-body-budget-mb`), not only per request: any client that reaches
/// a worker's port sends bodies, and without a budget many connections each
/// sending the per-request limit (192 MiB) held that many times it. A body
/// the budget cannot hold is refused with 503; the same body with the
/// default budget is read and parsed (and refused for what it asks: 400).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_are_held_to_the_workers_budget() {
    let base = ["worker", "--model", "m", "--http-host", "127.0.0.1", "--http-port", "0"];
    let budgeted = start(&[&base[..], &["--http-body-budget-mb", "1"]].concat(), &[]);
    let default = start(&base, &[]);
    let client = long_client();
    // 2 MiB of prompt: more than the small budget, and than the KV cache.
    let body = serde_json::json!({"model": "m", "prompt": "a ".repeat(1 << 20), "max_tokens": 4}).to_string();
    let mut seen = Vec::new();
    for worker in [&budgeted, &default] {
        let url = format!("http://{}/v1/completions", worker.addr);
        let response = client
            .post(url)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .expect("an answer");
        let status = response.status().as_u16();
        seen.push((status, response.text().await.unwrap_or_default()));
    }
    assert_eq!(seen[0].0, 503, "over the 1 MiB budget: {}", seen[0].1);
    assert_eq!(seen[1].0, 400, "read whole, refused for its prompt: {}", seen[1].1);
    assert!(seen[1].1.contains("more than the KV cache holds"), "{}", seen[1].1);
}
