//! [`RetryPolicy`]: how a client retries an overloaded request — exponential
//! backoff with full jitter and a cap, honouring the server's `Retry-After`.
//!
//! The reference's `send_with_retry` retries only 503, sleeps after the final
//! attempt too, ignores `Retry-After`, and raises instead of returning the
//! last answer. This one retries the overload statuses (529, 503, 429, or a
//! configured code), never sleeps after the last attempt, waits at least what
//! the server asked for, and hands back the last response.

use std::time::Duration;

/// Exponential backoff with full jitter and a cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// The first backoff ceiling; doubles each attempt.
    pub base: Duration,
    /// No computed backoff exceeds this.
    pub cap: Duration,
    /// A server's `Retry-After` is honoured up to this.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: 5,
            base: Duration::from_millis(100),
            cap: Duration::from_secs(10),
            max_retry_after: Duration::from_secs(60),
        }
    }
}

/// What the caller's classifier says of a response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Final: success, or an error retrying cannot fix.
    Done,
    /// Overloaded: retry, after at least `retry_after` if the server said.
    Retry {
        /// The server's `Retry-After`, if it sent one.
        retry_after: Option<Duration>,
    },
}

impl RetryPolicy {
    /// The wait before retry number `attempt` (0-based): uniform in
    /// `[0, min(cap, base * 2^attempt)]`, raised to the server's
    /// `Retry-After` (itself capped at `max_retry_after`). `unit` in `[0, 1)`
    /// is the random draw, passed in so the schedule is testable.
    pub fn delay(&self, attempt: u32, retry_after: Option<Duration>, unit: f64) -> Duration {
        let ceiling = self.base.saturating_mul(1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX)).min(self.cap);
        // A NaN draw would make `mul_f64` panic (clamp keeps NaN): treat it as 0.
        let unit = if unit.is_nan() { 0.0 } else { unit.clamp(0.0, 1.0) };
        // Not `mul_f64`: it panics when the product rounds past `Duration::MAX`
        // (an uncapped policy); the product never exceeds `ceiling`.
        let jittered = Duration::try_from_secs_f64(ceiling.as_secs_f64() * unit).map_or(ceiling, |d| d.min(ceiling));
        match retry_after {
            Some(server) => jittered.max(server.min(self.max_retry_after)),
            None => jittered,
        }
    }

    /// Sends until `classify` says done or retries run out; sleeps with
    /// `sleep` between attempts (never after the last). Returns the last
    /// response either way.
    pub fn send_with_retry<R>(
        &self,
        mut send: impl FnMut(u32) -> R,
        classify: impl Fn(&R) -> Verdict,
        mut sleep: impl FnMut(Duration),
    ) -> R {
        let mut attempt = 0;
        loop {
            let response = send(attempt);
            match classify(&response) {
                Verdict::Retry { retry_after } if attempt < self.max_retries => {
                    sleep(self.delay(attempt, retry_after, fastrand::f64()));
                    attempt += 1;
                }
                _ => return response,
            }
        }
    }
}

/// Whether an HTTP status means "overloaded, try again later": 529, 503,
/// 429, or the configured overload status.
pub fn is_retryable_status(status: u16, overload_status: u16) -> bool {
    matches!(status, 429 | 503 | 529) || status == overload_status
}

/// Parses a `Retry-After` header given in seconds (`"3"`). HTTP dates are
/// not accepted (they return `None`, as does garbage).
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    let v = value.trim();
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse::<u64>().ok().map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ceiling_doubles_then_caps() {
        let p = RetryPolicy { base: Duration::from_millis(100), cap: Duration::from_secs(1), ..Default::default() };
        let ceilings: Vec<u128> = (0..7).map(|a| p.delay(a, None, 1.0).as_millis()).collect();
        assert_eq!(ceilings, [100, 200, 400, 800, 1000, 1000, 1000]);
    }

    #[test]
    fn the_default_policy() {
        let p = RetryPolicy::default();
        assert_eq!(p.max_retries, 5);
        assert!(p.delay(0, None, 1.0) <= p.base);
        assert_eq!(p.delay(100, Some(Duration::from_secs(3600)), 0.0), p.max_retry_after);
    }
}
