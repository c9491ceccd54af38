//! Rejection counters and Prometheus text rendering with the reference's
//! metric names.
//!
//! Counting is one relaxed `fetch_add` per counter on the request path; the
//! per-model row is found with one arc-swap load and a map lookup. Rendering
//! (a scrape) builds a prometheus-client registry from the current values.

use std::collections::HashMap;
use std::fmt;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::monitor::WorkerMonitor;
use crate::sync::{lock, Arc, AtomicU64, Mutex, Ordering, Swap};
use crate::thresholds::BusySignals;

/// The API endpoint a rejected request came to (the `endpoint` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// `POST /v1/completions`.
    Completions,
    /// `POST /v1/chat/completions`.
    ChatCompletions,
}

impl Endpoint {
    const ALL: [Endpoint; 2] = [Endpoint::Completions, Endpoint::ChatCompletions];

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            Endpoint::Completions => "completions",
            Endpoint::ChatCompletions => "chat_completions",
        }
    }
}

/// Why a request was rejected (the `reason` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Decode-block utilisation over its threshold.
    DecodeBlocks,
    /// Active prefill tokens over the absolute threshold.
    PrefillTokens,
    /// Active prefill tokens over the fraction of `max_num_batched_tokens`.
    PrefillTokensFrac,
    /// Requests waiting in the engine's queue over their threshold.
    WaitingRequests,
    /// Workers refused at their hard cap (after migration, if any).
    WorkerCapacity,
    /// Every free worker had already refused this request.
    Excluded,
}

impl Reason {
    const ALL: [Reason; 6] = [
        Reason::DecodeBlocks,
        Reason::PrefillTokens,
        Reason::PrefillTokensFrac,
        Reason::WaitingRequests,
        Reason::WorkerCapacity,
        Reason::Excluded,
    ];

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            Reason::DecodeBlocks => "decode_blocks",
            Reason::PrefillTokens => "prefill_tokens",
            Reason::PrefillTokensFrac => "prefill_tokens_frac",
            Reason::WaitingRequests => "waiting_requests",
            Reason::WorkerCapacity => "worker_capacity",
            Reason::Excluded => "excluded",
        }
    }

    /// The reasons behind a set of busy signals (empty when none fired).
    pub fn from_signals(s: BusySignals) -> impl Iterator<Item = Reason> {
        [
            (s.decode, Reason::DecodeBlocks),
            (s.prefill, Reason::PrefillTokens),
            (s.prefill_frac, Reason::PrefillTokensFrac),
            (s.waiting, Reason::WaitingRequests),
        ]
        .into_iter()
        .filter_map(|(fired, r)| fired.then_some(r))
    }

    fn index(self) -> usize {
        self as usize
    }
}

#[derive(Default)]
struct ModelRow {
    by_endpoint: [AtomicU64; Endpoint::ALL.len()],
    by_reason: [AtomicU64; Reason::ALL.len()],
}

/// Rejections per model, per endpoint and per reason.
pub struct RejectionMetrics {
    rows: Swap<HashMap<Arc<str>, Arc<ModelRow>>>,
    /// Serialises adding a model's row (cold path: first rejection of a model).
    write: Mutex<()>,
}

impl fmt::Debug for RejectionMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RejectionMetrics").field("models", &self.rows.load().len()).finish()
    }
}

impl Default for RejectionMetrics {
    fn default() -> Self {
        RejectionMetrics { rows: Swap::from_pointee(HashMap::new()), write: Mutex::new(()) }
    }
}

impl RejectionMetrics {
    /// Counts one rejected request with its reasons.
    pub fn record(&self, model: &str, endpoint: Endpoint, reasons: impl IntoIterator<Item = Reason>) {
        let rows = self.rows.load();
        match rows.get(model) {
            Some(row) => count(row, endpoint, reasons),
            None => {
                drop(rows);
                count(&self.add_row(model), endpoint, reasons);
            }
        }
    }

    #[cold]
    fn add_row(&self, model: &str) -> Arc<ModelRow> {
        let _write = lock(&self.write);
        let rows = self.rows.load_full();
        if let Some(row) = rows.get(model) {
            return row.clone();
        }
        let row = Arc::new(ModelRow::default());
        let mut next = (*rows).clone();
        next.insert(Arc::from(model), row.clone());
        self.rows.store(Arc::new(next));
        row
    }

    /// Rejections of `model` at `endpoint` so far.
    pub fn total(&self, model: &str, endpoint: Endpoint) -> u64 {
        // Relaxed: a counter read.
        self.rows.load().get(model).map_or(0, |r| r.by_endpoint[endpoint as usize].load(Ordering::Relaxed))
    }

    /// Rejections of `model` for `reason` so far.
    pub fn by_reason(&self, model: &str, reason: Reason) -> u64 {
        // Relaxed: a counter read.
        self.rows.load().get(model).map_or(0, |r| r.by_reason[reason.index()].load(Ordering::Relaxed))
    }

    /// Renders the frontend's metrics: rejections, rejection reasons, and the
    /// latest observed per-rank load of every worker.
    pub fn render_frontend(&self, monitor: &WorkerMonitor) -> String {
        let mut registry = Registry::default();
        let rejections = Family::<Vec<(&'static str, String)>, Counter>::default();
        let reasons = Family::<Vec<(&'static str, String)>, Counter>::default();
        let mut models: Vec<_> = self.rows.load().iter().map(|(m, r)| (m.clone(), r.clone())).collect();
        models.sort_by(|a, b| a.0.cmp(&b.0));
        for (model, row) in &models {
            for endpoint in Endpoint::ALL {
                // Relaxed: a counter read.
                let n = row.by_endpoint[endpoint as usize].load(Ordering::Relaxed);
                rejections
                    .get_or_create(&vec![("model", model.to_string()), ("endpoint", endpoint.label().to_owned())])
                    .inc_by(n);
            }
            for reason in Reason::ALL {
                let n = row.by_reason[reason.index()].load(Ordering::Relaxed);
                if n > 0 {
                    reasons
                        .get_or_create(&vec![("model", model.to_string()), ("reason", reason.label().to_owned())])
                        .inc_by(n);
                }
            }
        }
        registry.register(
            "dynamo_frontend_model_rejection",
            "Requests rejected because every eligible worker was busy or at capacity",
            rejections,
        );
        registry.register("loadgate_frontend_rejection_reason", "Rejected requests by busy signal or cause", reasons);

        let decode = Family::<Vec<(&'static str, String)>, Gauge>::default();
        let prefill = Family::<Vec<(&'static str, String)>, Gauge>::default();
        let total = Family::<Vec<(&'static str, String)>, Gauge>::default();
        let waiting = Family::<Vec<(&'static str, String)>, Gauge>::default();
        for snap in monitor.rank_snapshots() {
            let Some(load) = snap.effective() else { continue };
            let labels = vec![("worker_id", snap.worker.to_string()), ("dp_rank", snap.rank.to_string())];
            decode.get_or_create(&labels).set(i64::from(load.active_decode_blocks));
            prefill.get_or_create(&labels).set(i64::from(load.active_prefill_tokens));
            total.get_or_create(&labels).set(i64::from(load.kv_total_blocks));
            waiting.get_or_create(&labels).set(i64::from(load.waiting_requests));
        }
        registry.register(
            "dynamo_frontend_worker_active_decode_blocks",
            "Latest observed active decode blocks per worker rank",
            decode,
        );
        registry.register(
            "dynamo_frontend_worker_active_prefill_tokens",
            "Latest observed active prefill tokens per worker rank",
            prefill,
        );
        registry.register(
            "loadgate_frontend_worker_kv_total_blocks",
            "Latest observed total KV blocks per worker rank",
            total,
        );
        registry.register(
            "loadgate_frontend_worker_waiting_requests",
            "Latest observed requests waiting in the engine's queue per worker rank",
            waiting,
        );
        let busy = Family::<Vec<(&'static str, String)>, Gauge>::default();
        for w in monitor.workers() {
            busy.get_or_create(&vec![("worker_id", w.id.to_string()), ("model", w.model)]).set(i64::from(w.busy));
        }
        registry.register("loadgate_frontend_worker_busy", "1 when the worker is in its model's busy set", busy);
        to_text(&registry)
    }
}

fn count(row: &ModelRow, endpoint: Endpoint, reasons: impl IntoIterator<Item = Reason>) {
    // Relaxed: independent counters; scrapes need no ordering.
    row.by_endpoint[endpoint as usize].fetch_add(1, Ordering::Relaxed);
    for reason in reasons {
        row.by_reason[reason.index()].fetch_add(1, Ordering::Relaxed);
    }
}

/// A worker's admission figures for [`render_worker`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkerAdmissionStats {
    /// Requests refused at the hard cap so far.
    pub rejected: u64,
    /// Requests holding an engine slot.
    pub running: u64,
    /// Requests in the overflow queue.
    pub queued: u64,
}

/// Renders a worker's admission metrics with the reference's names.
pub fn render_worker(model: &str, stats: WorkerAdmissionStats) -> String {
    let mut registry = Registry::default();
    let labels = vec![("model", model.to_owned())];
    let rejected = Family::<Vec<(&'static str, String)>, Counter>::default();
    rejected.get_or_create(&labels).inc_by(stats.rejected);
    registry.register("dynamo_rejection_request", "Requests refused because the worker was at capacity", rejected);
    let running = Family::<Vec<(&'static str, String)>, Gauge>::default();
    running.get_or_create(&labels).set(i64::try_from(stats.running).unwrap_or(i64::MAX));
    registry.register("dynamo_engine_request", "Requests holding an engine slot", running);
    let queued = Family::<Vec<(&'static str, String)>, Gauge>::default();
    queued.get_or_create(&labels).set(i64::try_from(stats.queued).unwrap_or(i64::MAX));
    registry.register("dynamo_request_queue", "Requests waiting in the overflow queue", queued);
    to_text(&registry)
}

fn to_text(registry: &Registry) -> String {
    let mut out = String::new();
    encode(&mut out, registry).expect("writing to a String cannot fail");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_indexes_follow_the_label_lists() {
        for (i, reason) in Reason::ALL.into_iter().enumerate() {
            assert_eq!(reason.index(), i, "{reason:?}");
        }
        for (i, endpoint) in Endpoint::ALL.into_iter().enumerate() {
            assert_eq!(endpoint as usize, i, "{endpoint:?}");
        }
        let mut labels: Vec<&str> = Reason::ALL.iter().map(|r| r.label()).collect();
        labels.dedup();
        assert_eq!(labels.len(), Reason::ALL.len());
    }

    #[test]
    fn a_first_rejection_adds_the_row_once() {
        let metrics = RejectionMetrics::default();
        metrics.record("m", Endpoint::Completions, []);
        metrics.record("m", Endpoint::Completions, [Reason::Excluded, Reason::WorkerCapacity]);
        assert_eq!(metrics.rows.load().len(), 1);
        assert_eq!(metrics.total("m", Endpoint::Completions), 2);
        assert_eq!(metrics.total("m", Endpoint::ChatCompletions), 0);
        assert_eq!(metrics.by_reason("m", Reason::Excluded), 1);
        assert_eq!(metrics.by_reason("m", Reason::DecodeBlocks), 0);
    }
}
