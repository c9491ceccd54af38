//! Active health checks of the workers registered by `--worker URL` (they
//! have no event connection whose silence would tell; `--engine` engines
//! are left out, their scrapes are their health check): every
//! `--worker-health-check-ms`, `GET URL/health`, bounded by the same
//! interval (at most 2 s). Two failures in a row (no answer in time, or not
//! 2xx) take the worker out of routing; one success brings it back.
//! Transitions are logged. The task ends when the frontend is dropped.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

use loadgate::WorkerId;

use crate::frontend::state::Frontend;

/// Failures in a row that take a worker out of routing.
const FAILURES_TO_DOWN: u32 = 2;

/// The longest a single check may take.
const MAX_CHECK_TIME: Duration = Duration::from_secs(2);

/// Checks the `--worker` workers every `every` (none: no checks).
pub(crate) fn spawn(frontend: &Arc<Frontend>, every: Option<Duration>) {
    let Some(every) = every else { return };
    if frontend.directory.static_workers().is_empty() {
        return;
    }
    tokio::spawn(run(Arc::downgrade(frontend), every));
}

async fn run(frontend: Weak<Frontend>, every: Duration) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failures: HashMap<WorkerId, u32> = HashMap::new();
    loop {
        ticks.tick().await;
        let Some(frontend) = frontend.upgrade() else { return };
        let workers = frontend.directory.static_workers();
        let checks = workers.iter().map(|(worker, base)| {
            let request = frontend.client.get(format!("{base}/health")).timeout(every.min(MAX_CHECK_TIME));
            async move { (*worker, matches!(request.send().await, Ok(r) if r.status().is_success())) }
        });
        for (worker, healthy) in futures_util::future::join_all(checks).await {
            let count = failures.entry(worker).or_default();
            *count = if healthy { 0 } else { count.saturating_add(1) };
            let down = *count >= FAILURES_TO_DOWN;
            if frontend.directory.set_silent(worker, down) {
                if down {
                    tracing::warn!(worker, "worker failed its health checks: out of routing");
                } else {
                    tracing::info!(worker, "worker passes its health check again: back in routing");
                }
            }
        }
        let listed: HashSet<WorkerId> = workers.iter().map(|(worker, _)| *worker).collect();
        failures.retain(|worker, _| listed.contains(worker));
    }
}
