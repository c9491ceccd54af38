//! The frontend's error replies: OpenAI-shaped errors for the inference
//! routes (`{"error":{"message","type","param","code"}}`, `code` the status
//! sent, `param` the field at fault or `null`) and the plain
//! `{"error":"..."}` of the admin routes.
//!
//! `type` is OpenAI's `invalid_request_error` for every 4xx, DESIGN's
//! `Overloaded` and `Unavailable` for the shedding answers (529 and 503),
//! and OpenAI's `server_error` for the gateway errors (502, 504).

use std::time::Duration;

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use loadgate::{metrics::Reason, rejection::overload_status_code, Rejection};

pub use crate::api_error::{bad_request, client_error, openai_error, set_retry_after};
#[cfg(test)]
use crate::openai::INVALID_REQUEST_ERROR;

/// The header naming why a request was refused with the overload status:
/// the reasons counted in `loadgate_frontend_rejection_reason_total`, comma
/// separated, in the order counted, each once (`busy` when none was).
pub const REJECTED_REASON: &str = "x-loadgate-rejected-reason";

/// The value of [`REJECTED_REASON`] when no reason was recorded.
pub const NO_REASON: &str = "busy";

/// The reasons of one overload refusal, each once, in the order first
/// given; fixed size (there are few reasons), no allocation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RejectedReasons {
    reasons: [Option<Reason>; RejectedReasons::CAPACITY],
    len: usize,
}

impl RejectedReasons {
    /// More than the reasons there are (11, `Reason`'s variants); any
    /// past it are dropped.
    const CAPACITY: usize = 12;

    /// `reasons`, duplicates dropped, order kept.
    pub fn collect(reasons: impl IntoIterator<Item = Reason>) -> Self {
        let mut kept = RejectedReasons::default();
        for reason in reasons {
            if kept.len < Self::CAPACITY && !kept.iter().any(|r| r == reason) {
                kept.reasons[kept.len] = Some(reason);
                kept.len += 1;
            }
        }
        kept
    }

    /// The reasons, in order.
    pub fn iter(&self) -> impl Iterator<Item = Reason> + '_ {
        self.reasons[..self.len].iter().flatten().copied()
    }

    /// The header value: the labels, comma separated; [`NO_REASON`] when
    /// there are none.
    pub fn header_value(&self) -> HeaderValue {
        let mut labels = self.iter().map(Reason::label);
        match (labels.next(), self.len) {
            (None, _) => HeaderValue::from_static(NO_REASON),
            (Some(only), 1) => HeaderValue::from_static(only),
            (Some(first), _) => {
                let joined = labels.fold(first.to_owned(), |all, label| all + "," + label);
                HeaderValue::try_from(joined).unwrap_or(HeaderValue::from_static(NO_REASON))
            }
        }
    }
}

/// Every eligible worker is busy (or refused): the overload status (529 by
/// default), the retry hint, the Overloaded body, and the reasons in
/// [`REJECTED_REASON`].
pub fn overloaded(retry_after: Duration, reasons: &RejectedReasons) -> Response {
    let status = StatusCode::from_u16(overload_status_code()).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    let refusal = Rejection::Overloaded;
    let mut response = openai_error(status, refusal.error_type(), refusal.message());
    set_retry_after(&mut response, retry_after);
    response.headers_mut().insert(REJECTED_REASON, reasons.header_value());
    crate::reason_phrase::overloaded(&mut response);
    response
}

/// The model has no usable worker: 503 Unavailable, with the retry hint.
pub fn unavailable(retry_after: Duration) -> Response {
    let refusal = Rejection::Unavailable;
    let mut response = openai_error(StatusCode::SERVICE_UNAVAILABLE, refusal.error_type(), refusal.message());
    set_retry_after(&mut response, retry_after);
    response
}

/// No such model: 404 naming `model` (`api_error::unknown_model`: the
/// library's body, as an embedder's `Refusal` and `Routed` send it).
pub fn unknown_model(model: &str) -> Response {
    crate::api_error::unknown_model(model)
}

/// `{"error":"..."}` with `status` (admin routes).
pub fn plain_error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, axum::Json(json!({"error": message.into()}))).into_response()
}

/// Any path the admin listener does not serve: 404 in the admin API's
/// error shape.
pub async fn admin_no_route() -> Response {
    plain_error(StatusCode::NOT_FOUND, "no such route: the admin API serves /busy_threshold")
}

/// A method `/busy_threshold` does not take: 405 in the admin API's error
/// shape, with `Allow`.
pub async fn admin_method_not_allowed() -> Response {
    let mut response = plain_error(StatusCode::METHOD_NOT_ALLOWED, "/busy_threshold takes GET or POST");
    response.headers_mut().insert(axum::http::header::ALLOW, axum::http::HeaderValue::from_static("GET, POST"));
    response
}

/// Any path the inference listener does not serve: 404 in OpenAI's shape.
pub async fn no_route() -> Response {
    client_error(StatusCode::NOT_FOUND, "no such route")
}

/// `/busy_threshold` on the inference port while the admin API is on its
/// own listener at `admin` (or off): 404 in OpenAI's shape, saying where.
pub async fn admin_elsewhere(admin: Option<std::net::SocketAddr>) -> Response {
    let message = match admin {
        Some(addr) => format!(
            "/busy_threshold is served on the admin listener, http://{addr}/busy_threshold, not on the inference \
             port (--admin-host and --admin-port move it; --admin-on-http-port with an admin token serves it here)"
        ),
        None => "/busy_threshold is off on this frontend (--disable-admin-api)".to_owned(),
    };
    client_error(StatusCode::NOT_FOUND, &message)
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
            (
                overloaded(Duration::from_secs(1), &RejectedReasons::default()),
                overload_status_code(),
                "Overloaded",
                None,
            ),
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

    #[tokio::test]
    async fn an_overload_names_its_reasons_once_each_in_order() {
        use Reason::*;
        let cases: [(&[Reason], &str); 7] = [
            (&[], "busy"),
            (&[DecodeBlocks], "decode_blocks"),
            (&[WorkerCapacity, Excluded], "worker_capacity,excluded"),
            (
                &[PrefillTokens, WaitingRequests, PrefillTokens, Excluded, WaitingRequests],
                "prefill_tokens,waiting_requests,excluded",
            ),
            (
                &[
                    DecodeBlocks,
                    PrefillTokens,
                    PrefillTokensFrac,
                    WaitingRequests,
                    WorkerCapacity,
                    Excluded,
                    DecodeBlocks,
                ],
                "decode_blocks,prefill_tokens,prefill_tokens_frac,waiting_requests,worker_capacity,excluded",
            ),
            (&[QueueFull, Deadline, QueueFull], "queue_full,deadline"),
            (
                &[
                    DecodeBlocks,
                    PrefillTokens,
                    PrefillTokensFrac,
                    WaitingRequests,
                    WorkerCapacity,
                    Excluded,
                    Deadline,
                    QueueFull,
                    Excluded,
                    Deadline,
                ],
                "decode_blocks,prefill_tokens,prefill_tokens_frac,waiting_requests,worker_capacity,excluded,deadline,\
                 queue_full",
            ),
        ];
        for (given, expected) in cases {
            let reasons = RejectedReasons::collect(given.iter().copied());
            let kept: Vec<&str> = reasons.iter().map(Reason::label).collect();
            assert_eq!(kept.join(","), expected.replace("busy", ""), "{given:?}");
            let response = overloaded(Duration::from_millis(1500), &reasons);
            assert_eq!(response.headers()[REJECTED_REASON], expected, "{given:?}");
            assert_eq!(response.headers()[header::RETRY_AFTER], "2");
            assert_eq!(response.headers()["retry-after-ms"], "1500");
            // The body is the one it always was.
            let body = axum::body::to_bytes(response.into_body(), 1 << 16).await.unwrap();
            assert_eq!(
                serde_json::from_slice::<Value>(&body).unwrap(),
                json!({"error": {"message": "All workers are busy, please retry later", "type": "Overloaded", "param": null, "code": overload_status_code()}})
            );
        }
    }
}
