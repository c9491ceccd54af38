//! The frontend's error replies: OpenAI-shaped errors for the inference
//! routes (`{"error":{"message","type","code"}}`) and the plain
//! `{"error":"..."}` of the admin routes.

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use loadgate::{rejection::overload_status_code, Rejection};

/// Seconds a rejected client should wait before retrying.
pub const RETRY_AFTER_SECS: &str = "1";

/// `{"error":{"message","type","code"}}` with `status`.
pub fn openai_error(status: StatusCode, kind: &str, message: &str) -> Response {
    let body = json!({"error": {"message": message, "type": kind, "code": status.as_u16()}});
    (status, axum::Json(body)).into_response()
}

/// Sets `Retry-After` (whole seconds, rounded up, at least 1) and
/// `retry-after-ms` (which the OpenAI SDKs read first) to `after`.
pub fn set_retry_after(response: &mut Response, after: Duration) {
    let ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX).max(1);
    let secs = ms.div_ceil(1000);
    let headers = response.headers_mut();
    headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
    headers.insert(RETRY_AFTER_MS, HeaderValue::from(ms));
}

/// The `retry-after-ms` header.
pub const RETRY_AFTER_MS: &str = "retry-after-ms";

/// Every eligible worker is busy (or refused): the overload status (529 by
/// default), the retry hint, and the Overloaded body.
pub fn overloaded(retry_after: Duration) -> Response {
    let status = StatusCode::from_u16(overload_status_code()).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    let mut response = openai_error(status, "Overloaded", Rejection::Overloaded.message());
    set_retry_after(&mut response, retry_after);
    response
}

/// The model has no usable worker: 503 Unavailable, with the retry hint.
pub fn unavailable(retry_after: Duration) -> Response {
    let mut response = openai_error(StatusCode::SERVICE_UNAVAILABLE, "Unavailable", Rejection::Unavailable.message());
    set_retry_after(&mut response, retry_after);
    response
}

/// No such model: 404.
pub fn unknown_model(model: &str) -> Response {
    openai_error(StatusCode::NOT_FOUND, "NotFound", &format!("model {model:?} not found"))
}

/// The request body is unusable: 400.
pub fn bad_request(message: &str) -> Response {
    openai_error(StatusCode::BAD_REQUEST, "InvalidRequest", message)
}

/// `{"error":"..."}` with `status` (admin routes).
pub fn plain_error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, axum::Json(json!({"error": message.into()}))).into_response()
}

/// Any path the inference listener does not serve: 404 in OpenAI's shape.
pub async fn no_route() -> Response {
    openai_error(StatusCode::NOT_FOUND, "NotFound", "no such route")
}

/// A served path with the wrong method: 405 in OpenAI's shape.
pub async fn method_not_allowed() -> Response {
    openai_error(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", "method not allowed on this route")
}
