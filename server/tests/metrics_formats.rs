//! `/metrics` of a real frontend and worker, read by both parsers of
//! Python's `prometheus_client` (pinned in `.ci/requirements-metrics.txt`):
//! the classic one (text format 0.0.4) reads what a request without
//! `Accept: application/openmetrics-text` gets, the OpenMetrics one reads
//! what a request asking for it gets, and both find every family with its
//! type: no `unknown` family, every counter a counter, as many families as
//! the exposition declares.
//!
//! Ignored in a plain `cargo test` (it needs the Python package); `.ci/run`
//! installs the pin into a virtualenv and runs it with `--ignored`, pointing
//! `LOADGATE_PYTHON` at that interpreter (default `python3`). Without the
//! package the test fails: it never skips.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{BusyWorker, Frontend};
use serde_json::Value;

/// The model a real worker serves.
const MODEL: &str = "formats-model";
/// The model of a fake worker that always reports itself full (529s).
const BUSY_MODEL: &str = "formats-busy";
const SETTLE: Duration = Duration::from_secs(15);
/// What Prometheus 2.x sends (OpenMetrics first).
const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
/// The frontend's families (docs/deployment.md) with their types: 23 on
/// df655a4 too, where the classic parser made one more `unknown` family of
/// every counter sample (57 in the issue's run, 45 or so in this test's).
const FRONTEND_FAMILIES: &[(&str, &str)] = &[
    ("dynamo_frontend_model_rejection", "counter"),
    ("loadgate_frontend_rejection_reason", "counter"),
    ("loadgate_frontend_rejection_class_reason", "counter"),
    ("dynamo_frontend_worker_active_decode_blocks", "gauge"),
    ("dynamo_frontend_worker_active_prefill_tokens", "gauge"),
    ("loadgate_frontend_worker_kv_total_blocks", "gauge"),
    ("loadgate_frontend_worker_waiting_requests", "gauge"),
    ("loadgate_frontend_worker_busy", "gauge"),
    ("loadgate_frontend_inflight_requests", "gauge"),
    ("loadgate_frontend_tracked_blocks", "gauge"),
    ("loadgate_frontend_tracked_prefill_tokens", "gauge"),
    ("loadgate_frontend_workers", "gauge"),
    ("dynamo_frontend_requests", "counter"),
    ("dynamo_frontend_model_cancellation", "counter"),
    ("loadgate_frontend_http_responses", "counter"),
    ("dynamo_frontend_inflight_requests", "gauge"),
    ("dynamo_frontend_time_to_first_token_seconds", "histogram"),
    ("dynamo_frontend_request_duration_seconds", "histogram"),
    ("dynamo_frontend_inter_token_latency_seconds", "histogram"),
    ("loadgate_frontend_upstream_failures", "counter"),
    ("loadgate_frontend_workers_silenced", "counter"),
    ("loadgate_frontend_workers_quarantined", "counter"),
    ("loadgate_frontend_workers_out_of_routing", "gauge"),
    ("loadgate_frontend_engine_scrape_failures", "counter"),
];
/// The worker's.
const WORKER_FAMILIES: &[(&str, &str)] =
    &[("dynamo_rejection_request", "counter"), ("dynamo_engine_request", "gauge"), ("dynamo_request_queue", "gauge")];
const OPENMETRICS_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const PROMETHEUS_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The pinned version, from `.ci/requirements-metrics.txt`.
fn pinned_version() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../.ci/requirements-metrics.txt");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    text.lines()
        .find_map(|l| l.trim().strip_prefix("prometheus-client=="))
        .unwrap_or_else(|| panic!("no prometheus-client== pin in {path}"))
        .trim()
        .to_owned()
}

/// One family as a Python parser returned it.
#[derive(Debug, Clone, PartialEq)]
struct Family {
    name: String,
    kind: String,
    help: String,
    /// `name{sorted labels}` of every sample but `_created`, with its value.
    samples: BTreeMap<String, String>,
}

/// Parses `text` with the `parser` of the pinned prometheus_client: every
/// family, in order. Panics (never skips) without the package.
fn parse(parser: &str, text: &str) -> Vec<Family> {
    let python = std::env::var("LOADGATE_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/metrics_formats.py");
    let mut child = Command::new(&python)
        .args([script, parser])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {python}: {e} (set LOADGATE_PYTHON)"));
    child.stdin.take().expect("stdin").write_all(text.as_bytes()).expect("write the exposition");
    let out = child.wait_with_output().expect("the parser's output");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{python} {parser}: {}: {stderr}\n--- text:\n{text}", out.status);
    let parsed: Value = serde_json::from_slice(&out.stdout).expect("the script's JSON");
    assert_eq!(parsed["version"], pinned_version().as_str(), "{python} has another prometheus-client than the pin");
    let families = parsed["families"].as_array().expect("families");
    families
        .iter()
        .map(|f| {
            let samples = f["samples"].as_array().expect("samples");
            Family {
                name: f["name"].as_str().expect("name").to_owned(),
                kind: f["type"].as_str().expect("type").to_owned(),
                help: f["help"].as_str().expect("help").to_owned(),
                samples: samples
                    .iter()
                    .filter(|s| !s["name"].as_str().unwrap_or("").ends_with("_created"))
                    .map(|s| {
                        let series = format!("{}{}", s["name"].as_str().expect("sample name"), s["labels"]);
                        (series, s["value"].as_str().expect("value").to_owned())
                    })
                    .collect(),
            }
        })
        .collect()
}

/// `(family, type)` of every `# TYPE` line of an OpenMetrics text: the
/// families the exposition declares.
fn declared(openmetrics: &str) -> Vec<(String, String)> {
    openmetrics
        .lines()
        .filter_map(|l| {
            let mut parts = l.strip_prefix("# TYPE ")?.split(' ');
            Some((parts.next()?.to_owned(), parts.next()?.to_owned()))
        })
        .collect()
}

/// `GET base/metrics` with `accept` (none: no header); the content type,
/// `Vary` and body.
async fn fetch(client: &reqwest::Client, base: &str, accept: Option<&str>) -> (String, String, String) {
    let mut request = client.get(format!("{base}/metrics"));
    if let Some(accept) = accept {
        request = request.header("accept", accept);
    }
    let response = request.send().await.expect("GET /metrics");
    assert_eq!(response.status(), 200, "{base}/metrics");
    let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let (content_type, vary) = (header("content-type"), header("vary"));
    (content_type, vary, response.text().await.expect("metrics body"))
}

/// Reads `base`'s `/metrics` both ways and checks each with its parser:
/// every family the exposition declares, with its type, `expected` among
/// them (a family added since is welcome, one lost is not). Returns (family
/// count, classic families of the OpenMetrics body: what a classic scraper
/// made of `/metrics` before it was negotiated).
async fn check(what: &str, client: &reqwest::Client, base: &str, expected: &[(&str, &str)]) -> (usize, usize) {
    // Once each way first: a series that a scrape itself adds (a response
    // counted by status) exists from here on in both.
    fetch(client, base, None).await;
    fetch(client, base, Some(PROMETHEUS_ACCEPT)).await;

    let (om_type, om_vary, openmetrics) = fetch(client, base, Some("application/openmetrics-text")).await;
    let (classic_type, classic_vary, classic) = fetch(client, base, None).await;
    assert_eq!(om_type, OPENMETRICS_TYPE, "{what}");
    assert_eq!(classic_type, PROMETHEUS_TYPE, "{what}");
    assert_eq!((om_vary.as_str(), classic_vary.as_str()), ("Accept", "Accept"), "{what}");
    assert!(openmetrics.ends_with("# EOF\n") && openmetrics.matches("# EOF").count() == 1, "{what}: {openmetrics}");
    assert!(!classic.contains("# EOF") && !classic.contains("# UNIT"), "{what}: {classic}");
    let (prometheus_type, _, _) = fetch(client, base, Some(PROMETHEUS_ACCEPT)).await;
    assert_eq!(prometheus_type, OPENMETRICS_TYPE, "{what}: what Prometheus asks for");
    let (text_type, _, _) = fetch(client, base, Some("text/plain;version=0.0.4")).await;
    assert_eq!(text_type, PROMETHEUS_TYPE, "{what}");

    let declared = declared(&openmetrics);
    let by_openmetrics = parse("openmetrics", &openmetrics);
    let by_classic = parse("classic", &classic);
    let misread = parse("classic", &openmetrics);
    eprintln!(
        "{what}: {} families declared; OpenMetrics parser {}, classic parser {} (on the OpenMetrics body, as before: {}, {} unknown)",
        declared.len(),
        by_openmetrics.len(),
        by_classic.len(),
        misread.len(),
        misread.iter().filter(|f| f.kind == "unknown").count(),
    );
    for (parser, families) in [("openmetrics", &by_openmetrics), ("classic", &by_classic)] {
        let seen: Vec<(String, String)> = families.iter().map(|f| (f.name.clone(), f.kind.clone())).collect();
        assert_eq!(seen, declared, "{what}: the {parser} parser's families and types");
        let unknown: Vec<&str> =
            families.iter().filter(|f| matches!(f.kind.as_str(), "unknown" | "untyped")).map(|f| &*f.name).collect();
        assert!(unknown.is_empty(), "{what}: {parser} found families of unknown type: {unknown:?}");
        let names: BTreeSet<&str> = families.iter().map(|f| &*f.name).collect();
        assert_eq!(names.len(), families.len(), "{what}: {parser}: a family twice");
        for family in families.iter().filter(|f| f.kind == "counter") {
            assert!(
                family.samples.keys().all(|s| s.starts_with(&format!("{}_total{{", family.name))),
                "{what}: {parser}: counter {} has samples {:?}",
                family.name,
                family.samples
            );
        }
        for (name, kind) in expected {
            let found = families.iter().find(|f| f.name == *name).map(|f| f.kind.as_str());
            assert_eq!(found, Some(*kind), "{what}: {parser}: the family {name}");
        }
    }
    // The same families, helps and series either way; and the same values
    // where a scrape cannot have moved them (every value but the frontend's
    // own request figures, which these scrapes count).
    for (om, classic) in by_openmetrics.iter().zip(&by_classic) {
        assert_eq!((&om.name, &om.help), (&classic.name, &classic.help), "{what}");
        let keys = |f: &Family| f.samples.keys().cloned().collect::<Vec<_>>();
        assert_eq!(keys(om), keys(classic), "{what}: the series of {}", om.name);
        if om.name.starts_with("dynamo_frontend_model_rejection") || !om.name.contains("frontend") {
            assert_eq!(om.samples, classic.samples, "{what}: the values of {}", om.name);
        }
    }
    (declared.len(), misread.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Python's prometheus_client (.ci/requirements-metrics.txt); .ci/run runs it with --ignored"]
async fn both_python_parsers_read_the_frontend_and_the_worker() {
    let _box = common::shared().await;
    let fe = Frontend::start(None, &["--active-decode-blocks-threshold", "0.85"]);
    let worker = common::worker(Some(fe.events), MODEL, None, &["--engine-request-limit", "4"]);
    let busy = BusyWorker::start(fe.events, 91, BUSY_MODEL);
    fe.wait_workers(2, SETTLE).await;
    // Every family with samples: served requests (counters, histograms),
    // shed ones (the rejection counters), an unknown model.
    assert_eq!(fe.complete(MODEL).await.0, 200);
    let deadline = Instant::now() + SETTLE;
    let mut shed = 0;
    while shed < 3 {
        let (status, body) = fe.complete(BUSY_MODEL).await;
        if status == 529 {
            shed += 1;
            continue;
        }
        // Registered, its first load report not applied yet: routed to the
        // fake's closed port.
        assert!(Instant::now() < deadline, "{BUSY_MODEL} never shed: {status} {body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(fe.complete("no-such-model").await.0, 404);

    let (frontend_families, frontend_before) = check("frontend", &fe.client, &fe.http, FRONTEND_FAMILIES).await;
    let (worker_families, worker_before) = check("worker", &fe.client, &worker.http, WORKER_FAMILIES).await;
    eprintln!(
        "families: frontend {frontend_families} (classic parser before: {frontend_before}), worker {worker_families} (before: {worker_before})"
    );
    // The rejections counted, read back by the classic parser.
    let (_, _, classic) = fetch(&fe.client, &fe.http, None).await;
    let families = parse("classic", &classic);
    let rejections = families.iter().find(|f| f.name == "dynamo_frontend_model_rejection").expect("the family");
    let key = format!(r#"dynamo_frontend_model_rejection_total{{"endpoint":"completions","model":"{BUSY_MODEL}"}}"#);
    assert_eq!(rejections.samples.get(&key).map(String::as_str), Some("3.0"), "{:?}", rejections.samples);
    drop(busy);
}
