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
//! - Request bodies are bounded by the frontend's body budget and the
//!   worker's body reader, not here.
//!
//! [`serve_until`] drains gracefully when its stop future resolves: it
//! closes the listener (new connections are refused), lets every busy
//! connection finish its responses (SSE streams included) and close, for
//! at most the drain timeout, then drops whatever is left (see
//! `connection.rs` for what an idle connection may still do meanwhile).
//! The admin listener uses [`ServeConfig::plain`] with
//! [`ADMIN_MAX_CONNECTIONS`].

mod args;
mod connection;
mod limits;
mod registry;
mod service;

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
pub use self::limits::default_max_connections;
use self::registry::Registry;
use crate::throttle::LogThrottle;

/// How long a TLS handshake may take before its connection is dropped.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long an HTTP/1 request head (request line and headers) may take to
/// arrive by default; past it the connection is closed.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a connection with no request in service stays open by default.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

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
}

impl ServeConfig {
    /// Plain HTTP with the default limits: header 30 s, idle 60 s,
    /// connections from the file limit ([`default_max_connections`]).
    pub fn plain() -> Self {
        ServeConfig {
            tls: None,
            tls_handshake_timeout: TLS_HANDSHAKE_TIMEOUT,
            header_read_timeout: HEADER_READ_TIMEOUT,
            idle_timeout: IDLE_TIMEOUT,
            max_connections: default_max_connections(),
        }
    }

    /// The limits `args` give (`--http-max-connections` absent: from the
    /// file limit), TLS with `tls`.
    pub fn from_args(args: &HttpArgs, tls: Option<Tls>) -> Self {
        ServeConfig {
            tls,
            tls_handshake_timeout: TLS_HANDSHAKE_TIMEOUT,
            header_read_timeout: args.header_timeout(),
            idle_timeout: args.idle_timeout(),
            max_connections: args
                .http_max_connections
                .map_or_else(default_max_connections, |n| usize::try_from(n).unwrap_or(usize::MAX)),
        }
    }

    /// hyper-util's HTTP/1 + HTTP/2 server with these limits. hyper runs
    /// no timeout without a timer, so both protocols get tokio's.
    fn builder(&self) -> auto::Builder<TokioExecutor> {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder.http1().timer(TokioTimer::new()).header_read_timeout(self.header_read_timeout);
        builder.http2().timer(TokioTimer::new());
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
mod tests {
    use std::io::{Read as _, Write as _};
    use std::time::Instant;

    use super::*;

    /// `/` answers "ok"; `/slow` streams 8 chunks 100 ms apart, then "end".
    fn router() -> Router {
        let slow = || async {
            let chunks = futures_util::stream::unfold(0u32, |i| async move {
                match i {
                    0..8 => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        Some((Ok::<_, std::convert::Infallible>(bytes::Bytes::from("chunk\n")), i + 1))
                    }
                    8 => Some((Ok(bytes::Bytes::from("end")), i + 1)),
                    _ => None,
                }
            });
            axum::body::Body::from_stream(chunks)
        };
        Router::new().route("/", axum::routing::get(|| async { "ok" })).route("/slow", axum::routing::get(slow))
    }

    async fn spawn_server(config: ServeConfig) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        (addr, tokio::spawn(serve(listener, router(), config)))
    }

    /// Reads one `GET /` answer ("ok", content-length 2) off a keep-alive connection.
    fn read_ok(stream: &mut std::net::TcpStream) -> String {
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut seen = Vec::new();
        let mut buf = [0u8; 1024];
        while !seen.ends_with(b"\r\n\r\nok") {
            match stream.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
        String::from_utf8_lossy(&seen).into_owned()
    }

    fn connect(addr: std::net::SocketAddr) -> std::net::TcpStream {
        std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap()
    }

    const GET: &[u8] = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n";
    /// How `/slow`'s chunked answer ends.
    const SLOW_END: &str = "3\r\nend\r\n0\r\n\r\n";
    const GET_SLOW: &[u8] = b"GET /slow HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n";

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_idle_keep_alive_connection_is_closed_at_the_idle_timeout_and_a_long_response_is_not() {
        let config = ServeConfig { idle_timeout: Duration::from_millis(300), ..ServeConfig::plain() };
        let (addr, server) = spawn_server(config).await;
        let (kept, fresh, slow) = tokio::task::spawn_blocking(move || {
            let mut kept = connect(addr);
            kept.write_all(GET).unwrap();
            let first = read_ok(&mut kept);
            assert!(first.starts_with("HTTP/1.1 200"), "{first:?}");
            // Used again within the timeout: it stays open.
            std::thread::sleep(Duration::from_millis(150));
            kept.write_all(GET).unwrap();
            let second = read_ok(&mut kept);
            assert!(second.starts_with("HTTP/1.1 200"), "{second:?}");
            let idle_from = Instant::now();
            let (_, closed) = read_to_close(&mut kept, Duration::from_secs(5));
            let kept = (closed, idle_from.elapsed());
            // A connection that never sends anything is idle too.
            let started = Instant::now();
            let mut fresh = connect(addr);
            let (_, closed) = read_to_close(&mut fresh, Duration::from_secs(5));
            let fresh = (closed, started.elapsed());
            // A response streaming for 0.8 s (past the idle timeout) is busy, not idle.
            let mut slow = connect(addr);
            slow.write_all(GET_SLOW).unwrap();
            let (seen, closed) = read_to_close(&mut slow, Duration::from_secs(5));
            (kept, fresh, (String::from_utf8_lossy(&seen).into_owned(), closed))
        })
        .await
        .unwrap();
        assert!(kept.0 && fresh.0, "idle connections are closed");
        for elapsed in [kept.1, fresh.1] {
            assert!(elapsed >= Duration::from_millis(250) && elapsed < Duration::from_secs(3), "{elapsed:?}");
        }
        assert!(slow.1 && slow.0.ends_with(SLOW_END), "the streamed response completes whole: {:?}", slow.0);
        server.abort();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_idle_http2_connection_is_closed_at_the_idle_timeout_with_a_goaway() {
        let config = ServeConfig { idle_timeout: Duration::from_millis(300), ..ServeConfig::plain() };
        let (addr, server) = spawn_server(config).await;
        let (seen, closed, took) = tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let mut stream = connect(addr);
            // The HTTP/2 preface and an empty SETTINGS frame, then nothing.
            stream.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
            stream.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).unwrap();
            let (seen, closed) = read_to_close(&mut stream, Duration::from_secs(5));
            (seen, closed, started.elapsed())
        })
        .await
        .unwrap();
        assert!(closed, "an idle HTTP/2 connection is closed");
        assert!(took >= Duration::from_millis(250) && took < Duration::from_secs(3), "{took:?}");
        // Frames: 3-byte length, 1-byte type; GOAWAY is type 7.
        let mut at = 0;
        let mut goaway = false;
        while at + 9 <= seen.len() {
            let length = (usize::from(seen[at]) << 16) | (usize::from(seen[at + 1]) << 8) | usize::from(seen[at + 2]);
            goaway |= seen[at + 3] == 7;
            at += 9 + length;
        }
        assert!(goaway, "closed gracefully with a GOAWAY: {seen:?}");
        server.abort();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn at_the_limit_the_idle_connection_unused_longest_is_closed_for_a_new_one() {
        let config = ServeConfig { max_connections: 3, ..ServeConfig::plain() };
        let (addr, server) = spawn_server(config).await;
        let outcome = tokio::task::spawn_blocking(move || {
            let mut oldest = connect(addr);
            std::thread::sleep(Duration::from_millis(50));
            let mut used = connect(addr);
            std::thread::sleep(Duration::from_millis(50));
            let mut fresh = connect(addr);
            std::thread::sleep(Duration::from_millis(50));
            // `used` serves a request: now `oldest` is idle longest, then `fresh`.
            used.write_all(GET).unwrap();
            assert!(read_ok(&mut used).starts_with("HTTP/1.1 200"));
            let started = Instant::now();
            let mut newcomer = connect(addr);
            newcomer.write_all(GET).unwrap();
            let answer = read_ok(&mut newcomer);
            let answered_in = started.elapsed();
            let (_, oldest_closed) = read_to_close(&mut oldest, Duration::from_secs(2));
            let (_, fresh_closed) = read_to_close(&mut fresh, Duration::from_millis(200));
            used.write_all(GET).unwrap();
            let used_again = read_ok(&mut used);
            (answer, answered_in, oldest_closed, fresh_closed, used_again)
        })
        .await
        .unwrap();
        let (answer, answered_in, oldest_closed, fresh_closed, used_again) = outcome;
        assert!(answer.starts_with("HTTP/1.1 200"), "the new connection is served: {answer:?}");
        assert!(answered_in < Duration::from_secs(1), "{answered_in:?}");
        assert!(oldest_closed, "the idle connection unused longest is closed");
        assert!(!fresh_closed, "only one connection is closed");
        assert!(used_again.starts_with("HTTP/1.1 200"), "{used_again:?}");
        server.abort();
    }

    /// One byte on every connection (a request that never comes) holds the
    /// slots only for the sent-bytes grace: then a new `GET` is served.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connections_that_send_one_byte_cannot_hold_the_limit() {
        let config = ServeConfig { max_connections: 3, ..ServeConfig::plain() };
        let (addr, server) = spawn_server(config).await;
        let answer = tokio::task::spawn_blocking(move || {
            let mut holders: Vec<_> = (0..3).map(|_| connect(addr)).collect();
            for stream in &mut holders {
                stream.write_all(b"G").unwrap();
            }
            std::thread::sleep(connection::SENT_GRACE + Duration::from_millis(300));
            let mut probe = connect(addr);
            probe.write_all(GET).unwrap();
            let answer = read_ok(&mut probe);
            drop(holders);
            answer
        })
        .await
        .unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "served past the one-byte holders: {answer:?}");
        server.abort();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn at_the_limit_with_every_connection_busy_a_new_one_is_closed_at_once() {
        let config = ServeConfig { max_connections: 2, ..ServeConfig::plain() };
        let (addr, server) = spawn_server(config).await;
        let (refused, slow) = tokio::task::spawn_blocking(move || {
            let mut busy: Vec<_> = (0..2).map(|_| connect(addr)).collect();
            for stream in &mut busy {
                stream.write_all(GET_SLOW).unwrap();
            }
            std::thread::sleep(Duration::from_millis(150));
            let started = Instant::now();
            let mut refused = connect(addr);
            let _ = refused.write_all(GET);
            let (seen, closed) = read_to_close(&mut refused, Duration::from_secs(2));
            let refused = (seen.is_empty(), closed, started.elapsed());
            let slow: Vec<_> = busy
                .iter_mut()
                .map(|s| String::from_utf8_lossy(&read_to_close(s, Duration::from_secs(5)).0).into_owned())
                .collect();
            (refused, slow)
        })
        .await
        .unwrap();
        assert!(refused.0 && refused.1, "closed without an answer: {refused:?}");
        assert!(refused.2 < Duration::from_millis(500), "{:?}", refused.2);
        assert!(slow.iter().all(|s| s.ends_with(SLOW_END)), "busy responses are untouched: {slow:?}");
        server.abort();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_drain_lets_in_flight_responses_finish_and_refuses_new_connections() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_until(
            listener,
            router(),
            ServeConfig::plain(),
            async {
                let _ = stopped.await;
            },
            Duration::from_secs(5),
        ));
        let (mut slow, mut idle) = tokio::task::spawn_blocking(move || {
            let mut slow = connect(addr);
            slow.write_all(GET_SLOW).unwrap();
            let mut idle = connect(addr);
            idle.write_all(GET).unwrap();
            assert!(read_ok(&mut idle).starts_with("HTTP/1.1 200"));
            std::thread::sleep(Duration::from_millis(150));
            (slow, idle)
        })
        .await
        .unwrap();
        let started = Instant::now();
        stop.send(()).unwrap();
        let (slow, refused, last) = tokio::task::spawn_blocking(move || {
            std::thread::sleep(Duration::from_millis(50));
            let refused = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err();
            // An idle keep-alive connection may carry one more request, then closes.
            idle.write_all(GET).unwrap();
            let (last, _) = read_to_close(&mut idle, Duration::from_secs(5));
            let (seen, closed) = read_to_close(&mut slow, Duration::from_secs(5));
            (
                (String::from_utf8_lossy(&seen).into_owned(), closed),
                refused,
                String::from_utf8_lossy(&last).into_owned(),
            )
        })
        .await
        .unwrap();
        let drained = tokio::time::timeout(Duration::from_secs(7), server).await.unwrap().unwrap();
        assert!(refused, "new connections are refused once the drain starts");
        assert!(slow.1 && slow.0.ends_with(SLOW_END), "the in-flight response completes: {:?}", slow.0);
        assert!(last.starts_with("HTTP/1.1 200"), "{last:?}");
        assert!(drained.settled && drained.cut == 0, "{drained:?}");
        assert_eq!(drained.busy_at_stop, 1, "{drained:?}");
        assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    }

    /// Reads until EOF (or `within`); returns what arrived and whether the
    /// peer closed.
    fn read_to_close(stream: &mut std::net::TcpStream, within: Duration) -> (Vec<u8>, bool) {
        stream.set_read_timeout(Some(within)).unwrap();
        let mut seen = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            match stream.read(&mut buf) {
                Ok(0) => return (seen, true),
                Ok(n) => seen.extend_from_slice(&buf[..n]),
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    return (seen, false)
                }
                Err(_) => return (seen, true),
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn serves_plain_http() {
        let (addr, server) = spawn_server(ServeConfig::plain()).await;
        let answer = tokio::task::spawn_blocking(move || {
            let mut stream = std::net::TcpStream::connect(addr).unwrap();
            stream.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").unwrap();
            read_to_close(&mut stream, Duration::from_secs(5))
        })
        .await
        .unwrap();
        let text = String::from_utf8_lossy(&answer.0).into_owned();
        assert!(text.starts_with("HTTP/1.1 200") && text.ends_with("ok"), "{text:?}");
        assert!(answer.1, "connection: close is honoured");
        server.abort();
    }

    #[test]
    fn the_defaults_are_30_s_header_60_s_idle_and_the_file_limit() {
        let config = ServeConfig::plain();
        assert_eq!(config.header_read_timeout, Duration::from_secs(30));
        assert_eq!(config.idle_timeout, Duration::from_secs(60));
        assert_eq!(config.max_connections, default_max_connections());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stalled_request_head_is_closed_after_the_timeout() {
        let config = ServeConfig { header_read_timeout: Duration::from_millis(300), ..ServeConfig::plain() };
        let (addr, server) = spawn_server(config).await;
        let (stalled, served) = tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let mut stalled = std::net::TcpStream::connect(addr).unwrap();
            // Half a request head, then nothing.
            stalled.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nx-slow: ").unwrap();
            let (_, closed) = read_to_close(&mut stalled, Duration::from_secs(5));
            let stalled = (closed, started.elapsed());
            // A prompt client on another connection is served meanwhile and after.
            let mut prompt = std::net::TcpStream::connect(addr).unwrap();
            prompt.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").unwrap();
            (stalled, read_to_close(&mut prompt, Duration::from_secs(5)))
        })
        .await
        .unwrap();
        assert!(stalled.0, "a stalled request head must be closed");
        assert!(stalled.1 >= Duration::from_millis(250) && stalled.1 < Duration::from_secs(4), "{:?}", stalled.1);
        assert!(String::from_utf8_lossy(&served.0).starts_with("HTTP/1.1 200"), "{:?}", served.0);
        assert!(!server.is_finished(), "the accept loop keeps running");
        server.abort();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stalled_tls_handshake_is_dropped_after_the_timeout() {
        let generated = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        let dir =
            std::env::temp_dir().join(format!("loadgate-http-server-{}-{}", std::process::id(), fastrand::u64(..)));
        std::fs::create_dir_all(&dir).unwrap();
        let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
        std::fs::write(&cert, generated.cert.pem()).unwrap();
        std::fs::write(&key, generated.key_pair.serialize_pem()).unwrap();
        let tls = Tls::load(&cert, &key).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let config =
            ServeConfig { tls_handshake_timeout: Duration::from_millis(200), tls: Some(tls), ..ServeConfig::plain() };
        let (addr, server) = spawn_server(config).await;
        let (stalled, garbage) = tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let mut stalled = std::net::TcpStream::connect(addr).unwrap();
            let (_, closed) = read_to_close(&mut stalled, Duration::from_secs(5));
            let stalled = (closed, started.elapsed());
            let mut plain = std::net::TcpStream::connect(addr).unwrap();
            plain.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
            let (seen, closed) = read_to_close(&mut plain, Duration::from_secs(5));
            (stalled, (seen, closed))
        })
        .await
        .unwrap();
        assert!(stalled.0, "a stalled handshake must be dropped");
        assert!(stalled.1 >= Duration::from_millis(150) && stalled.1 < Duration::from_secs(4), "{:?}", stalled.1);
        assert!(garbage.1, "plain HTTP on a TLS port is closed");
        assert!(!String::from_utf8_lossy(&garbage.0).contains("HTTP/"), "no HTTP answer in clear");
        assert!(!server.is_finished(), "the accept loop keeps running");
        server.abort();
    }
}
