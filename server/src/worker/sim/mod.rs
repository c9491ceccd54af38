//! The simulator: what a `loadgate worker` without `--engine` runs its
//! requests on. [`Simulator`] is a continuous-batching engine model
//! (`simulator.rs`: ranks, KV blocks, chunked prefill, preemption) that
//! reports each rank's load; `serve.rs` answers the OpenAI routes from it.

mod serve;
mod simulator;

pub(crate) use self::serve::generate;
pub(crate) use self::simulator::{LoadSink, SimConfig, Simulator};
