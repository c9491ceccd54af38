//! The between-chunks timeout of a relayed upstream response body.

use std::future::Future as _;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::Stream;
use tokio::time::{Instant, Sleep};

/// What the source did next.
pub(crate) enum Chunk<E> {
    /// A chunk; the timer starts again.
    Data(Bytes),
    /// The source failed; it is dropped.
    Failed(E),
    /// The source ended (or was dropped earlier).
    Ended,
    /// Nothing came within the timeout; the source is dropped, which closes
    /// its connection.
    Stalled,
}

/// A response body whose source may send nothing for at most `between`
/// at a time.
pub(crate) struct ChunkTimeout<S> {
    /// `None` once it ended, failed or stalled.
    source: Option<S>,
    /// Fires when the source sent nothing for `between`.
    idle: Pin<Box<Sleep>>,
    between: Duration,
}

impl<S, E> ChunkTimeout<S>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
{
    /// Starts the timer now.
    pub(crate) fn new(source: S, between: Duration) -> Self {
        Self { source: Some(source), idle: Box::pin(tokio::time::sleep(between)), between }
    }

    /// The timeout.
    pub(crate) fn between(&self) -> Duration {
        self.between
    }

    /// Starts the timer again now (reading resumes after a pause that was
    /// not the source's).
    pub(crate) fn restart(&mut self) {
        self.idle.as_mut().reset(Instant::now() + self.between);
    }

    /// Polls the source; after anything but [`Chunk::Data`], only
    /// [`Chunk::Ended`] follows.
    pub(crate) fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<Chunk<E>> {
        let Some(source) = self.source.as_mut() else { return Poll::Ready(Chunk::Ended) };
        let next = match Pin::new(source).poll_next(cx) {
            Poll::Ready(next) => next,
            Poll::Pending => {
                ready!(self.idle.as_mut().poll(cx));
                self.source = None;
                return Poll::Ready(Chunk::Stalled);
            }
        };
        Poll::Ready(match next {
            Some(Ok(chunk)) => {
                self.idle.as_mut().reset(Instant::now() + self.between);
                Chunk::Data(chunk)
            }
            Some(Err(error)) => {
                self.source = None;
                Chunk::Failed(error)
            }
            None => {
                self.source = None;
                Chunk::Ended
            }
        })
    }
}

/// The error a client's body ends with when its source stalled.
pub(crate) fn stalled(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::TimedOut, format!("the {what} stopped sending"))
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;

    use super::*;

    type Source = Pin<Box<dyn Stream<Item = Result<Bytes, &'static str>> + Send>>;

    fn chunks(items: Vec<Result<Bytes, &'static str>>) -> Source {
        Box::pin(futures_util::stream::iter(items))
    }

    async fn next(body: &mut ChunkTimeout<Source>) -> Chunk<&'static str> {
        poll_fn(|cx| body.poll_chunk(cx)).await
    }

    #[tokio::test]
    async fn chunks_pass_and_the_end_repeats() {
        let mut body = ChunkTimeout::new(chunks(vec![Ok(Bytes::from_static(b"a"))]), Duration::from_secs(1));
        assert!(matches!(next(&mut body).await, Chunk::Data(c) if c == "a"));
        assert!(matches!(next(&mut body).await, Chunk::Ended));
        assert!(matches!(next(&mut body).await, Chunk::Ended));
    }

    #[tokio::test]
    async fn a_failure_drops_the_source() {
        let mut body = ChunkTimeout::new(chunks(vec![Err("broken"), Ok(Bytes::new())]), Duration::from_secs(1));
        assert!(matches!(next(&mut body).await, Chunk::Failed("broken")));
        assert!(matches!(next(&mut body).await, Chunk::Ended), "nothing after a failure");
    }

    #[tokio::test]
    async fn silence_stalls_and_each_chunk_restarts_the_timer() {
        let between = Duration::from_millis(200);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Result<Bytes, &'static str>>();
        let mut body = ChunkTimeout::new(Box::pin(receiver(rx)) as Source, between);
        let started = Instant::now();
        for _ in 0..3 {
            tokio::time::sleep(between / 2).await;
            tx.send(Ok(Bytes::from_static(b"x"))).unwrap();
            assert!(matches!(next(&mut body).await, Chunk::Data(_)), "a chunk within the timeout passes");
        }
        let last = Instant::now();
        assert!(matches!(next(&mut body).await, Chunk::Stalled));
        assert!(started.elapsed() >= 3 * between / 2 + between, "the timer restarted at each chunk");
        assert!(last.elapsed() >= between && last.elapsed() < 20 * between, "cut after the timeout");
        assert!(matches!(next(&mut body).await, Chunk::Ended));
        assert!(tx.send(Ok(Bytes::new())).is_err(), "the source was dropped when it stalled");
    }

    fn receiver<T: Send + 'static>(mut rx: tokio::sync::mpsc::UnboundedReceiver<T>) -> impl Stream<Item = T> + Send {
        futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }
}
