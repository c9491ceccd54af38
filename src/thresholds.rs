//! Busy thresholds: the four independently enabled signals, their validation
//! and the exact per-rank evaluation.

use std::fmt;

use crate::load::RankLoad;

/// One part per billion: fractional thresholds are stored with 9 decimal places.
pub const PPB: u64 = 1_000_000_000;

/// The largest accepted `active_prefill_tokens_threshold_frac`.
pub const MAX_PREFILL_FRAC: f64 = 1_000_000.0;

/// The busy thresholds of one model, as a person configures them.
///
/// Every field is `None` by default, and setting one enables only that signal.
/// With all four `None` no worker of the model is ever excluded. Build it
/// with `..Default::default()`: a signal added later defaults to `None`
/// (see [`RankLoad`]'s *Growing*).
///
/// # Examples
///
/// ```
/// use loadgate::{BusyThresholds, RankLoad};
///
/// let t = BusyThresholds { active_decode_blocks_threshold: Some(0.85), ..Default::default() }
///     .validate()
///     .unwrap();
/// let load = |blocks| RankLoad { active_decode_blocks: blocks, kv_total_blocks: 100, ..Default::default() };
/// assert!(!t.evaluate(&load(85)).any()); // exactly at the threshold: not busy
/// assert!(t.evaluate(&load(86)).decode);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BusyThresholds {
    /// Busy when `active_decode_blocks / kv_total_blocks` exceeds this, in `[0, 1]`.
    pub active_decode_blocks_threshold: Option<f64>,
    /// Busy when `active_prefill_tokens` exceeds this many tokens.
    pub active_prefill_tokens_threshold: Option<u64>,
    /// Busy when `active_prefill_tokens` exceeds this fraction of
    /// `max_num_batched_tokens`, in `[0, 1_000_000]`.
    pub active_prefill_tokens_threshold_frac: Option<f64>,
    /// Busy when `waiting_requests` (the engine's own queue) exceeds this.
    pub active_waiting_requests_threshold: Option<u64>,
}

impl BusyThresholds {
    /// Checks every configured value and returns the exact (fixed-point) form.
    ///
    /// # Errors
    ///
    /// [`ThresholdError`] names the first invalid field: a decode threshold that
    /// is not finite or outside `[0, 1]`, or a fraction that is not finite,
    /// negative or above [`MAX_PREFILL_FRAC`].
    pub fn validate(&self) -> Result<Thresholds, ThresholdError> {
        let decode_ppb = match self.active_decode_blocks_threshold {
            None => None,
            Some(v) if v.is_finite() && (0.0..=1.0).contains(&v) => Some(to_ppb(v)),
            Some(v) => return Err(ThresholdError::DecodeBlocks(v)),
        };
        let prefill_frac_ppb = match self.active_prefill_tokens_threshold_frac {
            None => None,
            Some(v) if v.is_finite() && (0.0..=MAX_PREFILL_FRAC).contains(&v) => Some(to_ppb(v)),
            Some(v) => return Err(ThresholdError::PrefillFrac(v)),
        };
        Ok(Thresholds {
            decode_ppb,
            prefill_tokens: self.active_prefill_tokens_threshold,
            prefill_frac_ppb,
            waiting_requests: self.active_waiting_requests_threshold,
        })
    }

    /// True when no signal is configured.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// Rounds a validated, finite, non-negative value to parts per billion, once:
/// the f64's exact value times 1e9, rounded half away from zero (as
/// `f64::round`), in integers. `(value * 1e9).round()` would round twice,
/// and the float product can land on a half that the exact value is below
/// (744073.7095513705 would give ...371 instead of ...370; the fuzzer found it).
pub(crate) fn to_ppb(value: f64) -> u64 {
    let bits = value.to_bits();
    let biased = ((bits >> 52) & 0x7ff) as i32;
    let fraction = bits & ((1 << 52) - 1);
    // value = mantissa * 2^-shift (subnormals have no implicit bit).
    let (mantissa, shift) = if biased == 0 { (fraction, 1074) } else { (fraction | 1 << 52, 1075 - biased) };
    // Below 2^83: fits in u128.
    let scaled = u128::from(mantissa) * u128::from(PPB);
    let ppb = match shift {
        // value >= 2^52: unreachable after validation; saturate.
        ..=0 => u128::from(u64::MAX),
        // value * 1e9 < 2^83 / 2^84 = 1/2: rounds to 0.
        84.. => 0,
        _ => {
            let whole = scaled >> shift;
            let rest = scaled & ((1 << shift) - 1);
            whole + u128::from(rest >= 1 << (shift - 1))
        }
    };
    u64::try_from(ppb).unwrap_or(u64::MAX)
}

/// An invalid threshold value; the message names the field and the range.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum ThresholdError {
    /// `active_decode_blocks_threshold` is not a finite number in `[0, 1]`.
    DecodeBlocks(f64),
    /// `active_prefill_tokens_threshold_frac` is not a finite number in `[0, 1e6]`.
    PrefillFrac(f64),
}

impl fmt::Display for ThresholdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::DecodeBlocks(v) => {
                write!(f, "active_decode_blocks_threshold must be a finite number between 0 and 1, got {v}")
            }
            Self::PrefillFrac(v) => write!(
                f,
                "active_prefill_tokens_threshold_frac must be a finite number between 0 and {MAX_PREFILL_FRAC}, got {v}"
            ),
        }
    }
}

impl std::error::Error for ThresholdError {}

/// Validated thresholds in exact fixed-point form; compares in integers only.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Thresholds {
    decode_ppb: Option<u64>,
    prefill_tokens: Option<u64>,
    prefill_frac_ppb: Option<u64>,
    waiting_requests: Option<u64>,
}

impl Thresholds {
    /// No signal configured: nothing is ever busy.
    pub const NONE: Thresholds =
        Thresholds { decode_ppb: None, prefill_tokens: None, prefill_frac_ppb: None, waiting_requests: None };

    /// Thresholds from their fixed-point parts (already validated).
    pub(crate) fn from_parts(
        decode_ppb: Option<u64>,
        prefill_tokens: Option<u64>,
        prefill_frac_ppb: Option<u64>,
        waiting_requests: Option<u64>,
    ) -> Thresholds {
        Thresholds { decode_ppb, prefill_tokens, prefill_frac_ppb, waiting_requests }
    }

    /// True when at least one signal is configured.
    #[inline]
    pub fn is_enabled(&self) -> bool {
        self.decode_ppb.is_some()
            || self.prefill_tokens.is_some()
            || self.prefill_frac_ppb.is_some()
            || self.waiting_requests.is_some()
    }

    /// The decode threshold in parts per billion, if set.
    pub fn decode_ppb(&self) -> Option<u64> {
        self.decode_ppb
    }

    /// The absolute prefill threshold in tokens, if set.
    pub fn prefill_tokens(&self) -> Option<u64> {
        self.prefill_tokens
    }

    /// The fractional prefill threshold in parts per billion, if set.
    pub fn prefill_frac_ppb(&self) -> Option<u64> {
        self.prefill_frac_ppb
    }

    /// The waiting-requests threshold, if set.
    pub fn waiting_requests(&self) -> Option<u64> {
        self.waiting_requests
    }

    /// The thresholds as a person reads them (the fixed-point values as `f64`).
    pub fn to_config(&self) -> BusyThresholds {
        BusyThresholds {
            active_decode_blocks_threshold: self.decode_ppb.map(|p| p as f64 / PPB as f64),
            active_prefill_tokens_threshold: self.prefill_tokens,
            active_prefill_tokens_threshold_frac: self.prefill_frac_ppb.map(|p| p as f64 / PPB as f64),
            active_waiting_requests_threshold: self.waiting_requests,
        }
    }

    /// Which configured signals fire for one rank's load. Comparisons are
    /// strict and exact: `active * 1e9 > ppb * total` in `u128`.
    #[inline]
    pub fn evaluate(&self, load: &RankLoad) -> BusySignals {
        let decode = match self.decode_ppb {
            // A rank that does not know its KV capacity says nothing here.
            Some(ppb) if load.kv_total_blocks != 0 => exceeds(load.active_decode_blocks, ppb, load.kv_total_blocks),
            _ => false,
        };
        let prefill = match self.prefill_tokens {
            Some(limit) => u64::from(load.active_prefill_tokens) > limit,
            None => false,
        };
        let prefill_frac = match self.prefill_frac_ppb {
            // Unknown `max_num_batched_tokens` (0) says nothing here.
            Some(ppb) if load.max_num_batched_tokens != 0 => {
                exceeds(load.active_prefill_tokens, ppb, load.max_num_batched_tokens)
            }
            _ => false,
        };
        let waiting = match self.waiting_requests {
            Some(limit) => u64::from(load.waiting_requests) > limit,
            None => false,
        };
        BusySignals { decode, prefill, prefill_frac, waiting }
    }
}

/// `active / total > ppb / 1e9`, exactly.
#[inline]
fn exceeds(active: u32, ppb: u64, total: u32) -> bool {
    u128::from(active) * u128::from(PPB) > u128::from(ppb) * u128::from(total)
}

/// Which busy signals fired for a rank (or, aggregated, for a worker).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BusySignals {
    /// `active_decode_blocks / kv_total_blocks` exceeded its threshold.
    pub decode: bool,
    /// `active_prefill_tokens` exceeded the absolute threshold.
    pub prefill: bool,
    /// `active_prefill_tokens` exceeded the fraction of `max_num_batched_tokens`.
    pub prefill_frac: bool,
    /// `waiting_requests` exceeded its threshold.
    pub waiting: bool,
}

impl BusySignals {
    /// True when any signal fired: the rank is busy.
    #[inline]
    pub fn any(&self) -> bool {
        self.decode || self.prefill || self.prefill_frac || self.waiting
    }

    /// The signals of both, or-ed.
    #[inline]
    pub fn union(self, other: BusySignals) -> BusySignals {
        BusySignals {
            decode: self.decode || other.decode,
            prefill: self.prefill || other.prefill,
            prefill_frac: self.prefill_frac || other.prefill_frac,
            waiting: self.waiting || other.waiting,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn to_ppb_recovers_every_written_decimal() {
        // Every value with up to six decimals in [0, 1] (the f64 nearest the
        // decimal, as a parser produces it) ...
        for k in 0..=1_000_000u64 {
            assert_eq!(to_ppb(k as f64 / 1e6), k * 1_000, "{k}e-6");
        }
        // ... a spread of nine-decimal ones, and up to MAX_PREFILL_FRAC.
        for k in (0..=PPB).step_by(9_973) {
            assert_eq!(to_ppb(k as f64 / 1e9), k, "{k}e-9");
        }
        for k in (0..=1_000_000 * PPB).step_by(99_999_999_977).chain([1_000_000 * PPB]) {
            assert_eq!(to_ppb(k as f64 / 1e9), k, "{k}e-9");
        }
    }

    #[test]
    fn to_ppb_rounds_the_exact_value_once() {
        // The f64 nearest 744073.7095513705 is just below ...370.5 ppb; the
        // float product rounds up to the half (found by fuzz/thresholds).
        assert_eq!(to_ppb(744073.7095513705), 744_073_709_551_370);
        assert_eq!(to_ppb(1.0005e-6), 1_000); // just below 1000.5
        assert_eq!(to_ppb(1.0 / 1024.0), 976_563); // exactly 976562.5: away from zero
        assert_eq!(to_ppb(f64::from_bits(1)), 0); // the smallest subnormal
        assert_eq!(to_ppb(-0.0), 0);
    }

    #[test]
    fn exceeds_matches_an_independent_hundredths_reference() {
        // Threshold h/100: a/t > h/100 exactly when 100a > ht.
        for h in 0..=100u64 {
            let ppb = to_ppb(h as f64 / 100.0);
            for t in 1..=100u32 {
                for a in 0..=110u32 {
                    assert_eq!(exceeds(a, ppb, t), 100 * u64::from(a) > h * u64::from(t), "{a}/{t} vs {h}%");
                }
            }
        }
    }

    #[test]
    fn exceeds_does_not_overflow_at_the_extremes() {
        let max_ppb = to_ppb(MAX_PREFILL_FRAC);
        assert!(!exceeds(u32::MAX, max_ppb, u32::MAX));
        assert!(exceeds(u32::MAX, 0, u32::MAX));
        assert!(!exceeds(u32::MAX, PPB, u32::MAX));
        assert!(exceeds(u32::MAX, PPB - 1, u32::MAX));
    }

    #[test]
    fn enabled_and_config_round_trip() {
        assert!(!Thresholds::NONE.is_enabled());
        assert_eq!(Thresholds::NONE.to_config(), BusyThresholds::default());
        let only_prefill = BusyThresholds { active_prefill_tokens_threshold: Some(0), ..Default::default() };
        assert!(only_prefill.validate().unwrap().is_enabled());
        assert!(!only_prefill.is_empty());
        let only_waiting = BusyThresholds { active_waiting_requests_threshold: Some(3), ..Default::default() };
        let t = only_waiting.validate().unwrap();
        assert!(t.is_enabled());
        assert_eq!(t.to_config(), only_waiting);
    }

    /// Found by mutation testing: `union` (a multi-rank worker's reasons:
    /// every signal that fired on its ranks) could `and` its prefill_frac
    /// field unnoticed: a worker busy on one rank's fractional prefill and
    /// another rank's decode was not reported busy on prefill_frac. Every
    /// pair of signal sets, against the field-wise or.
    #[test]
    fn union_ors_every_signal_of_every_pair() {
        let signals = |bits: u8| BusySignals {
            decode: bits & 1 != 0,
            prefill: bits & 2 != 0,
            prefill_frac: bits & 4 != 0,
            waiting: bits & 8 != 0,
        };
        for a in 0..16u8 {
            for b in 0..16u8 {
                assert_eq!(signals(a).union(signals(b)), signals(a | b), "{a:04b} | {b:04b}");
                assert_eq!(signals(a).union(signals(b)).any(), a | b != 0, "{a:04b} | {b:04b}");
            }
        }
    }

    #[test]
    fn waiting_requests_compare_strictly() {
        let t = BusyThresholds { active_waiting_requests_threshold: Some(2), ..Default::default() }.validate().unwrap();
        let waiting = |n| RankLoad { waiting_requests: n, ..Default::default() };
        assert!(!t.evaluate(&waiting(2)).any(), "at the threshold: not busy");
        assert_eq!(t.evaluate(&waiting(3)), BusySignals { waiting: true, ..Default::default() });
        let zero =
            BusyThresholds { active_waiting_requests_threshold: Some(0), ..Default::default() }.validate().unwrap();
        assert!(!zero.evaluate(&waiting(0)).any(), "no queue (0) is never busy");
        assert!(zero.evaluate(&waiting(1)).waiting);
        assert!(zero.evaluate(&RankLoad { waiting_requests: u32::MAX, ..Default::default() }).waiting);
    }
}
