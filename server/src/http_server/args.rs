//! [`HttpArgs`]: the HTTP-side limits shared by `loadgate frontend` (its
//! inference listener) and `loadgate worker`: the header-read and idle
//! keep-alive timeouts, the connection limit, and the graceful-shutdown
//! drain. Each reads `LOADGATE_HTTP_<FLAG>` (the same variable for both
//! roles), except the drain, which reads Dynamo's
//! `DYN_HTTP_GRACEFUL_SHUTDOWN_TIMEOUT_SECS`.

use std::time::Duration;

/// HTTP-side limits of one listener.
#[derive(Clone, Debug, clap::Args)]
pub struct HttpArgs {
    /// Seconds a request head (request line and headers) may take to arrive; past it the
    /// connection is closed.
    #[arg(long, env = "LOADGATE_HTTP_HEADER_TIMEOUT_SECS", value_name = "SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub http_header_timeout_secs: u64,
    /// Seconds an idle keep-alive connection (no request in progress) stays open.
    #[arg(long, env = "LOADGATE_HTTP_IDLE_TIMEOUT_SECS", value_name = "SECS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub http_idle_timeout_secs: u64,
    /// Open HTTP connections at most (default: the process's file limit less a reserve); at it,
    /// the idle connection unused longest is closed to admit a new one.
    #[arg(long, env = "LOADGATE_HTTP_MAX_CONNECTIONS", value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub http_max_connections: Option<u64>,
    /// On SIGTERM: seconds in-flight responses may take to finish before they are cut.
    #[arg(long, env = "DYN_HTTP_GRACEFUL_SHUTDOWN_TIMEOUT_SECS", value_name = "SECS", default_value_t = 5)]
    pub graceful_shutdown_timeout_secs: u64,
}

impl HttpArgs {
    /// `--http-header-timeout-secs`.
    pub fn header_timeout(&self) -> Duration {
        Duration::from_secs(self.http_header_timeout_secs)
    }

    /// `--http-idle-timeout-secs`.
    pub fn idle_timeout(&self) -> Duration {
        Duration::from_secs(self.http_idle_timeout_secs)
    }

    /// `--graceful-shutdown-timeout-secs`.
    pub fn graceful_shutdown_timeout(&self) -> Duration {
        Duration::from_secs(self.graceful_shutdown_timeout_secs)
    }
}
