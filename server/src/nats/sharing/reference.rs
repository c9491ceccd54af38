//! [`Reference`]: what every other live frontend has surely applied of this
//! frontend's published load, per (worker, rank): the lease's reference
//! (the monitor's `Publisher::Echo`, see `loadgate::monitor` `lease`).
//!
//! The lease's bound needs each frontend's view of this one to be at least
//! the reference. A frontend's own publication coming back from NATS does
//! not say that: another frontend busy with requests may apply it later
//! than this one hears it back, and then admits against headroom this one
//! already took (seen on a busy 2-core machine: 1.7× a threshold where the
//! bound said 1.3×). So the others say what they applied: each
//! acknowledges, in a `FrontendAck`, the seqs of this frontend's
//! `FrontendLoad` frames it applied in order (`first..=seq`, no gap), and
//! the reference is, per (worker, rank), the least any live peer may hold
//! of it:
//!
//! ```text
//! peer's least = min(its last publication with seq ≤ the peer's ack
//!                        (nothing if before the peer's first),
//!                    every later publication)
//! reference    = that least, field by field, over the live peers
//! ```
//!
//! A peer with no acknowledgement yet (it just joined), or whose last
//! acknowledged frame was sent more than the staleness ago, holds nothing
//! of this frontend: a peer that stopped hearing this one stops counting
//! its load no sooner than that (its own staleness runs from when it last
//! heard a frame, which was sent before). A peer that starts a new run (it
//! missed frames, dropped a worker's slots, registered a worker it had
//! dropped frames for, or was silent: see `peers`) holds nothing from
//! before the run, and this frontend publishes everything again at its
//! next beat. The history kept per (worker, rank)
//! starts at the last publication every live peer acknowledged and holds
//! at most [`MAX_HISTORY`] more (two merged into the earlier one's seq,
//! with the smaller figures: the reference only errs low, which makes this
//! frontend more careful, never the fleet fuller).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use loadgate::monitor::Publisher;
use loadgate::{LoadReport, RankLoad, WorkerId, WorkerMonitor};

/// The most publications kept per (worker, rank) past the acknowledged one.
pub(crate) const MAX_HISTORY: usize = 16;

type Key = (WorkerId, u32);

/// What one peer acknowledged of this frontend: `first..=seq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Acked {
    first: u64,
    seq: u64,
}

struct Peer {
    incarnation: u64,
    acked: Option<Acked>,
    /// When the last frame `acked` covers was sent.
    sent: Option<Instant>,
}

impl Peer {
    /// A peer of `incarnation` that acknowledged nothing yet.
    fn new(incarnation: u64) -> Self {
        Peer { incarnation, acked: None, sent: None }
    }
}

/// One (worker, rank)'s publications, oldest first, and its reference.
struct History {
    worker_incarnation: u64,
    published: VecDeque<(u64, RankLoad)>,
    reference: Option<RankLoad>,
}

#[derive(Default)]
struct State {
    keys: HashMap<Key, History>,
    /// Each kept publication's seq, to its key.
    by_seq: BTreeMap<u64, Key>,
    /// When each publication of the last staleness was sent.
    sent: BTreeMap<u64, Instant>,
    /// The last seq published.
    last: u64,
    peers: HashMap<u64, Peer>,
    /// The seq of the monitor's echo reports.
    echo_seq: u64,
}

/// This frontend's lease reference, fed to its monitor.
pub(crate) struct Reference {
    monitor: Arc<WorkerMonitor>,
    /// How long a peer's acknowledgement holds after the frame it covers
    /// was sent: seven eighths of the others' staleness (three beats), the
    /// eighth to spare for the checks' own pace (`set_live`, every 50 ms
    /// at most, against 75 ms at the default beat).
    holds_for: Duration,
    state: Mutex<State>,
}

/// What an acknowledgement did ([`Reference::acked`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Acknowledged {
    /// Nothing new.
    Nothing,
    /// The run it acknowledges grew.
    Grew,
    /// A new run: the peer holds nothing from before it (publish
    /// everything again).
    NewRun,
}

impl Reference {
    pub(crate) fn new(monitor: Arc<WorkerMonitor>, staleness: Duration) -> Self {
        Reference { monitor, holds_for: staleness - staleness / 8, state: Mutex::default() }
    }

    /// This frontend is about to publish `load` for `key` as `seq` (before
    /// it sends: an acknowledgement cannot come first).
    pub(crate) fn published(&self, key: Key, worker_incarnation: u64, seq: u64, load: RankLoad) {
        let mut state = self.lock();
        let state = &mut *state;
        let history = state.keys.entry(key).or_insert_with(|| History {
            worker_incarnation,
            published: VecDeque::new(),
            reference: None,
        });
        if history.worker_incarnation != worker_incarnation {
            for (old, _) in history.published.drain(..) {
                state.by_seq.remove(&old);
            }
            history.worker_incarnation = worker_incarnation;
            history.reference = None;
        }
        history.published.push_back((seq, load));
        state.by_seq.insert(seq, key);
        state.last = state.last.max(seq);
        let now = Instant::now();
        state.sent.insert(seq, now);
        while let Some((_, &at)) = state.sent.first_key_value() {
            if now.duration_since(at) <= self.holds_for {
                break;
            }
            state.sent.pop_first();
        }
        state.refresh(&self.monitor, key);
    }

    /// `key` is published no more (its worker left); returns the worker
    /// incarnation it was last published for, if it was.
    pub(crate) fn forget(&self, key: Key) -> Option<u64> {
        let mut state = self.lock();
        let history = state.keys.remove(&key)?;
        for (seq, _) in history.published {
            state.by_seq.remove(&seq);
        }
        Some(history.worker_incarnation)
    }

    /// Live peer `peer` (of `incarnation`) applied this frontend's frames
    /// `first..=seq` (`0..=0`: none).
    pub(crate) fn acked(&self, peer: u64, incarnation: u64, first: u64, seq: u64) -> Acknowledged {
        let mut state = self.lock();
        let state = &mut *state;
        if first > seq || seq > state.last {
            return Acknowledged::Nothing; // not a run of frames this frontend sent
        }
        // When the last frame it covers was sent; sent too long ago (or
        // never), it counts for nothing: as if it held nothing.
        let sent = state.sent.range(..=seq).next_back().map(|(_, &at)| at);
        let (first, seq) = match sent {
            Some(at) if at.elapsed() <= self.holds_for => (first, seq),
            _ => (0, 0),
        };
        let entry = state.peers.entry(peer).or_insert(Peer::new(incarnation));
        if entry.incarnation != incarnation {
            *entry = Peer::new(incarnation);
        }
        let before = entry.acked;
        if before.is_some_and(|old| old.first == first && seq <= old.seq) {
            return Acknowledged::Nothing; // a late or repeated ack of the same run
        }
        entry.acked = Some(Acked { first, seq });
        entry.sent = sent;
        match before {
            Some(old) if old.first == first => {
                // Only the keys published within (old.seq, seq] can change.
                let keys: HashSet<Key> = state.by_seq.range(old.seq + 1..=seq).map(|(_, &key)| key).collect();
                for key in keys {
                    state.refresh(&self.monitor, key);
                }
                Acknowledged::Grew
            }
            _ => {
                state.refresh_all(&self.monitor);
                Acknowledged::NewRun
            }
        }
    }

    /// Peer `peer` restarted as `incarnation`: it holds nothing of this
    /// frontend yet.
    pub(crate) fn restarted(&self, peer: u64, incarnation: u64) {
        let mut state = self.lock();
        if state.peers.get(&peer).is_some_and(|p| p.incarnation != incarnation) {
            state.peers.insert(peer, Peer::new(incarnation));
            state.refresh_all(&self.monitor);
        }
    }

    /// The live peers now (id, incarnation), and the time: a change, or an
    /// acknowledgement gone stale, refreshes every key.
    pub(crate) fn set_live(&self, live: &[(u64, u64)]) {
        let mut state = self.lock();
        let cut = Instant::now().checked_sub(self.holds_for);
        let mut stale = false;
        for peer in state.peers.values_mut() {
            if peer.acked.is_some() && peer.sent.is_none_or(|at| cut.is_some_and(|cut| at < cut)) {
                // Its last acknowledged frame is older than the staleness:
                // it may have stopped counting this frontend.
                peer.acked = None;
                peer.sent = None;
                stale = true;
            }
        }
        let same = live.len() == state.peers.len()
            && live.iter().all(|(id, inc)| state.peers.get(id).is_some_and(|p| p.incarnation == *inc));
        if same && !stale {
            return;
        }
        let mut peers = HashMap::with_capacity(live.len());
        for &(id, incarnation) in live {
            let kept = state.peers.get(&id).filter(|p| p.incarnation == incarnation);
            let (acked, sent) = kept.map_or((None, None), |p| (p.acked, p.sent));
            peers.insert(id, Peer { incarnation, acked, sent });
        }
        state.peers = peers;
        state.refresh_all(&self.monitor);
    }

    /// The reference of `key` now (what the monitor was last told).
    #[cfg(test)]
    pub(crate) fn of(&self, key: Key) -> Option<RankLoad> {
        self.lock().keys.get(&key).and_then(|h| h.reference)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl State {
    fn refresh_all(&mut self, monitor: &WorkerMonitor) {
        let keys: Vec<Key> = self.keys.keys().copied().collect();
        for key in keys {
            self.refresh(monitor, key);
        }
    }

    /// Prunes `key`'s history and tells the monitor its reference if it
    /// changed (nothing without peers: the lease is off alone).
    fn refresh(&mut self, monitor: &WorkerMonitor, key: Key) {
        let Some(history) = self.keys.get_mut(&key) else { return };
        // Every live peer acknowledged up to `all` (alone: everything, no
        // one holds anything): what came before the last publication at or
        // under it no peer can still hold.
        let all = self.peers.values().map(|p| p.acked.map_or(0, |a| a.seq)).min().unwrap_or(u64::MAX);
        let keep_from = history.published.iter().rposition(|&(seq, _)| seq <= all).unwrap_or(0);
        for (seq, _) in history.published.drain(..keep_from) {
            self.by_seq.remove(&seq);
        }
        while history.published.len() > MAX_HISTORY + 1 {
            // The two after the oldest (the slowest peer's base) as one:
            // the earlier seq, the smaller figures. A peer whose ack falls
            // between them holds the earlier or the later, both counted;
            // one whose run starts between them is counted as holding
            // nothing of it.
            let Some((seq, newer)) = history.published.remove(2) else { break };
            self.by_seq.remove(&seq);
            if let Some((_, older)) = history.published.get_mut(1) {
                *older = least(older, &newer);
            }
        }
        if self.peers.is_empty() {
            return; // the lease is off alone
        }
        let reference = self
            .peers
            .values()
            .map(|peer| held(&history.published, peer.acked))
            .reduce(|a, b| least(&a, &b))
            .unwrap_or_default();
        if history.reference == Some(reference) {
            return;
        }
        history.reference = Some(reference);
        self.echo_seq += 1;
        let report = LoadReport {
            worker: key.0,
            incarnation: history.worker_incarnation,
            rank: key.1,
            publisher: Publisher::Echo,
            seq: self.echo_seq,
            load: reference,
        };
        if let Err(error) = monitor.apply(&report) {
            tracing::debug!(worker = key.0, %error, "lease reference not applied");
        }
    }
}

/// The least a peer that acknowledged `acked` may hold of publications
/// `published` (oldest first): its last acknowledged one (nothing if the
/// peer missed it) and every later one.
fn held(published: &VecDeque<(u64, RankLoad)>, acked: Option<Acked>) -> RankLoad {
    let Some(acked) = acked else { return RankLoad::default() };
    let split = published.partition_point(|&(seq, _)| seq <= acked.seq);
    let base = match split.checked_sub(1).map(|i| published[i]) {
        Some((seq, load)) if seq >= acked.first => load,
        _ => RankLoad::default(),
    };
    published.range(split..).fold(base, |least_yet, (_, load)| least(&least_yet, load))
}

/// The smaller numerators of `a` and `b` (the lease reads only those).
fn least(a: &RankLoad, b: &RankLoad) -> RankLoad {
    RankLoad {
        active_decode_blocks: a.active_decode_blocks.min(b.active_decode_blocks),
        active_prefill_tokens: a.active_prefill_tokens.min(b.active_prefill_tokens),
        waiting_requests: a.waiting_requests.min(b.waiting_requests),
        ..*b
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loadgate::monitor::SharedLoad;
    use loadgate::MonitorConfig;

    const KEY: Key = (1, 0);

    fn reference() -> Reference {
        let config = MonitorConfig { shared: SharedLoad { frontends: 4, ..Default::default() }, ..Default::default() };
        let monitor = Arc::new(WorkerMonitor::new(config).unwrap());
        monitor.register(1, "m", 1, 9).unwrap();
        Reference::new(monitor, Duration::from_secs(3600))
    }

    fn tokens(n: u32) -> RankLoad {
        RankLoad { active_prefill_tokens: n, ..Default::default() }
    }

    /// The reference of `KEY` now, in prefill tokens.
    fn now(r: &Reference) -> Option<u32> {
        r.of(KEY).map(|l| l.active_prefill_tokens)
    }

    #[test]
    fn the_reference_is_the_least_any_live_peer_may_hold() {
        let r = reference();
        r.set_live(&[(7, 1), (8, 1)]);
        r.published(KEY, 9, 1, tokens(100));
        r.published(KEY, 9, 2, tokens(300));
        assert_eq!(now(&r), Some(0), "no peer acknowledged anything");
        r.acked(7, 1, 1, 2);
        assert_eq!(now(&r), Some(0), "peer 8 holds nothing yet");
        r.acked(8, 1, 1, 1);
        assert_eq!(now(&r), Some(100), "peer 8 holds seq 1, or 2");
        r.acked(8, 1, 1, 2);
        assert_eq!(now(&r), Some(300));
        r.published(KEY, 9, 3, tokens(200));
        assert_eq!(now(&r), Some(200), "a lower publication may already be held");
        r.published(KEY, 9, 4, tokens(500));
        assert_eq!(now(&r), Some(200), "a higher one may not");
        r.acked(7, 1, 1, 4);
        r.acked(8, 1, 1, 4);
        assert_eq!(now(&r), Some(500));
        assert_eq!(r.lock().keys[&KEY].published.len(), 1, "only the acknowledged publication is kept");
    }

    #[test]
    fn a_peer_that_missed_a_publication_holds_nothing_of_it() {
        let r = reference();
        r.set_live(&[(7, 1)]);
        r.published(KEY, 9, 1, tokens(100));
        r.published((2, 0), 9, 2, tokens(50));
        r.acked(7, 1, 1, 2);
        assert_eq!(now(&r), Some(100));
        // A gap: peer 7 lost frames and now applies a new run from seq 2.
        r.acked(7, 1, 2, 2);
        assert_eq!(now(&r), Some(0), "seq 1 was before the run");
        r.published(KEY, 9, 3, tokens(100));
        r.acked(7, 1, 2, 3);
        assert_eq!(now(&r), Some(100), "the republication was applied");
        // A late ack of the same run changes nothing; one with first > seq is refused.
        r.acked(7, 1, 2, 2);
        r.acked(7, 1, 5, 4);
        r.acked(7, 1, 2, 99);
        assert_eq!(now(&r), Some(100), "nor one past the last frame sent");
    }

    #[test]
    fn a_newcomer_or_a_restarted_peer_holds_nothing() {
        let r = reference();
        r.set_live(&[(7, 1)]);
        r.published(KEY, 9, 1, tokens(100));
        r.acked(7, 1, 1, 1);
        assert_eq!(now(&r), Some(100));
        r.set_live(&[(7, 1), (8, 1)]);
        assert_eq!(now(&r), Some(0), "peer 8 just joined");
        r.acked(8, 1, 1, 1);
        assert_eq!(now(&r), Some(100));
        r.acked(8, 2, 1, 1);
        r.set_live(&[(7, 1), (8, 2)]);
        assert_eq!(now(&r), Some(100), "peer 8's new life acknowledged seq 1");
        r.restarted(8, 3);
        assert_eq!(now(&r), Some(0), "and its next life nothing yet, at once");
        r.set_live(&[(7, 1), (8, 3)]);
        assert_eq!(now(&r), Some(0));
        r.set_live(&[(7, 1)]);
        assert_eq!(now(&r), Some(100), "a peer gone no longer counts");
    }

    #[test]
    fn the_history_is_bounded_and_errs_low() {
        let r = reference();
        r.set_live(&[(7, 1)]);
        r.published(KEY, 9, 1, tokens(10));
        r.acked(7, 1, 1, 1);
        for seq in 2..100 {
            r.published(KEY, 9, seq, tokens(1000 + seq as u32));
            assert!(r.lock().keys[&KEY].published.len() <= MAX_HISTORY + 1);
        }
        assert_eq!(r.lock().by_seq.len(), MAX_HISTORY + 1, "the index follows the history");
        assert_eq!(now(&r), Some(10), "seq 1, the slowest peer's base, is kept");
        r.acked(7, 1, 1, 98);
        assert!(now(&r).unwrap() <= 1098, "the merged publications count low");
        r.acked(7, 1, 1, 99);
        assert_eq!(now(&r), Some(1099));
        r.forget(KEY);
        assert!(r.lock().by_seq.is_empty() && r.lock().keys.is_empty());
    }

    #[test]
    fn an_acknowledgement_of_a_frame_sent_longer_ago_than_the_staleness_counts_for_nothing() {
        let config = MonitorConfig { shared: SharedLoad { frontends: 4, ..Default::default() }, ..Default::default() };
        let monitor = Arc::new(WorkerMonitor::new(config).unwrap());
        monitor.register(1, "m", 1, 9).unwrap();
        let r = Reference::new(monitor, Duration::from_millis(50));
        r.set_live(&[(7, 1)]);
        r.published(KEY, 9, 1, tokens(100));
        r.acked(7, 1, 1, 1);
        // (No assertion that it counts now: a busy machine may pause past
        // 50 ms here. That it counts is shown with a long staleness above.)
        std::thread::sleep(Duration::from_millis(120));
        r.set_live(&[(7, 1)]);
        assert_eq!(now(&r), Some(0), "peer 7 may have stopped counting this frontend by now");
        r.acked(7, 1, 1, 1);
        assert_eq!(now(&r), Some(0), "a late ack of a frame sent too long ago");
    }

    #[test]
    fn a_worker_s_new_incarnation_starts_its_history_over() {
        let r = reference();
        r.set_live(&[(7, 1)]);
        r.published(KEY, 9, 1, tokens(100));
        r.acked(7, 1, 1, 1);
        r.published(KEY, 10, 2, tokens(40));
        assert_eq!(now(&r), Some(0), "nothing of the new life acknowledged");
        assert_eq!(r.lock().by_seq.len(), 1);
    }
}
