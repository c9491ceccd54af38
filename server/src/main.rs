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
mod env_names;
mod events;
mod flag_limits;
mod frontend;
mod http_server;
mod loadgen;
mod logging;
mod nats;
mod openai;
mod reason_phrase;
mod secret;
mod stdout;
mod text;
mod throttle;
mod tokens;
mod upstream;
mod worker;

use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand};

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
    /// Run a worker: a simulated continuous-batching engine, or with --engine KIND=URL a sidecar
    /// that caps a real engine (vLLM, SGLang, llama.cpp) at N + Q requests and reports its load.
    Worker(Box<worker::Args>),
    /// Generate load against a frontend or worker: open loop (--rate R --duration S) or a retry
    /// storm (--retry-storm N), with a report and an optional plot.
    Bench(loadgen::Args),
    /// A frontend, simulated workers (or, with --engines llamacpp, real llama.cpp servers) and load at
    /// 0.5x..3x capacity, shedding off and on.
    Demo(demo::Args),
    /// Print the line of a tenants file's `keys` for an API key read from stdin (its SHA-256).
    HashKey,
}

fn main() -> anyhow::Result<()> {
    // Each command's own variable names (`env_names`): the old shared
    // names are read (deprecated) before clap reads the environment.
    env_names::carry_deprecated(&env_names::renames(&Cli::command()));
    let cli = Cli::from_arg_matches(&env_names::apply(Cli::command()).get_matches()).unwrap_or_else(|e| e.exit());
    match cli.command {
        Command::Frontend(args) => frontend::run(*args),
        Command::Worker(args) => worker::run(*args),
        Command::Bench(args) => loadgen::run(args),
        Command::Demo(args) => demo::run(args),
        Command::HashKey => frontend::print_key_hash(),
    }
}

/// The flags of every command of `cli` that `pick` picks, as
/// `command --flag (VARIABLE)` (the tests' lists of what breaks a rule).
#[cfg(test)]
pub(crate) fn flags_where(cli: &clap::Command, pick: impl Fn(&clap::Arg) -> bool) -> Vec<String> {
    let mut picked = Vec::new();
    for sub in cli.get_subcommands() {
        for arg in sub.get_arguments().filter(|a| a.get_long().is_some() && pick(a)) {
            let env = arg.get_env().map(|e| e.to_string_lossy().into_owned()).unwrap_or_default();
            picked.push(format!("{} --{} ({env})", sub.get_name(), arg.get_long().unwrap_or_default()));
        }
    }
    picked
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::flags_where;

    /// Every flag of every command is listed under a heading of `--help`
    /// (listeners, shedding, limits, ...), not in one flat list.
    #[test]
    fn every_flag_has_a_help_heading() {
        let missing = flags_where(&super::Cli::command(), |arg| arg.get_help_heading().is_none());
        assert!(missing.is_empty(), "flags without a heading: {missing:?}");
    }

    /// Every boolean flag's variable takes `1/yes/on` and `0/no/off` too, in
    /// any case (docs/deployment.md), as clap's `BoolishValueParser` reads
    /// them: four took only `true` and `false` (clap's plain boolean parser,
    /// whose possible values are those two), and a frontend with `…=1` did
    /// not start.
    #[test]
    fn every_boolean_variable_takes_the_documented_words() {
        let strict = flags_where(&super::Cli::command(), |arg| {
            let values: Vec<String> = arg.get_possible_values().iter().map(|v| v.get_name().to_owned()).collect();
            arg.get_env().is_some() && values == ["true", "false"]
        });
        assert!(strict.is_empty(), "boolean flags taking only true and false: {strict:?}");
    }
}
