//! The line's free set in a large fleet (`spent`'s module docs) against the
//! line without it: the same random scenario, on a fleet of 40 workers,
//! gives the same wake-ups, the same dispatches and the same line, whether
//! the line keeps the set from 2 marks, from 16 or never.

use super::*;
use crate::waiting::spent::{LARGE_ENTERED, LARGE_FROM};
use crate::Class;

const WORKERS: WorkerId = 40;

/// One waiter: its future, its wake-ups, and those already polled for.
struct Waiter<'r> {
    wait: Waiting<'r>,
    wakes: Arc<Count>,
    seen: usize,
}

/// Runs `steps` random steps from `seed` on a line that keeps its free set
/// from `large_from` marks; what happened, step by step.
fn run(seed: u64, large_from: usize, policy: Policy, steps: usize) -> Vec<String> {
    LARGE_FROM.with(|from| from.set(large_from));
    let pool = Pool::with_policy(WORKERS, LineLimits::default(), policy);
    (1..=WORKERS).for_each(|w| pool.report(w, true));
    let mut rng = fastrand::Rng::with_seed(seed);
    let timer = Timer::default();
    let mut waiters: Vec<Waiter> = Vec::new();
    let mut members: Vec<WorkerId> = (1..=WORKERS).collect();
    let mut next_id = WORKERS + 1;
    let mut trace = Vec::new();
    for step in 0..steps {
        match rng.u32(..100) {
            0..45 => {
                let exclude: Vec<WorkerId> = match rng.u32(..8) {
                    0 => vec![members[rng.usize(..members.len())]],
                    _ => vec![],
                };
                let class = [Class::Critical, Class::Standard, Class::Sheddable][rng.usize(..3)];
                let ticket = Ticket::new(rng.u64(..100), Instant::now() + Duration::from_secs(60)).with_class(class);
                let mut wait = Box::pin(pool.router.wait("m", &exclude, ticket, timer.clone()));
                let wakes = Arc::new(Count::default());
                match poll(&mut wait, &wakes) {
                    Poll::Ready(routed) => trace.push(format!("{step}: joined, routed {routed:?}")),
                    Poll::Pending => waiters.push(Waiter { wait, wakes, seen: 0 }),
                }
            }
            45..75 => {
                let worker = members[rng.usize(..members.len())];
                let busy = rng.u32(..10) < 3;
                pool.report(worker, busy);
                trace.push(format!("{step}: {worker} reported busy {busy}"));
            }
            75..93 => {
                let mut i = 0;
                while i < waiters.len() {
                    let waiter = &mut waiters[i];
                    let wakes = waiter.wakes.0.load(Ordering::SeqCst);
                    if wakes > waiter.seen {
                        waiter.seen = wakes;
                        if let Poll::Ready(routed) = poll(&mut waiter.wait, &waiter.wakes) {
                            trace.push(format!("{step}: waiter {i} routed {routed:?}"));
                            waiters.remove(i);
                            continue;
                        }
                    }
                    i += 1;
                }
            }
            93..97 if !waiters.is_empty() => {
                let i = rng.usize(..waiters.len());
                drop(waiters.remove(i));
                trace.push(format!("{step}: waiter {i} dropped"));
            }
            97..99 => {
                // A member joins free (a new list: the set is rebuilt).
                pool.monitor.register(next_id, "m", 1, 0).unwrap();
                pool.report(next_id, false);
                members.push(next_id);
                next_id += 1;
            }
            _ if members.len() > 2 => {
                let worker = members.swap_remove(rng.usize(..members.len()));
                pool.monitor.deregister(worker);
                trace.push(format!("{step}: {worker} left"));
            }
            _ => {}
        }
        let wakes: Vec<usize> = waiters.iter().map(|w| w.wakes.0.load(Ordering::SeqCst)).collect();
        trace.push(format!("{step}: waiting {} wakes {wakes:?}", pool.waiting()));
    }
    LARGE_FROM.with(|from| from.set(usize::MAX));
    trace
}

fn same_with_and_without_the_set(policy: impl Fn() -> Policy) {
    for seed in 0..6 {
        let entered = LARGE_ENTERED.with(std::cell::Cell::get);
        let plain = run(seed, usize::MAX, policy(), 1500);
        assert_eq!(LARGE_ENTERED.with(std::cell::Cell::get), entered, "never kept");
        for large_from in [2, 16] {
            let large = run(seed, large_from, policy(), 1500);
            if let Some(step) = plain.iter().zip(&large).position(|(a, b)| a != b) {
                panic!("seed {seed}, from {large_from}: {:?} against {:?}", plain[step], large[step]);
            }
            assert_eq!(plain.len(), large.len());
        }
        assert!(LARGE_ENTERED.with(std::cell::Cell::get) > entered + 1, "seed {seed}: the set was kept");
    }
}

#[test]
fn the_free_set_routes_round_robin_as_the_plain_line() {
    same_with_and_without_the_set(|| Policy::RoundRobin);
}

#[test]
fn the_free_set_routes_least_loaded_as_the_plain_line() {
    same_with_and_without_the_set(|| Policy::LeastLoaded);
}

#[test]
fn the_free_set_routes_by_cost_as_the_plain_line() {
    same_with_and_without_the_set(|| {
        Policy::Cost(Arc::new(|worker: WorkerId, _: &crate::monitor::WorkerLoad| worker % 7))
    });
}
