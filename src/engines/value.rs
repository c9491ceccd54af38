//! From a metric's f64 to the integers of a [`RankLoad`](crate::RankLoad).

use super::{EngineError, FRACTION_BLOCKS};
use crate::thresholds::to_ppb;

/// `value` when it is a valid load: finite and not below zero.
pub(super) fn checked(metric: &'static str, value: f64) -> Result<f64, EngineError> {
    if value.is_finite() && value >= 0.0 {
        Ok(value)
    } else {
        Err(EngineError::InvalidValue { metric, value })
    }
}

/// A valid count rounded to the nearest integer (half away from zero),
/// saturating at `u32::MAX`.
pub(super) fn count(value: f64) -> u32 {
    // `as` saturates for floats; `round` is exact.
    value.round() as u32
}

/// A valid fraction clamped to `[0, 1]`.
pub(super) fn fraction(value: f64) -> f64 {
    value.min(1.0)
}

/// `(active, total)` blocks for a fraction in `[0, 1]`: `round(fraction * total)`
/// of `total` when the engine says how many blocks it has, else the fraction
/// in parts per billion of [`FRACTION_BLOCKS`].
pub(super) fn blocks(fraction: f64, total: Option<u32>) -> (u32, u32) {
    match total {
        Some(total) => (scaled(fraction, total), total),
        // At most 1e9 for a fraction in [0, 1].
        None => (to_ppb(fraction) as u32, FRACTION_BLOCKS),
    }
}

/// `fraction * total` rounded half away from zero from the f64's exact value
/// (no float product that could round first). `fraction` is in `[0, 1]`.
fn scaled(fraction: f64, total: u32) -> u32 {
    let bits = fraction.to_bits();
    let biased = ((bits >> 52) & 0x7ff) as u32;
    let mantissa = bits & ((1 << 52) - 1);
    // fraction = mantissa * 2^-shift (subnormals have no implicit bit);
    // shift >= 52 for a fraction <= 1.
    let (mantissa, shift) = if biased == 0 { (mantissa, 1074) } else { (mantissa | 1 << 52, 1075 - biased) };
    // Below 2^85.
    let product = u128::from(mantissa) * u128::from(total);
    if shift >= 86 {
        return 0; // product * 2^-shift < 1/2
    }
    let whole = product >> shift;
    let rest = product & ((1 << shift) - 1);
    let rounded = whole + u128::from(rest >= 1 << (shift - 1));
    // <= total, since fraction <= 1.
    u32::try_from(rounded).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checked_refuses_exactly_negative_nan_and_infinite() {
        for bad in [-1.0, -1e-300, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            assert!(matches!(checked("m", bad), Err(EngineError::InvalidValue { metric: "m", .. })), "{bad}");
        }
        for good in [0.0, -0.0, 1e-300, 0.5, 7.0, 1e300] {
            assert_eq!(checked("m", good).map(f64::to_bits), Ok(good.to_bits()));
        }
    }

    #[test]
    fn count_rounds_half_away_and_saturates() {
        assert_eq!(count(2.0), 2);
        assert_eq!(count(2.5), 3);
        assert_eq!(count(2.4999999999999996), 2);
        assert_eq!(count(0.49999999999999994), 0);
        assert_eq!(count(4294967294.5), u32::MAX);
        assert_eq!(count(1e300), u32::MAX);
    }

    #[test]
    fn blocks_scale_the_exact_fraction() {
        assert_eq!(blocks(0.0, Some(100)), (0, 100));
        assert_eq!(blocks(1.0, Some(27891)), (27891, 27891));
        assert_eq!(blocks(0.5, Some(3)), (2, 3), "1.5 rounds half away from zero");
        assert_eq!(blocks(0.6425, Some(27891)), (17920, 27891)); // 17919.9675
        assert_eq!(blocks(1.0, Some(u32::MAX)), (u32::MAX, u32::MAX));
        assert_eq!(blocks(f64::from_bits(1), Some(u32::MAX)), (0, u32::MAX));
        // 0.1 is slightly above 1/10: 0.1 * 5 is exactly above 0.5.
        assert_eq!(blocks(0.1, Some(5)), (1, 5));
        assert_eq!(blocks(0.28, None), (280_000_000, FRACTION_BLOCKS));
        assert_eq!(blocks(1.0, None), (FRACTION_BLOCKS, FRACTION_BLOCKS));
    }
}
