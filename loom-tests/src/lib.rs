//! loom model checks of loadgate's lock-free protocols.
//!
//! Run them in release with loom switched on (both the cfg and the feature
//! this crate enables):
//!
//! ```text
//! cd loom-tests && RUSTFLAGS="--cfg loom" cargo test --release
//! ```
//!
//! Without `--cfg loom` the test files compile to nothing. Every model runs
//! through [`run_model`], which bounds preemptions (as tokio and sharded-slab
//! do) so the whole suite stays within minutes on two cores;
//! `LOOM_MAX_PREEMPTIONS` overrides the bound.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// The preemption bound of [`run_model`], for models with three busy
/// threads (hundreds of thousands of executions already at 3).
pub const DEFAULT_PREEMPTIONS: usize = 2;

/// Checks `f` under every interleaving loom explores with at most
/// [`DEFAULT_PREEMPTIONS`] preemptions (`LOOM_MAX_PREEMPTIONS` overrides),
/// and prints how many executions that took and how long.
pub fn run_model<F>(name: &str, f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    run_model_with(name, DEFAULT_PREEMPTIONS, f);
}

/// As [`run_model`], with a deeper default bound for a model small enough to
/// afford it (`LOOM_MAX_PREEMPTIONS` still overrides).
pub fn run_model_with<F>(name: &str, preemptions: usize, f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(preemptions);
    }
    let bound = builder.preemption_bound;
    // A plain std counter: it counts executions, outside the model.
    let executions = Arc::new(AtomicUsize::new(0));
    let counter = executions.clone();
    let started = Instant::now();
    builder.check(move || {
        counter.fetch_add(1, Ordering::Relaxed);
        f();
    });
    eprintln!(
        "loom model {name}: {} executions, preemption bound {bound:?}, {:.1} s",
        executions.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64()
    );
}

/// Applies both `reports` to `monitor` at once, each on a loom thread of its
/// own; their outcomes, in order.
pub fn apply_on_two_threads(
    monitor: &Arc<loadgate::WorkerMonitor>,
    reports: [loadgate::LoadReport; 2],
) -> Vec<loadgate::monitor::Applied> {
    let writers: Vec<_> = reports
        .into_iter()
        .map(|r| {
            let monitor = monitor.clone();
            loom::thread::spawn(move || monitor.apply(&r).unwrap())
        })
        .collect();
    writers.into_iter().map(|w| w.join().unwrap()).collect()
}
