//! [`Payload`]: a request's body, the same for every attempt, and handed
//! over for good once an upstream has it.
//!
//! The body is read whole before the first attempt (it may be sent again to
//! another upstream when one refuses or cannot be reached). llama.cpp gets
//! non-streamed requests rewritten as streamed ones (`assemble.rs`); the
//! rewrite is made once per request and is counted in the body budget like
//! the body it came from.
//!
//! Once an upstream has been handed all of the body and has not failed for
//! [`RELEASE_GRACE`] (a worker killed with the request on a kept-alive
//! connection fails within milliseconds), the payload lets go of its copies:
//! a long generation no longer holds the request's bytes (and their share
//! of `--http-body-budget-mb`) until its answer. The request is then
//! taken: a failure after that is not retried elsewhere.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use http_body::{Frame, SizeHint};
use loadgate::engines::CompletionRoute;
use tokio::sync::Notify;

use super::assemble::streamed_body;
use crate::http_server::BodyBudget;

/// How long an upstream that has the whole body must go without failing
/// before the payload lets go of it.
pub(crate) const RELEASE_GRACE: Duration = Duration::from_secs(1);

/// A request's body for its attempts (see the module docs).
#[derive(Debug)]
pub(crate) struct Payload {
    route: CompletionRoute,
    budget: Arc<BodyBudget>,
    held: Arc<Mutex<Held>>,
}

/// What a payload still holds.
#[derive(Debug)]
struct Held {
    /// `None` once let go.
    body: Option<Bytes>,
    /// The rewrite for upstreams that assemble: not made yet, made (`None`
    /// when the body is not one to rewrite), or let go.
    streamed: Option<Option<Bytes>>,
}

/// Why a payload gives no body for an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NoBody {
    /// An upstream already has it (the request is taken).
    Delivered,
    /// The rewrite does not fit in the body budget now.
    OverBudget,
}

/// The body of one attempt and what tells the payload it was handed over.
pub(super) struct Prepared {
    pub(super) body: reqwest::Body,
    /// The route to assemble the answer on, when the body was rewritten.
    pub(super) assemble: Option<CompletionRoute>,
    pub(super) handed: Arc<Handed>,
    /// Dropped before the upstream answered: the HTTP client's copy of the
    /// body goes (see [`Revoke`]).
    pub(super) revoke: Revoke,
}

/// Bodies larger than this go to the HTTP client a copied piece at a time
/// (see [`Revoke`]); smaller ones whole.
const PIECE: usize = 64 * 1024;

/// The attempt's hold on what its body's sender still has to send. An
/// HTTP client's connection task keeps the body it was given until it has
/// written it, and an upstream that stopped reading holds that for as long
/// as the kernel keeps the connection (30 s and more), with the body's
/// share of the body budget, long after the attempt gave up. So a large
/// body is handed over in copied pieces of [`PIECE`] bytes, read from here;
/// dropped before the upstream answered (a timeout, the client gone), this
/// takes the body back, and the sender's next piece ends the upload with an
/// error. Disarmed once the upstream answered.
pub(super) struct Revoke(Option<Arc<Mutex<Option<Bytes>>>>);

impl Revoke {
    /// The upstream answered: what it has not read yet it may still have.
    pub(super) fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for Revoke {
    fn drop(&mut self) {
        if let Some(source) = self.0.take() {
            source.lock().unwrap_or_else(|e| e.into_inner()).take();
        }
    }
}

/// Set when the upstream's connection has taken the whole body.
#[derive(Debug, Default)]
pub(super) struct Handed {
    done: AtomicBool,
    notify: Notify,
}

impl Handed {
    /// Whether the whole body was handed over.
    pub(super) fn done(&self) -> bool {
        // Acquire: pairs with the Release in `set`.
        self.done.load(Ordering::Acquire)
    }

    /// Waits until the whole body was handed over.
    pub(super) async fn wait(&self) {
        loop {
            let notified = self.notify.notified();
            if self.done() {
                return;
            }
            notified.await;
        }
    }

    fn set(&self) {
        // Release: a waiter that sees it sees the hand-over done.
        self.done.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }
}

impl Payload {
    /// `body`, a request for `route`; a rewrite is counted in `budget`.
    pub(crate) fn new(route: CompletionRoute, body: Bytes, budget: Arc<BodyBudget>) -> Self {
        Payload { route, budget, held: Arc::new(Mutex::new(Held { body: Some(body), streamed: None })) }
    }

    fn lock(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The body as received, unless it was let go.
    pub(crate) fn body(&self) -> Option<Bytes> {
        self.lock().body.clone()
    }

    /// The body for an attempt at an upstream that `assembles` or not.
    pub(super) async fn prepare(&self, assembles: bool) -> Result<Prepared, NoBody> {
        let body = self.body().ok_or(NoBody::Delivered)?;
        let mut assemble = None;
        let mut chosen = body;
        if assembles {
            let made = self.lock().streamed.clone();
            let streamed = match made {
                Some(streamed) => streamed,
                None => {
                    let rewritten = match streamed_body(&chosen).await {
                        Some(bytes) => Some(self.budget.adopt(bytes).ok_or(NoBody::OverBudget)?),
                        None => None,
                    };
                    let mut held = self.lock();
                    if held.body.is_none() {
                        return Err(NoBody::Delivered);
                    }
                    held.streamed.get_or_insert(rewritten).clone()
                }
            };
            if let Some(streamed) = streamed {
                chosen = streamed;
                assemble = Some(self.route);
            }
        }
        let handed = Arc::new(Handed::default());
        let len = chosen.len();
        if len == 0 {
            // Nothing to hand over (a client may not poll an empty body).
            handed.set();
        }
        let source = Arc::new(Mutex::new(Some(chosen)));
        let sending = Sending { source: source.clone(), sent: 0, len, handed: handed.clone() };
        Ok(Prepared { body: reqwest::Body::wrap(sending), assemble, handed, revoke: Revoke(Some(source)) })
    }

    /// Lets go of the body and its rewrite (an upstream has them).
    pub(super) fn release(&self) {
        let mut held = self.lock();
        held.body = None;
        held.streamed = Some(None);
    }
}

/// One attempt's body as the HTTP client reads it: whole when small, else
/// in copied pieces from the attempt's [`Revoke`].
struct Sending {
    source: Arc<Mutex<Option<Bytes>>>,
    /// Bytes handed over so far.
    sent: usize,
    len: usize,
    handed: Arc<Handed>,
}

/// The attempt gave up before the upstream read its whole body.
#[derive(Debug)]
struct Revoked;

impl std::fmt::Display for Revoked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the attempt was given up before the upstream read the body")
    }
}

impl std::error::Error for Revoked {}

impl http_body::Body for Sending {
    type Data = Bytes;
    type Error = Revoked;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Revoked>>> {
        if self.sent == self.len {
            return Poll::Ready(None);
        }
        let mut source = self.source.lock().unwrap_or_else(|e| e.into_inner());
        let Some(body) = source.as_ref() else { return Poll::Ready(Some(Err(Revoked))) };
        let piece = if self.len <= PIECE {
            body.clone()
        } else {
            // A copy: the client's buffer must not keep the whole body alive.
            Bytes::copy_from_slice(&body[self.sent..self.len.min(self.sent + PIECE)])
        };
        let sent = self.sent + piece.len();
        if sent == self.len {
            // All handed over: this sender needs it no more.
            source.take();
            drop(source);
            self.handed.set();
        } else {
            drop(source);
        }
        self.sent = sent;
        Poll::Ready(Some(Ok(Frame::data(piece))))
    }

    fn is_end_stream(&self) -> bool {
        self.sent == self.len
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact((self.len - self.sent) as u64)
    }
}
