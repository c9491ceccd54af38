//! Tenants end to end (issue 24): a real `loadgate frontend` process with
//! `--tenants-file`, and a worker the test controls (`line/mod.rs`). The
//! key decides the tenant and caps its class; two equal tenants share the
//! line's dispatches whatever their backlogs; a tenant's cap refuses only
//! it; a bad file stops the start with the line named; SIGHUP reloads the
//! file with requests in flight, and a bad reload keeps the old file.
//!
//! Margins: as `waiting_line.rs` (every wait bounded; "still waiting"
//! checked after at least 400 ms). Each report frees the worker for exactly
//! one waiter (the line's rule), so dispatch order is deterministic.

#[path = "common/mod.rs"]
mod common;
#[path = "line/mod.rs"]
mod line;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{metric, metrics_text};
use line::*;
use serde_json::json;
use sha2::{Digest, Sha256};

fn hash(key: &str) -> String {
    let digest = Sha256::digest(key.as_bytes());
    format!("sha256:{}", digest.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

/// A tenants file in the temp dir, removed on drop.
struct File(PathBuf);

impl File {
    fn new(name: &str, text: &str) -> File {
        let path = std::env::temp_dir().join(format!("loadgate-tenants-{}-{name}", std::process::id()));
        std::fs::write(&path, text).expect("write the tenants file");
        File(path)
    }

    fn rewrite(&self, text: &str) {
        // Write then rename: the frontend never reads half a file.
        let next = self.0.with_extension("next");
        std::fs::write(&next, text).unwrap();
        std::fs::rename(&next, &self.0).unwrap();
    }

    fn arg(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for File {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Tenant `name` with key `key-NAME` and the extra TOML `lines`.
fn tenant(name: &str, lines: &str) -> String {
    format!("[[tenant]]\nname = \"{name}\"\nkeys = [\"{}\"]\n{lines}\n", hash(&format!("key-{name}")))
}

/// Sends one completion for `model` with the key of `tenant` (if any) and
/// `x-loadgate-priority: priority` (if any): its status, reason and time.
async fn send_keyed(
    url: String,
    client: reqwest::Client,
    tenant: Option<&str>,
    priority: Option<&str>,
    model: &str,
) -> (u16, Option<String>, Duration) {
    let start = Instant::now();
    let body = json!({"model": model, "prompt": "hello there", "max_tokens": 4});
    let mut request = client.post(url).json(&body);
    if let Some(tenant) = tenant {
        request = request.bearer_auth(format!("key-{tenant}"));
    }
    if let Some(priority) = priority {
        request = request.header("x-loadgate-priority", priority);
    }
    let response = request.send().await.expect("send");
    let reason = response.headers().get("x-loadgate-rejected-reason").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let status = response.status().as_u16();
    // Read to its end: a body dropped unread counts as the client gone.
    let _ = response.bytes().await;
    (status, reason, start.elapsed())
}

fn spawn_keyed(
    fe: &common::Frontend,
    client: &reqwest::Client,
    tenant: Option<&'static str>,
    priority: Option<&'static str>,
) -> tokio::task::JoinHandle<(u16, Option<String>, Duration)> {
    let url = format!("{}/v1/completions", fe.http);
    tokio::spawn(send_keyed(url, client.clone(), tenant, priority, MODEL))
}

/// Each report of `worker` serves the next of `tasks` (a 200 within 5 s),
/// and the line is empty after the last.
async fn each_report_serves_the_next(
    fe: &common::Frontend,
    worker: &mut Controlled,
    tasks: impl IntoIterator<Item = tokio::task::JoinHandle<(u16, Option<String>, Duration)>>,
) {
    for (n, task) in tasks.into_iter().enumerate() {
        worker.report(false);
        let (status, _, _) = tokio::time::timeout(Duration::from_secs(5), task).await.expect("served").unwrap();
        assert_eq!(status, 200, "request {n}");
    }
    assert_eq!(metric(&metrics_text(&fe.client, &fe.http).await, "loadgate_frontend_queue_waiting"), Some(0.0));
}

/// Sends SIGHUP and waits until the file is reloaded: until a request
/// with the key of `tenant` (new in the file) is labelled `tenant` (an
/// unknown model: answered at once).
async fn reload(fe: &common::Frontend, client: &reqwest::Client, tenant: &'static str) {
    common::signal(fe.proc.pid(), "HUP");
    let url = format!("{}/v1/completions", fe.http);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, _, _) = send_keyed(url.clone(), client.clone(), Some(tenant), None, "no-such-model").await;
        assert_eq!(status, 404);
        let text = metrics_text(&fe.client, &fe.http).await;
        if metric_with(&text, "loadgate_frontend_tenant_requests_total", &format!("tenant=\"{tenant}\"")).is_some() {
            break;
        }
        assert!(Instant::now() < deadline, "the file was not reloaded:\n{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_tenant_gets_half_the_dispatches_of_a_ten_to_one_burst() {
    let _box = common::shared().await;
    let file = File::new("burst.toml", &(tenant("big", "") + &tenant("small", "")));
    let (fe, mut worker) = busy(&["--router-queue-timeout-ms", "60000", "--tenants-file", file.arg()]).await;
    let client = common::client_within(Duration::from_secs(90));
    // The big tenant's 40 arrive first, then the small one's 4.
    let mut waiting: Vec<(&str, _)> = Vec::new();
    for (who, n) in [("big", 40), ("small", 4)] {
        for _ in 0..n {
            waiting.push((who, spawn_keyed(&fe, &client, Some(who), None)));
        }
        wait_waiting(&fe, waiting.len() as f64).await;
    }
    // One report frees the worker for one waiter: serve until the small
    // tenant has no one left.
    let mut served = Vec::new();
    while waiting.iter().any(|(who, _)| *who == "small") {
        worker.report(false);
        let deadline = Instant::now() + Duration::from_secs(5);
        let done = loop {
            if let Some(i) = waiting.iter().position(|(_, task)| task.is_finished()) {
                break waiting.swap_remove(i);
            }
            assert!(Instant::now() < deadline, "no dispatch after a report ({served:?})");
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let (status, _, _) = done.1.await.unwrap();
        assert_eq!(status, 200);
        served.push(done.0);
        assert!(served.len() <= 20, "the small tenant waits behind the burst: {served:?}");
    }
    let small = served.iter().filter(|w| **w == "small").count();
    let share = small as f64 / served.len() as f64;
    assert!(share >= 0.45, "the small tenant got {small} of {} dispatches: {served:?}", served.len());
    for (_, task) in waiting {
        task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_decides_the_tenant_and_caps_its_class() {
    let _box = common::shared().await;
    let file =
        File::new("classes.toml", &(tenant("gold", "max_class = \"critical\"") + &tenant("capped", "max_waiting = 1")));
    let timeouts = "critical=20000,standard=600";
    let (fe, mut worker) = busy(&["--router-queue-timeout-ms", timeouts, "--tenants-file", file.arg()]).await;
    let client = common::client_within(Duration::from_secs(30));
    // No key, or a wrong one: the default tenant, whose class is at most
    // standard (without --trust-priority-header or not).
    let (status, reason, took) =
        send_keyed(format!("{}/v1/completions", fe.http), client.clone(), None, Some("critical"), MODEL).await;
    assert_eq!((status, reason.as_deref()), (529, Some("deadline")), "no key: standard's 600 ms, after {took:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    // The capped tenant (standard) holds its one place; a second is refused at once.
    let capped = spawn_keyed(&fe, &client, Some("capped"), None);
    wait_waiting(&fe, 1.0).await;
    let (status, reason, took) =
        send_keyed(format!("{}/v1/completions", fe.http), client.clone(), Some("capped"), None, MODEL).await;
    assert_eq!((status, reason.as_deref()), (529, Some("tenant_cap")), "after {took:?}");
    let (status, reason, _) = capped.await.unwrap();
    assert_eq!((status, reason.as_deref()), (529, Some("deadline")));
    // Gold may be critical: it waits past the standard timeout, then is served.
    let gold = spawn_keyed(&fe, &client, Some("gold"), Some("critical"));
    wait_waiting(&fe, 1.0).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(!gold.is_finished(), "a critical request of gold waits its 20 s");
    worker.report(false);
    let (status, _, _) = tokio::time::timeout(Duration::from_secs(5), gold).await.expect("served").unwrap();
    assert_eq!(status, 200);
    // A request is counted when its response ends (the observer's end of the
    // body), which may come just after the client read the status: bounded
    // wait (5 s) for every count.
    let count = |text: &str, tenant: &str, outcome: &str| {
        metric_with(
            text,
            "loadgate_frontend_tenant_requests_total",
            &format!("tenant=\"{tenant}\",outcome=\"{outcome}\""),
        )
    };
    let expected = [("gold", "ok", 1.0), ("capped", "rejected", 2.0), ("default", "rejected", 1.0)];
    let what = format!("tenant counts never reached {expected:?}");
    let text = common::wait_for_metrics(&fe.client, &fe.http, Duration::from_secs(5), &what, |text| {
        expected.iter().all(|(t, o, n)| count(text, t, o) == Some(*n))
    })
    .await;
    let shed = metric_with(&text, "loadgate_frontend_rejection_class_reason_total", "reason=\"tenant_cap\"");
    assert_eq!(shed, Some(1.0), "{text}");
}

/// With the engine's order known (`--priority-from-nvext`), a tenant's
/// `max_class` holds the priorities its body gives the engine too: the
/// capped tenant's top-level `priority` and `nvext.agent_hints.priority`
/// reach the worker lowered to standard's edge (0 in vLLM's order); gold
/// (critical) keeps its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_s_cap_holds_the_priority_its_body_gives_the_engine() {
    let _box = common::shared().await;
    let file = File::new("engine.toml", &(tenant("gold", "max_class = \"critical\"") + &tenant("capped", "")));
    let flags = ["--tenants-file", file.arg(), "--trust-priority-header", "--priority-from-nvext", "vllm"];
    let fe = frontend(&flags);
    let mut worker = Controlled::register(&fe).await;
    worker.report(false);
    let client = common::client_within(Duration::from_secs(10));
    let body = json!({
        "model": MODEL, "prompt": "hello", "max_tokens": 1, "priority": -5,
        "nvext": {"agent_hints": {"priority": -9, "latency_sensitivity": 1.0}, "other": [1, 2]}
    });
    let send = |key: &str| {
        let request = client.post(format!("{}/v1/completions", fe.http)).bearer_auth(format!("key-{key}")).json(&body);
        async move { request.send().await.expect("an answer").status().as_u16() }
    };
    assert_eq!(send("capped").await, 200);
    let got = worker.http.last_body();
    assert_eq!((&got["priority"], &got["nvext"]["agent_hints"]["priority"]), (&json!(0), &json!(0)), "{got}");
    assert_eq!(
        (&got["nvext"]["agent_hints"]["latency_sensitivity"], &got["nvext"]["other"]),
        (&json!(1.0), &json!([1, 2]))
    );
    assert_eq!((&got["model"], &got["prompt"]), (&json!(MODEL), &json!("hello")));
    assert_eq!(send("gold").await, 200);
    assert_eq!(worker.http.last_body(), body, "a critical tenant's body goes as it came");
}

#[test]
fn a_bad_tenants_file_stops_the_start_and_names_its_line() {
    let file = File::new("bad.toml", &(tenant("a", "") + "\n" + &tenant("b", "weight = 0")));
    let stderr = common::frontend_refuses(&["--tenants-file", file.arg()], &[]);
    let expected = format!("{}:9: tenant \"b\": weight must be 1..=1000, not 0", file.arg());
    assert!(stderr.contains(&expected), "wanted {expected:?} in {stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_file_with_requests_in_flight_and_a_bad_one_is_kept_out() {
    let _box = common::shared().await;
    let file = File::new("reload.toml", &tenant("a", "max_waiting = 1"));
    let (fe, mut worker) = busy(&["--router-queue-timeout-ms", "60000", "--tenants-file", file.arg()]).await;
    let client = common::client_within(Duration::from_secs(90));
    let url = format!("{}/v1/completions", fe.http);
    let first = spawn_keyed(&fe, &client, Some("a"), None);
    wait_waiting(&fe, 1.0).await;
    let (status, reason, _) = send_keyed(url.clone(), client.clone(), Some("a"), None, MODEL).await;
    assert_eq!((status, reason.as_deref()), (529, Some("tenant_cap")));
    // A new file: a's cap is 3, and tenant c appears.
    file.rewrite(&(tenant("a", "max_waiting = 3") + &tenant("c", "")));
    reload(&fe, &client, "c").await;
    let second = spawn_keyed(&fe, &client, Some("a"), None);
    wait_waiting(&fe, 2.0).await;
    // A bad file: logged, the current one stays.
    file.rewrite("[[tenant]]\nname = \"a\"\nweight = -1\n");
    common::signal(fe.proc.pid(), "HUP");
    assert!(fe.proc.wait_log("keeping the previous file", Duration::from_secs(10)), "{}", fe.proc.stderr());
    let third = spawn_keyed(&fe, &client, Some("a"), None);
    wait_waiting(&fe, 3.0).await;
    let (status, reason, _) = send_keyed(url.clone(), client.clone(), Some("a"), None, MODEL).await;
    assert_eq!((status, reason.as_deref()), (529, Some("tenant_cap")), "a's cap is still 3");
    // Nothing in flight was lost.
    each_report_serves_the_next(&fe, &mut worker, [first, second, third]).await;
}

/// A reload that takes a tenant away ends its series in `/metrics`; the
/// others keep theirs. Before, a renamed tenant's series stayed until the
/// process ended, one more set per rename.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_a_reload_takes_away_loses_its_series() {
    let _box = common::shared().await;
    let file = File::new("retire.toml", &(tenant("a", "") + &tenant("b", "")));
    let fe = frontend(&["--tenants-file", file.arg()]);
    // A model known: another one is a 404 (with none, a 503).
    let _worker = Controlled::register(&fe).await;
    let client = common::client_within(Duration::from_secs(30));
    let url = format!("{}/v1/completions", fe.http);
    for name in ["a", "b"] {
        let (status, _, _) = send_keyed(url.clone(), client.clone(), Some(name), None, "no-such-model").await;
        assert_eq!(status, 404);
    }
    let series = |text: &str, name: &str| {
        metric_with(text, "loadgate_frontend_tenant_requests_total", &format!("tenant=\"{name}\""))
    };
    let text = metrics_text(&fe.client, &fe.http).await;
    assert_eq!((series(&text, "a"), series(&text, "b")), (Some(1.0), Some(1.0)), "{text}");
    file.rewrite(&(tenant("a", "") + &tenant("c", "")));
    reload(&fe, &client, "c").await;
    let text = metrics_text(&fe.client, &fe.http).await;
    assert_eq!((series(&text, "a"), series(&text, "b")), (Some(1.0), None), "{text}");
}

/// A reload that puts a new tenant first: each tenant keeps its own waiters
/// and caps (the line knows a tenant by an id that stays with its name, not
/// by its place in the file). Before, the new first tenant inherited the
/// waiter of the one that moved (refused for a cap it did not hold) and
/// the moved one got a fresh allowance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_puts_a_tenant_first_leaves_each_its_own_waiters_and_caps() {
    let _box = common::shared().await;
    let file = File::new("reorder.toml", &tenant("a", "max_waiting = 1"));
    let (fe, mut worker) = busy(&["--router-queue-timeout-ms", "60000", "--tenants-file", file.arg()]).await;
    let client = common::client_within(Duration::from_secs(90));
    let url = format!("{}/v1/completions", fe.http);
    let first = spawn_keyed(&fe, &client, Some("a"), None);
    wait_waiting(&fe, 1.0).await;
    file.rewrite(&(tenant("b", "max_waiting = 1") + &tenant("a", "max_waiting = 1")));
    reload(&fe, &client, "b").await;
    // b holds nothing: it joins.
    let b = spawn_keyed(&fe, &client, Some("b"), None);
    wait_waiting(&fe, 2.0).await;
    // a still holds its one place.
    let (status, reason, _) = send_keyed(url.clone(), client.clone(), Some("a"), None, MODEL).await;
    assert_eq!((status, reason.as_deref()), (529, Some("tenant_cap")), "a's waiter is still a's");
    each_report_serves_the_next(&fe, &mut worker, [first, b]).await;
}

/// A tenant's `max_tokens` holds in the default router mode, with no
/// `--router-queue-token-limit`: the prompt is counted because there is a
/// tenants file (before, every waiter weighed 0 tokens, and a 1,000-word
/// prompt of a tenant capped at 5 tokens waited).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_token_cap_holds_without_a_token_limit() {
    let _box = common::shared().await;
    let file = File::new("tokens.toml", &tenant("acme", "max_tokens = 5"));
    let (fe, mut worker) = busy(&["--router-queue-timeout-ms", "20000", "--tenants-file", file.arg()]).await;
    let client = common::client_within(Duration::from_secs(30));
    let url = format!("{}/v1/completions", fe.http);
    let send = |prompt: String| {
        let request = client.post(url.clone()).bearer_auth("key-acme");
        async move {
            let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 4});
            let response = request.json(&body).send().await.expect("send");
            let reason = response.headers().get("x-loadgate-rejected-reason").map(|v| v.to_str().unwrap().to_owned());
            (response.status().as_u16(), reason)
        }
    };
    let (status, reason) = send(vec!["word"; 1000].join(" ")).await;
    assert_eq!((status, reason.as_deref()), (529, Some("tenant_cap")), "1,000 words past a cap of 5 tokens");
    // A prompt within the cap waits, and is served.
    let small = tokio::spawn(send("hi".to_owned()));
    wait_waiting(&fe, 1.0).await;
    worker.report(false);
    let (status, _) = tokio::time::timeout(Duration::from_secs(5), small).await.expect("served").unwrap();
    assert_eq!(status, 200);
}

/// Runs `loadgate hash-key` with `stdin` (bounded: 20 s): whether it
/// succeeded, its stdout and its stderr.
fn hash_key_cli(stdin: &[u8]) -> (bool, String, String) {
    use std::io::Write as _;
    let mut child = std::process::Command::new(common::bin())
        .arg("hash-key")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn loadgate hash-key");
    child.stdin.take().expect("stdin").write_all(stdin).expect("write the key");
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("loadgate hash-key did not exit within 20 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("output");
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// Found by a review: `loadgate hash-key` printed a hash for a key no
/// request can present (a space pasted at its end, a space or a character
/// outside visible ASCII inside, over 4,096 bytes): `Authorization: Bearer`
/// trims or refuses such a key, so the tenant's hash never matched and its
/// requests silently went to the `default` tenant.
#[test]
fn hash_key_refuses_a_key_no_request_can_present() {
    let (ok, stdout, stderr) = hash_key_cli(b"sk-live-1\n");
    assert!(ok, "{stderr}");
    assert_eq!(stdout, format!("{}\n", hash("sk-live-1")));
    let long = "k".repeat(4097);
    for key in ["sk-live-1 ", " sk-live-1", "sk live", "sk\tlive", "cl\u{e9}-1", &long] {
        let (ok, stdout, stderr) = hash_key_cli(format!("{key}\n").as_bytes());
        assert!(!ok, "{key:?} hashed, though no request can present it: {stdout}");
        assert!(stderr.contains("Authorization: Bearer"), "{key:?}: {stderr}");
    }
}
