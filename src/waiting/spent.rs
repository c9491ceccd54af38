//! [`Spent`]: the workers a line dispatched to since their last report
//! (each takes no other waiter until it reports again), and, in a large
//! fleet, the line's own set of the model's free workers.
//!
//! # Constant cost in a large fleet
//!
//! Under overload almost every free worker is spent: a worker that frees
//! takes a waiter at once and stays spent until its next report, so in a
//! fleet of thousands the spent workers number about the dispatch rate
//! times a report interval. Routing among "eligible, less the spent ones"
//! costs that count at every wake-up pass and every dispatch.
//!
//! So from [`LARGE`] spent workers on, the line keeps an index of them and
//! the set the waiters route among itself: the workers eligible in the
//! view and not spent, which under overload holds almost nobody. It is
//! kept up to date by every change, each re-checked against the view
//! current then (so the order the changes arrive in does not matter):
//!
//! - a dispatch takes its worker out ([`Spent::mark`]);
//! - a report that clears a worker's mark puts it back if the view shows
//!   it eligible ([`Spent::clear`]);
//! - a publication re-checks the workers it changed; one that changed the
//!   members or the filtering drops the set, rebuilt from the view at its
//!   next use ([`Spent::published`]).
//!
//! A router reading the set still checks each member against the view it
//! routes with: a worker turned busy by a publication whose pass has not
//! run yet is passed over, as the view shows.

use rustc_hash::FxHashMap;

use crate::load::WorkerId;
use crate::monitor::view::ModelView;

/// From this many spent workers the line keeps the index and the free set
/// (few enough in the fuzz and loom models that they check it).
const LARGE: usize = if cfg!(any(fuzzing, loom)) { 2 } else { 16 };

#[cfg(test)]
std::thread_local! {
    /// Tests: from how many marks the lines made on this thread keep the
    /// free set (`usize::MAX`: never).
    pub(super) static LARGE_FROM: std::cell::Cell<usize> = const { std::cell::Cell::new(LARGE) };
    /// Tests: how often a line of this thread began to keep the free set.
    pub(super) static LARGE_ENTERED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// From how many marks the line keeps the free set; back to the plain list
/// at half as many.
fn large_from() -> usize {
    #[cfg(test)]
    return LARGE_FROM.with(std::cell::Cell::get);
    #[cfg(not(test))]
    LARGE
}

/// What a publication changed, for the line's free set.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Changed<'a> {
    /// These workers' busy or out-of-routing bits.
    Workers(&'a [WorkerId]),
    /// The members, or the filtering: anything.
    All,
}

/// The spent workers: the line's marks.
#[derive(Default)]
pub(super) struct Spent {
    ids: Vec<WorkerId>,
    /// For each of `ids`, the number of the line's last dispatch to it (the
    /// line's dispatches before it): a report clears only a mark older than
    /// the report. `None`: declined (another frontend's report; any later
    /// report clears it).
    since: Vec<Option<u64>>,
    /// With at least [`LARGE`] marks.
    large: Option<Box<Large>>,
}

/// A large fleet's marks: their index, and the line's free set.
struct Large {
    /// Where each spent worker is in `ids`.
    index: FxHashMap<WorkerId, usize>,
    /// The workers eligible in the view and not spent, ascending (a member
    /// may lag a publication whose pass has not run); `None` until a route
    /// or a count needs it.
    free: Option<Vec<WorkerId>>,
}

impl Spent {
    /// The spent workers.
    #[inline]
    pub(super) fn ids(&self) -> &[WorkerId] {
        &self.ids
    }

    /// Whether the free set is kept ([`LARGE`] marks or more, until half
    /// as many).
    #[inline]
    pub(super) fn is_large(&self) -> bool {
        self.large.is_some()
    }

    /// Whether `worker` is spent.
    #[inline]
    pub(super) fn contains(&self, worker: WorkerId) -> bool {
        self.position(worker).is_some()
    }

    #[inline]
    fn position(&self, worker: WorkerId) -> Option<usize> {
        match &self.large {
            Some(large) => large.index.get(&worker).copied(),
            None => self.ids.iter().position(|w| *w == worker),
        }
    }

    /// The spent workers as bits (`1 << (id % 64)`), for a lock-free first
    /// look by reporters: every bit in a large fleet.
    #[inline]
    pub(super) fn bits(&self) -> u64 {
        match self.large {
            Some(_) => u64::MAX,
            None => self.ids.iter().fold(0, |bits, w| bits | spent_bit(*w)),
        }
    }

    /// Marks `worker` spent since `since`.
    #[inline]
    pub(super) fn mark(&mut self, worker: WorkerId, since: Option<u64>) {
        if let Some(i) = self.position(worker) {
            self.since[i] = since;
            return;
        }
        self.ids.push(worker);
        self.since.push(since);
        match &mut self.large {
            Some(large) => {
                large.index.insert(worker, self.ids.len() - 1);
                if let Some(free) = &mut large.free {
                    if let Ok(i) = free.binary_search(&worker) {
                        free.remove(i);
                    }
                }
            }
            None if self.ids.len() >= large_from() => {
                #[cfg(test)]
                LARGE_ENTERED.with(|entered| entered.set(entered.get() + 1));
                let index = self.ids.iter().enumerate().map(|(i, w)| (*w, i)).collect();
                self.large = Some(Box::new(Large { index, free: None }));
            }
            None => {}
        }
    }

    /// `worker` reported, the line having made `seen` dispatches when the
    /// report began: its mark goes unless it is newer (a report reflects
    /// no dispatch after it). Returns whether it was spent and is no longer
    /// (then [`Spent::freed`]).
    #[inline]
    pub(super) fn clear(&mut self, worker: WorkerId, seen: u64) -> bool {
        let Some(i) = self.position(worker) else { return false };
        if self.since[i].is_some_and(|number| number >= seen) {
            return false;
        }
        self.ids.swap_remove(i);
        self.since.swap_remove(i);
        if let Some(large) = &mut self.large {
            large.index.remove(&worker);
            if let Some(&moved) = self.ids.get(i) {
                large.index.insert(moved, i);
            }
            if self.ids.len() <= large_from() / 2 {
                self.large = None;
            }
        }
        true
    }

    /// After [`Spent::clear`] cleared `worker`'s mark: the free set takes
    /// it back if `view` shows it eligible.
    #[inline]
    pub(super) fn freed(&mut self, worker: WorkerId, view: &ModelView) {
        if let Some(free) = self.large.as_mut().and_then(|large| large.free.as_mut()) {
            refresh(free, view, worker);
        }
    }

    /// Forgets every mark (the line emptied).
    pub(super) fn clear_all(&mut self) {
        self.ids.clear();
        self.since.clear();
        self.large = None;
    }

    /// After a publication of `view` that changed `changed`: the free set
    /// follows it, and a change of the members drops the marks of workers
    /// no longer among them (deregistered: no report will clear them, and
    /// a new life of the id starts unspent). Returns whether marks went.
    pub(super) fn published(&mut self, view: &ModelView, changed: Changed<'_>) -> bool {
        let forgot = matches!(changed, Changed::All) && self.forget_gone(view);
        self.follow(view, changed);
        forgot
    }

    /// Drops the marks of workers `view` does not have; whether any went.
    fn forget_gone(&mut self, view: &ModelView) -> bool {
        if self.ids.iter().all(|&worker| view.find(worker).is_some()) {
            return false;
        }
        let kept: Vec<(WorkerId, Option<u64>)> = self
            .ids
            .iter()
            .zip(&self.since)
            .filter(|(worker, _)| view.find(**worker).is_some())
            .map(|(worker, since)| (*worker, *since))
            .collect();
        (self.ids, self.since) = kept.into_iter().unzip();
        if let Some(large) = &mut self.large {
            large.index = self.ids.iter().enumerate().map(|(i, w)| (*w, i)).collect();
            if self.ids.len() <= large_from() / 2 {
                self.large = None;
            }
        }
        true
    }

    /// The free set after a publication that changed `changed`.
    fn follow(&mut self, view: &ModelView, changed: Changed<'_>) {
        let Some(large) = &mut self.large else { return };
        let Some(free) = &mut large.free else { return };
        match changed {
            Changed::Workers(workers) => {
                for &worker in workers.iter().filter(|w| !large.index.contains_key(w)) {
                    refresh(free, view, worker);
                }
            }
            Changed::All => large.free = None,
        }
    }

    /// In a large fleet, the workers eligible in `view` (or lately so) and
    /// not spent, ascending; `None` with few marks (route with
    /// [`Spent::ids`] left out).
    #[inline]
    pub(super) fn free(&mut self, view: &ModelView) -> Option<&[WorkerId]> {
        let large = self.large.as_mut()?;
        let free = large.free.get_or_insert_with(|| {
            let mut free = Vec::new();
            view.for_each_from(0, |_, place, chunk| {
                let id = chunk.id(place.local);
                if chunk.is_eligible(place.local) && !large.index.contains_key(&id) {
                    free.push(id);
                }
            });
            free
        });
        Some(free)
    }
}

/// Puts `worker` (not spent) in `free` if `view` shows it eligible, takes
/// it out otherwise.
fn refresh(free: &mut Vec<WorkerId>, view: &ModelView, worker: WorkerId) {
    let eligible = view.find_eligible(worker).is_some();
    match (free.binary_search(&worker), eligible) {
        (Err(i), true) => free.insert(i, worker),
        (Ok(i), false) => {
            free.remove(i);
        }
        _ => {}
    }
}

/// A worker's bit in [`Spent::bits`].
#[inline]
pub(super) fn spent_bit(worker: WorkerId) -> u64 {
    1 << (worker % 64)
}
