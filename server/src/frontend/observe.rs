//! Observability of the inference routes: a request id on every response,
//! one structured access-log line per request, and the request histograms
//! and per-status counters of `/metrics`.
//!
//! (Scaffold: filled in by the observability change of issue 10.)

use std::sync::Arc;

use crate::frontend::state::Frontend;

/// The model a proxied response was for, set by the proxy as a response
/// extension so the layer can label what it records.
#[derive(Clone, Debug)]
pub(crate) struct ModelLabel(pub(crate) Arc<str>);

/// Wraps the inference routes with the request id, the access log and the
/// request metrics.
pub(crate) fn layer(router: axum::Router, frontend: Arc<Frontend>) -> axum::Router {
    let _ = frontend;
    router
}
