//! [`Nonces`]: the request-proof nonces a worker has accepted and whose
//! proofs are still within the window, so that each proof is accepted once.
//!
//! At most `--max-proof-nonces` are remembered. When that many unexpired
//! ones are held, a new proof is refused (fail closed, logged): forgetting
//! one early would let its proof be replayed. An entry is forgotten once its
//! proof's timestamp is out of the window (it could not verify any more),
//! by the wall clock the proofs are checked against and by the monotonic
//! clock both: a wall clock that steps forward past the window (and back)
//! does not forget nonces whose proofs may verify again.
//! Memory: about 60 bytes per remembered nonce (1,000,000: about 60 MB).

use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};

/// Why a nonce was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NonceRefusal {
    /// Accepted before, and its proof is still within the window: a replay.
    Replayed,
    /// The store is full of unexpired nonces.
    Full,
}

/// The accepted nonces still within the window.
#[derive(Debug)]
pub(crate) struct Nonces {
    seen: HashSet<u128>,
    /// In acceptance order, with when each may be forgotten: by the wall
    /// clock (ms since the Unix epoch) and by the monotonic one. Proofs
    /// arrive roughly in time order; an entry behind a later-expiring one
    /// is forgotten late, never early.
    expiries: VecDeque<(u64, Instant, u128)>,
    max: usize,
}

impl Nonces {
    /// A store of at most `max` (at least 1) nonces.
    pub(crate) fn new(max: usize) -> Self {
        Nonces { seen: HashSet::new(), expiries: VecDeque::new(), max: max.max(1) }
    }

    /// Accepts `nonce`, remembered until `forget_at` (ms since the Unix
    /// epoch: its proof's timestamp plus the window), at `now_ms` and
    /// `now` (the same moment on the monotonic clock): until both clocks
    /// have passed it.
    ///
    /// # Errors
    ///
    /// A replay, or a full store ([`NonceRefusal`]).
    pub(crate) fn accept(
        &mut self,
        nonce: u128,
        forget_at: u64,
        now_ms: u64,
        now: Instant,
    ) -> Result<(), NonceRefusal> {
        while self.expiries.front().is_some_and(|&(at, by, _)| at < now_ms && by < now) {
            if let Some((_, _, old)) = self.expiries.pop_front() {
                self.seen.remove(&old);
            }
        }
        if self.seen.contains(&nonce) {
            return Err(NonceRefusal::Replayed);
        }
        if self.seen.len() >= self.max {
            return Err(NonceRefusal::Full);
        }
        self.seen.insert(nonce);
        let by = now + Duration::from_millis(forget_at.saturating_sub(now_ms).min(crate::flag_limits::MAX_MS));
        self.expiries.push_back((forget_at, by, nonce));
        Ok(())
    }

    /// Nonces remembered now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.seen.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The monotonic clock `ms` after the wall clock's 0 (as the wall clock
    /// goes, unless a test steps it).
    fn at(ms: u64) -> Instant {
        use std::sync::OnceLock;
        static START: OnceLock<Instant> = OnceLock::new();
        *START.get_or_init(Instant::now) + Duration::from_millis(ms)
    }

    #[test]
    fn a_nonce_is_accepted_once_while_its_proof_can_verify() {
        let mut nonces = Nonces::new(10);
        assert_eq!(nonces.accept(7, 1_000, 0, at(0)), Ok(()));
        assert_eq!(nonces.accept(7, 1_000, 500, at(500)), Err(NonceRefusal::Replayed));
        assert_eq!(nonces.accept(7, 1_000, 1_000, at(1_000)), Err(NonceRefusal::Replayed), "still within the window");
        // Past its proof's window it is forgotten (that proof cannot verify any more).
        assert_eq!(nonces.accept(8, 2_000, 1_001, at(1_001)), Ok(()));
        assert_eq!(nonces.len(), 1);
    }

    #[test]
    fn a_full_store_refuses_and_never_evicts() {
        let mut nonces = Nonces::new(3);
        for nonce in 0..3 {
            assert_eq!(nonces.accept(nonce, 1_000, 0, at(0)), Ok(()));
        }
        assert_eq!(nonces.accept(3, 1_000, 10, at(10)), Err(NonceRefusal::Full));
        // Every remembered nonce is still refused as a replay.
        for nonce in 0..3 {
            assert_eq!(nonces.accept(nonce, 1_000, 10, at(10)), Err(NonceRefusal::Replayed));
        }
        // Once they expire, there is room again.
        assert_eq!(nonces.accept(3, 2_000, 1_001, at(1_001)), Ok(()));
        assert_eq!(nonces.len(), 1);
    }

    #[test]
    fn an_entry_behind_a_later_one_is_kept_until_reached() {
        let mut nonces = Nonces::new(10);
        assert_eq!(nonces.accept(1, 5_000, 0, at(0)), Ok(()));
        assert_eq!(nonces.accept(2, 1_000, 0, at(0)), Ok(()));
        // 2's window is over, but it sits behind 1: remembered longer, never shorter.
        assert_eq!(nonces.accept(2, 1_000, 2_000, at(2_000)), Err(NonceRefusal::Replayed));
        assert_eq!(nonces.accept(3, 9_000, 6_000, at(6_000)), Ok(()));
        assert_eq!(nonces.len(), 1);
    }

    /// A wall clock stepped forward past the window (an NTP step) forgets
    /// no nonce early: the monotonic clock has not passed it; a step back
    /// keeps it by the wall clock.
    #[test]
    fn a_step_of_the_wall_clock_forgets_no_nonce_early() {
        let mut nonces = Nonces::new(10);
        assert_eq!(nonces.accept(7, 1_000, 0, at(0)), Ok(()));
        assert_eq!(nonces.accept(8, 61_000, 60_000, at(10)), Ok(()), "the wall clock 60 s ahead, 10 ms later");
        assert_eq!(nonces.accept(7, 1_000, 500, at(20)), Err(NonceRefusal::Replayed), "and back: still held");
        assert_eq!(nonces.accept(9, 2_000, 1_001, at(1_001)), Ok(()), "both clocks past it: forgotten");
        assert_eq!(nonces.len(), 2);
        // Stepped back: held by the wall clock past the monotonic expiry.
        let mut nonces = Nonces::new(10);
        assert_eq!(nonces.accept(7, 1_000, 0, at(0)), Ok(()));
        assert_eq!(nonces.accept(7, 1_000, 200, at(5_000)), Err(NonceRefusal::Replayed), "the wall clock 4.8 s behind");
    }
}
