//! `parse_overload_status` against a reference: an all-digit value (after
//! trimming whitespace) from 200 to 999 is used, anything else gives 529.
#![no_main]

use libfuzzer_sys::fuzz_target;
use loadgate::rejection::{parse_overload_status, DEFAULT_OVERLOAD_STATUS};

/// The status a person meant, digit by digit: no integer parsing to share
/// a bug with.
fn reference(value: Option<&str>) -> u16 {
    let Some(value) = value else { return DEFAULT_OVERLOAD_STATUS };
    let trimmed = value.trim_matches(char::is_whitespace);
    if trimmed.is_empty() || !trimmed.chars().all(|c| c.is_ascii_digit()) {
        return DEFAULT_OVERLOAD_STATUS;
    }
    let significant = trimmed.trim_start_matches('0');
    if significant.len() > 3 {
        return DEFAULT_OVERLOAD_STATUS;
    }
    let code = significant.bytes().fold(0u16, |n, d| n * 10 + u16::from(d - b'0'));
    if (200..=999).contains(&code) {
        code
    } else {
        DEFAULT_OVERLOAD_STATUS
    }
}

fuzz_target!(|data: &[u8]| {
    // The first byte says whether the variable is set at all; the rest is
    // its value (environment values are strings: invalid UTF-8 is lossy).
    let value = match data.split_first() {
        None | Some((0, _)) => None,
        Some((_, rest)) => Some(String::from_utf8_lossy(rest).into_owned()),
    };
    let got = parse_overload_status(value.as_deref());
    assert_eq!(got, reference(value.as_deref()), "{value:?}");
    assert!(got == DEFAULT_OVERLOAD_STATUS || (200..=999).contains(&got));
});
