//! The worker side: the admission figures of every gate one process holds,
//! as one collector with a `worker_id` label per gate.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;

use super::error::AddGateError;
use super::exposition::{counter_family, gauge_family, gauge_value, render, LabelText};
use super::format::MetricsFormat;
use super::source::{AdmissionLimits, AdmissionSource, WorkerAdmissionStats};
use crate::sync::{lock, Arc, Mutex, Swap};

/// One gate: its labels and where its figures come from.
struct Gate {
    /// `None` only for [`render_worker`]'s gate, which has no `worker_id` label.
    worker_id: Option<String>,
    model: String,
    source: Box<dyn AdmissionSource>,
}

impl Gate {
    /// `worker_id` (when there is one), then `model`.
    fn labels(&self) -> Vec<(&'static str, LabelText<&str>)> {
        let mut labels = Vec::with_capacity(2);
        if let Some(id) = &self.worker_id {
            labels.push(("worker_id", LabelText(id.as_str())));
        }
        labels.push(("model", LabelText(self.model.as_str())));
        labels
    }
}

/// The admission figures of every gate one process holds, written as one
/// family per metric with one series per gate.
///
/// Each gate is [`add`](Self::add)ed with its `worker_id` (unique here) and
/// model, and an [`AdmissionSource`] read on every scrape: an
/// `Arc<Admission<T>>`, or a closure returning [`WorkerAdmissionStats`].
/// [`register`](Self::register) puts the whole set into the caller's
/// registry once; gates added or removed later show from the next scrape on.
///
/// | family | type | series |
/// |---|---|---|
/// | `dynamo_rejection_request_total` | counter | every gate |
/// | `dynamo_engine_request` | gauge | every gate |
/// | `dynamo_request_queue` | gauge | every gate |
/// | `loadgate_worker_request_limit` | gauge | gates with [`AdmissionLimits`] (family left out when none has) |
/// | `loadgate_worker_queue_limit` | gauge | as above |
///
/// Every series carries `worker_id` and `model`, in that order. Series are
/// sorted by `worker_id`.
///
/// Why one collector for every gate rather than one per gate: a family's
/// `# HELP` and `# TYPE` lines may appear only once in an exposition, and
/// each collector writes its own. One collector per gate, even each in its
/// own `sub_registry_with_label(("worker_id", …))`, repeats every family per
/// gate: Prometheus refuses that scrape.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use loadgate::{Admission, metrics::{AdmissionMetrics, WorkerAdmissionStats}};
/// use prometheus_client::encoding::text::encode;
/// use prometheus_client::registry::Registry;
///
/// let gate = Admission::<u32>::new(4, 8).unwrap();
/// let gates = Arc::new(AdmissionMetrics::new());
/// gates.add("a", "llama", gate.clone()).unwrap();
/// gates.add("b", "llama", || WorkerAdmissionStats { running: 1, ..Default::default() }).unwrap();
///
/// let mut registry = Registry::default();
/// gates.register(&mut registry);
/// let mut text = String::new();
/// encode(&mut text, &registry).unwrap();
/// assert_eq!(text.matches("# TYPE dynamo_engine_request gauge").count(), 1);
/// assert!(text.contains(r#"dynamo_engine_request{worker_id="a",model="llama"} 0"#));
/// assert!(text.contains(r#"dynamo_engine_request{worker_id="b",model="llama"} 1"#));
/// assert!(text.contains(r#"loadgate_worker_request_limit{worker_id="a",model="llama"} 4"#));
/// ```
pub struct AdmissionMetrics {
    /// Sorted by `worker_id`.
    gates: Swap<Vec<Arc<Gate>>>,
    /// Serialises adding and removing gates (cold path).
    write: Mutex<()>,
}

impl fmt::Debug for AdmissionMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let gates = self.gates.load();
        let ids: Vec<&str> = gates.iter().map(|g| g.worker_id.as_deref().unwrap_or("")).collect();
        f.debug_struct("AdmissionMetrics").field("worker_ids", &ids).finish()
    }
}

impl Default for AdmissionMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl AdmissionMetrics {
    /// No gates yet.
    pub fn new() -> Self {
        AdmissionMetrics { gates: Swap::from_pointee(Vec::new()), write: Mutex::new(()) }
    }

    /// Adds a gate: from the next scrape on, each family has a series
    /// labelled `worker_id` (as `Display` writes it, so a numeric
    /// [`WorkerId`](crate::WorkerId) matches the frontend's `worker_id`) and
    /// `model`, with the figures `source` gives then.
    ///
    /// # Errors
    ///
    /// [`AddGateError::DuplicateWorkerId`] when a gate with this `worker_id`
    /// is already there, [`AddGateError::EmptyWorkerId`] for an empty one.
    pub fn add(
        &self,
        worker_id: impl fmt::Display,
        model: &str,
        source: impl AdmissionSource,
    ) -> Result<(), AddGateError> {
        let worker_id = worker_id.to_string();
        if worker_id.is_empty() {
            return Err(AddGateError::EmptyWorkerId);
        }
        self.insert(Gate { worker_id: Some(worker_id), model: model.to_owned(), source: Box::new(source) })
    }

    /// Removes the gate of `worker_id`, so its series leave the next scrape;
    /// `false` when there was none.
    pub fn remove(&self, worker_id: impl fmt::Display) -> bool {
        let worker_id = worker_id.to_string();
        let _write = lock(&self.write);
        let gates = self.gates.load_full();
        let Ok(at) = gates.binary_search_by(|g| g.worker_id.as_deref().cmp(&Some(worker_id.as_str()))) else {
            return false;
        };
        let mut next = (*gates).clone();
        next.remove(at);
        self.gates.store(Arc::new(next));
        true
    }

    fn insert(&self, gate: Gate) -> Result<(), AddGateError> {
        let _write = lock(&self.write);
        let gates = self.gates.load_full();
        match gates.binary_search_by(|g| g.worker_id.cmp(&gate.worker_id)) {
            Ok(_) => Err(AddGateError::DuplicateWorkerId(gate.worker_id.unwrap_or_default())),
            Err(at) => {
                let mut next = (*gates).clone();
                next.insert(at, Arc::new(gate));
                self.gates.store(Arc::new(next));
                Ok(())
            }
        }
    }

    /// Registers every gate's families into `registry`, present and future:
    /// each encoding of `registry` reads the gates then.
    ///
    /// The names are written as they stand: a prefix of `registry` is
    /// prepended with an underscore, so register into an unprefixed registry
    /// to keep the reference's names. Nothing registered here writes
    /// `# EOF`; the caller's final `encode` does. Register once per registry:
    /// twice would write every family twice.
    pub fn register(self: &Arc<Self>, registry: &mut Registry) {
        registry.register_collector(Box::new(AdmissionCollector(self.clone())));
    }
}

/// What [`AdmissionMetrics::register`] puts into the caller's registry.
#[derive(Debug)]
struct AdmissionCollector(Arc<AdmissionMetrics>);

/// One gate's figures as one scrape read them.
struct GateFigures<'g> {
    labels: Vec<(&'static str, LabelText<&'g str>)>,
    stats: WorkerAdmissionStats,
    limits: Option<AdmissionLimits>,
}

impl Collector for AdmissionCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        // An owned snapshot: the sources run the caller's code, which should
        // not hold one of arc-swap's few per-thread guard slots.
        let gates = self.0.gates.load_full();
        // Each source read once per scrape, so the families agree.
        let figures: Vec<GateFigures<'_>> = gates
            .iter()
            .map(|g| GateFigures { labels: g.labels(), stats: g.source.stats(), limits: g.source.limits() })
            .collect();
        counter_family(
            &mut encoder,
            "dynamo_rejection_request",
            "Requests refused because the worker was at capacity.",
            figures.iter().map(|g| (g.labels.as_slice(), g.stats.rejected)),
        )?;
        gauge_family(
            &mut encoder,
            "dynamo_engine_request",
            "Requests holding an engine slot.",
            figures.iter().map(|g| (g.labels.as_slice(), gauge_value(g.stats.running))),
        )?;
        gauge_family(
            &mut encoder,
            "dynamo_request_queue",
            "Requests waiting in the overflow queue.",
            figures.iter().map(|g| (g.labels.as_slice(), gauge_value(g.stats.queued))),
        )?;
        if figures.iter().all(|g| g.limits.is_none()) {
            return Ok(());
        }
        gauge_family(
            &mut encoder,
            "loadgate_worker_request_limit",
            "The engine request limit N.",
            figures.iter().filter_map(|g| Some((g.labels.as_slice(), gauge_value(g.limits?.limit)))),
        )?;
        gauge_family(
            &mut encoder,
            "loadgate_worker_queue_limit",
            "The overflow queue size Q.",
            figures.iter().filter_map(|g| Some((g.labels.as_slice(), gauge_value(g.limits?.queue_limit)))),
        )
    }
}

/// Renders one worker's admission metrics with the reference's names, as a
/// complete exposition ending in the one `# EOF` line: the families of
/// [`AdmissionMetrics`] for a single gate labelled `model` only (no
/// `worker_id`, no limits). Append nothing after it; for several gates, or
/// to combine with other metrics, [`AdmissionMetrics::register`] instead.
///
/// # Examples
///
/// ```
/// use loadgate::metrics::{render_worker, WorkerAdmissionStats};
///
/// let text = render_worker("llama", WorkerAdmissionStats { rejected: 5, running: 2, queued: 1 });
/// assert!(text.contains("dynamo_rejection_request_total{model=\"llama\"} 5\n"));
/// assert!(text.contains("dynamo_engine_request{model=\"llama\"} 2\n"));
/// assert!(text.ends_with("# EOF\n"));
/// ```
pub fn render_worker(model: &str, stats: WorkerAdmissionStats) -> String {
    let gates = Arc::new(AdmissionMetrics::new());
    let only = Gate { worker_id: None, model: model.to_owned(), source: Box::new(move || stats) };
    gates.insert(only).expect("the first gate has no duplicate");
    render(|registry| gates.register(registry))
}

/// As [`render_worker`], in `format`: the same text for
/// [`MetricsFormat::OpenMetrics`], the Prometheus text format 0.0.4 (no
/// `# EOF`) for [`MetricsFormat::Prometheus`]. Pick `format` with
/// [`MetricsFormat::from_accept`] and answer with its
/// [`content_type`](MetricsFormat::content_type).
///
/// # Examples
///
/// ```
/// use loadgate::metrics::{render_worker_as, MetricsFormat, WorkerAdmissionStats};
///
/// let stats = WorkerAdmissionStats { rejected: 5, running: 2, queued: 1 };
/// let text = render_worker_as("llama", stats, MetricsFormat::Prometheus);
/// assert!(text.contains("# TYPE dynamo_rejection_request_total counter\ndynamo_rejection_request_total{model=\"llama\"} 5\n"));
/// assert!(!text.contains("# EOF"));
/// ```
pub fn render_worker_as(model: &str, stats: WorkerAdmissionStats, format: MetricsFormat) -> String {
    format.convert(render_worker(model, stats))
}
