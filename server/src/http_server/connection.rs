//! One accepted connection's task: the TLS handshake if configured, then
//! hyper's HTTP/1 + HTTP/2 server on it, watched for the three ways it is
//! closed from our side:
//!
//! - **idle timeout**: no request in service for `idle_timeout` (a fresh
//!   connection that sent nothing, or only part of a request head, is idle
//!   too; hyper's own header-read timeout also covers a trickled head);
//! - **eviction**: the registry picked it (the idle connection unused
//!   longest) to make room at the connection limit or when accept ran out
//!   of file descriptors;
//! - **drain**: the listener stops; a busy connection finishes its
//!   response(s) and closes, an idle one may carry one more request
//!   (answered with `connection: close` over HTTP/1, after a GOAWAY over
//!   HTTP/2) until the drain ends;
//! - **write progress**: a response body has had data ready that the client
//!   did not take for the write timeout (`write_progress.rs`): the
//!   connection is dropped at once (every response on it with it), since a
//!   client that takes nothing would not take a graceful close either;
//! - **hang-up**: the client closed its side (`hangup.rs`), with bytes
//!   hyper has not read (which keep hyper from noticing): the connection is
//!   dropped, and whatever it asked with it.
//!
//! Closing uses hyper's graceful shutdown (an idle HTTP/1 connection
//! closes at once, HTTP/2 sends GOAWAY); one that has not closed
//! [`CLOSE_GRACE`] later (a peer that stopped reading) is dropped.

use std::io;
use std::time::{Duration, Instant};

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use super::config::{ServeConfig, Tls};
use super::hangup::Hangup;
use super::registry::Slot;
use super::service::tracked;
use super::write_progress::{Check, WriteWatch};
use crate::throttle::LogThrottle;

/// Lines about connections cut for write progress: clients cause them.
static WRITE_STALLS: LogThrottle = LogThrottle::per_second(1);

/// How long a connection asked to close (evicted or idle past the timeout)
/// may take to do so gracefully before it is dropped.
pub const CLOSE_GRACE: Duration = Duration::from_millis(250);

/// How long a connection that had sent bytes when it was accepted is kept
/// from eviction while its first request arrives; past it, it is evictable
/// like an idle one until that request starts.
pub const SENT_GRACE: Duration = Duration::from_secs(1);

/// What a connection ended with.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Serves one accepted connection until it closes (see the module docs).
pub(super) async fn handle(
    tcp: TcpStream,
    router: Router,
    config: &ServeConfig,
    builder: &auto::Builder<TokioExecutor>,
    slot: Slot,
) -> Result<(), BoxError> {
    let hangup = Hangup::of(&tcp);
    match &config.tls {
        None => drive(tcp, router, config, builder, &slot, &hangup).await,
        Some(Tls(acceptor)) => {
            let handshake = tokio::time::timeout(config.tls_handshake_timeout, acceptor.accept(tcp));
            let stream = tokio::select! {
                result = handshake => match result {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(e)) => return Err(format!("TLS handshake failed: {e}").into()),
                    Err(_) => return Err(io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out").into()),
                },
                // Evicted (or the drain began) mid-handshake: nothing is in service.
                () = slot.woken() => return Err("closed during the TLS handshake".into()),
            };
            drive(stream, router, config, builder, &slot, &hangup).await
        }
    }
}

/// HTTP/1 or HTTP/2 (detected from the preface) on one established stream,
/// closed when idle too long, evicted, drained, or hung up.
async fn drive<S>(
    stream: S,
    router: Router,
    config: &ServeConfig,
    builder: &auto::Builder<TokioExecutor>,
    slot: &Slot,
    hangup: &Hangup,
) -> Result<(), BoxError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let watch = WriteWatch::new(config.write_timeout);
    let conn = builder.serve_connection(TokioIo::new(stream), tracked(router, slot.handle(), watch.clone()));
    tokio::pin!(conn);
    let write_check = tokio::time::sleep(watch.interval());
    tokio::pin!(write_check);
    let idle_timeout = config.idle_timeout;
    let idle_check = tokio::time::sleep(idle_timeout);
    tokio::pin!(idle_check);
    let cut = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(cut);
    let sent_grace = tokio::time::sleep(SENT_GRACE);
    tokio::pin!(sent_grace);
    let mut sent_grace_over = false;
    // Graceful shutdown was asked of hyper.
    let mut shutting = false;
    // It must be closed by `cut` at the latest.
    let mut cut_armed = false;
    loop {
        tokio::select! {
            result = conn.as_mut() => return result,
            () = slot.woken() => {
                let status = slot.status();
                if status.evicted && status.busy {
                    // Picked just as a request arrived: finish it, then close.
                    if !shutting {
                        conn.as_mut().graceful_shutdown();
                        shutting = true;
                    }
                } else if status.evicted && !cut_armed {
                    if !shutting {
                        conn.as_mut().graceful_shutdown();
                        shutting = true;
                    }
                    cut.as_mut().reset(tokio::time::Instant::now() + CLOSE_GRACE);
                    cut_armed = true;
                } else if status.draining && status.busy && !shutting {
                    // Finish what is in service, then close; the drain's
                    // deadline bounds it.
                    slot.mark_closing();
                    conn.as_mut().graceful_shutdown();
                    shutting = true;
                }
            }
            () = &mut idle_check, if !shutting => {
                let now = Instant::now();
                match slot.idle_for(now) {
                    Some(idle) if idle >= idle_timeout => {
                        tracing::debug!(?idle, "idle connection closed");
                        slot.mark_closing();
                        conn.as_mut().graceful_shutdown();
                        shutting = true;
                        cut.as_mut().reset(tokio::time::Instant::now() + CLOSE_GRACE);
                        cut_armed = true;
                    }
                    // Idle since `idle` ago: check again when it would be due.
                    Some(idle) => idle_check.as_mut().reset(tokio::time::Instant::now() + (idle_timeout - idle)),
                    // Busy: it cannot be due before a full timeout from now.
                    None => idle_check.as_mut().reset(tokio::time::Instant::now() + idle_timeout),
                }
            }
            () = &mut write_check => match watch.check() {
                Check::Next(after) => write_check.as_mut().reset(tokio::time::Instant::now() + after),
                Check::Overdue => {
                    if let Some(suppressed) = WRITE_STALLS.admit() {
                        tracing::warn!(
                            timeout = ?config.write_timeout,
                            suppressed,
                            "a client took none of its response for the write timeout \
                             (--http-write-timeout-secs); connection closed"
                        );
                    }
                    return Err(io::Error::new(io::ErrorKind::TimedOut, "the client stopped taking its response").into());
                }
            },
            () = &mut sent_grace, if !sent_grace_over => {
                sent_grace_over = true;
                slot.evictable_if_unused();
            }
            () = hangup.closed() => {
                return Err(io::Error::new(io::ErrorKind::ConnectionAborted, "the client closed the connection").into());
            }
            () = &mut cut, if cut_armed => {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "did not close gracefully in time").into());
            }
        }
    }
}
