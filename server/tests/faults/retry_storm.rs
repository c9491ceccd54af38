//! The retry storm (issue 10, Found 5): clients that honour `Retry-After`
//! retry in lockstep when every refusal says "1 s", a storm by
//! construction; the computed hint spreads them.
//!
//! A frontend in `kv` mode with 2 simulated workers (256 KV blocks each,
//! 20 ms steps) that counts a worker busy past half its blocks
//! (`--active-decode-blocks-threshold 0.5`; in `kv` mode the frontend counts
//! the blocks of what it dispatched itself, so it refuses the burst at once,
//! without waiting for load reports; 64 prompt tokens are 4 blocks, so
//! about 64 requests of 20 output tokens run at once, roughly 100 to 150
//! finish per second on this machine) serves a short warm-up, then takes a
//! burst of [`CLIENTS`] clients from `loadgate bench --retry-storm`; twice,
//! each on a fresh pool: with `--retry-after-mode constant` and `computed`.
//! Asserted: every client succeeds, every refusal carries a hint, the peak
//! number of retries in any 10 ms window falls to at most a fifth (the
//! issue's target), and goodput and the median time to success stay within
//! [`GOODPUT_FLOOR`] and [`MEDIAN_CEILING`] of the constant run's. Both runs'
//! figures are printed (the bench's whole `--json` summary, with a retry
//! timeline per 100 ms).
//!
//! Run: `cargo test -p loadgate-server --test faults retry_storm -- --nocapture`.

use std::time::Duration;

use serde_json::Value;

use crate::common::{self, Frontend, Proc};

const MODEL: &str = "storm-model";
/// The workers' engine step, ms.
const STEP_MS: &str = "20";
/// Clients in the burst.
const CLIENTS: &str = "400";
/// The storm's bound (`--duration`): no attempt starts after it.
const STORM_SECS: &str = "10";
/// How long the bench may take in all: connecting, the storm, its drain.
const BENCH_WITHIN: Duration = Duration::from_secs(14);
/// Requests served before the storm, and how many at a time (well under
/// the threshold: none is refused).
const WARM_UP_REQUESTS: usize = 64;
const WARM_UP_AT_ONCE: usize = 16;
/// The computed hint's peak of retries in 10 ms, at most the constant one's
/// divided by this (the target).
const PEAK_DIVISOR: f64 = 5.0;
/// Goodput with the computed hint, at least this times the constant one's.
const GOODPUT_FLOOR: f64 = 0.9;
/// Median time to success with the computed hint, at most this times the
/// constant one's.
const MEDIAN_CEILING: f64 = 1.1;

/// A frontend with `--retry-after-mode mode` and its two workers.
struct Pool {
    frontend: Frontend,
    _workers: Vec<Proc>,
}

async fn pool(mode: &str) -> Pool {
    let frontend = Frontend::start(
        None,
        &["--retry-after-mode", mode, "--router-mode", "kv", "--active-decode-blocks-threshold", "0.5"],
    );
    let flags = ["--kv-total-blocks", "256", "--decode-step-ms", STEP_MS];
    let workers = (0..2).map(|_| common::worker(Some(frontend.events), MODEL, None, &flags).proc).collect();
    frontend.wait_workers(2, Duration::from_secs(10)).await;
    warm_up(&frontend).await;
    Pool { frontend, _workers: workers }
}

/// Serves [`WARM_UP_REQUESTS`] requests like the storm's, [`WARM_UP_AT_ONCE`]
/// at a time, so the storm meets a frontend that has been serving (the
/// computed hint learns how long requests take from the ones that finish).
async fn warm_up(frontend: &Frontend) {
    let body = serde_json::json!({"model": MODEL, "prompt": vec!["hello"; 64].join(" "), "max_tokens": 20});
    let url = format!("{}/v1/completions", frontend.http);
    for _ in 0..WARM_UP_REQUESTS / WARM_UP_AT_ONCE {
        let sends = (0..WARM_UP_AT_ONCE).map(|_| frontend.client.post(&url).json(&body).send());
        for answer in futures_util::future::join_all(sends).await {
            let status = answer.map(|r| r.status().as_u16()).unwrap_or_else(|e| panic!("warm-up request: {e}"));
            assert_eq!(status, 200, "a warm-up request was refused");
        }
    }
}

/// Runs the storm against a fresh pool in `mode`; the bench's `--json` summary.
async fn storm(mode: &str) -> Value {
    let pool = pool(mode).await;
    let summary = common::retry_storm(&[&pool.frontend.http], MODEL, CLIENTS, STORM_SECS, BENCH_WITHIN);
    eprintln!("retry storm, {mode}: {summary}");
    summary
}

/// `summary[key]` as a number.
fn num(summary: &Value, key: &str) -> f64 {
    summary[key].as_f64().unwrap_or_else(|| panic!("no number {key} in {summary}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn computed_retry_after_spreads_a_retry_storm() {
    let _serial = common::exclusive().await;
    let constant = storm("constant").await;
    let computed = storm("computed").await;

    let figures = |s: &Value| {
        (
            num(s, "peak_retries_10ms"),
            num(s, "retries"),
            num(s, "goodput_rps"),
            num(&s["time_to_success_ms"], "p50"),
            num(&s["time_to_success_ms"], "p99"),
        )
    };
    let (c_peak, c_retries, c_goodput, c_median, c_p99) = figures(&constant);
    let (h_peak, h_retries, h_goodput, h_median, h_p99) = figures(&computed);
    eprintln!(
        "retry storm of {CLIENTS} clients: constant: peak {c_peak} retries / 10 ms, {c_retries} retries, goodput \
         {c_goodput:.1} req/s, time to success p50 {c_median:.0} ms p99 {c_p99:.0} ms; computed: peak {h_peak}, \
         {h_retries} retries, goodput {h_goodput:.1} req/s, p50 {h_median:.0} ms p99 {h_p99:.0} ms"
    );
    for (mode, s) in [("constant", &constant), ("computed", &computed)] {
        assert_eq!(num(s, "succeeded"), num(s, "clients"), "{mode}: every client succeeds: {s}");
        let statuses: Vec<&String> = s["by_status"].as_object().map(|m| m.keys().collect()).unwrap_or_default();
        assert!(statuses.iter().all(|k| matches!(k.as_str(), "200" | "529" | "503")), "{mode}: statuses {statuses:?}");
        assert_eq!(num(s, "unhinted_refusals"), 0.0, "{mode}: every refusal carries a hint");
    }
    // The burst must overload the pool, or there is no storm to spread.
    assert!(c_peak >= 20.0, "the constant hint makes a storm: peak {c_peak} retries in 10 ms");
    assert!(h_peak <= c_peak / PEAK_DIVISOR, "computed peak {h_peak} > constant peak {c_peak} / {PEAK_DIVISOR}");
    assert!(
        h_goodput >= GOODPUT_FLOOR * c_goodput,
        "computed goodput {h_goodput:.1} < {GOODPUT_FLOOR} x constant {c_goodput:.1}"
    );
    assert!(
        h_median <= MEDIAN_CEILING * c_median,
        "computed median {h_median:.0} ms > {MEDIAN_CEILING} x constant {c_median:.0} ms"
    );
}
