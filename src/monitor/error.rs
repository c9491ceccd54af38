//! What can go wrong when registering, reporting or changing thresholds.

use std::fmt;

use crate::load::{Publisher, WorkerId};
use crate::thresholds::ThresholdError;

/// A report or tracking update that could not be applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ApplyError {
    /// No worker with this id is registered.
    UnknownWorker(WorkerId),
    /// The rank is not below the worker's declared data-parallel size.
    RankOutOfRange {
        /// The worker.
        worker: WorkerId,
        /// The rank in the report.
        rank: u32,
        /// The worker's declared data-parallel size.
        dp_size: u32,
    },
    /// A frontend index not below [`SharedLoad::frontends`](crate::monitor::SharedLoad::frontends).
    UnknownPublisher(Publisher),
}

impl fmt::Display for ApplyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownWorker(w) => write!(f, "worker {w} is not registered"),
            Self::RankOutOfRange { worker, rank, dp_size } => {
                write!(f, "rank {rank} is out of range for worker {worker} with dp size {dp_size}")
            }
            Self::UnknownPublisher(p) => write!(f, "no slot for publisher {p:?} (more frontends than kept)"),
        }
    }
}

impl std::error::Error for ApplyError {}

/// A registration that could not be made.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RegisterError {
    /// The data-parallel size must be at least 1 (and at most 65536).
    InvalidDpSize(u32),
    /// The model name is empty.
    EmptyModel,
    /// The id is already registered, in the same incarnation, with a
    /// different model or dp size.
    Conflict(WorkerId),
}

impl fmt::Display for RegisterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidDpSize(n) => write!(f, "data-parallel size must be between 1 and 65536, got {n}"),
            Self::EmptyModel => f.write_str("model name must not be empty"),
            Self::Conflict(w) => {
                write!(f, "worker {w} is already registered in this incarnation with another model or dp size")
            }
        }
    }
}

impl std::error::Error for RegisterError {}

/// A threshold change that could not be made.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum SetThresholdsError {
    /// No such model has been seen.
    UnknownModel(String),
    /// A value is invalid.
    Invalid(ThresholdError),
}

impl fmt::Display for SetThresholdsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownModel(m) => write!(f, "unknown model {m:?}"),
            Self::Invalid(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for SetThresholdsError {
    /// `Invalid` displays its [`ThresholdError`] itself, so the chain goes
    /// on from that error's own source: an error chain prints the message
    /// once.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::UnknownModel(_) => None,
            Self::Invalid(e) => e.source(),
        }
    }
}

impl From<ThresholdError> for SetThresholdsError {
    fn from(e: ThresholdError) -> Self {
        Self::Invalid(e)
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use crate::{BusyThresholds, MonitorConfig, WorkerMonitor};

    /// Every message of an error's chain, as a report prints them.
    fn chain(error: &(dyn std::error::Error + 'static)) -> Vec<String> {
        let mut messages = vec![error.to_string()];
        let mut next = error.source();
        while let Some(e) = next {
            messages.push(e.to_string());
            next = e.source();
        }
        messages
    }

    #[test]
    fn an_invalid_threshold_is_said_once_in_an_error_chain() {
        let monitor = WorkerMonitor::new(MonitorConfig::default()).unwrap();
        monitor.add_model("m");
        let invalid = BusyThresholds { active_decode_blocks_threshold: Some(1.5), ..Default::default() };
        let error = monitor.set_thresholds("m", invalid).unwrap_err();
        let messages = chain(&error);
        assert_eq!(messages.len(), 1, "{messages:?}");
        assert!(messages[0].contains("active_decode_blocks_threshold"), "{messages:?}");
        assert!(error.source().is_none());
    }
}
