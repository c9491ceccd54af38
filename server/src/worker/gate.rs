//! [`Gate`]: the worker's hard cap in front of whatever runs its requests
//! (the simulator, or a sidecar's engine): `N` running plus `Q` waiting
//! with `--engine-request-limit N` ([`Admission`]), or no cap; and the
//! refusal past it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use loadgate::rejection::{overload_status_code, REFUSAL_AT_CAPACITY, REFUSAL_HEADER};
use loadgate::{Admission, Permit, Rejection};

use super::reply::error_response;

/// The hard cap and the count of requests past it.
#[derive(Debug)]
pub(crate) struct Gate {
    admission: Option<Arc<Admission<()>>>,
    /// Requests admitted and not yet ended (the engine-request gauge
    /// without a cap).
    in_flight: Arc<AtomicUsize>,
}

impl Gate {
    /// A gate with the cap `admission` (none: every request passes).
    pub(crate) fn new(admission: Option<Arc<Admission<()>>>) -> Self {
        Gate { admission, in_flight: Arc::new(AtomicUsize::new(0)) }
    }

    /// The cap, if any.
    pub(crate) fn admission(&self) -> Option<&Arc<Admission<()>>> {
        self.admission.as_ref()
    }

    /// Requests admitted and not yet ended.
    pub(crate) fn in_flight(&self) -> usize {
        // Relaxed: a gauge.
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Whether the cap refuses a request arriving now (counted as refused):
    /// checked before its body is read and parsed, which takes seconds for
    /// a large one, so that the refusal comes while a frontend can still
    /// move the request (it lets go of the body a second after the worker
    /// has it all).
    pub(crate) fn refuses_now(&self) -> bool {
        self.admission.as_ref().is_some_and(|admission| admission.refuse_if_full())
    }

    /// Takes an engine slot: at once, after waiting in the overflow queue,
    /// or not at all (`Err`: the refusal to send). If the future is dropped
    /// while waiting, it gives up its place (and a slot already handed to
    /// it passes to the next waiter).
    pub(crate) async fn admit(&self) -> Result<Held, Response> {
        let permit = match &self.admission {
            None => None,
            Some(admission) => match admission.admit(()).await {
                Ok(((), permit)) => Some(permit),
                Err(_) => return Err(at_capacity()),
            },
        };
        // Relaxed: a gauge.
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        Ok(Held { _permit: permit, in_flight: self.in_flight.clone() })
    }
}

/// An admitted request's engine slot and its place in the gauge, given
/// back when dropped (its response ended, failed, or was abandoned).
#[derive(Debug)]
pub(crate) struct Held {
    _permit: Option<Permit<()>>,
    in_flight: Arc<AtomicUsize>,
}

impl Drop for Held {
    fn drop(&mut self) {
        // Relaxed: a gauge.
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The hard-cap refusal: the overload status, `Retry-After: 1` (and
/// `retry-after-ms: 1000`), the explicit refusal signal, and an
/// `Overloaded` body saying `Server overloaded: worker at capacity`.
pub(crate) fn at_capacity() -> Response {
    let status = StatusCode::from_u16(overload_status_code()).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    let refusal = Rejection::WorkerOverloaded;
    let mut response = error_response(status, refusal.error_type(), None, refusal.message());
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response.headers_mut().insert("retry-after-ms", HeaderValue::from_static("1000"));
    // The explicit signal: the frontend recognises a refusal by it alone.
    response.headers_mut().insert(REFUSAL_HEADER, HeaderValue::from_static(REFUSAL_AT_CAPACITY));
    crate::reason_phrase::overloaded(&mut response);
    response
}
