//! The waiting line with a real monitor and router, polled by hand.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use crate::monitor::Applied;
use crate::{
    BusyThresholds, LineLimits, LoadReport, MonitorConfig, Policy, RankLoad, Ticket, WaitError, WorkerMonitor,
};
use crate::{WorkerId, WorkerRouter};

/// A timer the test fires.
#[derive(Clone, Default)]
struct Timer(Arc<AtomicBool>);

impl Future for Timer {
    type Output = ();
    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        if self.0.load(Ordering::SeqCst) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

/// Counts its wake-ups.
#[derive(Default)]
struct Count(AtomicUsize);

impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

mod large;

struct Pool {
    monitor: Arc<WorkerMonitor>,
    router: WorkerRouter,
    seq: std::sync::atomic::AtomicU64,
}

impl Pool {
    fn new(workers: WorkerId, limits: LineLimits) -> Pool {
        Pool::with_policy(workers, limits, Policy::RoundRobin)
    }

    fn with_policy(workers: WorkerId, limits: LineLimits, policy: Policy) -> Pool {
        let config = MonitorConfig {
            default_thresholds: BusyThresholds { active_decode_blocks_threshold: Some(0.5), ..Default::default() },
            line: limits,
            ..Default::default()
        };
        let monitor = Arc::new(WorkerMonitor::new(config).unwrap());
        for w in 1..=workers {
            monitor.register(w, "m", 1, 0).unwrap();
        }
        let router = WorkerRouter::new(monitor.clone(), policy);
        Pool { monitor, router, seq: Default::default() }
    }

    fn report(&self, worker: WorkerId, busy: bool) {
        self.report_of(worker, 0, if busy { 90 } else { 10 });
    }

    /// A report of `worker`'s `incarnation` with `blocks` of 100 in use.
    fn report_of(&self, worker: WorkerId, incarnation: u64, blocks: u32) {
        let seq = self.seq.fetch_add(1, Ordering::SeqCst) + 1;
        let load = RankLoad { active_decode_blocks: blocks, kv_total_blocks: 100, ..Default::default() };
        self.monitor.apply(&LoadReport { worker, incarnation, seq, load, ..Default::default() }).unwrap();
    }

    fn waiting(&self) -> usize {
        self.monitor.line_stats("m").unwrap().waiting
    }
}

type Waiting<'r> = Pin<Box<crate::Wait<'r, Timer>>>;

fn wait<'r>(pool: &'r Pool, timer: &Timer) -> Waiting<'r> {
    let ticket = Ticket::new(10, Instant::now() + Duration::from_secs(60));
    Box::pin(pool.router.wait("m", &[], ticket, timer.clone()))
}

fn poll(w: &mut Waiting<'_>, wakes: &Arc<Count>) -> Poll<Result<WorkerId, WaitError>> {
    let waker = Waker::from(wakes.clone());
    w.as_mut().poll(&mut Context::from_waker(&waker))
}

#[test]
fn routes_at_once_when_a_worker_is_free() {
    let pool = Pool::new(2, LineLimits::default());
    let mut w = wait(&pool, &Timer::default());
    assert_eq!(poll(&mut w, &Arc::default()), Poll::Ready(Ok(1)));
    assert_eq!(pool.waiting(), 0);
}

#[test]
fn a_waiter_is_woken_by_the_report_that_frees_a_worker() {
    let pool = Pool::new(1, LineLimits::default());
    pool.report(1, true);
    let wakes = Arc::new(Count::default());
    let mut w = wait(&pool, &Timer::default());
    assert_eq!(poll(&mut w, &wakes), Poll::Pending);
    assert_eq!(pool.waiting(), 1);
    pool.report(1, true);
    assert_eq!(wakes.0.load(Ordering::SeqCst), 0, "still busy: nobody woken");
    pool.report(1, false);
    assert_eq!(wakes.0.load(Ordering::SeqCst), 1);
    assert_eq!(poll(&mut w, &wakes), Poll::Ready(Ok(1)));
    assert_eq!(pool.waiting(), 0);
    assert_eq!(pool.monitor.line_stats("m").unwrap().dispatched, 1);
}

#[test]
fn a_freed_worker_takes_one_waiter_per_report() {
    let pool = Pool::new(1, LineLimits::default());
    pool.report(1, true);
    let wakes: Vec<Arc<Count>> = (0..3).map(|_| Arc::default()).collect();
    let mut waiters: Vec<Waiting> = (0..3).map(|_| wait(&pool, &Timer::default())).collect();
    for (w, c) in waiters.iter_mut().zip(&wakes) {
        assert_eq!(poll(w, c), Poll::Pending);
    }
    pool.report(1, false);
    let woken = |wakes: &[Arc<Count>]| wakes.iter().map(|c| c.0.load(Ordering::SeqCst)).collect::<Vec<_>>();
    assert_eq!(woken(&wakes), [1, 0, 0], "the first in line only");
    assert_eq!(poll(&mut waiters[0], &wakes[0]), Poll::Ready(Ok(1)));
    // Polled without a wake-up: the others still wait (the worker is spent).
    assert_eq!(poll(&mut waiters[2], &wakes[2]), Poll::Pending);
    // A newcomer joins the line behind them rather than taking the worker.
    let mut newcomer = wait(&pool, &Timer::default());
    assert_eq!(poll(&mut newcomer, &Arc::default()), Poll::Pending);
    assert_eq!(pool.waiting(), 3);
    // Its next report (still free): the next waiter.
    pool.report(1, false);
    assert_eq!(woken(&wakes), [1, 1, 0]);
    assert_eq!(poll(&mut waiters[1], &wakes[1]), Poll::Ready(Ok(1)));
    assert_eq!(pool.waiting(), 2);
}

/// A request of a class with no line goes ahead of lower-class waiters
/// only (as it would in the line), and the worker it gets takes no waiter
/// until its next report: one report, one request past a threshold.
#[test]
fn a_higher_class_without_a_line_goes_ahead_and_spends_its_worker() {
    use crate::{Class, RouteError};
    let pool = Pool::new(1, LineLimits::default());
    pool.report(1, true);
    let mut standard = wait(&pool, &Timer::default());
    assert_eq!(poll(&mut standard, &Arc::default()), Poll::Pending);
    // Frees: the standard waiter is woken, not yet polled.
    pool.report(1, false);
    let behind = |class| pool.router.route_class_behind_line("m", &[], class);
    assert_eq!(behind(Class::Standard), Err(RouteError::Overloaded), "a standard waiter is ahead");
    assert_eq!(behind(Class::Critical), Ok(1), "a critical request is ahead of standard waiters");
    assert_eq!(poll(&mut standard, &Arc::default()), Poll::Pending, "the worker took one request on this report");
    assert_eq!(behind(Class::Critical), Err(RouteError::Overloaded), "and only one");
    pool.report(1, false);
    assert_eq!(poll(&mut standard, &Arc::default()), Poll::Ready(Ok(1)));
}

#[test]
fn a_request_that_may_not_wait_gets_no_worker_ahead_of_the_waiters() {
    use crate::{Class, RouteError};
    let pool = Pool::new(1, LineLimits::default());
    let behind = || pool.router.route_class_behind_line("m", &[], Class::Sheddable);
    assert_eq!(behind(), Ok(1), "nobody waits: routed as route_class");
    pool.report(1, true);
    let (mut first, mut second) = (wait(&pool, &Timer::default()), wait(&pool, &Timer::default()));
    assert_eq!(poll(&mut first, &Arc::default()), Poll::Pending);
    assert_eq!(poll(&mut second, &Arc::default()), Poll::Pending);
    pool.report(1, false);
    assert_eq!(poll(&mut first, &Arc::default()), Poll::Ready(Ok(1)));
    // The worker is free in the view, spent for the line: the second
    // waiter's until its next report.
    assert_eq!(pool.router.route_class("m", &[], Class::Sheddable), Ok(1), "route_class overtakes");
    assert_eq!(behind(), Err(RouteError::Overloaded), "behind the line, it does not");
    pool.report(1, false);
    assert_eq!(poll(&mut second, &Arc::default()), Poll::Ready(Ok(1)));
    assert_eq!(behind(), Ok(1), "the line empty: routed again");
}

/// A scrape sent before a dispatch and answered after it does not show
/// that dispatch: applied as measured before it, it leaves the worker
/// spent; a report measured after the dispatch frees it.
#[test]
fn a_report_measured_before_a_dispatch_does_not_free_the_worker_for_another_waiter() {
    let pool = Pool::new(1, LineLimits::default());
    pool.report(1, true);
    let wakes: Vec<Arc<Count>> = (0..2).map(|_| Arc::default()).collect();
    let mut waiters: Vec<Waiting> = (0..2).map(|_| wait(&pool, &Timer::default())).collect();
    for (w, c) in waiters.iter_mut().zip(&wakes) {
        assert_eq!(poll(w, c), Poll::Pending);
    }
    pool.report(1, false);
    let before = pool.monitor.measuring(1).expect("registered");
    assert_eq!(poll(&mut waiters[0], &wakes[0]), Poll::Ready(Ok(1)));
    let free = RankLoad { active_decode_blocks: 10, kv_total_blocks: 100, ..Default::default() };
    let report = |seq| LoadReport { worker: 1, seq, load: free, ..Default::default() };
    assert_eq!(pool.monitor.apply_measured(&report(100), before), Ok(Applied::Stored));
    assert_eq!(wakes[1].0.load(Ordering::SeqCst), 0, "measured before the dispatch: still spent");
    assert_eq!(poll(&mut waiters[1], &wakes[1]), Poll::Pending);
    let after = pool.monitor.measuring(1).expect("registered");
    assert_eq!(pool.monitor.apply_measured(&report(101), after), Ok(Applied::Stored));
    assert_eq!(wakes[1].0.load(Ordering::SeqCst), 1, "measured after it: free for the next");
    assert_eq!(poll(&mut waiters[1], &wakes[1]), Poll::Ready(Ok(1)));
    assert!(pool.monitor.measuring(99).is_none(), "an unknown worker");
}

/// A measurement taken on the line of the worker's previous model (it
/// restarted under another one since) frees nothing in its new model's
/// line, however many dispatches the old line had made.
#[test]
fn a_measurement_from_the_line_of_another_model_frees_nothing() {
    let pool = Pool::new(1, LineLimits::default());
    pool.report(1, true);
    let mut old: Vec<Waiting> = (0..3).map(|_| wait(&pool, &Timer::default())).collect();
    for w in &mut old {
        assert_eq!(poll(w, &Arc::default()), Poll::Pending);
    }
    for w in &mut old {
        pool.report(1, false);
        assert_eq!(poll(w, &Arc::default()), Poll::Ready(Ok(1)));
    }
    let on_m = pool.monitor.measuring(1).expect("registered");
    // A restart under model "n": a new incarnation, a new line.
    pool.monitor.register(1, "n", 1, 1).unwrap();
    let load = |blocks| RankLoad { active_decode_blocks: blocks, kv_total_blocks: 100, ..Default::default() };
    let report = |seq, blocks| LoadReport { worker: 1, incarnation: 1, seq, load: load(blocks), ..Default::default() };
    pool.monitor.apply(&report(1, 90)).unwrap();
    let ticket = || Ticket::new(10, Instant::now() + Duration::from_secs(60));
    let wakes: Vec<Arc<Count>> = (0..2).map(|_| Arc::default()).collect();
    let mut waiters: Vec<Waiting> =
        (0..2).map(|_| Box::pin(pool.router.wait("n", &[], ticket(), Timer::default()))).collect();
    for (w, c) in waiters.iter_mut().zip(&wakes) {
        assert_eq!(poll(w, c), Poll::Pending);
    }
    pool.monitor.apply(&report(2, 10)).unwrap();
    assert_eq!(poll(&mut waiters[0], &wakes[0]), Poll::Ready(Ok(1)), "dispatch #0 of line n");
    // Line m had made 3 dispatches: as a count on line n it would pass #0.
    assert_eq!(pool.monitor.apply_measured(&report(3, 10), on_m), Ok(Applied::Stored));
    assert_eq!(wakes[1].0.load(Ordering::SeqCst), 0, "a measurement of line m frees nothing in n");
    let on_n = pool.monitor.measuring(1).expect("registered");
    assert_eq!(pool.monitor.apply_measured(&report(4, 10), on_n), Ok(Applied::Stored));
    assert_eq!(poll(&mut waiters[1], &wakes[1]), Poll::Ready(Ok(1)));
}

#[test]
fn the_deadline_and_a_drop_leave_the_line_and_pass_the_wake_up_on() {
    let pool = Pool::new(1, LineLimits::default());
    pool.report(1, true);
    let timer = Timer::default();
    let (first, second) = (Arc::new(Count::default()), Arc::new(Count::default()));
    let mut a = wait(&pool, &timer);
    let mut b = wait(&pool, &Timer::default());
    assert_eq!(poll(&mut a, &first), Poll::Pending);
    assert_eq!(poll(&mut b, &second), Poll::Pending);
    pool.report(1, false);
    assert_eq!(first.0.load(Ordering::SeqCst), 1);
    // Woken, but its deadline passed before it ran: the wake-up goes on.
    timer.0.store(true, Ordering::SeqCst);
    assert_eq!(poll(&mut a, &first), Poll::Ready(Err(WaitError::Deadline)));
    assert_eq!(second.0.load(Ordering::SeqCst), 1);
    assert_eq!(pool.waiting(), 1);
    drop(b);
    assert_eq!(pool.waiting(), 0);
    assert_eq!(pool.monitor.line_stats("m").unwrap().tokens, 0);
}

#[test]
fn a_full_line_refuses_at_once() {
    let pool = Pool::new(1, LineLimits { max_waiting: 1, max_tokens: u64::MAX });
    pool.report(1, true);
    let mut a = wait(&pool, &Timer::default());
    assert_eq!(poll(&mut a, &Arc::default()), Poll::Pending);
    let mut b = wait(&pool, &Timer::default());
    assert_eq!(poll(&mut b, &Arc::default()), Poll::Ready(Err(WaitError::QueueFull)));
    let unknown = pool.router.wait("nope", &[], Ticket::new(0, Instant::now()), Timer::default());
    assert_eq!(poll(&mut Box::pin(unknown), &Arc::default()), Poll::Ready(Err(WaitError::UnknownModel)));
}

/// A critical arrival whose displacement empties the line: the line forgot
/// its spent worker with its last waiter, so that worker is free for the
/// arrival, which routes in its first poll (found by the `waiting_line`
/// fuzz target: the arrival used to skip its pass, as if a waiter ahead of
/// it were still asleep).
#[test]
fn a_displacement_that_empties_the_line_frees_its_spent_workers() {
    use crate::Class;
    let pool = Pool::new(1, LineLimits { max_waiting: 4, max_tokens: 100 });
    pool.report(1, true);
    let deadline = Instant::now() + Duration::from_secs(60);
    let ticket = |tokens, class| Ticket::new(tokens, deadline).with_class(class);
    let timer = Timer::default();
    let mut sheddable = Box::pin(pool.router.wait("m", &[], ticket(40, Class::Sheddable), timer.clone()));
    let mut first = Box::pin(pool.router.wait("m", &[], ticket(50, Class::Critical), timer.clone()));
    let (shed_wakes, first_wakes) = (Arc::new(Count::default()), Arc::new(Count::default()));
    assert_eq!(poll(&mut sheddable, &shed_wakes), Poll::Pending);
    assert_eq!(poll(&mut first, &first_wakes), Poll::Pending);
    pool.report(1, false);
    assert_eq!(poll(&mut first, &first_wakes), Poll::Ready(Ok(1)), "the critical one first");
    assert_eq!(shed_wakes.0.load(Ordering::SeqCst), 0, "worker 1 is spent: the sheddable one sleeps");
    // 40 + 100 tokens do not fit in 100: the sheddable waiter goes, and
    // with it the line's last waiter and its spent mark.
    let mut second = Box::pin(pool.router.wait("m", &[], ticket(100, Class::Critical), timer.clone()));
    assert_eq!(poll(&mut second, &Arc::default()), Poll::Ready(Ok(1)));
    assert_eq!(poll(&mut sheddable, &shed_wakes), Poll::Ready(Err(WaitError::ClassShed)));
    assert_eq!(pool.waiting(), 0);
}

/// While other frontends' lines hold waiters, a report is this line's only
/// if the point its worker and seq pick falls in this line's part: with
/// many more elsewhere it gives its worker to none here (the worker waits
/// for its next report); alone again, the next report does.
#[test]
fn a_line_takes_a_report_only_in_its_part() {
    let pool = Pool::new(1, LineLimits::default());
    pool.report(1, true);
    let wakes = Arc::new(Count::default());
    let mut w = wait(&pool, &Timer::default());
    assert_eq!(poll(&mut w, &wakes), Poll::Pending);
    assert!(!pool.monitor.share_reports("other", 0, 1), "not a model of this fleet");
    // This line's part: [0, 1) of about 4.3 billion.
    assert!(pool.monitor.share_reports("m", 0, u64::from(u32::MAX)));
    pool.report(1, false);
    pool.report(1, false);
    assert_eq!(wakes.0.load(Ordering::SeqCst), 0, "the reports went to the other lines");
    assert_eq!(poll(&mut w, &wakes), Poll::Pending);
    pool.monitor.share_reports("m", 0, 0);
    pool.report(1, false);
    assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "alone again: the next report is this line's");
    assert_eq!(poll(&mut w, &wakes), Poll::Ready(Ok(1)));
}

/// The share is the model's: waiters elsewhere for another model leave
/// this model's reports to this line.
#[test]
fn waiters_elsewhere_for_another_model_leave_the_reports_here() {
    let pool = Pool::new(1, LineLimits::default());
    pool.monitor.register(2, "n", 1, 0).unwrap();
    assert!(pool.monitor.share_reports("n", 0, u64::from(u32::MAX)));
    pool.report(1, true);
    let wakes = Arc::new(Count::default());
    let mut w = wait(&pool, &Timer::default());
    assert_eq!(poll(&mut w, &wakes), Poll::Pending);
    pool.report(1, false);
    assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "model m's report is this line's");
    assert_eq!(poll(&mut w, &wakes), Poll::Ready(Ok(1)));
}

/// Three frontends' lines (three monitors) with two waiters each, told the
/// same figures from each other's beats, get the same 300 reports: each
/// report gives the worker a waiter in exactly one line, and every line
/// takes a share (86, 95 and 119 of the 300: a report's point is a fixed
/// function of its worker and seq, so this test gives the same figures
/// every run).
#[test]
fn three_lines_that_agree_take_each_report_once_between_them() {
    let pools: Vec<Pool> = (0..3).map(|_| Pool::new(1, LineLimits::default())).collect();
    let wakes: Vec<Arc<Count>> = (0..3).map(|_| Arc::default()).collect();
    let mut lines: Vec<std::collections::VecDeque<Waiting>> = Vec::new();
    for (i, pool) in pools.iter().enumerate() {
        pool.report(1, true);
        let mut line: std::collections::VecDeque<Waiting> = (0..2).map(|_| wait(pool, &Timer::default())).collect();
        for w in &mut line {
            assert_eq!(poll(w, &wakes[i]), Poll::Pending);
        }
        lines.push(line);
        pool.monitor.share_reports("m", 2 * i as u64, 4);
    }
    let mut per_line = [0; 3];
    for report in 0..300 {
        pools.iter().for_each(|pool| pool.report(1, false));
        let mut taken = 0;
        for (i, pool) in pools.iter().enumerate() {
            if wakes[i].0.swap(0, Ordering::SeqCst) != 0 {
                let mut first = lines[i].pop_front().expect("two wait");
                assert_eq!(poll(&mut first, &wakes[i]), Poll::Ready(Ok(1)));
                // A served waiter is replaced: the line never empties (an
                // empty line forgets its marks) and keeps its part.
                let mut next = wait(pool, &Timer::default());
                assert_eq!(poll(&mut next, &wakes[i]), Poll::Pending, "behind a waiter");
                lines[i].push_back(next);
                taken += 1;
                per_line[i] += 1;
            }
        }
        assert_eq!(taken, 1, "report {report}: one line takes it");
    }
    assert!(per_line.iter().all(|n| *n >= 50), "{per_line:?}");
}

/// A waiter that may not go to the worker that frees (its request failed
/// there before) is first in line: the worker goes to the next waiter, not
/// left idle until the first one's deadline.
#[test]
fn a_waiter_excluding_the_free_worker_does_not_hold_up_the_next() {
    let pool = Pool::new(2, LineLimits::default());
    pool.report(1, true);
    pool.report(2, true);
    let ticket = || Ticket::new(10, Instant::now() + Duration::from_secs(60));
    let (first, second) = (Arc::new(Count::default()), Arc::new(Count::default()));
    let mut excluding: Waiting<'_> = Box::pin(pool.router.wait("m", &[1], ticket(), Timer::default()));
    let mut next = wait(&pool, &Timer::default());
    assert_eq!(poll(&mut excluding, &first), Poll::Pending);
    assert_eq!(poll(&mut next, &second), Poll::Pending);
    pool.report(1, false);
    assert_eq!(first.0.load(Ordering::SeqCst), 1, "the first in line is woken");
    assert_eq!(poll(&mut excluding, &first), Poll::Pending, "it may not take worker 1");
    assert_eq!(second.0.load(Ordering::SeqCst), 1, "worker 1 goes on to the next waiter");
    assert_eq!(poll(&mut next, &second), Poll::Ready(Ok(1)));
    // Worker 2 frees: the first, held until this report, takes it.
    pool.report(2, false);
    assert_eq!(poll(&mut excluding, &first), Poll::Ready(Ok(2)));
    assert_eq!(pool.waiting(), 0);
}

/// Serves `rounds` requests of tenant 1 while a request of tenant 2 that
/// excludes worker 1, the only one that frees, is woken and held at every
/// report; then both tenant 2 and tenant 3 (equal weights and prompts) line
/// up 6 requests each. The tenants of the next 6 dispatches.
fn served_after_held_rounds(rounds: u64) -> Vec<u32> {
    use crate::Tenant;
    let pool = Pool::new(2, LineLimits::default());
    pool.report(1, true);
    pool.report(2, true);
    let deadline = |s: u64| Instant::now() + Duration::from_secs(60 + s);
    let ticket = |tenant, s| Ticket::new(100, deadline(s)).with_tenant(Tenant::new(tenant, 100));
    let wakes = Arc::new(Count::default());
    let mut held: Waiting<'_> = Box::pin(pool.router.wait("m", &[1], ticket(2, 0), Timer::default()));
    assert_eq!(poll(&mut held, &wakes), Poll::Pending);
    for i in 0..rounds {
        let mut next: Waiting<'_> = Box::pin(pool.router.wait("m", &[], ticket(1, 1 + i), Timer::default()));
        assert_eq!(poll(&mut next, &Arc::default()), Poll::Pending, "round {i}: behind the held one");
        pool.report(1, false);
        assert_eq!(poll(&mut held, &wakes), Poll::Pending, "round {i}: held");
        assert_eq!(poll(&mut next, &Arc::default()), Poll::Ready(Ok(1)), "round {i}");
    }
    let mut line: Vec<(u32, Waiting<'_>)> = Vec::new();
    for i in 0..6 {
        line.push((3, Box::pin(pool.router.wait("m", &[], ticket(3, 100 + 2 * i), Timer::default()))));
        line.push((2, Box::pin(pool.router.wait("m", &[], ticket(2, 101 + 2 * i), Timer::default()))));
    }
    for (_, w) in &mut line {
        assert_eq!(poll(w, &Arc::default()), Poll::Pending);
    }
    (0..6)
        .map(|_| {
            pool.report(1, false);
            let _ = poll(&mut held, &wakes);
            let served = line.iter_mut().position(|(_, w)| poll(w, &Arc::default()) == Poll::Ready(Ok(1)));
            line.remove(served.expect("one served per report")).0
        })
        .collect()
}

/// A tenant whose request is woken and held round after round (it
/// excludes the only worker that frees) banks nothing by it: afterwards
/// it shares dispatches with a tenant of equal weight as it would after a
/// single round, however many rounds there were.
#[test]
fn a_tenant_held_round_after_round_does_not_starve_an_equal_one() {
    let of_3 = |served: &[u32]| served.iter().filter(|&&t| t == 3).count();
    let once = served_after_held_rounds(1);
    let many = served_after_held_rounds(40);
    assert!(of_3(&once) >= 2, "after one round: {once:?}");
    assert_eq!(of_3(&many), of_3(&once), "after 40 rounds {many:?}, after one {once:?}");
}

/// The model's last worker leaves while a request waits (a restart): the
/// monitor forgets the model, and the publication that emptied it wakes the
/// waiter. Back with a new incarnation, the model has a new line: the
/// waiter moves into it, in its place by deadline (ahead of a newcomer that
/// joined first with a later deadline), and the report that frees the
/// worker serves it.
#[test]
fn a_model_forgotten_and_back_takes_its_waiters_into_its_new_line() {
    let pool = Pool::new(1, LineLimits::default());
    pool.report(1, true);
    let wakes = Arc::new(Count::default());
    let mut waiter = wait(&pool, &Timer::default());
    assert_eq!(poll(&mut waiter, &wakes), Poll::Pending);
    assert!(pool.monitor.deregister(1));
    assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "the model left without an instance wakes its waiters");
    pool.monitor.register(1, "m", 1, 1).unwrap();
    pool.report_of(1, 1, 90);
    let later = Ticket::new(10, Instant::now() + Duration::from_secs(120));
    let newcomer_wakes = Arc::new(Count::default());
    let mut newcomer: Waiting<'_> = Box::pin(pool.router.wait("m", &[], later, Timer::default()));
    assert_eq!(poll(&mut newcomer, &newcomer_wakes), Poll::Pending);
    assert_eq!(poll(&mut waiter, &wakes), Poll::Pending, "moved to the new line: the worker is busy");
    assert_eq!(pool.waiting(), 2, "both wait in the model's line now");
    pool.report_of(1, 1, 10);
    assert_eq!(poll(&mut waiter, &wakes), Poll::Ready(Ok(1)), "its earlier deadline goes first");
    assert_eq!(poll(&mut newcomer, &newcomer_wakes), Poll::Pending, "one waiter per report");
    drop(newcomer);
    assert_eq!(pool.waiting(), 0);
}

/// The same, with the model not back when the waiter runs: unavailable,
/// as a newcomer would hear (no instance), not a wait to its deadline.
#[test]
fn a_model_forgotten_while_requests_wait_tells_them_it_is_unavailable() {
    let pool = Pool::new(1, LineLimits::default());
    pool.report(1, true);
    let wakes = Arc::new(Count::default());
    let mut waiter = wait(&pool, &Timer::default());
    assert_eq!(poll(&mut waiter, &wakes), Poll::Pending);
    assert!(pool.monitor.deregister(1));
    assert_eq!(poll(&mut waiter, &wakes), Poll::Ready(Err(WaitError::Unavailable)));
}

/// A `ModelRouter` handle taken before its model was forgotten and came
/// back waits in the model's new line, where the freeing report wakes it.
#[test]
fn a_model_routers_wait_after_its_model_came_back_joins_the_new_line() {
    let pool = Pool::new(1, LineLimits::default());
    let handle = pool.router.model("m").unwrap();
    assert!(pool.monitor.deregister(1));
    pool.monitor.register(1, "m", 1, 1).unwrap();
    pool.report_of(1, 1, 90);
    let ticket = Ticket::new(10, Instant::now() + Duration::from_secs(60));
    let wakes = Arc::new(Count::default());
    let mut waiter: Waiting<'_> = Box::pin(handle.wait(&[], ticket, Timer::default()));
    assert_eq!(poll(&mut waiter, &wakes), Poll::Pending);
    assert_eq!(pool.waiting(), 1);
    pool.report_of(1, 1, 10);
    assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "the report that frees the worker wakes it");
    assert_eq!(poll(&mut waiter, &wakes), Poll::Ready(Ok(1)));
}

/// Every instance out of routing while requests wait, one of them held by
/// its exclusions: there is nothing to wait for. Each waiter is woken and
/// told the model is unavailable, and so is a newcomer, as when nobody
/// waited.
#[test]
fn no_instance_in_routing_is_unavailable_to_waiters_and_newcomers_alike() {
    let pool = Pool::new(2, LineLimits::default());
    pool.report(1, true);
    pool.report(2, true);
    let (wakes, held_wakes) = (Arc::new(Count::default()), Arc::new(Count::default()));
    let ticket = Ticket::new(10, Instant::now() + Duration::from_secs(30));
    let mut held: Waiting<'_> = Box::pin(pool.router.wait("m", &[2], ticket, Timer::default()));
    assert_eq!(poll(&mut held, &held_wakes), Poll::Pending);
    let mut waiter = wait(&pool, &Timer::default());
    assert_eq!(poll(&mut waiter, &wakes), Poll::Pending);
    pool.report(2, false);
    assert_eq!(held_wakes.0.load(Ordering::SeqCst), 1, "first in line");
    assert_eq!(poll(&mut held, &held_wakes), Poll::Pending, "held: it excludes the free worker");
    assert_eq!(poll(&mut waiter, &wakes), Poll::Ready(Ok(2)));
    let mut waiter = wait(&pool, &Timer::default());
    assert_eq!(poll(&mut waiter, &wakes), Poll::Pending);
    assert!(pool.monitor.set_out_of_routing(1, true));
    assert!(pool.monitor.set_out_of_routing(2, true));
    assert_eq!(held_wakes.0.load(Ordering::SeqCst), 2, "the held waiter is woken too");
    for w in [&mut waiter, &mut held] {
        assert_eq!(poll(w, &Arc::default()), Poll::Ready(Err(WaitError::Unavailable)));
    }
    let mut newcomer = wait(&pool, &Timer::default());
    assert_eq!(poll(&mut newcomer, &Arc::default()), Poll::Ready(Err(WaitError::Unavailable)));
    assert_eq!(pool.waiting(), 0);
}

/// A `ModelRouter` handle's `wait` answers as its router's `wait` does:
/// once the model is forgotten (and not back), a wait that never joined a
/// line hears the model is unknown, as `route` and `WorkerRouter::wait` do.
#[test]
fn a_model_routers_wait_for_a_forgotten_model_answers_as_its_router_does() {
    use crate::RouteError;
    let pool = Pool::new(1, LineLimits::default());
    let handle = pool.router.model("m").unwrap();
    assert!(pool.monitor.deregister(1));
    assert_eq!(handle.route(&[]), Err(RouteError::UnknownModel));
    let ticket = Ticket::new(10, Instant::now() + Duration::from_secs(60));
    let mut by_name: Waiting<'_> = Box::pin(pool.router.wait("m", &[], ticket, Timer::default()));
    assert_eq!(poll(&mut by_name, &Arc::default()), Poll::Ready(Err(WaitError::UnknownModel)));
    let mut by_handle: Waiting<'_> = Box::pin(handle.wait(&[], ticket, Timer::default()));
    assert_eq!(poll(&mut by_handle, &Arc::default()), Poll::Ready(Err(WaitError::UnknownModel)));
}

/// A waiter whose timer fired is answered at its deadline, not routed,
/// whether it is woken with a worker free in its line or its model was
/// forgotten and came back meanwhile.
#[test]
fn a_waiter_past_its_deadline_is_not_routed_after_its_model_came_back() {
    for came_back in [false, true] {
        let pool = Pool::new(1, LineLimits::default());
        pool.report(1, true);
        let timer = Timer::default();
        let wakes = Arc::new(Count::default());
        let mut waiter = wait(&pool, &timer);
        assert_eq!(poll(&mut waiter, &wakes), Poll::Pending);
        if came_back {
            assert!(pool.monitor.deregister(1));
            pool.monitor.register(1, "m", 1, 1).unwrap();
        } else {
            pool.report(1, false);
        }
        timer.0.store(true, Ordering::SeqCst);
        assert_eq!(poll(&mut waiter, &wakes), Poll::Ready(Err(WaitError::Deadline)), "came back: {came_back}");
        assert_eq!(pool.waiting(), 0);
    }
}

#[test]
fn a_models_life_changes_only_when_it_is_forgotten() {
    let pool = Pool::new(1, LineLimits::default());
    let life = pool.monitor.model_life("m");
    assert!(life.is_some());
    pool.monitor.register(2, "m", 1, 0).unwrap();
    pool.monitor.deregister(2);
    assert_eq!(pool.monitor.model_life("m"), life, "a worker came and went: the same life");
    pool.monitor.deregister(1);
    assert_eq!(pool.monitor.model_life("m"), None, "forgotten");
    pool.monitor.register(1, "m", 1, 1).unwrap();
    let back = pool.monitor.model_life("m");
    assert!(back.is_some() && back != life, "back: another life");
    assert_eq!(pool.monitor.model_life("other"), None);
}

/// Found by a review: a worker the line dispatched to and that then left
/// kept its mark until the line emptied (no report clears it); a line that
/// never empties while workers come and go grew its marks, and every
/// dispatch paid for them. A publication that changes the members drops
/// the marks of workers no longer among them.
#[test]
fn a_worker_that_leaves_takes_its_spent_mark_with_it() {
    let pool = Pool::new(3, LineLimits::default());
    for w in 1..=3 {
        pool.report(w, true);
    }
    let (timer, wakes) = (Timer::default(), Arc::new(Count::default()));
    let mut waiters: Vec<Waiting<'_>> = (0..3).map(|_| wait(&pool, &timer)).collect();
    for w in &mut waiters {
        assert_eq!(poll(w, &wakes), Poll::Pending);
    }
    pool.report(2, false);
    assert_eq!(poll(&mut waiters[0], &wakes), Poll::Ready(Ok(2)));
    let spent = || {
        let state = pool.monitor.model_state("m").unwrap();
        let marks = crate::sync::lock(&state.line.queue).spent().to_vec();
        marks
    };
    assert_eq!(spent(), [2], "dispatched to from a line still in use");
    pool.monitor.deregister(2);
    assert!(spent().is_empty(), "the mark left with its worker");
    assert_eq!(pool.waiting(), 2);
    // A new life of the id is free at once.
    pool.monitor.register(2, "m", 1, 1).unwrap();
    pool.report_of(2, 1, 10);
    assert_eq!(poll(&mut waiters[1], &wakes), Poll::Ready(Ok(2)));
}

/// Found by mutation testing: nothing asked a line's marks directly, so
/// `Spent::contains` answering `false` (a declined report then overwrote
/// a dispatch's mark with `None`, which any later report clears, even one
/// measured before that dispatch: a second waiter for the same worker), or
/// `Spent::bits` xor-ing the bits (two spent workers 64 apart cancel out:
/// reporters skip the lock for both, and their marks are never cleared)
/// passed every test. Both forms: the plain list and the large index.
#[test]
fn a_lines_marks_answer_contains_and_bits_in_both_forms() {
    use super::spent::{spent_bit, Spent, LARGE_FROM};
    let before = LARGE_FROM.with(std::cell::Cell::get);
    for large_from in [usize::MAX, 3] {
        LARGE_FROM.with(|l| l.set(large_from));
        let mut spent = Spent::default();
        assert!(!spent.contains(1));
        assert_eq!(spent.bits(), 0);
        spent.mark(1, Some(0));
        spent.mark(65, None); // 1 and 65 share a bit
        assert!(spent.contains(1) && spent.contains(65) && !spent.contains(2));
        if !spent.is_large() {
            assert_eq!(spent.bits(), spent_bit(1), "65 sets 1's bit again, never clears it");
        }
        spent.mark(7, Some(1));
        spent.mark(9, Some(2));
        assert!(spent.contains(7) && spent.contains(9) && !spent.contains(8));
        assert_eq!(
            spent.bits() & (spent_bit(1) | spent_bit(7) | spent_bit(9)),
            spent_bit(1) | spent_bit(7) | spent_bit(9)
        );
        // A report measured before the dispatch to 7 (number 1) leaves it.
        assert!(!spent.clear(7, 1));
        assert!(spent.contains(7));
        assert!(spent.clear(7, 2));
        assert!(!spent.contains(7) && spent.contains(1) && spent.contains(65));
    }
    LARGE_FROM.with(|l| l.set(before));
}

/// Found by a hostile test: a worker that never reports a load of its own
/// (a frontend's `--worker URL`, known only by the router's tracking)
/// stayed spent after its first waiter, for as long as anyone waited: it
/// sat idle while the line ran out its deadlines. Its tracking is its
/// report now: the tracking of the request it was given frees it for the
/// next waiter (if still under the threshold). A worker that reports its
/// own load still takes one waiter per report of its own.
#[test]
fn a_worker_known_only_by_tracking_takes_a_waiter_per_tracking_change() {
    for reports in [false, true] {
        let config = MonitorConfig {
            default_thresholds: BusyThresholds { active_prefill_tokens_threshold: Some(50), ..Default::default() },
            ..Default::default()
        };
        let monitor = Arc::new(WorkerMonitor::new(config).unwrap());
        monitor.register(1, "m", 1, 0).unwrap();
        if reports {
            monitor.apply(&LoadReport { worker: 1, seq: 1, ..Default::default() }).unwrap();
        }
        let router = WorkerRouter::new(monitor.clone(), Policy::RoundRobin);
        monitor.track(1, 0, 0, 0, 100).unwrap(); // a request holding 100 prefill tokens: busy
        let wakes: Vec<Arc<Count>> = (0..3).map(|_| Arc::default()).collect();
        let ticket = Ticket::new(10, Instant::now() + Duration::from_secs(60));
        let mut waiters: Vec<Waiting> =
            (0..3).map(|_| Box::pin(router.wait("m", &[], ticket, Timer::default()))).collect();
        for (w, c) in waiters.iter_mut().zip(&wakes) {
            assert_eq!(poll(w, c), Poll::Pending);
        }
        monitor.track(1, 0, 0, 0, -100).unwrap(); // it ends: free
        assert_eq!(poll(&mut waiters[0], &wakes[0]), Poll::Ready(Ok(1)));
        monitor.track(1, 0, 0, 0, 10).unwrap(); // the dispatched request, tracked: 10 of 50
        let woken = wakes[1].0.load(Ordering::SeqCst);
        if reports {
            assert_eq!(woken, 0, "a reporting worker waits for its own report");
            assert_eq!(poll(&mut waiters[1], &wakes[1]), Poll::Pending);
        } else {
            assert_eq!(woken, 1, "the tracking that shows the dispatch frees the worker");
            assert_eq!(poll(&mut waiters[1], &wakes[1]), Poll::Ready(Ok(1)));
            assert_eq!(wakes[2].0.load(Ordering::SeqCst), 0, "one waiter per change");
        }
    }
}
