//! The attack suite of issue 9: every attack of its *Found* list, tried with
//! real `loadgate` processes on 127.0.0.1 as an attacker who reaches the
//! event, inference and worker ports would, and refused. After each attack
//! the frontend still serves a normal request and its RSS stays bounded.
//!
//! The frontends have the event secret (`LOADGATE_EVENT_SECRET`); the real
//! workers have it too. The attacker either lacks it (impersonation) or has
//! it (an insider or a compromised worker: ownership and limits must still
//! hold). `common::FakeWorker` is the impostor's endpoint: it answers 200 and
//! counts what it receives, so "the impostor got 0 requests" is measured.
//!
//! `ATTACKS_LEGACY_BIN=/path/to/loadgate` runs the suite against a build from
//! before issue 9 (flags it lacks are left out), where the attacks succeed.
//!
//! One module per kind of attack; the helpers they share are here.
//! `write_progress` (issue 20) adds clients that stop reading, with the raw
//! HTTP/1.1 and h2c clients of `clients`; its deadline comes from the
//! environment, so it runs as is against older builds too.

#[path = "../common/mod.rs"]
mod common;

mod admin;
mod bodies;
mod clients;
mod event_connections;
mod impersonation;
mod limits;
mod ownership;
mod read_budget;
mod worker_proofs;
mod write_progress;

use std::time::{Duration, Instant};

use common::{worker, Frontend, IMPOSTOR_MARK, SECRET, STARTUP};
use loadgate::RankLoad;
use serde_json::Value;

const MODEL: &str = "attack-model";
/// RSS a frontend may have after an ordinary attack (a debug build idles at
/// a few tens of MiB).
const MAX_RSS_MIB: f64 = 256.0;
/// How long a refused connection may take to be closed.
const CLOSE_WITHIN: Duration = Duration::from_secs(3);

/// What `n` sequential requests for `model` got.
#[derive(Debug, Default)]
struct Served {
    ok: usize,
    by_impostor: usize,
    others: Vec<(u16, String)>,
}

async fn serve_many(fe: &Frontend, model: &str, n: usize) -> Served {
    let mut served = Served::default();
    for _ in 0..n {
        let (status, body) = fe.complete(model).await;
        if status == 200 && body.contains(IMPOSTOR_MARK) {
            served.by_impostor += 1;
        } else if status == 200 {
            served.ok += 1;
        } else {
            served.others.push((status, body));
        }
    }
    served
}

/// A secured frontend with `extra` flags and one real worker of [`MODEL`]
/// (with `worker_flags`), registered.
async fn pool(extra: &[&str], worker_flags: &[&str]) -> (Frontend, common::Worker) {
    let fe = Frontend::secured(extra);
    let w = worker(Some(fe.events), MODEL, Some(SECRET), worker_flags);
    fe.wait_workers(1, STARTUP).await;
    (fe, w)
}

/// The worker's `/info` (open: the frontend learns a worker's id and
/// incarnation there).
async fn info(fe: &Frontend, w: &common::Worker) -> Value {
    let response = fe.client.get(format!("{}/info", w.http)).send().await.expect("GET /info");
    assert_eq!(response.status(), 200, "/info");
    response.json().await.expect("/info JSON")
}

fn busy_load() -> RankLoad {
    RankLoad { active_decode_blocks: 1024, kv_total_blocks: 1024, ..Default::default() }
}

/// Waits (bounded) until `/v1/models` lists exactly `expected`.
async fn wait_models(fe: &Frontend, expected: &[&str], within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let (models, _) = fe.models().await;
        if models.iter().map(String::as_str).eq(expected.iter().copied()) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "models not forgotten within {within:?}: {} listed ({:?}...)",
            models.len(),
            &models[..models.len().min(5)]
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
