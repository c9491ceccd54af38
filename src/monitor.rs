//! [`WorkerMonitor`]: the worker registry, per-rank load slots, per-model
//! thresholds, and publication of each model's busy set.
//!
//! # Protocol
//!
//! A report that changes a slot bumps its worker's `version` (an RMW), then
//! evaluates the worker and compares the result with the worker's published
//! `busy` mirror. Only a difference takes the model's write lock, where the
//! worker is re-evaluated from the slots, the new bitmap is stored, and the
//! `version` is read again with an RMW: if it moved, someone changed the
//! inputs meanwhile and the evaluation repeats. Either the RMW sees that
//! writer's bump (and we repeat with its data), or that writer's bump comes
//! after ours in the version's modification order, acquires our release, and
//! sees our mirror (and takes the lock itself if it disagrees). No change is
//! lost, and a report that changes no bit takes no lock and allocates nothing.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use crossbeam_utils::CachePadded;

use crate::busy::BusySet;
use crate::load::{LoadReport, Publisher, RankLoad, RankSlot, SlotUpdate, WorkerId};
use crate::padded::Padded;
use crate::sync::{lock, Arc, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Mutex, Ordering, Swap};
use crate::thresholds::{BusySignals, BusyThresholds, ThresholdError, Thresholds};
use crate::view::ModelView;

/// How a [`WorkerMonitor`] behaves; `Default` is no staleness window and no
/// thresholds.
#[derive(Clone, Debug, Default)]
pub struct MonitorConfig {
    /// A worker-reported rank whose last report is older than this counts as
    /// not reported (so it cannot keep its worker busy). `None`: never stale.
    pub staleness: Option<Duration>,
    /// Thresholds every model starts with (the frontend's command-line flags).
    pub default_thresholds: BusyThresholds,
}

/// Decides which workers are busy and publishes each model's busy set.
///
/// Shared by the event plane (which calls [`apply`](Self::apply)), the router
/// (which reads the published sets) and the HTTP layer (thresholds, metrics).
///
/// # Examples
///
/// ```
/// use loadgate::{BusyThresholds, LoadReport, Publisher, RankLoad, WorkerMonitor};
///
/// let monitor = WorkerMonitor::new(Default::default()).unwrap();
/// monitor.register(7, "llama", 1).unwrap();
/// monitor
///     .set_thresholds("llama", BusyThresholds { active_decode_blocks_threshold: Some(0.5), ..Default::default() })
///     .unwrap();
/// let load = RankLoad { active_decode_blocks: 60, kv_total_blocks: 100, ..Default::default() };
/// monitor.apply(&LoadReport { worker: 7, rank: 0, publisher: Publisher::Worker, seq: 1, load }).unwrap();
/// assert!(monitor.is_busy(7));
/// ```
pub struct WorkerMonitor {
    registry: Swap<Registry>,
    /// Serialises registry changes (cold path: registration, new models).
    registry_write: Mutex<()>,
    clock: quanta::Clock,
    base: quanta::Instant,
    staleness_ns: u64,
    default_thresholds: Thresholds,
}

impl fmt::Debug for WorkerMonitor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let reg = self.registry.load();
        f.debug_struct("WorkerMonitor")
            .field("workers", &reg.workers.len())
            .field("models", &reg.models.len())
            .field("staleness_ns", &self.staleness_ns)
            .finish()
    }
}

#[derive(Default)]
struct Registry {
    workers: HashMap<WorkerId, WorkerRecord, RegistryHash>,
    models: HashMap<Arc<str>, Arc<ModelState>, RegistryHash>,
}

/// The registry's hash: every report looks up a worker id and every
/// [`Router::route`](crate::Router::route) a model name, so SipHash's cost
/// (tens of nanoseconds) shows on both hot paths. The keys are registered by
/// the operator's workers, not chosen by clients, so an unkeyed hash (rustc's
/// Fx hash) is safe.
type RegistryHash = rustc_hash::FxBuildHasher;

#[derive(Clone)]
struct WorkerRecord {
    entry: Arc<WorkerEntry>,
    model: Arc<ModelState>,
}

/// One registered worker: its slots and its published state.
pub(crate) struct WorkerEntry {
    pub(crate) id: WorkerId,
    dp_size: u32,
    /// `dp_size * Publisher::COUNT` slots, rank-major.
    slots: Box<[RankSlot]>,
    /// Bumped (RMW) after every change to this worker's inputs.
    version: CachePadded<AtomicU64>,
    /// The busy bit as last published; written only under the model's lock.
    busy: AtomicBool,
    /// The signals that made it busy at its last evaluation (diagnostics).
    reasons: AtomicU32,
    /// Index in the model's instance list; written only under the model's lock.
    position: AtomicUsize,
}

impl WorkerEntry {
    #[inline]
    fn slot(&self, rank: u32, publisher: Publisher) -> &RankSlot {
        &self.slots[rank as usize * Publisher::COUNT + publisher.index()]
    }
}

/// One model: its thresholds, its published view, and its write lock.
pub(crate) struct ModelState {
    pub(crate) name: Arc<str>,
    thresholds: Swap<Thresholds>,
    pub(crate) view: Swap<ModelView>,
    /// Serialises publication for this model (cold path: bit flips,
    /// threshold changes, registration), and holds the view replaced last
    /// (see [`replace_view`]).
    write: Mutex<Option<Arc<ModelView>>>,
    /// Round-robin cursor, shared by every router of this monitor.
    pub(crate) cursor: CachePadded<AtomicUsize>,
}

/// What [`WorkerMonitor::apply`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// Older than (or as old as) the last report from this publisher: dropped.
    Stale,
    /// Stored; the worker's busy state did not change.
    Stored,
    /// Stored, and the worker's busy bit flipped (a new busy set was published).
    Flipped,
}

/// A report or tracking update that could not be applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApplyError {
    /// No worker with this id is registered.
    UnknownWorker(WorkerId),
    /// The rank is not below the worker's declared data-parallel size.
    RankOutOfRange {
        /// The worker.
        worker: WorkerId,
        /// The rank in the report.
        rank: u32,
        /// The worker's declared data-parallel size.
        dp_size: u32,
    },
}

impl fmt::Display for ApplyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownWorker(w) => write!(f, "worker {w} is not registered"),
            Self::RankOutOfRange { worker, rank, dp_size } => {
                write!(f, "rank {rank} is out of range for worker {worker} with dp size {dp_size}")
            }
        }
    }
}

impl std::error::Error for ApplyError {}

/// A registration that could not be made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegisterError {
    /// The data-parallel size must be at least 1 (and at most 65536).
    InvalidDpSize(u32),
    /// The model name is empty.
    EmptyModel,
    /// The id is already registered with a different model or dp size.
    Conflict(WorkerId),
}

impl fmt::Display for RegisterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidDpSize(n) => write!(f, "data-parallel size must be between 1 and 65536, got {n}"),
            Self::EmptyModel => f.write_str("model name must not be empty"),
            Self::Conflict(w) => write!(f, "worker {w} is already registered with another model or dp size"),
        }
    }
}

impl std::error::Error for RegisterError {}

/// A threshold change that could not be made.
#[derive(Clone, Debug, PartialEq)]
pub enum SetThresholdsError {
    /// No such model has been seen.
    UnknownModel(String),
    /// A value is invalid.
    Invalid(ThresholdError),
}

impl fmt::Display for SetThresholdsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownModel(m) => write!(f, "unknown model {m:?}"),
            Self::Invalid(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for SetThresholdsError {}

impl From<ThresholdError> for SetThresholdsError {
    fn from(e: ThresholdError) -> Self {
        Self::Invalid(e)
    }
}

/// The latest observed load of one rank, for metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankSnapshot {
    /// The worker.
    pub worker: WorkerId,
    /// The rank.
    pub rank: u32,
    /// The worker's own last report (`None`: never reported, or stale).
    pub reported: Option<RankLoad>,
    /// The router's tracked load (`None`: never tracked).
    pub tracked: Option<RankLoad>,
}

impl RankSnapshot {
    /// The load the busy decision uses: the larger of reported and tracked.
    pub fn effective(&self) -> Option<RankLoad> {
        match (self.reported, self.tracked) {
            (Some(r), Some(t)) => Some(r.max_with(&t)),
            (r, t) => r.or(t),
        }
    }
}

/// A worker as registered, for listings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerInfo {
    /// The worker's id.
    pub id: WorkerId,
    /// The model it serves.
    pub model: String,
    /// Its declared data-parallel size.
    pub dp_size: u32,
    /// Whether it is in its model's published busy set.
    pub busy: bool,
}

/// The sum of a worker's effective load over its ranks (least-loaded and
/// cost policies rank workers by it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkerLoad {
    /// Sum of active decode blocks.
    pub active_decode_blocks: u64,
    /// Sum of known total KV blocks.
    pub kv_total_blocks: u64,
    /// Sum of active prefill tokens.
    pub active_prefill_tokens: u64,
}

impl WorkerLoad {
    /// Orders loads: lower decode utilisation first (exact cross-multiplied),
    /// then fewer prefill tokens.
    pub fn cmp_load(&self, other: &WorkerLoad) -> std::cmp::Ordering {
        let util = |l: &WorkerLoad, o: &WorkerLoad| {
            // Unknown capacity counts as capacity 1 so blocks still compare.
            u128::from(l.active_decode_blocks) * u128::from(o.kv_total_blocks.max(1))
        };
        util(self, other).cmp(&util(other, self)).then(self.active_prefill_tokens.cmp(&other.active_prefill_tokens))
    }
}

const MAX_DP_SIZE: u32 = 65_536;

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
        let base = clock.now();
        let staleness_ns = match config.staleness {
            Some(d) => u64::try_from(d.as_nanos()).unwrap_or(u64::MAX),
            None => u64::MAX,
        };
        Ok(WorkerMonitor {
            registry: Swap::from_pointee(Registry::default()),
            registry_write: Mutex::new(()),
            clock,
            base,
            staleness_ns,
            default_thresholds,
        })
    }

    #[inline]
    fn now_ns(&self) -> u64 {
        u64::try_from(self.clock.now().duration_since(self.base).as_nanos()).unwrap_or(u64::MAX - 1)
    }

    #[inline]
    fn is_fresh(&self, at: u64, now: u64) -> bool {
        now.saturating_sub(at) <= self.staleness_ns
    }

    /// Registers a worker serving `model` with `dp_size` data-parallel ranks.
    /// Its ranks start unreported, so it starts free. Registering the same id
    /// again with the same model and size is a no-op returning `Ok(false)`.
    ///
    /// Cold path: takes the registry lock and the model's lock.
    ///
    /// # Errors
    ///
    /// [`RegisterError`] for a zero or huge dp size, an empty model name, or an
    /// id already registered differently.
    pub fn register(&self, worker: WorkerId, model: &str, dp_size: u32) -> Result<bool, RegisterError> {
        if dp_size == 0 || dp_size > MAX_DP_SIZE {
            return Err(RegisterError::InvalidDpSize(dp_size));
        }
        if model.is_empty() {
            return Err(RegisterError::EmptyModel);
        }
        let _registry = lock(&self.registry_write);
        let current = self.registry.load_full();
        if let Some(rec) = current.workers.get(&worker) {
            return if &*rec.model.name == model && rec.entry.dp_size == dp_size {
                Ok(false)
            } else {
                Err(RegisterError::Conflict(worker))
            };
        }
        let mut models = current.models.clone();
        let state = models.entry(Arc::from(model)).or_insert_with_key(|name| self.new_model(name.clone())).clone();
        let entry = Arc::new(WorkerEntry {
            id: worker,
            dp_size,
            slots: (0..dp_size as usize * Publisher::COUNT).map(|_| RankSlot::new()).collect(),
            version: CachePadded::new(AtomicU64::new(0)),
            busy: AtomicBool::new(false),
            reasons: AtomicU32::new(0),
            position: AtomicUsize::new(usize::MAX),
        });
        {
            let mut retired = lock(&state.write);
            let next = {
                let view = state.view.load();
                let mut instances: Vec<Arc<WorkerEntry>> = view.instances.iter().cloned().collect();
                instances.push(entry.clone());
                instances.sort_by_key(|e| e.id);
                rebuild(&instances, view.filtering)
            };
            replace_view(&state, &mut retired, next);
        }
        let mut workers = current.workers.clone();
        workers.insert(worker, WorkerRecord { entry, model: state });
        self.registry.store(Arc::new(Registry { workers, models }));
        Ok(true)
    }

    /// Removes a worker; returns whether it was registered. Its model, and
    /// the model's thresholds, stay.
    ///
    /// Cold path: takes the registry lock and the model's lock.
    pub fn deregister(&self, worker: WorkerId) -> bool {
        let _registry = lock(&self.registry_write);
        let current = self.registry.load_full();
        let Some(rec) = current.workers.get(&worker).cloned() else {
            return false;
        };
        {
            let mut retired = lock(&rec.model.write);
            let next = {
                let view = rec.model.view.load();
                let instances: Vec<Arc<WorkerEntry>> =
                    view.instances.iter().filter(|e| e.id != worker).cloned().collect();
                rec.entry.position.store(usize::MAX, Ordering::Relaxed); // under the model lock
                rebuild(&instances, view.filtering)
            };
            replace_view(&rec.model, &mut retired, next);
        }
        let mut workers = current.workers.clone();
        workers.remove(&worker);
        self.registry.store(Arc::new(Registry { workers, models: current.models.clone() }));
        true
    }

    fn new_model(&self, name: Arc<str>) -> Arc<ModelState> {
        let filtering = self.default_thresholds.is_enabled();
        Arc::new(ModelState {
            name,
            thresholds: Swap::from_pointee(self.default_thresholds),
            view: Swap::from_pointee(ModelView::empty(filtering)),
            write: Mutex::new(None),
            cursor: CachePadded::new(AtomicUsize::new(0)),
        })
    }

    /// Makes `model` known without any worker (so its thresholds can be set
    /// and it routes as unavailable rather than unknown). Returns whether it
    /// was new; an empty name is refused (as [`register`](Self::register)
    /// refuses it) and returns false.
    pub fn add_model(&self, model: &str) -> bool {
        if model.is_empty() {
            return false;
        }
        let _registry = lock(&self.registry_write);
        let current = self.registry.load_full();
        if current.models.contains_key(model) {
            return false;
        }
        let mut models = current.models.clone();
        models.insert(Arc::from(model), self.new_model(Arc::from(model)));
        self.registry.store(Arc::new(Registry { workers: current.workers.clone(), models }));
        true
    }

    /// Applies one load report. Hot path: a report that flips no busy bit
    /// takes no lock and allocates nothing.
    ///
    /// # Errors
    ///
    /// [`ApplyError`] for an unregistered worker or a rank out of range.
    pub fn apply(&self, report: &LoadReport) -> Result<Applied, ApplyError> {
        let registry = self.registry.load();
        let rec = lookup(&registry, report.worker, report.rank)?;
        let now = self.now_ns();
        let slot = rec.entry.slot(report.rank, report.publisher);
        let was_fresh = slot.load().is_some_and(|(_, at)| self.is_fresh(at, now));
        match slot.store(report.seq, &report.load, now) {
            SlotUpdate::Stale => Ok(Applied::Stale),
            SlotUpdate::Unchanged if was_fresh => Ok(Applied::Stored),
            _ => Ok(self.changed(&rec.entry, &rec.model, now)),
        }
    }

    /// Adds to (or, negative, removes from) the router-tracked load of one
    /// rank: what the router dispatched and has not yet seen end. The
    /// router-tracked load never goes stale.
    ///
    /// # Errors
    ///
    /// [`ApplyError`] for an unregistered worker or a rank out of range.
    pub fn track(&self, worker: WorkerId, rank: u32, blocks: i64, prefill_tokens: i64) -> Result<Applied, ApplyError> {
        let registry = self.registry.load();
        let rec = lookup(&registry, worker, rank)?;
        let now = self.now_ns();
        rec.entry.slot(rank, Publisher::Router).add(blocks, prefill_tokens, now);
        Ok(self.changed(&rec.entry, &rec.model, now))
    }

    /// Sets the router-tracked denominators of a rank (the capacity the
    /// router assumes), keeping its numerators.
    ///
    /// # Errors
    ///
    /// [`ApplyError`] for an unregistered worker or a rank out of range.
    pub fn set_tracked_capacity(
        &self,
        worker: WorkerId,
        rank: u32,
        kv_total_blocks: u32,
        max_num_batched_tokens: u32,
    ) -> Result<Applied, ApplyError> {
        let registry = self.registry.load();
        let rec = lookup(&registry, worker, rank)?;
        let now = self.now_ns();
        rec.entry.slot(rank, Publisher::Router).set_denominators(kv_total_blocks, max_num_batched_tokens, now);
        Ok(self.changed(&rec.entry, &rec.model, now))
    }

    /// After a slot changed: bump the version, evaluate, and publish only if
    /// the busy bit differs from the published one.
    #[inline]
    fn changed(&self, entry: &Arc<WorkerEntry>, model: &ModelState, now: u64) -> Applied {
        // AcqRel RMW: releases our slot stores to whoever reads the version
        // with an RMW under the lock, and acquires any earlier publisher's
        // mirror store (see the module docs).
        entry.version.fetch_add(1, Ordering::AcqRel);
        let thresholds = **model.thresholds.load();
        let (busy, reasons) = self.evaluate(entry, &thresholds, now);
        // Relaxed: diagnostic labels only; last writer wins.
        entry.reasons.store(reasons, Ordering::Relaxed);
        // Acquire: pairs with the Release store under the lock.
        if entry.busy.load(Ordering::Acquire) == busy {
            return Applied::Stored;
        }
        self.publish(model, std::slice::from_ref(entry))
    }

    /// Evaluates one worker: busy only when every declared rank is busy.
    /// Returns the busy bit and the union of the signals that fired.
    fn evaluate(&self, entry: &WorkerEntry, thresholds: &Thresholds, now: u64) -> (bool, u32) {
        if !thresholds.is_enabled() {
            return (false, 0);
        }
        let mut signals = BusySignals::default();
        for rank in 0..entry.dp_size {
            let Some(load) = self.effective(entry, rank, now) else {
                return (false, 0); // an unreported rank keeps its worker free
            };
            let fired = thresholds.evaluate(&load);
            if !fired.any() {
                return (false, 0);
            }
            signals = signals.union(fired);
        }
        (true, encode(signals))
    }

    /// The load the decision uses for one rank, or `None` when unreported.
    #[inline]
    fn effective(&self, entry: &WorkerEntry, rank: u32, now: u64) -> Option<RankLoad> {
        let snapshot = self.snapshot(entry, rank, now);
        snapshot.effective()
    }

    fn snapshot(&self, entry: &WorkerEntry, rank: u32, now: u64) -> RankSnapshot {
        let reported =
            entry.slot(rank, Publisher::Worker).load().filter(|(_, at)| self.is_fresh(*at, now)).map(|(load, _)| load);
        let tracked = entry.slot(rank, Publisher::Router).load().map(|(load, _)| load);
        RankSnapshot { worker: entry.id, rank, reported, tracked }
    }

    /// Takes the model's lock and brings the published bits of `entries` in
    /// line with their slots, repeating while their versions move.
    #[cold]
    fn publish(&self, model: &ModelState, entries: &[Arc<WorkerEntry>]) -> Applied {
        let mut retired = lock(&model.write);
        self.reconcile_locked(model, &mut retired, entries.to_vec(), None)
    }

    /// Under the model's lock: re-evaluate `pending`, publish one new view if
    /// any bit (or `filtering`) changed, and repeat for entries whose version
    /// moved meanwhile.
    fn reconcile_locked(
        &self,
        model: &ModelState,
        retired: &mut Option<Arc<ModelView>>,
        mut pending: Vec<Arc<WorkerEntry>>,
        mut filtering: Option<bool>,
    ) -> Applied {
        let mut flipped = false;
        while !pending.is_empty() || filtering.is_some() {
            let thresholds = **model.thresholds.load();
            let now = self.now_ns();
            let view = model.view.load();
            let mut bits: Option<BusySet> = None;
            let mut seen = Vec::with_capacity(pending.len());
            for entry in pending.drain(..) {
                // Acquire: sees the slot stores released by the bump we read.
                let before = entry.version.load(Ordering::Acquire);
                let (busy, reasons) = self.evaluate(&entry, &thresholds, now);
                entry.reasons.store(reasons, Ordering::Relaxed);
                // Relaxed: the mirror is only written under this lock.
                let position = entry.position.load(Ordering::Relaxed);
                if entry.busy.load(Ordering::Relaxed) != busy && position != usize::MAX {
                    bits.get_or_insert_with(|| view.busy.clone()).set(position, busy);
                    flipped = true;
                }
                seen.push((entry, before, busy));
            }
            let next_filtering = filtering.take().unwrap_or(view.filtering);
            let changed = bits.is_some() || next_filtering != view.filtering;
            let next = changed.then(|| {
                let busy = bits.unwrap_or_else(|| view.busy.clone());
                ModelView::new(view.instances.clone(), view.ids.clone(), busy, next_filtering)
            });
            drop(view); // before the swap, which would otherwise pay this guard's debt
            if let Some(next) = next {
                replace_view(model, retired, next);
            }
            for (entry, before, busy) in seen {
                // Release: a writer whose bump follows ours acquires this and
                // compares against the bit we just published.
                entry.busy.store(busy, Ordering::Release);
                // AcqRel RMW: reads the latest version; if it moved, a writer
                // changed the inputs after our evaluation read them.
                if entry.version.fetch_add(0, Ordering::AcqRel) != before {
                    pending.push(entry);
                }
            }
        }
        if flipped {
            Applied::Flipped
        } else {
            Applied::Stored
        }
    }

    /// Re-evaluates every worker (after time passed: ranks can go stale).
    /// Returns how many busy bits flipped. Call it periodically when a
    /// staleness window is set.
    pub fn expire_stale(&self) -> usize {
        let registry = self.registry.load_full();
        let now = self.now_ns();
        let mut flips = 0;
        for model in registry.models.values() {
            let thresholds = **model.thresholds.load();
            let view = model.view.load_full();
            let stale: Vec<Arc<WorkerEntry>> = view
                .instances
                .iter()
                .filter(|e| {
                    let (busy, reasons) = self.evaluate(e, &thresholds, now);
                    // Relaxed: diagnostic labels only; last writer wins (as
                    // in `changed`). Refreshed even when the bit stays.
                    e.reasons.store(reasons, Ordering::Relaxed);
                    // Acquire: pairs with the mirror's Release store.
                    busy != e.busy.load(Ordering::Acquire)
                })
                .cloned()
                .collect();
            if !stale.is_empty() {
                flips += stale.len();
                let mut retired = lock(&model.write);
                self.reconcile_locked(model, &mut retired, stale, None);
            }
        }
        flips
    }

    /// Replaces a model's thresholds; every worker of the model is
    /// re-evaluated and the busy set published before this returns.
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
    /// # Errors
    ///
    /// Unknown model, or an invalid value (nothing changes then).
    pub fn update_thresholds(
        &self,
        model: &str,
        edit: impl FnOnce(&mut BusyThresholds),
    ) -> Result<Thresholds, SetThresholdsError> {
        let registry = self.registry.load_full();
        let state = registry.models.get(model).ok_or_else(|| SetThresholdsError::UnknownModel(model.to_owned()))?;
        let mut retired = lock(&state.write);
        let mut config = state.thresholds.load().to_config();
        edit(&mut config);
        let next = config.validate()?;
        state.thresholds.store(Arc::new(next));
        let instances = state.view.load().instances.to_vec();
        self.reconcile_locked(state, &mut retired, instances, Some(next.is_enabled()));
        Ok(next)
    }

    /// A model's thresholds, or `None` for an unknown model.
    pub fn thresholds(&self, model: &str) -> Option<Thresholds> {
        self.registry.load().models.get(model).map(|m| **m.thresholds.load())
    }

    /// Every known model with its thresholds, sorted by name.
    pub fn all_thresholds(&self) -> Vec<(String, Thresholds)> {
        let registry = self.registry.load();
        let mut all: Vec<_> = registry.models.values().map(|m| (m.name.to_string(), **m.thresholds.load())).collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// Every known model name (with or without workers), sorted.
    pub fn models(&self) -> Vec<String> {
        let registry = self.registry.load();
        let mut names: Vec<String> = registry.models.keys().map(|m| m.to_string()).collect();
        names.sort();
        names
    }

    /// Whether `model` is known.
    pub fn has_model(&self, model: &str) -> bool {
        self.registry.load().models.contains_key(model)
    }

    /// Whether `worker` is in its model's published busy set.
    pub fn is_busy(&self, worker: WorkerId) -> bool {
        let registry = self.registry.load();
        registry.workers.get(&worker).is_some_and(|rec| {
            let view = rec.model.view.load();
            let position = view.instances.iter().position(|e| e.id == worker);
            position.is_some_and(|p| view.busy.is_busy(p))
        })
    }

    /// The signals that made `worker` busy at its last evaluation.
    pub fn busy_reasons(&self, worker: WorkerId) -> BusySignals {
        let registry = self.registry.load();
        registry.workers.get(&worker).map_or_else(BusySignals::default, |rec| {
            // Relaxed: diagnostic only.
            decode(rec.entry.reasons.load(Ordering::Relaxed))
        })
    }

    /// The union of the reasons of every busy instance of `model` (why a
    /// request to it was rejected as overloaded).
    pub fn model_busy_reasons(&self, model: &str) -> BusySignals {
        let registry = self.registry.load();
        let Some(state) = registry.models.get(model) else {
            return BusySignals::default();
        };
        let view = state.view.load();
        view.instances
            .iter()
            .enumerate()
            .filter(|(i, _)| view.busy.is_busy(*i))
            // Relaxed: diagnostic only.
            .fold(BusySignals::default(), |acc, (_, e)| acc.union(decode(e.reasons.load(Ordering::Relaxed))))
    }

    /// The published busy set of `model` (by instance position), and the
    /// instance ids in the same order.
    pub fn busy_set(&self, model: &str) -> Option<(Vec<WorkerId>, BusySet)> {
        let registry = self.registry.load();
        let state = registry.models.get(model)?;
        let view = state.view.load();
        Some((view.instances.iter().map(|e| e.id).collect(), view.busy.clone()))
    }

    /// Every registered worker, sorted by id.
    pub fn workers(&self) -> Vec<WorkerInfo> {
        let registry = self.registry.load();
        let mut all: Vec<WorkerInfo> = registry
            .workers
            .values()
            .map(|rec| WorkerInfo {
                id: rec.entry.id,
                model: rec.model.name.to_string(),
                dp_size: rec.entry.dp_size,
                // Acquire: pairs with the mirror's Release store.
                busy: rec.entry.busy.load(Ordering::Acquire),
            })
            .collect();
        all.sort_by_key(|w| w.id);
        all
    }

    /// The latest observed load of every rank of every worker, for metrics.
    pub fn rank_snapshots(&self) -> Vec<RankSnapshot> {
        let registry = self.registry.load();
        let now = self.now_ns();
        let mut all: Vec<RankSnapshot> = registry
            .workers
            .values()
            .flat_map(|rec| (0..rec.entry.dp_size).map(move |rank| (rec.entry.clone(), rank)))
            .map(|(entry, rank)| self.snapshot(&entry, rank, now))
            .collect();
        all.sort_by_key(|s| (s.worker, s.rank));
        all
    }

    /// The effective load of `worker` summed over its ranks.
    pub fn worker_load(&self, worker: WorkerId) -> Option<WorkerLoad> {
        let registry = self.registry.load();
        registry.workers.get(&worker).map(|rec| self.load_of(&rec.entry))
    }

    /// Sum of the effective load over a worker's ranks (no lock, no allocation).
    #[inline]
    pub(crate) fn load_of(&self, entry: &WorkerEntry) -> WorkerLoad {
        let now = self.now_ns();
        let mut sum = WorkerLoad::default();
        for rank in 0..entry.dp_size {
            if let Some(l) = self.effective(entry, rank, now) {
                sum.active_decode_blocks += u64::from(l.active_decode_blocks);
                sum.kv_total_blocks += u64::from(l.kv_total_blocks);
                sum.active_prefill_tokens += u64::from(l.active_prefill_tokens);
            }
        }
        sum
    }

    /// The model's state, for the router (one registry load and a lookup).
    #[inline]
    pub(crate) fn with_model<R>(&self, model: &str, f: impl FnOnce(Option<&ModelState>) -> R) -> R {
        let registry = self.registry.load();
        f(registry.models.get(model).map(|m| &**m))
    }
}

#[inline]
fn lookup(registry: &Registry, worker: WorkerId, rank: u32) -> Result<&WorkerRecord, ApplyError> {
    let rec = registry.workers.get(&worker).ok_or(ApplyError::UnknownWorker(worker))?;
    if rank >= rec.entry.dp_size {
        return Err(ApplyError::RankOutOfRange { worker, rank, dp_size: rec.entry.dp_size });
    }
    Ok(rec)
}

/// Publishes `next` as `model`'s view, under the model's lock (`retired` is
/// what it guards). The view it replaces is kept until the next publication,
/// so the writer, not a router, usually drops the last reference to a view:
/// a [`LocalRouter`](crate::LocalRouter) that still holds the old one only
/// decrements a count when it moves on, and frees nothing on the hot path.
///
/// The caller holds no guard or `Arc` of the current view, and the swap
/// hands back arc-swap's own reference: publishing touches no count of the
/// view that routers are still reading.
fn replace_view(model: &ModelState, retired: &mut Option<Arc<ModelView>>, next: ModelView) {
    *retired = Some(model.view.swap(Arc::new(next)));
}

/// A fresh view over `instances` (sorted), keeping each one's published bit.
/// Called under the model's lock.
fn rebuild(instances: &[Arc<WorkerEntry>], filtering: bool) -> ModelView {
    let mut busy = BusySet::new(instances.len());
    for (position, entry) in instances.iter().enumerate() {
        // Relaxed: written and read under the model's lock.
        entry.position.store(position, Ordering::Relaxed);
        if entry.busy.load(Ordering::Relaxed) {
            busy.set(position, true);
        }
    }
    let ids = Arc::new(CachePadded::new(Padded::new(instances.iter().map(|e| e.id))));
    ModelView::new(Arc::from(instances.to_vec()), ids, busy, filtering)
}

fn encode(s: BusySignals) -> u32 {
    u32::from(s.decode) | u32::from(s.prefill) << 1 | u32::from(s.prefill_frac) << 2
}

fn decode(bits: u32) -> BusySignals {
    BusySignals { decode: bits & 1 != 0, prefill: bits & 2 != 0, prefill_frac: bits & 4 != 0 }
}

impl WorkerMonitor {
    /// The model's state, kept by a [`ModelRouter`](crate::ModelRouter).
    pub(crate) fn model_state(&self, model: &str) -> Option<Arc<ModelState>> {
        self.registry.load().models.get(model).cloned()
    }
}
