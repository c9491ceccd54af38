//! Upper bounds of the duration flags.

/// The longest timeout or period a flag takes, in seconds: one day. A
/// deadline is computed as `now + timeout`, which overflows the clock (a
/// panic) for values near `u64::MAX` seconds; a day is already no timeout
/// at all for one HTTP request.
pub const MAX_SECS: u64 = 86_400;

/// [`MAX_SECS`] in milliseconds.
pub const MAX_MS: u64 = MAX_SECS * 1_000;
