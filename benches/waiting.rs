//! The waiting line's enqueue + wake + dequeue against a tokio `Notify` +
//! `Mutex<VecDeque>` line, like for like, on 1 and 2 threads sharing one
//! line (started together on a barrier; a reported time is the wall time
//! of one cycle on every thread at once). Two harnesses: `waiting/`, where
//! each thread waits for its own oldest request, and `waiting_executor/`,
//! where a woken request is polled by the thread that woke it, as a tokio
//! worker thread does.
//!
//! `waiting/`: one cycle, per thread, in a steady state where the line
//! always holds a request and the worker was just dispatched to:
//!
//! - **loadgate**: a new request joins (`WorkerRouter::wait`, first poll:
//!   the line is not empty, so it joins and finds nothing free); the worker
//!   the thread's last request went to reports (a report that flips
//!   nothing: the line may give it a waiter again, and wakes the first in
//!   line); the oldest request is polled and routed. The wake-up includes the monitor's
//!   `apply` of the report, which the frontend runs anyway.
//! - **baseline**: the same line built from a tokio `Notify` and a
//!   `Mutex<VecDeque>` in front of the same router: a new request is pushed
//!   and registers an owned `Notified`; the thread's worker reports (the
//!   same `apply`) and `notify_one`; the oldest request's `Notified` is
//!   polled, the deque popped and the request routed.
//!
//! Both do the same work around the line (one report applied, one request
//! routed, one future boxed per cycle); what differs is the line. With 2
//! threads a thread's oldest request may be woken by the other's report;
//! while it is not yet ready the thread reports (and notifies) again, on
//! both sides alike. The two lines do not wake alike there: loadgate's wakes
//! exactly the first in line, often the other thread's request, and a
//! report of a worker already given back wakes nobody, so a loadgate thread
//! waits for the other's report in about half its cycles (reporting again
//! meanwhile), a baseline thread almost never. `waiting_executor/` has no
//! such wait.
//!
//! `waiting_executor/`: the requests are tasks of a small executor
//! ([`Executor`]): a waker puts its task on the run queue of the thread
//! that calls it, which polls it next. Each thread starts with
//! [`PRESPAWNED`] requests waiting. One cycle, per thread: a request joins;
//! a worker that took a request since its last report (whichever thread
//! polled that request) reports, with `notify_one` on the baseline's side;
//! the thread polls the tasks that woke, routing them. The line's length
//! stays as it started; no thread waits for another's report unless every
//! worker's request is still on its way.
//!
//! `--paired [ROUNDS]` (`cargo bench --bench waiting -- --paired`): the
//! executor harness's two sides alternating in blocks within one process,
//! a ratio per round and their median ([`paired`]), for a machine whose
//! speed changes between criterion's two measurements.
//!
//! `waiting_spent/N`: the line's 1-thread cycle in a fleet of 10,000
//! workers, N of them dispatched to since their last report (the line
//! leaves them out until they report): what a dispatch costs as that count
//! grows.

use std::collections::VecDeque;
use std::future::Future;
use std::hint::black_box;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion, Throughput};
use crossbeam_utils::CachePadded;
use loadgate::{
    BusyThresholds, LoadReport, MonitorConfig, Policy, RankLoad, Ticket, Wait, WorkerId, WorkerMonitor, WorkerRouter,
};
use tokio::sync::futures::OwnedNotified;
use tokio::sync::Notify;

const MODEL: &str = "llama";

type Pending = std::future::Pending<()>;

/// The loadgate side: a monitor whose `threads` workers are free, and a
/// router.
struct Line {
    monitor: Arc<WorkerMonitor>,
    router: WorkerRouter,
    deadline: Instant,
    /// Every report's seq (increasing for each worker, whichever thread
    /// sends it).
    seq: AtomicU64,
}

impl Line {
    fn new(threads: usize) -> Line {
        let config = MonitorConfig {
            default_thresholds: BusyThresholds { active_decode_blocks_threshold: Some(0.5), ..Default::default() },
            ..Default::default()
        };
        let monitor = Arc::new(WorkerMonitor::new(config).expect("valid thresholds"));
        let busy = RankLoad { active_decode_blocks: 90, kv_total_blocks: 100, ..Default::default() };
        for id in 0..threads as WorkerId {
            monitor.register(id, MODEL, 1, 0).expect("register");
            // Busy until its thread's first cycle: every thread's first
            // request joins the line.
            monitor.apply(&LoadReport { worker: id, seq: 1, load: busy, ..Default::default() }).expect("apply");
        }
        let router = WorkerRouter::new(monitor.clone(), Policy::RoundRobin);
        Line { monitor, router, deadline: Instant::now() + Duration::from_secs(3600), seq: AtomicU64::new(2) }
    }

    /// A line whose `threads` workers have all reported free (the
    /// baselines': their line does not know which worker freed).
    fn all_free(threads: usize) -> Line {
        let line = Line::new(threads);
        for worker in 0..threads as WorkerId {
            line.report(worker, 10);
        }
        line
    }

    fn join(&self) -> Task<Wait<'_, Pending>> {
        Task::start(self.wait())
    }

    /// A request's wait, not yet polled.
    fn wait(&self) -> Wait<'_, Pending> {
        self.router.wait(MODEL, &[], Ticket::new(1, self.deadline), std::future::pending())
    }

    /// `worker` reports `blocks` of 100 (a report two threads race may be
    /// dropped as stale: the spinning thread reports again).
    fn report(&self, worker: WorkerId, blocks: u32) {
        // Relaxed: only numbers the reports.
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let load = RankLoad { active_decode_blocks: blocks, kv_total_blocks: 100, ..Default::default() };
        self.monitor.apply(&LoadReport { worker, seq, load, ..Default::default() }).expect("apply");
    }
}

/// A waker that raises a flag, as an executor's would schedule the task.
#[derive(Default)]
struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Release: pairs with the Acquire in `Task::woken`.
        self.0.store(true, Ordering::Release);
    }
}

/// A future with its own waker, polled (like by an executor) only once
/// woken; one that was ready at its first poll keeps its output.
struct Task<F: Future> {
    flag: Arc<Flag>,
    waker: Waker,
    future: Pin<Box<F>>,
    ready: Option<F::Output>,
}

impl<F: Future> Task<F> {
    /// The future, polled once.
    fn start(future: F) -> Self {
        let flag = Arc::new(Flag::default());
        let mut task = Task { waker: Waker::from(flag.clone()), flag, future: Box::pin(future), ready: None };
        if let Poll::Ready(output) = task.poll() {
            task.ready = Some(output);
        }
        task
    }

    fn woken(&self) -> bool {
        // Acquire: pairs with the Release in `Flag::wake_by_ref`.
        self.ready.is_some() || self.flag.0.load(Ordering::Acquire)
    }

    fn poll(&mut self) -> Poll<F::Output> {
        if let Some(output) = self.ready.take() {
            return Poll::Ready(output);
        }
        // Relaxed: the poll that follows reads the state under its own
        // synchronisation.
        self.flag.0.store(false, Ordering::Relaxed);
        self.future.as_mut().poll(&mut Context::from_waker(&self.waker))
    }
}

/// One thread's share of the loadgate line: the worker its last request
/// went to (which reports next, as a real worker reports the load of the
/// request it took), its oldest request.
struct LineThread<'a> {
    line: &'a Line,
    worker: WorkerId,
    oldest: Option<Task<Wait<'a, Pending>>>,
}

impl<'a> LineThread<'a> {
    /// This thread's first request, waiting (every worker is busy).
    fn start(line: &'a Line, worker: WorkerId) -> LineThread<'a> {
        let first = line.join();
        assert!(!first.woken(), "every worker is busy at first");
        LineThread { line, worker, oldest: Some(first) }
    }

    fn cycle(&mut self) {
        let new = self.line.join();
        self.line.report(self.worker, 10);
        let mut oldest = self.oldest.replace(new).expect("a request waits");
        loop {
            if oldest.woken() {
                if let Poll::Ready(routed) = oldest.poll() {
                    self.worker = black_box(routed.expect("routed"));
                    return;
                }
            }
            self.line.report(self.worker, 10);
        }
    }
}

/// The baseline: a tokio `Notify` and a `Mutex<VecDeque>` in front of the
/// same monitor and router (every worker free: the baseline line does not
/// know which worker freed, it wakes one waiter per report).
struct Baseline {
    line: Line,
    notify: Arc<Notify>,
    queue: Mutex<VecDeque<u64>>,
}

impl Baseline {
    /// A baseline line in front of `threads` free workers.
    fn new(threads: usize) -> Baseline {
        Baseline { line: Line::all_free(threads), notify: Arc::new(Notify::new()), queue: Mutex::new(VecDeque::new()) }
    }

    fn join(&self, id: u64) -> Task<OwnedNotified> {
        self.queue.lock().unwrap().push_back(id);
        Task::start(self.notify.clone().notified_owned())
    }

    /// The executor harness's join: a request pushed, its `Notified` made.
    fn enqueue(&self) -> OwnedNotified {
        self.queue.lock().unwrap().push_back(0);
        self.notify.clone().notified_owned()
    }

    /// The executor harness's end of a wait: popped and routed.
    fn dequeue(&self) -> WorkerId {
        black_box(self.queue.lock().unwrap().pop_front());
        self.line.router.route(MODEL, &[]).expect("routed")
    }

    /// `worker` reports, and one waiter is notified.
    fn report(&self, worker: WorkerId) {
        self.line.report(worker, 10);
        self.notify.notify_one();
    }
}

struct BaselineThread<'a> {
    base: &'a Baseline,
    worker: WorkerId,
    next: u64,
    oldest: Option<Task<OwnedNotified>>,
}

impl BaselineThread<'_> {
    fn cycle(&mut self) {
        self.next += 1;
        let new = self.base.join(self.next);
        self.base.line.report(self.worker, 10);
        self.base.notify.notify_one();
        let mut oldest = self.oldest.replace(new).expect("a request waits");
        loop {
            if oldest.woken() && oldest.poll().is_ready() {
                black_box(self.base.queue.lock().unwrap().pop_front());
                self.worker = black_box(self.base.line.router.route(MODEL, &[]).expect("routed"));
                return;
            }
            self.base.line.report(self.worker, 10);
            self.base.notify.notify_one();
        }
    }
}

/// A request of the executor harness: which side's executor ([`LINE`] or
/// [`BASELINE`]) and which slot it is in, how to wake it. Waking pushes it
/// onto that side's run queue of the thread that wakes it (as tokio's
/// worker threads schedule a task they wake), which polls it next.
struct Spawned {
    side: usize,
    slot: usize,
}

/// The executor of the line's side.
const LINE: usize = 0;
/// The executor of the baseline's side.
const BASELINE: usize = 1;

thread_local! {
    /// The calling bench thread's run queues, one per side: slots of the
    /// tasks it woke.
    static RUN: std::cell::RefCell<[Vec<usize>; 2]> = const { std::cell::RefCell::new([Vec::new(), Vec::new()]) };
}

impl Wake for Spawned {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        RUN.with(|run| run.borrow_mut()[self.side].push(self.slot));
    }
}

/// Requests each thread of the executor harness starts with, waiting: the
/// line never empties (a dispatch from a line left empty marks nobody: the
/// next request would route at once, beside the line).
const PRESPAWNED: usize = 4;

/// Slots for the requests in flight of the executor harness: a ring, whose
/// next slot is almost always free (a request waits a few cycles; one
/// woken while its thread was descheduled may still be in it, and the
/// spawner then polls what it woke until it leaves).
const SLOTS: usize = 1 << 16;

/// A request's future and its waker.
type Slot<F> = Mutex<Option<(Pin<Box<F>>, Waker)>>;

/// One side's requests as tasks of a shared executor: made by `join`,
/// polled with their own wakers by whichever thread woke them, resolved by
/// `done` to the worker the request went to.
struct Executor<F: Future, J, D> {
    /// [`LINE`] or [`BASELINE`].
    side: usize,
    slots: Vec<Slot<F>>,
    next: AtomicU64,
    join: J,
    done: D,
}

impl<F, J, D> Executor<F, J, D>
where
    F: Future,
    J: Fn() -> F,
    D: Fn(F::Output) -> WorkerId,
{
    fn new(side: usize, join: J, done: D) -> Self {
        let slots = (0..SLOTS).map(|_| Mutex::new(None)).collect();
        Executor { side, slots, next: AtomicU64::new(0), join, done }
    }

    /// A new request, polled once on this thread (in its slot: a wake-up
    /// during that poll finds it there); the worker it went to if it was
    /// routed at once is pushed on `routed`.
    fn spawn(&self, routed: &mut Vec<WorkerId>) {
        // Relaxed: only numbers the slots.
        let slot = self.next.fetch_add(1, Ordering::Relaxed) as usize % SLOTS;
        let mut task = loop {
            let task = self.slots[slot].lock().unwrap();
            if task.is_none() {
                break task;
            }
            drop(task);
            self.run(routed);
            std::hint::spin_loop();
        };
        let waker = Waker::from(Arc::new(Spawned { side: self.side, slot }));
        let (future, waker) = task.insert((Box::pin((self.join)()), waker));
        if let Poll::Ready(output) = future.as_mut().poll(&mut Context::from_waker(waker)) {
            *task = None;
            drop(task);
            routed.push((self.done)(output));
        }
    }

    /// Polls every task this thread woke until none is left; the workers
    /// of those routed are pushed on `routed`.
    fn run(&self, routed: &mut Vec<WorkerId>) {
        while let Some(slot) = RUN.with(|run| run.borrow_mut()[self.side].pop()) {
            let mut task = self.slots[slot].lock().unwrap();
            let Some((future, waker)) = task.as_mut() else { continue };
            if let Poll::Ready(output) = future.as_mut().poll(&mut Context::from_waker(waker)) {
                *task = None;
                drop(task);
                routed.push((self.done)(output));
            }
        }
    }
}

/// One thread of the executor harness.
struct ExecutorThread<'a, F: Future, J, D> {
    executor: &'a Executor<F, J, D>,
    /// For each worker, the requests the line gave it that it has not
    /// reported yet (shared by the threads).
    unreported: &'a [CachePadded<AtomicU64>],
    /// Where this thread looks first in `unreported`.
    first: usize,
    /// Reports a worker (and, for the baseline, notifies).
    report: &'a (dyn Fn(WorkerId) + Sync),
    routed: Vec<WorkerId>,
}

impl<'a, F, J, D> ExecutorThread<'a, F, J, D>
where
    F: Future,
    J: Fn() -> F,
    D: Fn(F::Output) -> WorkerId,
{
    /// Thread `t`, with [`PRESPAWNED`] requests that wait (every worker is
    /// busy, or none has reported yet).
    fn start(
        executor: &'a Executor<F, J, D>,
        unreported: &'a [CachePadded<AtomicU64>],
        t: usize,
        report: &'a (dyn Fn(WorkerId) + Sync),
    ) -> Self {
        let mut routed = Vec::new();
        for _ in 0..PRESPAWNED {
            executor.spawn(&mut routed);
            assert!(routed.is_empty(), "the first requests of a thread wait");
        }
        ExecutorThread { executor, unreported, first: t, report, routed }
    }

    /// A request joins, a worker that took a request reports (whichever
    /// thread polled that request), and the thread polls what that woke.
    fn cycle(&mut self) {
        self.executor.spawn(&mut self.routed);
        let worker = self.claim();
        (self.report)(worker);
        self.run();
    }

    /// A worker with a request not reported yet, counted off. While every
    /// such request is still on its way (woken, not yet polled), polls what
    /// this thread woke (a wake-up in its last `spawn` may be the request
    /// for the worker it needs).
    fn claim(&mut self) -> WorkerId {
        let n = self.unreported.len();
        for spin in 0.. {
            for i in 0..n {
                let worker = (self.first + i) % n;
                // Relaxed: see `run`.
                let claimed =
                    self.unreported[worker].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| c.checked_sub(1));
                if claimed.is_ok() {
                    return worker as WorkerId;
                }
            }
            assert!(spin < 100_000_000, "no worker took a request: the harness lost a wake-up");
            self.run();
            std::hint::spin_loop();
        }
        unreachable!()
    }

    /// Polls what this thread woke; counts the requests routed.
    fn run(&mut self) {
        self.executor.run(&mut self.routed);
        for &worker in &self.routed {
            // Relaxed: a count; the report that follows a claim
            // synchronises through the monitor.
            self.unreported[worker as usize].fetch_add(1, Ordering::Relaxed);
        }
        self.routed.clear();
    }
}

/// Times `threads` threads, started together, each running `iters` cycles
/// of its own state made by `make`: until the last one finishes.
fn timed<S>(iters: u64, threads: usize, make: &(dyn Fn(usize) -> S + Sync), cycle: fn(&mut S)) -> Duration {
    let barrier = Barrier::new(threads);
    thread::scope(|s| {
        let others: Vec<_> = (1..threads)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || {
                    let mut state = make(t);
                    barrier.wait();
                    (0..iters).for_each(|_| cycle(&mut state));
                })
            })
            .collect();
        let mut state = make(0);
        barrier.wait();
        let start = Instant::now();
        (0..iters).for_each(|_| cycle(&mut state));
        // Its last request leaves the line (a woken one passes its turn
        // on), so a thread still cycling is never left behind it.
        drop(state);
        others.into_iter().for_each(|t| t.join().expect("bench thread"));
        start.elapsed()
    })
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("waiting");
    group.throughput(Throughput::Elements(1));
    for threads in [1, 2] {
        group.bench_function(format!("loadgate/{threads}"), |b| {
            b.iter_custom(|iters| {
                let line = Line::new(threads);
                let make = |t: usize| LineThread::start(&line, t as WorkerId);
                timed(iters, threads, &make, LineThread::cycle)
            })
        });
        group.bench_function(format!("notify_vecdeque/{threads}"), |b| {
            b.iter_custom(|iters| {
                let line = Line::all_free(threads);
                let base = Baseline { line, notify: Arc::new(Notify::new()), queue: Mutex::new(VecDeque::new()) };
                let make = |t: usize| {
                    let first = base.join(t as u64 * 1_000_000_000);
                    let next = t as u64 * 1_000_000_000;
                    BaselineThread { base: &base, worker: t as WorkerId, next, oldest: Some(first) }
                };
                timed(iters, threads, &make, BaselineThread::cycle)
            })
        });
    }
    group.finish();
}

/// The executor harness ([`Executor`]): `threads` threads; in a cycle a
/// request joins, a worker that took one reports, and the thread polls the
/// requests that woke.
fn executed(c: &mut Criterion) {
    let mut group = c.benchmark_group("waiting_executor");
    group.throughput(Throughput::Elements(1));
    for threads in [1, 2] {
        group.bench_function(format!("loadgate/{threads}"), |b| {
            b.iter_custom(|iters| {
                let line = Line::new(threads);
                let executor =
                    Executor::new(LINE, || line.wait(), |routed: Result<WorkerId, _>| routed.expect("routed"));
                let report = |worker| line.report(worker, 10);
                let unreported = unreported(threads);
                let make = |t: usize| ExecutorThread::start(&executor, &unreported, t, &report);
                timed(iters, threads, &make, ExecutorThread::cycle)
            })
        });
        group.bench_function(format!("notify_vecdeque/{threads}"), |b| {
            b.iter_custom(|iters| {
                let base = Baseline::new(threads);
                let executor = Executor::new(BASELINE, || base.enqueue(), |()| base.dequeue());
                let report = |worker| base.report(worker);
                let unreported = unreported(threads);
                let make = |t: usize| ExecutorThread::start(&executor, &unreported, t, &report);
                timed(iters, threads, &make, ExecutorThread::cycle)
            })
        });
    }
    group.finish();
}

/// For each of `threads` workers, one request to report (the line's
/// workers start busy: the report frees them).
fn unreported(threads: usize) -> Vec<CachePadded<AtomicU64>> {
    (0..threads).map(|_| CachePadded::new(AtomicU64::new(1))).collect()
}

/// Cycles in one block of the paired run ([`paired`]): a few tens of
/// milliseconds on either side.
const BLOCK: u32 = 20_000;

/// `--paired [ROUNDS]`: the executor harness's two sides in one process,
/// on the same threads, in alternating blocks of [`BLOCK`] cycles (the
/// side that goes first alternating by round), after one block each
/// unrecorded. This machine's speed moves between modes minutes apart;
/// criterion measures one side and then the other, so a ratio of its two
/// estimates can compare two modes, where each round here compares two
/// blocks a few milliseconds apart. Prints each round's cycle times and
/// ratio, then the median ratio.
fn paired(rounds: usize) {
    for threads in [1, 2] {
        let line = Line::new(threads);
        let line_side = Executor::new(LINE, || line.wait(), |routed: Result<WorkerId, _>| routed.expect("routed"));
        let line_report = |worker| line.report(worker, 10);
        let base = Baseline::new(threads);
        let base_side = Executor::new(BASELINE, || base.enqueue(), |()| base.dequeue());
        let base_report = |worker| base.report(worker);
        let (line_unreported, base_unreported) = (unreported(threads), unreported(threads));
        let barrier = Barrier::new(threads);
        // One thread's run; thread 0 returns each round's block times.
        let run = |t: usize| {
            let mut line_thread = ExecutorThread::start(&line_side, &line_unreported, t, &line_report);
            let mut base_thread = ExecutorThread::start(&base_side, &base_unreported, t, &base_report);
            let mut times = Vec::with_capacity(rounds);
            for round in 0..=rounds {
                let mut took = [Duration::ZERO; 2];
                for k in 0..2 {
                    let side = (round + k) % 2;
                    barrier.wait();
                    let start = Instant::now();
                    match side {
                        LINE => (0..BLOCK).for_each(|_| line_thread.cycle()),
                        _ => (0..BLOCK).for_each(|_| base_thread.cycle()),
                    }
                    barrier.wait();
                    took[side] = start.elapsed();
                }
                if round > 0 {
                    times.push(took);
                }
            }
            times
        };
        let times = thread::scope(|s| {
            let others: Vec<_> = (1..threads).map(|t| s.spawn(move || run(t))).collect();
            let times = run(0);
            others.into_iter().for_each(|t| drop(t.join().expect("bench thread")));
            times
        });
        let per_cycle = |d: Duration| d.as_secs_f64() * 1e9 / f64::from(BLOCK);
        println!("waiting_paired/{threads}: {rounds} rounds of {BLOCK} cycles a side, ns per cycle");
        println!("{:>5} {:>10} {:>10} {:>7}", "round", "loadgate", "baseline", "ratio");
        let mut ratios = Vec::with_capacity(rounds);
        for (round, [ours, theirs]) in times.iter().enumerate() {
            let ratio = per_cycle(*ours) / per_cycle(*theirs);
            println!("{:>5} {:>10.1} {:>10.1} {:>7.3}", round + 1, per_cycle(*ours), per_cycle(*theirs), ratio);
            ratios.push(ratio);
        }
        ratios.sort_by(f64::total_cmp);
        let (low, median, high) = (ratios[0], ratios[rounds / 2], ratios[rounds - 1]);
        println!("waiting_paired/{threads}: loadgate / baseline, median {median:.3} (rounds {low:.3}-{high:.3})\n");
    }
}

/// Workers in the fleet of [`spent_cycles`].
const FLEET: usize = 10_000;

/// The 1-thread cycle in a fleet of [`FLEET`] workers, with `spent` of
/// them dispatched to by the line since their last report (the line gives
/// none of them a waiter until it reports; under overload in a large fleet
/// they can be thousands). The worker that reports in a cycle is the one
/// the line dispatched to `spent` cycles before, so the count stays. A
/// request woken and never polled keeps the line from emptying (an empty
/// line forgets its marks).
fn spent_cycles(iters: u64, spent: usize) -> Duration {
    let line = Line::new(FLEET);
    let keeper = line.join();
    line.report(0, 10);
    assert!(keeper.woken(), "the first free worker wakes the keeper");
    let mut dispatched = VecDeque::with_capacity(spent + 1);
    let serve = |worker: WorkerId, dispatched: &mut VecDeque<WorkerId>| {
        let mut task = line.join();
        line.report(worker, 10);
        assert!(task.woken(), "the report frees a worker for it");
        let Poll::Ready(routed) = task.poll() else { panic!("a woken request with a free worker waits") };
        dispatched.push_back(routed.expect("routed"));
    };
    for worker in 1..=spent as WorkerId {
        serve(worker, &mut dispatched);
    }
    let start = Instant::now();
    for _ in 0..iters {
        let worker = dispatched.pop_front().expect("spent >= 1");
        serve(worker, &mut dispatched);
    }
    let elapsed = start.elapsed();
    drop(keeper);
    elapsed
}

fn spent(c: &mut Criterion) {
    let mut group = c.benchmark_group("waiting_spent");
    group.throughput(Throughput::Elements(1));
    // Each sample registers the whole fleet first.
    group.sample_size(10);
    for spent in [1, 1000, 4000] {
        group.bench_function(format!("{spent}"), |b| b.iter_custom(|iters| spent_cycles(iters, spent)));
    }
    group.finish();
}

criterion_group!(benches, bench, executed, spent);

/// criterion's main, or the paired run with `--paired [ROUNDS]` (default
/// 30): `cargo bench --bench waiting -- --paired`.
fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--paired") {
        let rounds = match args.get(at + 1).filter(|a| !a.starts_with("--")) {
            Some(n) => n.parse().ok().filter(|&n| n > 0).expect("--paired takes a number of rounds, at least 1"),
            None => 30,
        };
        paired(rounds);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
