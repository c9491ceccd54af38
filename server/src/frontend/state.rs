//! [`Frontend`]: the state every route of the frontend shares.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::response::Response;
use loadgate::{
    metrics::{Endpoint, Reason, RejectionMetrics},
    Class, WorkerMonitor, WorkerRouter,
};

use crate::directory::WorkerDirectory;
use crate::events::PlaneStats;
use crate::frontend::args::{Args, RetryAfterMode, RouterMode};
use crate::frontend::caller::Callers;
use crate::frontend::inflight::{InFlight, Tracking};
use crate::frontend::line::QueueTimeouts;
use crate::frontend::priority::Priority;
use crate::frontend::reply;
use crate::frontend::retry_hint::RetryHint;
use crate::frontend::tenants::{SharedTenants, Tenants};
use crate::http_server::BodyBudget;
use crate::secret::{unix_ms, BodyDigest, ProofTarget, Secrets, REQUEST_PROOF_HEADER};
use crate::upstream::{self, FailureCounts, Timeouts};

/// The frontend's shared state, handed to every route.
#[derive(Debug)]
pub struct Frontend {
    pub(crate) monitor: Arc<WorkerMonitor>,
    pub(crate) router: WorkerRouter,
    pub(crate) directory: Arc<WorkerDirectory>,
    pub(crate) metrics: RejectionMetrics,
    pub(crate) inflight: Arc<InFlight>,
    pub(crate) client: reqwest::Client,
    pub(crate) migration_limit: usize,
    /// When this frontend started, in seconds since the Unix epoch: the
    /// `created` of the models it lists (it does not know when a model was
    /// made, only since when it serves it).
    pub(crate) started_unix_s: u64,
    /// `--http-body-limit-mb` and `--http-body-budget-mb`.
    pub(crate) bodies: Arc<BodyBudget>,
    /// The event secret, which also signs every request sent to a worker.
    pub(crate) secrets: Option<Arc<Secrets>>,
    /// Bounds on waiting for workers.
    pub(crate) upstream: Timeouts,
    /// Counts of upstream failures by kind.
    pub(crate) upstream_stats: FailureCounts,
    /// Failed scrapes of `--engine` engines since start.
    pub(crate) engine_scrape_failures: AtomicU64,
    /// What the event plane applied (its thread counts, `/metrics` reads).
    pub(crate) event_stats: Arc<PlaneStats>,
    /// `Retry-After` of refusals (`--retry-after-mode`).
    pub(crate) retry_hint: Arc<RetryHint>,
    /// The hint counts the other frontends' waiters of the refused model
    /// (`--retry-hint-scope pool`, sharing load).
    pool_hint: bool,
    /// Set on SIGTERM: `/health` answers 503 while in-flight responses drain.
    pub(crate) draining: AtomicBool,
    /// Wakes the requests waiting in a line when the drain begins.
    drain_begun: tokio::sync::Notify,
    /// How long a request may wait in its model's line (`--router-queue-timeout-ms`).
    pub(crate) queue: QueueTimeouts,
    /// Which class a request is in.
    pub(crate) priority: Priority,
    /// Which tenant a request is of (`--tenants-file`).
    pub(crate) callers: Callers,
    /// `--router-queue-token-limit` or `--tenants-file` is set: every
    /// request's prompt is counted (the line's token bound, a tenant's
    /// `max_tokens` and its turns, charged in prompt tokens), whatever the
    /// router mode.
    pub(crate) line_counts_tokens: bool,
    /// With the fleet lease (`--share-lease`): one route and the tracking
    /// of its load at a time, so that no two of this frontend's threads
    /// take the same worker's last headroom at once (the lease's bound
    /// counts one request per frontend crossing a threshold).
    pub(crate) routing_turn: Option<std::sync::Mutex<()>>,
    /// One `/busy_threshold` change at a time, its thresholds and line
    /// timeout together, and no read between the two (cold path: a lock
    /// held only by the admin API, never across an await).
    pub(crate) admin_changes: std::sync::Mutex<()>,
}

impl Frontend {
    /// A frontend over `monitor` configured by `args`, signing its requests
    /// to workers with `secrets`.
    ///
    /// # Errors
    ///
    /// The HTTP client could not be built.
    pub fn new(
        args: &Args,
        monitor: Arc<WorkerMonitor>,
        directory: Arc<WorkerDirectory>,
        secrets: Option<Arc<Secrets>>,
    ) -> anyhow::Result<Self> {
        let tracking =
            (args.router_mode == RouterMode::Kv).then_some(Tracking { output_blocks: args.router_track_output_blocks });
        let upstream = args.upstream_timeouts();
        let client = upstream::client(upstream.connect)?;
        let retry_hint = Arc::new(match args.retry_after_mode {
            RetryAfterMode::Computed => RetryHint::computed(),
            RetryAfterMode::Constant => RetryHint::constant(),
        });
        let tenants = match &args.tenants_file {
            Some(path) => Some(Arc::new(SharedTenants::new(Tenants::load(path).map_err(anyhow::Error::msg)?))),
            None => None,
        };
        let queue = QueueTimeouts::new(args.router_queue_timeout_ms.map(Duration::from_millis), monitor.clone());
        Ok(Frontend {
            router: WorkerRouter::new(monitor.clone(), args.policy())
                .with_sheddable_headroom(args.sheddable_headroom)
                .map_err(anyhow::Error::msg)?,
            inflight: Arc::new(InFlight::new(monitor.clone(), tracking, !args.engines.is_empty(), retry_hint.clone())),
            retry_hint,
            pool_hint: args.pool_hint(),
            upstream,
            upstream_stats: FailureCounts::default(),
            engine_scrape_failures: AtomicU64::new(0),
            event_stats: Arc::default(),
            monitor,
            directory,
            metrics: RejectionMetrics::default(),
            client,
            migration_limit: args.migration_limit,
            started_unix_s: crate::secret::unix_ms() / 1000,
            bodies: BodyBudget::with_timeouts(
                args.http_body_limit_mb,
                args.http_body_budget_mb,
                Duration::from_secs(args.http_body_idle_timeout_secs),
                Duration::from_secs(args.http_body_timeout_secs),
            ),
            secrets,
            draining: AtomicBool::new(false),
            drain_begun: tokio::sync::Notify::new(),
            queue,
            // With a tenants file the class header counts: a tenant's
            // maximum class bounds it.
            priority: Priority {
                trusted: args.trust_priority_header || tenants.is_some(),
                nvext: args.priority_from_nvext,
            },
            line_counts_tokens: args.router_queue_token_limit.is_some() || tenants.is_some(),
            callers: Callers::new(tenants, args.trust_priority_header),
            routing_turn: (args.shares_load() && args.sharing.share_lease).then(Default::default),
            admin_changes: std::sync::Mutex::new(()),
        })
    }

    /// `request` with the proof of the secret for `method path` with a body
    /// of digest `body`, to the worker `target` (none without a secret): a
    /// fresh nonce each time, so a worker accepts it once.
    pub(crate) fn signed(
        &self,
        request: reqwest::RequestBuilder,
        method: &str,
        path: &str,
        body: &BodyDigest,
        target: ProofTarget,
    ) -> reqwest::RequestBuilder {
        match &self.secrets {
            Some(secrets) => {
                let proof = secrets.request_proof(method, path, body, target, fastrand::u128(..), unix_ms());
                request.header(REQUEST_PROOF_HEADER, proof)
            }
            None => request,
        }
    }
}

impl Frontend {
    /// The frontend is shutting down (SIGTERM): not ready for new work.
    pub(crate) fn draining(&self) -> bool {
        // Relaxed: a flag read on its own; no data hangs on it.
        self.draining.load(Ordering::Relaxed)
    }

    /// Marks the frontend as shutting down, and wakes every request
    /// waiting in a line ([`Frontend::drain_begun`]).
    pub(crate) fn start_draining(&self) {
        // Relaxed: as `draining`; a waiter that reads it too early is woken
        // by the notification after it.
        self.draining.store(true, Ordering::Relaxed);
        self.drain_begun.notify_waiters();
    }

    /// Resolves once the frontend is shutting down (at once if it is): no
    /// new work starts then, so a request waiting in a line leaves it.
    pub(crate) async fn drain_begun(&self) {
        // Made before the flag is read: `notify_waiters` wakes every
        // `Notified` made before it, polled or not.
        let begun = self.drain_begun.notified();
        if self.draining() {
            return;
        }
        begun.await;
    }

    /// Answers the overload status and counts it in
    /// `dynamo_frontend_model_rejection_total`, with the busy signals that
    /// made the workers busy and the `causes` of this request's own
    /// exclusions (`worker_capacity` when workers refused at their cap,
    /// `excluded` when every free worker had refused it). The reasons
    /// counted, each once (per `class` too), are named in
    /// `x-loadgate-rejected-reason`.
    pub(crate) fn reject_overloaded(
        &self,
        model: &str,
        endpoint: Endpoint,
        class: Class,
        causes: impl IntoIterator<Item = Reason>,
    ) -> Response {
        let busy = Reason::from_signals(self.monitor.model_busy_reasons(model));
        let reasons = reply::RejectedReasons::collect(busy.chain(causes));
        self.metrics.record_class(model, endpoint, class, reasons.iter());
        reply::overloaded(self.retry_after_waiting(self.waiting(model)), &reasons)
    }

    /// Requests waiting in `model`'s line (0 when no model ever had a line:
    /// nothing read), and with the pool-wide hint those the other
    /// frontends' lines hold for it. A model whose line the admin API took
    /// away (timeout 0) still counts those waiting: they keep their
    /// deadlines, and a refused client comes back after them.
    pub(crate) fn waiting(&self, model: &str) -> u64 {
        let others = if self.pool_hint { self.monitor.others_waiting(model) } else { 0 };
        if !self.queue.ever_lined() {
            return others;
        }
        self.monitor.line_stats(model).map_or(0, |stats| stats.waiting as u64).saturating_add(others)
    }

    /// Answers 503 Unavailable with the retry hint.
    pub(crate) fn unavailable(&self) -> Response {
        reply::unavailable(self.retry_after())
    }

    /// How long a refused client should wait before it retries (no waiting
    /// line counted).
    pub(crate) fn retry_after(&self) -> Duration {
        self.retry_after_waiting(0)
    }

    /// How long a refused client should wait before it retries, with
    /// `waiting` requests in the model's waiting line: never less than
    /// their expected wait (see `retry_hint`).
    pub(crate) fn retry_after_waiting(&self, waiting: u64) -> Duration {
        self.retry_hint.refused(self.inflight.totals().requests, waiting)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::http::{header, StatusCode};
    use axum::routing::any;
    use axum::Router;

    use super::*;

    async fn serve(router: Router) -> (String, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        (format!("http://{addr}"), tokio::spawn(async move { axum::serve(listener, router).await.unwrap() }))
    }

    #[tokio::test]
    async fn a_redirecting_worker_is_not_followed() {
        let hits = Arc::new(AtomicUsize::new(0));
        let counted = hits.clone();
        let elsewhere = Router::new().fallback(any(move || {
            // Relaxed: a counter read after the request.
            counted.fetch_add(1, Ordering::Relaxed);
            async { "got it" }
        }));
        let (target, _target) = serve(elsewhere).await;
        for status in [StatusCode::TEMPORARY_REDIRECT, StatusCode::PERMANENT_REDIRECT, StatusCode::FOUND] {
            let location = format!("{target}/v1/completions");
            let worker = Router::new().fallback(any(move || async move { (status, [(header::LOCATION, location)]) }));
            let (worker, _worker) = serve(worker).await;
            let answer = upstream::client(Duration::from_secs(2))
                .unwrap()
                .post(format!("{worker}/v1/completions"))
                .header(REQUEST_PROOF_HEADER, "v1.1.00")
                .body("a prompt")
                .timeout(Duration::from_secs(5))
                .send()
                .await
                .unwrap();
            assert_eq!(answer.status(), status, "the redirect itself is the answer");
        }
        // Relaxed: the requests above have completed.
        assert_eq!(hits.load(Ordering::Relaxed), 0, "the redirect target received the body and proof");
    }
}
