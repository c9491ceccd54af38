//! [`Tenant`]: one tenant of a tenants file, as parsed and validated.

use std::fmt;

use loadgate::Class;

/// The tenant of requests with no key or an unknown one.
pub(crate) const DEFAULT_TENANT: &str = "default";

/// One tenant of the file.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Tenant {
    /// Its name (`[a-z0-9_-]{1,64}`).
    pub(crate) name: String,
    /// Its share when tenants compete (1..=1000).
    pub(crate) weight: u32,
    /// The highest class its requests may claim.
    pub(crate) max_class: Class,
    /// The most requests it may have waiting.
    pub(crate) max_waiting: Option<usize>,
    /// The most prompt tokens it may have queued.
    pub(crate) max_tokens: Option<u64>,
    /// The SHA-256 hashes of its API keys.
    pub(super) keys: Vec<[u8; 32]>,
}

impl fmt::Debug for Tenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tenant")
            .field("name", &self.name)
            .field("weight", &self.weight)
            .field("max_class", &self.max_class)
            .field("max_waiting", &self.max_waiting)
            .field("max_tokens", &self.max_tokens)
            .field("keys", &self.keys.len())
            .finish()
    }
}

impl Tenant {
    /// The `default` tenant of a file that names none.
    pub(super) fn implicit_default() -> Tenant {
        Tenant {
            name: DEFAULT_TENANT.to_owned(),
            weight: 1,
            max_class: Class::Standard,
            max_waiting: None,
            max_tokens: None,
            keys: Vec::new(),
        }
    }
}
