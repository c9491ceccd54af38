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
mod config;
mod connection;
mod hangup;
mod limits;
mod registry;
mod service;
mod write_progress;

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

pub use self::args::HttpArgs;
pub use self::body_budget::BodyBudget;
pub use self::config::{ServeConfig, Tls};
use self::registry::Registry;
pub use self::write_progress::WRITE_TIMEOUT;
use crate::throttle::LogThrottle;

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
