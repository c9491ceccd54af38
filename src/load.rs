//! Per-rank load: the [`RankLoad`] snapshot, the [`LoadReport`] that carries it,
//! and the cache-padded [`RankSlot`] that stores it in packed atomic words.

use crossbeam_utils::CachePadded;

use crate::sync::{AtomicU64, Ordering};

/// Identifies a worker instance (a process serving one model).
pub type WorkerId = u64;

/// One data-parallel rank's load, as last reported.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RankLoad {
    /// KV-cache blocks held by running sequences.
    pub active_decode_blocks: u32,
    /// KV-cache blocks the rank has in all; `0` means unknown.
    pub kv_total_blocks: u32,
    /// Prompt tokens admitted but not yet prefilled.
    pub active_prefill_tokens: u32,
    /// The engine's per-step token budget; `0` means unknown.
    pub max_num_batched_tokens: u32,
}

impl RankLoad {
    /// The field-wise combination the busy decision uses: the larger
    /// numerators, and each denominator from `self` unless `self` does not
    /// know it (0).
    #[inline]
    pub fn max_with(&self, other: &RankLoad) -> RankLoad {
        RankLoad {
            active_decode_blocks: self.active_decode_blocks.max(other.active_decode_blocks),
            kv_total_blocks: if self.kv_total_blocks != 0 { self.kv_total_blocks } else { other.kv_total_blocks },
            active_prefill_tokens: self.active_prefill_tokens.max(other.active_prefill_tokens),
            max_num_batched_tokens: if self.max_num_batched_tokens != 0 {
                self.max_num_batched_tokens
            } else {
                other.max_num_batched_tokens
            },
        }
    }
}

/// Who measured a load: the worker itself, or the router from what it dispatched.
///
/// The two are stored apart and never overwrite each other; the busy decision
/// uses the larger of the two.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Publisher {
    /// The worker's own report of its engine state.
    Worker,
    /// The router's own tracking of what it dispatched and not yet seen end.
    Router,
}

impl Publisher {
    pub(crate) const COUNT: usize = 2;

    #[inline]
    pub(crate) fn index(self) -> usize {
        match self {
            Publisher::Worker => 0,
            Publisher::Router => 1,
        }
    }
}

/// One rank's load from one publisher, with its sequence number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LoadReport {
    /// The reporting worker.
    pub worker: WorkerId,
    /// The data-parallel rank, `0..dp_size`.
    pub rank: u32,
    /// Who measured it.
    pub publisher: Publisher,
    /// Increases with every report of this publisher for this rank; a report
    /// whose `seq` is not above the last applied one is dropped.
    pub seq: u64,
    /// The load itself.
    pub load: RankLoad,
}

#[inline]
fn pack(hi: u32, lo: u32) -> u64 {
    (u64::from(hi) << 32) | u64::from(lo)
}

#[inline]
fn unpack(word: u64) -> (u32, u32) {
    ((word >> 32) as u32, word as u32)
}

/// A timestamp value meaning "never reported".
const NEVER: u64 = u64::MAX;

/// One publisher's latest load for one rank.
///
/// Each numerator/denominator pair lives in ONE atomic word, so a reader never
/// pairs a new numerator with an old denominator. Padded to its own cache line
/// because the event-plane thread writes it while routers read neighbours.
#[derive(Debug)]
pub struct RankSlot {
    inner: CachePadded<SlotWords>,
}

#[derive(Debug)]
struct SlotWords {
    /// `active_decode_blocks << 32 | kv_total_blocks`.
    blocks: AtomicU64,
    /// `active_prefill_tokens << 32 | max_num_batched_tokens`.
    tokens: AtomicU64,
    /// Last applied sequence number (0 = none yet).
    seq: AtomicU64,
    /// Monitor-clock nanoseconds of the last applied report, or [`NEVER`].
    at: AtomicU64,
}

/// What [`RankSlot::store`] did with a report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotUpdate {
    /// The report was not newer than the last one applied; nothing changed.
    Stale,
    /// The report was stored and the values are the same as before.
    Unchanged,
    /// The report was stored and some value changed.
    Changed,
}

impl Default for RankSlot {
    fn default() -> Self {
        Self::new()
    }
}

impl RankSlot {
    /// An empty slot: never reported.
    pub fn new() -> Self {
        RankSlot {
            inner: CachePadded::new(SlotWords {
                blocks: AtomicU64::new(0),
                tokens: AtomicU64::new(0),
                seq: AtomicU64::new(0),
                at: AtomicU64::new(NEVER),
            }),
        }
    }

    /// Stores `load` if `seq` is above the last applied sequence number.
    ///
    /// Reports of one publisher for one rank are expected from one thread at a
    /// time (the event plane reads each connection on one thread); two racing
    /// stores of the same slot may leave the older report's values, but never
    /// a torn pair.
    #[inline]
    pub fn store(&self, seq: u64, load: &RankLoad, now: u64) -> SlotUpdate {
        let w = &*self.inner;
        // Relaxed: the seq word only orders reports of one publisher, whose
        // stores come from one thread; readers synchronise via the worker's
        // version counter (see `WorkerMonitor::apply`).
        if w.seq.fetch_max(seq, Ordering::Relaxed) >= seq {
            return SlotUpdate::Stale;
        }
        let blocks = pack(load.active_decode_blocks, load.kv_total_blocks);
        let tokens = pack(load.active_prefill_tokens, load.max_num_batched_tokens);
        // Release: a reader that acquires a word sees the timestamp and seq
        // written before it. The swaps return the old words to detect change.
        let old_blocks = w.blocks.swap(blocks, Ordering::AcqRel);
        let old_tokens = w.tokens.swap(tokens, Ordering::AcqRel);
        let was_fresh = w.at.swap(now, Ordering::AcqRel) != NEVER;
        if was_fresh && old_blocks == blocks && old_tokens == tokens {
            SlotUpdate::Unchanged
        } else {
            SlotUpdate::Changed
        }
    }

    /// Adds `delta` blocks and tokens to the stored numerators (saturating);
    /// the router-tracked publisher's path, which needs no sequence numbers.
    #[inline]
    pub(crate) fn add(&self, blocks: i64, tokens: i64, now: u64) {
        let w = &*self.inner;
        // AcqRel RMWs: increments from many request threads must all land.
        let _ = w.blocks.fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
            let (a, t) = unpack(word);
            Some(pack(offset(a, blocks), t))
        });
        let _ = w.tokens.fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
            let (a, t) = unpack(word);
            Some(pack(offset(a, tokens), t))
        });
        w.at.store(now, Ordering::Release);
    }

    /// Replaces the denominators, keeping the numerators (router-tracked
    /// capacity).
    #[inline]
    pub(crate) fn set_denominators(&self, kv_total_blocks: u32, max_num_batched_tokens: u32, now: u64) {
        let w = &*self.inner;
        // AcqRel RMWs: must not lose a concurrent `add` to the numerators.
        let _ = w
            .blocks
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| Some(pack(unpack(word).0, kv_total_blocks)));
        let _ = w.tokens.fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
            Some(pack(unpack(word).0, max_num_batched_tokens))
        });
        w.at.store(now, Ordering::Release);
    }

    /// The stored load and the time it was stored, or `None` if never reported.
    #[inline]
    pub fn load(&self) -> Option<(RankLoad, u64)> {
        let w = &*self.inner;
        // Acquire: pairs with the stores' AcqRel swaps.
        let at = w.at.load(Ordering::Acquire);
        if at == NEVER {
            return None;
        }
        let (active_decode_blocks, kv_total_blocks) = unpack(w.blocks.load(Ordering::Acquire));
        let (active_prefill_tokens, max_num_batched_tokens) = unpack(w.tokens.load(Ordering::Acquire));
        Some((RankLoad { active_decode_blocks, kv_total_blocks, active_prefill_tokens, max_num_batched_tokens }, at))
    }
}

#[inline]
fn offset(value: u32, delta: i64) -> u32 {
    // Saturating: a caller's extreme delta must not overflow the i64 sum.
    i64::from(value).saturating_add(delta).clamp(0, i64::from(u32::MAX)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_round_trips() {
        for (hi, lo) in [(0, 0), (1, 0), (0, 1), (u32::MAX, 0), (0, u32::MAX), (u32::MAX, u32::MAX), (0xdead_beef, 7)] {
            assert_eq!(unpack(pack(hi, lo)), (hi, lo));
        }
    }

    #[test]
    fn offset_saturates_both_ways() {
        assert_eq!(offset(5, -10), 0);
        assert_eq!(offset(5, 3), 8);
        assert_eq!(offset(u32::MAX - 1, 5), u32::MAX);
        assert_eq!(offset(7, i64::MIN), 0);
        assert_eq!(offset(7, i64::MAX), u32::MAX);
    }

    #[test]
    fn store_reports_stale_unchanged_and_changed() {
        let slot = RankSlot::new();
        let a = RankLoad {
            active_decode_blocks: 1,
            kv_total_blocks: 2,
            active_prefill_tokens: 3,
            max_num_batched_tokens: 4,
        };
        let b = RankLoad { active_prefill_tokens: 9, ..a };
        assert_eq!(slot.load(), None);
        assert_eq!(slot.store(0, &a, 5), SlotUpdate::Stale, "0 is never above the initial sequence");
        assert_eq!(slot.load(), None);
        assert_eq!(slot.store(1, &a, 5), SlotUpdate::Changed, "the first store is a change");
        assert_eq!(slot.load(), Some((a, 5)));
        assert_eq!(slot.store(1, &b, 6), SlotUpdate::Stale);
        assert_eq!(slot.store(3, &a, 7), SlotUpdate::Unchanged);
        assert_eq!(slot.load(), Some((a, 7)), "an unchanged store still refreshes the time");
        assert_eq!(slot.store(2, &b, 8), SlotUpdate::Stale, "older than 3");
        assert_eq!(slot.store(4, &b, 8), SlotUpdate::Changed);
        assert_eq!(slot.load(), Some((b, 8)));
    }

    #[test]
    fn add_and_set_denominators_keep_the_other_half() {
        let slot = RankSlot::new();
        slot.set_denominators(100, 512, 1);
        slot.add(30, 40, 2);
        slot.add(-10, 0, 3);
        let expected = RankLoad {
            active_decode_blocks: 20,
            kv_total_blocks: 100,
            active_prefill_tokens: 40,
            max_num_batched_tokens: 512,
        };
        assert_eq!(slot.load(), Some((expected, 3)));
        slot.set_denominators(0, 1, 4);
        let expected = RankLoad { kv_total_blocks: 0, max_num_batched_tokens: 1, ..expected };
        assert_eq!(slot.load(), Some((expected, 4)));
    }

    #[test]
    fn max_with_takes_larger_numerators_and_known_denominators() {
        let reported = RankLoad {
            active_decode_blocks: 5,
            kv_total_blocks: 0,
            active_prefill_tokens: 50,
            max_num_batched_tokens: 64,
        };
        let tracked = RankLoad {
            active_decode_blocks: 9,
            kv_total_blocks: 100,
            active_prefill_tokens: 1,
            max_num_batched_tokens: 32,
        };
        let merged = reported.max_with(&tracked);
        assert_eq!(
            merged,
            RankLoad {
                active_decode_blocks: 9,
                kv_total_blocks: 100,
                active_prefill_tokens: 50,
                max_num_batched_tokens: 64
            }
        );
    }
}
