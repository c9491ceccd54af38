//! Closed-loop saturation: how many requests per second a pool completes
//! when clients send back to back (the demo's capacity estimate).

use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::loadgen::config::{request_body, BenchConfig};

/// Closed-loop saturation: `clients` clients each send their next request
/// as soon as the previous one ends, for `warmup + measure`; returns the
/// requests per second that completed (2xx) during `measure`.
///
/// # Errors
///
/// The HTTP client cannot be built.
pub async fn saturate(
    config: &BenchConfig,
    clients: usize,
    warmup: Duration,
    measure: Duration,
) -> anyhow::Result<f64> {
    let client = reqwest::Client::builder().tcp_nodelay(true).build()?;
    let body = bytes::Bytes::from(request_body(config));
    let start = Instant::now();
    let (from, until) = (start + warmup, start + warmup + measure);
    let mut tasks = JoinSet::new();
    for _ in 0..clients {
        let (client, url, body) = (client.clone(), config.url.clone(), body.clone());
        tasks.spawn(async move {
            let mut completed = 0u64;
            while Instant::now() < until {
                let Ok(resp) =
                    client.post(&url).header("content-type", "application/json").body(body.clone()).send().await
                else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let ok = resp.status().is_success();
                let read = resp.bytes().await.is_ok();
                let now = Instant::now();
                if ok && read && now >= from && now < until {
                    completed += 1;
                }
            }
            completed
        });
    }
    let mut completed = 0;
    while let Some(n) = tasks.join_next().await {
        completed += n.unwrap_or(0);
    }
    Ok(completed as f64 / measure.as_secs_f64())
}
