//! [`Chunk`]: a run of a model's instances (consecutive by id) with their
//! busy bits and the list of the free ones; a flip copies one chunk, not the
//! model.

use crossbeam_utils::CachePadded;

use crate::load::WorkerId;
use crate::monitor::entry::WorkerEntry;
use crate::monitor::view::reasons::ReasonCounts;
use crate::padded::Padded;
use crate::sync::Arc;
use crate::thresholds::BusySignals;

/// The most instances a chunk can hold.
pub(crate) const CHUNK_MAX: usize = 1024;

/// Words of busy bits in a chunk.
const WORDS: usize = CHUNK_MAX / 64;

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
    /// The positions (in this chunk) a request with no exclusions may take.
    pub(crate) free: FreePositions,
    pub(crate) members: Arc<CachePadded<Members>>,
    words: [u64; WORDS],
    busy: u32,
    reasons: ReasonCounts,
}

/// One instance's busy bit changing (or, busy, its signals), as the writer
/// publishes it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Change {
    /// Its chunk's index in the view.
    pub(crate) slot: usize,
    /// Position in its chunk.
    pub(crate) local: usize,
    /// Published busy before, with these signals.
    pub(crate) was: Option<BusySignals>,
    /// Busy now, with these signals.
    pub(crate) now: Option<BusySignals>,
}

impl Chunk {
    /// A chunk of `entries` whose bits are their published mirrors (cold
    /// path: a change of members; under the model's lock).
    pub(crate) fn of(entries: Vec<Arc<WorkerEntry>>, filtering: bool) -> Chunk {
        debug_assert!(entries.len() <= CHUNK_MAX);
        let mut words = [0u64; WORDS];
        let mut reasons = ReasonCounts::default();
        let mut busy = 0;
        for (local, entry) in entries.iter().enumerate() {
            if let Some(signals) = entry.published() {
                words[local / 64] |= 1 << (local % 64);
                reasons.add(signals);
                busy += 1;
            }
        }
        let members = Members::new(entries);
        let free = FreePositions::of(&words, members.ids.len(), busy, filtering);
        Chunk { free, members, words, busy, reasons }
    }

    /// This chunk with `changes` (sorted by position, one per position)
    /// applied and `filtering` (cold path: a flip). Copies the bits and
    /// splices the free list: no scan of the members.
    pub(crate) fn with_changes(&self, changes: &[Change], filtering: bool) -> Chunk {
        let mut words = self.words;
        let mut reasons = self.reasons;
        let mut busy = self.busy;
        for change in changes {
            let bit = 1u64 << (change.local % 64);
            if let Some(signals) = change.was {
                reasons.remove(signals);
                busy -= 1;
                words[change.local / 64] &= !bit;
            }
            if let Some(signals) = change.now {
                reasons.add(signals);
                busy += 1;
                words[change.local / 64] |= bit;
            }
        }
        let len = self.len();
        let flips = changes.iter().filter(|c| c.was.is_some() != c.now.is_some());
        let free = match (&self.free, filtering && busy > 0) {
            (_, false) => FreePositions::All,
            // Busy bits exist only with filtering, so an `All` chunk had
            // every instance free: splice into the identity.
            (FreePositions::All, true) if len <= NARROW => {
                FreePositions::Narrow(splice(&IDENTITY_U8[..len], flips, len - busy as usize))
            }
            (FreePositions::All, true) => FreePositions::Wide(splice(&IDENTITY_U16[..len], flips, len - busy as usize)),
            (FreePositions::Narrow(old), true) => FreePositions::Narrow(splice(old, flips, len - busy as usize)),
            (FreePositions::Wide(old), true) => FreePositions::Wide(splice(old, flips, len - busy as usize)),
        };
        Chunk { free, members: self.members.clone(), words, busy, reasons }
    }

    /// This chunk with the member at `at` taken out (`remove`) and `insert`
    /// (if any) put at `at` (cold path: a registration, under the model's
    /// lock). Copies the members and bits, and lists the free positions
    /// again; reads only the mirrors of the two members that change.
    pub(crate) fn spliced(&self, at: usize, remove: bool, insert: Option<&Arc<WorkerEntry>>, filtering: bool) -> Chunk {
        let old = self.entries();
        let skip = at + usize::from(remove);
        let mut entries = Vec::with_capacity(old.len() + 1);
        entries.extend_from_slice(&old[..at]);
        entries.extend(insert.cloned());
        entries.extend_from_slice(&old[skip..]);
        let mut words = [0u64; WORDS];
        let mut busy = 0;
        let mut reasons = self.reasons;
        let mut set = |position: usize| {
            words[position / 64] |= 1 << (position % 64);
            busy += 1;
        };
        (0..at).filter(|&p| self.is_busy(p)).for_each(&mut set);
        if let Some(signals) = insert.and_then(|entry| entry.published()) {
            reasons.add(signals);
            set(at);
        }
        if remove && self.is_busy(at) {
            reasons.remove(old[at].published().unwrap_or_default());
        }
        let shift = usize::from(insert.is_some());
        (skip..old.len()).filter(|&p| self.is_busy(p)).for_each(|p| set(p - skip + at + shift));
        let members = Members::new(entries);
        let free = FreePositions::of(&words, members.ids.len(), busy, filtering);
        Chunk { free, members, words, busy, reasons }
    }

    /// The same members and bits under `filtering` (cold path: a threshold
    /// change).
    pub(crate) fn refiltered(&self, filtering: bool) -> Chunk {
        let free = FreePositions::of(&self.words, self.len(), self.busy, filtering);
        Chunk { free, members: self.members.clone(), words: self.words, busy: self.busy, reasons: self.reasons }
    }

    /// Number of instances.
    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        self.members.ids.len()
    }

    /// Number of busy instances.
    #[inline]
    pub(crate) fn busy_count(&self) -> usize {
        self.busy as usize
    }

    /// Instances a request with no exclusions may take.
    #[inline(always)]
    pub(crate) fn eligible(&self) -> usize {
        self.free.count(self.len())
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
        self.words[local / 64] & (1 << (local % 64)) != 0
    }

    /// Where `id` is, or where it would go.
    #[inline]
    pub(crate) fn search(&self, id: WorkerId) -> Result<usize, usize> {
        self.members.ids.binary_search(&id)
    }

    /// The signals of the busy instances, counted.
    pub(crate) fn reasons(&self) -> ReasonCounts {
        self.reasons
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

/// `old` (sorted free positions) with the positions of `flips` that became
/// free added and those that became busy removed; `len` positions in all.
/// Copies runs with `copy_from_slice`: a flip costs a memory copy of the
/// chunk's list, not a pass over its bits.
fn splice<'a, T>(old: &[T], flips: impl Iterator<Item = &'a Change>, len: usize) -> Padded<T>
where
    T: Copy + Default + Into<usize> + TryFrom<usize>,
{
    Padded::filled(len, |out| {
        let (mut from, mut to) = (0, 0);
        for change in flips {
            let at = old[from..].partition_point(|&p| p.into() < change.local) + from;
            let run = at - from;
            out[to..to + run].copy_from_slice(&old[from..at]);
            (from, to) = (at, to + run);
            if change.now.is_none() {
                // Became free: not in `old`.
                out[to] = T::try_from(change.local).unwrap_or_default();
                to += 1;
            } else {
                // Became busy: `old[at]` is this position.
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
    /// Every instance may be taken (no filtering, or none busy).
    All,
    /// A chunk of at most 256 instances.
    Narrow(Padded<u8>),
    /// Any chunk.
    Wide(Padded<u16>),
}

impl FreePositions {
    /// The list for `words` over `len` instances, `busy` of them busy (cold
    /// path: a pass over the bits).
    fn of(words: &[u64; WORDS], len: usize, busy: u32, filtering: bool) -> Self {
        if !filtering || busy == 0 {
            return FreePositions::All;
        }
        let free = len - busy as usize;
        let each = |word: usize| {
            let mut bits = !words[word];
            if (word + 1) * 64 > len {
                bits &= (1u64 << (len % 64)) - 1;
            }
            std::iter::from_fn(move || {
                (bits != 0).then(|| {
                    let bit = bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    word * 64 + bit
                })
            })
        };
        let positions = (0..len.div_ceil(64)).flat_map(each);
        if len <= NARROW {
            FreePositions::Narrow(Padded::filled(free, |out| {
                out.iter_mut().zip(positions).for_each(|(o, p)| *o = p as u8)
            }))
        } else {
            FreePositions::Wide(Padded::filled(free, |out| {
                out.iter_mut().zip(positions).for_each(|(o, p)| *o = p as u16)
            }))
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
        ids.into_iter().map(|id| Arc::new(WorkerEntry::new(id, 0, 1))).collect()
    }

    fn listed(chunk: &Chunk) -> Vec<usize> {
        (0..chunk.eligible()).map(|k| chunk.free.nth(k)).collect()
    }

    fn expected(chunk: &Chunk, filtering: bool) -> Vec<usize> {
        (0..chunk.len()).filter(|&p| !filtering || !chunk.is_busy(p)).collect()
    }

    #[test]
    fn flips_splice_the_free_list_as_a_rebuild_would_list_it() {
        let decode = BusySignals { decode: true, ..Default::default() };
        let mut rng = fastrand::Rng::with_seed(5);
        for len in [1, 5, 64, 255, 256, 257, 1000, CHUNK_MAX] {
            let mut chunk = Chunk::of(entries(0..len as WorkerId), true);
            for _ in 0..200 {
                let mut locals: Vec<usize> = (0..rng.usize(1..4)).map(|_| rng.usize(..len)).collect();
                locals.sort_unstable();
                locals.dedup();
                let changes: Vec<Change> = locals
                    .iter()
                    .map(|&local| {
                        let was = chunk.is_busy(local).then_some(decode);
                        Change { slot: 0, local, was, now: rng.bool().then_some(decode) }
                    })
                    .collect();
                chunk = chunk.with_changes(&changes, true);
                assert_eq!(listed(&chunk), expected(&chunk, true), "len {len}");
                let busy = (0..len).filter(|&p| chunk.is_busy(p)).count();
                assert_eq!(chunk.busy_count(), busy);
                assert_eq!(chunk.reasons().signals().decode, busy > 0);
                let rebuilt = chunk.refiltered(true);
                assert_eq!(listed(&rebuilt), listed(&chunk));
                assert_eq!(matches!(chunk.free, FreePositions::Narrow(_)), busy > 0 && len <= NARROW);
            }
            // Without filtering, every position is taken.
            assert_eq!(listed(&chunk.refiltered(false)), expected(&chunk, false));
        }
    }
}
