//! TODO: events (being written).

/// Command-line arguments.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs the `events` command.
pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("events: not implemented yet")
}
