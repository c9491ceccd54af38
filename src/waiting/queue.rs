//! [`Queue`]: what a model's waiting line holds under its lock — the
//! waiters in deadline order, their queued tokens, which of them are woken,
//! the workers the line dispatched to since their last report, and whether
//! the line is overrun (serving the latest deadline first).

use std::collections::VecDeque;
use std::task::Waker;
use std::time::Instant;

use super::{LineLimits, WaitError};
use crate::load::WorkerId;

/// A waiter's place: earliest deadline first, then first come.
pub(super) type Key = (Instant, u64);

/// One waiter.
struct Waiter {
    key: Key,
    /// Its prompt tokens (counted against the token limit).
    tokens: u64,
    /// Told that a worker may be free for it: its next poll routes.
    woken: bool,
    /// How to wake its task.
    waker: Waker,
    /// The line's dispatches when it joined (at its expiry: how many
    /// were served while it waited).
    dispatched_before: u64,
}

/// The line's contents (under the line's lock).
#[derive(Default)]
pub(super) struct Queue {
    /// In key order (arrivals almost always go to the back: same timeout,
    /// later deadline).
    waiters: VecDeque<Waiter>,
    /// The sum of the waiters' tokens.
    tokens: u64,
    /// Waiters with `woken` set.
    woken: usize,
    /// Workers the line dispatched to since their last report, while it had
    /// waiters: each stays out of the line's reach until it reports again.
    spent: Vec<WorkerId>,
    /// Numbers the waiters in arrival order.
    arrivals: u64,
    /// Requests the line dispatched, ever.
    dispatched: u64,
    /// The line is overrun: it cannot serve everyone in time, so it wakes
    /// the latest deadline first (the waiter with the most time left,
    /// which can still be served in time) until it empties. Set by an
    /// expiry that shows arrivals outpacing dispatches (see `expired`).
    overrun: bool,
}

impl Queue {
    /// Waiters in the line.
    pub(super) fn len(&self) -> usize {
        self.waiters.len()
    }

    /// Their queued tokens.
    pub(super) fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Whether the line serves the latest deadline first (see `overrun`).
    pub(super) fn is_overrun(&self) -> bool {
        self.overrun
    }

    /// Requests dispatched from the line so far.
    pub(super) fn dispatched(&self) -> u64 {
        self.dispatched
    }

    /// The workers the line may not give a waiter until they report.
    pub(super) fn spent(&self) -> &[WorkerId] {
        &self.spent
    }

    /// The spent workers as bits (`1 << (id % 64)`), for a lock-free first
    /// look by reporters.
    pub(super) fn spent_bits(&self) -> u64 {
        self.spent.iter().fold(0, |bits, w| bits | spent_bit(*w))
    }

    /// Adds a waiter, or refuses it when the line is full by count or by
    /// tokens.
    pub(super) fn join(
        &mut self,
        deadline: Instant,
        tokens: u64,
        limits: LineLimits,
        waker: &Waker,
    ) -> Result<Key, WaitError> {
        let over_tokens = self.tokens.checked_add(tokens).is_none_or(|sum| sum > limits.max_tokens);
        if self.waiters.len() >= limits.max_waiting || over_tokens {
            return Err(WaitError::QueueFull);
        }
        let key = (deadline, self.arrivals);
        self.arrivals += 1;
        self.tokens += tokens;
        let waiter = Waiter { key, tokens, woken: false, waker: waker.clone(), dispatched_before: self.dispatched };
        if self.waiters.back().is_none_or(|last| last.key < key) {
            self.waiters.push_back(waiter);
        } else {
            let at = self.waiters.partition_point(|w| w.key < key);
            self.waiters.insert(at, waiter);
        }
        Ok(key)
    }

    /// Whether every waiter is woken (true for an empty line).
    pub(super) fn all_woken(&self) -> bool {
        self.woken == self.waiters.len()
    }

    /// Where the waiter at `key` is.
    pub(super) fn find(&self, key: &Key) -> Option<usize> {
        self.waiters.binary_search_by_key(key, |w| w.key).ok()
    }

    /// Whether the waiter at `at` was woken (and so routes now).
    pub(super) fn is_woken(&self, at: usize) -> bool {
        self.waiters[at].woken
    }

    /// Keeps the waker of the waiter's latest poll.
    pub(super) fn set_waker(&mut self, at: usize, waker: &Waker) {
        let waiter = &mut self.waiters[at];
        if !waiter.waker.will_wake(waker) {
            waiter.waker = waker.clone();
        }
    }

    /// A woken waiter found no worker after all: it waits for the next
    /// wake-up.
    pub(super) fn unwake(&mut self, at: usize) {
        let waiter = &mut self.waiters[at];
        if waiter.woken {
            waiter.woken = false;
            self.woken -= 1;
        }
    }

    /// Takes the waiter at `at` out (served, cancelled or past its
    /// deadline); returns whether it had been woken. An empty line forgets
    /// the spent workers: with nobody waiting, dispatches are not
    /// throttled.
    pub(super) fn leave(&mut self, at: usize) -> bool {
        let waiter = self.waiters.remove(at).expect("a waiter at this place");
        self.tokens -= waiter.tokens;
        if waiter.woken {
            self.woken -= 1;
        }
        if self.waiters.is_empty() {
            self.spent.clear();
            self.overrun = false;
        }
        waiter.woken
    }

    /// The waiter at `at` leaves past its deadline. Returns whether it had
    /// been woken.
    ///
    /// If more waiters joined behind it than the line dispatched while it
    /// waited, by half ([`OUTPACED`]), arrivals outpace dispatches: in
    /// deadline order every dispatch would go to a waiter at the end of its
    /// wait (late for its objective) while the rest expire, so the line is
    /// overrun until it empties. A single expiry in a burst (those behind
    /// about as many as were served) keeps deadline order, which serves the
    /// most waiters in time when the line can catch up.
    pub(super) fn expired(&mut self, at: usize) -> bool {
        let behind = (self.waiters.len() - at - 1) as u64;
        let served = self.dispatched - self.waiters[at].dispatched_before;
        let was_woken = self.leave(at);
        if !self.overrun && !self.waiters.is_empty() {
            let (arrived, dispatched) = OUTPACED;
            self.overrun = behind * dispatched >= served * arrived;
        }
        was_woken
    }

    /// The waiter at `at` was routed to `worker`: it leaves, and `worker`
    /// takes no other waiter until it reports.
    pub(super) fn dispatched_to(&mut self, at: usize, worker: WorkerId) {
        self.leave(at);
        self.dispatched += 1;
        if !self.waiters.is_empty() && !self.spent.contains(&worker) {
            self.spent.push(worker);
        }
    }

    /// `worker` reported: the line may give it a waiter again. Returns
    /// whether it was spent.
    pub(super) fn reported(&mut self, worker: WorkerId) -> bool {
        match self.spent.iter().position(|w| *w == worker) {
            Some(i) => {
                self.spent.swap_remove(i);
                true
            }
            None => false,
        }
    }

    /// With `free` workers the line may give out, wakes waiters not yet
    /// woken until `free` are woken: the earliest deadlines first, or the
    /// latest while the line is overrun. Their wakers are called here,
    /// under the line's lock: a waker only schedules its task (which then
    /// takes the lock), and calling it by reference clones nothing.
    pub(super) fn wake(&mut self, free: usize) {
        if self.woken >= free {
            return;
        }
        let woken = &mut self.woken;
        // Wakes one waiter if it sleeps; true once `free` are woken.
        let wake = |waiter: &mut Waiter| {
            if !waiter.woken {
                waiter.woken = true;
                *woken += 1;
                waiter.waker.wake_by_ref();
            }
            *woken >= free
        };
        if self.overrun {
            self.waiters.iter_mut().rev().any(wake);
        } else {
            self.waiters.iter_mut().any(wake);
        }
    }
}

/// Arrivals to dispatches, at an expiry, from which the line is overrun
/// ([`Queue::expired`]): 3 to 2. At a steady overload of `x` times the
/// line's dispatch rate an expiring waiter has about `x` times as many
/// behind it as were served during its wait; a burst at full load about as
/// many (the demo: 1x stays in deadline order, 2x and 3x are overrun).
const OUTPACED: (u64, u64) = (3, 2);

/// A worker's bit in [`Queue::spent_bits`].
#[inline]
pub(super) fn spent_bit(worker: WorkerId) -> u64 {
    1 << (worker % 64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn noop() -> Waker {
        Waker::noop().clone()
    }

    #[test]
    fn wakes_in_deadline_order_up_to_the_free_workers() {
        let mut q = Queue::default();
        let now = Instant::now();
        let limits = LineLimits::default();
        let late = q.join(now + Duration::from_secs(2), 10, limits, &noop()).unwrap();
        let early = q.join(now + Duration::from_secs(1), 10, limits, &noop()).unwrap();
        let at = |q: &Queue, key| q.find(&key).unwrap();
        q.wake(1);
        assert!(q.is_woken(at(&q, early)) && !q.is_woken(at(&q, late)));
        q.wake(1);
        assert!(!q.is_woken(at(&q, late)), "one free worker, one woken waiter");
        q.dispatched_to(at(&q, early), 7);
        assert_eq!(q.spent(), [7]);
        assert!(q.reported(7));
        assert!(q.spent().is_empty());
        q.dispatched_to(at(&q, late), 7);
        assert!(q.spent().is_empty(), "an empty line throttles nothing");
        assert_eq!((q.len(), q.tokens(), q.dispatched()), (0, 0, 2));
    }

    #[test]
    fn an_expiry_serves_the_latest_deadline_first_until_the_line_empties() {
        let mut q = Queue::default();
        let now = Instant::now();
        let limits = LineLimits::default();
        let secs = |s| now + Duration::from_secs(s);
        let keys: Vec<Key> = (1..=4).map(|s| q.join(secs(s), 1, limits, &noop()).unwrap()).collect();
        let at = |q: &Queue, key| q.find(&key).unwrap();
        assert!(!q.expired(at(&q, keys[0])), "it was not woken");
        assert!(q.is_overrun());
        q.wake(1);
        assert!(q.is_woken(at(&q, keys[3])), "the latest deadline first");
        assert!(!q.is_woken(at(&q, keys[1])) && !q.is_woken(at(&q, keys[2])));
        q.dispatched_to(at(&q, keys[3]), 1);
        q.wake(1);
        assert!(q.is_woken(at(&q, keys[2])) && !q.is_woken(at(&q, keys[1])), "then the next latest");
        q.leave(at(&q, keys[1]));
        assert!(q.is_overrun(), "until the line empties");
        q.leave(at(&q, keys[2]));
        assert!(!q.is_overrun());
        let early = q.join(secs(1), 1, limits, &noop()).unwrap();
        let late = q.join(secs(9), 1, limits, &noop()).unwrap();
        q.wake(1);
        assert!(q.is_woken(at(&q, early)) && !q.is_woken(at(&q, late)), "earliest first again");
        assert!(q.expired(at(&q, early)), "it was woken");
        assert!(q.is_overrun(), "one is left waiting");
        assert!(!q.expired(at(&q, late)));
        assert!(!q.is_overrun(), "the last one to expire empties the line");
    }

    #[test]
    fn an_expiry_overruns_the_line_only_when_arrivals_outpace_dispatches() {
        let now = Instant::now();
        let limits = LineLimits::default();
        let secs = |s| now + Duration::from_secs(s);
        // `behind` join after the expiring one, 2 are served while it waits.
        let overrun = |behind: u64| {
            let mut q = Queue::default();
            let expiring = q.join(secs(10), 1, limits, &noop()).unwrap();
            for s in 1..=2 {
                let ahead = q.join(secs(s), 1, limits, &noop()).unwrap();
                q.dispatched_to(q.find(&ahead).unwrap(), s);
            }
            for s in 0..behind {
                q.join(secs(20 + s), 1, limits, &noop()).unwrap();
            }
            q.expired(q.find(&expiring).unwrap());
            q.is_overrun()
        };
        assert!(!overrun(2), "as many behind as served: a burst, deadline order");
        assert!(overrun(3), "3 behind for 2 served: overrun");
    }

    #[test]
    fn limits_hold_on_both_sides() {
        let mut q = Queue::default();
        let now = Instant::now();
        let limits = LineLimits { max_waiting: 2, max_tokens: 100 };
        assert!(q.join(now, 60, limits, &noop()).is_ok());
        assert_eq!(q.join(now, 41, limits, &noop()), Err(WaitError::QueueFull), "101 tokens");
        let k = q.join(now, 40, limits, &noop()).unwrap();
        assert_eq!(q.join(now, 0, limits, &noop()), Err(WaitError::QueueFull), "3 waiters");
        assert!(!q.leave(q.find(&k).unwrap()));
        assert!(q.join(now, 40, limits, &noop()).is_ok());
        assert_eq!(
            q.join(now, u64::MAX, LineLimits { max_waiting: 9, max_tokens: u64::MAX }, &noop()),
            Err(WaitError::QueueFull)
        );
    }
}
