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
//! refused at once. A refusal is 503 (the budget, `Unavailable`, with a
//! retry hint around [`BUDGET_RETRY_AFTER`], jittered) or 413 (the limit), in OpenAI's
//! error shape, without buffering the rest, with `Connection: close` (the
//! rest is discarded in the background, within bounds, so that a client
//! still sending reads the answer, not a reset). The reservation is owned by
//! the returned [`Bytes`]: it is released when the last clone of the body is
//! dropped (the proxy's, or the HTTP client's while it still sends an
//! attempt), so the budget counts exactly the bodies in memory.
//!
//! A body is held once: read into one buffer, forwarded by reference to
//! every attempt, and its model and prompt size are read without building a
//! JSON tree (`request.rs`). So the frontend's memory is the budget plus a
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

use crate::frontend::reply;
use crate::throttle::LogThrottle;

/// How long a client may pause between two pieces of its body, unless
/// configured (`--http-body-idle-timeout-secs`).
pub const BODY_IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long reading one body may take in all, unless configured
/// (`--http-body-timeout-secs`).
pub const BODY_READ_DEADLINE: Duration = Duration::from_secs(120);

/// The mean retry hint (`Retry-After`, `retry-after-ms`) of a 503 for the
/// budget: bodies give their bytes back as soon as they are forwarded. Each
/// hint is this times a uniform factor in 0.5..1.5, so the clients refused
/// together do not come back together.
pub const BUDGET_RETRY_AFTER: Duration = Duration::from_secs(1);

/// How long the rest of a refused body is discarded, so that the client,
/// still sending, reads the refusal rather than a reset connection.
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(30);

/// The first reservation (and buffer) of a body; each next one doubles.
pub const FIRST_STEP: usize = 64 * 1024;

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
    /// Bytes reserved by the bodies alive now.
    used: AtomicUsize,
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

/// A body's share of the budget; given back on drop.
#[derive(Debug)]
struct Reservation {
    budget: Arc<BodyBudget>,
    bytes: usize,
    /// Counted in [`BodyBudget::complete`].
    complete: bool,
}

impl Reservation {
    /// Grows the share to `bytes` in all; false (nothing changes) if the
    /// budget cannot take it.
    fn grow_to(&mut self, bytes: usize) -> bool {
        let more = bytes.saturating_sub(self.bytes);
        if more == 0 || self.budget.take(more) {
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
        self.budget.used.fetch_sub(self.bytes, Ordering::Relaxed);
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
    /// [`BODY_READ_DEADLINE`]).
    #[allow(dead_code, reason = "the frontend passes its flags to `with_timeouts`; tests use the defaults")]
    pub fn new(limit_mb: usize, budget_mb: usize) -> Arc<Self> {
        Self::with_timeouts(limit_mb, budget_mb, BODY_IDLE_TIMEOUT, BODY_READ_DEADLINE)
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

    /// Bytes reserved by the bodies alive now.
    pub fn used(&self) -> usize {
        // Relaxed: a gauge.
        self.used.load(Ordering::Relaxed)
    }

    /// Takes `bytes` of the budget if it has them.
    fn take(&self, bytes: usize) -> bool {
        // Relaxed: the RMW alone keeps the sum within the budget; no data
        // is published through the counter.
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(bytes).filter(|&total| total <= self.budget)
            })
            .is_ok()
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
        let mut reservation = Reservation { budget: self.clone(), bytes: 0, complete: false };
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
                reply::set_retry_after(&mut response, BUDGET_RETRY_AFTER.mul_f64(0.5 + fastrand::f64()));
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
mod tests {
    use super::*;

    fn headers(content_length: Option<usize>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(n) = content_length {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
        }
        headers
    }

    /// A body of `chunks` sent as a stream (no length known to hyper).
    fn streamed(chunks: Vec<Result<Vec<u8>, std::io::Error>>) -> Body {
        Body::from_stream(futures_util::stream::iter(chunks.into_iter().map(|c| c.map(Bytes::from))))
    }

    #[tokio::test]
    async fn a_body_holds_its_bytes_until_its_last_clone_drops() {
        let budget = BodyBudget::new(1, 2);
        let body = budget.read(&headers(Some(5)), Body::from("hello")).await.unwrap();
        assert_eq!(&body[..], b"hello");
        assert_eq!(budget.used(), 5);
        // A migration retry sends a clone: the bytes stay reserved until both go.
        let attempt = body.clone();
        drop(body);
        assert_eq!(budget.used(), 5);
        drop(attempt);
        assert_eq!(budget.used(), 0);
    }

    #[tokio::test]
    async fn a_declared_length_past_the_limit_is_refused_unread() {
        let budget = BodyBudget::new(1, 8);
        let refused = budget.read(&headers(Some(MIB + 1)), Body::from(vec![b'x'; 10])).await.unwrap_err();
        assert_eq!(refused.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(refused.headers()[header::CONNECTION], "close");
        assert_eq!(budget.used(), 0);
        // Exactly the limit is fine.
        let body = budget.read(&headers(Some(MIB)), Body::from(vec![b'x'; MIB])).await.unwrap();
        assert_eq!(body.len(), MIB);
    }

    #[tokio::test]
    async fn a_streamed_body_past_the_limit_is_refused_and_released() {
        let budget = BodyBudget::new(1, 8);
        let chunks = (0..5).map(|_| Ok(vec![b'x'; MIB / 4 + 1])).collect();
        let refused = budget.read(&headers(None), streamed(chunks)).await.unwrap_err();
        assert_eq!(refused.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(budget.used(), 0);
    }

    #[tokio::test]
    async fn the_budget_refuses_with_503_and_frees_when_bodies_go() {
        let budget = BodyBudget::new(2, 3);
        let first = budget.read(&headers(Some(2 * MIB)), Body::from(vec![b'x'; 2 * MIB])).await.unwrap();
        let refused = budget.read(&headers(Some(2 * MIB)), Body::from(vec![b'x'; 2 * MIB])).await.unwrap_err();
        assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(refused.headers()[header::CONNECTION], "close");
        let json: serde_json::Value =
            serde_json::from_slice(&axum::body::to_bytes(refused.into_body(), 4096).await.unwrap()).unwrap();
        assert_eq!(json["error"]["code"], 503);
        // A streamed body that grows past what is left is refused too, and gives back what it took.
        let chunks = (0..8).map(|_| Ok(vec![b'x'; MIB / 4])).collect();
        let refused = budget.read(&headers(None), streamed(chunks)).await.unwrap_err();
        assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(budget.used(), 2 * MIB);
        drop(first);
        assert_eq!(budget.used(), 0);
        let chunks = (0..8).map(|_| Ok(vec![b'x'; MIB / 4])).collect();
        let body = budget.read(&headers(None), streamed(chunks)).await.unwrap();
        assert_eq!(body.len(), 2 * MIB);
        assert!(budget.used() >= 2 * MIB && budget.used() <= 3 * MIB, "pays for its capacity");
        drop(body);
        assert_eq!(budget.used(), 0);
    }

    #[tokio::test]
    async fn a_client_that_goes_away_mid_body_gives_its_bytes_back() {
        let budget = BodyBudget::new(4, 8);
        let chunks = vec![Ok(vec![b'x'; MIB]), Err(std::io::Error::other("connection reset"))];
        let refused = budget.read(&headers(Some(3 * MIB)), streamed(chunks)).await.unwrap_err();
        assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
        assert_eq!(budget.used(), 0);
    }

    #[tokio::test]
    async fn a_dropped_read_gives_its_bytes_back() {
        // The connection closes while the handler waits for the body: hyper
        // drops the handler's future.
        let budget = BodyBudget::new(4, 8);
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
        tx.send(Ok(Bytes::from(vec![b'x'; 1024]))).await.unwrap();
        let body = Body::from_stream(tokio_stream_from(rx));
        let reader = budget.clone();
        let read = tokio::spawn(async move { reader.read(&headers(Some(3 * MIB)), body).await });
        for _ in 0..500 {
            if budget.used() > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        // 1 KiB of 3 MiB arrived: the first step is reserved, not the Content-Length.
        assert_eq!(budget.used(), FIRST_STEP, "reserved while waiting for the rest");
        read.abort();
        assert!(read.await.unwrap_err().is_cancelled());
        assert_eq!(budget.used(), 0);
        drop(tx);
    }

    #[tokio::test]
    async fn a_client_that_stalls_is_timed_out_and_released() {
        let mut budget = BodyBudget::new(4, 8);
        Arc::get_mut(&mut budget).unwrap().idle_timeout = Duration::from_millis(20);
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
        tx.send(Ok(Bytes::from(vec![b'x'; 1024]))).await.unwrap();
        let refused = budget.read(&headers(Some(MIB)), Body::from_stream(tokio_stream_from(rx))).await.unwrap_err();
        assert_eq!(refused.status(), StatusCode::REQUEST_TIMEOUT);
        assert_eq!(budget.used(), 0);
        drop(tx);
    }

    #[tokio::test]
    async fn the_rest_of_a_refused_body_is_discarded_unless_the_client_waits_to_send() {
        let budget = BodyBudget::new(1, 8);
        for expect in [false, true] {
            let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
            let mut hdrs = headers(Some(4 * MIB));
            if expect {
                hdrs.insert(header::EXPECT, HeaderValue::from_static("100-continue"));
            }
            let refused = budget.read(&hdrs, Body::from_stream(tokio_stream_from(rx))).await.unwrap_err();
            assert_eq!(refused.status(), StatusCode::PAYLOAD_TOO_LARGE);
            // Discarded in the background: the client can send on (and then read its 413).
            let mut sent = 0;
            for _ in 0..16 {
                let send = tx.send(Ok(Bytes::from(vec![b'x'; MIB / 4])));
                match tokio::time::timeout(Duration::from_secs(5), send).await {
                    Ok(Ok(())) => sent += 1,
                    _ => break,
                }
            }
            // At most twice the limit (2 MiB, 8 chunks) is discarded, then the connection closes.
            if expect {
                assert_eq!(sent, 0, "a client waiting for 100 Continue is not read");
            } else {
                assert!((8..=10).contains(&sent), "discarded {sent} chunks");
            }
            assert_eq!(budget.used(), 0);
        }
    }

    #[tokio::test]
    async fn a_slow_client_holds_twice_what_it_sent_not_what_it_declared() {
        let budget = BodyBudget::new(192, 1024);
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
        let reader = budget.clone();
        let read = tokio::spawn(async move {
            reader.read(&headers(Some(192 * MIB)), Body::from_stream(tokio_stream_from(rx))).await
        });
        let mut sent = 0;
        for chunk in [1, 1, FIRST_STEP, 3 * FIRST_STEP, MIB] {
            tx.send(Ok(Bytes::from(vec![b'x'; chunk]))).await.unwrap();
            sent += chunk;
            for _ in 0..500 {
                if budget.used() >= sent {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let used = budget.used();
            assert!(used >= sent && used <= (2 * sent).max(FIRST_STEP), "{sent} bytes sent, {used} reserved");
        }
        drop(tx);
        // (hyper refuses a body shorter than its Content-Length; this stream just ends.)
        let body = read.await.unwrap().map_err(|r| r.status()).map(|b| b.len());
        assert_eq!(body, Ok(sent));
        assert_eq!(budget.used(), 0);
    }

    #[tokio::test]
    async fn bodies_that_outgrow_the_budget_together_refuse_the_youngest_only() {
        let mut budget = BodyBudget::new(4, 3);
        Arc::get_mut(&mut budget).unwrap().budget_wait = Duration::from_millis(50);
        let mut senders = Vec::new();
        let mut reads = Vec::new();
        for _ in 0..3 {
            let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
            let reader = budget.clone();
            // A served body is dropped at once (as the proxy does once forwarded).
            reads.push(tokio::spawn(async move {
                let read = reader.read(&headers(Some(2 * MIB)), Body::from_stream(tokio_stream_from(rx))).await;
                read.map(|body| body.len()).map_err(|refusal| refusal.status())
            }));
            // The first MiB of each, in order: three reservations of 1 MiB fill the budget.
            tx.send(Ok(Bytes::from(vec![b'x'; MIB]))).await.unwrap();
            for _ in 0..500 {
                if budget.used() == MIB * (senders.len() + 1) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            senders.push(tx);
        }
        assert_eq!(budget.used(), 3 * MIB);
        // Each needs a second MiB the budget does not have: they wait, the
        // youngest is refused, and the others go on as bytes are given back.
        for tx in &senders {
            tx.send(Ok(Bytes::from(vec![b'x'; MIB]))).await.unwrap();
        }
        drop(senders);
        let mut outcomes = Vec::new();
        for read in reads {
            outcomes.push(tokio::time::timeout(Duration::from_secs(5), read).await.expect("bounded").unwrap());
        }
        assert_eq!(outcomes, [Ok(2 * MIB), Ok(2 * MIB), Err(StatusCode::SERVICE_UNAVAILABLE)]);
        assert_eq!(budget.used(), 0);
    }

    /// The `error` object of a refusal.
    async fn error_of(refused: Response) -> serde_json::Value {
        let body = axum::body::to_bytes(refused.into_body(), 1 << 16).await.unwrap();
        serde_json::from_slice::<serde_json::Value>(&body).unwrap()["error"].clone()
    }

    #[tokio::test]
    async fn refusals_are_in_openais_shape() {
        let budget = BodyBudget::with_timeouts(1, 1, Duration::from_millis(20), Duration::from_secs(5));
        let too_large = budget.read(&headers(Some(MIB + 1)), Body::from("x")).await.unwrap_err();
        let error = error_of(too_large).await;
        assert_eq!(
            (&error["type"], &error["code"], &error["param"]),
            (&"invalid_request_error".into(), &413.into(), &serde_json::Value::Null)
        );
        let held = budget.read(&headers(Some(MIB)), Body::from(vec![b'x'; MIB])).await.unwrap();
        let over = budget.read(&headers(Some(10)), Body::from(vec![b'x'; 10])).await.unwrap_err();
        let ms: u64 = over.headers()[reply::RETRY_AFTER_MS].to_str().unwrap().parse().unwrap();
        assert!((500..=1500).contains(&ms), "a jittered hint around 1 s: {ms}");
        let secs: u64 = over.headers()[header::RETRY_AFTER].to_str().unwrap().parse().unwrap();
        assert_eq!(secs, ms.div_ceil(1000));
        let error = error_of(over).await;
        assert_eq!((&error["type"], &error["code"]), (&"Unavailable".into(), &503.into()));
        drop(held);
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
        let slow = budget.read(&headers(Some(10)), Body::from_stream(tokio_stream_from(rx))).await.unwrap_err();
        let error = error_of(slow).await;
        assert_eq!((&error["type"], &error["code"]), (&"invalid_request_error".into(), &408.into()));
        drop(tx);
    }

    #[tokio::test]
    async fn a_body_that_trickles_past_the_read_deadline_is_408() {
        // Each pause is within the idle timeout; the whole is not.
        let budget = BodyBudget::with_timeouts(4, 8, Duration::from_secs(1), Duration::from_millis(200));
        let trickle = futures_util::stream::unfold((), |()| async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            Some((Ok::<_, std::io::Error>(Bytes::from_static(b"x")), ()))
        });
        let started = std::time::Instant::now();
        let refused = budget.read(&headers(Some(MIB)), Body::from_stream(trickle)).await.unwrap_err();
        assert_eq!(refused.status(), StatusCode::REQUEST_TIMEOUT);
        assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
        assert_eq!(budget.used(), 0);
    }

    #[tokio::test]
    async fn warnings_are_rate_limited() {
        let budget = BodyBudget::new(1, 0);
        for _ in 0..5 {
            let refused = budget.read(&headers(Some(1)), Body::from("x")).await.unwrap_err();
            assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
        }
        // One line logged, four counted: the next that passes reports them.
        assert_eq!(budget.warn_throttle.admit_at(std::time::Instant::now() + WARN_PERIOD), Some(4));
    }

    fn tokio_stream_from<T: Send + 'static>(
        mut rx: tokio::sync::mpsc::Receiver<T>,
    ) -> impl futures_util::Stream<Item = T> + Send + 'static {
        futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }
}
