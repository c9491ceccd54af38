//! Observability of the inference listener: a request id on every response,
//! one structured access-log line per request, and the request counters and
//! histograms of `/metrics`.
//!
//! [`layer`] wraps every route of the inference listener, its 404 and 405
//! fallbacks included. For each request it
//! - takes the client's `x-request-id` when well formed (visible ASCII, at
//!   most 128 bytes), else makes one ([`RequestId`]); puts it into the
//!   request's extensions and its `x-request-id` header before the handler
//!   (the proxy forwards it to the worker) and sets it on the response;
//! - when the response body ends, fails, or is dropped (the client went
//!   away), counts the request in [`RequestMetrics`] (`metrics.rs`: the
//!   families and their labels) and writes one `info` event with target
//!   `loadgate::access` (`tracked.rs`): `request_id`, `method`, `path`
//!   (bytes outside printable ASCII, `"` and `\` percent-encoded),
//!   `status`, `model` (as the request named it, quoted; `none` before
//!   its body was read), `duration_ms`, `ttft_ms` (to the first body frame),
//!   `bytes`, `client_gone`, `body_error`, `waited_ms` (in the model's
//!   waiting line, up to the end of the request or of its client; `none`
//!   when the model has no line), `reason` (an overload refusal's
//!   `x-loadgate-rejected-reason`, else `none`), `class` (`critical`,
//!   `standard`, `sheddable`; `none` before the body was read) and `tenant`
//!   (a tenants file's name or `other`; `none` for a request that is not an
//!   inference request). The proxy sets these as it learns them
//!   ([`Labels`], in the request's extensions), so a request whose client
//!   goes away before its response is counted and logged with them too.
//!
//! The access log is off by default (`logging.rs`); `RUST_LOG=info` turns it
//! on with everything else, `RUST_LOG=warn,loadgate::access=info` alone.
//!
//! | file | what it is |
//! |---|---|
//! | `request_id.rs` | [`RequestId`], the `x-request-id` header |
//! | `route.rs` | the `endpoint` label and how a response ended |
//! | `tracked.rs` | the body wrapper that records a request at its end |
//! | `observer.rs` | what the layer shares, the model label, the log target |
//! | `metrics.rs` | [`RequestMetrics`]: its prometheus-client families |
//! | `buckets.rs` | Dynamo's histogram buckets |

mod buckets;
mod metrics;
mod observer;
mod request_id;
mod route;
mod tenants;
mod tracked;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;

pub(crate) use self::metrics::RequestMetrics;
pub(crate) use self::observer::Labels;
use self::observer::Observer;
pub(crate) use self::request_id::{RequestId, REQUEST_ID_HEADER};
use self::route::Route;
use self::tracked::{Head, Pending};
use crate::frontend::state::Frontend;

/// Wraps the inference routes with the request id, the access log and the
/// request metrics. `/metrics` finds the metrics as an
/// `Extension<Arc<RequestMetrics>>` of its request.
pub(crate) fn layer(router: axum::Router, frontend: Arc<Frontend>) -> axum::Router {
    let observer = Arc::new(Observer { frontend, metrics: Arc::default() });
    router.layer(axum::middleware::from_fn_with_state(observer, observe))
}

/// The middleware of [`layer`].
async fn observe(State(observer): State<Arc<Observer>>, mut request: Request, next: Next) -> Response {
    let id = RequestId::from_headers(request.headers());
    let head = Head::new(id.clone(), request.method(), request.uri().path());
    // The handler sees the id it is given, as an extension and as the
    // header (a malformed incoming one replaced).
    request.headers_mut().insert(REQUEST_ID_HEADER, id.header_value().clone());
    request.extensions_mut().insert(id.clone());
    if head.route == Route::Metrics {
        request.extensions_mut().insert(observer.metrics.clone());
    }
    let labels = Labels::default();
    request.extensions_mut().insert(labels.clone());
    let pending = Pending::new(observer, head, labels);
    let mut response = next.run(request).await;
    response.headers_mut().insert(REQUEST_ID_HEADER, id.header_value().clone());
    pending.respond(response)
}

#[cfg(test)]
mod tests;
