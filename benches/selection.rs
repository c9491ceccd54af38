//! Route selection: loadgate's `WorkerRouter::route` (by model name),
//! `ModelRouter::route` (a shared per-model handle) and `LocalRouter::route`
//! (a per-thread handle caching the published view) against two baselines
//! measured in the same criterion group:
//!
//! - `floor`: a bare `AtomicUsize` round-robin (`fetch_add % n`) over a `Vec`
//!   of ids, with no busy filtering at all — nothing can be cheaper;
//! - `rwlock`: the reference's way — an `RwLock<Vec<WorkerId>>` of instances
//!   and an `RwLock<HashSet<WorkerId>>` busy set; every route clones the
//!   instance list, filters the busy ones out into a new `Vec`, then picks
//!   round-robin.
//!
//! Busy bits are set through real reports against a decode threshold. The
//! `contended` group repeats the 64-worker / 25 % case while a second thread,
//! started on a barrier, flips a worker busy/free: paced at 100 thousand and
//! 1 million flips a second, and flat out (each implementation flips its own
//! busy state; the floor has none, so its second thread flips loadgate's
//! monitor, which the floor never reads, to put the same load on the
//! machine).

use std::collections::HashSet;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Barrier, RwLock};
use std::thread;
use std::time::{Duration, Instant};

mod common;

use common::{decode_load, free_pool, MODEL};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use loadgate::{monitor::Publisher, LoadReport, LocalRouter, ModelRouter, Policy, RouteError, WorkerId, WorkerRouter};

const WORKER_COUNTS: [usize; 4] = [8, 64, 1024, 8192];
const BUSY_PERCENTS: [usize; 3] = [0, 25, 99];

/// Above the 0.5 decode threshold.
const BUSY_LOAD: u32 = 90;
/// Below it (what `free_pool` reports).
const FREE_LOAD: u32 = 10;

/// Which of `n` workers are busy at `percent`: `n * percent / 100` of them,
/// spread evenly over the ids.
fn busy_ids(n: usize, percent: usize) -> Vec<WorkerId> {
    let busy = n * percent / 100;
    (0..busy).map(|k| (k * n / busy) as WorkerId).collect()
}

/// A worker that stays free at every busy percentage (the flipper's target).
fn flip_target(n: usize, percent: usize) -> WorkerId {
    let busy: HashSet<WorkerId> = busy_ids(n, percent).into_iter().collect();
    (0..n as WorkerId).find(|id| !busy.contains(id)).expect("some worker is free")
}

/// `common::free_pool(n)` with the workers of `busy_ids(n, percent)`
/// reported busy.
fn loadgate_fixture(n: usize, percent: usize) -> (WorkerRouter, ModelRouter, LocalRouter) {
    let monitor = free_pool(n);
    for id in busy_ids(n, percent) {
        let load = decode_load(BUSY_LOAD);
        monitor
            .apply(&LoadReport { worker: id, incarnation: 0, rank: 0, publisher: Publisher::Worker, seq: 2, load })
            .expect("apply");
    }
    let busy = monitor.workers().iter().filter(|w| w.busy).count();
    assert_eq!(busy, n * percent / 100, "busy bits set through reports");
    let router = WorkerRouter::new(monitor, Policy::RoundRobin);
    let handle = router.model(MODEL).expect("known model");
    let local = handle.local();
    (router, handle, local)
}

/// What a route call returned, as one word (`u64::MAX`: none), so the harness
/// keeps every contestant's result alive at the same cost whatever its type.
trait Choice {
    fn word(self) -> u64;
}

impl Choice for WorkerId {
    #[inline(always)]
    fn word(self) -> u64 {
        self
    }
}

impl Choice for Option<WorkerId> {
    #[inline(always)]
    fn word(self) -> u64 {
        self.unwrap_or(u64::MAX)
    }
}

impl Choice for Result<WorkerId, RouteError> {
    #[inline(always)]
    fn word(self) -> u64 {
        self.unwrap_or(u64::MAX)
    }
}

#[inline(always)]
fn chosen(choice: impl Choice) {
    black_box(choice.word());
}

/// The floor: round-robin over a fixed list, no filtering.
struct Floor {
    ids: Vec<WorkerId>,
    cursor: AtomicUsize,
}

impl Floor {
    fn new(n: usize) -> Self {
        Floor { ids: (0..n as WorkerId).collect(), cursor: AtomicUsize::new(0) }
    }

    #[inline]
    fn route(&self) -> WorkerId {
        self.ids[self.cursor.fetch_add(1, Ordering::Relaxed) % self.ids.len()]
    }
}

/// The reference's way: clone the instance list, filter the busy set out,
/// pick round-robin.
struct RwLockRouter {
    instances: RwLock<Vec<WorkerId>>,
    busy: RwLock<HashSet<WorkerId>>,
    cursor: AtomicUsize,
}

impl RwLockRouter {
    fn new(n: usize, percent: usize) -> Self {
        RwLockRouter {
            instances: RwLock::new((0..n as WorkerId).collect()),
            busy: RwLock::new(busy_ids(n, percent).into_iter().collect()),
            cursor: AtomicUsize::new(0),
        }
    }

    #[inline]
    fn route(&self) -> Option<WorkerId> {
        let instances = self.instances.read().unwrap().clone();
        let eligible: Vec<WorkerId> = {
            let busy = self.busy.read().unwrap();
            instances.into_iter().filter(|id| !busy.contains(id)).collect()
        };
        if eligible.is_empty() {
            return None;
        }
        Some(eligible[self.cursor.fetch_add(1, Ordering::Relaxed) % eligible.len()])
    }

    fn set_busy(&self, id: WorkerId, busy: bool) {
        let mut set = self.busy.write().unwrap();
        if busy {
            set.insert(id);
        } else {
            set.remove(&id);
        }
    }
}

fn selection(c: &mut Criterion) {
    for percent in BUSY_PERCENTS {
        let mut group = c.benchmark_group(format!("selection/busy_{percent}pct"));
        group.throughput(Throughput::Elements(1));
        for n in WORKER_COUNTS {
            let (router, handle, mut local) = loadgate_fixture(n, percent);
            let floor = Floor::new(n);
            let reference = RwLockRouter::new(n, percent);
            group.bench_with_input(BenchmarkId::new("floor_atomic_rr", n), &n, |b, _| {
                b.iter(|| chosen(black_box(&floor).route()))
            });
            group.bench_with_input(BenchmarkId::new("loadgate_router", n), &n, |b, _| {
                b.iter(|| chosen(black_box(&router).route(black_box(MODEL), black_box(&[]))))
            });
            group.bench_with_input(BenchmarkId::new("loadgate_model_router", n), &n, |b, _| {
                b.iter(|| chosen(black_box(&handle).route(black_box(&[]))))
            });
            group.bench_with_input(BenchmarkId::new("loadgate_local_router", n), &n, |b, _| {
                b.iter(|| chosen(black_box(&mut local).route(black_box(&[]))))
            });
            group.bench_with_input(BenchmarkId::new("rwlock_clone_filter", n), &n, |b, _| {
                b.iter(|| chosen(black_box(&reference).route()))
            });
        }
        group.finish();
    }
}

/// How fast the contended group's second thread flips bits: paced at a
/// fixed rate (busy-waiting between flips, so it occupies its core all the
/// same), or flat out.
#[derive(Clone, Copy)]
enum FlipRate {
    PerSecond(u32),
    FlatOut,
}

impl FlipRate {
    const ALL: [FlipRate; 3] = [FlipRate::PerSecond(100_000), FlipRate::PerSecond(1_000_000), FlipRate::FlatOut];

    fn label(self) -> String {
        match self {
            FlipRate::PerSecond(rate) if rate % 1_000_000 == 0 => format!("{}M_flips_per_s", rate / 1_000_000),
            FlipRate::PerSecond(rate) => format!("{}k_flips_per_s", rate / 1_000),
            FlipRate::FlatOut => "flat_out".to_owned(),
        }
    }
}

/// Runs `flip` on a second thread (started on a barrier) at `rate` while
/// `measure` runs on this one; prints the rate it reached.
fn with_flipper(rate: FlipRate, flip: impl FnMut() + Send, measure: impl FnOnce()) {
    let stop = AtomicBool::new(false);
    let barrier = Barrier::new(2);
    let started = thread::scope(|s| {
        let flipper = s.spawn(|| {
            let mut flip = flip;
            let period = match rate {
                FlipRate::PerSecond(rate) => Some(Duration::from_secs(1) / rate),
                FlipRate::FlatOut => None,
            };
            barrier.wait();
            let mut next = Instant::now();
            let mut flips = 0u64;
            loop {
                flip();
                flips += 1;
                // Relaxed: a stop flag; nothing else hangs on it.
                if stop.load(Ordering::Relaxed) {
                    return flips;
                }
                if let Some(period) = period {
                    next += period;
                    while Instant::now() < next {
                        std::hint::spin_loop();
                    }
                }
            }
        });
        barrier.wait();
        let started = Instant::now();
        measure();
        stop.store(true, Ordering::Relaxed);
        (started, flipper.join().expect("flipper"))
    });
    let (started, flips) = started;
    let seconds = started.elapsed().as_secs_f64();
    if seconds > 0.5 {
        eprintln!("second thread: {:.0} flips/s", flips as f64 / seconds);
    }
}

/// A flipper over loadgate's monitor: alternately reports `worker` busy and
/// free, each report flipping its bit.
fn monitor_flipper(router: &WorkerRouter, worker: WorkerId) -> impl FnMut() + Send + '_ {
    let monitor = router.monitor();
    let mut seq = 1_000u64;
    move || {
        seq += 1;
        let load = decode_load(if seq % 2 == 0 { BUSY_LOAD } else { FREE_LOAD });
        let applied =
            monitor.apply(&LoadReport { worker, incarnation: 0, rank: 0, publisher: Publisher::Worker, seq, load });
        black_box(applied.expect("apply"));
    }
}

fn contended(c: &mut Criterion) {
    const N: usize = 64;
    const PERCENT: usize = 25;
    let target = flip_target(N, PERCENT);
    let mut group = c.benchmark_group("selection_contended/64_workers_25pct_busy");
    group.throughput(Throughput::Elements(1));

    let (router, handle, mut local) = loadgate_fixture(N, PERCENT);
    let floor = Floor::new(N);
    let reference = RwLockRouter::new(N, PERCENT);
    for rate in FlipRate::ALL {
        let label = rate.label();
        with_flipper(rate, monitor_flipper(&router, target), || {
            group.bench_function(BenchmarkId::new("floor_atomic_rr", &label), |b| {
                b.iter(|| chosen(black_box(&floor).route()))
            });
        });
        with_flipper(rate, monitor_flipper(&router, target), || {
            group.bench_function(BenchmarkId::new("loadgate_router", &label), |b| {
                b.iter(|| chosen(black_box(&router).route(black_box(MODEL), black_box(&[]))))
            });
        });
        with_flipper(rate, monitor_flipper(&router, target), || {
            group.bench_function(BenchmarkId::new("loadgate_model_router", &label), |b| {
                b.iter(|| chosen(black_box(&handle).route(black_box(&[]))))
            });
        });
        with_flipper(rate, monitor_flipper(&router, target), || {
            group.bench_function(BenchmarkId::new("loadgate_local_router", &label), |b| {
                b.iter(|| chosen(black_box(&mut local).route(black_box(&[]))))
            });
        });
        let mut busy = false;
        let flip_reference = || {
            busy = !busy;
            reference.set_busy(target, busy);
        };
        with_flipper(rate, flip_reference, || {
            group.bench_function(BenchmarkId::new("rwlock_clone_filter", &label), |b| {
                b.iter(|| chosen(black_box(&reference).route()))
            });
        });
    }
    group.finish();
}

criterion_group!(benches, selection, contended);
criterion_main!(benches);
