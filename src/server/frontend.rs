//! TODO: frontend (being written).

/// Command-line arguments.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs the `frontend` command.
pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("frontend: not implemented yet")
}
