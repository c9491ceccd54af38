//! OpenAI-shaped error replies (`{"error":{"message","type","param","code"}}`,
//! `code` the status sent, `param` the field at fault or `null`) and the
//! retry hint headers. Shared: the frontend's routes, the worker's, and the
//! request-body reader both of them use (`http_server/body_budget.rs`)
//! answer in this one shape.

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::openai::{error_body, InvalidRequest, INVALID_REQUEST_ERROR};

/// `{"error":{"message","type","param":null,"code"}}` with `status`.
pub fn openai_error(status: StatusCode, kind: &str, message: &str) -> Response {
    error_with_param(status, kind, None, message)
}

/// `{"error":{"message","type","param","code"}}` with `status`, naming
/// `param` (`None`: `null`).
pub fn error_with_param(status: StatusCode, kind: &str, param: Option<&str>, message: &str) -> Response {
    let body = error_body(message, kind, param, status.as_u16());
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
    let ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX).max(1);
    let secs = ms.div_ceil(1000);
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
