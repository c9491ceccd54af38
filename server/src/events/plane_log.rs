//! [`PlaneLog`]: the event plane's rate-limited warn lines, each kind in its
//! own bucket (a [`LogThrottle`]), so one kind cannot crowd out another:
//!
//! - `limit hit: <flag> <value>`: at most one line per limit per second;
//! - lines about connections not yet authenticated (anyone who reaches the
//!   port can cause them): at most 50 a second;
//! - lines about authenticated connections (workers): 50 a second of
//!   their own, whatever unauthenticated peers do; their registrations,
//!   deregistrations and closes too (a worker may leave and come back in a
//!   loop).
//!
//! Lines past a cap are counted; the next line that passes says how many
//! (field `suppressed`).

use std::fmt::Display;

use super::limits::{Limit, PlaneLimits};
use crate::throttle::LogThrottle;

/// Per-connection lines per second, in each of the two buckets.
const CONNECTION_LINES_PER_SECOND: u32 = 50;

#[derive(Debug)]
pub(super) struct PlaneLog {
    limits: [LogThrottle; Limit::ALL],
    unauthenticated: LogThrottle,
    authenticated: LogThrottle,
}

impl Default for PlaneLog {
    fn default() -> Self {
        PlaneLog {
            limits: std::array::from_fn(|_| LogThrottle::per_second(1)),
            unauthenticated: LogThrottle::per_second(CONNECTION_LINES_PER_SECOND),
            authenticated: LogThrottle::per_second(CONNECTION_LINES_PER_SECOND),
        }
    }
}

impl PlaneLog {
    /// Logs `limit hit: <flag> <value> (<what>)` unless this limit logged
    /// within the last second; returns whether it logged.
    pub(super) fn limit_hit(&self, limit: Limit, limits: &PlaneLimits, peer: &dyn Display, what: &str) -> bool {
        let Some(suppressed) = self.limits[limit as usize].admit() else {
            return false;
        };
        tracing::warn!(%peer, suppressed, "limit hit: {} {} ({what})", limit.flag(), limit.value(limits));
        true
    }

    /// Whether a line about a connection may be logged: `Some(suppressed)`
    /// or `None`, from the bucket of `authenticated` connections or of the
    /// others.
    pub(super) fn connection_line(&self, authenticated: bool) -> Option<u64> {
        if authenticated {
            self.authenticated.admit()
        } else {
            self.unauthenticated.admit()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unauthenticated_lines_cannot_crowd_out_the_others() {
        let log = PlaneLog::default();
        for _ in 0..CONNECTION_LINES_PER_SECOND {
            assert!(log.connection_line(false).is_some());
        }
        assert_eq!(log.connection_line(false), None, "the unauthenticated bucket is full");
        assert_eq!(log.connection_line(true), Some(0), "a worker's line still logs");
        let limits = PlaneLimits::default();
        assert!(log.limit_hit(Limit::Workers, &limits, &"peer", "test"));
        assert!(!log.limit_hit(Limit::Workers, &limits, &"peer", "test"), "one line per limit per second");
        assert!(log.limit_hit(Limit::Models, &limits, &"peer", "test"), "limits are counted apart");
    }
}
