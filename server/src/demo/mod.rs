//! `loadgate demo`: what shedding, and a waiting line, do to SLO goodput.
//!
//! One process starts a frontend and 4 simulated workers as child processes
//! of the same binary (everything over real sockets on 127.0.0.1), measures
//! the pool's capacity with a short closed-loop saturation run, then offers
//! open-loop Poisson load at 0.5x, 1x, 2x and 3x capacity in three modes
//! (`modes.rs`): no shedding; static thresholds
//! (`--active-decode-blocks-threshold 0.85`: 529 at once when every worker
//! is busy); and the same thresholds with the frontend's waiting line
//! (`--router-queue-timeout-ms`), whose timeout is the objective minus the
//! p50 TTFT the static mode measured at 0.5x (so that mode runs first).
//! Every run gets a fresh frontend and fresh workers, so runs never
//! contaminate each other. The headline is SLO goodput: requests per second
//! of arrivals that completed with TTFT within `--slo-ttft-ms`. It prints
//! one table, the line's figures against the targets, and writes an
//! SVG plot.
//!
//! The engine physics make a KV-cache-bound pool: a request needs
//! `ceil((prompt + generated) / 16)` blocks for its whole life, so a worker
//! runs only a handful of sequences at once and everything beyond waits for
//! blocks. Without shedding that wait grows without bound under overload and
//! TTFT explodes; with static thresholds the frontend refuses instead, also
//! requests that a moment later would have found room; the line holds those
//! for as long as they can still meet the objective.
//!
//! `--tenants big=10,small=1` asks what the frontend's tenants buy: at one
//! level (2x by default) each tenant alone at its share of the rate, then
//! all of them together with a tenants file (`tenants_file.rs`: the API key
//! decides the tenant, the line shares its dispatches among tenants) and
//! together without it, one shared line; `tenants.rs` prints each tenant's
//! SLO goodput together against alone.
//!
//! `--engines llamacpp` runs the same comparison on two real llama.cpp
//! servers (`engine_pool.rs`, `llama_server.rs`; `install.rs` finds what
//! `scripts/prepare-llama-server` prepared) that the frontend scrapes
//! directly; the shedding runs use `--active-decode-blocks-threshold 0.85`
//! (a llama-server's KV share is its share of slots in use: busy when no
//! slot is free), `--active-waiting-requests-threshold 0` (nothing waits
//! for a slot) and `--active-prefill-tokens-threshold 0` (busy while a
//! request sent to it awaits its first token, which the next scrape may
//! not show yet), since a request that waits at a server for a slot to
//! free is what turns overload into latency there.

mod args;
mod child;
mod classes;
mod engine_pool;
mod group;
mod install;
mod llama_server;
mod log_tail;
mod modes;
mod nats_server;
mod pool;
mod table;
mod tenant_shares;
mod tenants;
mod tenants_file;

use std::io::Write as _;
use std::time::{Duration, Instant};

use anyhow::Context as _;

pub use self::args::{Args, Engines};
use self::args::{LEVELS, LLAMA_MODEL, MODEL};
use self::child::Pooled;
use self::classes::class_table;
use self::engine_pool::{shedding_flags, EnginePool, SERVERS};
use self::install::LlamaInstall;
use self::llama_server::SLOTS;
use self::modes::{line_timeout_ms, Mode, MIN_LINE_TIMEOUT_MS};
use self::pool::Pool;
use self::table::{summary, table, Results, Run, Targets};
use self::tenant_shares::TenantShares;
use self::tenants::{tenant_table, TenantResults};
use self::tenants_file::TenantsFile;
use crate::flag_limits::seconds;
use crate::loadgen::plot::{comparison, Headline};
use crate::loadgen::{completions_url, run_bench, saturate, BenchConfig, ClassMix, Percentiles};
use crate::stdout;
use loadgate::PerClass;

/// Runs `loadgate demo`.
///
/// # Errors
///
/// A server that does not start (or, with `--engines`, was not prepared), or
/// a plot that cannot be written.
pub fn run(args: Args) -> anyhow::Result<()> {
    let started = Instant::now();
    crate::loadgen::plot::check_writable(&args.plot())?;
    child::stop_children_on_signals()?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let objective = args.slo_ttft().as_millis();
    match args.engines {
        None => {
            let frontends = match (args.frontends, args.event_plane) {
                (1, crate::nats::EventPlaneKind::Tcp) => "1 frontend".to_owned(),
                (1, crate::nats::EventPlaneKind::Nats) => "1 frontend on NATS".to_owned(),
                (k, _) => format!("{k} frontends sharing their load over NATS"),
            };
            let pool = format!(
                "{frontends} + {} workers ({} KV blocks of 16 tokens, {} ms steps)",
                args.workers, args.kv_total_blocks, args.decode_step_ms
            );
            stdout::print(format_args!(
                "loadgate demo: {pool}, prompts {} + outputs {} tokens, streaming; objective: TTFT <= {objective} ms\n",
                args.prompt_tokens(),
                args.output_tokens()
            ))?;
            let est_slots = args.kv_total_blocks as usize * 16 / (args.prompt_tokens() + args.output_tokens()) as usize;
            let setup = Setup {
                model: MODEL,
                saturation: Saturation {
                    // Twice the slots the pool has, within bounds a 2-core
                    // machine runs (a huge --kv-total-blocks asked for billions).
                    clients: (2 * args.workers * est_slots.max(1)).clamp(8, MAX_SATURATION_CLIENTS),
                    warmup: Duration::from_secs(1),
                    measure: Duration::from_secs(3),
                },
                shedding: format!("--active-decode-blocks-threshold {}", args.threshold),
                pool,
            };
            let start = |mode| {
                let pool = Pool::start(&args, mode)?;
                Ok((pool.http.clone(), pool))
            };
            if let Some(mix) = args.mix {
                with_classes(&args, &runtime, &setup, start, &mix)?;
            } else if let Some(tenants) = &args.tenants {
                with_tenants(&args, &runtime, &setup, start, tenants)?;
            } else {
                let results = compare(&args, &runtime, &setup, start)?;
                stdout::print(format_args!("{}", summary(&results, &Targets::SIMULATED)))?;
                plot(&args, &setup, &results)?;
            }
        }
        Some(Engines::LlamaCpp) => {
            let install = LlamaInstall::locate()?;
            let pool = format!("1 frontend + {SERVERS} llama-servers ({SLOTS} slots of 512 tokens, 1 thread each)");
            stdout::print(format_args!(
                "loadgate demo --engines llamacpp: {pool} ({}), scraped every {} ms and at each request's end, prompts {} words + outputs {} \
                 tokens, streaming; objective: TTFT <= {objective} ms\n",
                install.model.display(),
                args.scrape_interval_ms,
                args.prompt_tokens(),
                args.output_tokens()
            ))?;
            let setup = Setup {
                model: LLAMA_MODEL,
                // Twice the slots: every slot stays busy and each server always has requests waiting.
                saturation: Saturation {
                    clients: 2 * SERVERS * SLOTS as usize,
                    warmup: Duration::from_secs(3),
                    measure: Duration::from_secs(8),
                },
                shedding: shedding_flags(&args).join(" "),
                pool,
            };
            let results = compare(&args, &runtime, &setup, |mode| {
                let pool = EnginePool::start(&install, &args, mode)?;
                Ok((pool.http.clone(), pool))
            })?;
            stdout::print(format_args!("{}", summary(&results, &Targets::LLAMACPP)))?;
            plot(&args, &setup, &results)?;
        }
    }
    stdout::print(format_args!("total time: {:.0} s\n", started.elapsed().as_secs_f64()))?;
    Ok(())
}

/// What differs between simulated workers and real engines.
struct Setup {
    /// The model every request names.
    model: &'static str,
    /// The closed-loop run that measures capacity.
    saturation: Saturation,
    /// The static thresholds' frontend flag.
    shedding: String,
    /// The pool, in words (for the plot's headline).
    pool: String,
}

/// The closed-loop run that measures capacity.
struct Saturation {
    clients: usize,
    warmup: Duration,
    measure: Duration,
}

/// Measures capacity (unless `--capacity`), then runs every load level in
/// each mode, each on a fresh pool from `start(mode)` (its inference address
/// and the value that keeps it alive): static thresholds first (their 0.5x
/// p50 TTFT sets the line's timeout), then the line, then no shedding.
/// Prints the table and returns the runs.
fn compare<P: Pooled>(
    args: &Args,
    runtime: &tokio::runtime::Runtime,
    setup: &Setup,
    start: impl Fn(Mode) -> anyhow::Result<(String, P)>,
) -> anyhow::Result<Results> {
    let runner = Runner::new(args, runtime, setup)?;
    let capacity = runner.capacity(&start)?;
    let objective = args.slo_ttft();
    let fixed = runner.levels(&start, Mode::Static, capacity, &LEVELS)?;
    let timeout_ms = runner.line_timeout(&fixed)?;
    let line = runner.levels(&start, Mode::Line { timeout_ms }, capacity, &LEVELS)?;
    let off = runner.levels(&start, Mode::Off, capacity, &LEVELS)?;
    let results = Results { capacity, objective, off, fixed, line, timeout_ms };
    stdout::print(format_args!("{}", table(&results, &setup.shedding)))?;
    Ok(results)
}

/// `--mix`: the static mode at the first level (for the line's timeout,
/// unless given; `--class-timeouts-ms` gives one per class), then
/// thresholds + line with the class mix at every level; prints the
/// per-class table.
fn with_classes<P: Pooled>(
    args: &Args,
    runtime: &tokio::runtime::Runtime,
    setup: &Setup,
    start: impl Fn(Mode) -> anyhow::Result<(String, P)>,
    mix: &ClassMix,
) -> anyhow::Result<()> {
    let runner = Runner::new(args, runtime, setup)?;
    let capacity = runner.capacity(&start)?;
    let timeouts = match args.class_timeouts_ms {
        Some(timeouts) => {
            stdout::print(format_args!("waiting line: timeouts {timeouts} ms (--class-timeouts-ms)\n"))?;
            timeouts
        }
        None => {
            let fixed = if args.router_queue_timeout_ms.is_some() {
                Vec::new()
            } else {
                runner.levels(&start, Mode::Static, capacity, &LEVELS[..1])?
            };
            PerClass::all(runner.line_timeout(&fixed)?)
        }
    };
    if args.sheddable_headroom > 0.0 {
        stdout::print(format_args!(
            "sheddable headroom: {} (the frontend's --sheddable-headroom)\n",
            args.sheddable_headroom
        ))?;
    }
    let runs = runner.levels(&start, Mode::Classes { timeouts }, capacity, &LEVELS)?;
    stdout::print(format_args!("{}", class_table(&runs, mix, capacity, args.slo_ttft(), timeouts)))?;
    Ok(())
}

/// `--tenants`: the line's timeout as `--mix` finds it, the tenants file,
/// then at `--tenants-level` x capacity each tenant alone at its share of
/// the rate and all of them together, with the tenants file, then all
/// together without it (one shared line); prints the per-tenant table. The
/// file is removed at the end, also on an error.
fn with_tenants<P: Pooled>(
    args: &Args,
    runtime: &tokio::runtime::Runtime,
    setup: &Setup,
    start: impl Fn(Mode) -> anyhow::Result<(String, P)>,
    tenants: &TenantShares,
) -> anyhow::Result<()> {
    let runner = Runner::new(args, runtime, setup)?;
    let capacity = runner.capacity(&start)?;
    let fixed = if args.router_queue_timeout_ms.is_some() {
        Vec::new()
    } else {
        runner.levels(&start, Mode::Static, capacity, &LEVELS[..1])?
    };
    let timeout_ms = runner.line_timeout(&fixed)?;
    let file = TenantsFile::write(&tenants.names())?;
    stdout::print(format_args!("tenants file: {} (weight 1 each, removed at the end)\n", file.path().display()))?;
    let level = args.tenants_level;
    let rate = level * capacity;
    let with_file = Mode::Tenants { timeout_ms };
    let mut alone = Vec::new();
    for i in 0..tenants.count() {
        let what = format!("{level}x, {} alone", tenants.name(i));
        let load = Load { rate: rate * tenants.share(i), tenants: Some(tenants.alone(i)) };
        alone.push(runner.run(&start, with_file, &load, args.seed, &what)?);
    }
    let load = Load { rate, tenants: Some(tenants.together()) };
    let together = runner.run(&start, with_file, &load, args.seed, &format!("{level}x, together"))?;
    let line_only = runner.run(&start, Mode::Line { timeout_ms }, &load, args.seed, &format!("{level}x, together"))?;
    drop(file);
    let results = TenantResults { capacity, level, objective: args.slo_ttft(), timeout_ms, alone, together, line_only };
    stdout::print(format_args!("{}", tenant_table(&results, tenants)))?;
    Ok(())
}

/// What one run offers: `rate` req/s, from `tenants` (the load
/// generator's `--tenants`) when given.
struct Load {
    rate: f64,
    tenants: Option<String>,
}

/// Runs load levels on fresh pools: what `compare` and the class runs share.
struct Runner<'a> {
    args: &'a Args,
    runtime: &'a tokio::runtime::Runtime,
    setup: &'a Setup,
    duration: Duration,
    drain_timeout: Duration,
}

impl<'a> Runner<'a> {
    fn new(args: &'a Args, runtime: &'a tokio::runtime::Runtime, setup: &'a Setup) -> anyhow::Result<Self> {
        let duration = seconds(args.duration(), "--duration", false)?;
        let drain_timeout = seconds(args.drain_timeout(), "--drain-timeout", true)?;
        Ok(Runner { args, runtime, setup, duration, drain_timeout })
    }

    /// One run's load: `rate` req/s to `http` (several frontends: their
    /// addresses comma-separated, the requests spread over them in turn),
    /// arrivals from `seed`.
    fn bench(&self, http: &str, rate: f64, seed: u64) -> BenchConfig {
        let mut urls = http.split(',').map(completions_url);
        BenchConfig {
            url: urls.next().unwrap_or_default(),
            also: urls.collect(),
            // Its own children on 127.0.0.1: never through a proxy.
            proxy_from_env: false,
            model: self.setup.model.to_owned(),
            rate,
            duration: self.duration,
            prompt_tokens: self.args.prompt_tokens(),
            output_tokens: self.args.output_tokens(),
            stream: true,
            drain_timeout: self.drain_timeout,
            seed,
            max_in_flight: crate::loadgen::DEFAULT_MAX_IN_FLIGHT,
            // A bar on a terminal, as before; no plain lines in a log.
            progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
            mix: None,
            tenants: None,
            // The demo counts SLO goodput itself, per mode and load.
            slo_ttft: None,
        }
    }

    /// `--capacity`, or the closed-loop saturation run's (printed).
    fn capacity<P: Pooled>(&self, start: &impl Fn(Mode) -> anyhow::Result<(String, P)>) -> anyhow::Result<f64> {
        let capacity = match self.args.capacity {
            Some(c) => c,
            None => {
                let (http, mut pool) = start(Mode::Off)?;
                let Saturation { clients, warmup, measure } = self.setup.saturation;
                let bench = self.bench(&http, 1.0, self.args.seed);
                let c = self.runtime.block_on(saturate(&bench, clients, warmup, measure))?;
                pool.check_alive().context("the capacity run")?;
                drop(pool);
                stdout::print(format_args!(
                    "capacity: {c:.1} req/s (closed loop, {clients} clients, {} s after {} s warm-up)\n",
                    measure.as_secs(),
                    warmup.as_secs()
                ))?;
                c
            }
        };
        anyhow::ensure!(capacity.is_finite(), "--capacity must be a number of requests per second");
        anyhow::ensure!(capacity > 0.0, "the capacity is not positive (measured: the pool served nothing)");
        Ok(capacity)
    }

    /// One run per level of `levels` (multiples of `capacity`) in `mode`,
    /// each on a fresh pool, with the class mix when `mode` has classes.
    fn levels<P: Pooled>(
        &self,
        start: &impl Fn(Mode) -> anyhow::Result<(String, P)>,
        mode: Mode,
        capacity: f64,
        levels: &[f64],
    ) -> anyhow::Result<Vec<Run>> {
        let mut runs = Vec::new();
        for (i, multiple) in levels.iter().enumerate() {
            let load = Load { rate: multiple * capacity, tenants: None };
            runs.push(self.run(
                start,
                mode,
                &load,
                self.args.seed.wrapping_add(i as u64),
                &format!("{multiple:>3}x"),
            )?);
        }
        Ok(runs)
    }

    /// One run of `load` in `mode` on a fresh pool, arrivals from `seed`,
    /// with the class mix when `mode` has classes; its progress line says
    /// `what` ran (`2x`).
    fn run<P: Pooled>(
        &self,
        start: &impl Fn(Mode) -> anyhow::Result<(String, P)>,
        mode: Mode,
        load: &Load,
        seed: u64,
        what: &str,
    ) -> anyhow::Result<Run> {
        let objective = self.args.slo_ttft();
        let (http, mut pool) = start(mode)?;
        let mut bench = self.bench(&http, load.rate, seed);
        if mode.has_classes() {
            bench.mix = self.args.mix;
        }
        if let Some(tenants) = &load.tenants {
            bench.tenants = Some(tenants.parse().map_err(|e: String| anyhow::anyhow!("tenants {tenants}: {e}"))?);
        }
        let report = self.runtime.block_on(run_bench(&bench))?;
        pool.check_alive().with_context(|| format!("{} {}", mode.label(), what.trim()))?;
        drop(pool);
        // On stderr, and no reason to stop when nobody reads it.
        let _ = writeln!(
            std::io::stderr(),
            "  {:<26} {what}: SLO goodput {:>5.1} req/s, rejected {:>5.1} %, p50/p99 TTFT {:>6.0} / {:>6.0} ms, \
             unanswered at the drain deadline {}",
            mode.label(),
            report.slo_goodput(objective),
            report.rejected_pct(),
            Percentiles::of(&report.ttft).p50,
            Percentiles::of(&report.ttft).p99,
            report.unfinished
        );
        Ok(Run { report })
    }

    /// `--router-queue-timeout-ms`, or the objective minus the p50 TTFT of
    /// `fixed`'s first run (the static mode at the first level); printed.
    fn line_timeout(&self, fixed: &[Run]) -> anyhow::Result<u64> {
        if let Some(t) = self.args.router_queue_timeout_ms {
            stdout::print(format_args!("waiting line: timeout {t} ms (--router-queue-timeout-ms)\n"))?;
            return Ok(t);
        }
        let objective = self.args.slo_ttft();
        let p50 = fixed.first().map_or(0.0, |r| Percentiles::of(&r.report.ttft).p50);
        let (t, floored) = line_timeout_ms(objective, p50);
        stdout::print(format_args!(
            "waiting line: timeout {t} ms = objective {} ms - p50 TTFT {p50:.0} ms at {}x with static thresholds{}\n",
            objective.as_millis(),
            LEVELS[0],
            if floored { format!(" (floored at {MIN_LINE_TIMEOUT_MS} ms)") } else { String::new() }
        ))?;
        Ok(t)
    }
}

/// The most clients of the closed-loop saturation run.
const MAX_SATURATION_CLIENTS: usize = 2048;

/// Writes the plot of the three modes and prints where.
fn plot(args: &Args, setup: &Setup, results: &Results) -> anyhow::Result<()> {
    let path = args.plot();
    let modes: Vec<(String, Vec<_>)> = results
        .modes()
        .iter()
        .map(|(mode, runs)| {
            (mode.label(), LEVELS.iter().zip(*runs).map(|(m, r)| r.point(*m, results.objective)).collect())
        })
        .collect();
    let objective_ms = results.objective.as_secs_f64() * 1000.0;
    let headline = Headline {
        lines: vec![
            format!(
                "loadgate demo: SLO goodput (TTFT <= {objective_ms:.0} ms) at 0.5x-3x of the measured capacity, {:.1} req/s",
                results.capacity
            ),
            format!(
                "{}, router {}, prompts {} + outputs {} tokens; static thresholds: {}; line: --router-queue-timeout-ms {}; \
                 {} s of arrivals per run",
                setup.pool,
                args.router_mode(),
                args.prompt_tokens(),
                args.output_tokens(),
                setup.shedding,
                results.timeout_ms,
                args.duration()
            ),
        ],
        capacity: results.capacity,
        objective_ms,
    };
    comparison(&path, &headline, &modes).with_context(|| format!("cannot write {}", path.display()))?;
    stdout::print(format_args!("plot: {}\n", path.display()))
}
