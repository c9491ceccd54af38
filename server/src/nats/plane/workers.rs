//! The workers the NATS plane registered: their lives ([`Known`]), who may
//! take an id, registration, being heard, and the sweep that takes silent
//! ones out of routing and forgets idle ones.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use loadgate::monitor::Registered;
use loadgate::WorkerId;

use super::known::Known;
use super::{Applier, CLOCK_WINDOW};
use crate::directory::check_address;
use crate::secret::unix_ms;
use crate::throttle::LogThrottle;

/// Warn lines about Registers refused for a live worker's id.
static TAKEOVERS: LogThrottle = LogThrottle::per_second(1);

/// Lines about workers registered and deregistered: a worker may leave and
/// come back in a loop (a sidecar whose engine flaps). 50 a second, as the
/// TCP plane's lines about authenticated connections.
static LIVES: LogThrottle = LogThrottle::per_second(50);

impl Applier {
    /// Whether `worker`'s `incarnation` on `subject` is the registered one.
    pub(super) fn is_registered(&self, subject: &str, worker: WorkerId, incarnation: u64) -> bool {
        let known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        known.get(&worker).is_some_and(|k| k.incarnation == incarnation && k.subject == subject)
    }

    /// A frame of `worker`'s `incarnation` on `subject`: whether it is the
    /// registered one (then it is heard now, and back in routing).
    pub(super) fn heard(&self, subject: &str, worker: WorkerId, incarnation: u64) -> bool {
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        let Some(k) = known.get_mut(&worker) else { return false };
        if k.incarnation != incarnation || k.subject != subject {
            return false;
        }
        k.heard = Instant::now();
        if std::mem::take(&mut k.silent) {
            drop(known);
            self.directory.set_silent(worker, false);
        }
        true
    }

    /// Whether a Register of `worker`'s `incarnation` would take the id of
    /// a life still heard: a newer incarnation takes it over only once the
    /// registered one is silent (a worker that restarted without a
    /// Deregister went quiet first), as a TCP id is free only once its
    /// connection is gone. Else any holder of the secret took a live
    /// worker's id, and its requests, by naming a higher incarnation. The
    /// same holds for an id this plane did not register (a TCP
    /// connection's, or a `--worker` one's): while that worker is heard,
    /// only the same life at the same address (a worker on both planes)
    /// registers here; another life, or another address (an incarnation
    /// can be read from the worker's open `/info`), waits until it is
    /// silent or gone.
    pub(super) fn takes_a_live_id(&self, worker: WorkerId, incarnation: u64, http_addr: &str) -> bool {
        let known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        let live = match known.get(&worker) {
            Some(k) => incarnation > k.incarnation && !k.silent,
            None => self
                .monitor
                .incarnation(worker)
                .is_some_and(|held| self.directory.held_by_another_live(worker, held, incarnation, http_addr)),
        };
        drop(known);
        if live {
            if let Some(suppressed) = TAKEOVERS.admit() {
                tracing::warn!(
                    worker,
                    suppressed,
                    "NATS Register of a newer incarnation refused: the registered one is still heard \
                     (a restart takes over once it is silent for --event-silence-ms)"
                );
            }
        }
        live
    }

    /// A Register of `worker`'s `incarnation`, sealed at `sent_ms`, for
    /// (dp size, model, address).
    pub(super) fn register(
        &self,
        subject: &str,
        worker: WorkerId,
        incarnation: u64,
        sent_ms: u64,
        what: (u32, &str, &str),
    ) {
        let (dp_size, model, http_addr) = what;
        if let Some(k) = self.known.lock().unwrap_or_else(|e| e.into_inner()).get(&worker) {
            if incarnation < k.incarnation {
                return; // an older life (a replay, or a late frame)
            }
        }
        // A heartbeat only while this frontend still routes that life: the
        // TCP plane may have deregistered it meanwhile (a worker on both
        // planes whose TCP path broke), and then NATS registers it again.
        let routed = self.monitor.incarnation(worker) == Some(incarnation) && self.directory.contains(worker);
        if routed && self.heard(subject, worker, incarnation) {
            return; // the same life announcing itself again (a heartbeat)
        }
        let limits =
            || self.limits.check_register(&self.monitor, &self.directory, worker, model, Some(http_addr), dp_size);
        if let Some(why) = check_address(http_addr).err().or_else(|| limits().err().map(|refusal| refusal.message)) {
            tracing::warn!(worker, "NATS registration refused: {why}");
            return;
        }
        // As the TCP plane: a new worker's address goes in first.
        let new = !self.directory.contains(worker);
        if new && !self.directory.insert(worker, http_addr, dp_size) {
            tracing::warn!(worker, "NATS registration of an id registered by --worker or --engine refused");
            return;
        }
        let registered = self.monitor.register(worker, model, dp_size, incarnation);
        match registered {
            Err(error) => {
                if new {
                    self.directory.remove(worker);
                }
                tracing::warn!(worker, %error, "NATS registration refused");
                return;
            }
            // Its slots started empty: what the other frontends' runs say
            // this one holds there, it does not (the monitor counts the
            // drop; the acker tells them).
            Ok(Registered::Restarted) => self.ack_ready.notify_one(),
            Ok(Registered::New) => {
                if let Some(peers) = &self.peers {
                    peers.registered(worker);
                    self.ack_ready.notify_one();
                }
            }
            Ok(Registered::Same) => {}
        }
        if !new && !self.directory.insert_again(worker, http_addr, dp_size, registered == Ok(Registered::Same)) {
            return;
        }
        self.directory.sync(worker);
        let known =
            Known { incarnation, subject: subject.to_owned(), since_ms: sent_ms, heard: Instant::now(), silent: false };
        self.known.lock().unwrap_or_else(|e| e.into_inner()).insert(worker, known);
        if let Some(suppressed) = LIVES.admit() {
            tracing::info!(worker, incarnation, ?model, dp_size, ?http_addr, suppressed, "worker registered (NATS)");
        }
    }

    pub(super) fn forget(&self, worker: WorkerId, incarnation: u64) {
        if self.monitor.deregister_incarnation(worker, incarnation) {
            self.directory.remove(worker);
            // What this frontend held of the others' load there is gone
            // (the monitor counts the drop; the acker tells them).
            self.ack_ready.notify_one();
            if let Some(suppressed) = LIVES.admit() {
                tracing::info!(worker, incarnation, suppressed, "worker deregistered (NATS)");
            }
        }
    }

    /// After a reconnection: every worker counts as heard now.
    pub(super) fn heard_all_now(&self) {
        let now = Instant::now();
        self.known.lock().unwrap_or_else(|e| e.into_inner()).values_mut().for_each(|k| k.heard = now);
    }

    /// Takes workers silent for `silence` out of routing, and forgets those
    /// silent for `idle` (not while NATS is away: that is no one's silence).
    pub(super) fn sweep(&self, silence: Duration, idle: Duration) {
        // Relaxed: stored from the client's state on the sweep's own task,
        // just before (see `start`).
        if !self.connected.load(Ordering::Relaxed) {
            self.heard_all_now();
            return;
        }
        let now = Instant::now();
        let (mut quiet, mut gone) = (Vec::new(), Vec::new());
        {
            let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
            known.retain(|worker, k| {
                let for_how_long = now.duration_since(k.heard);
                if for_how_long >= idle {
                    gone.push((*worker, k.incarnation));
                    return false;
                }
                if for_how_long >= silence && !k.silent {
                    k.silent = true;
                    quiet.push(*worker);
                }
                true
            });
        }
        for worker in quiet {
            self.directory.set_silent(worker, true);
        }
        // A Register sealed before the window is dropped by its clock anyway.
        let horizon = unix_ms().saturating_sub(CLOCK_WINDOW.as_millis() as u64);
        self.ended.lock().unwrap_or_else(|e| e.into_inner()).retain(|_, (_, at)| *at >= horizon);
        self.replays.forget_before(horizon);
        for (worker, incarnation) in gone {
            self.forget(worker, incarnation);
        }
    }
}
