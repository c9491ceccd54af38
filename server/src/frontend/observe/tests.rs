//! The layer in-process: ids, metrics and the access-log line.

use std::io::Write;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Extension;
use clap::Parser as _;
use tower::ServiceExt as _;

use super::*;
use crate::directory::WorkerDirectory;
use crate::frontend::Args;
use loadgate::{MonitorConfig, WorkerMonitor};

#[derive(clap::Parser)]
struct Cli {
    #[command(flatten)]
    args: Args,
}

fn frontend(flags: &[&str]) -> Arc<Frontend> {
    let cli = Cli::parse_from(std::iter::once("frontend").chain(flags.iter().copied()));
    let monitor = Arc::new(WorkerMonitor::new(MonitorConfig::default()).unwrap());
    let directory = Arc::new(WorkerDirectory::new(monitor.clone()));
    Arc::new(Frontend::new(&cli.args, monitor, directory, None).unwrap())
}

/// A stand-in for the proxy: answers `POST /v1/completions` with 200 (an
/// SSE stream when the body says `stream`), labelled with the request's
/// model, echoing the request id it saw.
async fn fake_completion(
    Extension(id): Extension<RequestId>,
    Extension(labels): Extension<Labels>,
    headers: HeaderMap,
    body: String,
) -> Response {
    assert_eq!(headers.get(REQUEST_ID_HEADER), Some(id.header_value()), "the header is the id");
    let model = if body.contains("other") { "other-model" } else { "m" };
    labels.set_request(model, loadgate::Class::Standard);
    let mut response = if body.contains("stream") {
        let chunks = ["data: {\"a\":1}\n\n", "data: {\"a\":2}\n\n", "data: [DONE]\n\n"];
        let stream = futures_util::stream::iter(chunks.map(Ok::<_, std::io::Error>));
        ([(header::CONTENT_TYPE, "text/event-stream")], Body::from_stream(stream)).into_response()
    } else {
        r#"{"choices":[]}"#.into_response()
    };
    response.headers_mut().insert("x-seen-id", HeaderValue::from_str(id.as_str()).unwrap());
    response
}

/// The real routes of the listener, with the fake completion route.
fn app(frontend: &Arc<Frontend>) -> axum::Router {
    let routes = axum::Router::new()
        .route("/v1/completions", post(fake_completion))
        .route("/v1/chat/completions", post(std::future::pending::<Response>))
        .route("/health", get(crate::frontend::admin::health))
        .route("/metrics", get(crate::frontend::admin::metrics))
        .fallback(crate::frontend::reply::no_route)
        .method_not_allowed_fallback(crate::frontend::reply::method_not_allowed)
        .with_state(frontend.clone());
    layer(routes, frontend.clone())
}

async fn send(app: &axum::Router, request: Request<Body>) -> (StatusCode, String, Vec<u8>) {
    let response = app.clone().oneshot(request).await.unwrap();
    let id = response.headers().get(REQUEST_ID_HEADER).expect("x-request-id").to_str().unwrap().to_owned();
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
    (status, id, body.to_vec())
}

fn get_req(path: &str) -> Request<Body> {
    Request::get(path).body(Body::empty()).unwrap()
}

fn completion(body: &str) -> Request<Body> {
    Request::post("/v1/completions").body(Body::from(body.to_owned())).unwrap()
}

#[tokio::test]
async fn every_response_has_an_id_and_a_good_incoming_one_is_kept() {
    let frontend = frontend(&[]);
    let app = app(&frontend);
    for (request, status) in [
        (get_req("/health"), StatusCode::SERVICE_UNAVAILABLE),
        (get_req("/nothing"), StatusCode::NOT_FOUND),
        (get_req("/v1/completions"), StatusCode::METHOD_NOT_ALLOWED),
        (completion("{}"), StatusCode::OK),
    ] {
        let (got, id, _) = send(&app, request).await;
        assert_eq!(got, status);
        assert_eq!(id.len(), 32, "{id}");
    }
    let mut request = completion("{}");
    request.headers_mut().insert(REQUEST_ID_HEADER, HeaderValue::from_static("client-id-1"));
    let response = app.clone().oneshot(request).await.unwrap();
    assert_eq!(response.headers()[REQUEST_ID_HEADER], "client-id-1");
    assert_eq!(response.headers()["x-seen-id"], "client-id-1", "the handler sees the same id");
    let mut request = get_req("/nothing");
    request.headers_mut().insert(REQUEST_ID_HEADER, HeaderValue::from_static("has space"));
    let (_, id, _) = send(&app, request).await;
    assert_ne!(id, "has space");
}

#[tokio::test]
async fn health_says_draining_after_sigterm() {
    let frontend = frontend(&[]);
    frontend.monitor.register(1, "m", 1, 0).unwrap();
    let app = app(&frontend);
    let (status, _, body) = send(&app, get_req("/health")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, br#"{"live_workers":1,"status":"healthy","workers":1}"#);
    frontend.start_draining();
    let (status, _, body) = send(&app, get_req("/health")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body, br#"{"live_workers":1,"status":"draining","workers":1}"#);
}

fn metric(text: &str, series: &str) -> Option<u64> {
    text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test]
async fn metrics_count_per_status_and_time_known_models_only() {
    let frontend = frontend(&[]);
    frontend.monitor.add_model("m");
    let app = app(&frontend);
    for _ in 0..3 {
        assert_eq!(send(&app, completion("{}")).await.0, StatusCode::OK);
    }
    let (status, _, body) = send(&app, completion("stream")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.ends_with(b"data: [DONE]\n\n"));
    assert_eq!(send(&app, completion("other")).await.0, StatusCode::OK);
    assert_eq!(send(&app, get_req("/nothing")).await.0, StatusCode::NOT_FOUND);
    // A client that goes away mid-stream: the body is dropped unread; in
    // flight until then.
    let held = app.clone().oneshot(completion("stream")).await.unwrap();
    let (_, _, text) = send(&app, get_req("/metrics")).await;
    let text = String::from_utf8(text).unwrap();
    assert_eq!(metric(&text, r#"dynamo_frontend_inflight_requests{model="m"}"#), Some(1), "{text}");
    drop(held);
    let (_, _, text) = send(&app, get_req("/metrics")).await;
    let text = String::from_utf8(text).unwrap();
    // No `Accept`: the Prometheus text format (no `# EOF`, counters typed by their `_total` name).
    assert!(!text.contains("# EOF") && text.contains("# TYPE dynamo_frontend_requests_total counter"), "{text}");
    let ok = r#"endpoint="completions",request_type="unary",status="success",error_type="""#;
    assert_eq!(metric(&text, &format!("dynamo_frontend_requests_total{{model=\"m\",{ok}}}")), Some(3), "{text}");
    let ok_stream = r#"endpoint="completions",request_type="stream",status="success",error_type="""#;
    assert_eq!(metric(&text, &format!("dynamo_frontend_requests_total{{model=\"m\",{ok_stream}}}")), Some(1));
    let gone = r#"endpoint="completions",request_type="stream",status="error",error_type="cancelled""#;
    assert_eq!(metric(&text, &format!("dynamo_frontend_requests_total{{model=\"m\",{gone}}}")), Some(1));
    assert_eq!(metric(&text, &format!("dynamo_frontend_requests_total{{model=\"unknown\",{ok}}}")), Some(1));
    assert!(!text.contains("other-model"), "an unknown model gets no label of its own");
    let responses = "loadgate_frontend_http_responses_total";
    assert_eq!(metric(&text, &format!(r#"{responses}{{model="m",endpoint="completions",code="200"}}"#)), Some(5));
    assert_eq!(metric(&text, &format!(r#"{responses}{{model="none",endpoint="other",code="404"}}"#)), Some(1));
    // TTFT for every 2xx LLM response with a body frame (the dropped one
    // was never polled); duration for every LLM request.
    assert_eq!(metric(&text, r#"dynamo_frontend_time_to_first_token_seconds_count{model="m"}"#), Some(4));
    assert_eq!(metric(&text, r#"dynamo_frontend_request_duration_seconds_count{model="m"}"#), Some(5));
    assert_eq!(metric(&text, r#"dynamo_frontend_request_duration_seconds_count{model="unknown"}"#), Some(1));
    // Every request ended: the gauges are back to 0.
    assert_eq!(metric(&text, r#"dynamo_frontend_inflight_requests{model="m"}"#), Some(0), "{text}");
    assert_eq!(metric(&text, r#"dynamo_frontend_inflight_requests{model="unknown"}"#), Some(0));
    assert_eq!(metric(&text, r#"dynamo_frontend_inflight_requests{model="none"}"#), Some(0));
    // One stream with two token events: one gap between them.
    assert_eq!(metric(&text, r#"dynamo_frontend_inter_token_latency_seconds_count{model="m"}"#), Some(1), "{text}");
}

/// A `MakeWriter` into a shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

#[tokio::test]
async fn one_access_line_per_request() {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(captured.clone())
        .with_env_filter(tracing_subscriber::EnvFilter::new("warn,loadgate::access=info"))
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    // With a single dispatcher registered, tracing computes a callsite's
    // interest from the dispatcher of whichever thread reaches it first (an
    // other test's thread: none, so never). A second live dispatcher makes
    // it ask every registered one, this test's included.
    let _second = tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default());
    tracing::callsite::rebuild_interest_cache();
    let frontend = frontend(&[]);
    frontend.monitor.add_model("m");
    let app = app(&frontend);
    let mut request = completion("{}");
    request.headers_mut().insert(REQUEST_ID_HEADER, HeaderValue::from_static("log-me"));
    send(&app, request).await;
    send(&app, get_req("/nothing")).await;
    drop(app.clone().oneshot(completion("stream")).await.unwrap());
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    let first = lines[0];
    for field in [
        "loadgate::access",
        "request_id=log-me",
        "method=POST",
        "path=/v1/completions",
        "status=200",
        "model=\"m\"",
        "bytes=14",
        "client_gone=false",
    ] {
        assert!(first.contains(field), "{field} not in {first}");
    }
    assert!(first.contains("duration_ms=") && first.contains("ttft_ms="), "{first}");
    assert!(lines[1].contains("status=404") && lines[1].contains("model=none"), "{}", lines[1]);
    assert!(lines[2].contains("client_gone=true") && lines[2].contains("ttft_ms=none"), "{}", lines[2]);
}

#[tokio::test]
async fn a_request_dropped_before_its_response_is_counted_as_cancelled() {
    let frontend = frontend(&[]);
    let app = app(&frontend);
    let request = Request::post("/v1/chat/completions").body(Body::from("{}")).unwrap();
    let never = tokio::time::timeout(std::time::Duration::from_millis(20), app.clone().oneshot(request)).await;
    assert!(never.is_err(), "the handler never answers");
    let (_, _, text) = send(&app, get_req("/metrics")).await;
    let text = String::from_utf8(text).unwrap();
    let gone = r#"model="none",endpoint="chat_completions",request_type="unary",status="error",error_type="cancelled""#;
    assert_eq!(metric(&text, &format!("dynamo_frontend_requests_total{{{gone}}}")), Some(1), "{text}");
    assert_eq!(metric(&text, r#"dynamo_frontend_inflight_requests{model="none"}"#), Some(0));
    assert!(!text.contains("code=\"0\""), "no response, no status: {text}");
}
