//! [`PermitStream`]: a response stream that holds its permit to the end.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_core::Stream;
use pin_project_lite::pin_project;

pin_project! {
    /// A stream of `Result`s holding `permit` (usually a
    /// [`Permit`](super::Permit)) until the stream ends, yields its first
    /// error, or is dropped (the client went away), whichever comes first.
    ///
    /// A streamed response (SSE tokens) keeps running on the engine after
    /// the handler returns; releasing the slot when the handler returns
    /// would admit more than `N` requests.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::pin::pin;
    /// use std::task::{Context, Poll, Waker};
    /// use futures_core::Stream;
    /// use loadgate::{Admission, Admitted, PermitStream};
    ///
    /// struct Tokens(u32);
    /// impl Stream for Tokens {
    ///     type Item = Result<u32, std::io::Error>;
    ///     fn poll_next(mut self: std::pin::Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Self::Item>> {
    ///         self.0 -= 1;
    ///         Poll::Ready((self.0 > 0).then_some(Ok(self.0)))
    ///     }
    /// }
    ///
    /// let gate = Admission::new(1, 2).unwrap();
    /// let Ok(Admitted::Now((), permit)) = gate.try_admit(()) else { panic!() };
    /// let mut stream = pin!(PermitStream::new(Tokens(3), permit));
    /// let mut cx = Context::from_waker(Waker::noop());
    /// assert!(matches!(stream.as_mut().poll_next(&mut cx), Poll::Ready(Some(Ok(2)))));
    /// assert_eq!(gate.running(), 1); // still streaming
    /// stream.as_mut().poll_next(&mut cx);
    /// stream.as_mut().poll_next(&mut cx); // the end
    /// assert_eq!(gate.running(), 0);
    /// ```
    pub struct PermitStream<S, P> {
        #[pin]
        stream: S,
        permit: Option<P>,
    }
}

impl<S, P> PermitStream<S, P> {
    /// Wraps `stream`, holding `permit`.
    pub fn new(stream: S, permit: P) -> Self {
        PermitStream { stream, permit: Some(permit) }
    }

    /// Whether the permit is still held (the stream has not ended).
    pub fn holds_permit(&self) -> bool {
        self.permit.is_some()
    }
}

impl<S: fmt::Debug, P> fmt::Debug for PermitStream<S, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PermitStream")
            .field("stream", &self.stream)
            .field("holds_permit", &self.holds_permit())
            .finish()
    }
}

impl<S, P, O, E> Stream for PermitStream<S, P>
where
    S: Stream<Item = Result<O, E>>,
{
    type Item = Result<O, E>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.project();
        let next = this.stream.poll_next(cx);
        if matches!(next, Poll::Ready(None | Some(Err(_)))) {
            this.permit.take();
        }
        next
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.stream.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    use futures_core::Stream;

    use super::PermitStream;
    use crate::admission::{Admission, Admitted};

    #[test]
    fn the_first_error_releases_the_permit() {
        let gate = Admission::new(1, 2).unwrap();
        let Ok(Admitted::Now((), permit)) = gate.try_admit(()) else { panic!("a slot was free") };
        let items = futures_util::stream::iter([Ok(1), Err("engine failed"), Ok(2)]);
        let mut stream = pin!(PermitStream::new(items, permit));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(matches!(stream.as_mut().poll_next(&mut cx), Poll::Ready(Some(Ok(1)))));
        assert_eq!(gate.running(), 1);
        assert!(matches!(stream.as_mut().poll_next(&mut cx), Poll::Ready(Some(Err(_)))));
        assert_eq!(gate.running(), 0, "released at the error, not at the drop");
        assert!(!stream.holds_permit());
        // Items after the error still pass through; nothing is released twice.
        assert!(matches!(stream.as_mut().poll_next(&mut cx), Poll::Ready(Some(Ok(2)))));
        assert_eq!(gate.running(), 0);
    }

    #[test]
    fn dropping_the_stream_releases_the_permit() {
        let gate = Admission::new(1, 2).unwrap();
        let Ok(Admitted::Now((), permit)) = gate.try_admit(()) else { panic!("a slot was free") };
        let stream = PermitStream::new(futures_util::stream::pending::<Result<(), ()>>(), permit);
        assert_eq!(gate.running(), 1);
        drop(stream);
        assert_eq!(gate.running(), 0);
    }
}
