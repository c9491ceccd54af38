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
use crate::load::WorkerId;
use crate::route::{ModelRouter, RouteError};
use crate::sync::{lock, MutexGuard, Ordering};

pin_project! {
    /// Routes a request, waiting in its model's line while no worker is
    /// free; resolves to the worker, or to why none was given. Dropping it
    /// leaves the line at once.
    ///
    /// Made by [`ModelRouter::wait`](crate::ModelRouter::wait) and
    /// [`WorkerRouter::wait`](crate::WorkerRouter::wait).
    #[must_use = "a Wait does nothing unless polled"]
    pub struct Wait<T> {
        #[pin]
        timer: T,
        router: Option<ModelRouter>,
        exclude: Vec<WorkerId>,
        ticket: Ticket,
        phase: Phase,
    }

    impl<T> PinnedDrop for Wait<T> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let (Phase::Queued(key), Some(router)) = (&*this.phase, this.router.as_ref()) {
                let line = router.line();
                leave(line, router, lock(&line.queue), key);
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

impl<T> Wait<T> {
    pub(crate) fn new(router: ModelRouter, exclude: &[WorkerId], ticket: Ticket, timer: T) -> Self {
        Wait { timer, router: Some(router), exclude: exclude.to_vec(), ticket, phase: Phase::Start }
    }

    /// A wait that resolves to `error` at its first poll.
    pub(crate) fn failed(error: WaitError, ticket: Ticket, timer: T) -> Self {
        Wait { timer, router: None, exclude: Vec::new(), ticket, phase: Phase::Done(Some(error)) }
    }
}

impl<T: Future<Output = ()>> Future for Wait<T> {
    type Output = Result<WorkerId, WaitError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let router = match (&mut *this.phase, this.router.as_ref()) {
            (Phase::Done(error), _) => {
                let error = error.take().expect("Wait polled after it resolved");
                return Poll::Ready(Err(error));
            }
            (_, Some(router)) => router,
            (_, None) => unreachable!("only a failed Wait has no router"),
        };
        let line = router.line();
        if this.timer.poll(cx).is_ready() {
            if let Phase::Queued(key) = &*this.phase {
                leave(line, router, lock(&line.queue), key);
            }
            *this.phase = Phase::Done(None);
            return Poll::Ready(Err(WaitError::Deadline));
        }
        let mut wakers = Vec::new();
        let (mut queue, key) = match &*this.phase {
            Phase::Queued(key) => (lock(&line.queue), *key),
            Phase::Start => {
                if !line.is_waiting() {
                    match router.route(this.exclude) {
                        Err(RouteError::Overloaded) => {}
                        routed => {
                            *this.phase = Phase::Done(None);
                            return Poll::Ready(routed.map_err(WaitError::from));
                        }
                    }
                }
                let mut queue = lock(&line.queue);
                let key = match queue.join(this.ticket.deadline, this.ticket.tokens, line.limits, cx.waker()) {
                    Ok(key) => key,
                    Err(full) => {
                        *this.phase = Phase::Done(None);
                        return Poll::Ready(Err(full));
                    }
                };
                // AcqRel RMW, then the view is loaded (in `wake_under`):
                // see the module docs (no lost wake-up).
                line.waiting.fetch_add(1, Ordering::AcqRel);
                *this.phase = Phase::Queued(key);
                // A publication may have come just before the increment:
                // wake those ahead (and maybe this one) if workers are free.
                wake_under(router, &mut queue, &mut wakers);
                (queue, key)
            }
            Phase::Done(_) => unreachable!("handled above"),
        };
        queue.set_waker(&key, cx.waker());
        let result = dispatch(line, router, this.exclude, queue, &key, cx);
        // Others' wakers, after the lock (our own, if there: one spurious poll).
        wakers.into_iter().for_each(std::task::Waker::wake);
        finish(this.phase, result)
    }
}

/// Records a resolved outcome in the phase.
fn finish(phase: &mut Phase, result: Poll<Result<WorkerId, WaitError>>) -> Poll<Result<WorkerId, WaitError>> {
    if result.is_ready() {
        *phase = Phase::Done(None);
    }
    result
}

/// Under the lock: a woken waiter routes among the free workers (its own
/// exclusions and the spent ones left out); any other waits.
fn dispatch(
    line: &Line,
    router: &ModelRouter,
    exclude: &[WorkerId],
    mut queue: MutexGuard<'_, Queue>,
    key: &Key,
    cx: &mut Context<'_>,
) -> Poll<Result<WorkerId, WaitError>> {
    if !queue.is_woken(key) {
        queue.set_waker(key, cx.waker());
        return Poll::Pending;
    }
    let mut skip = exclude.to_vec();
    skip.extend(queue.spent().iter().filter(|w| !exclude.contains(w)));
    match router.route(&skip) {
        Ok(worker) => {
            queue.dispatched_to(key, worker);
            // AcqRel: the count changes only under the lock; an RMW like
            // the joiners' (module docs).
            line.waiting.fetch_sub(1, Ordering::AcqRel);
            Poll::Ready(Ok(worker))
        }
        Err(RouteError::Overloaded) => {
            queue.unwake(key);
            queue.set_waker(key, cx.waker());
            Poll::Pending
        }
        Err(other) => {
            leave(line, router, queue, key);
            Poll::Ready(Err(WaitError::from(other)))
        }
    }
}

/// Takes the waiter out of the line without a worker; a woken one passes
/// its wake-up on.
fn leave(line: &Line, router: &ModelRouter, mut queue: MutexGuard<'_, Queue>, key: &Key) {
    let Some(was_woken) = queue.leave(key) else { return };
    // AcqRel: see `dispatch`.
    line.waiting.fetch_sub(1, Ordering::AcqRel);
    if was_woken {
        let mut wakers = Vec::new();
        wake_under(router, &mut queue, &mut wakers);
        drop(queue);
        wakers.into_iter().for_each(std::task::Waker::wake);
    }
}

/// Wakes as many waiters as there are free workers (under the lock; the
/// caller calls the wakers after releasing it).
fn wake_under(router: &ModelRouter, queue: &mut Queue, wakers: &mut Vec<std::task::Waker>) {
    let free = crate::route::eligible_count(&router.view().load(), queue.spent());
    queue.wake(free, wakers);
}

impl From<RouteError> for WaitError {
    fn from(e: RouteError) -> Self {
        match e {
            // Only reached when a line is not used.
            RouteError::Overloaded => WaitError::QueueFull,
            RouteError::Unavailable => WaitError::Unavailable,
            RouteError::UnknownModel => WaitError::UnknownModel,
        }
    }
}
