//! Why a gate was not added to an [`AdmissionMetrics`](super::AdmissionMetrics).

use std::fmt;

/// Why [`AdmissionMetrics::add`](super::AdmissionMetrics::add) refused a gate
/// (the gate's source is dropped; nothing changed).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AddGateError {
    /// A gate with this `worker_id` is already there: the two would write the
    /// same series, which Prometheus refuses.
    DuplicateWorkerId(String),
    /// The `worker_id` is empty: Prometheus reads an empty label as no label.
    EmptyWorkerId,
}

impl fmt::Display for AddGateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AddGateError::DuplicateWorkerId(id) => write!(f, "a gate with worker_id {id:?} is already registered"),
            AddGateError::EmptyWorkerId => f.write_str("a gate's worker_id must not be empty"),
        }
    }
}

impl std::error::Error for AddGateError {}
