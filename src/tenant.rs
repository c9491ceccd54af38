//! [`Tenant`]: whose request it is, as a waiting line sees it — an id the
//! caller assigns, a weight for sharing dispatches, and caps on what the
//! tenant may hold in the line.
//!
//! Within a class, a line shares its dispatches among the tenants waiting
//! by deficit round robin charged in prompt tokens: each round a tenant is
//! credited its weight in tokens and a waiter leaves when its tenant's
//! credit covers its prompt, so two backlogged tenants of equal weight get
//! equal prompt tokens, whatever their arrival rates.

/// A request's tenant ([`Tenant::default`]: id 0, weight 1, no caps).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tenant {
    /// Which tenant (the caller's numbering; requests of one id share its
    /// turn and its caps).
    pub id: u32,
    /// Its share of dispatches within a class, relative to the others
    /// (at least 1; 0 counts as 1).
    pub weight: u32,
    /// The most requests it may have waiting in a line at once.
    pub max_waiting: usize,
    /// The most prompt tokens it may have waiting in a line at once.
    pub max_tokens: u64,
}

impl Default for Tenant {
    fn default() -> Self {
        Tenant { id: 0, weight: 1, max_waiting: usize::MAX, max_tokens: u64::MAX }
    }
}

impl Tenant {
    /// Tenant `id` with `weight` and no caps.
    pub fn new(id: u32, weight: u32) -> Self {
        Tenant { id, weight, ..Tenant::default() }
    }

    /// Its weight, at least 1.
    pub(crate) fn quantum(&self) -> u64 {
        u64::from(self.weight.max(1))
    }
}
