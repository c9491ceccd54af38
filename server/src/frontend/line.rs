//! [`QueueTimeouts`] and [`wait_in_line`]: the frontend's use of the core's
//! waiting line (`loadgate::waiting`). A request that finds every worker of
//! its model busy may wait up to its model's timeout for its class for one
//! to free; `--router-queue-timeout-ms` sets them for every model, `POST
//! /busy_threshold` (`router_queue_timeout_ms`) per model. 0 is no line:
//! the instant 529.

use std::collections::HashMap;
use std::future::Future as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use loadgate::metrics::{LabelText, StripedHistogram};
use loadgate::{Class, PerClass, Ticket, WaitError, WorkerId, WorkerMonitor, WorkerRouter};

/// Bounds of the waiting-time histogram, seconds: to an hour, as a
/// timeout may be long (up to a day), so that long waits are not all in
/// `+Inf`.
const WAIT_BUCKETS: [f64; 17] =
    [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0];

/// How long each model's requests may wait, and how long they waited.
#[derive(Debug)]
pub(crate) struct QueueTimeouts {
    /// `--router-queue-timeout-ms` (zero: no line).
    default: PerClass<Duration>,
    /// Set by `POST /busy_threshold`, per model, for the model's life then
    /// ([`WorkerMonitor::model_life`]): forgotten with the model, as its
    /// thresholds are.
    by_model: RwLock<HashMap<String, (u64, PerClass<Duration>)>>,
    monitor: Arc<WorkerMonitor>,
    /// Whether `by_model` holds anything: without, a shed request reads
    /// only `default` (no lock on the reject path).
    any: AtomicBool,
    /// Whether any model may have had a line: the flag's, or one set by
    /// `POST /busy_threshold` since (never unset: a line taken away keeps
    /// its waiters until their deadlines).
    lined: AtomicBool,
    /// Seconds each request that joined a line waited in it.
    waited: StripedHistogram,
}

impl QueueTimeouts {
    pub(crate) fn new(default: PerClass<Duration>, monitor: Arc<WorkerMonitor>) -> Self {
        QueueTimeouts {
            default,
            by_model: RwLock::default(),
            monitor,
            any: AtomicBool::new(false),
            lined: AtomicBool::new(default.0.iter().any(|t| !t.is_zero())),
            waited: StripedHistogram::new(WAIT_BUCKETS),
        }
    }

    /// The longest a request of `model` in `class` may wait; `None`: no
    /// line.
    #[inline]
    pub(crate) fn timeout(&self, model: &str, class: Class) -> Option<Duration> {
        let timeout = self.of(model).get(class);
        (!timeout.is_zero()).then_some(timeout)
    }

    /// Whether some model may have requests waiting: a line was configured
    /// at some time (by the flag or the admin API). Without, nothing waits
    /// anywhere (no lock on the reject path); with, a line taken away keeps
    /// its waiters until their deadlines.
    #[inline]
    pub(crate) fn ever_lined(&self) -> bool {
        // Relaxed: as `any`.
        self.lined.load(Ordering::Relaxed)
    }

    /// `model`'s timeouts.
    #[inline]
    fn of(&self, model: &str) -> PerClass<Duration> {
        // Relaxed: a model's own timeout set a moment ago may be missed by a
        // request routed at that moment; the map itself is read under its lock.
        if self.any.load(Ordering::Relaxed) {
            let by_model = self.by_model.read().unwrap_or_else(|e| e.into_inner());
            match by_model.get(model) {
                Some(&(life, timeouts)) if self.monitor.model_life(model) == Some(life) => timeouts,
                _ => self.default,
            }
        } else {
            self.default
        }
    }

    /// The model's own timeouts for its current life, or (`None`) the
    /// flag's again. Timeouts of models forgotten since they were set go.
    pub(crate) fn set(&self, model: &str, timeout: Option<PerClass<Duration>>) {
        let mut by_model = self.by_model.write().unwrap_or_else(|e| e.into_inner());
        by_model.retain(|model, (life, _)| self.monitor.model_life(model) == Some(*life));
        match (timeout, self.monitor.model_life(model)) {
            (Some(timeout), Some(life)) => {
                if timeout.0.iter().any(|t| !t.is_zero()) {
                    // Relaxed: as `any`.
                    self.lined.store(true, Ordering::Relaxed);
                }
                by_model.insert(model.to_owned(), (life, timeout))
            }
            _ => by_model.remove(model),
        };
        // Relaxed: written under the map's lock; see `timeout`.
        self.any.store(!by_model.is_empty(), Ordering::Relaxed);
    }

    /// A request's time in its lines, for the waiting-time histogram.
    pub(crate) fn time(&self) -> LineTime<'_> {
        LineTime { histogram: &self.waited, waited: None }
    }

    /// The timeouts `model` has now, in ms (0: no line), for the admin API.
    pub(crate) fn millis(&self, model: &str) -> PerClass<u64> {
        self.of(model).map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX))
    }

    /// Registers the waiting-time histogram and each model's line: requests
    /// and tokens waiting, dispatches from the line, whether it is overrun.
    pub(crate) fn register(&self, registry: &mut Registry, monitor: &WorkerMonitor) {
        registry.register(
            "loadgate_frontend_queue_wait_seconds",
            "Time requests spent in a waiting line (served, refused, or left by their client)",
            self.waited.clone(),
        );
        let waiting = Family::<[(&'static str, LabelText<String>); 1], Gauge>::default();
        let tokens = Family::<[(&'static str, LabelText<String>); 1], Gauge>::default();
        let dispatched = Family::<[(&'static str, LabelText<String>); 1], Counter<u64>>::default();
        let overrun = Family::<[(&'static str, LabelText<String>); 1], Gauge>::default();
        for model in monitor.models() {
            let Some(stats) = monitor.line_stats(&model) else { continue };
            let labels = [("model", LabelText(model))];
            waiting.get_or_create(&labels).set(i64::try_from(stats.waiting).unwrap_or(i64::MAX));
            tokens.get_or_create(&labels).set(i64::try_from(stats.tokens).unwrap_or(i64::MAX));
            dispatched.get_or_create(&labels).inc_by(stats.dispatched);
            overrun.get_or_create(&labels).set(i64::from(stats.overrun));
        }
        registry.register("loadgate_frontend_queue_waiting", "Requests waiting in a model's line now", waiting);
        registry.register("loadgate_frontend_queue_tokens", "Prompt tokens waiting in a model's line now", tokens);
        registry.register(
            "loadgate_frontend_queue_dispatched",
            "Requests dispatched from a model's waiting line",
            dispatched,
        );
        registry.register(
            "loadgate_frontend_queue_overrun",
            "1 while a model's line is overrun (arrivals outpace dispatches: the latest deadline first)",
            overrun,
        );
    }
}

/// Routes `model` through its line: at once when nobody waits and a worker
/// is eligible, else after waiting up to `timeout` for one to free.
/// Returns the worker (or why none) and how long the request waited.
pub(crate) async fn wait_in_line<T>(
    router: &WorkerRouter,
    time: &mut LineTime<'_>,
    model: &str,
    exclude: &[WorkerId],
    ticket: Ticket,
    turn: Option<&Mutex<()>>,
    take: impl FnOnce(WorkerId) -> T,
) -> (Result<(WorkerId, T), WaitError>, Duration) {
    // Added to the request's time when the wait ends, or when its client
    // abandons it (this future dropped).
    let clock = WaitClock { time, start: Some(Instant::now()) };
    let timer = tokio::time::sleep_until(tokio::time::Instant::from_std(ticket.deadline));
    let mut wait = std::pin::pin!(router.wait(model, exclude, ticket, timer));
    let mut take = Some(take);
    // Each poll in `turn`, if any (the fleet lease's routing turn): the
    // worker the wait resolves to is taken within the poll that routed it.
    // The guard ends with the poll, never held across an await.
    let result = std::future::poll_fn(|cx| {
        let _turn = turn.map(|turn| turn.lock().unwrap_or_else(|e| e.into_inner()));
        wait.as_mut()
            .poll(cx)
            .map(|routed| routed.map(|worker| (worker, (take.take().expect("resolves once"))(worker))))
    })
    .await;
    (result, clock.stop())
}

/// One request's time in its model's line, over all its waits (one whose
/// worker failed waits again): one sample of the waiting-time histogram,
/// taken when dropped (the request answered, or its client gone), if it
/// ever waited. Requests that never joined (routed at once) wait well under
/// a millisecond: counted too, so the histogram shows the share served at
/// once.
pub(crate) struct LineTime<'a> {
    histogram: &'a StripedHistogram,
    /// `None`: no wait yet.
    waited: Option<Duration>,
}

impl Drop for LineTime<'_> {
    fn drop(&mut self) {
        if let Some(waited) = self.waited {
            self.histogram.observe(waited.as_secs_f64());
        }
    }
}

/// One wait, added to its request's [`LineTime`] when it ends
/// ([`WaitClock::stop`]), or when dropped mid-wait (the client went away).
struct WaitClock<'a, 'h> {
    time: &'a mut LineTime<'h>,
    /// `None` once added.
    start: Option<Instant>,
}

impl WaitClock<'_, '_> {
    /// Adds the wait to the request's time and returns how long it took.
    fn stop(mut self) -> Duration {
        let waited = self.start.take().map_or(Duration::ZERO, |start| start.elapsed());
        self.add(waited);
        waited
    }

    fn add(&mut self, waited: Duration) {
        self.time.waited = Some(self.time.waited.unwrap_or_default() + waited);
    }
}

impl Drop for WaitClock<'_, '_> {
    fn drop(&mut self) {
        if let Some(start) = self.start.take() {
            self.add(start.elapsed());
        }
    }
}
