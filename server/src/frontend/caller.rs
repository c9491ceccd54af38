//! [`Caller`]: who sent a request — its tenant (the waiting line's turns
//! and caps, the metrics and the access log) and the highest class it may
//! claim.
//!
//! With `--tenants-file` the `Authorization: Bearer` key decides the
//! tenant; with `--trust-priority-header` too, a request without a known
//! key may name a tenant of the file in `x-loadgate-tenant` (a gateway that
//! authenticated it). Anything else is the file's `default` tenant. A
//! tenant's requests are lowered to its maximum class. Without the file
//! every request shares one tenant, labelled `other`, and may claim any
//! class the trust rules let it ([`crate::frontend::priority`]).

use std::sync::Arc;

use axum::http::HeaderMap;
use loadgate::{Class, Tenant};

use crate::frontend::tenants::{bearer, SharedTenants};

/// The header a trusted gateway names a tenant in.
pub(crate) const TENANT_HEADER: &str = "x-loadgate-tenant";

/// The label of the one tenant of a frontend without a tenants file.
pub(crate) const OTHER: &str = "other";

/// A request's tenant and what it may claim.
#[derive(Clone, Debug)]
pub(crate) struct Caller {
    /// As the waiting line sees it.
    pub(crate) tenant: Tenant,
    /// Its metric label and access-log name.
    pub(crate) label: Arc<str>,
    /// The highest class its requests get.
    pub(crate) max_class: Class,
}

impl Caller {
    /// `class` lowered to the caller's maximum.
    pub(crate) fn cap(&self, class: Class) -> Class {
        // `Class` orders the highest first.
        class.max(self.max_class)
    }
}

/// How the frontend tells callers apart.
#[derive(Debug)]
pub(crate) struct Callers {
    /// `--tenants-file`, reloaded on SIGHUP.
    tenants: Option<Arc<SharedTenants>>,
    /// `--trust-priority-header`: `x-loadgate-tenant` names a tenant.
    trusted: bool,
    /// The caller of every request without a tenants file.
    anyone: Caller,
}

impl Callers {
    pub(crate) fn new(tenants: Option<Arc<SharedTenants>>, trusted: bool) -> Self {
        let anyone = Caller { tenant: Tenant::default(), label: Arc::from(OTHER), max_class: Class::Critical };
        Callers { tenants, trusted, anyone }
    }

    /// The tenants of `--tenants-file` (reloaded on SIGHUP).
    pub(crate) fn file(&self) -> Option<&Arc<SharedTenants>> {
        self.tenants.as_ref()
    }

    /// The caller of a request with `headers`.
    pub(crate) fn of(&self, headers: &HeaderMap) -> Caller {
        let Some(shared) = &self.tenants else { return self.anyone.clone() };
        let tenants = shared.load();
        // Given twice, it names no tenant (as two `Authorization` headers
        // name none): a gateway that appends its value after the client's
        // would otherwise let the client's first one win.
        let named = || {
            let mut values = headers.get_all(TENANT_HEADER).iter();
            let (Some(value), None) = (values.next(), values.next()) else { return None };
            value.to_str().ok().and_then(|n| tenants.by_name(n))
        };
        let (index, tenant) = bearer(headers)
            .and_then(|key| tenants.by_key(key))
            .or_else(|| if self.trusted { named() } else { None })
            .unwrap_or_else(|| tenants.default_tenant());
        caller(tenants.line_id(index), tenant)
    }
}

/// The caller of a tenant of the file, known to the line as `line_id`.
fn caller(line_id: u32, tenant: &crate::frontend::tenants::Tenant) -> Caller {
    let line = Tenant {
        id: line_id,
        weight: tenant.weight,
        max_waiting: tenant.max_waiting.unwrap_or(usize::MAX),
        max_tokens: tenant.max_tokens.unwrap_or(u64::MAX),
    };
    Caller { tenant: line, label: Arc::from(tenant.name.as_str()), max_class: tenant.max_class }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frontend::tenants::{hash_key, Tenants};

    fn callers(trusted: bool) -> Callers {
        let file = format!(
            "[[tenant]]\nname = \"acme\"\nkeys = [\"{}\"]\nweight = 5\nmax_class = \"critical\"\nmax_waiting = 3\n\n\
             [[tenant]]\nname = \"batch\"\nkeys = [\"{}\"]\nmax_class = \"sheddable\"\n",
            hash_key("acme-key"),
            hash_key("batch-key"),
        );
        let tenants = Tenants::parse(&file, false, "t.toml").unwrap();
        Callers::new(Some(Arc::new(SharedTenants::new(tenants))), trusted)
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        pairs.iter().map(|(k, v)| (axum::http::HeaderName::from_static(k), v.parse().unwrap())).collect()
    }

    #[test]
    fn the_key_decides_and_the_class_is_capped() {
        let c = callers(false);
        let acme = c.of(&headers(&[("authorization", "Bearer acme-key")]));
        assert_eq!((&*acme.label, acme.tenant.id, acme.tenant.weight, acme.tenant.max_waiting), ("acme", 1, 5, 3));
        assert_eq!(acme.cap(Class::Critical), Class::Critical);
        let batch = c.of(&headers(&[("authorization", "Bearer batch-key")]));
        assert_eq!((&*batch.label, batch.cap(Class::Critical)), ("batch", Class::Sheddable));
        let nobody = c.of(&headers(&[("authorization", "Bearer wrong")]));
        assert_eq!((&*nobody.label, nobody.tenant.id, nobody.cap(Class::Critical)), ("default", 0, Class::Standard));
        assert_eq!(nobody.cap(Class::Sheddable), Class::Sheddable, "lowering oneself is allowed");
    }

    #[test]
    fn the_tenant_header_counts_only_when_trusted() {
        let named = headers(&[("x-loadgate-tenant", "acme")]);
        assert_eq!(&*callers(false).of(&named).label, "default");
        assert_eq!(&*callers(true).of(&named).label, "acme");
        let unknown = headers(&[("x-loadgate-tenant", "nobody")]);
        assert_eq!(&*callers(true).of(&unknown).label, "default");
        // A key wins over the header.
        let both = headers(&[("x-loadgate-tenant", "acme"), ("authorization", "Bearer batch-key")]);
        assert_eq!(&*callers(true).of(&both).label, "batch");
    }

    #[test]
    fn without_a_file_everyone_is_other() {
        let c = Callers::new(None, true);
        let caller = c.of(&headers(&[("x-loadgate-tenant", "acme"), ("authorization", "Bearer acme-key")]));
        assert_eq!(
            (&*caller.label, caller.tenant, caller.cap(Class::Critical)),
            ("other", Tenant::default(), Class::Critical)
        );
    }

    /// Two `x-loadgate-tenant` headers took the first: a gateway that
    /// appends its own value (Envoy's default) after the client's let the
    /// client pick its tenant (its weight, caps and `max_class`). Found by
    /// a review.
    #[test]
    fn a_repeated_tenant_header_names_no_tenant() {
        let mut map = HeaderMap::new();
        map.append(TENANT_HEADER, "acme".parse().unwrap());
        map.append(TENANT_HEADER, "batch".parse().unwrap());
        let caller = callers(true).of(&map);
        assert_eq!(&*caller.label, "default", "the client-sent first value decided the tenant");
        assert_eq!(&*callers(true).of(&headers(&[("x-loadgate-tenant", "acme")])).label, "acme");
    }
}
