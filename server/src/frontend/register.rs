//! `--worker URL`: registers a worker that is not on the event plane from
//! its `GET URL/info`.
//!
//! Each attempt is bounded as a whole (connect to the last byte of the
//! body: [`INFO_ATTEMPT_TIMEOUT`]), and the attempts together by
//! [`WORKER_INFO_DEADLINE`]: a worker that accepts and never answers, or
//! answers only in part, is retried until then, and the start fails with
//! an error naming the flag and the URL. A body over [`MAX_INFO_BYTES`]
//! (an endless one) is refused at once, without reading the rest.

use std::time::Duration;

use serde_json::Value;

use crate::events::PlaneLimits;
use crate::frontend::state::Frontend;

/// How long `--worker URL` keeps retrying `URL/info` before the start fails.
const WORKER_INFO_DEADLINE: Duration = Duration::from_secs(30);

/// How long one `GET URL/info` may take, from connecting to the body's last
/// byte (less when the deadline is nearer).
const INFO_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

/// The pause between two attempts.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// The largest `/info` body read (a worker's is a few hundred bytes).
const MAX_INFO_BYTES: usize = 64 * 1024;

/// Why an attempt at `URL/info` gave no body.
enum InfoError {
    /// Worth another attempt (not reachable, not ready, the body broke): why.
    Retry(String),
    /// A definite answer that another attempt will not change.
    Refused(anyhow::Error),
}

/// Registers the worker at `url` from its `GET /info`, retrying until it
/// answers (bounded).
///
/// What `/info` names passes the same limits as an event-plane Register
/// (`--max-name-len` for the model name, `--max-dp-size`, `--max-workers`,
/// `--max-models`), and an id may be given by one `--worker` only.
pub(crate) async fn register_http_worker(frontend: &Frontend, url: &str, limits: &PlaneLimits) -> anyhow::Result<()> {
    let base = url.trim_end_matches('/');
    let base = if base.contains("://") { base.to_owned() } else { format!("http://{base}") };
    let body = fetch_info(frontend, &base).await?;
    let info: Value = serde_json::from_slice(&body)
        .map_err(|e| anyhow::anyhow!("--worker {base} refused: its /info is not JSON ({e})"))?;
    let worker = info.get("worker_id").and_then(Value::as_u64);
    let model = info.get("model").and_then(Value::as_str);
    let dp_size = info.get("dp_size").and_then(Value::as_u64).unwrap_or(1);
    // Reports never come over HTTP, so any incarnation the worker names
    // does; 0 for one that names none.
    let incarnation = info.get("incarnation").and_then(Value::as_u64).unwrap_or(0);
    let (Some(worker), Some(model)) = (worker, model) else {
        anyhow::bail!("--worker {base} refused: its /info lacks worker_id or model: {info}");
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
    // A health check may have flagged it before the monitor had it.
    frontend.directory.sync(worker);
    tracing::info!(worker, ?model, dp_size, %base, "worker registered from --worker");
    Ok(())
}

/// The body of `base/info`: attempts of at most [`INFO_ATTEMPT_TIMEOUT`]
/// each, [`RETRY_PAUSE`] apart, until one gives a whole body or
/// [`WORKER_INFO_DEADLINE`] passes.
async fn fetch_info(frontend: &Frontend, base: &str) -> anyhow::Result<Vec<u8>> {
    let deadline = tokio::time::Instant::now() + WORKER_INFO_DEADLINE;
    let mut last = String::from("none made");
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            anyhow::bail!(
                "--worker {base}: GET {base}/info gave no answer within {WORKER_INFO_DEADLINE:?} \
                 (last attempt: {last}); is a worker serving at that URL?"
            );
        }
        let bound = INFO_ATTEMPT_TIMEOUT.min(left);
        last = match tokio::time::timeout(bound, info_attempt(frontend, base)).await {
            Ok(Ok(body)) => return Ok(body),
            Ok(Err(InfoError::Refused(error))) => return Err(error),
            Ok(Err(InfoError::Retry(why))) => why,
            Err(_) => format!("no whole answer within {bound:.1?}"),
        };
        tracing::info!(%base, why = %last, "worker /info not answered; retrying");
        tokio::time::sleep(RETRY_PAUSE.min(deadline.saturating_duration_since(tokio::time::Instant::now()))).await;
    }
}

/// One `GET base/info`: its whole body, at most [`MAX_INFO_BYTES`].
async fn info_attempt(frontend: &Frontend, base: &str) -> Result<Vec<u8>, InfoError> {
    // `/info` needs no request proof (a proof is bound to a worker id and
    // incarnation, which `/info` is where they are learnt).
    let request = frontend.client.get(format!("{base}/info"));
    let mut response = request.send().await.map_err(|e| InfoError::Retry(format!("unreachable: {e}")))?;
    if !response.status().is_success() {
        return Err(InfoError::Retry(format!("status {}", response.status())));
    }
    let too_large = || {
        InfoError::Refused(anyhow::anyhow!(
            "--worker {base} refused: its /info body is over {} KiB",
            MAX_INFO_BYTES >> 10
        ))
    };
    if response.content_length().is_some_and(|n| n > MAX_INFO_BYTES as u64) {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| InfoError::Retry(format!("the body broke: {e}")))? {
        if body.len() + chunk.len() > MAX_INFO_BYTES {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}
