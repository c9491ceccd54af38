//! The overflow's storage: a FIFO of waiting entries, guarded by the gate's
//! handoff lock, with tombstones for cancelled futures.

use std::collections::VecDeque;

use super::waiter::Waiter;
use crate::sync::Arc;

/// One waiting request.
pub(super) enum Entry<T> {
    /// An item for the gate's dispatch callback.
    Item(T),
    /// A queued [`Admit`](super::Admit) future.
    Waiter(Arc<Waiter<T>>),
}

/// The waiting entries, oldest first. Only touched under the handoff lock.
pub(super) struct Waiting<T> {
    entries: VecDeque<Entry<T>>,
    /// Entries of `entries` whose futures were dropped.
    tombstones: usize,
}

impl<T> Waiting<T> {
    /// Room for `queue_limit` entries, allocated now. With tombstones it can
    /// grow once, to fewer than `2 * queue_limit` (each push first sweeps
    /// when tombstones are more than half the entries).
    pub(super) fn with_capacity(queue_limit: usize) -> Self {
        Waiting { entries: VecDeque::with_capacity(queue_limit), tombstones: 0 }
    }

    /// Stores `entry` last. Sweeps the tombstones out first when they are
    /// more than half the entries, so each sweep removes at least as many
    /// entries as it keeps.
    pub(super) fn push(&mut self, entry: Entry<T>) {
        if self.tombstones * 2 > self.entries.len() {
            self.entries.retain(|entry| !matches!(entry, Entry::Waiter(waiter) if waiter.is_cancelled()));
            self.tombstones = 0;
        }
        self.entries.push_back(entry);
    }

    /// Takes the oldest live entry out, claiming it if it is a waiter; the
    /// caller has just counted it out of `queued`.
    pub(super) fn take_oldest(&mut self) -> Entry<T> {
        loop {
            let entry = self.entries.pop_front().expect("a counted entry is always stored");
            match entry {
                Entry::Waiter(ref waiter) if !waiter.claim() => self.tombstones -= 1,
                entry => return entry,
            }
        }
    }

    /// A queued future was dropped; its entry stays as a tombstone.
    pub(super) fn bury(&mut self) {
        self.tombstones += 1;
    }

    /// Entries stored, tombstones included.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }
}
