//! [`Hangup`]: tells when the client has closed its side of a connection,
//! whatever hyper still holds unread.
//!
//! hyper notices a client's close (its FIN) only while its read buffer is
//! empty. A client that sent a stray CRLF after its request body, or a
//! pipelined request, and then went away leaves bytes there: its request
//! would run to the end (a worker's whole generation, holding its place in
//! the cap; a frontend's wait for the worker's first byte), and its
//! connection stay in the table. So every connection keeps a second handle
//! on its socket (a duplicate descriptor, registered with the runtime on
//! its own) that only watches for the peer's close (`EPOLLRDHUP`), and the
//! connection's task drops the connection when it comes, as hyper (no
//! half-close) does when nothing is buffered.

use std::io;

use tokio::io::Interest;
use tokio::net::TcpStream;

/// A watch on one connection's socket for the client's close.
#[derive(Debug)]
pub(super) struct Hangup(Option<TcpStream>);

impl Hangup {
    /// A watch on `tcp` (none if its descriptor cannot be duplicated or
    /// registered: then only hyper notices a close).
    pub(super) fn of(tcp: &TcpStream) -> Hangup {
        let dup = socket2::SockRef::from(tcp).try_clone();
        let watch = dup.ok().and_then(|socket| TcpStream::from_std(socket.into()).ok());
        if watch.is_none() {
            tracing::debug!("no second handle on a connection: only hyper notices its close");
        }
        Hangup(watch)
    }

    /// Resolves once the client has closed its side (never without a
    /// watch). Wakes at each arrival of bytes too (hyper reads them; the
    /// watch only clears its readiness) and at the close.
    pub(super) async fn closed(&self) {
        let Some(watch) = &self.0 else { return std::future::pending().await };
        loop {
            match watch.ready(Interest::READABLE).await {
                Ok(ready) if ready.is_read_closed() => return,
                // Bytes for hyper: wait for the next change.
                Ok(_) => {
                    let _ = watch.try_io(Interest::READABLE, || Err::<(), _>(io::ErrorKind::WouldBlock.into()));
                }
                Err(_) => return std::future::pending().await,
            }
        }
    }
}
