//! A retry storm from `loadgate bench --retry-storm`, the same for every
//! test that runs one.

use std::time::Duration;

use serde_json::Value;

/// Runs `clients` clients of `loadgate bench --retry-storm` against
/// `urls` (the first as `--url`, the rest as `--also-url`: each retry goes
/// to the next), 64-token prompts and 20 output tokens, starting attempts
/// for `storm_secs` s (then 2 s to drain, 5 s per request, 40 attempts per
/// client), honouring the hints; the bench's `--json` summary. The bench
/// must end `within` (it is killed otherwise).
pub fn retry_storm(urls: &[&str], model: &str, clients: &str, storm_secs: &str, within: Duration) -> Value {
    let also = urls[1..].join(",");
    let mut args = vec!["bench", "--url", urls[0]];
    if !also.is_empty() {
        args.extend(["--also-url", &also]);
    }
    args.extend([
        "--model",
        model,
        "--retry-storm",
        clients,
        "--prompt-tokens",
        "64",
        "--output-tokens",
        "20",
        "--duration",
        storm_secs,
        "--drain-timeout",
        "2",
        "--request-timeout",
        "5",
        "--max-attempts",
        "40",
        "--json",
    ]);
    // `--json` prints one line, at the end: the first stdout line.
    let (_bench, line) = tokio::task::block_in_place(|| super::spawn_within("bench", &args, &[], within));
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("bench --json: {e}: {line}"))
}
