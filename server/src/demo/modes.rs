//! The demo's three modes, run at every load level: no shedding, static
//! thresholds (the frontend answers 529 at once when every worker is busy),
//! and static thresholds with the frontend's deadline-bounded waiting line
//! (`--router-queue-timeout-ms`: a request that finds every worker busy
//! waits for one to free, and is refused only at the timeout). The line's
//! timeout is the objective minus the p50 TTFT the static mode measured at
//! 0.5x: what a request may still wait and then, served as usual, meet it.

use std::time::Duration;

use loadgate::PerClass;

use crate::demo::args::Args;
use crate::demo::tenants_file;

/// The line's shortest timeout, whatever the objective and the 0.5x TTFT.
pub(crate) const MIN_LINE_TIMEOUT_MS: u64 = 50;

/// How the frontend treats a request when every worker is busy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// No busy thresholds: every request is accepted and queues at a worker.
    Off,
    /// Busy thresholds: 529 at once when every worker is busy.
    Static,
    /// Busy thresholds and a waiting line of `timeout_ms` at the frontend.
    Line { timeout_ms: u64 },
    /// As [`Mode::Line`] with a timeout per class, `x-loadgate-priority`
    /// trusted: the load sends each request's class (`--mix`).
    Classes { timeouts: PerClass<u64> },
    /// As [`Mode::Line`] with the demo's tenants file (`--tenants`): a
    /// request's API key decides its tenant, and the line shares its
    /// dispatches among the tenants by weight.
    Tenants { timeout_ms: u64 },
}

impl Mode {
    /// Whether the frontend runs busy thresholds.
    pub(crate) fn sheds(self) -> bool {
        self != Mode::Off
    }

    /// Whether the load sends priority classes.
    pub(crate) fn has_classes(self) -> bool {
        matches!(self, Mode::Classes { .. })
    }

    /// The mode's name in the table, the progress lines and the plot.
    pub(crate) fn label(self) -> String {
        match self {
            Mode::Off => "no shedding".to_owned(),
            Mode::Static => "static thresholds".to_owned(),
            Mode::Line { timeout_ms } => format!("thresholds + line ({timeout_ms} ms)"),
            Mode::Classes { timeouts } => format!("line + classes ({timeouts} ms)"),
            Mode::Tenants { timeout_ms } => format!("line + tenants ({timeout_ms} ms)"),
        }
    }

    /// The frontend flags of the waiting line (none without one): its
    /// timeout, and the class header or the tenants file a mode adds.
    pub(crate) fn line_flags(self, args: &Args) -> Vec<String> {
        let mut flags = match self {
            Mode::Line { timeout_ms } => vec!["--router-queue-timeout-ms".to_owned(), timeout_ms.to_string()],
            Mode::Classes { timeouts } => {
                let mut flags = vec![
                    "--router-queue-timeout-ms".to_owned(),
                    timeouts.to_string(),
                    "--trust-priority-header".to_owned(),
                ];
                if args.sheddable_headroom > 0.0 {
                    flags.push(format!("--sheddable-headroom={}", args.sheddable_headroom));
                }
                flags
            }
            Mode::Tenants { timeout_ms } => vec![
                "--router-queue-timeout-ms".to_owned(),
                timeout_ms.to_string(),
                "--tenants-file".to_owned(),
                tenants_file::path().display().to_string(),
            ],
            Mode::Off | Mode::Static => return Vec::new(),
        };
        if let Some(n) = args.router_queue_limit {
            flags.extend(["--router-queue-limit".to_owned(), n.to_string()]);
        }
        if let Some(n) = args.router_queue_token_limit {
            flags.extend(["--router-queue-token-limit".to_owned(), n.to_string()]);
        }
        flags
    }
}

/// The line's timeout: `objective` minus `p50_ttft_ms` (the static mode's
/// p50 TTFT at 0.5x), rounded down to whole ms and at least
/// [`MIN_LINE_TIMEOUT_MS`]; and whether that floor applied.
pub(crate) fn line_timeout_ms(objective: Duration, p50_ttft_ms: f64) -> (u64, bool) {
    let room = objective.as_secs_f64() * 1000.0 - p50_ttft_ms;
    if room.is_finite() && room >= MIN_LINE_TIMEOUT_MS as f64 {
        (room.floor() as u64, false)
    } else {
        (MIN_LINE_TIMEOUT_MS, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timeout_is_the_objective_minus_the_p50_at_half_load() {
        assert_eq!(line_timeout_ms(Duration::from_millis(500), 16.4), (483, false));
        assert_eq!(line_timeout_ms(Duration::from_millis(1000), 0.0), (1000, false));
    }

    #[test]
    fn the_timeout_has_a_floor() {
        assert_eq!(line_timeout_ms(Duration::from_millis(500), 470.0), (MIN_LINE_TIMEOUT_MS, true));
        assert_eq!(line_timeout_ms(Duration::from_millis(100), 900.0), (MIN_LINE_TIMEOUT_MS, true));
        assert_eq!(line_timeout_ms(Duration::from_millis(100), f64::NAN), (MIN_LINE_TIMEOUT_MS, true));
    }

    #[test]
    fn only_the_line_modes_have_line_flags() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: Args,
        }
        let args = Cli::parse_from(["demo", "--router-queue-limit", "32"]).args;
        assert!(Mode::Off.line_flags(&args).is_empty() && Mode::Static.line_flags(&args).is_empty());
        assert_eq!(
            Mode::Line { timeout_ms: 480 }.line_flags(&args),
            ["--router-queue-timeout-ms", "480", "--router-queue-limit", "32"]
        );
        assert!(!Mode::Off.sheds() && Mode::Static.sheds() && Mode::Line { timeout_ms: 1 }.sheds());
        let tenants = Mode::Tenants { timeout_ms: 480 };
        let file = tenants_file::path().display().to_string();
        assert_eq!(
            tenants.line_flags(&args),
            ["--router-queue-timeout-ms", "480", "--tenants-file", &file, "--router-queue-limit", "32"]
        );
        assert!(tenants.sheds() && !tenants.has_classes());
    }
}
