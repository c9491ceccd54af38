//! `WorkerMonitor::apply`: the event plane's hot path.
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
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use loadgate::{Applied, BusyThresholds, LoadReport, MonitorConfig, Publisher, RankLoad, WorkerId, WorkerMonitor};

const MODEL: &str = "llama";
const WORKER_COUNTS: [usize; 3] = [8, 64, 1024];

fn decode_load(active: u32) -> RankLoad {
    RankLoad { active_decode_blocks: active, kv_total_blocks: 100, ..Default::default() }
}

/// A monitor with `n` single-rank workers, a 0.5 decode threshold, and every
/// worker reported free.
fn fixture(n: usize) -> Arc<WorkerMonitor> {
    let config = MonitorConfig {
        default_thresholds: BusyThresholds { active_decode_blocks_threshold: Some(0.5), ..Default::default() },
        ..Default::default()
    };
    let monitor = Arc::new(WorkerMonitor::new(config).expect("valid thresholds"));
    for id in 0..n as WorkerId {
        monitor.register(id, MODEL, 1).expect("register");
        let report = LoadReport { worker: id, rank: 0, publisher: Publisher::Worker, seq: 1, load: decode_load(10) };
        monitor.apply(&report).expect("apply");
    }
    monitor
}

/// Benchmarks applying reports to the middle worker, the load of the `seq`-th
/// report given by `load`; checks every report had the `expected` outcome.
fn bench_reports(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    n: usize,
    load: impl Fn(u64) -> RankLoad,
    expected: Applied,
) {
    let monitor = fixture(n);
    let worker = (n / 2) as WorkerId;
    let mut seq = 1u64;
    group.bench_with_input(BenchmarkId::new(name, n), &n, |b, _| {
        b.iter(|| {
            seq += 1;
            let report = LoadReport { worker, rank: 0, publisher: Publisher::Worker, seq, load: load(seq) };
            let applied = black_box(&monitor).apply(black_box(&report));
            debug_assert_eq!(applied, Ok(expected));
            applied
        })
    });
    // The outcome the numbers claim, checked once outside the timing.
    seq += 1;
    let report = LoadReport { worker, rank: 0, publisher: Publisher::Worker, seq, load: load(seq) };
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

criterion_group!(benches, apply);
criterion_main!(benches);
