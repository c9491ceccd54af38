//! What a retry storm measured: each client's [`ClientRun`], the
//! [`StormReport`] of all of them, its `--json` [`StormSummary`] and table.
//!
//! The figures: the peak number of retries sent in any [`PEAK_WINDOW`]
//! (a sliding window over the times the retries were due, first attempts not
//! counted), the total retries, goodput (successes per second from the
//! burst to the last client's end), the time to success from each client's
//! first attempt (median, p99), and every status seen.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::loadgen::config::StormConfig;
use crate::loadgen::report::{histogram, Percentiles};

/// The window of the retry peak.
pub const PEAK_WINDOW: Duration = Duration::from_millis(10);

/// How a client ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Ending {
    /// A 2xx answer.
    Succeeded,
    /// A status other than 2xx, 429, 503 or 529 (not retried).
    Failed,
    /// `--max-attempts` attempts, none successful.
    OutOfAttempts,
    /// Its next retry would have started after `--duration`.
    OutOfTime,
    /// Still running (or connecting) at the storm's bound, and abandoned.
    #[default]
    Unfinished,
}

/// What one client saw.
#[derive(Clone, Debug, Default)]
pub struct ClientRun {
    /// Attempts it sent (the first and its retries).
    pub attempts: u32,
    /// When its retries (every attempt after the first) were due, from the burst.
    pub retries: Vec<Duration>,
    /// The status of every answered attempt.
    pub statuses: Vec<u16>,
    /// The waits refusals asked for (and the client honoured).
    pub hints: Vec<Duration>,
    /// Refusals without a usable hint (the fallback was used).
    pub unhinted: u32,
    /// Attempts whose connection failed or broke.
    pub transport_errors: u32,
    /// Attempts past `--request-timeout`.
    pub timeouts: u32,
    /// From its first attempt to the successful answer.
    pub success: Option<Duration>,
    /// How it ended.
    pub ending: Ending,
    /// When it ended, from the burst.
    pub finished_at: Duration,
}

/// Everything one storm measured.
#[derive(Clone, Debug)]
pub struct StormReport {
    /// The storm that ran.
    pub config: StormConfig,
    /// Every client, also one abandoned at the storm's bound with what it
    /// saw until then.
    pub runs: Vec<ClientRun>,
    /// Clients abandoned at the bound.
    pub unfinished: u64,
    /// From the burst to the last client's end (or the bound).
    pub elapsed: Duration,
}

/// The machine-readable summary of a storm (`--json`).
#[derive(Clone, Debug, Serialize)]
pub struct StormSummary {
    /// Always `"retry_storm"`.
    pub mode: &'static str,
    /// Target URL.
    pub url: String,
    /// Clients in the burst.
    pub clients: u32,
    /// Attempts allowed per client.
    pub max_attempts: u32,
    /// Clients that got a 2xx.
    pub succeeded: u64,
    /// Clients that got a status that is not retried.
    pub failed: u64,
    /// Clients that used every attempt.
    pub out_of_attempts: u64,
    /// Clients whose next retry fell after `--duration`.
    pub out_of_time: u64,
    /// Clients abandoned at the storm's bound.
    pub unfinished: u64,
    /// Attempts sent (first ones and retries).
    pub attempts: u64,
    /// Retries sent.
    pub retries: u64,
    /// Most retries sent in any 10 ms window.
    pub peak_retries_10ms: u64,
    /// Where that window starts, ms after the burst.
    pub peak_at_ms: f64,
    /// Retries sent in each 100 ms after the burst.
    pub retries_per_100ms: Vec<u64>,
    /// Answers per status.
    pub by_status: BTreeMap<String, u64>,
    /// Refusals that carried no usable hint.
    pub unhinted_refusals: u64,
    /// Attempts whose connection failed or broke.
    pub transport_errors: u64,
    /// Attempts past `--request-timeout`.
    pub timeouts: u64,
    /// From the burst to the last client's end, seconds.
    pub elapsed_s: f64,
    /// Successes per second of `elapsed`.
    pub goodput_rps: f64,
    /// From a client's first attempt to its success, ms.
    pub time_to_success_ms: Percentiles,
    /// The waits the refusals asked for, ms.
    pub retry_after_ms: Percentiles,
}

/// The most of `times` that fall in one `window` (a half-open interval
/// starting at one of them), and where that window starts.
pub fn peak_in_window(times: &mut [Duration], window: Duration) -> (u64, Duration) {
    times.sort_unstable();
    let (mut best, mut at, mut first) = (0, Duration::ZERO, 0);
    for (last, &t) in times.iter().enumerate() {
        while t - times[first] >= window {
            first += 1;
        }
        let n = (last - first + 1) as u64;
        if n > best {
            (best, at) = (n, times[first]);
        }
    }
    (best, at)
}

/// The step of the summary's retry timeline.
const TIMELINE_STEP: Duration = Duration::from_millis(100);

/// How many of `times` fall in each `step` from 0 to the last of them.
fn timeline(times: &[Duration], step: Duration) -> Vec<u64> {
    let slot = |t: &Duration| (t.as_micros() / step.as_micros().max(1)) as usize;
    let mut counts = vec![0; times.iter().map(slot).max().map_or(0, |last| last + 1)];
    for t in times {
        counts[slot(t)] += 1;
    }
    counts
}

impl StormReport {
    /// The `--json` object.
    pub fn summary(&self) -> StormSummary {
        let count = |e: Ending| self.runs.iter().filter(|r| r.ending == e).count() as u64;
        let mut retries: Vec<Duration> = self.runs.iter().flat_map(|r| r.retries.iter().copied()).collect();
        let (peak, peak_at) = peak_in_window(&mut retries, PEAK_WINDOW);
        let mut by_status = BTreeMap::new();
        for status in self.runs.iter().flat_map(|r| &r.statuses) {
            *by_status.entry(status.to_string()).or_default() += 1;
        }
        let (mut success, mut hints) = (histogram(3), histogram(3));
        for run in &self.runs {
            if let Some(t) = run.success {
                success.saturating_record(t.as_micros().max(1) as u64);
            }
            for hint in &run.hints {
                hints.saturating_record(hint.as_micros().max(1) as u64);
            }
        }
        let sum = |f: fn(&ClientRun) -> u32| self.runs.iter().map(|r| u64::from(f(r))).sum::<u64>();
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        let succeeded = count(Ending::Succeeded);
        StormSummary {
            mode: "retry_storm",
            url: self.config.request.url.clone(),
            clients: self.config.clients,
            max_attempts: self.config.max_attempts,
            succeeded,
            failed: count(Ending::Failed),
            out_of_attempts: count(Ending::OutOfAttempts),
            out_of_time: count(Ending::OutOfTime),
            unfinished: self.unfinished,
            attempts: sum(|r| r.attempts),
            retries: retries.len() as u64,
            peak_retries_10ms: peak,
            peak_at_ms: peak_at.as_secs_f64() * 1000.0,
            retries_per_100ms: timeline(&retries, TIMELINE_STEP),
            by_status,
            unhinted_refusals: sum(|r| r.unhinted),
            transport_errors: sum(|r| r.transport_errors),
            timeouts: sum(|r| r.timeouts),
            elapsed_s: secs,
            goodput_rps: succeeded as f64 / secs,
            time_to_success_ms: Percentiles::of(&success),
            retry_after_ms: Percentiles::of(&hints),
        }
    }

    /// The human-readable final table.
    pub fn table(&self) -> String {
        let s = self.summary();
        let statuses: Vec<String> = s.by_status.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let row = |name: &str, p: Percentiles| {
            format!("{name:<15}{:>10.1}{:>10.1}{:>10.1}{:>10.1}\n", p.p50, p.p90, p.p99, p.max)
        };
        let mut out = String::new();
        out.push_str(&format!(
            "retry storm: {} clients at once to {} (at most {} attempts each, {:.1} s)\n",
            s.clients,
            s.url,
            s.max_attempts,
            self.config.request.duration.as_secs_f64()
        ));
        out.push_str(&format!(
            "succeeded {}  failed {}  out of attempts {}  out of time {}  unfinished {}  [{}]\n",
            s.succeeded,
            s.failed,
            s.out_of_attempts,
            s.out_of_time,
            s.unfinished,
            statuses.join(" ")
        ));
        out.push_str(&format!(
            "attempts {}  retries {}  peak {} retries in 10 ms (at {:.0} ms)  unhinted {}  transport errors {}  timeouts {}\n",
            s.attempts, s.retries, s.peak_retries_10ms, s.peak_at_ms, s.unhinted_refusals, s.transport_errors, s.timeouts
        ));
        out.push_str(&format!("goodput {:.1} req/s  (elapsed {:.1} s)\n", s.goodput_rps, s.elapsed_s));
        out.push_str(&format!("{:<15}{:>10}{:>10}{:>10}{:>10}\n", "ms", "p50", "p90", "p99", "max"));
        out.push_str(&row("to success", s.time_to_success_ms));
        out.push_str(&row("retry-after", s.retry_after_ms));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peak_is_the_fullest_window() {
        let ms = Duration::from_millis;
        let mut times = vec![ms(1000), ms(5), ms(1009), ms(1003), ms(0), ms(1010), ms(2000)];
        // 1000, 1003, 1009 fall in [1000, 1010); 1010 does not.
        assert_eq!(peak_in_window(&mut times, PEAK_WINDOW), (3, ms(1000)));
        assert_eq!(peak_in_window(&mut [], PEAK_WINDOW), (0, Duration::ZERO));
        assert_eq!(peak_in_window(&mut [ms(7)], PEAK_WINDOW), (1, ms(7)));
        assert_eq!(timeline(&[ms(0), ms(99), ms(100), ms(350)], TIMELINE_STEP), vec![2, 1, 0, 1]);
        assert!(timeline(&[], TIMELINE_STEP).is_empty());
    }
}
