//! The worker's replies: JSON bodies, and every error in OpenAI's shape
//! (`openai::error_body`): `invalid_request_error` for a 4xx (with the field
//! at fault in `param`), DESIGN's `Overloaded` / `Unavailable` for refusals,
//! `server_error` for an engine that failed.

use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

pub(crate) use crate::api_error::error_with_param as error_response;
use crate::openai::{InvalidRequest, INVALID_REQUEST_ERROR};

/// `body` as `application/json` with `status`.
pub(crate) fn json_response(status: StatusCode, body: impl Into<Body>) -> Response {
    let body: Body = body.into();
    (status, [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], body).into_response()
}

/// A request the worker will not run: 400 naming the field at fault.
pub(crate) fn invalid(error: &InvalidRequest) -> Response {
    error_response(StatusCode::BAD_REQUEST, INVALID_REQUEST_ERROR, error.param, &error.message)
}

/// Any path the worker does not serve: 404 in OpenAI's shape.
pub(crate) async fn no_route() -> Response {
    error_response(StatusCode::NOT_FOUND, INVALID_REQUEST_ERROR, None, "no such route")
}

/// A served path with the wrong method: 405 in OpenAI's shape.
pub(crate) async fn method_not_allowed() -> Response {
    error_response(StatusCode::METHOD_NOT_ALLOWED, INVALID_REQUEST_ERROR, None, "method not allowed on this route")
}

#[cfg(test)]
mod tests {
    use loadgate::rejection::{REFUSAL_AT_CAPACITY, REFUSAL_HEADER};
    use serde_json::Value;

    use super::*;
    use crate::openai::parse_request;
    use crate::openai::Api;
    use crate::worker::gate::at_capacity;

    /// The `type`, `param` and `code` of an error response.
    async fn error_of(response: Response) -> (String, Value, u64) {
        let body = axum::body::to_bytes(response.into_body(), 1 << 16).await.unwrap();
        let body: Value = serde_json::from_slice(&body).unwrap();
        let error = &body["error"];
        assert!(error["message"].is_string(), "{body}");
        (error["type"].as_str().unwrap().to_owned(), error["param"].clone(), error["code"].as_u64().unwrap())
    }

    #[tokio::test]
    async fn errors_are_in_openais_shape() {
        let bad = invalid(&parse_request(Api::Completions, br#"{"model":"m","prompt":5}"#).unwrap_err());
        assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
        assert_eq!(error_of(bad).await, (INVALID_REQUEST_ERROR.to_owned(), Value::from("prompt"), 400));
        assert_eq!(error_of(no_route().await).await, (INVALID_REQUEST_ERROR.to_owned(), Value::Null, 404));
        assert_eq!(error_of(method_not_allowed().await).await, (INVALID_REQUEST_ERROR.to_owned(), Value::Null, 405));
        let refusal = at_capacity();
        assert_eq!(refusal.headers()[REFUSAL_HEADER], REFUSAL_AT_CAPACITY);
        assert_eq!(refusal.headers()["retry-after-ms"], "1000");
        let status = u64::from(refusal.status().as_u16());
        assert_eq!(error_of(refusal).await, ("Overloaded".to_owned(), Value::Null, status));
    }
}
