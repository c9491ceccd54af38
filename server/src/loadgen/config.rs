//! What a benchmark run does: the `loadgate bench` arguments, the
//! [`BenchConfig`] they become, and the request body every request sends.

use std::path::PathBuf;
use std::time::Duration;

/// Command-line arguments of `loadgate bench`. Every flag also reads
/// `LOADGATE_BENCH_<FLAG>` (a flag beats its variable).
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Base URL of a frontend or worker (or a full `/v1/...completions` URL).
    #[arg(long, env = "LOADGATE_BENCH_URL")]
    pub url: String,
    /// Model name sent in every request.
    #[arg(long, env = "LOADGATE_BENCH_MODEL")]
    pub model: String,
    /// Mean arrival rate, requests per second.
    #[arg(long, env = "LOADGATE_BENCH_RATE")]
    pub rate: f64,
    /// Seconds during which requests arrive.
    #[arg(long, env = "LOADGATE_BENCH_DURATION")]
    pub duration: f64,
    /// Prompt length in tokens (words).
    #[arg(long, env = "LOADGATE_BENCH_PROMPT_TOKENS", default_value_t = 128)]
    pub prompt_tokens: u32,
    /// Tokens to generate per request.
    #[arg(long, env = "LOADGATE_BENCH_OUTPUT_TOKENS", default_value_t = 32)]
    pub output_tokens: u32,
    /// Stream responses (SSE); TTFT is then the first streamed bytes.
    #[arg(long, env = "LOADGATE_BENCH_STREAM", value_parser = clap::builder::BoolishValueParser::new())]
    pub stream: bool,
    /// Print one JSON object instead of the table.
    #[arg(long, env = "LOADGATE_BENCH_JSON", value_parser = clap::builder::BoolishValueParser::new())]
    pub json: bool,
    /// Draw latency percentiles and the rejection rate over time (SVG).
    #[arg(long, env = "LOADGATE_BENCH_PLOT", value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Seconds to wait for in-flight requests after the last arrival.
    #[arg(long, env = "LOADGATE_BENCH_DRAIN_TIMEOUT", default_value_t = 10.0)]
    pub drain_timeout: f64,
    /// Seed of the arrival process (default: random).
    #[arg(long, env = "LOADGATE_BENCH_SEED")]
    pub seed: Option<u64>,
}

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
    /// Show a progress bar on stderr (only if stderr is a terminal).
    pub progress: bool,
}

impl BenchConfig {
    /// The configuration `args` describe.
    ///
    /// # Errors
    ///
    /// A rate or duration that is not a positive number.
    pub fn from_args(args: &Args) -> anyhow::Result<Self> {
        anyhow::ensure!(args.rate.is_finite() && args.rate > 0.0, "--rate must be a positive number");
        anyhow::ensure!(args.duration.is_finite() && args.duration > 0.0, "--duration must be a positive number");
        anyhow::ensure!(args.drain_timeout.is_finite() && args.drain_timeout >= 0.0, "invalid --drain-timeout");
        Ok(BenchConfig {
            url: completions_url(&args.url),
            model: args.model.clone(),
            rate: args.rate,
            duration: Duration::from_secs_f64(args.duration),
            prompt_tokens: args.prompt_tokens,
            output_tokens: args.output_tokens,
            stream: args.stream,
            drain_timeout: Duration::from_secs_f64(args.drain_timeout),
            seed: args.seed.unwrap_or_else(|| fastrand::u64(..)),
            progress: !args.json,
        })
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

/// The request body: a prompt of `prompt_tokens` words (one user message
/// when the URL is a chat endpoint).
pub(crate) fn request_body(config: &BenchConfig) -> String {
    let prompt = vec!["hello"; config.prompt_tokens as usize].join(" ");
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

    #[test]
    fn completions_url_names_an_endpoint() {
        assert_eq!(completions_url("http://a:1/"), "http://a:1/v1/completions");
        assert_eq!(completions_url("127.0.0.1:9"), "http://127.0.0.1:9/v1/completions");
        assert_eq!(completions_url("http://a/v1/chat/completions"), "http://a/v1/chat/completions");
    }
}
