//! The tower and axum integrations: [`AdmissionLayer`] holds its permit
//! until the response body ends (not at the headers), refuses past `N + Q`
//! with the caller's `Retry-After`; the rejection types answer with their
//! status and OpenAI-shaped body; no root name collides with axum's or
//! tower's under glob imports; `Routed` counts its overloads.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::IntoResponse;
use axum::routing::get;
use bytes::Bytes;
use http_body_util::BodyExt;
use loadgate::{Admission, AdmissionLayer, MigrationError, PermitBody, Rejection, RetryAfter, RouteError};
use tokio::sync::mpsc;
use tower::ServiceExt;

type Chunks = Arc<std::sync::Mutex<Option<mpsc::Receiver<Result<Bytes, Infallible>>>>>;

/// A service whose one route streams what the test sends on the channel
/// handed to it per request, behind `gate`.
fn service(gate: Arc<Admission<()>>, hint: RetryAfter, chunks: Chunks) -> axum::Router {
    let stream = move || {
        let rx = chunks.lock().unwrap().take().expect("one streamed request at a time");
        async move { Body::from_stream(tokio_stream_from(rx)) }
    };
    axum::Router::new().route("/generate", get(stream)).layer(AdmissionLayer::new(gate).retry_after(hint))
}

/// The receiver as a `Stream` (tokio's own wrapper lives in tokio-stream).
fn tokio_stream_from(
    mut rx: mpsc::Receiver<Result<Bytes, Infallible>>,
) -> impl futures_util::Stream<Item = Result<Bytes, Infallible>> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

fn request() -> axum::http::Request<Body> {
    axum::http::Request::get("/generate").body(Body::empty()).unwrap()
}

#[tokio::test]
async fn the_layer_holds_the_permit_until_the_body_ends() {
    let gate = Admission::new(1, 2).unwrap();
    let chunks: Chunks = Arc::default();
    let app = service(gate.clone(), RetryAfter::fixed(Duration::from_secs(1)), chunks.clone());

    let (tx, rx) = mpsc::channel(4);
    *chunks.lock().unwrap() = Some(rx);
    let response = app.clone().oneshot(request()).await.unwrap();
    assert_eq!(response.status(), 200);
    // The handler has returned and the headers are out; the body has not
    // ended, so the slot is still held (tower's ConcurrencyLimit would have
    // released it here).
    assert_eq!(gate.running(), 1);
    let mut body = response.into_body();
    tx.send(Ok(Bytes::from_static(b"token"))).await.unwrap();
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), "token");
    assert_eq!(gate.running(), 1);
    drop(tx); // the stream ends
    assert!(body.frame().await.is_none());
    assert_eq!(gate.running(), 0, "the body's end releases the slot");

    // A client that goes away mid-stream releases it too.
    let (tx, rx) = mpsc::channel(4);
    *chunks.lock().unwrap() = Some(rx);
    let response = app.oneshot(request()).await.unwrap();
    assert_eq!(gate.running(), 1);
    drop(response);
    assert_eq!(gate.running(), 0, "dropping the body releases the slot");
    drop(tx);
}

#[tokio::test]
async fn past_n_plus_q_the_layer_refuses_with_the_callers_hint() {
    let gate = Admission::new(1, 2).unwrap();
    let asked = Arc::new(AtomicU64::new(0));
    let hint = {
        let asked = asked.clone();
        // A hint computed per refusal: 1.5 s, then 2.5 s, ...
        RetryAfter::from_fn(move || Duration::from_millis(1500 + 1000 * asked.fetch_add(1, Ordering::Relaxed)))
    };
    let chunks: Chunks = Arc::default();
    let app = service(gate.clone(), hint, chunks.clone());

    let (tx, rx) = mpsc::channel(4);
    *chunks.lock().unwrap() = Some(rx);
    let running = app.clone().oneshot(request()).await.unwrap();
    // Two more wait in the gate (their futures are pending inside the layer).
    let mut waiting: Vec<_> = (0..2).map(|_| tokio::spawn(app.clone().oneshot(request()))).collect();
    while gate.queued() < 2 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    for expected in ["2", "3"] {
        let refused = app.clone().oneshot(request()).await.unwrap();
        assert_eq!(refused.status(), 529);
        assert_eq!(refused.headers()["retry-after"], expected);
        assert_eq!(refused.headers()["content-type"], "application/json");
        let body = refused.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(
            body,
            r#"{"error":{"message":"Server overloaded: worker at capacity","type":"Overloaded","param":null,"code":529}}"#
        );
    }
    assert_eq!((gate.running(), gate.queued(), gate.rejected()), (1, 2, 2));
    // A waiter whose client gives up leaves the queue at once.
    let gone = waiting.pop().unwrap();
    gone.abort();
    assert!(gone.await.unwrap_err().is_cancelled());
    assert_eq!(gate.queued(), 1);
    drop((running, tx));
}

#[tokio::test]
async fn a_body_error_releases_the_permit() {
    let gate = Admission::new(1, 2).unwrap();
    let Ok(loadgate::Admitted::Now((), permit)) = gate.try_admit(()) else { panic!("a slot was free") };
    let frames =
        futures_util::stream::iter([Ok(Bytes::from_static(b"token")), Err(std::io::Error::other("engine failed"))]);
    let mut body = PermitBody::new(Body::from_stream(frames), permit);
    assert!(body.frame().await.unwrap().is_ok());
    assert_eq!(gate.running(), 1);
    assert!(body.frame().await.unwrap().is_err());
    assert_eq!(gate.running(), 0, "released at the error, not at the drop");
    assert!(!body.holds_permit());
}

#[tokio::test]
async fn rejection_types_answer_with_status_and_openai_body() {
    let cases = [
        (RouteError::Overloaded.into_response(), 529, "Overloaded"),
        (RouteError::Unavailable.into_response(), 503, "Unavailable"),
        (RouteError::UnknownModel.into_response(), 404, "invalid_request_error"),
        (Rejection::WorkerOverloaded.into_response(), 529, "Overloaded"),
        (MigrationError::Exhausted.into_response(), 529, "Overloaded"),
        (MigrationError::Route(RouteError::UnknownModel).into_response(), 404, "invalid_request_error"),
    ];
    for (response, status, kind) in cases {
        assert_eq!(response.status(), status);
        if status == 404 {
            assert!(!response.headers().contains_key("retry-after"), "no hint for an unknown model");
        } else {
            // No hint was given: the default one, 1 s to 2 s.
            let ms: u64 = response.headers()["retry-after-ms"].to_str().unwrap().parse().unwrap();
            assert!((1000..=2000).contains(&ms), "{ms}");
        }
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["error"]["type"], kind);
        assert_eq!(json["error"]["code"], status);
    }
}

/// A layer given no hint refuses with the default one; a computed hint
/// asks its `RetryHint` with the caller's in-flight count at each refusal.
#[tokio::test]
async fn hints_default_and_computed() {
    use loadgate::retry_hint::{RetryHint, MIN_RETRY_AFTER};

    let gate = Admission::new(1, 2).unwrap();
    let app = axum::Router::new().route("/generate", get(|| async { "ok" })).layer(AdmissionLayer::new(gate.clone()));
    let Ok(loadgate::Admitted::Now((), held)) = gate.try_admit(()) else { panic!("a slot was free") };
    let waiting: Vec<_> = (0..2).map(|_| tokio::spawn(app.clone().oneshot(request()))).collect();
    while gate.queued() < 2 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let refused = app.oneshot(request()).await.unwrap();
    assert_eq!(refused.status(), 529);
    let ms: u64 = refused.headers()["retry-after-ms"].to_str().unwrap().parse().unwrap();
    assert!((1000..=2000).contains(&ms), "the default hint: {ms} ms");
    drop(held);
    for waiter in waiting {
        assert_eq!(waiter.await.unwrap().unwrap().status(), 200);
    }

    let hint = Arc::new(RetryHint::computed());
    hint.finished(Duration::from_millis(100));
    let in_flight = Arc::new(AtomicU64::new(10));
    let computed = RetryAfter::computed(hint.clone(), {
        let in_flight = in_flight.clone();
        move || in_flight.load(Ordering::Relaxed)
    });
    // 10 in flight at 100 ms: 10 ms slots after the 1 s floor, one per refusal.
    // Compared as due times (when each refused client comes back), which a
    // pause between two refusals does not move.
    let start = std::time::Instant::now();
    let (due, burst): (Vec<Duration>, Vec<Duration>) = (0..50)
        .map(|_| {
            let asked = start.elapsed();
            let hint = computed.get();
            (asked + hint, hint)
        })
        .unzip();
    assert!(burst.iter().all(|h| *h >= MIN_RETRY_AFTER), "{burst:?}");
    assert!(due[49] > due[0] + Duration::from_millis(400), "spread over the slots: {burst:?}");
    assert!(burst[49] < MIN_RETRY_AFTER + Duration::from_millis(520), "{burst:?}");
    assert!(RetryAfter::default().get() >= MIN_RETRY_AFTER);
}

/// `loadgate::web::metrics` serves the state's `Exposition` in the format
/// each scraper asks for, with the embedder's own families beside loadgate's.
#[tokio::test]
async fn the_metrics_handler_answers_each_scraper_in_its_format() {
    use loadgate::metrics::{Endpoint, RejectionMetrics};
    use loadgate::{Exposition, MonitorConfig, Registration, WorkerMonitor};
    use prometheus_client::metrics::counter::Counter;

    let monitor = Arc::new(WorkerMonitor::new(MonitorConfig::default()).unwrap());
    monitor.register_worker(Registration::new(3, "llama").dp_size(2)).unwrap();
    let load = loadgate::RankLoad { active_decode_blocks: 5, kv_total_blocks: 8, ..Default::default() };
    monitor.reporter(3).unwrap().report_rank(1, load).unwrap();
    let rejections = Arc::new(RejectionMetrics::default());
    rejections.record("llama", Endpoint::Completions, []);
    let mut registry = prometheus_client::registry::Registry::default();
    let requests = Counter::<u64>::default();
    requests.inc();
    registry.register("app_requests", "Requests served", requests);
    rejections.register(&mut registry, monitor.clone());
    let app = axum::Router::new().route("/metrics", get(loadgate::web::metrics)).with_state(Exposition::new(registry));
    let scrape = |accept: Option<&'static str>| {
        let mut request = axum::http::Request::get("/metrics");
        if let Some(accept) = accept {
            request = request.header("accept", accept);
        }
        let app = app.clone();
        async move {
            let response = app.oneshot(request.body(Body::empty()).unwrap()).await.unwrap();
            assert_eq!(response.status(), axum::http::StatusCode::OK);
            assert_eq!(response.headers()["vary"], "Accept");
            let content_type = response.headers()["content-type"].to_str().unwrap().to_owned();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (content_type, String::from_utf8(body.to_vec()).unwrap())
        }
    };
    let lines = [
        "app_requests_total 1",
        r#"dynamo_frontend_model_rejection_total{model="llama",endpoint="completions"} 1"#,
        r#"dynamo_frontend_worker_active_decode_blocks{worker_id="3",dp_rank="1"} 5"#,
    ];
    for accept in [None, Some("text/plain"), Some("*/*")] {
        let (content_type, text) = scrape(accept).await;
        assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8", "{accept:?}");
        assert!(text.contains("# TYPE app_requests_total counter\n") && !text.contains("# EOF"), "{text}");
        assert!(lines.iter().all(|line| text.lines().any(|l| l == *line)), "{text}");
    }
    let (content_type, text) = scrape(Some("application/openmetrics-text;version=1.0.0;q=0.9,*/*;q=0.1")).await;
    assert_eq!(content_type, "application/openmetrics-text; version=1.0.0; charset=utf-8");
    assert!(text.contains("# TYPE app_requests counter\n") && text.ends_with("# EOF\n"), "{text}");
    assert!(lines.iter().all(|line| text.lines().any(|l| l == *line)), "{text}");

    // The frontend's families alone, from the same `Arc`s.
    let alone = Exposition::frontend(rejections, monitor);
    assert!(!alone.render(loadgate::metrics::MetricsFormat::Prometheus).contains("app_requests"));
    assert!(alone.render(loadgate::metrics::MetricsFormat::OpenMetrics).contains(lines[1]));
}

/// The state a `Routed` handler needs.
#[derive(Clone, axum::extract::FromRef)]
struct RoutedApp {
    router: loadgate::WorkerRouter,
    retry_after: RetryAfter,
}

/// "llama" on workers 1 and 2, both full (every request to it is shed),
/// "empty" without a worker.
fn overloaded_app() -> RoutedApp {
    use loadgate::{BusyThresholds, LoadReport, MonitorConfig, Policy, RankLoad, WorkerMonitor, WorkerRouter};
    let monitor = Arc::new(WorkerMonitor::new(MonitorConfig::default()).unwrap());
    let busy = BusyThresholds { active_decode_blocks_threshold: Some(0.85), ..Default::default() };
    for worker in [1, 2] {
        monitor.register(worker, "llama", 1, 7).unwrap();
    }
    monitor.set_thresholds("llama", busy).unwrap();
    for worker in [1, 2] {
        let full = RankLoad { active_decode_blocks: 90, kv_total_blocks: 100, ..Default::default() };
        monitor.apply(&LoadReport { worker, incarnation: 7, seq: 1, load: full, ..Default::default() }).unwrap();
    }
    monitor.add_model("empty");
    RoutedApp {
        router: WorkerRouter::new(monitor, Policy::RoundRobin),
        retry_after: RetryAfter::fixed(Duration::from_secs(1)),
    }
}

/// Routes `/v1/completions`, `/v1/chat/completions` and `/generate` through
/// `Routed`.
fn routed_service(app: RoutedApp) -> axum::Router<()> {
    async fn handler(to: loadgate::Routed) -> String {
        format!("worker {}", to.worker)
    }
    axum::Router::new()
        .route("/v1/completions", axum::routing::post(handler))
        .route("/v1/chat/completions", axum::routing::post(handler))
        .route("/generate", axum::routing::post(handler))
        .with_state(app)
}

async fn post(app: &axum::Router<()>, path: &str, body: serde_json::Value) -> u16 {
    let request = axum::http::Request::post(path).body(Body::from(body.to_string())).unwrap();
    app.clone().oneshot(request).await.unwrap().status().as_u16()
}

/// `Routed` counts each overload it answers in the `RejectionMetrics` of
/// the request's extensions, by endpoint and busy signal, as the frontend
/// does; 503 and 404 are not counted, and without the extension nothing is.
#[tokio::test]
async fn routed_counts_its_overloads_in_the_extensions_rejection_metrics() {
    use loadgate::metrics::{Endpoint, Reason, RejectionMetrics};
    use serde_json::json;

    let app = overloaded_app();
    let metrics = Arc::new(RejectionMetrics::default());
    let counted = routed_service(app.clone()).layer(axum::Extension(metrics.clone()));
    let chat = json!({"model": "llama", "messages": []});
    let completion = json!({"model": "llama", "prompt": "hi"});
    assert_eq!(post(&counted, "/v1/chat/completions", chat.clone()).await, 529);
    assert_eq!(post(&counted, "/v1/completions", completion.clone()).await, 529);
    assert_eq!(post(&counted, "/v1/completions", completion.clone()).await, 529);
    // Another path: the body tells the endpoint.
    assert_eq!(post(&counted, "/generate", chat.clone()).await, 529);
    assert_eq!(post(&counted, "/generate", completion.clone()).await, 529);
    assert_eq!(metrics.total("llama", Endpoint::ChatCompletions), 2);
    assert_eq!(metrics.total("llama", Endpoint::Completions), 3);
    assert_eq!(metrics.by_reason("llama", Reason::DecodeBlocks), 5);
    assert_eq!(metrics.by_reason("llama", Reason::WaitingRequests), 0);

    // Not load: no worker (503), an unknown model (404), a bad body (400).
    assert_eq!(post(&counted, "/v1/completions", json!({"model": "empty"})).await, 503);
    assert_eq!(post(&counted, "/v1/completions", json!({"model": "gpt-9"})).await, 404);
    assert_eq!(post(&counted, "/v1/completions", json!({})).await, 400);
    // Their bodies are the `loadgate` binary's, byte for byte.
    for (body, expected) in [
        (json!({"model": "gpt-\"9\""}), loadgate::openai_error::unknown_model(Some("gpt-\"9\""))),
        (json!({"model": ""}), loadgate::openai_error::invalid_model()),
    ] {
        let request = axum::http::Request::post("/v1/completions").body(Body::from(body.to_string())).unwrap();
        let response = counted.clone().oneshot(request).await.unwrap();
        assert_eq!(response.into_body().collect().await.unwrap().to_bytes(), expected);
    }
    assert_eq!(metrics.total("empty", Endpoint::Completions) + metrics.total("gpt-9", Endpoint::Completions), 0);

    // The exposition a `/metrics` handler writes from the same `Arc`.
    let text = metrics.render_frontend(app.router.monitor());
    for line in [
        r#"dynamo_frontend_model_rejection_total{model="llama",endpoint="completions"} 3"#,
        r#"dynamo_frontend_model_rejection_total{model="llama",endpoint="chat_completions"} 2"#,
        r#"loadgate_frontend_rejection_reason_total{model="llama",reason="decode_blocks"} 5"#,
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }

    // Without the extension `Routed` still sheds, and counts nowhere.
    let uncounted = routed_service(app.clone());
    assert_eq!(post(&uncounted, "/v1/completions", completion.clone()).await, 529);
    assert_eq!(metrics.total("llama", Endpoint::Completions), 3);

    // A worker frees up: served, not counted.
    let free = loadgate::RankLoad { active_decode_blocks: 10, kv_total_blocks: 100, ..Default::default() };
    let report = loadgate::LoadReport { worker: 2, incarnation: 7, seq: 2, load: free, ..Default::default() };
    app.router.monitor().apply(&report).unwrap();
    assert_eq!(post(&counted, "/v1/completions", completion).await, 200);
    assert_eq!(metrics.total("llama", Endpoint::Completions), 3);
}

/// Every root name, used next to axum's and tower's globs: a collision would
/// be an ambiguity error here.
#[allow(unused_imports, dead_code)]
mod globs {
    use axum::*;
    use loadgate::*;
    use tower::*;

    type Types = (
        Admission<()>,
        Admitted<()>,
        Permit<()>,
        PermitStream<(), ()>,
        Rejected<()>,
        RetryPolicy,
        LoadReport,
        RankLoad,
        WorkerId,
        Migration,
        MigrationError,
        MonitorConfig,
        WorkerMonitor,
        Rejection,
        (LocalRouter, ModelRouter, Policy, RouteError, WorkerRouter, BusyThresholds),
        (Routed, AdmissionLayer, PermitBody<(), ()>, Refusal, RetryAfter),
        (Registration<'static>, Reporter, Exposition),
    );
    type Modules = (
        admission::Admit<()>,
        backoff::Verdict,
        metrics::RejectionMetrics,
        migration::Migration,
        monitor::Registered,
        retry_hint::RetryHint,
        web::Scrape,
        patch::ThresholdPatch,
        rejection::Rejection,
        route::CostFn,
        thresholds::Thresholds,
        web::GateBody<()>,
        wire::Frame,
    );
    // And axum's and tower's own names still mean theirs.
    type Theirs = (Router, Json<()>, ServiceBuilder<layer::util::Identity>);
    const DOCS: () = {
        use docs::architecture as _;
        use openai_error::body as _;
        use web::metrics as _;
    };
}
