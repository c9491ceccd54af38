//! The writer's side of [`ModelView`]: a new view from the current one, with
//! flips or a member joining or leaving (cold path: under the model's lock).
//! A flip copies the chunks it touches and the list of chunks; a change of
//! members copies one chunk (two when it splits or merges).

use crossbeam_utils::CachePadded;

use super::{Change, Chunk, ModelView, Slot};
use crate::monitor::entry::WorkerEntry;
use crate::sync::Arc;

type Shared = Arc<CachePadded<Chunk>>;

fn shared(chunk: Chunk) -> Shared {
    Arc::new(CachePadded::new(chunk))
}

impl ModelView {
    /// A view of `chunks` (none empty, in id order).
    fn assemble(chunks: Vec<Shared>, filtering: bool, capacity: usize) -> ModelView {
        let mut view = ModelView::empty(filtering, capacity);
        let mut slots = Vec::with_capacity(chunks.len());
        let mut eligible_before = Vec::with_capacity(chunks.len());
        for chunk in chunks {
            debug_assert!(chunk.len() > 0);
            view.out += chunk.out_count();
            eligible_before.push(u32::try_from(view.eligible).expect("fewer than 2^32 instances"));
            let slot = Slot { start: view.len, first: chunk.id(0), chunk };
            view.eligible += slot.chunk.eligible();
            view.len += slot.chunk.len();
            slots.push(slot);
        }
        view.slots = slots.into_boxed_slice();
        view.eligible_before = eligible_before.into_boxed_slice();
        view
    }

    /// This view with `changes` (at most one per instance) applied, under
    /// `filtering`. Only the chunks with a change are copied; the others'
    /// slots are copied with their counts adjusted, without reading the
    /// chunks. A change of `filtering` (a threshold change) lists every
    /// chunk's free positions again.
    pub(crate) fn with_changes(&self, changes: &mut [Change], filtering: bool) -> ModelView {
        changes.sort_unstable_by_key(|c| (c.slot, c.local));
        let mut rest = &changes[..];
        let mut mine = |index: usize| {
            let count = rest.iter().take_while(|c| c.slot == index).count();
            let (mine, after) = rest.split_at(count);
            rest = after;
            mine
        };
        if filtering != self.filtering {
            let chunks = self.slots.iter().enumerate().map(|(index, slot)| match mine(index) {
                [] => shared(slot.chunk.refiltered(filtering)),
                changes => shared(slot.chunk.with_changes(changes, filtering)),
            });
            return ModelView::assemble(chunks.collect(), filtering, self.capacity);
        }
        let mut slots = self.slots.to_vec();
        let mut eligible_before = self.eligible_before.to_vec();
        let (mut eligible, mut out) = (self.eligible, self.out);
        let mut gained = 0isize;
        for (index, (slot, before)) in slots.iter_mut().zip(&mut eligible_before).enumerate() {
            *before = before.wrapping_add_signed(gained as i32);
            let changes = mine(index);
            if changes.is_empty() {
                continue;
            }
            let (old, new) = (&self.slots[index].chunk, slot.chunk.with_changes(changes, filtering));
            gained += new.eligible() as isize - old.eligible() as isize;
            out = out + new.out_count() - old.out_count();
            slot.chunk = shared(new);
        }
        eligible = eligible.wrapping_add_signed(gained);
        let (slots, eligible_before) = (slots.into_boxed_slice(), eligible_before.into_boxed_slice());
        ModelView { eligible, slots, eligible_before, filtering, len: self.len, out, capacity: self.capacity }
    }

    /// This view without `remove` (when listed) and with `add`; an `add` of
    /// the id `remove` had takes its place (a restart: routers never see the
    /// worker missing).
    pub(crate) fn with_member(&self, remove: Option<&Arc<WorkerEntry>>, add: Option<&Arc<WorkerEntry>>) -> ModelView {
        let filtering = self.filtering;
        let mut chunks: Vec<Shared> = self.slots.iter().map(|s| s.chunk.clone()).collect();
        let mut add = add;
        if let Some(place) = remove.and_then(|entry| self.find_entry(entry)) {
            let chunk = self.chunk(place);
            let replacing = add.filter(|new| new.id == chunk.id(place.local));
            let left = chunk.spliced(place.local, true, replacing, filtering);
            add = add.filter(|_| replacing.is_none());
            self.settle(&mut chunks, place.slot, left);
        }
        if let Some(new) = add {
            match chunks.partition_point(|c| c.id(0) <= new.id).checked_sub(1) {
                None if chunks.is_empty() => chunks.push(shared(Chunk::of(vec![new.clone()], filtering))),
                found => {
                    let slot = found.unwrap_or(0);
                    let chunk = &chunks[slot];
                    let grown = match chunk.search(new.id) {
                        Ok(at) => chunk.spliced(at, true, Some(new), filtering),
                        Err(at) => chunk.spliced(at, false, Some(new), filtering),
                    };
                    self.settle(&mut chunks, slot, grown);
                }
            }
        }
        ModelView::assemble(chunks, filtering, self.capacity)
    }

    /// Puts `chunk` in place of `chunks[slot]`: split in two when over
    /// capacity, dropped when empty, merged with a neighbour when the two
    /// fit in half a chunk (so a model of `n` instances has at most about
    /// `4n / capacity` chunks, however members come and go).
    fn settle(&self, chunks: &mut Vec<Shared>, slot: usize, chunk: Chunk) {
        if chunk.len() > self.capacity {
            // Halves, so that inserts anywhere stay cheap; but the last
            // chunk keeps a full one, so that ids registered in order fill
            // their chunks.
            let at = if slot + 1 == chunks.len() { self.capacity } else { chunk.len() / 2 };
            let (low, high) = chunk.entries().split_at(at);
            chunks[slot] = shared(Chunk::of(low.to_vec(), self.filtering));
            chunks.insert(slot + 1, shared(Chunk::of(high.to_vec(), self.filtering)));
            return;
        }
        if chunk.len() == 0 {
            chunks.remove(slot);
            return;
        }
        chunks[slot] = shared(chunk);
        // Only this chunk shrank or grew: only its two pairs can now fit in
        // half a chunk; merging one can make the merged chunk's other pair
        // fit, so repeat (at most a few times).
        let mut at = slot;
        loop {
            let fits =
                |low: usize| low + 1 < chunks.len() && chunks[low].len() + chunks[low + 1].len() <= self.capacity / 2;
            let low = match (at.checked_sub(1).filter(|&p| fits(p)), fits(at)) {
                (_, true) => at,
                (Some(previous), false) => previous,
                (None, false) => return,
            };
            let entries = chunks[low].entries().iter().chain(chunks[low + 1].entries()).cloned().collect();
            chunks[low] = shared(Chunk::of(entries, self.filtering));
            chunks.remove(low + 1);
            at = low;
        }
    }
}
