//! [`EngineProxy`]: the sidecar's request path to its engine. A request
//! that passed the hard cap is sent to the engine's same path (the body as
//! received, its `Content-Type` and `x-request-id`) as one attempt
//! (`upstream/`), and the engine's status, `Content-Type` and body come
//! back: chunk by chunk as the engine sends them (a stream token by token,
//! a whole answer whole), or assembled whole for llama.cpp's non-streamed
//! requests. The engine slot is held until the engine's answer has been
//! read, whether or not the client has read it yet.
//!
//! # A client that leaves
//!
//! Dropping the engine request closes its connection (hyper's client
//! closes a connection whose response, or whose body, nobody waits for
//! any more), and the engine frees the slot. The request is dropped when:
//!
//! - **streamed**: the client's body is dropped (the client closed, or its
//!   connection was cut for write progress); the relay sees it at once;
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

use std::sync::Arc;

use axum::body::Bytes;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::Response;
use loadgate::engines::CompletionRoute;
use loadgate::rejection::REFUSAL_HEADER;

use crate::http_server::BodyBudget;
use crate::openai::SERVER_ERROR;
use crate::upstream::{self, Failure, Outcome, Payload, Peer, Timeouts, Watcher, REFUSAL_NOT_REACHED};
use crate::worker::gate::{at_capacity, Gate, Held};
use crate::worker::reply::error_response;

/// The request-id header passed on to the engine.
const REQUEST_ID: &str = "x-request-id";

/// The HTTP client to one engine and where it is.
#[derive(Debug)]
pub(crate) struct EngineProxy {
    client: reqwest::Client,
    /// `http://HOST:PORT`, no trailing `/`.
    base_url: String,
    timeouts: Timeouts,
    /// Non-streamed requests are sent streamed and assembled (llama.cpp).
    assembles: bool,
}

impl EngineProxy {
    /// A proxy to the engine at `base_url` (no trailing `/`) over `client`;
    /// `assembles`: see [`loadgate::engines::EngineKind::assembles`].
    pub(crate) fn new(client: reqwest::Client, base_url: String, timeouts: Timeouts, assembles: bool) -> Self {
        EngineProxy { client, base_url, timeouts, assembles }
    }

    /// Takes an engine slot for the request (or answers the refusal), then
    /// sends it to the engine's `path`.
    pub(crate) async fn forward(
        &self,
        gate: &Gate,
        bodies: &Arc<BodyBudget>,
        path: &'static str,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Response {
        let held = match gate.admit().await {
            Ok(held) => held,
            Err(refusal) => return refusal,
        };
        let route = if path.ends_with("/chat/completions") {
            CompletionRoute::ChatCompletions
        } else {
            CompletionRoute::Completions
        };
        let content_type =
            headers.get(header::CONTENT_TYPE).cloned().unwrap_or_else(|| HeaderValue::from_static("application/json"));
        let mut request =
            self.client.post(format!("{}{path}", self.base_url)).header(header::CONTENT_TYPE, content_type);
        if let Some(id) = headers.get(REQUEST_ID) {
            request = request.header(REQUEST_ID, id.clone());
        }
        let payload = Payload::new(route, body, bodies.clone());
        let outcome = upstream::attempt(request, &payload, self.assembles, self.timeouts, Peer::Engine, held).await;
        match outcome {
            Outcome::Answer(response) => response,
            // An engine behind a loadgate worker of its own: refused as this one's cap would.
            Outcome::AtCapacity => at_capacity(),
            Outcome::ProofRefused => {
                error_response(Failure::Proof.status(), SERVER_ERROR, None, "the engine refused the request proof")
            }
            // This worker's own body budget could not take the rewrite for
            // the engine: refused as a body it cannot buffer is (503), not
            // blamed on the engine (nothing is wrong with it).
            Outcome::Failed(Failure::OverBudget) => bodies.over_budget(),
            // Nothing ran: the frontend may send it to another worker.
            Outcome::Failed(failure) => {
                let message = format!("the engine did not take the request ({})", failure.label());
                let mut response = error_response(failure.status(), SERVER_ERROR, None, &message);
                response.headers_mut().insert(REFUSAL_HEADER, HeaderValue::from_static(REFUSAL_NOT_REACHED));
                response
            }
            Outcome::Cut(failure) => {
                let message = format!("the engine gave no usable answer ({})", failure.label());
                error_response(failure.status(), SERVER_ERROR, None, &message)
            }
        }
    }
}

/// The answer to a request while the engine serves another model than the
/// worker's (`why`, from `reports.rs`): not sent (llama.cpp would answer it
/// with the other model), 502 with the signal that nothing ran, so a
/// frontend that still routes here sends it to another worker.
pub(crate) fn other_model(why: &str) -> Response {
    let message = format!("the request was not sent to the engine: {why}");
    let mut response = error_response(axum::http::StatusCode::BAD_GATEWAY, SERVER_ERROR, None, &message);
    response.headers_mut().insert(REFUSAL_HEADER, HeaderValue::from_static(REFUSAL_NOT_REACHED));
    response
}

/// A forwarded request's engine slot, held while the engine answers.
impl Watcher for Held {}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::http::StatusCode;

    use super::*;

    /// Found by a review: a llama.cpp request whose rewrite to a stream did
    /// not fit in the worker's body budget was answered 502 "the engine did
    /// not take the request (frontend_over_budget)" with
    /// `x-loadgate-refusal: engine-not-reached`, so a frontend quarantined
    /// this worker as if its engine were down. It is the worker's own
    /// limit: 503 with a retry hint, as for a body it cannot buffer.
    #[tokio::test]
    async fn a_rewrite_over_the_body_budget_is_the_workers_503_not_the_engines_502() {
        let bodies = BodyBudget::new(1, 1);
        let _spent = bodies.adopt(vec![0; 1 << 20]).expect("an empty budget takes 1 MiB");
        // Never reached: the rewrite fails before anything is sent.
        let timeouts = Timeouts {
            connect: Duration::from_secs(1),
            first_byte: Duration::from_secs(1),
            between_chunks: Duration::from_secs(1),
        };
        let proxy = EngineProxy::new(reqwest::Client::new(), "http://127.0.0.1:1".to_owned(), timeouts, true);
        let body = Bytes::from_static(br#"{"model":"m","prompt":"hi","max_tokens":2}"#);
        let response = proxy.forward(&Gate::new(None), &bodies, "/v1/completions", &HeaderMap::new(), body).await;
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(response.headers().get(REFUSAL_HEADER).is_none(), "not a refusal the frontend acts on");
        assert!(response.headers().contains_key(header::RETRY_AFTER));
    }
}
