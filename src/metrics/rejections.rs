//! The frontend's rejection counters: per model, per endpoint, and per
//! class and reason.

use std::collections::HashMap;
use std::fmt;

use super::labels::{Endpoint, Reason};
use crate::class::Class;
use crate::sync::{lock, Arc, AtomicU64, Mutex, Ordering, Swap};

/// One model's counters. Per reason they are kept per class too; the
/// per-reason figures are their sums (one increment per reason on the
/// reject path, as before classes).
#[derive(Default)]
struct ModelRow {
    by_endpoint: [AtomicU64; Endpoint::ALL.len()],
    by_class_reason: [[AtomicU64; Reason::ALL.len()]; Class::COUNT],
}

/// One model's counters as one scrape read them.
#[derive(Clone, Debug)]
pub(super) struct ModelCounts {
    /// The model (the `model` label).
    pub(super) model: Arc<str>,
    /// Rejections per [`Endpoint::index`].
    pub(super) by_endpoint: [u64; Endpoint::ALL.len()],
    /// Rejections per [`Reason::index`] (all classes).
    pub(super) by_reason: [u64; Reason::ALL.len()],
    /// Rejections per [`Class::index`] and [`Reason::index`].
    pub(super) by_class_reason: [[u64; Reason::ALL.len()]; Class::COUNT],
}

/// Rejections per model, per endpoint and per reason.
///
/// [`register`](Self::register) puts them, with the monitor's per-rank load,
/// into the caller's prometheus-client registry;
/// [`render_frontend`](Self::render_frontend) writes them as a complete
/// exposition of their own. The `Routed` extractor (feature `axum`)
/// counts its overloads in the `Arc<RejectionMetrics>` it finds in the
/// request's extensions.
///
/// # Examples
///
/// ```
/// use loadgate::metrics::{Endpoint, Reason, RejectionMetrics};
///
/// let metrics = RejectionMetrics::default();
/// metrics.record("llama", Endpoint::ChatCompletions, [Reason::WorkerCapacity]);
/// assert_eq!(metrics.total("llama", Endpoint::ChatCompletions), 1);
/// assert_eq!(metrics.by_reason("llama", Reason::WorkerCapacity), 1);
/// ```
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
    /// Counts one rejected request with its reasons (a
    /// [`Class::Standard`] request).
    pub fn record(&self, model: &str, endpoint: Endpoint, reasons: impl IntoIterator<Item = Reason>) {
        self.record_class(model, endpoint, Class::Standard, reasons);
    }

    /// Counts one rejected request of `class` with its reasons.
    pub fn record_class(
        &self,
        model: &str,
        endpoint: Endpoint,
        class: Class,
        reasons: impl IntoIterator<Item = Reason>,
    ) {
        let rows = self.rows.load();
        match rows.get(model) {
            Some(row) => count(row, endpoint, class, reasons),
            None => {
                drop(rows);
                count(&self.add_row(model), endpoint, class, reasons);
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

    /// Drops the rows of every model `keep` refuses (e.g. the models the
    /// monitor has forgotten), so the counters of models that came and went
    /// do not pile up; returns how many rows were dropped. Their series end.
    /// Cold path: takes the write lock and copies the map once.
    ///
    /// # Examples
    ///
    /// ```
    /// use loadgate::metrics::{Endpoint, RejectionMetrics};
    ///
    /// let metrics = RejectionMetrics::default();
    /// metrics.record("gone", Endpoint::Completions, []);
    /// metrics.record("kept", Endpoint::Completions, []);
    /// assert_eq!(metrics.retain(|model| model == "kept"), 1);
    /// assert_eq!(metrics.total("gone", Endpoint::Completions), 0);
    /// assert_eq!(metrics.total("kept", Endpoint::Completions), 1);
    /// ```
    pub fn retain(&self, mut keep: impl FnMut(&str) -> bool) -> usize {
        let _write = lock(&self.write);
        let rows = self.rows.load_full();
        if rows.keys().all(|model| keep(model)) {
            return 0;
        }
        let mut next = (*rows).clone();
        next.retain(|model, _| keep(model));
        let dropped = rows.len() - next.len();
        self.rows.store(Arc::new(next));
        dropped
    }

    /// Rejections of `model` at `endpoint` so far.
    pub fn total(&self, model: &str, endpoint: Endpoint) -> u64 {
        // Relaxed: a counter read.
        self.rows.load().get(model).map_or(0, |r| r.by_endpoint[endpoint.index()].load(Ordering::Relaxed))
    }

    /// Rejections of `model` for `reason` so far (every class).
    pub fn by_reason(&self, model: &str, reason: Reason) -> u64 {
        Class::ALL.into_iter().map(|class| self.by_class_reason(model, class, reason)).sum()
    }

    /// Rejections of `model`'s `class` requests for `reason` so far.
    pub fn by_class_reason(&self, model: &str, class: Class, reason: Reason) -> u64 {
        // Relaxed: a counter read.
        self.rows
            .load()
            .get(model)
            .map_or(0, |r| r.by_class_reason[class.index()][reason.index()].load(Ordering::Relaxed))
    }

    /// Every model's counters now, sorted by model (a scrape's read).
    pub(super) fn counts(&self) -> Vec<ModelCounts> {
        let mut all: Vec<ModelCounts> = self
            .rows
            .load()
            .iter()
            .map(|(model, row)| ModelCounts {
                model: model.clone(),
                // Relaxed: counter reads; a scrape needs no ordering between them.
                by_endpoint: std::array::from_fn(|i| row.by_endpoint[i].load(Ordering::Relaxed)),
                by_reason: [0; Reason::ALL.len()],
                // Relaxed: as above.
                by_class_reason: std::array::from_fn(|c| {
                    std::array::from_fn(|r| row.by_class_reason[c][r].load(Ordering::Relaxed))
                }),
            })
            .map(|mut counts| {
                for class in &counts.by_class_reason {
                    for (sum, n) in counts.by_reason.iter_mut().zip(class) {
                        *sum += n;
                    }
                }
                counts
            })
            .collect();
        all.sort_by(|a, b| a.model.cmp(&b.model));
        all
    }
}

fn count(row: &ModelRow, endpoint: Endpoint, class: Class, reasons: impl IntoIterator<Item = Reason>) {
    // Relaxed: independent counters; scrapes need no ordering.
    row.by_endpoint[endpoint.index()].fetch_add(1, Ordering::Relaxed);
    let by_reason = &row.by_class_reason[class.index()];
    for reason in reasons {
        // Relaxed: as above.
        by_reason[reason.index()].fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn counts_are_sorted_by_model_and_indexed_like_the_labels() {
        let metrics = RejectionMetrics::default();
        metrics.record("b", Endpoint::ChatCompletions, [Reason::WaitingRequests]);
        metrics.record("a", Endpoint::Completions, []);
        let counts = metrics.counts();
        let models: Vec<&str> = counts.iter().map(|c| &*c.model).collect();
        assert_eq!(models, ["a", "b"]);
        assert_eq!(counts[1].by_endpoint[Endpoint::ChatCompletions.index()], 1);
        assert_eq!(counts[1].by_reason[Reason::WaitingRequests.index()], 1);
        assert_eq!(counts[0].by_reason, [0; Reason::ALL.len()]);
    }

    #[test]
    fn reasons_are_counted_per_class_and_summed() {
        let metrics = RejectionMetrics::default();
        metrics.record_class("m", Endpoint::Completions, Class::Sheddable, [Reason::ClassShed]);
        metrics.record_class("m", Endpoint::Completions, Class::Critical, [Reason::Deadline]);
        metrics.record("m", Endpoint::Completions, [Reason::Deadline]);
        assert_eq!(metrics.by_reason("m", Reason::Deadline), 2);
        assert_eq!(metrics.by_class_reason("m", Class::Critical, Reason::Deadline), 1);
        assert_eq!(metrics.by_class_reason("m", Class::Standard, Reason::Deadline), 1);
        assert_eq!(metrics.by_class_reason("m", Class::Sheddable, Reason::ClassShed), 1);
        let counts = &metrics.counts()[0];
        assert_eq!(counts.by_reason[Reason::Deadline.index()], 2);
        assert_eq!(counts.by_class_reason[Class::Sheddable.index()][Reason::ClassShed.index()], 1);
        assert_eq!(metrics.total("m", Endpoint::Completions), 3);
    }
}
