//! What the observe layer shares between requests, the labels the proxy
//! sets as it learns them, and the access log's target.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use loadgate::Class;

use super::metrics::RequestMetrics;
use crate::frontend::state::Frontend;

/// The target of the access-log events.
pub(crate) const ACCESS_TARGET: &str = "loadgate::access";

/// What the proxy learns of a request as it goes: its tenant, then its
/// model and class, and its time in the model's waiting line. The layer
/// puts one into every request's extensions and keeps a clone, so a
/// request whose client leaves before its response (while it waits in the
/// line, say) is still counted and logged with what was known then.
#[derive(Clone, Debug, Default)]
pub(crate) struct Labels(Arc<Mutex<Known>>);

/// What [`Labels`] holds.
#[derive(Clone, Debug, Default)]
pub(super) struct Known {
    /// The model, as the client named it.
    pub(super) model: Option<Arc<str>>,
    /// Its priority class.
    pub(super) class: Option<Class>,
    /// A tenants file's name, or `other`.
    pub(super) tenant: Option<Arc<str>>,
    /// Time in the model's waiting line (`None`: the model has no line).
    pub(super) waited: Option<Duration>,
    /// When the wait going on now began.
    waiting_since: Option<Instant>,
}

impl Labels {
    fn known(&self) -> MutexGuard<'_, Known> {
        // A panic elsewhere cannot leave these fields half written.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The request's tenant (its caller's label).
    pub(crate) fn set_tenant(&self, tenant: Arc<str>) {
        self.known().tenant = Some(tenant);
    }

    /// The request's model and class, once its body is read.
    pub(crate) fn set_request(&self, model: &str, class: Class) {
        let mut known = self.known();
        known.model = Some(Arc::from(model));
        known.class = Some(class);
    }

    /// The request begins to wait in its model's line.
    pub(crate) fn wait_begins(&self) {
        self.known().waiting_since = Some(Instant::now());
    }

    /// The wait [`Labels::wait_begins`] began ended after `took`.
    pub(crate) fn wait_ends(&self, took: Duration) {
        let mut known = self.known();
        known.waited = Some(known.waited.unwrap_or_default() + took);
        known.waiting_since = None;
    }

    /// What is known now (a wait going on counted to now).
    pub(super) fn now(&self) -> Known {
        let mut known = self.known().clone();
        if let Some(since) = known.waiting_since.take() {
            known.waited = Some(known.waited.unwrap_or_default() + since.elapsed());
        }
        known
    }
}

/// What the layer shares between requests.
#[derive(Debug)]
pub(super) struct Observer {
    pub(super) frontend: Arc<Frontend>,
    pub(super) metrics: Arc<RequestMetrics>,
}
