//! A tour of the library: four workers, a decode threshold, load reports,
//! routing around busy workers, shedding when all are busy, and a worker's
//! `N + Q` hard cap with migration.
//!
//! Run: `cargo run --release --example route`

use std::sync::Arc;

use loadgate::{
    Admission, Admitted, BusyThresholds, Migration, MonitorConfig, Policy, RankLoad, Registration, Rejection,
    RouteError, WorkerMonitor, WorkerRouter,
};

const MODEL: &str = "llama-3-8b";

fn main() {
    let monitor = Arc::new(WorkerMonitor::new(MonitorConfig::default()).expect("valid config"));
    for worker in 1..=4 {
        monitor.register_worker(Registration::new(worker, MODEL).dp_size(2)).expect("registers");
    }
    let thresholds = BusyThresholds { active_decode_blocks_threshold: Some(0.85), ..Default::default() };
    monitor.set_thresholds(MODEL, thresholds).expect("valid thresholds");
    let router = WorkerRouter::new(monitor.clone(), Policy::RoundRobin);
    println!("4 workers x 2 ranks, decode threshold 0.85 (busy when more than 85 of 100 blocks are in use)\n");

    let report = |worker, rank, blocks| {
        let load = RankLoad { active_decode_blocks: blocks, kv_total_blocks: 100, ..Default::default() };
        let applied = monitor.reporter(worker).and_then(|worker| worker.report_rank(rank, load));
        println!("  report worker {worker} rank {rank}: {blocks:>3}/100 blocks -> {:?}", applied.expect("registered"));
    };
    let route = |label: &str| {
        let picks: Vec<String> = (0..8)
            .map(|_| match router.route(MODEL, &[]) {
                Ok(w) => format!("w{w}"),
                Err(RouteError::Overloaded) => "529".to_owned(),
                Err(e) => format!("{e:?}"),
            })
            .collect();
        println!("  route x8 {label}: {}\n", picks.join(" "));
    };

    route("(all free)");
    println!("worker 1: rank 0 at 90 blocks, rank 1 at 85 (exactly at the threshold: not busy)");
    report(1, 0, 90);
    report(1, 1, 85);
    route("(worker 1 still free: one rank is not busy)");
    println!("worker 1 rank 1 reaches 86 blocks; worker 2 fills both ranks");
    report(1, 1, 86);
    report(2, 0, 95);
    report(2, 1, 99);
    route("(workers 1 and 2 busy)");
    println!("workers 3 and 4 fill up too");
    for w in 3..=4 {
        report(w, 0, 97);
        report(w, 1, 97);
    }
    route("(all busy: shed with the overload status)");
    println!("  overload status code: {}", loadgate::rejection::overload_status_code());
    println!("  busy reasons: {:?}\n", monitor.model_busy_reasons(MODEL));

    println!("raise the threshold to 0.98 at runtime: takes effect before the call returns");
    monitor.update_thresholds(MODEL, |t| t.active_decode_blocks_threshold = Some(0.98)).expect("valid");
    route("(threshold 0.98)");

    println!("worker hard cap: N = 1 engine slot + Q = 2 queued");
    let admission = Admission::with_dispatch(
        1,
        2,
        Box::new(|item: u32, _permit| {
            println!("  queued request {item} gets the freed slot");
            Ok(())
        }),
    )
    .expect("valid limits");
    let mut held = Vec::new();
    for request in 1..=4 {
        match admission.try_admit(request) {
            Ok(Admitted::Now(item, permit)) => {
                println!("  request {item}: running");
                held.push(permit);
            }
            Ok(Admitted::Queued) => println!("  request {request}: queued"),
            Err(rejected) => println!("  request {}: refused: {rejected}", rejected.0),
        }
    }
    drop(held);

    println!("\nmigration: a cost-based router prefers worker 3 (say, the best KV prefix overlap),");
    println!("but worker 3 refuses at capacity, so the request moves on excluding it");
    let prefer_3: loadgate::route::CostFn = Arc::new(|worker, _load| if worker == 3 { 0 } else { worker });
    let kv_router = WorkerRouter::new(monitor.clone(), Policy::Cost(prefer_3));
    let served = Migration::new(3).run(
        |refused| kv_router.route(MODEL, refused),
        |worker| {
            if worker == 3 {
                println!("  worker {worker}: {}", loadgate::rejection::WORKER_AT_CAPACITY);
                Err(Rejection::WorkerOverloaded)
            } else {
                println!("  worker {worker}: accepted");
                Ok(worker)
            }
        },
    );
    println!("  served by {served:?}");
}
