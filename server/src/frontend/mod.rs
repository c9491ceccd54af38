//! `loadgate frontend`: the HTTP frontend. Routes OpenAI requests to
//! workers, excludes busy ones, sheds load when all are busy, migrates on a
//! worker's hard-cap refusal, and serves the admin routes.
//!
//! Workers join over the event plane ([`EventPlane`]) or with `--worker URL`
//! (registered from `URL/info`). This file wires the routes and serves them;
//! the shared state is [`Frontend`] (`state.rs`), and each route group has
//! its own file: `proxy.rs` (the OpenAI routes), `threshold_api.rs`
//! (`/busy_threshold`), `admin.rs` (`/v1/models`, `/health`, `/metrics`).

mod admin;
mod args;
mod inflight;
mod proxy;
mod register;
mod reply;
mod state;
mod threshold_api;

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::{get, post};
use axum::serve::ListenerExt;
use loadgate::{MonitorConfig, WorkerMonitor};

pub use self::args::Args;
pub use self::state::Frontend;
use crate::directory::WorkerDirectory;
use crate::events::EventPlane;

/// How long a worker whose event connection closed stays registered, waiting
/// for it to reconnect.
pub const DEREGISTER_GRACE: Duration = Duration::from_millis(500);

/// The frontend's routes.
pub fn app(frontend: Arc<Frontend>) -> axum::Router {
    axum::Router::new()
        .route("/v1/completions", post(proxy::completions))
        .route("/v1/chat/completions", post(proxy::chat_completions))
        .route("/v1/models", get(admin::models))
        .route("/health", get(admin::health))
        .route("/metrics", get(admin::metrics))
        .route("/busy_threshold", get(threshold_api::read_all).post(threshold_api::update))
        .with_state(frontend)
}

/// A frontend serving on its ports (see [`start`]); stops when dropped.
#[derive(Debug)]
pub struct RunningFrontend {
    /// The HTTP address.
    pub http: SocketAddr,
    /// The event-plane address.
    pub events: SocketAddr,
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
        register::register_http_worker(&frontend, url).await?;
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
    Ok(RunningFrontend { http, events: plane.local_addr(), server, expiry, _plane: plane })
}

/// Runs `loadgate frontend` until Ctrl-C / SIGTERM.
///
/// # Errors
///
/// As [`start`].
pub fn run(args: Args) -> anyhow::Result<()> {
    crate::logging::init_logging();
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
