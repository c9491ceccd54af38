//! [`WorkerDirectory`]: where each registered worker's HTTP server listens,
//! for the proxy, whether it came from `--worker URL` or `--engine` (static:
//! no event connection owns it, so the event plane may not take its id; an
//! engine is a real inference engine the frontend scrapes), and whether it
//! is out of routing for now:
//!
//! - *silent*: its event connection sent nothing for `--event-silence-ms`
//!   (the process is frozen, or its host vanished); set and cleared by the
//!   event plane, which clears it with the worker's next frame (for a
//!   `--worker URL` worker: by its active health checks; for an engine: by
//!   its scrapes, K failures in a row set it, one success clears it);
//! - *unreachable*: a connection to it just failed; the proxy quarantines it
//!   for [`UNREACHABLE_QUARANTINE`] so other requests do not each pay for
//!   the failure (a killed worker stays registered for the deregistration
//!   grace);
//! - *refusing proofs*: it refused the frontend's request proof (its clock
//!   is off past its window, or it lacks the current secret): out of routing
//!   for [`PROOF_REFUSAL_QUARANTINE`], doubling with each refusal in a row
//!   up to [`PROOF_REFUSAL_MAX`], back to the start once it answers.
//!
//! Out of routing is published to the [`WorkerMonitor`]
//! ([`WorkerMonitor::set_out_of_routing`]): a bit beside the worker's busy
//! bit in its model's view, so a request pays nothing for it (no lock, no
//! scan, no exclusion list), and a change costs one publication. A change
//! of flags, a replaced or removed entry, and a registration in the monitor
//! (a new incarnation starts in routing) each *sync* the worker: under a
//! lock of its own (one of a few stripes by id), the monitor is set to what
//! the current entry says now; so whatever the order of two syncs, the last
//! one publishes the latest flags. No directory lock is held while the
//! monitor publishes. A quarantine ends by [`WorkerDirectory::expiry`], a
//! task that sleeps until the next deadline.
//!
//! At the crate root because two roles share it: the event plane's listener
//! (`events/`) writes it as workers register and leave, and the frontend's
//! proxy reads it for every request.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use loadgate::{WorkerId, WorkerMonitor};
use tokio::sync::Notify;

mod address;

use self::address::address;
pub(crate) use self::address::check_address;
pub use self::address::WorkerAddress;

/// How long a worker a connection failed to stays out of routing.
pub const UNREACHABLE_QUARANTINE: Duration = Duration::from_secs(1);

/// How long a worker that refused a request proof first stays out of
/// routing; each refusal in a row doubles it, up to [`PROOF_REFUSAL_MAX`].
pub const PROOF_REFUSAL_QUARANTINE: Duration = Duration::from_secs(1);

/// The longest a worker that keeps refusing request proofs stays out of
/// routing at a time (then one request tries it again).
pub const PROOF_REFUSAL_MAX: Duration = Duration::from_secs(30);

/// The longest the quarantine-expiry task sleeps with nothing due (so it
/// ends this soon after its directory is dropped).
pub const EXPIRY_IDLE: Duration = Duration::from_secs(5);

/// Locks that serialise the workers' syncs with the monitor, by id.
const SYNC_STRIPES: usize = 64;

/// Maps worker ids to their HTTP endpoints. Written on registration and
/// deregistration (cold), read once per proxied request.
#[derive(Debug)]
pub struct WorkerDirectory {
    // A read-write lock: many concurrent readers, rare writers.
    workers: RwLock<HashMap<WorkerId, Entry>>,
    /// Where out of routing is published.
    monitor: Arc<WorkerMonitor>,
    /// Quarantines to end, by deadline (ms since `epoch`).
    quarantines: Mutex<BTreeSet<(u64, WorkerId)>>,
    /// Wakes [`expiry`](Self::expiry) for a new quarantine.
    quarantined: Arc<Notify>,
    /// Serialise each worker's syncs with the monitor (by id).
    syncs: [Mutex<()>; SYNC_STRIPES],
    /// Where quarantine times count from.
    epoch: Instant,
    /// Entries marked silent (gates `out_of_routing`'s scan).
    silent: AtomicUsize,
    /// The latest quarantine deadline given, ms since `epoch` (0: none).
    quarantine_horizon_ms: AtomicU64,
    /// Times a worker went silent (for `/metrics`).
    silenced_total: AtomicU64,
    /// Times a worker was quarantined after a failed connection.
    quarantined_total: AtomicU64,
    /// Entries whose last answer was a proof refusal.
    refusing_proofs: AtomicUsize,
}

impl WorkerDirectory {
    /// An empty directory that publishes out of routing to `monitor`.
    pub fn new(monitor: Arc<WorkerMonitor>) -> Self {
        WorkerDirectory {
            workers: RwLock::default(),
            monitor,
            quarantines: Mutex::default(),
            quarantined: Arc::new(Notify::new()),
            syncs: std::array::from_fn(|_| Mutex::new(())),
            epoch: Instant::now(),
            silent: AtomicUsize::new(0),
            quarantine_horizon_ms: AtomicU64::new(0),
            silenced_total: AtomicU64::new(0),
            quarantined_total: AtomicU64::new(0),
            refusing_proofs: AtomicUsize::new(0),
        }
    }
}

#[derive(Debug)]
struct Entry {
    address: WorkerAddress,
    /// Registered by `--worker URL` or `--engine`, not by an event connection.
    is_static: bool,
    /// Its event connection went silent.
    silent: AtomicBool,
    /// Quarantined until this (ms since the directory's epoch; 0: not).
    quarantined_until_ms: AtomicU64,
    /// Proof refusals in a row (0: its last answer was not one).
    proof_refusals: AtomicU32,
}

impl Entry {
    fn new(address: WorkerAddress, is_static: bool) -> Self {
        Entry {
            address,
            is_static,
            silent: AtomicBool::new(false),
            quarantined_until_ms: AtomicU64::new(0),
            proof_refusals: AtomicU32::new(0),
        }
    }

    /// Out of routing at `now_ms`.
    fn excluded(&self, now_ms: u64) -> bool {
        // Relaxed: advisory flags; a request routed a moment before a change
        // is handled like any other request to that worker.
        self.silent.load(Ordering::Relaxed) || self.quarantined_until_ms.load(Ordering::Relaxed) > now_ms
    }
}

impl WorkerDirectory {
    /// Records (or replaces) the endpoint of `worker`, registered over the
    /// event plane. `http_addr` may be `HOST:PORT` or a URL. Returns false
    /// (and changes nothing) when `worker` is static.
    pub fn insert(&self, worker: WorkerId, http_addr: &str, dp_size: u32) -> bool {
        self.insert_again(worker, http_addr, dp_size, false)
    }

    /// As [`WorkerDirectory::insert`], after the monitor took a Register
    /// of a worker already known: with `same_incarnation` (its event
    /// connection made again) at the same address, the worker keeps its
    /// quarantine and its proof refusals in a row. (A new incarnation
    /// starts afresh: a restarted worker may answer now.)
    pub fn insert_again(&self, worker: WorkerId, http_addr: &str, dp_size: u32, same_incarnation: bool) -> bool {
        let mut workers = self.workers.write().unwrap_or_else(|e| e.into_inner());
        let entry = Entry::new(address(http_addr, dp_size, false), false);
        let kept = match workers.get(&worker) {
            Some(old) if old.is_static => return false,
            Some(old) if same_incarnation && old.address == entry.address => {
                // Relaxed: advisory, as `Entry::excluded`; under the write
                // lock nobody changes them meanwhile.
                let until = old.quarantined_until_ms.load(Ordering::Relaxed);
                entry.quarantined_until_ms.store(until, Ordering::Relaxed);
                let refusals = old.proof_refusals.load(Ordering::Relaxed);
                entry.proof_refusals.store(refusals, Ordering::Relaxed);
                true
            }
            _ => false,
        };
        let old = workers.insert(worker, entry);
        drop(workers);
        self.forget_flags(worker, old, kept);
        true
    }

    /// Records (or replaces) the endpoint of a worker registered by
    /// `--worker URL`: static, so the event plane refuses its id.
    pub fn insert_static(&self, worker: WorkerId, http_addr: &str, dp_size: u32) {
        let entry = Entry::new(address(http_addr, dp_size, false), true);
        let old = self.workers.write().unwrap_or_else(|e| e.into_inner()).insert(worker, entry);
        self.forget_flags(worker, old, false);
    }

    /// Records (or replaces) the endpoint of an engine named by `--engine`:
    /// static (the event plane refuses its id), and flagged as an engine
    /// (its scrapes are its health check, not `GET /health`);
    /// `assembles`: see [`WorkerAddress::assembles`].
    pub fn insert_engine(&self, worker: WorkerId, base_url: &str, dp_size: u32, assembles: bool) {
        let entry = Entry::new(WorkerAddress { assembles, ..address(base_url, dp_size, true) }, true);
        let old = self.workers.write().unwrap_or_else(|e| e.into_inner()).insert(worker, entry);
        self.forget_flags(worker, old, false);
    }

    /// Forgets `worker`; returns whether it was known.
    pub fn remove(&self, worker: WorkerId) -> bool {
        let old = self.workers.write().unwrap_or_else(|e| e.into_inner()).remove(&worker);
        let known = old.is_some();
        self.forget_flags(worker, old, false);
        known
    }

    /// A replaced or removed entry no longer counts as silent or refusing
    /// (unless its successor `kept` its refusals), and no longer keeps its
    /// worker out of routing (the worker is synced with what replaced it,
    /// if anything).
    fn forget_flags(&self, worker: WorkerId, old: Option<Entry>, kept: bool) {
        let Some(old) = old else { return };
        self.sync(worker);
        // Relaxed: the counts only gate `out_of_routing`'s scan and
        // `proof_accepted`'s lookup; see `excluded`.
        if old.silent.load(Ordering::Relaxed) {
            self.silent.fetch_sub(1, Ordering::Relaxed);
        }
        if old.proof_refusals.load(Ordering::Relaxed) > 0 && !kept {
            self.refusing_proofs.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Marks `worker`'s event connection silent (out of routing) or
    /// speaking again; returns whether that changed anything.
    pub fn set_silent(&self, worker: WorkerId, silent: bool) -> bool {
        {
            let workers = self.workers.read().unwrap_or_else(|e| e.into_inner());
            let Some(entry) = workers.get(&worker) else { return false };
            // Relaxed: the flag is advisory (see `Entry::excluded`); the
            // swap makes each change counted once.
            if entry.silent.swap(silent, Ordering::Relaxed) == silent {
                return false;
            }
            if silent {
                self.silent.fetch_add(1, Ordering::Relaxed);
                self.silenced_total.fetch_add(1, Ordering::Relaxed);
            } else {
                self.silent.fetch_sub(1, Ordering::Relaxed);
            }
        }
        self.sync(worker);
        true
    }

    /// Sets the monitor's out-of-routing bit of `worker` to what its entry
    /// says now (in routing with no entry). Each worker's syncs are
    /// serialised, and each reads the flags after taking its turn, so the
    /// last one publishes the latest flags whatever the order of the
    /// changes. No directory lock is held while the monitor publishes.
    /// Call it after registering the worker in the monitor too: a new
    /// incarnation starts in routing there.
    pub fn sync(&self, worker: WorkerId) {
        let stripe = &self.syncs[(worker % SYNC_STRIPES as u64) as usize];
        let _turn = stripe.lock().unwrap_or_else(PoisonError::into_inner);
        let now = self.now_ms();
        let out = self.workers.read().unwrap_or_else(|e| e.into_inner()).get(&worker).is_some_and(|e| e.excluded(now));
        self.monitor.set_out_of_routing(worker, out);
    }

    /// Schedules the end of a quarantine until `until` (ms since `epoch`).
    fn schedule(&self, worker: WorkerId, until: u64) {
        self.quarantines.lock().unwrap_or_else(PoisonError::into_inner).insert((until, worker));
        self.quarantined.notify_one();
    }

    /// A task that brings quarantined workers back into routing as their
    /// quarantines end (the frontend spawns it once). It holds the
    /// directory weakly: once the directory is dropped, it ends within
    /// [`EXPIRY_IDLE`].
    ///
    /// Deadlines are on the directory's clock (`std::time::Instant`); the
    /// task only sleeps on tokio's, so a paused tokio clock wakes it early,
    /// and it sleeps again.
    pub fn expiry(self: &Arc<Self>) -> impl Future<Output = ()> + Send + 'static {
        let (directory, wake) = (Arc::downgrade(self), self.quarantined.clone());
        async move {
            loop {
                let pause = match directory.upgrade() {
                    Some(directory) => match directory.expire_due() {
                        Some(until) => Duration::from_millis(until.saturating_sub(directory.now_ms())),
                        None => EXPIRY_IDLE,
                    },
                    None => return,
                };
                // A quarantine scheduled since `expire_due` left a permit.
                tokio::select! {
                    () = tokio::time::sleep(pause.min(EXPIRY_IDLE)) => {}
                    () = wake.notified() => {}
                }
            }
        }
    }

    /// Publishes the workers whose quarantine ended; returns the next
    /// deadline (ms since `epoch`).
    fn expire_due(&self) -> Option<u64> {
        let now = self.now_ms();
        let due: Vec<(u64, WorkerId)> = {
            let mut quarantines = self.quarantines.lock().unwrap_or_else(PoisonError::into_inner);
            let later = quarantines.split_off(&(now + 1, 0));
            std::mem::replace(&mut *quarantines, later).into_iter().collect()
        };
        for (_, worker) in due {
            self.sync(worker);
        }
        self.quarantines.lock().unwrap_or_else(PoisonError::into_inner).first().map(|(until, _)| *until)
    }

    /// Takes `worker` out of routing for [`UNREACHABLE_QUARANTINE`] (a
    /// connection to it failed).
    pub fn quarantine(&self, worker: WorkerId) {
        let until = self.now_ms() + UNREACHABLE_QUARANTINE.as_millis() as u64;
        {
            let workers = self.workers.read().unwrap_or_else(|e| e.into_inner());
            let Some(entry) = workers.get(&worker) else { return };
            // Relaxed: advisory, as `Entry::excluded`.
            entry.quarantined_until_ms.fetch_max(until, Ordering::Relaxed);
            self.quarantine_horizon_ms.fetch_max(until, Ordering::Relaxed);
            self.quarantined_total.fetch_add(1, Ordering::Relaxed);
        }
        self.sync(worker);
        self.schedule(worker, until);
    }

    /// Takes `worker` out of routing after it refused a request proof:
    /// [`PROOF_REFUSAL_QUARANTINE`], doubled for each refusal in a row before
    /// this one, at most [`PROOF_REFUSAL_MAX`]. Returns for how long (`None`:
    /// not registered).
    pub fn proof_refused(&self, worker: WorkerId) -> Option<Duration> {
        let (out, until) = {
            let workers = self.workers.read().unwrap_or_else(|e| e.into_inner());
            let entry = workers.get(&worker)?;
            // Relaxed: advisory, as `Entry::excluded`; the count gates only
            // the reset in `proof_accepted`.
            let before = entry.proof_refusals.fetch_add(1, Ordering::Relaxed);
            if before == 0 {
                self.refusing_proofs.fetch_add(1, Ordering::Relaxed);
            }
            let out = PROOF_REFUSAL_QUARANTINE.saturating_mul(1 << before.min(5)).min(PROOF_REFUSAL_MAX);
            let until = self.now_ms() + out.as_millis() as u64;
            entry.quarantined_until_ms.fetch_max(until, Ordering::Relaxed);
            self.quarantine_horizon_ms.fetch_max(until, Ordering::Relaxed);
            (out, until)
        };
        self.sync(worker);
        self.schedule(worker, until);
        Some(out)
    }

    /// `worker` answered a request: a later proof refusal starts again at
    /// [`PROOF_REFUSAL_QUARANTINE`]. Two atomic loads when no worker is
    /// refusing.
    pub fn proof_accepted(&self, worker: WorkerId) {
        // Relaxed: as `proof_refused`.
        if self.refusing_proofs.load(Ordering::Relaxed) == 0 {
            return;
        }
        let workers = self.workers.read().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = workers.get(&worker) {
            if entry.proof_refusals.swap(0, Ordering::Relaxed) > 0 {
                self.refusing_proofs.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// The workers out of routing now (silent or quarantined); empty, and
    /// without taking the lock, in the common case. For `/health` and
    /// `/metrics`: requests read out of routing from the monitor's views.
    pub fn out_of_routing(&self) -> Vec<WorkerId> {
        let now_ms = self.now_ms();
        // Relaxed: advisory, as `Entry::excluded`.
        if self.silent.load(Ordering::Relaxed) == 0 && self.quarantine_horizon_ms.load(Ordering::Relaxed) <= now_ms {
            return Vec::new();
        }
        let workers = self.workers.read().unwrap_or_else(|e| e.into_inner());
        workers.iter().filter(|(_, e)| e.excluded(now_ms)).map(|(id, _)| *id).collect()
    }

    /// Times a worker went silent and times one was quarantined, since start.
    pub fn liveness_totals(&self) -> (u64, u64) {
        // Relaxed: counters read on their own.
        (self.silenced_total.load(Ordering::Relaxed), self.quarantined_total.load(Ordering::Relaxed))
    }

    fn now_ms(&self) -> u64 {
        // At least 1, so that 0 keeps meaning "not quarantined".
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX).max(1)
    }

    /// `worker`'s endpoint, if known.
    pub fn get(&self, worker: WorkerId) -> Option<WorkerAddress> {
        self.workers.read().unwrap_or_else(|e| e.into_inner()).get(&worker).map(|e| e.address.clone())
    }

    /// The workers registered by `--worker URL` (engines left out), with
    /// their base URLs.
    pub fn static_workers(&self) -> Vec<(WorkerId, Arc<str>)> {
        let workers = self.workers.read().unwrap_or_else(|e| e.into_inner());
        workers
            .iter()
            .filter(|(_, e)| e.is_static && !e.address.engine)
            .map(|(id, e)| (*id, e.address.base_url.clone()))
            .collect()
    }

    /// Whether a Register of `worker`'s `incarnation` at `http_addr` would
    /// take the id of a live worker (in the directory, not silent) that is
    /// another life, `held` (the monitor's), or at another address. An
    /// incarnation is no secret (a worker's `/info` names it), so the same
    /// one at another address is another worker too.
    pub fn held_by_another_live(&self, worker: WorkerId, held: u64, incarnation: u64, http_addr: &str) -> bool {
        let workers = self.workers.read().unwrap_or_else(|e| e.into_inner());
        let Some(entry) = workers.get(&worker) else { return false };
        // Relaxed: advisory, as `Entry::excluded`.
        if entry.silent.load(Ordering::Relaxed) {
            return false;
        }
        held != incarnation || entry.address.base_url != address(http_addr, 0, false).base_url
    }

    /// Whether `worker` was registered by `--worker URL` or `--engine`.
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

#[cfg(test)]
mod tests;
