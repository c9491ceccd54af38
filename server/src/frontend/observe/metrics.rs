//! [`RequestMetrics`]: the request counters and histograms of `/metrics`,
//! with Dynamo's names, labels and buckets where Dynamo has them, kept in
//! prometheus-client families.
//!
//! | family | type | labels |
//! |---|---|---|
//! | `dynamo_frontend_requests_total` | counter | `model`, `endpoint`, `request_type`, `status`, `error_type` (LLM routes) |
//! | `dynamo_frontend_model_cancellation_total` | counter | `model`, `endpoint`, `request_type` (client gone) |
//! | `loadgate_frontend_http_responses_total` | counter | `model`, `endpoint`, `code` (every response) |
//! | `dynamo_frontend_inflight_requests` | gauge | `model` (LLM requests not ended; `none` until the response head names the model) |
//! | `dynamo_frontend_time_to_first_token_seconds` | histogram | `model` (2xx LLM responses) |
//! | `dynamo_frontend_request_duration_seconds` | histogram | `model` (every LLM request) |
//! | `dynamo_frontend_inter_token_latency_seconds` | histogram | `model` (2xx streams) |
//! | `loadgate_frontend_tenant_requests_total` | counter | `tenant`, `outcome` (LLM requests; [`TenantCounts`]) |
//!
//! The `model` label is bounded: a model the monitor knows has its own,
//! any other model a client names is `unknown`, and a response without a
//! model (`/health`, a 404 route) is `none`. The rows of models the monitor
//! has forgotten are dropped (on the next new row and on every scrape):
//! their series leave every family.
//!
//! A [`ModelRow`] holds its model's handles into the families. The request
//! path takes a read lock to find its model's row (once, at the response
//! head) and the row's read lock to find a counter or histogram; write
//! locks are taken only the first time a row or a series is seen. A
//! histogram series appears with its first observation; recording into it
//! takes no lock ([`StripedHistogram`]).

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use loadgate::metrics::{LabelText, StripedHistogram};

use super::buckets::{DURATION_BUCKETS, ITL_BUCKETS, TTFT_BUCKETS};
use super::route::{dynamo_outcome, CodeLabel, End, Route};
use super::tenants::TenantCounts;

/// The `model` label of a row.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum ModelKey {
    /// A model the monitor knows.
    Known(Arc<str>),
    /// A model the monitor does not know (any name a client sends).
    Unknown,
    /// A response with no model.
    None,
}

impl ModelKey {
    /// The label value.
    pub(super) fn label(&self) -> &str {
        match self {
            ModelKey::Known(model) => model,
            ModelKey::Unknown => "unknown",
            ModelKey::None => "none",
        }
    }

    /// A model the monitor no longer knows, by `known`.
    fn forgotten(&self, known: &impl Fn(&str) -> bool) -> bool {
        matches!(self, ModelKey::Known(model) if !known(model))
    }
}

impl EncodeLabelValue for ModelKey {
    /// The label value, escaped ([`LabelText`]).
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> fmt::Result {
        LabelText(self.label()).encode(encoder)
    }
}

/// The labels of the histograms and of the gauge.
#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ModelLabels {
    model: ModelKey,
}

/// The labels of `dynamo_frontend_requests_total`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RequestLabels {
    model: ModelKey,
    endpoint: &'static str,
    request_type: &'static str,
    status: &'static str,
    error_type: &'static str,
}

/// The labels of `dynamo_frontend_model_cancellation_total`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CancelLabels {
    model: ModelKey,
    endpoint: &'static str,
    request_type: &'static str,
}

/// The labels of `loadgate_frontend_http_responses_total`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ResponseLabels {
    model: ModelKey,
    endpoint: &'static str,
    code: CodeLabel,
}

/// One counter's labels within a model's row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Series {
    /// The `endpoint` label.
    pub(super) route: Route,
    /// `request_type`: `stream` (an SSE response) or `unary`.
    pub(super) stream: bool,
    /// The HTTP status (0: the response was never made).
    pub(super) code: u16,
    /// How it ended.
    pub(super) end: End,
}

/// The label sets of the counters one [`Series`] of `model` counts in.
struct SeriesLabels {
    requests: Option<RequestLabels>,
    cancelled: Option<CancelLabels>,
    responses: Option<ResponseLabels>,
}

impl SeriesLabels {
    fn of(model: &ModelKey, series: Series) -> Self {
        let endpoint = series.route.label();
        let request_type = if series.stream { "stream" } else { "unary" };
        let responses = (series.code != 0).then(|| ResponseLabels {
            model: model.clone(),
            endpoint,
            code: CodeLabel::of(series.code),
        });
        if !series.route.is_inference() {
            return SeriesLabels { requests: None, cancelled: None, responses };
        }
        let (status, error_type) = dynamo_outcome(series.code, series.end);
        SeriesLabels {
            requests: Some(RequestLabels { model: model.clone(), endpoint, request_type, status, error_type }),
            cancelled: (series.end == End::ClientGone).then(|| CancelLabels {
                model: model.clone(),
                endpoint,
                request_type,
            }),
            responses,
        }
    }
}

/// A histogram of [`ModelRow::observe`].
#[derive(Clone, Copy, Debug)]
pub(super) enum Timing {
    /// Time to the first body frame of 2xx LLM responses.
    Ttft,
    /// Time to the end of every LLM request.
    Duration,
    /// Time between tokens (SSE events) of 2xx streams.
    Itl,
}

/// A histogram family over fixed buckets. Its histograms are striped
/// ([`StripedHistogram`]): requests of one model recording at once on
/// different cores take no lock and share no cache line.
type Histograms = Family<ModelLabels, StripedHistogram, fn() -> StripedHistogram>;

/// The families of the table above.
#[derive(Debug)]
struct Families {
    requests: Family<RequestLabels, Counter>,
    cancelled: Family<CancelLabels, Counter>,
    responses: Family<ResponseLabels, Counter>,
    inflight: Family<ModelLabels, Gauge>,
    ttft: Histograms,
    duration: Histograms,
    itl: Histograms,
    tenants: TenantCounts,
}

impl Default for Families {
    fn default() -> Self {
        Families {
            requests: Family::default(),
            cancelled: Family::default(),
            responses: Family::default(),
            inflight: Family::default(),
            ttft: Family::new_with_constructor(|| StripedHistogram::new(TTFT_BUCKETS.iter().copied())),
            duration: Family::new_with_constructor(|| StripedHistogram::new(DURATION_BUCKETS.iter().copied())),
            itl: Family::new_with_constructor(|| StripedHistogram::new(ITL_BUCKETS.iter().copied())),
            tenants: TenantCounts::default(),
        }
    }
}

impl Families {
    fn timing(&self, timing: Timing) -> &Histograms {
        match timing {
            Timing::Ttft => &self.ttft,
            Timing::Duration => &self.duration,
            Timing::Itl => &self.itl,
        }
    }
}

/// The counters one [`Series`] counts in.
#[derive(Debug)]
struct Counted {
    requests: Option<Counter>,
    cancelled: Option<Counter>,
    responses: Option<Counter>,
}

impl Counted {
    fn inc(&self) {
        for counter in [&self.requests, &self.cancelled, &self.responses].into_iter().flatten() {
            counter.inc();
        }
    }
}

/// What a row has made in the families.
#[derive(Debug, Default)]
struct Made {
    /// The row was dropped: it makes no more series (they would outlive it).
    dropped: bool,
    counts: HashMap<Series, Counted>,
    /// By [`Timing`].
    timings: [Option<StripedHistogram>; 3],
}

/// One model's handles into the families.
#[derive(Debug)]
pub(super) struct ModelRow {
    key: ModelKey,
    families: Arc<Families>,
    made: RwLock<Made>,
    /// LLM requests whose response head named this model and whose body
    /// has not ended.
    pub(super) inflight: Gauge,
}

impl ModelRow {
    fn new(key: ModelKey, families: Arc<Families>) -> Self {
        let inflight = families.inflight.get_or_create(&ModelLabels { model: key.clone() }).clone();
        ModelRow { key, families, made: RwLock::default(), inflight }
    }

    /// Counts one request of `series`.
    pub(super) fn count(&self, series: Series) {
        let made = self.made.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(counted) = made.counts.get(&series) {
            counted.inc();
            return;
        }
        drop(made);
        self.count_new(series);
    }

    #[cold]
    fn count_new(&self, series: Series) {
        let mut made = self.made.write().unwrap_or_else(PoisonError::into_inner);
        if made.dropped {
            return;
        }
        let families = &self.families;
        let counted = made.counts.entry(series).or_insert_with(|| {
            let labels = SeriesLabels::of(&self.key, series);
            Counted {
                requests: labels.requests.map(|l| families.requests.get_or_create(&l).clone()),
                cancelled: labels.cancelled.map(|l| families.cancelled.get_or_create(&l).clone()),
                responses: labels.responses.map(|l| families.responses.get_or_create(&l).clone()),
            }
        });
        counted.inc();
    }

    /// Counts `n` observations of `elapsed` each in the `timing` histogram.
    pub(super) fn observe(&self, timing: Timing, elapsed: Duration, n: u32) {
        let made = self.made.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(histogram) = &made.timings[timing as usize] {
            histogram.observe_n(elapsed.as_secs_f64(), n);
            return;
        }
        drop(made);
        self.observe_new(timing, elapsed, n);
    }

    #[cold]
    fn observe_new(&self, timing: Timing, elapsed: Duration, n: u32) {
        let mut made = self.made.write().unwrap_or_else(PoisonError::into_inner);
        if made.dropped {
            return;
        }
        let family = self.families.timing(timing);
        let histogram = made.timings[timing as usize]
            .get_or_insert_with(|| family.get_or_create(&ModelLabels { model: self.key.clone() }).clone());
        histogram.observe_n(elapsed.as_secs_f64(), n);
    }

    /// Counts a request of `tenant` by its outcome ([`TenantCounts`]).
    pub(super) fn count_tenant(&self, tenant: &Arc<str>, status: Option<axum::http::StatusCode>, end: End) {
        self.families.tenants.count(tenant, status, end);
    }

    /// Removes every series of this row from the families.
    fn drop_series(&self) {
        let mut made = self.made.write().unwrap_or_else(PoisonError::into_inner);
        made.dropped = true;
        let families = &self.families;
        for series in made.counts.keys() {
            let labels = SeriesLabels::of(&self.key, *series);
            if let Some(l) = labels.requests {
                families.requests.remove(&l);
            }
            if let Some(l) = labels.cancelled {
                families.cancelled.remove(&l);
            }
            if let Some(l) = labels.responses {
                families.responses.remove(&l);
            }
        }
        let model = ModelLabels { model: self.key.clone() };
        for family in [&families.ttft, &families.duration, &families.itl] {
            family.remove(&model);
        }
        families.inflight.remove(&model);
    }
}

/// The inference listener's request counters and histograms.
#[derive(Debug)]
pub(crate) struct RequestMetrics {
    families: Arc<Families>,
    rows: RwLock<HashMap<ModelKey, Arc<ModelRow>>>,
    /// LLM requests whose response has not been made yet (their model is
    /// not known to the layer until then): the `model="none"` gauge.
    pub(super) awaiting: Gauge,
}

impl Default for RequestMetrics {
    fn default() -> Self {
        let families = Arc::new(Families::default());
        let awaiting = families.inflight.get_or_create(&ModelLabels { model: ModelKey::None }).clone();
        RequestMetrics { families, rows: RwLock::default(), awaiting }
    }
}

impl RequestMetrics {
    /// `key`'s row, made on first use; making one also drops the rows of
    /// models `known` refuses.
    pub(super) fn row(&self, key: ModelKey, known: impl Fn(&str) -> bool) -> Arc<ModelRow> {
        if let Some(row) = self.rows.read().unwrap_or_else(PoisonError::into_inner).get(&key) {
            return row.clone();
        }
        self.new_row(key, known)
    }

    #[cold]
    fn new_row(&self, key: ModelKey, known: impl Fn(&str) -> bool) -> Arc<ModelRow> {
        let mut rows = self.rows.write().unwrap_or_else(PoisonError::into_inner);
        drop_forgotten(&mut rows, &known);
        rows.entry(key.clone()).or_insert_with(|| Arc::new(ModelRow::new(key, self.families.clone()))).clone()
    }

    /// Drops the rows of models `known` refuses (their series end).
    pub(crate) fn retain_known(&self, known: impl Fn(&str) -> bool) {
        let stale = self.rows.read().unwrap_or_else(PoisonError::into_inner).keys().any(|k| k.forgotten(&known));
        if stale {
            drop_forgotten(&mut self.rows.write().unwrap_or_else(PoisonError::into_inner), &known);
        }
    }

    /// Ends the series of the tenants named (the tenants file lost them).
    pub(crate) fn forget_tenants(&self, names: &[String]) {
        for name in names {
            self.families.tenants.forget(name);
        }
    }

    /// Registers the families of the table above into `registry`, in its
    /// order (they write no `# EOF`).
    pub(crate) fn register(&self, registry: &mut Registry) {
        // `Registry::register` appends the full stop to each help.
        let f = &self.families;
        registry.register("dynamo_frontend_requests", "Total number of LLM requests processed", f.requests.clone());
        registry.register(
            "dynamo_frontend_model_cancellation",
            "Total number of request cancellations (the client went away before the end)",
            f.cancelled.clone(),
        );
        registry.register(
            "loadgate_frontend_http_responses",
            "Responses of the inference listener by HTTP status",
            f.responses.clone(),
        );
        registry.register("dynamo_frontend_inflight_requests", "Number of inflight requests", f.inflight.clone());
        registry.register(
            "dynamo_frontend_time_to_first_token_seconds",
            "Time to first token in seconds (the first body frame of a 2xx LLM response)",
            f.ttft.clone(),
        );
        registry.register("dynamo_frontend_request_duration_seconds", "Duration of LLM requests", f.duration.clone());
        registry.register(
            "dynamo_frontend_inter_token_latency_seconds",
            "Inter-token latency in seconds (between the SSE events of a 2xx stream)",
            f.itl.clone(),
        );
        f.tenants.register(registry);
    }
}

/// Drops the rows of `rows` whose models `known` refuses, and their series.
fn drop_forgotten(rows: &mut HashMap<ModelKey, Arc<ModelRow>>, known: &impl Fn(&str) -> bool) {
    rows.retain(|key, row| {
        let forgotten = key.forgotten(known);
        if forgotten {
            row.drop_series();
        }
        !forgotten
    });
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::text::encode;

    use super::*;

    fn series(route: Route, code: u16, end: End) -> Series {
        Series { route, stream: false, code, end }
    }

    fn render(metrics: &RequestMetrics) -> String {
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        text
    }

    /// Statuses an upstream invents share their class's series.
    #[test]
    fn unusual_statuses_share_one_series_per_class() {
        let metrics = RequestMetrics::default();
        let row = metrics.row(ModelKey::Known("m".into()), |m: &str| m == "m");
        for code in 590..600 {
            row.count(series(Route::Completions, code, End::Complete));
        }
        let text = render(&metrics);
        assert!(
            text.contains(
                "loadgate_frontend_http_responses_total{model=\"m\",endpoint=\"completions\",code=\"5xx\"} 10\n"
            ),
            "{text}"
        );
        assert_eq!(text.matches("loadgate_frontend_http_responses_total{").count(), 1, "{text}");
    }

    #[test]
    fn counts_render_in_dynamos_families_and_per_status() {
        let metrics = RequestMetrics::default();
        let known = |m: &str| m == "m";
        let row = metrics.row(ModelKey::Known("m".into()), known);
        row.count(series(Route::Completions, 200, End::Complete));
        row.count(series(Route::Completions, 200, End::Complete));
        row.count(series(Route::Completions, 200, End::ClientGone));
        row.count(Series { stream: true, ..series(Route::ChatCompletions, 529, End::Complete) });
        row.observe(Timing::Duration, Duration::from_millis(3), 1);
        row.observe(Timing::Itl, Duration::from_millis(5), 2);
        metrics.row(ModelKey::None, known).count(series(Route::Health, 503, End::Complete));
        let text = render(&metrics);
        for line in [
            "# HELP dynamo_frontend_requests Total number of LLM requests processed.\n# TYPE dynamo_frontend_requests counter\n",
            "dynamo_frontend_requests_total{model=\"m\",endpoint=\"completions\",request_type=\"unary\",status=\"success\",error_type=\"\"} 2\n",
            "dynamo_frontend_requests_total{model=\"m\",endpoint=\"completions\",request_type=\"unary\",status=\"error\",error_type=\"cancelled\"} 1\n",
            "dynamo_frontend_requests_total{model=\"m\",endpoint=\"chat_completions\",request_type=\"stream\",status=\"error\",error_type=\"overload\"} 1\n",
            "dynamo_frontend_model_cancellation_total{model=\"m\",endpoint=\"completions\",request_type=\"unary\"} 1\n",
            "loadgate_frontend_http_responses_total{model=\"m\",endpoint=\"completions\",code=\"200\"} 3\n",
            "loadgate_frontend_http_responses_total{model=\"none\",endpoint=\"health\",code=\"503\"} 1\n",
            "dynamo_frontend_inflight_requests{model=\"m\"} 0\n",
            "dynamo_frontend_inflight_requests{model=\"none\"} 0\n",
            "dynamo_frontend_request_duration_seconds_count{model=\"m\"} 1\n",
            // prometheus-client writes `le` before the family's labels.
            "dynamo_frontend_request_duration_seconds_bucket{le=\"2.0\",model=\"m\"} 1\n",
            "dynamo_frontend_request_duration_seconds_bucket{le=\"+Inf\",model=\"m\"} 1\n",
            "dynamo_frontend_inter_token_latency_seconds_count{model=\"m\"} 2\n",
            "# TYPE dynamo_frontend_time_to_first_token_seconds histogram\n",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        assert!(!text.contains("endpoint=\"health\",request_type"), "{text}");
        assert!(!text.contains("_count{model=\"none\"}"), "no observation, no histogram series: {text}");
        assert!(!text.contains("time_to_first_token_seconds_count"), "{text}");
    }

    #[test]
    fn buckets_count_the_first_bound_at_least_as_large() {
        let metrics = RequestMetrics::default();
        let row = metrics.row(ModelKey::Unknown, |_| true);
        row.observe(Timing::Duration, Duration::from_secs(2), 1);
        row.observe(Timing::Duration, Duration::from_millis(2001), 1);
        row.observe(Timing::Duration, Duration::from_secs(600), 2);
        let text = render(&metrics);
        let name = "dynamo_frontend_request_duration_seconds";
        for line in [
            format!("{name}_sum{{model=\"unknown\"}} 1204.001\n"),
            format!("{name}_count{{model=\"unknown\"}} 4\n"),
            format!("{name}_bucket{{le=\"0.0\",model=\"unknown\"}} 0\n"),
            format!("{name}_bucket{{le=\"2.0\",model=\"unknown\"}} 1\n"),
            format!("{name}_bucket{{le=\"4.0\",model=\"unknown\"}} 2\n"),
            format!("{name}_bucket{{le=\"510.0\",model=\"unknown\"}} 2\n"),
            format!("{name}_bucket{{le=\"+Inf\",model=\"unknown\"}} 4\n"),
        ] {
            assert!(text.contains(&line), "missing {line:?} in\n{text}");
        }
    }

    #[test]
    fn rows_of_forgotten_models_are_dropped() {
        let metrics = RequestMetrics::default();
        let gone = metrics.row(ModelKey::Known("gone".into()), |_| true);
        gone.count(series(Route::Completions, 200, End::Complete));
        gone.observe(Timing::Ttft, Duration::from_millis(1), 1);
        assert!(render(&metrics).contains("model=\"gone\""));
        metrics.row(ModelKey::Unknown, |m| m != "gone");
        assert!(!render(&metrics).contains("model=\"gone\""), "{}", render(&metrics));
        // A request still holding the dropped row makes no new series.
        gone.count(series(Route::Completions, 503, End::Complete));
        gone.observe(Timing::Duration, Duration::from_millis(1), 1);
        assert!(!render(&metrics).contains("model=\"gone\""), "{}", render(&metrics));
        let kept = metrics.row(ModelKey::Known("kept".into()), |_| true);
        kept.count(series(Route::Completions, 200, End::Complete));
        metrics.retain_known(|m| m != "kept");
        let text = render(&metrics);
        assert!(!text.contains("model=\"kept\"") && text.contains("model=\"unknown\""), "{text}");
        assert_eq!(metrics.rows.read().unwrap().keys().cloned().collect::<Vec<_>>(), [ModelKey::Unknown]);
    }

    #[test]
    fn label_values_are_escaped() {
        let metrics = RequestMetrics::default();
        metrics.row(ModelKey::Known("a\"b\\c\nd".into()), |_| true);
        let text = render(&metrics);
        assert!(text.contains("dynamo_frontend_inflight_requests{model=\"a\\\"b\\\\c\\nd\"} 0\n"), "{text}");
    }
}
