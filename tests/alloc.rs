//! Proves the hot paths allocate nothing: every `WorkerRouter::route` (each policy,
//! with and without exclusions, and its error answers), every
//! `WorkerMonitor::apply` of a report that changes no busy bit, and a direct
//! admission with its release.
//!
//! A counting global allocator counts allocations per thread, so tests
//! running in parallel do not disturb each other's counts.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;
use std::time::Duration;

use loadgate::monitor::*;
use loadgate::*;

/// Forwards to [`System`], counting allocations on the calling thread.
struct CountingAllocator;

thread_local! {
    /// Allocations made by this thread. Const-initialised and without a
    /// destructor, so touching it never allocates or re-enters the allocator.
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count_one() {
    // `try_with`: during thread teardown the slot may be gone; then we do not count.
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees are ours; the counting touches only a
// thread-local `Cell`, which neither allocates nor unwinds.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which is `System`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: as in `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_one();
        // SAFETY: `ptr` was allocated by `System` through us with `layout`, as the caller guarantees.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` through us with `layout`, as the caller guarantees.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

/// Calls `f` a few times to warm up thread-locals (arc-swap's debt list,
/// fastrand's generator), then returns the allocations of `CALLS` more calls.
fn allocations_per_calls(mut f: impl FnMut()) -> u64 {
    for _ in 0..16 {
        f();
    }
    let before = ALLOCATIONS.with(Cell::get);
    for _ in 0..CALLS {
        f();
    }
    ALLOCATIONS.with(Cell::get) - before
}

const CALLS: usize = 1_000;

/// The counter itself works (or every zero below would be meaningless).
#[test]
fn the_counter_counts() {
    let n = allocations_per_calls(|| drop(std::hint::black_box(vec![1u8; 16])));
    assert_eq!(n, CALLS as u64);
}

fn decode(threshold: f64) -> BusyThresholds {
    BusyThresholds { active_decode_blocks_threshold: Some(threshold), ..Default::default() }
}

fn blocks(active: u32, total: u32) -> RankLoad {
    RankLoad { active_decode_blocks: active, kv_total_blocks: total, ..Default::default() }
}

/// 100 workers (two bitmap words) of model "m" with 2 ranks, a quarter busy,
/// and models "empty" (no worker) and "hot" (every worker busy).
fn pool(staleness: Option<Duration>) -> Arc<WorkerMonitor> {
    let monitor = Arc::new(
        WorkerMonitor::new(MonitorConfig { staleness, default_thresholds: decode(0.5), ..Default::default() }).unwrap(),
    );
    for w in 0..100u64 {
        monitor.register(w, "m", 2, 0).unwrap();
        let used = if w % 4 == 0 { 60 } else { (w % 50) as u32 };
        for rank in 0..2 {
            let load = RankLoad { active_prefill_tokens: w as u32, ..blocks(used, 100) };
            monitor
                .apply(&LoadReport { worker: w, incarnation: 0, rank, publisher: Publisher::Worker, seq: 1, load })
                .unwrap();
        }
    }
    monitor.register(1000, "hot", 1, 0).unwrap();
    monitor
        .apply(&LoadReport {
            worker: 1000,
            incarnation: 0,
            rank: 0,
            publisher: Publisher::Worker,
            seq: 1,
            load: blocks(99, 100),
        })
        .unwrap();
    monitor.add_model("empty");
    assert_eq!(monitor.busy_set("m").unwrap().1.busy_count(), 25);
    monitor
}

fn policies() -> Vec<Policy> {
    vec![
        Policy::RoundRobin,
        Policy::Random,
        Policy::PowerOfTwoChoices,
        Policy::LeastLoaded,
        Policy::Cost(Arc::new(|id, load: &WorkerLoad| id ^ load.active_decode_blocks)),
    ]
}

#[test]
fn route_allocates_nothing() {
    let monitor = pool(None);
    // Exclusions: free and busy workers, an unknown id, a duplicate.
    let exclusions: [&[WorkerId]; 3] = [&[], &[1, 2, 3, 5, 64, 65], &[4, 4, 99, 12_345, 7]];
    for policy in policies() {
        let router = WorkerRouter::new(monitor.clone(), policy.clone());
        let handle = router.model("m").unwrap();
        for exclude in exclusions {
            let n = allocations_per_calls(|| {
                let w = router.route("m", exclude).unwrap();
                assert!(!exclude.contains(&w));
            });
            assert_eq!(n, 0, "{policy:?} excluding {exclude:?}: {n} allocations in {CALLS} routes");
            let n = allocations_per_calls(|| {
                handle.route(exclude).unwrap();
            });
            assert_eq!(n, 0, "ModelRouter {policy:?} excluding {exclude:?}: {n} allocations");
            let mut local = handle.local();
            let n = allocations_per_calls(|| {
                local.route(exclude).unwrap();
            });
            assert_eq!(n, 0, "LocalRouter {policy:?} excluding {exclude:?}: {n} allocations");
        }
    }
}

#[test]
fn route_by_cost_allocates_nothing() {
    let router = WorkerRouter::new(pool(None), Policy::RoundRobin);
    let cost = |id: WorkerId, load: &WorkerLoad| load.active_prefill_tokens.wrapping_add(id);
    let n = allocations_per_calls(|| {
        router.route_by_cost("m", &[1, 2], &cost).unwrap();
    });
    assert_eq!(n, 0);
}

#[test]
fn route_errors_allocate_nothing() {
    let monitor = pool(None);
    let all: Vec<WorkerId> = (0..100).collect();
    for policy in policies() {
        let router = WorkerRouter::new(monitor.clone(), policy.clone());
        let n = allocations_per_calls(|| {
            assert_eq!(router.route("hot", &[]), Err(RouteError::Overloaded));
            assert_eq!(router.route("m", &all), Err(RouteError::Overloaded));
            assert_eq!(router.route("empty", &[]), Err(RouteError::Unavailable));
            assert_eq!(router.route("nope", &[]), Err(RouteError::UnknownModel));
        });
        assert_eq!(n, 0, "{policy:?}: {n} allocations");
    }
}

#[test]
fn route_with_staleness_configured_allocates_nothing() {
    let monitor = pool(Some(Duration::from_secs(3600)));
    for policy in policies() {
        let router = WorkerRouter::new(monitor.clone(), policy.clone());
        let n = allocations_per_calls(|| {
            router.route("m", &[8]).unwrap();
        });
        assert_eq!(n, 0, "{policy:?}: {n} allocations");
    }
}

#[test]
fn local_router_reloading_a_new_view_allocates_nothing() {
    // A flip publishes a new view (the writer allocates); the reader only swaps its cached pointer.
    let monitor = pool(None);
    let mut local = WorkerRouter::new(monitor.clone(), Policy::RoundRobin).model("m").unwrap().local();
    let mut seq = 100;
    let mut flip = || {
        seq += 1;
        let used = if seq % 2 == 0 { 90 } else { 10 };
        for rank in 0..2 {
            let report = LoadReport {
                worker: 9,
                incarnation: 0,
                rank,
                publisher: Publisher::Worker,
                seq,
                load: blocks(used, 100),
            };
            monitor.apply(&report).unwrap();
        }
    };
    for _ in 0..16 {
        flip();
        local.route(&[]).unwrap();
    }
    let mut total = 0;
    for _ in 0..100 {
        flip();
        // The first call after a publication is the one that reloads.
        let before = ALLOCATIONS.with(Cell::get);
        local.route(&[]).unwrap();
        total += ALLOCATIONS.with(Cell::get) - before;
    }
    assert_eq!(total, 0);
}

/// Applies reports to worker `w` rank 0 whose values change every call but
/// keep it on the same side of the threshold.
fn changing_reports(monitor: &WorkerMonitor, worker: WorkerId, publisher: Publisher, busy: bool) -> u64 {
    let mut seq = 1_000;
    allocations_per_calls(|| {
        seq += 1;
        let used = if busy { 51 + (seq % 49) as u32 } else { (seq % 50) as u32 };
        let report = LoadReport { worker, incarnation: 0, rank: 0, publisher, seq, load: blocks(used, 100) };
        assert_ne!(monitor.apply(&report), Ok(Applied::Flipped));
    })
}

#[test]
fn apply_without_a_flip_allocates_nothing() {
    for staleness in [None, Some(Duration::from_secs(3600))] {
        let monitor = pool(staleness);
        // Worker 0 is busy (both ranks at 60%), worker 1 free.
        assert!(monitor.is_busy(0) && !monitor.is_busy(1));
        for publisher in [Publisher::Worker, Publisher::Router] {
            let n = changing_reports(&monitor, 0, publisher, true);
            assert_eq!(n, 0, "{publisher:?} report to a busy worker, {staleness:?}: {n} allocations");
            let n = changing_reports(&monitor, 1, publisher, false);
            assert_eq!(n, 0, "{publisher:?} report to a free worker, {staleness:?}: {n} allocations");
        }
        assert!(monitor.is_busy(0) && !monitor.is_busy(1));
    }
}

#[test]
fn apply_of_a_duplicate_or_unchanged_report_allocates_nothing() {
    let monitor = pool(None);
    let stale =
        LoadReport { worker: 2, incarnation: 0, rank: 1, publisher: Publisher::Worker, seq: 1, load: blocks(0, 100) };
    let n = allocations_per_calls(|| assert_eq!(monitor.apply(&stale), Ok(Applied::Stale)));
    assert_eq!(n, 0, "stale report: {n} allocations");

    let mut seq = 10;
    let n = allocations_per_calls(|| {
        seq += 1;
        let same = LoadReport { seq, load: RankLoad { active_prefill_tokens: 2, ..blocks(2, 100) }, ..stale };
        assert_eq!(monitor.apply(&same), Ok(Applied::Stored));
    });
    assert_eq!(n, 0, "unchanged report (heartbeat): {n} allocations");
}

#[test]
fn apply_to_a_partly_busy_multi_rank_worker_allocates_nothing() {
    let monitor = pool(None);
    // Worker 5: rank 0 busy, rank 1 toggles values but stays free: the worker stays free.
    monitor
        .apply(&LoadReport {
            worker: 5,
            incarnation: 0,
            rank: 0,
            publisher: Publisher::Worker,
            seq: 2,
            load: blocks(90, 100),
        })
        .unwrap();
    let mut seq = 10;
    let n = allocations_per_calls(|| {
        seq += 1;
        let load = blocks((seq % 40) as u32, 100);
        let report = LoadReport { worker: 5, incarnation: 0, rank: 1, publisher: Publisher::Worker, seq, load };
        assert_eq!(monitor.apply(&report), Ok(Applied::Stored));
    });
    assert_eq!(n, 0);
    assert!(!monitor.is_busy(5));
}

#[test]
fn tracking_without_a_flip_allocates_nothing() {
    let monitor = pool(None);
    let n = allocations_per_calls(|| {
        assert_eq!(monitor.track(3, 0, 0, 1, 10), Ok(Applied::Stored));
        assert_eq!(monitor.track(3, 0, 0, -1, -10), Ok(Applied::Stored));
    });
    assert_eq!(n, 0);
}

#[test]
fn apply_errors_allocate_nothing() {
    let monitor = pool(None);
    let n = allocations_per_calls(|| {
        let unknown = LoadReport {
            worker: 777,
            incarnation: 0,
            rank: 0,
            publisher: Publisher::Worker,
            seq: 1,
            load: blocks(1, 1),
        };
        assert_eq!(monitor.apply(&unknown), Err(ApplyError::UnknownWorker(777)));
        let out_of_range = LoadReport { worker: 3, rank: 9, ..unknown };
        assert!(monitor.apply(&out_of_range).is_err());
    });
    assert_eq!(n, 0);
}

#[test]
fn direct_admission_and_release_allocate_nothing() {
    let admission = Admission::with_dispatch(2, 2, Box::new(|_item: u64, permit| Err(permit))).unwrap();
    let n = allocations_per_calls(|| {
        let Ok(Admitted::Now(_, scoped)) = admission.try_admit_scoped(1) else { panic!("a slot is free") };
        let Ok(Admitted::Now(_, owned)) = admission.try_admit(2) else { panic!("a slot is free") };
        drop((scoped, owned));
    });
    assert_eq!(n, 0);
    assert_eq!(admission.running(), 0);
}

/// Control: a report that flips a bit publishes a new bitmap (the cold path
/// may allocate), and the counter sees allocations made inside loadgate.
#[test]
fn a_flip_is_seen_by_the_counter() {
    let monitor = pool(None);
    monitor.register(2000, "m", 1, 0).unwrap();
    let mut seq = 10;
    let n = allocations_per_calls(|| {
        seq += 1;
        let used = if seq % 2 == 1 { 90 } else { 10 };
        let report = LoadReport {
            worker: 2000,
            incarnation: 0,
            rank: 0,
            publisher: Publisher::Worker,
            seq,
            load: blocks(used, 100),
        };
        assert_eq!(monitor.apply(&report), Ok(Applied::Flipped));
    });
    assert!(n > 0, "flipping reports publish new views");
}

/// Routes with more than 16 exclusions in a destructor of this thread's
/// locals.
struct RoutesOnDrop(WorkerRouter);

impl Drop for RoutesOnDrop {
    fn drop(&mut self) {
        let exclude: Vec<WorkerId> = (100..117).collect();
        assert_eq!(self.0.route("m", &exclude), Ok(1));
    }
}

thread_local! {
    static ROUTES_ON_DROP: std::cell::RefCell<Option<RoutesOnDrop>> = const { std::cell::RefCell::new(None) };
}

/// The set a route keeps for many exclusions is a thread-local: a route
/// made in another thread-local's destructor, after that set is gone,
/// builds its own (it used to abort the process: "cannot access a Thread
/// Local Storage value during or after destruction").
#[test]
fn a_route_in_a_thread_locals_destructor_still_works() {
    let monitor = Arc::new(WorkerMonitor::new(MonitorConfig::default()).unwrap());
    monitor.register(1, "m", 1, 0).unwrap();
    let router = WorkerRouter::new(monitor, Policy::RoundRobin);
    let exclude: Vec<WorkerId> = (100..117).collect();
    let thread = std::thread::spawn(move || {
        // Registered first, destroyed last: after the route's set.
        ROUTES_ON_DROP.with(|slot| *slot.borrow_mut() = Some(RoutesOnDrop(router.clone())));
        assert_eq!(router.route("m", &exclude), Ok(1));
    });
    assert!(thread.join().is_ok());
}
