//! `loadgate frontend --engine` end to end against fake engines: small axum
//! servers in this test process (each on its own thread and runtime, on a
//! free 127.0.0.1 port) that serve canned llama.cpp or vLLM `/metrics`,
//! llama.cpp `/slots`, `/v1/models` and completions, driven by the test;
//! the frontend is a real `loadgate` process. Every wait is bounded.
//!
//! The fake engines are in `fake_engine.rs`; the frontend's helpers and the
//! tests are here.

#[path = "../common/mod.rs"]
mod common;
mod fake_engine;
mod hostile;
mod model_change;
mod rank_gaps;

use std::time::{Duration, Instant};

use common::{expect_field, Proc, SECRET};
use fake_engine::{FakeEngine, Kind};
use serde_json::{json, Value};
use sha2::{Digest as _, Sha256};

const MODEL: &str = "fake-model";
/// Generous: the machine is small and shared.
const STARTUP: Duration = Duration::from_secs(30);
const SETTLE: Duration = Duration::from_secs(15);

// ---------------------------------------------------------------------------
// The frontend.

struct Frontend {
    proc: Proc,
    http: String,
    /// `http://` and the admin listener's address.
    admin: String,
    client: reqwest::Client,
}

/// A frontend on free ports with `--engine` for each of `engines`, then `extra`.
fn frontend(engines: &[String], extra: &[&str], env: &[(&str, &str)]) -> Frontend {
    let mut args: Vec<&str> =
        vec!["frontend", "--http-host", "127.0.0.1", "--http-port", "0", "--event-port", "0", "--admin-port", "0"];
    for engine in engines {
        args.extend(["--engine", engine.as_str()]);
    }
    args.extend_from_slice(extra);
    let (proc, line) = common::spawn_within("frontend", &args, env, STARTUP);
    Frontend {
        proc,
        http: format!("http://{}", expect_field(&line, "http")),
        admin: format!("http://{}", expect_field(&line, "admin")),
        client: common::client(),
    }
}

/// The sum of every sample of `name` whose line contains each of `filters`.
fn sum_metric(text: &str, name: &str, filters: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && matches!(l.as_bytes().get(name.len()), Some(b'{' | b' ')))
        .filter(|l| filters.iter().all(|f| l.contains(f)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The worker id the frontend gives `model` on the engine at `url`: the
/// first 8 bytes of SHA-256 over "loadgate-engine\0", the URL, "\0", the model.
fn engine_worker_id(url: &str, model: &str) -> u64 {
    let digest = Sha256::new()
        .chain_update(b"loadgate-engine\0")
        .chain_update(url.as_bytes())
        .chain_update([0])
        .chain_update(model.as_bytes())
        .finalize();
    u64::from_be_bytes(digest[..8].try_into().unwrap())
}

impl Frontend {
    async fn metrics(&self) -> String {
        common::metrics_text(&self.client, &self.http).await
    }

    /// Waits (bounded) until `check(metrics text)` holds.
    async fn wait_metrics(&self, what: &str, check: impl Fn(&str) -> bool) {
        let deadline = Instant::now() + SETTLE;
        loop {
            let text = self.metrics().await;
            if check(&text) {
                return;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}; metrics:\n{text}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// `POST /busy_threshold` with `body`: its status.
    async fn set_thresholds(&self, body: Value) -> u16 {
        let response = self.client.post(format!("{}/busy_threshold", self.admin)).json(&body).send().await.unwrap();
        response.status().as_u16()
    }

    async fn health(&self) -> Value {
        let response = self.client.get(format!("{}/health", self.http)).send().await.unwrap();
        response.json().await.unwrap()
    }

    async fn model_ids(&self) -> Vec<String> {
        let list: Value =
            self.client.get(format!("{}/v1/models", self.http)).send().await.unwrap().json().await.unwrap();
        let mut ids: Vec<String> =
            list["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap().to_owned()).collect();
        ids.sort();
        ids
    }

    /// A small completion of `model`: its status and body.
    async fn complete(&self, model: &str) -> (u16, String) {
        let body = json!({"model": model, "prompt": "one two three", "max_tokens": 4});
        let response = self.client.post(format!("{}/v1/completions", self.http)).json(&body).send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.text().await.unwrap_or_default())
    }
}

// ---------------------------------------------------------------------------
// Tests.

/// Without `model=` every id of the engine's `/v1/models` becomes a worker
/// (the id is the documented hash); with `model=` that one, and
/// `/v1/models` is never asked. The `--worker` health check leaves engines
/// alone (the fakes serve no `/health`). The variable takes `;`-separated
/// engines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_register_from_v1_models_or_model_option() {
    let _box = common::shared().await;
    let listing = FakeEngine::start(Kind::LlamaCpp, &["models/a.gguf", "b"]);
    let named = FakeEngine::start(Kind::LlamaCpp, &["never-listed"]);
    let engines = [listing.spec(None), named.spec(Some("named"))];
    let fe = frontend(&engines, &["--worker-health-check-ms", "50"], &[]);
    assert_eq!(fe.model_ids().await, ["b", "models/a.gguf", "named"]);
    // Two failed health checks would take a worker out: 50 ms apart.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let health = fe.health().await;
    assert_eq!(health["workers"], 3, "{health}");
    assert_eq!(health["live_workers"], 3, "{health}");
    assert_eq!(FakeEngine::count(&named.shared.model_lists), 0, "model= needs no /v1/models");
    let text = fe.metrics().await;
    for (url, model) in [(listing.url(), "models/a.gguf"), (listing.url(), "b"), (named.url(), "named")] {
        let id = format!("worker_id=\"{}\"", engine_worker_id(&url, model));
        assert!(text.contains(&id), "no {id} for {model}:\n{text}");
    }
    // A served request names the engine that answered.
    let (status, body) = fe.complete("named").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(&format!("engine-{}", named.addr.port())), "{body}");
    drop(fe);

    let joined = engines.join(";");
    let fe = frontend(&[], &[], &[("LOADGATE_FRONTEND_ENGINE", &joined)]);
    assert_eq!(fe.model_ids().await, ["b", "models/a.gguf", "named"]);
}

/// An engine whose scrapes fail at start is waited for (retried, logged):
/// the frontend starts serving once the engine answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_starts_late_is_waited_for() {
    let _box = common::shared().await;
    let engine = FakeEngine::start(Kind::LlamaCpp, &[MODEL]);
    engine.set(|l| l.fail = true);
    let spec = engine.spec(None);
    let opened = tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        (frontend(&[spec], &[], &[("RUST_LOG", "info")]), started)
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    engine.set(|l| l.fail = false);
    let (fe, started) = opened.await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(1400), "the frontend did not wait for the engine");
    assert!(fe.proc.wait_log("engine not ready; retrying", SETTLE), "{}", fe.proc.stderr());
    assert_eq!(fe.health().await["live_workers"], 1);
}

/// Each rank's scraped load reaches the router: vLLM's two `engine` ranks
/// become dp ranks 0 and 1 with their waiting requests and KV blocks
/// (`num_gpu_blocks` 1000), and a change shows at the next scrapes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scraped_load_reaches_the_router_per_rank() {
    let _box = common::shared().await;
    let engine = FakeEngine::start(Kind::Vllm, &[MODEL]);
    engine.set(|l| l.vllm_ranks = vec![(3, 0.25), (5, 0.5)]);
    let fe = frontend(&[engine.spec(None)], &["--engine-scrape-interval-ms", "20"], &[]);
    let id = format!("worker_id=\"{}\"", engine_worker_id(&engine.url(), MODEL));
    let text = fe.metrics().await;
    let rank = |r: u32| format!("dp_rank=\"{r}\"");
    for (name, r0, r1) in [
        ("loadgate_frontend_worker_waiting_requests", 3.0, 5.0),
        ("loadgate_frontend_worker_kv_total_blocks", 1000.0, 1000.0),
        ("dynamo_frontend_worker_active_decode_blocks", 250.0, 500.0),
    ] {
        assert_eq!(sum_metric(&text, name, &[&id, &rank(0)]), r0, "{name} rank 0:\n{text}");
        assert_eq!(sum_metric(&text, name, &[&id, &rank(1)]), r1, "{name} rank 1:\n{text}");
    }
    engine.set(|l| l.vllm_ranks = vec![(0, 0.0), (9, 0.75)]);
    fe.wait_metrics("the new load", |m| {
        sum_metric(m, "loadgate_frontend_worker_waiting_requests", &[&id, &rank(1)]) == 9.0
            && sum_metric(m, "loadgate_frontend_worker_waiting_requests", &[&id, &rank(0)]) == 0.0
            && sum_metric(m, "dynamo_frontend_worker_active_decode_blocks", &[&id, &rank(1)]) == 750.0
    })
    .await;
}

/// An engine that comes back with another number of ranks (restarted with
/// another data-parallel size) is registered again with that many, its
/// load reset and then scraped per rank.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_with_a_new_rank_count_is_registered_again() {
    let _box = common::shared().await;
    let engine = FakeEngine::start(Kind::Vllm, &[MODEL]);
    engine.set(|l| l.vllm_ranks = vec![(4, 0.5)]);
    let fe = frontend(&[engine.spec(None)], &["--engine-scrape-interval-ms", "20"], &[]);
    let id = format!("worker_id=\"{}\"", engine_worker_id(&engine.url(), MODEL));
    let waiting = |m: &str, rank: u32| {
        sum_metric(m, "loadgate_frontend_worker_waiting_requests", &[&id, &format!("dp_rank=\"{rank}\"")])
    };
    assert_eq!(waiting(&fe.metrics().await, 0), 4.0);
    engine.set(|l| l.vllm_ranks = vec![(1, 0.5), (2, 0.5), (3, 0.5)]);
    fe.wait_metrics("three ranks", |m| waiting(m, 0) == 1.0 && waiting(m, 1) == 2.0 && waiting(m, 2) == 3.0).await;
    // The log line may trail the metrics by a moment (stderr is read by a thread).
    assert!(fe.proc.wait_log("registered again", SETTLE), "{}", fe.proc.stderr());
    assert_eq!(fe.health().await["live_workers"], 1);
    assert_eq!(fe.complete(MODEL).await.0, 200);
}

/// K failed scrapes in a row (500s, then timeouts) take an engine out of
/// routing, its requests go to the other engine, and the next successful
/// scrape brings it back. Fewer than K leave it in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k_failed_scrapes_take_an_engine_out_and_a_success_brings_it_back() {
    let _box = common::shared().await;
    let flaky = FakeEngine::start(Kind::LlamaCpp, &[MODEL]);
    let steady = FakeEngine::start(Kind::LlamaCpp, &[MODEL]);
    let fe = frontend(
        &[flaky.spec(None), steady.spec(None)],
        &[
            "--engine-scrape-interval-ms",
            "30",
            "--engine-scrape-timeout-ms",
            "200",
            "--engine-scrape-failures",
            "3",
            "--router-mode",
            "round-robin",
        ],
        &[],
    );
    let out = |m: &str| sum_metric(m, "loadgate_frontend_workers_out_of_routing", &[]);
    for failure in ["500", "timeout"] {
        let before = FakeEngine::count(&flaky.shared.failed_scrapes);
        flaky.set(|l| if failure == "500" { l.fail = true } else { l.stall = true });
        fe.wait_metrics(&format!("the engine out of routing ({failure})"), |m| out(m) == 1.0).await;
        let failed = FakeEngine::count(&flaky.shared.failed_scrapes) - before;
        assert!(failed >= 3, "out of routing after {failed} failed scrapes ({failure}); K is 3");
        assert_eq!(fe.health().await["live_workers"], 1);
        let flaky_before = flaky.received().len();
        for _ in 0..6 {
            let (status, body) = fe.complete(MODEL).await;
            assert_eq!(status, 200, "{body}");
            assert!(body.contains(&format!("engine-{}", steady.addr.port())), "routed to the engine out: {body}");
        }
        assert_eq!(flaky.received().len(), flaky_before);
        flaky.set(|l| (l.fail, l.stall) = (false, false));
        fe.wait_metrics(&format!("the engine back ({failure})"), |m| out(m) == 0.0).await;
        let mut served_by = std::collections::HashSet::new();
        for _ in 0..6 {
            let (status, body) = fe.complete(MODEL).await;
            assert_eq!(status, 200, "{body}");
            served_by.insert(body.contains(&format!("engine-{}", flaky.addr.port())));
        }
        assert_eq!(served_by.len(), 2, "round robin over both engines again");
    }
    let failures = sum_metric(&fe.metrics().await, "loadgate_frontend_engine_scrape_failures_total", &[]);
    assert!(failures >= 6.0, "{failures} failed scrapes counted");
    assert!(fe.proc.wait_log("engine scrapes failing: out of routing", SETTLE), "{}", fe.proc.stderr());
    let log = fe.proc.stderr();
    assert!(log.contains("failures=3"), "{log}");

    // One or two failures in a row (fewer than K) leave the engine in.
    flaky.set(|l| l.fail = true);
    flaky.wait_scrapes(1).await;
    flaky.set(|l| l.fail = false);
    flaky.wait_scrapes(3).await;
    assert_eq!(out(&fe.metrics().await), 0.0);
}

/// Shedding on the engines' own queues: with both engines' waiting requests
/// past `--active-waiting-requests-threshold`, the frontend answers 529 with
/// a retry hint and counts it; when one drains, requests are served by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sheds_529_when_every_engine_waits_past_the_threshold() {
    let _box = common::shared().await;
    let a = FakeEngine::start(Kind::LlamaCpp, &[MODEL]);
    let b = FakeEngine::start(Kind::LlamaCpp, &[MODEL]);
    let fe = frontend(
        &[a.spec(None), b.spec(None)],
        &["--engine-scrape-interval-ms", "20", "--active-waiting-requests-threshold", "2"],
        &[],
    );
    assert_eq!(fe.complete(MODEL).await.0, 200);
    for engine in [&a, &b] {
        engine.set(|l| (l.running, l.waiting, l.slot_tokens) = (4, 5, 100));
    }
    let busy = |m: &str| sum_metric(m, "loadgate_frontend_worker_busy", &[]);
    fe.wait_metrics("both engines busy", |m| busy(m) == 2.0).await;
    let text = fe.metrics().await;
    assert_eq!(sum_metric(&text, "loadgate_frontend_worker_waiting_requests", &[]), 10.0, "{text}");
    // llama.cpp: KV total = Σ n_ctx, active = Σ n_ctx of the processing slots
    // (a busy slot holds its whole context, whatever its 100 tokens).
    assert_eq!(sum_metric(&text, "loadgate_frontend_worker_kv_total_blocks", &[]), 2.0 * 4.0 * 512.0, "{text}");
    assert_eq!(sum_metric(&text, "dynamo_frontend_worker_active_decode_blocks", &[]), 2.0 * 4.0 * 512.0, "{text}");
    let served_before = a.received().len() + b.received().len();
    let response = fe
        .client
        .post(format!("{}/v1/completions", fe.http))
        .json(&json!({"model": MODEL, "prompt": "hello", "max_tokens": 4}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 529);
    assert!(response.headers().contains_key("retry-after"));
    assert_eq!(a.received().len() + b.received().len(), served_before, "a shed request reaches no engine");
    let text = fe.metrics().await;
    assert_eq!(sum_metric(&text, "dynamo_frontend_model_rejection_total", &[MODEL]), 1.0, "{text}");

    b.set(|l| (l.running, l.waiting) = (1, 0));
    fe.wait_metrics("engine b free", |m| busy(m) == 1.0).await;
    for _ in 0..3 {
        let (status, body) = fe.complete(MODEL).await;
        assert_eq!(status, 200, "{body}");
        assert!(body.contains(&format!("engine-{}", b.addr.port())), "{body}");
    }
}

/// `--active-decode-blocks-threshold 0.85` on llama.cpp: an engine is busy
/// exactly when none of its 4 slots is free (3 of 4 processing is 0.75 of
/// the context held, 4 of 4 is all of it), however few tokens the slots
/// hold and with nothing deferred.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_llamacpp_engine_is_busy_at_0_85_exactly_when_no_slot_is_free() {
    let _box = common::shared().await;
    let engine = FakeEngine::start(Kind::LlamaCpp, &[MODEL]);
    let fe = frontend(
        &[engine.spec(None)],
        &["--engine-scrape-interval-ms", "20", "--active-decode-blocks-threshold", "0.85"],
        &[],
    );
    let busy = |m: &str| sum_metric(m, "loadgate_frontend_worker_busy", &[]);
    engine.set(|l| (l.running, l.waiting, l.slot_tokens) = (3, 0, 1));
    fe.wait_metrics("3 of 4 slots processing", |m| {
        sum_metric(m, "dynamo_frontend_worker_active_decode_blocks", &[]) == 3.0 * 512.0
    })
    .await;
    assert_eq!(busy(&fe.metrics().await), 0.0, "a slot is free");
    assert_eq!(fe.complete(MODEL).await.0, 200);
    engine.set(|l| (l.running, l.waiting, l.slot_tokens) = (4, 0, 1));
    fe.wait_metrics("no slot free: busy", |m| busy(m) == 1.0).await;
    assert_eq!(fe.complete(MODEL).await.0, 529);
    engine.set(|l| l.running = 3);
    fe.wait_metrics("a slot freed: free again", |m| busy(m) == 0.0).await;
    assert_eq!(fe.complete(MODEL).await.0, 200);
}

/// `--engine-dispatch-ahead-tokens 4`: with every slot of a llama.cpp engine
/// processing, the engine is free while each slot is at most 4 tokens from
/// its output limit (`n_remain` 4) and busy at 5 or with no limit (-1); a
/// frontend without the flag finds it busy throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_llamacpp_slot_near_its_output_limit_counts_free_with_dispatch_ahead() {
    let _box = common::shared().await;
    let engine = FakeEngine::start(Kind::LlamaCpp, &[MODEL]);
    let flags = ["--engine-scrape-interval-ms", "20", "--active-decode-blocks-threshold", "0.85"];
    let ahead = frontend(&[engine.spec(None)], &[&flags[..], &["--engine-dispatch-ahead-tokens", "4"]].concat(), &[]);
    let plain = frontend(&[engine.spec(None)], &flags, &[]);
    let busy = |m: &str| sum_metric(m, "loadgate_frontend_worker_busy", &[]);
    let active = |m: &str| sum_metric(m, "dynamo_frontend_worker_active_decode_blocks", &[]);
    engine.set(|l| (l.running, l.waiting, l.remain) = (4, 0, Some(4)));
    ahead.wait_metrics("4 tokens left in every slot: all counted free", |m| active(m) == 0.0).await;
    plain.wait_metrics("without the flag: every slot held", |m| active(m) == 4.0 * 512.0).await;
    assert_eq!(busy(&ahead.metrics().await), 0.0);
    assert_eq!(busy(&plain.metrics().await), 1.0);
    assert_eq!(ahead.complete(MODEL).await.0, 200);
    assert_eq!(plain.complete(MODEL).await.0, 529);
    engine.set(|l| l.remain = Some(5));
    ahead.wait_metrics("5 tokens left: busy", |m| busy(m) == 1.0).await;
    assert_eq!(active(&ahead.metrics().await), 4.0 * 512.0);
    assert_eq!(ahead.complete(MODEL).await.0, 529);
    engine.set(|l| l.remain = Some(0));
    ahead.wait_metrics("0 left: free again", |m| busy(m) == 0.0).await;
    engine.set(|l| l.remain = Some(-1));
    ahead.wait_metrics("no limit: never ending", |m| busy(m) == 1.0).await;
    assert_eq!(ahead.complete(MODEL).await.0, 529);
}

/// `--engine-scrape-on-end`: the end of a request scrapes its engine at
/// once, where the periodic scrape (every 10 minutes here) would not come
/// within the test; without the flag, the same request brings no scrape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_end_of_a_request_scrapes_its_engine_with_scrape_on_end() {
    let _box = common::shared().await;
    for on_end in [true, false] {
        let engine = FakeEngine::start(Kind::LlamaCpp, &[MODEL]);
        let mut extra = vec!["--engine-scrape-interval-ms", "600000"];
        if on_end {
            extra.push("--engine-scrape-on-end");
        }
        let fe = frontend(&[engine.spec(None)], &extra, &[]);
        // The start's scrape and the scraper's first: then none for 10 minutes.
        let scraped = |n: usize| {
            let engine = &engine;
            async move {
                let deadline = Instant::now() + SETTLE;
                while engine.scrapes() < n {
                    assert!(Instant::now() < deadline, "the engine was not scraped {n} times");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        };
        scraped(2).await;
        let mut before = engine.scrapes();
        loop {
            tokio::time::sleep(Duration::from_millis(300)).await;
            if engine.scrapes() == before {
                break;
            }
            before = engine.scrapes();
        }
        assert_eq!(fe.complete(MODEL).await.0, 200);
        if on_end {
            scraped(before + 1).await;
        } else {
            // A second is nothing to a 10-minute interval: a scrape now
            // could only come from the request.
            tokio::time::sleep(Duration::from_secs(1)).await;
            assert_eq!(engine.scrapes(), before, "no scrape without the flag");
        }
    }
}

/// A scrape counts for the waiting line from when it was sent: one sent
/// before the line dispatched a request to its engine, and answered after
/// with a free slot, does not free that engine for a second waiter (its
/// answer cannot show the request just sent). The dispatch comes from
/// something other than a scrape: the threshold raised to 1 and set back
/// through the admin API while the scrape's `/slots` is held. (Not
/// cleared: with no threshold nothing is busy, and the whole line goes.) A scrape sent
/// after the dispatch does free it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_sent_before_a_dispatch_does_not_free_the_engine_for_another_waiter() {
    let _box = common::shared().await;
    let engine = FakeEngine::start(Kind::LlamaCpp, &[MODEL]);
    engine.set(|l| (l.running, l.slot_tokens) = (4, 1));
    let fe = frontend(
        &[engine.spec(None)],
        &[
            "--engine-scrape-interval-ms",
            "20",
            "--engine-scrape-timeout-ms",
            "30000",
            "--active-decode-blocks-threshold",
            "0.85",
            "--router-queue-timeout-ms",
            "30000",
        ],
        &[],
    );
    let busy = |m: &str| sum_metric(m, "loadgate_frontend_worker_busy", &[]);
    let waiting = |m: &str| sum_metric(m, "loadgate_frontend_queue_waiting", &[]);
    fe.wait_metrics("no slot free: busy", |m| busy(m) == 1.0).await;
    let send = || {
        let (client, url) = (fe.client.clone(), format!("{}/v1/completions", fe.http));
        tokio::spawn(async move {
            let body = json!({"model": MODEL, "prompt": "one two", "max_tokens": 4});
            client.post(url).json(&body).send().await.unwrap().status().as_u16()
        })
    };
    let (first, second) = (send(), send());
    fe.wait_metrics("two waiting", |m| waiting(m) == 2.0).await;

    // A scrape in flight: sent while nothing was dispatched.
    let held = engine.hold_next_slots();
    tokio::time::timeout(SETTLE, held.arrived).await.expect("a scrape arrives").unwrap();
    // Raised to 1 (every slot in use is not over it): the engine is free,
    // the line dispatches one waiter to it (and only one: the engine has
    // not reported since). Set back: busy by its last report.
    assert_eq!(fe.set_thresholds(json!({"model": MODEL, "active_decode_blocks_threshold": 1.0})).await, 200);
    fe.wait_metrics("one dispatched", |m| waiting(m) == 1.0).await;
    assert_eq!(fe.set_thresholds(json!({"model": MODEL, "active_decode_blocks_threshold": 0.85})).await, 200);
    fe.wait_metrics("busy again", |m| busy(m) == 1.0).await;
    engine.wait_received(1).await;

    // The held scrape answers a slot free; then every scrape shows none.
    held.release.send(3).unwrap();
    engine.wait_scrapes(3).await;
    let text = fe.metrics().await;
    assert_eq!(
        waiting(&text),
        1.0,
        "the scrape sent before the dispatch freed the engine for the second waiter\n{text}"
    );
    assert_eq!(engine.received().len(), 1);

    // A scrape sent after the dispatch that shows a free slot serves it.
    engine.set(|l| l.running = 3);
    assert_eq!(tokio::time::timeout(SETTLE, second).await.expect("served").unwrap(), 200);
    assert_eq!(tokio::time::timeout(SETTLE, first).await.expect("served").unwrap(), 200);
    assert_eq!(engine.received().len(), 2);
}

/// Completions and streamed chats go to the engine's same path with the
/// body as sent (a non-streamed one streamed: llama.cpp) and no request
/// proof (even with an event secret), and come back whole; while a request is in flight the router tracks its prompt
/// words as prefill on the engine (engines do not report prefill), released
/// when the answer comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxies_to_the_engine_and_tracks_prefill_meanwhile() {
    let _box = common::shared().await;
    let engine = FakeEngine::start(Kind::LlamaCpp, &[MODEL]);
    let fe = frontend(&[engine.spec(None)], &[], &[("LOADGATE_EVENT_SECRET", SECRET)]);
    let body = json!({"model": MODEL, "prompt": "one two three", "max_tokens": 4}).to_string();
    let response = fe
        .client
        .post(format!("{}/v1/completions", fe.http))
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["choices"][0]["text"], format!("engine-{} more", engine.addr.port()));
    let chat = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": true});
    let response = fe.client.post(format!("{}/v1/chat/completions", fe.http)).json(&chat).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let sse = response.text().await.unwrap();
    assert!(sse.contains(&format!("engine-{}", engine.addr.port())) && sse.ends_with("data: [DONE]\n\n"), "{sse}");
    let received = engine.received();
    assert_eq!(received.len(), 2);
    assert_eq!(received[0].path, "/v1/completions");
    // llama.cpp gets a non-streamed request streamed (so that a client that
    // leaves frees its slot), and the answer above came back whole.
    let mut streamed: Value = serde_json::from_str(&body).unwrap();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let sent: Value = serde_json::from_slice(&received[0].body).unwrap();
    assert_eq!(sent, streamed, "the client's body, streamed");
    assert_eq!(answer["object"], "text_completion", "{answer}");
    assert_eq!(received[1].path, "/v1/chat/completions");
    assert!(received.iter().all(|r| !r.had_proof), "no request proof to an engine");
    // llama.cpp closes a finished stream's connection unannounced: none is reused.
    assert!(received.iter().all(|r| r.closes), "every completion to llama.cpp on a connection of its own");

    engine.set(|l| l.answer_after = Duration::from_millis(1500));
    let id = format!("worker_id=\"{}\"", engine_worker_id(&engine.url(), MODEL));
    let words = vec!["word"; 37].join(" ");
    let client = fe.client.clone();
    let url = format!("{}/v1/completions", fe.http);
    let pending = tokio::spawn(async move {
        client.post(url).json(&json!({"model": MODEL, "prompt": words, "max_tokens": 4})).send().await.unwrap().status()
    });
    fe.wait_metrics("the prompt tracked as prefill", |m| {
        sum_metric(m, "dynamo_frontend_worker_active_prefill_tokens", &[&id]) == 37.0
            && sum_metric(m, "loadgate_frontend_tracked_prefill_tokens", &[]) == 37.0
    })
    .await;
    assert_eq!(pending.await.unwrap(), 200);
    let text = fe.metrics().await;
    assert_eq!(sum_metric(&text, "loadgate_frontend_tracked_prefill_tokens", &[]), 0.0, "{text}");
    assert_eq!(sum_metric(&text, "dynamo_frontend_worker_active_prefill_tokens", &[&id]), 0.0, "{text}");
}
