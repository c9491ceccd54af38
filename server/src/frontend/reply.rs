//! The frontend's error replies: OpenAI-shaped errors for the inference
//! routes (`{"error":{"message","type","param","code"}}`, `code` the status
//! sent, `param` the field at fault or `null`) and the plain
//! `{"error":"..."}` of the admin routes.
//!
//! `type` is OpenAI's `invalid_request_error` for every 4xx, DESIGN's
//! `Overloaded` and `Unavailable` for the shedding answers (529 and 503),
//! and OpenAI's `server_error` for the gateway errors (502, 504).

use std::time::Duration;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use loadgate::{rejection::overload_status_code, Rejection};

pub use crate::api_error::{bad_request, client_error, error_with_param, openai_error, set_retry_after};
use crate::openai::INVALID_REQUEST_ERROR;

/// Every eligible worker is busy (or refused): the overload status (529 by
/// default), the retry hint, and the Overloaded body.
pub fn overloaded(retry_after: Duration) -> Response {
    let status = StatusCode::from_u16(overload_status_code()).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    let refusal = Rejection::Overloaded;
    let mut response = openai_error(status, refusal.error_type(), refusal.message());
    set_retry_after(&mut response, retry_after);
    response
}

/// The model has no usable worker: 503 Unavailable, with the retry hint.
pub fn unavailable(retry_after: Duration) -> Response {
    let refusal = Rejection::Unavailable;
    let mut response = openai_error(StatusCode::SERVICE_UNAVAILABLE, refusal.error_type(), refusal.message());
    set_retry_after(&mut response, retry_after);
    response
}

/// No such model: 404 naming `model`.
pub fn unknown_model(model: &str) -> Response {
    let message = format!("model {model:?} not found");
    error_with_param(StatusCode::NOT_FOUND, INVALID_REQUEST_ERROR, Some("model"), &message)
}

/// `{"error":"..."}` with `status` (admin routes).
pub fn plain_error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, axum::Json(json!({"error": message.into()}))).into_response()
}

/// Any path the inference listener does not serve: 404 in OpenAI's shape.
pub async fn no_route() -> Response {
    client_error(StatusCode::NOT_FOUND, "no such route")
}

/// A served path with the wrong method: 405 in OpenAI's shape.
pub async fn method_not_allowed() -> Response {
    client_error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed on this route")
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use axum::http::header;

    use crate::openai::{Field, SERVER_ERROR};

    /// Status, content type and `error` object of `response`.
    async fn parts(response: Response) -> (u16, String, Value) {
        let status = response.status().as_u16();
        let content_type = response.headers()[header::CONTENT_TYPE].to_str().unwrap().to_owned();
        let body = axum::body::to_bytes(response.into_body(), 1 << 16).await.unwrap();
        let body: Value = serde_json::from_slice(&body).unwrap();
        let error = body["error"].clone();
        let mut keys: Vec<&String> = error.as_object().unwrap().keys().collect();
        keys.sort();
        assert_eq!(keys, ["code", "message", "param", "type"], "{body}");
        (status, content_type, error)
    }

    #[tokio::test]
    async fn every_error_is_in_openais_shape() {
        let cases = [
            (bad_request(Field::Stream.invalid()), 400, INVALID_REQUEST_ERROR, Some("stream")),
            (bad_request("request body must be a JSON object"), 400, INVALID_REQUEST_ERROR, None),
            (unknown_model("x"), 404, INVALID_REQUEST_ERROR, Some("model")),
            (no_route().await, 404, INVALID_REQUEST_ERROR, None),
            (method_not_allowed().await, 405, INVALID_REQUEST_ERROR, None),
            (client_error(StatusCode::PAYLOAD_TOO_LARGE, "big"), 413, INVALID_REQUEST_ERROR, None),
            (openai_error(StatusCode::BAD_GATEWAY, SERVER_ERROR, "gone"), 502, SERVER_ERROR, None),
            (openai_error(StatusCode::GATEWAY_TIMEOUT, SERVER_ERROR, "slow"), 504, SERVER_ERROR, None),
            (unavailable(Duration::from_secs(1)), 503, "Unavailable", None),
            (overloaded(Duration::from_secs(1)), overload_status_code(), "Overloaded", None),
        ];
        for (response, status, kind, param) in cases {
            let (sent, content_type, error) = parts(response).await;
            assert_eq!(sent, status);
            assert_eq!(content_type, "application/json");
            assert_eq!(error["type"], kind, "{error}");
            assert_eq!(error["code"], status, "{error}");
            assert_eq!(error["param"].as_str(), param, "{error}");
            if let Some(param) = param {
                assert!(error["message"].as_str().unwrap().contains(param), "{error}");
            }
        }
    }
}
