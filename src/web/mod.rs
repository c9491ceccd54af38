//! HTTP integrations (feature `tower`; `axum` adds the axum pieces).
//!
//! - [`PermitBody`]: an `http_body::Body` that holds a permit to its end.
//! - [`AdmissionLayer`]: a worker's `N + Q` hard cap as a tower layer that
//!   releases when the response *body* ends, not at the headers.
//! - [`Refusal`] and [`RetryAfter`]: a rejection as a response with the
//!   overload status, a `Retry-After` hint (the caller's, or the default
//!   one) and the OpenAI-shaped body; `IntoResponse` for it and the
//!   rejection types with `axum`.
//! - `Routed` (feature `axum`): an extractor that routes an OpenAI request
//!   to a worker, answering 529/503/404 itself; with `prometheus` it counts
//!   each 529 in the `Arc<RejectionMetrics>` of the request's extensions
//!   (axum's `Extension` layer).
//! - `metrics` and `Exposition` (features `axum` and `prometheus`): a
//!   ready `/metrics` handler, in the format the scraper asks for.

#[cfg(feature = "axum")]
mod axum;
mod body;
#[cfg(all(feature = "axum", feature = "prometheus"))]
mod exposition;
mod layer;
mod refusal;

#[cfg(feature = "axum")]
pub use self::axum::Routed;
pub use body::PermitBody;
#[cfg(all(feature = "axum", feature = "prometheus"))]
#[cfg_attr(docsrs, doc(cfg(all(feature = "axum", feature = "prometheus"))))]
pub use exposition::{metrics, Exposition, Scrape};
pub use layer::{AdmissionFuture, AdmissionLayer, AdmissionService, GateBody};
pub use refusal::{Refusal, RetryAfter};
