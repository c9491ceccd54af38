//! TODO: engine (being written).

/// Command-line arguments.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs the `engine` command.
pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("engine: not implemented yet")
}
