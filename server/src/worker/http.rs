//! The worker's HTTP API: the OpenAI routes (admitted through the hard cap,
//! `gate.rs`, then run on the simulator, `sim/`, or, in a sidecar, sent to
//! the real engine, `sidecar/forward.rs`), `/v1/models`, `/health`, `/info`
//! and `/metrics`. Every error is in OpenAI's shape (`reply.rs`).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use loadgate::metrics::{render_worker_as, MetricsFormat, WorkerAdmissionStats};
use loadgate::WorkerId;

use crate::http_server::BodyBudget;
use crate::openai::Api;
use crate::worker::gate::{at_capacity, Gate};
use crate::worker::proof::ProofCheck;
use crate::worker::reply::json_response;
use crate::worker::sidecar::{other_model, EngineHealth, EngineProxy};
use crate::worker::sim::{self, Simulator};

/// Everything the HTTP handlers share.
pub(crate) struct Worker {
    pub(crate) id: WorkerId,
    pub(crate) incarnation: u64,
    pub(crate) model: String,
    pub(crate) dp_size: u32,
    /// What runs the admitted requests.
    pub(crate) backend: Backend,
    /// The hard cap (`--engine-request-limit`) and the in-flight gauge.
    pub(crate) gate: Gate,
    /// With the event secret: the request proofs this worker accepts (`proof.rs`).
    pub(crate) proofs: Option<Arc<ProofCheck>>,
    /// Reads request bodies within `--http-body-limit-mb`.
    pub(crate) bodies: Arc<BodyBudget>,
}

/// What runs a worker's admitted requests.
pub(crate) enum Backend {
    /// loadgate's simulator.
    Simulator(Simulator),
    /// A real engine this worker is the sidecar of.
    Sidecar {
        /// The request path to it.
        proxy: EngineProxy,
        /// Whether its scrapes succeed (`/health`).
        health: Arc<EngineHealth>,
    },
}

pub(crate) async fn completions(State(worker): State<Arc<Worker>>, headers: HeaderMap, body: Body) -> Response {
    serve(worker, Api::Completions, headers, body).await
}

pub(crate) async fn chat_completions(State(worker): State<Arc<Worker>>, headers: HeaderMap, body: Body) -> Response {
    serve(worker, Api::ChatCompletions, headers, body).await
}

/// A body of at least this many bytes (`Content-Length`) is refused by a
/// full cap before it is read: reading and parsing it may take longer than
/// the second a frontend keeps the body after the worker has it all (its
/// release grace), and a refusal after that cannot be moved to another
/// worker (the frontend answers 502). A smaller one is read and parsed
/// first, so that one that could never fit gets its 400, not a 529.
const REFUSED_UNREAD: u64 = 1024 * 1024;

/// Reads the body (bounded), then runs the request on the backend; a full
/// cap refuses a large one before reading it.
async fn serve(worker: Arc<Worker>, api: Api, headers: HeaderMap, body: Body) -> Response {
    let length = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if length.is_some_and(|length| length >= REFUSED_UNREAD) && worker.gate.refuses_now() {
        return at_capacity();
    }
    let body = match worker.bodies.read(&headers, body).await {
        Ok(body) => body,
        Err(refusal) => return refusal,
    };
    match &worker.backend {
        Backend::Simulator(simulator) => sim::generate(&worker.gate, simulator, api, body).await,
        Backend::Sidecar { proxy, health } => match health.other_model() {
            Some(why) => other_model(&why),
            None => proxy.forward(&worker.gate, &worker.bodies, api_path(api), &headers, body).await,
        },
    }
}

/// The path of `api`'s route (the same on the engine).
fn api_path(api: Api) -> &'static str {
    match api {
        Api::Completions => "/v1/completions",
        Api::ChatCompletions => "/v1/chat/completions",
    }
}

pub(crate) async fn models(State(worker): State<Arc<Worker>>) -> Response {
    let body = serde_json::json!({
        "object": "list",
        "data": [{"id": worker.model, "object": "model", "created": 0, "owned_by": "loadgate"}],
    });
    json_response(StatusCode::OK, body.to_string())
}

/// 200 `{"status":"healthy"}`; a sidecar whose engine fails its scrapes:
/// 503 `{"status":"unhealthy","reason":...}`.
pub(crate) async fn health(State(worker): State<Arc<Worker>>) -> Response {
    let problem = match &worker.backend {
        Backend::Sidecar { health, .. } => health.problem(),
        Backend::Simulator(_) => None,
    };
    match problem {
        None => json_response(StatusCode::OK, r#"{"status":"healthy"}"#.to_owned()),
        Some(reason) => {
            let body = serde_json::json!({"status": "unhealthy", "reason": reason});
            json_response(StatusCode::SERVICE_UNAVAILABLE, body.to_string())
        }
    }
}

pub(crate) async fn info(State(worker): State<Arc<Worker>>) -> Response {
    let body = serde_json::json!({
        "worker_id": worker.id,
        "incarnation": worker.incarnation,
        "model": worker.model,
        "dp_size": worker.dp_size,
    });
    json_response(StatusCode::OK, body.to_string())
}

/// `GET /metrics`: the admission figures, in OpenMetrics when `Accept` asks
/// for it, else in the Prometheus text format 0.0.4.
pub(crate) async fn metrics(State(worker): State<Arc<Worker>>, headers: HeaderMap) -> Response {
    let stats = match worker.gate.admission() {
        Some(a) => {
            WorkerAdmissionStats { rejected: a.rejected(), running: a.running() as u64, queued: a.queued() as u64 }
        }
        None => WorkerAdmissionStats { running: worker.gate.in_flight() as u64, ..Default::default() },
    };
    // Every `Accept` line, joined (one that is not text counts as absent).
    let accept: Vec<&str> = headers.get_all(header::ACCEPT).iter().filter_map(|v| v.to_str().ok()).collect();
    let format = MetricsFormat::from_accept((!accept.is_empty()).then(|| accept.join(",")).as_deref());
    let text = render_worker_as(&worker.model, stats, format);
    // The body depends on `Accept`.
    (StatusCode::OK, [(header::CONTENT_TYPE, format.content_type()), (header::VARY, "Accept")], text).into_response()
}
