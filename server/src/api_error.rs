//! OpenAI-shaped error replies (`{"error":{"message","type","param","code"}}`,
//! `code` the status sent, `param` the field at fault or `null`) and the
//! retry hint headers. Shared: the frontend's routes, the worker's, and the
//! request-body reader both of them use (`http_server/body_budget.rs`)
//! answer in this one shape, whose bodies the library writes
//! (`loadgate::openai_error`): an embedder's `Refusal` and `Routed` answer
//! with the same bytes.

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::openai::{InvalidRequest, INVALID_REQUEST_ERROR};

/// `{"error":{"message","type","param":null,"code"}}` with `status`.
pub fn openai_error(status: StatusCode, kind: &str, message: &str) -> Response {
    error_with_param(status, kind, None, message)
}

/// `{"error":{"message","type","param","code"}}` with `status`, naming
/// `param` (`None`: `null`).
pub fn error_with_param(status: StatusCode, kind: &str, param: Option<&str>, message: &str) -> Response {
    json_error(status, loadgate::openai_error::body(message, kind, param, status.as_u16()))
}

/// No such model: 404 naming `model`, `loadgate::openai_error::unknown_model`'s
/// body (an embedder's `Refusal` and `Routed` send the same bytes).
pub fn unknown_model(model: &str) -> Response {
    json_error(StatusCode::NOT_FOUND, loadgate::openai_error::unknown_model(Some(model)))
}

/// `body`, one of `loadgate::openai_error`'s, with `status`, as
/// `application/json`.
fn json_error(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], body).into_response()
}

/// A client error other than 400 (404, 405, 408, 413, 415):
/// `invalid_request_error`, no `param`.
pub fn client_error(status: StatusCode, message: &str) -> Response {
    openai_error(status, INVALID_REQUEST_ERROR, message)
}

/// Sets `Retry-After` (whole seconds, rounded up, at least 1) and
/// `retry-after-ms` (which the OpenAI SDKs read first) to `after`.
pub fn set_retry_after(response: &mut Response, after: Duration) {
    // Both rounded up from the whole hint, as the library's `Refusal`: a
    // client never retries before it (milliseconds truncated first sent
    // 1,000 ms and `Retry-After: 1` for a hint of 1.0005 s).
    let nanos = after.as_nanos().max(1);
    let ms = u64::try_from(nanos.div_ceil(1_000_000)).unwrap_or(u64::MAX);
    let secs = u64::try_from(nanos.div_ceil(1_000_000_000)).unwrap_or(u64::MAX);
    let headers = response.headers_mut();
    headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
    headers.insert(RETRY_AFTER_MS, HeaderValue::from(ms));
}

/// The `retry-after-ms` header.
pub const RETRY_AFTER_MS: &str = "retry-after-ms";

/// The request body is unusable: 400, naming the field at fault if one is.
/// Takes an [`InvalidRequest`] or a message.
pub fn bad_request(error: impl Into<InvalidRequest>) -> Response {
    let error = error.into();
    error_with_param(StatusCode::BAD_REQUEST, INVALID_REQUEST_ERROR, error.param, &error.message)
}

#[cfg(test)]
mod tests {
    use axum::body::to_bytes;
    use loadgate::{Refusal, RouteError};

    use super::*;

    async fn body_of(response: Response) -> axum::body::Bytes {
        to_bytes(response.into_body(), 1 << 16).await.unwrap()
    }

    /// The binary's 404 for an unknown model (`reply::unknown_model` sends
    /// this one) and the library's (`Refusal`, as `Routed` sends it) are the
    /// same bytes, whatever the name.
    #[tokio::test]
    async fn the_unknown_model_404_is_the_librarys() {
        for model in ["llama", "gpt-9", "a \"quoted\" name", "org/a model.gguf", "tab\there", "é😀"] {
            let binary = unknown_model(model);
            let library = Refusal::from(RouteError::UnknownModel).with_model(model).to_http();
            assert_eq!(binary.status(), library.status());
            assert_eq!(binary.headers()[header::CONTENT_TYPE], library.headers()[header::CONTENT_TYPE]);
            assert_eq!(body_of(binary).await, library.body(), "{model}");
        }
    }

    /// Found by a review: the hint was truncated to whole milliseconds
    /// before either header was made, so a hint of 1.0005 s was sent as
    /// `retry-after-ms: 1000` and `Retry-After: 1`, under the hint (and
    /// under a waiting line's expected wait, which the hint never is). Both
    /// headers are rounded up, as the library's `Refusal` sends them.
    #[test]
    fn the_retry_headers_are_rounded_up_as_the_librarys() {
        let cases = [
            (Duration::from_nanos(1_000_000_001), "2", "1001"),
            (Duration::from_micros(1_000_500), "2", "1001"),
            (Duration::from_nanos(3_333_333_333), "4", "3334"),
            (Duration::from_nanos(29_999_999_999), "30", "30000"),
            (Duration::from_secs(1), "1", "1000"),
            (Duration::from_secs(30), "30", "30000"),
        ];
        for (hint, secs, ms) in cases {
            let mut binary = Response::new(axum::body::Body::empty());
            set_retry_after(&mut binary, hint);
            let library = Refusal::from(RouteError::Overloaded).retry_after(hint).to_http();
            for (name, want) in [(header::RETRY_AFTER.as_str(), secs), (RETRY_AFTER_MS, ms)] {
                assert_eq!(binary.headers()[name], want, "{name} of {hint:?}");
                assert_eq!(binary.headers()[name], library.headers()[name], "{name} of {hint:?}");
            }
        }
        // No hint at all still says wait: at least 1 ms and 1 s.
        let mut zero = Response::new(axum::body::Body::empty());
        set_retry_after(&mut zero, Duration::ZERO);
        assert_eq!(
            (&zero.headers()[header::RETRY_AFTER], &zero.headers()[RETRY_AFTER_MS]),
            (&"1".parse().unwrap(), &"1".parse().unwrap())
        );
    }

    #[tokio::test]
    async fn the_bodies_are_the_librarys() {
        let response = error_with_param(StatusCode::BAD_REQUEST, INVALID_REQUEST_ERROR, Some("model"), "no");
        assert_eq!(
            body_of(response).await,
            loadgate::openai_error::body("no", INVALID_REQUEST_ERROR, Some("model"), 400)
        );
        let response =
            openai_error(StatusCode::SERVICE_UNAVAILABLE, "Unavailable", "No worker is available for this model");
        assert_eq!(body_of(response).await, loadgate::openai_error::rejection(loadgate::Rejection::Unavailable));
    }
}
