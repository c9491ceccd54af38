//! [`Admit`]: the future of [`Admission::admit`], and the cell through which
//! a queued future gets its permit.
//!
//! A queued future is an entry in the overflow that points at its
//! [`Waiter`]. The cell's states, and who moves it on:
//!
//! ```text
//!  Queued ──claim (handoff lock)──▶ Claimed ──grant──▶ Granted ──poll──▶ Done
//!    │                                 │                  │
//!  drop (handoff lock)               drop               drop: the permit is
//!    ▼                                 ▼                 released, so the slot
//!  Cancelled: a tombstone,          Abandoned: the       passes to the next
//!  no longer counted as queued      grant hands the      waiter
//!                                   permit back
//! ```
//!
//! `Queued → Claimed` and `Queued → Cancelled` both happen under the
//! gate's handoff lock, so a waiter is counted out of `queued` exactly once:
//! by the slot that claims it, or by its own cancellation.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use super::storage::Entry;
use super::{Admission, Permit, Rejected};
use crate::sync::{lock, Arc, Mutex};

/// A queued [`Admit`] future's side of the handoff.
pub(super) struct Waiter<T> {
    state: Mutex<State<T>>,
}

enum State<T> {
    /// In the overflow, counted as queued.
    Queued(Waker),
    /// Taken out of the overflow with a slot; its permit is on the way.
    Claimed(Waker),
    /// The permit, for the future's next poll.
    Granted(Permit<T>),
    /// Its future was dropped while queued: a tombstone in the overflow.
    Cancelled,
    /// Its future was dropped after the claim: the grant hands the permit
    /// back, to pass on.
    Abandoned,
    /// The future took its permit (or gave up a granted one).
    Done,
}

/// What a cancellation found, for the caller to finish outside the locks.
pub(super) enum Cancelled<T> {
    /// It was queued: the caller counts it out of `queued`.
    WasQueued,
    /// It held a granted permit, to drop once the locks are released.
    Granted(Permit<T>),
    /// Claimed, done or already cancelled: nothing to do.
    Nothing,
}

impl<T> Waiter<T> {
    fn new(waker: Waker) -> Self {
        Waiter { state: Mutex::new(State::Queued(waker)) }
    }

    /// Under the handoff lock, taking the waiter out of the overflow with a
    /// slot: `false` if it is a tombstone.
    pub(super) fn claim(&self) -> bool {
        let mut state = lock(&self.state);
        match std::mem::replace(&mut *state, State::Done) {
            State::Queued(waker) => {
                *state = State::Claimed(waker);
                true
            }
            other => {
                debug_assert!(matches!(other, State::Cancelled), "only queued waiters and tombstones are stored");
                *state = other;
                false
            }
        }
    }

    /// Under the handoff lock: whether this entry is a tombstone.
    pub(super) fn is_cancelled(&self) -> bool {
        matches!(*lock(&self.state), State::Cancelled)
    }

    /// Gives a claimed waiter its permit, or hands the permit back if the
    /// future is gone.
    pub(super) fn grant(&self, permit: Permit<T>) -> Result<(), Permit<T>> {
        let mut state = lock(&self.state);
        match std::mem::replace(&mut *state, State::Done) {
            State::Claimed(waker) => {
                *state = State::Granted(permit);
                drop(state);
                waker.wake();
                Ok(())
            }
            other => {
                debug_assert!(matches!(other, State::Abandoned), "a grant goes to a claimed waiter");
                Err(permit)
            }
        }
    }

    /// The granted permit, or `None` after noting the waker to wake.
    fn take(&self, waker: &Waker) -> Option<Permit<T>> {
        let mut state = lock(&self.state);
        match &mut *state {
            State::Queued(w) | State::Claimed(w) => {
                if !w.will_wake(waker) {
                    // The old waker is dropped after the lock: its drop may
                    // run arbitrary code (even release a permit of this gate).
                    let old = std::mem::replace(w, waker.clone());
                    drop(state);
                    drop(old);
                }
                None
            }
            State::Granted(_) => match std::mem::replace(&mut *state, State::Done) {
                State::Granted(permit) => Some(permit),
                _ => unreachable!("matched Granted above"),
            },
            State::Cancelled | State::Abandoned | State::Done => None,
        }
    }

    /// The future is dropped. The caller holds the handoff lock, and drops
    /// what comes back (a permit, a waker) only once it has released it.
    pub(super) fn cancel(&self) -> (Cancelled<T>, Option<Waker>) {
        let mut state = lock(&self.state);
        match std::mem::replace(&mut *state, State::Done) {
            State::Queued(waker) => {
                *state = State::Cancelled;
                (Cancelled::WasQueued, Some(waker))
            }
            State::Claimed(waker) => {
                *state = State::Abandoned;
                (Cancelled::Nothing, Some(waker))
            }
            State::Granted(permit) => (Cancelled::Granted(permit), None),
            other => {
                *state = other;
                (Cancelled::Nothing, None)
            }
        }
    }
}

/// The future of [`Admission::admit`]: resolves to the item and its permit
/// once a slot is free, or at once to [`Rejected`] when `N + Q` are admitted.
///
/// Runtime-agnostic: it is woken by whichever thread frees the slot. Dropping
/// it while queued gives up its place (the next arrival may take it); if a
/// permit was already handed to it, the permit passes to the next waiter.
///
/// # Panics
///
/// When polled again after it completed.
#[must_use = "futures do nothing unless polled; dropping it gives up its place"]
pub struct Admit<T> {
    admission: Arc<Admission<T>>,
    item: Option<T>,
    waiter: Option<Arc<Waiter<T>>>,
}

impl<T> Admit<T> {
    pub(super) fn new(admission: Arc<Admission<T>>, item: T) -> Self {
        Admit { admission, item: Some(item), waiter: None }
    }
}

// Nothing in `Admit` is pinned structurally: the item only moves out by value.
impl<T> Unpin for Admit<T> {}

impl<T> fmt::Debug for Admit<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admit").field("queued", &self.waiter.is_some()).finish_non_exhaustive()
    }
}

impl<T> Future for Admit<T> {
    type Output = Result<(T, Permit<T>), Rejected<T>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let waiter = match &this.waiter {
            Some(waiter) => waiter,
            None => {
                let item = this.item.take().expect("Admit polled after it completed");
                if this.admission.try_take_slot() {
                    return Poll::Ready(Ok((item, Permit::new(this.admission.clone()))));
                }
                // Kept before queueing: if a dispatch or wake that queueing
                // runs panics, this future's drop still counts it out.
                this.item = Some(item);
                let waiter = this.waiter.insert(Arc::new(Waiter::new(cx.waker().clone())));
                if this.admission.queue(Entry::Waiter(waiter.clone())).is_err() {
                    // Never stored, so nothing to cancel.
                    this.waiter = None;
                    let item = this.item.take().expect("kept above");
                    return Poll::Ready(Err(Rejected(item)));
                }
                waiter
            }
        };
        match waiter.take(cx.waker()) {
            Some(permit) => {
                this.waiter = None;
                let item = this.item.take().expect("a queued future keeps its item");
                Poll::Ready(Ok((item, permit)))
            }
            None => Poll::Pending,
        }
    }
}

impl<T> Drop for Admit<T> {
    fn drop(&mut self) {
        if let Some(waiter) = self.waiter.take() {
            self.admission.cancel(&waiter);
        }
    }
}
