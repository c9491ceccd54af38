//! axum: [`IntoResponse`] for the rejection types and the [`Routed`]
//! extractor.

use axum_core::body::Body;
use axum_core::extract::{FromRef, FromRequest, Request};
use axum_core::response::{IntoResponse, Response};
use bytes::Bytes;

use super::refusal::{json_response, Refusal, RetryAfter};
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
    /// The rejection's status and body, with the default `Retry-After`
    /// ([`Refusal`]).
    fn into_response(self) -> Response {
        Refusal::new(self).into_response()
    }
}

impl IntoResponse for RouteError {
    /// Overloaded, unavailable (with the default `Retry-After`), or 404.
    fn into_response(self) -> Response {
        Refusal::from(self).into_response()
    }
}

impl IntoResponse for MigrationError {
    /// As [`Refusal::from`] (with the default `Retry-After`).
    fn into_response(self) -> Response {
        Refusal::from(self).into_response()
    }
}

impl<T> IntoResponse for Rejected<T> {
    /// A worker at capacity: the overload status (with the default
    /// `Retry-After`).
    fn into_response(self) -> Response {
        Refusal::from(self).into_response()
    }
}

/// An OpenAI request routed to a worker: extracts the body, reads its
/// `"model"`, and routes it with the state's [`WorkerRouter`], skipping busy
/// workers.
///
/// Refuses with the overload status (every worker busy) and 503 (no
/// worker), each with [`RetryAfter`]'s hint; 404 naming the model (unknown);
/// 400 for a body without a non-empty string `"model"`; and axum's own
/// rejections for an unreadable or too-large body (`DefaultBodyLimit`). Its
/// 404 and 400 bodies are the `loadgate` binary's, byte for byte
/// ([`openai_error`](crate::openai_error)).
///
/// The state `S` gives a [`WorkerRouter`] and a [`RetryAfter`] through
/// `FromRef` (`RetryAfter::default()` for the library's default hint). With
/// a state struct of several fields, `#[derive(FromRef)]` writes those
/// impls; the derive is behind axum's `macros` feature:
/// `axum = { version = "0.8", features = ["macros"] }`.
///
/// # Counting its rejections
///
/// With the `prometheus` feature, `Routed` counts every overload it answers
/// (the overload status, [`RouteError::Overloaded`]) in the
/// [`RejectionMetrics`](crate::metrics::RejectionMetrics) it finds in the
/// request's extensions, as an `Arc<RejectionMetrics>`: add it to the router
/// with axum's `Extension` layer, the same `Arc` whose families your
/// `/metrics` writes (`Exposition::frontend` for the ready handler
/// `web::metrics`, or `RejectionMetrics::register` or `render_frontend`).
/// Each overload adds one to `dynamo_frontend_model_rejection_total{model,
/// endpoint}` and one per busy signal of the model's busy workers to
/// `loadgate_frontend_rejection_reason_total`, as the `loadgate` frontend
/// counts its own. The `endpoint` label is `chat_completions` for a path
/// ending in `/chat/completions`, `completions` for any other path ending in
/// `/completions`, and for any other path `chat_completions` when the body
/// has `"messages"`, else `completions`. 503 and 404 are not rejections of
/// load and are not counted; nor is anything your handler refuses after
/// `Routed` (a worker's [`Rejected`]: count it with `Reason::WorkerCapacity`).
///
/// An extension, not a state bound: states written for `Routed` before it
/// counted keep compiling, and the `prometheus` feature never changes which
/// states `Routed` accepts. Without the extension nothing is counted.
///
/// ```
/// # #[cfg(feature = "prometheus")] {
/// use std::sync::Arc;
/// use axum::{extract::FromRef, routing::post, Extension, Router};
/// use loadgate::metrics::RejectionMetrics;
/// use loadgate::{Policy, RetryAfter, Routed, WorkerMonitor, WorkerRouter};
///
/// #[derive(Clone, FromRef)]
/// struct App {
///     router: WorkerRouter,
///     retry_after: RetryAfter,
/// }
///
/// async fn completions(to: Routed) -> String {
///     format!("to worker {}", to.worker)
/// }
///
/// let monitor = Arc::new(WorkerMonitor::new(Default::default()).unwrap());
/// let rejections = Arc::new(RejectionMetrics::default());
/// let app = App {
///     router: WorkerRouter::new(monitor, Policy::RoundRobin),
///     retry_after: RetryAfter::fixed(std::time::Duration::from_secs(1)),
/// };
/// let http: Router = Router::new()
///     .route("/v1/completions", post(completions))
///     .layer(Extension(rejections.clone())) // `Routed` counts its 529s here
///     .with_state(app);
/// # let _ = http;
/// # }
/// ```
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
        #[cfg(feature = "prometheus")]
        let counter = counting::Counter::of(&request);
        let body = Bytes::from_request(request, state).await.map_err(IntoResponse::into_response)?;
        let json = serde_json::from_slice::<serde_json::Value>(&body).ok();
        let model = json
            .as_ref()
            .and_then(|value| value.get("model")?.as_str().map(str::to_owned))
            .filter(|model| !model.is_empty())
            .ok_or_else(bad_request)?;
        let router = WorkerRouter::from_ref(state);
        match router.route(&model, &[]) {
            Ok(worker) => Ok(Routed { worker, model, body }),
            Err(e) => {
                #[cfg(feature = "prometheus")]
                if e == RouteError::Overloaded {
                    counter.count(&router, &model, json.as_ref());
                }
                let refusal = Refusal::from(e).with_model(&model);
                Err(refusal.hinted(Some(&RetryAfter::from_ref(state))).into_response())
            }
        }
    }
}

/// Where [`Routed`] counts its overloads (feature `prometheus`).
#[cfg(feature = "prometheus")]
mod counting {
    use axum_core::extract::Request;

    use crate::metrics::{Endpoint, Reason, RejectionMetrics};
    use crate::route::WorkerRouter;
    use crate::sync::Arc;

    /// The request's counters, if it carries them, and what its path says
    /// of its endpoint.
    pub(super) struct Counter {
        metrics: Option<Arc<RejectionMetrics>>,
        /// `Some` when the path names the endpoint.
        endpoint: Option<Endpoint>,
    }

    impl Counter {
        /// Reads the extension and the path before the body is taken.
        pub(super) fn of(request: &Request) -> Counter {
            let metrics = request.extensions().get::<Arc<RejectionMetrics>>().cloned();
            let path = request.uri().path();
            let endpoint = if path.ends_with("/chat/completions") {
                Some(Endpoint::ChatCompletions)
            } else if path.ends_with("/completions") {
                Some(Endpoint::Completions)
            } else {
                None
            };
            Counter { metrics, endpoint }
        }

        /// Counts one overload of `model`, with the busy signals of its
        /// busy workers.
        pub(super) fn count(&self, router: &WorkerRouter, model: &str, body: Option<&serde_json::Value>) {
            let Some(metrics) = &self.metrics else {
                return;
            };
            let endpoint = self.endpoint.unwrap_or_else(|| match body.and_then(|b| b.get("messages")) {
                Some(_) => Endpoint::ChatCompletions,
                None => Endpoint::Completions,
            });
            metrics.record(model, endpoint, Reason::from_signals(router.monitor().model_busy_reasons(model)));
        }
    }
}

/// 400 with the OpenAI error shape, naming `model`.
fn bad_request() -> Response {
    json_response(::http::StatusCode::BAD_REQUEST, crate::openai_error::invalid_model()).map(Body::from)
}
