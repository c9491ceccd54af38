//! The processes under test: a `loadgate frontend` and `loadgate worker`s
//! on free 127.0.0.1 ports (killed on drop), and reading the frontend's
//! metrics.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{self, expect_field, long_client, Proc, Worker};

pub(crate) const MODEL: &str = "test-model";
/// Generous: the machine is small and shared.
pub(crate) const STARTUP: Duration = Duration::from_secs(30);
pub(crate) const SETTLE: Duration = Duration::from_secs(15);

/// Starts `loadgate <args>` (killed on drop, its logs printed if the test
/// fails) and waits for its `listening ...` stdout line.
pub(crate) fn spawn(name: &str, args: &[&str], env: &[(&str, &str)]) -> (Proc, String) {
    let (proc, line) = common::spawn_within(name, args, env, STARTUP);
    assert!(line.starts_with("listening http=127.0.0.1:"), "{name}: unexpected first line {line:?}");
    (proc, line)
}

pub(crate) struct Frontend {
    _proc: Proc,
    pub(crate) http: String,
    pub(crate) events: String,
    /// The admin listener (`/busy_threshold`), as a base URL.
    pub(crate) admin: String,
    pub(crate) client: reqwest::Client,
}

pub(crate) fn frontend(extra: &[&str]) -> Frontend {
    let mut args =
        vec!["frontend", "--http-host", "127.0.0.1", "--http-port", "0", "--event-port", "0", "--admin-port", "0"];
    args.extend_from_slice(extra);
    let (proc, line) = spawn("frontend", &args, &[]);
    let http = format!("http://{}", expect_field(&line, "http"));
    let events = expect_field(&line, "events");
    let admin = format!("http://{}", expect_field(&line, "admin"));
    Frontend { _proc: proc, http, events, admin, client: long_client() }
}

pub(crate) fn worker(frontend: &Frontend, kv_total_blocks: u32, decode_step_ms: u32, extra: &[&str]) -> Worker {
    worker_with_env(frontend, kv_total_blocks, decode_step_ms, extra, &[])
}

pub(crate) fn worker_with_env(
    frontend: &Frontend,
    kv_total_blocks: u32,
    decode_step_ms: u32,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Worker {
    let blocks = kv_total_blocks.to_string();
    let step = decode_step_ms.to_string();
    let mut args = vec![
        "worker",
        "--model",
        MODEL,
        "--http-host",
        "127.0.0.1",
        "--http-port",
        "0",
        "--frontend",
        &frontend.events,
        "--kv-total-blocks",
        &blocks,
        "--decode-step-ms",
        &step,
    ];
    args.extend_from_slice(extra);
    let (proc, line) = spawn("worker", &args, env);
    Worker { proc, http: format!("http://{}", expect_field(&line, "http")) }
}

/// `n` whitespace-separated words: `n` prompt tokens.
pub(crate) fn prompt(n: usize) -> String {
    vec!["word"; n].join(" ")
}

impl Frontend {
    pub(crate) async fn metrics(&self) -> String {
        self.client.get(format!("{}/metrics", self.http)).send().await.unwrap().text().await.unwrap()
    }

    /// The sum of every sample of `name` whose labels contain `filter`.
    pub(crate) async fn metric(&self, name: &str, filter: &str) -> f64 {
        sum_metric(&self.metrics().await, name, filter)
    }

    /// Waits until `check(metrics text)` holds.
    pub(crate) async fn wait_metrics(&self, what: &str, check: impl Fn(&str) -> bool) {
        let deadline = Instant::now() + SETTLE;
        loop {
            let text = self.metrics().await;
            if check(&text) {
                return;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}; metrics:\n{text}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub(crate) async fn wait_workers(&self, n: usize) {
        self.wait_metrics(&format!("{n} registered workers"), |m| {
            sum_metric(m, "loadgate_frontend_workers", "") == n as f64
        })
        .await;
    }

    pub(crate) async fn complete(&self, body: Value) -> reqwest::Response {
        self.client.post(format!("{}/v1/completions", self.http)).json(&body).send().await.unwrap()
    }

    pub(crate) async fn post_threshold(&self, body: &str, content_type: &str) -> (u16, Value) {
        let response = self
            .client
            .post(format!("{}/busy_threshold", self.admin))
            .header("content-type", content_type)
            .body(body.to_owned())
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }
}

pub(crate) fn sum_metric(text: &str, name: &str, filter: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && matches!(l.as_bytes().get(name.len()), Some(b'{' | b' ')))
        .filter(|l| l.contains(filter))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
