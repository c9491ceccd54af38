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

use common::{bench_reports, decode_load, MODEL};
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

fn shared(c: &mut Criterion) {
    for n in WORKER_COUNTS {
        let mut group = c.benchmark_group(format!("shared_load/{n}_workers"));
        group.throughput(Throughput::Elements(1));
        let other = Publisher::Frontend(FRONTENDS / 2);
        // The frontends' sum, 30 + 15 × 2 = 60 of 100 blocks: past the threshold
        // (the worker's own 10 is not added: the larger of the two counts).
        let flip = |seq: u64| decode_load(if seq % 2 == 0 { 30 } else { 2 });
        let no_flip = |seq: u64| decode_load(2 + (seq % 2) as u32);
        // A fresh pool for each kind: each numbers its reports from 2.
        bench_reports(&mut group, "frontend_report/no_flip", (&shared_pool(n), n), other, no_flip, Applied::Stored);
        bench_reports(&mut group, "frontend_report/flip", (&shared_pool(n), n), other, flip, Applied::Flipped);
        let own = |seq: u64| decode_load(10 + (seq % 2) as u32);
        let worker = Publisher::Worker;
        bench_reports(&mut group, "worker_report/no_flip", (&shared_pool(n), n), worker, own, Applied::Stored);
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
