//! Why an engine's document gave no load.

use std::fmt;

/// An engine document that could not be mapped to load.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum EngineError {
    /// The body is over the limit ([`MAX_DOCUMENT_BYTES`](super::MAX_DOCUMENT_BYTES)).
    TooLarge {
        /// The body's length.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// A line of a load metric's family is not valid Prometheus text (or
    /// its rank label is not a number); the message says which.
    Exposition(String),
    /// None of the kind's load metrics is in the document: the wrong engine
    /// kind, or not its `/metrics`.
    NoLoadMetrics,
    /// A load metric is negative, NaN or infinite.
    InvalidValue {
        /// The metric's name.
        metric: &'static str,
        /// Its value.
        value: f64,
    },
    /// More data-parallel ranks than [`MAX_RANKS`](super::MAX_RANKS).
    TooManyRanks {
        /// The limit.
        limit: usize,
    },
    /// llama.cpp's `/slots` body is not an array of slots with `n_ctx` and
    /// `is_processing`.
    Slots(String),
    /// llama.cpp needs its `/slots` body too, and none was given.
    MissingSlots,
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EngineError::TooLarge { bytes, limit } => {
                write!(f, "engine document of {bytes} bytes is over the {limit}-byte limit")
            }
            EngineError::Exposition(message) => write!(f, "invalid Prometheus text: {message}"),
            EngineError::NoLoadMetrics => {
                f.write_str("no load metric of this engine kind in the document (wrong engine kind or endpoint?)")
            }
            EngineError::InvalidValue { metric, value } => {
                write!(f, "{metric} is {value}: a load must be a finite, non-negative number")
            }
            EngineError::TooManyRanks { limit } => write!(f, "more than {limit} data-parallel ranks"),
            EngineError::Slots(message) => write!(f, "invalid llama.cpp /slots document: {message}"),
            EngineError::MissingSlots => f.write_str("llama.cpp load needs its /slots document as well as /metrics"),
        }
    }
}

impl std::error::Error for EngineError {}
