//! [`RequestMetrics`]: the request counters and histograms of `/metrics`,
//! with Dynamo's names, labels and buckets where Dynamo has them.
//!
//! | family | type | labels |
//! |---|---|---|
//! | `dynamo_frontend_requests_total` | counter | `model`, `endpoint`, `request_type`, `status`, `error_type` (LLM routes) |
//! | `dynamo_frontend_model_cancellation_total` | counter | `model`, `endpoint`, `request_type` (client gone) |
//! | `loadgate_frontend_http_responses_total` | counter | `model`, `endpoint`, `code` (every response) |
//! | `dynamo_frontend_time_to_first_token_seconds` | histogram | `model` (2xx LLM responses) |
//! | `dynamo_frontend_request_duration_seconds` | histogram | `model` (every LLM request) |
//! | `dynamo_frontend_inter_token_latency_seconds` | histogram | `model` (2xx streams) |
//! | `dynamo_frontend_inflight_requests` | gauge | `model` (LLM requests not ended; `none` until the response head names the model) |
//!
//! The `model` label is bounded: a model the monitor knows has its own,
//! any other model a client names is `unknown`, and a response without a
//! model (`/health`, a 404 route) is `none`. The rows of models the monitor
//! has forgotten are dropped (on the next new row and on every scrape).
//!
//! The request path takes a read lock to find its model's row (once, at the
//! response head) and its counter (once, at the end), then relaxed atomics;
//! the write lock is taken only the first time a row or a series is seen.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use super::histogram::{Histogram, DURATION_BUCKETS, ITL_BUCKETS, TTFT_BUCKETS};
use super::route::{dynamo_outcome, End, Route};

/// The `model` label of a row.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
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
}

/// One counter's labels within a model's row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
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

/// One model's counters and histograms.
#[derive(Debug)]
pub(super) struct ModelRow {
    counts: RwLock<HashMap<Series, AtomicU64>>,
    /// Time to the first body frame of 2xx LLM responses.
    pub(super) ttft: Histogram,
    /// Time to the end of every LLM request.
    pub(super) duration: Histogram,
    /// Time between tokens (SSE events) of 2xx streams.
    pub(super) itl: Histogram,
    /// LLM requests whose response head named this model and whose body
    /// has not ended.
    pub(super) inflight: AtomicI64,
}

impl ModelRow {
    fn new() -> Self {
        ModelRow {
            counts: RwLock::default(),
            ttft: Histogram::new(&TTFT_BUCKETS),
            duration: Histogram::new(&DURATION_BUCKETS),
            itl: Histogram::new(&ITL_BUCKETS),
            inflight: AtomicI64::new(0),
        }
    }

    /// Counts one request of `series`.
    pub(super) fn count(&self, series: Series) {
        let counts = self.counts.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(counter) = counts.get(&series) {
            // Relaxed: an independent counter; scrapes need no ordering.
            counter.fetch_add(1, Ordering::Relaxed);
            return;
        }
        drop(counts);
        self.count_new(series);
    }

    #[cold]
    fn count_new(&self, series: Series) {
        let mut counts = self.counts.write().unwrap_or_else(PoisonError::into_inner);
        // Relaxed: as in `count`.
        counts.entry(series).or_default().fetch_add(1, Ordering::Relaxed);
    }

    /// Every series with its count, sorted.
    fn counts(&self) -> Vec<(Series, u64)> {
        let counts = self.counts.read().unwrap_or_else(PoisonError::into_inner);
        // Relaxed: counter reads.
        let mut all: Vec<(Series, u64)> = counts.iter().map(|(s, n)| (*s, n.load(Ordering::Relaxed))).collect();
        all.sort_unstable();
        all
    }
}

/// The inference listener's request counters and histograms.
#[derive(Debug, Default)]
pub(crate) struct RequestMetrics {
    rows: RwLock<HashMap<ModelKey, Arc<ModelRow>>>,
    /// LLM requests whose response has not been made yet (their model is
    /// not known to the layer until then).
    pub(super) awaiting: AtomicI64,
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
        rows.retain(|k, _| !matches!(k, ModelKey::Known(model) if !known(model)));
        rows.entry(key).or_insert_with(|| Arc::new(ModelRow::new())).clone()
    }

    /// Drops the rows of models `known` refuses (their series end).
    pub(crate) fn retain_known(&self, known: impl Fn(&str) -> bool) {
        let stale = {
            let rows = self.rows.read().unwrap_or_else(PoisonError::into_inner);
            rows.keys().any(|k| matches!(k, ModelKey::Known(model) if !known(model)))
        };
        if stale {
            let mut rows = self.rows.write().unwrap_or_else(PoisonError::into_inner);
            rows.retain(|k, _| !matches!(k, ModelKey::Known(model) if !known(model)));
        }
    }

    /// Every row, sorted by model.
    fn rows(&self) -> Vec<(ModelKey, Arc<ModelRow>)> {
        let rows = self.rows.read().unwrap_or_else(PoisonError::into_inner);
        let mut all: Vec<(ModelKey, Arc<ModelRow>)> = rows.iter().map(|(k, r)| (k.clone(), r.clone())).collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// Appends the families of the table above to `out` (OpenMetrics text,
    /// without `# EOF`).
    pub(crate) fn render(&self, out: &mut String) {
        let rows = self.rows();
        let mut requests: BTreeMap<String, u64> = BTreeMap::new();
        let mut cancelled: BTreeMap<String, u64> = BTreeMap::new();
        let mut responses: BTreeMap<String, u64> = BTreeMap::new();
        for (key, row) in &rows {
            let model = escape(key.label());
            for (series, n) in row.counts() {
                let endpoint = series.route.label();
                let request_type = if series.stream { "stream" } else { "unary" };
                if series.code != 0 {
                    let labels = format!("model=\"{model}\",endpoint=\"{endpoint}\",code=\"{}\"", series.code);
                    *responses.entry(labels).or_default() += n;
                }
                if !series.route.is_inference() {
                    continue;
                }
                let (status, error_type) = dynamo_outcome(series.code, series.end);
                let labels = format!(
                    "model=\"{model}\",endpoint=\"{endpoint}\",request_type=\"{request_type}\",status=\"{status}\",error_type=\"{error_type}\""
                );
                *requests.entry(labels).or_default() += n;
                if series.end == End::ClientGone {
                    let labels = format!("model=\"{model}\",endpoint=\"{endpoint}\",request_type=\"{request_type}\"");
                    *cancelled.entry(labels).or_default() += n;
                }
            }
        }
        counter(out, "dynamo_frontend_requests", "Total number of LLM requests processed.", &requests);
        counter(
            out,
            "dynamo_frontend_model_cancellation",
            "Total number of request cancellations (the client went away before the end).",
            &cancelled,
        );
        counter(
            out,
            "loadgate_frontend_http_responses",
            "Responses of the inference listener by HTTP status.",
            &responses,
        );
        type Pick = fn(&ModelRow) -> &Histogram;
        let histograms: [(&str, &str, Pick); 3] = [
            (
                "dynamo_frontend_time_to_first_token_seconds",
                "Time to first token in seconds (the first body frame of a 2xx LLM response).",
                |row| &row.ttft,
            ),
            ("dynamo_frontend_request_duration_seconds", "Duration of LLM requests.", |row| &row.duration),
            (
                "dynamo_frontend_inter_token_latency_seconds",
                "Inter-token latency in seconds (between the SSE events of a 2xx stream).",
                |row| &row.itl,
            ),
        ];
        let _ = writeln!(
            out,
            "# HELP dynamo_frontend_inflight_requests Number of inflight requests.\n# TYPE dynamo_frontend_inflight_requests gauge"
        );
        // Relaxed: gauge reads; a scrape needs no ordering between them.
        let mut none = self.awaiting.load(Ordering::Relaxed);
        for (key, row) in &rows {
            // Relaxed: as above.
            let n = row.inflight.load(Ordering::Relaxed);
            if *key == ModelKey::None {
                none += n;
            } else {
                let _ = writeln!(out, "dynamo_frontend_inflight_requests{{model=\"{}\"}} {n}", escape(key.label()));
            }
        }
        let _ = writeln!(out, "dynamo_frontend_inflight_requests{{model=\"none\"}} {none}");
        for (name, help, pick) in histograms {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
            for (key, row) in &rows {
                let snapshot = pick(row).snapshot();
                if snapshot.count > 0 {
                    snapshot.write(out, name, &format!("model=\"{}\"", escape(key.label())));
                }
            }
        }
    }
}

/// Writes one counter family (`name` without `_total`).
fn counter(out: &mut String, name: &str, help: &str, series: &BTreeMap<String, u64>) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
    for (labels, n) in series {
        let _ = writeln!(out, "{name}_total{{{labels}}} {n}");
    }
}

/// A label value escaped for the text exposition (`\`, `"`, newline).
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn series(route: Route, code: u16, end: End) -> Series {
        Series { route, stream: false, code, end }
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
        row.duration.observe(Duration::from_millis(3));
        metrics.row(ModelKey::None, known).count(series(Route::Health, 503, End::Complete));
        let mut text = String::new();
        metrics.render(&mut text);
        for line in [
            "dynamo_frontend_requests_total{model=\"m\",endpoint=\"completions\",request_type=\"unary\",status=\"success\",error_type=\"\"} 2\n",
            "dynamo_frontend_requests_total{model=\"m\",endpoint=\"completions\",request_type=\"unary\",status=\"error\",error_type=\"cancelled\"} 1\n",
            "dynamo_frontend_requests_total{model=\"m\",endpoint=\"chat_completions\",request_type=\"stream\",status=\"error\",error_type=\"overload\"} 1\n",
            "dynamo_frontend_model_cancellation_total{model=\"m\",endpoint=\"completions\",request_type=\"unary\"} 1\n",
            "loadgate_frontend_http_responses_total{model=\"m\",endpoint=\"completions\",code=\"200\"} 3\n",
            "loadgate_frontend_http_responses_total{model=\"none\",endpoint=\"health\",code=\"503\"} 1\n",
            "dynamo_frontend_request_duration_seconds_count{model=\"m\"} 1\n",
            "# TYPE dynamo_frontend_time_to_first_token_seconds histogram\n",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        assert!(!text.contains("endpoint=\"health\",request_type"), "{text}");
        assert!(!text.contains("_count{model=\"none\"}"), "{text}");
    }

    #[test]
    fn rows_of_forgotten_models_are_dropped() {
        let metrics = RequestMetrics::default();
        metrics.row(ModelKey::Known("gone".into()), |_| true).count(series(Route::Completions, 200, End::Complete));
        metrics.row(ModelKey::Unknown, |m| m != "gone");
        assert_eq!(metrics.rows().len(), 1);
        metrics.row(ModelKey::Known("kept".into()), |_| true);
        metrics.retain_known(|m| m != "kept");
        assert_eq!(metrics.rows().iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(), [ModelKey::Unknown]);
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
