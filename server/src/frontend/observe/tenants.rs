//! [`TenantCounts`]: the inference requests of each tenant by outcome —
//! `loadgate_frontend_tenant_requests_total{tenant, outcome}`.
//!
//! The `tenant` label is bounded: the names of the tenants file (the
//! caller's label the proxy sets, [`Labels`](super::Labels)), or `other`
//! without one.
//! `outcome` is `ok` (2xx), `rejected` (529: overloaded), `error` (any
//! other status) or `cancelled` (the client went away first).

use std::fmt;
use std::sync::Arc;

use axum::http::StatusCode;
use loadgate::metrics::LabelText;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::route::End;

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct TenantLabels {
    tenant: Name,
    outcome: &'static str,
}

/// Every `outcome` [`TenantCounts::count`] gives.
const OUTCOMES: [&str; 4] = ["ok", "rejected", "error", "cancelled"];

/// A tenant's name as a label value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Name(Arc<str>);

impl EncodeLabelValue for Name {
    /// The name, escaped ([`LabelText`]).
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> fmt::Result {
        LabelText(&self.0).encode(encoder)
    }
}

/// The per-tenant request counters.
#[derive(Debug, Default)]
pub(super) struct TenantCounts(Family<TenantLabels, Counter>);

impl TenantCounts {
    /// Counts one request of `tenant` that ended with `status` (none: the
    /// client went away before the response) and `end`.
    pub(super) fn count(&self, tenant: &Arc<str>, status: Option<StatusCode>, end: End) {
        let outcome = match (status, end) {
            (_, End::ClientGone) | (None, _) => "cancelled",
            (Some(s), _) if s.is_success() => "ok",
            (Some(s), _) if s.as_u16() == 529 => "rejected",
            _ => "error",
        };
        self.0.get_or_create(&TenantLabels { tenant: Name(tenant.clone()), outcome }).inc();
    }

    /// Ends the series of `tenant` (a name the tenants file no longer has).
    pub(super) fn forget(&self, tenant: &str) {
        for outcome in OUTCOMES {
            self.0.remove(&TenantLabels { tenant: Name(Arc::from(tenant)), outcome });
        }
    }

    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "loadgate_frontend_tenant_requests",
            "Inference requests of each tenant by outcome (ok, rejected, error, cancelled)",
            self.0.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_are_counted_per_tenant() {
        let counts = TenantCounts::default();
        let acme: Arc<str> = Arc::from("acme");
        counts.count(&acme, Some(StatusCode::OK), End::Complete);
        counts.count(&acme, StatusCode::from_u16(529).ok(), End::Complete);
        counts.count(&acme, Some(StatusCode::OK), End::ClientGone);
        counts.count(&Arc::from("other"), Some(StatusCode::BAD_REQUEST), End::Complete);
        let mut registry = Registry::default();
        counts.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            r#"loadgate_frontend_tenant_requests_total{tenant="acme",outcome="ok"} 1"#,
            r#"loadgate_frontend_tenant_requests_total{tenant="acme",outcome="rejected"} 1"#,
            r#"loadgate_frontend_tenant_requests_total{tenant="acme",outcome="cancelled"} 1"#,
            r#"loadgate_frontend_tenant_requests_total{tenant="other",outcome="error"} 1"#,
        ] {
            assert!(text.contains(line), "{line} missing in\n{text}");
        }
        counts.forget("acme");
        let mut registry = Registry::default();
        counts.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(!text.contains("acme"), "acme's series end:\n{text}");
        assert!(text.contains(r#"tenant="other",outcome="error"} 1"#), "others stay:\n{text}");
    }
}
