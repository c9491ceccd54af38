//! [`Admission`]: a worker's hard cap — `N` engine slots plus an overflow of
//! exactly `Q`, for `N + Q` requests in all.
//!
//! A request waits for a slot either as an awaited future
//! ([`admit`](Admission::admit)) or as an item handed to a dispatch callback
//! ([`try_admit`](Admission::try_admit) on a gate built
//! [`with_dispatch`](Admission::with_dispatch)); both wait in one FIFO
//! overflow.
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
//! stores and counts its entry, a claim (a released slot passed to the
//! oldest waiter, or a free slot given to it) counts it out and takes it, a
//! cancelled future counts itself out and leaves a tombstone, each in one
//! critical section. So under the lock the storage holds exactly `queued`
//! live entries, and the arrival's decision is made on the count: it is
//! refused iff `Q` are already queued and every slot is taken (never more
//! than `N + Q` admitted), and it is never refused while fewer are. (A gate
//! without a dispatch callback has nowhere to queue a `try_admit` item, so
//! there `try_admit` admits now or refuses; `admit` always queues.) The
//! storage is a `VecDeque` allocated for `Q` up front; tombstones are swept
//! out when they are more than half of it, so it grows at most once, to
//! fewer than `2Q` entries, and a sweep costs O(1) per cancellation,
//! amortised.
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

mod config;
mod full;
mod permit;
mod storage;
mod stream;
mod waiter;

use std::fmt;

use crossbeam_utils::CachePadded;

pub use config::{
    parse_queue_limit, queue_limit_from_env, AdmissionError, DEFAULT_QUEUE_LIMIT, MAX_QUEUE_LIMIT, QUEUE_LIMIT_ENV,
};
pub use permit::{Permit, ScopedPermit};
pub use stream::PermitStream;
pub use waiter::Admit;

use crate::rejection::WORKER_AT_CAPACITY;
use crate::sync::{lock, Arc, AtomicU32, AtomicU64, Mutex, MutexGuard, Ordering};
use storage::{Entry, Waiting};
use waiter::{Cancelled, Waiter};

/// Hands a queued item its permit when a slot frees up. Returns the permit
/// back if the item can no longer use it (its client went away); the slot
/// then passes to the next item.
///
/// It runs inline, on whichever thread frees the slot (often inside a
/// permit's drop), and may be handed several slots in a row: it must not
/// block or take a lock that a permit's holder may hold while dropping it
/// (sending on a channel is the intended use). If it panics, the slot it was
/// given is released and the other waiting items still get theirs; the
/// panic reaches the thread that freed the slot. Dispatches that panic
/// while that panic unwinds are caught (the process would abort), and
/// their slots released too.
pub type Dispatch<T> = Box<dyn Fn(T, Permit<T>) -> Result<(), Permit<T>> + Send + Sync>;

/// A worker's admission control: at most `N` running, at most `Q` waiting.
///
/// # Examples
///
/// Awaiting a slot (any executor; polled by hand here):
///
/// ```
/// use std::pin::pin;
/// use std::task::{Context, Poll, Waker};
/// use loadgate::Admission;
///
/// let gate = Admission::new(1, 2).unwrap(); // N = 1, Q = 2
/// let mut cx = Context::from_waker(Waker::noop());
/// let Poll::Ready(Ok(((), first))) = pin!(gate.admit(())).poll(&mut cx) else { panic!() };
/// let mut second = pin!(gate.admit(()));
/// let mut third = pin!(gate.admit(()));
/// assert!(second.as_mut().poll(&mut cx).is_pending() && third.as_mut().poll(&mut cx).is_pending());
/// assert!(matches!(pin!(gate.admit(())).poll(&mut cx), Poll::Ready(Err(_)))); // N + Q = 3
/// drop(first); // the slot passes to the oldest waiter
/// assert!(matches!(second.poll(&mut cx), Poll::Ready(Ok(_))));
/// # use std::future::Future;
/// ```
///
/// With a dispatch callback (no async):
///
/// ```
/// use std::sync::mpsc;
/// use loadgate::{Admission, Admitted};
///
/// let (ready_tx, ready_rx) = mpsc::channel();
/// let admission = Admission::with_dispatch(1, 2, Box::new(move |item: u32, permit| {
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
    /// The waiting entries. This lock (the *handoff lock*) guards every
    /// change of the storage and of `queued` (module docs).
    waiting: Mutex<Waiting<T>>,
    /// Releases with items waiting that the thread passing slots on has yet
    /// to do (see [`release_queued`](Self::release_queued)).
    releases: CachePadded<AtomicU32>,
    dispatch: Option<Dispatch<T>>,
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

#[inline]
fn pack(running: u32, queued: u32) -> u64 {
    (u64::from(running) << 32) | u64::from(queued)
}

#[inline]
fn unpack(state: u64) -> (u32, u32) {
    ((state >> 32) as u32, state as u32)
}

impl<T> Admission<T> {
    /// `limit` engine slots (`N`) and an overflow of `queue_limit` (`Q`),
    /// for requests that [`admit`](Self::admit) and await their slot.
    /// [`try_admit`](Self::try_admit) on this gate admits now or refuses: it
    /// has no callback to hand a queued item to.
    ///
    /// # Errors
    ///
    /// `N = 0`, `Q < 2`, `Q >` [`MAX_QUEUE_LIMIT`], or `N > u32::MAX`.
    pub fn new(limit: usize, queue_limit: usize) -> Result<Arc<Self>, AdmissionError> {
        Self::build(limit, queue_limit, None)
    }

    /// As [`new`](Self::new), and [`try_admit`](Self::try_admit) queues its
    /// items for `dispatch`.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    pub fn with_dispatch(limit: usize, queue_limit: usize, dispatch: Dispatch<T>) -> Result<Arc<Self>, AdmissionError> {
        Self::build(limit, queue_limit, Some(dispatch))
    }

    fn build(limit: usize, queue_limit: usize, dispatch: Option<Dispatch<T>>) -> Result<Arc<Self>, AdmissionError> {
        let (limit, queue_limit) = config::validate(limit, queue_limit)?;
        Ok(Arc::new(Admission {
            state: CachePadded::new(AtomicU64::new(0)),
            limit,
            queue_limit,
            waiting: Mutex::new(Waiting::with_capacity(queue_limit as usize)),
            releases: CachePadded::new(AtomicU32::new(0)),
            dispatch,
            rejected: CachePadded::new(AtomicU64::new(0)),
        }))
    }

    /// Admits `item`, waiting in the overflow for a slot if none is free:
    /// resolves to the item and its permit, or to [`Rejected`] at once when
    /// `N + Q` are already admitted. See [`Admit`] for cancellation.
    pub fn admit(self: &Arc<Self>, item: T) -> Admit<T> {
        Admit::new(self.clone(), item)
    }

    /// Admits `item`: straight into a slot if one is free and nothing waits,
    /// else into the overflow (for the dispatch callback), else hands it back.
    ///
    /// The permit owns a reference to this gate, so it can move into a task;
    /// [`try_admit_scoped`](Self::try_admit_scoped) saves that reference's
    /// count updates when the request runs within the caller's scope.
    ///
    /// # Errors
    ///
    /// [`Rejected`] with the item when `N + Q` are already admitted, or, on a
    /// gate without a dispatch callback, when no slot is free or anything is
    /// waiting.
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
    /// As [`try_admit`](Self::try_admit).
    ///
    /// # Examples
    ///
    /// ```
    /// use loadgate::{Admission, Admitted};
    ///
    /// let admission = Admission::new(1, 2).unwrap();
    /// let Ok(Admitted::Now(item, permit)) = admission.try_admit_scoped(7) else { panic!() };
    /// assert_eq!((item, admission.running()), (7, 1));
    /// drop(permit);
    /// assert_eq!(admission.running(), 0);
    /// ```
    pub fn try_admit_scoped(self: &Arc<Self>, item: T) -> Result<Admitted<T, ScopedPermit<'_, T>>, Rejected<T>> {
        if self.try_take_slot() {
            return Ok(Admitted::Now(item, ScopedPermit { admission: self }));
        }
        if self.dispatch.is_none() {
            // Relaxed: a statistic.
            self.rejected.fetch_add(1, Ordering::Relaxed);
            return Err(Rejected(item));
        }
        self.queue(Entry::Item(item)).map_err(|entry| match entry {
            Entry::Item(item) => Rejected(item),
            Entry::Waiter(_) => unreachable!("an item comes back as it went in"),
        })?;
        Ok(Admitted::Queued)
    }

    /// The fast path: takes a slot if one is free and nothing waits.
    #[inline]
    fn try_take_slot(&self) -> bool {
        // Acquire on every read of the state (the CAS's failure ordering
        // too): pairs with the AcqRel CAS of whoever counted a stored entry
        // or freed a slot.
        let mut state = self.state.load(Ordering::Acquire);
        loop {
            let (running, queued) = unpack(state);
            if queued != 0 || running >= self.limit {
                return false;
            }
            match self.state.compare_exchange_weak(
                state,
                pack(running + 1, queued),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(actual) => state = actual,
            }
        }
    }

    /// Stores and counts `entry`, then gives any free slot to the oldest.
    fn queue(self: &Arc<Self>, entry: Entry<T>) -> Result<(), Entry<T>> {
        if let Some(oldest) = self.enqueue(entry)? {
            self.hand(oldest);
        }
        self.pump();
        Ok(())
    }

    /// Stores and counts `entry` in the overflow, or hands it back when `Q`
    /// are queued and every slot is taken. When `Q` are queued but a slot is
    /// free (the arrivals that filled the queue have not claimed it yet),
    /// the oldest entry takes the slot first and is returned, to be handed
    /// its permit outside the lock.
    ///
    /// Cold path: takes the handoff lock, under which `queued` counts exactly
    /// the live stored entries (module docs).
    #[cold]
    fn enqueue(&self, entry: Entry<T>) -> Result<Option<Entry<T>>, Entry<T>> {
        let mut waiting = lock(&self.waiting);
        // `queued` only changes under this lock, which we hold, so it is
        // exact here; Acquire pairs with the AcqRel CAS of whoever freed a
        // slot, for the `running` the claim below reads.
        let (_, queued) = unpack(self.state.load(Ordering::Acquire));
        let oldest = if queued < self.queue_limit {
            None
        } else {
            // Q queued: room only if a slot is free for the oldest to take.
            let Some(oldest) = self.claim_free_slot(&mut waiting) else {
                // Relaxed: a statistic.
                self.rejected.fetch_add(1, Ordering::Relaxed);
                return Err(entry);
            };
            Some(oldest)
        };
        waiting.push(entry);
        // AcqRel: a claimer that reads the count (under the lock, or in a
        // failed fast-path CAS) sees the entry stored.
        self.state.fetch_add(1, Ordering::AcqRel);
        Ok(oldest)
    }

    /// Gives a claimed entry its (already counted) slot; if its client is
    /// gone, the slot passes on like any released one.
    fn hand(self: &Arc<Self>, entry: Entry<T>) {
        if let Err(back) = self.deliver(entry, Permit::new(self.clone())) {
            drop(back);
        }
    }

    /// Hands `permit` to the entry: the dispatch callback for an item, the
    /// cell of a waiting future. The permit comes back if it cannot be used.
    fn deliver(&self, entry: Entry<T>, permit: Permit<T>) -> Result<(), Permit<T>> {
        match entry {
            Entry::Waiter(waiter) => waiter.grant(permit),
            Entry::Item(item) => match &self.dispatch {
                // Unwinding from another dispatch's panic (slots are passed
                // on from the permit's drop): a second panic escaping here
                // would abort the process. Caught, its permit was dropped as
                // it unwound (its slot released); the first panic goes on.
                Some(dispatch) if std::thread::panicking() => {
                    let call = std::panic::AssertUnwindSafe(|| dispatch(item, permit));
                    std::panic::catch_unwind(call).unwrap_or(Ok(()))
                }
                Some(dispatch) => dispatch(item, permit),
                None => unreachable!("items are only queued on a gate with a dispatch callback"),
            },
        }
    }

    /// Under the handoff lock: if an entry waits and a slot is free, claims
    /// both (counts the entry out and takes it) and returns the entry.
    fn claim_free_slot(&self, waiting: &mut MutexGuard<'_, Waiting<T>>) -> Option<Entry<T>> {
        // Acquire: pairs with the AcqRel CAS of whoever freed a slot.
        let mut state = self.state.load(Ordering::Acquire);
        loop {
            let (running, queued) = unpack(state);
            if queued == 0 || running >= self.limit {
                return None;
            }
            let next = pack(running + 1, queued - 1);
            match self.state.compare_exchange(state, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(waiting.take_oldest()),
                Err(actual) => state = actual,
            }
        }
    }

    /// While entries wait and slots are free: claim both, deliver.
    fn pump(self: &Arc<Self>) {
        loop {
            // Its own statement: the lock is released before the delivery.
            let claimed = self.claim_free_slot(&mut lock(&self.waiting));
            let Some(entry) = claimed else { return };
            self.hand(entry);
        }
    }

    /// A queued future is dropped: counts it out if it is still queued,
    /// releases a permit already granted to it.
    fn cancel(self: &Arc<Self>, waiter: &Waiter<T>) {
        let mut waiting = lock(&self.waiting);
        let (cancelled, waker) = waiter.cancel();
        let permit = match cancelled {
            Cancelled::WasQueued => {
                waiting.bury();
                // AcqRel, under the handoff lock like every change of
                // `queued`: a claimer or arrival that reads the count sees
                // the tombstone stored.
                self.state.fetch_sub(1, Ordering::AcqRel);
                None
            }
            Cancelled::Granted(permit) => Some(permit),
            Cancelled::Nothing => None,
        };
        drop(waiting);
        // After the lock: a waker's drop may run arbitrary code, and the
        // permit's release passes the slot to the next waiter.
        drop(waker);
        drop(permit);
    }

    /// Frees a slot, or hands it straight to the oldest waiting entry.
    fn release(self: &Arc<Self>) {
        // Acquire on every read of the state (the CAS's failure ordering
        // too): pairs with the AcqRel CAS of whoever counted an entry or
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

    /// A release with entries waiting. One thread at a time passes slots on:
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
    /// entry it reaches is gone).
    fn pass_one_on(self: &Arc<Self>) {
        while let Some(entry) = self.pass_on() {
            match self.deliver(entry, Permit::new(self.clone())) {
                Ok(()) => return,
                // The entry is gone and the slot is still ours: disarm the
                // permit and pass the slot on again.
                Err(mut back) => back.admission = None,
            }
        }
    }

    /// Under the handoff lock: moves one slot to the oldest waiting entry
    /// (returned, counted out and taken), or frees it when nothing waits.
    fn pass_on(&self) -> Option<Entry<T>> {
        let mut waiting = lock(&self.waiting);
        // Acquire (and the CAS's failure ordering): pairs with the AcqRel
        // updates of arrivals and fast-path admissions; AcqRel on success so
        // a slot freed here is seen by the next fast-path admission.
        let mut state = self.state.load(Ordering::Acquire);
        loop {
            let (running, queued) = unpack(state);
            let next = if queued > 0 { pack(running, queued - 1) } else { pack(running - 1, 0) };
            match self.state.compare_exchange(state, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return (queued > 0).then(|| waiting.take_oldest()),
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

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    use super::*;

    #[test]
    fn state_packs_running_and_queued() {
        for (r, q) in [(0, 0), (1, 0), (0, 1), (u32::MAX, 3), (7, u32::MAX)] {
            assert_eq!(unpack(pack(r, q)), (r, q));
        }
    }

    #[test]
    fn tombstones_are_swept_once_they_are_most_of_the_storage() {
        // N = 1, Q = 4: a slot held, then rounds of "queue a future, drop it".
        let gate = Admission::<u32>::new(1, 4).unwrap();
        let mut cx = Context::from_waker(Waker::noop());
        let Ok(Admitted::Now(_, permit)) = gate.try_admit(0) else { panic!("a slot was free") };
        for round in 0..1000 {
            let mut admit = Box::pin(gate.admit(round));
            assert!(admit.as_mut().poll(&mut cx).is_pending());
            assert_eq!(gate.queued(), 1);
            drop(admit);
            assert_eq!(gate.queued(), 0, "a dropped future gives up its place");
            assert!(lock(&gate.waiting).len() <= 2, "round {round}: tombstones pile up");
        }
        // The place is usable: Q futures queue, the next is refused.
        let mut queued: Vec<_> = (0..4).map(|i| Box::pin(gate.admit(i))).collect();
        for admit in &mut queued {
            assert!(admit.as_mut().poll(&mut cx).is_pending());
        }
        assert!(matches!(pin!(gate.admit(9)).poll(&mut cx), Poll::Ready(Err(Rejected(9)))));
        drop(permit);
        assert!(matches!(queued[0].as_mut().poll(&mut cx), Poll::Ready(Ok((0, _)))));
    }
}
