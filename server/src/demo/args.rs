//! Command-line arguments of `loadgate demo`, and the fixed parts of every
//! run: the model names and the load levels. Some defaults depend on the
//! setup (simulated workers or `--engines llamacpp`); the accessors resolve
//! them.

use std::path::PathBuf;
use std::time::Duration;

use crate::loadgen::{MAX_OUTPUT_TOKENS, MAX_PROMPT_TOKENS, MAX_RATE};

/// The model name the demo's simulated workers serve.
pub(crate) const MODEL: &str = "demo-model";

/// The model name the demo's llama-servers serve (their `--alias`).
pub(crate) const LLAMA_MODEL: &str = "small-random-llama";

/// Real engines the demo can run on instead of simulated workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Engines {
    /// Two llama.cpp `llama-server`s with the small random-weight model.
    #[value(name = "llamacpp", alias = "llama.cpp", alias = "llama-cpp")]
    LlamaCpp,
}

/// Command-line arguments of `loadgate demo`. Every flag also reads
/// `LOADGATE_DEMO_<FLAG>` (a flag beats its variable).
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Run on real engines instead of simulated workers: `llamacpp` runs two llama-servers that
    /// `bash scripts/prepare-llama-server` prepared (small model, 4 slots each).
    #[arg(help_heading = "The pool", long, env = "LOADGATE_DEMO_ENGINES", value_enum)]
    pub engines: Option<Engines>,
    /// Simulated workers behind the frontend.
    #[arg(
        help_heading = "The pool",
        long,
        env = "LOADGATE_DEMO_WORKERS",
        default_value_t = 4,
        conflicts_with = "engines",
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=MAX_WORKERS as u64)
    )]
    pub workers: usize,
    /// Frontends in front of the workers, counting their load together over NATS (needs
    /// --event-plane nats); the load is spread over them in turn, as a load balancer would.
    #[arg(help_heading = "The pool", long, env = "LOADGATE_DEMO_FRONTENDS", default_value_t = 1, conflicts_with = "engines",
          value_parser = clap::value_parser!(u16).range(1..=8))]
    pub frontends: u16,
    /// The event plane: `tcp`, or `nats` (the demo starts a nats-server of its own on 127.0.0.1:
    /// `bash scripts/prepare-nats-server` installs it).
    #[arg(
        help_heading = "The pool",
        long,
        env = "LOADGATE_DEMO_EVENT_PLANE",
        value_enum,
        default_value = "tcp",
        conflicts_with = "engines"
    )]
    pub event_plane: crate::nats::EventPlaneKind,
    /// Seconds of arrivals per run [default: 8; 20 with --engines].
    #[arg(help_heading = "The load and the report", long, env = "LOADGATE_DEMO_DURATION", value_parser = crate::flag_limits::fractional_secs())]
    pub duration: Option<f64>,
    /// Seconds each run waits for in-flight requests after its arrivals end [default: 3; 30 with --engines,
    /// where the queue of the 2x run without shedding often drains in that time].
    #[arg(help_heading = "The load and the report", long, env = "LOADGATE_DEMO_DRAIN_TIMEOUT", value_parser = crate::flag_limits::fractional_secs())]
    pub drain_timeout: Option<f64>,
    /// The shedding runs' `--active-decode-blocks-threshold`. With --engines llamacpp a server's KV
    /// share is its share of slots in use, so 0.85 makes it busy when none of its 4 slots is free.
    #[arg(help_heading = "Shedding", long, env = "LOADGATE_DEMO_THRESHOLD", default_value_t = 0.85, value_parser = share)]
    pub threshold: f64,
    /// The shedding run's `--active-waiting-requests-threshold` (with --engines): an engine is busy
    /// when more requests than this wait for a slot.
    #[arg(
        help_heading = "Shedding",
        long,
        env = "LOADGATE_DEMO_WAITING_THRESHOLD",
        default_value_t = 0,
        requires = "engines"
    )]
    pub waiting_threshold: u64,
    /// The shedding run's `--active-prefill-tokens-threshold` (with --engines): an engine is busy
    /// while more prompt words than this, sent to it, await their first token. 0: one request at a
    /// time takes a freed slot, and a scrape that has not yet seen it cannot send it a second.
    #[arg(
        help_heading = "Shedding",
        long,
        env = "LOADGATE_DEMO_PREFILL_THRESHOLD",
        default_value_t = 0,
        requires = "engines"
    )]
    pub prefill_threshold: u64,
    /// Milliseconds between the frontend's scrapes of each engine (with --engines).
    #[arg(help_heading = "The pool", long, env = "LOADGATE_DEMO_SCRAPE_INTERVAL_MS", default_value_t = 50, requires = "engines",
          value_parser = clap::value_parser!(u64).range(1..=100))]
    pub scrape_interval_ms: u64,
    /// The objective of SLO goodput, the demo's headline: a request counts when it completes with
    /// its time to first token within this many ms [default: 500; 1000 with --engines, where the p99
    /// TTFT at 0.5x was at most 0.3 s in docs/demo.md's runs and a request that waits for one slot to
    /// free waits up to one service time, about 0.8 s: the objective admits that one wait, not a
    /// queue].
    #[arg(help_heading = "The load and the report", long, env = "LOADGATE_DEMO_SLO_TTFT_MS", value_parser = crate::flag_limits::ms(1))]
    pub slo_ttft_ms: Option<u64>,
    /// The waiting line's timeout in the third mode (the frontend's --router-queue-timeout-ms)
    /// [default: the objective minus the p50 TTFT at 0.5x with static thresholds, at least 50 ms].
    #[arg(help_heading = "Shedding", long, env = "LOADGATE_DEMO_ROUTER_QUEUE_TIMEOUT_MS", value_parser = crate::flag_limits::ms(1))]
    pub router_queue_timeout_ms: Option<u64>,
    /// The waiting line's --router-queue-limit (1 to 1,000,000 requests) in the third mode [default: the frontend's].
    #[arg(help_heading = "Shedding", long, env = "LOADGATE_DEMO_ROUTER_QUEUE_LIMIT",
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub router_queue_limit: Option<u64>,
    /// The waiting line's --router-queue-token-limit in the third mode [default: the frontend's].
    #[arg(help_heading = "Shedding", long, env = "LOADGATE_DEMO_ROUTER_QUEUE_TOKEN_LIMIT",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub router_queue_token_limit: Option<u64>,
    /// Skip the saturation run and use this capacity (req/s, at most 10,000).
    #[arg(help_heading = "The load and the report", long, env = "LOADGATE_DEMO_CAPACITY", value_parser = capacity)]
    pub capacity: Option<f64>,
    /// KV-cache blocks per simulated worker.
    #[arg(
        help_heading = "The pool",
        long,
        env = "LOADGATE_DEMO_KV_TOTAL_BLOCKS",
        default_value_t = 64,
        conflicts_with = "engines",
        value_parser = clap::value_parser!(u32).range(1..=1_000_000)
    )]
    pub kv_total_blocks: u32,
    /// Engine step time of the simulated workers, ms (at least 1, as the worker takes).
    #[arg(help_heading = "The pool", long, env = "LOADGATE_DEMO_DECODE_STEP_MS", default_value_t = 25, conflicts_with = "engines", value_parser = crate::flag_limits::ms(1))]
    pub decode_step_ms: u64,
    /// Token budget of one simulator step.
    #[arg(
        help_heading = "The pool",
        long,
        env = "LOADGATE_DEMO_MAX_NUM_BATCHED_TOKENS",
        default_value_t = 512,
        conflicts_with = "engines",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub max_num_batched_tokens: u32,
    /// Prompt tokens (words) per request [default: 112; 32 with --engines].
    /// At most 16,000,000, as the bench's.
    #[arg(help_heading = "The load and the report", long, env = "LOADGATE_DEMO_PROMPT_TOKENS",
          value_parser = clap::value_parser!(u32).range(0..=MAX_PROMPT_TOKENS))]
    pub prompt_tokens: Option<u32>,
    /// Output tokens per request (1 to 2^31 - 1: `max_tokens` 0 is a 400, as is more than any
    /// server takes) [default: 32; 64 with --engines].
    #[arg(help_heading = "The load and the report", long, env = "LOADGATE_DEMO_OUTPUT_TOKENS",
          value_parser = clap::value_parser!(u32).range(1..=MAX_OUTPUT_TOKENS))]
    pub output_tokens: Option<u32>,
    /// Router mode of the frontend (both runs) [default: kv; round-robin with --engines].
    #[arg(help_heading = "Shedding", long, env = "LOADGATE_DEMO_ROUTER_MODE")]
    pub router_mode: Option<String>,
    /// Where to write the plot [default: loadgate-demo.svg; loadgate-demo-llamacpp.svg with --engines].
    #[arg(help_heading = "The load and the report", long, env = "LOADGATE_DEMO_PLOT")]
    pub plot: Option<PathBuf>,
    /// Seed of the arrival processes.
    #[arg(help_heading = "The load and the report", long, env = "LOADGATE_DEMO_SEED", default_value_t = 7)]
    pub seed: u64,
    /// Priority classes instead of the three modes: every request's class drawn with these shares
    /// (`critical=0.3,standard=0.4,sheddable=0.3`), one mode (thresholds + line, the header
    /// trusted) at every level, and a table per class (simulated workers).
    #[arg(
        help_heading = "The load and the report",
        long,
        env = "LOADGATE_DEMO_MIX",
        value_name = "CLASS=SHARE,...",
        conflicts_with = "engines"
    )]
    pub mix: Option<crate::loadgen::ClassMix>,
    /// With --mix: the line's timeout per class (`critical=5000,standard=480,sheddable=480`, the
    /// frontend's --router-queue-timeout-ms form; a class not named: 0) instead of the computed one.
    #[arg(
        help_heading = "Shedding",
        long,
        env = "LOADGATE_DEMO_CLASS_TIMEOUTS_MS",
        value_name = "CLASS=MS,...",
        requires = "mix",
        value_parser = crate::frontend::queue_timeouts
    )]
    pub class_timeouts_ms: Option<loadgate::PerClass<u64>>,
    /// With --mix: the frontend's --sheddable-headroom (sheddable requests see each threshold x
    /// (1 - F)); 0: none.
    #[arg(
        help_heading = "Shedding",
        long,
        env = "LOADGATE_DEMO_SHEDDABLE_HEADROOM",
        value_name = "F",
        default_value_t = 0.0,
        requires = "mix",
        value_parser = headroom
    )]
    pub sheddable_headroom: f64,
    /// Tenants instead of the three modes (simulated workers): each tenant's share of the
    /// requests (`big=10,small=1`), each sending its name as its API key. At --tenants-level x
    /// capacity it runs each tenant alone at its share of that rate, then all together with a
    /// tenants file (every tenant weight 1: the line shares its dispatches among them), then all
    /// together without it (one shared line), thresholds and line every time; a table per tenant
    /// of SLO goodput together against alone (target: the smallest share keeps >= 90 %).
    #[arg(help_heading = "The load and the report", long, env = "LOADGATE_DEMO_TENANTS", value_name = "NAME=SHARE,...", conflicts_with_all = ["mix", "engines"])]
    pub tenants: Option<super::tenant_shares::TenantShares>,
    /// With --tenants: the offered load of every run, a multiple of the capacity (at most 10).
    #[arg(help_heading = "The load and the report", long, env = "LOADGATE_DEMO_TENANTS_LEVEL", value_name = "X", default_value_t = 2.0, requires = "tenants",
          value_parser = positive_multiple)]
    pub tenants_level: f64,
}

/// The most simulated workers (each a process).
pub(crate) const MAX_WORKERS: usize = 64;

/// The most requests per second the demo offers (its load generator and
/// pool share two cores).
const MAX_CAPACITY: f64 = 10_000.0;

/// `--capacity`: a positive number of requests per second, at most
/// [`MAX_CAPACITY`].
fn capacity(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 && x <= MAX_CAPACITY => Ok(x),
        _ => Err(format!("`{s}`: a number of requests per second above 0 and at most {MAX_CAPACITY}")),
    }
}

/// `--threshold`: a share of the KV cache in [0, 1], as the frontend's
/// `--active-decode-blocks-threshold` takes (checked here, before any pool
/// starts, not by the first frontend given it).
fn share(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(x) if (0.0..=1.0).contains(&x) => Ok(x),
        _ => Err(format!("`{s}`: a share of the KV cache, at least 0 and at most 1")),
    }
}

/// `--sheddable-headroom`: a share in [0, 1).
fn headroom(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(x) if (0.0..1.0).contains(&x) => Ok(x),
        _ => Err(format!("`{s}`: a share of each threshold, at least 0 and below 1")),
    }
}

/// The largest `--tenants-level`: at [`MAX_CAPACITY`] it offers the load
/// generator's largest rate.
const MAX_LEVEL: f64 = MAX_RATE / MAX_CAPACITY;

/// A positive multiple of the capacity, at most [`MAX_LEVEL`] (a larger
/// one had the load generator spawn arrivals without bound, gigabytes
/// within seconds).
fn positive_multiple(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(x) if x > 0.0 && x <= MAX_LEVEL => Ok(x),
        _ => Err(format!("`{s}`: a positive multiple of the capacity, at most {MAX_LEVEL}, as 2 or 0.5")),
    }
}

impl Args {
    /// Picks the simulated or the real-engine value.
    fn either<T>(&self, simulated: T, engines: T) -> T {
        if self.engines.is_some() {
            engines
        } else {
            simulated
        }
    }

    /// Seconds of arrivals per run.
    pub(crate) fn duration(&self) -> f64 {
        self.duration.unwrap_or(self.either(8.0, 20.0))
    }

    /// Seconds each run waits for in-flight requests after its arrivals.
    pub(crate) fn drain_timeout(&self) -> f64 {
        self.drain_timeout.unwrap_or(self.either(3.0, 30.0))
    }

    /// Prompt tokens per request.
    pub(crate) fn prompt_tokens(&self) -> u32 {
        self.prompt_tokens.unwrap_or(self.either(112, 32))
    }

    /// Output tokens per request.
    pub(crate) fn output_tokens(&self) -> u32 {
        self.output_tokens.unwrap_or(self.either(32, 64))
    }

    /// The frontend's `--router-mode`. With engines, `kv` (least loaded) compares a llama-server's
    /// slot tokens before its waiting requests, so the server whose slots hold the youngest
    /// sequences looks least loaded however long its queue, and gets nearly every request;
    /// round-robin splits the load evenly between the two identical servers.
    pub(crate) fn router_mode(&self) -> String {
        self.router_mode.clone().unwrap_or_else(|| self.either("kv", "round-robin").to_owned())
    }

    /// The objective of SLO goodput: the longest TTFT a request may have to count.
    pub(crate) fn slo_ttft(&self) -> Duration {
        Duration::from_millis(self.slo_ttft_ms.unwrap_or(self.either(500, 1000)))
    }

    /// Where the plot goes.
    pub(crate) fn plot(&self) -> PathBuf {
        self.plot.clone().unwrap_or_else(|| self.either("loadgate-demo.svg", "loadgate-demo-llamacpp.svg").into())
    }
}

/// Offered load levels, as multiples of the measured capacity.
pub(crate) const LEVELS: [f64; 4] = [0.5, 1.0, 2.0, 3.0];

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: Args,
        }
        Cli::try_parse_from(std::iter::once("demo").chain(args.iter().copied())).map(|c| c.args)
    }

    #[test]
    fn the_simulated_defaults_are_unchanged() {
        let args = parse(&[]).unwrap();
        assert_eq!(args.engines, None);
        assert_eq!((args.duration(), args.drain_timeout()), (8.0, 3.0));
        assert_eq!((args.prompt_tokens(), args.output_tokens()), (112, 32));
        assert_eq!(args.plot(), PathBuf::from("loadgate-demo.svg"));
        assert_eq!(args.slo_ttft(), Duration::from_millis(500));
        assert_eq!(args.router_queue_timeout_ms, None, "computed from the static mode's 0.5x run");
    }

    #[test]
    fn the_objective_and_the_line_have_flags() {
        let args = parse(&["--slo-ttft-ms", "300", "--router-queue-timeout-ms", "120", "--router-queue-limit", "64"]);
        let args = args.unwrap();
        assert_eq!(args.slo_ttft(), Duration::from_millis(300));
        assert_eq!((args.router_queue_timeout_ms, args.router_queue_limit), (Some(120), Some(64)));
        assert_eq!(parse(&["--engines", "llamacpp"]).unwrap().slo_ttft(), Duration::from_millis(1000));
        assert!(parse(&["--slo-ttft-ms", "0"]).is_err(), "an objective of 0 ms counts nothing");
    }

    #[test]
    fn tenants_have_a_level_and_run_alone() {
        let args = parse(&["--tenants", "big=10,small=1"]).unwrap();
        let tenants = args.tenants.unwrap();
        assert_eq!((tenants.count(), tenants.name(1), args.tenants_level), (2, "small", 2.0));
        assert_eq!(parse(&["--tenants", "a=1,b=1", "--tenants-level", "3"]).unwrap().tenants_level, 3.0);
        assert!(parse(&["--tenants-level", "3"]).is_err(), "needs --tenants");
        for level in ["0", "-1", "inf", "x", "NaN", "10.5", "1e9"] {
            assert!(parse(&["--tenants", "a=1,b=1", "--tenants-level", level]).is_err(), "{level}");
        }
        assert!(parse(&["--tenants", "a=1,b=1", "--mix", "critical=1"]).is_err(), "one or the other");
        assert!(parse(&["--tenants", "a=1,b=1", "--engines", "llamacpp"]).is_err(), "simulated workers only");
        assert!(parse(&["--tenants", "other=1,b=1"]).is_err(), "a name the frontend reserves");
    }

    #[test]
    fn engines_have_their_own_defaults_and_flags() {
        let args = parse(&["--engines", "llama.cpp", "--waiting-threshold", "3"]).unwrap();
        assert_eq!(args.engines, Some(Engines::LlamaCpp));
        assert_eq!(args.waiting_threshold, 3);
        assert_eq!(args.threshold, 0.85, "busy when none of a server's 4 slots is free");
        assert_eq!(args.prefill_threshold, 0);
        assert!(parse(&["--prefill-threshold", "2"]).is_err(), "engine-only flag");
        assert_eq!(parse(&["--engines", "llamacpp", "--threshold", "0.6"]).unwrap().threshold, 0.6);
        assert_eq!((args.prompt_tokens(), args.output_tokens()), (32, 64));
        assert_eq!((args.duration(), args.drain_timeout()), (20.0, 30.0));
        assert_eq!(parse(&["--engines", "llamacpp", "--duration", "5"]).unwrap().duration(), 5.0);
        assert!(parse(&["--engines", "vllm"]).is_err(), "only llama.cpp runs on this machine");
        assert!(parse(&["--engines", "llamacpp", "--workers", "2"]).is_err(), "simulated-only flag");
        assert!(parse(&["--waiting-threshold", "2"]).is_err(), "engine-only flag");
        assert!(parse(&["--engines", "llamacpp", "--scrape-interval-ms", "500"]).is_err(), "at most 100 ms");
    }
}
