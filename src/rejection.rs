//! Rejection classes, their HTTP status, and the overload status code from
//! `DYN_HTTP_OVERLOAD_STATUS_CODE`.

use std::fmt;
use std::sync::OnceLock;

use crate::route::RouteError;

/// The message a worker sends when its engine slots and queue are full.
pub const WORKER_AT_CAPACITY: &str = "Server overloaded: worker at capacity";

/// The response header a worker sets on a hard-cap refusal, with the value
/// [`REFUSAL_AT_CAPACITY`]. A router recognises a migratable refusal by
/// this header alone, whatever the status (an operator may set the
/// overload status to anything, even 200) and whatever the body says, and
/// strips it before the client.
pub const REFUSAL_HEADER: &str = "x-loadgate-refusal";

/// The [`REFUSAL_HEADER`] value of a worker at its hard cap.
pub const REFUSAL_AT_CAPACITY: &str = "worker-at-capacity";

/// The environment variable that overrides the overload status code.
pub const OVERLOAD_STATUS_ENV: &str = "DYN_HTTP_OVERLOAD_STATUS_CODE";

/// The default overload status: 529 ("site is overloaded").
pub const DEFAULT_OVERLOAD_STATUS: u16 = 529;

/// Why a request was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Rejection {
    /// Every eligible worker of the model is busy (pool-wide). Not migratable.
    Overloaded,
    /// One worker refused at its hard cap. Migratable: another worker may
    /// have room.
    WorkerOverloaded,
    /// No worker is registered for the model. Not migratable.
    Unavailable,
}

impl Rejection {
    /// Whether retrying the same request on another worker can help.
    #[inline]
    pub fn retry_elsewhere(&self) -> bool {
        matches!(self, Rejection::WorkerOverloaded)
    }

    /// The HTTP status: the cached overload status for either overload, 503
    /// for unavailable.
    pub fn status(&self) -> u16 {
        match self {
            Rejection::Overloaded | Rejection::WorkerOverloaded => overload_status_code(),
            Rejection::Unavailable => 503,
        }
    }

    /// The `type` field of the JSON error body.
    pub fn error_type(&self) -> &'static str {
        match self {
            Rejection::Overloaded | Rejection::WorkerOverloaded => "Overloaded",
            Rejection::Unavailable => "Unavailable",
        }
    }

    /// The human-readable message of the JSON error body.
    pub fn message(&self) -> &'static str {
        match self {
            Rejection::Overloaded => "All workers are busy, please retry later",
            Rejection::WorkerOverloaded => WORKER_AT_CAPACITY,
            Rejection::Unavailable => "No worker is available for this model",
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for Rejection {}

impl TryFrom<RouteError> for Rejection {
    type Error = RouteError;

    /// Overloaded and unavailable map over; an unknown model is not a
    /// rejection (it is a 404) and comes back as the error.
    fn try_from(e: RouteError) -> Result<Self, RouteError> {
        match e {
            RouteError::Overloaded => Ok(Rejection::Overloaded),
            RouteError::Unavailable => Ok(Rejection::Unavailable),
            RouteError::UnknownModel => Err(e),
        }
    }
}

/// Parses an overload status override: values 200 through 999 are used;
/// unset, empty, non-numeric, informational (100–199) and out-of-range values
/// give 529. Surrounding whitespace is ignored.
///
/// # Examples
///
/// ```
/// use loadgate::rejection::parse_overload_status;
///
/// assert_eq!(parse_overload_status(None), 529);
/// assert_eq!(parse_overload_status(Some("503")), 503);
/// assert_eq!(parse_overload_status(Some("199")), 529);
/// assert_eq!(parse_overload_status(Some("abc")), 529);
/// ```
pub fn parse_overload_status(value: Option<&str>) -> u16 {
    let parsed = value.map(str::trim).filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()));
    match parsed.and_then(|v| v.parse::<u16>().ok()) {
        Some(code @ 200..=999) => code,
        _ => DEFAULT_OVERLOAD_STATUS,
    }
}

/// The overload status code: `DYN_HTTP_OVERLOAD_STATUS_CODE` parsed by
/// [`parse_overload_status`], read on first use and cached for the process.
pub fn overload_status_code() -> u16 {
    static CODE: OnceLock<u16> = OnceLock::new();
    *CODE.get_or_init(|| parse_overload_status(std::env::var(OVERLOAD_STATUS_ENV).ok().as_deref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_number_follows_the_rule() {
        for n in 0..=70_000u32 {
            let expected = if (200..=999).contains(&n) { n as u16 } else { DEFAULT_OVERLOAD_STATUS };
            assert_eq!(parse_overload_status(Some(&n.to_string())), expected, "{n}");
            assert_eq!(parse_overload_status(Some(&format!("0{n}"))), expected, "0{n}");
        }
    }

    #[test]
    fn non_numbers_fall_back() {
        for v in ["", " ", "5 03", "503a", "0x1f7", "５０３", "-0", "+200", "2e2"] {
            assert_eq!(parse_overload_status(Some(v)), DEFAULT_OVERLOAD_STATUS, "{v:?}");
        }
    }
}
