//! `BusyThresholds::validate` and `Thresholds::evaluate` (all four signals)
//! against a reference that rounds each f64 to parts per billion from its
//! exact decimal expansion and compares in u128.
#![no_main]

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use loadgate::{
    thresholds::{ThresholdError, MAX_PREFILL_FRAC},
    BusyThresholds, RankLoad,
};

/// Ways to make an f64: any bit pattern (NaN, infinities, negatives, huge),
/// and the values people write or that sit on a rounding boundary.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Real {
    Bits(u64),
    /// A fraction of the unit interval.
    Unit(u32),
    /// The f64 nearest `n` billionths, parsed from its decimal string.
    Decimal(u64),
    /// `a / b`, like 1/3.
    Ratio(u32, u32),
    /// Within a few ulps of `k + 1/2` billionths: a rounding boundary.
    NearTie(u64, i8),
}

impl Real {
    fn value(self) -> f64 {
        match self {
            Real::Bits(bits) => f64::from_bits(bits),
            Real::Unit(u) => f64::from(u) / f64::from(u32::MAX),
            Real::Decimal(n) => format!("{}.{:09}", n / 1_000_000_000, n % 1_000_000_000).parse().unwrap(),
            Real::Ratio(a, b) => f64::from(a) / f64::from(b),
            Real::NearTie(k, ulps) => {
                let tie = (k % 2_000_000_000_000_000) as f64 / 1e9 + 0.5e-9;
                f64::from_bits(tie.to_bits().wrapping_add_signed(i64::from(ulps)))
            }
        }
    }
}

/// A numerator: any value, or one within a few units of the threshold
/// boundary `ppb * total / 1e9`.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Numerator {
    Raw(u32),
    Near(i8),
}

#[derive(Arbitrary, Debug)]
struct Load {
    decode_active: Numerator,
    kv_total_blocks: u32,
    prefill_active: Numerator,
    max_num_batched_tokens: u32,
    waiting: Numerator,
}

#[derive(Arbitrary, Debug)]
struct Input {
    decode: Option<Real>,
    prefill: Option<u64>,
    frac: Option<Real>,
    waiting: Option<u64>,
    loads: [Load; 3],
}

/// `value * 1e9` rounded half away from zero (as `f64::round` does), from
/// the exact decimal expansion of the f64: every finite f64 has one, and
/// Rust prints it digit for digit.
fn reference_ppb(value: f64) -> u64 {
    assert!(value.is_finite() && value >= 0.0);
    let text = format!("{:.1100}", value.abs()); // -0.0 is valid and is 0
    let (int, frac) = text.split_once('.').unwrap();
    let int: u64 = int.parse().unwrap();
    let billionths: u64 = frac[..9].parse().unwrap();
    let round_up = frac.as_bytes()[9] >= b'5'; // .5 and above: away from zero
    int * 1_000_000_000 + billionths + u64::from(round_up)
}

/// `active / total > ppb / 1e9` in exact integers.
fn exceeds(active: u32, ppb: u64, total: u32) -> bool {
    u128::from(active) * 1_000_000_000 > u128::from(ppb) * u128::from(total)
}

/// The numerator just around the boundary of `ppb` over `total`.
fn numerator(n: Numerator, ppb: Option<u64>, total: u32) -> u32 {
    match n {
        Numerator::Raw(v) => v,
        Numerator::Near(delta) => {
            let boundary = u128::from(ppb.unwrap_or(500_000_000)) * u128::from(total) / 1_000_000_000;
            (boundary as i128 + i128::from(delta)).clamp(0, i128::from(u32::MAX)) as u32
        }
    }
}

fuzz_target!(|input: Input| {
    let decode = input.decode.map(Real::value);
    let frac = input.frac.map(Real::value);
    let config = BusyThresholds {
        active_decode_blocks_threshold: decode,
        active_prefill_tokens_threshold: input.prefill,
        active_prefill_tokens_threshold_frac: frac,
        active_waiting_requests_threshold: input.waiting,
    };

    // Validation: exactly the out-of-range and non-finite values fail, the
    // decode threshold first.
    let decode_ok = decode.is_none_or(|v| v.is_finite() && v >= 0.0 && v <= 1.0);
    let frac_ok = frac.is_none_or(|v| v.is_finite() && v >= 0.0 && v <= MAX_PREFILL_FRAC);
    let thresholds = match config.validate() {
        Ok(t) => {
            assert!(decode_ok && frac_ok, "accepted {config:?}");
            t
        }
        Err(ThresholdError::DecodeBlocks(v)) => {
            assert!(!decode_ok && v.to_bits() == decode.unwrap().to_bits(), "{config:?}");
            return;
        }
        Err(ThresholdError::PrefillFrac(v)) => {
            assert!(decode_ok && !frac_ok && v.to_bits() == frac.unwrap().to_bits(), "{config:?}");
            return;
        }
        Err(other) => panic!("an error the reference does not know: {other:?}"),
    };

    let decode_ppb = decode.map(reference_ppb);
    let frac_ppb = frac.map(reference_ppb);
    assert_eq!(thresholds.decode_ppb(), decode_ppb, "decode {:?}", decode);
    assert_eq!(thresholds.prefill_tokens(), input.prefill);
    assert_eq!(thresholds.prefill_frac_ppb(), frac_ppb, "frac {:?}", frac);
    assert_eq!(thresholds.waiting_requests(), input.waiting);
    assert_eq!(thresholds.is_enabled(), !config.is_empty());
    // What GET /busy_threshold shows validates back to the same thresholds.
    assert_eq!(thresholds.to_config().validate(), Ok(thresholds));

    for load in &input.loads {
        let load = RankLoad {
            active_decode_blocks: numerator(load.decode_active, decode_ppb, load.kv_total_blocks),
            kv_total_blocks: load.kv_total_blocks,
            active_prefill_tokens: numerator(load.prefill_active, frac_ppb, load.max_num_batched_tokens),
            max_num_batched_tokens: load.max_num_batched_tokens,
            waiting_requests: match load.waiting {
                Numerator::Raw(v) => v,
                // Around the threshold itself (an absolute count).
                Numerator::Near(delta) => {
                    (i128::from(input.waiting.unwrap_or(3)) + i128::from(delta)).clamp(0, i128::from(u32::MAX)) as u32
                }
            },
        };
        let signals = thresholds.evaluate(&load);
        let expect_decode = decode_ppb
            .is_some_and(|p| load.kv_total_blocks != 0 && exceeds(load.active_decode_blocks, p, load.kv_total_blocks));
        let expect_prefill = input.prefill.is_some_and(|limit| u64::from(load.active_prefill_tokens) > limit);
        let expect_frac = frac_ppb.is_some_and(|p| {
            load.max_num_batched_tokens != 0 && exceeds(load.active_prefill_tokens, p, load.max_num_batched_tokens)
        });
        let expect_waiting = input.waiting.is_some_and(|limit| u64::from(load.waiting_requests) > limit);
        assert_eq!(
            (signals.decode, signals.prefill, signals.prefill_frac, signals.waiting),
            (expect_decode, expect_prefill, expect_frac, expect_waiting),
            "{thresholds:?} on {load:?}"
        );
        assert_eq!(signals.any(), expect_decode || expect_prefill || expect_frac || expect_waiting);
    }
});
