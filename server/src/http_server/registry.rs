//! [`Registry`]: the open connections of one listener, which of them are
//! idle and since when, so that at the connection limit (or out of file
//! descriptors) the idle connection unused longest can be closed first, and
//! a graceful drain knows when every in-flight response has finished.
//!
//! A connection is *busy* while at least one request is in service on it:
//! from the moment hyper hands the request to the service until the
//! response body has ended or been dropped ([`Busy`] is held by the body).
//! Otherwise it is *idle*, a fresh connection that has sent nothing (or only
//! part of a request head) included. Idle connections sit in a `BTreeMap`
//! keyed by a stamp taken when they became idle, so the one unused longest
//! is the first key: admitting, evicting, and every busy/idle transition
//! are `O(log n)` under one short mutex, never a scan.
//!
//! Each connection's task owns a [`Slot`] and waits on its wake-up
//! ([`Slot::woken`]); the registry wakes it when it is asked to close
//! (evicted), when a drain starts, and, during a drain, when it turns busy.
//! The task then reads [`Slot::status`] and acts (see `connection.rs`).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// The open connections of one listener.
#[derive(Debug)]
pub(super) struct Registry {
    /// Open connections at most, those already asked to close not counted;
    /// at it the idle one unused longest is closed.
    limit: usize,
    /// Connections already asked to close that may still hold their socket,
    /// at most (past it a new connection is refused: closing connections
    /// still hold descriptors).
    max_closing: usize,
    inner: Mutex<Inner>,
    /// Woken, during a drain, when the last busy or closing connection ends
    /// its request or closes.
    settled: Notify,
}

#[derive(Debug, Default)]
struct Inner {
    /// Source of connection ids and idle stamps (increasing).
    next: u64,
    /// Connections with a request in service.
    busy: usize,
    /// Connections asked to close (evicted, idle past the timeout, or told
    /// to finish during a drain) whose task has not ended yet.
    closing: usize,
    /// A drain has started.
    draining: bool,
    conns: HashMap<u64, Entry>,
    /// Idle connections that may be evicted, by the stamp taken when they
    /// became idle: the first is the one unused longest.
    idle: BTreeMap<u64, u64>,
}

#[derive(Debug)]
struct Entry {
    /// Requests in service (HTTP/2 carries several at once).
    in_flight: usize,
    /// Its key in `idle` while idle and not closing.
    idle_stamp: Option<u64>,
    /// When it last became idle (or opened).
    idle_since: Instant,
    /// Asked to close (evicted or idle past the timeout, or draining).
    closing: bool,
    /// Asked to close by the registry (its task must close it now).
    evicted: bool,
    wake: Arc<Notify>,
}

/// What a connection's task must know when it wakes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Status {
    /// The registry asked it to close (limit reached or out of descriptors).
    pub evicted: bool,
    /// The listener is draining.
    pub draining: bool,
    /// A request is in service on it.
    pub busy: bool,
}

impl Registry {
    /// A registry admitting at most `limit` (at least 1) open connections.
    pub(super) fn new(limit: usize) -> Arc<Registry> {
        let limit = limit.max(1);
        Arc::new(Registry {
            limit,
            max_closing: (limit / 4).max(64),
            inner: Mutex::new(Inner::default()),
            settled: Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a new connection. At the limit, first asks the idle
    /// connection unused longest to close; `None` (refuse it) when there is
    /// none, or when too many are still closing. A connection that has
    /// already sent bytes (`sent`: its request is on its way) is not idle
    /// until its first request ends; one that has sent nothing is idle.
    pub(super) fn admit(self: &Arc<Self>, sent: bool) -> Option<Slot> {
        let mut inner = self.lock();
        let open = inner.conns.len() - inner.closing;
        if open >= self.limit && (inner.closing >= self.max_closing || !inner.evict_oldest_idle()) {
            return None;
        }
        inner.next += 1;
        let id = inner.next;
        let wake = Arc::new(Notify::new());
        // A fresh connection that sent nothing is idle (may be evicted).
        let idle_stamp = (!sent).then_some(id);
        if !sent {
            inner.idle.insert(id, id);
        }
        let entry = Entry {
            in_flight: 0,
            idle_stamp,
            idle_since: Instant::now(),
            closing: false,
            evicted: false,
            wake: wake.clone(),
        };
        inner.conns.insert(id, entry);
        Some(Slot { registry: self.clone(), id, wake })
    }

    /// Asks the idle connection unused longest to close (out of file
    /// descriptors); false when none is idle.
    pub(super) fn evict_oldest_idle(&self) -> bool {
        self.lock().evict_oldest_idle()
    }

    /// Open connections (those closing included).
    pub(super) fn open(&self) -> usize {
        self.lock().conns.len()
    }

    /// Connections with a request in service, and those closing.
    pub(super) fn unsettled(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.busy, inner.closing)
    }

    /// Starts a drain: every connection is woken to finish what it serves
    /// (busy ones close after their response; idle ones may carry one more
    /// request, answered with `connection: close`).
    pub(super) fn start_drain(&self) {
        let mut inner = self.lock();
        inner.draining = true;
        for entry in inner.conns.values() {
            entry.wake.notify_one();
        }
    }

    /// Waits until no request is in service and no connection is closing,
    /// or `deadline`; true when settled.
    pub(super) async fn settled(&self, deadline: tokio::time::Instant) -> bool {
        loop {
            let notified = self.settled.notified();
            tokio::pin!(notified);
            // Registered before the check, so a wake-up in between is kept.
            notified.as_mut().enable();
            if self.unsettled() == (0, 0) {
                return true;
            }
            // A periodic re-check besides the wake-up: cheap, and robust.
            let recheck = tokio::time::Instant::now() + Duration::from_millis(50);
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until(recheck.min(deadline)) => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return self.unsettled() == (0, 0);
            }
        }
    }

    fn notify_if_settled(&self, inner: &Inner) {
        if inner.draining && inner.busy == 0 && inner.closing == 0 {
            self.settled.notify_waiters();
        }
    }
}

impl Inner {
    /// Marks the idle connection unused longest as evicted and wakes it.
    fn evict_oldest_idle(&mut self) -> bool {
        let Some((_, id)) = self.idle.pop_first() else { return false };
        let Some(entry) = self.conns.get_mut(&id) else { return false };
        entry.idle_stamp = None;
        entry.evicted = true;
        if !entry.closing {
            entry.closing = true;
            self.closing += 1;
        }
        entry.wake.notify_one();
        true
    }
}

/// One open connection's place in its [`Registry`]; dropping it (when the
/// connection's task ends) removes the connection.
#[derive(Debug)]
pub(super) struct Slot {
    registry: Arc<Registry>,
    id: u64,
    wake: Arc<Notify>,
}

impl Slot {
    /// A handle for the connection's service (cloned per request).
    pub(super) fn handle(&self) -> SlotHandle {
        SlotHandle { registry: self.registry.clone(), id: self.id }
    }

    /// Resolves when the registry woke this connection (see [`Status`]); a
    /// wake-up sent while nobody waited is kept for the next call.
    pub(super) async fn woken(&self) {
        self.wake.notified().await;
    }

    /// Its state now.
    pub(super) fn status(&self) -> Status {
        let inner = self.registry.lock();
        let entry = inner.conns.get(&self.id);
        Status {
            evicted: entry.is_some_and(|e| e.evicted),
            draining: inner.draining,
            busy: entry.is_some_and(|e| e.in_flight > 0),
        }
    }

    /// How long it has been idle (`None`: busy).
    pub(super) fn idle_for(&self, now: Instant) -> Option<Duration> {
        let inner = self.registry.lock();
        let entry = inner.conns.get(&self.id)?;
        (entry.in_flight == 0).then(|| now.saturating_duration_since(entry.idle_since))
    }

    /// A connection admitted with bytes already sent whose first request
    /// has not started within [`SENT_GRACE`](super::connection::SENT_GRACE)
    /// becomes evictable, as the idle connection unused longest (its
    /// admission stamp is older than any later idle one): a client that
    /// sends one byte on many connections cannot hold them all past the
    /// limit. Does nothing for a connection that is busy, idle or closing.
    pub(super) fn evictable_if_unused(&self) {
        let mut inner = self.registry.lock();
        let Inner { conns, idle, .. } = &mut *inner;
        if let Some(entry) = conns.get_mut(&self.id) {
            if entry.in_flight == 0 && entry.idle_stamp.is_none() && !entry.closing {
                entry.idle_stamp = Some(self.id);
                idle.insert(self.id, self.id);
            }
        }
    }

    /// It is closing (its task called hyper's graceful shutdown): never
    /// evicted again, and a drain waits for it to close.
    pub(super) fn mark_closing(&self) {
        let mut inner = self.registry.lock();
        let Inner { conns, idle, closing, .. } = &mut *inner;
        if let Some(entry) = conns.get_mut(&self.id) {
            if let Some(stamp) = entry.idle_stamp.take() {
                idle.remove(&stamp);
            }
            if !entry.closing {
                entry.closing = true;
                *closing += 1;
            }
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut inner = self.registry.lock();
        if let Some(entry) = inner.conns.remove(&self.id) {
            if let Some(stamp) = entry.idle_stamp {
                inner.idle.remove(&stamp);
            }
            if entry.in_flight > 0 {
                inner.busy -= 1;
            }
            if entry.closing {
                inner.closing -= 1;
            }
        }
        self.registry.notify_if_settled(&inner);
    }
}

/// What a connection's service holds: marks requests in service.
#[derive(Clone, Debug)]
pub(super) struct SlotHandle {
    registry: Arc<Registry>,
    id: u64,
}

impl SlotHandle {
    /// A request starts: the connection is busy until the returned guard
    /// (held by the response body) drops.
    pub(super) fn busy(&self) -> Busy {
        let mut inner = self.registry.lock();
        let Inner { conns, idle, busy, draining, .. } = &mut *inner;
        if let Some(entry) = conns.get_mut(&self.id) {
            entry.in_flight += 1;
            if entry.in_flight == 1 {
                *busy += 1;
                if let Some(stamp) = entry.idle_stamp.take() {
                    idle.remove(&stamp);
                }
                if *draining {
                    // Its task finishes this request and then closes.
                    entry.wake.notify_one();
                }
            }
        }
        Busy { registry: self.registry.clone(), id: self.id }
    }
}

/// A request in service on a connection; dropping it ends it.
#[derive(Debug)]
pub(super) struct Busy {
    registry: Arc<Registry>,
    id: u64,
}

impl Drop for Busy {
    fn drop(&mut self) {
        let mut inner = self.registry.lock();
        inner.next += 1;
        let stamp = inner.next;
        let Inner { conns, idle, busy, .. } = &mut *inner;
        // Gone: the connection closed first (its Slot already counted it).
        let Some(entry) = conns.get_mut(&self.id) else { return };
        entry.in_flight = entry.in_flight.saturating_sub(1);
        if entry.in_flight == 0 {
            *busy -= 1;
            entry.idle_since = Instant::now();
            if !entry.closing {
                entry.idle_stamp = Some(stamp);
                idle.insert(stamp, self.id);
            }
        }
        self.registry.notify_if_settled(&inner);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_the_limit_the_idle_connection_unused_longest_is_evicted() {
        let registry = Registry::new(2);
        let a = registry.admit(false).unwrap();
        let b = registry.admit(false).unwrap();
        // a turns busy, then idle again: b is now the idle one unused longest.
        drop(a.handle().busy());
        let _c = registry.admit(false).unwrap();
        assert!(registry_status(&b).evicted, "b was idle longest");
        assert!(!registry_status(&a).evicted);
        assert_eq!(registry.open(), 3, "b still holds its socket until its task ends");
        drop(b);
        assert_eq!(registry.open(), 2);
    }

    #[test]
    fn busy_connections_are_never_evicted_and_a_full_busy_set_refuses() {
        let registry = Registry::new(2);
        let a = registry.admit(false).unwrap();
        let b = registry.admit(false).unwrap();
        let _busy_a = a.handle().busy();
        let _busy_b = b.handle().busy();
        assert!(registry.admit(false).is_none(), "no idle connection: refused");
        assert!(!registry.evict_oldest_idle());
        assert_eq!(registry.unsettled(), (2, 0));
    }

    #[test]
    fn a_busy_guard_outliving_its_connection_is_harmless() {
        let registry = Registry::new(4);
        let a = registry.admit(false).unwrap();
        let busy = a.handle().busy();
        drop(a);
        assert_eq!(registry.unsettled(), (0, 0));
        drop(busy);
        assert_eq!(registry.unsettled(), (0, 0));
        assert_eq!(registry.open(), 0);
    }

    #[test]
    fn a_connection_that_sent_bytes_but_no_request_becomes_evictable_after_its_grace() {
        let registry = Registry::new(2);
        let a = registry.admit(true).unwrap();
        let b = registry.admit(true).unwrap();
        assert!(registry.admit(false).is_none(), "both protected: refused");
        // Their grace passed without a request: evictable, the oldest first.
        a.evictable_if_unused();
        b.evictable_if_unused();
        let c = registry.admit(false).unwrap();
        assert!(a.status().evicted && !b.status().evicted && !c.status().evicted);
        // A busy one is left alone.
        let _busy = b.handle().busy();
        b.evictable_if_unused();
        drop(a);
        let _d = registry.admit(false).unwrap();
        assert!(c.status().evicted && !b.status().evicted);
    }

    #[test]
    fn a_connection_that_already_sent_bytes_is_not_evicted_before_its_request() {
        let registry = Registry::new(2);
        let sending = registry.admit(true).unwrap();
        let idle = registry.admit(false).unwrap();
        let new = registry.admit(false).unwrap();
        assert!(idle.status().evicted && !sending.status().evicted);
        // Its request ends: now it is idle like any other (used after `new`).
        drop(sending.handle().busy());
        assert!(registry.evict_oldest_idle());
        assert!(new.status().evicted && !sending.status().evicted);
        assert!(registry.evict_oldest_idle());
        assert!(sending.status().evicted);
    }

    #[test]
    fn idle_time_restarts_when_a_request_ends() {
        let registry = Registry::new(4);
        let a = registry.admit(false).unwrap();
        let busy = a.handle().busy();
        assert_eq!(a.idle_for(Instant::now()), None);
        drop(busy);
        let idle = a.idle_for(Instant::now()).unwrap();
        assert!(idle < Duration::from_secs(1), "{idle:?}");
    }

    fn registry_status(slot: &Slot) -> Status {
        slot.status()
    }
}
