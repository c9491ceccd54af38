//! Command-line arguments of `loadgate frontend`: listeners, TLS, workers,
//! engines and their scraping, router mode, the default busy thresholds,
//! migration and staleness, the admin API, the event plane's secret and
//! limits, and HTTP body limits.
//!
//! Every flag also reads an environment variable (a flag beats its
//! variable): Dynamo's `DYN_*` name where Dynamo has the flag, else
//! `LOADGATE_FRONTEND_<FLAG>`, also for the flag groups shared with the
//! worker (`env_names` renames them per command). Repeatable flags take a comma-separated
//! variable, except `--engine`, whose values hold commas
//! (`KIND=URL,model=NAME`): `LOADGATE_FRONTEND_ENGINE` separates them with
//! `;`. Booleans accept 1/true/yes/on and 0/false/no/off.

use std::path::PathBuf;
use std::time::Duration;

use clap::builder::BoolishValueParser;
use loadgate::{migration::DEFAULT_MIGRATION_LIMIT, BusyThresholds, LineLimits, PerClass, Policy};

use super::threshold_flag::{Fractional, Range, Threshold, Whole};
use crate::engines::scrape::ScrapeArgs;
use crate::engines::spec::EngineSpec;
use crate::http_server::HttpArgs;
use crate::upstream;

/// How the router picks among eligible workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RouterMode {
    /// Each in turn.
    RoundRobin,
    /// Uniformly at random.
    Random,
    /// The less loaded of two random workers (Dynamo's `power-of-two`).
    #[value(alias = "power-of-two")]
    P2c,
    /// The least loaded (by reported load).
    LeastLoaded,
    /// The least loaded, counting the router's own tracked load (KV-aware).
    Kv,
}

/// Dynamo's router modes that loadgate does not implement, refused by name.
const UNSUPPORTED_ROUTER_MODES: [&str; 2] = ["direct", "device-aware-weighted"];

/// Parses `--router-mode`: the [`RouterMode`] values and aliases, with a
/// clear refusal for Dynamo's modes loadgate does not have.
fn parse_router_mode(value: &str) -> Result<RouterMode, String> {
    use clap::ValueEnum as _;
    let names = "round-robin, random, p2c (alias power-of-two), least-loaded, kv";
    if UNSUPPORTED_ROUTER_MODES.iter().any(|m| m.eq_ignore_ascii_case(value.trim())) {
        return Err(format!("router mode `{value}` (Dynamo) is not supported by loadgate; use one of {names}"));
    }
    RouterMode::from_str(value.trim(), true).map_err(|_| format!("unknown router mode `{value}`; use one of {names}"))
}

/// How the frontend fills `Retry-After` on its refusals.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RetryAfterMode {
    /// From the recent rate at which requests finish and how many were refused, with jitter,
    /// bounded (docs/reliability.md has the formula).
    Computed,
    /// Always `Retry-After: 1` (the behaviour before; kept to measure the difference).
    Constant,
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
    /// Address the inference HTTP listener binds.
    #[arg(help_heading = "Listeners", long, env = "DYN_HTTP_HOST", default_value = "0.0.0.0")]
    pub http_host: String,
    /// Inference HTTP port (0 picks a free one).
    #[arg(help_heading = "Listeners", long, env = "DYN_HTTP_PORT", default_value_t = 8000)]
    pub http_port: u16,
    /// PEM certificate chain: serve the inference port over TLS (with --tls-key-path).
    #[arg(help_heading = "TLS", long, env = "DYN_TLS_CERT_PATH", value_name = "PATH", requires = "tls_key_path")]
    pub tls_cert_path: Option<PathBuf>,
    /// PEM private key of --tls-cert-path.
    #[arg(help_heading = "TLS", long, env = "DYN_TLS_KEY_PATH", value_name = "PATH", requires = "tls_cert_path")]
    pub tls_key_path: Option<PathBuf>,
    /// Address the event-plane listener binds (loopback only without an event secret).
    #[arg(
        help_heading = "Event plane and liveness",
        long,
        env = "LOADGATE_FRONTEND_EVENT_HOST",
        default_value = "127.0.0.1"
    )]
    pub event_host: String,
    /// Event-plane port where workers push load (0 picks a free one).
    #[arg(
        help_heading = "Event plane and liveness",
        long,
        env = "LOADGATE_FRONTEND_EVENT_PORT",
        default_value_t = 8001
    )]
    pub event_port: u16,
    /// The event plane (the TCP listener always runs; `nats` adds NATS) and how to reach NATS.
    #[command(flatten, next_help_heading = "Event plane and liveness")]
    pub(crate) nats: crate::nats::NatsArgs,
    /// With NATS: how frontends count their load together.
    #[command(flatten, next_help_heading = "Frontends sharing load (NATS)")]
    pub(crate) sharing: crate::nats::sharing::SharingArgs,
    /// File holding the event-plane secret (line 1: current, optional line 2: previous).
    /// Without it: LOADGATE_EVENT_SECRET and LOADGATE_EVENT_SECRET_PREVIOUS.
    #[arg(
        help_heading = "Event plane and liveness",
        long,
        env = "LOADGATE_FRONTEND_EVENT_SECRET_FILE",
        value_name = "PATH"
    )]
    pub event_secret_file: Option<PathBuf>,
    /// Address the admin listener (`/busy_threshold`) binds.
    #[arg(help_heading = "Listeners", long, env = "LOADGATE_FRONTEND_ADMIN_HOST", default_value = "127.0.0.1")]
    pub admin_host: String,
    /// Admin listener port (0 picks a free one).
    #[arg(help_heading = "Listeners", long, env = "LOADGATE_FRONTEND_ADMIN_PORT", default_value_t = 8002)]
    pub admin_port: u16,
    /// File holding the admin bearer token (first line, at least 16 bytes).
    /// Without it: LOADGATE_ADMIN_TOKEN. No token: the admin API is open to whoever reaches it
    /// by address (a request whose Host is a name other than localhost gets 403: DNS rebinding).
    #[arg(help_heading = "Listeners", long, env = "LOADGATE_FRONTEND_ADMIN_TOKEN_FILE", value_name = "PATH")]
    pub admin_token_file: Option<PathBuf>,
    /// No admin listener at all.
    #[arg(help_heading = "Listeners", long, env = "DYN_DISABLE_FRONTEND_ADMIN_API", value_parser = BoolishValueParser::new())]
    pub disable_admin_api: bool,
    /// Serve the admin API (`/busy_threshold`) on the inference port, as Dynamo does, instead of
    /// its own listener. Needs an admin token (--admin-token-file or LOADGATE_ADMIN_TOKEN): the
    /// inference port then changes state, for whoever holds the token.
    #[arg(help_heading = "Listeners", long, env = "LOADGATE_FRONTEND_ADMIN_ON_HTTP_PORT", value_parser = BoolishValueParser::new())]
    pub admin_on_http_port: bool,
    /// A worker to register from `URL/info` (repeatable); for workers not on the event plane.
    #[arg(
        help_heading = "Workers and engines",
        long = "worker",
        env = "LOADGATE_FRONTEND_WORKER",
        value_name = "URL",
        value_delimiter = ','
    )]
    pub workers: Vec<String>,
    /// A real inference engine to route to, scraped for its load (repeatable): KIND=URL[,model=NAME],
    /// KIND one of vllm, sglang, llamacpp. Without model=, every id of its /v1/models.
    /// In LOADGATE_FRONTEND_ENGINE, separate engines with `;`.
    #[arg(
        help_heading = "Workers and engines",
        long = "engine",
        env = "LOADGATE_FRONTEND_ENGINE",
        value_name = "KIND=URL[,model=NAME]",
        value_delimiter = ';'
    )]
    pub engines: Vec<EngineSpec>,
    /// How `--engine` engines are scraped.
    #[command(flatten, next_help_heading = "Workers and engines")]
    pub scrape: ScrapeArgs,
    /// Scrape an `--engine` engine again as soon as a request this frontend sent it ends (one
    /// scrape at a time, at most one per 10 ms; the next periodic one comes an interval
    /// later): a slot it freed is usually seen within one scrape, not up to an interval later.
    #[arg(help_heading = "Workers and engines", long, env = "LOADGATE_FRONTEND_ENGINE_SCRAPE_ON_END", value_parser = BoolishValueParser::new())]
    pub engine_scrape_on_end: bool,
    /// Seconds each `--engine` engine has at start to list its models (unless model= names one) and
    /// answer a scrape; past it, the frontend exits with an error. An engine still loading a large
    /// model may need minutes.
    #[arg(help_heading = "Workers and engines", long, env = "LOADGATE_FRONTEND_ENGINE_START_TIMEOUT_SECS", value_name = "SECS", default_value_t = 60, value_parser = crate::flag_limits::secs(1))]
    pub engine_start_timeout_secs: u64,
    /// A model to keep (repeatable): known before any worker serves it, never forgotten.
    #[arg(
        help_heading = "Workers and engines",
        long = "model",
        env = "LOADGATE_FRONTEND_MODEL",
        value_name = "NAME",
        value_delimiter = ','
    )]
    pub models: Vec<String>,
    /// Worker selection policy: round-robin, random, p2c (alias power-of-two), least-loaded, kv.
    #[arg(help_heading = "Shedding (every threshold: unset = off)", long, env = "DYN_ROUTER_MODE", default_value = "round-robin", value_parser = parse_router_mode)]
    pub router_mode: RouterMode,
    /// A worker rank is busy when active decode blocks / total blocks exceed this (0..=1).
    /// Unset (none) = off, as for every threshold.
    #[arg(help_heading = "Shedding (every threshold: unset = off)", long, env = "DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD", value_name = "SHARE|None", default_value = "none", value_parser = Fractional(Range::Share))]
    pub active_decode_blocks_threshold: Threshold<f64>,
    /// A worker rank is busy when active prefill tokens exceed this. Unset (none) = off.
    #[arg(help_heading = "Shedding (every threshold: unset = off)", long, env = "DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD", value_name = "TOKENS|None", default_value = "none", value_parser = Whole)]
    pub active_prefill_tokens_threshold: Threshold<u64>,
    /// A worker rank is busy when active prefill tokens exceed this fraction of
    /// max_num_batched_tokens. Unset (none) = off.
    #[arg(help_heading = "Shedding (every threshold: unset = off)", long, env = "DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC", value_name = "FRACTION|None", default_value = "none", value_parser = Fractional(Range::Fraction))]
    pub active_prefill_tokens_threshold_frac: Threshold<f64>,
    /// A worker rank is busy when the requests waiting in its engine's queue exceed this.
    /// Unset (none) = off.
    #[arg(help_heading = "Shedding (every threshold: unset = off)", long, env = "LOADGATE_FRONTEND_ACTIVE_WAITING_REQUESTS_THRESHOLD", value_name = "N|None", default_value = "none", value_parser = Whole)]
    pub active_waiting_requests_threshold: Threshold<u64>,
    /// The longest a request may wait (ms) for a busy model's worker to free, in the model's
    /// waiting line, before its 529; 0 (the default) answers 529 at once, as the reference
    /// does. One number for every class, or per class: `critical=5000,standard=2000,sheddable=0`
    /// (a class not named: 0). A model's own value can be set with `POST /busy_threshold`
    /// (`router_queue_timeout_ms`).
    #[arg(help_heading = "Waiting line (off by default: an instant 529)", long, env = "LOADGATE_FRONTEND_ROUTER_QUEUE_TIMEOUT_MS", value_name = "MS", default_value = "0", value_parser = queue_timeouts)]
    pub router_queue_timeout_ms: PerClass<u64>,
    /// Honour `x-loadgate-priority` (`critical` or a positive integer, `standard` or 0,
    /// `sheddable` or a negative integer) and, with --tenants-file, `x-loadgate-tenant` (a
    /// tenant of the file, for a request without a known key): only behind a gateway that sets
    /// or strips both, since any client can send them. Without, every request is `standard`
    /// (with --tenants-file, the priority header still counts up to the tenant's `max_class`).
    #[arg(help_heading = "Classes and tenants", long, env = "LOADGATE_FRONTEND_TRUST_PRIORITY_HEADER", value_parser = BoolishValueParser::new())]
    pub trust_priority_header: bool,
    /// The fraction F of each busy threshold kept from sheddable requests, in [0, 1): they see a
    /// worker as busy at each threshold × (1 − F), so they are refused first while the others
    /// still get in (529 reason `sheddable_headroom`). 0 (the default): no headroom.
    #[arg(
        help_heading = "Classes and tenants",
        long,
        env = "LOADGATE_FRONTEND_SHEDDABLE_HEADROOM",
        value_name = "F",
        default_value_t = 0.0
    )]
    pub sheddable_headroom: f64,
    /// Tenants and their API keys (TOML, or JSON if the name ends in `.json`): the
    /// `Authorization: Bearer` key decides a request's tenant (unknown or missing: `default`),
    /// which shares the waiting line's dispatches by weight, may be capped, and lowers the class
    /// its requests claim to its maximum. Checked at start; reloaded on SIGHUP (a bad file keeps
    /// the previous one). Format: docs/deployment.md "Tenants".
    #[arg(help_heading = "Classes and tenants", long, env = "LOADGATE_FRONTEND_TENANTS_FILE", value_name = "PATH")]
    pub tenants_file: Option<std::path::PathBuf>,
    /// Also read a request's class from its body's `nvext.agent_hints.priority` (NVIDIA Dynamo's
    /// field) when it has no `x-loadgate-priority`, in the named engine's order: `vllm` (lower
    /// values first: negative is critical, positive sheddable) or `sglang` (higher first).
    /// Needs --trust-priority-header.
    #[arg(
        help_heading = "Classes and tenants",
        long,
        env = "LOADGATE_FRONTEND_PRIORITY_FROM_NVEXT",
        value_enum,
        requires = "trust_priority_header"
    )]
    pub priority_from_nvext: Option<crate::frontend::priority::NvextOrder>,
    /// The most requests waiting in one model's line (past it: 529, reason `queue_full`).
    #[arg(help_heading = "Waiting line (off by default: an instant 529)", long, env = "LOADGATE_FRONTEND_ROUTER_QUEUE_LIMIT", value_name = "N", default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub router_queue_limit: u64,
    /// The most prompt tokens waiting in one model's line (past it: 529, reason `queue_full`);
    /// unset: no token limit.
    #[arg(help_heading = "Waiting line (off by default: an instant 529)", long, env = "LOADGATE_FRONTEND_ROUTER_QUEUE_TOKEN_LIMIT", value_name = "TOKENS", value_parser = clap::value_parser!(u64).range(1..))]
    pub router_queue_token_limit: Option<u64>,
    /// Compatibility: `none` disables busy detection (clears every threshold).
    #[arg(help_heading = "Shedding (every threshold: unset = off)", long, env = "DYN_ADMISSION_CONTROL", value_enum)]
    pub admission_control: Option<AdmissionControl>,
    /// In `kv` mode, also track blocks for output tokens as they stream.
    #[arg(help_heading = "Shedding (every threshold: unset = off)", long, env = "DYN_ROUTER_TRACK_OUTPUT_BLOCKS", value_parser = BoolishValueParser::new())]
    pub router_track_output_blocks: bool,
    /// How many workers may refuse one request (hard cap) before the client gets the overload status.
    #[arg(help_heading = "Shedding (every threshold: unset = off)", long, env = "DYN_MIGRATION_LIMIT", default_value_t = DEFAULT_MIGRATION_LIMIT)]
    pub migration_limit: usize,
    /// A worker rank whose last report is older than this counts as not reported; at least 1
    /// (unset: reports do not age).
    #[arg(help_heading = "Event plane and liveness", long, env = "LOADGATE_FRONTEND_LOAD_STALENESS_MS", value_name = "MS", value_parser = crate::flag_limits::ms(1))]
    pub load_staleness_ms: Option<u64>,
    /// Largest data-parallel size a worker may register with: 1 to 65536 (the frontend keeps
    /// state per rank).
    #[arg(help_heading = "Limits", long, env = "LOADGATE_FRONTEND_MAX_DP_SIZE", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=i64::from(loadgate::monitor::MAX_DP_SIZE)))]
    pub max_dp_size: u32,
    /// Open event-plane connections (pending ones included); at it, a new one evicts the oldest
    /// pending one, or is closed at once when all are authenticated.
    #[arg(help_heading = "Limits", long, env = "LOADGATE_FRONTEND_MAX_EVENT_CONNECTIONS", default_value_t = 1024, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_event_connections: usize,
    /// Registered workers (event plane and --worker together).
    #[arg(help_heading = "Limits", long, env = "LOADGATE_FRONTEND_MAX_WORKERS", default_value_t = 1024, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_workers: usize,
    /// Distinct models; a registration naming a new model past it is refused.
    #[arg(help_heading = "Limits", long, env = "LOADGATE_FRONTEND_MAX_MODELS", default_value_t = 256, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_models: usize,
    /// Bytes of a model name and of an HTTP address in a registration.
    #[arg(help_heading = "Limits", long, env = "LOADGATE_FRONTEND_MAX_NAME_LEN", default_value_t = 256)]
    pub max_name_len: usize,
    /// Bytes read per event connection per poll round (fair reading).
    #[arg(
        help_heading = "Limits",
        long,
        env = "LOADGATE_FRONTEND_EVENT_READ_BUDGET",
        value_name = "BYTES",
        default_value_t = 16384
    )]
    pub event_read_budget: usize,
    /// Event connections still in the handshake (no valid Proof yet, or, without a secret, no
    /// Register yet); past it, a new connection evicts the oldest of them.
    #[arg(help_heading = "Limits", long, env = "LOADGATE_FRONTEND_MAX_PENDING_HANDSHAKES", default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_pending_handshakes: u64,
    /// Close an established event connection that sends nothing for this long (ms); keep it at
    /// least 5x the workers' --heartbeat-ms.
    #[arg(help_heading = "Limits", long, env = "LOADGATE_FRONTEND_EVENT_IDLE_TIMEOUT_MS", value_name = "MS", default_value_t = 2000, value_parser = crate::flag_limits::ms(1))]
    pub event_idle_timeout_ms: u64,
    /// Largest request body, in MiB (larger: 413); at least 1.
    #[arg(help_heading = "Limits", long, env = "DYN_HTTP_BODY_LIMIT_MB", value_name = "MB", default_value_t = 192,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub http_body_limit_mb: usize,
    /// Bytes of request bodies buffered at once over all requests, in MiB (past it: 503).
    #[arg(
        help_heading = "Limits",
        long,
        env = "LOADGATE_FRONTEND_HTTP_BODY_BUDGET_MB",
        value_name = "MB",
        default_value_t = 1024
    )]
    pub http_body_budget_mb: usize,
    /// Seconds a request body may go without a byte arriving (past it: 408).
    #[arg(help_heading = "Limits", long, env = "LOADGATE_FRONTEND_HTTP_BODY_IDLE_TIMEOUT_SECS", value_name = "SECS", default_value_t = 10, value_parser = crate::flag_limits::secs(1))]
    pub http_body_idle_timeout_secs: u64,
    /// Seconds a whole request body may take to arrive (past it: 408).
    #[arg(help_heading = "Limits", long, env = "LOADGATE_FRONTEND_HTTP_BODY_TIMEOUT_SECS", value_name = "SECS", default_value_t = 120, value_parser = crate::flag_limits::secs(1))]
    pub http_body_timeout_secs: u64,
    /// The inference listener's header, idle and connection limits and the shutdown drain.
    #[command(flatten, next_help_heading = "HTTP server: timeouts and connections")]
    pub http: HttpArgs,
    /// Milliseconds a connection to a worker may take to open; past it (or refused), the request
    /// migrates to another worker.
    #[arg(help_heading = "Upstream timeouts", long, env = "LOADGATE_FRONTEND_UPSTREAM_CONNECT_TIMEOUT_MS", value_name = "MS", default_value_t = 2000, value_parser = crate::flag_limits::ms(1))]
    pub upstream_connect_timeout_ms: u64,
    /// Seconds a worker may take to send the response head and first byte (the time to first
    /// token); past it: 504.
    #[arg(help_heading = "Upstream timeouts", long, env = "LOADGATE_FRONTEND_UPSTREAM_FIRST_BYTE_TIMEOUT_SECS", value_name = "SECS", default_value_t = 120, value_parser = crate::flag_limits::secs(1))]
    pub upstream_first_byte_timeout_secs: u64,
    /// Seconds a worker's response may go without a byte between two chunks; past it the
    /// response is cut.
    #[arg(help_heading = "Upstream timeouts", long, env = "LOADGATE_FRONTEND_UPSTREAM_CHUNK_TIMEOUT_SECS", value_name = "SECS", default_value_t = 60, value_parser = crate::flag_limits::secs(1))]
    pub upstream_chunk_timeout_secs: u64,
    /// Milliseconds an event connection may stay silent before its worker leaves routing (it
    /// rejoins with its next frame); at most --event-idle-timeout-ms, at least a few of the
    /// workers' --heartbeat-ms.
    #[arg(help_heading = "Event plane and liveness", long, env = "LOADGATE_FRONTEND_EVENT_SILENCE_MS", value_name = "MS", default_value_t = 1000, value_parser = crate::flag_limits::ms(1))]
    pub event_silence_ms: u64,
    /// Milliseconds between active health checks (`GET URL/health`) of each --worker worker;
    /// two failures in a row take it out of routing, one success brings it back. 0: none.
    #[arg(help_heading = "Event plane and liveness", long, env = "LOADGATE_FRONTEND_WORKER_HEALTH_CHECK_MS", value_name = "MS", default_value_t = 1000, value_parser = crate::flag_limits::ms(0))]
    pub worker_health_check_ms: u64,
    /// How refusals fill `Retry-After` and `retry-after-ms`: computed (spread), or constant (1 s).
    #[arg(
        help_heading = "Shedding (every threshold: unset = off)",
        long,
        env = "LOADGATE_FRONTEND_RETRY_AFTER_MODE",
        value_enum,
        default_value = "computed"
    )]
    pub retry_after_mode: RetryAfterMode,
}

impl Args {
    /// Whether this frontend shares its load with the others (NATS plane
    /// and `--share-load`).
    pub(crate) fn shares_load(&self) -> bool {
        self.nats.is_nats() && self.sharing.share_load
    }

    /// Whether the retry hint works from the pool's figures (sharing load,
    /// `--retry-hint-scope pool`).
    pub(crate) fn pool_hint(&self) -> bool {
        self.shares_load() && self.sharing.retry_hint_scope == crate::nats::sharing::HintScope::Pool
    }

    /// The bounds on every wait for a worker (`--upstream-*`): connect, a
    /// refused or timed-out connection migrates the request (and quarantines
    /// the worker for a second); first byte, the response head and its first
    /// body bytes (the first token of a stream, the whole answer otherwise),
    /// else 504 without migrating (the worker took it); between chunks, a
    /// relayed response is cut when its worker sends nothing this long.
    pub fn upstream_timeouts(&self) -> upstream::Timeouts {
        upstream::Timeouts {
            connect: Duration::from_millis(self.upstream_connect_timeout_ms),
            first_byte: Duration::from_secs(self.upstream_first_byte_timeout_secs),
            between_chunks: Duration::from_secs(self.upstream_chunk_timeout_secs),
        }
    }

    /// The thresholds every model starts with.
    pub fn default_thresholds(&self) -> BusyThresholds {
        if self.admission_control == Some(AdmissionControl::None) {
            return BusyThresholds::default();
        }
        BusyThresholds {
            active_decode_blocks_threshold: self.active_decode_blocks_threshold.0,
            active_prefill_tokens_threshold: self.active_prefill_tokens_threshold.0,
            active_prefill_tokens_threshold_frac: self.active_prefill_tokens_threshold_frac.0,
            active_waiting_requests_threshold: self.active_waiting_requests_threshold.0,
        }
    }

    /// What each model's waiting line holds.
    pub(crate) fn line_limits(&self) -> LineLimits {
        LineLimits {
            max_waiting: usize::try_from(self.router_queue_limit).unwrap_or(usize::MAX),
            max_tokens: self.router_queue_token_limit.unwrap_or(u64::MAX),
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

/// `--router-queue-timeout-ms`: one number or `CLASS=MS,...`, each at most
/// a day (also the demo's `--class-timeouts-ms`, which it passes on).
pub(crate) fn queue_timeouts(value: &str) -> Result<PerClass<u64>, String> {
    let timeouts: PerClass<u64> = value.parse().map_err(|e: loadgate::class::PerClassError| e.to_string())?;
    let max = loadgate::patch::MAX_QUEUE_TIMEOUT_MS;
    match timeouts.0.iter().find(|ms| **ms > max) {
        Some(ms) => Err(format!("{ms} ms is more than a day ({max} ms)")),
        None => Ok(timeouts),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The frontend's arguments from `args` (the program name left out).
    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: Args,
        }
        Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied())).map(|c| c.args)
    }

    #[test]
    fn admission_control_none_clears_thresholds() {
        let args = parse(&["--active-decode-blocks-threshold", "0.85", "--router-mode", "kv"]).unwrap();
        assert_eq!(args.default_thresholds().active_decode_blocks_threshold, Some(0.85));
        assert_eq!(args.router_mode, RouterMode::Kv);
        let args = parse(&["--active-decode-blocks-threshold", "0.85", "--admission-control", "none"]).unwrap();
        assert!(args.default_thresholds().is_empty());
    }

    #[test]
    fn router_mode_takes_dynamo_spellings_and_refuses_the_rest() {
        assert_eq!(parse_router_mode("power-of-two"), Ok(RouterMode::P2c));
        assert_eq!(parse_router_mode("P2C"), Ok(RouterMode::P2c));
        assert_eq!(parse_router_mode("least-loaded"), Ok(RouterMode::LeastLoaded));
        for mode in UNSUPPORTED_ROUTER_MODES {
            let error = parse_router_mode(mode).unwrap_err();
            assert!(error.contains("not supported") && error.contains(mode), "{error}");
        }
        assert!(parse_router_mode("fastest").unwrap_err().contains("unknown router mode"));
    }

    #[test]
    fn engines_repeat_and_scrape_flags_default() {
        let args = parse(&["--engine", "llamacpp=127.0.0.1:1,model=a", "--engine", "vllm=h:2"]).unwrap();
        let engines: Vec<String> = args.engines.iter().map(ToString::to_string).collect();
        assert_eq!(engines, ["llamacpp=http://127.0.0.1:1,model=a", "vllm=http://h:2"]);
        let config = args.scrape.config();
        assert_eq!(config.interval, std::time::Duration::from_millis(50));
        assert_eq!(config.timeout, std::time::Duration::from_millis(500));
        assert_eq!(config.failures_to_leave, 3);
        assert!(parse(&["--engine", "tgi=h:1"]).is_err());
        assert!(parse(&["--engine-scrape-failures", "0"]).is_err());
    }

    /// Found by a review: the flag's help said it trusts `x-loadgate-priority`
    /// only, so an operator behind a gateway that strips that header alone
    /// (as the help asked) let any client name a tenant of the file in
    /// `x-loadgate-tenant` (its `max_class`, weight and caps).
    #[test]
    fn trusting_the_priority_header_says_it_trusts_the_tenant_header_too() {
        use clap::CommandFactory;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: Args,
        }
        let command = Cli::command();
        let flag = command.get_arguments().find(|a| a.get_id() == "trust_priority_header").expect("the flag");
        let help = flag.get_help().expect("its help").to_string();
        assert!(help.contains("x-loadgate-tenant"), "{help}");
    }

    /// A body limit of 0 refused every POST with 413: refused at start.
    #[test]
    fn the_body_limit_is_at_least_one_mib() {
        assert!(parse(&["--http-body-limit-mb", "0"]).is_err());
        assert_eq!(parse(&["--http-body-limit-mb", "1"]).unwrap().http_body_limit_mb, 1);
    }

    #[test]
    fn duration_flags_stop_at_one_day() {
        // A deadline is `now + timeout`: near u64::MAX seconds it would overflow the clock.
        for flag in ["--upstream-chunk-timeout-secs", "--upstream-first-byte-timeout-secs", "--http-idle-timeout-secs"]
        {
            assert!(parse(&[flag, "86400"]).is_ok(), "{flag} takes a day");
            assert!(parse(&[flag, "86401"]).is_err(), "{flag} refuses more");
            assert!(parse(&[flag, &u64::MAX.to_string()]).is_err(), "{flag}");
        }
        for flag in ["--upstream-connect-timeout-ms", "--engine-scrape-timeout-ms", "--load-staleness-ms"] {
            assert!(parse(&[flag, "86400000"]).is_ok(), "{flag} takes a day");
            assert!(parse(&[flag, "86400001"]).is_err(), "{flag} refuses more");
        }
        assert!(parse(&["--graceful-shutdown-timeout-secs", "0"]).is_ok(), "0 still means no wait");
    }

    /// A limit of 0 would refuse every connection, worker or model in
    /// silence: refused at start, with the flag named.
    #[test]
    fn peer_limits_are_at_least_one() {
        for flag in ["--max-event-connections", "--max-workers", "--max-models"] {
            let error = parse(&[flag, "0"]).err().unwrap_or_else(|| panic!("{flag} 0 was accepted"));
            assert!(error.to_string().contains(flag), "{error}");
            assert!(parse(&[flag, "1"]).is_ok(), "{flag} 1");
        }
        let args = parse(&[]).unwrap();
        assert_eq!((args.max_event_connections, args.max_workers, args.max_models), (1024, 1024, 256));
    }

    /// `--max-dp-size` had no bounds: 0 refused every worker in silence,
    /// and a value over the monitor's own bound (65536) let every Register
    /// past the flag only to be refused by the monitor. Both refused at
    /// start, with the flag named.
    #[test]
    fn the_dp_size_limit_is_within_the_monitors() {
        for bad in ["0", "65537", "4294967295"] {
            let error =
                parse(&["--max-dp-size", bad]).err().unwrap_or_else(|| panic!("--max-dp-size {bad} was accepted"));
            assert!(error.to_string().contains("--max-dp-size"), "{error}");
        }
        assert_eq!(parse(&["--max-dp-size", "1"]).unwrap().max_dp_size, 1);
        assert_eq!(parse(&["--max-dp-size", "65536"]).unwrap().max_dp_size, 65536);
        assert_eq!(parse(&[]).unwrap().max_dp_size, 256);
    }
}
