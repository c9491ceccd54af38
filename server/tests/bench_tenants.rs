//! `loadgate bench --tenants` over real sockets: a small axum server in this
//! test process records the headers of every completion request and
//! answers tenant `a` with 200 and every other tenant with 529
//! (`x-loadgate-rejected-reason: tenant_quota`). Checked: each request
//! carries its tenant's name as its bearer key and in `x-loadgate-tenant`,
//! the shares are the flag's (about 2,000 requests, `a=3,b=1`: `b` between
//! 20 % and 30 %), the tenant is drawn independently of the class, and the
//! bench's `by_tenant` counts are what the server saw.

#[path = "common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{json, Value};

/// How long one bench run may take in all (2 s of arrivals, its drain).
const BENCH_WITHIN: Duration = Duration::from_secs(30);

/// The headers of one request: `Authorization`, `x-loadgate-tenant`,
/// `x-loadgate-priority` (each `None` when absent).
type Seen = (Option<String>, Option<String>, Option<String>);

/// A completions endpoint on 127.0.0.1 that records what it receives.
struct Recorder {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Recorder {
    async fn start() -> Recorder {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let app = axum::Router::new().route("/v1/completions", post(answer)).with_state(seen.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the recorder");
        let addr = listener.local_addr().expect("the recorder's address");
        tokio::spawn(async move { axum::serve(listener, app).await });
        Recorder { addr, seen }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

async fn answer(State(seen): State<Arc<Mutex<Vec<Seen>>>>, headers: HeaderMap) -> Response {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let (tenant, priority) = (text("x-loadgate-tenant"), text("x-loadgate-priority"));
    seen.lock().unwrap_or_else(|e| e.into_inner()).push((text("authorization"), tenant.clone(), priority));
    if tenant.as_deref() == Some("a") {
        let usage = json!({"usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}});
        (StatusCode::OK, axum::Json(usage)).into_response()
    } else {
        let status = StatusCode::from_u16(529).expect("a status");
        (status, [("x-loadgate-rejected-reason", "tenant_quota")], "refused").into_response()
    }
}

/// Runs `loadgate bench` against `recorder` with `extra` flags and `env`;
/// its `--json` summary.
async fn bench(recorder: &Recorder, extra: &[&str], env: &[(&str, &str)]) -> Value {
    let url = format!("http://{}", recorder.addr);
    let args: Vec<String> =
        ["bench", "--url", &url, "--model", "m", "--rate", "1000", "--duration", "2", "--drain-timeout", "10"]
            .iter()
            .chain(extra)
            .chain(&["--json"])
            .map(|s| (*s).to_owned())
            .collect();
    let env: Vec<(String, String)> = env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    let (_bench, line) = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        common::spawn_within("bench", &args, &env, BENCH_WITHIN)
    })
    .await
    .expect("the bench ran");
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("bench --json: {e}: {line}"))
}

/// Requests per tenant header, as the server saw them.
fn per_tenant(seen: &[Seen]) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for (_, tenant, _) in seen {
        *counts.entry(tenant.clone().unwrap_or_default()).or_default() += 1;
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_request_sends_its_tenant_by_share_and_the_report_counts_each_tenant() {
    let _box = common::shared().await;
    let recorder = Recorder::start().await;
    let summary = bench(&recorder, &["--tenants", "a=3,b=1", "--seed", "11"], &[]).await;
    let seen = recorder.seen();
    let sent = summary["sent"].as_u64().expect("sent");
    assert!((1_500..2_500).contains(&sent), "about 2,000 requests: {summary}");
    assert_eq!(seen.len() as u64, sent, "every request arrived: {summary}");
    for (authorization, tenant, priority) in &seen {
        let tenant = tenant.as_deref().expect("x-loadgate-tenant");
        assert!(["a", "b"].contains(&tenant), "{tenant}");
        assert_eq!(authorization.as_deref(), Some(format!("Bearer {tenant}").as_str()), "the key is the name");
        assert_eq!(priority, &None, "no --mix: no class sent");
    }
    let counts = per_tenant(&seen);
    let b = counts["b"] as f64 / sent as f64;
    assert!((0.20..0.30).contains(&b), "b sent {:.1} % of {sent}: {counts:?}", 100.0 * b);
    let by_tenant = &summary["by_tenant"];
    assert_eq!(by_tenant.as_object().map(|o| o.len()), Some(2), "{summary}");
    for (name, n) in &counts {
        let t = &by_tenant[name];
        assert_eq!(t["sent"].as_u64(), Some(*n), "{name}: the bench counted what the server saw: {summary}");
        let (ok, rejected) = if name == "a" { (*n, 0) } else { (0, *n) };
        assert_eq!((t["ok"].as_u64(), t["rejected"].as_u64()), (Some(ok), Some(rejected)), "{name}: {summary}");
    }
    assert_eq!(by_tenant["b"]["reasons"], json!({"tenant_quota": counts["b"]}), "{summary}");
    assert_eq!(by_tenant["b"]["rejected_pct"].as_f64(), Some(100.0));
    assert!(by_tenant["a"]["ttft_ms"]["p50"].as_f64().is_some_and(|p| p > 0.0), "{summary}");
    assert_eq!(summary["ok"].as_u64(), Some(counts["a"]));
    assert!(summary.get("by_class").is_none(), "{summary}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tenant_is_drawn_apart_from_the_class_and_read_from_the_environment() {
    let _box = common::shared().await;
    let recorder = Recorder::start().await;
    let env = [("LOADGATE_BENCH_TENANTS", "a=1,b=1")];
    let summary = bench(&recorder, &["--mix", "critical=1,sheddable=1", "--seed", "5"], &env).await;
    let seen = recorder.seen();
    let sent = summary["sent"].as_u64().expect("sent");
    assert_eq!(seen.len() as u64, sent);
    // Each (class, tenant) pair about a quarter of the requests: neither
    // draw follows the other.
    let mut pairs: BTreeMap<(String, String), u64> = BTreeMap::new();
    for (_, tenant, priority) in &seen {
        let key = (priority.clone().expect("a class"), tenant.clone().expect("a tenant"));
        *pairs.entry(key).or_default() += 1;
    }
    assert_eq!(pairs.len(), 4, "{pairs:?}");
    for (pair, n) in &pairs {
        let share = *n as f64 / sent as f64;
        assert!((0.20..0.30).contains(&share), "{pair:?}: {:.1} % of {sent}: {pairs:?}", 100.0 * share);
    }
    for class in ["critical", "sheddable"] {
        let n = pairs.iter().filter(|((c, _), _)| c == class).map(|(_, n)| n).sum::<u64>();
        assert_eq!(summary["by_class"][class]["sent"].as_u64(), Some(n), "{class}: {summary}");
    }
    for tenant in ["a", "b"] {
        let n = pairs.iter().filter(|((_, t), _)| t == tenant).map(|(_, n)| n).sum::<u64>();
        assert_eq!(summary["by_tenant"][tenant]["sent"].as_u64(), Some(n), "{tenant}: {summary}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tenants_no_key_and_no_tenant_is_sent() {
    let _box = common::shared().await;
    let recorder = Recorder::start().await;
    let summary = bench(&recorder, &["--mix", "critical=1,sheddable=1", "--seed", "5"], &[]).await;
    let seen = recorder.seen();
    assert_eq!(seen.len() as u64, summary["sent"].as_u64().expect("sent"));
    assert!(seen.iter().all(|(authorization, tenant, _)| authorization.is_none() && tenant.is_none()));
    assert!(summary.get("by_tenant").is_none(), "{summary}");
}
