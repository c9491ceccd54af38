//! What the observe layer shares between requests, the model label the
//! proxy sets, and the access log's target.

use std::sync::Arc;

use super::metrics::RequestMetrics;
use crate::frontend::state::Frontend;

/// The target of the access-log events.
pub(crate) const ACCESS_TARGET: &str = "loadgate::access";

/// The model a proxied response was for, set by the proxy as a response
/// extension so the layer can label what it records.
#[derive(Clone, Debug)]
pub(crate) struct ModelLabel(pub(crate) Arc<str>);

/// What the layer shares between requests.
#[derive(Debug)]
pub(super) struct Observer {
    pub(super) frontend: Arc<Frontend>,
    pub(super) metrics: Arc<RequestMetrics>,
}
