//! The lease's bound under any delivery order: k frontends, each its own
//! [`WorkerMonitor`] (lease on), [`Peers`] and reference, admit to two
//! workers whose own reports carry no prefill, through their real busy
//! decision. Frames between each pair of frontends keep their order (one
//! nats-server) but are delivered at random moments, and some are lost
//! (NATS delivers at most once): a frontend may hear another long after
//! that one heard its own frame back, the case that let 1.7× a threshold
//! through in CI. Across seeded random schedules, after every step, each
//! frontend's view of each other on each worker is at least that one's
//! reference, and no worker's load passes threshold + k requests (a lost
//! frame for one worker followed by one for the other is a gap the
//! acknowledgements must show); a reference
//! taken as soon as a frame is sent (what an echo gives when the others
//! lag) lets it through, so the model tells the two apart.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use loadgate::monitor::{Publisher, SharedLoad};
use loadgate::wire::Ack;
use loadgate::{BusyThresholds, LoadReport, MonitorConfig, RankLoad, WorkerMonitor};

use super::peers::{Added, Heard, Peers};
use super::publish::Identity;

const THRESHOLD: u32 = 1000;
const REQUEST: u32 = 100;

enum Message {
    Load(Added),
    Ack(Vec<Ack>),
}

struct Frontend {
    identity: Identity,
    monitor: Arc<WorkerMonitor>,
    peers: Peers,
    seq: u64,
    /// What it applied of each other frontend's load on each worker
    /// (prefill tokens).
    views: Vec<[u32; 2]>,
}

const WORKERS: [u64; 2] = [1, 2];

impl Frontend {
    fn new(id: u64, k: usize) -> Frontend {
        let config = MonitorConfig {
            default_thresholds: BusyThresholds {
                active_prefill_tokens_threshold: Some(THRESHOLD.into()),
                ..Default::default()
            },
            shared: SharedLoad { frontends: k as u16, staleness: Duration::from_secs(3600), lease: true },
            ..Default::default()
        };
        let monitor = Arc::new(WorkerMonitor::new(config).unwrap());
        for worker in WORKERS {
            monitor.register(worker, "m", 1, 7).unwrap();
            let load = RankLoad { kv_total_blocks: 1000, ..Default::default() };
            let report = LoadReport { worker, incarnation: 7, rank: 0, publisher: Publisher::Worker, seq: 1, load };
            monitor.apply(&report).unwrap();
        }
        let identity = Identity { frontend: id, incarnation: 1 };
        let peers = Peers::new(identity, monitor.clone(), k as u16, Duration::from_secs(3600));
        Frontend { identity, monitor, peers, seq: 0, views: vec![[0; 2]; k] }
    }

    fn tracked(&self, worker: u64) -> u32 {
        self.monitor.tracked(worker, 0).map_or(0, |(_, load)| load.active_prefill_tokens)
    }

    fn reference(&self, worker: u64) -> u32 {
        self.peers.links().reference.of((worker, 0)).map_or(0, |l| l.active_prefill_tokens)
    }

    /// Tracks `tokens` more (or fewer, or none: a resend) on `worker` and
    /// publishes the result.
    fn publish(&mut self, worker: u64, tokens: i64) -> Added {
        if tokens != 0 {
            self.monitor.track(worker, 7, 0, 0, tokens).unwrap();
        }
        self.seq += 1;
        let load = self.monitor.tracked(worker, 0).unwrap().1;
        self.peers.links().reference.published((worker, 0), 7, self.seq, load);
        let (frontend, incarnation) = (self.identity.frontend, self.identity.incarnation);
        Added { frontend, incarnation, seq: self.seq, worker, worker_incarnation: 7, rank: 0, load }
    }
}

/// One random schedule; the most the worker held at once. `eager`: each
/// frontend takes its frame as seen by all the moment it sends it.
fn schedule(seed: u64, k: usize, steps: usize, eager: bool) -> u32 {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut fes: Vec<Frontend> = (0..k).map(|i| Frontend::new(100 + i as u64, k)).collect();
    // Everyone hears everyone's beat first: k is right everywhere.
    for i in 0..k {
        for j in (0..k).filter(|&j| j != i) {
            let id = fes[j].identity;
            fes[i].peers.beat(id.frontend, id.incarnation, Default::default());
        }
        assert_eq!(fes[i].peers.pool().frontends, k);
    }
    // `wires[from][to]`: in order, delivered at random.
    let mut wires: Vec<Vec<VecDeque<Message>>> = (0..k).map(|_| (0..k).map(|_| VecDeque::new()).collect()).collect();
    let mut peak = 0;
    let mut sends: Vec<Added> = Vec::new();
    for _ in 0..steps {
        let i = rng.usize(..k);
        let w = WORKERS[rng.usize(..2)];
        let change = match rng.u8(..40) {
            0..=17 if !fes[i].monitor.is_busy(w) => Some(i64::from(REQUEST)),
            18..=19 if fes[i].tracked(w) > 0 => Some(-i64::from(REQUEST)),
            // A beat: a frontend asked to publish everything again does.
            20 if fes[i].peers.links().newcomer.swap(false, Ordering::Relaxed) => Some(0),
            0..=20 => None,
            _ => {
                // One frame from a random sender to frontend i; with
                // odd seeds, one in twenty is lost.
                let from = rng.usize(..k);
                let Some(message) = wires[from][i].pop_front() else { continue };
                if seed % 2 == 1 && rng.u8(..20) == 0 {
                    continue;
                }
                match message {
                    Message::Load(added) => {
                        if fes[i].peers.load(added) == Heard::Taken {
                            fes[i].views[from][(added.worker - 1) as usize] = added.load.active_prefill_tokens;
                        }
                        let acks = fes[i].peers.acks();
                        wires[i][from].push_back(Message::Ack(acks));
                    }
                    Message::Ack(acks) => {
                        let sender = fes[from].identity;
                        fes[i].peers.ack(sender.frontend, sender.incarnation, &acks);
                    }
                }
                None
            }
        };
        if let Some(tokens) = change {
            // A resend publishes both workers.
            let workers: &[u64] = if tokens == 0 { &WORKERS } else { std::slice::from_ref(&w) };
            sends.clear();
            sends.extend(workers.iter().map(|&w| fes[i].publish(w, tokens)));
            for added in &sends {
                if eager {
                    let reference = fes[i].peers.links().reference;
                    for j in (0..k).filter(|&j| j != i) {
                        reference.acked(fes[j].identity.frontend, 1, 1, added.seq);
                    }
                }
                (0..k).filter(|&j| j != i).for_each(|j| wires[i][j].push_back(Message::Load(*added)));
            }
        }
        for w in WORKERS {
            peak = peak.max(fes.iter().map(|f| f.tracked(w)).sum());
        }
        if !eager {
            for (a, fa) in fes.iter().enumerate() {
                for (p, fp) in fes.iter().enumerate().filter(|&(p, _)| p != a) {
                    for w in WORKERS {
                        let (view, reference) = (fp.views[a][(w - 1) as usize], fa.reference(w));
                        assert!(
                            view >= reference,
                            "seed {seed}: {p} holds {view} of {a} on worker {w}, whose reference is {reference}"
                        );
                    }
                }
            }
        }
    }
    peak
}

#[test]
fn k_frontends_stay_within_threshold_plus_k_requests_under_any_delivery_order() {
    for k in [2, 3, 5] {
        let bound = THRESHOLD + k as u32 * REQUEST;
        let mut highest = 0;
        for seed in 0..60 {
            let peak = schedule(seed, k, 2000, false);
            assert!(peak <= bound, "k = {k}, seed {seed}: the worker held {peak} tokens, bound {bound}");
            highest = highest.max(peak);
        }
        // The schedules press on the bound: it is neared, not only kept.
        eprintln!("k = {k}: highest {highest} tokens, bound {bound}");
        assert!(highest >= bound - REQUEST, "k = {k}: the schedules never neared the bound ({highest})");
    }
}

#[test]
fn a_reference_taken_before_the_others_have_applied_it_lets_the_worker_overfill() {
    let k = 3;
    let bound = THRESHOLD + k as u32 * REQUEST;
    let over = (0..60).filter(|&seed| schedule(seed, k, 2000, true) > bound).count();
    assert!(over > 0, "the model never told an eager reference from an acknowledged one");
}
