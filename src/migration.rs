//! [`Migration`]: route, and when a worker refuses at its hard cap, route
//! again excluding every worker that refused, up to a limit.

use std::fmt;
use std::future::Future;

use crate::load::WorkerId;
use crate::rejection::Rejection;
use crate::route::RouteError;

/// The default number of retries after a worker refuses.
pub const DEFAULT_MIGRATION_LIMIT: usize = 3;

/// The request-local state of one request's attempts.
///
/// Works with every routing handle: the `route` argument is any
/// `FnMut(&[WorkerId]) -> Result<WorkerId, RouteError>`, such as
/// `|refused| router.route(model, refused)` for a [`WorkerRouter`](crate::WorkerRouter),
/// `|refused| model.route(refused)` for a [`ModelRouter`](crate::ModelRouter)
/// or `|refused| local.route(refused)` for a
/// [`LocalRouter`](crate::LocalRouter). [`run`](Self::run) sends with a
/// blocking function, [`run_async`](Self::run_async) awaits an async one.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use loadgate::{Migration, MigrationError, Policy, Rejection, RouteError, WorkerRouter, WorkerMonitor};
///
/// let monitor = Arc::new(WorkerMonitor::new(Default::default()).unwrap());
/// monitor.register(1, "m", 1, 0).unwrap();
/// monitor.register(2, "m", 1, 0).unwrap();
/// let router = WorkerRouter::new(monitor, Policy::RoundRobin);
/// // Worker 1 is at capacity; worker 2 accepts.
/// let route = |refused: &[u64]| router.route("m", refused);
/// let served = Migration::new(3).run(route, |w| if w == 1 { Err(Rejection::WorkerOverloaded) } else { Ok(w) });
/// assert_eq!(served, Ok(2));
/// // A model nobody registered stays a 404-class error.
/// let unknown = Migration::new(3).run(|refused| router.route("other", refused), |w| Ok::<_, Rejection>(w));
/// assert_eq!(unknown, Err(MigrationError::Route(RouteError::UnknownModel)));
/// ```
#[derive(Clone, Debug)]
pub struct Migration {
    limit: usize,
    refused: Vec<WorkerId>,
}

/// Why a migrated request ended without a worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MigrationError {
    /// Routing failed before any worker refused: overloaded (every instance
    /// busy), unavailable, or an unknown model (a 404, not a rejection).
    Route(RouteError),
    /// Workers refused at their hard cap and no other worker is left, or the
    /// migration limit was reached: the overload status.
    Exhausted,
    /// A worker refused in a way another worker cannot help with.
    Rejected(Rejection),
}

impl MigrationError {
    /// The rejection the client should see, or `None` for an unknown model
    /// (answer 404).
    pub fn rejection(&self) -> Option<Rejection> {
        match self {
            MigrationError::Route(e) => Rejection::try_from(*e).ok(),
            MigrationError::Exhausted => Some(Rejection::WorkerOverloaded),
            MigrationError::Rejected(r) => Some(*r),
        }
    }
}

impl fmt::Display for MigrationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MigrationError::Route(e) => e.fmt(f),
            MigrationError::Exhausted => f.write_str("every worker that could take the request refused at capacity"),
            MigrationError::Rejected(r) => r.fmt(f),
        }
    }
}

impl std::error::Error for MigrationError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            MigrationError::Route(e) => Some(e),
            MigrationError::Exhausted => None,
            MigrationError::Rejected(r) => Some(r),
        }
    }
}

impl Migration {
    /// Up to `limit` retries after the first attempt.
    pub fn new(limit: usize) -> Self {
        Migration { limit, refused: Vec::new() }
    }

    /// Records that `worker` refused at capacity. Returns true when another
    /// attempt is allowed.
    pub fn refused(&mut self, worker: WorkerId) -> bool {
        if !self.refused.contains(&worker) {
            self.refused.push(worker);
        }
        self.refused.len() <= self.limit
    }

    /// The workers that refused so far.
    pub fn refusals(&self) -> &[WorkerId] {
        &self.refused
    }

    /// Routes and sends until a worker accepts. Only
    /// [`Rejection::WorkerOverloaded`] is retried; any other rejection, and a
    /// routing error, ends the request.
    ///
    /// # Errors
    ///
    /// [`MigrationError`]: the route error (an unknown model stays
    /// [`RouteError::UnknownModel`]), [`MigrationError::Exhausted`] once
    /// every worker left refused, or a worker's other rejection.
    pub fn run<R>(
        mut self,
        mut route: impl FnMut(&[WorkerId]) -> Result<WorkerId, RouteError>,
        mut send: impl FnMut(WorkerId) -> Result<R, Rejection>,
    ) -> Result<R, MigrationError> {
        loop {
            let worker = self.pick(&mut route)?;
            if let Some(done) = self.settle(worker, send(worker)) {
                return done;
            }
        }
    }

    /// As [`run`](Self::run), awaiting each send. Runtime-agnostic; the
    /// future is `Send` when `send`'s futures are.
    ///
    /// # Errors
    ///
    /// As [`run`](Self::run).
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use loadgate::{Migration, Policy, Rejection, WorkerRouter, WorkerMonitor};
    /// # let monitor = Arc::new(WorkerMonitor::new(Default::default()).unwrap());
    /// # monitor.register(1, "m", 1, 0).unwrap();
    /// # monitor.register(2, "m", 1, 0).unwrap();
    /// let model = WorkerRouter::new(monitor, Policy::RoundRobin).model("m").unwrap();
    /// let served = Migration::new(3).run_async(
    ///     |refused| model.route(refused),
    ///     |w| async move { if w == 1 { Err(Rejection::WorkerOverloaded) } else { Ok(w) } },
    /// );
    /// # let served = std::pin::pin!(served);
    /// # let std::task::Poll::Ready(served) = std::future::Future::poll(served, &mut std::task::Context::from_waker(std::task::Waker::noop())) else { panic!() };
    /// assert_eq!(served, Ok(2)); // after `.await`
    /// ```
    pub async fn run_async<R, F>(
        mut self,
        mut route: impl FnMut(&[WorkerId]) -> Result<WorkerId, RouteError>,
        mut send: impl FnMut(WorkerId) -> F,
    ) -> Result<R, MigrationError>
    where
        F: Future<Output = Result<R, Rejection>>,
    {
        loop {
            let worker = self.pick(&mut route)?;
            if let Some(done) = self.settle(worker, send(worker).await) {
                return done;
            }
        }
    }

    /// The next worker, excluding every worker that refused.
    fn pick(
        &self,
        route: &mut impl FnMut(&[WorkerId]) -> Result<WorkerId, RouteError>,
    ) -> Result<WorkerId, MigrationError> {
        match route(&self.refused) {
            Ok(worker) => Ok(worker),
            // All remaining workers refused or are busy.
            Err(RouteError::Overloaded) if !self.refused.is_empty() => Err(MigrationError::Exhausted),
            Err(e) => Err(MigrationError::Route(e)),
        }
    }

    /// What `worker`'s answer means: done (served, or ended), or `None` to
    /// try another worker.
    fn settle<R>(&mut self, worker: WorkerId, sent: Result<R, Rejection>) -> Option<Result<R, MigrationError>> {
        match sent {
            Ok(r) => Some(Ok(r)),
            Err(Rejection::WorkerOverloaded) => {
                // A route that hands back a worker that already refused
                // (one that ignores the exclusions) would never grow the
                // list: exhausted, not an endless retry of that worker.
                let again = self.refused.contains(&worker);
                (!self.refused(worker) || again).then_some(Err(MigrationError::Exhausted))
            }
            Err(other) => Some(Err(MigrationError::Rejected(other))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_kept_once_in_order() {
        let mut m = Migration::new(2);
        assert!(m.refused(5));
        assert!(m.refused(3));
        assert!(m.refused(5));
        assert!(!m.refused(9));
        assert_eq!(m.refusals(), [5, 3, 9]);
    }

    /// Found by mutation testing: nothing read the error's message or its
    /// source, so an empty `Display` or a `source()` of `None` (a log line
    /// saying nothing, an error chain cut short) passed every test.
    #[test]
    fn errors_say_why_and_chain_to_their_cause() {
        use std::error::Error;
        let route = MigrationError::Route(RouteError::UnknownModel);
        assert_eq!(route.to_string(), RouteError::UnknownModel.to_string());
        assert!(!route.to_string().is_empty());
        assert_eq!(route.source().map(ToString::to_string), Some(RouteError::UnknownModel.to_string()));
        let exhausted = MigrationError::Exhausted;
        assert_eq!(exhausted.to_string(), "every worker that could take the request refused at capacity");
        assert!(exhausted.source().is_none());
        let rejected = MigrationError::Rejected(Rejection::WorkerOverloaded);
        assert_eq!(rejected.to_string(), Rejection::WorkerOverloaded.to_string());
        assert!(!rejected.to_string().is_empty());
        assert_eq!(rejected.source().map(ToString::to_string), Some(Rejection::WorkerOverloaded.to_string()));
    }

    /// Found by a review: a route that ignores the exclusions (a sticky
    /// session) and hands back the worker that refused ended in an endless
    /// loop; now that worker's second refusal ends the request.
    #[test]
    fn a_route_that_repeats_a_refusing_worker_is_exhausted() {
        let mut attempts = 0u32;
        let result = Migration::new(3).run(
            |_refused: &[WorkerId]| Ok(1),
            |_worker| {
                attempts += 1;
                assert!(attempts <= 100, "still retrying after {attempts} attempts");
                Err::<(), _>(Rejection::WorkerOverloaded)
            },
        );
        assert_eq!(result, Err(MigrationError::Exhausted));
        assert_eq!(attempts, 2);
    }
}
