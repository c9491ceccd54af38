//! The waiting line's enqueue + wake + dequeue against a tokio `Notify` +
//! `Mutex<VecDeque>` line, like for like, on 1 and 2 threads sharing one
//! line (started together on a barrier; a reported time is the wall time
//! of one cycle on every thread at once).
//!
//! One cycle, per thread, in a steady state where the line always holds a
//! request and the worker was just dispatched to:
//!
//! - **loadgate**: a new request joins (`WorkerRouter::wait`, first poll:
//!   the line is not empty, so it joins and finds nothing free); the
//!   thread's worker reports (a report that flips nothing: the line may
//!   give it a waiter again, and wakes the first in line); the oldest
//!   request is polled and routed. The wake-up includes the monitor's
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
//! both sides alike.

use std::collections::VecDeque;
use std::future::Future;
use std::hint::black_box;
use std::pin::Pin;
use std::sync::{Arc, Barrier, Mutex};
use std::task::{Context, Poll, Waker};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
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
        Line { monitor, router, deadline: Instant::now() + Duration::from_secs(3600) }
    }

    fn join(&self) -> Pin<Box<Wait<'_, Pending>>> {
        Box::pin(self.router.wait(MODEL, &[], Ticket::new(1, self.deadline), std::future::pending()))
    }

    fn report(&self, worker: WorkerId, seq: &mut u64, blocks: u32) {
        *seq += 1;
        let load = RankLoad { active_decode_blocks: blocks, kv_total_blocks: 100, ..Default::default() };
        self.monitor.apply(&LoadReport { worker, seq: *seq, load, ..Default::default() }).expect("apply");
    }
}

fn poll<F: Future + ?Sized>(f: Pin<&mut F>) -> Poll<F::Output> {
    f.poll(&mut Context::from_waker(Waker::noop()))
}

/// One thread's share of the loadgate line: its worker, its seq, its
/// oldest request.
struct LineThread<'a> {
    line: &'a Line,
    worker: WorkerId,
    seq: u64,
    oldest: Option<Pin<Box<Wait<'a, Pending>>>>,
}

impl<'a> LineThread<'a> {
    /// This thread's first request, waiting (every worker is busy).
    fn start(line: &'a Line, worker: WorkerId) -> LineThread<'a> {
        let mut first = line.join();
        assert!(poll(first.as_mut()).is_pending(), "every worker is busy at first");
        LineThread { line, worker, seq: 1, oldest: Some(first) }
    }

    fn cycle(&mut self) {
        let mut new = self.line.join();
        let _ = poll(new.as_mut());
        self.line.report(self.worker, &mut self.seq, 10);
        let mut oldest = self.oldest.replace(new).expect("a request waits");
        loop {
            if let Poll::Ready(routed) = poll(oldest.as_mut()) {
                black_box(routed.expect("routed"));
                return;
            }
            self.line.report(self.worker, &mut self.seq, 10);
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
    fn join(&self, id: u64) -> Pin<Box<OwnedNotified>> {
        self.queue.lock().unwrap().push_back(id);
        let mut notified = Box::pin(self.notify.clone().notified_owned());
        let _ = poll(notified.as_mut());
        notified
    }
}

struct BaselineThread<'a> {
    base: &'a Baseline,
    worker: WorkerId,
    seq: u64,
    next: u64,
    oldest: Option<Pin<Box<OwnedNotified>>>,
}

impl BaselineThread<'_> {
    fn cycle(&mut self) {
        self.next += 1;
        let new = self.base.join(self.next);
        self.base.line.report(self.worker, &mut self.seq, 10);
        self.base.notify.notify_one();
        let mut oldest = self.oldest.replace(new).expect("a request waits");
        loop {
            if poll(oldest.as_mut()).is_ready() {
                black_box(self.base.queue.lock().unwrap().pop_front());
                black_box(self.base.line.router.route(MODEL, &[]).expect("routed"));
                return;
            }
            self.base.line.report(self.worker, &mut self.seq, 10);
            self.base.notify.notify_one();
        }
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
                let line = Line::new(threads);
                let mut seq = 1;
                for worker in 0..threads as WorkerId {
                    line.report(worker, &mut seq, 10);
                }
                let base = Baseline { line, notify: Arc::new(Notify::new()), queue: Mutex::new(VecDeque::new()) };
                let make = |t: usize| {
                    let first = base.join(t as u64 * 1_000_000_000);
                    let next = t as u64 * 1_000_000_000;
                    BaselineThread { base: &base, worker: t as WorkerId, seq: 10, next, oldest: Some(first) }
                };
                timed(iters, threads, &make, BaselineThread::cycle)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
