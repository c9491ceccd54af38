//! The waiting line: a request that finds no eligible worker may wait, up
//! to its deadline, for one to free instead of taking an instant
//! rejection.
//!
//! Each model has one line, in deadline order (earliest first, then first
//! come; the latest first while it is overrun, below). [`WorkerRouter::wait`](crate::WorkerRouter::wait) (and
//! [`ModelRouter::wait`](crate::ModelRouter::wait)) return a [`Wait`]
//! future: it routes at once when nobody waits and a worker is eligible;
//! otherwise it joins the line (or is refused with [`WaitError::QueueFull`]
//! when the line holds [`LineLimits::max_waiting`] requests or
//! [`LineLimits::max_tokens`] prompt tokens). Runtime-agnostic: any
//! executor polls it, and the caller's timer future bounds it.
//!
//! # Wake-ups, not polling
//!
//! A waiter sleeps until the monitor publishes a view of its model or a
//! worker of its model reports. Then the line counts the *free* workers —
//! eligible, and not dispatched to by the line since their last report —
//! and wakes that many waiters, in order; each woken waiter routes (with
//! its router's policy) among the free workers when its task runs. So a
//! worker that flips free takes one waiter per report of its own: its next
//! report (with the load of the request it took) says whether it can take
//! another. The first worker to free does not receive the whole line.
//!
//! In a large fleet under overload those spent workers number in the
//! thousands; the line then keeps the set of free ones itself, so a pass
//! and a dispatch cost that set's size, almost nobody, not the marks'
//! (`spent`'s module docs).
//!
//! While a model has waiters every request of it joins the line, behind
//! those with earlier deadlines: no newcomer overtakes them. A request that
//! may not wait routes with
//! [`WorkerRouter::route_class_behind_line`](crate::WorkerRouter::route_class_behind_line),
//! which gives it no worker while anyone of its class or a higher one
//! waits.
//!
//! # Overrun: the latest deadline first
//!
//! In deadline order, a line that receives more than it can dispatch
//! serves only waiters at the end of their wait (each dispatched one
//! waited nearly its whole timeout, late for the objective the timeout
//! was derived from) while the others expire. So when a waiter expires
//! with more waiters behind it than the line dispatched while it waited,
//! by half (3 to 2: arrivals outpace dispatches, not a burst), the line is
//! *overrun*: it wakes the latest deadline first, the waiter with the most
//! time left, until it empties. Those it does not reach expire as they
//! would have; those it serves waited little. A burst the line can catch
//! up with stays in deadline order, which serves the most waiters in
//! time.
//!
//! # No lost wake-up
//!
//! A joiner to an empty line increments the line's count with a
//! read-modify-write, then reads the view; a publisher stores the view,
//! then reads the count with a read-modify-write. Every other change of
//! the count (a waiter joining a line that others wait in, or leaving: a
//! store of the queue's length) is made under the line's lock, so the
//! count is the queue's length whenever the lock is free, and above zero
//! from the first joiner's increment until the line empties. Either the
//! publisher's RMW reads a count above zero, and it takes the line's lock
//! and wakes whoever is in the line then (a later joiner takes the lock
//! after it, and sees the new view); or it reads zero, and the next write
//! of the count but other publishers' RMWs is a joiner's increment (only a
//! joiner changes an empty line's count), which reads from the publisher's
//! RMW or an RMW after it: that joiner's view load, and every later holder
//! of the lock's, sees the new view (and the joiner wakes itself). A
//! joiner with a waiter ahead that is not woken skips its own pass: no
//! worker is free then (every publication and report since the line last
//! emptied woke as many as were free).
//!
//! Wakers are called under the line's lock, by reference: a waker only
//! schedules its task, which takes the lock when it runs.
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use std::time::{Duration, Instant};
//! use loadgate::{BusyThresholds, LoadReport, MonitorConfig, Policy, RankLoad, Ticket, WorkerMonitor, WorkerRouter};
//! # fn poll<F: std::future::Future + ?Sized>(f: std::pin::Pin<&mut F>) -> std::task::Poll<F::Output> {
//! #     f.poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
//! # }
//!
//! let thresholds = BusyThresholds { active_decode_blocks_threshold: Some(0.5), ..Default::default() };
//! let monitor = Arc::new(WorkerMonitor::new(MonitorConfig { default_thresholds: thresholds, ..Default::default() }).unwrap());
//! monitor.register(1, "m", 1, 0).unwrap();
//! let load = |blocks| RankLoad { active_decode_blocks: blocks, kv_total_blocks: 100, ..Default::default() };
//! monitor.apply(&LoadReport { worker: 1, seq: 1, load: load(90), ..Default::default() }).unwrap(); // busy
//! let router = WorkerRouter::new(monitor.clone(), Policy::RoundRobin);
//!
//! // In a handler: `router.wait(...).await`, with the runtime's sleep as the timer
//! // (tokio: `tokio::time::sleep_until(deadline.into())`).
//! let deadline = Instant::now() + Duration::from_millis(500);
//! let mut wait = Box::pin(router.wait("m", &[], Ticket::new(128, deadline), std::future::pending::<()>()));
//! assert!(poll(wait.as_mut()).is_pending()); // joined the line
//! monitor.apply(&LoadReport { worker: 1, seq: 2, load: load(10), ..Default::default() }).unwrap(); // frees: wakes it
//! assert_eq!(poll(wait.as_mut()), std::task::Poll::Ready(Ok(1)));
//! ```
//!
//! # Leaving
//!
//! A waiter leaves when it is routed, when its timer fires
//! ([`WaitError::Deadline`]), or when its future is dropped (the client
//! went away): at once, under the lock, with its tokens. A woken waiter
//! that leaves without a worker passes its wake-up on.
//!
//! A publication that leaves the model with no instance in routing (none
//! registered, or every one out of routing) wakes every waiter: there is
//! nothing to wait for, and each leaves with [`WaitError::Unavailable`],
//! as a newcomer would be answered. If the monitor forgot the model (its
//! last worker left) and it has come back by the time a waiter's task
//! runs, the waiter moves into the model's new line instead, in its place
//! by class and deadline.

mod queue;
mod spent;
#[cfg(test)]
mod tests;
mod wait;

use std::fmt;
use std::time::Instant;

use crossbeam_utils::CachePadded;

use crate::class::Class;
use crate::load::WorkerId;
use crate::monitor::view::ModelView;
use crate::sync::{lock, Arc, AtomicBool, AtomicU64, AtomicUsize, Mutex, Ordering, Swap, SwapCache};
use crate::tenant::Tenant;

pub(crate) use spent::Changed;
pub use wait::Wait;

use queue::Queue;

/// The line's cache of its model's view (kept under the line's lock).
type ViewCache = SwapCache<Arc<Swap<ModelView>>, ModelView>;

/// How much a model's waiting line holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LineLimits {
    /// The most requests waiting at once.
    pub max_waiting: usize,
    /// The most prompt tokens waiting at once.
    pub max_tokens: u64,
}

impl Default for LineLimits {
    /// 1,024 requests, no token limit.
    fn default() -> Self {
        LineLimits { max_waiting: 1024, max_tokens: u64::MAX }
    }
}

/// One request's place in a line: its prompt tokens, its deadline, its
/// class and its tenant (which order the line; the caller's timer enforces
/// the deadline).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    /// Prompt tokens, counted against [`LineLimits::max_tokens`].
    pub tokens: u64,
    /// The latest the request may still be dispatched.
    pub deadline: Instant,
    /// Its priority class ([`Class::Standard`] unless set).
    pub class: Class,
    /// Its tenant ([`Tenant::default`] unless set).
    pub tenant: Tenant,
}

impl Ticket {
    /// A standard ticket for `tokens` prompt tokens due by `deadline`.
    pub fn new(tokens: u64, deadline: Instant) -> Self {
        Ticket { tokens, deadline, class: Class::Standard, tenant: Tenant::default() }
    }

    /// This ticket in `class`.
    #[must_use]
    pub fn with_class(self, class: Class) -> Self {
        Ticket { class, ..self }
    }

    /// This ticket of `tenant`.
    #[must_use]
    pub fn with_tenant(self, tenant: Tenant) -> Self {
        Ticket { tenant, ..self }
    }
}

/// Why a [`Wait`] ended without a worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WaitError {
    /// The deadline passed (the timer fired) before a worker freed.
    /// An overload rejection.
    Deadline,
    /// The line was full, by count or by tokens. An overload rejection.
    QueueFull,
    /// A sheddable request gave its place in a full line to a critical
    /// one. An overload rejection.
    ClassShed,
    /// The request's tenant already holds its cap of waiting requests or
    /// queued tokens ([`Tenant::max_waiting`], [`Tenant::max_tokens`]).
    /// An overload rejection.
    TenantCap,
    /// No instance is registered or in routing (HTTP 503).
    Unavailable,
    /// The model has never been seen (HTTP 404).
    UnknownModel,
}

impl fmt::Display for WaitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WaitError::Deadline => "no worker freed before the request's deadline",
            WaitError::QueueFull => "the waiting line is full",
            WaitError::ClassShed => "a critical request took this request's place in the waiting line",
            WaitError::TenantCap => "the request's tenant holds its share of the waiting line",
            WaitError::Unavailable => "No worker is available for this model",
            WaitError::UnknownModel => "Unknown model",
        })
    }
}

impl std::error::Error for WaitError {}

/// What a model's line holds now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LineStats {
    /// Requests waiting.
    pub waiting: usize,
    /// Their prompt tokens.
    pub tokens: u64,
    /// Requests dispatched from the line, ever.
    pub dispatched: u64,
    /// Whether a class of the line is overrun (serving its latest deadline
    /// first; see the module docs).
    pub overrun: bool,
}

/// The waiters of other frontends' lines, for sharing reports
/// ([`WorkerMonitor::share_reports`](crate::WorkerMonitor::share_reports)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ReportShare {
    /// Waiting in the lines of the frontends ordered before this one.
    pub(crate) ahead: u64,
    /// Waiting in every other frontend's lines.
    pub(crate) others: u64,
}

/// SplitMix64's finaliser over a worker and a report seq: a point spread
/// evenly over `u64`, the same in every process.
fn mix(worker: WorkerId, seq: u64) -> u64 {
    let mut z = worker.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seq;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// What a worker's report does to the line ([`Line::report_begins`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Begun {
    /// Nothing: no waiter, or the worker was not spent and none is held.
    Nothing,
    /// The line had made this many dispatches: [`Line::reported`] after
    /// the publication.
    Seen(u64),
    /// The report is another frontend's to use: the worker stays out of
    /// this line's reach until its next report.
    Declined,
}

/// Numbers the lines of this process, so that a measurement names the line
/// it was taken on ([`Measured`]).
static LINES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Where a line stood when a report's measurement began
/// ([`Line::measured`]): which line, and its dispatches then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Measured {
    line: u64,
    dispatches: u64,
}

/// A model's waiting line (in the model's state, beside its view).
pub(crate) struct Line {
    /// This line's number ([`LINES`]).
    id: u64,
    /// Waiters in the line: read by every request of a line-using router
    /// (nobody waiting: route at once) and, with an RMW, by every
    /// publication (see the module docs).
    waiting: CachePadded<AtomicUsize>,
    limits: LineLimits,
    /// `Queue::spent_bits`, stored under the lock after each change: a
    /// report of a worker whose bit is clear takes no lock.
    spent_hint: AtomicU64,
    /// `Queue::any_held`, stored under the lock after each change: while
    /// set, every report of the model's workers runs a pass.
    held_hint: AtomicBool,
    /// `Queue::dispatched`, stored under the lock after each change: where
    /// a report begins (see `Line::report_begins`).
    dispatches: AtomicU64,
    /// Requests waiting in other frontends' lines for this model (low 32
    /// bits) and in those of the frontends ordered before this one (high
    /// 32 bits), from their beats (set by the event plane; one word, so a
    /// report reads a pair set together): see `Line::report_begins`.
    share: AtomicU64,
    /// The model's view, which the line reads under its lock through the
    /// queue's cache of it (`Line::with_view`).
    view: Arc<Swap<ModelView>>,
    queue: Mutex<Queue>,
}

impl Line {
    /// A line for the model whose view `view` holds.
    pub(crate) fn new(limits: LineLimits, view: Arc<Swap<ModelView>>) -> Self {
        Line {
            // Relaxed (a std atomic, not modelled by loom): only unique numbers.
            id: LINES.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            waiting: CachePadded::new(AtomicUsize::new(0)),
            limits,
            spent_hint: AtomicU64::new(0),
            held_hint: AtomicBool::new(false),
            dispatches: AtomicU64::new(0),
            share: AtomicU64::new(0),
            view,
            queue: Mutex::new(Queue::default()),
        }
    }

    /// This line's number: unique in the process, so it names the model's
    /// life the line belongs to ([`WorkerMonitor::model_life`](crate::WorkerMonitor::model_life)).
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Whether anyone waits.
    #[inline]
    pub(crate) fn is_waiting(&self) -> bool {
        // Acquire: a request that sees waiters joins the line; one that
        // sees none routes at once (a race with a joiner only lets it
        // route beside the line, never lose a wake-up: joiners wake
        // themselves, see the module docs).
        self.waiting.load(Ordering::Acquire) != 0
    }

    /// Routes a request of `class` that may not wait while someone waits
    /// (the caller checked [`Line::is_waiting`]): no worker
    /// ([`RouteError::Overloaded`](crate::RouteError::Overloaded)) while a
    /// waiter of its class or a higher one is in the line (one that may
    /// wait would have joined behind those). Waiters of lower classes only
    /// (say, sheddable ones kept off the headroom) do not hold it back, as
    /// they would not in the line: it routes with `route`, given the
    /// line's spent workers to leave out, and the worker it gets is out of
    /// the line's reach until its next report, as if the line had
    /// dispatched to it (one report, one request past a threshold). Under
    /// the line's lock (cold: the shed path of a class with no line, while
    /// someone waits); a sheddable request, the lowest class, is behind any
    /// waiter without it.
    pub(crate) fn route_ahead(
        &self,
        class: Class,
        route: impl FnOnce(&[WorkerId]) -> Result<WorkerId, crate::route::RouteError>,
    ) -> Result<WorkerId, crate::route::RouteError> {
        if class == Class::Sheddable {
            return Err(crate::route::RouteError::Overloaded);
        }
        let mut queue = lock(&self.queue);
        if queue.waits_at_or_above(class) {
            return Err(crate::route::RouteError::Overloaded);
        }
        let routed = route(queue.spent());
        if let Ok(worker) = routed {
            queue.decline(worker);
            self.sync_hint(&queue);
        }
        routed
    }

    /// How many wait now (without the lock).
    pub(crate) fn waiting(&self) -> usize {
        // Relaxed: a count for a report to others, as old as any beat.
        self.waiting.load(Ordering::Relaxed)
    }

    /// What the line holds now.
    pub(crate) fn stats(&self) -> LineStats {
        let queue = lock(&self.queue);
        LineStats {
            waiting: queue.len(),
            tokens: queue.tokens(),
            dispatched: queue.dispatched(),
            overrun: Class::ALL.into_iter().any(|class| queue.is_overrun(class)),
        }
    }

    /// After a publication of the model's view that changed `changed`:
    /// wakes waiters if a worker may be free for them. The caller stored
    /// the view first.
    #[inline]
    pub(crate) fn published(&self, changed: Changed<'_>) {
        // AcqRel RMW, not a load: ordered against every joiner's
        // increment (module docs: no lost wake-up).
        if self.waiting.fetch_add(0, Ordering::AcqRel) == 0 {
            return;
        }
        let mut queue = lock(&self.queue);
        self.with_view(&mut queue, |queue, view| {
            let forgot = queue.published(view, changed);
            let held = queue.any_held();
            if held {
                queue.release();
            }
            if forgot || held {
                self.sync_hint(queue);
            }
            self.wake_free_in(queue, view);
        });
    }

    /// Runs `f` under the line's lock with the model's view now: the
    /// queue's cached one, checked against the published one with a plain
    /// pointer load (arc-swap's `Cache`) and reloaded only when it changed.
    /// So a pass or a dispatch takes no guard of the view, and the view is
    /// as fresh as a load: a joiner's or a publisher's RMW on the count
    /// orders the pointer's store before this load (module docs).
    #[inline]
    fn with_view<R>(&self, queue: &mut Queue, f: impl FnOnce(&mut Queue, &ModelView) -> R) -> R {
        let mut cache = queue.take_view().unwrap_or_else(|| ViewCache::new(self.view.clone()));
        let result = f(queue, cache.load());
        queue.keep_view(cache);
        result
    }

    /// Sets how many requests wait in the other frontends' lines for this
    /// model, and in those of the frontends ordered before this one (each
    /// at most `u32::MAX`).
    pub(crate) fn set_share(&self, share: ReportShare) {
        let clamp = |n: u64| u64::from(u32::try_from(n).unwrap_or(u32::MAX));
        // Relaxed: a proportion for the line's next reports; nothing else
        // is published with it.
        self.share.store(clamp(share.ahead) << 32 | clamp(share.others), Ordering::Relaxed);
    }

    /// What [`Line::set_share`] last set.
    pub(crate) fn share(&self) -> ReportShare {
        // Relaxed: see `set_share`.
        let word = self.share.load(Ordering::Relaxed);
        ReportShare { ahead: word >> 32, others: word & u64::from(u32::MAX) }
    }

    /// At a report of `worker` (its own, not the router's tracking, numbered
    /// `seq`), before the publication it may cause: whether the line may give the
    /// worker a waiter again or wake held waiters, and if so the line's
    /// dispatches so far, for [`Line::reported`] after the publication.
    ///
    /// While others wait too (the line's share, [`Line::set_share`]), the
    /// report is this line's only if the point its worker and seq pick in
    /// `[0, own + others)` falls in this line's part (after `ahead`, `own`
    /// long); otherwise the worker is
    /// marked as if dispatched to until its next report, before the
    /// publication can wake anyone for it ([`Begun::Declined`]).
    ///
    /// `measured`: where the line stood when the report's measurement began
    /// ([`Line::measured`]), if earlier than now: a dispatch made since
    /// keeps its mark, as one made after the report would. Taken on another
    /// line (the worker's model was replaced meanwhile), it shows none of
    /// this line's dispatches.
    #[inline]
    pub(crate) fn report_begins(&self, worker: WorkerId, seq: u64, measured: Option<Measured>) -> Begun {
        if !self.is_waiting() {
            return Begun::Nothing;
        }
        let share = self.share();
        if share.others != 0 && !self.takes(worker, share, seq) {
            let mut queue = lock(&self.queue);
            queue.decline(worker);
            self.sync_hint(&queue);
            return Begun::Declined;
        }
        if !self.marks(worker) {
            return Begun::Nothing;
        }
        // Every dispatch this report's publication causes comes after,
        // with a number at least this.
        let now = self.dispatches();
        Begun::Seen(match measured {
            None => now,
            Some(measured) if measured.line == self.id => measured.dispatches.min(now),
            Some(_) => 0,
        })
    }

    /// At a change of the router's tracking of `worker`: for a worker that
    /// never reports a load of its own (`unreported` says so, asked only
    /// while anyone waits), known only by that tracking, each change is its
    /// report, as [`Line::report_begins`] (the tracking of the request it
    /// was last given shows it, or its end); for any other, nothing.
    #[inline]
    pub(crate) fn tracking_begins(&self, worker: WorkerId, unreported: impl FnOnce() -> bool) -> Begun {
        if !self.is_waiting() {
            return Begun::Nothing;
        }
        if !self.marks(worker) || !unreported() {
            return Begun::Nothing;
        }
        Begun::Seen(self.dispatches())
    }

    /// Whether a report of `worker` has something to do in the line (by
    /// the hints): the worker is spent, or waiters are held.
    #[inline]
    fn marks(&self, worker: WorkerId) -> bool {
        // Relaxed: hints; a report that misses a mark set at this moment
        // (a dispatch or a hold racing the report) leaves it to the next
        // report, the same as if it had come first.
        let spent = self.spent_hint.load(Ordering::Relaxed) & spent::spent_bit(worker) != 0;
        spent || self.held_hint.load(Ordering::Relaxed)
    }

    /// Where the line stands now, for a report whose measurement begins:
    /// that report can show the dispatches numbered below this count and
    /// no later one. (Not every one below it: a request dispatched just
    /// before may still be on its way to the worker, or not yet running
    /// there; the router's tracked prefill covers that.)
    #[inline]
    pub(crate) fn measured(&self) -> Measured {
        Measured { line: self.id, dispatches: self.dispatches() }
    }

    /// The line's dispatches so far.
    #[inline]
    fn dispatches(&self) -> u64 {
        // Acquire: pairs with the Release in `sync_hint` (the dispatch
        // counted here happened before).
        self.dispatches.load(Ordering::Acquire)
    }

    /// Whether the report `seq` of `worker` is this line's (see
    /// [`Line::report_begins`]).
    fn takes(&self, worker: WorkerId, share: ReportShare, seq: u64) -> bool {
        // Acquire: as `is_waiting`.
        let own = self.waiting.load(Ordering::Acquire) as u64;
        let total = own.saturating_add(share.others);
        // The same point in every frontend for the same report: a fixed
        // mix of worker and seq, scaled to the total.
        let point = ((u128::from(mix(worker, seq)) * u128::from(total)) >> 64) as u64;
        (share.ahead..share.ahead.saturating_add(own)).contains(&point)
    }

    /// After the report [`Line::report_begins`] saw `seen` dispatches at,
    /// and the publication it may have caused: the worker's mark, if set
    /// by a dispatch before the report, is cleared, held waiters are
    /// released, and a wake-up pass runs with the current view, all under
    /// one lock. A dispatch the publication caused keeps its mark until
    /// the worker's next report: one report, one dispatch (loom's
    /// `one_report_dispatches_one_waiter`).
    #[inline]
    pub(crate) fn reported(&self, worker: WorkerId, seen: u64) {
        let mut queue = lock(&self.queue);
        let freed = queue.reported(worker, seen);
        if !freed && !queue.any_held() {
            return;
        }
        queue.release();
        self.sync_hint(&queue);
        self.with_view(&mut queue, |queue, view| {
            if freed {
                queue.freed(worker, view);
            }
            self.wake_free_in(queue, view);
        });
    }

    /// After waiters left, or one joined a line others wait in (under the
    /// lock): the count is the queue's length again. A store, not a
    /// read-modify-write: every change of the count is made under the lock
    /// but a publisher's `fetch_add(0)`, which changes nothing, so a store
    /// loses no joiner's increment. Only the increment of a joiner to an
    /// empty line must be an RMW (module docs: no lost wake-up).
    fn count_left(&self, queue: &Queue) {
        // Release: as the joiner's increment, for `is_waiting`'s Acquire.
        self.waiting.store(queue.len(), Ordering::Release);
    }

    /// Stores the spent workers' bits and whether waiters are held after a
    /// change (under the lock).
    fn sync_hint(&self, queue: &Queue) {
        // Relaxed: see `report_begins`.
        self.spent_hint.store(queue.spent_bits(), Ordering::Relaxed);
        self.held_hint.store(queue.any_held(), Ordering::Relaxed);
        // Release: pairs with the Acquire in `report_begins`.
        self.dispatches.store(queue.dispatched(), Ordering::Release);
    }

    /// Under the line's lock: wakes as many waiters as there are free
    /// workers (eligible in the view, not spent). A view with no instance in
    /// routing (none registered, or every one out of routing) wakes every
    /// waiter, held ones too: there is nothing to wait for, and each hears it
    /// as a newcomer would ([`WaitError::Unavailable`]), or moves to its
    /// model's new line if the model was forgotten and has come back. A
    /// view of a model with no threshold (the last one cleared while
    /// requests wait) wakes every waiter not held: nothing is busy, and
    /// they route past the spent marks (`wait::dispatch`).
    fn wake_free(&self, queue: &mut Queue) {
        self.with_view(queue, |queue, view| self.wake_free_in(queue, view));
    }

    /// [`Line::wake_free`] with the view loaded.
    #[inline]
    fn wake_free_in(&self, queue: &mut Queue, view: &ModelView) {
        if view.is_empty() || view.all_out() {
            if queue.any_held() {
                queue.release();
                self.sync_hint(queue);
            }
            queue.wake(usize::MAX);
            return;
        }
        if !view.filtering {
            // No threshold: no worker is ever busy, and no report can say
            // that one took too much. Every waiter routes (held ones at
            // the next publication or report, as ever).
            queue.wake(usize::MAX);
            return;
        }
        let free = match queue.free(view) {
            Some(free) => crate::route::eligible_among(view, free),
            None => crate::route::eligible_count(view, queue.spent()),
        };
        queue.wake(free);
    }
}
