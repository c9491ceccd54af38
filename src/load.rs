//! Per-rank load: the [`RankLoad`] snapshot, the [`LoadReport`] that carries it,
//! and the cache-padded [`RankSlot`] that stores it in packed atomic words.

use crossbeam_utils::CachePadded;

use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// Identifies a worker instance (a process serving one model).
pub type WorkerId = u64;

/// One data-parallel rank's load, as last reported.
///
/// # Growing
///
/// Build it from [`Default`] and set the fields you know
/// (`RankLoad { active_decode_blocks: 3, kv_total_blocks: 8, ..Default::default() }`):
/// a field added later always has a default that means "not reported", so
/// such code keeps compiling and keeps its meaning. The same rule holds for
/// [`LoadReport`], [`BusyThresholds`](crate::BusyThresholds),
/// [`BusySignals`](crate::thresholds::BusySignals) and
/// [`MonitorConfig`](crate::MonitorConfig).
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
    /// Requests waiting in the engine's own queue (vLLM
    /// `num_requests_waiting`, llama.cpp `requests_deferred`). `0` for an
    /// engine without a queue: with the strict `>` of the threshold, 0 never
    /// makes a rank busy, so "no queue" and "an empty queue" decide alike.
    pub waiting_requests: u32,
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
            waiting_requests: self.waiting_requests.max(other.waiting_requests),
        }
    }
}

impl RankLoad {
    /// The field-wise sum of two publishers' loads (saturating numerators),
    /// each denominator from `self` unless `self` does not know it (0): the
    /// load several routers added together.
    #[inline]
    pub fn plus(&self, other: &RankLoad) -> RankLoad {
        RankLoad {
            active_decode_blocks: self.active_decode_blocks.saturating_add(other.active_decode_blocks),
            kv_total_blocks: if self.kv_total_blocks != 0 { self.kv_total_blocks } else { other.kv_total_blocks },
            active_prefill_tokens: self.active_prefill_tokens.saturating_add(other.active_prefill_tokens),
            max_num_batched_tokens: if self.max_num_batched_tokens != 0 {
                self.max_num_batched_tokens
            } else {
                other.max_num_batched_tokens
            },
            waiting_requests: self.waiting_requests.saturating_add(other.waiting_requests),
        }
    }
}

/// Who measured a load: the worker itself, this router from what it
/// dispatched, or another frontend of the same fleet from what it
/// dispatched (see [`MonitorConfig::shared`](crate::MonitorConfig::shared)).
///
/// Each publisher has its own slot, so none overwrites another. The busy
/// decision uses, field by field, the larger of the worker's own report and
/// the **sum** of what this router tracks and what every other frontend
/// published (fresh ones only).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Publisher {
    /// The worker's own report of its engine state.
    #[default]
    Worker,
    /// The router's own tracking of what it dispatched and not yet seen end.
    Router,
    /// The least the other frontends may hold of this router's shared
    /// publications, from what they acknowledged applying (the lease's
    /// reference, see `monitor::lease`). Kept only with other frontends.
    Echo,
    /// The load another frontend added (its own tracking, as it published
    /// it), by the index this monitor gave that frontend:
    /// `0..MonitorConfig::shared.frontends`.
    Frontend(u16),
}

impl Publisher {
    /// Slots of a rank with `frontends` other frontends kept: the worker's
    /// and the router's, and with others, the echo and one per other.
    #[inline]
    pub(crate) fn per_rank(frontends: u16) -> usize {
        if frontends == 0 {
            2
        } else {
            3 + usize::from(frontends)
        }
    }

    /// The slot of a rank this publisher writes, among `per_rank`.
    #[inline]
    pub(crate) fn index(self) -> usize {
        match self {
            Publisher::Worker => 0,
            Publisher::Router => 1,
            Publisher::Echo => 2,
            Publisher::Frontend(n) => 3 + usize::from(n),
        }
    }
}

/// One rank's load from one publisher.
///
/// # Freshness contract
///
/// - The worker picks its **incarnation** when it starts (a `u64`, e.g. its
///   start time in nanoseconds) and sends it at registration
///   ([`WorkerMonitor::register`](crate::WorkerMonitor::register)) and in
///   every report. A report whose incarnation is not the worker's current one
///   is dropped ([`Applied::OtherIncarnation`](crate::monitor::Applied::OtherIncarnation)).
/// - Registering again with a **different** incarnation (a restart) resets
///   the worker's slots; the **same** incarnation keeps them (a reconnect).
/// - Within an incarnation a report is applied iff its `seq` is greater than
///   the last one applied for that `(rank, publisher)`; the first report of
///   an incarnation is applied whatever its `seq` (0 included).
///
/// So no report can make later legitimate ones stale for longer than the
/// incarnation it claims: a restarted worker always starts clean.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LoadReport {
    /// The reporting worker.
    pub worker: WorkerId,
    /// The worker's incarnation, as it registered.
    pub incarnation: u64,
    /// The data-parallel rank, `0..dp_size`.
    pub rank: u32,
    /// Who measured it.
    pub publisher: Publisher,
    /// Increases with every report of this publisher for this rank within
    /// one incarnation.
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

/// `claim` bit: a writer is storing a report.
const WRITING: u32 = 1;
/// `claim` bit: `seq` holds the last applied sequence number.
const HAS_SEQ: u32 = 2;

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
    /// `waiting_requests` (no denominator).
    waiting: AtomicU32,
    /// [`WRITING`] | [`HAS_SEQ`]: one writer at a time stores a report.
    claim: AtomicU32,
    /// Last applied sequence number; read and written only by the claim's
    /// holder.
    seq: AtomicU64,
    /// Monitor-clock nanoseconds of the last applied report, or [`NEVER`].
    at: AtomicU64,
}

/// What [`RankSlot::store`] did with a report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotUpdate {
    /// Stored: the slot now holds this report, whole.
    Stored,
    /// Not newer than the last report applied: nothing changed.
    Stale,
    /// Another writer was storing a report in this slot at that moment;
    /// nothing changed (see [`RankSlot::store`]).
    Contended,
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
                waiting: AtomicU32::new(0),
                claim: AtomicU32::new(0),
                seq: AtomicU64::new(0),
                at: AtomicU64::new(NEVER),
            }),
        }
    }

    /// Stores `load` if this is the slot's first report or `seq` is above the
    /// last applied one.
    ///
    /// One writer at a time: a store that finds another store of the same
    /// slot in progress changes nothing and says [`SlotUpdate::Contended`]
    /// (it never waits). So two racing writers can never leave one report's
    /// values under the other's `seq`: the slot always holds the values of
    /// the report whose `seq` it records. The event plane reads each
    /// connection on one thread and a worker id belongs to one connection,
    /// so in the server the claim is never contended.
    #[inline]
    pub fn store(&self, seq: u64, load: &RankLoad, now: u64) -> SlotUpdate {
        let w = &*self.inner;
        // Acquire: on success, sees everything the previous holder wrote
        // before its Release of the claim (its seq above all).
        let claim = w.claim.fetch_or(WRITING, Ordering::Acquire);
        if claim & WRITING != 0 {
            return SlotUpdate::Contended;
        }
        // Relaxed: only the claim's holder touches `seq`; the claim orders it.
        if claim & HAS_SEQ != 0 && seq <= w.seq.load(Ordering::Relaxed) {
            // Release: hands the claim back as it was (a swap: see below).
            w.claim.swap(claim, Ordering::Release);
            return SlotUpdate::Stale;
        }
        // Relaxed: the words are published by the Release store of `at`
        // below, which readers acquire before reading them.
        w.blocks.store(pack(load.active_decode_blocks, load.kv_total_blocks), Ordering::Relaxed);
        w.tokens.store(pack(load.active_prefill_tokens, load.max_num_batched_tokens), Ordering::Relaxed);
        w.waiting.store(load.waiting_requests, Ordering::Relaxed);
        w.seq.store(seq, Ordering::Relaxed);
        // Release: a reader that acquires this timestamp sees the words
        // written before it (or later ones).
        w.at.store(now, Ordering::Release);
        // Release: the next holder's Acquire sees this report's seq. A swap,
        // not a plain store: as a read-modify-write it lands after every
        // claim attempt that saw this store in progress, so the bit such an
        // attempt set is cleared too. loom found a plain store there leaving
        // the slot claimed for good (loom-tests `rank_slot`).
        w.claim.swap(HAS_SEQ, Ordering::Release);
        SlotUpdate::Stored
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
        // Release: publishes the words to readers that acquire `at`.
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
        // Release: publishes the words to readers that acquire `at`.
        w.at.store(now, Ordering::Release);
    }

    /// Empties the slot (never reported, no seq, its numerators zero: the
    /// router's next `add` counts from nothing), unless a store holds it at
    /// that moment ([`SlotUpdate::Contended`]; nothing changed then). The
    /// denominators stay (a tracked capacity is configuration, not load).
    pub(crate) fn clear(&self) -> SlotUpdate {
        let w = &*self.inner;
        // Acquire: as in `store`, the previous holder's writes are seen.
        let claim = w.claim.fetch_or(WRITING, Ordering::Acquire);
        if claim & WRITING != 0 {
            return SlotUpdate::Contended;
        }
        // AcqRel RMWs, as in `set_denominators`: each number of an `add`
        // racing the clear lands before it (cleared) or after it (counted
        // from zero); the two numbers of one `add` may land on either side.
        let _ = w.blocks.fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| Some(pack(0, unpack(word).1)));
        let _ = w.tokens.fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| Some(pack(0, unpack(word).1)));
        // Relaxed: published by the Release store of `at` (a reader of
        // NEVER reads no word at all).
        w.waiting.store(0, Ordering::Relaxed);
        // Release: a reader that acquires NEVER reads nothing of the words.
        w.at.store(NEVER, Ordering::Release);
        // Release: hands the claim back without HAS_SEQ (a swap: as in `store`).
        w.claim.swap(0, Ordering::Release);
        SlotUpdate::Stored
    }

    /// The stored load and the time it was stored, or `None` if never reported.
    #[inline]
    pub fn load(&self) -> Option<(RankLoad, u64)> {
        let w = &*self.inner;
        // Acquire: pairs with the writers' Release store of `at`, so the
        // words read below are at least as new as that report's.
        let at = w.at.load(Ordering::Acquire);
        if at == NEVER {
            return None;
        }
        // Relaxed: ordered after the Acquire above; each word is one pair.
        let (active_decode_blocks, kv_total_blocks) = unpack(w.blocks.load(Ordering::Relaxed));
        let (active_prefill_tokens, max_num_batched_tokens) = unpack(w.tokens.load(Ordering::Relaxed));
        let waiting_requests = w.waiting.load(Ordering::Relaxed);
        let load = RankLoad {
            active_decode_blocks,
            kv_total_blocks,
            active_prefill_tokens,
            max_num_batched_tokens,
            waiting_requests,
        };
        Some((load, at))
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
    fn store_applies_the_first_report_and_then_only_newer_ones() {
        let slot = RankSlot::new();
        let a = RankLoad {
            active_decode_blocks: 1,
            kv_total_blocks: 2,
            active_prefill_tokens: 3,
            max_num_batched_tokens: 4,
            waiting_requests: 5,
        };
        let b = RankLoad { active_prefill_tokens: 9, ..a };
        assert_eq!(slot.load(), None);
        assert_eq!(slot.store(0, &a, 5), SlotUpdate::Stored, "the first report applies, seq 0 included");
        assert_eq!(slot.load(), Some((a, 5)));
        assert_eq!(slot.store(0, &b, 6), SlotUpdate::Stale);
        assert_eq!(slot.store(3, &a, 7), SlotUpdate::Stored);
        assert_eq!(slot.load(), Some((a, 7)), "a store of the same values still refreshes the time");
        assert_eq!(slot.store(2, &b, 8), SlotUpdate::Stale, "older than 3");
        assert_eq!(slot.store(4, &b, 8), SlotUpdate::Stored);
        assert_eq!(slot.load(), Some((b, 8)));
        assert_eq!(slot.store(u64::MAX, &a, 9), SlotUpdate::Stored);
        assert_eq!(slot.store(u64::MAX, &b, 10), SlotUpdate::Stale);
        assert_eq!(slot.load(), Some((a, 9)));
    }

    #[test]
    fn a_store_during_another_store_changes_nothing() {
        let slot = RankSlot::new();
        let a = RankLoad { active_decode_blocks: 1, ..Default::default() };
        assert_eq!(slot.store(1, &a, 1), SlotUpdate::Stored);
        // Hold the claim as a writer in the middle of its store would.
        slot.inner.claim.fetch_or(WRITING, Ordering::Relaxed);
        let b = RankLoad { active_decode_blocks: 2, ..Default::default() };
        assert_eq!(slot.store(2, &b, 2), SlotUpdate::Contended);
        assert_eq!(slot.load(), Some((a, 1)));
        slot.inner.claim.fetch_and(!WRITING, Ordering::Relaxed);
        assert_eq!(slot.store(2, &b, 2), SlotUpdate::Stored);
        assert_eq!(slot.load(), Some((b, 2)));
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
            waiting_requests: 0,
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
            waiting_requests: 2,
        };
        let tracked = RankLoad {
            active_decode_blocks: 9,
            kv_total_blocks: 100,
            active_prefill_tokens: 1,
            max_num_batched_tokens: 32,
            waiting_requests: 0,
        };
        let merged = reported.max_with(&tracked);
        assert_eq!(
            merged,
            RankLoad {
                active_decode_blocks: 9,
                kv_total_blocks: 100,
                active_prefill_tokens: 50,
                max_num_batched_tokens: 64,
                waiting_requests: 2,
            }
        );
    }
}
