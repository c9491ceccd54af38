//! The worker's HTTP API: the OpenAI routes (admitted through the hard cap,
//! then run on the simulated engine, streamed as SSE or answered whole, or,
//! in a sidecar, proxied to the real engine by `engine_proxy.rs`),
//! `/v1/models`, `/health`, `/info` and `/metrics`. Every error is in OpenAI's shape
//! (`openai::error_body`): `invalid_request_error` for a 4xx (with the field
//! at fault in `param`), DESIGN's `Overloaded` / `Unavailable` for refusals.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::{Stream, StreamExt};
use loadgate::{
    metrics::{render_worker, WorkerAdmissionStats},
    rejection::{overload_status_code, REFUSAL_AT_CAPACITY, REFUSAL_HEADER},
    Admission, Permit, PermitStream, Rejection, WorkerId,
};

use crate::openai::{
    error_body, filler_token, parse_request, sse_event, Api, InvalidRequest, ResponseId, Usage, INVALID_REQUEST_ERROR,
    SSE_DONE,
};
use crate::secret::Secrets;
use crate::worker::engine::{Engine, EngineError, TokenStream};
use crate::worker::engine_proxy::{self, EngineProxy};
use crate::worker::engine_reports::EngineHealth;

/// A response's engine slot.
type WorkerPermit = Permit<()>;

/// Everything the HTTP handlers share.
pub(crate) struct Worker {
    pub(crate) id: WorkerId,
    pub(crate) incarnation: u64,
    pub(crate) model: String,
    pub(crate) dp_size: u32,
    /// What runs the admitted requests.
    pub(crate) backend: Backend,
    pub(crate) admission: Option<Arc<Admission<()>>>,
    /// Responses not yet ended (the engine-request gauge without a cap).
    pub(crate) in_flight: Arc<AtomicUsize>,
    /// The event secret: requests must carry its proof (`proof.rs`).
    pub(crate) secrets: Option<Arc<Secrets>>,
    /// Largest request body in bytes (`--http-body-limit-mb`).
    pub(crate) body_limit: usize,
}

/// What runs a worker's admitted requests.
pub(crate) enum Backend {
    /// loadgate's simulated engine.
    Simulated(Engine),
    /// A real engine this worker is the sidecar of.
    Proxied {
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

/// Reads the body (bounded), then runs the request on the backend.
async fn serve(worker: Arc<Worker>, api: Api, headers: HeaderMap, body: Body) -> Response {
    let body = match read_body(worker.body_limit, &headers, body).await {
        Ok(body) => body,
        Err(refusal) => return refusal,
    };
    match &worker.backend {
        Backend::Simulated(engine) => generate(&worker, engine, api, body).await,
        Backend::Proxied { proxy, .. } => engine_proxy::forward(&worker, proxy, api_path(api), &headers, body).await,
    }
}

/// The path of `api`'s route (the same on the engine).
fn api_path(api: Api) -> &'static str {
    match api {
        Api::Completions => "/v1/completions",
        Api::ChatCompletions => "/v1/chat/completions",
    }
}

/// How long a client may pause between two pieces of its body (as the
/// frontend's body reader).
pub(crate) const BODY_IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long reading one body may take in all (as the frontend's).
pub(crate) const BODY_READ_DEADLINE: Duration = Duration::from_secs(120);

/// The first buffer of a body; it doubles as the bytes arrive.
const FIRST_STEP: usize = 64 * 1024;

/// Reads a request body of at most `--http-body-limit-mb`: a larger
/// `Content-Length` is refused with 413 before reading (and so is a body
/// without one once it grows past the limit). The buffer grows as the bytes
/// arrive (doubling, never past the `Content-Length`), so a declared length
/// allocates nothing up front. A client that pauses over
/// [`BODY_IDLE_TIMEOUT`] or takes over [`BODY_READ_DEADLINE`] gets 408.
async fn read_body(limit: usize, headers: &HeaderMap, body: Body) -> Result<Bytes, Response> {
    read_body_within(limit, BODY_IDLE_TIMEOUT, BODY_READ_DEADLINE, headers, body).await
}

async fn read_body_within(
    limit: usize,
    idle: Duration,
    deadline: Duration,
    headers: &HeaderMap,
    body: Body,
) -> Result<Bytes, Response> {
    let closing = |status: StatusCode, message: &str| {
        let mut response = error_response(status, INVALID_REQUEST_ERROR, None, message);
        // The rest of the body is not read: the connection cannot be reused.
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        response
    };
    let too_large = || {
        let message = format!("request body is larger than {limit} bytes (--http-body-limit-mb)");
        closing(StatusCode::PAYLOAD_TOO_LARGE, &message)
    };
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let cap = declared.map_or(limit, |n| n as usize);
    let read = async {
        let mut bytes = Vec::new();
        let mut stream = body.into_data_stream();
        loop {
            let Ok(next) = tokio::time::timeout(idle, stream.next()).await else {
                return Err(closing(StatusCode::REQUEST_TIMEOUT, "request body arrived too slowly"));
            };
            let Some(chunk) = next else { return Ok(Bytes::from(bytes)) };
            let chunk =
                chunk.map_err(|e| closing(StatusCode::BAD_REQUEST, &format!("could not read the body: {e}")))?;
            let needed = bytes.len().saturating_add(chunk.len());
            if needed > limit {
                return Err(too_large());
            }
            if needed > bytes.capacity() {
                let step = needed.max(bytes.capacity().saturating_mul(2)).max(FIRST_STEP).min(cap.max(needed));
                bytes.reserve_exact(step - bytes.len());
            }
            bytes.extend_from_slice(&chunk);
        }
    };
    match tokio::time::timeout(deadline, read).await {
        Ok(read) => read,
        Err(_) => Err(closing(StatusCode::REQUEST_TIMEOUT, "request body arrived too slowly")),
    }
}

pub(crate) fn json_response(status: StatusCode, body: impl Into<Body>) -> Response {
    let body: Body = body.into();
    (status, [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], body).into_response()
}

/// `{"error":{"message","type","param","code"}}` with `status`.
pub(crate) fn error_response(status: StatusCode, kind: &str, param: Option<&str>, message: &str) -> Response {
    json_response(status, error_body(message, kind, param, status.as_u16()))
}

/// A request the worker will not run: 400 naming the field at fault.
fn invalid(error: &InvalidRequest) -> Response {
    error_response(StatusCode::BAD_REQUEST, INVALID_REQUEST_ERROR, error.param, &error.message)
}

/// Any path the worker does not serve: 404 in OpenAI's shape.
#[allow(dead_code, reason = "the router's fallback, once worker/mod.rs wires it")]
pub(crate) async fn no_route() -> Response {
    error_response(StatusCode::NOT_FOUND, INVALID_REQUEST_ERROR, None, "no such route")
}

/// A served path with the wrong method: 405 in OpenAI's shape.
#[allow(dead_code, reason = "the router's fallback, once worker/mod.rs wires it")]
pub(crate) async fn method_not_allowed() -> Response {
    error_response(StatusCode::METHOD_NOT_ALLOWED, INVALID_REQUEST_ERROR, None, "method not allowed on this route")
}

/// The hard-cap refusal: the overload status, `Retry-After: 1` (and
/// `retry-after-ms: 1000`), the explicit refusal signal, and an
/// `Overloaded` body saying `Server overloaded: worker at capacity`.
fn at_capacity() -> Response {
    let status = StatusCode::from_u16(overload_status_code()).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    let refusal = Rejection::WorkerOverloaded;
    let mut response = error_response(status, refusal.error_type(), None, refusal.message());
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response.headers_mut().insert("retry-after-ms", HeaderValue::from_static("1000"));
    // The explicit signal: the frontend recognises a refusal by it alone.
    response.headers_mut().insert(REFUSAL_HEADER, HeaderValue::from_static(REFUSAL_AT_CAPACITY));
    response
}

/// Takes an engine slot: at once, after waiting in the overflow queue, or
/// not at all (`Err`: the refusal to send).
pub(crate) async fn admit(worker: &Worker) -> Result<Option<WorkerPermit>, Response> {
    let Some(admission) = &worker.admission else { return Ok(None) };
    // If this handler is dropped while waiting, the future gives up its
    // place (and a slot already handed to it passes to the next waiter).
    match admission.admit(()).await {
        Ok(((), permit)) => Ok(Some(permit)),
        Err(_) => Err(at_capacity()),
    }
}

/// What a response body holds until it is dropped (fully sent or abandoned).
pub(crate) struct Held {
    _permit: Option<WorkerPermit>,
    in_flight: Arc<AtomicUsize>,
}

impl Held {
    /// Holds `permit` and counts the response in `in_flight` until dropped.
    pub(crate) fn new(permit: Option<WorkerPermit>, in_flight: Arc<AtomicUsize>) -> Self {
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

/// A response whose body `inner` holds `held` until it ends, fails or is
/// dropped.
pub(crate) fn held_body<S, E>(inner: S, held: Held) -> Response
where
    S: Stream<Item = Result<Bytes, E>> + Unpin + Send + 'static,
    E: Into<Box<dyn std::error::Error + Send + Sync>> + 'static,
{
    Body::from_stream(PermitStream::new(inner, held)).into_response()
}

/// Bodies above this are parsed on tokio's blocking pool, so a large prompt
/// does not stall the runtime thread that serves other requests.
const INLINE_PARSE_LIMIT: usize = 1024 * 1024;

async fn generate(worker: &Worker, engine: &Engine, api: Api, body: Bytes) -> Response {
    let parsed = if body.len() <= INLINE_PARSE_LIMIT {
        parse_request(api, &body)
    } else {
        tokio::task::spawn_blocking(move || parse_request(api, &body))
            .await
            .unwrap_or_else(|e| Err(InvalidRequest::body(format!("could not parse the request: {e}"))))
    };
    let request = match parsed {
        Ok(r) => r,
        Err(error) => return invalid(&error),
    };
    let permit = match admit(worker).await {
        Ok(p) => p,
        Err(refusal) => return refusal,
    };
    let held = Held::new(permit, worker.in_flight.clone());
    let tokens = match engine.submit(request.prompt_tokens, request.max_tokens) {
        Ok(t) => t,
        Err(e @ EngineError::ContextTooLong { .. }) => {
            return error_response(StatusCode::BAD_REQUEST, INVALID_REQUEST_ERROR, None, &e.to_string())
        }
        Err(e @ EngineError::Stopped) => {
            let unavailable = Rejection::Unavailable.error_type();
            return error_response(StatusCode::SERVICE_UNAVAILABLE, unavailable, None, &e.to_string());
        }
    };
    let id = ResponseId::new(api, &request.model).with_usage_chunk(request.include_usage);
    let prompt_tokens = request.prompt_tokens;
    if request.stream {
        let events = sse_stream(id, prompt_tokens, tokens);
        let mut response = held_body(events, held);
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        response
    } else {
        let (text, generated) = collect(tokens).await;
        let usage = Usage { prompt_tokens, completion_tokens: generated };
        let full = Bytes::from(id.full(&text, usage));
        let mut response = held_body(futures_util::stream::iter([Ok::<_, Infallible>(full)]), held);
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
/// chunk, then (with `include_usage`) a chunk of `"choices": []` and the
/// usage, then `[DONE]`, as OpenAI ends its streams. Without
/// `include_usage` no chunk carries usage. Dropping it cancels the request.
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
                    let mut last = sse_event(&id.finish_chunk());
                    if id.include_usage {
                        let usage = Usage { prompt_tokens, completion_tokens: generated };
                        last.push_str(&sse_event(&id.usage_chunk(usage)));
                    }
                    last.push_str(SSE_DONE);
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

/// 200 `{"status":"healthy"}`; a sidecar whose engine fails its scrapes:
/// 503 `{"status":"unhealthy","reason":...}`.
pub(crate) async fn health(State(worker): State<Arc<Worker>>) -> Response {
    let problem = match &worker.backend {
        Backend::Proxied { health, .. } => health.problem(),
        Backend::Simulated(_) => None,
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

pub(crate) async fn metrics(State(worker): State<Arc<Worker>>) -> Response {
    let stats = match &worker.admission {
        Some(a) => {
            WorkerAdmissionStats { rejected: a.rejected(), running: a.running() as u64, queued: a.queued() as u64 }
        }
        // Relaxed: a gauge.
        None => WorkerAdmissionStats { running: worker.in_flight.load(Ordering::Relaxed) as u64, ..Default::default() },
    };
    let text = render_worker(&worker.model, stats);
    // OpenMetrics text (it ends with `# EOF`).
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text)
        .into_response()
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    /// The `type`, `param` and `code` of an error response.
    async fn error_of(response: Response) -> (String, Value, u64) {
        let body = axum::body::to_bytes(response.into_body(), 1 << 16).await.unwrap();
        let body: Value = serde_json::from_slice(&body).unwrap();
        let error = &body["error"];
        assert!(error["message"].is_string(), "{body}");
        (error["type"].as_str().unwrap().to_owned(), error["param"].clone(), error["code"].as_u64().unwrap())
    }

    #[tokio::test]
    async fn errors_are_in_openais_shape() {
        let bad = invalid(&parse_request(Api::Completions, br#"{"model":"m","prompt":5}"#).unwrap_err());
        assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
        assert_eq!(error_of(bad).await, (INVALID_REQUEST_ERROR.to_owned(), Value::from("prompt"), 400));
        assert_eq!(error_of(no_route().await).await, (INVALID_REQUEST_ERROR.to_owned(), Value::Null, 404));
        assert_eq!(error_of(method_not_allowed().await).await, (INVALID_REQUEST_ERROR.to_owned(), Value::Null, 405));
        let refusal = at_capacity();
        assert_eq!(refusal.headers()[REFUSAL_HEADER], REFUSAL_AT_CAPACITY);
        assert_eq!(refusal.headers()["retry-after-ms"], "1000");
        let status = u64::from(refusal.status().as_u16());
        assert_eq!(error_of(refusal).await, ("Overloaded".to_owned(), Value::Null, status));
    }

    /// The events of a stream of `tokens` tokens.
    async fn stream_events(include_usage: bool, tokens: u32) -> Vec<String> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        for index in 0..tokens {
            tx.send(index).unwrap();
        }
        drop(tx);
        let id = ResponseId::new(Api::ChatCompletions, "m").with_usage_chunk(include_usage);
        let body: Vec<Bytes> = sse_stream(id, 7, rx).map(|chunk| chunk.unwrap()).collect().await;
        let text = String::from_utf8(body.concat()).unwrap();
        text.split("\n\n").filter(|e| !e.is_empty()).map(str::to_owned).collect()
    }

    #[tokio::test]
    async fn a_stream_ends_with_its_usage_only_when_asked() {
        let events = stream_events(false, 3).await;
        assert_eq!(events.len(), 5, "3 tokens, the finish chunk, [DONE]: {events:?}");
        assert_eq!(events[4], "data: [DONE]");
        for event in &events[..4] {
            assert!(!event.contains("usage"), "{event}");
        }
        let events = stream_events(true, 3).await;
        assert_eq!(events.len(), 6, "3 tokens, the finish chunk, the usage chunk, [DONE]: {events:?}");
        let chunks: Vec<Value> =
            events[..5].iter().map(|e| serde_json::from_str(e.strip_prefix("data: ").unwrap()).unwrap()).collect();
        for chunk in &chunks[..4] {
            assert_eq!(chunk["usage"], Value::Null);
            assert_eq!(chunk["choices"].as_array().map(Vec::len), Some(1));
        }
        assert_eq!(chunks[3]["choices"][0]["finish_reason"], "length");
        assert_eq!(chunks[4]["choices"], serde_json::json!([]));
        assert_eq!(
            chunks[4]["usage"],
            serde_json::json!({"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10})
        );
        assert_eq!(events[5], "data: [DONE]");
    }

    fn declared(n: usize) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
        headers
    }

    #[tokio::test]
    async fn bodies_past_the_limit_are_413_and_the_rest_are_read_whole() {
        // Past the limit by its length: refused before reading (this body never ends).
        let endless = Body::from_stream(futures_util::stream::pending::<Result<Bytes, Infallible>>());
        let refused = read_body(1 << 20, &declared((1 << 20) + 1), endless).await.unwrap_err();
        assert_eq!(refused.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(error_of(refused).await, (INVALID_REQUEST_ERROR.to_owned(), Value::Null, 413));
        // Past it as it streams.
        let chunks = (0..5).map(|_| Ok::<_, Infallible>(Bytes::from(vec![b'x'; 1 << 18])));
        let streamed = Body::from_stream(futures_util::stream::iter(chunks));
        let refused = read_body(1 << 20, &HeaderMap::new(), streamed).await.unwrap_err();
        assert_eq!(refused.status(), StatusCode::PAYLOAD_TOO_LARGE);
        // Larger than axum's 2 MB default, within the limit.
        let big = vec![b'x'; 3 << 20];
        let read = read_body(4 << 20, &declared(big.len()), Body::from(big)).await.unwrap();
        assert_eq!(read.len(), 3 << 20);
    }

    #[tokio::test]
    async fn a_slow_body_is_408_and_a_declared_length_is_not_allocated_up_front() {
        // A body that pauses past the idle timeout.
        let pausing = Body::from_stream(futures_util::stream::pending::<Result<Bytes, Infallible>>());
        let idle = Duration::from_millis(50);
        let refused =
            read_body_within(1 << 30, idle, Duration::from_secs(5), &declared(1 << 30), pausing).await.unwrap_err();
        assert_eq!(refused.status(), StatusCode::REQUEST_TIMEOUT);
        assert_eq!(refused.headers()[header::CONNECTION], "close");
        // One that trickles within the idle timeout but past the deadline.
        let trickle = futures_util::stream::unfold((), |()| async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            Some((Ok::<_, Infallible>(Bytes::from_static(b"x")), ()))
        });
        let deadline = Duration::from_millis(200);
        let started = std::time::Instant::now();
        let refused = read_body_within(1 << 30, idle, deadline, &declared(1 << 30), Body::from_stream(trickle))
            .await
            .unwrap_err();
        assert_eq!(refused.status(), StatusCode::REQUEST_TIMEOUT);
        assert!(started.elapsed() < Duration::from_secs(2));
        // A 1 GiB Content-Length with 3 bytes sent reads them (no 1 GiB buffer first).
        let short = Body::from(&b"abc"[..]);
        let read = read_body_within(1 << 30, idle, deadline, &declared(1 << 30), short).await.unwrap();
        assert_eq!(&read[..], b"abc");
    }
}
