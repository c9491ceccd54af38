//! What a benchmark run does: the `loadgate bench` arguments, the
//! [`BenchConfig`] (open loop) or [`StormConfig`] (`--retry-storm`) they
//! become, and the request body every request sends.

use std::path::PathBuf;
use std::time::Duration;

use crate::flag_limits;
use crate::loadgen::mix::ClassMix;
use crate::loadgen::tenants::TenantMix;

/// Command-line arguments of `loadgate bench`. Every flag also reads
/// `LOADGATE_BENCH_<FLAG>` (a flag beats its variable).
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Base URL of a frontend or worker (or a full `/v1/...completions` URL).
    #[arg(help_heading = "Target", long, env = "LOADGATE_BENCH_URL")]
    pub url: String,
    /// Model name sent in every request.
    #[arg(help_heading = "Target", long, env = "LOADGATE_BENCH_MODEL")]
    pub model: String,
    /// Mean arrival rate, requests per second (open loop; not with --retry-storm).
    #[arg(
        help_heading = "Load (open loop)",
        long,
        env = "LOADGATE_BENCH_RATE",
        required_unless_present = "retry_storm",
        conflicts_with = "retry_storm"
    )]
    pub rate: Option<f64>,
    /// Seconds during which requests arrive; with --retry-storm, the storm's bound: no attempt
    /// starts after it (default 60 s there).
    #[arg(
        help_heading = "Load (open loop)",
        long,
        env = "LOADGATE_BENCH_DURATION",
        required_unless_present = "retry_storm"
    , value_parser = crate::flag_limits::fractional_secs())]
    pub duration: Option<f64>,
    /// Prompt length in tokens (words).
    /// At most 16,000,000 (a request of about 96 MB, under the servers' default body limit).
    #[arg(help_heading = "Load (open loop)", long, env = "LOADGATE_BENCH_PROMPT_TOKENS", default_value_t = 128,
          value_parser = clap::value_parser!(u32).range(0..=MAX_PROMPT_TOKENS))]
    pub prompt_tokens: u32,
    /// Tokens to generate per request (1 to 2^31 - 1, the `max_tokens` every server takes).
    #[arg(help_heading = "Load (open loop)", long, env = "LOADGATE_BENCH_OUTPUT_TOKENS", default_value_t = 32,
          value_parser = clap::value_parser!(u32).range(1..=MAX_OUTPUT_TOKENS))]
    pub output_tokens: u32,
    /// Stream responses (SSE); TTFT is then the first streamed bytes.
    #[arg(help_heading = "Load (open loop)", long, env = "LOADGATE_BENCH_STREAM", value_parser = clap::builder::BoolishValueParser::new())]
    pub stream: bool,
    /// Print one JSON object (on stdout) instead of the table; the progress stays on stderr
    /// (--quiet turns it off).
    #[arg(help_heading = "Report", long, env = "LOADGATE_BENCH_JSON", value_parser = clap::builder::BoolishValueParser::new())]
    pub json: bool,
    /// No progress on stderr. Without it, a run shows its elapsed time and its requests sent, ok
    /// (2xx), rejected (other statuses) and errors: a bar refreshed every second on a terminal,
    /// else one line every 5 s. The exit status is 1 when no request got an HTTP answer.
    #[arg(help_heading = "Report", long, env = "LOADGATE_BENCH_QUIET", value_parser = clap::builder::BoolishValueParser::new())]
    pub quiet: bool,
    /// The time-to-first-token objective: the report adds SLO goodput, the requests completed
    /// with their first token within it per second of arrivals (as the demo's headline). Not
    /// with --retry-storm.
    #[arg(
        help_heading = "Report",
        long,
        env = "LOADGATE_BENCH_SLO_TTFT_MS",
        value_name = "MS",
        value_parser = crate::flag_limits::ms(1),
        conflicts_with = "retry_storm"
    )]
    pub slo_ttft_ms: Option<u64>,
    /// Draw latency percentiles and the rejection rate over time (SVG).
    #[arg(help_heading = "Report", long, env = "LOADGATE_BENCH_PLOT", value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// The most requests in flight at once (1 to 1,000,000): an arrival past it is not sent and
    /// counts as a transport error, so a server that answers nothing cannot grow the load generator
    /// (about 25 KiB a request in flight) without bound. Not with --retry-storm.
    #[arg(help_heading = "Load (open loop)", long, env = "LOADGATE_BENCH_MAX_IN_FLIGHT",
          default_value_t = DEFAULT_MAX_IN_FLIGHT, conflicts_with = "retry_storm",
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_in_flight: u64,
    /// Seconds to wait for in-flight requests after the last arrival.
    #[arg(help_heading = "Load (open loop)", long, env = "LOADGATE_BENCH_DRAIN_TIMEOUT", default_value_t = 10.0, value_parser = crate::flag_limits::fractional_secs())]
    pub drain_timeout: f64,
    /// Seed of the arrival process (default: random).
    #[arg(help_heading = "Load (open loop)", long, env = "LOADGATE_BENCH_SEED")]
    pub seed: Option<u64>,
    /// Retry-storm mode: CLIENTS clients each send one request at the same instant and, on 529,
    /// 503 or 429, wait what `retry-after-ms` says (else `Retry-After`, else --retry-fallback-ms) and
    /// send it again, until success, --max-attempts or --duration. Reports the peak number of
    /// retries in any 10 ms window, goodput and time to success.
    #[arg(help_heading = "Retry storm", long, env = "LOADGATE_BENCH_RETRY_STORM", value_name = "CLIENTS",
          value_parser = clap::value_parser!(u32).range(1..=MAX_STORM_CLIENTS))]
    pub retry_storm: Option<u32>,
    /// With --retry-storm: attempts per client, the first included.
    #[arg(help_heading = "Retry storm", long, env = "LOADGATE_BENCH_MAX_ATTEMPTS", default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub max_attempts: u32,
    /// With --retry-storm: milliseconds to wait before a retry when a refusal carries no usable
    /// hint (none, unparsable, or above 60 s), and after a transport error or timeout.
    #[arg(help_heading = "Retry storm", long, env = "LOADGATE_BENCH_RETRY_FALLBACK_MS", value_name = "MS", default_value_t = 1000, value_parser = crate::flag_limits::ms(0))]
    pub retry_fallback_ms: u64,
    /// With --retry-storm: seconds one attempt may take (connect to last byte); past it the
    /// attempt counts as a timeout and is retried.
    #[arg(
        help_heading = "Retry storm",
        long,
        env = "LOADGATE_BENCH_REQUEST_TIMEOUT",
        value_name = "SECS",
        default_value_t = 30.0
    , value_parser = crate::flag_limits::fractional_secs())]
    pub request_timeout: f64,
    /// Priority classes: each request's class drawn with these shares
    /// (`critical=0.3,standard=0.4,sheddable=0.3`) and sent in `x-loadgate-priority` (a
    /// frontend honours it with --trust-priority-header); the report counts each class apart.
    #[arg(
        help_heading = "Load (open loop)",
        long,
        env = "LOADGATE_BENCH_MIX",
        value_name = "CLASS=SHARE,...",
        conflicts_with = "retry_storm"
    )]
    pub mix: Option<ClassMix>,
    /// Tenants: each request's tenant drawn with these shares (`a=10,b=1`; names of 1 to 64
    /// characters among a-z, 0-9, _ and -, at most 64 tenants), independently of its class, and
    /// sent both as `Authorization: Bearer <name>` and in `x-loadgate-tenant` (a frontend finds
    /// it by key with a tenants file, by the header with --trust-priority-header). The key sent
    /// is the tenant's name: its tenants-file entry's key is `sha256:` and the SHA-256 of the
    /// name. The report counts each tenant apart.
    #[arg(
        help_heading = "Load (open loop)",
        long,
        env = "LOADGATE_BENCH_TENANTS",
        value_name = "NAME=SHARE,...",
        conflicts_with = "retry_storm"
    )]
    pub tenants: Option<TenantMix>,
    /// With --retry-storm: more frontends of the same pool (repeatable; or comma-separated in
    /// LOADGATE_BENCH_ALSO_URL): client i starts at the i-th URL of --url and these, and each retry
    /// goes to the next one, as a load balancer would spread them.
    #[arg(
        help_heading = "Target",
        long,
        env = "LOADGATE_BENCH_ALSO_URL",
        value_delimiter = ',',
        requires = "retry_storm"
    )]
    pub also_url: Vec<String>,
}

/// Most prompt tokens (words) a request has: about 96 MB, under the servers'
/// default body limit.
pub const MAX_PROMPT_TOKENS: i64 = 16_000_000;
/// Most tokens a request asks to generate: the `max_tokens` every server takes.
pub const MAX_OUTPUT_TOKENS: i64 = crate::openai::MAX_TOKENS_LIMIT as i64;

/// `--max-in-flight` when not given: about 250 MiB of requests in flight.
pub const DEFAULT_MAX_IN_FLIGHT: u64 = 10_000;

/// Most clients `--retry-storm` takes (each holds a connection).
pub const MAX_STORM_CLIENTS: i64 = 20_000;
/// The storm's bound when `--retry-storm` is given without `--duration`.
pub const DEFAULT_STORM_SECS: f64 = 60.0;

/// What one benchmark run does.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// The completions URL requests go to.
    pub url: String,
    /// Model name.
    pub model: String,
    /// Mean arrival rate (requests per second).
    pub rate: f64,
    /// Arrival window.
    pub duration: Duration,
    /// Prompt tokens per request.
    pub prompt_tokens: u32,
    /// Output tokens per request.
    pub output_tokens: u32,
    /// Stream (SSE) or not.
    pub stream: bool,
    /// How long to wait for in-flight requests after the window; the rest
    /// are abandoned (their connections closed) and counted unfinished.
    pub drain_timeout: Duration,
    /// Seed of the arrival process.
    pub seed: u64,
    /// The most requests in flight at once; an arrival past it is not
    /// sent, and counts as a transport error.
    pub max_in_flight: u64,
    /// Show the run's progress on stderr (`progress.rs`).
    pub progress: bool,
    /// The share of requests in each priority class (`None`: no class
    /// sent, every request standard).
    pub mix: Option<ClassMix>,
    /// The share of requests each tenant sends (`None`: no key and no
    /// tenant sent).
    pub tenants: Option<TenantMix>,
    /// More frontends of the same pool (completions URLs): the requests are
    /// spread over `url` and these in turn (a client-side load balancer).
    pub also: Vec<String>,
    /// The TTFT objective the report's SLO goodput counts against (`None`:
    /// no SLO goodput in the report).
    pub slo_ttft: Option<Duration>,
    /// Send through the proxy that `HTTP_PROXY`, `HTTPS_PROXY` or
    /// `ALL_PROXY` names (unless `NO_PROXY` exempts the host): `bench` does,
    /// a client like `curl`; the demo does not (its frontends are its own
    /// children on 127.0.0.1). See docs/deployment.md, "Proxy variables".
    pub proxy_from_env: bool,
}

impl BenchConfig {
    /// Where the `i`-th request (or closed-loop client) goes.
    pub fn url_for(&self, i: usize) -> &str {
        match i % (1 + self.also.len()) {
            0 => &self.url,
            k => &self.also[k - 1],
        }
    }
}

/// The highest `--rate`: past it one process spawns arrivals faster than it
/// can send them, and its memory grows with every arrival (a demo at 3x its
/// largest capacity offers 30,000).
pub const MAX_RATE: f64 = 100_000.0;

impl BenchConfig {
    /// The configuration `args` describe.
    ///
    /// # Errors
    ///
    /// A rate or duration that is not a positive number, or a rate past
    /// [`MAX_RATE`].
    pub fn from_args(args: &Args) -> anyhow::Result<Self> {
        let rate = args.rate.unwrap_or(0.0);
        anyhow::ensure!(
            rate.is_finite() && rate > 0.0 && rate <= MAX_RATE,
            "--rate must be a positive number of requests per second, at most {MAX_RATE}"
        );
        Ok(BenchConfig {
            url: target_url(&args.url, "--url")?,
            model: args.model.clone(),
            rate,
            duration: flag_limits::seconds(args.duration.unwrap_or(0.0), "--duration", false)?,
            prompt_tokens: args.prompt_tokens,
            output_tokens: args.output_tokens,
            stream: args.stream,
            drain_timeout: flag_limits::seconds(args.drain_timeout, "--drain-timeout", true)?,
            seed: args.seed.unwrap_or_else(|| fastrand::u64(..)),
            max_in_flight: args.max_in_flight,
            progress: !args.quiet,
            mix: args.mix,
            tenants: args.tenants.clone(),
            also: Vec::new(),
            slo_ttft: args.slo_ttft_ms.map(Duration::from_millis),
            proxy_from_env: true,
        })
    }
}

/// What one retry storm does (`--retry-storm`).
#[derive(Clone, Debug)]
pub struct StormConfig {
    /// The request every client sends (`rate` and `seed` unused).
    pub request: BenchConfig,
    /// Clients, all starting at once.
    pub clients: u32,
    /// Attempts per client, the first included.
    pub max_attempts: u32,
    /// Wait before a retry when the refusal has no usable hint.
    pub fallback: Duration,
    /// Bound on one attempt.
    pub request_timeout: Duration,
    /// Every frontend's completions URL (`request.url` first), spread over.
    pub urls: Vec<String>,
}

impl StormConfig {
    /// The storm `args` describe (`None` without `--retry-storm`).
    ///
    /// # Errors
    ///
    /// A duration, drain timeout or request timeout that is not a positive number.
    pub fn from_args(args: &Args) -> anyhow::Result<Option<Self>> {
        let Some(clients) = args.retry_storm else { return Ok(None) };
        let request = BenchConfig {
            url: target_url(&args.url, "--url")?,
            model: args.model.clone(),
            rate: 0.0,
            duration: flag_limits::seconds(args.duration.unwrap_or(DEFAULT_STORM_SECS), "--duration", false)?,
            prompt_tokens: args.prompt_tokens,
            output_tokens: args.output_tokens,
            stream: args.stream,
            drain_timeout: flag_limits::seconds(args.drain_timeout, "--drain-timeout", true)?,
            seed: 0,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            progress: !args.quiet,
            mix: None,
            tenants: None,
            also: Vec::new(),
            slo_ttft: None,
            proxy_from_env: true,
        };
        Ok(Some(StormConfig {
            request,
            clients,
            max_attempts: args.max_attempts,
            fallback: Duration::from_millis(args.retry_fallback_ms),
            request_timeout: flag_limits::seconds(args.request_timeout, "--request-timeout", false)?,
            urls: std::iter::once(&args.url)
                .map(|u| target_url(u, "--url"))
                .chain(args.also_url.iter().map(|u| target_url(u, "--also-url")))
                .collect::<anyhow::Result<_>>()?,
        }))
    }
}

/// `base` as a completions URL (kept as is when it already names an endpoint).
pub fn completions_url(base: &str) -> String {
    let base = base.trim_end_matches('/');
    let base = if base.contains("://") { base.to_owned() } else { format!("http://{base}") };
    if base.ends_with("/completions") {
        base
    } else {
        format!("{base}/v1/completions")
    }
}

/// `base` (the value of `flag`) as a completions URL, once it is a URL the
/// bench can send to: `http` or `https` (or no scheme), with a host and a
/// valid port. Checked before the run: every request of a run to a URL that
/// is none would fail, and an empty one would name the host `v1`.
///
/// # Errors
///
/// `base` is not such a URL.
fn target_url(base: &str, flag: &str) -> anyhow::Result<String> {
    let trimmed = base.trim();
    let with_scheme = if trimmed.contains("://") { trimmed.to_owned() } else { format!("http://{trimmed}") };
    let url = reqwest::Url::parse(&with_scheme).map_err(|e| anyhow::anyhow!("{flag} `{base}`: {e}"))?;
    anyhow::ensure!(
        matches!(url.scheme(), "http" | "https") && url.host_str().is_some_and(|h| !h.is_empty()),
        "{flag} `{base}`: an http:// or https:// URL with a host, as http://127.0.0.1:8000"
    );
    Ok(completions_url(trimmed))
}

/// The request body: a prompt of `prompt_tokens` words (one user message
/// when the URL is a chat endpoint).
pub(crate) fn request_body(config: &BenchConfig) -> String {
    let prompt = "hello ".repeat(config.prompt_tokens as usize);
    let prompt = prompt.trim_end().to_owned();
    let mut body = serde_json::json!({
        "model": config.model,
        "max_tokens": config.output_tokens,
        "stream": config.stream,
    });
    if config.stream {
        // The usage (the output-token count) comes in a stream's last chunk only when asked, as OpenAI's.
        body["stream_options"] = serde_json::json!({"include_usage": true});
    }
    if config.url.ends_with("/chat/completions") {
        body["messages"] = serde_json::json!([{"role": "user", "content": prompt}]);
    } else {
        body["prompt"] = serde_json::Value::String(prompt);
    }
    body.to_string()
}

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
        let base = ["bench", "--url", "http://a:1", "--model", "m"];
        Cli::try_parse_from(base.iter().chain(args)).map(|c| c.args)
    }

    #[test]
    fn retry_storm_needs_no_rate_and_takes_none() {
        let args = parse(&["--retry-storm", "300", "--max-attempts", "5"]).unwrap();
        let storm = StormConfig::from_args(&args).unwrap().unwrap();
        assert_eq!((storm.clients, storm.max_attempts), (300, 5));
        assert_eq!(storm.request.duration, Duration::from_secs_f64(DEFAULT_STORM_SECS));
        assert_eq!(storm.fallback, Duration::from_secs(1));
        assert!(parse(&["--retry-storm", "300", "--rate", "5"]).is_err(), "--rate conflicts with --retry-storm");
        assert!(parse(&["--retry-storm", "0"]).is_err());
        assert!(parse(&["--duration", "5"]).is_err(), "the open loop needs --rate");
        let open = parse(&["--rate", "5", "--duration", "2"]).unwrap();
        assert!(StormConfig::from_args(&open).unwrap().is_none());
        assert_eq!(BenchConfig::from_args(&open).unwrap().rate, 5.0);
    }

    #[test]
    fn tenants_come_from_the_flag_and_not_with_a_storm() {
        let args = parse(&["--rate", "5", "--duration", "2", "--tenants", "a=10,b=1"]).unwrap();
        let tenants = BenchConfig::from_args(&args).unwrap().tenants.expect("tenants");
        assert_eq!((tenants.len(), tenants.name(1)), (2, "b"));
        let without = parse(&["--rate", "5", "--duration", "2"]).unwrap();
        assert!(BenchConfig::from_args(&without).unwrap().tenants.is_none());
        let error = parse(&["--rate", "5", "--duration", "2", "--tenants", "A=1"]).expect_err("a bad name");
        assert!(error.to_string().contains("a tenant name is 1 to 64 characters"), "{error}");
        assert!(parse(&["--retry-storm", "3", "--tenants", "a=1"]).is_err(), "--tenants conflicts with --retry-storm");
    }

    #[test]
    fn a_url_the_bench_cannot_send_to_is_refused() {
        for bad in ["", " ", "ftp://127.0.0.1:9", "http://a b", "127.0.0.1:99999", "http://"] {
            let mut args = parse(&["--rate", "5", "--duration", "2"]).unwrap();
            args.url = bad.to_owned();
            let error = BenchConfig::from_args(&args).expect_err(bad).to_string();
            assert!(error.starts_with(&format!("--url `{bad}`")), "{error}");
        }
        let storm = parse(&["--retry-storm", "2", "--also-url", "http://a:1,ftp://b"]).unwrap();
        let error = StormConfig::from_args(&storm).expect_err("ftp").to_string();
        assert!(error.starts_with("--also-url `ftp://b`"), "{error}");
        let mut good = parse(&["--rate", "5", "--duration", "2"]).unwrap();
        good.url = " https://a:1/ ".to_owned();
        assert_eq!(BenchConfig::from_args(&good).unwrap().url, "https://a:1/v1/completions");
    }

    #[test]
    fn completions_url_names_an_endpoint() {
        assert_eq!(completions_url("http://a:1/"), "http://a:1/v1/completions");
        assert_eq!(completions_url("127.0.0.1:9"), "http://127.0.0.1:9/v1/completions");
        assert_eq!(completions_url("http://a/v1/chat/completions"), "http://a/v1/chat/completions");
    }
}
