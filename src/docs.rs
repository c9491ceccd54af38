//! Background reading, rendered from the repository's `docs/` folder (the
//! same files, readable on the forge too).

#[doc = include_str!("../docs/architecture.md")]
pub mod architecture {}

#[doc = include_str!("../docs/semantics.md")]
pub mod semantics {}

#[doc = include_str!("../docs/benchmarks.md")]
pub mod benchmarks {}

#[doc = include_str!("../docs/deployment.md")]
pub mod deployment {}
