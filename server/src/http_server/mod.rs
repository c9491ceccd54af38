//! Serving an axum [`Router`] on a TCP listener, plain or TLS, with every
//! wait bounded.
//!
//! `axum::serve` cannot terminate TLS, so the frontend's inference and admin
//! listeners and the worker all serve through [`serve`] / [`serve_until`]:
//! an accept loop that sets `TCP_NODELAY` (tokens and SSE chunks are small
//! writes that Nagle would hold back), optionally runs a rustls handshake,
//! and hands each connection to hyper-util's HTTP/1 + HTTP/2 server, given
//! tokio's timer so that hyper's timeouts run. A connection that fails (a
//! bad handshake, plain HTTP on a TLS port, a peer that goes away) is only
//! dropped: nothing it sends affects another connection.
//!
//! Limits ([`ServeConfig`]; the flags are in [`HttpArgs`]):
//!
//! - TLS handshake: [`TLS_HANDSHAKE_TIMEOUT`] (10 s).
//! - Request head (HTTP/1): `--http-header-timeout-secs` (default 30 s,
//!   [`HEADER_READ_TIMEOUT`]): a head trickled byte by byte is closed then.
//! - Idle keep-alive: `--http-idle-timeout-secs` (default 60 s,
//!   [`IDLE_TIMEOUT`]): a connection with no request in service that long is
//!   closed, HTTP/1 and HTTP/2 alike (hyper has no idle timer: the service
//!   marks each request busy until its response body ends, `service.rs`).
//! - Connections: `--http-max-connections` (default: the soft
//!   `RLIMIT_NOFILE` less `max(256, nofile/4)`, `limits.rs`). At the limit
//!   the idle connection unused longest is closed to admit the new one (a
//!   fresh connection that sent nothing counts as idle), so a new
//!   `GET /health` is still answered; with none idle, the new connection is
//!   closed at once. `O(log n)` per accept (`registry.rs`). A connection
//!   whose first bytes are already there when it is accepted (one peek) is
//!   not idle until its first request ends, so a burst of accepts cannot
//!   evict a request before its task has read it.
//! - Out of descriptors (EMFILE/ENFILE on accept): the [`EMFILE_EVICTIONS`]
//!   (8) idle connections unused longest are closed, the loop pauses
//!   ([`EVICTED_PAUSE`], 2 ms, or [`ACCEPT_ERROR_PAUSE`], 20 ms, when
//!   nothing was idle) and goes on; it keeps accepting once descriptors
//!   free up. Warnings are rate-limited (one per [`ACCEPT_WARNING_EVERY`]).
//! - Connections asked to close still hold a descriptor until their task
//!   closes them (at most [`connection::CLOSE_GRACE`], 250 ms): while more
//!   than `max(64, limit/4)` are closing, a new connection at the limit is
//!   refused rather than admitted.
//! - Listen backlog: [`LISTEN_BACKLOG`] (4096, capped by `somaxconn`) for
//!   listeners made with [`bind`], so a burst waits in the kernel instead
//!   of having SYNs dropped.
//! - Write progress: `--http-write-timeout-secs` (default 30 s,
//!   [`WRITE_TIMEOUT`]; a worker's 5 s more): a response body with data
//!   ready that the client does not take that long closes its connection
//!   (`write_progress.rs`); accepted sockets get the same `TCP_USER_TIMEOUT`,
//!   so the kernel too gives up on data the peer never acknowledges.
//! - HTTP/2: at most `--http2-max-concurrent-streams` (default 100) streams
//!   per connection, and a keep-alive ping every
//!   `--http2-keepalive-interval-secs` (20 s) that must be answered within
//!   `--http2-keepalive-timeout-secs` (20 s).
//! - Request bodies: the routes read them through one [`BodyBudget`]
//!   (`body_budget.rs`): a limit per body, a budget over all of them (the
//!   frontend's; a worker has none), idle and total deadlines.
//!
//! [`serve_until`] drains gracefully when its stop future resolves: it
//! closes the listener (new connections are refused), lets every busy
//! connection finish its responses (SSE streams included) and close, for
//! at most the drain timeout, then drops whatever is left (see
//! `connection.rs` for what an idle connection may still do meanwhile).
//! The admin listener uses [`ServeConfig::plain`] with
//! [`ADMIN_MAX_CONNECTIONS`].

mod args;
mod body_budget;
mod connection;
mod limits;
mod registry;
mod service;
mod write_progress;

use std::future::Future;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{self, ServerConfig};
use tokio_rustls::TlsAcceptor;

pub use self::args::HttpArgs;
pub use self::body_budget::BodyBudget;
pub use self::limits::default_max_connections;
use self::registry::Registry;
pub use self::write_progress::WRITE_TIMEOUT;
use crate::throttle::LogThrottle;

/// How long a TLS handshake may take before its connection is dropped.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long an HTTP/1 request head (request line and headers) may take to
/// arrive by default; past it the connection is closed.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a connection with no request in service stays open by default.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// At most this many concurrent streams per HTTP/2 connection by default.
pub const HTTP2_MAX_CONCURRENT_STREAMS: u32 = 100;

/// How often an HTTP/2 connection is pinged by default, and how long the
/// answer may take.
pub const HTTP2_KEEPALIVE: Duration = Duration::from_secs(20);

/// The admin listener's connection limit (its connections come out of the
/// inference listener's descriptor reserve).
pub const ADMIN_MAX_CONNECTIONS: usize = 64;

/// How long the accept loop pauses after an accept error (e.g. out of file
/// descriptors), so it does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(20);

/// Out of descriptors, how many idle connections (unused longest first)
/// are closed at once to make room.
const EMFILE_EVICTIONS: usize = 8;

/// The pause after an accept error when idle connections were closed: their
/// tasks close them within it.
const EVICTED_PAUSE: Duration = Duration::from_millis(2);

/// At most one accept-failure (or refusal) warning this often.
const ACCEPT_WARNING_EVERY: Duration = Duration::from_secs(5);

/// How one listener serves its connections.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// Terminate TLS with this acceptor (none: plain HTTP).
    pub tls: Option<Tls>,
    /// Bound on one TLS handshake.
    pub tls_handshake_timeout: Duration,
    /// Bound on reading one HTTP/1 request head.
    pub header_read_timeout: Duration,
    /// A connection with no request in service this long is closed.
    pub idle_timeout: Duration,
    /// Open connections at most (at least 1).
    pub max_connections: usize,
    /// A response body whose ready data the client does not take this long
    /// closes its connection; also the sockets' `TCP_USER_TIMEOUT`.
    pub write_timeout: Duration,
    /// Concurrent streams per HTTP/2 connection at most.
    pub http2_max_concurrent_streams: u32,
    /// How often an HTTP/2 connection is pinged.
    pub http2_keepalive_interval: Duration,
    /// How long a ping's answer may take before the connection is closed.
    pub http2_keepalive_timeout: Duration,
}

impl ServeConfig {
    /// Plain HTTP with the default limits: header 30 s, idle 60 s, write
    /// 30 s, connections from the file limit ([`default_max_connections`]),
    /// 100 streams per HTTP/2 connection pinged every 20 s.
    pub fn plain() -> Self {
        ServeConfig {
            tls: None,
            tls_handshake_timeout: TLS_HANDSHAKE_TIMEOUT,
            header_read_timeout: HEADER_READ_TIMEOUT,
            idle_timeout: IDLE_TIMEOUT,
            max_connections: default_max_connections(),
            write_timeout: WRITE_TIMEOUT,
            http2_max_concurrent_streams: HTTP2_MAX_CONCURRENT_STREAMS,
            http2_keepalive_interval: HTTP2_KEEPALIVE,
            http2_keepalive_timeout: HTTP2_KEEPALIVE,
        }
    }

    /// The limits `args` give (`--http-max-connections` absent: from the
    /// file limit; `--http-write-timeout-secs` absent: `write_timeout`), TLS
    /// with `tls`.
    pub fn from_args(args: &HttpArgs, write_timeout: Duration, tls: Option<Tls>) -> Self {
        ServeConfig {
            tls,
            tls_handshake_timeout: TLS_HANDSHAKE_TIMEOUT,
            header_read_timeout: args.header_timeout(),
            idle_timeout: args.idle_timeout(),
            max_connections: args
                .http_max_connections
                .map_or_else(default_max_connections, |n| usize::try_from(n).unwrap_or(usize::MAX)),
            write_timeout: args.write_timeout().unwrap_or(write_timeout),
            http2_max_concurrent_streams: args.http2_max_concurrent_streams,
            http2_keepalive_interval: Duration::from_secs(args.http2_keepalive_interval_secs),
            http2_keepalive_timeout: Duration::from_secs(args.http2_keepalive_timeout_secs),
        }
    }

    /// hyper-util's HTTP/1 + HTTP/2 server with these limits. hyper runs
    /// no timeout without a timer, so both protocols get tokio's.
    fn builder(&self) -> auto::Builder<TokioExecutor> {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder.http1().timer(TokioTimer::new()).header_read_timeout(self.header_read_timeout);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(self.http2_max_concurrent_streams)
            .keep_alive_interval(self.http2_keepalive_interval)
            .keep_alive_timeout(self.http2_keepalive_timeout);
        builder
    }
}

/// How a drain ([`serve_until`]) ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Drained {
    /// Connections open when the stop came.
    pub open_at_stop: usize,
    /// Connections with a request in service when the stop came.
    pub busy_at_stop: usize,
    /// Every in-flight response finished before the deadline.
    pub settled: bool,
    /// Connections still busy (or still closing) when the deadline passed.
    pub cut: usize,
}

/// A rustls server configuration (ring provider) loaded from PEM files.
#[derive(Clone)]
pub struct Tls(TlsAcceptor);

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls(..)")
    }
}

impl Tls {
    /// Loads a PEM certificate chain (leaf first) and its PEM private key
    /// (PKCS#8, PKCS#1 or SEC1). Offers HTTP/2 and HTTP/1.1 by ALPN.
    ///
    /// # Errors
    ///
    /// A file that cannot be read, holds no certificate or no key, or a key
    /// that does not match the certificate.
    pub fn load(cert_path: &Path, key_path: &Path) -> anyhow::Result<Tls> {
        let cert_pem =
            std::fs::read(cert_path).with_context(|| format!("cannot read --tls-cert-path {}", cert_path.display()))?;
        let key_pem =
            std::fs::read(key_path).with_context(|| format!("cannot read --tls-key-path {}", key_path.display()))?;
        let certs = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| anyhow::anyhow!("invalid PEM in --tls-cert-path {}: {e}", cert_path.display()))?;
        anyhow::ensure!(!certs.is_empty(), "--tls-cert-path {} holds no PEM certificate", cert_path.display());
        let key = PrivateKeyDer::from_pem_slice(&key_pem)
            .map_err(|e| anyhow::anyhow!("no usable PEM private key in --tls-key-path {}: {e}", key_path.display()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .with_context(|| {
                format!("invalid TLS certificate/key pair ({} and {})", cert_path.display(), key_path.display())
            })?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Tls(TlsAcceptor::from(Arc::new(config))))
    }
}

/// Serves `router` on `listener` until the returned future is dropped (or
/// its task aborted); every open connection is dropped with it.
pub async fn serve(listener: TcpListener, router: Router, config: ServeConfig) {
    serve_until(listener, router, config, std::future::pending(), Duration::ZERO).await;
}

/// Serves `router` on `listener` until `stop` resolves, then drains: the
/// listener closes (new connections are refused), busy connections finish
/// their responses and close, for at most `drain`; then every connection
/// left is dropped and the drain's outcome returned. Dropping the future
/// drops every connection at once.
pub async fn serve_until(
    listener: TcpListener,
    router: Router,
    config: ServeConfig,
    stop: impl Future<Output = ()>,
    drain: Duration,
) -> Drained {
    let builder = Arc::new(config.builder());
    let registry = Registry::new(config.max_connections);
    // Owns every connection task: dropping this future aborts them all.
    let mut connections = JoinSet::new();
    // Out of file descriptors, accept fails on every try.
    let accept_warnings = LogThrottle::new(1, ACCEPT_WARNING_EVERY);
    let refusal_warnings = LogThrottle::new(1, ACCEPT_WARNING_EVERY);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    let Some(slot) = registry.admit(has_sent_bytes(&tcp)) else {
                        // At the limit with nothing idle to close: closed at once.
                        drop(tcp);
                        if let Some(suppressed) = refusal_warnings.admit() {
                            tracing::warn!(
                                limit = config.max_connections,
                                suppressed,
                                "connection refused: at the connection limit and no connection is idle"
                            );
                        }
                        continue;
                    };
                    // No Nagle delay on small writes; a failure only costs latency.
                    let _ = tcp.set_nodelay(true);
                    // The kernel gives up on data the peer does not acknowledge
                    // as the write-progress deadline does; a failure leaves that
                    // deadline alone in charge.
                    let _ = socket2::SockRef::from(&tcp).set_tcp_user_timeout(Some(config.write_timeout));
                    let router = router.clone();
                    let config = config.clone();
                    let builder = builder.clone();
                    connections.spawn(async move {
                        if let Err(e) = connection::handle(tcp, router, &config, &builder, slot).await {
                            tracing::debug!(%peer, error = %e, "connection closed with an error");
                        }
                    });
                }
                Err(e) => {
                    let exhausted = out_of_descriptors(&e);
                    // Make room: the idle connections unused longest go first.
                    let evicted = if exhausted {
                        (0..EMFILE_EVICTIONS).take_while(|_| registry.evict_oldest_idle()).count()
                    } else {
                        0
                    };
                    if let Some(suppressed) = accept_warnings.admit() {
                        tracing::warn!(
                            error = %e,
                            open = registry.open(),
                            evicted_idle_connections = evicted,
                            suppressed,
                            "accept failed; pausing"
                        );
                    }
                    // Long enough for the evicted connections' tasks to close them.
                    tokio::time::sleep(if evicted > 0 { EVICTED_PAUSE } else { ACCEPT_ERROR_PAUSE }).await;
                }
            },
            // Reap finished connection tasks so the set does not grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            () = &mut stop => break,
        }
    }
    drop(listener);
    let open_at_stop = registry.open();
    let busy_at_stop = registry.unsettled().0;
    registry.start_drain();
    let deadline = tokio::time::Instant::now() + drain;
    // The connection tasks run on their own meanwhile; finished ones are
    // reaped when the set drops.
    let settled = registry.settled(deadline).await;
    let (busy, closing) = registry.unsettled();
    connections.abort_all();
    Drained { open_at_stop, busy_at_stop, settled, cut: if settled { 0 } else { busy.max(closing) } }
}

/// The listen backlog of [`bind`] (the kernel caps it at `somaxconn`): a
/// burst of connections waits there instead of having its SYNs dropped
/// (a dropped SYN is retried only after 1 s).
pub const LISTEN_BACKLOG: u32 = 4096;

/// Binds a listener on `host:port` (the first address `host` resolves to
/// that binds) with `SO_REUSEADDR` and a [`LISTEN_BACKLOG`] backlog.
///
/// # Errors
///
/// A host that resolves to nothing, or no address that binds.
pub async fn bind(host: &str, port: u16) -> io::Result<TcpListener> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{host} resolves to no address"));
    for addr in tokio::net::lookup_host((host, port)).await? {
        let socket = match addr {
            std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
            std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
        };
        socket.set_reuseaddr(true)?;
        match socket.bind(addr).and_then(|()| socket.listen(LISTEN_BACKLOG)) {
            Ok(listener) => return Ok(listener),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Whether the peer of a just-accepted connection has already sent bytes
/// (a request on its way), without reading them: one non-blocking peek.
fn has_sent_bytes(tcp: &tokio::net::TcpStream) -> bool {
    let mut byte = [std::mem::MaybeUninit::<u8>::uninit()];
    matches!(socket2::SockRef::from(tcp).peek(&mut byte), Ok(n) if n > 0)
}

/// EMFILE or ENFILE: the process or the system is out of file descriptors.
fn out_of_descriptors(error: &io::Error) -> bool {
    matches!(rustix::io::Errno::from_io_error(error), Some(rustix::io::Errno::MFILE | rustix::io::Errno::NFILE))
}

#[cfg(test)]
mod tests;
