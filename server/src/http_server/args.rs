//! [`HttpArgs`]: the HTTP-side limits shared by `loadgate frontend` (its
//! inference listener) and `loadgate worker`: the header-read, idle
//! keep-alive and write-progress timeouts, the connection limit, HTTP/2's
//! stream limit and keep-alive pings, and the graceful-shutdown drain. Each
//! reads `LOADGATE_<FLAG>` (the same variable for both roles), except the
//! drain, which reads Dynamo's `DYN_HTTP_GRACEFUL_SHUTDOWN_TIMEOUT_SECS`.

use std::time::Duration;

/// At most this many concurrent streams per HTTP/2 connection by default.
pub const HTTP2_MAX_CONCURRENT_STREAMS: u32 = 100;

/// How often an HTTP/2 connection is pinged by default, and how long the
/// answer may take.
pub const HTTP2_KEEPALIVE: Duration = Duration::from_secs(20);

/// HTTP-side limits of one listener.
#[derive(Clone, Debug, clap::Args)]
pub struct HttpArgs {
    /// Seconds an HTTP/1 request head (request line and headers) may take to arrive; past it
    /// the connection is closed (a slow-loris head trickled byte by byte). Default 30.
    #[arg(long, env = "LOADGATE_HTTP_HEADER_TIMEOUT_SECS", value_name = "SECS", default_value_t = 30, value_parser = crate::flag_limits::secs(1))]
    pub http_header_timeout_secs: u64,
    /// Seconds a connection with no request in service stays open (HTTP/1 keep-alive and
    /// HTTP/2 alike; a new connection that sends nothing is idle too). Default 60.
    #[arg(long, env = "LOADGATE_HTTP_IDLE_TIMEOUT_SECS", value_name = "SECS", default_value_t = 60, value_parser = crate::flag_limits::secs(1))]
    pub http_idle_timeout_secs: u64,
    /// Open HTTP connections at most. Default: a third of the soft RLIMIT_NOFILE less a reserve of
    /// max(256, nofile/4) descriptors (each connection holds two, and a busy one also one to a
    /// worker), at least 1: 1024 -> 256, 2048 -> 512, 20000 -> 5000. At it, the idle connection unused longest is
    /// closed to admit a new one; with none idle, the new connection is closed at once.
    #[arg(long, env = "LOADGATE_HTTP_MAX_CONNECTIONS", value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub http_max_connections: Option<u64>,
    /// Seconds a response may have data ready that the client does not take (a client that
    /// stopped reading); past it the connection is closed, the request's upstream dropped and its
    /// permit released. Also the sockets' TCP_USER_TIMEOUT. A reader slower than about one TCP
    /// window per this long counts as stalled. Default 30 on the frontend, 35 on a worker (a
    /// client stalled through a frontend is cut there first).
    #[arg(long, env = "LOADGATE_HTTP_WRITE_TIMEOUT_SECS", value_name = "SECS", value_parser = crate::flag_limits::secs(1))]
    pub http_write_timeout_secs: Option<u64>,
    /// Concurrent streams one HTTP/2 connection may open. Default 100.
    #[arg(long, env = "LOADGATE_HTTP2_MAX_CONCURRENT_STREAMS", value_name = "N", default_value_t = HTTP2_MAX_CONCURRENT_STREAMS, value_parser = clap::value_parser!(u32).range(1..))]
    pub http2_max_concurrent_streams: u32,
    /// Seconds between HTTP/2 keep-alive pings. Default 20.
    #[arg(long, env = "LOADGATE_HTTP2_KEEPALIVE_INTERVAL_SECS", value_name = "SECS", default_value_t = 20, value_parser = crate::flag_limits::secs(1))]
    pub http2_keepalive_interval_secs: u64,
    /// Seconds an HTTP/2 keep-alive ping may go unanswered before the connection is closed.
    /// Default 20.
    #[arg(long, env = "LOADGATE_HTTP2_KEEPALIVE_TIMEOUT_SECS", value_name = "SECS", default_value_t = 20, value_parser = crate::flag_limits::secs(1))]
    pub http2_keepalive_timeout_secs: u64,
    /// On SIGTERM: seconds in-flight responses (SSE streams included) may take to finish
    /// before they are cut; new connections are refused meanwhile. Default 5.
    #[arg(long, env = "DYN_HTTP_GRACEFUL_SHUTDOWN_TIMEOUT_SECS", value_name = "SECS", default_value_t = 5, value_parser = crate::flag_limits::secs(0))]
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

    /// `--http-write-timeout-secs` (`None`: the role's default).
    pub fn write_timeout(&self) -> Option<Duration> {
        self.http_write_timeout_secs.map(Duration::from_secs)
    }

    /// `--graceful-shutdown-timeout-secs`.
    pub fn graceful_shutdown_timeout(&self) -> Duration {
        Duration::from_secs(self.graceful_shutdown_timeout_secs)
    }
}
