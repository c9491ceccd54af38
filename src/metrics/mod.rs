//! Rejection counters and admission figures as Prometheus metrics, with the
//! reference's metric names (feature `prometheus`).
//!
//! Counting is one relaxed `fetch_add` per counter on the request path; the
//! per-model row is found with one arc-swap load and a map lookup. A scrape
//! reads the counters, the monitor's load and each gate's figures, and writes
//! them through prometheus-client 0.23 (the version loadgate depends on: the
//! caller's `Registry` must be of that version).
//!
//! | item | what it is |
//! |---|---|
//! | [`RejectionMetrics`], [`Endpoint`], [`Reason`] | the frontend's rejection counters and their labels |
//! | [`RejectionMetrics::register`] | the counters and the monitor's per-rank gauges, into the caller's registry |
//! | [`AdmissionMetrics`], [`AdmissionSource`], [`AdmissionLimits`], [`AddGateError`] | the figures of every admission gate one process holds, labelled by `worker_id` |
//! | [`RejectionMetrics::render_frontend`], [`render_worker`], [`WorkerAdmissionStats`] | a complete exposition on their own, for a server without a registry |
//! | [`MetricsFormat`], [`RejectionMetrics::render_frontend_as`], [`render_worker_as`], [`openmetrics_to_prometheus`] | the exposition in the format the scraper asked for (OpenMetrics or the Prometheus text format 0.0.4) |
//! | [`StripedHistogram`] | a drop-in for prometheus-client's `Histogram` (same buckets, same text) whose recording takes no lock |
//!
//! # Plugging into the caller's registry
//!
//! [`RejectionMetrics::register`] and [`AdmissionMetrics::register`] add a
//! `prometheus_client::collector::Collector` to a `Registry` the embedder
//! owns. Nothing is copied at registration: every encoding of that registry
//! reads the live counters, so the embedder's one `/metrics` handler serves
//! its own metrics and loadgate's together.
//!
//! ```
//! use std::sync::Arc;
//! use loadgate::{MonitorConfig, WorkerMonitor, metrics::{Endpoint, Reason, RejectionMetrics}};
//! use prometheus_client::encoding::text::encode;
//! use prometheus_client::metrics::counter::Counter;
//! use prometheus_client::registry::Registry;
//!
//! let monitor = Arc::new(WorkerMonitor::new(MonitorConfig::default()).unwrap());
//! let rejections = Arc::new(RejectionMetrics::default());
//!
//! let mut registry = Registry::default();
//! let requests = Counter::<u64>::default();
//! registry.register("app_requests", "Requests served", requests.clone());
//! rejections.register(&mut registry, monitor.clone());
//!
//! rejections.record("llama", Endpoint::Completions, [Reason::DecodeBlocks]);
//! let mut text = String::new();
//! encode(&mut text, &registry).unwrap(); // the caller writes the one `# EOF`
//! assert!(text.contains(r#"dynamo_frontend_model_rejection_total{model="llama",endpoint="completions"} 1"#));
//! assert!(text.contains("app_requests_total 0"));
//! assert!(text.ends_with("# EOF\n"));
//! assert_eq!(text.matches("# EOF").count(), 1);
//! ```
//!
//! # Names and prefixes
//!
//! Every name already carries its namespace: `dynamo_…` where the reference
//! defines the metric, `loadgate_…` for ours. They are written as given. A
//! registry made with `Registry::with_prefix("p")`, or reached through
//! `sub_registry_with_prefix("p")`, prepends `p_` to each of them
//! (`p_dynamo_frontend_model_rejection_total`): register into an unprefixed
//! registry to keep the names dashboards for the reference expect, and never
//! pass `loadgate` or `dynamo` as a prefix (`loadgate_loadgate_…`).
//!
//! The constant labels of `Registry::with_labels` or `sub_registry_with_label`
//! are added to every series. Do not use a label the series already carry
//! (`model`, `endpoint`, `reason`, `worker_id`, `dp_rank`): a label name may
//! appear only once per series.
//!
//! # Several gates in one process
//!
//! A metric family's `# HELP` and `# TYPE` lines may appear only once in an
//! exposition. One [`AdmissionMetrics`] holds every gate of the process and
//! writes each family once, with one series per gate told apart by its
//! `worker_id` label. Registering one collector per gate, each under its own
//! `sub_registry_with_label(("worker_id", …))`, would repeat every family
//! once per gate: Prometheus refuses that scrape.
//!
//! # Formats: OpenMetrics or the Prometheus text format
//!
//! prometheus-client writes OpenMetrics 1.0.0 text only. A scraper that
//! reads the Prometheus text format 0.0.4 (the Python
//! `prometheus_client.parser`, older Prometheus servers, many agents)
//! misreads it: every counter becomes an empty counter plus one `unknown`
//! family per sample. Serve what the request's `Accept` asks for:
//! [`MetricsFormat::from_accept`] picks OpenMetrics when `Accept` asks for
//! `application/openmetrics-text` (as Prometheus does) and the 0.0.4 text
//! format otherwise (curl, classic scrapers);
//! [`content_type`](MetricsFormat::content_type) is the answer's
//! `Content-Type`, and [`MetricsFormat::encode`] (a registry),
//! [`MetricsFormat::convert`] (an OpenMetrics text),
//! [`RejectionMetrics::render_frontend_as`] and [`render_worker_as`] write
//! the body. With `axum` too, the handler `loadgate::web::metrics` does all
//! of it for the state's `Exposition` (a registry).
//!
//! ```
//! use loadgate::metrics::{MetricsFormat, RejectionMetrics, Endpoint};
//! use loadgate::{MonitorConfig, WorkerMonitor};
//! use prometheus_client::registry::Registry;
//!
//! let monitor = std::sync::Arc::new(WorkerMonitor::new(MonitorConfig::default()).unwrap());
//! let rejections = std::sync::Arc::new(RejectionMetrics::default());
//! let mut registry = Registry::default();
//! rejections.register(&mut registry, monitor);
//! rejections.record("llama", Endpoint::Completions, []);
//!
//! // In the `/metrics` handler:
//! let format = MetricsFormat::from_accept(Some("text/plain;version=0.0.4"));
//! let body = format.encode(&registry);
//! assert_eq!(format.content_type(), "text/plain; version=0.0.4; charset=utf-8");
//! assert!(body.contains("# TYPE dynamo_frontend_model_rejection_total counter\n"));
//! assert!(!body.contains("# EOF"));
//! ```
//!
//! # Complete and partial expositions
//!
//! A complete OpenMetrics exposition ends with exactly one `# EOF` line, and
//! nothing follows it. [`RejectionMetrics::render_frontend`] and
//! [`render_worker`] return complete OpenMetrics expositions; do not
//! concatenate them with other text. Convert whole families to the
//! Prometheus text format (a complete exposition, or the text of
//! `encode_registry`): the conversion names a family's samples from the
//! metadata lines before them.
//!
//! A partial rendering, the text an embedder concatenates with its own, must
//! never contain `# EOF`. Nothing loadgate registers writes it: only the
//! caller's final `prometheus_client::encoding::text::encode` (or its
//! `encode_eof`) does, once, at the end. To build pieces, encode each registry
//! with `encode_registry` and finish with one `encode_eof`.

mod error;
mod exposition;
mod format;
mod frontend;
mod gates;
mod histogram;
mod labels;
mod rejections;
mod source;
mod stripe;
#[cfg(test)]
mod tests;

pub use error::AddGateError;
pub use exposition::LabelText;
pub use format::{openmetrics_to_prometheus, MetricsFormat};
pub use gates::{render_worker, render_worker_as, AdmissionMetrics};
pub use histogram::StripedHistogram;
pub use labels::{Endpoint, Reason};
pub use rejections::RejectionMetrics;
pub use source::{AdmissionLimits, AdmissionSource, WorkerAdmissionStats};
