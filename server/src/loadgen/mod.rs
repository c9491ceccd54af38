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
//! `config.rs` holds the arguments and [`BenchConfig`]; `report.rs` the plain
//! measured data every other piece reads; `open_loop.rs` and
//! `closed_loop.rs` the two kinds of run; `plot.rs` the SVG charts.

mod closed_loop;
mod config;
mod open_loop;
pub mod plot;
mod report;

use anyhow::Context as _;

pub use self::closed_loop::saturate;
pub use self::config::{completions_url, Args, BenchConfig};
pub use self::open_loop::run_bench;
pub use self::report::{BenchReport, Percentiles};

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
        plot::timeline(path, &report).with_context(|| format!("cannot write {}", path.display()))?;
        if !args.json {
            println!("plot: {}", path.display());
        }
    }
    Ok(())
}
