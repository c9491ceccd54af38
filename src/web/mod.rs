//! HTTP integrations (feature `tower`; `axum` adds the axum pieces).
//!
//! - [`PermitBody`]: an `http_body::Body` that holds a permit to its end.
//! - [`AdmissionLayer`]: a worker's `N + Q` hard cap as a tower layer that
//!   releases when the response *body* ends, not at the headers.
//! - [`Refusal`] and [`RetryAfter`]: a rejection as a response with the
//!   overload status, the caller's `Retry-After` hint and the OpenAI-shaped
//!   body; `IntoResponse` for it and the rejection types with `axum`.
//! - `Routed` (feature `axum`): an extractor that routes an OpenAI request
//!   to a worker, answering 529/503/404 itself; with `prometheus` it counts
//!   each 529 in the `Arc<RejectionMetrics>` of the request's extensions
//!   (axum's `Extension` layer).

#[cfg(feature = "axum")]
mod axum;
mod body;
mod layer;
mod refusal;

#[cfg(feature = "axum")]
pub use self::axum::Routed;
pub use body::PermitBody;
pub use layer::{AdmissionFuture, AdmissionLayer, AdmissionService, GateBody};
pub use refusal::{Refusal, RetryAfter};
