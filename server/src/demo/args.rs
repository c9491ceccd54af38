//! Command-line arguments of `loadgate demo`, and the fixed parts of every
//! run: the model name and the load levels.

use std::path::PathBuf;

/// The model name the demo's workers serve.
pub(crate) const MODEL: &str = "demo-model";

/// Command-line arguments of `loadgate demo`. Every flag also reads
/// `LOADGATE_DEMO_<FLAG>` (a flag beats its variable).
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Workers behind the frontend.
    #[arg(long, env = "LOADGATE_DEMO_WORKERS", default_value_t = 4)]
    pub workers: usize,
    /// Seconds of arrivals per run.
    #[arg(long, env = "LOADGATE_DEMO_DURATION", default_value_t = 8.0)]
    pub duration: f64,
    /// Seconds each run waits for in-flight requests after its arrivals end.
    #[arg(long, env = "LOADGATE_DEMO_DRAIN_TIMEOUT", default_value_t = 3.0)]
    pub drain_timeout: f64,
    /// The shedding run's decode-blocks threshold.
    #[arg(long, env = "LOADGATE_DEMO_THRESHOLD", default_value_t = 0.85)]
    pub threshold: f64,
    /// Skip the saturation run and use this capacity (req/s).
    #[arg(long, env = "LOADGATE_DEMO_CAPACITY")]
    pub capacity: Option<f64>,
    /// KV-cache blocks per worker.
    #[arg(long, env = "LOADGATE_DEMO_KV_TOTAL_BLOCKS", default_value_t = 64)]
    pub kv_total_blocks: u32,
    /// Engine step time, ms.
    #[arg(long, env = "LOADGATE_DEMO_DECODE_STEP_MS", default_value_t = 25)]
    pub decode_step_ms: u64,
    /// Token budget of one engine step.
    #[arg(long, env = "LOADGATE_DEMO_MAX_NUM_BATCHED_TOKENS", default_value_t = 512)]
    pub max_num_batched_tokens: u32,
    /// Prompt tokens per request.
    #[arg(long, env = "LOADGATE_DEMO_PROMPT_TOKENS", default_value_t = 112)]
    pub prompt_tokens: u32,
    /// Output tokens per request (at least 1: `max_tokens` 0 is a 400).
    #[arg(long, env = "LOADGATE_DEMO_OUTPUT_TOKENS", default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..))]
    pub output_tokens: u32,
    /// Router mode of the frontend (both runs).
    #[arg(long, env = "LOADGATE_DEMO_ROUTER_MODE", default_value = "kv")]
    pub router_mode: String,
    /// Where to write the plot.
    #[arg(long, env = "LOADGATE_DEMO_PLOT", default_value = "loadgate-demo.svg")]
    pub plot: PathBuf,
    /// Seed of the arrival processes.
    #[arg(long, env = "LOADGATE_DEMO_SEED", default_value_t = 7)]
    pub seed: u64,
}

/// Offered load levels, as multiples of the measured capacity.
pub(crate) const LEVELS: [f64; 4] = [0.5, 1.0, 2.0, 3.0];
