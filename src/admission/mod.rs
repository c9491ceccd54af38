//! [`Admission`]: a worker's hard cap — `N` engine slots plus an overflow of
//! exactly `Q`, for `N + Q` requests in all.
//!
//! The overflow is a crossbeam `ArrayQueue` of capacity `Q - 1` plus one
//! dispatcher *handoff* cell that holds the oldest waiting item between the
//! queue and a slot: `Q - 1 + 1 = Q`, exact for every `Q >= 2`.
//!
//! # Accounting
//!
//! ONE atomic word, `running << 32 | queued`, holds every count. The fast
//! path (nothing queued, a slot free) is one compare-and-swap to admit and
//! one to release (plus a reference count for an owned [`Permit`]; none for
//! a [`ScopedPermit`]), and takes no lock.
//!
//! # Exact from both sides
//!
//! Once anything is queued, every change of `queued` happens under the
//! handoff lock together with the storage change it counts: an arrival
//! stores and counts its item, a claim (a released slot passed to the
//! oldest waiter, or a free slot given to it) counts it out and takes it,
//! in one critical section. So under the lock the storage holds exactly
//! `queued` items, and the arrival's decision is made on the count: it is
//! refused iff `Q` are already queued and every slot is taken (never more
//! than `N + Q` admitted), and it is never refused while fewer are (a
//! claimed item cannot linger in the storage and make it look full). The
//! queue is an `ArrayQueue` for its bounded ring allocated once, up front,
//! not for its lock-freedom: its pushes and pops all happen under the lock,
//! because count and storage must change together, and the lock is only
//! taken on the overflow path, where a request is about to wait anyway.
//!
//! # No recursion
//!
//! A dispatcher may drop the permit it is given at once (an item that
//! finishes inline), which releases the slot from inside the release that
//! passed it on. Releases that find items waiting are combined: one thread
//! at a time passes slots on, in a loop, and a release that arrives meanwhile
//! (from inside a dispatch on that thread, or on another thread) only counts
//! itself for that loop to do. So a release never recurses more than one
//! level, whatever `Q` is.

use std::fmt;

use crossbeam_utils::CachePadded;

use crate::error::WORKER_AT_CAPACITY;
use crate::sync::{lock, Arc, AtomicU32, AtomicU64, Mutex, MutexGuard, Ordering, Queue};

/// The environment variable that sets the overflow queue size `Q`.
pub const QUEUE_LIMIT_ENV: &str = "DYN_DYNAMO_REQUEST_QUEUE_LIMIT";

/// `Q` when the environment does not set it.
pub const DEFAULT_QUEUE_LIMIT: usize = 16;

/// The largest accepted `Q`.
pub const MAX_QUEUE_LIMIT: usize = 1 << 20;

/// Hands a queued item its permit when a slot frees up. Returns the permit
/// back if the item can no longer use it (its client went away); the slot
/// then passes to the next item.
///
/// It runs inline, on whichever thread frees the slot (often inside a
/// permit's drop), and may be handed several slots in a row: it must not
/// block or take a lock that a permit's holder may hold while dropping it
/// (sending on a channel is the intended use). If it panics, the slot it was
/// given is released and the other waiting items still get theirs.
pub type Dispatch<T> = Box<dyn Fn(T, Permit<T>) -> Result<(), Permit<T>> + Send + Sync>;

/// A worker's admission control: at most `N` running, at most `Q` waiting.
///
/// # Examples
///
/// ```
/// use std::sync::mpsc;
/// use loadgate::{Admission, Admitted};
///
/// let (ready_tx, ready_rx) = mpsc::channel();
/// let admission = Admission::new(1, 2, Box::new(move |item: u32, permit| {
///     ready_tx.send((item, permit)).map_err(|e| e.0 .1)
/// }))
/// .unwrap();
/// let Ok(Admitted::Now(1, first)) = admission.try_admit(1) else { panic!() };
/// assert!(matches!(admission.try_admit(2), Ok(Admitted::Queued)));
/// assert!(matches!(admission.try_admit(3), Ok(Admitted::Queued)));
/// assert_eq!(admission.try_admit(4).unwrap_err().into_inner(), 4); // N + Q = 3
/// drop(first); // the slot passes to item 2
/// assert_eq!(ready_rx.recv().unwrap().0, 2);
/// ```
pub struct Admission<T> {
    /// `running << 32 | queued`.
    state: CachePadded<AtomicU64>,
    limit: u32,
    queue_limit: u32,
    queue: Queue<T>,
    /// The oldest waiting item, between the queue and a slot. Its lock
    /// guards every change of the storage and of `queued` (module docs).
    handoff: Mutex<Option<T>>,
    /// Releases with items waiting that the thread passing slots on has yet
    /// to do (see [`release_queued`](Self::release_queued)).
    releases: CachePadded<AtomicU32>,
    dispatch: Dispatch<T>,
    rejected: CachePadded<AtomicU64>,
}

impl<T> fmt::Debug for Admission<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admission")
            .field("limit", &self.limit)
            .field("queue_limit", &self.queue_limit)
            .field("running", &self.running())
            .field("queued", &self.queued())
            .field("rejected", &self.rejected())
            .finish()
    }
}

/// What [`Admission::try_admit`] (permit `P` = [`Permit`]) or
/// [`Admission::try_admit_scoped`] (`P` = [`ScopedPermit`]) did with an item.
#[derive(Debug)]
pub enum Admitted<T, P = Permit<T>> {
    /// A slot was free and nothing was waiting: run now, holding the permit.
    Now(T, P),
    /// Queued: the dispatch function gets the item and its permit later.
    Queued,
}

/// The engine and the queue are full; the item comes back.
#[derive(Debug, PartialEq, Eq)]
pub struct Rejected<T>(pub T);

impl<T> Rejected<T> {
    /// The refused item.
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<T> fmt::Display for Rejected<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(WORKER_AT_CAPACITY)
    }
}

impl<T: fmt::Debug> std::error::Error for Rejected<T> {}

/// An invalid admission configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdmissionError {
    /// The engine request limit `N` must be at least 1.
    ZeroLimit,
    /// The queue limit `Q` must be at least 2 (`Q - 1` channel slots plus the
    /// handoff make an exact cap only from 2).
    QueueLimitTooSmall(usize),
    /// A limit above `u32::MAX`.
    TooLarge(usize),
    /// The queue limit `Q` is above [`MAX_QUEUE_LIMIT`] (the overflow is
    /// allocated up front, so a typo must not exhaust memory).
    QueueLimitTooLarge(usize),
    /// `DYN_DYNAMO_REQUEST_QUEUE_LIMIT` is not a whole number.
    InvalidQueueLimit(String),
}

impl fmt::Display for AdmissionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ZeroLimit => f.write_str("engine request limit must be at least 1"),
            Self::QueueLimitTooSmall(q) => write!(f, "{QUEUE_LIMIT_ENV} must be at least 2, got {q}"),
            Self::TooLarge(v) => write!(f, "limit {v} is larger than {}", u32::MAX),
            Self::QueueLimitTooLarge(q) => write!(f, "{QUEUE_LIMIT_ENV} must be at most {MAX_QUEUE_LIMIT}, got {q}"),
            Self::InvalidQueueLimit(v) => write!(f, "{QUEUE_LIMIT_ENV} must be a whole number >= 2, got {v:?}"),
        }
    }
}

impl std::error::Error for AdmissionError {}

/// Parses `DYN_DYNAMO_REQUEST_QUEUE_LIMIT`: unset gives 16; anything but a
/// whole number of at least 2 is an error.
///
/// # Errors
///
/// [`AdmissionError::InvalidQueueLimit`] or [`AdmissionError::QueueLimitTooSmall`].
pub fn parse_queue_limit(value: Option<&str>) -> Result<usize, AdmissionError> {
    let Some(raw) = value else {
        return Ok(DEFAULT_QUEUE_LIMIT);
    };
    let q: usize = raw.trim().parse().map_err(|_| AdmissionError::InvalidQueueLimit(raw.to_owned()))?;
    if q < 2 {
        return Err(AdmissionError::QueueLimitTooSmall(q));
    }
    if q > MAX_QUEUE_LIMIT {
        return Err(AdmissionError::QueueLimitTooLarge(q));
    }
    Ok(q)
}

#[inline]
fn pack(running: u32, queued: u32) -> u64 {
    (u64::from(running) << 32) | u64::from(queued)
}

#[inline]
fn unpack(state: u64) -> (u32, u32) {
    ((state >> 32) as u32, state as u32)
}

impl<T> Admission<T> {
    /// `limit` engine slots (`N`) and an overflow of `queue_limit` (`Q`).
    ///
    /// # Errors
    ///
    /// `N = 0`, `Q < 2`, or a value above `u32::MAX`.
    pub fn new(limit: usize, queue_limit: usize, dispatch: Dispatch<T>) -> Result<Arc<Self>, AdmissionError> {
        if limit == 0 {
            return Err(AdmissionError::ZeroLimit);
        }
        if queue_limit < 2 {
            return Err(AdmissionError::QueueLimitTooSmall(queue_limit));
        }
        if queue_limit > MAX_QUEUE_LIMIT {
            return Err(AdmissionError::QueueLimitTooLarge(queue_limit));
        }
        let limit32 = u32::try_from(limit).map_err(|_| AdmissionError::TooLarge(limit))?;
        let queue_limit32 = u32::try_from(queue_limit).map_err(|_| AdmissionError::TooLarge(queue_limit))?;
        Ok(Arc::new(Admission {
            state: CachePadded::new(AtomicU64::new(0)),
            limit: limit32,
            queue_limit: queue_limit32,
            queue: Queue::new(queue_limit - 1),
            handoff: Mutex::new(None),
            releases: CachePadded::new(AtomicU32::new(0)),
            dispatch,
            rejected: CachePadded::new(AtomicU64::new(0)),
        }))
    }

    /// As [`new`](Self::new) with `Q` from `DYN_DYNAMO_REQUEST_QUEUE_LIMIT`.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new), or an invalid environment value.
    pub fn from_env(limit: usize, dispatch: Dispatch<T>) -> Result<Arc<Self>, AdmissionError> {
        let q = parse_queue_limit(std::env::var(QUEUE_LIMIT_ENV).ok().as_deref())?;
        Self::new(limit, q, dispatch)
    }

    /// Admits `item`: straight into a slot if one is free and nothing waits,
    /// else into the overflow, else hands it back.
    ///
    /// The permit owns a reference to this gate, so it can move into a task;
    /// [`try_admit_scoped`](Self::try_admit_scoped) saves that reference's
    /// count updates when the request runs within the caller's scope.
    ///
    /// # Errors
    ///
    /// [`Rejected`] with the item when `N + Q` are already admitted.
    pub fn try_admit(self: &Arc<Self>, item: T) -> Result<Admitted<T>, Rejected<T>> {
        Ok(match self.try_admit_scoped(item)? {
            Admitted::Now(item, permit) => Admitted::Now(item, permit.into_owned()),
            Admitted::Queued => Admitted::Queued,
        })
    }

    /// As [`try_admit`](Self::try_admit), with a permit that borrows this
    /// gate: admitting and releasing touch one atomic word and nothing else
    /// (no reference count). Queued items still get an owned [`Permit`]
    /// from the dispatcher.
    ///
    /// # Errors
    ///
    /// [`Rejected`] with the item when `N + Q` are already admitted.
    ///
    /// # Examples
    ///
    /// ```
    /// use loadgate::{Admission, Admitted};
    ///
    /// let admission = Admission::new(1, 2, Box::new(|_item: u32, permit| Err(permit))).unwrap();
    /// let Ok(Admitted::Now(item, permit)) = admission.try_admit_scoped(7) else { panic!() };
    /// assert_eq!((item, admission.running()), (7, 1));
    /// drop(permit);
    /// assert_eq!(admission.running(), 0);
    /// ```
    pub fn try_admit_scoped(self: &Arc<Self>, item: T) -> Result<Admitted<T, ScopedPermit<'_, T>>, Rejected<T>> {
        // Acquire on every read of the state (the CAS's failure ordering
        // too): pairs with the AcqRel CAS of whoever counted a stored item or
        // freed a slot.
        let mut state = self.state.load(Ordering::Acquire);
        loop {
            let (running, queued) = unpack(state);
            if queued != 0 || running >= self.limit {
                break;
            }
            match self.state.compare_exchange_weak(
                state,
                pack(running + 1, queued),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(Admitted::Now(item, ScopedPermit { admission: self })),
                Err(actual) => state = actual,
            }
        }
        if let Some(oldest) = self.enqueue(item)? {
            self.hand(oldest);
        }
        self.pump();
        Ok(Admitted::Queued)
    }

    /// Stores and counts `item` in the overflow, or hands it back when `Q`
    /// are queued and every slot is taken. When `Q` are queued but a slot is
    /// free (the arrivals that filled the queue have not claimed it yet),
    /// the oldest item takes the slot first and is returned, to be handed
    /// its permit outside the lock.
    ///
    /// Cold path: takes the handoff lock, under which `queued` counts exactly
    /// the stored items (module docs).
    #[cold]
    fn enqueue(&self, item: T) -> Result<Option<T>, Rejected<T>> {
        let mut handoff = lock(&self.handoff);
        // Acquire: `queued` only changes under this lock, which we hold.
        let (_, queued) = unpack(self.state.load(Ordering::Acquire));
        let oldest = if queued < self.queue_limit {
            None
        } else {
            // Q queued: room only if a slot is free for the oldest to take.
            let Some(oldest) = self.claim_free_slot(&mut handoff) else {
                // Relaxed: a statistic.
                self.rejected.fetch_add(1, Ordering::Relaxed);
                return Err(Rejected(item));
            };
            Some(oldest)
        };
        if let Err(item) = self.queue.push(item) {
            // The storage holds `queued < Q` items and the queue `Q - 1`, so
            // the handoff is empty: the oldest moves on, making room.
            debug_assert!(handoff.is_none(), "the storage holds more than it counts");
            *handoff = self.queue.pop();
            if self.queue.push(item).is_err() {
                unreachable!("the queue has room after a pop under the handoff lock");
            }
        }
        // AcqRel: a claimer that reads the count (under the lock, or in a
        // failed fast-path CAS) sees the item stored.
        self.state.fetch_add(1, Ordering::AcqRel);
        Ok(oldest)
    }

    /// Gives a claimed item its (already counted) slot; if its client is
    /// gone, the slot passes on like any released one.
    fn hand(self: &Arc<Self>, item: T) {
        if let Err(back) = (self.dispatch)(item, Permit::new(self.clone())) {
            drop(back);
        }
    }

    /// The oldest stored item (handoff first); the caller holds the lock and
    /// has just counted the item out.
    fn take_oldest(&self, handoff: &mut MutexGuard<'_, Option<T>>) -> T {
        handoff.take().or_else(|| self.queue.pop()).expect("a counted item is always stored")
    }

    /// Under the handoff lock: if an item waits and a slot is free, claims
    /// both (counts the item out and takes it) and returns the item.
    fn claim_free_slot(&self, handoff: &mut MutexGuard<'_, Option<T>>) -> Option<T> {
        // Acquire: pairs with the AcqRel CAS of whoever freed a slot.
        let mut state = self.state.load(Ordering::Acquire);
        loop {
            let (running, queued) = unpack(state);
            if queued == 0 || running >= self.limit {
                return None;
            }
            let next = pack(running + 1, queued - 1);
            match self.state.compare_exchange(state, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(self.take_oldest(handoff)),
                Err(actual) => state = actual,
            }
        }
    }

    /// While items wait and slots are free: claim both, dispatch.
    fn pump(self: &Arc<Self>) {
        loop {
            // Its own statement: the lock is released before the dispatch.
            let claimed = self.claim_free_slot(&mut lock(&self.handoff));
            let Some(item) = claimed else { return };
            self.hand(item);
        }
    }

    /// Frees a slot, or hands it straight to the oldest waiting item.
    fn release(self: &Arc<Self>) {
        // Acquire on every read of the state (the CAS's failure ordering
        // too): pairs with the AcqRel CAS of whoever counted an item or
        // took a slot.
        let mut state = self.state.load(Ordering::Acquire);
        loop {
            let (running, queued) = unpack(state);
            debug_assert!(running > 0, "release without a running permit");
            if queued != 0 {
                break;
            }
            match self.state.compare_exchange_weak(state, pack(running - 1, 0), Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return,
                Err(actual) => state = actual,
            }
        }
        self.release_queued();
    }

    /// A release with items waiting. One thread at a time passes slots on:
    /// the first to arrive loops until no release is left, and one that
    /// arrives meanwhile (from inside a dispatch of that loop, or on another
    /// thread) adds itself to the count and returns; its slot stays counted
    /// as running until the loop passes it on.
    #[cold]
    fn release_queued(self: &Arc<Self>) {
        // AcqRel: whoever takes the count from 0 runs the loop; a later
        // release's increment is seen by the loop's decrement.
        if self.releases.fetch_add(1, Ordering::AcqRel) != 0 {
            return;
        }
        let mut passing = PassingOn { admission: self, done: false };
        passing.run();
    }

    /// One release's worth of the loop: passes one slot on (again, while the
    /// item it reaches is gone).
    fn pass_one_on(self: &Arc<Self>) {
        while let Some(item) = self.pass_on() {
            match (self.dispatch)(item, Permit::new(self.clone())) {
                Ok(()) => return,
                // The item is gone and the slot is still ours: disarm the
                // permit and pass the slot on again.
                Err(mut back) => back.admission = None,
            }
        }
    }

    /// Under the handoff lock: moves one slot to the oldest waiting item
    /// (returned, counted out and taken), or frees it when nothing waits.
    fn pass_on(&self) -> Option<T> {
        let mut handoff = lock(&self.handoff);
        let mut state = self.state.load(Ordering::Acquire);
        loop {
            let (running, queued) = unpack(state);
            let next = if queued > 0 { pack(running, queued - 1) } else { pack(running - 1, 0) };
            match self.state.compare_exchange(state, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return (queued > 0).then(|| self.take_oldest(&mut handoff)),
                Err(actual) => state = actual,
            }
        }
    }

    /// Requests holding a slot now.
    pub fn running(&self) -> usize {
        // Relaxed: a gauge.
        unpack(self.state.load(Ordering::Relaxed)).0 as usize
    }

    /// Requests waiting in the overflow now.
    pub fn queued(&self) -> usize {
        // Relaxed: a gauge.
        unpack(self.state.load(Ordering::Relaxed)).1 as usize
    }

    /// Requests refused so far.
    pub fn rejected(&self) -> u64 {
        // Relaxed: a counter.
        self.rejected.load(Ordering::Relaxed)
    }

    /// The engine request limit `N`.
    pub fn limit(&self) -> usize {
        self.limit as usize
    }

    /// The overflow size `Q`.
    pub fn queue_limit(&self) -> usize {
        self.queue_limit as usize
    }
}

/// The thread passing slots on, for [`Admission::release_queued`]. If a
/// dispatch panics, its permit's release has already been counted (the
/// permit is dropped as the panic unwinds), so dropping this finishes the
/// loop: the releases that other threads left to it are not lost.
struct PassingOn<'a, T> {
    admission: &'a Arc<Admission<T>>,
    done: bool,
}

impl<T> PassingOn<'_, T> {
    fn run(&mut self) {
        loop {
            self.admission.pass_one_on();
            // AcqRel: pairs with the increments; the last one out stops.
            if self.admission.releases.fetch_sub(1, Ordering::AcqRel) == 1 {
                self.done = true;
                return;
            }
        }
    }
}

impl<T> Drop for PassingOn<'_, T> {
    fn drop(&mut self) {
        if !self.done {
            // Unwinding out of a dispatch: that release is done (its slot
            // went into the dropped permit); do the rest.
            // AcqRel: as in `run`.
            if self.admission.releases.fetch_sub(1, Ordering::AcqRel) != 1 {
                self.run();
            }
        }
    }
}

/// One engine slot; released when dropped (finished, failed, panicked or
/// cancelled alike).
#[must_use = "dropping a permit releases its slot at once"]
pub struct Permit<T> {
    admission: Option<Arc<Admission<T>>>,
}

impl<T> Permit<T> {
    fn new(admission: Arc<Admission<T>>) -> Self {
        Permit { admission: Some(admission) }
    }
}

impl<T> fmt::Debug for Permit<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Permit")
    }
}

impl<T> Drop for Permit<T> {
    fn drop(&mut self) {
        if let Some(admission) = self.admission.take() {
            admission.release();
        }
    }
}

/// One engine slot held within the caller's scope, from
/// [`Admission::try_admit_scoped`]; released when dropped.
#[must_use = "dropping a permit releases its slot at once"]
pub struct ScopedPermit<'a, T> {
    admission: &'a Arc<Admission<T>>,
}

impl<T> ScopedPermit<'_, T> {
    /// The same slot as a [`Permit`] that owns a reference to its gate (to
    /// move into a task).
    pub fn into_owned(self) -> Permit<T> {
        let admission = self.admission.clone();
        // The slot now belongs to the owned permit: skip this one's release.
        std::mem::forget(self);
        Permit::new(admission)
    }
}

impl<T> fmt::Debug for ScopedPermit<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ScopedPermit")
    }
}

impl<T> Drop for ScopedPermit<'_, T> {
    fn drop(&mut self) {
        self.admission.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_packs_running_and_queued() {
        for (r, q) in [(0, 0), (1, 0), (0, 1), (u32::MAX, 3), (7, u32::MAX)] {
            assert_eq!(unpack(pack(r, q)), (r, q));
        }
    }

    #[test]
    fn the_handoff_holds_the_oldest_waiting_item() {
        // N = 1, Q = 3: a queue of 2 plus the handoff.
        let admission = Admission::new(1, 3, Box::new(|_: u32, _| Ok(()))).unwrap();
        let Ok(Admitted::Now(_, permit)) = admission.try_admit(0) else { panic!("a slot was free") };
        for item in 1..=3 {
            assert!(matches!(admission.try_admit(item), Ok(Admitted::Queued)));
        }
        assert_eq!(*lock(&admission.handoff), Some(1), "the oldest moved on to make room");
        assert_eq!(admission.queue.len(), 2);
        assert_eq!(admission.try_admit(4).unwrap_err().into_inner(), 4);
        let mut handoff = lock(&admission.handoff);
        assert_eq!(admission.take_oldest(&mut handoff), 1);
        assert_eq!(admission.take_oldest(&mut handoff), 2);
        assert_eq!(admission.take_oldest(&mut handoff), 3);
        assert!(handoff.is_none() && admission.queue.pop().is_none());
        drop(handoff);
        // The accounting still counts the three as queued; forget the permit so
        // its release does not look for them.
        std::mem::forget(permit);
    }
}
