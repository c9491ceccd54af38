//! [`Queue`]: what a model's waiting line holds under its lock — the
//! waiters of each class in deadline order, their queued tokens, which of
//! them are woken, the workers the line dispatched to since their last
//! report, which classes are overrun (serving the latest deadline first),
//! and the waiters displaced by critical arrivals that have not yet heard.

use std::collections::VecDeque;
use std::task::Waker;
use std::time::Instant;

use super::{LineLimits, WaitError};
use crate::class::Class;
use crate::load::WorkerId;

/// A waiter's place: its class (highest first), then earliest deadline,
/// then first come.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Key {
    class: Class,
    deadline: Instant,
    arrival: u64,
}

/// Where a waiter is: its class's deque and its index there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct At {
    class: usize,
    index: usize,
}

/// One waiter.
struct Waiter {
    key: Key,
    /// Its prompt tokens (counted against the token limit).
    tokens: u64,
    /// Told that a worker may be free for it: its next poll routes.
    woken: bool,
    /// How to wake its task.
    waker: Waker,
    /// Its class's dispatches when it joined (at its expiry: how many of
    /// its class were served while it waited).
    dispatched_before: u64,
}

/// One class's waiters.
#[derive(Default)]
struct ClassLine {
    /// In key order (arrivals almost always go to the back: same timeout,
    /// later deadline).
    waiters: VecDeque<Waiter>,
    /// Dispatches from this class, ever.
    dispatched: u64,
    /// The class is overrun: it cannot serve all its waiters in time, so
    /// it wakes its latest deadline first (the waiter with the most time
    /// left, which can still be served in time) until it empties. Set by
    /// an expiry that shows arrivals outpacing dispatches (see
    /// [`Queue::expired`]).
    overrun: bool,
}

/// The line's contents (under the line's lock).
#[derive(Default)]
pub(super) struct Queue {
    /// One deque per class, highest first.
    classes: [ClassLine; Class::COUNT],
    /// Waiters in all classes.
    len: usize,
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
    /// Waiters a critical arrival displaced, until their future hears it
    /// (woken at once, so each is polled or dropped soon).
    displaced: Vec<Key>,
}

/// What a join did.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Joined {
    /// The new waiter's place.
    pub(super) key: Key,
    /// Sheddable waiters it displaced.
    pub(super) displaced: usize,
    /// Whether one of them had been woken (its turn must go on).
    pub(super) displaced_woken: bool,
}

impl Queue {
    /// Waiters in the line.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Their queued tokens.
    pub(super) fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Whether `class` serves its latest deadline first (see `overrun`).
    pub(super) fn is_overrun(&self, class: Class) -> bool {
        self.classes[class.index()].overrun
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

    /// Whether `tokens` more fit beside `len` waiters holding `sum`.
    fn fits(len: usize, sum: u64, tokens: u64, limits: LineLimits) -> bool {
        len < limits.max_waiting && sum.checked_add(tokens).is_some_and(|sum| sum <= limits.max_tokens)
    }

    /// Adds a waiter of `class`, or refuses it when the line is full by
    /// count or by tokens. A critical one takes the place of sheddable
    /// waiters (the latest deadlines first) when that makes it fit; they
    /// leave at once and are woken to hear it ([`Queue::take_displaced`]).
    pub(super) fn join(
        &mut self,
        class: Class,
        deadline: Instant,
        tokens: u64,
        limits: LineLimits,
        waker: &Waker,
    ) -> Result<Joined, WaitError> {
        let mut displaced = 0;
        let mut displaced_woken = false;
        if !Self::fits(self.len, self.tokens, tokens, limits) {
            displaced = self.room_for(class, tokens, limits).ok_or(WaitError::QueueFull)?;
            for _ in 0..displaced {
                let sheddable = &mut self.classes[Class::Sheddable.index()].waiters;
                let waiter = sheddable.pop_back().expect("counted by room_for");
                displaced_woken |= waiter.woken;
                self.forget(&waiter);
                self.displaced.push(waiter.key);
                waiter.waker.wake();
            }
        }
        let key = Key { class, deadline, arrival: self.arrivals };
        self.arrivals += 1;
        self.len += 1;
        self.tokens += tokens;
        let line = &mut self.classes[class.index()];
        let waiter = Waiter { key, tokens, woken: false, waker: waker.clone(), dispatched_before: line.dispatched };
        if line.waiters.back().is_none_or(|last| last.key < key) {
            line.waiters.push_back(waiter);
        } else {
            let at = line.waiters.partition_point(|w| w.key < key);
            line.waiters.insert(at, waiter);
        }
        Ok(Joined { key, displaced, displaced_woken })
    }

    /// How many sheddable waiters (from the back) a `class` arrival of
    /// `tokens` must displace to fit; `None` if it may not or cannot.
    fn room_for(&self, class: Class, tokens: u64, limits: LineLimits) -> Option<usize> {
        if class != Class::Critical {
            return None;
        }
        let (mut len, mut sum) = (self.len, self.tokens);
        for (n, waiter) in self.classes[Class::Sheddable.index()].waiters.iter().rev().enumerate() {
            if Self::fits(len, sum, tokens, limits) {
                return Some(n);
            }
            len -= 1;
            sum -= waiter.tokens;
        }
        Self::fits(len, sum, tokens, limits).then_some(self.classes[Class::Sheddable.index()].waiters.len())
    }

    /// Whether the waiter at `key` was displaced; if so it hears it now
    /// (once).
    pub(super) fn take_displaced(&mut self, key: &Key) -> bool {
        match self.displaced.iter().position(|k| k == key) {
            Some(i) => {
                self.displaced.swap_remove(i);
                true
            }
            None => false,
        }
    }

    /// Whether every waiter is woken (true for an empty line).
    pub(super) fn all_woken(&self) -> bool {
        self.woken == self.len
    }

    /// Where the waiter at `key` is.
    pub(super) fn find(&self, key: &Key) -> Option<At> {
        let class = key.class.index();
        let index = self.classes[class].waiters.binary_search_by_key(key, |w| w.key).ok()?;
        Some(At { class, index })
    }

    fn waiter(&mut self, at: At) -> &mut Waiter {
        &mut self.classes[at.class].waiters[at.index]
    }

    /// Whether the waiter at `at` was woken (and so routes now).
    pub(super) fn is_woken(&self, at: At) -> bool {
        self.classes[at.class].waiters[at.index].woken
    }

    /// Keeps the waker of the waiter's latest poll.
    pub(super) fn set_waker(&mut self, at: At, waker: &Waker) {
        let waiter = self.waiter(at);
        if !waiter.waker.will_wake(waker) {
            waiter.waker = waker.clone();
        }
    }

    /// A woken waiter found no worker after all: it waits for the next
    /// wake-up.
    pub(super) fn unwake(&mut self, at: At) {
        let waiter = self.waiter(at);
        if waiter.woken {
            waiter.woken = false;
            self.woken -= 1;
        }
    }

    /// Takes a waiter's counts out of the line (it left its deque). An
    /// empty line forgets the spent workers (with nobody waiting,
    /// dispatches are not throttled) and every class's overrun.
    fn forget(&mut self, waiter: &Waiter) {
        self.len -= 1;
        self.tokens -= waiter.tokens;
        if waiter.woken {
            self.woken -= 1;
        }
        if self.len == 0 {
            self.spent.clear();
        }
        let line = &mut self.classes[waiter.key.class.index()];
        if line.waiters.is_empty() {
            line.overrun = false;
        }
    }

    /// Takes the waiter at `at` out (served, cancelled or past its
    /// deadline); returns whether it had been woken.
    pub(super) fn leave(&mut self, at: At) -> bool {
        let waiter = self.classes[at.class].waiters.remove(at.index).expect("a waiter at this place");
        self.forget(&waiter);
        waiter.woken
    }

    /// The waiter at `at` leaves past its deadline. Returns whether it had
    /// been woken.
    ///
    /// If more waiters of its class joined behind it than its class
    /// dispatched while it waited, by half ([`OUTPACED`]), arrivals outpace
    /// dispatches: in deadline order every dispatch would go to a waiter at
    /// the end of its wait (late for its objective) while the rest expire,
    /// so the class is overrun until it empties. A single expiry in a burst
    /// (those behind about as many as were served) keeps deadline order,
    /// which serves the most waiters in time when the line can catch up.
    pub(super) fn expired(&mut self, at: At) -> bool {
        let line = &self.classes[at.class];
        let behind = (line.waiters.len() - at.index - 1) as u64;
        let served = line.dispatched - line.waiters[at.index].dispatched_before;
        let was_woken = self.leave(at);
        let line = &mut self.classes[at.class];
        if !line.overrun && !line.waiters.is_empty() {
            let (arrived, dispatched) = OUTPACED;
            line.overrun = behind * dispatched >= served * arrived;
        }
        was_woken
    }

    /// The waiter at `at` was routed to `worker`: it leaves, and `worker`
    /// takes no other waiter until it reports.
    pub(super) fn dispatched_to(&mut self, at: At, worker: WorkerId) {
        self.leave(at);
        self.dispatched += 1;
        self.classes[at.class].dispatched += 1;
        if self.len != 0 && !self.spent.contains(&worker) {
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
    /// woken until `free` are woken: the highest class first; within a
    /// class the earliest deadline first, or the latest while the class is
    /// overrun. Their wakers are called here, under the line's lock: a
    /// waker only schedules its task (which then takes the lock), and
    /// calling it by reference clones nothing.
    pub(super) fn wake(&mut self, free: usize) {
        if self.woken >= free {
            return;
        }
        let woken = &mut self.woken;
        // Wakes one waiter if it sleeps; true once `free` are woken.
        let mut wake = |waiter: &mut Waiter| {
            if !waiter.woken {
                waiter.woken = true;
                *woken += 1;
                waiter.waker.wake_by_ref();
            }
            *woken >= free
        };
        for line in &mut self.classes {
            let done = if line.overrun {
                line.waiters.iter_mut().rev().any(&mut wake)
            } else {
                line.waiters.iter_mut().any(&mut wake)
            };
            if done {
                return;
            }
        }
    }
}

/// Arrivals to dispatches, at an expiry, from which a class is overrun
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

    const STANDARD: Class = Class::Standard;

    /// Joins a standard waiter (must fit).
    fn join(q: &mut Queue, deadline: Instant, tokens: u64, limits: LineLimits) -> Key {
        q.join(STANDARD, deadline, tokens, limits, &noop()).unwrap().key
    }

    fn at(q: &Queue, key: Key) -> At {
        q.find(&key).unwrap()
    }

    #[test]
    fn wakes_in_deadline_order_up_to_the_free_workers() {
        let mut q = Queue::default();
        let now = Instant::now();
        let limits = LineLimits::default();
        let late = join(&mut q, now + Duration::from_secs(2), 10, limits);
        let early = join(&mut q, now + Duration::from_secs(1), 10, limits);
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
    fn higher_classes_are_woken_first_whatever_their_deadlines() {
        let mut q = Queue::default();
        let now = Instant::now();
        let limits = LineLimits::default();
        let secs = |s| now + Duration::from_secs(s);
        let mut join_as = |class, s| q.join(class, secs(s), 1, limits, &noop()).unwrap().key;
        let sheddable = join_as(Class::Sheddable, 1);
        let standard = join_as(STANDARD, 2);
        let critical = join_as(Class::Critical, 3);
        let woken = |q: &Queue| [critical, standard, sheddable].map(|k| q.is_woken(at(q, k)));
        q.wake(1);
        assert_eq!(woken(&q), [true, false, false]);
        q.wake(2);
        assert_eq!(woken(&q), [true, true, false]);
        q.wake(3);
        assert_eq!(woken(&q), [true, true, true]);
    }

    #[test]
    fn a_critical_arrival_displaces_sheddable_waiters_from_a_full_line() {
        let now = Instant::now();
        let secs = |s| now + Duration::from_secs(s);
        let limits = LineLimits { max_waiting: 3, max_tokens: 100 };
        let mut q = Queue::default();
        let shed = |q: &mut Queue, s, tokens| q.join(Class::Sheddable, secs(s), tokens, limits, &noop()).unwrap().key;
        let early = shed(&mut q, 1, 10);
        let late = shed(&mut q, 2, 10);
        let standard = join(&mut q, secs(3), 10, limits);
        assert_eq!(
            q.join(STANDARD, secs(4), 1, limits, &noop()),
            Err(WaitError::QueueFull),
            "standard gives way to nobody"
        );
        q.wake(2);
        assert!(q.is_woken(at(&q, early)), "woken before its displacement");
        let joined = q.join(Class::Critical, secs(9), 10, limits, &noop()).unwrap();
        assert_eq!((joined.displaced, joined.displaced_woken), (1, false), "the latest sheddable deadline goes");
        assert!(q.find(&late).is_none() && q.take_displaced(&late) && !q.take_displaced(&late), "told once");
        assert_eq!((q.len(), q.tokens()), (3, 30));
        // By tokens: 95 more need both remaining sheddable... only one is
        // left, and the standard one is not displaced: refused, nothing
        // changed.
        assert_eq!(q.join(Class::Critical, secs(9), 95, limits, &noop()), Err(WaitError::QueueFull));
        assert_eq!((q.len(), q.tokens()), (3, 30));
        assert!(q.find(&early).is_some() && q.find(&standard).is_some());
        // 71 tokens fit once the (woken) early one leaves.
        let joined = q.join(Class::Critical, secs(9), 71, limits, &noop()).unwrap();
        assert_eq!((joined.displaced, joined.displaced_woken), (1, true));
        assert!(q.take_displaced(&early));
        assert_eq!((q.len(), q.tokens(), q.all_woken()), (3, 91, false));
    }

    #[test]
    fn an_expiry_serves_the_latest_deadline_first_until_the_line_empties() {
        let mut q = Queue::default();
        let now = Instant::now();
        let limits = LineLimits::default();
        let secs = |s| now + Duration::from_secs(s);
        let keys: Vec<Key> = (1..=4).map(|s| join(&mut q, secs(s), 1, limits)).collect();
        assert!(!q.expired(at(&q, keys[0])), "it was not woken");
        assert!(q.is_overrun(STANDARD));
        q.wake(1);
        assert!(q.is_woken(at(&q, keys[3])), "the latest deadline first");
        assert!(!q.is_woken(at(&q, keys[1])) && !q.is_woken(at(&q, keys[2])));
        q.dispatched_to(at(&q, keys[3]), 1);
        q.wake(1);
        assert!(q.is_woken(at(&q, keys[2])) && !q.is_woken(at(&q, keys[1])), "then the next latest");
        q.leave(at(&q, keys[1]));
        assert!(q.is_overrun(STANDARD), "until the line empties");
        q.leave(at(&q, keys[2]));
        assert!(!q.is_overrun(STANDARD));
        let early = join(&mut q, secs(1), 1, limits);
        let late = join(&mut q, secs(9), 1, limits);
        q.wake(1);
        assert!(q.is_woken(at(&q, early)) && !q.is_woken(at(&q, late)), "earliest first again");
        assert!(q.expired(at(&q, early)), "it was woken");
        assert!(q.is_overrun(STANDARD), "one is left waiting");
        assert!(!q.expired(at(&q, late)));
        assert!(!q.is_overrun(STANDARD), "the last one to expire empties the line");
    }

    #[test]
    fn an_expiry_overruns_the_line_only_when_arrivals_outpace_dispatches() {
        let now = Instant::now();
        let limits = LineLimits::default();
        let secs = |s| now + Duration::from_secs(s);
        // `behind` join after the expiring one, 2 are served while it waits.
        let overrun = |behind: u64| {
            let mut q = Queue::default();
            let expiring = join(&mut q, secs(10), 1, limits);
            for s in 1..=2 {
                let ahead = join(&mut q, secs(s), 1, limits);
                q.dispatched_to(at(&q, ahead), s);
            }
            for s in 0..behind {
                join(&mut q, secs(20 + s), 1, limits);
            }
            q.expired(at(&q, expiring));
            q.is_overrun(STANDARD)
        };
        assert!(!overrun(2), "as many behind as served: a burst, deadline order");
        assert!(overrun(3), "3 behind for 2 served: overrun");
    }

    #[test]
    fn limits_hold_on_both_sides() {
        let mut q = Queue::default();
        let now = Instant::now();
        let limits = LineLimits { max_waiting: 2, max_tokens: 100 };
        join(&mut q, now, 60, limits);
        assert_eq!(q.join(STANDARD, now, 41, limits, &noop()), Err(WaitError::QueueFull), "101 tokens");
        let k = join(&mut q, now, 40, limits);
        assert_eq!(q.join(STANDARD, now, 0, limits, &noop()), Err(WaitError::QueueFull), "3 waiters");
        assert!(!q.leave(at(&q, k)));
        join(&mut q, now, 40, limits);
        assert_eq!(
            q.join(STANDARD, now, u64::MAX, LineLimits { max_waiting: 9, max_tokens: u64::MAX }, &noop()),
            Err(WaitError::QueueFull)
        );
    }
}
