//! Worker side of the NATS plane: [`NatsPublisher`], a task that publishes
//! the worker's sealed frames to its subject — each rank's load when it
//! changes, everything again every heartbeat and whenever a frontend says
//! hello, and the Deregister at shutdown. While NATS is away nothing is
//! published (the client would queue every frame, up to `--nats-buffer`,
//! and send them all, stale, on its return): the task keeps only each
//! rank's latest load, which its next heartbeat (or a frontend's hello)
//! sends.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt as _;
use loadgate::wire::envelope::{Sealer, MAX_SUBJECT};
use loadgate::wire::Frame;
use loadgate::RankLoad;
use tokio::sync::Notify;

use super::seal_clock::SEAL_CLOCK;
use super::subjects::Subjects;
use crate::events::{Registration, ReportSeq};
use crate::secret::Secrets;

/// What the task publishes next.
#[derive(Default)]
struct State {
    latest: Vec<Option<RankLoad>>,
    /// Ranks whose latest load is not published yet.
    changed: Vec<bool>,
    stop: bool,
}

/// Publishes one worker's registration and load to NATS; dropping it (or
/// [`NatsPublisher::shutdown`]) sends the Deregister.
pub(crate) struct NatsPublisher {
    state: Arc<(Mutex<State>, Notify)>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl NatsPublisher {
    /// Starts publishing `registration` over `link` (call from within a
    /// tokio runtime); reports are numbered from `seq`.
    pub(crate) fn start(
        link: &NatsLink,
        registration: Registration,
        heartbeat: Duration,
        secrets: Arc<Secrets>,
        seq: ReportSeq,
    ) -> NatsPublisher {
        let (client, subjects) = (link.client.clone(), &link.subjects);
        let hello = subjects.hello();
        let dp = registration.dp_size as usize;
        let state = Arc::new((
            Mutex::new(State { latest: vec![None; dp], changed: vec![false; dp], stop: false }),
            Notify::new(),
        ));
        let sender = Sender {
            client,
            subject: subjects.events(&registration.model, registration.worker),
            registration,
            sealer: secrets.sealer(),
            seq,
        };
        let shared = state.clone();
        let task = tokio::spawn(async move {
            let hellos = match sender.client.subscribe(hello).await {
                Ok(hellos) => Some(hellos),
                Err(error) => {
                    tracing::warn!(%error, "no NATS hello subscription: announcing only every heartbeat");
                    None
                }
            };
            run(sender, shared, hellos, heartbeat).await;
        });
        NatsPublisher { state, task: Mutex::new(Some(task)) }
    }

    /// Records `rank`'s load; the task publishes it (coalesced: only the
    /// latest of those made while it is busy).
    pub(crate) fn report(&self, rank: u32, load: RankLoad) {
        let (state, wake) = &*self.state;
        let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
        let rank = rank as usize;
        if rank < state.latest.len() && state.latest[rank] != Some(load) {
            state.latest[rank] = Some(load);
            state.changed[rank] = true;
            drop(state);
            wake.notify_one();
        }
    }

    /// Forgets every rank's latest load: heartbeats carry none until the
    /// next report (the Register alone keeps the worker alive), so the
    /// frontends let the last one age out (`--load-staleness-ms`).
    pub(crate) fn forget_loads(&self) {
        let mut state = self.state.0.lock().unwrap_or_else(|e| e.into_inner());
        state.latest.iter_mut().for_each(|load| *load = None);
        state.changed.iter_mut().for_each(|changed| *changed = false);
    }

    /// Sends the Deregister and waits (bounded: 2 s) until NATS has it;
    /// true when it did in time.
    pub(crate) async fn shutdown(&self) -> bool {
        self.stop();
        let task = self.task.lock().unwrap_or_else(|e| e.into_inner()).take();
        match task {
            Some(task) => tokio::time::timeout(Duration::from_secs(2), task).await.is_ok(),
            None => true,
        }
    }

    fn stop(&self) {
        let (state, wake) = &*self.state;
        state.lock().unwrap_or_else(|e| e.into_inner()).stop = true;
        wake.notify_one();
    }
}

impl Drop for NatsPublisher {
    fn drop(&mut self) {
        // The task sends the Deregister on its own (if the runtime still runs).
        self.stop();
    }
}

/// Seals and publishes the worker's frames.
struct Sender {
    client: async_nats::Client,
    subject: String,
    registration: Registration,
    /// The current event secret, prepared.
    sealer: Sealer,
    seq: ReportSeq,
}

impl Sender {
    async fn send(&self, frame: &Frame) {
        if !super::state::connected(&self.client) {
            return; // see the module docs
        }
        let mut buf = bytes::BytesMut::new();
        match self.sealer.seal(&self.subject, SEAL_CLOCK.now_ms(), frame, &mut buf) {
            Ok(()) => {
                let payload = buf.freeze();
                if let Err(error) = self.client.publish(self.subject.clone(), payload).await {
                    tracing::debug!(%error, "NATS publish failed (the client reconnects)");
                }
            }
            Err(error) => tracing::warn!(%error, kind = frame.kind_name(), "frame not sealed"),
        }
    }

    fn register(&self) -> Frame {
        let r = &self.registration;
        Frame::Register {
            worker: r.worker,
            incarnation: r.incarnation,
            dp_size: r.dp_size,
            model: r.model.clone(),
            http_addr: r.http_addr.clone(),
        }
    }

    fn load(&self, rank: usize, load: RankLoad) -> Frame {
        let r = &self.registration;
        Frame::Load { worker: r.worker, incarnation: r.incarnation, rank: rank as u32, seq: self.seq.next(), load }
    }
}

/// How long after a change its load is sent again, twice: core NATS
/// delivers at most once, and a frontend under a flood of forged frames
/// drops a few of what it receives (in bursts while its buffer is full);
/// a repeat soon and one later (each a new seq and the rank's latest load)
/// make a lost change rare without waiting for the heartbeat.
const REPEATS: [Duration; 2] = [Duration::from_millis(5), Duration::from_millis(50)];

/// The task: loads as they change (and again after each of [`REPEATS`]),
/// everything at each heartbeat and hello, the Deregister at the end.
///
/// A hello is answered at once unless everything went out less than half a
/// heartbeat ago; then at that half heartbeat, once however many came. The
/// hello subject carries no seal (any client on the namespace can publish
/// it), and each answer costs every frontend an authenticated Register and
/// a Load per rank: a flood of hellos adds at most two answers per
/// heartbeat.
async fn run(
    sender: Sender,
    state: Arc<(Mutex<State>, Notify)>,
    mut hellos: Option<async_nats::Subscriber>,
    heartbeat: Duration,
) {
    let mut ticks = tokio::time::interval(heartbeat);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut everything = true;
    // The least time between two answers to hellos, and when everything
    // last went out; a hello that came sooner is owed until then.
    let spacing = heartbeat / 2;
    let mut sent_all = tokio::time::Instant::now();
    let mut owed = false;
    // Per rank, when each repeat of its last change is due.
    let dp = state.0.lock().unwrap_or_else(|e| e.into_inner()).latest.len();
    let mut repeats: Vec<[Option<tokio::time::Instant>; REPEATS.len()]> = vec![[None; REPEATS.len()]; dp];
    loop {
        let (pending, stop) = {
            let mut s = state.0.lock().unwrap_or_else(|e| e.into_inner());
            let pending: Vec<(usize, RankLoad)> = (0..s.latest.len())
                .filter_map(|rank| {
                    let due = everything || s.changed[rank];
                    s.changed[rank] = false;
                    s.latest[rank].filter(|_| due).map(|load| (rank, load))
                })
                .collect();
            (pending, s.stop)
        };
        if stop {
            break;
        }
        let now = tokio::time::Instant::now();
        if everything {
            sender.send(&sender.register()).await;
            (sent_all, owed) = (now, false);
        }
        for &(rank, load) in &pending {
            sender.send(&sender.load(rank, load)).await;
            if !everything {
                repeats[rank] = REPEATS.map(|after| Some(now + after));
            }
        }
        everything = false;
        let next_repeat = repeats.iter().flatten().flatten().min().copied();
        tokio::select! {
            () = state.1.notified() => {}
            _ = ticks.tick() => everything = true,
            Some(_) = next_hello(&mut hellos) => match sent_all.elapsed() >= spacing {
                true => everything = true,
                false => owed = true,
            },
            () = tokio::time::sleep_until(sent_all + spacing), if owed => everything = true,
            () = tokio::time::sleep_until(next_repeat.unwrap_or(now)), if next_repeat.is_some() => {
                let now = tokio::time::Instant::now();
                let latest = state.0.lock().unwrap_or_else(|e| e.into_inner()).latest.clone();
                for (rank, dues) in repeats.iter_mut().enumerate() {
                    let mut due_now = false;
                    for due in dues.iter_mut() {
                        if due.is_some_and(|at| at <= now) {
                            *due = None;
                            due_now = true;
                        }
                    }
                    if let (true, Some(load)) = (due_now, latest[rank]) {
                        sender.send(&sender.load(rank, load)).await;
                    }
                }
            }
        }
    }
    let r = &sender.registration;
    sender.send(&Frame::Deregister { worker: r.worker, incarnation: r.incarnation }).await;
    let _ = tokio::time::timeout(Duration::from_secs(1), sender.client.flush()).await;
}

/// The next hello (never, without the subscription).
async fn next_hello(hellos: &mut Option<async_nats::Subscriber>) -> Option<async_nats::Message> {
    match hellos {
        Some(hellos) => hellos.next().await,
        None => std::future::pending().await,
    }
}

/// A worker's connection to NATS and its namespace's subjects (one per
/// worker; every publisher of it, after a rejoin too, shares it).
#[derive(Clone, Debug)]
pub(crate) struct NatsLink {
    pub(crate) client: async_nats::Client,
    pub(crate) subjects: Subjects,
}

impl NatsLink {
    /// Whether `registration`'s frames can be sealed: its subject (the
    /// model name escaped, the id) within the envelope's limit. A model
    /// name long enough to pass a raised `--max-name-len` may not be.
    ///
    /// # Errors
    ///
    /// The subject is too long: the worker could never register.
    pub(crate) fn check(&self, registration: &Registration) -> anyhow::Result<()> {
        let subject = self.subjects.events(&registration.model, registration.worker);
        anyhow::ensure!(
            subject.len() <= MAX_SUBJECT,
            "the model name {:?} makes a NATS subject of {} bytes (at most {MAX_SUBJECT}; bytes outside \
             A-Z a-z 0-9 _ - take 3 each): the worker could never register; use a shorter name",
            registration.model,
            subject.len()
        );
        Ok(())
    }
}

impl std::fmt::Debug for NatsPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsPublisher").finish_non_exhaustive()
    }
}
