//! [`Peers`]: the other frontends of the fleet, as this one hears them.
//! Each gets one of the monitor's `--max-frontends` slots
//! (`Publisher::Frontend(index)`) at its first frame; a restarted one (a
//! newer incarnation) keeps its index, emptied first; an index is given to
//! another frontend only once its holder has been silent past the shared
//! staleness (its load counts no more by then), emptied first too. Frames
//! of an older incarnation, of this frontend itself, or of more frontends
//! than there are slots are dropped.
//!
//! Which of each peer's FrontendLoad frames this frontend applied, in order
//! since its last gap, goes back to it in FrontendAcks ([`Peers::acks`]);
//! the peers' acknowledgements of this frontend's own frames make its
//! lease reference ([`Reference`]).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use loadgate::monitor::{Applied, Publisher};
use loadgate::wire::Ack;
use loadgate::{LoadReport, RankLoad, WorkerId, WorkerMonitor};

use super::publish::{Holding, Identity, PeerLinks};
use super::reference::{Acknowledged, Reference};
use crate::throttle::LogThrottle;

/// Lines about the other frontends' lives (joined, restarted, heard again):
/// a holder of the secret can name a new incarnation in every frame. 50 a
/// second, as the lines about the workers' lives.
static LIVES: LogThrottle = LogThrottle::per_second(50);

/// What a FrontendLoad frame says.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Added {
    pub(crate) frontend: u64,
    pub(crate) incarnation: u64,
    pub(crate) seq: u64,
    pub(crate) worker: WorkerId,
    pub(crate) worker_incarnation: u64,
    pub(crate) rank: u32,
    pub(crate) load: RankLoad,
}

/// What became of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Heard {
    /// Applied (or a beat taken).
    Taken,
    /// A beat taken, whose lines differ from its sender's last.
    Changed,
    /// This frontend's own frame, back from NATS.
    Own,
    /// An older incarnation, a stale or other-incarnation load, or no slot left.
    Dropped,
}

struct Peer {
    incarnation: u64,
    index: u16,
    heard: Instant,
    /// What it held at its last beat.
    holds: Holding,
    /// Its FrontendLoad seqs applied here in order since the last gap
    /// (first, last), and whether that changed since the last ack.
    applied: Option<(u64, u64)>,
    unacked: bool,
    /// The highest seq of its heard here (a frame at or below it is a
    /// duplicate or a replay, and starts no run).
    high: u64,
}

/// Whether this frontend holds a peer's frame ([`Peers::load`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Held {
    /// Applied (or a later one of the same peer is).
    Yes,
    /// For a worker this frontend does not know (see
    /// [`Peers::registered`]).
    Elsewhere(WorkerId),
    /// For another incarnation of a worker this frontend knows.
    OtherLife,
    /// Not held: the run ends.
    Not,
}

/// The live frontends of the pool, this one included, and what the others
/// hold (from their last beats).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Pool {
    pub(crate) frontends: usize,
    pub(crate) in_flight: u64,
    /// Their waiters, every model's (a refusal's hint counts its own
    /// model's, from `lines`).
    pub(crate) waiting: u64,
    /// Per model (by its `model_key`), the others' waiters.
    pub(crate) lines: HashMap<u64, LineShare>,
}

/// The others' waiters for one model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LineShare {
    /// In the lines of frontends with a lower id than this one (the order
    /// in which the frontends share a worker's reports).
    pub(crate) ahead: u64,
    /// In every other frontend's line.
    pub(crate) others: u64,
}

struct Table {
    by_id: HashMap<u64, Peer>,
    /// Indexes never given, or given back.
    free: Vec<u16>,
    /// The monitor's count of dropped worker slots when the runs were last
    /// checked against it.
    dropped: u64,
    /// The monitor's count of registrations when `unheld` was last checked
    /// against it (a registration by any plane, `--worker` or `--engine`
    /// too, not only the NATS plane's `registered`).
    registrations: u64,
    /// Workers this frontend did not know when a peer's frame for them
    /// came (the runs went on: it routes nothing there); registering one
    /// ends every run. `None`: more than [`MAX_UNHELD`], any registration
    /// does.
    unheld: Option<HashSet<WorkerId>>,
}

/// The most workers [`Table::unheld`] lists.
const MAX_UNHELD: usize = 4096;

impl Table {
    /// Every run ends: the peers hear that this frontend holds nothing of
    /// theirs from before.
    fn end_runs(&mut self) {
        for peer in self.by_id.values_mut() {
            peer.applied = None;
            peer.unacked = true;
        }
    }
}

/// The other frontends.
pub(crate) struct Peers {
    own: Identity,
    monitor: Arc<WorkerMonitor>,
    staleness: Duration,
    table: Mutex<Table>,
    /// Set when a frontend joins or restarts: this one publishes all its
    /// load again (it publishes only changes otherwise).
    newcomer: Arc<AtomicBool>,
    /// What the peers acknowledged of this frontend's frames.
    reference: Arc<Reference>,
}

impl Peers {
    /// `slots` other frontends at most; a silent one gives its slot up
    /// after `staleness`.
    pub(crate) fn new(own: Identity, monitor: Arc<WorkerMonitor>, slots: u16, staleness: Duration) -> Self {
        let free = (0..slots).rev().collect();
        let dropped = monitor.slots_dropped();
        let registrations = monitor.registrations();
        let table =
            Mutex::new(Table { by_id: HashMap::new(), free, dropped, registrations, unheld: Some(HashSet::new()) });
        let reference = Arc::new(Reference::new(monitor.clone(), staleness));
        Peers { own, monitor, staleness, table, newcomer: Arc::new(AtomicBool::new(false)), reference }
    }

    /// For this frontend's publisher: the flag a join, a restart or a
    /// return sets, and the lease reference to record what it publishes.
    pub(crate) fn links(&self) -> PeerLinks {
        PeerLinks { newcomer: self.newcomer.clone(), reference: self.reference.clone() }
    }

    /// Has this frontend's publisher send all its loads again (after its
    /// own NATS reconnection: what it published meanwhile may be lost).
    pub(crate) fn ask_to_resend(&self) {
        // Relaxed: a request to republish, read by the publisher's next
        // beat; nothing else hangs on it.
        self.newcomer.store(true, Ordering::Relaxed);
    }

    /// A FrontendLoad frame: another frontend's load goes to its slot (and
    /// its seq to the next ack); this frontend's own, back from NATS, says
    /// nothing (the peers' acks do: see [`Reference`]).
    pub(crate) fn load(&self, added: Added) -> Heard {
        if added.frontend == self.own.frontend {
            if added.incarnation != self.own.incarnation {
                return Heard::Dropped; // a previous life's frame, or a replay
            }
            return Heard::Own;
        }
        let Some(index) = self.slot(added.frontend, added.incarnation, Some(added.seq)) else { return Heard::Dropped };
        let report = LoadReport {
            worker: added.worker,
            incarnation: added.worker_incarnation,
            rank: added.rank,
            publisher: Publisher::Frontend(index),
            seq: added.seq,
            load: added.load,
        };
        // A worker's slots dropped after this may have held the frame
        // (`applied` checks the count again).
        let dropped = self.monitor.slots_dropped();
        let outcome = self.monitor.apply(&report);
        let held = match outcome {
            Ok(Applied::Stored | Applied::Flipped) => Held::Yes,
            // The rank already holds a later frame of this peer.
            Ok(Applied::Stale) => Held::Yes,
            // A worker this frontend does not know: it holds nothing of it,
            // and counts nothing of it; its registration ends the runs
            // (`registered`, or the count `acks` checks).
            Err(_) => Held::Elsewhere(added.worker),
            // Known in another incarnation (a restart one of them has not
            // heard yet, or an `--engine` of this frontend's own): the same,
            // but what would make this frontend route that incarnation (a
            // restart here, or a deregistration first) drops the worker's
            // slots, which ends the runs by itself.
            Ok(Applied::OtherIncarnation) => Held::OtherLife,
            Ok(_) => Held::Not,
        };
        self.applied(added.frontend, added.incarnation, added.seq, held, dropped);
        if matches!(outcome, Ok(Applied::Stored | Applied::Flipped)) {
            Heard::Taken
        } else {
            Heard::Dropped
        }
    }

    /// `frontend`'s frame `seq` was `held` or not, applied while the
    /// monitor's count of dropped slots was `dropped`: the run since its
    /// last gap.
    fn applied(&self, frontend: u64, incarnation: u64, seq: u64, held: Held, dropped: u64) {
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        // Under the lock `acks` checks the count under: a drop since the
        // apply (its runs ended there, or end at the next `acks`) may have
        // taken this frame too.
        let held = if self.monitor.slots_dropped() == dropped { held } else { Held::Not };
        if let Held::Elsewhere(worker) = held {
            if let Some(unheld) = &mut table.unheld {
                unheld.insert(worker);
                if unheld.len() > MAX_UNHELD {
                    table.unheld = None;
                }
            }
        }
        let Some(peer) = table.by_id.get_mut(&frontend).filter(|p| p.incarnation == incarnation) else { return };
        if seq <= peer.high {
            return; // a duplicate or a replay: the run stands
        }
        peer.high = seq;
        peer.applied = match peer.applied {
            _ if held == Held::Not => None,
            Some((first, last)) if seq == last.wrapping_add(1) => Some((first, seq)),
            // The first frame heard, or one after a gap (NATS lost some):
            // a new run.
            _ => Some((seq, seq)),
        };
        peer.unacked = true;
    }

    /// This frontend registered `worker` (new here): if a peer's frame for
    /// it went unapplied while it was unknown, the runs that went on over
    /// that frame end.
    pub(crate) fn registered(&self, worker: WorkerId) {
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let listed = match &mut table.unheld {
            Some(unheld) => unheld.remove(&worker),
            None => true,
        };
        if listed {
            table.unheld = Some(table.unheld.take().unwrap_or_default());
            table.end_runs();
        }
    }

    /// Every peer's run is acknowledged again with the next acks (one may
    /// have been lost: NATS delivers at most once).
    pub(crate) fn ack_again(&self) {
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        table.by_id.values_mut().for_each(|p| p.unacked = true);
    }

    /// The acknowledgements to send: each peer whose run changed since the
    /// last call (`0..=0`: this frontend holds nothing of it).
    pub(crate) fn acks(&self) -> Vec<Ack> {
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        // Read before the look-ups: a registration after it is seen at the
        // next call.
        let registrations = self.monitor.registrations();
        if registrations != table.registrations {
            table.registrations = registrations;
            let now_routed = match &mut table.unheld {
                Some(unheld) => {
                    let before = unheld.len();
                    unheld.retain(|worker| self.monitor.incarnation(*worker).is_none());
                    unheld.len() != before
                }
                None => true,
            };
            if now_routed {
                table.unheld = Some(table.unheld.take().unwrap_or_default());
                table.end_runs();
            }
        }
        let dropped = self.monitor.slots_dropped();
        if dropped != table.dropped {
            // A worker was forgotten or restarted here (by any plane):
            // what this frontend held of the peers' load there is gone.
            table.dropped = dropped;
            table.end_runs();
        }
        let mut acks = Vec::new();
        for (&peer, p) in table.by_id.iter_mut() {
            if std::mem::take(&mut p.unacked) {
                let (first, seq) = p.applied.unwrap_or((0, 0));
                acks.push(Ack { peer, peer_incarnation: p.incarnation, first, seq });
            }
        }
        acks
    }

    /// A FrontendAck frame: what its sender applied of this frontend's
    /// frames goes to the lease reference.
    pub(crate) fn ack(&self, frontend: u64, incarnation: u64, acks: &[Ack]) -> Heard {
        if frontend == self.own.frontend {
            return Heard::Own;
        }
        if self.slot(frontend, incarnation, None).is_none() {
            return Heard::Dropped;
        }
        let own = |a: &&Ack| a.peer == self.own.frontend && a.peer_incarnation == self.own.incarnation;
        // One per frame counts (its last): more are a sender's mistake.
        if let Some(ack) = acks.iter().filter(own).last() {
            if self.reference.acked(frontend, incarnation, ack.first, ack.seq) == Acknowledged::NewRun {
                // It holds nothing from before: everything again.
                self.ask_to_resend();
            }
        }
        Heard::Taken
    }

    /// A FrontendBeat frame, with what its sender holds: its sender is
    /// alive, so its publications are renewed. [`Heard::Changed`] when its
    /// lines differ from its last beat's.
    pub(crate) fn beat(&self, frontend: u64, incarnation: u64, holds: Holding) -> Heard {
        match self.slot(frontend, incarnation, None) {
            Some(_) => {
                // (`slot` renewed what it published: it is alive.)
                let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
                let Some(peer) = table.by_id.get_mut(&frontend) else { return Heard::Taken };
                let changed = peer.holds.lines != holds.lines;
                peer.holds = holds;
                if changed {
                    Heard::Changed
                } else {
                    Heard::Taken
                }
            }
            None if frontend == self.own.frontend => Heard::Own,
            None => Heard::Dropped,
        }
    }

    /// The frontends heard within the staleness (this one included) and
    /// what the others hold; the monitor's lease is told how many others.
    pub(crate) fn pool(&self) -> Pool {
        let mut pool = Pool { frontends: 1, ..Pool::default() };
        let mut live = Vec::new();
        {
            let table = self.table.lock().unwrap_or_else(|e| e.into_inner());
            for (&peer_id, peer) in table.by_id.iter().filter(|(_, p)| p.heard.elapsed() <= self.staleness) {
                pool.frontends += 1;
                live.push((peer_id, peer.incarnation));
                pool.in_flight += u64::from(peer.holds.in_flight);
                pool.waiting += u64::from(peer.holds.waiting);
                for line in &peer.holds.lines {
                    let share = pool.lines.entry(line.model).or_default();
                    share.others += u64::from(line.waiting);
                    if peer_id < self.own.frontend {
                        share.ahead += u64::from(line.waiting);
                    }
                }
            }
        }
        self.reference.set_live(&live);
        self.monitor.set_other_frontends(u32::try_from(pool.frontends - 1).unwrap_or(u32::MAX));
        pool
    }

    /// The slot of `frontend`'s `incarnation`, heard now; `None` for this
    /// frontend, an older incarnation, no slot left, or a FrontendLoad
    /// whose `seq` is not above the highest heard of that life (a duplicate
    /// or a replay: it must not keep its sender alive).
    fn slot(&self, frontend: u64, incarnation: u64, seq: Option<u64>) -> Option<u16> {
        if frontend == self.own.frontend {
            return None;
        }
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if let Some(peer) = table.by_id.get_mut(&frontend) {
            // An older life is dropped while the newer one speaks; once that
            // one is silent past the window, the older one speaking takes the
            // id back (a frontend's id is random per start, so the newer life
            // was a forgery: it silenced the live frontend only while sent).
            if incarnation < peer.incarnation && now.duration_since(peer.heard) <= self.staleness {
                return None;
            }
            if incarnation == peer.incarnation && seq.is_some_and(|seq| seq <= peer.high) {
                return None;
            }
            if incarnation != peer.incarnation {
                // A restart: its numbering starts over, and it knows
                // nothing of the others' load yet.
                peer.incarnation = incarnation;
                peer.applied = None;
                peer.unacked = true;
                peer.high = 0;
                self.reference.restarted(frontend, incarnation);
                let _ = self.monitor.clear_publisher(Publisher::Frontend(peer.index));
                self.ask_to_resend();
                if let Some(suppressed) = LIVES.admit() {
                    tracing::info!(frontend, incarnation, suppressed, "frontend restarted");
                }
            } else if now.duration_since(peer.heard) > self.staleness - self.staleness / 8 {
                // Back after a silence past the window (a partition, a
                // reconnection): it may have lost what this one published,
                // and what it published may be dropped here (below, by the
                // monitor's own clock: hence the eighth of the window to
                // spare): its run of applied frames ends, and it hears so.
                peer.applied = None;
                peer.unacked = true;
                self.ask_to_resend();
                if let Some(suppressed) = LIVES.admit() {
                    tracing::info!(frontend, incarnation, suppressed, "frontend heard again after a silence");
                }
            }
            peer.heard = now;
            // Any frame says it is alive: what it published counts on (or,
            // after a silence past the window, is dropped: see
            // `WorkerMonitor::renew_publisher`).
            let _ = self.monitor.renew_publisher(Publisher::Frontend(peer.index));
            return Some(peer.index);
        }
        let index = match table.free.pop() {
            Some(index) => index,
            None => {
                let staleness = self.staleness;
                let silent = table
                    .by_id
                    .iter()
                    .filter(|(_, p)| now.duration_since(p.heard) > staleness)
                    .min_by_key(|(_, p)| p.heard)
                    .map(|(&id, _)| id);
                let Some(id) = silent else {
                    tracing::debug!(frontend, "frontend frame dropped: every --max-frontends slot is live");
                    return None;
                };
                table.by_id.remove(&id).map(|p| p.index)?
            }
        };
        let _ = self.monitor.clear_publisher(Publisher::Frontend(index));
        let peer =
            Peer { incarnation, index, heard: now, holds: Holding::default(), applied: None, unacked: false, high: 0 };
        table.by_id.insert(frontend, peer);
        let _ = self.monitor.renew_publisher(Publisher::Frontend(index));
        // It knows nothing of this frontend's load yet.
        self.ask_to_resend();
        if let Some(suppressed) = LIVES.admit() {
            tracing::info!(frontend, incarnation, index, suppressed, "frontend joined the shared load");
        }
        Some(index)
    }
}

#[cfg(test)]
mod tests;
