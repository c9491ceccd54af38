//! The frontend's families: rejection counters and the monitor's latest
//! observed load, as a collector in the caller's registry or as a complete
//! exposition.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;

use super::exposition::{counter_family, gauge_family, render, LabelText};
use super::format::MetricsFormat;
use super::labels::{Endpoint, Reason};
use super::rejections::{ModelCounts, RejectionMetrics};
use crate::class::Class;
use crate::monitor::{WorkerInfo, WorkerMonitor};
use crate::sync::Arc;
use crate::RankLoad;

impl RejectionMetrics {
    /// Registers the frontend's families into `registry`: every encoding of
    /// `registry` from now on writes the current rejection counters and
    /// `monitor`'s latest per-rank load (pass the monitor, or a clone of its
    /// `Arc`), with the names, helps and labels of
    /// [`render_frontend`](Self::render_frontend).
    ///
    /// | family | type | labels |
    /// |---|---|---|
    /// | `dynamo_frontend_model_rejection_total` | counter | `model`, `endpoint` |
    /// | `loadgate_frontend_rejection_reason_total` | counter | `model`, `reason` (reasons counted at least once) |
    /// | `loadgate_frontend_rejection_class_reason_total` | counter | `model`, `class`, `reason` (counted at least once) |
    /// | `dynamo_frontend_worker_active_decode_blocks` | gauge | `worker_id`, `dp_rank` (ranks with a load) |
    /// | `dynamo_frontend_worker_active_prefill_tokens` | gauge | `worker_id`, `dp_rank` |
    /// | `loadgate_frontend_worker_kv_total_blocks` | gauge | `worker_id`, `dp_rank` |
    /// | `loadgate_frontend_worker_waiting_requests` | gauge | `worker_id`, `dp_rank` |
    /// | `loadgate_frontend_worker_busy` | gauge | `worker_id`, `model` |
    ///
    /// The names are written as they stand: a prefix of `registry` (from
    /// `Registry::with_prefix` or `sub_registry_with_prefix`) is prepended
    /// with an underscore, so register into an unprefixed registry to keep
    /// the reference's names. Nothing registered here writes `# EOF`; the
    /// caller's final `encode` does. Register once per registry: twice
    /// would write every family twice.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use loadgate::{MonitorConfig, WorkerMonitor, metrics::{Endpoint, RejectionMetrics}};
    /// use prometheus_client::encoding::text::encode;
    /// use prometheus_client::registry::Registry;
    ///
    /// let monitor = Arc::new(WorkerMonitor::new(MonitorConfig::default()).unwrap());
    /// let metrics = Arc::new(RejectionMetrics::default());
    /// let mut registry = Registry::default();
    /// metrics.register(&mut registry, monitor);
    ///
    /// metrics.record("llama", Endpoint::Completions, []);
    /// let mut text = String::new();
    /// encode(&mut text, &registry).unwrap();
    /// assert!(text.contains(r#"dynamo_frontend_model_rejection_total{model="llama",endpoint="completions"} 1"#));
    /// ```
    pub fn register(self: &Arc<Self>, registry: &mut Registry, monitor: impl Into<Arc<WorkerMonitor>>) {
        registry.register_collector(Box::new(FrontendCollector { metrics: self.clone(), monitor: monitor.into() }));
    }

    /// Renders the frontend's metrics as a complete exposition: rejections,
    /// rejection reasons, and the latest observed per-rank load of every
    /// worker (the families of [`register`](Self::register)), ending in the
    /// one `# EOF` line. Append nothing after it; to combine these families
    /// with others, [`register`](Self::register) them instead.
    ///
    /// # Examples
    ///
    /// ```
    /// use loadgate::{MonitorConfig, WorkerMonitor, metrics::{Endpoint, RejectionMetrics}};
    ///
    /// let monitor = WorkerMonitor::new(MonitorConfig::default()).unwrap();
    /// let metrics = RejectionMetrics::default();
    /// metrics.record("llama", Endpoint::Completions, []);
    /// let text = metrics.render_frontend(&monitor);
    /// assert!(text.contains(r#"dynamo_frontend_model_rejection_total{model="llama",endpoint="completions"} 1"#));
    /// assert!(text.ends_with("# EOF\n"));
    /// ```
    pub fn render_frontend(&self, monitor: &WorkerMonitor) -> String {
        let figures = FrontendFigures::read(self, monitor);
        render(|registry| registry.register_collector(Box::new(figures)))
    }

    /// As [`render_frontend`](Self::render_frontend), in `format`: the same
    /// text for [`MetricsFormat::OpenMetrics`], the Prometheus text format
    /// 0.0.4 (no `# EOF`) for [`MetricsFormat::Prometheus`]. Pick `format`
    /// with [`MetricsFormat::from_accept`] and answer with its
    /// [`content_type`](MetricsFormat::content_type).
    ///
    /// # Examples
    ///
    /// ```
    /// use loadgate::{MonitorConfig, WorkerMonitor, metrics::{Endpoint, MetricsFormat, RejectionMetrics}};
    ///
    /// let monitor = WorkerMonitor::new(MonitorConfig::default()).unwrap();
    /// let metrics = RejectionMetrics::default();
    /// metrics.record("llama", Endpoint::Completions, []);
    /// let text = metrics.render_frontend_as(&monitor, MetricsFormat::Prometheus);
    /// assert!(text.starts_with("# HELP dynamo_frontend_model_rejection_total "));
    /// assert!(text.contains("\n# TYPE dynamo_frontend_model_rejection_total counter\n"));
    /// assert!(!text.contains("# EOF"));
    /// assert_eq!(metrics.render_frontend_as(&monitor, MetricsFormat::OpenMetrics), metrics.render_frontend(&monitor));
    /// ```
    pub fn render_frontend_as(&self, monitor: &WorkerMonitor, format: MetricsFormat) -> String {
        format.convert(self.render_frontend(monitor))
    }
}

/// What [`RejectionMetrics::register`] puts into the caller's registry: reads
/// the figures afresh on every encoding.
#[derive(Debug)]
struct FrontendCollector {
    metrics: Arc<RejectionMetrics>,
    monitor: Arc<WorkerMonitor>,
}

impl Collector for FrontendCollector {
    fn encode(&self, encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        FrontendFigures::read(&self.metrics, &self.monitor).encode(encoder)
    }
}

/// The frontend's figures as one scrape read them; as a collector, writes
/// exactly those (what [`RejectionMetrics::render_frontend`] registers).
#[derive(Debug)]
struct FrontendFigures {
    /// Sorted by model.
    models: Vec<ModelCounts>,
    /// `([worker_id, dp_rank], load)` of each rank with a load, sorted by
    /// worker and rank.
    ranks: Vec<([(&'static str, String); 2], RankLoad)>,
    /// Sorted by id.
    workers: Vec<WorkerInfo>,
}

impl FrontendFigures {
    fn read(metrics: &RejectionMetrics, monitor: &WorkerMonitor) -> Self {
        let ranks = monitor
            .rank_snapshots()
            .into_iter()
            .filter_map(|snap| {
                let load = snap.effective()?;
                Some(([("worker_id", snap.worker.to_string()), ("dp_rank", snap.rank.to_string())], load))
            })
            .collect();
        FrontendFigures { models: metrics.counts(), ranks, workers: monitor.workers() }
    }

    /// The per-rank series of one load figure.
    fn per_rank(&self, figure: fn(&RankLoad) -> u32) -> impl Iterator<Item = (&[(&'static str, String)], i64)> {
        self.ranks.iter().map(move |(labels, load)| (labels.as_slice(), i64::from(figure(load))))
    }
}

impl Collector for FrontendFigures {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        counter_family(
            &mut encoder,
            "dynamo_frontend_model_rejection",
            "Requests rejected because every eligible worker was busy or at capacity.",
            self.models.iter().flat_map(|m| {
                Endpoint::ALL.into_iter().map(move |e| {
                    ([("model", LabelText(&*m.model)), ("endpoint", LabelText(e.label()))], m.by_endpoint[e.index()])
                })
            }),
        )?;
        counter_family(
            &mut encoder,
            "loadgate_frontend_rejection_reason",
            "Rejected requests by busy signal or cause.",
            self.models.iter().flat_map(|m| {
                Reason::ALL
                    .into_iter()
                    .map(move |r| {
                        ([("model", LabelText(&*m.model)), ("reason", LabelText(r.label()))], m.by_reason[r.index()])
                    })
                    .filter(|&(_, n)| n > 0)
            }),
        )?;
        counter_family(
            &mut encoder,
            "loadgate_frontend_rejection_class_reason",
            "Rejected requests by priority class and busy signal or cause.",
            self.models.iter().flat_map(|m| {
                Class::ALL.into_iter().flat_map(move |c| {
                    Reason::ALL
                        .into_iter()
                        .map(move |r| {
                            let labels = [
                                ("model", LabelText(&*m.model)),
                                ("class", LabelText(c.label())),
                                ("reason", LabelText(r.label())),
                            ];
                            (labels, m.by_class_reason[c.index()][r.index()])
                        })
                        .filter(|&(_, n)| n > 0)
                })
            }),
        )?;
        gauge_family(
            &mut encoder,
            "dynamo_frontend_worker_active_decode_blocks",
            "Latest observed active decode blocks per worker rank.",
            self.per_rank(|l| l.active_decode_blocks),
        )?;
        gauge_family(
            &mut encoder,
            "dynamo_frontend_worker_active_prefill_tokens",
            "Latest observed active prefill tokens per worker rank.",
            self.per_rank(|l| l.active_prefill_tokens),
        )?;
        gauge_family(
            &mut encoder,
            "loadgate_frontend_worker_kv_total_blocks",
            "Latest observed total KV blocks per worker rank.",
            self.per_rank(|l| l.kv_total_blocks),
        )?;
        gauge_family(
            &mut encoder,
            "loadgate_frontend_worker_waiting_requests",
            "Latest observed requests waiting in the engine's queue per worker rank.",
            self.per_rank(|l| l.waiting_requests),
        )?;
        gauge_family(
            &mut encoder,
            "loadgate_frontend_worker_busy",
            "1 when the worker is in its model's busy set.",
            self.workers.iter().map(|w| {
                ([("worker_id", LabelText(w.id.to_string())), ("model", LabelText(w.model.clone()))], i64::from(w.busy))
            }),
        )
    }
}
