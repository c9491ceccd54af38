//! The fake engines: small axum servers in this test process, each on its
//! own thread and runtime on a free 127.0.0.1 port, serving canned
//! llama.cpp or vLLM `/metrics`, llama.cpp `/slots`, `/v1/models` and
//! completions, set by the test; they count what they receive.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{json, Value};

use crate::common::PROOF_HEADER;
use crate::{MODEL, SETTLE};

/// Which engine's documents the fake serves.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    LlamaCpp,
    Vllm,
}

/// What the test sets and the fake reports.
#[derive(Default)]
pub(crate) struct Load {
    /// llama.cpp: `requests_processing`; the first this many slots are processing.
    pub(crate) running: u32,
    /// llama.cpp: `requests_deferred`.
    pub(crate) waiting: u32,
    /// llama.cpp: `n_prompt_tokens` of each processing slot (not read: a
    /// busy slot holds its whole context).
    pub(crate) slot_tokens: u32,
    /// llama.cpp: `next_token[0].n_remain` of each processing slot (the
    /// tokens left before its output limit; `None`: not reported).
    pub(crate) remain: Option<i64>,
    /// vLLM: per `engine` rank, (waiting, KV fraction).
    pub(crate) vllm_ranks: Vec<(u32, f64)>,
    /// vLLM: the `engine` label of the first of `vllm_ranks` (vLLM labels
    /// ranks by their global number: an engine behind an external balancer
    /// may serve rank 3 alone).
    pub(crate) vllm_first_rank: u32,
    /// `/metrics` answers 500.
    pub(crate) fail: bool,
    /// `/metrics` answers only after 2 s (past any scrape timeout here).
    pub(crate) stall: bool,
    /// Completions answer after this long.
    pub(crate) answer_after: Duration,
    /// llama.cpp: bytes of zeros (`0,0,...`) padding the `next_token` list
    /// of each processing slot: a valid `/slots` that is mostly padding.
    pub(crate) slots_padding: usize,
    /// vLLM: every other `/metrics` shows only the first of `vllm_ranks`
    /// (an engine whose rank count flaps).
    pub(crate) flap_ranks: bool,
}

/// What one completion request brought.
#[derive(Clone, Debug)]
pub(crate) struct Received {
    pub(crate) path: String,
    pub(crate) body: Vec<u8>,
    pub(crate) had_proof: bool,
    /// Sent with `Connection: close`.
    pub(crate) closes: bool,
}

#[derive(Default)]
pub(crate) struct Shared {
    load: Mutex<Load>,
    pub(crate) models: Mutex<Vec<String>>,
    scrapes: AtomicUsize,
    pub(crate) failed_scrapes: AtomicUsize,
    pub(crate) model_lists: AtomicUsize,
    received: Mutex<Vec<Received>>,
    /// The next `/slots` answer waits for the test ([`FakeEngine::hold_next_slots`]).
    slots_hold: Mutex<Option<SlotsHold>>,
}

/// A `/slots` answer the test holds: the fake says when it arrived, and
/// answers with the count of processing slots the test releases it with.
struct SlotsHold {
    arrived: tokio::sync::oneshot::Sender<()>,
    release: tokio::sync::oneshot::Receiver<u32>,
}

/// The test's side of a held `/slots` answer.
pub(crate) struct HeldSlots {
    /// Resolves when the scrape's `/slots` request has arrived.
    pub(crate) arrived: tokio::sync::oneshot::Receiver<()>,
    /// Sends the count of processing slots to answer with.
    pub(crate) release: tokio::sync::oneshot::Sender<u32>,
}

/// A fake engine serving on its own thread; stops on drop.
pub(crate) struct FakeEngine {
    pub(crate) addr: SocketAddr,
    kind: Kind,
    pub(crate) shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeEngine {
    pub(crate) fn start(kind: Kind, models: &[&str]) -> FakeEngine {
        let shared = Arc::new(Shared::default());
        *shared.models.lock().unwrap() = models.iter().map(|m| (*m).to_owned()).collect();
        if kind == Kind::Vllm {
            shared.load.lock().unwrap().vllm_ranks = vec![(0, 0.0)];
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a fake engine");
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let state = Fake { kind, port: addr.port(), shared: shared.clone() };
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let app = axum::Router::new()
                    .route("/metrics", get(metrics))
                    .route("/slots", get(slots))
                    .route("/v1/models", get(models_list))
                    .route("/v1/completions", post(complete))
                    .route("/v1/chat/completions", post(complete))
                    .with_state(state);
                let _ = axum::serve(listener, app)
                    .with_graceful_shutdown(async {
                        let _ = stopped.await;
                    })
                    .await;
            });
        });
        FakeEngine { addr, kind, shared, stop: Some(stop), thread: Some(thread) }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `KIND=URL[,model=NAME]` for `--engine`.
    pub(crate) fn spec(&self, model: Option<&str>) -> String {
        let kind = match self.kind {
            Kind::LlamaCpp => "llamacpp",
            Kind::Vllm => "vllm",
        };
        match model {
            Some(model) => format!("{kind}={},model={model}", self.addr),
            None => format!("{kind}={}", self.addr),
        }
    }

    pub(crate) fn set(&self, change: impl FnOnce(&mut Load)) {
        change(&mut self.shared.load.lock().unwrap());
    }

    /// Holds the next `/slots` request until the test releases it, then
    /// answers it with the count of processing slots given (whatever
    /// [`Load::running`] says by then).
    pub(crate) fn hold_next_slots(&self) -> HeldSlots {
        let (arrived, arrived_rx) = tokio::sync::oneshot::channel();
        let (release_tx, release) = tokio::sync::oneshot::channel();
        *self.shared.slots_hold.lock().unwrap() = Some(SlotsHold { arrived, release });
        HeldSlots { arrived: arrived_rx, release: release_tx }
    }

    pub(crate) fn received(&self) -> Vec<Received> {
        self.shared.received.lock().unwrap().clone()
    }

    pub(crate) fn count(counter: &AtomicUsize) -> usize {
        // Relaxed: a counter read on its own.
        counter.load(Ordering::Relaxed)
    }

    pub(crate) fn scrapes(&self) -> usize {
        Self::count(&self.shared.scrapes)
    }

    /// Waits (bounded) for `n` more scrapes of `/metrics` than now.
    pub(crate) async fn wait_scrapes(&self, n: usize) {
        let target = self.scrapes() + n;
        let deadline = Instant::now() + SETTLE;
        while self.scrapes() < target {
            assert!(Instant::now() < deadline, "the engine was not scraped {n} more times");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Waits until the engine has received `n` requests in all.
    pub(crate) async fn wait_received(&self, n: usize) {
        let deadline = Instant::now() + SETTLE;
        while self.received().len() < n {
            assert!(Instant::now() < deadline, "the engine did not receive {n} requests");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl Drop for FakeEngine {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What every handler of a fake engine gets.
#[derive(Clone)]
struct Fake {
    kind: Kind,
    port: u16,
    shared: Arc<Shared>,
}

type FakeState = State<Fake>;

async fn metrics(State(Fake { kind, shared, .. }): FakeState) -> Response {
    // Relaxed: counters the test reads on their own.
    let scrape = shared.scrapes.fetch_add(1, Ordering::Relaxed);
    let (fail, stall) = {
        let load = shared.load.lock().unwrap();
        (load.fail, load.stall)
    };
    if fail || stall {
        // Counted first: a stalled scrape's handler is dropped when the scraper gives up.
        shared.failed_scrapes.fetch_add(1, Ordering::Relaxed);
    }
    if stall {
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    if fail {
        return (StatusCode::INTERNAL_SERVER_ERROR, "metrics broke").into_response();
    }
    let load = shared.load.lock().unwrap();
    let text = match kind {
        Kind::LlamaCpp => format!(
            "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens\n\
             # TYPE llamacpp:prompt_tokens_total counter\n\
             llamacpp:prompt_tokens_total 1234\n\
             # HELP llamacpp:requests_processing Number of requests processing\n\
             # TYPE llamacpp:requests_processing gauge\n\
             llamacpp:requests_processing {}\n\
             # HELP llamacpp:requests_deferred Number of requests deferred\n\
             # TYPE llamacpp:requests_deferred gauge\n\
             llamacpp:requests_deferred {}\n",
            load.running, load.waiting
        ),
        Kind::Vllm => {
            let ranks = match load.flap_ranks && scrape % 2 == 1 {
                true => &load.vllm_ranks[..1],
                false => &load.vllm_ranks[..],
            };
            vllm_metrics(ranks, load.vllm_first_rank)
        }
    };
    ([("content-type", "text/plain; version=0.0.4")], text).into_response()
}

/// A vLLM exposition with one `engine` label value per rank from `first`,
/// as vLLM 0.10 writes it (`model_name` label, `cache_config_info` with
/// `num_gpu_blocks`).
fn vllm_metrics(ranks: &[(u32, f64)], first: u32) -> String {
    let mut text = String::new();
    let family = |text: &mut String, name: &str, kind: &str, value: &dyn Fn(u32, &(u32, f64)) -> String| {
        text.push_str(&format!("# HELP {name} A vLLM metric.\n# TYPE {name} {kind}\n"));
        for (rank, load) in (first..).zip(ranks) {
            text.push_str(&format!("{name}{{engine=\"{rank}\",model_name=\"{MODEL}\"}} {}\n", value(rank, load)));
        }
    };
    family(&mut text, "vllm:num_requests_running", "gauge", &|_, _| "1.0".to_owned());
    family(&mut text, "vllm:num_requests_waiting", "gauge", &|_, (waiting, _)| format!("{waiting:.1}"));
    family(&mut text, "vllm:kv_cache_usage_perc", "gauge", &|_, (_, kv)| format!("{kv}"));
    text.push_str("# HELP vllm:cache_config_info Information of the LLMCache\n# TYPE vllm:cache_config_info gauge\n");
    for rank in (first..).take(ranks.len()) {
        text.push_str(&format!(
            "vllm:cache_config_info{{block_size=\"16\",engine=\"{rank}\",num_gpu_blocks=\"1000\"}} 1.0\n"
        ));
    }
    text
}

/// Four slots of 512 tokens; the first `running` are processing (or as
/// many as a held answer is released with).
async fn slots(State(Fake { shared, .. }): FakeState) -> Response {
    let hold = shared.slots_hold.lock().unwrap().take();
    let released = match hold {
        Some(SlotsHold { arrived, release }) => {
            let _ = arrived.send(());
            // A test that drops its side answers with the current load.
            release.await.ok()
        }
        None => None,
    };
    let load = shared.load.lock().unwrap();
    let running = released.unwrap_or(load.running);
    if load.slots_padding > 0 {
        return padded_slots(running, load.slots_padding).into_response();
    }
    let slots: Vec<Value> = (0..4)
        .map(|id| {
            if id < running {
                let mut slot =
                    json!({"id": id, "n_ctx": 512, "is_processing": true, "n_prompt_tokens": load.slot_tokens});
                if let Some(remain) = load.remain {
                    slot["next_token"] = json!([{"has_next_token": true, "n_remain": remain}]);
                }
                slot
            } else {
                json!({"id": id, "n_ctx": 512, "is_processing": false})
            }
        })
        .collect();
    axum::Json(Value::Array(slots)).into_response()
}

/// Four slots of 512 tokens, the first `running` processing with no
/// output limit and `padding` bytes of zeros after their `next_token` entry.
fn padded_slots(running: u32, padding: usize) -> String {
    let zeros = ",0".repeat(padding / 2);
    let slots: Vec<String> = (0..4)
        .map(|id| match id < running {
            true => {
                format!(r#"{{"id":{id},"n_ctx":512,"is_processing":true,"next_token":[{{"n_remain":-1}}{zeros}]}}"#)
            }
            false => format!(r#"{{"id":{id},"n_ctx":512,"is_processing":false}}"#),
        })
        .collect();
    format!("[{}]", slots.join(","))
}

async fn models_list(State(Fake { shared, .. }): FakeState) -> Response {
    // Relaxed: a counter.
    shared.model_lists.fetch_add(1, Ordering::Relaxed);
    let data: Vec<Value> = shared
        .models
        .lock()
        .unwrap()
        .iter()
        .map(|id| json!({"id": id, "object": "model", "owned_by": "llamacpp"}))
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// A completion (non-streamed) or an SSE stream of three chunks, naming
/// this engine's port so the test can tell engines apart.
async fn complete(
    State(Fake { port, shared, .. }): FakeState,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let had_proof = headers.contains_key(PROOF_HEADER);
    let closes = headers.get("connection").is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
    shared.received.lock().unwrap().push(Received {
        path: uri.path().to_owned(),
        body: body.to_vec(),
        had_proof,
        closes,
    });
    let wait = shared.load.lock().unwrap().answer_after;
    tokio::time::sleep(wait).await;
    let stream = serde_json::from_slice::<Value>(&body).ok().and_then(|v| v["stream"].as_bool()).unwrap_or(false);
    if stream {
        let chat = uri.path().ends_with("/chat/completions");
        let chunk = |text: &str| {
            let choice =
                if chat { json!({"index": 0, "delta": {"content": text}}) } else { json!({"index": 0, "text": text}) };
            format!("data: {}\n\n", json!({"choices": [choice]}))
        };
        let sse = format!("{}{}data: [DONE]\n\n", chunk(&format!("engine-{port}")), chunk(" more"));
        ([("content-type", "text/event-stream")], sse).into_response()
    } else {
        let answer = json!({
            "id": "cmpl-fake", "object": "text_completion", "model": MODEL,
            "choices": [{"index": 0, "text": format!("engine-{port}"), "finish_reason": "stop"}],
        });
        axum::Json(answer).into_response()
    }
}
