//! The `loadgate` binary: frontend, simulated worker, load generator, demo.
//!
//! One folder per role: `frontend/` (the HTTP frontend), `worker/` (the
//! simulated worker and its simulator, or a sidecar in front of a real
//! engine), `events/` (the worker-to-frontend load event plane: the
//! worker-side publisher and the frontend-side listener), `upstream/` (one
//! attempt against a worker or an engine, shared by the frontend's proxy and
//! the sidecar), `engines/` (scraping real engines), `http_server/` (serving
//! either role's routes with every wait bounded), `loadgen/` (the load
//! generator and its plots) and `demo/`. The files at the top are shared by
//! several roles; each says which and why. "Engine" always means a real
//! inference engine; loadgate's own is the simulator. Everything
//! loadgate-specific comes from the `loadgate` library's public API.

mod api_error;
mod demo;
mod directory;
mod engines;
mod events;
mod flag_limits;
mod frontend;
mod http_server;
mod loadgen;
mod logging;
mod nats;
mod openai;
mod secret;
mod throttle;
mod tokens;
mod upstream;
mod worker;

use clap::{Parser, Subcommand};

/// Request rejection (load shedding) for LLM inference routers.
#[derive(Debug, Parser)]
#[command(name = "loadgate", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the HTTP frontend: routes OpenAI requests, sheds load.
    // Boxed: the frontend has many flags, and the enum is as large as its largest variant.
    Frontend(Box<frontend::Args>),
    /// Run a simulated continuous-batching worker.
    Worker(Box<worker::Args>),
    /// Generate open-loop load (or, with --retry-storm N, a retry storm) against a frontend or worker.
    Bench(loadgen::Args),
    /// A frontend, simulated workers (or, with --engines llamacpp, real llama.cpp servers) and load at
    /// 0.5x..3x capacity, shedding off and on.
    Demo(demo::Args),
    /// Print the line of a tenants file's `keys` for an API key read from stdin (its SHA-256).
    HashKey,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Frontend(args) => frontend::run(*args),
        Command::Worker(args) => worker::run(*args),
        Command::Bench(args) => loadgen::run(args),
        Command::Demo(args) => demo::run(args),
        Command::HashKey => frontend::print_key_hash(),
    }
}
