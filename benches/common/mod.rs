//! The pool both the selection and the apply benches start from.

use std::sync::Arc;

use std::hint::black_box;

use criterion::{measurement::WallTime, BenchmarkGroup, BenchmarkId};
use loadgate::{
    monitor::{Applied, Publisher},
    BusyThresholds, LoadReport, MonitorConfig, RankLoad, WorkerId, WorkerMonitor,
};

/// The one model every worker serves.
pub const MODEL: &str = "llama";

/// `active` of 100 KV blocks in use (busy above 50, the pool's threshold).
pub fn decode_load(active: u32) -> RankLoad {
    RankLoad { active_decode_blocks: active, kv_total_blocks: 100, ..Default::default() }
}

/// A monitor with `n` single-rank workers (ids `0..n`) of [`MODEL`], a 0.5
/// decode threshold, and every worker reported free (10 of 100 blocks, seq 1).
#[allow(dead_code)] // not every bench that shares this module starts from it
pub fn free_pool(n: usize) -> Arc<WorkerMonitor> {
    let config = MonitorConfig {
        default_thresholds: BusyThresholds { active_decode_blocks_threshold: Some(0.5), ..Default::default() },
        ..Default::default()
    };
    let monitor = Arc::new(WorkerMonitor::new(config).expect("valid thresholds"));
    for id in 0..n as WorkerId {
        monitor.register(id, MODEL, 1, 0).expect("register");
        let report = LoadReport {
            worker: id,
            incarnation: 0,
            rank: 0,
            publisher: Publisher::Worker,
            seq: 1,
            load: decode_load(10),
        };
        monitor.apply(&report).expect("apply");
    }
    monitor
}

/// Benchmarks `publisher`'s reports on the middle worker of `monitor`'s `n`,
/// the load of the `seq`-th report given by `load`; checks every report has
/// the `expected` outcome (in the timing only in debug builds; once outside
/// it always).
#[allow(dead_code)] // not every bench that shares this module applies reports
pub fn bench_reports(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    (monitor, n): (&WorkerMonitor, usize),
    publisher: Publisher,
    load: impl Fn(u64) -> RankLoad,
    expected: Applied,
) {
    let worker = (n / 2) as WorkerId;
    let mut seq = 1u64;
    let mut report = move || {
        seq += 1;
        LoadReport { worker, incarnation: 0, rank: 0, publisher, seq, load: load(seq) }
    };
    group.bench_with_input(BenchmarkId::new(name, n), &n, |b, _| {
        b.iter(|| {
            let applied = black_box(monitor).apply(black_box(&report()));
            debug_assert_eq!(applied, Ok(expected));
            applied
        })
    });
    assert_eq!(monitor.apply(&report()), Ok(expected), "{name}");
}
