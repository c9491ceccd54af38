//! [`Rotation`]: which of this frontend's published loads to send again,
//! so that a publication NATS lost (it delivers at most once) is mended
//! within a bounded number of beats without sending every load every beat.
//! Every (worker, rank) ever published stays in it, zero or not, until the
//! worker leaves: a lost fall to zero is mended like any other loss (the
//! others renew what they last heard while this frontend lives). When this
//! frontend forgets the worker, a last zero goes out if its last
//! publication was not one: the others may keep the worker longer.

use std::collections::BTreeMap;
use std::ops::Bound;

use loadgate::WorkerId;

/// A published load: a worker's rank.
pub(crate) type Key = (WorkerId, u32);

/// Every load ever published (until its worker leaves), walked a slice
/// per beat; bounded by the fleet's worker ranks.
#[derive(Debug, Default)]
pub(crate) struct Rotation {
    /// `true`: last published zero.
    published: BTreeMap<Key, bool>,
    /// Where the walk goes on from.
    cursor: Option<Key>,
}

impl Rotation {
    /// `key`'s load is about to be published on a change, zero or not:
    /// whether to send it. Anything but a zero never published (or a zero
    /// after a zero: nothing changed for the others) is sent and kept.
    pub(crate) fn publish(&mut self, key: Key, zero: bool) -> bool {
        match self.published.get_mut(&key) {
            Some(was_zero) => {
                let before = std::mem::replace(was_zero, zero);
                !(zero && before)
            }
            None if zero => false,
            None => {
                self.published.insert(key, false);
                true
            }
        }
    }

    /// `key` is gone (its worker left): nothing to send again. Returns
    /// whether its last publication was not zero (the others may still
    /// count it).
    pub(crate) fn forget(&mut self, key: Key) -> bool {
        self.published.remove(&key) == Some(false)
    }

    /// Every key held.
    pub(crate) fn all(&self) -> Vec<Key> {
        self.published.keys().copied().collect()
    }

    /// The next `n` keys from the cursor on, wrapping around at most once
    /// (so at most every key, each once).
    pub(crate) fn next(&mut self, n: usize) -> Vec<Key> {
        let after = self.cursor.map_or(Bound::Unbounded, Bound::Excluded);
        let mut next: Vec<Key> = self.published.range((after, Bound::Unbounded)).map(|(k, _)| *k).take(n).collect();
        if next.len() < n {
            let wrapped = self.published.keys().copied().take_while(|k| Some(*k) <= self.cursor);
            next.extend(wrapped.take(n - next.len()));
        }
        self.cursor = next.last().copied();
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_load_comes_round_within_its_share_of_beats() {
        let mut rotation = Rotation::default();
        for worker in 0..10 {
            assert!(rotation.publish((worker, 0), false));
        }
        // 4 a beat: all 10 within 3 beats, in order, then round again.
        let beats: Vec<Vec<Key>> = (0..4).map(|_| rotation.next(4)).collect();
        let ids = |beat: &Vec<Key>| beat.iter().map(|k| k.0).collect::<Vec<_>>();
        assert_eq!(ids(&beats[0]), [0, 1, 2, 3]);
        assert_eq!(ids(&beats[1]), [4, 5, 6, 7]);
        assert_eq!(ids(&beats[2]), [8, 9, 0, 1], "wraps around");
        assert_eq!(ids(&beats[3]), [2, 3, 4, 5]);
        // Fewer keys than a beat's share: each once.
        let mut small = Rotation::default();
        small.publish((1, 0), false);
        small.publish((2, 1), false);
        assert_eq!(small.next(256), [(1, 0), (2, 1)]);
        assert_eq!(small.next(256), [(1, 0), (2, 1)]);
        assert!(Rotation::default().next(256).is_empty());
    }

    #[test]
    fn a_load_that_falls_to_zero_stays_in_the_rotation_until_its_worker_leaves() {
        let mut rotation = Rotation::default();
        assert!(!rotation.publish((1, 0), true), "zero and never published: nothing to say");
        assert!(rotation.next(8).is_empty());
        assert!(rotation.publish((1, 0), false));
        assert!(rotation.publish((1, 0), true), "the fall to zero");
        assert!(!rotation.publish((1, 0), true), "zero again: nothing changed");
        assert!(rotation.publish((1, 0), false), "up again");
        assert!(rotation.publish((1, 0), true), "and down again: sent");
        assert_eq!(rotation.next(8), [(1, 0)], "still sent by the rotation (a lost zero is mended)");
        assert_eq!(rotation.next(8), [(1, 0)]);
        assert!(!rotation.forget((1, 0)), "its last publication was zero");
        assert!(rotation.all().is_empty() && rotation.next(8).is_empty(), "its worker left");
        rotation.publish((2, 0), false);
        assert!(rotation.forget((2, 0)), "its last publication still counts at the others");
        assert!(!rotation.forget((2, 0)), "forgotten");
    }
}
