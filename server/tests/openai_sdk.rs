//! The official OpenAI Python SDK (pinned in `.ci/requirements-openai.txt`)
//! with its default client outlasts a 2 s overload (issue 23).
//!
//! The default client retries twice and waits what `retry-after-ms` says
//! (when in (0, 60 s]); with the hints of 50–150 ms sent before issue 23 it
//! gave up 0.17 s into an overload. Every hint is now at least 1 s, so its
//! three attempts span at least 2 s.
//!
//! A real `loadgate frontend` (no flag: no waiting line) and its only real
//! simulated `loadgate worker`, which runs one long stream sent to it
//! directly (so it holds decode blocks). The test flips the worker busy with
//! the admin API (`POST /busy_threshold`, decode-blocks threshold 0, which
//! takes effect at once), starts `server/tests/openai_sdk.py`, watches the
//! frontend's `dynamo_frontend_model_rejection_total` for the client's first
//! 529 and frees the worker (threshold cleared) 2 s after it. The SDK must
//! get its completion, after at least one 529.
//!
//! Ignored in a plain `cargo test` (it needs the Python package); `.ci/run`
//! installs the pin into a virtualenv and runs it with `--ignored`, pointing
//! `LOADGATE_OPENAI_PYTHON` at that interpreter. Without it the test fails:
//! it never skips.

mod common;

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use serde_json::{json, Value};

const MODEL: &str = "sdk-model";
/// How long the frontend may take to see its worker and its load.
const SETTLE: Duration = Duration::from_secs(15);
/// How long the worker stays busy after the client's first 529.
const BUSY: Duration = Duration::from_secs(2);
/// How long the client may take in all (importing the SDK included).
const CLIENT_WITHIN: Duration = Duration::from_secs(60);
/// The interpreter with the pinned SDK.
const PYTHON_ENV: &str = "LOADGATE_OPENAI_PYTHON";

/// The pinned version, from `.ci/requirements-openai.txt`.
fn pinned_version() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../.ci/requirements-openai.txt");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    text.lines()
        .find_map(|l| l.trim().strip_prefix("openai=="))
        .unwrap_or_else(|| panic!("no openai== pin in {path}"))
        .trim()
        .to_owned()
}

/// Holds one long stream on `worker` (sent to it directly) until aborted.
fn hold(worker: &common::Worker) -> tokio::task::JoinHandle<()> {
    let client = common::long_client();
    let url = format!("{}/v1/completions", worker.http);
    tokio::spawn(async move {
        let body = json!({"model": MODEL, "prompt": "hold this worker", "max_tokens": 4000, "stream": true});
        let response = client.post(url).json(&body).send().await.expect("the held stream");
        assert_eq!(response.status().as_u16(), 200, "the held stream");
        let mut chunks = response.bytes_stream();
        while let Some(Ok(_)) = chunks.next().await {}
    })
}

/// The sum of `name`'s samples in the frontend's `/metrics` (0 if absent).
async fn metric(frontend: &common::Frontend, name: &str) -> f64 {
    common::metric(&common::metrics_text(&frontend.client, &frontend.http).await, name).unwrap_or(0.0)
}

/// Sets the model's decode-blocks threshold (`None`: cleared) through the
/// admin API.
async fn decode_threshold(frontend: &common::Frontend, threshold: Option<f64>) {
    let admin = frontend.admin.as_deref().expect("the admin listener");
    let body = json!({"model": MODEL, "active_decode_blocks_threshold": threshold});
    let response =
        frontend.client.post(format!("{admin}/busy_threshold")).json(&body).send().await.expect("POST /busy_threshold");
    let status = response.status().as_u16();
    let reply: Value = response.json().await.unwrap_or(Value::Null);
    assert_eq!(status, 200, "POST /busy_threshold {body}: {reply}");
    assert_eq!(reply["active_decode_blocks_threshold"], json!(threshold), "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the openai Python package (.ci/requirements-openai.txt) in LOADGATE_OPENAI_PYTHON; .ci/run runs it"]
async fn a_default_openai_sdk_client_outlasts_a_two_second_overload() {
    let python = std::env::var(PYTHON_ENV).unwrap_or_else(|_| {
        panic!("{PYTHON_ENV} is not set: point it at a python with openai=={} (.ci/run installs one)", pinned_version())
    });
    let frontend = common::Frontend::start(None, &[]);
    let worker = common::worker(Some(frontend.events), MODEL, None, &["--decode-step-ms", "10"]);
    frontend.wait_workers(1, SETTLE).await;
    let held = hold(&worker);
    let deadline = Instant::now() + SETTLE;
    while metric(&frontend, "dynamo_frontend_worker_active_decode_blocks").await == 0.0 {
        assert!(Instant::now() < deadline, "the frontend never saw the held stream's decode blocks");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let rejections = "dynamo_frontend_model_rejection_total";
    assert_eq!(metric(&frontend, rejections).await, 0.0, "nothing refused yet");

    // Busy: any decode block counts.
    decode_threshold(&frontend, Some(0.0)).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/openai_sdk.py");
    let mut child = Command::new(&python)
        .args([script, &frontend.http, MODEL])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {python}: {e} (set {PYTHON_ENV})"));
    let pid = child.id();
    let stdout = child.stdout.take().expect("stdout");
    let lines = std::thread::spawn(move || BufReader::new(stdout).lines().map_while(Result::ok).collect::<Vec<_>>());
    let done = tokio::task::spawn_blocking(move || child.wait_with_output());

    // The client's first 529, as /metrics counts it; the worker stays busy
    // for BUSY after it.
    let started = Instant::now();
    let first = loop {
        if metric(&frontend, rejections).await >= 1.0 {
            break Instant::now();
        }
        if started.elapsed() > CLIENT_WITHIN || done.is_finished() {
            common::signal(pid, "KILL");
            panic!("the client was never refused (it ended or took over {CLIENT_WITHIN:?})");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    tokio::time::sleep_until((first + BUSY).into()).await;
    decode_threshold(&frontend, None).await;
    let freed = first.elapsed();

    let output = match tokio::time::timeout(CLIENT_WITHIN, done).await {
        Ok(output) => output.expect("the client's wait").expect("the client's output"),
        Err(_) => {
            common::signal(pid, "KILL");
            panic!("the client did not end within {CLIENT_WITHIN:?}");
        }
    };
    let lines = lines.join().expect("the client's stdout");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let refused = metric(&frontend, rejections).await;
    eprintln!("client stdout: {lines:?}; refused {refused} times; worker freed {freed:?} after the first 529");
    assert!(output.status.success(), "the SDK did not get its completion ({}):\n{stderr}", output.status);
    let summary: Value = lines
        .iter()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON line from the client: {lines:?}\n{stderr}"));
    assert_eq!(summary["version"], pinned_version().as_str(), "{python} has another openai than the pin");
    assert_eq!(summary["max_retries"], 2, "the SDK's default client: {summary}");
    assert!(summary["text"].as_str().is_some(), "a completion: {summary}");
    // At least one 529 before the success; the SDK makes 3 attempts at most.
    assert!((1.0..=2.0).contains(&refused), "the SDK was refused {refused} times");
    let took = summary["seconds"].as_f64().expect("seconds");
    assert!(took >= BUSY.as_secs_f64(), "the client got its completion after {took} s, inside the busy window");
    held.abort();
}
