//! [`Queue`]: what a model's waiting line holds under its lock — the
//! waiters of each class, per tenant in deadline order, their queued
//! tokens, which of them are woken, each tenant's deficit, the workers the
//! line dispatched to since their last report, which classes are overrun
//! (serving the latest deadline first), and the waiters displaced by
//! critical arrivals that have not yet heard.

use std::collections::VecDeque;
use std::task::Waker;
use std::time::Instant;

use super::spent::{Changed, Spent};
use super::{LineLimits, ViewCache, WaitError};
use crate::class::Class;
use crate::load::WorkerId;
use crate::monitor::view::ModelView;
use crate::tenant::Tenant;

/// A waiter's place: its class (highest first), then earliest deadline,
/// then first come (and its tenant, to find it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Key {
    class: Class,
    deadline: Instant,
    arrival: u64,
    tenant: u32,
}

/// Where a waiter is: its class, its tenant's place in the class and its
/// index in the tenant's deque (valid until the queue changes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct At {
    class: usize,
    tenant: usize,
    index: usize,
}

/// One waiter.
struct Waiter {
    key: Key,
    /// Its prompt tokens (counted against the token limits).
    tokens: u64,
    /// Told that a worker may be free for it: its next poll routes.
    woken: bool,
    /// A waiter kept off the free workers (by the sheddable headroom, or by
    /// its own exclusions): not woken again until a publication or a report.
    held: bool,
    /// How to wake its task.
    waker: Waker,
    /// Its class's dispatches when it joined (at its expiry: how many of
    /// its class were served while it waited).
    dispatched_before: u64,
}

impl Waiter {
    /// What its wake-up costs its tenant's deficit: its prompt tokens (at
    /// least 1, so empty prompts still take turns).
    fn cost(&self) -> u64 {
        self.tokens.max(1)
    }
}

/// One tenant's waiters in a class.
struct TenantLine {
    tenant: u32,
    /// The latest weight its arrivals gave (at least 1).
    quantum: u64,
    /// The largest cost ([`Waiter::cost`]) of its arrivals since it joined
    /// the round: with `quantum`, the bound of a refund ([`refunded`]).
    largest: u64,
    /// In key order (arrivals almost always go to the back).
    waiters: VecDeque<Waiter>,
    /// The sum of its waiters' tokens (its share of the line, checked
    /// against its caps at each arrival without a walk over them).
    tokens: u64,
    /// Tokens it may still be woken for this round (deficit round robin);
    /// charged at a wake-up, refunded when a woken waiter leaves or waits
    /// again without a worker.
    deficit: u64,
}

impl TenantLine {
    /// Its next waiter to wake, if any sleeps (and is not held): the first
    /// in key order, or the last while the class is overrun.
    fn next(&self, overrun: bool) -> Option<usize> {
        if overrun {
            self.waiters.iter().rposition(|w| !w.woken && !w.held)
        } else {
            self.waiters.iter().position(|w| !w.woken && !w.held)
        }
    }
}

/// One class's waiters.
#[derive(Default)]
struct ClassLine {
    /// Tenants with waiters, in round order.
    tenants: Vec<TenantLine>,
    /// The tenant whose turn it is (an index into `tenants`).
    turn: usize,
    /// Whether the tenant at `turn` had its round's credit.
    credited: bool,
    /// Dispatches from this class, ever.
    dispatched: u64,
    /// The class is overrun: it cannot serve all its waiters in time, so
    /// it wakes its latest deadline first (the waiter with the most time
    /// left, which can still be served in time) until it empties. Set by
    /// an expiry that shows arrivals outpacing dispatches (see
    /// [`Queue::expired`]).
    overrun: bool,
}

impl ClassLine {
    fn is_empty(&self) -> bool {
        self.tenants.is_empty()
    }

    fn tenant(&self, tenant: u32) -> Option<usize> {
        self.tenants.iter().position(|t| t.tenant == tenant)
    }

    /// Waiters of the class with keys after `key`.
    fn behind(&self, key: &Key) -> u64 {
        self.tenants.iter().map(|t| (t.waiters.len() - t.waiters.partition_point(|w| w.key <= *key)) as u64).sum()
    }

    /// The tenant whose last waiter has the latest key, skipping `skip`
    /// waiters from the back of each tenant's deque.
    fn latest(&self, skip: &[usize]) -> Option<usize> {
        (0..self.tenants.len())
            .filter_map(|t| {
                let waiters = &self.tenants[t].waiters;
                let left = waiters.len().checked_sub(skip.get(t).copied().unwrap_or(0) + 1)?;
                Some((waiters[left].key, t))
            })
            .max()
            .map(|(_, t)| t)
    }

    /// Deficit round robin: the next waiter to wake (charged to its
    /// tenant), or `None` when every waiter of the class is woken.
    ///
    /// The turn walks the tenants in round order; a tenant with a sleeping
    /// waiter is credited its quantum as the turn reaches it, and keeps the
    /// turn while its deficit covers its next waiter. Rather than walking
    /// step by step (a large prompt would take many rounds), this finds the
    /// step at which the walk would first serve someone and credits each
    /// tenant the visits it would have had by then: the same outcome in
    /// one pass over the tenants.
    fn pick(&mut self) -> Option<(usize, usize)> {
        match self.tenants.len() {
            1 => self.pick_alone(),
            _ => self.pick_walk(),
        }
    }

    /// [`ClassLine::pick`] among any number of tenants.
    fn pick_walk(&mut self) -> Option<(usize, usize)> {
        let (overrun, credited, turn, len) = (self.overrun, self.credited, self.turn, self.tenants.len());
        let n = len as u128;
        // The walk's step at which the tenant at `offset` is first visited
        // with a credit (the turn's holder, already credited, at `n`).
        let first_credit = |offset: usize| match (offset, credited) {
            (0, true) => n,
            _ => offset as u128,
        };
        let mut best: Option<(u128, usize, usize)> = None;
        for offset in 0..len {
            let t = (turn + offset) % len;
            let line = &self.tenants[t];
            let Some(index) = line.next(overrun) else { continue };
            let credits = line.waiters[index].cost().saturating_sub(line.deficit).div_ceil(line.quantum);
            // Its visits are at `offset`, `offset + n`, ...; the visit that
            // brings its `credits`-th credit (or its first, needing none).
            let visits = match first_credit(offset) == n {
                true => credits,
                false => credits.saturating_sub(1),
            };
            let step = offset as u128 + u128::from(visits) * n;
            if best.is_none_or(|(first, _, _)| step < first) {
                best = Some((step, t, index));
            }
        }
        let (step, winner, index) = best?;
        for offset in 0..len {
            let first = first_credit(offset);
            let line = &mut self.tenants[(turn + offset) % len];
            if step >= first && line.next(overrun).is_some() {
                let credits = u64::try_from((step - first) / n + 1).unwrap_or(u64::MAX);
                line.deficit = line.deficit.saturating_add(credits.saturating_mul(line.quantum));
            }
        }
        let line = &mut self.tenants[winner];
        line.deficit -= line.waiters[index].cost();
        self.turn = winner;
        self.credited = true;
        Some((winner, index))
    }

    /// [`ClassLine::pick`] with one tenant (the common case, without the
    /// walk's arithmetic): it is credited the quanta its next waiter needs
    /// beyond its deficit, at least one if the turn had not credited it.
    fn pick_alone(&mut self) -> Option<(usize, usize)> {
        let credited = self.credited;
        let line = &mut self.tenants[0];
        let index = line.next(self.overrun)?;
        let cost = line.waiters[index].cost();
        let credits = cost.saturating_sub(line.deficit).div_ceil(line.quantum);
        let credits = if credited { credits } else { credits.max(1) };
        line.deficit = line.deficit.saturating_add(credits.saturating_mul(line.quantum)) - cost;
        self.turn = 0;
        self.credited = true;
        Some((0, index))
    }
}

/// The line's contents (under the line's lock).
#[derive(Default)]
pub(super) struct Queue {
    /// One per class, highest first.
    classes: [ClassLine; Class::COUNT],
    /// Waiters in all classes.
    len: usize,
    /// The sum of the waiters' tokens.
    tokens: u64,
    /// Waiters with `woken` set.
    woken: usize,
    /// Waiters with `held` set.
    held: usize,
    /// Workers the line dispatched to since their last report, while it had
    /// waiters: each stays out of the line's reach until it reports again.
    spent: Spent,
    /// Numbers the waiters in arrival order.
    arrivals: u64,
    /// Requests the line dispatched, ever.
    dispatched: u64,
    /// Waiters a critical arrival displaced, until their future hears it
    /// (woken at once, so each is polled or dropped soon).
    displaced: Vec<Key>,
    /// The model's view as the line last read it (`Line::with_view`);
    /// dropped when the line empties, so an idle line keeps no old view.
    view: Option<ViewCache>,
}

/// What a join did.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Joined {
    /// The new waiter's place.
    pub(super) key: Key,
    /// Sheddable waiters it displaced.
    pub(super) displaced: usize,
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

    /// Whether a waiter of `class` or a higher class is in the line.
    pub(super) fn waits_at_or_above(&self, class: Class) -> bool {
        self.classes[..=class.index()].iter().any(|line| !line.is_empty())
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
    #[inline]
    pub(super) fn spent(&self) -> &[WorkerId] {
        self.spent.ids()
    }

    /// The spent workers as bits (`1 << (id % 64)`), for a lock-free first
    /// look by reporters.
    #[inline]
    pub(super) fn spent_bits(&self) -> u64 {
        self.spent.bits()
    }

    /// In a large fleet, the free workers the line routes among (see
    /// `spent`'s module docs); `None`: route leaving out
    /// [`Queue::spent`].
    #[inline]
    pub(super) fn free(&mut self, view: &ModelView) -> Option<&[WorkerId]> {
        self.spent.free(view)
    }

    /// The line's cache of the model's view, taken out while in use
    /// (`Line::with_view`).
    #[inline]
    pub(super) fn take_view(&mut self) -> Option<ViewCache> {
        self.view.take()
    }

    /// Gives the cache back, unless the line emptied meanwhile.
    #[inline]
    pub(super) fn keep_view(&mut self, cache: ViewCache) {
        if self.len != 0 {
            self.view = Some(cache);
        }
    }

    /// Whether the line keeps a free set (many workers spent).
    #[inline]
    pub(super) fn is_large(&self) -> bool {
        self.spent.is_large()
    }

    /// A publication of `view` changed `changed`; returns whether spent
    /// marks went (of workers no longer members).
    pub(super) fn published(&mut self, view: &ModelView, changed: Changed<'_>) -> bool {
        self.spent.published(view, changed)
    }

    /// Whether `tokens` more fit beside `len` waiters holding `sum`.
    fn fits(len: usize, sum: u64, tokens: u64, limits: LineLimits) -> bool {
        len < limits.max_waiting && sum.checked_add(tokens).is_some_and(|sum| sum <= limits.max_tokens)
    }

    /// What `tenant` holds in the line: waiters and tokens, every class.
    fn held_by(&self, tenant: u32) -> (usize, u64) {
        self.classes
            .iter()
            .filter_map(|c| c.tenant(tenant).map(|t| &c.tenants[t]))
            .fold((0, 0), |(len, sum), line| (len + line.waiters.len(), sum + line.tokens))
    }

    /// Adds a waiter of `class` and `tenant`, or refuses it when the
    /// tenant holds its caps ([`WaitError::TenantCap`]) or the line is full
    /// by count or by tokens. A critical one takes the place of sheddable
    /// waiters (the latest deadlines first) when that makes it fit; they
    /// leave at once and are woken to hear it ([`Queue::take_displaced`]).
    pub(super) fn join(
        &mut self,
        class: Class,
        tenant: Tenant,
        deadline: Instant,
        tokens: u64,
        limits: LineLimits,
        waker: &Waker,
    ) -> Result<Joined, WaitError> {
        if tenant.max_waiting != usize::MAX || tenant.max_tokens != u64::MAX {
            let (len, sum) = self.held_by(tenant.id);
            let caps = LineLimits { max_waiting: tenant.max_waiting, max_tokens: tenant.max_tokens };
            if !Self::fits(len, sum, tokens, caps) {
                return Err(WaitError::TenantCap);
            }
        }
        let mut displaced = 0;
        if !Self::fits(self.len, self.tokens, tokens, limits) {
            displaced = self.room_for(class, tokens, limits).ok_or(WaitError::QueueFull)?;
            for _ in 0..displaced {
                let sheddable = &self.classes[Class::Sheddable.index()];
                let t = sheddable.latest(&[]).expect("counted by room_for");
                let index = sheddable.tenants[t].waiters.len() - 1;
                let at = At { class: Class::Sheddable.index(), tenant: t, index };
                let waiter = self.remove(at, false);
                self.displaced.push(waiter.key);
                waiter.waker.wake();
            }
        }
        let key = Key { class, deadline, arrival: self.arrivals, tenant: tenant.id };
        self.arrivals += 1;
        self.len += 1;
        self.tokens += tokens;
        let line = &mut self.classes[class.index()];
        let waiter =
            Waiter { key, tokens, woken: false, held: false, waker: waker.clone(), dispatched_before: line.dispatched };
        let t = match line.tenant(tenant.id) {
            Some(t) => t,
            None => {
                line.tenants.push(TenantLine {
                    tenant: tenant.id,
                    quantum: 0,
                    largest: 0,
                    waiters: VecDeque::new(),
                    tokens: 0,
                    deficit: 0,
                });
                line.tenants.len() - 1
            }
        };
        let own = &mut line.tenants[t];
        own.quantum = tenant.quantum();
        own.largest = own.largest.max(waiter.cost());
        // At most the line's sum, which fits (checked above).
        own.tokens += tokens;
        if own.waiters.back().is_none_or(|last| last.key < key) {
            own.waiters.push_back(waiter);
        } else {
            let at = own.waiters.partition_point(|w| w.key < key);
            own.waiters.insert(at, waiter);
        }
        Ok(Joined { key, displaced })
    }

    /// How many sheddable waiters (the latest keys first) a `class` arrival
    /// of `tokens` must displace to fit; `None` if it may not or cannot.
    fn room_for(&self, class: Class, tokens: u64, limits: LineLimits) -> Option<usize> {
        if class != Class::Critical {
            return None;
        }
        let sheddable = &self.classes[Class::Sheddable.index()];
        let mut skip = vec![0; sheddable.tenants.len()];
        let (mut len, mut sum) = (self.len, self.tokens);
        for n in 0.. {
            if Self::fits(len, sum, tokens, limits) {
                return Some(n);
            }
            let t = sheddable.latest(&skip)?;
            let waiters = &sheddable.tenants[t].waiters;
            skip[t] += 1;
            len -= 1;
            sum -= waiters[waiters.len() - skip[t]].tokens;
        }
        unreachable!("the loop returns")
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

    /// Whether every waiter is woken or held (true for an empty line): no
    /// waiter sleeps that a free worker could take.
    pub(super) fn all_woken(&self) -> bool {
        self.woken + self.held == self.len
    }

    /// Whether some waiter is held ([`Queue::hold`]).
    pub(super) fn any_held(&self) -> bool {
        self.held != 0
    }

    /// A woken waiter found no free worker it may take (for a sheddable
    /// one, none with the headroom; for one with exclusions, only workers
    /// it excludes): it waits again, and is not woken again until the next
    /// publication or report ([`Queue::release`]), so a free worker goes to
    /// whoever else waits instead.
    pub(super) fn hold(&mut self, at: At) {
        self.unwake(at);
        let waiter = self.waiter(at);
        if !waiter.held {
            waiter.held = true;
            self.held += 1;
        }
    }

    /// A publication or a report: held waiters may be woken again.
    pub(super) fn release(&mut self) {
        if self.held == 0 {
            return;
        }
        for class in &mut self.classes {
            for line in &mut class.tenants {
                line.waiters.iter_mut().for_each(|w| w.held = false);
            }
        }
        self.held = 0;
    }

    /// Where the waiter at `key` is.
    pub(super) fn find(&self, key: &Key) -> Option<At> {
        let class = key.class.index();
        let tenant = self.classes[class].tenant(key.tenant)?;
        let waiters = &self.classes[class].tenants[tenant].waiters;
        // The first of its tenant, most often (the earliest is woken first).
        let index = match waiters.front() {
            Some(first) if first.key == *key => 0,
            _ => waiters.binary_search_by_key(key, |w| w.key).ok()?,
        };
        Some(At { class, tenant, index })
    }

    fn tenant_line(&mut self, at: At) -> &mut TenantLine {
        &mut self.classes[at.class].tenants[at.tenant]
    }

    fn waiter(&mut self, at: At) -> &mut Waiter {
        &mut self.tenant_line(at).waiters[at.index]
    }

    /// Whether the waiter at `at` was woken (and so routes now).
    pub(super) fn is_woken(&self, at: At) -> bool {
        self.classes[at.class].tenants[at.tenant].waiters[at.index].woken
    }

    /// Keeps the waker of the waiter's latest poll.
    pub(super) fn set_waker(&mut self, at: At, waker: &Waker) {
        let waiter = self.waiter(at);
        if !waiter.waker.will_wake(waker) {
            waiter.waker = waker.clone();
        }
    }

    /// A woken waiter found no worker after all: it waits for the next
    /// wake-up, and its tenant gets back what the wake-up cost, within a
    /// bound ([`refunded`]).
    pub(super) fn unwake(&mut self, at: At) {
        let waiter = self.waiter(at);
        if waiter.woken {
            waiter.woken = false;
            let cost = waiter.cost();
            self.woken -= 1;
            let line = self.tenant_line(at);
            line.deficit = refunded(line.deficit, cost, line.quantum.saturating_add(line.largest));
        }
    }

    /// Takes the waiter at `at` out of its deque and the line's counts; a
    /// woken one not `served` gives its tenant back what its wake-up cost.
    /// A tenant left without waiters leaves the round (with its deficit).
    /// An empty line forgets the spent workers (with nobody waiting,
    /// dispatches are not throttled), an empty class its overrun.
    fn remove(&mut self, at: At, served: bool) -> Waiter {
        if !served {
            self.unwake(at);
        }
        let class = &mut self.classes[at.class];
        let waiter = class.tenants[at.tenant].waiters.remove(at.index).expect("a waiter at this place");
        class.tenants[at.tenant].tokens -= waiter.tokens;
        if class.tenants[at.tenant].waiters.is_empty() {
            class.tenants.remove(at.tenant);
            if at.tenant < class.turn {
                class.turn -= 1;
            } else if at.tenant == class.turn {
                // The next tenant takes the turn, before its credit.
                class.credited = false;
            }
            if class.turn >= class.tenants.len() {
                class.turn = 0;
            }
        }
        if class.is_empty() {
            class.overrun = false;
        }
        self.len -= 1;
        self.tokens -= waiter.tokens;
        if served {
            self.woken -= 1;
        }
        if waiter.held {
            self.held -= 1;
        }
        if self.len == 0 {
            self.spent.clear_all();
            self.view = None;
        }
        waiter
    }

    /// Takes the waiter at `at` out without a worker (cancelled, past its
    /// deadline, its model gone); returns whether it had been woken (its
    /// tenant gets the wake-up's cost back, if it still waits).
    pub(super) fn leave(&mut self, at: At) -> bool {
        let was_woken = self.is_woken(at);
        self.remove(at, false);
        was_woken
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
        let class = &self.classes[at.class];
        let waiter = &class.tenants[at.tenant].waiters[at.index];
        let behind = class.behind(&waiter.key);
        let served = class.dispatched - waiter.dispatched_before;
        let was_woken = self.leave(at);
        let class = &mut self.classes[at.class];
        if !class.overrun && !class.is_empty() {
            let (arrived, dispatched) = OUTPACED;
            class.overrun = behind * dispatched >= served * arrived;
        }
        was_woken
    }

    /// The waiter at `at` was routed to `worker`: it leaves (its wake-up
    /// stays charged), and `worker` takes no other waiter until it reports.
    pub(super) fn dispatched_to(&mut self, at: At, worker: WorkerId) {
        debug_assert!(self.is_woken(at), "only a woken waiter routes");
        self.remove(at, true);
        let number = self.dispatched;
        self.dispatched += 1;
        self.classes[at.class].dispatched += 1;
        if self.len != 0 {
            self.spent.mark(worker, Some(number));
        }
    }

    /// A report of `worker` another frontend's line is to use: this line
    /// gives it no waiter until its next report. A mark a dispatch set
    /// stays as it is (a report begun before that dispatch may not clear
    /// it).
    pub(super) fn decline(&mut self, worker: WorkerId) {
        if self.len != 0 && !self.spent.contains(worker) {
            self.spent.mark(worker, None);
        }
    }

    /// `worker` reported, and the line had made `seen` dispatches when the
    /// report began: the line may give it a waiter again, unless its last
    /// dispatch came later (a report reflects no dispatch after it). Returns
    /// whether it was spent and is no longer (then [`Queue::freed`]).
    #[inline]
    pub(super) fn reported(&mut self, worker: WorkerId, seen: u64) -> bool {
        self.spent.clear(worker, seen)
    }

    /// After [`Queue::reported`] freed `worker`, `view` the model's now.
    #[inline]
    pub(super) fn freed(&mut self, worker: WorkerId, view: &ModelView) {
        self.spent.freed(worker, view);
    }

    /// With `free` workers the line may give out, wakes waiters not yet
    /// woken until `free` are woken: the highest class first; within a
    /// class its tenants in deficit round robin, and each tenant's earliest
    /// deadline first (the latest while the class is overrun). Their wakers
    /// are called here, under the line's lock: a waker only schedules its
    /// task (which then takes the lock), and calling it by reference clones
    /// nothing.
    pub(super) fn wake(&mut self, free: usize) {
        for class in &mut self.classes {
            while self.woken < free {
                let Some((t, index)) = class.pick() else { break };
                let waiter = &mut class.tenants[t].waiters[index];
                waiter.woken = true;
                self.woken += 1;
                waiter.waker.wake_by_ref();
            }
            if self.woken >= free {
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

/// A tenant's deficit after a wake-up of `cost` is given back: the cost
/// returns, up to `bound` (its quantum and its largest prompt, deficit
/// round robin's bound on a backlogged tenant's deficit), and a refund
/// never takes credit away. The pick that woke the waiter may have
/// credited the tenant a quantum for its turn; a waiter woken and held
/// again and again (its exclusions name the only worker that frees) would
/// otherwise bank a quantum each time, and its tenant would later take
/// that many turns in a row from tenants of equal weight. The order in
/// which woken waiters are refunded does not change the result.
fn refunded(deficit: u64, cost: u64, bound: u64) -> u64 {
    deficit.max(deficit.saturating_add(cost).min(bound))
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
        q.join(STANDARD, Tenant::default(), deadline, tokens, limits, &noop()).unwrap().key
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
        assert!(!q.reported(7, 0), "a report begun before the dispatch keeps its mark");
        assert!(q.reported(7, q.dispatched()));
        assert!(q.spent().is_empty());
        q.wake(1);
        q.dispatched_to(at(&q, late), 7);
        assert!(q.spent().is_empty(), "an empty line throttles nothing");
        assert_eq!((q.len(), q.tokens(), q.dispatched()), (0, 0, 2));
    }

    /// Waiters of one tenant with the same deadline are woken first come,
    /// first served, and one that joins with a deadline between two others
    /// takes its place between them.
    #[test]
    fn equal_deadlines_are_first_come_and_an_arrival_takes_its_deadlines_place() {
        let mut q = Queue::default();
        let now = Instant::now();
        let limits = LineLimits::default();
        let secs = |s| now + Duration::from_secs(s);
        let first = join(&mut q, secs(5), 1, limits);
        let second = join(&mut q, secs(5), 1, limits);
        assert_ne!(first, second);
        q.wake(1);
        assert!(q.is_woken(at(&q, first)) && !q.is_woken(at(&q, second)), "first come");
        q.leave(at(&q, first));
        q.leave(at(&q, second));
        let [one, three, two] = [secs(1), secs(3), secs(2)].map(|deadline| join(&mut q, deadline, 1, limits));
        let woken = |q: &Queue| [one, two, three].map(|k| q.is_woken(at(q, k)));
        q.wake(1);
        assert_eq!(woken(&q), [true, false, false]);
        q.wake(2);
        assert_eq!(woken(&q), [true, true, false], "the deadline between goes between");
    }

    /// A report declined for another frontend's line marks its worker
    /// only while anyone waits here, and never replaces the mark of a
    /// dispatch: a report begun before that dispatch leaves it spent.
    #[test]
    fn a_decline_marks_only_while_anyone_waits_and_keeps_a_dispatchs_mark() {
        let mut q = Queue::default();
        let now = Instant::now();
        let limits = LineLimits::default();
        q.decline(3);
        assert!(q.spent().is_empty(), "nobody waits");
        let first = join(&mut q, now, 1, limits);
        join(&mut q, now, 1, limits);
        q.decline(3);
        assert_eq!(q.spent(), [3]);
        q.wake(1);
        q.dispatched_to(at(&q, first), 7);
        q.decline(7);
        assert!(!q.reported(7, 0), "a report begun before the dispatch keeps its mark");
        assert!(q.reported(7, q.dispatched()));
    }

    #[test]
    fn higher_classes_are_woken_first_whatever_their_deadlines() {
        let mut q = Queue::default();
        let now = Instant::now();
        let limits = LineLimits::default();
        let secs = |s| now + Duration::from_secs(s);
        let mut join_as = |class, s| q.join(class, Tenant::default(), secs(s), 1, limits, &noop()).unwrap().key;
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
        let shed = |q: &mut Queue, s, tokens| {
            q.join(Class::Sheddable, Tenant::default(), secs(s), tokens, limits, &noop()).unwrap().key
        };
        let early = shed(&mut q, 1, 10);
        let late = shed(&mut q, 2, 10);
        let standard = join(&mut q, secs(3), 10, limits);
        assert_eq!(
            q.join(STANDARD, Tenant::default(), secs(4), 1, limits, &noop()),
            Err(WaitError::QueueFull),
            "standard gives way to nobody"
        );
        q.wake(2);
        assert!(q.is_woken(at(&q, early)), "woken before its displacement");
        let joined = q.join(Class::Critical, Tenant::default(), secs(9), 10, limits, &noop()).unwrap();
        assert_eq!(joined.displaced, 1, "the latest sheddable deadline goes");
        assert!(q.find(&late).is_none() && q.take_displaced(&late) && !q.take_displaced(&late), "told once");
        assert_eq!((q.len(), q.tokens()), (3, 30));
        // By tokens: 95 more need both remaining sheddable... only one is
        // left, and the standard one is not displaced: refused, nothing
        // changed.
        assert_eq!(q.join(Class::Critical, Tenant::default(), secs(9), 95, limits, &noop()), Err(WaitError::QueueFull));
        assert_eq!((q.len(), q.tokens()), (3, 30));
        assert!(q.find(&early).is_some() && q.find(&standard).is_some());
        // 71 tokens fit once the (woken) early one leaves.
        let joined = q.join(Class::Critical, Tenant::default(), secs(9), 71, limits, &noop()).unwrap();
        assert_eq!(joined.displaced, 1);
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

    /// While overrun, the latest deadline first among the waiters that
    /// sleep: a woken waiter not yet dispatched, or a held one, is passed
    /// over, and the next latest is woken.
    #[test]
    fn an_overrun_class_passes_over_woken_and_held_waiters() {
        let mut q = Queue::default();
        let now = Instant::now();
        let limits = LineLimits::default();
        let secs = |s| now + Duration::from_secs(s);
        let keys: Vec<Key> = (1..=4).map(|s| join(&mut q, secs(s), 1, limits)).collect();
        assert!(!q.expired(at(&q, keys[0])));
        assert!(q.is_overrun(STANDARD));
        q.wake(1);
        assert!(q.is_woken(at(&q, keys[3])));
        q.wake(2);
        assert!(q.is_woken(at(&q, keys[2])), "the woken latest is passed over");
        q.hold(at(&q, keys[3]));
        q.hold(at(&q, keys[2]));
        q.wake(1);
        assert!(q.is_woken(at(&q, keys[1])), "held waiters are passed over");
        assert!(!q.is_woken(at(&q, keys[2])) && !q.is_woken(at(&q, keys[3])));
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
                q.wake(1);
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

    /// Joins `n` waiters of `tenant` with `tokens` each, deadlines from `s`.
    fn join_of(q: &mut Queue, tenant: Tenant, s: u64, n: u64, tokens: u64) -> Vec<Key> {
        let now = Instant::now();
        (0..n)
            .map(|i| {
                let deadline = now + Duration::from_secs(s + i);
                q.join(STANDARD, tenant, deadline, tokens, LineLimits::default(), &noop()).unwrap().key
            })
            .collect()
    }

    /// Wakes and dispatches one waiter at a time, `n` times; the tenants
    /// served, in order.
    fn serve(q: &mut Queue, n: usize) -> Vec<u32> {
        (0..n)
            .map(|_| {
                q.wake(1);
                let (class, tenant, index) = (0..Class::COUNT)
                    .flat_map(|c| (0..q.classes[c].tenants.len()).map(move |t| (c, t)))
                    .find_map(|(c, t)| q.classes[c].tenants[t].waiters.iter().position(|w| w.woken).map(|i| (c, t, i)))
                    .expect("a woken waiter");
                let id = q.classes[class].tenants[tenant].tenant;
                q.dispatched_to(At { class, tenant, index }, 1);
                assert!(q.reported(1, q.dispatched()) || q.len() == 0);
                id
            })
            .collect()
    }

    #[test]
    fn equal_tenants_alternate_whatever_their_backlogs() {
        let mut q = Queue::default();
        join_of(&mut q, Tenant::new(1, 1), 0, 10, 100);
        join_of(&mut q, Tenant::new(2, 1), 100, 3, 100);
        assert_eq!(serve(&mut q, 8), [1, 2, 1, 2, 1, 2, 1, 1], "the small one every other turn until it empties");
    }

    /// A tenant that leaves the round takes its place in the turn order
    /// with it: the turn's holder leaving passes the turn to the next
    /// tenant, which is served before the others; a tenant before the
    /// holder leaving leaves the turn where it was.
    #[test]
    fn a_tenant_leaving_the_round_keeps_the_turn_order() {
        let mut q = Queue::default();
        join_of(&mut q, Tenant::new(1, 1), 0, 1, 1);
        join_of(&mut q, Tenant::new(2, 1), 0, 2, 1);
        join_of(&mut q, Tenant::new(3, 1), 0, 2, 1);
        assert_eq!(serve(&mut q, 5), [1, 2, 3, 2, 3], "1 leaves with its only waiter: the turn passes to 2");
        let mut q = Queue::default();
        join_of(&mut q, Tenant::new(1, 1), 0, 2, 1);
        let two = join_of(&mut q, Tenant::new(2, 1), 0, 2, 1);
        join_of(&mut q, Tenant::new(3, 1), 0, 2, 1);
        join_of(&mut q, Tenant::new(4, 1), 0, 2, 1);
        assert_eq!(serve(&mut q, 3), [1, 2, 3]);
        assert!(!q.leave(at(&q, two[1])), "2 leaves the round");
        assert_eq!(serve(&mut q, 3), [4, 1, 3], "after 3, as before");
    }

    /// A waiter polled again with another waker is woken through that one.
    #[test]
    fn a_waiter_is_woken_through_its_latest_waker() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        #[derive(Default)]
        struct Woken(AtomicBool);
        impl std::task::Wake for Woken {
            fn wake(self: Arc<Self>) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let (first, latest) = (Arc::new(Woken::default()), Arc::new(Woken::default()));
        let mut q = Queue::default();
        let waker = Waker::from(first.clone());
        let key = q.join(STANDARD, Tenant::default(), Instant::now(), 1, LineLimits::default(), &waker).unwrap().key;
        q.set_waker(at(&q, key), &Waker::from(latest.clone()));
        q.wake(1);
        assert!(latest.0.load(Ordering::SeqCst) && !first.0.load(Ordering::SeqCst));
    }

    #[test]
    fn weights_share_the_turns() {
        let mut q = Queue::default();
        join_of(&mut q, Tenant::new(1, 3), 0, 20, 10);
        join_of(&mut q, Tenant::new(2, 1), 0, 20, 10);
        let served = serve(&mut q, 16);
        assert_eq!(served.iter().filter(|&&t| t == 1).count(), 12, "3 of every 4: {served:?}");
    }

    #[test]
    fn turns_are_charged_in_prompt_tokens() {
        let mut q = Queue::default();
        join_of(&mut q, Tenant::new(1, 1), 0, 10, 1000);
        join_of(&mut q, Tenant::new(2, 1), 0, 40, 100);
        let served = serve(&mut q, 22);
        assert_eq!(served.iter().filter(|&&t| t == 1).count(), 2, "10 small prompts per large one: {served:?}");
    }

    #[test]
    fn a_wake_up_that_finds_no_worker_is_refunded() {
        let mut q = Queue::default();
        let a = join_of(&mut q, Tenant::new(1, 1), 0, 2, 100);
        join_of(&mut q, Tenant::new(2, 1), 0, 2, 100);
        q.wake(1);
        assert!(q.is_woken(at(&q, a[0])));
        q.unwake(at(&q, a[0]));
        q.wake(1);
        assert!(q.is_woken(at(&q, a[0])), "refunded, the same tenant keeps its turn");
        // A woken waiter that leaves refunds too: its tenant's next is next.
        assert!(q.leave(at(&q, a[0])));
        q.wake(1);
        assert!(q.is_woken(at(&q, a[1])));
    }

    /// A waiter woken and held again and again (its exclusions name the
    /// only worker that frees) banks no credit: its tenant's deficit stays
    /// within one quantum beyond its cost, however many rounds.
    #[test]
    fn a_waiter_held_again_and_again_banks_no_credit() {
        let mut q = Queue::default();
        let (held_tenant, other) = (Tenant::new(2, 100), Tenant::new(1, 100));
        let held = join_of(&mut q, held_tenant, 0, 1, 100)[0];
        let deficit = |q: &Queue| {
            let class = &q.classes[STANDARD.index()];
            class.tenants[class.tenant(2).expect("waiting")].deficit
        };
        let mut seen = Vec::new();
        for i in 0..50 {
            let served = join_of(&mut q, other, 1 + i, 1, 100)[0];
            q.wake(1);
            if q.is_woken(at(&q, held)) {
                q.hold(at(&q, held));
                q.wake(1);
            }
            q.dispatched_to(at(&q, served), 1);
            assert!(q.reported(1, q.dispatched()));
            q.release();
            q.wake(1);
            assert!(q.is_woken(at(&q, held)), "round {i}: woken once released");
            q.hold(at(&q, held));
            q.release();
            seen.push(deficit(&q));
        }
        assert!(seen.iter().all(|d| *d <= 200), "at most its weight and its largest prompt: {seen:?}");
        assert_eq!(refunded(u64::MAX - 1, 10, u64::MAX), u64::MAX, "saturates");
        assert_eq!(refunded(0, 1000, 1100), 1000, "a large prompt gets its whole cost back");
        assert_eq!(refunded(5000, 1, 200), 5000, "a refund takes nothing away");
    }

    /// A refund gives a wake-up's cost back and never takes away credit the
    /// tenant held before: its large waiter woken and held (refunded to
    /// 1000), then its small one woken from that credit and refunded too,
    /// leave it its 1000.
    #[test]
    fn a_refund_never_takes_credit_away() {
        let mut q = Queue::default();
        let t = Tenant::new(1, 100);
        let large = join_of(&mut q, t, 0, 1, 1000)[0];
        let small = join_of(&mut q, t, 1, 1, 1)[0];
        let deficit = |q: &Queue| {
            let class = &q.classes[STANDARD.index()];
            class.tenants[class.tenant(1).expect("waiting")].deficit
        };
        q.wake(1);
        assert!(q.is_woken(at(&q, large)));
        q.hold(at(&q, large));
        assert_eq!(deficit(&q), 1000, "the large waiter's charge refunded");
        q.wake(1);
        assert!(q.is_woken(at(&q, small)), "the pass goes on to the next");
        q.unwake(at(&q, small));
        assert_eq!(deficit(&q), 1000);
    }

    /// Two woken waiters of one tenant both find no worker: the order their
    /// tasks run in does not decide who is served next.
    #[test]
    fn the_order_of_refunds_does_not_decide_the_turns() {
        let run = |large_first: bool| {
            let mut q = Queue::default();
            let t = Tenant::new(1, 100);
            let large = join_of(&mut q, t, 0, 1, 1000)[0];
            let small = join_of(&mut q, t, 1, 1, 1)[0];
            q.wake(2);
            assert!(q.is_woken(at(&q, large)) && q.is_woken(at(&q, small)));
            join_of(&mut q, Tenant::new(2, 100), 10, 20, 100);
            let order = if large_first { [large, small] } else { [small, large] };
            order.into_iter().for_each(|key| q.unwake(at(&q, key)));
            serve(&mut q, 12)
        };
        let (large_first, small_first) = (run(true), run(false));
        assert_eq!(large_first, small_first, "large refunded first {large_first:?}, small first {small_first:?}");
    }

    #[test]
    fn a_tenant_at_its_caps_is_refused_and_others_are_not() {
        let mut q = Queue::default();
        let now = Instant::now();
        let limits = LineLimits::default();
        let capped = Tenant { max_waiting: 2, max_tokens: 25, ..Tenant::new(1, 1) };
        let mut join = |tenant, class, tokens| q.join(class, tenant, now, tokens, limits, &noop()).map(|j| j.key);
        join(capped, STANDARD, 10).unwrap();
        assert_eq!(join(capped, Class::Critical, 16), Err(WaitError::TenantCap), "26 tokens, every class counts");
        join(capped, Class::Critical, 15).unwrap();
        assert_eq!(join(capped, Class::Sheddable, 0), Err(WaitError::TenantCap), "3 waiters");
        join(Tenant::new(2, 1), STANDARD, 1000).unwrap();
        assert_eq!((q.len(), q.tokens()), (3, 1025));
    }

    /// A tenant capped by count alone, or by tokens alone, is held to
    /// that one cap.
    #[test]
    fn a_tenant_with_one_cap_is_held_to_it() {
        let mut q = Queue::default();
        let now = Instant::now();
        let limits = LineLimits::default();
        let by_count = Tenant { max_waiting: 1, ..Tenant::new(1, 1) };
        let by_tokens = Tenant { max_tokens: 10, ..Tenant::new(2, 1) };
        let mut join = |tenant, tokens| q.join(STANDARD, tenant, now, tokens, limits, &noop()).map(|j| j.key);
        join(by_count, 1000).unwrap();
        assert_eq!(join(by_count, 0), Err(WaitError::TenantCap), "2 waiters");
        join(by_tokens, 6).unwrap();
        assert_eq!(join(by_tokens, 5), Err(WaitError::TenantCap), "11 tokens");
        join(by_tokens, 4).unwrap();
        assert_eq!((q.len(), q.tokens()), (3, 1010));
    }

    #[test]
    fn a_critical_arrival_displaces_the_latest_sheddable_of_any_tenant() {
        let now = Instant::now();
        let limits = LineLimits { max_waiting: 3, max_tokens: u64::MAX };
        let mut q = Queue::default();
        let mut shed = |tenant, s| {
            let deadline = now + Duration::from_secs(s);
            q.join(Class::Sheddable, Tenant::new(tenant, 1), deadline, 1, limits, &noop()).unwrap().key
        };
        let (a1, b, a2) = (shed(1, 1), shed(2, 3), shed(1, 2));
        let critical = q.join(Class::Critical, Tenant::new(3, 1), now, 1, limits, &noop()).unwrap();
        assert_eq!(critical.displaced, 1);
        assert!(q.take_displaced(&b) && q.find(&a1).is_some() && q.find(&a2).is_some());
    }

    #[test]
    fn a_held_waiter_is_passed_over_until_released() {
        let mut q = Queue::default();
        let now = Instant::now();
        let limits = LineLimits::default();
        let shed = q.join(Class::Sheddable, Tenant::default(), now, 1, limits, &noop()).unwrap().key;
        q.wake(1);
        assert!(q.is_woken(at(&q, shed)));
        q.hold(at(&q, shed));
        assert!(q.any_held() && q.all_woken(), "held: no sleeper a free worker could take");
        q.wake(1);
        assert!(!q.is_woken(at(&q, shed)), "held waiters are passed over");
        let standard = join(&mut q, now, 1, limits);
        assert!(!q.all_woken());
        q.wake(1);
        assert!(q.is_woken(at(&q, standard)), "the free worker goes to the next");
        q.dispatched_to(at(&q, standard), 1);
        q.release();
        assert!(!q.any_held());
        q.wake(1);
        assert!(q.is_woken(at(&q, shed)), "woken again after a release");
        q.hold(at(&q, shed));
        assert!(!q.leave(at(&q, shed)) && !q.any_held() && q.len() == 0, "a held waiter leaves with its mark");
    }

    #[test]
    fn limits_hold_on_both_sides() {
        let mut q = Queue::default();
        let now = Instant::now();
        let limits = LineLimits { max_waiting: 2, max_tokens: 100 };
        join(&mut q, now, 60, limits);
        assert_eq!(
            q.join(STANDARD, Tenant::default(), now, 41, limits, &noop()),
            Err(WaitError::QueueFull),
            "101 tokens"
        );
        let k = join(&mut q, now, 40, limits);
        assert_eq!(
            q.join(STANDARD, Tenant::default(), now, 0, limits, &noop()),
            Err(WaitError::QueueFull),
            "3 waiters"
        );
        assert!(!q.leave(at(&q, k)));
        join(&mut q, now, 40, limits);
        assert_eq!(
            q.join(
                STANDARD,
                Tenant::default(),
                now,
                u64::MAX,
                LineLimits { max_waiting: 9, max_tokens: u64::MAX },
                &noop()
            ),
            Err(WaitError::QueueFull)
        );
    }

    /// One tenant: the shortcut picks what the walk would, with the same
    /// deficit after, for every deficit, cost, weight and turn credit.
    #[test]
    fn a_lone_tenant_is_picked_as_by_the_walk() {
        let now = Instant::now();
        for (tokens, deficit, weight, credited) in lone_tenant_cases() {
            let mut lines = [(); 2].map(|_| {
                let mut q = Queue::default();
                let tenant = Tenant { weight, ..Tenant::default() };
                q.join(STANDARD, tenant, now, tokens, LineLimits::default(), &noop()).unwrap();
                let class = &mut q.classes[STANDARD.index()];
                class.tenants[0].deficit = deficit;
                class.credited = credited;
                q
            });
            let [alone, walk] = &mut lines;
            let (alone, walk) = (&mut alone.classes[STANDARD.index()], &mut walk.classes[STANDARD.index()]);
            assert_eq!(alone.pick_alone(), walk.pick_walk(), "{tokens} {deficit} {weight} {credited}");
            assert_eq!(alone.tenants[0].deficit, walk.tenants[0].deficit, "{tokens} {deficit} {weight} {credited}");
            assert_eq!((alone.turn, alone.credited), (walk.turn, walk.credited));
        }
    }

    fn lone_tenant_cases() -> impl Iterator<Item = (u64, u64, u32, bool)> {
        let sizes = [0, 1, 2, 7, 100, 4096, u64::MAX / 2, u64::MAX];
        let weights = [0, 1, 3, 64, u32::MAX];
        sizes.into_iter().flat_map(move |tokens| {
            sizes.into_iter().flat_map(move |deficit| {
                weights.into_iter().flat_map(move |weight| [false, true].map(|c| (tokens, deficit, weight, c)))
            })
        })
    }
}
