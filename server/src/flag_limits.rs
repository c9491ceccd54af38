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
pub fn secs(min: u64) -> Units {
    Units { unit: "seconds", example: "30", min, max: MAX_SECS }
}

/// The parser of a flag of whole seconds, from `min` to `max`.
pub fn secs_within(min: u64, max: u64) -> Units {
    Units { max, ..secs(min) }
}

/// The parser of a flag of whole milliseconds, from `min` to [`MAX_MS`].
pub fn ms(min: u64) -> Units {
    Units { unit: "milliseconds", example: "2000", min, max: MAX_MS }
}

/// The error of a flag parser: `--flag takes <what>` (the flag as the
/// user spells it), then `tail` (what was given).
pub(crate) fn flag_error(cmd: &clap::Command, arg: Option<&clap::Arg>, what: &str, tail: &str) -> clap::Error {
    let flag = arg.and_then(clap::Arg::get_long).map_or_else(|| "the value".to_owned(), |l| format!("--{l}"));
    let message = format!("{flag} takes {what}{tail}\n");
    clap::Error::raw(clap::error::ErrorKind::ValueValidation, message).with_cmd(cmd)
}

/// The parser of a flag of seconds that may have a fraction (`2.5`).
pub fn fractional_secs() -> FractionalSecs {
    FractionalSecs
}

/// Parses a flag of seconds given as a number (`10`, `2.5`); its error
/// names the flag and says the unit (`2s` says it takes a number of
/// seconds). The range is checked where the value is used (`seconds`).
#[derive(Debug, Clone, Copy)]
pub struct FractionalSecs;

impl clap::builder::TypedValueParser for FractionalSecs {
    type Value = f64;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<f64, clap::Error> {
        let text = value.to_string_lossy();
        let not = format!(", not `{text}`");
        text.trim().parse::<f64>().map_err(|_| flag_error(cmd, arg, "a number of seconds (e.g. 10 or 2.5)", &not))
    }
}

/// Parses a duration flag given as a whole number of `unit`; its errors
/// name the flag and the unit (`2s` to a milliseconds flag says so).
#[derive(Debug, Clone, Copy)]
pub struct Units {
    unit: &'static str,
    example: &'static str,
    min: u64,
    max: u64,
}

impl clap::builder::TypedValueParser for Units {
    type Value = u64;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<u64, clap::Error> {
        let text = value.to_string_lossy();
        let Units { unit, example, min, max } = *self;
        match text.trim().parse::<u64>() {
            Ok(n) if (min..=max).contains(&n) => Ok(n),
            Ok(n) => Err(flag_error(cmd, arg, &format!("{min} to {max} {unit}"), &format!(", not {n}"))),
            Err(_) => Err(flag_error(
                cmd,
                arg,
                &format!("a whole number of {unit} (e.g. {example})"),
                &format!(", not `{text}`"),
            )),
        }
    }
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
    fn duration_flags_name_the_flag_and_the_unit() {
        #[derive(clap::Parser, Debug)]
        struct Flags {
            #[arg(long, default_value_t = 1, value_parser = ms(1))]
            wait_ms: u64,
            #[arg(long, default_value_t = 0, value_parser = secs(0))]
            idle_secs: u64,
        }
        let parse = |args: &[&str]| {
            <Flags as clap::Parser>::try_parse_from(std::iter::once("t").chain(args.iter().copied()))
                .map(|f| (f.wait_ms, f.idle_secs))
                .map_err(|e| e.to_string())
        };
        assert_eq!(parse(&["--wait-ms", "2000", "--idle-secs", "0"]), Ok((2000, 0)));
        let error = parse(&["--wait-ms", "2s"]).unwrap_err();
        assert!(error.contains("--wait-ms takes a whole number of milliseconds (e.g. 2000), not `2s`"), "{error}");
        let error = parse(&["--idle-secs", "1.5"]).unwrap_err();
        assert!(error.contains("--idle-secs takes a whole number of seconds"), "{error}");
        let error = parse(&["--wait-ms", "0"]).unwrap_err();
        assert!(error.contains("--wait-ms takes 1 to 86400000 milliseconds, not 0"), "{error}");
    }

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
