//! [`Tracked`]: a response body that records, when it ends or is dropped,
//! the request's metrics and its access-log line; [`Pending`]: the same for
//! a request whose response never came (the client went away first).

use std::fmt::Write as _;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::Response;
use http_body::{Body as _, Frame, SizeHint};

use super::metrics::{ModelKey, ModelRow, Series, Timing};
use super::observer::{Known, Labels, Observer, ACCESS_TARGET};
use super::request_id::RequestId;
use super::route::{code_of, End, Route};
use crate::frontend::reply::REJECTED_REASON;

/// Longest method, path or model name written into an access-log line.
const LOGGED_LEN: usize = 256;

/// What the layer knows of a request before its response.
#[derive(Debug)]
pub(super) struct Head {
    pub(super) id: RequestId,
    pub(super) method: Method,
    /// The path as logged ([`loggable_path`]), cut to [`LOGGED_LEN`].
    pub(super) path: String,
    pub(super) route: Route,
    pub(super) started: Instant,
}

impl Head {
    /// `request`'s head, timed from now.
    pub(super) fn new(id: RequestId, method: &Method, path: &str) -> Self {
        Head {
            id,
            method: method.clone(),
            path: loggable_path(path),
            route: Route::of(method, path),
            started: Instant::now(),
        }
    }
}

/// A request whose response has not been made yet: logged and counted as
/// gone if dropped so (the client closed the connection meanwhile).
#[derive(Debug)]
pub(super) struct Pending {
    observer: Arc<Observer>,
    head: Option<Head>,
    /// What the handler learns of the request (a clone of the request's).
    labels: Labels,
}

impl Pending {
    pub(super) fn new(observer: Arc<Observer>, head: Head, labels: Labels) -> Self {
        if head.route.is_inference() {
            observer.metrics.awaiting.inc();
        }
        Pending { observer, head: Some(head), labels }
    }

    /// The request no longer awaits its response.
    fn answered(&self, head: &Head) {
        if head.route.is_inference() {
            self.observer.metrics.awaiting.dec();
        }
    }

    /// The response is here: tracks its body from now on.
    pub(super) fn respond(mut self, response: Response) -> Response {
        let Some(head) = self.head.take() else { return response };
        self.answered(&head);
        let tracker = Tracker::start(&self.observer, head, self.labels.now(), Some(&response));
        response.map(|body| Body::new(Tracked { inner: body, tracker: Some(tracker) }))
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(head) = self.head.take() {
            self.answered(&head);
            Tracker::start(&self.observer, head, self.labels.now(), None).finish(End::ClientGone);
        }
    }
}

/// One response on its way out.
#[derive(Debug)]
struct Tracker {
    head: Head,
    status: Option<StatusCode>,
    /// The model, as the client named it ([`Labels`]).
    model: Option<Arc<str>>,
    row: Arc<ModelRow>,
    /// An SSE response (`request_type="stream"`).
    stream: bool,
    /// Time to the first body frame.
    first: Option<Duration>,
    /// When the last SSE event was sent (inter-token latency).
    last_event: Option<Instant>,
    /// The body so far ends a line (an event's blank line may be split
    /// across two frames).
    newline: bool,
    bytes: u64,
    /// Counted in its row's `inflight` gauge (an LLM request).
    inflight: bool,
    /// Time in the model's waiting line ([`Labels`]).
    waited: Option<Duration>,
    /// An overload refusal's reasons (its `x-loadgate-rejected-reason`).
    reason: Option<HeaderValue>,
    /// Its priority class ([`Labels`]).
    class: Option<loadgate::Class>,
    /// Its tenant ([`Labels`]).
    tenant: Option<Arc<str>>,
}

impl Tracker {
    /// Tracks `response` (`None`: the client went away before it) of the
    /// request `head`, with what the handler learnt of it.
    fn start(observer: &Observer, head: Head, known: Known, response: Option<&Response>) -> Self {
        let Known { model, class, tenant, waited, .. } = known;
        let monitor = &observer.frontend.monitor;
        let key = match &model {
            Some(model) if monitor.has_model(model) => ModelKey::Known(model.clone()),
            Some(_) => ModelKey::Unknown,
            None => ModelKey::None,
        };
        let row = observer.metrics.row(key, |m| monitor.has_model(m));
        let stream = response.is_some_and(|r| {
            r.headers().get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"))
        });
        let inflight = response.is_some() && head.route.is_inference();
        if inflight {
            row.inflight.inc();
        }
        Tracker {
            head,
            status: response.map(Response::status),
            model,
            row,
            stream,
            first: None,
            last_event: None,
            newline: false,
            bytes: 0,
            inflight,
            waited,
            reason: response.and_then(|r| r.headers().get(REJECTED_REASON).cloned()),
            class,
            tenant,
        }
    }

    /// A 2xx response of an LLM route (the TTFT and ITL histograms).
    #[inline]
    fn timed(&self) -> bool {
        self.head.route.is_inference() && self.status.is_some_and(|s| s.is_success())
    }

    fn on_data(&mut self, data: &Bytes) {
        self.bytes += data.len() as u64;
        if self.first.is_none() {
            let ttft = self.head.started.elapsed();
            self.first = Some(ttft);
            if self.timed() {
                self.row.observe(Timing::Ttft, ttft, 1);
                if self.stream {
                    self.last_event = Some(Instant::now());
                    // Its events are the first token's; where its last line
                    // ended matters to the next frame's count.
                    sse_events(data, &mut self.newline);
                }
            }
            return;
        }
        if let Some(last) = self.last_event {
            let events = sse_events(data, &mut self.newline);
            if events > 0 {
                let now = Instant::now();
                let gap = now.saturating_duration_since(last);
                self.row.observe(Timing::Itl, gap / events, events);
                self.last_event = Some(now);
            }
        }
    }

    fn finish(self, end: End) {
        let elapsed = self.head.started.elapsed();
        if self.inflight {
            self.row.inflight.dec();
        }
        let code = code_of(self.status);
        if self.head.route.is_inference() {
            self.row.observe(Timing::Duration, elapsed, 1);
        }
        self.row.count(Series { route: self.head.route, stream: self.stream, code, end });
        if let Some(tenant) = &self.tenant {
            self.row.count_tenant(tenant, self.status, end);
        }
        tracing::info!(
            target: ACCESS_TARGET,
            request_id = %self.head.id,
            method = %cut(self.head.method.as_str()),
            path = %self.head.path,
            status = %Shown(self.status.map(|s| s.as_u16())),
            model = %Shown(self.model.as_deref().map(|m| Quoted(cut(m)))),
            duration_ms = millis(elapsed),
            ttft_ms = %Shown(self.first.map(millis)),
            waited_ms = %Shown(self.waited.map(millis)),
            reason = %Shown(self.reason.as_ref().and_then(|r| r.to_str().ok())),
            class = %Shown(self.class.map(loadgate::Class::label)),
            tenant = %Shown(self.tenant.as_deref()),
            bytes = self.bytes,
            client_gone = end == End::ClientGone,
            body_error = end == End::Failed,
            "request"
        );
    }
}

/// Token events in an SSE frame: the blank lines that end them (`\n\n`,
/// `\r\n\r\n`, one split across two frames too: `newline` says whether
/// the last frame ended a line), the final `[DONE]` not counted.
fn sse_events(data: &[u8], newline: &mut bool) -> u32 {
    let mut ends = 0usize;
    for &byte in data {
        match byte {
            b'\r' => {}
            b'\n' if *newline => {
                ends += 1;
                *newline = false;
            }
            b'\n' => *newline = true,
            _ => *newline = false,
        }
    }
    let done = data.windows(6).any(|w| w == b"[DONE]");
    u32::try_from(ends.saturating_sub(usize::from(done))).unwrap_or(u32::MAX)
}

/// Milliseconds, to the microsecond.
fn millis(elapsed: Duration) -> f64 {
    elapsed.as_micros() as f64 / 1000.0
}

/// `s` cut to at most [`LOGGED_LEN`] bytes, at a character boundary.
fn cut(s: &str) -> &str {
    crate::text::cut(s, LOGGED_LEN)
}

/// `path` for the access line, cut to [`LOGGED_LEN`]: its bytes outside
/// printable ASCII, `"` and `\` percent-encoded (as in a URL). A path may
/// hold any non-ASCII bytes, and some are line ends to Unicode-aware
/// readers (U+0085, U+2028) or reorder what is read (U+202E): raw, they
/// let a client split or forge a log line.
fn loggable_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len().min(LOGGED_LEN));
    for &b in path.as_bytes() {
        let plain = b.is_ascii_graphic() && b != b'"' && b != b'\\';
        let width = if plain { 1 } else { 3 };
        if out.len() + width > LOGGED_LEN {
            break;
        }
        if plain {
            out.push(char::from(b));
        } else {
            // Writing to a String cannot fail.
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// A value, or `none`.
struct Shown<T>(Option<T>);

impl<T: std::fmt::Display> std::fmt::Display for Shown<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(value) => value.fmt(f),
            None => f.write_str("none"),
        }
    }
}

/// A client-chosen string, quoted and escaped (a model name cannot split
/// or forge a log line).
struct Quoted<'a>(&'a str);

impl std::fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

/// A response body that finishes its [`Tracker`] at its end, on an error,
/// or when dropped before its end (the client went away).
struct Tracked {
    inner: Body,
    tracker: Option<Tracker>,
}

impl Tracked {
    fn finish(&mut self, end: End) {
        if let Some(tracker) = self.tracker.take() {
            tracker.finish(end);
        }
    }
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(tracker), Some(data)) = (this.tracker.as_mut(), frame.data_ref()) {
                    tracker.on_data(data);
                }
                // The server may stop polling once the body says it ended.
                if this.inner.is_end_stream() {
                    this.finish(End::Complete);
                }
            }
            Poll::Ready(Some(Err(_))) => this.finish(End::Failed),
            Poll::Ready(None) => this.finish(End::Complete),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        // An empty body (or a HEAD response's) may never be polled.
        let ended = self.inner.is_end_stream() || self.tracker.as_ref().is_some_and(|t| t.head.method == Method::HEAD);
        self.finish(if ended { End::Complete } else { End::ClientGone });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_events_are_counted_without_done() {
        let events = |data: &[u8]| sse_events(data, &mut false);
        assert_eq!(events(b"data: {}\n\n"), 1);
        assert_eq!(events(b"data: {}\n\ndata: {}\n\n"), 2);
        assert_eq!(events(b"data: {}\n\ndata: [DONE]\n\n"), 1);
        assert_eq!(events(b"data: {"), 0);
        assert_eq!(events(b"data: {}\r\n\r\ndata: {}\r\n\r\n"), 2, "CRLF lines");
    }

    /// An event whose blank line is split across two frames gave no
    /// inter-token observation (each frame was searched alone). Found by a
    /// review.
    #[test]
    fn an_event_end_split_across_frames_is_counted() {
        let mut newline = false;
        assert_eq!(sse_events(b"data: {}\n", &mut newline), 0);
        assert_eq!(sse_events(b"\ndata: {}\r\n", &mut newline), 1);
        assert_eq!(sse_events(b"\r\n", &mut newline), 1);
    }

    #[test]
    fn long_values_are_cut_at_a_character_boundary() {
        let long = "é".repeat(LOGGED_LEN);
        let cut = cut(&long);
        assert!(cut.len() <= LOGGED_LEN && cut.len() >= LOGGED_LEN - 1);
        assert_eq!(Quoted("a\"\nb").to_string(), "\"a\\\"\\nb\"");
        assert_eq!(Shown::<u16>(None).to_string(), "none");
    }

    #[test]
    fn paths_are_logged_in_printable_ascii_and_cut() {
        assert_eq!(loggable_path("/v1/models/org/m-1?x=%41"), "/v1/models/org/m-1?x=%41");
        assert_eq!(loggable_path("/a\u{85}b\u{2028}c\"\\"), "/a%C2%85b%E2%80%A8c%22%5C");
        let long = loggable_path(&"\u{2028}".repeat(LOGGED_LEN));
        assert!(long.len() <= LOGGED_LEN && long.len() > LOGGED_LEN - 3, "{}", long.len());
        assert_eq!(long.len() % 3, 0, "a byte's escape is never cut: {long}");
    }
}
