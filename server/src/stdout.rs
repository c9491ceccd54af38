//! [`print`]: what a command reports on stdout. A stdout nobody reads any
//! more (`loadgate demo | head -1`, a closed pipe) is an error the command
//! returns, stopping it as any error does (the demo's children stopped),
//! not a panic as `println!`'s.

use std::io::Write as _;

use anyhow::Context as _;

/// Writes `text` on stdout, at once.
///
/// # Errors
///
/// Stdout cannot be written (its reader is gone).
pub(crate) fn print(text: std::fmt::Arguments<'_>) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_fmt(text).and_then(|()| out.flush()).context("cannot write to stdout")
}
