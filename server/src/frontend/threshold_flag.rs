//! The busy-threshold flags: a number, or `None`/`none` for off (Dynamo's
//! spelling of an unset threshold), checked where the flag is parsed so
//! that an error names the flag.

use std::ffi::OsStr;
use std::fmt;

use clap::builder::TypedValueParser;
use loadgate::thresholds::MAX_PREFILL_FRAC;

use crate::flag_limits::flag_error;

/// A threshold flag's value: `None` is off.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Threshold<T>(pub Option<T>);

impl<T: fmt::Display> fmt::Display for Threshold<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(v) => v.fmt(f),
            None => f.write_str("none"),
        }
    }
}

/// What a threshold flag takes.
#[derive(Debug, Clone, Copy)]
pub enum Range {
    /// A share of the KV blocks: a finite number in `[0, 1]`.
    Share,
    /// A fraction of `max_num_batched_tokens`: finite, in `[0, MAX_PREFILL_FRAC]`.
    Fraction,
}

/// Parses a fractional threshold flag (`f64`), or `None`.
#[derive(Debug, Clone, Copy)]
pub struct Fractional(pub Range);

/// Parses a whole-number threshold flag (`u64`), or `None`.
#[derive(Debug, Clone, Copy)]
pub struct Whole;

/// `None`, `none` (and `null`, the JSON spelling) mean off.
fn is_off(text: &str) -> bool {
    matches!(text, "None" | "none" | "null")
}

impl TypedValueParser for Fractional {
    type Value = Threshold<f64>;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<Self::Value, clap::Error> {
        let text = value.to_string_lossy();
        if is_off(&text) {
            return Ok(Threshold(None));
        }
        let (max, what) = match self.0 {
            Range::Share => (1.0, "a share of the KV blocks between 0 and 1 (0.85 for 85 %)"),
            Range::Fraction => (MAX_PREFILL_FRAC, "a fraction of max_num_batched_tokens between 0 and 1000000"),
        };
        match text.parse::<f64>() {
            Ok(v) if v.is_finite() && (0.0..=max).contains(&v) => Ok(Threshold(Some(v))),
            _ => Err(flag_error(cmd, arg, what, &format!(", or None for off; not `{text}`"))),
        }
    }
}

impl TypedValueParser for Whole {
    type Value = Threshold<u64>;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<Self::Value, clap::Error> {
        let text = value.to_string_lossy();
        if is_off(&text) {
            return Ok(Threshold(None));
        }
        let off = format!(", or None for off; not `{text}`");
        text.parse::<u64>()
            .map(|v| Threshold(Some(v)))
            .map_err(|_| flag_error(cmd, arg, "a whole number at least 0", &off))
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser, Debug)]
    struct Flags {
        #[arg(long, default_value = "none", value_parser = Fractional(Range::Share))]
        share: Threshold<f64>,
        #[arg(long, default_value = "none", value_parser = Fractional(Range::Fraction))]
        frac: Threshold<f64>,
        #[arg(long, default_value = "none", value_parser = Whole)]
        tokens: Threshold<u64>,
    }

    fn parse(args: &[&str]) -> Result<Flags, String> {
        Flags::try_parse_from(std::iter::once("t").chain(args.iter().copied())).map_err(|e| e.to_string())
    }

    #[test]
    fn none_is_off_and_numbers_are_checked_naming_the_flag() {
        let off = parse(&[]).unwrap();
        assert_eq!((off.share, off.frac, off.tokens), (Threshold(None), Threshold(None), Threshold(None)));
        for word in ["None", "none", "null"] {
            assert_eq!(parse(&["--share", word, "--tokens", word]).unwrap().share, Threshold(None));
        }
        let set = parse(&["--share", "0.85", "--frac", "2.5", "--tokens", "10000"]).unwrap();
        assert_eq!(
            (set.share, set.frac, set.tokens),
            (Threshold(Some(0.85)), Threshold(Some(2.5)), Threshold(Some(10_000)))
        );
        let error = parse(&["--share", "85"]).unwrap_err();
        assert!(error.contains("--share takes a share of the KV blocks between 0 and 1"), "{error}");
        assert!(error.contains("not `85`"), "{error}");
        for bad in ["--share=NaN", "--frac=-1", "--frac=inf", "--tokens=1.5", "--tokens=-3"] {
            let error = parse(&[bad]).unwrap_err();
            let flag = bad.split('=').next().unwrap_or_default();
            assert!(error.contains(&format!("{flag} takes")), "{bad}: {error}");
        }
    }
}
