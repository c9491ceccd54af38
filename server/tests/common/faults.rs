//! Faults: signals, metrics, load.

use std::process::Command;
use std::time::{Duration, Instant};

use super::{client_within, complete};

/// Sends `signal` (a name such as `STOP`, `CONT`, `TERM`, `KILL`) to `pid`.
pub fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill").args([format!("-{signal}"), pid.to_string()]).status().expect("run kill");
    assert!(status.success(), "kill -{signal} {pid} failed");
}

/// The sum of every sample of `name` (with any labels) in a text
/// exposition; `None` when no sample is there.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = match line.rsplit_once(' ') {
            Some(parts) => parts,
            None => continue,
        };
        let bare = series.split('{').next().unwrap_or(series);
        if bare == name {
            if let Ok(v) = value.parse::<f64>() {
                *found.get_or_insert(0.0) += v;
            }
        }
    }
    found
}

/// `GET base/metrics` as text (empty when it did not answer).
pub async fn metrics_text(client: &reqwest::Client, base: &str) -> String {
    match client.get(format!("{base}/metrics")).send().await {
        Ok(response) => response.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// Polls `base/metrics` (every 20 ms, for at most `within`) until `done`
/// holds for its text, and returns that text; past `within` the test fails
/// with `what` and the last text seen.
pub async fn wait_for_metrics(
    client: &reqwest::Client,
    base: &str,
    within: Duration,
    what: &str,
    done: impl Fn(&str) -> bool,
) -> String {
    let deadline = Instant::now() + within;
    loop {
        let text = metrics_text(client, base).await;
        if done(&text) {
            return text;
        }
        assert!(Instant::now() < deadline, "{what} (not within {within:?}):\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One answered (or failed) request of a load run.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// When it was sent, from the run's start.
    pub sent: Duration,
    /// How long it took.
    pub took: Duration,
    /// The status (0: no HTTP answer).
    pub status: u16,
    /// The body, or the transport error.
    pub body: String,
}

/// Sends small completions for `model` to `base` from `clients` concurrent
/// loops until `run_for` has passed (at most `max_each` per loop); every
/// request bounded by `timeout`. Returns every outcome, in no order.
pub async fn load(
    base: &str,
    model: &str,
    clients: usize,
    run_for: Duration,
    max_each: usize,
    timeout: Duration,
) -> Vec<Outcome> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let client = client_within(timeout);
        let base = base.to_owned();
        let model = model.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            while started.elapsed() < run_for && seen.len() < max_each {
                let sent = started.elapsed();
                let t = Instant::now();
                let (status, body) = complete(&client, &base, &model, None).await;
                seen.push(Outcome { sent, took: t.elapsed(), status, body });
            }
            seen
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.expect("a load loop panicked"));
    }
    all
}

/// How many outcomes had each status, sorted by status.
pub fn by_status(outcomes: &[Outcome]) -> Vec<(u16, usize)> {
    let mut counts = std::collections::BTreeMap::new();
    for o in outcomes {
        *counts.entry(o.status).or_insert(0) += 1;
    }
    counts.into_iter().collect()
}
