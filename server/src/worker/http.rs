//! The worker's HTTP API: the OpenAI routes (admitted through the hard cap,
//! then run on the engine, streamed as SSE or answered whole), `/v1/models`,
//! `/health`, `/info` and `/metrics`.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::{Stream, StreamExt};
use loadgate::{
    metrics::{render_worker, WorkerAdmissionStats},
    rejection::{overload_status_code, WORKER_AT_CAPACITY},
    Admission, Permit, PermitStream, WorkerId,
};

use crate::openai::{filler_token, parse_request, sse_event, Api, ResponseId, Usage, SSE_DONE};
use crate::worker::engine::{Engine, EngineError, TokenStream};

/// A response's engine slot.
type WorkerPermit = Permit<()>;

/// Everything the HTTP handlers share.
pub(crate) struct Worker {
    pub(crate) id: WorkerId,
    pub(crate) incarnation: u64,
    pub(crate) model: String,
    pub(crate) dp_size: u32,
    pub(crate) engine: Engine,
    pub(crate) admission: Option<Arc<Admission<()>>>,
    /// Responses not yet ended (the engine-request gauge without a cap).
    pub(crate) in_flight: Arc<AtomicUsize>,
}

pub(crate) async fn completions(State(worker): State<Arc<Worker>>, body: Bytes) -> Response {
    generate(worker, Api::Completions, body).await
}

pub(crate) async fn chat_completions(State(worker): State<Arc<Worker>>, body: Bytes) -> Response {
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
    // If this handler is dropped while waiting, the future gives up its
    // place (and a slot already handed to it passes to the next waiter).
    match admission.admit(()).await {
        Ok(((), permit)) => Ok(Some(permit)),
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

fn held_body<S>(inner: S, held: Held) -> Body
where
    S: Stream<Item = Result<Bytes, Infallible>> + Unpin + Send + 'static,
{
    Body::from_stream(PermitStream::new(inner, held))
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

pub(crate) async fn models(State(worker): State<Arc<Worker>>) -> Response {
    let body = serde_json::json!({
        "object": "list",
        "data": [{"id": worker.model, "object": "model", "created": 0, "owned_by": "loadgate"}],
    });
    json_response(StatusCode::OK, body.to_string())
}

pub(crate) async fn health() -> Response {
    json_response(StatusCode::OK, r#"{"status":"healthy"}"#.to_owned())
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

pub(crate) async fn metrics(State(worker): State<Arc<Worker>>) -> Response {
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
