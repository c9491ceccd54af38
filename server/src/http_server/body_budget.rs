//! [`BodyBudget`]: how many bytes of request bodies the frontend buffers, per
//! request (`--http-body-limit-mb`) and over all requests at once
//! (`--http-body-budget-mb`).
//!
//! A body is read whole before it is forwarded (it may be sent to several
//! workers when one refuses). [`BodyBudget::read`] refuses a `Content-Length`
//! past the limit with 413 before reading, and reserves budget as the bytes
//! arrive: the buffer and its reservation start at [`FIRST_STEP`] and double
//! when the bytes outgrow them, up to the `Content-Length` (or the limit). So
//! a client holds at most twice what it has sent (at least [`FIRST_STEP`]),
//! for at most the read deadline (`--http-body-timeout-secs`, default
//! [`BODY_READ_DEADLINE`]; a pause between two pieces of a body may last
//! `--http-body-idle-timeout-secs`, default [`BODY_IDLE_TIMEOUT`]; past
//! either: 408): declaring 192 MiB and trickling bytes holds 64 KiB, not
//! 192 MiB.
//!
//! When the budget cannot take a body's next step, the body waits (reading
//! nothing) for another body to give bytes back, for at most the idle
//! timeout. Bodies read whole give theirs back once forwarded;
//! when only bodies still being read hold the budget (they grew together
//! past it) and nothing is given back for [`BUDGET_WAIT`], the youngest
//! waiting body is refused, so that the others can finish: as many are
//! served as the budget holds. A body that has nothing reserved yet is
//! refused at once, unless it is small: a body whose `Content-Length` is at
//! most [`FIRST_STEP`] that the budget cannot take is held in a lane of its
//! own, [`SMALL_LANE`] on top of the budget, so that huge bodies filling the
//! budget do not turn ordinary requests away. A refusal is 503 (the
//! budget, `Unavailable`, with a retry hint of at least
//! [`BUDGET_RETRY_AFTER`], jittered) or 413 (the limit), in OpenAI's error shape, without
//! buffering the rest, with `Connection: close` (the rest is discarded in
//! the background, within bounds, so that a client still sending reads the
//! answer, not a reset). The reservation is owned by
//! the returned [`Bytes`]: it is released when the last clone of the body is
//! dropped (the proxy's, or the HTTP client's while it still sends an
//! attempt), so the budget counts exactly the bodies in memory.
//!
//! A body is held once: read into one buffer, forwarded by reference to
//! every attempt, and its model and prompt size are read without building a
//! JSON tree (`openai/request.rs`). So the frontend's memory is the budget plus a
//! few MiB (figures in `docs/deployment.md`).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, BodyDataStream, Bytes};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use futures_util::StreamExt;

use loadgate::Rejection;

use crate::api_error as reply;
use crate::throttle::LogThrottle;

/// How long a client may pause between two pieces of its body, unless
/// configured (`--http-body-idle-timeout-secs`).
pub const BODY_IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long reading one body may take in all, unless configured
/// (`--http-body-timeout-secs`).
pub const BODY_READ_DEADLINE: Duration = Duration::from_secs(120);

/// The shortest retry hint (`Retry-After`, `retry-after-ms`) of a 503 for
/// the budget: bodies give their bytes back as soon as they are forwarded.
/// Each hint is this times a uniform factor in 1..1.5, so the clients
/// refused together do not come back together, and none is told less than
/// the 1 s every refusal's hint keeps (a client retrying twice waits 2 s).
pub const BUDGET_RETRY_AFTER: Duration = Duration::from_secs(1);

/// How long the rest of a refused body is discarded, so that the client,
/// still sending, reads the refusal rather than a reset connection.
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(30);

/// The first reservation (and buffer) of a body; each next one doubles.
pub const FIRST_STEP: usize = 64 * 1024;

/// The small bodies' lane: what bodies declared at most [`FIRST_STEP`] may
/// hold beyond a full budget (256 of the largest at once).
pub const SMALL_LANE: usize = 256 * FIRST_STEP;

/// How long bodies still being read may all wait for the budget to give
/// bytes back before the youngest of them is refused.
pub const BUDGET_WAIT: Duration = Duration::from_secs(1);

/// At most one `limit hit` warning per this period (the others are counted).
const WARN_PERIOD: Duration = Duration::from_secs(1);

const MIB: usize = 1024 * 1024;

/// The per-request limit and the global budget of buffered request bodies.
#[derive(Debug)]
pub struct BodyBudget {
    limit_mb: usize,
    budget_mb: usize,
    limit: usize,
    budget: usize,
    /// Bytes reserved by the bodies alive now (but those in the small lane).
    used: AtomicUsize,
    /// Bytes reserved in the small bodies' lane ([`SMALL_LANE`]).
    small_used: AtomicUsize,
    /// Rate limit of the `limit hit` warning.
    warn_throttle: LogThrottle,
    /// How long a body may pause, and wait for the budget in all
    /// (`--http-body-idle-timeout-secs`).
    idle_timeout: Duration,
    /// How long reading one body may take (`--http-body-timeout-secs`).
    read_deadline: Duration,
    /// [`BUDGET_WAIT`] (shorter in tests).
    budget_wait: Duration,
    /// Woken whenever a reservation gives bytes back.
    released: tokio::sync::Notify,
    /// The next body's ticket (its age: a lower ticket is older).
    tickets: AtomicU64,
    /// The tickets of the bodies waiting for the budget now.
    waiting: Mutex<BTreeSet<u64>>,
    /// Bodies read whole and still held (they give their bytes back once
    /// forwarded, so waiting for them is not a deadlock).
    complete: AtomicUsize,
}

/// Adds `bytes` to `pool` if the sum stays within `bound`.
fn take_within(pool: &AtomicUsize, bytes: usize, bound: usize) -> bool {
    // Relaxed: the RMW alone keeps the sum within the bound; no data is
    // published through the counter.
    pool.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
        used.checked_add(bytes).filter(|&total| total <= bound)
    })
    .is_ok()
}

/// A body's share of the budget; given back on drop.
#[derive(Debug)]
struct Reservation {
    budget: Arc<BodyBudget>,
    bytes: usize,
    /// Counted in [`BodyBudget::complete`].
    complete: bool,
    /// Held in the small bodies' lane (never grows: its body is declared
    /// no larger).
    small: bool,
}

impl Reservation {
    /// Grows the share to `bytes` in all; false (nothing changes) if the
    /// budget cannot take it.
    fn grow_to(&mut self, bytes: usize) -> bool {
        let more = bytes.saturating_sub(self.bytes);
        if more == 0 || (!self.small && self.budget.take(more)) {
            self.bytes = self.bytes.max(bytes);
            return true;
        }
        false
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        // Relaxed: a counter; no data is published through it (a waiter
        // woken below retries its own RMW on it).
        let pool = if self.small { &self.budget.small_used } else { &self.budget.used };
        pool.fetch_sub(self.bytes, Ordering::Relaxed);
        if self.complete {
            // Relaxed: a gauge read by waiters, which re-check the budget itself.
            self.budget.complete.fetch_sub(1, Ordering::Relaxed);
        }
        if self.bytes > 0 {
            self.budget.released.notify_waiters();
        }
    }
}

/// A read body and the reservation that pays for it (the owner of the
/// [`Bytes`] handed to the proxy).
struct ReservedBody {
    bytes: Vec<u8>,
    _reservation: Reservation,
}

impl AsRef<[u8]> for ReservedBody {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

/// A body's place among the bodies waiting for the budget; left on drop.
struct Waiter<'a> {
    budget: &'a BodyBudget,
    ticket: u64,
}

impl<'a> Waiter<'a> {
    fn new(budget: &'a BodyBudget, ticket: u64) -> Self {
        budget.waiting.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(ticket);
        Waiter { budget, ticket }
    }

    /// Whether no younger body waits (this one is refused first).
    fn is_youngest(&self) -> bool {
        let waiting = self.budget.waiting.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        waiting.last() == Some(&self.ticket)
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        self.budget.waiting.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&self.ticket);
    }
}

/// Why a body was not read.
#[derive(Debug, PartialEq, Eq)]
enum Refusal {
    /// Larger than the per-request limit: 413.
    TooLarge,
    /// The budget cannot take it now: 503.
    OverBudget,
    /// The client was too slow: 408.
    Timeout,
    /// The body could not be read (the client went away, or a bad length): 400.
    Unreadable(String),
}

impl BodyBudget {
    /// A limit of `limit_mb` MiB per request and a budget of `budget_mb` MiB
    /// for all of them, with the default timeouts ([`BODY_IDLE_TIMEOUT`],
    /// [`BODY_READ_DEADLINE`]): a worker's (the frontend passes its flags to
    /// `with_timeouts`).
    pub fn new(limit_mb: usize, budget_mb: usize) -> Arc<Self> {
        Self::with_timeouts(limit_mb, budget_mb, BODY_IDLE_TIMEOUT, BODY_READ_DEADLINE)
    }

    /// How long a body may pause, and how long one may take in all: the
    /// bounds on every body a frontend reads (its admin API's too).
    pub fn timeouts(&self) -> (Duration, Duration) {
        (self.idle_timeout, self.read_deadline)
    }

    /// As [`new`](Self::new), with a client's pauses bounded by `idle` and a
    /// whole body by `deadline` (`--http-body-idle-timeout-secs`,
    /// `--http-body-timeout-secs`).
    pub fn with_timeouts(limit_mb: usize, budget_mb: usize, idle: Duration, deadline: Duration) -> Arc<Self> {
        Arc::new(BodyBudget {
            limit_mb,
            budget_mb,
            limit: limit_mb.saturating_mul(MIB),
            budget: budget_mb.saturating_mul(MIB),
            used: AtomicUsize::new(0),
            small_used: AtomicUsize::new(0),
            warn_throttle: LogThrottle::new(1, WARN_PERIOD),
            idle_timeout: idle,
            read_deadline: deadline,
            budget_wait: BUDGET_WAIT,
            released: tokio::sync::Notify::new(),
            tickets: AtomicU64::new(0),
            waiting: Mutex::new(BTreeSet::new()),
            complete: AtomicUsize::new(0),
        })
    }

    /// Bytes reserved by the bodies alive now (the small bodies' lane
    /// included).
    pub fn used(&self) -> usize {
        // Relaxed: gauges.
        self.used.load(Ordering::Relaxed) + self.small_used.load(Ordering::Relaxed)
    }

    /// `bytes` (a copy the frontend made of a read body, such as a body
    /// rewritten for an engine) under the budget, released with its last
    /// clone; `None`, and nothing taken, when the budget cannot take it now.
    pub fn adopt(self: &Arc<Self>, bytes: Vec<u8>) -> Option<Bytes> {
        let len = bytes.len();
        if !self.take(len) {
            self.warn_budget_hit();
            return None;
        }
        // Counted as complete: it gives its bytes back once forwarded.
        // Relaxed: a gauge (see `complete`).
        self.complete.fetch_add(1, Ordering::Relaxed);
        let reservation = Reservation { budget: self.clone(), bytes: len, complete: true, small: false };
        Some(Bytes::from_owner(ReservedBody { bytes, _reservation: reservation }))
    }

    /// A copy of `len` bytes that `fill` writes (such as a body rewritten
    /// for an engine), taken from the budget before it is made; `None`,
    /// and nothing made, when the budget cannot take it now.
    pub fn adopt_built(self: &Arc<Self>, len: usize, fill: impl FnOnce(&mut Vec<u8>)) -> Option<Bytes> {
        if !self.take(len) {
            self.warn_budget_hit();
            return None;
        }
        let mut bytes = Vec::with_capacity(len);
        fill(&mut bytes);
        // Relaxed: a gauge (see `complete`).
        self.complete.fetch_add(1, Ordering::Relaxed);
        let reservation = Reservation { budget: self.clone(), bytes: len, complete: true, small: false };
        Some(Bytes::from_owner(ReservedBody { bytes, _reservation: reservation }))
    }

    /// The refusal of a body the budget cannot take now (503, a
    /// `Retry-After`), for a copy [`adopt`](Self::adopt) refused.
    pub fn over_budget(&self) -> Response {
        self.refuse(Refusal::OverBudget)
    }

    /// Takes `bytes` of the budget if it has them.
    fn take(&self, bytes: usize) -> bool {
        take_within(&self.used, bytes, self.budget)
    }

    /// Takes `bytes` of the small bodies' lane if it has them.
    fn take_small(&self, bytes: usize) -> bool {
        take_within(&self.small_used, bytes, SMALL_LANE)
    }

    /// Grows `reservation` to hold `needed` bytes: to the next step (twice
    /// the current, at least [`FIRST_STEP`], at most `cap`) if the budget has
    /// it, else to `needed` exactly; else waits for bytes to be given back
    /// (see the module doc). Returns the new size.
    async fn grow(
        &self,
        reservation: &mut Reservation,
        needed: usize,
        cap: usize,
        ticket: u64,
    ) -> Result<usize, Refusal> {
        let step = needed.max(reservation.bytes.saturating_mul(2)).max(FIRST_STEP).min(cap);
        let mut waiter: Option<Waiter<'_>> = None;
        let started = tokio::time::Instant::now();
        loop {
            // Created before the attempt, so a release between the attempt
            // and the wait is not missed.
            let released = self.released.notified();
            if reservation.grow_to(step) {
                return Ok(step);
            }
            if reservation.grow_to(needed) {
                return Ok(needed);
            }
            if reservation.bytes == 0 && cap <= FIRST_STEP && self.take_small(cap) {
                (reservation.bytes, reservation.small) = (cap, true);
                return Ok(cap);
            }
            if reservation.bytes == 0 || started.elapsed() >= self.idle_timeout {
                return Err(Refusal::OverBudget);
            }
            let waiting = waiter.get_or_insert_with(|| Waiter::new(self, ticket));
            let timed_out = tokio::time::timeout(self.budget_wait, released).await.is_err();
            // Relaxed: a hint; the budget itself is re-checked by the RMW above.
            let deadlocked = self.complete.load(Ordering::Relaxed) == 0;
            if timed_out && deadlocked && waiting.is_youngest() {
                return Err(Refusal::OverBudget);
            }
        }
    }

    /// Reads `body` whole within the limit and the budget. The returned
    /// [`Bytes`] holds the reservation until its last clone is dropped.
    ///
    /// # Errors
    ///
    /// The response to send instead: 413 (larger than the limit), 503 (the
    /// budget is spent; rate-limited warning `limit hit:
    /// --http-body-budget-mb`), 408 (too slow), 400 (unreadable). The 413
    /// and 503 come without buffering the rest of the body, and close the
    /// connection. Unless the client waits for `100 Continue` (then it sends
    /// nothing more), the rest is discarded in the background (at most
    /// twice the limit, for [`DRAIN_DEADLINE`]): a client still sending then
    /// reads the answer instead of a reset. Every refusal is in OpenAI's
    /// error shape.
    pub async fn read(self: &Arc<Self>, headers: &HeaderMap, body: Body) -> Result<Bytes, Response> {
        let mut stream = body.into_data_stream();
        let read = tokio::time::timeout(self.read_deadline, self.read_within(headers, &mut stream));
        match read.await.unwrap_or(Err(Refusal::Timeout)) {
            Ok(bytes) => Ok(bytes),
            Err(refusal) => {
                let waits_for_continue =
                    headers.get(header::EXPECT).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
                if matches!(refusal, Refusal::TooLarge | Refusal::OverBudget) && !waits_for_continue {
                    drain(stream, self.limit.saturating_mul(2), self.idle_timeout);
                }
                Err(self.refuse(refusal))
            }
        }
    }

    async fn read_within(self: &Arc<Self>, headers: &HeaderMap, stream: &mut BodyDataStream) -> Result<Bytes, Refusal> {
        let declared = match headers.get(header::CONTENT_LENGTH) {
            Some(value) => Some(
                value
                    .to_str()
                    .ok()
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .ok_or_else(|| Refusal::Unreadable("invalid Content-Length".to_owned()))?,
            ),
            None => None,
        };
        let declared = match declared.map(usize::try_from) {
            Some(Ok(n)) if n <= self.limit => Some(n),
            Some(_) => return Err(Refusal::TooLarge),
            None => None,
        };
        // Relaxed: a unique number is all that is needed.
        let ticket = self.tickets.fetch_add(1, Ordering::Relaxed);
        let cap = declared.unwrap_or(self.limit);
        let mut reservation = Reservation { budget: self.clone(), bytes: 0, complete: false, small: false };
        let mut bytes = Vec::new();
        loop {
            let next = tokio::time::timeout(self.idle_timeout, stream.next()).await.map_err(|_| Refusal::Timeout)?;
            let chunk = match next {
                None => break,
                Some(Ok(chunk)) => chunk,
                Some(Err(e)) => return Err(Refusal::Unreadable(format!("could not read the body: {e}"))),
            };
            let needed = bytes.len().saturating_add(chunk.len());
            if declared.is_some_and(|n| needed > n) {
                return Err(Refusal::Unreadable("body longer than its Content-Length".to_owned()));
            }
            if needed > self.limit {
                return Err(Refusal::TooLarge);
            }
            if needed > reservation.bytes {
                // Pays for the capacity (what memory holds), allocated as
                // the bytes come, never past the Content-Length.
                let capacity = self.grow(&mut reservation, needed, cap, ticket).await?;
                bytes.reserve_exact(capacity - bytes.len());
            }
            bytes.extend_from_slice(&chunk);
        }
        // Relaxed: a gauge (see `complete`).
        self.complete.fetch_add(1, Ordering::Relaxed);
        reservation.complete = true;
        Ok(Bytes::from_owner(ReservedBody { bytes, _reservation: reservation }))
    }

    fn refuse(&self, refusal: Refusal) -> Response {
        let mut response = match refusal {
            Refusal::TooLarge => reply::client_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("request body is larger than {} MiB (--http-body-limit-mb)", self.limit_mb),
            ),
            Refusal::OverBudget => {
                self.warn_budget_hit();
                let mut response = reply::openai_error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    Rejection::Unavailable.error_type(),
                    "too many request bodies are buffered at once; retry later",
                );
                reply::set_retry_after(&mut response, BUDGET_RETRY_AFTER.mul_f64(1.0 + fastrand::f64() / 2.0));
                response
            }
            Refusal::Timeout => reply::client_error(StatusCode::REQUEST_TIMEOUT, "request body arrived too slowly"),
            Refusal::Unreadable(message) => reply::bad_request(message),
        };
        // The rest of the body is not read: the connection cannot be reused.
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        response
    }

    /// Logs `limit hit: --http-body-budget-mb N` at most once per
    /// [`WARN_PERIOD`], with how many refusals went unlogged since.
    fn warn_budget_hit(&self) {
        if let Some(suppressed) = self.warn_throttle.admit() {
            tracing::warn!(
                in_use_bytes = self.used(),
                suppressed,
                "limit hit: --http-body-budget-mb {}",
                self.budget_mb
            );
        }
    }
}

/// Reads and discards the rest of a refused body in the background: at most
/// `bytes`, with pauses of at most `idle`, for at most [`DRAIN_DEADLINE`].
/// Nothing is kept; then the connection closes.
fn drain(mut stream: BodyDataStream, bytes: usize, idle: Duration) {
    tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + DRAIN_DEADLINE;
        let mut drained = 0usize;
        while drained <= bytes {
            let pause = (tokio::time::Instant::now() + idle).min(deadline);
            match tokio::time::timeout_at(pause, stream.next()).await {
                Ok(Some(Ok(chunk))) => drained = drained.saturating_add(chunk.len()),
                _ => break,
            }
        }
    });
}

#[cfg(test)]
mod tests;
