//! `loadgate bench`: an open-loop load generator.
//!
//! Arrivals follow a Poisson process (exponential inter-arrival times); each
//! request is fired on its schedule whatever happened to earlier ones, and
//! its latency is measured from its *scheduled* time, so a slow server
//! cannot hide its queueing (no coordinated omission). TTFT (time to the
//! first streamed bytes, or to the whole response when not streaming) and
//! end-to-end latency of accepted (2xx) requests go into hdrhistograms;
//! every answer is counted by status. [`run_bench`] is the in-process entry
//! point the demo uses; [`BenchReport`] renders the table and the JSON.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// Command-line arguments of `loadgate bench`.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Base URL of a frontend or worker (or a full `/v1/...completions` URL).
    #[arg(long)]
    pub url: String,
    /// Model name sent in every request.
    #[arg(long)]
    pub model: String,
    /// Mean arrival rate, requests per second.
    #[arg(long)]
    pub rate: f64,
    /// Seconds during which requests arrive.
    #[arg(long)]
    pub duration: f64,
    /// Prompt length in tokens (words).
    #[arg(long, default_value_t = 128)]
    pub prompt_tokens: u32,
    /// Tokens to generate per request.
    #[arg(long, default_value_t = 32)]
    pub output_tokens: u32,
    /// Stream responses (SSE); TTFT is then the first streamed bytes.
    #[arg(long)]
    pub stream: bool,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Draw latency percentiles and the rejection rate over time (SVG).
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Seconds to wait for in-flight requests after the last arrival.
    #[arg(long, default_value_t = 10.0)]
    pub drain_timeout: f64,
    /// Seed of the arrival process (default: random).
    #[arg(long)]
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

/// Runs `loadgate bench`.
///
/// # Errors
///
/// Invalid arguments, or a plot that cannot be written.
pub fn run(args: Args) -> anyhow::Result<()> {
    let config = BenchConfig::from_args(&args)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let report = runtime.block_on(run_bench(&config))?;
    if args.json {
        println!("{}", serde_json::to_string(&report.summary())?);
    } else {
        print!("{}", report.table());
    }
    if let Some(path) = &args.plot {
        crate::server::plot::timeline(path, &report).with_context(|| format!("cannot write {}", path.display()))?;
        if !args.json {
            println!("plot: {}", path.display());
        }
    }
    Ok(())
}

/// Microseconds histogram, 1 µs to 1 hour, 3 significant digits.
fn histogram(sigfig: u8) -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, sigfig).expect("valid histogram bounds")
}

/// How one request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// An HTTP status, with the response fully read.
    Status(u16),
    /// The connection failed or broke.
    TransportError,
}

/// One request's outcome.
#[derive(Clone, Copy, Debug)]
struct Outcome {
    /// Arrival second (index of the timeline bucket).
    second: usize,
    answer: Answer,
    ttft: Option<Duration>,
    latency: Duration,
    tokens: u64,
}

/// One second of arrivals.
#[derive(Clone, Debug)]
pub struct SecondBucket {
    /// Requests that arrived in this second.
    pub sent: u64,
    /// Of those, accepted and completed (2xx).
    pub ok: u64,
    /// Of those, answered with a non-2xx status.
    pub rejected: u64,
    /// TTFT of accepted requests (µs).
    pub ttft: Histogram<u64>,
    /// End-to-end latency of accepted requests (µs).
    pub latency: Histogram<u64>,
}

impl SecondBucket {
    fn new() -> Self {
        SecondBucket { sent: 0, ok: 0, rejected: 0, ttft: histogram(2), latency: histogram(2) }
    }
}

/// Everything one run measured.
#[derive(Clone, Debug)]
pub struct BenchReport {
    /// The configuration that ran.
    pub config: BenchConfig,
    /// Requests sent.
    pub sent: u64,
    /// Answers per HTTP status.
    pub by_status: BTreeMap<u16, u64>,
    /// Connection failures.
    pub transport_errors: u64,
    /// Requests abandoned at the drain deadline.
    pub unfinished: u64,
    /// Output tokens of accepted requests.
    pub output_tokens: u64,
    /// From the first arrival to the last answer (or the drain deadline).
    pub elapsed: Duration,
    /// TTFT of accepted requests (µs).
    pub ttft: Histogram<u64>,
    /// End-to-end latency of accepted requests (µs).
    pub latency: Histogram<u64>,
    /// Per-second buckets by arrival time.
    pub timeline: Vec<SecondBucket>,
}

/// p50 / p90 / p99 / max of a histogram, in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Maximum.
    pub max: f64,
}

impl Percentiles {
    /// Reads the percentiles of a µs histogram (zeros when empty).
    pub fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Percentiles::default();
        }
        let ms = |us: u64| us as f64 / 1000.0;
        Percentiles {
            p50: ms(h.value_at_quantile(0.50)),
            p90: ms(h.value_at_quantile(0.90)),
            p99: ms(h.value_at_quantile(0.99)),
            max: ms(h.max()),
        }
    }
}

/// The machine-readable summary of a run (`--json`).
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// Target URL.
    pub url: String,
    /// Offered rate, requests per second.
    pub rate: f64,
    /// Arrival window, seconds.
    pub duration_s: f64,
    /// Requests sent.
    pub sent: u64,
    /// Accepted and completed (2xx).
    pub ok: u64,
    /// Answered with a non-2xx status.
    pub rejected: u64,
    /// `rejected / sent`, percent.
    pub rejected_pct: f64,
    /// Connection failures.
    pub transport_errors: u64,
    /// Abandoned at the drain deadline.
    pub unfinished: u64,
    /// Answers per status.
    pub by_status: BTreeMap<String, u64>,
    /// First arrival to last answer, seconds.
    pub elapsed_s: f64,
    /// Completed requests per second of `elapsed`.
    pub goodput_rps: f64,
    /// Output tokens of completed requests per second of `elapsed`.
    pub tokens_per_s: f64,
    /// TTFT of accepted requests, ms.
    pub ttft_ms: Percentiles,
    /// End-to-end latency of accepted requests, ms.
    pub latency_ms: Percentiles,
}

impl BenchReport {
    /// Accepted and completed requests.
    pub fn ok(&self) -> u64 {
        self.by_status.iter().filter(|(s, _)| (200..300).contains(*s)).map(|(_, n)| n).sum()
    }

    /// Requests answered with a non-2xx status.
    pub fn rejected(&self) -> u64 {
        self.by_status.values().sum::<u64>() - self.ok()
    }

    /// Completed requests per second.
    pub fn goodput(&self) -> f64 {
        self.ok() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Percentage of sent requests refused.
    pub fn rejected_pct(&self) -> f64 {
        if self.sent == 0 {
            0.0
        } else {
            100.0 * self.rejected() as f64 / self.sent as f64
        }
    }

    /// The `--json` object.
    pub fn summary(&self) -> Summary {
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        Summary {
            url: self.config.url.clone(),
            rate: self.config.rate,
            duration_s: self.config.duration.as_secs_f64(),
            sent: self.sent,
            ok: self.ok(),
            rejected: self.rejected(),
            rejected_pct: self.rejected_pct(),
            transport_errors: self.transport_errors,
            unfinished: self.unfinished,
            by_status: self.by_status.iter().map(|(s, n)| (s.to_string(), *n)).collect(),
            elapsed_s: secs,
            goodput_rps: self.goodput(),
            tokens_per_s: self.output_tokens as f64 / secs,
            ttft_ms: Percentiles::of(&self.ttft),
            latency_ms: Percentiles::of(&self.latency),
        }
    }

    /// The human-readable final table.
    pub fn table(&self) -> String {
        let s = self.summary();
        let statuses: Vec<String> = s.by_status.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let row = |name: &str, p: Percentiles| {
            format!("{name:<9}{:>10.1}{:>10.1}{:>10.1}{:>10.1}\n", p.p50, p.p90, p.p99, p.max)
        };
        let mut out = String::new();
        out.push_str(&format!(
            "offered {:.1} req/s for {:.1} s to {} ({}stream)\n",
            s.rate,
            s.duration_s,
            s.url,
            if self.config.stream { "" } else { "no " }
        ));
        out.push_str(&format!(
            "sent {}  ok {}  rejected {} ({:.1} %)  transport errors {}  unfinished {}  [{}]\n",
            s.sent,
            s.ok,
            s.rejected,
            s.rejected_pct,
            s.transport_errors,
            s.unfinished,
            statuses.join(" ")
        ));
        out.push_str(&format!(
            "goodput {:.1} req/s  {:.0} tok/s  (elapsed {:.1} s)\n",
            s.goodput_rps, s.tokens_per_s, s.elapsed_s
        ));
        out.push_str(&format!("{:<9}{:>10}{:>10}{:>10}{:>10}\n", "ms", "p50", "p90", "p99", "max"));
        out.push_str(&row("TTFT", s.ttft_ms));
        out.push_str(&row("latency", s.latency_ms));
        out
    }
}

/// Closed-loop saturation: `clients` clients each send their next request
/// as soon as the previous one ends, for `warmup + measure`; returns the
/// requests per second that completed (2xx) during `measure`.
///
/// # Errors
///
/// The HTTP client cannot be built.
pub async fn saturate(
    config: &BenchConfig,
    clients: usize,
    warmup: Duration,
    measure: Duration,
) -> anyhow::Result<f64> {
    let client = reqwest::Client::builder().tcp_nodelay(true).build()?;
    let body = bytes::Bytes::from(request_body(config));
    let start = Instant::now();
    let (from, until) = (start + warmup, start + warmup + measure);
    let mut tasks = JoinSet::new();
    for _ in 0..clients {
        let (client, url, body) = (client.clone(), config.url.clone(), body.clone());
        tasks.spawn(async move {
            let mut completed = 0u64;
            while Instant::now() < until {
                let Ok(resp) =
                    client.post(&url).header("content-type", "application/json").body(body.clone()).send().await
                else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let ok = resp.status().is_success();
                let read = resp.bytes().await.is_ok();
                let now = Instant::now();
                if ok && read && now >= from && now < until {
                    completed += 1;
                }
            }
            completed
        });
    }
    let mut completed = 0;
    while let Some(n) = tasks.join_next().await {
        completed += n.unwrap_or(0);
    }
    Ok(completed as f64 / measure.as_secs_f64())
}

/// The request body: a prompt of `prompt_tokens` words (one user message
/// when the URL is a chat endpoint).
fn request_body(config: &BenchConfig) -> String {
    let prompt = vec!["hello"; config.prompt_tokens as usize].join(" ");
    let mut body = serde_json::json!({
        "model": config.model,
        "max_tokens": config.output_tokens,
        "stream": config.stream,
    });
    if config.url.ends_with("/chat/completions") {
        body["messages"] = serde_json::json!([{"role": "user", "content": prompt}]);
    } else {
        body["prompt"] = serde_json::Value::String(prompt);
    }
    body.to_string()
}

/// Runs one open-loop benchmark.
///
/// # Errors
///
/// The HTTP client cannot be built.
pub async fn run_bench(config: &BenchConfig) -> anyhow::Result<BenchReport> {
    let client = reqwest::Client::builder().tcp_nodelay(true).build()?;
    let body = bytes::Bytes::from(request_body(config));
    let mut rng = fastrand::Rng::with_seed(config.seed);
    let progress = progress_bar(config);
    let (tx, mut rx) = mpsc::unbounded_channel::<Outcome>();
    let mut tasks = JoinSet::new();

    let seconds = config.duration.as_secs_f64().ceil() as usize;
    let mut report = BenchReport {
        config: config.clone(),
        sent: 0,
        by_status: BTreeMap::new(),
        transport_errors: 0,
        unfinished: 0,
        output_tokens: 0,
        elapsed: Duration::ZERO,
        ttft: histogram(3),
        latency: histogram(3),
        timeline: (0..seconds.max(1)).map(|_| SecondBucket::new()).collect(),
    };

    let start = Instant::now();
    let end = start + config.duration;
    let drain_deadline = end + config.drain_timeout;
    let gap = |rng: &mut fastrand::Rng| Duration::from_secs_f64(-(1.0 - rng.f64()).ln() / config.rate);
    let mut next = Some(start + gap(&mut rng)).filter(|t| *t < end);
    let mut outstanding = 0u64;
    let mut last_answer = start;
    loop {
        if next.is_none() && outstanding == 0 {
            break;
        }
        tokio::select! {
            () = tokio::time::sleep_until(next.unwrap_or(end)), if next.is_some() => {
                let scheduled = next.expect("guarded");
                let second = ((scheduled - start).as_secs_f64() as usize).min(report.timeline.len() - 1);
                report.sent += 1;
                report.timeline[second].sent += 1;
                outstanding += 1;
                tasks.spawn(one_request(client.clone(), config.url.clone(), body.clone(), config.stream, scheduled, second, tx.clone()));
                next = Some(scheduled + gap(&mut rng)).filter(|t| *t < end);
            }
            Some(outcome) = rx.recv() => {
                outstanding -= 1;
                last_answer = Instant::now();
                record(&mut report, &outcome);
                progress.set_message(format!(
                    "sent {} ok {} rejected {} in flight {}",
                    report.sent, report.ok(), report.rejected(), outstanding
                ));
            }
            () = tokio::time::sleep_until(drain_deadline), if next.is_none() => {
                report.unfinished = outstanding;
                tasks.abort_all();
                last_answer = drain_deadline;
                break;
            }
        }
        while tasks.try_join_next().is_some() {}
        progress.set_position((start.elapsed().as_millis() as u64).min(config.duration.as_millis() as u64));
    }
    progress.finish_and_clear();
    report.elapsed = (last_answer - start).max(config.duration);
    Ok(report)
}

fn progress_bar(config: &BenchConfig) -> ProgressBar {
    if !config.progress || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(config.duration.as_millis() as u64);
    bar.set_style(
        ProgressStyle::with_template("{elapsed:>4} [{bar:30}] {msg}").expect("valid template").progress_chars("=> "),
    );
    bar.enable_steady_tick(Duration::from_millis(100));
    bar
}

fn record(report: &mut BenchReport, o: &Outcome) {
    let bucket = &mut report.timeline[o.second];
    match o.answer {
        Answer::TransportError => report.transport_errors += 1,
        Answer::Status(status) => {
            *report.by_status.entry(status).or_default() += 1;
            if (200..300).contains(&status) {
                bucket.ok += 1;
                report.output_tokens += o.tokens;
                let latency = o.latency.as_micros().max(1) as u64;
                report.latency.saturating_record(latency);
                bucket.latency.saturating_record(latency);
                if let Some(ttft) = o.ttft {
                    let ttft = ttft.as_micros().max(1) as u64;
                    report.ttft.saturating_record(ttft);
                    bucket.ttft.saturating_record(ttft);
                }
            } else {
                bucket.rejected += 1;
            }
        }
    }
}

async fn one_request(
    client: reqwest::Client,
    url: String,
    body: bytes::Bytes,
    stream: bool,
    scheduled: Instant,
    second: usize,
    done: mpsc::UnboundedSender<Outcome>,
) {
    let sent = client.post(&url).header("content-type", "application/json").body(body).send().await;
    let mut outcome =
        Outcome { second, answer: Answer::TransportError, ttft: None, latency: Duration::ZERO, tokens: 0 };
    if let Ok(mut resp) = sent {
        let status = resp.status().as_u16();
        let mut text = Vec::new();
        let mut broken = false;
        loop {
            match resp.chunk().await {
                Ok(Some(chunk)) => {
                    if outcome.ttft.is_none() && stream {
                        outcome.ttft = Some(scheduled.elapsed());
                    }
                    text.extend_from_slice(&chunk);
                }
                Ok(None) => break,
                Err(_) => {
                    broken = true;
                    break;
                }
            }
        }
        outcome.latency = scheduled.elapsed();
        if !broken {
            outcome.answer = Answer::Status(status);
            if !stream {
                outcome.ttft = Some(outcome.latency);
            }
            outcome.tokens = completion_tokens(&text);
        }
    }
    let _ = done.send(outcome);
}

/// The last `"completion_tokens":N` in a response (JSON or SSE).
fn completion_tokens(text: &[u8]) -> u64 {
    const KEY: &[u8] = b"\"completion_tokens\":";
    let Some(at) = text.windows(KEY.len()).rposition(|w| w == KEY) else { return 0 };
    text[at + KEY.len()..].iter().take_while(|b| b.is_ascii_digit()).fold(0, |n, b| n * 10 + u64::from(b - b'0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_usage() {
        assert_eq!(completions_url("http://a:1/"), "http://a:1/v1/completions");
        assert_eq!(completions_url("127.0.0.1:9"), "http://127.0.0.1:9/v1/completions");
        assert_eq!(completions_url("http://a/v1/chat/completions"), "http://a/v1/chat/completions");
        assert_eq!(completion_tokens(br#"{"usage":{"prompt_tokens":3,"completion_tokens":17,"total_tokens":20}}"#), 17);
        assert_eq!(completion_tokens(b"data: [DONE]"), 0);
    }
}
