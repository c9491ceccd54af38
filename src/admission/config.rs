//! The limits `N` and `Q`: validation, and `Q` from the environment.

use std::fmt;

/// The environment variable that sets the overflow queue size `Q`.
pub const QUEUE_LIMIT_ENV: &str = "DYN_DYNAMO_REQUEST_QUEUE_LIMIT";

/// `Q` when the environment does not set it.
pub const DEFAULT_QUEUE_LIMIT: usize = 16;

/// The largest accepted `Q`.
pub const MAX_QUEUE_LIMIT: usize = 1 << 20;

/// An invalid admission configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AdmissionError {
    /// The engine request limit `N` must be at least 1.
    ZeroLimit,
    /// The queue limit `Q` must be at least 2 (the reference's rule).
    QueueLimitTooSmall(usize),
    /// A limit above `u32::MAX`.
    TooLarge(usize),
    /// The queue limit `Q` is above [`MAX_QUEUE_LIMIT`] (the overflow is
    /// allocated up front, so a typo must not exhaust memory).
    QueueLimitTooLarge(usize),
    /// `DYN_DYNAMO_REQUEST_QUEUE_LIMIT` is not a whole number.
    InvalidQueueLimit(String),
}

impl fmt::Display for AdmissionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ZeroLimit => f.write_str("engine request limit must be at least 1"),
            Self::QueueLimitTooSmall(q) => write!(f, "{QUEUE_LIMIT_ENV} must be at least 2, got {q}"),
            Self::TooLarge(v) => write!(f, "limit {v} is larger than {}", u32::MAX),
            Self::QueueLimitTooLarge(q) => write!(f, "{QUEUE_LIMIT_ENV} must be at most {MAX_QUEUE_LIMIT}, got {q}"),
            Self::InvalidQueueLimit(v) => write!(f, "{QUEUE_LIMIT_ENV} must be a whole number >= 2, got {v:?}"),
        }
    }
}

impl std::error::Error for AdmissionError {}

/// Parses `DYN_DYNAMO_REQUEST_QUEUE_LIMIT`: unset gives 16; anything but a
/// whole number of at least 2 is an error.
///
/// # Errors
///
/// [`AdmissionError::InvalidQueueLimit`], [`AdmissionError::QueueLimitTooSmall`]
/// or [`AdmissionError::QueueLimitTooLarge`].
pub fn parse_queue_limit(value: Option<&str>) -> Result<usize, AdmissionError> {
    let Some(raw) = value else {
        return Ok(DEFAULT_QUEUE_LIMIT);
    };
    let q: usize = raw.trim().parse().map_err(|_| AdmissionError::InvalidQueueLimit(raw.to_owned()))?;
    validate_queue_limit(q)
}

/// `Q` from `DYN_DYNAMO_REQUEST_QUEUE_LIMIT` (16 when unset).
///
/// # Errors
///
/// As [`parse_queue_limit`]; a value that is not Unicode is
/// [`AdmissionError::InvalidQueueLimit`] too, not unset.
pub fn queue_limit_from_env() -> Result<usize, AdmissionError> {
    parse_queue_limit_os(std::env::var_os(QUEUE_LIMIT_ENV).as_deref())
}

/// [`parse_queue_limit`] of an environment value as the OS gives it.
fn parse_queue_limit_os(value: Option<&std::ffi::OsStr>) -> Result<usize, AdmissionError> {
    match value.map(|v| v.to_str().ok_or(v)) {
        None => parse_queue_limit(None),
        Some(Ok(text)) => parse_queue_limit(Some(text)),
        Some(Err(raw)) => Err(AdmissionError::InvalidQueueLimit(raw.to_string_lossy().into_owned())),
    }
}

fn validate_queue_limit(q: usize) -> Result<usize, AdmissionError> {
    if q < 2 {
        return Err(AdmissionError::QueueLimitTooSmall(q));
    }
    if q > MAX_QUEUE_LIMIT {
        return Err(AdmissionError::QueueLimitTooLarge(q));
    }
    Ok(q)
}

/// `(N, Q)` as the gate stores them.
pub(super) fn validate(limit: usize, queue_limit: usize) -> Result<(u32, u32), AdmissionError> {
    if limit == 0 {
        return Err(AdmissionError::ZeroLimit);
    }
    let queue_limit = validate_queue_limit(queue_limit)?;
    let limit = u32::try_from(limit).map_err(|_| AdmissionError::TooLarge(limit))?;
    // MAX_QUEUE_LIMIT fits in a u32.
    Ok((limit, queue_limit as u32))
}

#[cfg(all(test, unix))]
mod tests {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;

    use super::*;

    /// Found by a review: a value that is not Unicode was read as unset (16).
    #[test]
    fn an_environment_value_that_is_not_unicode_is_an_error_not_the_default() {
        let raw = OsStr::from_bytes(b"1\xff6");
        assert_eq!(parse_queue_limit_os(Some(raw)), Err(AdmissionError::InvalidQueueLimit("1\u{fffd}6".to_owned())));
        assert_eq!(parse_queue_limit_os(None), Ok(DEFAULT_QUEUE_LIMIT));
        assert_eq!(parse_queue_limit_os(Some(OsStr::new(" 32 "))), Ok(32));
    }
}
