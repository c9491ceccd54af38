//! `--worker URL`: registers a worker that is not on the event plane from
//! its `GET URL/info`.

use std::time::Duration;

use serde_json::Value;

use crate::events::PlaneLimits;
use crate::frontend::state::Frontend;

/// How long `--worker URL` keeps retrying `URL/info` before giving up.
const WORKER_INFO_DEADLINE: Duration = Duration::from_secs(30);

/// Registers the worker at `url` from its `GET /info`, retrying until it
/// answers (bounded).
///
/// What `/info` names passes the same limits as an event-plane Register
/// (`--max-name-len` for the model name, `--max-dp-size`, `--max-workers`,
/// `--max-models`), and an id may be given by one `--worker` only.
pub(crate) async fn register_http_worker(frontend: &Frontend, url: &str, limits: &PlaneLimits) -> anyhow::Result<()> {
    let base = url.trim_end_matches('/');
    let base = if base.contains("://") { base.to_owned() } else { format!("http://{base}") };
    let deadline = tokio::time::Instant::now() + WORKER_INFO_DEADLINE;
    let info: Value = loop {
        // `/info` needs no request proof (a proof is bound to a worker id
        // and incarnation, which `/info` is where they are learnt).
        match frontend.client.get(format!("{base}/info")).send().await {
            Ok(r) if r.status().is_success() => break r.json().await?,
            Ok(r) => tracing::info!(%base, status = %r.status(), "worker /info not ready; retrying"),
            Err(e) => tracing::info!(%base, error = %e, "worker /info unreachable; retrying"),
        }
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!("worker {base} did not answer /info within {WORKER_INFO_DEADLINE:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let worker = info.get("worker_id").and_then(Value::as_u64);
    let model = info.get("model").and_then(Value::as_str);
    let dp_size = info.get("dp_size").and_then(Value::as_u64).unwrap_or(1);
    // Reports never come over HTTP, so any incarnation the worker names
    // does; 0 for one that names none.
    let incarnation = info.get("incarnation").and_then(Value::as_u64).unwrap_or(0);
    let (Some(worker), Some(model)) = (worker, model) else {
        anyhow::bail!("worker {base}/info lacks worker_id or model: {info}");
    };
    let dp_size = u32::try_from(dp_size)
        .map_err(|_| anyhow::anyhow!("--worker {base}: dp size {dp_size} over --max-dp-size {}", limits.max_dp_size))?;
    if frontend.directory.contains(worker) {
        anyhow::bail!("--worker {base}: worker id {worker} is already registered by another --worker");
    }
    limits
        .check_register(&frontend.monitor, &frontend.directory, worker, model, None, dp_size)
        .map_err(|refusal| anyhow::anyhow!("--worker {base} refused: {refusal}"))?;
    // The address first: the router may pick the worker as soon as the
    // monitor has it.
    frontend.directory.insert_static(worker, &base, dp_size);
    if let Err(e) = frontend.monitor.register(worker, model, dp_size, incarnation) {
        frontend.directory.remove(worker);
        anyhow::bail!("--worker {base} refused: {e}");
    }
    tracing::info!(worker, model, dp_size, %base, "worker registered from --worker");
    Ok(())
}
