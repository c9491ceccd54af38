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
        let sending = Sending { data: Some(chosen), handed: handed.clone() };
        Ok(Prepared { body: reqwest::Body::wrap(sending), assemble, handed })
    }

    /// Lets go of the body and its rewrite (an upstream has them).
    pub(super) fn release(&self) {
        let mut held = self.lock();
        held.body = None;
        held.streamed = Some(None);
    }
}

/// One attempt's body: the bytes, handed to the HTTP client once.
struct Sending {
    data: Option<Bytes>,
    handed: Arc<Handed>,
}

impl http_body::Body for Sending {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::convert::Infallible>>> {
        let data = self.data.take();
        if data.is_some() {
            self.handed.set();
        }
        Poll::Ready(data.map(|data| Ok(Frame::data(data))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}
