//! `loadgate worker`: a simulated inference worker behind an OpenAI HTTP API.
//!
//! Requests pass the worker's hard cap ([`Admission`], `N + Q`) when
//! `--engine-request-limit N` is given, then run on the simulated
//! continuous-batching [`Engine`]. The permit is held by the response body,
//! so it is released when the response has fully ended: stream finished,
//! error, or client gone. The worker registers itself and pushes its per-rank
//! load to every `--frontend` event port through an [`EventPublisher`].
//!
//! This file starts the worker and wires its routes; the arguments are in
//! `args.rs`, the HTTP handlers and their shared state in `http.rs`, the
//! simulated engine in `engine.rs`.

mod args;
mod engine;
mod http;

use std::io::Write as _;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::routing::{get, post};
use axum::serve::ListenerExt as _;
use axum::Router;
use loadgate::admission::queue_limit_from_env;
use loadgate::Admission;

pub use self::args::Args;
use self::engine::{Engine, LoadSink};
use self::http::Worker;
use crate::events::{EventPublisher, Registration};

/// The worker's routes.
fn app(worker: Arc<Worker>) -> Router {
    Router::new()
        .route("/v1/completions", post(http::completions))
        .route("/v1/chat/completions", post(http::chat_completions))
        .route("/v1/models", get(http::models))
        .route("/health", get(http::health))
        .route("/info", get(http::info))
        .route("/metrics", get(http::metrics))
        .with_state(worker)
}

/// Runs `loadgate worker` until SIGTERM or ctrl-c.
///
/// # Errors
///
/// An invalid admission configuration (`--engine-request-limit 0`, an invalid
/// `DYN_DYNAMO_REQUEST_QUEUE_LIMIT`), or a port that cannot be bound.
pub fn run(args: Args) -> anyhow::Result<()> {
    crate::logging::init_logging();
    let admission = match args.engine_request_limit {
        Some(limit) => Some(
            queue_limit_from_env()
                .and_then(|queue_limit| Admission::new(limit, queue_limit))
                .context("invalid worker admission configuration")?,
        ),
        None => None,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(serve(args, admission))
}

async fn serve(args: Args, admission: Option<Arc<Admission<()>>>) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.http_port))
        .await
        .with_context(|| format!("cannot bind 127.0.0.1:{}", args.http_port))?;
    let addr = listener.local_addr()?;
    let id = args.worker_id.unwrap_or_else(|| fastrand::u64(1..));
    let incarnation = Registration::new_incarnation();
    let registration = Registration {
        worker: id,
        incarnation,
        model: args.model.clone(),
        dp_size: args.dp_size,
        http_addr: addr.to_string(),
    };
    let (sink, publisher) = publish(&args, registration)?;
    let engine = Engine::start(args.engine_config(), sink);
    let worker = Arc::new(Worker {
        id,
        incarnation,
        model: args.model.clone(),
        dp_size: args.dp_size,
        engine,
        admission,
        in_flight: Arc::new(AtomicUsize::new(0)),
    });
    let app = app(worker);
    println!("listening http={addr}");
    std::io::stdout().flush()?;
    tracing::info!(worker_id = id, model = %args.model, %addr, "worker started");
    tokio::select! {
        served = axum::serve(listener.tap_io(|tcp| {
            // Tokens are small writes: without this, Nagle holds each one back.
            let _ = tcp.set_nodelay(true);
        }), app) => served?,
        () = shutdown_signal() => tracing::info!("worker stopping"),
    }
    drop(publisher);
    Ok(())
}

/// Starts pushing registration and load to the frontends (none: a
/// standalone worker); returns the engine's load sink and the publisher to
/// keep alive.
fn publish(args: &Args, registration: Registration) -> anyhow::Result<(LoadSink, Option<Arc<EventPublisher>>)> {
    if args.frontends.is_empty() {
        return Ok((Arc::new(|_, _| {}), None));
    }
    let heartbeat = Duration::from_millis(args.heartbeat_ms);
    let publisher = Arc::new(
        EventPublisher::start(args.frontends.clone(), registration, heartbeat)
            .context("cannot start the event publisher")?,
    );
    let reporter = publisher.clone();
    Ok((Arc::new(move |rank, load| reporter.report(rank, load)), Some(publisher)))
}

/// Resolves on SIGTERM or ctrl-c.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}
