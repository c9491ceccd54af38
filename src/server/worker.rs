//! TODO: worker (being written).

/// Command-line arguments.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs the `worker` command.
pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("worker: not implemented yet")
}
