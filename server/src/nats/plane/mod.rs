//! Frontend side of the NATS plane: [`NatsPlane`], a task that subscribes
//! to every worker's frames, opens each envelope under the event secret and
//! applies it as the TCP plane would, and a sweep that takes silent workers
//! out of routing and forgets those silent for the idle timeout.
//!
//! What NATS does not give, the plane checks itself (nothing is applied
//! otherwise):
//! - the envelope's tag (a client without the secret can neither forge nor
//!   alter a frame, nor move one to another subject: the subject is under
//!   the tag, and a frame's worker must be the subject's);
//! - the sender's clock, within [`CLOCK_WINDOW`] of the frontend's
//!   (an old envelope replayed later is dropped);
//! - the incarnation: a Register of an older incarnation than the one
//!   registered is dropped, a newer one is a restart (a worker that moved
//!   hosts comes back with its new address) once the registered one is
//!   silent (`--event-silence-ms`; while it is heard, the newer one is
//!   dropped: a holder of the secret cannot take a live worker's id); a
//!   Load or Deregister must be of the registered incarnation;
//! - the seq: the monitor drops a Load not numbered above the last one it
//!   applied for the rank (a replay within the window), and a Load keeps
//!   its worker heard only once the monitor applied it; a frontend's
//!   FrontendLoad not numbered above the last one heard renews nothing;
//! - the frames that carry no seq and keep something alive (a worker's
//!   Registers, a frontend's beats and acks): one sealed before the newest
//!   of its stream, or the same envelope again, is a replay and dropped
//!   ([`replays`]);
//! - the order of a life's Register and Deregister (one incarnation may
//!   leave and rejoin: a sidecar whose engine stopped answering): a
//!   Deregister sealed before the Register that made the current life, or
//!   a Register sealed before the Deregister that ended one (kept for the
//!   clock window), is a replay and dropped.
//!
//! Ownership: a worker id belongs to its registered incarnation until it
//! deregisters or is silent for the idle timeout; an id named by `--worker`
//! or `--engine` is never taken.
//!
//! A NATS outage is not the workers' silence: while the frontend is
//! disconnected the sweep takes no worker out of routing (the frontend
//! serves on the last view, with `--load-staleness-ms` if set), and on
//! reconnection every worker's silence starts over and the frontend says
//! hello, so every worker re-announces itself at once. Both are read from
//! the client's state, not from its events, which it may drop ([`link`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt as _;
use loadgate::monitor::{Applied, Publisher};
use loadgate::wire::envelope::Openers;
use loadgate::wire::{model_key, Frame, MAX_ACKS};
use loadgate::{LoadReport, WorkerId, WorkerMonitor};

use self::known::Known;
use self::link::Link;
use self::replays::{envelope_tag, Replays, Stream, FRONTEND_STREAMS};
use super::args::NatsArgs;
use super::sharing::changes::ChangeFeed;
use super::sharing::peers::{Added, Heard, Peers};
use super::sharing::publish::{Holding, Holds, Identity, Outbox, SharePublisher};
use super::subjects::Subjects;
use crate::directory::WorkerDirectory;
use crate::events::{PlaneConfig, PlaneLimits, PlaneStats};
use crate::frontend::retry_hint::RetryHint;
use crate::secret::{unix_ms, Secrets};

pub(crate) use super::seal_clock::CLOCK_WINDOW;

/// How often the sweep looks for silent workers.
const SWEEP_EVERY: Duration = Duration::from_millis(50);

/// The least time between two applications of the others' lines (one per
/// beat whose lines changed, at most this often).
const SHARE_AT_MOST_EVERY: Duration = Duration::from_millis(10);

/// The least time between two of this frontend's FrontendAcks (each goes
/// to every frontend: with k frontends, each opens at most k − 1 acks per
/// this much time).
const ACK_AT_MOST_EVERY: Duration = Duration::from_millis(1);

/// The NATS plane of a frontend; dropping it stops it.
#[derive(Debug)]
pub(crate) struct NatsPlane {
    task: tokio::task::JoinHandle<()>,
    sweep: tokio::task::JoinHandle<()>,
    /// Applying the other frontends' figures (when shared).
    pooling: Option<tokio::task::JoinHandle<()>>,
    /// Sending this frontend's acks (when shared).
    acking: Option<tokio::task::JoinHandle<()>>,
    /// Publishing this frontend's load (when shared).
    _share: Option<SharePublisher>,
}

/// How a frontend shares its load on the plane (`--share-load`).
pub(crate) struct Sharing {
    pub(crate) identity: Identity,
    /// What this frontend holds (in flight, waiting), for its beats.
    pub(crate) holds: Holds,
    /// The retry hint to tell the pool's figures (`None`: a frontend's own).
    pub(crate) pool_hint: Option<Arc<RetryHint>>,
    pub(crate) slots: u16,
    pub(crate) heartbeat: Duration,
    pub(crate) staleness: Duration,
    pub(crate) feed: ChangeFeed,
}

impl Drop for NatsPlane {
    fn drop(&mut self) {
        self.task.abort();
        self.sweep.abort();
        if let Some(pooling) = &self.pooling {
            pooling.abort();
        }
        if let Some(acking) = &self.acking {
            acking.abort();
        }
    }
}

/// What the plane applies frames to.
struct Applier {
    monitor: Arc<WorkerMonitor>,
    directory: Arc<WorkerDirectory>,
    /// The event secrets, prepared to open envelopes.
    openers: Openers,
    limits: PlaneLimits,
    subjects: Subjects,
    known: Mutex<HashMap<WorkerId, Known>>,
    /// Lives that deregistered within the clock window: (incarnation, when
    /// their Deregister was sealed).
    ended: Mutex<HashMap<WorkerId, (u64, u64)>>,
    /// The newest Register, beat and ack of each sender.
    replays: Replays,
    /// Connected to NATS now (set from the client's state before each sweep).
    connected: Arc<AtomicBool>,
    /// Loads applied and busy flips (the frontend's `/metrics`, with the TCP plane's).
    stats: Arc<PlaneStats>,
    /// The other frontends (when load is shared).
    peers: Option<Peers>,
    /// Where this frontend's acks go, and who it is (when load is shared).
    acks: Option<(Outbox, Identity)>,
    /// Told when a run of another frontend's frames changed (an ack is due).
    ack_ready: tokio::sync::Notify,
    /// Told when another frontend's lines changed.
    lines_changed: tokio::sync::Notify,
    /// The retry hint told the pool's figures (`--retry-hint-scope pool`).
    pool_hint: Option<Arc<RetryHint>>,
}

impl NatsPlane {
    /// Connects to NATS, subscribes to every worker's frames and says
    /// hello (every worker announces itself again), and again after each
    /// reconnection.
    ///
    /// # Errors
    ///
    /// No connection at start (see [`NatsArgs::connect`]), or the
    /// subscription cannot be made.
    pub(crate) async fn start(
        args: &NatsArgs,
        monitor: Arc<WorkerMonitor>,
        directory: Arc<WorkerDirectory>,
        secrets: Arc<Secrets>,
        config: &PlaneConfig,
        sharing: Option<Sharing>,
    ) -> anyhow::Result<NatsPlane> {
        let (limits, silence, stats) = (config.limits, config.silence, config.stats.clone());
        // A Connected event has the reconnection handled at once; the
        // client's own count of connections decides (see `Link`), and is
        // checked at the sweep's pace too, in case the event was lost.
        let (reconnected, mut reconnections) = tokio::sync::mpsc::unbounded_channel();
        let client = args
            .connect("loadgate frontend", move |event| {
                if let async_nats::Event::Connected = event {
                    let _ = reconnected.send(());
                }
            })
            .await?;
        let mut link = Link::new(client.clone());
        let swept = Link::new(client.clone());
        let connected = Arc::new(AtomicBool::new(true));
        let subjects = Subjects::new(&args.nats_namespace);
        let mut frames = client.subscribe(subjects.all_events()).await?;
        // Without sharing, a stream that never yields.
        let mut shared = match &sharing {
            Some(_) => client.subscribe(subjects.all_frontends()).await?.boxed(),
            None => futures_util::stream::pending().boxed(),
        };
        let pool_hint = sharing.as_ref().and_then(|s| s.pool_hint.clone());
        let (peers, share) = match sharing {
            Some(s) => {
                let peers = Peers::new(s.identity, monitor.clone(), s.slots, s.staleness);
                let outbox = Outbox {
                    subject: subjects.frontend(s.identity.frontend),
                    sealer: secrets.sealer(),
                    client: client.clone(),
                };
                let links = peers.links();
                let publisher =
                    SharePublisher::start(s.identity, outbox, monitor.clone(), s.feed, s.heartbeat, s.holds, links);
                let acks = Outbox {
                    subject: subjects.frontend(s.identity.frontend),
                    sealer: secrets.sealer(),
                    client: client.clone(),
                };
                (Some((peers, acks, s.identity)), Some(publisher))
            }
            None => (None, None),
        };
        let (peers, acks) = match peers {
            Some((peers, acks, identity)) => (Some(peers), Some((acks, identity))),
            None => (None, None),
        };
        client.publish(subjects.hello(), bytes::Bytes::new()).await?;
        let idle = limits.event_idle_timeout;
        let applier = Arc::new(Applier {
            monitor,
            directory,
            openers: secrets.openers(),
            limits,
            subjects,
            known: Mutex::default(),
            ended: Mutex::default(),
            replays: Replays::new(limits.max_workers.saturating_mul(2).saturating_add(FRONTEND_STREAMS)),
            connected,
            stats,
            peers,
            acks,
            ack_ready: tokio::sync::Notify::new(),
            lines_changed: tokio::sync::Notify::new(),
            pool_hint,
        });
        let hello = applier.subjects.hello();
        let receiving = applier.clone();
        let pooled = applier.clone();
        let task = tokio::spawn(async move {
            let mut checks = tokio::time::interval(SWEEP_EVERY);
            loop {
                let reconnection = tokio::select! {
                    message = frames.next() => match message {
                        Some(message) => {
                            receiving.apply(&message.subject, &message.payload);
                            false
                        }
                        None => break,
                    },
                    Some(message) = shared.next() => {
                        receiving.apply(&message.subject, &message.payload);
                        // The acker sends what changed, soon.
                        receiving.ack_ready.notify_one();
                        false
                    }
                    Some(()) = reconnections.recv() => true,
                    _ = checks.tick() => true,
                };
                if reconnection && link.reconnected() {
                    // Every worker's silence starts over, and every
                    // worker announces itself again.
                    receiving.heard_all_now();
                    // What this frontend published meanwhile may be
                    // lost: all of it again, zeros included.
                    if let Some(peers) = &receiving.peers {
                        peers.ask_to_resend();
                    }
                    let _ = client.publish(hello.clone(), bytes::Bytes::new()).await;
                }
            }
        });
        let sweep = tokio::spawn(async move {
            let mut ticks = tokio::time::interval(SWEEP_EVERY);
            loop {
                ticks.tick().await;
                // Relaxed: read by the sweep on this task only.
                applier.connected.store(swept.connected(), Ordering::Relaxed);
                applier.sweep(silence, idle);
            }
        });
        let acker = pooled.clone();
        let acking = pooled.peers.is_some().then(|| {
            tokio::spawn(async move {
                loop {
                    acker.ack_ready.notified().await;
                    acker.acknowledge().await;
                    // Runs that change meanwhile go in the next ack.
                    tokio::time::sleep(ACK_AT_MOST_EVERY).await;
                }
            })
        });
        let pooling = pooled.peers.is_some().then(|| {
            tokio::spawn(async move {
                loop {
                    // At the sweep's pace, and soon after a beat whose lines
                    // changed (at most every 10 ms); connected or not, so
                    // that frontends silent past the staleness stop counting.
                    let _ = tokio::time::timeout(SWEEP_EVERY, pooled.lines_changed.notified()).await;
                    if let Some(peers) = &pooled.peers {
                        pooled.share_pool(peers);
                    }
                    tokio::time::sleep(SHARE_AT_MOST_EVERY).await;
                }
            })
        });
        Ok(NatsPlane { task, sweep, pooling, acking, _share: share })
    }
}

impl Applier {
    /// One message from `subject`: opened, checked and applied (or dropped).
    fn apply(&self, subject: &str, payload: &[u8]) {
        let sealed = match self.openers.open(subject, payload) {
            Ok(sealed) => sealed,
            Err(error) => {
                self.stats.frame_dropped(true);
                tracing::debug!(subject, %error, "NATS frame dropped");
                return;
            }
        };
        let now_ms = unix_ms();
        let window = CLOCK_WINDOW.as_millis() as u64;
        if sealed.sent_ms.abs_diff(now_ms) > window {
            self.stats.frame_dropped(false);
            tracing::debug!(subject, skew_ms = sealed.sent_ms.abs_diff(now_ms), "NATS frame outside the clock window");
            return;
        }
        // A frame of a stream that carries no seq: new, or a replay.
        let (sent_ms, tag) = (sealed.sent_ms, envelope_tag(payload));
        let is_new = |stream, incarnation| self.replays.is_new(stream, incarnation, sent_ms, tag);
        match sealed.frame {
            Frame::Register { worker, incarnation, dp_size, model, http_addr } => {
                if subject != self.subjects.events(&model, worker) {
                    self.stats.frame_dropped(false);
                    return;
                }
                let ended = self.ended.lock().unwrap_or_else(|e| e.into_inner()).get(&worker).copied();
                if ended.is_some_and(|(life, at)| life == incarnation && sealed.sent_ms <= at) {
                    self.stats.frame_dropped(false);
                    return; // a Register replayed after its life ended
                }
                // Before the replay check: a refused Register is not the
                // newest of its stream (the real life's would be dropped).
                if self.takes_a_live_id(worker, incarnation, &http_addr) {
                    self.stats.frame_dropped(false);
                    return;
                }
                if !is_new(Stream::Register(worker), incarnation) {
                    self.stats.frame_dropped(false);
                    return; // a heartbeat replayed (or one sealed before the newest)
                }
                self.register(subject, worker, incarnation, sealed.sent_ms, (dp_size, &model, &http_addr));
            }
            Frame::Load { worker, incarnation, rank, seq, load } => {
                if !self.is_registered(subject, worker, incarnation) {
                    self.stats.frame_dropped(false);
                    return;
                }
                let report = LoadReport { worker, incarnation, rank, publisher: Publisher::Worker, seq, load };
                match self.monitor.apply(&report) {
                    Ok(applied @ (Applied::Stored | Applied::Flipped)) => {
                        // Heard (and back in routing) only now: a Load
                        // replayed is stale, and says nothing of the worker.
                        self.heard(subject, worker, incarnation);
                        self.stats.load_applied(applied == Applied::Flipped);
                        if applied == Applied::Flipped {
                            self.stats.flip_lag(sealed.sent_ms, unix_ms());
                        }
                    }
                    Ok(_) => {}
                    Err(error) => tracing::debug!(worker, %error, "NATS load not applied"),
                }
            }
            Frame::Deregister { worker, incarnation } => {
                let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
                let ours = known.get(&worker).is_some_and(|k| {
                    k.incarnation == incarnation && k.subject == subject && sealed.sent_ms >= k.since_ms
                });
                if !ours {
                    self.stats.frame_dropped(false);
                    return;
                }
                known.remove(&worker);
                drop(known);
                self.ended.lock().unwrap_or_else(|e| e.into_inner()).insert(worker, (incarnation, sealed.sent_ms));
                self.forget(worker, incarnation);
            }
            Frame::FrontendLoad { frontend, incarnation, seq, worker, worker_incarnation, rank, load } => {
                let Some(peers) = &self.peers else { return };
                if subject != self.subjects.frontend(frontend) {
                    self.stats.frame_dropped(false);
                    return;
                }
                let added = Added { frontend, incarnation, seq, worker, worker_incarnation, rank, load };
                match peers.load(added) {
                    Heard::Taken | Heard::Changed => self.stats.shared_load_applied(),
                    Heard::Own => {}
                    Heard::Dropped => self.stats.frame_dropped(false),
                }
            }
            Frame::FrontendBeat { frontend, incarnation, in_flight, waiting, lines } => {
                let Some(peers) = &self.peers else { return };
                let holds = Holding { in_flight, waiting, lines };
                if subject != self.subjects.frontend(frontend) || !is_new(Stream::Beat(frontend), incarnation) {
                    self.stats.frame_dropped(false);
                    return;
                }
                match peers.beat(frontend, incarnation, holds) {
                    Heard::Dropped => self.stats.frame_dropped(false),
                    // Its lines changed: the split of the reports soon, not
                    // at the next sweep.
                    Heard::Changed => self.lines_changed.notify_one(),
                    Heard::Taken | Heard::Own => {}
                }
            }
            Frame::FrontendAck { frontend, incarnation, acks } => {
                let Some(peers) = &self.peers else { return };
                if subject != self.subjects.frontend(frontend) || !is_new(Stream::Ack(frontend), incarnation) {
                    self.stats.frame_dropped(false);
                    return;
                }
                if peers.ack(frontend, incarnation, &acks) == Heard::Dropped {
                    self.stats.frame_dropped(false);
                }
            }
            // Handshake frames have no place on NATS.
            _ => {}
        }
    }

    /// Tells the other frontends which of their frames this one applied
    /// since the last ack (their lease references), in as few frames as fit.
    async fn acknowledge(&self) {
        let (Some(peers), Some((outbox, own))) = (&self.peers, &self.acks) else { return };
        let acks = peers.acks();
        for chunk in acks.chunks(MAX_ACKS) {
            let frame =
                Frame::FrontendAck { frontend: own.frontend, incarnation: own.incarnation, acks: chunk.to_vec() };
            outbox.send(&frame).await;
        }
    }

    /// What the other frontends hold, as their beats said, to the monitor's
    /// lines and the pool-wide hint.
    fn share_pool(&self, peers: &Peers) {
        let pool = peers.pool();
        // Every run again (an ack may have been lost), and any end of runs
        // a plane other than this one caused (a TCP worker forgotten).
        peers.ack_again();
        self.ack_ready.notify_one();
        self.stats.set_shared_frontends(pool.frontends);
        // Each model's lines share its workers' reports with the others'
        // by their waiters (one dispatch per report between them).
        for model in self.monitor.models() {
            let share = pool.lines.get(&model_key(&model)).copied().unwrap_or_default();
            self.monitor.share_reports(&model, share.ahead, share.others);
        }
        if let Some(hint) = &self.pool_hint {
            // Not `pool.waiting`, every model's: a refusal counts its own
            // model's line across the pool (`Frontend::waiting`, from the
            // reports' shares set above).
            hint.set_others(pool.frontends as u64 - 1, pool.in_flight, 0);
        }
    }
}

mod known;
mod link;
mod replays;
#[cfg(test)]
mod tests;
mod workers;
