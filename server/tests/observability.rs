//! Observability end to end (real `loadgate` processes on 127.0.0.1): the
//! request id on every response of the inference listener, the request
//! counters and histograms of `/metrics`, and the access-log line.

mod common;

use std::time::{Duration, Instant};

use common::{BusyWorker, Frontend, Worker};
use serde_json::json;

/// The model a real worker serves.
const MODEL: &str = "obs-model";
/// The model of a fake worker that always reports itself full (529s).
const BUSY_MODEL: &str = "obs-busy";
const SETTLE: Duration = Duration::from_secs(15);

/// A frontend logging its access lines, a worker for [`MODEL`] and a busy
/// fake for [`BUSY_MODEL`], both registered, the fake busy.
async fn setup() -> (Frontend, Worker, BusyWorker) {
    let fe = Frontend::start_with_env(
        &[("RUST_LOG", "warn,loadgate::access=info")],
        &["--active-decode-blocks-threshold", "0.85"],
    );
    let worker = common::worker(Some(fe.events), MODEL, None, &[]);
    let busy = BusyWorker::start(fe.events, 77, BUSY_MODEL);
    fe.wait_workers(2, SETTLE).await;
    let deadline = Instant::now() + SETTLE;
    loop {
        let (status, _) = post(&fe, BUSY_MODEL, None).await;
        if status == 529 {
            break;
        }
        assert!(Instant::now() < deadline, "the busy fake never made {BUSY_MODEL} shed (last {status})");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (fe, worker, busy)
}

/// POSTs a small completion for `model` with an optional `x-request-id`;
/// returns the status and the response's id.
async fn post(fe: &Frontend, model: &str, id: Option<&str>) -> (u16, String) {
    let mut request = fe.client.post(format!("{}/v1/completions", fe.http)).json(&common::small_request(model));
    if let Some(id) = id {
        request = request.header("x-request-id", id);
    }
    answer(request).await
}

/// Sends `request`; its status and `x-request-id` (empty when absent). The
/// body is read to its end.
async fn answer(request: reqwest::RequestBuilder) -> (u16, String) {
    let response = request.send().await.expect("the frontend answers");
    let status = response.status().as_u16();
    let id = response.headers().get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let _ = response.bytes().await;
    (status, id)
}

fn generated(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `GET /metrics` in OpenMetrics (asked for: without `Accept` it is the
/// Prometheus text format 0.0.4).
async fn metrics(fe: &Frontend) -> String {
    let request = fe.client.get(format!("{}/metrics", fe.http)).header("accept", "application/openmetrics-text");
    let response = request.send().await.expect("GET /metrics");
    assert_eq!(response.status(), 200);
    response.text().await.expect("metrics body")
}

/// The value of the series `series` (name and labels, exactly), if present.
fn value(text: &str, series: &str) -> Option<u64> {
    text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_response_carries_a_request_id_and_an_access_line() {
    let _shared = common::shared().await;
    let (fe, _worker, _busy) = setup().await;
    let c = &fe.client;
    for (request, status) in [
        (c.post(format!("{}/v1/completions", fe.http)).json(&common::small_request(MODEL)), 200),
        (c.get(format!("{}/no/such/route", fe.http)), 404),
        (c.get(format!("{}/v1/completions", fe.http)), 405),
        (c.post(format!("{}/v1/completions", fe.http)).json(&common::small_request(BUSY_MODEL)), 529),
        (c.get(format!("{}/health", fe.http)), 200),
    ] {
        let (got, id) = answer(request).await;
        assert_eq!(got, status);
        assert!(generated(&id), "status {status}: x-request-id {id:?}");
    }
    // A well-formed id is echoed, whatever the status.
    assert_eq!(post(&fe, MODEL, Some("client-req-0001")).await, (200, "client-req-0001".to_owned()));
    assert_eq!(post(&fe, BUSY_MODEL, Some("client-req-0002")).await, (529, "client-req-0002".to_owned()));
    let (status, id) = answer(c.get(format!("{}/nothing", fe.http)).header("x-request-id", "client-req-0003")).await;
    assert_eq!((status, id.as_str()), (404, "client-req-0003"));
    // Hostile ids are replaced.
    let too_long = "a".repeat(129);
    for hostile in [too_long.as_str(), "tab\there", "has space"] {
        let (status, id) = post(&fe, MODEL, Some(hostile)).await;
        assert_eq!(status, 200);
        assert!(generated(&id), "{hostile:?} gave {id:?}");
    }
    let non_ascii = reqwest::header::HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap();
    let (_, id) = answer(c.get(format!("{}/live", fe.http)).header("x-request-id", non_ascii)).await;
    assert!(generated(&id), "{id:?}");

    // The access line of the echoed request, with every field.
    assert!(fe.proc.wait_log("request_id=client-req-0001", Duration::from_secs(5)), "no access line");
    let log = fe.proc.stderr();
    let line = log.lines().find(|l| l.contains("request_id=client-req-0001")).unwrap_or_default();
    for field in [
        "loadgate::access",
        "method=POST",
        "path=/v1/completions",
        "status=200",
        &format!("model=\"{MODEL}\""),
        "duration_ms=",
        "ttft_ms=",
        "bytes=",
        "client_gone=false",
    ] {
        assert!(line.contains(field), "{field} not in {line}");
    }
    let shed = log.lines().find(|l| l.contains("request_id=client-req-0002")).unwrap_or_default();
    assert!(shed.contains("status=529") && shed.contains(&format!("model=\"{BUSY_MODEL}\"")), "{shed}");
    let lost = log.lines().find(|l| l.contains("request_id=client-req-0003")).unwrap_or_default();
    assert!(lost.contains("status=404") && lost.contains("model=none"), "{lost}");
    let hostile = log.lines().filter(|l| l.contains("has space") || l.contains(&too_long)).count();
    assert_eq!(hostile, 0, "a replaced id reached the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_statuses_and_time_requests_with_bounded_labels() {
    let _shared = common::shared().await;
    let (fe, _worker, _busy) = setup().await;
    let before = metrics(&fe).await;
    let labels = |model: &str, request_type: &str, status: &str, error_type: &str| {
        format!(
            "dynamo_frontend_requests_total{{model=\"{model}\",endpoint=\"completions\",request_type=\"{request_type}\",status=\"{status}\",error_type=\"{error_type}\"}}"
        )
    };
    let shed_series = labels(BUSY_MODEL, "unary", "error", "overload");
    // `setup` shed some requests already: count from here.
    let shed_before = value(&before, &shed_series).unwrap_or(0);
    let shed_timed_before =
        value(&before, &format!("dynamo_frontend_request_duration_seconds_count{{model=\"{BUSY_MODEL}\"}}"))
            .unwrap_or(0);

    for _ in 0..3 {
        assert_eq!(post(&fe, MODEL, None).await.0, 200);
    }
    let stream = json!({"model": MODEL, "prompt": "hello world", "max_tokens": 4, "stream": true});
    let (status, _) = answer(fe.client.post(format!("{}/v1/completions", fe.http)).json(&stream)).await;
    assert_eq!(status, 200);
    for _ in 0..2 {
        assert_eq!(post(&fe, BUSY_MODEL, None).await.0, 529);
    }
    let mut unknown = 0;
    for i in 0..5 {
        let (status, _) = post(&fe, &format!("random-model-{i}-{}", fastrand::u64(..)), None).await;
        assert_eq!(status, 404, "an unknown model");
        unknown += 1;
    }

    let text = metrics(&fe).await;
    assert!(text.ends_with("# EOF\n") && text.matches("# EOF").count() == 1, "EOF not last once");
    assert_eq!(value(&text, &labels(MODEL, "unary", "success", "")), Some(3), "{text}");
    assert_eq!(value(&text, &labels(MODEL, "stream", "success", "")), Some(1), "{text}");
    assert_eq!(value(&text, &shed_series), Some(shed_before + 2), "{text}");
    assert_eq!(value(&text, &labels("unknown", "unary", "error", "not_found")), Some(unknown), "{text}");
    let responses = |model: &str, code: u16| {
        format!("loadgate_frontend_http_responses_total{{model=\"{model}\",endpoint=\"completions\",code=\"{code}\"}}")
    };
    assert_eq!(value(&text, &responses(MODEL, 200)), Some(4));
    assert_eq!(value(&text, &responses("unknown", 404)), Some(unknown));
    assert!(!text.contains("random-model"), "a client's model name became a label");
    let histogram =
        |name: &str, model: &str| value(&text, &format!("dynamo_frontend_{name}_count{{model=\"{model}\"}}"));
    assert_eq!(histogram("time_to_first_token_seconds", MODEL), Some(4), "{text}");
    assert_eq!(histogram("request_duration_seconds", MODEL), Some(4));
    assert_eq!(histogram("request_duration_seconds", BUSY_MODEL), Some(shed_timed_before + 2));
    assert_eq!(histogram("time_to_first_token_seconds", BUSY_MODEL), None, "no TTFT for a refusal");
    // Inter-token gaps: at most one per SSE event after the first (4 tokens
    // and the final chunk; events that arrive in one frame count no gap).
    assert!(text.contains("# TYPE dynamo_frontend_inter_token_latency_seconds histogram"));
    assert!(histogram("inter_token_latency_seconds", MODEL).unwrap_or(0) <= 6, "{text}");
    let bucket = format!("dynamo_frontend_time_to_first_token_seconds_bucket{{le=\"+Inf\",model=\"{MODEL}\"}}");
    assert_eq!(value(&text, &bucket), Some(4));

    // Every request ended: no LLM request in flight.
    for model in [MODEL, BUSY_MODEL, "unknown", "none"] {
        let series = format!("dynamo_frontend_inflight_requests{{model=\"{model}\"}}");
        assert_eq!(value(&text, &series), Some(0), "{series}");
    }

    // A client that leaves mid-stream: counted as cancelled, logged as gone.
    let long = json!({"model": MODEL, "prompt": "hello world", "max_tokens": 500, "stream": true});
    let mut response = fe
        .client
        .post(format!("{}/v1/completions", fe.http))
        .header("x-request-id", "leaves-early")
        .json(&long)
        .send()
        .await
        .expect("the stream starts");
    assert_eq!(response.status(), 200);
    let first = tokio::time::timeout(SETTLE, response.chunk()).await.expect("a first chunk in time");
    assert!(first.expect("a chunk").is_some());
    drop(response);
    assert!(fe.proc.wait_log("request_id=leaves-early", SETTLE), "no access line for the cancelled stream");
    let line = fe.proc.stderr().lines().find(|l| l.contains("request_id=leaves-early")).unwrap_or_default().to_owned();
    assert!(line.contains("client_gone=true") && line.contains("status=200"), "{line}");
    let text = metrics(&fe).await;
    let cancelled = format!(
        "dynamo_frontend_model_cancellation_total{{model=\"{MODEL}\",endpoint=\"completions\",request_type=\"stream\"}}"
    );
    assert_eq!(value(&text, &cancelled), Some(1), "{text}");
    assert_eq!(value(&text, &labels(MODEL, "stream", "error", "cancelled")), Some(1));
    assert_eq!(value(&text, &format!("dynamo_frontend_inflight_requests{{model=\"{MODEL}\"}}")), Some(0));

    // A scrape does not add series: the same request families, again.
    let again = metrics(&fe).await;
    let families = |t: &str| t.lines().filter(|l| l.starts_with("dynamo_frontend_requests_total")).count();
    assert_eq!(families(&text), families(&again));
}

/// Found by a review: the access line wrote the request's path as it came,
/// while every other client-chosen string in it is escaped (`model` is
/// quoted, a hostile `x-request-id` is replaced). A path may hold any
/// non-ASCII bytes: U+0085 (NEL) and U+2028 (LINE SEPARATOR) are line ends
/// to Unicode-aware readers of the log (Python's `splitlines`, many log
/// viewers), so one request made two lines, the second written by the
/// client; U+202E reorders what an operator reads. Now the path's bytes
/// outside printable ASCII are logged percent-encoded, as in a URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_path_cannot_split_or_forge_the_access_line() {
    use std::io::{Read as _, Write as _};
    let _shared = common::shared().await;
    // No worker needed: a route that does not exist answers 404 and is logged.
    let fe = Frontend::start_with_env(&[("RUST_LOG", "warn,loadgate::access=info")], &[]);
    let addr = fe.http.trim_start_matches("http://").to_owned();
    let path: &[u8] = b"/x\xc2\x85forged=1\xe2\x80\xa8status=200\xe2\x80\xaeevil\"q";
    let mut request = b"GET ".to_vec();
    request.extend_from_slice(path);
    request.extend_from_slice(
        b" HTTP/1.1\r\nHost: 127.0.0.1\r\nx-request-id: hostile-path-0001\r\nConnection: close\r\n\r\n",
    );
    let mut tcp = std::net::TcpStream::connect(&addr).expect("connect to the inference port");
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    tcp.write_all(&request).unwrap();
    let mut answer = Vec::new();
    let _ = tcp.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer).into_owned();
    assert!(answer.starts_with("HTTP/1.1 404"), "the path is a valid request target: {answer:?}");
    assert!(fe.proc.wait_log("request_id=hostile-path-0001", SETTLE), "no access line");
    let log = fe.proc.stderr();
    let line = log.lines().find(|l| l.contains("request_id=hostile-path-0001")).unwrap_or_default().to_owned();
    for end in ['\u{85}', '\u{2028}', '\u{2029}', '\u{202e}'] {
        assert!(!log.contains(end), "the client's {end:?} reached the log: {line:?}");
    }
    assert!(
        line.contains("path=/x%C2%85forged=1%E2%80%A8status=200%E2%80%AEevil%22q "),
        "the path is not logged percent-encoded: {line:?}"
    );
    assert!(line.contains("status=404"), "{line}");
}
