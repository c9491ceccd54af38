//! [`ModelView`]: what a router reads of one model, published as a whole,
//! built of [`Chunk`]s so that a flip copies one chunk, not the model.
//!
//! - `chunk`: a run of instances with their bits and free list;
//! - `edit`: the writer's side (flips, members joining and leaving).

mod chunk;
mod edit;

use crossbeam_utils::CachePadded;

use crate::load::WorkerId;
use crate::monitor::entry::WorkerEntry;
use crate::sync::Arc;

pub(crate) use self::chunk::{Change, Chunk, Toggle, CHUNK_MAX};

/// A model's instances (sorted by id) with their busy and out-of-routing
/// bits, always consistent with each other; the monitor publishes a new one
/// through arc-swap when a bit, the instances or `filtering` change, and
/// routers reach it with one load.
///
/// The instances are split into chunks of consecutive ids, each published
/// whole and shared by every view until one of its bits or members changes:
/// a flip copies one chunk (its bits and free list, at most
/// [`CHUNK_MAX`] instances) and the list of chunks, whatever the model's
/// size. Laid out for a router that has just seen a new view: round-robin
/// reads the first line of the fields (`eligible`, `slots`), one slot, the
/// chunk's first line, one line of its free positions and one of its ids.
/// Aligned to its own lines so that the `Arc` counts in front of it never
/// share a line with the fields.
#[repr(C, align(128))]
pub(crate) struct ModelView {
    /// Instances a request with no exclusions may take: those in routing
    /// (and free, when filtering).
    pub(crate) eligible: usize,
    slots: Box<[Slot]>,
    /// Per chunk, the eligible instances in the chunks before it
    /// (contiguous: round-robin finds its chunk by a branchless count).
    eligible_before: Box<[u32]>,
    /// True when the model has at least one threshold configured.
    pub(crate) filtering: bool,
    len: usize,
    /// Instances out of routing.
    out: usize,
    /// The most instances a chunk of this model holds (a fuller one splits).
    capacity: usize,
}

/// One chunk and where it sits in the model.
#[derive(Clone)]
struct Slot {
    /// Instances in the chunks before this one.
    start: usize,
    /// The chunk's lowest id.
    first: WorkerId,
    chunk: Arc<CachePadded<Chunk>>,
}

/// Where an instance is in a view: which chunk, which position in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Place {
    pub(crate) slot: usize,
    pub(crate) local: usize,
}

impl ModelView {
    /// No instances; chunks of at most `capacity` (at most [`CHUNK_MAX`]).
    pub(crate) fn empty(filtering: bool, capacity: usize) -> Self {
        assert!((1..=CHUNK_MAX).contains(&capacity), "chunk capacity {capacity}");
        ModelView {
            eligible: 0,
            slots: Box::default(),
            eligible_before: Box::default(),
            filtering,
            len: 0,
            out: 0,
            capacity,
        }
    }

    /// Number of instances.
    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// True when there are no instances.
    #[inline(always)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of busy instances.
    #[cfg(test)]
    pub(crate) fn busy_count(&self) -> usize {
        self.slots.iter().map(|s| s.chunk.busy_count()).sum()
    }

    /// True when every instance is out of routing (none is alive to take a
    /// request, busy or not); false with no instances.
    #[inline]
    pub(crate) fn all_out(&self) -> bool {
        self.len > 0 && self.out == self.len
    }

    /// The id of the `k`-th instance a request with no exclusions may take
    /// (`k < eligible`): one index into a chunk's free positions.
    #[inline(always)]
    pub(crate) fn nth_eligible_id(&self, k: usize) -> WorkerId {
        let index = self.chunk_of_eligible(k);
        let chunk = &self.slots[index].chunk;
        chunk.id(chunk.free.nth(k - self.eligible_before[index] as usize))
    }

    /// The position (in the model) of the `k`-th instance a request with no
    /// exclusions may take (`k < eligible`).
    #[inline]
    pub(crate) fn nth_eligible(&self, k: usize) -> usize {
        let index = self.chunk_of_eligible(k);
        let slot = &self.slots[index];
        slot.start + slot.chunk.free.nth(k - self.eligible_before[index] as usize)
    }

    /// The chunk that holds the `k`-th eligible instance (`k < eligible`):
    /// the last whose eligible prefix is at most `k`, i.e. the number of
    /// chunks after the first with a prefix at most `k` (the prefixes never
    /// decrease), counted without a branch per chunk.
    #[inline(always)]
    fn chunk_of_eligible(&self, k: usize) -> usize {
        let k = k as u32; // below `eligible`, below 2^32
        match &self.eligible_before[..] {
            [_] => 0,
            before => before[1..].iter().map(|&b| u32::from(b <= k)).sum::<u32>() as usize,
        }
    }

    /// Where the instance at `position` (`< len`) is.
    #[inline]
    pub(crate) fn place(&self, position: usize) -> Place {
        let slot = match &*self.slots {
            [_] => 0,
            slots => slots.partition_point(|s| s.start <= position) - 1,
        };
        Place { slot, local: position - self.slots[slot].start }
    }

    /// The position (in the model) of `place`.
    #[inline]
    pub(crate) fn position(&self, place: Place) -> usize {
        self.slots[place.slot].start + place.local
    }

    /// The chunk of `place`.
    #[inline]
    pub(crate) fn chunk(&self, place: Place) -> &Chunk {
        &self.slots[place.slot].chunk
    }

    /// The id at `position` (`< len`).
    #[inline]
    pub(crate) fn id(&self, position: usize) -> WorkerId {
        let place = self.place(position);
        self.chunk(place).id(place.local)
    }

    /// The entry at `position` (`< len`).
    #[inline]
    pub(crate) fn entry(&self, position: usize) -> &Arc<WorkerEntry> {
        let place = self.place(position);
        self.chunk(place).entry(place.local)
    }

    /// Where `id` is, if it is an instance.
    #[inline]
    pub(crate) fn find(&self, id: WorkerId) -> Option<Place> {
        let slot = self.slots.partition_point(|s| s.first <= id).checked_sub(1)?;
        let local = self.slots[slot].chunk.search(id).ok()?;
        Some(Place { slot, local })
    }

    /// Where `id` is, if it is an instance a request with no exclusions may
    /// take (in routing, and free when filtering).
    #[inline]
    pub(crate) fn find_eligible(&self, id: WorkerId) -> Option<Place> {
        self.find(id).filter(|place| self.chunk(*place).is_eligible(place.local))
    }

    /// Where `entry` itself is (not another entry of its id: a restart
    /// replaces the entry).
    pub(crate) fn find_entry(&self, entry: &Arc<WorkerEntry>) -> Option<Place> {
        self.find(entry.id).filter(|&place| Arc::ptr_eq(self.chunk(place).entry(place.local), entry))
    }

    /// Calls `f` with every position from `start` (`< len`) to the end, then
    /// from 0 to `start`, and the place of each: chunk by chunk, no search
    /// per position.
    #[inline]
    pub(crate) fn for_each_from(&self, start: usize, mut f: impl FnMut(usize, Place, &Chunk)) {
        if self.len == 0 {
            return;
        }
        let first = self.place(start);
        let slots = self.slots.len();
        for step in 0..=slots {
            let index = (first.slot + step) % slots;
            let slot = &self.slots[index];
            let (from, to) = match step {
                0 => (first.local, slot.chunk.len()),
                _ if step == slots => (0, first.local),
                _ => (0, slot.chunk.len()),
            };
            for local in from..to {
                f(slot.start + local, Place { slot: index, local }, &slot.chunk);
            }
        }
    }

    /// Every instance, in id order (cold path).
    pub(crate) fn entries(&self) -> impl Iterator<Item = &Arc<WorkerEntry>> + '_ {
        self.slots.iter().flat_map(|s| s.chunk.entries())
    }

    /// Every instance with its published bit, in id order (cold path).
    pub(crate) fn bits(&self) -> impl Iterator<Item = (WorkerId, bool)> + '_ {
        self.slots.iter().flat_map(|s| (0..s.chunk.len()).map(|local| (s.chunk.id(local), s.chunk.is_busy(local))))
    }
}

#[cfg(test)]
mod tests;
