//! What an operator meets first, as real processes over real sockets: the
//! reference guide's commands as written, where the admin API is, flags
//! that take Dynamo's `None` and errors that name the flag, the warning of
//! a frontend that will never shed, deprecated variables, and the 529's
//! status line.
//!
//! Run: `cargo test -p loadgate-server --test operator`.

mod common;

use std::io::{Read as _, Write as _};
use std::time::{Duration, Instant};

use common::{frontend_refuses, BusyWorker, Frontend};
use serde_json::{json, Value};

/// The model of the reference guide's example.
const GUIDE_MODEL: &str = "Qwen/Qwen3-0.6B";
/// An admin token (at least 16 bytes).
const TOKEN: &str = "operator-test-admin-token";

/// `POST`s `body` to `url` (JSON), with `token` as the bearer when given.
async fn post(client: &reqwest::Client, url: &str, body: &Value, token: Option<&str>) -> (u16, Value) {
    let mut request = client.post(url).json(body);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("POST");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// The reference guide's flags and its two `curl` commands, as written
/// (plus the bearer token the state change needs), against a frontend with
/// `--admin-on-http-port`: the flags apply, the `POST` sets, the `GET`
/// reads; without the token the `POST` is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_guides_commands_run_as_written() {
    let flags = [
        "--admission-control",
        "token-capacity",
        "--active-decode-blocks-threshold",
        "0.85",
        "--active-prefill-tokens-threshold",
        "10000",
        "--admin-on-http-port",
        "--model",
        GUIDE_MODEL,
    ];
    // A manifest's `DYN_DISABLE_FRONTEND_ADMIN_API=false` does not get in the way.
    let env = [("LOADGATE_ADMIN_TOKEN", TOKEN), ("DYN_DISABLE_FRONTEND_ADMIN_API", "false")];
    let fe = Frontend::start_with_env(&env, &flags);
    assert_eq!(fe.admin.as_deref(), Some(fe.http.as_str()), "the admin API is on the inference port");
    let url = format!("{}/busy_threshold", fe.http);
    // `curl http://localhost:8000/busy_threshold` (with the token).
    let read = |token: Option<&'static str>| {
        let mut request = fe.client.get(&url);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        request.send()
    };
    let response = read(Some(TOKEN)).await.expect("GET");
    assert_eq!(response.status(), 200);
    let all: Value = response.json().await.unwrap();
    let entry = &all["thresholds"][0];
    assert_eq!(entry["model"], GUIDE_MODEL, "{all}");
    assert_eq!(
        (entry["active_decode_blocks_threshold"].as_f64(), entry["active_prefill_tokens_threshold"].as_u64()),
        (Some(0.85), Some(10_000)),
        "the flags apply: {all}"
    );
    // The guide's POST body, byte for byte in meaning.
    let body =
        json!({"model": GUIDE_MODEL, "active_decode_blocks_threshold": 0.7, "active_prefill_tokens_threshold": 2000});
    let (status, _) = post(&fe.client, &url, &body, None).await;
    assert_eq!(status, 401, "a state change on the inference port needs the token");
    assert_eq!(read(None).await.expect("GET").status(), 401);
    let (status, reply) = post(&fe.client, &url, &body, Some(TOKEN)).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["active_decode_blocks_threshold"], 0.7, "{reply}");
    assert_eq!(reply["active_prefill_tokens_threshold"], 2000, "{reply}");
    // Inference routes still answer beside it.
    assert_eq!(fe.client.get(format!("{}/v1/models", fe.http)).send().await.unwrap().status(), 200);
}

/// Without `--admin-on-http-port`, `/busy_threshold` on the inference port
/// is a 404 that says where the admin API is (or that it is off).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_threshold_on_the_inference_port_says_where_the_admin_api_is() {
    let fe = Frontend::start(None, &[]);
    let admin = fe.admin.clone().expect("an admin listener");
    let url = format!("{}/busy_threshold", fe.http);
    let get = fe.client.get(&url).send().await.unwrap();
    assert_eq!(get.status(), 404);
    let (status, body) = post(&fe.client, &url, &json!({"model": "m"}), None).await;
    assert_eq!(status, 404);
    let message = body["error"]["message"].as_str().unwrap_or_default().to_owned();
    assert!(message.contains(&format!("{admin}/busy_threshold")), "{body}");
    assert!(message.contains("--admin-port") && message.contains("--admin-on-http-port"), "{body}");
    let get: Value = get.json().await.unwrap();
    assert_eq!(get["error"]["message"].as_str(), Some(message.as_str()), "GET and POST alike");

    let off = Frontend::start(None, &["--disable-admin-api"]);
    let (status, body) = post(&off.client, &format!("{}/busy_threshold", off.http), &json!({"model": "m"}), None).await;
    assert_eq!(status, 404);
    assert!(body["error"]["message"].as_str().unwrap_or_default().contains("--disable-admin-api"), "{body}");
}

/// `--admin-on-http-port` without a token refuses to start, saying why.
#[test]
fn the_admin_api_on_the_inference_port_needs_a_token() {
    let log = frontend_refuses(&["--admin-on-http-port"], &[]);
    assert!(log.contains("--admin-on-http-port needs an admin token"), "{log}");
    let log = frontend_refuses(&["--admin-on-http-port", "--disable-admin-api"], &[]);
    assert!(log.contains("--admin-on-http-port and --disable-admin-api contradict each other"), "{log}");
}

/// The admin API's `POST`: 415 without the JSON content type (saying how),
/// 404 for a model no worker serves (pointing to `--model NAME`), and with
/// `--model NAME` the thresholds can be set before any worker joins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_post_explains_its_refusals() {
    let fe = Frontend::start(None, &["--model", "kept"]);
    let url = format!("{}/busy_threshold", fe.admin.clone().unwrap());
    // `curl -d '...'` sends a form content type.
    let form =
        fe.client.post(&url).header("content-type", "application/x-www-form-urlencoded").body(r#"{"model":"kept"}"#);
    let response = form.send().await.unwrap();
    assert_eq!(response.status(), 415);
    let body: Value = response.json().await.unwrap();
    assert!(body["error"].as_str().unwrap_or_default().contains("Content-Type: application/json"), "{body}");
    let (status, body) =
        post(&fe.client, &url, &json!({"model": "nobody", "active_decode_blocks_threshold": 0.5}), None).await;
    assert_eq!(status, 404);
    assert!(body["error"].as_str().unwrap_or_default().contains("--model nobody"), "{body}");
    let (status, body) =
        post(&fe.client, &url, &json!({"model": "kept", "active_decode_blocks_threshold": 0.5}), None).await;
    assert_eq!((status, body["active_decode_blocks_threshold"].as_f64()), (200, Some(0.5)), "{body}");
}

/// Dynamo's `None` is off for every threshold; a bad value names the flag
/// (not a struct field), and a duration flag says its unit.
#[test]
fn thresholds_take_none_and_errors_name_the_flag() {
    let log = frontend_refuses(&["--active-decode-blocks-threshold", "85"], &[]);
    assert!(log.contains("--active-decode-blocks-threshold takes a share of the KV blocks between 0 and 1"), "{log}");
    assert!(!log.contains("active_decode_blocks_threshold"), "{log}");
    let log = frontend_refuses(&["--active-prefill-tokens-threshold-frac=-1"], &[]);
    assert!(log.contains("--active-prefill-tokens-threshold-frac takes"), "{log}");
    let log = frontend_refuses(&["--event-silence-ms", "2s"], &[]);
    assert!(log.contains("--event-silence-ms takes a whole number of milliseconds (e.g. 2000), not `2s`"), "{log}");
    let bench = std::process::Command::new(common::bin())
        .args(["bench", "--url", "http://127.0.0.1:9", "--model", "m", "--rate", "1", "--duration", "2s"])
        .output()
        .expect("run loadgate bench");
    let log = String::from_utf8_lossy(&bench.stderr);
    assert!(log.contains("--duration takes a number of seconds (e.g. 10 or 2.5), not `2s`"), "{log}");
    let log = frontend_refuses(&["--upstream-chunk-timeout-secs", "1m"], &[]);
    assert!(log.contains("--upstream-chunk-timeout-secs takes a whole number of seconds"), "{log}");
}

/// A frontend with no threshold says once, at start, that it will never
/// shed; `None` thresholds are such a frontend (and start). With a
/// threshold it says nothing of the kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frontend_that_will_never_shed_says_so_once() {
    let warning = "this frontend will never shed load";
    let flags = ["--active-decode-blocks-threshold", "None", "--active-prefill-tokens-threshold", "none"];
    let off = Frontend::start(None, &flags);
    assert!(off.proc.wait_log(warning, Duration::from_secs(5)), "{}", off.proc.stderr());
    let on = Frontend::start(None, &["--active-decode-blocks-threshold", "0.9"]);
    // Both logged their start-up before printing their listening line.
    assert_eq!(off.proc.stderr().matches(warning).count(), 1, "{}", off.proc.stderr());
    assert!(!on.proc.stderr().contains(warning), "{}", on.proc.stderr());
}

/// A flag group shared by the frontend and the worker reads each
/// command's own variable; the old shared name still works, with a
/// deprecation line.
#[test]
fn old_shared_variable_names_still_work_and_say_they_are_deprecated() {
    // 0 is out of range: the refusal shows which variable was read.
    let log = frontend_refuses(&[], &[("LOADGATE_HTTP_MAX_CONNECTIONS", "0")]);
    assert!(
        log.contains("LOADGATE_HTTP_MAX_CONNECTIONS is deprecated; use LOADGATE_FRONTEND_HTTP_MAX_CONNECTIONS"),
        "{log}"
    );
    assert!(log.contains("--http-max-connections"), "the old name's value was read: {log}");
    let log = frontend_refuses(&[], &[("LOADGATE_FRONTEND_HTTP_MAX_CONNECTIONS", "0")]);
    assert!(log.contains("--http-max-connections") && !log.contains("deprecated"), "{log}");
}

/// The overload reply's status line is `HTTP/1.1 529 Overloaded`, read
/// off the socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_529_status_line_has_a_reason_phrase() {
    let fe = Frontend::start(None, &["--active-decode-blocks-threshold", "0.5"]);
    let _busy = BusyWorker::start(fe.events, 7, "busy-model");
    // The worker's first report (90 of 100 blocks) makes it busy: wait for the 529.
    let deadline = Instant::now() + Duration::from_secs(10);
    while fe.complete("busy-model").await.0 != 529 {
        assert!(Instant::now() < deadline, "no 529");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let addr = fe.http.trim_start_matches("http://").to_owned();
    let line = tokio::task::spawn_blocking(move || {
        let mut conn = std::net::TcpStream::connect(addr).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let body = r#"{"model":"busy-model","prompt":"hi","max_tokens":1}"#;
        let head = format!(
            "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        conn.write_all(head.as_bytes()).unwrap();
        let mut reply = Vec::new();
        let _ = conn.read_to_end(&mut reply);
        String::from_utf8_lossy(&reply).lines().next().unwrap_or_default().to_owned()
    })
    .await
    .unwrap();
    assert_eq!(line, "HTTP/1.1 529 Overloaded");
}
