//! Model-based property test: random sequences of register (incarnations
//! included) / report / track / capacity / threshold (all four signals) /
//! route / deregister / expire operations run against
//! the real `WorkerMonitor` + `WorkerRouter` and against a plain single-threaded
//! reference written here (maps, `u128` arithmetic, straightforward loops).
//! After every operation the two must agree on each call's result, on every
//! worker's busy bit, on every published busy set, and on each rank's load.
//!
//! `PROPTEST_CASES` overrides the number of cases (default 256).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use loadgate::*;
use loadgate::{monitor::*, route::*, thresholds::*};
use proptest::prelude::*;

const MODELS: [&str; 4] = ["a", "b", "c", ""];
const WORKERS: u64 = 8;
const PPB: u128 = 1_000_000_000;

// ---------------------------------------------------------------- operations

/// A route's exclusions: mostly a few, sometimes more than the router
/// searches as a list (with repeats: the ids run to `WORKERS + 2`).
fn exclusions() -> impl Strategy<Value = Vec<u64>> {
    prop_oneof![
        3 => prop::collection::vec(0..WORKERS + 2, 0..4),
        1 => prop::collection::vec(0..WORKERS + 2, 17..24),
    ]
}

/// A threshold field's new value: in exact integer form (what the person
/// wrote, in ppb for the fractions), or an invalid float.
#[derive(Clone, Copy, Debug)]
enum Value {
    Clear,
    Set(u64),
    Invalid(f64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    Decode,
    Prefill,
    Frac,
    Waiting,
}

#[derive(Clone, Debug)]
enum Op {
    Register {
        worker: u64,
        model: usize,
        dp: u32,
        incarnation: u64,
    },
    Deregister {
        worker: u64,
    },
    AddModel {
        model: usize,
    },
    Report {
        worker: u64,
        rank: u32,
        /// 0: the worker, 1: the router, 2 + n: other frontend n (n = 2 is
        /// one more than the monitor keeps).
        publisher: u8,
        seq_step: i64,
        /// The worker's current incarnation, or (Some) this one.
        incarnation: Option<u64>,
        load: RankLoad,
    },
    Track {
        worker: u64,
        rank: u32,
        blocks: i64,
        tokens: i64,
    },
    /// Forget what other frontend `n` published.
    ClearFrontend {
        n: u16,
    },
    Capacity {
        worker: u64,
        rank: u32,
        kv: u32,
        mnbt: u32,
    },
    SetAll {
        model: usize,
        decode: Option<u64>,
        prefill: Option<u64>,
        frac: Option<u64>,
        waiting: Option<u64>,
    },
    Edit {
        model: usize,
        field: Field,
        value: Value,
    },
    /// `local`: through a long-lived `LocalRouter` (cached view) of the policy.
    Route {
        model: usize,
        policy: usize,
        local: bool,
        exclude: Vec<u64>,
    },
    Advance {
        ms: u64,
    },
}

fn decode_ppb() -> impl Strategy<Value = u64> {
    prop_oneof![
        prop::sample::select(vec![
            0u64,
            100_000_000,
            290_000_000,
            333_333_333,
            500_000_000,
            700_000_000,
            850_000_000,
            1_000_000_000
        ]),
        0u64..=1_000_000_000,
    ]
}

fn frac_ppb() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => prop::sample::select(vec![0u64, 100_000_000, 333_333_333, 500_000_000, 1_000_000_000, 1_500_000_000]),
        4 => 0u64..=2_000_000_000,
        1 => 0u64..=1_000_000_000_000_000, // up to MAX_PREFILL_FRAC
    ]
}

fn value(field: Field) -> BoxedStrategy<Value> {
    let set = match field {
        Field::Decode => decode_ppb().boxed(),
        Field::Prefill | Field::Waiting => (0u64..16).boxed(),
        Field::Frac => frac_ppb().boxed(),
    };
    let invalid = match field {
        Field::Decode => prop::sample::select(vec![f64::NAN, f64::INFINITY, -0.1, 1.5, 1.000_001]).boxed(),
        Field::Frac => prop::sample::select(vec![f64::NAN, f64::NEG_INFINITY, -0.1, 1e7]).boxed(),
        // Unused: the absolute thresholds are integers.
        Field::Prefill | Field::Waiting => Just(f64::NAN).boxed(),
    };
    let invalid_weight = if matches!(field, Field::Prefill | Field::Waiting) { 0 } else { 1 };
    prop_oneof![3 => Just(Value::Clear), 6 => set.prop_map(Value::Set), invalid_weight => invalid.prop_map(Value::Invalid)]
        .boxed()
}

fn load() -> impl Strategy<Value = RankLoad> {
    (0u32..=12, 0u32..=10, 0u32..=20, 0u32..=10, 0u32..=12).prop_map(|(a, t, p, m, w)| RankLoad {
        active_decode_blocks: a,
        kv_total_blocks: t,
        active_prefill_tokens: p,
        max_num_batched_tokens: m,
        waiting_requests: w,
    })
}

fn op() -> impl Strategy<Value = Op> {
    let worker = 0..WORKERS;
    let model = prop_oneof![12 => 0usize..3, 1 => Just(3usize)];
    prop_oneof![
        3 => (worker.clone(), model.clone(), prop_oneof![10 => 1u32..=4, 1 => Just(0u32), 1 => Just(65_537u32)], 0u64..3)
            .prop_map(|(worker, model, dp, incarnation)| Op::Register { worker, model, dp, incarnation }),
        1 => worker.clone().prop_map(|worker| Op::Deregister { worker }),
        1 => model.clone().prop_map(|model| Op::AddModel { model }),
        10 => (worker.clone(), 0u32..5, 0u8..=4, -2i64..=3, prop::option::weighted(0.15, 0u64..3), load())
            .prop_map(|(worker, rank, publisher, seq_step, incarnation, load)| {
                Op::Report { worker, rank, publisher, seq_step, incarnation, load }
            }),
        1 => (0u16..=FRONTENDS).prop_map(|n| Op::ClearFrontend { n }),
        3 => (worker.clone(), 0u32..5, -6i64..=8, -6i64..=8)
            .prop_map(|(worker, rank, blocks, tokens)| Op::Track { worker, rank, blocks, tokens }),
        1 => (worker.clone(), 0u32..5, 0u32..=10, 0u32..=10)
            .prop_map(|(worker, rank, kv, mnbt)| Op::Capacity { worker, rank, kv, mnbt }),
        2 => (
            model.clone(),
            prop::option::of(decode_ppb()),
            prop::option::of(0u64..16),
            prop::option::of(frac_ppb()),
            prop::option::of(0u64..8)
        )
            .prop_map(|(model, decode, prefill, frac, waiting)| Op::SetAll { model, decode, prefill, frac, waiting }),
        3 => (model.clone(), prop::sample::select(vec![Field::Decode, Field::Prefill, Field::Frac, Field::Waiting]))
            .prop_flat_map(|(model, field)| value(field).prop_map(move |value| Op::Edit { model, field, value })),
        8 => (model.clone(), 0usize..6, any::<bool>(), exclusions())
            .prop_map(|(model, policy, local, exclude)| Op::Route { model, policy, local, exclude }),
        2 => (0u64..=30).prop_map(|ms| Op::Advance { ms }),
    ]
}

// ---------------------------------------------------------------- reference

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct RefThresholds {
    decode: Option<u64>,
    prefill: Option<u64>,
    frac: Option<u64>,
    waiting: Option<u64>,
}

impl RefThresholds {
    fn enabled(&self) -> bool {
        self.decode.is_some() || self.prefill.is_some() || self.frac.is_some() || self.waiting.is_some()
    }

    /// `active / total > ppb / 1e9`, exactly, for each configured signal.
    fn rank_busy(&self, l: &RankLoad) -> bool {
        let over = |active: u32, ppb: u64, total: u32| u128::from(active) * PPB > u128::from(ppb) * u128::from(total);
        let decode = matches!(self.decode, Some(ppb) if l.kv_total_blocks != 0 && over(l.active_decode_blocks, ppb, l.kv_total_blocks));
        let prefill = matches!(self.prefill, Some(limit) if u64::from(l.active_prefill_tokens) > limit);
        let frac = matches!(self.frac, Some(ppb) if l.max_num_batched_tokens != 0
            && over(l.active_prefill_tokens, ppb, l.max_num_batched_tokens));
        let waiting = matches!(self.waiting, Some(limit) if u64::from(l.waiting_requests) > limit);
        decode || prefill || frac || waiting
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct RefSlot {
    load: RankLoad,
    /// The last applied report's seq; `None`: no report yet this incarnation.
    seq: Option<u64>,
    /// Nanoseconds of the last store; `None`: never.
    at: Option<u64>,
}

#[derive(Clone, Debug)]
struct RefWorker {
    model: String,
    dp: u32,
    incarnation: u64,
    reported: Vec<RefSlot>,
    tracked: Vec<RefSlot>,
    /// Other frontends' publications, `[frontend][rank]`.
    shared: Vec<Vec<RefSlot>>,
}

#[derive(Debug)]
struct Reference {
    now: u64,
    staleness: Option<u64>,
    default_thresholds: RefThresholds,
    workers: BTreeMap<u64, RefWorker>,
    models: BTreeMap<String, RefThresholds>,
    /// Models named by `add_model` or given thresholds: they stay without
    /// workers; any other model is forgotten when its last worker leaves.
    kept: BTreeSet<String>,
    /// Round-robin (and tie-rotation) cursor per router (policy) and model.
    cursor: BTreeMap<(usize, String), usize>,
    /// When each other frontend was last heard (one past `now`), by index:
    /// a publication after a silence past the shared window drops what it
    /// published before (`WorkerMonitor::apply`).
    heard: BTreeMap<u16, u64>,
}

impl Reference {
    /// After a worker of `model` left: forgets the model (its thresholds, and
    /// every router's rotation over it) if it is not kept and has no worker.
    fn forget_if_unused(&mut self, model: &str) {
        if self.kept.contains(model) || self.workers.values().any(|w| w.model == model) {
            return;
        }
        self.models.remove(model);
        self.cursor.retain(|(_, name), _| name != model);
    }

    fn reported(&self, w: &RefWorker, rank: u32) -> Option<RankLoad> {
        let slot = w.reported[rank as usize];
        let at = slot.at?;
        let fresh = self.staleness.is_none_or(|window| self.now - at <= window);
        fresh.then_some(slot.load)
    }

    fn tracked(&self, w: &RefWorker, rank: u32) -> Option<RankLoad> {
        let slot = w.tracked[rank as usize];
        slot.at.map(|_| slot.load)
    }

    /// The fresh publications of other frontends, summed in index order
    /// (denominators: the first known).
    fn shared(&self, w: &RefWorker, rank: u32) -> Option<RankLoad> {
        let fresh = w.shared.iter().map(|slots| slots[rank as usize]);
        let fresh = fresh.filter(|s| s.at.is_some_and(|at| self.now - at <= SHARED_STALENESS_NS));
        fresh.map(|s| s.load).reduce(|a, b| sum(&a, &b))
    }

    /// The larger numerators of the worker's report and of the tracked and
    /// shared loads summed; the reported denominator unless it is unknown.
    fn effective(&self, w: &RefWorker, rank: u32) -> Option<RankLoad> {
        let added = match (self.tracked(w, rank), self.shared(w, rank)) {
            (Some(t), Some(s)) => Some(sum(&t, &s)),
            (t, s) => t.or(s),
        };
        match (self.reported(w, rank), added) {
            (Some(r), Some(t)) => Some(RankLoad {
                active_decode_blocks: r.active_decode_blocks.max(t.active_decode_blocks),
                kv_total_blocks: if r.kv_total_blocks != 0 { r.kv_total_blocks } else { t.kv_total_blocks },
                active_prefill_tokens: r.active_prefill_tokens.max(t.active_prefill_tokens),
                max_num_batched_tokens: if r.max_num_batched_tokens != 0 {
                    r.max_num_batched_tokens
                } else {
                    t.max_num_batched_tokens
                },
                waiting_requests: r.waiting_requests.max(t.waiting_requests),
            }),
            (r, t) => r.or(t),
        }
    }

    fn busy(&self, id: u64) -> bool {
        let Some(w) = self.workers.get(&id) else { return false };
        let t = self.models[&w.model];
        if !t.enabled() {
            return false;
        }
        (0..w.dp).all(|rank| self.effective(w, rank).is_some_and(|l| t.rank_busy(&l)))
    }

    fn busy_bits(&self) -> BTreeMap<u64, bool> {
        self.workers.keys().map(|&id| (id, self.busy(id))).collect()
    }

    /// (decode blocks, total blocks, prefill tokens, waiting requests)
    /// summed over ranks.
    fn load(&self, id: u64) -> (u64, u64, u64, u64) {
        let w = &self.workers[&id];
        let mut sum = (0, 0, 0, 0);
        for rank in 0..w.dp {
            if let Some(l) = self.effective(w, rank) {
                sum.0 += u64::from(l.active_decode_blocks);
                sum.1 += u64::from(l.kv_total_blocks);
                sum.2 += u64::from(l.active_prefill_tokens);
                sum.3 += u64::from(l.waiting_requests);
            }
        }
        sum
    }

    /// Strictly less loaded: lower decode utilisation (unknown capacity counts
    /// as 1), then fewer prefill tokens, then fewer waiting requests.
    fn less_loaded(&self, a: u64, b: u64) -> bool {
        let (la, lb) = (self.load(a), self.load(b));
        let ua = u128::from(la.0) * u128::from(lb.1.max(1));
        let ub = u128::from(lb.0) * u128::from(la.1.max(1));
        ua < ub || (ua == ub && (la.2, la.3) < (lb.2, lb.3))
    }

    fn instances(&self, model: &str) -> Vec<u64> {
        self.workers.iter().filter(|(_, w)| w.model == model).map(|(&id, _)| id).collect()
    }
}

fn cost(id: WorkerId, load: &WorkerLoad) -> u64 {
    (id * 7 + load.active_decode_blocks + load.active_prefill_tokens) % 5
}

/// The slots of publisher `p` (as [`Op::Report`] numbers them), if kept.
fn slots_of(w: &RefWorker, p: u8) -> Option<&Vec<RefSlot>> {
    match p {
        0 => Some(&w.reported),
        1 => Some(&w.tracked),
        n => w.shared.get(usize::from(n - 2)),
    }
}

/// Other frontends the monitor keeps, and how long their publications count.
const FRONTENDS: u16 = 2;
const SHARED_STALENESS_NS: u64 = 40_000_000;

/// Numerators added (saturating); each denominator from `a` unless unknown.
fn sum(a: &RankLoad, b: &RankLoad) -> RankLoad {
    let first = |x: u32, y: u32| if x != 0 { x } else { y };
    RankLoad {
        active_decode_blocks: a.active_decode_blocks.saturating_add(b.active_decode_blocks),
        kv_total_blocks: first(a.kv_total_blocks, b.kv_total_blocks),
        active_prefill_tokens: a.active_prefill_tokens.saturating_add(b.active_prefill_tokens),
        max_num_batched_tokens: first(a.max_num_batched_tokens, b.max_num_batched_tokens),
        waiting_requests: a.waiting_requests.saturating_add(b.waiting_requests),
    }
}

fn to_real(t: RefThresholds) -> BusyThresholds {
    BusyThresholds {
        active_decode_blocks_threshold: t.decode.map(|p| p as f64 / 1e9),
        active_prefill_tokens_threshold: t.prefill,
        active_prefill_tokens_threshold_frac: t.frac.map(|p| p as f64 / 1e9),
        active_waiting_requests_threshold: t.waiting,
    }
}

fn to_load((a, t, p, w): (u64, u64, u64, u64)) -> WorkerLoad {
    WorkerLoad { active_decode_blocks: a, kv_total_blocks: t, active_prefill_tokens: p, waiting_requests: w }
}

fn assert_thresholds(real: &Thresholds, model: &RefThresholds) -> Result<(), TestCaseError> {
    prop_assert_eq!(real.decode_ppb(), model.decode);
    prop_assert_eq!(real.prefill_tokens(), model.prefill);
    prop_assert_eq!(real.prefill_frac_ppb(), model.frac);
    prop_assert_eq!(real.waiting_requests(), model.waiting);
    Ok(())
}

// ---------------------------------------------------------------- the run

struct System {
    monitor: Arc<WorkerMonitor>,
    mock: Arc<quanta::Mock>,
    routers: Vec<WorkerRouter>,
    /// Long-lived per-thread routers by (model, policy).
    locals: BTreeMap<(String, usize), LocalRouter>,
    model: Reference,
}

impl System {
    fn new(staleness_ms: Option<u64>, default_decode: Option<u64>) -> Self {
        let (clock, mock) = quanta::Clock::mock();
        let default_thresholds = RefThresholds { decode: default_decode, ..Default::default() };
        let config = MonitorConfig {
            staleness: staleness_ms.map(Duration::from_millis),
            default_thresholds: to_real(default_thresholds),
            shared: SharedLoad {
                frontends: FRONTENDS,
                staleness: Duration::from_nanos(SHARED_STALENESS_NS),
                ..Default::default()
            },
            ..Default::default()
        };
        let monitor = Arc::new(WorkerMonitor::with_clock(config, clock).unwrap());
        let cost: CostFn = Arc::new(cost);
        let routers =
            [Policy::RoundRobin, Policy::Random, Policy::PowerOfTwoChoices, Policy::LeastLoaded, Policy::Cost(cost)]
                .into_iter()
                .map(|p| WorkerRouter::new(monitor.clone(), p))
                .collect();
        let model = Reference {
            now: 0,
            staleness: staleness_ms.map(|ms| ms * 1_000_000),
            default_thresholds,
            workers: BTreeMap::new(),
            models: BTreeMap::new(),
            kept: BTreeSet::new(),
            cursor: BTreeMap::new(),
            heard: BTreeMap::new(),
        };
        System { monitor, mock, routers, locals: BTreeMap::new(), model }
    }

    /// The flipped flag a call should report, given the bits before it.
    fn outcome(&self, before: &BTreeMap<u64, bool>, worker: u64) -> Applied {
        if before.get(&worker) != Some(&self.model.busy(worker)) {
            Applied::Flipped
        } else {
            Applied::Stored
        }
    }

    /// Shared checks of a slot-addressing op: the error, if any.
    fn slot_error(&self, worker: u64, rank: u32) -> Option<ApplyError> {
        match self.model.workers.get(&worker) {
            None => Some(ApplyError::UnknownWorker(worker)),
            Some(w) if rank >= w.dp => Some(ApplyError::RankOutOfRange { worker, rank, dp_size: w.dp }),
            Some(_) => None,
        }
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let mut before = self.model.busy_bits();
        match op.clone() {
            Op::Register { worker, model, dp, incarnation } => {
                let name = MODELS[model];
                let real = self.monitor.register(worker, name, dp, incarnation);
                let current = self.model.workers.get(&worker);
                let expected = if dp == 0 || dp > 65_536 {
                    Err(RegisterError::InvalidDpSize(dp))
                } else if name.is_empty() {
                    Err(RegisterError::EmptyModel)
                } else if let Some(w) = current.filter(|w| w.incarnation == incarnation) {
                    // A reconnect keeps the slots; it must say the same.
                    if w.model == name && w.dp == dp {
                        Ok(Registered::Same)
                    } else {
                        Err(RegisterError::Conflict(worker))
                    }
                } else {
                    // New, or a restart: fresh slots, whatever it names now.
                    let outcome = if current.is_some() { Registered::Restarted } else { Registered::New };
                    let fresh = vec![RefSlot::default(); dp as usize];
                    self.model.models.entry(name.to_owned()).or_insert(self.model.default_thresholds);
                    let shared = vec![fresh.clone(); usize::from(FRONTENDS)];
                    let worker_record = RefWorker {
                        model: name.to_owned(),
                        dp,
                        incarnation,
                        reported: fresh.clone(),
                        tracked: fresh,
                        shared,
                    };
                    let old = self.model.workers.insert(worker, worker_record);
                    if let Some(old) = old {
                        self.model.forget_if_unused(&old.model);
                    }
                    Ok(outcome)
                };
                prop_assert_eq!(real, expected);
            }
            Op::Deregister { worker } => {
                let old = self.model.workers.remove(&worker);
                prop_assert_eq!(self.monitor.deregister(worker), old.is_some());
                if let Some(old) = old {
                    self.model.forget_if_unused(&old.model);
                }
            }
            Op::AddModel { model } => {
                let name = MODELS[model];
                // An empty name is refused, as registration refuses it.
                let new = !name.is_empty() && !self.model.models.contains_key(name);
                if !name.is_empty() {
                    self.model.models.entry(name.to_owned()).or_insert(self.model.default_thresholds);
                    self.model.kept.insert(name.to_owned());
                }
                prop_assert_eq!(self.monitor.add_model(name), new);
            }
            Op::Report { worker, rank, publisher: p, seq_step, incarnation, load } => {
                let publisher = match p {
                    0 => Publisher::Worker,
                    1 => Publisher::Router,
                    n => Publisher::Frontend(u16::from(n - 2)),
                };
                let current = self.model.workers.get(&worker);
                let last =
                    current.and_then(|w| slots_of(w, p).and_then(|slots| slots.get(rank as usize)).and_then(|s| s.seq));
                let seq = (last.unwrap_or(0) as i64 + seq_step).max(0) as u64;
                let incarnation = incarnation.or(current.map(|w| w.incarnation)).unwrap_or(0);
                let real = self.monitor.apply(&LoadReport { worker, incarnation, rank, publisher, seq, load });
                let unkept = u16::from(p.saturating_sub(2)) >= FRONTENDS;
                if let (Publisher::Frontend(n), false) = (publisher, unkept) {
                    // Heard now, whatever becomes of the report; after a
                    // silence past the window, what it published before is
                    // dropped first (and published: the report's outcome
                    // is against the bits after that).
                    let stamp = self.model.now + 1;
                    let last = self.model.heard.insert(n, stamp);
                    if last.is_some_and(|last| stamp - last > SHARED_STALENESS_NS) {
                        for w in self.model.workers.values_mut() {
                            w.shared[usize::from(n)].iter_mut().for_each(|s| *s = RefSlot::default());
                        }
                        before = self.model.busy_bits();
                    }
                }
                let current = self.model.workers.get(&worker);
                let expected = match self.slot_error(worker, rank) {
                    _ if unkept => Err(ApplyError::UnknownPublisher(publisher)),
                    // Another incarnation's report is dropped whatever its
                    // rank: the current one's dp size says nothing of it.
                    Some(ApplyError::RankOutOfRange { .. })
                        if current.is_some_and(|w| w.incarnation != incarnation) =>
                    {
                        Ok(Applied::OtherIncarnation)
                    }
                    Some(e) => Err(e),
                    None if current.is_some_and(|w| w.incarnation != incarnation) => Ok(Applied::OtherIncarnation),
                    None => {
                        let now = self.model.now;
                        let w = self.model.workers.get_mut(&worker).unwrap();
                        let slot = match p {
                            0 => &mut w.reported[rank as usize],
                            1 => &mut w.tracked[rank as usize],
                            n => &mut w.shared[usize::from(n - 2)][rank as usize],
                        };
                        // The first report of an incarnation applies whatever its seq.
                        if slot.seq.is_some_and(|last| seq <= last) {
                            Ok(Applied::Stale)
                        } else {
                            *slot = RefSlot { load, seq: Some(seq), at: Some(now) };
                            Ok(self.outcome(&before, worker))
                        }
                    }
                };
                prop_assert_eq!(real, expected, "report seq {}", seq);
            }
            Op::Track { worker, rank, blocks, tokens } => {
                let incarnation = self.model.workers.get(&worker).map_or(0, |w| w.incarnation);
                let real = self.monitor.track(worker, incarnation, rank, blocks, tokens);
                let expected = match self.slot_error(worker, rank) {
                    Some(e) => Err(e),
                    None => {
                        let now = self.model.now;
                        let slot = &mut self.model.workers.get_mut(&worker).unwrap().tracked[rank as usize];
                        let add = |v: u32, d: i64| (i64::from(v) + d).clamp(0, i64::from(u32::MAX)) as u32;
                        slot.load.active_decode_blocks = add(slot.load.active_decode_blocks, blocks);
                        slot.load.active_prefill_tokens = add(slot.load.active_prefill_tokens, tokens);
                        slot.at = Some(now);
                        Ok(self.outcome(&before, worker))
                    }
                };
                prop_assert_eq!(real, expected);
            }
            Op::ClearFrontend { n } => {
                let real = self.monitor.clear_publisher(Publisher::Frontend(n));
                let expected = if n >= FRONTENDS {
                    Err(ApplyError::UnknownPublisher(Publisher::Frontend(n)))
                } else {
                    for w in self.model.workers.values_mut() {
                        w.shared[usize::from(n)].iter_mut().for_each(|s| *s = RefSlot::default());
                    }
                    Ok(before.iter().filter(|(&id, &bit)| self.model.busy(id) != bit).count())
                };
                prop_assert_eq!(real, expected);
            }
            Op::Capacity { worker, rank, kv, mnbt } => {
                let incarnation = self.model.workers.get(&worker).map_or(0, |w| w.incarnation);
                let real = self.monitor.set_tracked_capacity(worker, incarnation, rank, kv, mnbt);
                let expected = match self.slot_error(worker, rank) {
                    Some(e) => Err(e),
                    None => {
                        let now = self.model.now;
                        let slot = &mut self.model.workers.get_mut(&worker).unwrap().tracked[rank as usize];
                        slot.load.kv_total_blocks = kv;
                        slot.load.max_num_batched_tokens = mnbt;
                        slot.at = Some(now);
                        Ok(self.outcome(&before, worker))
                    }
                };
                prop_assert_eq!(real, expected);
            }
            Op::SetAll { model, decode, prefill, frac, waiting } => {
                let name = MODELS[model];
                let next = RefThresholds { decode, prefill, frac, waiting };
                let real = self.monitor.set_thresholds(name, to_real(next));
                match self.model.models.get_mut(name) {
                    None => prop_assert_eq!(real, Err(SetThresholdsError::UnknownModel(name.to_owned()))),
                    Some(t) => {
                        *t = next;
                        assert_thresholds(&real.unwrap(), &next)?;
                        self.model.kept.insert(name.to_owned());
                    }
                }
            }
            Op::Edit { model, field, value } => {
                let name = MODELS[model];
                let real = self.monitor.update_thresholds(name, |t| match (field, value) {
                    (Field::Decode, Value::Clear) => t.active_decode_blocks_threshold = None,
                    (Field::Decode, Value::Set(p)) => t.active_decode_blocks_threshold = Some(p as f64 / 1e9),
                    (Field::Decode, Value::Invalid(v)) => t.active_decode_blocks_threshold = Some(v),
                    (Field::Prefill, Value::Clear | Value::Invalid(_)) => t.active_prefill_tokens_threshold = None,
                    (Field::Prefill, Value::Set(n)) => t.active_prefill_tokens_threshold = Some(n),
                    (Field::Frac, Value::Clear) => t.active_prefill_tokens_threshold_frac = None,
                    (Field::Frac, Value::Set(p)) => t.active_prefill_tokens_threshold_frac = Some(p as f64 / 1e9),
                    (Field::Frac, Value::Invalid(v)) => t.active_prefill_tokens_threshold_frac = Some(v),
                    (Field::Waiting, Value::Clear | Value::Invalid(_)) => t.active_waiting_requests_threshold = None,
                    (Field::Waiting, Value::Set(n)) => t.active_waiting_requests_threshold = Some(n),
                });
                match self.model.models.get_mut(name) {
                    None => prop_assert_eq!(real, Err(SetThresholdsError::UnknownModel(name.to_owned()))),
                    Some(t) => match (field, value) {
                        (Field::Decode, Value::Invalid(_)) => {
                            prop_assert!(matches!(
                                real,
                                Err(SetThresholdsError::Invalid(ThresholdError::DecodeBlocks(_)))
                            ))
                        }
                        (Field::Frac, Value::Invalid(_)) => {
                            prop_assert!(matches!(
                                real,
                                Err(SetThresholdsError::Invalid(ThresholdError::PrefillFrac(_)))
                            ))
                        }
                        _ => {
                            let v = match value {
                                Value::Set(v) => Some(v),
                                _ => None,
                            };
                            match field {
                                Field::Decode => t.decode = v,
                                Field::Prefill => t.prefill = v,
                                Field::Frac => t.frac = v,
                                Field::Waiting => t.waiting = v,
                            }
                            assert_thresholds(&real.unwrap(), t)?;
                            self.model.kept.insert(name.to_owned());
                        }
                    },
                }
            }
            Op::Route { model, policy, local, exclude } => self.route(MODELS[model], policy, local, &exclude)?,
            Op::Advance { ms } => {
                self.mock.increment(Duration::from_millis(ms));
                self.model.now += ms * 1_000_000;
                let flips = before.iter().filter(|(&id, &bit)| self.model.busy(id) != bit).count();
                prop_assert_eq!(self.monitor.expire_stale(), flips);
            }
        }
        self.check_state()
    }

    fn route(&mut self, name: &str, policy: usize, local: bool, exclude: &[u64]) -> Result<(), TestCaseError> {
        // Policy 5: round robin through a `ModelRouter` handle (same cursor).
        let router = &self.routers[policy % 5];
        let real = if local {
            // Kept across operations, so its cached view must follow every publication.
            match self.locals.entry((name.to_owned(), policy % 5)) {
                std::collections::btree_map::Entry::Occupied(mut e) => e.get_mut().route(exclude),
                std::collections::btree_map::Entry::Vacant(e) => match router.model(name) {
                    Ok(handle) => e.insert(handle.local()).route(exclude),
                    Err(err) => Err(err),
                },
            }
        } else if policy == 5 {
            router.model(name).and_then(|h| h.route(exclude))
        } else {
            router.route(name, exclude)
        };
        let policy = policy % 5;
        let Some(&thresholds) = self.model.models.get(name) else {
            prop_assert_eq!(real, Err(RouteError::UnknownModel));
            return Ok(());
        };
        let instances = self.model.instances(name);
        if instances.is_empty() {
            prop_assert_eq!(real, Err(RouteError::Unavailable));
            return Ok(());
        }
        let filtering = thresholds.enabled();
        let eligible: Vec<u64> = instances
            .iter()
            .copied()
            .filter(|id| (!filtering || !self.model.busy(*id)) && !exclude.contains(id))
            .collect();
        if eligible.is_empty() {
            prop_assert_eq!(real, Err(RouteError::Overloaded));
            return Ok(());
        }
        let chosen = real.map_err(|e| TestCaseError::fail(format!("expected a worker of {eligible:?}, got {e:?}")))?;
        prop_assert!(eligible.contains(&chosen), "{} not eligible: {:?}", chosen, eligible);
        // Each router has its own rotation; its handles (policy 5 and the
        // local ones) share it.
        let cursor = self.model.cursor.entry((policy, name.to_owned())).or_insert(0);
        match policy {
            0 => {
                prop_assert_eq!(chosen, eligible[*cursor % eligible.len()], "round robin order");
                *cursor += 1;
            }
            2 if eligible.len() >= 2 => {
                // Power of two: the less loaded of two distinct picks is never the strictly worst.
                let worst = eligible.iter().all(|&e| e == chosen || self.model.less_loaded(e, chosen));
                prop_assert!(!worst, "power of two picked the strictly most loaded {}", chosen);
            }
            3 => {
                *cursor += 1;
                for &e in &eligible {
                    prop_assert!(!self.model.less_loaded(e, chosen), "least loaded chose {} over {}", chosen, e);
                }
            }
            4 => {
                *cursor += 1;
                let load_of = |id| to_load(self.model.load(id));
                let best = eligible.iter().map(|&e| cost(e, &load_of(e))).min().unwrap();
                prop_assert_eq!(cost(chosen, &load_of(chosen)), best, "cost policy");
            }
            _ => {}
        }
        Ok(())
    }

    fn check_state(&self) -> Result<(), TestCaseError> {
        let m = &self.model;
        // Every worker's bit, and the listing.
        let listed = self.monitor.workers();
        let expected: Vec<WorkerInfo> = m
            .workers
            .iter()
            .map(|(&id, w)| WorkerInfo {
                id,
                incarnation: w.incarnation,
                model: w.model.clone(),
                dp_size: w.dp,
                busy: m.busy(id),
            })
            .collect();
        prop_assert_eq!(listed, expected);
        for id in 0..WORKERS + 2 {
            prop_assert_eq!(self.monitor.is_busy(id), m.busy(id), "worker {}", id);
        }
        // Every model's published set and thresholds.
        prop_assert_eq!(self.monitor.models(), m.models.keys().cloned().collect::<Vec<_>>());
        for name in MODELS {
            let Some(t) = m.models.get(name) else {
                prop_assert!(self.monitor.busy_set(name).is_none());
                prop_assert!(self.monitor.thresholds(name).is_none());
                continue;
            };
            assert_thresholds(&self.monitor.thresholds(name).unwrap(), t)?;
            let (ids, set) = self.monitor.busy_set(name).unwrap();
            prop_assert_eq!(&ids, &m.instances(name));
            prop_assert_eq!(set.len(), ids.len());
            let bits: Vec<bool> = (0..ids.len()).map(|i| set.is_busy(i)).collect();
            let expected: Vec<bool> = ids.iter().map(|&id| m.busy(id)).collect();
            prop_assert_eq!(&bits, &expected, "busy set of {:?} over {:?}", name, ids);
            prop_assert_eq!(set.busy_count(), expected.iter().filter(|b| **b).count());
        }
        // Every rank's latest load, as metrics read it.
        let snapshots = self.monitor.rank_snapshots();
        let mut expected = Vec::new();
        for (&id, w) in &m.workers {
            for rank in 0..w.dp {
                expected.push(RankSnapshot {
                    worker: id,
                    rank,
                    reported: m.reported(w, rank),
                    tracked: m.tracked(w, rank),
                    shared: m.shared(w, rank),
                });
            }
        }
        prop_assert_eq!(snapshots, expected);
        let ids: BTreeSet<u64> = m.workers.keys().copied().collect();
        for id in 0..WORKERS {
            let expected = ids.contains(&id).then(|| to_load(m.load(id)));
            prop_assert_eq!(self.monitor.worker_load(id), expected);
        }
        Ok(())
    }
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn monitor_and_router_match_the_reference(
        staleness_ms in prop::option::of(1u64..=40),
        default_decode in prop::option::weighted(0.3, decode_ppb()),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let mut system = System::new(staleness_ms, default_decode);
        for op in &ops {
            system.step(op)?;
        }
    }
}

// ---------------------------------------------------------------- BusySet

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    /// The bitmap's scans agree with a `Vec<bool>` and plain loops, across
    /// word boundaries, after any sequence of in-place and copying updates.
    #[test]
    fn busy_set_matches_a_vec_of_bools(
        len in prop_oneof![0usize..=3, 60usize..=70, 120usize..=200],
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<bool>(), any::<bool>()), 0..300),
        probes in prop::collection::vec(0usize..=210, 1..20),
    ) {
        let mut set = BusySet::new(len);
        let mut bits = vec![false; len];
        for (index, busy, copy) in flips {
            if len == 0 {
                break;
            }
            let i = index.index(len);
            if copy {
                let next = set.with(i, busy);
                prop_assert!(set.is_busy(i) == bits[i], "`with` must not change the original");
                set = next;
            } else {
                set.set(i, busy);
            }
            bits[i] = busy;
        }
        let free: Vec<usize> = (0..len).filter(|&i| !bits[i]).collect();
        prop_assert_eq!(set.len(), len);
        prop_assert_eq!(set.is_empty(), len == 0);
        prop_assert_eq!(set.free_count(), free.len());
        prop_assert_eq!(set.busy_count(), len - free.len());
        prop_assert_eq!(set.iter_free().collect::<Vec<_>>(), free.clone());
        for i in 0..len + 70 {
            prop_assert_eq!(set.is_busy(i), bits.get(i).copied().unwrap_or(false), "is_busy({})", i);
        }
        for n in 0..=free.len() {
            prop_assert_eq!(set.nth_free(n), free.get(n).copied(), "nth_free({})", n);
        }
        prop_assert_eq!(set.nth_free(usize::MAX), None);
        for start in probes {
            // First free at or after `start`, wrapping; a start past the end wraps to 0.
            let from = if start >= len { 0 } else { start };
            let expected = free.iter().copied().find(|&i| i >= from).or_else(|| free.first().copied());
            prop_assert_eq!(set.next_free_from(start), expected, "next_free_from({})", start);
        }
        // Equality follows the bits, not the history.
        let mut fresh = BusySet::new(len);
        for (i, &b) in bits.iter().enumerate() {
            if b {
                fresh.set(i, true);
            }
        }
        prop_assert_eq!(&set, &fresh);
    }
}
