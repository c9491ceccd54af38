//! Logging setup shared by every role.

/// Logs to stderr, `info` unless `RUST_LOG` says otherwise; a second call
/// (the demo runs several servers in one process) is a no-op.
pub(crate) fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt().with_writer(std::io::stderr).with_env_filter(filter).try_init();
}
