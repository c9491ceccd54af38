//! `loadgate frontend`: the HTTP frontend. Routes OpenAI requests to
//! workers, excludes busy ones, sheds load when all are busy, migrates on a
//! worker's hard-cap refusal, and serves the admin routes.
//!
//! Workers join over the event plane ([`EventPlane`]) or with `--worker URL`
//! (registered from `URL/info`).

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use axum::Json;
use serde_json::{json, Value};

use crate::server::directory::WorkerDirectory;
use crate::server::events::EventPlane;
use crate::server::inflight::{InFlight, Tracking};
use crate::server::{proxy, threshold_api};
use crate::{BusyThresholds, MonitorConfig, Policy, RejectionMetrics, Router, WorkerMonitor, DEFAULT_MIGRATION_LIMIT};

/// How long a worker whose event connection closed stays registered, waiting
/// for it to reconnect.
pub const DEREGISTER_GRACE: Duration = Duration::from_millis(500);
/// How long `--worker URL` keeps retrying `URL/info` before giving up.
const WORKER_INFO_DEADLINE: Duration = Duration::from_secs(30);

/// How the router picks among eligible workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RouterMode {
    /// Each in turn.
    RoundRobin,
    /// Uniformly at random.
    Random,
    /// The less loaded of two random workers.
    P2c,
    /// The least loaded (by reported load).
    LeastLoaded,
    /// The least loaded, counting the router's own tracked load (KV-aware).
    Kv,
}

/// The older `--admission-control` flag, kept for compatibility.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AdmissionControl {
    /// Busy detection with the given thresholds (the default).
    TokenCapacity,
    /// No busy detection: every threshold is cleared.
    None,
}

/// Command-line arguments of `loadgate frontend`.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// HTTP port on 127.0.0.1 (0 picks a free one).
    #[arg(long, default_value_t = 8000)]
    pub http_port: u16,
    /// Event-plane port on 127.0.0.1 where workers push load (0 picks a free one).
    #[arg(long, default_value_t = 8001)]
    pub event_port: u16,
    /// A worker to register from `URL/info` (repeatable); for workers not on the event plane.
    #[arg(long = "worker", value_name = "URL")]
    pub workers: Vec<String>,
    /// Worker selection policy.
    #[arg(long, value_enum, default_value = "round-robin")]
    pub router_mode: RouterMode,
    /// A worker rank is busy when active decode blocks / total blocks exceed this (0..=1).
    #[arg(long)]
    pub active_decode_blocks_threshold: Option<f64>,
    /// A worker rank is busy when active prefill tokens exceed this.
    #[arg(long)]
    pub active_prefill_tokens_threshold: Option<u64>,
    /// A worker rank is busy when active prefill tokens exceed this fraction of max_num_batched_tokens.
    #[arg(long)]
    pub active_prefill_tokens_threshold_frac: Option<f64>,
    /// A worker rank is busy when the requests waiting in its engine's queue exceed this.
    #[arg(long)]
    pub active_waiting_requests_threshold: Option<u64>,
    /// Compatibility: `none` disables busy detection (clears every threshold).
    #[arg(long, value_enum)]
    pub admission_control: Option<AdmissionControl>,
    /// In `kv` mode, also track blocks for output tokens as they stream.
    #[arg(long)]
    pub router_track_output_blocks: bool,
    /// How many workers may refuse one request (hard cap) before the client gets the overload status.
    #[arg(long, default_value_t = DEFAULT_MIGRATION_LIMIT)]
    pub migration_limit: usize,
    /// A worker rank whose last report is older than this counts as not reported.
    #[arg(long, value_name = "MS")]
    pub load_staleness_ms: Option<u64>,
}

impl Args {
    /// The thresholds every model starts with.
    pub fn default_thresholds(&self) -> BusyThresholds {
        if self.admission_control == Some(AdmissionControl::None) {
            return BusyThresholds::default();
        }
        BusyThresholds {
            active_decode_blocks_threshold: self.active_decode_blocks_threshold,
            active_prefill_tokens_threshold: self.active_prefill_tokens_threshold,
            active_prefill_tokens_threshold_frac: self.active_prefill_tokens_threshold_frac,
            active_waiting_requests_threshold: self.active_waiting_requests_threshold,
        }
    }

    fn policy(&self) -> Policy {
        match self.router_mode {
            RouterMode::RoundRobin => Policy::RoundRobin,
            RouterMode::Random => Policy::Random,
            RouterMode::P2c => Policy::PowerOfTwoChoices,
            RouterMode::LeastLoaded | RouterMode::Kv => Policy::LeastLoaded,
        }
    }
}

/// The frontend's shared state, handed to every route.
#[derive(Debug)]
pub struct Frontend {
    pub(crate) monitor: Arc<WorkerMonitor>,
    pub(crate) router: Router,
    pub(crate) directory: Arc<WorkerDirectory>,
    pub(crate) metrics: RejectionMetrics,
    pub(crate) inflight: Arc<InFlight>,
    pub(crate) client: reqwest::Client,
    pub(crate) migration_limit: usize,
}

impl Frontend {
    /// A frontend over `monitor` configured by `args`.
    ///
    /// # Errors
    ///
    /// The HTTP client could not be built.
    pub fn new(args: &Args, monitor: Arc<WorkerMonitor>, directory: Arc<WorkerDirectory>) -> anyhow::Result<Self> {
        let tracking =
            (args.router_mode == RouterMode::Kv).then_some(Tracking { output_blocks: args.router_track_output_blocks });
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .pool_idle_timeout(Duration::from_secs(30))
            .tcp_nodelay(true)
            .build()?;
        Ok(Frontend {
            router: Router::new(monitor.clone(), args.policy()),
            inflight: Arc::new(InFlight::new(monitor.clone(), tracking)),
            monitor,
            directory,
            metrics: RejectionMetrics::default(),
            client,
            migration_limit: args.migration_limit,
        })
    }

    /// The worker monitor.
    pub fn monitor(&self) -> &Arc<WorkerMonitor> {
        &self.monitor
    }

    /// The rejection counters.
    pub fn metrics(&self) -> &RejectionMetrics {
        &self.metrics
    }
}

/// The frontend's routes.
pub fn app(frontend: Arc<Frontend>) -> axum::Router {
    axum::Router::new()
        .route("/v1/completions", post(proxy::completions))
        .route("/v1/chat/completions", post(proxy::chat_completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/busy_threshold", get(threshold_api::read_all).post(threshold_api::update))
        .with_state(frontend)
}

async fn models(State(frontend): State<Arc<Frontend>>) -> Json<Value> {
    let data: Vec<Value> = frontend
        .monitor
        .models()
        .into_iter()
        .map(|id| json!({"id": id, "object": "model", "owned_by": "loadgate"}))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

async fn health(State(frontend): State<Arc<Frontend>>) -> Json<Value> {
    Json(json!({"status": "healthy", "workers": frontend.monitor.workers().len()}))
}

/// `GET /metrics`: the rejection counters and per-rank load
/// ([`RejectionMetrics::render_frontend`]) plus what in-flight requests hold.
async fn metrics(State(frontend): State<Arc<Frontend>>) -> Response {
    let mut text = frontend.metrics.render_frontend(&frontend.monitor);
    let totals = frontend.inflight.totals();
    let extra = [
        (
            "loadgate_frontend_inflight_requests",
            "Requests dispatched to a worker whose response has not ended",
            totals.requests,
        ),
        (
            "loadgate_frontend_tracked_blocks",
            "KV blocks the router tracks for in-flight requests (kv mode)",
            totals.tracked_blocks,
        ),
        (
            "loadgate_frontend_tracked_prefill_tokens",
            "Prefill tokens the router tracks for in-flight requests (kv mode)",
            totals.tracked_prefill_tokens,
        ),
        ("loadgate_frontend_workers", "Registered workers", frontend.monitor.workers().len() as u64),
    ];
    let mut lines = String::new();
    for (name, help, value) in extra {
        lines.push_str(&format!("# HELP {name} {help}.\n# TYPE {name} gauge\n{name} {value}\n"));
    }
    // Keep the OpenMetrics terminator last.
    match text.rfind("# EOF") {
        Some(at) => text.insert_str(at, &lines),
        None => text.push_str(&lines),
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

/// A frontend serving on its ports (see [`start`]); stops when dropped.
#[derive(Debug)]
pub struct RunningFrontend {
    /// The HTTP address.
    pub http: SocketAddr,
    /// The event-plane address.
    pub events: SocketAddr,
    /// The shared state.
    pub frontend: Arc<Frontend>,
    server: tokio::task::JoinHandle<()>,
    expiry: Option<tokio::task::JoinHandle<()>>,
    _plane: EventPlane,
}

impl Drop for RunningFrontend {
    fn drop(&mut self) {
        self.server.abort();
        if let Some(expiry) = &self.expiry {
            expiry.abort();
        }
    }
}

/// Binds both ports on 127.0.0.1, starts the event plane, registers the
/// `--worker` workers, and serves HTTP on the current tokio runtime.
///
/// # Errors
///
/// Invalid thresholds, a port that cannot be bound, or a `--worker` whose
/// `/info` never answered.
pub async fn start(args: Args) -> anyhow::Result<RunningFrontend> {
    let config = MonitorConfig {
        staleness: args.load_staleness_ms.map(Duration::from_millis),
        default_thresholds: args.default_thresholds(),
    };
    let monitor = Arc::new(WorkerMonitor::new(config).map_err(|e| anyhow::anyhow!("invalid threshold: {e}"))?);
    let directory = Arc::new(WorkerDirectory::default());
    let frontend = Arc::new(Frontend::new(&args, monitor.clone(), directory.clone())?);

    let event_listener = std::net::TcpListener::bind(("127.0.0.1", args.event_port))?;
    let plane = EventPlane::start(event_listener, monitor.clone(), directory.clone(), DEREGISTER_GRACE)?;
    for url in &args.workers {
        register_http_worker(&frontend, url).await?;
    }
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.http_port)).await?;
    let http = listener.local_addr()?;
    let router = app(frontend.clone());
    // No Nagle delay on small SSE chunks.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let server = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router).await {
            tracing::error!(error = %e, "HTTP server failed");
        }
    });
    let expiry = args.load_staleness_ms.map(|ms| {
        let monitor = monitor.clone();
        let period = Duration::from_millis((ms / 4).clamp(1, 1000));
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(period);
            loop {
                ticks.tick().await;
                monitor.expire_stale();
            }
        })
    });
    Ok(RunningFrontend { http, events: plane.local_addr(), frontend, server, expiry, _plane: plane })
}

/// Registers the worker at `url` from its `GET /info`, retrying until it
/// answers (bounded).
async fn register_http_worker(frontend: &Frontend, url: &str) -> anyhow::Result<()> {
    let base = url.trim_end_matches('/');
    let base = if base.contains("://") { base.to_owned() } else { format!("http://{base}") };
    let deadline = tokio::time::Instant::now() + WORKER_INFO_DEADLINE;
    let info: Value = loop {
        match frontend.client.get(format!("{base}/info")).send().await {
            Ok(r) if r.status().is_success() => break r.json().await?,
            Ok(r) => tracing::info!(%base, status = %r.status(), "worker /info not ready; retrying"),
            Err(e) => tracing::info!(%base, error = %e, "worker /info unreachable; retrying"),
        }
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!("worker {base} did not answer /info within {WORKER_INFO_DEADLINE:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let worker = info.get("worker_id").and_then(Value::as_u64);
    let model = info.get("model").and_then(Value::as_str);
    let dp_size = info.get("dp_size").and_then(Value::as_u64).unwrap_or(1);
    // Reports never come over HTTP, so any incarnation the worker names
    // does; 0 for one that names none.
    let incarnation = info.get("incarnation").and_then(Value::as_u64).unwrap_or(0);
    let (Some(worker), Some(model)) = (worker, model) else {
        anyhow::bail!("worker {base}/info lacks worker_id or model: {info}");
    };
    let dp_size = u32::try_from(dp_size)?;
    frontend.monitor.register(worker, model, dp_size, incarnation)?;
    frontend.directory.insert(worker, &base, dp_size);
    tracing::info!(worker, model, dp_size, %base, "worker registered from --worker");
    Ok(())
}

/// Runs `loadgate frontend` until Ctrl-C / SIGTERM.
///
/// # Errors
///
/// As [`start`].
pub fn run(args: Args) -> anyhow::Result<()> {
    super::init_logging();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let running = start(args).await?;
        println!("listening http={} events={}", running.http, running.events);
        std::io::stdout().flush()?;
        shutdown_signal().await;
        tracing::info!("shutting down");
        drop(running);
        Ok(())
    })
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(term) => term,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admission_control_none_clears_thresholds() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: Args,
        }
        let cli = Cli::parse_from(["x", "--active-decode-blocks-threshold", "0.85", "--router-mode", "kv"]);
        assert_eq!(cli.args.default_thresholds().active_decode_blocks_threshold, Some(0.85));
        assert_eq!(cli.args.router_mode, RouterMode::Kv);
        let cli = Cli::parse_from(["x", "--active-decode-blocks-threshold", "0.85", "--admission-control", "none"]);
        assert!(cli.args.default_thresholds().is_empty());
    }
}
