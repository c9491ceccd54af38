//! The frontend's read-only service routes on the inference port:
//! `GET /v1/models`, `/v1/models/{id}`, `/live`, `/health` and `/metrics`
//! (`/busy_threshold` is on the admin listener, `threshold_api.rs`).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use loadgate::metrics::MetricsFormat;
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use serde_json::{json, Value};

use crate::directory::WorkerDirectory;
use crate::events::PlaneStats;
use crate::frontend::observe::RequestMetrics;
use crate::frontend::reply;
use crate::frontend::state::Frontend;

/// One entry of `/v1/models`, in OpenAI's shape.
fn model_object(frontend: &Frontend, id: &str) -> Value {
    json!({"id": id, "object": "model", "created": frontend.started_unix_s, "owned_by": "loadgate"})
}

/// `GET /v1/models`: every model the frontend knows (served by a
/// registered worker, or kept).
pub async fn models(State(frontend): State<Arc<Frontend>>) -> Json<Value> {
    let data: Vec<Value> = frontend.monitor.models().iter().map(|id| model_object(&frontend, id)).collect();
    Json(json!({"object": "list", "data": data}))
}

/// `GET /v1/models/{id}`: one model, or 404 in OpenAI's shape. The id may
/// hold slashes (an engine may name a model by its file path).
pub async fn model(State(frontend): State<Arc<Frontend>>, Path(id): Path<String>) -> Response {
    if frontend.monitor.has_model(&id) {
        Json(model_object(&frontend, &id)).into_response()
    } else {
        reply::unknown_model(&id)
    }
}

/// `GET /live`: 200 while the process runs (liveness, not readiness).
pub async fn live() -> Json<Value> {
    Json(json!({"status": "live"}))
}

/// `GET /health` (readiness): 503 `draining` once the frontend is shutting
/// down (SIGTERM), else 200 `healthy` while some registered worker is in
/// routing (not silent, not quarantined) and 503 `unhealthy` without one (a
/// frontend with no live worker can serve nothing); with the counts of
/// registered and of live workers either way.
pub async fn health(State(frontend): State<Arc<Frontend>>) -> Response {
    let workers = frontend.monitor.workers().len();
    let live = workers.saturating_sub(frontend.directory.out_of_routing().len());
    let (status, word) = if frontend.draining() {
        (StatusCode::SERVICE_UNAVAILABLE, "draining")
    } else if live == 0 {
        (StatusCode::SERVICE_UNAVAILABLE, "unhealthy")
    } else {
        (StatusCode::OK, "healthy")
    };
    (status, Json(json!({"status": word, "workers": workers, "live_workers": live}))).into_response()
}

/// `GET /metrics`: the rejection counters and per-rank load
/// (`RejectionMetrics::render_frontend`), what in-flight requests hold, the
/// request counters and histograms of the observe layer
/// (`observe::RequestMetrics`, none when called without the layer), the
/// upstream, liveness and event-plane counters and the engines' failed
/// scrapes. In OpenMetrics (ending with the one `# EOF`) when `Accept` asks
/// for it, else in the Prometheus text format 0.0.4
/// (`MetricsFormat::from_accept`).
pub async fn metrics(
    State(frontend): State<Arc<Frontend>>,
    requests: Option<Extension<Arc<RequestMetrics>>>,
    headers: HeaderMap,
) -> Response {
    let format = metrics_format(&headers);
    let mut text = frontend.metrics.render_frontend(&frontend.monitor);
    // Everything goes before the OpenMetrics terminator, which stays last.
    if let Some(at) = text.rfind("# EOF") {
        text.truncate(at);
    }
    let mut registry = Registry::default();
    let totals = frontend.inflight.totals();
    // `Registry::register` appends the full stop to each help.
    let extra = [
        (
            "loadgate_frontend_inflight_requests",
            "Requests dispatched to a worker whose response has not ended",
            totals.requests,
        ),
        (
            "loadgate_frontend_tracked_blocks",
            "KV blocks the router tracks for in-flight requests (kv mode)",
            totals.tracked_blocks,
        ),
        (
            "loadgate_frontend_tracked_prefill_tokens",
            "Prefill tokens the router tracks for in-flight requests (kv mode, and requests to engines)",
            totals.tracked_prefill_tokens,
        ),
        ("loadgate_frontend_workers", "Registered workers", frontend.monitor.workers().len() as u64),
    ];
    for (name, help, value) in extra {
        registry.register(name, help, ConstGauge::new(value));
    }
    if let Some(Extension(requests)) = requests {
        requests.retain_known(|model| frontend.monitor.has_model(model));
        if let Some(file) = frontend.callers.file() {
            requests.forget_tenants(&file.retired());
        }
        requests.register(&mut registry);
    }
    frontend.upstream_stats.register(
        &mut registry,
        "loadgate_frontend_upstream_failures",
        "Requests to workers that failed, by kind (connect, timeouts, broken)",
    );
    register_liveness(&mut registry, &frontend.directory);
    frontend.queue.register(&mut registry, &frontend.monitor);
    register_event_plane(&mut registry, &frontend.event_stats);
    let scrape_failures = Counter::<u64>::default();
    // Relaxed: a counter read on its own.
    scrape_failures.inc_by(frontend.engine_scrape_failures.load(Ordering::Relaxed));
    registry.register(
        "loadgate_frontend_engine_scrape_failures",
        "Failed scrapes of --engine engines (errors, timeouts, unreadable documents)",
        scrape_failures,
    );
    // Writing to a String cannot fail.
    let _ = encode_registry(&mut text, &registry);
    let _ = encode_eof(&mut text);
    metrics_response(format, text)
}

/// The format `/metrics` answers a request with these headers in: every
/// `Accept` line, joined, read by `MetricsFormat::from_accept` (one that is
/// not text counts as absent).
fn metrics_format(headers: &HeaderMap) -> MetricsFormat {
    let accept: Vec<&str> = headers.get_all(header::ACCEPT).iter().filter_map(|v| v.to_str().ok()).collect();
    MetricsFormat::from_accept((!accept.is_empty()).then(|| accept.join(",")).as_deref())
}

/// 200 with a complete OpenMetrics exposition in `format`; `Vary: Accept`,
/// since the body depends on it.
fn metrics_response(format: MetricsFormat, openmetrics: String) -> Response {
    let headers = [(header::CONTENT_TYPE, format.content_type()), (header::VARY, "Accept")];
    (StatusCode::OK, headers, format.convert(openmetrics)).into_response()
}

/// Registers the directory's liveness counters and gauge (their values now).
fn register_liveness(registry: &mut Registry, directory: &WorkerDirectory) {
    let (silenced, quarantined) = directory.liveness_totals();
    for (name, help, value) in [
        (
            "loadgate_frontend_workers_silenced",
            "Times a worker left routing because its event connection went silent or closed",
            silenced,
        ),
        (
            "loadgate_frontend_workers_quarantined",
            "Times a worker left routing for a second after a connection to it failed",
            quarantined,
        ),
    ] {
        let counter = Counter::<u64>::default();
        counter.inc_by(value);
        registry.register(name, help, counter);
    }
    let out = i64::try_from(directory.out_of_routing().len()).unwrap_or(i64::MAX);
    registry.register(
        "loadgate_frontend_workers_out_of_routing",
        "Registered workers out of routing now (silent or quarantined)",
        ConstGauge::new(out),
    );
}

/// Registers the event plane's counters (their values now).
fn register_event_plane(registry: &mut Registry, stats: &PlaneStats) {
    for (name, help, value) in [
        ("loadgate_frontend_event_loads_applied", "Load frames the event plane applied", stats.loads_applied()),
        (
            "loadgate_frontend_event_busy_flips",
            "Applied Load frames that flipped their worker's busy bit",
            stats.busy_flips(),
        ),
    ] {
        let counter = Counter::<u64>::default();
        counter.inc_by(value);
        registry.register(name, help, counter);
    }
    let (shared_loads, shared_frontends) = stats.shared();
    let counter = Counter::<u64>::default();
    counter.inc_by(shared_loads);
    registry.register(
        "loadgate_frontend_shared_loads_applied",
        "Other frontends' added load (FrontendLoad frames, NATS plane) applied",
        counter,
    );
    registry.register(
        "loadgate_frontend_shared_frontends",
        "Frontends whose load counts together, this one included (0: not sharing)",
        ConstGauge::new(i64::try_from(shared_frontends).unwrap_or(i64::MAX)),
    );
    let (unsealed, refused) = stats.frames_dropped();
    let dropped = Family::<[(&'static str, &'static str); 1], Counter>::default();
    dropped.get_or_create(&[("reason", "unsealed")]).inc_by(unsealed);
    dropped.get_or_create(&[("reason", "refused")]).inc_by(refused);
    registry.register(
        "loadgate_frontend_event_frames_dropped",
        "NATS frames dropped: unsealed (no secret, altered or moved) or refused once opened (clock, subject)",
        dropped,
    );
    registry.register(
        "loadgate_frontend_event_flip_lag_seconds",
        "From a busy flip's seal by its worker to its application (NATS plane; 1 ms resolution)",
        stats.flip_lag_histogram(),
    );
}
