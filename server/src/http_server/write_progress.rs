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
//! [`Mark`]: whether data is *owed* to hyper, and how many polls it had.
//! Data is owed from when the response is handed to hyper, when the body
//! yields a frame (hyper must come back for the next), and when the body's
//! source wakes it (data arrived while the body waited); each poll of the
//! body pays it. The connection's task runs [`WriteWatch::check`] eight
//! times per deadline (`connection.rs`) and closes the connection when nine
//! checks in a row found a body owing data with no poll in between: data
//! untaken for at least the deadline, at most an eighth more. No clock is
//! read per frame. Data frames are handed to hyper in pieces of at most
//! [`MAX_PIECE`], so a mark clears at least once per piece taken: a reader
//! slower than about one TCP window (plus hyper's write buffer and one
//! piece) per write timeout counts as stalled; a slow reader that keeps
//! taking data is never cut.
//!
//! Per frame: a few relaxed atomic operations and a waker registration; per
//! response: the connection's own mutex, and the mark of a body that has
//! dropped, reused (no allocation); per connection: one timer, eight times
//! per deadline.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use bytes::Bytes;
use futures_util::task::AtomicWaker;
use http_body::{Body, Frame, SizeHint};

/// The default write-progress deadline of a frontend's listeners
/// (`--http-write-timeout-secs`). A worker's is 5 s longer, so that a
/// client stalled through a frontend is cut there first.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// The largest piece of a data frame handed to hyper at once.
pub const MAX_PIECE: usize = 16 * 1024;

/// Checks per deadline. A body is overdue when one more check than this in
/// a row found data owed and no poll since the check before: owed for at
/// least the deadline, at most an eighth more.
const CHECKS_PER_DEADLINE: u32 = 8;

/// What one connection's task watches: the marks of its response bodies.
#[derive(Debug)]
pub(super) struct WriteWatch {
    deadline: Duration,
    marks: Mutex<Marks>,
}

/// The marks of the bodies handed to hyper. A mark whose body has dropped
/// has only this reference left: it is reused by the next response (no
/// allocation per response on a kept-alive connection), and the free ones
/// past the live bodies are dropped at each check.
#[derive(Debug, Default)]
struct Marks {
    marks: Vec<Arc<Mark>>,
}

impl Marks {
    /// A mark for a new body: a free one, reset, or a new one.
    fn take(&mut self) -> Arc<Mark> {
        if let Some(free) = self.marks.iter().find(|mark| Arc::strong_count(mark) == 1) {
            free.reset();
            return free.clone();
        }
        let mark = Arc::new(Mark::default());
        self.marks.push(mark.clone());
        mark
    }

    /// Drops the free marks but one.
    fn prune(&mut self) {
        let mut kept_free = false;
        self.marks.retain(|mark| {
            let free = Arc::strong_count(mark) == 1;
            let keep = !free || !kept_free;
            kept_free |= free;
            keep
        });
    }
}

/// What [`WriteWatch::check`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Check {
    /// A body has had data ready, untaken, for at least the deadline.
    Overdue,
    /// Nothing is overdue; check again after this long.
    Next(Duration),
}

impl WriteWatch {
    /// A watch that finds a body overdue once its data waited `deadline`.
    pub(super) fn new(deadline: Duration) -> Arc<Self> {
        Arc::new(WriteWatch { deadline, marks: Mutex::new(Marks::default()) })
    }

    /// How often [`check`](Self::check) must run.
    pub(super) fn interval(&self) -> Duration {
        self.deadline / CHECKS_PER_DEADLINE
    }

    /// Wraps a response body handed to hyper now: data is owed (hyper must
    /// poll it).
    pub(super) fn watch<B>(&self, body: B) -> Watched<B> {
        let mark = self.marks.lock().unwrap_or_else(|e| e.into_inner()).take();
        mark.owe();
        Watched { body, waker: Waker::from(mark.clone()), mark, rest: None }
    }

    /// One check, every [`interval`](Self::interval): whether a live body
    /// has owed data, untaken, for [`CHECKS_PER_DEADLINE`] intervals or more.
    pub(super) fn check(&self) -> Check {
        let mut marks = self.marks.lock().unwrap_or_else(|e| e.into_inner());
        marks.prune();
        let overdue = marks
            .marks
            .iter()
            .filter(|mark| Arc::strong_count(mark) > 1)
            .any(|mark| mark.strike() > CHECKS_PER_DEADLINE);
        if overdue {
            Check::Overdue
        } else {
            Check::Next(self.interval())
        }
    }
}

/// Whether one body owes hyper a poll, and how many polls it has had.
#[derive(Debug, Default)]
pub(super) struct Mark {
    /// Data is ready and hyper has not polled since.
    owed: AtomicBool,
    /// Polls so far.
    polls: AtomicU64,
    /// hyper's waker, woken when the body's source wakes.
    hyper: AtomicWaker,
    /// The checker's own: the polls it saw last time, and how many checks
    /// in a row found data owed and no poll since the one before.
    seen_polls: AtomicU64,
    strikes: AtomicU32,
}

impl Mark {
    /// Ready for a new body (the marks' mutex held, no other reference).
    fn reset(&self) {
        // Relaxed: no other reference exists; the mutex orders this before
        // the next check.
        self.owed.store(false, Ordering::Relaxed);
        self.seen_polls.store(self.polls.load(Ordering::Relaxed), Ordering::Relaxed);
        self.strikes.store(0, Ordering::Relaxed);
        drop(self.hyper.take());
    }

    fn owe(&self) {
        // Relaxed: a flag for the watchdog, no data published through it;
        // a change is seen by a later check at the latest.
        self.owed.store(true, Ordering::Relaxed);
    }

    /// hyper is polling: nothing is owed now.
    fn polled(&self) {
        // Relaxed: as `owe`.
        self.owed.store(false, Ordering::Relaxed);
        self.polls.fetch_add(1, Ordering::Relaxed);
    }

    /// The checker's count of checks in a row that found data owed and no
    /// poll since the one before, this check included.
    fn strike(&self) -> u32 {
        // Relaxed: only the checker (under the marks' mutex) writes
        // `seen_polls` and `strikes`; `owed` and `polls` are read as hints
        // (a poll that races the check resets the count at the next one).
        let polls = self.polls.load(Ordering::Relaxed);
        let stalled = self.owed.load(Ordering::Relaxed) && polls == self.seen_polls.load(Ordering::Relaxed);
        self.seen_polls.store(polls, Ordering::Relaxed);
        let strikes = if stalled { self.strikes.load(Ordering::Relaxed) + 1 } else { 0 };
        self.strikes.store(strikes, Ordering::Relaxed);
        strikes
    }
}

impl Wake for Mark {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    /// The body's source has something (data, its end or an error): hyper
    /// owes the body a poll from now on.
    fn wake_by_ref(self: &Arc<Self>) {
        self.owe();
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
        self.mark.owe();
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
        this.mark.polled();
        if let Some(rest) = this.rest.take() {
            return Poll::Ready(Some(Ok(Frame::data(this.piece(rest)))));
        }
        this.mark.hyper.register(cx.waker());
        let mut inner = Context::from_waker(&this.waker);
        match Pin::new(&mut this.body).poll_frame(&mut inner) {
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => Poll::Ready(Some(Ok(Frame::data(this.piece(data))))),
                Err(frame) => {
                    this.mark.owe();
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
    use http_body_util::{BodyExt as _, Full, StreamBody};

    use super::*;

    /// Whether `checks` checks in a row find nothing overdue, then the next does.
    fn overdue_after(watch: &WriteWatch, checks: u32) -> bool {
        (0..checks).all(|_| watch.check() != Check::Overdue) && watch.check() == Check::Overdue
    }

    #[tokio::test]
    async fn a_body_hyper_does_not_poll_is_overdue_after_a_deadline_of_checks() {
        let watch = WriteWatch::new(Duration::from_secs(8));
        assert_eq!(watch.interval(), Duration::from_secs(1));
        // Handed to hyper and never polled: the 9th check (at least 8
        // intervals after the first that saw it) finds it overdue.
        let unpolled = watch.watch(Full::new(Bytes::from_static(b"x")));
        assert!(overdue_after(&watch, CHECKS_PER_DEADLINE));
        drop(unpolled);
        assert_eq!(watch.check(), Check::Next(Duration::from_secs(1)), "a dropped body is forgotten");
    }

    #[tokio::test]
    async fn a_body_waiting_for_its_source_owes_nothing_until_the_source_wakes_it() {
        let watch = WriteWatch::new(Duration::from_secs(8));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
        let source = futures_util::stream::poll_fn(move |cx| {
            rx.poll_recv(cx).map(|b| b.map(|b| Ok::<_, std::convert::Infallible>(Frame::data(b))))
        });
        let mut body = watch.watch(StreamBody::new(source));
        // Polled: nothing ready, so nothing is owed, however long.
        let first = std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut body).poll_frame(cx))).await;
        assert!(first.is_pending());
        for _ in 0..3 * CHECKS_PER_DEADLINE {
            assert_eq!(watch.check(), Check::Next(Duration::from_secs(1)), "waiting on the source is no stall");
        }
        // Data arrives; hyper does not come (the client takes nothing).
        tx.send(Bytes::from_static(b"token")).unwrap();
        assert!(overdue_after(&watch, CHECKS_PER_DEADLINE), "data ready and untaken a deadline long");
        // hyper polls: the count starts again.
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "token");
        assert_ne!(watch.check(), Check::Overdue);
        // A poll between every two checks is never a stall.
        for _ in 0..3 * CHECKS_PER_DEADLINE {
            tx.send(Bytes::from_static(b"t")).unwrap();
            assert_eq!(watch.check(), Check::Next(Duration::from_secs(1)));
            body.frame().await.unwrap().unwrap();
        }
    }

    #[tokio::test]
    async fn a_dropped_body_s_mark_serves_the_next_and_free_ones_are_pruned() {
        let watch = WriteWatch::new(Duration::from_secs(8));
        for _ in 0..1_000 {
            drop(watch.watch(Full::new(Bytes::from_static(b"x"))));
        }
        assert_eq!(watch.marks.lock().unwrap().marks.len(), 1, "one mark serves one body after another");
        // A reused mark starts clean: an unpolled body is overdue only after a full count.
        let held: Vec<_> = (0..50).map(|_| watch.watch(Full::new(Bytes::from_static(b"x")))).collect();
        assert!(overdue_after(&watch, CHECKS_PER_DEADLINE));
        drop(held);
        assert_eq!(watch.check(), Check::Next(Duration::from_secs(1)));
        assert_eq!(watch.marks.lock().unwrap().marks.len(), 1, "free marks past one are dropped at a check");
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
