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

/// Logs to stderr, `info` unless `RUST_LOG` says otherwise; a second call
/// (the demo runs several servers in one process) is a no-op.
pub(crate) fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt().with_writer(std::io::stderr).with_env_filter(filter).try_init();
}
