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

mod args;
mod pool;
mod table;

use std::time::{Duration, Instant};

use anyhow::Context as _;

pub use self::args::Args;
use self::args::{LEVELS, MODEL};
use self::pool::Pool;
use self::table::{table, verdict, Run};
use crate::loadgen::plot::comparison;
use crate::loadgen::{completions_url, run_bench, saturate, BenchConfig, Percentiles};

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
