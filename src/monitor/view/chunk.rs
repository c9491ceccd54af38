//! [`Chunk`]: a run of a model's instances (consecutive by id) with their
//! busy bits and the list of the free ones; a flip copies one chunk, not the
//! model.

use crossbeam_utils::CachePadded;

use crate::load::WorkerId;
use crate::monitor::entry::WorkerEntry;
use crate::padded::Padded;
use crate::sync::Arc;

/// The most instances a chunk can hold.
pub(crate) const CHUNK_MAX: usize = 1024;

/// Words of each bitmap in a chunk: room for one more instance than a
/// chunk holds, as a full chunk that gains a member splits only after.
const WORDS: usize = CHUNK_MAX / 64 + 1;

/// The instances of one chunk, in id order: shared by every view until they
/// change (a registration), so a flip copies none of them.
pub(crate) struct Members {
    /// The ids, read by selection without touching the entries (which the
    /// event plane writes).
    pub(crate) ids: Padded<WorkerId>,
    pub(crate) entries: Box<[Arc<WorkerEntry>]>,
}

impl Members {
    fn new(entries: Vec<Arc<WorkerEntry>>) -> Arc<CachePadded<Members>> {
        let ids = Padded::new(entries.iter().map(|e| e.id));
        Arc::new(CachePadded::new(Members { ids, entries: entries.into_boxed_slice() }))
    }
}

/// A run of at most [`CHUNK_MAX`] instances, immutable once published.
///
/// What a router reads comes first: the free positions and the members.
pub(crate) struct Chunk {
    /// The positions (in this chunk) a request with no exclusions may take:
    /// in routing, and free when filtering.
    pub(crate) free: FreePositions,
    pub(crate) members: Arc<CachePadded<Members>>,
    bits: Bits,
    /// Whether busy instances are skipped (the model has a threshold).
    filtering: bool,
}

/// One instance's change, as the writer publishes it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Change {
    /// Its chunk's index in the view.
    pub(crate) slot: usize,
    /// Position in its chunk.
    pub(crate) local: usize,
    pub(crate) what: Toggle,
}

/// What changes for one instance.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Toggle {
    /// Busy (true) or free.
    Busy(bool),
    /// Out of routing (true) or back in it.
    Out(bool),
}

/// A chunk's two bitmaps, by position: busy (by the model's thresholds) and
/// out of routing (silent, quarantined: the embedder's say).
#[derive(Clone, Copy)]
struct Bits {
    busy: [u64; WORDS],
    out: [u64; WORDS],
    busy_count: u32,
    out_count: u32,
}

impl Bits {
    const NONE: Bits = Bits { busy: [0; WORDS], out: [0; WORDS], busy_count: 0, out_count: 0 };

    fn get(words: &[u64; WORDS], local: usize) -> bool {
        words[local / 64] & (1 << (local % 64)) != 0
    }

    /// Sets one bit in `words`; returns whether it changed.
    fn put(words: &mut [u64; WORDS], local: usize, on: bool) -> bool {
        let (word, bit) = (&mut words[local / 64], 1u64 << (local % 64));
        let was = *word & bit != 0;
        *word = if on { *word | bit } else { *word & !bit };
        was != on
    }

    fn set_busy(&mut self, local: usize, busy: bool) {
        if Bits::put(&mut self.busy, local, busy) {
            self.busy_count = if busy { self.busy_count + 1 } else { self.busy_count - 1 };
        }
    }

    fn set_out(&mut self, local: usize, out: bool) {
        if Bits::put(&mut self.out, local, out) {
            self.out_count = if out { self.out_count + 1 } else { self.out_count - 1 };
        }
    }

    /// Whether a request with no exclusions may take `local`.
    fn eligible(&self, local: usize, filtering: bool) -> bool {
        !(Bits::get(&self.out, local) || filtering && Bits::get(&self.busy, local))
    }

    /// Whether every instance may be taken.
    fn all_eligible(&self, filtering: bool) -> bool {
        self.out_count == 0 && (!filtering || self.busy_count == 0)
    }

    /// The bits of `old` positions with `at` taken out (`remove`) and
    /// `insert` (busy, out) put at `at`.
    fn spliced(&self, len: usize, at: usize, remove: bool, insert: Option<(bool, bool)>) -> Bits {
        let mut bits = Bits::NONE;
        let skip = at + usize::from(remove);
        let shift = usize::from(insert.is_some());
        let moved = (0..at).map(|p| (p, p)).chain((skip..len).map(|p| (p, p - skip + at + shift)));
        for (from, to) in moved {
            bits.set_busy(to, Bits::get(&self.busy, from));
            bits.set_out(to, Bits::get(&self.out, from));
        }
        if let Some((busy, out)) = insert {
            bits.set_busy(at, busy);
            bits.set_out(at, out);
        }
        bits
    }
}

impl Chunk {
    /// A chunk of `entries` whose bits are their published mirrors (cold
    /// path: a change of members; under the model's lock).
    pub(crate) fn of(entries: Vec<Arc<WorkerEntry>>, filtering: bool) -> Chunk {
        debug_assert!(entries.len() <= CHUNK_MAX);
        let mut bits = Bits::NONE;
        for (local, entry) in entries.iter().enumerate() {
            bits.set_busy(local, entry.published().is_some());
            bits.set_out(local, entry.is_out());
        }
        Chunk::assemble(Members::new(entries), bits, filtering)
    }

    fn assemble(members: Arc<CachePadded<Members>>, bits: Bits, filtering: bool) -> Chunk {
        let free = FreePositions::of(&bits, members.ids.len(), filtering);
        Chunk { free, members, bits, filtering }
    }

    /// This chunk with `changes` (sorted by position, one per position)
    /// applied and `filtering` (cold path: a flip). Copies the bits and
    /// splices the free list: no scan of the members (unless `filtering`
    /// changes: a threshold change lists the free positions again).
    pub(crate) fn with_changes(&self, changes: &[Change], filtering: bool) -> Chunk {
        let mut bits = self.bits;
        for change in changes {
            match change.what {
                Toggle::Busy(busy) => bits.set_busy(change.local, busy),
                Toggle::Out(out) => bits.set_out(change.local, out),
            }
        }
        if filtering != self.filtering {
            return Chunk::assemble(self.members.clone(), bits, filtering);
        }
        let len = self.len();
        let flips = changes.iter().filter_map(|c| {
            let (before, after) = (self.bits.eligible(c.local, filtering), bits.eligible(c.local, filtering));
            (before != after).then_some((c.local, after))
        });
        let gained =
            changes.iter().filter(|c| !self.bits.eligible(c.local, filtering) && bits.eligible(c.local, filtering));
        let lost =
            changes.iter().filter(|c| self.bits.eligible(c.local, filtering) && !bits.eligible(c.local, filtering));
        let count = self.eligible() + gained.count() - lost.count();
        let free = match (&self.free, bits.all_eligible(filtering)) {
            (_, true) => FreePositions::All,
            // An `All` chunk had every instance eligible: splice into the
            // identity.
            (FreePositions::All, false) if len <= NARROW => {
                FreePositions::Narrow(splice(&IDENTITY_U8[..len], flips, count))
            }
            (FreePositions::All, false) => FreePositions::Wide(splice(&IDENTITY_U16[..len], flips, count)),
            (FreePositions::Narrow(old), false) => FreePositions::Narrow(splice(old, flips, count)),
            (FreePositions::Wide(old), false) => FreePositions::Wide(splice(old, flips, count)),
        };
        Chunk { free, members: self.members.clone(), bits, filtering }
    }

    /// This chunk with the member at `at` taken out (`remove`) and `insert`
    /// (if any) put at `at` (cold path: a registration, under the model's
    /// lock). Copies the members and bits, and lists the free positions
    /// again; reads only the mirrors of the two members that change.
    pub(crate) fn spliced(&self, at: usize, remove: bool, insert: Option<&Arc<WorkerEntry>>, filtering: bool) -> Chunk {
        let old = self.entries();
        let mut entries = Vec::with_capacity(old.len() + 1);
        entries.extend_from_slice(&old[..at]);
        entries.extend(insert.cloned());
        entries.extend_from_slice(&old[at + usize::from(remove)..]);
        let inserted = insert.map(|entry| (entry.published().is_some(), entry.is_out()));
        let bits = self.bits.spliced(old.len(), at, remove, inserted);
        Chunk::assemble(Members::new(entries), bits, filtering)
    }

    /// The same members and bits under `filtering` (cold path: a threshold
    /// change).
    pub(crate) fn refiltered(&self, filtering: bool) -> Chunk {
        Chunk::assemble(self.members.clone(), self.bits, filtering)
    }

    /// Number of instances.
    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        self.members.ids.len()
    }

    /// Number of busy instances.
    #[cfg(test)]
    pub(crate) fn busy_count(&self) -> usize {
        self.bits.busy_count as usize
    }

    /// Number of instances out of routing.
    #[inline]
    pub(crate) fn out_count(&self) -> usize {
        self.bits.out_count as usize
    }

    /// Instances a request with no exclusions may take.
    #[inline(always)]
    pub(crate) fn eligible(&self) -> usize {
        self.free.count(self.len())
    }

    /// Whether a request with no exclusions may take the instance at `local`.
    #[inline]
    pub(crate) fn is_eligible(&self, local: usize) -> bool {
        self.bits.eligible(local, self.filtering)
    }

    /// The id at `local` (`local < len()`).
    #[inline(always)]
    pub(crate) fn id(&self, local: usize) -> WorkerId {
        self.members.ids.get(local)
    }

    /// The entry at `local` (`local < len()`).
    #[inline]
    pub(crate) fn entry(&self, local: usize) -> &Arc<WorkerEntry> {
        &self.members.entries[local]
    }

    /// The entries, in id order.
    pub(crate) fn entries(&self) -> &[Arc<WorkerEntry>] {
        &self.members.entries
    }

    /// Whether the instance at `local` is published busy.
    #[inline]
    pub(crate) fn is_busy(&self, local: usize) -> bool {
        Bits::get(&self.bits.busy, local)
    }

    /// Whether the instance at `local` is out of routing.
    #[inline]
    pub(crate) fn is_out(&self, local: usize) -> bool {
        Bits::get(&self.bits.out, local)
    }

    /// Where `id` is, or where it would go.
    #[inline]
    pub(crate) fn search(&self, id: WorkerId) -> Result<usize, usize> {
        self.members.ids.binary_search(&id)
    }
}

/// Chunks of at most this many instances list free positions in one byte.
const NARROW: usize = u8::MAX as usize + 1;

/// Every position of a narrow chunk, in order.
static IDENTITY_U8: [u8; NARROW] = {
    let mut all = [0u8; NARROW];
    let mut i = 0;
    while i < NARROW {
        all[i] = i as u8;
        i += 1;
    }
    all
};

/// Every position of a chunk, in order.
static IDENTITY_U16: [u16; CHUNK_MAX] = {
    let mut all = [0u16; CHUNK_MAX];
    let mut i = 0;
    while i < CHUNK_MAX {
        all[i] = i as u16;
        i += 1;
    }
    all
};

/// `old` (sorted eligible positions) with `flips` applied: each a position
/// (in order) that became eligible (added) or not (removed); `len`
/// positions in all.
/// Copies runs with `copy_from_slice`: a flip costs a memory copy of the
/// chunk's list, not a pass over its bits.
fn splice<T>(old: &[T], flips: impl Iterator<Item = (usize, bool)>, len: usize) -> Padded<T>
where
    T: Copy + Default + Into<usize> + TryFrom<usize>,
{
    Padded::filled(len, |out| {
        let (mut from, mut to) = (0, 0);
        for (local, eligible) in flips {
            let at = old[from..].partition_point(|&p| p.into() < local) + from;
            let run = at - from;
            out[to..to + run].copy_from_slice(&old[from..at]);
            (from, to) = (at, to + run);
            if eligible {
                // Not in `old`.
                out[to] = T::try_from(local).unwrap_or_default();
                to += 1;
            } else {
                // `old[at]` is this position.
                from += 1;
            }
        }
        out[to..].copy_from_slice(&old[from..]);
    })
}

/// The positions (in one chunk) a request with no exclusions may take, in
/// order: the k-th entry is the k-th free instance, in one index.
///
/// One byte each in chunks of at most 256 instances, so that a router
/// fetches as few lines as possible of a freshly published list.
#[derive(Debug)]
pub(crate) enum FreePositions {
    /// Every instance may be taken (none out of routing, and no filtering
    /// or none busy).
    All,
    /// A chunk of at most 256 instances.
    Narrow(Padded<u8>),
    /// Any chunk.
    Wide(Padded<u16>),
}

impl FreePositions {
    /// The list for `bits` over `len` instances (cold path: a pass over
    /// the bits).
    fn of(bits: &Bits, len: usize, filtering: bool) -> Self {
        if bits.all_eligible(filtering) {
            return FreePositions::All;
        }
        let each = |word: usize| {
            let mut free = !(bits.out[word] | if filtering { bits.busy[word] } else { 0 });
            if (word + 1) * 64 > len {
                free &= (1u64 << (len % 64)) - 1;
            }
            std::iter::from_fn(move || {
                (free != 0).then(|| {
                    let bit = free.trailing_zeros() as usize;
                    free &= free - 1;
                    word * 64 + bit
                })
            })
        };
        let positions: Vec<usize> = (0..len.div_ceil(64)).flat_map(each).collect();
        if len <= NARROW {
            FreePositions::Narrow(Padded::new(positions.iter().map(|&p| p as u8)))
        } else {
            FreePositions::Wide(Padded::new(positions.iter().map(|&p| p as u16)))
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
            FreePositions::Wide(free) => usize::from(free.get(k)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(ids: impl IntoIterator<Item = WorkerId>) -> Vec<Arc<WorkerEntry>> {
        ids.into_iter().map(|id| Arc::new(WorkerEntry::new(id, 0, 1, 0))).collect()
    }

    fn listed(chunk: &Chunk) -> Vec<usize> {
        (0..chunk.eligible()).map(|k| chunk.free.nth(k)).collect()
    }

    fn expected(chunk: &Chunk, filtering: bool) -> Vec<usize> {
        (0..chunk.len()).filter(|&p| !(chunk.is_out(p) || filtering && chunk.is_busy(p))).collect()
    }

    #[test]
    fn changes_splice_the_free_list_as_a_rebuild_would_list_it() {
        let mut rng = fastrand::Rng::with_seed(5);
        for len in [1, 5, 64, 255, 256, 257, 1000, CHUNK_MAX] {
            let mut chunk = Chunk::of(entries(0..len as WorkerId), true);
            for _ in 0..300 {
                let mut locals: Vec<usize> = (0..rng.usize(1..4)).map(|_| rng.usize(..len)).collect();
                locals.sort_unstable();
                locals.dedup();
                let changes: Vec<Change> = locals
                    .iter()
                    .map(|&local| {
                        let what = match rng.u8(..3) {
                            0 => Toggle::Out(rng.bool()),
                            _ => Toggle::Busy(rng.bool()),
                        };
                        Change { slot: 0, local, what }
                    })
                    .collect();
                chunk = chunk.with_changes(&changes, true);
                assert_eq!(listed(&chunk), expected(&chunk, true), "len {len}");
                let busy = (0..len).filter(|&p| chunk.is_busy(p)).count();
                assert_eq!(chunk.busy_count(), busy);
                assert_eq!(chunk.out_count(), (0..len).filter(|&p| chunk.is_out(p)).count());
                let rebuilt = chunk.refiltered(true);
                assert_eq!(listed(&rebuilt), listed(&chunk));
                let all = chunk.eligible() == len;
                assert_eq!(matches!(chunk.free, FreePositions::Narrow(_)), !all && len <= NARROW);
                // Without filtering, only the instances out of routing are skipped.
                assert_eq!(listed(&chunk.refiltered(false)), expected(&chunk, false));
            }
        }
    }
}
