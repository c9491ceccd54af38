//! [`Migration`]: route, and when a worker refuses at its hard cap, route
//! again excluding every worker that refused, up to a limit.

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
/// use loadgate::{Migration, Policy, Rejection, Router, WorkerMonitor};
///
/// let monitor = Arc::new(WorkerMonitor::new(Default::default()).unwrap());
/// monitor.register(1, "m", 1).unwrap();
/// monitor.register(2, "m", 1).unwrap();
/// let router = Router::new(monitor, Policy::RoundRobin);
/// // Worker 1 is at capacity; worker 2 accepts.
/// let served = Migration::new(3).run(&router, "m", |w| if w == 1 { Err(Rejection::WorkerOverloaded) } else { Ok(w) });
/// assert_eq!(served, Ok(2));
/// ```
#[derive(Clone, Debug)]
pub struct Migration {
    limit: usize,
    refused: Vec<WorkerId>,
}

/// Why a migrated request ended without a worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MigrationError {
    /// Routing failed (overloaded, unavailable, unknown model).
    Route(RouteError),
    /// Workers refused and the migration limit was reached.
    Exhausted,
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
    /// `Err(Rejection)` as the client should see it: the route error mapped to
    /// a rejection, or the last worker's rejection.
    pub fn run<R>(
        mut self,
        router: &Router,
        model: &str,
        mut send: impl FnMut(WorkerId) -> Result<R, Rejection>,
    ) -> Result<R, Rejection> {
        loop {
            let worker = match self.next(router, model) {
                Ok(w) => w,
                // All remaining workers refused or are busy: overloaded.
                Err(RouteError::Overloaded) if !self.refused.is_empty() => return Err(Rejection::WorkerOverloaded),
                Err(e) => return Err(Rejection::try_from(e).unwrap_or(Rejection::Unavailable)),
            };
            match send(worker) {
                Err(Rejection::WorkerOverloaded) => {
                    if !self.refused(worker) {
                        return Err(Rejection::WorkerOverloaded);
                    }
                }
                other => return other,
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
