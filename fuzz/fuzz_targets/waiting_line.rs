//! The waiting line (`WorkerRouter::wait`) against a simple reference
//! model: joins of every class, polls, drops, deadlines and worker reports
//! in any order.
//!
//! The reference keeps the waiters in (class, deadline, arrival) order
//! with a woken flag, the busy workers and the spent ones (dispatched to from the
//! line since their last report, while anyone waits). After every step a
//! pass wakes the first waiters not yet woken until as many are woken as
//! there are free workers (not busy, not spent): the highest class first;
//! within a class in key order, or in reverse once the class is overrun (a
//! waiter of it expired with at least 3 of its class behind it for every 2
//! the class dispatched while it waited; until the class empties). A
//! critical arrival at a full line displaces sheddable waiters from the
//! latest key down when that makes it fit; each displaced one is woken and
//! hears `ClassShed` (polled, or with its timer fired) or is dropped. A woken waiter that is
//! polled routes to a free worker it does not exclude, or waits again if none is left: held,
//! if it has exclusions (passed over by the passes until the next report), so a free worker
//! it may not take goes to the next waiter.
//!
//! Tenants: within a class the reference walks its tenants (in the order
//! they started waiting) one step at a time, as deficit round robin is
//! usually written: a tenant with a sleeping waiter gets its weight in
//! tokens as the turn reaches it and is woken while its deficit covers its
//! next waiter's prompt (at least 1); a woken waiter that leaves or waits
//! again without a worker refunds it (up to its weight and its largest
//! prompt, never below what it had); a tenant without waiters leaves the
//! walk. A tenant over
//! its caps (waiting requests, queued tokens, every class) is refused with
//! `TenantCap`. The real line must agree on every outcome, its counts, and
//! every wake-up.
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
    BusyThresholds, Class, LineLimits, LoadReport, MonitorConfig, Policy, RankLoad, Tenant, Ticket, Wait, WaitError,
    WorkerId, WorkerMonitor, WorkerRouter,
};

const MODEL: &str = "m";

#[derive(Arbitrary, Debug)]
struct Input {
    workers: u8,
    max_waiting: u8,
    max_tokens: u16,
    /// Per tenant id: its cap on waiting requests (0: none) and queued
    /// tokens (0: none).
    caps: [(u8, u16); TENANTS],
    ops: Vec<Op>,
}

const TENANTS: usize = 3;

#[derive(Arbitrary, Debug)]
enum Op {
    /// A new request: its deadline offset (ms), tokens and class (mod 3),
    /// and what each waiter it displaces does next (bit by bit: poll, or
    /// fire its timer and poll; drop after either).
    Join {
        deadline_ms: u8,
        tokens: u8,
        class: u8,
        fate: u8,
        /// Its tenant (mod 3) and weight (mod 4, plus 1).
        tenant: u8,
        weight: u8,
        /// The workers it may not go to: bit w-1 for worker w (mod 8,
        /// so most joins exclude some).
        exclude: u8,
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
    /// (class, deadline, arrival): the reference's order.
    key: (usize, u8, u64),
    tenant: u32,
    tokens: u64,
    woken: bool,
    /// Kept off the free workers by its exclusions, until the next report.
    held: bool,
    exclude: Vec<WorkerId>,
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

/// A tenant in a class's walk.
struct Turn {
    tenant: u32,
    quantum: u64,
    /// The largest prompt (at least 1) of its arrivals since it joined.
    largest: u64,
    deficit: u64,
}

/// A class's deficit round robin.
#[derive(Default)]
struct Round {
    /// Tenants with waiters of the class, in the order they joined it.
    tenants: Vec<Turn>,
    turn: usize,
    /// The tenant at `turn` had its credit.
    credited: bool,
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
    /// Per class: latest first, until the class empties.
    overrun: [bool; 3],
    /// Dispatches from each class, ever.
    dispatched: [u64; 3],
    seq: Vec<u64>,
    arrivals: u64,
    rounds: [Round; 3],
}

impl<'r> Model<'r> {
    fn free(&self) -> Vec<WorkerId> {
        (1..=self.workers).filter(|w| !self.busy[*w as usize] && !self.spent.contains(w)).collect()
    }

    /// The free workers a waiter excluding `exclude` may take.
    fn free_beside(&self, exclude: &[WorkerId]) -> Vec<WorkerId> {
        self.free().into_iter().filter(|w| !exclude.contains(w)).collect()
    }

    /// Wakes waiters until as many are woken as there are free workers,
    /// the highest class first, by the walk in each; checks that each was
    /// really woken.
    fn pass(&mut self) {
        let free = self.free().len();
        let mut woken = self.line.iter().filter(|w| w.woken).count();
        for class in 0..3 {
            while woken < free {
                let Some(i) = self.pick(class) else { break };
                let waiter = &mut self.line[i];
                waiter.woken = true;
                woken += 1;
                assert!(waiter.flag.0.load(Ordering::SeqCst), "waiter {:?} not woken", waiter.key);
            }
        }
    }

    /// `tenant`'s next sleeping waiter of `class`: the first in key order,
    /// or the last while the class is overrun.
    fn next(&self, class: usize, tenant: u32) -> Option<usize> {
        let mine = (0..self.line.len()).filter(|i| {
            let w = &self.line[*i];
            w.key.0 == class && w.tenant == tenant && !w.woken && !w.held
        });
        match self.overrun[class] {
            true => mine.max_by_key(|i| self.line[*i].key),
            false => mine.min_by_key(|i| self.line[*i].key),
        }
    }

    /// One step of the walk at a time until a tenant's deficit covers its
    /// next waiter (charged).
    fn pick(&mut self, class: usize) -> Option<usize> {
        let tenants: Vec<u32> = self.rounds[class].tenants.iter().map(|t| t.tenant).collect();
        if tenants.iter().all(|t| self.next(class, *t).is_none()) {
            return None;
        }
        loop {
            let turn = self.rounds[class].turn;
            let next = self.next(class, tenants[turn]);
            let round = &mut self.rounds[class];
            if !round.credited {
                if next.is_some() {
                    round.tenants[turn].deficit += round.tenants[turn].quantum;
                }
                round.credited = true;
            }
            if let Some(i) = next {
                let cost = self.line[i].tokens.max(1);
                let t = &mut round.tenants[turn];
                if t.deficit >= cost {
                    t.deficit -= cost;
                    return Some(i);
                }
            }
            round.turn = (turn + 1) % tenants.len();
            round.credited = false;
        }
    }

    /// A woken waiter `i` goes back to sleep (or leaves) without a worker:
    /// its tenant gets its wake-up back, up to its weight and its largest
    /// prompt (no credit banked by being woken and held again and again),
    /// and never loses credit by it.
    fn refund(&mut self, i: usize) {
        let waiter = &mut self.line[i];
        if std::mem::take(&mut waiter.woken) {
            let cost = waiter.tokens.max(1);
            let round = &mut self.rounds[waiter.key.0];
            let t = round.tenants.iter_mut().find(|t| t.tenant == waiter.tenant).expect("a waiting tenant");
            t.deficit = t.deficit.max((t.deficit + cost).min(t.quantum + t.largest));
        }
    }

    /// Takes waiter `i` out of the reference line, forgetting the spent
    /// workers when it empties; `was` the woken flag.
    fn remove(&mut self, i: usize) -> Waiter<'r> {
        let waiter = self.line.swap_remove(i);
        if self.line.is_empty() {
            self.spent.clear();
        }
        let class = waiter.key.0;
        if !self.line.iter().any(|w| w.key.0 == class && w.tenant == waiter.tenant) {
            let round = &mut self.rounds[class];
            let t = round.tenants.iter().position(|t| t.tenant == waiter.tenant).expect("a waiting tenant");
            round.tenants.remove(t);
            if t < round.turn {
                round.turn -= 1;
            } else if t == round.turn {
                round.credited = false;
            }
            if round.turn >= round.tenants.len() {
                round.turn = 0;
            }
        }
        if !self.line.iter().any(|w| w.key.0 == class) {
            self.overrun[class] = false;
        }
        waiter
    }

    /// What polling waiter `i` must give, and the reference's step.
    fn polled(&mut self, i: usize, got: Poll<Result<WorkerId, WaitError>>) {
        if !self.line[i].woken {
            assert_eq!(got, Poll::Pending, "an unwoken waiter routed");
            return;
        }
        let free = self.free_beside(&self.line[i].exclude);
        match got {
            Poll::Ready(Ok(worker)) => {
                assert!(free.contains(&worker), "routed to {worker}, free (and not excluded) were {free:?}");
                let served = self.remove(i);
                self.dispatched[served.key.0] += 1;
                if !self.line.is_empty() {
                    self.spent.push(worker);
                }
            }
            Poll::Pending => {
                assert!(free.is_empty(), "a woken waiter waits while {free:?} are free");
                self.refund(i);
                self.line[i].held = !self.line[i].exclude.is_empty();
            }
            other => panic!("a woken waiter got {other:?}"),
        }
    }

    /// The waiters (indexes, in removal order: remove each before the
    /// next index is valid... so highest index first) a `class` arrival of
    /// `tokens` displaces to fit, or `None` if it is refused.
    fn room_for(&self, class: usize, tokens: u64, limits: LineLimits) -> Option<Vec<usize>> {
        let fits = |len: usize, sum: u64| len < limits.max_waiting && sum + tokens <= limits.max_tokens;
        let mut len = self.line.len();
        let mut sum: u64 = self.line.iter().map(|w| w.tokens).sum();
        if fits(len, sum) {
            return Some(Vec::new());
        }
        if class != 0 {
            return None;
        }
        let mut sheddable: Vec<usize> = (0..self.line.len()).filter(|i| self.line[*i].key.0 == 2).collect();
        sheddable.sort_by_key(|i| std::cmp::Reverse(self.line[*i].key));
        let mut taken = Vec::new();
        for i in sheddable {
            if fits(len, sum) {
                break;
            }
            len -= 1;
            sum -= self.line[i].tokens;
            taken.push(i);
        }
        if !fits(len, sum) {
            return None;
        }
        // `remove` swaps the last waiter in: take the highest index first.
        taken.sort_unstable_by(|a, b| b.cmp(a));
        Some(taken)
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
        overrun: [false; 3],
        dispatched: [0; 3],
        seq: vec![0; workers as usize + 1],
        arrivals: 0,
        rounds: Default::default(),
    };
    let caps = input.caps.map(|(waiting, tokens)| {
        let waiting = if waiting == 0 { usize::MAX } else { usize::from(waiting % 4) };
        let tokens = if tokens == 0 { u64::MAX } else { u64::from(tokens % 600) };
        (waiting, tokens)
    });
    for op in input.ops.into_iter().take(200) {
        match op {
            Op::Join { deadline_ms, tokens, class, fate, tenant, weight, exclude } => {
                let exclude: Vec<WorkerId> = (1..=workers).filter(|w| exclude % 8 & (1 << (w - 1)) != 0).collect();
                let class = usize::from(class % 3);
                let fired = Rc::new(Cell::new(false));
                let deadline = m.base + Duration::from_millis(u64::from(deadline_ms));
                let id = u32::from(tenant) % TENANTS as u32;
                let (max_waiting, max_tokens) = caps[id as usize];
                let weight = u32::from(weight % 4) + 1;
                let tenant = Tenant { max_waiting, max_tokens, ..Tenant::new(id, weight) };
                let ticket = Ticket::new(u64::from(tokens), deadline).with_class(Class::ALL[class]).with_tenant(tenant);
                let wait = Box::pin(m.router.wait(MODEL, &exclude, ticket, Timer(fired.clone())));
                let flag = Arc::new(Flag(AtomicBool::new(false)));
                let key = (class, deadline_ms, m.arrivals);
                m.arrivals += 1;
                let mut waiter = Waiter {
                    wait,
                    fired,
                    flag,
                    key,
                    tenant: id,
                    tokens: u64::from(tokens),
                    woken: false,
                    held: false,
                    exclude,
                    dispatched_before: m.dispatched[class],
                };
                let got = waiter.poll();
                let free = m.free_beside(&waiter.exclude);
                if m.line.is_empty() && !free.is_empty() {
                    match got {
                        Poll::Ready(Ok(worker)) => assert!(free.contains(&worker), "{worker} not in {free:?}"),
                        other => panic!("nobody waits and {free:?} are free, yet {other:?}"),
                    }
                    continue;
                }
                let held = m.line.iter().filter(|w| w.tenant == id);
                let (held_len, held_sum) = held.fold((0, 0), |(n, sum), w| (n + 1, sum + w.tokens));
                if held_len >= max_waiting || held_sum + waiter.tokens > max_tokens {
                    assert_eq!(got, Poll::Ready(Err(WaitError::TenantCap)));
                    continue;
                }
                let Some(displaced) = m.room_for(class, waiter.tokens, limits) else {
                    assert_eq!(got, Poll::Ready(Err(WaitError::QueueFull)));
                    continue;
                };
                for (n, i) in displaced.into_iter().enumerate() {
                    m.refund(i);
                    let mut gone = m.remove(i);
                    assert!(gone.flag.0.load(Ordering::SeqCst), "a displaced waiter is woken");
                    if (fate >> (n % 8)) & 1 == 1 {
                        gone.fired.set(true);
                    }
                    assert_eq!(gone.poll(), Poll::Ready(Err(WaitError::ClassShed)));
                }
                // It joined; the join's own pass may wake it (and others:
                // their wakers are called before the poll returns), and a
                // woken joiner routes in the same poll.
                m.line.push(waiter);
                let round = &mut m.rounds[class];
                let cost = u64::from(tokens).max(1);
                match round.tenants.iter_mut().find(|t| t.tenant == id) {
                    Some(t) => {
                        t.quantum = u64::from(weight);
                        t.largest = t.largest.max(cost);
                    }
                    None => {
                        round.tenants.push(Turn { tenant: id, quantum: u64::from(weight), largest: cost, deficit: 0 })
                    }
                }
                let i = m.line.len() - 1;
                m.pass();
                m.polled(i, got);
                // A joiner held at once passes the turn on in the same poll.
                m.pass();
            }
            Op::Poll(n) => {
                let Some(i) = m.find(n) else { continue };
                let got = m.line[i].poll();
                m.polled(i, got);
                m.pass();
            }
            Op::Drop(n) => {
                let Some(i) = m.find(n) else { continue };
                m.refund(i);
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
                let class = key.0;
                let behind = m.line.iter().filter(|w| w.key.0 == class && w.key > key).count() as u64;
                m.refund(i);
                let expired = m.remove(i);
                let served = m.dispatched[class] - expired.dispatched_before;
                if !m.overrun[class] && m.line.iter().any(|w| w.key.0 == class) {
                    m.overrun[class] = behind * 2 >= served * 3;
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
                // Every report of the model's workers releases the held.
                m.line.iter_mut().for_each(|waiter| waiter.held = false);
                m.pass();
            }
        }
        m.check_counts();
    }
});
