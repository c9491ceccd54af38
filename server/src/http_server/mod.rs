//! Serving an axum [`Router`] on a TCP listener, plain or TLS.
//!
//! `axum::serve` cannot terminate TLS, so the frontend's inference and admin
//! listeners and the worker all serve through [`serve`]: an accept loop that
//! sets `TCP_NODELAY` (tokens and SSE chunks are small writes that Nagle
//! would hold back), optionally runs a rustls handshake (bounded by
//! [`ServeConfig::tls_handshake_timeout`]), and hands each connection to
//! hyper-util's HTTP/1 + HTTP/2 server, given tokio's timer so that hyper's
//! timeouts run. A connection that fails (a bad handshake, plain HTTP on a
//! TLS port, a peer that goes away) is only dropped: nothing it sends
//! affects another connection.
//!
//! Per-connection limits today: the TLS handshake timeout and the HTTP/1
//! header-read timeout ([`HEADER_READ_TIMEOUT`]: a request head must arrive
//! whole within it, else the connection is closed). There is no idle
//! keep-alive timeout and no connection cap yet; request bodies are bounded
//! by the frontend's body budget and the worker's body reader.

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{self, ServerConfig};
use tokio_rustls::TlsAcceptor;

mod args;

pub use self::args::HttpArgs;
use crate::throttle::LogThrottle;

/// How long a TLS handshake may take before its connection is dropped.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long an HTTP/1 request head (request line and headers) may take to
/// arrive; past it the connection is closed.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the accept loop pauses after an accept error (e.g. out of file
/// descriptors), so it does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(20);

/// At most one accept-failure warning this often.
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
}

impl ServeConfig {
    /// Plain HTTP.
    pub fn plain() -> Self {
        ServeConfig {
            tls: None,
            tls_handshake_timeout: TLS_HANDSHAKE_TIMEOUT,
            header_read_timeout: HEADER_READ_TIMEOUT,
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

    /// Plain HTTP, or TLS with `tls`.
    pub fn with_tls(tls: Option<Tls>) -> Self {
        ServeConfig { tls, ..ServeConfig::plain() }
    }
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
    let builder = Arc::new(config.builder());
    // Owns every connection task: dropping this future aborts them all.
    let mut connections = JoinSet::new();
    // Out of file descriptors, accept fails on every try.
    let accept_warnings = LogThrottle::new(1, ACCEPT_WARNING_EVERY);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    // No Nagle delay on small writes; a failure only costs latency.
                    let _ = tcp.set_nodelay(true);
                    let router = router.clone();
                    let config = config.clone();
                    let builder = builder.clone();
                    connections.spawn(async move {
                        if let Err(e) = handle(tcp, router, &config, &builder).await {
                            tracing::debug!(%peer, error = %e, "connection closed with an error");
                        }
                    });
                }
                Err(e) => {
                    if let Some(suppressed) = accept_warnings.admit() {
                        tracing::warn!(error = %e, suppressed, "accept failed");
                    }
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                }
            },
            // Reap finished connection tasks so the set does not grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// One accepted connection: the TLS handshake if configured, then HTTP.
async fn handle(
    tcp: TcpStream,
    router: Router,
    config: &ServeConfig,
    builder: &auto::Builder<TokioExecutor>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    match &config.tls {
        None => serve_connection(tcp, router, builder).await,
        Some(Tls(acceptor)) => {
            let stream = match tokio::time::timeout(config.tls_handshake_timeout, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => return Err(format!("TLS handshake failed: {e}").into()),
                Err(_) => {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out").into());
                }
            };
            serve_connection(stream, router, builder).await
        }
    }
}

/// HTTP/1 or HTTP/2 (detected from the preface) on one established stream.
async fn serve_connection<S>(
    stream: S,
    router: Router,
    builder: &auto::Builder<TokioExecutor>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = TowerToHyperService::new(router);
    builder.serve_connection_with_upgrades(TokioIo::new(stream), service).await
}

#[cfg(test)]
mod tests {
    use std::io::{Read as _, Write as _};
    use std::time::Instant;

    use super::*;

    async fn spawn_server(config: ServeConfig) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = Router::new().route("/", axum::routing::get(|| async { "ok" }));
        (addr, tokio::spawn(serve(listener, router, config)))
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
    fn the_default_header_read_timeout_is_30_s() {
        assert_eq!(ServeConfig::plain().header_read_timeout, Duration::from_secs(30));
        assert_eq!(ServeConfig::with_tls(None).header_read_timeout, HEADER_READ_TIMEOUT);
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
            ServeConfig { tls_handshake_timeout: Duration::from_millis(200), ..ServeConfig::with_tls(Some(tls)) };
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
