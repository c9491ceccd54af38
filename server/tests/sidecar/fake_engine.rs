//! The fake engine: a small axum server in this test process on a free
//! 127.0.0.1 port, speaking vLLM's `/metrics` and `/v1/models`, whose
//! completions answer after a delay or stream slowly; it counts its
//! concurrent requests and records when each connection closed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use serde_json::{json, Value};

/// The model the fake engine lists.
pub(crate) const MODEL: &str = "fake/model-7b";

/// One request the fake engine received.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    /// The connection it came on.
    pub(crate) conn: usize,
    pub(crate) path: String,
    pub(crate) body: Bytes,
    pub(crate) headers: HeaderMap,
}

/// What the fake engine shares between its handlers and the test.
struct EngineState {
    /// Completions in progress now.
    running: AtomicUsize,
    /// The most ever in progress at once.
    max_running: AtomicUsize,
    /// Every completion received, in order.
    seen: Mutex<Vec<Seen>>,
    /// When each connection closed, by connection number.
    closed: Mutex<HashMap<usize, Instant>>,
    next_conn: AtomicUsize,
    /// `vllm:num_requests_waiting` of each rank.
    waiting: Vec<AtomicU32>,
    /// `/metrics` answers (else 500: a failing scrape).
    metrics_up: AtomicBool,
    /// `/metrics` fails every other time (an engine that flaps).
    metrics_flap: AtomicBool,
    /// `/metrics` requests received.
    scrapes: AtomicUsize,
    /// The model `/v1/models` lists.
    model: Mutex<String>,
    /// `/v1/models` answers (else 503, as an engine still loading its model).
    models_up: AtomicBool,
    /// Completions get no answer: their connection is dropped (as a dead
    /// engine's would be reset) while `/metrics` still answers.
    hang_up: AtomicBool,
}

/// Counts a completion as running until dropped.
struct Running(Arc<EngineState>);

impl Running {
    fn new(state: &Arc<EngineState>) -> Running {
        // Relaxed: test counters, read after the fact.
        let now = state.running.fetch_add(1, Ordering::Relaxed) + 1;
        state.max_running.fetch_max(now, Ordering::Relaxed);
        Running(state.clone())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // Relaxed: as in `new`.
        self.0.running.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The connection a request came on.
#[derive(Clone, Copy)]
struct ConnId(usize);

/// A fake engine on a free 127.0.0.1 port; its tasks end with the test's runtime.
pub(crate) struct FakeEngine {
    /// `HOST:PORT`.
    addr: String,
    state: Arc<EngineState>,
}

impl FakeEngine {
    /// A fake vLLM with `ranks` data-parallel ranks (an `engine` label each).
    pub(crate) async fn start(ranks: usize) -> FakeEngine {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the fake engine");
        let addr = listener.local_addr().expect("its address").to_string();
        let state = Arc::new(EngineState {
            running: AtomicUsize::new(0),
            max_running: AtomicUsize::new(0),
            seen: Mutex::new(Vec::new()),
            closed: Mutex::new(HashMap::new()),
            next_conn: AtomicUsize::new(0),
            waiting: (0..ranks).map(|_| AtomicU32::new(0)).collect(),
            metrics_up: AtomicBool::new(true),
            metrics_flap: AtomicBool::new(false),
            scrapes: AtomicUsize::new(0),
            model: Mutex::new(MODEL.to_owned()),
            models_up: AtomicBool::new(true),
            hang_up: AtomicBool::new(false),
        });
        let shared = state.clone();
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else { continue };
                // Relaxed: a unique number per connection.
                let conn = shared.next_conn.fetch_add(1, Ordering::Relaxed);
                let app = Router::new()
                    .route("/v1/completions", post(completion))
                    .route("/v1/chat/completions", post(completion))
                    .route("/v1/models", get(models))
                    .route("/metrics", get(metrics))
                    .with_state(shared.clone())
                    .layer(Extension(ConnId(conn)));
                let state = shared.clone();
                tokio::spawn(async move {
                    let service = hyper_util::service::TowerToHyperService::new(app);
                    let builder = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
                    let _ = builder.serve_connection(hyper_util::rt::TokioIo::new(tcp), service).await;
                    state.closed.lock().unwrap().insert(conn, Instant::now());
                });
            }
        });
        FakeEngine { addr, state }
    }

    /// `--engine vllm=HOST:PORT`.
    pub(crate) fn spec(&self) -> String {
        format!("vllm={}", self.addr)
    }

    pub(crate) fn set_waiting(&self, waiting: &[u32]) {
        for (rank, n) in waiting.iter().enumerate() {
            // Relaxed: read by the next /metrics answer.
            self.state.waiting[rank].store(*n, Ordering::Relaxed);
        }
    }

    pub(crate) fn set_metrics_up(&self, up: bool) {
        // Relaxed: read by the next /metrics answer.
        self.state.metrics_up.store(up, Ordering::Relaxed);
    }

    /// Whether `/metrics` fails every other time from now on.
    pub(crate) fn set_metrics_flap(&self, flap: bool) {
        // Relaxed: read by the next /metrics answer.
        self.state.metrics_flap.store(flap, Ordering::Relaxed);
    }

    /// Waits (bounded by `within`) until `n` more scrapes than now have
    /// come; false if they did not.
    pub(crate) async fn wait_scrapes(&self, n: usize, within: Duration) -> bool {
        // Relaxed: a counter read on its own.
        let target = self.state.scrapes.load(Ordering::Relaxed) + n;
        let deadline = Instant::now() + within;
        while self.state.scrapes.load(Ordering::Relaxed) < target {
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }

    /// Completions from now on get their connection dropped, no answer.
    pub(crate) fn set_hang_up(&self, hang_up: bool) {
        // Relaxed: read by the next completion.
        self.state.hang_up.store(hang_up, Ordering::Relaxed);
    }

    /// Whether `/v1/models` answers from now on (else 503).
    pub(crate) fn set_models_up(&self, up: bool) {
        // Relaxed: read by the next /v1/models answer.
        self.state.models_up.store(up, Ordering::Relaxed);
    }

    /// The model `/v1/models` lists from now on.
    pub(crate) fn set_model(&self, model: &str) {
        model.clone_into(&mut self.state.model.lock().unwrap());
    }

    pub(crate) fn running(&self) -> usize {
        // Relaxed: a counter read on its own.
        self.state.running.load(Ordering::Relaxed)
    }

    pub(crate) fn max_running(&self) -> usize {
        // Relaxed: a counter read on its own.
        self.state.max_running.load(Ordering::Relaxed)
    }

    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    /// Waits (bounded) until exactly `n` completions run on the engine.
    pub(crate) async fn wait_running(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.running() != n {
            assert!(Instant::now() < deadline, "{} completions run on the engine, not {n}", self.running());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Waits (bounded) until the engine has received `n` completions.
    pub(crate) async fn wait_seen(&self, n: usize) -> Vec<Seen> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let seen = self.seen();
            if seen.len() >= n {
                return seen;
            }
            assert!(Instant::now() < deadline, "the engine received {} completions, not {n}", seen.len());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// When connection `conn` closed, waiting for it at most `within`.
    pub(crate) async fn closed_at(&self, conn: usize, within: Duration) -> Option<Instant> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(at) = self.state.closed.lock().unwrap().get(&conn) {
                return Some(*at);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// A completion. Knobs in the body (an engine ignores fields it does not
/// know; the sidecar passes the body as received): `max_tokens` chunks,
/// `token_ms` between them, `stream`, and `status` for an error answer.
/// Not streamed: the whole answer after `max_tokens * token_ms`. Streamed:
/// the first chunk at once, then one per `token_ms`, then `[DONE]`.
async fn completion(
    State(state): State<Arc<EngineState>>,
    Extension(ConnId(conn)): Extension<ConnId>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    state.seen.lock().unwrap().push(Seen { conn, path: uri.path().to_owned(), body, headers });
    // Relaxed: a flag the test sets.
    if state.hang_up.load(Ordering::Relaxed) {
        // Ends the connection's task: the connection closes unanswered.
        panic!("the fake engine hangs up (a test's doing, not a failure)");
    }
    if let Some(status) = request["status"].as_u64() {
        let status = StatusCode::from_u16(status as u16).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return (status, [(header::CONTENT_TYPE, "application/json")], r#"{"error":"fake engine error"}"#)
            .into_response();
    }
    let running = Running::new(&state);
    let tokens = request["max_tokens"].as_u64().unwrap_or(1);
    let pause = Duration::from_millis(request["token_ms"].as_u64().unwrap_or(0));
    if request["stream"].as_bool() == Some(true) {
        let chunks = futures_util::stream::unfold((0, Some(running)), move |(i, running)| async move {
            let running = running?;
            if i > 0 {
                tokio::time::sleep(pause).await;
            }
            if i == tokens {
                return Some((Ok::<_, std::convert::Infallible>(Bytes::from_static(b"data: [DONE]\n\n")), (i, None)));
            }
            Some((Ok(Bytes::from(sse_chunk(i))), (i + 1, Some(running))))
        });
        return ([(header::CONTENT_TYPE, "text/event-stream")], Body::from_stream(chunks)).into_response();
    }
    tokio::time::sleep(pause * tokens as u32).await;
    drop(running);
    ([(header::CONTENT_TYPE, "application/json")], whole_answer(tokens)).into_response()
}

/// Chunk `i` of a fake stream.
pub(crate) fn sse_chunk(i: u64) -> String {
    format!("data: {{\"choices\":[{{\"index\":0,\"text\":\"t{i}\"}}]}}\n\n")
}

/// The whole fake stream of `tokens` chunks.
pub(crate) fn whole_stream(tokens: u64) -> String {
    (0..tokens).map(sse_chunk).collect::<String>() + "data: [DONE]\n\n"
}

/// The fake engine's non-streamed answer.
pub(crate) fn whole_answer(tokens: u64) -> String {
    format!(
        r#"{{"id":"fake","object":"text_completion","choices":[{{"index":0,"text":"x","finish_reason":"length"}}],"usage":{{"prompt_tokens":1,"completion_tokens":{tokens},"total_tokens":{}}}}}"#,
        tokens + 1
    )
}

async fn models(State(state): State<Arc<EngineState>>) -> Response {
    // Relaxed: a flag read on its own.
    if !state.models_up.load(Ordering::Relaxed) {
        return (StatusCode::SERVICE_UNAVAILABLE, "loading model").into_response();
    }
    let model = state.model.lock().unwrap().clone();
    let body = json!({"object": "list", "data": [{"id": model, "object": "model", "owned_by": "vllm"}]});
    ([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

/// vLLM's load gauges, one series per rank (`engine` label).
async fn metrics(State(state): State<Arc<EngineState>>) -> Response {
    // Relaxed: flags and counters read on their own.
    let scrape = state.scrapes.fetch_add(1, Ordering::Relaxed);
    let flapped = state.metrics_flap.load(Ordering::Relaxed) && scrape % 2 == 1;
    if !state.metrics_up.load(Ordering::Relaxed) || flapped {
        return (StatusCode::INTERNAL_SERVER_ERROR, "down").into_response();
    }
    let mut text = String::new();
    for (family, help) in [
        ("vllm:num_requests_running", "Number of requests in model execution batches."),
        ("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
        ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
    ] {
        text.push_str(&format!("# HELP {family} {help}\n# TYPE {family} gauge\n"));
        for (rank, waiting) in state.waiting.iter().enumerate() {
            let value = match family {
                "vllm:num_requests_running" => (state.running.load(Ordering::Relaxed) as f64).to_string(),
                "vllm:num_requests_waiting" => (waiting.load(Ordering::Relaxed) as f64).to_string(),
                _ => "0.25".to_owned(),
            };
            text.push_str(&format!("{family}{{engine=\"{rank}\",model_name=\"{MODEL}\"}} {value}\n"));
        }
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}
