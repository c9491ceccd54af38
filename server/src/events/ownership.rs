//! [`Ownership`]: which event connection holds each worker id. A worker's
//! Load, Deregister and address come only from the connection that holds
//! it; a Register for an id held by a live connection is refused. When the
//! holder closes, the id is orphaned for the deregistration grace: it may
//! register again from a new connection (same incarnation = reconnect,
//! another = restart) and is deregistered when the grace passes otherwise.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use loadgate::WorkerId;
use mio::Token;

/// The event-registered worker ids, by holder.
#[derive(Debug, Default)]
pub(super) struct Ownership {
    workers: HashMap<WorkerId, Presence>,
    /// Orphans in deadline order (the grace is constant, so pushing at the
    /// back keeps it sorted); an entry is stale when the worker was claimed
    /// again or orphaned later.
    orphans: VecDeque<(Instant, WorkerId)>,
}

#[derive(Debug)]
struct Presence {
    incarnation: u64,
    /// The live connection that holds it; `None` while orphaned.
    holder: Option<Token>,
    /// When the orphan is deregistered unless claimed again.
    deadline: Option<Instant>,
}

/// A claim refused: the id is held by another live connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Held;

impl Ownership {
    /// Whether a claim of `worker` by `token` would be granted.
    pub(super) fn may_claim(&self, worker: WorkerId, token: Token) -> Result<(), Held> {
        match self.holder(worker) {
            Some(holder) if holder != token => Err(Held),
            _ => Ok(()),
        }
    }

    /// The live connection that holds `worker`, if any.
    pub(super) fn holder(&self, worker: WorkerId) -> Option<Token> {
        self.workers.get(&worker).and_then(|p| p.holder)
    }

    /// The incarnation this plane registered `worker` in (held, or
    /// orphaned within its grace), if any.
    pub(super) fn incarnation(&self, worker: WorkerId) -> Option<u64> {
        self.workers.get(&worker).map(|p| p.incarnation)
    }

    /// `token` now holds `worker` in `incarnation`.
    ///
    /// # Errors
    ///
    /// [`Held`] when another live connection holds it (nothing changes).
    pub(super) fn claim(&mut self, worker: WorkerId, incarnation: u64, token: Token) -> Result<(), Held> {
        self.may_claim(worker, token)?;
        self.workers.insert(worker, Presence { incarnation, holder: Some(token), deadline: None });
        Ok(())
    }

    /// The holder of `worker` closed at `now`: orphaned until `deadline`.
    /// Does nothing unless `token` holds it.
    pub(super) fn release(&mut self, worker: WorkerId, token: Token, deadline: Instant) {
        if let Some(p) = self.workers.get_mut(&worker).filter(|p| p.holder == Some(token)) {
            p.holder = None;
            p.deadline = Some(deadline);
            self.orphans.push_back((deadline, worker));
        }
    }

    /// Forgets `worker` (it deregistered).
    pub(super) fn forget(&mut self, worker: WorkerId) {
        self.workers.remove(&worker);
    }

    /// The earliest orphan deadline, if any.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.orphans.front().map(|(at, _)| *at)
    }

    /// Removes and returns the orphans whose deadline passed by `now`, with
    /// the incarnation they had.
    pub(super) fn expire(&mut self, now: Instant) -> Vec<(WorkerId, u64)> {
        let mut due = Vec::new();
        while let Some(&(at, worker)) = self.orphans.front().filter(|(at, _)| *at <= now) {
            self.orphans.pop_front();
            let still_orphaned =
                self.workers.get(&worker).is_some_and(|p| p.holder.is_none() && p.deadline == Some(at));
            if still_orphaned {
                if let Some(p) = self.workers.remove(&worker) {
                    due.push((worker, p.incarnation));
                }
            }
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_live_holder_keeps_its_id_and_an_orphan_expires_unless_claimed() {
        let (a, b) = (Token(2), Token(3));
        let mut o = Ownership::default();
        assert_eq!(o.claim(7, 1, a), Ok(()));
        assert_eq!(o.claim(7, 1, a), Ok(()), "the holder may register again");
        assert_eq!(o.claim(7, 2, b), Err(Held));
        o.release(7, b, Instant::now()); // not the holder: ignored
        assert_eq!(o.claim(7, 2, b), Err(Held));
        let t0 = Instant::now();
        o.release(7, a, t0 + Duration::from_millis(10));
        assert_eq!(o.next_deadline(), Some(t0 + Duration::from_millis(10)));
        assert_eq!(o.expire(t0), vec![]);
        // Claimed again during the grace (a restart): the old deadline is stale.
        assert_eq!(o.claim(7, 2, b), Ok(()));
        assert_eq!(o.expire(t0 + Duration::from_secs(1)), vec![]);
        // Orphaned again, then gone for good.
        o.release(7, b, t0 + Duration::from_millis(20));
        assert_eq!(o.expire(t0 + Duration::from_millis(20)), vec![(7, 2)]);
        assert_eq!(o.next_deadline(), None);
        assert_eq!(o.claim(7, 3, a), Ok(()));
        o.forget(7);
        assert_eq!(o.claim(7, 4, b), Ok(()));
    }
}
