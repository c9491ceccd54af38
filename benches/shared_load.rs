//! What frontends that count together (issue 26) cost per event, at 64 and
//! at 10,000 workers: every worker rank holds the load of 16 other
//! frontends (`--max-frontends`' default), and the lease is on.
//!
//! - `frontend_report`: another frontend's publication of its load on the
//!   middle worker, `no_flip` (the sum stays below the threshold) and
//!   `flip` (alternately past it and back: a new busy set each time);
//! - `worker_report`: the worker's own report (`no_flip`), whose
//!   evaluation reads the 16 frontends' slots and the lease;
//! - `renew`: a frontend's beat renewing everything it published, on every
//!   worker (O(1): one clock word, not a walk of the fleet).
//!
//! A constant cost shows as a 10,000 ÷ 64 ratio near 1 in each row.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

mod common;

use common::{decode_load, MODEL};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use loadgate::monitor::{Applied, Publisher, SharedLoad};
use loadgate::{BusyThresholds, LoadReport, MonitorConfig, WorkerId, WorkerMonitor};

const WORKER_COUNTS: [usize; 2] = [64, 10_000];
const FRONTENDS: u16 = 16;

/// `n` single-rank workers of [`MODEL`] (busy past 50 of 100 blocks), each
/// reporting 10 blocks itself and 2 from each of the 16 frontends (32 in
/// all: free). Publications count for an hour: the bench outlasts any
/// real staleness.
fn shared_pool(n: usize) -> Arc<WorkerMonitor> {
    let config = MonitorConfig {
        default_thresholds: BusyThresholds { active_decode_blocks_threshold: Some(0.5), ..Default::default() },
        shared: SharedLoad { frontends: FRONTENDS, staleness: Duration::from_secs(3600), lease: true },
        ..Default::default()
    };
    let monitor = Arc::new(WorkerMonitor::new(config).expect("valid thresholds"));
    monitor.set_other_frontends(u32::from(FRONTENDS));
    for id in 0..n as WorkerId {
        monitor.register(id, MODEL, 1, 0).expect("register");
        let report = |publisher, active| LoadReport {
            worker: id,
            incarnation: 0,
            rank: 0,
            publisher,
            seq: 1,
            load: decode_load(active),
        };
        monitor.apply(&report(Publisher::Worker, 10)).expect("apply");
        for f in 0..FRONTENDS {
            monitor.apply(&report(Publisher::Frontend(f), 2)).expect("apply");
        }
    }
    monitor
}

/// Reports from `publisher` on the middle worker, the `seq`-th with
/// `active` blocks; every one has the `expected` outcome (checked once
/// outside the timing).
fn bench_reports(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    n: usize,
    publisher: Publisher,
    active: impl Fn(u64) -> u32,
    expected: Applied,
) {
    let monitor = shared_pool(n);
    let worker = (n / 2) as WorkerId;
    let mut seq = 1u64;
    let mut report = move || {
        seq += 1;
        LoadReport { worker, incarnation: 0, rank: 0, publisher, seq, load: decode_load(active(seq)) }
    };
    group.bench_with_input(BenchmarkId::new(name, n), &n, |b, _| {
        b.iter(|| {
            let applied = black_box(&monitor).apply(black_box(&report()));
            debug_assert_eq!(applied, Ok(expected));
            applied
        })
    });
    assert_eq!(monitor.apply(&report()), Ok(expected), "{name}");
}

fn shared(c: &mut Criterion) {
    for n in WORKER_COUNTS {
        let mut group = c.benchmark_group(format!("shared_load/{n}_workers"));
        group.throughput(Throughput::Elements(1));
        let other = Publisher::Frontend(FRONTENDS / 2);
        // The frontends' sum, 30 + 15 × 2 = 60 of 100 blocks: past the threshold
        // (the worker's own 10 is not added: the larger of the two counts).
        let flip = |seq: u64| if seq % 2 == 0 { 30 } else { 2 };
        bench_reports(&mut group, "frontend_report/no_flip", n, other, |seq| 2 + (seq % 2) as u32, Applied::Stored);
        bench_reports(&mut group, "frontend_report/flip", n, other, flip, Applied::Flipped);
        bench_reports(
            &mut group,
            "worker_report/no_flip",
            n,
            Publisher::Worker,
            |seq| 10 + (seq % 2) as u32,
            Applied::Stored,
        );
        let monitor = shared_pool(n);
        group.bench_with_input(BenchmarkId::new("renew", n), &n, |b, _| {
            b.iter(|| black_box(&monitor).renew_publisher(black_box(other)))
        });
        assert_eq!(monitor.renew_publisher(other), Ok(0));
        group.finish();
    }
}

criterion_group!(benches, shared);
criterion_main!(benches);
