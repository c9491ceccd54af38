//! [`SharePublisher`]: this frontend's side of the shared load. Every
//! change of what its router tracks for a (worker, rank) is published at
//! once, one sealed `FrontendLoad` each (the changes of a burst coalesced);
//! every heartbeat a `FrontendBeat`, which renews everything this frontend
//! published (the others drop a frontend's load three beats after its last
//! beat: a dead one stops counting by itself), so an unchanged load is not
//! published again. What NATS may lose (at most once: a slow consumer, a
//! reconnection) is mended by a slow rotation: every beat republishes the
//! next [`REFRESH_PER_BEAT`] loads (zeros too, until the worker leaves, and
//! a zero for a while after this frontend forgets it), so
//! each is sent again within `ceil(loads / REFRESH_PER_BEAT)` beats. A
//! frontend that joins, restarts or comes back after a silence knows
//! nothing (or stale figures), and this one's own reconnection may have
//! lost what it sent: then every load is published again at once. A fleet of 10,000
//! loaded workers costs each beat 256 frames, not 10,000.
//!
//! A beat also says how many requests wait in each model's line. Those
//! figures are checked [`LINE_CHECKS_PER_BEAT`] times a beat, and a change
//! is told at once by an extra beat (at most 40 a second at the default
//! 200 ms beat): the frontends split each worker report between their
//! lines by these figures, exactly only while they agree.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use loadgate::wire::envelope::Sealer;
use loadgate::wire::{model_key, Frame, LineWaiting, MAX_BEAT_LINES};
use loadgate::{RankLoad, WorkerId, WorkerMonitor};

use super::changes::ChangeFeed;
use super::reference::Reference;
use super::rotation::Rotation;
use crate::nats::seal_clock::SEAL_CLOCK;

/// The most changes coalesced into one round of publications.
const BURST: usize = 1024;

/// Loads republished each beat by the rotation (see the module docs).
pub(crate) const REFRESH_PER_BEAT: usize = 256;

/// How often a heartbeat's interval checks the lines for a change to tell.
const LINE_CHECKS_PER_BEAT: u32 = 8;

/// Who this frontend is on the shared plane.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Identity {
    /// Its id (random at start).
    pub(crate) frontend: u64,
    /// Its incarnation (its start, in ns since the epoch).
    pub(crate) incarnation: u64,
}

impl Identity {
    /// A fresh identity.
    pub(crate) fn new() -> Self {
        let incarnation = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        Identity { frontend: fastrand::u64(..), incarnation }
    }
}

/// What a frontend holds, as its beats say.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Holding {
    /// Requests dispatched and not yet finished.
    pub(crate) in_flight: u32,
    /// Requests waiting in its lines, every model's.
    pub(crate) waiting: u32,
    /// The models whose lines hold requests, and how many each (the
    /// longest lines first, at most `MAX_BEAT_LINES`).
    pub(crate) lines: Vec<LineWaiting>,
}

/// What this frontend holds now, for its beats.
pub(crate) type Holds = Arc<dyn Fn() -> Holding + Send + Sync>;

impl Holding {
    /// `in_flight` requests, and the waiting lines of `monitor`'s models
    /// (their counts read without their locks).
    pub(crate) fn of(monitor: &WorkerMonitor, in_flight: u64) -> Holding {
        let mut lines = Vec::new();
        monitor.for_each_waiting(|model, waiting| {
            lines.push(LineWaiting { model: model_key(model), waiting: clamp(waiting as u64) });
        });
        Holding::from_lines(in_flight, lines)
    }

    /// The waiting total of `lines`, and the longest of them that a beat
    /// carries.
    fn from_lines(in_flight: u64, mut lines: Vec<LineWaiting>) -> Holding {
        let waiting = lines.iter().map(|line| u64::from(line.waiting)).sum();
        lines.sort_unstable_by_key(|line| (std::cmp::Reverse(line.waiting), line.model));
        lines.truncate(MAX_BEAT_LINES);
        Holding { in_flight: clamp(in_flight), waiting: clamp(waiting), lines }
    }
}

fn clamp(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Where and how this frontend publishes: its subject, its event secret
/// prepared, its NATS client.
pub(crate) struct Outbox {
    pub(crate) subject: String,
    pub(crate) sealer: Sealer,
    pub(crate) client: async_nats::Client,
}

impl Outbox {
    /// Seals `frame` and publishes it (a failure is logged: the client
    /// reconnects, and what was lost is mended, see the module docs). Not
    /// while NATS is away: the client would queue it and send it, stale,
    /// on its return; the reconnection has everything sent again instead.
    pub(crate) async fn send(&self, frame: &Frame) {
        if !crate::nats::state::connected(&self.client) {
            return;
        }
        let mut buf = BytesMut::new();
        match self.sealer.seal(&self.subject, SEAL_CLOCK.now_ms(), frame, &mut buf) {
            Ok(()) => {
                if let Err(error) = self.client.publish(self.subject.clone(), buf.freeze()).await {
                    tracing::debug!(%error, "NATS publish of the shared load failed (the client reconnects)");
                }
            }
            Err(error) => tracing::warn!(%error, "shared load not sealed"),
        }
    }
}

/// What the publisher shares with [`Peers`](super::peers::Peers).
pub(crate) struct PeerLinks {
    /// Set when a frontend joins or restarts (or this one reconnects):
    /// publish everything again.
    pub(crate) newcomer: Arc<AtomicBool>,
    /// Told each publication before it is sent.
    pub(crate) reference: Arc<Reference>,
}

/// The publishing task; dropping it stops it.
#[derive(Debug)]
pub(crate) struct SharePublisher {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for SharePublisher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Own {
    identity: Identity,
    seq: u64,
    outbox: Outbox,
    monitor: Arc<WorkerMonitor>,
    /// What is republished, a slice per beat.
    rotation: Rotation,
    /// Told each publication before it is sent.
    reference: Arc<Reference>,
}

impl SharePublisher {
    /// Starts publishing on `subject` (call from within a tokio runtime).
    pub(crate) fn start(
        identity: Identity,
        outbox: Outbox,
        monitor: Arc<WorkerMonitor>,
        mut feed: ChangeFeed,
        heartbeat: Duration,
        holds: Holds,
        links: PeerLinks,
    ) -> SharePublisher {
        let PeerLinks { newcomer, reference } = links;
        let rotation = Rotation::default();
        let mut own = Own { identity, seq: 0, outbox, monitor, rotation, reference };
        let task = tokio::spawn(async move {
            let mut beats = tokio::time::interval(heartbeat);
            beats.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut line_checks = tokio::time::interval(heartbeat / LINE_CHECKS_PER_BEAT);
            line_checks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // The lines the last beat told.
            let mut told: Vec<LineWaiting> = Vec::new();
            let mut burst = HashSet::new();
            loop {
                tokio::select! {
                    first = feed.rx.recv() => {
                        let Some(first) = first else { return };
                        burst.insert(first);
                        while burst.len() < BURST {
                            match feed.rx.try_recv() {
                                Ok(change) => { burst.insert(change); }
                                Err(_) => break,
                            }
                        }
                        if feed.take_lost() {
                            burst.extend(own.everything());
                        }
                        for (worker, rank) in burst.drain() {
                            own.publish(worker, rank, false).await;
                        }
                    }
                    _ = line_checks.tick() => {
                        // A line that changed is told at once, not a
                        // beat later: the frontends split each report by
                        // their waiters, exactly only while their figures
                        // agree.
                        let holding = holds();
                        if holding.lines != told {
                            told = holding.lines.clone();
                            own.beat(holding).await;
                        }
                    }
                    _ = beats.tick() => {
                        let holding = holds();
                        told = holding.lines.clone();
                        own.beat(holding).await;
                        // Relaxed: a request to republish (see `Peers`).
                        let again = if newcomer.swap(false, Ordering::Relaxed) {
                            own.rotation.all()
                        } else {
                            own.rotation.next(REFRESH_PER_BEAT)
                        };
                        let mut again: HashSet<_> = again.into_iter().collect();
                        if feed.take_lost() {
                            again.extend(own.everything());
                        }
                        for (worker, rank) in again {
                            own.publish(worker, rank, true).await;
                        }
                    }
                }
            }
        });
        SharePublisher { task }
    }
}

impl Own {
    /// Every rank of every registered worker (after lost changes).
    fn everything(&self) -> Vec<(WorkerId, u32)> {
        let workers = self.monitor.workers();
        workers.iter().flat_map(|w| (0..w.dp_size).map(move |rank| (w.id, rank))).collect()
    }

    /// Publishes what the router tracks now for `worker`'s `rank`: on a
    /// change, unless it stays zero; `again` (the rotation, a resend), in
    /// any case.
    async fn publish(&mut self, worker: WorkerId, rank: u32, again: bool) {
        let Some((worker_incarnation, load)) = self.monitor.tracked(worker, rank) else {
            // This frontend forgot the worker; the others may keep it (they
            // forget on their own clocks: another idle timeout, a
            // deregistration lost): what this frontend last added there is
            // taken back by a zero (their beats renew what it published),
            // sent again at the rotation's next visits in case NATS loses it.
            let incarnation = self.reference.forget((worker, rank));
            if let Some(worker_incarnation) = self.rotation.forget((worker, rank), incarnation) {
                self.seq += 1;
                self.send_load(worker, worker_incarnation, rank, RankLoad::default()).await;
            }
            return;
        };
        if !self.rotation.publish((worker, rank), is_zero(&load)) && !again {
            return;
        }
        self.seq += 1;
        // Before it is sent: no peer can acknowledge it first.
        self.reference.published((worker, rank), worker_incarnation, self.seq, load);
        self.send_load(worker, worker_incarnation, rank, load).await;
    }

    /// Sends `load` as this frontend's addition to `worker`'s `rank`
    /// (numbered `self.seq`).
    async fn send_load(&self, worker: WorkerId, worker_incarnation: u64, rank: u32, load: RankLoad) {
        let frame = Frame::FrontendLoad {
            frontend: self.identity.frontend,
            incarnation: self.identity.incarnation,
            seq: self.seq,
            worker,
            worker_incarnation,
            rank,
            load,
        };
        self.outbox.send(&frame).await;
    }

    /// Sends a beat with what this frontend holds.
    async fn beat(&self, holding: Holding) {
        let Holding { in_flight, waiting, lines } = holding;
        let beat = Frame::FrontendBeat {
            frontend: self.identity.frontend,
            incarnation: self.identity.incarnation,
            in_flight,
            waiting,
            lines,
        };
        self.outbox.send(&beat).await;
    }
}

/// Nothing added (numerators all zero).
fn is_zero(load: &RankLoad) -> bool {
    load.active_decode_blocks == 0 && load.active_prefill_tokens == 0 && load.waiting_requests == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_beat_carries_the_longest_lines_and_counts_them_all() {
        let lines: Vec<LineWaiting> =
            (0..MAX_BEAT_LINES as u64 + 1).map(|m| LineWaiting { model: m, waiting: 1 + (m % 7) as u32 }).collect();
        let total: u64 = lines.iter().map(|l| u64::from(l.waiting)).sum();
        let held = Holding::from_lines(u64::MAX, lines.clone());
        assert_eq!((held.in_flight, u64::from(held.waiting)), (u32::MAX, total), "every line counted");
        assert_eq!(held.lines.len(), MAX_BEAT_LINES);
        let in_order = |w: &[LineWaiting]| {
            w[0].waiting > w[1].waiting || (w[0].waiting == w[1].waiting && w[0].model < w[1].model)
        };
        assert!(held.lines.windows(2).all(in_order), "longest first, then by key");
        // The one cut: the shortest line (1 waiting: keys 0, 7, ..., 336)
        // with the greatest key.
        assert!(!held.lines.contains(&LineWaiting { model: 336, waiting: 1 }));
        // The same lines in another order make the same beat (no beat for
        // a change that is none).
        let mut reversed = lines;
        reversed.reverse();
        assert_eq!(Holding::from_lines(u64::MAX, reversed), held);
    }

    #[test]
    fn a_monitor_s_lines_without_waiters_are_left_out() {
        let monitor = WorkerMonitor::new(Default::default()).unwrap();
        monitor.register(1, "m", 1, 0).unwrap();
        assert_eq!(Holding::of(&monitor, 3), Holding { in_flight: 3, waiting: 0, lines: vec![] });
    }

    #[test]
    fn identities_differ() {
        assert_ne!(Identity::new().frontend, Identity::new().frontend);
    }
}
