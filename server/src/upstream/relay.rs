//! [`relay`]: an upstream's response body on its way to the client, read by
//! a task of its own, so that what the request holds follows the upstream,
//! not the client.
//!
//! The task reads the upstream (each chunk within the between-chunks
//! timeout) into a buffer of at most [`CLIENT_BUFFER`] bytes (plus one
//! chunk) that the client's body drains. When the upstream's body ends,
//! fails or stalls, the task drops the [`Watcher`] (the frontend's tracked
//! load, a sidecar's permit) and the upstream body (its connection) at
//! once, whether or not the client has read the buffer yet; only the
//! buffer waits for the client. A client that does not keep up fills the
//! buffer and the task stops reading the upstream (back-pressure), until
//! the write-progress deadline of the client's connection
//! (`http_server/write_progress.rs`) drops the client's body. A client that
//! goes away drops its body; the task sees it at once, even while it waits
//! for the upstream, and drops the upstream request, which closes its
//! connection (the engine then frees the slot).

use std::collections::VecDeque;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use futures_util::Stream;
use http_body::Frame;

use super::chunk_timeout::{stalled, Chunk, ChunkTimeout};
use super::failure::{warn_failure, Failure, Peer};
use super::watcher::Watcher;

/// Bytes read ahead of the client at most (plus one chunk).
pub(crate) const CLIENT_BUFFER: usize = 64 * 1024;

/// An upstream's response body.
pub(crate) type UpstreamBody = Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>;

/// How the upstream's body ended for the relay.
#[derive(Debug)]
enum End {
    /// Read whole.
    Complete,
    /// It broke, or sent nothing within the between-chunks timeout; why.
    Failed(Failure, String),
    /// The client's body was dropped first.
    ClientGone,
}

/// The client's body for `source`, whose `first` chunk is already read
/// (and seen by `watcher`). Spawns the task that reads the rest.
pub(crate) fn relay<W: Watcher>(
    first: Option<Bytes>,
    source: UpstreamBody,
    between_chunks: Duration,
    peer: Peer,
    watcher: W,
) -> Body {
    let shared = Arc::new(Shared::default());
    if let Some(first) = first {
        shared.lock().push(first);
    }
    let source = ChunkTimeout::new(source, between_chunks);
    let pump = Pump { source, shared: shared.clone(), watcher, peer, paused: false };
    tokio::spawn(pump.run());
    Body::new(ClientBody { shared })
}

/// The buffer between the task and the client's body.
#[derive(Debug, Default)]
struct Shared(Mutex<Buffer>);

#[derive(Debug, Default)]
struct Buffer {
    chunks: VecDeque<Bytes>,
    bytes: usize,
    /// `Some` once the upstream ended: `Ok` read whole, `Err` how it failed.
    end: Option<Result<(), Failure>>,
    /// The client's body dropped.
    client_gone: bool,
    /// The client's body waits for a chunk.
    reader: Option<Waker>,
    /// The task waits for room (or for the client to go).
    writer: Option<Waker>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Buffer> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Buffer {
    fn push(&mut self, chunk: Bytes) {
        self.bytes += chunk.len();
        self.chunks.push_back(chunk);
        if let Some(reader) = self.reader.take() {
            reader.wake();
        }
    }

    fn finish(&mut self, end: Result<(), Failure>) {
        self.end = Some(end);
        if let Some(reader) = self.reader.take() {
            reader.wake();
        }
    }
}

/// The task that reads the upstream into the buffer.
struct Pump<W> {
    source: ChunkTimeout<UpstreamBody>,
    shared: Arc<Shared>,
    watcher: W,
    peer: Peer,
    /// The buffer was full: the upstream was not read, so its silence
    /// since the last chunk was not its own.
    paused: bool,
}

impl<W: Watcher> Pump<W> {
    async fn run(mut self) {
        let end = poll_fn(|cx| self.poll_end(cx)).await;
        match end {
            End::Complete => self.shared.lock().finish(Ok(())),
            End::Failed(failure, detail) => {
                self.watcher.failed(failure);
                warn_failure(self.peer, failure, "a relayed response was cut", &detail);
                self.shared.lock().finish(Err(failure));
            }
            End::ClientGone => {}
        }
        // `self` drops here: the watcher (what the request held) and the
        // upstream body (its connection), whatever the client still reads.
    }

    /// Moves chunks from the upstream to the buffer while there is room.
    fn poll_end(&mut self, cx: &mut Context<'_>) -> Poll<End> {
        loop {
            {
                let mut buffer = self.shared.lock();
                if buffer.client_gone {
                    return Poll::Ready(End::ClientGone);
                }
                // Registered on every poll, so the client leaving wakes the
                // task even while it waits for the upstream.
                if !buffer.writer.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    buffer.writer = Some(cx.waker().clone());
                }
                if buffer.bytes >= CLIENT_BUFFER {
                    self.paused = true;
                    return Poll::Pending;
                }
            }
            if std::mem::take(&mut self.paused) {
                // The between-chunks timeout counts from when reading resumes.
                self.source.restart();
            }
            match self.source.poll_chunk(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Chunk::Data(chunk)) => {
                    self.watcher.chunk(&chunk);
                    self.shared.lock().push(chunk);
                }
                Poll::Ready(Chunk::Ended) => return Poll::Ready(End::Complete),
                Poll::Ready(Chunk::Failed(error)) => {
                    return Poll::Ready(End::Failed(Failure::Broken, error.to_string()))
                }
                Poll::Ready(Chunk::Stalled) => {
                    let detail = format!("nothing sent for {:?}", self.source.between());
                    return Poll::Ready(End::Failed(Failure::BetweenChunks, detail));
                }
            }
        }
    }
}

/// The client's side of the buffer.
#[derive(Debug)]
struct ClientBody {
    shared: Arc<Shared>,
}

impl http_body::Body for ClientBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let mut buffer = self.shared.lock();
        if let Some(chunk) = buffer.chunks.pop_front() {
            buffer.bytes -= chunk.len();
            if let Some(writer) = buffer.writer.take() {
                writer.wake();
            }
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        match buffer.end {
            Some(Ok(())) => Poll::Ready(None),
            Some(Err(Failure::BetweenChunks)) => Poll::Ready(Some(Err(stalled("upstream")))),
            Some(Err(failure)) => Poll::Ready(Some(Err(std::io::Error::other(failure.label())))),
            None => {
                buffer.reader = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl Drop for ClientBody {
    fn drop(&mut self) {
        let mut buffer = self.shared.lock();
        buffer.client_gone = true;
        buffer.chunks.clear();
        if let Some(writer) = buffer.writer.take() {
            writer.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use http_body_util::BodyExt as _;

    use super::*;

    /// What a [`Probe`] saw.
    #[derive(Default)]
    struct Seen {
        chunks: AtomicUsize,
        failed: Mutex<Option<Failure>>,
        dropped: AtomicBool,
    }

    /// Counts chunks, records a failure, and flags its drop.
    struct Probe(Arc<Seen>);

    impl Watcher for Probe {
        fn chunk(&mut self, _chunk: &[u8]) {
            self.0.chunks.fetch_add(1, Ordering::SeqCst);
        }
        fn failed(&mut self, failure: Failure) {
            *self.0.failed.lock().unwrap() = Some(failure);
        }
    }

    impl Drop for Probe {
        fn drop(&mut self) {
            self.0.dropped.store(true, Ordering::SeqCst);
        }
    }

    type Sender = tokio::sync::mpsc::UnboundedSender<reqwest::Result<Bytes>>;

    fn source() -> (Sender, UpstreamBody) {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        (tx, Box::pin(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))))
    }

    fn probe() -> (Probe, Arc<Seen>) {
        let seen = Arc::new(Seen::default());
        (Probe(seen.clone()), seen)
    }

    async fn eventually(what: &str, check: impl Fn() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !check() {
            assert!(tokio::time::Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    #[tokio::test]
    async fn what_the_request_holds_is_released_when_the_upstream_ends_not_when_the_client_reads() {
        let (tx, upstream) = source();
        let (probe, seen) = probe();
        let body = relay(Some(Bytes::from_static(b"a")), upstream, Duration::from_secs(5), Peer::Engine, probe);
        tx.send(Ok(Bytes::from_static(b"b"))).unwrap();
        drop(tx);
        // Nobody reads the client's body, yet the upstream is read whole.
        eventually("the watcher is dropped at the upstream's end", || seen.dropped.load(Ordering::SeqCst)).await;
        assert_eq!(seen.chunks.load(Ordering::SeqCst), 1, "the relay saw b; a was seen by the attempt");
        let read = body.collect().await.unwrap().to_bytes();
        assert_eq!(read, "ab");
    }

    #[tokio::test]
    async fn a_client_that_does_not_read_stops_the_upstream_at_the_buffer() {
        let (tx, upstream) = source();
        let (probe, seen) = probe();
        let body = relay(None, upstream, Duration::from_secs(5), Peer::Engine, probe);
        for _ in 0..40 {
            tx.send(Ok(Bytes::from(vec![0u8; 4096]))).unwrap();
        }
        // 64 KiB buffered: 16 chunks read, then nothing until the client reads.
        eventually("the buffer fills", || seen.chunks.load(Ordering::SeqCst) == CLIENT_BUFFER / 4096).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(seen.chunks.load(Ordering::SeqCst), CLIENT_BUFFER / 4096, "no more read than the buffer holds");
        assert!(!seen.dropped.load(Ordering::SeqCst));
        // The client goes: the upstream is dropped (its sender sees it).
        drop(body);
        eventually("the upstream is dropped when the client goes", || tx.is_closed()).await;
        assert!(seen.dropped.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_client_that_leaves_while_the_upstream_is_silent_drops_it_at_once() {
        let (tx, upstream) = source();
        let (probe, seen) = probe();
        let body = relay(None, upstream, Duration::from_secs(30), Peer::Engine, probe);
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(body);
        eventually("the upstream is dropped", || tx.is_closed()).await;
        assert!(seen.dropped.load(Ordering::SeqCst));
        assert_eq!(*seen.failed.lock().unwrap(), None, "a client leaving is no upstream failure");
    }

    #[tokio::test]
    async fn a_silent_upstream_is_cut_and_counted_and_the_client_gets_an_error() {
        let (_tx, upstream) = source();
        let (probe, seen) = probe();
        let body = relay(Some(Bytes::from_static(b"x")), upstream, Duration::from_millis(50), Peer::Engine, probe);
        let error = body.collect().await.unwrap_err();
        assert!(error.to_string().contains("stopped sending"), "{error}");
        assert_eq!(*seen.failed.lock().unwrap(), Some(Failure::BetweenChunks));
        assert!(seen.dropped.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_pause_for_a_slow_client_is_not_the_upstream_s_silence() {
        let (tx, upstream) = source();
        let (probe, seen) = probe();
        let between = Duration::from_millis(100);
        let mut body = relay(None, upstream, between, Peer::Engine, probe);
        for _ in 0..CLIENT_BUFFER / 4096 {
            tx.send(Ok(Bytes::from(vec![0u8; 4096]))).unwrap();
        }
        // The buffer is full; the client takes nothing for 3 timeouts.
        eventually("the buffer fills", || seen.chunks.load(Ordering::SeqCst) == CLIENT_BUFFER / 4096).await;
        tokio::time::sleep(3 * between).await;
        // It reads one chunk; the upstream sends its next within the timeout.
        body.frame().await.unwrap().unwrap();
        tokio::time::sleep(between / 2).await;
        tx.send(Ok(Bytes::from_static(b"next"))).unwrap();
        drop(tx);
        let rest = body.collect().await.expect("not cut for the client's pause").to_bytes();
        assert!(rest.ends_with(b"next"));
        assert_eq!(*seen.failed.lock().unwrap(), None);
    }
}
