//! [`Refusal`]: a refused request as an HTTP response, with the overload
//! status, a `Retry-After` hint and the OpenAI-shaped error body.

use std::fmt;
use std::time::Duration;

use ::http::{header, HeaderValue, Response, StatusCode};
use bytes::Bytes;

use crate::admission::Rejected;
use crate::migration::MigrationError;
use crate::openai_error;
use crate::rejection::{Rejection, REFUSAL_AT_CAPACITY, REFUSAL_HEADER};
use crate::retry_hint::{default_retry_after, RetryHint};
use crate::route::RouteError;
use crate::sync::Arc;

/// A refused request: a [`Rejection`] (overloaded, a worker at capacity,
/// unavailable) or an unknown model (404), with a `Retry-After` hint.
///
/// Its response (`into_response` with the `axum` feature, or
/// [`to_http`](Self::to_http)) carries the status the reference sends (the
/// overload status, 529 by default, for either overload; 503 unavailable;
/// 404 unknown model), `Retry-After` (whole seconds, rounded up) and
/// `retry-after-ms` for a rejection, and the OpenAI-shaped body of
/// [`openai_error`](crate::openai_error), the same bytes the `loadgate`
/// binary sends. The hint is the one set with
/// [`retry_after`](Self::retry_after) (a [`RetryAfter`], a
/// [`RetryHint`]'s); without one, [`default_retry_after`]: 1 s plus up to a
/// second of jitter, so clients refused together do not return together.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use loadgate::{Refusal, RouteError};
///
/// let refusal = Refusal::from(RouteError::Overloaded).retry_after(Duration::from_millis(1500));
/// let response = refusal.to_http();
/// assert_eq!(response.status(), 529);
/// assert_eq!(response.headers()["retry-after"], "2");
/// assert_eq!(response.headers()["retry-after-ms"], "1500");
/// assert_eq!(
///     response.body().as_ref(),
///     br#"{"error":{"message":"All workers are busy, please retry later","type":"Overloaded","param":null,"code":529}}"#
/// );
/// // No hint given: between 1 s and 2 s.
/// let ms: u64 = Refusal::from(RouteError::Unavailable).to_http().headers()["retry-after-ms"].to_str().unwrap().parse().unwrap();
/// assert!((1000..=2000).contains(&ms));
/// // An unknown model: 404, naming it when told.
/// let unknown = Refusal::from(RouteError::UnknownModel).with_model("gpt-9").to_http();
/// assert_eq!(unknown.status(), 404);
/// assert_eq!(unknown.body().as_ref(), loadgate::openai_error::unknown_model(Some("gpt-9")).as_bytes());
/// // Rounded up: never earlier than the hint.
/// let soon = Refusal::from(RouteError::Overloaded).retry_after(Duration::from_micros(1_000_001)).to_http();
/// assert_eq!((&soon.headers()["retry-after"], &soon.headers()["retry-after-ms"]), (&"2".parse().unwrap(), &"1001".parse().unwrap()));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// `None`: the model is unknown.
    rejection: Option<Rejection>,
    /// The unknown model's name, echoed in the 404's message.
    model: Option<Arc<str>>,
    /// `None`: [`default_retry_after`] at each response.
    retry_after: Option<Duration>,
}

impl Refusal {
    /// A rejection, with the default `Retry-After` hint.
    pub fn new(rejection: Rejection) -> Self {
        Refusal { rejection: Some(rejection), model: None, retry_after: None }
    }

    /// The request names a model nobody registered: 404 (name it with
    /// [`with_model`](Self::with_model)).
    pub fn unknown_model() -> Self {
        Refusal { rejection: None, model: None, retry_after: None }
    }

    /// Names the request's model: an unknown-model refusal echoes it in its
    /// message (`model "<name>" not found`), as the `loadgate` binary does.
    /// Ignored for a rejection.
    #[must_use]
    pub fn with_model(mut self, model: &str) -> Self {
        if self.rejection.is_none() {
            self.model = Some(Arc::from(model));
        }
        self
    }

    /// Sets the `Retry-After` hint (from the caller's drain-rate estimate,
    /// a [`RetryAfter`], a [`RetryHint`], …). Ignored for an unknown model.
    #[must_use]
    pub fn retry_after(mut self, hint: Duration) -> Self {
        self.retry_after = Some(hint);
        self
    }

    /// Sets the `Retry-After` hint from `hint`, asking it only where the
    /// response carries one (not for an unknown model, nor without a hint).
    pub(super) fn hinted(self, hint: Option<&RetryAfter>) -> Self {
        match (hint, self.rejection) {
            (Some(hint), Some(_)) => self.retry_after(hint.get()),
            _ => self,
        }
    }

    /// The rejection, or `None` for an unknown model.
    pub fn rejection(&self) -> Option<Rejection> {
        self.rejection
    }

    /// The status sent.
    pub fn status(&self) -> StatusCode {
        let code = self.rejection.map_or(openai_error::UNKNOWN_MODEL_STATUS, |r| r.status());
        // The overload status is validated to 200..=999 when read.
        StatusCode::from_u16(code).unwrap_or(StatusCode::SERVICE_UNAVAILABLE)
    }

    /// The response: status, headers and JSON body.
    pub fn to_http(&self) -> Response<Bytes> {
        let body = match self.rejection {
            Some(r) => openai_error::rejection(r),
            None => openai_error::unknown_model(self.model.as_deref()),
        };
        let mut response = json_response(self.status(), body);
        let headers = response.headers_mut();
        if self.rejection == Some(Rejection::WorkerOverloaded) {
            headers.insert(REFUSAL_HEADER, HeaderValue::from_static(REFUSAL_AT_CAPACITY));
        }
        if self.rejection.is_some() {
            let hint = self.retry_after.unwrap_or_else(default_retry_after);
            // Both rounded up, so a client never retries before the hint.
            let nanos = hint.as_nanos();
            let secs = u64::try_from(nanos.div_ceil(1_000_000_000)).unwrap_or(u64::MAX);
            let millis = u64::try_from(nanos.div_ceil(1_000_000)).unwrap_or(u64::MAX);
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
            headers.insert("retry-after-ms", HeaderValue::from(millis));
        }
        response
    }
}

/// `body` (an [`openai_error`] body) with `status`, as `application/json`.
pub(super) fn json_response(status: StatusCode, body: String) -> Response<Bytes> {
    let mut response = Response::new(Bytes::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.rejection {
            Some(r) => r.fmt(f),
            None => f.write_str(&openai_error::unknown_model_message(self.model.as_deref())),
        }
    }
}

impl std::error::Error for Refusal {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.rejection.as_ref().map(|r| r as &(dyn std::error::Error + 'static))
    }
}

impl From<Rejection> for Refusal {
    fn from(rejection: Rejection) -> Self {
        Refusal::new(rejection)
    }
}

impl From<RouteError> for Refusal {
    fn from(e: RouteError) -> Self {
        Rejection::try_from(e).map_or_else(|_| Refusal::unknown_model(), Refusal::new)
    }
}

impl From<MigrationError> for Refusal {
    fn from(e: MigrationError) -> Self {
        e.rejection().map_or_else(Refusal::unknown_model, Refusal::new)
    }
}

impl<T> From<Rejected<T>> for Refusal {
    /// A worker's hard cap refused: the overload status.
    fn from(_: Rejected<T>) -> Self {
        Refusal::new(Rejection::WorkerOverloaded)
    }
}

/// The caller's `Retry-After` hint, asked once per refusal: a fixed delay,
/// a [`RetryHint`]'s computed one, or any function (say, of the pool's
/// drain rate, with jitter). `Default`: [`default_retry_after`].
#[derive(Clone)]
pub struct RetryAfter(Arc<dyn Fn() -> Duration + Send + Sync>);

impl RetryAfter {
    /// The same hint every time.
    pub fn fixed(hint: Duration) -> Self {
        RetryAfter(Arc::new(move || hint))
    }

    /// A hint computed at each refusal.
    pub fn from_fn(hint: impl Fn() -> Duration + Send + Sync + 'static) -> Self {
        RetryAfter(Arc::new(hint))
    }

    /// `hint`'s computed hint at each refusal, with `in_flight()` requests
    /// dispatched and not finished (no waiting line counted). Feed `hint`
    /// each answered request's time ([`RetryHint::finished`]); until then
    /// it assumes requests take 1 s.
    pub fn computed(hint: impl Into<Arc<RetryHint>>, in_flight: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        let hint = hint.into();
        RetryAfter::from_fn(move || hint.refused(in_flight(), 0))
    }

    /// The hint now.
    pub fn get(&self) -> Duration {
        (self.0)()
    }
}

impl Default for RetryAfter {
    /// [`default_retry_after`] at each refusal.
    fn default() -> Self {
        RetryAfter::from_fn(default_retry_after)
    }
}

impl fmt::Debug for RetryAfter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Not `get()`: a hint function may count its calls.
        f.write_str("RetryAfter(..)")
    }
}
