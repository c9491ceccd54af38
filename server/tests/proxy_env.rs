//! Proxy variables in a process's environment (`HTTP_PROXY`, `HTTPS_PROXY`,
//! `ALL_PROXY`, upper and lower case), as production hosts often set for
//! egress: the frontend's requests to its workers (prompts and request
//! proofs), its scrapes of `--engine`s, and a sidecar's scrapes of and
//! requests to its engine go straight to their peer, never through that
//! proxy (docs/deployment.md, "Proxy variables").
//!
//! The proxy is a fake on 127.0.0.1 that answers every request 200 with a
//! mark and counts what it receives; the peers are on 127.0.0.1 too.
//!
//! Found by a review: reqwest reads these variables by default and applies
//! them to loopback addresses as well, so every prompt, proof and scrape
//! went to the proxy, which answered them itself (here, with the mark).

mod common;
#[allow(dead_code)]
#[path = "sidecar/fake_engine.rs"]
mod fake_engine;

use std::time::Duration;

use common::{expect_field, shared, worker, FakeWorker, Frontend, IMPOSTOR_MARK, SECRET};
use fake_engine::FakeEngine;

const MODEL: &str = "proxy-env-model";

/// Every variable reqwest reads a proxy from.
const PROXY_VARS: [&str; 6] = ["HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"];

/// The fake proxy and its URL.
fn proxy() -> (FakeWorker, String) {
    let proxy = FakeWorker::start();
    let url = format!("http://{}", proxy.addr);
    (proxy, url)
}

/// `env` with every proxy variable pointing at `proxy`.
fn with_proxy<'a>(proxy: &'a str, env: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    PROXY_VARS.iter().map(|var| (*var, proxy)).chain(env.iter().copied()).collect()
}

/// Three completions through `base` are answered by the worker or engine
/// behind it, and the proxy has received nothing.
async fn served_without(proxy: &FakeWorker, client: &reqwest::Client, base: &str, model: &str) {
    for _ in 0..3 {
        let (status, body) = common::complete(client, base, model, None).await;
        assert_eq!(status, 200, "{body}");
        assert!(!body.contains(IMPOSTOR_MARK), "answered by the proxy: {body}");
    }
    assert_eq!(proxy.requests(), 0, "requests went through the proxy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frontend_sends_prompts_and_proofs_to_its_workers_not_to_a_proxy() {
    let _box = shared().await;
    let (proxy, url) = proxy();
    let fe = Frontend::start_with_env(&with_proxy(&url, &[("LOADGATE_EVENT_SECRET", SECRET)]), &[]);
    let _worker = worker(Some(fe.events), MODEL, Some(SECRET), &[]);
    fe.wait_workers(1, Duration::from_secs(10)).await;
    served_without(&proxy, &fe.client, &fe.http, MODEL).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frontend_scrapes_its_engines_not_through_a_proxy() {
    let _box = shared().await;
    let (proxy, url) = proxy();
    let engine = FakeEngine::start(1).await;
    let fe = Frontend::start_with_env(&with_proxy(&url, &[]), &["--engine", &engine.spec()]);
    fe.wait_workers(1, Duration::from_secs(10)).await;
    served_without(&proxy, &fe.client, &fe.http, fake_engine::MODEL).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_scrapes_and_calls_its_engine_not_through_a_proxy() {
    let _box = shared().await;
    let (proxy, url) = proxy();
    let engine = FakeEngine::start(1).await;
    let spec = engine.spec();
    let args = ["worker", "--engine", spec.as_str(), "--http-host", "127.0.0.1", "--http-port", "0"];
    let (_sidecar, line) = common::spawn("sidecar", &args, &with_proxy(&url, &[]));
    let base = format!("http://{}", expect_field(&line, "http"));
    let client = common::client();
    served_without(&proxy, &client, &base, fake_engine::MODEL).await;
    assert!(!engine.seen().is_empty(), "the engine answered");
}
