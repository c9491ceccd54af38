//! [`SharePublisher`]: this frontend's side of the shared load. Every
//! change of what its router tracks for a (worker, rank) is published at
//! once, one sealed `FrontendLoad` each (the changes of a burst coalesced);
//! every heartbeat a `FrontendBeat`, which renews everything this frontend
//! published (the others drop a frontend's load three beats after its last
//! beat: a dead one stops counting by itself), so an unchanged load is not
//! published again. What NATS may lose (at most once: a slow consumer, a
//! reconnection) is mended by a slow rotation: every beat republishes the
//! next [`REFRESH_PER_BEAT`] loads (zeros too, until the worker leaves), so
//! each is sent again within `ceil(loads / REFRESH_PER_BEAT)` beats. A
//! frontend that joins, restarts or comes back after a silence knows
//! nothing (or stale figures), and this one's own reconnection may have
//! lost what it sent: then every load is published again at once. A fleet of 10,000
//! loaded workers costs each beat 256 frames, not 10,000.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use loadgate::wire::envelope::Sealer;
use loadgate::wire::{model_key, Frame, LineWaiting, MAX_BEAT_LINES};
use loadgate::{RankLoad, WorkerId, WorkerMonitor};

use super::changes::ChangeFeed;
use super::rotation::Rotation;
use crate::secret::unix_ms;

/// The most changes coalesced into one round of publications.
const BURST: usize = 1024;

/// Loads republished each beat by the rotation (see the module docs).
pub(crate) const REFRESH_PER_BEAT: usize = 256;

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
    /// `in_flight` requests, and the waiting lines of `monitor`'s models.
    pub(crate) fn of(monitor: &WorkerMonitor, in_flight: u64) -> Holding {
        let clamp = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
        let mut lines: Vec<LineWaiting> = monitor
            .models()
            .iter()
            .filter_map(|model| Some((model, monitor.line_stats(model)?.waiting as u64)))
            .filter(|&(_, waiting)| waiting != 0)
            .map(|(model, waiting)| LineWaiting { model: model_key(model), waiting: clamp(waiting) })
            .collect();
        let waiting = lines.iter().map(|line| u64::from(line.waiting)).sum();
        lines.sort_unstable_by_key(|line| std::cmp::Reverse(line.waiting));
        lines.truncate(MAX_BEAT_LINES);
        Holding { in_flight: clamp(in_flight), waiting: clamp(waiting), lines }
    }
}

/// Where and how this frontend publishes: its subject, its event secret
/// prepared, its NATS client.
pub(crate) struct Outbox {
    pub(crate) subject: String,
    pub(crate) sealer: Sealer,
    pub(crate) client: async_nats::Client,
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
    subject: String,
    sealer: Sealer,
    client: async_nats::Client,
    monitor: Arc<WorkerMonitor>,
    /// What is republished, a slice per beat.
    rotation: Rotation,
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
        newcomer: Arc<AtomicBool>,
    ) -> SharePublisher {
        let Outbox { subject, sealer, client } = outbox;
        let rotation = Rotation::default();
        let mut own = Own { identity, seq: 0, subject, sealer, client, monitor, rotation };
        let task = tokio::spawn(async move {
            let mut beats = tokio::time::interval(heartbeat);
            beats.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
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
                    _ = beats.tick() => {
                        let Holding { in_flight, waiting, lines } = holds();
                        let beat = Frame::FrontendBeat {
                            frontend: own.identity.frontend,
                            incarnation: own.identity.incarnation,
                            in_flight,
                            waiting,
                            lines,
                        };
                        own.send(&beat).await;
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
            self.rotation.forget((worker, rank));
            return;
        };
        if !self.rotation.publish((worker, rank), is_zero(&load)) && !again {
            return;
        }
        self.seq += 1;
        let frame = Frame::FrontendLoad {
            frontend: self.identity.frontend,
            incarnation: self.identity.incarnation,
            seq: self.seq,
            worker,
            worker_incarnation,
            rank,
            load,
        };
        self.send(&frame).await;
    }

    async fn send(&self, frame: &Frame) {
        let mut buf = BytesMut::new();
        match self.sealer.seal(&self.subject, unix_ms(), frame, &mut buf) {
            Ok(()) => {
                if let Err(error) = self.client.publish(self.subject.clone(), buf.freeze()).await {
                    tracing::debug!(%error, "NATS publish of the shared load failed (the client reconnects)");
                }
            }
            Err(error) => tracing::warn!(%error, "shared load not sealed"),
        }
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
    fn identities_differ() {
        assert_ne!(Identity::new().frontend, Identity::new().frontend);
    }
}
