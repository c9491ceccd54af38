//! A run's progress: the [`Tally`] every kind of run counts its requests in
//! as they end, and the [`Progress`] reporter that shows it on stderr while
//! the run goes on (never on stdout, which holds the report).
//!
//! On a terminal an `indicatif` bar, refreshed every [`TERMINAL_EVERY`];
//! otherwise a plain line every [`PLAIN_EVERY`], such as
//! `bench: 5/60 s  sent 1200  ok 800  rejected 390  errors 0  in flight 10`.
//! The tally also decides the exit status: a run in which no request got an
//! HTTP answer fails with the first error met ([`Tally::ensure_answered`]).

use std::io::{IsTerminal as _, Write as _};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How often the bar on a terminal is refreshed.
pub const TERMINAL_EVERY: Duration = Duration::from_secs(1);
/// How often a plain progress line is printed when stderr is not a terminal.
pub const PLAIN_EVERY: Duration = Duration::from_secs(5);
/// What every plain progress line starts with.
pub const PLAIN_PREFIX: &str = "bench: ";

/// Requests of one run by how they ended, counted as they end.
#[derive(Debug, Default)]
pub struct Tally {
    sent: AtomicU64,
    ok: AtomicU64,
    rejected: AtomicU64,
    errors: AtomicU64,
    first_error: OnceLock<String>,
}

/// A [`Tally`] read at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Requests (or attempts) sent.
    pub sent: u64,
    /// Answered 2xx, the body read whole.
    pub ok: u64,
    /// Answered with another status (529, 503, ...), the body read whole.
    pub rejected: u64,
    /// No whole answer: the connection failed or broke, or the attempt timed out.
    pub errors: u64,
}

// Relaxed throughout: independent counters read for display and after the run's tasks ended.
impl Tally {
    /// One more request sent.
    pub fn sent(&self) {
        self.sent.fetch_add(1, Ordering::Relaxed);
    }

    /// A request answered with `status`, its body read whole.
    pub fn answered(&self, status: u16) {
        let counter = if (200..300).contains(&status) { &self.ok } else { &self.rejected };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// A request without a whole answer; the first such error is kept.
    pub fn failed(&self, error: &(dyn std::error::Error + 'static)) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        if self.first_error.get().is_none() {
            let _ = self.first_error.set(error_text(error));
        }
    }

    /// The counts now.
    pub fn counts(&self) -> Counts {
        Counts {
            sent: self.sent.load(Ordering::Relaxed),
            ok: self.ok.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
        }
    }

    /// Whether some request got an HTTP answer (any status), when any was sent.
    ///
    /// # Errors
    ///
    /// Requests were sent and none was answered: the error names the first
    /// failure (or says that none had an answer in time).
    pub fn ensure_answered(&self) -> anyhow::Result<()> {
        let c = self.counts();
        if c.sent == 0 || c.ok + c.rejected > 0 {
            return Ok(());
        }
        match self.first_error.get() {
            Some(error) => anyhow::bail!("no request got an HTTP response; the first error: {error}"),
            None => anyhow::bail!("no request got an HTTP response: none of the {} sent was answered in time", c.sent),
        }
    }
}

/// `error` and its sources, `: `-separated (reqwest's own text does not say
/// why a connection failed; its sources do).
fn error_text(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// The figures of one progress line, `elapsed` into a run of `duration`.
fn figures(c: Counts, elapsed: Duration, duration: Duration) -> String {
    let in_flight = c.sent.saturating_sub(c.ok + c.rejected + c.errors);
    format!(
        "{}/{} s  sent {}  ok {}  rejected {}  errors {}  in flight {in_flight}",
        seconds(elapsed),
        seconds(duration),
        c.sent,
        c.ok,
        c.rejected,
        c.errors
    )
}

/// Whole seconds, or tenths when the duration has them.
fn seconds(d: Duration) -> String {
    if d.subsec_millis() < 100 {
        d.as_secs().to_string()
    } else {
        format!("{:.1}", d.as_secs_f64())
    }
}

/// Shows a [`Tally`] on stderr while a run goes on; stops when dropped.
pub struct Progress {
    bar: Option<ProgressBar>,
    ticker: Option<JoinHandle<()>>,
}

impl Progress {
    /// Starts showing `tally` for a run of `duration` (nothing when `shown`
    /// is false, or outside a Tokio runtime).
    pub fn start(shown: bool, duration: Duration, tally: Arc<Tally>) -> Progress {
        let runtime = tokio::runtime::Handle::try_current();
        let Some(runtime) = runtime.ok().filter(|_| shown) else {
            return Progress { bar: None, ticker: None };
        };
        let start = Instant::now();
        if !std::io::stderr().is_terminal() {
            let ticker = runtime.spawn(async move {
                let mut every = tokio::time::interval_at(start + PLAIN_EVERY, PLAIN_EVERY);
                loop {
                    every.tick().await;
                    let line = figures(tally.counts(), start.elapsed(), duration);
                    // A closed stderr is no reason to stop the run.
                    let _ = writeln!(std::io::stderr().lock(), "{PLAIN_PREFIX}{line}");
                }
            });
            return Progress { bar: None, ticker: Some(ticker) };
        }
        let length = duration.as_millis().try_into().unwrap_or(u64::MAX);
        let bar = ProgressBar::new(length);
        let style = ProgressStyle::with_template("{spinner} [{bar:30}] {msg}")
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar.enable_steady_tick(Duration::from_millis(100));
        let shown_bar = bar.clone();
        let ticker = runtime.spawn(async move {
            let mut every = tokio::time::interval(TERMINAL_EVERY);
            loop {
                every.tick().await;
                let elapsed = start.elapsed();
                shown_bar.set_position(elapsed.as_millis().try_into().unwrap_or(u64::MAX).min(length));
                shown_bar.set_message(figures(tally.counts(), elapsed, duration));
            }
        });
        Progress { bar: Some(bar), ticker: Some(ticker) }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(ticker) = self.ticker.take() {
            ticker.abort();
        }
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_says_every_figure() {
        let c = Counts { sent: 20, ok: 5, rejected: 9, errors: 2 };
        let line = figures(c, Duration::from_millis(5_020), Duration::from_secs(60));
        assert_eq!(line, "5/60 s  sent 20  ok 5  rejected 9  errors 2  in flight 4");
        let tenths = figures(Counts::default(), Duration::from_millis(1_500), Duration::from_secs(2));
        assert!(tenths.starts_with("1.5/2 s  sent 0"), "{tenths}");
    }

    #[test]
    fn a_run_fails_only_when_nothing_was_answered() {
        let tally = Tally::default();
        assert!(tally.ensure_answered().is_ok(), "nothing sent");
        tally.sent();
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        tally.failed(&refused);
        tally.failed(&std::io::Error::other("later"));
        let error = tally.ensure_answered().expect_err("no answer").to_string();
        assert_eq!(error, "no request got an HTTP response; the first error: connection refused");
        tally.sent();
        tally.answered(529);
        assert!(tally.ensure_answered().is_ok(), "a 529 is an answer");
        assert_eq!(tally.counts(), Counts { sent: 2, ok: 0, rejected: 1, errors: 2 });
    }

    #[test]
    fn an_unanswered_run_without_errors_says_so() {
        let tally = Tally::default();
        tally.sent();
        let error = tally.ensure_answered().expect_err("no answer").to_string();
        assert!(error.contains("none of the 1 sent was answered in time"), "{error}");
    }

    #[test]
    fn the_error_text_names_its_sources() {
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("error sending request")
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let error = Outer(std::io::Error::other("Connection refused (os error 111)"));
        assert_eq!(error_text(&error), "error sending request: Connection refused (os error 111)");
    }
}
