//! [`Refusal`]: a refused request as an HTTP response, with the overload
//! status, the caller's `Retry-After` hint and the OpenAI-shaped error body.

use std::fmt;
use std::time::Duration;

use ::http::{header, HeaderValue, Response, StatusCode};
use bytes::Bytes;

use crate::admission::Rejected;
use crate::migration::MigrationError;
use crate::rejection::{Rejection, REFUSAL_AT_CAPACITY, REFUSAL_HEADER};
use crate::route::RouteError;
use crate::sync::Arc;

/// A refused request: a [`Rejection`] (overloaded, a worker at capacity,
/// unavailable) or an unknown model (404), with an optional `Retry-After`.
///
/// Its response (`into_response` with the `axum` feature, or
/// [`to_http`](Self::to_http)) carries the status the reference sends (the
/// overload status, 529 by default, for either overload; 503 unavailable;
/// 404 unknown model), `Retry-After` (whole seconds, rounded up) and
/// `retry-after-ms` when a hint is set, and the body
/// `{"error":{"message":…,"type":…,"param":null,"code":<status sent>}}`
/// (OpenAI's error shape).
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
/// assert_eq!(Refusal::from(RouteError::UnknownModel).to_http().status(), 404);
/// // Rounded up: never earlier than the hint.
/// let soon = Refusal::from(RouteError::Overloaded).retry_after(Duration::from_micros(1_000_001)).to_http();
/// assert_eq!((&soon.headers()["retry-after"], &soon.headers()["retry-after-ms"]), (&"2".parse().unwrap(), &"1001".parse().unwrap()));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// `None`: the model is unknown.
    rejection: Option<Rejection>,
    retry_after: Option<Duration>,
}

/// The message of the unknown-model body (the model name is not echoed).
const UNKNOWN_MODEL: &str = "The model does not exist";

impl Refusal {
    /// A rejection, without a `Retry-After` hint.
    pub fn new(rejection: Rejection) -> Self {
        Refusal { rejection: Some(rejection), retry_after: None }
    }

    /// The request names a model nobody registered: 404.
    pub fn unknown_model() -> Self {
        Refusal { rejection: None, retry_after: None }
    }

    /// Sets the `Retry-After` hint (from the caller's drain-rate estimate,
    /// a [`RetryAfter`], …). Ignored for an unknown model.
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
        let code = self.rejection.map_or(404, |r| r.status());
        // The overload status is validated to 200..=999 when read.
        StatusCode::from_u16(code).unwrap_or(StatusCode::SERVICE_UNAVAILABLE)
    }

    /// The response: status, headers and JSON body.
    pub fn to_http(&self) -> Response<Bytes> {
        let (kind, message) = match self.rejection {
            Some(r) => (r.error_type(), r.message()),
            None => ("NotFound", UNKNOWN_MODEL),
        };
        let mut response = openai_error(self.status(), kind, message);
        let headers = response.headers_mut();
        if self.rejection == Some(Rejection::WorkerOverloaded) {
            headers.insert(REFUSAL_HEADER, HeaderValue::from_static(REFUSAL_AT_CAPACITY));
        }
        if let (Some(hint), Some(_)) = (self.retry_after, self.rejection) {
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

/// `{"error":{"message","type","param","code"}}` with `status`, as JSON.
/// `kind` and `message` are this crate's constants, already valid inside a
/// JSON string (ASCII, quotes escaped), so they are written as they are.
pub(super) fn openai_error(status: StatusCode, kind: &str, message: &str) -> Response<Bytes> {
    let body =
        format!(r#"{{"error":{{"message":"{message}","type":"{kind}","param":null,"code":{}}}}}"#, status.as_u16());
    let mut response = Response::new(Bytes::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.rejection {
            Some(r) => r.fmt(f),
            None => f.write_str(UNKNOWN_MODEL),
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

/// The caller's `Retry-After` hint, asked once per refusal: a fixed delay or
/// a function (say, of the pool's drain rate, with jitter).
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

    /// The hint now.
    pub fn get(&self) -> Duration {
        (self.0)()
    }
}

impl fmt::Debug for RetryAfter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Not `get()`: a hint function may count its calls.
        f.write_str("RetryAfter(..)")
    }
}
