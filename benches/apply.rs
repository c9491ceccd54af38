//! `WorkerMonitor::apply`: the event plane's hot path; and `register`, its
//! cold path (a worker joining and leaving a model of `n`).
//!
//! Three kinds of report, for a few worker counts, in one group per count:
//! - `unchanged`: the same values as the last report (only the sequence
//!   number moves) — stored, nothing evaluated;
//! - `no_flip`: new values that keep the worker below its threshold — stored
//!   and evaluated, no bit flips (no lock, no allocation);
//! - `flip`: alternately busy and free — every report flips the worker's bit
//!   and publishes a new busy set (the cold path: the model's lock, a new
//!   bitmap).

use std::hint::black_box;

mod common;

use common::{decode_load, free_pool, MODEL};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use loadgate::{
    monitor::{Applied, Publisher},
    LoadReport, RankLoad, WorkerId,
};

const WORKER_COUNTS: [usize; 4] = [8, 64, 1_000, 10_000];

/// Benchmarks applying reports to the middle worker, the load of the `seq`-th
/// report given by `load`; checks every report had the `expected` outcome.
fn bench_reports(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    n: usize,
    load: impl Fn(u64) -> RankLoad,
    expected: Applied,
) {
    let monitor = free_pool(n);
    let worker = (n / 2) as WorkerId;
    let mut seq = 1u64;
    group.bench_with_input(BenchmarkId::new(name, n), &n, |b, _| {
        b.iter(|| {
            seq += 1;
            let report =
                LoadReport { worker, incarnation: 0, rank: 0, publisher: Publisher::Worker, seq, load: load(seq) };
            let applied = black_box(&monitor).apply(black_box(&report));
            debug_assert_eq!(applied, Ok(expected));
            applied
        })
    });
    // The outcome the numbers claim, checked once outside the timing.
    seq += 1;
    let report = LoadReport { worker, incarnation: 0, rank: 0, publisher: Publisher::Worker, seq, load: load(seq) };
    assert_eq!(monitor.apply(&report), Ok(expected), "{name}");
}

fn apply(c: &mut Criterion) {
    for n in WORKER_COUNTS {
        let mut group = c.benchmark_group(format!("apply/{n}_workers"));
        group.throughput(Throughput::Elements(1));
        bench_reports(&mut group, "unchanged", n, |_| decode_load(10), Applied::Stored);
        bench_reports(&mut group, "no_flip", n, |seq| decode_load(10 + (seq % 2) as u32 * 10), Applied::Stored);
        bench_reports(&mut group, "flip", n, |seq| decode_load(if seq % 2 == 0 { 90 } else { 10 }), Applied::Flipped);
        group.finish();
    }
}

/// A worker joining and leaving a model of `n` (the cold path of a mass
/// reconnect): its registration and its departure, each one publication.
fn registration(c: &mut Criterion) {
    let mut group = c.benchmark_group("register");
    for n in WORKER_COUNTS {
        let monitor = free_pool(n);
        // A new id, after the others (the pool's ids are 0..n).
        let id = 1 << 40;
        group.bench_with_input(BenchmarkId::new("join_and_leave", n), &n, |b, _| {
            b.iter(|| {
                let joined = black_box(&monitor).register(id, MODEL, 1, 0);
                debug_assert!(joined.is_ok());
                black_box(&monitor).deregister(id)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, apply, registration);
criterion_main!(benches);
