//! axum: [`IntoResponse`] for the rejection types and the [`Routed`]
//! extractor.

use axum_core::body::Body;
use axum_core::extract::{FromRef, FromRequest, Request};
use axum_core::response::{IntoResponse, Response};
use bytes::Bytes;

use super::refusal::{openai_error, Refusal, RetryAfter};
use crate::admission::Rejected;
use crate::load::WorkerId;
use crate::migration::MigrationError;
use crate::rejection::Rejection;
use crate::route::{RouteError, WorkerRouter};

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        self.to_http().map(Body::from)
    }
}

impl IntoResponse for Rejection {
    /// The rejection's status and body, without `Retry-After`.
    fn into_response(self) -> Response {
        Refusal::new(self).into_response()
    }
}

impl IntoResponse for RouteError {
    /// Overloaded, unavailable (without `Retry-After`), or 404.
    fn into_response(self) -> Response {
        Refusal::from(self).into_response()
    }
}

impl IntoResponse for MigrationError {
    /// As [`Refusal::from`] (without `Retry-After`).
    fn into_response(self) -> Response {
        Refusal::from(self).into_response()
    }
}

impl<T> IntoResponse for Rejected<T> {
    /// A worker at capacity: the overload status (without `Retry-After`).
    fn into_response(self) -> Response {
        Refusal::from(self).into_response()
    }
}

/// An OpenAI request routed to a worker: extracts the body, reads its
/// `"model"`, and routes it with the state's [`WorkerRouter`], skipping busy
/// workers.
///
/// Refuses with the overload status (every worker busy), 503 (no worker),
/// 404 (unknown model), each with [`RetryAfter`]'s hint where it applies;
/// 400 for a body without a non-empty string `"model"`; and axum's own rejections for
/// an unreadable or too-large body (`DefaultBodyLimit`).
#[derive(Clone, Debug)]
pub struct Routed {
    /// The worker picked.
    pub worker: WorkerId,
    /// The request's model.
    pub model: String,
    /// The request body, to forward.
    pub body: Bytes,
}

impl<S> FromRequest<S> for Routed
where
    S: Send + Sync,
    WorkerRouter: FromRef<S>,
    RetryAfter: FromRef<S>,
{
    type Rejection = Response;

    async fn from_request(request: Request, state: &S) -> Result<Self, Response> {
        let body = Bytes::from_request(request, state).await.map_err(IntoResponse::into_response)?;
        let model = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|value| value.get("model")?.as_str().map(str::to_owned))
            .filter(|model| !model.is_empty())
            .ok_or_else(bad_request)?;
        match WorkerRouter::from_ref(state).route(&model, &[]) {
            Ok(worker) => Ok(Routed { worker, model, body }),
            Err(e) => Err(Refusal::from(e).hinted(Some(&RetryAfter::from_ref(state))).into_response()),
        }
    }
}

/// 400 with the OpenAI error shape.
fn bad_request() -> Response {
    let message = r#"the body must be a JSON object with a string \"model\""#;
    openai_error(::http::StatusCode::BAD_REQUEST, "InvalidRequest", message).map(Body::from)
}
