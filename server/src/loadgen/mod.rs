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
//!
//! With `--retry-storm N` it runs a retry storm instead: N clients that
//! honour `retry-after-ms` / `Retry-After` start in one burst and retry
//! every refusal ([`run_storm`]; its `StormReport` renders its figures: the
//! peak of retries in any 10 ms window, goodput, time to success).
//!
//! Every kind of run counts its requests in a shared `Tally` as they end;
//! `progress.rs` shows it on stderr while the run goes on (unless
//! `--quiet`), and a run in which no request got an HTTP answer exits 1.
//!
//! With `--mix` each request's priority class is drawn and sent
//! (`mix.rs`), and the report counts each class apart. With `--tenants`
//! each request's tenant is drawn too and sent as its API key and in
//! `x-loadgate-tenant` (`tenants.rs`); the report counts each tenant apart
//! the same way.
//!
//! `config.rs` holds the arguments, [`BenchConfig`] and [`StormConfig`];
//! `report.rs` the plain measured data every other piece reads;
//! `open_loop.rs`, `closed_loop.rs` and `retry_storm.rs` the three kinds of
//! run; `storm_report.rs` the storm's figures; `plot.rs` the SVG charts.

mod answer;
mod client;
mod closed_loop;
mod config;
mod mix;
mod open_loop;
pub mod plot;
mod progress;
mod report;
mod retry_storm;
mod storm_report;
mod tenants;

use std::sync::Arc;

use anyhow::Context as _;

pub use self::closed_loop::saturate;
pub use self::config::{
    completions_url, Args, BenchConfig, StormConfig, DEFAULT_MAX_IN_FLIGHT, MAX_OUTPUT_TOKENS, MAX_PROMPT_TOKENS,
    MAX_RATE,
};
pub use self::mix::ClassMix;
pub use self::open_loop::run_bench;
use self::open_loop::run_bench_tallied;
use self::progress::Tally;
#[cfg(test)]
pub(crate) use self::report::report_for_test;
#[cfg(test)]
pub(crate) use self::report::ClassReport;
pub use self::report::{BenchReport, Percentiles};
pub use self::retry_storm::run_storm;
pub use self::tenants::TenantMix;
use crate::stdout;

/// Runs `loadgate bench`.
///
/// # Errors
///
/// Invalid arguments, a plot that cannot be written, or a run in which no
/// request got an HTTP answer (after its report is printed).
pub fn run(args: Args) -> anyhow::Result<()> {
    if let Some(path) = &args.plot {
        anyhow::ensure!(args.retry_storm.is_none(), "--plot draws open-loop runs only, not --retry-storm");
        plot::check_writable(path)?;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let tally = Arc::new(Tally::default());
    if let Some(storm) = StormConfig::from_args(&args)? {
        let report = runtime.block_on(run_storm(&storm, &tally))?;
        if args.json {
            stdout::print(format_args!("{}\n", serde_json::to_string(&report.summary())?))?;
        } else {
            stdout::print(format_args!("{}", report.table()))?;
        }
        return tally.ensure_answered();
    }
    let config = BenchConfig::from_args(&args)?;
    let report = runtime.block_on(run_bench_tallied(&config, &tally))?;
    if args.json {
        stdout::print(format_args!("{}\n", serde_json::to_string(&report.summary())?))?;
    } else {
        stdout::print(format_args!("{}", report.table()))?;
    }
    if let Some(path) = &args.plot {
        plot::timeline(path, &report).with_context(|| format!("cannot write {}", path.display()))?;
        if !args.json {
            stdout::print(format_args!("plot: {}\n", path.display()))?;
        }
    }
    tally.ensure_answered()
}
