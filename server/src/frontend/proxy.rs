//! The OpenAI routes: pick a worker, forward the request, relay the answer
//! (SSE chunks as they arrive), and migrate to another worker when one
//! refuses at its hard cap.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::Response;
use futures_util::Stream;
use serde_json::Value;

use loadgate::{
    metrics::{Endpoint, Reason},
    rejection::WORKER_AT_CAPACITY,
    Migration, RouteError, WorkerId,
};

use crate::frontend::inflight::Held;
use crate::frontend::reply;
use crate::frontend::state::Frontend;
use crate::tokens::prompt_tokens;

/// Largest worker error body the frontend reads to look for a refusal.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// `POST /v1/completions`.
pub async fn completions(State(frontend): State<Arc<Frontend>>, body: Bytes) -> Response {
    proxy(frontend, Endpoint::Completions, body).await
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(State(frontend): State<Arc<Frontend>>, body: Bytes) -> Response {
    proxy(frontend, Endpoint::ChatCompletions, body).await
}

fn path(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::Completions => "/v1/completions",
        Endpoint::ChatCompletions => "/v1/chat/completions",
    }
}

/// Why workers were excluded from this request so far.
#[derive(Default)]
struct Exclusions {
    /// Some worker answered `Server overloaded: worker at capacity`.
    at_capacity: bool,
    /// Some worker could not be reached.
    unreachable: bool,
}

async fn proxy(frontend: Arc<Frontend>, endpoint: Endpoint, body: Bytes) -> Response {
    let request: Value = match serde_json::from_slice(&body) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => return reply::bad_request("request body must be a JSON object"),
        Err(e) => return reply::bad_request(&format!("request body is not valid JSON: {e}")),
    };
    let model = match request.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        _ => return reply::bad_request("\"model\" must be a non-empty string"),
    };
    let prompt = if frontend.inflight.tracking() { prompt_tokens(endpoint, &request) } else { 0 };
    let mut migration = Migration::new(frontend.migration_limit);
    let mut excluded = Exclusions::default();
    loop {
        let worker = match frontend.router.route(&model, migration.refusals()) {
            Ok(worker) => worker,
            Err(RouteError::Overloaded) if excluded.unreachable && !excluded.at_capacity => {
                return reply::unavailable()
            }
            Err(RouteError::Overloaded) => {
                // Every worker left free had refused this request already.
                let excluded_free = (!migration.refusals().is_empty()).then_some(Reason::Excluded);
                let capacity = excluded.at_capacity.then_some(Reason::WorkerCapacity);
                return frontend.reject_overloaded(&model, endpoint, excluded_free.into_iter().chain(capacity));
            }
            Err(RouteError::Unavailable) => return reply::unavailable(),
            // With no worker registered at all, the model may well exist: unavailable.
            Err(RouteError::UnknownModel) if frontend.directory.is_empty() => return reply::unavailable(),
            Err(RouteError::UnknownModel) => return reply::unknown_model(&model),
            Err(_) => return reply::unavailable(),
        };
        match dispatch(&frontend, endpoint, worker, prompt, &body).await {
            Attempt::Answer(response) => return response,
            Attempt::AtCapacity => {
                tracing::debug!(worker, %model, "worker at capacity; migrating");
                excluded.at_capacity = true;
                if !migration.refused(worker) {
                    return frontend.reject_overloaded(&model, endpoint, [Reason::WorkerCapacity]);
                }
            }
            Attempt::Unreachable => {
                excluded.unreachable = true;
                if !migration.refused(worker) {
                    return reply::openai_error(StatusCode::BAD_GATEWAY, "BadGateway", "worker unreachable");
                }
            }
        }
    }
}

/// The outcome of sending a request to one worker.
enum Attempt {
    /// Relay this to the client (a success stream or a worker's own error).
    Answer(Response),
    /// The worker refused at its hard cap: migratable.
    AtCapacity,
    /// No answer from the worker (gone, or not yet in the directory).
    Unreachable,
}

async fn dispatch(
    frontend: &Arc<Frontend>,
    endpoint: Endpoint,
    worker: WorkerId,
    prompt: u64,
    body: &Bytes,
) -> Attempt {
    let Some(address) = frontend.directory.get(worker) else {
        return Attempt::Unreachable;
    };
    let held = frontend.inflight.hold(worker, address.dp_size, prompt);
    let url = format!("{}{}", address.base_url, path(endpoint));
    let sent =
        frontend.client.post(url).header(header::CONTENT_TYPE, "application/json").body(body.clone()).send().await;
    let upstream = match sent {
        Ok(upstream) => upstream,
        Err(error) => {
            tracing::warn!(worker, %error, "worker request failed");
            return Attempt::Unreachable;
        }
    };
    let status = StatusCode::from_u16(upstream.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let content_type = upstream.headers().get(header::CONTENT_TYPE).cloned();
    if status.is_success() {
        let relay = Relay { upstream: Box::pin(upstream.bytes_stream()), held: Some(held) };
        let mut response = Response::new(Body::from_stream(relay));
        *response.status_mut() = status;
        if let Some(content_type) = content_type {
            response.headers_mut().insert(header::CONTENT_TYPE, content_type);
        }
        return Attempt::Answer(response);
    }
    let error_body = match read_bounded(upstream).await {
        Ok(b) => b,
        Err(error) => {
            tracing::warn!(worker, %error, "reading a worker's error body failed");
            return Attempt::Unreachable;
        }
    };
    drop(held);
    if contains(&error_body, WORKER_AT_CAPACITY.as_bytes()) {
        return Attempt::AtCapacity;
    }
    let mut response = Response::new(Body::from(error_body));
    *response.status_mut() = status;
    if let Some(content_type) = content_type {
        response.headers_mut().insert(header::CONTENT_TYPE, content_type);
    }
    Attempt::Answer(response)
}

async fn read_bounded(mut upstream: reqwest::Response) -> reqwest::Result<Bytes> {
    let mut body = Vec::new();
    while let Some(chunk) = upstream.chunk().await? {
        let room = MAX_ERROR_BODY.saturating_sub(body.len());
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if room <= chunk.len() {
            break;
        }
    }
    Ok(Bytes::from(body))
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

type Upstream = Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>;

/// A worker's response body on its way to the client. Holds the request's
/// [`Held`] until the stream ends, fails, or is dropped (client gone).
struct Relay {
    upstream: Upstream,
    held: Option<Held>,
}

impl Stream for Relay {
    type Item = reqwest::Result<Bytes>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let next = this.upstream.as_mut().poll_next(cx);
        match &next {
            Poll::Ready(Some(Ok(chunk))) => {
                if let Some(held) = this.held.as_mut() {
                    held.on_chunk(chunk);
                }
            }
            Poll::Ready(Some(Err(error))) => {
                if let Some(held) = this.held.take() {
                    tracing::warn!(worker = held.worker(), %error, "worker stream failed");
                }
            }
            Poll::Ready(None) => this.held = None,
            Poll::Pending => {}
        }
        next
    }
}
