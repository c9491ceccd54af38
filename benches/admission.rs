//! Admit + release against `tokio::sync::Semaphore`, like for like, on 1 and
//! 2 threads sharing one gate (started together on a barrier, each doing the
//! same number of calls; the time is until the last one finishes, so a
//! reported time is the wall time of one call on every thread at once):
//!
//! - borrowed permits: `Admission::try_admit_scoped` against
//!   `Semaphore::try_acquire`, each permit dropped at once;
//! - owned permits (which hold a reference to their gate, to move into a
//!   task): `Admission::try_admit` against `Semaphore::try_acquire_owned`.
//!
//! Both have more slots than threads, so every attempt takes the fast path
//! (loadgate: nothing queued, a slot free); the numbers compare the cost of
//! the accounting itself.

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use loadgate::{Admission, Admitted, Rejected};
use tokio::sync::Semaphore;

const SLOTS: usize = 64;
const QUEUE: usize = 16;

fn admission() -> Arc<Admission<u64>> {
    Admission::with_dispatch(SLOTS, QUEUE, Box::new(|_item, permit| Err(permit))).expect("valid limits")
}

/// Keeps a direct admission's item and permit alive, then drops the permit.
#[inline]
fn run_now<P>(admitted: Result<Admitted<u64, P>, Rejected<u64>>) {
    match admitted {
        Ok(Admitted::Now(item, permit)) => {
            black_box(item);
            drop(black_box(permit));
        }
        _ => unreachable!("a slot is always free"),
    }
}

#[inline]
fn admit_release(admission: &Arc<Admission<u64>>, item: u64) {
    run_now(admission.try_admit(item));
}

#[inline]
fn admit_release_scoped(admission: &Arc<Admission<u64>>, item: u64) {
    run_now(admission.try_admit_scoped(item));
}

#[inline]
fn acquire_release(semaphore: &Semaphore) {
    let permit = semaphore.try_acquire().expect("a permit is always free");
    drop(black_box(permit));
}

#[inline]
fn acquire_release_owned(semaphore: &Arc<Semaphore>) {
    let permit = semaphore.clone().try_acquire_owned().expect("a permit is always free");
    drop(black_box(permit));
}

/// Times `threads` threads, started together on a barrier, each making
/// `iters` calls of `op`: from the barrier until the last one finishes.
fn timed(iters: u64, threads: usize, op: &(dyn Fn(u64) + Sync)) -> Duration {
    let barrier = Barrier::new(threads);
    thread::scope(|s| {
        let others: Vec<_> = (1..threads)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    (0..iters).for_each(op);
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        (0..iters).for_each(op);
        others.into_iter().for_each(|t| t.join().expect("benchmark thread"));
        start.elapsed()
    })
}

fn admit_release_bench(c: &mut Criterion) {
    for threads in [1usize, 2] {
        let mut group =
            c.benchmark_group(format!("admit_release/{threads}_thread{}", if threads == 1 { "" } else { "s" }));
        group.throughput(Throughput::Elements(1));

        let gate = admission();
        group.bench_function("loadgate_scoped", |b| {
            b.iter_custom(|iters| timed(iters, threads, &|i| admit_release_scoped(black_box(&gate), i)))
        });
        group.bench_function("loadgate_owned", |b| {
            b.iter_custom(|iters| timed(iters, threads, &|i| admit_release(black_box(&gate), i)))
        });
        assert_eq!((gate.running(), gate.queued(), gate.rejected()), (0, 0, 0));

        let semaphore = Arc::new(Semaphore::new(SLOTS));
        group.bench_function("tokio_borrowed", |b| {
            b.iter_custom(|iters| timed(iters, threads, &|_| acquire_release(black_box(&semaphore))))
        });
        group.bench_function("tokio_owned", |b| {
            b.iter_custom(|iters| timed(iters, threads, &|_| acquire_release_owned(black_box(&semaphore))))
        });
        assert_eq!(semaphore.available_permits(), SLOTS);
        group.finish();
    }
}

criterion_group!(benches, admit_release_bench);
criterion_main!(benches);
