//! An axum router embedding loadgate. Two workers serve "llama"; load
//! reports mark them busy; a request is routed around busy workers (529 when
//! all are, 503 for a model with no worker, 404 for an unknown one, each
//! counted on `/metrics`) and then waits in its worker's gate (`N = 1`
//! running, `Q = 2` waiting) for a slot that it holds until its SSE stream
//! ends or the client goes away.
//!
//! Run: `cargo run --example axum_router --features axum,prometheus`, then
//! `curl -N localhost:3000/v1/chat/completions -d '{"model":"llama"}'`,
//! `curl -X POST localhost:3000/load/1/90` (worker 1: 90 of 100 KV blocks)
//! and `curl localhost:3000/metrics`.

use std::{collections::HashMap, convert::Infallible, sync::Arc, time::Duration};

use axum::extract::{FromRef, Path, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, Sse};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use futures_util::stream::{self, StreamExt};
use loadgate::{metrics::RejectionMetrics, *};

/// The service's state; each field is an extractor's `State` (the derive
/// needs axum's `macros` feature).
#[derive(Clone, FromRef)]
pub struct App {
    pub router: WorkerRouter,
    pub retry_after: RetryAfter,
    pub metrics: Exposition,
    pub gates: Arc<HashMap<WorkerId, Arc<Admission<()>>>>,
}

/// The service and its state: workers 1 and 2 serve "llama" (busy past 85 %
/// of their KV blocks); "empty" has no worker yet.
pub fn app() -> (axum::Router, App) {
    let monitor = Arc::new(WorkerMonitor::new(MonitorConfig::default()).expect("default config"));
    let mut gates = HashMap::new();
    for worker in [1, 2] {
        monitor.register_worker(Registration::new(worker, "llama")).expect("a new worker");
        gates.insert(worker, Admission::new(1, 2).expect("N = 1, Q = 2"));
    }
    let busy = BusyThresholds { active_decode_blocks_threshold: Some(0.85), ..Default::default() };
    monitor.set_thresholds("llama", busy).expect("a valid threshold");
    monitor.add_model("empty");
    let rejections = Arc::new(RejectionMetrics::default()); // `Routed` counts its 529s here
    let metrics = Exposition::frontend(rejections.clone(), monitor.clone());
    let router = WorkerRouter::new(monitor, Policy::RoundRobin);
    let app = App { router, retry_after: RetryAfter::default(), metrics, gates: Arc::new(gates) };
    let http = axum::Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/load/{worker}/{blocks}", post(load))
        .route("/metrics", get(web::metrics))
        .layer(axum::Extension(rejections));
    (http.with_state(app.clone()), app)
}

/// A worker's load report: `blocks` of its 100 KV blocks are in use.
async fn load(State(app): State<App>, Path((worker, blocks)): Path<(WorkerId, u32)>) -> StatusCode {
    let load = RankLoad { active_decode_blocks: blocks, kv_total_blocks: 100, ..Default::default() };
    match app.router.monitor().reporter(worker).and_then(|worker| worker.report(load)) {
        Ok(_) => StatusCode::NO_CONTENT,
        Err(_) => StatusCode::NOT_FOUND,
    }
}

/// Streams `max_tokens` (default 5) tokens from the routed worker, one every
/// 100 ms, holding its slot throughout.
async fn chat(State(app): State<App>, to: Routed) -> Result<impl IntoResponse, Refusal> {
    let request: serde_json::Value = serde_json::from_slice(&to.body).unwrap_or_default();
    let max_tokens = request["max_tokens"].as_u64().unwrap_or(5);
    let ((), permit) = app.gates[&to.worker].admit(()).await.map_err(Refusal::from)?;
    let tokens = stream::iter(0..max_tokens).then(move |i| async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        Ok::<_, Infallible>(Event::default().data(format!("token {i} from worker {}", to.worker)))
    });
    let done = stream::once(async { Ok(Event::default().data("[DONE]")) });
    Ok(Sse::new(PermitStream::new(tokens.chain(done), permit)))
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    axum::serve(listener, app().0).await
}
