//! The write-progress deadline: a response body that has data ready and
//! that the client does not take for `--http-write-timeout-secs` is cut, by
//! closing its connection.
//!
//! A client that stops reading makes hyper stop polling the response body
//! (HTTP/1: the socket and hyper's write buffer are full; HTTP/2: the
//! stream's or the connection's flow-control window is spent, and hyper
//! asks for window before it polls the body at all). A body that is not
//! polled runs no timer of its own, and a connection with a response in
//! service is busy, so no idle timeout applies: without this, such a client
//! holds whatever the body holds (a worker's permit, the router's tracked
//! load, an upstream connection) for as long as it likes.
//!
//! So every response body is wrapped in a [`Watched`] body that keeps one
//! [`Mark`]: *since when data has been ready for hyper to take*, or none.
//! The mark is set when the response is handed to hyper, when the body
//! yields a frame (hyper must come back for the next), and when the body's
//! source wakes it (data arrived while the body waited); it is cleared each
//! time hyper polls the body. The connection's task ([`WriteWatch::check`],
//! `connection.rs`) closes the connection when a mark is older than the
//! deadline. Data frames are handed to hyper in pieces of at most
//! [`MAX_PIECE`], so a mark clears at least once per piece taken: a reader
//! slower than about one TCP window (plus hyper's write buffer and one
//! piece) per write timeout counts as stalled; a slow reader that keeps
//! taking data is never cut.
//!
//! Per frame: two relaxed atomic stores, a clock read and a waker
//! registration; per response: one `Arc` and a push under the connection's
//! own mutex; per connection: one timer, re-armed at most once per
//! deadline while nothing is overdue.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::task::AtomicWaker;
use http_body::{Body, Frame, SizeHint};

/// The default write-progress deadline of a frontend's listeners
/// (`--http-write-timeout-secs`). A worker's is 5 s longer, so that a
/// client stalled through a frontend is cut there first.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// The largest piece of a data frame handed to hyper at once.
pub const MAX_PIECE: usize = 16 * 1024;

/// Nanoseconds since the first call (a process-wide monotonic origin), at
/// least 1: 0 means "no mark".
fn now_ns() -> u64 {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    let origin = *ORIGIN.get_or_init(Instant::now);
    u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX).max(1)
}

/// What one connection's task watches: the marks of its response bodies.
#[derive(Debug)]
pub(super) struct WriteWatch {
    deadline: Duration,
    /// The marks of the bodies alive (a mark whose body dropped has only
    /// this reference left, and is pruned at the next check).
    marks: Mutex<Vec<Arc<Mark>>>,
}

/// What [`WriteWatch::check`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Check {
    /// A body has had data ready, untaken, for this long (≥ the deadline).
    Overdue(Duration),
    /// Nothing is overdue; check again after this long.
    Next(Duration),
}

impl WriteWatch {
    /// A watch that finds a body overdue once its data waited `deadline`.
    pub(super) fn new(deadline: Duration) -> Arc<Self> {
        Arc::new(WriteWatch { deadline, marks: Mutex::new(Vec::new()) })
    }

    /// The deadline.
    pub(super) fn deadline(&self) -> Duration {
        self.deadline
    }

    /// Wraps a response body handed to hyper now (its mark is set: hyper
    /// must poll it).
    pub(super) fn watch<B>(&self, body: B) -> Watched<B> {
        let mark = Arc::new(Mark { ready_since: AtomicU64::new(now_ns()), hyper: AtomicWaker::new() });
        self.marks.lock().unwrap_or_else(|e| e.into_inner()).push(mark.clone());
        Watched { body, waker: Waker::from(mark.clone()), mark, rest: None }
    }

    /// The oldest mark of a live body against the deadline.
    pub(super) fn check(&self) -> Check {
        let now = now_ns();
        let mut marks = self.marks.lock().unwrap_or_else(|e| e.into_inner());
        // Only this reference left: the body has dropped.
        marks.retain(|mark| Arc::strong_count(mark) > 1);
        // Relaxed: a stamp read on its own; a mark set just after is seen
        // at the next check, at most one deadline later.
        let oldest = marks.iter().map(|mark| mark.ready_since.load(Ordering::Relaxed)).filter(|&s| s != 0).min();
        drop(marks);
        let Some(since) = oldest else { return Check::Next(self.deadline) };
        let waited = Duration::from_nanos(now.saturating_sub(since));
        match self.deadline.checked_sub(waited) {
            Some(left) if !left.is_zero() => Check::Next(left),
            _ => Check::Overdue(waited),
        }
    }
}

/// Since when one body's data has waited for hyper.
#[derive(Debug)]
pub(super) struct Mark {
    /// [`now_ns`] when data became ready and hyper had not polled since;
    /// 0 while hyper is not owed a poll.
    ready_since: AtomicU64,
    /// hyper's waker, woken when the body's source wakes.
    hyper: AtomicWaker,
}

impl Mark {
    fn set(&self) {
        // Relaxed: a stamp for the watchdog, no data published through it;
        // a mark already set keeps its older stamp.
        let _ = self.ready_since.compare_exchange(0, now_ns(), Ordering::Relaxed, Ordering::Relaxed);
    }

    fn clear(&self) {
        // Relaxed: as `set`.
        self.ready_since.store(0, Ordering::Relaxed);
    }
}

impl Wake for Mark {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    /// The body's source has something (data, its end or an error): hyper
    /// owes the body a poll from now on.
    fn wake_by_ref(self: &Arc<Self>) {
        self.set();
        self.hyper.wake();
    }
}

/// A response body under the write-progress deadline (see the module docs).
#[derive(Debug)]
pub(super) struct Watched<B> {
    body: B,
    mark: Arc<Mark>,
    /// Wakes through the mark (built once).
    waker: Waker,
    /// The part of a large data frame not yet handed to hyper.
    rest: Option<Bytes>,
}

impl<B> Watched<B> {
    /// The next piece of `data` (at most [`MAX_PIECE`]); the remainder is kept.
    fn piece(&mut self, mut data: Bytes) -> Bytes {
        if data.len() > MAX_PIECE {
            self.rest = Some(data.split_off(MAX_PIECE));
        }
        // hyper must come back for what follows.
        self.mark.set();
        data
    }
}

impl<B> Body for Watched<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        // hyper is here: nothing waits on the client now.
        this.mark.clear();
        if let Some(rest) = this.rest.take() {
            return Poll::Ready(Some(Ok(Frame::data(this.piece(rest)))));
        }
        this.mark.hyper.register(cx.waker());
        let mut inner = Context::from_waker(&this.waker);
        match Pin::new(&mut this.body).poll_frame(&mut inner) {
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => Poll::Ready(Some(Ok(Frame::data(this.piece(data))))),
                Err(frame) => {
                    this.mark.set();
                    Poll::Ready(Some(Ok(frame)))
                }
            },
            // The end, or an error that ends the response: nothing more.
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_none() && self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let rest = self.rest.as_ref().map_or(0, |r| r.len() as u64);
        let inner = self.body.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower().saturating_add(rest));
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper.saturating_add(rest));
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;

    use http_body_util::{BodyExt as _, Full, StreamBody};

    use super::*;

    fn overdue(watch: &WriteWatch) -> bool {
        matches!(watch.check(), Check::Overdue(_))
    }

    #[tokio::test]
    async fn a_body_hyper_does_not_poll_is_overdue_and_one_it_polls_is_not() {
        let watch = WriteWatch::new(Duration::from_millis(50));
        // Handed to hyper and never polled: overdue after the deadline.
        let unpolled = watch.watch(Full::new(Bytes::from_static(b"x")));
        assert!(!overdue(&watch));
        tokio::time::sleep(Duration::from_millis(80)).await;
        assert!(overdue(&watch), "a body hyper never polled is overdue");
        drop(unpolled);
        assert_eq!(watch.check(), Check::Next(Duration::from_millis(50)), "a dropped body is forgotten");
    }

    #[tokio::test]
    async fn a_body_waiting_for_its_source_is_not_overdue_until_the_source_wakes_it() {
        let watch = WriteWatch::new(Duration::from_millis(50));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
        let source = futures_util::stream::poll_fn(move |cx| {
            rx.poll_recv(cx).map(|b| b.map(|b| Ok::<_, std::convert::Infallible>(Frame::data(b))))
        });
        let mut body = watch.watch(StreamBody::new(source));
        // Polled: nothing ready, so nothing is owed.
        let first = poll_fn(|cx| Poll::Ready(Pin::new(&mut body).poll_frame(cx))).await;
        assert!(first.is_pending());
        tokio::time::sleep(Duration::from_millis(80)).await;
        assert!(!overdue(&watch), "waiting on the source is not the client's fault");
        // Data arrives; hyper does not come (the client takes nothing).
        tx.send(Bytes::from_static(b"token")).unwrap();
        tokio::time::sleep(Duration::from_millis(80)).await;
        assert!(overdue(&watch), "data ready and untaken past the deadline");
        // hyper polls: the mark clears, then is set again by the frame handed.
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "token");
        assert!(!overdue(&watch));
    }

    #[tokio::test]
    async fn large_frames_are_handed_in_pieces() {
        let watch = WriteWatch::new(Duration::from_secs(5));
        let data = Bytes::from(vec![7u8; 2 * MAX_PIECE + 10]);
        let mut body = watch.watch(Full::new(data.clone()));
        assert_eq!(body.size_hint().exact(), Some(data.len() as u64));
        let mut pieces = Vec::new();
        while let Some(frame) = body.frame().await {
            pieces.push(frame.unwrap().into_data().unwrap());
        }
        assert_eq!(pieces.iter().map(Bytes::len).collect::<Vec<_>>(), [MAX_PIECE, MAX_PIECE, 10]);
        assert_eq!(pieces.concat(), data);
    }
}
