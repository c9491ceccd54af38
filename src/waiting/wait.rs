//! [`Wait`]: the future of [`ModelRouter::wait`](crate::ModelRouter::wait).
//!
//! ```text
//!  Start ──nobody waits, a worker is eligible──────────────▶ Done(worker)
//!    │
//!  join (line lock) ──full──▶ Done(QueueFull)
//!    ▼
//!  Queued ──woken, routed (line lock)──▶ Done(worker)
//!    │  ▲
//!    │  └── woken, nothing free after all: waits again
//!    ├──timer fired──▶ leaves (line lock) ──▶ Done(Deadline)
//!    └──dropped──────▶ leaves (line lock)
//! ```

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use super::queue::{Key, Queue};
use super::{Line, Ticket, WaitError};
use crate::class::Class;
use crate::load::WorkerId;
use crate::monitor::view::ModelView;
use crate::route::{RouteError, RoutedModel, WorkerRouter};
use crate::sync::{lock, Arc, MutexGuard, Ordering};

pin_project! {
    /// Routes a request, waiting in its model's line while no worker is
    /// free; resolves to the worker, or to why none was given. Dropping it
    /// leaves the line at once.
    ///
    /// # Panics
    ///
    /// Polled again after it resolved (as most futures, it must not be).
    ///
    /// Made by [`ModelRouter::wait`](crate::ModelRouter::wait) and
    /// [`WorkerRouter::wait`](crate::WorkerRouter::wait).
    #[must_use = "a Wait does nothing unless polled"]
    pub struct Wait<'r, T> {
        #[pin]
        timer: T,
        router: &'r WorkerRouter,
        // `None`: failed before it started (unknown model).
        routed: Option<Arc<RoutedModel>>,
        exclude: Vec<WorkerId>,
        ticket: Ticket,
        phase: Phase,
    }

    impl<T> PinnedDrop for Wait<'_, T> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let (Phase::Queued(key), Some(routed)) = (&*this.phase, this.routed.as_deref()) {
                let line = &routed.state.line;
                leave(line, lock(&line.queue), key, Leaving::Dropped);
            }
        }
    }
}

/// Where a [`Wait`] is.
#[derive(Debug)]
enum Phase {
    /// Not polled yet.
    Start,
    /// In the line.
    Queued(Key),
    /// Resolved (or failed before it started).
    Done(Option<WaitError>),
}

impl<'r, T> Wait<'r, T> {
    pub(crate) fn new(
        router: &'r WorkerRouter,
        routed: Arc<RoutedModel>,
        exclude: &[WorkerId],
        ticket: Ticket,
        timer: T,
    ) -> Self {
        Wait { timer, router, routed: Some(routed), exclude: exclude.to_vec(), ticket, phase: Phase::Start }
    }

    /// A wait that resolves to `error` at its first poll.
    pub(crate) fn failed(router: &'r WorkerRouter, error: WaitError, ticket: Ticket, timer: T) -> Self {
        Wait { timer, router, routed: None, exclude: Vec::new(), ticket, phase: Phase::Done(Some(error)) }
    }
}

impl<T: Future<Output = ()>> Future for Wait<'_, T> {
    type Output = Result<WorkerId, WaitError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if let Some(error) = move_if_forgotten(this.router, this.routed, this.phase, this.timer.as_mut(), cx) {
            *this.phase = Phase::Done(None);
            return Poll::Ready(Err(error));
        }
        let routed = match (&mut *this.phase, this.routed.as_deref()) {
            (Phase::Done(error), _) => {
                let error = error.take().expect("Wait polled after it resolved");
                return Poll::Ready(Err(error));
            }
            (_, Some(routed)) => routed,
            (_, None) => unreachable!("only a failed Wait has no model"),
        };
        let router = Routing { router: this.router, routed, class: this.ticket.class };
        let line = &routed.state.line;
        // Nobody waits: route at once, before the timer is ever polled (a
        // runtime's sleep registers with its timer only when polled, so a
        // request routed at once never touches the timer).
        if matches!(this.phase, Phase::Start) && !line.is_waiting() {
            match router.route(this.exclude) {
                Err(RouteError::Overloaded) => {}
                routed => {
                    *this.phase = Phase::Done(None);
                    return Poll::Ready(routed.map_err(not_overloaded));
                }
            }
        }
        if this.timer.poll(cx).is_ready() {
            let displaced = match &*this.phase {
                Phase::Queued(key) => !leave(line, lock(&line.queue), key, Leaving::Expired),
                _ => false,
            };
            *this.phase = Phase::Done(None);
            return Poll::Ready(Err(if displaced { WaitError::ClassShed } else { WaitError::Deadline }));
        }
        let (queue, key) = match &*this.phase {
            Phase::Queued(key) => (lock(&line.queue), *key),
            Phase::Start => {
                let mut queue = lock(&line.queue);
                // Every waiter already in the line woken (or none there):
                // a worker may be free for this one too.
                let all_woken = queue.all_woken();
                let was_empty = queue.len() == 0;
                let ticket = this.ticket;
                let joined = match queue.join(
                    ticket.class,
                    ticket.tenant,
                    ticket.deadline,
                    ticket.tokens,
                    line.limits,
                    cx.waker(),
                ) {
                    Ok(joined) => joined,
                    Err(full) => {
                        *this.phase = Phase::Done(None);
                        return Poll::Ready(Err(full));
                    }
                };
                if was_empty {
                    // AcqRel RMW, then the view is loaded (in `wake_free`):
                    // an empty line's count changes by a joiner's RMW only
                    // (module docs: no lost wake-up).
                    line.waiting.fetch_add(1, Ordering::AcqRel);
                } else {
                    // Others wait (the count is above 0 since the first of
                    // them joined): a store under the lock, as a leaver's.
                    line.count_left(&queue);
                }
                if joined.displaced != 0 {
                    // The line may have emptied under it (its spent marks
                    // forgotten).
                    line.sync_hint(&queue);
                }
                let key = joined.key;
                *this.phase = Phase::Queued(key);
                // A publication may have come just before the increment
                // (the line was empty, so it woke nobody), or workers may
                // be free beyond those woken: wake up to the free count,
                // maybe this one. Otherwise a waiter ahead is not woken, so
                // no worker is free (every publication and report since
                // the line was not empty woke as many as were free).
                // A displacement wakes: a displaced waiter that was woken
                // passes its turn on, and a line the displacement emptied
                // forgot its spent workers (some may be free now).
                if !all_woken && joined.displaced == 0 {
                    // No pass: this waiter is not woken, and its waker is
                    // the one it joined with.
                    return Poll::Pending;
                }
                line.wake_free(&mut queue);
                (queue, key)
            }
            Phase::Done(_) => unreachable!("handled above"),
        };
        let result = dispatch(line, &router, this.exclude, queue, &key, cx);
        finish(this.phase, result)
    }
}

/// If the monitor forgot the model of `routed` (its last instance left),
/// the wait leaves that model's line and starts over with the model's
/// current state: it joins the new line in its place by class and deadline
/// (or routes at once), keeping its ticket and timer. A waiter whose timer
/// fired meanwhile hears [`WaitError::Deadline`], one that a critical
/// arrival displaced [`WaitError::ClassShed`]. The model not back: a waiter
/// hears [`WaitError::Unavailable`], as a request routed then would; a wait
/// not yet in any line (made from a [`ModelRouter`](crate::ModelRouter)
/// handle taken before) [`WaitError::UnknownModel`], as
/// [`WorkerRouter::wait`] for a forgotten model. Cold: one flag load while
/// the model stays.
///
/// The publication that left the model without an instance woke every
/// waiter of its line (`Line::wake_free`), so none sleeps in a forgotten
/// line: each is polled, and moves here.
fn move_if_forgotten<T: Future<Output = ()>>(
    router: &WorkerRouter,
    routed: &mut Option<Arc<RoutedModel>>,
    phase: &mut Phase,
    timer: Pin<&mut T>,
    cx: &mut Context<'_>,
) -> Option<WaitError> {
    let current = routed.as_deref().filter(|r| r.state.is_retired())?;
    let gone = match phase {
        Phase::Done(_) => return None,
        Phase::Start => WaitError::UnknownModel,
        Phase::Queued(key) => {
            let line = &current.state.line;
            let expired = timer.poll(cx).is_ready();
            let why = if expired { Leaving::Expired } else { Leaving::Dropped };
            if !leave(line, lock(&line.queue), key, why) {
                return Some(WaitError::ClassShed);
            }
            if expired {
                return Some(WaitError::Deadline);
            }
            WaitError::Unavailable
        }
    };
    match router.routed(&current.state.name) {
        Ok(fresh) => {
            *routed = Some(fresh);
            *phase = Phase::Start;
            None
        }
        Err(_) => Some(gone),
    }
}

/// Records a resolved outcome in the phase.
fn finish(phase: &mut Phase, result: Poll<Result<WorkerId, WaitError>>) -> Poll<Result<WorkerId, WaitError>> {
    if result.is_ready() {
        *phase = Phase::Done(None);
    }
    result
}

/// A router, the model it routes and the class of the request (a
/// sheddable one keeps off the headroom, if any).
struct Routing<'a> {
    router: &'a WorkerRouter,
    routed: &'a RoutedModel,
    class: Class,
}

impl Routing<'_> {
    #[inline]
    fn route(&self, exclude: &[WorkerId]) -> Result<WorkerId, RouteError> {
        self.router.route_class_routed(self.routed, exclude, self.class)
    }

    /// Routes with the model's view `view` read (the line's, under its
    /// lock).
    #[inline]
    fn route_in(&self, view: &ModelView, exclude: &[WorkerId]) -> Result<WorkerId, RouteError> {
        self.router.route_class_in(self.routed, view, exclude, self.class)
    }

    /// Routes leaving out the line's spent workers and the request's own
    /// exclusions.
    #[inline]
    fn route_leaving_out(
        &self,
        view: &ModelView,
        spent: &[WorkerId],
        exclude: &[WorkerId],
    ) -> Result<WorkerId, RouteError> {
        if exclude.is_empty() {
            return self.route_in(view, spent);
        }
        let mut skip = exclude.to_vec();
        skip.extend(spent.iter().filter(|w| !exclude.contains(w)));
        self.route_in(view, &skip)
    }

    /// In a large fleet: routes among the line's free set, less the
    /// request's own exclusions (at the set's cost, not the spent
    /// workers'). A view with no instance in routing routes as with few
    /// marks (the model may be gone: that route looks it up again).
    fn route_among_free(
        &self,
        queue: &mut Queue,
        view: &ModelView,
        exclude: &[WorkerId],
    ) -> Result<WorkerId, RouteError> {
        let free = queue.free(view).expect("a large fleet's line keeps a free set");
        match self.router.route_class_among(self.routed, view, free, exclude, self.class) {
            Err(RouteError::Unavailable) => self.route_leaving_out(view, queue.spent(), exclude),
            routed => routed,
        }
    }

    /// Whether this request keeps off the sheddable headroom (a woken one
    /// that finds no worker is held, see `Queue::hold`).
    fn holds_off(&self) -> bool {
        self.class == Class::Sheddable && self.router.headroom().is_some()
    }
}

/// Under the lock: a woken waiter routes among the free workers (its own
/// exclusions and the spent ones left out); any other waits.
fn dispatch(
    line: &Line,
    router: &Routing<'_>,
    exclude: &[WorkerId],
    mut queue: MutexGuard<'_, Queue>,
    key: &Key,
    cx: &mut Context<'_>,
) -> Poll<Result<WorkerId, WaitError>> {
    let Some(at) = queue.find(key) else {
        // Not in the line: a critical arrival took its place.
        let displaced = queue.take_displaced(key);
        debug_assert!(displaced, "a queued Wait is in the line or was displaced");
        return Poll::Ready(Err(WaitError::ClassShed));
    };
    if !queue.is_woken(at) {
        queue.set_waker(at, cx.waker());
        return Poll::Pending;
    }
    // With no threshold nothing is busy, and the spent marks pace nothing:
    // no report could say a worker took too much.
    let routed = line.with_view(&mut queue, |queue, view| match (view.filtering, queue.is_large()) {
        (false, _) => router.route_in(view, exclude),
        (true, true) => router.route_among_free(queue, view, exclude),
        (true, false) => router.route_leaving_out(view, queue.spent(), exclude),
    });
    match routed {
        Ok(worker) => {
            queue.dispatched_to(at, worker);
            line.sync_hint(&queue);
            line.count_left(&queue);
            Poll::Ready(Ok(worker))
        }
        Err(RouteError::Overloaded) if router.routed.state.is_retired() => {
            // The model was forgotten since this poll began, and is back
            // overloaded (the route looked it up again): polled again at
            // once, the wait moves to the new line (`move_if_forgotten`).
            // It stays woken here until then: its leaving passes it on.
            cx.waker().wake_by_ref();
            Poll::Pending
        }
        Err(RouteError::Overloaded) if router.holds_off() || !exclude.is_empty() => {
            // Free workers, but none this request may take (none with the
            // sheddable headroom, or only workers it excludes), or none at
            // all: held until the next publication or report, and the turn
            // goes on to whoever else waits (a free worker it may not take
            // is not left idle behind it).
            queue.set_waker(at, cx.waker());
            queue.hold(at);
            line.sync_hint(&queue);
            line.wake_free(&mut queue);
            Poll::Pending
        }
        Err(RouteError::Overloaded) => {
            queue.unwake(at);
            queue.set_waker(at, cx.waker());
            Poll::Pending
        }
        Err(_) => {
            // No instance (or the model forgotten since, and not back): a
            // request that waited for a known model hears it is unavailable.
            leave(line, queue, key, Leaving::Dropped);
            Poll::Ready(Err(WaitError::Unavailable))
        }
    }
}

/// Why a waiter leaves without a worker.
enum Leaving {
    /// Its deadline passed (which may overrun its class).
    Expired,
    /// Dropped, or its model can no longer be routed.
    Dropped,
}

/// Takes the waiter out of the line without a worker; a woken one passes
/// its wake-up on. Returns false if it was no longer there (displaced by a
/// critical arrival: it hears it now).
fn leave(line: &Line, mut queue: MutexGuard<'_, Queue>, key: &Key, why: Leaving) -> bool {
    let Some(at) = queue.find(key) else {
        queue.take_displaced(key);
        return false;
    };
    let was_woken = match why {
        Leaving::Expired => queue.expired(at),
        Leaving::Dropped => queue.leave(at),
    };
    line.sync_hint(&queue);
    line.count_left(&queue);
    if was_woken {
        line.wake_free(&mut queue);
    }
    true
}

/// The wait's error for a route error other than overloaded (which a wait
/// answers by joining the line or waiting on).
fn not_overloaded(e: RouteError) -> WaitError {
    match e {
        RouteError::UnknownModel => WaitError::UnknownModel,
        // Overloaded is never given (see above); no worker is the closest.
        _ => WaitError::Unavailable,
    }
}
