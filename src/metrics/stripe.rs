//! Which stripe of a [`StripedHistogram`](super::StripedHistogram) a thread
//! writes: a small index per live thread, handed back when the thread exits.
//!
//! Indexes are handed out lowest free first (the scheme of thread_local-rs's
//! `thread_id`), so the threads alive at once hold distinct small indexes
//! however many threads came and went before. The histogram relies on two
//! promises:
//!
//! - **No two live threads hold the same index**, so a stripe whose index a
//!   thread holds has no other writer.
//! - **An index passes through the mutex below**: handed back under it when
//!   its thread exits, taken under it by the next thread. Every write of the
//!   old holder happens before every access of the new one.
//!
//! The lock is taken once when a thread first records and once when it
//! exits, never on the recording path. loom cannot model it (its mutex
//! cannot sit in a `static`); it is std's.

use std::cell::Cell;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Mutex, OnceLock, PoisonError};

/// Most owned stripes a histogram has, whatever the core count: past that
/// the merge at scrape and the memory grow for little gain.
const MAX_OWNED: usize = 64;

/// The indexes in use: the next never-used one and those handed back.
struct Indexes {
    next: usize,
    free: BinaryHeap<Reverse<usize>>,
}

impl Indexes {
    const fn new() -> Self {
        Indexes { next: 0, free: BinaryHeap::new() }
    }

    /// The lowest index not in use.
    fn take(&mut self) -> usize {
        match self.free.pop() {
            Some(Reverse(index)) => index,
            None => {
                self.next += 1;
                self.next - 1
            }
        }
    }

    fn give_back(&mut self, index: usize) {
        self.free.push(Reverse(index));
    }
}

static INDEXES: Mutex<Indexes> = Mutex::new(Indexes::new());

/// A thread's index, handed back when the thread exits.
struct Held(Cell<Option<usize>>);

impl Held {
    #[cold]
    fn take() -> usize {
        INDEXES.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(index) = self.0.get() {
            INDEXES.lock().unwrap_or_else(PoisonError::into_inner).give_back(index);
        }
    }
}

thread_local! {
    static HELD: Held = const { Held(Cell::new(None)) };
}

/// The calling thread's index, held until it exits; `None` once its
/// thread-locals are being destroyed (it may have handed its index back).
#[inline]
pub(super) fn index() -> Option<usize> {
    HELD.try_with(|held| match held.0.get() {
        Some(index) => index,
        None => {
            let index = Held::take();
            held.0.set(Some(index));
            index
        }
    })
    .ok()
}

/// The owned stripes of new histograms: twice the cores available (room
/// for threads that record now and then besides those that record all the
/// time), at most [`MAX_OWNED`]. Read once per process.
pub(super) fn owned() -> usize {
    static OWNED: OnceLock<usize> = OnceLock::new();
    *OWNED.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        (2 * cores).min(MAX_OWNED)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lowest_free_index_comes_first() {
        let mut indexes = Indexes::new();
        assert_eq!([indexes.take(), indexes.take(), indexes.take()], [0, 1, 2]);
        indexes.give_back(2);
        indexes.give_back(0);
        assert_eq!([indexes.take(), indexes.take(), indexes.take()], [0, 2, 3]);
    }

    #[test]
    fn live_threads_hold_distinct_indexes() {
        let mine = index();
        assert_eq!(index(), mine, "stable within a thread");
        let barrier = std::sync::Barrier::new(2);
        let (a, b) = std::thread::scope(|s| {
            let [a, b] = [(); 2].map(|()| {
                s.spawn(|| {
                    let i = index();
                    barrier.wait();
                    i
                })
            });
            (a.join().unwrap(), b.join().unwrap())
        });
        assert!(a != b && a != mine && b != mine, "{mine:?} {a:?} {b:?}");
        assert!((1..=MAX_OWNED).contains(&owned()));
    }
}
