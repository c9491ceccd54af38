//! [`WorkerMonitor`]: the worker registry, per-rank load slots, per-model
//! thresholds, and publication of each model's busy set.
//!
//! - `registry`: which workers (a concurrent map: a registration copies
//!   nothing) and models (arc-swap, replaced whole when one appears) exist;
//! - `entry`: one worker's slots, its published mirror and its evaluation;
//! - `publication`: the protocol that turns a changed evaluation into a new
//!   view without losing a concurrent change (its module docs carry the
//!   correctness argument);
//! - `view`: what routers read of a model;
//! - `query`, `error`, `clock`: answers, failures, time;
//! - `registration`, `reporter`: the embedder's named registration and
//!   self-numbering reports.

mod clock;
pub(crate) mod entry;
mod error;
mod lease;
mod measuring;
mod publication;
mod query;
mod reasons;
mod registration;
mod registry;
mod reporter;
mod shared;
pub(crate) mod view;

use std::fmt;
use std::time::Duration;

use crate::load::{LoadReport, WorkerId};
use crate::sync::{lock, Arc, AtomicU64, Mutex, Ordering};
use crate::thresholds::{BusySignals, BusyThresholds, ThresholdError, Thresholds};
use crate::waiting::{Begun, LineLimits, LineStats, ReportShare};

use self::clock::MonitorClock;
use self::entry::WorkerEntry;
pub(crate) use self::publication::ModelState;
use self::registry::{Registry, WorkerRecord};

pub use self::error::{ApplyError, RegisterError, SetThresholdsError};
pub use self::measuring::Measuring;
pub use self::query::{RankSnapshot, WorkerInfo, WorkerLoad};
pub use self::registration::Registration;
pub use self::reporter::Reporter;
pub use self::shared::SharedLoad;
pub use crate::busy::BusySet;
pub use crate::load::{Publisher, RankSlot, SlotUpdate};

/// How a [`WorkerMonitor`] behaves; `Default` is no staleness window and no
/// thresholds. Build it with `..Default::default()` (see [`RankLoad`](crate::RankLoad)'s
/// *Growing*).
#[derive(Clone, Debug, Default)]
pub struct MonitorConfig {
    /// A worker-reported rank whose last report is older than this counts as
    /// not reported (so it cannot keep its worker busy). `None`: never stale.
    pub staleness: Option<Duration>,
    /// Thresholds every model starts with (the frontend's command-line flags).
    pub default_thresholds: BusyThresholds,
    /// How much each model's waiting line holds (see [`crate::waiting`]).
    pub line: LineLimits,
    /// Other frontends' load kept per rank (none by default).
    pub shared: SharedLoad,
}

/// Decides which workers are busy and publishes each model's busy set.
///
/// Shared by the event plane (which calls [`apply`](Self::apply)), the router
/// (which reads the published sets) and the HTTP layer (thresholds, metrics).
///
/// # Examples
///
/// ```
/// use loadgate::{BusyThresholds, LoadReport, RankLoad, Registration, WorkerMonitor};
///
/// let monitor = WorkerMonitor::new(Default::default()).unwrap();
/// let incarnation = 1; // e.g. the worker's start time in ns
/// monitor.register_worker(Registration::new(7, "llama").incarnation(incarnation)).unwrap();
/// monitor
///     .set_thresholds("llama", BusyThresholds { active_decode_blocks_threshold: Some(0.5), ..Default::default() })
///     .unwrap();
/// let load = RankLoad { active_decode_blocks: 60, kv_total_blocks: 100, ..Default::default() };
/// monitor.apply(&LoadReport { worker: 7, incarnation, seq: 0, load, ..Default::default() }).unwrap();
/// assert!(monitor.is_busy(7));
/// ```
pub struct WorkerMonitor {
    registry: Registry,
    /// Serialises registry changes (cold path: registration, new models).
    registry_write: Mutex<()>,
    clock: MonitorClock,
    default_thresholds: Thresholds,
    /// What each model's waiting line holds.
    line: LineLimits,
    /// The most instances a chunk of a model's view holds.
    chunk_capacity: usize,
    /// Other frontends' slots per rank ([`SharedLoad::frontends`]).
    frontends: u16,
    /// Times a worker's slots were dropped ([`slots_dropped`](Self::slots_dropped)).
    dropped: AtomicU64,
    /// Times an id not registered was ([`registrations`](Self::registrations)).
    registrations: AtomicU64,
}

impl fmt::Debug for WorkerMonitor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerMonitor")
            .field("workers", &self.registry.workers.len())
            .field("models", &self.registry.models.load().len())
            .field("staleness_ns", &self.clock.staleness_ns())
            .finish()
    }
}

/// What [`WorkerMonitor::apply`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// Not newer than the last report applied from this publisher for this
    /// rank in this incarnation: dropped.
    Stale,
    /// The report names another incarnation than the worker's current one
    /// (a report of a previous life, or of one not yet registered): dropped.
    OtherIncarnation,
    /// Another report for the same rank and publisher was being stored at
    /// that moment (two writers for one worker): dropped, nothing changed.
    Contended,
    /// Stored; the worker's busy state did not change.
    Stored,
    /// Stored, and the worker's busy bit flipped (a new busy set was published).
    Flipped,
}

/// What [`WorkerMonitor::register`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Registered {
    /// A worker id not registered before.
    New,
    /// The same id in the same incarnation (a reconnect): its slots stay.
    Same,
    /// The same id in a new incarnation (a restart): its slots start empty,
    /// so it starts free; its model and dp size may have changed.
    Restarted,
}

/// The largest data-parallel size a worker may register with (beyond it,
/// [`RegisterError::InvalidDpSize`]).
pub const MAX_DP_SIZE: u32 = 65_536;

/// Which slot an update is for, the report's seq (0 for tracking), and
/// where the worker's line stood when the report's measurement began, if
/// the reporter said ([`Measuring`]; otherwise: when it is applied).
#[derive(Clone, Copy)]
struct Update {
    worker: WorkerId,
    incarnation: u64,
    /// The registration it is for ([`WorkerMonitor::worker_life`]), if
    /// named (then `incarnation` is not looked at): another one's update
    /// is dropped as another incarnation's.
    life: Option<u64>,
    rank: u32,
    seq: u64,
    measured: Option<Measuring>,
}

impl Update {
    /// The router's own tracking of a rank: no seq, no measurement.
    fn tracking(worker: WorkerId, incarnation: u64, rank: u32) -> Update {
        Update { worker, incarnation, life: None, rank, seq: 0, measured: None }
    }
}

impl WorkerMonitor {
    /// A monitor on the real clock.
    ///
    /// # Errors
    ///
    /// If `config.default_thresholds` is invalid.
    pub fn new(config: MonitorConfig) -> Result<Self, ThresholdError> {
        Self::with_clock(config, quanta::Clock::new())
    }

    /// A monitor on `clock` (tests pass `quanta::Clock::mock()`'s clock to
    /// control staleness).
    ///
    /// # Errors
    ///
    /// If `config.default_thresholds` is invalid.
    pub fn with_clock(config: MonitorConfig, clock: quanta::Clock) -> Result<Self, ThresholdError> {
        let default_thresholds = config.default_thresholds.validate()?;
        Ok(WorkerMonitor {
            registry: Registry::default(),
            registry_write: Mutex::new(()),
            dropped: AtomicU64::new(0),
            registrations: AtomicU64::new(0),
            clock: MonitorClock::new(
                clock,
                config.staleness,
                config.shared.staleness,
                config.shared.frontends,
                lease::Lease::new(config.shared.lease),
            ),
            frontends: config.shared.frontends,
            default_thresholds,
            line: config.line,
            chunk_capacity: publication::CHUNK_CAPACITY,
        })
    }

    /// A monitor whose views split models into chunks of at most
    /// `capacity` instances, so that tests of a few workers cover many
    /// chunks.
    #[cfg(test)]
    pub(crate) fn with_chunk_capacity(config: MonitorConfig, capacity: usize) -> Self {
        WorkerMonitor { chunk_capacity: capacity, ..Self::new(config).expect("valid config") }
    }

    /// Registers incarnation `incarnation` of worker `worker`, serving
    /// `model` with `dp_size` data-parallel ranks. Prefer
    /// [`register_worker`](Self::register_worker), which names the four.
    ///
    /// - A new id starts with every rank unreported, so free.
    /// - The same id and incarnation again (a reconnect) keeps its slots; it
    ///   must name the same model and dp size.
    /// - The same id with another incarnation (a restart) replaces the old
    ///   registration: fresh slots, and the model and dp size it names now.
    ///
    /// Cold path: takes the registry lock and the models' locks.
    ///
    /// # Errors
    ///
    /// [`RegisterError`] for a zero or huge dp size, an empty model name, or
    /// a reconnect that names another model or dp size.
    pub fn register(
        &self,
        worker: WorkerId,
        model: &str,
        dp_size: u32,
        incarnation: u64,
    ) -> Result<Registered, RegisterError> {
        if dp_size == 0 || dp_size > MAX_DP_SIZE {
            return Err(RegisterError::InvalidDpSize(dp_size));
        }
        if model.is_empty() {
            return Err(RegisterError::EmptyModel);
        }
        let _registry = lock(&self.registry_write);
        let registry = &self.registry;
        let old = registry.with_worker(worker, WorkerRecord::clone);
        let outcome = match &old {
            Some(rec) if rec.entry.incarnation == incarnation => {
                return if &*rec.model.name == model && rec.entry.dp_size == dp_size {
                    Ok(Registered::Same)
                } else {
                    Err(RegisterError::Conflict(worker))
                };
            }
            Some(_) => {
                self.drops_slots();
                Registered::Restarted
            }
            None => Registered::New,
        };
        // A new model is published once it lists its first worker, so a
        // router never finds it without an instance.
        let known = registry.model(model);
        let fresh = known.is_none();
        let state = known.unwrap_or_else(|| self.new_model(Arc::from(model)));
        let entry = Arc::new(WorkerEntry::new(worker, incarnation, dp_size, self.frontends));
        let mut forgotten = None;
        match old {
            // A restart in the same model: one publication swaps the entries,
            // so routers never see the worker missing.
            Some(old) if Arc::ptr_eq(&old.model, &state) => {
                relist(&state, Some(&old.entry), Some(&entry));
            }
            Some(old) => {
                if relist(&old.model, Some(&old.entry), None) {
                    forgotten = Some(old.model);
                }
                relist(&state, None, Some(&entry));
            }
            None => {
                relist(&state, None, Some(&entry));
            }
        }
        registry.workers.insert(worker, WorkerRecord { entry, model: state.clone() });
        if fresh {
            registry.edit_models(|models| {
                models.insert(state.name.clone(), state);
            });
        }
        if let Some(model) = forgotten {
            self.forget(&model);
        }
        if outcome == Registered::New {
            // Release: after the registry's insert (see `registrations`).
            self.registrations.fetch_add(1, Ordering::Release);
        }
        Ok(outcome)
    }

    /// How many times a worker's slots were dropped (a deregistration, or a
    /// restart: a new incarnation starts empty), counted before they are:
    /// a caller that reads the same count before and after applying a
    /// report knows no worker's slots were dropped meanwhile (a frontend
    /// acknowledging what it holds of another's load, see
    /// `SharedLoad::lease`).
    pub fn slots_dropped(&self) -> u64 {
        // SeqCst, as the RMW in `drops_slots`: a load after the reader's
        // own slot stores sees any drop counted before them (a cold path).
        self.dropped.load(Ordering::SeqCst)
    }

    /// How many times a worker id that was not registered was (a
    /// [`Registered::New`] outcome, by any caller): a caller that sees the
    /// count change knows to look again at the ids it found unknown.
    pub fn registrations(&self) -> u64 {
        // Acquire: pairs with the Release in `register`; the registration
        // counted is seen by the caller's next look-up.
        self.registrations.load(Ordering::Acquire)
    }

    /// Counts a drop of a worker's slots, before it happens.
    fn drops_slots(&self) {
        // SeqCst RMW before the drop: a reader whose later load still sees
        // the old count read its slots before any of them was dropped.
        self.dropped.fetch_add(1, Ordering::SeqCst);
    }

    /// Removes a worker; returns whether it was registered. When it was its
    /// model's last worker, the model is forgotten with its thresholds,
    /// unless it is kept (named by [`add_model`](Self::add_model) or given
    /// thresholds): see [`model_count`](Self::model_count).
    ///
    /// Cold path: takes the registry lock and the model's lock.
    pub fn deregister(&self, worker: WorkerId) -> bool {
        self.remove_worker(worker, None)
    }

    /// Removes a worker if `incarnation` is its current one (a leaving
    /// process never removes the one that replaced it); returns whether it
    /// did. Cold path, as [`deregister`](Self::deregister).
    pub fn deregister_incarnation(&self, worker: WorkerId, incarnation: u64) -> bool {
        self.remove_worker(worker, Some(incarnation))
    }

    fn remove_worker(&self, worker: WorkerId, incarnation: Option<u64>) -> bool {
        let _registry = lock(&self.registry_write);
        let Some(rec) = self.registry.with_worker(worker, WorkerRecord::clone) else {
            return false;
        };
        if incarnation.is_some_and(|i| i != rec.entry.incarnation) {
            return false;
        }
        self.drops_slots();
        let empty = relist(&rec.model, Some(&rec.entry), None);
        self.registry.workers.remove(&worker);
        if empty {
            self.forget(&rec.model);
        }
        true
    }

    /// Forgets `model` unless it is kept, then retires it (cold path, under
    /// the registry lock, once its last worker has left).
    fn forget(&self, model: &Arc<ModelState>) {
        if model.is_kept() {
            return;
        }
        self.registry.edit_models(|models| {
            models.remove(&model.name);
        });
        model.retire();
    }

    fn new_model(&self, name: Arc<str>) -> Arc<ModelState> {
        Arc::new(ModelState::new(name, self.default_thresholds, self.line, self.chunk_capacity))
    }

    /// Makes `model` known without any worker (so its thresholds can be set
    /// and it routes as unavailable rather than unknown) and *kept*: it
    /// stays when its last worker leaves. Returns whether it was new (a
    /// model already known becomes kept too); an empty name is refused (as
    /// [`register`](Self::register) refuses it) and returns false.
    ///
    /// Cold path: takes the registry lock.
    pub fn add_model(&self, model: &str) -> bool {
        if model.is_empty() {
            return false;
        }
        let _registry = lock(&self.registry_write);
        if let Some(state) = self.registry.model(model) {
            state.keep();
            return false;
        }
        let state = self.new_model(Arc::from(model));
        state.keep();
        self.registry.edit_models(|models| {
            models.insert(state.name.clone(), state.clone());
        });
        true
    }

    /// How many models are known: the kept ones and those with a worker.
    ///
    /// A model is *kept* once it is named by [`add_model`](Self::add_model)
    /// or given thresholds ([`set_thresholds`](Self::set_thresholds),
    /// [`update_thresholds`](Self::update_thresholds)); any other model is
    /// forgotten, with its thresholds, when its last worker leaves
    /// ([`deregister`](Self::deregister),
    /// [`deregister_incarnation`](Self::deregister_incarnation), or a
    /// restart into another model). Registering it again starts it afresh,
    /// with the default thresholds; routers that had routed it find the new
    /// one.
    ///
    /// # Examples
    ///
    /// ```
    /// use loadgate::WorkerMonitor;
    ///
    /// let monitor = WorkerMonitor::new(Default::default()).unwrap();
    /// monitor.add_model("kept");
    /// monitor.register(1, "passing", 1, 0).unwrap();
    /// assert_eq!(monitor.model_count(), 2);
    /// monitor.deregister(1);
    /// assert_eq!(monitor.models(), ["kept"]);
    /// ```
    pub fn model_count(&self) -> usize {
        self.registry.models.load().len()
    }

    /// Applies one load report. Hot path: a report that flips no busy bit
    /// takes no lock and allocates nothing.
    ///
    /// # Errors
    ///
    /// [`ApplyError`] for an unregistered worker or a rank out of range.
    pub fn apply(&self, report: &LoadReport) -> Result<Applied, ApplyError> {
        self.apply_update(report, None)
    }

    /// [`apply`](Self::apply), the line's part as of `measured`.
    #[inline]
    fn apply_update(&self, report: &LoadReport, measured: Option<Measuring>) -> Result<Applied, ApplyError> {
        let (worker, incarnation, rank, seq) = (report.worker, report.incarnation, report.rank, report.seq);
        let at = Update { worker, incarnation, life: None, rank, seq, measured };
        self.update_slot(at, report.publisher, |slot, now| slot.store(report.seq, &report.load, now))
    }

    /// [`apply`](Self::apply), for the registration `life` only
    /// ([`WorkerMonitor::worker_life`]): another one's is
    /// [`Applied::OtherIncarnation`].
    pub(crate) fn apply_to_life(&self, report: &LoadReport, life: u64) -> Result<Applied, ApplyError> {
        let (worker, incarnation, rank, seq) = (report.worker, report.incarnation, report.rank, report.seq);
        let at = Update { worker, incarnation, life: Some(life), rank, seq, measured: None };
        self.update_slot(at, report.publisher, |slot, now| slot.store(report.seq, &report.load, now))
    }

    /// The current incarnation of `worker`, if it is registered.
    pub fn incarnation(&self, worker: WorkerId) -> Option<u64> {
        self.registry.with_worker(worker, |rec| rec.entry.incarnation)
    }

    /// Adds to (or, negative, removes from) the router-tracked load of one
    /// rank of incarnation `incarnation` of `worker`: what the router
    /// dispatched to it and has not yet seen end. The router-tracked load
    /// never goes stale. An update for another incarnation (a request sent
    /// to the worker's previous life, ending after a restart) is dropped
    /// with [`Applied::OtherIncarnation`], so it cannot cancel load the
    /// router tracks for the new one.
    ///
    /// # Errors
    ///
    /// [`ApplyError`] for an unregistered worker or a rank out of range.
    pub fn track(
        &self,
        worker: WorkerId,
        incarnation: u64,
        rank: u32,
        blocks: i64,
        prefill_tokens: i64,
    ) -> Result<Applied, ApplyError> {
        self.update_slot(Update::tracking(worker, incarnation, rank), Publisher::Router, |slot, now| {
            slot.add(blocks, prefill_tokens, now);
            SlotUpdate::Stored
        })
    }

    /// A number for `worker`'s current registration, unique in the process
    /// (never 0): the same from its registration until it is deregistered
    /// or restarts, another once it registers again, even with the same
    /// incarnation (a worker taken out for silence that comes back). `None`
    /// if not registered. For [`track_life`](Self::track_life).
    pub fn worker_life(&self, worker: WorkerId) -> Option<u64> {
        self.registry.with_worker(worker, |rec| rec.entry.life)
    }

    /// As [`track`](Self::track), for the registration `life`
    /// ([`worker_life`](Self::worker_life)) rather than an incarnation: a
    /// request dispatched before the worker was deregistered, ending after
    /// it registered again in the same incarnation (fresh slots), gives
    /// back nothing ([`Applied::OtherIncarnation`]) instead of taking its
    /// load off the new registration's.
    ///
    /// # Errors
    ///
    /// [`ApplyError`] for an unregistered worker or a rank out of range.
    pub fn track_life(
        &self,
        worker: WorkerId,
        life: u64,
        rank: u32,
        blocks: i64,
        prefill_tokens: i64,
    ) -> Result<Applied, ApplyError> {
        let at = Update { life: Some(life), ..Update::tracking(worker, 0, rank) };
        self.update_slot(at, Publisher::Router, |slot, now| {
            slot.add(blocks, prefill_tokens, now);
            SlotUpdate::Stored
        })
    }

    /// Sets the router-tracked denominators of a rank (the capacity the
    /// router assumes), keeping its numerators; for another incarnation,
    /// as [`track`](Self::track), nothing.
    ///
    /// # Errors
    ///
    /// [`ApplyError`] for an unregistered worker or a rank out of range.
    pub fn set_tracked_capacity(
        &self,
        worker: WorkerId,
        incarnation: u64,
        rank: u32,
        kv_total_blocks: u32,
        max_num_batched_tokens: u32,
    ) -> Result<Applied, ApplyError> {
        self.update_slot(Update::tracking(worker, incarnation, rank), Publisher::Router, |slot, now| {
            slot.set_denominators(kv_total_blocks, max_num_batched_tokens, now);
            SlotUpdate::Stored
        })
    }

    /// Changes one slot of this incarnation of `worker` with `update`
    /// (given the slot and the time) and, if it stored something,
    /// re-evaluates the worker. The one path of reports and tracking alike.
    #[inline]
    fn update_slot(
        &self,
        at: Update,
        publisher: Publisher,
        update: impl FnOnce(&RankSlot, u64) -> SlotUpdate,
    ) -> Result<Applied, ApplyError> {
        let Update { worker, incarnation, life, rank, seq, measured } = at;
        self.has_slot(publisher)?;
        if let Publisher::Frontend(n) = publisher {
            // A frontend heard again after a silence past the window: what
            // it published before is dropped first (as at a renewal), not
            // left counting beside what it publishes now. (A publication of
            // the same frontend applied on another thread at that moment
            // may go with them; one caller applies a frontend's frames in
            // order in the server, and a frontend back from a silence
            // publishes everything again.)
            if self.clock.heard(n, self.clock.now()) {
                self.clear_publisher(publisher)?;
            }
        }
        // The incarnation before the rank: another life's update is dropped
        // whatever its rank (the current one's dp size may be smaller).
        let other_life = |rec: &WorkerRecord| {
            // A registration named is the whole check (it has one incarnation).
            life.map_or(incarnation != rec.entry.incarnation, |life| life != rec.entry.life)
        };
        self.registry.with_rank(worker, rank, other_life, |rec| {
            let now = self.clock.now();
            match update(rec.entry.slot(rank, publisher), now) {
                SlotUpdate::Stale => Applied::Stale,
                SlotUpdate::Contended => Applied::Contended,
                SlotUpdate::Stored => {
                    // The worker's own word on its load, not the router's
                    // tracking: the waiting line may give it a waiter
                    // again. What the line had dispatched is read before
                    // the publication this report may cause, and the pass
                    // runs after it: a waiter that publication wakes and
                    // dispatches stays marked until the worker's *next*
                    // report (one report, one dispatch: loom's
                    // `one_report_dispatches_one_waiter`). A report whose
                    // measurement began earlier (`Measuring`) counts from
                    // then: a dispatch made meanwhile stays marked too.
                    let begun = match publisher {
                        Publisher::Worker => {
                            rec.model.line.report_begins(worker, seq, measured.map(Measuring::measured))
                        }
                        // A worker that never reports its own load is known
                        // by this tracking alone: each change is its report.
                        Publisher::Router => rec.model.line.tracking_begins(worker, || !rec.entry.has_reported()),
                        _ => Begun::Nothing,
                    };
                    let applied = self.changed(&rec.entry, &rec.model, now);
                    if let Begun::Seen(seen) = begun {
                        rec.model.line.reported(worker, seen);
                    }
                    applied
                }
            }
        })
    }

    /// After an input of `entry` changed: bump the version, evaluate, and
    /// publish only if the busy bit differs from the published one (see
    /// `publication`'s module docs).
    #[inline]
    fn changed(&self, entry: &Arc<WorkerEntry>, model: &ModelState, now: u64) -> Applied {
        // AcqRel RMW: releases our slot stores to whoever reads the version
        // with an RMW under the lock, and acquires any earlier reconciler's
        // mirror store.
        entry.version.fetch_add(1, Ordering::AcqRel);
        let thresholds = **model.thresholds.load();
        let busy = entry.evaluate(&thresholds, &self.clock, now);
        if entry.matches_published(busy) {
            return Applied::Stored;
        }
        self.publish(model, entry)
    }

    /// Takes the model's lock and brings the published bit of `entry` in
    /// line with its slots.
    #[cold]
    fn publish(&self, model: &ModelState, entry: &Arc<WorkerEntry>) -> Applied {
        match model.lock().reconcile(&self.clock, vec![entry.clone()], None) {
            0 => Applied::Stored,
            _ => Applied::Flipped,
        }
    }

    /// Re-evaluates every worker (after time passed: ranks can go stale).
    /// Returns how many busy bits flipped in the views it published. Call it
    /// periodically when a staleness window is set.
    pub fn expire_stale(&self) -> usize {
        let models = self.registry.models.load_full();
        let now = self.clock.now();
        let mut flips = 0;
        for model in models.values() {
            let thresholds = **model.thresholds.load();
            let view = model.view().load_full();
            let candidates: Vec<Arc<WorkerEntry>> = view
                .entries()
                // The reasons are refreshed even when the bit stays.
                .filter(|e| !e.matches_published(e.evaluate(&thresholds, &self.clock, now)))
                .cloned()
                .collect();
            if !candidates.is_empty() {
                flips += model.lock().reconcile(&self.clock, candidates, None);
            }
        }
        flips
    }

    /// `Ok` if every rank has a slot for `publisher`.
    #[inline]
    fn has_slot(&self, publisher: Publisher) -> Result<(), ApplyError> {
        match publisher {
            Publisher::Frontend(n) if n >= self.frontends => Err(ApplyError::UnknownPublisher(publisher)),
            Publisher::Echo if self.frontends == 0 => Err(ApplyError::UnknownPublisher(publisher)),
            _ => Ok(()),
        }
    }

    /// How many other frontends are live now (the lease gives this one a
    /// 1/k share of the headroom; see [`SharedLoad::lease`]); when it
    /// changes, every worker is re-evaluated. Returns how many busy bits
    /// flipped.
    pub fn set_other_frontends(&self, others: u32) -> usize {
        if self.clock.lease.set_others(others) {
            self.expire_stale()
        } else {
            0
        }
    }

    /// How many requests wait for `model` in the other frontends' lines
    /// (`others`) and in those of the frontends ordered before this one
    /// (`ahead`, a part of `others`), from their beats. While some wait
    /// elsewhere, the reports of the model's workers are shared between the
    /// frontends' lines by their waiters: a report's seq and worker pick a
    /// point of `[0, own + others)`, laid out in the frontends' order, and
    /// only the frontend whose part holds it may give the worker a waiter
    /// on it (the others keep the worker out of their lines until its next
    /// report). When the frontends' figures agree, each report goes to one
    /// line, not one in each. 0 and 0 (the default, and alone): every
    /// report is this frontend's. Returns whether the model is known
    /// (`false`: nothing set).
    pub fn share_reports(&self, model: &str, ahead: u64, others: u64) -> bool {
        let Some(state) = self.registry.model(model) else { return false };
        state.line.set_share(ReportShare { ahead, others });
        true
    }

    /// Frontend `publisher` is alive (a frame of its own): everything it
    /// published counts on for another [`SharedLoad::staleness`] without
    /// being published again (O(1)). A renewal after a silence past that
    /// window (since its last renewal or publication applied) drops what it
    /// published instead of reviving it (figures from
    /// before a partition may be stale; the frontend, told by the others'
    /// silence, publishes everything again), as
    /// [`clear_publisher`](Self::clear_publisher) does; returns how many busy
    /// bits flipped.
    ///
    /// # Errors
    ///
    /// [`ApplyError::UnknownPublisher`] for anything but a frontend index
    /// kept.
    pub fn renew_publisher(&self, publisher: Publisher) -> Result<usize, ApplyError> {
        match publisher {
            Publisher::Frontend(n) if n < self.frontends => {
                if self.clock.renew(n, self.clock.now()) {
                    self.clear_publisher(publisher)
                } else {
                    Ok(0)
                }
            }
            _ => Err(ApplyError::UnknownPublisher(publisher)),
        }
    }

    /// Forgets everything `publisher` published, on every worker (cold
    /// path): before a frontend index is given to another frontend, whose
    /// reports start their own numbering. Every worker it changes is
    /// re-evaluated and published before this returns; returns how many
    /// busy bits flipped.
    ///
    /// # Errors
    ///
    /// [`ApplyError::UnknownPublisher`] for a frontend index not kept.
    pub fn clear_publisher(&self, publisher: Publisher) -> Result<usize, ApplyError> {
        self.has_slot(publisher)?;
        let mut flips = 0;
        for rec in self.records() {
            if rec.entry.clear(publisher) && self.changed(&rec.entry, &rec.model, self.clock.now()) == Applied::Flipped
            {
                flips += 1;
            }
        }
        Ok(flips)
    }

    /// Replaces a model's thresholds; every worker of the model is
    /// re-evaluated and the busy set published before this returns. The
    /// model becomes kept (see [`model_count`](Self::model_count)).
    ///
    /// # Errors
    ///
    /// Unknown model, or an invalid value (nothing changes then).
    pub fn set_thresholds(&self, model: &str, thresholds: BusyThresholds) -> Result<Thresholds, SetThresholdsError> {
        self.update_thresholds(model, |t| *t = thresholds)
    }

    /// Changes a model's thresholds with `edit` (atomically with respect to
    /// other changes of the same model); as [`set_thresholds`](Self::set_thresholds).
    ///
    /// Cold path: takes the registry lock (so the model cannot be forgotten
    /// meanwhile) and the model's lock.
    ///
    /// # Errors
    ///
    /// Unknown model, or an invalid value (nothing changes then).
    pub fn update_thresholds(
        &self,
        model: &str,
        edit: impl FnOnce(&mut BusyThresholds),
    ) -> Result<Thresholds, SetThresholdsError> {
        let _registry = lock(&self.registry_write);
        let state = self.registry.model(model).ok_or_else(|| SetThresholdsError::UnknownModel(model.to_owned()))?;
        let mut writer = state.lock();
        let mut config = state.thresholds.load().to_config();
        edit(&mut config);
        let next = config.validate()?;
        state.keep();
        state.thresholds.store(Arc::new(next));
        let instances = writer.instances();
        writer.reconcile(&self.clock, instances, Some(next.is_enabled()));
        Ok(next)
    }

    /// A model's thresholds, or `None` for an unknown model.
    pub fn thresholds(&self, model: &str) -> Option<Thresholds> {
        self.registry.model(model).map(|m| **m.thresholds.load())
    }

    /// Every known model with its thresholds, sorted by name.
    pub fn all_thresholds(&self) -> Vec<(String, Thresholds)> {
        let models = self.registry.models.load();
        let mut all: Vec<_> = models.values().map(|m| (m.name.to_string(), **m.thresholds.load())).collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// Every known model name (with or without workers), sorted.
    pub fn models(&self) -> Vec<String> {
        let models = self.registry.models.load();
        let mut names: Vec<String> = models.keys().map(|m| m.to_string()).collect();
        names.sort();
        names
    }

    /// Whether `model` is known.
    pub fn has_model(&self, model: &str) -> bool {
        self.registry.models.load().contains_key(model)
    }

    /// Whether registering `worker` for `model` now would add to
    /// [`model_count`](Self::model_count): `model` is not known, and
    /// `worker` is not the last instance of a model the monitor would
    /// forget as it moves (one not kept by [`add_model`](Self::add_model)).
    /// For a limit on models, checked before [`register`](Self::register)
    /// (a worker restarting into another model takes its old model's place).
    ///
    /// # Examples
    ///
    /// ```
    /// use loadgate::WorkerMonitor;
    ///
    /// let monitor = WorkerMonitor::new(Default::default()).unwrap();
    /// monitor.register(1, "a", 1, 0).unwrap();
    /// assert!(!monitor.adds_model(1, "b"), "worker 1 leaves a, which goes");
    /// assert!(monitor.adds_model(2, "b"));
    /// monitor.register(2, "a", 1, 0).unwrap();
    /// assert!(monitor.adds_model(1, "b"), "a stays with worker 2");
    /// assert!(!monitor.adds_model(3, "a"));
    /// ```
    pub fn adds_model(&self, worker: WorkerId, model: &str) -> bool {
        if self.has_model(model) {
            return false;
        }
        let leaves = self.registry.with_worker(worker, |rec| rec.model.clone());
        !leaves.is_some_and(|old| !old.is_kept() && old.view().load().len() == 1)
    }

    /// A number for `model`'s current life, unique in the process: the same
    /// from its first worker (or [`add_model`](Self::add_model)) until the
    /// monitor forgets it, another once it is back. `None` if not known.
    /// What an embedder keeps per model beside the monitor (as the monitor
    /// keeps thresholds) can be dropped when it changes.
    pub fn model_life(&self, model: &str) -> Option<u64> {
        self.registry.models.load().get(model).map(|state| state.line.id())
    }

    /// Whether `worker` is in its model's published busy set.
    pub fn is_busy(&self, worker: WorkerId) -> bool {
        self.registry.with_worker(worker, |rec| {
            let view = rec.model.view().load();
            view.find(worker).is_some_and(|place| view.chunk(place).is_busy(place.local))
        }) == Some(true)
    }

    /// Takes `worker` out of routing (`out`), or brings it back: routers skip
    /// an instance out of routing as they skip a busy one, whatever its
    /// model's thresholds, and a model whose every instance is out of
    /// routing routes as [`RouteError::Unavailable`](crate::RouteError::Unavailable)
    /// (nothing alive to take a request) rather than overloaded. For the
    /// embedder's own liveness verdicts: a worker whose event connection
    /// went silent, one a connection just failed to. The state belongs to
    /// the registration: a restart (a new incarnation) starts in routing.
    /// Returns whether the published state changed.
    ///
    /// Cold path: the model's lock and one publication (a copy of the
    /// worker's chunk), as a busy flip.
    ///
    /// # Examples
    ///
    /// ```
    /// use loadgate::{Policy, RouteError, WorkerMonitor, WorkerRouter};
    /// use std::sync::Arc;
    ///
    /// let monitor = Arc::new(WorkerMonitor::new(Default::default()).unwrap());
    /// monitor.register(1, "m", 1, 0).unwrap();
    /// monitor.register(2, "m", 1, 0).unwrap();
    /// let router = WorkerRouter::new(monitor.clone(), Policy::RoundRobin);
    /// assert!(monitor.set_out_of_routing(1, true));
    /// assert_eq!(router.route("m", &[]), Ok(2));
    /// assert_eq!(router.route("m", &[2]), Err(RouteError::Overloaded));
    /// monitor.set_out_of_routing(2, true);
    /// assert_eq!(router.route("m", &[]), Err(RouteError::Unavailable));
    /// ```
    pub fn set_out_of_routing(&self, worker: WorkerId, out: bool) -> bool {
        let Some(rec) = self.registry.with_worker(worker, WorkerRecord::clone) else {
            return false;
        };
        let changed = rec.model.lock().set_out(&rec.entry, out);
        changed
    }

    /// Whether `worker` is published out of routing.
    pub fn is_out_of_routing(&self, worker: WorkerId) -> bool {
        self.registry.with_worker(worker, |rec| {
            let view = rec.model.view().load();
            view.find_entry(&rec.entry).is_some_and(|place| view.chunk(place).is_out(place.local))
        }) == Some(true)
    }

    /// Whether `model` has an instance in routing that is not in `except`
    /// (cold path: a scan of the model, for a request whose own failures
    /// may have used up every live worker).
    pub fn has_routable(&self, model: &str, except: &[WorkerId]) -> bool {
        let Some(state) = self.registry.model(model) else {
            return false;
        };
        let view = state.view().load();
        let mut found = false;
        if !view.is_empty() {
            view.for_each_from(0, |_, place, chunk| {
                found |= !chunk.is_out(place.local) && !except.contains(&chunk.id(place.local));
            });
        }
        found
    }

    /// The signals that made `worker` busy at its last evaluation.
    pub fn busy_reasons(&self, worker: WorkerId) -> BusySignals {
        self.registry.with_worker(worker, |rec| rec.entry.reasons()).unwrap_or_default()
    }

    /// Calls `each` with every model whose waiting line holds requests, and
    /// how many (the line's count, read without its lock; no allocation).
    pub fn for_each_waiting(&self, mut each: impl FnMut(&str, usize)) {
        for (name, state) in self.registry.models.load().iter() {
            match state.line.waiting() {
                0 => {}
                waiting => each(name, waiting),
            }
        }
    }

    /// The requests the other frontends' lines hold for `model`, from their
    /// last beats ([`share_reports`](Self::share_reports)); 0 alone, or for
    /// an unknown model. Lock-free.
    pub fn others_waiting(&self, model: &str) -> u64 {
        self.registry.model(model).map_or(0, |state| state.line.share().others)
    }

    /// What `model`'s waiting line holds (`None` for an unknown model).
    pub fn line_stats(&self, model: &str) -> Option<LineStats> {
        self.registry.model(model).map(|state| state.line.stats())
    }

    /// The union of the signals every busy instance of `model` was
    /// published busy with (why a request to it was rejected as
    /// overloaded): read from the published view, whatever the number of
    /// instances.
    pub fn model_busy_reasons(&self, model: &str) -> BusySignals {
        self.registry.model(model).map_or_else(BusySignals::default, |state| state.signals())
    }

    /// The published busy set of `model` (by instance position), and the
    /// instance ids in the same order.
    pub fn busy_set(&self, model: &str) -> Option<(Vec<WorkerId>, BusySet)> {
        let state = self.registry.model(model)?;
        let view = state.view().load();
        let (ids, bits): (Vec<WorkerId>, Vec<bool>) = view.bits().unzip();
        let mut busy = BusySet::new(ids.len());
        bits.iter().enumerate().filter(|(_, &b)| b).for_each(|(i, _)| busy.set(i, true));
        Some((ids, busy))
    }

    /// Every registered worker, sorted by id.
    pub fn workers(&self) -> Vec<WorkerInfo> {
        self.records()
            .iter()
            .map(|rec| WorkerInfo {
                id: rec.entry.id,
                incarnation: rec.entry.incarnation,
                model: rec.model.name.to_string(),
                dp_size: rec.entry.dp_size,
                // Acquire: pairs with the mirror's Release store.
                busy: rec.entry.busy.load(Ordering::Acquire),
            })
            .collect()
    }

    /// The latest observed load of every rank of every worker, for metrics.
    pub fn rank_snapshots(&self) -> Vec<RankSnapshot> {
        let now = self.clock.now();
        let records = self.records();
        let ranks = records.iter().flat_map(|rec| (0..rec.entry.dp_size).map(move |rank| (rec, rank)));
        ranks.map(|(rec, rank)| rec.entry.snapshot(rank, &self.clock, now)).collect()
    }

    /// Every registered worker's current record, once each, by id (cold
    /// path). The concurrent map's scan may visit a record twice while the
    /// map grows, or both records of a restart; each id found is looked up
    /// again for its current one.
    fn records(&self) -> Vec<WorkerRecord> {
        let mut ids = Vec::with_capacity(self.registry.workers.len());
        self.registry.workers.for_each(|&id, _| ids.push(id));
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter().filter_map(|id| self.registry.with_worker(id, WorkerRecord::clone)).collect()
    }

    /// What this router tracks for one rank of `worker` (its own
    /// dispatches, not yet ended), with the worker's current incarnation:
    /// what a frontend publishes to the others ([`SharedLoad`]). `None` for
    /// an unknown worker or rank; a rank never tracked has the default load.
    pub fn tracked(&self, worker: WorkerId, rank: u32) -> Option<(u64, crate::RankLoad)> {
        self.registry.with_worker(worker, |rec| {
            (rank < rec.entry.dp_size).then(|| {
                let load = rec.entry.slot(rank, Publisher::Router).load().map(|(load, _)| load);
                (rec.entry.incarnation, load.unwrap_or_default())
            })
        })?
    }

    /// The effective load of `worker` summed over its ranks.
    pub fn worker_load(&self, worker: WorkerId) -> Option<WorkerLoad> {
        self.registry.with_worker(worker, |rec| self.load_of(&rec.entry))
    }

    /// Whether `entry` is busy at `thresholds` now (not the model's: the
    /// sheddable headroom's), from its ranks' loads (no lock).
    pub(crate) fn is_busy_at(&self, entry: &WorkerEntry, thresholds: &crate::thresholds::Thresholds) -> bool {
        entry.signals(thresholds, &self.clock, self.clock.now()).0
    }

    /// Sum of the effective load over a worker's ranks (no lock, no
    /// allocation); the router's load-aware policies call it.
    #[inline]
    pub(crate) fn load_of(&self, entry: &WorkerEntry) -> WorkerLoad {
        entry.load(&self.clock, self.clock.now())
    }

    /// The model's state, for the router (cold path: a router resolves each
    /// model once, and again when the state it holds was retired).
    pub(crate) fn model_state(&self, model: &str) -> Option<Arc<ModelState>> {
        self.registry.model(model)
    }
}

/// Publishes `model`'s view without `remove` and with `add`; returns whether
/// the model has no instance left (cold path, under the registry lock).
fn relist(model: &ModelState, remove: Option<&Arc<WorkerEntry>>, add: Option<&Arc<WorkerEntry>>) -> bool {
    model.lock().relist(remove, add)
}
