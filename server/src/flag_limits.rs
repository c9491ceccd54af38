//! Upper bounds of the duration flags.
//!
//! At the crate root because every command's flags use it (frontend,
//! worker, bench, demo, the shared HTTP and scrape flags).

use std::time::Duration;

/// The longest timeout or period a flag takes, in seconds: one day. A
/// deadline is computed as `now + timeout`, which overflows the clock (a
/// panic) for values near `u64::MAX` seconds; a day is already no timeout
/// at all for one HTTP request.
pub const MAX_SECS: u64 = 86_400;

/// [`MAX_SECS`] in milliseconds.
pub const MAX_MS: u64 = MAX_SECS * 1_000;

/// The parser of a flag of whole seconds, from `min` to [`MAX_SECS`].
pub fn secs(min: u64) -> clap::builder::RangedU64ValueParser {
    clap::value_parser!(u64).range(min..=MAX_SECS)
}

/// The parser of a flag of whole milliseconds, from `min` to [`MAX_MS`].
pub fn ms(min: u64) -> clap::builder::RangedU64ValueParser {
    clap::value_parser!(u64).range(min..=MAX_MS)
}

/// `value` seconds of the flag `flag`, at most [`MAX_SECS`],
/// positive (or, `zero_ok`, also 0).
///
/// # Errors
///
/// Not a number, negative, 0 when that is not allowed, or too long.
pub(crate) fn seconds(value: f64, flag: &str, zero_ok: bool) -> anyhow::Result<Duration> {
    let max = MAX_SECS as f64;
    let least = if zero_ok { "at least 0" } else { "more than 0" };
    anyhow::ensure!(
        value.is_finite() && (value > 0.0 || zero_ok && value == 0.0) && value <= max,
        "{flag} must be {least} and at most {max} seconds, not {value}"
    );
    Ok(Duration::from_secs_f64(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_bounded_and_positive() {
        assert_eq!(seconds(1.5, "--d", false).unwrap(), Duration::from_millis(1500));
        assert_eq!(seconds(0.0, "--d", true).unwrap(), Duration::ZERO);
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e300, 86_400.5] {
            let error = seconds(bad, "--d", false).unwrap_err().to_string();
            assert!(error.contains("--d must be more than 0 and at most 86400 seconds"), "{bad}: {error}");
        }
    }
}
