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

/// The priority class of a proxied request (set by the proxy), for the
/// access log.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ClassLabel(pub(crate) loadgate::Class);

/// The tenant of a proxied request (set by the proxy: a name of the
/// tenants file, or `other`), for the access log and the tenant counters.
#[derive(Clone, Debug)]
pub(crate) struct TenantLabel(pub(crate) Arc<str>);

/// How long a proxied request waited in its model's waiting line (set by
/// the proxy when the model has a line), for the access log.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Waited(pub(crate) std::time::Duration);

/// What the layer shares between requests.
#[derive(Debug)]
pub(super) struct Observer {
    pub(super) frontend: Arc<Frontend>,
    pub(super) metrics: Arc<RequestMetrics>,
}
