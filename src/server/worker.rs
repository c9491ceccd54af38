//! `loadgate worker`: a simulated inference worker behind an OpenAI HTTP API.
//!
//! Requests pass the worker's hard cap ([`Admission`], `N + Q`) when
//! `--engine-request-limit N` is given, then run on the simulated
//! continuous-batching [`Engine`]. The permit is held by the response body,
//! so it is released when the response has fully ended: stream finished,
//! error, or client gone. The worker registers itself and pushes its per-rank
//! load to every `--frontend` event port through an [`EventPublisher`].

use std::convert::Infallible;
use std::io::Write as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::Context as _;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt as _;
use axum::Router;
use futures_util::{Stream, StreamExt};
use tokio::sync::oneshot;

use crate::admission::{Admission, Admitted, Permit};
use crate::error::{overload_status_code, WORKER_AT_CAPACITY};
use crate::load::WorkerId;
use crate::metrics::{render_worker, WorkerAdmissionStats};
use crate::server::engine::{Engine, EngineConfig, EngineError, LoadSink, TokenStream};
use crate::server::events::{EventPublisher, Registration};
use crate::server::openai::{filler_token, parse_request, sse_event, Api, ResponseId, Usage, SSE_DONE};
use crate::sync::{Arc, AtomicUsize, Ordering};

/// Command-line arguments of `loadgate worker`.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// The model this worker serves.
    #[arg(long)]
    pub model: String,
    /// HTTP port on 127.0.0.1 (0 picks a free one).
    #[arg(long, default_value_t = 0)]
    pub http_port: u16,
    /// A frontend's event port, HOST:PORT (repeatable; none: standalone).
    #[arg(long = "frontend", value_name = "HOST:PORT")]
    pub frontends: Vec<String>,
    /// Data-parallel ranks.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub dp_size: u32,
    /// KV-cache blocks per rank.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub kv_total_blocks: u32,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    pub block_size: u32,
    /// Token budget of one engine step (decode + prefill).
    #[arg(long, default_value_t = 2048, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_num_batched_tokens: u32,
    /// Engine slots N; the overflow queue Q comes from DYN_DYNAMO_REQUEST_QUEUE_LIMIT (default 16).
    /// Without it there is no cap.
    #[arg(long)]
    pub engine_request_limit: Option<usize>,
    /// Wall time of one engine step, in milliseconds.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub decode_step_ms: u64,
    /// Bound on prefill speed, tokens per second per rank.
    #[arg(long)]
    pub prefill_tokens_per_s: Option<u32>,
    /// Re-send every rank's load at least this often (ms), even when unchanged.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..))]
    pub heartbeat_ms: u64,
    /// Worker id announced to frontends (default: random).
    #[arg(long)]
    pub worker_id: Option<u64>,
}

impl Args {
    /// The engine physics these arguments describe.
    pub fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            dp_size: self.dp_size,
            kv_total_blocks: self.kv_total_blocks,
            block_size: self.block_size,
            max_num_batched_tokens: self.max_num_batched_tokens,
            decode_step: Duration::from_millis(self.decode_step_ms),
            prefill_tokens_per_s: self.prefill_tokens_per_s,
        }
    }
}

/// A request waiting in the overflow queue: it receives its permit here.
#[derive(Debug)]
pub struct Waiter(oneshot::Sender<Permit<Waiter>>);

type WorkerPermit = Permit<Waiter>;

/// Everything the HTTP handlers share.
struct Worker {
    id: WorkerId,
    incarnation: u64,
    model: String,
    dp_size: u32,
    engine: Engine,
    admission: Option<Arc<Admission<Waiter>>>,
    /// Responses not yet ended (the engine-request gauge without a cap).
    in_flight: Arc<AtomicUsize>,
}

/// Runs `loadgate worker` until SIGTERM or ctrl-c.
///
/// # Errors
///
/// An invalid admission configuration (`--engine-request-limit 0`, an invalid
/// `DYN_DYNAMO_REQUEST_QUEUE_LIMIT`), or a port that cannot be bound.
pub fn run(args: Args) -> anyhow::Result<()> {
    super::init_logging();
    let admission = match args.engine_request_limit {
        Some(limit) => Some(
            Admission::from_env(limit, Box::new(|waiter: Waiter, permit| waiter.0.send(permit)))
                .context("invalid worker admission configuration")?,
        ),
        None => None,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(serve(args, admission))
}

async fn serve(args: Args, admission: Option<Arc<Admission<Waiter>>>) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.http_port))
        .await
        .with_context(|| format!("cannot bind 127.0.0.1:{}", args.http_port))?;
    let addr = listener.local_addr()?;
    let id = args.worker_id.unwrap_or_else(|| fastrand::u64(1..));
    let incarnation = Registration::new_incarnation();
    let registration = Registration {
        worker: id,
        incarnation,
        model: args.model.clone(),
        dp_size: args.dp_size,
        http_addr: addr.to_string(),
    };
    let (sink, publisher) = publish(&args, registration)?;
    let engine = Engine::start(args.engine_config(), sink);
    let worker = Arc::new(Worker {
        id,
        incarnation,
        model: args.model.clone(),
        dp_size: args.dp_size,
        engine,
        admission,
        in_flight: Arc::new(AtomicUsize::new(0)),
    });
    let app = Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/info", get(info))
        .route("/metrics", get(metrics))
        .with_state(worker);
    println!("listening http={addr}");
    std::io::stdout().flush()?;
    tracing::info!(worker_id = id, model = %args.model, %addr, "worker started");
    tokio::select! {
        served = axum::serve(listener.tap_io(|tcp| {
            // Tokens are small writes: without this, Nagle holds each one back.
            let _ = tcp.set_nodelay(true);
        }), app) => served?,
        () = shutdown_signal() => tracing::info!("worker stopping"),
    }
    drop(publisher);
    Ok(())
}

/// Starts pushing registration and load to the frontends (none: a
/// standalone worker); returns the engine's load sink and the publisher to
/// keep alive.
fn publish(args: &Args, registration: Registration) -> anyhow::Result<(LoadSink, Option<Arc<EventPublisher>>)> {
    if args.frontends.is_empty() {
        return Ok((Arc::new(|_, _| {}), None));
    }
    let heartbeat = Duration::from_millis(args.heartbeat_ms);
    let publisher = Arc::new(
        EventPublisher::start(args.frontends.clone(), registration, heartbeat)
            .context("cannot start the event publisher")?,
    );
    let reporter = publisher.clone();
    Ok((Arc::new(move |rank, load| reporter.report(rank, load)), Some(publisher)))
}

/// Resolves on SIGTERM or ctrl-c.
pub(crate) async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

async fn completions(State(worker): State<Arc<Worker>>, body: Bytes) -> Response {
    generate(worker, Api::Completions, body).await
}

async fn chat_completions(State(worker): State<Arc<Worker>>, body: Bytes) -> Response {
    generate(worker, Api::ChatCompletions, body).await
}

fn json_response(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], body).into_response()
}

fn error_response(status: StatusCode, message: &str, kind: &str) -> Response {
    let body = serde_json::json!({"error": {"message": message, "type": kind, "code": status.as_u16()}});
    json_response(status, body.to_string())
}

/// The hard-cap refusal: the overload status, `Retry-After: 1`, and the
/// message the frontend recognises as a migratable worker refusal.
fn at_capacity() -> Response {
    let status = StatusCode::from_u16(overload_status_code()).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    let body = format!(
        r#"{{"error":{{"message":"{WORKER_AT_CAPACITY}","type":"WorkerOverloaded","code":{}}}}}"#,
        status.as_u16()
    );
    let mut response = json_response(status, body);
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// Takes an engine slot: at once, after waiting in the overflow queue, or
/// not at all (`Err`: the refusal to send).
async fn admit(worker: &Worker) -> Result<Option<WorkerPermit>, Response> {
    let Some(admission) = &worker.admission else { return Ok(None) };
    let (tx, rx) = oneshot::channel();
    match admission.try_admit(Waiter(tx)) {
        Ok(Admitted::Now(_, permit)) => Ok(Some(permit)),
        // If this handler is dropped while waiting, `rx` goes with it and the
        // dispatcher hands the slot to the next waiter.
        Ok(Admitted::Queued) => rx
            .await
            .map(Some)
            .map_err(|_| error_response(StatusCode::SERVICE_UNAVAILABLE, "the worker is shutting down", "Unavailable")),
        Err(_) => Err(at_capacity()),
    }
}

/// What a response body holds until it is dropped (fully sent or abandoned).
struct Held {
    _permit: Option<WorkerPermit>,
    in_flight: Arc<AtomicUsize>,
}

impl Held {
    fn new(permit: Option<WorkerPermit>, in_flight: Arc<AtomicUsize>) -> Self {
        // Relaxed: a gauge.
        in_flight.fetch_add(1, Ordering::Relaxed);
        Held { _permit: permit, in_flight }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // Relaxed: a gauge.
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A body stream that keeps its [`Held`] resources until the body is dropped.
struct HeldStream<S> {
    inner: S,
    _held: Held,
}

impl<S: Stream + Unpin> Stream for HeldStream<S> {
    type Item = S::Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        Pin::new(&mut self.get_mut().inner).poll_next(cx)
    }
}

fn held_body<S>(inner: S, held: Held) -> Body
where
    S: Stream<Item = Result<Bytes, Infallible>> + Unpin + Send + 'static,
{
    Body::from_stream(HeldStream { inner, _held: held })
}

async fn generate(worker: Arc<Worker>, api: Api, body: Bytes) -> Response {
    let request = match parse_request(api, &body) {
        Ok(r) => r,
        Err(message) => return error_response(StatusCode::BAD_REQUEST, &message, "BadRequest"),
    };
    let permit = match admit(&worker).await {
        Ok(p) => p,
        Err(refusal) => return refusal,
    };
    let held = Held::new(permit, worker.in_flight.clone());
    let tokens = match worker.engine.submit(request.prompt_tokens, request.max_tokens) {
        Ok(t) => t,
        Err(e @ EngineError::ContextTooLong { .. }) => {
            return error_response(StatusCode::BAD_REQUEST, &e.to_string(), "BadRequest")
        }
        Err(e @ EngineError::Stopped) => {
            return error_response(StatusCode::SERVICE_UNAVAILABLE, &e.to_string(), "Unavailable")
        }
    };
    let model = if request.model.is_empty() { worker.model.clone() } else { request.model };
    let id = ResponseId::new(api, &model);
    let prompt_tokens = request.prompt_tokens;
    if request.stream {
        let events = sse_stream(id, prompt_tokens, tokens);
        let mut response = held_body(events, held).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        response
    } else {
        let (text, generated) = collect(tokens).await;
        let usage = Usage { prompt_tokens, completion_tokens: generated };
        let full = Bytes::from(id.full(&text, usage));
        let mut response = held_body(futures_util::stream::iter([Ok(full)]), held).into_response();
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        response
    }
}

/// Waits for every token of a non-streaming request.
async fn collect(mut tokens: TokenStream) -> (String, u32) {
    let mut text = String::new();
    let mut n = 0;
    while let Some(index) = tokens.recv().await {
        text.push_str(filler_token(index));
        n += 1;
    }
    (text, n)
}

/// The SSE events of a streaming request: one per token, then the finish
/// chunk with usage, then `[DONE]`. Dropping it cancels the request.
fn sse_stream(
    id: ResponseId,
    prompt_tokens: u32,
    tokens: TokenStream,
) -> Pin<Box<dyn Stream<Item = Result<Bytes, Infallible>> + Send>> {
    let state = (Some(tokens), 0u32);
    let events = futures_util::stream::unfold(state, move |(tokens, generated)| {
        let id = id.clone();
        async move {
            let mut tokens = tokens?;
            match tokens.recv().await {
                Some(index) => {
                    let event = sse_event(&id.chunk(filler_token(index), generated == 0));
                    Some((event, (Some(tokens), generated + 1)))
                }
                None => {
                    let usage = Usage { prompt_tokens, completion_tokens: generated };
                    let last = format!("{}{SSE_DONE}", sse_event(&id.final_chunk(usage)));
                    Some((last, (None, generated)))
                }
            }
        }
    });
    Box::pin(events.map(|event| Ok(Bytes::from(event))))
}

async fn models(State(worker): State<Arc<Worker>>) -> Response {
    let body = serde_json::json!({
        "object": "list",
        "data": [{"id": worker.model, "object": "model", "created": 0, "owned_by": "loadgate"}],
    });
    json_response(StatusCode::OK, body.to_string())
}

async fn health() -> Response {
    json_response(StatusCode::OK, r#"{"status":"healthy"}"#.to_owned())
}

async fn info(State(worker): State<Arc<Worker>>) -> Response {
    let body = serde_json::json!({
        "worker_id": worker.id,
        "incarnation": worker.incarnation,
        "model": worker.model,
        "dp_size": worker.dp_size,
    });
    json_response(StatusCode::OK, body.to_string())
}

async fn metrics(State(worker): State<Arc<Worker>>) -> Response {
    let stats = match &worker.admission {
        Some(a) => {
            WorkerAdmissionStats { rejected: a.rejected(), running: a.running() as u64, queued: a.queued() as u64 }
        }
        // Relaxed: a gauge.
        None => WorkerAdmissionStats { running: worker.in_flight.load(Ordering::Relaxed) as u64, ..Default::default() },
    };
    let text = render_worker(&worker.model, stats);
    (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}
