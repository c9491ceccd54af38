//! [`EngineProxy`]: the sidecar's request path to a real engine. A request
//! that passed the hard cap is sent to the engine's same path (the body as
//! received, its `Content-Type` and `x-request-id`), and the engine's
//! status, `Content-Type` and body come back: chunk by chunk as the engine
//! sends them, so a stream is relayed token by token and a whole answer
//! whole. The permit stays with the relayed body until it ends.
//!
//! Every engine call is bounded: the connection must open within the
//! connect timeout, the response head and its first body bytes must come
//! within the first-byte timeout (else 504; no head was relayed yet), and a
//! relayed body that stalls past the between-chunks timeout is cut.
//!
//! # A client that leaves
//!
//! Dropping the engine request closes its connection (hyper's client
//! closes a connection whose response, or whose body, nobody waits for
//! any more), and the engine frees the slot. The request is dropped when:
//!
//! - **streamed**: the client stops reading and closes; the server drops
//!   the response body, and with it the [`Relay`] and the engine's body;
//! - **not streamed** (the head comes only with the whole answer): the
//!   handler is still awaiting the engine when the client closes its
//!   connection. The request body has been read whole, so hyper's server
//!   keeps reading the client's connection for its end (it allows no half
//!   close), sees the EOF, and drops the handler's future, and with it the
//!   pending engine request. The same holds for a frontend in between: its
//!   client leaving closes its connection to this sidecar.
//!
//! A client that vanishes without closing (no FIN, no RST) is not seen
//! until the connection's own timeouts end it.
//!
//! llama.cpp does not notice the closed connection of a non-streamed
//! request while it is scraped often, so those are sent to it streamed and
//! answered whole (`engines/assemble.rs`): the permit is held while the
//! stream is read, and a client that leaves drops it.

use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use futures_util::{Stream, StreamExt as _};
use tokio::time::Instant;

use super::http::{admit, error_response, held_body, json_response, Held, Worker};
use crate::chunk_timeout::{self, Chunk, ChunkTimeout};
use crate::engines::assemble::{self, ReadError};
use crate::openai::SERVER_ERROR;
use crate::throttle::LogThrottle;
use crate::upstream_client;
use loadgate::engines::{Assembled, CompletionRoute};

/// The request-id header passed on to the engine.
const REQUEST_ID: &str = "x-request-id";

/// Warn lines about failing engine calls: a broken engine under load must
/// not flood the log.
static ENGINE_FAILURES: LogThrottle = LogThrottle::per_second(5);

/// The bounds on every wait for the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct EngineTimeouts {
    /// Opening a connection to the engine.
    pub(crate) connect: Duration,
    /// From sending a request to the first bytes of its response body.
    pub(crate) first_byte: Duration,
    /// Between two chunks of a relayed body.
    pub(crate) between_chunks: Duration,
}

/// The HTTP client to one engine and where it is.
#[derive(Debug)]
pub(crate) struct EngineProxy {
    client: reqwest::Client,
    /// `http://HOST:PORT`, no trailing `/`.
    base_url: String,
    timeouts: EngineTimeouts,
    /// Non-streamed requests are sent streamed and assembled (llama.cpp).
    assembles: bool,
}

impl EngineProxy {
    /// A proxy to the engine at `base_url` (no trailing `/`) over `client`;
    /// `assembles`: see [`loadgate::engines::EngineKind::assembles`].
    pub(crate) fn new(client: reqwest::Client, base_url: String, timeouts: EngineTimeouts, assembles: bool) -> Self {
        EngineProxy { client, base_url, timeouts, assembles }
    }
}

/// Takes an engine slot for the request (or answers the refusal), then
/// proxies it to the engine's `path`; the permit is held by the relayed
/// body (see the module docs).
pub(crate) async fn forward(
    worker: &Worker,
    proxy: &EngineProxy,
    path: &'static str,
    headers: &HeaderMap,
    body: Bytes,
) -> Response {
    let permit = match admit(worker).await {
        Ok(p) => p,
        Err(refusal) => return refusal,
    };
    let held = Held::new(permit, worker.in_flight.clone());
    let timeouts = proxy.timeouts;
    let first_byte_by = Instant::now() + timeouts.first_byte;
    let streamed = if proxy.assembles { assemble::streamed_body(&body).await } else { None };
    let (body, whole) = match streamed {
        Some(streamed) => (streamed, Some(route(path))),
        None => (body, None),
    };
    let content_type =
        headers.get(header::CONTENT_TYPE).cloned().unwrap_or_else(|| HeaderValue::from_static("application/json"));
    let mut request =
        proxy.client.post(format!("{}{path}", proxy.base_url)).header(header::CONTENT_TYPE, content_type).body(body);
    if proxy.assembles {
        // llama.cpp, the one engine whose answers are assembled.
        request = upstream_client::on_own_connection(request);
    }
    if let Some(id) = headers.get(REQUEST_ID) {
        request = request.header(REQUEST_ID, id.clone());
    }
    let upstream = match tokio::time::timeout_at(first_byte_by, request.send()).await {
        Ok(Ok(upstream)) => upstream,
        Ok(Err(error)) => {
            let what = if error.is_connect() { "cannot connect to the engine" } else { "the engine request failed" };
            let message = format!("{what}: {}", error_chain(&error));
            warn_failure(path, &message);
            return error_response(StatusCode::BAD_GATEWAY, SERVER_ERROR, None, &message);
        }
        Err(_) => return no_first_byte(path, timeouts.first_byte),
    };
    let status = StatusCode::from_u16(upstream.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let relayed: Vec<_> = [header::CONTENT_TYPE, header::CACHE_CONTROL]
        .into_iter()
        .filter_map(|name| upstream.headers().get(&name).cloned().map(|value| (name, value)))
        .collect();
    let upstream_type = upstream.headers().get(header::CONTENT_TYPE).cloned();
    let mut stream: EngineBody = Box::pin(upstream.bytes_stream());
    // The first bytes are awaited here so that an engine that sends its head
    // and then nothing still gets a 504 (nothing was relayed yet).
    let first = match tokio::time::timeout_at(first_byte_by, stream.next()).await {
        Ok(Some(Ok(chunk))) => Some(chunk),
        Ok(None) => None,
        Ok(Some(Err(error))) => {
            warn_failure(path, &format!("the engine's response broke before its first byte: {error}"));
            let message = format!("the engine's response broke: {}", error_chain(&error));
            return error_response(StatusCode::BAD_GATEWAY, SERVER_ERROR, None, &message);
        }
        Err(_) => return no_first_byte(path, timeouts.first_byte),
    };
    if let Some(route) = whole.filter(|_| status == StatusCode::OK && assemble::is_event_stream(upstream_type.as_ref()))
    {
        // Held until the stream is read: the engine works on it until then.
        let answer = assemble::read_whole(route, first, stream, timeouts.between_chunks, |_| {}).await;
        drop(held);
        return whole_response(path, answer);
    }
    let relay = Relay { first, engine: ChunkTimeout::new(stream, timeouts.between_chunks), path };
    let mut response = held_body(relay, held);
    *response.status_mut() = status;
    response.headers_mut().extend(relayed);
    response
}

/// The route of `path` (one of the two the sidecar proxies).
fn route(path: &str) -> CompletionRoute {
    if path.ends_with("/chat/completions") {
        CompletionRoute::ChatCompletions
    } else {
        CompletionRoute::Completions
    }
}

/// The client's answer from an assembled stream: the whole answer, the
/// engine's own error, or 504 (stalled) / 502 (any other failure).
fn whole_response(path: &str, answer: Result<Assembled, ReadError>) -> Response {
    match answer {
        Ok(Assembled::Answer(body)) => json_response(StatusCode::OK, body),
        Ok(Assembled::EngineError { status, body }) => {
            json_response(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), body)
        }
        Err(error) => {
            warn_failure(path, &error.to_string());
            let status = match error {
                ReadError::Stalled(_) => StatusCode::GATEWAY_TIMEOUT,
                _ => StatusCode::BAD_GATEWAY,
            };
            error_response(status, SERVER_ERROR, None, "the engine's answer could not be read")
        }
    }
}

/// 504: the engine sent no head, or no first byte, in time.
fn no_first_byte(path: &str, timeout: Duration) -> Response {
    warn_failure(path, &format!("no first byte from the engine within {timeout:?}"));
    let message = format!("the engine sent no answer within {timeout:?}");
    error_response(StatusCode::GATEWAY_TIMEOUT, SERVER_ERROR, None, &message)
}

fn warn_failure(path: &str, what: &str) {
    if let Some(suppressed) = ENGINE_FAILURES.admit() {
        tracing::warn!(path, suppressed, "{what}");
    }
}

/// An error and its sources, on one line.
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(e) = next {
        text.push_str(": ");
        text.push_str(&e.to_string());
        next = e.source();
    }
    text
}

type EngineBody = Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>;

/// The engine's response body on its way to the client, its first chunk
/// already read. Dropping it (client gone) drops the engine's body, which
/// closes that engine connection.
struct Relay {
    first: Option<Bytes>,
    engine: ChunkTimeout<EngineBody>,
    path: &'static str,
}

impl Stream for Relay {
    type Item = Result<Bytes, std::io::Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Some(first) = this.first.take() {
            return Poll::Ready(Some(Ok(first)));
        }
        Poll::Ready(match ready!(this.engine.poll_chunk(cx)) {
            Chunk::Data(chunk) => Some(Ok(chunk)),
            Chunk::Failed(error) => {
                warn_failure(this.path, &format!("the engine's response broke: {error}"));
                Some(Err(std::io::Error::other(error)))
            }
            Chunk::Ended => None,
            Chunk::Stalled => {
                let between = this.engine.between();
                warn_failure(this.path, &format!("the engine sent nothing for {between:?}; response cut"));
                Some(Err(chunk_timeout::stalled("engine")))
            }
        })
    }
}
