//! Command-line arguments of `loadgate frontend`: ports, workers, router
//! mode, the default busy thresholds, migration and staleness.

use loadgate::{migration::DEFAULT_MIGRATION_LIMIT, BusyThresholds, Policy};

/// How the router picks among eligible workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RouterMode {
    /// Each in turn.
    RoundRobin,
    /// Uniformly at random.
    Random,
    /// The less loaded of two random workers.
    P2c,
    /// The least loaded (by reported load).
    LeastLoaded,
    /// The least loaded, counting the router's own tracked load (KV-aware).
    Kv,
}

/// The older `--admission-control` flag, kept for compatibility.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AdmissionControl {
    /// Busy detection with the given thresholds (the default).
    TokenCapacity,
    /// No busy detection: every threshold is cleared.
    None,
}

/// Command-line arguments of `loadgate frontend`.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// HTTP port on 127.0.0.1 (0 picks a free one).
    #[arg(long, default_value_t = 8000)]
    pub http_port: u16,
    /// Event-plane port on 127.0.0.1 where workers push load (0 picks a free one).
    #[arg(long, default_value_t = 8001)]
    pub event_port: u16,
    /// A worker to register from `URL/info` (repeatable); for workers not on the event plane.
    #[arg(long = "worker", value_name = "URL")]
    pub workers: Vec<String>,
    /// Worker selection policy.
    #[arg(long, value_enum, default_value = "round-robin")]
    pub router_mode: RouterMode,
    /// A worker rank is busy when active decode blocks / total blocks exceed this (0..=1).
    #[arg(long)]
    pub active_decode_blocks_threshold: Option<f64>,
    /// A worker rank is busy when active prefill tokens exceed this.
    #[arg(long)]
    pub active_prefill_tokens_threshold: Option<u64>,
    /// A worker rank is busy when active prefill tokens exceed this fraction of max_num_batched_tokens.
    #[arg(long)]
    pub active_prefill_tokens_threshold_frac: Option<f64>,
    /// A worker rank is busy when the requests waiting in its engine's queue exceed this.
    #[arg(long)]
    pub active_waiting_requests_threshold: Option<u64>,
    /// Compatibility: `none` disables busy detection (clears every threshold).
    #[arg(long, value_enum)]
    pub admission_control: Option<AdmissionControl>,
    /// In `kv` mode, also track blocks for output tokens as they stream.
    #[arg(long)]
    pub router_track_output_blocks: bool,
    /// How many workers may refuse one request (hard cap) before the client gets the overload status.
    #[arg(long, default_value_t = DEFAULT_MIGRATION_LIMIT)]
    pub migration_limit: usize,
    /// A worker rank whose last report is older than this counts as not reported.
    #[arg(long, value_name = "MS")]
    pub load_staleness_ms: Option<u64>,
}

impl Args {
    /// The thresholds every model starts with.
    pub fn default_thresholds(&self) -> BusyThresholds {
        if self.admission_control == Some(AdmissionControl::None) {
            return BusyThresholds::default();
        }
        BusyThresholds {
            active_decode_blocks_threshold: self.active_decode_blocks_threshold,
            active_prefill_tokens_threshold: self.active_prefill_tokens_threshold,
            active_prefill_tokens_threshold_frac: self.active_prefill_tokens_threshold_frac,
            active_waiting_requests_threshold: self.active_waiting_requests_threshold,
        }
    }

    /// The router policy `--router-mode` names.
    pub(crate) fn policy(&self) -> Policy {
        match self.router_mode {
            RouterMode::RoundRobin => Policy::RoundRobin,
            RouterMode::Random => Policy::Random,
            RouterMode::P2c => Policy::PowerOfTwoChoices,
            RouterMode::LeastLoaded | RouterMode::Kv => Policy::LeastLoaded,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admission_control_none_clears_thresholds() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: Args,
        }
        let cli = Cli::parse_from(["x", "--active-decode-blocks-threshold", "0.85", "--router-mode", "kv"]);
        assert_eq!(cli.args.default_thresholds().active_decode_blocks_threshold, Some(0.85));
        assert_eq!(cli.args.router_mode, RouterMode::Kv);
        let cli = Cli::parse_from(["x", "--active-decode-blocks-threshold", "0.85", "--admission-control", "none"]);
        assert!(cli.args.default_thresholds().is_empty());
    }
}
