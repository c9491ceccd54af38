//! The pool-wide retry hint (`--retry-hint-scope pool`, the default when
//! frontends share their load over NATS) counts the refused request's
//! model's line across the frontends, not every model's: a real
//! `nats-server`, two real frontends, and two workers this test plays
//! (sealed Registers and busy Loads on NATS), one per model.
//!
//! `#[ignore]` in plain `cargo test` (it needs `nats-server`); `.ci/run`
//! runs it. Every wait is bounded.

#[path = "common/mod.rs"]
mod common;

use std::time::Duration;

use bytes::BytesMut;
use common::{frontend, metric, unix_ms, Frontend, Nats, SECRET};
use loadgate::wire::envelope::seal;
use loadgate::wire::Frame;
use loadgate::RankLoad;
use serde_json::json;

/// The model with a line on frontend B, and the one with none anywhere.
const LINED: &str = "lined-model";
const UNLINED: &str = "unlined-model";

/// One worker per model, registered on NATS and reported busy (90 of 100
/// KV blocks) every 200 ms until the task is aborted.
async fn busy_workers(nats: &Nats) -> tokio::task::JoinHandle<()> {
    let client = async_nats::connect(nats.url.as_str()).await.expect("the workers connect to NATS");
    let incarnation = unix_ms() * 1000;
    tokio::spawn(async move {
        for seq in 1u64.. {
            for (worker, model) in [(61u64, LINED), (62, UNLINED)] {
                let subject = format!("loadgate.ev.{model}.{worker}");
                // Never reached: every request is refused or waits.
                let http_addr = "127.0.0.1:9".to_owned();
                let register = Frame::Register { worker, incarnation, dp_size: 1, model: model.to_owned(), http_addr };
                let load = RankLoad { active_decode_blocks: 90, kv_total_blocks: 100, ..Default::default() };
                for frame in [register, Frame::Load { worker, incarnation, rank: 0, seq, load }] {
                    let mut buf = BytesMut::new();
                    seal(SECRET.as_bytes(), &subject, unix_ms(), &frame, &mut buf).unwrap();
                    let _ = client.publish(subject.clone(), buf.freeze()).await;
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}

/// Waits (bounded: 10 s) until `name` reads `value` on `fe`.
async fn wait_metric(fe: &Frontend, name: &str, value: f64) {
    let what = format!("{name} never read {value}");
    common::wait_for_metrics(&fe.client, &fe.http, Duration::from_secs(10), &what, |text| {
        metric(text, name) == Some(value)
    })
    .await;
}

/// One completion of `model` to `fe`: its status and `retry-after-ms`.
async fn send(client: reqwest::Client, http: String, model: &str) -> (u16, Option<u64>) {
    let body = json!({"model": model, "prompt": "hello there", "max_tokens": 4});
    let response = client.post(format!("{http}/v1/completions")).json(&body).send().await.expect("an answer");
    let hint = response.headers().get("retry-after-ms").and_then(|v| v.to_str().ok()?.parse().ok());
    (response.status().as_u16(), hint)
}

/// Found by a review: the pool's floor counted the other frontends'
/// waiters of every model (their beats' total), where a frontend alone
/// counts the refused model's line only: B's line of 100 requests for one
/// model made A tell a client refused for another model, which has no line
/// anywhere, to come back at the cap (30 s) instead of after about a
/// second. A refusal for B's model still counts B's line (at the cap).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nats-server (scripts/prepare-nats-server); run by .ci/run"]
async fn the_pool_hint_counts_the_refused_models_line_not_every_models() {
    let _box = common::shared().await;
    let nats = Nats::start(&[]);
    let workers = busy_workers(&nats).await;
    let flags = |ms| ["--active-decode-blocks-threshold", "0.5", "--router-queue-timeout-ms", ms];
    // A: no line (the instant 529); B: a 20 s line.
    let (a, b) = (frontend(&nats, &flags("0")), frontend(&nats, &flags("20000")));
    for fe in [&a, &b] {
        fe.wait_workers(2, Duration::from_secs(10)).await;
        wait_metric(fe, "loadgate_frontend_shared_frontends", 2.0).await;
        wait_metric(fe, "loadgate_frontend_worker_busy", 2.0).await;
    }
    let client = common::client_within(Duration::from_secs(30));
    let waiters: Vec<_> = (0..100).map(|_| tokio::spawn(send(client.clone(), b.http.clone(), LINED))).collect();
    wait_metric(&b, "loadgate_frontend_queue_waiting", 100.0).await;
    // B's beats (every 200 ms, and at once when its lines change) reach A.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (status, unlined) = send(client.clone(), a.http.clone(), UNLINED).await;
    assert_eq!(status, 529);
    let unlined = unlined.expect("a hint");
    // 1 s floor, one pool slot (2 frontends x 1 s, nothing answered yet).
    assert!(unlined < 10_000, "no line for {UNLINED} anywhere, yet told to wait {unlined} ms");
    let (status, lined) = send(client.clone(), a.http.clone(), LINED).await;
    assert_eq!(status, 529);
    assert!(lined.is_some_and(|ms| ms >= 25_000), "B's line of 100 for {LINED} is counted: {lined:?} ms");
    workers.abort();
    drop((a, b));
    for waiter in waiters {
        let _ = waiter.await;
    }
}
