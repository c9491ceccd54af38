//! [`WorkerDirectory`]: where each registered worker's HTTP server listens,
//! for the proxy.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use loadgate::WorkerId;

/// A worker's HTTP endpoint as the proxy needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerAddress {
    /// Base URL without a trailing slash, e.g. `http://127.0.0.1:8001`.
    pub base_url: Arc<str>,
    /// The worker's data-parallel size (ranks the router tracks load on).
    pub dp_size: u32,
}

/// Maps worker ids to their HTTP endpoints. Written on registration and
/// deregistration (cold), read once per proxied request.
#[derive(Debug, Default)]
pub struct WorkerDirectory {
    // A read-write lock: many concurrent readers, rare writers.
    workers: RwLock<HashMap<WorkerId, WorkerAddress>>,
}

impl WorkerDirectory {
    /// Records (or replaces) `worker`'s endpoint. `http_addr` may be
    /// `HOST:PORT` or a URL.
    pub fn insert(&self, worker: WorkerId, http_addr: &str, dp_size: u32) {
        let base = http_addr.trim_end_matches('/');
        let base_url = if base.contains("://") { base.to_owned() } else { format!("http://{base}") };
        let address = WorkerAddress { base_url: Arc::from(base_url), dp_size };
        self.workers.write().unwrap_or_else(|e| e.into_inner()).insert(worker, address);
    }

    /// Forgets `worker`; returns whether it was known.
    pub fn remove(&self, worker: WorkerId) -> bool {
        self.workers.write().unwrap_or_else(|e| e.into_inner()).remove(&worker).is_some()
    }

    /// `worker`'s endpoint, if known.
    pub fn get(&self, worker: WorkerId) -> Option<WorkerAddress> {
        self.workers.read().unwrap_or_else(|e| e.into_inner()).get(&worker).cloned()
    }

    /// True when no worker is known.
    pub fn is_empty(&self) -> bool {
        self.workers.read().unwrap_or_else(|e| e.into_inner()).is_empty()
    }

    /// Every known worker, sorted by id.
    #[cfg(test)]
    pub fn list(&self) -> Vec<(WorkerId, WorkerAddress)> {
        let mut all: Vec<_> =
            self.workers.read().unwrap_or_else(|e| e.into_inner()).iter().map(|(k, v)| (*k, v.clone())).collect();
        all.sort_by_key(|(k, _)| *k);
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_become_urls() {
        let d = WorkerDirectory::default();
        d.insert(1, "127.0.0.1:80", 2);
        d.insert(2, "http://127.0.0.1:81/", 1);
        assert_eq!(d.get(1).unwrap().base_url.as_ref(), "http://127.0.0.1:80");
        assert_eq!(d.get(2).unwrap().base_url.as_ref(), "http://127.0.0.1:81");
        assert_eq!(d.list().len(), 2);
        assert!(d.remove(1));
        assert!(!d.remove(1));
        assert_eq!(d.get(1), None);
    }
}
