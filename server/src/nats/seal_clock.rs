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
    /// The wall clock at the last stamp, and when (monotonic): where a
    /// step of the wall clock is measured from.
    wall: Option<(u64, Instant)>,
    /// Since a step back: the stamp it began at, and when.
    slow: Option<(u64, Instant)>,
}

/// The process's seal clock.
pub(crate) static SEAL_CLOCK: SealClock = SealClock::new();

impl SealClock {
    pub(super) const fn new() -> Self {
        SealClock { state: Mutex::new(State { last_ms: 0, wall: None, slow: None }) }
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
        let elapsed =
            |since: Instant| u64::try_from(now.saturating_duration_since(since).as_millis()).unwrap_or(u64::MAX);
        // How far the wall clock stepped back since the last stamp (0: it
        // went on, or forward).
        let step = state.wall.map_or(0, |(wall, at)| wall.saturating_add(elapsed(at)).saturating_sub(wall_ms));
        state.wall = Some((wall_ms, now));
        if step > window_ms {
            // Past the window: the receivers refused the stamps from
            // before it (or will not take them long); start over.
            state.slow = None;
            state.last_ms = wall_ms;
            return wall_ms;
        }
        let stamp = match state.slow {
            Some((from_ms, since)) => from_ms.saturating_add(elapsed(since) / 2),
            None if wall_ms < state.last_ms => {
                state.slow = Some((state.last_ms, now));
                state.last_ms
            }
            None => wall_ms,
        };
        let stamp = if wall_ms >= stamp {
            // Caught up (or never behind).
            state.slow = None;
            wall_ms
        } else {
            stamp
        };
        // Never earlier than the last.
        let stamp = stamp.max(state.last_ms);
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
        let ms = |n: u64| start + Duration::from_millis(n);
        assert_eq!(clock.at(1_000_000, ms(0), WINDOW), 1_000_000);
        assert_eq!(clock.at(900_000, ms(10), WINDOW), 900_000);
        assert_eq!(clock.at(900_010, ms(20), WINDOW), 900_010);
        // A small step while slow, then the wall clock steps far back.
        assert_eq!(clock.at(899_000, ms(30), WINDOW), 900_010);
        assert_eq!(clock.at(800_000, ms(40), WINDOW), 800_000, "past the window");
    }

    /// Found by a review: two steps back, each within the window, took the
    /// stamps 34 s back at once (the distance to the wall clock was past the
    /// window), and the receivers dropped every frame for as long. Each
    /// step is measured on its own; the stamps go on at half speed.
    #[test]
    fn steps_back_within_the_window_never_take_the_stamps_back() {
        let clock = SealClock::new();
        let start = Instant::now();
        let mut last = 0;
        for beat in 0..400u64 {
            let elapsed = beat * 200;
            let truth = 1_000_000 + elapsed;
            let wall = match beat {
                0..10 => truth + 20_000,
                10..20 => truth,
                _ => truth - 15_000,
            };
            let stamp = clock.at(wall, start + Duration::from_millis(elapsed), WINDOW);
            assert!(stamp >= last, "beat {beat}: {stamp} after {last}");
            assert!(stamp.abs_diff(truth) <= 20_000, "beat {beat}: {stamp} against {truth}");
            last = stamp;
        }
        assert_eq!(last, 1_000_000 + 399 * 200 - 15_000, "caught up with the wall clock");
    }
}
