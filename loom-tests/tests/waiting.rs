//! loom: the waiting line ([`WorkerRouter::wait`]). A worker freed while a
//! request joins the line serves it (no lost wake-up), and one freed while
//! a request joins behind a waiter serves the first; a waiter dropped
//! while the worker frees leaves the line and passes its wake-up on; the
//! line's count bound holds on both sides (never more than the limit in,
//! never one refused while there is room); a critical arrival that displaces
//! a sheddable waiter racing that waiter's dispatch: exactly one of them
//! holds the place, and the critical one is served either way; a report
//! another frontend's line takes (declined here) gives its worker to no
//! waiter here, whatever joins meanwhile, and the next report of this
//! line's serves the first; a waiter whose exclusions name the freed worker
//! passes it on to the next waiter in every interleaving; a request joining
//! as the model's last worker leaves hears that the model is unavailable,
//! as does the one waiting before it; a request of a class with no line
//! that goes ahead of lower-class waiters while the worker frees takes the
//! worker or leaves it to the waiter, never both, never neither.
//!
//! By default loom sees the view's swap as a mutex (see `sync.rs`), so these
//! models check the line's protocol around it — the joiner's own wake-up
//! pass, the publisher's and the reporter's passes, the hand-over on a drop —
//! in every interleaving of the line's lock and counters. `.ci/run` runs them
//! again with `--cfg loom_weak_swap`, where a view read may return an older
//! view wherever the memory model allows: that checks the orderings of the
//! no-lost-wake-up argument (`src/waiting/mod.rs`). A joiner's increment made
//! a plain store, or a publisher's RMW on the count a load, fails
//! `a_worker_freed_while_a_request_joins_serves_it` there (and passes with
//! the mutex).
#![cfg(loom)]

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use loadgate::{
    BusyThresholds, Class, LineLimits, LoadReport, MonitorConfig, Policy, RankLoad, Ticket, Wait, WaitError, WorkerId,
    WorkerMonitor, WorkerRouter,
};
use loadgate_loom_tests::run_model_with;
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::thread;

const MODEL: &str = "m";

/// A waker that records that it was woken.
struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        // SeqCst: a test flag; the strongest ordering hides nothing.
        self.0.store(true, Ordering::SeqCst);
    }
}

type Pending = std::future::Pending<()>;

/// One request of the line, with its own waker.
struct Waiter<'r> {
    wait: Pin<Box<Wait<'r, Pending>>>,
    woken: Arc<Flag>,
}

impl<'r> Waiter<'r> {
    fn new(router: &'r WorkerRouter) -> Self {
        Waiter::of(router, Class::Standard)
    }

    fn of(router: &'r WorkerRouter, class: Class) -> Self {
        Waiter::excluding(router, class, &[])
    }

    fn excluding(router: &'r WorkerRouter, class: Class, exclude: &[WorkerId]) -> Self {
        let ticket = Ticket::new(1, Instant::now() + Duration::from_secs(60)).with_class(class);
        Waiter {
            wait: Box::pin(router.wait(MODEL, exclude, ticket, std::future::pending())),
            woken: Arc::new(Flag(AtomicBool::new(false))),
        }
    }

    fn poll(&mut self) -> Poll<Result<WorkerId, WaitError>> {
        let waker = Waker::from(self.woken.clone());
        self.wait.as_mut().poll(&mut Context::from_waker(&waker))
    }

    fn woken(&self) -> bool {
        // SeqCst: as in `wake`.
        self.woken.0.load(Ordering::SeqCst)
    }
}

/// A monitor whose one worker (id 1) is busy, the line holding up to
/// `limit`, and a round-robin router over it.
fn busy_pool(limit: usize) -> (Arc<WorkerMonitor>, WorkerRouter) {
    let (clock, _mock) = quanta::Clock::mock();
    let config = MonitorConfig {
        default_thresholds: BusyThresholds { active_decode_blocks_threshold: Some(0.5), ..Default::default() },
        line: LineLimits { max_waiting: limit, max_tokens: u64::MAX },
        ..Default::default()
    };
    let monitor = Arc::new(WorkerMonitor::with_clock(config, clock).unwrap());
    monitor.register(1, MODEL, 1, 0).unwrap();
    monitor.apply(&report(1, 90)).unwrap();
    let router = WorkerRouter::new(monitor.clone(), Policy::RoundRobin);
    (monitor, router)
}

/// Worker 1's own report of `blocks` of 100.
fn report(seq: u64, blocks: u32) -> LoadReport {
    let load = RankLoad { active_decode_blocks: blocks, kv_total_blocks: 100, ..Default::default() };
    LoadReport { worker: 1, seq, load, ..Default::default() }
}

/// A thread applying the worker's free report (seq 2, 10 of 100 blocks).
fn spawn_freer(monitor: &Arc<WorkerMonitor>) -> thread::JoinHandle<()> {
    let monitor = monitor.clone();
    thread::spawn(move || {
        monitor.apply(&report(2, 10)).unwrap();
    })
}

fn waiting(monitor: &WorkerMonitor) -> usize {
    monitor.line_stats(MODEL).unwrap().waiting
}

/// The worker frees while a request joins the line: the request is routed
/// at once, or it waits and the free report wakes it; never left asleep.
#[test]
fn a_worker_freed_while_a_request_joins_serves_it() {
    run_model_with("waiting/a_worker_freed_while_a_request_joins_serves_it", 3, || {
        let (monitor, router) = busy_pool(4);
        let freer = spawn_freer(&monitor);
        let mut waiter = Waiter::new(&router);
        let first = waiter.poll();
        freer.join().unwrap();
        match first {
            Poll::Ready(routed) => assert_eq!(routed, Ok(1)),
            Poll::Pending => {
                assert!(waiter.woken(), "the free worker never woke the waiter");
                assert_eq!(waiter.poll(), Poll::Ready(Ok(1)));
            }
        }
        assert_eq!(waiting(&monitor), 0);
    });
}

/// The worker frees while a request joins behind a waiter (a join that
/// stores the count under the lock rather than incrementing it): the free
/// worker goes to the first in line whatever the order, and only to it.
#[test]
fn a_worker_freed_while_a_request_joins_behind_a_waiter_serves_the_first() {
    run_model_with("waiting/a_worker_freed_while_a_request_joins_behind_a_waiter_serves_the_first", 3, || {
        let (monitor, router) = busy_pool(4);
        let mut first = Waiter::new(&router);
        assert_eq!(first.poll(), Poll::Pending);
        let freer = spawn_freer(&monitor);
        let mut second = Waiter::new(&router);
        assert_eq!(second.poll(), Poll::Pending, "a waiter is ahead of it");
        freer.join().unwrap();
        assert!(first.woken(), "the free worker never woke the first in line");
        assert!(!second.woken(), "one free worker, one waiter woken");
        assert_eq!(first.poll(), Poll::Ready(Ok(1)));
        assert_eq!(waiting(&monitor), 1);
    });
}

/// Two wait; the first is dropped (its client left) while the worker
/// frees: the line ends with the second alone, woken, and it is served
/// (the first's wake-up passed on if it had been woken).
#[test]
fn a_waiter_dropped_while_the_worker_frees_leaves_and_passes_its_turn() {
    run_model_with("waiting/a_waiter_dropped_while_the_worker_frees_leaves_and_passes_its_turn", 3, || {
        let (monitor, router) = busy_pool(4);
        let mut first = Waiter::new(&router);
        let mut second = Waiter::new(&router);
        assert_eq!(first.poll(), Poll::Pending);
        assert_eq!(second.poll(), Poll::Pending);
        let freer = spawn_freer(&monitor);
        drop(first);
        freer.join().unwrap();
        assert_eq!(waiting(&monitor), 1, "the dropped waiter left");
        assert!(second.woken(), "the wake-up was lost with the dropped waiter");
        assert_eq!(second.poll(), Poll::Ready(Ok(1)));
        let stats = monitor.line_stats(MODEL).unwrap();
        assert_eq!((stats.waiting, stats.tokens, stats.dispatched), (0, 0, 1));
    });
}

/// Two requests join a line of room `limit` at once: with room for one,
/// exactly one joins and the other is refused; with room for two, both
/// join.
#[test]
fn the_count_bound_holds_on_both_sides() {
    for limit in [1, 2] {
        run_model_with("waiting/the_count_bound_holds_on_both_sides", 3, move || {
            let (monitor, router) = busy_pool(limit);
            // 'static for the other thread: one small router per execution.
            let router: &'static WorkerRouter = Box::leak(Box::new(router));
            let other = thread::spawn(move || Waiter::new(router).poll_kept());
            let (mine, _kept) = Waiter::new(router).poll_kept();
            let (theirs, _kept_too) = other.join().unwrap();
            let joined = [mine, theirs].iter().filter(|p| p.is_pending()).count();
            let refused = [mine, theirs].iter().filter(|p| **p == Poll::Ready(Err(WaitError::QueueFull))).count();
            assert_eq!((joined, refused), (limit, 2 - limit), "{mine:?} {theirs:?}");
            assert_eq!(waiting(&monitor), limit);
        });
    }
}

/// A woken sheddable waiter is polled (dispatched) while a critical request
/// joins a line of room `limit`. With room for one, the critical arrival
/// either finds the line full and displaces the sheddable waiter (which
/// then hears `ClassShed`) or finds it gone (dispatched): never both
/// served past the worker's one free place, never the place lost; the
/// critical request is served in both. With room for two, nobody is
/// displaced.
#[test]
fn a_critical_arrival_displacing_a_sheddable_waiter_races_its_dispatch() {
    for limit in [1, 2] {
        run_model_with("waiting/a_critical_arrival_displacing_a_sheddable_waiter_races_its_dispatch", 3, move || {
            let (monitor, router) = busy_pool(limit);
            let router: &'static WorkerRouter = Box::leak(Box::new(router));
            let mut sheddable = Waiter::of(router, Class::Sheddable);
            assert_eq!(sheddable.poll(), Poll::Pending);
            monitor.apply(&report(2, 10)).unwrap();
            assert!(sheddable.woken(), "the free worker woke it");
            let critical = thread::spawn(move || Waiter::of(router, Class::Critical).poll_kept());
            let shed = sheddable.poll();
            let (mut first, mut kept) = critical.join().unwrap();
            match shed {
                Poll::Ready(Ok(1)) => {
                    // Dispatched first: the critical one routed at once (the
                    // line was empty) or waits for the worker's next report.
                    if first.is_pending() {
                        assert!(limit == 2 || !kept.woken(), "{first:?}");
                        monitor.apply(&report(3, 10)).unwrap();
                        assert!(kept.woken(), "the report frees its spent worker");
                        first = kept.poll();
                    }
                    assert_eq!(first, Poll::Ready(Ok(1)));
                }
                Poll::Ready(Err(WaitError::ClassShed)) => {
                    assert_eq!(limit, 1, "displaced from a line with room");
                    if first.is_pending() {
                        assert!(kept.woken(), "the displaced waiter's turn passed on");
                        first = kept.poll();
                    }
                    assert_eq!(first, Poll::Ready(Ok(1)));
                }
                other => panic!("the sheddable waiter got {other:?}"),
            }
            assert_eq!(waiting(&monitor), 0);
        });
    }
}

impl<'r> Waiter<'r> {
    /// Polls once and keeps the waiter (a dropped one would leave).
    fn poll_kept(mut self) -> (Poll<Result<WorkerId, WaitError>>, Waiter<'r>) {
        let first = self.poll();
        (first, self)
    }
}

/// Two wait and the worker's one report frees it while the waiters are
/// polled: the report wakes and dispatches one of them, never both (the
/// report that freed the worker is not also the report after its
/// dispatch).
#[test]
fn one_report_dispatches_one_waiter() {
    run_model_with("waiting/one_report_dispatches_one_waiter", 3, || {
        let (monitor, router) = busy_pool(4);
        let mut first = Waiter::new(&router);
        let mut second = Waiter::new(&router);
        assert_eq!(first.poll(), Poll::Pending);
        assert_eq!(second.poll(), Poll::Pending);
        let freer = spawn_freer(&monitor);
        let mut done = [false; 2];
        let poll_woken = |waiters: [&mut Waiter<'_>; 2], done: &mut [bool; 2]| {
            for (waiter, done) in waiters.into_iter().zip(done.iter_mut()) {
                if !*done && waiter.woken() && waiter.poll().is_ready() {
                    *done = true;
                }
            }
        };
        poll_woken([&mut first, &mut second], &mut done);
        poll_woken([&mut first, &mut second], &mut done);
        freer.join().unwrap();
        poll_woken([&mut first, &mut second], &mut done);
        let served = done.iter().filter(|d| **d).count();
        assert_eq!(served, 1, "one report, one dispatch");
    });
}

/// A critical request that may not wait routes ahead of a standard waiter
/// (`route_class_behind_line`: only waiters of its class or a higher one
/// hold it back) while the worker frees: in every interleaving exactly one
/// of the two gets the worker on that report, never both (one report, one
/// request past a threshold) and never neither (the freed worker is not
/// left idle behind the waiter).
#[test]
fn a_request_going_ahead_of_lower_waiters_takes_one_reports_worker() {
    run_model_with("waiting/a_request_going_ahead_of_lower_waiters_takes_one_reports_worker", 3, || {
        let (monitor, router) = busy_pool(4);
        let mut waiter = Waiter::new(&router);
        assert_eq!(waiter.poll(), Poll::Pending);
        let freer = spawn_freer(&monitor);
        let ahead = router.route_class_behind_line(MODEL, &[], Class::Critical);
        freer.join().unwrap();
        let served = waiter.woken() && waiter.poll() == Poll::Ready(Ok(1));
        match ahead {
            Ok(worker) => {
                assert_eq!(worker, 1);
                assert!(!served, "the worker took two requests on one report");
            }
            Err(e) => {
                assert_eq!(e, loadgate::RouteError::Overloaded);
                assert!(served, "the freed worker went to nobody");
            }
        }
    });
}

/// Another frontend's line takes the worker's free report (every report
/// is declined here while the others' waiters are about 2^32 to this
/// line's 1 or 2), while a second request joins: in every interleaving
/// neither waiter here gets the worker (it is marked before the report's
/// publication shows it free, so the joiner's own pass skips it); alone
/// again, the worker's next report serves the first.
#[test]
fn a_declined_report_serves_no_waiter_here_and_the_next_report_does() {
    run_model_with("waiting/a_declined_report_serves_no_waiter_here_and_the_next_report_does", 3, || {
        let (monitor, router) = busy_pool(4);
        let mut first = Waiter::new(&router);
        assert_eq!(first.poll(), Poll::Pending);
        // The point worker 1's seq 2 picks lies past this line's [0, 2) of
        // about 2^32 (fixed: were it not, the first assertions below
        // would fail every run, not some).
        assert!(monitor.share_reports(MODEL, 0, u64::from(u32::MAX)));
        let freer = spawn_freer(&monitor);
        let mut second = Waiter::new(&router);
        let joined = second.poll();
        freer.join().unwrap();
        assert_eq!(joined, Poll::Pending, "the declined report's worker went to a joiner");
        assert!(!first.woken(), "the declined report woke a waiter here");
        assert!(monitor.share_reports(MODEL, 0, 0));
        monitor.apply(&report(3, 10)).unwrap();
        assert!(first.woken(), "the next report, this line's, wakes the first");
        assert_eq!(first.poll(), Poll::Ready(Ok(1)));
        assert_eq!(second.poll(), Poll::Pending, "one report, one dispatch");
    });
}

/// The first in line may not go to the only worker (its request failed
/// there); the worker frees while that waiter is polled: in every
/// interleaving the worker goes to the second waiter, never left idle
/// behind the first, and the first still waits.
#[test]
fn a_waiter_excluding_the_freed_worker_passes_it_on() {
    run_model_with("waiting/a_waiter_excluding_the_freed_worker_passes_it_on", 3, || {
        let (monitor, router) = busy_pool(4);
        let mut first = Waiter::excluding(&router, Class::Standard, &[1]);
        let mut second = Waiter::new(&router);
        assert_eq!(first.poll(), Poll::Pending);
        assert_eq!(second.poll(), Poll::Pending);
        let freer = spawn_freer(&monitor);
        // Its task runs whenever it is woken (maybe before the report).
        let early = first.poll();
        freer.join().unwrap();
        assert_eq!(early, Poll::Pending, "it may not take worker 1");
        if first.woken() {
            assert_eq!(first.poll(), Poll::Pending, "it may not take worker 1");
        }
        assert!(second.woken(), "worker 1 was left idle behind a waiter that excludes it");
        assert_eq!(second.poll(), Poll::Ready(Ok(1)));
        assert_eq!(waiting(&monitor), 1, "the first still waits");
    });
}

/// The model's last worker leaves (the monitor forgets the model) while a
/// request joins behind one already waiting: in every interleaving each
/// hears at once, or is woken to hear, that the model is unavailable (the
/// joiner, if it looked the model up once it was forgotten, that it is
/// unknown, as any request would); none is left asleep in the forgotten
/// line until its deadline.
#[test]
fn a_request_joining_as_the_last_worker_leaves_hears_it_is_unavailable() {
    run_model_with("waiting/a_request_joining_as_the_last_worker_leaves_hears_it_is_unavailable", 3, || {
        let (monitor, router) = busy_pool(4);
        let mut first = Waiter::new(&router);
        assert_eq!(first.poll(), Poll::Pending);
        let leaver = {
            let monitor = monitor.clone();
            thread::spawn(move || assert!(monitor.deregister(1)))
        };
        let mut joiner = Waiter::new(&router);
        let joined = joiner.poll();
        leaver.join().unwrap();
        for (name, waiter, early) in [("first", &mut first, Poll::Pending), ("joiner", &mut joiner, joined)] {
            let heard = match early {
                Poll::Pending => {
                    assert!(waiter.woken(), "the {name} sleeps in a forgotten line");
                    waiter.poll()
                }
                ready => ready,
            };
            let unknown = name == "joiner" && heard == Poll::Ready(Err(WaitError::UnknownModel));
            assert!(unknown || heard == Poll::Ready(Err(WaitError::Unavailable)), "the {name}: {heard:?}");
        }
    });
}
