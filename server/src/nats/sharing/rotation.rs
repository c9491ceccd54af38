//! [`Rotation`]: which of this frontend's published loads to send again,
//! so that a publication NATS lost (it delivers at most once) is mended
//! within a bounded number of beats without sending every load every beat.
//! Every (worker, rank) ever published stays in it, zero or not, until the
//! worker leaves: a lost fall to zero is mended like any other loss (the
//! others renew what they last heard while this frontend lives). When this
//! frontend forgets the worker and its last publication was not a zero, the
//! others may keep the worker longer and count that figure: a zero goes out
//! then, and the key stays as a zero for [`FORGOTTEN_RESENDS`] more visits
//! of the walk (a republication to a newcomer too), so that a lost zero is
//! mended like any other loss; then it is dropped.

use std::collections::BTreeMap;
use std::ops::Bound;

use loadgate::WorkerId;

/// A published load: a worker's rank.
pub(crate) type Key = (WorkerId, u32);

/// How many times a forgotten key's zero is sent again after the first
/// (each at a visit of the walk, so at least a beat apart).
pub(crate) const FORGOTTEN_RESENDS: u8 = 8;

/// What was last published for a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Last {
    /// A load that is not zero.
    Load,
    /// A zero.
    Zero,
    /// A zero for a worker this frontend forgot (of that worker
    /// incarnation), to be sent `resends` more times.
    Forgotten { worker_incarnation: u64, resends: u8 },
}

/// Every load ever published (until its worker leaves, and a while after),
/// walked a slice per beat; bounded by the fleet's worker ranks and those
/// that left within the last [`FORGOTTEN_RESENDS`] visits.
#[derive(Debug, Default)]
pub(crate) struct Rotation {
    published: BTreeMap<Key, Last>,
    /// Where the walk goes on from.
    cursor: Option<Key>,
}

impl Rotation {
    /// `key`'s load is about to be published on a change, zero or not:
    /// whether to send it. Anything but a zero never published (or a zero
    /// after a zero: nothing changed for the others) is sent and kept.
    pub(crate) fn publish(&mut self, key: Key, zero: bool) -> bool {
        let now = if zero { Last::Zero } else { Last::Load };
        match self.published.get_mut(&key) {
            Some(last) => {
                let before = std::mem::replace(last, now);
                // A zero after a zero (or a forgotten key's zero): nothing
                // changed for the others.
                !zero || before == Last::Load
            }
            None if zero => false,
            None => {
                self.published.insert(key, now);
                true
            }
        }
    }

    /// `key`'s worker is forgotten by this frontend (of
    /// `worker_incarnation`, if a load of it was published): the worker
    /// incarnation to send a zero for, if one is to be sent. The first
    /// call after a load that was not zero sends one, and so do the next
    /// [`FORGOTTEN_RESENDS`] (the walk's visits); then the key is dropped.
    pub(crate) fn forget(&mut self, key: Key, worker_incarnation: Option<u64>) -> Option<u64> {
        let last = self.published.get(&key).copied();
        let (send, keep) = match (last, worker_incarnation) {
            (Some(Last::Load), Some(worker_incarnation)) => {
                (Some(worker_incarnation), Some(Last::Forgotten { worker_incarnation, resends: FORGOTTEN_RESENDS }))
            }
            (Some(Last::Forgotten { worker_incarnation, resends }), _) => {
                let left = resends.saturating_sub(1);
                (Some(worker_incarnation), (left > 0).then_some(Last::Forgotten { worker_incarnation, resends: left }))
            }
            _ => (None, None),
        };
        match keep {
            Some(last) => self.published.insert(key, last),
            None => self.published.remove(&key),
        };
        send
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
        assert_eq!(rotation.forget((1, 0), Some(5)), None, "its last publication was zero");
        assert!(rotation.all().is_empty() && rotation.next(8).is_empty(), "its worker left");
    }

    #[test]
    fn a_forgotten_load_is_taken_back_by_a_zero_sent_again_a_bounded_number_of_times() {
        let mut rotation = Rotation::default();
        rotation.publish((2, 0), false);
        rotation.publish((3, 0), false);
        assert_eq!(rotation.forget((2, 0), Some(7)), Some(7), "its last publication still counts at the others");
        // The walk visits it (and the live key) each beat: the zero goes
        // out again at each visit, FORGOTTEN_RESENDS times, under the
        // incarnation first given.
        let mut resent = 0;
        for _ in 0..20 {
            let visited = rotation.next(8);
            assert!(visited.contains(&(3, 0)), "the live key keeps its turn");
            if visited.contains(&(2, 0)) {
                assert_eq!(rotation.forget((2, 0), None), Some(7));
                resent += 1;
            }
        }
        assert_eq!(resent, usize::from(FORGOTTEN_RESENDS));
        assert_eq!(rotation.all(), [(3, 0)], "then dropped");
        assert_eq!(rotation.forget((2, 0), None), None);
        // Without a published load's incarnation there is nothing to
        // take back under.
        assert_eq!(rotation.forget((3, 0), None), None);
        assert!(rotation.all().is_empty());
    }

    #[test]
    fn a_forgotten_worker_that_comes_back_is_published_as_new() {
        let mut rotation = Rotation::default();
        rotation.publish((4, 0), false);
        assert_eq!(rotation.forget((4, 0), Some(1)), Some(1));
        assert!(!rotation.publish((4, 0), true), "a zero after the forgotten zero: nothing new");
        assert_eq!(rotation.forget((4, 0), Some(2)), None, "a zero was the last publication");
        rotation.publish((4, 0), false);
        assert_eq!(rotation.forget((4, 0), Some(3)), Some(3));
        assert!(rotation.publish((4, 0), false), "a load after the forgotten zero is sent");
        assert_eq!(rotation.forget((4, 0), Some(4)), Some(4), "and taken back under its own incarnation");
    }
}
