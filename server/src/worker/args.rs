//! Command-line arguments of `loadgate worker`: the model, ports, frontends,
//! the engine physics and the hard cap.

use std::time::Duration;

use crate::worker::engine::EngineConfig;

/// Command-line arguments of `loadgate worker`.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// The model this worker serves.
    #[arg(long)]
    pub model: String,
    /// HTTP port on 127.0.0.1 (0 picks a free one).
    #[arg(long, default_value_t = 0)]
    pub http_port: u16,
    /// A frontend's event port, HOST:PORT (repeatable; none: standalone).
    #[arg(long = "frontend", value_name = "HOST:PORT")]
    pub frontends: Vec<String>,
    /// Data-parallel ranks.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub dp_size: u32,
    /// KV-cache blocks per rank.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub kv_total_blocks: u32,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    pub block_size: u32,
    /// Token budget of one engine step (decode + prefill).
    #[arg(long, default_value_t = 2048, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_num_batched_tokens: u32,
    /// Engine slots N; the overflow queue Q comes from DYN_DYNAMO_REQUEST_QUEUE_LIMIT (default 16).
    /// Without it there is no cap.
    #[arg(long)]
    pub engine_request_limit: Option<usize>,
    /// Wall time of one engine step, in milliseconds.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub decode_step_ms: u64,
    /// Bound on prefill speed, tokens per second per rank.
    #[arg(long)]
    pub prefill_tokens_per_s: Option<u32>,
    /// Re-send every rank's load at least this often (ms), even when unchanged.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..))]
    pub heartbeat_ms: u64,
    /// Worker id announced to frontends (default: random).
    #[arg(long)]
    pub worker_id: Option<u64>,
}

impl Args {
    /// The engine physics these arguments describe.
    pub fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            dp_size: self.dp_size,
            kv_total_blocks: self.kv_total_blocks,
            block_size: self.block_size,
            max_num_batched_tokens: self.max_num_batched_tokens,
            decode_step: Duration::from_millis(self.decode_step_ms),
            prefill_tokens_per_s: self.prefill_tokens_per_s,
        }
    }
}
