//! Recording into one histogram: `StripedHistogram::observe` against
//! prometheus-client's `Histogram::observe` (a write lock per observation),
//! on 1 and 2 threads recording into the same series (started together on a
//! barrier, each doing the same number of calls; the time is until the last
//! one finishes, so a reported time is the wall time of one call on every
//! thread at once).
//!
//! Both have Dynamo's inter-token-latency buckets (the server's
//! `ITL_BUCKETS`, 13 bounds from 0 to 2 s) and record the same values, 1 ms
//! to 200 ms spread evenly in log scale, as streamed chunks' gaps would be.

use std::hint::black_box;
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use loadgate::metrics::StripedHistogram;
use prometheus_client::metrics::histogram::Histogram;

/// Dynamo's inter-token-latency bounds (`DYN_METRICS_ITL_*` defaults).
const ITL_BUCKETS: [f64; 13] = [0.0, 0.0019, 0.0035, 0.0067, 0.013, 0.024, 0.045, 0.084, 0.16, 0.3, 0.56, 1.1, 2.0];

/// 64 gaps from 1 ms to 200 ms, evenly in log scale.
fn gaps() -> [f64; 64] {
    std::array::from_fn(|i| (0.001_f64.ln() + (0.2_f64.ln() - 0.001_f64.ln()) * i as f64 / 63.0).exp())
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

fn observe_bench(c: &mut Criterion) {
    let gaps = gaps();
    let gap = |i: u64| black_box(gaps[i as usize % gaps.len()]);
    for threads in [1usize, 2] {
        let mut group = c.benchmark_group(format!("observe/{threads}_thread{}", if threads == 1 { "" } else { "s" }));
        group.throughput(Throughput::Elements(1));

        let theirs = Histogram::new(ITL_BUCKETS);
        group.bench_function("prometheus_client", |b| {
            b.iter_custom(|iters| timed(iters, threads, &|i| black_box(&theirs).observe(gap(i))))
        });
        let ours = StripedHistogram::new(ITL_BUCKETS);
        group.bench_function("striped", |b| {
            b.iter_custom(|iters| timed(iters, threads, &|i| black_box(&ours).observe(gap(i))))
        });
        group.finish();
    }
}

criterion_group!(benches, observe_bench);
criterion_main!(benches);
