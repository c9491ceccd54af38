//! The frontend's read-only service routes on the inference port:
//! `GET /v1/models`, `/health` and `/metrics` (`/busy_threshold` is on the
//! admin listener, `threshold_api.rs`).

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::frontend::state::Frontend;

/// `GET /v1/models`: every model a registered worker serves.
pub async fn models(State(frontend): State<Arc<Frontend>>) -> Json<Value> {
    let data: Vec<Value> = frontend
        .monitor
        .models()
        .into_iter()
        .map(|id| json!({"id": id, "object": "model", "owned_by": "loadgate"}))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

/// `GET /health`: up, and how many workers are registered.
pub async fn health(State(frontend): State<Arc<Frontend>>) -> Json<Value> {
    Json(json!({"status": "healthy", "workers": frontend.monitor.workers().len()}))
}

/// `GET /metrics`: the rejection counters and per-rank load
/// (`RejectionMetrics::render_frontend`) plus what in-flight requests hold.
pub async fn metrics(State(frontend): State<Arc<Frontend>>) -> Response {
    let mut text = frontend.metrics.render_frontend(&frontend.monitor);
    let totals = frontend.inflight.totals();
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
            "Prefill tokens the router tracks for in-flight requests (kv mode)",
            totals.tracked_prefill_tokens,
        ),
        ("loadgate_frontend_workers", "Registered workers", frontend.monitor.workers().len() as u64),
    ];
    let mut lines = String::new();
    for (name, help, value) in extra {
        lines.push_str(&format!("# HELP {name} {help}.\n# TYPE {name} gauge\n{name} {value}\n"));
    }
    // Keep the OpenMetrics terminator last.
    match text.rfind("# EOF") {
        Some(at) => text.insert_str(at, &lines),
        None => text.push_str(&lines),
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}
