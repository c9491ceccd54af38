//! The publication protocol: how a report that changes a worker's busy bit
//! becomes a new [`ModelView`] without losing a concurrent change.
//!
//! # The protocol
//!
//! Every change to a worker's inputs (a stored report, a tracked-load
//! update, a registration with fresh slots) is followed by a bump of the
//! worker's `version`, an AcqRel read-modify-write. The writer then
//! evaluates the worker and compares the result with the worker's published
//! `busy` mirror (Acquire). Equal: done, no lock, no allocation. Different:
//! it takes the model's write lock and *reconciles*: under the lock it reads
//! `version` (Acquire), evaluates from the slots, publishes a new view if the
//! bit differs from the mirror, stores the mirror (Release), and reads
//! `version` again with an RMW. If the version moved, another writer changed
//! the inputs after this evaluation read them, and the evaluation repeats.
//!
//! # Why no change is lost
//!
//! Take a writer W whose change lands while a reconciler R holds the lock.
//! The bumps and R's final RMW are read-modify-writes of one atomic, so they
//! are totally ordered:
//!
//! - W's bump comes first: R's final RMW reads a version other than the one
//!   it started from and evaluates again. It acquires W's bump, which W
//!   released after its store, so the new evaluation sees W's input.
//! - R's final RMW comes first: W's bump reads from it and acquires R's
//!   mirror store (released before the RMW). W's own evaluation sees its own
//!   input; if the result differs from the mirror R published, W takes the
//!   lock and reconciles itself.
//!
//! Either way the last evaluation of the worker sees every input, and the
//! mirror and the published bit end equal to it. Two reconcilers never run
//! at once for one model (the lock), so they cannot publish over each other.
//!
//! # Expiry
//!
//! A worker-reported rank goes stale as time passes, without any write.
//! [`WorkerMonitor::expire_stale`](super::WorkerMonitor::expire_stale)
//! evaluates every worker and reconciles those whose result differs from
//! the mirror. A report racing it is an input change like any other: it
//! stores its timestamp, bumps the version and evaluates (there is no
//! "unchanged values" shortcut: a report that repeats the same values still
//! refreshes the timestamp, which is an input). So if expiry publishes a
//! worker free from the old timestamp, either its final RMW sees the
//! report's bump and it evaluates again with the fresh timestamp, or the
//! report's evaluation sees the free mirror and republishes it busy.
//!
//! # Thresholds
//!
//! A threshold change stores the new thresholds and reconciles every worker
//! of the model under the lock before it returns. A report evaluating with
//! the old thresholds while that happens either precedes the reconciliation
//! in the version order (and is re-evaluated by it) or follows it (and
//! evaluates with the new thresholds, which it loads after its bump).

use crate::monitor::clock::MonitorClock;
use crate::monitor::entry::WorkerEntry;
use crate::monitor::entry::{decode, encode};
use crate::monitor::reasons::ReasonCounts;
use crate::monitor::view::{Change, ModelView, Toggle, CHUNK_MAX};
use crate::sync::{lock, Arc, AtomicBool, AtomicU32, Mutex, Ordering, Swap};
use crate::thresholds::{BusySignals, Thresholds};
use crate::waiting::{Changed, Line, LineLimits};

/// The most instances a chunk of a model's view holds: small under loom,
/// so that a model of a few workers spans several chunks.
pub(crate) const CHUNK_CAPACITY: usize = if cfg!(all(loom, feature = "loom")) { 2 } else { CHUNK_MAX };

/// One model: its thresholds, its published view, and its write lock.
pub(crate) struct ModelState {
    pub(crate) name: Arc<str>,
    pub(crate) thresholds: Swap<Thresholds>,
    /// Shared with the line, which keeps a cache of it under its lock.
    view: Arc<Swap<ModelView>>,
    /// Named by `add_model` or given thresholds: stays when its last worker
    /// leaves. Written and read under the monitor's registry lock.
    kept: AtomicBool,
    /// Forgotten by the monitor (its last worker left); a router that still
    /// holds this state looks the model up again.
    retired: AtomicBool,
    /// The union of the signals its busy instances hold them busy with
    /// (`entry::encode`): a 529's reasons in one load.
    signals: AtomicU32,
    /// Requests waiting for an instance to free (see [`crate::waiting`]).
    pub(crate) line: Line,
    /// Serialises publication for this model (cold path: bit flips,
    /// threshold changes, registration), and holds what only the writer
    /// keeps.
    write: Mutex<Written>,
}

/// What a model's writer keeps under its lock.
#[derive(Default)]
struct Written {
    /// The view replaced last (see [`ModelWriter::replace`]).
    retired: Option<Arc<ModelView>>,
    /// The busy instances per signal: `signals` is their union.
    reasons: ReasonCounts,
}

impl ModelState {
    /// A model with no instances, whose view's chunks hold at most
    /// `capacity` instances ([`CHUNK_CAPACITY`] but in tests).
    pub(crate) fn new(name: Arc<str>, thresholds: Thresholds, line: LineLimits, capacity: usize) -> Self {
        let view = Arc::new(Swap::from_pointee(ModelView::empty(thresholds.is_enabled(), capacity)));
        ModelState {
            name,
            thresholds: Swap::from_pointee(thresholds),
            line: Line::new(line, view.clone()),
            view,
            kept: AtomicBool::new(false),
            retired: AtomicBool::new(false),
            signals: AtomicU32::new(0),
            write: Mutex::new(Written::default()),
        }
    }

    /// The union of the signals its busy instances were last evaluated busy
    /// with (why a request to it is rejected as overloaded).
    #[inline]
    pub(crate) fn signals(&self) -> BusySignals {
        // Relaxed: diagnostic labels; stored under the write lock after
        // each change of the counts.
        decode(self.signals.load(Ordering::Relaxed))
    }

    /// Marks the model kept (cold path, under the registry lock).
    pub(crate) fn keep(&self) {
        // Relaxed: written and read only under the registry lock.
        self.kept.store(true, Ordering::Relaxed);
    }

    /// Whether the model stays without workers (under the registry lock).
    pub(crate) fn is_kept(&self) -> bool {
        // Relaxed: written and read only under the registry lock.
        self.kept.load(Ordering::Relaxed)
    }

    /// Marks the model forgotten, after the registry without it is stored.
    pub(crate) fn retire(&self) {
        // Release: a router that sees the flag (Acquire) and looks the
        // model up again sees the registry stored before it.
        self.retired.store(true, Ordering::Release);
    }

    /// Whether the monitor has forgotten this model (cold path: a router
    /// asks only when the model has no instance).
    #[inline]
    pub(crate) fn is_retired(&self) -> bool {
        // Acquire: pairs with the Release in `retire`.
        self.retired.load(Ordering::Acquire)
    }

    /// The published view, which routers read.
    #[inline]
    pub(crate) fn view(&self) -> &Swap<ModelView> {
        &self.view
    }

    /// Takes the model's write lock (cold path).
    pub(crate) fn lock(&self) -> ModelWriter<'_> {
        ModelWriter { model: self, written: lock(&self.write) }
    }
}

/// The model's write lock held: the only way to publish a view.
pub(crate) struct ModelWriter<'a> {
    model: &'a ModelState,
    written: crate::sync::MutexGuard<'a, Written>,
}

impl ModelWriter<'_> {
    /// Publishes `next`. The view it replaces is kept until the next
    /// publication, so the writer, not a router, usually drops the last
    /// reference to a view: a [`LocalRouter`](crate::LocalRouter) that still
    /// holds the old one only decrements a count when it moves on, and frees
    /// nothing on the hot path.
    ///
    /// The caller holds no guard or `Arc` of the current view, and the swap
    /// hands back arc-swap's own reference: publishing touches no count of
    /// the view that routers are still reading.
    fn replace(&mut self, next: ModelView, changed: Changed<'_>) {
        self.written.retired = Some(self.model.view.swap(Arc::new(next)));
        // After the store: a waiter may now find an instance free.
        self.model.line.published(changed);
    }

    /// Counts instances as no longer busy with their first signals and now
    /// busy with their second in the model's reasons, then publishes the
    /// union once.
    fn recount(&mut self, changes: impl IntoIterator<Item = (Option<BusySignals>, Option<BusySignals>)>) {
        let reasons = &mut self.written.reasons;
        for (was, now) in changes {
            was.into_iter().for_each(|signals| reasons.remove(signals));
            now.into_iter().for_each(|signals| reasons.add(signals));
        }
        // Relaxed: see `ModelState::signals`.
        self.model.signals.store(encode(reasons.signals()), Ordering::Relaxed);
    }

    /// Publishes the view without `remove` and with `add` (see
    /// [`ModelView::with_member`]); returns whether the model has no
    /// instance left.
    pub(crate) fn relist(&mut self, remove: Option<&Arc<WorkerEntry>>, add: Option<&Arc<WorkerEntry>>) -> bool {
        let view = self.model.view.load();
        if let Some(gone) = remove.filter(|entry| view.find_entry(entry).is_some()) {
            self.recount([(gone.published(), None)]);
        }
        let next = view.with_member(remove, add);
        drop(view); // before the swap, which would otherwise pay this guard's debt
        let empty = next.is_empty();
        self.replace(next, Changed::All);
        empty
    }

    /// Publishes `entry` out of routing (or back in it) if that changes
    /// its published state; returns whether it did. An entry no longer
    /// listed changes nothing.
    pub(crate) fn set_out(&mut self, entry: &Arc<WorkerEntry>, out: bool) -> bool {
        if entry.is_out() == out {
            return false;
        }
        let view = self.model.view.load();
        let Some(place) = view.find_entry(entry) else {
            return false;
        };
        let mut change = [Change { slot: place.slot, local: place.local, what: Toggle::Out(out) }];
        let next = view.with_changes(&mut change, view.filtering);
        drop(view); // before the swap, which would otherwise pay this guard's debt
        self.replace(next, Changed::Workers(&[entry.id]));
        entry.set_out(out);
        true
    }

    /// The instances of the published view.
    pub(crate) fn instances(&self) -> Vec<Arc<WorkerEntry>> {
        self.model.view.load().entries().cloned().collect()
    }

    /// Re-evaluates `pending`, publishes one new view if any bit (or
    /// `filtering`) changed, and repeats for entries whose version moved
    /// meanwhile (see the module docs). Returns how many busy bits flipped.
    pub(crate) fn reconcile(
        &mut self,
        clock: &MonitorClock,
        mut pending: Vec<Arc<WorkerEntry>>,
        mut filtering: Option<bool>,
    ) -> usize {
        let mut flips = 0;
        while !pending.is_empty() || filtering.is_some() {
            // One evaluation (and one change) per entry, however often it
            // was queued.
            pending.sort_unstable_by_key(|e| Arc::as_ptr(e) as usize);
            pending.dedup_by(|a, b| Arc::ptr_eq(a, b));
            let thresholds = **self.model.thresholds.load();
            let now = clock.now();
            let view = self.model.view.load();
            let mut changes = Vec::new();
            let mut flipped = Vec::new();
            let mut recounts = Vec::new();
            let mut seen = Vec::with_capacity(pending.len());
            for entry in pending.drain(..) {
                // Acquire: sees the slot stores released by the bump we read.
                let before = entry.version.load(Ordering::Acquire);
                let now_busy = entry.evaluate(&thresholds, clock, now);
                let was = entry.published();
                // An entry no longer listed (it left, or a restart replaced
                // it) sets no bit and counts no reason. A busy entry whose
                // signals changed changes the reasons, not the view.
                if was != now_busy {
                    if let Some(place) = view.find_entry(&entry) {
                        if was.is_some() != now_busy.is_some() {
                            flips += 1;
                            let what = Toggle::Busy(now_busy.is_some());
                            changes.push(Change { slot: place.slot, local: place.local, what });
                            flipped.push(entry.id);
                        }
                        recounts.push((was, now_busy));
                    }
                }
                seen.push((entry, before, now_busy));
            }
            let next_filtering = filtering.take().unwrap_or(view.filtering);
            let refiltered = next_filtering != view.filtering;
            let next = (!changes.is_empty() || refiltered).then(|| view.with_changes(&mut changes, next_filtering));
            drop(view); // before the swap, which would otherwise pay this guard's debt
            if let Some(next) = next {
                self.replace(next, if refiltered { Changed::All } else { Changed::Workers(&flipped) });
            }
            if !recounts.is_empty() {
                self.recount(recounts);
            }
            for (entry, before, busy) in seen {
                // Release (inside): a writer whose bump follows ours
                // acquires this and compares against the bit just published.
                entry.set_published(busy);
                // AcqRel RMW: reads the latest version; if it moved, a writer
                // changed the inputs after our evaluation read them.
                if entry.version.fetch_add(0, Ordering::AcqRel) != before {
                    pending.push(entry);
                }
            }
        }
        flips
    }
}
