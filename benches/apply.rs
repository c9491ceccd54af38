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

use common::{bench_reports, decode_load, free_pool, MODEL};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use loadgate::monitor::{Applied, Publisher};

const WORKER_COUNTS: [usize; 4] = [8, 64, 1_000, 10_000];

fn apply(c: &mut Criterion) {
    for n in WORKER_COUNTS {
        let mut group = c.benchmark_group(format!("apply/{n}_workers"));
        group.throughput(Throughput::Elements(1));
        // A fresh pool for each kind: each numbers its reports from 2.
        let unchanged = |_| decode_load(10);
        bench_reports(&mut group, "unchanged", (&free_pool(n), n), Publisher::Worker, unchanged, Applied::Stored);
        let no_flip = |seq| decode_load(10 + (seq % 2) as u32 * 10);
        bench_reports(&mut group, "no_flip", (&free_pool(n), n), Publisher::Worker, no_flip, Applied::Stored);
        let flip = |seq| decode_load(if seq % 2 == 0 { 90 } else { 10 });
        bench_reports(&mut group, "flip", (&free_pool(n), n), Publisher::Worker, flip, Applied::Flipped);
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
