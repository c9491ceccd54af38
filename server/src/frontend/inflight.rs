//! What in-flight requests hold: [`InFlight`] counts them (and, in `kv`
//! mode, the load the router tracked for them); a [`Held`] guard per request
//! gives it all back when dropped, whatever ended the response.
//!
//! Requests to an engine (`--engine`) always have their prompt tokens
//! tracked as prefill until the first response bytes arrive, since no
//! engine reports the prefill it has not yet done; but no blocks: an engine
//! reports its own KV use, in its own unit (tokens for llama.cpp, vLLM's
//! blocks, or a fraction), which the router's 16-token blocks do not match.
//! Prompt tokens are counted as in `kv` mode (`crate::tokens`): a token-id
//! prompt by its length, text by its whitespace-separated words; no
//! engine's `/tokenize` is asked (a round trip before every request). A
//! non-streamed answer's first bytes are the whole answer, so its prompt
//! counts as prefill until the answer is ready.

use std::collections::HashMap;
use std::fmt;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use std::time::Instant;

use loadgate::{WorkerId, WorkerMonitor};
use tokio::sync::Notify;

use crate::directory::WorkerAddress;
use crate::frontend::retry_hint::RetryHint;
use crate::nats::sharing::changes::Changes;
use crate::tokens::{blocks_for, SseEvents};

/// Frontend-wide totals of what in-flight requests hold.
#[derive(Debug)]
pub struct InFlight {
    monitor: Arc<WorkerMonitor>,
    /// `Some` in `kv` mode: track load per worker, and also output blocks.
    tracking: Option<Tracking>,
    /// Engines are configured: track the prefill of requests sent to them.
    engines: bool,
    requests: AtomicU64,
    tracked_blocks: AtomicU64,
    tracked_prefill_tokens: AtomicU64,
    /// Spreads tracked requests over a worker's ranks.
    next_rank: AtomicUsize,
    /// Learns how long requests take (for the retry hint).
    hint: Arc<RetryHint>,
    /// Where each change of the tracked load is noted for the other
    /// frontends (set once the NATS plane shares load).
    changes: OnceLock<Changes>,
    /// With `--engine-scrape-on-end`: what to notify, per engine worker,
    /// when a request sent to it ends (its engine's scraper).
    ends: OnceLock<HashMap<WorkerId, Arc<Notify>>>,
}

/// How the router tracks its own load (`--router-mode kv`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tracking {
    /// Also add blocks for output tokens as they stream
    /// (`--router-track-output-blocks`).
    pub output_blocks: bool,
}

/// Totals, for `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InFlightTotals {
    /// Requests dispatched to a worker whose response has not ended.
    pub requests: u64,
    /// KV blocks the router tracks for them.
    pub tracked_blocks: u64,
    /// Prefill tokens the router tracks for them.
    pub tracked_prefill_tokens: u64,
}

impl InFlight {
    /// A ledger over `monitor`; `tracking` enables the router's own load,
    /// `engines` its prefill tracking for requests to engines; each finished
    /// request's duration goes to `hint`.
    pub fn new(monitor: Arc<WorkerMonitor>, tracking: Option<Tracking>, engines: bool, hint: Arc<RetryHint>) -> Self {
        InFlight {
            hint,
            monitor,
            tracking,
            engines,
            requests: AtomicU64::new(0),
            tracked_blocks: AtomicU64::new(0),
            tracked_prefill_tokens: AtomicU64::new(0),
            next_rank: AtomicUsize::new(0),
            changes: OnceLock::new(),
            ends: OnceLock::new(),
        }
    }

    /// From now on, the end of a request sent to one of `ends`' workers
    /// notifies its engine's scraper (a slot may have freed); once.
    pub(crate) fn scrape_on_end(&self, ends: HashMap<WorkerId, Arc<Notify>>) {
        let _ = self.ends.set(ends);
    }

    /// From now on, notes every change of the tracked load in `changes`
    /// (the load this frontend publishes to the others); once.
    pub(crate) fn share_changes(&self, changes: Changes) {
        let _ = self.changes.set(changes);
    }

    /// The tracked load of `worker`'s `rank` changed.
    fn changed(&self, worker: WorkerId, rank: u32) {
        if let Some(changes) = self.changes.get() {
            changes.note(worker, rank);
        }
    }

    /// Whether the router tracks its own load (so requests' prompt tokens
    /// must be counted): in `kv` mode, or with engines configured.
    pub fn tracking(&self) -> bool {
        self.tracking.is_some() || self.engines
    }

    /// Counts a request dispatched to `worker` (at `address`) and adds its
    /// prompt to the router-tracked load of one rank: blocks and prefill in
    /// `kv` mode, prefill alone for an engine.
    pub fn hold(self: &Arc<Self>, worker: WorkerId, address: &WorkerAddress, prompt_tokens: u64) -> Held {
        // Relaxed: a gauge; no other memory depends on it.
        self.requests.fetch_add(1, Ordering::Relaxed);
        let track_blocks = self.tracking.is_some() && !address.engine;
        let track_prefill = self.tracking.is_some() || (self.engines && address.engine);
        let mut held = Held {
            ledger: self.clone(),
            worker,
            engine: address.engine,
            // The tracked load belongs to this registration of the worker:
            // after a restart, or a deregistration and a new registration
            // of the same incarnation, what this request gives back must
            // not come off the new one's load. (A worker not registered
            // tracks nothing: no registration is numbered 0.)
            life: if track_prefill { self.monitor.worker_life(worker).unwrap_or(0) } else { 0 },
            rank: 0,
            prompt_tokens,
            blocks: 0,
            prefill_tokens: 0,
            events: self.tracking.filter(|t| t.output_blocks && track_blocks).map(|_| SseEvents::default()),
            started: false,
            since: Instant::now(),
            answered: false,
        };
        if track_prefill {
            // Relaxed: only spreads load; any interleaving is fine.
            held.rank = (self.next_rank.fetch_add(1, Ordering::Relaxed) % address.dp_size.max(1) as usize) as u32;
            let blocks = if track_blocks { blocks_for(prompt_tokens) } else { 0 };
            held.add(blocks, prompt_tokens);
        }
        held
    }

    /// The current totals.
    pub fn totals(&self) -> InFlightTotals {
        // Relaxed: gauges read independently.
        InFlightTotals {
            requests: self.requests.load(Ordering::Relaxed),
            tracked_blocks: self.tracked_blocks.load(Ordering::Relaxed),
            tracked_prefill_tokens: self.tracked_prefill_tokens.load(Ordering::Relaxed),
        }
    }
}

/// What one request holds; dropping it releases everything. The proxy keeps
/// it in the response body stream, so it lives exactly as long as the
/// response: finished, failed, worker gone or client gone.
pub struct Held {
    ledger: Arc<InFlight>,
    worker: WorkerId,
    /// Sent to an engine (`--engine`).
    engine: bool,
    /// The worker's registration ([`WorkerMonitor::worker_life`]).
    life: u64,
    rank: u32,
    prompt_tokens: u64,
    blocks: u64,
    prefill_tokens: u64,
    /// Counts streamed tokens when output blocks are tracked.
    events: Option<SseEvents>,
    started: bool,
    /// When it was dispatched.
    since: Instant,
    /// The worker answered it (not a refusal or a failure): its duration
    /// counts towards the retry hint.
    answered: bool,
}

impl fmt::Debug for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Held")
            .field("worker", &self.worker)
            .field("rank", &self.rank)
            .field("blocks", &self.blocks)
            .field("prefill_tokens", &self.prefill_tokens)
            .finish()
    }
}

impl Held {
    /// The worker answered (a response is being relayed): when this is
    /// dropped, the request's duration teaches the retry hint.
    pub fn answered(&mut self) {
        self.answered = true;
    }

    /// A chunk of the response body arrived: the prompt is prefilled (its
    /// prefill tokens are released at the first chunk), and with output-block
    /// tracking, the blocks grow with the tokens streamed so far.
    pub fn on_chunk(&mut self, chunk: &[u8]) {
        if !self.started {
            self.started = true;
            let prefill = self.prefill_tokens;
            self.sub(0, prefill);
        }
        if let Some(events) = self.events.as_mut() {
            let generated = events.feed(chunk);
            let want = blocks_for(self.prompt_tokens + generated);
            if want > self.blocks {
                self.add(want - self.blocks, 0);
            }
        }
    }

    fn add(&mut self, blocks: u64, prefill_tokens: u64) {
        if blocks == 0 && prefill_tokens == 0 {
            return;
        }
        self.blocks += blocks;
        self.prefill_tokens += prefill_tokens;
        // Relaxed: gauges.
        self.ledger.tracked_blocks.fetch_add(blocks, Ordering::Relaxed);
        self.ledger.tracked_prefill_tokens.fetch_add(prefill_tokens, Ordering::Relaxed);
        let _ =
            self.ledger.monitor.track_life(self.worker, self.life, self.rank, signed(blocks), signed(prefill_tokens));
        self.ledger.changed(self.worker, self.rank);
    }

    fn sub(&mut self, blocks: u64, prefill_tokens: u64) {
        if blocks == 0 && prefill_tokens == 0 {
            return;
        }
        self.blocks -= blocks;
        self.prefill_tokens -= prefill_tokens;
        // Relaxed: gauges; never below zero, since each guard only removes what it added.
        self.ledger.tracked_blocks.fetch_sub(blocks, Ordering::Relaxed);
        self.ledger.tracked_prefill_tokens.fetch_sub(prefill_tokens, Ordering::Relaxed);
        // The worker may be gone (deregistered) or restarted: nothing left to
        // release then.
        let _ =
            self.ledger.monitor.track_life(self.worker, self.life, self.rank, -signed(blocks), -signed(prefill_tokens));
        self.ledger.changed(self.worker, self.rank);
    }
}

fn signed(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Drop for Held {
    fn drop(&mut self) {
        self.sub(self.blocks, self.prefill_tokens);
        if self.answered {
            self.ledger.hint.finished(self.since.elapsed());
        }
        if self.engine {
            if let Some(wake) = self.ledger.ends.get().and_then(|ends| ends.get(&self.worker)) {
                // Its slot, if it had one, is usually free now (a client that
                // left is seen at the engine's next write): the engine's
                // scraper looks at once (one stored permit however many end).
                wake.notify_one();
            }
        }
        // Relaxed: a gauge.
        self.ledger.requests.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use loadgate::{MonitorConfig, RankLoad};

    use super::*;

    fn address(dp_size: u32, engine: bool) -> WorkerAddress {
        WorkerAddress { base_url: "http://127.0.0.1:1".into(), dp_size, engine, assembles: false }
    }

    fn tracked(monitor: &WorkerMonitor, worker: WorkerId) -> RankLoad {
        monitor.rank_snapshots().into_iter().find(|s| s.worker == worker).and_then(|s| s.tracked).unwrap_or_default()
    }

    #[test]
    fn guard_releases_everything_it_tracked() {
        let monitor = Arc::new(WorkerMonitor::new(MonitorConfig::default()).unwrap());
        monitor.register(1, "m", 1, 0).unwrap();
        let ledger = Arc::new(InFlight::new(
            monitor.clone(),
            Some(Tracking { output_blocks: true }),
            false,
            Arc::new(RetryHint::computed()),
        ));
        let mut held = ledger.hold(1, &address(1, false), 20);
        assert_eq!(ledger.totals(), InFlightTotals { requests: 1, tracked_blocks: 2, tracked_prefill_tokens: 20 });
        assert_eq!(tracked(&monitor, 1).active_decode_blocks, 2);
        assert_eq!(tracked(&monitor, 1).active_prefill_tokens, 20);
        // First token: prefill released. 13 more tokens: 33 tokens need 3 blocks.
        held.on_chunk(b"data: {}\n\n");
        assert_eq!(tracked(&monitor, 1).active_prefill_tokens, 0);
        held.on_chunk(&b"data: {}\n\n".repeat(12));
        assert_eq!(ledger.totals().tracked_blocks, 3);
        assert_eq!(tracked(&monitor, 1).active_decode_blocks, 3);
        drop(held);
        assert_eq!(ledger.totals(), InFlightTotals::default());
        assert_eq!(tracked(&monitor, 1), RankLoad::default());
    }

    #[test]
    fn without_tracking_only_requests_are_counted() {
        let monitor = Arc::new(WorkerMonitor::new(MonitorConfig::default()).unwrap());
        monitor.register(1, "m", 1, 0).unwrap();
        let ledger = Arc::new(InFlight::new(monitor.clone(), None, false, Arc::new(RetryHint::computed())));
        let held = ledger.hold(1, &address(1, false), 100);
        assert_eq!(ledger.totals(), InFlightTotals { requests: 1, ..Default::default() });
        assert!(monitor.rank_snapshots()[0].tracked.is_none());
        drop(held);
        assert_eq!(ledger.totals().requests, 0);
    }

    /// A worker whose connection stayed closed past the deregistration
    /// grace (a frozen process, a link down for more than 500 ms) is
    /// deregistered, then registers again in the same incarnation: fresh
    /// slots. A request dispatched before it left, ending after, gave its
    /// load back to the new registration (the guard told lives apart by
    /// incarnation only), taking off a later request's. Found by a review.
    #[test]
    fn a_request_from_before_a_deregistration_gives_nothing_back_to_the_next_registration() {
        let monitor = Arc::new(WorkerMonitor::new(MonitorConfig::default()).unwrap());
        monitor.register(1, "m", 1, 5).unwrap();
        let ledger = Arc::new(InFlight::new(
            monitor.clone(),
            Some(Tracking { output_blocks: false }),
            false,
            Arc::new(RetryHint::computed()),
        ));
        let before = ledger.hold(1, &address(1, false), 20);
        assert!(monitor.deregister_incarnation(1, 5));
        monitor.register(1, "m", 1, 5).unwrap();
        let after = ledger.hold(1, &address(1, false), 20);
        assert_eq!(tracked(&monitor, 1).active_decode_blocks, 2, "the request dispatched after");
        drop(before);
        assert_eq!(tracked(&monitor, 1).active_decode_blocks, 2, "the earlier request took the later one's blocks");
        drop(after);
        assert_eq!(tracked(&monitor, 1).active_decode_blocks, 0);
        // A reconnect (the same registration kept) gives back as before.
        let held = ledger.hold(1, &address(1, false), 20);
        monitor.register(1, "m", 1, 5).unwrap();
        assert_eq!(tracked(&monitor, 1).active_decode_blocks, 2, "a reconnect keeps the slots");
        drop(held);
        assert_eq!(tracked(&monitor, 1).active_decode_blocks, 0);
    }

    /// With engines configured and no `kv` mode: a request to an engine has
    /// its prompt tracked as prefill (no blocks) until its first bytes, on
    /// the engine's ranks in turn; one to a worker tracks nothing.
    #[test]
    fn requests_to_engines_track_prefill_alone() {
        let monitor = Arc::new(WorkerMonitor::new(MonitorConfig::default()).unwrap());
        monitor.register(1, "m", 2, 0).unwrap();
        monitor.register(2, "m", 1, 0).unwrap();
        let ledger = Arc::new(InFlight::new(monitor.clone(), None, true, Arc::new(RetryHint::computed())));
        assert!(ledger.tracking(), "prompt tokens must be counted");
        let mut first = ledger.hold(1, &address(2, true), 40);
        let second = ledger.hold(1, &address(2, true), 7);
        let to_worker = ledger.hold(2, &address(1, false), 100);
        assert_eq!(ledger.totals(), InFlightTotals { requests: 3, tracked_blocks: 0, tracked_prefill_tokens: 47 });
        let ranks: Vec<u32> = monitor
            .rank_snapshots()
            .into_iter()
            .filter(|s| s.worker == 1)
            .map(|s| s.tracked.unwrap_or_default().active_prefill_tokens)
            .collect();
        assert_eq!(ranks, [40, 7], "spread over the engine's ranks");
        assert_eq!(tracked(&monitor, 2), RankLoad::default());
        first.on_chunk(b"{\"choices\":[]}");
        assert_eq!(ledger.totals().tracked_prefill_tokens, 7);
        drop((first, second, to_worker));
        assert_eq!(ledger.totals(), InFlightTotals::default());
    }
}
