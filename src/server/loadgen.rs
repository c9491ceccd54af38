//! TODO: loadgen (being written).

/// Command-line arguments.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs the `loadgen` command.
pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("loadgen: not implemented yet")
}
