//! What the waiting-line tests share (`waiting_line.rs`,
//! `priority_classes.rs`): a frontend whose model is busy above half its KV
//! blocks and hears no report but the test's, a worker the test controls (a
//! fake HTTP worker registered and reported over a real event connection),
//! requests with or without a priority, and bounded waits on `/metrics`.
//!
//! Margins: the frontend's silence and idle timeouts are raised to 60 s, so
//! no report comes but the test's; every wait here is bounded (5 s).

// Each test binary uses a different part of this.
#![allow(dead_code)]

use std::net::TcpStream;
use std::time::{Duration, Instant};

use loadgate::wire::Frame;
use loadgate::RankLoad;
use serde_json::json;

use super::common::{encoded, metric, metrics_text, register, wait_for_metrics, FakeWorker, Frontend};

pub const MODEL: &str = "line-model";

pub const WORKER: u64 = 7;

/// A frontend whose model is busy above half its KV blocks, with `extra`
/// flags; no report reaches it but the test's.
pub fn frontend(extra: &[&str]) -> Frontend {
    let mut flags = vec![
        "--active-decode-blocks-threshold",
        "0.5",
        "--event-silence-ms",
        "60000",
        "--event-idle-timeout-ms",
        "60000",
    ];
    flags.extend_from_slice(extra);
    Frontend::start(None, &flags)
}

/// A frontend with `extra` flags ([`frontend`]) and its worker, registered
/// and reported busy, once the frontend counts it busy.
pub async fn busy(extra: &[&str]) -> (Frontend, Controlled) {
    let fe = frontend(extra);
    let mut worker = Controlled::register(&fe).await;
    worker.report(true);
    wait_for_busy(&fe).await;
    (fe, worker)
}

/// The fake worker and the test's event connection for it.
pub struct Controlled {
    pub http: FakeWorker,
    events: TcpStream,
    seq: u64,
    incarnation: u64,
}

impl Controlled {
    pub async fn register(frontend: &Frontend) -> Controlled {
        let http = FakeWorker::start();
        let mut events = TcpStream::connect(frontend.events).expect("event port");
        let frame = register(WORKER, 1, 1, MODEL, &http.addr.to_string());
        std::io::Write::write_all(&mut events, &encoded(&frame)).expect("register");
        frontend.wait_workers(1, Duration::from_secs(10)).await;
        Controlled { http, events, seq: 0, incarnation: 1 }
    }

    /// Frees the worker once per waiter (the line gives it one waiter per
    /// report: each report after the last one's dispatch reached it), and
    /// checks that every waiter is served.
    pub async fn serve(&mut self, waiters: Vec<tokio::task::JoinHandle<(u16, Option<String>, Duration)>>) {
        for k in 1..=waiters.len() {
            self.report(false);
            if k < waiters.len() {
                wait_received(&self.http, k).await;
            }
        }
        for waiter in waiters {
            assert_eq!(waiter.await.unwrap().0, 200);
        }
    }

    /// Deregisters (a restart's first half: the model's last worker leaves).
    pub fn leave(&mut self) {
        let frame = Frame::Deregister { worker: WORKER, incarnation: self.incarnation };
        std::io::Write::write_all(&mut self.events, &encoded(&frame)).expect("deregister");
    }

    /// Registers again as the next incarnation (a restart's second half).
    pub async fn come_back(&mut self, frontend: &Frontend) {
        self.incarnation += 1;
        self.seq = 0;
        let frame = register(WORKER, self.incarnation, 1, MODEL, &self.http.addr.to_string());
        std::io::Write::write_all(&mut self.events, &encoded(&frame)).expect("register");
        frontend.wait_workers(1, Duration::from_secs(10)).await;
    }

    /// Registers again as the next incarnation ([`Controlled::come_back`])
    /// and reports busy, once the frontend counts it busy.
    pub async fn come_back_busy(&mut self, frontend: &Frontend) {
        self.come_back(frontend).await;
        self.report(true);
        wait_for_busy(frontend).await;
    }

    /// One load report: 90 of 100 blocks (busy) or 10 (free).
    pub fn report(&mut self, busy: bool) {
        self.report_blocks(if busy { 90 } else { 10 });
    }

    /// As [`Controlled::report_blocks`], once the frontend has applied it
    /// (its count of applied loads went up; bounded: 5 s): whatever that
    /// report frees (a mark of the line's), a request sent next sees.
    pub async fn report_blocks_applied(&mut self, frontend: &Frontend, blocks: u32) {
        let applied = |text: &str| metric(text, "loadgate_frontend_event_loads_applied_total").unwrap_or(0.0);
        let before = applied(&metrics_text(&frontend.client, &frontend.http).await);
        self.report_blocks(blocks);
        let what = "the frontend never applied the report";
        wait_for_metrics(&frontend.client, &frontend.http, Duration::from_secs(5), what, |text| applied(text) > before)
            .await;
    }

    /// One load report of `blocks` of 100 KV blocks in use.
    pub fn report_blocks(&mut self, blocks: u32) {
        self.seq += 1;
        let load = RankLoad { active_decode_blocks: blocks, kv_total_blocks: 100, ..Default::default() };
        let frame = Frame::Load { worker: WORKER, incarnation: self.incarnation, rank: 0, seq: self.seq, load };
        std::io::Write::write_all(&mut self.events, &encoded(&frame)).expect("report");
    }
}

/// Sends one completion; returns its status, reason header and how long it took.
pub fn send(
    frontend: &Frontend,
    client: reqwest::Client,
) -> impl std::future::Future<Output = (u16, Option<String>, Duration)> {
    let url = format!("{}/v1/completions", frontend.http);
    async move { send_to(url, client).await }
}

pub async fn send_to(url: String, client: reqwest::Client) -> (u16, Option<String>, Duration) {
    send_as(url, client, None).await
}

/// Sends one completion with `x-loadgate-priority: priority` (if any).
pub fn send_with(
    frontend: &Frontend,
    client: reqwest::Client,
    priority: &'static str,
) -> impl std::future::Future<Output = (u16, Option<String>, Duration)> {
    let url = format!("{}/v1/completions", frontend.http);
    async move { send_as(url, client, Some(priority)).await }
}

pub async fn send_as(url: String, client: reqwest::Client, priority: Option<&str>) -> (u16, Option<String>, Duration) {
    let start = Instant::now();
    let body = json!({"model": MODEL, "prompt": "hello there", "max_tokens": 4});
    let mut request = client.post(url).json(&body);
    if let Some(priority) = priority {
        request = request.header("x-loadgate-priority", priority);
    }
    let response = request.send().await.expect("send");
    let reason = response.headers().get("x-loadgate-rejected-reason").and_then(|v| v.to_str().ok()).map(str::to_owned);
    (response.status().as_u16(), reason, start.elapsed())
}

pub async fn waiting(frontend: &Frontend) -> f64 {
    metric(&metrics_text(&frontend.client, &frontend.http).await, "loadgate_frontend_queue_waiting").unwrap_or(-1.0)
}

/// Waits (bounded: 5 s) until the line holds `n` requests.
pub async fn wait_waiting(frontend: &Frontend, n: f64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while waiting(frontend).await != n {
        assert!(Instant::now() < deadline, "the line never held {n} (holds {})", waiting(frontend).await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (bounded: 5 s) until the fake worker has received `n` requests.
pub async fn wait_received(worker: &FakeWorker, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while worker.requests() < n {
        assert!(Instant::now() < deadline, "the worker received {} of {n}", worker.requests());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits (bounded: 5 s) until the model's worker is busy.
pub async fn wait_for_busy(frontend: &Frontend) {
    let busy = |text: &str| metric(text, "loadgate_frontend_worker_busy").is_some_and(|v| v >= 1.0);
    wait_for_metrics(&frontend.client, &frontend.http, Duration::from_secs(5), "the worker never became busy", busy)
        .await;
}

/// The sum of the samples of `name` whose labels contain `filter`.
pub fn metric_with(text: &str, name: &str, filter: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#') && l.contains(filter)) {
        let Some((series, value)) = line.rsplit_once(' ') else { continue };
        if series.split('{').next() == Some(name) {
            *found.get_or_insert(0.0) += value.parse::<f64>().unwrap_or(0.0);
        }
    }
    found
}
