//! [`SealClock`]: the time a NATS frame is sealed at. The wall clock, but
//! never earlier than the last stamp: the frames that carry no seq (a
//! worker's Registers, a frontend's beats and acks) are told from replays by
//! their stamps (`plane::replays`), so after the wall clock steps back (an
//! NTP step, a VM resumed) every receiver would drop them until the clock
//! caught up with the last stamp, and a frontend silent past three beats
//! stops counting. After a step back the stamps go on at half speed from
//! the last one until the wall clock catches up (twice the step); a step
//! back past the receivers' clock window is taken at once (those receivers
//! refused the stamps from before it anyway).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::secret::unix_ms;

/// How far a frame's clock may be from the frontend's (either way).
pub(crate) const CLOCK_WINDOW: Duration = Duration::from_secs(30);

/// The stamps of this process's sealed frames.
#[derive(Debug)]
pub(crate) struct SealClock {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// The last stamp (ms since the Unix epoch); 0: none yet.
    last_ms: u64,
    /// Since a step back: the stamp it began at, and when.
    slow: Option<(u64, Instant)>,
}

/// The process's seal clock.
pub(crate) static SEAL_CLOCK: SealClock = SealClock::new();

impl SealClock {
    pub(super) const fn new() -> Self {
        SealClock { state: Mutex::new(State { last_ms: 0, slow: None }) }
    }

    /// The stamp for a frame sealed now.
    pub(crate) fn now_ms(&self) -> u64 {
        self.at(unix_ms(), Instant::now(), CLOCK_WINDOW)
    }

    /// The stamp at wall time `wall_ms` and monotonic time `now`, for
    /// receivers that take stamps within `window` of their own clock.
    pub(super) fn at(&self, wall_ms: u64, now: Instant, window: Duration) -> u64 {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let window_ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX);
        let stamp = match state.slow {
            Some((from_ms, since)) => {
                let slow =
                    from_ms.saturating_add(u64::try_from(now.duration_since(since).as_millis() / 2).unwrap_or(0));
                if wall_ms >= slow || slow - wall_ms > window_ms {
                    state.slow = None;
                    wall_ms
                } else {
                    slow
                }
            }
            None if wall_ms < state.last_ms && state.last_ms - wall_ms <= window_ms => {
                state.slow = Some((state.last_ms, now));
                state.last_ms
            }
            None => wall_ms,
        };
        // Never earlier than the last, but after a step past the window.
        let stamp = if state.slow.is_some() { stamp.max(state.last_ms) } else { stamp };
        state.last_ms = stamp;
        stamp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(30);

    #[test]
    fn a_step_back_is_taken_at_half_speed_until_the_wall_clock_catches_up() {
        let clock = SealClock::new();
        let start = Instant::now();
        let ms = |n: u64| start + Duration::from_millis(n);
        assert_eq!(clock.at(100_000, ms(0), WINDOW), 100_000);
        assert_eq!(clock.at(100_200, ms(200), WINDOW), 100_200);
        // The wall clock steps back 5 s.
        assert_eq!(clock.at(95_400, ms(400), WINDOW), 100_200, "not earlier than the last stamp");
        assert_eq!(clock.at(95_600, ms(600), WINDOW), 100_300, "half speed");
        assert_eq!(clock.at(104_400, ms(9_400), WINDOW), 104_700);
        assert_eq!(clock.at(105_400, ms(10_400), WINDOW), 105_400, "caught up after twice the step");
        assert_eq!(clock.at(105_600, ms(10_600), WINDOW), 105_600, "the wall clock again");
    }

    #[test]
    fn a_step_back_past_the_window_is_taken_at_once() {
        let clock = SealClock::new();
        let start = Instant::now();
        assert_eq!(clock.at(1_000_000, start, WINDOW), 1_000_000);
        assert_eq!(clock.at(900_000, start + Duration::from_millis(10), WINDOW), 900_000);
        assert_eq!(clock.at(900_010, start + Duration::from_millis(20), WINDOW), 900_010);
        // A small step while slow, then the wall clock jumps far behind.
        assert_eq!(clock.at(899_000, start + Duration::from_millis(30), WINDOW), 900_010);
        assert_eq!(clock.at(800_000, start + Duration::from_millis(40), WINDOW), 800_000, "past the window");
    }
}
