//! `loadgate demo`: what shedding does to tail latency, side by side.
//!
//! One process starts a frontend and 4 simulated workers as child processes
//! of the same binary (everything over real sockets on 127.0.0.1), measures
//! the pool's capacity with a short closed-loop saturation run, then offers
//! open-loop Poisson load at 0.5x, 1x, 2x and 3x capacity twice: shedding
//! off, and with `--active-decode-blocks-threshold 0.85`. Every run gets a
//! fresh frontend and fresh workers, so runs never contaminate each other.
//! It prints one table and writes an SVG plot.
//!
//! The engine physics make a KV-cache-bound pool: a request needs
//! `ceil((prompt + generated) / 16)` blocks for its whole life, so a worker
//! runs only a handful of sequences at once and everything beyond waits for
//! blocks. Without shedding that wait grows without bound under overload and
//! TTFT explodes; with shedding the frontend refuses instead.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;

use crate::server::loadgen::{completions_url, run_bench, saturate, BenchConfig, BenchReport, Percentiles};
use crate::server::plot::{comparison, LoadPoint};

/// The model name the demo's workers serve.
const MODEL: &str = "demo-model";

/// Command-line arguments of `loadgate demo`.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Workers behind the frontend.
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// Seconds of arrivals per run.
    #[arg(long, default_value_t = 8.0)]
    pub duration: f64,
    /// Seconds each run waits for in-flight requests after its arrivals end.
    #[arg(long, default_value_t = 3.0)]
    pub drain_timeout: f64,
    /// The shedding run's decode-blocks threshold.
    #[arg(long, default_value_t = 0.85)]
    pub threshold: f64,
    /// Skip the saturation run and use this capacity (req/s).
    #[arg(long)]
    pub capacity: Option<f64>,
    /// KV-cache blocks per worker.
    #[arg(long, default_value_t = 64)]
    pub kv_total_blocks: u32,
    /// Engine step time, ms.
    #[arg(long, default_value_t = 25)]
    pub decode_step_ms: u64,
    /// Token budget of one engine step.
    #[arg(long, default_value_t = 512)]
    pub max_num_batched_tokens: u32,
    /// Prompt tokens per request.
    #[arg(long, default_value_t = 112)]
    pub prompt_tokens: u32,
    /// Output tokens per request.
    #[arg(long, default_value_t = 32)]
    pub output_tokens: u32,
    /// Router mode of the frontend (both runs).
    #[arg(long, default_value = "kv")]
    pub router_mode: String,
    /// Where to write the plot.
    #[arg(long, default_value = "loadgate-demo.svg")]
    pub plot: PathBuf,
    /// Seed of the arrival processes.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
}

/// Offered load levels, as multiples of the measured capacity.
const LEVELS: [f64; 4] = [0.5, 1.0, 2.0, 3.0];

/// A child process of this binary, killed when dropped.
struct Process {
    child: Child,
    /// Kept open so the child's stdout writes never fail.
    _stdout: BufReader<ChildStdout>,
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `loadgate <args>` and returns it with its `listening ...` line.
fn spawn(args: &[String]) -> anyhow::Result<(Process, String)> {
    let exe = std::env::current_exe().context("cannot find the loadgate binary")?;
    let mut child = Command::new(exe)
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("cannot start loadgate {}", args.join(" ")))?;
    let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line)?;
    let process = Process { child, _stdout: stdout };
    anyhow::ensure!(line.starts_with("listening "), "loadgate {} did not start: {line:?}", args.join(" "));
    Ok((process, line.trim().to_owned()))
}

/// The value of `key=` in a `listening ...` line.
fn field(line: &str, key: &str) -> anyhow::Result<String> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
        .map(str::to_owned)
        .with_context(|| format!("no {key}= in {line:?}"))
}

/// A frontend and its workers, stopped when dropped.
struct Pool {
    http: String,
    _frontend: Process,
    _workers: Vec<Process>,
}

impl Pool {
    fn start(args: &Args, threshold: Option<f64>) -> anyhow::Result<Pool> {
        let mut frontend_args: Vec<String> =
            ["frontend", "--http-port", "0", "--event-port", "0", "--router-mode", &args.router_mode]
                .map(String::from)
                .into();
        if let Some(t) = threshold {
            frontend_args.extend(["--active-decode-blocks-threshold".to_owned(), t.to_string()]);
        }
        let (frontend, line) = spawn(&frontend_args)?;
        let http = field(&line, "http")?;
        let events = field(&line, "events")?;
        let workers = (0..args.workers)
            .map(|i| {
                let worker_args = [
                    "worker".to_owned(),
                    "--model".to_owned(),
                    MODEL.to_owned(),
                    "--http-port".to_owned(),
                    "0".to_owned(),
                    "--frontend".to_owned(),
                    events.clone(),
                    "--worker-id".to_owned(),
                    (i + 1).to_string(),
                    "--kv-total-blocks".to_owned(),
                    args.kv_total_blocks.to_string(),
                    "--max-num-batched-tokens".to_owned(),
                    args.max_num_batched_tokens.to_string(),
                    "--decode-step-ms".to_owned(),
                    args.decode_step_ms.to_string(),
                ];
                spawn(&worker_args).map(|(p, _)| p)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let pool = Pool { http, _frontend: frontend, _workers: workers };
        pool.wait_for_workers(args.workers)?;
        Ok(pool)
    }

    /// Polls the frontend's `/health` until every worker has registered.
    fn wait_for_workers(&self, n: usize) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        runtime.block_on(async {
            let client = reqwest::Client::new();
            loop {
                let health = client.get(format!("http://{}/health", self.http)).send().await;
                if let Ok(resp) = health {
                    let v: serde_json::Value = resp.json().await.unwrap_or_default();
                    if v["workers"].as_u64() == Some(n as u64) {
                        return Ok(());
                    }
                }
                anyhow::ensure!(Instant::now() < deadline, "workers did not register with the frontend in time");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    }
}

/// One row of the table: one load level, one shedding setting.
struct Run {
    report: BenchReport,
}

impl Run {
    fn point(&self, multiple: f64) -> LoadPoint {
        LoadPoint {
            multiple,
            goodput: self.report.goodput(),
            rejected_pct: self.report.rejected_pct(),
            p99_ttft_ms: Percentiles::of(&self.report.ttft).p99,
            p99_latency_ms: Percentiles::of(&self.report.latency).p99,
        }
    }
}

/// Runs `loadgate demo`.
///
/// # Errors
///
/// A server that does not start, or a plot that cannot be written.
pub fn run(args: Args) -> anyhow::Result<()> {
    let started = Instant::now();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let bench = |pool: &Pool, rate: f64, seed: u64| BenchConfig {
        url: completions_url(&pool.http),
        model: MODEL.to_owned(),
        rate,
        duration: Duration::from_secs_f64(args.duration),
        prompt_tokens: args.prompt_tokens,
        output_tokens: args.output_tokens,
        stream: true,
        drain_timeout: Duration::from_secs_f64(args.drain_timeout),
        seed,
        progress: true,
    };
    println!(
        "loadgate demo: 1 frontend + {} workers ({} KV blocks of 16 tokens, {} ms steps), prompts {} + outputs {} tokens, streaming",
        args.workers, args.kv_total_blocks, args.decode_step_ms, args.prompt_tokens, args.output_tokens
    );

    let capacity = match args.capacity {
        Some(c) => c,
        None => {
            let pool = Pool::start(&args, None)?;
            let est_slots = args.kv_total_blocks as usize * 16 / (args.prompt_tokens + args.output_tokens) as usize;
            let clients = (2 * args.workers * est_slots.max(1)).max(8);
            let config = bench(&pool, 1.0, args.seed);
            let c = runtime.block_on(saturate(&config, clients, Duration::from_secs(1), Duration::from_secs(3)))?;
            println!("capacity: {c:.1} req/s (closed loop, {clients} clients, 3 s after 1 s warm-up)");
            c
        }
    };
    anyhow::ensure!(capacity > 0.0, "measured capacity is zero: the pool served nothing");

    let mut off = Vec::new();
    let mut on = Vec::new();
    for (shedding, runs) in [(None, &mut off), (Some(args.threshold), &mut on)] {
        for (i, multiple) in LEVELS.iter().enumerate() {
            let pool = Pool::start(&args, shedding)?;
            let config = bench(&pool, multiple * capacity, args.seed + i as u64);
            let report = runtime.block_on(run_bench(&config))?;
            drop(pool);
            eprintln!(
                "  shedding {:<4} {multiple:>3}x: goodput {:>5.1} req/s, rejected {:>5.1} %, p99 TTFT {:>8.1} ms, \
                 unfinished at the drain deadline {}",
                if shedding.is_some() { "on" } else { "off" },
                report.goodput(),
                report.rejected_pct(),
                Percentiles::of(&report.ttft).p99,
                report.unfinished
            );
            runs.push(Run { report });
        }
    }
    print!("{}", table(capacity, args.threshold, &off, &on));
    let verdict = verdict(&off, &on);
    print!("{verdict}");

    let points = |runs: &[Run]| LEVELS.iter().zip(runs).map(|(m, r)| r.point(*m)).collect::<Vec<_>>();
    comparison(&args.plot, &points(&off), &points(&on))
        .with_context(|| format!("cannot write {}", args.plot.display()))?;
    println!("plot: {}", args.plot.display());
    println!("total time: {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// The side-by-side table.
fn table(capacity: f64, threshold: f64, off: &[Run], on: &[Run]) -> String {
    let mut out = String::new();
    out.push_str(&format!("\ncapacity {capacity:.1} req/s; accepted requests only for TTFT and latency (ms)\n"));
    out.push_str(&format!(
        "{:<6}{:>8} | {:^52} | {:^52}\n",
        "load",
        "req/s",
        "shedding off",
        format!("shedding on (--active-decode-blocks-threshold {threshold})")
    ));
    let head =
        format!("{:>8}{:>7}{:>9}{:>9}{:>9}{:>10}", "goodput", "rej %", "TTFT p50", "TTFT p99", "lat p50", "lat p99");
    out.push_str(&format!("{:<6}{:>8} | {head} | {head}\n", "", "offered"));
    for ((multiple, off), on) in LEVELS.iter().zip(off).zip(on) {
        let cell = |r: &BenchReport| {
            let (t, l) = (Percentiles::of(&r.ttft), Percentiles::of(&r.latency));
            format!(
                "{:>8.1}{:>7.1}{:>9.0}{:>9.0}{:>9.0}{:>10.0}",
                r.goodput(),
                r.rejected_pct(),
                t.p50,
                t.p99,
                l.p50,
                l.p99
            )
        };
        out.push_str(&format!(
            "{:<6}{:>8.1} | {} | {}\n",
            format!("{multiple}x"),
            multiple * capacity,
            cell(&off.report),
            cell(&on.report)
        ));
    }
    out
}

/// Checks the effect the demo exists to show, at 2x capacity.
fn verdict(off: &[Run], on: &[Run]) -> String {
    fn at(runs: &[Run], m: f64) -> Option<&BenchReport> {
        runs.iter().zip(LEVELS).find(|(_, l)| *l == m).map(|(r, _)| &r.report)
    }
    let (Some(off2), Some(on2), Some(off1)) = (at(off, 2.0), at(on, 2.0), at(off, 1.0)) else {
        return String::new();
    };
    let p99 = |r: &BenchReport| Percentiles::of(&r.ttft).p99;
    let ttft_ratio = p99(on2) / p99(off2).max(1e-9);
    let goodput_ratio = on2.goodput() / off1.goodput().max(1e-9);
    let mark = |ok: bool| if ok { "yes" } else { "NO" };
    format!(
        "\nat 2x: p99 TTFT with shedding / without = {:.0} / {:.0} ms = {ttft_ratio:.3} (<= 0.2: {})\n\
         at 2x: goodput with shedding / goodput at 1x = {:.1} / {:.1} = {goodput_ratio:.2} (>= 0.9: {})\n",
        p99(on2),
        p99(off2),
        mark(ttft_ratio <= 0.2),
        on2.goodput(),
        off1.goodput(),
        mark(goodput_ratio >= 0.9),
    )
}
