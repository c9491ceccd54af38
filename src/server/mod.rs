//! The runnable system (feature `server`): HTTP frontend, simulated workers,
//! the worker-to-frontend load event plane, the load generator and the demo.

pub mod demo;
pub mod directory;
pub mod engine;
pub mod events;
pub mod frontend;
pub mod inflight;
pub mod loadgen;
pub mod openai;
pub mod plot;
pub mod proxy;
pub mod reply;
pub mod threshold_api;
pub mod tokens;
pub mod worker;
