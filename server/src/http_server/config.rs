//! [`ServeConfig`]: how one listener serves its connections (TLS, the
//! timeouts, the connection and HTTP/2 limits), and [`Tls`], its rustls
//! configuration.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{self, ServerConfig};
use tokio_rustls::TlsAcceptor;

use super::args::{HttpArgs, HTTP2_KEEPALIVE, HTTP2_MAX_CONCURRENT_STREAMS};
use super::limits::default_max_connections;
use super::write_progress::WRITE_TIMEOUT;

/// How long a TLS handshake may take before its connection is dropped.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long an HTTP/1 request head (request line and headers) may take to
/// arrive by default; past it the connection is closed.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a connection with no request in service stays open by default.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

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
    pub(super) fn builder(&self) -> auto::Builder<TokioExecutor> {
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

/// A rustls server configuration (ring provider) loaded from PEM files.
#[derive(Clone)]
pub struct Tls(pub(super) TlsAcceptor);

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
