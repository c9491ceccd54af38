//! [`ModelView`]: what a router reads of one model, published as a whole.

use crossbeam_utils::CachePadded;

use crate::busy::BusySet;
use crate::load::WorkerId;
use crate::monitor::entry::WorkerEntry;
use crate::padded::Padded;
use crate::sync::Arc;

/// A model's instances and busy bits, always consistent with each other;
/// the monitor publishes a new one through arc-swap when a bit, the
/// instances or `filtering` change, and routers reach it with one load.
///
/// Laid out for a router that has just seen a new view: round-robin reads
/// only the first cache line of the fields (`free`, `ids`, `filtering`),
/// the list of free positions (one line for up to 64 free instances of a
/// model of at most 256) and the ids (shared by every view until the
/// instances change, so usually still cached). Aligned to its own lines so
/// that the `Arc` counts in front of it never share a line with the fields.
#[repr(C, align(128))]
pub(crate) struct ModelView {
    /// The positions a request with no exclusions may take.
    pub(crate) free: FreePositions,
    /// The instances' ids, in instance order: what selection returns, read
    /// without touching the entries (which the event plane writes). Padded so
    /// that the `Arc` counts, bumped at each publication, stay off the ids'
    /// lines.
    pub(crate) ids: Arc<CachePadded<Padded<WorkerId>>>,
    /// True when the model has at least one threshold configured.
    pub(crate) filtering: bool,
    /// The instances, sorted by id.
    pub(crate) instances: Arc<[Arc<WorkerEntry>]>,
    pub(crate) busy: BusySet,
}

impl ModelView {
    /// A view of `instances` (whose ids are `ids`) with `busy`; lists the
    /// free positions (cold path: publication).
    pub(crate) fn new(
        instances: Arc<[Arc<WorkerEntry>]>,
        ids: Arc<CachePadded<Padded<WorkerId>>>,
        busy: BusySet,
        filtering: bool,
    ) -> Self {
        let free = FreePositions::of(&busy, filtering);
        ModelView { free, ids, filtering, instances, busy }
    }

    /// No instances.
    pub(crate) fn empty(filtering: bool) -> Self {
        ModelView::new(Arc::from(Vec::new()), Arc::default(), BusySet::new(0), filtering)
    }
}

/// The positions (indexes into the instance list) a request with no
/// exclusions may take, in instance order: the k-th entry is the k-th free
/// instance, as [`BusySet::nth_free`] would find it, in one index.
///
/// Positions rather than ids, and one byte each when they fit, so that a
/// router fetches as few lines as possible of a freshly published list.
#[derive(Debug)]
pub(crate) enum FreePositions {
    /// Every instance may be taken (no filtering, or none busy).
    All,
    /// A model of at most 256 instances.
    Narrow(Padded<u8>),
    /// Any model.
    Wide(Padded<u32>),
}

impl FreePositions {
    /// The list for `busy` (cold path: allocates).
    fn of(busy: &BusySet, filtering: bool) -> Self {
        if !filtering || busy.busy_count() == 0 {
            return FreePositions::All;
        }
        let mut free = Vec::with_capacity(busy.free_count());
        busy.for_each_free(|position| free.push(position));
        if busy.len() <= usize::from(u8::MAX) + 1 {
            FreePositions::Narrow(Padded::new(free.into_iter().map(|p| p as u8)))
        } else {
            let wide = |p| u32::try_from(p).expect("fewer than 2^32 instances");
            FreePositions::Wide(Padded::new(free.into_iter().map(wide)))
        }
    }

    /// How many positions may be taken, of `len` instances.
    #[inline(always)]
    pub(crate) fn count(&self, len: usize) -> usize {
        match self {
            FreePositions::All => len,
            FreePositions::Narrow(free) => free.len(),
            FreePositions::Wide(free) => free.len(),
        }
    }

    /// The `k`-th position that may be taken; `k < count(len)`.
    #[inline(always)]
    pub(crate) fn nth(&self, k: usize) -> usize {
        match self {
            FreePositions::All => k,
            FreePositions::Narrow(free) => usize::from(free.get(k)),
            FreePositions::Wide(free) => free.get(k) as usize,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_positions_list_the_free_instances_in_order() {
        let mut rng = fastrand::Rng::with_seed(5);
        for len in [1, 5, 64, 256, 257, 1000] {
            let mut busy = BusySet::new(len);
            for _ in 0..len / 3 {
                busy.set(rng.usize(..len), true);
            }
            busy.set(len - 1, true);
            let free = FreePositions::of(&busy, true);
            let expected: Vec<usize> = busy.iter_free().collect();
            assert_eq!(free.count(len), expected.len(), "len {len}");
            let listed: Vec<usize> = (0..free.count(len)).map(|k| free.nth(k)).collect();
            assert_eq!(listed, expected, "len {len}");
            assert!(matches!(free, FreePositions::Narrow(_)) == (len <= 256), "len {len}");
            // Without filtering, or with nothing busy, every position is taken.
            assert!(matches!(FreePositions::of(&busy, false), FreePositions::All));
            assert!(matches!(FreePositions::of(&BusySet::new(len), true), FreePositions::All));
        }
    }
}
