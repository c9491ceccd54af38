//! TODO: demo (being written).

/// Command-line arguments.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs the `demo` command.
pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("demo: not implemented yet")
}
