//! `loadgate frontend`: the HTTP frontend. Routes OpenAI requests to
//! workers, excludes busy ones, sheds load when all are busy, migrates on a
//! worker's hard-cap refusal, and serves `/busy_threshold` on a separate
//! admin listener.
//!
//! Three listeners: inference HTTP (`--http-host:--http-port`, optionally
//! TLS), the event plane (`--event-host:--event-port`) and admin
//! (`--admin-host:--admin-port`, optional bearer token, or none with
//! `--disable-admin-api`). The inference port never changes state, but
//! for one documented exception: with `--admin-on-http-port` (and an admin
//! token, or the frontend refuses to start) it serves the admin routes too,
//! Dynamo's layout.
//!
//! On SIGTERM (or ctrl-c) the frontend drains ([`RunningFrontend::shutdown`]):
//! `/health` answers 503, the inference listener closes, in-flight
//! responses (SSE streams included) finish for at most
//! `--graceful-shutdown-timeout-secs` (`DYN_HTTP_GRACEFUL_SHUTDOWN_TIMEOUT_SECS`,
//! default 5 s), then it exits. The inference listener's timeouts and
//! connection limit come from `args.http` (`http_server::HttpArgs`); the
//! admin listener uses the defaults with `http_server::ADMIN_MAX_CONNECTIONS`.
//!
//! Workers join over the event plane ([`EventPlane`]) or with `--worker URL`
//! (registered from `URL/info`); real inference engines join with
//! `--engine KIND=URL[,model=NAME]`, scraped for their load (`engines.rs`). This file wires the routes and serves them;
//! the shared state is [`Frontend`] (`state.rs`), and each route group has
//! its own file: `proxy.rs` (the OpenAI routes), `threshold_api.rs`
//! (`/busy_threshold`), `admin.rs` (`/v1/models`, `/health`, `/metrics`),
//! `admin_auth.rs` (the admin bearer token).

mod admin;
mod admin_auth;
mod admin_host;
mod args;
mod caller;
mod engine_priority;
mod engines;
mod health_check;
mod inflight;
mod line;
mod observe;
mod priority;
mod proxy;
mod register;
mod reply;
pub(crate) mod retry_hint;
mod state;
pub(crate) mod tenants;
mod threshold_api;
mod threshold_flag;

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::routing::{get, post};
use loadgate::monitor::SharedLoad;
use loadgate::{MonitorConfig, WorkerMonitor};

use self::admin_auth::AdminToken;
pub(crate) use self::args::queue_timeouts;
pub use self::args::Args;
pub use self::state::Frontend;
use crate::directory::WorkerDirectory;
use crate::events::{EventPlane, PlaneConfig, PlaneLimits};
use crate::http_server::{self, Drained, ServeConfig, Tls};
use crate::nats::sharing::publish::{Holding, Holds, Identity};
use crate::nats::sharing::HintScope;
use crate::nats::{NatsPlane, Sharing};

/// How long a worker whose event connection closed stays registered, waiting
/// for it to reconnect.
pub const DEREGISTER_GRACE: Duration = Duration::from_millis(500);

/// Where the admin API is, as the inference listener sees it.
#[derive(Debug, Clone)]
pub enum AdminPlace {
    /// On its own listener (at this address), or off (`None`): the
    /// inference port answers `/busy_threshold` with a 404 that says where.
    Elsewhere(Option<SocketAddr>),
    /// On the inference port too (`--admin-on-http-port`), behind this
    /// token.
    Here(AdminToken),
}

/// The inference listener's routes. Nothing here changes state, unless
/// `admin` is [`AdminPlace::Here`] (the admin routes, behind their token);
/// any other path is 404, `/busy_threshold` with where the admin API is.
pub fn app(frontend: Arc<Frontend>, admin: AdminPlace) -> axum::Router {
    let admin_routes = match admin {
        AdminPlace::Here(token) => admin_routes(frontend.clone(), Some(token)),
        AdminPlace::Elsewhere(addr) => {
            axum::Router::new().route("/busy_threshold", axum::routing::any(move || reply::admin_elsewhere(addr)))
        }
    };
    let routes = axum::Router::new()
        .route("/v1/completions", post(proxy::completions))
        .route("/v1/chat/completions", post(proxy::chat_completions))
        .route("/v1/models", get(admin::models))
        .route("/v1/models/{*id}", get(admin::model))
        .route("/live", get(admin::live))
        .route("/health", get(admin::health))
        .route("/metrics", get(admin::metrics))
        .fallback(reply::no_route)
        .method_not_allowed_fallback(reply::method_not_allowed)
        .with_state(frontend.clone())
        .merge(admin_routes);
    observe::layer(routes, frontend)
}

/// The admin listener's app: [`admin_routes`], and any other path or
/// method answered in the admin API's error shape.
pub fn admin_app(frontend: Arc<Frontend>, token: Option<AdminToken>) -> axum::Router {
    admin_routes(frontend, token)
        .fallback(reply::admin_no_route)
        .method_not_allowed_fallback(reply::admin_method_not_allowed)
}

/// The admin API's routes: `/busy_threshold`, behind the bearer token when
/// there is one (no fallback: they are merged into the inference app with
/// `--admin-on-http-port`).
fn admin_routes(frontend: Arc<Frontend>, token: Option<AdminToken>) -> axum::Router {
    let router = axum::Router::new()
        .route("/busy_threshold", get(threshold_api::read_all).post(threshold_api::update))
        .with_state(frontend);
    match token {
        Some(token) => router.layer(axum::middleware::from_fn_with_state(Arc::new(token), admin_auth::require_token)),
        None => router.layer(axum::middleware::from_fn(admin_host::require_address_host)),
    }
}

/// A frontend serving on its ports (see [`start`]); stops at once when
/// dropped, gracefully with [`RunningFrontend::shutdown`].
#[derive(Debug)]
pub struct RunningFrontend {
    /// The inference HTTP address.
    pub http: SocketAddr,
    /// The event-plane address.
    pub events: SocketAddr,
    /// The admin address (`None` with `--disable-admin-api`).
    pub admin: Option<SocketAddr>,
    /// The inference listener's server; it drains when `stop` fires.
    server: tokio::task::JoinHandle<Drained>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    /// How long the drain may take (`--graceful-shutdown-timeout-secs`).
    drain: Duration,
    frontend: Arc<Frontend>,
    admin_server: Option<tokio::task::JoinHandle<()>>,
    expiry: Option<tokio::task::JoinHandle<()>>,
    pruning: tokio::task::JoinHandle<()>,
    /// The NATS event plane (`--event-plane nats`).
    _nats: Option<NatsPlane>,
    /// Reloads `--tenants-file` on SIGHUP.
    tenants_reload: Option<tokio::task::JoinHandle<()>>,
    /// One per `--engine`.
    scrapers: Vec<tokio::task::JoinHandle<()>>,
    _plane: EventPlane,
}

impl RunningFrontend {
    /// Graceful shutdown: `/health` turns 503 ([`Frontend::start_draining`]),
    /// the inference listener closes (new connections are refused), and
    /// in-flight responses, SSE streams included, may finish for at most
    /// the drain timeout; then everything stops. Logs each phase.
    pub async fn shutdown(mut self) -> Drained {
        self.frontend.start_draining();
        tracing::info!(
            timeout = ?self.drain,
            "draining: /health answers 503, no new connections, in-flight responses may finish"
        );
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // The server's drain is bounded by `drain`; the margin covers its wind-down.
        let bound = self.drain + Duration::from_secs(1);
        let drained = match tokio::time::timeout(bound, &mut self.server).await {
            Ok(Ok(drained)) => drained,
            Ok(Err(_)) | Err(_) => Drained { open_at_stop: 0, busy_at_stop: 0, settled: false, cut: 0 },
        };
        if drained.settled {
            tracing::info!(
                connections = drained.open_at_stop,
                busy = drained.busy_at_stop,
                "drained: every in-flight response finished"
            );
        } else {
            tracing::warn!(
                cut = drained.cut,
                timeout = ?self.drain,
                "drain timeout: responses still in flight were cut"
            );
        }
        drained
    }
}

impl Drop for RunningFrontend {
    fn drop(&mut self) {
        self.server.abort();
        if let Some(admin) = &self.admin_server {
            admin.abort();
        }
        if let Some(expiry) = &self.expiry {
            expiry.abort();
        }
        self.pruning.abort();
        if let Some(reload) = &self.tenants_reload {
            reload.abort();
        }
        for scraper in &self.scrapers {
            scraper.abort();
        }
    }
}

/// Binds the event listener, registers the `--worker` workers and the
/// `--engine` engines, starts the event plane, binds the other two
/// listeners, serves HTTP on the current tokio runtime and scrapes the
/// engines.
///
/// # Errors
///
/// Invalid thresholds, an invalid TLS certificate or key, an invalid admin
/// token, a port that cannot be bound, a `--worker` whose `/info` never
/// answered or names what the event-plane limits refuse, or an `--engine`
/// that never answered (`--engine-start-timeout-secs`) or that the
/// limits refuse.
pub async fn start(args: Args) -> anyhow::Result<RunningFrontend> {
    let config = MonitorConfig {
        staleness: args.load_staleness_ms.map(Duration::from_millis),
        default_thresholds: args.default_thresholds(),
        line: args.line_limits(),
        // Other frontends' load: kept when the frontends share it.
        shared: if args.shares_load() {
            SharedLoad {
                frontends: args.sharing.max_frontends,
                staleness: args.sharing.staleness(),
                lease: args.sharing.share_lease,
            }
        } else {
            SharedLoad::default()
        },
    };
    if config.default_thresholds.is_empty() {
        let why = if args.admission_control == Some(args::AdmissionControl::None) {
            "--admission-control none clears the thresholds given"
        } else {
            "no busy threshold is set (--active-decode-blocks-threshold, --active-prefill-tokens-threshold, \
             --active-prefill-tokens-threshold-frac, --active-waiting-requests-threshold)"
        };
        tracing::warn!(
            "this frontend will never shed load: {why}, so no worker is ever busy and nothing waits or gets a 529 \
             until POST /busy_threshold sets one for a model (only the workers' own hard caps refuse)"
        );
    }
    let monitor = Arc::new(WorkerMonitor::new(config).map_err(|e| anyhow::anyhow!("invalid threshold: {e}"))?);
    let directory = Arc::new(WorkerDirectory::new(monitor.clone()));
    // Quarantined workers come back into routing as their time ends.
    tokio::spawn(directory.expiry());
    // One secret for the event plane and the requests to workers.
    let secrets = crate::secret::Secrets::load(args.event_secret_file.as_deref())?.map(Arc::new);
    let frontend = Arc::new(Frontend::new(&args, monitor.clone(), directory.clone(), secrets.clone())?);
    for model in &args.models {
        monitor.add_model(model);
    }
    let tls = match (&args.tls_cert_path, &args.tls_key_path) {
        (Some(cert), Some(key)) => Some(Tls::load(cert, key)?),
        (None, None) => None,
        _ => anyhow::bail!("--tls-cert-path and --tls-key-path go together: give both or neither"),
    };
    let admin_token = if args.disable_admin_api { None } else { AdminToken::load(args.admin_token_file.as_deref())? };
    // Checked here, not by clap: a variable set to false counts as given there.
    anyhow::ensure!(
        !(args.admin_on_http_port && args.disable_admin_api),
        "--admin-on-http-port and --disable-admin-api contradict each other: give one"
    );
    anyhow::ensure!(
        args.priority_from_nvext.is_none() || args.trust_priority_header,
        "--priority-from-nvext needs --trust-priority-header (LOADGATE_FRONTEND_TRUST_PRIORITY_HEADER is false)"
    );
    if args.admin_on_http_port && admin_token.is_none() {
        anyhow::bail!(
            "--admin-on-http-port needs an admin token (--admin-token-file PATH or LOADGATE_ADMIN_TOKEN): \
             the inference port would otherwise let anyone who reaches it change the thresholds"
        );
    }

    anyhow::ensure!(
        !args.shares_load() || args.max_models <= loadgate::wire::MAX_BEAT_LINES,
        "--max-models {} with frontends sharing their load: a beat carries at most {} models' waiting \
         lines, and a model left out would make the frontends split its reports differently",
        args.max_models,
        loadgate::wire::MAX_BEAT_LINES
    );
    let event_host = crate::events::event_bind_host(&args.event_host, secrets.is_some());
    let event_listener = std::net::TcpListener::bind((event_host, args.event_port))
        .with_context(|| format!("cannot bind the event listener on {event_host}:{}", args.event_port))?;
    let limits = PlaneLimits {
        max_dp_size: args.max_dp_size,
        max_event_connections: args.max_event_connections,
        max_workers: args.max_workers,
        max_models: args.max_models,
        max_name_len: args.max_name_len,
        event_read_budget: args.event_read_budget,
        max_pending_handshakes: usize::try_from(args.max_pending_handshakes).unwrap_or(usize::MAX),
        event_idle_timeout: Duration::from_millis(args.event_idle_timeout_ms),
    };
    // The `--worker` workers first: no event peer can take their ids while
    // they start (workers that connect meanwhile wait in the listen backlog,
    // then retry).
    for url in &args.workers {
        register::register_http_worker(&frontend, url, &limits).await?;
    }
    let scrape = args.scrape.config();
    let start_timeout = Duration::from_secs(args.engine_start_timeout_secs);
    let engines = engines::register_engines(&frontend, &args.engines, scrape, start_timeout, &limits).await?;
    // A worker leaves routing when its connection is silent for
    // --event-silence-ms, or as soon as its load would go stale.
    let silence = [Some(args.event_silence_ms), args.load_staleness_ms, Some(args.event_idle_timeout_ms)]
        .into_iter()
        .flatten()
        .min()
        .map_or(limits.event_idle_timeout, Duration::from_millis);
    let stats = frontend.event_stats.clone();
    let plane_config = PlaneConfig { grace: DEREGISTER_GRACE, secrets: secrets.clone(), limits, silence, stats };
    let plane = EventPlane::start(event_listener, monitor.clone(), directory.clone(), plane_config.clone())?;
    let nats = match (args.nats.is_nats(), &secrets) {
        (false, _) => None,
        (true, None) => anyhow::bail!(
            "--event-plane nats needs the event secret (LOADGATE_EVENT_SECRET or --event-secret-file): \
             every frame on NATS is sealed under it"
        ),
        (true, Some(secrets)) => Some({
            let sharing = args.shares_load().then(|| {
                let (changes, feed) = crate::nats::sharing::changes::changes();
                frontend.inflight.share_changes(changes);
                let (inflight, mon) = (frontend.inflight.clone(), monitor.clone());
                let holds: Holds = Arc::new(move || Holding::of(&mon, inflight.totals().requests));
                let pool_scope = args.sharing.retry_hint_scope == HintScope::Pool;
                Sharing {
                    identity: Identity::new(),
                    holds,
                    pool_hint: pool_scope.then(|| frontend.retry_hint.clone()),
                    slots: args.sharing.max_frontends,
                    heartbeat: args.sharing.heartbeat(),
                    staleness: args.sharing.staleness(),
                    feed,
                }
            });
            NatsPlane::start(&args.nats, monitor.clone(), directory.clone(), secrets.clone(), &plane_config, sharing)
                .await?
        }),
    };
    let listener = http_server::bind(&args.http_host, args.http_port)
        .await
        .with_context(|| format!("cannot bind the HTTP listener on {}:{}", args.http_host, args.http_port))?;
    let http = listener.local_addr()?;
    let (admin, admin_server) = if args.disable_admin_api {
        (None, None)
    } else if args.admin_on_http_port {
        (Some(http), None)
    } else {
        let listener = tokio::net::TcpListener::bind((args.admin_host.as_str(), args.admin_port))
            .await
            .with_context(|| format!("cannot bind the admin listener on {}:{}", args.admin_host, args.admin_port))?;
        let addr = listener.local_addr()?;
        if admin_token.is_none() && !addr.ip().is_loopback() {
            tracing::warn!(%addr, "the admin API is reachable beyond loopback without a token (set LOADGATE_ADMIN_TOKEN)");
        }
        let router = admin_app(frontend.clone(), admin_token.clone());
        let config = ServeConfig { max_connections: http_server::ADMIN_MAX_CONNECTIONS, ..ServeConfig::plain() };
        (Some(addr), Some(tokio::spawn(http_server::serve(listener, router, config))))
    };
    let admin_place = match admin_token {
        Some(token) if args.admin_on_http_port => AdminPlace::Here(token),
        _ => AdminPlace::Elsewhere(admin),
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let drain = args.http.graceful_shutdown_timeout();
    let server = tokio::spawn(http_server::serve_until(
        listener,
        app(frontend.clone(), admin_place),
        ServeConfig::from_args(&args.http, http_server::WRITE_TIMEOUT, tls),
        async {
            // A dropped sender (the RunningFrontend dropped) ends the task by abort anyway.
            let _ = stopped.await;
        },
        drain,
    ));
    // Stale reports (--load-staleness-ms) and other frontends' load (three
    // of their beats) stop counting: re-evaluated a few times per window.
    let shared_ms = args.shares_load().then(|| args.sharing.staleness().as_millis() as u64);
    let expiry = args.load_staleness_ms.into_iter().chain(shared_ms).min().map(|ms| {
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
    let pruning = tokio::spawn(prune_forgotten_models(frontend.clone()));
    let tenants_reload = match (frontend.callers.file(), &args.tenants_file) {
        (Some(shared), Some(path)) => {
            Some(tenants::spawn_reload_on_sighup(shared.clone(), path.clone()).context("cannot watch SIGHUP")?)
        }
        _ => None,
    };
    let checks = (args.worker_health_check_ms > 0).then(|| Duration::from_millis(args.worker_health_check_ms));
    health_check::spawn(&frontend, checks);
    let scrapers = engines::spawn_scrapers(&frontend, engines, scrape, args.engine_scrape_on_end);
    Ok(RunningFrontend {
        http,
        events: plane.local_addr(),
        admin,
        server,
        stop: Some(stop),
        drain,
        frontend,
        admin_server,
        expiry,
        pruning,
        tenants_reload,
        scrapers,
        _nats: nats,
        _plane: plane,
    })
}

/// How often the rejection counters of forgotten models are dropped.
const PRUNE_EVERY: Duration = Duration::from_secs(10);

/// Drops the rejection counters of models the monitor has forgotten, so
/// models that come and go (each with workers that rejected requests) do
/// not grow `/metrics` without bound.
async fn prune_forgotten_models(frontend: Arc<Frontend>) {
    let mut ticks = tokio::time::interval(PRUNE_EVERY);
    loop {
        ticks.tick().await;
        let dropped = frontend.metrics.retain(|model| frontend.monitor.has_model(model));
        if dropped > 0 {
            tracing::debug!(dropped, "rejection counters of forgotten models dropped");
        }
    }
}

/// `loadgate hash-key`: reads an API key (its first line) from stdin and
/// prints it as a tenants file stores it, `sha256:<hex>`.
///
/// # Errors
///
/// Stdin cannot be read, or holds no key, or one no request can present
/// ([`tenants::unpresentable`]).
pub fn print_key_hash() -> anyhow::Result<()> {
    let mut key = String::new();
    std::io::stdin().read_line(&mut key)?;
    let key = key.trim_end_matches(['\r', '\n']);
    anyhow::ensure!(!key.is_empty(), "no key on stdin (give the API key as its first line)");
    if let Some(why) = tenants::unpresentable(key) {
        anyhow::bail!("no request can send this key as `Authorization: Bearer <key>`: {why}");
    }
    println!("{}", tenants::hash_key(key));
    Ok(())
}

/// Runs `loadgate frontend` until Ctrl-C / SIGTERM, then shuts down
/// gracefully ([`RunningFrontend::shutdown`]).
///
/// # Errors
///
/// As [`start`].
pub fn run(args: Args) -> anyhow::Result<()> {
    crate::logging::init_logging();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let running = start(args).await?;
        let admin = running.admin.map_or_else(|| "off".to_owned(), |addr| addr.to_string());
        println!("listening http={} events={} admin={admin}", running.http, running.events);
        std::io::stdout().flush()?;
        shutdown_signal().await;
        tracing::info!("shutdown signal received");
        running.shutdown().await;
        tracing::info!("frontend stopped");
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
