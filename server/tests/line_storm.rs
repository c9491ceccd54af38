//! The waiting line after a storm: a real `loadgate frontend` process and a
//! worker the test controls (`line/mod.rs`). Requests of every class wait
//! while clients give up, the worker flaps busy and free, leaves and comes
//! back as its next incarnation, and the admin API changes the model's
//! timeout; afterwards every request got exactly one answer, the line's
//! gauges and the in-flight ones are back to 0 and the line admits again.
//!
//! Margins: every request is bounded by its client (at most 10 s); the
//! storm's steps are a fixed number of reports 30 ms apart; gauges are
//! waited for (bounded: 5 s).

#[path = "common/mod.rs"]
mod common;
#[path = "line/mod.rs"]
mod line;

use std::time::Duration;

use common::{metric, metrics_text};
use line::*;
use serde_json::json;

async fn admin_timeout(fe: &common::Frontend, value: serde_json::Value) {
    let body = json!({"model": MODEL, "router_queue_timeout_ms": value});
    let admin = fe.admin.clone().expect("admin listener");
    let response = fe.client.post(format!("{admin}/busy_threshold")).json(&body).send().await.expect("admin");
    assert_eq!(response.status().as_u16(), 200, "{value}");
}

/// Sends one completion of `class` with a client that gives up after
/// `patience`: its status, or 0 if the client gave up.
async fn storm_request(url: String, class: &'static str, patience: Duration) -> u16 {
    let client = reqwest::Client::builder().timeout(patience).build().unwrap();
    let body = json!({"model": MODEL, "prompt": "one two three four", "max_tokens": 4});
    match client.post(url).header("x-loadgate-priority", class).json(&body).send().await {
        Ok(response) => response.status().as_u16(),
        Err(_) => 0,
    }
}

async fn gauge(fe: &common::Frontend, name: &str) -> f64 {
    metric(&metrics_text(&fe.client, &fe.http).await, name).unwrap_or(-1.0)
}

/// Waits (bounded: 5 s) until every gauge of the line and of the requests
/// in flight reads 0.
async fn wait_all_zero(fe: &common::Frontend) {
    let names = [
        "loadgate_frontend_queue_waiting",
        "loadgate_frontend_queue_tokens",
        "loadgate_frontend_inflight_requests",
        "loadgate_frontend_tracked_blocks",
        "loadgate_frontend_tracked_prefill_tokens",
    ];
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    for name in names {
        loop {
            let value = gauge(fe, name).await;
            if value == 0.0 {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{name} stays at {value} after the storm");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_storm_the_line_is_empty_and_admits_again() {
    let _box = common::exclusive().await;
    let (fe, mut worker) = busy(&[
        "--router-queue-timeout-ms",
        "1500",
        "--router-queue-limit",
        "16",
        "--router-queue-token-limit",
        "48",
        "--trust-priority-header",
        "--sheddable-headroom",
        "0.2",
        "--router-mode",
        "kv",
    ])
    .await;
    let url = format!("{}/v1/completions", fe.http);
    let classes = ["critical", "standard", "sheddable"];
    let mut requests = Vec::new();
    for step in 0..60u64 {
        for k in 0..2u64 {
            let n = step * 2 + k;
            let class = classes[(n % 3) as usize];
            // Every fourth client gives up while it waits.
            let patience = Duration::from_millis(if n % 4 == 0 { 200 + (n % 7) * 50 } else { 10_000 });
            requests.push(tokio::spawn(storm_request(url.clone(), class, patience)));
        }
        match step {
            20 => admin_timeout(&fe, json!(300)).await,
            30 => admin_timeout(&fe, json!({"critical": 3000, "standard": 800})).await,
            40 => admin_timeout(&fe, serde_json::Value::Null).await,
            25 => {
                worker.leave();
                fe.wait_workers(0, Duration::from_secs(5)).await;
                worker.come_back(&fe).await;
            }
            _ => {}
        }
        worker.report_blocks(match step % 4 {
            0 => 10,
            1 => 45,
            _ => 90,
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    worker.report(true);
    let mut answers = [0usize; 4];
    for request in requests {
        let status = tokio::time::timeout(Duration::from_secs(15), request).await.expect("answered").unwrap();
        answers[match status {
            0 => 0,
            200 => 1,
            503 | 529 => 2,
            _ => panic!("unexpected status {status}"),
        }] += 1;
    }
    eprintln!("gave up, served, refused: {answers:?}");
    assert!(answers[1] > 0 && answers[2] > 0, "{answers:?}");
    wait_all_zero(&fe).await;
    // The line admits again: a request waits and is served when the
    // worker frees.
    let request = tokio::spawn(send(&fe, fe.client.clone()));
    wait_waiting(&fe, 1.0).await;
    worker.report(false);
    let (status, _, _) = tokio::time::timeout(Duration::from_secs(5), request).await.expect("served").unwrap();
    assert_eq!(status, 200);
    wait_all_zero(&fe).await;
}
