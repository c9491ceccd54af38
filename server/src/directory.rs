//! [`WorkerDirectory`]: where each registered worker's HTTP server listens,
//! for the proxy, and whether it came from `--worker URL` (static: no event
//! connection owns it, so the event plane may not take its id).

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
    workers: RwLock<HashMap<WorkerId, Entry>>,
}

#[derive(Debug)]
struct Entry {
    address: WorkerAddress,
    /// Registered by `--worker URL`, not by an event connection.
    is_static: bool,
}

impl WorkerDirectory {
    /// Records (or replaces) the endpoint of `worker`, registered over the
    /// event plane. `http_addr` may be `HOST:PORT` or a URL. Returns false
    /// (and changes nothing) when `worker` is static.
    pub fn insert(&self, worker: WorkerId, http_addr: &str, dp_size: u32) -> bool {
        let mut workers = self.workers.write().unwrap_or_else(|e| e.into_inner());
        if workers.get(&worker).is_some_and(|e| e.is_static) {
            return false;
        }
        workers.insert(worker, Entry { address: address(http_addr, dp_size), is_static: false });
        true
    }

    /// Records (or replaces) the endpoint of a worker registered by
    /// `--worker URL`: static, so the event plane refuses its id.
    pub fn insert_static(&self, worker: WorkerId, http_addr: &str, dp_size: u32) {
        let entry = Entry { address: address(http_addr, dp_size), is_static: true };
        self.workers.write().unwrap_or_else(|e| e.into_inner()).insert(worker, entry);
    }

    /// Forgets `worker`; returns whether it was known.
    pub fn remove(&self, worker: WorkerId) -> bool {
        self.workers.write().unwrap_or_else(|e| e.into_inner()).remove(&worker).is_some()
    }

    /// `worker`'s endpoint, if known.
    pub fn get(&self, worker: WorkerId) -> Option<WorkerAddress> {
        self.workers.read().unwrap_or_else(|e| e.into_inner()).get(&worker).map(|e| e.address.clone())
    }

    /// Whether `worker` was registered by `--worker URL`.
    pub fn is_static(&self, worker: WorkerId) -> bool {
        self.workers.read().unwrap_or_else(|e| e.into_inner()).get(&worker).is_some_and(|e| e.is_static)
    }

    /// Whether `worker` is known.
    pub fn contains(&self, worker: WorkerId) -> bool {
        self.workers.read().unwrap_or_else(|e| e.into_inner()).contains_key(&worker)
    }

    /// How many workers are known.
    pub fn len(&self) -> usize {
        self.workers.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// True when no worker is known.
    pub fn is_empty(&self) -> bool {
        self.workers.read().unwrap_or_else(|e| e.into_inner()).is_empty()
    }

    /// Every known worker, sorted by id.
    #[cfg(test)]
    pub fn list(&self) -> Vec<(WorkerId, WorkerAddress)> {
        let mut all: Vec<_> = self
            .workers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(k, v)| (*k, v.address.clone()))
            .collect();
        all.sort_by_key(|(k, _)| *k);
        all
    }
}

/// `http_addr` (`HOST:PORT` or a URL) as a base URL without a trailing slash.
fn address(http_addr: &str, dp_size: u32) -> WorkerAddress {
    let base = http_addr.trim_end_matches('/');
    let base_url = if base.contains("://") { base.to_owned() } else { format!("http://{base}") };
    WorkerAddress { base_url: Arc::from(base_url), dp_size }
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

    #[test]
    fn static_workers_are_not_replaced_by_the_event_plane() {
        let d = WorkerDirectory::default();
        d.insert_static(3, "127.0.0.1:80", 1);
        assert!(d.is_static(3));
        assert!(!d.insert(3, "127.0.0.1:99", 1), "an event registration may not take a static id");
        assert_eq!(d.get(3).unwrap().base_url.as_ref(), "http://127.0.0.1:80");
        assert!(d.insert(4, "127.0.0.1:81", 1));
        assert!(!d.is_static(4));
        assert!(d.contains(4));
        assert_eq!(d.len(), 2);
    }
}
