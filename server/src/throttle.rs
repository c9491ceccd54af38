//! [`LogThrottle`]: the one rate limiter for warn lines that peers (or a
//! failing syscall) can cause. At most `lines` lines pass per window of
//! `per`; the rest are counted, and the count is handed to the next line
//! that passes so it can say how many were not logged.
//!
//! Shared by `&self` (a mutex held for a few instructions), so it works in
//! a single-threaded loop and behind an `Arc` alike. Only for cold paths:
//! lines about refusals and failures, never per served request.
//!
//! At the crate root because the event plane, the HTTP server and the
//! upstream path all log what peers cause through it.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A cap of `lines` warn lines per `per`; the first line always passes.
#[derive(Debug)]
pub struct LogThrottle {
    lines: u32,
    per: Duration,
    window: Mutex<Window>,
}

#[derive(Debug)]
struct Window {
    /// When the current window opened (`None`: nothing logged yet).
    start: Option<Instant>,
    /// Lines logged in the current window.
    logged: u32,
    /// Lines suppressed since the last one that passed.
    suppressed: u64,
}

impl LogThrottle {
    /// At most `lines` (at least 1) lines per `per`.
    pub const fn new(lines: u32, per: Duration) -> LogThrottle {
        let lines = if lines == 0 { 1 } else { lines };
        LogThrottle { lines, per, window: Mutex::new(Window { start: None, logged: 0, suppressed: 0 }) }
    }

    /// At most one line per second.
    pub const fn per_second(lines: u32) -> LogThrottle {
        LogThrottle::new(lines, Duration::from_secs(1))
    }

    /// Whether a line may be logged now: `Some(lines suppressed since the
    /// last one that passed)` (log it, with that count), or `None` (do not
    /// log; it is counted).
    pub fn admit(&self) -> Option<u64> {
        self.admit_at(Instant::now())
    }

    /// [`LogThrottle::admit`] at `now` (tests).
    pub fn admit_at(&self, now: Instant) -> Option<u64> {
        let mut w = self.window.lock().unwrap_or_else(|e| e.into_inner());
        if w.start.is_none_or(|start| now.saturating_duration_since(start) >= self.per) {
            w.start = Some(now);
            w.logged = 0;
        }
        if w.logged >= self.lines {
            w.suppressed += 1;
            return None;
        }
        w.logged += 1;
        Some(std::mem::take(&mut w.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_past_the_cap_are_counted_and_reported_with_the_next() {
        let t = LogThrottle::per_second(3);
        let t0 = Instant::now();
        for _ in 0..3 {
            assert_eq!(t.admit_at(t0), Some(0));
        }
        assert_eq!(t.admit_at(t0 + Duration::from_millis(10)), None);
        assert_eq!(t.admit_at(t0 + Duration::from_millis(999)), None);
        assert_eq!(t.admit_at(t0 + Duration::from_secs(1)), Some(2));
        assert_eq!(t.admit_at(t0 + Duration::from_secs(1)), Some(0));
    }

    #[test]
    fn one_line_per_period_and_the_first_always_passes() {
        let t = LogThrottle::new(0, Duration::from_millis(100)); // 0 means 1
        let t0 = Instant::now();
        assert_eq!(t.admit_at(t0), Some(0));
        assert_eq!(t.admit_at(t0 + Duration::from_millis(50)), None);
        assert_eq!(t.admit_at(t0 + Duration::from_millis(100)), Some(1));
        // A clock read on another thread may be a little older: no panic.
        assert_eq!(t.admit_at(t0), None);
    }
}
