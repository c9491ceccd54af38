//! `loadgate worker`: a simulated inference worker behind an OpenAI HTTP API,
//! or, with `--engine KIND=URL`, a sidecar in front of a real engine.
//!
//! Requests pass the worker's hard cap ([`Admission`], `N + Q`) when
//! `--engine-request-limit N` is given, then run on the simulated
//! continuous-batching [`Simulator`] (or are sent to the real engine). On
//! the simulator the permit is held by the response body, so it is released
//! when the response has fully ended: stream finished, error, client gone,
//! or the client's connection cut for write progress
//! (`--http-write-timeout-secs`, 35 s by default: 5 s past a frontend's). A
//! sidecar holds it until the engine's answer has been read (`upstream/`),
//! whether or not its client has read it yet. The worker
//! registers itself and pushes its per-rank load (the simulator's, or the
//! engine's scraped load, plus the cap's queue) to every `--frontend` event
//! port through an [`EventPublisher`].
//!
//! On SIGTERM (or ctrl-c) it shuts down gracefully: it leaves routing
//! first (a Deregister to every frontend, waited for at most
//! [`DEREGISTER_WAIT`]), then closes its listener and lets in-flight
//! requests, streams included, finish for at most
//! `--graceful-shutdown-timeout-secs` (`DYN_HTTP_GRACEFUL_SHUTDOWN_TIMEOUT_SECS`,
//! default 5 s), then exits 0.
//!
//! This file starts the worker and wires its routes; the arguments are in
//! `args.rs`, the HTTP handlers and their shared state in `http.rs`, the
//! hard cap in `gate.rs`, the replies in `reply.rs`, the simulator in `sim/`,
//! and the sidecar in `sidecar/` (its start, its request path in
//! `forward.rs`, its load reports in `reports.rs`).

mod args;
mod gate;
mod http;
mod nonces;
mod proof;
mod reply;
mod sidecar;
mod sim;

use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use axum::routing::{get, post};
use axum::Router;
use loadgate::admission::{queue_limit_from_env, QUEUE_LIMIT_ENV};
use loadgate::{Admission, RankLoad};

pub use self::args::Args;
use self::gate::Gate;
use self::http::{Backend, Worker};
use self::proof::ProofCheck;
use self::sidecar::{Identity, Sidecar};
use self::sim::{LoadSink, Simulator};
use crate::events::{EventPublisher, Registration, ReportSeq};
use crate::http_server::{self, BodyBudget, ServeConfig};
use crate::nats::{NatsLink, NatsPublisher};
use crate::secret::ProofTarget;

/// The worker's default write-progress deadline (`--http-write-timeout-secs`):
/// the frontend's and 5 s more, so that a client that stalls through a
/// frontend is cut at the frontend first, and the worker is not counted as
/// failing.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(http_server::WRITE_TIMEOUT.as_secs() + 5);

/// The worker's routes.
fn app(worker: Arc<Worker>) -> Router {
    Router::new()
        .route("/v1/completions", post(http::completions))
        .route("/v1/chat/completions", post(http::chat_completions))
        .route("/v1/models", get(http::models))
        .route("/health", get(http::health))
        .route("/info", get(http::info))
        .route("/metrics", get(http::metrics))
        .fallback(reply::no_route)
        .method_not_allowed_fallback(reply::method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(worker.proofs.clone(), proof::require_proof))
        .with_state(worker)
}

/// Runs `loadgate worker` until SIGTERM or ctrl-c.
///
/// # Errors
///
/// An invalid admission configuration (`--engine-request-limit 0`, an invalid
/// `DYN_DYNAMO_REQUEST_QUEUE_LIMIT`), a port that cannot be bound, an
/// unspecified bind address without `--advertise-addr`, or (`--engine`) an
/// engine that does not answer within `--engine-start-timeout-secs`.
pub fn run(args: Args) -> anyhow::Result<()> {
    crate::logging::init_logging();
    let admission = match args.engine_request_limit {
        Some(limit) => Some(
            queue_limit_from_env().and_then(|queue_limit| Admission::new(limit, queue_limit)).with_context(|| {
                format!("invalid worker admission configuration (--engine-request-limit {limit}, {QUEUE_LIMIT_ENV})")
            })?,
        ),
        None => None,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(serve(args, admission))
}

async fn serve(args: Args, admission: Option<Arc<Admission<()>>>) -> anyhow::Result<()> {
    // Refused before binding: nothing listens on an address it cannot announce.
    if args.advertise_addr.is_none() && args.http_host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_unspecified()) {
        anyhow::bail!("--advertise-addr HOST:PORT is required when --http-host is {}", args.http_host);
    }
    let listener = http_server::bind(&args.http_host, args.http_port)
        .await
        .with_context(|| format!("cannot bind {}:{}", args.http_host, args.http_port))?;
    let addr = listener.local_addr()?;
    let advertised = advertise_addr(args.advertise_addr.as_deref(), addr)?;
    let id = args.worker_id.unwrap_or_else(|| fastrand::u64(1..));
    let incarnation = Registration::new_incarnation();
    // One secret for the event plane and the proof on every request.
    let secrets = crate::secret::Secrets::load(args.event_secret_file.as_deref())?.map(Arc::new);
    if secrets.is_none() {
        if addr.ip().is_loopback() {
            tracing::warn!("no event secret: requests are not authenticated");
        } else {
            tracing::warn!(
                %addr,
                "no event secret and --http-host {} is not a loopback address: anyone who reaches {addr} \
                 can send requests to this worker unauthenticated, bypassing the frontend; set \
                 LOADGATE_EVENT_SECRET or --event-secret-file",
                args.http_host
            );
        }
    }
    let nats = nats_link(&args, secrets.as_ref()).await?;
    let (backend, model, dp_size, reporting) = match &args.engine {
        None => {
            let Some(model) = args.model.clone() else { anyhow::bail!("--model is required without --engine") };
            let registration = Registration {
                worker: id,
                incarnation,
                model: model.clone(),
                dp_size: args.dp_size,
                http_addr: advertised.clone(),
            };
            let nats = match (&nats, &secrets) {
                (Some(link), Some(secrets)) => {
                    link.check(&registration)?;
                    let heartbeat = Duration::from_millis(args.heartbeat_ms);
                    let seq = ReportSeq::default();
                    Some(Arc::new(NatsPublisher::start(link, registration.clone(), heartbeat, secrets.clone(), seq)))
                }
                _ => None,
            };
            let (sink, publisher) = publish(&args, registration, secrets.clone(), nats.clone())?;
            let sink = match &admission {
                Some(admission) => {
                    let every = Duration::from_millis(args.decode_step_ms.min(args.heartbeat_ms));
                    with_cap_queue(sink, admission.clone(), args.dp_size, every)
                }
                None => sink,
            };
            let simulator = Simulator::start(args.sim_config(), sink);
            (Backend::Simulator(simulator), model, args.dp_size, Reporting::Simulated(publisher, nats))
        }
        Some(spec) => {
            let identity = Identity { worker: id, incarnation, http_addr: advertised.clone() };
            let (started, sidecar) =
                Sidecar::start(&args, spec, identity, admission.clone(), secrets.clone(), nats).await?;
            let backend = Backend::Sidecar { proxy: started.proxy, health: started.health };
            (backend, started.model, started.dp_size, Reporting::Sidecar(sidecar))
        }
    };
    let worker = Arc::new(Worker {
        id,
        incarnation,
        model: model.clone(),
        dp_size,
        backend,
        gate: Gate::new(admission),
        proofs: secrets.map(|secrets| {
            let own = ProofTarget { worker: id, incarnation };
            let window_ms = args.proof_window_secs.saturating_mul(1000);
            Arc::new(ProofCheck::new(secrets, own, window_ms, args.max_proof_nonces))
        }),
        bodies: BodyBudget::new(args.http_body_limit_mb, args.http_body_budget_mb),
    });
    let app = app(worker);
    println!("listening http={addr}");
    std::io::stdout().flush()?;
    match &args.engine {
        None => tracing::info!(worker_id = id, %model, %addr, %advertised, "worker started"),
        Some(spec) => {
            tracing::info!(worker_id = id, %model, dp_size, engine = %spec, %addr, %advertised, "sidecar started")
        }
    }
    let drain = args.http.graceful_shutdown_timeout();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut server = tokio::spawn(http_server::serve_until(
        listener,
        app,
        ServeConfig::from_args(&args.http, WRITE_TIMEOUT, None),
        async {
            let _ = stopped.await;
        },
        drain,
    ));
    tokio::select! {
        // `serve_until` only ends after `stop`: this is a panic in the server.
        _ = &mut server => anyhow::bail!("the HTTP server stopped unexpectedly"),
        () = shutdown_signal() => {}
    }
    tracing::info!(
        frontends = args.frontends.len(),
        "shutdown signal received: leaving routing (Deregister to every frontend)"
    );
    let started = Instant::now();
    let (publisher, nats) = match reporting {
        Reporting::Simulated(publisher, nats) => (publisher, nats),
        Reporting::Sidecar(sidecar) => match sidecar.stop().await {
            Some(publishers) => (publishers.tcp.map(Arc::new), publishers.nats.map(Arc::new)),
            None => (None, None),
        },
    };
    let deregistered = match nats {
        Some(nats) => nats.shutdown().await,
        None => true,
    };
    let deregistered = deregister(publisher).await && deregistered;
    tracing::info!(
        deregistered,
        took = ?started.elapsed(),
        timeout = ?drain,
        "draining: no new connections, in-flight requests may finish"
    );
    let _ = stop.send(());
    match tokio::time::timeout(drain + Duration::from_secs(1), server).await {
        Ok(Ok(drained)) if drained.settled => {
            tracing::info!(
                connections = drained.open_at_stop,
                busy = drained.busy_at_stop,
                "drained: every in-flight request finished"
            );
        }
        Ok(Ok(drained)) => tracing::warn!(cut = drained.cut, "drain timeout: requests still in flight were cut"),
        Ok(Err(_)) | Err(_) => tracing::warn!("the HTTP server did not wind down in time"),
    }
    tracing::info!("worker stopped");
    Ok(())
}

/// Where the worker's load reports come from, kept until the shutdown's
/// Deregister.
enum Reporting {
    /// The simulator's sink feeds these publishers (TCP, NATS; none:
    /// standalone).
    Simulated(Option<Arc<EventPublisher>>, Option<Arc<NatsPublisher>>),
    /// The sidecar's scraper feeds its own publisher.
    Sidecar(Sidecar),
}

/// How long a shutting-down worker waits for its Deregister frames to go
/// out (the publisher writes each with a 1 s write timeout).
pub const DEREGISTER_WAIT: Duration = Duration::from_secs(3);

/// Stops the publisher, which sends a Deregister to every connected
/// frontend and closes its connections; waits for that at most
/// [`DEREGISTER_WAIT`]. True when it finished in time (or there was no
/// publisher).
async fn deregister(publisher: Option<Arc<EventPublisher>>) -> bool {
    let Some(publisher) = publisher else { return true };
    let deadline = Instant::now() + DEREGISTER_WAIT;
    let done = tokio::task::spawn_blocking(move || {
        // The engine's sink holds only a `Weak`; an upgrade lasts one
        // report, so the last strong reference is ours within moments.
        let mut publisher = publisher;
        loop {
            match Arc::try_unwrap(publisher) {
                // Its drop stops the thread, which sends the Deregisters.
                Ok(owned) => {
                    drop(owned);
                    return true;
                }
                Err(shared) if Instant::now() < deadline => {
                    publisher = shared;
                    std::thread::sleep(Duration::from_millis(1));
                }
                // The reporter that holds it drops it (and so deregisters) last.
                Err(_) => return false,
            }
        }
    });
    matches!(tokio::time::timeout(DEREGISTER_WAIT, done).await, Ok(Ok(true)))
}

/// The address announced to frontends: `--advertise-addr` (HOST:PORT), else
/// the bound address, which must then be a specific one (a frontend cannot
/// reach `0.0.0.0`).
fn advertise_addr(flag: Option<&str>, bound: SocketAddr) -> anyhow::Result<String> {
    match flag {
        Some(value) => {
            // As frontends check it: a path or query after the port is refused.
            let valid = value
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p != 0))
                && crate::directory::check_address(value).is_ok();
            anyhow::ensure!(valid, "invalid --advertise-addr {value:?}: expected HOST:PORT");
            Ok(value.to_owned())
        }
        None => {
            anyhow::ensure!(
                !bound.ip().is_unspecified(),
                "--advertise-addr HOST:PORT is required when --http-host is an unspecified address ({})",
                bound.ip()
            );
            Ok(bound.to_string())
        }
    }
}

/// Starts pushing registration and load to the frontends (none: a
/// standalone worker); returns the engine's load sink and the publisher to
/// keep alive.
fn publish(
    args: &Args,
    registration: Registration,
    secrets: Option<Arc<crate::secret::Secrets>>,
    nats: Option<Arc<NatsPublisher>>,
) -> anyhow::Result<(LoadSink, Option<Arc<EventPublisher>>)> {
    if args.frontends.is_empty() {
        let sink: LoadSink = match nats {
            Some(nats) => Arc::new(move |rank, load| nats.report(rank, load)),
            None => Arc::new(|_, _| {}),
        };
        return Ok((sink, None));
    }
    let heartbeat = Duration::from_millis(args.heartbeat_ms);
    let publisher = Arc::new(
        EventPublisher::start(args.frontends.clone(), registration, heartbeat, secrets)
            .context("cannot start the event publisher")?,
    );
    // Weak: at shutdown the worker drops the last strong reference, which
    // sends the Deregisters (see `deregister`).
    let reporter: Weak<EventPublisher> = Arc::downgrade(&publisher);
    let sink: LoadSink = Arc::new(move |rank, load| {
        if let Some(publisher) = reporter.upgrade() {
            publisher.report(rank, load);
        }
        if let Some(nats) = &nats {
            nats.report(rank, load);
        }
    });
    Ok((sink, Some(publisher)))
}

/// The simulator's reports with the requests queued in the hard cap added
/// to each rank's waiting ones, as a sidecar's (`with_queue`: they wait for
/// whichever rank frees first). Each rank's latest load is kept and sent
/// again with the queue as it is now every `every` (an engine step or a
/// heartbeat, the shorter; the publishers send only what changed), so a
/// queue that changes while the ranks do not is reported within `every`.
fn with_cap_queue(sink: LoadSink, admission: Arc<Admission<()>>, dp_size: u32, every: Duration) -> LoadSink {
    let latest = Arc::new(Mutex::new(vec![None::<RankLoad>; dp_size as usize]));
    // Under the lock: the last load sent for a rank carries the queue read last.
    let send = Arc::new(move |latest: &mut [Option<RankLoad>], rank: u32, load: Option<RankLoad>| {
        if let Some(slot) = latest.get_mut(rank as usize) {
            *slot = load.or(*slot);
            let queued = u32::try_from(admission.queued()).unwrap_or(u32::MAX);
            if let Some(load) = *slot {
                sink(rank, sidecar::with_queue(load, queued));
            }
        }
    });
    let (kept, resend) = (Arc::downgrade(&latest), send.clone());
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tick.tick().await;
            // Ends with the simulator, which holds the sink.
            let Some(latest) = kept.upgrade() else { return };
            let mut latest = latest.lock().unwrap_or_else(|e| e.into_inner());
            (0..dp_size).for_each(|rank| resend(&mut latest, rank, None));
        }
    });
    Arc::new(move |rank, load| send(&mut latest.lock().unwrap_or_else(|e| e.into_inner()), rank, Some(load)))
}

/// With `--event-plane nats`: the worker's connection to NATS (the event
/// secret required).
async fn nats_link(args: &Args, secrets: Option<&Arc<crate::secret::Secrets>>) -> anyhow::Result<Option<NatsLink>> {
    if !args.nats.is_nats() {
        return Ok(None);
    }
    anyhow::ensure!(
        secrets.is_some(),
        "--event-plane nats needs the event secret (LOADGATE_EVENT_SECRET or --event-secret-file)"
    );
    let client = args.nats.connect("loadgate worker", |_| {}).await?;
    Ok(Some(NatsLink { client, subjects: crate::nats::Subjects::new(&args.nats.nats_namespace) }))
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
