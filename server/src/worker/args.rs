//! Command-line arguments of `loadgate worker`: the model, listener and
//! advertised address, frontends, the event secret, the engine physics, the
//! hard cap, and the real engine a sidecar fronts (`--engine`, its timeouts
//! and scraping).
//!
//! Every flag also reads `LOADGATE_WORKER_<FLAG>` (a flag beats its
//! variable; `--frontend` takes a comma-separated variable), except
//! `--http-body-limit-mb`, which reads Dynamo's `DYN_HTTP_BODY_LIMIT_MB` like
//! the frontend's.

use std::path::PathBuf;
use std::time::Duration;

use crate::engines::scrape::ScrapeArgs;
use crate::engines::spec::EngineSpec;
use crate::http_server::HttpArgs;
use crate::upstream::Timeouts;
use crate::worker::sim::SimConfig;

/// Command-line arguments of `loadgate worker`.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// The model this worker serves. With --engine: a name the engine accepts (default: the
    /// first id of its /v1/models, or its model=NAME); required without --engine.
    #[arg(
        help_heading = "Serving (a simulated engine, or a real one with --engine)",
        long,
        env = "LOADGATE_WORKER_MODEL",
        required_unless_present = "engine"
    )]
    pub model: Option<String>,
    /// Front a real engine instead of running the simulator: KIND=URL[,model=NAME], KIND one of
    /// vllm, sglang, llamacpp (`llamacpp=127.0.0.1:8080`). Requests pass the hard cap, then go
    /// to the engine's same path; its scraped load (plus the cap's queue) is reported.
    #[arg(
        help_heading = "Serving (a simulated engine, or a real one with --engine)",
        long,
        env = "LOADGATE_WORKER_ENGINE",
        value_name = "KIND=URL"
    )]
    pub engine: Option<EngineSpec>,
    /// Milliseconds a connection to the engine may take to open (--engine).
    #[arg(help_heading = "Serving (a simulated engine, or a real one with --engine)", long, env = "LOADGATE_WORKER_ENGINE_CONNECT_TIMEOUT_MS", value_name = "MS", default_value_t = 2000, value_parser = crate::flag_limits::ms(1))]
    pub engine_connect_timeout_ms: u64,
    /// Seconds the engine may take to send the response head and first byte (the time to first
    /// token; a whole answer when not streamed); past it: 504 (--engine).
    #[arg(help_heading = "Serving (a simulated engine, or a real one with --engine)", long, env = "LOADGATE_WORKER_ENGINE_FIRST_BYTE_TIMEOUT_SECS", value_name = "SECS", default_value_t = 120, value_parser = crate::flag_limits::secs(1))]
    pub engine_first_byte_timeout_secs: u64,
    /// Seconds a relayed engine response may go without a byte; past it the response is cut
    /// (--engine).
    #[arg(help_heading = "Serving (a simulated engine, or a real one with --engine)", long, env = "LOADGATE_WORKER_ENGINE_CHUNK_TIMEOUT_SECS", value_name = "SECS", default_value_t = 60, value_parser = crate::flag_limits::secs(1))]
    pub engine_chunk_timeout_secs: u64,
    /// Seconds a starting sidecar waits for its engine to list its model (unless named) and answer
    /// a scrape; past it, it exits with an error (--engine). An engine still loading a large model
    /// may need minutes.
    #[arg(help_heading = "Serving (a simulated engine, or a real one with --engine)", long, env = "LOADGATE_WORKER_ENGINE_START_TIMEOUT_SECS", value_name = "SECS", default_value_t = 60, value_parser = crate::flag_limits::secs(1))]
    pub engine_start_timeout_secs: u64,
    /// How the engine is scraped (--engine).
    #[command(flatten, next_help_heading = "Serving (a simulated engine, or a real one with --engine)")]
    pub scrape: ScrapeArgs,
    /// Address the HTTP listener binds.
    #[arg(help_heading = "Listeners", long, env = "LOADGATE_WORKER_HTTP_HOST", default_value = "127.0.0.1")]
    pub http_host: String,
    /// HTTP port (0 picks a free one).
    #[arg(help_heading = "Listeners", long, env = "LOADGATE_WORKER_HTTP_PORT", default_value_t = 0)]
    pub http_port: u16,
    /// HOST:PORT announced to frontends (default: the bound address; required
    /// when --http-host is an unspecified address such as 0.0.0.0).
    #[arg(help_heading = "Listeners", long, env = "LOADGATE_WORKER_ADVERTISE_ADDR", value_name = "HOST:PORT")]
    pub advertise_addr: Option<String>,
    /// The event plane (TCP to each --frontend, or NATS) and how to reach NATS.
    #[command(flatten, next_help_heading = "Event plane")]
    pub(crate) nats: crate::nats::NatsArgs,
    /// A frontend's event port, HOST:PORT (repeatable; none: standalone).
    #[arg(
        help_heading = "Event plane",
        long = "frontend",
        env = "LOADGATE_WORKER_FRONTEND",
        value_name = "HOST:PORT",
        value_delimiter = ',',
        value_parser = host_port
    )]
    pub frontends: Vec<String>,
    /// File holding the event-plane secret (line 1: current, optional line 2: previous).
    /// Without it: LOADGATE_EVENT_SECRET and LOADGATE_EVENT_SECRET_PREVIOUS.
    #[arg(help_heading = "Event plane", long, env = "LOADGATE_WORKER_EVENT_SECRET_FILE", value_name = "PATH")]
    pub event_secret_file: Option<PathBuf>,
    /// Seconds a request proof's timestamp may be from this worker's clock (either way). Keep
    /// the clocks of frontends and workers within a second or two of each other (NTP): a skew
    /// past this refuses every request with a valid proof (a frontend then routes around this
    /// worker). Default 5.
    #[arg(help_heading = "Limits", long, env = "LOADGATE_WORKER_PROOF_WINDOW_SECS", value_name = "SECS", default_value_t = 5, value_parser = crate::flag_limits::secs(1))]
    pub proof_window_secs: u64,
    /// Request-proof nonces remembered within the window (each proof is accepted once). When
    /// that many unexpired ones are held, new requests are refused (never an earlier nonce
    /// forgotten: that would allow a replay). About 60 bytes each. Default 1000000.
    #[arg(help_heading = "Limits", long, env = "LOADGATE_WORKER_MAX_PROOF_NONCES", value_name = "N", default_value_t = 1_000_000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_proof_nonces: usize,
    /// Largest request body, in MiB (larger: 413); at least 1.
    #[arg(help_heading = "Limits", long, env = "DYN_HTTP_BODY_LIMIT_MB", value_name = "MB", default_value_t = 192,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub http_body_limit_mb: usize,
    /// Bytes of request bodies buffered at once over all requests, in MiB (past it: 503): any
    /// client that reaches the port sends bodies, not only the frontends.
    #[arg(help_heading = "Limits", long, env = "LOADGATE_WORKER_HTTP_BODY_BUDGET_MB", value_name = "MB", default_value_t = 1024,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub http_body_budget_mb: usize,
    /// Data-parallel ranks of the simulator (with --engine: as many as the engine reports).
    #[arg(help_heading = "Simulated engine", long, env = "LOADGATE_WORKER_DP_SIZE", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub dp_size: u32,
    /// KV-cache blocks per rank.
    #[arg(help_heading = "Simulated engine", long, env = "LOADGATE_WORKER_KV_TOTAL_BLOCKS", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub kv_total_blocks: u32,
    /// Tokens per KV block.
    #[arg(help_heading = "Simulated engine", long, env = "LOADGATE_WORKER_BLOCK_SIZE", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    pub block_size: u32,
    /// Token budget of one engine step (decode + prefill).
    #[arg(help_heading = "Simulated engine", long, env = "LOADGATE_WORKER_MAX_NUM_BATCHED_TOKENS", default_value_t = 2048, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_num_batched_tokens: u32,
    /// Engine slots N; the overflow queue Q comes from DYN_DYNAMO_REQUEST_QUEUE_LIMIT (default 16).
    /// Without it there is no cap.
    #[arg(
        help_heading = "Serving (a simulated engine, or a real one with --engine)",
        long,
        env = "LOADGATE_WORKER_ENGINE_REQUEST_LIMIT"
    )]
    pub engine_request_limit: Option<usize>,
    /// Wall time of one engine step, in milliseconds.
    #[arg(help_heading = "Simulated engine", long, env = "LOADGATE_WORKER_DECODE_STEP_MS", default_value_t = 10, value_parser = crate::flag_limits::ms(1))]
    pub decode_step_ms: u64,
    /// Bound on prefill speed, tokens per second per rank.
    #[arg(help_heading = "Simulated engine", long, env = "LOADGATE_WORKER_PREFILL_TOKENS_PER_S",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub prefill_tokens_per_s: Option<u32>,
    /// Re-send every rank's load at least this often (ms), even when unchanged.
    #[arg(help_heading = "Event plane", long, env = "LOADGATE_WORKER_HEARTBEAT_MS", default_value_t = 200, value_parser = crate::flag_limits::ms(1))]
    pub heartbeat_ms: u64,
    /// Worker id announced to frontends (default: random).
    #[arg(help_heading = "Event plane", long, env = "LOADGATE_WORKER_WORKER_ID")]
    pub worker_id: Option<u64>,
    /// The HTTP listener's header, idle and connection limits and the shutdown drain.
    #[command(flatten, next_help_heading = "HTTP server: timeouts and connections")]
    pub http: HttpArgs,
}

impl Args {
    /// The bounds on every wait for the engine (--engine).
    pub fn engine_timeouts(&self) -> Timeouts {
        Timeouts {
            connect: Duration::from_millis(self.engine_connect_timeout_ms),
            first_byte: Duration::from_secs(self.engine_first_byte_timeout_secs),
            between_chunks: Duration::from_secs(self.engine_chunk_timeout_secs),
        }
    }

    /// The simulator's physics these arguments describe.
    pub fn sim_config(&self) -> SimConfig {
        SimConfig {
            dp_size: self.dp_size,
            kv_total_blocks: self.kv_total_blocks,
            block_size: self.block_size,
            max_num_batched_tokens: self.max_num_batched_tokens,
            decode_step: Duration::from_millis(self.decode_step_ms),
            prefill_tokens_per_s: self.prefill_tokens_per_s,
        }
    }
}

/// A `--frontend` value: HOST:PORT, the host not empty and no scheme or
/// path, the port not 0 (the host is resolved only when connecting).
fn host_port(value: &str) -> Result<String, String> {
    let valid = value.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty() && !host.contains('/') && port.parse::<u16>().is_ok_and(|p| p != 0)
    });
    match valid {
        true => Ok(value.to_owned()),
        false => Err("expected HOST:PORT, a frontend's event port (e.g. 127.0.0.1:8001)".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::host_port;

    #[test]
    fn a_frontend_is_host_port() {
        for ok in ["127.0.0.1:8001", "frontend.example:8001", "[::1]:8001", "fe:1"] {
            assert_eq!(host_port(ok).as_deref(), Ok(ok));
        }
        for bad in ["garbage", "http://fe:8001", "fe:8001/x", "fe:0", ":8001", "fe:", "fe:65536"] {
            assert!(host_port(bad).is_err(), "{bad}");
        }
    }
}
