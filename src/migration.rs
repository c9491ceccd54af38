//! [`Migration`]: route, and when a worker refuses at its hard cap, route
//! again excluding every worker that refused, up to a limit.

use std::fmt;

use crate::error::Rejection;
use crate::load::WorkerId;
use crate::router::{RouteError, Router};

/// The default number of retries after a worker refuses.
pub const DEFAULT_MIGRATION_LIMIT: usize = 3;

/// The request-local state of one request's attempts.
///
/// Usable from async code (the frontend drives it around each dispatch) or
/// through [`Migration::run`] for blocking senders.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use loadgate::{Migration, MigrationError, Policy, Rejection, RouteError, Router, WorkerMonitor};
///
/// let monitor = Arc::new(WorkerMonitor::new(Default::default()).unwrap());
/// monitor.register(1, "m", 1, 0).unwrap();
/// monitor.register(2, "m", 1, 0).unwrap();
/// let router = Router::new(monitor, Policy::RoundRobin);
/// // Worker 1 is at capacity; worker 2 accepts.
/// let served = Migration::new(3).run(&router, "m", |w| if w == 1 { Err(Rejection::WorkerOverloaded) } else { Ok(w) });
/// assert_eq!(served, Ok(2));
/// // A model nobody registered stays a 404-class error.
/// let unknown = Migration::new(3).run(&router, "other", |w| Ok::<_, Rejection>(w));
/// assert_eq!(unknown, Err(MigrationError::Route(RouteError::UnknownModel)));
/// ```
#[derive(Clone, Debug)]
pub struct Migration {
    limit: usize,
    refused: Vec<WorkerId>,
}

/// Why a migrated request ended without a worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

    /// Picks the next worker, excluding every worker that refused.
    ///
    /// # Errors
    ///
    /// The router's error.
    pub fn next(&self, router: &Router, model: &str) -> Result<WorkerId, RouteError> {
        router.route(model, &self.refused)
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
        router: &Router,
        model: &str,
        mut send: impl FnMut(WorkerId) -> Result<R, Rejection>,
    ) -> Result<R, MigrationError> {
        loop {
            let worker = match self.next(router, model) {
                Ok(w) => w,
                // All remaining workers refused or are busy.
                Err(RouteError::Overloaded) if !self.refused.is_empty() => return Err(MigrationError::Exhausted),
                Err(e) => return Err(MigrationError::Route(e)),
            };
            match send(worker) {
                Ok(r) => return Ok(r),
                Err(Rejection::WorkerOverloaded) => {
                    if !self.refused(worker) {
                        return Err(MigrationError::Exhausted);
                    }
                }
                Err(other) => return Err(MigrationError::Rejected(other)),
            }
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
}
