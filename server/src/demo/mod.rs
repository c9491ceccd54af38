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
//!
//! `--engines llamacpp` runs the same comparison on two real llama.cpp
//! servers (`engine_pool.rs`, `llama_server.rs`; `install.rs` finds what
//! `scripts/prepare-llama-server` prepared) that the frontend scrapes
//! directly; the shedding runs use `--active-waiting-requests-threshold`,
//! since a llama-server's queue of requests waiting for a slot is what turns
//! overload into latency there.

mod args;
mod child;
mod engine_pool;
mod install;
mod llama_server;
mod pool;
mod table;

use std::time::{Duration, Instant};

use anyhow::Context as _;

pub use self::args::{Args, Engines};
use self::args::{LEVELS, LLAMA_MODEL, MODEL};
use self::engine_pool::{EnginePool, SERVERS};
use self::install::LlamaInstall;
use self::llama_server::SLOTS;
use self::pool::Pool;
use self::table::{rejected_at_capacity, table, verdict, Run};
use crate::flag_limits::seconds;
use crate::loadgen::plot::comparison;
use crate::loadgen::{completions_url, run_bench, saturate, BenchConfig, Percentiles};

/// Runs `loadgate demo`.
///
/// # Errors
///
/// A server that does not start (or, with `--engines`, was not prepared), or
/// a plot that cannot be written.
pub fn run(args: Args) -> anyhow::Result<()> {
    let started = Instant::now();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    match args.engines {
        None => {
            println!(
                "loadgate demo: 1 frontend + {} workers ({} KV blocks of 16 tokens, {} ms steps), prompts {} + outputs {} tokens, streaming",
                args.workers, args.kv_total_blocks, args.decode_step_ms, args.prompt_tokens(), args.output_tokens()
            );
            let est_slots = args.kv_total_blocks as usize * 16 / (args.prompt_tokens() + args.output_tokens()) as usize;
            let saturation = Saturation {
                clients: (2 * args.workers * est_slots.max(1)).max(8),
                warmup: Duration::from_secs(1),
                measure: Duration::from_secs(3),
            };
            let shedding = format!("--active-decode-blocks-threshold {}", args.threshold);
            let (off, on) = compare(&args, &runtime, MODEL, &saturation, &shedding, |shed| {
                let pool = Pool::start(&args, shed.then_some(args.threshold))?;
                Ok((pool.http.clone(), pool))
            })?;
            print!("{}", verdict(&off, &on));
            plot(&args, &off, &on, &format!("decode blocks > {}", args.threshold))?;
        }
        Some(Engines::LlamaCpp) => {
            let install = LlamaInstall::locate()?;
            println!(
                "loadgate demo --engines llamacpp: 1 frontend + {SERVERS} llama-servers ({}, {SLOTS} slots of 512 \
                 tokens, 1 thread each), scraped every {} ms, prompts {} words + outputs {} tokens, streaming",
                install.model.display(),
                args.scrape_interval_ms,
                args.prompt_tokens(),
                args.output_tokens()
            );
            // Twice the slots: every slot stays busy and each server always has requests waiting.
            let saturation = Saturation {
                clients: 2 * SERVERS * SLOTS as usize,
                warmup: Duration::from_secs(3),
                measure: Duration::from_secs(8),
            };
            let shedding = format!("--active-waiting-requests-threshold {}", args.waiting_threshold);
            let (off, on) = compare(&args, &runtime, LLAMA_MODEL, &saturation, &shedding, |shed| {
                let pool = EnginePool::start(&install, &args, shed.then_some(args.waiting_threshold))?;
                Ok((pool.http.clone(), pool))
            })?;
            print!("{}{}", verdict(&off, &on), rejected_at_capacity(&on));
            plot(&args, &off, &on, &format!("waiting > {}", args.waiting_threshold))?;
        }
    }
    println!("total time: {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// The closed-loop run that measures capacity.
struct Saturation {
    clients: usize,
    warmup: Duration,
    measure: Duration,
}

/// Measures capacity (unless `--capacity`), then runs every load level with
/// shedding off and on, each on a fresh pool from `start(shedding)` (its
/// inference address and the value that keeps it alive); prints the table
/// and returns the runs (off, on).
fn compare<P>(
    args: &Args,
    runtime: &tokio::runtime::Runtime,
    model: &str,
    saturation: &Saturation,
    shedding: &str,
    start: impl Fn(bool) -> anyhow::Result<(String, P)>,
) -> anyhow::Result<(Vec<Run>, Vec<Run>)> {
    let duration = seconds(args.duration(), "--duration", false)?;
    let drain_timeout = seconds(args.drain_timeout(), "--drain-timeout", true)?;
    let bench = |http: &str, rate: f64, seed: u64| BenchConfig {
        url: completions_url(http),
        model: model.to_owned(),
        rate,
        duration,
        prompt_tokens: args.prompt_tokens(),
        output_tokens: args.output_tokens(),
        stream: true,
        drain_timeout,
        seed,
        progress: true,
    };
    let capacity = match args.capacity {
        Some(c) => c,
        None => {
            let (http, pool) = start(false)?;
            let Saturation { clients, warmup, measure } = *saturation;
            let c = runtime.block_on(saturate(&bench(&http, 1.0, args.seed), clients, warmup, measure))?;
            drop(pool);
            println!(
                "capacity: {c:.1} req/s (closed loop, {clients} clients, {} s after {} s warm-up)",
                measure.as_secs(),
                warmup.as_secs()
            );
            c
        }
    };
    anyhow::ensure!(capacity.is_finite(), "--capacity must be a number of requests per second");
    anyhow::ensure!(capacity > 0.0, "the capacity is not positive (measured: the pool served nothing)");

    let mut off = Vec::new();
    let mut on = Vec::new();
    for (shed, runs) in [(false, &mut off), (true, &mut on)] {
        for (i, multiple) in LEVELS.iter().enumerate() {
            let (http, pool) = start(shed)?;
            let report = runtime.block_on(run_bench(&bench(&http, multiple * capacity, args.seed + i as u64)))?;
            drop(pool);
            eprintln!(
                "  shedding {:<4} {multiple:>3}x: goodput {:>5.1} req/s, rejected {:>5.1} %, p99 TTFT {:>8.1} ms, \
                 unfinished at the drain deadline {}",
                if shed { "on" } else { "off" },
                report.goodput(),
                report.rejected_pct(),
                Percentiles::of(&report.ttft).p99,
                report.unfinished
            );
            runs.push(Run { report });
        }
    }
    print!("{}", table(capacity, shedding, &off, &on));
    Ok((off, on))
}

/// Writes the plot of both settings (`rule`: what makes a worker busy, for
/// the legend) and prints where.
fn plot(args: &Args, off: &[Run], on: &[Run], rule: &str) -> anyhow::Result<()> {
    let path = args.plot();
    let points = |runs: &[Run]| LEVELS.iter().zip(runs).map(|(m, r)| r.point(*m)).collect::<Vec<_>>();
    comparison(&path, &points(off), &points(on), rule).with_context(|| format!("cannot write {}", path.display()))?;
    println!("plot: {}", path.display());
    Ok(())
}
