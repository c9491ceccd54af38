//! [`Nonces`]: the request-proof nonces a worker has accepted and whose
//! proofs are still within the window, so that each proof is accepted once.
//!
//! At most `--max-proof-nonces` are remembered. When that many unexpired
//! ones are held, a new proof is refused (fail closed, logged): forgetting
//! one early would let its proof be replayed. An entry is forgotten once its
//! proof's timestamp is out of the window (it could not verify any more).
//! Memory: about 40 bytes per remembered nonce (1,000,000: about 40 MB).

use std::collections::{HashSet, VecDeque};

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
    /// In acceptance order, with when each may be forgotten (ms since the
    /// Unix epoch). Proofs arrive roughly in time order; an entry behind a
    /// later-expiring one is forgotten late, never early.
    expiries: VecDeque<(u64, u128)>,
    max: usize,
}

impl Nonces {
    /// A store of at most `max` (at least 1) nonces.
    pub(crate) fn new(max: usize) -> Self {
        Nonces { seen: HashSet::new(), expiries: VecDeque::new(), max: max.max(1) }
    }

    /// Accepts `nonce`, remembered until `forget_at` (ms since the Unix
    /// epoch: its proof's timestamp plus the window), at `now_ms`.
    ///
    /// # Errors
    ///
    /// A replay, or a full store ([`NonceRefusal`]).
    pub(crate) fn accept(&mut self, nonce: u128, forget_at: u64, now_ms: u64) -> Result<(), NonceRefusal> {
        while self.expiries.front().is_some_and(|&(at, _)| at < now_ms) {
            if let Some((_, old)) = self.expiries.pop_front() {
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
        self.expiries.push_back((forget_at, nonce));
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

    #[test]
    fn a_nonce_is_accepted_once_while_its_proof_can_verify() {
        let mut nonces = Nonces::new(10);
        assert_eq!(nonces.accept(7, 1_000, 0), Ok(()));
        assert_eq!(nonces.accept(7, 1_000, 500), Err(NonceRefusal::Replayed));
        assert_eq!(nonces.accept(7, 1_000, 1_000), Err(NonceRefusal::Replayed), "still within the window");
        // Past its proof's window it is forgotten (that proof cannot verify any more).
        assert_eq!(nonces.accept(8, 2_000, 1_001), Ok(()));
        assert_eq!(nonces.len(), 1);
    }

    #[test]
    fn a_full_store_refuses_and_never_evicts() {
        let mut nonces = Nonces::new(3);
        for nonce in 0..3 {
            assert_eq!(nonces.accept(nonce, 1_000, 0), Ok(()));
        }
        assert_eq!(nonces.accept(3, 1_000, 10), Err(NonceRefusal::Full));
        // Every remembered nonce is still refused as a replay.
        for nonce in 0..3 {
            assert_eq!(nonces.accept(nonce, 1_000, 10), Err(NonceRefusal::Replayed));
        }
        // Once they expire, there is room again.
        assert_eq!(nonces.accept(3, 2_000, 1_001), Ok(()));
        assert_eq!(nonces.len(), 1);
    }

    #[test]
    fn an_entry_behind_a_later_one_is_kept_until_reached() {
        let mut nonces = Nonces::new(10);
        assert_eq!(nonces.accept(1, 5_000, 0), Ok(()));
        assert_eq!(nonces.accept(2, 1_000, 0), Ok(()));
        // 2's window is over, but it sits behind 1: remembered longer, never shorter.
        assert_eq!(nonces.accept(2, 1_000, 2_000), Err(NonceRefusal::Replayed));
        assert_eq!(nonces.accept(3, 9_000, 6_000), Ok(()));
        assert_eq!(nonces.len(), 1);
    }
}
