//! loadgate in front of real llama.cpp `llama-server` processes (issue 11's
//! end-to-end checks): the sidecar's exact `N + Q` cap, shedding on scraped
//! engine load, an engine that dies and comes back, and a client that leaves
//! mid-request freeing the engine's slot.
//!
//! They need the engine that `bash scripts/prepare-llama-server` builds, so
//! the plain `cargo test` skips them (it lists them as ignored, with the
//! command that runs them); CI runs the script, then
//! `cargo test --test real_engines -- --ignored`.
//!
//! Every engine runs the small random-weight model with `--parallel 4` and
//! one thread, on a free 127.0.0.1 port; every wait is bounded.

mod common;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{client_within, metric, metrics_text, spawn, Frontend, Proc, SECRET};
use serde_json::{json, Value};

/// The model name clients and loadgate use (llama-server ignores it).
const MODEL: &str = "small";

/// How long an engine may take to answer `/health` after it starts.
const ENGINE_START: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------
// The engines.

/// Where `scripts/prepare-llama-server` put the server and the small model.
fn prepared() -> (PathBuf, PathBuf) {
    // Empty is unset, as for the script and the demo.
    let root = std::env::var_os("LOADGATE_ENGINES").filter(|v| !v.is_empty()).map(PathBuf::from).unwrap_or_else(|| {
        let cache = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache"));
        cache.join("loadgate-engines")
    });
    let dir = root.join("llama-cpp");
    let bin = dir.join("current/bin/llama-server");
    let model = dir.join("models/small-random-llama.gguf");
    assert!(
        bin.is_file() && model.is_file(),
        "no prepared llama-server ({} and {}): run `bash scripts/prepare-llama-server` first",
        bin.display(),
        model.display()
    );
    (bin, model)
}

/// A free 127.0.0.1 port (bound, then released).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

/// One `llama-server`, killed on drop.
struct Engine {
    child: Child,
    port: u16,
    url: String,
}

impl Engine {
    /// A small-model server with 4 slots on a free port.
    fn start() -> Engine {
        Engine::on_port(free_port())
    }

    /// The same on `port` (to restart one where it was).
    fn on_port(port: u16) -> Engine {
        Engine::with_args(port, &[])
    }

    /// The same with 32 HTTP threads: each kept-alive connection (the
    /// scrapers', the tests') holds one of llama-server's HTTP threads (8
    /// by default with 4 slots), and requests past them wait unseen, not
    /// counted as deferred.
    fn with_http_threads() -> Engine {
        Engine::with_args(free_port(), &["--threads-http", "32"])
    }

    fn with_args(port: u16, extra: &[&str]) -> Engine {
        let (bin, model) = prepared();
        let child = Command::new(&bin)
            .arg("-m")
            .arg(&model)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--parallel", "4", "--ctx-size", "2048", "--threads", "1", "--metrics", "--no-webui"])
            .args(["--cache-ram", "0"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        let engine = Engine { child, port, url: format!("http://127.0.0.1:{port}") };
        engine.wait_healthy();
        engine
    }

    fn wait_healthy(&self) {
        let deadline = Instant::now() + ENGINE_START;
        loop {
            if get_status(&format!("{}/health", self.url)) == Some(200) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "llama-server on port {} not healthy within {ENGINE_START:?}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `--engine` value for a frontend or a sidecar.
    fn spec(&self) -> String {
        format!("llamacpp={},model={MODEL}", self.url)
    }

    /// Kills it now (SIGKILL) and reaps it.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The status of `GET url` over a plain connection with 2 s timeouts
/// (`None`: no answer); for the synchronous wait at an engine's start.
fn get_status(url: &str) -> Option<u16> {
    use std::io::{Read as _, Write as _};
    let rest = url.strip_prefix("http://")?;
    let (host, path) = rest.split_once('/').map_or((rest, "/".to_owned()), |(h, p)| (h, format!("/{p}")));
    let mut stream = std::net::TcpStream::connect(host).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream.set_write_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").ok()?;
    let mut head = [0u8; 16];
    let n = stream.read(&mut head).ok()?;
    String::from_utf8_lossy(&head[..n]).split_whitespace().nth(1)?.parse().ok()
}

/// `llamacpp:requests_processing` of `engine` now (`None`: no answer).
async fn processing(client: &reqwest::Client, url: &str) -> Option<f64> {
    metric(&metrics_text(client, url).await, "llamacpp:requests_processing")
}

/// Samples `llamacpp:requests_processing` of every engine every 50 ms until
/// stopped; returns the largest value seen per engine and the samples taken.
fn watch_processing(urls: Vec<String>, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<(Vec<f64>, u64)> {
    tokio::spawn(async move {
        let client = client_within(Duration::from_secs(2));
        let mut max = vec![0.0f64; urls.len()];
        let mut samples = 0;
        let mut ticks = tokio::time::interval(Duration::from_millis(50));
        while !stop.load(Ordering::Relaxed) {
            ticks.tick().await;
            for (i, url) in urls.iter().enumerate() {
                if let Some(v) = processing(&client, url).await {
                    max[i] = max[i].max(v);
                }
            }
            samples += 1;
        }
        (max, samples)
    })
}

/// A completion that runs for a while on the small model: `max_tokens`
/// generated whatever the random weights sample (`ignore_eos`).
fn long_request(max_tokens: u32, stream: bool) -> Value {
    json!({
        "model": MODEL,
        "prompt": "the quick brown fox jumps over the lazy dog and then some more words follow",
        "max_tokens": max_tokens,
        "ignore_eos": true,
        "stream": stream,
    })
}

/// POSTs `body` to `base/v1/completions`; the status (0: no answer).
async fn post(client: &reqwest::Client, base: &str, body: &Value) -> (u16, String) {
    match client.post(format!("{base}/v1/completions")).json(body).send().await {
        Ok(r) => {
            let status = r.status().as_u16();
            (status, r.text().await.unwrap_or_default())
        }
        Err(e) => (0, e.to_string()),
    }
}

/// A sidecar in front of `engine`, capped at `limit` with `Q = queue`,
/// pushing to `frontend`'s event plane.
fn sidecar(engine: &Engine, frontend: &Frontend, limit: usize, queue: usize) -> Proc {
    let events = frontend.events.to_string();
    let limit = limit.to_string();
    let queue = queue.to_string();
    let spec = engine.spec();
    let args = [
        "worker",
        "--engine",
        spec.as_str(),
        "--model",
        MODEL,
        "--http-host",
        "127.0.0.1",
        "--http-port",
        "0",
        "--engine-request-limit",
        limit.as_str(),
        "--frontend",
        events.as_str(),
    ];
    let env = [("LOADGATE_EVENT_SECRET", SECRET), ("DYN_DYNAMO_REQUEST_QUEUE_LIMIT", queue.as_str())];
    spawn("sidecar", &args, &env).0
}

// ---------------------------------------------------------------------------
// (a) The sidecar's exact N + Q cap in front of real engines.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs llama-server: bash scripts/prepare-llama-server, then cargo test --test real_engines -- --ignored"]
async fn sidecars_admit_exactly_n_plus_q_per_engine_and_the_rest_is_overloaded() {
    let engines = [Engine::start(), Engine::start()];
    let frontend = Frontend::secured(&["--migration-limit", "3"]);
    let _sidecars: Vec<Proc> = engines.iter().map(|e| sidecar(e, &frontend, 4, 2)).collect();
    frontend.wait_workers(2, Duration::from_secs(20)).await;

    let stop = Arc::new(AtomicBool::new(false));
    let watcher = watch_processing(engines.iter().map(|e| e.url.clone()).collect(), stop.clone());
    let client = client_within(Duration::from_secs(180));
    let started = Instant::now();
    let requests: Vec<_> = (0..20)
        .map(|_| {
            let client = client.clone();
            let base = frontend.http.clone();
            tokio::spawn(async move { post(&client, &base, &long_request(256, false)).await })
        })
        .collect();
    let mut statuses = Vec::new();
    for request in requests {
        statuses.push(request.await.expect("a request task panicked"));
    }
    stop.store(true, Ordering::Relaxed);
    let (max_processing, samples) = watcher.await.expect("the watcher panicked");
    let ok = statuses.iter().filter(|(s, _)| *s == 200).count();
    let overloaded: Vec<_> = statuses.iter().filter(|(s, _)| *s == 529).collect();
    eprintln!(
        "20 concurrent requests in {:.1} s: {ok} × 200, {} × 529, others {:?}; max requests_processing per engine \
         {max_processing:?} over {samples} scrapes",
        started.elapsed().as_secs_f64(),
        overloaded.len(),
        statuses.iter().filter(|(s, _)| *s != 200 && *s != 529).collect::<Vec<_>>()
    );
    assert_eq!(ok, 12, "2 engines × (N 4 + Q 2) admitted");
    assert_eq!(overloaded.len(), 8, "the rest: the overload status after migration");
    for (_, body) in &overloaded {
        assert!(body.contains("Overloaded") || body.contains("busy") || body.contains("capacity"), "{body}");
    }
    assert!(samples >= 10, "the watcher scraped {samples} times");
    for (i, max) in max_processing.iter().enumerate() {
        assert!(*max <= 4.0, "engine {i} processed {max} requests at once (limit 4)");
        assert!(*max >= 1.0, "engine {i} was never seen processing");
    }
}

// ---------------------------------------------------------------------------
// (b) Shedding on directly scraped engine load.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs llama-server: bash scripts/prepare-llama-server, then cargo test --test real_engines -- --ignored"]
async fn the_frontend_sheds_when_both_engines_queue_past_the_threshold_and_serves_again_after() {
    let engines = [Engine::with_http_threads(), Engine::with_http_threads()];
    let specs: Vec<String> = engines.iter().map(Engine::spec).collect();
    let frontend = Frontend::start(
        None,
        &[
            "--engine",
            &specs[0],
            "--engine",
            &specs[1],
            "--engine-scrape-interval-ms",
            "50",
            "--active-waiting-requests-threshold",
            "2",
        ],
    );
    frontend.wait_workers(2, Duration::from_secs(60)).await;

    // 16 long requests, 8 sent to each engine itself (as other clients of
    // the engines would): 4 run on each, 4 wait in each engine's queue.
    // (Through the frontend the split between two engines is not even: its
    // view of them is a scrape old, and a request's tracked prefill ends
    // at its first token.)
    let client = client_within(Duration::from_secs(180));
    let flood: Vec<_> = (0..16)
        .map(|i| {
            let client = client.clone();
            let base = engines[i % 2].url.clone();
            tokio::spawn(async move { post(&client, &base, &long_request(128, false)).await })
        })
        .collect();

    // Both queues pass 2 (seen at the engines themselves); then, within a
    // few scrapes, the next request is refused (529).
    let probe = client_within(Duration::from_secs(30));
    // A probe that the frontend routes (not yet shedding) waits in an
    // engine's queue: give up on it after 1 s and probe again.
    let quick = client_within(Duration::from_secs(1));
    let deadline = Instant::now() + Duration::from_secs(20);
    let deferred = loop {
        let mut deferred = Vec::new();
        for e in &engines {
            deferred.push(metric(&metrics_text(&probe, &e.url).await, "llamacpp:requests_deferred").unwrap_or(0.0));
        }
        if deferred.iter().all(|d| *d > 2.0) {
            break deferred;
        }
        if Instant::now() >= deadline {
            let mut processing_now = Vec::new();
            for e in &engines {
                processing_now.push(processing(&probe, &e.url).await);
            }
            let mut answers = Vec::new();
            for request in flood {
                answers.push(request.await.expect("a request task panicked"));
            }
            panic!("the engines never queued past 2: deferred {deferred:?}, processing {processing_now:?}, flood {answers:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let queued_at = Instant::now();
    // A few scrape intervals for the frontend to see it (each scrape waits
    // for the engine's current decode step).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut seen = Vec::new();
    let shed_after = loop {
        let (status, body) = post(&quick, &frontend.http, &long_request(1, false)).await;
        seen.push(status);
        if status == 529 {
            assert!(body.contains("Overloaded"), "{body}");
            break queued_at.elapsed();
        }
        if queued_at.elapsed() > Duration::from_secs(3) {
            let text = metrics_text(&probe, &frontend.http).await;
            let load: Vec<&str> =
                text.lines().filter(|l| l.contains("waiting_requests{") || l.contains("scrape_failures")).collect();
            panic!("no 529 3 s after both engines queued {deferred:?}: probes {seen:?}; frontend {load:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let shed_at = Instant::now();
    eprintln!(
        "requests_deferred {deferred:?}: 529 after {} ms (probes before it: {:?})",
        shed_after.as_millis(),
        &seen[..seen.len() - 1]
    );

    let mut flood_statuses = Vec::new();
    for request in flood {
        flood_statuses.push(request.await.expect("a request task panicked").0);
    }
    assert!(flood_statuses.iter().all(|s| *s == 200), "the admitted flood completes: {flood_statuses:?}");
    // Drained: served again.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = post(&probe, &frontend.http, &long_request(1, false)).await;
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "not serving again after the drain (last {status}: {body})");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("served again {:.1} s after the first 529", shed_at.elapsed().as_secs_f64());
}

// ---------------------------------------------------------------------------
// (c) A killed engine leaves the pool; restarted, it rejoins.

/// `/health`'s `live_workers`.
async fn live_workers(frontend: &Frontend) -> Option<u64> {
    let response = frontend.client.get(format!("{}/health", frontend.http)).send().await.ok()?;
    response.json::<Value>().await.ok()?["live_workers"].as_u64()
}

async fn wait_live(frontend: &Frontend, n: u64, within: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let live = live_workers(frontend).await;
        if live == Some(n) {
            return start.elapsed();
        }
        assert!(start.elapsed() < within, "live workers {live:?}, waited for {n} for {within:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs llama-server: bash scripts/prepare-llama-server, then cargo test --test real_engines -- --ignored"]
async fn a_killed_engine_leaves_the_pool_and_a_restarted_one_rejoins() {
    let mut engines = [Engine::start(), Engine::start()];
    let specs: Vec<String> = engines.iter().map(Engine::spec).collect();
    let frontend =
        Frontend::start(None, &["--engine", &specs[0], "--engine", &specs[1], "--engine-scrape-interval-ms", "50"]);
    frontend.wait_workers(2, Duration::from_secs(60)).await;
    wait_live(&frontend, 2, Duration::from_secs(10)).await;

    let port = engines[0].port;
    engines[0].kill();
    let left = wait_live(&frontend, 1, Duration::from_secs(5)).await;
    eprintln!("killed engine out of routing after {} ms", left.as_millis());
    // Every request is served by the survivor.
    let client = client_within(Duration::from_secs(60));
    for _ in 0..6 {
        let (status, body) = post(&client, &frontend.http, &long_request(4, false)).await;
        assert_eq!(status, 200, "{body}");
    }

    engines[0] = Engine::on_port(port);
    let back = wait_live(&frontend, 2, Duration::from_secs(10)).await;
    eprintln!("restarted engine back in routing {} ms after it was healthy", back.as_millis());
    // Round robin sends it half of the next requests.
    for _ in 0..6 {
        let (status, body) = post(&client, &frontend.http, &long_request(4, false)).await;
        assert_eq!(status, 200, "{body}");
    }
    let predicted = metric(&metrics_text(&client, &engines[0].url).await, "llamacpp:tokens_predicted_total");
    assert!(predicted.is_some_and(|t| t >= 4.0), "the restarted engine generated {predicted:?} tokens");
}

// ---------------------------------------------------------------------------
// (d) A client that leaves mid-request frees the engine's slot.

/// Sends `body` to `base`, waits until `engine` is processing it, drops the
/// client's request, and returns how long the engine took to free the slot.
async fn abandon(base: &str, engine: &Engine, body: Value) -> Duration {
    let watch = client_within(Duration::from_secs(2));
    let client = client_within(Duration::from_secs(120));
    let base = base.to_owned();
    let request = tokio::spawn(async move {
        let response = client.post(format!("{base}/v1/completions")).json(&body).send().await;
        // A streamed response: read a little, then leave.
        if let Ok(mut response) = response {
            let _ = response.chunk().await;
            std::future::pending::<()>().await;
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    while processing(&watch, &engine.url).await != Some(1.0) {
        assert!(Instant::now() < deadline, "the engine never started the request");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Let it run (and, streamed, send its first tokens).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(processing(&watch, &engine.url).await, Some(1.0), "still running before the client leaves");
    request.abort();
    let _ = request.await;
    let left = Instant::now();
    while processing(&watch, &engine.url).await != Some(0.0) {
        assert!(left.elapsed() < Duration::from_secs(5), "the engine kept the slot 5 s after the client left");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    left.elapsed()
}

// Streamed and not: llama.cpp notices that the client of a whole
// (non-streamed) request left only after a full second without any other
// task result, and every scrape of `/metrics` or `/slots` is one, so
// loadgate sends it non-streamed requests streamed and answers them whole
// (`loadgate::engines::StreamAssembler`); scraped every 50 ms here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs llama-server: bash scripts/prepare-llama-server, then cargo test --test real_engines -- --ignored"]
async fn a_client_that_leaves_frees_the_engine_slot_streamed_or_not() {
    let engine = Engine::start();
    // Through a sidecar and a frontend, then through a frontend alone.
    let frontend = Frontend::secured(&[]);
    let sidecar = sidecar(&engine, &frontend, 4, 2);
    frontend.wait_workers(1, Duration::from_secs(20)).await;
    whole_answers_are_assembled(&frontend.http).await;
    for stream in [true, false] {
        let freed = abandon(&frontend.http, &engine, long_request(2000, stream)).await;
        eprintln!("through a sidecar, stream {stream}: slot free {} ms after the client left", freed.as_millis());
    }
    drop(sidecar);
    drop(frontend);

    let spec = engine.spec();
    let direct = Frontend::start(None, &["--engine", &spec, "--engine-scrape-interval-ms", "50"]);
    direct.wait_workers(1, Duration::from_secs(60)).await;
    whole_answers_are_assembled(&direct.http).await;
    for stream in [true, false] {
        let freed = abandon(&direct.http, &engine, long_request(2000, stream)).await;
        eprintln!("frontend --engine, stream {stream}: slot free {} ms after the client left", freed.as_millis());
    }
}

/// A non-streamed completion and chat completion through `base` come back
/// whole, in the unstreamed shape, with every token generated.
async fn whole_answers_are_assembled(base: &str) {
    let client = client_within(Duration::from_secs(60));
    let (status, body) = post(&client, base, &long_request(24, false)).await;
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).expect("a JSON answer");
    assert_eq!(answer["object"], "text_completion", "{body}");
    assert_eq!(answer["usage"]["completion_tokens"], 24, "{body}");
    assert!(answer["choices"][0]["text"].as_str().is_some_and(|t| !t.is_empty()), "{body}");
    assert_eq!(answer["choices"][0]["finish_reason"], "length", "{body}");
    let chat = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "say something"}],
        "max_tokens": 12,
        "ignore_eos": true,
    });
    let response = client.post(format!("{base}/v1/chat/completions")).json(&chat).send().await.expect("chat");
    assert_eq!(response.status(), 200);
    let answer: Value = response.json().await.expect("a JSON chat answer");
    assert_eq!(answer["object"], "chat.completion", "{answer}");
    assert_eq!(answer["choices"][0]["message"]["role"], "assistant", "{answer}");
    assert!(answer["choices"][0]["message"]["content"].is_string(), "{answer}");
    assert_eq!(answer["usage"]["completion_tokens"], 12, "{answer}");
}
