//! The waiting line (`WorkerRouter::wait`) against a simple reference
//! model: joins, polls, drops, deadlines and worker reports in any order.
//!
//! The reference keeps the waiters in (deadline, arrival) order with a
//! woken flag, the busy workers and the spent ones (dispatched to from the
//! line since their last report, while anyone waits). After every step a
//! pass wakes the first waiters not yet woken until as many are woken as
//! there are free workers (not busy, not spent); first in key order, or in
//! reverse key order once the line is overrun: a waiter expired with at
//! least 3 waiters behind it for every 2 the line dispatched while it
//! waited. Overrun lasts until the line empties. A woken waiter that is
//! polled routes to a free worker, or waits again if none is left. The
//! real line must agree on every outcome, its counts, and every wake-up.
#![no_main]

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use loadgate::{
    BusyThresholds, LineLimits, LoadReport, MonitorConfig, Policy, RankLoad, Ticket, Wait, WaitError, WorkerId,
    WorkerMonitor, WorkerRouter,
};

const MODEL: &str = "m";

#[derive(Arbitrary, Debug)]
struct Input {
    workers: u8,
    max_waiting: u8,
    max_tokens: u16,
    ops: Vec<Op>,
}

#[derive(Arbitrary, Debug)]
enum Op {
    /// A new request: its deadline offset (ms) and tokens.
    Join {
        deadline_ms: u8,
        tokens: u8,
    },
    Poll(u8),
    Drop(u8),
    /// The waiter's timer fires, and it is polled.
    Expire(u8),
    Report {
        worker: u8,
        busy: bool,
    },
}

/// A timer the fuzzer fires.
struct Timer(Rc<Cell<bool>>);

impl Future for Timer {
    type Output = ();
    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        if self.0.get() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A real waiter and its reference twin.
struct Waiter<'r> {
    wait: Pin<Box<Wait<'r, Timer>>>,
    fired: Rc<Cell<bool>>,
    flag: Arc<Flag>,
    /// (deadline, arrival): the reference's order.
    key: (u8, u64),
    tokens: u64,
    woken: bool,
    /// The line's dispatches when it joined.
    dispatched_before: u64,
}

impl Waiter<'_> {
    fn poll(&mut self) -> Poll<Result<WorkerId, WaitError>> {
        self.flag.0.store(false, Ordering::SeqCst);
        let waker = Waker::from(self.flag.clone());
        self.wait.as_mut().poll(&mut Context::from_waker(&waker))
    }
}

struct Model<'r> {
    monitor: Arc<WorkerMonitor>,
    router: &'r WorkerRouter,
    workers: u64,
    base: Instant,
    /// The line, in no order (the key orders it).
    line: Vec<Waiter<'r>>,
    busy: Vec<bool>,
    spent: Vec<WorkerId>,
    /// Latest first, until the line empties.
    overrun: bool,
    /// Dispatches from the line, ever.
    dispatched: u64,
    seq: Vec<u64>,
    arrivals: u64,
}

impl<'r> Model<'r> {
    fn free(&self) -> Vec<WorkerId> {
        (1..=self.workers).filter(|w| !self.busy[*w as usize] && !self.spent.contains(w)).collect()
    }

    /// Wakes the first waiters not woken until as many are woken as there
    /// are free workers; checks that each was really woken.
    fn pass(&mut self) {
        let free = self.free().len();
        let mut order: Vec<usize> = (0..self.line.len()).collect();
        order.sort_by_key(|i| self.line[*i].key);
        if self.overrun {
            order.reverse();
        }
        let mut woken = self.line.iter().filter(|w| w.woken).count();
        for i in order {
            if woken >= free {
                break;
            }
            let waiter = &mut self.line[i];
            if !waiter.woken {
                waiter.woken = true;
                woken += 1;
                assert!(waiter.flag.0.load(Ordering::SeqCst), "waiter {:?} not woken", waiter.key);
            }
        }
    }

    /// Takes waiter `i` out of the reference line, forgetting the spent
    /// workers when it empties; `was` the woken flag.
    fn remove(&mut self, i: usize) -> Waiter<'r> {
        let waiter = self.line.swap_remove(i);
        if self.line.is_empty() {
            self.spent.clear();
            self.overrun = false;
        }
        waiter
    }

    /// What polling waiter `i` must give, and the reference's step.
    fn polled(&mut self, i: usize, got: Poll<Result<WorkerId, WaitError>>) {
        if !self.line[i].woken {
            assert_eq!(got, Poll::Pending, "an unwoken waiter routed");
            return;
        }
        let free = self.free();
        match got {
            Poll::Ready(Ok(worker)) => {
                assert!(free.contains(&worker), "routed to {worker}, free were {free:?}");
                self.remove(i);
                self.dispatched += 1;
                if !self.line.is_empty() {
                    self.spent.push(worker);
                }
            }
            Poll::Pending => {
                assert!(free.is_empty(), "a woken waiter waits while {free:?} are free");
                self.line[i].woken = false;
            }
            other => panic!("a woken waiter got {other:?}"),
        }
    }

    fn check_counts(&self) {
        let stats = self.monitor.line_stats(MODEL).expect("model known");
        assert_eq!(stats.waiting, self.line.len());
        assert_eq!(stats.tokens, self.line.iter().map(|w| w.tokens).sum::<u64>());
    }

    fn find(&self, n: u8) -> Option<usize> {
        (!self.line.is_empty()).then(|| n as usize % self.line.len())
    }
}

fuzz_target!(|input: Input| {
    let workers = u64::from(input.workers % 3) + 1;
    let limits =
        LineLimits { max_waiting: usize::from(input.max_waiting % 6), max_tokens: u64::from(input.max_tokens) };
    let config = MonitorConfig {
        default_thresholds: BusyThresholds { active_decode_blocks_threshold: Some(0.5), ..Default::default() },
        line: limits,
        ..Default::default()
    };
    let monitor = Arc::new(WorkerMonitor::new(config).unwrap());
    for w in 1..=workers {
        monitor.register(w, MODEL, 1, 0).unwrap();
    }
    let router = WorkerRouter::new(monitor.clone(), Policy::RoundRobin);
    let mut m = Model {
        monitor,
        router: &router,
        workers,
        base: Instant::now(),
        line: Vec::new(),
        busy: vec![false; workers as usize + 1],
        spent: Vec::new(),
        overrun: false,
        dispatched: 0,
        seq: vec![0; workers as usize + 1],
        arrivals: 0,
    };
    for op in input.ops.into_iter().take(200) {
        match op {
            Op::Join { deadline_ms, tokens } => {
                let fired = Rc::new(Cell::new(false));
                let deadline = m.base + Duration::from_millis(u64::from(deadline_ms));
                let ticket = Ticket::new(u64::from(tokens), deadline);
                let wait = Box::pin(m.router.wait(MODEL, &[], ticket, Timer(fired.clone())));
                let flag = Arc::new(Flag(AtomicBool::new(false)));
                let key = (deadline_ms, m.arrivals);
                m.arrivals += 1;
                let mut waiter = Waiter {
                    wait,
                    fired,
                    flag,
                    key,
                    tokens: u64::from(tokens),
                    woken: false,
                    dispatched_before: m.dispatched,
                };
                let got = waiter.poll();
                let free = m.free();
                if m.line.is_empty() && !free.is_empty() {
                    match got {
                        Poll::Ready(Ok(worker)) => assert!(free.contains(&worker), "{worker} not in {free:?}"),
                        other => panic!("nobody waits and {free:?} are free, yet {other:?}"),
                    }
                    continue;
                }
                let queued_tokens: u64 = m.line.iter().map(|w| w.tokens).sum();
                if m.line.len() >= limits.max_waiting || queued_tokens + waiter.tokens > limits.max_tokens {
                    assert_eq!(got, Poll::Ready(Err(WaitError::QueueFull)));
                    continue;
                }
                // It joined; the join's own pass may wake it (and others:
                // their wakers are called before the poll returns), and a
                // woken joiner routes in the same poll.
                m.line.push(waiter);
                let i = m.line.len() - 1;
                m.pass();
                m.polled(i, got);
            }
            Op::Poll(n) => {
                let Some(i) = m.find(n) else { continue };
                let got = m.line[i].poll();
                m.polled(i, got);
                m.pass();
            }
            Op::Drop(n) => {
                let Some(i) = m.find(n) else { continue };
                let waiter = m.remove(i);
                drop(waiter);
                m.pass();
            }
            Op::Expire(n) => {
                let Some(i) = m.find(n) else { continue };
                m.line[i].fired.set(true);
                let got = m.line[i].poll();
                assert_eq!(got, Poll::Ready(Err(WaitError::Deadline)));
                let key = m.line[i].key;
                let behind = m.line.iter().filter(|w| w.key > key).count() as u64;
                let expired = m.remove(i);
                let served = m.dispatched - expired.dispatched_before;
                if !m.overrun && !m.line.is_empty() {
                    m.overrun = behind * 2 >= served * 3;
                }
                m.pass();
            }
            Op::Report { worker, busy } => {
                let w = u64::from(worker) % workers + 1;
                m.seq[w as usize] += 1;
                let blocks = if busy { 90 } else { 10 };
                let load = RankLoad { active_decode_blocks: blocks, kv_total_blocks: 100, ..Default::default() };
                m.monitor.apply(&LoadReport { worker: w, seq: m.seq[w as usize], load, ..Default::default() }).unwrap();
                m.busy[w as usize] = busy;
                m.spent.retain(|s| *s != w);
                m.pass();
            }
        }
        m.check_counts();
    }
});
