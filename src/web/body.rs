//! [`PermitBody`]: a response body that holds its permit to the end.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// An [`http_body::Body`] holding `permit` (usually a
    /// [`Permit`](crate::Permit)) until the body's last frame, its first
    /// error, or its drop (the client went away), whichever comes first:
    /// an SSE response keeps its engine slot for as long as it streams.
    pub struct PermitBody<B, P> {
        #[pin]
        body: B,
        permit: Option<P>,
    }
}

impl<B, P> PermitBody<B, P> {
    /// Wraps `body`, holding `permit`.
    pub fn new(body: B, permit: P) -> Self {
        PermitBody { body, permit: Some(permit) }
    }

    /// Whether the permit is still held.
    pub fn holds_permit(&self) -> bool {
        self.permit.is_some()
    }
}

impl<B: fmt::Debug, P> fmt::Debug for PermitBody<B, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PermitBody").field("body", &self.body).field("holds_permit", &self.holds_permit()).finish()
    }
}

impl<B: Body, P> Body for PermitBody<B, P> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let frame = this.body.poll_frame(cx);
        if matches!(frame, Poll::Ready(None | Some(Err(_)))) {
            this.permit.take();
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
